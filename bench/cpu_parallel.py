"""CPU parallelism: 2,000 items of ~1 ms pure-Python work on 2 worker processes.

Measured in the same run: the serial in-process rate (the 1.00x line), a hand-written
``ProcessPoolExecutor.map(chunksize=8)`` (forkserver), and aioflow's
``map(fn, executor="process", concurrency=2)``; every timing includes starting the pool,
as a real epoch does. Also the time to the first batch(64) of the process map (aim < 0.5 s,
the fork server already running, as in any epoch but a program's first; the very first
start is printed too). Goal: aioflow >= 1.7x serial. The variants run in rounds and the
ratio to serial is the median of the rounds' (the machine is shared: load moves).

    python bench/cpu_parallel.py [--n 2000] [--reps 3] [--workers 2]
"""

from __future__ import annotations

import argparse
import functools
import multiprocessing as mp
import os
import statistics
import sys
import time
from concurrent.futures import ProcessPoolExecutor

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
import aioflow as af


def cpu_work(k: int, x: int) -> int:
    s = x
    for i in range(k):
        s = (s * 31 + i) & 0xFFFFFFFF
    return s


def calibrate(target: float = 0.001) -> int:
    k = 20_000
    t0 = time.perf_counter()
    for x in range(20):
        cpu_work(k, x)
    per = (time.perf_counter() - t0) / 20
    return max(1, int(k * target / per))


def serial(fn, n: int, workers: int) -> int:
    return sum(fn(x) for x in range(n))


def hand_pool(fn, n: int, workers: int) -> int:
    with ProcessPoolExecutor(workers, mp_context=mp.get_context("forkserver")) as ex:
        return sum(ex.map(fn, range(n), chunksize=8))


def aioflow_process(fn, n: int, workers: int) -> int:
    return sum(af.range(n).map(fn, executor="process", concurrency=workers))


def first_batch(fn, workers: int) -> float:
    """Seconds from describing the pipeline to holding its first batch of 64 results."""
    t0 = time.perf_counter()
    p = af.range(2000).map(fn, executor="process", concurrency=workers).batch(64)
    with p.iter() as it:
        next(it)
        return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=2000)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--workers", type=int, default=2)
    args = ap.parse_args()
    fn = functools.partial(cpu_work, calibrate())
    first = first_batch(fn, args.workers)  # also starts the fork server
    expect = serial(fn, args.n, 1)
    variants = (
        ("serial in-process", serial),
        (f"ProcessPoolExecutor({args.workers}).map(chunksize=8)", hand_pool),
        (f"aioflow map(executor='process', concurrency={args.workers})", aioflow_process),
    )
    # rounds of one run of each variant: the machine is shared, so a ratio is taken
    # within a round (the same load for all three) and the median round is reported
    rates: list[list[float]] = [[] for _ in variants]
    for _ in range(args.reps):
        for i, (_, run) in enumerate(variants):
            t0 = time.perf_counter()
            assert run(fn, args.n, args.workers) == expect
            rates[i].append(args.n / (time.perf_counter() - t0))
    print(f"{args.n} items of ~1 ms pure Python, {args.workers} workers, {os.cpu_count()} cores")
    print(f"{'variant':<52} {'items/s':>9} {'vs serial':>10}  (per round)")
    for (name, _), rs in zip(variants, rates, strict=True):
        ratios = [r / s for r, s in zip(rs, rates[0], strict=True)]
        each = " ".join(f"{x:.2f}" for x in ratios)
        print(
            f"{name:<52} {statistics.median(rs):>9,.0f} {statistics.median(ratios):>9.2f}x"
            f"  ({each})"
        )
    firsts = [first_batch(fn, args.workers) for _ in range(args.reps)]
    print(
        f"time to first batch(64) of the process map: {statistics.median(firsts):.3f} s"
        f" (first ever, fork server start included: {first:.3f} s)"
    )


if __name__ == "__main__":
    main()
