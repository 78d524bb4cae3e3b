"""The user's program forks while a process pool is warm (issue 27, point 3).

A forked child gets a copy of the parent's memory and descriptors: the results it holds
must behave as private memory (a write in one process is not seen by the other), the
sockets of the parent's workers must not keep those workers alive once the parent closes
its pool, and the child must neither manage the parent's workers nor be kept from using
aioflow itself. Every scenario runs under the fault guard.
"""

from __future__ import annotations

import ctypes
import json
import os
import subprocess
import sys
import time
import traceback
import warnings
from collections.abc import Callable
from pathlib import Path

import aioflow as af
from tests.faults import _procfns as fns
from tests.faults.test_workers import still_alive

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
HANG = 2.0  # s: a close that takes this long waited for a child (a hang check, not a bench)


def _fork(child: Callable[[], int]) -> int:
    """Fork; the child runs ``child`` and leaves with its code, never back into pytest."""
    with warnings.catch_warnings():  # (3.12+: "multi-threaded": numpy's BLAS threads)
        warnings.simplefilter("ignore", DeprecationWarning)
        pid = os.fork()
    if pid == 0:  # pragma: no cover - the child's coverage is not collected
        code = 70
        try:
            code = child()
        except BaseException:
            traceback.print_exc()
        finally:
            os._exit(code)
    return pid


def _exit_code(pid: int) -> int:
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status)


def _pids(p: af.Pipeline) -> set[int]:
    return {pid for _, pid in p.to_list()}


def test_results_written_after_a_fork_stay_private_to_each_process():
    p = af.range(4).map(fns.big_array, executor="process", concurrency=2)  # shared memory
    kept = p.to_list()
    with af.range(2).map(fns.big_array, executor="process").batch(2) as q:
        (batch,) = q.to_list()  # stacked in the worker: one memfd, no copy here
    a = kept[3]  # 4 MiB of 3s, mapped from the worker's memfd
    to_parent, from_child = os.pipe()
    from_parent, to_child = os.pipe()

    def child() -> int:
        a[100:] = -1  # the child's own copy
        batch[:] = -1
        os.write(from_child, b"w")
        os.read(from_parent, 1)  # the parent has written a[0, 50] meanwhile
        return 0 if a[0, 50] == 3 and (a[100:] == -1).all() else 1

    pid = _fork(child)
    try:
        assert os.read(to_parent, 1) == b"w"
        rows = batch[:, 1:]  # (row 0 holds the worker's pid)
        seen = (int(a[100:].min()), int(a[100:].max()), int(rows.min()), int(rows.max()))
        a[0, 50] = 7  # the parent's write: the child must not see it
        os.write(to_child, b"c")
    finally:
        code = _exit_code(pid)
        for fd in (to_parent, from_child, from_parent, to_child):
            os.close(fd)
        p.close()
    assert seen == (3, 3, 0, 1)  # the child's writes did not reach the parent's arrays
    assert code == 0  # nor the parent's the child's
    assert a[0, 50] == 7 and int(kept[2].min()) == 2


def _hold(fd: int) -> Callable[[], int]:
    def child() -> int:
        os.read(fd, 1)  # holds every descriptor it was born with until told to go
        return 0

    return child


def _close_with_a_child_alive(fork: Callable[[Callable[[], int]], int]) -> tuple[float, list[int]]:
    p = af.range(8).map(fns.slow_pid, executor="process", concurrency=4)
    pids = _pids(p)
    r, w = os.pipe()
    pid = fork(_hold(r))
    try:
        t0 = time.monotonic()
        p.close()
        took = time.monotonic() - t0
        left = still_alive(pids, deadline=0)
    finally:
        os.write(w, b"x")
        code = _exit_code(pid)
        os.close(r)
        os.close(w)
    assert code == 0
    return took, left


def test_closing_a_pool_while_a_forked_child_lives_ends_its_workers_at_once():
    took, left = _close_with_a_child_alive(_fork)
    assert left == []
    assert took < HANG, f"close took {took:.1f} s: it waited for end-of-file the child held"


def _raw_fork(child: Callable[[], int]) -> int:
    """``fork(2)`` called from C, as an extension does: no ``os.register_at_fork`` hook
    runs in the child (PyDLL: the call keeps the GIL, so the child has it)."""
    pid = ctypes.PyDLL(None).fork()
    if pid == 0:  # pragma: no cover
        os._exit(child())
    return int(pid)


def test_a_child_forked_behind_pythons_back_does_not_keep_the_workers_alive():
    took, left = _close_with_a_child_alive(_raw_fork)
    assert left == []
    assert took < HANG, f"close took {took:.1f} s: it waited for end-of-file the child held"


