"""The wire between a process pool and its workers: messages, and values with buffers.

Both sides speak it: the parent (``pool``, ``pool_wire``, ``pool_batch``) and the worker
process (``worker``), which loads this file and its own without the ``aioflow`` package
(so this module imports nothing of aioflow). One Unix socket per worker carries framed
messages, each with the file descriptors it passes along (``SCM_RIGHTS``).

A batch of items, or of results, is pickled at once (protocol 5) as
``(data, sizes, blob)``: one pickle per message is what keeps small items cheap.
Buffers of ``OOB_MIN`` bytes or more (numpy arrays) travel out of band, each in an
anonymous shared-memory file of its own (``memfd_create``) whose descriptor goes with
the message: there is no name to collide or to leak, the kernel frees the memory when
the last mapping goes (even when a process is SIGKILLed), and a kept array pins only its
own bytes. The receiver maps each one and closes the descriptor at once; the sender has
closed its own, so the mapping is the memory's only user. It is a private mapping
(``MAP_PRIVATE``): read in place, copied page by page where it is written, so that it
behaves as the receiver's own memory, also across a ``fork()`` of the user's (a write in
the child or the parent is not seen by the other). Buffers of
``PART_MIN`` bytes or more but under ``OOB_MIN`` are copied, one after the other, into
``blob`` (several times faster than pickling them in), and each is copied out of it on
arrival into memory of its own.

A message goes as parts (``sendmsg``), never joined: its header, ``encode``'s pickle,
then the ``PickleBuffer`` objects in it (a batch's ``data`` and ``blob``) as they are.

Values whose classes the receiver cannot import (of the user's ``__main__``, of a
function, of a module not on the path) travel by value (cloudpickle): ``by_name_dumps``
is a plain C pickle whose ``dispatch_table`` spots such a class at its first instance
(``ByValue``; once per type, then a dict lookup in C), and ``pack`` pickles the value
again by value, so plain values never pay for it.
"""

from __future__ import annotations

import array
import copyreg
import ctypes
import io
import mmap
import operator
import os
import pickle
import socket
import struct
import sys
import weakref
from collections import deque
from collections.abc import Callable
from typing import Any

