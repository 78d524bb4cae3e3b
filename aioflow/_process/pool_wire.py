"""One worker process of a ``ProcessPool`` and its socket, seen from the parent.

``Worker.start`` launches a fresh interpreter that loads ``wire.py``, ``columns.py`` and
``worker.py`` alone (never the aioflow package, nor the user's ``__main__``), in a process group of
its own (Ctrl-C in a terminal is for the parent alone), with one end of a Unix socket
pair. The parent's end is non-blocking:
``post`` queues a framed message (with the descriptors it passes) and sends what the
socket takes now; the loop's writer callback sends the rest, so a send never blocks the
loop. ``read`` takes every whole message that has arrived.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import subprocess
import sys
from collections import deque
from collections.abc import Callable
from typing import Any

from aioflow._process import columns as _columns
from aioflow._process import wire as _wire
from aioflow._process import worker as _worker
from aioflow._process.forks import Proc, fork_worker, start_server

__all__ = ["Worker"]

_FILES = (_wire.__file__, _columns.__file__, _worker.__file__)

#: What a worker runs: ``wire``, ``columns`` and ``worker`` loaded from their files (argv
#: 2 and up), without the aioflow package: ``worker``'s ``from .wire import`` finds them.
_BOOT = (
    "import importlib.util as u, os, sys\n"
    "for f in sys.argv[2:]:\n"
    "    n = 'aioflow._process.' + os.path.basename(f)[:-3]\n"
    "    s = u.spec_from_file_location(n, f)\n"
    "    m = sys.modules[n] = u.module_from_spec(s); s.loader.exec_module(m)\n"
    "m.main(int(sys.argv[1]))\n"
)


class Worker:
    """A worker process, its socket, and the batches it was sent (``tasks``)."""

    __slots__ = ("fns", "inbox", "loop", "out", "proc", "ready", "sock", "tasks", "writing")

    def __init__(self, proc: Proc, sock: socket.socket) -> None:
        self.proc = proc
        self.sock = sock
        self.ready = False
        self.writing = False
        self.loop: asyncio.AbstractEventLoop | None = None
        self.fns: set[int] = set()
        self.tasks: deque[Any] = deque()
        self.inbox = _wire.Inbox()
        self.out: deque[list[Any]] = deque()  # [parts left to send, descriptors]

    @classmethod
    def start(cls) -> Worker:
        """A worker forked by the fork server (``_process/forks``), or a fresh interpreter."""
        forked = start_server(sys.path)
        parent, child = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            proc: Proc | None = fork_worker(child) if forked else None
            if proc is None:
                flags: list[str] = getattr(subprocess, "_args_from_interpreter_flags", list)()
                proc = subprocess.Popen(
                    [sys.executable, *flags, "-c", _BOOT, str(child.fileno()), *_FILES],
                    pass_fds=(child.fileno(),),
                    stdin=subprocess.DEVNULL,
                    process_group=0,
                )
        finally:
            child.close()
        parent.setblocking(False)
        w = cls(proc, parent)
        w.post(("init", sys.path), [])
        return w

    def alive(self) -> bool:
        """Whether the process runs and its socket is open (checked before a run)."""
        if self.proc.poll() is not None:
            return False
        try:
            return self.sock.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT) != b""
        except (BlockingIOError, InterruptedError):
            return True  # nothing to read: open
        except OSError:
            return False

    def watch(self, loop: asyncio.AbstractEventLoop, on_readable: Callable[[Worker], Any]) -> None:
        """Let ``loop`` call ``on_readable(self)`` when messages arrive, and send for us."""
        self.loop = loop
        loop.add_reader(self.sock.fileno(), on_readable, self)
        self.writing = False
        self.flush()

    def unwatch(self) -> None:
        if self.loop is not None and self.sock.fileno() >= 0:
            self.loop.remove_reader(self.sock.fileno())
            self.loop.remove_writer(self.sock.fileno())
        self.loop = None
        self.writing = False

    def close(self, *, kill: bool) -> None:
        """Shut the socket down (an idle worker then exits) and drop what was not sent.

        Shut down, not only closed: a child the user's program forked holds a copy of
        the descriptor, and the worker would see no end-of-file until that child ends.
        """
        self.unwatch()
        with contextlib.suppress(OSError):
            self.sock.shutdown(socket.SHUT_RDWR)
        self.forget()
        if kill:
            self.proc.kill()

    def forget(self) -> None:
        """Close this process's descriptors of the worker, leaving the worker be: what a
        forked child does with the parent's workers (it neither shuts their sockets down
        nor touches the loop, whose epoll set it shares with the parent)."""
        self.loop = None
        self.writing = False
        self.sock.close()
        self.inbox.close()
        for _, fds in self.out:
            for fd in fds:
                os.close(fd)
        self.out.clear()

    def post(self, obj: Any, fds: list[int]) -> None:
        """Send ``obj`` (``_wire.encode``; the descriptors are closed once sent)."""
        parts = _wire.encode(obj)
        self.out.append([[_wire.header(parts, len(fds)), *parts], fds])
        if not self.writing:
            self.flush()

    def flush(self) -> None:
        """Send what the socket takes now; the loop calls again when it takes more."""
        while self.out:
            entry = self.out[0]
            parts, fds = entry
            try:
                some = parts[: _wire.IOV_MAX]
                n = self.sock.sendmsg(some, _wire.scm(fds)) if fds else self.sock.sendmsg(some)
            except (BlockingIOError, InterruptedError):
                break
            except OSError:  # the worker is gone: its end-of-file is on the way
                return
            for fd in fds:
                os.close(fd)
            entry[1] = []
            entry[0] = _wire.sent(parts, n)
            if not entry[0]:
                self.out.popleft()
        want = bool(self.out)
        if want != self.writing and self.loop is not None:
            if want:
                self.loop.add_writer(self.sock.fileno(), self.flush)
            else:
                self.loop.remove_writer(self.sock.fileno())
            self.writing = want

    def read(self) -> tuple[list[tuple[bytes | bytearray, deque[int]]], bool]:
        """The whole messages that arrived, and whether the socket reached end-of-file."""
        msgs = []
        try:
            while more := self.inbox.recv(self.sock):
                while (msg := self.inbox.pop()) is not None:
                    msgs.append(msg)
        except (BlockingIOError, InterruptedError):
            more = True
        except OSError:
            more = False
        return msgs, not more
