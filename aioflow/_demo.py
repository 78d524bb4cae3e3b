"""``python -m aioflow demo``: a realistic pipeline over a dataset it writes itself."""

from __future__ import annotations

import json
import os
import tempfile
import time
from typing import Any

import numpy as np

import aioflow as af

__all__ = ["make_dataset", "run_demo"]


def make_dataset(root: str, items: int, seed: int = 0) -> list[str]:
    """Write ``items`` small images as ``.npy`` files and their labels as JSONL."""
    rng = np.random.default_rng(seed)
    paths = []
    with open(os.path.join(root, "labels.jsonl"), "w") as f:
        for i in range(items):
            p = os.path.join(root, f"img_{i:06d}.npy")
            np.save(p, rng.integers(0, 255, size=(32, 32, 3), dtype=np.uint8))
            f.write(json.dumps({"path": p, "label": int(rng.integers(0, 10))}) + "\n")
            paths.append(p)
    return paths


def _load(rec: dict[str, Any]) -> dict[str, Any]:
    img = np.load(rec["path"]).astype(np.float32) / 255.0
    return {"image": img, "label": rec["label"]}


def run_demo(items: int = 2000, progress: bool = True, plot: str | None = None) -> int:
    """Generate a dataset, run the demo pipeline over it, print the stats table."""
    from tqdm import tqdm

    with tempfile.TemporaryDirectory(prefix="aioflow-demo-") as root:
        print(f"writing {items} images to {root} ...")
        make_dataset(root, items)
        with open(os.path.join(root, "labels.jsonl")) as f:
            records = [json.loads(line) for line in f]
        pipeline = (
            af.from_iterable(records)
            .map(_load, executor="thread", concurrency=4)
            .map(lambda s: {**s, "image": s["image"] - 0.5})
            .batch(64)
            .prefetch(2)
        )
        t0 = time.perf_counter()
        n = 0
        with (
            pipeline.iter() as it,
            tqdm(total=items, unit="img", disable=not progress, desc="demo") as bar,
        ):
            for batch in it:
                n += len(batch["label"])
                bar.update(len(batch["label"]))
            stats = it.stats()
        dt = time.perf_counter() - t0
        print(stats)
        print(f"{n} samples in {dt:.2f} s: {n / dt:,.0f} samples/s")
        if plot and hasattr(stats, "plot"):
            stats.plot(plot)
    return 0
