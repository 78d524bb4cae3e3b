"""Process pools owned by a run: workers started safely, functions shipped by value.

``executor="process"`` gives a stage a ``ProcessPool`` that belongs to the run (one per
stage and run, shared by the stage's re-openings, e.g. under ``repeat``) and is shut
down when the run ends. The pool is driven from the event loop, without threads: each
worker has a socket that the loop watches (``add_reader``).

- Workers start with ``forkserver`` (``spawn`` where there is none), never a bare fork
  of a parent that already runs threads and a loop. They ignore SIGINT and end as soon
  as their socket reaches end-of-file, so they die with the parent (see ``_worker``).
- Functions are cloudpickled once per stage and sent by value, so lambdas, closures and
  functions of ``__main__``, a test module or a notebook cell work.
- Items travel in batches sized from the measured call time (~``TASK_SECONDS`` of work
  per message), so small items cost little IPC; in an ordered map each worker has a
  second batch queued, so it never waits for the parent between batches.
- Large numpy results come back through shared memory (``_worker``); every segment is
  unlinked when received, and the pool unlinks any left by a dead worker when it closes.
- A worker that dies fails its calls with ``WorkerDied`` (pid, signal or exit code) and
  breaks the pool: later calls fail the same way, and the next run starts a fresh pool.
  With ``timeout``, a worker whose call runs too long is killed and replaced (its call
  fails with ``StageTimeout``); batches are then one item, so the limit is per call.
"""

from __future__ import annotations

import asyncio
import itertools
import multiprocessing as mp
import os
import pickle
import signal
import site
import sys
import sysconfig
import threading
import weakref
from collections import deque
from collections.abc import Callable
from functools import partial
from time import monotonic, perf_counter
from types import ModuleType
from typing import Any

import cloudpickle

from . import _worker
from ._meters import StageMeter
from ._runtime import CHUNK_MAX, Ctx, Run
from .errors import PipelineError, StageError, StageTimeout, WorkerDied

__all__ = ["TASK_SECONDS", "ProcessPool", "run_process_pool", "ship"]

#: A batch of items sent to a worker should take about this long to compute.
TASK_SECONDS = 0.01

_pool_ids = itertools.count()
_pools: weakref.WeakKeyDictionary[Run, dict[Any, ProcessPool]] = weakref.WeakKeyDictionary()
_ship_lock = threading.Lock()


def run_process_pool(
    ctx: Ctx, workers: int, timeout: float | None, ordered: bool = True
) -> ProcessPool:
    """The process pool of this stage in this run (made on first use, closed at run end)."""
    pools = _pools.setdefault(ctx.run, {})
    key = (ctx.meter.key, workers, timeout, ordered)
    pool = pools.get(key)
    if pool is None or pool.closed or pool.broken is not None:
        # a second batch queued per worker hides the round trip between batches; it
        # would wait behind a slow call, so unordered maps and timed calls go without
        pool = pools[key] = ProcessPool(workers, ctx.name, timeout, queued=ordered)
        pool.meter = ctx.meter
        ctx.run.resources.append(pool.aclose)
    return pool


# -- shipping functions by value ------------------------------------------------------
def ship(fn: Callable[..., Any]) -> bytes:
    """Cloudpickle ``fn``; a top-level module of the user's own (a script, a test module)
    is pickled by value too, so that workers need not import it."""
    mod = _user_module(fn)
    with _ship_lock:
        if mod is not None:
            cloudpickle.register_pickle_by_value(mod)
        try:
            return cloudpickle.dumps(fn, protocol=5)
        finally:
            if mod is not None:
                cloudpickle.unregister_pickle_by_value(mod)


def _library_dirs() -> tuple[str, ...]:
    paths = sysconfig.get_paths()
    dirs = {paths[k] for k in ("stdlib", "platstdlib", "purelib", "platlib") if k in paths}
    dirs.update(getattr(site, "getsitepackages", list)())
    return tuple(os.path.realpath(d) + os.sep for d in dirs)


def _user_module(fn: Any) -> ModuleType | None:
    while isinstance(fn, partial):
        fn = fn.func
    name = getattr(fn, "__module__", None) or type(fn).__module__
    if not name or "." in name or name in ("__main__", "builtins"):
        return None  # cloudpickle already ships __main__ by value
    mod = sys.modules.get(name)
    path = getattr(mod, "__file__", None)
    if mod is None or path is None or os.path.realpath(path).startswith(_library_dirs()):
        return None
    return mod


def _context() -> Any:
    if "forkserver" not in mp.get_all_start_methods():  # pragma: no cover - macOS, Windows
        return mp.get_context("spawn")
    ctx = mp.get_context("forkserver")
    # preload the worker module in the fork server (no effect once it runs), so that
    # each worker does not import aioflow and numpy again
    from multiprocessing import forkserver

    mods = list(getattr(forkserver._forkserver, "_preload_modules", None) or ["__main__"])
    if "aioflow._worker" not in mods:
        ctx.set_forkserver_preload([*mods, "aioflow._worker"])
    return ctx


