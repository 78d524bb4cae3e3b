"""Feeding a torch training step: aioflow vs ``DataLoader(num_workers=2)``, same run.

The same image-like pipeline in both: ``.npy`` files (uint8, 3x64x64) decoded to float32
in two worker processes, shuffled every epoch, batched by 64 into tensors, and fed to a
small conv net's training step on CPU. Each side runs in a subprocess of its own, in
turns (aioflow, DataLoader, aioflow, ...), while this process samples the RSS of the
child's whole process tree (workers and forkserver included).

Figures per side: samples/s over all epochs (wall time, step included), time to the
first batch (pool start-up included), peak RSS of the tree (sum over its processes,
sampled every 10 ms; pages shared by forked workers count once per process), peak PSS
of the tree (shared pages split between the processes sharing them; sampled every
50 ms), and peak RSS of the main process (``ru_maxrss``).

    python bench/torch_feed.py [--items 4096] [--epochs 2] [--reps 2]

Shuffling: aioflow's side shuffles with ``from_torch_dataset(shuffle=True, seed=0)`` (a
seeded permutation of the indices per epoch, what ``DataLoader(shuffle=True)`` does),
not with a shuffle buffer.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

BATCH = 64
WORKERS = 2
SHAPE = (3, 64, 64)


class NpyImages:
    """A map-style dataset (``__getitem__``/``__len__``) of ``.npy`` images and labels.

    Not a ``torch.utils.data.Dataset`` subclass, so that a worker can unpickle it without
    importing torch; both loaders take any such object.
    """

    def __init__(self, root: str) -> None:
        self.paths = sorted(os.path.join(root, f) for f in os.listdir(root))

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, i: int) -> tuple[np.ndarray, int]:
        img = np.load(self.paths[i]).astype(np.float32) / 255.0
        if i % 2:  # a cheap augmentation, as a real decode step would have
            img = img[:, :, ::-1].copy()
        return img, i % 10


def write_dataset(root: str, items: int) -> None:
    rng = np.random.default_rng(0)
    for i in range(items):
        np.save(os.path.join(root, f"{i:06d}.npy"), rng.integers(0, 255, SHAPE, dtype=np.uint8))


# -- one side, in a child process ---------------------------------------------------------
def child(side: str, root: str, epochs: int) -> dict[str, Any]:
    import torch
    from torch import nn

    import aioflow as af

    torch.set_num_threads(1)  # the two workers and the step share a small machine
    torch.manual_seed(0)
    ds = NpyImages(root)
    model = nn.Sequential(
        nn.Conv2d(3, 8, 3, stride=2),
        nn.ReLU(),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(8, 10),
    )
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    if side == "aioflow":
        loader: Any = (
            af.from_torch_dataset(ds, shuffle=True, seed=0, executor="process", concurrency=WORKERS)
            .batch(BATCH, collate="torch")
            .prefetch(2)
        )
    else:
        g = torch.Generator().manual_seed(0)
        loader = torch.utils.data.DataLoader(
            ds, batch_size=BATCH, shuffle=True, num_workers=WORKERS, generator=g
        )
    n = 0
    first: float | None = None
    t0 = time.perf_counter()
    for _ in range(epochs):
        for x, y in loader:
            if first is None:
                first = time.perf_counter() - t0
            loss = nn.functional.cross_entropy(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            n += len(y)
    dt = time.perf_counter() - t0
    return {
        "samples": n,
        "samples_per_s": n / dt,
        "first_batch_s": first,
        "main_maxrss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    }


# -- the driver ---------------------------------------------------------------------------
def run_side(side: str, root: str, epochs: int) -> dict[str, Any]:
    import psutil

    cmd = [sys.executable, __file__, "--child", side, "--root", root, "--epochs", str(epochs)]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
    ps = psutil.Process(proc.pid)
    peak = peak_pss = 0
    k = 0
    while proc.poll() is None:
        rss = pss = 0
        try:
            for p in [ps, *ps.children(recursive=True)]:
                try:
                    rss += p.memory_info().rss
                    if k % 5 == 0:  # PSS reads smaps: slower, so sampled less often
                        pss += p.memory_full_info().pss
                except psutil.Error:
                    pass
        except psutil.Error:
            pass
        peak = max(peak, rss)
        peak_pss = max(peak_pss, pss)
        k += 1
        time.sleep(0.01)
    out, _ = proc.communicate()
    if proc.returncode != 0:
        raise SystemExit(f"{side} failed with exit code {proc.returncode}")
    res: dict[str, Any] = json.loads(out.strip().splitlines()[-1])
    res["tree_peak_rss_mb"] = peak / 2**20
    res["tree_peak_pss_mb"] = peak_pss / 2**20
    return res


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--items", type=int, default=4096)
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--child", choices=["aioflow", "dataloader"])
    ap.add_argument("--root")
    args = ap.parse_args()
    if args.child:
        print(json.dumps(child(args.child, args.root, args.epochs)))
        return
    with tempfile.TemporaryDirectory(prefix="aioflow-torch-feed-") as root:
        write_dataset(root, args.items)
        print(
            f"{args.items} images {SHAPE} uint8 -> float32, {args.epochs} epochs, batch {BATCH},"
            f" {WORKERS} worker processes, {os.cpu_count()} cores"
        )
        results: dict[str, list[dict[str, Any]]] = {"aioflow": [], "dataloader": []}
        for rep in range(args.reps):
            for side in ("aioflow", "dataloader"):
                r = run_side(side, root, args.epochs)
                results[side].append(r)
                print(
                    f"  rep {rep} {side:10s} {r['samples_per_s']:8,.0f} samples/s"
                    f"  first batch {r['first_batch_s']:.3f} s"
                    f"  tree peak RSS {r['tree_peak_rss_mb']:6.0f} MB"
                    f" (PSS {r['tree_peak_pss_mb']:5.0f} MB)"
                    f"  main RSS {r['main_maxrss_mb']:5.0f} MB"
                )
    med = {
        side: {k: statistics.median(r[k] for r in rs) for k in rs[0] if k != "samples"}
        for side, rs in results.items()
    }
    a, d = med["aioflow"], med["dataloader"]
    print(f"median of {args.reps}:       aioflow   DataLoader   aioflow/DataLoader")
    for key, label in (
        ("samples_per_s", "samples/s"),
        ("first_batch_s", "first batch s"),
        ("tree_peak_rss_mb", "tree peak RSS MB"),
        ("tree_peak_pss_mb", "tree peak PSS MB"),
        ("main_maxrss_mb", "main RSS MB"),
    ):
        print(f"  {label:17s} {a[key]:10,.3f} {d[key]:12,.3f} {a[key] / d[key]:12.2f}x")


if __name__ == "__main__":
    main()
