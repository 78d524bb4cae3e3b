"""Resumable iteration: what a state holds, how it is taken, and how it is checked.

A state is plain data (``json`` and ``pickle`` store it)::

    {"aioflow_state": 2,
     "pipeline": "<hash of every stage's name, configuration and function code>",
     "stages": ["<hash of stage 0>", ...],    # to name the stage that differs
     "position": 9000,                         # items yielded in this epoch so far
     "opens": {"0": 0, ...},                   # each node's open_index (per-epoch seeds)
     "origin": {"0": 0, ...},                  # the open indexes where position 0 was
     "epoch": 3 | null,                        # the epoch the run was given (p.iter(epoch=))
     "nodes": {"0": null, "1": {...}} | null,  # per-node states, when seekable
     "counts": {"0": 9000, "1": 36000} | null} # items each of them yielded (its opening)

**Seeking** (``nodes`` present). The per-node protocol is ``Node.resume``:

- a function ``resume(prev, k) -> (state, k_in)``: a one-input operator that, having
  yielded ``k`` items since it was (re)opened, has taken exactly ``k_in`` items from its
  input and holds nothing else but ``state`` (JSON-safe; ``prev`` is the state it was
  resumed from, or None). A run resumed from the state opens the node with
  ``ctx.resume = state`` and its input resumed after ``k_in`` items;
- ``Logged(check)`` (``LOGGED``): a node that calls ``ctx.seeker(fn)``; ``fn(k)`` is
  ``(state, k_in)`` or None, from a log it keeps while it runs; ``check(state, k, k_in)``
  says what of a given state disagrees with the counts (None: nothing);
- ``Seek(start)``: a source that calls ``ctx.seeker(fn)`` when it opens; ``fn(k)`` is the
  state to seek back to after its first ``k`` items (or None when it cannot), and
  ``start()`` the state before it opened (``SEEK``: none, replay);
- ``Refuse(why)``: the stage cannot be resumed exactly (its order depends on timing):
  ``state_dict()`` raises ``PipelineError`` naming it;
- ``None``: the stage holds what cannot be translated (a shuffle buffer, a filter's
  dropped items); the state falls back to replaying.

``state_dict()`` walks from the sink to the source through ``resume`` functions: when it
reaches a ``Seek`` source, every node on the way gets its state and resuming costs what
one chunk of the source costs, wherever the epoch was. Otherwise (**replay**, ``nodes``
null) resuming runs the pipeline again with the same open indexes and leaves out
``position`` items: exact for deterministic pipelines, but it recomputes them.
"""

from __future__ import annotations

import hashlib
import types
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from aioflow._core.graph import Described, fold, graph_nodes, number_nodes
from aioflow.errors import PipelineError, StateMismatch

if TYPE_CHECKING:
    from aioflow._core.positions import Positions

__all__ = [
    "SEEK",
    "Logged",
    "Refuse",
    "Seek",
    "fingerprint",
    "make_state",
    "take_nodes",
]

STATE_VERSION = 3


class Seek:
    """``Node.resume`` of a source that seeks; ``start()``: its state before any item."""

    __slots__ = ("start",)

    def __init__(self, start: Callable[[], Any] | None = None) -> None:
        self.start = start


SEEK = Seek()


class Logged:
    """``Node.resume`` of a node that logs where it was (``ctx.seeker(fn)``: ``fn(k)`` is
    ``(state, k_in)`` or None); ``check(state, k, k_in)``: what of a state disagrees with
    the node's counts (a message; None: nothing). Checked by ``_state/resume.Resume``.

    ``deep``: its log reaches back further than any run holds in flight (``ChunkLog``'s
    4,096 input chunks). Other logs are sized for a few chunks past the consumer (a
    shuffle's 16 output chunks, a repeat's two openings): a graph with one keeps the sync
    hand-off's lead small (``_core/engine.light_lead``), so that a state still seeks.
    """

    __slots__ = ("check", "deep")

    def __init__(
        self, check: Callable[[Any, int, Any], str | None] | None = None, deep: bool = False
    ) -> None:
        self.check = check
        self.deep = deep


