"""asof_join: equal to a brute-force point-in-time join, never pairing with a later item."""

from __future__ import annotations

import itertools
import json

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

import aioflow as af

FAST = settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@st.composite
def side(draw, tag, max_n=40, keys=3, jitter=0):
    """Events ``{"t", "k", "i", "side"}`` in time order, each up to ``jitter`` late."""
    n = draw(st.integers(0, max_n))
    steps = draw(st.lists(st.integers(0, 4), min_size=n, max_size=n))
    ks = draw(st.lists(st.integers(0, keys - 1), min_size=n, max_size=n))
    delays = draw(st.lists(st.integers(0, jitter), min_size=n, max_size=n))
    t, out = 0, []
    for i in range(n):
        t += steps[i]
        out.append({"t": t, "k": ks[i], "side": tag, "at": t + delays[i], "i": i})
    out.sort(key=lambda e: (e["at"], e["i"]))
    for j, e in enumerate(out):
        e["i"] = j
        del e["at"]
    return out


def brute(left, right, by, tol):
    """Each left item with the right item of its key at the largest time <= its own (the
    latest arrival among equal times), within tol."""
    out = []
    for a in left:
        cands = [
            b
            for b in right
            if (not by or b["k"] == a["k"])
            and b["t"] <= a["t"]
            and (tol is None or a["t"] - b["t"] <= tol)
        ]
        best = max(cands, key=lambda b: (b["t"], b["i"])) if cands else None
        out.append((a["i"], None if best is None else best["i"]))
    return out


def ids(pairs):
    return [(a["i"], None if b is None else b["i"]) for a, b in pairs]


@FAST
@given(side("L"), side("R"), st.booleans(), st.one_of(st.none(), st.integers(0, 6)))
def test_asof_join_equals_a_brute_force_join_on_sorted_streams(left, right, by, tol):
    p = af.from_iterable(left).asof_join(
        af.from_iterable(right), on="t", by="k" if by else None, tolerance=tol
    )
    got = p.to_list()
    assert ids(got) == brute(left, right, by, tol)
    assert all(b is None or b["t"] <= a["t"] for a, b in got)  # never a later one


@FAST
@given(st.integers(0, 5), st.data())
def test_asof_join_of_streams_out_of_order_within_max_delay_is_still_exact(jitter, data):
    left = data.draw(side("L", jitter=jitter))
    right = data.draw(side("R", jitter=jitter))
    tol = data.draw(st.one_of(st.none(), st.integers(0, 6)))
    p = af.from_iterable(left).asof_join(
        af.from_iterable(right), on="t", by="k", tolerance=tol, max_delay=jitter
    )
    with p.iter() as it:
        got = list(it)
        late = sum(s.late for s in it.stats().stages)
    assert late == 0
    assert ids(got) == brute(left, right, True, tol)


def arrived(events, delay=0):
    """Which events are late in arrival order: below (largest time before it) - delay."""
    top, out = None, []
    for e in events:
        out.append(top is not None and e["t"] < top - delay)
        if not out[-1] and (top is None or e["t"] > top):
            top = e["t"]
    return out


def model(left, right, delay=0):
    """The join as it must be: (pairs, fewest late, most late). A late left item comes out
    alone; a late right item is dropped; every other left item pairs as in a brute-force
    join of the items that are not late. The join reads ``right`` until its watermark
    passes the last left item (or it ends), no further than needed but by whole chunks:
    the late right items it counts are at least those of that prefix, at most all."""
    llate, rlate = arrived(left, delay), arrived(right, delay)
    ok = [b for b, late in zip(right, rlate, strict=True) if not late]
    pairs = [
        (a["i"], None) if late else brute([a], ok, True, None)[0]
        for a, late in zip(left, llate, strict=True)
    ]
    end = max((a["t"] for a, late in zip(left, llate, strict=True) if not late), default=None)
    need, top = 0, None
    if end is not None:
        for b in right:
            need += 1
            top = b["t"] if top is None else max(top, b["t"])
            if top - delay > end:
                break
    return pairs, sum(llate) + sum(rlate[:need]), sum(llate) + sum(rlate)


