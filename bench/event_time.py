"""Event time: events/s and peak RSS of sort_by(max_delay=) -> sessions -> batch, and of
asof_join, at N events (RSS should stay flat in N: the stages hold a time span, not N).

Events ``(t ms, user, value)`` are made on the fly (nothing of size N is held): one every
~10 ms over ``--users`` users, each written up to ``--lateness`` ms late. The join pairs
every event with its user's profile as of its time, from a profile stream of one update
per ~100 events. Each (case, N) runs in a fresh process, so its peak RSS is its own.

    python bench/event_time.py [--sizes 1000000,10000000] [--lateness 2000] [--gap 30000]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from collections.abc import Iterator
from operator import itemgetter

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
import aioflow as af

BLOCK = 8192
t_of, user_of = itemgetter(0), itemgetter(1)


def events(n: int, users: int, lateness: int, seed: int = 0) -> Iterator[tuple[float, int, int]]:
    """``n`` events in arrival order: times ~10 ms apart, each up to ``lateness`` ms late
    (a block of events is shuffled by arrival; blocks overlap less than the lateness)."""
    rng = np.random.default_rng(seed)
    t0 = 0.0
    for start in range(0, n, BLOCK):
        m = min(BLOCK, n - start)
        t = t0 + np.cumsum(rng.exponential(10.0, m))
        t0 = float(t[-1])
        order = np.argsort(t + rng.uniform(0, lateness, m), kind="stable")
        u = rng.zipf(1.5, m) % users
        for i in order.tolist():
            yield (float(t[i]), int(u[i]), i)


def profiles(n: int, users: int) -> Iterator[tuple[float, int, int]]:
    """One profile update per ~100 events, in time order (a user's tier), every 1,000 ms:
    on a regular clock, so that the two streams' times do not drift apart (with random
    gaps the two random walks part by ~sqrt(N) events, all of which the join must hold
    until the right stream catches up: memory that grows with N by the data's making)."""
    rng = np.random.default_rng(1)
    for u in range(users):
        yield (0.0, u, 0)
    for k in range(1, n // 100 + 1):
        yield (k * 1000.0, int(rng.integers(0, users)), int(rng.integers(0, 3)))


def sessions_case(n: int, a: argparse.Namespace) -> af.Pipeline:
    p = af.from_iterable(lambda: events(n, a.users, a.lateness))
    p = p.sort_by(t_of, max_delay=a.lateness).sessions(t_of, a.gap, by=user_of, max_items=256)
    return p.batch(64, collate=list).map(lambda ws: sum(len(w.items) for w in ws))


def asof_case(n: int, a: argparse.Namespace) -> af.Pipeline:
    left = af.from_iterable(lambda: events(n, a.users, 0))  # in time order
    right = af.from_iterable(lambda: profiles(n, a.users))
    p = left.asof_join(right, on=t_of, by=user_of)
    return p.batch(256, collate=list).map(len)


CASES = {"sort -> sessions -> batch": sessions_case, "asof_join": asof_case}


def one(case: str, n: int, a: argparse.Namespace) -> dict[str, float]:
    t0 = time.perf_counter()
    with CASES[case](n, a).iter() as it:
        got = sum(it)
        late = sum(s.late for s in it.stats().stages)
    dt = time.perf_counter() - t0
    assert got == n, (case, got, n)
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB -> MiB (Linux)
    return {"events_per_s": n / dt, "peak_rss_mib": rss, "late": late, "seconds": dt}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="1000000,10000000")
    ap.add_argument("--users", type=int, default=10_000)
    ap.add_argument("--lateness", type=int, default=2_000, help="ms")
    ap.add_argument("--gap", type=int, default=30_000, help="ms")
    ap.add_argument("--one", nargs=2, metavar=("CASE", "N"), help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.one:
        print(json.dumps(one(a.one[0], int(a.one[1]), a)))
        return
    base = [f"--users={a.users}", f"--lateness={a.lateness}", f"--gap={a.gap}"]
    for case in CASES:
        for n in (int(s) for s in a.sizes.split(",")):
            run = subprocess.run(
                [sys.executable, __file__, *base, "--one", case, str(n)],
                capture_output=True, text=True, check=True,
            )  # fmt: skip
            r = json.loads(run.stdout.strip().splitlines()[-1])
            print(
                f"{case:28s} N={n:>11,}  {r['events_per_s'] / 1e6:5.2f}M events/s"
                f"  peak RSS {r['peak_rss_mib']:7.1f} MiB  late {r['late']}"
            )


if __name__ == "__main__":
    main()
