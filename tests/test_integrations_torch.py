"""torch: from_torch_dataset, batch(collate="torch"), pin_memory()."""

from __future__ import annotations

import logging
import subprocess
import sys
from collections import namedtuple

import numpy as np
import pytest

import aioflow as af
from aioflow.errors import PipelineError

torch = pytest.importorskip("torch")
from torch.utils.data import IterableDataset, TensorDataset  # noqa: E402

import aioflow.integrations.torch as aft  # noqa: E402


class Squares(torch.utils.data.Dataset):
    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> dict:
        if not 0 <= i < self.n:
            raise IndexError(i)
        return {"x": np.full(3, i, dtype=np.float32), "y": i * i}


class Count(IterableDataset):
    def __init__(self, n: int) -> None:
        self.n = n

    def __iter__(self):
        return iter(range(self.n))


class Broken(Squares):
    def __getitem__(self, i: int) -> dict:
        if i == 5:
            raise KeyError("sample 5 is corrupt")
        return super().__getitem__(i)


@pytest.fixture(scope="module")
def forkserver_started() -> None:
    """The multiprocessing forkserver (a service kept for the session) starts before a
    leak baseline is taken."""
    assert af.range(2).map(abs, executor="process").to_list() == [0, 1]


def ys(items: list) -> list[int]:
    return [s["y"] for s in items]


# -- from_torch_dataset -------------------------------------------------------------------
def test_map_style_dataset_is_read_in_index_order():
    p = af.from_torch_dataset(Squares(5))
    assert ys(p.to_list()) == [0, 1, 4, 9, 16]
    assert len(p) == 5
    assert ys(p.to_list()) == [0, 1, 4, 9, 16]  # re-iteration: the same epoch again


def test_empty_dataset_gives_nothing():
    assert af.from_torch_dataset(Squares(0)).to_list() == []
    assert af.from_torch_dataset(Squares(0), shuffle=True, shard=(2, 1)).to_list() == []


def test_shuffle_is_a_permutation_reshuffled_each_epoch_and_reproducible_by_seed():
    p = af.from_torch_dataset(list(range(50)), shuffle=True, seed=7)
    e0, e1 = p.to_list(), p.to_list()
    assert sorted(e0) == sorted(e1) == list(range(50))
    assert e0 != e1 and e0 != list(range(50))
    q = af.from_torch_dataset(list(range(50)), shuffle=True, seed=7)
    assert [q.to_list(), q.to_list()] == [e0, e1]  # same seed, same epochs
    r = af.from_torch_dataset(list(range(50)), shuffle=True, seed=8)
    assert r.to_list() != e0


def test_repeat_reshuffles_every_epoch_of_one_run():
    p = af.from_torch_dataset(list(range(20)), shuffle=True, seed=1).repeat(2)
    items = p.to_list()
    assert sorted(items[:20]) == sorted(items[20:]) == list(range(20))
    assert items[:20] != items[20:]


def test_shards_are_disjoint_and_cover_the_dataset_in_every_epoch():
    data = list(range(23))
    shards = [af.from_torch_dataset(data, shuffle=True, shard=(3, k)) for k in range(3)]
    for epoch in range(2):
        parts = [list(s.iter(epoch=epoch)) for s in shards]
        assert sorted(x for part in parts for x in part) == data  # none twice, none missing
        assert [len(x) for x in parts] == [8, 8, 7]
    assert [len(s) for s in shards] == [8, 8, 7]


def test_shard_env_reads_rank_and_world_size(monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "1")
    assert af.from_torch_dataset(list(range(6)), shard="env").to_list() == [1, 3, 5]


@pytest.mark.parametrize("shard", [(0, 0), (2, 2), (2, -1), "rank", (1.0, 0), 3])
def test_bad_shard_is_rejected(shard):
    with pytest.raises(PipelineError, match="shard"):
        af.from_torch_dataset([1], shard=shard)


def test_tensor_dataset_gives_tuples_of_tensors():
    ds = TensorDataset(torch.arange(6).reshape(3, 2), torch.tensor([0, 1, 0]))
    items = af.from_torch_dataset(ds).to_list()
    assert [(x.tolist(), int(y)) for x, y in items] == [([0, 1], 0), ([2, 3], 1), ([4, 5], 0)]


