"""What every reader shares: opening a path as an async byte stream, a read buffer that
knows its file offset, and the ``Pipeline`` node a reader makes.

A local path is streamed through aiofiles (each read a call in the run's thread pool,
which abandons a read that never returns; ``read_bytes`` and ``read_npy``, whose item
is the whole file, read a local file in one such call instead); a URL (``s3://``,
``gs://``, ``http(s)://``, ``memory://``, ...) through fsspec (``remote.py``). Reads are
blocks of 64 KiB growing to 1 MiB, so a reader gives its first item quickly and then
moves large blocks; a reader holds one block plus the record it is parsing, never the
whole file. A gzip or zlib stream (tf.data's ``compression_type``) is decompressed as
it is read.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
import threading
import zlib
from collections.abc import AsyncIterator, Callable, Sequence
from concurrent.futures import Executor
from typing import Any, Protocol

import aiofiles.threadpool

from aioflow._calls.maps import ErrorPolicy
from aioflow._core.run import NO_HINTS, UNKNOWN_CARD, ChunkIter, Ctx, Hints, Node, Opener
from aioflow._state.state import SEEK
from aioflow.errors import BadInput, PipelineError
from aioflow.io.remote import open_url

__all__ = [
    "BLOCK_MAX",
    "BLOCK_MIN",
    "ByteStream",
    "Buffered",
    "LocalStream",
    "bad_input",
    "check_compression",
    "check_path",
    "is_url",
    "open_stream",
    "reader",
]

BLOCK_MIN = 64 * 1024
BLOCK_MAX = 1024 * 1024


class ByteStream(Protocol):
    """An open file, local or remote: ``read(n)`` returns up to ``n`` bytes, b"" at EOF."""

    async def read(self, n: int) -> bytes: ...

    async def aclose(self) -> None: ...


class LocalStream:
    """A local file: opened and read in the run's thread pool (reads through aiofiles).

    It is closed synchronously, on the loop: closing a file opened for reading does no
    I/O, waits for a read still running in a thread (the file's own lock), and, unlike an
    awaited close, cannot be interrupted when a cancelled run is torn down.
    """

    __slots__ = ("_f", "_raw")

    def __init__(self, raw: Any, pool: Executor | None = None) -> None:
        self._raw = raw
        self._f = aiofiles.threadpool.wrap(raw, loop=asyncio.get_running_loop(), executor=pool)

    @classmethod
    async def open(cls, path: str, pool: Executor | None = None, offset: int = 0) -> LocalStream:
        """Open ``path`` at ``offset`` in ``pool`` (the run's: a call that never returns is
        abandoned)."""
        opening = _Opening(path, offset)
        fut = asyncio.get_running_loop().run_in_executor(pool, opening.open)
        try:
            raw = await asyncio.shield(fut)
        except asyncio.CancelledError:
            opening.abandon()  # it may still open (a FIFO without a writer): close it then
            raise
        return cls(raw, pool)

    async def read(self, n: int) -> bytes:
        data: bytes = await self._f.read(n)
        return data

    async def aclose(self) -> None:
        self._raw.close()


class _Opening:
    """A file being opened in a thread; whoever comes second closes it if abandoned.

    Not a callback on the loop's future: the open may end after the loop has closed.
    """

    def __init__(self, path: str, offset: int = 0) -> None:
        self.path = path
        self.offset = offset
        self.lock = threading.Lock()
        self.abandoned = False
        self.raw: Any = None

    def open(self) -> Any:
        raw = open(self.path, "rb")  # noqa: SIM115 - LocalStream closes it
        if self.offset:
            raw.seek(self.offset)
        with self.lock:
            if not self.abandoned:
                self.raw = raw
                return raw
        raw.close()
        return None

    def abandon(self) -> None:
        with self.lock:
            self.abandoned = True
            raw, self.raw = self.raw, None
        if raw is not None:
            raw.close()


def is_url(path: str) -> bool:
    """True for ``scheme://...`` paths other than ``file://`` (those are read by fsspec)."""
    head, sep, _ = path.partition("://")
    return bool(sep) and head.isidentifier() and head.lower() != "file"


def local_path(path: str) -> str:
    return path[len("file://") :] if path.lower().startswith("file://") else path


def local_read(load: Callable[[str], Any], path: str) -> Callable[[], Any] | None:
    """``load`` of ``path`` as a call of no arguments, if it is local (None for a URL)."""
    return None if is_url(path) else functools.partial(load, local_path(path))


def check_path(path: Any, what: str) -> str:
    """A reader's path argument as a ``str`` (``os.PathLike`` accepted)."""
    if isinstance(path, bytes) or not isinstance(path, str | os.PathLike):
        raise PipelineError(f"{what} needs a path (str or os.PathLike), got {type(path).__name__}")
    return os.fspath(path)


_WBITS = {"GZIP": 16 + zlib.MAX_WBITS, "ZLIB": zlib.MAX_WBITS}


def check_compression(compression_type: str | None) -> str | None:
    """tf.data's ``compression_type``: None or "" (none), "GZIP" or "ZLIB"."""
    if not compression_type:
        return None
    c = str(compression_type).upper()
    if c not in _WBITS:
        raise PipelineError(
            f'compression_type must be None, "GZIP" or "ZLIB", got {compression_type!r}'
        )
    return c


class _Inflating:
    """A gzip or zlib stream, decompressed as it is read (concatenated gzip members too)."""

    __slots__ = ("_d", "_in", "_path", "_raw", "_read", "_wbits")

    def __init__(self, raw: ByteStream, compression: str, path: str) -> None:
        self._raw, self._path = raw, path
        self._wbits = _WBITS[compression]
        self._d = zlib.decompressobj(self._wbits)
        self._in = b""  # compressed bytes not yet fed
        self._read = 0  # compressed bytes read so far

    async def read(self, n: int) -> bytes:
        while True:
            if self._in:
                try:
                    out = self._d.decompress(self._in, n)
                except zlib.error as e:
                    raise bad_input(None, self._path, f"corrupt compressed data ({e})") from e
                if self._d.eof:  # what follows the end: the next gzip member, if any
                    self._in = self._d.unused_data
                    if self._in:
                        self._d = zlib.decompressobj(self._wbits)
                else:
                    self._in = self._d.unconsumed_tail
                if out:
                    return out
                continue
            data = await self._raw.read(BLOCK_MAX)
            if not data:
                if self._read and not self._d.eof:
                    raise bad_input(
                        None, self._path, "truncated compressed stream", offset=self._read
                    )
                return b""
            self._read += len(data)
            self._in = data

    async def aclose(self) -> None:
        await self._raw.aclose()


@contextlib.asynccontextmanager
async def open_stream(
    path: str, ctx: Ctx, compression: str | None = None, offset: int = 0
) -> AsyncIterator[ByteStream]:
    """Open ``path`` for reading bytes; closed when the block exits (break and error too).

    With ``compression`` ("GZIP" or "ZLIB") the bytes read are the decompressed ones.
    ``offset``: where to start (a local, uncompressed file: see ``SeekLog``).
    """
    stream: ByteStream
    if is_url(path):
        stream = await open_url(path, ctx)
    else:
        stream = await LocalStream.open(local_path(path), ctx.run.thread_pool(), offset)
    if compression is not None:
        stream = _Inflating(stream, compression, path)
    try:
        yield stream
    except BadInput as e:
        if e.stage is None:
            e.stage = ctx.name
        raise
    finally:
        await stream.aclose()


class Buffered:
    """A read buffer over a ``ByteStream`` that knows the file offset of what it holds.

    ``buf[pos:]`` are the bytes not yet consumed; ``offset`` is the file offset of
    ``buf[pos]``. ``fill(n)`` reads until ``n`` bytes are available (False at EOF before).
    """

    __slots__ = ("_block", "buf", "eof", "offset", "pos", "stream")

    def __init__(self, stream: ByteStream) -> None:
        self.stream = stream
        self.buf = bytearray()
        self.pos = 0
        self.offset = 0
        self.eof = False
        self._block = BLOCK_MIN

    @property
    def available(self) -> int:
        return len(self.buf) - self.pos

    async def read_block(self) -> bool:
        """Read one more block into the buffer; False at EOF."""
        if self.eof:
            return False
        if self.pos and self.pos >= len(self.buf) // 2:
            del self.buf[: self.pos]  # drop what was consumed before growing the buffer
            self.pos = 0
        data = await self.stream.read(self._block)
        if self._block < BLOCK_MAX:
            self._block *= 2
        if not data:
            self.eof = True
            return False
        self.buf += data
        return True

    async def fill(self, n: int) -> bool:
        while len(self.buf) - self.pos < n:
            if not await self.read_block():
                return False
        return True

    def take(self, n: int) -> bytes:
        """The next ``n`` bytes (which must be available), consumed."""
        p = self.pos
        out = bytes(self.buf[p : p + n])
        self.pos = p + n
        self.offset += n
        return out

    def skip(self, n: int) -> None:
        self.pos += n
        self.offset += n


def bad_input(
    ctx: Ctx | None,
    path: str,
    what: str,
    *,
    line: int | None = None,
    offset: int | None = None,
) -> BadInput:
    """A ``BadInput`` naming the file and the line or byte offset (and ``ctx``'s stage)."""
    if line is not None:
        where = f"{path}:{line}"
    elif offset is not None:
        where = f"{path} at byte offset {offset}"
    else:
        where = path
    return BadInput(
        f"{where}: {what}", path=path, line=line, offset=offset, stage=ctx.name if ctx else None
    )


# One ErrorPolicy per stage per run: the readers of many files opened by one flat_map or
# interleave are one stage in the stats, so they share its failure count and log once.


def _policy(ctx: Ctx, on_error: str | int) -> ErrorPolicy:
    mine: dict[Any, ErrorPolicy] = ctx.run.per_run("error policies", dict)
    policy = mine.get(ctx.meter.key)
    if policy is None:
        policy = mine[ctx.meter.key] = ErrorPolicy(on_error)
    return policy


def reader(
    name: str,
    path: Any,
    gen: Callable[[str, Ctx, ErrorPolicy], ChunkIter],
    *,
    on_error: str | int = "raise",
    card: int = UNKNOWN_CARD,
    key: tuple[Any, ...] = (),
    task: bool = True,
    load: Callable[[str], Any] | None = None,
) -> Node:
    """The node of a file reader: a source node, in a task of its own.

    ``task=False`` (readers of one item per file) fuses it into the task that reads it:
    a one-item stream has nothing to read ahead, and a task per file costs more than a
    small file's read (``flat_map(read_npy)`` over 48 KiB files: 5.2k -> 7.1k files/s).
    ``load(local_path)``: such a reader's blocking read of its item, which an
    ``interleave`` runs in batches of files on the run's threads (``Node.hints.load``).
    """
    p = check_path(path, name)
    ErrorPolicy(on_error)  # checked when the pipeline is described

    def build(ctx: Ctx, inputs: Sequence[Opener]) -> ChunkIter:
        return gen(p, ctx, _policy(ctx, on_error))

    one = None if load is None else local_read(load, p)
    return Node(
        name,
        build,
        card=lambda _: card,
        task=task,
        key=(p, on_error, *key),
        resume=SEEK,
        hints=NO_HINTS if one is None else Hints(load=one),
    )
