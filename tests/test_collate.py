"""The collates of ``batch`` (``collate``): the default one, lists, a custom one."""

from __future__ import annotations

from collections import namedtuple

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import aioflow as af


def test_batch_stacks_arrays_and_recurses_into_dicts_tuples_and_lists():
    items = [
        {"img": np.full((2, 2), i, np.float32), "label": i, "meta": (i, float(i)), "l": [i, -i]}
        for i in range(3)
    ]
    (b,) = af.from_iterable(items).batch(3).to_list()
    assert b["img"].shape == (3, 2, 2) and b["img"].dtype == np.float32
    assert b["label"].tolist() == [0, 1, 2]
    assert isinstance(b["meta"], tuple)
    assert b["meta"][0].tolist() == [0, 1, 2]
    assert b["meta"][1].dtype == np.float64
    assert [c.tolist() for c in b["l"]] == [[0, 1, 2], [0, -1, -2]]


def test_batch_keeps_strings_as_lists_and_namedtuples_as_namedtuples():
    P = namedtuple("P", "x y")
    (b,) = af.from_iterable([P(1, "a"), P(2, "b")]).batch(2).to_list()
    assert isinstance(b, P)
    assert b.x.tolist() == [1, 2]
    assert b.y == ["a", "b"]


def test_batch_collate_list_keeps_plain_lists():
    assert af.range(5).batch(2, collate=list).to_list() == [[0, 1], [2, 3], [4]]


def test_batch_with_a_custom_collate():
    assert af.range(6).batch(3, collate=sum).to_list() == [3, 12]


def test_batch_of_ints_beyond_int64_keeps_them_exact():
    items = [-1, 2**63 + 1]
    (b,) = af.from_iterable(items).batch(2).to_list()
    assert [int(x) for x in b] == items
    assert af.from_iterable(items).batch(2).unbatch().map(int).to_list() == items


# -- stack: np.stack, faster for many small rows ----------------------------------------
_shapes = st.lists(st.integers(0, 3), min_size=0, max_size=3).map(tuple)
_dtypes = st.sampled_from([np.float32, np.float64, np.int64, np.uint8, np.bool_])


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(_shapes, _dtypes), min_size=1, max_size=6), st.booleans(), st.data())
def test_stack_makes_what_np_stack_makes_or_fails_as_it_does(specs, same, data):
    if same:  # mostly arrays of one shape (the fast path), of one or several dtypes
        specs = [(specs[0][0], d) for _, d in specs]
    items = [(np.arange(int(np.prod(s))) % 3).astype(d).reshape(s) for s, d in specs]
    if data.draw(st.booleans()):  # views: rows of one array, strided
        base = np.arange(40.0).reshape(8, 5)[:, ::2]
        items = [base[i] for i in data.draw(st.lists(st.integers(0, 7), min_size=1))]
    try:
        want = np.stack(items)
    except ValueError:
        with pytest.raises(ValueError):
            af.collate.stack(items)
        return
    got = af.collate.stack(items)
    assert type(got) is np.ndarray and got.dtype == want.dtype and got.shape == want.shape
    assert np.array_equal(got, want) and got.flags.c_contiguous


def test_stack_keeps_np_stack_for_subclasses_and_scalars():
    m = np.ma.masked_array([1.0, 2.0], mask=[True, False])
    got, want = af.collate.stack([m, m]), np.stack([m, m])
    assert type(got) is type(want) is np.ma.MaskedArray and np.array_equal(got, want)
    assert af.collate.stack([np.float32(1), np.float32(2)]).tolist() == [1.0, 2.0]
    assert af.collate.stack([np.zeros(()), np.ones(())]).tolist() == [0.0, 1.0]
