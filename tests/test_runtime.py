"""The Run: it starts every task, keeps per-run state, and closes all of it."""

from __future__ import annotations

import asyncio

import aioflow as af
from aioflow._core.channel import Channel
from aioflow._core.run import Run


async def test_a_run_keeps_the_tasks_it_starts_and_its_close_cancels_and_awaits_them():
    run = Run()
    task = run.start(asyncio.sleep(60), "sleeper")
    assert task in run.tasks and task.get_name() == "aioflow:sleeper"
    await run.aclose()
    assert task.cancelled() and not run.tasks


async def test_a_closing_task_is_kept_until_done_and_never_cancelled_by_the_run():
    run = Run()
    release = asyncio.Event()
    closer = run.start(release.wait(), "close", cancel=False)
    assert closer not in run.tasks
    run.cancel()
    await run.aclose()
    assert not closer.done()
    release.set()
    assert await closer is True


async def test_per_run_state_is_made_once_per_run():
    run, other = Run(), Run()
    a = run.per_run("k", dict)
    assert run.per_run("k", dict) is a and other.per_run("k", dict) is not a
    await run.aclose()
    await other.aclose()


async def _run_into_a_channel(p: af.Pipeline[int]) -> tuple[Run, Channel, list[int]]:
    """Run ``p`` into a consumer's channel as ``async for`` does; what came out."""
    run = Run(p)
    chan = Channel()
    run.start_output(p, chan)
    out = []
    while (chunk := await chan.get()) is not None:
        out.extend(chunk)
    return run, chan, out


async def test_prefetch_last_in_a_run_is_the_consumers_channel_with_its_bound():
    p = af.range(10).prefetch(3)
    run, chan, out = await _run_into_a_channel(p)
    assert out == list(range(10)) and (chan.max_chunks, chan.max_items) == (3, 3)
    assert run.meters[id(p._node)].channel is chan  # no hop: its channel is the consumer's
    await run.aclose()


async def test_a_concurrent_map_last_in_a_run_keeps_its_own_channel_and_the_hop():
    # (its read-ahead is its channel plus the consumer's: a last map must not lose it)
    p = af.range(10).map(lambda x: x, executor="thread", concurrency=2)
    run, chan, out = await _run_into_a_channel(p)
    assert out == list(range(10)) and run.meters[id(p._node)].channel is not chan
    await run.aclose()


def test_prefetch_last_under_for_keeps_its_channel_of_n_items_and_the_hop():
    # (the consumer's thread takes every chunk of its channel at once: bounded by n items,
    # that channel would cost a thread hand-off per chunk)
    p = af.range(1000).prefetch(3)
    with p.iter() as it:
        out = [next(it)]
        eng = it._engine
        assert eng is not None and eng.run is not None and eng.chan is not None
        own = eng.run.meters[id(p._node)].channel
        assert isinstance(own, Channel) and own is not eng.chan
        assert (own.max_chunks, own.max_items) == (3, 3)
        out += it
    s = it.stats()["prefetch(3)"]
    assert out == list(range(1000)) and s.items_out == 1000 and s.own_task
    assert s.queue_capacity == 3 and s.queue_peak is not None and 1 <= s.queue_peak <= 3


def test_a_concurrent_map_last_under_for_keeps_its_own_channel_and_the_hop():
    p = af.range(10).map(lambda x: x, executor="thread", concurrency=2)
    with p.iter() as it:
        out = [next(it)]
        eng = it._engine
        assert eng is not None and eng.run is not None
        own = eng.run.meters[id(p._node)].channel
        assert isinstance(own, Channel) and own is not eng.chan
        out += it
    assert out == list(range(10))
