"""Helpers the IO tests share: counting open file descriptors, an HTTP server."""

from __future__ import annotations

import functools
import http.server
import os
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

import psutil


def open_fds() -> int:
    return psutil.Process().num_fds()


def open_paths(under: os.PathLike[str] | str) -> list[str]:
    root = os.fspath(under)
    return [f.path for f in psutil.Process().open_files() if f.path.startswith(root)]


def assert_fds_back_to(before: int, under: os.PathLike[str] | str) -> None:
    """No file under ``under`` is open, and the fd count is back (closes may lag a bit)."""
    deadline = time.monotonic() + 2.0
    while True:
        now, held = open_fds(), open_paths(under)
        if now <= before and not held:
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"fds {before} -> {now}; still open: {held}")
        time.sleep(0.01)


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    """Serves the directory; ``/status/<code>/...`` answers every request with that code."""

    def log_message(self, format: str, *args: object) -> None:
        pass

    def send_head(self):  # type: ignore[no-untyped-def]
        parts = self.path.split("/")
        if len(parts) > 2 and parts[1] == "status":
            self.send_error(int(parts[2]))
            return None
        return super().send_head()


class _QuietServer(http.server.ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request: object, client_address: object) -> None:
        pass  # a client that stops reading early (a break) is expected here


@contextmanager
def http_server(directory: os.PathLike[str] | str) -> Iterator[str]:
    """Serve ``directory`` on 127.0.0.1 (a free port) in a thread; yields the base URL."""
    handler = functools.partial(_QuietHandler, directory=os.fspath(directory))
    server = _QuietServer(("127.0.0.1", 0), handler)
    t = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05})
    t.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        t.join()
