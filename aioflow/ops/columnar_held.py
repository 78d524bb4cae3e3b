"""The rows the columnar ``sessions`` holds, kept per session (``SessionRows``).

Each input batch's held rows are one *block*: the batch's rows taken once in session
order (a session's rows of the batch are contiguous, in arrival order), with their arrival
numbers, batch position and row index, and a range of global row numbers. A session is a
list of chunks ``(a, z)`` of those numbers, one per batch it had rows in. Adding a batch
costs its rows and the sessions it touches; closing sessions costs their rows and chunks
(one ``take`` per block they have rows in, then one to put them in session order), never
the rows held by the sessions still open. A block lives while a chunk of an
open session refers to it; when the live blocks are more than ``Rows.SEGS`` and hold more
than twice the rows held (plus ``SLACK``), the held rows are copied into one block.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from aioflow.ops.columnar import Rows, slice_of

__all__ = ["SessionRows"]


class _Block:
    __slots__ = ("cols", "data", "held", "n", "off")

    def __init__(self, data: Any, cols: dict[str, Any], off: int) -> None:
        self.data, self.cols, self.off = data, cols, off
        self.n = self.held = len(cols["seq"])


def _ranges(p: np.ndarray) -> np.ndarray:
    """The integers of the ranges ``[a, z)`` (rows of ``p``), one after the other."""
    n = p[:, 1] - p[:, 0]
    return np.arange(int(n.sum())) + np.repeat(p[:, 0] - (np.cumsum(n) - n), n)


class SessionRows:
    """Held rows per session id (see the module doc); ``cols`` names the per-row arrays
    kept beside the data (e.g. time and key). A chunk is a range of global row numbers
    (each block has its own range of them)."""

    SLACK = 4096

    def __init__(self, cols: tuple[str, ...]) -> None:
        self.names = ("seq", "src", "idx", *cols)
        self.chunks: list[list[tuple[int, int]]] = []
        self.blocks: list[_Block] = []  # live, by offset
        self.next = 0  # the next block's offset
        self.nheld = self.nblock = 0
        self.empty: Any = None  # an empty batch of the stream's schema
        self.dtypes: dict[str, Any] = {}

    def grow(self, n: int) -> None:
        """``n`` more (empty) sessions, numbered after the others."""
        self.chunks.extend([] for _ in range(n))

    def put(self, new: Rows, order: np.ndarray, sids: np.ndarray, cuts: np.ndarray) -> None:
        """The rows of ``new`` at ``order`` (grouped by session: ``order[cuts[j]:cuts[j +
        1]]`` are session ``sids[j]``'s rows, in arrival order) appended to their sessions."""
        self._like(new)
        cols = {"seq": new.seq[order], "src": new.src[order], "idx": new.idx[order]}
        for c in self.names[3:]:
            cols[c] = new.cols[c][order]
        off = self._keep(_Block(new.gather(order), cols, self.next))
        chunks = self.chunks
        g = cuts + off
        for s, a, z in zip(sids.tolist(), g[:-1].tolist(), g[1:].tolist(), strict=True):
            chunks[s].append((a, z))

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
        """The rows of sessions ``sids`` (in that order, each in arrival order) as one
        ``Rows`` (column ``sid`` too) and each session's count; ``drop``: they go."""
        sids = np.asarray(sids, np.int64)
        parts: list[tuple[int, int]] = []
        lens = np.zeros(len(sids), np.int64)
        chunks = self.chunks
        for j, s in enumerate(sids.tolist()):
            ch = chunks[s]
            parts.extend(ch)
            lens[j] = len(ch)
            if drop:
                chunks[s] = []
        r = Rows({c: np.empty(0, self.dtypes.get(c)) for c in self.names[3:]})
        r.segs = [] if self.empty is None else [self.empty]
        if not parts:
            r.cols["sid"] = np.empty(0, np.int64)
            return r, np.zeros(len(sids), np.int64)
        p = np.asarray(parts, np.int64)
        cnt = p[:, 1] - p[:, 0]
        per = np.repeat(np.arange(len(sids)), lens)
        counts = np.bincount(per, weights=cnt, minlength=len(sids)).astype(np.int64)
        g = _ranges(p)
        blocks = self.blocks
        boff = np.asarray([b.off for b in blocks], np.int64)
        bi = np.searchsorted(boff, g, "right") - 1
        local = g - boff[bi]
        order = np.argsort(bi, kind="stable")
        cuts = np.searchsorted(bi[order], np.arange(len(blocks) + 1)).tolist()
        got: dict[str, np.ndarray] = {}
        for c in self.names:
            v = np.empty(len(g), blocks[0].cols[c].dtype)
            for j, b in enumerate(blocks):
                if cuts[j + 1] > cuts[j]:
                    sel = order[cuts[j] : cuts[j + 1]]
                    v[sel] = b.cols[c][local[sel]]
            got[c] = v
        r.segs, r.part, r.pidx = [b.data for b in blocks], bi, local
        data = r.gather(np.arange(len(g)))
        r.segs, r.part, r.pidx = [data], np.zeros(len(g), np.int64), np.arange(len(g))
        r.seq, r.src, r.idx = got.pop("seq"), got.pop("src"), got.pop("idx")
        r.cols.update(got)
        r.cols["sid"] = np.repeat(sids, counts)
        if drop:
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
        live = [s for s, ch in enumerate(self.chunks) if ch]
        r, counts = self.rows(live)
        self.blocks, self.nheld, self.nblock = [], 0, 0
        cols = {"seq": r.seq, "src": r.src, "idx": r.idx}
        cols.update({c: r.cols[c] for c in self.names[3:]})
        off = self._keep(_Block(r.segs[0], cols, self.next))
        offs = (np.concatenate([[0], np.cumsum(counts)]) + off).tolist()
        for j, s in enumerate(live):
            self.chunks[s] = [(offs[j], offs[j + 1])]

    def renumber(self, keep: np.ndarray) -> None:
        """Keep the sessions where ``keep`` is true, numbered anew in order."""
        self.chunks = [ch for ch, k in zip(self.chunks, keep.tolist(), strict=True) if k]

    def load(self, rows: Rows, nsessions: int) -> None:
        """Hold exactly ``rows`` (with their ``sid`` column) for ``nsessions`` sessions."""
        self.chunks, self.blocks, self.nheld, self.nblock = [], [], 0, 0
        self.grow(nsessions)
        self._like(rows)
        sid = rows.cols["sid"]
        if not len(sid):
            return
        order = np.argsort(sid, kind="stable")
        ss = sid[order]
        heads = np.flatnonzero(np.concatenate([[True], ss[1:] != ss[:-1]]))
        self.put(rows, order, ss[heads], np.append(heads, len(ss)))
