"""The fluent ``Pipeline``: a lazy, immutable, re-iterable description of a data stream.

Every method returns a new ``Pipeline`` that points at the one it was called on; nothing
runs until it is iterated. Each iteration is a fresh run (see ``_runtime.Run``). The
operator methods come from ``_item_methods``, ``_group_methods`` and ``_time_methods``,
one line each on top of the family modules (``transforms``, ``batching``, ...); here are the running
methods (``iter``, ``to_list``, ``close``, ...) and the static bounds.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, TypeVar

from aioflow._core.base import register
from aioflow._core.channel import LIGHT_ITEMS
from aioflow._core.engine import light_lead
from aioflow._core.graph import Node, fold
from aioflow._core.run import CHANNEL_ITEMS, CHUNK_MAX, INFINITE_CARD, UNKNOWN_CARD
from aioflow._group_methods import GroupMethods
from aioflow._item_methods import ItemMethods
from aioflow._iterators import AsyncPipelineIterator, PipelineIterator
from aioflow._process.pool_life import close_nodes_pools
from aioflow._state.state import node_cards
from aioflow._time_methods import TimeMethods

T = TypeVar("T")

__all__ = ["INFINITE", "UNKNOWN", "Pipeline"]

#: ``cardinality()`` of a pipeline that never ends (``repeat()``).
INFINITE = INFINITE_CARD
#: ``cardinality()`` of a pipeline whose length cannot be known without running it.
UNKNOWN = UNKNOWN_CARD


class Pipeline(ItemMethods[T], GroupMethods[T], TimeMethods[T]):
    """A lazy, immutable, re-iterable description of a stream of items.

    Iterate it with ``for`` (a sync adapter runs it on a background event loop) or
    ``async for`` (it runs on the caller's loop); each iteration is a fresh run (an
    epoch) with its own tasks, queues and stats, named by ``p.iter(epoch=e)`` or else
    counted; a process map's worker pool belongs to the pipeline and stays warm from one
    epoch to the next until ``p.close()`` (see ``close``).

    Example:
        >>> import aioflow as af
        >>> p = af.range(10).filter(lambda x: x % 2 == 0).map(lambda x: x * x).batch(2)
        >>> [b.tolist() for b in p]
        [[0, 4], [16, 36], [64]]
    """

    __slots__ = ()

    def __repr__(self) -> str:
        names = []
        p: Pipeline[Any] | None = self
        while p is not None:
            names.append(p._node.name)
            p = p._node.inputs[0] if len(p._node.inputs) == 1 else None
        return f"<Pipeline {' -> '.join(reversed(names))}>"

    # -- running ------------------------------------------------------------------------
    def iter(
        self,
        state: dict[str, Any] | None = None,
        timeout: float | None = None,
        *,
        epoch: int | None = None,
    ) -> PipelineIterator[T]:
        """A sync iterator over a new run; ``with p.iter() as it:`` closes it for sure.

        ``state`` (from ``it.state_dict()``) resumes after the items already yielded;
        ``timeout`` bounds the wait for each item (``af.NextTimeout``, a TimeoutError).
        ``epoch`` names the run's epoch (an int >= 0; torch's ``set_epoch``): every
        per-epoch seed (``shuffle``, ``from_source(shuffle=True)``, ``sample_from``...)
        derives from it, so the run is the same whatever ran before, on every rank.
        Without it, runs count: the ``e``-th run of ``p`` is epoch ``e``. A sharded
        shuffle (``from_source(shuffle=True, shard=...)``) run again without an epoch
        raises ``PipelineError``: its ranks would disagree as soon as one iterated once
        more. A state keeps its epoch; ``epoch=`` with a ``state`` must be the same.

        Example:
            >>> import aioflow as af
            >>> with af.range(3).iter() as it:
            ...     next(it), it.stats()["range"].items_out
            (0, 3)
            >>> rank0 = af.from_source(range(6), shuffle=True, shard=(2, 0))
            >>> rank1 = af.from_source(range(6), shuffle=True, shard=(2, 1))
            >>> for epoch in range(2):
            ...     with rank0.iter(epoch=epoch) as a, rank1.iter(epoch=epoch) as b:
            ...         sorted(list(a) + list(b))
            [0, 1, 2, 3, 4, 5]
            [0, 1, 2, 3, 4, 5]
        """
        return PipelineIterator(self, state=state, timeout=timeout, epoch=epoch)

    def aiter(
        self,
        state: dict[str, Any] | None = None,
        timeout: float | None = None,
        *,
        epoch: int | None = None,
    ) -> AsyncPipelineIterator[T]:
        """An async iterator over a new run; ``async with p.aiter() as it:`` closes it.

        ``state``, ``timeout`` and ``epoch`` as in ``iter``.

        Example:
            >>> import asyncio, aioflow as af
            >>> async def first():
            ...     async with af.range(3).aiter() as it:
            ...         return await anext(it)
            >>> asyncio.run(first())
            0
        """
        return AsyncPipelineIterator(self, state=state, timeout=timeout, epoch=epoch)

    def __iter__(self) -> Iterator[T]:
        # a generator, so that `break` (the generator is dropped) closes the run at once
        with self.iter() as it:
            for chunk in it._chunks():
                yield from chunk

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
        being built, a shuffle buffer), plus the consumer's side, where light items (numbers,
        small arrays: ``engine.light_items``) may be up to 2 x 16,384 more (no more than the
        whole output); an object that holds others (a batch of n, a window) counts as the
        items it holds.

        Example:
            >>> import aioflow as af
            >>> af.range(10).prefetch(4).max_inflight() > 4
            True
        """
        total = 0

        def add(node: Node, ins: list[int]) -> int:
            """Adds the stage's bound to ``total``; returns items per output object (as
            ``graph.items_per_output``), from its inputs' (``ins``)."""
            nonlocal total
            m_in = sum(ins) if node.inputs else 1
            m_out = m_in * node.mult
            hints = node.hints  # prefetch(AUTOTUNE) may grow to grow_to
            items, chunks = max(hints.items, hints.grow_to), max(hints.chunks, hints.grow_to)
            objects = CHUNK_MAX + (min(items, chunks * CHUNK_MAX) if node.task else 0)
            total += node.holds * m_in + objects * m_out
            return m_out

        m = fold(self, add)[id(self._node)]  # (each node once, without recursion)
        # the output channel, and the consumer's side (a ThreadChannel of 4 chunks); light
        # items (``engine.light_items``): that many more source items there, and as many
        # taken by the consumer from it
        light = 0
        if light_lead(self):  # (no more than the whole output, when that is known)
            card = node_cards(self)[id(self._node)]  # (not cardinality(): it recurses)
            light = 2 * LIGHT_ITEMS if card < 0 else min(2 * LIGHT_ITEMS, card * m)
        return total + (CHANNEL_ITEMS + 4 * CHUNK_MAX) * m + light


register(Pipeline)