#: ``Node.resume`` of a node whose log says where it was and which checks nothing more.
LOGGED = Logged()
#: ... whose log is a ``ChunkLog`` (deep: see ``Logged``).
LOGGED_DEEP = Logged(deep=True)
UNORDERED = "yields in completion order (ordered=False): a replay would differ"


class Refuse:
    """``Node.resume`` of a stage that cannot be resumed exactly, and why."""

    __slots__ = ("why",)

    def __init__(self, why: str) -> None:
        self.why = why


def stages_of(pipeline: Described) -> list[tuple[str, str]]:
    """(name, hash) of every node, numbered as ``_graph.number_nodes`` numbers them."""

    nums = number_nodes(pipeline)
    nodes: dict[int, Any] = {}
    stack = [pipeline]
    while stack:
        node = stack.pop()._node
        if id(node) not in nodes:
            nodes[id(node)] = node
            stack.extend(node.inputs)
    out: list[tuple[str, str]] = [("", "")] * len(nums)
    for nid, no in nums.items():
        node = nodes[nid]
        h = hashlib.sha256(node.name.encode())
        h.update(repr(tuple(_describe(k) for k in node.key)).encode())
        h.update(repr([nums[id(q._node)] for q in node.inputs]).encode())
        out[no] = (node.name, h.hexdigest()[:12])
    return out


def fingerprint(pipeline: Described) -> str:
    """A short hash of the pipeline's description (names, configuration, function code)."""
    return hashlib.sha256(repr(stages_of(pipeline)).encode()).hexdigest()[:16]


def _const(k: Any) -> str:
    """A constant of compiled code, the same in every process (set order aside)."""
    if isinstance(k, types.CodeType):
        return _code(k)
    if isinstance(k, frozenset):
        return f"frozenset({sorted(_const(v) for v in k)})"
    if isinstance(k, tuple):
        return f"({', '.join(_const(v) for v in k)})"
    return repr(k)


def _code(c: types.CodeType) -> str:
    consts = tuple(_const(k) for k in c.co_consts)
    return hashlib.sha256(repr((c.co_code, consts, c.co_names)).encode()).hexdigest()[:12]


def _describe(v: Any) -> str:
    """What identifies a configuration value: a function by its name and its code."""
    if isinstance(v, types.FunctionType | types.MethodType):
        f = getattr(v, "__func__", v)
        return f"{getattr(f, '__qualname__', '?')}#{_code(f.__code__)}"
    if isinstance(v, int | float | str | bool | type(None) | tuple):
        return repr(v)
    if hasattr(v, "func") and callable(v):  # functools.partial
        return f"partial({_describe(v.func)}, {getattr(v, 'args', ())!r:.200})"
    if callable(v):
        return getattr(v, "__qualname__", type(v).__qualname__)
    return type(v).__qualname__


def make_state(
    pipeline: Described,
    position: int,
    opens: dict[int, int],
    nodes: tuple[dict[str, Any], dict[str, int]] | None,
    origin: dict[int, int] | None = None,
    epoch: int | None = None,
) -> dict[str, Any]:
    """The state of ``pipeline`` after ``position`` items; ``nodes``: ``take_nodes``';
    ``origin``: the open indexes where the epoch's position 0 was (default ``opens``),
    from which a replaying state (``nodes`` None) resumes and which a seeking one passes on."""
    if nodes is None and origin is not None:
        opens = origin
    later = next_opens(pipeline)  # a node not opened yet: the index it will get
    opens = {**later, **opens}
    origin = opens if origin is None else {**later, **origin}
    return {
        "aioflow_state": STATE_VERSION,
        "pipeline": fingerprint(pipeline),
        "stages": [h for _, h in stages_of(pipeline)],
        "position": position,
        # per node (numbered in the graph): its open_index in this run, for per-epoch seeds
        "opens": {str(k): v for k, v in sorted(opens.items())},
        "origin": {str(k): v for k, v in sorted(origin.items())},
        "epoch": epoch,  # the run's p.iter(epoch=), or None
        "nodes": None if nodes is None else nodes[0],
        "counts": None if nodes is None else nodes[1],
    }


