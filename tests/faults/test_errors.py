"""Exceptions: in the consumer's loop body, in each kind of stage, in a source, two at once."""

from __future__ import annotations

import asyncio
import time

import pytest

import aioflow as af
from tests.faults.conftest import settle


class Boom(Exception):
    pass


def test_an_exception_in_the_sync_loop_body_passes_through_unchanged():
    err = Boom("body")
    t0 = time.monotonic()
    with pytest.raises(Boom) as info:
        for x in af.range(10**8).map(lambda x: x).prefetch(4):
            if x == 10:
                raise err
    assert info.value is err and not getattr(err, "__notes__", None)
    assert time.monotonic() - t0 < 5


async def test_an_exception_in_the_async_loop_body_passes_through_unchanged():
    err = Boom("body")
    with pytest.raises(Boom) as info:
        async for x in af.range(10**8).map(lambda x: x).prefetch(4):
            if x == 10:
                raise err
    assert info.value is err and not getattr(err, "__notes__", None)
    await settle()


def _inline(x):
    if x == 50:
        raise Boom("inline", x)
    return x


async def _async(x):
    await asyncio.sleep(0)
    if x == 50:
        raise Boom("async", x)
    return x


def _thread(x):
    if x == 50:
        raise Boom("thread", x)
    return x


STAGES = {
    "inline": {"fn": _inline},
    "async": {"fn": _async, "concurrency": 8},
    "thread": {"fn": _thread, "executor": "thread", "concurrency": 4},
}


@pytest.mark.parametrize("kw", STAGES.values(), ids=STAGES.keys())
def test_a_user_function_raising_reaches_the_consumer_as_itself(kw):
    kw = dict(kw)
    fn = kw.pop("fn")
    got = []
    t0 = time.monotonic()
    with pytest.raises(Boom) as info:
        for x in af.range(1000).map(fn, **kw).batch(10, collate=list).unbatch():
            got.append(x)
    assert time.monotonic() - t0 < 5
    assert info.value.args[1] == 50
    assert any("map(" in n and "at item 50" in n for n in info.value.__notes__)
    assert got == list(range(50)), "every complete batch before the failure is delivered"


@pytest.mark.parametrize("kw", STAGES.values(), ids=STAGES.keys())
async def test_a_user_function_raising_reaches_an_async_consumer(kw):
    kw = dict(kw)
    fn = kw.pop("fn")
    got = []
    with pytest.raises(Boom):
        async for x in af.range(1000).map(fn, **kw):
            got.append(x)
    assert got == list(range(50))
    await settle()


def test_a_source_raising_after_some_items_delivers_them_all_first():
    def gen():
        yield from range(300)
        raise Boom("source")

    got = []
    with pytest.raises(Boom):
        for x in af.from_iterable(gen).map(lambda x: x).prefetch(2):
            got.append(x)
    assert got == list(range(300))


async def test_an_async_source_raising_after_some_items_delivers_them_all_first():
    async def agen():
        for i in range(30):
            yield i
        raise Boom("async source")

    got = []
    with pytest.raises(Boom):
        async for x in af.from_iterable(agen):
            got.append(x)
    assert got == list(range(30))
    await settle()


def test_two_stages_failing_at_once_surface_the_first_one_in_stream_order():
    def first(x):
        if x == 20:
            raise Boom("upstream", x)
        return x

    def second(x):
        if x == 30:
            raise Boom("downstream", x)
        return x

    p = af.range(100).map(first, executor="thread", concurrency=2).map(second)
    with pytest.raises(Boom) as info:
        p.to_list()
    assert info.value.args == ("upstream", 20)


def test_two_concurrent_stages_failing_surface_one_error_and_stop_everything():
    async def a(x):
        if x >= 10:
            raise Boom("a", x)
        return x

    async def b(x):
        if x >= 5:
            raise Boom("b", x)
        return x

    p = af.range(100).map(a, concurrency=4).map(b, concurrency=4)
    with pytest.raises(Boom) as info:
        p.to_list()
    assert info.value.args == ("b", 5)
