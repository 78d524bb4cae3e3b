"""Checkpoints: the torchdata ``Stateful`` adapter and elastic resume over ranks.

``StatefulLoader(p)`` is what checkpointing code written for torchdata's
``StatefulDataLoader`` expects: iterate it, call ``state_dict()`` whenever, and in a new
process ``load_state_dict(sd)`` before iterating to go on where it stopped.
``merge_states`` combines the states of the ``n`` ranks of a sharded ``from_source``
into states for ``m`` ranks that finish the epoch with no item lost or repeated.
See docs/checkpointing.md for what each stage's state holds.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from aioflow._core.check import check_int
from aioflow._iterators import PipelineIterator
from aioflow._state.resume import Resume
from aioflow.errors import StateMismatch

if TYPE_CHECKING:
    from aioflow.pipeline import Pipeline

T = TypeVar("T")

__all__ = ["StatefulLoader", "merge_states"]

_LOADER = "aioflow_loader"


class StatefulLoader(Generic[T]):
    """A pipeline with torchdata's ``Stateful`` protocol: ``state_dict``/``load_state_dict``.

    Each ``iter()`` is an epoch of ``p`` (or the rest of one after ``load_state_dict``).
    ``state_dict()`` is plain data (JSON-safe) for after the last item handed out; the
    state of a finished epoch resumes as a fresh epoch, as ``StatefulDataLoader`` does.
    ``set_epoch(e)`` names the epoch the next ``iter()`` runs (``p.iter(epoch=e)``), as
    ``DistributedSampler.set_epoch``: needed from the second epoch of a sharded shuffle.

    Example:
        >>> import aioflow as af
        >>> loader = af.StatefulLoader(af.range(6))
        >>> it = iter(loader)
        >>> first = [next(it), next(it)]
        >>> sd = loader.state_dict()
        >>> again = af.StatefulLoader(af.range(6))
        >>> again.load_state_dict(sd)
        >>> list(again)
        [2, 3, 4, 5]
    """

    def __init__(self, pipeline: Pipeline[T]) -> None:
        self.pipeline = pipeline
        self._it: PipelineIterator[T] | None = None
        self._loaded: dict[str, Any] | None = None
        self._finished = False
        self._epoch: int | None = None

    def set_epoch(self, epoch: int) -> None:
        """The epoch the next ``iter()`` runs, the same on every rank (see ``Pipeline.iter``).

        Example:
            >>> import aioflow as af
            >>> loader = af.StatefulLoader(af.from_source(range(4), shuffle=True, seed=0))
            >>> loader.set_epoch(3)
            >>> list(loader) == list(af.from_source(range(4), shuffle=True, seed=0).iter(epoch=3))
            True
        """
        self._epoch = epoch

    def __iter__(self) -> Iterator[T]:
        if self._it is not None:
            self._it.close()
        state, self._loaded = self._loaded, None
        it = self._it = self.pipeline.iter(state=state, epoch=self._epoch)
        self._finished = False
        return self._items(it)

    def _items(self, it: PipelineIterator[T]) -> Iterator[T]:
        with it:
            yield from it
        if it is self._it:
            self._finished = True

    def state_dict(self) -> dict[str, Any]:
        """Where the loader is: ``{"aioflow_loader": 1, "state": <pipeline state> | None}``."""
        if self._it is None or self._finished:
            return {_LOADER: 1, "state": copy.deepcopy(self._loaded)}
        return {_LOADER: 1, "state": self._it.state_dict()}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Resume from ``state_dict`` at the next ``iter()`` (checked against the pipeline)."""
        if not isinstance(state_dict, dict) or state_dict.get(_LOADER) != 1:
            raise StateMismatch(f"not a StatefulLoader state: {state_dict!r:.200}")
        state = state_dict.get("state")
        if state is not None:
            Resume.of(self.pipeline, state)
        self._loaded = copy.deepcopy(state)

    def close(self) -> None:
        """Stop the epoch in progress, if any."""
        if self._it is not None:
            self._it.close()


def _source_of(state: dict[str, Any]) -> str:
    nodes = state.get("nodes")
    if not isinstance(nodes, dict):
        raise StateMismatch(
            "merge_states needs states that seek (a from_source followed by stages such as"
            " map and batch); this one replays"
        )
    src = [k for k, v in nodes.items() if isinstance(v, dict) and "shard" in v and "next" in v]
    others = [k for k, v in nodes.items() if v is not None and k not in src]
    if len(src) != 1 or others:
        raise StateMismatch(
            "merge_states needs one sharded from_source and stages that hold nothing"
            f" (map, batch, prefetch) between it and the consumer; node states: {nodes!r:.200}"
        )
    return src[0]


