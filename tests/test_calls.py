"""Concurrent maps: threads, async tasks, any Executor (Dask), and their limits."""

from __future__ import annotations

import asyncio
import os
import random
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import psutil
import pytest

import aioflow as af
from tests.conftest import _forkserver_pid, _resource_tracker_pid, _snapshot
from tests.test_procs import Boom, fail_at_5, square


# -- threads, async tasks, the caller's executor ----------------------------------------
class Gauge:
    """Counts calls in flight and remembers the most at once."""

    def __init__(self) -> None:
        self.now = self.most = 0
        self.lock = threading.Lock()

    def __enter__(self) -> None:
        with self.lock:
            self.now += 1
            self.most = max(self.most, self.now)

    def __exit__(self, *exc: object) -> None:
        with self.lock:
            self.now -= 1


def test_thread_map_runs_blocking_calls_concurrently_in_order(no_leaks):
    g = Gauge()

    def blocking(x: int) -> int:
        with g:
            time.sleep(0.01)
        return x

    out = af.range(60).map(blocking, executor="thread", concurrency=8).to_list()
    assert out == list(range(60))
    assert 2 <= g.most <= 8


async def test_async_map_keeps_at_most_concurrency_calls_in_flight(no_leaks):
    g = Gauge()

    async def io(x: int) -> int:
        with g:
            await asyncio.sleep(0.002 * (x % 5))
        return x

    out = await af.range(100).map(io, concurrency=7).collect()
    assert out == list(range(100))
    assert g.most == 7


async def test_unordered_async_map_yields_in_completion_order(no_leaks):
    async def wait(x: int) -> int:
        await asyncio.sleep(0.2 if x == 0 else 0.0)
        return x

    out = await af.range(10).map(wait, concurrency=4, ordered=False).collect()
    assert sorted(out) == list(range(10)) and out[-1] == 0


async def test_async_call_past_timeout_raises_stage_timeout(no_leaks):
    async def stuck(x: int) -> int:
        await asyncio.sleep(10 if x == 2 else 0)
        return x

    got = []
    with pytest.raises(af.StageTimeout, match=r"map\(stuck\).*item 2") as info:
        async for x in af.range(5).map(stuck, concurrency=2, timeout=0.2):
            got.append(x)
    assert got == [0, 1] and isinstance(info.value, TimeoutError)


def test_callers_executor_is_used_and_stays_open(no_leaks):
    with ThreadPoolExecutor(2, thread_name_prefix="mine") as ex:
        names = af.range(6).map(lambda x: threading.current_thread().name, executor=ex)
        assert all(n.startswith("mine") for n in names.to_list())
        assert ex.submit(square, 3).result() == 9  # not shut down by the run


class CountingExecutor(ThreadPoolExecutor):
    """A caller's Executor that counts the tasks submitted to it."""

    def __init__(self) -> None:
        super().__init__(2, thread_name_prefix="counted")
        self.submits = 0

    def submit(self, fn, /, *args, **kwargs):  # type: ignore[override]
        self.submits += 1
        return super().submit(fn, *args, **kwargs)


def fail_at_150(x: int) -> int:
    if x == 150:
        raise Boom(150, "one hundred fifty")
    return x


def test_callers_executor_gets_batches_of_cheap_items_not_one_task_each(no_leaks):
    with CountingExecutor() as ex:
        out = af.range(2000).map(square, executor=ex, concurrency=2).to_list()
        assert out == [x * x for x in range(2000)]
        assert ex.submits < 200  # batches of up to 256 items once a call has been timed


def test_callers_executor_batches_keep_error_position_skip_and_unordered(no_leaks):
    with CountingExecutor() as ex:
        with pytest.raises(Boom) as info:
            af.range(300).map(fail_at_150, executor=ex, concurrency=2).to_list()
        assert info.value.args == (150, "one hundred fifty")
        assert any("item 150" in n for n in info.value.__notes__)
        assert any("map(fail_at_150)" in n for n in info.value.__notes__)
        with af.range(300).map(fail_at_150, executor=ex, on_error="skip").iter() as it:
            assert list(it) == [x for x in range(300) if x != 150]
            assert it.stats()["map(fail_at_150)"].errors_skipped == 1
        p = af.range(300).map(square, executor=ex, concurrency=3, ordered=False)
        assert sorted(p.to_list()) == [x * x for x in range(300)]
        assert ex.submits < 300


