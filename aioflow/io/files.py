"""Files and text: ``list_files``, ``read_lines``, ``read_bytes`` (``read_jsonl`` is in ``jsonl``).

The text readers split blocks of bytes at newlines and decode a block's complete lines at
once (so the per-line work is a list operation), carrying the partial last line over to
the next block. Lines are numbered from 1 for error messages.
"""

from __future__ import annotations

import asyncio
import codecs
import errno
import glob
import os
import random
from collections.abc import AsyncIterator, Sequence
from typing import TYPE_CHECKING, Any

from aioflow._calls.maps import ErrorPolicy
from aioflow._core.base import pipeline_of
from aioflow._core.run import CHUNK_MAX, ChunkIter, Ctx, Hints, Node, Opener, aclosing
from aioflow._state.logs import COUNTED, SeekLog, counted_source
from aioflow._state.splits import FileSplits
from aioflow.errors import PipelineError
from aioflow.io._streams import (
    BLOCK_MAX,
    BLOCK_MIN,
    ByteStream,
    bad_input,
    check_compression,
    check_path,
    is_url,
    local_path,
    open_stream,
    reader,
)
from aioflow.io.cache import ShardCache, cached_files, check_cache
from aioflow.io.remote import glob_url

if TYPE_CHECKING:
    from aioflow.pipeline import Pipeline

__all__ = ["chunked", "list_files", "read_bytes", "read_lines"]


def chunked(items: list[Any]) -> list[list[Any]]:
    """``items`` cut into chunks of at most ``CHUNK_MAX`` (none when empty)."""
    if len(items) <= CHUNK_MAX:
        return [items] if items else []
    return [items[i : i + CHUNK_MAX] for i in range(0, len(items), CHUNK_MAX)]


# -- list_files -------------------------------------------------------------------------
def _glob(pattern: str) -> dict[str, dict[str, Any]]:
    """The files ``pattern`` matches, with what the listing said of each (remote ones)."""
    if is_url(pattern):
        return glob_url(pattern)
    return {p: {} for p in glob.glob(pattern, recursive=True) if os.path.isfile(p)}


def list_files(
    patterns: str | os.PathLike[str] | Sequence[str | os.PathLike[str]],
    *,
    shuffle: bool = False,
    seed: int | None = None,
    cache_dir: str | os.PathLike[str] | None = None,
    cache_limit: int | None = None,
    cache_ahead: int = 2,
) -> Pipeline[str]:
    """The paths of the files matching glob pattern(s), sorted (or shuffled per epoch).

    ``patterns`` is one pattern or a list; ``**`` matches directories recursively, and a
    URL pattern (``memory://data/*.txt``, ``s3://bucket/train-*``) is globbed by fsspec
    where the file system supports it. The patterns are expanded once, when the pipeline
    is described (as tf.data's ``list_files``), so ``len()`` is known; a file matched by
    two patterns is listed once. A pattern that matches no file raises
    ``FileNotFoundError`` naming the pattern. ``shuffle=True`` shuffles the list anew
    each epoch; with a ``seed`` the sequence of orders is the same on every run.

    ``cache_dir``: remote files are cached there and listed by their local paths, each
    downloaded once (``cache_ahead`` ahead of the one read), checked, and renamed whole
    into place; later epochs read them without asking the store. Past ``cache_limit``
    bytes the least recently used are deleted, never one in use (``aioflow.io.cache``).

    Example:
        >>> import os, tempfile, aioflow as af
        >>> d = tempfile.mkdtemp()
        >>> for n in "ba":
        ...     open(os.path.join(d, n + ".txt"), "w").close()
        >>> [os.path.basename(p) for p in af.list_files(os.path.join(d, "*.txt"))]
        ['a.txt', 'b.txt']
    """
    if isinstance(patterns, str | os.PathLike):
        pats = [os.fspath(patterns)]
    else:
        pats = [check_path(p, "list_files") for p in patterns]
    if not pats:
        raise PipelineError("list_files needs at least one pattern")
    cache_at = check_cache(cache_dir, cache_limit, cache_ahead)
    found: dict[str, dict[str, Any]] = {}
    for pat in pats:
        matched = _glob(pat)
        if not matched:
            raise FileNotFoundError(errno.ENOENT, "no file matches the pattern", pat)
        found.update(matched)
    files = sorted(found)
    remote = {f: found[f] for f in files if is_url(f)}

    async def gen(ctx: Ctx) -> ChunkIter:
        order = files
        if shuffle:
            # a seeded shuffle is reproducible and differs per epoch (reshuffle_each_iteration)
            rng = random.Random(None if seed is None else seed * 1_000_003 + ctx.open_index)
            order = files.copy()
            rng.shuffle(order)
        start = counted_source(ctx) if not shuffle or seed is not None else 0
        if cache_at is not None and remote:
            cache = ShardCache(cache_at, cache_limit, remote)  # the URLs' local copies
            async with aclosing(cached_files(cache, order[start:], cache_ahead, ctx)) as it:
                async for c in it:
                    yield c
            return
        for c in chunked(order[start:]):
            yield c

    def build(ctx: Ctx, inputs: Sequence[Opener]) -> ChunkIter:
        return gen(ctx)

    n = len(files)
    key = (tuple(pats), shuffle, seed, cache_at, cache_limit, cache_ahead)
    # a cached listing is not cut into splits: a split would list the URL, not the cache
    splits = FileSplits(files, shuffle, seed) if cache_at is None or not remote else None
    card = lambda _: n  # noqa: E731
    node = Node(
        "list_files", build, card=card, task=True, key=key, resume=COUNTED,
        hints=Hints(splits=splits),
    )  # fmt: skip
    return pipeline_of(node)


