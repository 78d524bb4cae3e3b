"""Collates: how ``batch`` makes one batch of a list of items, and ``unbatch`` its rows.

The default collate follows torch's ``default_collate`` shape rules with numpy: numpy
arrays are stacked, numbers become an array, dicts/tuples/lists are collated field by
field, anything else (strings, bytes, objects) is kept as a list. ``pad_collate`` pads
arrays to the longest first (``padded_batch``).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from aioflow.errors import PipelineError

__all__ = [
    "COLLATES",
    "STACKED",
    "default_collate",
    "keep_list",
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


def keep_list(items: Sequence[Any]) -> Any:
    return items if isinstance(items, list) else list(items)


def _itself(a: Any) -> Any:
    return a


#: The collates ``batch`` can make from a process map's results stacked in its workers
#: (``_process/columns``): collate -> what a stacked array field becomes in the batch (every
#: other field is the collate of its values). ``integrations.torch`` adds its own.
STACKED: dict[Callable[[Sequence[Any]], Any], Callable[[Any], Any]] = {default_collate: _itself}


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
        return keep_list
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
