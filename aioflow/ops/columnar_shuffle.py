"""``shuffle(n, rows=True)``: tf.data's buffer shuffle of the rows of record batches.

The rows come out exactly as the per-item ``shuffle(n, seed=)`` gives them on the same rows
(one double drawn per row beyond the first ``n``, in arrival order; at the end a
permutation of the buffer), cut into batches: per input batch once the buffer is full, the
rows its rows replace (as many as it has; the batch that fills the buffer gives the rest of
its rows' worth), and at the end the buffer as batches of the largest input batch's size.

No Python step per row: for a batch's slots ``s_0..s_{m-1}`` the output row ``j`` is the row
put into slot ``s_j`` by the last earlier ``j'`` with the same slot, else the buffer's row at
``s_j``, and the buffer afterwards holds per slot the last new row put there (a stable
argsort of the slots). The buffer is kept as ``(segment, row)`` indices into the input
batches (``RowBuffer``); an output is one ``take`` over the segments it draws from, and
when more than ``SEGS`` input batches are kept alive, or they hold more than twice the
buffer's rows (plus ``SLACK``), the buffer's rows are copied into one.

Resuming (``RowShuffleLog``, the columnar ``ShuffleLog``): each output batch logs its
slots and where in it each slot's previous row went (the batch is in flight downstream
anyway), so the buffer ``j`` batches ago is the current one with those rows put back; the
state holds the buffer's rows as one record batch in slot order (``pickle`` stores it).
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable
from typing import Any

import numpy as np

from aioflow._core.chunks import skip_chunks
from aioflow.errors import PipelineError, StateMismatch
from aioflow.ops.columnar import kind_checked, kind_of, nrows, stable_order, take
from aioflow.ops.columnar_rows import Rows
from aioflow.ops.kit import CHUNK_MAX, ChunkIter, Ctx, Opener, aclosing

__all__ = ["RowBuffer", "RowShuffleLog", "rows_check", "shuffle_rows"]

_EMPTY = np.empty(0, np.int64)


def _schema(b: Any) -> Any:
    """What two batches of one stream share: Arrow's schema, or a dict's columns."""
    if isinstance(b, dict):
        return [(k, v.dtype, v.shape[1:]) for k, v in b.items()]
    return b.schema


class RowBuffer:
    """The buffer of ``n`` rows (see the module doc): slot ``i`` is row ``bidx[i]`` of
    ``segs[bpart[i]]`` (``refs``: the slots of each segment; a dead one is None)."""

    SEGS = 16  # input batches kept alive before the buffer's rows are copied into one
    SLACK = 4096  # ... or rows in them beyond twice the buffer's

    def __init__(self, n: int, rng: np.random.Generator) -> None:
        self.n, self.rng = n, rng
        self.segs: list[Any] = []
        self.refs = _EMPTY
        self.bpart = self.bidx = _EMPTY  # capacity grows by doubling; ``fill`` in use
        self.fill = self.size = 0  # (size: the rows of the live segments)
        self.big = 0  # the largest input batch's rows (the flush's batch size)
        self.kind: str | None = None
        self.schema: Any = None

    def live(self) -> int:
        """The input batches (segments) kept alive by the buffer's rows."""
        return sum(s is not None for s in self.segs)

    def check(self, b: Any, pos: int) -> int:
        k = kind_checked(
            b, self.kind, pos, "shuffle(rows=True) shuffles the rows of record batches and got a",
            "use rows=False to shuffle items whole",
            "a record batch or a dict of equal-length numpy arrays",
        )  # fmt: skip
        sch = _schema(b)
        if self.schema is None:
            self.kind, self.schema = k, sch
        elif not (sch == self.schema if k == "dict" else sch.equals(self.schema)):
            raise PipelineError(
                f"item {pos}: shuffle(rows=True) got a batch of columns {sch}, not those of"
                f" the first batch, {self.schema}"
            )
        return nrows(b)

    def _add(self, b: Any) -> int:
        self.segs.append(b)
        self.size += nrows(b)
        self.refs = np.append(self.refs, 0)
        return len(self.segs) - 1

    def _grow(self, size: int) -> None:
        if size > len(self.bpart):
            cap = max(size, min(self.n, 2 * len(self.bpart) + 16))
            for a in ("bpart", "bidx"):
                new = np.empty(cap, np.int64)
                new[: self.fill] = getattr(self, a)[: self.fill]
                setattr(self, a, new)

    def gather(self, part: np.ndarray, idx: np.ndarray, segs: list[Any] | None = None) -> Any:
        """The rows ``idx`` of segments ``part``, in that order: one batch."""
        segs = self.segs if segs is None else segs
        used = np.unique(part)
        if len(used) == 1:
            return take(segs[int(used[0])], idx)
        r = Rows()
        r.segs = [segs[i] for i in used.tolist()]
        r.part, r.pidx = np.searchsorted(used, part), idx
        return r.gather(np.arange(len(part)))

    def put(self, b: Any, m: int) -> tuple[Any, np.ndarray, np.ndarray] | None:
        """Batch ``b`` of ``m`` rows in: the rows it replaces (None: none), the slots it
        changed and where in that output each slot's previous row is."""
        self.big = max(self.big, m)
        if not m:
            return None
        seg = self._add(b)
        k = min(self.n - self.fill, m)
        if k:  # filling the buffer
            self._grow(self.fill + k)
            self.bpart[self.fill : self.fill + k] = seg
            self.bidx[self.fill : self.fill + k] = np.arange(k)
            self.fill += k
            self.refs[seg] += k
        rest = m - k
        if not rest:
            self._tidy()
            return None
        slots = (self.rng.random(rest) * self.n).astype(int)  # the per-item draws
        order = stable_order(slots)
        ss = slots[order]
        head = np.ones(rest, bool)
        head[1:] = ss[1:] != ss[:-1]
        tail = np.ones(rest, bool)
        tail[:-1] = head[1:]
        part, idx = np.full(rest, seg, np.int64), np.empty(rest, np.int64)
        h, o = np.flatnonzero(head), np.flatnonzero(~head)
        u, jf = ss[h], order[h]  # each slot changed, and where its previous row goes
        part[jf], idx[jf] = self.bpart[u], self.bidx[u]
        idx[order[o]] = order[o - 1] + k  # the row put there just before
        out = self.gather(part, idx)
        self.refs -= np.bincount(self.bpart[u], minlength=len(self.refs))
        self.bpart[u], self.bidx[u] = seg, order[tail] + k
        self.refs[seg] += len(u)
        self._tidy()
        return out, u, jf

    def _tidy(self) -> None:
        """Dead segments go; too many alive: the buffer's rows into one."""
        for i in np.flatnonzero(self.refs == 0).tolist():
            if self.segs[i] is not None:
                self.size -= nrows(self.segs[i])
                self.segs[i] = None
        live = self.live()
        if live > self.SEGS or self.size > 2 * self.fill + self.SLACK:
            one = self.gather(self.bpart[: self.fill], self.bidx[: self.fill])
            self.load(one)
        elif len(self.segs) > 2 * live + self.SEGS:
            keep = np.flatnonzero(self.refs > 0)
            new = np.full(len(self.segs), -1, np.int64)
            new[keep] = np.arange(len(keep))
            self.bpart[: self.fill] = new[self.bpart[: self.fill]]
            self.segs, self.refs = [self.segs[i] for i in keep.tolist()], self.refs[keep]

    def load(self, rows: Any) -> None:
        """Hold exactly ``rows`` (a batch, in slot order; None: none)."""
        self.segs, self.refs, self.fill, self.size = [], _EMPTY, 0, 0
        self.bpart = self.bidx = _EMPTY
        if rows is None or not nrows(rows):
            return
        m = nrows(rows)
        seg = self._add(rows)
        self._grow(m)
        self.bpart[:m], self.bidx[:m], self.fill = seg, np.arange(m), m
        self.refs[seg] = m

    def flush(self) -> list[tuple[np.ndarray, np.ndarray]]:
        """The buffer in a random permutation, cut into batches of ``big`` rows: each
        batch's ``(segments, rows)`` to ``gather`` (the buffer stays as it is)."""
        order = self.rng.permutation(self.fill)
        size = max(self.big, 1)
        bp, bi = self.bpart[: self.fill][order], self.bidx[: self.fill][order]
        return [(bp[i : i + size], bi[i : i + size]) for i in range(0, self.fill, size)]


