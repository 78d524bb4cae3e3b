"""Ordering and grouping: shuffle, sort_by (streaming or external), group_by.

``shuffle`` is tf.data's buffer shuffle, with random indices drawn in bulk per chunk.
``sort_by`` with a ``buffer_size`` is a heap that repairs bounded lateness; without one it
is an external merge sort (see ``ops/ordering_spill``). ``group_by`` collects per-key groups with
bounded memory.
"""

from __future__ import annotations

import heapq
from collections import OrderedDict
from collections.abc import Callable, Hashable, Sequence
from functools import partial
from itertools import count
from typing import TYPE_CHECKING, Any

import numpy as np

from aioflow._core.chunks import skip_chunks
from aioflow.errors import LateItem, PipelineError, annotate
from aioflow.ops.kit import (
    CHANNEL_ITEMS,
    CHUNK_MAX,
    LOGGED,
    ChunkIter,
    Ctx,
    Node,
    Opener,
    Refuse,
    ShuffleLog,
    aclosing,
    check_int,
    each_into,
)
from aioflow.ops.ordering_spill import external_sort, keys_of
from aioflow.ops.partition import INPUT_ITEMS, build_partition_by
from aioflow.ops.sampling import card_unknown, check_seed, epoch_rng

if TYPE_CHECKING:
    from aioflow.pipeline import Pipeline

__all__: list[str] = []  # the operators are Pipeline methods


def _check_size(name: str, v: Any) -> None:
    if v is not None:
        check_int(name, v, 1)


# -- shuffle ------------------------------------------------------------------------------
def _shuffle(
    buffer_size: int, seed: int | None, reshuffle_each_iteration: bool
) -> Callable[[Ctx, Sequence[Opener]], ChunkIter]:
    """tf.data's buffer shuffle: fill a buffer, then emit a random slot and refill it.

    The slots for a whole chunk are drawn at once (doubles scaled to the buffer size: one
    64-bit draw per item, so the order does not depend on chunk boundaries). At the end
    the buffer is emitted in a random permutation.
    """
    check_int("shuffle buffer_size", buffer_size, 1)
    seed = check_seed(seed)
    if seed is None and not reshuffle_each_iteration:
        # as in tf.data: a random order, the same for every epoch of this pipeline
        seed = check_seed(np.random.SeedSequence().entropy)

    async def shuffle(src: ChunkIter, ctx: Ctx, log: ShuffleLog) -> ChunkIter:
        rng, buf, lock = log.rng, log.buf, log.lock  # the lock: see ShuffleLog
        n = buffer_size
        async with aclosing(src):
            async for chunk in src:
                if len(buf) < n:
                    room = n - len(buf)
                    with lock:
                        buf.extend(chunk[:room])
                        log.taken += min(room, len(chunk))
                    if len(chunk) <= room:
                        continue
                    chunk = chunk[room:]
                with lock:
                    before = rng.bit_generator.state
                    slots = (rng.random(len(chunk)) * n).astype(int).tolist()
                    out: list[Any] = []
                    emit = out.append
                    for i, x in zip(slots, chunk, strict=True):
                        emit(buf[i])
                        buf[i] = x
                    log.entries.append((log.out, log.taken, before, slots, out))
                    log.out += len(out)
                    log.taken += len(chunk)
                yield out
        if buf:
            with lock:
                before, start = rng.bit_generator.state, log.out
                order = rng.permutation(len(buf)).tolist()
            for i in range(0, len(order), CHUNK_MAX):
                out = [buf[j] for j in order[i : i + CHUNK_MAX]]
                with lock:  # the whole flush resumes from its start
                    log.entries.append((start, log.taken, before, [], []))
                    log.out += len(out)
                    log.done = i + CHUNK_MAX >= len(order)
                yield out

    def build(ctx: Ctx, inputs: Sequence[Opener]) -> ChunkIter:
        log = ShuffleLog(ctx, epoch_rng(seed, ctx.open_index if reshuffle_each_iteration else 0))
        gen = shuffle(inputs[0](), ctx, log)
        return skip_chunks(gen, log.drop) if log.drop else gen

    return build


# -- sort_by ------------------------------------------------------------------------------
class _Desc:
    """A key that sorts in reverse (for the heap of a streaming sort with ``reverse``)."""

    __slots__ = ("k",)

    def __init__(self, k: Any) -> None:
        self.k = k

    def __lt__(self, other: _Desc) -> bool:
        return bool(other.k < self.k)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _Desc) and bool(self.k == other.k)

    __hash__ = None  # type: ignore[assignment]


