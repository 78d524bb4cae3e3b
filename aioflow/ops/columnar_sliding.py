"""Sliding ``window_by_time(time, size, slide=s)`` on record batches (``slide != size``):
the columnar twin of ``TimeWindows`` (``ops/event_time_core``), as ``ColWindows``
(``ops/columnar_window``) is for tumbling windows.

A row belongs to up to ``ceil(size / slide)`` windows: those ``[start, start + size)``
holding its time, ``start`` a multiple of ``slide`` (none when ``slide > size`` and its
time falls between two windows: such a row is in no window, never late, and does not
move the watermark, as per item). The machine keeps no table of windows: it holds the
rows still in an open window (``buf``, in arrival order), and a row's open windows follow
from its time and the watermark (a window is open while ``end + allowed_lateness`` is
above the watermark, and every row that came while it was open is in it). To close
windows, ``memberships`` repeats each held row once per open window of it (the starts
computed as the per-item machine walks them: ``last = time // slide * slide``, then
``- slide`` while ``start + size > time``), the (row, window) pairs grouped per
``(key, start)`` with a stable ``lexsort``; a window's first arrival is its first row.

A batch in event-time order (times non-decreasing, none before the largest seen) is
vectorized: a window closes at the first row (in a window) whose watermark reaches
``end + allowed_lateness`` (``searchsorted``), the windows closed at one row in the
order ``(end, first arrival)``; no row of such a batch is late. Any other batch runs the
per-item machine on the rows' indices, exactly. A row leaves once its last window closed.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence
from typing import Any

import numpy as np

from aioflow.ops.columnar import span, stable_order
from aioflow.ops.columnar_rows import Rows
from aioflow.ops.columnar_window import WindowsBase
from aioflow.ops.event_time_core import TimeWindows

__all__ = ["ColSliding", "memberships"]


def memberships(
    t: np.ndarray, size: Any, slide: Any, open_at: tuple[Any, Any] | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """The (row, window start) pairs of times ``t``: each row's windows ``[s, s + size)``,
    ``s`` a multiple of ``slide``, from its last one down, as ``TimeWindows`` walks them
    (the same arithmetic, so the same starts for floats too); with ``open_at=(watermark,
    lateness)``, only the windows still open then (``s + size + lateness > watermark``;
    a watermark None: all)."""
    rows, starts = [], []
    alive = np.arange(len(t))
    st = (t // slide) * slide
    ta = t
    while len(alive):
        ok = st + size > ta
        if not ok.all():
            alive, st, ta = alive[ok], st[ok], ta[ok]
        if not len(alive):
            break
        rows.append(alive)
        starts.append(st)
        st = st - slide
    if not rows:
        return np.empty(0, np.int64), t[:0]
    r, s = np.concatenate(rows), np.concatenate(starts)
    if open_at is not None and open_at[0] is not None:
        keep = s + size + open_at[1] > open_at[0]
        r, s = r[keep], s[keep]
    return r, s


class ColSliding(WindowsBase):
    """``window_by_time(time, size, slide=s, by=...)`` on batches (see the module doc)."""

    def __init__(
        self,
        time: str,
        by: str | None,
        size: Any,
        slide: Any,
        lateness: Any,
        max_delay: Any,
        on_late: str,
    ) -> None:
        super().__init__(time, by, size, lateness, max_delay, on_late)
        self.slide0 = slide

    slide = property(lambda self: span(self.slide0, self.unit))

    def wm(self) -> Any:
        """The input watermark (the largest time seen minus ``max_delay``), internal."""
        if self.max is None:
            return None
        return self.max - self.delay if self.delay else self.max

    def times(self, b: Any, name: str) -> np.ndarray:
        """Times as the per-item machine computes with them: int64 or float64."""
        a = super().times(b, name)
        return a.astype(np.int64 if a.dtype.kind in "iub" else np.float64, copy=False)

    def groups(self, allr: Rows) -> tuple[np.ndarray, ...]:
        """The open windows of the rows ``allr``: the pairs' rows (grouped per window, in
        arrival order in each), each pair's window, and per window its start, end and
        first arrival."""
        r, st = memberships(allr.cols["t"], self.size, self.slide, (self.wm(), self.ll))
        k = allr.cols["k"][r]
        o = np.lexsort((r, st, k))
        r, st, k = r[o], st[o], k[o]
        head = np.ones(len(r), bool)
        head[1:] = (k[1:] != k[:-1]) | (st[1:] != st[:-1])
        heads = np.flatnonzero(head)
        wst = st[heads]
        return r, np.cumsum(head) - 1, wst, wst + self.size, allr.seq[r[heads]]

    def fast(self, new: Rows, start: int, out: list[Any]) -> None:
        t = new.cols["t"]
        inw = np.flatnonzero((t // self.slide) * self.slide + self.size > t)
        if not len(inw):  # every row between two windows: in none
            return
        allr = self.buf.cat(new)
        r, g, wst, wend, wfirst = self.groups(allr)
        d = self.delay
        wmv = t[inw] - d if d else t[inw]
        at = np.searchsorted(wmv, wend + self.ll, "left")
        closed = np.flatnonzero(at < len(inw))
        closed = closed[np.lexsort((wfirst[closed], wend[closed], at[closed]))]
        self.max = t[inw[-1]].item()
        self.close(allr, (r, g, wst, wend), closed, start, out)

    def close(
        self,
        allr: Rows,
        grouped: tuple[np.ndarray, ...],
        closed: np.ndarray,
        start: int,
        out: list[Any],
    ) -> None:
        """Emit the windows ``closed`` (in that order); keep the rows still in one."""
        r, g, wst, wend = grouped
        rank = np.full(len(wst), -1, np.int64)
        rank[closed] = np.arange(len(closed))
        rr = rank[g]
        if len(closed):
            em = np.flatnonzero(rr >= 0)
            em = em[stable_order(rr[em])]
            rows = allr.gather(r[em])
            counts = np.bincount(rr[em], minlength=len(closed))
            out.extend(self.windows(rows, counts, wst[closed], wend[closed]))
        kept = np.zeros(len(allr), bool)
        kept[r[rr < 0]] = True
        self.keep(allr, kept, start)

    def keep(self, allr: Rows, kept: np.ndarray, start: int) -> None:
        """Hold the rows of ``allr`` where ``kept``; log the others (those before
        ``start``) as gone."""
        self.gone.extend(allr.pieces(np.flatnonzero(~kept), before=start))
        self.buf = allr.take(np.flatnonzero(kept))

    # -- the exact path: the per-item machine on row indices -------------------------------
    def exact(self, new: Rows, s: int, start: int, out: list[Any]) -> None:
        allr = self.buf.cat(new)
        h, size = len(self.buf), self.size
        m = TimeWindows(size, self.slide, self.ll, self.delay, self.on_late)
        m.max = self.max
        if h:
            r, g, wst, _, wfirst = self.groups(self.buf)
            cuts = np.append(np.flatnonzero(np.diff(g)) + 1, len(g)).tolist()
            ks = self.buf.cols["k"][r].tolist() if self.by else None
            pos, seqs, ts = r.tolist(), self.buf.seq[r].tolist(), self.buf.cols["t"][r].tolist()
            a = 0
            for z, s0, f in zip(cuts, wst.tolist(), wfirst.tolist(), strict=True):
                kk = ks[a] if ks is not None else None
                m.wins[(kk, s0)] = [f, pos[a:z], seqs[a:z], ts[a:z]]
                m.heap.append((s0 + size, f, kk, s0))
                a = z
            heapq.heapify(m.heap)
        got, err = self.run(m, new, h, s)
        self.emit(got, allr, start, out, log=False)  # (``keep`` logs the rows that leave)
        kept = np.zeros(len(allr), bool)
        for w in m.wins.values():
            kept[w[1]] = True
        self.keep(allr, kept, start)
        if err is not None:
            raise err

    # -- the end, the state ---------------------------------------------------------------
    def finish(self, out: list[Any]) -> None:
        if len(self.buf):
            r, g, wst, wend, wfirst = self.groups(self.buf)
            closed = np.lexsort((wfirst, wend))
            self.close(self.buf, (r, g, wst, wend), closed, 1 << 62, out)
        self.done = True

    def restore(
        self, scalars: dict[str, Any], cols: Sequence[Sequence[Any]], items: Sequence[Any]
    ) -> None:
        """Hold the rows of the state again: their open windows follow from their times."""
        buf = self.restored_rows(scalars, items)
        if buf is not None:
            self.buf = buf
