"""Reading URLs through fsspec (extra ``remote``): a local HTTP server, and memory://."""

from __future__ import annotations

import asyncio
import io
import json
import tarfile

import numpy as np
import pytest
from _io_helpers import assert_fds_back_to, http_server, open_fds

import aioflow as af

fsspec = pytest.importorskip("fsspec")
pytest.importorskip("aiohttp")


@pytest.fixture
def served(tmp_path):
    (tmp_path / "lines.txt").write_text("".join(f"line {i}\n" for i in range(50_000)))
    (tmp_path / "a.jsonl").write_text("\n".join(json.dumps({"i": i}) for i in range(100)))
    np.save(tmp_path / "a.npy", np.arange(12, dtype=np.int16).reshape(3, 4))
    with tarfile.open(tmp_path / "a.tar", "w") as tf:
        for name, data in [("k.txt", b"t"), ("k.cls", b"1")]:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tf.addfile(info, io.BytesIO(data))
    for i in range(20):
        (tmp_path / f"part-{i:02d}.txt").write_text(f"{i}\n")
    with http_server(tmp_path) as url:
        yield tmp_path, url


def test_readers_read_http_urls_like_local_files(served):
    d, url = served
    assert af.read_lines(f"{url}/lines.txt").to_list() == af.read_lines(d / "lines.txt").to_list()
    assert af.read_jsonl(f"{url}/a.jsonl").to_list() == [{"i": i} for i in range(100)]
    assert af.read_bytes(f"{url}/a.jsonl").to_list() == [(d / "a.jsonl").read_bytes()]
    (arr,) = af.read_npy(f"{url}/a.npy").to_list()
    assert arr.dtype == np.int16 and arr.tolist() == np.load(d / "a.npy").tolist()
    assert af.read_tar(f"{url}/a.tar").to_list() == [{"__key__": "k", "txt": b"t", "cls": b"1"}]


def test_many_urls_through_flat_map_share_one_session_that_is_closed(served, no_leaks):
    _, url = served
    urls = [f"{url}/part-{i:02d}.txt" for i in range(20)]
    before = open_fds()
    p = af.from_iterable(urls).flat_map(af.read_lines).map(int)
    assert p.to_list() == list(range(20))
    assert p.to_list() == list(range(20))
    assert_fds_back_to(before, served[0])  # no socket left open by the runs' HTTP sessions


async def test_break_over_http_on_the_callers_loop_closes_the_connection(served):
    _, url = served
    # one complete read first: uvloop opens a descriptor of its own per loop on first connect
    assert len(await af.read_bytes(f"{url}/a.jsonl").collect()) == 1
    before = open_fds()
    async with af.read_lines(f"{url}/lines.txt").aiter() as it:
        async for s in it:
            if s == "line 10":
                break
    for _ in range(200):  # a closed connection's socket closes on a later loop iteration
        if open_fds() <= before:
            break
        await asyncio.sleep(0.01)
    assert open_fds() <= before


def test_a_missing_url_raises_file_not_found_naming_it(served):
    _, url = served
    with pytest.raises(FileNotFoundError, match=r"nope\.txt"):
        af.read_lines(f"{url}/nope.txt").to_list()


def test_list_files_and_readers_on_memory_urls():
    fs = fsspec.filesystem("memory")
    for i in range(3):
        fs.pipe(f"/aioflow-test/d/{i}.txt", f"a{i}\nb{i}\n".encode())
    fs.pipe("/aioflow-test/d/sub/x.txt", b"deep\n")
    try:
        files = af.list_files("memory://aioflow-test/d/*.txt")
        assert [f.rsplit("/", 1)[1] for f in files] == ["0.txt", "1.txt", "2.txt"]
        assert files.flat_map(af.read_lines).to_list() == ["a0", "b0", "a1", "b1", "a2", "b2"]
        deep = af.list_files("memory://aioflow-test/**/x.txt").flat_map(af.read_lines)
        assert deep.to_list() == ["deep"]
        with pytest.raises(FileNotFoundError, match="nothing"):
            af.list_files("memory://aioflow-test/nothing*")
        with pytest.raises(FileNotFoundError):
            af.read_bytes("memory://aioflow-test/missing.bin").to_list()
    finally:
        fs.rm("/aioflow-test", recursive=True)


def test_read_parquet_on_a_memory_url():
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    buf = io.BytesIO()
    pq.write_table(pa.table({"x": [1, 2, 3]}), buf)
    fs = fsspec.filesystem("memory")
    fs.pipe("/aioflow-test-pq/t.parquet", buf.getvalue())
    try:
        assert af.read_parquet("memory://aioflow-test-pq/t.parquet").to_list() == [
            {"x": 1},
            {"x": 2},
            {"x": 3},
        ]
    finally:
        fs.rm("/aioflow-test-pq", recursive=True)


@pytest.mark.parametrize("status", [500, 503, 403])
def test_an_http_error_other_than_404_is_reported_as_such_not_as_missing(served, status):
    _, url = served
    for read in (af.read_lines, af.read_bytes):
        with pytest.raises(OSError, match=f"HTTP {status}") as info:
            read(f"{url}/status/{status}/lines.txt").to_list()
        assert not isinstance(info.value, FileNotFoundError)
        assert f"status/{status}/lines.txt" in str(info.value)
    with pytest.raises(FileNotFoundError, match="No such file"):
        af.read_lines(f"{url}/status/404/lines.txt").to_list()
