"""Sessions of click events from Parquet: DuckDB, Polars, plain Python and aioflow side by side.

The job (issue 25): N click events ``(t ms, user)`` in 8 Parquet files, each event up to
1,000 places out of order; put them in event-time order, then cut per-user sessions at a
30 s gap (a gap of 30 s or more starts a new session), one row per session ``(user,
first t, last t, events)``. Systems:

- ``duckdb``: SQL window functions (``lag`` and a running ``sum`` per user), whole data set
  in memory, its own threads (2 here);
- ``polars``: eager ``read_parquet`` -> ``sort`` -> ``diff().over`` / ``cum_sum().over`` ->
  ``group_by``, whole data set in memory;
- ``python``: plain Python by hand: pyarrow batches to lists, a heapq of 1,000 entries
  for the order, a dict of open sessions per user;
- ``aioflow-items``: the per-item path, ``flat_map(read_parquet)`` (row dicts) ->
  ``sort_by(buffer_size=1000)`` -> ``sessions("t", gap, by="user")``;
- ``aioflow-columnar``: ``read_parquet(batches=...)`` record batches -> ``sort_by("t",
  max_delay=D)`` -> ``sessions("t", gap, by="user")`` on the batches (``D``: the largest
  lateness in ms in the data, found when it is written). Where this path does not exist
  yet (a ``TypeError``/``NotImplementedError``/``PipelineError``), it is reported as
  skipped with the error and the others still run.

Each (system, N) runs in a fresh process (``--one``), which reports its events/s (reading
the files included, imports not), its peak RSS (``ru_maxrss``) and its RSS after the
imports, and a digest of its sessions (sha256 of the sorted ``(user, first, last, count)``
rows): the parent checks that every system's sessions are the same. The files are
written once per N under ``--data`` (default: a temp dir, kept for the next run), by a
process of their own: Linux's ``ru_maxrss`` of a child counts the RSS its parent had when
it forked, so the parent stays small (each child also reports ``VmHWM``, its own peak).

    python bench/columnar.py [--sizes 3000000,10000000] [--systems duckdb,polars,...]
"""

from __future__ import annotations

import argparse
import glob
import hashlib
import heapq
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from array import array
from collections.abc import Callable
from operator import itemgetter
from typing import Any

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

FILES = 8
PLACES = 1000  # an event is at most this many places out of order
GAP = 30_000  # ms
USERS = 100_000
MEAN_CLICKS = 20  # per visit
THINK = 2_000  # ms between a visit's clicks, on average

Sessions = tuple[Any, Any, Any, Any]  # users, first ts, last ts, counts (sequences of ints)


