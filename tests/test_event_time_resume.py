"""Resuming the operators that hold items: anywhere, exactly, from the state's buffer."""

from __future__ import annotations

import json

from _event_streams import streams
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import aioflow as af


class Reads:
    """A random-access source of events that counts its reads."""

    def __init__(self, events):
        self.events, self.reads = events, 0

    def __len__(self):
        return len(self.events)

    def __getitem__(self, i):
        self.reads += 1
        return self.events[i]


def _interrupted(make, k):
    with make().iter() as it:
        head = [next(it) for _ in range(k)]
        state = json.loads(json.dumps(it.state_dict()))
    return head, state


def _rest(make, state):
    with make().iter(state=state) as it:
        return list(it)


OPS = {
    "sort_by(max_delay)": lambda p, a: p.sort_by(
        lambda e: e["t"], max_delay=a % 5, on_late=("drop", "emit")[a % 2]
    ),
    "sort_by(buffer_size)": lambda p, a: p.sort_by(lambda e: e["t"], buffer_size=a % 6 + 1),
    "group_by": lambda p, a: p.group_by(lambda e: e["k"], size=a % 4 + 1, max_keys=a % 3 + 1),
    "window_by_time": lambda p, a: p.window_by_time(
        "t", a % 5 + 2, slide=(None, 1, 2)[a % 3], by=("k", None)[a % 2], max_delay=a % 4,
        allowed_lateness=a % 3, on_late=("drop", "emit")[a % 2],
    ),
    "sessions": lambda p, a: p.sessions(
        "t", a % 4 + 1, by="k", max_delay=a % 5, max_items=(None, 5)[a % 2],
        max_duration=(None, 9)[a % 3 == 0], on_late=("drop", "emit")[a % 2],
        max_keys=(None, 2)[a % 4 == 1],
    ),
    "scan": lambda p, a: p.scan((0, 0), lambda s, e: ((s[0] + e["t"], s[1] + 1), s)),
}


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(streams(max_n=120), st.sampled_from(sorted(OPS)), st.integers(0, 11), st.data())
def test_every_buffering_operator_resumed_anywhere_equals_the_whole_run(s, op, a, data):
    events, _ = s
    src = Reads(events)

    def make():
        return OPS[op](af.from_source(src), a).batch(a % 7 + 1, collate=list)

    whole = make().to_list()
    k = data.draw(st.integers(0, len(whole)))
    head, state = _interrupted(make, k)
    assert state["nodes"] is not None  # it seeks: no replay of the epoch
    src.reads = 0
    rest = _rest(make, state)
    assert head + rest == whole
    assert src.reads <= len(events)
    # resumed, interrupted again, resumed again
    j = data.draw(st.integers(0, len(whole) - k))
    with make().iter(state=state) as it:
        more = [next(it) for _ in range(j)]
        again = json.loads(json.dumps(it.state_dict()))
    assert head + more + _rest(make, again) == whole


def test_resuming_late_in_an_epoch_reads_only_what_comes_after():
    events = [{"t": t + (t * 7) % 5, "k": t % 3} for t in range(20_000)]
    src = Reads(events)

    def make():
        return af.from_source(src).sort_by(lambda e: e["t"], max_delay=5).sessions(
            "t", 3, by="k"
        )

    whole = make().to_list()
    head, state = _interrupted(make, len(whole) * 9 // 10)
    src.reads = 0
    assert head + _rest(make, state) == whole
    assert src.reads < len(events) // 10 + 2_000
    node_states = [v for v in state["nodes"].values() if isinstance(v, dict) and "held" in v]
    assert len(node_states) == 2 and all(len(v["held"]) < 100 for v in node_states)


def test_a_scan_with_a_mutable_state_replays_instead():
    def make():
        return af.from_source(list(range(50))).scan([], lambda s, x: (s.append(x) or s, len(s)))

    head, state = _interrupted(make, 20)
    assert head + _rest(make, state) == make().to_list()
