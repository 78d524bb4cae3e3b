"""One catalogue of the ``Pipeline`` operators: for every public operator method, a small
runnable use on a pipeline of ints (``op(af.range(n))``).

The per-operator tables of the tests (``test_transforms.EVERY_OP``, ...) derive from it,
and ``test_catalogue`` fails when a public ``Pipeline`` method is in neither ``OPERATORS``
nor ``NOT_OPERATORS``: a new operator is tested by the tables once it is written here.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import Any

import aioflow as af


async def _aid(x: int) -> int:
    return x


async def _astage(items: AsyncIterator[int]) -> AsyncIterator[int]:
    async for x in items:
        yield x


Op = Callable[[af.Pipeline[Any]], af.Pipeline[Any]]

#: name -> an example use of it on ``af.range(n)``; each gives the same items every epoch but
#: those in ``PER_EPOCH``
OPERATORS: dict[str, Op] = {
    "map": lambda p: p.map(lambda x: x + 1),
    "filter": lambda p: p.filter(lambda x: x % 2),
    "flat_map": lambda p: p.flat_map(lambda x: [x, x]),
    "scan": lambda p: p.scan(0, lambda s, x: (s + x, s)),
    "enumerate": lambda p: p.enumerate(),
    "take": lambda p: p.take(30),
    "skip": lambda p: p.skip(3),
    "repeat": lambda p: p.repeat(2),
    "shard": lambda p: p.shard(2, 1),
    "prefetch": lambda p: p.prefetch(3),
    "pipe": lambda p: p.pipe(_astage),
    "apply": lambda p: p.apply(lambda q: q.map(str)),
    "batch": lambda p: p.batch(3, collate=list),
    "unbatch": lambda p: p.batch(3).unbatch().map(int),
    "rebatch": lambda p: p.batch(3, collate=list).rebatch(2),
    "window": lambda p: p.window(3, shift=2),
    "padded_batch": lambda p: (
        p.map(lambda x: [x] * (x % 3 + 1)).padded_batch(2).map(lambda b: b.tolist())
    ),
    "bucket_by_length": lambda p: (
        p.map(lambda x: [x] * (x % 3 + 1))
        .bucket_by_length(len, [2], [2, 2])
        .map(lambda b: b.tolist())
    ),
    "group_by": lambda p: p.group_by(lambda x: x % 2, size=2),
    "sort_by": lambda p: p.sort_by(lambda x: -x, buffer_size=4),
    "window_by_time": lambda p: p.window_by_time(lambda x: x % 7 + x, 5, max_delay=3).map(
        lambda w: (w.start, w.items)
    ),
    # bursts of 12 items, 11 apart: each key's session (3 apart, gap 4) closes at the next
    # burst, so sessions come out all along the stream, not only at its end
    "sessions": lambda p: p.sessions(lambda x: x + x // 12 * 10, 4, by=lambda x: x % 3).map(
        lambda w: (w.key, w.start, w.items)
    ),
    "asof_join": lambda p: p.asof_join(af.range(0, 60, 7), on=lambda x: x),
    "shuffle": lambda p: p.shuffle(4, seed=7, reshuffle_each_iteration=False),
    "rejection_resample": lambda p: p.rejection_resample(lambda x: x % 2, [0.5, 0.5], seed=1),
    "interleave": lambda p: p.interleave(lambda x: af.range(x % 3), cycle_length=2),
    "partition_by": lambda p: p.partition_by(lambda x: x % 2, 2, lambda q: q.map(_aid)),
    "cache": lambda p: p.cache(),
    "pin_memory": lambda p: p.pin_memory(),
}

#: uses that need more than the standard library (not in the generic tables)
NEEDS_EXTRA: dict[str, str] = {"distribute": "a dask.distributed client", "pin_memory": "torch"}

#: public methods that are not operators (they consume or describe a pipeline)
NOT_OPERATORS = {"aiter", "iter", "close", "collect", "to_list", "cardinality", "max_inflight"}

#: draws anew each epoch (its items differ between epochs)
PER_EPOCH = {"rejection_resample"}

#: yields the items in an order that may differ between runs
UNORDERED = {"partition_by"}


def operators(*, exclude: set[str] = frozenset()) -> dict[str, Op]:  # type: ignore[assignment]
    """The catalogue without ``exclude`` and without those that need extras."""
    return {k: v for k, v in OPERATORS.items() if k not in exclude and k not in NEEDS_EXTRA}
