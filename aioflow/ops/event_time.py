"""Event time: watermarks, ``window_by_time``, ``sessions`` (and ``sort_by(max_delay=)``'s
build); the as-of join is ``ops/asof.py``, the state machines ``ops/event_time_core.py``.

Each operator is a state machine (``event_time_core``) run by one driver, ``drive``: per
input chunk it computes the chunk's columns with the operator's one access function
(``columns``: times, keys), marks the chunk in the stage's ``HeldLog`` (its state for
resuming, its watermark for ``it.watermark()``), lets the machine take the items and
yields what they released; the stage's meter shows its watermark and late items.
"""

from __future__ import annotations

import asyncio
import functools
import numbers
import operator
from collections.abc import Callable, Sequence
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from aioflow._core.chunks import skip_chunks
from aioflow._state.held import HeldLog
from aioflow.errors import LateItem, PipelineError, annotate
from aioflow.ops.columnar import kind_of, nrows
from aioflow.ops.columnar_base import Auto
from aioflow.ops.columnar_sessions import ColSessions
from aioflow.ops.columnar_sliding import ColSliding
from aioflow.ops.columnar_sort import ColTimeSort
from aioflow.ops.columnar_window import ColWindows
from aioflow.ops.event_time_core import EventMachine, Late, TimeSort, TimeWindows, Window
from aioflow.ops.event_time_sessions import Sessions
from aioflow.ops.kit import CHUNK_MAX, LOGGED, ChunkIter, Ctx, Node, Opener, aclosing, each
from aioflow.ops.sampling import card_unknown

if TYPE_CHECKING:
    from aioflow.pipeline import Pipeline

__all__ = [
    "Window",
    "accessor",
    "columns",
    "drive",
    "sessions_node",
    "time_sort",
    "window_by_time_node",
]

LATE = ("emit", "drop", "raise")
Access = Callable[[list[Any], str, int], tuple[list[list[Any]], BaseException | None]]


def accessor(what: str, f: Any) -> Callable[[Any], Any]:
    """``f`` as a function of an item: a callable, or a column name (``item[name]``)."""
    if isinstance(f, str):
        return operator.itemgetter(f)
    if callable(f):
        return f
    raise PipelineError(f"{what} must be a function of an item or a column name, got {f!r}")


def columns(*fns: Callable[[Any], Any]) -> Access:
    """An operator's one access function: its columns (times, keys) of a chunk, each up to
    the first item that fails, and that failure (annotated) or None."""

    def access(
        chunk: list[Any], stage: str, pos: int
    ) -> tuple[list[list[Any]], BaseException | None]:
        cols: list[list[Any]] = []
        failure: BaseException | None = None
        for f in fns:
            col, err = each(f, chunk, stage, pos)
            if err is not None:
                failure, chunk = err, chunk[: len(col)]
                cols = [c[: len(col)] for c in cols]
            cols.append(col)
        return cols, failure

    return access


def check_time(what: str, v: Any, *, positive: bool = False, none: bool = False) -> Any:
    """A span of event time (a number, or a ``timedelta``), ``> 0`` or ``>= 0``."""
    if v is None and none:
        return v
    ok = isinstance(v, numbers.Real | timedelta) and not isinstance(v, bool)
    if ok:
        zero = timedelta(0) if isinstance(v, timedelta) else 0
        ok = v > zero if positive else v >= zero
    if not ok:
        want = "> 0" if positive else ">= 0"
        raise PipelineError(f"{what} must be a number {want} (in event-time units), got {v!r}")
    return v


def check_late(what: str, on_late: str) -> str:
    if on_late not in LATE:
        raise PipelineError(f"{what} on_late must be 'emit', 'drop' or 'raise', got {on_late!r}")
    return on_late


def late_error(ctx: Ctx, e: Late, pos: int) -> LateItem:
    return LateItem(
        f"stage {ctx.name!r}: item {pos} is late: its time {e.t!r} is below the watermark"
        f" {e.watermark!r} (the largest time seen minus max_delay) and its place was already"
        " emitted; raise max_delay, or use on_late='emit' or 'drop'",
        key=e.t,
        last_key=e.watermark,
        position=pos,
        stage=ctx.name,
    )


LateError = Callable[[Ctx, Late, int], LateItem]


