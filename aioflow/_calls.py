"""How user functions are called: inline, as tasks, in threads, in processes; and errors.

``map`` and ``filter`` (and any operator that calls a user function per item) share this
module: ``ErrorPolicy`` implements ``on_error``, ``inline_map`` the fast path of a sync
function on the loop, ``concurrent_map`` the path with up to ``concurrency`` calls in
flight, ordered or not. What differs between async functions (tasks on the loop), sync
ones in a thread pool, batches of items in the caller's ``Executor`` (a Dask client's
included: one task per ~25 ms of work, not per item) or in the run's process pool
(``_procs``) is only how a call starts: one ``_Calls`` kind each.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import logging
import os
import sys
from collections.abc import Awaitable, Callable, Iterator
from concurrent.futures import Executor
from itertools import compress, islice
from operator import length_hint, truth
from time import perf_counter
from typing import TYPE_CHECKING, Any

from ._autotune import HillClimber, Limiter
from ._check import check_concurrency, fn_name
from ._procs import run_process_pool
from ._runtime import CHUNK_MAX, ChunkIter, Ctx, aclosing, cancelling
from ._threads import DaemonPool
from ._worker import Failure, _failure
from .errors import (
    _NO_ITEM,
    PipelineError,
    StageError,
    StageTimeout,
    WorkerDied,
    annotate,
    control_flow_error,
)

if TYPE_CHECKING:
    from ._procs import ProcessPool

__all__ = [
    "DROP",
    "ErrorPolicy",
    "check_concurrency",
    "concurrent_map",
    "fn_name",
    "inline_map",
    "is_async_callable",
    "resolve_executor",
]

log = logging.getLogger("aioflow")

#: Returned by a ``post`` function to drop an item (how ``filter`` reuses ``map``).
DROP: Any = object()


def is_async_callable(fn: Any) -> bool:
    """True for ``async def`` functions, partials of them and objects with async __call__."""
    while isinstance(fn, functools.partial):
        fn = fn.func
    return inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(
        getattr(fn, "__call__", None)  # noqa: B004
    )


class ErrorPolicy:
    """``on_error``: ``"raise"``, ``"skip"`` (counted and logged), or an int max_failures."""

    __slots__ = ("failures", "limit", "logged", "mode")

    def __init__(self, on_error: str | int) -> None:
        if on_error == "raise":
            self.mode, self.limit = "raise", 0
        elif on_error == "skip":
            self.mode, self.limit = "skip", -1
        elif isinstance(on_error, int) and not isinstance(on_error, bool) and on_error >= 0:
            self.mode, self.limit = "count", on_error
        else:
            raise PipelineError(
                f'on_error must be "raise", "skip" or an int max_failures >= 0, got {on_error!r}'
            )
        self.failures = 0
        self.logged = False

    def skip(self, exc: BaseException, ctx: Ctx, pos: int | None, item: Any = _NO_ITEM) -> bool:
        """True if the failure is to be skipped; else the caller raises ``exc``.

        ``item`` is the failing input, named in the note (``annotate``) when it raises.
        """
        if self.mode == "raise" or not isinstance(exc, Exception) or isinstance(exc, WorkerDied):
            return False  # a dead worker broke the pool: nothing after it can run
        self.failures += 1
        if self.mode == "count" and self.failures > self.limit:
            annotate(exc, ctx.name, pos, item)
            exc.add_note(f"aioflow: more than max_failures={self.limit} failures in this stage")
            return False
        ctx.meter.errors_skipped += 1
        where = f" at item {pos}" if pos is not None else ""
        if not self.logged:
            self.logged = True
            log.warning("stage %r skipped a failure%s: %s", ctx.name, where, repr(exc))
        else:
            log.debug("stage %r skipped a failure%s: %s", ctx.name, where, repr(exc))
        return True


async def inline_map(
    src: ChunkIter, fn: Callable[[Any], Any], ctx: Ctx, policy: ErrorPolicy, *, keep: bool
) -> ChunkIter:
    """Call a sync ``fn`` on every item on the loop, a chunk at a time.

    With ``keep=False`` it is a map (``fn(x)``); with ``keep=True`` a filter (``x`` where
    ``fn(x)`` is true). Items before a failing one are delivered before its error.
    """
    pos = 0
    async with aclosing(src):
        async for chunk in src:
            out: list[Any] = []
            it = iter(chunk)
            while True:
                try:
                    _apply(fn, chunk, it, out, keep, ctx.name, pos)
                    break
                except Exception as e:
                    failed = pos + len(chunk) - length_hint(it) - 1
                    item = chunk[failed - pos]
                    if policy.skip(e, ctx, failed, item):
                        continue
                    if out:
                        yield out
                    raise annotate(e, ctx.name, failed, item) from None
            if pos == 0 and out and inspect.isawaitable(out[0]):
                for a in out:
                    close = getattr(a, "close", None)
                    if close is not None:
                        close()
                raise PipelineError(
                    f"stage {ctx.name!r}: the function returned an awaitable; define it with"
                    " `async def` (or give concurrency=N) so that aioflow awaits it"
                )
            pos += len(chunk)
            if out:
                yield out


def _apply(
    fn: Callable[[Any], Any],
    chunk: list[Any],
    it: Iterator[Any],
    out: list[Any],
    keep: bool,
    stage: str,
    pos: int,
) -> None:
    """``fn`` over the rest of ``it`` (a chunk's iterator) into ``out``, at C speed.

    A ``StopIteration`` from ``fn`` would end ``map()`` early as if the chunk ended: the
    count of results tells, and it fails the item like any other exception.
    """
    n = len(chunk)
    start = n - length_hint(it)
    if keep:
        flags: list[bool] = []
        try:
            flags.extend(map(truth, map(fn, it)))
        finally:  # the items before a failing one are kept
            out.extend(compress(islice(chunk, start, None), flags))
        got = len(flags)
    else:
        before = len(out)
        out.extend(map(fn, it))
        got = len(out) - before
    if start + got < n:
        raise control_flow_error(StopIteration(), stage, pos + start + got)


def resolve_executor(
    executor: str | Executor | None, concurrency: int, ctx: Ctx, timeout: float | None = None
) -> Executor | None:
    """The executor of a thread map; pools made here belong to the run and close with it.

    Closing the run does not wait for a call past ``timeout``: its thread is abandoned
    (``_threads.DaemonPool``), and so is one still running ``CLOSE_GRACE`` s after close.

    ``"process"`` is not an ``Executor`` here: ``concurrent_map`` sends batches of items
    to the run's ``ProcessPool`` (``_procs``) instead.
    """
    if executor is None:
        return None
    if isinstance(executor, Executor):
        return executor  # the caller's: never shut down by us
    if executor == "thread":
        pool = DaemonPool(concurrency, "aioflow-map", timeout, f"stage {ctx.name!r}")
        ctx.run.resources.append(pool.aclose)
        return pool
    raise PipelineError(
        f'executor must be None, "thread", "process" or a concurrent.futures.Executor,'
        f" got {executor!r}"
    )


# -- how calls start: the one thing that differs between async, thread, process, Executor
class _Calls:
    """Starts a stage's calls: ``start(arg, pos)`` returns an awaitable of the result.

    ``slots`` is how many calls may be in flight. A ``batched`` kind takes a list of
    ``size()`` items per call and returns a list with one result or ``Failure`` each.
    """

    batched = False
    slots = 1

    def size(self) -> int:
        return 1

    def start(self, arg: Any, pos: int) -> Awaitable[Any]:
        raise NotImplementedError


class _LoopCalls(_Calls):
    """An async function as a task per call (a sync one is called inline)."""

    def __init__(self, fn: Callable[[Any], Any], slots: int) -> None:
        self.fn = fn
        self.slots = slots
        self.loop = asyncio.get_running_loop()

    def start(self, arg: Any, pos: int) -> Awaitable[Any]:
        r = self.fn(arg)
        if inspect.isawaitable(r):
            return r
        f = self.loop.create_future()
        f.set_result(r)
        return f


class _ExecutorCalls(_Calls):
    """A sync function submitted to a ``concurrent.futures.Executor``, a call per item."""

    def __init__(
        self, fn: Callable[[Any], Any], executor: Executor, slots: int, stage: str
    ) -> None:
        self.fn = fn
        self.executor = executor
        self.slots = slots
        self.stage = stage

    def start(self, arg: Any, pos: int) -> Awaitable[Any]:
        return asyncio.wrap_future(self.executor.submit(_call, self.fn, arg, self.stage, pos))


def _call(fn: Callable[[Any], Any], arg: Any, stage: str, pos: int) -> Any:
    """``fn(arg)`` in an executor; a ``StopIteration`` cannot be set on a future."""
    try:
        return fn(arg)
    except StopIteration as e:
        raise control_flow_error(e, stage, pos) from e


#: A batch sent to a caller's Executor holds about this much work: long enough to make a
#: Dask scheduler's per-task cost (~1 ms) small, short enough to spread over its workers.
EXECUTOR_BATCH_SECONDS = 0.025


def _call_batch(
    fn: Callable[[Any], Any], pid: int, stage: str, items: list[Any]
) -> tuple[list[Any], float]:
    """Call ``fn`` on each item (in the executor): one result or ``Failure`` each, and the time.

    In another process (a Dask worker) a failure carries its traceback as a note and is
    checked to survive pickling; in this one it is the exception object itself.
    """
    t0 = perf_counter()
    out: list[Any] = []
    for x in items:
        try:
            out.append(fn(x))
        except Exception as exc:
            # StopIteration is an error like any other here, never the end of something
            e = control_flow_error(exc, stage) if isinstance(exc, StopIteration) else exc
            if os.getpid() == pid:
                out.append(Failure(e))
            else:
                f = _failure(e)
                out.append(f if f.exc is not None else Failure(StageError(str(f.why))))
    return out, perf_counter() - t0


class _ExecutorBatches(_Calls):
    """A sync function sent to the caller's ``Executor`` in batches of items sized by time.

    The first batch is one item; then each holds ~``EXECUTOR_BATCH_SECONDS`` of work by
    the measured time per item. A batch's compute time (measured where it ran) is the
    stage's busy time.
    """

    batched = True

    def __init__(self, fn: Callable[[Any], Any], executor: Executor, slots: int, ctx: Ctx):
        self.fn = functools.partial(_call_batch, fn, os.getpid(), ctx.name)
        self.executor = executor
        self.slots = slots
        self.meter = ctx.meter
        self.item_seconds: float | None = None
        # a Dask client's executor: a batch is a fresh call, never the result of an equal
        # earlier one (pure=True would reuse it, and hash every batch to know)
        dask = sys.modules.get("distributed.cfexecutor")
        is_dask = dask is not None and isinstance(executor, dask.ClientExecutor)
        self.kwargs: dict[str, Any] = {"pure": False} if is_dask else {}

    def size(self) -> int:
        if self.item_seconds is None:
            return 1
        return max(1, min(CHUNK_MAX, int(EXECUTOR_BATCH_SECONDS / max(self.item_seconds, 1e-7))))

    def start(self, arg: Any, pos: int) -> Awaitable[Any]:
        return self._run(arg)

    async def _run(self, items: list[Any]) -> list[Any]:
        out, dt = await asyncio.wrap_future(self.executor.submit(self.fn, items, **self.kwargs))
        self.meter.t_calls += dt
        per_item = dt / len(items)
        prev = self.item_seconds
        self.item_seconds = per_item if prev is None else 0.7 * prev + 0.3 * per_item
        return out


class _PoolCalls(_Calls):
    """Batches of items sent to the run's process pool (``_procs.ProcessPool``)."""

    batched = True

    def __init__(self, fn: Callable[[Any], Any], pool: ProcessPool) -> None:
        self.pool = pool
        self.fn_id = pool.register(fn)
        self.slots = pool.slots
        self.workers = pool.slots // pool.depth

    def size(self) -> int:
        return self.pool.batch_size()

    def start(self, arg: Any, pos: int) -> Awaitable[Any]:
        return self.pool.submit(self.fn_id, arg, pos)


class _TimedCalls(_Calls):
    """Another kind of calls, each bounded by ``timeout`` (``StageTimeout``)."""

    def __init__(self, inner: _Calls, timeout: float, ctx: Ctx) -> None:
        self.inner = inner
        self.slots = inner.slots
        self.timeout = timeout
        self.ctx = ctx

    def start(self, arg: Any, pos: int) -> Awaitable[Any]:
        return _timed(self.inner.start, arg, pos, self.timeout, self.ctx)


def _calls(
    fn: Callable[[Any], Any],
    executor: str | Executor | None,
    concurrency: int,
    timeout: float | None,
    ordered: bool,
    ctx: Ctx,
) -> _Calls:
    if executor == "process":
        # the pool enforces the timeout itself: it kills the worker of a hung call
        return _PoolCalls(fn, run_process_pool(ctx, concurrency, timeout, ordered))
    ex = resolve_executor(executor, concurrency, ctx, timeout)
    if ex is not None and ex is executor and timeout is None:
        # the caller's Executor: batches (with a timeout, each item is a call of its own)
        return _ExecutorBatches(fn, ex, concurrency, ctx)
    if ex is None:
        calls: _Calls = _LoopCalls(fn, concurrency)
    else:
        calls = _ExecutorCalls(fn, ex, concurrency, ctx.name)
    return calls if timeout is None else _TimedCalls(calls, timeout, ctx)


async def _timed(
    start: Callable[[Any, int], Awaitable[Any]], x: Any, pos: int, timeout: float, ctx: Ctx
) -> Any:
    try:
        async with asyncio.timeout(timeout) as cm:
            return await start(x, pos)
    except TimeoutError:
        if cm.expired():
            raise StageTimeout(
                f"stage {ctx.name!r}: the call on item {pos} took longer than {timeout} s"
            ) from None
        raise


_END = object()


class _Failed:
    __slots__ = ("exc",)

    def __init__(self, exc: BaseException) -> None:
        self.exc = exc


async def concurrent_map(
    src: ChunkIter,
    fn: Callable[[Any], Any],
    ctx: Ctx,
    policy: ErrorPolicy,
    *,
    concurrency: int,
    ordered: bool,
    executor: str | Executor | None = None,
    timeout: float | None = None,
    post: Callable[[Any, Any], Any] | None = None,
    autotune: bool = False,
) -> ChunkIter:
    """Up to ``concurrency`` calls of ``fn`` in flight; results in input or completion order.

    With ``autotune`` the number of calls in flight starts low and a ``HillClimber``
    moves it towards the highest completion rate, up to ``concurrency`` (its cap); the
    limit in use is the stage's ``concurrency`` in the stats. A process pool keeps its
    size (one worker per core).

    One machinery for every kind of call (``_Calls``): async functions as tasks on the
    loop, sync ones in an executor (``"thread"`` or the caller's), or batches of items in
    the run's process pool. A feeder task reads the input and starts calls while a slot
    is free; this generator yields the results, a chunk of all those ready at once.
    ``post(x, y)`` maps a result to the output item, or to ``DROP``. On close every call
    still in flight is cancelled and awaited (a thread call that already runs is waited
    for by the pool's close, up to its timeout or ``CLOSE_GRACE``; a process batch by
    killing its worker at run end).
    """
    loop = asyncio.get_running_loop()
    calls = _calls(fn, executor, concurrency, timeout, ordered, ctx)
    batched = calls.batched
    # ``running`` bounds the calls in flight and frees a slot as soon as a call ends;
    # ``window`` bounds the calls started but not yet delivered (results waiting for an
    # earlier, slower call in an ordered map), which is what bounds the memory
    running = Limiter(calls.slots)
    climber = HillClimber(running, calls.slots) if autotune and not batched else None
    window = asyncio.Semaphore(calls.slots + min(calls.slots, CHUNK_MAX))
    # (pos, arg, future) in input order (ordered) or completion order (unordered)
    results: asyncio.Queue[Any] = asyncio.Queue()
    inflight: set[asyncio.Future[Any]] = set()
    launched = 0
    meter = ctx.meter
    # the stats' concurrency: calls in flight, or a process pool's workers
    meter.concurrency = calls.workers if isinstance(calls, _PoolCalls) else running.limit

    def launch(arg: Any, pos: int) -> None:
        fut: asyncio.Future[Any]
        t0 = perf_counter()
        slot = meter.call_started()

        def done(f: asyncio.Future[Any]) -> None:
            inflight.discard(f)
            running.release()
            if climber is not None:
                climber.done()
                meter.concurrency = running.limit
            # the stage's busy time (aioflow.stats); a pool adds its workers' own
            meter.call_done(slot, t0, perf_counter(), busy=not batched)

        try:
            fut = asyncio.ensure_future(calls.start(arg, pos))
        except Exception as e:  # the call failed before it could start (a sync fn)
            fut = loop.create_future()
            # annotated where it is delivered, with the item: a control-flow exception only
            # becomes a StageError here (it cannot be set on a future as itself)
            fut.set_exception(
                control_flow_error(e, ctx.name, pos) if isinstance(e, StopIteration) else e
            )
        inflight.add(fut)
        fut.add_done_callback(done)
        if ordered:
            results.put_nowait((pos, arg, fut))
        else:
            fut.add_done_callback(lambda f: results.put_nowait((pos, arg, f)))

    async def feed() -> None:
        nonlocal launched
        pos = 0
        try:
            async with aclosing(src):
                async for chunk in src:
                    i, n = 0, len(chunk)
                    while i < n:
                        await window.acquire()
                        await running.acquire()
                        if batched:
                            k = calls.size()
                            launch(chunk[i : i + k], pos + i)
                            i += k
                        else:
                            launch(chunk[i], pos + i)
                            i += 1
                        launched += 1
                    pos += n
        except asyncio.CancelledError as e:
            if cancelling():
                raise
            results.put_nowait(_Failed(control_flow_error(e, ctx.name)))
        except BaseException as e:  # also SystemExit/KeyboardInterrupt from upstream
            results.put_nowait(_Failed(e))
        results.put_nowait(_END)

    feeder = loop.create_task(feed(), name=f"aioflow:{ctx.name}:feed")
    done_feeding = False
    upstream_error: BaseException | None = None
    received = 0
    try:
        out: list[Any] = []
        while True:
            if not ordered and done_feeding and received == launched:
                break
            if results.empty() and out:
                yield out
                out = []
            entry = await results.get()
            if entry is _END:
                done_feeding = True
                if ordered:
                    break
                continue
            if isinstance(entry, _Failed):
                if ordered:
                    if out:
                        yield out
                        out = []
                    raise entry.exc
                upstream_error = entry.exc  # raised once every started call is delivered
                done_feeding = True
                continue
            pos, arg, fut = entry
            if not fut.done() and out:
                yield out
                out = []
            try:
                y = await fut
            except (Exception, asyncio.CancelledError) as e:
                if isinstance(e, asyncio.CancelledError) and cancelling():
                    raise  # the run's own cancellation; else the call's (a user's) error
                item = arg[0] if batched and len(arg) == 1 else arg if not batched else _NO_ITEM
                err = control_flow_error(e, ctx.name, pos, item)
                window.release()
                received += 1
                if policy.skip(err, ctx, pos, item):
                    continue
                if out:
                    yield out
                    out = []
                raise annotate(err, ctx.name, pos, item) from err.__cause__
            window.release()
            received += 1
            if not batched:
                y, arg = [y], [arg]
            for j, yj in enumerate(y):
                if type(yj) is Failure:
                    assert yj.exc is not None
                    if policy.skip(yj.exc, ctx, pos + j, arg[j]):
                        continue
                    if out:
                        yield out
                    raise annotate(yj.exc, ctx.name, pos + j, arg[j]) from None
                if post is not None:
                    yj = post(arg[j], yj)
                    if yj is DROP:
                        continue
                out.append(yj)
            if len(out) >= CHUNK_MAX:
                yield out
                out = []
        if out:
            yield out
        if upstream_error is not None:
            raise upstream_error
    finally:
        feeder.cancel()
        pending = [feeder, *inflight]
        for f in inflight:
            f.cancel()
        await asyncio.wait(pending)
        for f in pending:
            if not f.cancelled():
                f.exception()
        _drain(results)


def _drain(q: asyncio.Queue[Any]) -> None:
    while not q.empty():
        entry = q.get_nowait()
        if isinstance(entry, tuple):
            f = entry[2]
            if f.done() and not f.cancelled():
                f.exception()
