"""take, skip, repeat, shard, prefetch (``slicing``)."""

from __future__ import annotations

import asyncio

import pytest

import aioflow as af


# -- take, skip, repeat ----------------------------------------------------------------
def test_take_and_skip():
    assert af.range(10).take(3).to_list() == [0, 1, 2]
    assert af.range(10).take(0).to_list() == []
    assert af.range(10).take(-1).to_list() == list(range(10))
    assert af.range(3).take(10).to_list() == [0, 1, 2]
    assert af.range(1000).skip(998).to_list() == [998, 999]
    assert af.range(10).skip(0).to_list() == list(range(10))
    assert af.range(10).skip(-1).to_list() == []
    assert af.range(10).skip(20).to_list() == []


def test_take_stops_the_upstream_early():
    seen = []
    af.from_iterable(range(10**9)).map(lambda x: seen.append(x) or x).take(5).to_list()
    assert len(seen) < 10_000


def test_repeat_reruns_the_upstream_each_time():
    calls = []

    def gen():
        calls.append(1)
        yield from range(3)

    assert af.from_iterable(gen).repeat(2).to_list() == [0, 1, 2, 0, 1, 2]
    assert len(calls) == 2
    assert af.range(3).repeat(0).to_list() == []
    assert af.range(2).repeat().take(5).to_list() == [0, 1, 0, 1, 0]


def test_repeat_forever_of_an_empty_input_ends():
    assert af.range(0).repeat().to_list() == []


def test_repeat_take_reruns_and_stops_each_epoch(no_leaks):
    assert af.range(10**9).take(2).repeat(3).to_list() == [0, 1] * 3


# -- shard ------------------------------------------------------------------------------
def test_shard_picks_every_nth_from_index():
    assert af.range(10).shard(3, 0).to_list() == [0, 3, 6, 9]
    assert af.range(10).shard(3, 2).to_list() == [2, 5, 8]
    parts = [af.range(1000).shard(7, i).to_list() for i in range(7)]
    assert sorted(x for part in parts for x in part) == list(range(1000))


def test_shard_rejects_a_bad_index():
    with pytest.raises(af.PipelineError):
        af.range(3).shard(2, 2)
    with pytest.raises(af.PipelineError):
        af.range(3).shard(0, 0)


def test_shard_from_env_reads_rank_and_world_size(monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "4")
    monkeypatch.setenv("RANK", "3")
    assert af.shard_from_env() == (4, 3)
    monkeypatch.delenv("WORLD_SIZE")
    monkeypatch.delenv("RANK")
    assert af.shard_from_env() == (1, 0)
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "2")
    with pytest.raises(af.PipelineError):
        af.shard_from_env()


# -- prefetch --------------------------------------------------------------------------
def test_prefetch_keeps_items_and_order():
    assert af.range(1000).prefetch(3).to_list() == list(range(1000))
    assert af.range(5).prefetch(af.AUTOTUNE).to_list() == list(range(5))
    p = af.range(5)
    assert p.prefetch(0) is p


async def test_prefetch_produces_ahead_of_a_slow_consumer_but_no_more_than_n():
    made = []

    def gen():
        for i in range(20_000):
            made.append(i)
            yield i

    p = af.from_iterable(gen).prefetch(5)
    async with p.aiter() as it:
        assert await anext(it) == 0
        await asyncio.sleep(0.1)
        # ran ahead, but bounded: the prefetch buffer, the source's channel, chunks in hand
        assert 5 <= len(made) <= p.max_inflight() < 20_000
        assert [x async for x in it] == list(range(1, 20_000))


def test_prefetch_rejects_negative_sizes():
    with pytest.raises(af.PipelineError):
        af.range(3).prefetch(-5)
