"""``asof_join``: a point-in-time join of two event-time streams (``AsofJoin``, its driver).

Each item of the left stream comes out once as ``(item, match)``, in the left stream's
order: ``match`` is the item of the right stream with the same ``by`` key whose ``on``
time is the largest at or before the item's own (the latest arrival among equal times),
within ``tolerance``, or None. A right item later than the left one never pairs with it.

Both streams are in event time: each has a watermark (its largest time seen minus
``max_delay``). A left item waits until the right watermark passes its time (every
right item at or before it has arrived) or the right stream ends. The right items kept
per key are those from the latest one at or before the left watermark on (older ones
can match no left item to come), and none older than ``tolerance`` before it: the state
is bounded by the keys alive (``max_keys``, least recently updated first out, counted as
evicted) and the right items within ``tolerance``. A left item below the left watermark
when it arrives is late: its match may be gone, so it comes out as ``(item, None)``; a
late right item is dropped; both are counted late.

On record batches with column names for ``on`` and ``by`` (the left stream's first item
a batch) the machine is ``ColAsof`` (``ops/columnar_asof``; with ``max_keys``
``ColAsofExact``), picked by ``_Auto`` at the first chunk and driven by the same driver.
"""

from __future__ import annotations

import bisect
import math
from collections import OrderedDict, deque
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from aioflow._core.base import PipelineBase
from aioflow._core.chunks import skip_chunks
from aioflow._state.held import HeldLog
from aioflow.errors import PipelineError, annotate
from aioflow.ops.columnar import kind_of
from aioflow.ops.columnar_asof import ColAsof
from aioflow.ops.columnar_asof_exact import ColAsofExact
from aioflow.ops.columnar_base import Auto
from aioflow.ops.event_time import Access, accessor, check_time, columns
from aioflow.ops.event_time_core import back
from aioflow.ops.kit import LOGGED, ChunkIter, Ctx, Node, Opener, aclosing, check_int

if TYPE_CHECKING:
    from aioflow.pipeline import Pipeline

__all__ = ["AsofJoin", "asof_join_node"]

_INF = math.inf


