"""The log of a stage that holds input items across chunks (a sort buffer, open groups,
windows, sessions, an as-of join's pending and right-hand items), so that its state after
the consumer's ``k``-th item holds exactly what it held then (see ``_state/state.py``).

A state is ``{"held": [items], "at": <the stage's scalars>, "drop": d}`` (per input,
``"held"`` is a list of lists for a stage with several inputs): the items the stage held
at the start of the input chunk before the consumer's item, in arrival order, with its
scalars (watermark, ...) then; the input resumes after what it had taken, and a resumed
run leaves out the ``d`` items of its output already delivered. Its size is what the
stage held: plain data only if the items are (``pickle`` stores any).

Nothing is copied per chunk. Each held item carries its arrival number ``seq`` (entries
are tuples ending ``(..., seq, item)``); a mark per input chunk records the outputs and
inputs so far, the stage's scalars and how long each *gone* list was. The stage appends to
``gone`` the entries that leave it (emitted, dropped, evicted) and that arrived before
the current chunk. The items held at a mark are then those held now or gone since, that
arrived before it. A lock makes a chunk's work and a state's reading one step each.
The log reaches back ``KEEP`` marks, cut to ``GONE`` entries when it has twice that, or
(``weigh``: a columnar stage, whose entries are pieces of batches) to ``ROWS`` rows when
it has twice that, so it does not grow with the stream; a state further back replays.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, NamedTuple

from aioflow._state.state import Logged, Refuse, Seek
from aioflow.errors import StateMismatch

if TYPE_CHECKING:
    from aioflow._core.ctx import Ctx
    from aioflow._core.graph import Described
    from aioflow._core.positions import Positions

__all__ = ["HeldLog", "watermark_at"]


class _Mark(NamedTuple):
    out: int  # items out so far
    taken: tuple[int, ...]  # items taken from each input so far
    gone: tuple[int, ...]  # len of each gone list (absolute: base + len)
    weight: tuple[int, ...]  # the weight (rows) of each gone list's entries so far
    scalars: Any  # the stage's own state, JSON-safe
    watermark: Any  # its output watermark then


class HeldLog:
    """Where a stage that holds items was, per input chunk (see the module doc).

    ``held()`` gives, per input, the entries the stage holds now (called under ``lock``).
    ``event_time``: the stage has a watermark (its seeker says so to ``watermark_at``).
    A resumed stage finds what to start from in ``restored`` (per input, the items in
    arrival order), ``scalars`` and ``drop``. ``watermark_at(k)`` is the stage's output
    watermark once its first ``k`` items were delivered (``it.watermark()``).
    """

    KEEP = 4096  # marks (input chunks)
    GONE = 1 << 16  # entries gone since the oldest mark kept: at most 2x (per input)
    ROWS = 1 << 18  # with ``weigh``: rows gone since the oldest mark kept, at most 2x

    def __init__(
        self,
        ctx: Ctx,
        held: Callable[[], Sequence[Sequence[Any]]],
        inputs: int = 1,
        event_time: bool = True,
        weigh: Callable[[Sequence[Any]], int] | None = None,
        cut: Callable[[Any, int], Any] | None = None,
    ) -> None:
        self.lock = threading.Lock()
        self.held = held
        self.inputs = inputs
        self.gone: list[list[Any]] = [[] for _ in range(inputs)]
        self.base = [0] * inputs  # entries cut from the front of each gone list
        self.weigh = weigh  # the rows of some entries (None: an entry is a row)
        self.cut = cut  # an entry cut to what arrived before an input position (or None)
        self.weight = [0] * inputs  # of the entries weighed so far (absolute)
        self.weighed = [0] * inputs  # entries weighed so far (absolute)
        self.marks: deque[_Mark] = deque(maxlen=self.KEEP)
        self.restored: list[list[Any]] = [[] for _ in range(inputs)]
        self.scalars: Any = None
        self.drop = 0
        st = ctx.resume
        if st is not None:
            try:
                held_in, self.scalars, self.drop = st["held"], st["at"], int(st["drop"])
                self.restored = [list(h) for h in held_in] if inputs > 1 else [list(held_in)]
                if self.drop < 0 or len(self.restored) != inputs:
                    raise ValueError
            except (KeyError, TypeError, ValueError):
                raise StateMismatch(f"{ctx.name}: bad state {st!r:.200}") from None

        # (a bound method takes no attribute: a function does)
        def at(k: int) -> tuple[dict[str, Any], Any] | None:
            return self.at(k)

        if event_time:  # what it.watermark() looks for
            at.watermark = self.watermark_at  # type: ignore[attr-defined]
        ctx.seeker(at)

    def mark(self, out: int, taken: Sequence[int], scalars: Any, watermark: Any) -> None:
        """A chunk starts (call under ``lock``): ``out`` items out, ``taken`` in, so far."""
        gone = tuple(b + len(g) for b, g in zip(self.base, self.gone, strict=True))
        if self.weigh is not None:
            for i, g in enumerate(self.gone):
                self.weight[i] += self.weigh(g[self.weighed[i] - self.base[i] :])
                self.weighed[i] = gone[i]
        mark = _Mark(out, tuple(taken), gone, tuple(self.weight), scalars, watermark)
        self.marks.append(mark)  # (KEEP: the oldest mark goes)
        for i, g in enumerate(self.gone):
            dead = self.marks[0].gone[i] - self.base[i]  # before the oldest mark: unread
            rows = self.weight[i] - self.marks[0].weight[i]
            if len(g) > 2 * self.GONE:  # too many since it: cut, and marks before the cut go
                dead = max(dead, len(g) - self.GONE)
            elif self.weigh is not None and rows > 2 * self.ROWS:
                # too many rows since it: cut at the oldest mark within ROWS of now
                m = next(m for m in self.marks if self.weight[i] - m.weight[i] <= self.ROWS)
                dead = max(dead, m.gone[i] - self.base[i])
            elif 2 * dead < len(g):  # (cut once half is dead: amortised)
                continue
            del g[:dead]
            self.base[i] += dead
            while len(self.marks) > 2 and self.marks[0].gone[i] < self.base[i]:
                self.marks.popleft()

    def _find(self, target: int) -> _Mark | None:
        for m in reversed(self.marks):
            if m.out <= target:
                return m
        return None

    def at(self, k: int) -> tuple[dict[str, Any], Any] | None:
        """The state after ``k`` items out, and what each input resumes after (None: replay)."""
        target = k + self.drop
        with self.lock:
            m = self._find(target)
            if m is None or any(g < b for g, b in zip(m.gone, self.base, strict=True)):
                return None
            held = [list(h) for h in self.held()]
            for i in range(self.inputs):
                held[i].extend(self.gone[i][m.gone[i] - self.base[i] :])
        items: list[list[Any]] = []
        for i, entries in enumerate(held):
            before = [e for e in entries if e[-2] < m.taken[i]]
            if self.cut is not None:  # (an entry of rows of several chunks: ``e[-2]`` the first)
                cut = self.cut
                before = [c for c in (cut(e, m.taken[i]) for e in before) if c is not None]
            before.sort(key=lambda e: e[-2])
            items.append([e[-1] for e in before])
        st = {"held": items if self.inputs > 1 else items[0], "at": m.scalars}
        st["drop"] = target - m.out
        return st, (list(m.taken) if self.inputs > 1 else m.taken[0])

    def watermark_at(self, k: int | None) -> Any:
        """The output watermark once ``k`` items were delivered (None: as far back as kept)."""
        with self.lock:
            if k is None:
                return self.marks[0].watermark if self.marks else None
            m = self._find(k + self.drop)
            if m is None:
                return self.marks[0].watermark if self.marks else None
            return m.watermark


def watermark_at(pipeline: Described, positions: Positions | None, k: int) -> Any:
    """The output watermark of the event-time stage nearest the sink, where it was when
    the consumer's ``k``-th item left it (``it.watermark()``); None before any
    (``positions``: the run's ``Run.resume``; None: no run yet).

    The walk maps ``k`` through the stages after it as ``take_nodes`` does; past a stage
    that cannot say (``map(ordered=False)``, a log outrun), the stage's oldest logged
    watermark stands in (it lags, it is not ahead by more than the log's reach).
    """
    if positions is None:
        return None
    p: Any = pipeline
    exact = True
    while True:
        node = p._node
        no = positions.number(node)
        seek = positions.seek(no) if no is not None else None
        wm = getattr(seek, "watermark", None)
        if wm is not None:
            return wm(k if exact else None)
        if not node.inputs:
            return None
        r = node.resume
        if exact:
            res: Any = None
            if isinstance(r, Logged) and seek is not None:
                res = seek(k)
            elif callable(r) and not isinstance(r, Seek | Refuse) and len(node.inputs) == 1:
                res = r(positions.resumed(no), k)
            if res is None or isinstance(res[1], list) or (len(res) > 2 and res[2]):
                exact = False
            else:
                k = res[1]
        p = node.inputs[0]
