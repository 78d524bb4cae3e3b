"""The ``Pipeline`` methods of the operators that take one item at a time.

``map``, ``filter``, ``flat_map``, ``scan``, ``enumerate``, ``pipe`` (``transforms``),
``take``, ``skip``, ``repeat``, ``shard``, ``prefetch`` (``slicing``), ``interleave``
(``interleave``), and ``apply``. Each method is its docstring and one line: the
operator's node is made by its family module's ``*_node`` function.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from concurrent.futures import Executor
from typing import TYPE_CHECKING, Any, Generic, TypeVar, overload

from aioflow._core.base import PipelineBase
from aioflow._core.check import fn_name
from aioflow.errors import PipelineError
from aioflow.ops import interleave as _il
from aioflow.ops import slicing as _sl
from aioflow.ops import transforms as _t

if TYPE_CHECKING:
    from aioflow.pipeline import Pipeline

T = TypeVar("T")
U = TypeVar("U")

__all__ = ["ItemMethods", "OnError"]

OnError = str | int


class ItemMethods(PipelineBase, Generic[T]):
    """``Pipeline``'s methods of per-item operators (see ``pipeline.Pipeline``)."""

    __slots__ = ()

    @overload
    def map(
        self,
        fn: Callable[[T], Awaitable[U]],
        *,
        concurrency: int = 1,
        executor: str | Executor | None = None,
        ordered: bool = True,
        on_error: OnError = "raise",
        timeout: float | None = None,
    ) -> Pipeline[U]: ...

    @overload
    def map(
        self,
        fn: Callable[[T], U],
        *,
        concurrency: int = 1,
        executor: str | Executor | None = None,
        ordered: bool = True,
        on_error: OnError = "raise",
        timeout: float | None = None,
    ) -> Pipeline[U]: ...

    def map(
        self,
        fn: Callable[[T], Any],
        *,
        concurrency: int = 1,
        executor: str | Executor | None = None,
        ordered: bool = True,
        on_error: OnError = "raise",
        timeout: float | None = None,
    ) -> Pipeline[Any]:
        """Apply ``fn`` to every item.

        ``fn`` may be sync or ``async``. With ``executor=None`` a sync ``fn`` runs inline
        on the loop and an async one as up to ``concurrency`` tasks; ``"thread"`` runs it
        in a pool the run owns, ``"process"`` in ``concurrency`` worker processes the
        pipeline owns: warm from one epoch to the next (DataLoader's
        ``persistent_workers``) until ``p.close()``, leaving ``with p:``, ``p`` becoming
        unreachable or interpreter exit (``fn`` is shipped by value; workers never run
        your ``__main__``: items and results may be anything that pickles, and instances
        of classes a worker cannot import, of ``__main__``, a notebook cell, a function
        or a module loaded from outside ``sys.path``, nested anywhere, travel by value
        too; plain ones keep the plain pickle). Any ``concurrent.futures.Executor``
        instance works too (a Dask ``client.get_executor()`` included): it belongs to
        the caller, who keeps it warm across epochs and closes it (aioflow never shuts
        it down).
        ``ordered=False`` yields results in completion order. ``on_error`` is
        ``"raise"``, ``"skip"`` or an int max_failures; ``timeout`` bounds one call.
        Memory: at most ``concurrency`` calls in flight. On cancellation every call in
        flight is cancelled and awaited.

        Example:
            >>> import asyncio, aioflow as af
            >>> async def slow_double(x):
            ...     await asyncio.sleep(0.01)
            ...     return 2 * x
            >>> af.range(5).map(slow_double, concurrency=5).to_list()
            [0, 2, 4, 6, 8]
        """
        return self._add(
            _t.map_node,
            fn,
            concurrency=concurrency,
            executor=executor,
            ordered=ordered,
            on_error=on_error,
            timeout=timeout,
        )

    def filter(
        self,
        pred: Callable[[T], Any],
        *,
        concurrency: int = 1,
        executor: str | Executor | None = None,
        ordered: bool = True,
        on_error: OnError = "raise",
        timeout: float | None = None,
    ) -> Pipeline[T]:
        """Keep the items for which ``pred(x)`` is true (sync or ``async`` ``pred``).

        Takes the same keyword options as ``map``. On record batches
        (``pyarrow.RecordBatch``, dicts of numpy arrays), a ``pred`` that returns a row mask
        (a numpy bool array or a pyarrow boolean array of the batch's length; nulls are
        false) keeps the rows where it is true: ``filter(lambda b: b["price"] > 0)`` on
        dicts, ``pc.greater(b["price"], 0)`` on Arrow; a batch left with no row goes.

        Example:
            >>> import aioflow as af
            >>> af.range(6).filter(lambda x: x % 3 == 0).to_list()
            [0, 3]
        """
        return self._add(
            _t.map_node,
            pred,
            concurrency=concurrency,
            executor=executor,
            ordered=ordered,
            on_error=on_error,
            timeout=timeout,
            keep=True,
        )

    def flat_map(self, fn: Callable[[T], Any]) -> Pipeline[Any]:
        """Replace every item by the items of ``fn(item)``.

        ``fn`` returns an iterable, an async iterable or a ``Pipeline``; they are read
        one after another, in order.

        Example:
            >>> import aioflow as af
            >>> af.range(3).flat_map(lambda n: [n] * n).to_list()
            [1, 2, 2]
        """
        return self._add(_t.flat_map_node, fn)

    def scan(self, initial_state: Any, fn: Callable[[Any, T], tuple[Any, U]]) -> Pipeline[U]:
        """Carry a state through the stream: ``fn(state, x) -> (state, y)`` yields ``y``.

        Example:
            >>> import aioflow as af
            >>> af.range(5).scan(0, lambda s, x: (s + x, s + x)).to_list()
            [0, 1, 3, 6, 10]
        """
        return self._add(_t.scan_node, initial_state, fn)

    def enumerate(self, start: int = 0) -> Pipeline[tuple[int, T]]:
        """Pairs ``(i, item)`` counting from ``start``.

        Example:
            >>> import aioflow as af
            >>> af.from_iterable("ab").enumerate(start=1).to_list()
            [(1, 'a'), (2, 'b')]
        """
        return self._add(_t.enumerate_node, start)

    def take(self, n: int) -> Pipeline[T]:
        """The first ``n`` items (all of them when ``n`` is -1); stops the upstream early.

        Example:
            >>> import aioflow as af
            >>> af.range(100).take(3).to_list()
            [0, 1, 2]
        """
        return self._add(_sl.take_node, n)

    def skip(self, n: int) -> Pipeline[T]:
        """Everything after the first ``n`` items (nothing when ``n`` is -1).

        Example:
            >>> import aioflow as af
            >>> af.range(5).skip(3).to_list()
            [3, 4]
        """
        return self._add(_sl.skip_node, n)

    def repeat(self, count: int | None = None) -> Pipeline[T]:
        """Run the upstream ``count`` times (forever when ``None`` or -1), each a new epoch.

        Example:
            >>> import aioflow as af
            >>> af.range(2).repeat(3).to_list()
            [0, 1, 0, 1, 0, 1]
        """
        return self._add(_sl.repeat_node, count)

    def shard(self, num_shards: int, index: int) -> Pipeline[T]:
        """Every ``num_shards``-th item starting at ``index`` (see ``af.shard_from_env()``).

        Example:
            >>> import aioflow as af
            >>> af.range(10).shard(3, 1).to_list()
            [1, 4, 7]
        """
        return self._add(_sl.shard_node, num_shards, index)

    def prefetch(self, n: int) -> Pipeline[T]:
        """A background task keeps up to ``n`` items ready.

        The stages before it run ahead of the consumer in a task of their own.
        Memory: at most ``n`` items wait in its buffer. ``prefetch(0)`` does nothing.
        With ``af.AUTOTUNE`` the buffer starts at one chunk and doubles whenever the
        consumer finds it empty after the producer had found it full (the two run in
        bursts), up to 4,096 items; the size in use is the queue capacity in the stats.

        Example:
            >>> import aioflow as af
            >>> af.range(5).prefetch(2).to_list()
            [0, 1, 2, 3, 4]
        """
        return self._add(_sl.prefetch_node, n)

    def pipe(self, stage: Callable[[AsyncIterator[T]], AsyncIterator[U]]) -> Pipeline[U]:
        """Insert your own stage: an async generator function over the items.

        Example:
            >>> import aioflow as af
            >>> async def pairs(items):
            ...     prev = None
            ...     async for x in items:
            ...         if prev is not None:
            ...             yield (prev, x)
            ...         prev = x
            >>> af.range(4).pipe(pairs).to_list()
            [(0, 1), (1, 2), (2, 3)]
        """
        return self._add(_t.pipe_node, stage)

    def apply(self, fn: Callable[[Pipeline[T]], Pipeline[U]]) -> Pipeline[U]:
        """``fn(self)``: package a reusable chain of operators.

        Example:
            >>> import aioflow as af
            >>> def evens_squared(p):
            ...     return p.filter(lambda x: x % 2 == 0).map(lambda x: x * x)
            >>> af.range(5).apply(evens_squared).to_list()
            [0, 4, 16]
        """
        out = fn(self._pipeline())
        if not isinstance(out, PipelineBase):
            raise PipelineError(
                f"apply: {fn_name(fn)} returned {type(out).__name__}, not a Pipeline"
            )
        return out

    # -- interleave --------------------------------------------------------------------
    def interleave(
        self,
        fn: Callable[[T], Pipeline[U]],
        *,
        cycle_length: int,
        block_length: int = 1,
        concurrency: int | None = None,
        ordered: bool = True,
    ) -> Pipeline[U]:
        """The items of the sub-pipelines ``fn(x)``, interleaved as tf.data does.

        ``cycle_length`` sub-pipelines are open at once; ``block_length`` items are taken
        from each in turn, and one that ends is replaced by the next input's sub-pipeline
        (tf.data's exact order). With ``concurrency``, each open sub-pipeline runs in a
        task of its own and is read ahead into a bounded buffer (``concurrency`` of them
        at once, at least ``cycle_length``: the extra ones are the next inputs, opened
        early); ``ordered=False`` then yields whatever sub-pipeline is ready first.
        Memory: a chunk at hand per open sub-pipeline, plus its buffer with
        ``concurrency``. On cancellation every open sub-pipeline is closed.

        Example:
            >>> import aioflow as af
            >>> p = af.range(1, 4).interleave(
            ...     lambda x: af.from_iterable([x] * 3), cycle_length=2, block_length=2)
            >>> p.to_list()
            [1, 1, 2, 2, 1, 2, 3, 3, 3]
        """
        return self._add(_il.interleave_node, fn, cycle_length, block_length, concurrency, ordered)
