"""``cache``: record the first complete epoch, replay it afterwards (memory or a file).

In memory, the recording belongs to the ``Pipeline`` object: every later iteration of
it (or of a pipeline built on it) replays the same items, which are shared, not copied.
An epoch that does not complete (break, error, cancellation) records nothing, and the
next one reads the upstream again.

On disk, the first complete epoch is written to a temporary file beside ``path`` while
its items flow downstream; only when the upstream is exhausted is the file flushed,
fsynced and renamed to ``path`` (an atomic rename). So a run that is interrupted leaves
no file at ``path``, and two runs writing the same cache at once each rename a complete
file (the later rename wins; a run that finds a complete cache already there discards
its own). Any run, in any process, that finds a complete file at ``path`` reads it
instead of the upstream. The file is a header, pickled chunks framed by their length and
CRC-32, and a trailer with the item count; a file without a valid trailer is not trusted
(it is rebuilt). A chunk whose checksum or pickle is wrong, or an item count that does
not match the trailer, raises ``BadInput`` naming the file, which is then removed, so the
next epoch rebuilds it. A commit that fails (disk full) removes its temporary file and
raises ``StageError`` naming the cache; a path that is a directory is a
``PipelineError``. Items are pickled (protocol 5), so numpy arrays and nested containers
come back exactly; as with any pickle, only read cache files you wrote.
"""

from __future__ import annotations

import asyncio
import logging
import os
import pickle
import secrets
import struct
import zlib
from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, Any

from aioflow.errors import PipelineError, StageError
from aioflow.io._streams import Buffered, bad_input, open_stream
from aioflow.ops.kit import (
    Chunk,
    ChunkIter,
    Ctx,
    Node,
    Opener,
    aclosing,
)

if TYPE_CHECKING:
    from aioflow.pipeline import Pipeline

__all__ = ["cache_path"]

log = logging.getLogger("aioflow")

_MAGIC = b"AIOFLOW-CACHE-2\n"  # 2: each frame has a CRC-32 of its bytes
_END = b"AIOFLOW-CACHE-END"
_LEN = struct.Struct("<Q")
_CRC = struct.Struct("<I")
_TRAILER = struct.Struct("<QQ17s")  # 0 (end of frames), item count, _END
_FLUSH = 1 << 20  # write to the file in blocks of about this many bytes


def cache_path(path: Any) -> str | None:
    """``path`` checked: None (or "") for a memory cache, else a local file path."""
    if path is None or path == "":
        return None
    if isinstance(path, bytes) or not isinstance(path, str | os.PathLike):
        raise PipelineError(f"cache path must be a str or os.PathLike, got {type(path).__name__}")
    p = os.fspath(path)
    if "://" in p:
        raise PipelineError(f"cache writes local files only, got {p!r}")
    return p


def trusted_count(path: str) -> int | None:
    """The item count of a complete cache file at ``path``; None if absent or incomplete."""
    try:
        with open(path, "rb") as f:
            if f.read(len(_MAGIC)) != _MAGIC:
                return None
            size = f.seek(0, os.SEEK_END)
            if size < len(_MAGIC) + _TRAILER.size:
                return None
            f.seek(size - _TRAILER.size)
            zero, count, end = _TRAILER.unpack(f.read(_TRAILER.size))
    except OSError:
        return None
    return count if zero == 0 and end == _END else None


class _Memory:
    __slots__ = ("chunks",)

    def __init__(self) -> None:
        self.chunks: list[Chunk] | None = None


async def _memory_cache(ctx: Ctx, opener: Opener, store: _Memory) -> ChunkIter:
    if store.chunks is not None:
        for c in store.chunks:
            yield list(c)  # a fresh list: downstream may own the chunk it gets
        return
    recorded: list[Chunk] = []
    async with aclosing(opener()) as src:
        async for chunk in src:
            recorded.append(list(chunk))
            yield chunk
    if store.chunks is None:  # reached only when the upstream is exhausted
        store.chunks = recorded


async def _read_file(ctx: Ctx, path: str, trailer_count: int) -> ChunkIter:
    def corrupt(what: str, at: int, cause: BaseException | None = None) -> BaseException:
        _remove_if_unchanged(path, seen)  # so the next epoch rebuilds it
        err = bad_input(ctx, path, f"corrupt cache file ({what}); it is rebuilt", offset=at)
        err.__cause__ = cause
        return err

    seen = await asyncio.get_running_loop().run_in_executor(None, _identity, path)
    count = 0
    async with open_stream(path, ctx) as s:
        buf = Buffered(s)
        await buf.fill(len(_MAGIC))
        buf.skip(len(_MAGIC))
        while True:
            at = buf.offset
            if not await buf.fill(_LEN.size):
                raise corrupt("truncated", at)
            (n,) = _LEN.unpack_from(buf.buf, buf.pos)
            if n == 0:
                if count != trailer_count:
                    raise corrupt(f"{count} items, the trailer says {trailer_count}", at)
                return
            buf.skip(_LEN.size)
            if not await buf.fill(_CRC.size + n):
                raise corrupt("truncated", at)
            (crc,) = _CRC.unpack_from(buf.buf, buf.pos)
            buf.skip(_CRC.size)
            data = buf.take(n)
            if zlib.crc32(data) != crc:
                raise corrupt("checksum mismatch", at)
            try:
                chunk = pickle.loads(data)
            except Exception as e:
                raise corrupt(f"unpickling failed: {e!r}", at, e) from e
            count += len(chunk)
            yield chunk


