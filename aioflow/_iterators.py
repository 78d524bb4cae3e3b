"""The two ways to consume a run: on the caller's loop, and the sync adapter.

``AsyncPipelineIterator`` starts a ``Run`` on the caller's event loop and reads the run's
last channel. ``PipelineIterator`` (the sync adapter) runs the ``Run`` on a fresh event
loop (uvloop when installed) in a background thread of its own, and hands chunks to the
consuming thread through a ``ThreadChannel``; it works from a plain script and from a
thread whose own loop is running (a Jupyter cell, an async test).

Closing either iterator (end, error, ``close()``, the ``with`` block, ``break`` in a
``for`` over the pipeline, garbage collection) cancels and awaits every task of the run;
the sync one then joins its thread.
"""

from __future__ import annotations

import asyncio
import functools
import threading
import weakref
from collections import deque
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from aioflow._core.channel import Channel, ThreadChannel
from aioflow._core.engine import Engine, light_items
from aioflow._core.graph import CHANNEL_CHUNKS, CHANNEL_ITEMS, Chunk, number_nodes
from aioflow._core.run import Run
from aioflow._process.pool import prestart
from aioflow._state.held import watermark_at
from aioflow._state.resume import Resume
from aioflow._state.state import make_state, next_opens, refuse_inexact, take_nodes
from aioflow.errors import NextTimeout, PipelineError, StateMismatch
from aioflow.stats import RunStats

if TYPE_CHECKING:
    from aioflow.pipeline import Pipeline

T = TypeVar("T")

__all__ = ["AsyncPipelineIterator", "PipelineIterator"]


def _check_epoch(epoch: int | None) -> int | None:
    if epoch is not None and (not isinstance(epoch, int) or isinstance(epoch, bool) or epoch < 0):
        raise PipelineError(f"epoch must be None or an int >= 0, got {epoch!r}")
    return epoch


def _check_timeout(timeout: float | None) -> float | None:
    if timeout is not None and not timeout > 0:
        raise PipelineError(f"timeout must be a positive number of seconds, got {timeout!r}")
    return timeout


class _Resumable:
    """What both iterators share: the position, the state, the stats (see ``_state/state.py``)."""

    _pipeline: Pipeline[Any]
    _resume: Resume  # where its run resumes from, handed to the run (see _state/resume.py)
    _count: int
    _skip: int
    _base: int

    def _init_state(
        self, pipeline: Pipeline[Any], state: dict[str, Any] | None, epoch: int | None = None
    ) -> None:
        self._pipeline = pipeline
        epoch = _check_epoch(epoch)
        if state is not None:
            r = Resume.of(pipeline, state)
            taken = r.epoch
            if taken is None and epoch is not None:  # a run without epoch=: its sink's index
                taken = (r.opens or {}).get(0)
            if epoch is not None and taken != epoch:
                raise StateMismatch(
                    f"the state was taken in epoch {taken!r} (p.iter(epoch=...)), not {epoch}"
                )
            r.epoch = taken
        elif epoch is not None:  # every node opens as in the epoch-th run: seeds agree
            r = Resume(pipeline, opens=dict.fromkeys(number_nodes(pipeline).values(), epoch))
            r.epoch = epoch
        else:
            r = Resume(pipeline)
        self._resume = r
        self._count = r.position
        # seeking: the run starts where the state was taken; replaying: it skips
        self._base = r.position if r.seeking else 0
        self._skip = 0 if r.seeking else r.position

    def _new_run(self) -> Run:
        return Run(self._pipeline, self._resume)

    def _current_run(self) -> Run | None:
        raise NotImplementedError

    def watermark(self) -> Any:
        """The event time up to which the output is complete (None before any).

        That of the event-time stage nearest the consumer (``sort_by(max_delay=)``,
        ``window_by_time``, ``sessions``, ``asof_join``), as it was when the last item
        yielded left it: no item (window, session) still to come has an earlier time (end),
        late ones aside. None without such a stage.

        Example:
            >>> import aioflow as af
            >>> with af.from_iterable([1, 4, 2, 8]).sort_by(lambda t: t, max_delay=2).iter() as it:
            ...     before, items, after = it.watermark(), list(it), it.watermark()
            >>> before, items, after
            (None, [1, 2, 4, 8], 8)
        """
        run = self._current_run()
        pos = run.resume if run is not None else None
        return watermark_at(self._pipeline, pos, self._count - self._base)

    def state_dict(self) -> dict[str, Any]:
        """Plain data from which ``p.iter(state=...)`` resumes after the items yielded so far.

        Where the stages allow it the state holds where each stage is, and resuming seeks
        there (see docs/checkpointing.md); else resuming replays the epoch and skips.
        A stage whose order depends on timing (``map(ordered=False)``, ``partition_by``)
        raises ``PipelineError`` here.

        Example:
            >>> import aioflow as af
            >>> p = af.range(5)
            >>> with p.iter() as it:
            ...     first = [next(it), next(it)]
            ...     state = it.state_dict()
            >>> with p.iter(state=state) as rest:
            ...     list(rest)
            [2, 3, 4]
        """
        refuse_inexact(self._pipeline)
        run, r = self._current_run(), self._resume
        nodes: tuple[dict[str, Any], dict[str, int]] | None
        if run is None:  # not started: where it would start
            if r.seeking:
                nodes = (
                    {str(k): v for k, v in r.nodes.items()},
                    {str(k): v for k, v in r.counts.items()},
                )
            else:
                nodes = take_nodes(self._pipeline, None, self._count)
            opens = r.opens if r.opens is not None else next_opens(self._pipeline)
            return make_state(self._pipeline, self._count, opens, nodes, r.origin, r.epoch)
        # a fresh or replayed run's first openings are where its position 0 was; a run
        # resumed by seeking learns that from its state (a replay must start there)
        origin = r.origin if r.origin is not None else dict(r.first_open)
        opens = dict(r.first_open)
        nodes = take_nodes(self._pipeline, run.resume, self._count - self._base, opens)
        return make_state(self._pipeline, self._count, opens, nodes, origin, r.epoch)


