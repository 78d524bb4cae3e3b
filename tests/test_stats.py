"""it.stats(): exact counts, the bottleneck and why, queue occupancy, str/html, plot."""

from __future__ import annotations

import asyncio
import time

import numpy as np
import pytest

import aioflow as af
from aioflow._core import run as _runtime

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def run(p: af.Pipeline, body=None) -> tuple[list, af.RunStats]:
    with p.iter() as it:
        out = []
        for x in it:
            out.append(x)
            if body is not None:
                body(x)
    return out, it.stats()


def fail_on_multiples_of(k):
    def fn(x):
        if x % k == 0:
            raise ValueError(x)
        return x

    return fn


def sleepy(seconds):
    def slow(x):
        time.sleep(seconds)
        return x

    return slow


# -- counts ----------------------------------------------------------------------------
def test_items_in_and_out_of_every_stage_are_exact():
    p = af.range(1000).filter(lambda x: x % 3 == 0).map(lambda x: x + 1).batch(10)
    out, st = run(p)
    assert sum(len(b) for b in out) == 334
    assert [s.name for s in st] == ["range", "filter(<lambda>)", "map(<lambda>)", "batch(10)"]
    assert [(s.items_in, s.items_out) for s in st] == [
        (0, 1000),
        (1000, 334),
        (334, 334),
        (334, 34),
    ]


def test_counts_are_exact_through_concurrent_and_prefetch_stages():
    p = (
        af.range(500)
        .map(lambda x: x * 2, executor="thread", concurrency=3)
        .filter(lambda x: x % 4 == 0, concurrency=2, executor="thread")
        .prefetch(7)
    )
    out, st = run(p)
    assert out == [x * 2 for x in range(500) if (x * 2) % 4 == 0]
    assert [(s.items_in, s.items_out) for s in st] == [(0, 500), (500, 500), (500, 250), (250, 250)]
    assert st["map(<lambda>)"].concurrency == 3
    assert st["filter(<lambda>)"].concurrency == 2


@pytest.mark.parametrize("executor", [None, "thread"])
def test_errors_skipped_are_counted_exactly(executor):
    kw = {"executor": executor, "concurrency": 2} if executor else {}
    p = af.range(100).map(fail_on_multiples_of(7), on_error="skip", **kw)
    out, st = run(p)
    assert out == [x for x in range(100) if x % 7]
    s = st["map(fn)"]
    assert (s.items_in, s.items_out, s.errors_skipped) == (100, 85, 15)
    assert st["range"].errors_skipped == 0


def test_sub_pipelines_are_stages_under_the_stage_that_opened_them():
    p = af.range(4).flat_map(lambda n: af.range(n).map(lambda x: x * 10))
    out, st = run(p)
    assert out == [0, 0, 10, 0, 10, 20]
    names = [s.name for s in st]
    assert names.index("flat_map(<lambda>) > map(<lambda>)") < names.index("flat_map(<lambda>)")
    assert st["flat_map(<lambda>) > range"].items_out == 6  # 0 + 1 + 2 + 3 over 4 opens
    assert st["flat_map(<lambda>)"].items_in == 4
    assert st["flat_map(<lambda>)"].items_out == 6


def test_a_repeated_stage_accumulates_over_its_epochs():
    _, st = run(af.range(10).prefetch(3).repeat(4))
    assert st["range"].items_out == 40
    assert st["prefetch(3)"].items_out == 40
    assert st["repeat"].items_out == 40


def test_empty_input_gives_zero_counts():
    _, st = run(af.range(0).map(lambda x: x).batch(3))
    assert [(s.items_in, s.items_out) for s in st] == [(0, 0), (0, 0), (0, 0)]


def test_stats_before_the_first_item_are_empty():
    with af.range(3).iter() as it:
        st = it.stats()
        assert len(st) == 0 and st.bottleneck is None
        assert "no stage ran" in str(st)


# -- times and the bottleneck ------------------------------------------------------------
def test_bottleneck_is_the_slow_thread_map_between_fast_stages():
    p = (
        af.range(300)
        .map(lambda x: x + 1)
        .map(sleepy(0.003), executor="thread", concurrency=2)
        .map(lambda x: x * 2)
        .batch(8)
    )
    _, st = run(p)
    b = st.bottleneck
    assert b is not None and b.name == "map(slow)"
    assert b.busy / st.wall > 0.7
    assert b.in_flight is not None and 1.4 < b.in_flight <= 2.0
    for s in st:
        if s is not b:
            assert s.busy < 0.3 * b.busy, s
    summary = st.summary()
    assert summary.startswith("bottleneck: map(slow): busy")
    assert "its input queue is full" in summary or "it never waits on its input" in summary
    assert "its output queue is empty" in summary
    assert "* map(slow)" in str(st)


