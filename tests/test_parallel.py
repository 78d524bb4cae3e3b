"""Parallel map: process pools the run owns, threads, async tasks, any Executor (Dask)."""

from __future__ import annotations

import asyncio
import os
import random
import signal
import subprocess
import sys
import textwrap
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import psutil
import pytest

import aioflow as af
from aioflow import _procs
from tests.conftest import _forkserver_pid, _resource_tracker_pid, _snapshot


# -- leak checks ----------------------------------------------------------------------
def shm_segments() -> list[str]:
    """Shared-memory segments of this process's process pools."""
    try:
        return [n for n in os.listdir("/dev/shm") if n.startswith(f"aioflow{os.getpid()}")]
    except FileNotFoundError:  # pragma: no cover - no /dev/shm
        return []


@pytest.fixture(scope="module", autouse=True)
def _fork_server_started() -> None:
    """The fork server (and its fds) live as long as this process: start it before any
    baseline of the leak checks is taken."""
    assert af.range(2).map(square, executor="process").to_list() == [0, 1]


@pytest.fixture
def no_leaks(no_leaks):  # the shared check (threads, child processes, fds), and /dev/shm
    yield
    assert shm_segments() == []


# -- functions shipped to workers (defined in this test module: sent by value) ----------
class Boom(Exception):
    def __init__(self, code: int, why: str) -> None:
        super().__init__(code, why)


def square(x: int) -> int:
    return x * x


def fail_at_5(x: int) -> int:
    if x == 5:
        raise Boom(5, "five")
    return x


def pid_of(x: int) -> int:
    return os.getpid()


def sigint_ignored(x: int) -> bool:
    return signal.getsignal(signal.SIGINT) is signal.SIG_IGN


def big_array(i: int) -> np.ndarray:
    return np.full((256, 1024), i, dtype=np.float32)  # 1 MiB


def slow_big_array(i: int) -> np.ndarray:
    time.sleep(0.02)
    return big_array(i)


def die_at_3(x: int) -> int:
    if x == 3:
        time.sleep(0.1)
        os.kill(os.getpid(), signal.SIGKILL)
    return x


def exit_at_2(x: int) -> int:
    if x == 2:
        os._exit(3)
    return x


def hang_at_1(x: int) -> int:
    if x == 1:
        time.sleep(60)
    return x


def sleep_then(x: tuple[float, int]) -> int:
    time.sleep(x[0])
    return x[1]


# -- process map ------------------------------------------------------------------------
def test_process_map_ships_lambdas_closures_and_test_module_functions(no_leaks):
    k = 3

    def add_k(x: int) -> int:  # a closure
        return x + k

    p = (
        af.range(50)
        .map(lambda x: x * 2, executor="process", concurrency=2)
        .map(add_k, executor="process", concurrency=1)
        .map(square, executor="process", concurrency=1)
        .filter(lambda y: y % 3 == 0, executor="process", concurrency=1)
    )
    assert p.to_list() == [y for x in range(50) if (y := (2 * x + 3) ** 2) % 3 == 0]


def test_process_workers_start_from_the_fork_server_and_ignore_sigint(no_leaks):
    p = af.range(4).map(lambda x: (os.getpid(), sigint_ignored(x)), executor="process")
    out = p.to_list()
    assert all(ignored for _, ignored in out)
    # the worker is gone by now; its parent was the fork server, not this process
    assert {pid for pid, _ in out} and os.getpid() not in {pid for pid, _ in out}


def test_process_map_sends_small_items_in_batches_and_keeps_order(no_leaks, monkeypatch):
    sizes = []
    submit = _procs.ProcessPool.submit

    def counting_submit(self, fn_id, items, pos):
        sizes.append(len(items))
        return submit(self, fn_id, items, pos)

    monkeypatch.setattr(_procs.ProcessPool, "submit", counting_submit)
    out = af.range(3000).map(square, executor="process", concurrency=2).to_list()
    assert out == [x * x for x in range(3000)]
    assert sum(sizes) == 3000
    assert sizes[0] == 1  # the first call goes alone: its time sizes the batches
    assert len(sizes) < 3000 / 10


def test_process_map_of_empty_input_and_re_iteration(no_leaks):
    assert af.range(0).map(square, executor="process", concurrency=2).to_list() == []
    p = af.range(20).map(square, executor="process", concurrency=2)
    assert p.to_list() == p.to_list() == [x * x for x in range(20)]


def test_repeat_reuses_the_runs_pool_across_epochs(no_leaks):
    pids = af.range(40).map(pid_of, executor="process", concurrency=2).repeat(3).to_list()
    assert len(pids) == 120
    assert len(set(pids)) <= 2


def test_large_numpy_results_come_back_through_shared_memory(no_leaks):
    arrays = af.range(6).map(big_array, executor="process", concurrency=2).to_list()
    assert [float(a[0, 0]) for a in arrays] == [0.0, 1.0, 2.0, 3.0, 4.0, 5.0]
    assert all(a.shape == (256, 1024) and a.flags.writeable for a in arrays)
    base = arrays[0]
    while getattr(base, "base", None) is not None:
        base = base.base
    assert isinstance(base, memoryview) and "mmap" in repr(base.obj)
    assert shm_segments() == []  # unlinked as soon as received, while still mapped


def test_break_inside_process_map_joins_workers_and_leaves_no_shared_memory(no_leaks):
    p = af.range(200).map(slow_big_array, executor="process", concurrency=2)
    got = []
    for a in p:
        got.append(int(a[0, 0]))
        if len(got) == 3:
            break
    assert got == [0, 1, 2]


async def test_process_map_on_the_callers_loop_closes_its_pool_on_break(no_leaks):
    got = []
    async with af.range(100).map(slow_big_array, executor="process", concurrency=2).aiter() as it:
        async for a in it:
            got.append(int(a[0, 0]))
            if len(got) == 2:
                break
    assert got == [0, 1]


