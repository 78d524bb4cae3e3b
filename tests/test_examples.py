"""The examples run: the torch and JAX training scripts, and the quickstart notebook."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples"


def load_example(name: str) -> ModuleType:
    """Import examples/<name>.py as a module (the examples folder is not a package)."""
    sys.path.insert(0, str(EXAMPLES))  # async_trainer imports torch_train
    try:
        spec = importlib.util.spec_from_file_location(f"example_{name}", EXAMPLES / f"{name}.py")
        assert spec is not None and spec.loader is not None
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        return mod
    finally:
        sys.path.remove(str(EXAMPLES))


def test_torch_train_learns_from_a_sync_for_loop(no_leaks):
    pytest.importorskip("torch")
    res = load_example("torch_train").main(epochs=3, quiet=True)
    assert len(res["losses"]) == 3
    assert res["losses"][-1] < res["losses"][0] / 5
    assert res["accuracy"] > 0.95


def test_torch_train_runs_as_a_script():
    pytest.importorskip("torch")
    out = subprocess.run(
        [sys.executable, str(EXAMPLES / "torch_train.py"), "--epochs", "2"],
        capture_output=True,
        text=True,
        timeout=50,
        check=True,
    )
    assert [line.split(":")[0] for line in out.stdout.splitlines()] == ["epoch 0", "epoch 1"]


def test_async_trainer_trains_while_logging_and_checkpointing(no_leaks):
    pytest.importorskip("torch")
    res = load_example("async_trainer").main(epochs=3, every=0.05, quiet=True)
    losses = res["losses"]
    assert len(losses) == 3 and losses[-1] < losses[0] / 5
    # the logger received every epoch line, the final save, and the periodic checkpoints
    assert [m.split(":")[0] for m in res["log"] if m.startswith("epoch")] == [
        "epoch 0",
        "epoch 1",
        "epoch 2",
    ]
    assert res["log"][-1] == "saved final.pt"
    assert len(res["checkpoints"]) >= 1
    assert sum(m.startswith("checkpoint") for m in res["log"]) == len(res["checkpoints"])


JAX_MISSING = "jax is not installed (the test extra installs it wherever a jaxlib wheel exists)"


def test_jax_train_learns_from_jax_batches(no_leaks):
    pytest.importorskip("jax", reason=JAX_MISSING)
    res = load_example("jax_train").main(epochs=2, quiet=True)
    assert len(res["losses"]) == 2
    assert res["losses"][-1] < res["losses"][0]
    assert res["accuracy"] > 0.95


def test_jax_train_runs_as_a_script():
    pytest.importorskip("jax", reason=JAX_MISSING)
    out = subprocess.run(
        [sys.executable, str(EXAMPLES / "jax_train.py"), "--epochs", "1"],
        capture_output=True,
        text=True,
        timeout=50,
        check=True,
    )
    assert [line.split(":")[0] for line in out.stdout.splitlines()] == ["epoch 0"]


# -- the notebook -------------------------------------------------------------------------
def notebook_client(nb, tmp_path: Path, monkeypatch: pytest.MonkeyPatch):  # type: ignore[no-untyped-def]
    """A client whose kernel is this very interpreter (the venv's), whatever kernels the
    machine has: a kernelspec written to ``tmp_path``, local sockets, no TCP port."""
    import nbclient
    from traitlets.config import Config

    spec_dir = tmp_path / "kernels" / "aioflow-test"
    spec_dir.mkdir(parents=True)
    argv = [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"]
    spec = {"argv": argv, "display_name": "aioflow test", "language": "python"}
    (spec_dir / "kernel.json").write_text(json.dumps(spec))
    monkeypatch.setenv("JUPYTER_PATH", str(tmp_path))  # where kernelspecs are looked up
    cfg = Config()
    cfg.KernelManager.transport = "ipc"
    cfg.KernelManager.ip = str(tmp_path / "kernel-ipc")
    return nbclient.NotebookClient(
        nb,
        kernel_name="aioflow-test",
        config=cfg,
        timeout=40,
        resources={"metadata": {"path": str(EXAMPLES)}},
    )


def test_quickstart_notebook_runs_in_a_real_kernel(tmp_path, monkeypatch):
    nbformat = pytest.importorskip("nbformat")
    pytest.importorskip("nbclient")
    pytest.importorskip("ipykernel")
    nb = nbformat.read(EXAMPLES / "quickstart.ipynb", as_version=4)
    notebook_client(
        nb, tmp_path, monkeypatch
    ).execute()  # raises CellExecutionError on a cell's error
    code = [c for c in nb.cells if c.cell_type == "code"]
    errors = [o for c in code for o in c.outputs if o.output_type == "error"]
    assert not errors

    def text(cell) -> str:  # type: ignore[no-untyped-def]
        parts = []
        for o in cell.outputs:
            parts.append(o.get("text", ""))
            parts.append(o.get("data", {}).get("text/plain", ""))
        return "".join(parts)

    sources = [c.source for c in code]
    sync_cell = code[next(i for i, s in enumerate(sources) if "for batch in pipeline" in s)]
    assert "2048 samples in 32 batches" in text(sync_cell)
    async_cell = code[next(i for i, s in enumerate(sources) if "async for" in s)]
    assert text(async_cell).strip() == str([i * i for i in range(20)])
    collect_cell = code[next(i for i, s in enumerate(sources) if ".collect()" in s)]
    assert text(collect_cell).strip() == "[0, 1, 4, 9, 16]"
    bench_cell = code[next(i for i, s in enumerate(sources) if "af.bench(" in s)]
    assert "batches/s, first after" in text(bench_cell)
    assert any(o.get("name") == "stderr" and "32/32" in o["text"] for o in bench_cell.outputs)
    html_cell = code[sources.index("result.stats")]
    html = html_cell.outputs[0]["data"]["text/html"]
    assert html.startswith("<table>") and "bottleneck" in html and "batch(64)" in html


def test_quickstart_notebook_runs_with_jupyter_nbconvert_execute(tmp_path):
    """`jupyter nbconvert --execute`, the usual way to run a notebook, works (extra `test`)."""
    nbformat = pytest.importorskip("nbformat")
    pytest.importorskip("nbconvert")
    pytest.importorskip("ipykernel")
    out = tmp_path / "executed.ipynb"
    r = subprocess.run(
        [sys.executable, "-m", "jupyter", "nbconvert", "--to", "notebook", "--execute"]
        + [str(EXAMPLES / "quickstart.ipynb"), "--output", str(out)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    assert r.returncode == 0, r.stderr
    nb = nbformat.read(out, as_version=4)
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert code and all(c.execution_count for c in code)  # every cell ran
    assert not [o for c in code for o in c.outputs if o.output_type == "error"]
