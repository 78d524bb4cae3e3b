"""Where a run resumes from: a state checked against the pipeline it is given to.

A ``Resume`` is the one resume object of a run: the iterator builds it from the state
(``Resume.of``; ``Resume(pipeline)`` for a fresh run) and hands it to the run, as
``Run.resume``; the run's nodes then ask it where they start (``Positions``, in
``_core/positions.py``), and ``it.state_dict()`` asks it where they were.

``Resume.of(pipeline, state)`` accepts a state only if it can be resumed exactly, and
otherwise raises ``StateMismatch`` naming what does not match (see ``_state/state.py``
for what a state holds): every key present and no other, this pipeline's fingerprint and
stage list, counts that are ints >= 0, an open index per node, and, for a state that
seeks, a state for exactly the nodes the walk from the consumer reaches, whose counts
agree with each other through each node's resume rule:

- the consumer's count is the state's ``position``, within the epoch's length;
- a node with a resume function (``map``, ``batch``, ``take``, ...) has the state and
  the input count that its function gives for its count;
- a source (``Seek``) has a state of the form it starts from, not null; its ``next``
  is its count and within its length;
- a logging node (``Logged``) has a state (null only before its first item) that its
  own ``check`` accepts for its count and its inputs'.

What is nested in a node's state (a sub-pipeline's, a held buffer's items) is checked by
the node when it opens.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from aioflow._core.graph import Described, Node
from aioflow._core.positions import Positions
from aioflow._state.state import (
    STATE_VERSION,
    Logged,
    Seek,
    fingerprint,
    mismatch,
    node_cards,
    stages_of,
)
from aioflow.errors import StateMismatch

__all__ = ["Resume"]

KEYS = (
    "aioflow_state", "pipeline", "stages", "position", "opens", "origin", "epoch", "nodes",
    "counts",
)  # fmt: skip


def _count(what: str, v: Any) -> int:
    if not isinstance(v, int) or isinstance(v, bool) or v < 0:
        raise StateMismatch(f"bad {what} in state (a count >= 0 is needed): {v!r:.200}")
    return v


def _numbered(what: str, raw: Any, n: int) -> dict[int, Any]:
    """A dict keyed by node numbers ("0" .. str(n - 1)) as ints."""
    if not isinstance(raw, dict):
        raise StateMismatch(f"bad {what} in state (a dict by node number): {raw!r:.200}")
    out: dict[int, Any] = {}
    for k, v in raw.items():
        if not (isinstance(k, str) and k.isdigit() and int(k) < n and str(int(k)) == k):
            raise StateMismatch(f"bad {what} in state: no node {k!r} in this pipeline")
        out[int(k)] = v
    return out


def _walked(root: Described) -> list[Node] | None:
    """The nodes a state that seeks has a state for (``take_nodes``' walk), or None when
    a state of this pipeline cannot seek (a node read twice, a node that replays)."""
    out: dict[int, Node] = {}
    todo = [root._node]
    while todo:
        node = todo.pop()
        if id(node) in out:
            return None
        out[id(node)] = node
        r = node.resume
        if isinstance(r, Seek):
            continue
        if isinstance(r, Logged) or (callable(r) and len(node.inputs) == 1):
            todo.extend(q._node for q in node.inputs)
        else:
            return None
    return list(out.values())


class Resume(Positions):
    """A run's resume object: the state it resumes from, checked (``Resume.of``), and its
    nodes' positions as it runs (``Positions``).

    ``position``: items the consumer had; ``opens``: each node's open index (numbered as
    ``number_nodes`` does); ``nodes`` / ``counts``: each node's state and how many items
    it had yielded, when the state seeks (``seeking``; else the run replays and skips
    ``position`` items).

    Example:
        >>> import aioflow as af
        >>> from aioflow._state.resume import Resume
        >>> p = af.range(10).batch(4)
        >>> with p.iter() as it:
        ...     _ = next(it)
        ...     state = it.state_dict()
        >>> r = Resume.of(p, state)
        >>> r.position, r.seeking, r.nodes, r.counts
        (1, True, {0: None, 1: {'next': 4}}, {0: 1, 1: 4})
    """

    def __init__(
        self,
        root: Described,
        position: int = 0,
        opens: dict[int, int] | None = None,
        nodes: dict[int, Any] | None = None,
        counts: dict[int, int] | None = None,
    ) -> None:
        super().__init__(root, opens, nodes, counts)
        self.position = position
        self.seeking = nodes is not None
        # the open indexes where the epoch's position 0 was (None: this run's first ones)
        self.origin: dict[int, int] | None = None
        self.epoch: int | None = None  # the epoch the run was given (p.iter(epoch=))

    @classmethod
    def of(cls, pipeline: Described, state: Any) -> Resume:
        """Check ``state`` against ``pipeline``; raise ``StateMismatch`` naming the mismatch."""
        if not isinstance(state, dict) or state.get("aioflow_state") != STATE_VERSION:
            raise StateMismatch(f"not an aioflow state (version {STATE_VERSION}): {state!r:.200}")
        missing = [k for k in KEYS if k not in state]
        extra = sorted(repr(k) for k in state if k not in KEYS)
        if missing or extra:
            raise StateMismatch(
                f"bad state: {'no ' + ', '.join(map(repr, missing)) if missing else ''}"
                f"{'; ' if missing and extra else ''}"
                f"{'unknown ' + ', '.join(extra) if extra else ''}"
            )
        if state["pipeline"] != fingerprint(pipeline):
            raise mismatch(pipeline, state)
        mine = [h for _, h in stages_of(pipeline)]
        if state["stages"] != mine:
            theirs = state["stages"]
            size = f" of {len(theirs)}" if isinstance(theirs, list) else ""
            raise StateMismatch(
                f"bad state: its stages{size} are not this pipeline's {len(mine)} stages,"
                " though its fingerprint is: the state was altered"
            )
        pos = _count("position", state["position"])
        n = len(mine)
        cards = node_cards(pipeline)
        total = cards[id(pipeline._node)]
        if total >= 0 and pos > total:
            raise StateMismatch(f"bad state: position {pos} beyond the epoch's {total} items")
        opens = _numbered("open indexes", state["opens"], n)
        if len(opens) != n:
            raise StateMismatch(f"bad state: {len(opens)} open indexes for {n} stages")
        epoch = state["epoch"]
        if epoch is not None:
            _count("epoch", epoch)
        origin = _numbered("origin open indexes", state["origin"], n)
        if len(origin) != n:
            raise StateMismatch(f"bad state: {len(origin)} origin open indexes for {n} stages")
        for v in [*opens.values(), *origin.values()]:
            _count("open index", v)
        if state["nodes"] is None:
            if state["counts"] is not None:
                raise StateMismatch("bad state: counts without node states")
            if origin != opens:  # a replaying state resumes where its epoch began
                raise StateMismatch("bad state: a replaying state's open indexes are its origin")
            res = cls(pipeline, pos, opens)
            res.origin, res.epoch = origin, epoch
            return res
        nodes = _numbered("node states", state["nodes"], n)
        counts = _numbered("counts", state["counts"], n)
        for v in counts.values():
            _count("count", v)
        res = cls(pipeline, pos, opens, nodes, counts)
        res.origin, res.epoch = origin, epoch
        res._check_nodes(pipeline, cards)
        return res

    def _check_nodes(self, pipeline: Described, cards: dict[int, int]) -> None:
        nodes, counts = self.nodes, self.counts
        walked = _walked(pipeline)
        if walked is None:
            raise StateMismatch("bad state: node states for a pipeline whose states replay")
        index = self.index
        want = {index[id(node)] for node in walked}
        for what, got in (("node states", nodes), ("counts", counts)):
            if set(got) != want:
                raise StateMismatch(
                    f"bad state: {what} for stages {sorted(got)}, this pipeline's state has"
                    f" them for {sorted(want)}"
                )
        if counts[0] != self.position:
            raise StateMismatch(
                f"bad state: position {self.position} disagrees with the last stage's"
                f" count {counts[0]}"
            )
        for node in walked:
            no = index[id(node)]
            why = _node_mismatch(node, nodes[no], counts[no], counts, index, cards)
            if why:
                raise StateMismatch(f"bad state of stage {node.name!r} (number {no}): {why}")


def _node_mismatch(
    node: Node,
    st: Any,
    k: int,
    counts: dict[int, int],
    index: dict[int, int],
    cards: dict[int, int],
) -> str | None:
    """What of node state ``st`` after ``k`` items disagrees (None: nothing)."""
    r = node.resume
    ins = [counts[index[id(q._node)]] for q in node.inputs]
    if isinstance(r, Seek):
        if st is None:
            return "a source's state is null"
        start = r.start() if r.start is not None else None
        if isinstance(start, dict) and (not isinstance(st, dict) or set(st) != set(start)):
            return f"not a state of this source: {st!r:.200}"
        if isinstance(st, dict) and "next" in st:
            nxt, card = st["next"], cards[id(node)]
            if not isinstance(nxt, int) or isinstance(nxt, bool) or nxt < 0:
                return f"bad position {nxt!r:.100}"
            if card >= 0 and st.get("ranges") is None and nxt > card:
                return f"position {nxt} out of range for its {card} items"
            if nxt != k:
                return f"position {nxt} disagrees with its count {k}"
        return None
    if isinstance(r, Logged):
        if st is None:
            return None if k == 0 else f"a null state after {k} items"
        return r.check(st, k, ins if len(ins) > 1 else ins[0]) if r.check else None
    fn: Callable[[Any, int], tuple[Any, int]] = r
    want, k_in = fn(None, k)
    if st != want:
        return f"state {st!r:.100} disagrees with its count {k} (that gives {want!r:.100})"
    card_in = cards[id(node.inputs[0]._node)]
    if card_in >= 0:  # (a short last batch counts as a full one: at most what there is)
        k_in = min(k_in, card_in)
    if ins[0] != k_in:
        return f"its input's count {ins[0]} disagrees with its own {k} (that gives {k_in})"
    return None
