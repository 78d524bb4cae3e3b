"""``read_npy``: the array stored in a ``.npy`` file, read without blocking the loop.

The header is parsed here (format versions 1.0, 2.0 and 3.0, as ``numpy.lib.format``
writes them) and the data is read straight into the array's own buffer, so an array costs
its size once. A local file is read by one call in the loop's thread pool (open, header,
data, close): the item is the whole array anyway, and one hop per file instead of three
is what makes thousands of small files fast. A URL is read through fsspec, then parsed.
Object arrays are refused (they would need pickle, as ``np.load`` with its default
``allow_pickle=False``). The header, a Python dict literal, is parsed by ``_literal`` here,
not by ``ast.literal_eval``: CPython 3.11's AST constructor keeps its recursion depth in
state that threads share, so ``literal_eval`` in several threads at once can fail with
``SystemError: AST constructor recursion depth mismatch``. A shape whose data is larger
than the file is ``BadInput`` before anything is allocated.
"""

from __future__ import annotations

import asyncio
import io
import os
import re
import struct
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np

from aioflow._calls.maps import ErrorPolicy
from aioflow._core.base import pipeline_of
from aioflow._core.run import UNKNOWN_CARD, ChunkIter, Ctx
from aioflow.errors import BadInput
from aioflow.io._streams import bad_input, is_url, local_path, local_read, reader
from aioflow.io.files import read_all

if TYPE_CHECKING:
    from aioflow.pipeline import Pipeline

__all__ = ["load_npy", "parse_npy", "read_npy"]

_MAGIC = b"\x93NUMPY"


_TOKEN = re.compile(
    r"""\s*(?:(?P<str>'(?:[^'\\]|\\.)*'|"(?:[^"\\]|\\.)*")|(?P<int>-?\d+)(?![\w.])"""
    r"""|(?P<name>True|False|None)\b|(?P<punct>[{}()\[\]:,]))"""
)
_NAMES = {"True": True, "False": False, "None": None}
_CLOSE = {"{": "}", "(": ")", "[": "]"}
_ESCAPES = {"n": "\n", "t": "\t", "r": "\r", "0": "\0", "\\": "\\", "'": "'", '"': '"'}


def _unquote(s: str) -> str:
    """The value of a quoted string token (the escapes ``repr`` writes)."""
    body, out, i = s[1:-1], [], 0
    while i < len(body):
        c, i = body[i], i + 1
        if c != "\\":
            out.append(c)
            continue
        e, i = body[i], i + 1
        if e in "xu":  # \xhh, \uhhhh
            n = 2 if e == "x" else 4
            out.append(chr(int(body[i : i + n], 16)))
            i += n
        elif e in _ESCAPES:
            out.append(_ESCAPES[e])
        else:
            raise ValueError(f"escape \\{e}")
    return "".join(out)


def _literal(text: str) -> Any:
    """The value of a .npy header: dicts, lists, tuples, str, int, True/False/None."""
    pos = 0

    def token() -> tuple[str, str]:
        nonlocal pos
        m = _TOKEN.match(text, pos)
        if m is None or m.lastgroup is None:
            raise ValueError(f"unexpected {text[pos : pos + 20]!r}")
        pos = m.end()
        return m.lastgroup, m.group(m.lastgroup)

    def value(kind: str, tok: str) -> Any:
        if kind == "str":
            return _unquote(tok)
        if kind == "int":
            return int(tok)
        if kind == "name":
            return _NAMES[tok]
        if tok not in _CLOSE:
            raise ValueError(f"unexpected {tok!r}")
        items: list[Any] = []
        commas = 0
        while True:
            kind, t = token()
            if t == _CLOSE[tok] and kind == "punct":
                break
            items.append(value(kind, t))
            if tok == "{":
                if token()[1] != ":":
                    raise ValueError("':' expected")
                items.append(value(*token()))
            kind, t = token()
            if t == _CLOSE[tok]:
                break
            if t != ",":
                raise ValueError(f"',' expected, got {t!r}")
            commas += 1
        if tok == "{":
            return dict(zip(items[::2], items[1::2], strict=True))
        if tok == "(":
            return items[0] if len(items) == 1 and not commas else tuple(items)
        return items

    out = value(*token())
    if text[pos:].strip():
        raise ValueError(f"unexpected {text[pos : pos + 20]!r}")
    return out


#: Parsed headers by their bytes: files of one dataset share a header (dtype, shape), and
#: parsing it is half the cost of reading a small file. Bounded: cleared when full.
_HEADERS: dict[tuple[bytes, int], tuple[np.dtype[Any], tuple[int, ...], bool]] = {}
_HEADERS_MAX = 256


def _header(path: str, raw: bytes, version: int) -> tuple[np.dtype[Any], tuple[int, ...], bool]:
    """The dtype, shape and order of a header (``BadInput`` naming ``path`` if bad)."""
    got = _HEADERS.get((raw, version))
    if got is None:
        got = _parse_header(path, raw, version)
        if len(_HEADERS) >= _HEADERS_MAX:
            _HEADERS.clear()
        _HEADERS[(raw, version)] = got
    return got


