"""Many small files: 4,000 .npy arrays through ``af.read_npy`` vs a thread-pool loop.

Writes ``--files`` float32 64x64x3 arrays (as the shared W4 workload) into a temp dir
(deleted afterwards), reads them all once to warm the page cache, then times each variant
in this process, best of ``--reps``; every variant's float64 sum is checked against the
plain loop's. ``interleave`` is used when the Pipeline has it (issue 3); the
``flat_map(af.read_npy)`` and ``map(np.load, executor="thread")`` variants always run.

    python bench/read_npy.py [--files 4000] [--reps 3] [--concurrency 16]
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
import aioflow as af


def make_files(d: str, n: int) -> str:
    rng = np.random.default_rng(0)
    for i in range(n):
        sub = os.path.join(d, f"d{i % 8}")
        os.makedirs(sub, exist_ok=True)
        np.save(os.path.join(sub, f"{i:05d}.npy"), rng.random((64, 64, 3), dtype=np.float32))
    return os.path.join(d, "*", "*.npy")


def consume(arrays: Iterable[np.ndarray]) -> tuple[int, float]:
    n, total = 0, 0.0
    for a in arrays:
        n += 1
        total += float(a.sum(dtype=np.float64))
    return n, total


def variants(pattern: str, conc: int) -> list[tuple[str, Callable[[], tuple[int, float]]]]:
    files = sorted(__import__("glob").glob(pattern))

    def plain() -> tuple[int, float]:
        return consume(np.load(f) for f in files)

    def pool() -> tuple[int, float]:
        with ThreadPoolExecutor(conc) as ex:
            return consume(ex.map(np.load, files))

    out = [("plain loop: np.load", plain), (f"ThreadPoolExecutor({conc}).map(np.load)", pool)]
    listed = af.list_files(pattern)
    if hasattr(af.Pipeline, "interleave"):
        p = listed.interleave(af.read_npy, cycle_length=conc, concurrency=conc)
        out.append((f"interleave(read_npy, {conc}, concurrency={conc})", lambda: consume(p)))
    seq = listed.flat_map(af.read_npy)
    out.append(("flat_map(af.read_npy)", lambda: consume(seq)))
    threads = listed.map(np.load, executor="thread", concurrency=conc)
    out.append((f"map(np.load, thread, {conc})", lambda: consume(threads)))
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--files", type=int, default=4000)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--concurrency", type=int, default=16)
    args = ap.parse_args()
    d = tempfile.mkdtemp(prefix="aioflow-bench-npy-")
    try:
        pattern = make_files(d, args.files)
        vs = variants(pattern, args.concurrency)
        for _, fn in vs:
            fn()  # warm-up (page cache, imports)
        times: dict[str, list[float]] = {name: [] for name, _ in vs}
        outs: dict[str, tuple[int, float]] = {}
        for _ in range(args.reps):  # the variants take turns, so load drifts hit all alike
            for name, fn in vs:
                t0 = time.perf_counter()
                outs[name] = fn()
                times[name].append(time.perf_counter() - t0)
        want = outs[vs[0][0]]
        base = min(times[vs[0][0]])
        rows = []
        for name, _ in vs:
            out = outs[name]
            assert out[0] == want[0] and abs(out[1] - want[1]) < 1e-6 * abs(want[1]), (name, out)
            t = min(times[name])
            rows.append((name, out[0] / t, base / t))
        print(f"\n{args.files} files of 48 KiB, best of {args.reps}, {os.cpu_count()} cores")
        print(f"{'variant':46} {'files/s':>9} {'vs plain':>9}")
        for name, rate, ratio in rows:
            print(f"{name:46} {rate:9,.0f} {ratio:8.2f}x")
    finally:
        shutil.rmtree(d)


if __name__ == "__main__":
    main()