def mismatch(pipeline: Described, state: dict[str, Any]) -> StateMismatch:
    mine = stages_of(pipeline)
    theirs = state.get("stages")
    where = ""
    if isinstance(theirs, list) and len(theirs) == len(mine):
        diff = [name for (name, h), t in zip(mine, theirs, strict=True) if h != t]
        if diff:
            where = f": stage {diff[-1]!r} differs (its function or configuration changed)"
    elif isinstance(theirs, list):
        where = f": it has {len(theirs)} stages, this pipeline {len(mine)}"
    return StateMismatch(
        f"state was taken from another pipeline (fingerprint {state.get('pipeline')!r},"
        f" this pipeline is {fingerprint(pipeline)!r}){where}"
    )


def refuse_inexact(pipeline: Described) -> None:
    """Raise ``PipelineError`` if a stage of the pipeline cannot be resumed exactly."""

    for node in graph_nodes(pipeline):
        if isinstance(node.resume, Refuse):
            raise PipelineError(
                f"cannot take a resumable state: stage {node.name!r} {node.resume.why}"
            )


def next_opens(pipeline: Described) -> dict[int, int]:
    """The open indexes a run of ``pipeline`` started now would give its nodes."""

    out: dict[int, int] = {}
    stack = [pipeline]
    nums = number_nodes(pipeline)
    while stack:
        node = stack.pop()._node
        no = nums[id(node)]
        if no not in out:
            out[no] = node.opens.peek()
            stack.extend(node.inputs)
    return out


def node_cards(root: Described) -> dict[int, int]:
    """Each node's cardinality (by ``id``), without recursion."""
    return fold(root, lambda node, cards: node.card(cards))


def take_nodes(
    pipeline: Described, positions: Positions | None, k: int, opens: dict[int, int] | None = None
) -> tuple[dict[str, Any], dict[str, int]] | None:
    """Per-node states after ``k`` items of a run (``positions``: its ``Run.resume``; None: not
    started), and how many items each node yielded in its opening (from the state the
    run resumed from on), or None (replay).

    ``opens`` (the state's open indexes) is updated for the nodes upstream of a
    ``repeat`` resumed in a later epoch than the run's first. A node with several inputs
    (``asof_join``) says what each resumes after: each is walked in turn.
    """

    index = positions.index if positions is not None else number_nodes(pipeline)
    prev0 = positions.nodes if positions is not None else {}
    base0 = positions.counts if positions is not None else {}
    cards = node_cards(pipeline)
    nodes: dict[str, Any] = {}
    counts: dict[str, int] = {}
    todo: list[tuple[Any, int, int, dict[int, Any], dict[int, int]]]
    todo = [(pipeline, k, 0, prev0, base0)]
    while todo:
        # shift: the epoch of a repeat's input, in this run; base: counts resumed from
        p, k, shift, prev, base = todo.pop()
        while True:
            node = p._node
            no = index.get(id(node))
            if no is None or str(no) in nodes:  # (a node read by two inputs: replay)
                return None
            if cards[id(node)] >= 0:  # (a short last batch counts as a full one)
                k = max(0, min(k, cards[id(node)] - base.get(no, 0)))
            counts[str(no)] = base.get(no, 0) + k
            r = node.resume
            seek = positions.seek(no, shift) if positions is not None else None
            if isinstance(r, Seek):
                if seek is not None:
                    st = seek(k)
                elif k == 0:  # not opened yet: where it would start
                    st = prev.get(no) if no in prev else (r.start() if r.start else None)
                else:
                    st = None
                if st is None:
                    return None
                nodes[str(no)] = st
                if isinstance(st, dict) and isinstance(st.get("next"), int):
                    counts[str(no)] = st["next"]  # (its own count: after a merge, of its ranges)
                break
            if isinstance(r, Logged):
                first: Any = 0 if len(node.inputs) < 2 else [0] * len(node.inputs)
                res: Any = (
                    seek(k) if seek is not None else ((prev.get(no), first) if k == 0 else None)
                )
                if res is None:
                    return None
                st, k, later = res[0], res[1], (res[2] if len(res) > 2 else 0)
                if isinstance(k, list):  # several inputs, each after its own count
                    if len(k) != len(node.inputs):
                        return None
                    nodes[str(no)] = st
                    todo.extend(
                        (q, kq, shift, prev, base) for q, kq in zip(node.inputs, k, strict=True)
                    )
                    break
                if shift and len(res) > 2:
                    # a repeat inside a repeat in a later epoch: the openings of the inner
                    # one's input are not counted by the outer epoch (replay)
                    return None
                if later:  # a later epoch of a repeat: its input starts afresh
                    shift = later
                    prev, base = {}, {}
                    if opens is not None:
                        for up in _upstream(node, index):
                            opens[up] = opens.get(up, 0) + later
            elif callable(r) and len(node.inputs) == 1:
                st, k = r(prev.get(no), k)
            else:
                return None
            nodes[str(no)] = st
            p = node.inputs[0]
    return nodes, counts


