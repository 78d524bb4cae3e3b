"""Chunk streams from plain iterables, and the small stream helpers several operators share.

A run's stages pass chunks (lists of items) along async generators (see ``_core/run``);
here are the readers of a user's sync or async iterable (or a ``Pipeline``, opened as a
sub-stream of the run) and the slicing helpers that ``skip``, ``enumerate``, resuming
logs and the combining operators use.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterable, Iterable, Iterator
from time import perf_counter
from typing import TYPE_CHECKING, Any, cast

from aioflow._core.base import PipelineBase
from aioflow._core.policy import NOTHING, read, read_one
from aioflow._core.run import CHUNK_MAX, ChunkIter, Ctx, aclosing
from aioflow.errors import PipelineError

if TYPE_CHECKING:
    from aioflow.pipeline import Pipeline

__all__ = [
    "YIELD_EVERY",
    "async_chunks",
    "enumerate_chunks",
    "iterable_chunks",
    "skip_chunks",
    "sync_chunks",
]

# A chunk should take about this long to make: long enough to amortize the hand-off,
# short enough that a slow source never holds the loop for long.
_CHUNK_SECONDS = 0.0005

#: A sync source lets the loop run at least this often (s). Fused into its reader's task
#: (``Hints.inline``), nothing else in that chain may ever wait: a stage reading without
#: emitting (``sort_by``, a filter that drops all) would hold the loop for its whole input,
#: and a break, a cancellation or a timeout could not come in.
YIELD_EVERY = 0.002


async def sync_chunks(it: Iterator[Any], ctx: Ctx) -> ChunkIter:
    """Read a sync iterator in adaptive chunks; items before an error are delivered first."""
    n = 1
    pos = 0
    pc = perf_counter
    let = pc()  # when it last let the loop run
    while True:
        if ctx.run.stopping:  # closing: a blocking read would delay it by an item-time
            await asyncio.get_running_loop().create_future()  # until cancelled
        t0 = pc()
        if t0 - let >= YIELD_EVERY:
            await asyncio.sleep(0)
            let = t0 = pc()
        chunk, err = read(it, n, ctx.name, pos)
        if err is not None:
            if chunk:
                yield chunk
            raise err
        if not chunk:
            return
        dt = pc() - t0
        pos += len(chunk)
        yield chunk
        if len(chunk) < n:
            return
        if dt < _CHUNK_SECONDS / 2:
            if n < CHUNK_MAX:
                n *= 2
        elif dt > 2 * _CHUNK_SECONDS and n > 1:
            n //= 2


async def async_chunks(ait: AsyncIterable[Any], ctx: Ctx) -> ChunkIter:
    """Read an async iterable one item per chunk (it decides its own pace)."""
    pos = 0
    agen = aiter(ait)
    try:
        while True:
            x, err = await read_one(agen, ctx.name, pos)
            if err is not None:
                raise err
            if x is NOTHING:
                return
            pos += 1
            yield [x]
    finally:
        close = getattr(agen, "aclose", None)
        if close is not None:
            await close()


def iterable_chunks(obj: Any, ctx: Ctx) -> ChunkIter:
    """Chunks of any sync or async iterable."""
    if isinstance(obj, PipelineBase):
        return ctx.open(cast("Pipeline[Any]", obj))
    if isinstance(obj, AsyncIterable):
        return async_chunks(obj, ctx)
    if isinstance(obj, Iterable):
        return sync_chunks(iter(obj), ctx)
    raise PipelineError(
        f"{ctx.name}: expected an iterable, an async iterable or a Pipeline,"
        f" got {type(obj).__name__}"
    )


async def skip_chunks(src: ChunkIter, n: int) -> ChunkIter:
    left = n
    async with aclosing(src):
        async for chunk in src:
            if left < 0:
                continue
            if left:
                if len(chunk) <= left:
                    left -= len(chunk)
                    continue
                chunk = chunk[left:]
                left = 0
            yield chunk


async def enumerate_chunks(src: ChunkIter, start: int) -> ChunkIter:
    i = start
    async with aclosing(src):
        async for chunk in src:
            j = i + len(chunk)
            yield list(zip(range(i, j), chunk, strict=True))
            i = j
