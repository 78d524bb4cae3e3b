"""Process pools owned by a run: spawned safely, functions shipped by value.

Workers start with ``forkserver`` (never a bare ``fork`` of a parent that already runs
threads and an event loop) and ignore SIGINT, so Ctrl-C reaches the parent only. The
function is pickled with cloudpickle once per stage, so lambdas, closures and functions
defined in ``__main__`` or a notebook cell work.
"""

from __future__ import annotations

import asyncio
import multiprocessing as mp
import signal
from collections.abc import Callable
from concurrent.futures import Executor, ProcessPoolExecutor
from typing import Any

import cloudpickle

from ._runtime import Ctx

__all__ = ["run_process_pool"]

_fn_cache: dict[bytes, Callable[[Any], Any]] = {}


def _init_worker() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def _call_pickled(payload: bytes, x: Any) -> Any:
    fn = _fn_cache.get(payload)
    if fn is None:
        fn = _fn_cache[payload] = cloudpickle.loads(payload)
    return fn(x)


class _RunPool(Executor):
    """A ProcessPoolExecutor that ships functions with cloudpickle."""

    def __init__(self, workers: int) -> None:
        self.pool = ProcessPoolExecutor(
            max_workers=workers,
            mp_context=mp.get_context("forkserver"),
            initializer=_init_worker,
        )
        self._payloads: dict[int, tuple[Any, bytes]] = {}

    def _payload(self, fn: Callable[[Any], Any]) -> bytes:
        hit = self._payloads.get(id(fn))
        if hit is None or hit[0] is not fn:
            hit = self._payloads[id(fn)] = (fn, cloudpickle.dumps(fn))
        return hit[1]

    def aioflow_submit(self, fn: Callable[[Any], Any], x: Any) -> asyncio.Future[Any]:
        return asyncio.wrap_future(self.pool.submit(_call_pickled, self._payload(fn), x))

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Any:
        return self.pool.submit(fn, *args, **kwargs)

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        self.pool.shutdown(wait=wait, cancel_futures=cancel_futures)


def run_process_pool(workers: int, ctx: Ctx) -> Executor:
    """A process pool that belongs to the run of ``ctx`` and is shut down when it ends."""
    from ._calls import _shutdown_in_thread

    pool = _RunPool(workers)
    ctx.run.resources.append(lambda: _shutdown_in_thread(pool))
    return pool