def test_bottleneck_is_a_slow_inline_stage_and_fused_stages_exclude_their_input():
    p = af.range(60).map(sleepy(0.004)).map(lambda x: x + 1)
    _, st = run(p)
    slow, fast = st["map(slow)"], st["map(<lambda>)"]
    assert st.bottleneck is slow
    assert slow.busy >= 0.2  # 60 x 4 ms
    assert fast.busy < 0.05 * slow.busy  # its own time only, not the slow input's
    assert fast.wait_in >= slow.busy  # ...which it waited on instead


def test_bottleneck_is_a_slow_source():
    def slow_source():
        for i in range(40):
            time.sleep(0.004)
            yield i

    _, st = run(af.from_iterable(slow_source).map(lambda x: x).prefetch(4))
    assert st.bottleneck.name == "from_iterable"
    assert "(a source)" in st.summary()
    assert st["map(<lambda>)"].wait_in > 0.1


def test_a_slow_consumer_is_named_as_the_bottleneck():
    p = af.range(60).map(lambda x: x).prefetch(1)
    _, st = run(p, body=lambda x: time.sleep(0.004))
    assert st.consumer_bound
    assert st.bottleneck is None
    assert st.summary().startswith("bottleneck: the consumer")
    assert st["prefetch(1)"].queue_fill > 0.7  # its channel stays full


async def test_async_concurrent_map_reports_calls_in_flight():
    async def fetch(x):
        await asyncio.sleep(0.01)
        return x

    async with af.range(80).map(fetch, concurrency=4).aiter() as it:
        out = [x async for x in it]
    st = it.stats()
    assert out == list(range(80))
    s = st["map(fetch)"]
    assert s.concurrency == 4 and 2.5 < s.in_flight <= 4.0
    assert st.bottleneck is s


# -- queues ----------------------------------------------------------------------------
def test_queue_occupancy_is_averaged_over_time_against_capacity():
    async def slow_source():
        for i in range(30):
            await asyncio.sleep(0.005)
            yield i

    # a slow producer: its consumer takes every item at once, the queue is mostly empty
    _, st = run(af.from_iterable(slow_source()).prefetch(4))
    s = st["prefetch(4)"]
    assert s.queue_capacity == 4 and 1 <= s.queue_peak <= 4
    assert s.queue_fill < 0.3 and s.queue_mean < 1.2 and s.queue_nonempty < 0.5
    # a slow consumer: the queue stays full
    _, st = run(af.range(100).prefetch(4), body=lambda x: time.sleep(0.003))
    s = st["prefetch(4)"]
    assert s.queue_fill > 0.7 and s.queue_fill_peak == 1.0 and s.queue_peak == 4
    assert s.queue_nonempty > 0.7


def test_queue_fill_counts_the_chunk_limit_of_a_channel_of_batches():
    # batches travel one per chunk: two chunks fill a default channel of 512 items
    p = af.range(2000).batch(4).map(lambda b: b, executor="thread")
    _, st = run(p.prefetch(2), body=lambda b: time.sleep(0.001))
    s = st["map(<lambda>)"]
    assert s.queue_fill_peak == 1.0
    assert s.queue_peak is not None and s.queue_peak < 0.1 * s.queue_capacity


def test_stages_fused_into_the_consumer_task_have_no_queue_in_the_sync_adapter():
    async def ten():
        for i in range(10):
            yield i

    # an async source runs in a task of its own; a sync one (range) is fused as a map is
    _, st = run(af.from_iterable(ten).map(lambda x: x))
    assert st["from_iterable"].queue_capacity is not None
    assert st["map(<lambda>)"].queue_fill is None
    _, st = run(af.range(10).map(lambda x: x))
    assert st["range"].queue_capacity is None and st["map(<lambda>)"].queue_fill is None


# -- live and finished runs ------------------------------------------------------------
def test_stats_of_a_live_run_grow_and_a_finished_run_stay_put():
    with af.range(100_000).iter() as it:
        for _ in range(10):
            next(it)
        live = it.stats()
        assert live["range"].items_out >= 10 and live.wall > 0
        list(it)
    done = it.stats()
    time.sleep(0.05)
    again = it.stats()
    assert done["range"].items_out == 100_000
    assert done == again  # frozen values, the same once the run is closed


def test_stats_are_per_run():
    p = af.range(10)
    assert run(p)[1]["range"].items_out == 10
    assert run(p)[1]["range"].items_out == 10


