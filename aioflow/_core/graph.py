"""The description a run is built from: chunks, ``Node``s, and walking a graph of them.

A ``Pipeline`` is a frozen graph of ``Node``s: a name, a ``build(ctx, openers)``
function, input pipelines, a cardinality rule, and static facts (own task or fused, the
bound of the channel after it, what it holds). Items move between stages as *chunks*,
non-empty lists of items; an operator is an async generator over its input's chunks.
"""

from __future__ import annotations

import threading
from collections.abc import AsyncGenerator, Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from aioflow.errors import PipelineError

if TYPE_CHECKING:
    from aioflow._core.ctx import Ctx

__all__ = [
    "CHANNEL_CHUNKS",
    "CHANNEL_ITEMS",
    "CHUNK_MAX",
    "FUSE_MAX",
    "INFINITE_CARD",
    "NO_HINTS",
    "UNKNOWN_CARD",
    "Build",
    "Chunk",
    "ChunkIter",
    "Described",
    "Hints",
    "Node",
    "OpenCount",
    "Opener",
    "fold",
    "graph_nodes",
    "items_per_output",
    "number_nodes",
    "runs_in_task",
    "unagreed",
]

T = TypeVar("T")

Chunk = list[Any]
ChunkIter = AsyncGenerator[Chunk, None]
Opener = Callable[[], ChunkIter]
Build = Callable[["Ctx", Sequence[Opener]], ChunkIter]

#: Largest chunk a source makes; sources adapt their chunk size below it by time.
CHUNK_MAX = 256
#: Default bound of a channel between two tasks: this many chunks and this many items.
CHANNEL_CHUNKS = 2
CHANNEL_ITEMS = 2 * CHUNK_MAX

#: Longest chain of fused stages in one task; a longer one goes on in another task.
FUSE_MAX = 64

INFINITE_CARD = -1
UNKNOWN_CARD = -2


def _same(cards: Sequence[int]) -> int:
    return cards[0] if cards else UNKNOWN_CARD


class Described(Protocol):
    """What the runtime knows of a ``Pipeline``: its sink node (it never imports ``pipeline``)."""

    @property
    def _node(self) -> Node: ...


class OpenCount:
    """How many times a node was opened: ``next()`` counts (thread-safe), ``peek()`` looks.

    It pickles and copies as its value (a ``distribute`` job ships nodes to workers;
    pickling an ``itertools.count`` is deprecated since Python 3.12).
    """

    __slots__ = ("_lock", "_n")

    def __init__(self, start: int = 0) -> None:
        self._n = start
        self._lock = threading.Lock()

    def __next__(self) -> int:
        with self._lock:
            n = self._n
            self._n = n + 1
            return n

    def peek(self) -> int:
        """The index the next opening will get."""
        return self._n

    def start_at(self, n: int) -> None:
        """Let the next opening get the index ``n``."""
        with self._lock:
            self._n = n

    def __reduce__(self) -> tuple[type[OpenCount], tuple[int]]:
        return (OpenCount, (self._n,))


@dataclass(frozen=True, eq=False)
class Hints:
    """What the runtime may use of a node beyond what it describes, each for one feature."""

    chunks: int = CHANNEL_CHUNKS  # bound of the channel after a task node, in chunks
    items: int = CHANNEL_ITEMS  # ... and in items
    grow_to: int = 0  # prefetch(AUTOTUNE): the channel may grow to this many items
    # its channel is a buffer the user sized (prefetch(n)): last in a run read by an async
    # consumer, it is the consumer's channel (no hop between them)
    buffer: bool = False
    # what the run makes ahead of its consumer is the user's bound (distribute's
    # max_outstanding): the hand-off to a for loop holds no light chunks beyond its own
    lead: bool = False
    splits: Any = None  # a source that distribute can cut: a _state/splits.SplitSource
    # a one-item source's blocking read of its item (a local file's): a fan-in may run it
    # in a batch on the run's threads instead of opening the node (a failure: it opens it)
    load: Callable[[], Any] | None = None
    # a process map's pool, started when a run of its pipeline starts (``prestart``):
    # (fn, workers, timeout, ordered)
    pool: tuple[Any, int, float | None, bool] | None = None
    # a process map's node made anew for the ``batch(n)`` right after it: its workers get
    # tasks within one batch and stack the results (``_process/columns``); ``batch`` calls
    # it with the map's own node, which owns the pool the variant's runs use
    columns: Callable[[int, Node], Node] | None = None
    # that variant's user map: its pool is the map's, kept warm on the map's node
    pool_owner: Node | None = None
    # a source that never awaits (it makes its chunks on the loop: ``range``, a sync
    # iterable's): fused into the task that reads it, as an inline stage is; a task of its
    # own would add a hop per chunk and no overlap (``runs_in_task``)
    inline: bool = False


