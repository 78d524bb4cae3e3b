"""Items and results of a process map whose classes workers cannot import (issue 27):
classes of the training script's ``__main__`` (a notebook cell's are there too), of a
test function (local), and of a module loaded from a file that is not on the path. They
cross by value both ways, nested anywhere, through the batched (stacked) path too, and
the results are those of a thread map. Plain items and results keep the plain pickle.
Every scenario runs under the fault guard."""

from __future__ import annotations

import collections
import dataclasses
import enum
import importlib.util
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import aioflow as af
import aioflow._process.ship
from tests._same import same
from tests.faults import _procfns as fns

PROCESS: dict[str, Any] = {"executor": "process", "concurrency": 2}
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# A training script: its classes live in ``__main__``, which workers never run.
SCRIPT = """
import collections, dataclasses, enum, sys
import numpy as np
import aioflow as af


@dataclasses.dataclass
class Sample:
    i: int
    name: str
    tags: list


class Kind(enum.Enum):
    EVEN = 0
    ODD = 1


Out = collections.namedtuple("Out", "i kind sample")


def helper(i):
    return i * 10


def item(i):
    # a dataclass nested in a dict, with an Enum, a class itself and a function as values
    return {"s": Sample(i, f"s{i}", [Kind(i % 2)]), "n": i, "cls": Kind, "fn": helper}


def load(d):
    s = d["s"]
    assert type(s) is Sample and s.tags[0] is Kind(s.i % 2) and d["cls"] is Kind
    out = Out(s.i, Kind(s.i % 2), s)
    return {"out": out, "img": np.full((2, 3), s.i, np.float32), "more": [d["fn"](s.i), s]}


def same(a, b):
    if type(a) is not type(b):
        return False
    if isinstance(a, np.ndarray):
        return a.dtype == b.dtype and a.shape == b.shape and bool((a == b).all())
    if isinstance(a, dict):
        return list(a) == list(b) and all(same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    if dataclasses.is_dataclass(a):
        return same(dataclasses.asdict(a), dataclasses.asdict(b))
    return a == b


N = 40
items = [item(i) for i in range(N)]
want = af.from_iterable(items).map(load, executor="thread").to_list()
want_batches = af.from_iterable(items).map(load, executor="thread").batch(8).to_list()
with af.from_iterable(items).map(load, executor="process", concurrency=2) as p:
    got = p.to_list()
    print("map", len(got) == N and all(same(x, y) for x, y in zip(got, want)))
    print("types", type(got[0]["out"]) is Out and got[1]["out"].kind is Kind.ODD)
    batches = p.batch(8).to_list()
    print("batch", len(batches) == 5 and all(same(x, y) for x, y in zip(batches, want_batches)))
skip = af.from_iterable(items).map(load, executor="process", on_error="skip")
print("skip", len(skip.to_list()) == N)
skip.close()
# results only: the items are ints
with af.range(N).map(lambda i: Out(i, Kind(i % 2), Sample(i, "r", [])), executor="process") as p:
    got = p.to_list()
    print("results", got == [Out(i, Kind(i % 2), Sample(i, "r", [])) for i in range(N)])
# only a class and a function of __main__ as values (no instance of one)
values = [{"fn": helper, "cls": Kind, "i": i} for i in range(N)]
with af.from_iterable(values).map(lambda d: (d["fn"](d["i"]), d["cls"]), executor="process") as p:
    print("values", p.to_list() == [(10 * i, Kind) for i in range(N)])
"""


