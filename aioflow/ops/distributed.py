"""``Pipeline.distribute``: the part of a pipeline before it runs on a Dask cluster.

Like tf.data service's ``distributed_epoch`` mode. The source is cut into splits
(``_state/splits``); a Dask task takes a few of them (as many as make ~0.2 s of work, measured
as the epoch goes, fewer near the epoch's end), runs the part before ``distribute`` over
them on a worker and returns their items. A consumer keeps two tasks per worker thread
submitted or waiting to be read (``max_outstanding`` also bounds the elements in them
and those read and not yet handed on, with splits and chunks small enough for it; the
task sizes are ``distributed_tasks``'s) and submits the next as soon as one is read, so
the scheduler hands work to whichever worker is free (a fast worker takes more).
Everything that moves between machines is Dask's: its scheduler, its comms (numpy arrays
travel as out-of-band pickle buffers), its failure detection. Each epoch connects a
``Client`` of its own on the run's loop (to the given client's scheduler) and closes it
when the run ends, which releases whatever the epoch still had on the cluster.

Exactly once per epoch: a task's items reach the consumer only when it has finished, as
one result. A worker that dies takes its unfinished tasks with it and the scheduler runs
them again elsewhere (after ``distributed.scheduler.allowed-failures`` deaths in a row a
task fails with ``KilledWorker``); nothing of an unfinished task was delivered, so
nothing is delivered twice. Several consumers (one per training rank) share an epoch's
splits: consumer ``i`` of ``n`` takes splits ``i, i + n, i + 2n, ...``, disjoint and
covering the epoch, in the same order in every process.
"""

from __future__ import annotations

import asyncio
import dataclasses
import math
import os
from collections.abc import Sequence
from concurrent.futures import CancelledError as FutureCancelled
from time import perf_counter
from typing import TYPE_CHECKING, Any

import cloudpickle

from aioflow._core.base import pipeline_of
from aioflow._core.tasks import cancelling
from aioflow.errors import PipelineError, StageError
from aioflow.ops.combine import concat
from aioflow.ops.distributed_tasks import Sizer, chunk_of
from aioflow.ops.kit import (
    CHUNK_MAX,
    NO_HINTS,
    UNKNOWN_CARD,
    ChunkIter,
    Ctx,
    Hints,
    Node,
    Opener,
    graph_nodes,
)
from aioflow.ops.slicing import shard_from_env
from aioflow.stats.meters import StageMeter

if TYPE_CHECKING:
    from aioflow.pipeline import Pipeline

__all__ = ["build_distribute", "job_of", "run_split"]


def _leaf(upstream: Pipeline[Any]) -> Node:
    """The one source of the part to distribute; it must be splittable."""
    leaves = {id(node): node for node in graph_nodes(upstream) if not node.inputs}
    names = ", ".join(sorted(n.name for n in leaves.values()))
    if len(leaves) != 1:
        raise PipelineError(
            f"distribute needs the part before it to read one source, not {len(leaves)}"
            f" ({names}): cut it before the sources are combined"
        )
    (leaf,) = leaves.values()
    if leaf.hints.splits is None:
        raise PipelineError(
            f"distribute cannot split the source {leaf.name!r} into shares for the"
            " workers; use a source that can be split (af.range, af.list_files)"
        )
    return leaf


def _with_source(p: Pipeline[Any], leaf: Node, source: Pipeline[Any]) -> Pipeline[Any]:
    """``p`` with ``leaf`` replaced by ``source`` (shared nodes stay shared)."""
    made: dict[int, Pipeline[Any]] = {}

    def walk(q: Pipeline[Any]) -> Pipeline[Any]:
        node = q._node
        if node is leaf:
            return source
        if id(node) not in made:
            inputs = tuple(walk(i) for i in node.inputs)
            made[id(node)] = pipeline_of(dataclasses.replace(node, inputs=inputs))
        return made[id(node)]

    return walk(p)


def _where() -> str:
    try:
        from distributed import get_worker

        return str(get_worker().address)
    except Exception:  # not in a Dask worker (run_split called directly)
        return f"pid {os.getpid()}"


def _no_split(ctx: Ctx, inputs: Sequence[Opener]) -> ChunkIter:
    raise PipelineError("distribute: a task ran without its splits")  # pragma: no cover


def job_of(upstream: Pipeline[Any], leaf: Node) -> bytes:
    """The part before ``distribute`` as a task gets it: the source left out (a hole that
    the task fills with its splits), so that a long file list is not in every task."""
    hole = pipeline_of(Node("split", _no_split, task=True))
    job = _with_source(upstream, leaf, hole)
    try:
        return cloudpickle.dumps((job, hole._node))
    except Exception as e:
        raise PipelineError(
            f"distribute: stage {_unpicklable(job)!r} before it cannot be sent to the Dask"
            f" workers (cloudpickle, by value): {e!r}. Make what its function refers to"
            " picklable (open files, locks, sockets or clients inside the function, or in a"
            " class whose __reduce__ reopens them)."
        ) from e


