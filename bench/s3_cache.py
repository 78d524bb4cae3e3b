"""The local shard cache on moto's S3 server: epoch 1 (downloads) vs epoch 2 (the cache).

Shards of JSONL are uploaded to a moto server on loopback; one pipeline
``list_files("s3://...", cache_dir=...).interleave(read_bytes)`` runs ``--epochs``
epochs back to back, and the same pipeline without a cache (every epoch reads S3) runs
alongside for comparison. Printed: each epoch's seconds, MiB/s (rows/s with
``--reader jsonl``), the GETs the server answered, and the ratios. The machine may be
loaded: read the ratios (measured in one run, back to back), not the absolute figures.

    python bench/s3_cache.py [--shards 16] [--mib 4] [--epochs 3] [--reader bytes|jsonl]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time

HERE = os.path.dirname(__file__)
sys.path.insert(0, os.path.join(HERE, ".."))
sys.path.insert(0, os.path.join(HERE, "..", "tests"))
import aioflow as af
from _s3_server import BUCKET, FAKE_ENV, S3Server


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--shards", type=int, default=16)
    ap.add_argument("--mib", type=float, default=4.0, help="size of a shard")
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument(
        "--reader",
        choices=("bytes", "jsonl"),
        default="bytes",
        help="bytes: the I/O alone; jsonl: parsed rows (then JSON decoding dominates)",
    )
    args = ap.parse_args()
    read = af.read_bytes if args.reader == "bytes" else af.read_jsonl

    import fsspec.config

    server = S3Server()
    server.start()
    os.environ.update(FAKE_ENV)
    fsspec.config.conf["s3"] = {"endpoint_url": server.url}
    c = server.client()
    c.create_bucket(Bucket=BUCKET)
    row = json.dumps({"i": 0, "text": "x" * 100}) + "\n"
    per_shard = int(args.mib * 2**20) // len(row)
    for s in range(args.shards):
        body = "".join(json.dumps({"i": i, "text": "x" * 100}) + "\n" for i in range(per_shard))
        c.put_object(Bucket=BUCKET, Key=f"train-{s:03d}.jsonl", Body=body.encode())
    pattern = f"s3://{BUCKET}/train-*.jsonl"
    try:
        with tempfile.TemporaryDirectory() as cache:
            cached = af.list_files(pattern, cache_dir=cache).interleave(read, cycle_length=4)
            direct = af.list_files(pattern).interleave(read, cycle_length=4)
            print(f"{args.shards} shards x {args.mib} MiB ({per_shard} rows each), loopback moto")
            times: dict[str, list[float]] = {"cached": [], "direct": []}
            for epoch in range(args.epochs):
                for name, p in (("cached", cached), ("direct", direct)):
                    server.requests.clear()
                    t = time.perf_counter()
                    n = sum(len(x) if args.reader == "bytes" else 1 for x in p)
                    dt = time.perf_counter() - t
                    times[name].append(dt)
                    rate = (
                        f"{n / dt / 2**20:8.1f} MiB/s"
                        if args.reader == "bytes"
                        else (f"{n / dt:8.0f} rows/s")
                    )
                    print(
                        f"epoch {epoch} {name:6s}: {dt:7.2f} s  {rate}"
                        f"  GETs {len(server.gets('train-')):3d}"
                    )
            e1, rest = times["cached"][0], times["cached"][1:]
            if rest:
                print(f"cached: epoch 1 / epoch 2+ = {e1 / (sum(rest) / len(rest)):.2f}x")
                d = sum(times["direct"][1:]) / len(rest)
                print(f"epoch 2+: direct S3 / cached = {d / (sum(rest) / len(rest)):.2f}x")
    finally:
        server.stop()


if __name__ == "__main__":
    main()
