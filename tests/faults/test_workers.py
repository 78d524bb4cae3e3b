"""Process stages under the fault guard: a raising function, a worker SIGKILLed,
segfaulting or hung past ``timeout``, break, cancellation, two stages failing at once.

Each scenario also states its deadline, checks that every worker process it saw is gone
(reaped, not merely orphaned), and, where results travel through shared memory, that no
segment of the run is left in /dev/shm.
"""

from __future__ import annotations

import asyncio
import gc
import os
import signal
import time

import psutil
import pytest

import aioflow as af
from aioflow._process import forks
from tests.faults import _procfns as fns
from tests.faults._procfns import Boom
from tests.faults.conftest import settle

PROCESS = {"executor": "process", "concurrency": 2}
TIMEOUT = 1.5  # s, for the calls that hang: a quick call never takes that long


@pytest.fixture(scope="module", autouse=True)
def _fork_server_started() -> None:
    """The fork server (and its fds) lives as long as this process: start it before the
    guard takes its first baseline."""
    assert af.range(2).map(fns.fail_at_20, **PROCESS).to_list() == [0, 1]


# -- what a scenario checks after itself ----------------------------------------------
def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def workers() -> list[int]:
    """Pids of the live worker processes of this process: children running ``_worker``,
    and the children of its fork server (``_process/forks``)."""
    server = forks.server_pid()
    out = []
    for c in psutil.Process().children(recursive=True):
        try:
            spawned = c.ppid() == os.getpid() and "_process/worker.py" in " ".join(c.cmdline())
            if (spawned or (server is not None and c.ppid() == server)) and _alive(c.pid):
                out.append(c.pid)
        except psutil.NoSuchProcess:
            continue
    return out


def still_alive(pids: object, deadline: float = 5.0) -> list[int]:
    """The pids among ``pids`` still running after at most ``deadline`` s."""
    end = time.monotonic() + deadline
    while True:
        left = [pid for pid in set(pids) if _alive(pid)]  # type: ignore[call-overload]
        if not left or time.monotonic() > end:
            return left
        time.sleep(0.02)


def shm_listing() -> set[str]:
    return set(os.listdir("/dev/shm"))


def shm_left(before: set[str]) -> list[str]:
    """Entries of /dev/shm made since ``before`` and still there: this run's leftovers.
    Semaphores (``sem.*``) and segments of other processes' runs (other test sessions on
    the machine) are not ours."""
    mine = f"aioflow{os.getpid()}p"
    return sorted(
        n
        for n in shm_listing() - before
        if not n.startswith("sem.") and (n.startswith(mine) or not n.startswith("aioflow"))
    )


# -- a user function raising in a process stage ---------------------------------------
def _check_boom(e: BaseException, got: list[int]) -> None:
    assert type(e) is Boom and e.args == ("process", 20)
    notes = "\n".join(getattr(e, "__notes__", []))
    assert "remote traceback" in notes and "fail_at_20" in notes, notes
    assert "stage 'map(fail_at_20)' at item 20" in notes, notes
    assert got == list(range(20)), "every item before the failing one arrives first"


def test_a_process_function_raising_reaches_a_sync_consumer_as_its_own_type():
    got: list[int] = []
    t0 = time.monotonic()
    p = af.range(1000).map(fns.fail_at_20, **PROCESS)
    with pytest.raises(Boom) as info:
        for x in p.iter(timeout=5):
            got.append(x)
    assert time.monotonic() - t0 < 5
    _check_boom(info.value, got)
    p.close()  # the exception's frames keep p, and its warm pool, alive
    assert still_alive(workers()) == []


async def test_a_process_function_raising_reaches_an_async_consumer_as_its_own_type():
    got: list[int] = []
    p = af.range(1000).map(fns.fail_at_20, **PROCESS)
    with pytest.raises(Boom) as info:
        async with asyncio.timeout(5):
            async for x in p:
                got.append(x)
    _check_boom(info.value, got)
    await settle()
    p.close()
    assert still_alive(workers()) == []


