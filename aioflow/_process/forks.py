"""The fork server: worker processes forked from a copy of the program, torch and all.

A fresh interpreter (``pool_wire``'s way) imports what the function needs, torch say,
before its first call: seconds per worker, every worker at once. DataLoader forks its
workers from the training script, after torch is imported. Forking the parent itself
each time would fork a process that runs a loop and threads; so, when the first pool
starts while the program runs one thread only, the parent forks once a *server*: a
copy of the program as it is then (every library it imported, torch included), which
does nothing but fork workers, one per request, and report how each one ended. A pool
then starts in milliseconds, the first one too.

- The server is single-threaded (so forking it is safe), in a process group of its own
  with SIGINT ignored, and ends when its socket to the parent reaches end-of-file (the
  parent exited or died, even by SIGKILL). Its objects are frozen (``gc.freeze``): no
  finalizer of the program's objects runs in it or in a worker. The program's modules
  that are not libraries (its own, aioflow) are dropped from its ``sys.modules``, so a
  worker imports them anew, as a fresh interpreter would; descriptors open at its birth
  stay open in it, as after any fork. Python-level signal handlers are reset.
- A worker forked from it runs ``_process/worker.main`` on the socket the parent sent
  (``SCM_RIGHTS``) in a process group of its own, with numpy's global random state
  reseeded (``random`` reseeds itself after a fork). The server writes the worker's wait
  status into a pipe the parent keeps (``Forked``: ``poll``, ``wait``, ``kill``, as the
  ``subprocess.Popen`` of a spawned worker).
- No server when the program runs other Python threads (``fork`` would copy locks they
  hold), when it was disabled (``AIOFLOW_FORK_SERVER=0``), or when forking fails:
  workers are then fresh interpreters, as before. Native threads (numpy's OpenBLAS
  starts one at import) do not count: those libraries have fork handlers of their own,
  and DataLoader forks across them too. A child the user forks forgets the server.
"""

from __future__ import annotations

import atexit
import contextlib
import gc
import os
import select
import signal
import site
import socket
import struct
import subprocess
import sys
import sysconfig
import threading
import warnings
from typing import Any

from aioflow._process import worker as _worker
from aioflow._process.wire import scm

__all__ = ["Forked", "Proc", "forget_server", "fork_worker", "server_pid", "start_server"]

_STATUS = struct.Struct("i")
_lock = threading.Lock()
_server: tuple[int, socket.socket] | None = None  # (pid, the parent's end)
_failed = False  # forking a server failed once: never again


