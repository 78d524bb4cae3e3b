"""The columnar asof_join (record batches, column-name keys) against the per-item join on
the same rows, read in the same chunks; resumed anywhere; its columns and its errors."""

from __future__ import annotations

import pickle
from datetime import timedelta

import numpy as np
import pyarrow as pa
import pytest
from _columnar import batch_of, resumed_anywhere, rows_of, run
from _event_streams import streams
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import aioflow as af

FAST = settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
LEFT = ["t", "k", "i", "v"]


@st.composite
def cut(draw, events, kind):
    """``events`` as batches of 0..12 rows of ``kind`` (``v`` null at random for Arrow)."""
    for e in events:
        e["v"] = None if kind == "arrow" and draw(st.booleans()) else float(e["i"]) / 2
    out, i = [], 0
    while i < len(events) or draw(st.integers(0, 4)) == 0:
        n = draw(st.integers(0, 12))
        out.append(batch_of(events[i : i + n], kind))
        i += n
        if i >= len(events) and len(out) > 30:
            break
    return out


@st.composite
def sides(draw, max_n=50):
    """(left batches, right batches, kind, jitter): both out of order by up to jitter."""
    kind = draw(st.sampled_from(["arrow", "dict"]))
    left, jl = draw(streams(max_n=max_n))
    right, jr = draw(streams(max_n=max_n))
    return draw(cut(left, kind)), draw(cut(right, kind)), kind, max(jl, jr)


def one_per_chunk(items):
    """A source yielding one item per chunk (an async iterable: its chunks are its items)."""

    async def gen():
        for x in items:
            yield x

    return af.from_iterable(gen)


def rows_source(batches):
    """The batches' rows, a chunk per batch: the per-item twin reads what the join does."""
    return one_per_chunk([rows_of(b) for b in batches]).unbatch()


def pairs(outs, kind, by):
    """Output batches as the per-item join's pairs: (left row, right row or None)."""
    got = []
    for b in outs:
        for row in rows_of(b):
            a = {c: row[c] for c in LEFT}
            # (no right column: the right stream had no batch, its columns are unknown)
            hit = row["matched"] if kind == "dict" else row.get("t_right") is not None
            m = None
            if hit:
                m = {"t": row["t_right"], "i": row["i_right"], "v": row["v_right"]}
                m["k"] = a["k"] if by else row["k_right"]
            got.append((a, m))
    return got


def counted(p):
    """(output, (late, evicted)) of one run of ``p``."""
    with p.iter() as it:
        out = list(it)
        st = it.stats()["asof_join"]
    return out, (st.late, st.evicted)


def join(left, right, a):
    by, tol, delay, keys = a
    return left.asof_join(right, on="t", by=by, tolerance=tol, max_delay=delay, max_keys=keys)


def args(jitter):
    """asof_join's by, tolerance, max_delay (rows beyond it are late), max_keys."""
    return st.tuples(
        st.sampled_from(["k", None]),
        st.one_of(st.none(), st.integers(0, 6)),
        st.integers(0, jitter + 1) | st.just(0),
        st.sampled_from([None, None, 1, 2]),
    ).map(lambda a: a if a[0] else (*a[:3], None))


@FAST
@given(sides(), st.data())
def test_columnar_asof_join_equals_the_per_item_join(data, hd):
    lb, rb, kind, jitter = data
    a = hd.draw(args(jitter))
    want, late = counted(join(rows_source(lb), rows_source(rb), a))
    got, got_late = counted(join(one_per_chunk(lb), one_per_chunk(rb), a))
    assert pairs(got, kind, a[0]) == want
    assert got_late == late  # (late, evicted)
    # one batch per left batch with rows, of its rows, of the left's kind
    assert [[r["i"] for r in rows_of(b)] for b in got] == [
        [r["i"] for r in rows_of(b)] for b in lb if rows_of(b)
    ]
    assert all(isinstance(b, dict if kind == "dict" else pa.RecordBatch) for b in got)
    if a[3] is None:  # the pairs do not depend on the chunks read (the late counts may)
        many, _ = run(join(af.from_iterable(lb), af.from_iterable(rb), a))
        assert pairs(many, kind, a[0]) == want


@FAST
@given(sides(max_n=60), st.data(), st.booleans())
def test_columnar_asof_join_resumes_anywhere_exactly(data, hd, rows):
    lb, rb, _, jitter = data
    by, tol, delay, keys = hd.draw(args(jitter))
    # max_keys as many as the keys: the exact path, but no eviction (with evictions, which
    # rows miss their match depends on how the inputs were read: a resumed run reads them
    # from where they were, in other chunks, per item as columnar)
    a = (by, tol, delay, keys and 3)

    def make():
        p = join(af.from_source(lb), af.from_source(rb), a)
        return p.unbatch() if rows else p  # (rows: states in the middle of a batch)

    whole, got, state = resumed_anywhere(make, hd)
    assert state["nodes"] is not None
    if rows:
        assert _same(got, whole)
    else:
        assert _same([r for b in got for r in rows_of(b)], [r for b in whole for r in rows_of(b)])


