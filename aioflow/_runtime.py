"""The runtime: how a run is built from a Pipeline, who owns its tasks, how it shuts down.

Items travel between stages as *chunks*: non-empty lists of items. An operator is an
async generator over the chunks of its input that yields chunks (see ``Build``); moving
lists instead of single items is what keeps the per-item cost of the queued runtime low.

A node marked ``task=True`` (sources, concurrent maps, prefetch, fan-in) runs in a task
of its own, and its output goes through a bounded ``Channel`` to the next stage; its
inputs are read from channels too. Consecutive inline nodes are fused: they are async
generators chained inside the task that reads them. The consumer of a run reads the last
channel.

Ownership flows downstream: a channel's reader starts the producing task on first read
and, when closed (end, error, break, cancellation), cancels and awaits it; the producer
closes its own generator, which closes its readers, and so on up the graph. ``Run``
also keeps every task it started and cancels and awaits any that remain at ``aclose``.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import threading
from collections import deque
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field
from time import perf_counter
from typing import TYPE_CHECKING, Any

from ._meters import Lane, QueueMeter, StageMeter
from ._threads import DaemonPool
from .errors import control_flow_error
from .stats import RunStats

if TYPE_CHECKING:
    from .pipeline import Pipeline

__all__ = [
    "CHUNK_MAX",
    "Build",
    "Channel",
    "Chunk",
    "ChunkIter",
    "Ctx",
    "Node",
    "Opener",
    "Run",
    "aclosing",
    "cancelling",
    "items_of",
]

Chunk = list[Any]
ChunkIter = AsyncGenerator[Chunk, None]
Opener = Callable[[], ChunkIter]

#: Largest chunk a source makes; sources adapt their chunk size below it by time.
CHUNK_MAX = 256
#: Default bound of a channel between two tasks: this many chunks and this many items.
CHANNEL_CHUNKS = 2
CHANNEL_ITEMS = 2 * CHUNK_MAX

#: Longest chain of fused stages in one task; a longer one goes on in another task.
FUSE_MAX = 64

aclosing = contextlib.aclosing

#: Whether runs keep per-stage stats (``AIOFLOW_STATS=0`` turns the meters off; read when a
#: stage is opened, so ``bench/overhead.py`` can compare both in one process).
METER = os.environ.get("AIOFLOW_STATS", "1") != "0"


LaneCell = list[Lane | None]  # an instance's lane, once it runs (see _meters)


class Ctx:
    """What a node's build function gets: its run, its meter, and how to open pipelines."""

    __slots__ = ("hook", "lane", "meter", "no", "node", "open_index", "resume", "run")

    def __init__(
        self, run: Run, node: Node, meter: StageMeter, open_index: int, lane: LaneCell
    ) -> None:
        self.run = run
        self.node = node
        self.meter = meter
        self.open_index = open_index  # how many times this node was opened before, ever
        self.lane = lane  # this instance's lane, once it runs: sub-pipelines report to it
        # resuming (see _state.py): the node's number in the graph when this is its first
        # opening in the run, and the state it saved, to start from (None: from the start)
        self.no: int | None = run.node_index.get(id(node))
        first = run.first_opening(node) is not None
        self.resume: Any = run.resume_nodes.get(self.no) if first and self.no is not None else None
        self.hook: Callable[[Callable[[int], Any]], None] | None = None
        if run.sub_resume is not None:  # the root of a sub-pipeline opened by Ctx.open
            (self.resume, self.hook), run.sub_resume = run.sub_resume, None

    def seeker(self, fn: Callable[[int], Any]) -> None:
        """A node says where it was after its first ``k`` items out of this opening."""
        if self.hook is not None:
            self.hook(fn)
        elif self.no is not None:  # by opening: repeat opens its input again per epoch
            seekers = self.run.seekers
            seekers[(self.no, self.open_index)] = fn
            seekers.pop((self.no, self.open_index - 2), None)  # two epochs are enough

    @property
    def name(self) -> str:
        return self.meter.name

    def open(
        self,
        pipeline: Pipeline[Any],
        resume: Any = None,
        hook: Callable[[Callable[[int], Any]], None] | None = None,
    ) -> ChunkIter:
        """Open a sub-pipeline (from flat_map, interleave, ...) inside this run.

        ``resume``/``hook``: the state its first stage starts from, and what gets that
        stage's ``seeker`` (see ``_state.py``).
        """
        self.run.sub_resume = (resume, hook) if resume is not None or hook else None
        gen = self.run.open(pipeline, parent=self.meter, reader=self.lane, same_lane=False)
        self.meter.adopt(self.run.meter_for(pipeline._node, self.meter))
        return gen

    def open_task(
        self,
        pipeline: Pipeline[Any],
        *,
        chunks: int = CHANNEL_CHUNKS,
        resume: Any = None,
        hook: Callable[[Callable[[int], Any]], None] | None = None,
    ) -> ChunkIter:
        """Open a sub-pipeline in a task of its own, behind a bounded channel (fan-in)."""
        self.run.sub_resume = (resume, hook) if resume is not None or hook else None
        gen = self.run.open(
            pipeline,
            parent=self.meter,
            boundary=True,
            chunks=chunks,
            reader=self.lane,
            same_lane=False,
        )
        self.meter.adopt(self.run.meter_for(pipeline._node, self.meter))
        return gen


