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
open session refers to it; when the live blocks are more than ``BLOCKS`` and hold more
than twice the rows held (plus ``SLACK``), the held rows are copied into one block.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from aioflow.ops.columnar import slice_of, split_arrival, stable_order, with_arrival
from aioflow.ops.columnar_rows import Rows

__all__ = ["SessionRows"]


class _Block:
    __slots__ = ("data", "held", "n", "off")

    def __init__(self, data: Any, n: int, off: int) -> None:
        self.data, self.off = data, off  # (data: with its rows' arrival, ``with_arrival``)
        self.n = self.held = n


_EMPTY = np.empty(0, np.int64)


def _ranges(a: np.ndarray, n: np.ndarray) -> np.ndarray:
    """The integers of the ranges ``[a, a + n)``, one after the other."""
    return np.arange(int(n.sum())) + np.repeat(a - (np.cumsum(n) - n), n)


class SessionRows:
    """Held rows per session id (see the module doc). A chunk is a range of global row
    numbers (each block has its own range of them). ``derive(batch)`` gives the per-row
    arrays its owner keeps beside the data (e.g. time and key: ``cols``), for ``rows``."""

    SLACK = 4096
    BLOCKS = 16  # live blocks before they are compacted (a take costs more with more)

    def __init__(self, cols: tuple[str, ...], derive: Callable[[Any], dict[str, Any]]) -> None:
        self.names = cols
        self.derive = derive
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
        data = new.gather(order)
        data = with_arrival(data, new.seq[order], new.src[order], new.idx[order])
        off = self._keep(_Block(data, len(order), self.next))
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
            self.dtypes = {c: new.cols[c].dtype for c in self.names}

    def _keep(self, blk: _Block) -> int:
        if blk.n:
            self.blocks.append(blk)
            self.nblock += blk.n
            self.nheld += blk.n
            self.next += blk.n
        return blk.off

    def rows(self, sids: Any, drop: bool = False, derive: bool = True) -> tuple[Rows, np.ndarray]:
        """The rows of sessions ``sids`` (distinct; in that order, each in arrival order) as
        one ``Rows`` (column ``sid`` too) and each session's count: one ``take`` over the
        blocks, their arrival with them; ``drop``: they go (and ``derive`` is not asked)."""
        sids = np.asarray(sids, np.int64)
        rank = np.full(self.nsessions, -1, np.int64)
        rank[sids] = np.arange(len(sids))
        of = rank[self.csid]
        sel = np.flatnonzero(of >= 0)
        derive = derive and not drop
        names = self.names if derive else ()
        r = Rows({c: np.empty(0, self.dtypes.get(c)) for c in names})
        r.segs = [] if self.empty is None else [self.empty]
        if not len(sel):
            r.cols["sid"] = _EMPTY
            return r, np.zeros(len(sids), np.int64)
        sel = sel[stable_order(of[sel])]  # (by session, each in arrival order: by a)
        a = self.ca[sel]
        cnt = self.cz[sel] - a
        counts = np.bincount(of[sel], weights=cnt, minlength=len(sids)).astype(np.int64)
        blocks = self.blocks
        boff = np.fromiter((b.off for b in blocks), np.int64, len(blocks))
        cb = np.searchsorted(boff, a, "right") - 1  # each chunk's block
        n = int(cnt.sum())
        used = np.flatnonzero(np.bincount(cb, minlength=len(blocks)))  # (a take over
        remap = np.empty(len(blocks), np.int64)  # fewer blocks costs less: only theirs)
        remap[used] = np.arange(len(used))
        inblocks = Rows()
        inblocks.segs = [blocks[j].data for j in used.tolist()]
        inblocks.part, inblocks.pidx = np.repeat(remap[cb], cnt), _ranges(a - boff[cb], cnt)
        data, r.seq, r.src, r.idx = split_arrival(inblocks.gather(np.arange(n)))
        r.segs, r.part, r.pidx = [data], np.zeros(n, np.int64), np.arange(n)
        if derive:
            r.cols.update(self.derive(data))
        r.cols["sid"] = np.repeat(sids, counts)
        if drop:
            keep = np.ones(len(self.csid), bool)
            keep[sel] = False
            self.csid, self.ca, self.cz = self.csid[keep], self.ca[keep], self.cz[keep]
            self.nheld -= n
            gone = np.bincount(cb, weights=cnt, minlength=len(blocks)).astype(np.int64)
            live = []
            for b, k in zip(blocks, gone.tolist(), strict=True):
                b.held -= k
                if b.held:
                    live.append(b)
                else:
                    self.nblock -= b.n
            self.blocks = live
            if len(live) > self.BLOCKS and self.nblock > 2 * self.nheld + self.SLACK:
                self.compact()
        return r, counts

    def compact(self) -> None:
        """All held rows into one block (the sessions' chunks point into it)."""
        live = np.unique(self.csid)
        r, counts = self.rows(live, derive=False)
        self.blocks, self.nheld, self.nblock = [], 0, 0
        data = with_arrival(r.segs[0], r.seq, r.src, r.idx)
        off = self._keep(_Block(data, len(r), self.next))
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
