"""read_tar: WebDataset samples from tar files written by tarfile."""

from __future__ import annotations

import io
import os
import tarfile
from pathlib import Path

import pytest
from _io_helpers import assert_fds_back_to, open_fds

import aioflow as af


def write_tar(path: Path, members: list[tuple[str, bytes | None]], fmt: int) -> list[int]:
    """Write members (None data: a directory); returns each member's header offset."""
    offsets = []
    with tarfile.open(path, "w", format=fmt) as tf:
        for name, data in members:
            offsets.append(tf.offset)
            info = tarfile.TarInfo(name)
            if data is None:
                info.type = tarfile.DIRTYPE
                tf.addfile(info)
            else:
                info.size = len(data)
                tf.addfile(info, io.BytesIO(data))
    return offsets


LONG = "d/" + "x" * 150  # longer than the 100 bytes of a plain header name
MEMBERS: list[tuple[str, bytes | None]] = [
    ("shard", None),
    ("shard/000.jpg", b"jpeg 0"),
    ("shard/000.cls", b"3"),
    ("shard/000.seg.PNG", os.urandom(1500 * 1024)),  # bigger than a read block
    ("README", b"no extension: left out"),
    ("shard/001.jpg", b"jpeg 1"),
    ("shard/001.cls", b"5"),
    (f"{LONG}.json", b"{}"),
    ("v1.2/file.txt", b"dots in the directory"),
    ("shard/000.txt", b"not consecutive with the first 000: a new sample"),
]


def expected() -> list[dict[str, object]]:
    big = MEMBERS[3][1]
    return [
        {"__key__": "shard/000", "jpg": b"jpeg 0", "cls": b"3", "seg.png": big},
        {"__key__": "shard/001", "jpg": b"jpeg 1", "cls": b"5"},
        {"__key__": LONG, "json": b"{}"},
        {"__key__": "v1.2/file", "txt": b"dots in the directory"},
        {"__key__": "shard/000", "txt": MEMBERS[-1][1]},
    ]


@pytest.mark.parametrize(
    "fmt", [tarfile.GNU_FORMAT, tarfile.PAX_FORMAT, tarfile.USTAR_FORMAT], ids=str
)
def test_read_tar_groups_consecutive_members_by_key(tmp_path, fmt):
    path = tmp_path / "a.tar"
    members = MEMBERS if fmt != tarfile.USTAR_FORMAT else [m for m in MEMBERS if LONG not in m[0]]
    write_tar(path, members, fmt)
    want = [s for s in expected() if fmt != tarfile.USTAR_FORMAT or s["__key__"] != LONG]
    assert af.read_tar(path).to_list() == want


def test_many_small_samples_come_in_order_over_several_epochs(tmp_path):
    path = tmp_path / "a.tar"
    members = [(f"{i:05d}.{ext}", f"{i}{ext}".encode()) for i in range(2000) for ext in "ab"]
    write_tar(path, members, tarfile.GNU_FORMAT)
    want = [
        {"__key__": f"{i:05d}", "a": f"{i}a".encode(), "b": f"{i}b".encode()} for i in range(2000)
    ]
    p = af.read_tar(path)
    assert p.to_list() == want
    assert p.to_list() == want


@pytest.mark.parametrize("cut", [100, 512 + 3], ids=["in-header", "in-data"])
def test_truncated_tar_raises_naming_offset_and_skip_keeps_complete_samples(tmp_path, cut):
    path = tmp_path / "a.tar"
    members = [(f"{i}.{e}", b"z" * 700) for i in range(6) for e in ("x", "y")]
    offsets = write_tar(path, members, tarfile.GNU_FORMAT)
    raw = path.read_bytes()
    path.write_bytes(raw[: offsets[9] + cut])  # inside member 4.y
    before = open_fds()
    got = []
    with pytest.raises(af.BadInput, match="truncated tar") as info:
        for s in af.read_tar(path):
            got.append(s["__key__"])
    assert got == ["0", "1", "2", "3"]
    assert info.value.offset == offsets[9] and f"offset {offsets[9]}" in str(info.value)
    with af.read_tar(path, on_error="skip").iter() as it:
        assert [s["__key__"] for s in it] == ["0", "1", "2", "3"]
        assert it.stats()["read_tar"].errors_skipped == 1
    assert_fds_back_to(before, tmp_path)


def test_a_member_twice_in_one_sample_is_bad_input_and_skip_drops_that_sample(tmp_path):
    path = tmp_path / "a.tar"
    members = [("a.x", b"1"), ("b.x", b"2"), ("b.x", b"again"), ("b.y", b"3"), ("c.x", b"4")]
    offsets = write_tar(path, members, tarfile.GNU_FORMAT)
    with pytest.raises(af.BadInput, match="appears twice") as info:
        af.read_tar(path).to_list()
    assert info.value.offset == offsets[2]
    got = af.read_tar(path, on_error="skip").to_list()
    assert got == [{"__key__": "a", "x": b"1"}, {"__key__": "c", "x": b"4"}]


def test_a_file_that_is_not_a_tar_is_bad_input(tmp_path):
    path = tmp_path / "a.tar"
    path.write_bytes(os.urandom(2048))
    with pytest.raises(af.BadInput, match="bad tar header") as info:
        af.read_tar(path).to_list()
    assert info.value.offset == 0


def test_an_empty_tar_has_no_samples(tmp_path):
    path = tmp_path / "a.tar"
    write_tar(path, [], tarfile.GNU_FORMAT)
    assert af.read_tar(path).to_list() == []