def events(tag, times):
    return [{"t": t, "k": 0, "side": tag, "i": i} for i, t in enumerate(times)]


@FAST
@given(side("L", jitter=6), side("R", jitter=6))
@example(  # hypothesis found: the late right item (t 4, last) comes after the join is done
    events("L", [0, 0, 0, 4]), events("R", [0] * 14 + [5] * 11 + [4])
)
def test_late_items_never_pair_with_a_later_one_and_are_counted(left, right):
    p = af.from_iterable(left).asof_join(af.from_iterable(right), on="t", by="k")
    with p.iter() as it:
        got = list(it)
        stats = it.stats()
    assert [a["i"] for a, _ in got] == [a["i"] for a in left]  # each once, in order
    assert all(b is None or (b["t"] <= a["t"] and b["k"] == a["k"]) for a, b in got)
    pairs, fewest, most = model(left, right)
    assert ids(got) == pairs
    assert fewest <= stats["asof_join"].late <= most


def test_a_join_reads_no_more_of_the_right_stream_than_it_needs():
    # the left stream ends at 4; the right watermark passes it at the first 5: the join is
    # done and reads no further (``other`` may be endless, here late 4s forever), and the
    # left 4 pairs with the last 0, as at that watermark
    right = (
        {"t": t, "k": 0, "i": i}
        for i, t in enumerate(itertools.chain([0, 0, 0, 5], itertools.repeat(4)))
    )
    p = af.from_iterable(events("L", [0, 4])).asof_join(af.from_iterable(right), on="t")
    assert ids(p.to_list()) == [(0, 2), (1, 2)]


def test_right_state_is_bounded_by_tolerance_and_max_keys():
    n = 20_000
    left = af.range(n).map(lambda t: {"t": t, "k": t % 1000})
    right = af.range(n).map(lambda t: {"t": t, "k": t})  # a new key every item
    p = left.asof_join(right, on="t", by="k", tolerance=5)
    with p.iter() as it:
        got = list(it)
    assert len(got) == n
    assert sum(b is not None for _, b in got) == sum(t % 1000 == t for t in range(n))

    q = left.asof_join(right, on="t", by="k", max_keys=100)
    with q.iter() as it:
        list(it)
        assert it.stats()["asof_join"].evicted == n - 100


def test_asof_join_checks_its_arguments():
    with pytest.raises(af.PipelineError, match="direction must be 'backward'"):
        af.range(3).asof_join(af.range(3), on=lambda x: x, direction="forward")
    with pytest.raises(af.PipelineError, match="needs a Pipeline"):
        af.range(3).asof_join([1, 2], on=lambda x: x)
    with pytest.raises(af.PipelineError, match="tolerance"):
        af.range(3).asof_join(af.range(3), on=lambda x: x, tolerance=-1)
    assert len(af.range(7).asof_join(af.range(3), on=lambda x: x)) == 7


def test_the_watermark_of_a_join_is_that_of_its_left_stream_once_it_ended():
    p = af.range(10).asof_join(af.range(0, 20, 3), on=lambda x: x)
    with p.iter() as it:
        got = list(it)
        assert it.watermark() == 9
    assert got[4] == (4, 3) and got[0] == (0, 0)


# -- resuming: both inputs seek -------------------------------------------------------------
class Reads:
    def __init__(self, events):
        self.events, self.reads = events, 0

    def __len__(self):
        return len(self.events)

    def __getitem__(self, i):
        self.reads += 1
        return self.events[i]


@FAST
@given(side("L", max_n=120, jitter=3), side("R", max_n=120, jitter=3), st.data())
def test_asof_join_resumed_anywhere_equals_the_whole_run(left, right, data):
    tol = data.draw(st.one_of(st.none(), st.integers(0, 6)))
    ls, rs = Reads(left), Reads(right)

    def make():
        p = af.from_source(ls).asof_join(
            af.from_source(rs), on="t", by="k", tolerance=tol, max_delay=3
        )
        return p.batch(3, collate=list)

    whole = make().to_list()
    k = data.draw(st.integers(0, len(whole)))
    with make().iter() as it:
        head = [next(it) for _ in range(k)]
        state = json.loads(json.dumps(it.state_dict()))
    assert state["nodes"] is not None
    ls.reads = rs.reads = 0
    with make().iter(state=state) as it:
        assert head + list(it) == whole
    assert ls.reads <= len(left) and rs.reads <= len(right)