class RowShuffleLog:
    """The columnar ``ShuffleLog``: per output batch ``(out, taken, rng, fill)`` before it,
    the slots it changed, where in it each slot's previous row is and the batch, kept for
    the last ``KEEP`` output chunks. The state after ``k`` batches out: ``{"rows": <the
    buffer's rows, a batch in slot order, or None>, "rng": <bit generator state>, "big":
    <largest input batch>, "drop": d}``, its input resumed after the batches taken then
    (``big`` is the largest so far, not then: the flush's size is the largest of all)."""

    KEEP = 16  # output chunks (as ``ShuffleLog``)

    def __init__(self, ctx: Ctx, buf: RowBuffer) -> None:
        self.lock = threading.Lock()
        self.buf = buf
        self.drop = self.taken = self.out = 0
        self.flushed: tuple[int, Any] | None = None  # (out, rng) as the flush began
        self.done = False
        self.entries: deque[list[Any]] = deque(maxlen=self.KEEP)
        st = ctx.resume
        if st is not None:
            try:
                buf.rng.bit_generator.state = st["rng"]
                buf.big, self.drop = int(st["big"]), int(st["drop"])
                if st["rows"] is not None:
                    buf.check(st["rows"], 0)
                buf.load(st["rows"])
            except (KeyError, TypeError, ValueError, PipelineError):
                raise StateMismatch(f"{ctx.name}: bad state {st!r:.200}") from None
        ctx.seeker(self.at)

    def at(self, k: int) -> tuple[dict[str, Any], int] | None:
        target = k + self.drop
        b = self.buf
        with self.lock:
            fill, segs = b.fill, list(b.segs)
            bpart, bidx = b.bpart[:fill].copy(), b.bidx[:fill].copy()
            entries = [e for chunk in self.entries for e in chunk]
            out, taken, big = self.out, self.taken, b.big
            rng = b.rng.bit_generator.state
            if self.done and target >= out:  # past the end: the buffer was emptied
                return {"rows": None, "rng": rng, "big": big, "drop": 0}, taken
            if self.flushed is not None:  # the whole flush resumes from its start
                out, rng = self.flushed
        src, where = np.full(fill, -1, np.int64), np.arange(fill)
        outs: list[Any] = []
        for out_b, taken_b, rng_b, fill_b, u, jf, batch in reversed(entries):
            if out <= target:
                break
            src[u], where[u] = len(outs), jf  # the rows it replaced, back in their slots
            outs.append(batch)
            src, where = src[:fill_b], where[:fill_b]
            out, taken, rng = out_b, taken_b, rng_b
        if out > target:
            return None  # further back than the log reaches: replay
        rows = None
        if len(src):
            mine = src < 0  # still in the buffer, else in output batch ``src``
            part, idx = src + len(segs), where.copy()
            part[mine], idx[mine] = bpart[where[mine]], bidx[where[mine]]
            rows = b.gather(part, idx, segs + outs)
        return {"rows": rows, "rng": rng, "big": big, "drop": target - out}, taken


