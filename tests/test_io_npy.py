"""read_npy on files written by numpy."""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import pytest
from _io_helpers import assert_fds_back_to, open_fds

import aioflow as af

ARRAYS = {
    "float32": np.arange(24, dtype=np.float32).reshape(2, 3, 4),
    "int64_big_endian": np.arange(10, dtype=">i8"),
    "bool": np.array([True, False, True]),
    "complex": np.array([1 + 2j, -3j], dtype=np.complex64),
    "scalar": np.array(3.5),
    "empty": np.zeros((0, 3), dtype=np.uint16),
    "fortran": np.asfortranarray(np.arange(12, dtype=np.int32).reshape(3, 4)),
    "structured": np.array([(1, 2.5), (3, 4.5)], dtype=[("a", "<i4"), ("b", "<f8")]),
    "unicode": np.array(["ab", "çé"]),
    "large": np.random.default_rng(0).standard_normal((700, 1000)),  # 5.6 MB: many blocks
}


@pytest.mark.parametrize("name", list(ARRAYS))
def test_read_npy_round_trips_dtype_shape_order_and_values(tmp_path, name):
    want = ARRAYS[name]
    path = tmp_path / f"{name}.npy"
    np.save(path, want)
    (got,) = af.read_npy(path).to_list()
    assert got.dtype == want.dtype and got.shape == want.shape
    assert np.array_equal(got, want)
    assert got.flags.f_contiguous == want.flags.f_contiguous
    got[...] = got  # writable, as np.load's arrays are


def test_read_npy_reads_format_versions_2_and_3(tmp_path):
    want = np.arange(6, dtype=np.float64).reshape(2, 3)
    for version in [(2, 0), (3, 0)]:
        path = tmp_path / f"v{version[0]}.npy"
        with open(path, "wb") as f:
            np.lib.format.write_array(f, want, version=version)
        assert np.array_equal(af.read_npy(path).to_list()[0], want)


def save_bytes(arr: np.ndarray) -> bytes:
    b = io.BytesIO()
    np.save(b, arr)
    return b.getvalue()


def test_truncated_npy_raises_bad_input_naming_file_and_offset(tmp_path):
    data = save_bytes(np.arange(1000, dtype=np.float32))
    path = tmp_path / "cut.npy"
    path.write_bytes(data[:-100])
    before = open_fds()
    with pytest.raises(af.BadInput) as info:
        af.read_npy(path).to_list()
    err = info.value
    assert err.path == str(path) and err.offset == len(data) - 100
    assert str(path) in str(err) and f"offset {len(data) - 100}" in str(err)
    path.write_bytes(data[:30])  # inside the header
    with pytest.raises(af.BadInput, match=r"truncated \.npy header"):
        af.read_npy(path).to_list()
    assert_fds_back_to(before, tmp_path)


def test_not_an_npy_file_and_object_arrays_are_bad_input(tmp_path):
    path = tmp_path / "x.npy"
    path.write_bytes(b"PK\x03\x04 definitely a zip")
    with pytest.raises(af.BadInput, match="bad magic"):
        af.read_npy(path).to_list()
    np.save(path, np.array([{"a": 1}], dtype=object), allow_pickle=True)
    with pytest.raises(af.BadInput, match="object arrays"):
        af.read_npy(path).to_list()


def test_skip_drops_the_bad_file_and_every_good_one_arrives(tmp_path):
    for i in range(6):
        data = save_bytes(np.full(4, i, dtype=np.int8))
        (tmp_path / f"{i}.npy").write_bytes(data[:-1] if i in (2, 4) else data)
    files = af.list_files(str(tmp_path / "*.npy"))
    p = files.flat_map(lambda f: af.read_npy(f, on_error="skip"))
    with p.iter() as it:
        got = [int(a[0]) for a in it]
        skipped = sum(s.errors_skipped for s in it.stats())
    assert got == [0, 1, 3, 5]
    assert skipped == 2
    with pytest.raises(af.BadInput):
        files.flat_map(af.read_npy).to_list()


def test_read_npy_has_one_item_and_rereads_each_epoch(tmp_path):
    path = Path(tmp_path / "a.npy")
    np.save(path, np.ones(3))
    p = af.read_npy(path)
    assert len(p) == 1
    assert p.cardinality() == 1
    np.save(path, np.zeros(3))
    assert p.to_list()[0].tolist() == [0, 0, 0]


