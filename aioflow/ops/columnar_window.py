"""``window_by_time`` on record batches: the columnar twin of ``TimeWindows``
(``ops/event_time_core``), with the machine interface of that module: ``ColWindows``
(tumbling, and ``slide == size``) here, ``ColSliding`` (any other ``slide``) in
``ops/columnar_sliding``; ``WindowsBase`` is what they share.

Output: an ``af.Window(key, start, end, items)`` per window (``key`` None without ``by``),
``items`` a batch of the window's rows (as the sessions', ``ops/columnar_sessions``), in
the order the per-item machine emits them.

A batch in event-time order (times non-decreasing, none before the largest seen) is
vectorized: each row's window ``(key, time // size * size)`` (rows grouped by a stable
``lexsort``, one dict look-up per window, not per row), a window closed at the first row
whose watermark reaches ``end + allowed_lateness`` (``searchsorted``); no row of such a
batch is late. Any other batch runs the per-item machine on the rows' indices, exactly.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence
from typing import Any

import numpy as np

from aioflow.ops.columnar import scalar, span, stable_order
from aioflow.ops.columnar_base import WindowedBase
from aioflow.ops.columnar_rows import Rows
from aioflow.ops.event_time_core import TimeWindows

__all__ = ["ColWindows", "WindowsBase"]


class WindowsBase(WindowedBase):
    """What the columnar windows share: the spans in the column's units, the output
    watermark and the held rows (``buf``, in arrival order)."""

    def __init__(
        self, time: str, by: str | None, size: Any, lateness: Any, max_delay: Any, on_late: str
    ) -> None:
        super().__init__(time, by, on_late, max_delay)
        self.size0, self.lateness0 = size, lateness
        self.buf = Rows(cols={"t": np.empty(0), "k": np.empty(0)})

    size = property(lambda self: span(self.size0, self.unit))
    ll = property(lambda self: span(self.lateness0, self.unit))

    @property
    def watermark(self) -> Any:
        if self.max is None or self.done:
            return scalar(self.max, self.unit)
        return scalar(self.max - self.delay - self.ll, self.unit)

    def held(self) -> list[list[Any]]:
        return [self.buf.pieces()]


class ColWindows(WindowsBase):
    """``window_by_time(time, size, by=...)`` (tumbling) on batches (see the module doc)."""

    def __init__(
        self, time: str, by: str | None, size: Any, lateness: Any, max_delay: Any, on_late: str
    ) -> None:
        super().__init__(time, by, size, lateness, max_delay, on_late)
        self.buf = Rows(cols={"t": np.empty(0), "k": np.empty(0), "g": np.empty(0, np.int64)})
        self.wkey: list[Any] = []  # the open windows: key, start, first arrival
        self.wstart = np.empty(0)
        self.wfirst = np.empty(0, np.int64)

    def extra(self, n: int) -> dict[str, np.ndarray]:
        return {"g": np.full(n, -1, np.int64)}  # (each row's open window)

    def fast(self, new: Rows, start: int, out: list[Any]) -> None:
        t, k, n, size = new.cols["t"], new.cols["k"], len(new), self.size
        st = (t // size) * size
        o = np.lexsort((st, k))
        ks, ss = k[o], st[o]
        head = np.ones(n, bool)
        head[1:] = (ks[1:] != ks[:-1]) | (ss[1:] != ss[:-1])
        heads = np.flatnonzero(head)
        open_ = {w: j for j, w in enumerate(zip(self.wkey, self.wstart.tolist(), strict=True))}
        nw = len(self.wkey)
        gid = np.empty(len(heads), np.int64)
        keys, starts, firsts = list(self.wkey), [self.wstart], [self.wfirst]
        fresh: list[int] = []
        for j, (kk, s0) in enumerate(zip(ks[heads].tolist(), ss[heads].tolist(), strict=True)):
            got = open_.get((kk, s0))
            if got is None:
                got = nw + len(fresh)
                fresh.append(j)
                keys.append(kk)
            gid[j] = got
        fh = heads[np.asarray(fresh, np.int64)]
        starts.append(ss[fh])
        firsts.append(new.seq[o[fh]])
        g = np.empty(n, np.int64)
        g[o] = gid[np.cumsum(head) - 1]
        new.cols["g"] = g
        self.wkey, self.wstart, self.wfirst = keys, np.concatenate(starts), np.concatenate(firsts)
        self.max = t[-1].item()
        d = self.delay
        end = self.wstart + size
        at = np.searchsorted(t - d if d else t, end + self.ll, "left")
        closed = np.flatnonzero(at < n)
        closed = closed[np.lexsort((self.wfirst[closed], end[closed], at[closed]))]
        self.close(self.buf.cat(new), closed, start, out)

    def close(self, allr: Rows, closed: np.ndarray, start: int, out: list[Any]) -> None:
        nw = len(self.wkey)
        rank = np.full(nw + 1, -1, np.int64)
        rank[closed] = np.arange(len(closed))
        rr = rank[allr.cols["g"]]
        em = np.flatnonzero(rr >= 0)
        em = em[stable_order(rr[em])]
        if len(closed):
            rows = allr.gather(em)
            counts = np.bincount(rr[em], minlength=len(closed))
            s = self.wstart[closed]
            out.extend(self.windows(rows, counts, s, s + self.size))
            self.gone.extend(allr.pieces(em, before=start, data=rows))
        keep = rank[:nw] < 0
        renum = np.append(np.cumsum(keep) - 1, -1)
        self.wkey = [x for x, y in zip(self.wkey, keep.tolist(), strict=True) if y]
        self.wstart, self.wfirst = self.wstart[keep], self.wfirst[keep]
        rest = allr.take(np.flatnonzero(rr < 0))
        rest.cols["g"] = renum[rest.cols["g"]]
        self.buf = rest

    # -- the exact path: the per-item machine on row indices -------------------------------
    def exact(self, new: Rows, s: int, start: int, out: list[Any]) -> None:
        allr = self.buf.cat(new)
        h, size = len(self.buf), self.size
        m = TimeWindows(size, size, self.ll, self.delay, self.on_late)
        m.max = self.max
        g = allr.cols["g"]
        for j, (kk, s0, f) in enumerate(
            zip(self.wkey, self.wstart.tolist(), self.wfirst.tolist(), strict=True)
        ):
            pos = np.flatnonzero(g == j)
            kk = kk if self.by else None
            m.wins[(kk, s0)] = [f, pos.tolist(), allr.seq[pos].tolist(), []]
            m.heap.append((s0 + size, f, kk, s0))
        heapq.heapify(m.heap)
        got, err = self.run(m, new, h, s)
        self.emit(got, allr, start, out, log=True)
        self.from_machine(m, allr)
        if err is not None:
            raise err

    def from_machine(self, m: TimeWindows, allr: Rows) -> None:
        wins = sorted(m.wins.items(), key=lambda kv: kv[1][0])
        g = np.full(len(allr), -1, np.int64)
        for j, (_, w) in enumerate(wins):
            g[np.asarray(w[1], np.int64)] = j
        self.wkey = [kk if self.by else 0 for (kk, _), _ in wins]
        self.wstart = np.asarray([s0 for (_, s0), _ in wins], allr.cols["t"].dtype)
        self.wfirst = np.asarray([w[0] for _, w in wins], np.int64)
        rows = allr.take(np.flatnonzero(g >= 0))
        rows.cols["g"] = g[g >= 0]
        self.buf = rows

    # -- the end, the state ---------------------------------------------------------------
    def finish(self, out: list[Any]) -> None:
        if len(self.wkey):
            end = self.wstart + self.size
            self.close(self.buf, np.lexsort((self.wfirst, end)), 1 << 62, out)
        self.done = True

    def restore(
        self, scalars: dict[str, Any], cols: Sequence[Sequence[Any]], items: Sequence[Any]
    ) -> None:
        """Rebuild the open windows by putting the held rows back (as ``TimeWindows``)."""
        allr = self.restored_rows(scalars, items)
        if allr is None:
            return
        t, k, n = allr.cols["t"], allr.cols["k"], len(allr)
        m = TimeWindows(self.size, self.size, self.ll, self.delay, self.on_late)
        m.max = self.max
        c = [t.tolist()] + ([k.tolist()] if self.by else [])
        m.restore({"max": self.max}, c, list(range(n)))
        self.from_machine(m, allr)
