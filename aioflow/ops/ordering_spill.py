"""The external merge sort behind ``sort_by`` without a ``buffer_size``.

Items are paired with their keys and collected in runs of ``max_in_memory``. When the
input fits in one run it is sorted in memory; otherwise each run is sorted and pickled
(in blocks) into a file of a private temporary directory, in a thread so that the event
loop keeps running, and the runs are k-way merged (``heapq.merge``, which takes equal
keys from the earlier run first, so the sort is stable). More than ``FANIN`` runs are
first merged in groups, which bounds the open files and the memory of the merge. The
directory is removed when the sort ends, is closed early or fails (and by the run, as a
backstop).
"""

from __future__ import annotations

import heapq
import os
import pickle
import shutil
import tempfile
from collections.abc import Callable, Iterator
from itertools import islice
from operator import itemgetter
from typing import Any

from aioflow._core.tasks import aclosing
from aioflow._core.threads import DaemonPool, in_thread
from aioflow.errors import annotate
from aioflow.ops.kit import (
    CHUNK_MAX,
    ChunkIter,
    Ctx,
    each,
)

__all__ = ["FANIN", "external_sort", "keys_of"]

#: Most runs merged at once (more are merged in groups first).
FANIN = 64
#: Pairs per pickled block: what a run reader holds during the merge.
BLOCK = 512

_first = itemgetter(0)


def _write(path: str, pairs: Iterator[tuple[Any, Any]] | list[tuple[Any, Any]]) -> None:
    # one pickle per block, each with its own memo: a reader keeps no more than a block
    with open(path, "wb") as f:
        it = iter(pairs)
        while block := list(islice(it, BLOCK)):
            pickle.dump(block, f, pickle.HIGHEST_PROTOCOL)


def _read(path: str) -> Iterator[tuple[Any, Any]]:
    with open(path, "rb") as f:
        while True:
            try:
                block = pickle.load(f)
            except EOFError:
                return
            yield from block


class _Runs:
    """The sorted run files of one sort, in input order, in a directory of their own."""

    def __init__(self, spill_dir: str | None, reverse: bool, pool: DaemonPool) -> None:
        if spill_dir is not None:
            os.makedirs(spill_dir, exist_ok=True)
        self.dir = tempfile.mkdtemp(prefix="aioflow-sort-", dir=spill_dir)
        self.reverse = reverse
        self.pool = pool  # the run's: its threads write and merge the runs
        self.paths: list[str] = []
        self.readers: list[Iterator[tuple[Any, Any]]] = []
        self._n = 0

    def _path(self) -> str:
        self._n += 1
        return os.path.join(self.dir, f"run-{self._n:06d}.pkl")

    def _sort_and_write(self, pairs: list[tuple[Any, Any]], path: str) -> None:
        pairs.sort(key=_first, reverse=self.reverse)  # stable, also when reversed
        _write(path, pairs)

    def _merge_files(self, paths: list[str], path: str) -> None:
        readers = [_read(p) for p in paths]
        try:
            _write(path, heapq.merge(*readers, key=_first, reverse=self.reverse))
        finally:
            for r in readers:
                r.close()  # type: ignore[attr-defined]
        for p in paths:
            os.remove(p)

    async def add(self, pairs: list[tuple[Any, Any]]) -> None:
        path = self._path()
        await in_thread(self.pool, self._sort_and_write, pairs, path)
        self.paths.append(path)

    async def merged(self) -> Iterator[tuple[Any, Any]]:
        """One sorted stream of every run (runs merged in groups first when too many)."""
        while len(self.paths) > FANIN:
            # the merged group takes the place of its runs, so input order is kept
            group, rest = self.paths[:FANIN], self.paths[FANIN:]
            path = self._path()
            await in_thread(self.pool, self._merge_files, group, path)
            self.paths = [path, *rest]
        self.readers = [_read(p) for p in self.paths]
        return heapq.merge(*self.readers, key=_first, reverse=self.reverse)

    def remove(self) -> None:
        for r in self.readers:
            r.close()  # type: ignore[attr-defined]
        self.readers = []
        shutil.rmtree(self.dir, ignore_errors=True)


def keys_of(
    key: Callable[[Any], Any], chunk: list[Any], ctx: Ctx, pos: int
) -> tuple[list[Any], BaseException | None]:
    """The keys of a chunk, and the annotated error of the first item whose key failed."""
    return each(key, chunk, ctx.name, pos)


async def external_sort(
    src: ChunkIter,
    ctx: Ctx,
    key: Callable[[Any], Any],
    reverse: bool,
    max_in_memory: int,
    spill_dir: str | None,
) -> ChunkIter:
    """A stable sort of the whole input, spilling sorted runs to disk past ``max_in_memory``.

    No item can come out before the input ends, so an error (upstream, or in ``key``) is
    raised as soon as it happens, and the files are removed.
    """
    pairs: list[tuple[Any, Any]] = []
    runs: _Runs | None = None
    pos = 0
    try:
        async with aclosing(src):
            async for chunk in src:
                keys, failure = keys_of(key, chunk, ctx, pos)
                if failure is not None:
                    raise failure
                pos += len(chunk)
                pairs.extend(zip(keys, chunk, strict=True))
                while len(pairs) >= max_in_memory:
                    if runs is None:
                        runs = _Runs(spill_dir, reverse, ctx.run.thread_pool())
                        ctx.run.resources.append(runs.remove)
                    run, pairs = pairs, pairs[max_in_memory:]
                    del run[max_in_memory:]
                    await runs.add(run)
                    del run  # on disk now: only the next run is held
        if runs is None:
            pairs.sort(key=_first, reverse=reverse)
            for i in range(0, len(pairs), CHUNK_MAX):
                yield [p[1] for p in pairs[i : i + CHUNK_MAX]]
            return
        if pairs:
            await runs.add(pairs)
        pairs = []
        merged = await runs.merged()
        while block := [p[1] for p in islice(merged, CHUNK_MAX)]:
            yield block
    except Exception as e:  # keys that do not compare, items that do not pickle, ...
        annotate(e, ctx.name)  # (no position: the whole input is sorted at once)
        raise
    finally:
        if runs is not None:
            runs.remove()