Build = Callable[[Ctx, Sequence[Opener]], ChunkIter]


def _same(cards: Sequence[int]) -> int:
    return cards[0] if cards else UNKNOWN_CARD


INFINITE_CARD = -1
UNKNOWN_CARD = -2



class OpenCount:
    """How many times a node was opened: ``next()`` counts (thread-safe), ``peek()`` looks.

    It pickles and copies as its value (a ``distribute`` job ships nodes to workers;
    pickling an ``itertools.count`` is deprecated since Python 3.12).
    """

    __slots__ = ("_lock", "_n")

    def __init__(self, start: int = 0) -> None:
        self._n = start
        self._lock = threading.Lock()

    def __next__(self) -> int:
        with self._lock:
            n = self._n
            self._n = n + 1
            return n

    def peek(self) -> int:
        """The index the next opening will get."""
        return self._n

    def __reduce__(self) -> tuple[type[OpenCount], tuple[int]]:
        return (OpenCount, (self._n,))

@dataclass(frozen=True, eq=False)
class Node:
    """One operator of a pipeline description (immutable)."""

    name: str
    build: Build
    inputs: tuple[Pipeline[Any], ...] = ()
    card: Callable[[Sequence[int]], int] = _same
    task: bool = False
    holds: int = 0  # input items the operator itself may hold at once, beyond channels
    mult: int = 1  # how many input items one output item may hold (batch(n): n)
    chunks: int = CHANNEL_CHUNKS  # bound of the channel after a task node, in chunks
    items: int = CHANNEL_ITEMS  # ... and in items
    grow_to: int = 0  # prefetch(AUTOTUNE): the channel may grow to this many items
    key: tuple[Any, ...] = ()  # what identifies the node's configuration (for states)
    splits: Any = None  # a source that distribute can cut: a _splits.SplitSource
    resume: Any = None  # how its state is taken when resuming: see _state.py
    opens: OpenCount = field(default_factory=lambda: OpenCount(), compare=False)
    # a one-item source's blocking read of its item (a local file's): a fan-in may run it
    # in a batch on the run's threads instead of opening the node (a failure: it opens it)
    load: Callable[[], Any] | None = field(default=None, compare=False)


class Channel:
    """A bounded single-producer, single-consumer queue of chunks on one event loop.

    ``put`` waits while the channel holds ``max_chunks`` chunks, or while adding the chunk
    would pass ``max_items`` (a chunk always fits into an empty channel). ``close(exc)``
    ends the stream: ``get`` returns ``None`` after the last chunk, or raises ``exc``.
    With a ``QueueMeter`` (``attach``) it reports every change of its occupancy to it.
    """

    __slots__ = (
        "_closed",
        "_exc",
        "_getter",
        "_n",
        "_putter",
        "_q",
        "max_chunks",
        "max_items",
        "put_waits",
        "qm",
        "waits",
    )

    def __init__(self, max_chunks: int = CHANNEL_CHUNKS, max_items: int = CHANNEL_ITEMS) -> None:
        self._q: deque[Chunk] = deque()
        self._n = 0
        self._getter: asyncio.Future[None] | None = None
        self._putter: asyncio.Future[None] | None = None
        self._closed = False
        self._exc: BaseException | None = None
        self.max_chunks = max(1, max_chunks)
        self.max_items = max(1, max_items)
        self.put_waits = 0  # how often a put found the channel full
        self.qm: QueueMeter | None = None
        self.waits: Lane | None = None  # the consumer's channel: its reader's waits

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
        return bool(self._q) and (
            len(self._q) >= self.max_chunks or self._n + len(chunk) > self.max_items
        )

    def discard(self) -> None:
        """Drop whatever is still buffered (the run is over; nobody will read it)."""
        self._q.clear()
        self._n = 0

    def grow(self, limit: int) -> None:
        """Double the bound, up to ``limit`` items (``prefetch(AUTOTUNE)``)."""
        self.max_items = min(limit, 2 * self.max_items)
        self.max_chunks = min(limit, 2 * self.max_chunks)
        if self.qm is not None:
            self.qm.resize(self.max_chunks, self.max_items)
        p = self._putter
        if p is not None and not p.done():
            p.set_result(None)

    async def put(self, chunk: Chunk) -> None:
        if self.full_for(chunk):
            self.put_waits += 1
        while self.full_for(chunk):
            fut = self._putter = asyncio.get_running_loop().create_future()
            try:
                await fut
            finally:
                self._putter = None
        self._q.append(chunk)
        self._n += len(chunk)
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
        chunk = self._q.popleft()
        self._n -= len(chunk)
        if self.qm is not None:
            self.qm.note(len(self._q), self._n)
        p = self._putter
        if p is not None and not p.done():
            p.set_result(None)
        return chunk