class AsofJoin:
    """The as-of join's state machine (see the module doc; the interface of
    ``ops/event_time_core``, with one ``add`` per side):

    - ``add_left(cols, items, start, out)`` / ``add_right(...)``: ``cols`` are the items'
      ``on`` times and ``by`` keys; released pairs are appended to ``out``;
    - ``end_right(out)``: the right stream ended, every waiting left item comes out;
    - ``blocked``: a left item waits for the right stream (the driver reads it then);
    - ``held()``: ``[waiting left entries, right entries]``, entries ending ``(seq, x)``.
    """

    def __init__(self, tolerance: Any, max_delay: Any, max_keys: int | None) -> None:
        self.tol, self.delay, self.max_keys = tolerance, max_delay, max_keys
        self.pending: deque[tuple[Any, Any, int, tuple[Any, bool]]] = (
            deque()
        )  # t, key, seq, (x, late)
        self.right: OrderedDict[Any, list[tuple[Any, int, Any]]] = OrderedDict()  # (t, seq, x)
        self.maxl: Any = None
        self.maxr: Any = None
        self.rdone = False
        self.done = False
        self.late = self.evicted = 0
        self.taken = [0, 0]  # arrivals before the current chunk, per side (see ``gone``)
        self.gone: list[list[Any]] = [[], []]

    # -- what the driver reads ------------------------------------------------------------
    @property
    def blocked(self) -> bool:
        return bool(self.pending) and not self.rdone

    def _floor(self) -> Any:
        """No left item to come (but late ones) has a time below this: the output watermark."""
        if self.maxl is None:
            return None
        p = back(self.maxl, self.delay)
        for t, _, _, (_, late) in self.pending:
            if not late and t < p:
                p = t
        return p

    @property
    def watermark(self) -> Any:
        return self.maxl if self.done else self._floor()

    @property
    def event_time(self) -> Any:
        return self.maxl

    # -- the sides ------------------------------------------------------------------------
    def add_left(
        self, cols: Sequence[Sequence[Any]], items: Sequence[Any], start: int, out: list[Any]
    ) -> None:
        times, keys = cols[0], (cols[1] if len(cols) > 1 else None)
        for i, (t, x) in enumerate(zip(times, items, strict=False)):
            late = self.maxl is not None and t < back(self.maxl, self.delay)
            if late:
                self.late += 1
            elif self.maxl is None or t > self.maxl:
                self.maxl = t
            self.pending.append((t, keys[i] if keys is not None else None, start + i, (x, late)))
        self._release(out)

    def add_right(
        self, cols: Sequence[Sequence[Any]], items: Sequence[Any], start: int, out: list[Any]
    ) -> None:
        times, keys = cols[0], (cols[1] if len(cols) > 1 else None)
        floor = self._floor()
        for i, (t, x) in enumerate(zip(times, items, strict=False)):
            if self.maxr is not None and t < back(self.maxr, self.delay):
                self.late += 1  # its place among the right items was passed: dropped
                continue
            if self.maxr is None or t > self.maxr:
                self.maxr = t
            self._insert(keys[i] if keys is not None else None, (t, start + i, x), floor)
        self._expire(floor)
        self._release(out)

    def end_right(self, out: list[Any]) -> None:
        self.rdone = True
        self._release(out)

    def finish(self) -> None:
        self.done = True

    # -- inside ---------------------------------------------------------------------------
    def _insert(self, k: Any, e: tuple[Any, int, Any], floor: Any) -> None:
        right = self.right
        lst = right.get(k)
        if lst is None:
            if self.max_keys is not None and len(right) >= self.max_keys:
                _, old = right.popitem(last=False)  # the least recently updated key
                self._gone(1, old)
                self.evicted += 1
            lst = right[k] = []
        else:
            right.move_to_end(k)
        bisect.insort(lst, e)
        if floor is not None:
            self._prune(k, lst, floor)

    def _prune(self, k: Any, lst: list[tuple[Any, int, Any]], floor: Any) -> None:
        """Drop what no left item to come can match: all before the latest item at or
        before ``floor``, and what is more than ``tolerance`` before ``floor``."""
        j = bisect.bisect_right(lst, (floor, _INF)) - 1
        if self.tol is not None:
            j = max(j, bisect.bisect_left(lst, (floor - self.tol,)))
        if j > 0:
            self._gone(1, lst[:j])
            del lst[:j]
            if not lst:  # (all older than tolerance)
                del self.right[k]

    def _expire(self, floor: Any) -> None:
        """Forget keys whose latest item is more than ``tolerance`` before ``floor``."""
        if self.tol is None or floor is None:
            return
        right, old = self.right, floor - self.tol
        while right:
            k, lst = next(iter(right.items()))
            if lst[-1][0] >= old:
                break
            self._gone(1, right.pop(k))

    def _gone(self, side: int, entries: Sequence[Any]) -> None:
        before = self.taken[side]
        self.gone[side].extend(e for e in entries if e[-2] < before)

    def _match(self, t: Any, k: Any) -> Any:
        lst = self.right.get(k)
        if not lst:
            return None
        i = bisect.bisect_right(lst, (t, _INF)) - 1
        if i < 0 or (self.tol is not None and t - lst[i][0] > self.tol):
            return None
        return lst[i][2]

    def _release(self, out: list[Any]) -> None:
        pending, emit = self.pending, out.append
        wm = None if self.maxr is None else back(self.maxr, self.delay)
        while pending:
            t, k, s, (x, late) = pending[0]
            if late:
                emit((x, None))
            elif self.rdone or (wm is not None and wm > t):
                emit((x, self._match(t, k)))
            else:
                break
            e = pending.popleft()
            if s < self.taken[0]:
                self.gone[0].append(e)

    # -- the state ------------------------------------------------------------------------
    def held(self) -> list[list[Any]]:
        return [list(self.pending), [e for lst in self.right.values() for e in lst]]

    def state(self) -> dict[str, Any]:
        return {"maxl": self.maxl, "maxr": self.maxr, "rdone": self.rdone}

    def restore(
        self, scalars: dict[str, Any], left: tuple[Any, Any], right: tuple[Any, Any]
    ) -> None:
        """``left``/``right``: (cols, items) of what it held, in arrival order; the left
        items are ``(item, late)`` pairs."""
        self.maxl, self.maxr, self.rdone = scalars["maxl"], scalars["maxr"], scalars["rdone"]
        (lc, li), (rc, ri) = left, right
        n = len(li)
        for i, pair in enumerate(li):
            k = lc[1][i] if len(lc) > 1 else None
            self.pending.append((lc[0][i], k, i - n, (pair[0], bool(pair[1]))))
        n = len(ri)
        for i, x in enumerate(ri):
            k = rc[1][i] if len(rc) > 1 else None
            self._insert(k, (rc[0][i], i - n, x), None)


class _Auto(Auto):
    """``AsofJoin``, or ``ColAsof`` when the left stream's first item is a record batch
    (``on``/``by`` column names): decided at the first chunk, which is the left's."""

    blocked = property(lambda self: self.m.blocked)
    taken = property(lambda self: self.m.taken)

    def add_left(self, cols: Any, items: Sequence[Any], start: int, out: list[Any]) -> None:
        self.m.add_left(cols, items, start, out)

    def add_right(self, cols: Any, items: Sequence[Any], start: int, out: list[Any]) -> None:
        if not self.col and items and kind_of(items[0]) is not None:
            raise PipelineError(
                f"asof_join: item {start} of the right stream is a record batch, but the"
                " left stream's are not: join batches with batches (columnar) or rows with"
                " rows (unbatch() the batches)"
            )
        self.m.add_right(cols, items, start, out)

    def end_right(self, out: list[Any]) -> None:
        self.m.end_right(out)

    def finish(self, out: list[Any] | None = None) -> None:
        self.m.finish()

    def restore(self, scalars: dict[str, Any], left: Any, right: Any) -> None:
        if scalars.get("columnar") and not self.col:
            self._columnar()
        self.decided = self.decided or self.col
        self.m.restore(scalars, left, right)


