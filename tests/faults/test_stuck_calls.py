"""A call that never returns (a stuck thread call, a FIFO without a writer), a slow source.

The error or the timeout reaches the consumer in time, and closing neither joins a thread
stuck in a call (it is abandoned, and the log says so) nor waits for a blocking source to
produce more than the item it is producing. Each "never returns" is released at the end
of the test so that the guard finds no thread left.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time

import pytest

import aioflow as af
from tests.faults.conftest import settle
from tests.faults.test_interrupts import _spawn

# Generous bounds for "promptly": before the fixes these took "until the call returned",
# which the tests make _RELEASE_AFTER seconds.
_RELEASE_AFTER = 30.0
_PROMPT = 10.0


@pytest.fixture
def stuck():
    """A thread-map function whose call on item 3 blocks until the test ends."""
    release = threading.Event()
    timer = threading.Timer(_RELEASE_AFTER, release.set)
    timer.start()

    def fn(x):
        if x == 3:
            release.wait()
        return x

    yield fn
    release.set()
    timer.cancel()
    timer.join()


def test_a_thread_call_past_its_timeout_fails_the_for_loop_and_close_abandons_it(stuck, caplog):
    caplog.set_level(logging.WARNING, logger="aioflow")
    p = af.range(10).map(stuck, executor="thread", concurrency=2, timeout=1)
    t0 = time.monotonic()
    with pytest.raises(af.StageTimeout), p.iter() as it:
        list(it)
    assert time.monotonic() - t0 < _PROMPT
    abandoned = [r for r in caplog.records if "abandoned" in r.getMessage()]
    assert len(abandoned) == 1, caplog.text
    assert "map(fn)" in abandoned[0].getMessage()


async def test_a_thread_call_past_its_timeout_fails_an_async_consumer_promptly(stuck):
    p = af.range(10).map(stuck, executor="thread", concurrency=2, timeout=1)
    t0 = time.monotonic()
    with pytest.raises(af.StageTimeout):
        async for _ in p:
            pass
    assert time.monotonic() - t0 < _PROMPT
    await settle()


def test_a_thread_call_that_never_returns_lets_close_return_after_a_next_timeout(stuck):
    with af.range(10).map(stuck, executor="thread", concurrency=1).iter(timeout=1) as it:
        assert [next(it) for _ in range(3)] == [0, 1, 2]
        with pytest.raises(af.NextTimeout):
            next(it)
        t0 = time.monotonic()
    assert time.monotonic() - t0 < _PROMPT


@pytest.fixture
def fifo(tmp_path):
    path = tmp_path / "fifo"
    os.mkfifo(path)
    yield str(path)
    # let a reader blocked in open() go: a writer that opens and closes (EOF)
    with contextlib.suppress(OSError):
        os.close(os.open(path, os.O_WRONLY | os.O_NONBLOCK))


@pytest.mark.parametrize("read", [af.read_lines, af.read_bytes], ids=["lines", "bytes"])
def test_a_reader_of_a_fifo_without_a_writer_closes_promptly_after_a_next_timeout(fifo, read):
    with read(fifo).iter(timeout=0.5) as it:
        with pytest.raises(af.NextTimeout):
            next(it)
        t0 = time.monotonic()
    assert time.monotonic() - t0 < _PROMPT


def test_a_process_whose_reader_waits_on_a_fifo_can_exit(fifo):
    proc = _spawn(
        f"""
        import aioflow as af
        with af.read_lines({fifo!r}).iter(timeout=0.5) as it:
            try:
                next(it)
            except af.NextTimeout:
                print("timed out", flush=True)
        """
    )
    try:
        out, err = proc.communicate(timeout=30)
    finally:
        proc.kill()
        proc.wait()
    assert out == "timed out\n" and proc.returncode == 0, err


def test_closing_a_slow_blocking_source_waits_for_the_item_in_progress_only():
    item_time = 1.5

    def slow():
        i = 0
        while True:
            if i >= 2:
                time.sleep(item_time)  # a blocking read: the loop waits with it
            yield i
            i += 1

    it = af.from_iterable(slow).map(lambda x: x).iter()
    try:
        assert next(it) == 0
    finally:
        t0 = time.monotonic()
        it.close()
        took = time.monotonic() - t0
    # before: 6-7 item-times (the source read one more item per step that closing took)
    assert took < 2.5 * item_time


async def test_an_async_reader_of_a_fifo_without_a_writer_closes_promptly(fifo):
    async with af.read_lines(fifo).aiter(timeout=0.5) as it:
        with pytest.raises(af.NextTimeout):
            await anext(it)
        t0 = time.monotonic()
    assert time.monotonic() - t0 < _PROMPT
    await settle()


def test_an_asyncio_program_whose_reader_waits_on_a_fifo_can_exit(fifo):
    proc = _spawn(
        f"""
        import asyncio
        import aioflow as af

        async def main():
            async with af.read_lines({fifo!r}).aiter(timeout=0.5) as it:
                try:
                    await anext(it)
                except af.NextTimeout:
                    print("timed out", flush=True)

        asyncio.run(main())
        """
    )
    try:
        out, err = proc.communicate(timeout=30)
    finally:
        proc.kill()
        proc.wait()
    assert out == "timed out\n" and proc.returncode == 0, err
