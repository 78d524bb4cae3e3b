"""af.AUTOTUNE: concurrency and prefetch sizes chosen while the run goes."""

from __future__ import annotations

import asyncio
import os
import time

import pytest

import aioflow as af
from aioflow._core.autotune import HillClimber, Limiter, cpu_budget, resolve_concurrency


# -- the climber on a model of a stage ----------------------------------------------------
def _drive(climber: HillClimber, rate_of, windows: int = 60) -> None:
    """Feed the climber windows whose rate is ``rate_of(limit)``."""
    for _ in range(windows):
        climber._step(rate_of(climber.limit))


def test_the_climber_doubles_up_to_the_cap_while_the_rate_grows():
    c = HillClimber(Limiter(1), cap=64)
    _drive(c, lambda n: 100.0 * n)
    assert c.limit == 64


def test_the_climber_settles_at_the_knee_of_a_saturating_stage():
    c = HillClimber(Limiter(1), cap=256)
    _drive(c, lambda n: 100.0 * min(n, 24))
    assert 16 <= c.limit <= 32
    assert c.best_rate >= 100.0 * 16


def test_the_climber_backs_off_a_limit_that_made_things_slower():
    c = HillClimber(Limiter(1), cap=256)
    _drive(c, lambda n: 100.0 * n if n <= 8 else 100.0 * 8 / (n / 8))
    assert c.limit == 8


async def test_the_limiter_can_be_raised_and_lowered_while_used():
    lim = Limiter(1)
    await lim.acquire()
    waiter = asyncio.ensure_future(lim.acquire())
    await asyncio.sleep(0)
    assert not waiter.done()
    lim.set_limit(2)
    await asyncio.sleep(0)
    assert waiter.done() and lim.in_use == 2
    lim.set_limit(1)
    lim.release()
    third = asyncio.ensure_future(lim.acquire())
    await asyncio.sleep(0)
    assert not third.done()  # 1 in use, limit 1
    lim.release()
    await asyncio.sleep(0)
    assert third.done()
    lim.release()


def test_autotune_caps_follow_the_kind_of_calls():
    assert resolve_concurrency(5, None) == 5
    assert resolve_concurrency(af.AUTOTUNE, "process") == cpu_budget()
    assert resolve_concurrency(af.AUTOTUNE, "thread") == 64
    assert resolve_concurrency(af.AUTOTUNE, None) == 256


# -- on real runs ------------------------------------------------------------------------
async def _io(x: int) -> int:
    await asyncio.sleep(0.01)
    return x


def _second_half_rate(p: af.Pipeline[int], n: int) -> tuple[float, af.RunStats]:
    """Items/s over the second half of a run (after any ramp-up), and its stats."""
    with p.iter() as it:
        t_half = 0.0
        for i, x in enumerate(it):
            assert x == i
            if i == n // 2:
                t_half = time.perf_counter()
        rate = (n - n // 2 - 1) / (time.perf_counter() - t_half)
        return rate, it.stats()


def test_autotune_on_an_io_bound_stage_comes_within_25_percent_of_the_best_fixed_one():
    n = 6000
    best = 0.0
    for c in (8, 32, 128):  # the sweep a user would do by hand
        rate, _ = _second_half_rate(af.range(n).map(_io, concurrency=c), n)
        best = max(best, rate)
    rates = []
    for _ in range(2):  # best of two, as for the sweep's best: the machine is shared
        rate, stats = _second_half_rate(af.range(n).map(_io, concurrency=af.AUTOTUNE), n)
        rates.append(rate)
        chosen = stats["map(_io)"].concurrency
        assert chosen is not None and chosen > 8, "the stage's chosen value is in the stats"
    assert max(rates) >= 0.75 * best, (rates, best)


def _cpu(x: int) -> int:
    s = 0
    for i in range(20_000):
        s += i * x % 7
    return s


def test_autotune_on_a_cpu_bound_process_stage_never_exceeds_the_core_count(no_leaks):
    p = af.range(200).map(_cpu, executor="process", concurrency=af.AUTOTUNE)
    with p.iter() as it:
        out = list(it)
        chosen = it.stats()["map(_cpu)"].concurrency
    assert out == [_cpu(i) for i in range(200)]
    assert chosen is not None and chosen <= (os.cpu_count() or 1)


def test_autotune_on_a_blocking_thread_stage_grows_past_the_core_count(no_leaks):
    # threads that wait (IO) gain from more of them than cores: the climber finds that
    def io(x: int) -> int:
        time.sleep(0.005)
        return x

    p = af.range(3000).map(io, executor="thread", concurrency=af.AUTOTUNE)
    with p.iter() as it:
        assert list(it) == list(range(3000))
        chosen = it.stats()["map(io)"].concurrency
    assert chosen is not None and cpu_budget() < chosen <= 64


async def test_prefetch_autotune_grows_its_buffer_for_a_bursty_consumer():
    def bursty():
        for i in range(20_000):
            if i % 2000 == 0:
                time.sleep(0.01)  # the producer pauses now and then
            yield i

    p = af.from_iterable(bursty).prefetch(af.AUTOTUNE)
    async with p.aiter() as it:
        out = []
        async for x in it:
            out.append(x)
            if x % 3000 == 0:
                await asyncio.sleep(0.01)  # ... and so does the consumer
        stats = it.stats()
    assert out == list(range(20_000))
    cap = stats["prefetch(AUTOTUNE)"].queue_capacity
    assert cap is not None and 256 < cap <= 4096


def test_prefetch_autotune_bound_is_in_max_inflight():
    base = af.range(10).max_inflight()
    assert af.range(10).prefetch(af.AUTOTUNE).max_inflight() >= base + 4096


@pytest.mark.parametrize("bad", [-2, 0.5])
def test_autotune_is_the_only_negative_concurrency(bad):
    with pytest.raises(af.PipelineError):
        af.range(3).map(str, concurrency=bad)
