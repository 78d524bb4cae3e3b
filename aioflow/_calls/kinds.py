"""How a concurrent map's calls start: the one thing that differs between call kinds.

Every kind has one batched interface: ``start(items, pos)`` returns a future (a task
of the run, for a coroutine) or a coroutine of one result (or ``Failure``) per item;
``size()`` says how many items the next call takes. Async functions run as tasks on
the loop and sync ones in a thread pool, an item per call; a caller's ``Executor`` (a
Dask client's included) gets batches of ~``EXECUTOR_BATCH_SECONDS`` of work, and the
run's process pool (``_process/pool``) batches sized by its workers' measured call time.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import os
import sys
from collections.abc import Awaitable, Callable
from concurrent.futures import Executor
from time import perf_counter
from typing import Any

from aioflow._core.autotune import items_for
from aioflow._core.ctx import Ctx
from aioflow._core.graph import CHUNK_MAX
from aioflow._core.threads import DaemonPool
from aioflow._core.timeouts import timed
from aioflow._process.pool import ProcessPool, run_process_pool
from aioflow._process.wire import Failure
from aioflow._process.worker import failure_of
from aioflow.errors import PipelineError, StageError, control_flow_error

__all__ = [
    "EXECUTOR_BATCH_SECONDS",
    "STACKED_TASK_SECONDS",
    "Calls",
    "make_calls",
    "resolve_executor",
]

#: A call of a process map before ``batch`` holds about this much work (or one batch):
#: long enough that a batch of cheap items is one call, stacked and sent as one piece.
STACKED_TASK_SECONDS = 0.05

#: A batch sent to a caller's Executor holds about this much work: long enough to make a
#: Dask scheduler's per-task cost (~1 ms) small, short enough to spread over its workers.
EXECUTOR_BATCH_SECONDS = 0.05


def resolve_executor(
    executor: str | Executor | None, concurrency: int, ctx: Ctx, timeout: float | None = None
) -> Executor | None:
    """The executor of a thread map; pools made here belong to the run and close with it.

    Closing the run does not wait for a call past ``timeout``: its thread is abandoned
    (``_threads.DaemonPool``), and so is one still running ``CLOSE_GRACE`` s after close.

    ``"process"`` is not an ``Executor`` here: ``concurrent_map`` sends batches of items
    to the run's ``ProcessPool`` (``_process/pool``) instead.
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


def make_calls(
    fn: Callable[[Any], Any],
    executor: str | Executor | None,
    concurrency: int,
    timeout: float | None,
    ordered: bool,
    ctx: Ctx,
    columns: int = 0,
) -> Calls:
    """The kind of calls of a concurrent map (made when it starts: a pool is the run's)."""
    if executor == "process":
        # the pool enforces the timeout itself: it kills the worker of a hung call
        return _PoolCalls(fn, run_process_pool(ctx, concurrency, timeout, ordered), columns)
    ex = resolve_executor(executor, concurrency, ctx, timeout)
    if ex is not None and ex is executor and timeout is None:
        # the caller's Executor: batches (with a timeout, each item is a call of its own)
        return _ExecutorBatches(fn, ex, concurrency, ctx)
    if ex is None:
        calls: Calls = _LoopCalls(fn, concurrency, ctx)
    else:
        calls = _ExecutorCalls(fn, ex, concurrency, ctx.name)
    return calls if timeout is None else _TimedCalls(calls, timeout, ctx)


class Calls:
    """Starts a stage's calls: ``start(items, pos)``, a list of results or ``Failure``s.

    ``slots``: how many calls may be in flight. ``batched``: a call takes ``size()``
    items, sized by time, and the kind measures its calls' busy time itself (where they
    ran); ``workers``: what the stats show as its concurrency (None: calls in flight).
    """

    batched = False
    slots = 1
    workers: int | None = None

    def size(self) -> int:
        return 1

    def start(self, items: list[Any], pos: int) -> Awaitable[list[Any]]:
        raise NotImplementedError


async def _listed(aw: Awaitable[Any]) -> list[Any]:
    return [await aw]


