"""list_files, read_lines, read_jsonl, read_bytes on files the tests write."""

from __future__ import annotations

import gzip
import json
import logging
import os
import random
import zlib
from pathlib import Path

import pytest
from _io_helpers import assert_fds_back_to, open_fds

import aioflow as af


def write(path: Path, data: bytes | str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(data, str):
        data = data.encode()
    path.write_bytes(data)
    return path


# -- list_files -------------------------------------------------------------------------
def test_list_files_sorts_the_matches_of_several_patterns_and_lists_each_once(tmp_path):
    for name in ["b.txt", "a.txt", "c.json", "d.txt"]:
        write(tmp_path / name, "x")
    (tmp_path / "dir.txt").mkdir()  # a directory that matches is not a file
    p = af.list_files([str(tmp_path / "*.txt"), str(tmp_path / "a.*"), tmp_path / "c.json"])
    want = [str(tmp_path / n) for n in ["a.txt", "b.txt", "c.json", "d.txt"]]
    assert p.to_list() == want
    assert len(p) == 4
    assert p.to_list() == want  # a second epoch is the same


def test_list_files_double_star_matches_recursively(tmp_path):
    for rel in ["top.npy", "a/one.npy", "a/b/two.npy", "a/b/skip.txt"]:
        write(tmp_path / rel, "x")
    got = af.list_files(str(tmp_path / "**" / "*.npy")).to_list()
    assert [os.path.relpath(p, tmp_path) for p in got] == ["a/b/two.npy", "a/one.npy", "top.npy"]


def test_list_files_pattern_matching_nothing_raises_file_not_found_naming_it(tmp_path):
    write(tmp_path / "a.txt", "x")
    missing = str(tmp_path / "*.parquet")
    with pytest.raises(FileNotFoundError) as info:
        af.list_files([str(tmp_path / "*.txt"), missing])
    assert info.value.filename == missing
    assert missing in str(info.value)


def test_list_files_seeded_shuffle_is_reproducible_and_reshuffles_each_epoch(tmp_path):
    for i in range(30):
        write(tmp_path / f"{i:02d}.txt", "x")
    pattern = str(tmp_path / "*.txt")

    def two_epochs(seed):
        p = af.list_files(pattern, shuffle=True, seed=seed)
        return p.to_list(), p.to_list()

    e1, e2 = two_epochs(7)
    assert sorted(e1) == sorted(e2) == af.list_files(pattern).to_list()
    assert e1 != e2  # reshuffled each epoch
    assert two_epochs(7) == (e1, e2)  # same seed, same sequence of orders
    assert two_epochs(8)[0] != e1


# -- read_lines -------------------------------------------------------------------------
def test_read_lines_across_block_boundaries_matches_tf_text_line_semantics(tmp_path):
    rng = random.Random(0)
    lines = []
    for i in range(40_000):
        n = rng.choice([0, 1, 5, 40, 300])
        lines.append("".join(rng.choice("abcé€\t ") for _ in range(n)) + str(i))
    # \r\n and \n line ends, multi-byte characters straddling 64 KiB/1 MiB block edges
    data = "".join(s + ("\r\n" if i % 3 == 0 else "\n") for i, s in enumerate(lines))
    path = write(tmp_path / "big.txt", data + "no newline at the end")
    assert path.stat().st_size > 3 * 1024 * 1024
    assert af.read_lines(path).to_list() == [*lines, "no newline at the end"]


def test_read_lines_keeps_blank_lines_and_an_empty_file_has_none(tmp_path):
    assert af.read_lines(write(tmp_path / "e.txt", "")).to_list() == []
    assert af.read_lines(write(tmp_path / "b.txt", "\n\na\n\n")).to_list() == ["", "", "a", ""]
    assert af.read_lines(write(tmp_path / "one.txt", "x")).to_list() == ["x"]


def test_read_lines_a_second_iteration_reads_the_same_epoch(tmp_path):
    p = af.read_lines(write(tmp_path / "a.txt", "1\n2\n3\n")).map(int)
    assert p.to_list() == [1, 2, 3]
    assert p.to_list() == [1, 2, 3]


async def test_read_lines_under_async_for_on_the_callers_loop(tmp_path):
    path = write(tmp_path / "a.txt", "".join(f"{i}\n" for i in range(1000)))
    got = [int(s) async for s in af.read_lines(path)]
    assert got == list(range(1000))


def test_read_lines_undecodable_line_raises_naming_file_and_line_after_the_good_ones(tmp_path):
    path = write(tmp_path / "a.txt", b"ok\nfine\n\xff\xfe bad\nafter\n")
    got = []
    with pytest.raises(af.BadInput) as info:
        for s in af.read_lines(path):
            got.append(s)
    assert got == ["ok", "fine"]
    assert f"{path}:3" in str(info.value)
    assert info.value.line == 3 and info.value.path == str(path)
    assert isinstance(info.value.__cause__, UnicodeDecodeError)
    assert af.read_lines(path, on_error="skip").to_list() == ["ok", "fine", "after"]


# -- read_jsonl -------------------------------------------------------------------------
def test_read_jsonl_parses_every_line_and_skips_blank_ones(tmp_path):
    objs = [{"i": i, "tags": ["a"] * (i % 3), "v": i / 7} for i in range(5000)]
    text = "\n".join(json.dumps(o) + ("\n   " if i % 100 == 0 else "") for i, o in enumerate(objs))
    path = write(tmp_path / "a.jsonl", text + "\n\n")
    assert af.read_jsonl(path).to_list() == objs


def test_read_jsonl_malformed_line_raises_bad_input_naming_file_and_line(tmp_path):
    path = write(tmp_path / "a.jsonl", '{"a": 1}\n\n{"a": 2}\n{"a": \n{"a": 4}\n')
    got = []
    with pytest.raises(ValueError) as info:  # a ValueError, as json's own error is
        for x in af.read_jsonl(path):
            got.append(x)
    err = info.value
    assert isinstance(err, af.BadInput) and isinstance(err, af.AioflowError)
    assert got == [{"a": 1}, {"a": 2}]  # everything before the bad line arrived first
    assert err.line == 4 and f"{path}:4" in str(err)
    assert isinstance(err.__cause__, json.JSONDecodeError)


def test_read_jsonl_skip_counts_logs_once_and_keeps_every_good_line(tmp_path, caplog):
    lines = [json.dumps({"i": i}) if i % 10 else "{broken" for i in range(1, 101)]
    path = write(tmp_path / "a.jsonl", "\n".join(lines))
    with (
        caplog.at_level(logging.WARNING, logger="aioflow"),
        af.read_jsonl(path, on_error="skip").iter() as it,
    ):
        got = list(it)
        stats = it.stats()
    assert got == [{"i": i} for i in range(1, 101) if i % 10]
    assert stats["read_jsonl"].errors_skipped == 10
    warnings = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warnings) == 1
    assert f"{path}:10" in warnings[0].getMessage()