LATE_POLICIES = ("emit", "drop", "raise")


def _sort_by(
    key: Callable[[Any], Any],
    buffer_size: int | None,
    reverse: bool,
    max_in_memory: int,
    spill_dir: str | None,
    on_late: str = "emit",
) -> Callable[[Ctx, Sequence[Opener]], ChunkIter]:
    if not callable(key):
        raise PipelineError(f"sort_by needs a callable key, got {key!r}")
    _check_size("sort_by buffer_size", buffer_size)
    check_int("sort_by max_in_memory", max_in_memory, 1)
    if on_late not in LATE_POLICIES:
        raise PipelineError(f"sort_by on_late must be 'emit', 'drop' or 'raise', got {on_late!r}")
    if buffer_size is None:
        return lambda ctx, inputs: external_sort(
            inputs[0](), ctx, key, reverse, max_in_memory, spill_dir
        )
    size = buffer_size
    return lambda ctx, inputs: _stream_sort(inputs[0](), ctx, key, size, reverse, on_late)


async def _stream_sort(
    src: ChunkIter,
    ctx: Ctx,
    key: Callable[[Any], Any],
    size: int,
    reverse: bool,
    on_late: str,
) -> ChunkIter:
    """``sort_by(buffer_size=size)``: a heap of ``size`` items, late items per ``on_late``."""
    # entries (key, seq, item): seq breaks ties in arrival order, items are never compared
    heap: list[tuple[Any, int, Any]] = []
    seq = count()
    pushpop = partial(heapq.heappushpop, heap)
    pos = 0
    last: list[Any] = []  # the largest key emitted so far (the watermark), once there is one
    failure: BaseException | None = None
    async with aclosing(src):
        try:
            async for chunk in src:
                keys, failure = keys_of(key, chunk, ctx, pos)
                if reverse:
                    keys = [_Desc(k) for k in keys]
                entries = list(zip(keys, seq, chunk, strict=False))  # up to a failing key
                pos += len(entries)
                room = size - len(heap)
                if room > 0:
                    heap.extend(entries[:room])
                    if len(heap) == size:
                        heapq.heapify(heap)
                    entries = entries[room:]
                if entries:
                    out, late = _emit(map(pushpop, entries), last, on_late)
                    if late:
                        ctx.meter.late += late
                    if out:
                        yield out
                    if late < 0:  # on_late="raise": the first late item
                        raise _late_item(ctx, last, pos - len(entries), entries)
                if failure is not None:
                    break
        except LateItem:
            raise
        except Exception as e:  # upstream, or keys that do not compare
            failure = annotate(e, ctx.name, pos)
    # the end, or an error: what is left comes out in order (before the error)
    try:
        heap.sort()
    except Exception as e:  # the keys do not compare: only the (first) error comes out
        if failure is None:
            failure = annotate(e, ctx.name, pos)
        heap.clear()
    for i in range(0, len(heap), CHUNK_MAX):
        yield [e[2] for e in heap[i : i + CHUNK_MAX]]
    if failure is not None:
        raise failure


def _emit(popped: Any, last: list[Any], on_late: str) -> tuple[list[Any], int]:
    """The items of ``popped`` entries to emit, and how many were late (-1: raise).

    An entry is late when its key sorts before ``last[0]``, the largest key emitted so
    far; ``last`` is updated in place. With ``on_late="raise"`` it stops at the first late
    entry, which it leaves in ``last[1]``.
    """
    out: list[Any] = []
    emit = out.append
    late = 0
    w = last[0] if last else None
    for e in popped:
        k = e[0]
        if w is not None and k < w:
            if on_late == "raise":
                last[:] = [w, e]
                return out, -1
            late += 1
            if on_late == "drop":
                continue
        else:
            w = k
        emit(e[2])
    if w is not None:
        last[:] = [w]
    return out, late


def _late_item(ctx: Ctx, last: list[Any], start: int, entries: list[Any]) -> LateItem:
    """The error for ``on_late="raise"``: ``last`` is [watermark, the late entry]."""
    w, e = last
    ctx.meter.late += 1

    def unwrap(k: Any) -> Any:
        return k.k if isinstance(k, _Desc) else k

    position = start + next(i for i, x in enumerate(entries) if x is e)
    return LateItem(
        f"stage {ctx.name!r}: item {position} is late: its key {unwrap(e[0])!r} sorts before"
        f" {unwrap(w)!r}, already emitted (it arrived more places after its sorted position"
        " than the buffer holds; raise buffer_size, or use on_late='emit' or 'drop')",
        key=unwrap(e[0]),
        last_key=unwrap(w),
        position=position,
        stage=ctx.name,
    )


