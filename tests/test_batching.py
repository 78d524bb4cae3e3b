"""batch, unbatch, rebatch, window (``batching``; the collates: test_collate.py)."""

from __future__ import annotations

import numpy as np
import pytest

import aioflow as af


def test_batch_stacks_numbers_into_arrays_and_keeps_the_remainder():
    out = af.range(7).batch(3).to_list()
    assert [b.tolist() for b in out] == [[0, 1, 2], [3, 4, 5], [6]]
    assert all(isinstance(b, np.ndarray) for b in out)


def test_batch_drop_remainder():
    assert [b.tolist() for b in af.range(7).batch(3, drop_remainder=True)] == [
        [0, 1, 2],
        [3, 4, 5],
    ]
    assert af.range(2).batch(3, drop_remainder=True).to_list() == []


def test_batch_of_empty_input_is_empty():
    assert af.range(0).batch(4).to_list() == []


def test_batch_larger_than_a_chunk_and_exact_multiples():
    out = af.range(1000).batch(300).to_list()
    assert [len(b) for b in out] == [300, 300, 300, 100]
    assert np.concatenate(out).tolist() == list(range(1000))
    assert [len(b) for b in af.range(512).batch(256)] == [256, 256]


def test_batch_of_mismatched_shapes_raises_naming_the_stage():
    items = [np.zeros(2), np.zeros(3)]
    with pytest.raises(ValueError) as info:
        af.from_iterable(items).batch(2).to_list()
    assert "batch(2)" in info.value.__notes__[0]


@pytest.mark.parametrize("bad", [0, -1, 2.0, None])
def test_batch_rejects_bad_sizes(bad):
    with pytest.raises(af.PipelineError):
        af.range(3).batch(bad)


def test_unbatch_is_the_inverse_of_batch():
    items = [{"x": np.arange(3) + i, "y": (i, str(i))} for i in range(5)]
    back = af.from_iterable(items).batch(2).unbatch().to_list()
    assert len(back) == 5
    for a, b in zip(items, back, strict=True):
        assert a["x"].tolist() == b["x"].tolist()
        assert int(b["y"][0]) == a["y"][0] and b["y"][1] == a["y"][1]
    assert af.range(5).batch(2, collate=list).unbatch().to_list() == [0, 1, 2, 3, 4]


def test_unbatch_of_a_scalar_is_a_clear_error():
    with pytest.raises(af.PipelineError, match="unbatch"):
        af.range(3).unbatch().to_list()


def test_rebatch_recuts_batch_sizes():
    out = af.range(10).batch(3).rebatch(4).to_list()
    assert [b.tolist() for b in out] == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]
    out = af.range(10).batch(3).rebatch(4, drop_remainder=True).to_list()
    assert [len(b) for b in out] == [4, 4]
    assert af.range(5).batch(2, collate=list).rebatch(3).to_list() == [[0, 1, 2], [3, 4]]


def test_window_follows_tf_data():
    assert af.range(7).window(3).to_list() == [[0, 1, 2], [3, 4, 5], [6]]
    assert af.range(7).window(3, shift=2).to_list() == [[0, 1, 2], [2, 3, 4], [4, 5, 6], [6]]
    assert af.range(5).window(3, shift=1).to_list() == [
        [0, 1, 2],
        [1, 2, 3],
        [2, 3, 4],
        [3, 4],
        [4],
    ]
    assert af.range(5).window(3, shift=1, drop_remainder=True).to_list() == [
        [0, 1, 2],
        [1, 2, 3],
        [2, 3, 4],
    ]
    assert af.range(10).window(2, shift=4).to_list() == [[0, 1], [4, 5], [8, 9]]
    assert af.range(9).window(2, shift=4).to_list() == [[0, 1], [4, 5], [8]]
    assert af.range(0).window(2).to_list() == []


def test_window_cardinality_matches_its_output():
    for n in range(12):
        for size, shift, drop in [(3, 2, False), (3, 2, True), (2, 4, False), (4, 1, True)]:
            p = af.range(n).window(size, shift=shift, drop_remainder=drop)
            assert len(p) == len(p.to_list()), (n, size, shift, drop)
