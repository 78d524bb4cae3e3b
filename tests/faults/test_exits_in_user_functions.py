"""``sys.exit()`` or ``KeyboardInterrupt`` raised inside a user function under ``for``.

The consumer gets that exception (a script exits as it asked), and the run is gone:
no thread, no pending task, nothing logged by asyncio ("Task was destroyed ...").
"""

from __future__ import annotations

import asyncio
import sys

import pytest

import aioflow as af

DEADLINE = 20.0


def _exits(x):
    if x == 50:
        sys.exit(3)
    return x


def _interrupted(x):
    if x == 50:
        raise KeyboardInterrupt
    return x


async def _async_exits(x):
    await asyncio.sleep(0)
    return _exits(x)


async def _async_interrupted(x):
    await asyncio.sleep(0)
    return _interrupted(x)


KINDS = {
    "inline": lambda fn, afn: af.range(1000).map(fn),
    "inline-then-prefetch": lambda fn, afn: af.range(1000).map(fn).prefetch(2),
    "thread": lambda fn, afn: af.range(1000).map(fn, executor="thread", concurrency=2),
    "async": lambda fn, afn: af.range(1000).map(afn, concurrency=4),
    "async-then-inline": lambda fn, afn: af.range(1000).map(afn, concurrency=4).map(abs),
    "flat_map": lambda fn, afn: af.range(1000).flat_map(lambda x: [fn(x)]).prefetch(2),
}


@pytest.mark.parametrize("kind", KINDS.values(), ids=KINDS.keys())
def test_sys_exit_in_a_user_function_reaches_the_for_loop(kind):
    got = []
    it = kind(_exits, _async_exits).iter(timeout=DEADLINE)
    with pytest.raises(SystemExit) as info, it:
        for x in it:
            got.append(x)
    assert info.value.code == 3
    assert got == list(range(len(got))) and len(got) <= 50


@pytest.mark.parametrize("kind", KINDS.values(), ids=KINDS.keys())
def test_keyboard_interrupt_in_a_user_function_reaches_the_for_loop(kind):
    it = kind(_interrupted, _async_interrupted).iter(timeout=DEADLINE)
    with pytest.raises(KeyboardInterrupt), it:
        for _ in it:
            pass


def test_sys_exit_in_a_user_function_under_a_plain_for_leaves_nothing_behind():
    with pytest.raises(SystemExit):
        for _ in af.range(1000).map(_async_exits, concurrency=4).map(abs):
            pass
    assert af.range(3).map(_async_exits, concurrency=2).to_list() == [0, 1, 2]
