"""Process pools of ``executor="process"``: warm across epochs, driven from the loop.

A pool belongs to one stage (its ``Node``) and stays warm between the runs of the
pipelines that hold that stage, as DataLoader's ``persistent_workers``: a run checks the
node's idle pool out (or starts one), attaches it to its loop, and at its end detaches it
and checks it back in (``_process/pool_life``). A pool is closed, its workers reaped, when
``Pipeline.close()`` is called, when the node becomes unreachable (a ``weakref.finalize``),
at interpreter exit, and at once when it is broken (a worker died), was closed meanwhile,
or another run of the node already returned a pool.

- Workers are forked by the fork server (``_process/forks``: a copy of the program made
  when its first pool started, the libraries it imported loaded, torch included), or,
  when there is none, are fresh interpreters started with ``subprocess``; either way
  they never run the user's ``__main__``, so a script without ``if __name__ ==
  "__main__":`` works. They ignore SIGINT and live in a process group of their own, and
  end as soon as their socket reaches end-of-file, so they die with the parent, even a
  SIGKILLed one.
- Functions are cloudpickled once per pool and sent by value (lambdas, closures, functions
  of ``__main__``, a test module or a notebook cell); their code keeps its file name.
  Items go by name (plain pickle), or by value when a class in them cannot be imported
  by a worker (``_process/ship``); results likewise (``_process/worker``).
- Items travel in batches sized from the measured call time (~``TASK_SECONDS`` of work
  per message), each item pickled on its own, so a bad one fails only itself; in an
  ordered map each worker has a second batch queued. Sends never block the loop: the
  socket is non-blocking and large buffers go through shared memory (``_process/worker``).
- A worker that dies fails its calls with ``WorkerDied`` (pid, signal or exit code) and
  breaks the pool: later calls fail the same way, and the next run starts a fresh pool.
  With ``timeout``, a worker whose call runs too long is killed and replaced (its call
  fails with ``StageTimeout``); batches are then one item, so the limit is per call.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import signal
import subprocess
import weakref
from collections import deque
from collections.abc import Callable
from functools import partial
from time import monotonic, perf_counter
from typing import Any

from aioflow._core.autotune import items_for
from aioflow._core.ctx import Ctx
from aioflow._core.graph import CHUNK_MAX, Described, graph_nodes
from aioflow._core.timeouts import arm
from aioflow._process import ship as _ship
from aioflow._process import wire as _wire
from aioflow._process.forks import Proc
from aioflow._process.pool_batch import Batch, one_by_one, results
from aioflow._process.pool_life import (
    checkout,
    forget,
    park,
    release,
    ship_by_value,
    track,
    wants_pool,
)
from aioflow._process.pool_wire import Worker
from aioflow.errors import PipelineError, WorkerDied
from aioflow.stats.meters import StageMeter

__all__ = ["TASK_SECONDS", "ProcessPool", "prestart", "run_process_pool"]

#: A batch of items sent to a worker should take about this long to compute.
TASK_SECONDS = 0.01


def run_process_pool(
    ctx: Ctx, workers: int, timeout: float | None, ordered: bool = True
) -> ProcessPool:
    """The process pool of this stage in this run: the node's warm one, or a new one."""
    pools: dict[Any, ProcessPool] = ctx.run.per_run("process pools", dict)
    key = (ctx.meter.key, workers, timeout, ordered)
    pool = pools.get(key)
    if pool is None or pool.closed or pool.broken is not None:
        # a second batch queued per worker hides the round trip between batches; it
        # would wait behind a slow call, so unordered maps and timed calls go without
        config = (workers, timeout, ordered)
        owner = ctx.node.hints.pool_owner or ctx.node  # a fused variant uses its map's pool
        pool = checkout(owner, config)
        if pool is None:
            pool = ProcessPool(workers, timeout, queued=ordered, holds=ctx.node.holds)
            track(pool)
        pool.node = weakref.ref(owner)
        pool.attach(ctx.name, ctx.meter)
        pools[key] = pool
        ctx.run.resources.append(partial(release, pool))
    return pool