# -- group_by -----------------------------------------------------------------------------
def _group_by(
    key: Callable[[Any], Hashable], size: int | None, max_keys: int | None
) -> Callable[[Ctx, Sequence[Opener]], ChunkIter]:
    """Per-key groups, kept in the order in which each open group began."""
    if not callable(key):
        raise PipelineError(f"group_by needs a callable key, got {key!r}")
    _check_size("group_by size", size)
    _check_size("group_by max_keys", max_keys)
    full = size if size is not None else -1
    most = max_keys if max_keys is not None else -1

    async def group(src: ChunkIter, ctx: Ctx) -> ChunkIter:
        # an OrderedDict: a plain dict's first key is slow to find after many deletions
        groups: OrderedDict[Hashable, list[Any]] = OrderedDict()

        def put(out: list[tuple[Hashable, list[Any]]], x: Any) -> None:
            k = key(x)
            g = groups.get(k)
            if g is None:
                if len(groups) == most:  # the oldest open group makes room
                    out.append(groups.popitem(last=False))
                    ctx.meter.evicted += 1
                g = groups[k] = []
            g.append(x)
            if len(g) == full:
                out.append((k, groups.pop(k)))

        async with aclosing(each_into(src, put, ctx.name)) as let_out:
            async for chunk in let_out:
                yield chunk
        rest = list(groups.items())
        for i in range(0, len(rest), CHUNK_MAX):
            yield rest[i : i + CHUNK_MAX]

    return lambda ctx, inputs: group(inputs[0](), ctx)


# -- the nodes ----------------------------------------------------------------------------
def shuffle_node(
    up: Pipeline[Any], buffer_size: int, seed: int | None, reshuffle_each_iteration: bool
) -> Node:
    """``shuffle``: tf.data's buffer shuffle (see ``_shuffle``); holds the buffer."""
    return Node(
        f"shuffle({buffer_size})",
        _shuffle(buffer_size, seed, reshuffle_each_iteration),
        inputs=(up,),
        holds=buffer_size,
        key=(buffer_size, seed, reshuffle_each_iteration),
        resume=LOGGED,
    )


def sort_by_node(
    up: Pipeline[Any],
    key: Callable[[Any], Any],
    buffer_size: int | None,
    reverse: bool,
    max_in_memory: int,
    spill_dir: str | None,
    on_late: str,
) -> Node:
    """``sort_by``: a streaming sort through a buffer, or an external sort without one."""
    return Node(
        "sort_by" if buffer_size is None else f"sort_by({buffer_size})",
        _sort_by(key, buffer_size, reverse, max_in_memory, spill_dir, on_late),
        inputs=(up,),
        holds=max_in_memory if buffer_size is None else buffer_size,
        key=(key, buffer_size, reverse, max_in_memory, on_late),
    )


def group_by_node(
    up: Pipeline[Any], key: Callable[[Any], Hashable], size: int | None, max_keys: int | None
) -> Node:
    """``group_by``: ``(key, [items])`` groups, at most ``max_keys`` open at once."""
    return Node(
        "group_by",
        _group_by(key, size, max_keys),
        inputs=(up,),
        card=card_unknown,
        holds=size * max_keys if size is not None and max_keys is not None else 0,
        mult=size or 1,
        key=(key, size, max_keys),
    )


def partition_by_node(
    up: Pipeline[Any],
    key: Callable[[Any], Any],
    num_partitions: int,
    fn: Callable[[Any], Any],
) -> Node:
    """``partition_by``: ``fn`` over ``num_partitions`` keyed partitions, merged as ready.

    Each partition holds its input channel, the channel after its pipeline and a chunk.
    """
    return Node(
        f"partition_by({num_partitions})",
        build_partition_by(key, num_partitions, fn),
        inputs=(up,),
        card=card_unknown,
        holds=num_partitions * (INPUT_ITEMS + CHANNEL_ITEMS + CHUNK_MAX),
        key=(key, num_partitions, fn),
        resume=Refuse("merges its partitions as they are ready: a replay would differ"),
    )
