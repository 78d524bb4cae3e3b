"""JAX: batch(collate="jax") puts the stacked arrays on the default device."""

from __future__ import annotations

from collections import namedtuple

import numpy as np
import pytest

import aioflow as af

jax = pytest.importorskip(
    "jax", reason="jax is not installed (the test extra installs it wherever a jaxlib wheel exists)"
)

Pair = namedtuple("Pair", "x y")


def test_jax_collate_gives_device_arrays_in_the_shape_of_the_samples():
    p = af.range(5).map(
        lambda i: {"img": np.full((2, 2), i, np.float32), "label": i, "id": f"s{i}"}
    )
    out = p.batch(2, collate="jax").to_list()
    assert [b["img"].shape for b in out] == [(2, 2, 2), (2, 2, 2), (1, 2, 2)]
    assert all(isinstance(b["img"], jax.Array) and isinstance(b["label"], jax.Array) for b in out)
    assert [b["label"].tolist() for b in out] == [[0, 1], [2, 3], [4]]
    assert out[0]["img"].dtype == np.float32
    assert [b["id"] for b in out] == [["s0", "s1"], ["s2", "s3"], ["s4"]]
    assert next(iter(out[0]["img"].devices())) == jax.devices()[0]


def test_jax_collate_keeps_namedtuples_and_lists():
    out = af.from_iterable([Pair(np.zeros(2), [1, 2.0]), Pair(np.ones(2), [3, 4.0])])
    (b,) = out.batch(2, collate="jax").to_list()
    assert type(b) is Pair and isinstance(b.x, jax.Array) and b.x.shape == (2, 2)
    assert [c.tolist() for c in b.y] == [[1, 3], [2.0, 4.0]]


def test_jax_collate_of_objects_only_is_a_list():
    assert af.from_iterable(["a", "b"]).batch(2, collate="jax").to_list() == [["a", "b"]]
