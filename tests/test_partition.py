"""partition_by: keyed parallelism."""

from __future__ import annotations

import asyncio
from collections import defaultdict

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import aioflow as af
from aioflow.ops.partition import partition_of
from tests.conftest import assert_no_pending_tasks
from tests.test_transforms import Boom

FEW = settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])


#: two keys that land in different partitions of two: key TWO[i] goes to partition i
TWO = {partition_of(k, 2): k for k in range(10)}


def parity(x):
    return TWO[x % 2]


def by_key(items, key):
    groups = defaultdict(list)
    for x in items:
        groups[key(x)].append(x)
    return dict(groups)


def test_partition_by_keeps_each_keys_order_and_loses_nothing():
    items = [(i % 7, i) for i in range(2000)]
    key = lambda t: t[0]  # noqa: E731
    out = af.from_iterable(items).partition_by(key, 3, lambda p: p.map(lambda t: t)).to_list()
    assert sorted(out) == sorted(items)
    assert by_key(out, key) == by_key(items, key)


def test_partition_by_sends_a_key_always_to_the_same_partition():
    seen = defaultdict(set)

    def tag(i):
        def fn(x):
            seen[x % 10].add(i)
            return x

        return fn

    made = []

    def fn(p):
        made.append(None)
        return p.map(tag(len(made) - 1))

    out = af.range(500).partition_by(lambda x: x % 10, 4, fn).to_list()
    assert sorted(out) == list(range(500))
    assert all(len(parts) == 1 for parts in seen.values())
    for k, parts in seen.items():
        assert parts == {partition_of(k, 4)}


def test_partition_of_is_a_fixed_function_of_the_key():
    assert partition_of("user-1", 8) == partition_of("user-1", 8)
    assert [partition_of(k, 1) for k in (0, "a", b"b", (1, "x"), 2.5)] == [0] * 5
    assert len({partition_of(i, 8) for i in range(0, 800, 8)}) == 8  # strides spread


def test_partition_by_runs_a_scan_with_per_key_state():
    items = [("a", 1), ("b", 10), ("a", 2), ("b", 20), ("a", 3)]

    def running_sums(p):
        def step(state, t):
            k, v = t
            state = {**state, k: state.get(k, 0) + v}
            return state, (k, state[k])

        return p.scan({}, step)

    out = af.from_iterable(items).partition_by(lambda t: t[0], 2, running_sums).to_list()
    assert by_key(out, lambda t: t[0]) == {
        "a": [("a", 1), ("a", 3), ("a", 6)],
        "b": [("b", 10), ("b", 30)],
    }


async def test_partitions_run_concurrently():
    active = peak = 0

    async def enrich(x):
        nonlocal active, peak
        active += 1
        peak = max(peak, active)
        await asyncio.sleep(0.005)
        active -= 1
        return x

    out = await af.range(64).partition_by(lambda x: x, 4, lambda p: p.map(enrich)).collect()
    assert sorted(out) == list(range(64))
    assert peak == 4
    await assert_no_pending_tasks()


def test_partition_by_of_empty_input_and_one_partition():
    assert af.range(0).partition_by(lambda x: x, 3, lambda p: p).to_list() == []
    assert af.range(5).partition_by(lambda x: x, 1, lambda p: p).to_list() == [0, 1, 2, 3, 4]


def test_a_partition_that_stops_reading_does_not_block_the_others():
    # partition of key 0 takes 2 items and stops: the rest of its items are dropped
    out = af.range(3000).partition_by(parity, 2, lambda p: p.take(2)).to_list()
    assert sorted(out) == [0, 1, 2, 3]
    ignores = af.range(3000).partition_by(parity, 2, lambda p: af.range(2)).to_list()
    assert sorted(ignores) == [0, 0, 1, 1]


