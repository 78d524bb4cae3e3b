"""Sources: from_iterable, from_dataflow, range."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

import aioflow as af


def test_from_iterable_takes_lists_tuples_strings_and_arrays():
    assert af.from_iterable([1, 2]).to_list() == [1, 2]
    assert af.from_iterable((3,)).to_list() == [3]
    assert af.from_iterable("ab").to_list() == ["a", "b"]
    rows = af.from_iterable(np.arange(6).reshape(3, 2)).to_list()
    assert [r.tolist() for r in rows] == [[0, 1], [2, 3], [4, 5]]
    assert len(af.from_iterable([1, 2, 3])) == 3


def test_from_iterable_of_empty_input_is_empty():
    assert af.from_iterable([]).to_list() == []
    assert af.from_iterable([]).map(str).batch(3).to_list() == []


def test_from_iterable_calls_a_callable_afresh_per_epoch():
    calls = []

    def gen():
        calls.append(1)
        yield from range(3)

    p = af.from_iterable(gen)
    assert p.to_list() == [0, 1, 2]
    assert p.to_list() == [0, 1, 2]
    assert len(calls) == 2


def test_from_iterable_takes_an_async_iterable():
    async def agen():
        for i in range(3):
            await asyncio.sleep(0)
            yield i

    assert af.from_iterable(agen).to_list() == [0, 1, 2]


def test_from_iterable_of_a_large_fast_iterable_keeps_order():
    assert af.from_iterable(range(100_000)).to_list() == list(range(100_000))


def test_from_iterable_rejects_non_iterables():
    with pytest.raises(af.PipelineError, match="iterable"):
        af.from_iterable(42)  # type: ignore[arg-type]


def test_from_iterable_callable_returning_a_non_iterable_is_a_clear_error():
    with pytest.raises(af.PipelineError, match="expected an iterable"):
        af.from_iterable(lambda: 42).to_list()


def test_a_source_raising_delivers_every_item_before_the_error():
    class Boom(Exception):
        pass

    def gen():
        yield from range(5)
        raise Boom("source")

    got = []
    with pytest.raises(Boom) as info:
        for x in af.from_iterable(gen).map(lambda x: x):
            got.append(x)
    assert got == [0, 1, 2, 3, 4]
    assert "from_iterable" in info.value.__notes__[0]
    assert "at item 5" in info.value.__notes__[0]


def test_from_dataflow_calls_reset_state_once_per_run_and_uses_len():
    class DF:
        resets = 0

        def reset_state(self):
            DF.resets += 1

        def __iter__(self):
            return iter([1, 2, 3])

        def __len__(self):
            return 3

    p = af.from_dataflow(DF())
    assert len(p) == 3
    assert p.to_list() == [1, 2, 3]
    assert p.to_list() == [1, 2, 3]
    assert DF.resets == 2


def test_from_dataflow_without_reset_state_or_len():
    class DF:
        def __iter__(self):
            yield from "xy"

    p = af.from_dataflow(DF())
    assert p.cardinality() == af.UNKNOWN
    assert p.to_list() == ["x", "y"]


def test_from_dataflow_rejects_objects_without_iter():
    with pytest.raises(af.PipelineError):
        af.from_dataflow(object())


def test_range_is_like_builtin_range():
    for args in [(0,), (5,), (2, 9), (2, 9, 3), (10, 0, -3), (5, 5)]:
        assert af.range(*args).to_list() == list(range(*args))
        assert len(af.range(*args)) == len(range(*args))
    assert af.range(1000).to_list() == list(range(1000))


async def test_a_sync_source_makes_its_chunks_in_the_task_that_reads_it():
    # a source that never awaits gains nothing from a task of its own, and costs a hop
    # per chunk (issue 27, 7): it is fused into its reader's task; an async one is not
    import asyncio

    seen: list[tuple[str, object]] = []

    def note(kind, x):
        seen.append((kind, asyncio.current_task()))
        return x

    def gen():
        for i in range(600):
            yield note("source", i)

    async def agen():
        for i in range(600):
            yield note("source", i)

    class Seq:
        def __len__(self):
            return 600

        def __getitem__(self, i):
            return note("source", i)

    cases = [
        (af.from_iterable(gen), True),
        (af.from_source(Seq()), True),
        (af.from_iterable(agen), False),
    ]
    for src, together in cases:
        seen.clear()
        assert [x async for x in src.map(lambda x: note("map", x))] == list(range(600))
        sources = {t for k, t in seen if k == "source"}
        maps = {t for k, t in seen if k == "map"}
        assert len(sources) == len(maps) == 1
        assert (sources == maps) is together


@pytest.mark.parametrize("kind", ["range", "list", "generator", "from_source"])
async def test_a_fused_sync_source_still_lets_the_loop_run(kind):
    # fused into its reader's task, nothing in the chain waits: a stage that reads without
    # emitting would hold the loop for the whole input, and no timeout could come in
    import asyncio
    import time

    n = 3 * 10**7

    def gen():
        yield from range(n)

    src = {
        "range": lambda: af.range(n),
        "list": lambda: af.from_iterable([0] * (5 * 10**6)),
        "generator": lambda: af.from_iterable(gen),
        "from_source": lambda: af.from_source(range(n)),
    }[kind]()
    async with src.filter(lambda x: str(x) == "-").aiter() as it:
        t0 = time.perf_counter()
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(it.__anext__(), 0.1)
        assert time.perf_counter() - t0 < 0.5
