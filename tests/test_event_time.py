"""Event time: sort_by(max_delay=), window_by_time, sessions, watermarks; each against a
plain-Python model over random out-of-order streams, and against Polars."""

from __future__ import annotations

import datetime as dt
import threading

import pytest
from _event_streams import streams
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import aioflow as af

FAST = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def run(p):
    """(items, late count, watermarks after each item) of one run of ``p``."""
    out, wms = [], []
    with p.iter() as it:
        for x in it:
            out.append(x)
            wms.append(it.watermark())
        st_ = it.stats()
    late = sum(s.late for s in st_.stages)
    return out, late, wms


def shape(windows):
    return [(w.key, w.start, w.end, [e["i"] for e in w.items]) for w in windows]


# -- the models ---------------------------------------------------------------------------
def model_sort(events, d, on_late):
    buf, out, late, mx = [], [], 0, None
    for e in events:
        k = e["t"]
        if mx is not None and k < mx - d:
            late += 1
            if on_late == "emit":
                out.append(e)
            continue
        buf.append((k, e["i"], e))
        mx = k if mx is None else max(mx, k)
        ready = sorted(x for x in buf if x[0] <= mx - d)
        out += [x[2] for x in ready]
        buf = [x for x in buf if x[0] > mx - d]
    return out + [x[2] for x in sorted(buf)], late


