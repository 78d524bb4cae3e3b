"""What a node's ``build`` function gets: ``Ctx``, its handle on the run that opens it."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from aioflow._core.graph import CHANNEL_CHUNKS, ChunkIter, Described, Node

if TYPE_CHECKING:
    from aioflow._core.run import Run
    from aioflow._core.stages import LaneCell
    from aioflow.stats.meters import StageMeter

__all__ = ["Ctx", "Sub"]

#: The root of a sub-pipeline: the state it starts from and what gets its seeker.
Sub = tuple[Any, Callable[[Callable[[int], Any]], None] | None] | None


class Ctx:
    """What a node's build function gets: its run, its meter, and how to open pipelines."""

    __slots__ = ("hook", "lane", "meter", "no", "node", "open_index", "resume", "run")

    def __init__(
        self,
        run: Run,
        node: Node,
        meter: StageMeter,
        open_index: int,
        lane: LaneCell,
        sub: Sub = None,
    ) -> None:
        self.run = run
        self.node = node
        self.meter = meter
        self.open_index = open_index  # how many times this node was opened before, ever
        self.lane = lane  # this instance's lane, once it runs: sub-pipelines report to it
        # resuming (see _core/positions.py): the node's number in the graph, and the state
        # it starts from (None: from the start); a sub-pipeline's root gets both from the
        # node that opens it, with what gets its seeker
        self.no: int | None = run.resume.number(node)
        self.resume: Any = run.resume.start(node)
        self.hook: Callable[[Callable[[int], Any]], None] | None = None
        if sub is not None:
            self.resume, self.hook = sub

    def seeker(self, fn: Callable[[int], Any]) -> None:
        """A node says where it was after its first ``k`` items out of this opening."""
        if self.hook is not None:
            self.hook(fn)
        elif self.no is not None:  # by opening: repeat opens its input again per epoch
            self.run.resume.seeker(self.no, self.open_index, fn)

    @property
    def name(self) -> str:
        return self.meter.name

    def open(
        self,
        pipeline: Described,
        resume: Any = None,
        hook: Callable[[Callable[[int], Any]], None] | None = None,
    ) -> ChunkIter:
        """Open a sub-pipeline (from flat_map, interleave, ...) inside this run.

        ``resume``/``hook``: the state its first stage starts from, and what gets that
        stage's ``seeker`` (see ``_state/state.py``).
        """
        sub = (resume, hook) if resume is not None or hook else None
        gen = self.run.open(pipeline, parent=self.meter, reader=self.lane, same_lane=False, sub=sub)
        self.meter.adopt(self.run.meter_for(pipeline._node, self.meter))
        return gen

    def open_task(
        self,
        pipeline: Described,
        *,
        chunks: int = CHANNEL_CHUNKS,
        resume: Any = None,
        hook: Callable[[Callable[[int], Any]], None] | None = None,
    ) -> ChunkIter:
        """Open a sub-pipeline in a task of its own, behind a bounded channel (fan-in)."""
        gen = self.run.open(
            pipeline,
            parent=self.meter,
            boundary=True,
            chunks=chunks,
            reader=self.lane,
            same_lane=False,
            sub=(resume, hook) if resume is not None or hook else None,
        )
        self.meter.adopt(self.run.meter_for(pipeline._node, self.meter))
        return gen
