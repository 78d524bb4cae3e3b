"""Combining pipelines: zip, concat, sample_from, choose_from, and interleave (fan-in).

``interleave`` follows tf.data's cycle order exactly: ``cycle_length`` sub-pipelines are
open at once, ``block_length`` items are taken from each in turn, and one that ends is
replaced by the sub-pipeline of the next input element when the cycle comes back to its
slot. With ``concurrency``, every open sub-pipeline runs in a task of its own behind a
bounded channel (``ctx.open_task``) and is read ahead from the moment it is opened.
"""

from __future__ import annotations

import asyncio
import builtins
import functools
from collections import deque
from collections.abc import AsyncGenerator, Callable, Sequence
from time import perf_counter
from typing import Any, cast

import numpy as np

from ._autotune import AUTOTUNE
from ._calls import check_concurrency
from ._logs import CycleLog
from ._runtime import (
    CHUNK_MAX,
    INFINITE_CARD,
    UNKNOWN_CARD,
    ChunkIter,
    Ctx,
    Node,
    Opener,
    Run,
    aclosing,
    items_of,
)
from .errors import PipelineError, annotate
from .pipeline import Pipeline
from .sampling import check_seed, epoch_rng, probabilities

__all__ = ["build_interleave", "choose_from", "concat", "sample_from", "zip"]


def _pipelines(name: str, ps: Sequence[Any]) -> tuple[Pipeline[Any], ...]:
    if not ps:
        raise PipelineError(f"{name} needs at least one pipeline")
    for p in ps:
        if not isinstance(p, Pipeline):
            raise PipelineError(f"{name} takes Pipelines, got {type(p).__name__}")
    return tuple(ps)


async def _zip(srcs: list[ChunkIter]) -> ChunkIter:
    bufs: list[list[Any]] = [[] for _ in srcs]
    try:
        while True:
            for i, s in enumerate(srcs):
                if not bufs[i]:
                    try:
                        bufs[i] = await anext(s)
                    except StopAsyncIteration:
                        return
            n = min(len(b) for b in bufs)
            yield list(builtins.zip(*(b[:n] for b in bufs), strict=True))
            bufs = [b[n:] for b in bufs]
    finally:
        for s in srcs:
            await s.aclose()


def zip(*pipelines: Pipeline[Any]) -> Pipeline[tuple[Any, ...]]:
    """Tuples of the items of several pipelines in lockstep, until the shortest ends.

    Example:
        >>> import aioflow as af
        >>> af.zip(af.range(3), af.from_iterable("abcd")).to_list()
        [(0, 'a'), (1, 'b'), (2, 'c')]
    """
    ps = _pipelines("zip", pipelines)

    def card(cs: Sequence[int]) -> int:
        known = [c for c in cs if c >= 0]
        if known:
            return min(known) if all(c >= 0 or c == INFINITE_CARD for c in cs) else UNKNOWN_CARD
        return INFINITE_CARD if all(c == INFINITE_CARD for c in cs) else UNKNOWN_CARD

    def build(ctx: Ctx, inputs: Sequence[Opener]) -> ChunkIter:
        return _zip([o() for o in inputs])

    return Pipeline(Node("zip", build, inputs=ps, card=card))


async def _concat(inputs: Sequence[Opener]) -> ChunkIter:
    for o in inputs:
        async with aclosing(o()) as src:
            async for chunk in src:
                yield chunk


def concat(*pipelines: Pipeline[Any]) -> Pipeline[Any]:
    """The items of several pipelines, one pipeline after another.

    Example:
        >>> import aioflow as af
        >>> af.concat(af.range(2), af.from_iterable("ab")).to_list()
        [0, 1, 'a', 'b']
    """
    ps = _pipelines("concat", pipelines)

    def card(cs: Sequence[int]) -> int:
        if any(c == INFINITE_CARD for c in cs):
            return INFINITE_CARD
        if any(c < 0 for c in cs):
            return UNKNOWN_CARD
        return sum(cs)

    return Pipeline(Node("concat", lambda ctx, inputs: _concat(inputs), inputs=ps, card=card))


