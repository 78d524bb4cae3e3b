"""``af.bench``: how fast a pipeline runs on its own (tensorpack's ``TestDataSpeed``).

It iterates the pipeline with the sync adapter (so it works from a script and from a
notebook cell alike), shows a tqdm progress bar with items/s, and returns a small frozen
``BenchResult``: items/s, time to the first item, the item count, the wall time and the
run's ``RunStats``. The loop reads items in batches whose size adapts to the rate (as the
sources size their chunks), so timing and the progress bar cost little per item.
"""

from __future__ import annotations

import html
from collections import deque
from dataclasses import dataclass
from itertools import islice
from time import perf_counter
from typing import Any

from tqdm import tqdm

from aioflow._iterators import PipelineIterator
from aioflow.errors import PipelineError
from aioflow.pipeline import INFINITE, Pipeline
from aioflow.stats import RunStats

__all__ = ["BenchResult", "bench", "unit_of"]

# Read this long between two looks at the clock and the progress bar.
_STEP_SECONDS = 0.05


@dataclass(frozen=True)
class BenchResult:
    """What ``af.bench`` measured (a frozen value).

    ``items`` were read in ``seconds`` after the warm-up (``items_per_s`` is their ratio);
    ``first_item_s`` is the time from the start of the run to its first item (warm-up
    included); ``stats`` are the whole run's per-stage stats; ``unit`` names what an item
    is: ``"batches"`` when the pipeline ends in a batching stage (``unit_of``), else
    ``"items"``.
    """

    items: int
    seconds: float
    items_per_s: float
    first_item_s: float | None
    warmup: int
    stats: RunStats
    unit: str = "items"

    @property
    def one(self) -> str:
        """One of ``unit``: ``"item"`` or ``"batch"``."""
        return "batch" if self.unit == "batches" else "item"

    def __str__(self) -> str:
        first = f"no {self.one}" if self.first_item_s is None else f"{self.first_item_s:.3f} s"
        u = self.unit
        head = (
            f"{self.items:,} {u} in {self.seconds:.3f} s: {self.items_per_s:,.1f} {u}/s"
            f" (first {self.one} after {first}"
            + (f"; {self.warmup:,} warm-up {u} not timed)" if self.warmup else ")")
        )
        return f"{head}\n{self.stats}"

    def _repr_html_(self) -> str:
        first = "no item" if self.first_item_s is None else f"{self.first_item_s:.3f} s"
        return (
            f"<p><b>{self.items_per_s:,.1f} {self.unit}/s</b>: {self.items:,} {self.unit} in"
            f" {self.seconds:.3f} s (first {self.one} after {html.escape(first)})</p>"
            + self.stats._repr_html_()
        )


# stages after which an item of the output is still one of the stage before's
_SAME_UNIT: tuple[str, ...] = ("prefetch", "take", "skip", "repeat", "shard", "cache")
_SAME_UNIT += ("shuffle(", "map(", "filter(", "enumerate")
_BATCHES = ("batch(", "padded_batch(", "rebatch(", "bucket_by_length")


def unit_of(p: Pipeline[Any]) -> str:
    """``"batches"`` when ``p`` yields batches (it ends in a batching stage), else ``"items"``.

    Stages that keep the unit (``prefetch``, ``map``, ``take``, ...) after the batching
    stage do not change it; ``unbatch`` and every other stage make it ``"items"``.

    Example:
        >>> import aioflow as af
        >>> unit_of(af.range(8).batch(4).map(len).prefetch(2)), unit_of(af.range(8))
        ('batches', 'items')
    """
    node = p._node
    while node.name.startswith(_SAME_UNIT) and len(node.inputs) == 1:
        node = node.inputs[0]._node
    return "batches" if node.name.startswith(_BATCHES) else "items"


def _check_limit(name: str, v: Any, kind: type | tuple[type, ...]) -> None:
    if v is None:
        return
    ok = not isinstance(v, bool) and isinstance(v, kind)
    if not ok or v < 0:
        what = "an int" if kind is int else "a number"
        raise PipelineError(f"bench: {name} must be {what} >= 0 or None, got {v!r}")


