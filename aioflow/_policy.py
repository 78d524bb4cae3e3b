"""What a stage knows of a user function, and what it does when one fails (``on_error``).

``ErrorPolicy`` implements ``on_error``; ``each`` is the per-item loop that every
operator calling a function per item shares: the results before the first failure, and
that failure with its note (stage, position, item), to raise once the results before it
are delivered.
"""

from __future__ import annotations

import functools
import inspect
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from .errors import _NO_ITEM, PipelineError, WorkerDied, annotate, control_flow_error

if TYPE_CHECKING:
    from ._ctx import Ctx

__all__ = [
    "DROP",
    "ErrorPolicy",
    "each",
    "is_async_callable",
]

log = logging.getLogger("aioflow")

#: Returned by a ``post`` function to drop an item (how ``filter`` reuses ``map``).
DROP: Any = object()


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