def test_read_jsonl_int_on_error_raises_after_max_failures(tmp_path):
    path = write(tmp_path / "a.jsonl", "1\nx\n2\ny\n3\nz\n4\n")
    with pytest.raises(af.BadInput) as info:
        af.read_jsonl(path, on_error=2).to_list()
    assert info.value.line == 6
    assert af.read_jsonl(path, on_error=3).to_list() == [1, 2, 3, 4]


# -- read_bytes and what all readers share ----------------------------------------------
def test_read_bytes_gives_the_whole_file_as_one_item(tmp_path):
    blob = os.urandom(3 * 1024 * 1024 + 17)
    p = af.read_bytes(write(tmp_path / "a.bin", blob))
    assert len(p) == 1
    assert p.to_list() == [blob]
    assert af.read_bytes(write(tmp_path / "empty", b"")).to_list() == [b""]


def test_flat_map_over_list_files_reads_every_file_in_order(tmp_path):
    for i in range(50):
        write(tmp_path / f"{i:02d}.txt", f"{i}a\n{i}b\n")
    got = af.list_files(str(tmp_path / "*.txt")).flat_map(af.read_lines).to_list()
    assert got == [f"{i}{c}" for i in range(50) for c in "ab"]


READERS = [af.read_lines, af.read_jsonl, af.read_bytes, af.read_npy, af.read_tfrecord, af.read_tar]


@pytest.mark.parametrize("read", READERS, ids=lambda f: f.__name__)
def test_a_missing_file_raises_file_not_found_naming_it(tmp_path, read):
    path = tmp_path / "nope" / "missing.dat"
    before = open_fds()
    with pytest.raises(FileNotFoundError) as info:
        read(path).to_list()
    assert str(path) in str(info.value)
    assert_fds_back_to(before, tmp_path)


@pytest.mark.parametrize("read", [af.read_lines, af.read_jsonl], ids=lambda f: f.__name__)
def test_break_and_errors_leave_no_file_open(tmp_path, read, no_leaks):
    path = write(tmp_path / "a.jsonl", "".join(f"{i}\n" for i in range(200_000)) + "{bad\n")
    before = open_fds()
    for x in read(path):
        if x in (5, "5"):
            break
    assert_fds_back_to(before, tmp_path)
    with af.read_jsonl(path).iter() as it:
        next(it)
    assert_fds_back_to(before, tmp_path)
    with pytest.raises(af.BadInput):
        af.read_jsonl(path).to_list()
    assert_fds_back_to(before, tmp_path)


