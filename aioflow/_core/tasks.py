"""Starting and stopping a run's tasks: one way to start one, one way to end them.

Every task is created by ``new_task``: each task of a run through ``Run.start`` (which
keeps it, see ``_core/run``), and the sync engine's driver (it makes and closes its run,
so it cannot belong to it). Every group of tasks or futures that a stage cancels on its
way out is ended by ``cancel_and_wait``: cancel each, wait for all of them, and retrieve
what they raised so that nothing is reported as "never retrieved".
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Coroutine, Iterable
from typing import Any, TypeVar

__all__ = ["aclosing", "cancel_and_wait", "cancelling", "keep_task", "new_task"]

R = TypeVar("R")

aclosing = contextlib.aclosing


def new_task(
    coro: Coroutine[Any, Any, R], name: str, loop: asyncio.AbstractEventLoop | None = None
) -> asyncio.Task[R]:
    """Start ``coro`` as a task named ``aioflow:{name}`` on ``loop`` (default: the running one).

    The one place a task is created: ``Run.start`` (through ``keep_task``) for every task
    of a run, and the sync engine for its driver, which makes its run and closes it, so it
    cannot be a task of that run.
    """
    if loop is None:
        loop = asyncio.get_running_loop()
    return loop.create_task(coro, name=f"aioflow:{name}")


def keep_task(
    coro: Coroutine[Any, Any, R], name: str, keep: set[asyncio.Task[Any]]
) -> asyncio.Task[R]:
    """Start ``coro`` on the running loop as a task kept in ``keep`` until it is done."""
    task = new_task(coro, name)
    keep.add(task)
    task.add_done_callback(keep.discard)
    return task


def cancelling() -> bool:
    """Whether the current task is being cancelled (by the run, or its consumer's owner).

    A ``CancelledError`` while this is false was raised by a user's function (it awaited
    something that someone else cancelled): an error of its stage, not the run's end.
    """
    task = asyncio.current_task()
    return task is None or task.cancelling() > 0


async def cancel_and_wait(futs: Iterable[asyncio.Future[Any]], *, finish: bool = False) -> None:
    """Cancel every task or future of ``futs``, wait for all to end, retrieve their errors.

    If the caller is cancelled while it waits, they are cancelled once more and the
    ``CancelledError`` goes on (the run's own close awaits whatever is left); with
    ``finish``, it goes on only once all of them ended (a closing path that must not
    leave one running, whatever cancels it on the way).
    """
    futs = list(futs)
    for f in futs:
        f.cancel()
    cancelled: asyncio.CancelledError | None = None
    try:
        while pending := [f for f in futs if not f.done()]:
            try:
                await asyncio.wait(pending)
            except asyncio.CancelledError as e:
                if not finish:
                    for f in pending:
                        f.cancel()
                    raise
                cancelled = e  # (their cleanup is let run: they are cancelled already)
    finally:
        retrieve(futs)
    if cancelled is not None:
        raise cancelled


def retrieve(futs: Iterable[asyncio.Future[Any]]) -> None:
    """Mark what the finished ones of ``futs`` raised as retrieved."""
    for f in futs:
        if f.done() and not f.cancelled():
            f.exception()