def _upstream(node: Any, index: dict[int, int]) -> set[int]:
    out: set[int] = set()
    stack = list(node.inputs)
    while stack:
        q = stack.pop()._node
        no = index.get(id(q))
        if no is not None and no not in out:
            out.add(no)
            stack.extend(q.inputs)
    return out


# -- the resume functions of the one-input operators (Node.resume) ------------------------
def one_to_one(prev: Any, k: int) -> tuple[Any, int]:
    """``map`` (ordered, raising), ``prefetch``: item ``k`` out is item ``k`` in."""
    return None, k


def per_batch(size: int) -> Callable[[Any, int], tuple[Any, int]]:
    """``batch(size)``: ``k`` batches out took ``k * size`` items and hold none.

    Also ``window(size, shift)`` with ``shift <= size``: window ``k`` starts at input
    ``k * shift``, which the stage has taken, and a window stage opened there makes the
    same windows from it on.
    """
    return lambda prev, k: (None, k * size)


def windowing(size: int, shift: int) -> Callable[[Any, int], tuple[Any, int]]:
    """``window(size, shift)`` with ``shift > size``: ``k`` windows out took the items up
    to the end of the last one, ``(k - 1) * shift + size``, and maybe none of the gap of
    ``shift - size`` items before the next: input ``k * shift`` may not have been made
    yet, so the state says how many items a stage opened there leaves out first
    (``{"gap": g}``; none before the first window of the epoch).
    """

    def resume(prev: Any, k: int) -> tuple[Any, int]:
        if k == 0:
            return prev, 0
        gap = 0 if prev is None else int(prev["gap"])
        return {"gap": shift - size}, gap + (k - 1) * shift + size

    return resume


def taking(n: int) -> Callable[[Any, int], tuple[Any, int]]:
    """``take(n)``: the state is how many are left to take."""

    def resume(prev: Any, k: int) -> tuple[Any, int]:
        left = n if prev is None else int(prev["left"])
        if left < 0:  # take(-1): all of them
            return {"left": left}, k
        # ``k`` may overshoot what was taken: a short last batch below counts as a full one
        k = min(k, left)
        return {"left": left - k}, k

    return resume


def skipping(n: int) -> Callable[[Any, int], tuple[Any, int]]:
    """``skip(n)``: the state is how many are left to skip (none once one item is out)."""

    def resume(prev: Any, k: int) -> tuple[Any, int]:
        left = n if prev is None else int(prev["left"])
        if k == 0 or left < 0:
            return {"left": left}, 0
        return {"left": 0}, left + k

    return resume


def counting(start: int) -> Callable[[Any, int], tuple[Any, int]]:
    """``enumerate(start)``: the state is the next number."""

    def resume(prev: Any, k: int) -> tuple[Any, int]:
        nxt = start if prev is None else int(prev["next"])
        return {"next": nxt + k}, k

    return resume


def resumed(ctx_resume: Any, key: str, default: int) -> int:
    """A node's saved count ``key`` (``default`` when the run starts afresh)."""
    if ctx_resume is None:
        return default
    v = ctx_resume.get(key) if isinstance(ctx_resume, dict) else None
    if not isinstance(v, int) or isinstance(v, bool):
        raise StateMismatch(f"bad node state {ctx_resume!r:.200} (no int {key!r})")
    return v


def call_resume(keep: bool, ordered: bool, on_error: Any) -> Any:
    """``map``/``filter``: a raising ordered map is one-to-one; unordered ones refuse."""
    if not ordered:
        return Refuse(UNORDERED)
    return one_to_one if not keep and on_error == "raise" else None