class AsyncPipelineIterator(_Resumable, Generic[T]):
    """Iterates a run on the caller's event loop; ``async with`` closes it for sure.

    Example:
        >>> import asyncio, aioflow as af
        >>> async def main():
        ...     async with af.range(3).aiter() as it:
        ...         return [x async for x in it]
        >>> asyncio.run(main())
        [0, 1, 2]
    """

    def __init__(
        self,
        pipeline: Pipeline[T],
        *,
        state: dict[str, Any] | None = None,
        timeout: float | None = None,
        epoch: int | None = None,
    ) -> None:
        self._init_state(pipeline, state, epoch)
        self._timeout = _check_timeout(timeout)
        self._buf: Chunk = []
        self._i = 0
        self._run: Run | None = None
        self._chan: Channel | None = None
        self._done = False
        self._finalizer: weakref.finalize | None = None
        self._lock: asyncio.Lock | None = None

    def __aiter__(self) -> AsyncPipelineIterator[T]:
        return self

    async def __aenter__(self) -> AsyncPipelineIterator[T]:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    def _start(self) -> Channel:
        loop = asyncio.get_running_loop()
        prestart(self._pipeline)  # process workers boot while the run starts
        run = self._run = self._new_run()
        pipeline = self._pipeline
        # (many small batches ahead where no bound or shallow log forbids: see light_items)
        chan = self._chan = Channel(CHANNEL_CHUNKS, CHANNEL_ITEMS, light=light_items(pipeline))
        if self._skip:
            pipeline = pipeline.skip(self._skip)
        run.start_output(pipeline, chan)
        self._finalizer = weakref.finalize(self, _abort_soon, run, loop)
        return chan

    async def __anext__(self) -> T:
        i = self._i
        if i < len(self._buf):
            self._i = i + 1
            self._count += 1
            return self._buf[i]
        chan = self._chan
        lock = self._lock
        if chan is not None and not self._done and (lock is None or not lock.locked()):
            chunk = chan.take_ready()  # (a chunk is there: no suspension, no lock)
            if chunk is not None:
                self._buf = chunk
                self._i = 1
                self._count += 1
                return chunk[0]
        return await self._next_chunk()

    async def _next_chunk(self) -> T:
        # several tasks may read one iterator: one at a time waits for the next chunk
        lock = self._lock
        if lock is None:
            lock = self._lock = asyncio.Lock()
        async with lock:
            i = self._i
            if i < len(self._buf):  # another reader fetched a chunk meanwhile
                self._i = i + 1
                self._count += 1
                return self._buf[i]
            return await self._fetch()

    async def _fetch(self) -> T:
        if self._done:
            raise StopAsyncIteration
        chan = self._chan if self._chan is not None else self._start()
        try:
            if self._timeout is None:
                chunk = await chan.get()
            else:
                try:
                    chunk = await asyncio.wait_for(chan.get(), self._timeout)
                except TimeoutError:
                    raise NextTimeout(
                        f"no item within {self._timeout} s (after {self._count} items)"
                    ) from None
        except NextTimeout:
            raise
        except BaseException:
            await self.aclose()
            raise
        if chunk is None:
            await self.aclose()
            raise StopAsyncIteration
        self._buf = chunk
        self._i = 1
        self._count += 1
        return chunk[0]

    async def aclose(self) -> None:
        """Stop the run: cancel and await every task of it. Safe to call twice."""
        self._done = True
        self._buf = []
        self._i = 0
        if self._finalizer is not None:
            self._finalizer.detach()
        if self._run is not None and not self._run.closed:
            await asyncio.shield(self._run.aclose())
        if self._chan is not None:
            self._chan.discard()
            if not self._chan.closed:
                self._chan.close()  # a task still waiting on it ends (its run is gone)

    def _current_run(self) -> Run | None:
        return self._run

    def stats(self) -> RunStats:
        """Per-stage statistics of this run so far (see ``aioflow.stats``)."""
        return self._run.stats() if self._run is not None else RunStats((), 0.0)


