"""A process map's results stacked in the worker (``_columns``): the rows rebuilt in the
parent are the items themselves, and a batch made from the columns is the batch the
collate makes of the items."""

from __future__ import annotations

import pickle
from collections import namedtuple
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from aioflow._process.columns import Rows, collated, cut, joined, rows, stack
from aioflow.collate import default_collate
from tests._same import same

Pair = namedtuple("Pair", "a b")

DTYPES = ["float32", "int64", "uint8", "bool", ">i4", "complex64"]


# -- a schema of items, and items that follow it ------------------------------------------
def schemas(depth: int = 2) -> st.SearchStrategy[Any]:
    leaf = st.one_of(
        st.tuples(
            st.just("arr"),
            st.lists(st.integers(0, 3), max_size=3).map(tuple),
            st.sampled_from(DTYPES),
        ),
        st.sampled_from([("int",), ("float",), ("str",), ("none",)]),
    )
    if depth == 0:
        return leaf
    inner = schemas(depth - 1)
    return st.one_of(
        leaf,
        st.tuples(st.just("dict"), st.lists(inner, min_size=1, max_size=3)),
        st.tuples(st.just("tuple"), st.lists(inner, max_size=3)),
        st.tuples(st.just("list"), st.lists(inner, min_size=1, max_size=3)),
        st.tuples(st.just("pair"), st.lists(inner, min_size=2, max_size=2)),
    )


def make(schema: Any, i: int) -> Any:
    kind = schema[0]
    if kind == "arr":
        shape, dtype = schema[1], schema[2]
        return (np.arange(int(np.prod(shape))) + i).reshape(shape).astype(dtype)
    if kind == "int":
        return i
    if kind == "float":
        return i / 2
    if kind == "str":
        return f"s{i}"
    if kind == "none":
        return None
    parts = [make(s, i) for s in schema[1]]
    if kind == "dict":
        return {f"k{j}": v for j, v in reversed(list(enumerate(parts)))}  # (not sorted)
    if kind == "tuple":
        return tuple(parts)
    if kind == "list":
        return parts
    return Pair(*parts)


def has_array(schema: Any) -> bool:
    if schema[0] == "arr":
        return np.dtype(schema[2]).isnative  # (other byte orders travel as values)
    return schema[0] in ("dict", "tuple", "list", "pair") and any(map(has_array, schema[1]))


# -- properties ---------------------------------------------------------------------------
@settings(max_examples=200, deadline=None)
@given(schema=schemas(), n=st.integers(1, 6))
def test_stacked_rows_are_the_items_and_their_batch_is_the_collates(schema, n):
    items = [make(schema, i) for i in range(n)]
    got = stack(items)
    if not has_array(schema):
        assert got is None  # nothing to gain: the items go as they are
        return
    assert got is not None
    template, cols = pickle.loads(pickle.dumps(got, protocol=5))  # as it travels
    r = rows(template, cols, n)
    assert type(r) is Rows and len(r) == n
    assert all(same(x, y) for x, y in zip(r, items, strict=True))
    assert same(collated(r.template, r.cols, lambda a: a, default_collate), default_collate(items))


@settings(max_examples=100, deadline=None)
@given(schema=schemas(), other=schemas(), n=st.integers(2, 5), at=st.integers(1, 4))
def test_results_of_two_structures_do_not_stack(schema, other, n, at):
    items = [make(schema, i) for i in range(n)]
    odd = make(other, 0)
    items[min(at, n - 1)] = odd
    got = stack(items)
    if got is not None:  # stacked only when the odd one has the same structure after all
        template, cols = got
        assert all(same(x, y) for x, y in zip(rows(template, cols, n), items, strict=True))


# -- cases --------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "odd",
    [
        np.zeros(3, np.float64),  # another dtype
        np.zeros(4, np.float32),  # another shape
        np.zeros(3, np.float32).view(np.ma.MaskedArray),  # not a plain ndarray
        np.zeros(3, ">f4"),  # not the native byte order
        [0.0, 0.0, 0.0],  # not an array
    ],
    ids=["dtype", "shape", "subclass", "byte order", "list"],
)
def test_an_array_field_unlike_the_first_does_not_stack(odd):
    items = [{"x": np.zeros(3, np.float32)}, {"x": odd}]
    assert stack(items) is None


