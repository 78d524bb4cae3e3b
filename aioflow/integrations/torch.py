"""torch: map-style and iterable datasets as sources, tensors as batches, pinned memory.

``from_torch_dataset`` reads a map-style dataset (``__getitem__`` and ``__len__``: a
torch ``Dataset``, a Hugging Face ``Dataset``, a list) by index, in an order reshuffled
every epoch and split between ranks like torch's ``DistributedSampler``, and an
iterable one (a torch ``IterableDataset``, any iterable) by iterating it. ``collate``
is ``batch(collate="torch")``; ``pin_memory`` is ``Pipeline.pin_memory()``. torch itself
is imported only by the functions that need it.
"""

from __future__ import annotations

import builtins
import dataclasses
import logging
import sys
import warnings
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Executor
from typing import TYPE_CHECKING, Any

import numpy as np

from aioflow._core.check import check_concurrency
from aioflow._core.run import CHUNK_MAX, Node
from aioflow.checkpoint import StatefulLoader
from aioflow.collate import STACKED, arrow_collate, is_record_batch, stack, to_numpy
from aioflow.errors import PipelineError
from aioflow.ops.sources import Shard, from_iterable, index_source, resolve_shard
from aioflow.ops.transforms import map_node

if TYPE_CHECKING:
    from aioflow.pipeline import Pipeline

__all__ = [
    "collate",
    "from_torch_dataset",
    "make_collate",
    "stateful_dataset",
    "to_torch",
]

log = logging.getLogger("aioflow")


def _is_iterable_dataset(ds: Any) -> bool:
    # a torch IterableDataset can only exist when torch is imported: no import needed here
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(ds, torch.utils.data.IterableDataset):
        return True
    return not (hasattr(ds, "__getitem__") and hasattr(ds, "__len__"))


def from_torch_dataset(
    ds: Any,
    *,
    shuffle: bool = False,
    seed: int | None = None,
    shard: Shard = None,
    concurrency: int = 1,
    executor: str | Executor | None = None,
) -> Pipeline[Any]:
    """A pipeline over a torch dataset: map-style by index, iterable by iterating it.

    A map-style dataset (``__getitem__`` and ``__len__``: a torch ``Dataset``, a Hugging
    Face ``Dataset``, a list) is read as ``ds[i]`` for ``i`` in order, or with
    ``shuffle=True`` in a permutation drawn afresh every epoch from ``seed`` and the epoch
    number (``seed=None``: a random seed, or 0 when sharded, so that every rank draws the
    same permutation, as ``DistributedSampler`` does). ``shard=(num_shards, index)`` or
    ``"env"`` (``af.shard_from_env()``: ``RANK``/``WORLD_SIZE``) keeps every
    ``num_shards``-th index of that permutation from ``index``: the ranks' shards are
    disjoint and cover the dataset (they differ in length by at most one item) in each
    epoch that every rank names with ``p.iter(epoch=e)`` (``DistributedSampler``'s
    ``set_epoch(e)``); sharded and shuffled, a second run without ``epoch=`` raises
    ``PipelineError`` rather than let a rank that peeked read another permutation.
    ``concurrency``/``executor`` work as in ``map`` and call ``ds[i]`` there
    (``executor="process", concurrency=2`` is ``DataLoader(num_workers=2)``).

    An iterable dataset (a torch ``IterableDataset`` or any iterable without
    ``__getitem__``) is iterated afresh every epoch, sharded item by item; it cannot be
    shuffled here (use a shuffle buffer after it).

    Example:
        >>> import aioflow as af
        >>> data = [10, 11, 12, 13, 14]
        >>> af.from_torch_dataset(data).to_list()
        [10, 11, 12, 13, 14]
        >>> p = af.from_torch_dataset(data, shuffle=True, seed=0)
        >>> sorted(p.to_list()) == data, p.to_list() == p.to_list()
        (True, False)
        >>> af.from_torch_dataset(data, shard=(2, 1)).to_list()
        [11, 13]
    """
    num_shards, index = resolve_shard(shard)
    check_concurrency(concurrency)
    if _is_iterable_dataset(ds):
        if shuffle:
            raise PipelineError(
                "from_torch_dataset: an iterable dataset cannot be shuffled by index;"
                " shuffle its items with a buffer after it"
            )
        if concurrency != 1 or executor is not None:
            raise PipelineError(
                "from_torch_dataset: concurrency/executor apply to a map-style dataset;"
                " map the items of an iterable one instead"
            )
        p: Pipeline[Any] = from_iterable(ds)
        return p.shard(num_shards, index) if num_shards > 1 else p
    if concurrency == 1 and executor is None:
        return index_source(ds, shuffle, seed, shard, "from_torch_dataset")
    # Pipeline.map, so that ds[i] runs as any map with these knobs does
    src = index_source(builtins.range(len(ds)), shuffle, seed, shard, "from_torch_dataset")
    return src.map(ds.__getitem__, concurrency=concurrency, executor=executor)