def _unpicklable(job: Pipeline[Any]) -> str:
    """The name of the first stage (from the source) that cannot be pickled alone."""
    for node in reversed(graph_nodes(job)):
        try:
            cloudpickle.dumps(node.build)
        except Exception:
            return node.name
    return "?"


def run_split(
    job: bytes, parts: list[Pipeline[Any]], draw: int = 0
) -> tuple[list[Any], float, str]:
    """On a worker: the items of the part before ``distribute`` over the splits ``parts``
    (read one after another as one source), the seconds it took, and where it ran.

    Each task runs fresh copies of the nodes, each opened as if for the ``draw``-th
    time: random operators seeded by ``(seed, epoch)`` draw from ``(seed, draw)``, which
    the consumer makes differ by epoch and by task (else every task of every epoch would
    draw the same numbers)."""
    upstream, hole = cloudpickle.loads(job)
    p = _with_source(upstream, hole, parts[0] if len(parts) == 1 else concat(*parts))
    for node in graph_nodes(p):
        node.opens.start_at(draw)
    t0 = perf_counter()
    items = asyncio.run(p.collect())
    return items, perf_counter() - t0, _where()


class _Meters:
    """Where a distributed epoch's time goes: one row per worker, and the overhead."""

    def __init__(self, ctx: Ctx) -> None:
        self.ctx = ctx
        self.workers: dict[str, StageMeter] = {}
        self.overhead = self._child("scheduling and transfer")

    def _child(self, what: str) -> StageMeter:
        key = (self.ctx.meter.key, what)
        m = self.ctx.run.meters[key] = StageMeter(f"{self.ctx.name} > {what}", key, task=True)
        self.ctx.meter.adopt(m)
        return m

    def split_done(self, where: str, n: int, compute: float, round_trip: float) -> None:
        m = self.workers.get(where)
        if m is None:
            m = self.workers[where] = self._child(f"worker {where}")
            m.concurrency = 1
        m.items_out += n
        m.chunks_out += 1
        m.t_calls += compute
        self.ctx.meter.t_calls += round_trip
        self.overhead.t_calls += max(0.0, round_trip - compute)
        self.overhead.items_out += n


def _split_error(e: BaseException, indexes: list[int], address: str) -> BaseException:
    """A failed split: the user's exception as itself; the cluster's as a StageError."""
    from distributed import KilledWorker

    index = f"{indexes[0]}" if len(indexes) == 1 else f"{indexes[0]}..{indexes[-1]}"

    if isinstance(e, KilledWorker):
        return StageError(
            f"distribute: split(s) {index} were lost with a dying worker too many times"
            f" (distributed.scheduler.allowed-failures): {e}"
        )
    if isinstance(e, FutureCancelled | asyncio.CancelledError | OSError | TimeoutError):
        return StageError(
            f"distribute: lost the Dask cluster at {address} while split(s) {index} were"
            f" running ({type(e).__name__}: {e})"
        )
    e.add_note(f"aioflow: in split(s) {index} of distribute, on the Dask cluster at {address}")
    return e


async def _connect(client: Any) -> tuple[Any, str]:
    """A client of this run's own, on its loop, to the scheduler of ``client``."""
    from distributed import Client

    address = getattr(client.scheduler, "address", None)
    if address is None:
        raise StageError("distribute: the Dask client is closed")
    try:
        dask = await Client(
            address, asynchronous=True, security=client.security, set_as_default=False
        )
    except (OSError, TimeoutError) as e:
        raise StageError(f"distribute: cannot reach the Dask scheduler at {address}: {e}") from e
    return dask, address


