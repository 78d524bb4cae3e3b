"""What the columnar machines share (``ColumnarBase``; ``WindowedBase``: those emitting
``af.Window``s), and ``Auto``: the per-item machine, or its columnar twin when a
column-name key meets record batches (the rule in ``ops/columnar.py``), picked at the
first chunk or from the state being restored.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from aioflow.ops.columnar import (
    column,
    cut_piece,
    is_piece,
    kind_checked,
    kind_of,
    nrows,
    numeric,
    scalar,
    span,
    windows_of,
)
from aioflow.ops.columnar_rows import Rows
from aioflow.ops.event_time_core import Late

__all__ = ["Auto", "ColumnarBase", "WindowedBase"]


class Auto:
    """The per-item machine, or (a string key and batches coming in) its columnar twin.

    It decides at the first chunk (``access``), or at ``restore`` when the state says
    ``"columnar"``; until then it answers as the per-item machine.
    """

    def __init__(
        self,
        item: Any,
        item_access: Callable[..., Any],
        columnar: Callable[[], Any] | None,
    ) -> None:
        self.m = item
        self.item_access = item_access
        self.make = columnar
        self.decided = columnar is None
        self.col = False

    def _columnar(self) -> None:
        assert self.make is not None
        m = self.make()
        m.gone = self.m.gone
        self.m, self.decided, self.col = m, True, True

    def access(
        self, chunk: list[Any], stage: str, pos: int
    ) -> tuple[list[list[Any]], BaseException | None]:
        if not self.decided and chunk:
            self.decided = True
            if kind_of(chunk[0]) is not None or is_piece(chunk[0]):
                self._columnar()
        if self.col:
            return [chunk], None
        return self.item_access(chunk, stage, pos)

    @property
    def gone(self) -> list[Any]:
        return self.m.gone

    @gone.setter
    def gone(self, v: list[Any]) -> None:
        self.m.gone = v

    late = property(lambda self: self.m.late)
    evicted = property(lambda self: self.m.evicted)
    watermark = property(lambda self: self.m.watermark)
    event_time = property(lambda self: self.m.event_time)

    def held(self) -> Any:
        return self.m.held()

    def cut(self, entry: Any, taken: int) -> Any:
        """A log entry cut at a state's mark (``cut_piece``; per item: as it is)."""
        return cut_piece(entry, taken) if self.col else entry

    def weigh(self, entries: Sequence[Any]) -> int:
        """The rows of entries of the log (``HeldLog``'s cap is in rows)."""
        return self.m.weigh(entries) if self.col else len(entries)

    def state(self) -> Any:
        return self.m.state()

    def restore(self, scalars: dict[str, Any], cols: Any, items: Sequence[Any]) -> None:
        if scalars.get("columnar") and not self.col:
            self._columnar()
        self.decided = self.decided or self.col  # (nothing held: the first chunk tells)
        self.m.restore(scalars, cols, items)

    def add(self, cols: Any, items: Sequence[Any], start: int, out: list[Any]) -> None:
        self.m.add(cols, items, start, out)

    def finish(self, out: list[Any]) -> None:
        self.m.finish(out)


class ColumnarBase:
    """What the columnar machines share: counts, the largest key/time seen (internal
    units), the kind of the stream and a check that every item is a batch of it."""

    def __init__(self, on_late: str = "emit", delay: Any = 0) -> None:
        self.on_late, self.delay0 = on_late, delay
        self.max: Any = None
        self.unit: np.dtype[Any] | None = None
        self.kind: str | None = None
        self.done = False
        self.late = self.evicted = 0
        self.rows = 0  # arrival numbers of rows
        self.gone: list[Any] = []

    cut = staticmethod(cut_piece)  # (a log entry cut at a state's mark: ``HeldLog``)

    @staticmethod
    def weigh(entries: Sequence[Any]) -> int:
        """The rows of log entries: a piece counts its rows (``HeldLog``'s cap is in rows)."""
        return sum(len(e[-1][2]) if is_piece(e[-1]) else 1 for e in entries)

    def batch(self, b: Any, pos: int) -> Any:
        got = "a columnar stage (a column-name key on batches) got"
        self.kind = kind_checked(b, self.kind, pos, got, "use a function key for items")
        return b

    def times(self, b: Any, name: str) -> np.ndarray:
        a, unit = numeric(column(b, name))
        if self.unit is None and unit is not None:
            self.unit = unit
            self.to_units()
        return a

    def to_units(self) -> None:
        """Spans given as timedeltas into the column's unit (once it is known)."""

    @property
    def event_time(self) -> Any:
        return scalar(self.max, self.unit)

    @property
    def watermark(self) -> Any:
        if self.max is None:
            return None
        return scalar(self.max if self.done else self.max - self.delay, self.unit)

    @property
    def delay(self) -> Any:
        return span(self.delay0, self.unit)

    def state(self) -> dict[str, Any]:
        mx = self.max.item() if isinstance(self.max, np.generic) else self.max
        unit = None if self.unit is None else str(self.unit)
        return {"columnar": True, "max": mx, "unit": unit}

    def restore_scalars(self, scalars: dict[str, Any]) -> None:
        self.max = scalars.get("max")
        if scalars.get("unit"):
            self.unit = np.dtype(scalars["unit"])
            self.to_units()

    def restored(self, scalars: dict[str, Any], items: Sequence[Any]) -> Any:
        """The state's scalars restored; the rows of its pieces (``Rows.restored``; None:
        no rows), their kind taken as the stream's."""
        self.restore_scalars(scalars)
        data = Rows.restored(items)
        if data is not None:
            self.kind = "dict" if isinstance(data, dict) else "arrow"
        return data


