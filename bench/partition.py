"""partition_by: 8 partitions of an async 5 ms enrichment vs one partition.

Every partition runs ``map(enrich)`` with one call at a time (per-key order kept), where
``enrich`` awaits 5 ms (a lookup in a remote store). Keys are random user ids. One
partition does ~200 items/s; 8 partitions ideally 8x that. Both run in this process,
one after the other; prints items/s and the speed-up (goal: >= 6x).

    python bench/partition.py [--items 3200] [--partitions 8]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
import aioflow as af


async def enrich(event: tuple[int, int]) -> tuple[int, int, int]:
    await asyncio.sleep(0.005)
    user, seq = event
    return user, seq, user * 31 + seq


def rate(n: int, partitions: int) -> float:
    users = np.random.default_rng(0).integers(0, 10_000, n).tolist()
    events = list(zip(users, range(n), strict=True))
    p = af.from_iterable(events).partition_by(lambda e: e[0], partitions, lambda q: q.map(enrich))
    t0 = time.perf_counter()
    out = p.to_list()
    dt = time.perf_counter() - t0
    assert sorted(out) == sorted((u, s, u * 31 + s) for u, s in events)
    return n / dt


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--items", type=int, default=3200)
    ap.add_argument("--partitions", type=int, default=8)
    a = ap.parse_args()
    one = rate(a.items // a.partitions, 1)
    many = rate(a.items, a.partitions)
    print(f"1 partition   {one:7.0f} items/s")
    print(f"{a.partitions} partitions  {many:7.0f} items/s")
    print(f"speed-up {many / one:.2f}x (ideal {a.partitions}x)")


if __name__ == "__main__":
    main()