def test_a_join_state_holds_only_what_the_join_still_needs():
    n = 20_000
    left = af.from_source([{"t": t, "k": t % 50} for t in range(n)])
    right = af.from_source([{"t": t, "k": t % 7000, "v": t} for t in range(0, n, 2)])
    p = left.asof_join(right, on="t", by="k", tolerance=100)
    with p.iter() as it:
        for _ in range(n * 9 // 10):
            next(it)
        state = it.state_dict()
    (held,) = [v["held"] for v in state["nodes"].values() if isinstance(v, dict) and "held" in v]
    assert len(held[0]) < 600 and len(held[1]) < 600  # within tolerance, not all keys


@FAST
@given(side("L"), side("R"))
def test_the_join_s_watermark_never_decreases_and_no_pair_to_come_is_before_it(left, right):
    p = af.from_iterable(left).asof_join(af.from_iterable(right), on="t", by="k")
    out, wms = [], []
    with p.iter() as it:
        for x in it:
            out.append(x)
            wms.append(it.watermark())
    known = [w for w in wms if w is not None]
    assert known == sorted(known)
    for j, w in enumerate(wms):
        assert w is None or all(a["t"] >= w for a, _ in out[j + 1 :])


def test_an_error_of_the_right_input_is_raised_as_itself_at_its_own_position():
    err = KeyError("right side")

    def right():
        yield from ({"t": t} for t in range(0, 10, 2))
        raise err

    p = af.range(100).map(lambda t: {"t": t}).asof_join(af.from_iterable(right), on="t")
    with pytest.raises(KeyError) as info:
        p.to_list()
    assert info.value is err
    assert info.value.__notes__ == ["aioflow: raised in stage 'from_iterable' at item 5"]


def test_a_join_of_a_pipeline_with_itself_resumes_exactly_by_replaying():
    base = af.from_source(range(300)).map(lambda t: {"t": t})

    def make():
        return base.asof_join(base.filter(lambda e: e["t"] % 7 == 0), on="t")

    whole = make().to_list()
    for k in (0, 50, 299):
        with make().iter() as it:
            head = [next(it) for _ in range(k)]
            state = it.state_dict()
        assert state["nodes"] is None  # one source read twice: no position serves both
        with make().iter(state=state) as it:
            assert head + list(it) == whole


def test_what_a_join_holds_over_a_long_stream_does_not_grow_with_it(monkeypatch, held_logs):
    # both streams in step: nearly every item leaves the join a chunk after it came, so
    # each lands in the log of gone items; the log may keep only what its KEEP marks can
    # still ask for, however long the stream (count objects: pending, right, gone, marks)
    from aioflow._core.graph import CHUNK_MAX
    from aioflow._state.held import HeldLog

    monkeypatch.setattr(HeldLog, "KEEP", 16)
    logs = held_logs
    n = 100_000
    left = af.range(n).map(lambda t: {"t": t, "k": t % 50})
    right = af.range(n).map(lambda t: {"t": t, "k": t % 50})
    sizes = []
    with left.asof_join(right, on="t", by="k").iter() as it:
        for i, _ in enumerate(it):
            if i % 256 == 0:
                (log,) = logs
                with log.lock:
                    pending, kept = log.held()
                    gone = sum(map(len, log.gone))
                    sizes.append(len(pending) + len(kept) + gone + len(log.marks))
    bound = 2 * 2 * 16 * CHUNK_MAX + 4 * CHUNK_MAX + 50  # gone of 16 marks x 2 inputs, x2
    assert max(sizes) < bound < n // 4, max(sizes)
