"""Batching: batch, unbatch, rebatch, window, padded_batch, bucket_by_length.

Each operator is one ``*_node`` function making its complete ``Node``; the collates
(how a list of items becomes a batch, and back) are in ``collate``.
"""

from __future__ import annotations

from bisect import bisect_right
from collections import deque
from collections.abc import Callable, Sequence
from itertools import pairwise
from typing import TYPE_CHECKING, Any, cast

from aioflow._core.base import pipeline_of
from aioflow._process.columns import Rows, collated, cut, joined
from aioflow.collate import (
    READ_ONLY,
    STACKED,
    arrow_collate,
    default_collate,
    is_record_batch,
    keep_list,
    pad_collate,
    resolve_collate,
    split_rows,
)
from aioflow.errors import PipelineError
from aioflow.ops.kit import (
    LOGGED_DEEP,
    UNKNOWN_CARD,
    Build,
    ChunkIter,
    Ctx,
    Node,
    Opener,
    aclosing,
    call,
    check_int,
    chunkwise,
    each,
    each_into,
    is_int,
    per_batch,
    resumed,
    windowing,
)

if TYPE_CHECKING:
    from aioflow.pipeline import Pipeline

__all__: list[str] = []  # the operators are Pipeline methods; af.default_collate: collate


def batch_node(up: Pipeline[Any], size: int, drop_remainder: bool, collate: Any) -> Node:
    """``batch``: ``size`` consecutive items collated into one.

    Right after a process map, with a collate that can (``STACKED``), the map is made
    anew to give its workers tasks within one batch and have them stack the results,
    and the batches are collated from those columns (see ``_batches``).
    """
    check_int("batch size", size, 1, want="a positive int")
    fn = resolve_collate(collate)
    array = STACKED.get(fn)
    stacked = up._node.hints.columns
    if array is not None and stacked is not None:
        up = pipeline_of(stacked(size, up._node))
    return _batch_node(
        up, "batch", size, drop_remainder, fn, (size, drop_remainder, collate), array
    )


def _batch_node(
    up: Pipeline[Any],
    name: str,
    size: int,
    drop_remainder: bool,
    fn: Callable[[Sequence[Any]], Any],
    key: tuple[Any, ...],
    array: Callable[[Any], Any] | None = None,
) -> Node:
    """The node of ``batch`` and ``padded_batch``: they differ only in their collate."""
    return Node(
        f"{name}({size})",
        _batches(size, drop_remainder, fn, array),
        inputs=(up,),
        card=_card_batch(size, drop_remainder),
        holds=size,
        mult=size,
        key=key,
        resume=per_batch(size),
    )


def _batches(
    size: int,
    drop_remainder: bool,
    fn: Callable[[Sequence[Any]], Any],
    array: Callable[[Any], Any] | None = None,
) -> Build:
    """The build of ``batch``, and of the batches of ``padded_batch`` and ``rebatch``.

    ``array``: ``fn`` can make a batch of stacked columns (``_columns.Rows``), an array
    column becoming ``array(column)``: a batch (or the input's short last one) of
    ``Rows`` chunks, cut where a batch ends, is made so, their columns joined. Items
    that were not stacked make their batch the usual way, ended by the next rows if need
    be; so after a skipped item the later batches are stacked ones again.
    """

    def from_parts(parts: list[Rows]) -> Any:
        assert array is not None
        both = joined(parts)
        if both is None:  # (their results stacked differently)
            return fn([x for p in parts for x in p])
        return collated(*both, array, cast(Callable[[list[Any]], Any], fn))

    async def batch(src: ChunkIter, ctx: Ctx) -> ChunkIter:
        buf: list[Any] = []  # items of the next batch
        parts: list[Rows] = []  # or stacked chunks of it (never both)
        held = 0  # their items
        nb = 0

        def stacked(r: Rows) -> list[tuple[Callable[[Any], Any], Any]]:
            """The batches a stacked chunk ends (how to make each, of what); the rest of
            it waits in ``parts``, or its first rows end items waiting in ``buf``."""
            nonlocal buf, parts, held
            jobs: list[tuple[Callable[[Any], Any], Any]] = []
            at = 0
            while at < len(r):
                if buf:  # items (a chunk was not stacked): the next rows end their batch
                    k = min(size - len(buf), len(r) - at)
                    buf.extend(r[at : at + k])
                    at += k
                    if len(buf) == size:
                        jobs.append((fn, buf))
                        buf = []
                    continue
                k = min(size - held, len(r) - at)
                parts.append(r if k == len(r) else cut(r, at, at + k))
                held += k
                at += k
                if held == size:
                    jobs.append((from_parts, parts))
                    parts, held = [], 0
            return jobs

        def make(jobs: list[tuple[Callable[[Any], Any], Any]]) -> tuple[list[Any], Any]:
            """The batches, in order, up to the first that fails (and its error)."""
            out: list[Any] = []
            for how, what in jobs:
                made, err = each(how, [what], ctx.name, nb + len(out))
                out.extend(made)
                if err is not None:
                    return out, err
            return out, None

        async with aclosing(src):
            async for chunk in src:
                if array is not None and type(chunk) is Rows:
                    jobs = stacked(cast(Rows, chunk))
                else:
                    if parts:  # a chunk that is not stacked: their items, as any
                        buf = [x for p in parts for x in p]
                        parts, held = [], 0
                    if buf:
                        buf.extend(chunk)
                    else:
                        buf = chunk
                    if len(buf) < size:
                        if buf is chunk:
                            buf = list(chunk)  # chunks are not ours to grow
                        continue
                    if buf is chunk and len(buf) == size and fn in READ_ONLY:
                        jobs, buf = [(fn, chunk)], []  # (a chunk of one batch: no copy)
                    else:
                        end = len(buf) - len(buf) % size
                        jobs = [(fn, buf[i : i + size]) for i in range(0, end, size)]
                        buf = buf[end:]
                if not jobs:
                    continue
                out, err = make(jobs)
                nb += len(out)
                if out:
                    yield out  # the batches before a failure are delivered first
                if err is not None:
                    raise err
            if drop_remainder or not (buf or parts):
                return
            out, err = make([(from_parts, parts)] if parts else [(fn, buf)])
            if err is not None:
                raise err
            yield out

    return lambda ctx, inputs: batch(inputs[0](), ctx)


