"""The package's layering: no aioflow import inside a function (``lint-imports`` checks the
layers themselves, from pyproject.toml; see docs/architecture.md)."""

from __future__ import annotations

import ast
from pathlib import Path

import aioflow

PACKAGE = Path(aioflow.__file__).parent

#: Optional dependencies (pyproject's extras): imported when a function needs them, so that
#: ``import aioflow`` works without them.
OPTIONAL = {"torch", "jax", "distributed", "pyarrow", "fsspec", "google_crc32c", "uvloop",
            "matplotlib"}


def _imports_in_functions(path: Path) -> list[tuple[int, str]]:
    found: list[tuple[int, str]] = []

    def visit(node: ast.AST, in_function: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if in_function and isinstance(child, ast.Import):
                found.extend((child.lineno, a.name) for a in child.names)
            elif in_function and isinstance(child, ast.ImportFrom):
                found.append((child.lineno, "." * child.level + (child.module or "")))
            inner = isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda)
            visit(child, in_function or inner)

    visit(ast.parse(path.read_text(), str(path)), False)
    return found


def test_no_module_imports_inside_a_function_but_optional_dependencies():
    bad = [
        f"{path.relative_to(PACKAGE.parent)}:{line}: {name}"
        for path in sorted(PACKAGE.rglob("*.py"))
        for line, name in _imports_in_functions(path)
        if name.split(".")[0] not in OPTIONAL
    ]
    assert bad == []


def test_the_check_sees_an_import_inside_a_function(tmp_path):
    f = tmp_path / "m.py"
    f.write_text("import os\n\ndef f():\n    from . import pipeline\n    import torch\n")
    assert _imports_in_functions(f) == [(4, "."), (5, "torch")]