# -- text lines -------------------------------------------------------------------------
class _Undecodable:
    """A line that did not decode (only made on the slow path of a block with bad bytes)."""

    __slots__ = ("exc",)

    def __init__(self, exc: UnicodeDecodeError) -> None:
        self.exc = exc


def _decode_lines(seg: bytes, encoding: str) -> tuple[list[Any], bool]:
    """The lines of ``seg`` (no trailing newlines; ``\\r\\n`` ends a line too)."""
    try:
        text = seg.decode(encoding)
    except UnicodeDecodeError:
        lines: list[Any] = []
        for raw in seg.split(b"\n"):
            try:
                s = raw.decode(encoding)
            except UnicodeDecodeError as e:
                lines.append(_Undecodable(e))
                continue
            lines.append(s[:-1] if s.endswith("\r") else s)
        return lines, True
    lines = text.split("\n")
    if "\r" in text:
        lines = [s[:-1] if s.endswith("\r") else s for s in lines]
    return lines, False


async def _line_blocks(
    path: str, ctx: Ctx, encoding: str, compression: str | None, log: SeekLog
) -> AsyncIterator[tuple[int, list[Any], bool]]:
    """``(number of its first line, lines, has undecodable lines)`` for each block.

    Before each block, ``log`` is told where it starts (byte offset and line number).
    """
    encoding, bom = _codec(encoding)
    offset, lineno = log.start["offset"], log.start["line"]
    bom = bom and offset == 0  # a resumed read starts past the BOM
    async with open_stream(path, ctx, compression, offset) as s:
        rest = bytearray()
        block = BLOCK_MIN
        while True:
            data = await s.read(block)
            if bom:  # utf-8-sig: a BOM at the start of the file is dropped
                data, dropped = await _drop_bom(s, data)
                offset += dropped
                bom = False
            if block < BLOCK_MAX:
                block *= 2
            if not data:
                if rest:  # the last line has no newline
                    lines, bad = _decode_lines(bytes(rest), encoding)
                    log.mark(offset=offset, line=lineno)
                    yield lineno, lines, bad
                return
            cut = data.rfind(b"\n")
            if cut < 0:
                rest += data
                continue
            if rest:
                rest += data[:cut]
                seg = bytes(rest)
            else:
                seg = data[:cut]
            rest = bytearray(data[cut + 1 :])
            lines, bad = _decode_lines(seg, encoding)
            log.mark(offset=offset, line=lineno)
            yield lineno, lines, bad
            lineno += len(lines)
            offset += len(seg) + 1


def _codec(encoding: str) -> tuple[str, bool]:
    """The codec blocks are decoded with, and whether a leading BOM is dropped first.

    ``utf-8-sig`` decodes block by block as ``utf-8`` (its BOM is at the file's start only).
    """
    if codecs.lookup(encoding).name == "utf-8-sig":
        return "utf-8", True
    return encoding, False


