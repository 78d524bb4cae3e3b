"""Pipeline.cache: in memory and in a file (interrupted epochs, other processes, races)."""

from __future__ import annotations

import asyncio
import logging
import os
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest

import aioflow as af
from aioflow.ops.cache import trusted_count


class Counter:
    def __init__(self) -> None:
        self.calls = 0

    def __call__(self, x):
        self.calls += 1
        return x


def items(n: int = 300) -> list[object]:
    rng = np.random.default_rng(0)
    return [
        {
            "id": i,
            "x": rng.standard_normal((2, 3)).astype(np.float32),
            "meta": {"tags": ["a", i], "mask": np.array([i % 2 == 0, True]), "t": (i, "s")},
            "raw": bytes([i % 256]),
        }
        for i in range(n)
    ]


def assert_same(got: list[object], want: list[object]) -> None:
    assert len(got) == len(want)
    for g, w in zip(got, want, strict=True):
        assert g.keys() == w.keys()
        assert g["id"] == w["id"] and g["raw"] == w["raw"]
        for a, b in ((g["x"], w["x"]), (g["meta"]["mask"], w["meta"]["mask"])):
            assert a.dtype == b.dtype and a.shape == b.shape and np.array_equal(a, b)
        assert g["meta"]["tags"] == w["meta"]["tags"] and g["meta"]["t"] == w["meta"]["t"]


# -- memory -----------------------------------------------------------------------------
def test_memory_cache_replays_the_first_epoch_without_running_the_upstream():
    c = Counter()
    p = af.range(1000).map(c).cache()
    assert p.to_list() == list(range(1000))
    assert p.to_list() == list(range(1000))
    assert c.calls == 1000
    assert len(p) == 1000  # cardinality passes through
    assert p.map(lambda x: x + 1).take(3).to_list() == [1, 2, 3]
    assert c.calls == 1000


def test_memory_cache_records_nothing_from_an_epoch_cut_short():
    c = Counter()
    p = af.range(1000).map(c).cache()
    for x in p:
        if x == 10:
            break
    assert p.take(5).to_list() == [0, 1, 2, 3, 4]
    assert p.to_list() == list(range(1000))  # the first complete epoch
    before = c.calls
    assert p.to_list() == list(range(1000))
    assert c.calls == before


def test_memory_cache_records_nothing_from_an_epoch_that_failed():
    state = {"fail": True}

    def maybe_fail(x):
        if x == 50 and state["fail"]:
            raise KeyError("boom")
        return x

    p = af.range(100).map(maybe_fail).cache()
    with pytest.raises(KeyError):
        p.to_list()
    state["fail"] = False
    assert p.to_list() == list(range(100))


async def test_memory_cache_under_async_for():
    c = Counter()
    p = af.range(10).map(c).cache().repeat(3)
    assert [x async for x in p] == list(range(10)) * 3
    assert c.calls == 10


# -- file -------------------------------------------------------------------------------
def test_file_cache_round_trips_arrays_and_nested_dicts_exactly(tmp_path):
    path = tmp_path / "c.cache"
    c = Counter()
    want = items()
    p = af.from_iterable(want).map(c).cache(path)
    assert_same(p.to_list(), want)
    assert path.exists() and trusted_count(str(path)) == len(want)
    assert_same(p.to_list(), want)
    assert c.calls == len(want)
    assert len(p) == len(want)
    assert os.listdir(tmp_path) == ["c.cache"]  # no temporary file left


def test_file_cache_of_an_empty_pipeline(tmp_path):
    p = af.range(0).cache(tmp_path / "e.cache")
    assert p.to_list() == []
    assert p.to_list() == []
    assert trusted_count(str(tmp_path / "e.cache")) == 0


@pytest.mark.parametrize("how", ["break", "error"])
def test_an_interrupted_first_epoch_leaves_no_cache(tmp_path, how, no_leaks):
    path = tmp_path / "c.cache"
    state = {"fail": how == "error"}

    def maybe_fail(x):
        if x == 700 and state["fail"]:
            raise RuntimeError("upstream broke")
        return x

    # (the cache runs ahead of the consumer by a channel or two: break well before the end)
    p = af.range(100_000).map(maybe_fail).cache(path)
    if how == "break":
        for x in p:
            if x == 700:
                break
    else:
        with pytest.raises(RuntimeError):
            p.to_list()
    assert os.listdir(tmp_path) == []  # neither a cache nor a temporary file
    state["fail"] = False
    assert p.to_list() == list(range(100_000))
    assert trusted_count(str(path)) == 100_000


