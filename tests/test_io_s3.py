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
