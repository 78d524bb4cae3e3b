"""Per-item overhead: range(N) -> map(x+1) -> batch(256), aioflow vs plain generators.

Runs every variant in this process, one after another, best of ``--reps``; prints the
rates and aioflow's ratio to the plain-generator chain (the issue's goal: >= 0.5x), and
the cost of the per-stage stats: each aioflow variant again with the meters off
(``AIOFLOW_STATS=0``), as the extra wall time and the extra process CPU time (the CPU
figure is the steadier one on a shared machine; the goal: stats cost < 10%). The stats
include what ``it.stats().trace(path)`` draws (busy spans per stage, counters), so this is
also the cost of leaving the timeline on.

    python bench/overhead.py [--n 1000000] [--reps 3] [--loop asyncio|uvloop]
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
from aioflow._core import run as _runtime


def plain(n: int) -> tuple[int, int]:
    def src():
        yield from range(n)

    def mapped(it):
        for x in it:
            yield x + 1

    def batched(it, size):
        buf = []
        for x in it:
            buf.append(x)
            if len(buf) == size:
                yield np.asarray(buf)
                buf = []
        if buf:
            yield np.asarray(buf)

    count = total = 0
    for b in batched(mapped(src()), 256):
        count += len(b)
        total += int(b.sum())
    return count, total


def pipeline(n: int) -> af.Pipeline:
    return af.range(n).map(lambda x: x + 1).batch(256)


def aioflow_sync(n: int) -> tuple[int, int]:
    count = total = 0
    for b in pipeline(n):
        count += len(b)
        total += int(b.sum())
    return count, total


def aioflow_async(n: int) -> tuple[int, int]:
    async def main() -> tuple[int, int]:
        count = total = 0
        async for b in pipeline(n):
            count += len(b)
            total += int(b.sum())
        return count, total

    return asyncio.run(main())


def best(fn, n: int, reps: int) -> float:
    return best_with_cpu(fn, n, reps)[0]


def best_with_cpu(fn, n: int, reps: int) -> tuple[float, float]:
    """(best rate in items/s of wall time, least process CPU seconds) over ``reps`` runs."""
    want = (n, n * (n + 1) // 2)
    rates, cpus = [], []
    for _ in range(reps):
        c0, t0 = time.process_time(), time.perf_counter()
        got = fn(n)
        dt, cpu = time.perf_counter() - t0, time.process_time() - c0
        assert got == want, (fn.__name__, got, want)
        rates.append(n / dt)
        cpus.append(cpu)
    return max(rates), min(cpus)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--n", type=int, default=1_000_000)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--loop", choices=["asyncio", "uvloop"], default="asyncio")
    a = ap.parse_args()
    if a.loop == "asyncio":
        os.environ["AIOFLOW_LOOP"] = "asyncio"
    else:
        import uvloop

        asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())
    base = best(plain, a.n, a.reps)
    print(f"N={a.n:,} best of {a.reps}, loop={a.loop}")
    print(f"{'plain generators':24s} {base / 1e6:8.2f} M items/s   1.00x")
    for name, fn in (("aioflow for", aioflow_sync), ("aioflow async for", aioflow_async)):
        rates: dict[bool, float] = {}
        cpus: dict[bool, float] = {}
        for metered in (True, False, True, False):  # interleaved: the machine's noise drifts
            _runtime.METER = metered
            rate, cpu = best_with_cpu(fn, a.n, a.reps)
            rates[metered] = max(rates.get(metered, 0.0), rate)
            cpus[metered] = min(cpus.get(metered, float("inf")), cpu)
        _runtime.METER = True
        on, off = rates[True], rates[False]
        print(f"{name:24s} {on / 1e6:8.2f} M items/s   {on / base:.2f}x")
        # CPU time is the steadier figure on a shared machine (other jobs steal wall time)
        print(
            f"{name + ' (no stats)':24s} {off / 1e6:8.2f} M items/s   {off / base:.2f}x"
            f"   stats cost: {off / on - 1:+.1%} wall, {cpus[True] / cpus[False] - 1:+.1%} CPU"
        )


if __name__ == "__main__":
    main()
