"""Operators that pass items on without looking at them: take, skip, repeat, shard, prefetch.

As in ``transforms``, each is one ``*_node`` function making its complete ``Node``,
cardinality (tf.data's rules) and state included; ``shard_from_env`` reads the
launcher's rank for ``shard``.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from aioflow._core.autotune import AUTOTUNE, PREFETCH_MAX_ITEMS
from aioflow._core.chunks import skip_chunks
from aioflow.errors import PipelineError
from aioflow.ops.kit import (
    CHUNK_MAX,
    INFINITE_CARD,
    LOGGED,
    UNKNOWN_CARD,
    ChunkIter,
    Ctx,
    Hints,
    Node,
    Opener,
    aclosing,
    check_int,
    is_int,
    one_to_one,
    resumed,
    skipping,
    taking,
)

if TYPE_CHECKING:
    from aioflow.pipeline import Pipeline

__all__ = ["shard_from_env"]


def take_node(up: Pipeline[Any], n: int) -> Node:
    """``take``: the first ``n`` items (all when -1), closing the upstream after them."""
    check_int("take count", n, -1)

    async def take(src: ChunkIter, left: int) -> ChunkIter:
        if left == 0:
            await src.aclose()
            return
        async with aclosing(src):  # closing stops the upstream at once
            async for chunk in src:
                if left < 0:
                    yield chunk
                    continue
                if len(chunk) >= left:
                    yield chunk[:left]
                    return
                left -= len(chunk)
                yield chunk

    return Node(
        "take",
        lambda ctx, inputs: take(inputs[0](), resumed(ctx.resume, "left", n)),
        inputs=(up,),
        card=_card_take(n),
        key=(n,),
        resume=taking(n),
    )


def skip_node(up: Pipeline[Any], n: int) -> Node:
    """``skip``: everything after the first ``n`` items (nothing when -1)."""
    check_int("skip count", n, -1)
    return Node(
        "skip",
        lambda ctx, inputs: skip_chunks(inputs[0](), resumed(ctx.resume, "left", n)),
        inputs=(up,),
        card=_card_skip(n),
        key=(n,),
        resume=skipping(n),
    )


def repeat_node(up: Pipeline[Any], count: int | None) -> Node:
    """``repeat``: the upstream ``count`` times (forever when None or -1), each an epoch."""
    if count is not None:
        check_int("repeat count", count, -1)

    async def repeat(opener: Opener, ctx: Ctx) -> ChunkIter:
        epoch = first = resumed(ctx.resume, "epoch", 0)  # epochs done before this run
        starts: list[int] = []  # items out when each epoch of this run began

        def at(k: int) -> tuple[Any, int, int] | None:
            e = len(starts) - 1
            while e >= 0 and starts[e] > k:
                e -= 1
            if e < len(starts) - 2 or e < 0:
                return None  # an epoch whose input's state is gone (runtime keeps two)
            return {"epoch": first + e}, k - starts[e], e

        ctx.seeker(at)
        out = 0
        while count is None or count < 0 or epoch < count:
            produced = False
            starts.append(out)
            async with aclosing(opener()) as src:
                async for chunk in src:
                    produced = True
                    out += len(chunk)
                    yield chunk
            epoch += 1
            if not produced and not (epoch == first + 1 and ctx.resume is not None):
                # an empty input repeated forever is empty (as in tf.data); a resumed
                # epoch may have nothing left
                return

    return Node(
        "repeat",
        lambda ctx, inputs: repeat(inputs[0], ctx),
        inputs=(up,),
        card=_card_repeat(count),
        key=(count,),
        resume=LOGGED,
    )


def shard_node(up: Pipeline[Any], num_shards: int, index: int) -> Node:
    """``shard``: every ``num_shards``-th item from ``index``."""
    check_int("num_shards", num_shards, 1)
    check_int("index", index, 0)
    if index >= num_shards:
        raise PipelineError(f"shard index must be < num_shards ({num_shards}), got {index}")

    async def shard(src: ChunkIter) -> ChunkIter:
        pos = 0
        async with aclosing(src):
            async for chunk in src:
                part = chunk[(index - pos) % num_shards :: num_shards]
                pos += len(chunk)
                if part:
                    yield part

    return Node(
        "shard",
        lambda ctx, inputs: shard(inputs[0]()),
        inputs=(up,),
        card=_card_shard(num_shards, index),
        key=(num_shards, index),
    )


def prefetch_node(up: Pipeline[Any], n: int) -> Node | None:
    """``prefetch``: a task of its own keeps ``n`` items ready (None: ``prefetch(0)``).

    With ``AUTOTUNE`` the channel starts at one chunk and may grow to
    ``PREFETCH_MAX_ITEMS`` (see ``_core/run``).
    """
    auto = n == AUTOTUNE
    if auto:
        size = PREFETCH_MAX_ITEMS
    elif not is_int(n, 0):
        raise PipelineError(f"prefetch needs a buffer size >= 0 or af.AUTOTUNE, got {n!r}")
    else:
        size = n
    if size == 0:
        return None
    most = CHUNK_MAX if auto else size  # chunks no larger than this, in a channel of as many

    async def prefetch(src: ChunkIter) -> ChunkIter:
        async with aclosing(src):
            async for chunk in src:
                if len(chunk) <= most:
                    yield chunk
                else:
                    for i in range(0, len(chunk), most):
                        yield chunk[i : i + most]

    return Node(
        "prefetch(AUTOTUNE)" if auto else f"prefetch({size})",
        lambda ctx, inputs: prefetch(inputs[0]()),
        inputs=(up,),
        task=True,
        key=(n,),
        hints=Hints(
            chunks=1 if auto else size, items=most, grow_to=size if auto else 0, buffer=not auto
        ),
        resume=one_to_one,
    )


# -- cardinality rules (tf.data's) ------------------------------------------------------
def _known(c: int) -> bool:
    return c >= 0


def _card_take(n: int) -> Callable[[Sequence[int]], int]:
    def card(cs: Sequence[int]) -> int:
        c = cs[0]
        if n < 0:
            return c
        if c == INFINITE_CARD:
            return n
        if c == UNKNOWN_CARD:
            return UNKNOWN_CARD
        return min(n, c)

    return card


def _card_skip(n: int) -> Callable[[Sequence[int]], int]:
    def card(cs: Sequence[int]) -> int:
        c = cs[0]
        if not _known(c):
            return c
        return 0 if n < 0 else max(0, c - n)

    return card


def _card_repeat(count: int | None) -> Callable[[Sequence[int]], int]:
    def card(cs: Sequence[int]) -> int:
        c = cs[0]
        if c == 0 or count == 0:
            return 0
        if count is None or count < 0:
            return INFINITE_CARD  # as tf.data: even an unknown input repeats forever
        return c * count if _known(c) else c

    return card


def _card_shard(num_shards: int, index: int) -> Callable[[Sequence[int]], int]:
    def card(cs: Sequence[int]) -> int:
        c = cs[0]
        if not _known(c):
            return c
        return c // num_shards + (1 if index < c % num_shards else 0)

    return card


def shard_from_env() -> tuple[int, int]:
    """``(num_shards, index)`` for ``shard`` from the launcher's environment.

    Reads ``WORLD_SIZE`` and ``RANK`` (torchrun, Slurm-style launchers); ``(1, 0)`` when
    they are not set.

    Example:
        >>> import os, aioflow as af
        >>> os.environ.update(WORLD_SIZE="2", RANK="1")
        >>> af.range(6).shard(*af.shard_from_env()).to_list()
        [1, 3, 5]
        >>> del os.environ["WORLD_SIZE"], os.environ["RANK"]
    """
    try:
        world = int(os.environ.get("WORLD_SIZE", "1"))
        rank = int(os.environ.get("RANK", "0"))
    except ValueError as e:
        raise PipelineError(f"RANK/WORLD_SIZE must be integers: {e}") from None
    if world < 1 or not 0 <= rank < world:
        raise PipelineError(f"need 0 <= RANK < WORLD_SIZE, got RANK={rank} WORLD_SIZE={world}")
    return world, rank
