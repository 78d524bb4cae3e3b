"""The one fan-in merge (interleave without order, partition_by)."""

from __future__ import annotations

import pytest

from aioflow._core.fanin import merge, merge_all
from aioflow._core.graph import ChunkIter
from aioflow._core.run import Run


async def _chunks(*chunks: list[int], fail: BaseException | None = None) -> ChunkIter:
    for c in chunks:
        yield c
    if fail is not None:
        raise fail


async def test_merge_all_gives_every_chunk_of_every_source_and_closes_them():
    run = Run()
    srcs = [_chunks([1, 2], [3]), _chunks([10], [20, 30])]
    got = [x async for chunk in merge_all(run, srcs) for x in chunk]
    assert sorted(got) == [1, 2, 3, 10, 20, 30]
    assert all(s.ag_frame is None for s in srcs)  # closed
    await run.aclose()


async def test_merge_raises_the_first_error_as_itself_after_the_items_before_it():
    run = Run()
    boom = KeyError("k")
    srcs = iter([_chunks([1], fail=boom), _chunks([2], [3])])

    async def next_source() -> ChunkIter | None:
        return next(srcs, None)

    got: list[int] = []
    with pytest.raises(KeyError) as e:
        async for chunk in merge(run, next_source, 1):  # one at a time: in order
            got.extend(chunk)
    assert e.value is boom and got == [1]
    await run.aclose()
