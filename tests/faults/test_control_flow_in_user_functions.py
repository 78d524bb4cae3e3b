"""A user function raising what the machinery itself uses: CancelledError, StopIteration.

Each must reach the consumer as an error (``af.StageError`` naming the stage and item,
the original as its cause), never be taken for the run's cancellation or the stream's
end: no hang, no silently short stream.
"""

from __future__ import annotations

import asyncio

import pytest

import aioflow as af
from tests.faults.conftest import settle

DEADLINE = 20.0  # "does not hang": generous under load


async def _cancelled_call(x):
    if x == 5:
        fut = asyncio.get_running_loop().create_future()
        fut.cancel()
        await fut  # someone else cancelled what we awaited: CancelledError in *our* code
    return x


async def _cancelled_source():
    for i in range(10):
        yield i
    fut = asyncio.get_running_loop().create_future()
    fut.cancel()
    await fut


CANCELLING = {
    "async-map": lambda: af.range(20).map(_cancelled_call, concurrency=4),
    "async-map-unordered": lambda: af.range(20).map(_cancelled_call, concurrency=4, ordered=False),
    "async-source": lambda: af.from_iterable(_cancelled_source),
    "async-source-into-map": lambda: af.from_iterable(_cancelled_source).map(
        _cancelled_call, concurrency=2
    ),
}


@pytest.mark.parametrize("make", CANCELLING.values(), ids=CANCELLING.keys())
async def test_a_user_cancelled_error_reaches_an_async_consumer_as_an_error(make):
    got = []
    async with asyncio.timeout(DEADLINE):
        with pytest.raises(af.StageError) as info:
            async for x in make():
                got.append(x)
    assert isinstance(info.value.__cause__, asyncio.CancelledError)
    assert "CancelledError" in str(info.value)
    assert asyncio.current_task().cancelling() == 0  # the consumer was not cancelled
    await settle()


@pytest.mark.parametrize("make", CANCELLING.values(), ids=CANCELLING.keys())
def test_a_user_cancelled_error_reaches_a_sync_consumer_as_an_error(make):
    with make().iter(timeout=DEADLINE) as it, pytest.raises(af.StageError) as info:
        list(it)
    assert isinstance(info.value.__cause__, asyncio.CancelledError)


async def test_a_user_cancelled_error_can_be_skipped_like_any_failure():
    out = [x async for x in af.range(20).map(_cancelled_call, concurrency=4, on_error="skip")]
    assert out == [x for x in range(20) if x != 5]
    await settle()


def _stop_at_700(x):
    if x == 700:
        raise StopIteration  # e.g. next() on an empty lookup
    return x


def _stop_at_last(x):
    if x == 700:
        raise StopIteration
    return True


STOPPING = {
    "map": lambda: af.range(1000).map(_stop_at_700),
    "filter": lambda: af.range(1000).filter(_stop_at_700),
    "filter-on-a-chunk's-last-item": lambda: af.range(701).filter(_stop_at_last),
    "sort_by-buffer": lambda: af.range(1000).sort_by(_stop_at_700, buffer_size=10),
    "sort_by-external": lambda: af.range(1000).sort_by(_stop_at_700),
    "sort_by-external-spilling": lambda: af.range(1000).sort_by(_stop_at_700, max_in_memory=100),
    "thread-map": lambda: af.range(1000).map(_stop_at_700, executor="thread", concurrency=2),
    "sync-fn-concurrent-map": lambda: af.range(1000).map(_stop_at_700, concurrency=2),
    "flat_map": lambda: af.range(1000).flat_map(lambda x: [_stop_at_700(x)]),
    "scan": lambda: af.range(1000).scan(0, lambda s, x: (s, _stop_at_700(x))),
    "group_by": lambda: af.range(1000).group_by(_stop_at_700, size=3),
    "bucket_by_length": lambda: af.range(1000).bucket_by_length(_stop_at_700, [500], [4, 4]),
    "rejection_resample": lambda: af.range(1000).rejection_resample(
        lambda x: _stop_at_700(x) % 2, [0.5, 0.5], seed=0
    ),
    "partition_by-key": lambda: af.range(1000).partition_by(
        lambda x: _stop_at_700(x) % 2, 2, lambda p: p
    ),
    "interleave-fn": lambda: af.range(1000).interleave(
        lambda x: af.from_iterable([_stop_at_700(x)]), cycle_length=2
    ),
}


