"""Bounded memory: a slow consumer never makes a run hold more than max_inflight() items."""

from __future__ import annotations

import asyncio
import gc
import resource
import time

import aioflow as af
from tests.faults.conftest import settle


class Item:
    live = 0
    peak = 0

    def __init__(self, i: int) -> None:
        self.i = i
        Item.live += 1
        Item.peak = max(Item.peak, Item.live)

    def __del__(self) -> None:
        Item.live -= 1


async def _enrich(x: Item) -> Item:
    await asyncio.sleep(0)
    return x


N = 200_000


def _batches_of_many_items() -> af.Pipeline[list[Item]]:
    """N items through a concurrent map, in batches of 16, ending in prefetch(4)."""
    return (
        af.from_iterable(lambda: (Item(i) for i in range(N)))
        .map(lambda x: x)
        .prefetch(64)
        .map(_enrich, concurrency=8)
        .batch(16, collate=list)
        .prefetch(4)
    )


async def test_a_slow_consumer_never_makes_the_run_hold_more_than_max_inflight():
    Item.live = Item.peak = 0
    p = _batches_of_many_items().unbatch()
    bound = p.max_inflight()
    assert bound < N, "the test needs a bound below the input size to mean anything"
    count = 0
    async with p.aiter() as it:
        async for x in it:
            count += 1
            del x
            if count % 50 == 0:
                await asyncio.sleep(0.002)  # slow consumer
                assert Item.live <= bound, (Item.live, bound)
            if count == 30_000:
                break
    assert Item.peak <= bound, (Item.peak, bound)
    assert Item.peak > 64, "the pipeline did run ahead of the consumer"
    await settle()
    gc.collect()
    assert Item.live == 0


def test_a_slow_consumer_under_for_never_makes_a_run_ending_in_prefetch_hold_more():
    # prefetch(4) last, read by a sync consumer (its channel, then the consumer's thread's)
    Item.live = Item.peak = 0
    p = _batches_of_many_items()
    bound = p.max_inflight()
    assert bound < N, "the test needs a bound below the input size to mean anything"
    count = 0
    with p.iter() as it:
        for batch in it:
            count += len(batch)
            del batch
            if count % 800 == 0:
                time.sleep(0.002)  # slow consumer
                assert Item.live <= bound, (Item.live, bound)
            if count >= 30_000:
                break
    assert Item.peak <= bound, (Item.peak, bound)
    assert Item.peak > 64, "the pipeline did run ahead of the consumer"
    gc.collect()
    assert Item.live == 0


def _rss_mib() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # pragma: no cover


def test_rss_stays_flat_over_repeated_epochs():
    import numpy as np

    p = (
        af.range(2000)
        .map(lambda i: np.full(1024, i, np.float32))
        .map(lambda a: a * 2, executor="thread", concurrency=2)
        .batch(32)
        .prefetch(2)
    )
    for _ in range(3):  # warm up allocators and caches
        for _ in p:
            pass
    gc.collect()
    before = _rss_mib()
    for _ in range(15):
        total = 0
        for b in p:
            total += b.shape[0]
        assert total == 2000
    gc.collect()
    after = _rss_mib()
    assert after - before < 20, f"RSS grew {after - before:.1f} MiB over 15 epochs"
