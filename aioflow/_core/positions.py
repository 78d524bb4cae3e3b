"""Where a run's nodes are: numbered, opened, and able to say where they were.

One object per run, ``Run.resume``: the iterator builds it (``_state/resume.Resume``, a
``Positions`` made from a checked state, or a fresh one) and hands it to the run. The run
asks it for each node's open index when it opens the node; a node's ``Ctx`` asks it for
the state the node starts from (``start``) and hands it the node's seeker; a state is
taken by asking it for the seekers (``seek``) and the states the run resumed from
(``resumed``). See ``_state/state.py`` for the protocol.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from aioflow._core.graph import Described, Node, number_nodes, unagreed

__all__ = ["Positions"]

Seeker = Callable[[int], Any]


class Positions:
    """The resume bookkeeping of one run (see the module).

    ``opens`` / ``nodes`` / ``counts``: per node number, the open index, state and count
    of the run resumed from (``opens`` None: a fresh run, whose nodes take the next open
    index of their own).
    """

    def __init__(
        self,
        root: Described | None = None,
        opens: dict[int, int] | None = None,
        nodes: dict[int, Any] | None = None,
        counts: dict[int, int] | None = None,
    ) -> None:
        # static nodes are numbered in the root's graph, so that a state can name them
        self.index: dict[int, int] = {} if root is None else number_nodes(root)
        self.opens = opens
        self.nodes: dict[int, Any] = nodes or {}
        self.counts: dict[int, int] = counts or {}
        self.first_open: dict[int, int] = {}  # node number -> its open index first in this run
        self._opened: dict[int, int] = {}  # node number -> times opened in this run
        self._seekers: dict[tuple[int, int], Seeker] = {}  # (number, open index) -> seeker

    def number(self, node: Node) -> int | None:
        """The node's number in the run's graph (None: a sub-pipeline's node)."""
        return self.index.get(id(node))

    def open_index(self, node: Node) -> int:
        """How many times ``node`` was opened before: seeds per epoch derive from it.

        Counts an opening: the run calls it once per opening, before the node's build.
        """
        fresh = next(node.opens)
        no = self.index.get(id(node))
        if no is None:
            return fresh
        k = self._opened.get(no, 0)
        self._opened[no] = k + 1
        if k == 0:
            if self.opens is None and node.ranked and fresh > 0:
                raise unagreed(node, fresh)
            self.first_open[no] = fresh if self.opens is None else self.opens.get(no, fresh)
        return self.first_open[no] + k

    def start(self, node: Node) -> Any:
        """The state ``node`` starts from: its saved one at its first opening in a resumed
        run, else None (from its start)."""
        no = self.index.get(id(node))
        if no is None or self._opened.get(no) != 1:
            return None
        return self.nodes.get(no)

    def seeker(self, no: int, open_index: int, fn: Seeker) -> None:
        """Node ``no``, in its opening ``open_index``, says where it was after ``k`` items."""
        self._seekers[(no, open_index)] = fn
        self._seekers.pop((no, open_index - 2), None)  # two epochs (of a repeat) are enough

    def seek(self, no: int, shift: int = 0) -> Seeker | None:
        """The seeker of node ``no``'s opening ``shift`` after its first in this run."""
        first = self.first_open.get(no)
        return None if first is None else self._seekers.get((no, first + shift))

    def resumed(self, no: int | None) -> Any:
        """The state node ``no`` was resumed from (None: from its start)."""
        return None if no is None else self.nodes.get(no)
