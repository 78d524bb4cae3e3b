"""The worker process of a ``"process"`` map.

A worker is a fresh interpreter (``python -c``) that loads ``_process/wire.py``,
``_process/columns.py`` and this file alone, without the ``aioflow`` package and without the
user's ``__main__``: it never re-runs the user's script. It speaks ``_process/wire`` on one Unix
socket:

- parent -> worker: first ``("init", sys_path)``, then tasks
  ``(task_id, fn_id, fn or None, batch, entries, stack)``; the function (cloudpickled,
  with its name and the source lines of files the worker may lack) is sent with the
  first task that needs it, or ahead of it as ``("fn", fn_id, fn)``, then cached by
  ``fn_id``.
- worker -> parent: ``b"ready"``, then per task ``(task_id, seconds, kind, payload)``.

A bad item fails only itself: when a batch cannot be pickled, or loaded in the worker
(``kind`` is then ``None``: "send them one by one"), its items travel as ``entries``,
each pickled on its own (``None`` for one the parent could not pickle); results the
same way (``kind`` "items"). With ``stack`` (a map before ``batch``), results that all
succeeded and stack go as columns (``kind`` "columns", see ``_process/columns``). A worker
computes its next batch while a writer thread sends the last one's results.

A reader thread takes tasks off the socket; when the socket reaches end-of-file (the
parent closed it, or died, even by SIGKILL) the reader ends the process at once.
Workers ignore SIGINT: Ctrl-C is the parent's business.
"""

from __future__ import annotations

import contextlib
import linecache
import os
import pickle
import queue
import signal
import socket
import sys
import threading
import time
import traceback
from collections import deque
from collections.abc import Callable
from typing import Any

import cloudpickle

from .columns import stack as stack_columns
from .wire import (
    SOCKET_BUFFER,
    Failure,
    Inbox,
    by_name_dumps,
    decode,
    encode,
    named,
    pack,
    send,
    unpack,
)

__all__ = ["failure_of", "main"]

#: A failure that could not be sent back is described by this header line.
_UNSENDABLE = "could not be sent back from the worker process"
#: Results are pickled by name unless a class in them came by value (``wire.named``),
#: which this pickle spots on its first instance; cloudpickle then sends them by value.
_dumps = by_name_dumps(named)


# -- functions shipped by value (``_ship.ship``) ----------------------------------------
def _load_fn(blob: bytes) -> Callable[[Any], Any]:
    data, lines, _ = pickle.loads(blob)
    for f, v in lines.items():  # a notebook cell's source: tracebacks show its lines
        linecache.cache[f] = (sum(map(len, v)), None, v, f)
    fn: Callable[[Any], Any] = pickle.loads(data)
    return fn


def _write(sock: socket.socket, out: queue.SimpleQueue[Any]) -> None:
    """Send the replies the worker queues, in order, while it computes the next ones."""
    while True:
        body, fds = out.get()
        try:
            send(sock, body, fds)
        except OSError:  # the parent is gone or closed the pool mid-task
            os._exit(0)


