"""Doctests of an optional integration skip when its library is not installed."""

from __future__ import annotations

import importlib.util

import pytest

# module of the package -> the library its doctests need
_NEEDS = {
    "aioflow/integrations/torch.py": "torch",
    "aioflow/_group_methods.py::pin_memory": "torch",
    "aioflow/_group_methods.py::distribute": "distributed",
}


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        for where, lib in _NEEDS.items():
            path, _, name = where.partition("::")
            if not item.nodeid.startswith(path) or (name and not item.name.endswith(name)):
                continue
            if importlib.util.find_spec(lib) is None:
                item.add_marker(pytest.mark.skip(reason=f"{lib} is not installed"))