@pytest.mark.parametrize("make", STOPPING.values(), ids=STOPPING.keys())
def test_a_user_stop_iteration_is_an_error_never_an_early_end(make):
    with make().iter(timeout=DEADLINE) as it, pytest.raises(af.StageError) as info:
        list(it)
    assert "StopIteration" in str(info.value)
    assert "700" in str(info.value) or any("700" in n for n in info.value.__notes__)


@pytest.mark.parametrize("make", STOPPING.values(), ids=STOPPING.keys())
def test_a_user_stop_iteration_is_the_cause_of_its_stage_error(make):
    with make().iter(timeout=DEADLINE) as it, pytest.raises(af.StageError) as info:
        list(it)
    assert isinstance(info.value.__cause__, StopIteration)


def test_a_user_stop_iteration_can_be_skipped_like_any_failure():
    assert af.range(1000).map(_stop_at_700, on_error="skip").to_list() == [
        x for x in range(1000) if x != 700
    ]
    assert af.range(1000).filter(_stop_at_700, on_error="skip").to_list() == [
        x for x in range(1, 1000) if x != 700
    ]


def test_a_user_stop_iteration_in_a_callers_executor_batch_is_an_error():
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(2) as ex:
        p = af.range(1000).map(_stop_at_700, executor=ex, concurrency=2)
        with p.iter(timeout=DEADLINE) as it, pytest.raises(af.StageError) as info:
            list(it)
    assert "StopIteration" in str(info.value)
    assert any("700" in n for n in info.value.__notes__) or "700" in str(info.value)


def _collate_stopping_at_700(batch):
    return [_stop_at_700(x) for x in batch]


@pytest.mark.parametrize("size", [10, 7])  # a last short batch (7) goes through the same
def test_a_user_stop_iteration_in_a_batch_collate_is_an_error_after_the_batches_before(size):
    seen = []
    p = af.range(1000).batch(size, collate=_collate_stopping_at_700)
    with p.iter(timeout=DEADLINE) as it, pytest.raises(af.StageError) as info:
        for b in it:
            seen.extend(b)
    assert "StopIteration" in str(info.value)
    assert seen == list(range(700 // size * size))  # every batch before the failing one
    p = af.range(701).batch(1000, collate=_collate_stopping_at_700)  # the remainder only
    with p.iter(timeout=DEADLINE) as it, pytest.raises(af.StageError):
        list(it)


def _cancel_at_5(x):
    if x == 5:
        raise asyncio.CancelledError("raised by the function")
    return x


class _StopAt700Seq:
    def __len__(self):
        return 1000

    def __getitem__(self, i):
        return _stop_at_700(i)


@pytest.mark.parametrize("batch", [None, 4], ids=["items", "stacked-batch"])
@pytest.mark.parametrize("fn", [_stop_at_700, _cancel_at_5], ids=["stop", "cancel"])
def test_a_control_flow_exception_in_a_process_worker_arrives_as_a_stage_error(fn, batch):
    """Issue 27 (9): a StopIteration from a process worker ended as RuntimeError("async
    generator raised StopIteration"); a CancelledError arrived without its cause."""
    with af.range(1000).map(fn, executor="process") as p:
        q = p if batch is None else p.batch(batch)
        with q.iter(timeout=DEADLINE) as it, pytest.raises(af.StageError) as info:
            list(it)
    cause = info.value.__cause__
    assert type(cause) is (StopIteration if fn is _stop_at_700 else asyncio.CancelledError)
    assert any("remote traceback" in n for n in getattr(cause, "__notes__", []))


def test_a_stop_iteration_from_a_random_access_sources_getitem_is_an_error():
    # it ended the epoch silently after 700 items (the reader is a builtin map)
    got = []
    with pytest.raises(af.StageError) as info:
        for x in af.from_source(_StopAt700Seq()):
            got.append(x)
    assert got == list(range(700)) and isinstance(info.value.__cause__, StopIteration)
    assert "700" in str(info.value)
