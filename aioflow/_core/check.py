"""Argument checks shared by every operator, so that each check and its message is written once.

The lowest layer beside ``errors``: operators call these when a pipeline is described,
never while it runs.
"""

from __future__ import annotations

import functools
from concurrent.futures import Executor
from typing import Any

from aioflow._core.autotune import AUTOTUNE
from aioflow.errors import PipelineError

__all__ = ["check_concurrency", "check_executor", "check_int", "fn_name", "is_int"]


def is_int(v: Any, lo: int | None = None) -> bool:
    """True for an ``int`` (not a ``bool``) that is at least ``lo`` when given."""
    return not isinstance(v, bool) and isinstance(v, int) and (lo is None or v >= lo)


def check_int(
    name: str,
    v: Any,
    lo: int | None = None,
    *,
    want: str | None = None,
    error: type[Exception] = PipelineError,
) -> int:
    """``v`` if it is an int ``>= lo``; else ``error("<name> must be <want>, got <v>")``.

    ``want`` defaults to ``"an int"`` or ``"an int >= lo"``.
    """
    if not is_int(v, lo):
        if want is None:
            want = "an int" if lo is None else f"an int >= {lo}"
        raise error(f"{name} must be {want}, got {v!r}")
    return int(v)


def check_concurrency(concurrency: int, what: str = "concurrency") -> int:
    """A positive int or ``AUTOTUNE``."""
    if concurrency == AUTOTUNE:
        return concurrency
    return check_int(what, concurrency, 1, want="a positive int or af.AUTOTUNE")


def check_executor(executor: Any) -> Any:
    """``None``, ``"thread"``, ``"process"`` or a ``concurrent.futures.Executor``."""
    if executor is None or isinstance(executor, Executor) or executor in ("thread", "process"):
        return executor
    raise PipelineError(
        f'executor must be None, "thread", "process" or a concurrent.futures.Executor,'
        f" got {executor!r}"
    )


def fn_name(fn: Any) -> str:
    """A short name for a user function, for stage names."""
    while isinstance(fn, functools.partial):
        fn = fn.func
    return getattr(fn, "__name__", None) or type(fn).__name__
