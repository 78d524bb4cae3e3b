"""The columnar operators against their per-item twins, back to back in one process:
``sort_by("t", max_delay=) -> sessions("t", gap, by="user")`` on N events, as Arrow record
batches (the columnar path) and as dict rows (the per-item path), the same events; the
sessions of both are checked equal (count, rows). Prints events/s of each and the ratio.

The events are made before the clock starts (times ~10 ms apart, each up to
``--lateness`` ms late, Zipf users), so the figures are of the operators alone.

    python bench/columnar_ops.py [--n 1000000] [--batch 65536] [--lateness 2000] [--gap 30000]
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
import aioflow as af


def columns(n: int, users: int, lateness: int, seed: int = 0) -> dict[str, np.ndarray]:
    """``n`` events in arrival order: ``t`` (ms, int64), ``user``, ``v``."""
    rng = np.random.default_rng(seed)
    t = np.cumsum(rng.integers(0, 21, n)).astype(np.int64)
    order = np.argsort(t + rng.integers(0, lateness + 1, n), kind="stable")
    return {"t": t[order], "user": (rng.zipf(1.5, n) % users)[order], "v": np.arange(n)}


def job(p: af.Pipeline, a: argparse.Namespace) -> af.Pipeline:
    return p.sort_by("t", max_delay=a.lateness).sessions("t", a.gap, by="user")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=1_000_000)
    ap.add_argument("--batch", type=int, default=65536)
    ap.add_argument("--users", type=int, default=10_000)
    ap.add_argument("--lateness", type=int, default=2000)
    ap.add_argument("--gap", type=int, default=30_000)
    a = ap.parse_args()
    import pyarrow as pa

    cols = columns(a.n, a.users, a.lateness)
    table = pa.table(cols)
    batches = table.to_batches(max_chunksize=a.batch)
    rows = table.to_pylist()

    t0 = time.perf_counter()
    col = job(af.from_iterable(batches), a).to_list()
    t_col = time.perf_counter() - t0
    t0 = time.perf_counter()
    per = job(af.from_iterable(rows), a).to_list()
    t_item = time.perf_counter() - t0

    assert len(col) == len(per), (len(col), len(per))
    assert [w.items.num_rows for w in col] == [len(w.items) for w in per]
    got = [w.items.to_pylist() for w in col[:100]]
    assert got == [w.items for w in per[: len(got)]]
    print(f"{a.n} events, {len(per)} sessions, batches of {a.batch}")
    print(f"columnar: {a.n / t_col / 1e6:6.2f} M events/s ({t_col:.2f} s)")
    print(f"per-item: {a.n / t_item / 1e6:6.2f} M events/s ({t_item:.2f} s)")
    print(f"ratio: {t_item / t_col:.1f}x")


if __name__ == "__main__":
    main()
