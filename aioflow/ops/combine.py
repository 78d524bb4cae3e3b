"""Combining pipelines: zip, concat, sample_from, choose_from (``interleave``: its own module).

Each is a function of pipelines that returns the ``Pipeline`` of its ``Node``
(``_base.pipeline_of``), the inputs being that node's inputs.
"""

from __future__ import annotations

import builtins
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from aioflow._core.base import PipelineBase, pipeline_of
from aioflow.errors import PipelineError
from aioflow.ops.kit import (
    CHUNK_MAX,
    INFINITE_CARD,
    UNKNOWN_CARD,
    ChunkIter,
    Ctx,
    Node,
    Opener,
    aclosing,
)
from aioflow.ops.sampling import check_seed, epoch_rng, probabilities

if TYPE_CHECKING:
    from aioflow.pipeline import Pipeline

__all__ = ["choose_from", "concat", "sample_from", "zip"]


def _pipelines(name: str, ps: Sequence[Any]) -> tuple[Pipeline[Any], ...]:
    if not ps:
        raise PipelineError(f"{name} needs at least one pipeline")
    for p in ps:
        if not isinstance(p, PipelineBase):
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

    return pipeline_of(Node("zip", build, inputs=ps, card=card))


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

    return pipeline_of(Node("concat", lambda ctx, inputs: _concat(inputs), inputs=ps, card=card))


def _infinite_if_all(cs: Sequence[int]) -> int:
    return INFINITE_CARD if all(c == INFINITE_CARD for c in cs) else UNKNOWN_CARD


async def _directed(
    srcs: list[ChunkIter], picks: ChunkIter, live: list[bool], stop_on_empty: bool
) -> ChunkIter:
    """tf.data's directed interleave: for every index from ``picks``, the next item of that
    input. The index of an exhausted input is skipped (with ``stop_on_empty`` it ends the
    stream); the stream ends with ``picks`` or when every live input is exhausted.
    """
    bufs: list[list[Any]] = [[] for _ in srcs]
    at = [0] * len(srcs)
    nlive = sum(live)
    out: list[Any] = []
    try:
        if not nlive:
            return
        async for block in picks:
            for i in block:
                if not live[i]:
                    continue
                if at[i] == len(bufs[i]):
                    if out:
                        yield out
                        out = []
                    try:
                        bufs[i], at[i] = await anext(srcs[i]), 0
                    except StopAsyncIteration:
                        live[i] = False
                        nlive -= 1
                        if stop_on_empty or not nlive:
                            return
                        continue
                out.append(bufs[i][at[i]])
                at[i] += 1
            if out:
                yield out
                out = []
    finally:
        await picks.aclose()
        for s in srcs:
            await s.aclose()


def sample_from(
    ps: Sequence[Pipeline[Any]],
    weights: Sequence[float] | None = None,
    *,
    seed: int | None = None,
    stop_on_empty: bool = False,
) -> Pipeline[Any]:
    """A random mix of several pipelines (tf.data ``sample_from_datasets``).

    Every item comes from input ``i`` with probability ``weights[i]`` (uniform when
    ``None``). When an input is exhausted the others keep being sampled, their weights
    renormalized; with ``stop_on_empty`` the mix ends the first time an exhausted input is
    drawn. The same ``seed`` gives the same mix; each epoch (``repeat``, a new iteration)
    draws a new one, derived from the seed.

    Example:
        >>> import aioflow as af
        >>> mix = af.sample_from([af.range(3), af.from_iterable("ab")], [0.5, 0.5], seed=1)
        >>> sorted(map(str, mix.to_list()))
        ['0', '1', '2', 'a', 'b']
    """
    ps = _pipelines("sample_from", list(ps))
    n = len(ps)
    w = probabilities("weights", [1.0] * n if weights is None else weights, n)
    cum = np.cumsum(w)
    rseed = check_seed(seed)

    async def draws(rng: np.random.Generator) -> ChunkIter:
        # one draw per pick, in blocks: the mix does not depend on chunk sizes
        while True:
            idx = np.searchsorted(cum, rng.random(CHUNK_MAX), side="right")
            yield np.minimum(idx, n - 1).tolist()

    def build(ctx: Ctx, inputs: Sequence[Opener]) -> ChunkIter:
        picks = draws(epoch_rng(rseed, ctx.open_index))
        return _directed([o() for o in inputs], picks, [x > 0 for x in w], stop_on_empty)

    def card(cs: Sequence[int]) -> int:
        return UNKNOWN_CARD if stop_on_empty else _infinite_if_all(cs)

    key = (tuple(w.tolist()), rseed, stop_on_empty)
    return pipeline_of(Node("sample_from", build, inputs=ps, card=card, key=key))


async def _indices(src: ChunkIter, n: int) -> ChunkIter:
    """The chunks of a choices pipeline, checked: an index that is not one is an error."""
    pos = 0
    async with aclosing(src):
        async for chunk in src:
            for j, i in enumerate(chunk):
                if isinstance(i, bool) or not isinstance(i, int | np.integer) or not 0 <= i < n:
                    if j:
                        yield chunk[:j]
                    raise PipelineError(
                        f"choose_from: choice {i!r} at position {pos + j} is not an index"
                        f" of the {n} inputs"
                    )
            pos += len(chunk)
            yield chunk


def choose_from(ps: Sequence[Pipeline[Any]], choices: Pipeline[Any]) -> Pipeline[Any]:
    """Items picked from several pipelines by a pipeline of indices (tf.data
    ``choose_from_datasets``).

    For every index ``i`` in ``choices`` the next item of ``ps[i]`` comes out. The result
    ends with ``choices``, or at the first index of an exhausted input (as
    ``tf.data.Dataset.choose_from_datasets`` with its default
    ``stop_on_empty_dataset=True``: the items never silently stop following the
    choices). An index outside ``range(len(ps))`` is an error (a ``PipelineError``
    naming it, after the items before it).

    Example:
        >>> import aioflow as af
        >>> af.choose_from([af.range(3), af.from_iterable("ab")],
        ...                af.from_iterable([0, 1, 1, 0, 1, 0])).to_list()
        [0, 'a', 'b', 1]
    """
    ps = _pipelines("choose_from", list(ps))
    if not isinstance(choices, PipelineBase):
        raise PipelineError(f"choose_from: choices must be a Pipeline, got {type(choices)}")
    n = len(ps)

    def build(ctx: Ctx, inputs: Sequence[Opener]) -> ChunkIter:
        picks = _indices(inputs[n](), n)
        return _directed([o() for o in inputs[:n]], picks, [True] * n, True)

    return pipeline_of(Node("choose_from", build, inputs=(*ps, choices), card=_infinite_if_all))
