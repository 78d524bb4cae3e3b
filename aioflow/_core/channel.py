"""The one channel type: a bounded queue of chunks between two stages, or to a consumer.

``Channel`` joins two tasks of a run on its loop (single producer, single consumer). Its
modes are what the run's hops need:

- ``abandon()``: the reader is gone for good; later puts are dropped and a waiting put
  returns (a ``partition_by`` partition that stopped reading never blocks its router);
- ``ThreadChannel``: the same producer side on the run's loop, and a consumer in another
  thread that takes every chunk available at once (the sync adapter: one thread
  hand-off moves many chunks).
"""

from __future__ import annotations

import asyncio
import threading
import types
from collections import deque
from time import monotonic, perf_counter
from typing import TYPE_CHECKING, Any

from aioflow._core.graph import CHANNEL_CHUNKS, CHANNEL_ITEMS, CHUNK_MAX, Chunk
from aioflow.errors import NextTimeout

if TYPE_CHECKING:
    from aioflow.stats.meters import Lane, QueueMeter, StageMeter

__all__ = ["Channel", "ThreadChannel"]


class Channel:
    """A bounded single-producer, single-consumer queue of chunks on one event loop.

    ``put`` waits while the channel holds ``max_chunks`` chunks, or while adding the chunk
    would pass ``max_items`` (a chunk always fits into an empty channel). ``close(exc)``
    ends the stream: ``get`` returns ``None`` after the last chunk, or raises ``exc``.
    With a ``QueueMeter`` (``attach``) it reports every change of its occupancy to it.
    """

    __slots__ = (
        "_bytes",
        "_closed",
        "_exc",
        "_getter",
        "_light",
        "_light_items",
        "_n",
        "_putter",
        "_q",
        "_w",
        "gone",
        "max_chunks",
        "max_items",
        "put_waits",
        "qm",
        "waits",
    )

    #: Whether its consumer is in another thread (then the run's meters never attach it).
    threaded = False

    def __init__(
        self, max_chunks: int = CHANNEL_CHUNKS, max_items: int = CHANNEL_ITEMS, light: int = 0
    ) -> None:
        self._q: deque[Chunk] = deque()
        self._n = 0
        self._getter: asyncio.Future[None] | None = None
        self._putter: asyncio.Future[None] | None = None
        self._closed = False
        self._exc: BaseException | None = None
        self.gone = False  # abandoned by its reader: puts are dropped
        self.max_chunks = max(1, max_chunks)
        self.max_items = max(1, max_items)
        self.put_waits = 0  # how often a put found the channel full
        self.qm: QueueMeter | None = None
        self.waits: Lane | None = None  # the consumer's channel: its reader's waits
        # ``light`` (> 0): past its bound it still takes chunks while they are light, up to
        # ``LIGHT_CHUNKS`` chunks of ``LIGHT_BYTES`` in all (``_w``: their weights) and
        # ``light`` items (``engine.light_items``: ``LIGHT_ITEMS`` source items)
        self._light = LIGHT_CHUNKS if light else 0
        self._light_items = light
        self._bytes = 0
        self._w: deque[int] = deque()

    def attach(self, meter: StageMeter) -> None:
        """Report this channel's occupancy to ``meter`` (the stage that fills it)."""
        self.qm = meter.open_queue(self.max_chunks, self.max_items)

    def detach(self) -> None:
        qm, self.qm = self.qm, None
        if qm is not None:
            qm.close()

    def __len__(self) -> int:
        return self._n

    @property
    def closed(self) -> bool:
        return self._closed

    def full_for(self, chunk: Chunk) -> bool:
        q = self._q
        if not q or (len(q) < self.max_chunks and self._n + len(chunk) <= self.max_items):
            return False
        return (
            len(q) >= self._light
            or self._bytes > LIGHT_BYTES
            or self._n + len(chunk) > self._light_items
        )

    def discard(self) -> None:
        """Drop whatever is still buffered (the run is over; nobody will read it)."""
        self._q.clear()
        self._w.clear()
        self._n = self._bytes = 0

    def abandon(self) -> None:
        """The reader stopped for good: drop what is buffered and every later put."""
        self.gone = True
        self.discard()
        self._wake_putter()

    def bound(self, max_chunks: int, max_items: int) -> None:
        """Take the bound of the stage that feeds it (before the first put)."""
        self.max_chunks = max(1, max_chunks)
        self.max_items = max(1, max_items)

    def grow(self, limit: int) -> None:
        """Double the bound, up to ``limit`` items (``prefetch(AUTOTUNE)``)."""
        self.max_items = min(limit, 2 * self.max_items)
        self.max_chunks = min(limit, 2 * self.max_chunks)
        if self.qm is not None:
            self.qm.resize(self.max_chunks, self.max_items)
        self._wake_putter()

    def _wake_putter(self) -> None:
        p = self._putter
        if p is not None and not p.done():
            p.set_result(None)

    def offer(self, chunk: Chunk) -> bool:
        """Put ``chunk`` if it fits now (True); else leave it (False: ``put`` waits)."""
        if self.full_for(chunk):
            return False
        self._add(chunk)
        return True

    async def put(self, chunk: Chunk) -> None:
        if self.full_for(chunk):
            self.put_waits += 1
        while self.full_for(chunk):
            fut = self._putter = asyncio.get_running_loop().create_future()
            try:
                await fut
            finally:
                self._putter = None
        self._add(chunk)

    def _add(self, chunk: Chunk) -> None:
        if self.gone:
            return
        self._q.append(chunk)
        self._n += len(chunk)
        if self._light:
            w = weigh(chunk)
            self._w.append(w)
            self._bytes += w
        if self.qm is not None:
            self.qm.note(len(self._q), self._n)
        g = self._getter
        if g is not None and not g.done():
            g.set_result(None)

    def close(self, exc: BaseException | None = None) -> None:
        self._closed = True
        self._exc = exc
        g = self._getter
        if g is not None and not g.done():
            g.set_result(None)

    async def get(self) -> Chunk | None:
        while not self._q:
            if self._closed:
                if self._exc is not None:
                    raise self._exc
                return None
            fut = self._getter = asyncio.get_running_loop().create_future()
            t0 = perf_counter()
            try:
                await fut
            finally:
                self._getter = None
                if self.waits is not None:
                    t1 = perf_counter()
                    self.waits.work(t1, t1 - t0)
        return self._pop()

    def take_ready(self) -> Chunk | None:
        """The next chunk if one is buffered, else None, without waiting (a consumer on
        the loop takes it so, without suspending; ``get`` waits)."""
        return self._pop() if self._q else None

    def _pop(self) -> Chunk:
        chunk = self._q.popleft()
        self._n -= len(chunk)
        if self._light:
            self._bytes -= self._w.popleft()
        if self.qm is not None:
            self.qm.note(len(self._q), self._n)
        self._wake_putter()
        return chunk


