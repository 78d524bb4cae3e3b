"""interleave: tf.data's cycle order, concurrent read-ahead (fan-in), unordered merge."""

from __future__ import annotations

import asyncio

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import aioflow as af
from tests.conftest import assert_no_pending_tasks

TF_DOC = [1, 1, 1, 1, 2, 2, 2, 2, 1, 1, 2, 2, 3, 3, 3, 3, 4, 4, 4, 4, 3, 3, 4, 4, 5, 5, 5, 5, 5, 5]


def reference(sizes: list[int], cycle_length: int, block_length: int) -> list[tuple[int, int]]:
    """tf.data's sequential interleave, written plainly: items are (element, index)."""
    inputs = iter(range(len(sizes)))
    slots: list[list[tuple[int, int]] | None] = [None] * cycle_length
    out: list[tuple[int, int]] = []
    cycle = block = n_open = 0
    ended = False
    while not ended or n_open:
        s = slots[cycle]
        if s is not None:
            if s:
                out.append(s.pop(0))
                block += 1
                if block == block_length:
                    cycle, block = (cycle + 1) % cycle_length, 0
                continue
            slots[cycle] = None
            n_open -= 1
            cycle, block = (cycle + 1) % cycle_length, 0
        elif not ended:
            e = next(inputs, None)
            if e is None:
                ended = True
            else:
                slots[cycle] = [(e, i) for i in range(sizes[e])]
                n_open += 1
        else:
            cycle, block = (cycle + 1) % cycle_length, 0
    return out


def sub(x: int) -> af.Pipeline[int]:
    return af.from_iterable([x] * 6)


@pytest.mark.parametrize("concurrency", [None, 1, 2, 3, 8])
def test_interleave_follows_tf_data_documented_order(concurrency):
    p = af.range(1, 6).interleave(sub, cycle_length=2, block_length=4, concurrency=concurrency)
    assert p.to_list() == TF_DOC
    assert p.to_list() == TF_DOC  # a second epoch is the same


@settings(max_examples=40, deadline=None)
@given(
    sizes=st.lists(st.integers(0, 7), max_size=8),
    cycle_length=st.integers(1, 4),
    block_length=st.integers(1, 3),
    concurrency=st.sampled_from([None, 2, 5]),
)
def test_interleave_matches_the_reference_cycle(sizes, cycle_length, block_length, concurrency):
    p = af.range(len(sizes)).interleave(
        lambda e: af.from_iterable([(e, i) for i in range(sizes[e])]),
        cycle_length=cycle_length,
        block_length=block_length,
        concurrency=concurrency,
    )
    assert p.to_list() == reference(sizes, cycle_length, block_length)


@settings(max_examples=15, deadline=None)
@given(
    sizes=st.lists(st.integers(0, 150), min_size=2, max_size=12).filter(lambda s: sum(s) > 600),
    cycle_length=st.integers(1, 4),
    block_length=st.sampled_from([1, 3, 100]),
    concurrency=st.sampled_from([None, 2, 5]),
)
def test_interleave_matches_the_reference_cycle_over_many_output_chunks(
    sizes, cycle_length, block_length, concurrency
):
    # more than two chunks of output (CHUNK_MAX is 256): what crosses a chunk's edge counts
    test_interleave_matches_the_reference_cycle.hypothesis.inner_test(
        sizes, cycle_length, block_length, concurrency
    )


def test_interleave_of_empty_input_and_empty_sub_pipelines():
    assert af.range(0).interleave(sub, cycle_length=3).to_list() == []
    empty = af.range(4).interleave(lambda x: af.from_iterable([]), cycle_length=2, concurrency=2)
    assert empty.to_list() == []
    assert af.range(3).interleave(sub, cycle_length=2).cardinality() == af.UNKNOWN


def test_interleave_accepts_plain_iterables_from_fn():
    p = af.range(3).interleave(lambda x: [x, x + 10], cycle_length=3)
    assert p.to_list() == [0, 1, 2, 10, 11, 12]


@pytest.mark.parametrize("concurrency", [None, 2])
def test_sub_pipeline_error_reaches_consumer_after_the_items_before_it(concurrency):
    class Bad(Exception):
        pass

    def parse(x: int) -> int:
        if x == 2:
            raise Bad(x)
        return x

    p = af.range(3).interleave(
        lambda x: af.from_iterable([x, x + 1]).map(parse), cycle_length=1, concurrency=concurrency
    )
    got = []
    with pytest.raises(Bad) as info:
        for x in p:
            got.append(x)
    assert got == [0, 1, 1]
    assert info.value.args == (2,)