async def _metered(
    gen: ChunkIter, meter: StageMeter, mine: LaneCell, reader: LaneCell | None, same: bool
) -> ChunkIter:
    """Counts a stage's output and the time spent producing it (inclusive of fused input),
    and its own busy time (exclusive of its inputs) on the lane of this instance."""
    pc = perf_counter
    nxt = gen.__anext__
    up = reader[0] if reader is not None else None
    ln = mine[0] = meter.take_lane(up.index if up is not None and same else None)
    try:
        while True:
            t0, c0 = pc(), ln.inner
            try:
                chunk = await nxt()
            except StopAsyncIteration:
                return
            finally:
                # (inlined: this runs per chunk) own time = all of it minus its inputs'
                t1 = pc()
                dt = t1 - t0
                meter.t_next += dt
                if up is not None:  # time inside an input, for the instance reading this one
                    up.inner += dt
                own = dt - (ln.inner - c0)
                if own > 0.0:
                    ln.work(t1, own)
            meter.items_out += len(chunk)
            meter.chunks_out += 1
            yield chunk
    finally:
        ln.in_use = False
        await gen.aclose()


async def items_of(src: ChunkIter) -> AsyncIterator[Any]:
    """Flatten chunks into single items (for item-at-a-time operators)."""
    async with aclosing(src):
        async for chunk in src:
            for x in chunk:
                yield x


def cancelling() -> bool:
    """Whether the current task is being cancelled (by the run, or its consumer's owner).

    A ``CancelledError`` while this is false was raised by a user's function (it awaited
    something that someone else cancelled): an error of its stage, not the run's end.
    """
    task = asyncio.current_task()
    return task is None or task.cancelling() > 0


async def in_thread(fn: Callable[[], Any]) -> None:
    """Run a blocking call (an external sort writing a run) in a thread of its own.

    Not in the loop's default executor: that refuses work once the interpreter is
    exiting. Nothing on a run's close path uses it (a new thread is refused then too).
    """
    loop = asyncio.get_running_loop()
    done = loop.create_future()
    failure: list[BaseException] = []

    def finish() -> None:
        if not done.done():
            done.set_result(None)

    def target() -> None:
        try:
            fn()
        except BaseException as e:  # reported to the awaiting task
            failure.append(e)
        finally:
            with contextlib.suppress(RuntimeError):  # the loop closed meanwhile
                loop.call_soon_threadsafe(finish)

    t = threading.Thread(target=target, name="aioflow-close", daemon=True)
    t.start()
    try:
        await asyncio.shield(done)
    finally:
        if done.done():
            t.join()
    if failure:
        raise failure[0]


async def _wait_quietly(task: asyncio.Task[Any]) -> None:
    """Wait for a cancelled task to end without re-raising what it raised."""
    if task.done():
        if not task.cancelled():
            task.exception()  # mark retrieved
        return
    try:
        await asyncio.wait([task])
    except asyncio.CancelledError:
        # we are being cancelled while waiting: keep waiting once more, then give up
        # (the run's own aclose cancels and awaits whatever is left)
        task.cancel()
        raise
    if not task.cancelled():
        task.exception()


_closing: set[asyncio.Task[None]] = set()  # runs being closed by abort()


