"""Train a softmax classifier in JAX from ``for batch in pipeline``, ``collate="jax"``.

The data is generated: 4 Gaussian blobs in 16 dimensions. aioflow reshuffles it every
epoch, normalizes each sample, and stacks batches straight into JAX arrays on
the default device (``batch(n, collate="jax")``), prepared ahead while the jitted step
runs::

    python examples/jax_train.py --epochs 3
"""

from __future__ import annotations

import argparse
import time
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

import aioflow as af

DIM, CLASSES = 16, 4


def blobs(n: int = 4096, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """``n`` samples around one center per class: ``x`` float32[n, DIM], ``y`` int[n]."""
    rng = np.random.default_rng(seed)
    centers = rng.normal(0, 3, size=(CLASSES, DIM)).astype(np.float32)
    y = rng.integers(0, CLASSES, size=n)
    return centers[y] + rng.normal(0, 1.5, size=(n, DIM)).astype(np.float32), y


def make_pipeline(x: np.ndarray, y: np.ndarray, batch_size: int = 64) -> af.Pipeline[Any]:
    return (
        af.range(len(y))
        .shuffle(len(y), seed=0)  # a new order every epoch
        .map(lambda i: {"x": x[i] / 4.0, "y": int(y[i])})
        .batch(batch_size, collate="jax")  # {"x": jax.Array[b, DIM], "y": jax.Array[b]}
        .prefetch(4)
    )


def loss_fn(params: dict[str, jax.Array], x: jax.Array, y: jax.Array) -> jax.Array:
    logits = x @ params["w"] + params["b"]
    return -jnp.mean(jax.nn.log_softmax(logits)[jnp.arange(len(y)), y])


@jax.jit
def step(params: dict[str, jax.Array], x: jax.Array, y: jax.Array, lr: float = 0.5) -> Any:
    loss, grads = jax.value_and_grad(loss_fn)(params, x, y)
    return jax.tree.map(lambda p, g: p - lr * g, params, grads), loss


def main(epochs: int = 3, quiet: bool = False) -> dict[str, Any]:
    """Train for ``epochs`` epochs; returns the mean loss of each epoch and the accuracy."""
    x, y = blobs()
    params = {"w": jnp.zeros((DIM, CLASSES)), "b": jnp.zeros(CLASSES)}
    pipeline = make_pipeline(x, y)
    losses = []
    for epoch in range(epochs):
        t0, total, n = time.perf_counter(), 0.0, 0
        for batch in pipeline:  # each epoch is a new run: reshuffled
            params, loss = step(params, batch["x"], batch["y"])
            total += float(loss) * len(batch["y"])
            n += len(batch["y"])
        losses.append(total / n)
        if not quiet:
            print(f"epoch {epoch}: loss {losses[-1]:.4f} ({time.perf_counter() - t0:.2f} s)")
    pred = np.asarray(jnp.argmax(jnp.asarray(x / 4.0) @ params["w"] + params["b"], axis=1))
    return {"losses": losses, "accuracy": float((pred == y).mean()), "params": params}


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--epochs", type=int, default=3)
    main(ap.parse_args().epochs)
