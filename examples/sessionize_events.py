"""Click logs to balanced, padded training batches: sort_by, group_by, rejection_resample.

The script writes its own data: JSONL click events in several files (one per time
slice, like hourly logs), each event up to ``--lateness`` places out of time order, with
rare purchases. The pipeline then

1. reads the files in order (``flat_map`` over a JSONL reader),
2. repairs the order with a streaming ``sort_by(ts, buffer_size=lateness)``,
3. cuts per-user sessions with ``group_by(user, size=..., max_keys=...)`` (a session ends
   when it is full, or when it is the oldest of too many open ones: bounded memory),
4. balances sessions with and without a purchase with ``rejection_resample``,
5. batches them for a sequence model with ``bucket_by_length`` (padded numpy arrays).

    python examples/sessionize_events.py [--events 30000] [--files 4] [--lateness 64]

It prints what it did and, last, one JSON line with the figures (the test reads it).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from collections.abc import Iterator
from typing import Any

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
import aioflow as af


def write_events(folder: str, n: int, files: int, lateness: int, seed: int) -> list[str]:
    """``n`` events in ``files`` JSONL files, each event at most ``lateness`` places late."""
    rng = np.random.default_rng(seed)
    ts = np.cumsum(rng.exponential(50.0, n))  # ms, in time order
    users = rng.zipf(1.6, n) % 500  # a few heavy users, many light ones
    items = rng.integers(0, 1000, n)
    dwell = rng.gamma(2.0, 3.0, n)
    bought = rng.random(n) < 0.012
    paths = []
    for f, idx in enumerate(np.array_split(np.arange(n), files)):
        # each event is delayed by up to `lateness` places within its file
        order = sorted(idx.tolist(), key=lambda i: (i + rng.integers(0, lateness + 1), i))
        path = os.path.join(folder, f"clicks-{f:02d}.jsonl")
        with open(path, "w") as fh:
            for i in order:
                event = {
                    "ts": round(float(ts[i]), 3),
                    "user": f"u{users[i]}",
                    "item": int(items[i]),
                    "dwell": round(float(dwell[i]), 2),
                    "bought": bool(bought[i]),
                }
                fh.write(json.dumps(event) + "\n")
        paths.append(path)
    return paths


def read_jsonl(path: str) -> Iterator[dict[str, Any]]:
    with open(path) as fh:
        for line in fh:
            yield json.loads(line)


def to_session(group: tuple[str, list[dict[str, Any]]]) -> dict[str, Any]:
    """A session's features: item ids and dwell times (variable length), and its label."""
    _, events = group
    return {
        "items": np.array([e["item"] for e in events], dtype=np.int64),
        "dwell": np.array([e["dwell"] for e in events], dtype=np.float32),
        "label": int(any(e["bought"] for e in events)),
    }


class Tally:
    """Counts what passes a point of the pipeline (for the summary)."""

    def __init__(self) -> None:
        self.n = self.positives = self.inversions = 0
        self.last = -np.inf

    def event(self, e: dict[str, Any]) -> dict[str, Any]:
        self.n += 1
        self.inversions += e["ts"] < self.last
        self.last = e["ts"]
        return e

    def session(self, s: dict[str, Any]) -> dict[str, Any]:
        self.n += 1
        self.positives += s["label"]
        return s


def build(paths: list[str], lateness: int, seed: int, tallies: dict[str, Tally]) -> af.Pipeline:
    events = (
        af.from_iterable(paths)
        .flat_map(read_jsonl)
        .sort_by(lambda e: e["ts"], buffer_size=lateness)
        .map(tallies["events"].event)
    )
    sessions = (
        events.group_by(lambda e: e["user"], size=24, max_keys=64)
        .map(to_session)
        .map(tallies["sessions"].session)
    )
    balanced = sessions.rejection_resample(lambda s: s["label"], [0.5, 0.5], seed=seed)
    return balanced.map(tallies["kept"].session).bucket_by_length(
        lambda s: len(s["items"]), [4, 12], [64, 64, 32]
    )


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--events", type=int, default=30_000)
    ap.add_argument("--files", type=int, default=4)
    ap.add_argument("--lateness", type=int, default=64)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args(argv)
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="sessionize-") as folder:
        paths = write_events(folder, a.events, a.files, a.lateness, a.seed)
        raw = [e["ts"] for p in paths for e in read_jsonl(p)]
        late_in = sum(x < y for x, y in zip(raw[1:], raw, strict=False))
        tallies = {k: Tally() for k in ("events", "sessions", "kept")}
        shapes = []
        rows = 0
        for batch in build(paths, a.lateness, a.seed, tallies):
            assert batch["items"].shape == batch["dwell"].shape
            shapes.append(list(batch["items"].shape))
            rows += len(batch["label"])
    ev, ss, kept = tallies["events"], tallies["sessions"], tallies["kept"]
    summary = {
        "events": ev.n,
        "out_of_order_in": late_in,
        "out_of_order_after_sort": ev.inversions,
        "sessions": ss.n,
        "positive_share_before": round(ss.positives / max(ss.n, 1), 3),
        "sessions_kept": kept.n,
        "positive_share_after": round(kept.positives / max(kept.n, 1), 3),
        "batches": len(shapes),
        "rows": rows,
        "batch_shapes": shapes[:3],
        "seconds": round(time.perf_counter() - t0, 2),
    }
    print(f"{summary['events']} events ({late_in} out of time order) read from {a.files} files")
    print(f"sorted: {ev.inversions} out of order after sort_by(buffer_size={a.lateness})")
    print(
        f"{ss.n} sessions, {summary['positive_share_before']:.1%} with a purchase;"
        f" after rejection_resample: {kept.n} sessions,"
        f" {summary['positive_share_after']:.1%} with a purchase"
    )
    print(f"{len(shapes)} padded batches, e.g. items {shapes[:3]}; {summary['seconds']} s")
    print(json.dumps(summary))
    return summary


if __name__ == "__main__":
    main()