class Run:
    """One iteration (epoch) of a pipeline: owns every task, channel and pool it starts."""

    def __init__(
        self,
        root: Pipeline[Any] | None = None,
        opens: dict[int, int] | None = None,
        nodes: dict[int, Any] | None = None,
    ) -> None:
        # Static nodes are numbered in the root's graph, so a state can name them; `opens`
        # (from a state) gives the open_index each node had in the run being resumed.
        self.node_index: dict[int, int] = {} if root is None else _number_nodes(root)
        self.resume_opens = opens
        self.first_open: dict[int, int] = {}
        self.open_counts: dict[int, int] = {}
        self.resume_nodes: dict[int, Any] = nodes or {}  # node states a resumed run starts from
        self.seekers: dict[tuple[int, int], Callable[[int], Any]] = {}  # see Ctx.seeker
        self.sub_resume: tuple[Any, Any] | None = None  # see Ctx.open
        self.tasks: set[asyncio.Task[Any]] = set()
        self.meters: dict[Any, StageMeter] = {}
        self.resources: list[Callable[[], Any]] = []  # closers, run at aclose (LIFO)
        self._depths: dict[int, int] = {}  # id(node) -> its fused depth (_fused_depth)
        self._pool: DaemonPool | None = None
        self.closed = False
        # set from the consumer's thread when it closes: a blocking source reads no more
        self.stopping = False
        self.started = perf_counter()
        self.ended: float | None = None  # when it closed: the stats of a finished run stay put
        self.consumer = Lane(0)  # the consumer's waits for items (for the timeline)

    # -- building ---------------------------------------------------------------------
    def meter_for(self, node: Node, parent: StageMeter | None) -> StageMeter:
        key: Any = id(node) if parent is None else (parent.key, node.name)
        m = self.meters.get(key)
        if m is None:
            name = node.name if parent is None else f"{parent.name} > {node.name}"
            m = self.meters[key] = StageMeter(name, key, task=node.task)
        return m

    def open(
        self,
        pipeline: Pipeline[Any],
        *,
        parent: StageMeter | None = None,
        boundary: bool = False,
        chunks: int | None = None,
        reader: LaneCell | None = None,
        same_lane: bool = True,
        split: bool = True,
    ) -> ChunkIter:
        """Open a pipeline: its chunks, as an async iterator owned by the caller.

        ``reader``: the lane of the instance that reads it, which its time is taken from;
        ``same_lane``: an input runs on its reader's lane index (a sub-pipeline: the
        lowest free one). ``split``: a long fused chain may be cut here (see ``_split``).
        """
        node = pipeline._node
        fused = not (node.task or boundary)
        if fused and split and self._fused_depth(node) % FUSE_MAX == 0:
            return self._split(pipeline, parent, reader, same_lane)
        mine: LaneCell = [None]
        gen, meter = self._build(node, parent, mine)
        if node.task or boundary:
            meter.task = True
            return self._reader(
                gen,
                meter,
                chunks if chunks is not None else node.chunks,
                node.items,
                node.grow_to,
                (mine, reader, same_lane),
            )
        return _metered(gen, meter, mine, reader, same_lane) if METER else gen

    def _split(
        self,
        pipeline: Pipeline[Any],
        parent: StageMeter | None,
        reader: LaneCell | None,
        same_lane: bool,
    ) -> ChunkIter:
        """The rest of a long chain of fused stages, in a task of its own (a fresh stack).

        Fused stages nest: building them, and each chunk's way through them, is as deep
        as the chain is long. Every ``FUSE_MAX`` stages of a chain (counted from its
        bottom, see ``_fused_depth``) the chain below goes on in a task that builds it when
        first read; this hop is not a stage, and the stats do not show it.
        """
        hop_lane: LaneCell = [None]

        async def rest() -> ChunkIter:
            gen = self.open(pipeline, parent=parent, reader=hop_lane, split=False)
            async with aclosing(gen):
                async for chunk in gen:
                    yield chunk

        hop = StageMeter(f"{pipeline._node.name} (split)", None)
        lanes = (hop_lane, reader, same_lane)
        return self._reader(rest(), hop, CHANNEL_CHUNKS, CHANNEL_ITEMS, 0, lanes)

    def _fused_depth(self, node: Node) -> int:
        """How many stages run on one stack when ``node`` is read: itself and its chain of
        fused inputs, down to task nodes (a static fact of the graph, kept per run).

        Computed without recursion: the chain may be longer than the recursion limit.
        """
        depth = self._depths
        todo = [node]
        while todo:
            n = todo[-1]
            if id(n) in depth:
                todo.pop()
                continue
            below = [q._node for q in n.inputs if not q._node.task]
            missing = [q for q in below if id(q) not in depth]
            if missing:
                todo.extend(missing)
                continue
            depth[id(n)] = 1 + max((depth[id(q)] for q in below), default=0)
            todo.pop()
        return depth[id(node)]

    def _build(
        self, node: Node, parent: StageMeter | None, mine: LaneCell
    ) -> tuple[ChunkIter, StageMeter]:
        """The node's own (unmetered) generator and its meter."""
        meter = self.meter_for(node, parent)
        openers = tuple(self._opener(q, parent, mine) for q in node.inputs)
        for q in node.inputs:
            m = self.meter_for(q._node, parent)
            if m not in meter.inputs:
                meter.inputs.append(m)
        ctx = Ctx(self, node, meter, self._open_index(node), mine)
        return node.build(ctx, openers), meter

    def _open_index(self, node: Node) -> int:
        """How many times ``node`` was opened before: seeds per epoch derive from it."""
        fresh = next(node.opens)
        idx = self.node_index.get(id(node))
        if idx is None:
            return fresh
        k = self.open_counts.get(idx, 0)
        self.open_counts[idx] = k + 1
        if k == 0:
            base = fresh
            if self.resume_opens is not None:
                base = self.resume_opens.get(idx, fresh)
            self.first_open[idx] = base
        return self.first_open[idx] + k

    def first_opening(self, node: Node) -> int | None:
        """The node's number when it is being opened for the first time in this run."""
        idx = self.node_index.get(id(node))
        return idx if idx is not None and self.open_counts.get(idx) == 1 else None

    def _opener(self, q: Pipeline[Any], parent: StageMeter | None, reader: LaneCell) -> Opener:
        # inputs are fused into the task that reads them; task nodes make their own task
        return lambda: self.open(q, parent=parent, reader=reader)

    async def _reader(
        self,
        gen: ChunkIter,
        meter: StageMeter,
        max_chunks: int,
        max_items: int,
        grow_to: int,
        lanes: tuple[LaneCell, LaneCell | None, bool],
    ) -> ChunkIter:
        chan = Channel(max_chunks, max_items)
        meter.channel = chan
        ln = up = None
        if METER:
            chan.attach(meter)
            mine, reader, same = lanes
            up = reader[0] if reader is not None else None
            ln = mine[0] = meter.take_lane(up.index if up is not None and same else None)
        task = self.start(_pump(gen, chan, meter, METER, ln), meter.name)
        pc = perf_counter
        seen_waits = 0
        try:
            while True:
                if chan._q:
                    chunk = await chan.get()
                else:
                    if grow_to and chan.put_waits > seen_waits and chan.max_items < grow_to:
                        # the reader starves although the producer had to wait for room
                        # before: the two run in bursts, and a larger buffer evens them out
                        seen_waits = chan.put_waits
                        chan.grow(grow_to)
                    t0 = pc()
                    chunk = await chan.get()
                    dt = pc() - t0
                    meter.t_read_wait += dt
                    if up is not None:
                        up.inner += dt
                if chunk is None:
                    return
                yield chunk
        finally:
            task.cancel()
            await _wait_quietly(task)
            chan.detach()
            if ln is not None:
                ln.in_use = False

    def start(self, coro: Any, name: str = "aioflow") -> asyncio.Task[Any]:
        task = asyncio.get_running_loop().create_task(coro, name=f"aioflow:{name}")
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)
        return task

    def start_output(self, pipeline: Pipeline[Any], chan: Any) -> asyncio.Task[Any]:
        """Start the run's last stage in a task that feeds ``chan`` (the consumer's)."""
        node = pipeline._node
        if METER:
            chan.waits = self.consumer  # (a Channel, or the sync adapter's ThreadChannel)
        if node.task:
            # the last stage pumps into a channel of its own already: this hop to the
            # consumer is not a stage, and must not add its waits to that stage's
            hop = StageMeter("output", None)
            return self.start(_pump(self.open(pipeline), chan, hop, False), "output")
        mine: LaneCell = [None]
        gen, meter = self._build(node, None, mine)
        if isinstance(chan, Channel):
            meter.channel = chan
            if METER:
                chan.attach(meter)
        ln = mine[0] = meter.take_lane() if METER else None
        return self.start(_pump(gen, chan, meter, METER, ln), "output")

    # -- shutting down ----------------------------------------------------------------
    def abort(self) -> None:
        """Close the run soon, from a sync context on its loop (a dropped iterator).

        Every task is cancelled now; a closing task then awaits them and closes the run's
        pools. The closing task is kept referenced until it is done.
        """
        if self.closed:
            return
        self.cancel()
        closer = asyncio.get_running_loop().create_task(self.aclose(), name="aioflow:close")
        _closing.add(closer)
        closer.add_done_callback(_closing.discard)

    def cancel(self) -> None:
        """Cancel every task of the run now (on its loop); ``aclose`` then awaits them."""
        self.ended = self.ended or perf_counter()
        for t in list(self.tasks):
            t.cancel()

    async def aclose(self) -> None:
        """Cancel every task of the run, wait for all of them, then release resources."""
        if self.closed:
            return
        self.closed = True
        self.ended = self.ended or perf_counter()
        for _ in range(10):
            pending = [t for t in self.tasks if not t.done()]
            if not pending:
                break
            for t in pending:
                t.cancel()
            await asyncio.wait(pending)
        for t in list(self.tasks):
            if t.done() and not t.cancelled():
                t.exception()
        for m in self.meters.values():
            if m.channel is not None:
                m.channel.discard()
        while self.resources:
            closer = self.resources.pop()
            res = closer()
            if asyncio.iscoroutine(res):
                await res

    def thread_pool(self) -> DaemonPool:
        """The run's pool for blocking file calls, closed with it (made on first use).

        Not the loop's default executor: that one is joined when the caller's loop ends,
        and a read that never returns (a FIFO without a writer) would block the exit.
        """
        pool = self._pool
        if pool is None:
            pool = self._pool = DaemonPool(None, "aioflow-io", what="the run's file reads")
            self.resources.append(pool.aclose)
        return pool

    def stats(self) -> RunStats:
        """A snapshot of the stats (callable from another thread while the run goes)."""
        until = self.ended or perf_counter()
        meters: list[StageMeter] = []
        for _ in range(100):
            try:
                meters = list(self.meters.values())
                break
            except RuntimeError:  # the run's thread opened a stage meanwhile: try again
                continue
        return RunStats.from_meters(
            meters, until - self.started, until, timeline=(self.started, self.consumer)
        )