def test_a_new_process_reads_the_cache_without_running_the_upstream(tmp_path):
    path = tmp_path / "c.cache"
    want = items(50)
    af.from_iterable(want).cache(path).to_list()
    code = textwrap.dedent(
        f"""
        import pickle, sys
        import aioflow as af

        def never(x):
            raise AssertionError("the upstream ran")

        got = af.from_iterable(range(50)).map(never).cache({str(path)!r}).to_list()
        sys.stdout.buffer.write(pickle.dumps(got))
        """
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, timeout=50, check=True)
    import pickle

    assert_same(pickle.loads(out.stdout), want)


def test_two_processes_writing_the_same_cache_at_once_leave_one_complete_file(tmp_path):
    path = tmp_path / "c.cache"
    code = textwrap.dedent(
        f"""
        import time
        import aioflow as af

        def slow(x):
            time.sleep(0.001)
            return {{"x": x, "sq": x * x}}

        got = af.range(400).map(slow).cache({str(path)!r}).to_list()
        assert got == [{{"x": x, "sq": x * x}} for x in range(400)], got[:3]
        """
    )
    procs = [subprocess.Popen([sys.executable, "-c", code]) for _ in range(2)]
    assert [p.wait(timeout=50) for p in procs] == [0, 0]
    assert os.listdir(tmp_path) == ["c.cache"]
    assert trusted_count(str(path)) == 400
    got = af.range(400).map(lambda x: 1 / 0).cache(path).to_list()
    assert got == [{"x": x, "sq": x * x} for x in range(400)]


async def test_two_runs_in_one_loop_writing_the_same_cache_at_once(tmp_path):
    path = tmp_path / "c.cache"

    async def slow(x):
        await asyncio.sleep(0.0005)
        return x

    p = af.range(300).map(slow).cache(path)
    a, b = await asyncio.gather(p.collect(), p.collect())
    assert a == b == list(range(300))
    assert os.listdir(tmp_path) == ["c.cache"]
    assert await p.collect() == list(range(300))


