"""Record batches as items: what the columnar operators share (``ops/columnar_*.py``).

The rule: a stage whose key (``key``, ``time``, ``by``, ``on``) is a column name (a
string) and whose first input item is a ``pyarrow.RecordBatch`` or a dict of equal-length
1-D numpy arrays runs columnar: every item is a batch of rows, the stage works on the rows
with numpy kernels (no Python object per row) and emits batches of the same kind.

Here: telling a batch (``kind_of``), its columns as numpy arrays (temporal ones as int64
in their unit, ``numeric``), taking and concatenating rows of either kind, row masks
(``filter``), partitions of rows (``partition_by``), windows and groups of rows
(``windows_of``), the pieces of a resumable state. ``ops/columnar_rows.py`` has ``Rows``
(the rows a machine holds with their arrival numbers), ``ops/columnar_base.py`` ``Auto``
(the per-item or the columnar machine, picked at the first chunk) and what the columnar
machines share.

A held row is logged as a *piece* ``(PIECE, batch position, rows' indices in it, rows)``
(``_state/held.py``): a resumed stage puts its pieces back in arrival order. The rows that
leave a stage are logged as they are, one piece for all (the batch position then an array,
a row's each): nothing is copied or sorted per chunk; a state cuts a piece to the rows
that had arrived at its mark (``cut_piece``).
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from datetime import timedelta
from typing import Any

import numpy as np

from aioflow.errors import PipelineError
from aioflow.ops.event_time_core import Window

__all__ = [
    "PIECE",
    "column",
    "concat",
    "kind_of",
    "masked",
    "numeric",
    "span",
    "stable_order",
    "take",
    "windows_of",
]

PIECE = "aioflow.rows"
EMPTY = np.empty(0, np.int64)


def kind_of(x: Any) -> str | None:
    """``"arrow"`` (a ``pyarrow.RecordBatch``), ``"dict"`` (equal-length 1-D numpy arrays)
    or None (an item of the per-item path)."""
    pa = sys.modules.get("pyarrow")
    if pa is not None and isinstance(x, pa.RecordBatch):
        return "arrow"
    if isinstance(x, dict) and x:
        n = -1
        for v in x.values():
            if not isinstance(v, np.ndarray) or v.ndim < 1 or (n >= 0 and len(v) != n):
                return None
            n = len(v)
        return "dict"
    return None


def kind_checked(
    b: Any, kind: str | None, pos: int, got: str, hint: str,
    want: str = "a record batch or a dict of numpy arrays",
) -> str:  # fmt: skip
    """The kind of item ``b`` (input position ``pos``), a batch of ``kind`` when that is
    not None, else a clear ``PipelineError``: "item {pos}: {got} {its type}, not {kind or
    want}; {hint}".

    >>> kind_checked({"a": np.arange(2)}, None, 0, "got", "")
    'dict'
    """
    k = kind_of(b)
    if k is None or (kind is not None and k != kind):
        raise PipelineError(f"item {pos}: {got} {type(b).__name__}, not {kind or want}; {hint}")
    return k


def is_piece(x: Any) -> bool:
    return isinstance(x, tuple) and len(x) == 4 and isinstance(x[0], str) and x[0] == PIECE


def cut_piece(entry: Any, taken: int) -> Any:
    """The log entry ``(src, piece)`` with only the rows that arrived before input
    position ``taken`` (None: none); an entry that is not a piece of several batches as is
    (``HeldLog``'s ``cut``)."""
    p = entry[-1]
    if not is_piece(p) or np.ndim(p[1]) == 0:
        return entry
    keep = p[1] < taken
    if keep.all():
        return entry
    sel = np.flatnonzero(keep)
    if not len(sel):
        return None
    return (*entry[:-1], (PIECE, p[1][sel], p[2][sel], take(p[3], sel)))


def nrows(b: Any) -> int:
    return b.num_rows if not isinstance(b, dict) else len(next(iter(b.values())))


def column(b: Any, name: str) -> np.ndarray:
    """Column ``name`` of batch ``b`` as a numpy array (a key column holds no nulls)."""
    if isinstance(b, dict):
        if name not in b:
            raise PipelineError(f"no column {name!r} in a batch of columns {list(b)}")
        return b[name]
    i = b.schema.get_field_index(name)
    if i < 0:
        raise PipelineError(f"no column {name!r} in a batch of columns {b.schema.names}")
    col = b.column(i)
    if col.null_count:
        raise PipelineError(f"key column {name!r} has {col.null_count} null(s)")
    return as_numpy(col)


def _dtype_of(t: Any) -> np.dtype[Any] | None:
    """The numpy dtype whose values have ``t``'s bytes (a fixed-width number or time)."""
    import pyarrow as pa

    if pa.types.is_integer(t):
        return np.dtype(f"{'i' if pa.types.is_signed_integer(t) else 'u'}{t.bit_width // 8}")
    if pa.types.is_floating(t):
        return np.dtype(f"f{t.bit_width // 8}")
    if pa.types.is_timestamp(t):
        return np.dtype(f"datetime64[{t.unit}]")
    if pa.types.is_duration(t):
        return np.dtype(f"timedelta64[{t.unit}]")
    return None


def as_numpy(col: Any) -> np.ndarray:
    """A pyarrow array without nulls as a numpy array: a view of its buffer where its
    values are fixed-width numbers or times (not ``to_numpy``: that imports pandas,
    when installed, at its first call: ~0.3 s and ~30 MiB), else ``to_numpy``."""
    dt = _dtype_of(col.type)
    if dt is None or col.null_count:
        return np.asarray(col.to_numpy(zero_copy_only=False))
    buf = col.buffers()[1]
    if buf is None:
        return np.empty(0, dt)
    return np.frombuffer(buf, dt, len(col), col.offset * dt.itemsize)


def _arrow_view(a: np.ndarray, typ: Any) -> Any:
    """A contiguous numpy array as a pyarrow array of type ``typ`` sharing its memory
    (not ``pa.array``: that looks for pandas first)."""
    import pyarrow as pa

    return pa.Array.from_buffers(typ, len(a), [None, pa.py_buffer(a)])


def indices(idx: np.ndarray) -> Any:
    """Row numbers as a pyarrow int64 array sharing their memory."""
    import pyarrow as pa

    return _arrow_view(np.ascontiguousarray(idx, np.int64), pa.int64())


def stable_order(a: np.ndarray) -> np.ndarray:
    """``np.argsort(a, kind="stable")``, faster for integers whose range leaves room for
    the row numbers in an int64: ``(a - min) << bits | row`` sorted (a value sort, not an
    index sort: 5-8x faster on 64k rows), the low bits then being the order."""
    n = len(a)
    if n < 2 or a.dtype.kind not in "iub":
        return np.argsort(a, kind="stable")
    if a.dtype.kind == "b":
        a = a.view(np.uint8)
    lo, hi = int(a.min()), int(a.max())
    bits = (n - 1).bit_length()
    if (hi - lo) >> (62 - bits):
        return np.argsort(a, kind="stable")
    if a.dtype == np.uint64:
        c = (a - np.uint64(lo)).astype(np.int64)
    else:
        c = a.astype(np.int64)
        c -= lo
    c <<= bits
    c |= np.arange(n, dtype=np.int64)
    c.sort()
    c &= (1 << bits) - 1
    return c


def numeric(a: np.ndarray) -> tuple[np.ndarray, np.dtype[Any] | None]:
    """Times or keys to compare and subtract: datetime64/timedelta64 as int64 (and their
    dtype, to convert back), numbers as they are."""
    if a.dtype.kind in "mM":
        return a.view(np.int64), a.dtype
    return a, None


def span(v: Any, unit: np.dtype[Any] | None) -> Any:
    """A ``max_delay``/``gap`` in the units of a ``numeric`` column."""
    if v is None:
        return None
    if unit is not None and isinstance(v, timedelta):
        return int(
            np.timedelta64(v).astype(f"timedelta64[{np.datetime_data(unit)[0]}]").view(np.int64)
        )
    return v


def scalar(v: Any, unit: np.dtype[Any] | None) -> Any:
    """An internal time back as the column's scalar (None stays None)."""
    if v is None or unit is None:
        return v
    return np.array([v], np.int64).view(unit)[0]


def take(b: Any, idx: np.ndarray) -> Any:
    if isinstance(b, dict):
        return {k: v[idx] for k, v in b.items()}
    return b.take(indices(idx))


def slice_of(b: Any, a: int, z: int) -> Any:
    if isinstance(b, dict):
        return {k: v[a:z] for k, v in b.items()}
    return b.slice(a, z - a)


#: the names of the arrival columns a machine's held batches carry beside the stream's
EXTRA = ("\x00aioflow.seq", "\x00aioflow.src", "\x00aioflow.idx")


def with_arrival(b: Any, seq: np.ndarray, src: np.ndarray, idx: np.ndarray) -> Any:
    """Batch ``b`` with its rows' arrival (int64 arrays) as three more columns (``EXTRA``),
    so that one ``take`` moves them with the data (no copy here)."""
    if isinstance(b, dict):
        return {**b, EXTRA[0]: seq, EXTRA[1]: src, EXTRA[2]: idx}
    import pyarrow as pa

    cols = [*b.columns, indices(seq), indices(src), indices(idx)]
    return pa.RecordBatch.from_arrays(cols, names=[*b.schema.names, *EXTRA])


def split_arrival(b: Any) -> tuple[Any, np.ndarray, np.ndarray, np.ndarray]:
    """A batch of ``with_arrival`` back as the stream's batch and the three arrays."""
    if isinstance(b, dict):
        data = {k: v for k, v in b.items() if k not in EXTRA}
        return data, b[EXTRA[0]], b[EXTRA[1]], b[EXTRA[2]]
    n = b.num_columns - 3
    data = b.select(list(range(n)))
    return data, as_numpy(b.column(n)), as_numpy(b.column(n + 1)), as_numpy(b.column(n + 2))


def concat(parts: Sequence[Any]) -> Any:
    """The rows of ``parts`` (batches of one kind and schema), one after the other."""
    if len(parts) == 1:
        return parts[0]
    if isinstance(parts[0], dict):
        return {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}
    import pyarrow as pa

    if hasattr(pa, "concat_batches"):
        return pa.concat_batches(list(parts))
    t = pa.Table.from_batches(list(parts)).combine_chunks()
    got = t.to_batches()
    return got[0] if got else parts[0].slice(0, 0)


def mask_of(y: Any, n: int) -> np.ndarray | None:
    """``y`` as a row mask of ``n`` rows (a numpy bool array, a pyarrow boolean array:
    nulls are false), or None when it is not one."""
    if isinstance(y, np.ndarray):
        return y if y.dtype == np.bool_ and y.shape == (n,) else None
    pa = sys.modules.get("pyarrow")
    arrow = pa is not None and isinstance(y, pa.Array | pa.ChunkedArray)
    if arrow and pa is not None and pa.types.is_boolean(y.type) and len(y) == n:
        return np.asarray(y.fill_null(False).to_numpy(zero_copy_only=False), bool)
    return None


def masked(x: Any, y: Any, drop: Any) -> Any:
    """``filter``'s output for item ``x`` whose predicate gave ``y``: for a batch and a
    row mask, its rows where the mask is true (``drop`` when none); else ``x`` or
    ``drop`` by the truth of ``y``."""
    if kind_of(x) is not None:
        m = mask_of(y, nrows(x))
        if m is not None:
            keep = np.flatnonzero(m)
            if not len(keep):
                return drop
            return x if len(keep) == len(m) else take(x, keep)
    return x if y else drop


def partitions(keys: np.ndarray, n: int, stable_hash: Callable[[Any], int]) -> np.ndarray:
    """Each row's partition of ``n`` by its key, as ``partition_of`` gives it per item:
    ints by splitmix64 in numpy, other keys by ``stable_hash`` once per distinct value."""
    if keys.dtype.kind in "iu":
        with np.errstate(over="ignore"):
            z = keys.astype(np.uint64) + np.uint64(0x9E3779B97F4A7C15)
            z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
            z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
            z = z ^ (z >> np.uint64(31))
        return (z % np.uint64(n)).astype(np.int64)
    uniq, inv = np.unique(keys, return_inverse=True)
    hs = np.asarray([stable_hash(k) % n for k in uniq.tolist()], np.int64)
    return hs[inv.reshape(-1)]


def split(b: Any, name: str, n: int, stable_hash: Callable[[Any], int]) -> list[Any]:
    """The rows of batch ``b`` per partition of their ``name`` key (None: no row)."""
    part = partitions(column(b, name), n, stable_hash)
    order = stable_order(part)
    cuts = np.searchsorted(part[order], np.arange(n + 1))
    return [
        take(b, order[cuts[i] : cuts[i + 1]]) if cuts[i + 1] > cuts[i] else None for i in range(n)
    ]


def pylist(a: np.ndarray, arrow: bool) -> list[Any]:
    """Values of a column as Python objects, as a batch's rows have them (Arrow: as
    ``to_pylist``; dicts: numbers as Python numbers, times as numpy scalars)."""
    if a.dtype.kind in "mM":
        if arrow:
            import pyarrow as pa

            unit = np.datetime_data(a.dtype)[0]
            if unit not in ("s", "ms", "us", "ns"):
                return list(pa.array(a).to_pylist())
            typ = (pa.timestamp if a.dtype.kind == "M" else pa.duration)(unit)
            return list(_arrow_view(np.ascontiguousarray(a), typ).to_pylist())
        return list(a)
    return list(a.tolist())


def windows_of(
    rows: Any,
    counts: np.ndarray,
    key: str | None,
    spans: tuple[np.ndarray, np.ndarray] | None = None,
) -> list[Any]:
    """Windows (or groups) of ``rows`` taken ``counts`` at a time: ``af.Window(key, start,
    end, items)`` with ``spans`` (starts, ends), ``(key, items)`` without; ``items`` a
    zero-copy slice of ``rows`` (a batch of the stream's kind), ``key`` its first row's
    ``key`` column (None without ``key``)."""
    offs = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
    heads = offs[:-1]
    arrow = not isinstance(rows, dict)
    if key is None:
        keys: list[Any] = [None] * len(counts)
    elif arrow:
        keys = rows.column(key).take(indices(heads)).to_pylist()
    else:
        keys = pylist(rows[key][heads], False)
    a = offs[:-1].tolist()
    if arrow:  # (slice per window: one call each, ~1 us; what caps a window's cost)
        items = list(map(rows.slice, a, np.asarray(counts, np.int64).tolist()))
    else:
        items = [slice_of(rows, i, j) for i, j in zip(a, offs[1:].tolist(), strict=True)]
    if spans is None:
        return list(zip(keys, items, strict=True))
    starts, ends = pylist(spans[0], arrow), pylist(spans[1], arrow)
    return list(map(Window._make, zip(keys, starts, ends, items, strict=True)))
