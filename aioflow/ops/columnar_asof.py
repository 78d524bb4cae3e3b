"""``asof_join`` on record batches: the columnar twin of ``AsofJoin`` (``ops/asof``), with
its interface (``add_left``/``add_right``/``end_right``, ``blocked``, ``taken``), driven by
``ops/asof``'s driver.

Output: one batch per left batch with rows, once all its rows are released (a row as
the per-item join releases its pair: late, or below the right watermark, or the right
stream ended), its rows in order, with the matches they had when released and the right
stream's columns appended (``ops/columnar_join``). The rows released of a batch not yet
complete wait in ``partial`` (at most one batch: the front one); so the output batches
are the left batches whatever the chunks, and a resumed run gives the same ones.

The rows are held as ``Rows`` (``ops/columnar``): the waiting left rows (``pend``) and
the right rows that may still match (``right``, sorted by key, time, arrival). A row's
lateness is that of the per-item join (the running maximum of its side's times before
it, minus ``max_delay``: ``np.maximum.accumulate``). The left rows released at a step are
the longest prefix of ``pend`` that is late or below the right watermark; their matches
are one ``searchsorted`` of (key, time) codes over the right rows. After each right
batch, a right row goes when a later one of its key is at or before the floor (the left
watermark, and no waiting left row before it) or it is more than ``tolerance`` before
it: no left row to come can match it. With ``max_keys``, ``ColAsofExact``
(``ops/columnar_asof_exact``).
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import Any

import numpy as np

from aioflow.errors import PipelineError
from aioflow.ops.columnar import (
    column,
    concat,
    kind_of,
    numeric,
    scalar,
    slice_of,
    span,
)
from aioflow.ops.columnar_base import ColumnarBase
from aioflow.ops.columnar_join import Joined
from aioflow.ops.columnar_rows import Rows

__all__ = ["ColAsof"]

_E = np.empty(0, np.int64)


def _late(t: np.ndarray, top: Any, d: Any) -> tuple[np.ndarray, Any]:
    """Which rows are late (below the largest time before them minus ``d``), the new top."""
    acc = np.maximum.accumulate(t)
    if top is not None:
        acc = np.maximum(acc, top)
    before = np.empty_like(acc)
    before[0] = t[0] if top is None else top
    before[1:] = acc[:-1]
    return t < (before - d if d else before), acc[-1].item()


def _codes(k: np.ndarray) -> np.ndarray:
    return k if k.dtype.kind in "iufb" else np.unique(k, return_inverse=True)[1].reshape(-1)


class ColAsof(ColumnarBase):
    """``asof_join(other, on=col, by=col or None)`` on batches (see the module doc)."""

    def __init__(self, on: str, by: str | None, tolerance: Any, max_delay: Any) -> None:
        super().__init__("emit", max_delay)
        self.on, self.by, self.tol0 = on, by, tolerance
        self.maxr: Any = None
        self.rdone = False
        self.taken = [0, 0]
        self.gone: list[list[Any]] = [[], []]
        self.seqs = [0, 0]  # arrival numbers of rows, per side
        self.pend = Rows(cols={"t": _E, "k": _E, "late": np.empty(0, bool)})
        self.right = Rows(cols={"t": _E, "k": _E})
        self.out = Joined(by)  # the output's columns
        self.partial: tuple[Any, ...] = ()  # the joined rows out of the front left batch
        self.pmin: Any = None  # their least time (but late rows'): the watermark is not above
        self.temporal: bool | None = None  # the on column holds times (not numbers)

    @property
    def tol(self) -> Any:
        return span(self.tol0, self.unit)

    # -- what the driver reads ------------------------------------------------------------
    @property
    def blocked(self) -> bool:
        return bool(len(self.pend)) and not self.rdone

    def floor(self) -> Any:
        if self.max is None:
            return None
        p = self.max - self.delay if self.delay else self.max
        waiting = self.pend.cols["t"][~self.pend.cols["late"]]
        return min(p, waiting.min().item()) if len(waiting) else p

    def floor_out(self) -> Any:
        return self.max if self.done else self.floor()

    @property
    def watermark(self) -> Any:
        w = self.floor_out()
        if self.pmin is not None and w is not None:
            w = min(w, self.pmin)
        return scalar(w, self.unit)

    # -- the rows of a batch --------------------------------------------------------------
    def cols(self, b: Any, side: int, pos: int) -> tuple[np.ndarray, np.ndarray]:
        if side:
            kind = kind_of(b)
            if kind != self.kind:
                raise PipelineError(
                    f"asof_join: the left stream is of record batches ({self.kind}) and the"
                    f" key a column name, so the right one must be too; its item {pos} is"
                    f" {type(b).__name__}{f' ({kind})' if kind else ''}"
                )
            self.out.saw(b)
        else:
            self.batch(b, pos)
        raw = column(b, self.on)
        temporal = raw.dtype.kind in "mM"
        if self.temporal is None:
            self.temporal = temporal
        elif self.temporal != temporal:
            raise PipelineError(
                f"asof_join: column {self.on!r} holds times on one side, numbers on the other"
            )
        if temporal and self.unit is None:
            self.unit = raw.dtype
            self.to_units()
        elif temporal and raw.dtype != self.unit:
            raw = raw.astype(self.unit)  # (the other side's unit)
        t = numeric(raw)[0]
        k = np.asarray(column(b, self.by)) if self.by is not None else np.zeros(len(t), np.int8)
        return t, k

    # -- the sides ------------------------------------------------------------------------
    def add_left(
        self, cols: Sequence[Sequence[Any]], items: Sequence[Any], start: int, out: list[Any]
    ) -> None:
        self.add_side(0, items, start, out)

    def add_right(
        self, cols: Sequence[Sequence[Any]], items: Sequence[Any], start: int, out: list[Any]
    ) -> None:
        self.add_side(1, items, start, out)

    def add_side(self, side: int, items: Sequence[Any], start: int, out: list[Any]) -> None:
        """The batches ``items`` (from input position ``start``) of side ``side`` (1: right)."""
        rows_in = self.right_rows if side else self.left_rows
        for i, b in enumerate(items):
            t, k = self.cols(b, side, start + i)
            n, s0 = len(t), self.seqs[side]
            if not n:
                continue
            self.seqs[side] += n
            rows_in(Rows.of(b, start + i, s0, t=t, k=k), out)

    def end_right(self, out: list[Any]) -> None:
        self.rdone = True
        self.release(out)

    def finish(self) -> None:
        self.done = True

    # -- the vectorized path --------------------------------------------------------------
    def left_rows(self, new: Rows, out: list[Any]) -> None:
        late, self.max = _late(new.cols["t"], self.max, self.delay)
        self.late += int(late.sum())
        new.cols["late"] = late
        self.pend = self.pend.cat(new)
        self.release(out)

    def right_rows(self, new: Rows, out: list[Any]) -> None:
        late, self.maxr = _late(new.cols["t"], self.maxr, self.delay)
        self.late += int(late.sum())
        self.right = self.sort_right(self.right.cat(new.take(np.flatnonzero(~late))))
        self.release(out)
        self.prune()

    @staticmethod
    def sort_right(r: Rows) -> Rows:
        """The right rows by key, time, arrival (what ``match`` and ``prune`` need)."""
        return r.take(np.lexsort((r.seq, r.cols["t"], _codes(r.cols["k"]))))

    def release(self, out: list[Any]) -> None:
        p = self.pend
        n = len(p)
        if not n:
            return
        t, late = p.cols["t"], p.cols["late"]
        if self.rdone:
            r = n
        else:
            ok = late.copy()
            if self.maxr is not None:
                ok |= t < (self.maxr - self.delay if self.delay else self.maxr)
            r = n if ok.all() else int(np.argmin(ok))
        if r:
            self.emit(self.match(t[:r], p.cols["k"][:r], late[:r]), r, out)

    def match(self, t: np.ndarray, k: np.ndarray, late: np.ndarray) -> np.ndarray:
        """Per left row, its match's position in ``right`` (-1: none)."""
        j = np.full(len(t), -1, np.int64)
        rt, rk = self.right.cols["t"], self.right.cols["k"]
        q = np.flatnonzero(~late)
        if not len(rt) or not len(q):
            return j
        nr = len(rt)
        kc = np.unique(np.concatenate([rk, k[q]]), return_inverse=True)[1].reshape(-1)
        times, tc = np.unique(np.concatenate([rt, t[q]]), return_inverse=True)
        comp = kc.astype(np.int64) * len(times) + tc.reshape(-1)
        at = np.searchsorted(comp[:nr], comp[nr:], "right") - 1
        a0 = np.maximum(at, 0)
        ok = (at >= 0) & (kc[:nr][a0] == kc[nr:])
        if self.tol is not None:
            ok &= t[q] - rt[a0] <= self.tol
        j[q[ok]] = at[ok]
        return j

    def prune(self) -> None:
        """Drop the right rows no left row to come can match (see the module doc)."""
        floor, r = self.floor(), self.right
        if floor is None or not len(r):
            return
        t, k = r.cols["t"], r.cols["k"]
        drop = np.zeros(len(t), bool)
        drop[:-1] = (k[1:] == k[:-1]) & (t[1:] <= floor)
        if self.tol is not None:
            drop |= t < floor - self.tol
        if drop.any():
            self.gone[1].extend(r.pieces(np.flatnonzero(drop), before=self.taken[1]))
            self.right = r.take(np.flatnonzero(~drop))

    # -- the output -----------------------------------------------------------------------
    def emit(self, j: np.ndarray, r: int, out: list[Any]) -> None:
        """The first ``r`` waiting left rows leave, joined with right rows ``j``: to the
        rows of their left batch (``partial``), which comes out once it has all its rows."""
        p = self.pend
        pos = np.arange(r)
        left = p.gather(pos)
        hit = j >= 0
        got = self.right.gather(j[hit]) if hit.any() else None
        joined = self.out.joined(left, got, hit)
        self.gone[0].extend(p.pieces(pos, before=self.taken[0], data=left))
        src, t, late = p.src[:r], p.cols["t"][:r], p.cols["late"][:r]
        self.pend = p.take(np.arange(r, len(p)))
        nxt = int(self.pend.src[0]) if len(self.pend) else None
        cuts = [0, *(np.flatnonzero(np.diff(src)) + 1).tolist(), r]
        for a, z in itertools.pairwise(cuts):
            s = int(src[a])
            ts = t[a:z][~late[a:z]]
            if len(ts):
                lo = ts.min().item()
                self.pmin = lo if self.pmin is None else min(self.pmin, lo)
            self.partial = (*self.partial, slice_of(joined, a, z))
            if s != nxt:  # the last rows of batch ``s``
                out.append(concat(self.partial))
                self.partial, self.pmin = (), None

    # -- the state ------------------------------------------------------------------------
    def held(self) -> list[list[Any]]:
        return [self.pend.pieces(), self.right.pieces()]

    def lates(self) -> list[int]:
        """The positions of the late rows among the waiting left ones."""
        return list(np.flatnonzero(self.pend.cols["late"]).tolist())

    def state(self) -> dict[str, Any]:
        st = super().state()
        lates = self.lates()
        st.update(maxr=self.maxr, rdone=self.rdone, lates=lates, right0=self.out.right0)
        st.update(partial=self.partial, pmin=self.pmin, kind=self.kind)
        return st

    def restore(self, scalars: dict[str, Any], left: Sequence[Any], right: Sequence[Any]) -> None:
        """Rebuild from the logged pieces of the rows held (each side in arrival order)."""
        self.restore_scalars(scalars)
        self.maxr, self.rdone = scalars["maxr"], scalars["rdone"]
        self.out.right0 = scalars["right0"]
        self.partial, self.pmin = tuple(scalars["partial"]), scalars["pmin"]
        self.kind = scalars["kind"]
        (lrows, lsrc), (rrows, _) = Rows.restored(left, True), Rows.restored(right, True)
        if lrows is not None:
            t, k = self.cols(lrows, 0, 0)
            late = np.zeros(len(t), bool)
            late[np.asarray(scalars["lates"], np.int64)] = True
            self.pend = Rows.of(lrows, -1, -len(t), t=t, k=k, late=late)
            self.pend.src = lsrc  # (each row's batch: one output batch per left batch)
        if rrows is not None:
            t, k = self.cols(rrows, 1, 0)
            self.right = self.sort_right(Rows.of(rrows, -1, -len(t), t=t, k=k))
