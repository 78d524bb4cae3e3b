"""The sync adapter from inside a running loop and from a non-main thread."""

from __future__ import annotations

import asyncio
import threading
import time

import aioflow as af
from tests.faults.conftest import settle


async def test_sync_iteration_inside_a_running_loop_and_break():
    p = af.range(10**8).map(lambda x: x).prefetch(4)
    for x in p:  # a notebook cell: the caller's loop is running in this thread
        if x == 100:
            break
    assert af.range(5).to_list() == [0, 1, 2, 3, 4]
    await settle()


def test_sync_iteration_from_a_non_main_thread_with_break_and_error():
    out: list[object] = []

    def worker() -> None:
        for x in af.range(10**8).prefetch(4):
            if x == 50:
                break
        out.append("broke")
        try:
            af.range(10).map(lambda x: 1 // (x - 5)).to_list()
        except ZeroDivisionError as e:
            out.append(e)

    t = threading.Thread(target=worker)
    t.start()
    t.join(10)
    assert not t.is_alive()
    assert out[0] == "broke" and isinstance(out[1], ZeroDivisionError)


def test_many_threads_iterate_the_same_pipeline_at_once():
    p = af.range(2000).map(lambda x: x * 2, executor="thread", concurrency=2).batch(100)
    results: list[int] = []
    lock = threading.Lock()

    def worker() -> None:
        s = sum(int(b.sum()) for b in p)
        with lock:
            results.append(s)

    threads = [threading.Thread(target=worker) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(20)
    assert results == [2 * sum(range(2000))] * 4


def test_iter_timeout_expiring_leaves_the_run_closable():
    def slow(x):
        time.sleep(0.5)
        return x

    t0 = time.monotonic()
    with af.range(3).map(slow, executor="thread").iter(timeout=0.05) as it:
        try:
            next(it)
        except af.NextTimeout as e:
            assert "0.05" in str(e)
        else:  # pragma: no cover
            raise AssertionError("no timeout")
    assert time.monotonic() - t0 < 5


async def test_aiter_timeout_expiring_leaves_no_task():
    async def slow(x):
        await asyncio.sleep(10)
        return x

    async with af.range(3).map(slow, concurrency=3).aiter(timeout=0.05) as it:
        try:
            await anext(it)
        except af.NextTimeout:
            pass
        else:  # pragma: no cover
            raise AssertionError("no timeout")
    await settle()
