"""``RunStats.trace``: a run as a timeline, in Chrome's trace-event JSON (Perfetto).

One process ("aioflow run"); a track (a "thread") per stage, or per instance of a stage
run as several at once (``name [i]``), per process worker (``name · worker i``) or call
slot (``name · call i``) of a concurrent map, each with its busy spans ("X" events that
never overlap within a track); counters ("C" events) for each stage's output queue
(items held) and calls in flight; and a ``consumer`` track with its waits for items.
Times are microseconds from the start of the run. The spans come from the stages'
lanes (``aioflow._meters``): a span of a fast stage is several pieces of work merged,
its busy time packed at its end (``args.merged`` says how many).
"""

from __future__ import annotations

import json
import os
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from aioflow.stats import RunStats
    from aioflow.stats.meters import Lane, Samples, StageMeter

__all__ = ["trace_events", "write_trace"]

PID = 1


def _tracks(name: str, m: StageMeter) -> list[tuple[str, Lane]]:
    """The tracks of one stage: its workers or call slots, or its instances."""
    if m.concurrency:
        if m.workers:
            return [(f"{name} · worker {i + 1}", ln) for i, ln in enumerate(m.workers.values())]
        return [(f"{name} · call {ln.index + 1}", ln) for ln in list(m.slots)]
    lanes = list(m.lanes)
    if len(lanes) == 1:
        return [(name, lanes[0])]
    return [(f"{name} [{ln.index + 1}]", ln) for ln in lanes]


def trace_events(stats: RunStats) -> list[dict[str, Any]]:
    """The trace events of ``stats``' run (empty for stats not taken from a run)."""
    if stats._timeline is None:
        return []
    origin, until, consumer, named = stats._timeline

    def us(t: float) -> float:
        return round((t - origin) * 1e6, 3)

    events: list[dict[str, Any]] = [
        {"ph": "M", "pid": PID, "name": "process_name", "args": {"name": "aioflow run"}}
    ]
    tracks: list[tuple[str, Lane, str]] = [
        (track, ln, "busy") for name, m in named for track, ln in _tracks(name, m)
    ]
    tracks.append(("consumer", consumer, "wait"))
    for tid, (track, ln, what) in enumerate(tracks, start=1):
        events.append(
            {"ph": "M", "pid": PID, "tid": tid, "name": "thread_name", "args": {"name": track}}
        )
        order = {"sort_index": tid}
        events.append(
            {"ph": "M", "pid": PID, "tid": tid, "name": "thread_sort_index", "args": order}
        )
        for start, dur, n in ln.all_spans():
            ev: dict[str, Any] = {
                "ph": "X",
                "pid": PID,
                "tid": tid,
                "name": what,
                "ts": us(start),
                "dur": round(dur * 1e6, 3),
            }
            if n > 1:
                ev["args"] = {"merged": n}
            events.append(ev)
    for name, m in named:
        events.extend(_counter(f"queue {name}", "items", m.q_samples, us, until))
        events.extend(_counter(f"in flight {name}", "calls", m.calls, us, until))
    return events


def _counter(name: str, key: str, c: Samples, us: Any, until: float) -> list[dict[str, Any]]:
    """A counter's samples (at most one a millisecond), and its value at the end."""
    points = [*c.all_points(), (until, c.now)] if c.points else []
    return [{"ph": "C", "pid": PID, "name": name, "ts": us(t), "args": {key: v}} for t, v in points]


def write_trace(stats: RunStats, path: str | os.PathLike[str]) -> None:
    """Write ``stats``' timeline to ``path`` as Chrome trace-event JSON."""
    doc = {"traceEvents": trace_events(stats), "displayTimeUnit": "ms"}
    with open(path, "w") as f:
        json.dump(doc, f, separators=(",", ":"))
