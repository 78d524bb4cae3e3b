"""An async trainer: ``async for batch in pipeline`` while logging and checkpointing run too.

The trainer, a logger task draining an ``asyncio.Queue`` and a checkpointer task that
saves the model every ``--every`` seconds all share one event loop, and so does the
aioflow pipeline feeding the trainer. The training step runs in a thread
(``asyncio.to_thread``; torch releases the GIL in its kernels), so the loop stays free to
prefetch the next batches, print logs and write checkpoints meanwhile. A lock keeps a
checkpoint from being taken in the middle of an optimizer step::

    python examples/async_trainer.py --epochs 3 --every 0.2
"""

from __future__ import annotations

import argparse
import asyncio
import os
import tempfile
import time
from typing import Any

import torch
from torch import nn
from torch_train import CLASSES, DIM, Blobs, make_pipeline

import aioflow as af

__all__ = ["main", "train"]


async def logger(queue: asyncio.Queue[str | None], lines: list[str], quiet: bool) -> None:
    """Print what the trainer and the checkpointer report, until told to stop (None)."""
    while (msg := await queue.get()) is not None:
        lines.append(msg)
        if not quiet:
            print(msg, flush=True)


async def checkpointer(
    model: nn.Module,
    lock: asyncio.Lock,
    queue: asyncio.Queue[str | None],
    directory: str,
    every: float,
    stop: asyncio.Event,
) -> None:
    """Save the model every ``every`` seconds until ``stop`` is set; the write itself
    happens in a thread. Stopping waits for a save under way, which is then logged (a
    cancelled save would go on in its thread, unlogged)."""
    k = 0
    while True:
        try:
            await asyncio.wait_for(stop.wait(), every)
            return
        except TimeoutError:
            pass
        async with lock:  # between two steps: a consistent snapshot
            state = {name: t.detach().clone() for name, t in model.state_dict().items()}
        path = os.path.join(directory, f"ckpt_{k:03d}.pt")
        await asyncio.to_thread(torch.save, state, path)
        await queue.put(f"checkpoint {os.path.basename(path)}")
        k += 1


async def train(
    pipeline: af.Pipeline[Any], epochs: int, directory: str, every: float, quiet: bool
) -> dict[str, Any]:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(DIM, 32), nn.ReLU(), nn.Linear(32, CLASSES))
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    lock = asyncio.Lock()
    queue: asyncio.Queue[str | None] = asyncio.Queue()
    lines: list[str] = []

    def step(batch: dict[str, torch.Tensor]) -> float:
        loss = nn.functional.cross_entropy(model(batch["x"]), batch["y"])
        opt.zero_grad()
        loss.backward()
        opt.step()
        return float(loss.item())

    losses = []
    async with asyncio.TaskGroup() as tg:
        tg.create_task(logger(queue, lines, quiet))
        stop = asyncio.Event()
        saver = tg.create_task(checkpointer(model, lock, queue, directory, every, stop))
        for epoch in range(epochs):
            t0, total, n = time.perf_counter(), 0.0, 0
            async for batch in pipeline:  # runs on this loop, beside the other tasks
                async with lock:
                    loss = await asyncio.to_thread(step, batch)
                total += loss * len(batch["y"])
                n += len(batch["y"])
            losses.append(total / n)
            dt = time.perf_counter() - t0
            await queue.put(f"epoch {epoch}: loss {losses[-1]:.4f} ({n / dt:,.0f} samples/s)")
        stop.set()
        await saver
        torch.save(model.state_dict(), os.path.join(directory, "final.pt"))
        await queue.put("saved final.pt")
        await queue.put(None)
    checkpoints = sorted(f for f in os.listdir(directory) if f.startswith("ckpt_"))
    return {"losses": losses, "log": lines, "checkpoints": checkpoints}


def main(epochs: int = 3, every: float = 0.2, quiet: bool = False) -> dict[str, Any]:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # a tiny model: see torch_train.main
    try:
        with tempfile.TemporaryDirectory(prefix="aioflow-ckpt-") as directory:
            return asyncio.run(train(make_pipeline(Blobs()), epochs, directory, every, quiet))
    finally:
        torch.set_num_threads(threads)


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--every", type=float, default=0.2, help="seconds between checkpoints")
    args = ap.parse_args()
    main(args.epochs, args.every)
