"""A long chain of fused inline stages runs (no RecursionError), breaks and fails cleanly."""

from __future__ import annotations

import pytest

import aioflow as af
from tests.faults.conftest import settle


def _chain(n: int) -> af.Pipeline[int]:
    p = af.range(600)
    for i in range(n):
        p = p.map(lambda x: x + 1) if i % 4 else p.filter(lambda x: True).batch(1).unbatch()
    return p


LONG = 400  # stages; 248 were enough to overflow the recursion limit
EXPECTED = list(range(300, 900))  # 300 of the 400 stages add 1


def test_four_hundred_fused_stages_run_in_a_for_loop():
    with _chain(LONG).iter() as it:
        assert list(it) == EXPECTED
        assert str(it.stats())


async def test_four_hundred_fused_stages_run_in_an_async_for_loop():
    assert [x async for x in _chain(LONG)] == EXPECTED
    await settle()


def test_break_in_four_hundred_fused_stages_stops_every_task():
    for x in _chain(LONG):
        if x == 500:
            break


def test_an_error_at_the_end_of_four_hundred_fused_stages_reaches_the_consumer():
    def boom(x):
        if x == 800:
            raise ValueError(x)
        return x

    got = []
    with pytest.raises(ValueError):
        for x in _chain(LONG).map(boom):
            got.append(x)
    assert got == list(range(300, 800))
