"""Every stage that runs user code item by item, or reads a user's iterator: the items
before the failing one come out first, then the same exception with one note naming the
stage and the item's position, its own cause kept."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

import aioflow as af


class Boom(Exception):
    pass


def _bad(x: int) -> int:
    if x == 70:
        raise Boom(x) from KeyError(x)  # (a cause of its own, kept on the way)
    return x


def _gen():
    for i in range(100):
        _bad(i)
        yield i


async def _agen():
    for i in range(100):
        _bad(i)
        yield i


async def _pipe_stage(items):
    async for x in items:
        yield _bad(x)


def _fail_partitions(p: af.Pipeline[Any]) -> af.Pipeline[Any]:
    raise Boom("fn") from KeyError("fn")


def _object_at(k: int) -> Callable[[int], Any]:
    return lambda x: [x] if x != k else object()  # padding cannot collate it with lists


# name: (pipeline, exception type, items (or batches) out before it, its note)
SITES: dict[str, tuple[Callable[[], af.Pipeline[Any]], type, int, str]] = {
    "sync-source": (lambda: af.from_iterable(_gen), Boom, 70, "'from_iterable' at item 70"),
    "async-source": (lambda: af.from_iterable(_agen), Boom, 70, "'from_iterable' at item 70"),
    "pipe": (lambda: af.range(100).pipe(_pipe_stage), Boom, 70, "'pipe(_pipe_stage)' at item 70"),
    "flat_map": (
        lambda: af.range(100).flat_map(lambda x: [_bad(x)]),
        Boom,
        70,
        "'flat_map(<lambda>)' at item 70",
    ),
    "scan": (
        lambda: af.range(100).scan(0, lambda s, x: (s, _bad(x))),
        Boom,
        70,
        "'scan(<lambda>)' at item 70",
    ),
    "group_by": (lambda: af.range(100).group_by(_bad, size=3), Boom, 0, "'group_by' at item 70"),
    "bucket_by_length-length_fn": (
        lambda: af.range(100).bucket_by_length(_bad, [50], [4, 4]),
        Boom,
        17,
        "'bucket_by_length' at item 70",
    ),
    "bucket_by_length-collate": (
        lambda: af.range(100).map(_object_at(70)).bucket_by_length(lambda x: 1, [50], [4, 4]),
        af.PipelineError,
        17,
        "'bucket_by_length' at item 71",
    ),
    "bucket_by_length-last-collate": (
        lambda: af.range(10).map(_object_at(9)).bucket_by_length(lambda x: 1, [50], [4, 4]),
        af.PipelineError,
        2,
        "'bucket_by_length' at item 2",
    ),
    "sort_by-buffer": (
        lambda: af.range(100).sort_by(_bad, buffer_size=10),
        Boom,
        70,
        "'sort_by(10)' at item 70",
    ),
    "sort_by-buffer-incomparable": (
        lambda: af.range(100).map(lambda x: x if x != 70 else "s").sort_by(
            lambda x: x, buffer_size=1000
        ),
        TypeError,
        0,
        "'sort_by(1000)' at item 100",
    ),
    "sort_by-external": (lambda: af.range(100).sort_by(_bad), Boom, 0, "'sort_by' at item 70"),
    "sort_by-external-incomparable": (
        lambda: af.range(100).map(lambda x: x if x != 70 else "s").sort_by(lambda x: x),
        TypeError,
        0,
        "'sort_by'",
    ),
    "unbatch": (
        lambda: af.range(100).batch(10).map(lambda b: b if b[0] != 70 else 5).unbatch(),
        af.PipelineError,
        70,
        "'unbatch' at item 7",
    ),
    "interleave": (
        lambda: af.range(100).interleave(lambda x: af.from_iterable([_bad(x)]), cycle_length=2),
        Boom,
        70,
        "'interleave(<lambda>)' at item 70",
    ),
    "partition_by-key": (
        lambda: af.range(100).partition_by(lambda x: _bad(x) % 2, 2, lambda p: p),
        Boom,
        70,
        "'partition_by(2)' at item 70",
    ),
    "partition_by-fn": (
        lambda: af.range(100).partition_by(lambda x: x % 2, 2, _fail_partitions),
        Boom,
        0,
        "'partition_by(2)'",
    ),
    "rejection_resample": (
        lambda: af.range(100).rejection_resample(lambda x: _bad(x) % 2, [0.5, 0.5], seed=0),
        Boom,
        69,  # (of the 70 before it, one is rejected with this seed)
        "'rejection_resample(<lambda>)' at item 70",
    ),
}


@pytest.mark.parametrize("site", SITES.values(), ids=SITES.keys())
def test_a_failing_item_raises_after_the_items_before_it_with_one_note(site):
    make, kind, before, where = site
    got = []
    with make().iter(timeout=20) as it, pytest.raises(kind) as info:
        for x in it:
            got.append(x)
    assert len(got) == before
    assert info.value.__notes__ == [f"aioflow: raised in stage {where}"]


CAUSED = [k for k, v in SITES.items() if v[1] is Boom]


@pytest.mark.parametrize("name", CAUSED)
def test_a_failing_items_exception_keeps_its_own_cause(name):
    with SITES[name][0]().iter(timeout=20) as it, pytest.raises(Boom) as info:
        list(it)
    assert isinstance(info.value.__cause__, KeyError)