async def _shuffle(src: ChunkIter, log: RowShuffleLog) -> ChunkIter:
    b, lock = log.buf, log.lock
    async with aclosing(src):
        async for chunk in src:
            got: list[Any] = []
            entries: list[Any] = []
            failure: PipelineError | None = None
            for x in chunk:
                try:
                    m = b.check(x, log.taken)
                except PipelineError as e:
                    failure = e
                    break
                with lock:
                    before = (log.out, log.taken, b.rng.bit_generator.state, b.fill)
                    res = b.put(x, m)
                    log.taken += 1
                    if res is not None:
                        got.append(res[0])
                        entries.append((*before, res[1], res[2], res[0]))
                        log.out += 1
                        if len(entries) == 1:
                            log.entries.append(entries)
            if got:
                yield got
            if failure is not None:
                raise failure
    if b.fill:
        with lock:
            log.flushed = (log.out, b.rng.bit_generator.state)
            cuts = b.flush()
        for i in range(0, len(cuts), CHUNK_MAX):
            got = [b.gather(*c) for c in cuts[i : i + CHUNK_MAX]]
            with lock:
                log.out += len(got)
                log.done = i + CHUNK_MAX >= len(cuts)
            yield got


def shuffle_rows(
    n: int, rng: Callable[[Ctx], np.random.Generator]
) -> Callable[[Ctx, Any], ChunkIter]:
    """The build of ``shuffle(n, rows=True)``; ``rng(ctx)``: the epoch's generator."""

    def build(ctx: Ctx, inputs: Any) -> ChunkIter:
        opener: Opener = inputs[0]
        log = RowShuffleLog(ctx, RowBuffer(n, rng(ctx)))
        gen = _shuffle(opener(), log)
        return skip_chunks(gen, log.drop) if log.drop else gen

    return build


def rows_check(size: int) -> Callable[[Any, int, Any], str | None]:
    """What of a ``RowShuffleLog`` state is wrong (``Logged.check``)."""

    def check(st: Any, k: int, k_in: Any) -> str | None:
        if not isinstance(st, dict) or set(st) != {"rows", "rng", "big", "drop"}:
            return f"not a shuffle(rows=True) state: {st!r:.200}"
        rows, drop, big = st["rows"], st["drop"], st["big"]
        if rows is not None and (kind_of(rows) is None or nrows(rows) > size):
            return f"a batch of at most {size} rows is needed, got {rows!r:.100}"
        for name, v in (("drop", drop), ("big", big)):
            if not isinstance(v, int) or isinstance(v, bool) or v < 0:
                return f"bad {name} {v!r:.100}"
        return None

    return check
