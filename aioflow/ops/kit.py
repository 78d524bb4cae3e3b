"""The operator kit: the building blocks an operator module (``ops/<family>.py``) uses, in
one place. An operator imports them from here, not from ``_core`` and ``_state/state``:

- the graph: ``Node`` (what an operator describes), ``Hints`` (the runtime's),
  ``Build``, ``Ctx``, ``ChunkIter``, ``Opener``, ``Chunk``, ``aclosing``, the
  cardinalities and chunk sizes;
- the error policy (``_core/policy.py``): ``call``, ``each``, ``each_into``, ``read_one``,
  ``NOTHING``;
- argument checks (``_core/check.py``): ``check_int``, ``check_concurrency``,
  ``check_executor``, ``is_int``, ``fn_name``;
- resuming (``_state/``): ``Resume``, the run's one resume object (``ctx.run.resume``;
  a node asks it through ``ctx.resume``, the state it starts from, and ``ctx.seeker``);
  the rules ``one_to_one``, ``counting``, ``per_batch``, ``windowing``, ``skipping``, ``taking``,
  ``resumed``, ``call_resume``, ``Seek``, ``Refuse``, ``LOGGED``, ``LOGGED_DEEP``, ``Logged``,
  ``UNORDERED``, ``shuffle_check`` and the logs (``ChunkLog``, ``ElementLog``,
  ``CycleLog``, ``ShuffleLog``, ...).

Example:
    >>> from aioflow.ops import kit
    >>> kit.check_int("size", 3, 1), kit.Node.__name__
    (3, 'Node')
"""

from __future__ import annotations

from aioflow._core.check import check_concurrency, check_executor, check_int, fn_name, is_int
from aioflow._core.policy import NOTHING, call, each, each_into, read_one
from aioflow._core.run import (
    CHANNEL_CHUNKS,
    CHANNEL_ITEMS,
    CHUNK_MAX,
    INFINITE_CARD,
    NO_HINTS,
    UNKNOWN_CARD,
    Build,
    Chunk,
    ChunkIter,
    Ctx,
    Hints,
    Node,
    Opener,
    Run,
    aclosing,
    graph_nodes,
    items_of,
)
from aioflow._state.logs import (
    COUNTED,
    ChunkLog,
    CycleLog,
    ElementLog,
    ShuffleLog,
    chunkwise,
    counted_source,
    frozen,
    shuffle_check,
    thaw,
)
from aioflow._state.resume import Resume
from aioflow._state.state import (
    LOGGED,
    LOGGED_DEEP,
    UNORDERED,
    Logged,
    Refuse,
    Seek,
    call_resume,
    counting,
    one_to_one,
    per_batch,
    resumed,
    skipping,
    taking,
    windowing,
)

__all__ = [
    "CHANNEL_CHUNKS", "CHANNEL_ITEMS", "CHUNK_MAX", "COUNTED", "INFINITE_CARD", "LOGGED",
    "LOGGED_DEEP", "NOTHING", "UNKNOWN_CARD", "UNORDERED", "Build", "Chunk", "ChunkIter",
    "ChunkLog", "Ctx", "CycleLog", "ElementLog", "Hints", "Logged", "NO_HINTS", "Node", "Opener",
    "Refuse", "Resume", "Run", "Seek", "ShuffleLog", "aclosing", "call", "call_resume",
    "check_concurrency", "check_executor", "check_int", "chunkwise", "counted_source", "counting",
    "each", "each_into", "fn_name", "frozen", "graph_nodes", "is_int", "items_of", "one_to_one",
    "per_batch", "read_one", "resumed", "shuffle_check", "skipping", "taking", "thaw", "windowing",
]  # fmt: skip
