"""The state machines of the event-time operators: ``TimeSort`` (``sort_by(max_delay=)``),
``TimeWindows`` (``window_by_time``), ``Sessions`` (``sessions``, in
``ops/event_time_sessions``); ``af.Window``.

A machine knows nothing of chunks, runs or user functions: its driver
(``ops/event_time.drive``) computes each chunk's columns (times, keys) with the operator's
one access function and hands them over. The interface, the same for all three (and for a
columnar twin that takes record batches):

- ``add(cols, items, start, out)``: take ``items`` (arrival numbers ``start``,
  ``start + 1``, ...; ``cols`` their times and keys), append what they release to ``out``;
- ``finish(out)``: the input ended, release everything held, in order;
- ``watermark``: the output watermark (None before any item); ``event_time``: the largest
  time seen; ``late``, ``evicted``: counts;
- ``held()``: what it holds, per input, as entries ending ``(..., seq, item)``; ``gone``:
  the list (the log's) it appends entries to as they leave, when they arrived before the
  chunk being added (``_state/held.py``);
- ``state()`` (JSON-safe scalars) and ``restore(scalars, cols, items)``: rebuild from the
  items it held, in arrival order.

The watermark of a stage is the largest event time it has seen minus its ``max_delay``.
An item is *late* when it can no longer be put where it belongs: its time is below the
watermark (``sort_by``), its last window is closed (``window_by_time``), or below the
watermark and in no open session of its key (``sessions``). ``Late`` is how a machine says
"raise" (``on_late="raise"``); the driver makes it an ``af.LateItem``.
"""

from __future__ import annotations

import heapq
from bisect import bisect_left
from collections.abc import Sequence
from itertools import count
from typing import Any, NamedTuple

__all__ = ["EventMachine", "Late", "TimeSort", "TimeWindows", "Window", "back"]


def back(t: Any, d: Any) -> Any:
    """``t - d``, and ``t`` itself for a zero ``d`` (a datetime minus the default 0)."""
    return t - d if d else t


class Window(NamedTuple):
    """A window of event time: ``items`` of ``key`` with ``start <= time < end``.

    What ``window_by_time`` and ``sessions`` emit; ``key`` is None without ``by``; ``items``
    is a list in arrival order (a record batch when the stream is columnar).

    Example:
        >>> import aioflow as af
        >>> w = af.Window("u1", 0, 10, [{"t": 3}])
        >>> w.key, w.end - w.start, len(w.items)
        ('u1', 10, 1)
    """

    key: Any
    start: Any
    end: Any
    items: Any


class Late(Exception):
    """A machine met a late item under ``on_late="raise"``: its time, the watermark, seq."""

    def __init__(self, t: Any, watermark: Any, seq: int) -> None:
        super().__init__(t, watermark, seq)
        self.t, self.watermark, self.seq = t, watermark, seq


class EventMachine:
    """What the machines share: the largest time seen, counts, the end."""

    delay: Any

    def __init__(self, max_delay: Any, on_late: str) -> None:
        self.delay = max_delay
        self.on_late = on_late
        self.max: Any = None
        self.done = False
        self.late = 0
        self.evicted = 0
        self.gone: list[Any] = []

    @property
    def event_time(self) -> Any:
        return self.max

    def _wm(self) -> Any:
        return None if self.max is None else back(self.max, self.delay)

    @property
    def watermark(self) -> Any:
        return self.max if self.done else self._wm()

    def state(self) -> dict[str, Any]:
        return {"max": self.max}


# -- sort_by(key, max_delay=d) ------------------------------------------------------------
class TimeSort(EventMachine):
    """A heap released up to the watermark: an item comes out once ``key <= watermark``."""

    def __init__(self, max_delay: Any, on_late: str) -> None:
        super().__init__(max_delay, on_late)
        self.heap: list[tuple[Any, int, Any]] = []  # (key, seq, item): seq breaks ties

    def add(
        self, cols: Sequence[Sequence[Any]], items: Sequence[Any], start: int, out: list[Any]
    ) -> None:
        heap, gone, d, mx = self.heap, self.gone, self.delay, self.max
        push, pop, emit = heapq.heappush, heapq.heappop, out.append
        wm = None if mx is None else back(mx, d)
        try:
            for s, k, x in zip(count(start), cols[0], items, strict=False):
                if wm is not None and k < wm:
                    self.late += 1
                    if self.on_late == "emit":
                        emit(x)
                    elif self.on_late == "raise":
                        raise Late(k, wm, s)
                    continue
                if mx is not None and k <= mx:
                    if k <= wm:  # == wm: all before it are out, all held sort after it
                        emit(x)
                    else:
                        push(heap, (k, s, x))
                    continue
                mx = k
                wm = back(k, d)
                if not heap and k <= wm:
                    emit(x)
                    continue
                push(heap, (k, s, x))
                while heap and heap[0][0] <= wm:
                    e = pop(heap)
                    emit(e[2])
                    if e[1] < start:
                        gone.append(e)
        finally:
            self.max = mx

    def finish(self, out: list[Any]) -> None:
        self.heap.sort()
        out.extend(e[2] for e in self.heap)
        self.gone.extend(self.heap)
        self.heap = []
        self.done = True

    def held(self) -> list[list[Any]]:
        return [self.heap]

    def restore(
        self, scalars: dict[str, Any], cols: Sequence[Sequence[Any]], items: Sequence[Any]
    ) -> None:
        self.max = scalars["max"]
        n = len(items)
        self.heap = [(k, s - n, x) for s, (k, x) in enumerate(zip(cols[0], items, strict=True))]
        heapq.heapify(self.heap)


