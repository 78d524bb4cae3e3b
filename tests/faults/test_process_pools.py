"""Process pools that stay warm across epochs, workers that never run ``__main__``,
arrays through shared memory that cannot leak, collide or bloat, and errors that name
their input (issue 11). Every scenario runs under the fault guard."""

from __future__ import annotations

import asyncio
import gc
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest

import aioflow as af
from tests.faults import _procfns as fns
from tests.faults.test_workers import still_alive, workers

PROCESS = {"executor": "process", "concurrency": 2}
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _pids(p: af.Pipeline) -> set[int]:
    return {pid for _, pid in p.to_list()}


# -- warm pools -----------------------------------------------------------------------
def test_a_process_pool_stays_warm_across_epochs_and_close_stops_it():
    p = af.range(8).map(fns.slow_pid, **PROCESS)
    first = _pids(p)
    assert first and _pids(p) <= first  # the same workers serve the next epochs
    assert set(workers()) >= first
    p.close()
    assert still_alive(first) == []
    assert p.to_list()[0][0] == 0  # still usable: fresh workers
    p.close()


def test_with_pipeline_closes_its_pools_at_the_end_of_the_block():
    with af.range(4).map(fns.slow_pid, **PROCESS) as p:
        pids = _pids(p)
        assert _pids(p) <= pids
    assert still_alive(pids) == []


def test_a_pipeline_becoming_unreachable_stops_its_warm_workers():
    p = af.range(4).map(fns.slow_pid, **PROCESS)
    pids = _pids(p)
    assert len(still_alive(pids, deadline=0)) == len(pids)  # warm while p lives
    del p
    gc.collect()
    assert still_alive(pids) == []


def _wait_all_threads_gone(pid: int, deadline: float = 5.0) -> None:
    end = time.monotonic() + deadline
    while time.monotonic() < end:
        try:
            if len(os.listdir(f"/proc/{pid}/task")) <= 1:
                return
        except FileNotFoundError:
            return
        time.sleep(0.01)


def test_a_dead_idle_worker_gives_the_next_epoch_a_fresh_pool():
    p = af.range(6).map(fns.slow_pid, **PROCESS)
    pids = _pids(p)
    victim = next(iter(pids))
    os.kill(victim, signal.SIGKILL)
    assert still_alive([victim]) == []
    _wait_all_threads_gone(victim)  # (a zombie leader's other threads may still exit)
    again = p.to_list()
    assert [x for x, _ in again] == list(range(6))
    assert not {pid for _, pid in again} & pids
    p.close()
    assert still_alive(pids) == []


# -- real programs: no __main__ guard, interpreter exit, the parent SIGKILLed ---------
SCRIPT = """
import functools, os, sys
import aioflow as af
import heavy_mod  # the script's own import: a worker must never run it

@functools.lru_cache(None)  # pickled by name, it would need this script in the worker
def offset():
    return 0

def where(x):
    return os.getpid() + offset()

p = af.range(6).map(where, executor="process", concurrency=2)
pids = set()
for epoch in range(3):
    got = set(p.to_list())
    pids |= got
    print(epoch, len(pids) <= 2, os.getpid() not in got, flush=True)  # the same workers
open(os.path.join(sys.argv[1], "pids"), "w").write(" ".join(map(str, pids)))
if len(sys.argv) > 2:
    import time
    print("idle", flush=True)
    time.sleep(3600)
"""


