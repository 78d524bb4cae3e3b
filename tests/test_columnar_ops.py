"""filter by a row mask, group_by and partition_by a column on record batches, against
per item."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest
from _columnar import batch_of, batched, flat, run, source, window_rows
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import aioflow as af
from aioflow.ops.columnar import partitions
from aioflow.ops.partition import _stable_hash, partition_of

FAST = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _mask(b):
    if isinstance(b, dict):
        return b["t"] % 3 != 0
    return pc.not_equal(pc.bit_wise_and(b["t"], 1), 0)  # (a pyarrow boolean array)


def _keep(r):
    return r["t"] % 3 != 0 if isinstance(r, dict) and not isinstance(r["t"], np.ndarray) else r


@FAST
@given(batched(), st.sampled_from([None, "thread"]))
def test_filter_by_a_row_mask_keeps_the_rows_the_per_item_filter_keeps(data, executor):
    rows, batches, _, kind = data

    def want_row(r):
        return r["t"] % 3 != 0 if kind == "dict" else r["t"] % 2 == 1

    got, _ = run(source(batches).filter(_mask, executor=executor))
    assert flat(got) == [r for r in rows if want_row(r)]
    assert all((b.num_rows if kind == "arrow" else len(b["t"])) > 0 for b in got)


def test_filter_of_batches_by_a_plain_truth_keeps_whole_batches():
    bs = [batch_of([{"t": t, "k": 0, "i": 0, "v": 1.0}], "arrow") for t in range(4)]
    got = source(bs).filter(lambda b: b.num_rows and b["t"][0].as_py() % 2 == 0).to_list()
    assert [b["t"][0].as_py() for b in got] == [0, 2]
    assert af.from_iterable([1, 2, 3, 4]).filter(lambda x: x % 2).to_list() == [1, 3]


@FAST
@given(batched(keys=4), st.integers(0, 11))
def test_columnar_group_by_equals_the_per_item_group_by(data, a):
    rows, batches, _, _ = data
    size, most = (None, a % 4 + 1)[a % 3 != 0], (None, a % 3 + 1)[a % 2]
    want, _ = run(af.from_iterable(rows).group_by("k", size=size, max_keys=most))
    got, _ = run(source(batches).group_by("k", size=size, max_keys=most))
    assert flat(got) == [{"key": k, "items": items} for k, items in want]
    with source(batches).group_by("k", size=size, max_keys=most).iter() as it:
        list(it)
        evicted = sum(s.evicted for s in it.stats().stages)
    with af.from_iterable(rows).group_by("k", size=size, max_keys=most).iter() as it:
        list(it)
        assert evicted == sum(s.evicted for s in it.stats().stages)


@given(st.lists(st.integers(-(2**63), 2**63 - 1), max_size=50), st.integers(1, 7))
def test_partitions_of_a_column_are_those_of_partition_of(keys, n):
    got = partitions(np.array(keys, np.int64), n, _stable_hash).tolist()
    assert got == [partition_of(k, n) for k in keys]
    words = [f"user-{k % 97}" for k in keys]
    got = partitions(np.array(words), n, _stable_hash).tolist()
    assert got == [partition_of(w, n) for w in words]


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(batched(), st.integers(0, 10))
def test_sessions_under_partition_by_a_column_are_the_same_sessions(data, a):
    rows, batches, jitter, _ = data
    gap = a % 5 + 1

    def job(p):
        return p.sort_by("t", max_delay=jitter).sessions("t", gap, by="k")

    def key(s):
        return (s["key"], s["start"], [r["i"] for r in s["items"]])

    want, _ = run(job(af.from_iterable(rows)))
    whole, _ = run(job(source(batches)))
    parted, late = run(source(batches).partition_by("k", 2, job))
    assert late == 0
    assert sorted(map(key, flat(parted))) == sorted(map(key, flat(whole)))
    assert sorted(map(key, flat(whole))) == sorted(map(key, window_rows(want)))


def test_partition_by_a_column_sends_each_row_to_its_keys_partition():
    b = pa.record_batch({"u": ["a", "b", "c", "a", "d"], "x": [0, 1, 2, 3, 4]})
    got = source([b]).partition_by("u", 3, lambda q: q.map(lambda s: s.to_pylist())).to_list()
    for part in got:
        assert len({partition_of(r["u"], 3) for r in part}) == 1
    assert sorted(r["x"] for part in got for r in part) == [0, 1, 2, 3, 4]


def _resample(p, a):
    initial = (None, [0.5, 0.3, 0.2])[a % 2]
    return p.rejection_resample("k", [0.2, 0.3, 0.5], initial_dist=initial, seed=a)


@FAST
@given(batched(), st.integers(0, 11))
def test_columnar_rejection_resample_keeps_the_rows_the_per_item_one_keeps(data, a):
    rows, batches, _, kind = data
    want, _ = run(_resample(af.from_iterable(rows), a))
    got, _ = run(_resample(source(batches), a))
    assert flat(got) == want
    assert all((b.num_rows if kind == "arrow" else len(b["t"])) > 0 for b in got)


def test_columnar_rejection_resample_refuses_bad_classes_clearly():
    b = batch_of([{"t": 1, "k": 5, "i": 0, "v": 1.0}], "arrow")
    with pytest.raises(af.PipelineError, match="outside"):
        source([b]).rejection_resample("k", [0.5, 0.5], seed=0).to_list()
