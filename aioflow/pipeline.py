"""The fluent ``Pipeline``: a lazy, immutable, re-iterable description of a data stream.

Every method returns a new ``Pipeline`` that points at the one it was called on; nothing
runs until it is iterated. Each iteration is a fresh run (see ``_runtime.Run``). The
methods here are one line each: the operators themselves live in their family modules
(``transforms``, ``batching``, ``combine``, ...).
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from concurrent.futures import Executor
from typing import Any, Generic, TypeVar, overload

from . import _logs
from . import _state as _st
from . import batching as _b
from . import transforms as _t
from ._autotune import AUTOTUNE, resolve_concurrency
from ._calls import fn_name
from ._iterators import AsyncPipelineIterator, PipelineIterator
from ._runtime import CHANNEL_ITEMS, CHUNK_MAX, INFINITE_CARD, UNKNOWN_CARD, Node
from .errors import PipelineError

T = TypeVar("T")
U = TypeVar("U")

__all__ = ["INFINITE", "UNKNOWN", "Pipeline"]

#: ``cardinality()`` of a pipeline that never ends (``repeat()``).
INFINITE = INFINITE_CARD
#: ``cardinality()`` of a pipeline whose length cannot be known without running it.
UNKNOWN = UNKNOWN_CARD

OnError = str | int


def _check_int(name: str, v: Any, lo: int | None = None) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or (lo is not None and v < lo):
        want = "an int" if lo is None else f"an int >= {lo}"
        raise PipelineError(f"{name} must be {want}, got {v!r}")
    return v


class Pipeline(Generic[T]):
    """A lazy, immutable, re-iterable description of a stream of items.

    Iterate it with ``for`` (a sync adapter runs it on a background event loop) or
    ``async for`` (it runs on the caller's loop); each iteration is a new epoch.

    Example:
        >>> import aioflow as af
        >>> p = af.range(10).filter(lambda x: x % 2 == 0).map(lambda x: x * x).batch(2)
        >>> [b.tolist() for b in p]
        [[0, 4], [16, 36], [64]]
    """

    __slots__ = ("_node",)

    def __init__(self, node: Node) -> None:
        self._node = node

    def _then(self, name: str, build: Any, **kw: Any) -> Pipeline[Any]:
        return Pipeline(Node(name, build, inputs=(self,), **kw))

    def __repr__(self) -> str:
        names = []
        p: Pipeline[Any] | None = self
        while p is not None:
            names.append(p._node.name)
            p = p._node.inputs[0] if len(p._node.inputs) == 1 else None
        return f"<Pipeline {' -> '.join(reversed(names))}>"

    # -- per-item transforms ------------------------------------------------------------
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
        in a pool the run owns, ``"process"`` in ``concurrency`` worker processes that
        stay warm across this pipeline's runs until ``close()`` (``fn`` is shipped by
        value; workers never run your ``__main__``), and any
        ``concurrent.futures.Executor`` (the caller's, kept open) works too.
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
        return self._call_stage("map", fn, False, concurrency, executor, ordered, on_error, timeout)

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

        Takes the same keyword options as ``map``.

        Example:
            >>> import aioflow as af
            >>> af.range(6).filter(lambda x: x % 3 == 0).to_list()
            [0, 3]
        """
        return self._call_stage(
            "filter",
            pred,
            True,
            concurrency,
            executor,
            ordered,
            on_error,
            timeout,
            card=lambda cs: UNKNOWN_CARD if cs[0] != INFINITE_CARD else INFINITE_CARD,
        )

    def _call_stage(
        self,
        what: str,
        fn: Callable[[Any], Any],
        keep: bool,
        concurrency: int,
        executor: str | Executor | None,
        ordered: bool,
        on_error: OnError,
        timeout: float | None,
        **kw: Any,
    ) -> Pipeline[Any]:
        """The node of ``map`` (``keep=False``) or ``filter`` (``keep=True``)."""
        build = _t.build_map(
            fn,
            concurrency=concurrency,
            executor=executor,
            ordered=ordered,
            on_error=on_error,
            timeout=timeout,
            keep=keep,
        )
        task = concurrency != 1 or executor is not None or timeout is not None
        resume = _st.call_resume(keep, ordered, on_error)
        if resume is None and not task:  # inline: each input chunk maps to its output
            build, resume = _logs.chunkwise(build), _st.LOGGED
        return self._then(
            f"{what}({fn_name(fn)})",
            build,
            task=task,
            holds=2 * resolve_concurrency(concurrency, executor) + CHUNK_MAX,
            key=(fn, concurrency, executor if isinstance(executor, str) else None, ordered),
            resume=resume,
            **kw,
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
        return self._then(
            f"flat_map({fn_name(fn)})",
            _t.build_flat_map(fn),
            card=lambda _: UNKNOWN_CARD,
            key=(fn,),
            resume=_st.LOGGED,
        )

    def scan(self, initial_state: Any, fn: Callable[[Any, T], tuple[Any, U]]) -> Pipeline[U]:
        """Carry a state through the stream: ``fn(state, x) -> (state, y)`` yields ``y``.

        Example:
            >>> import aioflow as af
            >>> af.range(5).scan(0, lambda s, x: (s + x, s + x)).to_list()
            [0, 1, 3, 6, 10]
        """
        return self._then(f"scan({fn_name(fn)})", _t.build_scan(initial_state, fn), key=(fn,))

    def enumerate(self, start: int = 0) -> Pipeline[tuple[int, T]]:
        """Pairs ``(i, item)`` counting from ``start``.

        Example:
            >>> import aioflow as af
            >>> af.from_iterable("ab").enumerate(start=1).to_list()
            [(1, 'a'), (2, 'b')]
        """
        _check_int("start", start)
        return self._then(
            "enumerate",
            lambda ctx, ins: _t.enumerate_chunks(ins[0](), _st.resumed(ctx.resume, "next", start)),
            key=(start,),
            resume=_st.counting(start),
        )

    def take(self, n: int) -> Pipeline[T]:
        """The first ``n`` items (all of them when ``n`` is -1); stops the upstream early.

        Example:
            >>> import aioflow as af
            >>> af.range(100).take(3).to_list()
            [0, 1, 2]
        """
        _check_int("take count", n, -1)
        return self._then(
            "take", _t.build_take(n), card=_t.card_take(n), key=(n,), resume=_st.taking(n)
        )

    def skip(self, n: int) -> Pipeline[T]:
        """Everything after the first ``n`` items (nothing when ``n`` is -1).

        Example:
            >>> import aioflow as af
            >>> af.range(5).skip(3).to_list()
            [3, 4]
        """
        _check_int("skip count", n, -1)
        return self._then(
            "skip",
            lambda ctx, ins: _t.skip_chunks(ins[0](), _st.resumed(ctx.resume, "left", n)),
            card=_t.card_skip(n),
            key=(n,),
            resume=_st.skipping(n),
        )

    def repeat(self, count: int | None = None) -> Pipeline[T]:
        """Run the upstream ``count`` times (forever when ``None`` or -1), each a new epoch.

        Example:
            >>> import aioflow as af
            >>> af.range(2).repeat(3).to_list()
            [0, 1, 0, 1, 0, 1]
        """
        if count is not None:
            _check_int("repeat count", count, -1)
        return self._then(
            "repeat",
            _t.build_repeat(count),
            card=_t.card_repeat(count),
            key=(count,),
            resume=_st.LOGGED,
        )

    def shard(self, num_shards: int, index: int) -> Pipeline[T]:
        """Every ``num_shards``-th item starting at ``index`` (see ``af.shard_from_env()``).

        Example:
            >>> import aioflow as af
            >>> af.range(10).shard(3, 1).to_list()
            [1, 4, 7]
        """
        _check_int("num_shards", num_shards, 1)
        _check_int("index", index, 0)
        if index >= num_shards:
            raise PipelineError(f"shard index must be < num_shards ({num_shards}), got {index}")
        return self._then(
            "shard",
            _t.build_shard(num_shards, index),
            card=_t.card_shard(num_shards, index),
            key=(num_shards, index),
        )

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
        size = _t.prefetch_size(n)
        if size == 0:
            return self
        auto = n == AUTOTUNE
        return self._then(
            "prefetch(AUTOTUNE)" if auto else f"prefetch({size})",
            _t.build_prefetch(CHUNK_MAX if auto else size),
            task=True,
            chunks=1 if auto else size,
            items=CHUNK_MAX if auto else size,
            grow_to=size if auto else 0,
            key=(n,),
            resume=_st.one_to_one,
        )

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
        return self._then(
            f"pipe({fn_name(stage)})",
            _t.build_pipe(stage),
            card=lambda _: UNKNOWN_CARD,
            key=(stage,),
        )

    def apply(self, fn: Callable[[Pipeline[T]], Pipeline[U]]) -> Pipeline[U]:
        """``fn(self)``: package a reusable chain of operators.

        Example:
            >>> import aioflow as af
            >>> def evens_squared(p):
            ...     return p.filter(lambda x: x % 2 == 0).map(lambda x: x * x)
            >>> af.range(5).apply(evens_squared).to_list()
            [0, 4, 16]
        """
        out = fn(self)
        if not isinstance(out, Pipeline):
            raise PipelineError(
                f"apply: {fn_name(fn)} returned {type(out).__name__}, not a Pipeline"
            )
        return out

    # -- batching -----------------------------------------------------------------------
    def batch(
        self, size: int, *, drop_remainder: bool = False, collate: Any = None
    ) -> Pipeline[Any]:
        """Group ``size`` consecutive items into a batch.

        The default collate stacks numpy arrays and numbers into arrays and recurses into
        dicts, tuples and lists; ``collate=list`` keeps plain lists, and any callable
        ``collate(items) -> batch`` works. The last, short batch is kept unless
        ``drop_remainder``. Memory: one batch being built.

        Example:
            >>> import aioflow as af
            >>> [b.tolist() for b in af.range(5).batch(2)]
            [[0, 1], [2, 3], [4]]
            >>> af.range(5).batch(2, drop_remainder=True, collate=list).to_list()
            [[0, 1], [2, 3]]
        """
        return self._then(
            f"batch({size})",
            _b.build_batch(size, drop_remainder, collate),
            card=_b.card_batch(size, drop_remainder),
            holds=size,
            mult=size,
            key=(size, drop_remainder, collate),
            resume=_st.per_batch(size),
        )

    def unbatch(self) -> Pipeline[Any]:
        """Split batches back into their items (arrays by rows, dicts and tuples by field).

        Example:
            >>> import aioflow as af
            >>> af.range(5).batch(2).unbatch().map(int).to_list()
            [0, 1, 2, 3, 4]
        """
        return self._then(
            "unbatch",
            _logs.chunkwise(_b.build_unbatch()),
            card=lambda _: UNKNOWN_CARD,
            resume=_st.LOGGED,
        )

    def rebatch(self, size: int, *, drop_remainder: bool = False) -> Pipeline[Any]:
        """Cut the stream of batches into batches of ``size`` items.

        Example:
            >>> import aioflow as af
            >>> [b.tolist() for b in af.range(7).batch(3).rebatch(2)]
            [[0, 1], [2, 3], [4, 5], [6]]
        """
        return self._then(
            f"rebatch({size})",
            _b.build_rebatch(size, drop_remainder),
            card=lambda _: UNKNOWN_CARD,
            holds=size,
            mult=size,
            key=(size, drop_remainder),
        )

    def window(
        self, size: int, *, shift: int | None = None, drop_remainder: bool = False
    ) -> Pipeline[list[T]]:
        """Lists of ``size`` consecutive items, a new one every ``shift`` items (default: size).

        As in tf.data, the trailing windows are shorter unless ``drop_remainder``.

        Example:
            >>> import aioflow as af
            >>> af.range(7).window(3, shift=2).to_list()
            [[0, 1, 2], [2, 3, 4], [4, 5, 6], [6]]
        """
        return self._then(
            f"window({size})",
            _b.build_window(size, shift, drop_remainder),
            card=_b.card_window(size, shift, drop_remainder),
            holds=size,
            mult=size,
            key=(size, shift, drop_remainder),
            resume=_st.per_batch(size if shift is None else shift),
        )

    # -- parallel: interleave (issue 3) ---------------------------------------------------
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
        from . import combine as _c

        build = _c.build_interleave(fn, cycle_length, block_length, concurrency, ordered)
        return self._then(
            f"interleave({fn_name(fn)})",
            build,
            card=lambda _: UNKNOWN_CARD,
            task=concurrency is not None,
            holds=_c.interleave_holds(cycle_length, concurrency),
            key=(fn, cycle_length, block_length, concurrency, ordered),
            resume=_st.LOGGED if ordered else _st.Refuse(_st.UNORDERED),
        )

    # -- ordering, grouping, sampling (issue 4) ------------------------------------------
    def shuffle(
        self, buffer_size: int, *, seed: int | None = None, reshuffle_each_iteration: bool = True
    ) -> Pipeline[T]:
        """Shuffle through a buffer of ``buffer_size`` items (tf.data's buffer shuffle).

        The buffer is filled first; then each new item takes the place of a random one,
        which comes out; at the end the buffer comes out in a random order. An item can
        only come out after it arrived, at most ``buffer_size - 1`` places early. The same
        ``seed`` and the same input give the same order; every epoch (a new iteration,
        ``repeat``) gets a new order derived from the seed unless
        ``reshuffle_each_iteration=False``; ``seed=None`` is a fresh order every time.
        Memory: the buffer.

        Example:
            >>> import aioflow as af
            >>> p = af.range(10).shuffle(4, seed=7)
            >>> p.to_list() == p.to_list(), sorted(p.to_list()) == list(range(10))
            (False, True)
            >>> q = af.range(10).shuffle(4, seed=7, reshuffle_each_iteration=False)
            >>> q.to_list() == q.to_list()
            True
        """
        from . import ordering as _o

        return self._then(
            f"shuffle({buffer_size})",
            _o.build_shuffle(buffer_size, seed, reshuffle_each_iteration),
            holds=buffer_size,
            key=(buffer_size, seed, reshuffle_each_iteration),
            resume=_st.LOGGED,
        )

    def sort_by(
        self,
        key: Callable[[T], Any],
        *,
        buffer_size: int | None = None,
        reverse: bool = False,
        max_in_memory: int = 1_000_000,
        spill_dir: str | None = None,
        on_late: str = "emit",
    ) -> Pipeline[T]:
        """Sort by ``key(item)``: a streaming sort through a buffer, or a full external sort.

        With ``buffer_size`` it is a heap of that many items: the output is exactly
        sorted whenever no item arrives more than ``buffer_size`` places after its
        sorted position (time-stamped events a little out of order), and memory stays
        the buffer; an error flushes the buffer, in order, before it is raised. An item
        that arrives later than that is *late*: its key sorts before the largest key
        already emitted (Flink's allowed lateness, counted in items). Late items are
        counted in the stats (``StageStats.late``) and ``on_late`` decides what happens
        to them: ``"emit"`` passes them on at once, out of order; ``"drop"`` leaves them
        out; ``"raise"`` raises ``af.LateItem`` at the first one. Without
        it the whole input is sorted, stably (equal keys keep their input order): up to
        ``max_in_memory`` items in memory, past that in sorted runs pickled to files in a
        temporary directory under ``spill_dir`` (default: the system's), k-way merged
        at the end. The directory is removed when the run ends, is stopped early or
        fails. Items and keys must pickle when the sort spills.

        Example:
            >>> import aioflow as af
            >>> af.from_iterable([1, 0, 2, 4, 3, 5]).sort_by(lambda x: x, buffer_size=1).to_list()
            [0, 1, 2, 3, 4, 5]
            >>> words = af.from_iterable(["bb", "a", "cc", "d"])
            >>> words.sort_by(len, reverse=True, max_in_memory=2).to_list()
            ['bb', 'cc', 'a', 'd']
        """
        from . import ordering as _o

        return self._then(
            "sort_by" if buffer_size is None else f"sort_by({buffer_size})",
            _o.build_sort_by(key, buffer_size, reverse, max_in_memory, spill_dir, on_late),
            holds=max_in_memory if buffer_size is None else buffer_size,
            key=(key, buffer_size, reverse, max_in_memory, on_late),
        )

    def group_by(
        self, key: Callable[[T], Any], *, size: int | None = None, max_keys: int | None = None
    ) -> Pipeline[tuple[Any, list[T]]]:
        """Groups ``(key, [items])`` of the items sharing ``key(item)``, in arrival order.

        A group comes out when it has ``size`` items; when a new key arrives while
        ``max_keys`` groups are open, the oldest open group (the one begun first) comes
        out to make room (counted in the stats as ``StageStats.evicted``); at the end
        the open groups come out in the order they began. Memory: ``size * max_keys``
        items when both are given, else unbounded.

        Example:
            >>> import aioflow as af
            >>> af.range(7).group_by(lambda x: x % 2, size=2).to_list()
            [(0, [0, 2]), (1, [1, 3]), (0, [4, 6]), (1, [5])]
        """
        from . import ordering as _o

        return self._then(
            "group_by",
            _o.build_group_by(key, size, max_keys),
            card=_o.card_unknown,
            holds=size * max_keys if size is not None and max_keys is not None else 0,
            mult=size or 1,
            key=(key, size, max_keys),
        )

    def partition_by(
        self,
        key: Callable[[T], Any],
        num_partitions: int,
        fn: Callable[[Pipeline[T]], Pipeline[U]],
    ) -> Pipeline[U]:
        """Keyed parallelism: ``fn`` runs on ``num_partitions`` partitions concurrently.

        Items with the same ``key(item)`` always go to the same partition, in their
        order (ints, strings, bytes and tuples of them by a fixed hash, see
        ``partition.partition_of``). ``fn(Pipeline) -> Pipeline`` (a ``scan`` keeping
        per-key state, an async enrichment ``map``) makes each partition's pipeline,
        which runs in a task of its own; the outputs are merged as they come. Memory:
        each partition's input waits in a channel of at most 512 items; a full one
        blocks the routing of the whole input (a slow partition slows the input, the
        others never buffer without bound). An error in a partition is raised as itself
        and stops the others; on cancellation or ``break`` every partition's task is
        cancelled and awaited.

        Example:
            >>> import asyncio, aioflow as af
            >>> async def enrich(x):
            ...     await asyncio.sleep(0.001)
            ...     return x * 10
            >>> p = af.range(8).partition_by(lambda x: x % 2, 2, lambda q: q.map(enrich))
            >>> sorted(p.to_list())
            [0, 10, 20, 30, 40, 50, 60, 70]
        """
        from . import ordering as _o
        from . import partition as _p

        return self._then(
            f"partition_by({num_partitions})",
            _p.build_partition_by(key, num_partitions, fn),
            card=_o.card_unknown,
            holds=num_partitions * (_p.INPUT_ITEMS + CHANNEL_ITEMS + CHUNK_MAX),
            key=(key, num_partitions, fn),
            resume=_st.Refuse("merges its partitions as they are ready: a replay would differ"),
        )

    def padded_batch(
        self, size: int, *, padding_value: Any = 0, drop_remainder: bool = False
    ) -> Pipeline[Any]:
        """Batches of ``size`` items, arrays padded to the batch's longest in every dimension.

        As tf.data's ``padded_batch`` (``padded_shapes=None``): numpy arrays and lists of
        numbers are padded with ``padding_value`` and stacked; dicts and tuples are
        padded field by field (``padding_value`` may be a dict/tuple of per-field
        values); numbers become arrays. Memory: one batch being built.

        Example:
            >>> import aioflow as af
            >>> p = af.from_iterable([[1], [2, 2], [3, 3, 3]]).padded_batch(2, padding_value=-1)
            >>> [b.tolist() for b in p]
            [[[1, -1], [2, 2]], [[3, 3, 3]]]
        """
        return self._then(
            f"padded_batch({size})",
            _b.build_padded_batch(size, padding_value, drop_remainder),
            card=_b.card_batch(size, drop_remainder),
            holds=size,
            mult=size,
            key=(size, padding_value, drop_remainder),
            resume=_st.per_batch(size),
        )

    def bucket_by_length(
        self,
        length_fn: Callable[[T], int],
        boundaries: list[int],
        batch_sizes: list[int],
        *,
        padding_value: Any = 0,
    ) -> Pipeline[Any]:
        """Padded batches of items of similar length (tf.data ``bucket_by_sequence_length``).

        ``length_fn(item)`` picks the bucket: lengths below ``boundaries[0]``, in
        ``[boundaries[0], boundaries[1])``, ..., from ``boundaries[-1]`` up;
        ``batch_sizes`` has one size per bucket (``len(boundaries) + 1``). A full bucket
        comes out as a ``padded_batch``; at the end the partial buckets come out, in
        bucket order. Memory: at most ``sum(batch_sizes)`` items.

        Example:
            >>> import aioflow as af
            >>> seqs = af.from_iterable([[1], [2, 2, 2], [3], [4, 4, 4, 4]])
            >>> [b.tolist() for b in seqs.bucket_by_length(len, [2], [2, 2])]
            [[[1], [3]], [[2, 2, 2, 0], [4, 4, 4, 4]]]
        """
        from . import ordering as _o

        return self._then(
            "bucket_by_length",
            _b.build_bucket_by_length(length_fn, boundaries, batch_sizes, padding_value),
            card=_o.card_unknown,
            holds=sum(batch_sizes),
            mult=max(batch_sizes, default=1),
            key=(length_fn, tuple(boundaries), tuple(batch_sizes), padding_value),
        )

    def rejection_resample(
        self,
        class_fn: Callable[[T], int],
        target_dist: list[float],
        *,
        initial_dist: list[float] | None = None,
        seed: int | None = None,
    ) -> Pipeline[T]:
        """Keep items at random so that their classes follow ``target_dist``.

        ``class_fn(item)`` is an int class in ``range(len(target_dist))``. An item of
        class ``c`` is kept with probability ``r[c] / max(r)``, ``r = target /
        initial``; ``initial_dist`` is estimated online from the classes seen so far
        when not given (as tf.data's ``rejection_resample``, which yields
        ``(class, item)`` pairs where this yields the items). The same ``seed`` gives the
        same choice; each epoch draws anew.

        Example:
            >>> import aioflow as af
            >>> p = af.range(1000).rejection_resample(
            ...     lambda x: int(x % 10 == 0), [0.5, 0.5], initial_dist=[0.9, 0.1], seed=0)
            >>> items = p.to_list()
            >>> 0.4 < sum(x % 10 == 0 for x in items) / len(items) < 0.6
            True
        """
        from . import ordering as _o
        from . import sampling as _s

        return self._then(
            f"rejection_resample({fn_name(class_fn)})",
            _s.build_rejection_resample(class_fn, target_dist, initial_dist, seed),
            card=_o.card_unknown,
            key=(
                class_fn,
                tuple(target_dist),
                None if initial_dist is None else tuple(initial_dist),
                seed,
            ),
            resume=_st.LOGGED,
        )

    # -- io and caching (issue 5) --------------------------------------------------------
    def cache(self, path: str | os.PathLike[str] | None = None) -> Pipeline[T]:
        """Record the first complete epoch; later epochs replay it instead of the upstream.

        ``path=None`` keeps the items in memory (shared, not copied), for every later
        iteration of this pipeline. With a ``path`` the first complete epoch is written to
        a file (pickled: numpy arrays and nested containers round-trip exactly) that any
        later run, in this process or another, reads instead of the upstream. An epoch cut
        short (break, error) records nothing; the file is renamed into place atomically
        only when the epoch completed, so two runs writing it at once never corrupt it.
        Memory (file cache): about 1 MiB of pending writes.

        Example:
            >>> import aioflow as af
            >>> calls = []
            >>> p = af.range(3).map(lambda x: calls.append(x) or x * 10).cache()
            >>> p.to_list(), p.to_list(), calls
            ([0, 10, 20], [0, 10, 20], [0, 1, 2])
        """
        from .cache import build_cache, cache_path

        where = cache_path(path)
        return self._then(
            "cache" if where is None else "cache(file)", build_cache(path), key=(where,)
        )

    # -- integrations (issue 8) --------------------------------------------------------
    def pin_memory(self) -> Pipeline[T]:
        """Copy every tensor of every item into page-locked memory, when CUDA exists.

        Pinned batches go to the GPU faster and asynchronously
        (``.to("cuda", non_blocking=True)``), as with ``DataLoader(pin_memory=True)``.
        Tensors in dicts, tuples and lists are pinned too; other values pass unchanged.
        The copies are made in a thread of the run, off the event loop. Without CUDA it
        returns the pipeline unchanged and logs a notice once per process. Memory: one
        item being pinned.

        Example:
            >>> import aioflow as af
            >>> p = af.range(4).batch(2, collate="torch").pin_memory()
            >>> [b.tolist() for b in p]
            [[0, 1], [2, 3]]
        """
        from .integrations.torch import pin_memory

        return pin_memory(self)

    # -- distribution (issue 15) ---------------------------------------------------------
    def distribute(
        self,
        client: Any,
        *,
        num_consumers: int | None = None,
        consumer_index: int | None = None,
        max_outstanding: int | None = None,
    ) -> Pipeline[T]:
        """Run everything before this on a Dask cluster; what follows runs here.

        ``client`` is a ``distributed.Client``. The source (``af.range``,
        ``af.list_files``) is cut into splits (sub-ranges, files) that the cluster's
        workers take on demand, each running the part before ``distribute`` over its
        split; a source that cannot be split is refused, naming it. Each item reaches
        exactly one consumer once per epoch, also when a worker dies (its unfinished
        splits are made again elsewhere; the items of a split arrive only once it is
        done). Consumers, one per training rank, share each epoch's splits: consumer
        ``consumer_index`` of ``num_consumers`` (both default from
        ``af.shard_from_env()``) gets a disjoint share. A Dask task takes as many
        splits as make ~0.2 s of work; its items arrive together, in completion order of
        the tasks, and a ``batch`` before ``distribute`` batches within a task. Memory:
        at most ``max_outstanding`` tasks (default: two per worker thread of the
        cluster, shared among the consumers) being made or waiting for this consumer.
        See ``docs/distributed.md``.

        Example:
            >>> import aioflow as af, distributed
            >>> with distributed.Client(n_workers=1, processes=False,
            ...                         dashboard_address=":0") as client:
            ...     sorted(af.range(10).map(lambda x: x * x).distribute(client))
            [0, 1, 4, 9, 16, 25, 36, 49, 64, 81]
        """
        from .distributed import build_distribute

        return Pipeline(
            build_distribute(self, client, num_consumers, consumer_index, max_outstanding)
        )

    # -- running ------------------------------------------------------------------------
    def iter(
        self, state: dict[str, Any] | None = None, timeout: float | None = None
    ) -> PipelineIterator[T]:
        """A sync iterator over a new run; ``with p.iter() as it:`` closes it for sure.

        ``state`` (from ``it.state_dict()``) resumes after the items already yielded;
        ``timeout`` bounds the wait for each item (``af.NextTimeout``, a TimeoutError).

        Example:
            >>> import aioflow as af
            >>> with af.range(3).iter() as it:
            ...     next(it), it.stats()["range"].items_out
            (0, 3)
        """
        return PipelineIterator(self, state=state, timeout=timeout)

    def aiter(
        self, state: dict[str, Any] | None = None, timeout: float | None = None
    ) -> AsyncPipelineIterator[T]:
        """An async iterator over a new run; ``async with p.aiter() as it:`` closes it.

        Example:
            >>> import asyncio, aioflow as af
            >>> async def first():
            ...     async with af.range(3).aiter() as it:
            ...         return await anext(it)
            >>> asyncio.run(first())
            0
        """
        return AsyncPipelineIterator(self, state=state, timeout=timeout)

    def __iter__(self) -> Iterator[T]:
        # a generator, so that `break` (the generator is dropped) closes the run at once
        with self.iter() as it:
            yield from it

    def __aiter__(self) -> AsyncPipelineIterator[T]:
        return self.aiter()

    def close(self) -> None:
        """Stop the worker processes this pipeline keeps warm between its runs.

        A ``"process"`` map keeps its pool of workers alive after a run, for the next run
        of the same pipeline (DataLoader's ``persistent_workers``): later epochs start at
        once. ``close()`` stops the idle pools of every stage of ``p`` now (a pool in use
        stops when its run ends); ``with p:`` calls it on leaving the block. Without it,
        the pools stop when ``p`` becomes unreachable, or at interpreter exit. ``p`` stays
        usable: its next run starts fresh workers.

        Example:
            >>> import aioflow as af
            >>> with af.range(4).map(abs, executor="process") as p:
            ...     p.to_list(), p.to_list()  # the second epoch reuses the workers
            ([0, 1, 2, 3], [0, 1, 2, 3])
        """
        from ._pool_life import close_nodes_pools

        close_nodes_pools(self)

    def __enter__(self) -> Pipeline[T]:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def to_list(self) -> list[T]:
        """Run the pipeline once and return its items (works inside a running loop too).

        Example:
            >>> import aioflow as af
            >>> af.range(3).to_list()
            [0, 1, 2]
        """
        with self.iter() as it:
            return list(it)

    async def collect(self) -> list[T]:
        """Run the pipeline once on the caller's loop and return its items.

        Example:
            >>> import asyncio, aioflow as af
            >>> asyncio.run(af.range(3).collect())
            [0, 1, 2]
        """
        async with self.aiter() as it:
            return [x async for x in it]

    def cardinality(self) -> int:
        """The number of items, or ``af.INFINITE`` / ``af.UNKNOWN`` (tf.data's rules).

        Example:
            >>> import aioflow as af
            >>> af.range(10).batch(3).cardinality(), af.range(3).repeat().cardinality()
            (4, -1)
        """
        node = self._node
        return node.card([q.cardinality() for q in node.inputs])

    def __len__(self) -> int:
        n = self.cardinality()
        if n == INFINITE_CARD:
            raise TypeError("the pipeline is infinite (repeat()): it has no len()")
        if n < 0:
            raise TypeError("the pipeline's length is unknown (after filter, flat_map, ...)")
        return n

    def max_inflight(self) -> int:
        """The static bound on source items a run of this pipeline holds at once.

        It adds up, over every stage, the channel after it (stages in their own task), the
        chunk it may be working on, and what it holds itself (calls in flight, a batch
        being built, a shuffle buffer), plus the consumer's side; an object that holds
        others (a batch of n, a window) counts as the items it holds.

        Example:
            >>> import aioflow as af
            >>> af.range(10).prefetch(4).max_inflight() > 4
            True
        """
        seen: dict[int, int] = {}
        total = 0

        def walk(p: Pipeline[Any]) -> int:
            """Adds the stage's bound to ``total``; returns items per output object."""
            nonlocal total
            node = p._node
            if id(node) in seen:
                return seen[id(node)]
            m_in = sum(walk(q) for q in node.inputs) if node.inputs else 1
            m_out = m_in * node.mult
            items = max(node.items, node.grow_to)  # prefetch(AUTOTUNE) may grow to grow_to
            chunks = max(node.chunks, node.grow_to)
            objects = CHUNK_MAX + (min(items, chunks * CHUNK_MAX) if node.task else 0)
            total += node.holds * m_in + objects * m_out
            seen[id(node)] = m_out
            return m_out

        m = walk(self)
        # the output channel, and the consumer's side (a ThreadChannel of 4 chunks)
        return total + (CHANNEL_ITEMS + 4 * CHUNK_MAX) * m
