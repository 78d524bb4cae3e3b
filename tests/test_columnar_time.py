"""The columnar sort_by and sessions against their per-item twins on the same rows; every
columnar machine (group_by too) resumed anywhere."""

from __future__ import annotations

import pickle
import time

import numpy as np
import pyarrow as pa
import pytest
from _columnar import (
    FAST,
    batch_of,
    batched,
    flat,
    resumed_anywhere,
    run,
    source,
    window_rows,
    windows_twin,
)
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import aioflow as af

SORTS = {
    "max_delay": lambda p, a: p.sort_by("t", max_delay=a % 6, on_late=("drop", "emit")[a % 2]),
    "buffer_size": lambda p, a: p.sort_by(
        "t", buffer_size=a % 7 + 1, reverse=a % 3 == 0, on_late=("drop", "emit")[a % 2]
    ),
}


def _sessions(p, a):
    return p.sessions(
        "t",
        a % 4 + 1,
        by="k",
        max_delay=a % 5,
        max_items=(None, 4)[a % 2 == 1 and a > 5],
        max_duration=(None, 7)[a % 5 == 0],
        on_late=("drop", "emit")[a % 2],
        max_keys=(None, 2)[a % 7 == 3],
    )


@FAST
@given(batched(), st.sampled_from(sorted(SORTS)), st.integers(0, 20))
def test_columnar_sort_by_equals_the_per_item_sort(compact, data, mode, a):
    rows, batches, _, _ = data
    want, late = run(SORTS[mode](af.from_iterable(rows), a))
    got, got_late = run(SORTS[mode](source(batches), a))
    assert flat(got) == want
    assert got_late == late
    assert all(not isinstance(b, list) for b in got)


@FAST
@given(batched(), st.integers(0, 30), st.booleans())
def test_columnar_sessions_equal_the_per_item_sessions(compact, data, a, ordered):
    windows_twin(lambda p: _sessions(p, a), data, ordered)


def _windows(p, a):
    return p.window_by_time(
        "t", a % 5 + 2, by=("k", None)[a % 3 == 0], max_delay=a % 4,
        allowed_lateness=a % 3, on_late=("drop", "emit")[a % 2],
    )  # fmt: skip


@FAST
@given(batched(), st.integers(0, 30), st.booleans())
def test_columnar_windows_equal_the_per_item_windows(compact, data, a, ordered):
    windows_twin(lambda p: _windows(p, a), data, ordered)


def test_sliding_windows_of_batches_are_windows_of_batches():
    """Sliding windows of batches were refused (``af.PipelineError``); each window's
    ``items`` is now a batch of its rows (``tests/test_columnar_sliding.py``: the twin)."""
    rows = [{"t": t, "k": 0, "i": i, "v": 1.0} for i, t in enumerate([1, 2, 5])]
    out = source([batch_of(rows, "arrow")]).window_by_time("t", 4, slide=2).to_list()
    assert all(isinstance(w.items, pa.RecordBatch) for w in out)
    assert [(w.start, w.end, w.items["t"].to_pylist()) for w in out] == [
        (-2, 2, [1]),
        (0, 4, [1, 2]),
        (2, 6, [2, 5]),
        (4, 8, [5]),
    ]


@FAST
@given(batched(), st.integers(0, 20))
def test_sort_then_sessions_on_batches_equals_per_item(data, a):
    rows, batches, jitter, _ = data

    def job(p):
        return p.sort_by("t", max_delay=jitter).sessions("t", a % 5 + 1, by="k")

    want, late = run(job(af.from_iterable(rows)))
    got, got_late = run(job(source(batches)))
    assert flat(got) == window_rows(want)
    assert got_late == late == 0


def test_late_rows_are_counted_and_raise_as_for_items():
    rows = [{"t": t, "k": 0, "i": i, "v": 0.0} for i, t in enumerate([5, 9, 1, 10, 2])]
    b = [batch_of(rows[:2], "arrow"), batch_of(rows[2:], "arrow")]
    got, late = run(source(b).sort_by("t", max_delay=2, on_late="drop"))
    assert [r["t"] for r in flat(got)] == [5, 9, 10] and late == 2
    with pytest.raises(af.LateItem):
        source(b).sort_by("t", max_delay=2, on_late="raise").to_list()
    with pytest.raises(af.LateItem):
        source(b).sessions("t", 1, by="k", on_late="raise").to_list()


