"""The session job of bench/columnar.py, in parallel: the same sessions as the plain run.

The job: click events ``{"t", "user"}`` each up to ``PLACES`` places out of order ->
``sort_by(t, buffer_size=PLACES)`` -> ``sessions("t", GAP, by="user")``. Under
``partition_by(user, 2, job)`` each partition gets a subsequence of the stream (no event
more than ``PLACES`` places late in it either), so its sessions are exact. Under
``distribute`` on a 2-worker Dask cluster the events are written as Parquet files
partitioned by user (each file's rows in arrival order), and each file's job runs where
its split lands (``flat_map`` of the job over the files, before ``distribute``). Each on
the per-item path and on record batches (``col_job``: the columnar twins, a column-name
key), which must give the plain run's sessions too (issue 25).
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from operator import itemgetter
from typing import Any

import cloudpickle
import numpy as np
import pytest

import aioflow as af

PLACES = 40
GAP = 400  # ms
USERS = 30

# functions of this module reach the workers by value (the workers cannot import tests/)
cloudpickle.register_pickle_by_value(sys.modules[__name__])


def events(n: int = 12_000, seed: int = 5) -> list[dict[str, int]]:
    """``n`` events ~10 ms apart (ties too), each up to ``PLACES`` places out of order."""
    rng = np.random.default_rng(seed)
    t = np.cumsum(rng.exponential(10.0, n)).astype(np.int64)
    user = rng.zipf(1.6, n) % USERS
    order = np.argsort(np.arange(n) + rng.uniform(0, PLACES, n), kind="stable")
    return [{"t": int(t[i]), "user": int(user[i])} for i in order]


def job(p: af.Pipeline[Any], t: Any = itemgetter("t")) -> af.Pipeline[Any]:
    """The session job; ``t="t"`` (a column name) runs it on record batches, columnar."""
    return p.sort_by(t, buffer_size=PLACES).sessions("t", GAP, by="user")


def col_job(p: af.Pipeline[Any]) -> af.Pipeline[Any]:
    """``job`` on record batches: the columnar ``sort_by`` and ``sessions``."""
    return job(p, "t")


def sessions(windows: list[Any]) -> list[tuple[Any, ...]]:
    """Sorted ``(user, start, end, count, times)``: equal for equal sessions."""
    return sorted(
        (w.key, w.start, w.end, len(w.items), tuple(sorted(x["t"] for x in w.items)))
        for w in windows
    )


@pytest.fixture(scope="module")
def plain() -> tuple[list[dict[str, int]], list[tuple[Any, ...]]]:
    rows = events()
    got = sessions(job(af.from_iterable(rows)).to_list())
    assert len(got) > 3 * USERS and sum(s[3] for s in got) == len(rows)  # no event dropped
    return rows, got


def test_sessions_under_partition_by_user_on_two_partitions_are_the_plain_run_s(plain, no_leaks):
    rows, want = plain
    p = af.from_iterable(rows).partition_by(itemgetter("user"), 2, job)
    assert sessions(p.to_list()) == want


#: The cluster runs in a process of its own (as in tests/faults/test_distribute.py).
SERVE = """
import sys, distributed
if __name__ == "__main__":
    with distributed.LocalCluster(
        n_workers=2, threads_per_worker=1, processes=True, dashboard_address=":0",
        silence_logs=40,
    ) as cluster:
        print(cluster.scheduler_address, flush=True)
        sys.stdin.read()  # until the test closes our stdin
"""


@pytest.fixture(scope="module")
def client() -> Iterator[Any]:
    distributed = pytest.importorskip("distributed")
    proc = subprocess.Popen(
        [sys.executable, "-c", SERVE], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        assert proc.stdout is not None and proc.stdin is not None
        with distributed.Client(proc.stdout.readline().strip()) as c:
            yield c
    finally:
        if proc.stdin is not None:
            proc.stdin.close()
        proc.wait(60)
        if proc.stdout is not None:
            proc.stdout.close()


@pytest.mark.filterwarnings("ignore::DeprecationWarning", "ignore::ResourceWarning")
def test_sessions_under_distribute_on_two_workers_are_the_plain_run_s(plain, client, tmp_path):
    rows, want = plain
    files = user_files(rows, tmp_path)
    got = on_cluster(files.flat_map(lambda f: job(af.read_parquet(f))), client)
    assert sessions(got) == want


def user_files(rows: list[dict[str, int]], where: Any) -> af.Pipeline[str]:
    """``rows`` written as 4 Parquet files by user (a user's events all in one file, in
    arrival order), listed."""
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    for part in range(4):
        mine = [r for r in rows if r["user"] % 4 == part]
        pq.write_table(pa.Table.from_pylist(mine), where / f"part-{part}.parquet")
    return af.list_files(str(where / "part-*.parquet"))


def on_cluster(p: af.Pipeline[Any], client: Any) -> list[Any]:
    """The items of ``p.distribute(client)``, checking that it ran on the cluster's workers."""
    with p.distribute(client, max_outstanding=4).iter() as it:
        got = list(it)
        workers = {s.name for s in it.stats() if s.name.startswith("distribute > worker")}
    assert workers  # it ran on the cluster
    return got


def col_sessions(windows: list[Any]) -> list[tuple[Any, ...]]:
    """``sessions`` of windows whose items are record batches."""
    out = []
    for w in windows:
        assert not isinstance(w.items, list)  # the columnar path ran: a batch per session
        times = w.items.column("t").to_pylist()
        out.append((w.key, w.start, w.end, len(times), tuple(sorted(times))))
    return sorted(out)


def test_columnar_sessions_under_partition_by_user_are_the_plain_run_s(plain, no_leaks):
    pa = pytest.importorskip("pyarrow")
    rows, want = plain
    batches = [pa.RecordBatch.from_pylist(rows[i : i + 500]) for i in range(0, len(rows), 500)]
    p = af.from_iterable(batches).partition_by("user", 2, col_job)
    assert col_sessions(p.to_list()) == want


@pytest.mark.filterwarnings("ignore::DeprecationWarning", "ignore::ResourceWarning")
def test_columnar_sessions_under_distribute_on_two_workers_are_the_plain_run_s(
    plain, client, tmp_path
):
    rows, want = plain
    files = user_files(rows, tmp_path)
    got = on_cluster(files.flat_map(lambda f: col_job(af.read_parquet(f, batches=300))), client)
    assert col_sessions(got) == want
