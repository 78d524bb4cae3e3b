"""Hugging Face datasets: read by from_iterable (map-style and iterable) and by index."""

from __future__ import annotations

import os

import numpy as np
import pytest

import aioflow as af

# never the network: everything here is in memory
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
datasets = pytest.importorskip("datasets")

ROWS = {"text": [f"t{i}" for i in range(10)], "label": [i % 3 for i in range(10)]}


@pytest.fixture(autouse=True)
def offline(monkeypatch):
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")


def test_from_iterable_reads_a_dataset_in_order_every_epoch():
    ds = datasets.Dataset.from_dict(ROWS)
    p = af.from_iterable(ds)
    assert len(p) == 10
    rows = p.to_list()
    assert rows == [{"text": f"t{i}", "label": i % 3} for i in range(10)]
    assert p.to_list() == rows


def test_from_iterable_reads_an_iterable_dataset():
    ids = datasets.Dataset.from_dict(ROWS).to_iterable_dataset(num_shards=2)
    p = af.from_iterable(ids)
    rows = p.to_list()
    assert rows == [{"text": f"t{i}", "label": i % 3} for i in range(10)]
    assert p.to_list() == rows


def test_a_numpy_formatted_dataset_batches_into_arrays():
    ds = datasets.Dataset.from_dict({"x": np.arange(20).reshape(10, 2).tolist(), **ROWS})
    ds = ds.with_format("numpy", columns=["x", "label"])
    batches = af.from_iterable(ds).batch(4).to_list()
    assert [b["x"].shape for b in batches] == [(4, 2), (4, 2), (2, 2)]
    assert np.concatenate([b["label"] for b in batches]).tolist() == ROWS["label"]


async def test_async_for_over_an_iterable_dataset_with_a_map():
    ids = datasets.Dataset.from_dict(ROWS).to_iterable_dataset()
    p = af.from_iterable(ids).map(lambda r: r["text"].upper()).batch(4, collate=list)
    assert [b async for b in p] == [
        ["T0", "T1", "T2", "T3"],
        ["T4", "T5", "T6", "T7"],
        ["T8", "T9"],
    ]


def test_a_dataset_is_shuffled_and_sharded_by_index():
    ds = datasets.Dataset.from_dict(ROWS)
    shards = [af.from_torch_dataset(ds, shuffle=True, shard=(2, k)) for k in range(2)]
    parts = [[r["text"] for r in s.to_list()] for s in shards]
    assert sorted(parts[0] + parts[1]) == sorted(ROWS["text"])
    assert parts[0] + parts[1] != ROWS["text"]
