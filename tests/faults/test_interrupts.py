"""Ctrl-C in a sync loop, and the interpreter exiting mid-run, as real subprocesses."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import psutil
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


#: A program run from a shell has Ctrl-C's default handler; a test runner started in the
#: background of a non-interactive shell ignores SIGINT, and a child inherits that (so it
#: would never see its Ctrl-C): each child starts from the default, as from a terminal.
SIGINT_AS_IN_A_TERMINAL = (
    "import signal; signal.signal(signal.SIGINT, signal.default_int_handler)\n"
)


def _spawn(code: str) -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONPATH": ROOT + os.pathsep + os.environ.get("PYTHONPATH", "")}
    return subprocess.Popen(
        [sys.executable, "-c", SIGINT_AS_IN_A_TERMINAL + textwrap.dedent(code)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        cwd=ROOT,
    )


def _wait_ready(proc: subprocess.Popen[str]) -> list[int]:
    assert proc.stdout is not None
    line = proc.stdout.readline()
    assert line.startswith("ready"), (line, proc.stderr.read() if proc.stderr else "")
    return [c.pid for c in psutil.Process(proc.pid).children(recursive=True)]


@pytest.mark.parametrize(
    "pipeline",
    [
        "af.range(10**9).map(lambda x: x).prefetch(4)",
        "af.range(10**9).map(lambda x: time.sleep(0.001) or x, executor='thread', concurrency=4)",
    ],
    ids=["inline", "thread-map"],
)
def test_ctrl_c_in_a_sync_for_loop_exits_promptly_with_one_traceback(pipeline):
    proc = _spawn(
        f"""
        import time
        import aioflow as af
        p = {pipeline}
        for i, x in enumerate(p):
            if i == 10:
                print("ready", flush=True)
            time.sleep(0.001)
        """
    )
    children = _wait_ready(proc)
    time.sleep(0.2)
    t0 = time.monotonic()
    proc.send_signal(signal.SIGINT)
    try:
        _, err = proc.communicate(timeout=10)
    finally:
        proc.kill()
    assert time.monotonic() - t0 < 5
    assert proc.returncode != 0
    assert err.count("Traceback") == 1, err
    assert "KeyboardInterrupt" in err
    for pid in children:
        assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE


@pytest.mark.parametrize(
    "code",
    [
        """
        import aioflow as af
        it = iter(af.range(10**9).map(lambda x: x).prefetch(4))
        next(it)
        print("ready", flush=True)
        """,
        """
        import aioflow as af
        it = af.range(10**9).map(lambda x: x, executor="thread", concurrency=2).iter()
        next(it)
        print("ready", flush=True)
        """,
        """
        import asyncio
        import aioflow as af

        async def main():
            it = af.range(10**9).map(lambda x: x).prefetch(4).aiter()
            await anext(it)
            print("ready", flush=True)
            global keep
            keep = it  # still referenced when the loop ends

        asyncio.run(main())
        """,
    ],
    ids=["sync-generator", "sync-iterator-thread-map", "async-iterator"],
)
def test_the_interpreter_exiting_mid_run_neither_hangs_nor_prints_noise(code):
    proc = _spawn(code)
    t0 = time.monotonic()
    try:
        out, err = proc.communicate(timeout=15)
    finally:
        proc.kill()
    assert time.monotonic() - t0 < 10
    assert out.startswith("ready")
    assert proc.returncode == 0, err
    assert err == "", err
