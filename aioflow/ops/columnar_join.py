"""The output of the columnar ``asof_join`` (``ops/columnar_asof``): left rows with the
right stream's columns appended (``Joined``).

The right's columns are those of its first batch but its ``by`` column, named as they
are unless a left column has the name, then suffixed ``_right`` (as Polars'
``join_asof``): the right's ``on`` column is kept (``t_right`` when ``on="t"``), so a row
shows when its match was. A row without a match has nulls there (Arrow; the right's
``on`` column is null exactly then, as it never is in a match); a dict of numpy arrays
has no nulls: its right columns hold NaN / NaT / None (floats, times, objects) or the
dtype's zero there, and a bool column ``matched`` tells (``matched_right`` when the
left has a ``matched``). Names that would come out twice are an ``af.PipelineError``.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from aioflow.errors import PipelineError

__all__ = ["Joined"]


def _nullable(idx: np.ndarray, valid: np.ndarray) -> Any:
    """Row numbers as a pyarrow int64 array, null where not ``valid``."""
    import pyarrow as pa

    nulls = len(valid) - int(valid.sum())
    bits = pa.py_buffer(np.packbits(valid, bitorder="little")) if nulls else None
    data = pa.py_buffer(np.ascontiguousarray(idx, np.int64))
    return pa.Array.from_buffers(pa.int64(), len(idx), [bits, data], null_count=nulls)


def _fill(tmpl: np.ndarray, got: np.ndarray | None, matched: np.ndarray) -> np.ndarray:
    """A right column of a dict batch: ``got`` where matched, a missing value elsewhere."""
    dt, shape = tmpl.dtype, (len(matched), *tmpl.shape[1:])  # (a column of arrays too)
    if dt.kind in "fc":
        out = np.full(shape, np.nan, dt)
    elif dt.kind in "mM":
        out = np.full(shape, np.datetime64("NaT") if dt.kind == "M" else np.timedelta64("NaT"), dt)
    elif dt.kind == "O":
        out = np.full(shape, None, dt)
    else:
        out = np.zeros(shape, dt)
    if got is not None:
        out[matched] = got
    return out


class Joined:
    """The output's columns: ``saw`` the right's batches, ``joined`` the rows out."""

    def __init__(self, by: str | None) -> None:
        self.by = by
        self.right0: Any = None  # the right's columns: a batch of no rows
        self.names: dict[tuple[Any, ...], tuple[list[str], list[str], str]] = {}

    def saw(self, b: Any) -> None:
        """A batch of the right stream: the first gives the right's columns."""
        if self.right0 is None:
            self.right0 = {c: v[:0] for c, v in b.items()} if isinstance(b, dict) else b.slice(0, 0)

    def renamed(self, left: list[str], flags: bool) -> tuple[list[str], list[str], str]:
        """The right's columns, their names out, the name of ``matched`` (``flags``: dicts)."""
        r0 = self.right0
        key = (*left, r0 is None)
        got = self.names.get(key)
        if got is None:
            rn = [] if r0 is None else list(r0 if isinstance(r0, dict) else r0.schema.names)
            src = [c for c in rn if c != self.by]
            new = [c + "_right" if c in left else c for c in src]
            flag = "matched_right" if "matched" in left else "matched"
            names = [*left, *new, *([flag] if flags else [])]
            if len(set(names)) < len(names):
                dup = sorted({c for c in names if names.count(c) > 1})
                raise PipelineError(
                    f"asof_join: the joined columns would have the name(s) {dup} twice"
                    " (a right column clashing with a left one is suffixed '_right');"
                    " rename columns before the join"
                )
            got = self.names[key] = (src, new, flag)
        return got

    def joined(self, left: Any, got: Any, hit: np.ndarray) -> Any:
        r0 = self.right0
        if isinstance(left, dict):
            src, new, flag = self.renamed(list(left), True)
            out = dict(left)
            for c, nm in zip(src, new, strict=True):
                out[nm] = _fill(r0[c], None if got is None else got[c], hit)
            out[flag] = hit
            return out
        import pyarrow as pa

        src, new, _ = self.renamed(left.schema.names, False)
        if r0 is None:
            return left
        idx = np.cumsum(hit) - 1
        idx[~hit] = 0
        rows = (r0 if got is None else got).select(src).take(_nullable(idx, hit))
        names = [*left.schema.names, *new]
        return pa.RecordBatch.from_arrays([*left.columns, *rows.columns], names=names)
