"""Batching: batch, unbatch, rebatch, window, padded_batch, bucket_by_length, and collates.

The default collate follows torch's ``default_collate`` shape rules with numpy: numpy
arrays are stacked, numbers become an array, dicts/tuples/lists are collated field by
field, anything else (strings, bytes, objects) is kept as a list.
"""

from __future__ import annotations

import importlib
from bisect import bisect_right
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from itertools import pairwise
from typing import Any

import numpy as np

from ._runtime import ChunkIter, Ctx, Opener, aclosing
from .errors import PipelineError, annotate

__all__ = [
    "COLLATES",
    "build_batch",
    "build_bucket_by_length",
    "build_padded_batch",
    "build_rebatch",
    "build_unbatch",
    "build_window",
    "card_batch",
    "card_window",
    "default_collate",
    "pad_collate",
    "resolve_collate",
    "split_rows",
]

_SCALARS = (bool, int, float, complex, np.generic)


def default_collate(items: Sequence[Any]) -> Any:
    """Stack a list of samples into one batch.

    Example:
        >>> import numpy as np
        >>> b = default_collate([{"x": np.zeros(2), "y": 1}, {"x": np.ones(2), "y": 0}])
        >>> b["x"].shape, b["y"].tolist()
        ((2, 2), [1, 0])
    """
    first = items[0]
    if isinstance(first, np.ndarray):
        return np.stack(items)
    if isinstance(first, _SCALARS):
        arr = np.asarray(items)
        if arr.dtype.kind == "f" and isinstance(first, int) and not isinstance(first, bool):
            return np.array(items, dtype=object)  # ints beyond int64: never round to float
        return arr
    if isinstance(first, Mapping):
        return {k: default_collate([d[k] for d in items]) for k in first}
    if isinstance(first, tuple):
        cols = [default_collate(list(col)) for col in zip(*items, strict=True)]
        if hasattr(first, "_fields"):  # a namedtuple keeps its type
            return type(first)(*cols)
        return tuple(cols)
    if isinstance(first, list):
        return [default_collate(list(col)) for col in zip(*items, strict=True)]
    return list(items)


def _keep_list(items: Sequence[Any]) -> Any:
    return items if isinstance(items, list) else list(items)


#: ``batch(collate=NAME)``: NAME -> "module:factory"; the factory imports its library
#: (so a missing one fails when the pipeline is described) and returns the collate.
COLLATES: dict[str, str] = {
    "torch": "aioflow.integrations.torch:make_collate",
    "jax": "aioflow.integrations.jax:make_collate",
}


def _named_collate(name: str) -> Callable[[Sequence[Any]], Any]:
    target = COLLATES.get(name)
    if target is None:
        raise PipelineError(f"unknown collate name {name!r} (known: {', '.join(COLLATES)})")
    module, _, factory = target.partition(":")
    try:
        made: Callable[[Sequence[Any]], Any] = getattr(importlib.import_module(module), factory)()
    except ImportError as e:
        raise PipelineError(
            f"collate={name!r} needs {e.name or name}, which is not installed"
            f" (pip install 'aioflow[{name}]')"
        ) from e
    return made


def resolve_collate(collate: Any) -> Callable[[Sequence[Any]], Any]:
    """``None`` -> default collate; ``list`` -> plain lists; a name (``COLLATES``) -> its
    collate (``"torch"``: tensors, ``"jax"``: device arrays); a callable -> itself."""
    if collate is None:
        return default_collate
    if collate is list:
        return _keep_list
    if isinstance(collate, str):
        return _named_collate(collate)
    if callable(collate):
        return collate
    raise PipelineError(f"collate must be None, list, a name or a callable, got {collate!r}")


def split_rows(batch: Any) -> list[Any]:
    """The samples of a batch (the inverse of the default collate)."""
    if isinstance(batch, np.ndarray):
        if batch.ndim == 0:
            raise PipelineError("unbatch: cannot split a 0-d array into rows")
        return list(batch)
    if isinstance(batch, Mapping):
        keys = list(batch)
        cols = [split_rows(batch[k]) for k in keys]
        return [dict(zip(keys, vals, strict=True)) for vals in zip(*cols, strict=True)]
    if isinstance(batch, tuple):
        cols = [split_rows(c) for c in batch]
        rows = zip(*cols, strict=True)
        if hasattr(batch, "_fields"):
            return [type(batch)(*r) for r in rows]
        return [tuple(r) for r in rows]
    if isinstance(batch, list):
        return batch  # a list batch (collate=list) is its samples
    if isinstance(batch, str | bytes) or not hasattr(batch, "__len__"):
        raise PipelineError(f"unbatch: cannot split a {type(batch).__name__} into rows")
    return [batch[i] for i in range(len(batch))]


