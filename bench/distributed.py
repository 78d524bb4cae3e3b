"""Dask: a Dask executor's map against a process map, and ``distribute``'s scaling.

All in one run, on ``LocalCluster(processes=True)`` clusters of single-threaded workers
(every timing is of a warm epoch: the workers have imported aioflow already):

1. ``map(fn, executor=client.get_executor(), concurrency=4)`` of ~1 ms Python calls on 2
   workers against ``map(fn, executor="process", concurrency=2)``. Goal: >= 0.7x.
2. ``distribute`` of a sleep-bound (GIL-free) 5 ms per item pipeline on 1, 2, 4, 8
   workers. Goal: N workers >= 0.8 x N x one worker's throughput.
3. A CPU-bound pipeline (~1 ms of Python per item) on 2 workers against 1. Goal: >= 1.7x.
4. The per-batch cost of ``distribute`` against running the same pipeline locally, for
   batches of 64 arrays of 64x64x3 float32 (3 MiB a batch), on 1 worker.

    python bench/distributed.py [--quick]
"""

from __future__ import annotations

import argparse
import functools
import logging
import os
import sys
import time
from typing import Any

import numpy as np

# this file's directory must not stand first on the path: it would shadow Dask's package
_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:] = [os.path.dirname(_HERE)] + [d for d in sys.path if os.path.abspath(d) != _HERE]
import aioflow as af  # noqa: E402
from bench.cpu_parallel import calibrate, cpu_work  # noqa: E402


def cluster(n: int) -> Any:
    import distributed

    return distributed.LocalCluster(
        n_workers=n,
        threads_per_worker=1,
        processes=True,
        dashboard_address=":0",
        silence_logs=logging.ERROR,
    )


def rate(p: af.Pipeline[Any], items: int, reps: int = 1) -> float:
    """Items per second of the best of ``reps`` epochs of ``p`` (``items`` each)."""
    best = float("inf")
    for _ in range(reps):
        t0 = time.perf_counter()
        n = sum(1 for _ in p)
        best = min(best, time.perf_counter() - t0)
        assert n == items, (n, items)
    return items / best


def sleep_5ms(x: int) -> int:
    time.sleep(0.005)
    return x


def image(x: int) -> np.ndarray:
    return np.full((64, 64, 3), x, np.float32)


def executor_vs_process(fn: Any, n: int, rounds: int = 3) -> None:
    import distributed

    with cluster(2) as c, distributed.Client(c) as client:
        ex = client.get_executor()
        dask_p = af.range(n).map(fn, executor=ex, concurrency=4)
        local_p = af.range(n).map(fn, executor="process", concurrency=2)
        rate(dask_p, n)  # warm
        # alternate the two (the machine is shared: load moves), best round of each
        best = [0.0, 0.0]
        for _ in range(rounds):
            best[0] = max(best[0], rate(local_p, n))
            best[1] = max(best[1], rate(dask_p, n))
    local, dask = best
    print(f"1. map of ~1 ms calls, {n} items: executor='process' (2) {local:8.0f}/s")
    print(f"   Dask executor, 2 workers, concurrency=4  {dask:8.0f}/s  = {dask / local:.2f}x")


def scaling(per_worker: int, sizes: tuple[int, ...]) -> None:
    import distributed

    base = None
    print("2. distribute, 5 ms sleep per item:")
    for w in sizes:
        n = per_worker * w
        with cluster(w) as c, distributed.Client(c) as client:
            p = af.range(n).map(sleep_5ms).distribute(client)
            rate(p, n)  # warm
            r = rate(p, n, 2)
        base = base or r
        print(
            f"   {w} worker(s): {r:8.0f}/s = {r / base:5.2f}x one worker's ({r / base / w:.2f} x N)"
        )


def cpu_bound(fn: Any, n: int, rounds: int = 3) -> None:
    import distributed

    rates = []
    for w in (1, 2):
        with cluster(w) as c, distributed.Client(c) as client:
            p = af.range(n).map(fn).distribute(client)
            rate(p, n)
            rates.append(rate(p, n, rounds))
    # what this machine gives two processes right now: a process map against inline
    inline = rate(af.range(n).map(fn), n, rounds)
    procs = rate(af.range(n).map(fn, executor="process", concurrency=2), n, rounds)
    print(f"3. CPU-bound ~1 ms per item, {n} items: 1 worker {rates[0]:.0f}/s,")
    print(f"   2 workers {rates[1]:.0f}/s = {rates[1] / rates[0]:.2f}x")
    print(f"   (the machine now: executor='process' (2) {procs:.0f}/s against inline")
    print(f"   {inline:.0f}/s = {procs / inline:.2f}x)")


def per_batch(batches: int, rounds: int = 3) -> None:
    import distributed

    n = 64 * batches
    p = af.range(n).map(image).batch(64)
    local = remote = float("inf")
    with cluster(1) as c, distributed.Client(c) as client:
        d = p.distribute(client)
        sum(1 for _ in d)  # warm
        for _ in range(rounds):  # alternating, best round of each (load moves)
            t0 = time.perf_counter()
            assert sum(1 for _ in p) == batches
            local = min(local, (time.perf_counter() - t0) / batches)
            t0 = time.perf_counter()
            with d.iter() as it:
                got = sum(1 for _ in it)
                stats = it.stats()
            remote = min(remote, (time.perf_counter() - t0) / got)
    print(f"4. batches of 64 x 64x64x3 float32 (3 MiB), {got} batches, 1 worker:")
    print(f"   local {local * 1e3:.2f} ms/batch, distribute {remote * 1e3:.2f} ms/batch;")
    print(f"   overhead {(remote - local) * 1e3:.2f} ms/batch (the epoch, connecting included)")
    print(stats)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="smaller runs (a smoke test)")
    args = ap.parse_args()
    q = args.quick
    fn = functools.partial(cpu_work, calibrate(0.001))
    executor_vs_process(fn, 500 if q else 3000)
    scaling(100 if q else 400, (1, 2) if q else (1, 2, 4, 8))
    cpu_bound(fn, 300 if q else 2000)
    per_batch(20 if q else 200)


if __name__ == "__main__":
    main()