# -- the data -------------------------------------------------------------------------------
def write_data(n: int, root: str) -> dict[str, Any]:
    """``n`` events in ``FILES`` Parquet files under ``root`` (once); returns the meta."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    d = os.path.join(root, f"clicks-v4-{n}")
    meta_path = os.path.join(d, "meta.json")
    if os.path.exists(meta_path):
        with open(meta_path) as f:
            meta: dict[str, Any] = json.load(f)
        return meta
    os.makedirs(d, exist_ok=True)
    rng = np.random.default_rng(25)
    # visits: a user (of skewed activity: user u has weight 1 / (u + 1000), so the most
    # active one visits about every 2 minutes) clicks a geometric number of times (mean
    # MEAN_CLICKS), ~THINK ms apart, then leaves; visits start so that there is about one
    # click per ms. What is open at once is bounded (visits of about a minute), whatever N.
    m = n + n // 5 + 300_000  # more clicks than kept: the first and last minutes are sparse
    lens = rng.geometric(1 / MEAN_CLICKS, m // MEAN_CLICKS)
    m = int(lens.sum())
    starts = np.cumsum(rng.exponential(float(MEAN_CLICKS), len(lens)))
    visit = np.repeat(np.arange(len(lens)), lens)
    first = np.cumsum(lens) - lens  # index of each visit's first click
    gaps = rng.exponential(float(THINK), m)
    gaps[first] = 0.0
    total = np.cumsum(gaps)
    t = (starts[visit] + total - total[first][visit]).astype(np.int64)
    w = 1.0 / (np.arange(USERS) + 1000.0)
    user = rng.choice(USERS, len(lens), p=w / w.sum()).astype(np.int64)[visit]
    by_time = np.argsort(t, kind="stable")
    t, user = t[by_time], user[by_time]
    start = int(np.searchsorted(t, 120_000))  # after two minutes: as many visits as later
    t, user = t[start : start + n], user[start : start + n]
    # each event up to PLACES places out of order: sort by position plus a random shift
    late = np.argsort(np.arange(n) + rng.uniform(0, PLACES, n), kind="stable")
    t, user = t[late], user[late]
    lateness = int((np.maximum.accumulate(t) - t).max())
    for i, part in enumerate(np.array_split(np.arange(n), FILES)):
        table = pa.table({"t": t[part], "user": user[part]})
        pq.write_table(table, os.path.join(d, f"part-{i}.parquet"), row_group_size=256_000)
    meta = {"n": n, "max_delay": lateness, "dir": d}
    with open(meta_path, "w") as f:
        json.dump(meta, f)
    return meta


def files_of(meta: dict[str, Any]) -> list[str]:
    return sorted(glob.glob(os.path.join(meta["dir"], "part-*.parquet")))


# -- the systems ------------------------------------------------------------------------------
def run_duckdb(meta: dict[str, Any]) -> Callable[[], Sessions]:
    import duckdb

    con = duckdb.connect()
    con.execute("SET threads = 2")
    q = f"""
    WITH e AS (
        SELECT "user" AS u, t, t - lag(t) OVER (PARTITION BY "user" ORDER BY t) AS d
        FROM read_parquet({files_of(meta)!r})),
    s AS (
        SELECT u, t, sum(CASE WHEN d IS NULL OR d >= {GAP} THEN 1 ELSE 0 END)
            OVER (PARTITION BY u ORDER BY t ROWS UNBOUNDED PRECEDING) AS sid
        FROM e)
    SELECT u, min(t) AS first, max(t) AS last, count(*) AS n FROM s GROUP BY u, sid
    """

    def job() -> Sessions:
        r = con.execute(q).fetchnumpy()
        return r["u"], r["first"], r["last"], r["n"]

    return job


def run_polars(meta: dict[str, Any]) -> Callable[[], Sessions]:
    import polars as pl

    def job() -> Sessions:
        df = pl.read_parquet(files_of(meta)).sort("t", maintain_order=True)
        d = pl.col("t").diff().over("user")
        new = (d.is_null() | (d >= GAP)).cast(pl.Int64)
        df = df.with_columns(sid=new.cum_sum().over("user"))
        out = df.group_by("user", "sid").agg(
            pl.col("t").min().alias("first"), pl.col("t").max().alias("last"), pl.len().alias("n")
        )
        return (out["user"].to_numpy(), out["first"].to_numpy(), out["last"].to_numpy(),
                out["n"].to_numpy())  # fmt: skip

    return job


def run_python(meta: dict[str, Any]) -> Callable[[], Sessions]:
    import pyarrow.parquet as pq

    def job() -> Sessions:
        users, firsts, lasts, counts = array("q"), array("q"), array("q"), array("q")
        open_: dict[int, list[int]] = {}  # user -> [first, last, count]
        heap: list[tuple[int, int, int]] = []
        push, pushpop = heapq.heappush, heapq.heappushpop

        def event(t: int, u: int) -> None:
            s = open_.get(u)
            if s is None:
                open_[u] = [t, t, 1]
            elif t - s[1] >= GAP:
                users.append(u), firsts.append(s[0]), lasts.append(s[1]), counts.append(s[2])
                open_[u] = [t, t, 1]
            else:
                s[1] = t
                s[2] += 1

        seq = 0
        for path in files_of(meta):
            for b in pq.ParquetFile(path).iter_batches(65_536, columns=["t", "user"]):
                for t, u in zip(b.column(0).to_pylist(), b.column(1).to_pylist(), strict=True):
                    seq += 1
                    if len(heap) < PLACES:
                        push(heap, (t, seq, u))
                    else:
                        t0, _, u0 = pushpop(heap, (t, seq, u))
                        event(t0, u0)
        heap.sort()
        for t0, _, u0 in heap:
            event(t0, u0)
        for u, (first, last, c) in open_.items():
            users.append(u), firsts.append(first), lasts.append(last), counts.append(c)
        return users, firsts, lasts, counts

    return job


def _collect(p: Any) -> Sessions:
    """The sessions of a pipeline of ``af.Window``s (``items`` a list or a record batch)."""
    users, firsts, lasts, counts = array("q"), array("q"), array("q"), array("q")
    for w in p:
        items = w.items
        users.append(w.key)
        firsts.append(w.start)
        lasts.append(w.end - GAP)  # a session's end is its last time plus the gap
        counts.append(items.num_rows if hasattr(items, "num_rows") else len(items))
    return users, firsts, lasts, counts


def _aioflow_imports() -> None:
    """What a run imports on first use (pyarrow's reader and kernels, the run's loop), now:
    imports are not timed (DuckDB and Polars import and connect before the job too)."""
    import pyarrow.compute
    import pyarrow.parquet  # noqa: F401

    from aioflow._core.engine import new_event_loop

    new_event_loop().close()  # (imports uvloop where it is installed)


def run_aioflow_items(meta: dict[str, Any]) -> Callable[[], Sessions]:
    import aioflow as af

    _aioflow_imports()

    def job() -> Sessions:
        files = af.from_iterable(files_of(meta))
        p = files.flat_map(lambda f: af.read_parquet(f, columns=["t", "user"]))
        p = p.sort_by(itemgetter("t"), buffer_size=PLACES).sessions("t", GAP, by="user")
        return _collect(p)

    return job


def run_aioflow_columnar(meta: dict[str, Any]) -> Callable[[], Sessions]:
    import aioflow as af

    _aioflow_imports()

    def job() -> Sessions:
        files = af.from_iterable(files_of(meta))
        p = files.flat_map(lambda f: af.read_parquet(f, batches=65_536, columns=["t", "user"]))
        p = p.sort_by("t", max_delay=meta["max_delay"]).sessions("t", GAP, by="user")
        return _collect(p)

    return job


SYSTEMS: dict[str, Callable[[dict[str, Any]], Callable[[], Sessions]]] = {
    "duckdb": run_duckdb,
    "polars": run_polars,
    "python": run_python,
    "aioflow-items": run_aioflow_items,
    "aioflow-columnar": run_aioflow_columnar,
}
#: what a system that does not exist yet raises (the columnar path before issue 25's operators)
MISSING = (NotImplementedError, TypeError)


def digest(s: Sessions) -> tuple[str, int]:
    """sha256 of the sessions sorted as ``(user, first, last, count)`` rows, and how many."""
    cols = [np.asarray(c, dtype=np.int64) for c in s]
    rows = np.stack(cols, axis=1) if len(cols[0]) else np.zeros((0, 4), np.int64)
    rows = rows[np.lexsort(rows.T[::-1])]
    return hashlib.sha256(np.ascontiguousarray(rows).tobytes()).hexdigest()[:16], len(rows)


def status_mib(field: str = "VmRSS") -> float:
    """A size from /proc/self/status (``VmRSS``: now; ``VmHWM``: peak), in MiB."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024
    return float("nan")


