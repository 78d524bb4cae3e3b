"""IO concurrency: 2,000 items of 5 ms waits, concurrency 32; ideal 32 / 0.005 = 6,400/s.

Two cases, each with the hand-written baseline measured in the same run:
- ``await asyncio.sleep(0.005)``: aioflow ``map(fn, concurrency=32)`` (async for, and the
  sync adapter) beside a hand-written ``asyncio`` loop (semaphore + tasks);
- blocking ``time.sleep(0.005)``: aioflow ``map(fn, executor="thread", concurrency=32)``
  beside ``ThreadPoolExecutor(32).map``.
The goal is >= 90% of the ideal. Median of ``--reps`` runs.

    python bench/io_concurrency.py [--n 2000] [--reps 5]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import time
from concurrent.futures import ThreadPoolExecutor

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
import aioflow as af

SLEEP = 0.005
CONC = 32


async def sleep_async(x: int) -> int:
    await asyncio.sleep(SLEEP)
    return x


def sleep_blocking(x: int) -> int:
    time.sleep(SLEEP)
    return x


def hand_asyncio(n: int) -> int:
    async def main() -> int:
        sem = asyncio.Semaphore(CONC)

        async def one(x: int) -> int:
            async with sem:
                return await sleep_async(x)

        total = 0
        for fut in [asyncio.ensure_future(one(x)) for x in range(n)]:
            total += await fut
        return total

    return asyncio.run(main())


def aioflow_async(n: int) -> int:
    async def main() -> int:
        total = 0
        async for x in af.range(n).map(sleep_async, concurrency=CONC):
            total += x
        return total

    return asyncio.run(main())


def aioflow_async_sync_adapter(n: int) -> int:
    return sum(af.range(n).map(sleep_async, concurrency=CONC))


def hand_threads(n: int) -> int:
    with ThreadPoolExecutor(CONC) as ex:
        return sum(ex.map(sleep_blocking, range(n)))


def aioflow_threads(n: int) -> int:
    return sum(af.range(n).map(sleep_blocking, executor="thread", concurrency=CONC))


def rate(fn, n: int, reps: int) -> float:
    rates = []
    for _ in range(reps):
        t0 = time.perf_counter()
        total = fn(n)
        dt = time.perf_counter() - t0
        assert total == n * (n - 1) // 2, (fn.__name__, total)
        rates.append(n / dt)
    return statistics.median(rates)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=2000)
    ap.add_argument("--reps", type=int, default=5)
    args = ap.parse_args()
    ideal = CONC / SLEEP
    print(f"{args.n} items x {SLEEP * 1000:.0f} ms, concurrency {CONC}; ideal {ideal:,.0f}/s")
    print(f"{'variant':<38} {'items/s':>9} {'% ideal':>8} {'vs hand':>8}")
    for case, hand, ours in (
        ("await asyncio.sleep", hand_asyncio, [aioflow_async, aioflow_async_sync_adapter]),
        ("blocking time.sleep", hand_threads, [aioflow_threads]),
    ):
        base = rate(hand, args.n, args.reps)
        print(f"{hand.__name__:<38} {base:>9,.0f} {base / ideal:>7.0%} {'1.00x':>8}  ({case})")
        for fn in ours:
            r = rate(fn, args.n, args.reps)
            print(f"{fn.__name__:<38} {r:>9,.0f} {r / ideal:>7.0%} {r / base:>7.2f}x")


if __name__ == "__main__":
    main()