# -- a worker SIGKILLed, segfaulting, hanging past timeout ----------------------------
def test_a_worker_sigkilled_mid_run_raises_worker_died_and_the_next_run_starts_fresh():
    p = af.range(40).map(fns.slow_pid, **PROCESS)
    got, seen = [], set()
    victim, t0 = 0, 0.0
    with pytest.raises(af.WorkerDied) as info:
        for x, pid in p.iter(timeout=5):
            got.append(x)
            seen.add(pid)
            if x == 3:
                victim, t0 = pid, time.monotonic()
                os.kill(victim, signal.SIGKILL)
    assert time.monotonic() - t0 < 5
    e = info.value
    assert (e.pid, e.signal, e.exitcode) == (victim, signal.SIGKILL, None)
    assert e.stage == "map(slow_pid)" and f"worker process {victim} killed by SIGKILL" in str(e)
    assert got == list(range(len(got))) and len(got) < 40
    assert still_alive(seen) == []
    # the same pipeline runs again, on a pool of new workers
    out = p.to_list()
    assert [x for x, _ in out] == list(range(40))
    assert not {pid for _, pid in out} & seen


async def test_a_worker_sigkilled_under_an_async_consumer_raises_worker_died():
    got, seen = [], set()
    victim = 0
    with pytest.raises(af.WorkerDied) as info:
        async with asyncio.timeout(5):
            async for x, pid in af.range(40).map(fns.slow_pid, **PROCESS):
                got.append(x)
                seen.add(pid)
                if x == 3:
                    victim = pid
                    os.kill(victim, signal.SIGKILL)
    assert (info.value.pid, info.value.signal) == (victim, signal.SIGKILL)
    assert got == list(range(len(got))) and len(got) < 40
    await settle()
    assert still_alive(seen) == []


def test_a_worker_segfaulting_raises_worker_died_with_sigsegv():
    got: list[int] = []
    t0 = time.monotonic()
    p = af.range(20).map(fns.segfault_at_3, executor="process", concurrency=1)
    with pytest.raises(af.WorkerDied) as info:
        for x in p.iter(timeout=5):
            got.append(x)
    assert time.monotonic() - t0 < 5
    e = info.value
    assert e.signal == signal.SIGSEGV == 11 and e.exitcode is None
    assert "killed by SIGSEGV while running item 3" in str(e)
    assert got == [0, 1, 2]
    assert not _alive(e.pid)
    assert still_alive(workers()) == []


def test_a_worker_hanging_past_timeout_raises_stage_timeout_and_is_killed():
    p = af.range(6).map(fns.hang_at_1, executor="process", concurrency=1, timeout=TIMEOUT)
    got = []
    t0 = time.monotonic()
    with pytest.raises(af.StageTimeout) as info:
        for x in p.iter(timeout=5):
            got.append(x)
    assert time.monotonic() - t0 < TIMEOUT + 5
    assert [x for x, _ in got] == [0]
    hung = got[0][1]  # one worker: item 1 ran where item 0 did
    assert f"worker process {hung} was killed" in str(info.value)
    assert "map(hang_at_1)" in str(info.value) and "item 1" in str(info.value)
    assert still_alive([hung]) == []
    p.close()
    assert still_alive(workers()) == []


def test_a_hung_worker_is_killed_at_the_timeout_not_when_the_run_ends():
    p = af.range(10**6).map(
        fns.hang_at_1, executor="process", concurrency=1, timeout=TIMEOUT, on_error="skip"
    )
    t0 = time.monotonic()
    with p.iter(timeout=5) as it:
        x0, hung = next(it)
        x2, fresh = next(it)  # after the timeout, from the worker that replaced it
        assert (x0, x2) == (0, 2) and fresh != hung
        assert time.monotonic() - t0 < TIMEOUT + 5
        assert still_alive([hung]) == []  # while the run still goes on
        assert next(it)[0] == 3
        assert it.stats()["map(hang_at_1)"].errors_skipped == 1
    p.close()  # the run is over; its pool stays warm until then
    assert still_alive([fresh]) == []


# -- leaving a process map early ------------------------------------------------------
def _big() -> af.Pipeline:
    return af.range(10**6).map(fns.big_array, **PROCESS)


def _x_pid(a: object) -> tuple[int, int]:
    return int(a[0, 0]), int(a[0, 1])  # type: ignore[index]


def test_break_in_a_sync_for_inside_a_process_map_joins_workers_and_frees_shm():
    shm = shm_listing()
    got = []
    t0 = time.monotonic()
    for a in _big():
        got.append(_x_pid(a))
        if len(got) == 10:
            break
    del a
    assert [x for x, _ in got] == list(range(10))
    assert still_alive({pid for _, pid in got}) == []
    assert time.monotonic() - t0 < 5
    assert shm_left(shm) == []