# -- window_by_time -----------------------------------------------------------------------
class TimeWindows(EventMachine):
    """Tumbling or sliding windows per key, emitted once the watermark passes end + lateness.

    Open windows are ``{(key, start): [first seq, items, seqs, times]}``, closed in the
    order of ``(end, first seq)``. An item is in every window ``[start, start + size)``
    that holds its time, ``start`` a multiple of ``slide``; it is late when the last of
    them is closed. Output watermark: every window still to come ends after it.
    """

    def __init__(self, size: Any, slide: Any, lateness: Any, max_delay: Any, on_late: str):
        super().__init__(max_delay, on_late)
        self.size, self.slide, self.lateness = size, slide, lateness
        self.wins: dict[tuple[Any, Any], list[Any]] = {}
        self.heap: list[tuple[Any, int, Any, Any]] = []  # (end, first seq, key, start)

    @property
    def watermark(self) -> Any:
        if self.max is None or self.done:
            return self.max
        return back(back(self.max, self.delay), self.lateness)

    def _put(self, t: Any, k: Any, s: int, x: Any, wm: Any) -> None:
        size, slide, ll = self.size, self.slide, self.lateness
        st = (t // slide) * slide
        while st + size > t:
            if wm is None or st + size + ll > wm:  # still open
                w = self.wins.get((k, st))
                if w is None:
                    w = self.wins[(k, st)] = [s, [], [], []]
                    heapq.heappush(self.heap, (st + size, s, k, st))
                w[1].append(x)
                w[2].append(s)
                w[3].append(t)
            st -= slide

    def add(
        self, cols: Sequence[Sequence[Any]], items: Sequence[Any], start: int, out: list[Any]
    ) -> None:
        times, keys = cols[0], (cols[1] if len(cols) > 1 else None)
        size, slide, ll, d = self.size, self.slide, self.lateness, self.delay
        one, wins = slide >= size, self.wins
        wm = self._wm()
        for i, (t, x) in enumerate(zip(times, items, strict=False)):
            k = keys[i] if keys is not None else None
            last = (t // slide) * slide
            if last + size <= t:  # between two windows (slide > size): in none
                continue
            if wm is not None and last + size + ll <= wm:
                self.late += 1
                if self.on_late == "emit":
                    out.append(Window(k, last, last + size, [x]))
                elif self.on_late == "raise":
                    raise Late(t, wm, start + i)
                continue
            if one:  # its one window (tumbling): no walk over the windows
                w = wins.get((k, last))
                if w is None:
                    w = wins[(k, last)] = [start + i, [], [], []]
                    heapq.heappush(self.heap, (last + size, start + i, k, last))
                w[1].append(x)
                w[2].append(start + i)
            else:
                self._put(t, k, start + i, x, wm)
            if self.max is None or t > self.max:
                self.max = t
                wm = back(t, d)
                if self.heap and self.heap[0][0] + ll <= wm:
                    self._close(wm, start, out)

    def _close(self, wm: Any, start: int, out: list[Any]) -> None:
        heap, ll, one = self.heap, self.lateness, self.slide >= self.size
        while heap and (wm is None or heap[0][0] + ll <= wm):
            end, _, k, st = heapq.heappop(heap)
            w = self.wins.pop((k, st))
            out.append(Window(k, st, end, w[1]))
            if one:  # its items are in no other window; seqs ascend
                j = bisect_left(w[2], start)
                if j:
                    self.gone.extend(zip(w[2][:j], w[1][:j], strict=True))
                continue
            lasts = st + self.slide  # items whose last window this is: time < st + slide
            self.gone.extend(
                (s, x) for s, t, x in zip(w[2], w[3], w[1], strict=True) if s < start and t < lasts
            )

    def finish(self, out: list[Any]) -> None:
        self._close(None, 1 << 62, out)
        self.done = True

    def held(self) -> list[list[Any]]:
        seen: dict[int, Any] = {}
        for w in self.wins.values():
            seen.update(zip(w[2], w[1], strict=True))
        return [list(seen.items())]

    def restore(
        self, scalars: dict[str, Any], cols: Sequence[Sequence[Any]], items: Sequence[Any]
    ) -> None:
        self.max = scalars["max"]
        wm, n = self._wm(), len(items)
        keys = cols[1] if len(cols) > 1 else None
        for i, (t, x) in enumerate(zip(cols[0], items, strict=True)):
            self._put(t, keys[i] if keys is not None else None, i - n, x, wm)
