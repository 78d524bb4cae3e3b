"""shuffle, sort_by (streaming and external), group_by."""

from __future__ import annotations

import asyncio
import os
import pickle
import tempfile

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import aioflow as af
from aioflow.ops import ordering_spill as _spill
from tests.conftest import assert_no_pending_tasks
from tests.test_transforms import Boom, fail_at

FEW = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])


# -- shuffle -------------------------------------------------------------------------------
def reference_shuffle(items, n, seed, epoch=0):
    """tf.data's buffer shuffle with the draws the operator makes (one double per item)."""
    rng = np.random.default_rng(np.random.SeedSequence([seed, epoch]))
    buf, rest = list(items[:n]), items[n:]
    out = []
    for i, x in zip((rng.random(len(rest)) * n).astype(int), rest, strict=True):
        out.append(buf[i])
        buf[i] = x
    return out + [buf[j] for j in rng.permutation(len(buf))]


def test_shuffle_follows_the_buffer_algorithm_exactly_whatever_the_chunks():
    items = list(range(1000))
    want = reference_shuffle(items, 64, 5)
    assert af.range(1000).shuffle(64, seed=5).to_list() == want
    # a source that delivers one item at a time cuts different chunks: same order
    slow = af.from_iterable(items).map(lambda x: x, concurrency=2)
    assert slow.shuffle(64, seed=5).to_list() == want


def test_shuffle_gives_a_new_order_every_epoch_derived_from_the_seed():
    p = af.range(100).shuffle(10, seed=3)
    first, second = p.to_list(), p.to_list()
    assert first != second and sorted(first) == sorted(second) == list(range(100))
    again = af.range(100).shuffle(10, seed=3)  # a new pipeline starts again from epoch 0
    assert again.to_list() == first
    two = af.range(100).shuffle(10, seed=3).repeat(2).to_list()
    assert two[:100] == first and two[100:] == second


def test_shuffle_without_reshuffle_repeats_the_same_order():
    p = af.range(100).shuffle(10, seed=3, reshuffle_each_iteration=False)
    assert p.to_list() == p.to_list() == reference_shuffle(list(range(100)), 10, 3)
    assert p.repeat(2).to_list()[100:] == p.to_list()


def test_shuffle_without_seed_is_random_each_time():
    p = af.range(200).shuffle(50)
    assert p.to_list() != p.to_list()


def test_shuffle_without_seed_or_reshuffle_keeps_one_random_order_per_pipeline():
    p = af.range(200).shuffle(50, reshuffle_each_iteration=False)
    assert p.to_list() == p.to_list() != af.range(200).shuffle(50).to_list()


def test_shuffle_of_short_and_empty_inputs():
    assert af.range(0).shuffle(10, seed=1).to_list() == []
    out = af.range(5).shuffle(100, seed=1).to_list()
    assert sorted(out) == [0, 1, 2, 3, 4]
    assert af.range(5).shuffle(1, seed=1).to_list() == [0, 1, 2, 3, 4]  # a buffer of 1
    assert len(af.range(7).shuffle(3)) == 7


def test_shuffle_delivers_items_before_an_upstream_error():
    p = af.range(10).map(fail_at(6)).shuffle(3, seed=0)
    got = []
    with pytest.raises(Boom) as info, p.iter() as it:
        for x in it:
            got.append(x)
    assert "map(fn)" in "".join(info.value.__notes__)
    assert len(got) == 6 - 3 and set(got) <= set(range(6))


@pytest.mark.parametrize("bad", [0, -1, 1.5, None, True])
def test_shuffle_rejects_bad_buffer_sizes(bad):
    with pytest.raises(af.PipelineError):
        af.range(3).shuffle(bad)


@FEW
@given(
    n=st.integers(0, 300),
    buffer_size=st.integers(1, 60),
    seed=st.integers(0, 2**32),
)
def test_shuffle_is_a_reproducible_permutation_that_never_emits_an_item_early(n, buffer_size, seed):
    out = af.range(n).shuffle(buffer_size, seed=seed).to_list()
    assert sorted(out) == list(range(n))
    assert af.range(n).shuffle(buffer_size, seed=seed).to_list() == out
    # output position j can only hold an input that arrived by then
    assert all(x <= j + buffer_size - 1 for j, x in enumerate(out))