def test_a_header_with_a_huge_shape_is_bad_input_and_skippable(tmp_path):
    good = save_bytes(np.zeros(4, dtype=np.float32))
    header = "{'descr': '<f8', 'fortran_order': False, 'shape': (10**12, 10**12), }"
    for name, shape in [("huge", "(1000000000000, 1000000000000)"), ("big", "(10000000,)")]:
        text = header.replace("(10**12, 10**12)", shape).encode("latin1")
        text += b" " * (-(len(text) + 11) % 64) + b"\n"
        raw = b"\x93NUMPY\x01\x00" + len(text).to_bytes(2, "little") + text + bytes(16)
        (tmp_path / f"{name}.npy").write_bytes(raw)
        with pytest.raises(af.BadInput, match="shape") as info:
            af.read_npy(tmp_path / f"{name}.npy").to_list()
        assert info.value.path == str(tmp_path / f"{name}.npy")
    (tmp_path / "ok.npy").write_bytes(good)
    files = af.list_files(str(tmp_path / "*.npy"))
    with files.flat_map(lambda f: af.read_npy(f, on_error="skip")).iter() as it:
        assert [a.tolist() for a in it] == [[0.0] * 4]
        assert sum(s.errors_skipped for s in it.stats()) == 2


def test_files_that_share_a_header_parse_it_once(tmp_path, monkeypatch):
    from aioflow.io import npy

    getattr(npy, "_HEADERS", {}).clear()  # (headers other tests read)
    parsed = []
    real = npy._literal
    monkeypatch.setattr(npy, "_literal", lambda text: parsed.append(text) or real(text))
    for i in range(20):
        np.save(tmp_path / f"{i:02}.npy", np.full((2, 3), i, dtype=np.int16))
    np.save(tmp_path / "other.npy", np.zeros(5))
    got = af.list_files(str(tmp_path / "*.npy")).interleave(af.read_npy, cycle_length=2).to_list()
    assert [a[0, 0] for a in got[:20]] == list(range(20)) and got[20].tolist() == [0.0] * 5
    assert len(parsed) == 2  # one header per kind of file, not per file
    # a bad header is never kept: each file that has it fails on its own
    bad = (tmp_path / "00.npy").read_bytes().replace(b"'shape': (2, 3)", b"'shape': (2, x)")
    (tmp_path / "bad.npy").write_bytes(bad)
    for _ in range(2):
        with pytest.raises(af.BadInput, match="header"):
            af.read_npy(tmp_path / "bad.npy").to_list()


DTYPES = [
    np.dtype([("a", "<i4"), ("b", "<f8", (2, 3))]),
    np.dtype([("outer", [("x", "u1"), ("y", ">c16")]), ("s", "S3"), ("u", "<U2")]),
    np.dtype([('it\'s "q" é', "<i2")]),
    np.dtype("<M8[ms]"),
    np.dtype({"names": ["a", "b"], "formats": ["<i4", "<i2"], "offsets": [0, 8], "itemsize": 12}),
]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_headers_numpy_writes_parse_as_numpy_reads_them(tmp_path, dtype):
    want = np.zeros((2, 1), dtype=dtype)
    path = tmp_path / "a.npy"
    np.save(path, want)
    (got,) = af.read_npy(path).to_list()
    assert got.dtype == np.load(path).dtype and got.shape == (2, 1)
    assert got.tobytes() == want.tobytes()


def test_headers_parsed_in_many_threads_at_once_never_trip_the_ast_race():
    # CPython 3.11's AST constructor keeps its recursion depth in state shared by threads:
    # ast.literal_eval in threads at different stack depths, with a thread switch inside
    # (here: finalizers that sleep during a GC), fails with "recursion depth mismatch".
    import gc
    import time
    from concurrent.futures import ThreadPoolExecutor

    from aioflow.io.npy import parse_npy

    data = save_bytes(np.zeros(3, dtype=[("a", "<i4"), ("b", "<f8", (2,)), ("c", "S2")]))

    class Yields:
        def __init__(self) -> None:
            self.me = self  # a cycle: freed by the GC, which runs __del__ mid-allocation

        def __del__(self) -> None:
            time.sleep(0)

    def at_depth(n: int) -> object:
        if n:
            return at_depth(n - 1)
        Yields()
        return parse_npy(io.BytesIO(data), "x.npy").shape

    old = gc.get_threshold()
    gc.set_threshold(20)
    try:
        with ThreadPoolExecutor(4) as ex:
            shapes = list(ex.map(at_depth, [i % 40 for i in range(8000)]))
    finally:
        gc.set_threshold(*old)
    assert shapes == [(3,)] * 8000


