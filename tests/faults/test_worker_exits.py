"""A process map in a program that ends abruptly, run as a real subprocess: Ctrl-C in a
sync ``for`` loop, the interpreter exiting mid-run, the parent SIGKILLed.

Each worker of the program drops a file named after its pid into a directory the test
watches, so the test knows the workers' pids without asking the program; every worker
must be gone within seconds of the program's end, however it ended.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import psutil
import pytest

from tests.faults.test_interrupts import SIGINT_AS_IN_A_TERMINAL

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

#: The program's prologue: ``work`` marks its worker, then runs for ``SECONDS`` a call.
PROLOGUE = """
import asyncio, os, sys, time
import aioflow as af

MARKS, SECONDS = sys.argv[1], float(sys.argv[2])

def work(x):
    mark = os.path.join(MARKS, str(os.getpid()))
    if not os.path.exists(mark):
        open(mark, "w").close()
    time.sleep(SECONDS if x > 0 else 0.005)
    return x

p = af.range(10**9).map(work, executor="process", concurrency=2)

def worker_pids():  # the pool's worker processes (both start with it): forked, or spawned
    import psutil
    from aioflow._process import forks
    server = forks.server_pid()
    kids = psutil.Process().children(recursive=True)
    return [c.pid for c in kids if c.ppid() == server and c.status() != "zombie"
            or c.pid != server and "_process/worker.py" in " ".join(c.cmdline())]
"""

BUSY, HUNG = 0.005, 3600.0  # seconds a call takes after the first item


def _spawn(code: str, marks: Path, seconds: float) -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONPATH": ROOT + os.pathsep + os.environ.get("PYTHONPATH", "")}
    env.pop("PYTHONFAULTHANDLER", None)
    program = SIGINT_AS_IN_A_TERMINAL + PROLOGUE + textwrap.dedent(code)
    return subprocess.Popen(
        [sys.executable, "-c", program, str(marks), str(seconds)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        cwd=ROOT,
        start_new_session=True,  # its own process group, as a program run from a shell
    )


def _worker_pids(proc: subprocess.Popen[str], marks: Path, deadline: float = 10.0) -> list[int]:
    """The pids of the program's two workers, once both have started a call."""
    end = time.monotonic() + deadline
    while len(pids := [int(n) for n in os.listdir(marks)]) < 2:
        if proc.poll() is not None or time.monotonic() > end:
            proc.kill()
            raise AssertionError(f"workers did not start: {proc.communicate()}")
        time.sleep(0.02)
    return pids


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def still_alive(pids: list[int], deadline: float = 5.0) -> list[int]:
    end = time.monotonic() + deadline
    while True:
        left = [pid for pid in pids if _alive(pid)]
        if not left or time.monotonic() > end:
            return left
        time.sleep(0.02)


def _finish(proc: subprocess.Popen[str], deadline: float) -> tuple[str, str, float]:
    t0 = time.monotonic()
    try:
        out, err = proc.communicate(timeout=deadline + 5)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
    return out, err, time.monotonic() - t0


# -- Ctrl-C ---------------------------------------------------------------------------
@pytest.mark.parametrize(
    "seconds, group",
    [(BUSY, False), (BUSY, True), (HUNG, True)],
    ids=["busy-sigint-to-the-parent", "busy-ctrl-c-to-the-group", "hung-ctrl-c-to-the-group"],
)
def test_ctrl_c_in_a_sync_for_over_a_process_map_exits_promptly_with_one_traceback(
    tmp_path, seconds, group
):
    proc = _spawn(
        """
        for x in p:
            time.sleep(0.001)
        """,
        tmp_path,
        seconds,
    )
    pids = _worker_pids(proc, tmp_path)
    time.sleep(0.2)
    if group:  # what a terminal does: the whole foreground group gets SIGINT
        os.killpg(proc.pid, signal.SIGINT)
    else:
        proc.send_signal(signal.SIGINT)
    _, err, took = _finish(proc, 5)
    assert took < 5, err
    assert proc.returncode != 0
    assert err.count("Traceback") == 1, err
    assert err.rstrip().endswith("KeyboardInterrupt"), err
    assert still_alive(pids) == []


# -- the interpreter exiting mid-run --------------------------------------------------
# Each program stops reading after its first item and exits once a worker is in a call
# (with fast calls a full window may stop the pool before the second worker gets one),
# printing the pids of both workers from the process table.
EXITS = {
    "sync-generator": """
        it = iter(p)
        next(it)
        while not os.listdir(MARKS) or len(worker_pids()) < 2:
            time.sleep(0.01)
        print(*worker_pids())
        """,
    "sync-iterator": """
        it = p.iter()
        next(it)
        while not os.listdir(MARKS) or len(worker_pids()) < 2:
            time.sleep(0.01)
        print(*worker_pids())
        """,
    "async-iterator": """
        async def main():
            global keep
            keep = p.aiter()  # still referenced when the loop ends
            await anext(keep)
            while not os.listdir(MARKS) or len(worker_pids()) < 2:
                await asyncio.sleep(0.01)  # (the loop drives the pool: never block it)
            print(*worker_pids())

        asyncio.run(main())
        """,
}


@pytest.mark.parametrize("seconds", [BUSY, HUNG], ids=["busy", "hung"])
@pytest.mark.parametrize("code", EXITS.values(), ids=EXITS.keys())
def test_the_interpreter_exiting_mid_process_map_neither_hangs_nor_prints_noise(
    tmp_path, code, seconds
):
    proc = _spawn(textwrap.dedent(code) + 'print("ready", flush=True)\n', tmp_path, seconds)
    out, err, took = _finish(proc, 10)
    assert took < 10, err
    pids_line, ready = out.splitlines()
    assert ready == "ready"
    assert proc.returncode == 0, err
    assert err == "", err
    pids = [int(n) for n in pids_line.split()]
    assert len(pids) == 2 and set(map(int, os.listdir(tmp_path))) <= set(pids)
    assert still_alive(pids) == []


# -- the parent killed ----------------------------------------------------------------
@pytest.mark.parametrize("seconds", [BUSY, HUNG], ids=["busy", "hung"])
def test_the_workers_of_a_sigkilled_parent_exit_within_seconds(tmp_path, seconds):
    proc = _spawn(
        """
        for x in p:
            pass
        """,
        tmp_path,
        seconds,
    )
    pids = _worker_pids(proc, tmp_path)
    # and the multiprocessing services it started (fork server, resource tracker)
    rest = [c.pid for c in psutil.Process(proc.pid).children(recursive=True) if c.pid not in pids]
    proc.kill()  # the parent only: nothing of it runs any more, no cleanup at all
    try:
        assert proc.wait(5) == -signal.SIGKILL
        left = still_alive(pids)
        services_left = still_alive(rest)
    finally:  # (not communicate(): the workers hold the pipes while they live)
        for pid in still_alive(pids + rest, deadline=0):
            os.kill(pid, signal.SIGKILL)
        proc.stdout.close()  # type: ignore[union-attr]
        proc.stderr.close()  # type: ignore[union-attr]
    assert left == []
    assert services_left == []
