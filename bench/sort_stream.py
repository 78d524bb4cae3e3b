"""Streaming sort_by (buffer_size) vs a heapq-based plain-Python generator.

N (time, payload) events, each up to ``--lateness`` places late, sorted back into time
order through a buffer of ``--lateness`` items. Both variants run in this process, one
after the other, best of ``--reps``; prints events/s and aioflow's ratio to the plain
generator.

    python bench/sort_stream.py [--n 1000000] [--lateness 1000] [--reps 3]
"""

from __future__ import annotations

import argparse
import heapq
import os
import sys
import time
from collections.abc import Iterable, Iterator
from operator import itemgetter
from typing import Any

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
import aioflow as af


def events(n: int, lateness: int) -> list[tuple[float, int]]:
    rng = np.random.default_rng(0)
    order = np.argsort(np.arange(n) + rng.integers(0, lateness + 1, n), kind="stable")
    return [(float(i), int(i)) for i in order]


def heap_sort(it: Iterable[Any], key: Any, size: int) -> Iterator[Any]:
    """The plain-Python streaming sort: a heap of ``size`` (key, seq, item) entries."""
    heap: list[tuple[Any, int, Any]] = []
    push, pushpop = heapq.heappush, heapq.heappushpop
    for seq, x in enumerate(it):
        entry = (key(x), seq, x)
        if len(heap) < size:
            push(heap, entry)
        else:
            yield pushpop(heap, entry)[2]
    heap.sort()
    for e in heap:
        yield e[2]


def plain(items: list[Any], size: int) -> list[Any]:
    return list(heap_sort(items, itemgetter(0), size))


def aioflow(items: list[Any], size: int) -> list[Any]:
    return list(af.from_iterable(items).sort_by(itemgetter(0), buffer_size=size))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=1_000_000)
    ap.add_argument("--lateness", type=int, default=1000)
    ap.add_argument("--reps", type=int, default=3)
    a = ap.parse_args()
    items = events(a.n, a.lateness)
    want = sorted(items)
    rates = {}
    for fn in (plain, aioflow):
        best = 0.0
        for _ in range(a.reps):
            t0 = time.perf_counter()
            out = fn(items, a.lateness)
            best = max(best, a.n / (time.perf_counter() - t0))
            assert out == want, fn.__name__
        rates[fn.__name__] = best
        print(f"{fn.__name__:8s} {best / 1e6:6.2f}M events/s")
    print(f"ratio aioflow / plain heapq: {rates['aioflow'] / rates['plain']:.2f}x")


if __name__ == "__main__":
    main()
