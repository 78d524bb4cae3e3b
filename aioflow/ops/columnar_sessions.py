"""``sessions`` on record batches: the columnar twin of ``Sessions``
(``ops/event_time_sessions``), with the machine interface of ``ops/event_time_core``.

Output: an ``af.Window(key, start, end, items)`` per session, in the order the per-item
machine emits its windows, ``items`` the session's rows in arrival order as a batch of the
stream's kind (a zero-copy slice of one batch gathered per input batch).

The rows held are those of the open sessions, kept per session in chunks
(``ops/columnar_held.SessionRows``: a batch costs its own rows, not the rows held), and a
table of the sessions (key, start, last, first arrival, alive).
A batch in event-time order (times non-decreasing, none before the largest seen: what
``sort_by(max_delay=)`` gives) with no ``max_duration``/``max_items``/``max_keys`` is
vectorized: rows grouped by key (a stable sort), a new session where the
time since the key's previous row is ``>= gap``, a session closed at the first row whose
watermark reaches its ``last + gap`` (``searchsorted``); no row of such a batch is late.
Any other batch (rows out of order, the limits) runs the per-item machine on the rows'
indices, exactly.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence
from typing import Any

import numpy as np

from aioflow.ops.columnar import span, stable_order
from aioflow.ops.columnar_base import WindowedBase
from aioflow.ops.columnar_held import SessionRows
from aioflow.ops.columnar_rows import Rows
from aioflow.ops.event_time_sessions import Sessions, _Session

__all__ = ["ColSessions"]


def _empty() -> dict[str, np.ndarray]:
    e = np.empty(0, np.int64)
    return {"key": e, "start": e, "last": e, "first": e, "alive": np.empty(0, bool)}


class ColSessions(WindowedBase):
    """``sessions(time, gap, by=...)`` on batches (see the module doc)."""

    COMPACT = 1024  # closed sessions kept beyond the open ones before they are dropped

    def __init__(
        self,
        time: str,
        by: str,
        gap: Any,
        max_delay: Any,
        max_duration: Any,
        max_items: int | None,
        on_late: str,
        max_keys: int | None = None,
    ) -> None:
        super().__init__(time, by, on_late, max_delay)
        self.keyed = True  # (``by`` a column name)
        self.gap0 = gap
        self.max_duration0, self.max_items, self.max_keys = max_duration, max_items, max_keys
        self.simple = max_duration is None and max_items is None and max_keys is None
        self.hr = SessionRows(("t", "k"), self.derive)  # the open sessions' rows
        self.tab = _empty()
        self.dead = 0  # closed sessions still in tab (not alive), dropped in bulk

    @property
    def gap(self) -> Any:
        return span(self.gap0, self.unit)

    # -- one batch ------------------------------------------------------------------------
    def extra(self, n: int) -> dict[str, np.ndarray]:
        return {"sid": np.full(n, -1, np.int64)}  # (each row's session)

    def derive(self, b: Any) -> dict[str, np.ndarray]:
        """The times and keys of batch ``b``'s rows (as ``add`` takes them)."""
        t = self.times(b, self.time)
        return {"t": t, "k": self.keys(b, len(t))}

    def fast(self, new: Rows, start: int, out: list[Any]) -> None:
        t, k, n, gap, d = new.cols["t"], new.cols["k"], len(new), self.gap, self.delay
        tab, ns = self.tab, len(self.tab["key"])
        o = stable_order(k)
        ks, ts = k[o], t[o]
        gfirst = np.ones(n, bool)
        gfirst[1:] = ks[1:] != ks[:-1]
        begins = np.zeros(n, bool)
        begins[1:] = (ts[1:] - ts[:-1]) >= gap
        begins &= ~gfirst
        joined = np.full(n, -1, np.int64)
        g = np.flatnonzero(gfirst)
        live = np.flatnonzero(tab["alive"])
        if len(live):  # the latest open session of each key: a first row within gap joins it
            lo = live[np.lexsort((tab["last"][live], tab["key"][live]))]
            sk = tab["key"][lo]
            islast = np.ones(len(lo), bool)
            islast[:-1] = sk[1:] != sk[:-1]
            uk, usid = sk[islast], lo[islast]
            p = np.minimum(np.searchsorted(uk, ks[g]), len(uk) - 1)
            hit = (uk[p] == ks[g]) & (ts[g] - tab["last"][usid[p]] < gap)
            joined[g[hit]] = usid[p[hit]]
        begins |= gfirst & (joined < 0)
        heads = np.flatnonzero(begins | gfirst)
        fresh = begins[heads]
        segsid = np.where(fresh, ns + np.cumsum(fresh) - 1, joined[heads])
        tails = np.append(heads[1:], n) - 1
        nh = heads[fresh]
        tab = {
            "key": np.concatenate([tab["key"], ks[nh]]) if ns else ks[nh],
            "start": np.concatenate([tab["start"], ts[nh]]),
            "last": np.concatenate([tab["last"], ts[nh]]),
            "first": np.concatenate([tab["first"], new.seq[o[nh]]]),
            "alive": np.concatenate([tab["alive"], np.ones(len(nh), bool)]),
        }
        tab["last"][segsid] = ts[tails]
        self.tab = tab
        self.hr.grow(len(nh))
        self.hr.put(new, o, segsid, np.append(heads, n))
        self.max = t[-1].item()
        end = tab["last"] + gap
        at = np.searchsorted(t - d if d else t, end, "left")
        closed = np.flatnonzero((at < n) & tab["alive"])
        closed = closed[np.lexsort((tab["first"][closed], end[closed], at[closed]))]
        self.close(closed, start, out)

    def close(self, closed: np.ndarray, start: int, out: list[Any]) -> None:
        """Emit the sessions ``closed`` (table rows, in order), keep the others."""
        tab = self.tab
        if len(closed):
            r, counts = self.hr.rows(closed, drop=True)
            s, e = tab["start"][closed], tab["last"][closed] + self.gap
            rows = r.segs[0]
            out.extend(self.windows(rows, counts, s, e))
            self.gone.extend(r.pieces(None, before=start, data=rows))
        tab["alive"][closed] = False
        self.dead += len(closed)
        if self.dead > len(tab["key"]) - self.dead + self.COMPACT:  # drop them, renumber
            keep = tab["alive"]
            self.tab = {c: v[keep] for c, v in tab.items()}
            self.hr.renumber(keep)
            self.dead = 0

    def open_rows(self) -> Rows:
        """The open sessions' rows (column ``sid``), a session after the other."""
        return self.hr.rows(np.flatnonzero(self.tab["alive"]))[0]

    # -- the exact path: the per-item machine on row indices -------------------------------
    def exact(self, new: Rows, s: int, start: int, out: list[Any]) -> None:
        held = self.open_rows()
        allr = held.cat(new)
        h = len(held)
        m = self.machine(allr)
        got, err = self.run(m, new, h, s)
        self.emit(got, allr, start, out, log=True)
        self.from_machine(m, allr)
        if err is not None:
            raise err

    def machine(self, allr: Rows) -> Sessions:
        """The per-item machine holding the open sessions, their items row positions."""
        m = Sessions(
            self.gap,
            self.delay,
            span(self.max_duration0, self.unit),
            self.max_items,
            self.on_late,
            self.max_keys,
        )
        m.max = self.max
        tab = self.tab
        sid = allr.cols["sid"]
        held = np.flatnonzero(sid >= 0)
        by = held[stable_order(sid[held])]
        cuts = np.searchsorted(sid[by], np.arange(len(tab["key"]) + 1))
        keys, starts = tab["key"].tolist(), tab["start"].tolist()
        lasts, firsts = tab["last"].tolist(), tab["first"].tolist()
        seqs = allr.seq
        live = np.flatnonzero(tab["alive"])
        for j in live[stable_order(tab["first"][live])].tolist():
            pos = by[cuts[j] : cuts[j + 1]]
            S = _Session(keys[j], starts[j], firsts[j], None)
            S.last, S.items, S.seqs = lasts[j], pos.tolist(), seqs[pos].tolist()
            m.open.setdefault(keys[j], []).append(S)
            m.heap.append((lasts[j] + self.gap, firsts[j], S))
        heapq.heapify(m.heap)
        return m

    def from_machine(self, m: Sessions, allr: Rows) -> None:
        ss = [S for lst in m.open.values() for S in lst]
        sid = np.full(len(allr), -1, np.int64)
        for j, S in enumerate(ss):
            sid[np.asarray(S.items, np.int64)] = j
        kd = allr.cols["k"].dtype
        self.tab = {
            "key": np.asarray([S.key for S in ss], kd if kd.kind != "U" else None),
            "start": np.asarray([S.start for S in ss]),
            "last": np.asarray([S.last for S in ss]),
            "first": np.asarray([S.first for S in ss], np.int64),
            "alive": np.ones(len(ss), bool),
        }
        if not ss:
            self.tab = _empty()
            self.tab["key"] = allr.cols["k"][:0]
            self.tab["start"] = self.tab["last"] = allr.cols["t"][:0]
        held = np.flatnonzero(sid >= 0)
        held = held[stable_order(allr.seq[held])]  # (a merged session's rows by arrival)
        rows = allr.take(held)
        rows.cols["sid"] = sid[held]
        self.hr.load(rows, len(ss))
        self.dead = 0

    # -- the end, the state ---------------------------------------------------------------
    def finish(self, out: list[Any]) -> None:
        tab = self.tab
        live = np.flatnonzero(tab["alive"])
        if len(live):
            end = tab["last"][live] + self.gap
            closed = live[np.lexsort((tab["first"][live], end))]
            self.close(closed, 1 << 62, out)
        self.done = True

    def held(self) -> list[list[Any]]:
        return [self.open_rows().pieces()]

    def restore(
        self, scalars: dict[str, Any], cols: Sequence[Sequence[Any]], items: Sequence[Any]
    ) -> None:
        """Rebuild the open sessions by placing the held rows again (as ``Sessions``)."""
        allr = self.restored_rows(scalars, items)
        if allr is None:
            return
        t, k, n = allr.cols["t"], allr.cols["k"], len(allr)
        m = self.machine(Rows(cols={"sid": EMPTY_SID}))
        m.max = None  # (placed with no watermark: nothing is late, nothing closes)
        got: list[Any] = []
        for i, (ti, ki) in enumerate(zip(t.tolist(), k.tolist(), strict=True)):
            m._put(ti, ki, i - n, i, None, 0, got)
        self.from_machine(m, allr)


EMPTY_SID = np.empty(0, np.int64)
