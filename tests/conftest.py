"""Shared fixtures: the event-loop matrix, the leak checks every fault test relies on, and
the columnar tests' `compact` matrix (the buffers as shipped, compacting, in a thread)."""

from __future__ import annotations

import asyncio
import gc
import os
import threading
import time
from collections.abc import Iterator

import psutil
import pytest

from aioflow._process import forks

try:
    import uvloop
except ImportError:  # pragma: no cover - uvloop is in the test extras
    uvloop = None


def _debug_loop() -> asyncio.AbstractEventLoop:
    loop = asyncio.new_event_loop()
    loop.set_debug(True)
    return loop


def pytest_asyncio_loop_factories(config: pytest.Config, item: pytest.Item) -> dict[str, object]:
    """Every async test runs on asyncio in debug mode and on uvloop."""
    factories: dict[str, object] = {"asyncio-debug": _debug_loop}
    if uvloop is not None:
        factories["uvloop"] = uvloop.new_event_loop
    return factories


def _forkserver_pid() -> int | None:
    try:
        from multiprocessing import forkserver

        return forkserver._forkserver._forkserver_pid  # type: ignore[attr-defined]
    except Exception:
        return None


def _resource_tracker_pid() -> int | None:
    try:
        from multiprocessing import resource_tracker

        return resource_tracker._resource_tracker._pid  # type: ignore[attr-defined]
    except Exception:
        return None


def _fds() -> dict[str, str]:
    out = {}
    for fd in os.listdir("/proc/self/fd"):
        try:
            out[fd] = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            pass
    return out


Snapshot = tuple[set[threading.Thread], set[int], dict[str, str]]


def _snapshot() -> Snapshot:
    proc = psutil.Process()
    return set(threading.enumerate()), {c.pid for c in proc.children(recursive=True)}, _fds()


def _leaks(before: Snapshot) -> list[str]:
    threads0, children0, fds0 = before
    proc = psutil.Process()
    service = {_forkserver_pid(), _resource_tracker_pid(), forks.server_pid()}
    extra_threads = [t.name for t in threading.enumerate() if t not in threads0 and t.is_alive()]
    extra_children = []
    for c in proc.children(recursive=True):
        if c.pid in children0 or c.pid in service:
            continue
        try:
            if c.status() == psutil.STATUS_ZOMBIE:
                continue
            if c.ppid() in service:  # e.g. a worker of a still-running forkserver child
                extra_children.append(f"{c.pid} (child of a multiprocessing service)")
                continue
        except psutil.NoSuchProcess:
            continue
        extra_children.append(str(c.pid))
    out = []
    if extra_threads:
        out.append(f"threads left: {extra_threads}")
    if extra_children:
        out.append(f"child processes left: {extra_children}")
    fds = _fds()
    new = {fd: target for fd, target in fds.items() if fds0.get(fd) != target}
    if len(fds) > len(fds0):
        out.append(f"open fds grew from {len(fds0)} to {len(fds)}: new {new}")
    return out


def wait_no_leaks(before: Snapshot, deadline: float = 5.0) -> None:
    """Assert that within ``deadline`` s no thread, child process or fd of a run remains."""
    end = time.monotonic() + deadline
    while True:
        gc.collect()
        leaks = _leaks(before)
        if not leaks:
            return
        if time.monotonic() > end:
            raise AssertionError("; ".join(leaks))
        time.sleep(0.02)


@pytest.fixture
def no_leaks() -> Iterator[None]:
    """After the test: no thread, child process or file descriptor of its runs remains."""
    before = _snapshot()
    yield
    wait_no_leaks(before)


@pytest.fixture
def held_logs(monkeypatch: pytest.MonkeyPatch) -> list[object]:
    """The ``HeldLog``s (the logs of the stages that hold items) made during the test."""
    from aioflow._state.held import HeldLog

    logs: list[object] = []
    init = HeldLog.__init__

    def record(self: HeldLog, *a: object, **k: object) -> None:
        init(self, *a, **k)  # type: ignore[arg-type]
        logs.append(self)

    monkeypatch.setattr(HeldLog, "__init__", record)
    return logs