def test_iterable_dataset_is_iterated_each_epoch_and_sharded_by_item():
    p = af.from_torch_dataset(Count(7))
    assert p.to_list() == list(range(7)) and p.to_list() == list(range(7))
    assert af.from_torch_dataset(Count(7), shard=(2, 0)).to_list() == [0, 2, 4, 6]
    with pytest.raises(PipelineError, match="cannot be shuffled"):
        af.from_torch_dataset(Count(7), shuffle=True)
    with pytest.raises(PipelineError, match="map-style"):
        af.from_torch_dataset(Count(7), executor="thread")


@pytest.mark.parametrize("executor", ["thread", "process"])
def test_getitem_in_workers_gives_the_same_items_in_the_same_order(
    executor, forkserver_started, no_leaks
):
    ds = TensorDataset(torch.arange(40))
    inline = af.from_torch_dataset(ds, shuffle=True, seed=3)
    pooled = af.from_torch_dataset(ds, shuffle=True, seed=3, executor=executor, concurrency=2)
    assert [int(x) for (x,) in pooled.to_list()] == [int(x) for (x,) in inline.to_list()]


def test_error_in_getitem_reaches_the_consumer_as_itself_after_the_items_before_it():
    got = []
    with pytest.raises(KeyError, match="corrupt") as ei:
        for s in af.from_torch_dataset(Broken(10)):
            got.append(s["y"])
    assert got == [0, 1, 4, 9, 16]
    assert any("from_torch_dataset" in n for n in ei.value.__notes__)


def test_break_with_process_workers_leaves_no_process(forkserver_started, no_leaks):
    p = af.from_torch_dataset(Squares(500), executor="process", concurrency=2).batch(8)
    for i, _ in enumerate(p):
        if i == 2:
            break


async def test_async_for_over_a_torch_dataset_batched_as_tensors():
    p = af.from_torch_dataset(Squares(10), shuffle=True, seed=0).batch(4, collate="torch")
    batches = [b async for b in p]
    assert [b["x"].shape[0] for b in batches] == [4, 4, 2]
    assert sorted(torch.cat([b["y"] for b in batches]).tolist()) == [i * i for i in range(10)]


def test_state_dict_resumes_a_shuffled_dataset_exactly():
    def make():
        return af.from_torch_dataset(list(range(30)), shuffle=True, seed=5)

    expected = make().to_list()  # the first epoch of a fresh pipeline
    p = make()
    with p.iter() as it:
        head = [next(it) for _ in range(11)]
        state = it.state_dict()
    with make().iter(state=state) as it:
        tail = list(it)
    assert head + tail == expected


def test_importing_aioflow_does_not_import_torch():
    code = (
        "import sys, aioflow as af; af.from_torch_dataset([1]).batch(1).to_list();"
        " print('torch' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


# -- collate="torch" ----------------------------------------------------------------------
Pair = namedtuple("Pair", "a b")


def test_torch_collate_matches_torch_default_collate():
    samples = [
        {
            "img": np.full((2, 3), i, dtype=np.uint8),
            "label": i,
            "w": 0.5 * i,
            "ok": i % 2 == 0,
            "name": f"s{i}",
            "pair": Pair(np.float32(i), torch.tensor([i, i])),
            "seq": [i, float(i)],
        }
        for i in range(3)
    ]
    ours = aft.collate(samples)
    theirs = torch.utils.data.default_collate(samples)

    def same(a, b):
        if isinstance(a, torch.Tensor):
            assert isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b)
        elif isinstance(a, dict):
            assert a.keys() == b.keys()
            for k in a:
                same(a[k], b[k])
        elif isinstance(a, tuple | list):
            assert type(a) is type(b) and len(a) == len(b)
            for x, y in zip(a, b, strict=True):
                same(x, y)
        else:
            assert a == b

    same(ours, theirs)


def test_batch_collate_torch_gives_tensors_and_keeps_the_remainder():
    p = af.range(5).map(lambda i: (np.full(2, i, np.float32), i)).batch(2, collate="torch")
    out = p.to_list()
    assert [x.tolist() for x, _ in out] == [[[0, 0], [1, 1]], [[2, 2], [3, 3]], [[4, 4]]]
    assert all(x.dtype == torch.float32 and y.dtype == torch.int64 for x, y in out)
    assert [y.tolist() for _, y in out] == [[0, 1], [2, 3], [4]]


