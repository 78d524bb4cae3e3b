"""``interleave``: the items of many sub-pipelines, one per input element (fan-in).

It follows tf.data's cycle order exactly: ``cycle_length`` sub-pipelines are open at
once, ``block_length`` items are taken from each in turn, and one that ends is replaced
by the sub-pipeline of the next input element when the cycle comes back to its slot.
With ``concurrency``, every open sub-pipeline runs in a task of its own behind a bounded
channel (``ctx.open_task``) and is read ahead from the moment it is opened.
"""

from __future__ import annotations

import functools
from collections import deque
from collections.abc import AsyncGenerator, Callable, Sequence
from time import perf_counter
from typing import TYPE_CHECKING, Any, cast

from aioflow._core.autotune import AUTOTUNE
from aioflow._core.base import PipelineBase
from aioflow._core.chunks import iterable_chunks, skip_chunks
from aioflow._core.fanin import merge
from aioflow._core.tasks import aclosing
from aioflow.errors import PipelineError
from aioflow.ops.interleave_subs import Loads, Sub, close_all
from aioflow.ops.kit import (
    CHANNEL_ITEMS,
    CHUNK_MAX,
    LOGGED,
    UNKNOWN_CARD,
    UNORDERED,
    ChunkIter,
    Ctx,
    CycleLog,
    Node,
    Opener,
    Refuse,
    call,
    check_concurrency,
    check_int,
    fn_name,
    items_of,
)

if TYPE_CHECKING:
    from aioflow.pipeline import Pipeline

__all__: list[str] = []  # Pipeline.interleave

#: Items gathered for output are released before a read that may wait, once this old.
_FLUSH_SECONDS = 0.0005


#: Open one-item sources read in batches that count as one open sub-pipeline.
_LIGHT = 8


def _one_item(sub: PipelineBase) -> bool:
    """A one-item source (``read_npy(path)``): the read-ahead task of its ``Sub`` is all
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
        self.loads = Loads(ctx) if batch else None  # one-item sources' reads, batched
        # fn's own blocking read of x's one item (``read_npy``: x a local path), if it has
        # one: x's sub-pipeline is then made only if that read fails
        self.direct: Callable[[Any], Callable[[], Any] | None] | None = (
            getattr(fn, "direct_load", None) if batch else None
        )

    async def next(self) -> Sub | None:
        if self.ended:
            return None
        x = await anext(self.items, _END)
        if x is _END:
            self.ended = True
            return None
        return self._open(x)

    def _open(self, x: Any, resume: Any = None, drop: int = 0) -> Sub:
        loads = self.loads if resume is None and not drop else None
        if loads is not None and loads.meter is not None and self.direct is not None:
            load = self.direct(x)
            if load is not None:  # (the first one opens as below: its meter is the stage's)
                self.pos += 1
                s = Sub(cast(ChunkIter, None), self.ctx.run, self.pos - 1)
                s.load, s.loads = load, loads
                s.opener = functools.partial(self._open_late, x, s)
                return s
        sub, err = call(self.fn, x, self.ctx.name, self.pos)
        if err is not None:
            raise err
        self.pos += 1
        s = Sub(cast(ChunkIter, None), self.ctx.run, self.pos - 1, drop)
        s.resume = resume
        if (
            loads is not None
            and isinstance(sub, PipelineBase)
            and sub._node.hints.load is not None
            and _one_item(sub)
        ):
            loads.count_on(sub._node)
            s.load, s.loads = sub._node.hints.load, loads
            s.opener = functools.partial(self.ctx.open, cast("Pipeline[Any]", sub), None, s.hook)
            return s
        if self.task and isinstance(sub, PipelineBase) and not _one_item(sub):
            gen = self.ctx.open_task(cast("Pipeline[Any]", sub), resume=resume, hook=s.hook)
        elif isinstance(sub, PipelineBase):
            gen = self.ctx.open(cast("Pipeline[Any]", sub), resume, s.hook)
        else:
            gen = iterable_chunks(sub, self.ctx)
        s.gen = skip_chunks(gen, drop) if drop else gen
        return s

    def _open_late(self, x: Any, s: Sub) -> ChunkIter:
        """The sub-pipeline of ``x`` after all, when its direct read failed: it raises or
        skips there as anywhere."""
        sub, err = call(self.fn, x, self.ctx.name, s.pos)
        if err is not None:
            raise err
        return self.ctx.open(cast("Pipeline[Any]", sub), None, s.hook)

    async def restore(self, st: dict[str, Any]) -> list[Sub | None]:
        """The slots of a resumed interleave: its input's elements up to ``entered``
        are read again; those that were in a slot are opened where they were."""
        saved = {int(v[0]): (i, v[1], int(v[2])) for i, v in enumerate(st["slots"]) if v}
        slots: list[Sub | None] = [None] * len(st["slots"])
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


class _Ahead:
    """The open sub-pipelines the cycle's slots don't hold: those opened early (with
    concurrency), reading ahead, for the next empty slots in order. One-item sources read
    in batches are light: ``_LIGHT`` of them count as one open sub-pipeline, so that a
    batch of reads holds several files."""

    __slots__ = ("early", "inputs", "light", "n_open", "width")

    def __init__(self, inputs: _Opener, slots: list[Sub | None], width: int) -> None:
        self.inputs = inputs
        self.width = width
        self.early: deque[Sub] = deque()
        self.n_open = sum(s is not None for s in slots)  # in slots
        self.light = sum(s is not None and s.load is not None for s in slots)  # slots, early

    def more(self) -> bool:
        return not self.inputs.ended or bool(self.n_open or self.early)

    async def fill(self) -> None:
        """With concurrency: open the next inputs while there is room, reading ahead."""
        inputs = self.inputs
        while inputs.task and not inputs.ended and self._weight() < self.width * _LIGHT:
            e = await inputs.next()
            if e is not None:
                e.ahead()
                self.early.append(e)
                self.light += e.load is not None

    def _weight(self) -> int:
        return (self.n_open + len(self.early)) * _LIGHT - self.light * (_LIGHT - 1)

    async def next(self) -> Sub | None:
        """For an empty slot: the oldest opened early, or the next input's (None: ended)."""
        if self.early:
            s: Sub | None = self.early.popleft()
        elif (s := await self.inputs.next()) is not None:
            self.light += s.load is not None
        if s is not None:
            self.n_open += 1
        return s

    def closed(self, s: Sub) -> None:
        self.n_open -= 1
        self.light -= s.load is not None