def prestart(root: Described) -> None:
    """Start the pools of ``root``'s process maps that have none, as its run starts.

    Called as an iteration starts, before its run is built: workers boot, and load the
    function, while the run starts. Each pool waits idle on its node, where its stage
    checks it out (a pool that no stage takes stays warm, as after an epoch).
    """
    for node in graph_nodes(root):
        owner = node.hints.pool_owner or node  # a fused variant uses its map's pool
        if node.hints.pool is None or not wants_pool(owner):
            continue
        fn, workers, timeout, ordered = node.hints.pool
        pool = ProcessPool(workers, timeout, queued=ordered, holds=node.holds)
        track(pool)
        pool.node = weakref.ref(owner)
        pool.stage = node.name
        with contextlib.suppress(PipelineError):  # (the run's stage raises it)
            pool.preload(fn)
        if not park(pool):
            pool.close_now()


# -- the pool -------------------------------------------------------------------------
class ProcessPool:
    """Worker processes of one stage, fed batches of items from the loop of a run."""

    def __init__(
        self, workers: int, timeout: float | None, *, queued: bool = True, holds: int = CHUNK_MAX
    ) -> None:
        self.loop: asyncio.AbstractEventLoop | None = None  # the run's, while attached
        self.pid = os.getpid()  # the process whose workers these are (not a forked child)
        self.stage = ""
        self.config = (workers, timeout, queued)
        self.timeout = timeout
        self.depth = 2 if queued and timeout is None else 1  # batches sent per worker
        self.slots = workers * self.depth  # batches in flight the stage may start
        # the stage holds up to 2 x slots batches (see concurrent_map): keep their items
        # within what its node declares it holds (``holds``: map's, 2 x workers + CHUNK_MAX)
        self.max_batch = max(1, holds // (2 * self.slots))
        self.workers: list[Worker] = []
        self.graveyard: list[Proc] = []  # dead or killed, to reap
        self.pending: deque[Batch] = deque()
        self.fns: list[tuple[Callable[..., Any], bytes]] = []
        self.broken: tuple[int | None, int | None, int | None] | None = None
        self.closed = False
        self.retired = False  # Pipeline.close() while in use: close it when released
        self.finalizer: Any = None  # while idle: closes it when its node goes
        self.node: Any = None  # a weak reference to the stage's node
        self.item_seconds: float | None = None
        self.meter: StageMeter | None = None  # gets the workers' call time (busy time)
        self._ids = itertools.count()
        for _ in range(workers):
            self._spawn()

    # -- a run takes it, uses it, gives it back ----------------------------------------
    def attach(self, stage: str, meter: StageMeter) -> None:
        """Let the running loop drive the pool (until ``release``)."""
        self.loop = asyncio.get_running_loop()
        self.stage = stage
        self.meter = meter
        for w in self.workers:
            w.watch(self.loop, self._on_readable)

    def healthy(self) -> bool:
        return (
            not self.closed
            and not self.retired
            and self.broken is None
            and all(w.alive() for w in self.workers)
        )

    async def release(self) -> None:
        """End of a run: drop queued batches, let running ones finish (or kill their
        workers after a short grace), and detach from the loop."""
        for t in self.pending:
            t.fut.cancel()
            t.drop()
        self.pending.clear()
        deadline = monotonic() + self._grace()
        while any(w.tasks for w in self.workers) and monotonic() < deadline:
            await asyncio.sleep(0.005)
        for w in [w for w in self.workers if w.tasks]:
            self._discard(w, kill=True)
        for w in self.workers:
            w.unwatch()
        self.loop = None
        self.meter = None
        await self._reap(list(self.graveyard))
        self.graveyard.clear()

    def _grace(self) -> float:
        if self.item_seconds is None or self.broken is not None:
            return 0.05
        queued = max((sum(t.n for t in w.tasks) for w in self.workers), default=0)
        return min(1.0, 0.05 + 2 * queued * self.item_seconds)

    # -- used by the stage ------------------------------------------------------------
    def register(self, fn: Callable[..., Any]) -> int:
        """The id under which ``fn`` is sent to workers (pickled once, here)."""
        for i, (f, _) in enumerate(self.fns):
            if f is fn:
                return i
        self.fns.append((fn, ship_by_value(fn, self.stage)))
        return len(self.fns) - 1

    def preload(self, fn: Callable[..., Any]) -> None:
        """Send ``fn`` to every worker now, ahead of the first batch that needs it."""
        fn_id = self.register(fn)
        for w in self.workers:
            if fn_id not in w.fns:
                w.post(("fn", fn_id, self.fns[fn_id][1]), [])
                w.fns.add(fn_id)

    def batch_size(self) -> int:
        """How many items the next batch should carry (1 until a call has been timed)."""
        if self.timeout is not None or self.item_seconds is None:
            return 1
        return items_for(TASK_SECONDS, self.item_seconds, self.max_batch)

    def submit(
        self, fn_id: int, items: list[Any], pos: int, *, stack: bool = False
    ) -> asyncio.Future[list[Any]]:
        """Run ``fn`` on ``items`` in a worker: a future of one result or Failure per item
        (with ``stack``: a ``_columns.Rows``, when the worker could stack the results)."""
        if self.broken is not None:
            raise self._died(pos, len(items), running=False)
        assert self.loop is not None
        task = Batch(next(self._ids), fn_id, items, pos, self.loop.create_future())
        task.stack = stack
        try:
            task.batch = _wire.pack(items, task.fds, _ship.dumps, _ship.dumps_by_value)
        except Exception:
            one_by_one(task, self.stage)
        self.pending.append(task)
        self._dispatch()
        return task.fut

    # -- closing ------------------------------------------------------------------------
    def _shut(self) -> list[Proc]:
        """Close every socket (idle workers end at once), kill busy ones; the processes."""
        if self.pid != os.getpid():  # a forked child's copy (the fork hook did not run)
            forget(self)
            return []
        self.closed = True
        for t in self.pending:
            t.fut.cancel()
            t.drop()
        self.pending.clear()
        procs = list(self.graveyard)
        for w in list(self.workers):
            procs.append(w.proc)
            self._discard(w, kill=bool(w.tasks))
        self.graveyard.clear()
        return procs

    async def aclose(self) -> None:
        """Stop every worker (busy ones are killed) and reap them, from the loop."""
        if not self.closed:
            await self._reap(self._shut())

    def close_now(self) -> None:
        """The same without a loop (an idle pool: finalizer, exit, ``Pipeline.close``)."""
        if self.closed:
            return
        for p in self._shut():
            try:
                p.wait(2.0)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()

    @staticmethod
    async def _reap(procs: list[Proc]) -> None:
        deadline = monotonic() + 2.0
        while any(p.poll() is None for p in procs):
            if monotonic() > deadline:
                for p in procs:
                    if p.poll() is None:
                        p.kill()
                deadline = float("inf")
            await asyncio.sleep(0.005)

    # -- workers ----------------------------------------------------------------------
    def _spawn(self) -> None:
        w = Worker.start()
        self.workers.append(w)
        if self.loop is not None:
            w.watch(self.loop, self._on_readable)

    def _discard(self, w: Worker, *, kill: bool) -> None:
        """Take a worker out of the pool: close its socket (and kill it, if busy)."""
        w.close(kill=kill)
        for t in w.tasks:
            if t.timer is not None:
                t.timer.cancel()
        self.workers.remove(w)
        self.graveyard.append(w.proc)

    def _dispatch(self) -> None:
        # a second batch queues behind a busy worker only once every worker is up: one
        # still starting gets the next batch first (a fresh pool's calls run side by side)
        depth = self.depth if all(w.ready for w in self.workers) else 1
        for level in range(depth):
            for w in self.workers:
                if not self.pending:
                    return
                if w.ready and len(w.tasks) <= level:
                    self._send(w, self.pending.popleft())

    def _send(self, w: Worker, task: Batch) -> None:
        if task.fut.done():  # cancelled before it was sent
            task.drop()
            return
        fn = None if task.fn_id in w.fns else self.fns[task.fn_id][1]
        w.post((task.id, task.fn_id, fn, task.batch, task.entries, task.stack), task.fds)
        task.fds = []
        w.fns.add(task.fn_id)
        w.tasks.append(task)
        if self.timeout is not None:
            stop = partial(self._expire, w, task)
            task.timer = arm(task.fut, self.timeout, stop, self.stage, task.pos)

    def _on_readable(self, w: Worker) -> None:
        msgs, eof = w.read()
        for msg in msgs:
            if w in self.workers:
                self._on_message(w, *msg)
            else:  # (lost meanwhile)
                for fd in msg[1]:
                    os.close(fd)
        if eof and w in self.workers:
            self._lost(w)

    def _on_message(self, w: Worker, body: bytes | bytearray, fds: deque[int]) -> None:
        try:
            if body == b"ready":
                w.ready = True
                return
            task_id, seconds, kind, payload = _wire.decode(body)
            task = w.tasks.popleft()
            assert task.id == task_id, "worker answered out of order"
            if task.timer is not None:
                task.timer.cancel()
            if kind is None:  # an item could not be loaded there: send them one by one
                if not task.fut.done():
                    one_by_one(task, self.stage)
                    self.pending.appendleft(task)
                return
            if self.meter is not None:  # time computing, not time queued behind a batch
                self.meter.worker_done(w.proc.pid, perf_counter(), seconds)
            per_item = seconds / task.n
            s = self.item_seconds
            self.item_seconds = per_item if s is None else 0.7 * s + 0.3 * per_item
            if not task.fut.done():
                task.fut.set_result(results(task, kind, payload, fds, self.stage))
        finally:
            while fds:
                os.close(fds.popleft())
            self._dispatch()

    def _lost(self, w: Worker) -> None:
        """A worker died on its own: fail its calls, and every later one (broken pool)."""
        tasks = list(w.tasks)
        self._discard(w, kill=False)
        try:
            code = w.proc.wait(1.0)
        except subprocess.TimeoutExpired:  # its socket closed, but it lingers: end it
            w.proc.kill()
            code = w.proc.wait()
        sig = -code if code < 0 else None
        self.broken = (w.proc.pid, sig, code if sig is None else None)
        for t in tasks:
            if not t.fut.done():
                t.fut.set_exception(self._died(t.pos, t.n))
        for t in self.pending:
            t.drop()
            if not t.fut.done():
                t.fut.set_exception(self._died(t.pos, t.n, running=False))
        self.pending.clear()

    def _died(self, pos: int, n: int, *, running: bool = True) -> WorkerDied:
        assert self.broken is not None
        pid, sig, code = self.broken
        how = f"killed by {signal.Signals(sig).name}" if sig else f"exited with code {code}"
        items = f"item {pos}" if n == 1 else f"items {pos}..{pos + n - 1}"
        when = f"while running {items}" if running else f"before {items} could run"
        return WorkerDied(
            f"stage {self.stage!r}: worker process {pid} {how} {when}; the pool is discarded",
            stage=self.stage,
            pid=pid,
            signal=sig,
            exitcode=code,
        )

    def _expire(self, w: Worker, task: Batch) -> str | None:
        """A call ran past ``timeout`` (``_timeouts.arm``): kill its worker (never wait),
        start another; None if it is not running (any more)."""
        if not w.tasks or w.tasks[0] is not task:
            return None
        w.tasks.popleft()  # (with a timeout, a worker has one batch at a time)
        self._discard(w, kill=True)
        if not self.closed:
            self._spawn()
        return f"; its worker process {w.proc.pid} was killed"
