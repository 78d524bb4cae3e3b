"""The mutable meters a run updates while it goes (internal; read by ``aioflow.stats``).

Each stage has a ``StageMeter``: a few float and int additions per chunk (not per item),
per call for concurrent stages. Each channel between tasks has a ``QueueMeter`` that
integrates its occupancy over time. ``RunStats.from_meters`` turns them into frozen
values; see ``aioflow.stats`` for what the figures mean.

A stage of a sub-pipeline (the readers of an ``interleave``, the partitions of a
``partition_by``) may run as several instances at once; each open instance holds a
``Lane`` of its stage (the lowest free one), so lane ``i`` is a sequence of instances
that never overlap in time. The workers of a process pool and the call slots of a
concurrent map are lanes too. A lane keeps its own busy time, and its busy spans for the
timeline (``RunStats.trace``): work closer than ``SPAN_WINDOW`` to the start of the
span before is merged into it (at most ~1,000 spans a second per lane), and a lane keeps
its latest ``SPANS_MAX`` spans or fewer, as flat arrays of doubles (24 bytes a span), so
the trace stays cheap in time and memory for fast stages and long runs.
"""

from __future__ import annotations

from array import array
from time import perf_counter
from typing import Any

__all__ = ["Lane", "QueueMeter", "StageMeter"]

#: Busy time closer than this to the start of the current span is merged into it (s).
SPAN_WINDOW = 1e-3
#: Spans (and counter samples) kept per lane (per stage): the latest ones, at least half.
SPANS_MAX = 20_000
#: Counters (queue fill, calls in flight) are sampled at most this often (s).
SAMPLE_EVERY = 1e-3


class Lane:
    """One instance of a stage at a time, or one worker, or one call slot (internal)."""

    __slots__ = (
        "busy",
        "in_use",
        "index",
        "inner",
        "s0",
        "s1",
        "sbusy",
        "sn",
        "spans",
    )

    def __init__(self, index: int) -> None:
        self.index = index
        self.in_use = False
        self.inner = 0.0  # time its instances spent inside their inputs and sub-pipelines
        self.busy = 0.0  # its own work (exclusive of its inputs)
        self.spans = array("d")  # (start, duration, pieces) per span, flat
        self.s0 = self.s1 = self.sbusy = 0.0  # the span being merged: start, end, busy
        self.sn = 0  # pieces of work merged into it

    def work(self, end: float, busy: float) -> None:
        """``busy`` seconds of the lane's own work, ending at ``end``."""
        self.busy += busy
        if busy <= 0.0:
            return
        start = end - busy
        if start < self.s1:  # a worker's report came late: after the last piece, not over it
            start, end = self.s1, self.s1 + busy
        if self.sn and start - self.s0 < SPAN_WINDOW:
            self.sbusy += busy
            self.s1 = end
            self.sn += 1
            return
        if self.sn:
            _keep(self.spans, (self.s1 - self.sbusy, self.sbusy, self.sn), 3)
        self.s0, self.s1, self.sbusy, self.sn = start, end, busy, 1

    def span(self) -> tuple[float, float, int]:
        """The span being merged: (start, duration, pieces), its busy time packed at its end."""
        return (self.s1 - self.sbusy, self.sbusy, self.sn)

    def all_spans(self) -> list[tuple[float, float, int]]:
        """Every span kept, the one being merged last (safe while another thread adds)."""
        a = self.spans[:]  # (one call: a consistent copy)
        out = [(a[i], a[i + 1], int(a[i + 2])) for i in range(0, len(a) - 2, 3)]
        return [*out, self.span()] if self.sn else out