class _Turn:
    """Whose turn it is in tf.data's cycle: the slot read now, and the items it gave in
    its current block (``block_length`` of them, then the turn passes to the next slot)."""

    __slots__ = ("block", "block_length", "cycle", "slots")

    def __init__(self, slots: list[Sub | None], block_length: int, cycle: int, block: int) -> None:
        self.slots = slots
        self.block_length = block_length
        self.cycle = cycle
        self.block = block

    def pass_on(self) -> None:
        self.cycle, self.block = (self.cycle + 1) % len(self.slots), 0

    async def close(self, s: Sub, ahead: _Ahead) -> None:
        """The slot's sub-pipeline ended: close it, free the slot, pass the turn on."""
        await s.aclose()
        self.slots[self.cycle] = None
        ahead.closed(s)
        self.pass_on()

    def take(self, s: Sub, out: _Out) -> None:
        """Move what is left of the slot's block, from its chunk at hand, to ``out``."""
        k = min(self.block_length - self.block, len(s.buf) - s.i)
        out.add(s.buf[s.i : s.i + k])
        s.i += k
        s.taken += k
        self.block += k
        if self.block == self.block_length:
            self.pass_on()


class _Out:
    """The items gathered for output, released as a chunk when ``CHUNK_MAX`` long, or
    before a read that may wait once older than ``_FLUSH_SECONDS``."""

    __slots__ = ("emitted", "items", "t0")

    def __init__(self) -> None:
        self.items: list[Any] = []
        self.t0 = 0.0  # when its first item came
        self.emitted = 0  # items released so far (for the state)

    def add(self, items: list[Any]) -> None:
        if not self.items:
            self.t0 = perf_counter()
        self.items.extend(items)

    def due(self) -> bool:
        return bool(self.items) and perf_counter() - self.t0 > _FLUSH_SECONDS

    def release(self) -> list[Any]:
        chunk, self.items = self.items, []
        self.emitted += len(chunk)
        return chunk