# -- batches as tensors -------------------------------------------------------------------
def make_collate() -> Callable[[Sequence[Any]], Any]:
    """``batch(collate="torch")``: imports torch now, so a missing torch fails early."""
    import torch  # noqa: F401

    STACKED[collate] = _tensor_of_array  # a stacked array field: one tensor, no copy
    return collate


def _tensor_of_array(a: np.ndarray) -> Any:
    import torch

    try:
        return torch.from_numpy(a)  # shares the array's memory: no copy
    except (TypeError, ValueError):
        if a.dtype.kind in "biufc":  # a byte order or width torch does not take as is
            return torch.from_numpy(np.ascontiguousarray(a, dtype=a.dtype.newbyteorder("=")))
        raise TypeError(f'collate="torch": no tensor holds numpy dtype {a.dtype}') from None


def _columns(batch: Any) -> dict[str, Any]:
    """A record batch's columns as tensors sharing its memory where ``to_numpy`` does
    (numeric columns without nulls); a column of strings or other objects as a list."""
    out: dict[str, Any] = {}
    for name, a in to_numpy(batch).items():
        if a.dtype.kind in "mM":  # datetimes and durations: their int64 counts
            a = a.view(np.int64)
        if a.dtype.kind not in "biufc":
            out[name] = a.tolist()
            continue
        with warnings.catch_warnings():
            # arrow's buffers are read-only; the tensor shares them (writing to it is the
            # caller's risk, as with any tensor made from a read-only array)
            warnings.filterwarnings("ignore", "The given NumPy array is not writable")
            out[name] = _tensor_of_array(a)
    return out


def to_torch(batch: Any) -> Any:
    """A batch made by the default collate, with its numpy arrays as tensors (no copy).

    A record batch becomes a dict of its columns as tensors, numeric columns without
    nulls sharing the batch's memory (``af.collate.to_numpy``), strings as lists.

    Example:
        >>> import numpy as np
        >>> from aioflow.integrations.torch import to_torch
        >>> a = np.arange(4)
        >>> t = to_torch({"x": a, "name": ["a", "b"]})
        >>> t["x"].data_ptr() == a.ctypes.data, t["name"]
        (True, ['a', 'b'])
    """
    if isinstance(batch, np.ndarray):
        return _tensor_of_array(batch)
    if is_record_batch(batch):
        return _columns(batch)
    if isinstance(batch, np.generic):
        return _tensor_of_array(np.asarray(batch))
    if isinstance(batch, Mapping):
        return {k: to_torch(v) for k, v in batch.items()}
    if isinstance(batch, tuple):
        vals = [to_torch(v) for v in batch]
        return type(batch)(*vals) if hasattr(batch, "_fields") else tuple(vals)
    if isinstance(batch, list):
        return [to_torch(v) for v in batch]
    return batch


