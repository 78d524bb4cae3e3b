"""``RunStats.plot``: where each stage spends its time, as horizontal stacked bars (PNG).

matplotlib is an optional extra (``pip install 'aioflow[plot]'``), imported only here and
only when a picture is asked for. The figure is drawn with matplotlib's object API
(``Figure``), never ``pyplot``: no GUI backend, no global state, safe from any thread.
"""

from __future__ import annotations

import os
import textwrap
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from aioflow.stats import RunStats

__all__ = ["plot_stats"]

_COLORS = {"busy": "#d62728", "wait_in": "#9ecae1", "wait_out": "#fdae6b"}


def plot_stats(stats: RunStats, path: str | os.PathLike[str]) -> None:
    """Write the picture of ``stats`` to ``path`` as a PNG."""
    try:
        from matplotlib.figure import Figure
    except ImportError as e:  # pragma: no cover - matplotlib is in the test extras
        raise ImportError("RunStats.plot needs matplotlib: pip install 'aioflow[plot]'") from e

    stages = list(stats.stages)
    n = max(1, len(stages))
    fig = Figure(figsize=(11, 1.9 + 0.55 * n), dpi=100, layout="constrained")
    ax = fig.add_subplot()
    if not stages:
        ax.text(0.5, 0.5, "no stage ran", ha="center", va="center", transform=ax.transAxes)
        ax.set_axis_off()
        fig.savefig(path, format="png")
        return

    ys = list(range(len(stages)))
    wall = stats.wall
    busy, wait_in, wait_out = _bars(stats)
    left2 = [a + b for a, b in zip(busy, wait_in, strict=True)]
    ax.barh(ys, busy, color=_COLORS["busy"], label="busy")
    ax.barh(ys, wait_in, left=busy, color=_COLORS["wait_in"], label="waiting on input")
    ax.barh(ys, wait_out, left=left2, color=_COLORS["wait_out"], label="waiting on output")

    ax.axvline(wall, color="black", linestyle="--", linewidth=1, label=f"wall ({wall:.3g} s)")
    ends = [a + b for a, b in zip(left2, wait_out, strict=True)]
    span = max([wall, *ends]) or 1.0
    for y, s, end in zip(ys, stages, ends, strict=True):
        note = f"busy {s.busy_share(wall):.0%}"
        if s.instances > 1:
            note += f" per instance of {s.instances} (max {(s.busy_max or 0.0) / wall:.0%})"
        if s.concurrency:
            note += f" · {s.in_flight or 0:.1f}/{s.concurrency} in flight"
        if s.queue_fill is not None:
            note += f" · out queue {s.queue_fill:.0%} full"
        ax.text(end + span * 0.005, y, note, va="center", ha="left", fontsize=8)

    bottleneck = stats.bottleneck
    ax.set_yticks(ys, labels=[_label(s.name) for s in stages])
    for tick, s in zip(ax.get_yticklabels(), stages, strict=True):
        if s is bottleneck:
            tick.set_fontweight("bold")
            tick.set_color(_COLORS["busy"])
    ax.invert_yaxis()  # sources at the top, as in the table
    ax.set_xlim(0, span * 1.75)  # room for the notes after the bars
    ax.set_xlabel("seconds (per instance, for a stage run as several at once)")
    ax.grid(axis="x", alpha=0.3)
    ax.set_axisbelow(True)
    fig.legend(loc="outside lower center", ncols=4, fontsize=8, frameon=False)
    ax.set_title(textwrap.fill(stats.summary(), 110), fontsize=9, loc="left", color="#333333")
    fig.suptitle("aioflow: where each stage spends its time", fontsize=11, x=0.01, ha="left")
    fig.savefig(path, format="png")


def _bars(stats: RunStats) -> tuple[list[float], list[float], list[float]]:
    """Seconds per instance of busy, waiting on input and on output, stacked within the wall.

    A stage's times overlap where it waits on several inputs at once, or where its calls
    run while its feeder waits: the waits are cut so that no bar passes the wall line (the
    notes after the bars give the busy share)."""
    wall = stats.wall
    busy, wait_in, wait_out = [], [], []
    for s in stats.stages:
        per = s.per_instance
        b = min(s.busy / per, wall)
        wi = min(s.wait_in / per, wall - b)
        wo = min(s.wait_out / per, wall - b - wi)
        busy.append(b)
        wait_in.append(max(0.0, wi))
        wait_out.append(max(0.0, wo))
    return busy, wait_in, wait_out


def _label(name: str, width: int = 32) -> str:
    """The stage's whole name, on several lines when long (after its ``>``)."""
    if len(name) <= width:
        return name
    parts = name.split(" > ")
    lines = [parts[0]]
    for p in parts[1:]:
        if len(lines[-1]) + 3 + len(p) <= width:
            lines[-1] += " > " + p
        else:
            lines.append("> " + p)
    return "\n".join(line for part in lines for line in textwrap.wrap(part, width) or [""])