def test_a_gzipped_tar_is_read_as_a_stream(tmp_path):
    path = tmp_path / "a.tar.gz"
    with tarfile.open(path, "w:gz") as tf:
        for name, data in [("a.x", b"1"), ("a.y", b"2"), ("b.x", os.urandom(2_000_000))]:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tf.addfile(info, io.BytesIO(data))
    got = af.read_tar(path, compression_type="GZIP").to_list()
    assert [s["__key__"] for s in got] == ["a", "b"]
    assert got[0] == {"__key__": "a", "x": b"1", "y": b"2"} and len(got[1]["x"]) == 2_000_000


def _header(name: str, size: int, kind: bytes = tarfile.REGTYPE) -> bytearray:
    info = tarfile.TarInfo(name)
    info.size, info.type = size, kind
    return bytearray(info.tobuf(tarfile.USTAR_FORMAT))


def _member(name: str, data: bytes, kind: bytes = tarfile.REGTYPE) -> bytes:
    pad = -len(data) % 512
    return bytes(_header(name, len(data), kind)) + data + bytes(pad)


def _rechecksum(block: bytearray) -> bytes:
    block[148:156] = b" " * 8
    block[148:156] = b"%06o\0 " % sum(block)
    return bytes(block)


@pytest.mark.parametrize(
    "record", [b"0 path=x\n", b"-5 path=x.y\n", b"99 path=x.y\n", b"abc\n"], ids=repr
)
def test_a_bad_pax_record_length_is_bad_input_naming_its_offset(tmp_path, record):
    path = tmp_path / "a.tar"
    first = _member("a.x", b"1") + _member("b.x", b"2")  # b may go on after the bad header
    pax = _member("././@PaxHeader", record, tarfile.XHDTYPE)
    path.write_bytes(first + pax + _member("c.x", b"3") + bytes(1024))
    with pytest.raises(af.BadInput, match="pax") as info:
        af.read_tar(path).to_list()
    assert info.value.offset == len(first) and str(path) in str(info.value)
    with af.read_tar(path, on_error="skip").iter() as it:
        assert list(it) == [{"__key__": "a", "x": b"1"}]
        assert it.stats()["read_tar"].errors_skipped == 1


@pytest.mark.parametrize("on_error", ["raise", "skip"])
def test_a_negative_member_size_is_bad_input_and_not_a_loop(tmp_path, on_error):
    path = tmp_path / "a.tar"
    first = _member("a.x", b"1") + _member("b.x", b"2")
    head = _header("c.x", 0)
    head[124:136] = b"\xff" * 12  # base-256: -1
    path.write_bytes(first + _rechecksum(head) + _member("d.x", b"4") + bytes(1024))
    p = af.read_tar(path, on_error=on_error)
    if on_error == "raise":
        with pytest.raises(af.BadInput, match="size -1") as info:
            p.to_list()
        assert info.value.offset == len(first) and str(path) in str(info.value)
    else:
        assert p.to_list() == [{"__key__": "a", "x": b"1"}]


def test_a_negative_size_in_a_pax_header_is_bad_input(tmp_path):
    path = tmp_path / "a.tar"
    pax = _member("././@PaxHeader", b"12 size=-10\n", tarfile.XHDTYPE)
    path.write_bytes(pax + _member("b.x", b"2") + bytes(1024))
    with pytest.raises(af.BadInput, match="size -10") as info:
        af.read_tar(path).to_list()
    assert info.value.offset == 512 * 2


@pytest.mark.parametrize("cut", [100, 512 + 3], ids=["in-header", "in-data"])
def test_a_tar_cut_in_the_first_member_of_a_sample_still_delivers_the_one_before(tmp_path, cut):
    path = tmp_path / "a.tar"
    members = [(f"{i}.{e}", b"z" * 700) for i in range(6) for e in ("x", "y")]
    offsets = write_tar(path, members, tarfile.GNU_FORMAT)
    path.write_bytes(path.read_bytes()[: offsets[10] + cut])  # inside member 5.x
    got = []
    with pytest.raises(af.BadInput, match="truncated tar") as info:
        for s in af.read_tar(path):
            got.append(s["__key__"])
    assert info.value.offset == offsets[10]
    want = ["0", "1", "2", "3", "4"] if cut > 512 else ["0", "1", "2", "3"]  # a cut header
    assert got == want  # has no name: the sample before it may go on
    assert [s["__key__"] for s in af.read_tar(path, on_error="skip")] == want


def test_a_cut_gzipped_tar_raises_and_skip_keeps_the_complete_samples(tmp_path):
    path = tmp_path / "a.tar.gz"
    with tarfile.open(path, "w:gz") as tf:
        for i in range(200):
            info = tarfile.TarInfo(f"{i:03d}.x")
            data = os.urandom(3000)
            info.size = len(data)
            tf.addfile(info, io.BytesIO(data))
    raw = path.read_bytes()
    path.write_bytes(raw[: len(raw) // 2])
    with pytest.raises(af.BadInput, match="truncated compressed stream"):
        af.read_tar(path, compression_type="GZIP").to_list()
    with af.read_tar(path, compression_type="GZIP", on_error="skip").iter() as it:
        got = [s["__key__"] for s in it]
        assert it.stats()["read_tar"].errors_skipped == 1
    assert 50 < len(got) < 200 and got == [f"{i:03d}" for i in range(len(got))]