@pytest.mark.parametrize("kind", ["arrow", "dict"])
def test_sessions_merged_by_a_row_keep_their_rows_in_arrival_order(kind):
    # t=0 and t=3 open two sessions (gap 3), the second t=0 joins the first; t=1 in the
    # next batch bridges them: the merged session's items are in arrival order, 0 1 2 3
    # (hypothesis found the columnar one gave 0 2 1 3: the held rows session after session)
    rows = [{"t": t, "k": 0, "i": i, "v": 0.0} for i, t in enumerate([0, 3, 0, 1])]
    b = [batch_of(rows[:3], kind), batch_of(rows[3:], kind)]
    make = lambda p: p.sessions("t", 3, by="k", max_delay=2, on_late="emit")  # noqa: E731
    want, _ = run(make(af.from_iterable(rows)))
    got, _ = run(make(source(b)))
    assert [r["i"] for r in flat(got)[0]["items"]] == [0, 1, 2, 3]
    assert flat(got) == window_rows(want)


def test_sessions_of_batches_are_windows_of_batches_and_keep_types():
    ts = np.array(
        ["2024-01-01T00:00:00", "2024-01-01T00:00:10", "2024-01-01T00:02:00"], "datetime64[ms]"
    )
    b = pa.record_batch({"ts": pa.array(ts), "user": ["a", "a", "a"], "x": [1, None, 3]})
    from datetime import datetime, timedelta

    outs = source([b]).sessions("ts", timedelta(seconds=30), by="user").to_list()
    assert [type(w) for w in outs] == [af.Window, af.Window]
    assert all(isinstance(w.items, pa.RecordBatch) for w in outs)
    assert [w.items.schema for w in outs] == [b.schema] * 2
    assert [w.items.num_rows for w in outs] == [2, 1] and outs[0].items["x"][1].as_py() is None
    assert outs[0].key == "a" and outs[0].start == datetime(2024, 1, 1)
    assert outs[0].end - outs[0].start == timedelta(seconds=40)
    d = {"ts": ts, "user": np.array(["a", "a", "a"]), "x": np.arange(3.0)}
    out = source([d]).sessions("ts", timedelta(seconds=30), by="user").to_list()
    assert [w.key for w in out] == ["a", "a"] and out[0].items["x"].tolist() == [0, 1]
    assert out[0].end - out[0].start == np.timedelta64(40, "s")


def test_a_windows_items_share_the_memory_of_one_batch():
    rows = [{"t": t, "k": t % 2, "i": t, "v": 1.0} for t in range(10)]
    out = source([batch_of(rows, "arrow")]).sessions("t", 100, by="k").to_list()
    assert [w.items["i"].to_pylist() for w in out] == [[0, 2, 4, 6, 8], [1, 3, 5, 7, 9]]
    bufs = {w.items.column(2).buffers()[1].address for w in out}
    assert len(bufs) == 1  # slices of one gathered batch


def test_a_function_key_keeps_the_per_item_path():
    rows = [{"t": t, "k": 0, "i": 0, "v": 1.0} for t in range(6)]
    bs = [batch_of(rows[:3], "arrow"), batch_of(rows[3:4], "arrow"), batch_of(rows[4:], "arrow")]
    out = source(bs).sort_by(lambda b: b.num_rows, buffer_size=3).to_list()
    assert [id(b) for b in out] == [id(bs[1]), id(bs[2]), id(bs[0])]  # whole batches, as items


def test_a_row_after_batches_is_refused_clearly():
    b = batch_of([{"t": 1, "k": 0, "i": 0, "v": 1.0}], "arrow")
    with pytest.raises(af.PipelineError, match="columnar"):
        source([b, {"t": 2, "k": 0}]).sort_by("t", max_delay=1).to_list()


def _group_by(p, a):
    return p.group_by("k", size=(None, a % 4 + 1)[a % 3 != 0], max_keys=(None, 2)[a % 2])


def _resample(p, a):
    initial = (None, [0.5, 0.3, 0.2])[a % 2]
    return p.rejection_resample("k", [0.2, 0.3, 0.5], initial_dist=initial, seed=a)


OPS = {
    **SORTS,
    "sessions": _sessions,
    "group_by": _group_by,
    "window_by_time": _windows,
    "rejection_resample": _resample,
}