def _remaining(srcs: Sequence[dict[str, Any]]) -> list[tuple[int, int]]:
    """The virtual positions no rank has read yet, as ranges."""
    k = len(srcs)
    nexts = [int(s["next"]) for s in sorted(srcs, key=lambda s: s["shard"][1])]
    ranges = srcs[0]["ranges"]
    length = int(srcs[0]["n"]) if ranges is None else sum(b - a for a, b in ranges)
    lo, hi = min(nexts) * k, min(length, (max(nexts) + 1) * k)
    out: list[tuple[int, int]] = []
    for v in range(lo, hi):  # the window where ranks disagree: a few batches per rank
        if v // k >= nexts[v % k]:
            _add(out, v, v + 1)
    _add(out, max(lo, hi), length)
    return out


def _add(out: list[tuple[int, int]], a: int, b: int) -> None:
    if a >= b:
        return
    if out and out[-1][1] == a:
        out[-1] = (out[-1][0], b)
    else:
        out.append((a, b))


def _actual(ranges: list[list[int]] | None, virtual: list[tuple[int, int]]) -> list[list[int]]:
    """Virtual ranges as ranges of the permutation's positions."""
    if ranges is None:
        return [[a, b] for a, b in virtual]
    out: list[tuple[int, int]] = []
    for a, b in virtual:
        base = 0
        for ra, rb in ranges:
            lo, hi = max(a, base), min(b, base + rb - ra)
            if lo < hi:
                _add(out, ra + lo - base, ra + hi - base)
            base += rb - ra
    return [[a, b] for a, b in out]


def merge_states(states: Sequence[dict[str, Any]], *, num_shards: int) -> list[dict[str, Any]]:
    """Combine the states of all ranks of a sharded ``from_source`` into ``num_shards`` states.

    ``states`` are the ``it.state_dict()`` of every rank (shards ``0 .. n-1`` of one
    epoch, in any order); the result's ``j``-th state resumes the epoch on rank ``j`` of
    ``num_shards`` (a pipeline built with ``shard=(num_shards, j)``): together the new
    ranks read exactly the items no old rank had yielded, each once, split evenly. The
    next epoch is sharded over ``num_shards`` as usual. The stages between the source
    and the consumer must hold nothing (``map``, ``batch``, ``prefetch``...).

    Example:
        >>> import aioflow as af
        >>> make = lambda n, i: af.from_source(range(10), shuffle=True, seed=1, shard=(n, i))
        >>> states = []
        >>> for i in range(2):
        ...     with make(2, i).iter() as it:
        ...         _ = next(it)
        ...         states.append(it.state_dict())
        >>> new = af.merge_states(states, num_shards=3)
        >>> rest = [x for j in range(3) for x in make(3, j).iter(state=new[j])]
        >>> len(rest), len(set(rest))
        (8, 8)
    """
    if not states:
        raise StateMismatch("merge_states needs the states of all ranks, got none")
    check_int("num_shards", num_shards, 1, error=StateMismatch)
    key = _source_of(states[0])
    srcs = []
    for s in states:
        if _source_of(s) != key or s.get("pipeline") != states[0].get("pipeline"):
            raise StateMismatch("merge_states: the states come from different pipelines")
        if s.get("opens") != states[0].get("opens"):
            raise StateMismatch("merge_states: the states come from different epochs")
        srcs.append(s["nodes"][key])
    k = len(states)
    if sorted(tuple(s["shard"]) for s in srcs) != [(k, i) for i in range(k)]:
        raise StateMismatch(
            f"merge_states needs one state per rank of the same run: shards"
            f" {sorted(tuple(s['shard']) for s in srcs)}, for {k} states"
        )
    if any(
        (s["seed"], s["ranges"], s["n"]) != (srcs[0]["seed"], srcs[0]["ranges"], srcs[0]["n"])
        for s in srcs
    ):
        raise StateMismatch("merge_states: the ranks' states read different permutations")
    left = _actual(srcs[0]["ranges"], _remaining(srcs))
    out = []
    for j in range(num_shards):
        new = copy.deepcopy(states[0])
        new["position"] = 0
        new["counts"] = {k: 0 for k in new["counts"]}  # (stages that hold nothing)
        new["nodes"][key] = {**srcs[0], "shard": [num_shards, j], "ranges": left, "next": 0}
        out.append(new)
    return out
