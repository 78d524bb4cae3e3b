"""``read_tfrecord``: the records of a TFRecord file, CRC-checked.

The framing, as TensorFlow writes it: for each record, its length (uint64, little
endian), the masked CRC-32C of those 8 bytes, the data, and the masked CRC-32C of the
data. CRC-32C comes from the ``google-crc32c`` package (a C implementation, extra
``fast``) when it is installed, else from the table-driven pure-Python fallback below
(correct, about 100x slower: pass ``check_crc=False`` to skip checking when speed matters
more than detecting corruption).
"""

from __future__ import annotations

import os
import struct
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from aioflow._calls.maps import ErrorPolicy
from aioflow._core.base import pipeline_of
from aioflow._core.run import CHUNK_MAX, ChunkIter, Ctx
from aioflow._state.logs import SeekLog
from aioflow.errors import BadInput
from aioflow.io._streams import Buffered, bad_input, check_compression, is_url, open_stream, reader

if TYPE_CHECKING:
    from aioflow.pipeline import Pipeline

__all__ = ["crc32c", "crc32c_py", "masked_crc", "read_tfrecord"]


def _table() -> list[int]:
    table = []
    for i in range(256):
        c = i
        for _ in range(8):
            c = (c >> 1) ^ 0x82F63B78 if c & 1 else c >> 1
        table.append(c)
    return table


_TABLE = _table()


def crc32c_py(data: bytes | bytearray | memoryview) -> int:
    """CRC-32C (Castagnoli) of ``data``, in pure Python (the fallback).

    Example:
        >>> hex(crc32c_py(b"123456789"))
        '0xe3069283'
    """
    crc = 0xFFFFFFFF
    t = _TABLE
    for b in bytes(data):
        crc = t[(crc ^ b) & 0xFF] ^ (crc >> 8)
    return crc ^ 0xFFFFFFFF


def _fast() -> Callable[[Any], int] | None:
    try:
        import google_crc32c
    except ImportError:
        return None
    if getattr(google_crc32c, "implementation", "c") != "c":
        return None  # its own fallback is pure Python too
    value: Callable[[Any], int] = google_crc32c.value
    return value


#: CRC-32C of a bytes-like object: the C implementation when installed, else pure Python.
crc32c: Callable[[Any], int] = _fast() or crc32c_py


def masked_crc(data: bytes | bytearray | memoryview) -> int:
    """TFRecord's masked CRC-32C: rotated right by 15 bits plus a constant."""
    crc = crc32c(data)
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


_HEAD = struct.Struct("<QI")
_U32 = struct.Struct("<I")


def _parse(buf: Buffered, check_crc: bool) -> tuple[list[bytes], str | None, int]:
    """Up to ``CHUNK_MAX`` complete records from the buffer (consumed), and a problem
    with the byte offset of its record, if the next record is corrupt."""
    b, pos, end = buf.buf, buf.pos, len(buf.buf)
    base = buf.offset - pos  # file offset of b[0]
    out: list[bytes] = []
    problem = None
    at = 0
    while end - pos >= 12 and len(out) < CHUNK_MAX:
        length, lcrc = _HEAD.unpack_from(b, pos)
        if check_crc and masked_crc(bytes(b[pos : pos + 8])) != lcrc:
            problem, at = "corrupt record length (CRC mismatch)", base + pos
            break
        stop = pos + 12 + length + 4
        if stop > end:
            break
        data = bytes(b[pos + 12 : stop - 4])
        if check_crc and masked_crc(data) != _U32.unpack_from(b, stop - 4)[0]:
            problem, at = "corrupt record data (CRC mismatch)", base + pos
            pos = stop  # the length was good: the next record starts after this one
            break
        out.append(data)
        pos = stop
    buf.offset = base + pos
    buf.pos = pos
    return out, problem, at


def read_tfrecord(
    path: str | os.PathLike[str],
    *,
    compression_type: str | None = None,
    check_crc: bool = True,
    on_error: str | int = "raise",
) -> Pipeline[bytes]:
    """The records of a TFRecord file, as raw ``bytes`` (tf.data ``TFRecordDataset``).

    Both CRCs of every record are checked (``check_crc=False`` skips that). A file cut
    short, or a record whose length field is corrupt, raises ``af.BadInput`` naming the
    file and the record's byte offset; a record whose data fails its CRC too. With
    ``on_error="skip"`` a record with bad data is skipped and reading goes on; when the
    framing itself is lost (bad length, truncated file) the rest of the file is skipped.
    Either is counted in the stage's stats and logged once; every good record arrives.
    ``compression_type`` ("GZIP" or "ZLIB") reads compressed files, as tf.data does
    (offsets are then in the decompressed stream); a compressed stream that is cut or
    corrupt is ``BadInput`` too, and ``skip`` keeps the records before it.

    Example:
        >>> import os, struct, tempfile, aioflow as af
        >>> from aioflow.io.tfrecord import masked_crc
        >>> path = os.path.join(tempfile.mkdtemp(), "a.tfrecord")
        >>> with open(path, "wb") as f:
        ...     for rec in (b"one", b"two"):
        ...         n = struct.pack("<Q", len(rec))
        ...         _ = f.write(n + struct.pack("<I", masked_crc(n)) + rec)
        ...         _ = f.write(struct.pack("<I", masked_crc(rec)))
        >>> af.read_tfrecord(path).to_list()
        [b'one', b'two']
    """

    comp = check_compression(compression_type)

    async def gen(p: str, ctx: Ctx, policy: ErrorPolicy) -> ChunkIter:
        log = SeekLog(ctx, comp is None and not is_url(p), offset=0, index=0)
        index = log.start["index"]  # records seen, for the position of a skipped one
        async with open_stream(p, ctx, comp, log.start["offset"]) as s:
            buf = Buffered(s)
            buf.offset = log.start["offset"]
            while True:
                log.mark(offset=buf.offset, index=index)
                out, problem, at = _parse(buf, check_crc)
                index += len(out)
                out = log.drop(out)
                if out:
                    yield out
                if problem is not None:
                    err = bad_input(ctx, p, problem, offset=at)
                    if not policy.skip(err, ctx, index):
                        raise err
                    index += 1
                    if problem.startswith("corrupt record length"):
                        return  # the framing is lost: nothing after it can be trusted
                    continue
                if len(out) >= CHUNK_MAX:
                    continue
                try:
                    more = await buf.read_block()
                except BadInput as cut:  # a compressed stream cut or corrupt
                    if not policy.skip(cut, ctx, index):
                        raise
                    return  # nothing after it can be read
                if not more:
                    break
            if buf.available:
                err = bad_input(
                    ctx,
                    p,
                    f"truncated TFRecord: the file ends {buf.available} bytes into a record",
                    offset=buf.offset,
                )
                if not policy.skip(err, ctx, index):
                    raise err

    return pipeline_of(reader("read_tfrecord", path, gen, on_error=on_error, key=(check_crc, comp)))
