"""Keyed parallelism: ``partition_by``.

A router task reads the input and sends every item to the partition of its key, through
a bounded channel per partition; each partition runs ``fn(Pipeline)`` on its items in a
task of its own (``ctx.open_task``); the outputs are merged as they come. A full
partition channel blocks the router, so one slow partition holds the whole input back
rather than letting the others buffer without bound.
"""

from __future__ import annotations

import operator
import zlib
from collections.abc import Callable, Hashable, Sequence
from typing import TYPE_CHECKING, Any

from aioflow._core.base import PipelineBase, pipeline_of
from aioflow._core.channel import Channel
from aioflow._core.fanin import merge_all
from aioflow._core.tasks import aclosing, cancel_and_wait
from aioflow.errors import PipelineError, annotate
from aioflow.ops.columnar import kind_of, split
from aioflow.ops.kit import (
    CHANNEL_ITEMS,
    ChunkIter,
    Ctx,
    Node,
    Opener,
    call,
    each,
)

if TYPE_CHECKING:
    from aioflow.pipeline import Pipeline

__all__ = ["build_partition_by", "partition_of"]

#: Bound of each partition's input channel: chunks (the router cuts small ones) and items.
INPUT_CHUNKS = 8
INPUT_ITEMS = CHANNEL_ITEMS

_MASK = 2**64 - 1
_GOLDEN = 0x9E3779B97F4A7C15


def partition_of(key: Hashable, n: int) -> int:
    """The partition of a key: the same in every run and every process for the usual keys.

    ints (splitmix64), ``str`` and ``bytes`` (CRC-32) and tuples of them are hashed
    by a fixed function; any other key by ``hash()``, which is stable within a process
    (enough for one run) but, for some types, not across processes.

    Example:
        >>> partition_of("user-7", 8) == partition_of("user-7", 8), partition_of(3, 1)
        (True, 0)
    """
    return _stable_hash(key) % n


def _stable_hash(k: Any) -> int:
    if isinstance(k, int):  # splitmix64's finalizer: ids that share a stride spread too
        z = (k + _GOLDEN) & _MASK
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK
        return z ^ (z >> 31)
    if isinstance(k, str):
        return zlib.crc32(k.encode("utf-8", "surrogatepass"))
    if isinstance(k, bytes):
        return zlib.crc32(k)
    if isinstance(k, tuple):
        h = 0x345678
        for x in k:
            h = ((h ^ _stable_hash(x)) * 1000003) & _MASK
        return h >> 16
    return hash(k) & _MASK


def _feed(chan: Channel, index: int) -> Pipeline[Any]:
    async def read() -> ChunkIter:
        try:
            while (chunk := await chan.get()) is not None:
                yield chunk
        finally:
            chan.abandon()

    return pipeline_of(Node(f"partition {index}", lambda ctx, inputs: read(), key=(index,)))


async def _route(
    src: ChunkIter,
    key: Callable[[Any], Hashable] | str,
    chans: list[Channel],
    ctx: Ctx,
) -> BaseException | None:
    """Send every item to its partition; the input's error is returned, not raised."""
    n = len(chans)
    pos = 0
    error: BaseException | None = None

    name = key if isinstance(key, str) else None
    get: Callable[[Any], Any] = operator.itemgetter(key) if isinstance(key, str) else key

    def part_of(x: Any) -> int:
        return _stable_hash(get(x)) % n

    try:
        async with aclosing(src):
            async for chunk in src:
                parts: list[list[Any]] = [[] for _ in range(n)]
                if name is not None and chunk and kind_of(chunk[0]) is not None:
                    try:  # record batches by a column: their rows to the partitions
                        for b in chunk:
                            for part, rows in zip(
                                parts, split(b, name, n, _stable_hash), strict=True
                            ):
                                if rows is not None:
                                    part.append(rows)
                    except Exception as e:
                        error = annotate(e, ctx.name, pos)
                        break
                    pos += len(chunk)
                    for chan, part in zip(chans, parts, strict=True):
                        if part:
                            await chan.put(part)
                    if all(c.gone for c in chans):
                        break
                    continue
                which, error = each(part_of, chunk, ctx.name, pos)
                for x, i in zip(chunk, which, strict=False):  # (up to a failing key)
                    parts[i].append(x)
                pos += len(which)
                for chan, part in zip(chans, parts, strict=True):
                    if part:
                        await chan.put(part)
                if error is not None or all(c.gone for c in chans):
                    break  # (when every partition stopped reading, the rest is not wanted)
    except Exception as e:
        error = e
    finally:
        for chan in chans:
            chan.close()  # the partitions finish the items they have, then end
    return error


def build_partition_by(
    key: Callable[[Any], Hashable] | str,
    num_partitions: int,
    fn: Callable[[Pipeline[Any]], Pipeline[Any]],
) -> Callable[[Ctx, Sequence[Opener]], ChunkIter]:
    if not (callable(key) or isinstance(key, str)) or not callable(fn):
        raise PipelineError(
            "partition_by needs a callable key (or a column name) and a callable fn"
        )
    if isinstance(num_partitions, bool) or not isinstance(num_partitions, int):
        raise PipelineError(f"num_partitions must be an int >= 1, got {num_partitions!r}")
    if num_partitions < 1:
        raise PipelineError(f"num_partitions must be an int >= 1, got {num_partitions!r}")

    async def partition(opener: Opener, ctx: Ctx) -> ChunkIter:
        chans = [Channel(INPUT_CHUNKS, INPUT_ITEMS) for _ in range(num_partitions)]
        subs: list[ChunkIter] = []
        for i, chan in enumerate(chans):
            sub, err = call(fn, _feed(chan, i), ctx.name, None)
            if err is not None:
                raise err
            if not isinstance(sub, PipelineBase):
                raise PipelineError(
                    f"partition_by: fn returned {type(sub).__name__}, not a Pipeline"
                )
            subs.append(ctx.open_task(sub))
        router = ctx.run.start(_route(opener(), key, chans, ctx), f"{ctx.name}:router")
        try:
            async with aclosing(merge_all(ctx.run, subs)) as merged:
                async for chunk in merged:
                    yield chunk
            for chan in chans:
                chan.abandon()  # every partition ended: nobody reads what is left
            error = await router
            if error is not None:
                raise error
        finally:
            await cancel_and_wait([router])

    return lambda ctx, inputs: partition(inputs[0], ctx)
