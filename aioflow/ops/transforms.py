"""Per-item transforms: map, filter, flat_map, scan, enumerate, and ``pipe`` (a user's own
async-generator stage). ``take``, ``skip``, ``repeat``, ``shard``, ``prefetch``: ``slicing``.

Each operator is one ``*_node`` function here that checks its arguments and makes the
complete ``Node`` (its async generator over the chunks of its input, see ``_core/run``;
whether it runs in a task; what it holds; its cardinality and state); the ``Pipeline``
methods in ``pipeline.py`` are one line each on top of them.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Sequence
from concurrent.futures import Executor
from functools import partial
from typing import TYPE_CHECKING, Any, cast

from aioflow._calls.maps import DROP, ErrorPolicy, concurrent_map, inline_map, is_async_callable
from aioflow._core.autotune import AUTOTUNE, resolve_concurrency
from aioflow._core.base import PipelineBase
from aioflow._core.chunks import enumerate_chunks, iterable_chunks, skip_chunks
from aioflow.errors import PipelineError
from aioflow.ops.columnar import kind_of, masked
from aioflow.ops.kit import (
    CHUNK_MAX,
    INFINITE_CARD,
    LOGGED,
    LOGGED_DEEP,
    NOTHING,
    UNKNOWN_CARD,
    Build,
    ChunkIter,
    ChunkLog,
    Ctx,
    ElementLog,
    Hints,
    Node,
    Opener,
    aclosing,
    call,
    call_resume,
    check_concurrency,
    check_executor,
    check_int,
    chunkwise,
    counting,
    each,
    fn_name,
    frozen,
    read_one,
    resumed,
    thaw,
)

if TYPE_CHECKING:
    from aioflow.pipeline import Pipeline

__all__: list[str] = []  # the operators are Pipeline methods


def map_node(
    up: Pipeline[Any],
    fn: Callable[[Any], Any],
    *,
    concurrency: int,
    executor: str | Executor | None,
    ordered: bool,
    on_error: str | int,
    timeout: float | None,
    keep: bool = False,
    columns: int = 0,
    owner: Node | None = None,
) -> Node:
    """The node of ``map`` (``keep=False``) and ``filter`` (``keep=True``).

    A sync ``fn`` with no knobs runs inline in the stage before it; an async one
    with none runs as calls on the loop, in that stage too; any knob gives the stage a
    task of its own, with ``slots`` calls in flight. A process map without ``timeout``
    can be made again for the ``batch(n)`` after it (``Node.hints.columns``): ``columns=n``
    sends its workers tasks within one batch, stacked there (``_process/columns``), with
    the pool of ``owner`` (the user's map), so that the pool stays warm however often the
    batch after it is rebuilt.
    """
    is_async = _check_call(fn, concurrency, executor, on_error, timeout)
    task = concurrency != 1 or executor is not None or timeout is not None
    inline = not task and not is_async
    slots = resolve_concurrency(concurrency, executor)
    # (a filter of record batches by a row mask keeps the rows: ops/columnar.masked)
    post = (lambda x, y: masked(x, y, DROP)) if keep else None

    def build(ctx: Ctx, inputs: Sequence[Opener]) -> ChunkIter:
        src = inputs[0]()
        policy = ErrorPolicy(on_error)
        if inline and keep:
            return _inline_filter(src, fn, ctx, policy)
        if inline:
            return inline_map(src, fn, ctx, policy, keep=keep)
        return concurrent_map(
            src,
            fn,
            ctx,
            policy,
            concurrency=slots,
            ordered=ordered,
            executor=executor,
            timeout=timeout,
            post=post,
            autotune=concurrency == AUTOTUNE,
            columns=columns,
        )

    stacks = executor == "process" and not keep and timeout is None and not columns

    def stackable(n: int, owner: Node) -> Node:
        return map_node(
            up, fn, concurrency=concurrency, executor=executor, ordered=ordered,
            on_error=on_error, timeout=timeout, columns=n, owner=owner,
        )  # fmt: skip

    resume = call_resume(keep, ordered, on_error)
    made: Build = build
    if resume is None and not task:  # inline: each input chunk maps to its output
        made, resume = chunkwise(build), LOGGED_DEEP
    return Node(
        f"{'filter' if keep else 'map'}({fn_name(fn)})",
        made,
        inputs=(up,),
        card=_card_filter if keep else _card_same,
        task=task,
        # (a stacked map has a task of up to ``columns`` items out per pool slot, 2 a
        # worker, and gathers the next batch's items, up to ``columns``, to cut tasks)
        holds=2 * slots * max(1, columns) + columns + CHUNK_MAX,
        key=(fn, concurrency, executor if isinstance(executor, str) else None, ordered),
        resume=resume,
        hints=Hints(
            pool=(fn, slots, timeout, ordered) if executor == "process" else None,
            columns=stackable if stacks else None,
            pool_owner=owner,
        ),
    )


async def _inline_filter(
    src: ChunkIter, fn: Callable[[Any], Any], ctx: Ctx, policy: ErrorPolicy
) -> ChunkIter:
    """An inline filter; on record batches (the first item tells) a filter of their rows
    by the row mask ``fn`` gives (``ops/columnar.masked``), an empty batch left out."""
    async with aclosing(src):
        first = None
        async for chunk in src:
            first = chunk
            break
        if first is None:
            return
        rest = _chain(first, src)
        if not first or kind_of(first[0]) is None:
            async for out in inline_map(rest, fn, ctx, policy, keep=True):
                yield out
            return
        rows = partial(_rows_of, fn)
        async for out in inline_map(rest, rows, ctx, policy, keep=False):
            out = [x for x in out if x is not DROP]
            if out:
                yield out


def _rows_of(fn: Callable[[Any], Any], x: Any) -> Any:
    return masked(x, fn(x), DROP)


async def _chain(first: list[Any], src: ChunkIter) -> ChunkIter:
    yield first
    async for c in src:
        yield c


def _check_call(
    fn: Callable[[Any], Any],
    concurrency: int,
    executor: str | Executor | None,
    on_error: str | int,
    timeout: float | None,
) -> bool:
    """Check ``map``'s arguments when the pipeline is described; True if ``fn`` is async."""
    if not callable(fn):
        raise PipelineError(f"map/filter needs a callable, got {type(fn).__name__}")
    check_concurrency(concurrency)
    check_executor(executor)
    is_async = is_async_callable(fn)
    if executor == "process" and is_async:
        raise PipelineError(
            "an async function cannot run in a worker process (executor='process');"
            " leave executor=None to run it as tasks on the loop"
        )
    ErrorPolicy(on_error)
    if timeout is not None and not timeout > 0:
        raise PipelineError(f"timeout must be a positive number of seconds, got {timeout!r}")
    return is_async


def flat_map_node(up: Pipeline[Any], fn: Callable[[Any], Any]) -> Node:
    """``flat_map``: the items of ``fn(x)`` (a list, an iterable or a ``Pipeline``)."""

    async def flat(src: ChunkIter, ctx: Ctx) -> ChunkIter:
        pos = 0
        emitted = 0  # items out, for the state (see ElementLog)
        log = ElementLog(ctx)
        out: list[Any] = []
        async with aclosing(src):
            async for chunk in src:
                for x in chunk:
                    sub, err = call(fn, x, ctx.name, pos)
                    if err is not None:
                        if out:
                            yield out
                        raise err
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
                    if isinstance(sub, PipelineBase):
                        subchunks = ctx.open(cast("Pipeline[Any]", sub), resume, entry.hook)
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

    return Node(
        f"flat_map({fn_name(fn)})",
        lambda ctx, inputs: flat(inputs[0](), ctx),
        inputs=(up,),
        card=_unknown,
        key=(fn,),
        resume=LOGGED,
    )


def scan_node(
    up: Pipeline[Any], initial_state: Any, fn: Callable[[Any, Any], tuple[Any, Any]]
) -> Node:
    """``scan``: ``fn(state, x) -> (state, y)`` yields ``y``.

    It resumes from the carried state at the start of the consumer's input chunk
    (``ChunkLog``) when that state is plain immutable data (numbers, strings, None and
    tuples of them: a reference to it cannot change under the log); a state ``fn`` may
    change in place (a list, a dict, an object) is not kept, and resuming replays.
    """

    async def scan(src: ChunkIter, ctx: Ctx, log: ChunkLog) -> ChunkIter:
        state = initial_state if log.state is None else thaw(log.state)
        pos = emitted = 0

        def step(x: Any) -> Any:
            nonlocal state
            state, y = fn(state, x)
            return y

        async with aclosing(src):
            async for chunk in src:
                log.mark(emitted, pos, frozen(state))
                out, err = each(step, chunk, ctx.name, pos)
                if out:
                    emitted += len(out)
                    yield out
                if err is not None:
                    raise err
                pos += len(chunk)

    def build(ctx: Ctx, inputs: Sequence[Opener]) -> ChunkIter:
        log = ChunkLog(ctx)
        gen = scan(inputs[0](), ctx, log)
        return skip_chunks(gen, log.drop) if log.drop else gen

    return Node(f"scan({fn_name(fn)})", build, inputs=(up,), key=(fn,), resume=LOGGED_DEEP)


def enumerate_node(up: Pipeline[Any], start: int) -> Node:
    """``enumerate``: pairs ``(i, item)`` counting from ``start``."""
    check_int("start", start)
    return Node(
        "enumerate",
        lambda ctx, inputs: enumerate_chunks(inputs[0](), resumed(ctx.resume, "next", start)),
        inputs=(up,),
        key=(start,),
        resume=counting(start),
    )


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


def pipe_node(up: Pipeline[Any], stage: Callable[[AsyncIterator[Any]], AsyncIterator[Any]]) -> Node:
    """``pipe``: the user's async generator function over the items, as a stage."""
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
                while True:
                    y, err = await read_one(agen, ctx.name, lambda: max(0, feed.pos - 1))
                    if y is NOTHING:
                        break
                    out.append(y)
                    # release outputs whenever the next input would have to be awaited
                    if not feed.buffered() or len(out) >= CHUNK_MAX:
                        yield out
                        out = []
            finally:
                close = getattr(agen, "aclose", None)
                if close is not None:
                    await close()
            if out:
                yield out
            if err is not None:
                raise err

    return Node(
        f"pipe({fn_name(stage)})",
        lambda ctx, inputs: pipe(inputs[0](), ctx),
        inputs=(up,),
        card=_unknown,
        key=(stage,),
    )


# -- cardinality rules (tf.data's) ------------------------------------------------------
def _unknown(cs: Sequence[int]) -> int:
    return UNKNOWN_CARD


def _card_same(cs: Sequence[int]) -> int:
    return cs[0] if cs else UNKNOWN_CARD


def _card_filter(cs: Sequence[int]) -> int:
    return UNKNOWN_CARD if cs[0] != INFINITE_CARD else INFINITE_CARD