async def assert_no_pending_tasks(deadline: float = 2.0) -> None:
    """In an async test: every task but the test's own is done within ``deadline`` s."""
    me = asyncio.current_task()
    end = time.monotonic() + deadline
    while True:
        others = [t for t in asyncio.all_tasks() if t is not me and not t.done()]
        if not others:
            return
        if time.monotonic() > end:
            raise AssertionError(f"tasks still pending: {others}")
        await asyncio.sleep(0.01)


@pytest.fixture(scope="session", autouse=True)
def _warm_up_event_loops() -> None:
    """Process-wide things opened on first use belong before any baseline: uvloop's
    (libuv's) pipe, and multiprocessing's resource tracker with its pipe (aioflow's own
    workers do not use multiprocessing, but Dask's nanny does when it starts a worker)."""
    from multiprocessing import resource_tracker

    import aioflow as af

    assert af.range(1).to_list() == [0]
    with af.range(2).map(abs, executor="process") as p:
        assert p.to_list() == [0, 1]
    resource_tracker.ensure_running()
    if uvloop is not None:
        loop = uvloop.new_event_loop()
        loop.run_until_complete(asyncio.sleep(0))
        loop.close()


# -- a real S3 API (moto's server): tests/_s3_server.py --------------------------------
@pytest.fixture(scope="session")
def _s3_server() -> Iterator[object]:
    pytest.importorskip("moto.server", reason="moto[server] is not installed")
    pytest.importorskip("s3fs", reason="s3fs is not installed")
    from _s3_server import S3Server

    server = S3Server()
    server.start()
    yield server
    server.stop()


@pytest.fixture
def s3(_s3_server, monkeypatch: pytest.MonkeyPatch) -> Iterator[object]:
    """The session's moto S3 server, aioflow pointed at it, an empty bucket ``BUCKET``."""
    from _s3_server import BUCKET

    server = _s3_server
    with server.configured(monkeypatch):
        c = server.client()
        c.create_bucket(Bucket=BUCKET)
        server.requests.clear()
        yield server
        server.hold = None
        for obj in c.list_objects_v2(Bucket=BUCKET).get("Contents", []):
            c.delete_object(Bucket=BUCKET, Key=obj["Key"])
        c.delete_bucket(Bucket=BUCKET)


@pytest.fixture
def own_s3(monkeypatch):
    """A moto server of this test alone (it may stop it), configured as ``s3``."""
    pytest.importorskip("moto.server", reason="moto[server] is not installed")
    from _s3_server import BUCKET, S3Server

    server = S3Server()
    server.start()
    try:
        with server.configured(monkeypatch):
            server.client().create_bucket(Bucket=BUCKET)
            yield server
    finally:
        server.stop()
        # moto's state is the process's, shared by every server: forget what this one made
        server.reset_state()


@pytest.fixture(params=["as shipped", "compacting at every batch", "every batch in a thread"])
def compact(request, monkeypatch):
    """The columnar buffers as shipped, or dropping dead rows and merging segments always,
    or every batch taken in a thread of the run (as large ones are), read ahead."""
    if request.param == "every batch in a thread":
        from aioflow.ops import event_time

        monkeypatch.setattr(event_time, "THREAD_ROWS", 0)
    elif request.param != "as shipped":
        from aioflow.ops.columnar_held import SessionRows
        from aioflow.ops.columnar_rows import Rows
        from aioflow.ops.columnar_sessions import ColSessions

        monkeypatch.setattr(ColSessions, "COMPACT", 0)
        monkeypatch.setattr(Rows, "SEGS", 1)
        monkeypatch.setattr(SessionRows, "BLOCKS", 1)
        monkeypatch.setattr(SessionRows, "SLACK", 0)