class WindowedBase(ColumnarBase, ABC):
    """What the machines emitting ``af.Window``s of rows share (``ColWindows``,
    ``ColSliding``, ``ColSessions``): a batch's rows (``t``, ``k`` and the machine's
    ``extra`` columns) vectorized (``fast``) when in event-time order and ``simple``,
    else through the per-item machine (``exact``), and the windows made of rows."""

    simple = True  # (no limit that needs the per-item machine)

    def __init__(self, time: str, by: str | None, on_late: str, max_delay: Any) -> None:
        super().__init__(on_late, max_delay)
        self.time, self.by = time, by
        self.keyed = bool(by)  # (the rows have keys: the ``by`` column)

    def keys(self, b: Any, n: int) -> np.ndarray:
        """The ``by`` column of batch ``b`` (``n`` zeros without ``by``)."""
        if self.keyed and self.by is not None:
            return np.asarray(column(b, self.by))
        return np.zeros(n, np.int8)

    def extra(self, n: int) -> dict[str, np.ndarray]:
        """The machine's own columns of ``n`` new rows."""
        return {}

    def rows_of(self, b: Any, src: int, seq0: int) -> Rows:
        """The rows of batch ``b`` (input position ``src``, arrival numbers from ``seq0``)."""
        t = self.times(b, self.time)
        return Rows.of(b, src, seq0, t=t, k=self.keys(b, len(t)), **self.extra(len(t)))

    def add(
        self, cols: Sequence[Sequence[Any]], items: Sequence[Any], start: int, out: list[Any]
    ) -> None:
        for i, b in enumerate(items):
            new = self.rows_of(self.batch(b, start + i), start + i, self.rows)
            t = new.cols["t"]
            if not len(t):
                continue
            ordered = (self.max is None or t[0] >= self.max) and bool((t[1:] >= t[:-1]).all())
            if self.simple and ordered:
                self.fast(new, start, out)
            else:
                self.exact(new, start + i, start, out)
            self.rows += len(t)

    @abstractmethod
    def fast(self, new: Rows, start: int, out: list[Any]) -> None:
        """The rows ``new`` of a batch in event-time order, vectorized."""

    @abstractmethod
    def exact(self, new: Rows, s: int, start: int, out: list[Any]) -> None:
        """The rows ``new`` of the batch at input position ``s`` by the per-item machine."""

    def windows(self, rows: Any, counts: np.ndarray, starts: Any, ends: Any) -> list[Any]:
        """``af.Window``s of ``rows`` taken ``counts`` at a time (``windows_of``), their
        spans in the column's type."""
        starts, ends = np.asarray(starts), np.asarray(ends)
        if self.unit is not None:
            starts = starts.astype(np.int64).view(self.unit)
            ends = ends.astype(np.int64).view(self.unit)
        return windows_of(rows, counts, self.by, (starts, ends))

    def run(self, m: Any, new: Rows, h: int, s: int) -> tuple[list[Any], Late | None]:
        """The per-item machine ``m`` (``TimeWindows``, ``Sessions``) on the rows ``new``
        (positions ``h``, ``h + 1``, ... of the rows it holds): the windows it emitted, and
        its ``Late`` (in the column's type, at input position ``s``) to raise once the
        state is kept."""
        cols = [new.cols["t"].tolist()] + ([new.cols["k"].tolist()] if self.keyed else [])
        got: list[Any] = []
        err: Late | None = None
        try:
            m.add(cols, list(range(h, h + len(new))), int(new.seq[0]), got)
        except Late as e:
            err = Late(scalar(e.t, self.unit), scalar(e.watermark, self.unit), s)
        self.late += m.late
        self.evicted += m.evicted
        self.max = m.max
        return got, err

    def emit(self, got: list[Any], allr: Rows, start: int, out: list[Any], log: bool) -> None:
        """The windows of row positions ``got`` (of the per-item machine) as windows of the
        rows ``allr``; with ``log``, their rows logged as gone."""
        if not got:
            return
        pos = np.asarray([p for w in got for p in w.items], np.int64)
        counts = np.asarray([len(w.items) for w in got], np.int64)
        starts = np.asarray([w.start for w in got])
        ends = np.asarray([w.end for w in got])
        rows = allr.gather(pos)
        out.extend(self.windows(rows, counts, starts, ends))
        if log:
            self.gone.extend(allr.pieces(pos, before=start, data=rows))

    def restored_rows(self, scalars: dict[str, Any], items: Sequence[Any]) -> Rows | None:
        """``restored``'s rows as ``add`` takes them (None: no rows)."""
        data = self.restored(scalars, items)
        return None if data is None else self.rows_of(data, -1, -nrows(data))
