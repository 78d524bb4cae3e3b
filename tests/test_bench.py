"""af.bench: counts, limits, warm-up, rate, time to first item, progress bar, result."""

from __future__ import annotations

import asyncio
import dataclasses
import time

import pytest

import aioflow as af


def test_bench_reads_the_whole_pipeline_and_reports_its_figures():
    r = af.bench(af.range(1000).map(lambda x: x + 1).batch(10), progress=False)
    assert r.items == 100 and r.warmup == 0
    assert r.seconds > 0 and r.items_per_s == pytest.approx(r.items / r.seconds)
    assert r.first_item_s is not None and 0 < r.first_item_s <= r.seconds
    assert r.stats["batch(10)"].items_in == 1000
    assert r.stats["batch(10)"].items_out == 100


def test_result_is_frozen():
    r = af.bench(af.range(3), progress=False)
    with pytest.raises(dataclasses.FrozenInstanceError):
        r.items = 5  # type: ignore[misc]


def test_num_items_stops_an_infinite_pipeline_and_closes_its_run(no_leaks):
    r = af.bench(
        af.range(7).map(lambda x: x, executor="thread").repeat(), num_items=1000, progress=False
    )
    assert r.items == 1000
    assert r.stats["range"].items_out >= 1000


def test_seconds_bounds_the_time_spent():
    t0 = time.perf_counter()
    r = af.bench(af.range(10).repeat(), seconds=0.3, progress=False)
    took = time.perf_counter() - t0
    assert 0.3 <= r.seconds < 1.0 and took < 2.0
    assert r.items > 0


def test_an_infinite_pipeline_needs_a_limit():
    with pytest.raises(af.PipelineError, match="infinite"):
        af.bench(af.range(3).repeat(), progress=False)


@pytest.mark.parametrize("kw", [{"num_items": -1}, {"seconds": "1"}, {"warmup": 1.5}])
def test_bad_limits_are_rejected(kw):
    with pytest.raises(af.PipelineError):
        af.bench(af.range(3), progress=False, **kw)


def test_warmup_items_are_read_but_not_timed():
    r = af.bench(af.range(100), warmup=30, progress=False)
    assert (r.items, r.warmup) == (70, 30)
    assert r.stats["range"].items_out == 100
    assert "30 warm-up items not timed" in str(r)


def test_a_pipeline_that_ends_during_warmup_gives_no_timed_items():
    r = af.bench(af.range(5), warmup=10, progress=False)
    assert (r.items, r.warmup) == (0, 5)


def test_empty_pipeline_has_no_first_item():
    r = af.bench(af.range(0), progress=False)
    assert r.items == 0 and r.first_item_s is None and r.items_per_s == 0.0
    assert "no item" in str(r)


def test_rate_and_time_to_first_item_of_a_slow_source():
    def slow():
        time.sleep(0.15)  # a slow start
        for i in range(20):
            time.sleep(0.01)
            yield i

    r = af.bench(af.from_iterable(slow), progress=False)
    assert r.items == 20
    assert r.first_item_s >= 0.15
    assert 20 / 0.5 < r.items_per_s <= 20 / 0.35  # about 20 items in 0.15 + 20 x 0.01 s
    assert r.stats.bottleneck.name == "from_iterable"


def test_str_has_the_rate_line_and_the_stats_table():
    r = af.bench(af.range(500).map(lambda x: x), progress=False)
    lines = str(r).splitlines()
    assert lines[0].startswith("500 items in ") and "items/s" in lines[0]
    assert "first item after" in lines[0]
    assert lines[1].split()[:2] == ["stage", "in"]
    assert lines[-1].startswith("bottleneck: ")
    assert "items/s" in r._repr_html_() and "<table>" in r._repr_html_()


def test_progress_bar_shows_items_per_second_on_stderr(capsys):
    af.bench(af.range(2000), progress=True)
    err = capsys.readouterr().err
    assert "bench" in err and "it/s" in err and "2000" in err


def test_no_progress_prints_nothing(capsys):
    af.bench(af.range(2000), progress=False)
    assert capsys.readouterr() == ("", "")


async def test_bench_works_inside_a_running_event_loop():
    r = af.bench(af.range(300).map(lambda x: x), progress=False)
    assert r.items == 300
    await asyncio.sleep(0)


def test_a_pipeline_of_batches_is_measured_in_batches():
    r = af.bench(af.range(1000).map(lambda x: x).batch(10).prefetch(2), progress=False)
    assert r.unit == "batches" and r.items == 100
    line = str(r).splitlines()[0]
    assert line.startswith("100 batches in ") and "batches/s" in line
    assert "first batch after" in line and "batches/s" in r._repr_html_()
    assert af.bench(af.range(10).batch(5).unbatch(), progress=False).unit == "items"