class Forked:
    """A worker forked by the server, as much of ``subprocess.Popen`` as a pool uses."""

    def __init__(self, pid: int, status_fd: int) -> None:
        self.pid = pid
        self.returncode: int | None = None
        self._fd = status_fd  # the server writes the wait status there, then closes it
        os.set_blocking(status_fd, False)

    def poll(self) -> int | None:
        if self.returncode is None:
            try:
                data = os.read(self._fd, _STATUS.size)
            except BlockingIOError:
                return None
            os.close(self._fd)
            self._fd = -1
            if len(data) == _STATUS.size:
                self.returncode = os.waitstatus_to_exitcode(_STATUS.unpack(data)[0])
            else:  # the server died first: the worker ends at its socket's end-of-file
                self.returncode = -signal.SIGKILL
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if self.poll() is None:
            ready, _, _ = select.select([self._fd], [], [], timeout)
            if not ready:
                raise subprocess.TimeoutExpired(f"worker {self.pid}", timeout or 0.0)
        code = self.poll()
        assert code is not None
        return code

    def kill(self) -> None:
        if self.poll() is None:  # (not reaped yet: the pid is still this worker's)
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, signal.SIGKILL)

    def __del__(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


Proc = subprocess.Popen[bytes] | Forked  # a worker process: spawned, or forked


def server_pid() -> int | None:
    """The fork server's pid, if this process has one."""
    server = _server
    return server[0] if server is not None else None


def start_server(sys_path: list[str]) -> bool:
    """Fork the server now, if there is none and it may be: before the sockets of the
    next worker are made (the server must hold no copy of them). Whether there is one."""
    with _lock:
        return _server is not None or _start(sys_path)


def fork_worker(sock: socket.socket) -> Forked | None:
    """A worker forked by the server, serving the other end of ``sock``; None when there
    is no server (start a fresh interpreter then)."""
    with _lock:
        if _server is None:
            return None
        ctl = _server[1]
        r, w = os.pipe()
        try:
            ctl.sendmsg([b"f"], scm([sock.fileno(), w]))
            reply = ctl.recv(_STATUS.size)
        except OSError:  # (a timeout too)
            reply = b""
        finally:
            os.close(w)
        if len(reply) != _STATUS.size:  # the server is gone: fresh interpreters from now
            os.close(r)
            forget_server(gone=True)
            return None
        return Forked(_STATUS.unpack(reply)[0], r)


def forget_server(gone: bool = False) -> None:
    """Drop this process's end of the server's socket (the server then ends, unless a
    forked copy of this process still holds it: each child forgets it at once).

    ``gone``: the server stopped answering (its socket closed, or a timeout). A killed
    server's socket closes before it is a zombie, so a reap that does not wait can miss
    it; it is killed (still our unreaped child, so the pid is its own) and waited for."""
    global _server
    server, _server = _server, None
    if server is not None:
        server[1].close()
        with contextlib.suppress(ChildProcessError):  # (a child's copy: not ours)
            if os.waitpid(server[0], os.WNOHANG)[0] == 0 and gone:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(server[0], signal.SIGKILL)
                os.waitpid(server[0], 0)


def _start(sys_path: list[str]) -> bool:
    global _server, _failed
    # (Python threads only: the native ones of BLAS or OpenMP libraries are forked across
    # as DataLoader forks them, those libraries register their own fork handlers)
    if _failed or os.environ.get("AIOFLOW_FORK_SERVER", "1") == "0" or threading.active_count() > 1:
        return False
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    for stream in (sys.stdout, sys.stderr):  # (else the server's copy is written twice)
        with contextlib.suppress(Exception):
            if stream is not None:
                stream.flush()
    try:
        with warnings.catch_warnings():  # (3.12's "multi-threaded" warning: see above)
            warnings.simplefilter("ignore", DeprecationWarning)
            pid = os.fork()
    except OSError:
        _failed = True
        ours.close()
        theirs.close()
        return False
    if pid == 0:  # pragma: no cover - the server's coverage is not collected
        code = 1
        try:
            ours.close()
            _serve(theirs, sys_path)
            code = 0
        finally:
            os._exit(code)
    theirs.close()
    ours.settimeout(30.0)  # (a server that stops answering is given up)
    _server = (pid, ours)
    return True


def _forget_in_child() -> None:
    global _lock
    _lock = threading.Lock()
    forget_server()


os.register_at_fork(after_in_child=_forget_in_child)
atexit.register(forget_server)  # (the socket closed, not left to its finalizer; the server ends)


# -- in the server --------------------------------------------------------------------
def _library_dirs() -> tuple[str, ...]:
    paths = sysconfig.get_paths()
    dirs = {paths[k] for k in ("stdlib", "platstdlib", "purelib", "platlib") if k in paths}
    dirs.update(getattr(site, "getsitepackages", list)())
    return tuple({d + os.sep for d in dirs} | {os.path.realpath(d) + os.sep for d in dirs})


_WORKER_MODULES = {f"aioflow._process.{m}" for m in ("worker", "wire", "columns")}


def _drop_own_modules() -> None:
    """Forget the program's own modules and aioflow's: a worker imports them anew."""
    libs = _library_dirs()
    for name, mod in list(sys.modules.items()):
        path = getattr(mod, "__file__", None)
        if name in _WORKER_MODULES:  # (what a spawned worker has too: pickles name them)
            continue
        own = (
            name != "__main__"
            and path
            and not path.startswith(libs)  # (most are, as found: no system call)
            and not os.path.realpath(path).startswith(libs)
        )
        if own or name.partition(".")[0] == "aioflow":
            del sys.modules[name]


def _serve(ctl: socket.socket, sys_path: list[str]) -> None:
    """The server's loop: fork a worker per request until the parent goes."""
    os.setpgid(0, 0)  # (Ctrl-C in a terminal is for the parent alone)
    for sig in signal.valid_signals():
        with contextlib.suppress(OSError, ValueError, TypeError):
            if callable(signal.getsignal(sig)):
                signal.signal(sig, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    sys.path[:] = sys_path
    _drop_own_modules()
    gc.freeze()
    statuses: dict[int, int] = {}

    def reap(*_: Any) -> None:
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            fd = statuses.pop(pid, None)
            if fd is not None:
                with contextlib.suppress(OSError):
                    os.write(fd, _STATUS.pack(status))
                os.close(fd)

    signal.signal(signal.SIGCHLD, reap)
    while True:
        try:
            _, anc, _, _ = ctl.recvmsg(16, socket.CMSG_SPACE(2 * 4))
        except OSError:
            return
        fds = [fd for level, kind, d in anc if kind == socket.SCM_RIGHTS for fd in _ints(d)]
        if len(fds) != 2:  # end-of-file (the parent is gone), or not a request
            for fd in fds:
                os.close(fd)
            return
        sock_fd, status_fd = fds
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGCHLD})  # (reap knows it first)
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", DeprecationWarning)
                pid = os.fork()
            if pid == 0:  # pragma: no cover
                _run_worker(ctl, sock_fd, status_fd, statuses)
            statuses[pid] = status_fd
            os.close(sock_fd)
        finally:
            signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGCHLD})
        try:
            ctl.send(_STATUS.pack(pid))
        except OSError:
            return


def _ints(data: bytes) -> list[int]:
    n = len(data) // 4
    return list(struct.unpack(f"{n}i", data[: 4 * n]))


def _run_worker(ctl: socket.socket, sock_fd: int, status_fd: int, statuses: dict[int, int]) -> None:
    code = 1
    try:
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGCHLD})
        ctl.close()
        for fd in [status_fd, *statuses.values()]:
            os.close(fd)
        statuses.clear()
        os.setpgid(0, 0)
        np = sys.modules.get("numpy")
        if np is not None:  # (each worker its own, as a fresh interpreter's)
            with contextlib.suppress(Exception):
                np.random.seed()
        _worker.main(sock_fd)
        code = 0
    finally:
        os._exit(code)
