"""``list_files(..., cache_dir=, cache_limit=)``: remote shards cached on local disk,
through moto's S3 server (tests/_s3_server.py): downloaded once and ahead of their use,
checked, renamed whole into place, evicted past the limit; a second epoch asks nothing."""

from __future__ import annotations

import json
import os
import threading
import time

import pytest
from _s3_server import BUCKET, upload_dir

import aioflow as af
from aioflow.io import cache as shard_cache


def write_jsonl_shards(d, n: int, rows: int = 2_000) -> list[bytes]:
    out = []
    for s in range(n):
        data = "".join(json.dumps({"s": s, "i": i, "pad": "x" * 20}) + "\n" for i in range(rows))
        (d / f"train-{s:02d}.jsonl").write_bytes(data.encode())
        out.append(data.encode())
    return out


@pytest.fixture
def remote(s3, tmp_path):
    local = tmp_path / "local"
    local.mkdir()
    shards = write_jsonl_shards(local, 6)
    upload_dir(s3, local)
    return s3, local, shards, tmp_path / "cache"


def read(path: str) -> bytes:
    with open(path, "rb") as f:
        return f.read()


def cache_files(d) -> dict[str, int]:
    """name -> size of the files in ``d`` (a download may rename or delete one meanwhile)."""
    out = {}
    for name in os.listdir(d) if d.exists() else []:
        try:
            out[name] = os.stat(d / name).st_size
        except FileNotFoundError:
            pass
    return out


def test_the_second_epoch_reads_the_cache_and_asks_the_server_nothing(remote, no_leaks):
    s3, local, shards, cache = remote
    files = af.list_files(f"s3://{BUCKET}/train-*", cache_dir=cache)
    s3.requests.clear()
    paths = list(files)
    assert all(p.startswith(str(cache)) for p in paths)
    assert [read(p) for p in paths] == shards  # byte for byte
    for s in range(6):
        assert len(s3.gets(f"train-{s:02d}")) == 1  # each shard downloaded once
    want = af.list_files(str(local / "train-*")).flat_map(af.read_jsonl).to_list()
    assert files.flat_map(af.read_jsonl).to_list() == want
    s3.requests.clear()
    assert files.interleave(af.read_jsonl, cycle_length=3).to_list() != []
    assert files.flat_map(af.read_jsonl).to_list() == want
    assert s3.requests == []  # not a GET, not a HEAD
    assert sorted(cache_files(cache).values()) == sorted(len(b) for b in shards)


def test_a_new_run_reads_the_cache_with_the_server_gone(own_s3, tmp_path, no_leaks):
    local = tmp_path / "local"
    local.mkdir()
    write_jsonl_shards(local, 3)
    upload_dir(own_s3, local)
    files = af.list_files(f"s3://{BUCKET}/train-*", cache_dir=tmp_path / "cache").flat_map(
        af.read_jsonl
    )
    first = files.to_list()
    own_s3.stop()
    assert files.to_list() == first  # a new run of the same pipeline: listed once, cached


def test_shards_are_downloaded_ahead_of_their_use(remote, no_leaks):
    s3, _, _, cache = remote
    files = af.list_files(f"s3://{BUCKET}/train-*", cache_dir=cache, cache_ahead=2)
    with files.flat_map(af.read_jsonl).iter() as it:
        assert next(it)["s"] == 0
        deadline = time.monotonic() + 10
        while len(s3.gets("train-")) < 3 and time.monotonic() < deadline:
            time.sleep(0.01)
        # shard 0 is being read; shards 1 and 2 were fetched in the background meanwhile
        assert {r.path.rsplit("/", 1)[1] for r in s3.gets("train-")} >= {
            "train-00.jsonl",
            "train-01.jsonl",
            "train-02.jsonl",
        }


def test_eviction_keeps_the_cache_under_its_limit(s3, tmp_path, no_leaks):
    local = tmp_path / "local"
    local.mkdir()
    shards = write_jsonl_shards(local, 14)
    upload_dir(s3, local)
    size = len(shards[0])
    limit = 12 * size  # room for the pinned ones (PINNED + cache_ahead + 1) and a spare
    assert shard_cache.PINNED + 3 <= 12
    cache = tmp_path / "cache"
    files = af.list_files(f"s3://{BUCKET}/train-*", cache_dir=cache, cache_limit=limit)
    for _ in range(2):
        got = []
        for p in files:
            assert sum(cache_files(cache).values()) <= limit  # downloads in flight included
            got.append(read(p))
        assert got == shards
    # the least recently used went first: some are gone, and no more than needed
    assert 12 - 3 <= len(cache_files(cache)) <= 12


def test_a_download_that_does_not_match_the_listing_is_not_cached(remote, no_leaks):
    """The object changed after it was listed (same size, other bytes): its MD5 is not
    the listed ETag; the error says so and the cache keeps nothing of it."""
    s3, _, shards, cache = remote
    files = af.list_files(f"s3://{BUCKET}/train-03.jsonl", cache_dir=cache)
    c = s3.client()
    changed = bytes(reversed(shards[3]))
    c.put_object(Bucket=BUCKET, Key="train-03.jsonl", Body=changed)
    with pytest.raises(OSError, match=r"train-03\.jsonl.*changed since it was listed"):
        files.to_list()
    assert cache_files(cache) == {}
    c.put_object(Bucket=BUCKET, Key="train-03.jsonl", Body=shards[3])
    (path,) = files.to_list()
    assert read(path) == shards[3]