def test_unordered_process_map_yields_in_completion_order(no_leaks):
    items = [(0.6, 0), (0.0, 1), (0.0, 2), (0.0, 3)]
    p = af.from_iterable(items).map(sleep_then, executor="process", concurrency=2, ordered=False)
    out = p.to_list()
    assert sorted(out) == [0, 1, 2, 3]
    assert out[-1] == 0


def test_worker_exception_reaches_consumer_as_same_type_with_remote_traceback(no_leaks):
    got = []
    with pytest.raises(Boom) as info:
        for x in af.range(10).map(fail_at_5, executor="process", concurrency=2):
            got.append(x)
    assert got == [0, 1, 2, 3, 4]  # items before the failing one come first
    e = info.value
    assert type(e) is Boom and e.args == (5, "five")
    notes = "\n".join(e.__notes__)
    assert "remote traceback" in notes and "fail_at_5" in notes
    assert "raised in stage 'map(fail_at_5)' at item 5" in notes


def test_worker_exceptions_are_skipped_with_on_error_skip(no_leaks):
    p = af.range(10).map(fail_at_5, executor="process", concurrency=2, on_error="skip")
    assert p.to_list() == [0, 1, 2, 3, 4, 6, 7, 8, 9]


def test_sigkilled_worker_raises_worker_died_and_next_run_starts_fresh(no_leaks):
    p = af.range(8).map(die_at_3, executor="process", concurrency=2, on_error="skip")
    t0 = time.monotonic()
    with pytest.raises(af.WorkerDied) as info:
        p.to_list()
    assert time.monotonic() - t0 < 10
    e = info.value
    assert e.signal == signal.SIGKILL and e.exitcode is None and e.pid
    assert "map(die_at_3)" in str(e) and e.stage == "map(die_at_3)"
    assert not psutil.pid_exists(e.pid) or psutil.Process(e.pid).status() == "zombie"
    # the next run gets a fresh pool
    assert af.range(3).map(die_at_3, executor="process", concurrency=2).to_list() == [0, 1, 2]


def test_worker_that_exits_raises_worker_died_with_its_exit_code(no_leaks):
    with pytest.raises(af.WorkerDied) as info:
        af.range(5).map(exit_at_2, executor="process", concurrency=1).to_list()
    assert info.value.exitcode == 3 and info.value.signal is None


def test_hung_process_worker_is_killed_on_timeout(no_leaks):
    p = af.range(4).map(hang_at_1, executor="process", concurrency=2, timeout=1.0)
    t0 = time.monotonic()
    got = []
    with pytest.raises(af.StageTimeout) as info:
        for x in p:
            got.append(x)
    assert time.monotonic() - t0 < 10
    assert got == [0]
    assert isinstance(info.value, TimeoutError)
    assert "map(hang_at_1)" in str(info.value) and "item 1" in str(info.value)


def test_timed_out_call_is_skipped_and_its_worker_replaced(no_leaks):
    p = af.range(6).map(hang_at_1, executor="process", concurrency=1, timeout=1.0, on_error="skip")
    with p.iter() as it:
        assert list(it) == [0, 2, 3, 4, 5]
        assert it.stats()["map(hang_at_1)"].errors_skipped == 1


def test_unpicklable_function_gives_an_error_naming_the_stage(no_leaks):
    lock = threading.Lock()

    def locked(x: int) -> int:
        with lock:
            return x

    with pytest.raises(af.PipelineError, match=r"stage 'map\(locked\)'.*cannot be sent"):
        af.range(3).map(locked, executor="process").to_list()


def test_async_function_in_a_process_map_is_refused_when_described():
    async def fetch(x: int) -> int:
        return x

    with pytest.raises(af.PipelineError, match="async function"):
        af.range(3).map(fetch, executor="process")


def test_unpicklable_result_gives_an_error_naming_the_stage_and_item(no_leaks):
    p = af.range(3).map(lambda x: threading.Lock() if x == 1 else x, executor="process")
    got = []
    with pytest.raises(af.StageError, match=r"stage 'map\(<lambda>\)'.*could not be sent"):
        for x in p:
            got.append(x)
    assert got == [0]


def test_workers_die_with_their_parent_when_it_is_sigkilled(tmp_path):
    script = tmp_path / "parent.py"
    script.write_text(
        textwrap.dedent(
            """
            import os, sys, time
            import aioflow as af

            def slow(x):
                time.sleep(0.05)
                return os.getpid()

            if __name__ == "__main__":
                seen = set()
                for pid in af.range(10_000).map(slow, executor="process", concurrency=2):
                    if pid not in seen:
                        seen.add(pid)
                        print(pid, flush=True)
            """
        )
    )
    with subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True) as proc:
        try:
            assert proc.stdout is not None
            pids = [int(proc.stdout.readline()), int(proc.stdout.readline())]
            assert all(psutil.pid_exists(pid) for pid in pids)
        finally:
            proc.kill()
            proc.wait()
    deadline = time.monotonic() + 5
    while any(psutil.pid_exists(pid) for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not any(psutil.pid_exists(pid) for pid in pids)


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


def _slow_pid(x: int) -> int:
    time.sleep(0.3)
    return os.getpid()


def test_a_fresh_pool_spreads_its_first_calls_over_workers_that_are_still_starting(no_leaks):
    # The first worker up must not take every call queued behind its first: the second
    # worker, a moment from ready, runs the next one (calls run side by side, not in turn).
    for _ in range(3):
        with af.from_iterable([0, 1]).map(_slow_pid, executor="process", concurrency=2) as p:
            assert len(set(p.to_list())) == 2