@pytest.mark.parametrize(
    "text",
    [
        "{'descr': '<f4', 'fortran_order': False, 'shape': (3, 4), }",
        "{'descr': [('a', '<i4'), ('b', '|S2', (2,))], 'fortran_order': True, 'shape': ()}",
        r"""{'descr': [('\x00\u00e9\'"\n\\', '<i4')], 'shape': (1,), 'x': None}""",
        '{"descr": "<f8", "shape": (7), "fortran_order": False}',
        "[[], (), {}, (1,), -5]",
    ],
)
def test_the_header_parser_agrees_with_literal_eval(text):
    import ast

    from aioflow.io.npy import _literal

    assert _literal(text) == ast.literal_eval(text)


@pytest.mark.parametrize("text", ["{'a': 1", "{'a' 1}", "(1 2)", "[1,,]", "x", "{'a': 1} 2"])
def test_the_header_parser_refuses_what_is_not_a_literal(text):
    from aioflow.io.npy import _literal

    with pytest.raises((ValueError, IndexError, KeyError)):
        _literal(text)


# -- read in batches by an interleave ---------------------------------------------------
def _npy_files(tmp_path: Path, n: int, bad: tuple[int, ...] = ()) -> af.Pipeline[str]:
    for i in range(n):
        data = save_bytes(np.full(4, i, dtype=np.int16))
        (tmp_path / f"{i:03d}.npy").write_bytes(data[:-1] if i in bad else data)
    return af.list_files(str(tmp_path / "*.npy"))


@pytest.mark.parametrize("concurrency", [None, 1, 4, 16])
def test_interleave_of_read_npy_gives_every_file_in_input_order(tmp_path, no_leaks, concurrency):
    files = _npy_files(tmp_path, 300)
    p = files.interleave(af.read_npy, cycle_length=4, concurrency=concurrency)
    with p.iter() as it:
        got = [int(a[0]) for a in it]
        st = it.stats()
    assert got == list(range(300))
    (row,) = [s for s in st if s.name.endswith("> read_npy")]  # counted as opened ones are
    assert row.items_out == 300


@pytest.mark.parametrize("concurrency", [None, 4])
def test_a_bad_file_among_batched_reads_fails_or_skips_as_alone(tmp_path, no_leaks, concurrency):
    files = _npy_files(tmp_path, 40, bad=(7, 30))
    skip = files.interleave(
        lambda f: af.read_npy(f, on_error="skip"), cycle_length=4, concurrency=concurrency
    )
    with skip.iter() as it:
        got = [int(a[0]) for a in it]
        skipped = sum(s.errors_skipped for s in it.stats())
    assert got == [i for i in range(40) if i not in (7, 30)] and skipped == 2
    seen: list[int] = []
    with pytest.raises(af.BadInput, match="007.npy"):
        for a in files.interleave(af.read_npy, cycle_length=4, concurrency=concurrency):
            seen.append(int(a[0]))
    assert seen == list(range(7))  # the items before the bad file arrive first


def test_interleave_of_read_npy_makes_a_files_pipeline_only_when_its_read_fails(
    tmp_path, monkeypatch
):
    from aioflow.io import npy

    made: list[str] = []
    real = npy.reader
    monkeypatch.setattr(
        npy, "reader", lambda name, path, *a, **k: made.append(path) or real(name, path, *a, **k)
    )
    files = _npy_files(tmp_path, 50, bad=(20,))
    p = files.interleave(af.read_npy, cycle_length=4, concurrency=4)
    with pytest.raises(af.BadInput, match="020.npy"):
        p.to_list()
    # the first file's (its row in the stats), and the bad file's, which raises as alone
    assert [Path(m).name for m in made] == ["000.npy", "020.npy"]


def test_breaking_out_of_batched_reads_leaves_nothing_running(tmp_path, no_leaks):
    p = _npy_files(tmp_path, 200).interleave(af.read_npy, cycle_length=4, concurrency=4)
    for _ in range(3):
        for i, _a in enumerate(p):
            if i == 10:
                break


def test_batched_reads_resume_at_every_position(tmp_path):
    files = _npy_files(tmp_path, 60)

    def make() -> af.Pipeline[int]:
        p = files.interleave(af.read_npy, cycle_length=3, concurrency=5)
        return p.map(lambda a: int(a[0]))

    for k in (0, 1, 13, 59, 60):
        with make().iter() as it:
            head = [next(it) for _ in range(k)]
            state = it.state_dict()
        with make().iter(state=state) as rest:
            assert head + list(rest) == list(range(60))
