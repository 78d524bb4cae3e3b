"""Per-stage statistics of a run: what each stage did, where it waited, which is slow.

While a run goes, each stage updates a small mutable ``StageMeter`` (a few float and int
additions per chunk, not per item). ``it.stats()`` turns them into frozen ``StageStats``
values inside a ``RunStats``, whose ``str()`` is a table naming the bottleneck stage.
"""

from __future__ import annotations

import html
from dataclasses import dataclass, field
from typing import Any

__all__ = ["RunStats", "StageMeter", "StageStats"]


class StageMeter:
    """Mutable counters of one stage during a run (internal)."""

    __slots__ = (
        "channel",
        "chunks_out",
        "concurrency",
        "errors_skipped",
        "inputs",
        "items_out",
        "key",
        "name",
        "t_next",
        "t_read_wait",
        "t_wait_out",
        "task",
    )

    def __init__(self, name: str, key: Any, *, task: bool = False) -> None:
        self.name = name
        self.key = key
        self.task = task
        self.items_out = 0
        self.chunks_out = 0
        self.t_next = 0.0  # time spent producing output, inclusive of fused input stages
        self.t_read_wait = 0.0  # time the reader of this stage's channel waited on it
        self.t_wait_out = 0.0  # time this (task) stage waited for room in its channel
        self.errors_skipped = 0
        self.concurrency: int | None = None
        self.inputs: list[StageMeter] = []
        self.channel: Any = None

    def wait_in(self) -> float:
        return sum(i.t_read_wait if i.task else i.t_next for i in self.inputs)

    def items_in(self) -> int:
        return sum(i.items_out for i in self.inputs)


@dataclass(frozen=True)
class StageStats:
    """What one stage did in a run (a frozen snapshot).

    ``busy`` is time spent in the stage itself, ``wait_in`` time spent waiting for its
    input, ``wait_out`` time spent waiting for room downstream (stages in their own task
    only); ``queue_mean``/``queue_peak`` describe its output channel against
    ``queue_capacity`` (items), where it has one.
    """

    name: str
    items_in: int
    items_out: int
    busy: float
    wait_in: float
    wait_out: float
    errors_skipped: int = 0
    concurrency: int | None = None
    own_task: bool = False
    queue_mean: float | None = None
    queue_peak: int | None = None
    queue_capacity: int | None = None


@dataclass(frozen=True)
class RunStats:
    """Statistics of a whole run: one ``StageStats`` per stage, source first.

    Example:
        >>> import aioflow as af
        >>> with af.range(10).map(lambda x: x * 2).iter() as it:
        ...     total = sum(it)
        ...     s = it.stats()
        >>> s["map(<lambda>)"].items_out
        10
    """

    stages: tuple[StageStats, ...]
    wall: float
    extra: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_meters(cls, meters: list[StageMeter], wall: float) -> RunStats:
        out = []
        for m in reversed(meters):  # meters are made sink-first; show the source first
            wait_in = m.wait_in()
            ch = m.channel
            has_q = ch is not None and hasattr(ch, "occupancy_samples")
            out.append(
                StageStats(
                    name=m.name,
                    items_in=m.items_in(),
                    items_out=m.items_out,
                    busy=max(0.0, m.t_next - wait_in),
                    wait_in=wait_in,
                    wait_out=m.t_wait_out,
                    errors_skipped=m.errors_skipped,
                    concurrency=m.concurrency,
                    own_task=m.task,
                    queue_mean=(ch.occupancy_sum / ch.occupancy_samples)
                    if has_q and ch.occupancy_samples
                    else (0.0 if has_q else None),
                    queue_peak=ch.peak if has_q else None,
                    queue_capacity=ch.max_items if has_q else None,
                )
            )
        return cls(tuple(_unique_names(out)), wall)

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
    def bottleneck(self) -> StageStats | None:
        """The stage that spent the most time busy (None for an empty run)."""
        if not self.stages:
            return None
        return max(self.stages, key=lambda s: s.busy)

    def _rows(self) -> list[list[str]]:
        rows = []
        for s in self.stages:
            q = (
                f"{s.queue_mean:.0f}/{s.queue_peak}/{s.queue_capacity}"
                if s.queue_capacity is not None and s.queue_mean is not None
                else "-"
            )
            rows.append(
                [
                    s.name,
                    str(s.items_in),
                    str(s.items_out),
                    f"{s.busy:.3f}",
                    f"{s.wait_in:.3f}",
                    f"{s.wait_out:.3f}",
                    q,
                    str(s.errors_skipped),
                ]
            )
        return rows

    _HEAD = ("stage", "in", "out", "busy s", "wait in s", "wait out s", "queue m/pk/cap", "skip")

    def summary(self) -> str:
        b = self.bottleneck
        if b is None:
            return "no stages ran"
        share = b.busy / self.wall if self.wall > 0 else 0.0
        return (
            f"bottleneck: {b.name} (busy {b.busy:.3f} s, {share:.0%} of {self.wall:.3f} s wall;"
            " the stages after it wait on it)"
        )

    def __str__(self) -> str:
        rows = [list(self._HEAD), *self._rows()]
        widths = [max(len(r[i]) for r in rows) for i in range(len(self._HEAD))]
        lines = []
        for j, r in enumerate(rows):
            cells = [c.ljust(widths[i]) if i == 0 else c.rjust(widths[i]) for i, c in enumerate(r)]
            lines.append("  ".join(cells).rstrip())
            if j == 0:
                lines.append("  ".join("-" * w for w in widths))
        lines.append(self.summary())
        return "\n".join(lines)

    def _repr_html_(self) -> str:
        head = "".join(f"<th>{html.escape(h)}</th>" for h in self._HEAD)
        b = self.bottleneck
        body = []
        for s, r in zip(self.stages, self._rows(), strict=True):
            style = ' style="font-weight:bold"' if b is not None and s is b else ""
            body.append(f"<tr{style}>" + "".join(f"<td>{html.escape(c)}</td>" for c in r) + "</tr>")
        return (
            f"<table><thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table>"
            f"<p>{html.escape(self.summary())}</p>"
        )


def _unique_names(stages: list[StageStats]) -> list[StageStats]:
    seen: dict[str, int] = {}
    out = []
    for s in stages:
        n = seen.get(s.name, 0)
        seen[s.name] = n + 1
        if n:
            s = StageStats(**{**s.__dict__, "name": f"{s.name}#{n + 1}"})
        out.append(s)
    return out
