"""The wire between a process pool and its workers (``_worker``): messages framed on a
Unix socket, their buffers out of band, long bodies received in place."""

from __future__ import annotations

import os
import socket
import threading
from collections import deque

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from aioflow import _worker


def _roundtrip(objs: list[object], *, with_fds: bool = False) -> list[tuple[object, int]]:
    """Send ``objs`` through a socket pair as a worker does; decode them as a pool does."""
    a, b = socket.socketpair()
    out: list[tuple[object, int]] = []
    try:

        def send() -> None:
            for obj in objs:
                fds: list[int] = []
                if with_fds:
                    r, w = os.pipe()
                    os.close(w)
                    fds = [r]
                _worker._send(a, _worker.encode(obj), fds)
            a.shutdown(socket.SHUT_WR)

        t = threading.Thread(target=send)
        t.start()
        inbox = _worker.Inbox()
        while inbox.recv(b):
            while (msg := inbox.pop()) is not None:
                body, fds = msg
                out.append((_worker.decode(body), len(fds)))
                while fds:
                    os.close(fds.popleft())
        t.join()
        assert inbox.pop() is None and not inbox.fds
    finally:
        a.close()
        b.close()
    return out


def test_messages_of_every_size_arrive_whole_and_in_order_with_their_descriptors():
    big = np.arange(3 << 20, dtype=np.uint8)  # longer than the socket takes at once
    objs: list[object] = [("small", 1), big, b"x" * 70_000, ("after", big[:10]), 3]
    got = _roundtrip(objs, with_fds=True)
    assert [n for _, n in got] == [1] * len(objs)
    assert got[0][0] == ("small", 1)
    assert np.array_equal(got[1][0], big)  # type: ignore[arg-type]
    assert got[2][0] == b"x" * 70_000
    assert got[3][0][0] == "after" and list(got[3][0][1]) == list(range(10))  # type: ignore[index]
    assert got[4][0] == 3


@settings(max_examples=30, deadline=None)
@given(st.lists(st.binary(max_size=200_000), max_size=6))
def test_any_sequence_of_bodies_round_trips(blobs):
    assert [o for o, _ in _roundtrip(list(blobs))] == blobs


def test_a_batchs_data_travels_out_of_band_and_decodes_as_the_same_items():
    fds: list[int] = []
    data, sizes = _worker.pack([np.ones(1000), "a", 2], fds)
    parts = _worker.encode((7, (data, sizes)))
    # (the sizes of the out-of-band parts, the pickle, the batch's data as it is)
    assert len(parts) == 3 and bytes(parts[2]) == bytes(memoryview(data))
    body = b"".join(bytes(memoryview(p).cast("B")) for p in parts)
    n, payload = _worker.decode(body)
    ys = _worker.unpack(payload, deque(fds))
    assert n == 7 and np.array_equal(ys[0], np.ones(1000)) and ys[1:] == ["a", 2]


def test_what_is_left_after_a_partial_send():
    parts = [b"abc", memoryview(b"defg"), b"hi"]
    assert _worker.sent(parts, 0) == parts
    assert [bytes(p) for p in _worker.sent(parts, 2)] == [b"c", b"defg", b"hi"]
    assert [bytes(p) for p in _worker.sent(parts, 3)] == [b"defg", b"hi"]
    assert [bytes(p) for p in _worker.sent(parts, 8)] == [b"i"]
    assert _worker.sent(parts, 9) == []
