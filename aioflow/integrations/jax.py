"""JAX: ``batch(collate="jax")`` puts the stacked arrays of a batch on the default device.

jax is imported only when the collate is made (``pip install 'aioflow[jax]'``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from aioflow.ops.batching import default_collate

__all__ = ["collate", "make_collate"]


def make_collate() -> Callable[[Sequence[Any]], Any]:
    """``batch(collate="jax")``: imports jax now, so a missing jax fails early."""
    import jax  # noqa: F401

    return collate


def _leaves(x: Any, out: list[np.ndarray]) -> None:
    if isinstance(x, np.ndarray):
        out.append(x)
    elif isinstance(x, Mapping):
        for v in x.values():
            _leaves(v, out)
    elif isinstance(x, tuple | list):
        for v in x:
            _leaves(v, out)


def _rebuild(x: Any, it: Any) -> Any:
    if isinstance(x, np.ndarray):
        return next(it)
    if isinstance(x, Mapping):
        return {k: _rebuild(v, it) for k, v in x.items()}
    if isinstance(x, tuple):
        vals = [_rebuild(v, it) for v in x]
        return type(x)(*vals) if hasattr(x, "_fields") else tuple(vals)
    if isinstance(x, list):
        return [_rebuild(v, it) for v in x]
    return x


def collate(items: Sequence[Any]) -> Any:
    """The default collate, then ``jax.device_put`` of all its arrays in one call.

    Arrays (numbers included, as the default collate stacks them) become ``jax.Array``s
    on the default device; dicts, tuples and lists keep their shape; strings and other
    objects stay Python lists.

    Used as ``p.batch(64, collate="jax")`` (tested in tests/test_integrations_jax.py,
    which skips when jax is not installed).
    """
    import jax

    batch = default_collate(items)
    arrays: list[np.ndarray] = []
    _leaves(batch, arrays)
    if not arrays:
        return batch
    return _rebuild(batch, iter(jax.device_put(arrays)))