# -- sort_by with a buffer -----------------------------------------------------------------
def test_streaming_sort_repairs_bounded_lateness():
    items = [1, 0, 2, 4, 3, 5, 7, 6, 8]
    assert af.from_iterable(items).sort_by(lambda x: x, buffer_size=1).to_list() == sorted(items)
    late = [0, 1, 2, 5, 3, 4, 6]  # 3 and 4 each arrive one place late
    assert af.from_iterable(late).sort_by(lambda x: x, buffer_size=1).to_list() == sorted(late)


def test_streaming_sort_beyond_its_bound_is_a_permutation_not_a_sort():
    items = [5, 1, 2, 3, 4, 0]  # 0 is five places late
    out = af.from_iterable(items).sort_by(lambda x: x, buffer_size=2).to_list()
    assert sorted(out) == sorted(items) and out != sorted(items)


def test_streaming_sort_is_stable_and_reverses():
    # ties whose own order is the reverse of their arrival: comparing them would show
    items = [(1, "z"), (0, "y"), (1, "c"), (0, "b"), (2, "a"), (1, "a")]
    key = lambda t: t[0]  # noqa: E731
    got = af.from_iterable(items).sort_by(key, buffer_size=10).to_list()
    assert got == sorted(items, key=key)
    rev = af.from_iterable(items).sort_by(key, buffer_size=10, reverse=True).to_list()
    assert rev == sorted(items, key=key, reverse=True)


class Opaque:
    """An item that cannot be ordered: a sort that compares items fails on it."""

    def __init__(self, key: int) -> None:
        self.key = key


@pytest.mark.parametrize("buffer_size", [3, 100, None])
def test_sort_never_compares_the_items_themselves(buffer_size):
    items = [Opaque(k) for k in [2, 1, 2, 0, 1, 2, 0, 0]]
    p = af.from_iterable(items).sort_by(lambda o: o.key, buffer_size=buffer_size)
    got = p.to_list()
    if buffer_size != 3:
        assert got == sorted(items, key=lambda o: o.key)  # stable, by identity
    assert sorted(map(id, got)) == sorted(map(id, items))


def test_streaming_sort_of_empty_input_and_cardinality():
    assert af.range(0).sort_by(lambda x: x, buffer_size=3).to_list() == []
    assert len(af.range(10).sort_by(lambda x: -x, buffer_size=3)) == 10


def test_streaming_sort_flushes_its_buffer_in_order_before_a_key_error():
    items = [3, 1, 2, 9, 0]
    p = af.from_iterable(items).sort_by(fail_at(9), buffer_size=10)
    got = []
    with pytest.raises(Boom) as info, p.iter() as it:
        for x in it:
            got.append(x)
    assert got == [1, 2, 3]
    assert any("at item 3" in n for n in info.value.__notes__)


def sort_lateness(items, key):
    """How many places late the latest item arrives, against the stable sorted order."""
    order = sorted(range(len(items)), key=lambda i: key(items[i]))
    return max((p - s for s, p in enumerate(order)), default=0)


@FEW
@given(
    delays=st.lists(st.integers(0, 20), max_size=200),
    buffer_size=st.integers(1, 20),
)
def test_bounded_lateness_input_comes_out_sorted(delays, buffer_size):
    # item i arrives at i + delay (at most buffer_size places late)
    delays = [min(d, buffer_size) for d in delays]
    items = sorted(range(len(delays)), key=lambda i: (i + delays[i], i))
    assert sort_lateness(items, lambda x: x) <= buffer_size
    out = af.from_iterable(items).sort_by(lambda x: x, buffer_size=buffer_size).to_list()
    assert out == list(range(len(items)))


@FEW
@given(keys=st.lists(st.integers(0, 5), max_size=80), buffer_size=st.integers(1, 10))
def test_streaming_sort_with_ties_is_exact_within_its_bound(keys, buffer_size):
    items = [(-i, k) for i, k in enumerate(keys)]  # ties' own order: the reverse of arrival
    key = lambda t: t[1]  # noqa: E731
    out = af.from_iterable(items).sort_by(key, buffer_size=buffer_size).to_list()
    assert sorted(out, reverse=True) == items
    if sort_lateness(items, key) <= buffer_size:
        assert out == sorted(items, key=key)


# -- sort_by without a buffer: the external sort ---------------------------------------------
def stats_of(p):
    """(items, the run's stats) of one run of ``p``."""
    with p.iter() as it:
        out = list(it)
    return out, it.stats()


