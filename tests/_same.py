"""``same``: deep equality that also checks types, for comparing items and batches."""

from __future__ import annotations

from typing import Any

import numpy as np


def same(a: Any, b: Any) -> bool:
    """Equal values of the same types all the way down (arrays and tensors: shape, dtype,
    values; dicts: keys in the same order)."""
    if type(a) is not type(b):
        return False
    if isinstance(a, np.ndarray):
        return a.shape == b.shape and a.dtype == b.dtype and np.array_equal(a, b)
    if isinstance(a, dict):
        return list(a) == list(b) and all(same(a[k], b[k]) for k in a)
    if isinstance(a, tuple | list):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    if type(a).__module__ == "torch":
        return bool(a.dtype == b.dtype and a.shape == b.shape and (a == b).all())
    return bool(a == b)