def run_machine(
    ctx: Ctx,
    inputs: Sequence[Opener],
    machine: Any,
    access: Access,
    flush_on_error: bool,
    late: LateError | None = None,
    event_time: bool | None = None,
) -> ChunkIter:
    """A machine's stage: its log, its state restored, and what a resumed run leaves out.

    An ``Auto`` machine (a column-name key) brings its own ``access``."""
    if isinstance(machine, Auto):
        access = machine.access
        if event_time is None:
            event_time = isinstance(machine.m, EventMachine)
    if event_time is None:
        event_time = isinstance(machine, EventMachine)
    log = HeldLog(
        ctx,
        machine.held,
        event_time=event_time,
        weigh=getattr(machine, "weigh", None),
        cut=getattr(machine, "cut", None),
    )
    if log.scalars is not None:
        cols, err = access(log.restored[0], ctx.name, 0)
        if err is not None:
            raise err
        machine.restore(log.scalars, cols, log.restored[0])
    machine.gone = log.gone[0]
    gen = drive(inputs[0](), ctx, machine, access, log, flush_on_error, late or late_error)
    return skip_chunks(gen, log.drop) if log.drop else gen


def _meter(ctx: Ctx, m: Any, late: int, evicted: int) -> None:
    meter = ctx.meter
    meter.late += m.late - late
    meter.evicted += m.evicted - evicted
    meter.watermark = m.watermark
    meter.event_time = m.event_time


#: a columnar chunk of at least this many rows is taken in a thread of the run (numpy's
#: and Arrow's kernels let the GIL go: the stages before it, which make the next chunk
#: meanwhile, and the consumer run beside it); a smaller one on the loop
THREAD_ROWS = 1 << 14


def _rows_of(chunk: list[Any]) -> int:
    """The rows of a chunk of batches (what is not a batch counts none: refused later)."""
    return sum(nrows(b) for b in chunk if kind_of(b) is not None)


async def _in_thread(ctx: Ctx, fn: Callable[[], Any]) -> Any:
    """``fn()`` in the run's thread pool; cancelled, it waits for ``fn`` to end (the
    machine is never left changing after its stage ended)."""
    fut = asyncio.get_running_loop().run_in_executor(ctx.run.thread_pool(), fn)
    try:
        return await asyncio.shield(fut)
    except asyncio.CancelledError:
        await asyncio.wait([fut])
        raise


async def _ahead(src: ChunkIter, on: Callable[[], bool]) -> ChunkIter:
    """``src``'s chunks; while ``on()``, the next one is asked for as soon as one is handed
    out (in a task: it is made while the reader works on this one)."""
    nxt: asyncio.Future[Any] | None = None
    try:
        while True:
            try:
                chunk = await (src.__anext__() if nxt is None else nxt)
            except StopAsyncIteration:
                return
            nxt = asyncio.ensure_future(src.__anext__()) if on() else None
            yield chunk
    finally:
        if nxt is not None:
            if not nxt.done():
                nxt.cancel()
            await asyncio.wait([nxt])
            if not nxt.cancelled():
                nxt.exception()  # (retrieved: an error after the reader stopped is not news)


async def drive(
    src: ChunkIter,
    ctx: Ctx,
    m: Any,
    access: Access,
    log: HeldLog,
    flush_on_error: bool,
    late: LateError,
) -> ChunkIter:
    """Feed a machine the chunks of ``src``; yield what it releases (see the module doc).

    An error (upstream, in the access function, a late item under ``on_late="raise"``)
    comes after what the items before it released (and, ``flush_on_error``, after all
    the machine holds, in order, unless it is a late item: ``sort_by``). A columnar
    machine (``Auto``) takes a chunk of ``THREAD_ROWS`` rows or more in a thread of the
    run, the next chunk read ahead meanwhile.
    """
    pos = out_n = 0
    failure: BaseException | None = None
    with log.lock:
        log.mark(0, (0,), m.state(), m.watermark)
    columnar = isinstance(m, Auto) and m.make is not None

    def take(cols: Any, items: Any, out: list[Any]) -> BaseException | None:
        with log.lock:
            if pos:
                log.mark(out_n, (pos,), m.state(), m.watermark)
            try:
                m.add(cols, items, pos, out)
            except Late as e:
                return late(ctx, e, e.seq)
            except Exception as e:  # times that do not compare or subtract
                return annotate(e, ctx.name, pos)
        return None

    ahead = _ahead(src, lambda: bool(m.col)) if columnar else src  # (batches: read ahead)
    async with aclosing(src), aclosing(ahead) as chunks:
        try:
            async for chunk in chunks:
                cols, failure = access(chunk, ctx.name, pos)
                n = len(cols[0])
                out: list[Any] = []
                late0, evicted0 = m.late, m.evicted
                items = chunk if n == len(chunk) else chunk[:n]
                if columnar and m.col and _rows_of(items) >= THREAD_ROWS:
                    err = await _in_thread(ctx, functools.partial(take, cols, items, out))
                else:
                    err = take(cols, items, out)
                failure = err or failure
                pos += n
                _meter(ctx, m, late0, evicted0)
                if out:
                    out_n += len(out)
                    yield out
                if failure is not None:
                    break
        except Exception as e:  # upstream
            failure = annotate(e, ctx.name, pos)
    if failure is None or (flush_on_error and not isinstance(failure, LateItem)):
        out = []
        with log.lock:
            log.mark(out_n, (pos,), m.state(), m.watermark)
            try:
                m.finish(out)
            except Exception as e:  # keys that do not compare: only the (first) error
                out = []
                failure = failure or annotate(e, ctx.name, pos)
        _meter(ctx, m, m.late, m.evicted)
        for i in range(0, len(out), CHUNK_MAX):
            piece = out[i : i + CHUNK_MAX]
            out_n += len(piece)
            yield piece
        with log.lock:
            log.mark(out_n, (pos,), m.state(), m.watermark)
    if failure is not None:
        raise failure