async def test_a_slow_partition_holds_the_input_back_instead_of_the_others_buffering():
    routed = 0

    def count(x):
        nonlocal routed
        routed += 1
        return x

    gate = asyncio.Event()

    async def slow(x):
        if x % 2 == 0:
            await gate.wait()
        return x

    p = af.range(20_000).map(count).partition_by(parity, 2, lambda q: q.map(slow))
    async with p.aiter() as it:
        for _ in range(50):  # only the fast partition moves
            assert (await anext(it)) % 2 == 1
        await asyncio.sleep(0.05)
        assert routed < 5_000  # the router stopped: the slow partition's channel is full
        gate.set()
        rest = [x async for x in it]
    assert len(rest) == 20_000 - 50
    await assert_no_pending_tasks()


async def test_an_error_in_a_partition_reaches_the_consumer_as_itself():
    err = Boom("bad partition")

    def fail(x):
        if x == 77:
            raise err
        return x

    p = af.range(1000).partition_by(lambda x: x % 4, 4, lambda q: q.map(fail))
    with pytest.raises(Boom) as info:
        await p.collect()
    assert info.value is err
    assert any("map(fail)" in n for n in info.value.__notes__)
    await assert_no_pending_tasks()


def test_an_upstream_error_comes_after_the_items_before_it():
    def fail(x):
        if x == 600:
            raise Boom("upstream")
        return x

    p = af.range(1000).map(fail).partition_by(lambda x: x % 3, 3, lambda q: q)
    got = []
    with pytest.raises(Boom), p.iter() as it:
        for x in it:
            got.append(x)
    assert sorted(got) == list(range(600))


def test_a_key_error_comes_after_the_items_before_it():
    def key(x):
        if x == 300:
            raise Boom("key")
        return x % 2

    p = af.range(1000).partition_by(key, 2, lambda q: q)
    got = []
    with pytest.raises(Boom) as info, p.iter() as it:
        for x in it:
            got.append(x)
    assert sorted(got) == list(range(300))
    assert any("partition_by" in n and "at item 300" in n for n in info.value.__notes__)


async def test_break_cancels_every_partition(no_leaks):
    async def enrich(x):
        await asyncio.sleep(0.001)
        return x

    p = af.range(10**6).partition_by(lambda x: x, 8, lambda q: q.map(enrich, concurrency=2))
    async with p.aiter() as it:
        async for x in it:
            if x > 100:
                break
    await assert_no_pending_tasks()


def test_partition_by_checks_its_arguments():
    with pytest.raises(af.PipelineError):
        af.range(3).partition_by(lambda x: x, 0, lambda p: p)
    with pytest.raises(af.PipelineError):
        af.range(3).partition_by(lambda x: x, 2, "not callable")
    with pytest.raises(af.PipelineError):
        af.range(3).partition_by(lambda x: x, 2, lambda p: [1, 2]).to_list()


def test_an_error_in_fn_itself_reaches_the_consumer_as_itself(no_leaks):
    err = Boom("fn")

    def fn(p):
        raise err

    with pytest.raises(Boom) as info:
        af.range(3).partition_by(lambda x: x, 2, fn).to_list()
    assert info.value is err
    assert any("partition_by" in n for n in info.value.__notes__)


@FEW
@given(
    items=st.lists(st.tuples(st.integers(0, 9), st.integers()), max_size=300),
    n=st.integers(1, 5),
)
def test_partition_by_preserves_per_key_order_and_loses_nothing(items, n):
    key = lambda t: t[0]  # noqa: E731
    out = af.from_iterable(items).partition_by(key, n, lambda p: p.map(lambda t: t)).to_list()
    assert sorted(out) == sorted(items)
    assert by_key(out, key) == by_key(items, key)


def test_break_in_a_sync_for_over_partitions_leaves_nothing_running(no_leaks):
    p = af.range(10**6).partition_by(lambda x: x % 5, 4, lambda q: q.map(lambda x: x + 1))
    for x in p:
        if x > 1000:
            break