__all__ = [
    "IOV_MAX",
    "MAX_FDS",
    "OOB_MIN",
    "PART_MIN",
    "SOCKET_BUFFER",
    "ByValue",
    "Failure",
    "Inbox",
    "by_name_dumps",
    "decode",
    "encode",
    "header",
    "named",
    "pack",
    "scm",
    "send",
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


# -- values whose classes go by name, or by value -------------------------------------
class ByValue(Exception):
    """A value holds an instance of a class the receiver cannot import by its name."""


def named(cls: type) -> bool:
    """Whether ``cls`` may be pickled by name for another process of this program: not a
    class of ``__main__`` (a worker's is not the user's), of a function (``<locals>``), or
    of a module this process has not imported (one that came by value). Never imports."""
    mod, name = getattr(cls, "__module__", None), getattr(cls, "__qualname__", "<locals>")
    return mod != "__main__" and mod in sys.modules and "<locals>" not in name


class _Reducers(dict[type, Any]):
    """A pickler's ``dispatch_table``: for each type met, what pickle itself would call
    (``copyreg``'s reducer or ``__reduce_ex__``), once ``by_name(type)`` allowed it; else
    ``ByValue`` is raised, out of the ``dump``."""

    def __init__(self, by_name: Callable[[type], bool], protocol: int) -> None:
        super().__init__()
        self.by_name = by_name
        self.default = operator.methodcaller("__reduce_ex__", protocol)
        self.registered = len(copyreg.dispatch_table)

    def __missing__(self, cls: type) -> Any:
        if issubclass(cls, type):  # a class itself: pickle saves it by name (not kept)
            raise KeyError(cls)
        if not self.by_name(cls):
            raise ByValue(cls)
        reduce = copyreg.dispatch_table.get(cls, self.default)
        if len(self) < 4096:
            self[cls] = reduce
        return reduce


def by_name_dumps(by_name: Callable[[type], bool]) -> Callable[..., bytes]:
    """``pickle.dumps`` (protocol 5, whatever ``protocol`` says), but raising ``ByValue``
    on an instance of a class for which ``by_name`` is false (classes met as values
    themselves are not checked)."""
    reducers = _Reducers(by_name, 5)

    class Pickler(pickle.Pickler):
        dispatch_table = reducers

    def dumps(obj: Any, protocol: int = 5, buffer_callback: Any = None) -> bytes:
        if len(copyreg.dispatch_table) != reducers.registered:  # (a reducer registered)
            reducers.clear()
            reducers.registered = len(copyreg.dispatch_table)
        f = io.BytesIO()
        Pickler(f, 5, buffer_callback=buffer_callback).dump(obj)
        return f.getvalue()

    return dumps


# -- values with their buffers in shared memory ---------------------------------------
def _memfd(raw: memoryview) -> int | None:
    """A memfd holding a copy of ``raw``, or None when there is no room for it.

    Written with ``pwrite``: the kernel allocates and fills the pages in one pass (a
    full disk is an ``OSError`` here, never a SIGBUS later), at under half the cost of
    ``fallocate`` and a copy through a fresh mapping (its page faults, its unmapping).
    """
    fd = os.memfd_create("aioflow", os.MFD_CLOEXEC)
    try:
        view = raw.cast("B")
        done, n = 0, view.nbytes
        while done < n:
            wrote = os.pwrite(fd, view[done:], done)
            if wrote <= 0:
                raise OSError("memfd: nothing written")
            done += wrote
    except OSError:
        os.close(fd)
        return None
    return fd


def pack(
    obj: Any,
    fds: list[int],
    dumps: Callable[..., bytes] = pickle.dumps,
    by_value: Callable[..., bytes] | None = None,
) -> Any:
    """``obj`` pickled as ``(data, sizes, blob)``: its buffers of ``OOB_MIN`` bytes or more
    go into ``fds`` (``sizes``: n > 0), those of ``PART_MIN`` or more are copied one after
    the other into ``blob`` (n < 0: -n bytes), which is faster than pickling them in.
    When ``dumps`` fails (``ByValue``, or any error), ``by_value`` has a go, if given."""
    if by_value is not None:
        try:
            return pack(obj, fds, dumps)
        except Exception:
            return pack(obj, fds, by_value)
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
            out.append(_mapped(fd, n))
    finally:
        for fd in fds_of:
            os.close(fd)
    return out


_libc: Any = None


def _mapped(fd: int, n: int) -> memoryview:
    """The ``n`` bytes of ``fd`` mapped (private, writable), unmapped when no value uses them.

    Not ``mmap.mmap``: its object keeps a duplicate of the descriptor, so every kept
    result would hold an open file, and a few hundred kept results exhaust the limit.
    """
    global _libc
    if _libc is None:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.mmap.restype = ctypes.c_void_p
        libc.mmap.argtypes = [
            ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int,
            ctypes.c_long,
        ]  # fmt: skip
        libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
        _libc = libc
    libc = _libc
    flags = mmap.PROT_READ | mmap.PROT_WRITE
    # (private: no process but this one ever writes the file, and a forked child's
    # writes, or this process's after the fork, stay in the process that makes them)
    addr = libc.mmap(None, n, flags, mmap.MAP_PRIVATE, fd, 0)
    if addr is None or addr == ctypes.c_void_p(-1).value:  # MAP_FAILED
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))
    buf = (ctypes.c_ubyte * n).from_address(addr)
    # (not at exit: the process's end unmaps it, and a value may still be in use then)
    weakref.finalize(buf, libc.munmap, addr, n).atexit = False
    return memoryview(buf).cast("B")


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
            got, anc, _, _ = sock.recvmsg_into([memoryview(self.big)[self.got :]], _ANC, _CLOEXEC)
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


def send(sock: socket.socket, parts: list[Any], fds: list[int]) -> None:
    """Send a message whole (blocking), then close its descriptors."""
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
