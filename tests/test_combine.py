"""zip and concat."""

from __future__ import annotations

import pytest

import aioflow as af


def test_zip_pairs_items_until_the_shortest_ends():
    assert af.zip(af.range(3), af.from_iterable("abcd")).to_list() == [
        (0, "a"),
        (1, "b"),
        (2, "c"),
    ]
    assert af.zip(af.range(1000), af.range(1000).map(str)).to_list()[-1] == (999, "999")


def test_zip_of_three_and_of_an_empty_input():
    assert af.zip(af.range(2), af.range(2), af.range(2)).to_list() == [(0, 0, 0), (1, 1, 1)]
    assert af.zip(af.range(0), af.range(5)).to_list() == []


def test_zip_stops_an_infinite_input(no_leaks):
    assert af.zip(af.range(3), af.range(1).repeat()).to_list() == [(0, 0), (1, 0), (2, 0)]


def test_concat_runs_inputs_one_after_another():
    assert af.concat(af.range(2), af.range(0), af.from_iterable("ab")).to_list() == [
        0,
        1,
        "a",
        "b",
    ]


def test_combine_rejects_non_pipelines_and_empty_calls():
    with pytest.raises(af.PipelineError):
        af.zip()
    with pytest.raises(af.PipelineError):
        af.concat(af.range(2), [1, 2])  # type: ignore[arg-type]


def test_zip_reiterates():
    p = af.zip(af.range(3), af.range(3).map(lambda x: -x))
    assert p.to_list() == p.to_list()
