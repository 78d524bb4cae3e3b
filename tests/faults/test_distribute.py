"""``distribute`` on a real Dask cluster (``LocalCluster(processes=True)``, 2 workers).

Exactly once per epoch for range and file sources, two consumers sharing an epoch, a
worker SIGKILLed mid-epoch, the cluster closed under a running consumer, backpressure.
One cluster serves the module (started, and warmed up, before the fault guard takes its
snapshot); the scenarios that kill workers or the cluster start one of their own.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import cloudpickle
import pytest

import aioflow as af
from aioflow.ops.distributed_tasks import DOWNSTREAM_CHUNKS

distributed = pytest.importorskip("distributed")

pytestmark = pytest.mark.filterwarnings(
    "ignore::DeprecationWarning", "ignore::ResourceWarning", "ignore::UserWarning"
)

# functions of this module reach the workers by value (the workers cannot import tests/)
cloudpickle.register_pickle_by_value(sys.modules[__name__])


def _cluster(n: int = 2) -> Any:
    return distributed.LocalCluster(
        n_workers=n, threads_per_worker=1, processes=True, dashboard_address=":0"
    )


#: The shared cluster runs in a process of its own, so that the sockets its scheduler
#: pools (to workers, which it opens as it needs) are not counted as this process's fds.
SERVE = """
import sys, distributed
if __name__ == "__main__":
    with distributed.LocalCluster(
        n_workers=2, threads_per_worker=1, processes=True, dashboard_address=":0",
        silence_logs=40,
    ) as cluster:
        print(cluster.scheduler_address, flush=True)
        sys.stdin.read()  # until the tests close our stdin
