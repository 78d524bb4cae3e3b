"""Randomness: per-epoch seeding, and rejection resampling towards a class distribution.

Every random operator (``shuffle``, ``rejection_resample``, ``sample_from``) draws from a
numpy ``Generator`` made by ``epoch_rng``: seeded from ``(seed, epoch)`` so that the same
seed and the same input give the same output, and a new epoch (``ctx.open_index``) a new
one. Random numbers are drawn in bulk per chunk as doubles (one 64-bit draw each), so the
output does not depend on how the input happened to be cut into chunks.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from aioflow._core.chunks import skip_chunks
from aioflow.errors import PipelineError
from aioflow.ops.columnar import column, kind_of, masked
from aioflow.ops.kit import (
    INFINITE_CARD,
    LOGGED_DEEP,
    UNKNOWN_CARD,
    ChunkIter,
    ChunkLog,
    Ctx,
    Node,
    Opener,
    aclosing,
    each,
    fn_name,
)

if TYPE_CHECKING:
    from aioflow.pipeline import Pipeline

__all__ = ["card_unknown", "check_seed", "epoch_rng", "probabilities"]

#: Count every class starts from when the initial distribution is estimated (tf.data's).
SMOOTHING = 10


def check_seed(seed: Any) -> int | None:
    if seed is None:
        return None
    if isinstance(seed, bool) or not isinstance(seed, int | np.integer):
        raise PipelineError(f"seed must be an int or None, got {seed!r}")
    return int(seed) % 2**64  # SeedSequence wants a non-negative int; tf.data seeds are int64


def epoch_rng(seed: int | None, epoch: int) -> np.random.Generator:
    """The generator of one epoch: from ``(seed, epoch)``, or fresh entropy when no seed."""
    if seed is None:
        return np.random.default_rng()
    return np.random.default_rng(np.random.SeedSequence([seed, epoch]))


def probabilities(name: str, dist: Any, n: int | None = None) -> np.ndarray:
    """A probability vector from non-negative weights (normalized), checked."""
    try:
        p = np.asarray(dist, dtype=np.float64)
    except (TypeError, ValueError):
        raise PipelineError(f"{name} must be a sequence of numbers, got {dist!r}") from None
    if p.ndim != 1 or len(p) == 0 or (n is not None and len(p) != n):
        want = f"{n} numbers" if n is not None else "a non-empty sequence of numbers"
        raise PipelineError(f"{name} must be {want}, got {dist!r}")
    if not np.all(np.isfinite(p)) or np.any(p < 0) or p.sum() <= 0:
        raise PipelineError(f"{name} must be non-negative, finite and not all zero, got {dist!r}")
    return p / p.sum()


def _ratio(target: np.ndarray, initial: np.ndarray) -> np.ndarray:
    # target / initial, with 0/0 = 0 (a class that neither exists nor is wanted)
    with np.errstate(divide="ignore", invalid="ignore"):
        r = np.where(target > 0, target / initial, 0.0)
    return r


def _rejection_resample(
    class_fn: Callable[[Any], Any] | str,
    target_dist: Any,
    initial_dist: Any,
    seed: int | None,
) -> Callable[[Ctx, Sequence[Opener]], ChunkIter]:
    """The build of ``rejection_resample``.

    An item of class ``c`` is kept with probability ``r[c] / max(r)``, where
    ``r = target / initial``: the output's class distribution is the target one, and no
    class is rejected more than it must be. tf.data reaches the same distribution by
    mixing the stream with a filtered second pass over the data (with probability
    ``min(r) / max(r)``); a stream read once cannot do that, so here each item is seen once.
    Without ``initial_dist`` it is estimated online from the classes seen so far (counts
    starting at 10 per class, as tf.data does), the item itself included.
    """
    if not callable(class_fn) and not isinstance(class_fn, str):
        raise PipelineError(
            f"rejection_resample needs a callable class_fn or a column name, got {class_fn!r}"
        )
    target = probabilities("target_dist", target_dist)
    k = len(target)
    known: np.ndarray | None = None
    if initial_dist is not None:
        initial = probabilities("initial_dist", initial_dist, k)
        if np.any((initial == 0) & (target > 0)):
            raise PipelineError(
                f"initial_dist gives probability 0 to a class the target wants: {initial_dist!r}"
            )
        r = _ratio(target, initial)
        known = r / r.max()
    seed = check_seed(seed)

    async def resample(src: ChunkIter, ctx: Ctx, log: ChunkLog) -> ChunkIter:
        rng = epoch_rng(seed, ctx.open_index)
        counts = np.full(k, float(SMOOTHING))
        if log.state is not None:  # resumed (see ChunkLog)
            rng.bit_generator.state = log.state["rng"]
            counts = np.asarray(log.state["counts"], dtype=float)
        pos = emitted = 0
        async with aclosing(src):
            async for chunk in src:
                log.mark(emitted, pos, {"rng": rng.bit_generator.state, "counts": counts.tolist()})
                if isinstance(class_fn, str) and chunk and kind_of(chunk[0]) is not None:
                    out, counts = _resample_batches(chunk, class_fn, k, rng, known, counts, target)
                    pos += len(chunk)
                    if out:
                        emitted += len(out)
                        yield out
                    continue
                classes, failure = _classes_of(chunk, class_fn, k, ctx, pos)
                if classes:
                    cls = np.asarray(classes, dtype=np.intp)
                    if known is not None:
                        accept = known[cls]
                    else:
                        accept, counts = _estimated_acceptance(cls, counts, target)
                    keep = rng.random(len(cls)) < accept
                    out = [x for x, kp in zip(chunk, keep.tolist(), strict=False) if kp]
                    pos += len(classes)
                    if out:
                        emitted += len(out)
                        yield out
                if failure is not None:
                    raise failure

    def build(ctx: Ctx, inputs: Sequence[Opener]) -> ChunkIter:
        log = ChunkLog(ctx)
        gen = resample(inputs[0](), ctx, log)
        return skip_chunks(gen, log.drop) if log.drop else gen

    return build


def _resample_batches(
    chunk: list[Any],
    name: str,
    k: int,
    rng: np.random.Generator,
    known: np.ndarray | None,
    counts: np.ndarray,
    target: np.ndarray,
) -> tuple[list[Any], np.ndarray]:
    """Record batches resampled by rows, class column ``name``: the same draws, one per
    row in arrival order, as the per-item path on the same rows; a batch keeps its kept
    rows (one ``take``), a batch left with none goes."""
    out = []
    for b in chunk:
        if kind_of(b) is None:
            raise PipelineError(
                f"rejection_resample of record batches got a {type(b).__name__}, not a batch"
            )
        col = column(b, name)
        if col.dtype.kind not in "iu" and len(col):
            raise PipelineError(f"class column {name!r} must hold ints, not {col.dtype}")
        cls = col.astype(np.intp)
        outside = (cls < 0) | (cls >= k)
        if outside.any():
            bad = int(cls[outside][0])
            raise PipelineError(f"class {bad} is outside target_dist's {k} classes")
        if not len(cls):
            continue
        if known is not None:
            accept = known[cls]
        else:
            accept, counts = _estimated_acceptance(cls, counts, target)
        kept = masked(b, rng.random(len(cls)) < accept, None)
        if kept is not None:
            out.append(kept)
    return out, counts


def _classes_of(
    chunk: list[Any], class_fn: Callable[[Any], Any] | str, k: int, ctx: Ctx, pos: int
) -> tuple[list[int], BaseException | None]:
    """The classes of the chunk's items, up to the first that fails (and its error)."""

    def class_of(x: Any) -> int:
        c = x[class_fn] if isinstance(class_fn, str) else class_fn(x)
        if isinstance(c, bool) or not isinstance(c, int | np.integer):
            raise PipelineError(f"{ctx.name}: class_fn must return an int, got {c!r}")
        if not 0 <= c < k:
            raise PipelineError(f"{ctx.name}: class {c} is outside target_dist's {k} classes")
        return int(c)

    return each(class_of, chunk, ctx.name, pos)


