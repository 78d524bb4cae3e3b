"""``af.AUTOTUNE``: concurrency and buffer sizes chosen while the run goes.

A ``Limiter`` is a semaphore whose limit can move. A ``HillClimber`` watches the rate of
completed calls over short windows and moves the limit towards the highest rate: it
doubles while the rate keeps improving, steps back to the best limit seen when it does
not, and probes one step up now and then in case the workload changed. The limit never
passes ``cap`` (the CPU budget for process/thread pools, a memory bound for async calls).
"""

from __future__ import annotations

import asyncio
import os
from collections import deque
from time import perf_counter

__all__ = [
    "AUTOTUNE",
    "PREFETCH_MAX_ITEMS",
    "HillClimber",
    "Limiter",
    "cpu_budget",
    "items_for",
    "memory_cap",
    "resolve_concurrency",
]

#: The most threads an autotuned ``executor="thread"`` stage may use.
THREAD_CAP = 64
#: The most items ``prefetch(AUTOTUNE)`` lets its buffer grow to.
PREFETCH_MAX_ITEMS = 4096

#: ``concurrency=AUTOTUNE`` / ``prefetch(AUTOTUNE)``: chosen by the runtime while it runs.
AUTOTUNE = -1


def cpu_budget() -> int:
    """Cores this process may use (the default cap of process and thread pools)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):  # pragma: no cover - not Linux
        return max(1, os.cpu_count() or 1)


def items_for(seconds: float, per_item: float, most: int) -> int:
    """How many items make ``seconds`` of work at ``per_item`` seconds each (1 to ``most``):
    the size of a batched call, from its measured time per item.

    Example:
        >>> items_for(0.01, 0.001, 64), items_for(0.01, 0.1, 64), items_for(0.01, 0.0, 64)
        (10, 1, 64)
    """
    return max(1, min(most, int(seconds / max(per_item, 1e-7))))


def memory_cap() -> int:
    """The most calls an autotuned async stage may keep in flight (items held at once)."""
    return int(os.environ.get("AIOFLOW_AUTOTUNE_MAX", "256"))


def resolve_concurrency(concurrency: int, executor: object) -> int:
    """The number of slots a stage gets: ``concurrency`` itself, or AUTOTUNE's cap.

    AUTOTUNE caps a process pool at the CPU budget (the cores this process may use), a
    run-owned thread pool at 64 threads (threads that help mostly wait on IO; CPU-bound
    Python in threads stops gaining at one or two, and the climber stops there), and
    async calls or a caller's executor at ``memory_cap()`` calls in flight.
    """
    if concurrency != AUTOTUNE:
        return concurrency
    if executor == "process":
        return cpu_budget()
    if executor == "thread":
        return min(memory_cap(), THREAD_CAP)
    return memory_cap()


class Limiter:
    """A semaphore with a limit that can be raised or lowered while it is used."""

    __slots__ = ("_waiters", "in_use", "limit")

    def __init__(self, limit: int) -> None:
        self.limit = max(1, limit)
        self.in_use = 0
        self._waiters: deque[asyncio.Future[None]] = deque()

    async def acquire(self) -> None:
        while self.in_use >= self.limit:
            fut = asyncio.get_running_loop().create_future()
            self._waiters.append(fut)
            try:
                await fut
            finally:
                if fut in self._waiters:
                    self._waiters.remove(fut)
        self.in_use += 1

    def release(self) -> None:
        self.in_use -= 1
        self._wake()

    def set_limit(self, limit: int) -> None:
        self.limit = max(1, limit)
        self._wake()

    def _wake(self) -> None:
        free = self.limit - self.in_use
        while free > 0 and self._waiters:
            fut = self._waiters.popleft()
            if not fut.done():
                fut.set_result(None)
                free -= 1


class HillClimber:
    """Moves a ``Limiter``'s limit towards the highest completion rate, up to ``cap``.

    Call ``done()`` once per completed call. A window closes after ``min_calls`` calls
    (at least twice the limit, so about two call durations) and ``min_seconds``; the first
    window after a change of the limit is a warm-up and is not judged (calls started at
    the old limit still finish in it). The next window's rate decides the next move.
    """

    def __init__(
        self,
        limiter: Limiter,
        cap: int,
        *,
        start: int = 2,
        min_calls: int = 8,
        min_seconds: float = 0.005,
        gain: float = 1.1,
        probe_every: int = 20,
    ) -> None:
        self.limiter = limiter
        self.cap = max(1, cap)
        self.min_calls = min_calls
        self.min_seconds = min_seconds
        self.gain = gain
        self.probe_every = probe_every
        self.best_limit = min(start, self.cap)
        self.best_rate = 0.0
        self.growing = True
        self.windows_since_probe = 0
        self._calls = 0
        self._t0 = perf_counter()
        self._warm = False  # the current window is the warm-up after a change
        self.history: list[tuple[int, float]] = []  # (limit, rate) per window
        limiter.set_limit(self.best_limit)

    @property
    def limit(self) -> int:
        return self.limiter.limit

    def done(self) -> None:
        self._calls += 1
        limit = self.limiter.limit
        if self._calls < max(self.min_calls, 2 * limit):
            return
        now = perf_counter()
        dt = now - self._t0
        if dt < self.min_seconds:
            return
        self._calls = 0
        self._t0 = now
        if self._warm:
            self._warm = False
            return
        self._step(self._calls_rate(dt, limit))
        if self.limiter.limit != limit:
            self._warm = True

    def _calls_rate(self, dt: float, limit: int) -> float:
        return max(self.min_calls, 2 * limit) / dt

    def _step(self, rate: float) -> None:
        cap, limit = self.cap, self.limiter.limit
        self.history.append((limit, rate))
        if limit == self.best_limit:
            self.best_rate = rate  # a fresh figure for the current best (workloads change)
            if self.growing and limit < cap:
                self.limiter.set_limit(min(cap, limit * 2))
                return
            self.windows_since_probe += 1
            if self.windows_since_probe >= self.probe_every and limit < cap:
                self.windows_since_probe = 0
                self.limiter.set_limit(min(cap, max(limit + 1, limit * 3 // 2)))
            return
        # the limit is a trial step away from the best one
        if rate > self.best_rate * self.gain:
            self.best_limit, self.best_rate = limit, rate
            self.growing = True
            if limit < cap:
                self.limiter.set_limit(min(cap, limit * 2))
            return
        self.growing = False  # the step did not pay: back to the best limit
        self.limiter.set_limit(self.best_limit)