"""


@pytest.fixture(scope="module")
def client() -> Iterator[Any]:
    proc = subprocess.Popen(
        [sys.executable, "-c", SERVE], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        assert proc.stdout is not None and proc.stdin is not None
        address = proc.stdout.readline().strip()
        with distributed.Client(address) as c:
            # warm up: imports on the workers, Dask's threads and pooled connections
            for _ in range(2):
                p = af.range(3000).distribute(c, max_outstanding=64)
                assert sorted(p) == list(range(3000))
            # Dask's process-wide thread that (de)serializes large messages, started now
            offload = getattr(distributed.utils, "_offload_executor", None)
            if offload is not None:
                offload.submit(int).result()
            yield c
    finally:
        if proc.stdin is not None:
            proc.stdin.close()
        proc.wait(60)
        if proc.stdout is not None:
            proc.stdout.close()


def slow(x: int) -> int:
    time.sleep(0.002)
    return x


def test_range_items_arrive_exactly_once(client):
    with af.range(3000).map(lambda x: x * 3).distribute(client).iter() as it:
        out = list(it)
        rows = [s.name for s in it.stats() if s.name.startswith("distribute > worker")]
    assert sorted(out) == [3 * x for x in range(3000)]
    assert rows  # where each worker's time went


def test_from_source_items_arrive_exactly_once_in_each_epochs_permutation(client):
    p = af.from_source(list(range(2000)), shuffle=True, seed=3).map(lambda x: x + 1)
    for _ in range(2):
        out = p.distribute(client).to_list()
        assert sorted(out) == list(range(1, 2001))


def test_list_files_items_arrive_exactly_once_in_every_epoch(client, tmp_path):
    for f in range(12):
        (tmp_path / f"{f:02}.txt").write_text("".join(f"{f}-{k}\n" for k in range(30)))
    p = af.list_files(str(tmp_path / "*.txt"), shuffle=True, seed=4).flat_map(af.read_lines)
    want = sorted(f"{f}-{k}" for f in range(12) for k in range(30))
    d = p.distribute(client, max_outstanding=3)
    assert sorted(d) == want and sorted(d) == want


def test_two_consumers_share_an_epoch_in_disjoint_batches_that_cover_it(client):
    p = af.range(2000).map(slow).batch(16)
    got: list[list[list[int]]] = [[], []]

    def consume(i: int) -> None:
        for b in p.distribute(client, num_consumers=2, consumer_index=i):
            got[i].append(b.tolist())

    threads = [threading.Thread(target=consume, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    mine = [{x for b in g for x in b} for g in got]
    assert mine[0] and mine[1] and mine[0].isdisjoint(mine[1])
    assert sorted(x for g in got for b in g for x in b) == list(range(2000))


def test_two_consumers_name_their_epochs_and_a_second_unnamed_run_is_refused(client):
    """Issue 27 (2): consumer i takes the splits of its run's epoch; counted per process, a
    consumer that peeked would take those of another epoch than the others."""
    ps = [af.range(640).distribute(client, num_consumers=2, consumer_index=i) for i in (0, 1)]
    assert ps[0].to_list()  # the first run: epoch 0 on every consumer
    with pytest.raises(af.PipelineError, match="epoch="):
        ps[0].to_list()
    parts = [list(p.iter(epoch=1)) for p in ps]
    assert not set(parts[0]) & set(parts[1])
    assert sorted(parts[0] + parts[1]) == list(range(640))


def test_consumer_index_and_count_default_from_the_launcher_environment(client, monkeypatch):
    parts = []
    for rank in range(3):
        monkeypatch.setenv("WORLD_SIZE", "3")
        monkeypatch.setenv("RANK", str(rank))
        parts.append(af.range(1000).distribute(client).to_list())
    assert sorted(x for part in parts for x in part) == list(range(1000))
    assert all(parts)


def test_unsplittable_sources_are_refused_naming_them(client):
    with pytest.raises(af.PipelineError, match="from_iterable"):
        af.from_iterable([1, 2]).map(str).distribute(client)
    with pytest.raises(af.PipelineError, match="range, range"):
        af.zip(af.range(3), af.range(3)).distribute(client)
    with pytest.raises(af.PipelineError, match="consumer_index"):
        af.range(3).distribute(client, num_consumers=2, consumer_index=2)


def test_a_function_that_cannot_be_shipped_is_named_with_what_to_do(client):
    # issue 27 (4): was a bare TypeError("cannot pickle '_thread.lock' object")
    lock = threading.Lock()

    def locked(x: int) -> int:
        with lock:
            return x

    with pytest.raises(af.PipelineError) as info:
        af.range(3).map(locked).distribute(client)
    msg = str(info.value)
    assert "map(locked)" in msg and "_thread.lock" in msg and "picklable" in msg
    assert isinstance(info.value.__cause__, TypeError)


def test_user_error_in_a_split_surfaces_as_itself_with_a_note(client):
    def boom(x: int) -> int:
        if x == 77:
            raise KeyError("seventy-seven")
        return x

    with pytest.raises(KeyError) as info:
        af.range(200).map(boom).distribute(client).to_list()
    assert any("distribute" in n for n in info.value.__notes__)


def test_max_outstanding_bounds_the_batches_in_flight_to_a_slow_consumer(client, tmp_path):
    def mark(b: list[int]) -> list[int]:  # on a worker, as each batch is made
        (tmp_path / str(b[0])).touch()
        return b

    # a range's splits are 64 items here: 2 batches of 32 each
    p = af.range(64 * 5_000).batch(32).map(mark).distribute(client, max_outstanding=4)
    with p.iter() as it:
        next(it)
        time.sleep(1.0)  # time for the cluster to run ahead, if it would
        made = len(os.listdir(tmp_path))
        taken = it.stats()["distribute > scheduling and transfer"].items_out
    # made on the cluster and not yet taken by the consumer: at most max_outstanding
    assert made - taken <= 4
    # and what was taken waits in the consumer's channels (a few chunks of one task each)
    assert taken <= 64


@pytest.mark.parametrize("m", [2, 8])
def test_a_stalled_consumer_has_at_most_max_outstanding_elements_made_ahead(client, tmp_path, m):
    """Issue 27 (4b): with batch(1) before distribute, max_outstanding=2 let 640 items be
    made ahead of a stalled consumer. The contract: max_outstanding elements, plus the
    few single-element chunks on their way to the consumer (DOWNSTREAM_CHUNKS)."""
    made_path = tmp_path / "made"

    def count(x: int) -> int:  # on a worker, as the source's item is made
        fd = os.open(made_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND)
        os.write(fd, b"x")
        os.close(fd)
        return x

    p = af.range(64 * 2_000).map(count).batch(1).distribute(client, max_outstanding=m)
    with p.iter() as it:
        got = [next(it)]
        time.sleep(1.5)  # the consumer stalls: time for the cluster to run ahead, if it would
        made = made_path.stat().st_size
        ahead = made - len(got)
        assert ahead <= m + DOWNSTREAM_CHUNKS, (made, ahead)
        got += [next(it) for _ in range(50)]  # and it goes on
    items = [x for b in got for x in b.tolist()]
    assert all(len(b) == 1 for b in got) and len(set(items)) == 51


def test_random_operators_before_distribute_draw_anew_in_each_epoch_and_task(client):
    # a range of 64 * 256 items has splits of 64; 128 elements outstanding with 64 items a
    # split: one split per task. Seeded shuffles before distribute, as tf.data's
    # reshuffle_each_iteration: a new order in each epoch, and tasks don't repeat one
    p = af.range(64 * 256).shuffle(64, seed=3).distribute(client, max_outstanding=128)

    def orders() -> dict[int, tuple[int, ...]]:
        got: dict[int, list[int]] = {}
        with p.iter() as it:
            for x in it:
                got.setdefault(x // 64, []).append(x % 64)
                if sum(len(v) == 64 for v in got.values()) >= 8:
                    break
        return {s: tuple(v) for s, v in got.items() if len(v) == 64}

    e0, e1 = orders(), orders()
    assert len(set(e0.values())) == len(e0)  # each split of an epoch in its own order
    common = e0.keys() & e1.keys()
    assert common and all(e0[s] != e1[s] for s in common)


def test_leaving_epochs_early_closes_their_clients_every_time(client):
    # a run closing cancels its tasks from several sides; the epoch's Dask client must
    # still close (an open one keeps its sockets: the guard counts fds)
    p = af.range(64 * 20_000).distribute(client, max_outstanding=2)
    for _ in range(5):
        with p.iter() as it:
            next(it)


def _worker_pids(client: Any) -> list[int]:
    return sorted(client.run(os.getpid).values())


def test_a_worker_killed_mid_epoch_leaves_the_output_exact(client):
    # (``client``: Dask's process-wide threads are started before the guard's snapshot)
    n = 1500
    with _cluster() as cluster, distributed.Client(cluster) as c:
        victim = _worker_pids(c)[0]
        out = []
        # (max_outstanding=8: splits of 8 items; fewer would mean more, smaller tasks)
        with af.range(n).map(slow).distribute(c, max_outstanding=8).iter(timeout=120) as it:
            for x in it:
                out.append(x)
                if len(out) == 300:
                    os.kill(victim, signal.SIGKILL)
        assert victim not in _worker_pids(c)
    assert sorted(out) == list(range(n))


def test_the_cluster_closed_under_a_running_consumer_raises_a_clear_error(client):
    cluster = _cluster()
    c = distributed.Client(cluster)
    out = []
    p = af.range(10_000).map(slow).distribute(c)
    try:
        with p.iter(timeout=60) as it, pytest.raises(af.StageError, match="lost the Dask"):
            for x in it:
                out.append(x)
                if len(out) == 100:
                    c.close()
                    cluster.close()
    finally:
        c.close()
        cluster.close()
    assert 100 <= len(out) < 10_000
    with pytest.raises(af.StageError, match="client is closed"):
        p.to_list()


def test_a_lost_split_result_is_not_mistaken_for_the_consumers_cancellation(client):
    # the consumer is cancelled from outside: that passes through unchanged
    import asyncio

    async def main() -> None:
        async with af.range(5000).map(slow).distribute(client).aiter() as it:
            async for _ in it:
                raise asyncio.CancelledError

    with pytest.raises(asyncio.CancelledError):
        asyncio.run(main())


def test_paths_are_strings_on_the_workers(client, tmp_path: Path):
    (tmp_path / "a.txt").write_text("x\n")
    p = af.list_files(str(tmp_path / "*.txt")).map(lambda s: (type(s).__name__, s))
    assert p.distribute(client).to_list() == [("str", str(tmp_path / "a.txt"))]
