"""Splits: how ``distribute`` cuts a source into independent shares, handed out on demand.

A source node that can be split carries a ``SplitSource`` (``Node.hints.splits``): how many
splits an epoch has, and a small source ``Pipeline`` for each, which replaces the source
in the part of the pipeline that runs on a worker. A split must give the same items every
time it is made (a worker that dies has its splits made again elsewhere). ``range`` is cut
into sub-ranges and ``list_files`` into single files; a random-access source
(``from_source``) plugs in with a ``SplitSource`` of index ranges.
"""

from __future__ import annotations

import builtins
import copy
import random
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Protocol

from aioflow._core.base import pipeline_of
from aioflow._core.run import ChunkIter, Ctx, Node, Opener

if TYPE_CHECKING:
    from aioflow.pipeline import Pipeline

__all__ = [
    "FileSplits",
    "IndexSplits",
    "RangeSplits",
    "SplitSource",
    "list_source",
    "range_split_size",
]

#: A range is cut into about this many splits (a power-of-two number of items each) ...
RANGE_SPLITS = 256
#: ... of at most this many items (a Dask task takes as many splits as make ~0.2 s).
RANGE_SPLIT_MAX = 64


class SplitSource(Protocol):
    """What a splittable source node tells ``distribute`` (picklable: it goes to workers)."""

    def count(self, epoch: int) -> int:
        """How many splits epoch ``epoch`` has."""

    def split(self, epoch: int, index: int) -> Pipeline[Any]:
        """The source of split ``index`` of epoch ``epoch``: the same items every time."""


def range_split_size(n: int) -> int:
    """Items per split of a range of ``n`` items."""
    want = max(1, -(-n // RANGE_SPLITS))
    return min(RANGE_SPLIT_MAX, 1 << (want - 1).bit_length())


def list_source(name: str, items: list[Any]) -> Pipeline[Any]:
    """A source of ``items`` (a split, made again the same wherever it is made)."""

    async def gen() -> ChunkIter:
        if items:
            yield items

    def build(ctx: Ctx, inputs: Sequence[Opener]) -> ChunkIter:
        return gen()

    n = len(items)
    return pipeline_of(Node(name, build, card=lambda _: n, task=True))


class RangeSplits:
    """``af.range`` cut into sub-ranges of ``range_split_size`` items."""

    def __init__(self, r: builtins.range, source: Callable[[int, int, int], Pipeline[Any]]) -> None:
        self.r = r
        self.source = source  # af.range, passed in: sources.py imports this module
        self.size = range_split_size(len(r))

    def count(self, epoch: int) -> int:
        return -(-len(self.r) // self.size)

    def resized(self, most: int) -> RangeSplits:
        """The same range in splits of at most ``most`` items (``distribute``'s bound)."""
        out = copy.copy(self)
        out.size = max(1, min(self.size, most))
        return out

    def split(self, epoch: int, index: int) -> Pipeline[Any]:
        sub = self.r[index * self.size : (index + 1) * self.size]
        return self.source(sub.start, sub.stop, sub.step)


class FileSplits:
    """``af.list_files``: one split per file, in the epoch's (shuffled) order."""

    def __init__(self, files: list[str], shuffle: bool, seed: int | None) -> None:
        self.files = files
        self.shuffle = shuffle
        # consumers in other processes must agree on an epoch's order: unseeded is seed 0
        self.seed = 0 if seed is None else seed

    def order(self, epoch: int) -> list[str]:
        """The files in epoch ``epoch``'s order (as ``list_files`` shuffles them)."""
        if not self.shuffle:
            return self.files
        order = self.files.copy()
        random.Random(self.seed * 1_000_003 + epoch).shuffle(order)
        return order

    def count(self, epoch: int) -> int:
        return len(self.files)

    def split(self, epoch: int, index: int) -> Pipeline[Any]:
        return list_source("list_files", [self.order(epoch)[index]])


class IndexSplits:
    """A random-access source of ``n`` items cut into index ranges (for ``from_source``).

    ``part(epoch, start, stop)`` returns the source of positions ``start:stop`` of epoch
    ``epoch``'s order (its permutation, when shuffled); it must be picklable.
    """

    def __init__(self, n: int, part: Any) -> None:
        self.n = n
        self.part = part
        self.size = range_split_size(n)

    def count(self, epoch: int) -> int:
        return -(-self.n // self.size)

    def resized(self, most: int) -> IndexSplits:
        """The same source in splits of at most ``most`` items (``distribute``'s bound)."""
        out = copy.copy(self)
        out.size = max(1, min(self.size, most))
        return out

    def split(self, epoch: int, index: int) -> Pipeline[Any]:
        start = index * self.size
        return self.part(epoch, start, min(self.n, start + self.size))
