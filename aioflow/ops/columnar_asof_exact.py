"""``asof_join(..., max_keys=n)`` on record batches: ``ColAsofExact``, the per-item machine
(``AsofJoin``) run on the rows' arrival numbers, the rows' data staying in their batches.

With ``max_keys`` a new key evicts the least recently updated one, so which left row
misses its match depends on the order of the per-item join's steps (a Python step per
row here, as ``columnar_sessions`` does for its limits). The inner machine holds, for
each row, its time, key and arrival number; ``ColAsof`` keeps the rows (``pend``: those
the machine has pending, in its order; ``right``: those it holds, in arrival order) and
makes the output of what the machine releases, as for its own path.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from aioflow.ops.columnar_asof import ColAsof
from aioflow.ops.columnar_rows import Rows

if TYPE_CHECKING:
    from aioflow.ops.asof import AsofJoin

__all__ = ["ColAsofExact"]

_FAR = -(1 << 62)  # the inner machine's ``taken``: it logs nothing itself


class ColAsofExact(ColAsof):
    """``asof_join`` with ``max_keys`` on batches (see the module doc); ``machine`` is
    ``AsofJoin`` (given, not imported: ``ops/asof`` imports this module)."""

    def __init__(
        self,
        on: str,
        by: str | None,
        tolerance: Any,
        max_delay: Any,
        max_keys: int,
        machine: Callable[..., AsofJoin],
    ) -> None:
        super().__init__(on, by, tolerance, max_delay)
        self.pm = machine(tolerance, max_delay, max_keys)
        self.pm.taken = [_FAR, _FAR]

    def to_units(self) -> None:
        self.pm.tol, self.pm.delay = self.tol, self.delay

    def floor_out(self) -> Any:
        return self.pm.watermark

    def keys(self, r: Rows) -> list[list[Any]]:
        t = r.cols["t"].tolist()
        return [t, r.cols["k"].tolist()] if self.by is not None else [t]

    # -- the sides: the inner machine's steps ---------------------------------------------
    def left_rows(self, new: Rows, out: list[Any]) -> None:
        new.cols["late"] = np.zeros(len(new), bool)  # (the machine knows: ``lates``)
        self.pend = self.pend.cat(new)
        got: list[Any] = []
        s0 = int(new.seq[0])
        self.pm.add_left(self.keys(new), range(s0, s0 + len(new)), s0, got)
        self.exact(got, out)

    def right_rows(self, new: Rows, out: list[Any]) -> None:
        self.right = self.right.cat(new)
        got: list[Any] = []
        s0 = int(new.seq[0])
        self.pm.add_right(self.keys(new), range(s0, s0 + len(new)), s0, got)
        self.exact(got, out)

    def end_right(self, out: list[Any]) -> None:
        self.rdone = True
        got: list[Any] = []
        self.pm.end_right(got)
        self.exact(got, out)

    def finish(self) -> None:
        super().finish()
        self.pm.finish()

    def exact(self, got: list[Any], out: list[Any]) -> None:
        """Out: the pairs ``got`` (arrival numbers); the right rows it dropped go."""
        pm = self.pm
        self.max, self.maxr, self.late, self.evicted = pm.maxl, pm.maxr, pm.late, pm.evicted
        if got:
            j = np.full(len(got), -1, np.int64)
            ids = np.asarray([0 if m is None else m for _, m in got], np.int64)
            hit = np.asarray([m is not None for _, m in got], bool)
            j[hit] = np.searchsorted(self.right.seq, ids[hit])
            self.emit(j, len(got), out)
        held = np.fromiter((e[1] for lst in pm.right.values() for e in lst), np.int64)
        r = self.right
        keep = np.isin(r.seq, held)
        if not keep.all():
            self.gone[1].extend(r.pieces(np.flatnonzero(~keep), before=self.taken[1]))
            self.right = r.take(np.flatnonzero(keep))

    # -- the state ------------------------------------------------------------------------
    @staticmethod
    def sort_right(r: Rows) -> Rows:
        return r  # (in arrival order, as the machine's arrival numbers)

    def lates(self) -> list[int]:
        return [i for i, e in enumerate(self.pm.pending) if e[3][1]]

    def restore(self, scalars: dict[str, Any], left: Sequence[Any], right: Sequence[Any]) -> None:
        super().restore(scalars, left, right)
        p, r = self.pend, self.right
        lates = p.cols["late"].tolist()
        self.pm.restore(
            {"maxl": self.max, "maxr": self.maxr, "rdone": self.rdone},
            (self.keys(p), list(zip(p.seq.tolist(), lates, strict=True))),
            (self.keys(r), r.seq.tolist()),
        )
