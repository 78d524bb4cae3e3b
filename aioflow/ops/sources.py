"""Sources: where items come from. Each function returns a ``Pipeline``.

A sync source (``range``, a sync iterable, ``from_source``) makes its chunks in the task
that reads it (``Hints.inline``); an async iterable is read in a task of its own. A sync
iterable is read on the run's event loop in chunks whose size adapts to how long items
take (one item at first, up to ``CHUNK_MAX`` when they are cheap), so a slow generator
still gives its first item at once and a fast one moves in large chunks."""

from __future__ import annotations

import asyncio
import builtins
import inspect
from collections.abc import AsyncIterable, Callable, Iterable, Iterator, Sequence
from time import perf_counter
from typing import TYPE_CHECKING, Any, TypeVar

import numpy as np

from aioflow._core.base import pipeline_of
from aioflow._core.chunks import YIELD_EVERY, iterable_chunks, sync_chunks
from aioflow._state.splits import IndexSplits, RangeSplits, list_source
from aioflow.errors import PipelineError, StageError
from aioflow.ops.kit import (
    CHUNK_MAX,
    COUNTED,
    UNKNOWN_CARD,
    ChunkIter,
    Ctx,
    Hints,
    Node,
    Opener,
    Seek,
    check_int,
    counted_source,
    is_int,
)
from aioflow.ops.slicing import shard_from_env
from aioflow.ops.sources_index import Position
from aioflow.ops.sources_permute import Permutation

if TYPE_CHECKING:
    from aioflow.pipeline import Pipeline

T = TypeVar("T")

#: A source read on the loop, never awaited: fused into the task that reads it.
INLINE = Hints(inline=True)

__all__ = ["from_dataflow", "from_iterable", "from_source", "range"]


def _len_or_unknown(obj: Any) -> int:
    try:
        n = len(obj)
    except Exception:
        return UNKNOWN_CARD
    return n if isinstance(n, int) and n >= 0 else UNKNOWN_CARD


def from_iterable(obj: Iterable[T] | AsyncIterable[T] | Callable[[], Any]) -> Pipeline[T]:
    """A pipeline over any sync or async iterable, or a callable returning one per epoch.

    A list, a numpy array, a Hugging Face dataset: iterated afresh each epoch. A callable
    (a generator function, a ``lambda: open(path)``) is called anew for every epoch, so
    one-shot iterators such as generators should be passed that way.

    Example:
        >>> import aioflow as af
        >>> af.from_iterable([1, 2, 3]).map(lambda x: x * 10).to_list()
        [10, 20, 30]
        >>> def gen():
        ...     yield from "ab"
        >>> af.from_iterable(gen).to_list()
        ['a', 'b']
    """
    is_iter = isinstance(obj, Iterable | AsyncIterable)
    if not is_iter and not callable(obj):
        raise PipelineError(
            f"from_iterable needs an iterable, an async iterable or a callable returning one,"
            f" got {type(obj).__name__}"
        )

    def build(ctx: Ctx, inputs: Sequence[Opener]) -> ChunkIter:
        return iterable_chunks(obj if is_iter else obj(), ctx)  # type: ignore[operator]

    card = _len_or_unknown(obj) if is_iter else UNKNOWN_CARD
    name = "from_iterable"
    # a sync iterable (or a generator function) is read on the loop, never awaited: no
    # task of its own; another callable may return an async iterable
    sync = isinstance(obj, Iterable) if is_iter else inspect.isgeneratorfunction(obj)
    hints = Hints(inline=sync and not isinstance(obj, AsyncIterable))
    node = Node(name, build, card=lambda _: card, task=True, key=(type(obj).__name__,), hints=hints)
    return pipeline_of(node)


def from_dataflow(df: Any) -> Pipeline[Any]:
    """A pipeline over a tensorpack-style DataFlow (``__iter__``, ``__len__``, ``reset_state``).

    ``reset_state()`` is called once per run, before iterating; ``len(df)``, when it
    works, gives the pipeline's cardinality.

    Example:
        >>> import aioflow as af
        >>> class Squares:
        ...     def reset_state(self): self.k = 2
        ...     def __iter__(self): return (i ** self.k for i in builtins.range(4))
        ...     def __len__(self): return 4
        >>> p = af.from_dataflow(Squares())
        >>> len(p), p.to_list()
        (4, [0, 1, 4, 9])
    """
    if not hasattr(df, "__iter__"):
        raise PipelineError(f"from_dataflow needs an object with __iter__, got {type(df).__name__}")

    def build(ctx: Ctx, inputs: Sequence[Opener]) -> ChunkIter:
        reset = getattr(df, "reset_state", None)
        if reset is not None:
            reset()
        return iterable_chunks(df, ctx)

    card = _len_or_unknown(df)
    key = (type(df).__name__,)
    node = Node("from_dataflow", build, card=lambda _: card, task=True, key=key, hints=INLINE)
    return pipeline_of(node)


