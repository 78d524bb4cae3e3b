"""Combining pipelines: zip and concat (more fan-in operators join this module)."""

from __future__ import annotations

import builtins
from collections.abc import Sequence
from typing import Any

from ._runtime import INFINITE_CARD, UNKNOWN_CARD, ChunkIter, Ctx, Node, Opener, aclosing
from .errors import PipelineError
from .pipeline import Pipeline

__all__ = ["concat", "zip"]


def _pipelines(name: str, ps: Sequence[Any]) -> tuple[Pipeline[Any], ...]:
    if not ps:
        raise PipelineError(f"{name} needs at least one pipeline")
    for p in ps:
        if not isinstance(p, Pipeline):
            raise PipelineError(f"{name} takes Pipelines, got {type(p).__name__}")
    return tuple(ps)


async def _zip(srcs: list[ChunkIter]) -> ChunkIter:
    bufs: list[list[Any]] = [[] for _ in srcs]
    try:
        while True:
            for i, s in enumerate(srcs):
                if not bufs[i]:
                    try:
                        bufs[i] = await anext(s)
                    except StopAsyncIteration:
                        return
            n = min(len(b) for b in bufs)
            yield list(builtins.zip(*(b[:n] for b in bufs), strict=True))
            bufs = [b[n:] for b in bufs]
    finally:
        for s in srcs:
            await s.aclose()


def zip(*pipelines: Pipeline[Any]) -> Pipeline[tuple[Any, ...]]:
    """Tuples of the items of several pipelines in lockstep, until the shortest ends.

    Example:
        >>> import aioflow as af
        >>> af.zip(af.range(3), af.from_iterable("abcd")).to_list()
        [(0, 'a'), (1, 'b'), (2, 'c')]
    """
    ps = _pipelines("zip", pipelines)

    def card(cs: Sequence[int]) -> int:
        known = [c for c in cs if c >= 0]
        if known:
            return min(known) if all(c >= 0 or c == INFINITE_CARD for c in cs) else UNKNOWN_CARD
        return INFINITE_CARD if all(c == INFINITE_CARD for c in cs) else UNKNOWN_CARD

    def build(ctx: Ctx, inputs: Sequence[Opener]) -> ChunkIter:
        return _zip([o() for o in inputs])

    return Pipeline(Node("zip", build, inputs=ps, card=card))


async def _concat(inputs: Sequence[Opener]) -> ChunkIter:
    for o in inputs:
        async with aclosing(o()) as src:
            async for chunk in src:
                yield chunk


def concat(*pipelines: Pipeline[Any]) -> Pipeline[Any]:
    """The items of several pipelines, one pipeline after another.

    Example:
        >>> import aioflow as af
        >>> af.concat(af.range(2), af.from_iterable("ab")).to_list()
        [0, 1, 'a', 'b']
    """
    ps = _pipelines("concat", pipelines)

    def card(cs: Sequence[int]) -> int:
        if any(c == INFINITE_CARD for c in cs):
            return INFINITE_CARD
        if any(c < 0 for c in cs):
            return UNKNOWN_CARD
        return sum(cs)

    return Pipeline(Node("concat", lambda ctx, inputs: _concat(inputs), inputs=ps, card=card))
