"""Buffer shuffle + batch: aioflow vs a plain-Python generator (the team harness's W5).

200,000 float32[128] rows -> shuffle(buffer 10,000, seed) -> batch(128) stacked; both
variants run in this process, best of ``--reps``; prints rows/s and aioflow's ratio.

    python bench/shuffle.py [--n 200000] [--buffer 10000] [--reps 3]
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import time
from itertools import islice

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
import aioflow as af


def plain(arr: np.ndarray, buf_size: int, seed: int) -> int:
    def buffer_shuffle(it, n):  # tf.data-style, as in the harness (random.Random)
        rng = random.Random(seed)
        buf = []
        for x in it:
            if len(buf) < n:
                buf.append(x)
                continue
            i = rng.randrange(n)
            yield buf[i]
            buf[i] = x
        rng.shuffle(buf)
        yield from buf

    it = buffer_shuffle(iter(arr), buf_size)
    total = 0
    while b := list(islice(it, 128)):
        total += len(np.stack(b))
    return total


def aioflow(arr: np.ndarray, buf_size: int, seed: int) -> int:
    total = 0
    for b in af.from_iterable(arr).shuffle(buf_size, seed=seed).batch(128):
        total += len(b)
    return total


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=200_000)
    ap.add_argument("--buffer", type=int, default=10_000)
    ap.add_argument("--reps", type=int, default=3)
    a = ap.parse_args()
    arr = np.random.default_rng(0).random((a.n, 128), dtype=np.float32)
    rates = {}
    for fn in (plain, aioflow):
        best = 0.0
        for _ in range(a.reps):
            t0 = time.perf_counter()
            assert fn(arr, a.buffer, 1) == a.n
            best = max(best, a.n / (time.perf_counter() - t0))
        rates[fn.__name__] = best
        print(f"{fn.__name__:8s} {best / 1e3:8.0f}k rows/s")
    print(f"ratio aioflow / plain: {rates['aioflow'] / rates['plain']:.2f}x")


if __name__ == "__main__":
    main()
