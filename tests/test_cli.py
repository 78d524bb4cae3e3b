"""python -m aioflow bench / demo, run in a subprocess: they print what they promise."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def aioflow_cli(*args: str, cwd: Path, timeout: float = 50) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "aioflow", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def assert_png(path: Path) -> None:
    data = path.read_bytes()
    assert data[:8] == PNG_SIGNATURE
    assert len(data) > 10_000  # matplotlib drew bars and text, not an empty canvas


def test_bench_of_a_function_in_a_dotted_module_prints_the_table_and_rate(tmp_path):
    pkg = tmp_path / "mydata"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "pipelines.py").write_text(
        textwrap.dedent(
            """
            import time
            import aioflow as af

            def slow(x):
                time.sleep(0.001)
                return x

            def train():
                return af.range(400).map(slow, executor="thread", concurrency=2).batch(8)
            """
        )
    )
    r = aioflow_cli("bench", "mydata.pipelines:train", "--no-progress", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    out = r.stdout
    assert "* map(slow)" in out  # the table marks the slow stage
    assert "bottleneck: map(slow): busy" in out
    last = out.strip().splitlines()[-1]
    # the pipeline ends in batch(8): what it yields, and counts, are batches
    assert last.startswith("50 batches in ") and "batches/s" in last and "first batch after" in last
    assert r.stderr == ""


def test_bench_of_a_pipeline_in_a_file_with_limits_progress_and_plot(tmp_path):
    script = tmp_path / "pipe.py"
    script.write_text(
        "import aioflow as af\n"
        "p = af.range(10**6).map(lambda x: x * 2, executor='process', concurrency=2)\n"
    )
    plot = tmp_path / "out.png"
    r = aioflow_cli(
        "bench",
        f"{script}:p",
        "--items",
        "300",
        "--warmup",
        "20",
        "--plot",
        str(plot),
        cwd=tmp_path,
    )
    assert r.returncode == 0, r.stderr
    assert "300 items in " in r.stdout and "items/s" in r.stdout
    assert "map(<lambda>)" in r.stdout
    assert f"wrote {plot}" in r.stdout
    assert "it/s" in r.stderr  # the progress bar
    assert_png(plot)


def test_bench_seconds_limit(tmp_path):
    (tmp_path / "forever.py").write_text("import aioflow as af\np = af.range(5).repeat()\n")
    r = aioflow_cli("bench", "forever:p", "--seconds", "0.3", "--no-progress", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert "items/s" in r.stdout


@pytest.mark.parametrize(
    ("target", "message"),
    [
        ("nosuchmodule:p", "no module named 'nosuchmodule'"),
        ("good:nothing", "has no attribute 'nothing'"),
        ("good:number", "is of type int, not a Pipeline"),
        ("good", "expected MODULE:ATTR"),
        ("missing.py:p", "no such file"),
        ("good:forever", "infinite"),
    ],
)
def test_bench_of_a_bad_target_exits_2_with_a_message(tmp_path, target, message):
    (tmp_path / "good.py").write_text(
        "import aioflow as af\nnumber = 3\nforever = af.range(2).repeat()\n"
    )
    r = aioflow_cli("bench", target, "--no-progress", cwd=tmp_path)
    assert r.returncode == 2
    assert message in r.stderr
    assert "Traceback" not in r.stderr


def test_demo_prints_the_stats_table_and_images_per_second_and_plots(tmp_path):
    plot = tmp_path / "demo.png"
    r = aioflow_cli("demo", "--items", "300", "--plot", str(plot), cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    out = r.stdout
    assert "wrote 300 images" in out
    for stage in (
        "list_files",
        "interleave(_read_pair)",
        "map(read_sample)",
        "shuffle(256)",
        "batch(64)",
        "prefetch(4)",
    ):
        assert stage in out
    assert "bottleneck: " in out
    assert "300 images in 5 batches" in out and "images/s" in out
    assert "img/s" in r.stderr  # the progress bar
    assert_png(plot)


def test_help_lists_both_commands(tmp_path):
    r = aioflow_cli("--help", cwd=tmp_path)
    assert r.returncode == 0
    assert "demo" in r.stdout and "bench" in r.stdout


@pytest.mark.parametrize("command", [(), ("demo",), ("bench",)])
def test_help_is_plain_text_without_restructuredtext_markup(tmp_path, command):
    r = aioflow_cli(*command, "--help", cwd=tmp_path)
    assert r.returncode == 0
    assert "usage: python -m aioflow" in r.stdout
    assert "``" not in r.stdout and ":func:" not in r.stdout


def test_bench_of_unbatched_items_says_items(tmp_path):
    (tmp_path / "flat.py").write_text("import aioflow as af\np = af.range(300).prefetch(2)\n")
    r = aioflow_cli("bench", "flat:p", "--no-progress", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip().splitlines()[-1].startswith("300 items in ")


def test_bench_writes_the_run_as_a_trace(tmp_path):
    import json

    (tmp_path / "pipe.py").write_text(
        "import aioflow as af\np = af.range(2000).map(lambda x: x * 2).batch(10).prefetch(2)\n"
    )
    trace = tmp_path / "run.json"
    r = aioflow_cli("bench", "pipe:p", "--no-progress", "--trace", str(trace), cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert f"wrote {trace}" in r.stdout
    events = json.loads(trace.read_text())["traceEvents"]
    tracks = {e["args"]["name"] for e in events if e["name"] == "thread_name"}
    assert {"range", "map(<lambda>)", "batch(10)", "prefetch(2)", "consumer"} <= tracks
