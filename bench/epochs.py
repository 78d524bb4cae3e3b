"""Epochs of a process map in a torch-importing script: aioflow vs a persistent DataLoader.

A training script imports torch; its data pipeline maps a function over 2,000 items in
two worker processes and batches by 32, for 3 epochs. aioflow's pool stays warm across
the epochs of a pipeline, as ``DataLoader(num_workers=2, persistent_workers=True)``'s
workers do: from epoch 1 on, neither starts processes. Each side runs in a subprocess
of its own (a fresh interpreter that imports torch), in turns.

Figures per side and epoch: time to the first batch and the whole epoch's time; the goal
is epochs >= 1 within 2x of DataLoader's first batch and 1.1x of its epoch time.

    python bench/epochs.py [--items 2000] [--epochs 3] [--reps 3]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from typing import Any

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

BATCH = 32
WORKERS = 2


def work(x: int) -> Any:
    """A small per-item cost, like decoding a little image."""
    import numpy as np

    return np.full((3, 16, 16), x % 251, dtype=np.float32) / 255.0


class Items:
    """A map-style dataset for the DataLoader side."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> Any:
        return work(i)


def _epochs(batches: Any, epochs: int) -> list[tuple[float, float]]:
    out = []
    for _ in range(epochs):
        t0 = time.perf_counter()
        first = None
        for _b in batches():
            if first is None:
                first = time.perf_counter() - t0
        out.append((first or 0.0, time.perf_counter() - t0))
    return out


def child(side: str, items: int, epochs: int) -> list[tuple[float, float]]:
    import torch  # noqa: F401 - every training script does

    if side == "aioflow":
        import aioflow as af

        with af.range(items).map(work, executor="process", concurrency=WORKERS).batch(
            BATCH, collate="torch"
        ) as p:
            return _epochs(lambda: p, epochs)
    from torch.utils.data import DataLoader

    dl = DataLoader(Items(items), batch_size=BATCH, num_workers=WORKERS, persistent_workers=True)
    return _epochs(lambda: dl, epochs)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--items", type=int, default=2000)
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--child", choices=["aioflow", "dataloader"])
    args = ap.parse_args()
    if args.child:
        print(json.dumps(child(args.child, args.items, args.epochs)))
        return
    runs: dict[str, list[list[tuple[float, float]]]] = {"aioflow": [], "dataloader": []}
    for _ in range(args.reps):
        for side in runs:
            cmd = [sys.executable, __file__, "--child", side, "--items", str(args.items)]
            out = subprocess.run(
                [*cmd, "--epochs", str(args.epochs)], capture_output=True, text=True, check=True
            ).stdout
            runs[side].append(json.loads(out))
    print(f"median of {args.reps}        aioflow   DataLoader   aioflow/DataLoader")
    for e in range(args.epochs):
        for k, label in ((0, "first batch"), (1, "epoch")):
            a = statistics.median(r[e][k] for r in runs["aioflow"])
            d = statistics.median(r[e][k] for r in runs["dataloader"])
            print(f"  epoch {e} {label:11s} {a:9.3f}s {d:10.3f}s {a / d:12.2f}x")


if __name__ == "__main__":
    main()