def graph_nodes(root: Pipeline[Any]) -> list[Node]:
    """The nodes of a graph, each once, in a fixed order (depth first from the sink).

    Without recursion: a chain may be longer than the recursion limit.
    """
    out: dict[int, Node] = {}
    stack = [root]
    while stack:
        node = stack.pop()._node
        if id(node) in out:
            continue
        out[id(node)] = node
        stack.extend(reversed(node.inputs))
    return list(out.values())


def _number_nodes(root: Pipeline[Any]) -> dict[int, int]:
    """Number the nodes of a graph in ``graph_nodes``' order."""
    return {id(node): i for i, node in enumerate(graph_nodes(root))}


async def _pump(
    gen: ChunkIter, chan: Any, meter: StageMeter, metered: bool, ln: Lane | None = None
) -> None:
    """Drive a (fused) stage generator and push its chunks into ``chan``.

    ``metered``: count the stage's output and time here (as ``_metered`` does for a fused
    stage, on the instance's lane ``ln``), saving a generator layer per chunk.
    """
    pc = perf_counter
    nxt = gen.__anext__
    if ln is None:
        ln = Lane(0)  # (a lane nobody reads: the hop to the consumer)
    try:
        while True:
            t0, c0 = pc(), ln.inner
            try:
                chunk = await nxt()
            except StopAsyncIteration:
                break
            finally:
                if metered:  # (as in _metered)
                    t1 = pc()
                    dt = t1 - t0
                    meter.t_next += dt
                    own = dt - (ln.inner - c0)
                    if own > 0.0:
                        ln.work(t1, own)
            if metered:
                meter.items_out += len(chunk)
                meter.chunks_out += 1
            if chan.full_for(chunk):
                t0 = pc()
                await chan.put(chunk)
                meter.t_wait_out += pc() - t0
            else:
                await chan.put(chunk)
    except asyncio.CancelledError as e:
        if cancelling():
            raise
        chan.close(control_flow_error(e, meter.name))
    except BaseException as e:  # also SystemExit/KeyboardInterrupt from a user function
        chan.close(e)
    else:
        chan.close()
    finally:
        await gen.aclose()
