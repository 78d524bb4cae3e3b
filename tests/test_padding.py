"""padded_batch and bucket_by_length (tf.data semantics)."""

from __future__ import annotations

from collections import namedtuple

import numpy as np
import pytest

import aioflow as af


def as_lists(batches):
    return [b.tolist() for b in batches]


# -- padded_batch ----------------------------------------------------------------------------
def test_padded_batch_pads_to_the_longest_of_each_batch():
    items = [np.arange(n) for n in (1, 3, 2, 2, 5)]
    out = as_lists(af.from_iterable(items).padded_batch(2))
    assert out == [[[0, 0, 0], [0, 1, 2]], [[0, 1], [0, 1]], [[0, 1, 2, 3, 4]]]


def test_padded_batch_drop_remainder_and_padding_value():
    items = [[1], [2, 2], [3, 3, 3]]
    out = af.from_iterable(items).padded_batch(2, padding_value=-1, drop_remainder=True)
    assert as_lists(out) == [[[1, -1], [2, 2]]]
    assert len(af.from_iterable(items).padded_batch(2)) == 2
    assert len(af.from_iterable(items).padded_batch(2, drop_remainder=True)) == 1


def test_padded_batch_pads_every_dimension():
    items = [np.ones((1, 3)), np.ones((2, 1))]
    b = af.from_iterable(items).padded_batch(2).to_list()[0]
    assert b.shape == (2, 2, 3)
    assert b.tolist() == [[[1, 1, 1], [0, 0, 0]], [[1, 0, 0], [1, 0, 0]]]


def test_padded_batch_pads_dict_and_tuple_fields_separately_and_stacks_scalars():
    Sample = namedtuple("Sample", "tokens label")
    items = [
        {"ids": np.array([1, 2]), "y": 1, "s": Sample(np.array([7]), 0.5)},
        {"ids": np.array([3]), "y": 0, "s": Sample(np.array([8, 9, 9]), 1.5)},
    ]
    b = (
        af.from_iterable(items)
        .padded_batch(2, padding_value={"ids": -1, "y": 0, "s": 0})
        .to_list()[0]
    )
    assert b["ids"].tolist() == [[1, 2], [3, -1]]
    assert b["y"].tolist() == [1, 0]
    assert isinstance(b["s"], Sample)
    assert b["s"].tokens.tolist() == [[7, 0, 0], [8, 9, 9]]
    assert b["s"].label.tolist() == [0.5, 1.5]


def test_padded_batch_keeps_the_dtype_and_upcasts_mixed_ones():
    out = af.from_iterable([np.array([1], np.int8), np.array([1, 2], np.int8)]).padded_batch(2)
    assert out.to_list()[0].dtype == np.int8
    mixed = af.from_iterable([np.array([1], np.int8), np.array([0.5])]).padded_batch(2)
    assert mixed.to_list()[0].dtype == np.float64


def test_padded_batch_of_different_ranks_is_an_error_naming_the_stage():
    p = af.from_iterable([np.zeros(2), np.zeros((2, 2))]).padded_batch(2)
    with pytest.raises(af.PipelineError, match="ranks") as info:
        p.to_list()
    assert any("padded_batch" in n for n in info.value.__notes__)


def test_padded_batch_of_empty_input():
    assert af.range(0).padded_batch(3).to_list() == []


# -- bucket_by_length --------------------------------------------------------------------------
def test_bucket_by_length_batches_by_tf_data_boundaries_and_flushes_in_bucket_order():
    # lengths below 3 -> bucket 0; [3, 6) -> bucket 1; 6 and up -> bucket 2
    lengths = [1, 5, 2, 7, 3, 1, 9, 4, 6]
    items = [[n] * n for n in lengths]
    out = as_lists(af.from_iterable(items).bucket_by_length(len, [3, 6], [2, 2, 3]))
    assert out == [
        [[1, 0], [2, 2]],  # 1, 2: bucket 0 is full
        [[5, 5, 5, 5, 5], [3, 3, 3, 0, 0]],  # 5, 3: bucket 1 is full
        [[7] * 7 + [0, 0], [9] * 9, [6] * 6 + [0, 0, 0]],  # 7, 9, 6: bucket 2 is full
        [[1]],  # at the end, bucket 0's remainder
        [[4, 4, 4, 4]],  # then bucket 1's
    ]


def test_bucket_by_length_checks_its_buckets():
    with pytest.raises(af.PipelineError, match="len"):
        af.range(3).bucket_by_length(lambda x: x, [3, 6], [2, 2])
    with pytest.raises(af.PipelineError, match="increasing"):
        af.range(3).bucket_by_length(lambda x: x, [6, 3], [2, 2, 2])
    with pytest.raises(af.PipelineError):
        af.range(3).bucket_by_length(lambda x: x, [3], [2, 0])


def test_bucket_by_length_of_empty_input_and_dict_items():
    assert af.range(0).bucket_by_length(lambda x: 1, [2], [1, 1]).to_list() == []
    items = [{"ids": np.arange(n), "label": n % 2} for n in (1, 2, 4, 5)]
    out = af.from_iterable(items).bucket_by_length(lambda d: len(d["ids"]), [3], [2, 2]).to_list()
    assert [b["ids"].shape for b in out] == [(2, 2), (2, 5)]
    assert [b["label"].tolist() for b in out] == [[1, 0], [0, 1]]
