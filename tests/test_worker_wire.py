"""The wire between a process pool and its workers (``_worker``): messages framed on a
Unix socket, their buffers out of band, long bodies received in place."""

from __future__ import annotations

import errno
import os
import socket
import threading
from collections import deque

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from aioflow._process import wire as _wire


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
                _wire.send(a, _wire.encode(obj), fds)
            a.shutdown(socket.SHUT_WR)

        t = threading.Thread(target=send)
        t.start()
        inbox = _wire.Inbox()
        while inbox.recv(b):
            while (msg := inbox.pop()) is not None:
                body, fds = msg
                out.append((_wire.decode(body), len(fds)))
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


def _join(parts: list[object]) -> bytes:
    return b"".join(bytes(memoryview(p).cast("B")) for p in parts)  # type: ignore[arg-type]


def test_a_batch_travels_as_its_pickle_and_one_blob_of_its_arrays_out_of_band():
    fds: list[int] = []
    items = [np.ones(1000), "a", 2, np.arange(10)]  # 8,000 bytes: a part; 80: pickled in
    payload = _wire.pack(items, fds)
    data, sizes, blob = payload
    assert sizes == [-8000] and memoryview(blob).nbytes == 8000 and fds == []
    parts = _wire.encode((7, payload))
    # (the sizes of the out-of-band parts, the pickle, the batch's data and blob as they are)
    assert len(parts) == 4 and _join(parts[2:]) == bytes(data) + bytes(blob)
    n, got = _wire.decode(_join(parts))
    ys = _wire.unpack(got, deque())
    assert n == 7 and np.array_equal(ys[0], np.ones(1000)) and ys[1:3] == ["a", 2]
    assert np.array_equal(ys[3], np.arange(10))


@pytest.mark.skipif(not hasattr(os, "memfd_create"), reason="no memfd on this platform")
def test_large_arrays_go_to_shared_memory_and_with_no_room_there_beside_the_pickle(
    monkeypatch,
):
    big = [np.arange(40_000, dtype=np.int64), np.full(20_000, 7, np.int64)]  # 320, 160 KB
    fds: list[int] = []
    payload = _wire.pack(big, fds)
    assert payload[1] == [320_000, 160_000] and len(fds) == 2
    ys = _wire.unpack(payload, deque(fds))
    assert all(np.array_equal(y, x) for x, y in zip(big, ys, strict=True))

    def full(*args: object) -> int:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "pwrite", full)
    before = _open_fds()
    fds = []
    payload = _wire.pack(big, fds)
    assert fds == [] and payload[1] == [-320_000, -160_000] and _open_fds() == before
    ys = _wire.unpack(payload, deque())
    assert all(np.array_equal(y, x) for x, y in zip(big, ys, strict=True))


def _open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def test_an_array_changed_after_it_was_packed_arrives_as_it_was():
    # (a worker's writer thread sends a batch while the next one computes)
    x = np.zeros(5000)
    payload = _wire.pack([x], [])
    x[:] = 1
    (y,) = _wire.unpack(payload, deque())
    assert not y.any()


def test_each_array_of_a_message_has_memory_of_its_own():
    # a kept result must not pin the rest of its batch's message
    payload = _wire.pack([np.full(2000, i) for i in range(3)], [])
    ys = _wire.unpack(_wire.decode(_join(_wire.encode(payload))), deque())
    assert [int(y[0]) for y in ys] == [0, 1, 2]
    assert all(y.base is not None and memoryview(y.base).nbytes == 16_000 for y in ys)


def test_what_is_left_after_a_partial_send():
    parts = [b"abc", memoryview(b"defg"), b"hi"]
    assert _wire.sent(parts, 0) == parts
    assert [bytes(p) for p in _wire.sent(parts, 2)] == [b"c", b"defg", b"hi"]
    assert [bytes(p) for p in _wire.sent(parts, 3)] == [b"defg", b"hi"]
    assert [bytes(p) for p in _wire.sent(parts, 8)] == [b"i"]
    assert _wire.sent(parts, 9) == []
