"""``sort_by`` on record batches: the columnar twins of ``TimeSort`` (``max_delay=``) and
``BufferSort`` (``buffer_size=``), with the machine interface of ``ops/event_time_core``.

Each input batch gives one output batch (none when it releases nothing), the rows in the
order the per-item machine would emit them, and the same rows late. ``sort_by(max_delay)``:
a row is late when its key is below the watermark before it (the running maximum of the
keys before it minus ``max_delay``: ``np.maximum.accumulate``); the others join the held
rows, and those at or below the watermark after the batch come out sorted by (key,
arrival) (a stable sort); a late row under ``on_late="emit"`` comes out at
its place among them (after what the rows before it released). ``sort_by(buffer_size=n)``:
the ``m`` rows a batch pushes out of the ``n`` held are the ``m`` smallest of held + batch
whenever the ``j``-th smallest arrived by step ``j`` (checked); otherwise (rows more than
``n`` places out of order) that batch runs the heap row by row, on indices.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence
from typing import Any

import numpy as np

from aioflow.ops.columnar import scalar, stable_order, take
from aioflow.ops.columnar_base import ColumnarBase
from aioflow.ops.columnar_rows import Rows
from aioflow.ops.event_time_core import Late
from aioflow.ops.ordering_stream import Desc

__all__ = ["ColBufferSort", "ColTimeSort"]


class _Held(ColumnarBase):
    """A buffer of rows with their keys (``cols["k"]``)."""

    def __init__(self, key: str, on_late: str, delay: Any = 0) -> None:
        super().__init__(on_late, delay)
        self.key = key
        self.buf = Rows(cols={"k": np.empty(0)})

    def add(
        self, cols: Sequence[Sequence[Any]], items: Sequence[Any], start: int, out: list[Any]
    ) -> None:
        for i, b in enumerate(items):
            self.one(self.batch(b, start + i), start + i, start, out)

    def one(self, b: Any, s: int, start: int, out: list[Any]) -> None:
        raise NotImplementedError

    def rows_of(self, b: Any, s: int) -> tuple[Rows, np.ndarray]:
        k = self.times(b, self.key)
        r = Rows.of(b, s, self.rows, k=k)
        self.rows += len(k)
        return r, k

    def emit(self, rows: Rows, pos: np.ndarray, out: list[Any]) -> None:
        if len(pos):
            out.append(rows.gather(pos))

    def held(self) -> list[list[Any]]:
        return [self.buf.pieces()]

    def restore(
        self, scalars: dict[str, Any], cols: Sequence[Sequence[Any]], items: Sequence[Any]
    ) -> None:
        data = self.restored(scalars, items)
        if data is not None:
            n = len(self.times(data, self.key))
            self.buf = Rows.of(data, -1, -n, k=self.times(data, self.key))

    def sorted_out(self, out: list[Any]) -> None:
        buf = self.buf
        if len(buf):
            order = self.order(buf.cols["k"])
            out.append(buf.gather(order))
            self.gone.extend(buf.pieces())
        self.buf = Rows(cols={"k": buf.cols["k"][:0]})

    def order(self, k: np.ndarray) -> np.ndarray:
        return stable_order(k)


class ColTimeSort(_Held):
    """``sort_by(key, max_delay=d)`` on batches (see the module doc)."""

    def one(self, b: Any, s: int, start: int, out: list[Any]) -> None:
        new, k = self.rows_of(b, s)
        n = len(k)
        if not n:
            return
        d = self.delay
        acc = np.maximum.accumulate(k)
        first = k[0] if self.max is None else self.max
        if self.max is not None:
            acc = np.maximum(acc, self.max)
        before = np.empty_like(acc)
        before[0] = first
        before[1:] = acc[:-1]
        wmb = before - d if d else before
        late = k < wmb
        if late.any() and self.on_late == "raise":
            j = int(np.argmax(late))
            self.rows -= n
            if j:  # what the rows before it release comes out first
                self.one(take(b, np.arange(j)), s, start, out)
            raise Late(scalar(k[j], self.unit), scalar(wmb[j], self.unit), s)
        self.late += int(late.sum())
        self.max = acc[-1].item()
        wma = acc - d if d else acc
        held = self.buf
        h = len(held)
        allr = held.cat(new)
        nl = np.flatnonzero(~late)
        cand = np.concatenate([np.arange(h), h + nl])
        keys = allr.cols["k"][cand]
        rel = keys <= wma[-1]
        go = cand[rel]
        go = go[stable_order(allr.cols["k"][go])]
        if self.on_late == "emit" and late.any():
            at = np.searchsorted(wma, allr.cols["k"][go], "left")
            at = np.maximum(at, np.where(go >= h, go - h, 0))
            lates = np.flatnonzero(late)
            order = stable_order(np.concatenate([at, lates]))
            go = np.concatenate([go, h + lates])[order]
        if len(go):  # (what leaves is logged as it came out: a state cuts it, ``cut_piece``)
            got = allr.gather(go)
            out.append(got)
            self.gone.extend(allr.pieces(go, before=start, data=got))
        self.buf = allr.take(cand[~rel])

    def finish(self, out: list[Any]) -> None:
        self.sorted_out(out)
        self.done = True


class ColBufferSort(_Held):
    """``sort_by(key, buffer_size=n, reverse=...)`` on batches (see the module doc)."""

    def __init__(self, key: str, size: int, reverse: bool, on_late: str) -> None:
        super().__init__(key, on_late)
        self.size, self.reverse = size, reverse
        self.last: Any = None

    watermark = None
    event_time = None

    def order(self, k: np.ndarray) -> np.ndarray:
        if not self.reverse:
            return stable_order(k)
        return len(k) - 1 - stable_order(k[::-1])[::-1]

    def before(self, a: np.ndarray, w: Any) -> np.ndarray:
        """Keys that sort before ``w`` (late)."""
        return a > w if self.reverse else a < w

    def one(self, b: Any, s: int, start: int, out: list[Any]) -> None:
        new, k = self.rows_of(b, s)
        held = self.buf
        h, n, size = len(held), len(k), self.size
        allr = held.cat(new)
        m = h + n - size
        if m <= 0:
            self.buf = allr
            return
        keys = allr.cols["k"]
        order = self.order(keys)[:m]
        step = np.maximum(order - size + 1, 0)  # when each row can first leave
        # rows further out of order than the buffer: the heap itself, row by row
        go = order if (step <= np.arange(1, m + 1)).all() else self.heap(keys, size, m)
        gk = keys[go]
        w = self.last
        if w is None:
            w = gk[0]
        runmax = np.maximum.accumulate(gk) if not self.reverse else np.minimum.accumulate(gk)
        prev = np.concatenate([[w], runmax[:-1]])
        prev = np.maximum(prev, w) if not self.reverse else np.minimum(prev, w)
        late = self.before(gk, prev)
        keep = np.ones(m, bool)
        if late.any():
            if self.on_late == "raise":
                j = int(np.argmax(late))
                self.emit(allr, go[:j], out)
                raise Late(scalar(gk[j], self.unit), scalar(prev[j], self.unit), s)
            self.late += int(late.sum())
            if self.on_late == "drop":
                keep = ~late
        v = runmax[-1]
        v = (max(v, w) if not self.reverse else min(v, w)) if self.last is not None else v
        self.last = v.item() if isinstance(v, np.generic) else v
        self.emit(allr, go[keep], out)
        self.gone.extend(allr.pieces(go[go < h], before=start))
        mask = np.ones(len(allr), bool)
        mask[go] = False
        self.buf = allr.take(np.flatnonzero(mask))

    def heap(self, keys: np.ndarray, size: int, m: int) -> np.ndarray:
        """The positions the heap pushes out, in order (the per-item machine, on indices)."""
        ks = keys.tolist()
        if self.reverse:
            ks = [Desc(x) for x in ks]
        heap = [(ks[i], i) for i in range(size)]
        heapq.heapify(heap)
        got = []
        for i in range(size, size + m):
            got.append(heapq.heappushpop(heap, (ks[i], i))[1])
        return np.asarray(got, np.int64)

    def finish(self, out: list[Any]) -> None:
        self.sorted_out(out)

    def state(self) -> dict[str, Any]:
        st = super().state()
        st["last"] = self.last
        return st

    def restore(
        self, scalars: dict[str, Any], cols: Sequence[Sequence[Any]], items: Sequence[Any]
    ) -> None:
        super().restore(scalars, cols, items)
        self.last = scalars.get("last")
