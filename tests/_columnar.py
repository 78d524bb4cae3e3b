"""Batches of the same rows for the columnar tests: Arrow record batches or dicts of numpy
arrays, cut at random sizes (0 included), and their output back as rows."""

from __future__ import annotations

import pickle

import numpy as np
import pyarrow as pa
from _event_streams import streams
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

import aioflow as af


@st.composite
def batched(draw, max_n=80, keys=3):
    """(rows, batches, jitter, kind): events ``{"t", "k", "i", "v"}`` (``v`` has nulls
    for Arrow) and the same rows cut into batches of 0..n rows."""
    events, jitter = draw(streams(max_n=max_n, keys=keys))
    kind = draw(st.sampled_from(["arrow", "dict"]))
    for e in events:
        nul = kind == "arrow" and draw(st.booleans())
        e["v"] = None if nul else float(e["i"]) / 2
    cuts, i = [], 0
    while i < len(events) or draw(st.integers(0, 5)) == 0:
        n = draw(st.integers(0, 25))
        cuts.append((i, i + n))
        i += n
        if i >= len(events) and len(cuts) > 40:
            break
    return events, [batch_of(events[a:b], kind) for a, b in cuts], jitter, kind


def batch_of(rows, kind):
    cols = ["t", "k", "i", "v"]
    if kind == "arrow":
        schema = pa.schema(
            [("t", pa.int64()), ("k", pa.int64()), ("i", pa.int64()), ("v", pa.float64())]
        )
        return pa.RecordBatch.from_pylist(rows, schema=schema)
    dt = {"t": np.int64, "k": np.int64, "i": np.int64, "v": np.float64}
    return {c: np.array([r[c] for r in rows], dt[c]) for c in cols}


def recut(rows, batches, kind):
    """``rows`` cut into batches of the sizes of ``batches``."""
    out, i = [], 0
    for b in batches:
        n = b.num_rows if kind == "arrow" else len(b["t"])
        out.append(batch_of(rows[i : i + n], kind))
        i += n
    return out


def rows_of(b):
    """The rows of an output batch (a sessions batch: its sessions as dicts)."""
    if isinstance(b, dict):
        n = len(next(iter(b.values())))
        out = []
        for j in range(n):
            r = {}
            for c, v in b.items():
                x = v[j]
                if isinstance(x, dict):
                    x = rows_of(x)
                r[c] = x.item() if isinstance(x, np.generic) else x
            out.append(r)
        return out
    return b.to_pylist()


def flat(outs):
    """Output rows: a batch's rows; an ``af.Window`` / ``(key, items)`` group of a batch as
    one dict, its items as row dicts (as ``window_rows`` gives the per-item windows)."""
    out = []
    for b in outs:
        if isinstance(b, af.Window):
            out.append({"key": b.key, "start": b.start, "end": b.end, "items": rows_of(b.items)})
        elif isinstance(b, tuple):
            k, items = b
            out.append({"key": k, "items": rows_of(items)})
        else:
            out.extend(rows_of(b))
    return out


def window_rows(windows):
    return [{"key": w.key, "start": w.start, "end": w.end, "items": w.items} for w in windows]


def run(p):
    """(output, late count) of one run of ``p``."""
    with p.iter() as it:
        out = list(it)
        late = sum(s.late for s in it.stats().stages)
    return out, late


def source(batches):
    return af.from_iterable(batches)


def resumed_anywhere(make, hd):
    """(whole, resumed, state): the outputs of a whole run of ``make()``, and of one
    stopped after a drawn number of outputs (``hd``: hypothesis' ``data()``), its state
    taken (pickled) there and resumed; the state."""
    whole = make().to_list()
    k = hd.draw(st.integers(0, len(whole)))
    with make().iter() as it:
        head = [next(it) for _ in range(k)]
        state = pickle.loads(pickle.dumps(it.state_dict()))
    with make().iter(state=state) as it:
        rest = list(it)
    return whole, head + rest, state


def windows_twin(op, data, ordered):
    """The windows ``op`` (a function of a pipeline) makes of ``data``'s batches, checked
    against what it makes of the same rows one by one (the windows as rows, the late
    counts); ``ordered``: the rows sorted by ``t`` first (what ``sort_by(max_delay=)``
    gives: the vectorized path), cut as the batches were."""
    rows, batches, _, kind = data
    if ordered:
        rows = sorted(rows, key=lambda r: r["t"])
        batches = recut(rows, batches, kind)
    want, late = run(op(af.from_iterable(rows)))
    got, got_late = run(op(source(batches)))
    assert flat(got) == window_rows(want)
    assert got_late == late
    return got


#: the settings of the columnar twin tests: modest examples, no deadline
FAST = settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
