"""What a stage knows of a user function, and what it does when one fails (``on_error``).

``ErrorPolicy`` implements ``on_error``; ``each`` is the per-item loop that every
operator calling a function per item shares: the results before the first failure, and
that failure with its note (stage, position, item), to raise once the results before it
are delivered. Its siblings give the same for a stage that lets items out of what it holds
(``each_into``), for one call (``call``, a loop whose state changes between items) and
for reads of a user's iterator (``read``, ``read_one``).
"""

from __future__ import annotations

import functools
import inspect
import logging
from collections.abc import AsyncIterator, Callable, Iterator
from itertools import islice
from typing import TYPE_CHECKING, Any

from aioflow._core.graph import ChunkIter
from aioflow._core.tasks import aclosing
from aioflow.errors import _NO_ITEM, PipelineError, WorkerDied, annotate, control_flow_error

if TYPE_CHECKING:
    from aioflow._core.ctx import Ctx

__all__ = [
    "DROP",
    "NOTHING",
    "ErrorPolicy",
    "call",
    "each",
    "each_into",
    "is_async_callable",
    "read",
    "read_one",
]

log = logging.getLogger("aioflow")

#: Returned by a ``post`` function to drop an item (how ``filter`` reuses ``map``).
DROP: Any = object()

#: What ``call`` and ``read_one`` give when there is no item (a failure, or the end).
NOTHING: Any = object()


def is_async_callable(fn: Any) -> bool:
    """True for ``async def`` functions, partials of them and objects with async __call__."""
    while isinstance(fn, functools.partial):
        fn = fn.func
    return inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(
        getattr(fn, "__call__", None)  # noqa: B004
    )


def each(
    fn: Callable[[Any], Any], chunk: list[Any], stage: str, pos: int, *, name_item: bool = False
) -> tuple[list[Any], BaseException | None]:
    """``fn`` of each item of ``chunk`` (at ``pos``): the results before the first failure,
    and that failure annotated with its stage, position and item (None: none failed).

    The caller delivers the results, then raises the failure. A ``StopIteration`` from
    ``fn`` (which ``map()`` would take for its end) becomes a ``StageError``.
    ``name_item``: the note shows the failing item too.

    Example:
        >>> out, err = each(lambda x: 10 // x, [5, 2, 0, 1], "map(f)", 7, name_item=True)
        >>> out, type(err).__name__, err.__notes__
        ([2, 5], 'ZeroDivisionError', ["aioflow: raised in stage 'map(f)' at item 9, input 0"])
    """
    out: list[Any] = []
    try:
        out.extend(map(fn, chunk))  # extend keeps the results made before a failure
    except Exception as e:
        item = chunk[len(out)] if name_item else _NO_ITEM
        return out, annotate(e, stage, pos + len(out), item)
    if len(out) < len(chunk):  # ``fn`` raised StopIteration: map() took it for its end
        return out, control_flow_error(StopIteration(), stage, pos + len(out))
    return out, None


async def each_into(
    src: ChunkIter, put: Callable[[list[Any], Any], object], stage: str
) -> ChunkIter:
    """``put(out, x)`` for every item of ``src``, in order, ``out`` a new list per input
    chunk: each ``out`` that is not empty is a chunk of the output. A failing ``put``
    raises, with its note as ``each`` gives it, after the chunk it was filling.

    For a stage that holds items across chunks (groups, buckets) and lets some out.

    Example:
        >>> import asyncio
        >>> async def chunks():
        ...     yield [1, 2, 3]
        ...     yield [4, 0]
        >>> async def main():
        ...     got = []
        ...     try:
        ...         async for c in each_into(chunks(), lambda out, x: out.append(12 // x), "f"):
        ...             got.append(c)
        ...     except ZeroDivisionError as e:
        ...         return got, e.__notes__
        >>> asyncio.run(main())
        ([[12, 6, 4], [3]], ["aioflow: raised in stage 'f' at item 4"])
    """
    pos = 0
    async with aclosing(src):
        async for chunk in src:
            out: list[Any] = []
            _, err = each(functools.partial(put, out), chunk, stage, pos)
            pos += len(chunk)
            if out:
                yield out
            if err is not None:
                raise err


