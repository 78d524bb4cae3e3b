"""``read_tar``: WebDataset-style samples from a tar file, read as a stream.

The tar is parsed block by block here (``tarfile.TarInfo.frombuf`` decodes one 512-byte
header; GNU long names and pax headers are applied to the member they precede), so it is
never seeked and never held whole: at most one sample's members are in memory.

WebDataset's convention: a member's key is its path up to the first dot of its file
name, its extension the rest (``shard/000123.seg.png`` -> ``shard/000123``, ``seg.png``);
consecutive members with the same key make one sample, a dict ``{"__key__": key,
extension: bytes, ...}`` (extensions lower-cased). Members without a dot in their file
name, directories and links are left out, as WebDataset does.
"""

from __future__ import annotations

import os
import re
import tarfile
from typing import TYPE_CHECKING, Any

from aioflow._calls.maps import ErrorPolicy
from aioflow._core.base import pipeline_of
from aioflow._core.run import CHUNK_MAX, ChunkIter, Ctx
from aioflow.errors import BadInput
from aioflow.io._streams import Buffered, bad_input, check_compression, open_stream, reader

if TYPE_CHECKING:
    from aioflow.pipeline import Pipeline

__all__ = ["read_tar", "split_key"]

_BLOCK = 512
_ZERO = bytes(_BLOCK)
_KEY = re.compile(r"^((?:.*/|)[^.]+)[.]([^/]*)$")  # webdataset's base_plus_ext
_META = {tarfile.XHDTYPE, tarfile.XGLTYPE, tarfile.SOLARIS_XHDTYPE, tarfile.GNUTYPE_LONGLINK}


def split_key(name: str) -> tuple[str, str] | None:
    """``(key, extension)`` of a member name, WebDataset's way (None without a dot).

    Example:
        >>> split_key("d/000123.seg.png"), split_key("README")
        (('d/000123', 'seg.png'), None)
    """
    m = _KEY.match(name)
    return (m.group(1), m.group(2)) if m else None


def _pax(data: bytes) -> dict[str, str]:
    """The records of a pax extended header: ``"%d %s=%s\\n"`` (ValueError if malformed)."""
    out: dict[str, str] = {}
    pos = 0
    while pos < len(data) and data[pos] != 0:
        sp = data.index(b" ", pos)
        n = int(data[pos:sp])
        if n <= sp - pos or pos + n > len(data) or data[pos + n - 1] != 0x0A:
            raise ValueError(f"a record of length {n}")  # 0 or negative would never end
        k, _, v = data[sp + 1 : pos + n - 1].partition(b"=")
        out[k.decode("utf-8", "surrogateescape")] = v.decode("utf-8", "surrogateescape")
        pos += n
    return out


def _key_of(name: str) -> str | None:
    split = split_key(name)
    return split[0] if split else None


