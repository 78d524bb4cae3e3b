"""Per-item transforms: map, filter, flat_map, scan, enumerate, take, skip, repeat, shard,
prefetch, and ``pipe`` (a user's own async-generator stage).

Each operator is an async generator over the chunks of its input (see ``_runtime``); the
``Pipeline`` methods in ``pipeline.py`` are one line each on top of the builders here.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Callable, Sequence
from concurrent.futures import Executor
from typing import Any

from ._autotune import AUTOTUNE, PREFETCH_MAX_ITEMS, resolve_concurrency
from ._calls import (
    DROP,
    ErrorPolicy,
    check_concurrency,
    concurrent_map,
    inline_map,
    is_async_callable,
)
from ._runtime import (
    CHUNK_MAX,
    INFINITE_CARD,
    UNKNOWN_CARD,
    ChunkIter,
    Ctx,
    Opener,
    aclosing,
)
from ._state import resumed
from .errors import PipelineError, annotate, control_flow_error

__all__ = [
    "build_flat_map",
    "build_map",
    "build_pipe",
    "build_prefetch",
    "build_repeat",
    "build_scan",
    "build_shard",
    "build_take",
    "card_repeat",
    "card_shard",
    "card_skip",
    "card_take",
    "enumerate_chunks",
    "shard_from_env",
    "skip_chunks",
]


def build_map(
    fn: Callable[[Any], Any],
    *,
    concurrency: int,
    executor: str | Executor | None,
    ordered: bool,
    on_error: str | int,
    timeout: float | None,
    keep: bool = False,
) -> Callable[[Ctx, Sequence[Opener]], ChunkIter]:
    """The build of ``map`` (``keep=False``) and ``filter`` (``keep=True``)."""
    if not callable(fn):
        raise PipelineError(f"map/filter needs a callable, got {type(fn).__name__}")
    check_concurrency(concurrency)
    if executor == "process" and is_async_callable(fn):
        raise PipelineError(
            "an async function cannot run in a worker process (executor='process');"
            " leave executor=None to run it as tasks on the loop"
        )
    ErrorPolicy(on_error)  # check now, at description time
    if timeout is not None and not timeout > 0:
        raise PipelineError(f"timeout must be a positive number of seconds, got {timeout!r}")
    inline = executor is None and concurrency == 1 and timeout is None and not is_async_callable(fn)

    def build(ctx: Ctx, inputs: Sequence[Opener]) -> ChunkIter:
        src = inputs[0]()
        policy = ErrorPolicy(on_error)
        if inline:
            return inline_map(src, fn, ctx, policy, keep=keep)
        return concurrent_map(
            src,
            fn,
            ctx,
            policy,
            concurrency=resolve_concurrency(concurrency, executor),
            ordered=ordered,
            executor=executor,
            timeout=timeout,
            post=(lambda x, y: x if y else DROP) if keep else None,
            autotune=concurrency == AUTOTUNE,
        )

    return build


def build_flat_map(fn: Callable[[Any], Any]) -> Callable[[Ctx, Sequence[Opener]], ChunkIter]:
    from ._logs import ElementLog
    from .pipeline import Pipeline
    from .sources import iterable_chunks

    async def flat(src: ChunkIter, ctx: Ctx) -> ChunkIter:
        pos = 0
        emitted = 0  # items out, for the state (see ElementLog)
        log = ElementLog(ctx)
        out: list[Any] = []
        async with aclosing(src):
            async for chunk in src:
                for x in chunk:
                    try:
                        sub = fn(x)
                    except Exception as e:
                        if out:
                            yield out
                        raise control_flow_error(e, ctx.name, pos) from None
                    resume, drop = log.first() if pos == 0 else (None, 0)
                    pos += 1
                    if isinstance(sub, list | tuple):
                        log.element(emitted + len(out), pos - 1, drop)
                        out.extend(sub[drop:])
                        if len(out) >= CHUNK_MAX:
                            emitted += len(out)
                            yield out
                            out = []
                        continue
                    if out:
                        emitted += len(out)
                        yield out
                        out = []
                    entry = log.element(emitted, pos - 1, drop, resume)
                    if isinstance(sub, Pipeline):
                        subchunks = ctx.open(sub, resume, entry.hook)
                    else:
                        subchunks = iterable_chunks(sub, ctx)
                    async with aclosing(skip_chunks(subchunks, drop)) as subs:
                        async for c in subs:
                            emitted += len(c)
                            yield c
                if out:
                    emitted += len(out)
                    yield out
                    out = []

    return lambda ctx, inputs: flat(inputs[0](), ctx)


def build_scan(
    initial_state: Any, fn: Callable[[Any, Any], tuple[Any, Any]]
) -> Callable[[Ctx, Sequence[Opener]], ChunkIter]:
    async def scan(src: ChunkIter, ctx: Ctx) -> ChunkIter:
        state = initial_state
        pos = 0
        async with aclosing(src):
            async for chunk in src:
                out: list[Any] = []
                for x in chunk:
                    try:
                        state, y = fn(state, x)
                    except Exception as e:
                        if out:
                            yield out
                        raise control_flow_error(e, ctx.name, pos) from None
                    out.append(y)
                    pos += 1
                yield out

    return lambda ctx, inputs: scan(inputs[0](), ctx)


async def enumerate_chunks(src: ChunkIter, start: int) -> ChunkIter:
    i = start
    async with aclosing(src):
        async for chunk in src:
            j = i + len(chunk)
            yield list(zip(range(i, j), chunk, strict=True))
            i = j


def build_take(n: int) -> Callable[[Ctx, Sequence[Opener]], ChunkIter]:
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

    return lambda ctx, inputs: take(inputs[0](), resumed(ctx.resume, "left", n))


async def skip_chunks(src: ChunkIter, n: int) -> ChunkIter:
    left = n
    async with aclosing(src):
        async for chunk in src:
            if left < 0:
                continue
            if left:
                if len(chunk) <= left:
                    left -= len(chunk)
                    continue
                chunk = chunk[left:]
                left = 0
            yield chunk


def build_repeat(count: int | None) -> Callable[[Ctx, Sequence[Opener]], ChunkIter]:
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
            if not produced:  # an empty input repeated forever is empty (as in tf.data)
                return

    return lambda ctx, inputs: repeat(inputs[0], ctx)


def build_shard(num_shards: int, index: int) -> Callable[[Ctx, Sequence[Opener]], ChunkIter]:
    async def shard(src: ChunkIter) -> ChunkIter:
        pos = 0
        async with aclosing(src):
            async for chunk in src:
                part = chunk[(index - pos) % num_shards :: num_shards]
                pos += len(chunk)
                if part:
                    yield part

    return lambda ctx, inputs: shard(inputs[0]())


def build_prefetch(n: int) -> Callable[[Ctx, Sequence[Opener]], ChunkIter]:
    async def prefetch(src: ChunkIter) -> ChunkIter:
        # chunks no larger than n, so that the channel of n items holds at most n
        async with aclosing(src):
            async for chunk in src:
                if len(chunk) <= n:
                    yield chunk
                else:
                    for i in range(0, len(chunk), n):
                        yield chunk[i : i + n]

    return lambda ctx, inputs: prefetch(inputs[0]())


def prefetch_size(n: int) -> int:
    if n == AUTOTUNE:
        return PREFETCH_MAX_ITEMS
    if isinstance(n, bool) or not isinstance(n, int) or n < 0:
        raise PipelineError(f"prefetch needs a buffer size >= 0 or af.AUTOTUNE, got {n!r}")
    return n


class _ItemFeed:
    """The input of a ``pipe`` stage, one item at a time; knows whether items are buffered."""

    def __init__(self, src: ChunkIter) -> None:
        self.src = src
        self.buf: list[Any] = []
        self.i = 0
        self.pos = 0

    def __aiter__(self) -> _ItemFeed:
        return self

    def buffered(self) -> bool:
        return self.i < len(self.buf)

    async def __anext__(self) -> Any:
        if self.i >= len(self.buf):
            try:
                self.buf = await anext(self.src)
            except StopAsyncIteration:
                raise StopAsyncIteration from None
            self.i = 0
        x = self.buf[self.i]
        self.i += 1
        self.pos += 1
        return x


def build_pipe(
    stage: Callable[[AsyncIterator[Any]], AsyncIterator[Any]],
) -> Callable[[Ctx, Sequence[Opener]], ChunkIter]:
    if not callable(stage):
        raise PipelineError(f"pipe needs an async generator function, got {type(stage).__name__}")

    async def pipe(src: ChunkIter, ctx: Ctx) -> ChunkIter:
        feed = _ItemFeed(src)
        agen = stage(feed)
        if agen is feed or not hasattr(agen, "__anext__"):
            raise PipelineError(
                f"pipe({ctx.name}): the stage must be an async generator function"
                " (`async def stage(items): ... yield ...`)"
            )
        out: list[Any] = []
        async with aclosing(src):
            try:
                async for y in agen:
                    out.append(y)
                    # release outputs whenever the next input would have to be awaited
                    if not feed.buffered() or len(out) >= CHUNK_MAX:
                        yield out
                        out = []
            except Exception as e:
                if out:
                    yield out
                raise annotate(e, ctx.name, max(0, feed.pos - 1)) from None
            finally:
                close = getattr(agen, "aclose", None)
                if close is not None:
                    await close()
            if out:
                yield out

    return lambda ctx, inputs: pipe(inputs[0](), ctx)


# -- cardinality rules (tf.data's) ------------------------------------------------------
def _known(c: int) -> bool:
    return c >= 0


def card_take(n: int) -> Callable[[Sequence[int]], int]:
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


def card_skip(n: int) -> Callable[[Sequence[int]], int]:
    def card(cs: Sequence[int]) -> int:
        c = cs[0]
        if not _known(c):
            return c
        return 0 if n < 0 else max(0, c - n)

    return card


def card_repeat(count: int | None) -> Callable[[Sequence[int]], int]:
    def card(cs: Sequence[int]) -> int:
        c = cs[0]
        if c == 0 or count == 0:
            return 0
        if count is None or count < 0:
            return INFINITE_CARD  # as tf.data: even an unknown input repeats forever
        return c * count if _known(c) else c

    return card


def card_shard(num_shards: int, index: int) -> Callable[[Sequence[int]], int]:
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