# -- interleave -----------------------------------------------------------------------
#: Items gathered for output are released before a read that may wait, once this old.
_FLUSH_SECONDS = 0.0005


async def _next_chunk(gen: ChunkIter) -> list[Any] | None:
    return await anext(gen, None)


class _Sub:
    """One open sub-pipeline: its chunks, the chunk at hand, and a read started ahead.

    A one-item source with a blocking read (``Node.load``: ``read_npy`` of a local file)
    is not opened at all: ``loads`` runs its read in a batch with others on the run's
    threads (one hop for several small files); if that read fails, it is opened after
    all, and its reader raises or skips as it does anywhere.
    """

    __slots__ = (
        "buf", "gen", "i", "loads", "next", "opener", "pos", "resume", "run", "seek", "sub",
        "taken",
    )  # fmt: skip

    def __init__(self, gen: ChunkIter, run: Run, pos: int = 0, taken: int = 0) -> None:
        self.gen = gen
        self.run = run  # starts its read-ahead tasks: the run cancels what is left at close
        self.buf: list[Any] = []
        self.i = 0
        self.next: asyncio.Future[list[Any] | None] | None = None
        self.pos = pos  # of its element in the input, and items it gave (for states)
        self.taken = taken
        self.seek: Callable[[int], Any] | None = None
        self.resume: Any = None  # the state it was opened with
        self.sub: Pipeline[Any] | None = None  # a one-item source read by `loads`
        self.loads: _Loads | None = None
        self.opener: Callable[[], ChunkIter] | None = None  # opens `sub` if its read fails

    def hook(self, fn: Callable[[int], Any]) -> None:
        self.seek = fn

    def ahead(self) -> asyncio.Future[list[Any] | None]:
        """Start reading the next chunk now (for a task-opened one: starts its task)."""
        if self.next is None:
            if self.loads is not None:
                self.next = self.loads.add(self)
            else:
                self.next = self.run.start(_next_chunk(self.gen), "interleave read-ahead")
        return self.next

    async def fill(self) -> bool:
        """Take the next chunk as the one at hand; False at the end."""
        if self.loads is not None and self.next is None:
            self.ahead()
        t = self.next
        if t is None:
            chunk = await _next_chunk(self.gen)
        else:
            chunk = await t
            self.next = None  # only now: if cancelled while waiting, aclose awaits t
        if self.loads is not None:  # its batched read: its one item, or it failed
            self.loads = None
            if chunk is _FAILED:  # read it as any sub-pipeline: it raises or skips there
                assert self.opener is not None
                self.gen = self.opener()
                chunk = await _next_chunk(self.gen)
            else:
                self.gen = _no_chunks()
        if chunk is None:
            return False
        self.buf, self.i = chunk, 0
        return True

    def cancel(self) -> None:
        """Cancel the read started ahead, at once (``aclose`` then waits for it)."""
        if self.next is not None:
            self.next.cancel()

    async def aclose(self) -> None:
        t, self.next = self.next, None
        if t is not None:
            t.cancel()
            await asyncio.wait([t])
            if not t.cancelled():
                t.exception()
        if self.gen is not None:
            await self.gen.aclose()


#: Open one-item sources read in batches that count as one open sub-pipeline.
_LIGHT = 8

#: A batched read's result when it failed (the sub-pipeline is then opened and read).
_FAILED: Any = object()


async def _no_chunks() -> ChunkIter:
    return
    yield