async def _drop_bom(s: ByteStream, data: bytes) -> tuple[bytes, int]:
    """The data without a leading UTF-8 BOM, and how many bytes were dropped."""
    while len(data) < len(codecs.BOM_UTF8) and data:  # a first read of 1 or 2 bytes
        more = await s.read(BLOCK_MIN)
        if not more:
            break
        data += more
    if data.startswith(codecs.BOM_UTF8):
        return data[len(codecs.BOM_UTF8) :], len(codecs.BOM_UTF8)
    return data, 0


def _check_encoding(encoding: str) -> str:
    if "\n".encode(_codec(encoding)[0]) != b"\n":
        raise PipelineError(f"read_lines needs an ASCII-compatible encoding, got {encoding!r}")
    return encoding


def read_lines(
    path: str | os.PathLike[str],
    *,
    encoding: str = "utf-8",
    compression_type: str | None = None,
    on_error: str | int = "raise",
) -> Pipeline[str]:
    """The lines of a text file, without their newline (tf.data ``TextLineDataset``).

    ``\\n`` and ``\\r\\n`` end a line; a last line without a newline is kept; an empty
    file has no lines. The file is read in blocks (at most 1 MiB plus one line held at
    once). A line that does not decode raises ``af.BadInput`` naming ``path:line``, or is
    skipped with ``on_error="skip"`` (or an int max_failures). A missing file raises
    ``FileNotFoundError``; a URL is read through fsspec (extra ``remote``).
    ``compression_type`` ("GZIP" or "ZLIB", as in tf.data) decompresses as it reads.
    ``encoding="utf-8-sig"`` drops a byte-order mark at the start of the file.

    Example:
        >>> import pathlib, tempfile, aioflow as af
        >>> path = pathlib.Path(tempfile.mkdtemp(), "a.txt")
        >>> _ = path.write_bytes(b"first\\nsecond\\r\\nlast")
        >>> af.read_lines(path).to_list()
        ['first', 'second', 'last']
    """
    _check_encoding(encoding)
    comp = check_compression(compression_type)

    async def gen(p: str, ctx: Ctx, policy: ErrorPolicy) -> ChunkIter:
        log = SeekLog(ctx, comp is None and not is_url(p), offset=0, line=1)
        async for lineno, lines, bad in _line_blocks(p, ctx, encoding, comp, log):
            if bad:
                good: list[Any] = []
                for i, s in enumerate(lines):
                    if isinstance(s, _Undecodable):
                        err = bad_input(ctx, p, f"not {encoding}: {s.exc}", line=lineno + i)
                        if policy.skip(err, ctx, lineno + i - 1):
                            continue
                        for c in chunked(log.drop(good)):
                            yield c
                        raise err from s.exc
                    good.append(s)
                lines = good
            for c in chunked(log.drop(lines)):
                yield c

    return pipeline_of(reader("read_lines", path, gen, on_error=on_error, key=(encoding, comp)))


# -- whole files ------------------------------------------------------------------------
def _read_local(path: str) -> bytes:
    with open(path, "rb") as f:
        return f.read()


async def read_all(path: str, ctx: Ctx) -> bytes:
    """The whole content of a file (for readers whose item is the whole file).

    A local file is read by one call in the run's thread pool (open, read, close): one
    hop per file instead of three, which is what matters for thousands of small files.
    """
    if not is_url(path):
        pool = ctx.run.thread_pool()  # not the loop's: a read that never returns is abandoned
        return await asyncio.get_running_loop().run_in_executor(pool, _read_local, local_path(path))
    async with open_stream(path, ctx) as s:
        parts = []
        while True:
            data = await s.read(BLOCK_MAX)
            if not data:
                break
            parts.append(data)
    return parts[0] if len(parts) == 1 else b"".join(parts)


def read_bytes(path: str | os.PathLike[str]) -> Pipeline[bytes]:
    """One item: the whole content of the file, as ``bytes``.

    The reader for small files (images, audio clips, serialized samples), typically
    over ``list_files`` with ``interleave`` or ``flat_map``.

    Example:
        >>> import pathlib, tempfile, aioflow as af
        >>> path = pathlib.Path(tempfile.mkdtemp(), "a.bin")
        >>> _ = path.write_bytes(b"\\x00\\x01")
        >>> af.read_bytes(path).to_list()
        [b'\\x00\\x01']
    """

    async def gen(p: str, ctx: Ctx, policy: ErrorPolicy) -> ChunkIter:
        yield [await read_all(p, ctx)]

    return pipeline_of(reader("read_bytes", path, gen, card=1, task=False))