def _script(tmp_path: Path, *args: str) -> subprocess.Popen[str]:
    (tmp_path / "heavy_mod.py").write_text(
        "import os, sys\nopen(os.path.join(sys.argv[1], f'imported-{os.getpid()}'), 'w').close()\n"
    )
    (tmp_path / "train.py").write_text(SCRIPT)
    env = {**os.environ, "PYTHONPATH": ROOT}
    return subprocess.Popen(
        [sys.executable, str(tmp_path / "train.py"), str(tmp_path), *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        cwd=tmp_path,
        start_new_session=True,
    )


def test_a_script_without_a_main_guard_runs_and_its_workers_never_import_main(tmp_path):
    proc = _script(tmp_path)
    try:
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
    assert proc.returncode == 0, err
    assert out.split("\n")[:3] == ["0 True True", "1 True True", "2 True True"], (out, err)
    assert "Traceback" not in err, err
    # heavy_mod ran once, in the parent: never in a worker
    assert [n for n in os.listdir(tmp_path) if n.startswith("imported-")] == [
        f"imported-{proc.pid}"
    ]
    pids = [int(x) for x in (tmp_path / "pids").read_text().split()]
    assert still_alive(pids) == []  # and interpreter exit stopped the warm pool


def test_the_warm_workers_of_a_sigkilled_parent_exit_within_seconds(tmp_path):
    proc = _script(tmp_path, "stay")
    try:
        assert proc.stdout is not None
        for _ in range(4):
            line = proc.stdout.readline()
        assert line == "idle\n", proc.stderr.read() if proc.stderr else ""
        pids = [int(x) for x in (tmp_path / "pids").read_text().split()]
        assert len(still_alive(pids, deadline=0)) == len(pids)  # warm while it waits
        proc.kill()
        assert proc.wait(5) == -signal.SIGKILL
        left = still_alive(pids)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
    assert left == []


def test_a_function_that_cannot_be_shipped_is_named_with_what_to_do():
    lock = threading.Lock()

    def locked(x: int) -> int:
        with lock:
            return x

    with pytest.raises(af.PipelineError) as info:
        af.range(3).map(locked, executor="process").to_list()
    msg = str(info.value)
    assert "'test_a_function_that_cannot_be_shipped_is_named_with_what_to_do.<locals>" in msg
    assert "locked'" in msg and "executor='thread'" in msg


# -- shared memory --------------------------------------------------------------------
def _shm() -> set[str]:
    return set(os.listdir("/dev/shm"))


def test_arrays_travel_without_named_segments_so_nothing_can_collide_or_leak():
    before = _shm()
    seen = set()
    p = af.range(12).map(fns.big_array, **PROCESS)
    for a in p:
        assert a.shape == (512, 1024)
        seen |= _shm() - before
    p.close()
    # (segments of other processes' runs on the machine are not ours)
    assert not {n for n in seen if n.startswith(f"aioflow{os.getpid()}")}


def test_kept_shared_memory_results_hold_no_descriptor_each():
    # a mapping made by mmap.mmap keeps a dup of its descriptor: 400 kept results of
    # 64 KiB under a limit of 256 open files failed with "Too many open files"
    code = (
        "import resource, sys\n"
        "import aioflow as af\n"
        "from tests.faults import _procfns as fns\n"
        "resource.setrlimit(resource.RLIMIT_NOFILE, (256, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))\n"
        "with af.range(400).map(fns.kib64, executor='process', concurrency=2) as p:\n"
        "    kept = p.to_list()\n"
        "    kept += p.batch(2).to_list()\n"
        "assert [int(a[0]) for a in kept[:400]] == list(range(400)), 'order'\n"
        "assert [b[:, 0].tolist() for b in kept[400:]] == [[i, i + 1] for i in range(0, 400, 2)]\n"
        "print('ok', len(kept))\n"
    )
    r = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert r.returncode == 0 and r.stdout.strip() == "ok 600", r.stderr[-3000:]


def test_twelve_threads_with_a_process_map_each_all_finish_their_epochs():
    results: list[object] = []

    def run() -> None:
        p = af.range(6).map(fns.big_array, executor="process", concurrency=1)
        try:
            for _ in range(2):
                results.append(sum(int(a[0, 0]) for a in p.iter(timeout=60)))
        except BaseException as e:  # pragma: no cover - reported below
            results.append(e)
        finally:
            p.close()

    threads = [threading.Thread(target=run) for _ in range(12)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert results == [15] * 24


def _mapped_shared_bytes() -> int:
    total = 0
    with open("/proc/self/maps") as f:
        for line in f:
            if "memfd:aioflow" in line or "/dev/shm/aioflow" in line:
                lo, hi = (int(x, 16) for x in line.split()[0].split("-"))
                total += hi - lo
    return total


def test_a_kept_result_pins_only_its_own_bytes():
    p = af.range(512).map(fns.mb_array, **PROCESS)  # 1 MiB each, many per batch
    kept = [a for i, a in enumerate(p) if i % 32 == 0]
    gc.collect()
    assert len(kept) == 16
    assert _mapped_shared_bytes() <= 16 * ((1 << 20) + 4096)
    del kept
    gc.collect()
    assert _mapped_shared_bytes() == 0
    p.close()


def _refuse(*args: object) -> None:
    raise RuntimeError("this item cannot be unpickled")


class LoadsBadly:
    def __reduce__(self) -> tuple[object, tuple[()]]:
        return (_refuse, ())


def _odd_item(i: int) -> object:
    if i == 10:
        return LoadsBadly()
    if i == 20:
        return threading.Lock()  # cannot be pickled here
    return i


def test_a_bad_item_fails_only_itself():
    p = af.range(64).map(_odd_item).map(fns.fail_at_7, **PROCESS, on_error="skip")
    with p.iter() as it:
        out = list(it)
        stats = it.stats()
    assert out == [i for i in range(64) if i not in (7, 10, 20)]
    assert stats["map(fail_at_7)"].errors_skipped == 3
    with pytest.raises(RuntimeError) as info:
        af.range(64).map(_odd_item).map(abs, **PROCESS).to_list()
    assert "cannot be unpickled" in str(info.value)
    assert any("at item 10" in n for n in info.value.__notes__)
    p.close()


def _hold_the_gil(a: np.ndarray) -> int:
    sum(range(20_000_000))  # one C call of a second or so: the GIL stays held throughout
    return int(a[0])


async def test_the_loop_stays_responsive_while_large_inputs_go_to_a_busy_worker():
    gaps = []

    async def tick() -> None:
        last = time.perf_counter()
        while True:
            await asyncio.sleep(0.01)
            now = time.perf_counter()
            gaps.append(now - last)
            last = now

    ticker = asyncio.create_task(tick())
    p = (
        af.range(12)
        .map(lambda i: np.full(1 << 19, i))
        .map(  # 4 MiB inputs
            _hold_the_gil, executor="process", concurrency=1
        )
    )
    try:
        assert [x async for x in p] == list(range(12))
    finally:
        ticker.cancel()
        await asyncio.gather(ticker, return_exceptions=True)
        p.close()
    assert max(gaps) < 1.0, max(gaps)  # a blocking send stalled it for seconds


# -- errors name their input ----------------------------------------------------------
def _load(path: str) -> str:
    if "bad" in path:
        raise ValueError("corrupt file")
    return path


@pytest.mark.parametrize("opts", [{}, {"executor": "thread", "concurrency": 2}, PROCESS])
def test_the_error_note_names_the_failing_input(opts):
    paths = [f"/data/shard-{i:03d}/img.npy" for i in range(50)]
    paths[17] = "/data/shard-017/bad.npy"
    p = af.from_iterable(paths).map(_load, **opts)
    with pytest.raises(ValueError) as info:
        p.to_list()
    note = [n for n in info.value.__notes__ if n.startswith("aioflow:")]
    assert note == [
        "aioflow: raised in stage 'map(_load)' at item 17, input '/data/shard-017/bad.npy'"
    ]
    p.close()


def test_the_note_of_a_huge_input_stays_short():
    with pytest.raises(ZeroDivisionError) as info:
        af.from_iterable(["x" * 10_000]).map(lambda s: 1 / 0).to_list()
    (note,) = info.value.__notes__
    assert len(note.split(", input ", 1)[1]) <= 80


def test_a_worker_traceback_shows_the_real_file_and_line():
    def explode(x: int) -> int:
        raise KeyError(x)  # the line the traceback must show

    p = af.range(2).map(explode, executor="process")
    with pytest.raises(KeyError) as info:
        p.to_list()
    remote = next(n for n in info.value.__notes__ if "remote traceback" in n)
    line = explode.__code__.co_firstlineno + 1
    assert f'File "{__file__}", line {line}, in explode' in remote, remote
    assert "raise KeyError(x)  # the line the traceback must show" in remote
    assert "<dynamic-code>" not in remote
    p.close()


def test_a_shipped_lru_cache_leaves_the_aioflow_package_out_of_the_worker(no_leaks):
    # a worker loads _process/worker.py alone: unpickling an lru_cache must not import the whole
    # package there (0.3-0.4 s more of a worker's start)
    ns: dict[str, object] = {"__name__": "__main__"}  # (shipped by value, as a script's)
    exec(
        "import functools, sys\n"
        "@functools.lru_cache(None)\n"
        "def zero():\n"
        "    return 0\n"
        "def loaded(x):\n"
        "    return zero() + ('aioflow' in sys.modules)\n",
        ns,
    )
    with af.range(3).map(ns["loaded"], executor="process", concurrency=1) as p:  # type: ignore[arg-type]
        assert p.to_list() == [0, 0, 0]


def test_a_batch_rebuilt_each_epoch_after_a_process_map_keeps_the_maps_warm_pool():
    # issue 27 (8): `batch` right after a process map makes a fused map node; rebuilt by a
    # loop that writes `base.batch(4)` each epoch, the pool must follow the user's map
    base = af.range(8).map(fns.slow_pid, **PROCESS)

    def pids() -> set[int]:
        return {int(pid) for _, ps in base.batch(4) for pid in ps}

    seen = pids()
    first = set(workers())  # (a worker that started late may have served no item yet)
    assert seen and seen <= first
    assert pids() <= first and pids() <= first  # the same workers each epoch
    base.close()  # the user's pipeline closes the pool its batches used
    assert still_alive(first) == []
