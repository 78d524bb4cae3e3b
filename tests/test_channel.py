"""The runtime's channel between two tasks: its bounds, its growth, closing with an error."""

from __future__ import annotations

import asyncio
import time

import numpy as np
import pytest

import aioflow as af
from aioflow._core.channel import (
    LIGHT_BYTES,
    LIGHT_CHUNKS,
    LIGHT_ITEMS,
    Channel,
    ThreadChannel,
    item_bytes,
)
from aioflow._core.graph import CHANNEL_CHUNKS, CHANNEL_ITEMS, CHUNK_MAX


def test_the_default_bound_is_two_chunks_of_items():
    ch = Channel()
    assert (ch.max_chunks, ch.max_items) == (CHANNEL_CHUNKS, CHANNEL_ITEMS) == (2, 2 * CHUNK_MAX)


def test_bounds_below_one_are_raised_to_one():
    ch = Channel(0, 0)
    assert (ch.max_chunks, ch.max_items) == (1, 1)
    ch = Channel(3, 5)
    assert (ch.max_chunks, ch.max_items) == (3, 5)


async def test_a_put_waits_while_the_channel_is_full_and_a_get_frees_it():
    ch = Channel(1, 3)
    await ch.put([1, 2])  # an empty channel takes any chunk
    assert ch.full_for([3]) and len(ch) == 2
    put = asyncio.ensure_future(ch.put([3]))
    await asyncio.sleep(0)
    assert not put.done() and ch.put_waits == 1
    assert await ch.get() == [1, 2]
    await put
    assert await ch.get() == [3] and len(ch) == 0


async def test_the_item_bound_holds_as_well_as_the_chunk_bound():
    ch = Channel(5, 4)
    await ch.put([1, 2, 3])
    assert not ch.full_for([4]) and ch.full_for([4, 5])


async def test_grow_doubles_both_bounds_up_to_the_limit_and_wakes_a_waiting_put():
    ch = Channel(2, 3)
    await ch.put([1, 2, 3])
    put = asyncio.ensure_future(ch.put([4, 5]))
    await asyncio.sleep(0)
    assert not put.done()
    ch.grow(100)
    assert (ch.max_chunks, ch.max_items) == (4, 6)
    await asyncio.wait_for(put, 10)
    ch.grow(10)
    assert (ch.max_chunks, ch.max_items) == (8, 10)
    ch.grow(10)
    assert (ch.max_chunks, ch.max_items) == (10, 10)


async def test_a_closed_channel_gives_what_it_holds_then_its_error_or_none():
    ch = Channel()
    await ch.put([1])
    ch.close(KeyError("k"))
    assert await ch.get() == [1]
    with pytest.raises(KeyError):
        await ch.get()
    done = Channel()
    done.close()
    assert await done.get() is None


# -- the sync consumer's channel ------------------------------------------------------
async def _fill(ch, chunk, most=200):
    """Put ``chunk`` until a put would wait; how many went in."""
    n = 0
    while n < most and not ch.full_for(chunk):
        await ch.put(chunk)
        n += 1
    return n


