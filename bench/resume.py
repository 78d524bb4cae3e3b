"""Resuming a checkpoint by seeking, and the cost of a global shuffle (issue 14).

1. ``from_source(10M rows, shuffle=True).map(f).batch(256)``: the state is taken after
   10% and after 90% of the epoch; resuming from it, the time to the first batch.
2. ``read_jsonl`` over a 5M-line file: resuming at line 4.5M, the time to the first item.
3. ``from_source(len 10**9, shuffle=True)``: the first 1,000 items, time and extra RSS.
4. ``from_source(rows, shuffle=True).map(f).batch(256)`` vs a hand-written loop over
   ``np.random.permutation`` doing the same: rows/s of both, in this process.

    python bench/resume.py [--n 10000000] [--lines 5000000] [--reps 3]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time

import numpy as np
import psutil

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
import aioflow as af


def f(x: np.ndarray) -> np.ndarray:
    return x * 2


def state_after(p: af.Pipeline, k: int) -> dict:
    with p.iter() as it:
        for _ in range(k):
            next(it)
        return json.loads(json.dumps(it.state_dict()))


def first_after_resume(p: af.Pipeline, state: dict) -> float:
    t0 = time.perf_counter()
    with p.iter(state=state) as it:
        next(it)
        return time.perf_counter() - t0


def index_resume(n: int) -> None:
    rows = np.arange(n, dtype=np.int64)

    def make() -> af.Pipeline:
        return af.from_source(rows, shuffle=True, seed=0).map(f).batch(256)

    batches = n // 256
    times = {}
    for frac in (0.1, 0.9):
        t0 = time.perf_counter()
        state = state_after(make(), int(batches * frac))
        took = time.perf_counter() - t0
        times[frac] = first_after_resume(make(), state)
        print(
            f"index source {n:,} rows, resume at {frac:.0%}: first batch in {times[frac]:.3f} s"
            f" (reaching that point took {took:.1f} s; state {len(json.dumps(state))} bytes)"
        )
    print(f"  90% vs 10%: {times[0.9] / times[0.1]:.2f}x")


def jsonl_resume(lines: int) -> None:
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "a.jsonl")
        with open(path, "w") as fh:
            chunk = 100_000
            for i in range(0, lines, chunk):
                fh.write(
                    "".join(f'{{"i": {j}, "text": "line {j}"}}\n' for j in range(i, i + chunk))
                )
        at = lines * 9 // 10
        t0 = time.perf_counter()
        state = state_after(af.read_jsonl(path), at)
        took = time.perf_counter() - t0
        t0 = time.perf_counter()
        with af.read_jsonl(path).iter(state=state) as it:
            first = next(it)
            dt = time.perf_counter() - t0
        assert first["i"] == at, first
        print(
            f"read_jsonl {lines:,} lines, resume at line {at:,}: first item in {dt:.3f} s"
            f" (reaching it took {took:.1f} s)"
        )


class Huge:
    def __len__(self) -> int:
        return 10**9

    def __getitem__(self, i: int) -> int:
        return i


def huge_start() -> None:
    af.range(10).to_list()  # the engine's thread and loop exist before measuring
    proc = psutil.Process()
    rss0 = proc.memory_info().rss
    t0 = time.perf_counter()
    first = af.from_source(Huge(), shuffle=True, seed=0).take(1000).to_list()
    dt = time.perf_counter() - t0
    extra = (proc.memory_info().rss - rss0) / 2**20
    assert len(set(first)) == 1000
    print(
        f"from_source(len 10**9, shuffle=True): first 1,000 items in {dt:.3f} s,"
        f" +{extra:.1f} MiB RSS"
    )


def shuffled_throughput(n: int, reps: int) -> None:
    rows = np.random.default_rng(0).random((n, 16), dtype=np.float32)

    def plain(seed: int) -> int:
        perm = np.random.default_rng(seed).permutation(len(rows))
        total = 0
        for i in range(0, len(perm), 256):
            total += len(np.stack([f(rows[j]) for j in perm[i : i + 256]]))
        return total

    def aioflow(seed: int) -> int:
        total = 0
        for b in af.from_source(rows, shuffle=True, seed=seed).map(f).batch(256):
            total += len(b)
        return total

    best = {}
    for _ in range(reps):  # interleaved, so that both see the same machine load
        for fn in (plain, aioflow):
            t0 = time.perf_counter()
            assert fn(1) == n
            best[fn.__name__] = max(best.get(fn.__name__, 0.0), n / (time.perf_counter() - t0))
    for name, rate in best.items():
        print(f"shuffled map+batch, {name:8s} {rate / 1e3:8.0f}k rows/s")
    print(f"  ratio aioflow / np.random.permutation loop: {best['aioflow'] / best['plain']:.2f}x")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=10_000_000)
    ap.add_argument("--lines", type=int, default=5_000_000)
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--reps", type=int, default=3)
    a = ap.parse_args()
    huge_start()
    index_resume(a.n)
    jsonl_resume(a.lines)
    shuffled_throughput(a.rows, a.reps)


if __name__ == "__main__":
    main()