def test_late_items_are_emitted_out_of_order_and_counted_by_default():
    items = [5, 1, 2, 3, 4, 0]  # 0 arrives after 1, 2 and 3 were emitted: late
    out, st = stats_of(af.from_iterable(items).sort_by(lambda x: x, buffer_size=2))
    assert out == [1, 2, 3, 0, 4, 5]
    assert st["sort_by(2)"].late == 1
    assert "1 late" in str(st)  # the table says so


def test_late_items_are_dropped_and_counted_with_on_late_drop():
    items = [5, 1, 2, 3, 4, 0, 9, 6, 7, 8, 1]
    p = af.from_iterable(items).sort_by(lambda x: x, buffer_size=2, on_late="drop")
    out, st = stats_of(p)
    assert out == [1, 2, 3, 4, 5, 6, 7, 8, 9]  # 0 came after 3 was emitted, the last 1 after 7
    assert st["sort_by(2)"].late == 2


def test_the_first_late_item_raises_late_item_after_the_items_before_it():
    items = [5, 1, 2, 3, 4, 0, 6]
    p = af.from_iterable(items).sort_by(lambda x: x, buffer_size=2, on_late="raise")
    got = []
    with pytest.raises(af.LateItem) as info, p.iter() as it:
        for x in it:
            got.append(x)
    assert got == [1, 2, 3]
    e = info.value
    assert (e.key, e.last_key, e.position, e.stage) == (0, 3, 5, "sort_by(2)")
    assert isinstance(e, af.StageError) and isinstance(e, ValueError)
    assert "late" in str(e) and "buffer_size" in str(e)


def test_lateness_is_against_the_largest_key_emitted_in_reverse_too():
    items = [0, 4, 3, 2, 1, 5]  # descending sort: 5 arrives after 4, 3 and 2 were emitted
    p = af.from_iterable(items).sort_by(lambda x: x, buffer_size=2, reverse=True)
    out, st = stats_of(p)
    assert out == [4, 3, 2, 5, 1, 0]
    assert st["sort_by(2)"].late == 1


def test_events_later_than_the_buffer_are_all_counted():
    # the case: events up to ~100 places late through a buffer of 16
    rng = np.random.default_rng(0)
    n = 20_000
    arrival = np.argsort(np.arange(n) + rng.integers(0, 100, n), kind="stable").tolist()
    p = af.from_iterable(arrival).sort_by(lambda x: x, buffer_size=16)
    out, st = stats_of(p)
    running = np.maximum.accumulate(out)
    out_of_order = int((np.array(out)[1:] < running[:-1]).sum())
    assert out_of_order > 1000
    assert st["sort_by(16)"].late == out_of_order
    q = af.from_iterable(arrival).sort_by(lambda x: x, buffer_size=16, on_late="drop")
    kept, st2 = stats_of(q)
    assert st2["sort_by(16)"].late == out_of_order == n - len(kept)
    assert kept == sorted(kept)


@FEW
@given(keys=st.lists(st.integers(0, 30), max_size=150), buffer_size=st.integers(1, 8))
def test_late_count_is_what_emit_puts_out_of_order_and_drop_leaves_out(keys, buffer_size):
    items = list(enumerate(keys))
    key = lambda t: t[1]  # noqa: E731
    emitted, st1 = stats_of(af.from_iterable(items).sort_by(key, buffer_size=buffer_size))
    late, top = [], None
    for t in emitted:
        if top is not None and key(t) < top:
            late.append(t)
        else:
            top = key(t)
    assert st1[f"sort_by({buffer_size})"].late == len(late)
    if sort_lateness(items, key) <= buffer_size:
        assert not late
    p = af.from_iterable(items).sort_by(key, buffer_size=buffer_size, on_late="drop")
    kept, st2 = stats_of(p)
    assert kept == [t for t in emitted if t not in late]
    assert kept == sorted(kept, key=key)
    assert st2[f"sort_by({buffer_size})"].late == len(late)


def test_sort_by_rejects_an_unknown_late_policy():
    with pytest.raises(af.PipelineError, match="on_late"):
        af.range(3).sort_by(lambda x: x, buffer_size=2, on_late="ignore")