def _run_script(tmp_path: Path) -> subprocess.CompletedProcess[str]:
    (tmp_path / "train.py").write_text(SCRIPT)
    proc = subprocess.Popen(
        [sys.executable, str(tmp_path / "train.py")],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": ROOT},
        cwd=tmp_path,
        start_new_session=True,
    )
    try:
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            out, err = proc.communicate()
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def test_the_classes_of_a_script_s_main_cross_to_workers_and_back(tmp_path):
    r = _run_script(tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.split("\n")[:7] == [
        "map True",
        "types True",
        "batch True",
        "skip True",
        "results True",
        "values True",
        "",
    ], (r.stdout, r.stderr[-3000:])


# -- a class of a test function -----------------------------------------------------------
def test_local_classes_cross_both_ways_and_through_the_stacked_batches():
    @dataclasses.dataclass
    class Box:
        i: int
        label: str

    class Colour(enum.Enum):
        RED = 1
        BLUE = 2

    Pair = collections.namedtuple("Pair", "box colour")

    def unbox(d: dict[str, Any]) -> dict[str, Any]:
        b = d["box"]
        assert type(b) is Box
        return {"pair": Pair(b, Colour.RED if b.i % 2 else Colour.BLUE), "x": np.full(3, b.i)}

    items = [{"box": Box(i, f"b{i}")} for i in range(30)]
    want = af.from_iterable(items).map(unbox, executor="thread").to_list()
    with af.from_iterable(items).map(unbox, **PROCESS) as p:
        got = p.to_list()
        assert len(got) == 30 and all(same(x, y) for x, y in zip(got, want, strict=True))
        assert type(got[0]["pair"]) is Pair and got[1]["pair"].colour is Colour.RED
        batches = p.batch(4).to_list()
    want_b = af.from_iterable(items).map(unbox).batch(4).to_list()
    assert len(batches) == 8 and all(same(x, y) for x, y in zip(batches, want_b, strict=True))


# -- a module workers cannot import -------------------------------------------------------
MODULE = """
import dataclasses


@dataclasses.dataclass(frozen=True)
class Record:
    key: str
    value: int


def double(r):
    return {"r": Record(r.key + "!", 2 * r.value), "orig": r}
"""


@pytest.fixture(params=["aioflow_test_records", "aioflow_test_pkg.records"])
def unimportable(tmp_path: Path, request: pytest.FixtureRequest) -> Any:
    """A module loaded from a file outside ``sys.path``, as a test runner or a notebook
    tool may do: it is in ``sys.modules`` here, but a worker cannot import it (nor can
    this process import it again, when its package is not there: the second name)."""
    name = request.param
    path = tmp_path / "records.py"
    path.write_text(MODULE)
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    try:
        spec.loader.exec_module(mod)
        yield mod
    finally:
        del sys.modules[name]


def test_the_classes_and_functions_of_a_module_workers_cannot_import_cross(unimportable):
    items = [unimportable.Record(f"k{i}", i) for i in range(25)]
    want = af.from_iterable(items).map(unimportable.double, executor="thread").to_list()
    with af.from_iterable(items).map(unimportable.double, **PROCESS) as p:
        got = p.to_list()
    assert got == want
    assert type(got[0]["r"]) is unimportable.Record


def test_a_test_module_function_gets_items_of_an_unimportable_module(unimportable):
    items = [{"r": unimportable.Record(f"k{i}", i), "i": i} for i in range(25)]
    with af.from_iterable(items).map(fns.ident, **PROCESS) as p:
        got = p.to_list()
    assert got == items


# -- the plain path stays plain -----------------------------------------------------------
def test_plain_items_and_results_never_take_the_by_value_pickler(monkeypatch):
    calls = [0]
    real = aioflow._process.ship.dumps_by_value

    def counting(*args: Any, **kwargs: Any) -> bytes:
        calls[0] += 1
        return real(*args, **kwargs)

    monkeypatch.setattr(aioflow._process.ship, "dumps_by_value", counting)
    arrays = [np.full((4, 4), i) for i in range(20)]
    with af.from_iterable(arrays).map(fns.ident, **PROCESS) as p:
        got = p.to_list()
        assert all(same(x, y) for x, y in zip(got, arrays, strict=True))
        assert [int(b[0, 0, 0]) for b in p.batch(5).to_list()] == [0, 5, 10, 15]
    with af.range(50).map(fns.fail_at_20, **PROCESS, on_error="skip") as p:
        assert p.to_list() == [i for i in range(50) if i != 20]
    assert calls[0] == 0


# -- a notebook cell ----------------------------------------------------------------------
CELLS = [
    "import dataclasses, enum\nimport aioflow as af",
    "@dataclasses.dataclass\nclass Sample:\n    i: int\n\nclass Kind(enum.Enum):\n    A = 1",
    "def load(s):\n    return {'i': s.i, 'kind': Kind.A, 'again': Sample(s.i + 1)}",
    "items = [Sample(i) for i in range(20)]\n"
    "with af.from_iterable(items).map(load, executor='process', on_error='skip') as p:\n"
    "    got = p.to_list()\n"
    "print(got == [{'i': i, 'kind': Kind.A, 'again': Sample(i + 1)} for i in range(20)])",
]


def test_the_classes_of_a_notebook_cell_cross_to_workers_and_back(tmp_path):
    """Run by ``jupyter nbconvert --execute`` in a process of its own (the kernel client's
    loop and sockets are not this test's to check)."""
    nbformat = pytest.importorskip("nbformat")
    pytest.importorskip("nbconvert")
    pytest.importorskip("ipykernel")
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(c) for c in CELLS])
    nbformat.write(nb, tmp_path / "cells.ipynb")
    cells, out = str(tmp_path / "cells.ipynb"), str(tmp_path / "out.ipynb")
    cmd = ["jupyter", "nbconvert", "--to", "notebook", "--execute", cells, "--output", out]
    r = subprocess.run(
        [sys.executable, "-m", *cmd],
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": ROOT},
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    outputs = nbformat.read(out, as_version=4).cells[-1].outputs
    assert [o.get("text") for o in outputs] == ["True\n"], outputs
