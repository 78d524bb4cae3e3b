"""The argument checks every operator shares (``_check``)."""

from __future__ import annotations

import functools

import pytest

import aioflow as af
from aioflow._core.check import check_concurrency, check_int, fn_name, is_int


@pytest.mark.parametrize("v", [0, 5, 2**70])
def test_is_int_takes_ints_at_least_lo(v):
    assert is_int(v) and is_int(v, 0)


@pytest.mark.parametrize("v", [True, 1.0, "1", None, -1])
def test_is_int_refuses_bools_floats_strings_and_ints_below_lo(v):
    assert not is_int(v, 0)


def test_check_int_names_the_argument_and_what_it_must_be():
    assert check_int("n", 3, 1) == 3
    with pytest.raises(af.PipelineError, match=r"^n must be an int >= 1, got 0$"):
        check_int("n", 0, 1)
    with pytest.raises(af.PipelineError, match=r"^size must be a positive int, got True$"):
        check_int("size", True, 1, want="a positive int")
    with pytest.raises(af.StateMismatch, match="num_shards must be an int"):
        check_int("num_shards", "2", 1, error=af.StateMismatch)


def test_check_concurrency_takes_autotune():
    assert check_concurrency(af.AUTOTUNE) == af.AUTOTUNE
    with pytest.raises(af.PipelineError, match=r"a positive int or af\.AUTOTUNE, got 0"):
        check_concurrency(0)


def test_fn_name_sees_through_partials():
    def double(x, k):
        return k * x

    assert fn_name(functools.partial(double, k=2)) == "double"
    assert fn_name(functools.partial(functools.partial(double), k=2)) == "double"
