"""The pyarrow readers' record batches: read_csv, read_jsonl(batches=n), read_parquet(batches=).

Each against its row-wise twin on the same file (hypothesis: random rows with nulls,
sizes 0..N, random batch sizes), batches of exactly n rows but the last, and resumed
anywhere (in the middle of a file, of a list of files) equal to the whole run.
"""

from __future__ import annotations

import csv
import gzip
import io
import json

import pytest
from _io_helpers import assert_fds_back_to, open_fds
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import aioflow as af

pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")

FAST = settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])

rows_st = st.lists(
    st.fixed_dictionaries(
        {
            "t": st.integers(-(2**40), 2**40),
            "user": st.one_of(st.none(), st.text("abcxyz", min_size=1, max_size=4)),
            "v": st.one_of(st.none(), st.floats(-1e6, 1e6, allow_nan=False).map(round)),
        }
    ),
    max_size=300,
)


def write(kind, path, rows):
    """``rows`` as a CSV, JSON Lines or Parquet file (every column typed the same way)."""
    if kind == "parquet":
        schema = pa.schema([("t", pa.int64()), ("user", pa.string()), ("v", pa.float64())])
        pq.write_table(pa.Table.from_pylist(rows, schema=schema), path, row_group_size=37)
    elif kind == "jsonl":
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    else:
        with open(path, "w", newline="") as f:
            w = csv.writer(f)
            w.writerow(["t", "user", "v"])
            for r in rows:
                w.writerow(["" if r[k] is None else r[k] for k in ("t", "user", "v")])


def reader(kind, path, n):
    if kind == "parquet":
        return af.read_parquet(path, batches=n)
    if kind == "jsonl":
        return af.read_jsonl(path, batches=n)
    return af.read_csv(path, batches=n)


def as_rows(batches):
    return [r for b in batches for r in b.to_pylist()]


def same_values(got, rows):
    """Equal rows, ints and floats compared as numbers (a CSV/JSON column of whole
    floats is inferred as ints, and one with nulls only as null)."""
    assert len(got) == len(rows)
    for g, r in zip(got, rows, strict=True):
        assert {k: g.get(k) for k in r} == r