def build_batch(
    size: int, drop_remainder: bool, collate: Any
) -> Callable[[Ctx, Sequence[Opener]], ChunkIter]:
    if isinstance(size, bool) or not isinstance(size, int) or size < 1:
        raise PipelineError(f"batch size must be a positive int, got {size!r}")
    fn = resolve_collate(collate)

    async def batch(src: ChunkIter, ctx: Ctx) -> ChunkIter:
        buf: list[Any] = []
        nb = 0
        async with aclosing(src):
            async for chunk in src:
                if buf:
                    buf.extend(chunk)
                else:
                    buf = chunk
                if len(buf) < size:
                    if buf is chunk:
                        buf = list(chunk)  # chunks are not ours to grow
                    continue
                out = []
                end = len(buf) - len(buf) % size
                try:
                    for i in range(0, end, size):
                        out.append(fn(buf[i : i + size]))
                        nb += 1
                except Exception as e:
                    if out:
                        yield out
                    raise annotate(e, ctx.name, nb) from None
                buf = buf[end:]
                yield out
            if buf and not drop_remainder:
                try:
                    last = fn(buf)
                except Exception as e:
                    raise annotate(e, ctx.name, nb) from None
                yield [last]

    return lambda ctx, inputs: batch(inputs[0](), ctx)


def card_batch(size: int, drop_remainder: bool) -> Callable[[Sequence[int]], int]:
    def card(cs: Sequence[int]) -> int:
        c = cs[0]
        if c < 0:
            return c
        return c // size if drop_remainder else -(-c // size)

    return card


async def _rows(src: ChunkIter, ctx: Ctx, kinds: list[type] | None = None) -> ChunkIter:
    nb = 0
    async with aclosing(src):
        async for chunk in src:
            out: list[Any] = []
            for b in chunk:
                try:
                    rows = split_rows(b)
                except Exception as e:
                    if out:
                        yield out
                    raise annotate(e, ctx.name, nb) from None
                if kinds is not None and not kinds:
                    kinds.append(type(b))
                nb += 1
                out.extend(rows)
            if out:
                yield out


def build_unbatch() -> Callable[[Ctx, Sequence[Opener]], ChunkIter]:
    return lambda ctx, inputs: _rows(inputs[0](), ctx)


def build_rebatch(size: int, drop_remainder: bool) -> Callable[[Ctx, Sequence[Opener]], ChunkIter]:
    if isinstance(size, bool) or not isinstance(size, int) or size < 1:
        raise PipelineError(f"rebatch size must be a positive int, got {size!r}")

    def collate_like(items: Sequence[Any], kinds: list[type]) -> Any:
        # list batches stay lists; anything else is re-stacked by the default collate
        return _keep_list(items) if kinds and issubclass(kinds[0], list) else default_collate(items)

    def build(ctx: Ctx, inputs: Sequence[Opener]) -> ChunkIter:
        kinds: list[type] = []
        rows = _rows(inputs[0](), ctx, kinds)
        inner = build_batch(size, drop_remainder, lambda items: collate_like(items, kinds))
        return inner(ctx, [lambda: rows])

    return build


def build_window(
    size: int, shift: int | None, drop_remainder: bool
) -> Callable[[Ctx, Sequence[Opener]], ChunkIter]:
    if isinstance(size, bool) or not isinstance(size, int) or size < 1:
        raise PipelineError(f"window size must be a positive int, got {size!r}")
    step = size if shift is None else shift
    if isinstance(step, bool) or not isinstance(step, int) or step < 1:
        raise PipelineError(f"window shift must be a positive int, got {shift!r}")

    async def window(src: ChunkIter) -> ChunkIter:
        buf: deque[Any] = deque()
        start = 0  # index of the first item of the next window
        seen = 0
        async with aclosing(src):
            async for chunk in src:
                out = []
                for x in chunk:
                    i = seen
                    seen += 1
                    if i < start:
                        continue  # in the gap between windows (shift > size)
                    buf.append(x)
                    if i == start + size - 1:
                        out.append(list(buf))
                        start += step
                        for _ in range(min(step, len(buf))):
                            buf.popleft()
                if out:
                    yield out
        if not drop_remainder:
            out = []
            while start < seen and buf:
                out.append(list(buf))
                start += step
                for _ in range(min(step, len(buf))):
                    buf.popleft()
            if out:
                yield out

    return lambda ctx, inputs: window(inputs[0]())