def test_a_child_forked_behind_pythons_back_closing_the_pipeline_leaves_the_workers_be():
    p = af.range(8).map(fns.slow_pid, executor="process", concurrency=2)
    pids = _pids(p)

    def child() -> int:
        p.close()  # the parent's pool, copied without the fork hook: forgotten, not closed
        return 0

    code = _exit_code(_raw_fork(child))
    again = _pids(p)
    p.close()
    assert code == 0
    assert again <= pids  # the parent's pool stayed warm
    assert still_alive(pids) == []


def test_a_forked_child_uses_aioflow_with_pools_of_its_own_and_leaves_the_parents_alone():
    p = af.range(6).map(fns.slow_pid, executor="process", concurrency=2)
    parents = _pids(p)
    r, w = os.pipe()

    def child() -> int:
        mine = _pids(p)  # the parent's pipeline: a fresh pool of the child's own
        with af.range(4).map(fns.slow_pid, executor="process", concurrency=2) as q:
            other = _pids(q)
        p.close()
        os.write(w, json.dumps([sorted(mine), sorted(other)]).encode())
        return 0

    pid = _fork(child)
    try:
        code = _exit_code(pid)
        mine, other = json.loads(os.read(r, 1 << 16))
    finally:
        os.close(r)
        os.close(w)
    assert code == 0
    assert mine and other and not (set(mine) | set(other)) & parents
    assert still_alive(mine + other) == []  # the child's pools ended with it
    again = _pids(p)  # the parent's pool is still warm: the child left its workers be
    p.close()
    assert again <= parents
    assert still_alive(parents) == []


def test_a_fork_in_the_middle_of_an_epoch_leaves_the_parents_epoch_whole():
    p = af.range(40).map(fns.slow_pid, executor="process", concurrency=2)
    got, children = [], []
    for i, (x, _) in enumerate(p):
        got.append(x)
        if i in (3, 20):
            children.append(_fork(lambda: 0 if af.range(3).map(abs).to_list() == [0, 1, 2] else 1))
    assert [_exit_code(pid) for pid in children] == [0, 0]
    assert got == list(range(40))
    p.close()


# -- a real program: os.fork and multiprocessing's fork, children exiting normally ----
SCRIPT = """
import json, multiprocessing as mp, os, sys, time
import numpy as np
import psutil
import aioflow as af

def where(x):
    time.sleep(0.02)
    return os.getpid()

def image(x):
    return np.full(1 << 17, x)

def child_work(conn):
    with af.range(4).map(where, executor="process", concurrency=2) as q:
        conn.send(sorted(set(q.to_list())))
    kept[1][:] = -1

p = af.range(6).map(where, executor="process", concurrency=2)
p.to_list()
first = {c.pid for c in psutil.Process().children(recursive=True)}  # the workers
kept = af.range(2).map(image, executor="process").to_list()
r, w = os.pipe()
pid = os.fork()
if pid == 0:
    got = set(p.to_list())  # a fresh pool of the child's own, closed at its exit
    kept[0][:] = -1
    os.write(w, json.dumps(sorted(got)).encode())
    sys.exit(0)  # the interpreter's exit: atexit, finalizers, must not touch the parent's
_, status = os.waitpid(pid, 0)
forked = json.loads(os.read(r, 1 << 16))
ctx = mp.get_context("fork")
a, b = ctx.Pipe()
proc = ctx.Process(target=child_work, args=(b,))
proc.start()
spawned = a.recv()
proc.join(30)
again = set(p.to_list())
t0 = time.monotonic()
p.close()
print(json.dumps({
    "codes": [status, proc.exitcode], "warm": again <= first,
    "kept": [int(kept[0].min()), int(kept[1].min())], "close": time.monotonic() - t0,
    "pids": sorted(first) + forked + spawned, "theirs": forked + spawned,
    "mine": sorted(first),
}))
"""


def test_a_program_forking_with_os_fork_and_multiprocessing(tmp_path: Path):
    (tmp_path / "train.py").write_text(SCRIPT)
    proc = subprocess.run(
        [sys.executable, str(tmp_path / "train.py")],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": ROOT},
        cwd=tmp_path,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    assert "Traceback" not in proc.stderr, proc.stderr
    out = json.loads(proc.stdout)
    assert out["codes"] == [0, 0]  # both children exited cleanly
    assert out["warm"]  # and left the parent's workers be
    assert out["theirs"] and not set(out["theirs"]) & set(out["mine"])
    assert out["kept"] == [0, 1]  # their writes did not reach the parent's results
    assert out["close"] < HANG, out
    assert still_alive(out["pids"]) == []
