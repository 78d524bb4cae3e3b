"""Remote paths: URLs (``s3://``, ``gs://``, ``http(s)://``, ``memory://``, ...) read with fsspec.

Needs the extra ``remote`` (fsspec, and aiohttp for HTTP; s3fs or gcsfs for object stores).
A file system with an asynchronous implementation (HTTP, S3, GCS) is used as such, on the
run's own event loop: each run makes its own instance (fsspec caches instances across
loops, which would tie a session to a dead loop) and closes its session when the run
ends. A synchronous one (``memory://``, ...) is read in the loop's thread pool.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import errno
import inspect
import io
from typing import TYPE_CHECKING, Any

from aioflow._core.run import Ctx

if TYPE_CHECKING:
    from aioflow.io._streams import ByteStream

__all__ = ["glob_url", "open_url", "open_url_sync"]

_INSTALL = "reading URLs needs fsspec: pip install 'aioflow[remote]'"


def _fsspec() -> Any:
    try:
        import fsspec
    except ImportError as e:
        raise ImportError(_INSTALL) from e
    return fsspec


def protocol_of(url: str) -> str:
    return url.partition("://")[0].lower()


def glob_url(pattern: str) -> dict[str, dict[str, Any]]:
    """The files (not directories) a URL glob pattern matches: their URLs, and what the
    listing said of each (``size``, ``ETag``, ...) for ``list_files``.

    An asynchronous file system (S3, GCS, HTTP) is made for this listing alone, on an event
    loop of its own in a thread, and closed after it: no instance cached by fsspec keeps an
    endpoint or credentials from an earlier configuration, and nothing is left running.
    """
    fsspec = _fsspec()
    if "::" not in pattern:
        cls = fsspec.get_filesystem_class(protocol_of(pattern))
        if getattr(cls, "async_impl", False):
            with concurrent.futures.ThreadPoolExecutor(1, "aioflow-list") as ex:
                urls: dict[str, dict[str, Any]]
                urls = ex.submit(asyncio.run, _glob_async(cls, pattern)).result()
            return urls
    fs, path = fsspec.core.url_to_fs(pattern)
    return _files(fs, fs.glob(path, detail=True))


async def _glob_async(cls: Any, pattern: str) -> dict[str, dict[str, Any]]:
    fs = cls(asynchronous=True, skip_instance_cache=True, loop=asyncio.get_running_loop())
    try:
        return _files(fs, await fs._glob(cls._strip_protocol(pattern), detail=True))
    except FileNotFoundError:
        return {}  # list_files says no file matches the pattern
    except Exception as e:
        if not isinstance(e, OSError) and not connection_failed(e):
            raise
        raise named(pattern, e) from e
    finally:
        await _close_async(fs)


_CONNECTION = {"ConnectionError", "HTTPClientError"}  # botocore's, which are not OSErrors


def connection_failed(e: BaseException) -> bool:
    """An error of the connection to a store that is not an ``OSError`` (botocore's
    ``EndpointConnectionError``, ``ConnectionClosedError``, ``ReadTimeoutError``, ...)."""
    return not isinstance(e, OSError) and any(c.__name__ in _CONNECTION for c in type(e).__mro__)


def named(url: str, e: BaseException) -> OSError:
    """``e`` as an error of its kind that names ``url`` (s3fs says "Forbidden", "The
    specified key does not exist."), ``e`` itself if it names it already; a failed
    connection (``connection_failed``) is a ``ConnectionError``."""
    if not isinstance(e, OSError):
        return ConnectionError(errno.EIO, str(e), url)
    if url in str(e):
        return e
    what = e.strerror or str(e) or type(e).__name__
    if isinstance(e, FileNotFoundError):
        return FileNotFoundError(errno.ENOENT, f"No such file: {url!r} ({what})", url)
    if isinstance(e, PermissionError):
        return PermissionError(errno.EACCES, f"Access denied to {url!r} ({what})", url)
    try:
        return type(e)(e.errno or errno.EIO, f"{what}: {url!r}", url)
    except Exception:
        return OSError(e.errno or errno.EIO, f"{what}: {url!r}", url)


def _files(fs: Any, found: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {
        fs.unstrip_protocol(name): info
        for name, info in found.items()
        if info.get("type", "file") != "directory"
    }


async def _filesystem(url: str, ctx: Ctx) -> Any:
    protocol = protocol_of(url)
    # one file system per protocol per run (a run may read thousands of files)
    mine: dict[str, Any] = ctx.run.per_run("remote file systems", dict)
    fs = mine.get(protocol)
    if fs is None:
        cls = _fsspec().get_filesystem_class(protocol)
        if getattr(cls, "async_impl", False):
            fs = cls(asynchronous=True, skip_instance_cache=True, loop=asyncio.get_running_loop())
            ctx.run.resources.append(lambda: _close_async(fs))
        else:
            fs = cls()
        mine[protocol] = fs
    return fs


async def _close_async(fs: Any) -> None:
    """Close the client session of an async file system (aiohttp for HTTP/GCS, S3's)."""
    for attr in ("_session", "_s3"):
        session = getattr(fs, attr, None)
        close = getattr(session, "close", None)
        if close is None:
            continue
        try:
            res = close()
            if inspect.isawaitable(res):
                await res
        except Exception:  # pragma: no cover - closing is best effort at run end
            pass
    await asyncio.sleep(0)  # let the closed connections' transports close their sockets


class _AsyncFileStream:
    __slots__ = ("_f", "_url")

    def __init__(self, f: Any, url: str) -> None:
        self._f, self._url = f, url

    async def read(self, n: int) -> bytes:
        try:
            data: bytes = await self._f.read(n)
        except Exception as e:
            if not isinstance(e, OSError) and not connection_failed(e):
                raise
            raise named(self._url, e) from e
        return data

    async def aclose(self) -> None:
        # release an HTTP response's connection synchronously first: an awaited close can
        # be interrupted while a cancelled run is torn down, and an unreleased aiohttp
        # connection warns when it is collected
        r = getattr(self._f, "r", None)
        if r is not None and callable(getattr(r, "close", None)):
            r.close()
        await self._f.close()


class _RangeStream:
    """For async file systems without ``open_async``: ranged ``_cat_file`` reads."""

    __slots__ = ("_fs", "_path", "_pos", "_size", "_url")

    def __init__(self, fs: Any, path: str, size: int, url: str) -> None:
        self._fs, self._path, self._pos, self._size, self._url = fs, path, 0, size, url

    async def read(self, n: int) -> bytes:
        if self._pos >= self._size:
            return b""
        end = min(self._size, self._pos + n)
        try:
            data: bytes = await self._fs._cat_file(self._path, start=self._pos, end=end)
        except Exception as e:
            if not isinstance(e, OSError) and not connection_failed(e):
                raise
            raise named(self._url, e) from e
        self._pos += len(data)
        return data

    async def aclose(self) -> None:
        return None


class _ThreadStream:
    """A synchronous fsspec file, read in the loop's default thread pool."""

    __slots__ = ("_f",)

    def __init__(self, f: Any) -> None:
        self._f = f

    async def read(self, n: int) -> bytes:
        data: bytes = await asyncio.get_running_loop().run_in_executor(None, self._f.read, n)
        return data

    async def aclose(self) -> None:
        await asyncio.get_running_loop().run_in_executor(None, self._f.close)


def _http_status(e: BaseException) -> int | None:
    """The HTTP status behind an error (fsspec's HTTP ``_info`` turns every failure into
    ``FileNotFoundError``, the aiohttp response error as its cause), if there is one."""
    seen: set[int] = set()
    cur: BaseException | None = e
    while cur is not None and id(cur) not in seen:
        seen.add(id(cur))
        status = getattr(cur, "status", None)
        if isinstance(status, int):
            return status
        cur = cur.__cause__ or cur.__context__
    return None


def _missing_or_http_error(url: str, e: BaseException) -> OSError:
    """``FileNotFoundError`` for a missing file; an HTTP error says its status instead."""
    status = _http_status(e)
    if status is None or status in (404, 410):
        return FileNotFoundError(errno.ENOENT, f"No such file: {url!r}", url)
    kind = "server error" if status >= 500 else "client error"
    msg = f"HTTP {status} ({kind}) for {url!r}"
    if status in (401, 403):
        return PermissionError(errno.EACCES, msg, url)
    return OSError(errno.EIO, msg, url)


async def open_url(url: str, ctx: Ctx) -> ByteStream:
    """Open a URL for reading bytes (``FileNotFoundError`` naming it when it is missing).

    An HTTP error other than 404/410 raises ``OSError`` (``PermissionError`` for 401 and
    403) saying its status, e.g. ``HTTP 500 (server error)``.
    """
    fs = await _filesystem(url, ctx)
    path = type(fs)._strip_protocol(url)
    if getattr(fs, "async_impl", False):
        # Ask first: fsspec's HTTP open_async swallows a missing file, and its first read
        # then raises without releasing the response (an unclosed aiohttp connection).
        try:
            info = await fs._info(path)
        except FileNotFoundError as e:
            raise _missing_or_http_error(url, e) from e
        except Exception as e:  # s3fs: PermissionError("Forbidden") for refused credentials
            if not isinstance(e, OSError) and not connection_failed(e):
                raise
            raise named(url, e) from e
        kw = {"size": info.get("size")} if protocol_of(url) in ("http", "https") else {}
        try:
            f = await fs.open_async(path, "rb", **kw)
        except NotImplementedError:
            return _RangeStream(fs, path, int(info["size"]), url)
        return _AsyncFileStream(f, url)
    try:
        f = await asyncio.get_running_loop().run_in_executor(None, fs.open, path, "rb")
    except FileNotFoundError as e:
        raise FileNotFoundError(2, f"No such file: {url!r}", url) from e
    return _ThreadStream(f)


class _LoopFile(io.RawIOBase):
    """A seekable binary file for synchronous readers (pyarrow) running in a thread while
    the run's loop runs: each read is a ranged ``_cat_file`` on the run's async file
    system, sent to its loop. A loop that closes under a read fails it, never hangs it."""

    def __init__(self, fs: Any, path: str, url: str, size: int, loop: Any) -> None:
        super().__init__()
        self._fs, self._path, self._url, self._loop = fs, path, url, loop
        self._size, self._pos = size, 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._pos

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._pos, io.SEEK_END: self._size}[whence]
        self._pos = max(0, base + offset)
        return self._pos

    def readinto(self, b: Any) -> int:
        if self._pos >= self._size:
            return 0
        end = min(self._size, self._pos + len(b))
        coro = self._fs._cat_file(self._path, start=self._pos, end=end)
        fut = asyncio.run_coroutine_threadsafe(coro, self._loop)
        while True:
            try:
                data: bytes = fut.result(timeout=0.5)
                break
            except Exception as e:
                if not isinstance(e, OSError) and not connection_failed(e):
                    raise
                raise named(self._url, e) from e
            except concurrent.futures.TimeoutError:
                if self._loop.is_closed() or not self._loop.is_running():
                    fut.cancel()
                    msg = f"the run ended under a read of {self._url!r}"
                    raise OSError(errno.EIO, msg) from None
        b[: len(data)] = data
        self._pos += len(data)
        return len(data)


async def open_url_sync(url: str, ctx: Ctx) -> Any:
    """A URL opened as a synchronous, seekable binary file, for a reader that runs in a
    thread (``read_parquet``); ``FileNotFoundError`` naming it when it is missing.

    An async file system is the run's own (its configuration, closed when the run ends);
    its reads go to the run's loop, so no fsspec I/O thread is started.
    """
    fs = await _filesystem(url, ctx)
    path = type(fs)._strip_protocol(url)
    if getattr(fs, "async_impl", False):
        try:
            info = await fs._info(path)
        except FileNotFoundError as e:
            raise _missing_or_http_error(url, e) from e
        except Exception as e:  # s3fs: PermissionError("Forbidden") for refused credentials
            if not isinstance(e, OSError) and not connection_failed(e):
                raise
            raise named(url, e) from e
        loop = asyncio.get_running_loop()
        raw = _LoopFile(fs, path, url, int(info["size"]), loop)
        return io.BufferedReader(raw, buffer_size=1024 * 1024)
    try:
        return await asyncio.get_running_loop().run_in_executor(None, fs.open, path, "rb")
    except FileNotFoundError as e:
        raise FileNotFoundError(2, f"No such file: {url!r}", url) from e
