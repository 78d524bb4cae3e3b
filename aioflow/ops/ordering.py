"""Ordering and grouping: shuffle, sort_by (streaming or external), group_by.

``shuffle`` is tf.data's buffer shuffle, with random indices drawn in bulk per chunk.
``sort_by`` with a ``buffer_size`` is a heap that repairs bounded lateness; without one it
is an external merge sort (see ``ops/ordering_spill``). ``group_by`` collects per-key groups with
bounded memory.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from aioflow._core.chunks import skip_chunks
from aioflow.errors import LateItem, PipelineError
from aioflow.ops.columnar_base import Auto
from aioflow.ops.columnar_groups import ColGroups
from aioflow.ops.columnar_shuffle import RowBuffer, RowShuffleLog, rows_check, shuffle_rows
from aioflow.ops.columnar_sort import ColBufferSort
from aioflow.ops.event_time import accessor, columns, run_machine, time_sort
from aioflow.ops.event_time_core import Late
from aioflow.ops.kit import (
    CHANNEL_ITEMS,
    CHUNK_MAX,
    LOGGED,
    ChunkIter,
    Ctx,
    Logged,
    Node,
    Opener,
    Refuse,
    ShuffleLog,
    aclosing,
    check_int,
    shuffle_check,
)
from aioflow.ops.ordering_spill import external_sort
from aioflow.ops.ordering_stream import BufferSort, Groups
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
    buffer_size: int, seed: int | None, reshuffle_each_iteration: bool, rows: bool = False
) -> Callable[[Ctx, Sequence[Opener]], ChunkIter]:
    """tf.data's buffer shuffle: fill a buffer, then emit a random slot and refill it.

    The slots for a whole chunk are drawn at once (doubles scaled to the buffer size: one
    64-bit draw per item, so the order does not depend on chunk boundaries). At the end
    the buffer is emitted in a random permutation. ``rows``: of the rows of record batches,
    the same draws (``ops/columnar_shuffle``).
    """
    check_int("shuffle buffer_size", buffer_size, 1)
    if not isinstance(rows, bool):
        raise PipelineError(f"shuffle rows must be True or False, got {rows!r}")
    seed = check_seed(seed)
    if seed is None and not reshuffle_each_iteration:
        # as in tf.data: a random order, the same for every epoch of this pipeline
        seed = check_seed(np.random.SeedSequence().entropy)
    if rows:
        return shuffle_rows(
            buffer_size,
            lambda ctx: epoch_rng(seed, ctx.open_index if reshuffle_each_iteration else 0),
        )

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
                log.flush = (start, before)  # (a state from now on: the flush's start)
            for i in range(0, len(order), CHUNK_MAX):
                out = [buf[j] for j in order[i : i + CHUNK_MAX]]
                with lock:  # (no entry: the whole flush resumes from its start, log.flush)
                    log.out += len(out)
                    log.done = i + CHUNK_MAX >= len(order)
                yield out

    def build(ctx: Ctx, inputs: Sequence[Opener]) -> ChunkIter:
        log = ShuffleLog(ctx, epoch_rng(seed, ctx.open_index if reshuffle_each_iteration else 0))
        gen = shuffle(inputs[0](), ctx, log)
        return skip_chunks(gen, log.drop) if log.drop else gen

    return build


# -- sort_by, group_by -------------------------------------------------------------------
LATE_POLICIES = ("emit", "drop", "raise")


def _sort_by(
    key: Callable[[Any], Any] | str,
    buffer_size: int | None,
    reverse: bool,
    max_in_memory: int,
    spill_dir: str | None,
    on_late: str,
    max_delay: Any,
) -> Callable[[Ctx, Sequence[Opener]], ChunkIter]:
    if not callable(key) and not isinstance(key, str):
        raise PipelineError(f"sort_by needs a callable key or a column name, got {key!r}")
    _check_size("sort_by buffer_size", buffer_size)
    check_int("sort_by max_in_memory", max_in_memory, 1)
    if on_late not in LATE_POLICIES:
        raise PipelineError(f"sort_by on_late must be 'emit', 'drop' or 'raise', got {on_late!r}")
    if max_delay is not None:
        if buffer_size is not None or reverse:
            raise PipelineError(
                "sort_by: max_delay (a bound in key units, ascending) goes without"
                " buffer_size and reverse"
            )
        return time_sort(key, max_delay, on_late)
    if buffer_size is None:
        return lambda ctx, inputs: external_sort(
            inputs[0](), ctx, accessor("sort_by key", key), reverse, max_in_memory, spill_dir
        )
    size, access = buffer_size, columns(accessor("sort_by key", key))

    def machine() -> Any:
        m = BufferSort(size, reverse, on_late)
        if isinstance(key, str):
            return Auto(m, access, lambda: ColBufferSort(key, size, reverse, on_late))
        return m

    return lambda ctx, inputs: run_machine(
        ctx, inputs, machine(), access, True, _late_item, event_time=False
    )


def _late_item(ctx: Ctx, e: Late, position: int) -> LateItem:
    """The error for ``on_late="raise"`` of ``sort_by(buffer_size=)``."""
    return LateItem(
        f"stage {ctx.name!r}: item {position} is late: its key {e.t!r} sorts before"
        f" {e.watermark!r}, already emitted (it arrived more places after its sorted position"
        " than the buffer holds; raise buffer_size, or use on_late='emit' or 'drop')",
        key=e.t,
        last_key=e.watermark,
        position=position,
        stage=ctx.name,
    )


def _group_by(
    key: Callable[[Any], Hashable] | str, size: int | None, max_keys: int | None
) -> Callable[[Ctx, Sequence[Opener]], ChunkIter]:
    """Per-key groups, kept in the order in which each open group began (``Groups``)."""
    if not callable(key) and not isinstance(key, str):
        raise PipelineError(f"group_by needs a callable key or a column name, got {key!r}")
    _check_size("group_by size", size)
    _check_size("group_by max_keys", max_keys)
    access = columns(accessor("group_by key", key))

    def machine() -> Any:
        m = Groups(size, max_keys)
        if isinstance(key, str):
            return Auto(m, access, lambda: ColGroups(key, size, max_keys))
        return m

    return lambda ctx, inputs: run_machine(ctx, inputs, machine(), access, False, event_time=False)


# -- the nodes ----------------------------------------------------------------------------
def shuffle_node(
    up: Pipeline[Any],
    buffer_size: int,
    seed: int | None,
    reshuffle_each_iteration: bool,
    rows: bool = False,
) -> Node:
    """``shuffle``: tf.data's buffer shuffle (see ``_shuffle``); holds the buffer (of
    items; ``rows``: of rows, in at most ``RowBuffer.SEGS + 1`` input batches, and the
    output batches its log keeps)."""
    build = _shuffle(buffer_size, seed, reshuffle_each_iteration, rows)
    if rows:
        return Node(
            f"shuffle({buffer_size}, rows=True)",
            build,
            inputs=(up,),
            card=card_unknown,
            holds=RowBuffer.SEGS + 1 + RowShuffleLog.KEEP,
            key=(buffer_size, seed, reshuffle_each_iteration, rows),
            resume=Logged(rows_check(buffer_size)),
        )
    return Node(
        f"shuffle({buffer_size})",
        build,
        inputs=(up,),
        holds=buffer_size,
        key=(buffer_size, seed, reshuffle_each_iteration),
        resume=Logged(shuffle_check(buffer_size)),
    )


def sort_by_node(
    up: Pipeline[Any],
    key: Callable[[Any], Any] | str,
    buffer_size: int | None,
    reverse: bool,
    max_in_memory: int,
    spill_dir: str | None,
    on_late: str,
    max_delay: Any = None,
) -> Node:
    """``sort_by``: a streaming sort through a buffer (of ``buffer_size`` items, or up to
    the watermark with ``max_delay``), or an external sort without either. The streaming
    sorts resume from their buffer (``LOGGED``); the external one replays."""
    streaming = buffer_size is not None or max_delay is not None
    name = "sort_by"
    if buffer_size is not None:
        name = f"sort_by({buffer_size})"
    elif max_delay is not None:
        name = f"sort_by(max_delay={max_delay})"
    # a column name may sort record batches, whose rows are cut into other batches
    card: dict[str, Any] = {"card": card_unknown} if isinstance(key, str) else {}
    return Node(
        name,
        _sort_by(key, buffer_size, reverse, max_in_memory, spill_dir, on_late, max_delay),
        inputs=(up,),
        **card,
        holds=buffer_size if buffer_size is not None else 0 if streaming else max_in_memory,
        key=(key, buffer_size, reverse, max_in_memory, on_late, max_delay),
        resume=LOGGED if streaming else None,
    )


def group_by_node(
    up: Pipeline[Any], key: Callable[[Any], Hashable] | str, size: int | None, max_keys: int | None
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
        resume=LOGGED,
    )


def partition_by_node(
    up: Pipeline[Any],
    key: Callable[[Any], Any] | str,
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