async def _window(dask: Any, consumers: int) -> int:
    """How many tasks a consumer keeps submitted or unread: two per worker thread, shared
    among the consumers."""
    threads = sum((await dask.nthreads()).values())
    return max(2, -(-2 * threads // consumers))


async def _read_splits(
    ctx: Ctx,
    client: Any,
    job: bytes,
    splits: Any,
    mine: Sequence[int],
    budget: int | None,
    consumers: int,
) -> ChunkIter:
    epoch = ctx.open_index
    meters = _Meters(ctx)
    dask, address = await _connect(client)
    running: dict[asyncio.Future[Any], tuple[list[int], float, Any]] = {}
    try:
        window = await _window(dask, consumers)
        ctx.meter.concurrency = meters.overhead.concurrency = window
        sizer = Sizer(window, budget)
        sent = 0  # of `mine`, the splits submitted so far
        step = chunk_of(budget, CHUNK_MAX)

        def fill(held: int = 0) -> None:
            nonlocal sent
            while len(running) < window:
                in_flight = sum(len(r[0]) for r in running.values())  # not yet read
                k = sizer.size(len(mine) - sent, in_flight, held)
                idx = list(mine[sent : sent + k])
                if not idx:
                    return
                sent += len(idx)
                parts = [splits.split(epoch, i) for i in idx]
                draw = (epoch << 32) + idx[0]  # per epoch and task (see run_split)
                fut = dask.submit(run_split, job, parts, draw, pure=False)
                task = ctx.run.start(_result(fut), "distribute read")
                running[task] = (idx, perf_counter(), fut)

        fill()
        while running:
            done, _ = await asyncio.wait(running, return_when=asyncio.FIRST_COMPLETED)
            for t in done:
                idx, t0, _fut = running.pop(t)
                try:
                    items, compute, where = t.result()
                except BaseException as e:
                    if isinstance(e, asyncio.CancelledError) and cancelling():
                        raise
                    err = _split_error(e, idx, address)
                    raise err from (None if err is e else e)
                sizer.done(len(idx), len(items), compute)
                meters.split_done(where, len(items), compute, perf_counter() - t0)
                if budget is None:  # (with one: what is read and not yet handed on counts)
                    fill()
                for k in range(0, len(items), step):
                    fill(len(items) - k)
                    yield items[k : k + step]
                fill()
    finally:
        for t in running:
            t.cancel()
        await _close(ctx, dask, set(running))


async def _close(ctx: Ctx, dask: Any, running: set[asyncio.Future[Any]]) -> None:
    """Wait for the (cancelled) task readers, then close the run's client; also through
    repeated cancellation (a run closing cancels its tasks from several sides): a client
    left open would keep its sockets for good."""

    async def close() -> None:
        if running:
            await asyncio.wait(running)
        for t in running:
            if not t.cancelled():
                t.exception()
        await asyncio.wait_for(dask.close(), 10)

    closing = ctx.run.start(close(), "distribute close", cancel=False)
    cancelled = False
    while not closing.done():
        try:
            await asyncio.shield(closing)
        except asyncio.CancelledError:
            cancelled = True
        except Exception:  # the cluster is gone: nothing left to release
            break
    if not closing.cancelled():
        closing.exception()
    if cancelled:
        raise asyncio.CancelledError


async def _result(fut: Any) -> Any:
    return await fut


def build_distribute(
    upstream: Pipeline[Any],
    client: Any,
    num_consumers: int | None,
    consumer_index: int | None,
    max_outstanding: int | None,
) -> Node:
    """The node of ``Pipeline.distribute`` (checks its arguments now, not when it runs)."""
    if not hasattr(client, "scheduler") or not hasattr(client, "submit"):
        raise PipelineError(f"distribute needs a distributed.Client, got {type(client).__name__}")
    if num_consumers is None or consumer_index is None:
        env_n, env_i = shard_from_env()
        num_consumers = env_n if num_consumers is None else num_consumers
        consumer_index = env_i if consumer_index is None else consumer_index
    if not 0 <= consumer_index < num_consumers:
        raise PipelineError(
            f"distribute needs 0 <= consumer_index < num_consumers,"
            f" got {consumer_index} and {num_consumers}"
        )
    if max_outstanding is not None and max_outstanding < 1:
        raise PipelineError(f"max_outstanding must be >= 1, got {max_outstanding}")
    leaf = _leaf(upstream)
    splits = leaf.hints.splits
    if max_outstanding is not None and hasattr(splits, "resized"):
        # splits small enough to make no more than max_outstanding elements each, as far
        # as the stages tell (batch(n): n items an element); a file stays one split
        per = math.prod(node.mult for node in graph_nodes(upstream) if node is not leaf)
        splits = splits.resized(max_outstanding * per)
    n, i = num_consumers, consumer_index
    job = job_of(upstream, leaf)

    def build(ctx: Ctx, inputs: Sequence[Opener]) -> ChunkIter:
        mine = range(i, splits.count(ctx.open_index), n)
        return _read_splits(ctx, client, job, splits, mine, max_outstanding, n)

    return Node(
        "distribute",
        build,
        card=lambda _: UNKNOWN_CARD,
        task=True,
        key=(n, i, max_outstanding),
        ranked=n > 1,
        # with max_outstanding, its channel holds one chunk (of chunk_of elements), and
        # so does every hand-off after it (DOWNSTREAM_CHUNKS)
        hints=Hints(chunks=1, lead=True) if max_outstanding is not None else NO_HINTS,
    )