def _identity(path: str) -> tuple[int, int, int] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_ino, st.st_size, st.st_mtime_ns


def _remove_if_unchanged(path: str, seen: tuple[int, int, int] | None) -> None:
    """Remove the damaged file, unless another run has replaced it meanwhile."""
    if seen is not None and _identity(path) == seen:
        try:
            os.unlink(path)
        except OSError:  # pragma: no cover - gone already, or not ours to remove
            pass


class _Writer:
    """The temporary file of a cache being written (blocking calls run in a thread)."""

    def __init__(self, path: str) -> None:
        self.path = path
        d, base = os.path.split(os.path.abspath(path))
        os.makedirs(d, exist_ok=True)
        self.tmp = os.path.join(d, f".{base}.tmp-{os.getpid()}-{secrets.token_hex(4)}")
        self.f = open(self.tmp, "wb")  # noqa: SIM115 - closed by commit() or discard()

    def write(self, data: bytes) -> None:
        self.f.write(data)

    def commit(self, tail: bytes) -> None:
        """Finish the file and rename it into place, unless a complete cache is there.

        If that fails (disk full, ...) the temporary file is removed and the error raised.
        """
        try:
            self.f.write(tail)
            self.f.flush()
            os.fsync(self.f.fileno())
            self.f.close()
            if trusted_count(self.path) is not None:
                os.unlink(self.tmp)  # another run finished first: keep its file
                return
            os.replace(self.tmp, self.path)
        except BaseException:
            self.discard()
            raise
        try:  # make the rename itself durable
            fd = os.open(os.path.dirname(os.path.abspath(self.path)), os.O_RDONLY)
        except OSError:  # pragma: no cover - platforms that cannot open directories
            return
        try:
            os.fsync(fd)
        except OSError:  # pragma: no cover
            pass
        finally:
            os.close(fd)

    def discard(self) -> None:
        try:
            self.f.close()
        except OSError:
            pass  # a close that fails to flush (disk full): the file goes anyway
        try:
            os.unlink(self.tmp)
        except FileNotFoundError:
            pass


def _first_unpicklable(chunk: Chunk) -> int:
    for i, x in enumerate(chunk):
        try:
            pickle.dumps(x, protocol=5)
        except Exception:
            return i
    return 0  # pragma: no cover - the chunk failed as a whole only


async def _file_cache(ctx: Ctx, opener: Opener, path: str) -> ChunkIter:
    loop = asyncio.get_running_loop()
    count = await loop.run_in_executor(None, trusted_count, path)
    if count is not None:
        async with aclosing(_read_file(ctx, path, count)) as chunks:
            async for c in chunks:
                yield c
        return
    if os.path.isdir(path):
        raise PipelineError(f"stage {ctx.name!r}: the cache path {path!r} is a directory")
    if os.path.exists(path):
        log.warning("cache file %r is incomplete or of another format: rebuilding it", path)
    w = await loop.run_in_executor(None, _Writer, path)
    committing = False
    try:
        pending = bytearray(_MAGIC)
        count = 0
        async with aclosing(opener()) as src:
            async for chunk in src:
                try:
                    data = pickle.dumps(chunk, protocol=5)
                except Exception as e:
                    i = _first_unpicklable(chunk)
                    if i:
                        yield chunk[:i]  # the items before the bad one still arrive
                    raise PipelineError(
                        f"stage {ctx.name!r}: item {count + i} cannot be pickled into the"
                        f" cache file {path!r}: {e!r}"
                    ) from e
                pending += _LEN.pack(len(data))
                pending += _CRC.pack(zlib.crc32(data))
                pending += data
                count += len(chunk)
                if len(pending) >= _FLUSH:
                    block, pending = bytes(pending), bytearray()
                    await _io(ctx, path, loop.run_in_executor(None, w.write, block))
                yield chunk
        tail = bytes(pending) + _TRAILER.pack(0, count, _END)
        committing = True  # the epoch is complete: the commit finishes even if cancelled
        await _io(ctx, path, asyncio.shield(loop.run_in_executor(None, w.commit, tail)))
    finally:
        if not committing:
            w.discard()  # an interrupted epoch leaves no cache


async def _io(ctx: Ctx, path: str, call: Awaitable[None]) -> None:
    """Await a write to the cache file; an ``OSError`` becomes a ``StageError`` naming it."""
    try:
        await call
    except OSError as e:
        raise StageError(
            f"stage {ctx.name!r}: cannot write the cache file {path!r}: {e}", stage=ctx.name
        ) from e


def cache_node(up: Pipeline[Any], path: Any) -> Node:
    """``cache(path)``: the first complete epoch kept in memory, or in a file at ``path``."""
    p = cache_path(path)
    build: Callable[[Ctx, Sequence[Opener]], ChunkIter]
    if p is None:
        store = _Memory()
        build = lambda ctx, inputs: _memory_cache(ctx, inputs[0], store)  # noqa: E731
    else:
        build = lambda ctx, inputs: _file_cache(ctx, inputs[0], p)  # noqa: E731
    return Node("cache" if p is None else "cache(file)", build, inputs=(up,), key=(p,))
