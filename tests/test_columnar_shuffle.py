"""``shuffle(n, rows=True)``: the rows of record batches shuffled exactly as the per-item
shuffle shuffles the same rows; resumed anywhere; its held input batches bounded."""

from __future__ import annotations

from itertools import pairwise

import numpy as np
import pyarrow as pa
import pytest
from _columnar import resumed_anywhere
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import aioflow as af
from aioflow.ops.columnar_shuffle import RowBuffer

FAST = settings(
    max_examples=100,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
SCHEMA = pa.schema([("i", pa.int64()), ("v", pa.float64()), ("s", pa.string())])


def batch(lo: int, hi: int, kind: str, nulls: frozenset[int] = frozenset()) -> object:
    """Rows ``lo..hi``: ``i``, ``v`` (null at ``nulls``), ``s``; a dict also ``xy`` (2-D)."""
    i = np.arange(lo, hi)
    v = [None if j in nulls else j / 2 for j in range(lo, hi)]
    s = [f"r{j}" for j in range(lo, hi)]
    if kind == "arrow":
        return pa.RecordBatch.from_pydict({"i": i, "v": v, "s": s}, schema=SCHEMA)
    obj = np.empty(hi - lo, object)
    obj[:] = v
    return {"i": i, "v": obj, "s": np.array(s, dtype="U8"), "xy": np.stack([i, -i], axis=1)}


def rows_of(b: object) -> list[dict]:
    if not isinstance(b, dict):
        return b.to_pylist()
    n = len(next(iter(b.values())))
    return [{c: v[j].tolist() if isinstance(v[j], np.ndarray | np.generic) else v[j]
             for c, v in b.items()} for j in range(n)]  # fmt: skip


def flat(batches: list) -> list[dict]:
    return [r for b in batches for r in rows_of(b)]


@st.composite
def streams(draw, max_rows=12, max_batches=14):
    """(batches, kind): batches of 0..max_rows rows, of one kind, nulls in ``v``."""
    kind = draw(st.sampled_from(["arrow", "dict"]))
    sizes = draw(st.lists(st.integers(0, max_rows), max_size=max_batches))
    total = sum(sizes)
    nulls = frozenset(draw(st.sets(st.integers(0, max(total - 1, 0)), max_size=total)))
    cuts = np.concatenate([[0], np.cumsum(sizes)]).astype(int).tolist()
    return [batch(a, z, kind, nulls) for a, z in pairwise(cuts)], kind


def seekable(batches: list) -> af.Pipeline:
    """The batches from a source that seeks (a state holds every node's: no replay)."""
    return af.range(len(batches)).map(batches.__getitem__)


@pytest.fixture(params=["as shipped", "compacting at every batch"])
def compact(request, monkeypatch):
    """The buffer as shipped, or its rows copied into one batch whenever two batches live
    or they hold more rows than twice the buffer's."""
    if request.param != "as shipped":
        monkeypatch.setattr(RowBuffer, "SEGS", 1)
        monkeypatch.setattr(RowBuffer, "SLACK", 0)


@FAST
@given(streams(), st.integers(1, 40), st.integers(0, 2**64 - 1))
def test_rows_come_out_as_the_per_item_shuffle_of_the_same_rows(compact, data, n, seed):
    batches, kind = data
    want = af.from_iterable(flat(batches)).shuffle(n, seed=seed).to_list()
    got = af.from_iterable(batches).shuffle(n, seed=seed, rows=True).to_list()
    assert flat(got) == want
    first = next((b for b in batches if len(rows_of(b))), None)
    for b in got:  # batches of the input's kind and schema, none empty
        assert len(rows_of(b)) > 0
        if kind == "arrow":
            assert b.schema == SCHEMA
        else:
            assert [(c, v.dtype, v.shape[1:]) for c, v in b.items()] == [
                (c, v.dtype, v.shape[1:]) for c, v in first.items()
            ]


def plain(row: dict) -> dict:
    """A row of ``unbatch`` with Python values (numpy scalars and arrays as lists)."""
    return {c: v.tolist() if isinstance(v, np.ndarray | np.generic) else v for c, v in row.items()}


@FAST
@given(streams(), st.integers(1, 40), st.integers(0, 2**32), st.booleans(), st.data())
def test_a_state_anywhere_resumes_to_exactly_the_rest(compact, data, n, seed, by_row, hd):
    """After any output batch, or (``unbatch`` after it) any row: the shuffle asked for
    its state after 0 batches while it has run on is then mid-fill (the batch that filled
    the buffer undone), or at the flush."""
    batches, _ = data

    def make():
        p = seekable(batches).shuffle(n, seed=seed, rows=True)
        return p.unbatch().map(plain) if by_row else p

    whole, got, state = resumed_anywhere(make, hd)
    assert state["nodes"] is not None  # the shuffle's own state, not a replay
    if by_row:
        assert got == whole
    else:
        assert flat(got) == flat(whole)
        assert [len(rows_of(b)) for b in got] == [len(rows_of(b)) for b in whole]


def test_the_batches_follow_the_input_batches_then_the_flush():
    """Per input batch once the buffer is full, as many rows as it has (the one that fills
    it: the rest); the batches filling it nothing; the buffer at the end in batches of the
    largest input batch's rows."""
    sizes = [4, 3, 5, 2, 0, 6, 1]
    cuts = np.concatenate([[0], np.cumsum(sizes)]).tolist()
    batches = [batch(a, z, "arrow") for a, z in pairwise(cuts)]
    got = af.from_iterable(batches).shuffle(10, seed=3, rows=True).to_list()
    assert [b.num_rows for b in got] == [2, 2, 6, 1, 6, 4]


@pytest.mark.parametrize("reshuffle", [True, False])
def test_epochs_are_shuffled_as_the_per_item_shuffles_epochs(reshuffle):
    batches = [batch(a, a + 7, "dict") for a in range(0, 70, 7)]
    p = af.from_iterable(batches).shuffle(16, seed=5, rows=True, reshuffle_each_iteration=reshuffle)
    q = af.from_iterable(flat(batches)).shuffle(16, seed=5, reshuffle_each_iteration=reshuffle)
    one, two = flat(p.to_list()), flat(p.to_list())
    assert [one, two] == [q.to_list(), q.to_list()]
    assert (one == two) is not reshuffle
    assert flat(p.repeat(2).to_list()) == q.repeat(2).to_list()


def test_a_state_of_the_second_epoch_resumes_it():
    batches = [batch(a, a + 5, "arrow") for a in range(0, 60, 5)]
    p = seekable(batches).shuffle(8, seed=2, rows=True)
    first = p.to_list()
    second = p.to_list()
    assert flat(first) != flat(second)
    p = seekable(batches).shuffle(8, seed=2, rows=True)
    p.to_list()
    with p.iter() as it:
        head = [next(it) for _ in range(4)]
        state = it.state_dict()
    assert flat(head + list(p.iter(state=state))) == flat(second)


def test_by_default_batches_are_shuffled_whole():
    batches = [batch(a, a + 4, "dict") for a in range(0, 40, 4)]
    got = af.from_iterable(batches).shuffle(3, seed=1).to_list()
    order = af.range(len(batches)).shuffle(3, seed=1).to_list()
    assert [b["i"][0] // 4 for b in got] == order
    assert all(got[j] is batches[o] for j, o in enumerate(order))


def test_the_input_batches_kept_alive_stay_bounded_on_a_long_stream():
    """2000 batches of 8 rows through a buffer of 1000 rows: a row stays ~1000 rows, so
    the buffer's rows span ~hundreds of input batches; at most SEGS + 1 stay alive (the
    rows copied into one batch), and the segment list does not grow either."""
    buf = RowBuffer(1000, np.random.default_rng(0))
    most = longest = 0
    for j in range(2000):
        b = batch(8 * j, 8 * j + 8, "arrow")
        buf.put(b, buf.check(b, j))
        most, longest = max(most, buf.live()), max(longest, len(buf.segs))
    assert buf.fill == 1000
    assert most <= RowBuffer.SEGS + 1
    assert longest <= 3 * (RowBuffer.SEGS + 1) + 1
    held = sorted(r["i"] for r in rows_of(buf.gather(buf.bpart[:1000], buf.bidx[:1000])))
    out_and_held = held + [r["i"] for b in buf.flush() for r in rows_of(buf.gather(*b))]
    assert len(set(held)) == 1000 and sorted(out_and_held[1000:]) == held


def test_rows_of_items_that_are_not_batches_are_refused_clearly():
    with pytest.raises(af.PipelineError, match=r"item 0: shuffle\(rows=True\).*int"):
        af.range(5).shuffle(2, rows=True).to_list()
    b = batch(0, 3, "arrow")
    with pytest.raises(af.PipelineError, match=r"item 1: .*dict, not arrow"):
        af.from_iterable([b, batch(3, 6, "dict")]).shuffle(2, rows=True).to_list()
    other = pa.RecordBatch.from_pydict({"i": [1]})
    with pytest.raises(af.PipelineError, match="not those of the first batch"):
        af.from_iterable([b, other]).shuffle(2, rows=True).to_list()
    with pytest.raises(af.PipelineError, match="rows must be True or False"):
        af.from_iterable([b]).shuffle(2, rows=1)


def test_rows_before_a_refused_item_are_delivered_first():
    got = []
    p = af.from_iterable([batch(0, 4, "dict"), batch(4, 9, "dict"), 7]).shuffle(2, rows=True)
    with pytest.raises(af.PipelineError), p.iter() as it:
        for b in it:
            got.append(b)
    assert len(flat(got)) == 7


def _rows_state(st):
    return next(v for v in st["nodes"].values() if isinstance(v, dict) and "rows" in v)


CORRUPT = {
    "rows as int": ("rows", 3),
    "rows beyond the buffer": ("rows", batch(0, 9, "arrow")),
    "rows not a batch": ("rows", [1, 2]),
    "rng null": ("rng", None),
    "drop negative": ("drop", -1),
    "big as str": ("big", "5"),
    "drop deleted": ("drop", None),
}


@pytest.mark.parametrize("name", sorted(CORRUPT))
def test_a_corrupted_state_is_refused(name):
    batches = [batch(a, a + 3, "arrow") for a in range(0, 30, 3)]

    def make():
        return seekable(batches).shuffle(8, seed=1, rows=True)

    with make().iter() as it:
        next(it)
        state = it.state_dict()
    key, value = CORRUPT[name]
    node = _rows_state(state)
    if name == "drop deleted":
        del node[key]
    else:
        node[key] = value
    with pytest.raises(af.StateMismatch):
        list(make().iter(state=state))


def test_large_batches_through_a_small_buffer_keep_about_the_buffers_rows():
    """Batches of 5000 rows through a buffer of 10: each would keep its 5000 rows alive
    for the few the buffer holds; the held rows are copied out instead."""
    buf = RowBuffer(10, np.random.default_rng(1))
    for j in range(40):
        b = batch(5000 * j, 5000 * j + 5000, "dict")
        buf.put(b, buf.check(b, j))
        assert buf.size <= 2 * buf.fill + RowBuffer.SLACK
        assert sum(len(s["i"]) for s in buf.segs if s is not None) == buf.size
    assert buf.fill == 10 and buf.size == 10
