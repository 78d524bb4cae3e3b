"""Record batches in batch/unbatch/rebatch and as arrays or tensors (``collate``).

Each columnar path against its row-wise twin on the same rows (hypothesis: random rows
with nulls, sizes 0..N, random batch sizes); ``to_numpy`` and ``to_torch`` share the
batch's memory for numeric columns without nulls (the same address, no copy at all).
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import aioflow as af
from aioflow.collate import arrow_collate, to_numpy

pa = pytest.importorskip("pyarrow")

FAST = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])

rows_st = st.lists(
    st.fixed_dictionaries(
        {
            "t": st.integers(-(2**62), 2**62),
            "user": st.one_of(st.none(), st.text(max_size=5)),
            "v": st.one_of(st.none(), st.floats(allow_nan=False)),
        }
    ),
    max_size=200,
)


def record_batches(rows, n):
    return [pa.RecordBatch.from_pylist(rows[i : i + n]) for i in range(0, len(rows), n)]


@FAST
@given(rows=rows_st, n=st.integers(1, 50))
def test_unbatch_of_record_batches_yields_their_rows_as_dicts(rows, n):
    batches = record_batches(rows, n)
    if rows:
        batches.insert(len(batches) // 2, batches[0].slice(0, 0))  # an empty batch: no row
    assert af.from_iterable(batches).unbatch().to_list() == rows


@FAST
@given(rows=rows_st, n=st.integers(1, 50))
def test_batch_with_the_arrow_collate_makes_the_record_batches_of_the_rows(rows, n):
    got = af.from_iterable(rows).batch(n, collate="arrow").to_list()
    assert all(isinstance(b, pa.RecordBatch) for b in got)
    assert [b.num_rows for b in got] == [len(rows[i : i + n]) for i in range(0, len(rows), n)]
    assert [r for b in got for r in b.to_pylist()] == rows
    assert af.from_iterable(got).unbatch().to_list() == rows


@FAST
@given(rows=rows_st, n=st.integers(1, 30), m=st.integers(1, 30))
def test_rebatch_of_record_batches_gives_record_batches(rows, n, m):
    got = af.from_iterable(record_batches(rows, n)).rebatch(m).to_list()
    assert all(isinstance(b, pa.RecordBatch) for b in got)
    assert [b.num_rows for b in got] == [len(rows[i : i + m]) for i in range(0, len(rows), m)]
    assert [r for b in got for r in b.to_pylist()] == rows


def test_unbatch_of_a_dict_of_arrays_yields_row_dicts():
    cols = {"t": np.array([3, 1, 2]), "v": np.array([0.5, 1.0, 1.5])}
    got = af.from_iterable([cols]).unbatch().to_list()
    assert got == [{"t": 3, "v": 0.5}, {"t": 1, "v": 1.0}, {"t": 2, "v": 1.5}]


def test_the_arrow_collate_fills_missing_keys_with_nulls_and_joins_record_batches():
    b = arrow_collate([{"a": 1}, {"a": 2, "b": "x"}])
    assert b.to_pydict() == {"a": [1, 2], "b": [None, "x"]}
    two = arrow_collate([b, b.slice(1)])
    assert two.to_pydict() == {"a": [1, 2, 2], "b": [None, "x", "x"]}
    with pytest.raises(af.PipelineError, match="dict rows"):
        af.range(3).batch(2, collate="arrow").to_list()


def _address(arr, i=1):
    """The address of the first value of a (sliced) fixed-width arrow array."""
    return arr.buffers()[i].address + arr.offset * arr.type.bit_width // 8


@FAST
@given(rows=rows_st, start=st.integers(0, 20))
def test_to_numpy_gives_each_column_as_the_row_wise_values(rows, start):
    b = pa.RecordBatch.from_pylist(
        rows, schema=pa.schema([("t", pa.int64()), ("user", pa.string()), ("v", pa.float64())])
    )
    b = b.slice(min(start, b.num_rows))
    cols = to_numpy(b)
    want = b.to_pylist()
    assert cols["t"].dtype == np.int64 and cols["t"].tolist() == [r["t"] for r in want]
    assert cols["user"].tolist() == [r["user"] for r in want]
    for got, r in zip(cols["v"].tolist(), want, strict=True):
        assert math.isnan(got) if r["v"] is None else got == r["v"]
    if b.num_rows:
        assert cols["t"].ctypes.data == _address(b.column("t"))  # the batch's memory itself
        if b.column("v").null_count == 0:
            assert cols["v"].ctypes.data == _address(b.column("v"))


def test_to_numpy_of_the_parquet_reader_s_batches_shares_their_memory(tmp_path):
    pq = pytest.importorskip("pyarrow.parquet")
    path = tmp_path / "a.parquet"
    pq.write_table(pa.table({"t": np.arange(10_000), "x": np.ones(10_000, np.float32)}), path)
    for b in af.read_parquet(path, batches=3000):
        cols = to_numpy(b)
        assert cols["t"].ctypes.data == _address(b.column("t"))
        assert cols["x"].ctypes.data == _address(b.column("x")) and cols["x"].dtype == np.float32
        assert not cols["t"].flags.writeable


def test_to_numpy_of_a_table_and_of_a_dict_of_arrays():
    t = pa.Table.from_batches([pa.record_batch({"a": [1, 2]}), pa.record_batch({"a": [3]})])
    assert to_numpy(t)["a"].tolist() == [1, 2, 3]
    assert to_numpy({"a": [1, 2]})["a"].tolist() == [1, 2]
    with pytest.raises(af.PipelineError, match="record batch"):
        to_numpy([1, 2])


def test_torch_collate_of_record_batches_shares_numeric_columns_and_matches_rows():
    torch = pytest.importorskip("torch")
    from aioflow.integrations.torch import to_torch

    rows = [{"t": i, "v": i / 2, "name": f"n{i}"} for i in range(10)]
    b = pa.RecordBatch.from_pylist(rows)
    t = to_torch(b)
    assert t["t"].data_ptr() == _address(b.column("t")) and t["t"].dtype == torch.int64
    assert t["name"] == [r["name"] for r in rows]
    by_rows = af.from_iterable(rows).batch(4, collate="torch").to_list()
    by_batches = af.from_iterable(record_batches(rows, 2)).batch(2, collate="torch").to_list()
    assert len(by_rows) == len(by_batches) == 3
    for x, y in zip(by_rows, by_batches, strict=True):
        assert torch.equal(x["t"], y["t"]) and torch.equal(x["v"], y["v"])
        assert x["name"] == y["name"]