class _Loads:
    """The blocking reads of one-item sources (``Node.load``), run in batches: all those
    asked for before the loop goes on run in one call on the run's threads, in order."""

    __slots__ = ("ctx", "meter", "pending")

    def __init__(self, ctx: Ctx) -> None:
        self.ctx = ctx
        self.pending: list[tuple[Callable[[], Any], asyncio.Future[Any]]] = []
        self.meter: Any = None  # the sub-stage's meter: items counted as an opened one's

    def add(self, s: _Sub) -> asyncio.Future[Any]:
        assert s.sub is not None
        node = s.sub._node
        if self.meter is None:
            self.meter = self.ctx.run.meter_for(node, self.ctx.meter)
            self.ctx.meter.adopt(self.meter)
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[Any] = loop.create_future()
        if not self.pending:
            loop.call_soon(self._flush)
        assert node.load is not None
        self.pending.append((node.load, fut))
        return fut

    def _flush(self) -> None:
        batch = [(load, fut) for load, fut in self.pending if not fut.done()]
        self.pending = []
        if not batch or self.ctx.run.closed:
            return
        loop = asyncio.get_running_loop()
        calls = loop.run_in_executor(self.ctx.run.thread_pool(), _load_all, [b[0] for b in batch])
        calls.add_done_callback(lambda f: self._done(f, [b[1] for b in batch]))

    def _done(self, calls: asyncio.Future[Any], futs: list[asyncio.Future[Any]]) -> None:
        if calls.cancelled() or calls.exception() is not None:
            results = [_FAILED] * len(futs)
            seconds = 0.0
        else:
            results, seconds = calls.result()
        self.meter.t_calls += seconds
        for fut, r in builtins.zip(futs, results, strict=True):
            if not fut.done():
                if r is not _FAILED:
                    self.meter.items_out += 1
                    self.meter.chunks_out += 1
                fut.set_result(r if r is _FAILED else [r])


def _load_all(loads: list[Callable[[], Any]]) -> tuple[list[Any], float]:
    t0 = perf_counter()
    out = []
    for load in loads:
        try:
            out.append(load())
        except Exception:  # (read again as an opened sub-pipeline: it raises or skips)
            out.append(_FAILED)
    return out, perf_counter() - t0


async def _close_all(subs: Sequence[_Sub | None]) -> None:
    """Close every sub-pipeline, even when this is cancelled again on the way.

    Every read-ahead is cancelled first, without waiting: a second cancellation in the
    middle must not leave the later ones reading channels that no one will close.
    """
    open_subs = [s for s in subs if s is not None]
    for s in open_subs:
        s.cancel()
    cancelled: BaseException | None = None
    for s in open_subs:
        try:
            await s.aclose()
        except asyncio.CancelledError as e:
            cancelled = e
    if cancelled is not None:
        raise cancelled


def _one_item(sub: Pipeline[Any]) -> bool:
    """A one-item source (``read_npy(path)``): the read-ahead task of its ``_Sub`` is all
    the concurrency it needs; a task and channel of its own would cost more than reading
    a small file."""
    node = sub._node
    return not node.task and not node.inputs and node.card(()) == 1