def test_meters_can_be_switched_off(monkeypatch):
    monkeypatch.setattr(_runtime, "METER", False)
    out, st = run(af.range(1000).map(lambda x: x + 1).prefetch(8))
    assert out == list(range(1, 1001))
    assert all(s.items_out == 0 and s.queue_capacity is None for s in st)


# -- rendering -------------------------------------------------------------------------
def test_str_is_a_table_of_every_stage_and_html_the_same():
    p = af.range(50).map(sleepy(0.002)).batch(5)
    _, st = run(p)
    text = str(st)
    lines = text.splitlines()
    assert lines[0].split()[:4] == ["stage", "in", "out", "busy"]
    for s in st:
        assert any(line.lstrip("* ").startswith(s.name) for line in lines)
    assert lines[-1] == st.summary()
    html = st._repr_html_()
    assert html.startswith("<table>") and html.count("<tr") == 1 + len(st)
    assert "font-weight:bold" in html and "map(slow)" in html
    assert "bottleneck: map(slow)" in html


def test_plot_writes_a_png_of_the_stages(tmp_path):
    plt_image = pytest.importorskip("matplotlib.image")
    p = af.range(200).map(sleepy(0.001), executor="thread", concurrency=2).batch(10)
    _, st = run(p)
    path = tmp_path / "stats.png"
    assert st.plot(path) == path
    data = path.read_bytes()
    assert data[:8] == PNG_SIGNATURE
    assert len(data) > 10_000  # bars, labels and text, not an empty canvas
    img = plt_image.imread(path)
    assert img.shape[0] > 200 and img.shape[1] > 500
    assert np.unique(img.reshape(-1, img.shape[-1]), axis=0).shape[0] > 20  # many colours


def test_plot_of_an_empty_run_still_writes_a_png(tmp_path):
    path = tmp_path / "empty.png"
    af.RunStats((), 0.0).plot(str(path))
    assert path.read_bytes()[:8] == PNG_SIGNATURE


# -- repeated sub-stages: one row, per-instance figures ----------------------------------
def shares_in_table(st: af.RunStats) -> list[float]:
    """Every percentage in the table's rows."""
    import re

    rows = str(st).splitlines()[2 : 2 + len(st)]
    return [float(x) for r in rows for x in re.findall(r"(\d+)%", r)]


def test_the_readers_of_an_interleave_are_one_row_with_per_instance_shares():
    p = af.range(8).interleave(
        lambda i: af.range(20).map(sleepy(0.002)), cycle_length=4, concurrency=4
    )
    out, st = run(p)
    assert len(out) == 160
    readers = st["interleave(<lambda>) > map(slow)"]
    assert readers.instances == 4  # four readers at once, not one row each
    assert readers.busy >= 160 * 0.002  # their busy seconds, summed
    assert readers.busy_max is not None
    assert readers.busy / 4 <= readers.busy_max <= st.wall
    assert 0 < readers.busy_share(st.wall) <= 1
    assert "x4 max" in str(st)
    assert max(shares_in_table(st)) <= 100


def test_the_partitions_of_a_partition_by_are_one_row():
    p = af.range(90).partition_by(lambda x: x % 3, 3, lambda q: q.map(sleepy(0.001)))
    out, st = run(p)
    assert sorted(out) == list(range(90))
    parts = st["partition_by(3) > map(slow)"]
    assert parts.instances == 3 and parts.items_out == 90
    assert max(shares_in_table(st)) <= 100


def test_the_workers_of_a_process_pool_are_counted_with_the_busiest_one():
    p = af.range(200).map(sleepy(0.002), executor="process", concurrency=2)
    _, st = run(p)
    m = st["map(slow)"]
    assert m.instances == 2
    assert m.busy_max is not None and m.busy_max >= m.busy  # busy is the mean per worker
    assert "x2 max" in str(st)


def test_sub_pipelines_opened_one_after_another_are_one_instance():
    _, st = run(af.range(5).flat_map(lambda n: af.range(n)))
    assert st["flat_map(<lambda>) > range"].instances == 1
    assert st["flat_map(<lambda>) > range"].busy_max is None


def test_the_plot_keeps_whole_names_and_every_bar_within_the_wall():
    from aioflow.stats.plot import _bars, _label

    p = af.range(8).interleave(
        lambda i: af.range(20).map(sleepy(0.002)), cycle_length=4, concurrency=4
    )
    _, st = run(p)
    for b, wi, wo in zip(*_bars(st), strict=True):
        assert b + wi + wo <= st.wall * 1.0001
    name = "interleave(_read_pair) > map(a_rather_long_function_name)"
    label = _label(name)
    assert "…" not in label and label.replace("\n", " ").replace("> >", ">") == name
