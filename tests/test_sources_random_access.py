"""from_source: random-access sources, the global shuffle, shards."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import aioflow as af
from aioflow.ops.sources_permute import Permutation

FAST = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
PRIMES = [2, 3, 5, 7, 11, 13, 97, 101, 257, 1009, 4099]


@pytest.mark.parametrize("n", [0, 1, *PRIMES, 4, 16, 64, 1024, 4096, 4097])
def test_permutation_is_a_bijection_for_every_length(n):
    for epoch in range(3):
        assert sorted(Permutation(n, (5, epoch)).take(0, n).tolist()) == list(range(n))


@FAST
@given(st.integers(0, 3000), st.integers(0, 2**63 - 1), st.integers(0, 1000))
def test_permutation_of_any_length_and_key_is_a_bijection(n, seed, epoch):
    perm = Permutation(n, (seed, epoch))
    assert sorted(perm.take(0, n).tolist()) == list(range(n))
    if n:
        i = n // 2
        assert perm[i] == perm.take(0, n)[i]  # block-independent


def test_permutation_differs_per_epoch_and_per_seed():
    orders = {
        tuple(Permutation(1000, (seed, epoch)).take(0, 1000))
        for seed in (0, 1)
        for epoch in (0, 1, 2)
    }
    assert len(orders) == 6


def test_shuffled_source_is_a_new_permutation_every_epoch_and_reproducible_by_seed():
    p = af.from_source(list(range(200)), shuffle=True, seed=4)
    e0, e1 = p.to_list(), p.to_list()
    assert sorted(e0) == sorted(e1) == list(range(200))
    assert e0 != e1 and e0 != list(range(200))
    q = af.from_source(list(range(200)), shuffle=True, seed=4)
    assert [q.to_list(), q.to_list()] == [e0, e1]
    assert af.from_source(list(range(200)), shuffle=True, seed=5).to_list() != e0


def test_a_global_shuffle_mixes_a_sorted_dataset_where_a_buffer_does_not():
    labels = [i // 100 for i in range(1000)]  # sorted by class
    first = af.from_source(labels, shuffle=True, seed=0).take(100).to_list()
    assert len(set(first)) >= 8  # a 100-item buffer shuffle would give 1-2 classes


class Records:
    """A user class reading records by index."""

    def __init__(self, n):
        self.n = n
        self.reads = 0

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        self.reads += 1
        return {"id": i, "x": i * i}


def test_a_user_class_numpy_array_and_memmap_are_read_by_index(tmp_path):
    assert [r["id"] for r in af.from_source(Records(5)).to_list()] == [0, 1, 2, 3, 4]
    arr = np.arange(12).reshape(6, 2)
    rows = af.from_source(arr, shuffle=True, seed=1).to_list()
    assert sorted(int(r[0]) for r in rows) == [0, 2, 4, 6, 8, 10]
    mm = np.lib.format.open_memmap(tmp_path / "a.npy", mode="w+", dtype=np.int32, shape=(7,))
    mm[:] = np.arange(7)
    mm.flush()
    ro = np.load(tmp_path / "a.npy", mmap_mode="r")
    assert [int(x) for x in af.from_source(ro).to_list()] == list(range(7))
    assert len(af.from_source(ro, shard=(2, 1))) == 3


def test_shards_are_disjoint_slices_of_one_permutation_covering_it():
    n = 101
    for k in (1, 2, 3, 7):
        parts = [af.from_source(range(n), shuffle=True, shard=(k, i)).to_list() for i in range(k)]
        assert sorted(x for part in parts for x in part) == list(range(n))
        assert max(map(len, parts)) - min(map(len, parts)) <= 1
        assert [len(af.from_source(range(n), shard=(k, i))) for i in range(k)] == list(
            map(len, parts)
        )


def test_shard_env_reads_rank_and_world_size(monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "3")
    monkeypatch.setenv("RANK", "2")
    assert af.from_source(range(7), shard="env").to_list() == [2, 5]


@pytest.mark.parametrize("bad", [dict(shard=(2, 2)), dict(shard="rank"), dict(seed=-1)])
def test_bad_arguments_are_pipeline_errors(bad):
    with pytest.raises(af.PipelineError):
        af.from_source([1, 2], **bad)


def test_an_object_without_getitem_is_refused_with_a_pointer_to_from_iterable():
    with pytest.raises(af.PipelineError, match="from_iterable"):
        af.from_source(x for x in range(3))


def test_a_huge_source_starts_at_once_without_holding_its_indexes():
    class Huge:
        def __len__(self):
            return 10**12

        def __getitem__(self, i):
            return i

    first = af.from_source(Huge(), shuffle=True, seed=0).take(1000).to_list()
    assert len(set(first)) == 1000 and max(first) > 10**9


def test_slow_reads_go_through_map_knobs_and_stay_resumable():
    ds = Records(50)
    p = af.from_source(range(len(ds)), shuffle=True, seed=2).map(
        ds.__getitem__, executor="thread", concurrency=4
    )
    whole = [r["id"] for r in p.to_list()]
    assert sorted(whole) == list(range(50))


def test_an_error_in_getitem_comes_after_the_items_before_it():
    class Broken(Records):
        def __getitem__(self, i):
            if i == 3:
                raise KeyError("record 3")
            return i

    got = []
    with pytest.raises(KeyError):
        for x in af.from_source(Broken(10)):
            got.append(x)
    assert got == [0, 1, 2]


# -- the epoch of a shard: named, never counted from how often someone iterated -----------
def _epoch(p, epoch):
    with p.iter(epoch=epoch) as it:
        return list(it)


def _peek(p):
    with p.iter() as it:  # a throwaway iterator: one look at the first item
        return next(it)


@pytest.mark.parametrize("peek", ["next", "to_list", "sibling"])
def test_a_rank_that_peeks_still_reads_its_exact_share_of_each_named_epoch(peek):
    """Two ranks of one job in one process; rank 0 looks at its pipeline first (one
    ``next()`` on a throwaway iterator, a whole ``to_list()`` to count the items, or a
    sibling pipeline over the same source node). Both then run the epochs they name:
    their shards are disjoint and cover the data, in every epoch."""
    n = 1000
    srcs = [af.from_source(range(n), shuffle=True, shard=(2, r)) for r in range(2)]
    ranks = [s.map(int) for s in srcs]
    if peek == "next":
        _peek(ranks[0])
    elif peek == "to_list":
        assert len(ranks[0].to_list()) == n // 2
    else:
        _peek(srcs[0].batch(4))
    orders = []
    for epoch in (0, 1, 2):
        parts = [_epoch(ranks[r], epoch) for r in range(2)]
        assert not set(parts[0]) & set(parts[1])
        assert sorted(parts[0] + parts[1]) == list(range(n))
        orders.append(parts[0])
    assert orders[0] != orders[1] != orders[2]  # a new permutation each epoch


def test_a_named_epoch_is_the_same_run_whatever_ran_before():
    p = af.from_source(range(50), shuffle=True, seed=3)
    third = af.from_source(range(50), shuffle=True, seed=3)
    for _ in range(2):
        third.to_list()
    assert _epoch(p, 2) == _epoch(p, 2) == third.to_list()  # epoch e: the e-th run's order
    assert _epoch(p, 0) != _epoch(p, 1)


def test_a_sharded_shuffle_run_again_without_an_epoch_is_refused():
    """Its permutation would depend on how many times this process iterated it: a rank
    that peeked would read another permutation than the others (overlap, missed items)."""
    p = af.from_source(range(10), shuffle=True, shard=(2, 0)).map(abs)
    assert len(p.to_list()) == 5  # the first run is epoch 0 on every rank
    with pytest.raises(af.PipelineError, match=r"epoch="):
        p.to_list()
    assert len(_epoch(p, 1)) == 5
    assert len(af.from_source(range(10), shard=(2, 0)).repeat(3).to_list()) == 15
    rep = af.from_source(range(10), shuffle=True, shard=(2, 0)).repeat(2).to_list()
    fresh = af.from_source(range(10), shuffle=True, shard=(2, 0))
    assert rep == _epoch(fresh, 0) + _epoch(fresh, 1)  # one run, its epochs 0 and 1


def test_a_state_carries_its_epoch_and_refuses_another():
    p = af.from_source(range(40), shuffle=True, seed=1, shard=(2, 1))
    whole = _epoch(p, 3)
    with p.iter(epoch=3) as it:
        head = [next(it) for _ in range(7)]
        state = it.state_dict()
    assert state["epoch"] == 3
    q = af.from_source(range(40), shuffle=True, seed=1, shard=(2, 1))
    with q.iter(state=state) as it:
        assert head + list(it) == whole
    with pytest.raises(af.StateMismatch, match="epoch"):
        q.iter(state=state, epoch=2)
    with q.iter(state=state, epoch=3) as it:
        assert head + list(it) == whole


@pytest.mark.parametrize("bad", [-1, 1.5, "0", True])
def test_a_bad_epoch_is_a_pipeline_error(bad):
    with pytest.raises(af.PipelineError, match="epoch"):
        af.range(3).iter(epoch=bad)


def test_a_loader_runs_the_epoch_set_on_it():
    def make():
        return af.StatefulLoader(af.from_source(range(30), shuffle=True, shard=(2, 0)))

    loader = make()
    loader.set_epoch(4)
    it = iter(loader)
    head = [next(it) for _ in range(5)]
    sd = loader.state_dict()
    again = make()
    again.load_state_dict(sd)
    again.set_epoch(4)
    assert head + list(again) == _epoch(af.from_source(range(30), shuffle=True, shard=(2, 0)), 4)
    again.load_state_dict(sd)
    again.set_epoch(5)
    with pytest.raises(af.StateMismatch, match="epoch 4"):
        list(again)
