"""Sliding ``window_by_time`` on record batches (``ops/columnar_sliding``) against its
per-item twin on the same rows; resumed anywhere; temporal, float and string columns."""

from __future__ import annotations

from datetime import datetime, timedelta

import numpy as np
import pyarrow as pa
import pytest
from _columnar import (
    FAST,
    batch_of,
    batched,
    flat,
    recut,
    resumed_anywhere,
    run,
    source,
    window_rows,
    windows_twin,
)
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import aioflow as af

#: size, slide (below, equal to and above size: gaps), by, max_delay, lateness, on_late
PARAMS = st.tuples(
    st.integers(1, 7),
    st.integers(1, 9) | st.just(0),  # 0: slide == size
    st.sampled_from(["k", None]),
    st.integers(0, 4),
    st.integers(0, 3),
    st.sampled_from(["drop", "emit"]),
)


#: as PARAMS, with spans small enough that rows are often late
LATE = st.tuples(
    st.integers(1, 3),
    st.integers(1, 4) | st.just(0),
    st.sampled_from(["k", None]),
    st.integers(0, 1),
    st.integers(0, 1),
    st.just("raise"),
)


def _sliding(p, params, on_late=None):
    size, slide, by, delay, ll, late = params
    return p.window_by_time(
        "t", size, slide=slide or size, by=by, max_delay=delay, allowed_lateness=ll,
        on_late=on_late or late,
    )  # fmt: skip


def _until_error(p):
    """What ``p`` gives before it fails, and the type of the failure (None: none)."""
    out = []
    try:
        for x in p:
            out.append(x)
    except af.LateItem as e:
        return out, type(e)
    return out, None


@FAST
@given(batched(), PARAMS, st.booleans())
def test_sliding_windows_of_batches_equal_the_per_item_windows(compact, data, params, ordered):
    got = windows_twin(lambda p: _sliding(p, params), data, ordered)
    assert all(isinstance(w.items, pa.RecordBatch | dict) for w in got)


@FAST
@given(batched(), LATE)
def test_a_late_row_raises_after_what_came_before_as_per_item(data, params):
    rows, batches, _, _ = data
    want, err = _until_error(_sliding(af.from_iterable(rows), params))
    got, got_err = _until_error(_sliding(source(batches), params))
    assert got_err is err
    assert flat(got) == window_rows(want)


@settings(
    max_examples=50,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(batched(), PARAMS, st.booleans(), st.data())
def test_sliding_windows_of_batches_resume_anywhere_exactly(compact, data, params, ordered, hd):
    rows, batches, _, kind = data
    if ordered:
        batches = recut(sorted(rows, key=lambda r: r["t"]), batches, kind)

    def make():
        return _sliding(source(batches), params)

    whole, got, _ = resumed_anywhere(make, hd)
    assert flat(got) == flat(whole)


def test_a_row_between_two_windows_is_in_none_and_does_not_move_the_watermark():
    """``slide > size``: t=4 falls between [0, 2) and [5, 7); it is in no window, is not
    late and does not move the watermark, so t=0 after it still joins [0, 2)."""
    rows = [{"t": t, "k": 0, "i": i, "v": 0.0} for i, t in enumerate([1, 4, 0])]
    want, late = run(af.from_iterable(rows).window_by_time("t", 2, slide=5))
    for kind in ("arrow", "dict"):
        bs = [batch_of(rows[:2], kind), batch_of(rows[2:], kind)]
        got, got_late = run(source(bs).window_by_time("t", 2, slide=5))
        assert flat(got) == window_rows(want)
        assert [(w["start"], w["end"], [r["t"] for r in w["items"]]) for w in flat(got)] == [
            (0, 2, [1, 0])
        ]
        assert got_late == late == 0


@pytest.mark.parametrize("kind", ["arrow", "dict"])
def test_sliding_windows_of_temporal_columns_take_timedelta_spans(kind):
    """A timestamp (Arrow) or datetime64 (dict) column with timedelta size and slide gives
    the windows of the same times as int milliseconds, as the column's scalars."""
    ms = [1_000, 2_500, 900, 7_000, 6_100, 12_000, 3_000]
    rows = [{"t": t, "k": i % 2, "i": i, "v": 0.0} for i, t in enumerate(ms)]
    kw = {"by": "k", "max_delay": 1_500, "on_late": "emit"}
    want, late = run(af.from_iterable(rows).window_by_time("t", 4_000, slide=1_500, **kw))
    ts = np.asarray(ms, "datetime64[ms]")
    if kind == "arrow":
        b = pa.record_batch({"t": pa.array(ts), "k": [r["k"] for r in rows], "i": range(len(ms))})
    else:
        b = {"t": ts, "k": np.asarray([r["k"] for r in rows]), "i": np.arange(len(ms))}
    kw["max_delay"] = timedelta(milliseconds=1_500)
    got, got_late = run(
        source([b]).window_by_time("t", timedelta(seconds=4), slide=timedelta(seconds=1.5), **kw)
    )
    assert got_late == late > 0

    def when(x):
        if kind == "arrow":
            return datetime(1970, 1, 1) + timedelta(milliseconds=x)
        return np.datetime64(x, "ms")

    assert [(w.key, w.start, w.end) for w in got] == [
        (w.key, when(w.start), when(w.end)) for w in want
    ]
    assert [r["i"] for w in flat(got) for r in w["items"]] == [
        r["i"] for w in want for r in w.items
    ]
    assert [len(w.items["i"]) for w in got] == [len(w.items) for w in want]


def _float_batch(rows, kind):
    if kind == "arrow":
        schema = pa.schema([("t", pa.float64()), ("k", pa.string()), ("i", pa.int64())])
        return pa.RecordBatch.from_pylist(rows, schema=schema)
    return {
        "t": np.asarray([r["t"] for r in rows], np.float64),
        "k": np.asarray([r["k"] for r in rows]),
        "i": np.asarray([r["i"] for r in rows], np.int64),
    }


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.integers(-30, 60), max_size=40),
    st.lists(st.integers(0, 12), max_size=10),
    st.sampled_from(["arrow", "dict"]),
    st.sampled_from([(0.7, 0.3), (0.3, 0.7), (1.0, 0.1), (0.5, 0.5)]),
    st.booleans(),
)
def test_float_times_and_string_keys_give_the_per_item_windows(tenths, cuts, kind, spans, by):
    """Float times (in tenths: starts from ``// slide * slide`` then ``- slide`` rounded
    as per item) and string keys (Arrow strings, numpy unicode)."""
    rows = [{"t": x / 10, "k": "ab"[x % 2], "i": i} for i, x in enumerate(tenths)]
    size, slide = spans
    kw = {"slide": slide, "by": "k" if by else None, "max_delay": 0.5, "on_late": "emit"}
    want, late = run(af.from_iterable(rows).window_by_time("t", size, **kw))
    batches, i = [], 0
    for n in [*cuts, len(rows)]:
        batches.append(_float_batch(rows[i : i + n], kind))
        i += n
    got, got_late = run(source(batches).window_by_time("t", size, **kw))
    assert flat(got) == window_rows(want)
    assert got_late == late
