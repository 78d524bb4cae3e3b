"""A process pool's batch: its items packed for a worker, and the answer unpacked.

Items are pickled at once, or one by one when that fails (``one_by_one``: an item that
cannot be sent fails only itself; each by value, as a worker could not load the batch
when it answers "one by one"); results come back the same two ways (``results``).
Failures that happen here (pickling, unpickling) are ``StageError``s naming the stage
and the item.
"""

from __future__ import annotations

import asyncio
import os
from collections import deque
from typing import Any

from aioflow._process import ship as _ship
from aioflow._process import wire as _wire
from aioflow._process.columns import rows
from aioflow.errors import StageError, short_repr

__all__ = ["Batch", "one_by_one", "results"]


class Batch:
    """A batch of items of one call, on its way to a worker and back."""

    __slots__ = (
        "batch", "entries", "failures", "fds", "fn_id", "fut", "id", "items", "n", "pos",
        "stack", "timer",
    )  # fmt: skip

    def __init__(self, tid: int, fn_id: int, items: list[Any], pos: int, fut: Any) -> None:
        self.id = tid
        self.fn_id = fn_id
        self.items = items
        self.n = len(items)
        self.pos = pos
        self.fut: asyncio.Future[list[Any]] = fut
        self.batch: Any = None  # the items pickled at once, or None: one by one
        self.entries: list[Any] | None = None
        self.fds: list[int] = []  # shared memory of its items, until sent
        self.failures: dict[int, _wire.Failure] = {}  # items that could not be pickled
        self.timer: asyncio.TimerHandle | None = None
        self.stack = False  # the worker may answer with the results stacked (_process/columns)

    def drop(self) -> None:
        for fd in self.fds:
            os.close(fd)
        self.fds = []


def one_by_one(task: Batch, stage: str) -> None:
    """Pickle a task's items each on its own: one that cannot go fails only itself."""
    task.batch = None
    task.entries = []
    for j, x in enumerate(task.items):
        try:
            task.entries.append(_wire.pack(x, task.fds, _ship.dumps_by_value))
        except Exception as e:
            task.entries.append(None)
            task.failures[j] = _wire.Failure(
                StageError(
                    f"stage {stage!r}: item {task.pos + j} ({short_repr(x)}) cannot"
                    f" be sent to a worker process: {e!r}",
                    stage=stage,
                )
            )


def results(task: Batch, kind: str, payload: Any, fds: deque[int], stage: str) -> list[Any]:
    """A worker's answer for a batch: one result or ``Failure`` per item (``Rows``, for
    results the worker stacked)."""
    if kind == "columns":
        return _stacked(task, payload, fds, stage)
    if kind == "items":
        out = [_result(task, j, e, fds, stage) for j, e in enumerate(payload)]
    else:
        out = _batch_results(task, payload, fds, stage)
    for j, f in task.failures.items():  # items that could not be sent
        out[j] = f
    return out


def _batch_results(task: Batch, payload: Any, fds: deque[int], stage: str) -> list[Any]:
    try:
        ys = _wire.unpack(payload, fds)
    except Exception as e:
        return _unloadable(task, e, stage)
    return [_failure(y, stage) for y in ys]


def _unloadable(task: Batch, e: Exception, stage: str) -> list[Any]:
    what = f"items {task.pos}..{task.pos + task.n - 1}" if task.n > 1 else task.pos
    err = StageError(
        f"stage {stage!r}: the results of {what} could not be unpickled here: {e!r}",
        stage=stage,
    )
    return [_wire.Failure(err)] * task.n


def _stacked(task: Batch, payload: Any, fds: deque[int], stage: str) -> list[Any]:
    try:
        template, cols = _wire.unpack(payload, fds)
    except Exception as e:
        return _unloadable(task, e, stage)
    return rows(template, cols, task.n)


def _result(task: Batch, j: int, entry: Any, fds: deque[int], stage: str) -> Any:
    try:
        y = _wire.unpack(entry, fds)
    except Exception as e:
        return _wire.Failure(
            StageError(
                f"stage {stage!r}: the result of item {task.pos + j} could not be"
                f" unpickled here: {e!r}",
                stage=stage,
            )
        )
    return _failure(y, stage)


def _failure(y: Any, stage: str) -> Any:
    if type(y) is _wire.Failure and y.exc is None:
        y.exc = StageError(f"stage {stage!r}: {y.why}", stage=stage)
    return y