def test_a_download_cut_midway_leaves_nothing_counted_as_cached(remote, monkeypatch, no_leaks):
    s3, _, shards, cache = remote
    files = af.list_files(f"s3://{BUCKET}/train-0[01].jsonl", cache_dir=cache, cache_ahead=0)
    real_write = shard_cache._write
    calls = 0

    def write_then_die(f, md5, data):
        nonlocal calls
        calls += 1
        real_write(f, md5, data[: len(data) // 2])
        raise OSError(28, "No space left on device")  # the disk filled under the download

    monkeypatch.setattr(shard_cache, "_write", write_then_die)
    with pytest.raises(OSError, match="No space left"):
        files.to_list()
    assert calls == 1 and cache_files(cache) == {}  # not even the temporary file
    monkeypatch.setattr(shard_cache, "_write", real_write)
    s3.requests.clear()
    assert [read(p) for p in files] == shards[:2]
    assert len(s3.gets("train-00")) == 1  # downloaded again, whole


def test_a_temporary_file_left_by_a_killed_process_is_not_taken_for_the_shard(remote, no_leaks):
    s3, _, shards, cache = remote
    files = af.list_files(f"s3://{BUCKET}/train-00.jsonl", cache_dir=cache)
    (path,) = files.to_list()
    # what a process killed mid-download leaves: the first half under a temporary name
    os.remove(path)
    dead = 2**22 + 12345  # above pid_max's default: no such process
    part = cache / f"{os.path.basename(path)}.part-{dead}-0a1b2c3d"
    part.write_bytes(shards[0][: len(shards[0]) // 2])
    s3.requests.clear()
    (again,) = files.to_list()
    assert again == path and read(again) == shards[0]
    assert len(s3.gets("train-00")) == 1  # fetched, not taken from the half file
    assert not part.exists()  # and the half file is gone


def test_cache_arguments_are_checked_when_described(tmp_path):
    for bad in (0, -1, 1.5, True):
        with pytest.raises(af.PipelineError, match="cache_limit"):
            af.list_files(str(tmp_path), cache_dir=tmp_path, cache_limit=bad)
    with pytest.raises(af.PipelineError, match="cache_ahead"):
        af.list_files(str(tmp_path), cache_dir=tmp_path, cache_ahead=-1)
    with pytest.raises(af.PipelineError, match="cache_limit needs a cache_dir"):
        af.list_files(str(tmp_path), cache_limit=10)


def test_local_files_are_listed_as_they_are_with_a_cache_dir(tmp_path):
    (tmp_path / "a.txt").write_text("a\n")
    files = af.list_files(str(tmp_path / "*.txt"), cache_dir=tmp_path / "cache")
    assert list(files) == [str(tmp_path / "a.txt")]
    assert not (tmp_path / "cache").exists()


def test_two_runs_of_one_process_share_the_cache_without_losing_a_download(s3, tmp_path):
    """A run opening the cache leaves the downloads in flight of another run alone."""
    local = tmp_path / "local"
    local.mkdir()
    shards = write_jsonl_shards(local, 6, rows=20_000)
    upload_dir(s3, local)
    files = af.list_files(f"s3://{BUCKET}/train-*", cache_dir=tmp_path / "cache", cache_ahead=5)
    started = threading.Event()

    def slow(req):  # the other shards' downloads are in flight when the second run opens
        if req.method == "GET" and "train-00" not in req.path and req.path.count("/") >= 2:
            started.set()
            time.sleep(1.0)

    s3.hold = slow
    with files.iter() as one:
        first = next(one)  # the other five download in the background
        assert started.wait(10)
        with files.iter() as two:
            second = next(two)  # this run opened the cache while those were in flight
            assert [read(p) for p in [first, *one]] == shards
            assert [read(p) for p in [second, *two]] == shards


def test_closing_while_downloads_open_their_files_leaves_none_open(remote, monkeypatch, no_leaks):
    """Closed while the downloads ahead still open their temporary files in a thread (CI
    saw an unclosed ``.part`` file at exit): the close waits for each open, closes the
    file and removes it, so nothing is left open or on disk."""
    _, _, _, cache = remote
    opened: list = []

    def slow_open(path, mode):
        time.sleep(0.2)  # the close comes while this runs
        f = open(path, mode)  # noqa: SIM115 (the code under test closes it)
        opened.append(f)
        return f

    monkeypatch.setattr(shard_cache, "open", slow_open, raising=False)
    files = af.list_files(f"s3://{BUCKET}/train-*", cache_dir=cache, cache_ahead=2)
    with files.iter() as it:
        next(it)  # shard 0 is here; the opens of shards 1 and 2 have just started
    assert opened and all(f.closed for f in opened), "an open ran on after the close"
    assert not any(".part-" in name for name in cache_files(cache))
