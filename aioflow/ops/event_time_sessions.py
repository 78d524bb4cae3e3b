"""The state machine of ``sessions`` (see ``ops/event_time_core`` for the interface)."""

from __future__ import annotations

import heapq
from bisect import bisect_left
from collections.abc import Sequence
from typing import Any

from aioflow.ops.event_time_core import EventMachine, Late, Window, back

__all__ = ["Sessions"]


class _Session:
    __slots__ = ("alive", "first", "items", "key", "last", "seqs", "start")

    def __init__(self, key: Any, t: Any, s: int, x: Any) -> None:
        self.key, self.start, self.last, self.first = key, t, t, s
        self.items, self.seqs = [x], [s]
        self.alive = True


class Sessions(EventMachine):
    """Per-key sessions: an item within ``gap`` of an open session of its key joins it
    (bridging two merges them); a session closes when the watermark reaches ``last + gap``,
    when it would span ``max_duration`` or more (the item starts a new one), or when it has
    ``max_items``. Emitted as ``Window(key, first time, last time + gap, items)``, in the
    order of ``(end, first seq)`` when the watermark closes several. With ``max_keys``, a
    new key while that many have open sessions first closes the session that would close
    next (counted as evicted).
    """

    def __init__(
        self,
        gap: Any,
        max_delay: Any,
        max_duration: Any,
        max_items: int | None,
        on_late: str,
        max_keys: int | None = None,
    ):
        super().__init__(max_delay, on_late)
        self.gap, self.max_duration, self.max_items = gap, max_duration, max_items
        self.max_keys = max_keys
        self.open: dict[Any, list[_Session]] = {}
        self.heap: list[tuple[Any, int, _Session]] = []  # (end, first seq, session), lazy

    def _put(self, t: Any, k: Any, s: int, x: Any, wm: Any, start: int, out: list[Any]) -> bool:
        """Place one item; False if it is late (nothing done)."""
        gap = self.gap
        lst = self.open.get(k)
        hits = [S for S in lst if S.start - gap < t < S.last + gap] if lst else []
        if hits and self.max_duration is not None:
            lo = min(t, *(S.start for S in hits))
            hi = max(t, *(S.last for S in hits))
            if hi - lo >= self.max_duration:  # too long: they close, the item begins anew
                for S in sorted(hits, key=lambda S: (S.last, S.first)):
                    self._emit(S, start, out)
                hits = []
                lst = self.open.get(k)
        if not hits:
            if wm is not None and t < wm:
                return False
            if lst is None and self.max_keys is not None:
                while len(self.open) >= self.max_keys:  # the next to close makes room
                    self._close(None, start, out, first=True)
                    self.evicted += 1
            S = _Session(k, t, s, x)
            if lst is None:
                self.open[k] = [S]
            else:
                lst.append(S)
            heapq.heappush(self.heap, (t + gap, s, S))
        else:
            S = hits[0]
            for o in hits[1:]:  # the item bridges them: one session, items by arrival
                o.alive = False
                lst.remove(o)  # type: ignore[union-attr]
                pairs = sorted(zip(S.seqs + o.seqs, S.items + o.items, strict=True), key=_first)
                S.seqs, S.items = [p[0] for p in pairs], [p[1] for p in pairs]
                S.start, S.last, S.first = (
                    min(S.start, o.start),
                    max(S.last, o.last),
                    min(S.first, o.first),
                )
            S.items.append(x)
            S.seqs.append(s)
            if t < S.start:
                S.start = t
            elif t > S.last:
                S.last = t  # (its heap entry is moved on when it comes up)
        if self.max_items is not None and len(S.items) >= self.max_items:
            self._emit(S, start, out)
        return True

    def _emit(self, S: _Session, start: int, out: list[Any]) -> None:
        S.alive = False
        lst = self.open[S.key]
        lst.remove(S)
        if not lst:
            del self.open[S.key]
        out.append(Window(S.key, S.start, S.last + self.gap, S.items))
        j = bisect_left(S.seqs, start)  # (seqs ascend: those that arrived before come first)
        if j:
            self.gone.extend(zip(S.seqs[:j], S.items[:j], strict=True))

    def _close(self, wm: Any, start: int, out: list[Any], first: bool = False) -> None:
        """Emit the sessions that end at or before ``wm`` (all: None; ``first``: one)."""
        heap, gap = self.heap, self.gap
        while heap and (wm is None or heap[0][0] <= wm):
            end, seq, S = heapq.heappop(heap)
            if not S.alive:
                continue
            if S.last + gap > end or S.first != seq:  # it grew: its entry moves on
                heapq.heappush(heap, (S.last + gap, S.first, S))
                continue
            self._emit(S, start, out)
            if first:
                return

    def add(
        self, cols: Sequence[Sequence[Any]], items: Sequence[Any], start: int, out: list[Any]
    ) -> None:
        times, keys = cols[0], cols[1]
        d, gap, most = self.delay, self.gap, self.max_items
        fast = (
            self.max_duration is None
        )  # (then an item within gap of its one open session joins it)
        get = self.open.get
        wm = self._wm()
        for i, (t, k, x) in enumerate(zip(times, keys, items, strict=False)):
            if self.max is None or t > self.max:
                # what the new watermark closes goes first: the item can join none of
                # them, and a session it completes (max_items) comes out after them
                self.max = t
                wm = back(t, d)
                self._close(wm, start, out)
            lst = get(k)
            if fast and lst is not None and len(lst) == 1:
                S = lst[0]
                if S.start - gap < t < S.last + gap:
                    S.items.append(x)
                    S.seqs.append(start + i)
                    if t > S.last:
                        S.last = t
                    elif t < S.start:
                        S.start = t
                    if most is not None and len(S.items) >= most:
                        self._emit(S, start, out)
                    continue
            if not self._put(t, k, start + i, x, wm, start, out):
                self.late += 1
                if self.on_late == "emit":
                    out.append(Window(k, t, t + self.gap, [x]))
                elif self.on_late == "raise":
                    raise Late(t, wm, start + i)

    def finish(self, out: list[Any]) -> None:
        self._close(None, 1 << 62, out)
        self.done = True

    def held(self) -> list[list[Any]]:
        return [
            [
                (s, x)
                for ss in self.open.values()
                for S in ss
                for s, x in zip(S.seqs, S.items, strict=True)
            ]
        ]

    def restore(
        self, scalars: dict[str, Any], cols: Sequence[Sequence[Any]], items: Sequence[Any]
    ) -> None:
        self.max = scalars["max"]
        n = len(items)
        out: list[Any] = []  # (nothing comes out: it held them)
        for i, (t, k, x) in enumerate(zip(cols[0], cols[1], items, strict=True)):
            self._put(t, k, i - n, x, None, 0, out)


def _first(p: tuple[int, Any]) -> int:
    return p[0]
