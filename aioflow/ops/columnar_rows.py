"""``Rows``: the rows a columnar machine holds, with their arrival numbers, and the pieces
of its resumable state (``ops/columnar.py`` has the batch helpers it uses)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from aioflow.ops.columnar import EMPTY, PIECE, concat, indices, nrows, slice_of, stable_order, take

__all__ = ["Rows"]


class Rows:
    """Rows a machine holds, in arrival order: per row ``seq`` (its arrival number), ``src``
    (its batch's position in the input), ``idx`` (its row in that batch) and the machine's
    own arrays in ``cols``. The rows' data stay in the input batches (``segs``; row ``i``
    is row ``pidx[i]`` of ``segs[part[i]]``) until ``gather`` takes them out: holding,
    appending and dropping rows copies no data; the segments are compacted into one when
    there are more than ``SEGS`` or they hold more than twice the rows still held."""

    __slots__ = ("cols", "idx", "part", "pidx", "segs", "seq", "src")
    SEGS = 16

    def __init__(self, cols: dict[str, np.ndarray] | None = None) -> None:
        self.segs: list[Any] = []
        self.seq = self.src = self.idx = self.part = self.pidx = EMPTY
        self.cols = cols or {}

    def __len__(self) -> int:
        return len(self.seq)

    @classmethod
    def of(cls, b: Any, src: int, seq0: int, **cols: np.ndarray) -> Rows:
        n = nrows(b)
        r = cls(cols)
        r.segs = [b]
        r.seq, r.src = np.arange(seq0, seq0 + n), np.full(n, src, np.int64)
        r.idx = r.pidx = np.arange(n)
        r.part = np.zeros(n, np.int64)
        return r

    def _like(self, pos: np.ndarray | slice, segs: list[Any], part: np.ndarray) -> Rows:
        r = Rows({k: v[pos] for k, v in self.cols.items()})
        r.segs, r.part = segs, part
        r.seq, r.src, r.idx, r.pidx = self.seq[pos], self.src[pos], self.idx[pos], self.pidx[pos]
        return r

    def cat(self, other: Rows) -> Rows:
        if not len(self):
            return other
        if not len(other):
            return self
        r = Rows({k: np.concatenate([v, other.cols[k]]) for k, v in self.cols.items()})
        r.segs = self.segs + other.segs
        r.part = np.concatenate([self.part, other.part + len(self.segs)])
        for a in ("seq", "src", "idx", "pidx"):
            setattr(r, a, np.concatenate([getattr(self, a), getattr(other, a)]))
        return r

    def take(self, pos: np.ndarray) -> Rows:
        """The rows at ``pos`` (their data not copied)."""
        if not len(pos):
            return Rows({k: v[:0] for k, v in self.cols.items()})
        r = self._like(pos, self.segs, self.part[pos])
        size = sum(nrows(b) for b in r.segs)
        if len(r.segs) > self.SEGS or size > 2 * len(r) + 4096:
            one = r.gather(np.arange(len(r)))
            r.segs, r.part, r.pidx = [one], np.zeros(len(r), np.int64), np.arange(len(r))
        return r

    def gather(self, pos: np.ndarray) -> Any:
        """The data of the rows at ``pos``, in that order: a batch."""
        part = self.part[pos]
        if not len(pos) or (part == part[0]).all():
            p = int(part[0]) if len(pos) else 0
            return take(self.segs[p], self.pidx[pos])
        segs = self.segs
        if not isinstance(segs[0], dict):  # one take over the segments as a table's chunks
            import pyarrow as pa

            sizes = np.fromiter((b.num_rows for b in segs), np.int64, len(segs))
            starts = np.cumsum(sizes) - sizes
            got = pa.Table.from_batches(segs).take(indices(starts[part] + self.pidx[pos]))
            return got.combine_chunks().to_batches()[0]
        order = stable_order(part)
        ps = part[order]
        cuts = np.flatnonzero(np.diff(ps)) + 1
        got = [take(segs[int(part[g[0]])], self.pidx[pos[g]]) for g in np.split(order, cuts)]
        back = np.empty(len(pos), np.int64)
        back[order] = np.arange(len(pos))
        return take(concat(got), back)

    def pieces(
        self, pos: np.ndarray | None = None, before: int | None = None, data: Any = None
    ) -> list[Any]:
        """Log entries ``(src, piece)`` of the rows at ``pos`` (all: None); ``data``: theirs,
        gathered. Without ``before`` (what is held: a state being taken) one piece per input
        batch, in arrival order. With ``before`` (rows that leave while the chunk at input
        position ``before`` is taken) one piece of all, ``src`` the least batch position,
        none if no row is of a batch before it: the log cuts it when a state is taken
        (``cut_piece``), so nothing is sorted or copied here but what ``data`` lacks."""
        if pos is None:
            pos = np.arange(len(self))
        if before is not None:
            src = self.src[pos]
            early = src < before
            if not early.any():
                return []
            if data is None:  # (gathered: only the rows before, the others never count)
                sel = np.flatnonzero(early)
                pos, src = pos[sel], src[sel]
                data = self.gather(pos)
            return [(int(np.min(src)), (PIECE, src, self.idx[pos], data))]
        sel = np.arange(len(pos))
        if before is not None:
            sel = sel[self.src[pos] < before]
        if not len(sel):
            return []
        sel = sel[stable_order(self.seq[pos[sel]])]
        pos = pos[sel]
        src = self.src[pos]
        data = self.gather(pos) if data is None else take(data, sel)
        cuts = np.flatnonzero(np.diff(src)) + 1
        out = []
        for a, z in zip(
            np.concatenate([[0], cuts]).tolist(), np.append(cuts, len(pos)).tolist(), strict=True
        ):
            s = int(src[a])
            out.append((s, (PIECE, s, self.idx[pos[a:z]], slice_of(data, a, z))))
        return out

    @classmethod
    def restored(cls, pieces: Sequence[Any], with_src: bool = False) -> Any:
        """The rows of logged pieces in arrival order (None: no rows); ``with_src``: and
        each row's batch position (a piece's: one, or one per row), ``(None, [])``: none.

        >>> one, two = {"a": np.array([10])}, {"a": np.array([20, 21])}
        >>> Rows.restored([(PIECE, 1, np.array([0]), one), (PIECE, 0, np.arange(2), two)])
        {'a': array([20, 21, 10])}
        >>> Rows.restored([(PIECE, np.array([3, 0]), np.array([0, 5]), two)], True)[1]
        array([0, 3])
        """
        parts = [p for p in pieces if nrows(p[3])]
        if not parts:
            return (None, EMPTY) if with_src else None
        src = np.concatenate([np.full(len(p[2]), p[1], np.int64) for p in parts])
        idx = np.concatenate([np.asarray(p[2], np.int64) for p in parts])
        order = np.lexsort((idx, src))
        data = take(concat([p[3] for p in parts]), order)
        return (data, src[order]) if with_src else data