def _same(xs, ys):
    """Rows equal, NaN equal to NaN (a dict batch's unmatched float columns)."""

    def norm(r):
        return {c: "nan" if isinstance(v, float) and v != v else v for c, v in r.items()}

    def as_row(r):
        return norm({c: (v.item() if isinstance(v, np.generic) else v) for c, v in r.items()})

    return [as_row(r) for r in xs] == [as_row(r) for r in ys]


def test_the_columns_of_a_join_of_arrow_batches():
    trades = pa.record_batch({"t": [2, 5, 6], "sym": ["x", "x", "y"], "qty": [1, 2, 3]})
    quotes = pa.record_batch(
        {"t": [1, 4, 6, 7], "sym": ["x", "x", "x", "y"], "px": [10.0, None, 12.0, 5.0]}
    )
    (out,) = (
        af.from_iterable([trades]).asof_join(af.from_iterable([quotes]), on="t", by="sym").to_list()
    )
    assert out.schema.names == ["t", "sym", "qty", "t_right", "px"]
    assert out.column("px").type == pa.float64()
    # a match whose value is null (t 5 -> t 4) and no match (y at 6: its quote is at 7)
    assert out.column("t_right").to_pylist() == [1, 4, None]
    assert out.column("px").to_pylist() == [10.0, None, None]


def test_the_columns_of_a_join_of_numpy_dicts():
    left = {"t": np.array([2, 5, 6]), "k": np.array([0, 0, 1]), "matched": np.ones(3, bool)}
    right = {
        "t": np.array([1, 4, 9]),
        "k": np.array([0, 0, 1]),
        "n": np.array([7, 8, 9]),
        "x": np.array([0.5, 1.5, 2.5]),
        "s": np.array(["a", "b", "c"]),
        "e": np.arange(6.0).reshape(3, 2),  # (a column of vectors)
    }
    (out,) = af.from_iterable([left]).asof_join(af.from_iterable([right]), on="t", by="k").to_list()
    assert list(out) == ["t", "k", "matched", "t_right", "n", "x", "s", "e", "matched_right"]
    assert out["matched_right"].tolist() == [True, True, False]
    assert out["n"].dtype == right["n"].dtype and out["n"].tolist()[:2] == [7, 8]
    assert np.isnan(out["x"][2]) and out["s"].tolist() == ["a", "b", ""]
    assert out["e"].shape == (3, 2) and out["e"][1].tolist() == [2.0, 3.0]
    assert np.isnan(out["e"][2]).all()


def test_times_of_different_units_and_a_timedelta_tolerance():
    ms = np.array(["2024-01-01T00:00:01", "2024-01-01T00:00:09"], "datetime64[ms]")
    us = np.array(["2024-01-01T00:00:00", "2024-01-01T00:00:02"], "datetime64[us]")
    left = pa.record_batch({"ts": pa.array(ms), "a": [1, 2]})
    right = pa.record_batch({"ts": pa.array(us), "b": [10, 20]})
    p = af.from_iterable([left]).asof_join(
        af.from_iterable([right]), on="ts", tolerance=timedelta(seconds=5)
    )
    (out,) = p.to_list()
    assert out.column("b").to_pylist() == [10, None]  # 9 s is 7 s after the last quote
    with p.iter() as it:
        list(it)
        assert it.watermark() == np.datetime64("2024-01-01T00:00:09", "ms")


def test_mismatched_kinds_and_a_missing_column_are_refused_clearly():
    b = batch_of([{"t": 1, "k": 0, "i": 0, "v": 1.0}], "arrow")
    rows = [{"t": 0, "k": 0}]
    with pytest.raises(af.PipelineError, match="right one must be"):
        af.from_iterable([b]).asof_join(af.from_iterable(rows), on="t").to_list()
    d = batch_of([{"t": 0, "k": 0, "i": 0, "v": 1.0}], "dict")
    with pytest.raises(af.PipelineError, match="right one must be"):
        af.from_iterable([b]).asof_join(af.from_iterable([d]), on="t").to_list()
    with pytest.raises(af.PipelineError, match="but the left stream's are not"):
        af.from_iterable(rows).asof_join(af.from_iterable([b]), on="t").to_list()
    with pytest.raises(af.PipelineError, match="no column 'u'"):
        af.from_iterable([b]).asof_join(af.from_iterable([b]), on="t", by="u").to_list()
    clash = pa.record_batch({"t": [1], "t_right": [1]})
    with pytest.raises(af.PipelineError, match="twice"):
        af.from_iterable([clash]).asof_join(af.from_iterable([b]), on="t").to_list()


