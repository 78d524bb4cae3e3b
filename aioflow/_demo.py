"""``python -m aioflow demo``: a realistic input pipeline over a dataset it writes itself.

The dataset is what an image classifier reads: ``images/*.npy`` (HxWx3 uint8) and
``labels.jsonl`` (``{"file": ..., "label": ...}`` per line), in a temporary directory.
The pipeline lists the image files (shuffled, a new order each epoch), reads and decodes
them in worker processes (load, random crop, flip, blur, normalize, HWC -> CHW), batches
them and prefetches batches, the way a training loop consumes them; then it prints the
per-stage stats table and the rate.

Each stage is one line of ``build_pipeline``, so that the operators of the io and
ordering families replace the stand-ins used here one line at a time (see the comments).
"""

from __future__ import annotations

import functools
import json
import os
import tempfile
import time
import zlib
from typing import Any

import numpy as np
from tqdm import tqdm

import aioflow as af

__all__ = ["build_pipeline", "make_dataset", "read_sample", "run_demo", "small_pipeline"]

#: Images are SIZE x SIZE x 3; the network sees CROP x CROP crops.
SIZE = 96
CROP = 80
MEAN = np.array([0.485, 0.456, 0.406], np.float32) * 255
STD = np.array([0.229, 0.224, 0.225], np.float32) * 255


def make_dataset(root: str, items: int, seed: int = 0) -> None:
    """Write ``items`` images as ``root/images/*.npy`` and their labels in ``labels.jsonl``."""
    rng = np.random.default_rng(seed)
    os.makedirs(os.path.join(root, "images"), exist_ok=True)
    # smooth random images (a coarse pattern scaled up), not white noise
    coarse = rng.integers(0, 256, size=(items, SIZE // 8, SIZE // 8, 3), dtype=np.uint8)
    with open(os.path.join(root, "labels.jsonl"), "w") as f:
        for i in range(items):
            name = f"img_{i:06d}.npy"
            img = coarse[i].repeat(8, axis=0).repeat(8, axis=1)
            np.save(os.path.join(root, "images", name), img)
            f.write(json.dumps({"file": name, "label": int(rng.integers(0, 10))}) + "\n")


def read_labels(root: str) -> dict[str, int]:
    """``file name -> label`` from ``labels.jsonl``."""
    with open(os.path.join(root, "labels.jsonl")) as f:
        return {r["file"]: r["label"] for r in map(json.loads, f)}


def read_sample(item: str | tuple[str, np.ndarray], labels: dict[str, int]) -> dict[str, Any]:
    """Read and decode one image: load, random crop and flip, blur, normalize, to CHW.

    ``item`` is the image's path, or a ``(path, array)`` pair already read.

    Example:
        >>> import os, tempfile
        >>> root = tempfile.mkdtemp()
        >>> make_dataset(root, 1)
        >>> path, labels = os.path.join(root, "images", "img_000000.npy"), read_labels(root)
        >>> s = read_sample(path, labels)
        >>> s["image"].shape, s["image"].dtype, 0 <= s["label"] < 10
        ((3, 80, 80), dtype('float32'), True)
        >>> same = read_sample((path, np.load(path)), labels)
        >>> bool((same["image"] == s["image"]).all()), same["label"] == s["label"]
        (True, True)
    """
    path, img = (item, np.load(item)) if isinstance(item, str) else item
    rng = np.random.default_rng(zlib.crc32(path.encode()))  # the same crop every run
    y, x = rng.integers(0, SIZE - CROP + 1, size=2)
    img = img[y : y + CROP, x : x + CROP].astype(np.float32)
    if rng.random() < 0.5:
        img = img[:, ::-1]
    # a 3x3 box blur, the kind of per-pixel work decoding and augmenting costs
    pad = np.pad(img, ((1, 1), (1, 1), (0, 0)), mode="edge")
    img = sum(pad[i : i + CROP, j : j + CROP] for i in range(3) for j in range(3)) / 9.0
    img = (img - MEAN) / STD
    return {
        "image": np.ascontiguousarray(img.transpose(2, 0, 1)),
        "label": labels[os.path.basename(path)],
    }


def build_pipeline(
    root: str, *, batch_size: int = 64, workers: int = 2, seed: int = 0
) -> af.Pipeline[Any]:
    """list files -> interleave reads -> decode in processes -> shuffle -> batch -> prefetch."""
    decode = functools.partial(read_sample, labels=read_labels(root))
    return (
        af.list_files(os.path.join(root, "images", "*.npy"), shuffle=True, seed=seed)
        .interleave(_read_pair, cycle_length=8, concurrency=8)
        .map(decode, executor="process", concurrency=workers)
        .shuffle(4 * batch_size, seed=seed)
        .batch(batch_size)
        .prefetch(4)
    )


def _read_pair(path: str) -> af.Pipeline[tuple[str, np.ndarray]]:
    """One image file read asynchronously, as a ``(path, array)`` pair for the decoder."""
    return af.read_npy(path).map(lambda a: (path, a))


def small_pipeline() -> af.Pipeline[Any]:
    """A small pipeline to try ``python -m aioflow bench aioflow._demo:small_pipeline``."""
    return af.range(10_000).map(lambda x: x * x).batch(100)


def run_demo(
    items: int = 2000,
    workers: int = 2,
    progress: bool = True,
    plot: str | None = None,
    trace: str | None = None,
) -> int:
    """Write a dataset, run the demo pipeline over it once, print the stats table and rate;
    ``plot``/``trace``: also draw the stats (PNG) / write the run's timeline (trace JSON)."""
    with tempfile.TemporaryDirectory(prefix="aioflow-demo-") as root:
        t = time.perf_counter()
        make_dataset(root, items)
        print(
            f"wrote {items:,} images ({SIZE}x{SIZE}x3 .npy) and labels.jsonl to {root}"
            f" in {time.perf_counter() - t:.1f} s"
        )
        pipeline = build_pipeline(root, workers=workers)
        print(f"pipeline: {pipeline!r}")
        n = batches = 0
        t0 = time.perf_counter()
        with (
            pipeline.iter() as it,
            tqdm(total=items, unit="img", disable=not progress, desc="demo") as bar,
        ):
            for batch in it:  # a training step would go here
                n += len(batch["label"])
                batches += 1
                bar.update(len(batch["label"]))
        dt = time.perf_counter() - t0
        stats = it.stats()
        print(stats)
        print(f"{n:,} images in {batches} batches in {dt:.2f} s: {n / dt:,.0f} images/s")
        if plot:
            stats.plot(plot)
            print(f"wrote {plot}")
        if trace:
            stats.trace(trace)
            print(f"wrote {trace} (open it in ui.perfetto.dev or chrome://tracing)")
    return 0
