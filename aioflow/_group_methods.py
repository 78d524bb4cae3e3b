"""The ``Pipeline`` methods of the operators that hold many items, and of where they go.

``batch``, ``unbatch``, ``rebatch``, ``window``, ``padded_batch``, ``bucket_by_length``
(``batching``), ``shuffle``, ``sort_by``, ``group_by``, ``partition_by`` (``ordering``),
``rejection_resample`` (``sampling``), ``cache`` (``cache``), ``pin_memory``
(``integrations.torch``), ``distribute`` (``distributed``). Each method is its
docstring and one line: the operator's node is made by its family module's function.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from aioflow._core.base import PipelineBase
from aioflow.integrations import torch as _torch
from aioflow.ops import batching as _b
from aioflow.ops import cache as _c
from aioflow.ops import distributed as _d
from aioflow.ops import ordering as _o
from aioflow.ops import sampling as _s

if TYPE_CHECKING:
    from aioflow.pipeline import Pipeline

T = TypeVar("T")
U = TypeVar("U")

__all__ = ["GroupMethods"]


class GroupMethods(PipelineBase, Generic[T]):
    """``Pipeline``'s methods of batching, ordering, sampling and caching operators."""

    __slots__ = ()

    # -- batching ----------------------------------------------------------------------
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
        return self._add(_b.batch_node, size, drop_remainder, collate)

    def unbatch(self) -> Pipeline[Any]:
        """Split batches back into their items (arrays by rows, dicts and tuples by field).

        Example:
            >>> import aioflow as af
            >>> af.range(5).batch(2).unbatch().map(int).to_list()
            [0, 1, 2, 3, 4]
        """
        return self._add(_b.unbatch_node)

    def rebatch(self, size: int, *, drop_remainder: bool = False) -> Pipeline[Any]:
        """Cut the stream of batches into batches of ``size`` items.

        Example:
            >>> import aioflow as af
            >>> [b.tolist() for b in af.range(7).batch(3).rebatch(2)]
            [[0, 1], [2, 3], [4, 5], [6]]
        """
        return self._add(_b.rebatch_node, size, drop_remainder)

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
        return self._add(_b.window_node, size, shift, drop_remainder)

    # -- ordering, grouping, sampling --------------------------------------------------
    def shuffle(
        self,
        buffer_size: int,
        *,
        seed: int | None = None,
        reshuffle_each_iteration: bool = True,
        rows: bool = False,
    ) -> Pipeline[T]:
        """Shuffle through a buffer of ``buffer_size`` items (tf.data's buffer shuffle).

        The buffer is filled first; then each new item takes the place of a random one,
        which comes out; at the end the buffer comes out in a random order. An item can
        only come out after it arrived, at most ``buffer_size - 1`` places early. The same
        ``seed`` and the same input give the same order; every epoch (a new iteration,
        ``repeat``) gets a new order derived from the seed unless
        ``reshuffle_each_iteration=False``; ``seed=None`` is a fresh order every time.
        Memory: the buffer.

        A record batch (a ``pyarrow.RecordBatch`` or a dict of numpy arrays) is one item:
        ``batch(32).shuffle(100)`` shuffles whole batches. With ``rows=True`` the items
        must be record batches (of one kind and schema; anything else is an
        ``af.PipelineError``) and their *rows* are shuffled through a buffer of
        ``buffer_size`` rows: the rows come out exactly as ``unbatch().shuffle(buffer_size,
        seed=seed)`` gives them, in batches of the input's kind and schema. Once the
        buffer is full, each input batch gives one batch of the rows its rows replace (as
        many rows; the batch that fills the buffer gives those of its rows beyond it, the
        batches before it and an empty one give none); at the end the buffer comes out in
        batches of the largest input batch's size. Rows are taken with one ``take`` per
        batch (no Python step per row); memory: the buffer's rows, in at most 17 input
        batches holding at most twice its rows (plus 4096; beyond, the rows are copied into
        one batch). It resumes exactly from any state (which holds the buffer's rows as a
        record batch: store it with ``pickle``).

        Example:
            >>> import aioflow as af
            >>> p = af.range(10).shuffle(4, seed=7)
            >>> p.to_list() == p.to_list(), sorted(p.to_list()) == list(range(10))
            (False, True)
            >>> q = af.range(10).shuffle(4, seed=7, reshuffle_each_iteration=False)
            >>> q.to_list() == q.to_list()
            True
            >>> import numpy as np
            >>> batches = [{"x": np.arange(i, i + 4)} for i in range(0, 12, 4)]
            >>> out = af.from_iterable(batches).shuffle(6, seed=1, rows=True).to_list()
            >>> [len(b["x"]) for b in out]
            [2, 4, 4, 2]
            >>> rows = af.from_iterable(batches).unbatch().shuffle(6, seed=1)
            >>> [int(x) for b in out for x in b["x"]] == [int(r["x"]) for r in rows]
            True
        """
        return self._add(_o.shuffle_node, buffer_size, seed, reshuffle_each_iteration, rows)

    def sort_by(
        self,
        key: Callable[[T], Any] | str,
        *,
        buffer_size: int | None = None,
        reverse: bool = False,
        max_in_memory: int = 1_000_000,
        spill_dir: str | None = None,
        on_late: str = "emit",
        max_delay: Any = None,
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

        With ``max_delay`` (event time, in key units: ms, s, ...) it is a streaming sort
        bounded in time instead of places: the *watermark* is the largest key seen minus
        ``max_delay``, and an item comes out once the watermark reaches its key. The output
        is exactly sorted whenever no item is more than ``max_delay`` later than the
        largest key before it; a later item (its key below the watermark) is late, per
        ``on_late``. ``it.watermark()`` says up to which key the output is complete.
        Memory: the items within ``max_delay`` of the largest key.

        ``key`` may be a column name (``item[key]``); the streaming sorts of record batches
        (``pyarrow.RecordBatch`` or dicts of numpy arrays) by a column then sort their rows,
        a batch at a time, and emit batches (``docs/columnar_operators.md``).

        Example:
            >>> import aioflow as af
            >>> af.from_iterable([1, 0, 2, 4, 3, 5]).sort_by(lambda x: x, buffer_size=1).to_list()
            [0, 1, 2, 3, 4, 5]
            >>> words = af.from_iterable(["bb", "a", "cc", "d"])
            >>> words.sort_by(len, reverse=True, max_in_memory=2).to_list()
            ['bb', 'cc', 'a', 'd']
            >>> af.from_iterable([3, 1, 2, 6, 5, 9]).sort_by(lambda t: t, max_delay=2).to_list()
            [1, 2, 3, 5, 6, 9]
        """
        return self._add(
            _o.sort_by_node, key, buffer_size, reverse, max_in_memory, spill_dir, on_late, max_delay
        )

    def group_by(
        self, key: Callable[[T], Any] | str, *, size: int | None = None, max_keys: int | None = None
    ) -> Pipeline[tuple[Any, list[T]]]:
        """Groups ``(key, [items])`` of the items sharing ``key(item)``, in arrival order.

        A group comes out when it has ``size`` items; when a new key arrives while
        ``max_keys`` groups are open, the oldest open group (the one begun first) comes
        out to make room (counted in the stats as ``StageStats.evicted``); at the end
        the open groups come out in the order they began. Memory: ``size * max_keys``
        items when both are given, else unbounded.

        ``key`` may be a column name: record batches are then grouped by rows, each
        group's ``items`` a batch of its rows (``docs/columnar_operators.md``).

        Example:
            >>> import aioflow as af
            >>> af.range(7).group_by(lambda x: x % 2, size=2).to_list()
            [(0, [0, 2]), (1, [1, 3]), (0, [4, 6]), (1, [5])]
        """
        return self._add(_o.group_by_node, key, size, max_keys)

    def partition_by(
        self,
        key: Callable[[T], Any] | str,
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

        ``key`` may be a column name: record batches (``pyarrow.RecordBatch``, dicts of
        numpy arrays) are then split by rows, each row to the partition of its key (the
        same as ``partition.partition_of`` per item), as sub-batches.

        Example:
            >>> import asyncio, aioflow as af
            >>> async def enrich(x):
            ...     await asyncio.sleep(0.001)
            ...     return x * 10
            >>> p = af.range(8).partition_by(lambda x: x % 2, 2, lambda q: q.map(enrich))
            >>> sorted(p.to_list())
            [0, 10, 20, 30, 40, 50, 60, 70]
        """
        return self._add(_o.partition_by_node, key, num_partitions, fn)

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
        return self._add(_b.padded_batch_node, size, padding_value, drop_remainder)

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
        return self._add(
            _b.bucket_by_length_node, length_fn, boundaries, batch_sizes, padding_value
        )

    def rejection_resample(
        self,
        class_fn: Callable[[T], int] | str,
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
        same choice; each epoch draws anew. ``class_fn`` may be a column name
        (``item[name]``): on record batches the rows are resampled (the same draws as
        for the rows one by one), each batch keeping its kept rows.

        Example:
            >>> import aioflow as af
            >>> p = af.range(1000).rejection_resample(
            ...     lambda x: int(x % 10 == 0), [0.5, 0.5], initial_dist=[0.9, 0.1], seed=0)
            >>> items = p.to_list()
            >>> 0.4 < sum(x % 10 == 0 for x in items) / len(items) < 0.6
            True
        """
        return self._add(_s.rejection_resample_node, class_fn, target_dist, initial_dist, seed)

    # -- io and caching ----------------------------------------------------------------
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
        return self._add(_c.cache_node, path)

    # -- integrations ------------------------------------------------------------------
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
        return self._add(_torch.pin_memory_node)

    # -- distribution ------------------------------------------------------------------
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
        ``af.shard_from_env()``) gets a disjoint share of each epoch they all name
        (``p.iter(epoch=e)``; with several consumers a second run without ``epoch=``
        raises ``PipelineError``). A Dask task takes as many
        splits as make ~0.2 s of work; its items arrive together, in completion order of
        the tasks, and a ``batch`` before ``distribute`` batches within a task. This
        consumer keeps two tasks per worker thread of the cluster (shared among the
        consumers) being made or waiting. ``max_outstanding=M`` bounds what is made
        ahead of a stalled consumer for its memory: M elements (batches, if the part
        before batches) on the cluster or read and not yet handed on, plus at most 12
        chunks of ``max(1, M // 64)`` elements on their way to a ``for`` loop (so
        ``M + 12`` below 128); a range or ``from_source`` is cut into splits small enough
        for it (a file of ``list_files`` stays one split, the least a task makes; so do
        the items a ``flat_map`` makes of one). A small M means small tasks, one round
        trip each. See ``docs/distributed.md``.

        Example:
            >>> import aioflow as af, distributed
            >>> with distributed.Client(n_workers=1, processes=False,
            ...                         dashboard_address=":0") as client:
            ...     sorted(af.range(10).map(lambda x: x * x).distribute(client))
            [0, 1, 4, 9, 16, 25, 36, 49, 64, 81]
        """
        return self._add(
            _d.build_distribute, client, num_consumers, consumer_index, max_outstanding
        )
