"""Every error the framework raises, in one place.

The tree::

    Exception
     └── AioflowError                 base of everything aioflow itself raises
          ├── PipelineError           a pipeline was described wrongly (bad argument, bad state)
          ├── StageError              a stage broke for a reason that is not the user's exception,
          │                           or a user function raised ``StopIteration`` or
          │                           ``CancelledError``, which cannot travel as themselves
          │    ├── WorkerDied         a worker process died (signal or exit code)
          │    └── BadInput           a file reader met malformed content: a JSON line that
          │                           does not parse, a truncated .npy/TFRecord/tar, a CRC
          │                           mismatch (also a ``ValueError``)
          │    └── LateItem           ``sort_by(buffer_size=, on_late="raise")`` met an item
          │                           later than its buffer allows (also a ``ValueError``)
          ├── StageTimeout            one call of a user function exceeded ``timeout=``
          │                           (also a ``TimeoutError``)
          ├── NextTimeout             ``iter(timeout=)``/``aiter(timeout=)`` waited too long for
          │                           the next item (also a ``TimeoutError``)
          └── StateMismatch           a ``state_dict`` from another pipeline was given to resume

A user function's own exception is never wrapped: it is re-raised as itself, with a
note (``add_note``) naming the stage and the position of the failing item. Cancellation
of the consuming task and exceptions raised in the consumer's own loop body pass through
unchanged.
"""

from __future__ import annotations

import asyncio
import reprlib
from typing import Any

__all__ = [
    "AioflowError",
    "BadInput",
    "LateItem",
    "NextTimeout",
    "PipelineError",
    "StageError",
    "StageTimeout",
    "StateMismatch",
    "WorkerDied",
    "annotate",
    "control_flow_error",
    "short_repr",
]

_NOTE_PREFIX = "aioflow: "
_NO_ITEM: Any = object()
_repr = reprlib.Repr()
_repr.maxstring = _repr.maxother = 78


class AioflowError(Exception):
    """Base class of every error aioflow itself raises.

    Example:
        >>> import aioflow as af
        >>> issubclass(af.WorkerDied, af.AioflowError)
        True
    """


class PipelineError(AioflowError, ValueError):
    """Raised when a pipeline is built or used wrongly: a bad argument, a bad state.

    Raised by the method or function that was given the bad argument, at the time the
    pipeline is described when that can be checked, else when the run reaches it (e.g. a
    sharded shuffle run a second time without ``p.iter(epoch=)``). It is also a
    ``ValueError`` so code written for tf.data or torch catches it.
    """


class StageError(AioflowError):
    """Raised by a stage that failed for a reason of its own, not a user exception.

    ``stage`` names the stage. Subclasses say why. A user function that raises
    ``StopIteration`` (which would end the stream silently) or ``CancelledError`` without
    the run being cancelled (which would look like the run's own cancellation) fails its
    stage with a plain ``StageError`` whose ``__cause__`` is that exception.
    """

    def __init__(self, message: str, *, stage: str | None = None) -> None:
        super().__init__(message)
        self.stage = stage


class WorkerDied(StageError):
    """Raised in the consumer when a worker process of a ``"process"`` map dies.

    ``pid`` is the worker's process id where known, ``signal`` the signal number that
    killed it (or ``None``), ``exitcode`` its exit code (or ``None``). The broken pool is
    discarded; the next run starts a fresh one.
    """

    def __init__(
        self,
        message: str,
        *,
        stage: str | None = None,
        pid: int | None = None,
        signal: int | None = None,
        exitcode: int | None = None,
    ) -> None:
        super().__init__(message, stage=stage)
        self.pid = pid
        self.signal = signal
        self.exitcode = exitcode


class BadInput(StageError, ValueError):
    """Raised by a file reader when a file's content is malformed.

    ``read_jsonl`` raises it for a line that is not JSON (``line`` is its 1-based number,
    the ``json.JSONDecodeError`` its ``__cause__``); ``read_npy``, ``read_tfrecord``,
    ``read_tar`` and a file ``cache`` for a truncated or corrupt file (``offset`` is the
    byte offset where the bad part starts, in the decompressed stream for a file read
    with ``compression_type``); a compressed stream that is cut or corrupt too. ``path``
    names the file, and the message says ``path:line`` or ``path`` and the offset. With
    ``on_error="skip"`` on the reader the bad record is skipped instead (counted in the
    stage's stats, logged once). It is also a ``ValueError``, as ``json.JSONDecodeError``
    is, so code that caught that still works. Missing files are not ``BadInput``: they
    raise ``FileNotFoundError`` naming the path.
    """

    def __init__(
        self,
        message: str,
        *,
        path: str = "",
        line: int | None = None,
        offset: int | None = None,
        stage: str | None = None,
    ) -> None:
        super().__init__(message, stage=stage)
        self.path = path
        self.line = line
        self.offset = offset


