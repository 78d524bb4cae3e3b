"""``cache``: the file cache's second epoch (reading the file) vs its first (upstream + write).

The upstream makes ``--n`` samples ``{"x": float32[32, 32, 3], "y": int}`` with a little
numpy work each (standing in for decoding and augmenting); the first epoch of
``.cache(path)`` runs it and writes the file, the second reads the file back. The memory
cache's second epoch is shown too. Everything runs in this process, in one run; the temp
dir is deleted afterwards.

    python bench/cache.py [--n 20000] [--reps 3]
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from typing import Any

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
import aioflow as af


def make(i: int) -> dict[str, Any]:
    rng = np.random.default_rng(i)
    x = rng.random((32, 32, 3), dtype=np.float32)
    return {"x": np.tanh(x * 2.0 - 1.0).astype(np.float32), "y": i}


def consume(p: af.Pipeline[Any]) -> tuple[int, float]:
    n, total = 0, 0.0
    for s in p:
        n += 1
        total += float(s["x"][0, 0, 0]) + s["y"]
    return n, total


def timed(p: af.Pipeline[Any]) -> tuple[float, tuple[int, float]]:
    t0 = time.perf_counter()
    out = consume(p)
    return time.perf_counter() - t0, out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=20_000)
    ap.add_argument("--reps", type=int, default=3)
    args = ap.parse_args()
    d = tempfile.mkdtemp(prefix="aioflow-bench-cache-")
    try:
        rows = []
        upstream = af.range(args.n).map(make)
        t_up, want = min(timed(upstream) for _ in range(args.reps))
        rows.append(("upstream alone (no cache)", t_up))
        firsts, seconds, size = [], [], 0
        for r in range(args.reps):
            path = os.path.join(d, f"c{r}.cache")
            p = upstream.cache(path)
            t1, out1 = timed(p)
            size = os.path.getsize(path)
            t2, out2 = timed(p)
            assert out1 == want and out2 == want
            firsts.append(t1)
            seconds.append(t2)
        rows.append(("file cache, first epoch (upstream + write)", min(firsts)))
        rows.append(("file cache, second epoch (read the file)", min(seconds)))
        mem = upstream.cache()
        t1, out1 = timed(mem)
        t2, out2 = min(timed(mem) for _ in range(args.reps))
        assert out1 == want and out2 == want
        rows.append(("memory cache, first epoch", t1))
        rows.append(("memory cache, second epoch", t2))
        print(
            f"\n{args.n} samples of float32[32,32,3] + int; cache file {size / 2**20:.0f} MB;"
            f" best of {args.reps}, {os.cpu_count()} cores"
        )
        print(f"{'variant':44} {'items/s':>10} {'MB/s':>8} {'vs first epoch':>15}")
        first = min(firsts)
        for name, t in rows:
            print(f"{name:44} {args.n / t:10,.0f} {size / 2**20 / t:8.0f} {first / t:14.2f}x")
    finally:
        shutil.rmtree(d)


if __name__ == "__main__":
    main()
