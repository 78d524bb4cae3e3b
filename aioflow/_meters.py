"""The mutable meters a run updates while it goes (internal; read by ``aioflow.stats``).

Each stage has a ``StageMeter``: a few float and int additions per chunk (not per item),
per call for concurrent stages. Each channel between tasks has a ``QueueMeter`` that
integrates its occupancy over time. ``RunStats.from_meters`` turns them into frozen
values; see ``aioflow.stats`` for what the figures mean.
"""

from __future__ import annotations

from time import perf_counter
from typing import Any

__all__ = ["QueueMeter", "StageMeter"]


class QueueMeter:
    """Occupancy of one channel over time (internal): its channel calls ``note`` on change."""

    __slots__ = (
        "area_fill",
        "area_items",
        "area_nonempty",
        "closed",
        "fill",
        "held",
        "inv_chunks",
        "inv_items",
        "meter",
        "peak",
        "peak_fill",
        "t0",
        "t_last",
    )

    def __init__(self, meter: StageMeter, max_chunks: int, max_items: int) -> None:
        self.meter = meter
        self.inv_chunks = 1.0 / max_chunks
        self.inv_items = 1.0 / max_items
        self.t0 = self.t_last = perf_counter()
        self.fill = 0.0  # as of t_last: the larger of the chunk and item fractions, <= 1
        self.held = 0  # items held as of t_last
        self.area_fill = 0.0  # integrals over [t0, t_last]
        self.area_items = 0.0
        self.area_nonempty = 0.0  # time it held at least one item
        self.peak = 0
        self.peak_fill = 0.0
        self.closed = False

    def resize(self, max_chunks: int, max_items: int) -> None:
        """The channel's bound changed (``prefetch(AUTOTUNE)`` grew it)."""
        self.inv_chunks = 1.0 / max_chunks
        self.inv_items = 1.0 / max_items
        self.meter.q_capacity = max_items

    def note(self, chunks: int, items: int, _pc: Any = perf_counter) -> None:
        """The channel now holds ``chunks`` chunks of ``items`` items in all."""
        now = _pc()
        held = self.held
        if held:  # (an empty channel adds nothing to the integrals)
            dt = now - self.t_last
            self.area_fill += self.fill * dt
            self.area_items += held * dt
            self.area_nonempty += dt
        self.t_last = now
        self.held = items
        if items:
            f = items * self.inv_items
            c = chunks * self.inv_chunks
            if c > f:
                f = c
            if f > 1.0:  # a chunk always fits into an empty channel
                f = 1.0
            if f > self.peak_fill:
                self.peak_fill = f
            if items > self.peak:
                self.peak = items
            self.fill = f
        else:
            self.fill = 0.0

    def totals(self, until: float) -> tuple[float, float, float, float]:
        """(span, fill integral, items integral, time not empty) up to ``until``."""
        if self.closed:
            return 0.0, 0.0, 0.0, 0.0
        dt = max(0.0, until - self.t_last)
        return (
            max(0.0, until - self.t0),
            self.area_fill + self.fill * dt,
            self.area_items + self.held * dt,
            self.area_nonempty + (dt if self.held else 0.0),
        )

    def close(self) -> None:
        """The channel is done: fold its figures into its stage's meter."""
        m = self.meter
        span, area_fill, area_items, nonempty = self.totals(perf_counter())
        self.closed = True
        m.q_span += span
        m.q_area += area_fill
        m.q_items_area += area_items
        m.q_nonempty += nonempty
        m.q_peak = max(m.q_peak, self.peak)
        m.q_peak_fill = max(m.q_peak_fill, self.peak_fill)
        if self in m.queues:
            m.queues.remove(self)


class StageMeter:
    """Mutable counters of one stage during a run (internal)."""

    __slots__ = (
        "channel",
        "children",
        "chunks_out",
        "concurrency",
        "errors_skipped",
        "inputs",
        "items_out",
        "key",
        "name",
        "q_area",
        "q_capacity",
        "q_items_area",
        "q_nonempty",
        "q_peak",
        "q_peak_fill",
        "q_span",
        "queues",
        "t_calls",
        "t_next",
        "t_read_wait",
        "t_wait_out",
        "task",
    )

    def __init__(self, name: str, key: Any, *, task: bool = False) -> None:
        self.name = name
        self.key = key
        self.task = task  # read through a channel (its own task), not fused into its reader
        self.items_out = 0
        self.chunks_out = 0
        self.t_next = 0.0  # time spent producing output, inclusive of fused input stages
        self.t_read_wait = 0.0  # time the reader of this stage's channel waited on it
        self.t_wait_out = 0.0  # time this (task) stage waited for room in its channel
        self.t_calls = 0.0  # summed duration of calls (stages with concurrency)
        self.errors_skipped = 0
        self.concurrency: int | None = None
        self.inputs: list[StageMeter] = []
        self.children: list[StageMeter] = []  # sub-pipelines it opened (flat_map, ...)
        self.channel: Any = None  # its latest output channel (discarded when the run ends)
        # its output channels: those still open, and the folded figures of those closed
        self.queues: list[QueueMeter] = []
        self.q_capacity: int | None = None
        self.q_span = 0.0
        self.q_area = 0.0  # integral of the fill fraction over q_span
        self.q_items_area = 0.0  # integral of items held over q_span
        self.q_nonempty = 0.0  # time it held at least one item
        self.q_peak = 0
        self.q_peak_fill = 0.0

    def open_queue(self, max_chunks: int, max_items: int) -> QueueMeter:
        """A meter for a new output channel of this stage."""
        qm = QueueMeter(self, max_chunks, max_items)
        self.queues.append(qm)
        self.q_capacity = max_items
        return qm

    def adopt(self, child: StageMeter) -> None:
        """Record a sub-pipeline's top stage opened by this stage."""
        if all(c is not child for c in self.children):
            self.children.append(child)

    def waited_on(self) -> float:
        """How long the stage reading this one waited for it."""
        return self.t_read_wait if self.task else self.t_next

    def wait_in(self) -> float:
        return sum(i.waited_on() for i in (*self.inputs, *self.children))

    def items_in(self) -> int:
        return sum(i.items_out for i in self.inputs)
