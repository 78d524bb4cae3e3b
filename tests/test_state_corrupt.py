"""Issue 27, point 5: a state that cannot be resumed exactly is refused with StateMismatch.

A state is taken mid-epoch and corrupted in every way a careless or a foreign hand could:
each key deleted, each value set to None or to the wrong type, counts out of range or
disagreeing with each other, lists truncated, another pipeline's state. Each corrupted
state is either refused with ``af.StateMismatch`` (raised by ``iter(state=)`` or at the
first item), or, only where the corruption provably changes nothing, resumes to exactly
the rest of the epoch.
"""

from __future__ import annotations

import copy
import json

import pytest

import aioflow as af

K = 7  # batches taken before the state


def double(x):
    return 2 * x


def shuffled():
    p = af.from_source(range(200), shuffle=True, seed=3).map(double)
    return p.shuffle(16, seed=1).batch(4, collate=list)


def plain():
    return af.range(200).map(double).batch(4, collate=list)


def taken(make, k=K):
    with make().iter() as it:
        head = [next(it) for _ in range(k)]
        state = json.loads(json.dumps(it.state_dict()))
    return head, state


def _sink(st):
    return st["nodes"]["0"]


def _shuffle(st):
    return next(v for v in st["nodes"].values() if isinstance(v, dict) and "buf" in v)


def _source(st):
    return next(v for v in st["nodes"].values() if isinstance(v, dict) and "next" in v)


def _set(path, value):
    """A corruption setting ``state[path...]`` (a path into the state) to ``value``."""

    def corrupt(st):
        where = st
        for key in path[:-1]:
            where = where(st) if callable(key) else where[key]
        if callable(path[-1]):
            raise AssertionError
        where[path[-1]] = value(where[path[-1]]) if callable(value) else value

    return corrupt


def _del(*path):
    def corrupt(st):
        where = st
        for key in path[:-1]:
            where = key(st) if callable(key) else where[key]
        del where[path[-1]]

    return corrupt


def _node(which, key, value):
    def corrupt(st):
        node = which(st)
        if value is _DEL:
            del node[key]
        else:
            node[key] = value(node[key]) if callable(value) else value

    return corrupt


def _null_node(which):
    def corrupt(st):
        no = next(k for k, v in st["nodes"].items() if v is which(st))
        st["nodes"][no] = None

    return corrupt


_DEL = object()
TOP = ["aioflow_state", "pipeline", "stages", "position", "opens", "nodes", "counts"]


def _foreign(st):
    other = af.range(200).map(double).shuffle(16, seed=1).batch(4, collate=list)
    with other.iter() as it:
        next(it)
        theirs = it.state_dict()
    st.clear()
    st.update(json.loads(json.dumps(theirs)))


CORRUPTIONS = {
    **{f"delete {k}": _del(k) for k in TOP},
    **{f"{k} = None": _set([k], None) for k in TOP if k != "nodes"},
    "counts truncated": _set(["counts"], lambda v: dict(list(v.items())[:-1])),
    "a count one more": _set(["counts"], lambda v: {**v, "1": v["1"] + 1}),
    "unknown key": _set(["extra"], 1),
    "version as str": _set(["aioflow_state"], "2"),
    "pipeline as int": _set(["pipeline"], 12),
    "stages as str": _set(["stages"], "abc"),
    "stages truncated": _set(["stages"], lambda v: v[:-1]),
    "stages reordered": _set(["stages"], lambda v: v[::-1]),
    "position as str": _set(["position"], lambda v: str(v)),
    "position as float": _set(["position"], lambda v: float(v)),
    "position as bool": _set(["position"], True),
    "position negative": _set(["position"], -1),
    "position beyond the epoch": _set(["position"], 10**6),
    "position one more": _set(["position"], lambda v: v + 1),
    "position one less": _set(["position"], lambda v: v - 1),
    "opens as list": _set(["opens"], lambda v: list(v.values())),
    "opens truncated": _set(["opens"], lambda v: dict(list(v.items())[:-1])),
    "open index negative": _set(["opens"], lambda v: {k: -1 for k in v}),
    "open index moved": _set(["opens"], lambda v: {k: i + 1 for k, i in v.items()}),
    "nodes as list": _set(["nodes"], lambda v: list(v.values())),
    "nodes truncated": _set(["nodes"], lambda v: dict(list(v.items())[:-1])),
    "nodes with a foreign number": _set(["nodes"], lambda v: {**v, "99": None}),
    "sink state set": _set(["nodes", "0"], {"left": 3}),
    "source state null": _null_node(_source),
    "source next deleted": _node(_source, "next", _DEL),
    "source next as str": _node(_source, "next", lambda v: str(v)),
    "source next negative": _node(_source, "next", -1),
    "source next beyond its length": _node(_source, "next", 10**6),
    "source next at its length": _node(_source, "next", 200),
    "source next one more": _node(_source, "next", lambda v: v + 1),
    "source next one less": _node(_source, "next", lambda v: v - 1),
    "source n changed": _node(_source, "n", 300),
    "source seed changed": _node(_source, "seed", 4),
    "source shard changed": _node(_source, "shard", [2, 0]),
    "foreign pipeline": _foreign,
}
SHUFFLED = {
    "shuffle state null": _null_node(_shuffle),
    "shuffle buf truncated": _node(_shuffle, "buf", lambda v: v[:-1]),
    "shuffle buf as int": _node(_shuffle, "buf", 3),
    "shuffle drop one more": _node(_shuffle, "drop", lambda v: v + 1),
    "shuffle drop negative": _node(_shuffle, "drop", -1),
    "shuffle drop deleted": _node(_shuffle, "drop", _DEL),
    "shuffle rng null": _node(_shuffle, "rng", None),
}
#: the corruptions that provably change nothing: a replay of a deterministic pipeline, and
#: open indexes where no stage uses them (no seed, no per-epoch order)
EXACT = {"a replay state": {shuffled, plain}, "open index moved": {plain}}


