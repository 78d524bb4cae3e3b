"""What the layers below ``pipeline.py`` know of a ``Pipeline``: a node holder.

``Pipeline`` subclasses ``PipelineBase`` and registers itself here when ``pipeline.py``
is imported, so that the sources and family modules can tell a ``Pipeline`` apart
(``isinstance(x, PipelineBase)``) and wrap a ``Node`` into one (``pipeline_of``) without
importing ``pipeline.py``, which imports them (no import cycle).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Concatenate, ParamSpec, cast

if TYPE_CHECKING:
    from aioflow._core.run import Node
    from aioflow.pipeline import Pipeline

__all__ = ["PipelineBase", "pipeline_of", "register"]

P = ParamSpec("P")


class PipelineBase:
    """The base of ``Pipeline``: it holds the node at its end."""

    __slots__ = ("_node",)

    def __init__(self, node: Node) -> None:
        self._node = node

    def _pipeline(self) -> Pipeline[Any]:
        return cast("Pipeline[Any]", self)  # every PipelineBase is a Pipeline

    def _add(
        self,
        make: Callable[Concatenate[Pipeline[Any], P], Node | None],
        *args: P.args,
        **kwargs: P.kwargs,
    ) -> Pipeline[Any]:
        """The pipeline of ``make(self, ...)``, an operator's node; ``self`` for None."""
        node = make(self._pipeline(), *args, **kwargs)
        return self._pipeline() if node is None else type(self)(node)._pipeline()


_made: list[type[Pipeline[Any]]] = []


def register(cls: type[Pipeline[Any]]) -> None:
    """Called once by ``pipeline.py``: ``pipeline_of`` makes instances of ``cls``."""
    _made[:] = [cls]


def pipeline_of(node: Node) -> Pipeline[Any]:
    """The ``Pipeline`` that ends with ``node``."""
    return _made[0](node)