def _card_batch(size: int, drop_remainder: bool) -> Callable[[Sequence[int]], int]:
    def card(cs: Sequence[int]) -> int:
        c = cs[0]
        if c < 0:
            return c
        return c // size if drop_remainder else -(-c // size)

    return card


def _rows(src: ChunkIter, ctx: Ctx, kinds: list[Any] | None = None) -> ChunkIter:
    """The rows of each batch; ``kinds`` gets the collate that makes the first batch split
    again (list batches stay lists, record batches record batches, else the default)."""

    def put(out: list[Any], b: Any) -> None:
        out.extend(split_rows(b))
        if kinds is not None and not kinds:
            again = keep_list if isinstance(b, list) else default_collate
            kinds.append(arrow_collate if is_record_batch(b) else again)

    return each_into(src, put, ctx.name)


def unbatch_node(up: Pipeline[Any]) -> Node:
    """``unbatch``: the rows of every batch; resumable chunk by chunk (``chunkwise``)."""
    build = chunkwise(lambda ctx, inputs: _rows(inputs[0](), ctx))
    return Node("unbatch", build, inputs=(up,), card=_unknown, resume=LOGGED_DEEP)


def rebatch_node(up: Pipeline[Any], size: int, drop_remainder: bool) -> Node:
    """``rebatch``: the rows of the batches, batched again by ``size``."""
    check_int("rebatch size", size, 1, want="a positive int")

    def collate_like(items: Sequence[Any], kinds: list[Any]) -> Any:
        return (kinds[0] if kinds else default_collate)(items)

    def build(ctx: Ctx, inputs: Sequence[Opener]) -> ChunkIter:
        kinds: list[Any] = []
        rows = _rows(inputs[0](), ctx, kinds)
        inner = _batches(size, drop_remainder, lambda items: collate_like(items, kinds))
        return inner(ctx, [lambda: rows])

    return Node(
        f"rebatch({size})",
        build,
        inputs=(up,),
        card=_unknown,
        holds=size,
        mult=size,
        key=(size, drop_remainder),
    )