def one(system: str, meta: dict[str, Any]) -> dict[str, Any]:
    """Run one system in this (fresh) process: its figures and its sessions' digest."""
    from aioflow.errors import PipelineError

    job = SYSTEMS[system](meta)
    base = status_mib()
    t0 = time.perf_counter()
    try:
        got = job()
    except (*MISSING, PipelineError) as e:
        cause = e.__cause__ if isinstance(e, PipelineError) and e.__cause__ else e
        # (a PipelineError that a key must be a function: no column names yet)
        if (
            isinstance(e, PipelineError)
            and not isinstance(cause, MISSING)
            and "callable" not in str(e)
        ):
            raise
        return {"skipped": f"{type(cause).__name__}: {str(cause)[:160]}"}
    dt = time.perf_counter() - t0
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB -> MiB (Linux)
    d, count = digest(got)
    n = meta["n"]
    return {"events_per_s": n / dt, "seconds": dt, "peak_rss_mib": peak, "base_rss_mib": base,
            "vmhwm_mib": status_mib("VmHWM"), "digest": d, "sessions": count}  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="3000000,10000000")
    ap.add_argument("--systems", default=",".join(SYSTEMS))
    ap.add_argument("--data", default=os.path.join(tempfile.gettempdir(), "aioflow-bench-columnar"))
    ap.add_argument("--one", nargs=2, metavar=("SYSTEM", "N"), help=argparse.SUPPRESS)
    ap.add_argument("--write", type=int, metavar="N", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.write:
        print(json.dumps(write_data(a.write, a.data)))
        return
    if a.one:
        meta = write_data(int(a.one[1]), a.data)
        print(json.dumps(one(a.one[0], meta)))
        return
    systems = a.systems.split(",")
    for s in systems:
        if s not in SYSTEMS:
            ap.error(f"unknown system {s!r} (known: {', '.join(SYSTEMS)})")
    for n in (int(s) for s in a.sizes.split(",")):
        made = subprocess.run(
            [sys.executable, __file__, "--data", a.data, "--write", str(n)],
            capture_output=True, text=True, check=True,
        )  # fmt: skip
        meta = json.loads(made.stdout.strip().splitlines()[-1])
        print(f"N={n:,} events in {FILES} files, max lateness {meta['max_delay']} ms")
        results: dict[str, dict[str, Any]] = {}
        for s in systems:
            run = subprocess.run(
                [sys.executable, __file__, "--data", a.data, "--one", s, str(n)],
                capture_output=True, text=True,
            )  # fmt: skip
            if run.returncode != 0:
                results[s] = {"skipped": f"failed: {run.stderr.strip().splitlines()[-1:]}"}
            else:
                results[s] = json.loads(run.stdout.strip().splitlines()[-1])
            r = results[s]
            if "skipped" in r:
                print(f"  {s:17s} skipped ({r['skipped']})")
                continue
            print(
                f"  {s:17s} {r['events_per_s'] / 1e6:6.3f}M events/s  peak RSS"
                f" {r['peak_rss_mib']:7.1f} MiB (after imports {r['base_rss_mib']:6.1f})"
                f"  {r['sessions']:,} sessions  {r['digest']}"
            )
        ran = {s: r for s, r in results.items() if "skipped" not in r}
        digests = {r["digest"] for r in ran.values()}
        print(f"  sessions identical across {len(ran)} systems: {len(digests) == 1}")
        ref, items = ran.get("duckdb"), ran.get("aioflow-items")
        for s, r in ran.items():
            line = f"  {s:17s}"
            if ref is not None:
                speed = r["events_per_s"] / ref["events_per_s"]
                rss = r["peak_rss_mib"] / ref["peak_rss_mib"]
                line += f" {speed:6.3f}x DuckDB's events/s, {rss:5.2f}x its peak RSS"
            if items is not None:
                ratio = r["events_per_s"] / items["events_per_s"]
                line += f"; {ratio:6.2f}x aioflow-items' events/s"
            print(line)
        if len(digests) > 1:
            sys.exit("the systems' sessions differ")


if __name__ == "__main__":
    main()