#: What a ``ThreadChannel`` may hold past its ``max_chunks`` while its chunks weigh little:
#: up to ``LIGHT_CHUNKS`` chunks of at most ``LIGHT_BYTES`` in all (``weigh``) and
#: ``LIGHT_ITEMS`` source items (a batch of n counts n: ``engine.light_items``), which
#: ``max_inflight`` counts twice (the channel, and what its consumer took from it).
LIGHT_CHUNKS = 64
LIGHT_BYTES = 4 << 20
LIGHT_ITEMS = LIGHT_CHUNKS * CHUNK_MAX
_DESCRIPTORS = (property, types.GetSetDescriptorType)  # how types give ``nbytes``


def item_bytes(x: Any, depth: int = 0) -> int:
    """About how many bytes ``x`` holds: numbers, strings, arrays (``nbytes``: numpy,
    Arrow, torch) and dicts, lists and tuples of them; ``LIGHT_BYTES`` for anything else
    (it counts as heavy).

    Example:
        >>> item_bytes(3), item_bytes("abc"), item_bytes({"x": 1.0, "y": [1, 2]})
        (32, 67, 224)
    """
    t = type(x)
    if t is int or t is float or t is bool or x is None:
        return 32
    if t is str or t is bytes:
        return 64 + len(x)
    if isinstance(getattr(t, "nbytes", None), _DESCRIPTORS):
        n = x.nbytes
        return n if isinstance(n, int) else LIGHT_BYTES
    if (t is dict or t is list or t is tuple) and depth < 2 and len(x) <= 64:
        vals = x.values() if t is dict else x
        return 64 + sum(item_bytes(v, depth + 1) for v in vals)
    return LIGHT_BYTES