def test_full_sort_in_memory_is_stable():
    items = [(2, "d"), (1, "c"), (2, "b"), (1, "a")]
    key = lambda t: t[0]  # noqa: E731
    assert af.from_iterable(items).sort_by(key).to_list() == sorted(items, key=key)
    assert af.from_iterable(items).sort_by(key, reverse=True).to_list() == sorted(
        items, key=key, reverse=True
    )


def test_external_sort_spills_runs_merges_them_and_removes_its_files(tmp_path):
    rng = np.random.default_rng(0)
    items = [(int(k), i) for i, k in enumerate(rng.integers(0, 50, 2000))]
    key = lambda t: t[0]  # noqa: E731
    seen = []

    def spy(t):
        seen.extend(os.listdir(tmp_path))  # while it runs: a directory of run files
        return t

    p = af.from_iterable(items).sort_by(key, max_in_memory=300, spill_dir=str(tmp_path))
    assert p.map(spy).to_list() == sorted(items, key=key)
    assert seen and all(name.startswith("aioflow-sort-") for name in seen)
    assert os.listdir(tmp_path) == []


def test_external_sort_merges_many_runs_in_groups(tmp_path, monkeypatch):
    monkeypatch.setattr(_spill, "FANIN", 3)
    items = [(i * 7919 % 101, i) for i in range(500)]
    key = lambda t: t[0]  # noqa: E731
    for reverse in (False, True):
        p = af.from_iterable(items).sort_by(
            key, reverse=reverse, max_in_memory=20, spill_dir=str(tmp_path)
        )
        assert p.to_list() == sorted(items, key=key, reverse=reverse)
    assert os.listdir(tmp_path) == []


async def test_break_out_of_an_external_sort_removes_its_files(tmp_path):
    p = af.range(1000).sort_by(lambda x: -x, max_in_memory=100, spill_dir=str(tmp_path))
    async with p.aiter() as it:
        got = [await anext(it) for _ in range(3)]
    assert got == [999, 998, 997]
    assert os.listdir(tmp_path) == []
    await assert_no_pending_tasks()


async def test_cancelling_an_external_sort_while_it_spills_removes_its_files(tmp_path):
    tasks = []

    def key(x):
        if x == 15_000:  # two runs are on disk: cancel the consumer now
            tasks[0].cancel()
        return -x

    async def consume():
        p = af.range(20_000).sort_by(key, max_in_memory=5_000, spill_dir=str(tmp_path))
        async for _ in p:
            pass

    tasks.append(asyncio.ensure_future(consume()))
    with pytest.raises(asyncio.CancelledError):
        await tasks[0]
    assert os.listdir(tmp_path) == []
    await assert_no_pending_tasks()


def test_external_sort_errors_remove_the_files_and_reach_the_consumer_as_themselves(tmp_path):
    p = (
        af.range(1000)
        .map(fail_at(700))
        .sort_by(lambda x: x, max_in_memory=100, spill_dir=str(tmp_path))
    )
    with pytest.raises(Boom) as info:
        p.to_list()
    assert info.value.args == ("bad", 700)
    key_fails = af.range(1000).sort_by(fail_at(500), max_in_memory=100, spill_dir=str(tmp_path))
    with pytest.raises(Boom) as info:
        key_fails.to_list()
    assert any("sort_by" in n and "at item 500" in n for n in info.value.__notes__)
    unpicklable = (
        af.range(300)
        .map(lambda x: lambda: x)
        .sort_by(lambda f: -f(), max_in_memory=100, spill_dir=str(tmp_path))
    )
    # the interpreter's own pickling error (its wording differs between Python versions)
    with pytest.raises((pickle.PicklingError, AttributeError, TypeError)) as info:
        unpicklable.to_list()
    assert any("sort_by" in n for n in info.value.__notes__)
    assert os.listdir(tmp_path) == []


def test_full_sort_of_empty_input():
    assert af.range(0).sort_by(lambda x: x, max_in_memory=1).to_list() == []


@pytest.mark.parametrize(
    "kw", [{"buffer_size": 0}, {"max_in_memory": 0}, {"buffer_size": 2.5}, {"max_in_memory": None}]
)
def test_sort_by_rejects_bad_sizes(kw):
    with pytest.raises(af.PipelineError):
        af.range(3).sort_by(lambda x: x, **kw)


