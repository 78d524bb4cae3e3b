"""The worker side of a ``"process"`` map: the loop that runs in each child process.

One socket per worker carries pickled messages:

- parent -> worker: ``(task_id, fn_id, fn_bytes or None, items_bytes)``; the function is
  sent (cloudpickled) with the first task that needs it, then cached by ``fn_id``.
- worker -> parent: a header ``(task_id, seconds, shm_name, sizes)`` then the results,
  a list with one entry per item: the value, or a ``Failure``. They are pickled with
  protocol 5: buffers of ``OOB_MIN`` bytes or more (numpy arrays) travel out of band in
  one shared-memory segment per message, which the parent unlinks as soon as it maps it.

A reader thread takes tasks off the socket, so a parent's send never waits for a busy
worker; when the socket reaches end-of-file (the parent closed it, or died, even by
SIGKILL) the reader ends the process at once. Workers ignore SIGINT: Ctrl-C is the
parent's business.
"""

from __future__ import annotations

import itertools
import mmap
import os
import pickle
import queue
import signal
import threading
import time
import traceback
from collections.abc import Callable
from multiprocessing.connection import Connection
from typing import Any

import cloudpickle

try:
    import _posixshmem
except ImportError:  # pragma: no cover - Windows: results always travel in the pickle
    _posixshmem = None

__all__ = ["OOB_MIN", "Failure", "main", "open_shm", "shm_dir_names", "unlink_shm"]

#: Buffers this large or larger travel through shared memory instead of the socket.
OOB_MIN = 16 * 1024
#: A failure that could not be sent back is described by this header line.
_UNSENDABLE = "could not be sent back from the worker process"


class Failure:
    """One item's call failed: the exception itself, or why it could not be sent back."""

    __slots__ = ("exc", "why")

    def __init__(self, exc: BaseException | None, why: str | None = None) -> None:
        self.exc = exc
        self.why = why

    def __reduce__(self) -> Any:
        return (Failure, (self.exc, self.why))


def main(conn: Connection, shm_prefix: str) -> None:
    """The worker process: run tasks until the parent closes the socket."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    tasks: queue.SimpleQueue[Any] = queue.SimpleQueue()
    threading.Thread(target=_read, args=(conn, tasks), name="aioflow-read", daemon=True).start()
    fns: dict[int, Callable[[Any], Any]] = {}
    seq = itertools.count()
    try:
        conn.send_bytes(b"ready")
    except OSError:  # the pool closed before this worker was up
        os._exit(0)
    while True:
        msg = tasks.get()
        task_id, fn_id, fn_bytes, items_bytes = msg
        t0 = time.perf_counter()
        try:
            fn = fns.get(fn_id)
            if fn is None:
                fn = fns[fn_id] = cloudpickle.loads(fn_bytes)
            items = pickle.loads(items_bytes)
        except Exception as e:
            out: list[Any] = [_failure(e, "loading the function or the items in the worker")]
        else:
            out = []
            for x in items:
                try:
                    out.append(fn(x))
                except Exception as e:
                    out.append(_failure(e))
        dt = time.perf_counter() - t0
        name = f"{shm_prefix}_{os.getpid()}_{next(seq)}"
        header, payload = _pack(task_id, dt, out, name)
        try:
            conn.send_bytes(header)
            conn.send_bytes(payload)
        except OSError:  # the parent is gone or closed the pool mid-task
            unlink_shm(name)
            os._exit(0)


def _read(conn: Connection, tasks: queue.SimpleQueue[Any]) -> None:
    try:
        while True:
            tasks.put(pickle.loads(conn.recv_bytes()))
    except (EOFError, OSError):
        # the parent closed the socket or died: a busy worker must not outlive it
        os._exit(0)


def _failure(exc: BaseException, doing: str | None = None) -> Failure:
    """The exception, with its traceback as a note, if it survives a pickle round trip."""
    tb = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    where = f" while {doing}" if doing else ""
    note = f"remote traceback (aioflow worker process {os.getpid()}{where}):\n{tb}"
    try:
        exc.add_note(note)
        pickle.loads(cloudpickle.dumps(exc))
    except Exception as e:
        return Failure(None, f"{type(exc).__qualname__}: {exc} ({_UNSENDABLE}: {e!r})\n{note}")
    return Failure(exc)


def _pack(task_id: int, dt: float, out: list[Any], shm_name: str) -> tuple[bytes, bytes]:
    """Pickle the results; large buffers go out of band into one shared-memory segment."""
    bufs: list[pickle.PickleBuffer] = []

    def out_of_band(pb: pickle.PickleBuffer) -> bool:
        if _posixshmem is None or pb.raw().nbytes < OOB_MIN:
            return True  # in band
        bufs.append(pb)
        return False

    try:
        payload = cloudpickle.dumps(out, protocol=5, buffer_callback=out_of_band)
    except Exception:
        bufs.clear()
        out = [_sendable(y) for y in out]
        payload = cloudpickle.dumps(out, protocol=5, buffer_callback=out_of_band)
    sizes = [pb.raw().nbytes for pb in bufs]
    if bufs:
        try:
            _to_shm(shm_name, bufs, sum(sizes))
        except OSError:  # no room in /dev/shm: send everything through the socket
            bufs.clear()
            sizes = []
            payload = cloudpickle.dumps(out, protocol=5)
    header = pickle.dumps((task_id, dt, shm_name if bufs else None, sizes))
    return header, payload


def _sendable(y: Any) -> Any:
    try:
        cloudpickle.dumps(y, protocol=5)
    except Exception as e:
        return Failure(None, f"the result, a {type(y).__qualname__}, {_UNSENDABLE}: {e!r}")
    return y


def _to_shm(name: str, bufs: list[pickle.PickleBuffer], total: int) -> None:
    assert _posixshmem is not None
    fd = _posixshmem.shm_open("/" + name, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
    try:
        if hasattr(os, "posix_fallocate"):
            os.posix_fallocate(fd, 0, total)  # ENOSPC now rather than SIGBUS on write
        else:  # pragma: no cover - macOS
            os.ftruncate(fd, total)
        with mmap.mmap(fd, total) as m:
            off = 0
            for pb in bufs:
                raw = pb.raw()
                m[off : off + raw.nbytes] = raw
                off += raw.nbytes
    except BaseException:
        _posixshmem.shm_unlink("/" + name)
        raise
    finally:
        os.close(fd)


def open_shm(name: str, sizes: list[int]) -> list[memoryview]:
    """(Parent side) map a result segment, unlink it at once, and split it into buffers."""
    assert _posixshmem is not None
    fd = _posixshmem.shm_open("/" + name, os.O_RDWR, 0o600)
    try:
        _posixshmem.shm_unlink("/" + name)
        m = mmap.mmap(fd, sum(sizes))
    finally:
        os.close(fd)
    view = memoryview(m)
    out = []
    off = 0
    for n in sizes:
        out.append(view[off : off + n])
        off += n
    return out


def shm_dir_names(prefix: str) -> list[str]:
    """Names of the segments in /dev/shm that start with ``prefix`` (Linux; else [])."""
    try:
        return [n for n in os.listdir("/dev/shm") if n.startswith(prefix)]
    except OSError:  # pragma: no cover - no /dev/shm
        return []


def unlink_shm(name: str) -> None:
    if _posixshmem is not None:
        try:
            _posixshmem.shm_unlink("/" + name)
        except FileNotFoundError:
            pass