def test_an_incomplete_file_at_the_path_is_not_trusted_but_rebuilt(tmp_path, caplog):
    path = tmp_path / "c.cache"
    af.range(100).cache(path).to_list()
    raw = path.read_bytes()
    path.write_bytes(raw[: len(raw) // 2])  # e.g. a copy that was cut short
    c = Counter()
    with caplog.at_level(logging.WARNING, logger="aioflow"):
        assert af.range(100).map(c).cache(path).to_list() == list(range(100))
    assert c.calls == 100
    assert "incomplete" in caplog.text
    assert trusted_count(str(path)) == 100


def test_cache_path_is_checked_when_described(tmp_path):
    with pytest.raises(af.PipelineError):
        af.range(3).cache(b"x")  # type: ignore[arg-type]
    with pytest.raises(af.PipelineError):
        af.range(3).cache("s3://bucket/c.cache")
    assert af.range(3).cache("").to_list() == [0, 1, 2]  # "" is memory, as in tf.data


def test_file_cache_second_epoch_is_not_slower_than_the_first(tmp_path):
    # a smoke check of the replay path only (timing lives in bench/): reading must work
    p = af.range(20_000).map(lambda x: (x, str(x))).cache(tmp_path / "c.cache")
    t0 = time.perf_counter()
    first = p.to_list()
    t1 = time.perf_counter()
    second = p.to_list()
    assert first == second and t1 - t0 > 0


def test_an_item_that_cannot_be_pickled_fails_the_epoch_and_leaves_no_file(tmp_path):
    path = tmp_path / "sub" / "dir" / "c.cache"  # missing directories are made
    p = af.range(5).map(lambda x: (lambda: x) if x == 3 else x).cache(path)
    got = []
    with pytest.raises(af.PipelineError, match="item 3 cannot be pickled"):
        for x in p:
            got.append(x)
    assert got == [0, 1, 2]
    assert os.listdir(tmp_path / "sub" / "dir") == []
    assert af.range(5).cache(path).to_list() == [0, 1, 2, 3, 4]
    assert trusted_count(str(path)) == 5


# -- a file cache that cannot be written, or is damaged ---------------------------------
def test_a_commit_that_fails_leaves_no_temporary_file_and_says_which_cache(tmp_path, monkeypatch):
    import errno

    import aioflow.ops.cache

    def full(fd: int) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    path = tmp_path / "c.cache"
    monkeypatch.setattr(aioflow.ops.cache.os, "fsync", full)
    with pytest.raises(af.StageError, match=r"c\.cache") as info:
        af.range(100).cache(path).to_list()
    assert isinstance(info.value.__cause__, OSError) and "No space" in str(info.value)
    assert os.listdir(tmp_path) == []
    monkeypatch.undo()
    assert af.range(100).cache(path).to_list() == list(range(100))
    assert trusted_count(str(path)) == 100


def test_a_cache_path_that_is_a_directory_is_refused_before_the_upstream_runs(tmp_path, caplog):
    path = tmp_path / "c.cache"
    path.mkdir()
    c = Counter()
    p = af.range(10).map(c).cache(path)
    for _ in range(2):
        with (
            caplog.at_level(logging.WARNING, logger="aioflow"),
            pytest.raises(af.PipelineError, match="is a directory"),
        ):
            p.to_list()
    assert c.calls == 0 and "incomplete" not in caplog.text
    assert os.listdir(tmp_path) == ["c.cache"] and os.listdir(path) == []


def _flip(path, at: int) -> None:
    raw = bytearray(path.read_bytes())
    raw[at] ^= 0x10
    path.write_bytes(bytes(raw))


@pytest.mark.parametrize("where", [0.3, 0.6, 0.9])
def test_flipped_bytes_in_a_cache_file_are_detected_named_and_rebuilt(tmp_path, where):
    path = tmp_path / "c.cache"
    want = [{"i": i, "x": np.full(50, i, dtype=np.int64)} for i in range(3000)]  # > 1 MiB
    af.from_iterable(want).cache(path).to_list()
    assert path.stat().st_size > 1 << 20
    _flip(path, int(path.stat().st_size * where))
    c = Counter()
    p = af.from_iterable(want).map(c).cache(path)
    with pytest.raises(af.BadInput, match="corrupt") as info:
        p.to_list()
    assert info.value.path == str(path) and str(path) in str(info.value)
    got = p.to_list()  # the next epoch rebuilds it from the upstream
    assert c.calls == len(want)
    assert [g["i"] for g in got] == list(range(3000))
    assert all(np.array_equal(g["x"], w["x"]) for g, w in zip(got, want, strict=True))
    assert trusted_count(str(path)) == 3000 and os.listdir(tmp_path) == ["c.cache"]


def test_a_wrong_item_count_in_the_trailer_is_detected(tmp_path):
    path = tmp_path / "c.cache"
    af.range(10).cache(path).to_list()
    raw = bytearray(path.read_bytes())
    raw[-25] ^= 0x01  # the count: 10 -> 11
    path.write_bytes(bytes(raw))
    assert trusted_count(str(path)) == 11
    with pytest.raises(af.BadInput, match="corrupt") as info:
        af.range(10).cache(path).to_list()
    assert info.value.path == str(path)
    assert af.range(10).cache(path).to_list() == list(range(10))


@pytest.mark.parametrize(
    "damage",
    ["magic", "short", "end-marker", "end-zero", "empty"],
)
def test_a_file_without_the_right_magic_or_trailer_is_not_trusted_but_rebuilt(tmp_path, damage):
    path = tmp_path / "c.cache"
    af.range(50).cache(path).to_list()
    raw = bytearray(path.read_bytes())
    if damage == "magic":
        raw[3] ^= 0x01
    elif damage == "short":
        raw = raw[:20]
    elif damage == "end-marker":
        raw[-1] ^= 0x01  # the frame-end zero still there, the marker wrong
    elif damage == "end-zero":
        raw[-33] = 1  # the marker right, the zero before the count not
    else:
        raw = bytearray()
    path.write_bytes(bytes(raw))
    assert trusted_count(str(path)) is None
    c = Counter()
    assert af.range(50).map(c).cache(path).to_list() == list(range(50))
    assert c.calls == 50 and trusted_count(str(path)) == 50