def test_callers_executor_with_timeout_bounds_each_item(no_leaks):
    def slow_at_3(x: int) -> int:
        time.sleep(2 if x == 3 else 0)
        return x

    with ThreadPoolExecutor(2) as ex, pytest.raises(af.StageTimeout, match="item 3"):
        af.range(6).map(slow_at_3, executor=ex, timeout=0.5).to_list()


@pytest.mark.filterwarnings("ignore::DeprecationWarning", "ignore::ResourceWarning")
def test_dask_cluster_executor_runs_a_map_and_stays_open():
    distributed = pytest.importorskip("distributed")
    before = _snapshot()
    with (
        distributed.LocalCluster(
            n_workers=2, threads_per_worker=1, processes=True, dashboard_address="127.0.0.1:0"
        ) as cluster,
        distributed.Client(cluster) as client,
    ):
        ex = client.get_executor()
        p = af.range(20).map(lambda x: (x * x, os.getpid()), executor=ex, concurrency=4)
        out = p.to_list()
        assert [y for y, _ in out] == [x * x for x in range(20)]
        assert os.getpid() not in {pid for _, pid in out}
        with pytest.raises(Boom) as info:
            af.range(10).map(fail_at_5, executor=ex, concurrency=4).to_list()
        assert info.value.args == (5, "five")
        # equal batches are fresh calls, not one result reused (Dask's pure=True would)
        p = af.from_iterable([0] * 2000).map(lambda x: random.random(), executor=ex)
        assert len(set(p.to_list())) == 2000
        assert ex.submit(square, 4).result() == 16  # still open: it is the caller's
    assert children_left(before, 10) == []


def children_left(before: tuple, deadline: float) -> list[int]:
    """Child processes started since ``before`` that are still alive after ``deadline`` s
    (the cluster's; its client keeps threads of its own, which are not checked here).
    multiprocessing's services (resource tracker, fork server) live as long as this
    process once the cluster started them: they are not the cluster's."""
    end = time.monotonic() + deadline
    while True:
        services = {_forkserver_pid(), _resource_tracker_pid()}
        left = [
            c.pid
            for c in psutil.Process().children(recursive=True)
            if c.pid not in before[1]
            and c.pid not in services
            and c.status() != psutil.STATUS_ZOMBIE
        ]
        if not left or time.monotonic() > end:
            return left
        time.sleep(0.1)


# -- prefetch -----------------------------------------------------------------------------
async def test_prefetch_produces_ahead_of_the_consumer_within_its_bound(no_leaks):
    produced = 0

    async def gen():
        nonlocal produced
        for i in range(1000):
            produced += 1
            await asyncio.sleep(0)
            yield i

    p = af.from_iterable(gen).prefetch(5)
    async with p.aiter() as it:
        assert await anext(it) == 0
        await asyncio.sleep(0.1)  # the consumer is busy; the producer runs ahead
        assert 6 <= produced <= p.max_inflight()
        rest = [x async for x in it]
    assert rest == list(range(1, 1000))


@pytest.mark.parametrize("bad", [0, -2, -5, True, 2.0, "4", None])
def test_concurrency_must_be_a_positive_int_or_autotune(bad):
    with pytest.raises(af.PipelineError, match="positive int or af.AUTOTUNE"):
        af.range(3).map(lambda x: x, concurrency=bad)


@pytest.mark.parametrize("executor", [None, "thread"])
def test_concurrency_autotune_is_accepted_and_runs(executor):
    p = af.range(300).map(lambda x: x + 1, concurrency=af.AUTOTUNE, executor=executor)
    assert p.to_list() == list(range(1, 301))
