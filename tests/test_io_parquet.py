"""read_parquet (extra ``parquet``): rows and record batches; skipped without pyarrow."""

from __future__ import annotations

import pytest
from _io_helpers import assert_fds_back_to, open_fds

import aioflow as af

pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")


@pytest.fixture
def table_path(tmp_path):
    n = 10_000
    table = pa.table(
        {"i": list(range(n)), "s": [f"s{i}" for i in range(n)], "f": [i / 2 for i in range(n)]}
    )
    path = tmp_path / "t.parquet"
    pq.write_table(table, path, row_group_size=3000)
    return path, table


def test_read_parquet_yields_every_row_as_a_dict_in_order(table_path):
    path, table = table_path
    assert af.read_parquet(path).to_list() == table.to_pylist()


def test_read_parquet_batches_and_columns(table_path):
    path, table = table_path
    got = af.read_parquet(path, batches=True, columns=["i"], batch_size=1024).to_list()
    assert all(isinstance(b, pa.RecordBatch) and b.schema.names == ["i"] for b in got)
    assert all(b.num_rows <= 1024 for b in got)
    assert pa.Table.from_batches(got).column("i").to_pylist() == list(range(table.num_rows))


def test_read_parquet_missing_file_and_break_leave_no_file_open(table_path, tmp_path, no_leaks):
    path, _ = table_path
    before = open_fds()
    with pytest.raises(FileNotFoundError, match=r"nope\.parquet"):
        af.read_parquet(tmp_path / "nope.parquet").to_list()
    for i, _ in enumerate(af.read_parquet(path, batch_size=100)):
        if i == 250:
            break
    assert_fds_back_to(before, tmp_path)
    assert af.read_parquet(path).take(3).map(lambda r: r["i"]).to_list() == [0, 1, 2]


@pytest.mark.parametrize("damage", ["not-parquet", "cut", "footer", "data"])
def test_a_corrupt_parquet_file_is_bad_input_naming_it(table_path, damage):
    path, _ = table_path
    raw = path.read_bytes()
    if damage == "not-parquet":
        raw = b"hello, world\n" * 10
    elif damage == "cut":
        raw = raw[: len(raw) // 2]
    elif damage == "footer":
        raw = raw[:-30] + bytes(26) + raw[-4:]
    else:
        raw = raw[:1001] + b"\xff" * 16 + raw[1017:]  # inside the first data page
    path.write_bytes(raw)
    with pytest.raises(af.BadInput, match="corrupt Parquet") as info:
        af.read_parquet(path).to_list()
    assert info.value.path == str(path) and str(path) in str(info.value)
    assert info.value.stage == "read_parquet" and info.value.__cause__ is not None
