"""Train a small classifier on CPU from ``for batch in pipeline`` (a DataLoader port).

The data is generated: 4 Gaussian blobs in 16 dimensions, served by a map-style torch
``Dataset``. aioflow reads it reshuffled every epoch, normalizes each sample, and hands
the training loop batches of tensors, prepared ahead in the background::

    python examples/torch_train.py --epochs 3
"""

from __future__ import annotations

import argparse
import time
from typing import Any

import numpy as np
import torch
from torch import nn

import aioflow as af

DIM, CLASSES = 16, 4


class Blobs(torch.utils.data.Dataset):
    """``n`` samples ``{"x": float32[DIM], "y": int}`` around one center per class."""

    def __init__(self, n: int = 4096, seed: int = 0) -> None:
        rng = np.random.default_rng(seed)
        centers = rng.normal(0, 3, size=(CLASSES, DIM)).astype(np.float32)
        self.y = rng.integers(0, CLASSES, size=n)
        self.x = centers[self.y] + rng.normal(0, 1.5, size=(n, DIM)).astype(np.float32)

    def __len__(self) -> int:
        return len(self.y)

    def __getitem__(self, i: int) -> dict[str, Any]:
        return {"x": self.x[i], "y": int(self.y[i])}


def normalize(sample: dict[str, Any]) -> dict[str, Any]:
    return {"x": sample["x"] / 4.0, "y": sample["y"]}


def make_pipeline(ds: Blobs, batch_size: int = 64) -> af.Pipeline[Any]:
    # DataLoader(ds, batch_size=64, shuffle=True) + a transform, in aioflow
    pipeline = (
        af.from_torch_dataset(ds, shuffle=True, seed=0)
        .map(normalize)
        .batch(batch_size, collate="torch")
        .prefetch(4)
    )
    if torch.cuda.is_available():
        pipeline = pipeline.pin_memory()
    return pipeline


def main(epochs: int = 3, quiet: bool = False) -> dict[str, Any]:
    """Train for ``epochs`` epochs; returns the mean loss of each epoch and the accuracy."""
    # A model this small gains nothing from intra-op threads, and on a small machine their
    # spinning takes the cores the input pipeline's thread needs: one thread here.
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return train(epochs, quiet)
    finally:
        torch.set_num_threads(threads)


def train(epochs: int, quiet: bool) -> dict[str, Any]:
    torch.manual_seed(0)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    model = nn.Sequential(nn.Linear(DIM, 32), nn.ReLU(), nn.Linear(32, CLASSES)).to(device)
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    pipeline = make_pipeline(Blobs())
    losses, accuracy = [], 0.0
    for epoch in range(epochs):
        t0, total, correct, n = time.perf_counter(), 0.0, 0, 0
        for batch in pipeline:  # each epoch is a new run: reshuffled
            x = batch["x"].to(device, non_blocking=True)
            y = batch["y"].to(device, non_blocking=True)
            logits = model(x)
            loss = nn.functional.cross_entropy(logits, y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            total += loss.item() * len(y)
            correct += int((logits.argmax(1) == y).sum())
            n += len(y)
        losses.append(total / n)
        accuracy = correct / n
        if not quiet:
            dt = time.perf_counter() - t0
            print(
                f"epoch {epoch}: loss {losses[-1]:.4f}  accuracy {accuracy:.1%}"
                f"  ({n / dt:,.0f} samples/s)"
            )
    return {"losses": losses, "accuracy": accuracy}


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--epochs", type=int, default=3)
    main(ap.parse_args().epochs)
