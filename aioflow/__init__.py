"""aioflow: an asyncio streaming data-input pipeline for ML training.

Example:
    >>> import aioflow as af
    >>> p = af.range(8).map(lambda x: x * 2).batch(4)
    >>> [b.tolist() for b in p]
    [[0, 2, 4, 6], [8, 10, 12, 14]]
"""

from __future__ import annotations

# the Pipeline, and how a run is iterated
from aioflow._core.autotune import AUTOTUNE
from aioflow._iterators import AsyncPipelineIterator, PipelineIterator
from aioflow.pipeline import INFINITE, UNKNOWN, Pipeline

# sources
from aioflow.io import (
    list_files,
    read_bytes,
    read_csv,
    read_jsonl,
    read_lines,
    read_npy,
    read_parquet,
    read_tar,
    read_tfrecord,
)
from aioflow.integrations.torch import from_torch_dataset
from aioflow.ops.sources import from_dataflow, from_iterable, from_source, range

# event time
from aioflow.ops.event_time import Window

# combining pipelines
from aioflow.ops.combine import choose_from, concat, sample_from, zip

# batching, sharding
from aioflow.collate import default_collate
from aioflow.ops.slicing import shard_from_env

# checkpoints
from aioflow.checkpoint import StatefulLoader, merge_states

# observing
from aioflow._bench import BenchResult, bench
from aioflow.stats import RunStats, StageStats

# errors
from aioflow.errors import (
    AioflowError,
    BadInput,
    LateItem,
    NextTimeout,
    PipelineError,
    StageError,
    StageTimeout,
    StateMismatch,
    WorkerDied,
)

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
    "Window",
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
    "read_csv",
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
