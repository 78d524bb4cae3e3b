"""AUTOTUNE vs the best hand-picked concurrency, on the IO and CPU workloads of bench/.

For each workload, in one run: a sweep of fixed concurrencies (the hand-picking a user
would do), then ``concurrency=af.AUTOTUNE``; prints each rate and AUTOTUNE's ratio to the
best fixed one. Rates are whole-run items/s (AUTOTUNE's ramp-up included), best of --reps.

    python bench/autotune.py [--n 20000] [--reps 2]
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
import aioflow as af
from aioflow._core.autotune import cpu_budget
from bench.cpu_parallel import calibrate, cpu_work


async def io_async(x: int) -> int:
    await asyncio.sleep(0.005)
    return x


def io_thread(x: int) -> int:
    time.sleep(0.005)
    return x


def rate(make, n: int, reps: int) -> tuple[float, int | None]:
    best, chosen = 0.0, None
    for _ in range(reps):
        t0 = time.perf_counter()
        with make().iter() as it:
            count = sum(1 for _ in it)
            st = it.stats()
        dt = time.perf_counter() - t0
        assert count == n
        if n / dt > best:
            best = n / dt
            chosen = next((s.concurrency for s in st if s.name.startswith("map(")), None)
    return best, chosen


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--n", type=int, default=20_000)
    ap.add_argument("--reps", type=int, default=2)
    a = ap.parse_args()
    cpu = functools.partial(cpu_work, calibrate())
    workloads = {
        "IO async sleep 5 ms": (io_async, None, [8, 32, 64, 128, 256]),
        "IO thread sleep 5 ms": (io_thread, "thread", [4, 16, 32, 64]),
        "CPU ~1 ms, processes": (cpu, "process", [1, 2, 4]),
    }
    print(f"N={a.n:,} best of {a.reps}; cores={cpu_budget()}")
    for name, (fn, ex, sweep) in workloads.items():
        n = {None: a.n, "thread": a.n // 2, "process": 2000}[ex]
        fixed = {}
        for c in sweep:
            fixed[c], _ = rate(
                lambda c=c: af.range(n).map(fn, executor=ex, concurrency=c), n, a.reps
            )
        auto, chosen = rate(
            lambda: af.range(n).map(fn, executor=ex, concurrency=af.AUTOTUNE), n, a.reps
        )
        best_c = max(fixed, key=lambda c: fixed[c])
        cells = "  ".join(f"c={c}: {r:,.0f}/s" for c, r in fixed.items())
        print(f"\n{name}\n  fixed   {cells}")
        print(
            f"  AUTOTUNE {auto:,.0f}/s (settled at {chosen})  ->  {auto / fixed[best_c]:.2f}x"
            f" the best fixed (c={best_c})"
        )


if __name__ == "__main__":
    main()
