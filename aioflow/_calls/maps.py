"""How user functions are called: inline, or concurrently as tasks, threads or processes.

``map`` and ``filter`` (and any operator that calls a user function per item) share this
module: ``inline_map`` (``_calls/inline``) is the fast path of a sync function on the loop,
``concurrent_map`` the path with up to ``concurrency`` calls in flight, ordered or not.
What differs between async functions (tasks on the loop), sync ones in a thread pool,
batches of items in the caller's ``Executor`` (a Dask client's included) or in the run's
process pool is only how a call starts: one ``Calls`` kind each (``_calls/kinds``), all
behind one batched interface. ``on_error`` is ``_policy.ErrorPolicy``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Coroutine
from concurrent.futures import Executor
from time import perf_counter
from typing import Any, cast

from aioflow._calls.inline import inline_map
from aioflow._calls.kinds import Calls, make_calls, resolve_executor
from aioflow._core.autotune import HillClimber, Limiter
from aioflow._core.check import check_concurrency, fn_name
from aioflow._core.ctx import Ctx
from aioflow._core.graph import CHUNK_MAX, ChunkIter
from aioflow._core.policy import DROP, ErrorPolicy, each, is_async_callable
from aioflow._core.tasks import aclosing, cancel_and_wait, cancelling
from aioflow._process.columns import Rows
from aioflow._process.wire import Failure
from aioflow.errors import _NO_ITEM, annotate, control_flow_error

__all__ = [
    "DROP",
    "ErrorPolicy",
    "check_concurrency",
    "concurrent_map",
    "each",
    "fn_name",
    "inline_map",
    "is_async_callable",
    "resolve_executor",
]

_END = object()


class _Failed:
    """The input's own error, on the results queue after the calls started before it."""

    __slots__ = ("exc",)

    def __init__(self, exc: BaseException) -> None:
        self.exc = exc


def concurrent_map(
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
    columns: int = 0,
) -> ChunkIter:
    """Up to ``concurrency`` calls of ``fn`` in flight; results in input or completion order.

    With ``autotune`` the number of calls in flight starts low and a ``HillClimber``
    moves it towards the highest completion rate, up to ``concurrency`` (its cap); the
    limit in use is the stage's ``concurrency`` in the stats. A process pool keeps its
    size (one worker per core).

    One machinery for every kind of call (``_calls/kinds``): async functions as tasks on
    the loop, sync ones in an executor (``"thread"`` or the caller's), or batches of
    items in the run's process pool. A feeder task reads the input and starts calls
    while a slot is free; the map yields the results, a chunk of all those ready at once.
    ``post(x, y)`` maps a result to the output item, or to ``DROP``. On close every call
    still in flight is cancelled and awaited (a thread call that already runs is waited
    for by the pool's close, up to its timeout or ``CLOSE_GRACE``; a process batch by
    killing its worker at run end).

    ``columns=n`` (a process map before ``batch(n)``): a call takes items of one batch
    only (``batches_of``), the worker stacks its results, and they are one chunk of their
    own (``Rows``).
    """
    m = ConcurrentMap(ctx, policy, ordered, post, autotune, columns)
    return m.results(
        src, lambda: make_calls(fn, executor, concurrency, timeout, ordered, ctx, columns)
    )


