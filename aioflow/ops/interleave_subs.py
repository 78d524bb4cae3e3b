"""The open sub-pipelines of a fan-in (``interleave``): each one's chunk at hand and
its read started ahead, the batched reads of one-item sources, and closing them all.

A one-item source with a blocking read (``Node.hints.load``: ``read_npy`` of a local file) is
not opened at all: ``Loads`` runs its read in a batch with others on the run's threads,
one hop for several small files, and counts its item on the sub-stage's meter as an
opened one would; if that read fails, the source is opened after all, so that it raises
or skips as it does anywhere.
"""

from __future__ import annotations

import asyncio
import builtins
from collections.abc import Callable, Sequence
from time import perf_counter
from typing import Any

from aioflow._core import fanin as _fanin
from aioflow._core.tasks import cancel_and_wait
from aioflow.ops.kit import (
    ChunkIter,
    Ctx,
    Node,
    Run,
)

__all__ = ["Loads", "Sub", "close_all", "next_chunk"]


async def next_chunk(gen: ChunkIter) -> list[Any] | None:
    return await anext(gen, None)


class Sub:
    """One open sub-pipeline: its chunks, the chunk at hand, and a read started ahead.

    A one-item source with a blocking read (``Node.hints.load``: ``read_npy`` of a local file)
    is not opened at all: ``loads`` runs its read in a batch with others on the run's
    threads (one hop for several small files); if that read fails, it is opened after
    all, and its reader raises or skips as it does anywhere.
    """

    __slots__ = (
        "buf", "gen", "i", "load", "loads", "next", "opener", "pos", "resume", "run", "seek",
        "taken",
    )  # fmt: skip

    def __init__(self, gen: ChunkIter, run: Run, pos: int = 0, taken: int = 0) -> None:
        self.gen = gen
        self.run = run  # starts its read-ahead tasks: the run cancels what is left at close
        self.buf: list[Any] = []
        self.i = 0
        self.next: asyncio.Future[list[Any] | None] | None = None
        self.pos = pos  # of its element in the input, and items it gave (for states)
        self.taken = taken
        self.seek: Callable[[int], Any] | None = None
        self.resume: Any = None  # the state it was opened with
        self.load: Callable[[], Any] | None = None  # a one-item source's read, by `loads`
        self.loads: Loads | None = None
        self.opener: Callable[[], ChunkIter] | None = None  # opens it if that read fails

    def hook(self, fn: Callable[[int], Any]) -> None:
        self.seek = fn

    def ahead(self) -> asyncio.Future[list[Any] | None]:
        """Start reading the next chunk now (for a task-opened one: starts its task)."""
        if self.next is None:
            if self.loads is not None:
                self.next = self.loads.add(self)
            else:
                self.next = self.run.start(next_chunk(self.gen), "interleave read-ahead")
        return self.next

    async def fill(self) -> bool:
        """Take the next chunk as the one at hand; False at the end."""
        if self.loads is not None and self.next is None:
            self.ahead()
        t = self.next
        if t is None:
            chunk = await next_chunk(self.gen)
        else:
            chunk = await t
            self.next = None  # only now: if cancelled while waiting, aclose awaits t
        if self.loads is not None:  # its batched read: its one item, or it failed
            self.loads = None
            if chunk is _FAILED:  # read it as any sub-pipeline: it raises or skips there
                assert self.opener is not None
                self.gen = self.opener()
                chunk = await next_chunk(self.gen)
            else:
                self.gen = _no_chunks()
        if chunk is None:
            return False
        self.buf, self.i = chunk, 0
        return True

    def cancel(self) -> None:
        """Cancel the read started ahead, at once (``aclose`` then waits for it)."""
        if self.next is not None:
            self.next.cancel()

    async def aclose(self) -> None:
        t, self.next = self.next, None
        if t is not None:
            await cancel_and_wait([t])
        if self.gen is not None:
            await self.gen.aclose()


#: A batched read's result when it failed (the sub-pipeline is then opened and read).
_FAILED: Any = object()


async def _no_chunks() -> ChunkIter:
    return
    yield


class Loads:
    """The blocking reads of one-item sources (``Node.hints.load``), run in batches: all those
    asked for before the loop goes on run in one call on the run's threads, in order."""

    __slots__ = ("ctx", "meter", "pending")

    def __init__(self, ctx: Ctx) -> None:
        self.ctx = ctx
        self.pending: list[tuple[Callable[[], Any], asyncio.Future[Any]]] = []
        self.meter: Any = None  # the sub-stage's meter: items counted as an opened one's

    def count_on(self, node: Node) -> None:
        """Count the items read on the sub-stage meter of ``node`` (the first source's)."""
        if self.meter is None:
            self.meter = self.ctx.run.meter_for(node, self.ctx.meter)
            self.ctx.meter.adopt(self.meter)

    def add(self, s: Sub) -> asyncio.Future[Any]:
        assert s.load is not None and self.meter is not None
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[Any] = loop.create_future()
        if not self.pending:
            loop.call_soon(self._flush)
        self.pending.append((s.load, fut))
        return fut

    def _flush(self) -> None:
        batch = [(load, fut) for load, fut in self.pending if not fut.done()]
        self.pending = []
        if not batch or self.ctx.run.closed:
            return
        loop = asyncio.get_running_loop()
        calls = loop.run_in_executor(self.ctx.run.thread_pool(), _load_all, [b[0] for b in batch])
        calls.add_done_callback(lambda f: self._done(f, [b[1] for b in batch]))

    def _done(self, calls: asyncio.Future[Any], futs: list[asyncio.Future[Any]]) -> None:
        if calls.cancelled() or calls.exception() is not None:
            results = [_FAILED] * len(futs)
            seconds = 0.0
        else:
            results, seconds = calls.result()
        self.meter.t_calls += seconds
        for fut, r in builtins.zip(futs, results, strict=True):
            if not fut.done():
                if r is not _FAILED:
                    self.meter.items_out += 1
                    self.meter.chunks_out += 1
                fut.set_result(r if r is _FAILED else [r])


def _load_all(loads: list[Callable[[], Any]]) -> tuple[list[Any], float]:
    t0 = perf_counter()
    out = []
    for load in loads:
        try:
            out.append(load())
        except Exception:  # (read again as an opened sub-pipeline: it raises or skips)
            out.append(_FAILED)
    return out, perf_counter() - t0


async def close_all(subs: Sequence[Sub | None]) -> None:
    """Close every sub-pipeline (``_fanin.close_all``: every read ahead cancelled first,
    then waited for, then every source closed, even when this is cancelled on the way)."""
    open_subs = [s for s in subs if s is not None]
    reads = [s.next for s in open_subs if s.next is not None]
    for s in open_subs:
        s.next = None
    await _fanin.close_all(reads, [s.gen for s in open_subs if s.gen is not None])
