"""The logs a running node keeps so that a state can say where it was (see ``_state/state.py``).

A node runs ahead of the consumer: when ``state_dict()`` is called for the consumer's
``k``-th item, the sources and the nodes that change counts (``flat_map``, file readers)
look ``k`` up in a short log of where their recent chunks began. Each log is appended to
on the run's loop and read from the consumer's thread (copies retried if appended to
meanwhile); each keeps its last ``KEEP`` marks, far more than a run holds in flight.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

from aioflow._core.chunks import skip_chunks
from aioflow._core.run import Build, ChunkIter, Opener, aclosing
from aioflow._state.state import Seek, resumed
from aioflow.errors import StateMismatch

if TYPE_CHECKING:
    from aioflow._core.run import Ctx

__all__ = [
    "COUNTED",
    "ChunkLog",
    "CycleLog",
    "ElementLog",
    "SeekLog",
    "ShuffleLog",
    "chunkwise",
    "counted_source",
    "frozen",
    "shuffle_check",
    "thaw",
]

M = TypeVar("M")


def snapshot(marks: deque[M]) -> list[M] | None:
    """A copy of a log appended to by another thread (None if it kept changing)."""
    for _ in range(100):
        try:
            return list(marks)
        except RuntimeError:  # appended to meanwhile (the run's thread)
            continue
    return None


def counted_source(ctx: Any) -> int:
    """A source whose state is how many items it yielded: where to start (and log it)."""
    start = resumed(ctx.resume, "next", 0)
    if start < 0:
        raise StateMismatch(f"{ctx.name}: bad state {ctx.resume!r:.200}")
    ctx.seeker(lambda k: {"next": start + k})
    return start


COUNTED = Seek(lambda: {"next": 0})


class _Element:
    __slots__ = ("at", "drop", "opened", "pos", "seek")

    def __init__(self, at: int, pos: int, drop: int, opened: Any = None) -> None:
        self.at, self.pos, self.drop, self.opened = at, pos, drop, opened
        self.seek: Callable[[int], Any] | None = None

    def hook(self, fn: Callable[[int], Any]) -> None:
        self.seek = fn


class ElementLog:
    """``flat_map``'s log: where each input element's items start in its output.

    The state after ``k`` items out is ``{"sub": <state of the element's sub-pipeline>,
    "drop": 0}`` when that sub-pipeline seeks (a file reader), else ``{"sub": null,
    "drop": d}`` (its first ``d`` items are made again and left out), with the input
    resumed at that element. Marks of the last ``KEEP`` elements are kept.
    """

    KEEP = 256  # elements (each may hold its file reader's SeekLog)

    def __init__(self, ctx: Any) -> None:
        self.resume = ctx.resume if isinstance(ctx.resume, dict) else None
        self.marks: deque[_Element] = deque(maxlen=self.KEEP)
        ctx.seeker(self.at)

    def first(self) -> tuple[Any, int]:
        """The sub-state and items to leave out of the first element of a resumed run."""
        if self.resume is None:
            return None, 0
        drop = self.resume.get("drop", 0)
        if not isinstance(drop, int) or drop < 0:
            raise StateMismatch(f"bad flat_map state {self.resume!r:.200}")
        return self.resume.get("sub"), drop

    def element(self, at: int, pos: int, drop: int, opened: Any = None) -> _Element:
        e = _Element(at, pos, drop, opened)
        self.marks.append(e)
        return e

    def at(self, k: int) -> tuple[Any, int] | None:
        marks = snapshot(self.marks)
        if marks is None:
            return None
        for e in reversed(marks):
            if e.at <= k:
                r = k - e.at + e.drop
                # not read yet (no seeker yet): where it was opened
                sub = e.seek(r) if e.seek is not None else e.opened if r == e.drop else None
                if sub is not None:
                    return {"sub": sub, "drop": 0}, e.pos
                return {"sub": None, "drop": r}, e.pos
        return (self.resume, 0) if k == 0 and not marks else None


class SeekLog:
    """Where a file reader can seek back to: ``(items produced, where)`` at block starts.

    A reader calls ``mark(offset=..., ...)`` before the items of each block it parses
    and ``produced += n`` after; the run's ``state_dict`` asks ``at(k)`` (from any thread)
    for the place to seek to after ``k`` items out: the last mark at or before, plus how
    many items to leave out after it (at most a block's). A resumed reader starts at
    ``start`` (its saved ``where``) and leaves out ``skip`` items first. Only local,
    uncompressed files seek (``seekable``, the reader's to say); the others replay.
    """

    KEEP = 256  # blocks of up to 1 MiB: far more than a run holds ahead of the consumer

    def __init__(self, ctx: Ctx, seekable: bool, **start: int) -> None:
        st = ctx.resume if isinstance(ctx.resume, dict) else {}
        self.start = {k: int(st.get(k, v)) for k, v in start.items()}
        self.skip = self._skip0 = int(st.get("skip", 0))
        if min(self.start.values(), default=0) < 0 or self.skip < 0:
            raise StateMismatch(f"{ctx.name}: bad state {ctx.resume!r:.200}")
        self.marks: deque[tuple[int, dict[str, int]]] = deque(maxlen=self.KEEP)
        self.produced = 0
        if seekable:
            ctx.seeker(self.at)

    def mark(self, **where: int) -> None:
        self.marks.append((self.produced, where))

    def drop(self, items: list[Any]) -> list[Any]:
        """The items of a block without those a resumed run leaves out."""
        if self.skip and items:
            n = min(self.skip, len(items))
            self.skip -= n
            self.produced += n
            items = items[n:]
        self.produced += len(items)
        return items

    def at(self, k: int) -> dict[str, int] | None:
        target = k + self._skip0
        marks = snapshot(self.marks)
        if marks is None:
            return None
        for produced, where in reversed(marks):
            if produced <= target:
                return {**where, "skip": target - produced}
        return None


class CycleLog:
    """``interleave``'s log: at the start of each output chunk, the cycle and its slots.

    The state after ``k`` items out: ``{"cycle", "block", "entered", "slots": [[element,
    sub-state, drop] | null], "drop": d}``, with element positions counted from the
    oldest element in a slot, where the input resumes (``k_in``). A resumed run reads the
    input's elements up to ``entered`` again, opens those that were in a slot where they
    were (a file reader by offset, others by leaving out ``drop`` items), skips the rest,
    and leaves out the ``d`` items of the chunk already delivered.
    """

    KEEP = 1024  # output chunks

    def __init__(self, ctx: Ctx) -> None:
        st = ctx.resume if isinstance(ctx.resume, dict) else None
        self.resume = st
        try:
            self.drop = 0 if st is None else int(st["drop"])
            if st is not None and (self.drop < 0 or not isinstance(st["slots"], list)):
                raise ValueError
        except (KeyError, TypeError, ValueError):
            raise StateMismatch(f"{ctx.name}: bad state {st!r:.200}") from None
        Mark = tuple[int, int, int, int, list[tuple[int, int, Any, Any] | None]]
        self.marks: deque[Mark] = deque(maxlen=self.KEEP)
        ctx.seeker(self.at)

    def mark(self, emitted: int, cycle: int, block: int, entered: int, slots: list[Any]) -> None:
        subs = [None if s is None else (s.pos, s.taken, s.seek, s.resume) for s in slots]
        self.marks.append((emitted, cycle, block, entered, subs))

    def at(self, k: int) -> tuple[dict[str, Any], int] | None:
        marks = snapshot(self.marks)
        target = k + self.drop
        for emitted, cycle, block, entered, subs in reversed(marks or ()):
            if emitted > target:
                continue
            base = min((s[0] for s in subs if s is not None), default=entered)
            slots: list[list[Any] | None] = []
            for s in subs:
                if s is None:
                    slots.append(None)
                    continue
                pos, taken, seek, opened = s
                # not read yet (no seeker yet): where it was opened
                sub = seek(taken) if seek is not None else (opened if taken == 0 else None)
                slots.append([pos - base, sub, 0 if sub is not None else taken])
            st = {"cycle": cycle, "block": block, "entered": entered - base, "slots": slots}
            return {**st, "drop": target - emitted}, base
        return None


class ShuffleLog:
    """``shuffle``'s log: its last output chunks, to undo them back to the consumer's item.

    The buffer changes only by ``buf[slot] = x`` as an item is emitted, so the buffer as
    it was ``j`` items ago is the current one with the last ``j`` emitted items put back
    in their slots. Each entry holds a chunk's slots and items (items that are in flight
    downstream anyway; at most ``KEEP`` chunks beyond those); a lock makes a chunk's
    update and its entry one step for the consumer's thread. The state: ``{"buf":
    [items], "rng": <numpy bit generator state>, "drop": d}``, its input resumed after
    the items taken so far. Its size is the buffer's: plain data only if the items are.
    """

    KEEP = 16

    def __init__(self, ctx: Ctx, rng: Any) -> None:
        self.lock = threading.Lock()
        self.rng = rng
        self.buf: list[Any] = []
        self.drop = 0
        self.taken = 0  # items in, items out, since this opening
        self.out = 0
        self.done = False  # the buffer was flushed at the end
        self.flush: tuple[int, Any] | None = None  # the flush began: (items out, rng before)
        st = ctx.resume
        if st is not None:
            try:
                self.buf, self.drop = list(st["buf"]), int(st["drop"])
                rng.bit_generator.state = st["rng"]
            except (KeyError, TypeError, ValueError):
                raise StateMismatch(f"{ctx.name}: bad state {st!r:.200}") from None
        self.entries: deque[tuple[int, int, dict[str, Any], list[int], list[Any]]] = deque(
            maxlen=self.KEEP
        )
        ctx.seeker(self.at)

    def at(self, k: int) -> tuple[dict[str, Any], int] | None:
        target = k + self.drop
        with self.lock:
            buf, entries = list(self.buf), list(self.entries)
            out, taken, rng = self.out, self.taken, self.rng.bit_generator.state
            if self.done and target >= out:  # past the end: the buffer was emptied
                return {"buf": [], "rng": rng, "drop": 0}, taken
            flush = self.flush
        if flush is not None and target >= flush[0]:
            # in the flush (its permutation drawn, maybe none of it out yet): from its start
            return {"buf": buf, "rng": flush[1], "drop": target - flush[0]}, taken
        for out_before, taken_before, rng_before, slots, items in reversed(entries):
            if out <= target:
                break
            for i in range(len(slots) - 1, -1, -1):  # put the emitted items back
                if slots[i] >= 0:
                    buf[slots[i]] = items[i]
            out, taken, rng = out_before, taken_before, rng_before
        if out > target:
            return None  # further back than the log reaches: replay
        return {"buf": buf, "rng": rng, "drop": target - out}, taken


class ChunkLog:
    """The log of a one-input stage whose state is small and changes per item: at each
    input chunk's start, ``(items out, items in, its state)``.

    The state after ``k`` items out: ``{"state": <the stage's state at that chunk's
    start>, "drop": d}``, the input resumed at that chunk; a resumed run computes the
    chunk again and leaves out the ``d`` items already delivered (``scan``: the carried
    state; ``rejection_resample``: the generator and the class counts).
    """

    KEEP = 4096

    def __init__(self, ctx: Ctx) -> None:
        st = ctx.resume
        self.state: Any = None
        self.drop = 0
        if st is not None:
            try:
                self.state, self.drop = st["state"], int(st["drop"])
            except (KeyError, TypeError, ValueError):
                raise StateMismatch(f"{ctx.name}: bad state {st!r:.200}") from None
        self.marks: deque[tuple[int, int, Any]] = deque(maxlen=self.KEEP)
        ctx.seeker(self.at)

    def mark(self, out: int, taken: int, state: Any) -> None:
        self.marks.append((out, taken, state))

    def at(self, k: int) -> tuple[dict[str, Any], int] | None:
        target = k + self.drop
        for out, taken, state in reversed(snapshot(self.marks) or ()):
            if out <= target:
                if state is UNSAVED:
                    return None
                return {"state": state, "drop": target - out}, taken
        return None


#: A ``ChunkLog`` mark whose state was not kept: a state there replays.
UNSAVED: Any = object()


def frozen(v: Any, depth: int = 0) -> Any:
    """``v`` as plain data if it is immutable (numbers, strings, None, short tuples of
    them; a tuple as ``{"tuple": [...]}``), else ``UNSAVED``: a reference to it is safe to
    keep in a log, since nothing can change it in place."""
    t = type(v)
    if t is int or t is float or t is str or t is bool or v is None:
        return v
    if t is tuple and depth < 4 and len(v) <= 64:
        items = [frozen(x, depth + 1) for x in v]
        return UNSAVED if any(x is UNSAVED for x in items) else {"tuple": items}
    return UNSAVED


def thaw(v: Any) -> Any:
    """What ``frozen`` made, back."""
    if isinstance(v, dict):
        return tuple(thaw(x) for x in v["tuple"])
    return v


def chunkwise(build: Build) -> Build:
    """A one-input inline stage that maps each input chunk to its output alone (``filter``,
    ``map(on_error="skip")``, ``unbatch``), made resumable: ``ChunkLog`` marks each input
    chunk's start with the items out so far (the chunk before was fully delivered, since
    the stage runs inline), and a resumed run computes that chunk again."""

    def wrapped(ctx: Ctx, inputs: Sequence[Opener]) -> ChunkIter:
        log = ChunkLog(ctx)
        counts = [0, 0]  # items in, items out

        async def counted() -> ChunkIter:
            async with aclosing(inputs[0]()) as src:
                async for chunk in src:
                    log.mark(counts[1], counts[0], None)
                    counts[0] += len(chunk)
                    yield chunk

        async def out() -> ChunkIter:
            async with aclosing(build(ctx, (counted,))) as gen:
                async for chunk in gen:
                    counts[1] += len(chunk)
                    yield chunk

        return skip_chunks(out(), log.drop) if log.drop else out()

    return wrapped


def shuffle_check(size: int) -> Callable[[Any, int, Any], str | None]:
    """What of a ``ShuffleLog`` state disagrees with the counts (``Logged.check``): the
    buffer holds every item taken and not yet out, ``drop`` of them out past its chunk."""

    def check(st: Any, k: int, k_in: Any) -> str | None:
        if not isinstance(st, dict) or set(st) != {"buf", "rng", "drop"}:
            return f"not a shuffle state: {st!r:.200}"
        buf, drop = st["buf"], st["drop"]
        if not isinstance(buf, list) or len(buf) > size:
            return f"a buffer of at most {size} items is needed, got {buf!r:.100}"
        if not isinstance(drop, int) or isinstance(drop, bool) or drop < 0:
            return f"bad drop {drop!r:.100}"
        if k != k_in - len(buf) + drop:
            return f"{k} items out disagree with {k_in} in, {len(buf)} held and {drop} left out"
        return None

    return check
