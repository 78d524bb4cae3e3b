"""The worker side of a ``"process"`` map, and the wire both sides speak.

A worker is a fresh interpreter (``python -c``) that loads this file alone, without
the ``aioflow`` package and without the user's ``__main__``: it never re-runs the user's
script. One Unix socket per worker carries framed messages, each with the file
descriptors it passes along (``SCM_RIGHTS``):

- parent -> worker: first ``("init", sys_path)``, then tasks
  ``(task_id, fn_id, fn or None, batch, entries)``; the function (cloudpickled, with its
  name and the source lines of files the worker may lack) is sent with the first task
  that needs it, or ahead of it as ``("fn", fn_id, fn)``, then cached by ``fn_id``.
- worker -> parent: ``b"ready"``, then per task ``(task_id, seconds, kind, payload)``.

A batch of items, or of results, is pickled at once (protocol 5) as
``(data, sizes, blob)``: one pickle per message is what keeps small items cheap. A bad
one fails only itself: when a batch cannot be pickled, or loaded in the worker (``kind``
is then ``None``: "send them one by one"), its items travel as ``entries``, each pickled
on its own (``None`` for one the parent could not pickle); results the same way
(``kind`` "items").
Buffers of ``OOB_MIN`` bytes or more (numpy arrays) travel out of band, each in an
anonymous shared-memory file of its own (``memfd_create``) whose descriptor goes with
the message: there is no name to collide or to leak, the kernel frees the memory when
the last mapping goes (even when a process is SIGKILLed), and a kept array pins only its
own bytes. The receiver maps each one and closes the descriptor at once. Buffers of
``PART_MIN`` bytes or more but under ``OOB_MIN`` are copied, one after the other, into
``blob`` (several times faster than pickling them in), and each is copied out of it on
arrival into memory of its own.

A message goes as parts (``sendmsg``), never joined: its header, ``encode``'s pickle,
then the ``PickleBuffer`` objects in it (a batch's ``data`` and ``blob``) as they are.
A worker computes its next batch while a writer thread sends the last one's results.

A reader thread takes tasks off the socket; when the socket reaches end-of-file (the
parent closed it, or died, even by SIGKILL) the reader ends the process at once.
Workers ignore SIGINT: Ctrl-C is the parent's business.
"""

from __future__ import annotations

import array
import contextlib
import linecache
import mmap
import os
import pickle
import queue
import signal
import socket
import struct
import sys
import threading
import time
import traceback
from collections import deque
from collections.abc import Callable
from typing import Any

import cloudpickle

__all__ = [
    "MAX_FDS",
    "OOB_MIN",
    "PART_MIN",
    "Failure",
    "IOV_MAX",
    "Inbox",
    "decode",
    "encode",
    "header",
    "main",
    "pack",
    "sent",
    "unpack",
]

#: Buffers this large or larger travel in shared memory of their own, not the socket.
OOB_MIN = 64 * 1024
#: Smaller buffers this large or larger are sent as they are, not pickled in.
PART_MIN = 1024
#: Each side's socket send buffer: a batch of results goes out without waiting for reads.
SOCKET_BUFFER = 4 << 20
#: At most this many descriptors go with one message (the kernel's limit is 253).
MAX_FDS = 200
#: A failure that could not be sent back is described by this header line.
_UNSENDABLE = "could not be sent back from the worker process"
_HEAD = struct.Struct("<QI")  # body length, number of descriptors
_ANC = socket.CMSG_SPACE(253 * 4)
_MEMFD = hasattr(os, "memfd_create")
_CLOEXEC = getattr(socket, "MSG_CMSG_CLOEXEC", 0)
_IN_PLACE = 1 << 16
#: At most this many parts go to one ``sendmsg`` (the kernel's limit is 1024).
IOV_MAX = 512


class Failure:
    """One item's call failed: the exception itself, or why it could not be sent back."""

    __slots__ = ("exc", "why")

    def __init__(self, exc: BaseException | None, why: str | None = None) -> None:
        self.exc = exc
        self.why = why

    def __reduce__(self) -> Any:
        return (Failure, (self.exc, self.why))


# -- functions shipped by value (``_ship.ship``) ----------------------------------------
def _load_fn(blob: bytes) -> Callable[[Any], Any]:
    data, lines, _ = pickle.loads(blob)
    for f, v in lines.items():  # a notebook cell's source: tracebacks show its lines
        linecache.cache[f] = (sum(map(len, v)), None, v, f)
    fn: Callable[[Any], Any] = pickle.loads(data)
    return fn