@FEW
@given(
    keys=st.lists(st.integers(-3, 3) | st.text(max_size=2).map(len), max_size=60),
    max_in_memory=st.integers(1, 7),
    reverse=st.booleans(),
)
def test_external_sort_equals_sorted_and_leaves_no_file(keys, max_in_memory, reverse):
    items = [(-i, k) for i, k in enumerate(keys)]  # ties' own order: the reverse of arrival
    key = lambda t: t[1]  # noqa: E731
    with tempfile.TemporaryDirectory() as d:
        p = af.from_iterable(items).sort_by(
            key, reverse=reverse, max_in_memory=max_in_memory, spill_dir=d
        )
        assert p.to_list() == sorted(items, key=key, reverse=reverse)
        assert os.listdir(d) == []


# -- group_by ----------------------------------------------------------------------------------
def test_group_by_emits_full_groups_then_the_rest_in_order_of_first_arrival():
    out = af.from_iterable("abcabcaab").group_by(lambda c: c, size=3).to_list()
    assert out == [("a", ["a", "a", "a"]), ("b", ["b", "b", "b"]), ("c", ["c", "c"]), ("a", ["a"])]


def test_group_by_without_limits_groups_everything_at_the_end():
    out = af.range(10).group_by(lambda x: x % 3).to_list()
    assert out == [(0, [0, 3, 6, 9]), (1, [1, 4, 7]), (2, [2, 5, 8])]


def test_group_by_max_keys_pushes_the_oldest_open_group_out():
    items = [("u1", 1), ("u2", 2), ("u1", 3), ("u3", 4), ("u2", 5), ("u4", 6)]
    out = af.from_iterable(items).group_by(lambda t: t[0], max_keys=2).to_list()
    assert out == [
        ("u1", [("u1", 1), ("u1", 3)]),  # u3 arrives: u1 (begun first) goes
        ("u2", [("u2", 2), ("u2", 5)]),  # u4 arrives: u2 goes
        ("u3", [("u3", 4)]),
        ("u4", [("u4", 6)]),
    ]


def test_group_by_counts_the_groups_max_keys_pushed_out():
    items = [("u1", 1), ("u2", 2), ("u1", 3), ("u3", 4), ("u2", 5), ("u4", 6)]
    out, st = stats_of(af.from_iterable(items).group_by(lambda t: t[0], max_keys=2))
    assert len(out) == 4
    assert st["group_by"].evicted == 2  # u1 when u3 came, u2 when u4 came
    assert "2 evicted" in str(st)
    _, full = stats_of(af.range(6).group_by(lambda x: x % 2, size=3, max_keys=2))
    assert full["group_by"].evicted == 0  # full groups and the end are not evictions


def test_group_by_size_one_and_empty_input():
    assert af.range(3).group_by(lambda x: 0, size=1).to_list() == [(0, [0]), (0, [1]), (0, [2])]
    assert af.range(0).group_by(lambda x: x).to_list() == []
    assert af.range(3).group_by(lambda x: x).cardinality() == af.UNKNOWN


def test_group_by_delivers_groups_before_a_key_error():
    p = af.range(10).group_by(fail_at(5), size=1)
    got = []
    with pytest.raises(Boom), p.iter() as it:
        for g in it:
            got.append(g)
    assert got == [(0, [0]), (1, [1]), (2, [2]), (3, [3]), (4, [4])]


def reference_group_by(items, key, size, max_keys):
    """group_by the slow way: open groups with the time they began."""
    groups, out = {}, []
    for t, x in enumerate(items):
        k = key(x)
        if k not in groups:
            if max_keys is not None and len(groups) == max_keys:
                oldest = min(groups, key=lambda g: groups[g][0])
                out.append((oldest, groups.pop(oldest)[1]))
            groups[k] = (t, [])
        groups[k][1].append(x)
        if size is not None and len(groups[k][1]) == size:
            out.append((k, groups.pop(k)[1]))
    return out + [(k, g) for k, (_, g) in sorted(groups.items(), key=lambda kv: kv[1][0])]


@FEW
@given(
    keys=st.lists(st.integers(0, 8), max_size=150),
    size=st.none() | st.integers(1, 5),
    max_keys=st.none() | st.integers(1, 4),
)
def test_group_by_matches_a_reference_and_bounds_open_groups(keys, size, max_keys):
    items = list(enumerate(keys))
    key = lambda t: t[1]  # noqa: E731
    out = af.from_iterable(items).group_by(key, size=size, max_keys=max_keys).to_list()
    assert out == reference_group_by(items, key, size, max_keys)
    assert sorted(x for _, g in out for x in g) == items


