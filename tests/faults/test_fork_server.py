"""Workers forked from a fork server, a copy of the program (issue 27, point 6).

A worker that starts as a fresh interpreter imports what its function needs (torch:
seconds) before its first call; forked from a copy of the program made when its first
pool started, it finds those libraries loaded. These scenarios check what the copy must
keep (libraries), what it must not (the program's own modules, numpy's random state,
the program's threads), and that nothing of it outlives the program.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import numpy as np

import aioflow as af
from tests.faults.test_workers import still_alive, workers

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _numpy_there(x: int) -> tuple[int, int]:
    return id(sys.modules.get("numpy")), os.getpid()


def test_workers_find_the_libraries_the_program_imported_before_its_first_pool():
    with af.range(4).map(_numpy_there, executor="process", concurrency=2) as p:
        got = p.to_list()
        pids = set(workers())
    assert {numpy_id for numpy_id, _ in got} == {id(np)}  # the program's numpy, not anew
    assert {pid for _, pid in got} <= pids
    assert still_alive(pids) == []


def _draw(x: int) -> tuple[int, int]:
    import time

    time.sleep(0.02)  # (one item per batch: both workers draw)
    return os.getpid(), int(np.random.randint(1 << 62))


def test_each_forked_worker_draws_its_own_numpy_random_numbers():
    np.random.seed(0)  # the program's state: a worker must not draw the same numbers
    with af.range(8).map(_draw, executor="process", concurrency=2) as p:
        got = p.to_list()
    by_worker: dict[int, set[int]] = {}
    for pid, n in got:
        by_worker.setdefault(pid, set()).add(n)
    assert len(by_worker) == 2
    first, second = by_worker.values()
    assert not first & second
    assert np.random.randint(1 << 62) == np.random.RandomState(0).randint(1 << 62)


SCRIPT = """
import json, os, sys, threading, time
import numpy as np
import aioflow as af
from aioflow._process import forks

def where(x):
    return os.getpid(), id(sys.modules.get("numpy"))

stop = threading.Event()
t = threading.Thread(target=stop.wait)
t.start()  # another thread: no fork of this process, fresh interpreters
with af.range(4).map(where, executor="process", concurrency=2) as p:
    threaded = p.to_list()
server_then = forks.server_pid()
stop.set()
t.join()
p = af.range(4).map(where, executor="process", concurrency=2)
alone = p.to_list()
print(json.dumps({
    "threaded": [n == id(np) for _, n in threaded], "alone": [n == id(np) for _, n in alone],
    "server_then": server_then, "server": forks.server_pid(),
    "pids": sorted({pid for pid, _ in alone}),
}), flush=True)
if sys.argv[1:] == ["stay"]:
    time.sleep(3600)
"""


def _run(*args: str, flags: tuple[str, ...] = ()) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, *flags, "-c", SCRIPT, *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": ROOT},
        start_new_session=True,
    )


def test_no_fork_while_the_program_runs_another_thread_then_a_server_once_alone():
    proc = _run()
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    got = json.loads(out)
    assert got["threaded"] == [False] * 4  # fresh interpreters
    assert got["server_then"] is None
    assert got["alone"] == [True] * 4 and got["server"] is not None
    assert still_alive([got["server"], *got["pids"]]) == []  # all gone with the program


def test_the_program_exits_with_the_server_socket_closed():
    """At exit the parent closes its end of the server's socket (the server then ends):
    CI's log ended with ``ResourceWarning: unclosed <socket ...>`` from the finalizer."""
    proc = _run(flags=("-X", "dev"))  # (dev mode shows ResourceWarnings)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    assert json.loads(out)["server"] is not None
    assert "ResourceWarning" not in err, err


def test_the_fork_server_and_its_workers_end_when_the_program_is_sigkilled():
    proc = _run("stay")
    try:
        assert proc.stdout is not None
        got = json.loads(proc.stdout.readline())
        everyone = [got["server"], *got["pids"]]
        assert len(still_alive(everyone, deadline=0)) == len(everyone)  # server, workers
        proc.kill()
        assert proc.wait(5) == -signal.SIGKILL
        left = still_alive(everyone)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
    assert left == []


def _program(script: str) -> dict:
    """Run ``script`` in a program of its own; the JSON it printed last."""
    run = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": ROOT},
        timeout=120,
    )
    assert run.returncode == 0, run.stderr
    return json.loads(run.stdout.strip().splitlines()[-1])


KILL_SCRIPT = """
import json, os, signal, sys, time
import psutil
import aioflow as af
from aioflow._process import forks

def pid(x):
    return os.getpid()

with af.range(4).map(pid, executor="process", concurrency=2) as p:
    p.to_list()
server = forks.server_pid()
os.kill(server, signal.SIGKILL)
with af.range(4).map(pid, executor="process", concurrency=2) as p:
    n = len(p.to_list())  # (a fresh interpreter, then forks of a new server)
    pids = sorted(set(p.to_list()))
print(json.dumps({"server": server, "n": n, "new": forks.server_pid(), "pids": pids,
                  "old_exists": psutil.pid_exists(server)}), flush=True)
"""


def test_a_killed_fork_server_is_reaped_and_replaced():
    # (in a program of its own: the server is only started while no other Python thread
    # runs, which a test process that ran other tests cannot promise)
    got = _program(KILL_SCRIPT)
    assert got["server"] is not None and got["n"] == 4
    assert got["new"] not in (None, got["server"])
    assert not got["old_exists"]  # reaped: not even a zombie is left
    assert still_alive(got["pids"]) == []


GONE_SCRIPT = """
import json, os, socket, time
import psutil
from aioflow._process import forks

ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
pid = os.fork()
if pid == 0:  # a server that has closed its socket but has not ended yet (as one being
    ours.close()  # killed: the kernel closes its files before it becomes a zombie)
    theirs.close()
    time.sleep(1.0)
    os._exit(0)
theirs.close()
ours.settimeout(30.0)
forks._server = (pid, ours)
a, b = socket.socketpair()
got = forks.fork_worker(a)  # the server is gone: None, and forgotten
time.sleep(1.5)  # (it has ended by now)
try:
    status = psutil.Process(pid).status()
except psutil.NoSuchProcess:
    status = None
print(json.dumps({"got": got, "server": forks.server_pid(), "status": status}), flush=True)
"""


def test_a_server_whose_socket_closed_before_it_ended_is_reaped():
    """fork_worker learns that the server is gone from its socket, which the kernel closes
    before the process is a zombie: a reap without waiting then found it running and left
    it, a zombie for the rest of the program (the killed-server test failed so in CI)."""
    got = _program(GONE_SCRIPT)
    assert got["got"] is None and got["server"] is None
    assert got["status"] is None  # reaped, not a zombie
