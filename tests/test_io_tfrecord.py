"""read_tfrecord on files written by an independent writer (and by TensorFlow if present)."""

from __future__ import annotations

import functools
import gzip
import os
import random
import struct
import zlib
from pathlib import Path

import pytest
from _io_helpers import assert_fds_back_to, open_fds

import aioflow as af
from aioflow.io import tfrecord


def crc32c_bitwise(data: bytes) -> int:
    """CRC-32C bit by bit: an implementation independent of the reader's."""
    crc = 0xFFFFFFFF
    for byte in data:
        crc ^= byte
        for _ in range(8):
            crc = (crc >> 1) ^ (0x82F63B78 & -(crc & 1))
    return crc ^ 0xFFFFFFFF


@functools.cache
def masked(data: bytes) -> int:
    crc = crc32c_bitwise(data)
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def frame(rec: bytes) -> bytes:
    n = struct.pack("<Q", len(rec))
    return n + struct.pack("<I", masked(n)) + rec + struct.pack("<I", masked(rec))


def write_records(path: Path, records: list[bytes]) -> list[int]:
    """Write the TFRecord file; returns each record's byte offset."""
    offsets, pos = [], 0
    with open(path, "wb") as f:
        for rec in records:
            offsets.append(pos)
            b = frame(rec)
            f.write(b)
            pos += len(b)
    return offsets


RNG = random.Random(0)
RECORDS = [b"", b"x", os.urandom(300_000)] + [
    RNG.randbytes(RNG.choice([1, 10, 100, 1000])) for _ in range(2000)
]


def test_crc32c_implementations_agree_with_the_known_check_value():
    assert crc32c_bitwise(b"123456789") == 0xE3069283
    for data in [b"", b"a", b"123456789", os.urandom(1000)]:
        want = crc32c_bitwise(data)
        assert tfrecord.crc32c_py(data) == want
        assert tfrecord.crc32c(data) == want


def test_read_tfrecord_yields_every_raw_record_in_order(tmp_path):
    path = tmp_path / "a.tfrecord"
    write_records(path, RECORDS)
    assert af.read_tfrecord(path).to_list() == RECORDS
    assert af.read_tfrecord(write_records_empty(tmp_path)).to_list() == []


def write_records_empty(tmp_path: Path) -> Path:
    path = tmp_path / "empty.tfrecord"
    path.write_bytes(b"")
    return path


def test_the_pure_python_crc_fallback_reads_the_same(tmp_path, monkeypatch):
    path = tmp_path / "a.tfrecord"
    small = RECORDS[3:200]
    write_records(path, small)
    monkeypatch.setattr(tfrecord, "crc32c", tfrecord.crc32c_py)
    assert af.read_tfrecord(path).to_list() == small


def test_corrupt_record_data_raises_naming_offset_and_skip_keeps_the_rest(tmp_path, caplog):
    path = tmp_path / "a.tfrecord"
    recs = [f"record {i}".encode() for i in range(100)]
    offsets = write_records(path, recs)
    raw = bytearray(path.read_bytes())
    raw[offsets[40] + 12 + 2] ^= 0xFF  # a byte inside record 40's data
    path.write_bytes(bytes(raw))
    got = []
    with pytest.raises(af.BadInput) as info:
        for r in af.read_tfrecord(path):
            got.append(r)
    assert got == recs[:40]
    assert info.value.offset == offsets[40] and f"offset {offsets[40]}" in str(info.value)
    with af.read_tfrecord(path, on_error="skip").iter() as it:
        assert list(it) == recs[:40] + recs[41:]
        assert it.stats()["read_tfrecord"].errors_skipped == 1
    assert len(af.read_tfrecord(path, check_crc=False).to_list()) == 100


