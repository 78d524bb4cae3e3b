"""The ``Pipeline`` methods of the event-time operators: ``window_by_time``, ``sessions``
(``ops/event_time``) and ``asof_join`` (``ops/asof``); ``sort_by(max_delay=)`` is with
``sort_by`` in ``_group_methods``. Each method is its docstring and one line.

``time``, ``by`` and ``on`` are functions of an item, or column names (``item[name]``).
Every event-time stage keeps a watermark, its largest event time seen minus its
``max_delay``; ``it.watermark()`` is the one of the stage nearest the consumer, and
``it.stats()`` shows each stage's watermark and lag.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Generic, TypeVar

from aioflow._core.base import PipelineBase
from aioflow.ops import asof as _a
from aioflow.ops import event_time as _e

if TYPE_CHECKING:
    from aioflow.ops.event_time_core import Window
    from aioflow.pipeline import Pipeline

T = TypeVar("T")
U = TypeVar("U")

__all__ = ["TimeMethods"]


class TimeMethods(PipelineBase, Generic[T]):
    """``Pipeline``'s methods of the event-time operators."""

    __slots__ = ()

    def window_by_time(
        self,
        time: Any,
        size: Any,
        *,
        slide: Any = None,
        by: Any = None,
        max_delay: Any = 0,
        allowed_lateness: Any = 0,
        on_late: str = "drop",
    ) -> Pipeline[Window]:
        """Windows of event time: ``af.Window(key, start, end, items)``, per key with ``by``.

        Tumbling windows ``[start, start + size)`` with ``start`` a multiple of ``size``,
        or, with ``slide``, sliding ones starting every ``slide`` (an item is in each
        window that holds its ``time(item)``). The watermark is the largest time seen minus
        ``max_delay``; a window comes out once the watermark reaches ``end +
        allowed_lateness`` (several at once: by end, then by first arrival), and the rest at
        the end of the stream; an empty window never. ``items`` is a list in arrival order.
        An item whose last window already came out is late: ``on_late="drop"`` (counted in
        the stats), ``"emit"`` (alone, in a window of its own) or ``"raise"``
        (``af.LateItem``). Times are numbers (ms, s, ...). Memory: the open windows, i.e.
        the items within ``size + max_delay + allowed_lateness`` of the latest time, per key
        (times ``size / slide``: an item is held once, listed in each of its windows).

        With ``slide > size`` the windows leave gaps: an item in none is not late and
        does not move the watermark.

        On record batches with column names for ``time`` and ``by`` (tumbling or sliding
        windows) each window's ``items`` is a batch of its rows, the same windows in the
        same order as per item (``docs/columnar_operators.md``).

        Example:
            >>> import aioflow as af
            >>> clicks = af.from_iterable([{"t": 1, "u": "a"}, {"t": 3, "u": "b"},
            ...                            {"t": 12, "u": "a"}, {"t": 4, "u": "a"}])
            >>> [(w.key, w.start, w.end, len(w.items))
            ...  for w in clicks.window_by_time("t", 10, by="u", max_delay=10)]
            [('a', 0, 10, 2), ('b', 0, 10, 1), ('a', 10, 20, 1)]
            >>> import numpy as np
            >>> rows = {"t": np.array([1, 2, 5]), "x": np.array([10, 20, 50])}
            >>> [(w.start, w.end, w.items["x"].tolist())
            ...  for w in af.from_iterable([rows]).window_by_time("t", 4, slide=2)]
            [(-2, 2, [10]), (0, 4, [10, 20]), (2, 6, [20, 50]), (4, 8, [50])]
        """
        return self._add(
            _e.window_by_time_node, time, size, slide, by, max_delay, allowed_lateness, on_late
        )

    def sessions(
        self,
        time: Any,
        gap: Any,
        *,
        by: Any,
        max_delay: Any = 0,
        max_duration: Any = None,
        max_items: int | None = None,
        on_late: str = "drop",
        max_keys: int | None = None,
    ) -> Pipeline[Window]:
        """Per-key session windows: ``af.Window(key, first time, last time + gap, items)``.

        An item joins the open session of its ``by`` key when its time is within ``gap``
        of it (an item that bridges two sessions merges them); a session closes when the
        watermark (the largest time seen, over all keys, minus ``max_delay``) reaches its
        last time plus ``gap``, so an idle key's session comes out as the stream moves on,
        not at its end. It also closes when an item would make it span ``max_duration`` or
        more (that item begins the next one), or when it has ``max_items`` items. An item
        below the watermark that falls in no open session of its key is late, per
        ``on_late`` (as in ``window_by_time``). Memory: the open sessions, i.e. the items
        of each key active within ``gap + max_delay`` of the latest time; with
        ``max_keys``, a new key while that many keys have open sessions first closes the
        session that would close next (counted in the stats as evicted).
        On record batches with column names for ``time`` and ``by`` each session's
        ``items`` is a batch of its rows (``docs/columnar_operators.md``).

        Example:
            >>> import aioflow as af
            >>> clicks = af.from_iterable([{"t": 0, "u": "a"}, {"t": 2, "u": "a"},
            ...                            {"t": 3, "u": "b"}, {"t": 9, "u": "a"}])
            >>> [(w.key, w.start, w.end, len(w.items)) for w in clicks.sessions("t", 5, by="u")]
            [('a', 0, 7, 2), ('b', 3, 8, 1), ('a', 9, 14, 1)]
        """
        return self._add(
            _e.sessions_node, time, gap, by, max_delay, max_duration, max_items, on_late, max_keys
        )

    def asof_join(
        self,
        other: Pipeline[U],
        *,
        on: Any,
        by: Any = None,
        tolerance: Any = None,
        direction: str = "backward",
        max_delay: Any = 0,
        max_keys: int | None = None,
    ) -> Pipeline[tuple[T, U | None]]:
        """A point-in-time join: ``(item, match)`` for each item, in this stream's order.

        ``match`` is the item of ``other`` with the same ``by`` key whose ``on`` time is the
        largest at or before the item's own (among equal times, the latest to arrive), and
        at most ``tolerance`` before it; None when there is none. A later item of
        ``other`` never pairs with it, so no future leaks into a training example. Both
        streams are in event time (sort them with ``sort_by(max_delay=)``, or give the
        ``max_delay`` by which they may be out of order): an item waits until ``other``'s
        watermark passes its time. Only ``direction="backward"`` exists. Memory: per key
        of ``other``, its items from the latest at or before this stream's watermark on
        (none older than ``tolerance``); at most ``max_keys`` keys (the least recently
        updated is forgotten, counted as evicted; which items then miss
        their match depends on how far ahead ``other`` was read). An item of either stream more than
        ``max_delay`` late is counted late (this stream's pairs with None, ``other``'s
        is dropped).

        On record batches (``on``, and ``by`` if given, column names; both streams of
        batches of one kind) the join is columnar: one batch per batch of this stream, its
        rows in order with ``other``'s columns appended, but its ``by`` column; a name this
        stream has already is suffixed ``_right`` (as Polars' ``join_asof``; so ``on``'s
        column of the match is ``<on>_right``). No match: nulls (Arrow: ``<on>_right`` is
        null exactly then); a dict of numpy arrays gets a bool column ``matched`` and NaN,
        NaT, None or 0 where unmatched (``docs/columnar_operators.md``).

        Example:
            >>> import aioflow as af
            >>> trades = af.from_iterable([(2, "x"), (5, "x"), (6, "y")])
            >>> quotes = af.from_iterable([(1, "x", 10), (4, "x", 11), (6, "x", 12), (7, "y", 5)])
            >>> pairs = trades.asof_join(quotes, on=lambda r: r[0], by=lambda r: r[1])
            >>> [(a[0], b and b[2]) for a, b in pairs]
            [(2, 10), (5, 11), (6, None)]
            >>> import pyarrow as pa
            >>> t = pa.record_batch({"t": [2, 5, 6], "sym": ["x", "x", "y"]})
            >>> q = pa.record_batch({"t": [1, 4, 6, 7], "sym": [*"xxxy"], "px": [10, 11, 12, 5]})
            >>> (out,) = af.from_iterable([t]).asof_join(af.from_iterable([q]), on="t", by="sym")
            >>> out.to_pydict()
            {'t': [2, 5, 6], 'sym': ['x', 'x', 'y'], 't_right': [1, 4, None], 'px': [10, 11, None]}
        """
        return self._add(
            _a.asof_join_node, other, on, by, tolerance, direction, max_delay, max_keys
        )
