"""The guard every fault scenario runs under.

After each scenario: no task of the run is pending (async tests check it themselves with
``settle()``), no thread or child process of it remains, open file descriptors are back to
the baseline, and nothing was logged by asyncio ("Task was destroyed but it is pending",
"exception was never retrieved"). ResourceWarning and "coroutine ... was never awaited"
fail the test through pytest's ``filterwarnings = error`` and its unraisable-exception
hook.
"""

from __future__ import annotations

import gc
import logging
from collections.abc import Iterator

import pytest

from tests.conftest import _snapshot, assert_no_pending_tasks, wait_no_leaks

__all__ = ["settle"]


@pytest.fixture(autouse=True)
def fault_guard(caplog: pytest.LogCaptureFixture) -> Iterator[None]:
    caplog.set_level(logging.WARNING, logger="asyncio")
    before = _snapshot()
    yield
    gc.collect()
    wait_no_leaks(before, deadline=5.0)
    noise = [r.getMessage() for r in caplog.records if r.name == "asyncio"]
    assert not noise, noise


async def settle(deadline: float = 2.0) -> None:
    """In an async scenario: every task but the test's own is done within ``deadline``."""
    await assert_no_pending_tasks(deadline)