def test_corrupt_length_stops_the_file_and_skip_keeps_what_came_before(tmp_path):
    path = tmp_path / "a.tfrecord"
    recs = [bytes([i]) * 50 for i in range(30)]
    offsets = write_records(path, recs)
    raw = bytearray(path.read_bytes())
    raw[offsets[10] + 1] ^= 0x01  # record 10's length field
    path.write_bytes(bytes(raw))
    with pytest.raises(af.BadInput, match="corrupt record length") as info:
        af.read_tfrecord(path).to_list()
    assert info.value.offset == offsets[10]
    assert af.read_tfrecord(path, on_error="skip").to_list() == recs[:10]


@pytest.mark.parametrize("cut", [5, 12 + 20, -1])  # in a header, in the data, in the last crc
def test_truncated_file_raises_naming_offset_and_skip_keeps_complete_records(tmp_path, cut):
    path = tmp_path / "a.tfrecord"
    recs = [b"r" * 100 for _ in range(20)]
    offsets = write_records(path, recs)
    raw = path.read_bytes()
    end = offsets[-1] + cut if cut > 0 else len(raw) + cut
    path.write_bytes(raw[:end])
    before = open_fds()
    with pytest.raises(af.BadInput, match="truncated") as info:
        af.read_tfrecord(path).to_list()
    assert info.value.offset == offsets[-1] and str(path) in str(info.value)
    assert af.read_tfrecord(path, on_error="skip").to_list() == recs[:-1]
    assert_fds_back_to(before, tmp_path)


def test_gzip_and_zlib_compressed_records(tmp_path):
    path = tmp_path / "a.tfrecord"
    write_records(path, RECORDS[:500])
    raw = path.read_bytes()
    (tmp_path / "a.gz").write_bytes(gzip.compress(raw))
    (tmp_path / "a.z").write_bytes(zlib.compress(raw))
    assert af.read_tfrecord(tmp_path / "a.gz", compression_type="GZIP").to_list() == RECORDS[:500]
    assert af.read_tfrecord(tmp_path / "a.z", compression_type="ZLIB").to_list() == RECORDS[:500]


def test_break_leaves_no_file_open(tmp_path, no_leaks):
    path = tmp_path / "a.tfrecord"
    write_records(path, RECORDS)
    before = open_fds()
    for i, _ in enumerate(af.read_tfrecord(path)):
        if i == 1000:
            break
    assert_fds_back_to(before, tmp_path)


def test_reads_files_written_by_tensorflow(tmp_path):
    tf = pytest.importorskip("tensorflow")
    path = str(tmp_path / "tf.tfrecord")
    with tf.io.TFRecordWriter(path) as w:
        for rec in RECORDS[:300]:
            w.write(rec)
    assert af.read_tfrecord(path).to_list() == RECORDS[:300]
    assert Path(path).read_bytes() == b"".join(frame(r) for r in RECORDS[:300])
    for kind in ("GZIP", "ZLIB"):
        options = tf.io.TFRecordOptions(compression_type=kind)
        with tf.io.TFRecordWriter(path + kind, options) as w:
            for rec in RECORDS[:300]:
                w.write(rec)
        assert af.read_tfrecord(path + kind, compression_type=kind).to_list() == RECORDS[:300]


def test_a_cut_gzip_file_raises_and_skip_keeps_the_records_before(tmp_path):
    rng = random.Random(0)
    recs = [rng.randbytes(1000) for _ in range(2000)]
    write_records(tmp_path / "a.tfrecord", recs)
    raw = gzip.compress((tmp_path / "a.tfrecord").read_bytes())
    path = tmp_path / "a.gz"
    path.write_bytes(raw[: len(raw) // 2])
    with pytest.raises(af.BadInput, match="truncated compressed stream") as info:
        af.read_tfrecord(path, compression_type="GZIP").to_list()
    assert info.value.path == str(path)
    with af.read_tfrecord(path, compression_type="GZIP", on_error="skip").iter() as it:
        got = list(it)
        assert it.stats()["read_tfrecord"].errors_skipped == 1
    assert 100 < len(got) < 2000 and got == recs[: len(got)]
