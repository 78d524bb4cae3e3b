"""The runtime's channel between two tasks: its bounds, its growth, closing with an error."""

from __future__ import annotations

import asyncio

import pytest

from aioflow._core.channel import Channel
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