async def test_a_thread_channel_holds_many_light_chunks_but_few_heavy_ones():
    # issue 27 (7): a thread hand-off costs tens of microseconds, so with small chunks
    # (a batch of 256 ints) four of them a hand-off made the for loop slow
    loop = asyncio.get_running_loop()
    assert await _fill(ThreadChannel(loop), [np.arange(256)]) == LIGHT_CHUNKS
    assert await _fill(ThreadChannel(loop), list(range(256))) == LIGHT_CHUNKS
    # at most `light` items (a batch of n counts n: engine.light_items)
    assert await _fill(ThreadChannel(loop, light=1024), list(range(256))) == 4
    big = np.zeros(LIGHT_BYTES // 8, np.uint8)  # 8 of them weigh LIGHT_BYTES
    assert await _fill(ThreadChannel(loop), [big]) == 9
    assert await _fill(ThreadChannel(loop), [np.zeros(LIGHT_BYTES, np.uint8)]) == 4
    assert await _fill(ThreadChannel(loop), [object()]) == 4  # unknown: heavy
    assert await _fill(ThreadChannel(loop, max_chunks=2), [object()]) == 2
    assert item_bytes({"x": np.zeros(100, np.float32), "y": 3}) == 64 + 400 + 32
    assert item_bytes(("ab", b"cde")) == 64 + 66 + 67
    # the consumer takes them all at once, and the channel is empty again
    ch = ThreadChannel(loop)
    n = await _fill(ch, [1])
    assert len(ch.take(0)) == n and await _fill(ch, [1]) == n


def test_a_slow_sync_consumer_leaves_the_run_a_bounded_lead():
    # the light chunks a ThreadChannel may hold beyond its 4 are few and small
    made = []

    def mark(x):
        made.append(x)
        return x

    p = af.range(100_000).map(mark).batch(256)
    with p.iter() as it:
        next(it)
        time.sleep(0.5)
        lead = len(made)
    # up to 64 chunks of one batch taken at once by the consumer, 64 more in its
    # channel, 2 chunks in the source's and the batch being made
    assert lead <= (2 * 64 + 4) * 256
    assert lead >= 16 * 256  # more than 4 chunks: the channel took light chunks


# -- the async consumer's channel -------------------------------------------------------
async def test_a_loop_channel_may_hold_many_light_chunks_past_its_bound():
    # issue 27 (7): under `async for`, a chunk of one small batch a loop iteration made the
    # consumer and the run switch tasks per batch; a light lead amortizes the switch
    assert await _fill(Channel(), [np.arange(256)]) == CHANNEL_CHUNKS
    assert await _fill(Channel(light=LIGHT_ITEMS), [np.arange(256)]) == LIGHT_CHUNKS
    assert await _fill(Channel(light=LIGHT_ITEMS), list(range(256))) == LIGHT_CHUNKS
    assert await _fill(Channel(light=1024), list(range(256))) == 4
    big = np.zeros(LIGHT_BYTES // 8, np.uint8)
    assert await _fill(Channel(light=LIGHT_ITEMS), [big]) == 9
    assert await _fill(Channel(light=LIGHT_ITEMS), [np.zeros(LIGHT_BYTES, np.uint8)]) == 2
    assert await _fill(Channel(light=LIGHT_ITEMS), [object()]) == 2  # unknown: heavy
    # chunks come out in order, and what leaves no longer weighs
    ch = Channel(light=LIGHT_ITEMS)
    n = await _fill(ch, [big])
    got = [await ch.get() for _ in range(n)]
    assert all(g[0] is big for g in got) and len(ch) == 0
    assert await _fill(ch, [big]) == n
    assert ch.take_ready() is not None and Channel().take_ready() is None


async def test_a_slow_async_consumer_leaves_the_run_a_bounded_lead():
    made = []

    def mark(x):
        made.append(x)
        return x

    async with af.range(100_000).map(mark).batch(256).aiter() as it:
        await it.__anext__()
        await asyncio.sleep(0.3)
        lead = len(made)
    # up to 64 light chunks of a batch each in the consumer's channel, the batch being made
    assert 16 * 256 <= lead <= (64 + 4) * 256
    # heavy items (unknown objects) keep the two chunks of the default bound
    made.clear()
    async with af.range(100_000).map(lambda x: mark(object())).batch(256).aiter() as it:
        await it.__anext__()
        await asyncio.sleep(0.3)
        assert len(made) <= (1 + CHANNEL_CHUNKS + 1) * 256
    # nor where a shallow log must reach back to the consumer (shuffle's), or prefetch(n)
    base = af.range(100_000).map(mark)
    for p in (base.shuffle(4, seed=0), base.prefetch(2)):
        made.clear()
        async with p.aiter() as it:
            await it.__anext__()
            await asyncio.sleep(0.3)
            assert len(made) <= 8 * 256


def test_a_light_lead_stays_within_max_inflight():
    # the light chunks a consumer's channel holds past its bound are few objects too:
    # `max_inflight` is the static bound on what a run holds, light items or not
    made = []

    def mark(x):
        made.append(x)
        return x

    p = af.range(10**6).map(mark)
    with p.iter() as it:
        next(it)
        time.sleep(0.3)
        assert 16 * CHUNK_MAX < len(made) <= p.max_inflight()

    async def slow_async():
        async with p.aiter() as it:
            await it.__anext__()
            await asyncio.sleep(0.3)
            return len(made)

    made.clear()
    assert 16 * CHUNK_MAX < asyncio.run(slow_async()) <= p.max_inflight()