@FAST
@pytest.mark.parametrize("kind", ["csv", "jsonl", "parquet"])
@given(rows=rows_st, n=st.integers(1, 64))
def test_batches_hold_the_rows_of_the_row_wise_reader_n_at_a_time(tmp_path_factory, kind, rows, n):
    path = tmp_path_factory.mktemp(kind) / f"a.{kind}"
    write(kind, path, rows)
    got = reader(kind, path, n).to_list()
    assert all(isinstance(b, pa.RecordBatch) for b in got)
    assert [b.num_rows for b in got[:-1]] == [n] * (len(got) - 1)
    assert len(got) == -(-len(rows) // n)
    same_values(as_rows(got), rows)
    if kind == "jsonl":
        same_values(as_rows(got), af.read_jsonl(path).to_list())
    elif kind == "csv" and rows:
        same_values(af.read_csv(path).to_list(), as_rows(got))


@FAST
@pytest.mark.parametrize("kind", ["csv", "jsonl", "parquet"])
@given(rows=rows_st, n=st.one_of(st.none(), st.integers(1, 50)), data=st.data())
def test_a_reader_resumed_anywhere_gives_the_rest_of_the_whole_run(
    tmp_path_factory, kind, rows, n, data
):
    if n is None and kind == "jsonl":
        n = 7  # read_jsonl's row-wise path is tests/test_resume.py's
    path = tmp_path_factory.mktemp(kind) / f"a.{kind}"
    write(kind, path, rows)

    def make():
        p = reader(kind, path, n) if n is not None else af.read_parquet(path)
        if kind == "csv" and n is None:
            p = af.read_csv(path)
        return p.map(lambda b: b.to_pylist() if isinstance(b, pa.RecordBatch) else b)

    whole = make().to_list()
    k = data.draw(st.integers(0, len(whole)))
    with make().iter() as it:
        head = [next(it) for _ in range(k)]
        state = json.loads(json.dumps(it.state_dict()))
    assert k == 0 or state["nodes"] is not None  # by seeking to the row, not by replaying
    with make().iter(state=state) as it:
        assert head + list(it) == whole


def test_a_list_of_files_resumes_in_the_middle_of_a_file_at_its_row(tmp_path):
    for i in range(4):
        rows = [{"t": i * 1000 + j, "user": f"u{j % 3}", "v": float(j)} for j in range(500)]
        write("csv", tmp_path / f"{i}.csv", rows)

    def make():
        files = af.list_files(str(tmp_path / "*.csv"))
        return files.flat_map(lambda p: af.read_csv(p, batches=64)).map(
            lambda b: b.column("t").to_pylist()
        )

    whole = make().to_list()
    assert [t for b in whole for t in b] == [i * 1000 + j for i in range(4) for j in range(500)]
    for k in (0, 3, 8, 9, 20, len(whole)):
        with make().iter() as it:
            head = [next(it) for _ in range(k)]
            state = json.loads(json.dumps(it.state_dict()))
        with make().iter(state=state) as it:
            assert head + list(it) == whole


def test_a_resumed_parquet_reader_starts_at_the_row_in_the_middle_of_a_row_group(tmp_path):
    path = tmp_path / "a.parquet"
    pq.write_table(pa.table({"i": list(range(1000))}), path, row_group_size=300)
    p = af.read_parquet(path, batches=128)
    with p.iter() as it:
        for _ in range(5):
            next(it)
        state = it.state_dict()
    assert {"row": 640} in state["nodes"].values()
    with p.iter(state=state) as it:
        rest = list(it)
    assert [b.num_rows for b in rest] == [128, 128, 104]
    assert rest[0].column("i")[0].as_py() == 640


def test_gzip_csv_and_jsonl_are_read_as_they_are_decompressed(tmp_path):
    rows = [{"t": i, "user": "ab"[i % 2], "v": i / 4} for i in range(1000)]
    (tmp_path / "a.csv.gz").write_bytes(
        gzip.compress(
            b"t,user,v\n" + "".join(f"{r['t']},{r['user']},{r['v']}\n" for r in rows).encode()
        )
    )
    (tmp_path / "a.jsonl.gz").write_bytes(
        gzip.compress("".join(json.dumps(r) + "\n" for r in rows).encode())
    )
    csv_b = af.read_csv(tmp_path / "a.csv.gz", batches=300, compression_type="GZIP").to_list()
    js_b = af.read_jsonl(tmp_path / "a.jsonl.gz", batches=300, compression_type="gzip").to_list()
    assert as_rows(csv_b) == rows and as_rows(js_b) == rows
    assert [b.num_rows for b in csv_b] == [300, 300, 300, 100]


def test_read_csv_options_columns_and_delimiter(tmp_path):
    path = tmp_path / "a.tsv"
    path.write_text("a\tb\tc\n1\tx\t2.5\n3\ty\t\n")
    assert af.read_csv(path, delimiter="\t", columns=["c", "a"]).to_list() == [
        {"c": 2.5, "a": 1},
        {"c": None, "a": 3},
    ]


def test_empty_files_have_no_rows(tmp_path):
    for name in ("a.csv", "a.jsonl"):
        (tmp_path / name).write_bytes(b"")
    (tmp_path / "h.csv").write_text("t,user\n")
    assert af.read_csv(tmp_path / "a.csv", batches=4).to_list() == []
    assert af.read_csv(tmp_path / "a.csv").to_list() == []
    assert af.read_csv(tmp_path / "h.csv").to_list() == []
    assert af.read_jsonl(tmp_path / "a.jsonl", batches=4).to_list() == []


@pytest.mark.parametrize(
    ("name", "content", "make"),
    [
        ("a.jsonl", b'{"a": 1}\n{"a": \n', lambda p: af.read_jsonl(p, batches=10)),
        ("b.jsonl", b'{"a": 1}\n{"a": "x"}\n', lambda p: af.read_jsonl(p, batches=10)),
        ("a.csv", b"a,b\n1,2\n3,4,5\n", lambda p: af.read_csv(p, batches=10)),
    ],
)
def test_a_malformed_file_is_bad_input_naming_it(tmp_path, name, content, make):
    path = tmp_path / name
    path.write_bytes(content)
    with pytest.raises(af.BadInput, match="malformed") as info:
        make(path).to_list()
    assert info.value.path == str(path) and str(path) in str(info.value)
    assert info.value.stage in ("read_jsonl", "read_csv")
    assert info.value.__cause__ is not None


def test_missing_files_and_a_break_leave_no_file_open(tmp_path, no_leaks):
    write("csv", tmp_path / "a.csv", [{"t": i, "user": "u", "v": 1.0} for i in range(50_000)])
    write("jsonl", tmp_path / "a.jsonl", [{"t": i, "user": "u", "v": 1.0} for i in range(50_000)])
    before = open_fds()
    with pytest.raises(FileNotFoundError):
        af.read_csv(tmp_path / "nope.csv", batches=10).to_list()
    with pytest.raises(FileNotFoundError):
        af.read_jsonl(tmp_path / "nope.jsonl", batches=10).to_list()
    for p in (
        af.read_csv(tmp_path / "a.csv", batches=10),
        af.read_jsonl(tmp_path / "a.jsonl", batches=10),
    ):
        for i, _ in enumerate(p):
            if i == 25:
                break
    assert_fds_back_to(before, tmp_path)


def test_options_that_the_batch_readers_cannot_honour_are_refused_when_described(tmp_path):
    path = tmp_path / "a.jsonl"
    with pytest.raises(af.PipelineError, match="on_error"):
        af.read_jsonl(path, batches=10, on_error="skip")
    with pytest.raises(af.PipelineError, match="UTF-8"):
        af.read_jsonl(path, batches=10, encoding="latin-1")
    with pytest.raises(af.PipelineError, match="GZIP"):
        af.read_jsonl(path, batches=10, compression_type="ZLIB")
    for bad in (0, -1, True, 1.5):
        with pytest.raises(af.PipelineError, match="batches"):
            af.read_csv(path, batches=bad)
    with pytest.raises(af.PipelineError, match="batches"):
        af.read_parquet(path, batches=0)


def test_read_csv_and_jsonl_batches_on_a_memory_url():
    fsspec = pytest.importorskip("fsspec")
    fs = fsspec.filesystem("memory")
    fs.pipe("/aioflow-test-tables/a.csv", b"x,y\n1,a\n2,b\n3,c\n")
    fs.pipe("/aioflow-test-tables/a.jsonl", b'{"x": 1}\n{"x": 2}\n{"x": 3}\n')
    try:
        got = af.read_csv("memory://aioflow-test-tables/a.csv", batches=2).to_list()
        assert [b.to_pydict() for b in got] == [
            {"x": [1, 2], "y": ["a", "b"]},
            {"x": [3], "y": ["c"]},
        ]
        got = af.read_jsonl("memory://aioflow-test-tables/a.jsonl", batches=2).to_list()
        assert [b.column("x").to_pylist() for b in got] == [[1, 2], [3]]
    finally:
        fs.rm("/aioflow-test-tables", recursive=True)


def test_csv_rows_are_typed_as_pyarrow_infers_them(tmp_path):
    path = tmp_path / "a.csv"
    buf = io.StringIO()
    csv.writer(buf).writerows(
        [["i", "f", "s", "b"], [1, 0.5, "x", "true"], [2, "", "y,z", "false"]]
    )
    path.write_text(buf.getvalue())
    assert af.read_csv(path).to_list() == [
        {"i": 1, "f": 0.5, "s": "x", "b": True},
        {"i": 2, "f": None, "s": "y,z", "b": False},
    ]


def test_gzip_members_are_read_one_after_another_and_a_cut_stream_is_bad_input(tmp_path):
    text = b"t,u\n" + b"".join(b"%d,%d\n" % (i, i % 7) for i in range(20_000))
    cut = text.rindex(b"\n", 0, len(text) // 2) + 1
    two = tmp_path / "two.csv.gz"
    two.write_bytes(gzip.compress(text[:cut]) + gzip.compress(text[cut:]))
    got = af.read_csv(two, batches=1000, compression_type="GZIP").to_list()
    assert [t for b in got for t in b.column("t").to_pylist()] == list(range(20_000))
    short = tmp_path / "cut.csv.gz"
    whole = gzip.compress(text)
    short.write_bytes(whole[: len(whole) // 2])
    with pytest.raises(af.BadInput, match=r"cut\.csv\.gz"):
        af.read_csv(short, batches=1000, compression_type="GZIP").to_list()
