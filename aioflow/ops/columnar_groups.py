"""``group_by`` on record batches: the columnar twin of ``Groups``
(``ops/ordering_stream``), with the machine interface of ``ops/event_time_core``.

Output: as the per-item ``group_by``, a ``(key, items)`` tuple per group, ``items`` the
group's rows in arrival order as a batch of the stream's kind (a zero-copy slice), in the
order the per-item machine emits them; at the end the open groups, in the order they
began.

Without ``max_keys`` a batch is vectorized: rows grouped by key (a stable argsort), each
row's place in its key's open group (the rows the group had plus its rank in the batch),
a group complete at its ``size``-th row. With ``max_keys`` (an eviction depends on the
order of arrival) the batch runs the per-item machine on the rows' indices, exactly.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from typing import Any

import numpy as np

from aioflow.ops.columnar import column, stable_order, windows_of
from aioflow.ops.columnar_base import ColumnarBase
from aioflow.ops.columnar_rows import Rows
from aioflow.ops.ordering_stream import Groups

__all__ = ["ColGroups"]


class ColGroups(ColumnarBase):
    """``group_by(col, size=, max_keys=)`` on batches (see the module doc)."""

    watermark = None
    event_time = None

    def __init__(self, key: str, size: int | None, max_keys: int | None) -> None:
        super().__init__()
        self.key, self.size, self.max_keys = key, size, max_keys
        self.buf = Rows(cols={"k": np.empty(0), "g": np.empty(0, np.int64)})
        self.gkey: np.ndarray = np.empty(0)  # the open groups (at most one per key)
        self.gcount = np.empty(0, np.int64)

    def add(
        self, cols: Sequence[Sequence[Any]], items: Sequence[Any], start: int, out: list[Any]
    ) -> None:
        for i, b in enumerate(items):
            b = self.batch(b, start + i)
            k = np.asarray(column(b, self.key))
            new = Rows.of(b, start + i, self.rows, k=k, g=np.full(len(k), -1, np.int64))
            self.rows += len(k)
            if not len(k):
                continue
            if self.max_keys is None:
                self.fast(new, start, out)
            else:
                self.exact(new, start, out)

    def fast(self, new: Rows, start: int, out: list[Any]) -> None:
        k, n, size = new.cols["k"], len(new), self.size
        ng = len(self.gkey)
        o = stable_order(k)
        ks = k[o]
        head = np.ones(n, bool)
        head[1:] = ks[1:] != ks[:-1]
        seg = np.cumsum(head) - 1
        heads = np.flatnonzero(head)
        rank = np.arange(n) - heads[seg]
        before = np.zeros(len(heads), np.int64)
        had = np.full(len(heads), -1, np.int64)
        if ng:
            srt = stable_order(self.gkey)
            sk = self.gkey[srt]
            p = np.minimum(np.searchsorted(sk, ks[heads]), ng - 1)
            hit = sk[p] == ks[heads]
            had[hit] = srt[p[hit]]
            before[hit] = self.gcount[had[hit]]
        total = before[seg] + rank
        nth = total // size if size is not None else np.zeros(n, np.int64)
        newg = head.copy()
        newg[1:] |= nth[1:] != nth[:-1]
        gseg = np.cumsum(newg) - 1
        ghead = np.flatnonzero(newg)
        old = head[ghead] & (had[seg[ghead]] >= 0)  # its key's open group goes on
        gid = np.where(old, had[seg[ghead]], ng + np.cumsum(~old) - 1)
        g = np.empty(n, np.int64)
        g[o] = gid[gseg]
        new.cols["g"] = g
        total_g = ng + int((~old).sum())
        count = np.zeros(total_g, np.int64)
        count[:ng] = self.gcount
        np.add.at(count, gid[gseg], 1)
        key = np.concatenate([self.gkey, ks[ghead[~old]]]) if ng else ks[ghead[~old]]
        if size is not None:
            done_rows = o[(total + 1) % size == 0]  # arrival positions completing a group
            done = g[np.sort(done_rows)]
        else:
            done = np.empty(0, np.int64)
        self.emit(self.buf.cat(new), key, count, done, start, out)

    def emit(
        self, allr: Rows, key: np.ndarray, count: np.ndarray, done: np.ndarray, start: int,
        out: list[Any],
    ) -> None:  # fmt: skip
        """Emit the groups ``done`` (in order), keep the others open."""
        rank = np.full(len(key), -1, np.int64)
        rank[done] = np.arange(len(done))
        rr = rank[allr.cols["g"]]
        em = np.flatnonzero(rr >= 0)
        em = em[stable_order(rr[em])]
        if len(done):
            rows = allr.gather(em)
            counts = np.bincount(rr[em], minlength=len(done))
            out.extend(windows_of(rows, counts, self.key))
            self.gone.extend(allr.pieces(em, before=start, data=rows))
        keep = rank < 0
        renum = np.cumsum(keep) - 1
        self.gkey, self.gcount = key[keep], count[keep]
        rest = allr.take(np.flatnonzero(rr < 0))
        rest.cols["g"] = renum[rest.cols["g"]]
        self.buf = rest

    # -- the exact path: the per-item machine on row indices -------------------------------
    def exact(self, new: Rows, start: int, out: list[Any]) -> None:
        allr = self.buf.cat(new)
        m = self.machine(allr)
        got: list[Any] = []
        h = len(self.buf)
        m.add([new.cols["k"].tolist()], list(range(h, len(allr))), int(new.seq[0]), got)
        self.evicted += m.evicted
        self.finish_exact(m, allr, got, start, out)

    def machine(self, allr: Rows) -> Groups:
        m = Groups(self.size, self.max_keys)
        g = allr.cols["g"]
        held = np.flatnonzero(g >= 0)
        by = held[stable_order(g[held])]
        cuts = np.searchsorted(g[by], np.arange(len(self.gkey) + 1))
        first = [int(allr.seq[by[cuts[j]]]) for j in range(len(self.gkey))]
        groups: OrderedDict[Any, list[list[Any]]] = OrderedDict()
        keys = self.gkey.tolist()
        for j in sorted(range(len(keys)), key=first.__getitem__):
            pos = by[cuts[j] : cuts[j + 1]]
            groups[keys[j]] = [pos.tolist(), allr.seq[pos].tolist()]
        m.groups = groups
        return m

    def finish_exact(
        self, m: Groups, allr: Rows, got: list[Any], start: int, out: list[Any]
    ) -> None:
        """What the per-item machine emitted (groups of row positions) out, the rest open."""
        gs = list(m.groups.items())
        g = np.full(len(allr), -1, np.int64)
        nd = len(got)
        for j, (_, pos) in enumerate(got):
            g[np.asarray(pos, np.int64)] = j
        for j, (_, (pos, _)) in enumerate(gs):
            g[np.asarray(pos, np.int64)] = nd + j
        allr.cols["g"] = g
        kd = allr.cols["k"]
        key = np.asarray(
            [x for x, _ in got] + [x for x, _ in gs], kd.dtype if kd.dtype.kind != "U" else None
        )
        count = np.asarray([len(p) for _, p in got] + [len(p[0]) for _, p in gs], np.int64)
        if not len(key):
            key = kd[:0]
        self.emit(allr, key, count, np.arange(nd), start, out)

    # -- the end, the state ---------------------------------------------------------------
    def finish(self, out: list[Any]) -> None:
        if len(self.gkey):
            g = self.buf.cols["g"]
            first = np.full(len(self.gkey), np.iinfo(np.int64).max)
            np.minimum.at(first, g, self.buf.seq)
            order = stable_order(first)
            self.emit(self.buf, self.gkey, self.gcount, order, 1 << 62, out)
        self.done = True

    def held(self) -> list[list[Any]]:
        return [self.buf.pieces()]

    def restore(
        self, scalars: dict[str, Any], cols: Sequence[Sequence[Any]], items: Sequence[Any]
    ) -> None:
        data = self.restored(scalars, items)
        if data is None:
            return
        k = np.asarray(column(data, self.key))
        n = len(k)
        allr = Rows.of(data, -1, -n, k=k, g=np.full(n, -1, np.int64))
        m = Groups(self.size, self.max_keys)
        m.restore({}, [k.tolist()], list(range(n)))
        out: list[Any] = []
        self.finish_exact(m, allr, [], 0, out)