def test_fn_error_is_annotated_with_the_input_position():
    def make(x: int) -> af.Pipeline[int]:
        if x == 1:
            raise KeyError(x)
        return sub(x)

    with pytest.raises(KeyError) as info:
        af.range(3).interleave(make, cycle_length=1).to_list()
    assert "raised in stage 'interleave(make)' at item 1" in info.value.__notes__[0]


@pytest.mark.parametrize("fail_in", ["fn", "input"])
@pytest.mark.parametrize("concurrency", [None, 2])
def test_the_items_before_a_failing_fn_or_input_come_out_before_its_error(
    monkeypatch, fail_in, concurrency
):
    # gathered items are released only as whole chunks here: the error must not drop them
    monkeypatch.setattr("aioflow.ops.interleave._FLUSH_SECONDS", float("inf"))

    def bad(x: int) -> int:
        if x == 70:
            raise KeyError(x)
        return x

    def make(x: int) -> af.Pipeline[int]:
        return af.from_iterable([bad(x) if fail_in == "fn" else x])

    src = af.range(100) if fail_in == "fn" else af.range(100).map(bad)
    p = src.interleave(make, cycle_length=2, concurrency=concurrency)
    got = []
    with pytest.raises(KeyError):
        for x in p:
            got.append(x)
    assert got == list(range(70))


def test_bad_arguments_are_refused_when_described():
    with pytest.raises(af.PipelineError, match="cycle_length"):
        af.range(3).interleave(sub, cycle_length=0)
    with pytest.raises(af.PipelineError, match="block_length"):
        af.range(3).interleave(sub, cycle_length=1, block_length=0)
    with pytest.raises(af.PipelineError, match="concurrency"):
        af.range(3).interleave(sub, cycle_length=1, concurrency=0)


def slow_source(x: int, active: list[int], peak: list[int]) -> af.Pipeline[int]:
    async def gen():
        active[0] += 1
        peak[0] = max(peak[0], active[0])
        try:
            for i in range(3):
                await asyncio.sleep(0.01 * (1 + x % 3))
                yield (x, i)
        finally:
            active[0] -= 1

    return af.from_iterable(gen)


@pytest.mark.parametrize(("cycle_length", "concurrency"), [(2, 2), (2, 4), (4, 4)])
async def test_concurrent_interleave_reads_sub_pipelines_ahead_at_once(cycle_length, concurrency):
    active, peak = [0], [0]
    p = af.range(8).interleave(
        lambda x: slow_source(x, active, peak), cycle_length=cycle_length, concurrency=concurrency
    )
    out = await p.collect()
    assert out == reference([3] * 8, cycle_length, 1)
    assert peak[0] == concurrency  # read ahead: all open at once, never more
    assert active[0] == 0


async def test_unordered_interleave_yields_whatever_is_ready():
    async def gen(x: int):
        await asyncio.sleep(0.3 if x == 0 else 0.0)
        yield x

    p = af.range(4).interleave(
        lambda x: af.from_iterable(lambda: gen(x)), cycle_length=4, concurrency=4, ordered=False
    )
    out = await p.collect()
    assert sorted(out) == [0, 1, 2, 3] and out[-1] == 0


async def test_break_inside_concurrent_interleave_leaves_no_task():
    active, peak = [0], [0]
    p = af.range(100).interleave(
        lambda x: slow_source(x, active, peak), cycle_length=3, concurrency=5
    )
    async with p.aiter() as it:
        got = [await anext(it) for _ in range(4)]
    assert got == [(0, 0), (1, 0), (2, 0), (0, 1)]
    assert active[0] == 0
    others = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
    assert others == []


def test_interleave_bounds_what_it_holds():
    p = af.range(10).interleave(sub, cycle_length=2, concurrency=4)
    q = af.range(10).interleave(sub, cycle_length=2)
    assert p.max_inflight() > q.max_inflight() > af.range(10).max_inflight()


async def test_cancelling_the_consumer_closes_every_open_sub_pipeline():
    active, peak = [0], [0]
    p = af.range(10).interleave(
        lambda x: slow_source(x, active, peak), cycle_length=3, concurrency=4
    )

    async def consume() -> None:
        async for _ in p:
            pass

    t = asyncio.ensure_future(consume())
    for _ in range(1000):  # until sub-pipelines are open (a loaded machine starts late)
        if active[0] > 0:
            break
        await asyncio.sleep(0.01)
    assert active[0] > 0
    t.cancel()
    with pytest.raises(asyncio.CancelledError):
        await t
    await assert_no_pending_tasks()
    assert active[0] == 0
