"""aioflow: an asyncio streaming data-input pipeline for ML training.

Example:
    >>> import aioflow as af
    >>> p = af.range(8).map(lambda x: x * 2).batch(4)
    >>> [b.tolist() for b in p]
    [[0, 2, 4, 6], [8, 10, 12, 14]]
"""

from __future__ import annotations

from ._autotune import AUTOTUNE
from ._iterators import AsyncPipelineIterator, PipelineIterator
from .batching import default_collate
from .combine import concat, zip
from .errors import (
    AioflowError,
    LateItem,
    NextTimeout,
    PipelineError,
    StageError,
    StageTimeout,
    StateMismatch,
    WorkerDied,
)
from .pipeline import INFINITE, UNKNOWN, Pipeline
from .sources import from_dataflow, from_iterable, from_source, range
from .stats import RunStats, StageStats
from .transforms import shard_from_env

# parallel (issue 3)

# ordering and sampling (issue 4)
from .combine import choose_from, sample_from

# io (issue 5)
from .errors import BadInput
from .io import (
    list_files,
    read_bytes,
    read_jsonl,
    read_lines,
    read_npy,
    read_parquet,
    read_tar,
    read_tfrecord,
)

# observing (issue 6)
from ._bench import BenchResult, bench

# random access and checkpoints (issue 14)
from .checkpoint import StatefulLoader, merge_states

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
    "BadInput",
    "BenchResult",
    "LateItem",
    "NextTimeout",
    "Pipeline",
    "PipelineError",
    "PipelineIterator",
    "RunStats",
    "StageError",
    "StageStats",
    "StageTimeout",
    "StateMismatch",
    "StatefulLoader",
    "WorkerDied",
    "__version__",
    "bench",
    "choose_from",
    "concat",
    "default_collate",
    "from_dataflow",
    "from_iterable",
    "from_source",
    "from_torch_dataset",
    "list_files",
    "merge_states",
    "range",
    "read_bytes",
    "read_jsonl",
    "read_lines",
    "read_npy",
    "read_parquet",
    "read_tar",
    "read_tfrecord",
    "sample_from",
    "shard_from_env",
    "zip",
]
