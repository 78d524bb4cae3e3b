"""The Pipeline itself: laziness, immutability, re-iteration, both ways to iterate."""

from __future__ import annotations

import asyncio
import json
import pickle
import threading

import pytest

import aioflow as af
from tests.conftest import assert_no_pending_tasks


def test_methods_return_new_pipelines_and_leave_the_original_unchanged():
    p = af.range(5)
    q = p.map(lambda x: x + 1)
    assert q is not p
    assert p.to_list() == [0, 1, 2, 3, 4]
    assert q.to_list() == [1, 2, 3, 4, 5]


def test_nothing_runs_until_iterated():
    calls = []
    p = af.range(3).map(lambda x: calls.append(x) or x)
    assert calls == []
    assert p.to_list() == [0, 1, 2]
    assert calls == [0, 1, 2]


def test_re_iteration_gives_the_same_epoch_twice():
    p = af.range(10).map(lambda x: x * 3).filter(lambda x: x % 2 == 0).batch(2, collate=list)
    assert p.to_list() == p.to_list() == [[0, 6], [12, 18], [24]]


async def test_async_for_runs_on_the_callers_loop():
    loop = asyncio.get_running_loop()
    seen = []

    async def where(x):
        seen.append(asyncio.get_running_loop() is loop)
        return x

    out = [x async for x in af.range(3).map(where)]
    assert out == [0, 1, 2]
    assert seen == [True, True, True]
    await assert_no_pending_tasks()


async def test_sync_adapter_works_inside_a_running_loop(no_leaks):
    # a notebook cell or an async test: the caller's loop is running in this thread
    assert af.range(5).map(lambda x: -x).to_list() == [0, -1, -2, -3, -4]
    assert [x for x in af.range(3)] == [0, 1, 2]


def test_sync_adapter_works_from_a_non_main_thread(no_leaks):
    out = []
    t = threading.Thread(target=lambda: out.extend(af.range(4).to_list()))
    t.start()
    t.join(10)
    assert out == [0, 1, 2, 3]


def test_collect_returns_items():
    assert asyncio.run(af.range(3).collect()) == [0, 1, 2]


def test_iter_context_manager_closes_the_run(no_leaks):
    with af.range(1_000_000).iter() as it:
        assert next(it) == 0
        assert next(it) == 1
    with pytest.raises(StopIteration):
        next(it)


async def test_aiter_context_manager_closes_the_run():
    async with af.range(1_000_000).map(lambda x: x).aiter() as it:
        assert await anext(it) == 0
    with pytest.raises(StopAsyncIteration):
        await anext(it)
    await assert_no_pending_tasks()


def test_break_in_sync_for_leaves_no_thread(no_leaks):
    for x in af.range(10_000_000).map(lambda x: x):
        if x == 5:
            break


async def test_break_in_async_for_leaves_no_task():
    async for x in af.range(10_000_000).map(lambda x: x).prefetch(4):
        if x == 5:
            break
    await assert_no_pending_tasks()


async def test_dropped_async_iterator_stops_its_run():
    it = af.range(10_000_000).prefetch(8).aiter()
    assert await anext(it) == 0
    del it
    await assert_no_pending_tasks()


def test_dropped_sync_iterator_stops_its_thread(no_leaks):
    it = af.range(10_000_000).iter()
    assert next(it) == 0
    del it


async def test_cancelling_the_consumer_passes_through_and_stops_the_run():
    started = asyncio.Event()

    async def consume():
        async with af.range(10_000_000).map(lambda x: x).aiter() as it:
            async for _ in it:
                started.set()
                await asyncio.sleep(0)

    task = asyncio.create_task(consume())
    await started.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    await assert_no_pending_tasks()


def test_exception_in_the_loop_body_passes_through_unchanged(no_leaks):
    class Mine(Exception):
        pass

    err = Mine("consumer")
    with pytest.raises(Mine) as info:
        for x in af.range(100).map(lambda x: x):
            if x == 3:
                raise err
    assert info.value is err
    assert not getattr(info.value, "__notes__", None)


