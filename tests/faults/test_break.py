"""Leaving a run early: break (sync and async), the iterator merely dropped, close()."""

from __future__ import annotations

import asyncio
import gc
import time

import pytest

import aioflow as af
from tests.faults.conftest import settle


async def _async_slow(x):
    await asyncio.sleep(0.001)
    return x


def _thread_slow(x):
    time.sleep(0.001)
    return x


PIPELINES = {
    "inline": lambda: af.range(10**8).map(lambda x: x + 1).batch(4).unbatch(),
    "async-map": lambda: af.range(10**8).map(_async_slow, concurrency=16),
    "thread-map": lambda: af.range(10**8).map(_thread_slow, executor="thread", concurrency=4),
    "prefetch": lambda: af.from_iterable(iter(range(10**8))).prefetch(8).map(lambda x: x),
    "zip-repeat": lambda: af.zip(af.range(10**8), af.range(3).repeat()),
    "flat_map": lambda: af.range(10**8).flat_map(lambda n: af.range(3).map(lambda y: y)),
}


@pytest.mark.parametrize("make", PIPELINES.values(), ids=PIPELINES.keys())
def test_break_in_a_sync_for_stops_the_run_within_a_second(make):
    t0 = time.monotonic()
    for i, _ in enumerate(make()):
        if i == 20:
            break
    assert time.monotonic() - t0 < 5


@pytest.mark.parametrize("make", PIPELINES.values(), ids=PIPELINES.keys())
async def test_break_in_an_async_for_stops_the_run(make):
    i = 0
    async for _ in make():
        i += 1
        if i == 20:
            break
    await settle()


@pytest.mark.parametrize("make", PIPELINES.values(), ids=PIPELINES.keys())
def test_a_dropped_sync_iterator_stops_its_run(make):
    it = make().iter()
    for _ in range(5):
        next(it)
    del it
    gc.collect()


@pytest.mark.parametrize("make", PIPELINES.values(), ids=PIPELINES.keys())
async def test_a_dropped_async_iterator_stops_its_run(make):
    it = make().aiter()
    for _ in range(5):
        await anext(it)
    del it
    gc.collect()
    await settle()


def test_close_from_the_consumer_thread_is_idempotent():
    it = af.range(10**8).prefetch(4).iter()
    next(it)
    it.close()
    it.close()
    with pytest.raises(StopIteration):
        next(it)


async def test_aclose_is_idempotent_and_ends_iteration():
    it = af.range(10**8).map(_async_slow, concurrency=4).aiter()
    await anext(it)
    await it.aclose()
    await it.aclose()
    with pytest.raises(StopAsyncIteration):
        await anext(it)
    await settle()


def test_close_before_the_first_item_starts_nothing():
    it = af.range(10).iter()
    it.close()
    with pytest.raises(StopIteration):
        next(it)