def range(start: int, stop: int | None = None, step: int = 1) -> Pipeline[int]:
    """Integers like the builtin ``range``: ``range(stop)`` or ``range(start, stop, step)``.

    Example:
        >>> import aioflow as af
        >>> af.range(5).to_list(), af.range(2, 10, 3).to_list(), len(af.range(10, 0, -2))
        ([0, 1, 2, 3, 4], [2, 5, 8], 5)
    """
    r = builtins.range(start) if stop is None else builtins.range(start, stop, step)

    async def gen(ctx: Ctx) -> ChunkIter:
        let = perf_counter()  # (it lets the loop run: see YIELD_EVERY)
        for i in builtins.range(counted_source(ctx), len(r), CHUNK_MAX):
            if perf_counter() - let >= YIELD_EVERY:
                await asyncio.sleep(0)
                let = perf_counter()
            yield list(r[i : i + CHUNK_MAX])

    def build(ctx: Ctx, inputs: Sequence[Opener]) -> ChunkIter:
        return gen(ctx)

    n = len(r)
    key = (r.start, r.stop, r.step)
    return pipeline_of(
        Node(
            "range",
            build,
            card=lambda _: n,
            task=True,
            key=key,
            resume=COUNTED,
            hints=Hints(splits=RangeSplits(r, range), inline=True),
        )
    )


# -- random access ------------------------------------------------------------------------
Shard = tuple[int, int] | str | None


def resolve_shard(shard: Shard) -> tuple[int, int]:
    """``(num_shards, index)`` of a ``shard=`` argument: None, ``"env"`` or a pair."""
    if shard is None:
        return 1, 0
    if shard == "env":
        return shard_from_env()
    if (
        isinstance(shard, tuple | list)
        and len(shard) == 2
        and all(is_int(v) for v in shard)
        and shard[0] >= 1
        and 0 <= shard[1] < shard[0]
    ):
        return int(shard[0]), int(shard[1])
    raise PipelineError(
        f'shard must be None, "env" or (num_shards, index) with 0 <= index < num_shards,'
        f" got {shard!r}"
    )


def _reader_of(seq: Any, name: str = "from_source") -> Callable[[Any], Iterable[Any]]:
    """How to read the items at an array of indexes: vectorized where the type allows.

    Else one by one, so that the items before a failing ``seq[i]`` come out (and a
    ``StopIteration`` it raises is an error, never the end of the epoch).
    """
    if isinstance(seq, builtins.range):
        r = seq
        return lambda idx: (idx * r.step + r.start).tolist()
    if isinstance(seq, np.ndarray):
        return lambda idx: list(seq[idx])
    get = seq.__getitem__

    def each(idx: Any) -> Iterator[Any]:
        for i in idx.tolist():
            try:
                yield get(i)
            except StopIteration as e:  # (a builtin map would end the epoch silently)
                why = f"stage {name!r}: seq[{i}] raised StopIteration (an error, not the end)"
                raise StageError(why, stage=name) from e

    return each


