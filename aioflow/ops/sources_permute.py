"""A keyed bijection over ``[0, n)``: the global shuffle of ``from_source`` in O(1) memory.

``Permutation(n, key)[i]`` is where position ``i`` of the shuffled order reads from. It is
a balanced Feistel network over the smallest power of four >= ``n`` (an even number of
bits, split in two halves), six rounds whose round function is a splitmix64 finalizer of
the half and a round key, with *cycle walking*: a value that lands at or above ``n`` is
encrypted again until it falls inside. A Feistel network is a bijection of its domain
whatever the round function, and cycle walking restricts a bijection of a superset to a
bijection of ``[0, n)`` (the walk from a value in range returns to the range before it
can revisit anything). The domain is under ``4 * n``, so a walk takes under 4 steps on
average. Nothing of size ``n`` is ever held: a source of 10^9 items starts at once.

Positions are mapped in numpy blocks (``take``), which is what makes a shuffled source
as fast as indexing a precomputed ``np.random.permutation``.
"""

from __future__ import annotations

import numpy as np

__all__ = ["Permutation"]

_ROUNDS = 6
_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)


def _mix(z: np.ndarray) -> np.ndarray:
    """splitmix64's finalizer (uint64 arithmetic wraps, as intended)."""
    z = (z ^ (z >> np.uint64(30))) * _M1
    z = (z ^ (z >> np.uint64(27))) * _M2
    return z ^ (z >> np.uint64(31))


class Permutation:
    """The permutation of ``range(n)`` keyed by ``key`` (a tuple of non-negative ints).

    Example:
        >>> p = Permutation(10, (7, 0))
        >>> sorted(p.take(0, 10).tolist()) == list(range(10))
        True
        >>> p[3] == int(p.take(3, 4)[0])
        True
    """

    __slots__ = ("_half", "_keys", "_mask", "n")

    def __init__(self, n: int, key: tuple[int, ...]) -> None:
        self.n = n
        bits = max(2, (max(n, 1) - 1).bit_length())
        bits += bits % 2
        self._half = np.uint64(bits // 2)
        self._mask = np.uint64((1 << (bits // 2)) - 1)
        seq = np.random.SeedSequence([int(k) for k in key])
        self._keys = [np.uint64(k) for k in seq.generate_state(_ROUNDS, dtype=np.uint64)]

    def _encrypt(self, x: np.ndarray) -> np.ndarray:
        half, mask = self._half, self._mask
        left, right = x >> half, x & mask
        with np.errstate(over="ignore"):
            for k in self._keys:
                left, right = right, left ^ (_mix(right ^ k) & mask)
        return (left << half) | right

    def map(self, positions: np.ndarray) -> np.ndarray:
        """The images of ``positions`` (uint64 values in ``[0, n)``)."""
        out = self._encrypt(positions)
        n = np.uint64(self.n)
        outside = np.flatnonzero(out >= n)
        while outside.size:  # cycle walking: re-encrypt what fell outside [0, n)
            again = self._encrypt(out[outside])
            out[outside] = again
            outside = outside[again >= n]
        return out

    def take(self, start: int, stop: int) -> np.ndarray:
        """The images of the positions ``start .. stop - 1`` (int64 array)."""
        if stop <= start:
            return np.empty(0, dtype=np.int64)
        pos = np.arange(start, stop, dtype=np.uint64)
        return self.map(pos).astype(np.int64)

    def __getitem__(self, i: int) -> int:
        return int(self.take(i, i + 1)[0])