# -- the worker process ---------------------------------------------------------------
def main(fd: int) -> None:
    """The worker process: run tasks until the parent closes the socket."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    sock = socket.socket(fileno=fd)
    with contextlib.suppress(OSError):  # a batch's results fit: the worker seldom waits
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, SOCKET_BUFFER)
    tasks: queue.SimpleQueue[Any] = queue.SimpleQueue()
    replies: queue.SimpleQueue[Any] = queue.SimpleQueue()
    threading.Thread(target=_read, args=(sock, tasks), name="aioflow-read", daemon=True).start()
    fns: dict[int, Callable[[Any], Any] | Failure] = {}
    try:
        send(sock, [b"ready"], [])
    except OSError:  # the pool closed before this worker was up
        os._exit(0)
    threading.Thread(target=_write, args=(sock, replies), name="aioflow-write", daemon=True).start()
    while True:
        body, fds = tasks.get()
        msg = decode(body)
        if msg[0] == "init":
            sys.path[:] = msg[1]
            continue
        if msg[0] == "fn":  # sent ahead of the first task: loaded while the parent starts
            fns[msg[1]] = _load_or_fail(msg[2])
            continue
        task_id, fn_id, fn_blob, batch, entries, stack = msg
        fn = fns.get(fn_id)
        if fn is None:
            fn = fns[fn_id] = _load_or_fail(fn_blob)
        t0 = time.perf_counter()  # (loading the function is not the items' time)
        out_fds: list[int] = []
        if batch is not None:
            try:
                items = unpack(batch, fds)
            except Exception:  # some item cannot be loaded here: ask for them one by one
                reply: Any = (task_id, 0.0, None, None)
            else:
                ys = [_apply(fn, x) for x in items]
                reply = (task_id, *_results(ys, out_fds, t0, stack))
        else:
            # (None: an item the parent could not pickle, and has the error of)
            ys = [None if e is None else _apply(fn, _load(e, fds)) for e in entries]
            reply = (task_id, *_results(ys, out_fds, t0))
        while fds:
            os.close(fds.popleft())
        replies.put((encode(reply), out_fds))


def _load_or_fail(blob: bytes) -> Callable[[Any], Any] | Failure:
    try:
        return _load_fn(blob)
    except Exception as e:
        return failure_of(e, f"loading the function {pickle.loads(blob)[2]!r}")


def _load(entry: Any, fds: deque[int]) -> Any:
    """One item sent on its own, or the ``Failure`` of loading it."""
    try:
        return unpack(entry, fds)
    except Exception as e:  # (its descriptors are closed by now)
        return failure_of(e, "unpickling the item in the worker")


def _apply(fn: Callable[[Any], Any] | Failure, x: Any) -> Any:
    if type(fn) is Failure or type(x) is Failure:
        return fn if type(fn) is Failure else x
    try:
        return fn(x)  # type: ignore[operator]
    except Exception as e:
        return failure_of(e)
    except BaseException as e:
        # a CancelledError the function raised is its failure, sent back (the parent makes
        # it a StageError); asyncio is imported if it could raise one. Exits stay exits.
        cancelled = getattr(sys.modules.get("asyncio"), "CancelledError", None)
        if cancelled is not None and isinstance(e, cancelled):
            return failure_of(e)
        raise


def _results(
    ys: list[Any], fds: list[int], t0: float, stack: bool = False
) -> tuple[float, str, Any]:
    """(seconds, kind, payload): the results pickled at once (plain pickle, else
    cloudpickle: a class that came by value goes back by value), or one by one so that
    one that cannot be sent fails only itself; with ``stack``, stacked in columns first
    when they all succeeded and stack (``_process/columns``)."""
    stacked = _stacked(ys) if stack else None
    ways = [("batch", ys)] if stacked is None else [("columns", stacked), ("batch", ys)]
    for kind, value in ways:
        try:
            return time.perf_counter() - t0, kind, pack(value, fds, _dumps, cloudpickle.dumps)
        except Exception:
            pass
    return time.perf_counter() - t0, "items", [_pack_one(y, fds) for y in ys]


def _stacked(ys: list[Any]) -> Any:
    if any(type(y) is Failure for y in ys):
        return None
    try:
        return stack_columns(ys)
    except Exception:  # (an array numpy cannot stack: sent item by item)
        return None


def _pack_one(y: Any, fds: list[int]) -> Any:
    try:
        return pack(y, fds, cloudpickle.dumps)
    except Exception as e:
        why = f"the result, a {type(y).__qualname__}, {_UNSENDABLE}: {e!r}"
        return pack(Failure(None, why), fds, cloudpickle.dumps)


def _read(sock: socket.socket, tasks: queue.SimpleQueue[Any]) -> None:
    inbox = Inbox()
    try:
        while inbox.recv(sock):
            while (msg := inbox.pop()) is not None:
                tasks.put(msg)
    except OSError:
        pass
    # the parent closed the socket or died: a busy worker must not outlive it
    os._exit(0)


def failure_of(exc: BaseException, doing: str | None = None) -> Failure:
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
