"""Driving a stage's generator: counted when fused, pumped into a channel when in a task.

A stage's output is counted per chunk, never per item (``tally``): items and chunks
out, the time spent producing them (inclusive of fused inputs), and the instance's own
busy time (exclusive of its inputs) on its lane. A fused stage is read through
``metered``, a stage in a task of its own through ``pump``, which feeds its channel.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from time import perf_counter
from typing import Any

from aioflow._core.channel import Channel
from aioflow._core.graph import ChunkIter
from aioflow._core.tasks import aclosing, cancelling
from aioflow.errors import control_flow_error
from aioflow.stats.meters import Lane, StageMeter

__all__ = ["items_of", "metered", "pump", "tally"]

LaneCell = list[Lane | None]  # an instance's lane, once it runs (see stats/meters)


def tally(meter: StageMeter, ln: Lane, up: Lane | None, t0: float, c0: float) -> None:
    """The time of a chunk asked for at ``t0`` (its lane's ``inner`` time then ``c0``) on
    ``meter`` and on its lane ``ln``: all of it, and its own (minus its inputs').

    ``up``: the lane of the instance reading this one, whose own time excludes this.
    Called per chunk and stage (inline in the loops that ask, not a coroutine of its own).
    """
    t1 = perf_counter()
    dt = t1 - t0
    meter.t_next += dt
    if up is not None:  # time inside an input, for the instance reading this one
        up.inner += dt
    own = dt - (ln.inner - c0)
    if own > 0.0:
        ln.work(t1, own)


def take_lane(meter: StageMeter, mine: LaneCell, reader: LaneCell | None, same: bool) -> Lane:
    """The lane of a new instance of ``meter``'s stage (its reader's index if ``same``)."""
    up = reader[0] if reader is not None else None
    ln = mine[0] = meter.take_lane(up.index if up is not None and same else None)
    return ln


async def metered(
    gen: ChunkIter, meter: StageMeter, mine: LaneCell, reader: LaneCell | None, same: bool
) -> ChunkIter:
    """A fused stage's chunks, counted (see ``tally``) on the lane of this instance."""
    ln = take_lane(meter, mine, reader, same)
    up = reader[0] if reader is not None else None
    pc = perf_counter
    nxt = gen.__anext__
    try:
        while True:
            t0, c0 = pc(), ln.inner
            try:
                chunk = await nxt()
            except StopAsyncIteration:
                return
            finally:
                tally(meter, ln, up, t0, c0)
            meter.items_out += len(chunk)
            meter.chunks_out += 1
            yield chunk
    finally:
        ln.in_use = False
        await gen.aclose()


async def pump(gen: ChunkIter, chan: Channel, meter: StageMeter, ln: Lane | None) -> None:
    """Drive a (fused) stage generator and push its chunks into ``chan``, then close it.

    With a lane ``ln`` its output is counted here (as ``metered`` does for a fused
    stage), saving a generator layer per chunk. What the stage raises closes ``chan``.
    """
    pc = perf_counter
    nxt = gen.__anext__
    try:
        while True:
            try:
                if ln is None:
                    chunk = await nxt()
                else:
                    t0, c0 = pc(), ln.inner
                    try:
                        chunk = await nxt()
                    finally:
                        tally(meter, ln, None, t0, c0)
                    meter.items_out += len(chunk)
                    meter.chunks_out += 1
            except StopAsyncIteration:
                break
            if not chan.offer(chunk):  # (it fits: no coroutine, no wait)
                t0 = pc()
                await chan.put(chunk)
                meter.t_wait_out += pc() - t0
    except asyncio.CancelledError as e:
        if cancelling():
            raise
        chan.close(control_flow_error(e, meter.name))
    except BaseException as e:  # also SystemExit/KeyboardInterrupt from a user function
        chan.close(e)
    else:
        chan.close()
    finally:
        await gen.aclose()


async def items_of(src: ChunkIter) -> AsyncIterator[Any]:
    """Flatten chunks into single items (for item-at-a-time operators)."""
    async with aclosing(src):
        async for chunk in src:
            for x in chunk:
                yield x
