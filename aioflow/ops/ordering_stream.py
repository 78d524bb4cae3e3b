"""The state machines of ``sort_by(buffer_size=)`` (``BufferSort``) and ``group_by``
(``Groups``), run by ``ops/event_time.drive`` as the event-time machines are (see
``ops/event_time_core`` for the interface): their buffers are their resumable state.
"""

from __future__ import annotations

import heapq
from collections import OrderedDict
from collections.abc import Hashable, Sequence
from itertools import count
from typing import Any

from aioflow.ops.event_time_core import Late

__all__ = ["BufferSort", "Desc", "Groups"]


class Desc:
    """A key that sorts in reverse (for the heap of a streaming sort with ``reverse``)."""

    __slots__ = ("k",)

    def __init__(self, k: Any) -> None:
        self.k = k

    def __lt__(self, other: Desc) -> bool:
        return bool(other.k < self.k)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Desc) and bool(self.k == other.k)

    __hash__ = None  # type: ignore[assignment]


def unwrap(k: Any) -> Any:
    return k.k if isinstance(k, Desc) else k


class _Counts:
    late = 0
    evicted = 0
    watermark: Any = None
    event_time: Any = None

    def __init__(self) -> None:
        self.gone: list[Any] = []


class BufferSort(_Counts):
    """A heap of ``size`` items: each new item pushes out the smallest, which is late when
    it sorts before the largest key already emitted (``last``)."""

    def __init__(self, size: int, reverse: bool, on_late: str) -> None:
        super().__init__()
        self.size, self.reverse, self.on_late = size, reverse, on_late
        self.heap: list[tuple[Any, int, Any]] = []  # (key, seq, item): seq breaks ties
        self.last: Any = None

    def add(
        self, cols: Sequence[Sequence[Any]], items: Sequence[Any], start: int, out: list[Any]
    ) -> None:
        keys: Any = cols[0]
        if self.reverse:
            keys = [Desc(k) for k in keys]
        heap, gone, size, on_late = self.heap, self.gone, self.size, self.on_late
        w = self.last
        emit = out.append
        pushpop = heapq.heappushpop
        try:
            for s, k, x in zip(count(start), keys, items, strict=False):
                if len(heap) < size:  # filling: a heap once full (keys compared then)
                    heap.append((k, s, x))
                    if len(heap) == size:
                        heapq.heapify(heap)
                    continue
                e = pushpop(heap, (k, s, x))
                if e[1] < start:
                    gone.append(e)
                if w is not None and e[0] < w:
                    self.late += 1
                    if on_late == "raise":
                        raise Late(unwrap(e[0]), unwrap(w), e[1])
                    if on_late == "drop":
                        continue
                else:
                    w = e[0]
                emit(e[2])
        finally:
            self.last = w

    def finish(self, out: list[Any]) -> None:
        self.heap.sort()
        out.extend(e[2] for e in self.heap)
        self.gone.extend(self.heap)
        self.heap = []

    def held(self) -> list[list[Any]]:
        return [self.heap]

    def state(self) -> dict[str, Any]:
        return {"last": unwrap(self.last)}

    def restore(
        self, scalars: dict[str, Any], cols: Sequence[Sequence[Any]], items: Sequence[Any]
    ) -> None:
        last = scalars["last"]
        self.last = None if last is None else Desc(last) if self.reverse else last
        keys: Any = [Desc(k) for k in cols[0]] if self.reverse else cols[0]
        n = len(items)
        self.heap = [(k, s - n, x) for s, (k, x) in enumerate(zip(keys, items, strict=True))]
        if n >= self.size:
            heapq.heapify(self.heap)


class Groups(_Counts):
    """Per-key groups ``[items, seqs]``, kept in the order in which each open group began."""

    def __init__(self, size: int | None, max_keys: int | None) -> None:
        super().__init__()
        self.full = size if size is not None else -1
        self.most = max_keys if max_keys is not None else -1
        # an OrderedDict: a plain dict's first key is slow to find after many deletions
        self.groups: OrderedDict[Hashable, list[list[Any]]] = OrderedDict()

    def _out(self, k: Hashable, g: list[list[Any]], start: int, out: list[Any]) -> None:
        out.append((k, g[0]))
        self.gone.extend((s, x) for s, x in zip(g[1], g[0], strict=True) if s < start)

    def add(
        self, cols: Sequence[Sequence[Any]], items: Sequence[Any], start: int, out: list[Any]
    ) -> None:
        groups, full, most = self.groups, self.full, self.most
        for s, k, x in zip(count(start), cols[0], items, strict=False):
            g = groups.get(k)
            if g is None:
                if len(groups) == most:  # the oldest open group makes room
                    self._out(*groups.popitem(last=False), start, out)
                    self.evicted += 1
                g = groups[k] = [[], []]
            g[0].append(x)
            g[1].append(s)
            if len(g[0]) == full:
                self._out(k, groups.pop(k), start, out)

    def finish(self, out: list[Any]) -> None:
        for k, g in self.groups.items():
            self._out(k, g, 1 << 62, out)
        self.groups.clear()

    def held(self) -> list[list[Any]]:
        return [[(s, x) for g in self.groups.values() for s, x in zip(g[1], g[0], strict=True)]]

    def state(self) -> dict[str, Any]:
        return {}

    def restore(
        self, scalars: dict[str, Any], cols: Sequence[Sequence[Any]], items: Sequence[Any]
    ) -> None:
        n = len(items)
        for s, (k, x) in enumerate(zip(cols[0], items, strict=True)):
            g = self.groups.get(k)
            if g is None:
                g = self.groups[k] = [[], []]
            g[0].append(x)
            g[1].append(s - n)
