"""A real S3 API for the tests: moto's ``ThreadedMotoServer`` on a free loopback port.

``S3Server`` starts the server, logs every request it answers (method, path, ``Range``),
can hold requests (to stop the server under a read in flight), and points aioflow at it
the way an s3fs user points at MinIO or any S3-compatible store: fake credentials in the
environment, and the endpoint in fsspec's configuration for ``s3``
(``fsspec.config.conf["s3"]``, the storage options every ``S3FileSystem`` is made with).
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest

BUCKET = "aioflow-test"

#: the environment a client of the fake server needs (no real credentials are read)
FAKE_ENV = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_SESSION_TOKEN": "testing",
    "AWS_DEFAULT_REGION": "us-east-1",
}
_CLEARED = ("AWS_PROFILE", "AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3", "AWS_CONFIG_FILE")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Request:
    method: str
    path: str
    range: str | None


class S3Server:
    """One moto S3 server; ``url`` is its endpoint, ``requests`` what it answered."""

    def __init__(self) -> None:
        from moto.server import ThreadedMotoServer

        logging.getLogger("werkzeug").setLevel(logging.ERROR)  # no line per request
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.requests: list[Request] = []
        self.hold: Callable[[Request], None] | None = None  # called before each request
        self._lock = threading.Lock()
        self._server = ThreadedMotoServer(ip_address="127.0.0.1", port=self.port, verbose=False)
        self._stopped = False

    def start(self) -> None:
        self._server.start()
        wsgi = self._server._server  # werkzeug's server: wrap its app to log requests
        assert wsgi is not None
        app = wsgi.app

        def logged(environ: dict[str, Any], start_response: Any) -> Any:
            req = Request(
                environ["REQUEST_METHOD"], environ["PATH_INFO"], environ.get("HTTP_RANGE")
            )
            with self._lock:
                self.requests.append(req)
            if self.hold is not None:
                self.hold(req)
            return app(environ, start_response)

        wsgi.app = logged

    def stop(self) -> None:
        if not self._stopped:
            self._stopped = True
            self._server.stop()
            wsgi = self._server._server
            if wsgi is not None:
                wsgi.server_close()  # the listening socket too: a new connection is refused

    @staticmethod
    def reset_state() -> None:
        """Forget every bucket and object: moto keeps them per process, not per server."""
        from moto.backends import get_backend

        for per_account in get_backend("s3").values():
            for backend in per_account.values():
                backend.reset()

    def gets(self, key_part: str = "") -> list[Request]:
        """The GETs of objects (not listings) whose path contains ``key_part``."""
        with self._lock:
            return [
                r
                for r in self.requests
                if r.method == "GET" and r.path.count("/") >= 2 and key_part in r.path
            ]

    def client(self) -> Any:
        import boto3

        return boto3.client("s3", endpoint_url=self.url, region_name="us-east-1")

    @contextlib.contextmanager
    def configured(self, mp: pytest.MonkeyPatch) -> Iterator[None]:
        """The environment and fsspec's ``s3`` storage options point at this server."""
        import fsspec.config

        for k in _CLEARED:
            mp.delenv(k, raising=False)
        for k, v in FAKE_ENV.items():
            mp.setenv(k, v)
        mp.setitem(fsspec.config.conf, "s3", {"endpoint_url": self.url})
        yield


def upload_dir(server: S3Server, directory: os.PathLike[str] | str, prefix: str = "") -> None:
    """Every file of ``directory`` put as ``s3://BUCKET/<prefix><name>``."""
    c = server.client()
    for name in sorted(os.listdir(directory)):
        with open(os.path.join(directory, name), "rb") as f:
            c.put_object(Bucket=BUCKET, Key=prefix + name, Body=f.read())
