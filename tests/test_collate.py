"""The collates of ``batch`` (``collate``): the default one, lists, a custom one."""

from __future__ import annotations

from collections import namedtuple

import numpy as np

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