def model_windows(events, size, slide, by, d, lateness, on_late):
    slide = slide or size
    wins, out, late, mx = {}, [], 0, None  # (key, start) -> (first i, items)

    def close(wm):
        due = sorted(
            (s0 + size, first, key, s0)
            for (key, s0), (first, _) in wins.items()
            if wm is None or s0 + size + lateness <= wm
        )
        for end, _, key, s0 in due:
            out.append((key, s0, end, [x["i"] for x in wins.pop((key, s0))[1]]))

    for e in events:
        t, key = e["t"], (e["k"] if by else None)
        base = t - t % slide
        starts = [base - j * slide for j in range(size // slide + 2)]
        starts = [s for s in starts if s <= t < s + size]
        if not starts:
            continue
        wm = None if mx is None else mx - d
        if wm is not None and max(starts) + size + lateness <= wm:
            late += 1
            if on_late == "emit":
                out.append((key, max(starts), max(starts) + size, [e["i"]]))
            continue
        for s in starts:
            if wm is None or s + size + lateness > wm:
                wins.setdefault((key, s), (e["i"], []))[1].append(e)
        if mx is None or t > mx:
            mx = t
            close(mx - d)
    close(None)
    return out, late


def model_sessions(events, gap, d, max_duration, max_items, on_late, max_keys=None):
    open_, out, late, mx = [], [], 0, None  # sessions: dict(key, start, last, first, items)
    evicted = [0]

    def emit(s):
        open_.remove(s)
        out.append((s["key"], s["start"], s["last"] + gap, [x["i"] for x in s["items"]]))

    for e in events:
        t, key = e["t"], e["k"]
        if mx is None or t > mx:
            mx = t
            for s in sorted(
                (s for s in open_ if s["last"] + gap <= mx - d),
                key=lambda s: (s["last"] + gap, s["first"]),
            ):
                emit(s)
        wm = mx - d
        hits = [s for s in open_ if s["key"] == key and s["start"] - gap < t < s["last"] + gap]
        if hits and max_duration is not None:
            lo = min([t] + [s["start"] for s in hits])
            hi = max([t] + [s["last"] for s in hits])
            if hi - lo >= max_duration:
                for s in sorted(hits, key=lambda s: (s["last"], s["first"])):
                    emit(s)
                hits = []
        if not hits:
            if wm is not None and t < wm:
                late += 1
                if on_late == "emit":
                    out.append((key, t, t + gap, [e["i"]]))
                continue
            if max_keys is not None and all(o["key"] != key for o in open_):
                while len({o["key"] for o in open_}) >= max_keys:
                    emit(min(open_, key=lambda o: (o["last"] + gap, o["first"])))
                    evicted[0] += 1
            s = {"key": key, "start": t, "last": t, "first": e["i"], "items": [e]}
            open_.append(s)
        else:
            s = min(hits, key=lambda s: s["first"])
            for o in hits:
                if o is not s:
                    open_.remove(o)
                    s["items"] = sorted(s["items"] + o["items"], key=lambda x: x["i"])
                    s["start"], s["last"] = min(s["start"], o["start"]), max(s["last"], o["last"])
            s["items"].append(e)
            s["start"], s["last"] = min(s["start"], t), max(s["last"], t)
        if max_items is not None and len(s["items"]) >= max_items:
            emit(s)
    for s in sorted(open_, key=lambda s: (s["last"] + gap, s["first"])):
        emit(s)
    return out, late, evicted[0]


# -- sort_by(max_delay=) ------------------------------------------------------------------
@FAST
@given(streams(), st.integers(0, 10), st.sampled_from(["emit", "drop"]))
def test_sort_by_max_delay_equals_the_model_and_its_watermark_never_runs_ahead(s, d, on_late):
    events, jitter = s
    p = af.from_iterable(events).sort_by(lambda e: e["t"], max_delay=d, on_late=on_late)
    out, late, wms = run(p)
    want, want_late = model_sort(events, d, on_late)
    assert [e["i"] for e in out] == [e["i"] for e in want]
    assert late == want_late
    if d >= jitter:
        assert late == 0 and [e["t"] for e in out] == sorted(e["t"] for e in events)
    known = [w for w in wms if w is not None]
    assert known == sorted(known)  # never decreasing
    if on_late == "drop":  # never ahead of an item still to come
        for j, w in enumerate(wms):
            assert w is None or all(e["t"] >= w for e in out[j + 1 :])
    if events:
        assert wms[-1] == max(e["t"] for e in events)


def test_sort_by_max_delay_raises_late_item_at_the_first_late_item():
    p = af.from_iterable([5, 6, 9, 3, 10]).sort_by(lambda t: t, max_delay=2, on_late="raise")
    got = []
    with pytest.raises(af.LateItem) as info, p.iter() as it:
        got.extend(it)
    assert got == [5, 6]
    assert (info.value.key, info.value.last_key, info.value.position) == (3, 7, 3)


def test_sort_by_max_delay_refuses_buffer_size_reverse_and_a_negative_delay():
    for kw in ({"buffer_size": 3}, {"reverse": True}):
        with pytest.raises(af.PipelineError, match="max_delay"):
            af.range(3).sort_by(lambda x: x, max_delay=1, **kw)
    with pytest.raises(af.PipelineError, match="max_delay must be a number >= 0"):
        af.range(3).sort_by(lambda x: x, max_delay=-1)


def test_the_stats_show_each_event_time_stage_s_watermark_and_lag():
    p = af.from_iterable([{"t": t, "k": 0} for t in (1, 5, 3, 9)]).sort_by(
        lambda e: e["t"], max_delay=2
    )
    q = p.sessions("t", 3, by="k")
    with q.iter() as it:
        list(it)
        stats = it.stats()
    srt = stats["sort_by(max_delay=2)"]
    assert srt.watermark == 9 and srt.watermark_lag == 0  # the end: all out
    assert stats["sessions(3)"].watermark is not None
    assert "watermark 9, lag 0" in str(stats)


# -- window_by_time -----------------------------------------------------------------------
@FAST
@given(
    streams(),
    st.integers(1, 6),
    st.one_of(st.none(), st.integers(1, 8)),
    st.booleans(),
    st.integers(0, 8),
    st.integers(0, 4),
    st.sampled_from(["emit", "drop"]),
)
def test_window_by_time_equals_the_model(s, size, slide, by, d, lateness, on_late):
    events, jitter = s
    p = af.from_iterable(events).window_by_time(
        "t",
        size,
        slide=slide,
        by="k" if by else None,
        max_delay=d,
        allowed_lateness=lateness,
        on_late=on_late,
    )
    out, late, wms = run(p)
    want, want_late = model_windows(events, size, slide, by, d, lateness, on_late)
    assert shape(out) == want
    assert late == want_late
    known = [w for w in wms if w is not None]
    assert known == sorted(known)
    if on_late == "drop":  # every window still to come ends after the watermark
        for j, w in enumerate(wms):
            assert w is None or all(x.end > w for x in out[j + 1 :])
    if d >= jitter and slide is None:  # nothing late: the windows of the sorted data
        assert late == 0
        ideal = {}
        for e in events:
            ideal.setdefault((e["k"] if by else None, e["t"] // size * size), set()).add(e["i"])
        assert {(w.key, w.start): {e["i"] for e in w.items} for w in out} == ideal
        assert all(w.items for w in out)


def test_window_by_time_raises_at_a_late_item_and_checks_its_arguments():
    p = af.from_iterable([1, 12, 2]).window_by_time(lambda t: t, 5, on_late="raise")
    with pytest.raises(af.LateItem):
        p.to_list()
    with pytest.raises(af.PipelineError, match="size must be a number > 0"):
        af.range(3).window_by_time(lambda t: t, 0)
    with pytest.raises(af.PipelineError, match="on_late"):
        af.range(3).window_by_time(lambda t: t, 2, on_late="keep")
    with pytest.raises(af.PipelineError, match="column name"):
        af.range(3).window_by_time(3, 2)


# -- sessions -----------------------------------------------------------------------------
@FAST
@given(
    streams(),
    st.integers(1, 8),
    st.integers(0, 10),
    st.one_of(st.none(), st.integers(1, 20)),
    st.one_of(st.none(), st.integers(1, 6)),
    st.sampled_from(["emit", "drop"]),
    st.one_of(st.none(), st.integers(1, 3)),
)
def test_sessions_equal_the_model(s, gap, d, max_duration, max_items, on_late, max_keys):
    events, jitter = s
    p = af.from_iterable(events).sessions(
        lambda e: e["t"],
        gap,
        by=lambda e: e["k"],
        max_delay=d,
        max_duration=max_duration,
        max_items=max_items,
        on_late=on_late,
        max_keys=max_keys,
    )
    with p.iter() as it:
        out, wms = [], []
        for x in it:
            out.append(x)
            wms.append(it.watermark())
        stats = it.stats()
    late = sum(s.late for s in stats.stages)
    want, want_late, want_evicted = model_sessions(
        events, gap, d, max_duration, max_items, on_late, max_keys
    )
    assert shape(out) == want
    assert late == want_late
    assert sum(s.evicted for s in stats.stages) == want_evicted
    known = [w for w in wms if w is not None]
    assert known == sorted(known)
    if on_late == "drop":  # every session still to come ends after the watermark
        for j, w in enumerate(wms):
            assert w is None or all(x.end > w for x in out[j + 1 :])
    if d >= jitter and max_duration is None and max_items is None and max_keys is None:
        assert late == 0  # nothing late: the sessions of the sorted data, split by gap
        ideal = set()
        for k in {e["k"] for e in events}:
            ts = sorted(e["t"] for e in events if e["k"] == k)
            start = ts[0]
            for a, b in zip(ts, [*ts[1:], None], strict=True):
                if b is None or b - a >= gap:
                    ideal.add((k, start, a + gap))
                    start = b
        assert {(w.key, w.start, w.end) for w in out} == ideal


def test_an_idle_key_s_session_closes_when_the_stream_moves_on_not_at_the_end():
    def events():
        yield {"t": 0, "u": "idle"}
        for t in range(1, 100):
            yield {"t": t, "u": "busy"}

    with af.from_iterable(events).sessions("t", 5, by="u").iter() as it:
        first = next(it)
    assert (first.key, first.start, first.end) == ("idle", 0, 5)


def test_a_session_closes_at_max_items_and_at_max_duration():
    ev = [{"t": t, "u": 0} for t in range(10)]
    by_items = af.from_iterable(ev).sessions("t", 5, by="u", max_items=4).to_list()
    assert [len(w.items) for w in by_items] == [4, 4, 2]
    by_time = af.from_iterable(ev).sessions("t", 5, by="u", max_duration=3).to_list()
    assert [(w.start, len(w.items)) for w in by_time] == [(0, 3), (3, 3), (6, 3), (9, 1)]


# -- against Polars -----------------------------------------------------------------------
def _clicks(n=3000, seed=1, jitter=30):
    import numpy as np

    rng = np.random.default_rng(seed)
    t = np.cumsum(rng.integers(0, 7, n))
    users = rng.integers(0, 25, n)
    arrival = np.argsort(t + rng.integers(0, jitter + 1, n), kind="stable")
    return [{"t": int(t[i]), "user": int(users[i])} for i in arrival]


def test_sessions_and_tumbling_windows_equal_polars_on_the_same_clicks():
    pl = pytest.importorskip("polars")
    clicks, gap, size = _clicks(), 40, 100
    df = pl.DataFrame(clicks).sort(["user", "t"])
    sess = (
        df.with_columns(
            ((pl.col("t").diff().over("user") >= gap).fill_null(True).cum_sum().over("user")).alias(
                "sid"
            )
        )
        .group_by(["user", "sid"])
        .agg(pl.col("t").min().alias("start"), pl.col("t").max().alias("last"), pl.len())
    )
    want = {(r["user"], r["start"], r["last"] + gap, r["len"]) for r in sess.iter_rows(named=True)}
    got = af.from_iterable(clicks).sessions("t", gap, by="user", max_delay=30).to_list()
    assert {(w.key, w.start, w.end, len(w.items)) for w in got} == want

    tumbling = df.group_by(["user", (pl.col("t") // size * size).alias("start")]).agg(pl.len())
    want = {(r["user"], r["start"], r["len"]) for r in tumbling.iter_rows(named=True)}
    got = af.from_iterable(clicks).window_by_time("t", size, by="user", max_delay=30).to_list()
    assert {(w.key, w.start, len(w.items)) for w in got} == want
    assert all(w.end == w.start + size for w in got)


def test_sort_by_and_sessions_take_datetimes_with_timedelta_spans():
    base = dt.datetime(2024, 1, 1)
    ev = [base + dt.timedelta(seconds=s) for s in (3, 1, 2, 8, 30, 31)]
    srt = af.from_iterable(ev).sort_by(lambda t: t, max_delay=dt.timedelta(seconds=5))
    assert srt.to_list() == sorted(ev)
    ss = srt.sessions(lambda t: t, dt.timedelta(seconds=10), by=lambda t: 0).to_list()
    assert [(w.start, len(w.items)) for w in ss] == [(ev[1], 4), (ev[4], 2)]


@pytest.mark.parametrize(
    "op",
    [
        lambda p, f: p.sort_by(f, max_delay=2),
        lambda p, f: p.window_by_time(f, 4, by=lambda x: x % 2),
        lambda p, f: p.sessions(f, 3, by=lambda x: x % 2),
        lambda p, f: p.asof_join(af.range(20), on=f),
    ],
    ids=["sort_by", "window_by_time", "sessions", "asof_join"],
)
def test_a_failing_time_function_raises_itself_with_the_stage_and_position(op):
    def time(x):
        if x == 12:
            raise KeyError("no time")
        return x

    with pytest.raises(KeyError) as info:
        op(af.range(30), time).to_list()
    assert any("at item 12" in n for n in info.value.__notes__)


async def test_the_async_iterator_has_the_watermark_too_through_a_batch():
    p = af.from_iterable(range(0, 3000, 3)).sort_by(lambda t: t, max_delay=10).batch(8)
    seen = []
    async with p.aiter() as it:
        assert it.watermark() is None
        async for b in it:
            seen.append((int(b[-1]), it.watermark()))
    assert all(w is None or w <= last for last, w in seen)  # never ahead of what came
    assert seen[-1][1] == 2997


# each holds every item after the first output (a key that never closes, a join whose right
# watermark never passes the left): after a break it is still reading, emitting nothing
HOLD_ALL = {
    "sessions": lambda p: p.sessions(lambda x: x, 4, by=lambda x: x == 0),
    "window_by_time": lambda p: p.window_by_time(
        lambda x: 0 if x == 0 else 10 + x % 2, 5, by=lambda x: x == 0
    ),
    "sort_by-max_delay": lambda p: p.sort_by(lambda x: 0 if x == 0 else 10**9, max_delay=5),
    "asof_join": lambda p: af.range(10**7).asof_join(p.map(lambda x: 1), on=lambda x: x),
}


@pytest.mark.parametrize("op", HOLD_ALL.values(), ids=HOLD_ALL.keys())
def test_a_break_while_a_stage_reads_without_emitting_stops_it_at_once(op, no_leaks):
    n, busy = [0], threading.Event()

    def count(x):
        n[0] += 1
        if n[0] == 50_000:
            busy.set()
        return x

    with op(af.range(10**7).map(count)).iter() as it:
        next(it)
        assert busy.wait(30)  # the stage is well into its input, holding it all
    assert n[0] < 10**7  # the close did not wait for the stage to read its input
