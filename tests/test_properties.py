"""Property tests over random compositions of operators."""

from __future__ import annotations

import json

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import aioflow as af

FAST = settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])

# operators that keep a pipeline of ints deterministic, each as (name, fn)
OPS = {
    "map": lambda p, a: p.map(lambda x, a=a: x * 3 + a),
    "filter": lambda p, a: p.filter(lambda x, a=a: (x + a) % 3 != 0),
    "take": lambda p, a: p.take(a * 7 + 1),
    "skip": lambda p, a: p.skip(a),
    "repeat": lambda p, a: p.repeat(a % 3 + 1),
    "batch-unbatch": lambda p, a: p.batch(a % 5 + 1).unbatch().map(int),
    "flat_map": lambda p, a: p.flat_map(lambda x, a=a: [x] * (x % 3)),
    "scan": lambda p, a: p.scan(0, lambda s, x: (s + x, s + x)),
    "prefetch": lambda p, a: p.prefetch(a % 4 + 1),
    "thread-map": lambda p, a: p.map(lambda x: x - 1, executor="thread", concurrency=2),
    "enumerate": lambda p, a: p.enumerate().map(lambda t: t[0] + t[1]),
    "shard": lambda p, a: p.shard(a % 3 + 1, 0),
}

ops = st.lists(st.tuples(st.sampled_from(sorted(OPS)), st.integers(0, 20)), max_size=4)


def build(n: int, chain: list[tuple[str, int]]) -> af.Pipeline[int]:
    p = af.range(n)
    for name, a in chain:
        p = OPS[name](p, a)
    return p


@FAST
@given(st.lists(st.integers(), max_size=300), st.integers(1, 50))
def test_batch_then_unbatch_is_the_identity(items, size):
    assert af.from_iterable(items).batch(size).unbatch().map(int).to_list() == items
    assert af.from_iterable(items).batch(size, collate=list).unbatch().to_list() == items


@FAST
@given(st.integers(0, 500), st.integers(1, 9))
def test_shard_over_all_indices_covers_the_input_exactly_once(n, k):
    parts = [af.range(n).shard(k, i).to_list() for i in range(k)]
    assert sorted(x for part in parts for x in part) == list(range(n))
    assert [len(part) for part in parts] == [len(af.range(n).shard(k, i)) for i in range(k)]


@FAST
@given(st.integers(0, 300), st.integers(-1, 400), st.integers(-1, 400), st.integers(0, 3))
def test_take_skip_repeat_counts(n, t, s, r):
    p = af.range(n).skip(s).take(t).repeat(r)
    base = 0 if s < 0 else max(0, n - s)
    want = (base if t < 0 else min(t, base)) * r
    assert len(p.to_list()) == want == len(p)


@FAST
@given(st.integers(0, 400), ops, st.data())
def test_resumed_output_equals_the_uninterrupted_output(n, chain, data):
    p = build(n, chain)
    full = p.to_list()
    k = data.draw(st.integers(0, len(full)))
    with p.iter() as it:
        head = [next(it) for _ in range(k)]
        state = json.loads(json.dumps(it.state_dict()))
    assert head == full[:k]
    with p.iter(state=state) as it:
        assert list(it) == full[k:]


@FAST
@given(st.integers(0, 300), ops)
def test_cardinality_when_known_is_the_number_of_items(n, chain):
    p = build(n, chain)
    c = p.cardinality()
    if c >= 0:
        assert c == len(p.to_list())
