"""The operator catalogue (``tests/_catalogue.py``) lists every public ``Pipeline`` method."""

from __future__ import annotations

import inspect

from _catalogue import NEEDS_EXTRA, NOT_OPERATORS, OPERATORS

import aioflow as af


def _public_methods() -> set[str]:
    return {
        n
        for n in dir(af.Pipeline)
        if not n.startswith("_") and inspect.isfunction(inspect.getattr_static(af.Pipeline, n))
    }


def test_every_public_pipeline_method_is_in_the_catalogue():
    missing = _public_methods() - set(OPERATORS) - set(NOT_OPERATORS) - set(NEEDS_EXTRA)
    assert not missing, f"add these to tests/_catalogue.py: {sorted(missing)}"


def test_the_catalogue_names_only_real_methods():
    stale = (set(OPERATORS) | NOT_OPERATORS | set(NEEDS_EXTRA)) - _public_methods()
    assert not stale, stale
