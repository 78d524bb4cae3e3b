"""The consuming task cancelled: CancelledError passes through, the run stops."""

from __future__ import annotations

import asyncio

import pytest

import aioflow as af
from tests.faults.conftest import settle


async def _forever(x):
    await asyncio.sleep(3600)
    return x


@pytest.mark.parametrize(
    "make",
    [
        lambda: af.range(10**8).map(lambda x: x),
        lambda: af.range(10).map(_forever, concurrency=4),
        lambda: af.range(10**8).prefetch(4),
    ],
    ids=["inline", "hung-async-calls", "prefetch"],
)
async def test_cancelling_the_consumer_passes_through_and_stops_the_run(make):
    async def consume():
        async with make().aiter() as it:
            async for _ in it:
                await asyncio.sleep(0)

    task = asyncio.create_task(consume())
    await asyncio.sleep(0.05)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await asyncio.wait_for(task, 5)
    await settle()


async def test_cancelling_a_consumer_that_did_not_use_a_context_manager():
    async def consume():
        async for _ in af.range(10).map(_forever, concurrency=4):
            pass

    task = asyncio.create_task(consume())
    await asyncio.sleep(0.05)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    # the iterator is dropped with the task's frame: its finalizer cancels the run
    await settle()


async def test_a_timeout_around_the_consumer_cancels_the_run():
    with pytest.raises(TimeoutError):
        async with asyncio.timeout(0.1):
            async with af.range(10).map(_forever, concurrency=2).aiter() as it:
                async for _ in it:
                    pass
    await settle()
