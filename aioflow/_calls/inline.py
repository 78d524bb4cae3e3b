"""The fast path of a sync user function: called on the loop, a chunk at a time."""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterator
from itertools import compress, islice
from operator import length_hint, truth
from typing import Any

from aioflow._core.ctx import Ctx
from aioflow._core.graph import ChunkIter
from aioflow._core.policy import ErrorPolicy
from aioflow._core.tasks import aclosing
from aioflow.errors import PipelineError, annotate, control_flow_error

__all__ = ["inline_map"]


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
            err = _apply_all(fn, chunk, out, keep, ctx, pos, policy)
            if err is not None:
                if out:
                    yield out
                raise err
            if pos == 0 and out and inspect.isawaitable(out[0]):
                _refuse_awaitables(out, ctx.name)
            pos += len(chunk)
            if out:
                yield out


def _refuse_awaitables(out: list[Any], stage: str) -> None:
    for a in out:
        close = getattr(a, "close", None)
        if close is not None:
            close()
    raise PipelineError(
        f"stage {stage!r}: the function returned an awaitable; define it with"
        " `async def` (or give concurrency=N) so that aioflow awaits it"
    )


def _apply_all(
    fn: Callable[[Any], Any],
    chunk: list[Any],
    out: list[Any],
    keep: bool,
    ctx: Ctx,
    pos: int,
    policy: ErrorPolicy,
) -> BaseException | None:
    """``fn`` over the chunk into ``out``, skipping the failures ``policy`` skips; the
    first one it does not, with its note (stage, position, item), as ``each`` gives it."""
    it = iter(chunk)
    while True:
        try:
            _apply(fn, chunk, it, out, keep, ctx.name, pos)
            return None
        except Exception as e:
            failed = pos + len(chunk) - length_hint(it) - 1
            item = chunk[failed - pos]
            if not policy.skip(e, ctx, failed, item):
                return annotate(e, ctx.name, failed, item)


def _apply(
    fn: Callable[[Any], Any],
    chunk: list[Any],
    it: Iterator[Any],
    out: list[Any],
    keep: bool,
    stage: str,
    pos: int,
) -> None:
    """``fn`` over the rest of ``it`` (a chunk's iterator) into ``out``, at C speed.

    A ``StopIteration`` from ``fn`` would end ``map()`` early as if the chunk ended: the
    count of results tells, and it fails the item like any other exception.
    """
    n = len(chunk)
    start = n - length_hint(it)
    if keep:
        flags: list[bool] = []
        try:
            flags.extend(map(truth, map(fn, it)))
        finally:  # the items before a failing one are kept
            out.extend(compress(islice(chunk, start, None), flags))
        got = len(flags)
    else:
        before = len(out)
        out.extend(map(fn, it))
        got = len(out) - before
    if start + got < n:
        raise control_flow_error(StopIteration(), stage, pos + start + got)