async def test_break_in_an_async_for_inside_a_process_map_joins_workers_and_frees_shm():
    shm = shm_listing()
    got = []
    async with asyncio.timeout(5):
        async for a in _big():
            got.append(_x_pid(a))
            if len(got) == 10:
                break
        del a
        await settle()
    assert [x for x, _ in got] == list(range(10))
    assert still_alive({pid for _, pid in got}) == []
    assert shm_left(shm) == []


def test_a_dropped_sync_iterator_of_a_process_map_joins_workers_and_frees_shm():
    shm = shm_listing()
    it = _big().iter()
    got = [_x_pid(next(it)) for _ in range(10)]
    t0 = time.monotonic()
    del it
    gc.collect()
    assert still_alive({pid for _, pid in got}) == []
    assert time.monotonic() - t0 < 5
    assert shm_left(shm) == []


async def test_a_dropped_async_iterator_of_a_process_map_joins_workers_and_frees_shm():
    shm = shm_listing()
    it = _big().aiter()
    got = [_x_pid(await anext(it)) for _ in range(10)]
    del it
    gc.collect()
    await settle(5)
    assert still_alive({pid for _, pid in got}) == []
    assert shm_left(shm) == []


# -- the consuming task cancelled -----------------------------------------------------
@pytest.mark.parametrize("fn", [fns.slow_pid, fns.hang_after_0], ids=["busy", "hung-calls"])
async def test_cancelling_the_consumer_of_a_process_map_stops_its_workers(fn):
    first = asyncio.Event()
    # the pipeline keeps its pool warm across runs: the test holds it, and releases it at
    # the end (when it becomes unreachable instead depends on the interpreter's frames)
    p = af.range(10**6).map(fn, **PROCESS)

    async def consume() -> None:
        async with p.aiter() as it:
            async for _ in it:
                first.set()

    task = asyncio.create_task(consume())
    await asyncio.wait_for(first.wait(), 5)
    pids = workers()
    assert len(pids) == 2
    t0 = time.monotonic()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await asyncio.wait_for(task, 5)
    assert time.monotonic() - t0 < 5
    await settle()
    p.close()
    assert still_alive(pids) == []


# -- two stages failing at once ---------------------------------------------------------
def _inline_fail_at_7(x: int) -> int:
    if x == 7:
        raise Boom("inline", x)
    return x


def _slow_thread_fail_from_5(x: int) -> int:
    time.sleep(0.05)
    if x >= 5:
        raise Boom("thread", x)
    return x


# the stage downstream fails first in stream order (item 5, a slow call), after the one
# upstream has failed (item 7, sooner): the consumer gets the downstream error only
TWO_FAILING = {
    "inline-then-process": (
        lambda: af.range(100).map(_inline_fail_at_7).map(fns.slow_fail_from_5, **PROCESS),
        ("process", 5),
    ),
    "process-then-thread": (
        lambda: (
            af.range(100)
            .map(fns.fail_at_7, **PROCESS)
            .map(_slow_thread_fail_from_5, executor="thread", concurrency=2)
        ),
        ("thread", 5),
    ),
    "process-then-process": (
        lambda: af.range(100).map(fns.fail_at_7, **PROCESS).map(fns.slow_fail_from_5, **PROCESS),
        ("process", 5),
    ),
}


@pytest.mark.parametrize("make, args", TWO_FAILING.values(), ids=TWO_FAILING.keys())
def test_two_stages_failing_with_a_process_stage_surface_the_first_in_stream_order(make, args):
    got: list[int] = []
    t0 = time.monotonic()
    p = make()
    with pytest.raises(Boom) as info:
        for x in p.iter(timeout=5):
            got.append(x)
    assert time.monotonic() - t0 < 5
    assert info.value.args == args
    assert got == [0, 1, 2, 3, 4]
    p.close()
    assert still_alive(workers()) == []


def test_a_worker_dying_downstream_of_a_failing_process_stage_surfaces_first():
    p = af.range(100).map(fns.fail_at_20, **PROCESS).map(fns.kill_self_at_3, **PROCESS)
    got: list[int] = []
    t0 = time.monotonic()
    with pytest.raises(af.WorkerDied) as info:
        for x in p.iter(timeout=5):
            got.append(x)
    assert time.monotonic() - t0 < 5
    assert info.value.stage == "map(kill_self_at_3)" and info.value.signal == signal.SIGKILL
    assert got == list(range(len(got))) and len(got) <= 3
    p.close()
    assert still_alive(workers()) == []