def weigh(chunk: Chunk) -> int:
    """About how many bytes a chunk holds, from its first item (chunks are alike)."""
    return len(chunk) * item_bytes(chunk[0])


class ThreadChannel(Channel):
    """A ``Channel`` whose consumer is another thread: chunks from the run's loop to it.

    The producer side is ``Channel``'s (``put``/``close``, on the loop), bounded by chunks:
    ``max_chunks``, or up to ``LIGHT_CHUNKS`` while they weigh at most ``LIGHT_BYTES`` in
    all, of ``LIGHT_ITEMS`` items (small batches: a thread hand-off costs tens of
    microseconds, so it must move
    many of them); the consumer takes every chunk available at once with ``take``, so
    one thread hand-off moves many chunks.
    """

    __slots__ = ("_cond", "_loop", "_space", "_waiting")

    threaded = True

    def __init__(
        self, loop: asyncio.AbstractEventLoop, max_chunks: int = 4, light: int = LIGHT_ITEMS
    ) -> None:
        super().__init__(max_chunks, light=light)
        self._loop = loop
        self._cond = threading.Condition(threading.Lock())
        self._space = asyncio.Event()
        self._waiting = False

    def full_for(self, chunk: Chunk) -> bool:
        n = len(self._q)
        return n >= self.max_chunks and (
            n >= self._light
            or self._bytes > LIGHT_BYTES
            or self._n + len(chunk) > self._light_items
        )

    def discard(self) -> None:
        with self._cond:
            self._q.clear()
            self._n = self._bytes = 0

    def offer(self, chunk: Chunk) -> bool:
        w = weigh(chunk) if self._light else 0
        with self._cond:
            if self.full_for(chunk):
                return False
            self._append(chunk, w)
            return True

    def _append(self, chunk: Chunk, w: int) -> None:
        self._q.append(chunk)
        self._n += len(chunk)
        self._bytes += w
        self._cond.notify()

    async def put(self, chunk: Chunk) -> None:
        w = weigh(chunk) if self._light else 0
        while True:
            with self._cond:
                if not self.full_for(chunk):
                    self._append(chunk, w)
                    return
                self._waiting = True
                self._space.clear()
            await self._space.wait()

    def close(self, exc: BaseException | None = None) -> None:
        with self._cond:
            self._closed = True
            self._exc = exc
            self._cond.notify()

    async def get(self) -> Chunk | None:  # pragma: no cover - the consumer uses take()
        raise TypeError("a ThreadChannel is read from its consumer's thread with take()")

    def take(self, timeout: float | None) -> list[Chunk] | None:
        """Every chunk available (waiting up to ``timeout``); None at the end."""
        with self._cond:
            if not self._q:
                self._wait(timeout)
                if not self._q:
                    return None
            chunks = list(self._q)
            self._q.clear()
            self._n = self._bytes = 0
            wake, self._waiting = self._waiting, False
        if wake:
            try:
                self._loop.call_soon_threadsafe(self._space.set)
            except RuntimeError:  # loop already closed: nobody is waiting any more
                pass
        return chunks

    def _wait(self, timeout: float | None) -> None:
        """Wait (holding the condition) for a chunk or the end; raise the channel's error."""
        deadline = None if timeout is None else monotonic() + timeout
        t0 = perf_counter()
        while not self._q:
            if self._closed:
                if self._exc is not None:
                    exc, self._exc = self._exc, None
                    raise exc
                return
            if deadline is None:
                self._cond.wait()
            else:
                left = deadline - monotonic()
                timed_out = left <= 0 or not self._cond.wait(left)
                if timed_out and not self._q and not self._closed:
                    raise NextTimeout(f"no item within {timeout} s")
        if self.waits is not None:
            t1 = perf_counter()
            self.waits.work(t1, t1 - t0)
