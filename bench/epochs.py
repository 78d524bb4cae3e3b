"""Epochs of a process map in a torch-importing script: aioflow vs a persistent DataLoader.

A training script imports torch; its data pipeline maps a function over 2,000 items in
two worker processes and batches by 32, for 3 epochs. aioflow's pool stays warm across
the epochs of a pipeline, as ``DataLoader(num_workers=2, persistent_workers=True)``'s
workers do: from epoch 1 on, neither starts processes. Each side runs in a subprocess
of its own (a fresh interpreter that imports torch), in turns.

Figures per side and epoch: time to the first batch and the whole epoch's time; the goal
is epochs >= 1 within 2x of DataLoader's first batch and 1.1x of its epoch time. With
``--fn torch`` the function itself uses torch (a worker that starts from nothing imports
it before its first call: epoch 0's cold start; issue 27's goal is epoch 0's first batch
within 3x of DataLoader's); ``second`` is the first batch of a second pipeline (a new
pool, or a new DataLoader) made in the same program after the epochs (goal: < 100 ms).

    python bench/epochs.py [--items 2000] [--epochs 3] [--reps 3] [--fn numpy|torch|both]
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


def work_torch(x: int) -> Any:
    """The same with torch (imported by the function, as a worker must before its call)."""
    import torch

    return torch.full((3, 16, 16), x % 251, dtype=torch.float32) / 255.0


FNS = {"numpy": work, "torch": work_torch}


class Items:
    """A map-style dataset for the DataLoader side."""

    def __init__(self, n: int, fn: Any = work) -> None:
        self.n = n
        self.fn = fn

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> Any:
        return self.fn(i)


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


def child(side: str, items: int, epochs: int, fn_name: str) -> list[tuple[float, float]]:
    import torch  # noqa: F401 - every training script does

    fn = FNS[fn_name]
    if side == "aioflow":
        import aioflow as af

        def pipeline() -> Any:
            return (
                af.range(items)
                .map(fn, executor="process", concurrency=WORKERS)
                .batch(BATCH, collate="torch")
            )

        with pipeline() as p:
            out = _epochs(lambda: p, epochs)
        with pipeline() as q:  # a second pipeline of the program: a pool of its own
            out += _epochs(lambda: q, 1)
        return out
    from torch.utils.data import DataLoader

    def loader() -> Any:
        return DataLoader(
            Items(items, fn), batch_size=BATCH, num_workers=WORKERS, persistent_workers=True
        )

    first = loader()
    out = _epochs(lambda: first, epochs)
    first = None  # (its workers end, as the first pipeline's pool did)
    second = loader()
    return out + _epochs(lambda: second, 1)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--items", type=int, default=2000)
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--fn", choices=["numpy", "torch", "both"], default="both")
    ap.add_argument("--child", choices=["aioflow", "dataloader"])
    args = ap.parse_args()
    if args.child:
        print(json.dumps(child(args.child, args.items, args.epochs, args.fn)))
        return
    for fn in ["numpy", "torch"] if args.fn == "both" else [args.fn]:
        runs: dict[str, list[list[tuple[float, float]]]] = {"aioflow": [], "dataloader": []}
        for _ in range(args.reps):
            for side in runs:  # (in turns: both sides see the same load)
                cmd = [sys.executable, __file__, "--child", side, "--items", str(args.items)]
                out = subprocess.run(
                    [*cmd, "--epochs", str(args.epochs), "--fn", fn],
                    capture_output=True,
                    text=True,
                    check=True,
                ).stdout
                runs[side].append(json.loads(out))
        print(f"fn={fn}, median of {args.reps}  aioflow   DataLoader   aioflow/DataLoader")
        rows = [(f"epoch {e}", e) for e in range(args.epochs)] + [("second", args.epochs)]
        for name, e in rows:
            for k, label in ((0, "first batch"), (1, "epoch")):
                a = statistics.median(r[e][k] for r in runs["aioflow"])
                d = statistics.median(r[e][k] for r in runs["dataloader"])
                print(f"  {name:8s} {label:11s} {a:9.3f}s {d:10.3f}s {a / d:12.2f}x")


if __name__ == "__main__":
    main()