def call(
    fn: Callable[[Any], Any], x: Any, stage: str, pos: int | None
) -> tuple[Any, BaseException | None]:
    """``fn(x)`` for one item (at ``pos``), and None; or ``NOTHING`` and the failure with
    its note, as ``each`` gives it: the caller delivers what it made before, then raises.

    For a call that a stage's loop must make item by item (its state changes in between).

    Example:
        >>> call(lambda x: 10 // x, 5, "scan(f)", 3)
        (2, None)
        >>> out, err = call(lambda x: 10 // x, 0, "scan(f)", 3)
        >>> out is NOTHING, err.__notes__
        (True, ["aioflow: raised in stage 'scan(f)' at item 3"])
    """
    try:
        return fn(x), None
    except Exception as e:
        return NOTHING, control_flow_error(e, stage, pos)


def read(it: Iterator[Any], n: int, stage: str, pos: int) -> tuple[list[Any], BaseException | None]:
    """Up to ``n`` items of a user's iterator (the next at ``pos``): those read before a
    failure, and that failure with its note (None: none failed; fewer than ``n``: its end).

    Example:
        >>> def gen():
        ...     yield 1
        ...     raise KeyError("k")
        >>> items, err = read(gen(), 4, "from_iterable", 10)
        >>> items, type(err).__name__, err.__notes__
        ([1], 'KeyError', ["aioflow: raised in stage 'from_iterable' at item 11"])
    """
    out: list[Any] = []
    try:
        out.extend(islice(it, n))
    except Exception as e:
        return out, annotate(e, stage, pos + len(out))
    return out, None


async def read_one(
    ait: AsyncIterator[Any], stage: str, where: int | Callable[[], int]
) -> tuple[Any, BaseException | None]:
    """The next item of a user's async iterator (``NOTHING`` at its end), and None; or
    ``NOTHING`` and its failure with its note, at position ``where`` (or what ``where()``
    says then: the position may move while the iterator runs).

    Example:
        >>> import asyncio
        >>> async def gen():
        ...     yield 1
        ...     raise KeyError("k")
        >>> async def main():
        ...     g = gen()
        ...     return [await read_one(g, "pipe(f)", lambda: 4) for _ in range(2)]
        >>> (first, none), (end, err) = asyncio.run(main())
        >>> first, none, end is NOTHING, err.__notes__
        (1, None, True, ["aioflow: raised in stage 'pipe(f)' at item 4"])
    """
    try:
        return await anext(ait), None
    except StopAsyncIteration:
        return NOTHING, None
    except Exception as e:
        return NOTHING, annotate(e, stage, where if isinstance(where, int) else where())


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

    def skip(self, exc: BaseException, ctx: Ctx, pos: int | None, item: Any = _NO_ITEM) -> bool:
        """True if the failure is to be skipped; else the caller raises ``exc``.

        ``item`` is the failing input, named in the note (``annotate``) when it raises.
        """
        if self.mode == "raise" or not isinstance(exc, Exception) or isinstance(exc, WorkerDied):
            return False  # a dead worker broke the pool: nothing after it can run
        self.failures += 1
        if self.mode == "count" and self.failures > self.limit:
            annotate(exc, ctx.name, pos, item)
            exc.add_note(f"aioflow: more than max_failures={self.limit} failures in this stage")
            return False
        ctx.meter.errors_skipped += 1
        where = f" at item {pos}" if pos is not None else ""
        if not self.logged:
            self.logged = True
            log.warning("stage %r skipped a failure%s: %s", ctx.name, where, repr(exc))
        else:
            log.debug("stage %r skipped a failure%s: %s", ctx.name, where, repr(exc))
        return True
