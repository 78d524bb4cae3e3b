"""The sync adapter's engine: a daemon thread running one run on an event loop of its own.

``PipelineIterator`` (``_iterators``) starts an ``Engine`` on first ``next()``; the engine
makes a fresh loop (uvloop when installed), starts the run's output into a
``ThreadChannel`` and runs until the output ends or the consumer stops it; then the run
closes on that loop, and the loop with it. A blocking call of the run goes to a
``DaemonPool`` that closing may abandon.
"""

from __future__ import annotations

import asyncio
import os
import threading
from collections.abc import Callable
from types import ModuleType

from aioflow._core.channel import LIGHT_ITEMS, ThreadChannel
from aioflow._core.graph import Described, graph_nodes, items_per_output
from aioflow._core.run import Run
from aioflow._core.tasks import new_task
from aioflow._core.threads import DaemonPool

__all__ = ["Engine", "light_items", "light_lead", "new_event_loop"]

# imported with aioflow, not in an engine's thread at the first run (~4 ms of its start)
_uvloop: ModuleType | None
try:
    import uvloop as _uvloop
except ImportError:  # pragma: no cover - uvloop is optional
    _uvloop = None


def new_event_loop() -> asyncio.AbstractEventLoop:
    """A new event loop: uvloop's when installed (unless ``AIOFLOW_LOOP=asyncio``)."""
    if _uvloop is not None and os.environ.get("AIOFLOW_LOOP", "").lower() != "asyncio":
        return _uvloop.new_event_loop()
    return asyncio.new_event_loop()


def light_lead(pipeline: Described) -> bool:
    """Whether the hand-off to the consumer's thread may hold many light chunks
    (``light_items``): not where the user bounded what the run makes ahead
    of its consumer (``prefetch(n)`` last: its buffer is the hand-off's;
    ``distribute(max_outstanding=)``), nor where a node's log for states reaches back
    only a few chunks past the consumer (``Logged`` but not ``deep``: ``shuffle``,
    ``flat_map``, ``interleave``, ``repeat``, the event-time stages), so that a state
    taken anywhere still seeks.

    Example:
        >>> import aioflow as af
        >>> light_lead(af.range(9).map(abs).filter(bool).batch(2))
        True
        >>> light_lead(af.range(9).prefetch(2)), light_lead(af.range(9).shuffle(4))
        (False, False)
    """
    if pipeline._node.hints.buffer:
        return False
    # (a ``_state.state.Logged`` rule has ``deep``; the others are not logs)
    return not any(
        n.hints.lead or getattr(n.resume, "deep", True) is False for n in graph_nodes(pipeline)
    )


def light_items(pipeline: Described) -> int:
    """How many items the hand-off to the consumer may hold while they are light: the
    output items of ``LIGHT_ITEMS`` source items (64 chunks of items, or 64 batches of
    256), 0 where ``light_lead`` says no light lead.

    Example:
        >>> import aioflow as af
        >>> [light_items(p) for p in (af.range(9), af.range(9).batch(256), af.range(9).shuffle(4))]
        [16384, 64, 0]
    """
    if not light_lead(pipeline):
        return 0
    return max(1, LIGHT_ITEMS // items_per_output(pipeline))


class Engine:
    """The background thread and loop of one sync run. Holds no reference to the iterator."""

    def __init__(self, pipeline: Described, make_run: Callable[[], Run]) -> None:
        self.pipeline = pipeline
        self.make_run = make_run
        self.ready = threading.Event()
        self.loop: asyncio.AbstractEventLoop | None = None
        self.run: Run | None = None
        self.chan: ThreadChannel | None = None
        self.stop: asyncio.Event | None = None
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._main, name="aioflow-run", daemon=True)

    def start(self) -> ThreadChannel:
        self.thread.start()
        self.ready.wait()
        if self.error is not None:
            raise self.error
        assert self.chan is not None
        return self.chan

    def _main(self) -> None:
        try:
            loop = self.loop = new_event_loop()
        except BaseException as e:  # pragma: no cover - cannot make a loop
            self.error = e
            self.ready.set()
            return
        # blocking calls of the run (file reads) go to a pool that closing may abandon
        pool = DaemonPool(None, "aioflow-io", what="the sync adapter's thread pool")
        loop.set_default_executor(pool)
        try:
            self._drive(loop)
        finally:
            try:
                loop.run_until_complete(loop.shutdown_asyncgens())
                loop.run_until_complete(pool.aclose())
            finally:
                loop.close()

    def _drive(self, loop: asyncio.AbstractEventLoop) -> None:
        """Run ``_amain`` to its end, even past a SystemExit/KeyboardInterrupt of a task.

        asyncio lets those two out of ``run_until_complete`` when a user's async function
        raises them in a task of its own; the loop stops there. The consumer gets the
        exception, and the loop is resumed so that the run still closes everything.
        """
        # the one task not started by Run.start: it makes the run, and closes it
        main = new_task(self._amain(), "sync driver", loop)
        while True:
            try:
                loop.run_until_complete(main)
                return
            except BaseException as e:
                self._fail(e)
                if main.done():
                    return

    def _fail(self, exc: BaseException) -> None:
        chan = self.chan
        if chan is None:
            self.error = exc
            self.ready.set()
            return
        if not chan.closed:
            chan.close(exc)
        if self.stop is not None:
            self.stop.set()

    async def _amain(self) -> None:
        loop = asyncio.get_running_loop()
        run = self.run = self.make_run()
        self.chan = chan = ThreadChannel(loop, light=light_items(self.pipeline))
        stop = self.stop = asyncio.Event()
        try:
            out = run.start_output(self.pipeline, chan)
        except BaseException as e:
            self.error = e
            self.ready.set()
            await run.aclose()
            return
        self.ready.set()
        stopper = run.start(stop.wait(), "stop")
        try:
            await asyncio.wait({out, stopper}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            await run.aclose()  # (the stopper too)
            if not chan.closed:
                chan.close()  # a thread still waiting in next() ends (the run is gone)

    def _stop_now(self) -> None:
        """On the loop: cancel the run's tasks at once, then let ``_amain`` close it.

        Cancelled now, a task that is ready to run (a blocking sync source) gets its
        ``CancelledError`` at its next step instead of reading one more item per step
        that closing takes.
        """
        if self.run is not None:
            self.run.cancel()
        if self.stop is not None:
            self.stop.set()

    def shutdown(self, join: bool = True) -> None:
        """Ask the run to stop and (by default) wait for its thread to end."""
        loop, stop = self.loop, self.stop
        if self.run is not None:
            self.run.stopping = True
        if loop is not None and stop is not None and not loop.is_closed():
            try:
                loop.call_soon_threadsafe(self._stop_now)
            except RuntimeError:  # closed meanwhile
                pass
        if join and self.thread.is_alive() and threading.current_thread() is not self.thread:
            self.thread.join()
