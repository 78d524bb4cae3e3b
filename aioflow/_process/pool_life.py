"""How a process pool lives between runs, how it dies, and what a fork does to it.

A run checks a stage's idle pool out (``checkout``) and gives it back at its end
(``release``): the pool is then kept, warm and idle, for the next run of the same node
(DataLoader's ``persistent_workers``), unless it is broken, was retired by
``Pipeline.close()``, the node is gone, the interpreter is exiting, or the node already
has an idle pool; then it is closed. An idle pool is closed by ``Pipeline.close()``
(``close_nodes_pools``), by a ``weakref.finalize`` on its node (the pipeline became
unreachable), and at interpreter exit (``atexit``).

When the user's program forks (``os.fork``, multiprocessing's fork), the child gets a
copy of every pool: its descriptors of the parent's worker sockets, and objects naming
the parent's workers. ``os.register_at_fork`` makes the child ``forget`` them at once:
it closes its copies of the descriptors (so it never holds a worker's socket open), and
its pools are closed without touching the workers (never shut down, killed or waited
for) or the loop (whose epoll set is the parent's too); its pipelines then start pools
of their own. A pool also knows the pid it was made in: a copy in a process forked
without the hook (``fork`` called from C) is forgotten, never closed, as well.

Functions are shipped by value (``ship_by_value``): a top-level module of the user's own
(a script, a test module) is pickled by value too, so that workers need not import it.
"""

from __future__ import annotations

import atexit
import os
import site
import sys
import sysconfig
import threading
import weakref
from collections.abc import Callable
from functools import partial
from types import ModuleType
from typing import TYPE_CHECKING, Any

import cloudpickle

from aioflow._core.check import fn_name
from aioflow._process.ship import ship
from aioflow.errors import PipelineError

if TYPE_CHECKING:
    from aioflow._core.graph import Described, Node
    from aioflow._process.pool import ProcessPool

__all__ = [
    "checkout",
    "close_nodes_pools",
    "forget",
    "park",
    "release",
    "ship_by_value",
    "track",
    "wants_pool",
]

_lock = threading.Lock()
_idle: weakref.WeakKeyDictionary[Node, ProcessPool] = weakref.WeakKeyDictionary()
_live: weakref.WeakSet[ProcessPool] = weakref.WeakSet()  # every pool not yet closed
_exiting = False


def checkout(node: Node, config: tuple[Any, ...]) -> ProcessPool | None:
    """The node's idle pool, if it has a healthy one made for ``config``."""
    with _lock:
        pool = _idle.pop(node, None)
        if pool is not None:
            pool.finalizer.detach()
            pool.finalizer = None
    if pool is None:
        return None
    if pool.config != config or not pool.healthy():
        pool.close_now()
        return None
    return pool


def track(pool: ProcessPool) -> None:
    with _lock:
        _live.add(pool)


async def release(pool: ProcessPool) -> None:
    """At the end of a run: detach the pool, and keep it warm for its node or close it."""
    await pool.release()
    if not park(pool):
        with _lock:
            _live.discard(pool)
        await pool.aclose()


def park(pool: ProcessPool) -> bool:
    """Keep ``pool`` warm and idle for its node; False if it cannot be (close it then)."""
    node = pool.node() if pool.node is not None else None
    if node is not None and not _exiting and pool.healthy():
        with _lock:
            if node not in _idle:
                _idle[node] = pool
                pool.finalizer = weakref.finalize(node, _close_idle, weakref.ref(pool))
                return True
    return False


def wants_pool(node: Node) -> bool:
    """Whether ``node`` has neither an idle pool nor one in use (a run may start one)."""
    with _lock:
        if node in _idle:
            return False
        return not any(p.node is not None and p.node() is node for p in _live)


def _close_idle(ref: weakref.ref[ProcessPool]) -> None:
    pool = ref()
    if pool is not None:
        with _lock:
            _live.discard(pool)
        pool.close_now()


def close_nodes_pools(pipeline: Described) -> None:
    """``Pipeline.close()``: close the idle pools of its stages, retire those in use."""
    nodes: list[Node] = []
    seen: set[int] = set()
    stack = [pipeline]
    while stack:
        node = stack.pop()._node
        if id(node) not in seen:
            seen.add(id(node))
            nodes.append(node)
            stack.extend(node.inputs)
    idle = []
    with _lock:
        for node in nodes:
            pool = _idle.pop(node, None)
            if pool is not None:
                pool.finalizer.detach()
                idle.append(pool)
        for pool in list(_live):
            if pool.node is not None and pool.node() in nodes and pool not in idle:
                pool.retired = True  # closed when its run releases it
    for pool in idle:
        _close_idle(weakref.ref(pool))


@atexit.register
def _at_exit() -> None:
    global _exiting
    _exiting = True
    with _lock:
        idle = list(_idle.values())
        _idle.clear()
    for pool in idle:
        if pool.finalizer is not None:
            pool.finalizer.detach()
        _close_idle(weakref.ref(pool))


# -- a fork of the user's program ----------------------------------------------------
def forget(pool: ProcessPool) -> None:
    """Drop a forked child's copy of a parent's pool: its descriptors, not the workers."""
    pool.closed = True
    for t in pool.pending:  # (their futures are the parent's loop's: left as they are)
        t.drop()
    pool.pending.clear()
    for w in pool.workers:
        w.forget()
    pool.workers.clear()
    pool.graveyard.clear()
    pool.loop = None


def _after_fork_in_child() -> None:
    global _lock, _ship_lock
    _lock = threading.Lock()  # (another thread of the parent may have held them)
    _ship_lock = threading.Lock()
    pools = list(_live)
    idle = list(_idle.values())
    _live.clear()
    _idle.clear()
    for pool in idle:
        if pool.finalizer is not None:
            pool.finalizer.detach()  # (else the child's exit would close it)
            pool.finalizer = None
    for pool in pools:
        forget(pool)


os.register_at_fork(after_in_child=_after_fork_in_child)


# -- shipping functions by value ------------------------------------------------------
_ship_lock = threading.Lock()


def ship_by_value(fn: Callable[..., Any], stage: str) -> bytes:
    """Cloudpickle ``fn`` for a worker, or raise a ``PipelineError`` naming it."""
    mod = _user_module(fn)
    try:
        with _ship_lock:
            if mod is not None:
                cloudpickle.register_pickle_by_value(mod)
            try:
                return ship(fn)
            finally:
                if mod is not None:
                    cloudpickle.unregister_pickle_by_value(mod)
    except Exception as e:
        name = getattr(fn, "__qualname__", None) or fn_name(fn)
        raise PipelineError(
            f"stage {stage!r}: the function {name!r} cannot be sent to a worker process"
            f" (executor='process' pickles it with cloudpickle, by value): {e!r}. Make"
            " what it refers to picklable (open files, locks, sockets or clients inside"
            " the function, or in a class whose __reduce__ reopens them), or run it"
            " with executor='thread'."
        ) from e


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
