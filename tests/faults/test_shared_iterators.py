"""One iterator read by several tasks or threads at once: each item is served once.

Every reader ends (none is left waiting at the end), no item is duplicated or lost, and
only one run is started; closing from another task or thread wakes a waiting reader.
"""

from __future__ import annotations

import asyncio
import threading
import time

import aioflow as af
from tests.faults.conftest import settle

DEADLINE = 20.0


async def _slow(x):
    await asyncio.sleep(0.001)
    return x


async def test_two_tasks_reading_one_async_iterator_get_each_item_once_and_both_end():
    async def drain(it, out):
        async for x in it:
            out.append(x)
            await asyncio.sleep(0)

    a: list[int] = []
    b: list[int] = []
    async with af.range(500).map(_slow, concurrency=8).aiter() as it:
        async with asyncio.timeout(DEADLINE):
            await asyncio.gather(drain(it, a), drain(it, b))
    assert sorted(a + b) == list(range(500))
    assert a and b, "both readers were served"
    await settle()


async def test_closing_an_async_iterator_wakes_the_task_waiting_on_it():
    async def forever(x):
        await asyncio.sleep(3600)

    it = af.range(3).map(forever, concurrency=2).aiter()
    reader = asyncio.ensure_future(anext(it, "ended"))
    await asyncio.sleep(0.05)
    await it.aclose()
    async with asyncio.timeout(DEADLINE):
        assert await reader == "ended"
    await settle()


def test_threads_calling_next_on_one_sync_iterator_share_one_run_and_each_item():
    engines_before = sum(t.name == "aioflow-run" for t in threading.enumerate())
    seen: list[int] = []
    most_engines = []
    lock = threading.Lock()
    start = threading.Barrier(4)
    it = af.range(2000).map(lambda x: x, executor="thread", concurrency=2).iter(timeout=DEADLINE)

    def worker() -> None:
        start.wait()
        for x in it:
            with lock:
                seen.append(x)
                most_engines.append(
                    sum(t.name == "aioflow-run" for t in threading.enumerate()) - engines_before
                )

    threads = [threading.Thread(target=worker) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(DEADLINE)
    it.close()
    assert not any(t.is_alive() for t in threads)
    assert sorted(seen) == list(range(2000))
    assert max(most_engines) == 1


def test_closing_a_sync_iterator_wakes_the_thread_waiting_in_next():
    got: list[object] = []
    release = threading.Event()
    it = af.range(3).map(lambda x: release.wait(), executor="thread").iter()

    def reader() -> None:
        got.append(next(it, "ended"))

    t = threading.Thread(target=reader)
    t.start()
    time.sleep(0.2)
    closer = threading.Thread(target=it.close)
    closer.start()
    t.join(DEADLINE)
    release.set()
    closer.join(DEADLINE)
    assert got == ["ended"]
