"""Process maps: the pool the run takes from its stage, its workers, their failures."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import numpy as np
import psutil
import pytest

import aioflow as af
from aioflow._process import pool as _procs


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
    # each lies in a shared mapping of a worker's memfd, not in a copy
    maps = Path("/proc/self/maps").read_text().splitlines()
    shared = [
        tuple(int(x, 16) for x in line.split()[0].split("-"))
        for line in maps
        if "memfd:aioflow" in line
    ]
    for a in arrays:
        at = a.__array_interface__["data"][0]
        assert any(lo <= at < hi for lo, hi in shared), hex(at)
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


def _slow_pid(x: int) -> int:
    time.sleep(0.3)
    return os.getpid()


def test_a_fresh_pool_spreads_its_first_calls_over_workers_that_are_still_starting(no_leaks):
    # The first worker up must not take every call queued behind its first: the second
    # worker, a moment from ready, runs the next one (calls run side by side, not in turn).
    for _ in range(3):
        with af.from_iterable([0, 1]).map(_slow_pid, executor="process", concurrency=2) as p:
            assert len(set(p.to_list())) == 2


@pytest.mark.parametrize("workers", [1, 3])
def test_a_process_maps_batches_in_flight_hold_no_more_than_its_node_declares(no_leaks, workers):
    from aioflow._process import pool_life as _pool_life

    with af.range(50).map(abs, executor="process", concurrency=workers) as p:
        assert p.to_list() == list(range(50))
        pool = _pool_life._idle[p._node]  # the stage's pool, warm for its next run
        # the stage starts up to 2 x slots batches (see concurrent_map), each of max_batch
        assert 2 * pool.slots * pool.max_batch <= p._node.holds
        assert pool.max_batch > 1


class _Marked:
    """Callable whose unpickling (in a worker) creates a file: the function was loaded."""

    def __init__(self, marker: str, delay: float = 0.0) -> None:
        self.marker = marker
        self.delay = delay

    def __setstate__(self, state: dict[str, object]) -> None:
        self.__dict__.update(state)
        if os.getpid() != self.__dict__.get("parent"):
            time.sleep(self.delay)
            with open(self.marker, "a") as f:
                f.write(f"{os.getpid()}\n")

    def __getstate__(self) -> dict[str, object]:
        return {**self.__dict__, "parent": os.getpid()}

    def __call__(self, x: int) -> int:
        return x


def test_workers_start_and_load_the_function_as_the_run_starts(no_leaks, tmp_path):
    # The source gives its first item only once every worker has loaded the function:
    # workers boot (and import what the function needs) while the run starts, not after
    # the first items reached the stage.
    marker = tmp_path / "loaded"

    def loaded() -> list[str]:
        return marker.read_text().split() if marker.exists() else []

    def source():
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if len(loaded()) == 2:
                break
            time.sleep(0.01)
        else:
            raise AssertionError("the workers did not load the function before any item")
        yield from range(10)

    fn = _Marked(str(marker))
    with af.from_iterable(source()).map(fn, executor="process", concurrency=2) as p:
        assert p.to_list() == list(range(10))
        assert len(set(loaded())) == 2  # once per worker, not per task


def test_loading_the_function_is_not_counted_as_the_items_busy_time(
    no_leaks, tmp_path, monkeypatch
):
    # (the function goes with the first batch, as for a pool the run starts itself)
    monkeypatch.setattr(af._iterators, "prestart", lambda pipeline: None, raising=False)
    p = af.range(4).map(_Marked(str(tmp_path / "m"), delay=1.0), executor="process")
    with p.iter() as it:
        assert list(it) == [0, 1, 2, 3]
        (row,) = [s for s in it.stats().stages if s.name.startswith("map(")]
    assert row.busy < 0.5, row
    p.close()