class _Opener:
    """Opens the sub-pipeline of each input element, in input order."""

    def __init__(
        self, src: ChunkIter, fn: Callable[[Any], Any], ctx: Ctx, task: bool, batch: bool = False
    ) -> None:
        self.items = cast(AsyncGenerator[Any, None], items_of(src))
        self.fn = fn
        self.ctx = ctx
        self.task = task
        self.pos = 0
        self.ended = False
        self.loads = _Loads(ctx) if batch else None  # one-item sources' reads, batched

    async def next(self) -> _Sub | None:
        if self.ended:
            return None
        x = await anext(self.items, _END)
        if x is _END:
            self.ended = True
            return None
        return self._open(x)

    def _open(self, x: Any, resume: Any = None, drop: int = 0) -> _Sub:
        try:
            sub = self.fn(x)
        except Exception as e:
            raise annotate(e, self.ctx.name, self.pos) from None
        self.pos += 1
        from .sources import iterable_chunks
        from .transforms import skip_chunks

        s = _Sub(cast(ChunkIter, None), self.ctx.run, self.pos - 1, drop)
        s.resume = resume
        if (
            self.loads is not None
            and isinstance(sub, Pipeline)
            and sub._node.load is not None
            and _one_item(sub)
            and resume is None
            and not drop
        ):
            s.sub, s.loads = sub, self.loads
            s.opener = functools.partial(self.ctx.open, sub, None, s.hook)
            return s
        if self.task and isinstance(sub, Pipeline) and not _one_item(sub):
            gen = self.ctx.open_task(sub, resume=resume, hook=s.hook)
        elif isinstance(sub, Pipeline):
            gen = self.ctx.open(sub, resume, s.hook)
        else:
            gen = iterable_chunks(sub, self.ctx)
        s.gen = skip_chunks(gen, drop) if drop else gen
        return s

    async def restore(self, st: dict[str, Any]) -> list[_Sub | None]:
        """The slots of a resumed interleave: its input's elements up to ``entered``
        are read again; those that were in a slot are opened where they were."""
        saved = {int(v[0]): (i, v[1], int(v[2])) for i, v in enumerate(st["slots"]) if v}
        slots: list[_Sub | None] = [None] * len(st["slots"])
        for p in range(int(st["entered"])):
            x = await anext(self.items, _END)
            if x is _END:
                self.ended = True
                break
            if p in saved:
                i, resume, drop = saved[p]
                slots[i] = self._open(x, resume, drop)
            else:
                self.pos += 1  # finished before the state was taken
        return slots

    async def aclose(self) -> None:
        await self.items.aclose()


_END: Any = object()


async def _cycle(
    inputs: _Opener, cycle_length: int, block_length: int, width: int, log: CycleLog
) -> ChunkIter:
    """tf.data's interleave order. With concurrency, ``width`` sub-pipelines are kept open
    and reading: the cycle's, plus the next inputs' (they fill empty slots in order)."""
    slots: list[_Sub | None] = [None] * cycle_length
    early: deque[_Sub] = deque()  # opened ahead, for the next empty slots
    cycle = block = 0
    if log.resume is not None:
        slots = await inputs.restore(log.resume)
        cycle, block = int(log.resume["cycle"]), int(log.resume["block"])
    n_open = sum(s is not None for s in slots)
    # one-item sources read in batches are light: _LIGHT of them count as one open
    # sub-pipeline, so that a batch of reads holds several files
    light = sum(s is not None and s.sub is not None for s in slots)
    out: list[Any] = []
    t_out = 0.0
    emitted = 0

    def mark() -> None:
        log.mark(emitted, cycle, block, inputs.pos - len(early), slots)

    try:
        mark()
        while not inputs.ended or n_open or early:
            while (
                inputs.task
                and (n_open + len(early)) * _LIGHT - light * (_LIGHT - 1) < width * _LIGHT
                and not inputs.ended
            ):
                e = await inputs.next()
                if e is not None:
                    e.ahead()
                    early.append(e)
                    light += e.sub is not None
            s = slots[cycle]
            if s is None:
                if early or not inputs.ended:
                    if early:
                        s = early.popleft()
                    elif (s := await inputs.next()) is not None:
                        light += s.sub is not None
                    if s is not None:
                        slots[cycle] = s
                        n_open += 1
                    continue
                cycle, block = (cycle + 1) % cycle_length, 0
                continue
            if s.i >= len(s.buf):
                if out and perf_counter() - t_out > _FLUSH_SECONDS:
                    emitted += len(out)
                    yield out
                    out = []
                    mark()
                try:
                    more = await s.fill()
                except Exception:
                    if out:  # items before an error are delivered first
                        yield out
                    raise
                if not more:
                    await s.aclose()
                    slots[cycle] = None
                    n_open -= 1
                    light -= s.sub is not None
                    cycle, block = (cycle + 1) % cycle_length, 0
                    continue
            k = min(block_length - block, len(s.buf) - s.i)
            if not out:
                t_out = perf_counter()
            out.extend(s.buf[s.i : s.i + k])
            s.i += k
            s.taken += k
            block += k
            if block == block_length:
                cycle, block = (cycle + 1) % cycle_length, 0
            if len(out) >= CHUNK_MAX:
                emitted += len(out)
                yield out
                out = []
                mark()
        if out:
            yield out
    finally:
        try:
            await _close_all((*slots, *early))
        finally:
            await inputs.aclose()