def _keep(a: array[float], values: tuple[float, ...], width: int) -> None:
    """Append ``values`` to ``a``; past ``SPANS_MAX`` records, drop the older half."""
    if len(a) >= SPANS_MAX * width:
        del a[: (SPANS_MAX // 2) * width]
    a.extend(values)


class Samples:
    """A counter sampled over time (queue fill, calls in flight) for the timeline."""

    __slots__ = ("last", "now", "points")

    def __init__(self) -> None:
        self.now = 0
        self.last = -1.0
        self.points = array("d")  # (time, value) per sample, flat

    def all_points(self) -> list[tuple[float, int]]:
        """Every sample kept (safe while another thread adds)."""
        a = self.points[:]
        return [(a[i], int(a[i + 1])) for i in range(0, len(a) - 1, 2)]

    def add(self, delta: int, t: float | None = None) -> None:
        """The counter changed by ``delta`` (at ``t``, default now)."""
        self.now += delta
        if t is None:
            t = perf_counter()
        if t - self.last >= SAMPLE_EVERY:
            self.last = t
            _keep(self.points, (t, self.now), 2)


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
        qs = self.meter.q_samples  # (Samples.add, inlined: this runs per chunk)
        qs.now += items - held
        if now - qs.last >= SAMPLE_EVERY:
            qs.last = now
            _keep(qs.points, (now, qs.now), 2)
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
        if self.held:
            m.q_samples.add(-self.held)
            self.held = 0
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
        "calls",
        "channel",
        "children",
        "chunks_out",
        "concurrency",
        "errors_skipped",
        "event_time",
        "evicted",
        "free_slots",
        "inputs",
        "items_out",
        "key",
        "lanes",
        "late",
        "name",
        "q_area",
        "q_capacity",
        "q_items_area",
        "q_nonempty",
        "q_peak",
        "q_peak_fill",
        "q_samples",
        "q_span",
        "queues",
        "slots",
        "t_calls",
        "t_next",
        "t_read_wait",
        "t_wait_out",
        "task",
        "watermark",
        "workers",
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
        self.late = 0  # items sort_by(buffer_size=) met later than its buffer allows
        self.evicted = 0  # groups group_by(max_keys=) closed early to make room
        self.watermark: Any = None  # an event-time stage's output watermark
        self.event_time: Any = None  # ... and the largest event time it has seen
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
        self.q_samples = Samples()  # items held in its output channels, over time
        self.lanes: list[Lane] = []  # its instances (see the module doc)
        self.workers: dict[Any, Lane] = {}  # a process pool's workers, by worker
        self.slots: list[Lane] = []  # the call slots of a concurrent map
        self.free_slots: list[Lane] = []
        self.calls = Samples()  # calls in flight, over time

    # -- lanes ----------------------------------------------------------------------------
    def take_lane(self, prefer: int | None = None) -> Lane:
        """A free lane for a new instance: ``prefer`` (its reader's) if free, else the lowest."""
        return _take(self.lanes, prefer)

    def worker_done(self, worker: Any, end: float, seconds: float) -> None:
        """A process worker (its pid) computed for ``seconds`` until ``end`` (a batch)."""
        ln = self.workers.get(worker)
        if ln is None:
            ln = self.workers[worker] = Lane(len(self.workers))
        self.t_calls += seconds
        ln.work(end, seconds)

    def call_started(self) -> Lane:
        """A call of a concurrent map starts: it takes a slot (free it with ``call_done``)."""
        self.calls.add(1)
        free = self.free_slots
        if free:
            return free.pop()
        ln = Lane(len(self.slots))
        self.slots.append(ln)
        return ln

    def call_done(self, slot: Lane, start: float, end: float, busy: bool = True) -> None:
        """The call on ``slot`` ended; ``busy``: its duration is the stage's busy time."""
        self.free_slots.append(slot)
        self.calls.add(-1)
        if busy:
            self.t_calls += end - start
            slot.work(end, end - start)

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


def _take(lanes: list[Lane], prefer: int | None) -> Lane:
    if prefer is not None:
        while len(lanes) <= prefer:  # the lane of the instance reading it: the same index
            lanes.append(Lane(len(lanes)))
    if prefer is not None and not lanes[prefer].in_use:
        ln = lanes[prefer]
    else:
        free = next((x for x in lanes if not x.in_use), None)
        if free is None:
            free = Lane(len(lanes))
            lanes.append(free)
        ln = free
    ln.in_use = True
    return ln