class ConcurrentMap:
    """One concurrent map while it runs: its calls, their limits, the results on their way.

    ``running`` bounds the calls in flight and frees a slot as soon as a call ends;
    ``window`` bounds the calls started but not yet delivered (results waiting for an
    earlier, slower call in an ordered map), which is what bounds the memory. Results
    go through one queue: ``(pos, items, future)`` in input order (ordered) or in
    completion order (unordered), then ``_END`` or the input's error (``_Failed``).
    """

    def __init__(
        self,
        ctx: Ctx,
        policy: ErrorPolicy,
        ordered: bool,
        post: Callable[[Any, Any], Any] | None,
        autotune: bool,
        columns: int = 0,
    ) -> None:
        self.ctx = ctx
        self.columns = columns
        self.policy = policy
        self.ordered = ordered
        self.post = post
        self.autotune = autotune
        self.inflight: set[asyncio.Future[Any]] = set()
        self.queue: asyncio.Queue[Any] = asyncio.Queue()
        self.launched = self.received = 0

    def _setup(self, calls: Calls) -> None:
        self.calls = calls
        self.running = Limiter(calls.slots)
        tune = self.autotune and not calls.batched
        self.climber = HillClimber(self.running, calls.slots) if tune else None
        # (stacked tasks hold up to a batch each: no more out than the pool has slots for)
        extra = 0 if self.columns else min(calls.slots, CHUNK_MAX)
        self.window = asyncio.Semaphore(calls.slots + extra)
        # the stats' concurrency: calls in flight, or a process pool's workers
        self.ctx.meter.concurrency = calls.workers or self.running.limit

    async def results(self, src: ChunkIter, make: Callable[[], Calls]) -> ChunkIter:
        """The map's output chunks (the calls are made when it starts: a pool is the run's)."""
        self._setup(make())
        feeder = self.ctx.run.start(self._feed(src), f"{self.ctx.name}:feed")
        done_feeding = False
        upstream_error: BaseException | None = None
        try:
            out: list[Any] = []
            while self.ordered or not done_feeding or self.received < self.launched:
                if self.queue.empty() and out:
                    yield out
                    out = []
                entry = await self.queue.get()
                if entry is _END or isinstance(entry, _Failed):
                    done_feeding = True
                    if isinstance(entry, _Failed):
                        upstream_error = entry.exc  # raised once every started call is out
                    if self.ordered:
                        break
                    continue
                pos, items, fut = entry
                if not fut.done() and out:
                    yield out
                    out = []
                try:
                    ys = await fut
                except (Exception, asyncio.CancelledError) as e:
                    if isinstance(e, asyncio.CancelledError) and cancelling():
                        raise  # the run's own cancellation; else the call's (a user's) error
                    error = self._failed(pos, items, e)
                else:
                    if type(ys) is Rows:  # a stacked task: a chunk of its own, for batch
                        self.window.release()
                        self.received += 1
                        if out:
                            yield out
                            out = []
                        yield ys
                        continue
                    error = self._outputs(pos, items, ys, out)
                if error is not None:
                    if out:
                        yield out  # the items before a failure are delivered first
                    raise error
                if len(out) >= CHUNK_MAX:
                    yield out
                    out = []
            if out:
                yield out
            if upstream_error is not None:
                raise upstream_error
        finally:
            await cancel_and_wait([feeder, *self.inflight])
            self._drain()

    def _failed(self, pos: int, items: list[Any], e: BaseException) -> BaseException | None:
        """A call failed as a whole: the error to raise (None: skipped, ``on_error``)."""
        self.window.release()
        self.received += 1
        item = items[0] if len(items) == 1 else _NO_ITEM
        err = control_flow_error(e, self.ctx.name, pos, item)
        if self.policy.skip(err, self.ctx, pos, item):
            return None
        err.__suppress_context__ = True  # (its cause, if any, stays)
        return annotate(err, self.ctx.name, pos, item)

    def _outputs(
        self, pos: int, items: list[Any], ys: list[Any], out: list[Any]
    ) -> BaseException | None:
        """Add a call's results to ``out``; the error of a failed item, to raise after them."""
        self.window.release()
        self.received += 1
        ctx, post = self.ctx, self.post
        for j, y in enumerate(ys):
            if type(y) is Failure:
                assert y.exc is not None
                exc = y.exc
                if isinstance(exc, StopIteration | StopAsyncIteration | asyncio.CancelledError):
                    # from a worker: an error like any other (it keeps its own cause)
                    exc = control_flow_error(exc, ctx.name, pos + j, items[j])
                else:
                    exc.__cause__ = None
                if self.policy.skip(exc, ctx, pos + j, items[j]):
                    continue
                exc.__suppress_context__ = True
                return annotate(exc, ctx.name, pos + j, items[j])
            if post is not None:
                y = post(items[j], y)
                if y is DROP:
                    continue
            out.append(y)
        return None

    async def _feed(self, src: ChunkIter) -> None:
        """Read the input and start calls while a slot is free; then ``_END`` (or the
        input's error) goes after the calls started."""
        pos = 0
        calls, window, running = self.calls, self.window, self.running
        if self.columns:
            src = batches_of(src, self.columns)
        try:
            async with aclosing(src):
                async for chunk in src:
                    i, n = 0, len(chunk)
                    while i < n:
                        await window.acquire()
                        await running.acquire()
                        k = calls.size()
                        self._launch(chunk[i : i + k], pos + i)
                        i += k
                    pos += n
        except asyncio.CancelledError as e:
            if cancelling():
                raise
            self.queue.put_nowait(_Failed(control_flow_error(e, self.ctx.name)))
        except BaseException as e:  # also SystemExit/KeyboardInterrupt from upstream
            self.queue.put_nowait(_Failed(e))
        self.queue.put_nowait(_END)

    def _launch(self, items: list[Any], pos: int) -> None:
        meter = self.ctx.meter
        t0 = perf_counter()
        slot = meter.call_started()
        fut = self._start(items, pos)
        self.launched += 1

        def done(f: asyncio.Future[Any]) -> None:
            self.inflight.discard(f)
            self.running.release()
            if self.climber is not None:
                self.climber.done()
                meter.concurrency = self.running.limit
            # the stage's busy time (aioflow.stats); a batched kind adds its own
            meter.call_done(slot, t0, perf_counter(), busy=not self.calls.batched)

        self.inflight.add(fut)
        fut.add_done_callback(done)
        if self.ordered:
            self.queue.put_nowait((pos, items, fut))
        else:
            fut.add_done_callback(lambda f: self.queue.put_nowait((pos, items, f)))

    def _start(self, items: list[Any], pos: int) -> asyncio.Future[Any]:
        """The call's future: a coroutine's runs as a task of the run."""
        try:
            aw: Awaitable[Any] = self.calls.start(items, pos)
        except Exception as e:  # the call failed before it could start (a sync fn)
            fut = asyncio.get_running_loop().create_future()
            # annotated where it is delivered, with the item: a control-flow exception only
            # becomes a StageError here (it cannot be set on a future as itself)
            name = self.ctx.name
            fut.set_exception(
                control_flow_error(e, name, pos) if isinstance(e, StopIteration) else e
            )
            return fut
        if asyncio.isfuture(aw):
            return aw
        return self.ctx.run.start(cast(Coroutine[Any, Any, Any], aw), self.ctx.name)

    def _drain(self) -> None:
        q = self.queue
        while not q.empty():
            entry = q.get_nowait()
            if isinstance(entry, tuple):
                f = entry[2]
                if f.done() and not f.cancelled():
                    f.exception()


async def batches_of(src: ChunkIter, n: int) -> ChunkIter:
    """``src``'s items in chunks of ``n`` (the last may be short); before an error, those read."""
    part: list[Any] = []
    async with aclosing(src):
        try:
            async for chunk in src:
                part.extend(chunk)
                while len(part) >= n:
                    yield part[:n]
                    del part[:n]
        except Exception:
            if part:
                yield part
            raise
    if part:
        yield part
