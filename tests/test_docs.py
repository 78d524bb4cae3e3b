"""Every aioflow snippet of docs/porting.md runs.

A block opened with ```` ```python aioflow ```` is run after the blocks opened with
```` ```python aioflow setup ````, in a fresh namespace and a temporary directory. A block
that needs an optional library which is not installed is skipped, saying which; a name
aioflow does not have (an ``AttributeError``: a renamed or missing operator) fails it.
"""

from __future__ import annotations

import os
import re
import sys
import tempfile
import threading
from collections.abc import Callable
from pathlib import Path

import pytest

DOC = Path(__file__).resolve().parents[1] / "docs" / "porting.md"
BLOCK = re.compile(r"^```python aioflow( setup)?\n(.*?)^```", re.M | re.S)
OPTIONAL = {"torch", "datasets", "jax"}


def blocks() -> tuple[list[str], list[tuple[str, str]]]:
    """The setup blocks, and the snippets with the heading they appear under."""
    text = DOC.read_text()
    setup, snippets = [], []
    for m in BLOCK.finditer(text):
        if m.group(1):
            setup.append(m.group(2))
            continue
        headings = re.findall(r"^## (.+)$", text[: m.start()], re.M)
        where = headings[-1] if headings else "top"
        snippets.append((f"{where} #{sum(w == where for w, _ in snippets) + 1}", m.group(2)))
    return setup, [(w, code) for w, code in snippets]


SETUP, SNIPPETS = blocks()

#: CPython before 3.11.8 (gh-106905): ``ast.literal_eval``, which ``np.load`` uses for
#: the header, can fail with ``SystemError`` in several threads at once. aioflow's own
#: ``read_npy`` avoids it; the page's ``load`` is the user's code, so on those versions
#: the snippets call it one thread at a time (the page says so).
AST_RACE = (3, 11) <= sys.version_info[:3] < (3, 11, 8)


class _OneAtATime:
    """``fn`` called by one thread at a time (in each process: the lock is not shipped)."""

    def __init__(self, fn: Callable[[str], object]) -> None:
        self.fn = fn
        self.__name__ = getattr(fn, "__name__", "load")
        self.lock = threading.Lock()

    def __getstate__(self) -> dict[str, object]:
        return {"fn": self.fn}

    def __setstate__(self, state: dict[str, object]) -> None:
        self.__init__(state["fn"])  # type: ignore[misc]

    def __call__(self, path: str) -> object:
        with self.lock:
            return self.fn(path)


def test_the_page_has_a_setup_and_a_snippet_per_library():
    names = " ".join(w for w, _ in SNIPPETS)
    for lib in ("tf.data", "DataLoader", "tensorpack", "SPDL", "Multi-host"):
        assert lib in names, lib
    assert len(SETUP) == 1


@pytest.mark.parametrize("code", [c for _, c in SNIPPETS], ids=[w for w, _ in SNIPPETS])
def test_aioflow_snippet_runs(code, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    for var in ("RANK", "WORLD_SIZE"):
        monkeypatch.delenv(var, raising=False)
    env = dict(os.environ)
    namespace: dict[str, object] = {"__name__": "porting_snippet"}
    try:
        for block in SETUP:
            exec(compile(block, f"{DOC.name}:setup", "exec"), namespace)
        if AST_RACE:
            namespace["load"] = _OneAtATime(namespace["load"])  # type: ignore[arg-type]
        exec(compile(code, DOC.name, "exec"), namespace)
    except ModuleNotFoundError as e:
        if e.name in OPTIONAL:
            pytest.skip(f"{e.name} is not installed")
        raise
    finally:
        os.environ.clear()
        os.environ.update(env)  # a snippet may set RANK/WORLD_SIZE
