"""Decode: 4,000 .npy files of 48 KiB (float32 64x64x3) read, decoded, batched by 64.

Measured in the same run, median of ``--reps``: a plain sequential loop, hand-written
``concurrent.futures`` loops (threads; processes with ``chunksize=64``), and aioflow
pipelines: an inline map, a thread map, a process map, and ``interleave(af.read_npy)``
(one sub-pipeline per file, read ahead concurrently). The goal: aioflow's best >= the
best hand-written ``concurrent.futures`` loop. Files are read once first, so every
variant reads from the page cache (this measures per-file overhead, not the disk).

    python bench/decode.py [--dir DIR] [--n 4000] [--reps 3]
"""

from __future__ import annotations

import argparse
import io
import multiprocessing as mp
import os
import statistics
import sys
import time
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor
from pathlib import Path

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
import aioflow as af

BATCH = 64


def make_files(d: Path, n: int) -> list[str]:
    paths = [d / f"d{i % 8}" / f"f{i:05d}.npy" for i in range(n)]
    if not all(p.exists() for p in paths):
        rng = np.random.default_rng(0)
        for p in paths:
            p.parent.mkdir(parents=True, exist_ok=True)
            np.save(p, rng.random((64, 64, 3), dtype=np.float32))
    return sorted(map(str, paths))


def load(path: str) -> np.ndarray:
    with open(path, "rb") as f:
        return np.load(io.BytesIO(f.read()))


def batches(arrays):
    buf = []
    for a in arrays:
        buf.append(a)
        if len(buf) == BATCH:
            yield np.stack(buf)
            buf = []
    if buf:
        yield np.stack(buf)


def consume(it) -> tuple[int, float]:
    n, s = 0, 0.0
    for b in it:
        n += len(b)
        s += float(b[:, 0, 0, 0].sum())
    return n, s


def sequential(paths):
    return consume(batches(map(load, paths)))


def threads(k):
    def run(paths):
        with ThreadPoolExecutor(k) as ex:
            return consume(batches(ex.map(load, paths)))

    run.__name__ = f"ThreadPoolExecutor({k}).map"
    return run


def processes(paths):
    with ProcessPoolExecutor(2, mp_context=mp.get_context("forkserver")) as ex:
        return consume(batches(ex.map(load, paths, chunksize=BATCH)))


processes.__name__ = "ProcessPoolExecutor(2).map(chunksize=64)"


def af_inline(paths):
    return consume(af.from_iterable(paths).map(load).batch(BATCH))


def af_threads(paths):
    return consume(af.from_iterable(paths).map(load, executor="thread", concurrency=4).batch(BATCH))


def af_process(paths):
    return consume(
        af.from_iterable(paths).map(load, executor="process", concurrency=2).batch(BATCH)
    )


def af_interleave(paths):
    flow = af.from_iterable(paths).interleave(af.read_npy, cycle_length=4, concurrency=4)
    return consume(flow.batch(BATCH))


def af_interleave_16(paths):
    flow = af.from_iterable(paths).interleave(af.read_npy, cycle_length=16, concurrency=16)
    return consume(flow.batch(BATCH))


af_inline.__name__ = "aioflow map(load) inline"
af_threads.__name__ = "aioflow map(load, 'thread', concurrency=4)"
af_process.__name__ = "aioflow map(load, 'process', concurrency=2)"
af_interleave.__name__ = "aioflow interleave(read_npy, cycle 4, conc 4)"
af_interleave_16.__name__ = "aioflow interleave(read_npy, cycle 16, conc 16)"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--dir", default=os.path.join(os.getcwd(), ".bench", "decode"))
    ap.add_argument("--n", type=int, default=4000)
    ap.add_argument("--reps", type=int, default=3)
    args = ap.parse_args()
    paths = make_files(Path(args.dir), args.n)
    expect = sequential(paths)  # also warms the page cache
    hand = [sequential, threads(2), threads(4), processes]
    ours = [af_inline, af_threads, af_process, af_interleave, af_interleave_16]
    rates = {}
    for fn in hand + ours:
        rs = []
        for _ in range(args.reps):
            t0 = time.perf_counter()
            got = fn(paths)
            rs.append(len(paths) / (time.perf_counter() - t0))
            assert got[0] == expect[0] and abs(got[1] - expect[1]) < 1e-3, (fn.__name__, got)
        rates[fn.__name__] = statistics.median(rs)
    best_cf = max(rates[f.__name__] for f in hand[1:])
    print(f"{len(paths)} .npy files of 48 KiB -> batch({BATCH}); {os.cpu_count()} cores")
    print(f"{'variant':<48} {'files/s':>9} {'vs best cf':>10}")
    for fn in hand + ours:
        r = rates[fn.__name__]
        print(f"{fn.__name__:<48} {r:>9,.0f} {r / best_cf:>9.2f}x")
    best_ours = max(rates[f.__name__] for f in ours)
    print(f"aioflow best / best concurrent.futures loop: {best_ours / best_cf:.2f}x")


if __name__ == "__main__":
    main()