#: A node without hints: the runtime's defaults.
NO_HINTS = Hints()


@dataclass(frozen=True, eq=False)
class Node:
    """One operator of a pipeline description (immutable): what the operator describes,
    and the runtime's ``hints`` (``Hints``; most operators give none)."""

    name: str
    build: Build
    # its input Pipelines (Described; typed Any so that the pipeline's own code keeps its
    # Pipeline types without the runtime importing pipeline)
    inputs: tuple[Any, ...] = ()
    card: Callable[[Sequence[int]], int] = _same
    task: bool = False
    holds: int = 0  # input items the operator itself may hold at once, beyond channels
    mult: int = 1  # how many input items one output item may hold (batch(n): n)
    key: tuple[Any, ...] = ()  # what identifies the node's configuration (for states)
    resume: Any = None  # how its state is taken when resuming: see _state/state.py
    hints: Hints = NO_HINTS
    opens: OpenCount = field(default_factory=lambda: OpenCount(), compare=False)
    # its order is one permutation split over ranks (a sharded shuffled from_source, a
    # distribute over several consumers): every rank must run the same epoch, so a run
    # after its first needs an agreed one (``p.iter(epoch=)`` or a state), see Positions
    ranked: bool = False


def runs_in_task(node: Node) -> bool:
    """Whether a run reads ``node`` through a channel from a task of its own (else it is
    fused into the task that reads it).

    Example:
        >>> import aioflow as af
        >>> [runs_in_task(p._node) for p in (af.range(3), af.range(3).map(abs).prefetch(2))]
        [False, True]
    """
    return node.task and not node.hints.inline


def fold(root: Described, combine: Callable[[Node, list[T]], T]) -> dict[int, T]:
    """``combine(node, [values of its inputs])`` for every node of a graph, inputs first,
    by ``id(node)``; without recursion (a chain may be longer than the recursion limit).

    Example:
        >>> import aioflow as af
        >>> p = af.range(3).map(abs)
        >>> fold(p, lambda n, ins: 1 + sum(ins))[id(p._node)]
        2
    """
    got: dict[int, T] = {}
    todo = [root._node]
    while todo:
        n = todo[-1]
        if id(n) in got:  # (a node read by two others: pushed twice, combined once)
            todo.pop()
            continue
        missing = [q._node for q in n.inputs if id(q._node) not in got]
        if missing:
            todo.extend(missing)
            continue
        todo.pop()
        got[id(n)] = combine(n, [got[id(q._node)] for q in n.inputs])
    return got


def items_per_output(root: Described) -> int:
    """How many source items one output item of ``root`` may hold (``Node.mult`` along the
    graph: ``batch(n)`` holds n; an item of several inputs, the sum of theirs).

    Example:
        >>> import aioflow as af
        >>> items_per_output(af.range(9).batch(4).batch(2)), items_per_output(af.range(9))
        (8, 1)
    """
    m = fold(root, lambda n, ins: (sum(ins) if ins else 1) * n.mult)
    return m[id(root._node)]


def graph_nodes(root: Described) -> list[Node]:
    """The nodes of a graph, each once, in a fixed order (depth first from the sink).

    Without recursion: a chain may be longer than the recursion limit.
    """
    out: dict[int, Node] = {}
    stack = [root]
    while stack:
        node = stack.pop()._node
        if id(node) in out:
            continue
        out[id(node)] = node
        stack.extend(reversed(node.inputs))
    return list(out.values())


def number_nodes(root: Described) -> dict[int, int]:
    """Number the nodes of a graph (by ``id``) in ``graph_nodes``' order."""
    return {id(node): i for i, node in enumerate(graph_nodes(root))}


def unagreed(node: Node, runs: int) -> PipelineError:
    """A ``Node.ranked`` node run again without an agreed epoch (see docs/checkpointing.md)."""
    return PipelineError(
        f"{node.name}: a sharded order (shuffle=True with shard=, or distribute over several"
        f" consumers) run again ({runs} run(s) before) without an epoch: counting runs, a rank"
        " that iterated once more (a peek, a sibling pipeline) would read another permutation"
        " than the others. Name it, the same on every rank: `with p.iter(epoch=e) as it:`"
        " (DistributedSampler.set_epoch(e)), or resume from a state"
    )
