"""How user functions are called: inline, as tasks, in threads, in processes; and errors.

``map`` and ``filter`` (and any operator that calls a user function per item) share this
module: ``ErrorPolicy`` implements ``on_error``, ``inline_map`` the fast path of a sync
function on the loop, ``concurrent_map`` the path with up to ``concurrency`` calls in
flight (async functions as tasks, sync ones in an executor), ordered or not.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import logging
from collections.abc import Awaitable, Callable
from concurrent.futures import Executor, ThreadPoolExecutor
from operator import length_hint
from time import perf_counter
from typing import Any

from ._runtime import CHUNK_MAX, ChunkIter, Ctx, aclosing, in_thread
from .errors import PipelineError, StageTimeout, annotate

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

#: ``concurrency=AUTOTUNE``: chosen by the runtime while it runs.
AUTOTUNE = -1


def fn_name(fn: Any) -> str:
    """A short name for a user function, for stage names."""
    while isinstance(fn, functools.partial):
        fn = fn.func
    return getattr(fn, "__name__", None) or type(fn).__name__


def is_async_callable(fn: Any) -> bool:
    """True for ``async def`` functions, partials of them and objects with async __call__."""
    while isinstance(fn, functools.partial):
        fn = fn.func
    return inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(
        getattr(fn, "__call__", None)  # noqa: B004
    )


def check_concurrency(concurrency: int, what: str = "concurrency") -> int:
    if concurrency == AUTOTUNE:
        return concurrency
    if isinstance(concurrency, bool) or not isinstance(concurrency, int) or concurrency < 1:
        raise PipelineError(f"{what} must be a positive int or af.AUTOTUNE, got {concurrency!r}")
    return concurrency


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

    def skip(self, exc: BaseException, ctx: Ctx, pos: int | None) -> bool:
        """True if the failure is to be skipped; else the caller raises ``exc``."""
        if self.mode == "raise" or not isinstance(exc, Exception):
            return False
        self.failures += 1
        if self.mode == "count" and self.failures > self.limit:
            annotate(exc, ctx.name, pos)
            exc.add_note(f"aioflow: more than max_failures={self.limit} failures in this stage")
            return False
        ctx.meter.errors_skipped += 1
        where = f" at item {pos}" if pos is not None else ""
        if not self.logged:
            self.logged = True
            log.warning("stage %r skipped a failure%s: %r", ctx.name, where, exc)
        else:
            log.debug("stage %r skipped a failure%s: %r", ctx.name, where, exc)
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
                    out.extend(filter(fn, it) if keep else map(fn, it))
                    break
                except Exception as e:
                    failed = pos + len(chunk) - length_hint(it) - 1
                    if policy.skip(e, ctx, failed):
                        continue
                    if out:
                        yield out
                    raise annotate(e, ctx.name, failed) from None
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


def resolve_executor(
    executor: str | Executor | None, concurrency: int, ctx: Ctx
) -> Executor | None:
    """The executor a stage's run uses; pools made here belong to the run and close with it."""
    if executor is None:
        return None
    if isinstance(executor, Executor):
        return executor  # the caller's: never shut down by us
    if executor == "thread":
        pool = ThreadPoolExecutor(max_workers=concurrency, thread_name_prefix="aioflow-map")
        ctx.run.resources.append(lambda: _shutdown_in_thread(pool))
        return pool
    if executor == "process":
        from ._procs import run_process_pool

        return run_process_pool(concurrency, ctx)
    raise PipelineError(
        f'executor must be None, "thread", "process" or a concurrent.futures.Executor,'
        f" got {executor!r}"
    )


async def _shutdown_in_thread(pool: Executor) -> None:
    # shutdown(wait=True) blocks: do it off the loop so other runs keep going
    await in_thread(functools.partial(pool.shutdown, wait=True, cancel_futures=True))


def _starter(
    fn: Callable[[Any], Any], executor: Executor | None, timeout: float | None, ctx: Ctx
) -> Callable[[Any, int], Awaitable[Any]]:
    """How one call starts: returns an awaitable of ``fn(x)``."""
    loop = asyncio.get_running_loop()
    if executor is not None:
        submit = getattr(executor, "aioflow_submit", None)

        def start(x: Any, pos: int) -> Awaitable[Any]:
            if submit is not None:
                return submit(fn, x)
            return loop.run_in_executor(executor, fn, x)

    else:

        def start(x: Any, pos: int) -> Awaitable[Any]:
            r = fn(x)
            if inspect.isawaitable(r):
                return r
            f = loop.create_future()
            f.set_result(r)
            return f

    if timeout is None:
        return start

    def start_with_timeout(x: Any, pos: int) -> Awaitable[Any]:
        return _timed(start, x, pos, timeout, ctx)

    return start_with_timeout


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
    executor: Executor | None = None,
    timeout: float | None = None,
    post: Callable[[Any, Any], Any] | None = None,
) -> ChunkIter:
    """Up to ``concurrency`` calls of ``fn`` in flight; results in input or completion order.

    A feeder task reads the input and starts calls (async functions as tasks on the loop,
    sync ones in ``executor``, or inline when there is none); this generator yields the
    results, a chunk of all those ready at once. ``post(x, y)`` maps a result to the
    output item, or to ``DROP``. On close every call still in flight is cancelled and
    awaited (a thread call that already runs is waited for by the pool's shutdown).
    """
    loop = asyncio.get_running_loop()
    start = _starter(fn, executor, timeout, ctx)
    sem = asyncio.Semaphore(concurrency)
    # (pos, x, future) in input order (ordered) or completion order (unordered)
    results: asyncio.Queue[Any] = asyncio.Queue()
    inflight: set[asyncio.Future[Any]] = set()
    started = 0
    meter = ctx.meter
    meter.concurrency = concurrency

    def launch(x: Any, pos: int) -> asyncio.Future[Any]:
        fut: asyncio.Future[Any]
        t0 = perf_counter()

        def done(f: asyncio.Future[Any]) -> None:
            inflight.discard(f)
            meter.t_calls += perf_counter() - t0  # the stage's busy time (see aioflow.stats)

        try:
            fut = asyncio.ensure_future(start(x, pos))
        except Exception as e:  # the call failed before it could start
            fut = loop.create_future()
            fut.set_exception(e)
        inflight.add(fut)
        fut.add_done_callback(done)
        if ordered:
            results.put_nowait((pos, x, fut))
        else:
            fut.add_done_callback(lambda f: results.put_nowait((pos, x, f)))
        return fut

    async def feed() -> None:
        nonlocal started
        try:
            async with aclosing(src):
                async for chunk in src:
                    for x in chunk:
                        await sem.acquire()
                        launch(x, started)
                        started += 1
        except asyncio.CancelledError:
            raise
        except Exception as e:
            results.put_nowait(_Failed(e))
        results.put_nowait(_END)

    feeder = loop.create_task(feed(), name=f"aioflow:{ctx.name}:feed")
    done_feeding = False
    upstream_error: BaseException | None = None
    received = 0
    try:
        out: list[Any] = []
        while True:
            if not ordered and done_feeding and received == started:
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
            pos, x, fut = entry
            if not fut.done() and out:
                yield out
                out = []
            try:
                y = await fut
            except Exception as e:
                sem.release()
                received += 1
                if policy.skip(e, ctx, pos):
                    continue
                if out:
                    yield out
                    out = []
                raise annotate(e, ctx.name, pos) from None
            sem.release()
            received += 1
            if post is not None:
                y = post(x, y)
                if y is DROP:
                    continue
            out.append(y)
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