def collate(items: Sequence[Any]) -> Any:
    """Stack samples into a batch of torch tensors (torch's ``default_collate`` rules).

    numpy arrays are stacked and become a tensor sharing the stacked array's memory
    (``torch.from_numpy``: one copy, the stack); tensors are stacked with
    ``torch.stack``; Python ints, floats and bools become int64, float64 and bool
    tensors; dicts, tuples (namedtuples too) and lists are collated field by field;
    strings and other objects are kept as a list. Record batches are concatenated and
    their columns become tensors (``to_torch``), without a copy per row.

    Example:
        >>> import numpy as np
        >>> from aioflow.integrations.torch import collate
        >>> x = np.zeros(3, np.float32)
        >>> b = collate([{"x": x, "y": 1}, {"x": x + 1, "y": 0}])
        >>> b["x"].shape, b["x"].dtype, b["y"].tolist()
        (torch.Size([2, 3]), torch.float32, [1, 0])
    """
    import torch

    first = items[0]
    if isinstance(first, torch.Tensor):
        return torch.stack(list(items))
    if is_record_batch(first):
        return _columns(arrow_collate(items))
    if isinstance(first, np.ndarray):
        return _tensor_of_array(stack(items))
    if isinstance(first, np.generic):
        return _tensor_of_array(np.asarray(items))
    if isinstance(first, bool | int | float | complex):
        return torch.tensor(items, dtype=torch.float64 if isinstance(first, float) else None)
    if isinstance(first, Mapping):
        return {k: collate([d[k] for d in items]) for k in first}
    if isinstance(first, tuple):
        cols = [collate(list(col)) for col in zip(*items, strict=True)]
        return type(first)(*cols) if hasattr(first, "_fields") else tuple(cols)
    if isinstance(first, list):
        return [collate(list(col)) for col in zip(*items, strict=True)]
    return list(items)


# -- pinned memory ------------------------------------------------------------------------
_noticed = False


def _pin(x: Any) -> Any:
    import torch

    if isinstance(x, torch.Tensor):
        return x.pin_memory()
    if isinstance(x, Mapping):
        return {k: _pin(v) for k, v in x.items()}
    if isinstance(x, tuple):
        vals = [_pin(v) for v in x]
        return type(x)(*vals) if hasattr(x, "_fields") else tuple(vals)
    if isinstance(x, list):
        return [_pin(v) for v in x]
    return x


def pin_memory_node(up: Pipeline[Any]) -> Node | None:
    """``pin_memory()``: pin every tensor of every item, in a thread, when CUDA exists.

    Without CUDA there is no node (the pipeline stays as it is) and a notice is logged,
    once per process.
    """
    global _noticed
    try:
        import torch
    except ImportError as e:
        raise PipelineError("pin_memory() needs torch (pip install 'aioflow[torch]')") from e
    if not torch.cuda.is_available():
        if not _noticed:
            _noticed = True
            log.warning(
                "pin_memory(): CUDA is not available, so batches stay in pageable memory"
                " (pin_memory() does nothing here; this notice is shown once)"
            )
        return None
    # a copy into page-locked memory: in a thread, off the loop the other stages share
    node = map_node(
        up, _pin, concurrency=1, executor="thread", ordered=True, on_error="raise", timeout=None
    )
    return dataclasses.replace(
        node, name="pin_memory", holds=1 + CHUNK_MAX, key=("pin_memory",), resume=None
    )


# -- checkpoints --------------------------------------------------------------------------
_stateful_class: list[type] = []


def stateful_dataset(pipeline: Pipeline[Any]) -> Any:
    """The pipeline as a torch ``IterableDataset`` with ``state_dict``/``load_state_dict``.

    An ``af.StatefulLoader`` that torch's ``DataLoader`` and torchdata's
    ``StatefulDataLoader`` take as a dataset (use ``batch_size=None``: the pipeline
    batches): ``dl.state_dict()`` / ``dl.load_state_dict(sd)`` then checkpoint and resume
    it, by seeking where its stages allow (see docs/checkpointing.md).

    Example:
        >>> import torch, aioflow as af
        >>> from aioflow.integrations.torch import stateful_dataset
        >>> ds = stateful_dataset(af.range(5).batch(2, collate=list))
        >>> list(torch.utils.data.DataLoader(ds, batch_size=None))
        [[0, 1], [2, 3], [4]]
    """
    import torch

    if not _stateful_class:
        _stateful_class.append(
            type("StatefulPipelineDataset", (StatefulLoader, torch.utils.data.IterableDataset), {})
        )
    return _stateful_class[0](pipeline)