@settings(
    max_examples=50,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(batched(), st.sampled_from(sorted(OPS)), st.integers(0, 20), st.data())
def test_columnar_operators_resume_anywhere_exactly(compact, data, op, a, hd):
    _, batches, _, _ = data
    src = af.from_source if hd.draw(st.booleans()) else source  # (chunks of 1, 2, ...: marks)

    def make():
        return OPS[op](src(batches), a)

    whole, got, _ = resumed_anywhere(make, hd)
    assert flat(got) == flat(whole)


def test_sorted_batches_resume_past_the_number_of_input_batches():
    """The rows of 3 batches sorted by a column come out as 4 batches (one per buffer
    release): a state after the 4th was refused ("position 4 beyond the epoch's 3
    items"), the sort's count taken for its input's."""

    def rows(lo, hi):
        i = np.arange(lo, hi)
        return {"t": np.zeros(hi - lo, dtype=np.int64), "i": i}

    def make():
        return af.from_iterable([rows(0, 5), rows(5, 30), rows(30, 55)]).sort_by(
            "t", buffer_size=1, reverse=True
        )

    whole = make().to_list()
    assert len(whole) == 4
    with make().iter() as it:
        head = [next(it) for _ in range(4)]
        state = it.state_dict()
    with make().iter(state=state) as it:
        rest = list(it)
    assert flat(head + rest) == flat(whole)


def _clicks(batches, rows=1000, seed=0):
    """``batches`` dict batches of clicks in time order: sessions of 50 keys."""
    rng = np.random.default_rng(seed)
    for b in range(batches):
        t = np.sort(rng.integers(0, 10 * rows, rows)) + b * 10 * rows
        yield {"t": t, "k": rng.integers(0, 50, rows), "i": np.arange(b * rows, (b + 1) * rows)}


def _log_rows(log):
    """Rows in a held log's gone entries (a piece counts its rows, an item 1)."""
    from aioflow.ops.columnar import is_piece

    return sum(len(e[-1][2]) if is_piece(e[-1]) else 1 for g in log.gone for e in g)


def test_what_columnar_sessions_log_does_not_grow_with_the_stream(monkeypatch, held_logs):
    """The log of rows gone from a columnar stage (for states) was capped in entries, a
    piece of a batch's rows counting one: over a long stream it kept every row (RSS grew
    with N). It is capped in rows: here 2,000, whatever the stream's length."""
    from aioflow._state.held import HeldLog

    monkeypatch.setattr(HeldLog, "ROWS", 2_000, raising=False)
    logs = held_logs
    sizes, n = [], 0
    p = af.from_iterable(lambda: _clicks(300)).sessions("t", 1_000, by="k")
    with p.iter() as it:
        for i, w in enumerate(it):
            n += len(w.items["t"])
            if i % 100 == 0:
                (log,) = logs
                with log.lock:
                    sizes.append(_log_rows(log))
    assert n == 300_000
    assert len(sizes) > 100
    assert max(sizes) <= 2 * 2_000 + 4 * 1000, max(sizes)  # (the last chunk's rows too)


def test_a_state_further_back_than_the_columnar_log_still_resumes_exactly(monkeypatch):
    """A state asked for further back than the capped log reaches replays: exact."""
    from aioflow._state.held import HeldLog

    monkeypatch.setattr(HeldLog, "ROWS", 500, raising=False)

    def make():
        return af.from_iterable(lambda: _clicks(12, rows=300)).sessions("t", 1_000, by="k")

    whole = make().to_list()
    for k in (1, len(whole) // 2, len(whole) - 1):
        with make().iter() as it:
            head = [next(it) for _ in range(k)]
            state = pickle.loads(pickle.dumps(it.state_dict()))
        with make().iter(state=state) as it:
            rest = list(it)
        assert [w.items["i"].tolist() for w in head + rest] == [
            w.items["i"].tolist() for w in whole
        ]


@given(
    st.lists(st.integers(-(2**63), 2**63 - 1), max_size=300)
    | st.lists(st.integers(-5, 5), max_size=300)
    | st.lists(st.integers(0, 2**40), max_size=300),
    st.sampled_from(["int64", "int32", "uint8", "uint64", "bool"]),
)
@settings(max_examples=200, deadline=None)
def test_stable_order_is_a_stable_argsort(values, dtype):
    from aioflow.ops.columnar import stable_order

    info = np.iinfo(dtype) if dtype != "bool" else None
    if info is not None:
        values = [min(max(v, info.min), info.max) for v in values]
    a = np.asarray(values, dtype=dtype) if values else np.empty(0, dtype)
    assert stable_order(a).tolist() == np.argsort(a, kind="stable").tolist()
    assert stable_order(a[::2]).tolist() == np.argsort(a[::2], kind="stable").tolist()


def _threaded(monkeypatch):
    from aioflow.ops import event_time

    monkeypatch.setattr(event_time, "THREAD_ROWS", 0)


@pytest.mark.parametrize("how", ["break", "error", "raise late"])
def test_a_columnar_stage_in_a_thread_ends_cleanly(no_leaks, monkeypatch, how):
    """Batches taken in the run's threads, the next read ahead: an early break, an error
    upstream and a late row under on_late="raise" each end the run with no thread, task
    or file of it left, and the error is the stage's, after what came before it."""
    _threaded(monkeypatch)

    def batches():
        for i, b in enumerate(_clicks(40, rows=500)):
            if how == "error" and i == 20:
                raise ValueError("bad shard")
            if how == "raise late" and i == 20:
                b["t"] = b["t"] - 10**6
            yield b

    p = af.from_iterable(batches).sort_by("t", max_delay=0, on_late="raise")
    p = p.sessions("t", 1_000, by="k")
    got = []
    if how == "break":
        with p.iter() as it:
            for w in it:
                got.append(w)
                if len(got) == 50:
                    break
        assert len(got) == 50
        return
    want = af.LateItem if how == "raise late" else ValueError
    with pytest.raises(want):
        for w in p:
            got.append(w)
    assert got  # the sessions closed before the failure came first


async def test_a_columnar_stage_in_a_thread_is_cancelled_cleanly(no_leaks, monkeypatch):
    """The consumer's task cancelled while a batch is taken in a thread: the run waits
    for that batch, then ends; nothing of it is left."""
    import asyncio

    _threaded(monkeypatch)
    p = af.from_iterable(lambda: _clicks(400, rows=500)).sessions("t", 1_000, by="k")
    started = asyncio.Event()

    async def consume():
        async for _ in p:
            started.set()

    task = asyncio.ensure_future(consume())
    await asyncio.wait_for(started.wait(), 30)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


def test_a_columnar_stage_in_a_thread_keeps_states_exact(monkeypatch):
    """States taken while batches are processed in a thread and read ahead resume to the
    same windows."""
    _threaded(monkeypatch)

    def make():
        return af.from_iterable(lambda: _clicks(30, rows=300)).sessions("t", 1_000, by="k")

    whole = [w.items["i"].tolist() for w in make()]
    for k in (1, len(whole) // 3, len(whole) - 1):
        with make().iter() as it:
            head = [next(it).items["i"].tolist() for _ in range(k)]
            state = pickle.loads(pickle.dumps(it.state_dict()))
        with make().iter(state=state) as it:
            assert head + [w.items["i"].tolist() for w in it] == whole


@pytest.mark.parametrize("kind", ["arrow", "dict"])
def test_a_state_behind_the_run_leaves_out_rows_that_came_after_its_mark(kind):
    """Rows that leave together (a closed session) may have come in several batches: a
    state whose mark is before the last of them (the run went on ahead of the consumer)
    holds only those that had come by then. Sessions (gap 20): X closes in batch 0, B in
    batch 1, and batch 2 closes A, whose rows came in batches 0 and 1, and B's second."""
    rows = [
        {"t": t, "k": k, "i": i, "v": 0.0}
        for i, (t, k) in enumerate([(-50, 2), (-5, 0), (-5, 1), (10, 0), (16, 1), (100, 0)])
    ]
    b = [batch_of(rows[:3], kind), batch_of(rows[3:5], kind), batch_of(rows[5:], kind)]

    def make():  # (from_source: a first chunk of one batch, then the others: two marks)
        return af.from_source(b).sessions("t", 20, by="k")

    whole = flat(make().to_list())
    assert [w["key"] for w in whole] == [2, 1, 0, 1, 0]  # x b a b a
    with make().iter() as it:
        head = [next(it)]
        deadline = time.monotonic() + 60
        while it.stats().stages[-1].items_out < len(whole):  # the run is ahead, at its end
            assert time.monotonic() < deadline
            time.sleep(0.005)
        state = pickle.loads(pickle.dumps(it.state_dict()))
    with make().iter(state=state) as it:
        rest = list(it)
    assert flat(head + rest) == whole
