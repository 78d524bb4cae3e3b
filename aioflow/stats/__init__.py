"""Per-stage statistics of a run: what each stage did, where it waited, which is slow.

While a run goes, each stage updates a small mutable meter (``aioflow._meters``): a few
float and int additions per chunk (not per item), per call for concurrent stages.
``it.stats()`` turns them into frozen ``StageStats`` values inside a ``RunStats``, whose
``str()`` is a table naming the bottleneck stage and why, ``_repr_html_`` the same for a
notebook, and ``plot(path)`` a picture of where each stage spends its time.

How the times are measured (all wall-clock seconds):

- ``busy``: time inside the stage's own code. For a stage fused into the task that reads
  it, the time spent producing its chunks minus the time spent in its inputs; for a stage
  with ``concurrency`` calls in flight, the summed duration of its calls divided by
  ``concurrency`` (so ``busy / wall`` is the share of its slots in use).
- ``wait_in``: time spent waiting for its input: on the channel of an input that runs in a
  task of its own, or inside a fused input.
- ``wait_out``: time a stage in a task of its own waited for room in its output channel.
- ``queue_*``: its output channel, averaged over time: items held and how full it is
  (``queue_fill``: the larger of the chunk and item fractions of its capacity).

A stage of a sub-pipeline that runs as several instances at once (the readers of an
``interleave``, the partitions of a ``partition_by``) is one row: ``instances`` is how
many ran at once at most, its seconds are summed over them and the table shows them per
instance (mean), with the busiest instance's busy share (``busy_max``); the workers of a
process pool likewise. So no share in the table passes 100%. ``it.stats().trace(path)``
writes the same run as a timeline (``aioflow._trace``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from time import perf_counter
from typing import Any

from aioflow.stats.meters import StageMeter
from aioflow.stats.plot import plot_stats
from aioflow.stats.table import notes, table, table_html
from aioflow.stats.trace import write_trace

__all__ = ["RunStats", "StageStats"]


@dataclass(frozen=True)
class StageStats:
    """What one stage did in a run (a frozen snapshot; see the module doc for the times).

    ``concurrency`` is the number of calls a stage may have in flight and ``in_flight``
    the mean number it had; ``queue_mean``/``queue_peak`` are items in its output channel
    (mean over time, peak) against ``queue_capacity``, ``queue_fill``/``queue_fill_peak``
    how full it was (0..1) and ``queue_nonempty`` the share of time it held an item; all
    ``None`` where the stage has no channel of its own. ``instances`` is how many
    instances of the stage ran at once at most (the readers of an ``interleave``, the
    partitions of a ``partition_by``, the workers of a process pool); ``busy_max`` the
    busy seconds of the busiest one (``None`` for a single instance). ``late`` counts the
    items a ``sort_by(buffer_size=)`` met later than its buffer allows, ``evicted`` the
    groups a ``group_by(max_keys=)`` let out early to make room (or the keys an
    ``asof_join(max_keys=)`` forgot). An event-time stage (``sort_by(max_delay=)``,
    ``window_by_time``, ``sessions``, ``asof_join``) has a ``watermark`` (its output is
    complete up to that event time) and ``watermark_lag``: the largest event time it has
    seen minus its watermark (``max_delay``, plus open windows' lateness).
    """

    name: str
    items_in: int
    items_out: int
    busy: float
    wait_in: float
    wait_out: float
    errors_skipped: int = 0
    concurrency: int | None = None
    in_flight: float | None = None
    own_task: bool = False
    queue_mean: float | None = None
    queue_peak: int | None = None
    queue_capacity: int | None = None
    queue_fill: float | None = None
    queue_fill_peak: float | None = None
    queue_nonempty: float | None = None
    inputs: tuple[str, ...] = ()
    instances: int = 1
    busy_max: float | None = None
    late: int = 0
    evicted: int = 0
    watermark: Any = None
    watermark_lag: Any = None

    @property
    def per_instance(self) -> int:
        """What the table divides this row's seconds by: its instances, unless its
        ``busy`` already is per call slot (a stage with ``concurrency``)."""
        return 1 if self.concurrency else max(1, self.instances)

    def busy_share(self, wall: float) -> float:
        """Busy share of the wall time, per instance (mean): 0..1."""
        return self.busy / self.per_instance / wall if wall > 0 else 0.0


def _stage_of(
    m: StageMeter, name: str, inputs: tuple[str, ...], wall: float, until: float
) -> StageStats:
    workers = [ln.busy for ln in m.workers.values()]
    lanes = [ln.busy for ln in m.lanes]
    instances = max(1, len(workers) or len(lanes))
    if m.concurrency:
        busy = m.t_calls / m.concurrency
        in_flight: float | None = m.t_calls / wall if wall > 0 else 0.0
        per = 1
    else:
        busy = sum(lanes)  # each chunk's time minus its inputs', on its instance's lane
        in_flight = None
        per = instances
    busy_max = max(workers or lanes) if instances > 1 else None
    # waits on several inputs (sub-pipelines read ahead) overlap: no more than all the time
    wait_in = min(m.wait_in(), wall * per)
    q: dict[str, Any] = {}
    if m.q_capacity is not None:
        span, area_fill, area_items = m.q_span, m.q_area, m.q_items_area
        nonempty, peak, peak_fill = m.q_nonempty, m.q_peak, m.q_peak_fill
        for qm in list(m.queues):  # channels still open
            s, a, i, ne = qm.totals(until)
            span, area_fill, area_items, nonempty = (
                span + s,
                area_fill + a,
                area_items + i,
                nonempty + ne,
            )
            peak, peak_fill = max(peak, qm.peak), max(peak_fill, qm.peak_fill)
        q = {
            "queue_mean": area_items / span if span > 0 else 0.0,
            "queue_peak": peak,
            "queue_capacity": m.q_capacity,
            "queue_fill": area_fill / span if span > 0 else 0.0,
            "queue_fill_peak": peak_fill,
            "queue_nonempty": nonempty / span if span > 0 else 0.0,
        }
    return StageStats(
        name=name,
        items_in=m.items_in(),
        items_out=m.items_out,
        busy=busy,
        wait_in=wait_in,
        wait_out=m.t_wait_out,
        errors_skipped=m.errors_skipped,
        concurrency=m.concurrency,
        in_flight=in_flight,
        own_task=m.task,
        inputs=inputs,
        instances=instances,
        busy_max=busy_max,
        late=m.late,
        evicted=m.evicted,
        watermark=m.watermark,
        watermark_lag=_lag(m),
        **q,
    )


def _lag(m: StageMeter) -> Any:
    try:
        return None if m.watermark is None else m.event_time - m.watermark
    except TypeError:
        return None


def _ordered(meters: list[StageMeter]) -> list[StageMeter]:
    """Sources first: every stage after its inputs and the sub-pipelines it opened."""
    below = {id(i) for m in meters for i in (*m.inputs, *m.children)}
    seen: set[int] = set()
    out: list[StageMeter] = []

    def visit(m: StageMeter) -> None:
        stack: list[tuple[StageMeter, bool]] = [(m, False)]
        while stack:  # iterative post-order: a long chain must not hit the recursion limit
            node, expanded = stack.pop()
            if expanded:
                out.append(node)
                continue
            if id(node) in seen:
                continue
            seen.add(id(node))
            stack.append((node, True))
            for i in reversed((*node.inputs, *node.children)):
                stack.append((i, False))

    for m in meters:
        if id(m) not in below:
            visit(m)
    for m in meters:  # anything unreachable (cannot happen in a tree, but never drop a row)
        visit(m)
    return out


def _input_words(s: StageStats, q: StageStats | None, wall: float) -> str:
    if q is not None and (q.queue_fill or 0.0) >= 0.7:
        return f"its input queue is full ({q.queue_fill:.0%} on average)"
    waited = s.wait_in / wall
    if waited < 0.02:
        return "it never waits on its input"
    return f"it waits on its input {waited:.0%} of wall"


def _output_words(q: StageStats) -> str:
    fill = q.queue_fill or 0.0
    if fill <= 0.3:
        return f"its output queue is empty ({fill:.0%} full on average)"
    return f"its output queue is {fill:.0%} full on average"


@dataclass(frozen=True)
class RunStats:
    """Statistics of a whole run: one ``StageStats`` per stage, sources first.

    ``str()`` is a table with the bottleneck stage marked ``*`` and a line saying why it is
    the bottleneck (or that the consumer is: ``consumer_bound``); ``_repr_html_`` is the
    same table for a notebook; ``plot(path)`` draws it (needs matplotlib:
    ``pip install 'aioflow[plot]'``).

    Example:
        >>> import aioflow as af
        >>> with af.range(10).map(lambda x: x * 2).iter() as it:
        ...     total = sum(it)
        ...     s = it.stats()
        >>> s["map(<lambda>)"].items_in, s["map(<lambda>)"].items_out
        (10, 10)
        >>> str(s).splitlines()[-1].startswith("bottleneck: ")
        True
    """

    stages: tuple[StageStats, ...]
    wall: float
    extra: dict[str, Any] = field(default_factory=dict)
    # what trace() draws: (start of the run, its end, consumer's lane, [(name, meter)])
    _timeline: Any = field(default=None, compare=False, repr=False)

    @classmethod
    def from_meters(
        cls,
        meters: list[StageMeter],
        wall: float,
        until: float | None = None,
        timeline: tuple[float, Any] | None = None,
    ) -> RunStats:
        """A snapshot of the meters of a run that has lasted ``wall`` seconds until ``until``.

        ``timeline``: (when the run started, the consumer's lane), for ``trace``.
        """
        until = perf_counter() if until is None else until
        order = _ordered(meters)
        names: dict[int, str] = {}
        seen: dict[str, int] = {}
        for m in order:
            n = seen.get(m.name, 0)
            seen[m.name] = n + 1
            names[id(m)] = m.name if n == 0 else f"{m.name}#{n + 1}"
        stages = tuple(
            _stage_of(m, names[id(m)], tuple(names[id(i)] for i in m.inputs), wall, until)
            for m in order
        )
        if timeline is None:
            return cls(stages, wall)
        named = [(names[id(m)], m) for m in order]
        return cls(stages, wall, _timeline=(timeline[0], until, timeline[1], named))

    def __getitem__(self, name: str) -> StageStats:
        for s in self.stages:
            if s.name == name:
                return s
        raise KeyError(name)

    def __iter__(self) -> Any:
        return iter(self.stages)

    def __len__(self) -> int:
        return len(self.stages)

    @property
    def consumer_bound(self) -> bool:
        """True when the consumer, not a stage, held the run back.

        That is: the last stage waited for room more than half of the wall time while no
        stage was busy half of it (the loop body is slower than the pipeline).
        """
        if not self.stages or self.wall <= 0:
            return False
        top = max(s.busy_share(self.wall) for s in self.stages)
        return top < 0.5 and self.stages[-1].wait_out / self.wall > 0.5

    @property
    def bottleneck(self) -> StageStats | None:
        """The busiest stage (its ``busy`` share of the wall, per instance, is the largest).

        ``None`` when no stage ran, or when the consumer is the bottleneck
        (``consumer_bound``).
        """
        if not self.stages or self.consumer_bound:
            return None
        return max(self.stages, key=lambda s: s.busy_share(self.wall))

    # -- the reasoning ------------------------------------------------------------------
    def _queue_before(self, s: StageStats) -> StageStats | None:
        """The stage whose output channel feeds the task that runs ``s``."""
        seen = set()
        while s.inputs and s.name not in seen:
            seen.add(s.name)
            s = self[s.inputs[0]]
            if s.queue_fill is not None:
                return s
        return None

    def _queue_after(self, s: StageStats) -> StageStats | None:
        """The stage whose output channel receives what ``s`` yields (itself, if it has one)."""
        seen = set()
        while s.queue_fill is None and s.name not in seen:
            seen.add(s.name)
            nxt = next((c for c in self.stages if s.name in c.inputs), None)
            if nxt is None:
                return None
            s = nxt
        return s

    def reason(self) -> str:
        """Why the bottleneck is the bottleneck, in words."""
        if self.consumer_bound:
            top = max(s.busy_share(self.wall) for s in self.stages)
            return (
                f"the pipeline waited for the consumer to take items"
                f" {self.stages[-1].wait_out / self.wall:.0%} of wall, and no stage was busy"
                f" more than {top:.0%}"
            )
        b = self.bottleneck
        if b is None or self.wall <= 0:
            return "no stage ran"
        what = f"busy {b.busy_share(self.wall):.0%} of wall"
        if b.instances > 1 and b.busy_max is not None:
            what += (
                f" on average over its {b.instances} instances"
                f" (the busiest {b.busy_max / self.wall:.0%})"
            )
        if b.concurrency:
            what += f" ({b.in_flight or 0:.1f} of {b.concurrency} calls in flight on average)"
        parts = []
        before, after = self._queue_before(b), self._queue_after(b)
        if not b.inputs:
            what += " (a source)"
        else:
            parts.append(_input_words(b, before, self.wall))
        if after is not None and after.queue_fill is not None:
            parts.append(_output_words(after))
        return f"{what} while {' and '.join(parts)}" if parts else what

    def summary(self) -> str:
        """One line: the bottleneck and why."""
        if not self.stages:
            return "no stage ran"
        wall = f"{self.wall:.3f} s" if self.wall >= 0.01 else f"{self.wall * 1e3:.2f} ms"
        b = self.bottleneck
        name = b.name if b is not None else "the consumer (the code iterating the pipeline)"
        return f"bottleneck: {name}: {self.reason()} (wall {wall})"

    # -- rendering (aioflow._table) ----------------------------------------------------
    def notes(self) -> list[str]:
        """Lines on what a stage counted beyond the table: late items, evicted groups."""
        return notes(self)

    def __str__(self) -> str:
        return table(self)

    def _repr_html_(self) -> str:
        return table_html(self)

    def trace(self, path: Any) -> Any:
        """Write the run as a timeline (Chrome trace-event JSON) at ``path``; returns ``path``.

        Perfetto (ui.perfetto.dev) and ``chrome://tracing`` open it: a track per stage
        (per instance, per process worker, per call slot) with its busy spans, counters
        for each stage's output queue (items held) and calls in flight, and a track of
        the consumer's waits for items. Spans of fast stages are merged (see
        ``aioflow._meters``), so their busy seconds still add up to the table's. The
        stats of a run still going draw its timeline as far as it has got when ``trace``
        is called; the last 100,000 spans of each track are kept.

        Example:
            >>> import json, os, tempfile, aioflow as af
            >>> with af.range(1000).map(lambda x: x + 1).prefetch(4).iter() as it:
            ...     _ = list(it)
            >>> path = os.path.join(tempfile.mkdtemp(), "run.json")
            >>> with open(it.stats().trace(path)) as f:
            ...     events = json.load(f)["traceEvents"]
            >>> sorted({e["args"]["name"] for e in events if e["name"] == "thread_name"})
            ['consumer', 'map(<lambda>)', 'prefetch(4)', 'range']
        """
        write_trace(self, path)
        return path

    def plot(self, path: Any) -> Any:
        """Draw busy / waiting-on-input / waiting-on-output time per stage as a PNG at ``path``.

        Horizontal stacked bars, one per stage, sources at the top, the bottleneck
        highlighted. Needs matplotlib (``pip install 'aioflow[plot]'``). Returns ``path``.

        Example:
            >>> import os, tempfile, aioflow as af
            >>> with af.range(100).map(lambda x: x + 1).iter() as it:
            ...     _ = list(it)
            >>> path = os.path.join(tempfile.mkdtemp(), "stats.png")
            >>> it.stats().plot(path) == path and os.path.getsize(path) > 0
            True
        """
        plot_stats(self, path)
        return path
