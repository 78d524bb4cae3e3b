"""The run's thread pools (``_threads.DaemonPool``): what closing waits for, and what not."""

from __future__ import annotations

import asyncio
import logging
import threading
import time

import pytest

from aioflow._core.threads import DaemonPool


async def test_a_thread_that_could_not_start_is_not_waited_for_nor_reported(monkeypatch, caplog):
    # At interpreter exit a pipeline task may still submit a call while the run closes,
    # and Python refuses the new thread; closing must not count it as a call in progress.
    pool = DaemonPool(2, "t", what="stage 'demo'")
    assert await asyncio.wrap_future(pool.submit(lambda: 1)) == 1
    gate = threading.Event()
    busy = pool.submit(gate.wait)  # the one worker is now busy: the next call wants another

    def refuse(self: threading.Thread) -> None:
        raise RuntimeError("can't create new thread at interpreter shutdown")

    monkeypatch.setattr(threading.Thread, "start", refuse)
    with pytest.raises(RuntimeError, match="interpreter shutdown"):
        pool.submit(lambda: 2)
    monkeypatch.undo()
    gate.set()
    await asyncio.wrap_future(busy)
    t0 = time.monotonic()
    with caplog.at_level(logging.WARNING, logger="aioflow"):
        await pool.aclose()
    assert time.monotonic() - t0 < 0.5
    assert "abandoned" not in caplog.text


async def test_a_call_still_running_after_the_grace_is_abandoned_and_said_once(caplog):
    pool = DaemonPool(1, "t", what="stage 'demo'")
    gate = threading.Event()
    fut = pool.submit(gate.wait)
    with caplog.at_level(logging.WARNING, logger="aioflow"):
        await pool.aclose(grace=0.1)
    assert caplog.text.count("stage 'demo': abandoned 1 thread(s)") == 1
    gate.set()
    assert fut.result(timeout=5) is True