def from_source(
    seq: Any, *, shuffle: bool = False, seed: int | None = None, shard: Shard = None
) -> Pipeline[Any]:
    """A random-access source: ``seq[i]`` for anything with ``__len__`` and ``__getitem__``.

    A list, a numpy array or memmap, a Hugging Face ``Dataset``, a torch map-style
    dataset, a class of your own reading records by index. ``shuffle=True`` reads it in
    a global permutation drawn afresh every epoch from ``(seed, epoch)``: a keyed
    bijection of the indexes (``_permute.Permutation``) computed as it goes, in O(1)
    memory, so 10^9 items start at once. ``seed=None``: a random seed (0 when sharded,
    so that all ranks share the permutation; a state keeps the seed it was drawn with).
    ``shard=(num_shards, index)`` or ``"env"`` (``af.shard_from_env()``) keeps every
    ``num_shards``-th position of the permutation from ``index``: ranks get disjoint
    slices that cover it, differing in length by at most one, as long as they run the
    same epoch: name it with ``p.iter(epoch=e)`` (``DistributedSampler.set_epoch``), the
    same on every rank. Sharded and shuffled, a second run without ``epoch=`` (or a
    state) raises ``PipelineError``: counting runs, a rank that peeked would read another
    permutation (see docs/checkpointing.md).

    A state (``it.state_dict()``) holds the position; resuming seeks there, at the cost
    of one chunk whatever the position, and ``af.merge_states`` re-splits the states of
    ``n`` ranks over ``m``. Items are read on the run's loop (in the task reading the
    source); for slow reads, shuffle indexes and read them with ``map``'s knobs:
    ``af.from_source(range(len(ds)), shuffle=True).map(ds.__getitem__, concurrency=8,
    executor="thread")`` (resumable the same way).

    Example:
        >>> import aioflow as af
        >>> af.from_source("abcde").to_list()
        ['a', 'b', 'c', 'd', 'e']
        >>> p = af.from_source("abcdefghij", shuffle=True, seed=0)
        >>> "".join(sorted(p.to_list())), p.to_list() != p.to_list()
        ('abcdefghij', True)
        >>> af.from_source("abcdefghij", shard=(3, 1)).to_list()
        ['b', 'e', 'h']
        >>> ranks = [af.from_source("abcdefghij", shuffle=True, shard=(2, r)) for r in (0, 1)]
        >>> with ranks[0].iter(epoch=1) as a, ranks[1].iter(epoch=1) as b:
        ...     "".join(sorted(list(a) + list(b)))
        'abcdefghij'
    """
    return index_source(seq, shuffle, seed, shard, "from_source")


def index_source(
    seq: Any, shuffle: bool, seed: int | None, shard: Shard, name: str
) -> Pipeline[Any]:
    """``from_source`` under a stage name of its own (``from_torch_dataset``'s)."""
    if not (hasattr(seq, "__len__") and hasattr(seq, "__getitem__")):
        raise PipelineError(
            f"{name} needs __len__ and __getitem__, got {type(seq).__name__}"
            " (iterate it with af.from_iterable instead)"
        )

    if seed is not None:
        check_int("seed", seed, 0, want="None or an int >= 0")
    num, idx = resolve_shard(shard)
    n = len(seq)
    explicit = seed is not None
    if seed is None:
        seed = 0 if num > 1 else int(np.random.SeedSequence().generate_state(1)[0])
    read = _reader_of(seq, name)
    base_seed = seed

    def build(ctx: Ctx, inputs: Sequence[Opener]) -> ChunkIter:
        epoch = ctx.open_index if shuffle else None
        pos = Position.resumed(ctx.resume, n, (num, idx), base_seed, explicit, ctx.name, epoch)
        ctx.seeker(pos.after)
        return sync_chunks(pos.items(read, epoch), ctx)

    card = len(builtins.range(idx, n, num))
    key = (type(seq).__name__, n, shuffle)
    start = Seek(lambda: Position(n, base_seed, (num, idx), None, 0).after(0))
    part = _IndexPart(seq, n, (num, idx), base_seed, shuffle, name)
    splits = IndexSplits(card, part)
    return pipeline_of(
        Node(
            name,
            build,
            card=lambda _: card,
            task=True,
            key=key,
            resume=start,
            hints=Hints(splits=splits, inline=True),
            ranked=shuffle and num > 1,
        )
    )


class _IndexPart:
    """The items at this rank's positions ``start:stop`` of an epoch (a ``distribute`` split).

    It travels to Dask workers with the sequence it reads.
    """

    def __init__(
        self, seq: Any, n: int, shard: tuple[int, int], seed: int, shuffle: bool, name: str
    ) -> None:
        self.seq, self.n, self.shard, self.seed = seq, n, shard, seed
        self.shuffle, self.name = shuffle, name

    def __call__(self, epoch: int, start: int, stop: int) -> Pipeline[Any]:
        num, idx = self.shard
        pos = idx + num * np.arange(start, stop, dtype=np.int64)
        if self.shuffle:
            perm = Permutation(self.n, (self.seed, epoch))
            pos = perm.map(pos.astype(np.uint64)).astype(np.int64)
        return list_source(self.name, list(_reader_of(self.seq, self.name)(pos)))
