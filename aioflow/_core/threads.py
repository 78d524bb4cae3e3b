"""Thread pools a run can walk away from: a call that never returns is abandoned, not joined.

``concurrent.futures.ThreadPoolExecutor`` joins its threads at shutdown and again at
interpreter exit, so one call that never returns (a read from a FIFO without a writer, a
hung mount, a stuck user function) blocks ``close()`` and the process's exit. A run's
pools (``executor="thread"`` maps, and the sync adapter loop's default executor) are
``DaemonPool``s instead: closing cancels the calls not started, waits up to
``CLOSE_GRACE`` seconds for those in progress (none for a call already past the stage's
``timeout``), and abandons the rest, saying so once. Their threads are daemons: they end
with their call, or with the process. Waiting needs no new thread (which the interpreter
refuses while it exits): each worker tells the waiting loop when it ends.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import queue
import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from time import monotonic
from typing import Any

__all__ = ["CLOSE_GRACE", "DaemonPool", "in_thread"]

log = logging.getLogger("aioflow")

#: How long closing a pool waits for a call in progress before abandoning its thread.
CLOSE_GRACE = 1.0

_Item = tuple[Future[Any], Callable[..., Any], tuple[Any, ...], dict[str, Any]]


class DaemonPool(ThreadPoolExecutor):
    """An executor of daemon threads that ``aclose`` may leave to finish on their own.

    A ``ThreadPoolExecutor`` by type only (asyncio's default executor must be one); none
    of its machinery is used. ``call_timeout``: a call running longer is not waited for.

    Example:
        >>> import asyncio
        >>> async def main():
        ...     pool = DaemonPool(2, "demo")
        ...     y = await asyncio.wrap_future(pool.submit(sum, [1, 2]))
        ...     await pool.aclose()
        ...     return y
        >>> asyncio.run(main())
        3
    """

    def __init__(
        self,
        max_workers: int | None = None,
        thread_name_prefix: str = "aioflow",
        call_timeout: float | None = None,
        what: str = "a thread pool",
    ) -> None:
        super().__init__(max_workers, thread_name_prefix)
        self._jobs: queue.SimpleQueue[_Item | None] = queue.SimpleQueue()
        self._idle = threading.Semaphore(0)
        self._guard = threading.Lock()
        self._busy: dict[threading.Thread, float | None] = {}  # worker -> its call's start
        self._wake: list[Callable[[], None]] = []
        self._names = itertools.count()
        self._done = False
        self._call_timeout = call_timeout
        self._what = what

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Future[Any]:
        f: Future[Any] = Future()
        with self._guard:
            if self._done:
                raise RuntimeError("cannot schedule new futures after shutdown")
            self._jobs.put((f, fn, args, kwargs))
            if self._idle.acquire(blocking=False):
                return f  # an idle worker takes it
            if len(self._busy) < self._max_workers:
                t = threading.Thread(
                    target=self._work,
                    name=f"{self._thread_name_prefix}_{next(self._names)}",
                    daemon=True,
                )
                self._busy[t] = None
                try:
                    t.start()
                except BaseException:  # Python refuses new threads while it exits
                    del self._busy[t]
                    f.cancel()  # queued, but this caller never gets the future: no one runs it
                    raise
        return f

    def _work(self) -> None:
        me = threading.current_thread()
        try:
            while (item := self._jobs.get()) is not None:
                f, fn, args, kwargs = item
                del item
                if f.set_running_or_notify_cancel():
                    self._busy[me] = monotonic()
                    try:
                        f.set_result(fn(*args, **kwargs))
                    except BaseException as e:  # the caller's future carries it, as stdlib's
                        f.set_exception(e)
                    finally:
                        self._busy[me] = None
                        del f, fn, args, kwargs
                self._idle.release()
        finally:
            with self._guard:
                del self._busy[me]
                wake, self._wake = self._wake, []
            for w in wake:
                w()

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        with self._guard:
            self._done = True
            threads = list(self._busy)
        if cancel_futures:
            while True:
                try:
                    item = self._jobs.get_nowait()
                except queue.Empty:
                    break
                if item is not None:
                    item[0].cancel()
        for _ in threads:
            self._jobs.put(None)
        if wait:
            for t in threads:
                t.join()

    def _waiting_for(self, now: float) -> tuple[int, float | None]:
        """Workers still worth waiting for, and when the first of their calls times out."""
        n, first = 0, None
        limit = self._call_timeout
        with self._guard:
            for started in self._busy.values():
                if started is None or limit is None:
                    n += 1
                elif now - started < limit:
                    n += 1
                    first = started + limit if first is None else min(first, started + limit)
        return n, first

    async def aclose(self, grace: float = CLOSE_GRACE) -> None:
        """Cancel the calls not started; wait for those in progress, up to ``grace`` s."""
        self.shutdown(wait=False, cancel_futures=True)
        loop = asyncio.get_running_loop()
        deadline = monotonic() + grace
        while True:
            now = monotonic()
            n, first = self._waiting_for(now)
            if n == 0 or now >= deadline:
                break
            woke = loop.create_future()

            def wake(fut: asyncio.Future[None] = woke) -> None:
                with contextlib.suppress(RuntimeError):  # the loop closed meanwhile
                    loop.call_soon_threadsafe(_settle, fut)

            with self._guard:
                if not self._busy:
                    break
                self._wake.append(wake)
            until = deadline if first is None else min(deadline, first)
            await asyncio.wait([woke], timeout=max(0.0, until - now))
        with self._guard:
            left = len(self._busy)
        if left:
            log.warning(
                "%s: abandoned %d thread(s) still in a call that did not return"
                " (past its timeout, or %.1f s after close); each ends when its call returns",
                self._what,
                left,
                grace,
            )


def _settle(fut: asyncio.Future[None]) -> None:
    if not fut.done():
        fut.set_result(None)


async def in_thread(pool: ThreadPoolExecutor, fn: Callable[..., Any], *args: Any) -> Any:
    """``fn(*args)`` in ``pool``; a cancelled caller still waits for the call to end.

    The one way a run awaits a blocking call that must not outlive its caller (a thread
    writing a sort's spill file, which may only be removed once the write ended).
    """
    fut = asyncio.wrap_future(pool.submit(fn, *args))
    try:
        return await asyncio.shield(fut)
    except asyncio.CancelledError:
        if not fut.cancel():  # already running: wait for its end
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.wait([fut])
        if fut.done() and not fut.cancelled():
            fut.exception()  # retrieved: the caller is cancelled anyway
        raise
