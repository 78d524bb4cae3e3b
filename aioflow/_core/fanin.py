"""The one fan-in merge: chunks of several sources, as soon as any of them has one.

Shared by ``interleave`` without order and ``partition_by``: up to ``width`` sources are
read at once, each with one read started ahead (a task of the run); a source that ends is
closed and the next one opened. What the sources have ready together goes out as one
chunk; the first error is raised as itself, after the items gathered before it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING

from aioflow._core.graph import Chunk, ChunkIter
from aioflow._core.tasks import aclosing, cancel_and_wait

if TYPE_CHECKING:
    from aioflow._core.run import Run

__all__ = ["merge", "merge_all"]

Reading = dict["asyncio.Task[Chunk | None]", ChunkIter]


async def _next_chunk(gen: ChunkIter) -> Chunk | None:
    return await anext(gen, None)


async def merge(
    run: Run, next_source: Callable[[], Awaitable[ChunkIter | None]], width: int
) -> ChunkIter:
    """Chunks of the sources ``next_source()`` opens (None: no more), ``width`` at once.

    Every source it opened is closed when it ends, fails, or is closed.
    """
    reading: Reading = {}
    opened: list[ChunkIter] = []
    more = True
    try:
        while True:
            while more and len(reading) < width:
                src = await next_source()
                if src is None:
                    more = False
                else:
                    opened.append(src)
                    reading[run.start(_next_chunk(src), "fan-in read")] = src
            if not reading:
                return
            done, _ = await asyncio.wait(reading, return_when=asyncio.FIRST_COMPLETED)
            out: Chunk = []
            for t in done:
                src = reading.pop(t)
                if t.cancelled() or t.exception() is not None:
                    if out:
                        yield out  # items before an error are delivered first
                    t.result()  # raises it
                chunk = t.result()
                if chunk is None:
                    await src.aclose()
                    continue
                out.extend(chunk)
                reading[run.start(_next_chunk(src), "fan-in read")] = src
            if out:
                yield out
    finally:
        await close_all(list(reading), opened)


async def merge_all(run: Run, sources: Sequence[ChunkIter]) -> ChunkIter:
    """``merge`` of a fixed list of sources, all read at once."""
    todo = iter(sources)

    async def next_source() -> ChunkIter | None:
        return next(todo, None)

    async with aclosing(merge(run, next_source, len(sources))) as merged:
        async for chunk in merged:
            yield chunk


async def close_all(
    reads: Sequence[asyncio.Future[Chunk | None]], srcs: Sequence[ChunkIter]
) -> None:
    """Cancel every read ahead, then wait for each and close every source, even when this
    is cancelled again on the way (a source left open would keep reading a channel)."""
    cancelled: BaseException | None = None
    try:
        await cancel_and_wait(reads, finish=True)
    except asyncio.CancelledError as e:
        cancelled = e
    for src in srcs:
        try:
            await src.aclose()
        except asyncio.CancelledError as e:
            cancelled = e
    if cancelled is not None:
        raise cancelled