# -- values with their buffers in shared memory ---------------------------------------
def _memfd(raw: memoryview) -> int | None:
    fd = os.memfd_create("aioflow", os.MFD_CLOEXEC)
    try:
        os.posix_fallocate(fd, 0, raw.nbytes)  # ENOSPC now rather than SIGBUS on write
        with mmap.mmap(fd, raw.nbytes) as m:
            m[:] = raw
    except OSError:
        os.close(fd)
        return None
    return fd


def pack(obj: Any, fds: list[int], dumps: Callable[..., bytes] = pickle.dumps) -> Any:
    """``obj`` pickled as ``(data, sizes, blob)``: its buffers of ``OOB_MIN`` bytes or more
    go into ``fds`` (``sizes``: n > 0), those of ``PART_MIN`` or more are copied one after
    the other into ``blob`` (n < 0: -n bytes), which is faster than pickling them in."""
    start = len(fds)
    sizes: list[int] = []
    parts: list[memoryview] = []

    def out_of_band(pb: pickle.PickleBuffer) -> bool:
        raw = pb.raw()
        n = raw.nbytes
        if n < PART_MIN:
            return True  # in band
        if _MEMFD and n >= OOB_MIN and len(fds) < MAX_FDS:
            fd = _memfd(raw)
            if fd is not None:  # (else no room for shared memory: through the socket)
                fds.append(fd)
                sizes.append(n)
                return False
        sizes.append(-n)
        parts.append(raw)
        return False

    try:
        data = dumps(obj, protocol=5, buffer_callback=out_of_band)
        blob = b"".join(parts)  # a copy: later changes to the arrays don't reach it
    except BaseException:
        for fd in fds[start:]:
            os.close(fd)
        del fds[start:]
        raise
    return pickle.PickleBuffer(data), sizes, pickle.PickleBuffer(blob)


def take(fds: deque[int], sizes: list[int]) -> list[memoryview]:
    """Map the next ``len(sizes)`` descriptors (closing each): the buffers of one value."""
    fds_of = [fds.popleft() for _ in sizes]
    out = []
    try:
        for fd, n in zip(fds_of, sizes, strict=True):
            out.append(memoryview(mmap.mmap(fd, n)))
    finally:
        for fd in fds_of:
            os.close(fd)
    return out


def unpack(entry: Any, fds: deque[int]) -> Any:
    """The value ``pack`` made ``entry`` of: each buffer in memory of its own."""
    data, sizes, blob = entry
    if not sizes:
        return pickle.loads(data)
    maps = iter(take(fds, [n for n in sizes if n > 0]))
    inline = memoryview(blob)
    buffers: list[Any] = []
    at = 0
    for n in sizes:
        if n > 0:
            buffers.append(next(maps))
        else:  # (a copy: a kept array must not pin the whole message)
            buffers.append(bytearray(inline[at : at - n]))
            at -= n
    return pickle.loads(data, buffers=buffers)


# -- the wire -------------------------------------------------------------------------
def encode(obj: Any) -> list[Any]:
    """``obj`` as the parts of a message body: its pickle, then the ``PickleBuffer``
    objects in it (a batch's ``data``) as they are, so that no part is copied into another."""
    bufs: list[pickle.PickleBuffer] = []
    data = pickle.dumps(obj, protocol=5, buffer_callback=bufs.append)
    raws = [b.raw() for b in bufs]
    return [struct.pack(f"<I{len(raws)}Q", len(raws), *(r.nbytes for r in raws)), data, *raws]


def decode(body: bytes | bytearray) -> Any:
    """The object ``encode`` made the parts of ``body`` from (its buffers are views)."""
    view = memoryview(body)
    (k,) = struct.unpack_from("<I", view)
    end = len(view)
    bufs = []
    for n in reversed(struct.unpack_from(f"<{k}Q", view, 4)):
        bufs.append(view[end - n : end])
        end -= n
    return pickle.loads(view[4 + 8 * k : end], buffers=reversed(bufs))


def scm(fds: list[int]) -> list[tuple[int, int, bytes]]:
    return [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds).tobytes())]


