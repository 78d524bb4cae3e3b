"""Where a ``from_source`` run is in its epoch: the positions it reads, as plain data.

The positions of an epoch are a *virtual sequence*: ``[0, n)``, or after an elastic
resume (``af.merge_states``) the concatenation of the ``ranges`` left over by the ranks
of the run before. Rank ``i`` of ``k`` reads its virtual positions ``i, i + k, ...``;
a position ``p`` reads ``seq[perm(p)]`` (``perm`` is the epoch's ``Permutation``, or the
identity without shuffle). The state of the source is::

    {"n": 1000, "seed": 12, "shard": [k, i], "ranges": [[a, b], ...] | null, "next": t,
     "epoch": e | null}

(``next``: how many of its positions this rank has read; ``epoch``: the open index its
permutation was drawn for, null without shuffle or before it opened). Its size is constant, except
after an elastic resume, where ``ranges`` holds a few intervals per rank.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from aioflow.errors import StateMismatch
from aioflow.ops.sources_permute import Permutation

__all__ = ["Position"]

_BLOCK = 8192  # positions mapped through the permutation at once


@dataclass
class Position:
    """One rank's position in the virtual sequence of an epoch (see the module)."""

    n: int
    seed: int
    shard: tuple[int, int]
    ranges: list[tuple[int, int]] | None
    start: int  # of this run: the ``next`` it resumed from
    epoch: int | None = None  # the open index its permutation is drawn for (None: no shuffle)

    @classmethod
    def resumed(
        cls,
        st: Any,
        n: int,
        shard: tuple[int, int],
        seed: int,
        explicit: bool,
        stage: str,
        epoch: int | None = None,
    ) -> Position:
        """The position of a fresh run (``st`` None) or the one saved in state ``st``."""
        if st is None:
            return cls(n, seed, shard, None, 0, epoch)
        try:
            saved = (int(st["shard"][0]), int(st["shard"][1]))
            ranges = st["ranges"]
            ranges = None if ranges is None else [(int(a), int(b)) for a, b in ranges]
            start, st_seed, st_epoch = int(st["next"]), int(st["seed"]), st["epoch"]
        except (KeyError, TypeError, ValueError, IndexError):
            raise StateMismatch(f"{stage}: bad state {st!r:.200}") from None
        if st.get("n") != n:
            raise StateMismatch(
                f"{stage}: the state was taken of {st.get('n')!r:.50} items, not {n}"
            )
        if saved != shard:
            raise StateMismatch(
                f"{stage}: the state was taken on shard {saved[1]} of {saved[0]}, this is"
                f" shard {shard[1]} of {shard[0]} (af.merge_states re-splits the states of"
                " all ranks over a new number of ranks)"
            )
        if explicit and st_seed != seed:
            raise StateMismatch(f"{stage}: the state was taken with seed {st_seed}, not {seed}")
        if st_epoch != epoch and not (st_epoch is None and start == 0):
            raise StateMismatch(
                f"{stage}: the state was taken in epoch {st_epoch}, this run opens it in"
                f" epoch {epoch} (its open index)"
            )
        bad = start < 0 or (ranges is not None and any(not 0 <= a <= b <= n for a, b in ranges))
        pos = cls(n, st_seed, shard, ranges, start, epoch)
        if bad or start > len(range(shard[1], pos.length(), shard[0])):
            raise StateMismatch(f"{stage}: state out of range for {n} items: {st!r:.200}")
        return pos

    def length(self) -> int:
        """Positions in the virtual sequence."""
        return self.n if self.ranges is None else sum(b - a for a, b in self.ranges)

    def after(self, k: int) -> dict[str, Any]:
        """The state after this run read ``k`` items."""
        ranges = None if self.ranges is None else [list(r) for r in self.ranges]
        num, idx = self.shard
        nxt = min(self.start + k, len(range(idx, self.length(), num)))
        return {
            "n": self.n,
            "seed": self.seed,
            "shard": list(self.shard),
            "ranges": ranges,
            "next": nxt,
            "epoch": self.epoch,
        }

    def _actual(self, v: np.ndarray) -> np.ndarray:
        if self.ranges is None:
            return v
        starts = np.array([a for a, _ in self.ranges], dtype=np.int64)
        lens = np.array([b - a for a, b in self.ranges], dtype=np.int64)
        ends = np.cumsum(lens)
        which = np.searchsorted(ends, v, side="right")
        return starts[which] + v - (ends[which] - lens[which])

    def items(
        self, read: Callable[[np.ndarray], Iterable[Any]], epoch: int | None
    ) -> Iterator[Any]:
        """This rank's items from ``start`` on (``epoch`` None: no shuffle)."""
        num, idx = self.shard
        total = len(range(idx, self.length(), num))
        perm = None if epoch is None else Permutation(self.n, (self.seed, epoch))
        for t0 in range(self.start, total, _BLOCK):
            t = np.arange(t0, min(t0 + _BLOCK, total), dtype=np.int64)
            pos = self._actual(idx + num * t)
            if perm is not None:
                pos = perm.map(pos.astype(np.uint64)).astype(np.int64)
            yield from read(pos)
