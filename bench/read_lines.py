"""Text readers: ``af.read_lines`` vs ``for line in open(...)``; ``af.read_jsonl`` vs json.loads.

Generates a text file of ``--size-mb`` MB (default 1024: the 1 GB of the issue) and a
JSON Lines file of ``--jsonl-mb`` MB in a temp dir (deleted afterwards), reads each once
to warm the page cache, then times every variant in this process, best of ``--reps``,
and prints aioflow's rate beside the plain loop's, measured in the same run.

    python bench/read_lines.py [--size-mb 1024] [--jsonl-mb 200] [--reps 2]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import shutil
import sys
import tempfile
import time
from collections.abc import Callable

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
import aioflow as af


def make_text(path: str, size: int) -> None:
    rng = random.Random(0)
    words = ["alpha", "beta", "gamma", "delta", "epsilon", "zeta", "eta", "theta", "iota"]
    lines = [" ".join(rng.choices(words, k=rng.randint(1, 15))) for _ in range(20_000)]
    block = ("\n".join(lines) + "\n").encode()
    with open(path, "wb") as f:
        written = 0
        while written < size:
            f.write(block)
            written += len(block)


def make_jsonl(path: str, size: int) -> None:
    rng = random.Random(0)
    rows = [
        json.dumps(
            {"id": i, "user": rng.randrange(500), "value": rng.random(), "tags": ["a"] * (i % 4)}
        )
        for i in range(20_000)
    ]
    block = ("\n".join(rows) + "\n").encode()
    with open(path, "wb") as f:
        written = 0
        while written < size:
            f.write(block)
            written += len(block)


def plain_lines(path: str) -> tuple[int, int]:
    n = chars = 0
    with open(path, encoding="utf-8") as f:
        for line in f:
            n += 1
            chars += len(line)
    return n, chars - n  # without the newlines


def aioflow_lines(path: str) -> tuple[int, int]:
    n = chars = 0
    for line in af.read_lines(path):
        n += 1
        chars += len(line)
    return n, chars


def aioflow_lines_async(path: str) -> tuple[int, int]:
    async def main() -> tuple[int, int]:
        n = chars = 0
        async for line in af.read_lines(path):
            n += 1
            chars += len(line)
        return n, chars

    return asyncio.run(main())


def aioflow_lines_batched(path: str) -> tuple[int, int]:
    # the reader's own rate: items consumed a batch (a list) at a time, not one by one
    n = chars = 0
    for b in af.read_lines(path).batch(4096, collate=list):
        n += len(b)
        chars += sum(map(len, b))
    return n, chars


def plain_jsonl(path: str) -> tuple[int, int]:
    n = total = 0
    loads = json.loads
    with open(path, encoding="utf-8") as f:
        for line in f:
            if line.strip():
                obj = loads(line)
                n += 1
                total += obj["user"]
    return n, total


def aioflow_jsonl(path: str) -> tuple[int, int]:
    n = total = 0
    for obj in af.read_jsonl(path):
        n += 1
        total += obj["user"]
    return n, total


def round_robin(
    variants: list[tuple[str, Callable[[str], tuple[int, int]]]], path: str, reps: int
) -> list[tuple[str, float, tuple[int, int]]]:
    """Best time of each variant, the variants taking turns (so load drifts hit all alike)."""
    times: dict[str, list[float]] = {name: [] for name, _ in variants}
    outs: dict[str, tuple[int, int]] = {}
    for _ in range(reps):
        for name, fn in variants:
            t0 = time.perf_counter()
            outs[name] = fn(path)
            times[name].append(time.perf_counter() - t0)
    return [(name, min(times[name]), outs[name]) for name, _ in variants]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--size-mb", type=int, default=1024)
    ap.add_argument("--jsonl-mb", type=int, default=200)
    ap.add_argument("--reps", type=int, default=2)
    args = ap.parse_args()
    d = tempfile.mkdtemp(prefix="aioflow-bench-")
    try:
        text, jsonl = os.path.join(d, "big.txt"), os.path.join(d, "big.jsonl")
        make_text(text, args.size_mb << 20)
        make_jsonl(jsonl, args.jsonl_mb << 20)
        mb_text, mb_jsonl = os.path.getsize(text) / 2**20, os.path.getsize(jsonl) / 2**20
        plain_lines(text)  # warm the page cache
        plain_jsonl(jsonl)
        rows = []
        for what, path, mb, variants in [
            (
                "lines",
                text,
                mb_text,
                [
                    ("plain for line in open()", plain_lines),
                    ("af.read_lines (for)", aioflow_lines),
                    ("af.read_lines (async for)", aioflow_lines_async),
                    ("af.read_lines.batch(4096, list)", aioflow_lines_batched),
                ],
            ),
            (
                "jsonl",
                jsonl,
                mb_jsonl,
                [
                    ("plain json.loads over lines", plain_jsonl),
                    ("af.read_jsonl (for)", aioflow_jsonl),
                ],
            ),
        ]:
            results = round_robin(variants, path, args.reps)
            base, want = results[0][1], results[0][2]
            for name, t, out in results:
                assert out == want, (name, out, want)
                rows.append((what, name, out[0], mb / t, out[0] / t, base / t))
        print(
            f"\nPython {sys.version.split()[0]}, {os.cpu_count()} cores, best of {args.reps};"
            f" text {mb_text:.0f} MB, jsonl {mb_jsonl:.0f} MB (page-cached)"
        )
        print(
            f"{'file':6} {'variant':30} {'items':>12} {'MB/s':>8} {'items/s':>12} {'vs plain':>9}"
        )
        for what, name, n, mbs, ips, ratio in rows:
            print(f"{what:6} {name:30} {n:12,d} {mbs:8.0f} {ips:12,.0f} {ratio:8.2f}x")
    finally:
        shutil.rmtree(d)


if __name__ == "__main__":
    main()
