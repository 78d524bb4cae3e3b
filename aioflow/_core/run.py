"""The run: how a run is built from a Pipeline, who owns its tasks, how it shuts down.

``Run.open`` opens the graph from the sink (``_core/graph``): a node marked ``task=True``
(sources, concurrent maps, prefetch, fan-in) runs in a task of its own, and its output
goes through a bounded ``Channel`` (``_core/channel``) to the next stage; consecutive inline
nodes are fused, async generators chained inside the task that reads them (``_core/stages``),
and so is a sync source of the graph (``Hints.inline``: it never awaits).
The consumer of a run reads the last channel (``_iterators``).

Ownership flows downstream: a channel's reader starts the producing task on first read
and, when closed (end, error, break, cancellation), cancels and awaits it; the producer
closes its own generator, which closes its readers, and so on up the graph. ``Run``
starts every task (``Run.start``), keeps every per-run resource (``Run.per_run``,
``Run.resources``), and at ``aclose`` cancels and awaits any task that remains, then
closes the resources in reverse order.

This module also re-exports the runtime's vocabulary for the operator modules.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable, Coroutine
from time import perf_counter
from typing import Any, TypeVar

from aioflow._core.channel import Channel
from aioflow._core.ctx import Ctx, Sub
from aioflow._core.graph import (
    CHANNEL_CHUNKS,
    CHANNEL_ITEMS,
    CHUNK_MAX,
    FUSE_MAX,
    INFINITE_CARD,
    NO_HINTS,
    UNKNOWN_CARD,
    Build,
    Chunk,
    ChunkIter,
    Described,
    Hints,
    Node,
    OpenCount,
    Opener,
    graph_nodes,
    runs_in_task,
)
from aioflow._core.positions import Positions
from aioflow._core.stages import LaneCell, items_of, metered, pump, take_lane
from aioflow._core.tasks import aclosing, cancel_and_wait, cancelling, keep_task, retrieve
from aioflow._core.threads import DaemonPool
from aioflow.stats import RunStats
from aioflow.stats.meters import Lane, StageMeter

__all__ = [
    "CHANNEL_CHUNKS",
    "CHANNEL_ITEMS",
    "CHUNK_MAX",
    "INFINITE_CARD",
    "UNKNOWN_CARD",
    "Build",
    "Channel",
    "Chunk",
    "ChunkIter",
    "Ctx",
    "Hints",
    "NO_HINTS",
    "Node",
    "OpenCount",
    "Opener",
    "Run",
    "aclosing",
    "cancelling",
    "graph_nodes",
    "items_of",
]

R = TypeVar("R")

#: Whether runs keep per-stage stats (``AIOFLOW_STATS=0`` turns the meters off; read when a
#: stage is opened, so ``bench/overhead.py`` can compare both in one process).
METER = os.environ.get("AIOFLOW_STATS", "1") != "0"


class Run:
    """One iteration (epoch) of a pipeline: owns every task, channel and pool it starts."""

    def __init__(self, root: Described | None = None, resume: Positions | None = None) -> None:
        # where its nodes are (numbered, opened, seekable): from the iterator, which built
        # it from the state it resumes from (``_state/resume.Resume``), or fresh
        self.resume = resume if resume is not None else Positions(root)
        self.tasks: set[asyncio.Task[Any]] = set()
        self.meters: dict[Any, StageMeter] = {}
        self.resources: list[Callable[[], Any]] = []  # closers, run at aclose (LIFO)
        self._kept: dict[Any, Any] = {}  # per-run objects of stages (see per_run)
        self._closers: set[asyncio.Task[Any]] = set()  # abort's closing task, until done
        self._depths: dict[int, int] = {}  # id(node) -> its fused depth (_fused_depth)
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
            m = self.meters[key] = StageMeter(name, key, task=runs_in_task(node))
        return m

    def open(
        self,
        pipeline: Described,
        *,
        parent: StageMeter | None = None,
        boundary: bool = False,
        chunks: int | None = None,
        reader: LaneCell | None = None,
        same_lane: bool = True,
        split: bool = True,
        sub: Sub = None,
    ) -> ChunkIter:
        """Open a pipeline: its chunks, as an async iterator owned by the caller.

        ``reader``: the lane of the instance that reads it, which its time is taken from;
        ``same_lane``: an input runs on its reader's lane index (a sub-pipeline: the
        lowest free one). ``split``: a long fused chain may be cut here (see ``_split``).
        ``sub``: the root of a sub-pipeline, its state to start from and what gets its
        seeker (``Ctx.open``).
        """
        node = pipeline._node
        # a sync source is fused into its reader (``runs_in_task``), but in a sub-pipeline
        # (``parent``: of flat_map, interleave) it keeps its task: fused, its reads never
        # wait, so its opener gathers its output into larger chunks, and a state taken
        # under the consumer's lead reaches past that opener's log more often (it replays)
        task = runs_in_task(node) if parent is None else node.task
        fused = not (task or boundary)
        if fused and split and self._fused_depth(node) % FUSE_MAX == 0:
            return self._split(pipeline, parent, reader, same_lane, sub)
        mine: LaneCell = [None]
        gen, meter = self._build(node, parent, mine, sub)
        if fused:
            return metered(gen, meter, mine, reader, same_lane) if METER else gen
        meter.task = True
        hints = node.hints
        chan = Channel(chunks if chunks is not None else hints.chunks, hints.items)
        return self._reader(gen, meter, chan, hints.grow_to, (mine, reader, same_lane))

    def _split(
        self,
        pipeline: Described,
        parent: StageMeter | None,
        reader: LaneCell | None,
        same_lane: bool,
        sub: Sub,
    ) -> ChunkIter:
        """The rest of a long chain of fused stages, in a task of its own (a fresh stack).

        Fused stages nest: building them, and each chunk's way through them, is as deep
        as the chain is long. Every ``FUSE_MAX`` stages of a chain (counted from its
        bottom, see ``_fused_depth``) the chain below goes on in a task that builds it when
        first read; this hop is not a stage, and the stats do not show it.
        """
        hop_lane: LaneCell = [None]

        async def rest() -> ChunkIter:
            gen = self.open(pipeline, parent=parent, reader=hop_lane, split=False, sub=sub)
            async with aclosing(gen):
                async for chunk in gen:
                    yield chunk

        hop = StageMeter(f"{pipeline._node.name} (split)", None)
        return self._reader(rest(), hop, Channel(), 0, (hop_lane, reader, same_lane))

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
            below = [q._node for q in n.inputs if not runs_in_task(q._node)]
            missing = [q for q in below if id(q) not in depth]
            if missing:
                todo.extend(missing)
                continue
            depth[id(n)] = 1 + max((depth[id(q)] for q in below), default=0)
            todo.pop()
        return depth[id(node)]

    def _build(
        self, node: Node, parent: StageMeter | None, mine: LaneCell, sub: Sub = None
    ) -> tuple[ChunkIter, StageMeter]:
        """The node's own (unmetered) generator and its meter."""
        meter = self.meter_for(node, parent)
        openers = tuple(self._opener(q, parent, mine) for q in node.inputs)
        for q in node.inputs:
            m = self.meter_for(q._node, parent)
            if m not in meter.inputs:
                meter.inputs.append(m)
        ctx = Ctx(self, node, meter, self.resume.open_index(node), mine, sub)
        return node.build(ctx, openers), meter

    def _opener(self, q: Described, parent: StageMeter | None, reader: LaneCell) -> Opener:
        # inputs are fused into the task that reads them; task nodes make their own task
        return lambda: self.open(q, parent=parent, reader=reader)

    async def _reader(
        self,
        gen: ChunkIter,
        meter: StageMeter,
        chan: Channel,
        grow_to: int,
        lanes: tuple[LaneCell, LaneCell | None, bool],
    ) -> ChunkIter:
        """The chunks of a stage run in a task of its own (started on first read), which
        feeds ``chan``; closing this cancels and awaits that task."""
        meter.channel = chan
        ln = up = None
        if METER:
            chan.attach(meter)
            ln = take_lane(meter, *lanes)
            up = lanes[1][0] if lanes[1] is not None else None
        task = self.start(pump(gen, chan, meter, ln), meter.name)
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
            await cancel_and_wait([task])
            chan.detach()
            if ln is not None:
                ln.in_use = False

    def start(
        self, coro: Coroutine[Any, Any, R], name: str = "aioflow", *, cancel: bool = True
    ) -> asyncio.Task[R]:
        """Start ``coro`` as a task of this run: the one way a task of a run is started.

        The run keeps it until it is done; ``aclose`` cancels and awaits what remains.
        ``cancel=False``: a closing task (it releases something that must not be left
        open, through any cancellation): kept until done, never cancelled by the run.
        """
        return keep_task(coro, name, self.tasks if cancel else self._closers)

    def per_run(self, key: Any, make: Callable[[], R]) -> R:
        """The object of this run kept under ``key``, made by ``make()`` the first time.

        Per-run state of a stage (its process pool, the error policy its file readers
        share) lives here and goes with the run.
        """
        try:
            return self._kept[key]
        except KeyError:
            obj = self._kept[key] = make()
            return obj

    def start_output(self, pipeline: Described, chan: Channel) -> asyncio.Task[Any]:
        """Start the run's last stage in a task that feeds ``chan`` (the consumer's)."""
        node = pipeline._node
        if METER:
            chan.waits = self.consumer
        if runs_in_task(node) and not (node.hints.buffer and not chan.threaded):
            # the last stage pumps into a channel of its own already: this hop to the
            # consumer is not a stage, and must not add its waits to that stage's (a
            # concurrent map's read-ahead is its channel and the consumer's; a thread's
            # channel bounded as prefetch(n)'s would cost a thread hand-off per chunk)
            hop = StageMeter("output", None)
            return self.start(pump(self.open(pipeline), chan, hop, None), "output")
        mine: LaneCell = [None]
        gen, meter = self._build(node, None, mine)
        if runs_in_task(node):  # prefetch(n): its channel is the consumer's, with its bound
            meter.task = True
            chan.bound(node.hints.chunks, node.hints.items)
        if not chan.threaded:  # (a thread's channel is not metered)
            meter.channel = chan
            if METER:
                chan.attach(meter)
        ln = mine[0] = meter.take_lane() if METER else None
        return self.start(pump(gen, chan, meter, ln), "output")

    # -- shutting down ----------------------------------------------------------------
    def abort(self) -> None:
        """Close the run soon, from a sync context on its loop (a dropped iterator).

        Every task is cancelled now; a closing task then awaits them and closes the run's
        pools. The run keeps the closing task referenced until it is done.
        """
        if self.closed:
            return
        self.cancel()
        self.start(self.aclose(), "close", cancel=False)

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
        for _ in range(10):  # (a task may start another while it is being cancelled)
            pending = [t for t in self.tasks if not t.done()]
            if not pending:
                break
            await cancel_and_wait(pending)
        retrieve(list(self.tasks))
        for m in self.meters.values():
            if m.channel is not None:
                m.channel.discard()
        while self.resources:
            closer = self.resources.pop()
            res = closer()
            if asyncio.iscoroutine(res):
                await res

    def thread_pool(self) -> DaemonPool:
        """The run's pool for blocking calls (file reads, spills), closed with it.

        Not the loop's default executor: that one is joined when the caller's loop ends,
        and a read that never returns (a FIFO without a writer) would block the exit.
        """

        def make() -> DaemonPool:
            pool = DaemonPool(None, "aioflow-io", what="the run's file reads")
            self.resources.append(pool.aclose)
            return pool

        return self.per_run("thread pool", make)

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
