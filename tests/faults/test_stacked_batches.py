"""``map(fn, executor="process").batch(n)``: the workers stack each batch's results
(``_columns``, map-and-batch fusion) and the batches are those of the same map without
it, through errors, skips, a short last batch, an upstream failure and a resume. Every
scenario runs under the fault guard."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import aioflow as af
import aioflow.ops.batching
from tests._same import same
from tests.faults import _procfns as fns

PROCESS: dict[str, Any] = {"executor": "process", "concurrency": 2}


def all_same(xs: list[Any], ys: list[Any]) -> bool:
    return len(xs) == len(ys) and all(same(x, y) for x, y in zip(xs, ys, strict=True))


@pytest.fixture
def from_columns(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """How many batches ``batch`` made from a worker's stacked columns."""
    made = [0]
    real = aioflow.ops.batching.collated

    def counting(*args: Any) -> Any:
        made[0] += 1
        return real(*args)

    monkeypatch.setattr(aioflow.ops.batching, "collated", counting)
    return made


@pytest.mark.parametrize("drop_remainder", [False, True])
def test_the_workers_stack_every_whole_batch_and_the_batches_are_the_same(
    from_columns, drop_remainder
):
    p = af.range(50).map(fns.sample, **PROCESS).batch(8, drop_remainder=drop_remainder)
    want = af.range(50).map(fns.sample).batch(8, drop_remainder=drop_remainder).to_list()
    with p:
        got = p.to_list()
        # every batch (the short last one too, unless dropped) made of stacked results
        assert from_columns[0] == (6 if drop_remainder else 7)
        assert all_same(got, want)
        assert type(got[0]["meta"]) is fns.Meta and got[0]["meta"].name == [
            f"s{i}" for i in range(8)
        ]
        assert all_same(p.to_list(), want)  # and again, on the warm pool
    assert from_columns[0] == (12 if drop_remainder else 14)


def test_slow_items_spread_over_the_workers_and_their_parts_join_into_batches(from_columns):
    with af.range(64).map(fns.slow_sample, **PROCESS).batch(8) as p:
        got = p.to_list()
    assert [b[0][:, 0].tolist() for b in got] == [list(range(i, i + 8)) for i in range(0, 64, 8)]
    assert from_columns[0] == 8  # every batch from stacked parts
    # the calls started before one was timed are whole batches (one worker's each); then
    # ~50 ms calls of 30 ms items: later batches come from both workers
    assert len(set(got[0][1].tolist())) == 1
    assert any(len(set(b[1].tolist())) == 2 for b in got[4:])


def test_an_unordered_map_stacks_too_and_delivers_every_item_once(from_columns):
    # (its calls complete in any order: batches are cut from their rows as they come)
    with af.range(40).map(fns.sample, ordered=False, **PROCESS).batch(8) as p:
        got = p.to_list()
    assert from_columns[0] == len(got) == 5
    assert sorted(i for b in got for i in b["meta"].index.tolist()) == list(range(40))
    assert all(np.array_equal(b["img"][:, 0, 0, 0], b["meta"].index) for b in got)


def test_torch_batches_are_tensors_over_the_stacked_arrays(from_columns):
    pytest.importorskip("torch")
    with af.range(20).map(fns.sample, **PROCESS).batch(8, collate="torch") as p:
        got = p.to_list()
    want = af.range(20).map(fns.sample).batch(8, collate="torch").to_list()
    assert from_columns[0] == 3
    assert all_same(got, want)


def test_after_a_skipped_item_the_shifted_batches_are_stacked_ones_again(from_columns):
    opts = {"on_error": "skip"}
    p = af.range(60).map(fns.sample_but_20, **PROCESS, **opts).batch(8)
    want = af.range(60).map(fns.sample_but_20, **opts).batch(8).to_list()
    with p.iter() as it:
        got = list(it)
        skipped = it.stats()["map(sample_but_20)"].errors_skipped
    p.close()
    assert skipped == 1
    assert all_same(got, want)
    # all but the batch of the failing call's items, which the next call's rows end
    assert len(got) == 8 and from_columns[0] == 7


def test_a_failing_item_raises_after_the_batches_before_it():
    def run(p: af.Pipeline) -> tuple[list[Any], BaseException]:
        out = []
        with pytest.raises(fns.Boom) as info, p.iter() as it:
            for b in it:
                out.append(b)
        return out, info.value

    p = af.range(60).map(fns.sample_but_3_mod_7, **PROCESS).batch(8)
    got, err = run(p)
    p.close()
    want, want_err = run(af.range(60).map(fns.sample_but_3_mod_7).batch(8))
    assert got == [] and want == []  # item 3 is in the first batch
    assert err.args == want_err.args == ("process", 3)
    assert any("at item 3" in n for n in err.__notes__)


def test_an_upstream_error_mid_batch_delivers_the_same_batches_first(from_columns):
    def run(p: af.Pipeline) -> list[Any]:
        out = []
        with pytest.raises(fns.Boom), p.iter() as it:
            for b in it:
                out.append(b)
        return out

    up = af.range(30).map(fns.fail_at_20)
    p = up.map(fns.sample, **PROCESS).batch(8)
    got = run(p)
    p.close()
    assert all_same(got, run(up.map(fns.sample).batch(8)))
    assert len(got) == 2 and from_columns[0] == 2


def test_a_stacked_batch_pipeline_resumes_where_it_stopped():
    def pipe(**opts: Any) -> af.Pipeline:
        src = af.from_source(list(range(64)), shuffle=True, seed=3)
        return src.map(fns.sample, **opts).batch(8)

    want = pipe().to_list()
    p = pipe(**PROCESS)
    with p.iter() as it:
        head = [next(it) for _ in range(3)]
        state = it.state_dict()
    with p.iter(state=state) as it:
        rest = list(it)
    p.close()
    assert all_same(head + rest, want)


def test_results_that_do_not_stack_travel_as_items(from_columns):
    with af.range(20).map(_ragged, **PROCESS).batch(4, collate=list) as p:
        assert [len(b) for b in p.to_list()] == [4] * 5  # (list: nothing to stack for)
    with af.range(20).map(fns.slow_pid, **PROCESS).batch(4) as p:
        assert [b[0].tolist() for b in p.to_list()] == [
            list(range(i, i + 4)) for i in range(0, 20, 4)
        ]
    assert from_columns[0] == 0  # slow_pid's results have no array to stack


def _ragged(x: int) -> np.ndarray:
    return np.zeros(x)
