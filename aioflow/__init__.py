"""aioflow: an asyncio streaming data-input pipeline for ML training.

Example:
    >>> import aioflow as af
    >>> p = af.range(8).map(lambda x: x * 2).batch(4)
    >>> [b.tolist() for b in p]
    [[0, 2, 4, 6], [8, 10, 12, 14]]
"""

from __future__ import annotations

from ._calls import AUTOTUNE
from ._iterators import AsyncPipelineIterator, PipelineIterator
from .batching import default_collate
from .combine import concat, zip
from .errors import (
    AioflowError,
    NextTimeout,
    PipelineError,
    StageError,
    StageTimeout,
    StateMismatch,
    WorkerDied,
)
from .pipeline import INFINITE, UNKNOWN, Pipeline
from .sources import from_dataflow, from_iterable, range
from .stats import RunStats, StageStats
from .transforms import shard_from_env

# parallel (issue 3)

# ordering and sampling (issue 4)

# io (issue 5)

# observing (issue 6)

# integrations (issue 8)
# isort: split
from .integrations.torch import from_torch_dataset

__version__ = "0.1.0.dev0"

__all__ = [
    "AUTOTUNE",
    "INFINITE",
    "UNKNOWN",
    "AioflowError",
    "AsyncPipelineIterator",
    "NextTimeout",
    "Pipeline",
    "PipelineError",
    "PipelineIterator",
    "RunStats",
    "StageError",
    "StageStats",
    "StageTimeout",
    "StateMismatch",
    "WorkerDied",
    "__version__",
    "concat",
    "default_collate",
    "from_dataflow",
    "from_iterable",
    "from_torch_dataset",
    "range",
    "shard_from_env",
    "zip",
]