def _estimated_acceptance(
    cls: np.ndarray, counts: np.ndarray, target: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Each item's chance to be kept, from the class counts before it (itself counted),
    and the counts after the last item."""
    k = len(target)
    seen = np.zeros((len(cls), k))
    seen[np.arange(len(cls)), cls] = 1.0
    est = counts + np.cumsum(seen, axis=0)
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = np.where(target > 0, target / est, 0.0)
    return ratio[np.arange(len(cls)), cls] / ratio.max(axis=1), est[-1].copy()


def rejection_resample_node(
    up: Pipeline[Any],
    class_fn: Callable[[Any], int] | str,
    target_dist: list[float],
    initial_dist: list[float] | None,
    seed: int | None,
) -> Node:
    """``rejection_resample``: keep items at random so that classes follow ``target_dist``."""
    return Node(
        f"rejection_resample({class_fn if isinstance(class_fn, str) else fn_name(class_fn)})",
        _rejection_resample(class_fn, target_dist, initial_dist, seed),
        inputs=(up,),
        card=card_unknown,
        key=(
            class_fn,
            tuple(target_dist),
            None if initial_dist is None else tuple(initial_dist),
            seed,
        ),
        resume=LOGGED_DEEP,
    )


def card_unknown(cs: Sequence[int]) -> int:
    """The cardinality of an operator whose output count depends on the data."""
    return INFINITE_CARD if cs[0] == INFINITE_CARD else UNKNOWN_CARD
