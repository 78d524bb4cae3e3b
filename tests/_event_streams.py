"""Random out-of-order event streams for the event-time tests (hypothesis)."""

from __future__ import annotations

from hypothesis import strategies as st


@st.composite
def streams(draw, max_n=60, keys=3):
    """Events ``{"t", "k", "i"}`` whose times are at most ``jitter`` out of order, and
    ``jitter``: each arrives at its time plus a random delay of up to ``jitter``."""
    n = draw(st.integers(0, max_n))
    jitter = draw(st.integers(0, 8))
    steps = draw(st.lists(st.integers(0, 4), min_size=n, max_size=n))
    delays = draw(st.lists(st.integers(0, jitter), min_size=n, max_size=n))
    ks = draw(st.lists(st.integers(0, keys - 1), min_size=n, max_size=n))
    t, events = 0, []
    for i in range(n):
        t += steps[i]
        events.append({"t": t, "k": ks[i], "i": i, "at": t + delays[i]})
    events.sort(key=lambda e: (e["at"], e["i"]))
    for j, e in enumerate(events):
        e["i"] = j  # arrival number
        del e["at"]
    return events, jitter