def _abort_soon(run: Run, loop: asyncio.AbstractEventLoop) -> None:
    """Finalizer of a dropped async iterator: cancel its tasks on their loop."""
    if run.closed or loop.is_closed():
        return
    try:
        running: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
    except RuntimeError:
        running = None
    if running is loop:
        run.abort()
    else:
        try:
            loop.call_soon_threadsafe(run.abort)
        except RuntimeError:  # the loop closed meanwhile
            pass


class PipelineIterator(_Resumable, Generic[T]):
    """The sync adapter: iterates a run that goes on in a background thread's event loop.

    Use it as a context manager (``with p.iter() as it:``) to close the run for sure.

    Example:
        >>> import aioflow as af
        >>> with af.range(4).map(lambda x: x * x).iter() as it:
        ...     list(it)
        [0, 1, 4, 9]
    """

    def __init__(
        self,
        pipeline: Pipeline[T],
        *,
        state: dict[str, Any] | None = None,
        timeout: float | None = None,
        epoch: int | None = None,
    ) -> None:
        self._init_state(pipeline, state, epoch)
        self._timeout = _check_timeout(timeout)
        self._buf: deque[Any] = deque()
        self._engine: Engine | None = None
        self._chan: ThreadChannel | None = None
        self._done = False
        self._finalizer: weakref.finalize | None = None
        self._lock = threading.Lock()

    def __iter__(self) -> Iterator[T]:
        return self

    def __enter__(self) -> PipelineIterator[T]:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __next__(self) -> T:
        buf = self._buf
        if buf:
            try:
                x = buf.popleft()
            except IndexError:  # another thread took the last item meanwhile
                pass
            else:
                self._count += 1
                return x
        return self._next_chunk()

    def _next_chunk(self) -> T:
        # several threads may read one iterator: one at a time starts or waits on the run
        with self._lock:
            buf = self._buf
            while buf:  # another thread fetched chunks meanwhile
                try:
                    x = buf.popleft()
                except IndexError:
                    break
                self._count += 1
                return x
            return self._fetch()

    def _fetch(self) -> T:
        chunks = self._take()
        if chunks is None:
            raise StopIteration
        buf = self._buf
        for c in chunks:
            buf.extend(c)
        self._count += 1
        return buf.popleft()

    def _chunks(self) -> Iterator[Chunk]:
        """The items left, a chunk at a time: what ``for x in pipeline`` iterates.

        ``Pipeline.__iter__`` reads a ``for`` loop's items from these lists (a list's own
        iterator, at C speed) instead of calling ``__next__`` in Python for each. The
        items of a chunk are counted when it is handed out: that loop's iterator is its
        own, so no state is taken from it.
        """
        buf = self._buf
        if buf:
            rest = list(buf)
            buf.clear()
            self._count += len(rest)
            yield rest
        while True:
            with self._lock:
                chunks = self._take()
            if chunks is None:
                return
            for c in chunks:
                self._count += len(c)
                yield c

    def _take(self) -> list[Chunk] | None:
        """The chunks the run has ready (starting it first), waiting for one; None at the end."""
        if self._done:
            return None
        chan = self._chan
        if chan is None:
            prestart(self._pipeline)  # process workers boot while the run starts
            pipeline = self._pipeline.skip(self._skip) if self._skip else self._pipeline
            # no reference back to this iterator: its finalizer must be able to run
            self._engine = Engine(
                pipeline,
                functools.partial(Run, self._pipeline, self._resume),
            )
            self._finalizer = weakref.finalize(self, self._engine.shutdown)
            chan = self._chan = self._engine.start()
        try:
            chunks = chan.take(self._timeout)
        except NextTimeout as e:
            e.args = (f"{e.args[0]} (after {self._count} items)",)
            raise
        except BaseException:
            self.close()
            raise
        if chunks is None:
            self.close()
        return chunks

    def close(self) -> None:
        """Stop the run: cancel its tasks, wait for them and for its thread. Idempotent."""
        self._done = True
        self._buf.clear()
        if self._finalizer is not None:
            self._finalizer.detach()
        if self._engine is not None:
            self._engine.shutdown()
        if self._chan is not None:
            self._chan.discard()

    def _current_run(self) -> Run | None:
        return self._engine.run if self._engine is not None else None

    def stats(self) -> RunStats:
        """Per-stage statistics of this run so far (see ``aioflow.stats``)."""
        eng = self._engine
        return eng.run.stats() if eng is not None and eng.run is not None else RunStats((), 0.0)
