"""Resuming from a state: by seeking where the stages allow it, exactly in every case."""

from __future__ import annotations

import asyncio
import json
import struct
import threading
import time

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import aioflow as af

FAST = settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def interrupted(make, k, *, via_json=True):
    """The state after ``k`` items of a fresh pipeline's first epoch."""
    with make().iter() as it:
        head = [next(it) for _ in range(k)]
        state = it.state_dict()
    return head, (json.loads(json.dumps(state)) if via_json else state)


def resumed(make, state):
    with make().iter(state=state) as it:
        return list(it)


class Counting:
    """A random-access source that counts its reads."""

    def __init__(self, n):
        self.n = n
        self.reads = 0

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        self.reads += 1
        return i


# -- seeking ------------------------------------------------------------------------------
def test_an_index_source_resumes_by_seeking_without_reading_what_came_before():
    ds = Counting(100_000)
    calls = []

    def f(x):
        calls.append(x)
        return x

    def make():
        return af.from_source(ds, shuffle=True, seed=1).map(f).batch(64, collate=list)

    whole = make().to_list()
    head, state = interrupted(make, 1400)
    assert state["nodes"] is not None  # a seekable state, not a replay
    ds.reads, calls[:] = 0, []
    tail = resumed(make, state)
    assert head + tail == whole
    left = 100_000 - 1400 * 64
    assert ds.reads == left and len(calls) == left  # nothing before the position re-read


def test_the_state_is_small_and_json_safe_whatever_the_position():
    def make():
        return af.from_source(range(10**6), shuffle=True, seed=3).map(abs).batch(256)

    _, early = interrupted(make, 1)
    _, late = interrupted(make, 3000)
    assert len(json.dumps(late)) < 1000 and len(json.dumps(early)) < 1000


def test_take_skip_enumerate_and_prefetch_keep_their_counts_in_the_state():
    def make():
        return (
            af.from_source(range(500), shuffle=True, seed=9)
            .skip(7)
            .enumerate(start=100)
            .take(300)
            .prefetch(8)
            .batch(5, collate=list)
        )

    whole = make().to_list()
    for k in (0, 1, 13, 59, 60):
        head, state = interrupted(make, k)
        assert head + resumed(make, state) == whole
    _, state = interrupted(make, 13)
    nodes = [v for v in state["nodes"].values() if v]
    assert {"left": 300 - 65} in nodes and {"next": 165} in nodes and {"left": 0} in nodes


def test_a_resumed_run_can_be_interrupted_and_resumed_again():
    def make():
        return (
            af.from_source(list(range(300)), shuffle=True, seed=0).map(str).batch(4, collate=list)
        )

    whole = make().to_list()
    _, s1 = interrupted(make, 10)
    with make().iter(state=s1) as it:
        [next(it) for _ in range(20)]
        s2 = it.state_dict()
    assert resumed(make, s2) == whole[30:]


async def test_async_iteration_resumes_by_seeking_too():
    def make():
        return af.from_source(range(1000), shuffle=True, seed=2).batch(10, collate=list)

    whole = await make().collect()
    async with make().aiter() as it:
        head = [await anext(it) for _ in range(33)]
        state = it.state_dict()
    assert state["nodes"] is not None
    async with make().aiter(state=state) as it:
        tail = [b async for b in it]
    assert head + tail == whole


def test_a_state_from_another_shard_or_seed_is_refused():
    def rank(i, seed=0):
        return af.from_source(range(100), shuffle=True, seed=seed, shard=(2, i))

    _, state = interrupted(lambda: rank(0), 5)
    with pytest.raises(af.StateMismatch, match="merge_states"):
        list(rank(1).iter(state=state))
    with pytest.raises(af.StateMismatch, match="seed"):
        list(rank(0, seed=1).iter(state=state))


def test_a_random_seed_is_kept_in_the_state():
    data = list(range(100))
    head, state = interrupted(lambda: af.from_source(data, shuffle=True), 30)
    tail = resumed(lambda: af.from_source(data, shuffle=True), state)
    assert sorted(head + tail) == data


