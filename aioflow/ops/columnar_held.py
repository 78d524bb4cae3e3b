"""The rows the columnar ``sessions`` holds, kept per session (``SessionRows``).

Each input batch's held rows are one *block*: the batch's rows taken once in session
order (a session's rows of the batch are contiguous, in arrival order), with their arrival
numbers, batch position and row index, and a range of global row numbers. A session has
a chunk ``(a, z)`` of those numbers per batch it had rows in: one table of chunks
(arrays ``sid``, ``a``, ``z``, in the order of ``a``), so that no step loops over sessions
in Python. Adding a batch costs its rows; closing sessions costs their rows (one
``take`` per block they have rows in, then one to put them in session order) and a pass
over the chunk table (a few entries per open session), never the rows held by the
sessions still open. A block lives while a chunk of an
open session refers to it; when the live blocks are more than ``Rows.SEGS`` and hold more
than twice the rows held (plus ``SLACK``), the held rows are copied into one block.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from aioflow.ops.columnar import Rows, slice_of, stable_order

__all__ = ["SessionRows"]


class _Block:
    __slots__ = ("cols", "data", "held", "n", "off")

    def __init__(self, data: Any, cols: dict[str, Any], off: int) -> None:
        self.data, self.cols, self.off = data, cols, off
        self.n = self.held = len(cols["seq"])


_EMPTY = np.empty(0, np.int64)


def _ranges(a: np.ndarray, n: np.ndarray) -> np.ndarray:
    """The integers of the ranges ``[a, a + n)``, one after the other."""
    return np.arange(int(n.sum())) + np.repeat(a - (np.cumsum(n) - n), n)


class SessionRows:
    """Held rows per session id (see the module doc); ``cols`` names the per-row arrays
    kept beside the data (e.g. time and key). A chunk is a range of global row numbers
    (each block has its own range of them)."""

    SLACK = 4096

    def __init__(self, cols: tuple[str, ...]) -> None:
        self.names = ("seq", "src", "idx", *cols)
        self.nsessions = 0
        self.csid = self.ca = self.cz = _EMPTY  # the chunks: session, rows [a, z)
        self.blocks: list[_Block] = []  # live, by offset
        self.next = 0  # the next block's offset
        self.nheld = self.nblock = 0
        self.empty: Any = None  # an empty batch of the stream's schema
        self.dtypes: dict[str, Any] = {}

    def grow(self, n: int) -> None:
        """``n`` more (empty) sessions, numbered after the others."""
        self.nsessions += n

    def put(self, new: Rows, order: np.ndarray, sids: np.ndarray, cuts: np.ndarray) -> None:
        """The rows of ``new`` at ``order`` (grouped by session: ``order[cuts[j]:cuts[j +
        1]]`` are session ``sids[j]``'s rows, in arrival order) appended to their sessions."""
        self._like(new)
        cols = {"seq": new.seq[order], "src": new.src[order], "idx": new.idx[order]}
        for c in self.names[3:]:
            cols[c] = new.cols[c][order]
        off = self._keep(_Block(new.gather(order), cols, self.next))
        g = cuts + off
        self._chunks(np.asarray(sids, np.int64), g[:-1], g[1:])

    def _chunks(self, sids: np.ndarray, a: np.ndarray, z: np.ndarray) -> None:
        if len(self.csid):
            sids = np.concatenate([self.csid, sids])
            a, z = np.concatenate([self.ca, a]), np.concatenate([self.cz, z])
        self.csid, self.ca, self.cz = sids, a, z

    def _like(self, new: Rows) -> None:
        if self.empty is None and new.segs:
            self.empty = slice_of(new.segs[0], 0, 0)
            self.dtypes = {c: new.cols[c].dtype for c in self.names[3:]}

    def _keep(self, blk: _Block) -> int:
        if blk.n:
            self.blocks.append(blk)
            self.nblock += blk.n
            self.nheld += blk.n
            self.next += blk.n
        return blk.off

    def rows(self, sids: Any, drop: bool = False) -> tuple[Rows, np.ndarray]:
        """The rows of sessions ``sids`` (distinct; in that order, each in arrival order) as
        one ``Rows`` (column ``sid`` too) and each session's count; ``drop``: they go, and
        only their data and arrival (``seq``, ``src``, ``idx``) are gathered."""
        sids = np.asarray(sids, np.int64)
        rank = np.full(self.nsessions, -1, np.int64)
        rank[sids] = np.arange(len(sids))
        of = rank[self.csid]
        sel = np.flatnonzero(of >= 0)
        names = self.names[:3] if drop else self.names
        r = Rows({c: np.empty(0, self.dtypes.get(c)) for c in names[3:]})
        r.segs = [] if self.empty is None else [self.empty]
        if not len(sel):
            r.cols["sid"] = _EMPTY
            return r, np.zeros(len(sids), np.int64)
        sel = sel[stable_order(of[sel])]  # (by session, each in arrival order: by a)
        a, z = self.ca[sel], self.cz[sel]
        cnt = z - a
        counts = np.bincount(of[sel], weights=cnt, minlength=len(sids)).astype(np.int64)
        g = _ranges(a, cnt)
        blocks = self.blocks
        boff = np.asarray([b.off for b in blocks], np.int64)
        bi = np.searchsorted(boff, g, "right") - 1
        local = g - boff[bi]
        order = stable_order(bi)
        cuts = np.searchsorted(bi[order], np.arange(len(blocks) + 1)).tolist()
        got: dict[str, np.ndarray] = {}
        for c in names:
            v = np.empty(len(g), blocks[0].cols[c].dtype)
            for j, b in enumerate(blocks):
                if cuts[j + 1] > cuts[j]:
                    at = order[cuts[j] : cuts[j + 1]]
                    v[at] = b.cols[c][local[at]]
            got[c] = v
        r.segs, r.part, r.pidx = [b.data for b in blocks], bi, local
        data = r.gather(np.arange(len(g)))
        r.segs, r.part, r.pidx = [data], np.zeros(len(g), np.int64), np.arange(len(g))
        r.seq, r.src, r.idx = got.pop("seq"), got.pop("src"), got.pop("idx")
        r.cols.update(got)
        r.cols["sid"] = np.repeat(sids, counts)
        if drop:
            keep = np.ones(len(self.csid), bool)
            keep[sel] = False
            self.csid, self.ca, self.cz = self.csid[keep], self.ca[keep], self.cz[keep]
            self.nheld -= len(g)
            gone = np.bincount(bi, minlength=len(self.blocks))
            live = []
            for b, k in zip(self.blocks, gone.tolist(), strict=True):
                b.held -= k
                if b.held:
                    live.append(b)
                else:
                    self.nblock -= b.n
            self.blocks = live
            if len(live) > Rows.SEGS and self.nblock > 2 * self.nheld + self.SLACK:
                self.compact()
        return r, counts

    def compact(self) -> None:
        """All held rows into one block (the sessions' chunks point into it)."""
        live = np.unique(self.csid)
        r, counts = self.rows(live)
        self.blocks, self.nheld, self.nblock = [], 0, 0
        cols = {"seq": r.seq, "src": r.src, "idx": r.idx}
        cols.update({c: r.cols[c] for c in self.names[3:]})
        off = self._keep(_Block(r.segs[0], cols, self.next))
        ends = np.cumsum(counts) + off
        self.csid, self.ca, self.cz = live, ends - counts, ends

    def renumber(self, keep: np.ndarray) -> None:
        """Keep the sessions where ``keep`` is true, numbered anew in order."""
        new = np.cumsum(keep) - 1
        kept = keep[self.csid]
        self.csid, self.ca, self.cz = new[self.csid[kept]], self.ca[kept], self.cz[kept]
        self.nsessions = int(np.count_nonzero(keep))

    def load(self, rows: Rows, nsessions: int) -> None:
        """Hold exactly ``rows`` (with their ``sid`` column) for ``nsessions`` sessions."""
        self.blocks, self.nheld, self.nblock = [], 0, 0
        self.csid = self.ca = self.cz = _EMPTY
        self.nsessions = 0
        self.grow(nsessions)
        self._like(rows)
        sid = rows.cols["sid"]
        if not len(sid):
            return
        order = stable_order(sid)
        ss = sid[order]
        heads = np.flatnonzero(np.concatenate([[True], ss[1:] != ss[:-1]]))
        self.put(rows, order, ss[heads], np.append(heads, len(ss)))
