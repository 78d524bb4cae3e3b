"""it.stats().trace(path): a Chrome trace-event timeline of the run (Perfetto)."""

from __future__ import annotations

import asyncio
import json
import time
from collections import defaultdict
from itertools import pairwise
from pathlib import Path

import pytest

import aioflow as af
from aioflow.stats import meters as _meters


def traced(p: af.Pipeline, path: Path) -> tuple[af.RunStats, list[dict]]:
    with p.iter() as it:
        for _ in it:
            pass
    st = it.stats()
    assert st.trace(path) == path
    return st, json.loads(path.read_text())["traceEvents"]


def tracks_of(events: list[dict]) -> dict[int, str]:
    return {e["tid"]: e["args"]["name"] for e in events if e["name"] == "thread_name"}


def spans_by_track(events: list[dict]) -> dict[str, list[tuple[float, float]]]:
    names = tracks_of(events)
    out: dict[str, list[tuple[float, float]]] = defaultdict(list)
    for e in events:
        if e["ph"] == "X":
            out[names[e["tid"]]].append((e["ts"], e["dur"]))
    return out


def assert_no_overlap(spans: list[tuple[float, float]], track: str) -> None:
    spans = sorted(spans)
    for (t0, d0), (t1, _) in pairwise(spans):
        assert t0 + d0 <= t1 + 1e-3, (track, t0, d0, t1)  # (rounded to nanoseconds)


def slow(x):
    time.sleep(0.001)
    return x


async def fetch(x):
    await asyncio.sleep(0.002)
    return x


def test_a_trace_has_a_track_per_stage_counters_and_the_consumers_waits(tmp_path):
    p = (
        af.range(6)
        .interleave(lambda i: af.range(30).map(slow), cycle_length=3, concurrency=3)
        .map(fetch, concurrency=4)
        .batch(10)
        .prefetch(2)
    )
    _, events = traced(p, tmp_path / "run.json")
    names = set(tracks_of(events).values())
    for i in (1, 2, 3):  # one track per reader: their spans overlap in time
        assert f"interleave(<lambda>) > map(slow) [{i}]" in names
    assert {"interleave(<lambda>)", "batch(10)", "prefetch(2)", "consumer"} <= names
    assert any(n.startswith("map(fetch) · call ") for n in names)  # its call slots
    counters = {e["name"] for e in events if e["ph"] == "C"}
    assert "queue prefetch(2)" in counters and "in flight map(fetch)" in counters
    flights = [e["args"]["calls"] for e in events if e["name"] == "in flight map(fetch)"]
    assert max(flights) <= 4 and flights[-1] == 0
    spans = spans_by_track(events)
    consumer = next(t for t, n in tracks_of(events).items() if n == "consumer")
    assert spans["consumer"]
    assert {e["name"] for e in events if e.get("tid") == consumer and e["ph"] == "X"} == {"wait"}
    for track, ss in spans.items():
        assert_no_overlap(ss, track)
    assert all(e["ts"] >= 0 and e.get("dur", 0) >= 0 for e in events if "ts" in e)


def busy_per_stage(st: af.RunStats, events: list[dict]) -> dict[str, float]:
    """Busy seconds per stage from the trace: the sum over its tracks, per slot for
    stages with concurrency (as the stats count them)."""
    totals: dict[str, float] = defaultdict(float)
    for track, ss in spans_by_track(events).items():
        stage = track.split(" · ")[0].rsplit(" [", 1)[0]
        totals[stage] += sum(d for _, d in ss) / 1e6
    for s in st:
        if s.concurrency:
            totals[s.name] /= s.concurrency
    return totals


def test_the_trace_and_the_stats_of_the_demo_agree_on_busy_seconds(tmp_path):
    from aioflow import _demo

    _demo.make_dataset(str(tmp_path), 96)
    p = _demo.build_pipeline(str(tmp_path), batch_size=16, workers=2)
    st, events = traced(p, tmp_path / "demo.json")
    from_trace = busy_per_stage(st, events)
    for s in st:
        got = from_trace.get(s.name, 0.0)
        assert abs(got - s.busy) <= 0.05 * s.busy + 1e-4, (s.name, got, s.busy)
    for track, ss in spans_by_track(events).items():
        assert_no_overlap(ss, track)
    assert any(" · worker " in n for n in tracks_of(events).values())


def test_spans_of_a_fast_stage_are_merged_and_keep_their_busy_time(tmp_path):
    p = af.range(300_000).map(lambda x: x + 1).batch(4).prefetch(8)
    st, events = traced(p, tmp_path / "fast.json")
    spans = spans_by_track(events)
    chunks_per_s = 300_000 / 256 / st.wall
    for track in ("range", "map(<lambda>)"):
        n = len(spans[track])
        assert n <= st.wall / _meters.SPAN_WINDOW + 10  # at most one a millisecond
        assert_no_overlap(spans[track], track)
    merged = [e for e in events if e.get("args", {}).get("merged", 1) > 1]
    assert merged or chunks_per_s < 1000
    from_trace = busy_per_stage(st, events)
    for s in st:
        assert abs(from_trace.get(s.name, 0.0) - s.busy) <= 0.05 * s.busy + 1e-4


def test_stats_made_by_hand_give_an_empty_trace(tmp_path):
    path = af.RunStats((), 0.0).trace(tmp_path / "empty.json")
    assert json.loads(path.read_text()) == {"traceEvents": [], "displayTimeUnit": "ms"}


async def test_an_async_consumer_s_waits_are_traced(tmp_path):
    async with af.range(50).map(fetch, concurrency=2).aiter() as it:
        async for _ in it:
            pass
    path = it.stats().trace(tmp_path / "a.json")
    events = json.loads(path.read_text())["traceEvents"]
    assert spans_by_track(events)["consumer"]


def test_a_lane_keeps_its_latest_spans_within_a_bound(monkeypatch):
    monkeypatch.setattr(_meters, "SPANS_MAX", 10)
    lane = _meters.Lane(0)
    for i in range(100):  # 100 pieces of 1 ms, 10 ms apart: none merged
        lane.work(i * 0.01 + 0.001, 0.001)
    spans = lane.all_spans()
    assert 5 <= len(spans) <= 11
    assert spans[-1][0] == pytest.approx(0.99) and spans[-1][1] == pytest.approx(0.001)
    assert [s[0] for s in spans] == sorted(s[0] for s in spans)
    assert lane.busy == pytest.approx(0.1)  # the busy time is kept whole