def test_numpy_arrays_become_tensors_without_a_copy():
    a = np.arange(6, dtype=np.int16).reshape(2, 3)
    t = aft.to_torch({"a": a, "rest": [a[0]]})
    assert t["a"].data_ptr() == a.ctypes.data
    a[0, 0] = 42  # shared memory: the tensor sees the write
    assert t["a"][0, 0].item() == 42 and t["rest"][0][0].item() == 42
    b = aft.collate([np.zeros(3, np.float32), np.ones(3, np.float32)])
    assert b.numpy().flags.writeable and b.numpy().base is not None


def test_non_native_byte_order_is_converted_and_strings_arrays_are_refused():
    big = np.arange(3, dtype=">i4")
    assert aft.to_torch(big).tolist() == [0, 1, 2]
    with pytest.raises(TypeError, match="dtype"):
        af.from_iterable([np.array(["a"]), np.array(["b"])]).batch(2, collate="torch").to_list()


def test_unknown_or_missing_collate_library_is_a_pipeline_error(monkeypatch):
    from aioflow import collate

    with pytest.raises(PipelineError, match="unknown collate name 'tensorflow'"):
        af.range(3).batch(2, collate="tensorflow")
    monkeypatch.setitem(collate.COLLATES, "nolib", "aioflow_no_such_module:make_collate")
    with pytest.raises(PipelineError, match=r"pip install 'aioflow\[nolib\]'"):
        af.range(3).batch(2, collate="nolib")


# -- pin_memory ---------------------------------------------------------------------------
def test_pin_memory_without_cuda_is_a_no_op_with_a_notice_shown_once(monkeypatch, caplog):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(aft, "_noticed", False)
    p = af.range(4).batch(2, collate="torch")
    with caplog.at_level(logging.WARNING, logger="aioflow"):
        assert p.pin_memory() is p
        assert p.pin_memory() is p
    notices = [r for r in caplog.records if "pin_memory" in r.getMessage()]
    assert len(notices) == 1 and "CUDA is not available" in notices[0].getMessage()


def test_pin_memory_with_cuda_pins_every_tensor_in_a_thread(monkeypatch, no_leaks):
    import threading

    pinned = []

    def fake_pin(self):
        pinned.append(threading.current_thread().name)
        return self.clone()

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.Tensor, "pin_memory", fake_pin)
    p = (
        af.range(6)
        .map(lambda i: {"x": np.full(2, i), "meta": (i, "s")})
        .batch(4, collate="torch")
        .pin_memory()
    )
    out = p.to_list()
    assert [b["x"].tolist() for b in out] == [[[0, 0], [1, 1], [2, 2], [3, 3]], [[4, 4], [5, 5]]]
    assert [b["meta"][1] for b in out] == [["s"] * 4, ["s"] * 2]
    assert len(pinned) == 4  # x and meta[0] of each of the two batches
    assert all(name.startswith("aioflow") for name in pinned)
    assert "pin_memory" in repr(p)


def test_pin_memory_without_torch_says_what_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "torch", None)  # as if torch were not installed
    with pytest.raises(PipelineError, match=r"pin_memory\(\) needs torch"):
        af.range(3).pin_memory()


@pytest.mark.parametrize("knobs", [{}, {"concurrency": 2, "executor": "thread"}])
def test_env_shards_of_a_peeked_rank_cover_each_named_epoch_exactly(monkeypatch, knobs):
    """``shard="env"`` on two ranks in one process; rank 1 peeks at its pipeline first."""
    data = list(range(101))
    ranks = []
    for r in range(2):
        monkeypatch.setenv("WORLD_SIZE", "2")
        monkeypatch.setenv("RANK", str(r))
        ranks.append(af.from_torch_dataset(data, shuffle=True, shard="env", **knobs))
    with ranks[1].iter() as it:
        next(it)
    with pytest.raises(PipelineError, match="epoch="):
        ranks[1].to_list()  # its epoch would differ from rank 0's: refused, not overlapping
    for epoch in (0, 1):
        parts = []
        for p in ranks:
            with p.iter(epoch=epoch) as it:
                parts.append(list(it))
        assert sorted(parts[0] + parts[1]) == data and not set(parts[0]) & set(parts[1])
