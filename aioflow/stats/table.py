"""``str(RunStats)`` and ``RunStats._repr_html_``: the stats table, in text and in HTML.

One row per stage, sources first, the bottleneck marked ``*``. Seconds are shown with
their share of the wall time; a stage run as several instances at once (``xN`` in the
``inst`` column) shows its seconds summed and its shares per instance, with the busiest
instance's busy share, so that no share passes 100%.
"""

from __future__ import annotations

import html
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from aioflow.stats import RunStats, StageStats

__all__ = ["notes", "table", "table_html"]

HEAD = ("stage", "in", "out", "busy", "wait in", "wait out", "inst", "queue", "conc", "skip")
LEGEND = (
    "(seconds, and share of wall per instance; inst: xN instances at once, the busiest"
    " one's busy share;\n queue: mean/peak fill of the output channel; conc: calls in"
    " flight/limit)"
)


def _row(s: StageStats, wall: float, mark: str) -> list[str]:
    per = s.per_instance

    def t(x: float) -> str:
        return f"{x:.3f}s {x / per / wall:4.0%}"

    q = "-"
    if s.queue_fill is not None and s.queue_fill_peak is not None:
        q = f"{s.queue_fill:.0%}/{s.queue_fill_peak:.0%}"
    inst = "-"
    if s.instances > 1:
        inst = f"x{s.instances} max {(s.busy_max or 0.0) / wall:.0%}"
    conc = f"{s.in_flight or 0:.1f}/{s.concurrency}" if s.concurrency else "-"
    return [
        mark + s.name,
        f"{s.items_in:,}",
        f"{s.items_out:,}",
        t(s.busy),
        t(s.wait_in),
        t(s.wait_out),
        inst,
        q,
        conc,
        str(s.errors_skipped),
    ]


def rows(stats: RunStats) -> list[list[str]]:
    wall = stats.wall if stats.wall > 0 else 1.0
    b = stats.bottleneck
    return [_row(s, wall, "* " if s is b else "  ") for s in stats.stages]


def notes(stats: RunStats) -> list[str]:
    out = []
    for s in stats.stages:
        if s.late:
            out.append(
                f"{s.name}: {s.late:,} late (items whose place was already emitted: later"
                " than its buffer_size or max_delay allows; see on_late)"
            )
        if s.watermark is not None:
            out.append(
                f"{s.name}: watermark {s.watermark}, lag {s.watermark_lag} (event time up"
                " to which its output is complete, and how far behind the latest time seen)"
            )
        if s.evicted:
            out.append(
                f"{s.name}: {s.evicted:,} evicted (groups let out before they were full"
                " to make room for a new key, or keys forgotten: max_keys)"
            )
    return out


def table(stats: RunStats) -> str:
    head = ["  " + HEAD[0], *HEAD[1:]]
    all_rows = [head, *rows(stats)]
    widths = [max(len(r[i]) for r in all_rows) for i in range(len(head))]
    lines = []
    for j, r in enumerate(all_rows):
        cells = [c.ljust(widths[i]) if i == 0 else c.rjust(widths[i]) for i, c in enumerate(r)]
        lines.append("  ".join(cells).rstrip())
        if j == 0:
            lines.append("  ".join("-" * w for w in widths))
    lines.append(LEGEND)
    lines.extend(notes(stats))
    lines.append(stats.summary())
    return "\n".join(lines)


def table_html(stats: RunStats) -> str:
    head = "".join(f"<th>{html.escape(h)}</th>" for h in HEAD)
    b = stats.bottleneck
    body = []
    for s, r in zip(stats.stages, rows(stats), strict=True):
        r = [r[0][2:], *r[1:]]
        style = ' style="font-weight:bold;background:#fde2e2"' if s is b else ""
        cells = "".join(
            f'<td style="text-align:{"left" if i == 0 else "right"}">{html.escape(c)}</td>'
            for i, c in enumerate(r)
        )
        body.append(f"<tr{style}>{cells}</tr>")
    extra = "".join(f"<p>{html.escape(n)}</p>" for n in notes(stats))
    return (
        f"<table><thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table>"
        f"{extra}<p>{html.escape(stats.summary())}</p>"
    )
