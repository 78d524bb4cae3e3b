"""The one timeout of a stage's calls: a timer per call, started when the call runs.

``arm`` is used by every kind of call with a ``timeout``: past it, the call is stopped
(``stop``: an async call or a thread call's future is cancelled; a process pool kills the
worker running it) and its future fails with ``StageTimeout``, at once. A call that ends
in time cancels its timer.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from aioflow.errors import StageTimeout

__all__ = ["arm", "timed"]


def arm(
    call: asyncio.Future[Any],
    seconds: float,
    stop: Callable[[], str | None],
    stage: str,
    pos: int,
) -> asyncio.TimerHandle:
    """Fail ``call`` with ``StageTimeout`` if it is not done in ``seconds``.

    ``stop()`` ends the call's work and says how, for the message (None: it is not
    running any more, leave it).
    """

    def expire() -> None:
        if call.done():
            return
        how = stop()
        if how is None or call.done():
            return
        call.set_exception(
            StageTimeout(
                f"stage {stage!r}: the call on item {pos} took longer than {seconds} s{how}"
            )
        )

    timer = asyncio.get_running_loop().call_later(seconds, expire)
    call.add_done_callback(lambda _: timer.cancel())
    return timer


def timed(inner: asyncio.Future[Any], seconds: float, stage: str, pos: int) -> asyncio.Future[Any]:
    """A future of ``inner`` that fails with ``StageTimeout`` past ``seconds`` (``inner``
    is cancelled then); cancelling it cancels ``inner``."""
    call: asyncio.Future[Any] = asyncio.get_running_loop().create_future()

    def settle(f: asyncio.Future[Any]) -> None:
        if f.cancelled():
            if not call.done():
                call.cancel()
            return
        exc = f.exception()  # (retrieved, also when the call timed out before)
        if call.done():
            return
        if exc is not None:
            call.set_exception(exc)
        else:
            call.set_result(f.result())

    def stop() -> str:
        inner.cancel()
        return ""

    inner.add_done_callback(settle)
    call.add_done_callback(lambda c: inner.cancel() if c.cancelled() else None)
    arm(call, seconds, stop, stage, pos)
    return call