async def _merge(inputs: _Opener, width: int) -> ChunkIter:
    """Unordered: ``width`` sub-pipelines read at once; chunks as soon as any is ready."""
    # (issue 13: the one fan-in merge of the runtime, shared with partition_by)
    from ._fanin import merge

    async def next_source() -> ChunkIter | None:
        s = await inputs.next()
        return None if s is None else s.gen

    try:
        async with aclosing(merge(inputs.ctx.run, next_source, width)) as merged:
            async for chunk in merged:
                yield chunk
    finally:
        await inputs.aclose()


def build_interleave(
    fn: Callable[[Any], Any],
    cycle_length: int,
    block_length: int,
    concurrency: int | None,
    ordered: bool,
) -> Callable[[Ctx, Sequence[Opener]], ChunkIter]:
    """The build of ``Pipeline.interleave``."""
    if not callable(fn):
        raise PipelineError(f"interleave needs a callable returning a Pipeline, got {fn!r}")
    for name, v in (("cycle_length", cycle_length), ("block_length", block_length)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise PipelineError(f"interleave: {name} must be an int >= 1, got {v!r}")
    if concurrency is not None:
        check_concurrency(concurrency)
    width = cycle_length if concurrency in (None, AUTOTUNE) else max(cycle_length, concurrency)

    def build(ctx: Ctx, inputs: Sequence[Opener]) -> ChunkIter:
        opener = _Opener(inputs[0](), fn, ctx, task=concurrency is not None, batch=ordered)
        if concurrency is not None and not ordered:
            return _merge(opener, width)
        from .transforms import skip_chunks

        log = CycleLog(ctx)
        gen = _cycle(opener, cycle_length, block_length, width, log)
        return skip_chunks(gen, log.drop) if log.drop else gen

    return build


def interleave_holds(cycle_length: int, concurrency: int | None) -> int:
    """Items an interleave may hold: a chunk at hand and a channel per open sub-pipeline."""
    from ._runtime import CHANNEL_ITEMS

    width = cycle_length if concurrency in (None, AUTOTUNE) else max(cycle_length, concurrency)
    return width * (CHUNK_MAX + (CHANNEL_ITEMS if concurrency is not None else 0))


def _infinite_if_all(cs: Sequence[int]) -> int:
    return INFINITE_CARD if all(c == INFINITE_CARD for c in cs) else UNKNOWN_CARD


async def _directed(
    srcs: list[ChunkIter], picks: ChunkIter, live: list[bool], stop_on_empty: bool
) -> ChunkIter:
    """tf.data's directed interleave: for every index from ``picks``, the next item of that
    input. The index of an exhausted input is skipped (with ``stop_on_empty`` it ends the
    stream); the stream ends with ``picks`` or when every live input is exhausted.
    """
    bufs: list[list[Any]] = [[] for _ in srcs]
    at = [0] * len(srcs)
    nlive = sum(live)
    out: list[Any] = []
    try:
        if not nlive:
            return
        async for block in picks:
            for i in block:
                if not live[i]:
                    continue
                if at[i] == len(bufs[i]):
                    if out:
                        yield out
                        out = []
                    try:
                        bufs[i], at[i] = await anext(srcs[i]), 0
                    except StopAsyncIteration:
                        live[i] = False
                        nlive -= 1
                        if stop_on_empty or not nlive:
                            return
                        continue
                out.append(bufs[i][at[i]])
                at[i] += 1
            if out:
                yield out
                out = []
    finally:
        await picks.aclose()
        for s in srcs:
            await s.aclose()


def sample_from(
    ps: Sequence[Pipeline[Any]],
    weights: Sequence[float] | None = None,
    *,
    seed: int | None = None,
    stop_on_empty: bool = False,
) -> Pipeline[Any]:
    """A random mix of several pipelines (tf.data ``sample_from_datasets``).

    Every item comes from input ``i`` with probability ``weights[i]`` (uniform when
    ``None``). When an input is exhausted the others keep being sampled, their weights
    renormalized; with ``stop_on_empty`` the mix ends the first time an exhausted input is
    drawn. The same ``seed`` gives the same mix; each epoch (``repeat``, a new iteration)
    draws a new one, derived from the seed.

    Example:
        >>> import aioflow as af
        >>> mix = af.sample_from([af.range(3), af.from_iterable("ab")], [0.5, 0.5], seed=1)
        >>> sorted(map(str, mix.to_list()))
        ['0', '1', '2', 'a', 'b']
    """
    ps = _pipelines("sample_from", list(ps))
    n = len(ps)
    w = probabilities("weights", [1.0] * n if weights is None else weights, n)
    cum = np.cumsum(w)
    rseed = check_seed(seed)

    async def draws(rng: np.random.Generator) -> ChunkIter:
        # one draw per pick, in blocks: the mix does not depend on chunk sizes
        while True:
            idx = np.searchsorted(cum, rng.random(CHUNK_MAX), side="right")
            yield np.minimum(idx, n - 1).tolist()

    def build(ctx: Ctx, inputs: Sequence[Opener]) -> ChunkIter:
        picks = draws(epoch_rng(rseed, ctx.open_index))
        return _directed([o() for o in inputs], picks, [x > 0 for x in w], stop_on_empty)

    def card(cs: Sequence[int]) -> int:
        return UNKNOWN_CARD if stop_on_empty else _infinite_if_all(cs)

    key = (tuple(w.tolist()), rseed, stop_on_empty)
    return Pipeline(Node("sample_from", build, inputs=ps, card=card, key=key))


async def _indices(src: ChunkIter, n: int) -> ChunkIter:
    """The chunks of a choices pipeline, checked: an index that is not one is an error."""
    pos = 0
    async with aclosing(src):
        async for chunk in src:
            for j, i in enumerate(chunk):
                if isinstance(i, bool) or not isinstance(i, int | np.integer) or not 0 <= i < n:
                    if j:
                        yield chunk[:j]
                    raise PipelineError(
                        f"choose_from: choice {i!r} at position {pos + j} is not an index"
                        f" of the {n} inputs"
                    )
            pos += len(chunk)
            yield chunk


def choose_from(ps: Sequence[Pipeline[Any]], choices: Pipeline[Any]) -> Pipeline[Any]:
    """Items picked from several pipelines by a pipeline of indices (tf.data
    ``choose_from_datasets``).

    For every index ``i`` in ``choices`` the next item of ``ps[i]`` comes out. The result
    ends with ``choices``, or at the first index of an exhausted input (as
    ``tf.data.Dataset.choose_from_datasets`` with its default
    ``stop_on_empty_dataset=True``: the items never silently stop following the
    choices). An index outside ``range(len(ps))`` is an error (a ``PipelineError``
    naming it, after the items before it).

    Example:
        >>> import aioflow as af
        >>> af.choose_from([af.range(3), af.from_iterable("ab")],
        ...                af.from_iterable([0, 1, 1, 0, 1, 0])).to_list()
        [0, 'a', 'b', 1]
    """
    ps = _pipelines("choose_from", list(ps))
    if not isinstance(choices, Pipeline):
        raise PipelineError(f"choose_from: choices must be a Pipeline, got {type(choices)}")
    n = len(ps)

    def build(ctx: Ctx, inputs: Sequence[Opener]) -> ChunkIter:
        picks = _indices(inputs[n](), n)
        return _directed([o() for o in inputs[:n]], picks, [True] * n, True)

    return Pipeline(Node("choose_from", build, inputs=(*ps, choices), card=_infinite_if_all))
