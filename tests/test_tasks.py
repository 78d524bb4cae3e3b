"""Starting and ending tasks: cancel_and_wait."""

from __future__ import annotations

import asyncio

from aioflow._core.tasks import cancel_and_wait, new_task


async def test_cancel_and_wait_for_failed_and_cancelled_tasks_retrieves_their_errors():
    async def fail() -> None:
        raise ValueError("x")

    failed = asyncio.ensure_future(fail())
    cancelled = asyncio.ensure_future(asyncio.sleep(10))
    await asyncio.sleep(0)
    cancelled.cancel()
    await asyncio.sleep(0)
    assert failed.done() and cancelled.cancelled()
    await cancel_and_wait([failed])  # neither raises
    await cancel_and_wait([cancelled])
    assert failed._log_traceback is False  # retrieved: no "exception was never retrieved"


async def test_cancel_and_wait_to_the_finish_waits_for_all_through_a_cancellation():
    release = asyncio.Event()

    async def stubborn() -> None:
        try:
            await asyncio.sleep(10)
        finally:
            await release.wait()  # its cleanup takes a while

    t = asyncio.ensure_future(stubborn())
    await asyncio.sleep(0)
    closer = asyncio.ensure_future(cancel_and_wait([t], finish=True))
    await asyncio.sleep(0.01)
    closer.cancel()  # the closer is cancelled while it waits: it goes on waiting
    await asyncio.sleep(0.01)
    assert not closer.done()
    release.set()
    await asyncio.wait([closer])
    assert t.cancelled() and closer.cancelled()


def test_new_task_names_its_task_and_starts_it_on_the_given_loop():
    loop = asyncio.new_event_loop()
    try:
        task = new_task(asyncio.sleep(0, "done"), "probe", loop)
        assert task.get_name() == "aioflow:probe" and task.get_loop() is loop
        assert loop.run_until_complete(task) == "done"
    finally:
        loop.close()