class Inbox:
    """Bytes and descriptors received on a socket, cut into messages.

    A body of ``_IN_PLACE`` bytes or more is received straight into a buffer of its own
    (no copy from the bytes read ahead); ``pop`` after every ``recv``.
    """

    __slots__ = ("big", "buf", "fds", "got")

    def __init__(self) -> None:
        self.buf = bytearray()
        self.fds: deque[int] = deque()
        self.big: bytearray | None = None  # the long body being received, if any
        self.got = 0

    def recv(self, sock: socket.socket) -> bool:
        """Read what is there (blocking or not); False at end-of-file."""
        if self.big is None and len(self.buf) >= _HEAD.size:
            n, _ = _HEAD.unpack_from(self.buf)
            have = len(self.buf) - _HEAD.size
            if n >= _IN_PLACE and have < n:  # (pop took every whole message before it)
                self.big = bytearray(n)
                self.big[:have] = memoryview(self.buf)[_HEAD.size :]
                self.got = have
                del self.buf[_HEAD.size :]
        if self.big is not None:
            got, anc, _, _ = sock.recvmsg_into(
                [memoryview(self.big)[self.got :]], _ANC, _CLOEXEC
            )
            self.got += got
        else:
            data, anc, _, _ = sock.recvmsg(1 << 16, _ANC, _CLOEXEC)
            self.buf += data
            got = len(data)
        for level, kind, d in anc:
            if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                fds = array.array("i")
                fds.frombytes(d[: len(d) - len(d) % fds.itemsize])
                self.fds.extend(fds)
        return got > 0

    def pop(self) -> tuple[bytes | bytearray, deque[int]] | None:
        """The next whole message and its descriptors, if it has arrived."""
        if len(self.buf) < _HEAD.size:
            return None
        n, k = _HEAD.unpack_from(self.buf)
        end = _HEAD.size + n
        if self.big is not None:
            if self.got < n or len(self.fds) < k:
                return None
            body: bytes | bytearray = self.big
            self.big = None
        else:
            if len(self.buf) < end or len(self.fds) < k:
                return None
            body = bytes(memoryview(self.buf)[_HEAD.size : end])
        del self.buf[:end]
        return body, deque(self.fds.popleft() for _ in range(k))

    def close(self) -> None:
        while self.fds:
            os.close(self.fds.popleft())


def size_of(parts: list[Any]) -> int:
    return sum(memoryview(p).nbytes for p in parts)


def header(parts: list[Any], nfds: int) -> bytes:
    """What goes before a message's body (``parts``) sent with ``nfds`` descriptors."""
    return _HEAD.pack(size_of(parts), nfds)


def _send(sock: socket.socket, parts: list[Any], fds: list[int]) -> None:
    parts = [header(parts, len(fds)), *parts]
    try:
        n = sock.sendmsg(parts[:IOV_MAX], scm(fds)) if fds else sock.sendmsg(parts[:IOV_MAX])
        for part in sent(parts, n):
            sock.sendall(part)
    finally:
        for fd in fds:
            os.close(fd)


def sent(parts: list[Any], n: int) -> list[Any]:
    """What is left of ``parts`` (bytes-like) once their first ``n`` bytes are sent."""
    for i, part in enumerate(parts):
        size = memoryview(part).nbytes
        if n < size:
            return [memoryview(part).cast("B")[n:], *parts[i + 1 :]]
        n -= size
    return []


def _write(sock: socket.socket, out: queue.SimpleQueue[Any]) -> None:
    """Send the replies the worker queues, in order, while it computes the next ones."""
    while True:
        body, fds = out.get()
        try:
            _send(sock, body, fds)
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
        _send(sock, [b"ready"], [])
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
        task_id, fn_id, fn_blob, batch, entries = msg
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
                reply = (task_id, *_results([_apply(fn, x) for x in items], out_fds, t0))
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
        return _failure(e, f"loading the function {pickle.loads(blob)[2]!r}")


def _load(entry: Any, fds: deque[int]) -> Any:
    """One item sent on its own, or the ``Failure`` of loading it."""
    try:
        return unpack(entry, fds)
    except Exception as e:  # (its descriptors are closed by now)
        return _failure(e, "unpickling the item in the worker")


def _apply(fn: Callable[[Any], Any] | Failure, x: Any) -> Any:
    if type(fn) is Failure or type(x) is Failure:
        return fn if type(fn) is Failure else x
    try:
        return fn(x)  # type: ignore[operator]
    except Exception as e:
        return _failure(e)


def _results(ys: list[Any], fds: list[int], t0: float) -> tuple[float, str, Any]:
    """(seconds, kind, payload): the results pickled at once (plain pickle, else
    cloudpickle), or one by one so that one that cannot be sent fails only itself."""
    for dumps in (pickle.dumps, cloudpickle.dumps):
        try:
            return time.perf_counter() - t0, "batch", pack(ys, fds, dumps)
        except Exception:
            pass
    return time.perf_counter() - t0, "items", [_pack_one(y, fds) for y in ys]


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