def test_reader_arguments_are_checked_when_described(tmp_path):
    with pytest.raises(af.PipelineError):
        af.read_lines(b"bytes/path")  # type: ignore[arg-type]
    with pytest.raises(af.PipelineError):
        af.read_jsonl(tmp_path / "a", on_error="ignore")
    with pytest.raises(af.PipelineError):
        af.read_lines(tmp_path / "a", encoding="utf-16")


# -- compressed files -------------------------------------------------------------------
def test_compressed_text_is_read_as_a_stream_gzip_members_and_zlib(tmp_path):
    lines = [f"line {i} " + "x" * (i % 50) for i in range(30_000)]
    text = "".join(s + "\n" for s in lines).encode()
    half = len(text) // 2
    cut = text.rindex(b"\n", 0, half) + 1
    gz = tmp_path / "a.txt.gz"
    gz.write_bytes(gzip.compress(text[:cut]) + gzip.compress(text[cut:]))  # two members
    assert af.read_lines(gz, compression_type="GZIP").to_list() == lines
    zl = tmp_path / "a.jsonl.z"
    zl.write_bytes(zlib.compress(b"".join(json.dumps(s).encode() + b"\n" for s in lines)))
    assert af.read_jsonl(zl, compression_type="zlib").to_list() == lines


def test_truncated_or_corrupt_compressed_text_is_bad_input(tmp_path, no_leaks):
    data = gzip.compress(b"".join(b"%d\n" % i for i in range(100_000)))
    path = tmp_path / "a.gz"
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(af.BadInput, match="truncated compressed stream") as info:
        af.read_lines(path, compression_type="GZIP").to_list()
    assert info.value.path == str(path) and info.value.stage == "read_lines"
    path.write_bytes(data[:100] + b"\xff" * 50 + data[150:])
    with pytest.raises(af.BadInput, match="corrupt compressed data"):
        af.read_lines(path, compression_type="GZIP").to_list()
    with pytest.raises(af.PipelineError):
        af.read_lines(path, compression_type="BZIP2")


def test_readers_of_many_files_in_one_stage_share_the_failure_count_and_log_once(tmp_path, caplog):
    for i in range(3):
        write(tmp_path / f"{i}.jsonl", f"{i}\n{{bad\n{i + 10}\n")
    files = af.list_files(str(tmp_path / "*.jsonl"))
    with caplog.at_level(logging.WARNING, logger="aioflow"):
        p = files.flat_map(lambda f: af.read_jsonl(f, on_error="skip"))
        with p.iter() as it:
            assert list(it) == [0, 10, 1, 11, 2, 12]
            assert sum(s.errors_skipped for s in it.stats()) == 3
    assert len([r for r in caplog.records if r.levelno >= logging.WARNING]) == 1
    with pytest.raises(af.BadInput) as info:
        files.flat_map(lambda f: af.read_jsonl(f, on_error=2)).to_list()
    assert info.value.path == str(tmp_path / "2.jsonl")


def test_bad_input_pickles_with_its_fields():
    import pickle

    e = af.BadInput("a.jsonl:3: malformed", path="a.jsonl", line=3, stage="read_jsonl")
    f = pickle.loads(pickle.dumps(e))
    assert (str(f), f.path, f.line, f.offset, f.stage) == (str(e), "a.jsonl", 3, None, "read_jsonl")


def test_a_bom_is_dropped_with_utf_8_sig_as_the_error_for_utf_8_suggests(tmp_path):
    path = tmp_path / "a.jsonl"
    path.write_bytes(b"\xef\xbb\xbf" + b'{"a": 1}\n{"b": "\xef\xbb\xbfin a value"}\n')
    with pytest.raises(af.BadInput, match="utf-8-sig") as info:
        af.read_jsonl(path).to_list()
    assert info.value.line == 1
    want = [{"a": 1}, {"b": "\ufeffin a value"}]  # only the file's first BOM is dropped
    assert af.read_jsonl(path, encoding="utf-8-sig").to_list() == want
    assert af.read_jsonl(path, encoding="UTF_8_SIG").to_list() == want
    assert af.read_lines(path, encoding="utf-8-sig").to_list()[0] == '{"a": 1}'
    (tmp_path / "a.gz").write_bytes(gzip.compress(path.read_bytes()))
    gz = af.read_jsonl(tmp_path / "a.gz", encoding="utf-8-sig", compression_type="GZIP")
    assert gz.to_list() == want
    (tmp_path / "b.jsonl").write_bytes(b'{"no": "bom"}\n')
    assert af.read_jsonl(tmp_path / "b.jsonl", encoding="utf-8-sig").to_list() == [{"no": "bom"}]