# -- the nodes ----------------------------------------------------------------------------
def time_sort(
    key: Any, max_delay: Any, on_late: str
) -> Callable[[Ctx, Sequence[Opener]], ChunkIter]:
    """``sort_by(key, max_delay=d)``'s build: ``TimeSort`` (an error flushes its heap), or
    on batches with a column-name key ``ColTimeSort``."""
    check_time("sort_by max_delay", max_delay)
    access = columns(accessor("sort_by key", key))

    def machine() -> Any:
        m = TimeSort(max_delay, on_late)
        if isinstance(key, str):
            return Auto(m, access, lambda: ColTimeSort(key, on_late, max_delay))
        return m

    return lambda ctx, inputs: run_machine(ctx, inputs, machine(), access, flush_on_error=True)


def window_by_time_node(
    up: Pipeline[Any],
    time: Any,
    size: Any,
    slide: Any,
    by: Any,
    max_delay: Any,
    allowed_lateness: Any,
    on_late: str,
) -> Node:
    """``window_by_time``: tumbling or sliding windows of event time (``TimeWindows``; on
    batches ``ColWindows``, tumbling or ``slide == size``, else ``ColSliding``)."""
    fns = [accessor("window_by_time time", time)]
    if by is not None:
        fns.append(accessor("window_by_time by", by))
    check_time("window_by_time size", size, positive=True)
    check_time("window_by_time slide", slide, positive=True, none=True)
    check_time("window_by_time max_delay", max_delay)
    check_time("window_by_time allowed_lateness", allowed_lateness)
    check_late("window_by_time", on_late)
    access = columns(*fns)
    step = size if slide is None else slide

    def columnar() -> ColWindows | ColSliding:
        if slide is None or slide == size:
            return ColWindows(time, by, size, allowed_lateness, max_delay, on_late)
        return ColSliding(time, by, size, slide, allowed_lateness, max_delay, on_late)

    def build(ctx: Ctx, inputs: Sequence[Opener]) -> ChunkIter:
        m: Any = TimeWindows(size, step, allowed_lateness, max_delay, on_late)
        if isinstance(time, str) and (by is None or isinstance(by, str)):
            m = Auto(m, access, columnar)
        return run_machine(ctx, inputs, m, access, flush_on_error=False)

    name = f"window_by_time({size})" if slide is None else f"window_by_time({size}, {slide})"
    return Node(
        name,
        build,
        inputs=(up,),
        card=card_unknown,
        key=(time, size, slide, by, max_delay, allowed_lateness, on_late),
        resume=LOGGED,
    )


def sessions_node(
    up: Pipeline[Any],
    time: Any,
    gap: Any,
    by: Any,
    max_delay: Any,
    max_duration: Any,
    max_items: int | None,
    on_late: str,
    max_keys: int | None = None,
) -> Node:
    """``sessions``: per-key session windows closed by a gap of event time (``Sessions``)."""
    access = columns(accessor("sessions time", time), accessor("sessions by", by))
    check_time("sessions gap", gap, positive=True)
    check_time("sessions max_delay", max_delay)
    check_time("sessions max_duration", max_duration, positive=True, none=True)
    for what, v in (("max_items", max_items), ("max_keys", max_keys)):
        if v is not None and (not isinstance(v, int) or isinstance(v, bool) or v < 1):
            raise PipelineError(f"sessions {what} must be an int >= 1 or None, got {v!r}")
    check_late("sessions", on_late)

    def build(ctx: Ctx, inputs: Sequence[Opener]) -> ChunkIter:
        m: Any = Sessions(gap, max_delay, max_duration, max_items, on_late, max_keys)
        if isinstance(time, str) and isinstance(by, str):
            m = Auto(
                m,
                access,
                lambda: ColSessions(
                    time, by, gap, max_delay, max_duration, max_items, on_late, max_keys
                ),
            )
        return run_machine(ctx, inputs, m, access, flush_on_error=False)

    return Node(
        f"sessions({gap})",
        build,
        inputs=(up,),
        card=card_unknown,
        key=(time, gap, by, max_delay, max_duration, max_items, on_late, max_keys),
        resume=LOGGED,
    )