class _Members:
    """The members of a tar stream, header by header; a GNU long name or a pax header
    applies to the member after it."""

    def __init__(self, buf: Buffered) -> None:
        self.buf = buf
        self.broken: BadInput | None = None  # a compressed stream that is cut or corrupt
        self.problem: str | None = None  # why the archive ended early
        self.cut: str | None = None  # the name of a member cut short
        self.longname: str | None = None
        self.pax: dict[str, str] = {}

    async def _fill(self, n: int) -> bool:
        try:
            return await self.buf.fill(n)
        except BadInput as e:
            self.broken = e
            return False

    async def next(self) -> tuple[str, bytes] | bool:
        """The next regular member ``(name, data)``; True for a header to pass over
        (metadata, a directory, a link); False at the end, with ``problem`` if early."""
        buf = self.buf
        if not await self._fill(_BLOCK):
            if buf.available or self.broken is not None:
                self.problem = f"truncated tar: a {buf.available}-byte partial header"
            return False
        head = bytes(buf.buf[buf.pos : buf.pos + _BLOCK])
        if head == _ZERO:
            return False  # end-of-archive marker
        try:
            info = tarfile.TarInfo.frombuf(head, "utf-8", "surrogateescape")
        except tarfile.HeaderError as e:
            self.problem = f"bad tar header ({e})"
            return False
        buf.skip(_BLOCK)
        try:
            size = int(self.pax.get("size", info.size))
        except ValueError:
            self.problem = f"bad size {self.pax['size']!r} in a pax header"
            return False
        if size < 0:  # base-256 or pax: a negative size would read backwards
            self.problem = f"bad member size {size}"
            return False
        if not await self._fill(size):
            self.cut = self.longname or self.pax.get("path") or info.name
            self.problem = (
                f"truncated tar: member {info.name!r} has {size} bytes,"
                f" the file ends after {buf.available}"
            )
            return False
        data = buf.take(size)
        buf.skip(min(-(-size // _BLOCK) * _BLOCK - size, buf.available))
        return self._apply(info, data)

    def _apply(self, info: tarfile.TarInfo, data: bytes) -> tuple[str, bytes] | bool:
        if info.type == tarfile.GNUTYPE_LONGNAME:
            self.longname = data.rstrip(b"\0").decode("utf-8", "surrogateescape")
            return True
        if info.type in _META:
            if info.type != tarfile.XGLTYPE and info.type != tarfile.GNUTYPE_LONGLINK:
                try:
                    self.pax = _pax(data)
                except ValueError as e:
                    self.problem = f"bad pax header ({e})"
                    return False
            return True
        name = self.longname or self.pax.get("path") or info.name
        self.longname, self.pax = None, {}
        return (name, data) if info.isreg() else True


def read_tar(
    path: str | os.PathLike[str],
    *,
    compression_type: str | None = None,
    on_error: str | int = "raise",
) -> Pipeline[Any]:
    """WebDataset samples from a tar file: dicts of ``bytes`` keyed by extension.

    A file cut short, or a header that does not parse, raises ``af.BadInput`` naming the
    file and the byte offset of the member's header; a member name repeated within one
    sample too. With ``on_error="skip"`` a sample with a repeated member is dropped and
    reading goes on; after a broken header or a truncation the rest of the file is
    dropped (and the sample cut short with it; a sample already complete before a member
    of the next one is cut still comes out). A malformed pax record or a negative member
    size is a broken header. Either is counted and logged once.
    ``compression_type="GZIP"`` reads a ``.tar.gz`` shard as a stream.

    Example:
        >>> import io, os, tarfile, tempfile, aioflow as af
        >>> path = os.path.join(tempfile.mkdtemp(), "shard.tar")
        >>> with tarfile.open(path, "w") as tf:
        ...     for name, data in [("a.txt", b"hi"), ("a.cls", b"1"), ("b.txt", b"yo")]:
        ...         info = tarfile.TarInfo(name)
        ...         info.size = len(data)
        ...         tf.addfile(info, io.BytesIO(data))
        >>> af.read_tar(path).to_list()
        [{'__key__': 'a', 'txt': b'hi', 'cls': b'1'}, {'__key__': 'b', 'txt': b'yo'}]
    """

    comp = check_compression(compression_type)

    def gen(p: str, ctx: Ctx, policy: ErrorPolicy) -> ChunkIter:
        return _samples(p, ctx, policy, comp)

    return pipeline_of(reader("read_tar", path, gen, on_error=on_error, key=(comp,)))


async def _samples(p: str, ctx: Ctx, policy: ErrorPolicy, comp: str | None) -> ChunkIter:
    """The samples of the tar file ``p``, in chunks (see ``read_tar``)."""
    out: list[dict[str, Any]] = []
    key: str | None = None
    sample: dict[str, Any] | None = None
    index = 0  # samples seen
    async with open_stream(p, ctx, comp) as s:
        tar = _Members(Buffered(s))
        while True:
            at = tar.buf.offset  # where the next header starts
            if out and tar.buf.available < _BLOCK:
                yield out  # before waiting for the next read
                out = []
            member = await tar.next()
            if member is True:
                continue
            if member is False:
                if tar.cut is not None and sample is not None and _key_of(tar.cut) != key:
                    out.append(sample)  # the cut member starts another sample
                    sample = None
                break
            name, data = member
            split = split_key(name)
            if split is None:
                continue
            k, ext = split[0], split[1].lower()
            if k != key:
                if sample is not None:
                    out.append(sample)
                    index += 1
                    if len(out) >= CHUNK_MAX:
                        yield out
                        out = []
                key, sample = k, {"__key__": k}
            if sample is None:
                continue  # the rest of a dropped sample
            if ext in sample:
                err = bad_input(ctx, p, f"member {name!r} appears twice in sample {k!r}", offset=at)
                if out:
                    yield out
                    out = []
                if not policy.skip(err, ctx, index):
                    raise err
                sample = None
                continue
            sample[ext] = data
        if tar.problem is None and sample is not None:
            out.append(sample)
        if out:
            yield out
        if tar.problem is not None:
            err = tar.broken or bad_input(ctx, p, tar.problem, offset=at)
            if not policy.skip(err, ctx, index):
                raise err