def test_group_by_rejects_bad_limits():
    with pytest.raises(af.PipelineError):
        af.range(3).group_by(lambda x: x, size=0)
    with pytest.raises(af.PipelineError):
        af.range(3).group_by(lambda x: x, max_keys=0)


def test_external_sort_round_trips_objects_shared_between_items(tmp_path):
    # the same objects in many items: pickled as references, block after block
    shared = [f"payload-{i}" * 3 for i in range(3)] + [(1, 2), frozenset({"x"})]
    items = [(i % 11, shared[i % len(shared)]) for i in range(5000)]
    key = lambda t: t[0]  # noqa: E731
    p = af.from_iterable(items).sort_by(key, max_in_memory=1500, spill_dir=str(tmp_path))
    assert p.to_list() == sorted(items, key=key)


@pytest.mark.parametrize("kw", [{"buffer_size": 2}, {}, {"max_in_memory": 2}])
def test_keys_that_do_not_compare_raise_a_type_error_naming_the_stage(kw, tmp_path):
    p = af.from_iterable([3, 1, "a", 2, None]).sort_by(lambda x: x, spill_dir=str(tmp_path), **kw)
    with pytest.raises(TypeError) as info:
        p.to_list()
    assert any("sort_by" in n for n in info.value.__notes__)
    assert os.listdir(tmp_path) == []


def test_max_inflight_counts_the_buffers_of_ordering_operators():
    base = af.range(10).max_inflight()
    assert af.range(10).shuffle(5000).max_inflight() >= base + 5000
    assert af.range(10).sort_by(lambda x: x, buffer_size=3000).max_inflight() >= base + 3000
    assert af.range(10).group_by(lambda x: x, size=10, max_keys=100).max_inflight() >= 1000


def test_a_seeded_shuffle_resumes_from_a_state_after_a_restart():
    def make():  # the job rebuilds its pipeline after a restart
        return af.range(300).shuffle(50, seed=9).batch(10, collate=list)

    whole = make().to_list()
    with make().iter() as it:
        head = [next(it) for _ in range(7)]
        state = it.state_dict()
    assert head == whole[:7]
    assert list(make().iter(state=state)) == whole[7:]


class SlowToPickle:
    """An item whose pickling takes a while (so that a cancel lands during a spill)."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __reduce__(self):
        import time

        time.sleep(0.002)
        return SlowToPickle, (self.n,)


async def test_a_sort_cancelled_while_its_thread_writes_a_run_waits_for_it_then_cleans_up(
    tmp_path, no_leaks
):
    p = (
        af.range(400)
        .map(SlowToPickle)
        .sort_by(lambda s: -s.n, max_in_memory=200, spill_dir=str(tmp_path))
    )
    task = asyncio.ensure_future(p.collect())
    for _ in range(200):  # until the first run is being written
        await asyncio.sleep(0.01)
        if list(tmp_path.glob("*/run-*")):
            break
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert os.listdir(tmp_path) == []
    await assert_no_pending_tasks()


def test_break_in_a_sync_for_over_ordering_operators_leaves_nothing_behind(tmp_path, no_leaks):
    pipelines = [
        af.range(10**5).shuffle(1000, seed=1),
        af.range(10**5).sort_by(lambda x: -x, buffer_size=100),
        af.range(10**5).sort_by(lambda x: -x, max_in_memory=10**4, spill_dir=str(tmp_path)),
        af.range(10**5).group_by(lambda x: x % 7, size=3),
    ]
    for p in pipelines:
        for _ in p:
            break
    assert os.listdir(tmp_path) == []


def test_a_reshuffled_epoch_resumes_from_its_state_in_the_same_process():
    p = af.range(300).shuffle(50, seed=9)
    assert p.to_list() == reference_shuffle(list(range(300)), 50, 9, epoch=0)
    second = reference_shuffle(list(range(300)), 50, 9, epoch=1)
    with p.iter() as it:  # the second epoch, interrupted
        head = [next(it) for _ in range(40)]
        state = it.state_dict()
    assert head == second[:40]
    assert list(p.iter(state=state)) == second[40:]