async def _cycle(
    inputs: _Opener, cycle_length: int, block_length: int, width: int, log: CycleLog
) -> ChunkIter:
    """tf.data's interleave order. With concurrency, ``width`` sub-pipelines are kept open
    and reading: the cycle's, plus the next inputs' (they fill empty slots in order)."""
    turn = _Turn([None] * cycle_length, block_length, 0, 0)
    if log.resume is not None:
        st = log.resume
        turn = _Turn(await inputs.restore(st), block_length, int(st["cycle"]), int(st["block"]))
    slots = turn.slots
    ahead = _Ahead(inputs, slots, width)
    out = _Out()

    def mark() -> None:
        log.mark(out.emitted, turn.cycle, turn.block, inputs.pos - len(ahead.early), slots)

    try:
        mark()
        while ahead.more():
            await ahead.fill()
            s = slots[turn.cycle]
            if s is None:  # an empty slot: the next sub-pipeline, or the turn passes
                if ahead.early or not inputs.ended:
                    slots[turn.cycle] = await ahead.next()
                else:
                    turn.pass_on()
                continue
            if s.i >= len(s.buf):  # its chunk at hand is used up: read its next one
                if out.due():
                    yield out.release()
                    mark()
                if not await s.fill():
                    await turn.close(s, ahead)
                    continue
            turn.take(s, out)
            if len(out.items) >= CHUNK_MAX:
                yield out.release()
                mark()
        if out.items:
            yield out.items
    except Exception:
        # a sub-pipeline, the input or fn failed: the items gathered before come out first
        if out.items:
            yield out.items
        raise
    finally:
        try:
            await close_all((*slots, *ahead.early))
        finally:
            await inputs.aclose()


async def _merge(inputs: _Opener, width: int) -> ChunkIter:
    """Unordered: ``width`` sub-pipelines read at once; chunks as soon as any is ready."""

    async def next_source() -> ChunkIter | None:
        s = await inputs.next()
        return None if s is None else s.gen

    try:
        async with aclosing(merge(inputs.ctx.run, next_source, width)) as merged:
            async for chunk in merged:
                yield chunk
    finally:
        await inputs.aclose()


def interleave_node(
    up: Pipeline[Any],
    fn: Callable[[Any], Any],
    cycle_length: int,
    block_length: int,
    concurrency: int | None,
    ordered: bool,
) -> Node:
    """``interleave``: tf.data's cycle order, or completion order (``ordered=False``).

    ``width`` sub-pipelines are open at once: ``cycle_length``, or ``concurrency`` when
    larger (the next inputs' sub-pipelines, opened early); each holds a chunk at hand,
    and with ``concurrency`` a channel of its own in a task of its own.
    """
    if not callable(fn):
        raise PipelineError(f"interleave needs a callable returning a Pipeline, got {fn!r}")
    for name, v in (("cycle_length", cycle_length), ("block_length", block_length)):
        check_int(f"interleave: {name}", v, 1)
    if concurrency is not None:
        check_concurrency(concurrency)
    width = cycle_length if concurrency in (None, AUTOTUNE) else max(cycle_length, concurrency)
    task = concurrency is not None

    def build(ctx: Ctx, inputs: Sequence[Opener]) -> ChunkIter:
        opener = _Opener(inputs[0](), fn, ctx, task=task, batch=ordered)
        if concurrency is not None and not ordered:
            return _merge(opener, width)
        log = CycleLog(ctx)
        gen = _cycle(opener, cycle_length, block_length, width, log)
        return skip_chunks(gen, log.drop) if log.drop else gen

    return Node(
        f"interleave({fn_name(fn)})",
        build,
        inputs=(up,),
        card=lambda _: UNKNOWN_CARD,
        task=task,
        holds=width * (CHUNK_MAX + (CHANNEL_ITEMS if task else 0)),
        key=(fn, cycle_length, block_length, concurrency, ordered),
        resume=LOGGED if ordered else Refuse(UNORDERED),
    )