def write_jsonl(path, n):
    with open(path, "w") as f:
        for i in range(n):
            f.write(json.dumps({"i": i}) + ("\n\n" if i % 5 == 0 else "\n"))


def test_read_jsonl_resumes_at_the_byte_offset_of_the_block(tmp_path):
    path = tmp_path / "a.jsonl"
    write_jsonl(path, 200_000)

    def make():
        return af.read_jsonl(path).map(lambda r: r["i"]).batch(100, collate=list)

    whole = make().to_list()
    for k in (0, 1, 777, 1999, 2000):
        head, state = interrupted(make, k)
        assert head + resumed(make, state) == whole
    _, state = interrupted(make, 1500)
    where = next(v for v in state["nodes"].values() if v)
    assert where["offset"] > 0 and where["skip"] < 150_000


def test_read_lines_and_read_tfrecord_resume_by_offset(tmp_path):
    from aioflow.io.tfrecord import masked_crc

    lines = tmp_path / "a.txt"
    lines.write_text("".join(f"line {i}\n" for i in range(100_000)))
    rec = tmp_path / "a.tfrecord"
    with open(rec, "wb") as f:
        for i in range(5000):
            data = str(i).encode() * (i % 7 + 1)
            n = struct.pack("<Q", len(data))
            f.write(
                n + struct.pack("<I", masked_crc(n)) + data + struct.pack("<I", masked_crc(data))
            )
    for make in (
        lambda: af.read_lines(lines).batch(50, collate=list),
        lambda: af.read_tfrecord(rec),
    ):
        whole = make().to_list()
        for k in (3, len(whole) // 2):
            head, state = interrupted(make, k)
            assert state["nodes"] is not None
            assert head + resumed(make, state) == whole


def test_repeat_resumes_in_its_epoch_with_that_epoch_s_permutation():
    def make():
        p = af.from_source(range(1000), shuffle=True, seed=1).map(abs).repeat(4)
        return p.batch(64, collate=list)

    whole = make().to_list()
    assert whole[0] != whole[16]  # another permutation per epoch
    for k in (1, 15, 16, 17, 40, 62):
        head, state = interrupted(make, k)
        assert head + resumed(make, state) == whole
    _, state = interrupted(make, 40)
    assert {"epoch": 2} in state["nodes"].values()


def test_a_repeat_inside_a_repeat_resumed_in_a_later_outer_epoch_gives_the_rest():
    # the source's epoch there is not the outer repeat's: it replays (it took the state
    # of the source's opening one outer epoch back, with its permutation, while kept)
    def make():
        return af.from_source(range(2000), shuffle=True, seed=3).repeat(2).repeat(2)

    whole = make().to_list()
    for k in (10, 2010, 4010, 6010):
        head, state = interrupted(make, k)
        assert head + resumed(make, state) == whole


def test_a_repeat_resumed_at_the_end_of_an_epoch_goes_on_with_the_next_epoch():
    def make():
        return af.range(1).repeat(3)

    _, state = interrupted(make, 2)
    # after 2 items, as a run saves it before it began the third epoch (timing): the
    # second epoch (the source's opening 1) with the source at its end: an empty rest
    # of an epoch, not an empty input
    state["nodes"] = {"0": {"epoch": 1}, "1": {"next": 1}}
    state["opens"] = {"0": 0, "1": 1}
    state["counts"] = {"0": 2, "1": 1}
    assert resumed(make, state) == [0]


def test_a_shuffle_buffer_saves_what_it_holds_and_its_generator():
    ds = Counting(3000)

    def make():
        return af.from_source(ds, shuffle=True, seed=3).shuffle(200, seed=4).batch(16, collate=list)

    whole = make().to_list()
    for k in (0, 1, 60, 180, len(whole) - 1, len(whole)):
        head, state = interrupted(make, k)
        ds.reads = 0
        assert head + resumed(make, state) == whole
        assert ds.reads <= max(0, 3000 - 16 * k) + 16 * 8  # the source seeks: no replay
    _, state = interrupted(make, 60)
    (buf,) = [v for v in state["nodes"].values() if isinstance(v, dict) and "buf" in v]
    assert len(buf["buf"]) == 200 and "state" in buf["rng"]


# -- what cannot seek replays; what cannot be exact refuses -------------------------------
def test_filter_and_unbatch_resume_by_seeking_at_the_chunk():
    calls = []

    def odd(x):
        calls.append(x)
        return x % 2

    def make():
        p = af.from_source(range(5000), shuffle=True, seed=2).filter(odd).batch(3).unbatch()
        return p.map(int).batch(10, collate=list)

    whole = make().to_list()
    head, state = interrupted(make, 200)
    assert state["nodes"] is not None
    calls.clear()
    assert head + resumed(make, state) == whole
    assert len(calls) <= 5000 - 2 * 200 * 10 + 2 * 256  # at most a chunk computed again


def test_a_window_with_a_gap_resumes_where_its_input_had_not_made_the_gap_yet():
    # CI: window(1, shift=2) after interleave and flat_map gave another rest now and then.
    # k windows had taken (k - 1) * shift + size items, but the state asked the stages
    # above for their place after k * shift, which flat_map had not reached: its log
    # answered with the last element it had, k * shift items past its start.
    gate = threading.Event()

    async def held(x):  # element 2 comes only once the state is taken
        while x == 2 and not gate.is_set():
            await asyncio.sleep(0.005)
        return x

    def make():
        p = af.range(6).map(held, concurrency=1)
        return p.flat_map(lambda x: [(x, j) for j in range(3)]).window(1, shift=4)

    gate.set()
    whole = make().to_list()
    gate.clear()
    with make().iter() as it:
        head = [next(it) for _ in range(2)]
        state = json.loads(json.dumps(it.state_dict()))
        gate.set()
    assert state["nodes"] is not None  # it seeks: the gap is in the window's state
    with make().iter(state=state) as it:
        more = [next(it)]
        again = json.loads(json.dumps(it.state_dict()))
    assert head + more + resumed(make, again) == whole
    assert head + resumed(make, state) == whole


def test_a_state_taken_while_a_slow_sync_consumer_lags_still_seeks():
    # The sync hand-off holds up to 64 light chunks (issue 27, point 7), but a shuffle's
    # log reaches back 16 of its chunks: with it in the graph the hand-off keeps to its
    # few chunks, or the state would replay the epoch up to the consumer's place.
    def make():
        return af.range(200_000).shuffle(1_000, seed=5).batch(256)

    with make().iter() as it:
        head = [next(it)]
        time.sleep(0.5)  # the run goes as far ahead as the hand-offs let it
        head.append(next(it))
        state = json.loads(json.dumps(it.state_dict()))
    assert state["nodes"] is not None  # it seeks
    got = head + resumed(make, state)
    whole = make().to_list()
    assert len(got) == len(whole)
    assert all(np.array_equal(a, b) for a, b in zip(got, whole, strict=True))


def test_a_window_state_with_another_gap_is_a_state_mismatch():
    def make():
        return af.range(20).window(2, shift=5)

    _, state = interrupted(make, 2)
    key = next(k for k, v in state["nodes"].items() if v and "gap" in v)
    assert state["nodes"][key] == {"gap": 3}
    state["nodes"][key] = {"gap": 1}
    with pytest.raises(af.StateMismatch, match="gap"):
        list(make().iter(state=state))


def test_stages_without_a_seekable_state_fall_back_to_replaying_exactly():
    def make():
        p = af.from_source(range(400), shuffle=True, seed=5).scan(0, lambda s, x: (s + x, s))
        p = p.sort_by(lambda x: x % 7, buffer_size=20).batch(5, collate=list)
        return p.rebatch(7)  # (rebatch keeps no state: it replays)

    whole = make().to_list()
    head, state = interrupted(make, 11)
    assert state["nodes"] is None
    assert head + resumed(make, state) == whole


@pytest.mark.parametrize(
    "make",
    [
        lambda: af.range(100).map(abs, concurrency=4, executor="thread", ordered=False),
        lambda: af.range(100).partition_by(lambda x: x % 2, 2, lambda q: q.map(abs)),
        lambda: af.range(4).interleave(lambda x: af.range(x), cycle_length=2, ordered=False),
    ],
    ids=["unordered-map", "partition_by", "unordered-interleave"],
)
def test_a_state_through_an_order_that_depends_on_timing_is_refused_naming_the_stage(make):
    # issue 12, point 10: this used to resume silently with items lost and duplicated
    with make().iter() as it:
        next(it)
        with pytest.raises(af.PipelineError, match="cannot take a resumable state: stage '"):
            it.state_dict()


def test_a_state_from_a_same_shaped_pipeline_with_another_function_is_refused():
    # issue 12, point 10: both maps are "map(<lambda>)"; the state was accepted
    with af.range(10).map(lambda x: x + 1).iter() as it:
        next(it)
        state = it.state_dict()
    with pytest.raises(af.StateMismatch, match=r"stage 'map\(<lambda>\)' differs"):
        af.range(10).map(lambda x: x * 2).iter(state=state)
    assert list(af.range(10).map(lambda x: x + 1).iter(state=state)) == list(range(2, 11))


@pytest.mark.parametrize("field", ["position", "opens"])
def test_a_state_with_negative_counts_is_a_state_mismatch(field):
    # issue 12, point 9: negative open indexes raised a bare ValueError from numpy
    def make():
        return af.range(50).shuffle(10, seed=1)

    with make().iter() as it:
        next(it)
        state = it.state_dict()
    if field == "position":
        state["position"] = -3
    else:
        state["opens"] = {k: -1 for k in state["opens"]}
    with pytest.raises(af.StateMismatch, match="count >= 0"):
        list(make().iter(state=state))


def test_a_node_state_out_of_range_is_a_state_mismatch():
    def make():
        return af.from_source(range(50))

    _, state = interrupted(make, 3)
    key = next(k for k, v in state["nodes"].items() if v)
    state["nodes"][key]["ranges"] = [[0, 999]]
    with pytest.raises(af.StateMismatch, match="out of range"):
        list(make().iter(state=state))


# -- property tests -----------------------------------------------------------------------
STAGES = {
    "map": lambda p, a: p.map(lambda x, a=a: x * 3 + a),
    "thread-map": lambda p, a: p.map(lambda x: x - 1, executor="thread", concurrency=2),
    "batch": lambda p, a: p.batch(a % 5 + 1, collate=list).map(sum),
    "take": lambda p, a: p.take(a * 9 + 1),
    "skip": lambda p, a: p.skip(a),
    "enumerate": lambda p, a: p.enumerate(a).map(lambda t: t[0] * t[1]),
    "prefetch": lambda p, a: p.prefetch(a % 4 + 1),
    "filter": lambda p, a: p.filter(lambda x, a=a: (x + a) % 3 != 0),
    "shuffle": lambda p, a: p.shuffle(a % 7 + 1, seed=a),
    "flat_map": lambda p, a: p.flat_map(lambda x: [x] * (x % 3)),
    "repeat": lambda p, a: p.repeat(a % 3 + 1),
    "window": lambda p, a: p.window(a % 4 + 1, shift=a % 3 + 1, drop_remainder=a % 2 == 0).map(sum),
    "interleave": lambda p, a: p.interleave(
        lambda x: af.range(x % 11), cycle_length=a % 3 + 1, block_length=a % 4 + 1
    ),
    "resample": lambda p, a: p.rejection_resample(lambda x: x % 2, [0.3, 0.7], seed=a),
    "sort_by": lambda p, a: p.sort_by(lambda x: x % 13, buffer_size=a % 5 + 1),
    "sort_by-delay": lambda p, a: p.sort_by(lambda x: x, max_delay=a, on_late="drop"),
    "group_by": lambda p, a: p.group_by(lambda x: x % 3, size=a % 4 + 1).map(lambda g: sum(g[1])),
    "scan": lambda p, a: p.scan(a, lambda s, x: (s + x, s - x)),
    "sessions": lambda p, a: p.sessions(lambda x: x, 3, by=lambda x: x % 2, max_delay=a).map(
        lambda w: sum(w.items)
    ),
    "interleave-lists": lambda p, a: p.interleave(
        lambda x: [x] * (x % 4), cycle_length=2, concurrency=2
    ),
}
chains = st.lists(st.tuples(st.sampled_from(sorted(STAGES)), st.integers(0, 20)), max_size=4)


def _chain(p, chain):
    for name, a in chain:
        p = STAGES[name](p, a)
    return p


@FAST
@given(st.integers(0, 400), st.booleans(), chains, st.data())
def test_any_pipeline_over_an_index_source_resumed_anywhere_equals_the_whole_run(
    n, shuffle, chain, data
):
    def make():
        return _chain(af.from_source(range(n), shuffle=shuffle, seed=3), chain)

    whole = make().to_list()
    k = data.draw(st.integers(0, len(whole)))
    head, state = interrupted(make, k)
    assert head + resumed(make, state) == whole
    # a resumed run, interrupted and resumed again
    with make().iter(state=state) as it:
        more = [next(it) for _ in range(data.draw(st.integers(0, len(whole) - k)))]
        again = json.loads(json.dumps(it.state_dict()))
    assert head + more + resumed(make, again) == whole


@FAST
@given(st.integers(0, 3000), chains, st.data())
def test_any_pipeline_over_a_file_resumed_anywhere_equals_the_whole_run(
    tmp_path_factory, n, chain, data
):
    path = tmp_path_factory.mktemp("jsonl") / "a.jsonl"
    write_jsonl(path, n)

    def make():
        return _chain(af.read_jsonl(path).map(lambda r: r["i"]), chain)

    whole = make().to_list()
    k = data.draw(st.integers(0, len(whole)))
    head, state = interrupted(make, k)
    assert head + resumed(make, state) == whole


@FAST
@given(st.integers(0, 600), st.integers(1, 5), st.integers(1, 5), st.booleans(), st.data())
def test_n_ranks_resumed_on_m_ranks_read_every_item_of_the_epoch_exactly_once(
    size, n, m, shuffle, data
):
    def rank(k, i):
        return af.from_source(range(size), shuffle=shuffle, seed=7, shard=(k, i)).batch(
            3, collate=list
        )

    seen, states = [], []
    for i in range(n):
        batches = len(rank(n, i))
        head, state = interrupted(lambda i=i: rank(n, i), data.draw(st.integers(0, batches)))
        seen += [x for b in head for x in b]
        states.append(state)
    new = af.merge_states(states, num_shards=m)
    parts = [[x for b in rank(m, j).iter(state=new[j]) for x in b] for j in range(m)]
    assert sorted(seen + [x for part in parts for x in part]) == list(range(size))
    left = size - len(seen)
    assert all(abs(len(part) - left / m) <= n + 1 for part in parts)  # an even split


def test_merge_states_refuses_states_that_do_not_fit():
    def rank(i, k=2):
        return af.from_source(range(100), shard=(k, i)).map(abs)

    _, s0 = interrupted(lambda: rank(0), 3)
    with pytest.raises(af.StateMismatch, match="one state per rank"):
        af.merge_states([s0, s0], num_shards=3)
    _, t = interrupted(lambda: af.from_source(range(100)).take(50), 3)
    with pytest.raises(af.StateMismatch, match="hold nothing"):
        af.merge_states([t], num_shards=2)
    _, r = interrupted(lambda: af.from_source(range(100)).scan([], lambda s, x: (s, x)), 3)
    with pytest.raises(af.StateMismatch, match="replays"):
        af.merge_states([r], num_shards=2)


# -- the Stateful protocol ----------------------------------------------------------------
def test_stateful_loader_resumes_mid_epoch_and_a_finished_epoch_starts_afresh():
    def make():
        return af.StatefulLoader(
            af.from_source(range(40), shuffle=True, seed=1).batch(4, collate=list)
        )

    whole = list(make())
    loader = make()
    it = iter(loader)
    head = [next(it) for _ in range(3)]
    sd = json.loads(json.dumps(loader.state_dict()))
    again = make()
    again.load_state_dict(sd)
    assert head + list(again) == whole
    done = again.state_dict()
    fresh = make()
    fresh.load_state_dict(done)
    assert sorted(x for b in fresh for x in b) == list(range(40))


def test_stateful_loader_refuses_a_foreign_state():
    with pytest.raises(af.StateMismatch):
        af.StatefulLoader(af.range(3)).load_state_dict({"epoch": 1})


@pytest.mark.filterwarnings("ignore:'set_vital' is deprecated")  # torchdata 0.11 on torch 2.13
def test_torchdata_stateful_dataloader_checkpoints_an_aioflow_pipeline_unchanged():
    pytest.importorskip("torch")
    sdl = pytest.importorskip("torchdata.stateful_dataloader")
    from aioflow.integrations.torch import stateful_dataset

    def make():
        p = af.from_source(range(200), shuffle=True, seed=4).batch(8, collate=list)
        return sdl.StatefulDataLoader(stateful_dataset(p), batch_size=None)

    assert isinstance(stateful_dataset(af.range(1)), sdl.Stateful)
    whole = list(make())
    dl = make()
    head = []
    for i, b in enumerate(dl):
        head.append(b)
        if i == 9:
            break
    sd = dl.state_dict()  # checkpointing code written for StatefulDataLoader
    dl2 = make()
    dl2.load_state_dict(sd)
    assert head + list(dl2) == whole


def test_files_read_through_flat_map_resume_at_the_file_and_offset(tmp_path):
    for f in range(4):
        write_jsonl(tmp_path / f"{f}.jsonl", 9000 * f)

    def make():
        files = af.list_files(str(tmp_path / "*.jsonl"), shuffle=True, seed=3)
        return files.flat_map(af.read_jsonl).map(lambda r: r["i"]).batch(50, collate=list)

    whole = make().to_list()
    for k in (0, 1, 100, 179, 180, 300, len(whole)):
        head, state = interrupted(make, k)
        assert state["nodes"] is not None
        assert head + resumed(make, state) == whole
    _, state = interrupted(make, 300)
    subs = [v["sub"] for v in state["nodes"].values() if isinstance(v, dict) and "sub" in v]
    assert subs and subs[0]["offset"] > 0  # inside the file, by offset


@pytest.mark.parametrize("concurrency", [None, 3])
def test_files_read_through_interleave_resume_at_each_slot_s_offset(tmp_path, concurrency):
    for f in range(6):
        write_jsonl(tmp_path / f"{f}.jsonl", 4000 * f + 3)

    def make():
        files = af.list_files(str(tmp_path / "*.jsonl"), shuffle=True, seed=1)
        p = files.interleave(af.read_jsonl, cycle_length=3, block_length=4, concurrency=concurrency)
        return p.map(lambda r: r["i"]).batch(32, collate=list)

    whole = make().to_list()
    for k in (0, 1, 7, 100, len(whole) // 2, len(whole) - 1, len(whole)):
        head, state = interrupted(make, k)
        assert state["nodes"] is not None
        with make().iter(state=state) as it:  # resumed, then interrupted and resumed again
            more = [next(it) for _ in range(min(5, len(whole) - k))]
            again = json.loads(json.dumps(it.state_dict()))
        assert head + more + resumed(make, again) == whole
    _, state = interrupted(make, 200)
    (il,) = [v for v in state["nodes"].values() if isinstance(v, dict) and "slots" in v]
    assert any(s and s[1] and s[1]["offset"] + s[1]["skip"] > 0 for s in il["slots"])


def test_one_item_files_over_list_files_resume_at_the_file(tmp_path):
    import numpy as np

    for f in range(30):
        np.save(tmp_path / f"{f:02d}.npy", np.full(3, f))

    def make():
        files = af.list_files(str(tmp_path / "*.npy"))
        return files.flat_map(af.read_npy).map(lambda a: int(a[0])).batch(4, collate=list)

    whole = make().to_list()
    head, state = interrupted(make, 3)
    assert {"next": 12} in state["nodes"].values()  # the file list seeks
    assert head + resumed(make, state) == whole
    raw = lambda: af.list_files(str(tmp_path / "*.npy")).flat_map(af.read_bytes)  # noqa: E731
    head, state = interrupted(raw, 7)
    assert head + resumed(raw, state) == raw().to_list()


def test_the_fingerprint_is_the_same_in_another_process():
    import os
    import subprocess
    import sys

    code = (
        "import aioflow as af; from aioflow._state.state import fingerprint;"
        " print(fingerprint(af.range(9).filter(lambda x: str(x) in {'1', '2', 'x', 'y'})"
        ".map(lambda x: (x, {'a': 1}))))"
    )
    prints = {
        subprocess.run(
            [sys.executable, "-c", code],
            env={**os.environ, "PYTHONHASHSEED": str(seed)},
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        for seed in (1, 2, 3)
    }
    assert len(prints) == 1


def test_a_take_ended_under_a_short_last_batch_resumes_to_nothing_more():
    # found by hypothesis: batch counts its short last batch as a full one, so take(1)
    # was told 2 items had passed and saved left=-1, which means "take all"
    def make():
        return af.from_source(range(3), seed=3).take(1).batch(2, collate=list).map(sum)

    head, state = interrupted(make, 1)
    assert head == [0] and resumed(make, state) == []


def test_a_run_resumed_by_seeking_then_interrupted_where_it_must_replay_resumes_exactly():
    # Found by hypothesis: the state of a run resumed by seeking that falls back to
    # replaying (nodes null) carried the open indexes of the nodes' *current* openings
    # (the source's 2nd permutation), so the replay re-ran the epoch from the wrong
    # permutation: a mismatch at the second resume point.
    def make():
        p = af.from_source(range(19), shuffle=True, seed=3)
        return p.interleave(lambda x: af.range(x % 11), cycle_length=3, block_length=1).repeat(
            3
        ).repeat(2)

    # (taken under `async for`: there the run gets ahead of the consumer only when the
    # consumer waits, so whether a state seeks does not hang on two threads' timing; under
    # `for` the engine's thread raced ahead now and then, and the first state replayed)
    async def take(k, state=None):
        async with make().aiter(state=state) as it:
            got = [await it.__anext__() for _ in range(k)]
            return got, json.loads(json.dumps(it.state_dict()))

    whole = make().to_list()
    head, state = asyncio.run(take(85))
    assert state["nodes"] is not None  # resumed by seeking
    more, again = asyncio.run(take(287, state))
    assert again["nodes"] is None  # falls back to replaying
    assert head + more + resumed(make, again) == whole


def test_a_state_taken_as_shuffle_flushes_its_buffer_resumes_exactly():
    """A state taken between shuffle's drawing its final permutation and logging it held
    the generator after the draw, so the resumed run flushed in another order (hypothesis
    found it: about 1 in 3 runs of this chain, resumed, interrupted and resumed again)."""
    chain = [("resample", 3), ("take", 14), ("prefetch", 11), ("shuffle", 16)]

    def make():
        return _chain(af.from_source(range(310), shuffle=True, seed=3), chain)

    whole = make().to_list()
    head, state = interrupted(make, 114)
    for _ in range(30):  # (the race: the run ahead of the consumer, in its own thread)
        with make().iter(state=state) as it:
            more = [next(it) for _ in range(10)]
            again = json.loads(json.dumps(it.state_dict()))
        assert head + more + resumed(make, again) == whole
