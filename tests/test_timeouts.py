"""The one timeout of a stage's calls (async, thread and process calls share it)."""

from __future__ import annotations

import asyncio

import pytest

import aioflow as af
from aioflow._core.timeouts import timed


async def test_a_call_past_its_timeout_fails_at_once_and_its_work_is_cancelled():
    inner = asyncio.get_running_loop().create_future()
    with pytest.raises(af.StageTimeout, match=r"the call on item 7 took longer than 0\.05 s"):
        await timed(inner, 0.05, "map(f)", 7)
    assert inner.cancelled()


async def test_a_call_in_time_gives_its_result_and_cancelling_it_cancels_its_work():
    inner = asyncio.get_running_loop().create_future()
    call = timed(inner, 10, "map(f)", 0)
    inner.set_result([1])
    assert await call == [1]
    other = asyncio.get_running_loop().create_future()
    timed(other, 10, "map(f)", 1).cancel()
    await asyncio.sleep(0)
    assert other.cancelled()