class _LoopCalls(Calls):
    """An async function as a task of the run per call (a sync one is called inline)."""

    def __init__(self, fn: Callable[[Any], Any], slots: int, ctx: Ctx) -> None:
        self.fn = fn
        self.slots = slots
        self.loop = asyncio.get_running_loop()
        self.run = ctx.run
        self.name = ctx.name

    def start(self, items: list[Any], pos: int) -> Awaitable[list[Any]]:
        r = self.fn(items[0])
        if inspect.isawaitable(r):
            task = self.run.start(_listed(r), self.name)
            if inspect.iscoroutine(r):  # a task cancelled before it ran never awaited it
                task.add_done_callback(lambda _: r.close())
            return task
        f = self.loop.create_future()
        f.set_result([r])
        return f


class _ExecutorCalls(Calls):
    """A sync function submitted to a ``concurrent.futures.Executor``, a call per item."""

    def __init__(
        self, fn: Callable[[Any], Any], executor: Executor, slots: int, stage: str
    ) -> None:
        self.fn = fn
        self.executor = executor
        self.slots = slots
        self.stage = stage

    def start(self, items: list[Any], pos: int) -> Awaitable[list[Any]]:
        return asyncio.wrap_future(self.executor.submit(_call, self.fn, items[0], self.stage, pos))


def _call(fn: Callable[[Any], Any], arg: Any, stage: str, pos: int) -> list[Any]:
    """``[fn(arg)]`` in an executor; a ``StopIteration`` cannot be set on a future."""
    try:
        return [fn(arg)]
    except StopIteration as e:
        raise control_flow_error(e, stage, pos) from e


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
                f = failure_of(e)
                out.append(f if f.exc is not None else Failure(StageError(str(f.why))))
    return out, perf_counter() - t0


class _ExecutorBatches(Calls):
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
        return items_for(EXECUTOR_BATCH_SECONDS, self.item_seconds, CHUNK_MAX)

    def start(self, items: list[Any], pos: int) -> Awaitable[list[Any]]:
        return self._run(items)

    async def _run(self, items: list[Any]) -> list[Any]:
        out, dt = await asyncio.wrap_future(self.executor.submit(self.fn, items, **self.kwargs))
        self.meter.t_calls += dt
        per_item = dt / len(items)
        prev = self.item_seconds
        self.item_seconds = per_item if prev is None else 0.7 * prev + 0.3 * per_item
        return out


class _PoolCalls(Calls):
    """Batches of items sent to the run's process pool (``_procs.ProcessPool``); with
    ``columns=n``, parts of the batches of ``n`` (never two batches' items in one call),
    whose results the worker stacks (``_process/columns``)."""

    batched = True

    def __init__(self, fn: Callable[[Any], Any], pool: ProcessPool, columns: int = 0) -> None:
        self.pool = pool
        self.fn_id = pool.register(fn)
        self.slots = pool.slots
        self.workers = pool.slots // pool.depth
        self.columns = columns

    def size(self) -> int:
        if not self.columns:
            return self.pool.batch_size()
        # a whole batch until a call is timed (as DataLoader's workers: the first batch is
        # one worker's, not waiting for the slowest to start); then ~STACKED_TASK_SECONDS
        # of work, so that slow items spread over the workers
        s = self.pool.item_seconds
        if s is None:
            return self.columns
        return items_for(STACKED_TASK_SECONDS, s, self.columns)

    def start(self, items: list[Any], pos: int) -> Awaitable[list[Any]]:
        if self.columns:
            return self.pool.submit(self.fn_id, items, pos, stack=True)
        return self.pool.submit(self.fn_id, items, pos)


class _TimedCalls(Calls):
    """Another kind of calls, each bounded by ``timeout`` (``_core/timeouts``: ``StageTimeout``)."""

    def __init__(self, inner: Calls, timeout: float, ctx: Ctx) -> None:
        self.inner = inner
        self.slots = inner.slots
        self.timeout = timeout
        self.stage = ctx.name

    def start(self, items: list[Any], pos: int) -> Awaitable[list[Any]]:
        inner = self.inner.start(items, pos)
        # (a loop call's task of the run, or an executor's future: never a new task here)
        assert isinstance(inner, asyncio.Future), inner
        return timed(inner, self.timeout, self.stage, pos)