def bench(
    p: Pipeline[Any],
    *,
    num_items: int | None = None,
    seconds: float | None = None,
    warmup: int = 0,
    progress: bool = True,
) -> BenchResult:
    """Run ``p`` with a progress bar and measure its speed (tensorpack ``TestDataSpeed``).

    Reads ``warmup`` items untimed, then up to ``num_items`` items or for up to ``seconds``
    seconds, whichever comes first (the whole pipeline when both are ``None``; an
    infinite one needs a limit), and closes the run. ``progress`` shows a tqdm bar with
    items/s on stderr. Returns a ``BenchResult`` whose ``str()`` is a line with items/s
    and time to first item, followed by the run's stats table.

    Example:
        >>> import aioflow as af
        >>> r = af.bench(af.range(1000).map(lambda x: x + 1).batch(10), progress=False)
        >>> r.items, r.items_per_s > 0, r.stats["batch(10)"].items_in
        (100, True, 1000)
    """
    if not isinstance(p, Pipeline):
        raise PipelineError(f"bench needs a Pipeline, got {type(p).__name__}")
    _check_limit("num_items", num_items, int)
    _check_limit("seconds", seconds, (int, float))
    _check_limit("warmup", warmup, int)
    if num_items is None and seconds is None and p.cardinality() == INFINITE:
        raise PipelineError("bench: the pipeline is infinite: give num_items or seconds")
    total = num_items
    if total is None and seconds is None and p.cardinality() >= 0:
        total = max(0, p.cardinality() - warmup)
    unit = unit_of(p)
    bar = tqdm(
        total=total,
        unit="batch" if unit == "batches" else "it",
        disable=not progress,
        desc="bench",
        smoothing=0.1,
    )
    with bar, p.iter() as it:
        reader = _Reader(it)
        if warmup:
            bar.set_description_str("bench (warm-up)")
            reader.take(warmup)
            bar.set_description_str("bench")
        t0 = perf_counter() if warmup else reader.t_start
        count = 0
        if reader.consumed >= warmup:  # else the pipeline ended during the warm-up
            count = _timed(reader, bar, num_items, seconds, t0)
        elapsed = perf_counter() - t0
    stats = it.stats()  # the run is closed: its stats are final
    return BenchResult(
        items=count,
        seconds=elapsed,
        items_per_s=count / elapsed if elapsed > 0 else 0.0,
        first_item_s=reader.first,
        warmup=min(warmup, reader.consumed),
        stats=stats,
        unit=unit,
    )


class _Reader:
    """Reads a run's items without holding them; notes when the first one came."""

    def __init__(self, it: PipelineIterator[Any]) -> None:
        self.it = it
        self.t_start = perf_counter()
        self.first: float | None = None  # seconds to the first item
        self.consumed = 0  # items read, warm-up included

    def take(self, n: int) -> int:
        """Read up to ``n`` items; how many there were."""
        if n <= 0:
            return 0
        it = self.it
        before = it._count
        if self.first is None:
            try:
                next(it)
            except StopIteration:
                return 0
            self.first = perf_counter() - self.t_start
            n -= 1
        deque(islice(it, n), maxlen=0)  # consume without holding the items
        got = it._count - before
        self.consumed += got
        return got


def _timed(
    reader: _Reader, bar: Any, num_items: int | None, seconds: float | None, t0: float
) -> int:
    """Read up to ``num_items`` items or until ``seconds`` after ``t0``; how many."""
    count = 0
    step = 1
    while True:
        want = step if num_items is None else min(step, num_items - count)
        if want <= 0:
            break
        s0 = perf_counter()
        got = reader.take(want)
        now = perf_counter()
        count += got
        bar.update(got)
        if got < want or (seconds is not None and now - t0 >= seconds):
            break
        # adapt the read size so that the clock and the bar are looked at ~20 times/s
        if now - s0 < _STEP_SECONDS / 2 and step < 1 << 16:
            step *= 2
        elif now - s0 > 2 * _STEP_SECONDS and step > 1:
            step //= 2
    return count
