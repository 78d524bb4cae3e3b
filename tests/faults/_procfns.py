"""Functions the worker-process scenarios run in workers.

They live in this small module, not in the test modules: a function of a package module
(``faults.test_workers``) is pickled by reference, so each worker imports its module,
and this one imports nothing heavy.
"""

from __future__ import annotations

import ctypes
import os
import resource
import signal
import time
from collections import namedtuple

import numpy as np


class Boom(Exception):
    """A user exception with a constructor of its own (it must survive the pickle trip)."""

    def __init__(self, where: str, x: int) -> None:
        super().__init__(where, x)


def fail_at_20(x: int) -> int:
    if x == 20:
        raise Boom("process", x)
    return x


def fail_at_7(x: int) -> int:
    if x == 7:
        raise Boom("process", x)
    return x


def slow_fail_from_5(x: int) -> int:
    """Fails from item 5 on, slowly: a faster stage upstream has failed by then."""
    time.sleep(0.05)
    if x >= 5:
        raise Boom("process", x)
    return x


def slow_pid(x: int) -> tuple[int, int]:
    """(x, the worker's pid), slowly enough that batches are one item."""
    time.sleep(0.02)
    return x, os.getpid()


def segfault_at_3(x: int) -> int:
    time.sleep(0.02)
    if x == 3:
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))  # no core file in the repo
        ctypes.string_at(0)  # a real SIGSEGV: reads address 0
    return x


def hang_at_1(x: int) -> tuple[int, int]:
    if x == 1:
        time.sleep(3600)
    return x, os.getpid()


def hang_after_0(x: int) -> tuple[int, int]:
    if x > 0:
        time.sleep(3600)
    return x, os.getpid()


def big_array(x: int) -> np.ndarray:
    """4 MiB, carrying x and the worker's pid: results travel through shared memory, and
    writing them there is most of a call, so a run stopped early catches workers at it."""
    a = np.full((512, 1024), x, dtype=np.int64)
    a[0, 1] = os.getpid()
    return a


def kill_self_at_3(x: int) -> int:
    if x == 3:
        os.kill(os.getpid(), signal.SIGKILL)
    return x


def mb_array(x: int) -> np.ndarray:
    """1 MiB: quick to make, so many of them travel in one batch."""
    return np.full(1 << 17, x, dtype=np.int64)


Meta = namedtuple("Meta", "index name")


def sample(x: int) -> dict[str, object]:
    """A training sample: a 24 KiB image, a label, and a namedtuple of an index and a name."""
    return {"img": np.full((3, 32, 64), x, np.float32), "label": x % 10, "meta": Meta(x, f"s{x}")}


def sample_but_3_mod_7(x: int) -> dict[str, object]:
    if x % 7 == 3:
        raise Boom("process", x)
    return sample(x)


def sample_but_20(x: int) -> dict[str, object]:
    if x == 20:
        raise Boom("process", x)
    return sample(x)


def slow_sample(x: int) -> tuple[np.ndarray, int]:
    """30 ms of work: an array of x and the worker's pid."""
    time.sleep(0.03)
    return np.full(4, x), os.getpid()


def kib64(x: int) -> np.ndarray:
    """64 KiB: the least that travels in shared memory."""
    return np.full(8192, x, np.int64)


def ident(x: object) -> object:
    """The item itself: what crosses to a worker comes back."""
    return x