def _replay(st):
    st["nodes"] = st["counts"] = None


def _cases():
    for make in (shuffled, plain):
        table = {**CORRUPTIONS, "nodes = None": _set(["nodes"], None), "a replay state": _replay}
        if make is shuffled:
            table.update(SHUFFLED)
        for name, corrupt in table.items():
            yield pytest.param(make, name, corrupt, id=f"{make.__name__}: {name}")


@pytest.mark.parametrize(("make", "name", "corrupt"), list(_cases()))
def test_a_corrupted_state_is_refused_or_resumes_to_exactly_the_rest(make, name, corrupt):
    whole = make().to_list()
    head, state = taken(make)
    assert head == whole[:K]
    bad = copy.deepcopy(state)
    corrupt(bad)
    assert json.dumps(bad) != json.dumps(state), "the corruption changed nothing"
    try:
        with make().iter(state=bad) as it:
            rest = list(it)
            after = it.state_dict()
    except af.StateMismatch as e:
        assert str(e), name
        assert make not in EXACT.get(name, ()), f"{name}: refused, though it resumes exactly"
        return
    assert make in EXACT.get(name, ()), f"{name}: accepted (gave {len(rest)} batches)"
    assert rest == whole[K:]
    assert after["position"] == len(whole)


def test_the_uncorrupted_state_resumes_to_exactly_the_rest():
    for make in (shuffled, plain):
        whole = make().to_list()
        head, state = taken(make)
        with make().iter(state=state) as it:
            assert head + list(it) == whole
            assert it.state_dict()["position"] == len(whole)


@pytest.mark.parametrize("k", [0, 1, 49, 50])
def test_states_at_the_edges_of_the_epoch_resume_exactly(k):
    for make in (shuffled, plain):
        whole = make().to_list()
        head, state = taken(make, k)
        with make().iter(state=state) as it:
            assert head + list(it) == whole


def test_a_refusal_names_what_does_not_match():
    _, state = taken(plain)
    bad = copy.deepcopy(state)
    _source(bad)["next"] = 10**6
    with pytest.raises(af.StateMismatch, match="range"):
        list(plain().iter(state=bad))
    bad = copy.deepcopy(state)
    bad["nodes"][next(k for k, v in bad["nodes"].items() if v is _source(bad))] = None
    with pytest.raises(af.StateMismatch, match=r"range.*null"):
        list(plain().iter(state=bad))
    bad = copy.deepcopy(state)
    bad["stages"] = bad["stages"][:-1]
    with pytest.raises(af.StateMismatch, match="stages"):
        list(plain().iter(state=bad))
    bad = copy.deepcopy(state)
    bad["position"] += 1
    with pytest.raises(af.StateMismatch, match="position"):
        list(plain().iter(state=bad))