def _parse_header(
    path: str, raw: bytes, version: int
) -> tuple[np.dtype[Any], tuple[int, ...], bool]:
    def bad(what: str) -> BadInput:
        return bad_input(None, path, f"bad .npy header: {what}", offset=0)

    try:
        d = _literal(raw.decode("utf-8" if version >= 3 else "latin1"))
    except (ValueError, IndexError, KeyError, UnicodeDecodeError) as e:
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


def _read_exactly(f: io.BufferedIOBase, n: int) -> bytes:
    data = f.read(n)
    while len(data) < n:
        more = f.read(n - len(data))
        if not more:
            break
        data += more
    return data


def parse_npy(f: io.BufferedIOBase, path: str) -> np.ndarray[Any, Any]:
    """Read one array from a binary file object (``BadInput`` naming the offset if cut)."""
    head = _read_exactly(f, 10)
    if len(head) < 10 or head[:6] != _MAGIC:
        if _MAGIC.startswith(head[:6]):  # the file ends inside the header
            raise bad_input(None, path, "truncated .npy header", offset=len(head))
        raise bad_input(None, path, "not a .npy file (bad magic)", offset=0)
    major = head[6]
    if major == 1:
        (hlen,) = struct.unpack_from("<H", head, 8)
        start = 10
    elif major in (2, 3):
        more = _read_exactly(f, 2)
        head += more
        if len(more) < 2:
            raise bad_input(None, path, "truncated .npy header", offset=len(head))
        (hlen,) = struct.unpack_from("<I", head, 8)
        start = 12
    else:
        raise bad_input(None, path, f"unknown .npy format version {major}", offset=6)
    raw = _read_exactly(f, hlen)
    if len(raw) < hlen:
        raise bad_input(None, path, "truncated .npy header", offset=start + len(raw))
    dtype, shape, fortran = _header(path, raw, major)
    count = 1
    for n in shape:
        count *= n
    nbytes = count * dtype.itemsize
    left = _remaining(f)
    if left is not None and nbytes > left:
        raise bad_input(
            None,
            path,
            f"truncated .npy data: shape {shape} of {dtype} needs {nbytes} bytes,"
            f" the file has {left}",
            offset=start + hlen + left,  # where the file ends, as for a cut read
        )
    flat = np.empty(nbytes, np.uint8)
    mv = flat.data
    got = 0
    while got < nbytes:
        k = f.readinto(mv[got:])
        if not k:
            raise bad_input(
                None,
                path,
                f"truncated .npy data: {got} of {nbytes} bytes",
                offset=start + hlen + got,
            )
        got += k
    arr = flat.view(dtype)
    return arr.reshape(shape[::-1]).T if fortran else arr.reshape(shape)


def _remaining(f: io.BufferedIOBase) -> int | None:
    """Bytes left in ``f`` if it can say (a local file, a BytesIO), else None."""
    try:
        size = os.fstat(f.fileno()).st_size
    except (OSError, AttributeError, io.UnsupportedOperation):
        if not isinstance(f, io.BytesIO):
            return None
        size = f.getbuffer().nbytes
    return max(size - f.tell(), 0)


def _load_local(path: str) -> np.ndarray[Any, Any]:
    with open(path, "rb") as f:
        return parse_npy(f, path)


async def load_npy(path: str, ctx: Ctx) -> np.ndarray[Any, Any]:
    """Read one ``.npy`` file, local or remote, without blocking the loop."""
    try:
        if is_url(path):
            return parse_npy(io.BytesIO(await read_all(path, ctx)), path)
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(None, _load_local, local_path(path))
    except BadInput as e:
        e.stage = ctx.name
        raise


def read_npy(path: str | os.PathLike[str], *, on_error: str | int = "raise") -> Pipeline[Any]:
    """One item: the numpy array stored in a ``.npy`` file (dtype, shape and order kept).

    A truncated or malformed file raises ``af.BadInput`` naming the file and the byte
    offset; with ``on_error="skip"`` the file gives no item instead (counted, logged once).
    The array is writable, as ``np.load``'s are.

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

    card = 1 if on_error == "raise" else UNKNOWN_CARD
    node = reader("read_npy", path, gen, on_error=on_error, card=card, task=False, load=_load_local)
    return pipeline_of(node)


def _direct_load(path: Any) -> Callable[[], np.ndarray[Any, Any]] | None:
    """``read_npy(path)``'s blocking read of its array, when ``path`` is a local path
    (else None). ``interleave(read_npy)`` runs these in batches on the run's threads and
    makes a file's ``read_npy`` pipeline only if its read fails (it raises there)."""
    if not isinstance(path, str | os.PathLike):
        return None
    try:
        p = os.fspath(path)
    except Exception:
        return None
    return local_read(_load_local, p) if isinstance(p, str) else None


read_npy.direct_load = _direct_load  # type: ignore[attr-defined]
