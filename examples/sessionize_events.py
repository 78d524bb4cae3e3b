"""Click logs to balanced, padded training batches, in event time: sort_by(max_delay=),
sessions, asof_join to a user-profile stream, rejection_resample, bucket_by_length.

The script writes its own data: JSONL click events in several files (one per time
slice, like hourly logs), each event up to ``--lateness`` ms late, with rare purchases;
and a JSONL stream of user-profile updates (a tier that changes now and then). Then

1. reads the click files in order (``flat_map`` over a JSONL reader),
2. repairs the order in event time with ``sort_by(ts, max_delay=lateness)``: an event
   comes out once the watermark (latest time seen minus the lateness) passes it,
3. cuts per-user sessions with ``sessions(ts, gap, by=user, max_items=...)``: a session
   ends after ``--gap`` ms of inactivity of its user, measured against the watermark, so an
   idle user's session comes out as the stream moves on,
4. joins each session to its user's profile *as of the session's end* with
   ``asof_join`` (no later profile update leaks into a training example),
5. balances sessions with and without a purchase with ``rejection_resample``,
6. batches them for a sequence model with ``bucket_by_length`` (padded numpy arrays).

    python examples/sessionize_events.py [--events 30000] [--files 4] [--lateness 2000]

It prints what it did, the stats' notes (late items, watermark lag of each event-time
stage) and, last, one JSON line with the figures (the test reads it).
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
    """``n`` events in ``files`` JSONL files, each event written up to ``lateness`` ms late."""
    rng = np.random.default_rng(seed)
    ts = np.cumsum(rng.exponential(50.0, n))  # ms, in time order
    users = rng.zipf(1.6, n) % 500  # a few heavy users, many light ones
    items = rng.integers(0, 1000, n)
    dwell = rng.gamma(2.0, 3.0, n)
    bought = rng.random(n) < 0.012
    arrival = ts + rng.uniform(0, lateness, n)  # when each event reached the log
    paths = []
    for f, idx in enumerate(np.array_split(np.arange(n), files)):
        order = idx[np.argsort(arrival[idx], kind="stable")]
        path = os.path.join(folder, f"clicks-{f:02d}.jsonl")
        with open(path, "w") as fh:
            for i in order.tolist():
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


def write_profiles(folder: str, users: int, span: float, seed: int) -> str:
    """Profile updates in time order: every user at time 0, then ~3 tier changes each."""
    rng = np.random.default_rng(seed + 1)
    rows = [{"ts": 0.0, "user": f"u{u}", "tier": int(rng.integers(0, 3))} for u in range(users)]
    k = 3 * users
    for t, u in zip(np.sort(rng.uniform(0, span, k)), rng.integers(0, users, k), strict=True):
        rows.append({"ts": round(float(t), 3), "user": f"u{u}", "tier": int(rng.integers(0, 3))})
    path = os.path.join(folder, "profiles.jsonl")
    with open(path, "w") as fh:
        fh.writelines(json.dumps(r) + "\n" for r in rows)
    return path


def read_jsonl(path: str) -> Iterator[dict[str, Any]]:
    with open(path) as fh:
        for line in fh:
            yield json.loads(line)


def to_session(pair: tuple[af.Window, dict[str, Any] | None]) -> dict[str, Any]:
    """A session's features: item ids and dwell times (variable length), its user's tier
    as of its end, and its label."""
    w, profile = pair
    events = w.items
    return {
        "items": np.array([e["item"] for e in events], dtype=np.int64),
        "dwell": np.array([e["dwell"] for e in events], dtype=np.float32),
        "tier": -1 if profile is None else profile["tier"],
        "profile_ts": -1.0 if profile is None else profile["ts"],
        "end": float(w.end),
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
        self.joined = getattr(self, "joined", 0) + (s["tier"] >= 0)
        self.leaks = getattr(self, "leaks", 0) + (s["profile_ts"] > s["end"])
        return s


def build(
    paths: list[str], profiles: str, a: argparse.Namespace, tallies: dict[str, Tally]
) -> af.Pipeline:
    events = (
        af.from_iterable(paths)
        .flat_map(read_jsonl)
        .sort_by(lambda e: e["ts"], max_delay=a.lateness)
        .map(tallies["events"].event)
    )
    sessions = events.sessions("ts", a.gap, by="user", max_items=24)
    # sessions come out as the watermark closes them: by end, but one closed by max_items
    # comes out early, less than a gap ahead of the others
    joined = sessions.asof_join(
        af.from_iterable([profiles]).flat_map(read_jsonl),
        on=lambda x: x.end if isinstance(x, af.Window) else x["ts"],
        by=lambda x: x.key if isinstance(x, af.Window) else x["user"],
        max_delay=a.gap,
    )
    features = joined.map(to_session).map(tallies["sessions"].session)
    balanced = features.rejection_resample(lambda s: s["label"], [0.5, 0.5], seed=a.seed)
    return balanced.map(tallies["kept"].session).bucket_by_length(
        lambda s: len(s["items"]), [4, 12], [64, 64, 32]
    )


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--events", type=int, default=30_000)
    ap.add_argument("--files", type=int, default=4)
    ap.add_argument("--lateness", type=int, default=2_000, help="ms an event may be late")
    ap.add_argument("--gap", type=int, default=5_000, help="ms of inactivity ending a session")
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args(argv)
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="sessionize-") as folder:
        paths = write_events(folder, a.events, a.files, a.lateness, a.seed)
        profiles = write_profiles(folder, 500, 50.0 * a.events, a.seed)
        raw = [e["ts"] for p in paths for e in read_jsonl(p)]
        late_in = sum(x < y for x, y in zip(raw[1:], raw, strict=False))
        tallies = {k: Tally() for k in ("events", "sessions", "kept")}
        shapes = []
        rows = 0
        with build(paths, profiles, a, tallies).iter() as it:
            for batch in it:
                assert batch["items"].shape == batch["dwell"].shape
                shapes.append(list(batch["items"].shape))
                rows += len(batch["label"])
            stats = it.stats()
    ev, ss, kept = tallies["events"], tallies["sessions"], tallies["kept"]
    summary = {
        "events": ev.n,
        "out_of_order_in": late_in,
        "out_of_order_after_sort": ev.inversions,
        "late": sum(s.late for s in stats.stages),
        "sessions": ss.n,
        "sessions_with_profile": getattr(ss, "joined", 0),
        "profile_leaks": getattr(ss, "leaks", 0),
        "positive_share_before": round(ss.positives / max(ss.n, 1), 3),
        "sessions_kept": kept.n,
        "positive_share_after": round(kept.positives / max(kept.n, 1), 3),
        "batches": len(shapes),
        "rows": rows,
        "batch_shapes": shapes[:3],
        "seconds": round(time.perf_counter() - t0, 2),
    }
    print(f"{summary['events']} events ({late_in} out of time order) read from {a.files} files")
    print(
        f"sorted: {ev.inversions} out of order after sort_by(max_delay={a.lateness}),"
        f" {summary['late']} late"
    )
    print(
        f"{ss.n} sessions ({summary['sessions_with_profile']} joined to a profile as of their"
        f" end, {summary['profile_leaks']} with a later one), "
        f"{summary['positive_share_before']:.1%} with a purchase;"
        f" after rejection_resample: {kept.n} sessions,"
        f" {summary['positive_share_after']:.1%} with a purchase"
    )
    print(f"{len(shapes)} padded batches, e.g. items {shapes[:3]}; {summary['seconds']} s")
    for line in str(stats).splitlines():
        if "watermark" in line or "late" in line:
            print(line)
    print(json.dumps(summary))
    return summary


if __name__ == "__main__":
    main()