def test_a_function_key_keeps_the_per_item_path():
    bs = [batch_of([{"t": t, "k": 0, "i": t, "v": 1.0}], "arrow") for t in (1, 4, 6)]
    out = (
        af.from_iterable(bs)
        .asof_join(af.from_iterable(bs[:2]), on=lambda b: b.column("t")[0].as_py())
        .to_list()
    )
    assert [(a is bs[i], b is bs[min(i, 1)]) for i, (a, b) in enumerate(out)] == [(True, True)] * 3


def test_a_columnar_join_holds_only_the_right_rows_that_may_still_match(held_logs):
    n, size = 20_000, 500
    lt = np.arange(n)
    left = [{"t": lt[i : i + size], "k": lt[i : i + size] % 50} for i in range(0, n, size)]
    rt = np.arange(0, n, 2)
    right = [
        {"t": rt[i : i + size], "k": rt[i : i + size] % 7000, "v": rt[i : i + size]}
        for i in range(0, len(rt), size)
    ]
    p = one_per_chunk(left).asof_join(one_per_chunk(right), on="t", by="k", tolerance=100)
    most = [0, 0]
    with p.iter() as it:
        for _ in it:
            (log,) = held_logs
            with log.lock:
                held = log.held()
            rows = [sum(len(piece[-1][2]) for piece in side) for side in held]
            most = [max(a, b) for a, b in zip(most, rows, strict=True)]
    # a left batch waiting; the right rows within tolerance and the batch read ahead, not
    # one per key of the 7000
    assert most[0] <= size and most[1] < 2 * size, most


@pytest.mark.parametrize("max_keys", [None, 5])
def test_a_late_row_waiting_in_a_state_stays_late_when_resumed(max_keys):
    # the state in the middle of the second output holds the left batch [10, 2] as it was
    # before it came out: 10 waiting for the right watermark, 2 (below the left watermark
    # 10) late behind it: resumed, 2 pairs with None still (not with the right's 2)
    def b(ts):
        return pa.record_batch({"t": ts})

    def make():
        left = af.from_source([b([0]), b([10, 2])])
        right = af.from_source([b([1]), b([2]), b([20])])
        return left.asof_join(right, on="t", max_keys=max_keys).unbatch()

    want = [None, 2, None]
    assert [r["t_right"] for r in make()] == want
    with make().iter() as it:
        head = [next(it), next(it)]  # (the join has made its second batch)
        state = pickle.loads(pickle.dumps(it.state_dict()))
    (at,) = [v["at"] for v in state["nodes"].values() if "lates" in (v or {}).get("at", {})]
    assert at["lates"] == [1]  # (the state meant)
    with make().iter(state=state) as it:
        rest = list(it)
    assert [r["t_right"] for r in head + rest] == want


@pytest.mark.parametrize("kind", ["arrow", "dict"])
def test_string_keys_join_as_per_item(kind):
    rng = np.random.default_rng(5)
    lt, rt = np.sort(rng.integers(0, 200, 300)), np.sort(rng.integers(0, 200, 300))
    syms = np.array(["ab", "c", "de", "f"])
    left = {"t": lt, "sym": syms[rng.integers(0, 4, 300)], "i": np.arange(300)}
    right = {"t": rt, "sym": syms[rng.integers(0, 4, 300)], "j": np.arange(300)}

    def cut(d):
        parts = [{c: v[a : a + 37] for c, v in d.items()} for a in range(0, 300, 37)]
        return [pa.record_batch(p) for p in parts] if kind == "arrow" else parts

    got = join(one_per_chunk(cut(left)), one_per_chunk(cut(right)), ("sym", 3, 0, None))
    want = join(rows_source(cut(left)), rows_source(cut(right)), ("sym", 3, 0, None))
    rows = [r for b in got.to_list() for r in rows_of(b)]
    hit = [r["matched"] if kind == "dict" else r["j"] is not None for r in rows]
    assert [(r["i"], r["j"] if h else None) for r, h in zip(rows, hit, strict=True)] == [
        (a["i"], b and b["j"]) for a, b in want.to_list()
    ]
    assert sum(hit) > 100


@FAST
@given(sides(), st.sampled_from(["k", None]), st.booleans())
def test_the_watermark_of_a_columnar_join_never_decreases_nor_passes_a_row_to_come(data, by, keys):
    lb, rb, _, jitter = data  # (max_delay = jitter: no row is late)
    p = join(one_per_chunk(lb), one_per_chunk(rb), (by, None, jitter, 2 if keys and by else None))
    outs, wms = [], []
    with p.iter() as it:
        for b in it:
            outs.append([r["t"] for r in rows_of(b)])
            wms.append(it.watermark())
    known = [w for w in wms if w is not None]
    assert known == sorted(known)
    for j, w in enumerate(wms):
        assert w is None or all(t >= w for ts in outs[j + 1 :] for t in ts)