# -- the pool -------------------------------------------------------------------------
class _Task:
    __slots__ = ("fn_id", "fut", "id", "items", "n", "pos", "timer")

    def __init__(self, tid: int, fn_id: int, items: bytes, n: int, pos: int, fut: Any) -> None:
        self.id = tid
        self.fn_id = fn_id
        self.items = items
        self.n = n
        self.pos = pos
        self.fut: asyncio.Future[list[Any]] = fut
        self.timer: asyncio.TimerHandle | None = None


class _Worker:
    __slots__ = ("conn", "fns", "proc", "ready", "tasks")

    def __init__(self, proc: Any, conn: Any) -> None:
        self.proc = proc
        self.conn = conn
        self.ready = False
        self.fns: set[int] = set()
        self.tasks: deque[_Task] = deque()


class ProcessPool:
    """Worker processes of one stage of one run, fed batches of items from the loop."""

    def __init__(
        self, workers: int, stage: str, timeout: float | None, *, queued: bool = True
    ) -> None:
        self.loop = asyncio.get_running_loop()
        self.stage = stage
        self.timeout = timeout
        self.depth = 2 if queued and timeout is None else 1  # batches sent per worker
        self.slots = workers * self.depth  # batches in flight the stage may start
        # the stage holds up to 2 x slots batches (see concurrent_map): keep their items
        # within what ``map`` declares it holds, concurrency + CHUNK_MAX
        self.max_batch = max(1, (workers + CHUNK_MAX) // (2 * self.slots))
        self.prefix = f"aioflow{os.getpid()}p{next(_pool_ids)}"
        self.workers: list[_Worker] = []
        self.graveyard: list[Any] = []  # dead or killed processes, joined at close
        self.pending: deque[_Task] = deque()
        self.fns: list[tuple[Callable[..., Any], bytes]] = []
        self.broken: tuple[int | None, int | None, int | None] | None = None
        self.closed = False
        self.item_seconds: float | None = None
        self.meter: StageMeter | None = None  # gets the workers' call time (busy time)
        self._ids = itertools.count()
        self._mp = _context()
        for _ in range(workers):
            self._spawn()

    # -- used by the stage ------------------------------------------------------------
    def register(self, fn: Callable[..., Any]) -> int:
        """The id under which ``fn`` is sent to workers (pickled once, here)."""
        for i, (f, _) in enumerate(self.fns):
            if f is fn:
                return i
        try:
            data = ship(fn)
        except Exception as e:
            raise PipelineError(
                f"stage {self.stage!r}: the function cannot be sent to a worker process"
                f" (executor='process' pickles it with cloudpickle): {e!r}"
            ) from e
        self.fns.append((fn, data))
        return len(self.fns) - 1

    def batch_size(self) -> int:
        """How many items the next batch should carry (1 until a call has been timed)."""
        if self.timeout is not None or self.item_seconds is None:
            return 1
        return max(1, min(self.max_batch, int(TASK_SECONDS / max(self.item_seconds, 1e-7))))

    def submit(self, fn_id: int, items: list[Any], pos: int) -> asyncio.Future[list[Any]]:
        """Run ``fn`` on ``items`` in a worker: a future of one result or Failure per item."""
        if self.broken is not None:
            raise self._died(pos, len(items), running=False)
        try:
            data = pickle.dumps(items, protocol=5)
        except Exception:
            raise self._unpicklable(items, pos) from None
        task = _Task(next(self._ids), fn_id, data, len(items), pos, self.loop.create_future())
        self.pending.append(task)
        self._dispatch()
        return task.fut

    async def aclose(self) -> None:
        """Stop every worker (busy ones are killed), reap them, unlink stray segments."""
        if self.closed:
            return
        self.closed = True
        procs = list(self.graveyard)
        for t in self.pending:
            t.fut.cancel()
        self.pending.clear()
        for w in self.workers:
            busy = bool(w.tasks)
            self._drop(w)  # closing its socket ends an idle worker
            if busy:
                w.proc.kill()
            procs.append(w.proc)
        self.workers.clear()
        deadline = monotonic() + 2.0
        while any(p.exitcode is None for p in procs):
            if monotonic() > deadline:
                for p in procs:
                    if p.exitcode is None:
                        p.kill()
                deadline = float("inf")
            await asyncio.sleep(0.005)
        for p in procs:
            p.join()
            p.close()  # its sentinel fds now, not whenever the object is collected
        for name in _worker.shm_dir_names(self.prefix):
            _worker.unlink_shm(name)

    # -- workers ----------------------------------------------------------------------
    def _spawn(self) -> None:
        parent_conn, child_conn = self._mp.Pipe(duplex=True)
        proc = self._mp.Process(
            target=_worker.main,
            args=(child_conn, self.prefix),
            name=f"aioflow-worker {self.stage}",
            daemon=True,  # terminated by multiprocessing at exit if a run was never closed
        )
        proc.start()
        child_conn.close()
        w = _Worker(proc, parent_conn)
        self.workers.append(w)
        self.loop.add_reader(parent_conn.fileno(), self._on_readable, w)
        # uvloop makes a watched fd non-blocking; the socket is read and written whole
        # messages at a time (the worker's reader thread always drains it)
        os.set_blocking(parent_conn.fileno(), True)

    def _drop(self, w: _Worker) -> None:
        self.loop.remove_reader(w.conn.fileno())
        w.conn.close()
        for t in w.tasks:
            if t.timer is not None:
                t.timer.cancel()

    def _dispatch(self) -> None:
        for level in range(self.depth):
            for w in self.workers:
                if not self.pending:
                    return
                if w.ready and len(w.tasks) <= level:
                    self._send(w, self.pending.popleft())

    def _send(self, w: _Worker, task: _Task) -> None:
        if task.fut.done():  # cancelled before it was sent
            return
        fn = None if task.fn_id in w.fns else self.fns[task.fn_id][1]
        try:
            w.conn.send_bytes(pickle.dumps((task.id, task.fn_id, fn, task.items), protocol=5))
        except OSError:  # the worker died; its end-of-file is on the way
            self.pending.appendleft(task)
            return
        w.fns.add(task.fn_id)
        w.tasks.append(task)
        if self.timeout is not None:
            task.timer = self.loop.call_later(self.timeout, self._expire, w, task)

    def _on_readable(self, w: _Worker) -> None:
        try:
            header = w.conn.recv_bytes()
            if header == b"ready":
                w.ready = True
                self._dispatch()
                return
            task_id, seconds, shm, sizes = pickle.loads(header)
            payload = w.conn.recv_bytes()
        except (EOFError, OSError):
            self._lost(w)
            return
        task = w.tasks.popleft()
        assert task.id == task_id, "worker answered out of order"
        if task.timer is not None:
            task.timer.cancel()
        buffers = _worker.open_shm(shm, sizes) if shm else None
        if self.meter is not None:  # time computing, not time queued behind a batch
            self.meter.worker_done(w.proc.pid, perf_counter(), seconds)
        per_item = seconds / task.n
        s = self.item_seconds
        self.item_seconds = per_item if s is None else 0.7 * s + 0.3 * per_item
        if not task.fut.done():
            try:
                out = pickle.loads(payload, buffers=buffers)
            except Exception as e:
                task.fut.set_exception(
                    StageError(
                        f"stage {self.stage!r}: the results of items {task.pos}.."
                        f"{task.pos + task.n - 1} could not be unpickled here: {e!r}",
                        stage=self.stage,
                    )
                )
            else:
                task.fut.set_result([self._failure(y) for y in out])
        self._dispatch()

    def _failure(self, y: Any) -> Any:
        if type(y) is _worker.Failure and y.exc is None:
            y.exc = StageError(f"stage {self.stage!r}: {y.why}", stage=self.stage)
        return y

    def _lost(self, w: _Worker) -> None:
        """A worker died on its own: fail its calls, and every later one (broken pool)."""
        self._drop(w)
        self.workers.remove(w)
        self.graveyard.append(w.proc)
        w.proc.join(1.0)
        code = w.proc.exitcode
        sig = -code if code is not None and code < 0 else None
        self.broken = (w.proc.pid, sig, code if sig is None else None)
        for t in w.tasks:
            if not t.fut.done():
                t.fut.set_exception(self._died(t.pos, t.n))
        for t in self.pending:
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

    def _expire(self, w: _Worker, task: _Task) -> None:
        """A call ran past ``timeout``: kill its worker (never wait), start another."""
        if not w.tasks or w.tasks[0] is not task:
            return
        w.tasks.popleft()
        self._drop(w)
        self.workers.remove(w)
        w.proc.kill()
        self.graveyard.append(w.proc)
        self.pending.extendleft(reversed(w.tasks))  # not started yet: give them to others
        if not task.fut.done():
            task.fut.set_exception(
                StageTimeout(
                    f"stage {self.stage!r}: the call on item {task.pos} took longer than"
                    f" {self.timeout} s; its worker process {w.proc.pid} was killed"
                )
            )
        if not self.closed:
            self._spawn()

    def _unpicklable(self, items: list[Any], pos: int) -> StageError:
        for j, x in enumerate(items):
            try:
                pickle.dumps(x, protocol=5)
            except Exception as e:
                return StageError(
                    f"stage {self.stage!r}: item {pos + j} (a {type(x).__qualname__}) cannot"
                    f" be sent to a worker process: {e!r}",
                    stage=self.stage,
                )
        return StageError(f"stage {self.stage!r}: items cannot be pickled", stage=self.stage)
