"""``read_npy``: the array stored in a ``.npy`` file, read without blocking the loop.

The header is parsed here (format versions 1.0, 2.0 and 3.0, as ``numpy.lib.format``
writes them); the data is read straight into the array's own buffer, so an array costs
its size once. Object arrays are refused (they would need pickle, as ``np.load`` with
its default ``allow_pickle=False``).
"""

from __future__ import annotations

import ast
import os
import struct
from typing import Any

import numpy as np

from .._calls import ErrorPolicy
from .._runtime import ChunkIter, Ctx
from ..errors import BadInput
from ..pipeline import Pipeline
from ._streams import Buffered, bad_input, open_stream, reader

__all__ = ["read_npy"]

_MAGIC = b"\x93NUMPY"


def _header(
    ctx: Ctx, path: str, raw: bytes, version: int
) -> tuple[np.dtype[Any], tuple[int, ...], bool]:
    def bad(what: str) -> BadInput:
        return bad_input(ctx, path, f"bad .npy header: {what}", offset=0)

    try:
        d = ast.literal_eval(raw.decode("utf-8" if version >= 3 else "latin1"))
    except (ValueError, SyntaxError, UnicodeDecodeError) as e:
        raise bad(str(e)) from e
    if not isinstance(d, dict) or not {"descr", "fortran_order", "shape"} <= d.keys():
        raise bad(f"{raw[:80]!r}")
    shape = d["shape"]
    if not isinstance(shape, tuple) or not all(isinstance(n, int) and n >= 0 for n in shape):
        raise bad(f"shape {shape!r}")
    try:
        dtype = np.lib.format.descr_to_dtype(d["descr"])
    except (TypeError, ValueError) as e:
        raise bad(f"descr {d['descr']!r}") from e
    if dtype.hasobject:
        raise bad("object arrays are not read (they need pickle)")
    return dtype, shape, bool(d["fortran_order"])


async def load_npy(path: str, ctx: Ctx) -> np.ndarray[Any, Any]:
    """Read one ``.npy`` file (``BadInput`` naming the offset if it is truncated)."""
    async with open_stream(path, ctx) as s:
        buf = Buffered(s)
        if not await buf.fill(10) or buf.buf[:6] != _MAGIC:
            if buf.available < 10 and buf.buf[: buf.available] == _MAGIC[: buf.available]:
                raise bad_input(ctx, path, "truncated .npy header", offset=buf.available)
            raise bad_input(ctx, path, "not a .npy file (bad magic)", offset=0)
        major = buf.buf[6]
        if major == 1:
            (hlen,) = struct.unpack_from("<H", buf.buf, 8)
            start = 10
        elif major in (2, 3):
            if not await buf.fill(12):
                raise bad_input(ctx, path, "truncated .npy header", offset=buf.available)
            (hlen,) = struct.unpack_from("<I", buf.buf, 8)
            start = 12
        else:
            raise bad_input(ctx, path, f"unknown .npy format version {major}", offset=6)
        if not await buf.fill(start + hlen):
            raise bad_input(ctx, path, "truncated .npy header", offset=buf.available)
        dtype, shape, fortran = _header(ctx, path, bytes(buf.buf[start : start + hlen]), major)
        buf.skip(start + hlen)
        count = 1
        for n in shape:
            count *= n
        nbytes = count * dtype.itemsize
        flat = np.empty(nbytes, np.uint8)
        mv = flat.data
        got = min(nbytes, buf.available)
        mv[:got] = buf.buf[buf.pos : buf.pos + got]
        buf.buf = bytearray()  # the header block is no longer needed
        while got < nbytes:
            data = await s.read(nbytes - got)
            if not data:
                raise bad_input(
                    ctx,
                    path,
                    f"truncated .npy data: {got} of {nbytes} bytes",
                    offset=buf.offset + got,
                )
            mv[got : got + len(data)] = data
            got += len(data)
    arr = flat.view(dtype)
    return arr.reshape(shape[::-1]).T if fortran else arr.reshape(shape)


def read_npy(path: str | os.PathLike[str], *, on_error: str | int = "raise") -> Pipeline[Any]:
    """One item: the numpy array stored in a ``.npy`` file (dtype, shape and order kept).

    A truncated or malformed file raises ``af.BadInput`` naming the file and the byte
    offset; with ``on_error="skip"`` the file gives no item instead (counted, logged once).

    Example:
        >>> import os, tempfile, numpy as np, aioflow as af
        >>> path = os.path.join(tempfile.mkdtemp(), "a.npy")
        >>> np.save(path, np.arange(6, dtype=np.int16).reshape(2, 3))
        >>> af.read_npy(path).to_list()[0]
        array([[0, 1, 2],
               [3, 4, 5]], dtype=int16)
    """

    async def gen(p: str, ctx: Ctx, policy: ErrorPolicy) -> ChunkIter:
        try:
            arr = await load_npy(p, ctx)
        except BadInput as err:
            if policy.skip(err, ctx, 0):
                return
            raise
        yield [arr]

    return reader("read_npy", path, gen, on_error=on_error, card=1 if on_error == "raise" else -2)
