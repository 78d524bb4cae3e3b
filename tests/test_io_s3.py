"""Reading shards from a real S3 API (moto's server, tests/_s3_server.py) with s3fs.

Shards of every format are written locally, uploaded, then read back through
``af.list_files("s3://...")`` and the readers; what the readers give from S3 is what they
give from the local files, and the bytes are the same. Faults go through the same server.
"""

from __future__ import annotations

import io
import json
import struct
import tarfile
import time

import numpy as np
import pytest
from _s3_server import BUCKET, upload_dir

import aioflow as af
from aioflow.io import tfrecord

pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")


def _tfrecord_frame(rec: bytes) -> bytes:
    length = struct.pack("<Q", len(rec))
    crc = tfrecord.masked_crc
    return length + struct.pack("<I", crc(length)) + rec + struct.pack("<I", crc(rec))


def write_shards(d, n: int = 3) -> dict[str, list[str]]:
    """``n`` shards of each format in ``d``; the names of each format's shards."""
    rng = np.random.default_rng(0)
    names: dict[str, list[str]] = {k: [] for k in ("jsonl", "npy", "tfrecord", "tar", "parquet")}
    for s in range(n):
        base = f"train-{s:03d}"
        rows = [{"shard": s, "i": i, "x": float(rng.random())} for i in range(200)]
        (d / f"{base}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
        np.save(d / f"{base}.npy", rng.standard_normal((16, 8)).astype(np.float32))
        recs = [rng.bytes(int(rng.integers(0, 300))) for _ in range(50)]
        (d / f"{base}.tfrecord").write_bytes(b"".join(_tfrecord_frame(r) for r in recs))
        with tarfile.open(d / f"{base}.tar", "w") as tf:
            for i in range(20):
                for ext, data in (("jpg", rng.bytes(100 + i)), ("cls", str(i % 3).encode())):
                    info = tarfile.TarInfo(f"{base}_{i:04d}.{ext}")
                    info.size = len(data)
                    tf.addfile(info, io.BytesIO(data))
        pq.write_table(
            pa.table({"i": list(range(100)), "v": [f"s{s}-{i}" for i in range(100)]}),
            d / f"{base}.parquet",
        )
        for k in names:
            names[k].append(f"{base}.{k}")
    return names


@pytest.fixture
def shards(s3, tmp_path):
    local = tmp_path / "local"
    local.mkdir()
    names = write_shards(local)
    upload_dir(s3, local)
    return s3, local, names


READERS = {
    "jsonl": af.read_jsonl,
    "npy": af.read_npy,
    "tfrecord": af.read_tfrecord,
    "tar": af.read_tar,
    "parquet": af.read_parquet,
}


def _same(a, b) -> bool:
    if isinstance(a, np.ndarray):
        return a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()
    return bool(a == b)


@pytest.mark.parametrize("fmt", sorted(READERS))
def test_shards_read_from_s3_are_the_local_shards(shards, fmt, no_leaks):
    _, local, names = shards
    files = af.list_files(f"s3://{BUCKET}/train-*.{fmt}")
    assert list(files) == [f"s3://{BUCKET}/{n}" for n in names[fmt]]
    got = files.flat_map(READERS[fmt]).to_list()
    want = af.list_files(str(local / f"train-*.{fmt}")).flat_map(READERS[fmt]).to_list()
    assert len(got) == len(want) > 0
    assert all(_same(a, b) for a, b in zip(got, want, strict=True))
    # and the bytes themselves
    raw = files.flat_map(af.read_bytes).to_list()
    assert raw == [(local / n).read_bytes() for n in names[fmt]]


def test_interleave_over_s3_shards_reads_every_record_once(shards):
    _, local, _ = shards
    files = af.list_files(f"s3://{BUCKET}/train-*.jsonl")
    got = files.interleave(af.read_jsonl, cycle_length=3).to_list()
    want = af.list_files(str(local / "train-*.jsonl")).flat_map(af.read_jsonl).to_list()
    key = lambda r: (r["shard"], r["i"])  # noqa: E731
    assert sorted(got, key=key) == sorted(want, key=key)


def test_the_endpoint_from_aws_endpoint_url_alone(shards, monkeypatch):
    """Without fsspec's storage options: botocore's own ``AWS_ENDPOINT_URL``."""
    import fsspec.config

    s3, local, names = shards
    monkeypatch.delitem(fsspec.config.conf, "s3")
    monkeypatch.setenv("AWS_ENDPOINT_URL", s3.url)
    got = af.list_files(f"s3://{BUCKET}/train-*.jsonl").flat_map(af.read_bytes).to_list()
    assert got == [(local / n).read_bytes() for n in names["jsonl"]]


# -- faults through the same server ------------------------------------------------------
@pytest.mark.parametrize("fmt", sorted(READERS))
def test_a_missing_key_raises_file_not_found_naming_the_url(s3, fmt, no_leaks):
    url = f"s3://{BUCKET}/nope/train-999.{fmt}"
    with pytest.raises(FileNotFoundError, match=r"s3://aioflow-test/nope/train-999"):
        READERS[fmt](url).to_list()


def test_a_pattern_matching_no_key_raises_file_not_found_naming_it(s3):
    with pytest.raises(FileNotFoundError, match=r"s3://aioflow-test/nothing-\*"):
        af.list_files(f"s3://{BUCKET}/nothing-*")


def _big_jsonl(d, name: str = "big.jsonl", rows: int = 60_000) -> bytes:
    data = "".join(json.dumps({"i": i, "pad": "x" * 80}) + "\n" for i in range(rows)).encode()
    (d / name).write_bytes(data)
    return data


def test_an_object_deleted_mid_read_is_read_whole_or_not_found_never_cut(s3, tmp_path, no_leaks):
    """A streamed GET (the line readers) sees the object as it was when the read began;
    ranged reads (read_parquet) find it gone: ``FileNotFoundError`` naming it."""
    data = _big_jsonl(tmp_path)
    rows = 2_000_000
    pq.write_table(
        pa.table({"i": list(range(rows))}), tmp_path / "big.parquet", row_group_size=100_000
    )
    upload_dir(s3, tmp_path)
    c = s3.client()
    got = []
    with af.read_lines(f"s3://{BUCKET}/big.jsonl").iter() as it:
        for line in it:
            if not got:
                c.delete_object(Bucket=BUCKET, Key="big.jsonl")
            got.append(line)
    assert "".join(s + "\n" for s in got).encode() == data
    ranged: list[str | None] = []

    def delete_before_the_first_data_read(req):  # the footer is read first, then the data
        if req.method == "GET" and "big.parquet" in req.path and req.range:
            ranged.append(req.range)
            if len(ranged) == 2:
                c.delete_object(Bucket=BUCKET, Key="big.parquet")

    s3.hold = delete_before_the_first_data_read
    p = af.read_parquet(f"s3://{BUCKET}/big.parquet", batches=True, batch_size=100_000)
    with pytest.raises(FileNotFoundError, match=r"s3://aioflow-test/big\.parquet"):
        p.to_list()
    assert len(ranged) == 2


def test_refused_credentials_raise_permission_error_naming_the_url(
    s3, tmp_path, monkeypatch, no_leaks
):
    from moto import settings

    _big_jsonl(tmp_path, rows=10)
    upload_dir(s3, tmp_path)
    # the server checks every request's access key against its IAM users, which have none
    with monkeypatch.context() as m:
        m.setattr(settings, "INITIAL_NO_AUTH_ACTION_COUNT", 0)
        with pytest.raises(PermissionError, match=r"s3://aioflow-test/\*\.jsonl"):
            af.list_files(f"s3://{BUCKET}/*.jsonl")
        for read in (af.read_jsonl, af.read_bytes, af.read_parquet):
            with pytest.raises(PermissionError, match=r"s3://aioflow-test/big\.jsonl"):
                read(f"s3://{BUCKET}/big.jsonl").to_list()


@pytest.mark.parametrize("timeout", [5.0, 40.0])
def test_the_server_stopped_mid_epoch_is_a_clear_error_within_the_timeout(
    own_s3, tmp_path, timeout, no_leaks
):
    """The store's client retries a refused connection for seconds (~8 s here): a short
    ``timeout`` ends the wait first (``TimeoutError``); a long one sees the
    ``ConnectionError`` naming the shard. Within the timeout, nothing left running."""
    for s in range(4):
        _big_jsonl(tmp_path, f"train-{s}.jsonl", rows=20_000)
    upload_dir(own_s3, tmp_path)
    files = af.list_files(f"s3://{BUCKET}/train-*.jsonl")
    got, start = 0, 0.0
    # TimeoutError is an OSError
    with pytest.raises(OSError) as info, files.flat_map(af.read_jsonl).iter(timeout=timeout) as it:
        for _ in it:
            got += 1
            if got == 1:
                own_s3.stop()
                start = time.monotonic()
    assert got >= 1, info.value  # the first item came before the server stopped
    assert time.monotonic() - start < timeout + 5
    if timeout < 10:  # the client may give up first on a fast machine: either is clear
        assert isinstance(info.value, TimeoutError | ConnectionError)
    else:
        assert isinstance(info.value, ConnectionError)
        assert "s3://aioflow-test/train-" in str(info.value)
        assert "Could not connect" in str(info.value)