class LateItem(StageError, ValueError):
    """Raised by ``sort_by(key, buffer_size=n, on_late="raise")`` at the first late item.

    An item is late when its key sorts before a key the stage has already emitted: it
    arrived more than ``n`` places after its sorted position, so the buffer cannot put it
    in order. ``key`` is its key, ``last_key`` the largest key emitted before it and
    ``position`` its position in the stage's input. The items emitted before it come out
    first. ``on_late="emit"`` (the default) and ``"drop"`` count late items in the stats
    instead (``StageStats.late``).

    Example:
        >>> import aioflow as af
        >>> p = af.from_iterable([1, 2, 3, 0]).sort_by(lambda x: x, buffer_size=1, on_late="raise")
        >>> try:
        ...     p.to_list()
        ... except af.LateItem as e:
        ...     print(e.key, e.last_key, e.position)
        0 2 3
    """

    def __init__(
        self,
        message: str,
        *,
        key: object = None,
        last_key: object = None,
        position: int | None = None,
        stage: str | None = None,
    ) -> None:
        super().__init__(message, stage=stage)
        self.key = key
        self.last_key = last_key
        self.position = position


class StageTimeout(AioflowError, TimeoutError):
    """Raised when one call of a user function exceeds the stage's ``timeout=``.

    The message names the stage and the item's position. A hung process worker is killed.
    """


class NextTimeout(AioflowError, TimeoutError):
    """Raised by an iterator made with ``timeout=`` when the next item took longer.

    The run stays usable: the caller may call ``next`` again or close it.
    """


class StateMismatch(AioflowError, ValueError):
    """Raised by ``p.iter(state=...)`` when the state was taken from another pipeline,
    another shard or seed, or another epoch than ``epoch=`` names."""


def short_repr(x: Any, limit: int = 80) -> str:
    """A repr of ``x`` of at most ``limit`` characters, for error notes.

    Example:
        >>> short_repr("/data/part-00017/img_000123.npy")
        "'/data/part-00017/img_000123.npy'"
        >>> short_repr(list(range(1000)))
        '[0, 1, 2, 3, 4, 5, ...]'
        >>> len(short_repr("x" * 1000)) <= 80
        True
    """
    try:
        r = _repr.repr(x)
    except Exception:
        r = f"<{type(x).__qualname__} whose repr failed>"
    return r if len(r) <= limit else r[: limit - 3] + "..."


def annotate(
    exc: BaseException, stage: str, position: int | None = None, item: Any = _NO_ITEM
) -> BaseException:
    """Attach where an exception happened (stage, item position, the item) as a note, once.

    The exception object itself is kept: callers re-raise the same object. ``item``, when
    given, is the failing input, shown as a short repr (``short_repr``).

    Example:
        >>> e = annotate(ValueError("bad"), "map(parse)", 3)
        >>> e.__notes__
        ["aioflow: raised in stage 'map(parse)' at item 3"]
        >>> annotate(ValueError("bad"), "map(load)", 1, "a.npy").__notes__
        ["aioflow: raised in stage 'map(load)' at item 1, input 'a.npy'"]
    """
    notes = getattr(exc, "__notes__", None) or ()
    if any(n.startswith(_NOTE_PREFIX) for n in notes if isinstance(n, str)):
        return exc
    where = f" at item {position}" if position is not None else ""
    if item is not _NO_ITEM:
        where += f", input {short_repr(item)}"
    try:
        exc.add_note(f"{_NOTE_PREFIX}raised in stage {stage!r}{where}")
    except Exception:  # pragma: no cover - an exception type that refuses notes
        pass
    return exc


def control_flow_error(
    exc: BaseException, stage: str, position: int | None = None, item: Any = _NO_ITEM
) -> BaseException:
    """What a user function's exception becomes on its way to the consumer.

    ``StopIteration`` and ``CancelledError`` mean "the end" and "the run is cancelled" to
    the machinery they would travel through, so they become a ``StageError`` naming the
    stage and item (the original is its ``__cause__``); any other exception is returned
    as itself, annotated.

    Example:
        >>> e = control_flow_error(StopIteration(), "map(f)", 3)
        >>> type(e).__name__, str(e)
        ('StageError', "stage 'map(f)': the function raised StopIteration at item 3")
        >>> e = ValueError("bad")
        >>> control_flow_error(e, "map(f)", 3) is e
        True
    """
    if not isinstance(exc, StopIteration | StopAsyncIteration | asyncio.CancelledError):
        return annotate(exc, stage, position, item)
    where = f" at item {position}" if position is not None else ""
    what = type(exc).__name__
    err = StageError(f"stage {stage!r}: the function raised {what}{where}", stage=stage)
    err.__cause__ = exc
    return err