def window_node(up: Pipeline[Any], size: int, shift: int | None, drop_remainder: bool) -> Node:
    """``window``: lists of ``size`` consecutive items, a new one every ``shift``."""
    check_int("window size", size, 1, want="a positive int")
    step = size if shift is None else shift
    check_int("window shift", step, 1, want="a positive int")

    async def window(src: ChunkIter, start: int) -> ChunkIter:
        buf: deque[Any] = deque()
        # start: index of the first item of the next window (a resumed run's first one
        # after the gap it had not read: ``windowing``)
        seen = 0
        async with aclosing(src):
            async for chunk in src:
                out = []
                for x in chunk:
                    i = seen
                    seen += 1
                    if i < start:
                        continue  # in the gap between windows (shift > size)
                    buf.append(x)
                    if i == start + size - 1:
                        out.append(list(buf))
                        start += step
                        for _ in range(min(step, len(buf))):
                            buf.popleft()
                if out:
                    yield out
        if not drop_remainder:
            out = []
            while start < seen and buf:
                out.append(list(buf))
                start += step
                for _ in range(min(step, len(buf))):
                    buf.popleft()
            if out:
                yield out

    return Node(
        f"window({size})",
        lambda ctx, inputs: window(inputs[0](), resumed(ctx.resume, "gap", 0)),
        inputs=(up,),
        card=_card_window(size, step, drop_remainder),
        holds=size,
        mult=size,
        key=(size, shift, drop_remainder),
        resume=per_batch(step) if step <= size else windowing(size, step),
    )


def _card_window(size: int, step: int, drop_remainder: bool) -> Callable[[Sequence[int]], int]:
    def card(cs: Sequence[int]) -> int:
        c = cs[0]
        if c < 0:
            return c
        if drop_remainder:
            return 0 if c < size else (c - size) // step + 1
        return -(-c // step)

    return card


# -- padding: padded_batch, bucket_by_length ---------------------------------------------
def padded_batch_node(
    up: Pipeline[Any], size: int, padding_value: Any, drop_remainder: bool
) -> Node:
    """``padded_batch``: batches of ``size`` items, padded by ``pad_collate``."""
    check_int("batch size", size, 1, want="a positive int")

    def fn(items: Sequence[Any]) -> Any:
        return pad_collate(items, padding_value)

    key = (size, padding_value, drop_remainder)
    return _batch_node(up, "padded_batch", size, drop_remainder, fn, key)


def check_buckets(boundaries: Sequence[int], batch_sizes: Sequence[int]) -> None:
    bs, sizes = list(boundaries), list(batch_sizes)
    if len(sizes) != len(bs) + 1:
        raise PipelineError(
            f"bucket_by_length needs len(batch_sizes) == len(boundaries) + 1,"
            f" got {len(sizes)} batch sizes for {len(bs)} boundaries"
        )
    if any(b >= c for b, c in pairwise(bs)):
        raise PipelineError(f"bucket boundaries must be strictly increasing, got {bs!r}")
    if not all(is_int(s, 1) for s in sizes):
        raise PipelineError(f"bucket batch sizes must be positive ints, got {sizes!r}")


def bucket_by_length_node(
    up: Pipeline[Any],
    length_fn: Callable[[Any], int],
    boundaries: Sequence[int],
    batch_sizes: Sequence[int],
    padding_value: Any,
) -> Node:
    """tf.data's ``bucket_by_sequence_length``: bucket ``i`` holds lengths in
    ``[boundaries[i-1], boundaries[i])`` (the first from 0, the last to infinity); a full
    bucket becomes a padded batch; what is left is flushed at the end, bucket by bucket.
    """
    if not callable(length_fn):
        raise PipelineError(f"bucket_by_length needs a callable length_fn, got {length_fn!r}")
    check_buckets(boundaries, batch_sizes)
    bounds, sizes = list(boundaries), list(batch_sizes)

    def collate(items: Sequence[Any]) -> Any:
        return pad_collate(items, padding_value)

    async def bucket(src: ChunkIter, ctx: Ctx) -> ChunkIter:
        buckets: list[list[Any]] = [[] for _ in sizes]
        nb = 0

        def put(out: list[Any], x: Any) -> None:
            """Into its bucket; a full bucket becomes a batch in ``out``."""
            nonlocal nb
            b = bisect_right(bounds, length_fn(x))
            buckets[b].append(x)
            if len(buckets[b]) == sizes[b]:
                out.append(collate(buckets[b]))
                buckets[b] = []
                nb += 1

        async with aclosing(each_into(src, put, ctx.name)) as batches:
            async for chunk in batches:
                yield chunk
        for items in buckets:
            if items:
                last, err = call(collate, items, ctx.name, nb)
                if err is not None:
                    raise err
                nb += 1
                yield [last]

    return Node(
        "bucket_by_length",
        lambda ctx, inputs: bucket(inputs[0](), ctx),
        inputs=(up,),
        card=_unknown,
        holds=sum(sizes),
        mult=max(sizes, default=1),
        key=(length_fn, tuple(bounds), tuple(sizes), padding_value),
    )


def _unknown(cs: Sequence[int]) -> int:
    return UNKNOWN_CARD