async def _drive(
    left: ChunkIter, right: ChunkIter, ctx: Ctx, m: Any, access: Access, log: HeldLog
) -> ChunkIter:
    """Read the left stream while nothing waits, the right one while a left item does."""
    taken = [0, 0]
    out_n = 0
    ldone = False
    meter = ctx.meter
    failure: BaseException | None
    with log.lock:
        log.mark(0, taken, m.state(), m.watermark)
    async with aclosing(left), aclosing(right):
        while True:
            side = 1 if m.blocked else 0
            if side == 0 and ldone:
                break
            try:
                chunk = await anext(right if side else left, None)
            except Exception as e:  # upstream: raised as itself, with where
                failure = annotate(e, ctx.name, taken[side])
            else:
                failure = None
            if failure is not None:
                raise failure
            out: list[Any] = []
            late, evicted = m.late, m.evicted
            with log.lock:
                log.mark(out_n, taken, m.state(), m.watermark)
                m.taken[:] = taken  # what arrived before this chunk, per side
                if chunk is None:
                    if side:
                        m.end_right(out)
                    ldone = ldone or not side
                else:
                    cols, failure = access(chunk, ctx.name, taken[side])
                    items = chunk[: len(cols[0])]
                    (m.add_right if side else m.add_left)(cols, items, taken[side], out)
                    taken[side] += len(items)
            meter.late += m.late - late
            meter.evicted += m.evicted - evicted
            meter.watermark, meter.event_time = m.watermark, m.event_time
            if out:
                out_n += len(out)
                yield out
            if failure is not None:
                raise failure
    with log.lock:
        m.finish()
        log.mark(out_n, taken, m.state(), m.watermark)
    meter.watermark = m.watermark


def asof_join_node(
    up: Pipeline[Any],
    other: Pipeline[Any],
    on: Any,
    by: Any,
    tolerance: Any,
    direction: str,
    max_delay: Any,
    max_keys: int | None,
) -> Node:
    """``asof_join``: ``(item, match or None)`` per item of ``up`` (see the module doc)."""
    if not isinstance(other, PipelineBase):
        raise PipelineError(f"asof_join needs a Pipeline to join, got {type(other).__name__}")
    if direction != "backward":
        raise PipelineError(
            f"asof_join direction must be 'backward' (a point-in-time join never pairs an"
            f" item with a later one), got {direction!r}"
        )
    fns = [accessor("asof_join on", on)]
    if by is not None:
        fns.append(accessor("asof_join by", by))
    access = columns(*fns)
    check_time("asof_join tolerance", tolerance, none=True)
    check_time("asof_join max_delay", max_delay)
    if max_keys is not None:
        check_int("asof_join max_keys", max_keys, 1)

    columnar = isinstance(on, str) and (by is None or isinstance(by, str))

    def columnar_machine() -> ColAsof:
        if max_keys is None:
            return ColAsof(on, by, tolerance, max_delay)
        return ColAsofExact(on, by, tolerance, max_delay, max_keys, AsofJoin)

    def build(ctx: Ctx, inputs: Sequence[Opener]) -> ChunkIter:
        m: Any = AsofJoin(tolerance, max_delay, max_keys)
        acc = access
        if columnar:
            m = _Auto(m, access, columnar_machine)
            acc = m.access
        log = HeldLog(
            ctx, m.held, inputs=2, weigh=getattr(m, "weigh", None), cut=getattr(m, "cut", None)
        )
        if log.scalars is not None:
            li, ri = log.restored
            if log.scalars.get("columnar"):
                m.restore(log.scalars, li, ri)
            else:
                lc, err = access([p[0] for p in li], ctx.name, 0)
                rc, err2 = access(ri, ctx.name, 0)
                if err or err2:
                    raise err or err2  # type: ignore[misc]
                m.restore(log.scalars, (lc, li), (rc, ri))
        m.gone = log.gone
        gen = _drive(inputs[0](), inputs[1](), ctx, m, acc, log)
        return skip_chunks(gen, log.drop) if log.drop else gen

    return Node(
        "asof_join",
        build,
        inputs=(up, other),
        card=lambda cs: cs[0],
        key=(on, by, tolerance, direction, max_delay, max_keys),
        resume=LOGGED,
    )
