"""Resumable iteration: what a state holds and how it is checked.

A state is plain data (``json`` and ``pickle`` store it): a format version, a fingerprint
of the pipeline's description (operator names and their configuration), the number of
items already yielded, and for each node of the graph the ``open_index`` it had in that
run (per-epoch seeds of shuffles derive from it). Resuming runs the pipeline again with
the same open indexes and leaves out that many items, which is exact for deterministic
pipelines (seeded shuffles included: a run's seeds come from the pipeline and its epoch,
not from the clock). The cost: resuming recomputes the items it leaves out.
"""

from __future__ import annotations

import hashlib
from typing import TYPE_CHECKING, Any

from .errors import StateMismatch

if TYPE_CHECKING:
    from .pipeline import Pipeline

STATE_VERSION = 1


def fingerprint(pipeline: Pipeline[Any]) -> str:
    """A short hash of the pipeline's description (names and configuration of every node)."""
    h = hashlib.sha256()
    seen: dict[int, int] = {}

    def walk(p: Pipeline[Any]) -> None:
        node = p._node
        if id(node) in seen:
            h.update(f"@{seen[id(node)]}".encode())
            return
        seen[id(node)] = len(seen)
        h.update(node.name.encode())
        h.update(repr(tuple(_describe(k) for k in node.key)).encode())
        h.update(f"({len(node.inputs)}".encode())
        for q in node.inputs:
            walk(q)
        h.update(b")")

    walk(pipeline)
    return h.hexdigest()[:16]


def _describe(v: Any) -> str:
    if callable(v):
        return getattr(v, "__qualname__", type(v).__qualname__)
    if isinstance(v, int | float | str | bool | type(None) | tuple):
        return repr(v)
    return type(v).__qualname__


def make_state(pipeline: Pipeline[Any], position: int, opens: dict[int, int]) -> dict[str, Any]:
    return {
        "aioflow_state": STATE_VERSION,
        "pipeline": fingerprint(pipeline),
        "position": position,
        # per node (numbered in the graph): its open_index in this run, for per-epoch seeds
        "opens": {str(k): v for k, v in sorted(opens.items())},
    }


def check_state(pipeline: Pipeline[Any], state: Any) -> tuple[int, dict[int, int]]:
    """The position and per-node open indexes a state resumes from, once checked."""
    if not isinstance(state, dict) or state.get("aioflow_state") != STATE_VERSION:
        raise StateMismatch(f"not an aioflow state (version {STATE_VERSION}): {state!r:.200}")
    want = fingerprint(pipeline)
    if state.get("pipeline") != want:
        raise StateMismatch(
            f"state was taken from another pipeline (fingerprint {state.get('pipeline')!r},"
            f" this pipeline is {want!r})"
        )
    pos = state.get("position")
    if not isinstance(pos, int) or isinstance(pos, bool) or pos < 0:
        raise StateMismatch(f"bad position in state: {pos!r}")
    raw = state.get("opens", {})
    try:
        opens = {int(k): int(v) for k, v in raw.items()}
    except (AttributeError, TypeError, ValueError):
        raise StateMismatch(f"bad open indexes in state: {raw!r:.200}") from None
    return pos, opens