def test_cardinality_follows_tf_data_rules():
    r = af.range(10)
    assert r.cardinality() == 10
    assert r.map(str).cardinality() == 10
    assert r.batch(3).cardinality() == 4
    assert r.batch(3, drop_remainder=True).cardinality() == 3
    assert r.take(4).cardinality() == 4
    assert r.take(40).cardinality() == 10
    assert r.skip(3).cardinality() == 7
    assert r.skip(30).cardinality() == 0
    assert r.shard(3, 0).cardinality() == 4
    assert r.shard(3, 2).cardinality() == 3
    assert r.window(3, shift=2).cardinality() == 5
    assert r.window(3, shift=2, drop_remainder=True).cardinality() == 4
    assert r.enumerate().cardinality() == 10
    assert r.repeat(3).cardinality() == 30
    assert r.filter(bool).cardinality() == af.UNKNOWN
    assert r.flat_map(lambda x: [x]).cardinality() == af.UNKNOWN
    assert r.repeat().cardinality() == af.INFINITE
    assert r.repeat().take(5).cardinality() == 5
    assert r.filter(bool).repeat().cardinality() == af.INFINITE
    assert af.range(0).repeat().cardinality() == 0
    assert af.zip(r, r.take(3)).cardinality() == 3
    assert af.concat(r, r).cardinality() == 20
    assert af.from_iterable(x for x in "ab").cardinality() == af.UNKNOWN


def test_len_raises_type_error_unless_known_and_finite():
    assert len(af.range(7).batch(2)) == 4
    with pytest.raises(TypeError, match="infinite"):
        len(af.range(3).repeat())
    with pytest.raises(TypeError, match="unknown"):
        len(af.range(3).filter(bool))


def test_iter_timeout_raises_next_timeout_and_the_run_stays_usable(no_leaks):
    import time

    def slow(x):
        time.sleep(0.3 if x == 1 else 0)
        return x

    with af.range(3).map(slow, executor="thread").iter(timeout=0.1) as it:
        assert next(it) == 0
        with pytest.raises(af.NextTimeout):
            next(it)
        with pytest.raises(TimeoutError):  # NextTimeout is a TimeoutError
            next(it)
        time.sleep(0.3)
        assert next(it) == 1


async def test_aiter_timeout_raises_next_timeout():
    async def slow(x):
        await asyncio.sleep(0.5)
        return x

    async with af.range(3).map(slow).aiter(timeout=0.05) as it:
        with pytest.raises(af.NextTimeout):
            await anext(it)
    await assert_no_pending_tasks()


def test_bad_timeout_is_rejected():
    with pytest.raises(af.PipelineError):
        af.range(3).iter(timeout=0)


def test_state_dict_resumes_after_the_items_already_yielded():
    p = af.range(20).map(lambda x: x * 2).batch(3, collate=list)
    with p.iter() as it:
        first = [next(it), next(it)]
        state = it.state_dict()
    state = json.loads(json.dumps(state))  # plain data
    state = pickle.loads(pickle.dumps(state))
    with p.iter(state=state) as it:
        rest = list(it)
    assert first + rest == p.to_list()


async def test_async_state_dict_resumes_too():
    p = af.range(10)
    async with p.aiter() as it:
        assert [await anext(it) for _ in range(4)] == [0, 1, 2, 3]
        state = it.state_dict()
    async with p.aiter(state=state) as it:
        assert [x async for x in it] == [4, 5, 6, 7, 8, 9]


def test_state_from_another_pipeline_is_rejected():
    with af.range(10).iter() as it:
        next(it)
        state = it.state_dict()
    with pytest.raises(af.StateMismatch, match="another pipeline"):
        af.range(10).map(str).iter(state=state)
    with pytest.raises(af.StateMismatch):
        af.range(10).iter(state={"what": 1})


def test_max_inflight_grows_with_buffers():
    p = af.range(10)
    assert p.prefetch(100).max_inflight() >= p.max_inflight() + 100
    assert p.batch(64).max_inflight() >= p.max_inflight() + 64


def test_repr_names_the_chain():
    assert repr(af.range(3).map(str).batch(2)) == "<Pipeline range -> map(str) -> batch(2)>"


def test_max_inflight_of_a_chain_longer_than_the_recursion_limit():
    # (it walked the graph by recursion, and its light term asked cardinality(), which
    # recurses too: a RecursionError on 3,000 maps)
    p = af.range(3)
    for _ in range(3000):
        p = p.map(abs)
    assert p.max_inflight() >= 3000 * 256  # (each fused map may work on a chunk)


def test_a_graph_walk_combines_a_node_read_twice_once():
    from aioflow._core.graph import fold

    seen = []
    r = af.range(10)
    p = af.zip(r, r.batch(2))
    fold(p, lambda n, ins: seen.append(n.name) or 1)
    assert sorted(seen) == sorted(["range", "batch(2)", "zip"])