def test_arrays_of_another_byte_order_or_of_objects_travel_as_values():
    for dtype in (">i4", object):
        items = [(np.zeros(2, dtype), np.ones(3, np.float32)) for _ in range(3)]
        template, cols = stack(items)
        assert isinstance(cols[0], list) and cols[1].shape == (3, 3)
        r = rows(template, cols, 3)
        assert all(same(x, y) for x, y in zip(r, items, strict=True))


def test_dict_keys_in_another_order_or_a_missing_field_do_not_stack():
    a = {"x": np.zeros(2), "y": 1}
    assert stack([a, {"y": 1, "x": np.zeros(2)}]) is None
    assert stack([a, {"x": np.zeros(2)}]) is None
    assert stack([(np.zeros(2), 1), (np.zeros(2), 1, 2)]) is None
    assert stack([(np.zeros(2), 1), Pair(np.zeros(2), 1)]) is None


def test_a_0d_array_field_comes_back_a_0d_array_not_a_numpy_scalar():
    items = [np.array(i, np.int32) for i in range(3)]
    template, cols = stack(items)
    r = rows(template, cols, 3)
    assert all(type(x) is np.ndarray and x.shape == () for x in r)
    assert [int(x) for x in r] == [0, 1, 2]


def test_rows_are_views_of_one_stacked_array_per_field():
    items = [{"img": np.full((2, 2), i, np.float32), "label": i} for i in range(4)]
    template, cols = stack(items)
    assert isinstance(cols[0], np.ndarray) and cols[0].shape == (4, 2, 2)
    assert cols[1] == [0, 1, 2, 3]  # other fields: the items' own values
    r = rows(template, cols, 4)
    assert all(np.shares_memory(x["img"], cols[0]) for x in r)
    b = collated(r.template, r.cols, lambda a: a, default_collate)
    assert b["img"] is cols[0] and b["label"].tolist() == [0, 1, 2, 3]


def test_consecutive_rows_join_into_one_batch_and_rows_stacked_otherwise_do_not():
    items = [(np.full(3, i, np.int16), f"n{i}") for i in range(7)]
    parts = [rows(*stack(items[a:b]), b - a) for a, b in [(0, 1), (1, 4), (4, 7)]]
    template, cols = joined(parts)
    assert same(collated(template, cols, lambda a: a, default_collate), default_collate(items))
    assert joined(parts[:1])[1] is parts[0].cols  # one part: its own columns, no copy
    other = rows(*stack([(np.zeros(3, np.int32), "x")]), 1)  # another dtype
    assert joined([parts[0], other]) is None


def test_rows_cut_anywhere_join_back_into_the_batch_of_their_items():
    items = [{"x": np.full(2, i, np.float32), "i": i} for i in range(10)]
    r = rows(*stack(items), 10)
    spans = [(0, 3), (3, 4), (4, 10)]
    pieces = [cut(r, a, b) for a, b in spans]
    assert all(same(list(p), items[a:b]) for p, (a, b) in zip(pieces, spans, strict=True))
    assert all(np.shares_memory(p.cols[0], r.cols[0]) for p in pieces)  # views, no copy
    both = collated(*joined(pieces), lambda a: a, default_collate)
    assert same(both, default_collate(items))


def test_strided_and_empty_arrays_stack_as_np_stack_makes_them():
    base = np.arange(96, dtype=np.float32).reshape(8, 12)
    for items in (
        [base[i, ::3] for i in range(8)],  # strided rows
        [base[:, i] for i in range(12)],  # columns
        [np.zeros((2, 0), np.int64) for _ in range(3)],  # empty
        [np.full((), i, np.float32) for i in range(4)],  # 0-d
    ):
        got = stack(items)
        assert got is not None
        arr = got[1][0]
        want = np.stack(items)
        assert arr.shape == want.shape and arr.dtype == want.dtype
        assert np.array_equal(arr, want) and arr.flags.c_contiguous
