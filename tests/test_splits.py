"""How ``distribute`` cuts sources into splits, and runs the part before it over some
(no cluster here: ``run_split`` is what a Dask worker calls)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import aioflow as af
from aioflow._state.splits import IndexSplits, range_split_size
from aioflow.ops.distributed import _leaf, job_of, run_split
from aioflow.ops.distributed_tasks import TASK_SECONDS
from aioflow.ops.distributed_tasks import Sizer as _Sizer


def splits_of(p: af.Pipeline) -> object:
    return p._node.hints.splits


@pytest.mark.parametrize("n", [0, 1, 63, 64, 1000, 100_000])
def test_range_splits_cover_the_range_in_order(n):
    s = splits_of(af.range(3, 3 + 2 * n, 2))
    parts = [s.split(0, i).to_list() for i in range(s.count(0))]
    assert [x for part in parts for x in part] == list(range(3, 3 + 2 * n, 2))
    assert all(0 < len(part) <= 64 for part in parts)


def test_range_split_sizes_are_powers_of_two_up_to_64():
    assert [range_split_size(n) for n in (1, 256, 257, 2000, 10**9)] == [1, 1, 2, 8, 64]


def test_file_splits_are_one_file_each_in_each_epochs_shuffled_order(tmp_path):
    for k in range(6):
        (tmp_path / f"{k}.txt").touch()
    s = splits_of(af.list_files(str(tmp_path / "*.txt"), shuffle=True, seed=1))
    epochs = [[s.split(e, i).to_list() for i in range(s.count(e))] for e in range(2)]
    for files in epochs:
        assert all(len(f) == 1 for f in files)
        assert sorted(f[0] for f in files) == sorted(str(tmp_path / f"{k}.txt") for k in range(6))
    assert epochs[0] != epochs[1]  # reshuffled per epoch, the same in every process


def test_index_splits_give_a_random_access_source_its_index_ranges():
    data = list("abcdefghij")
    s = IndexSplits(len(data), lambda epoch, a, b: af.from_iterable(data[a:b]))
    assert [x for i in range(s.count(0)) for x in s.split(0, i).to_list()] == data


def test_a_task_runs_the_part_before_distribute_over_its_splits_as_one_source():
    p = af.range(1000).map(lambda x: x + 1).batch(4, collate=list)
    leaf = _leaf(p)
    items, seconds, where = run_split(job_of(p, leaf), [leaf.hints.splits.split(0, i) for i in (1, 2)])
    size = range_split_size(1000)
    assert items == [list(range(k, k + 4)) for k in range(size + 1, 3 * size + 1, 4)]
    assert seconds >= 0 and where.startswith("pid ")


def test_a_tasks_job_leaves_the_file_list_out(tmp_path):
    for k in range(300):
        (tmp_path / f"file-with-a-long-name-{k:04}.txt").touch()
    p = af.list_files(str(tmp_path / "*.txt")).map(len)
    assert len(job_of(p, _leaf(p))) < 5_000  # the 300 paths alone are ~20 kB


@pytest.mark.parametrize("shuffle", [False, True])
@pytest.mark.parametrize("shard", [None, (3, 1)])
def test_from_source_splits_give_each_epochs_order_of_its_shard(shuffle, shard):
    p = af.from_source(list(range(1000)), shuffle=shuffle, seed=7, shard=shard)
    s = splits_of(p)
    epochs = []
    for epoch in range(2):  # the run's own epochs 0 and 1, against the splits of each
        parts = [s.split(epoch, i).to_list() for i in range(s.count(epoch))]
        epochs.append([x for part in parts for x in part])
        assert epochs[-1] == list(p.iter(epoch=epoch))
    assert (epochs[0] != epochs[1]) == shuffle


def test_tasks_shrink_toward_the_end_of_an_epoch_so_workers_finish_together():
    """Guided self-scheduling: ~TASK_SECONDS of splits while plenty are left, then at most
    a window-th of what is left, so no worker idles through another's whole last task."""
    sizer = _Sizer(window=4)
    assert sizer.size(256, 0) == 1  # nothing measured yet
    sizer.done(1, 8, TASK_SECONDS / 25)  # 25 splits make a task's worth
    sizes, left = [], 256
    while left:
        sizes.append(sizer.size(left, 0))
        left -= sizes[-1]
    assert sizes[0] == 25
    assert sum(sizes) == 256 and all(s >= 1 for s in sizes)
    assert sizes == sorted(sizes, reverse=True)  # never growing again
    assert sizes[-4:] == [1, 1, 1, 1]


def test_a_budget_of_elements_bounds_the_splits_in_flight():
    sizer = _Sizer(window=4, budget=16)
    assert sizer.size(100, 0) == 1  # one split until one is read
    assert sizer.size(99, 1) == 0
    sizer.done(1, 2, 0.001)  # 2 elements a split
    # 16 elements: 8 splits in flight, spread over the 4 tasks of the window
    sizes, running = [], 0
    while (k := sizer.size(100, running)) > 0:
        sizes.append(k)
        running += k
    assert sizes == [2, 2, 2, 2] and running * 2 == 16
    sizer.done(1, 40, 0.001)  # a split larger than the whole budget: one at a time
    assert sizer.size(100, 0) == 1 and sizer.size(100, 1) == 0


@settings(max_examples=300, deadline=None)
@given(
    total=st.integers(0, 400),
    window=st.integers(1, 8),
    budget=st.none() | st.integers(1, 300),
    per_split=st.lists(st.integers(0, 80), min_size=1, max_size=4),
    seconds=st.floats(1e-5, 0.5),
    order=st.randoms(use_true_random=False),
)
def test_a_sizers_tasks_cover_the_epoch_within_the_window_and_budget(
    total, window, budget, per_split, seconds, order
):
    """Simulated epochs: every split goes out once, the consumer never stalls with splits
    left and nothing running, at most ``window`` tasks are out, and with a budget the
    elements out stay within it (but for one lone task, the least that can go)."""
    sizer = _Sizer(window, budget)
    left, out = total, []  # tasks out: their split counts
    while left or out:
        while len(out) < window and (k := sizer.size(left, sum(out))) > 0:
            assert k <= left
            out.append(k)
            left -= k
            if budget is not None and sizer.most is not None and len(out) > 1:
                assert sum(out) * max(sizer.most, 1) <= budget
        assert out, "nothing running while splits are left"
        k = out.pop(order.randrange(len(out)))  # a task finishes (any of them)
        sizer.done(k, k * order.choice(per_split), k * seconds / 10)