def card_window(
    size: int, shift: int | None, drop_remainder: bool
) -> Callable[[Sequence[int]], int]:
    step = size if shift is None else shift

    def card(cs: Sequence[int]) -> int:
        c = cs[0]
        if c < 0:
            return c
        if drop_remainder:
            return 0 if c < size else (c - size) // step + 1
        return -(-c // step)

    return card


# -- padding: padded_batch, bucket_by_length ---------------------------------------------
def pad_collate(items: Sequence[Any], padding_value: Any = 0) -> Any:
    """Stack samples, padding arrays in every dimension to the largest in the batch.

    As tf.data's ``padded_batch`` with ``padded_shapes=None``: numpy arrays and lists of
    numbers are padded with ``padding_value`` (a scalar, or a dict/tuple of them matching
    the samples' structure); numbers become an array; dicts and tuples are padded field
    by field; anything else is kept as a list.

    Example:
        >>> import numpy as np
        >>> pad_collate([np.array([1, 2, 3]), np.array([4])]).tolist()
        [[1, 2, 3], [4, 0, 0]]
    """
    first = items[0]
    if isinstance(first, Mapping):
        return {k: pad_collate([d[k] for d in items], _field(padding_value, k)) for k in first}
    if isinstance(first, tuple):
        cols = [
            pad_collate(list(col), _field(padding_value, i))
            for i, col in enumerate(zip(*items, strict=True))
        ]
        return type(first)(*cols) if hasattr(first, "_fields") else tuple(cols)
    if isinstance(first, np.ndarray | list):
        return _pad_stack([np.asarray(x) for x in items], padding_value)
    if isinstance(first, _SCALARS):
        arr = np.asarray(items)
        if arr.dtype.kind == "f" and isinstance(first, int) and not isinstance(first, bool):
            return np.array(items, dtype=object)  # ints beyond int64: never round to float
        return arr
    return list(items)


def _field(value: Any, k: Any) -> Any:
    if isinstance(value, Mapping | tuple | list):
        return value[k]
    return value


def _pad_stack(arrays: list[np.ndarray], value: Any) -> np.ndarray:
    ndim = arrays[0].ndim
    if any(a.ndim != ndim for a in arrays):
        raise PipelineError(
            f"padded_batch: samples have different ranks {sorted({a.ndim for a in arrays})}"
        )
    shape = tuple(max(dims) for dims in zip(*(a.shape for a in arrays), strict=True))
    dtype = np.result_type(*arrays)
    out = np.full((len(arrays), *shape), value, dtype=dtype)
    for i, a in enumerate(arrays):
        if a.shape == shape:
            out[i] = a
        else:
            out[(i, *(slice(0, d) for d in a.shape))] = a  # type: ignore[index]
    return out


def build_padded_batch(
    size: int, padding_value: Any, drop_remainder: bool
) -> Callable[[Ctx, Sequence[Opener]], ChunkIter]:
    return build_batch(size, drop_remainder, lambda items: pad_collate(items, padding_value))


def check_buckets(boundaries: Sequence[int], batch_sizes: Sequence[int]) -> None:
    bs, sizes = list(boundaries), list(batch_sizes)
    if len(sizes) != len(bs) + 1:
        raise PipelineError(
            f"bucket_by_length needs len(batch_sizes) == len(boundaries) + 1,"
            f" got {len(sizes)} batch sizes for {len(bs)} boundaries"
        )
    if any(b >= c for b, c in pairwise(bs)):
        raise PipelineError(f"bucket boundaries must be strictly increasing, got {bs!r}")
    for s in sizes:
        if isinstance(s, bool) or not isinstance(s, int) or s < 1:
            raise PipelineError(f"bucket batch sizes must be positive ints, got {sizes!r}")


def build_bucket_by_length(
    length_fn: Callable[[Any], int],
    boundaries: Sequence[int],
    batch_sizes: Sequence[int],
    padding_value: Any,
) -> Callable[[Ctx, Sequence[Opener]], ChunkIter]:
    """tf.data's ``bucket_by_sequence_length``: bucket ``i`` holds lengths in
    ``[boundaries[i-1], boundaries[i])`` (the first from 0, the last to infinity); a full
    bucket becomes a padded batch; what is left is flushed at the end, bucket by bucket.
    """
    if not callable(length_fn):
        raise PipelineError(f"bucket_by_length needs a callable length_fn, got {length_fn!r}")
    check_buckets(boundaries, batch_sizes)
    bounds, sizes = list(boundaries), list(batch_sizes)

    def collate(items: Sequence[Any]) -> Any:
        return pad_collate(items, padding_value)

    async def bucket(src: ChunkIter, ctx: Ctx) -> ChunkIter:
        buckets: list[list[Any]] = [[] for _ in sizes]
        pos = nb = 0
        async with aclosing(src):
            async for chunk in src:
                out = []
                for x in chunk:
                    try:
                        b = bisect_right(bounds, length_fn(x))
                        buckets[b].append(x)
                        if len(buckets[b]) == sizes[b]:
                            out.append(collate(buckets[b]))
                            buckets[b] = []
                            nb += 1
                    except Exception as e:
                        if out:
                            yield out
                        raise annotate(e, ctx.name, pos) from None
                    pos += 1
                if out:
                    yield out
        for items in buckets:
            if items:
                try:
                    last = collate(items)
                except Exception as e:
                    raise annotate(e, ctx.name, nb) from None
                nb += 1
                yield [last]

    return lambda ctx, inputs: bucket(inputs[0](), ctx)
