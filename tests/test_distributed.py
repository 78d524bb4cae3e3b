"""Multi-host sharding: each rank of a torchrun-style launch reads a disjoint shard.

Two processes stand in for two hosts: each gets RANK / WORLD_SIZE (and the rest of what
``torchrun`` sets) in its environment, as a launcher would set them, and reads its shard
through ``af.shard_from_env()`` / ``from_torch_dataset(shard="env")``.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

WORKER = textwrap.dedent(
    """
    import json, aioflow as af
    N = 101
    out = {"env": af.shard_from_env()}
    out["range"] = af.range(N).shard(*af.shard_from_env()).to_list()
    p = af.from_torch_dataset(list(range(N)), shuffle=True, shard="env")
    out["epochs"] = [list(p.iter(epoch=e)) for e in range(2)]
    print(json.dumps(out))
    """
)

GLOO_WORKER = textwrap.dedent(
    """
    import torch.distributed as dist, aioflow as af
    dist.init_process_group("gloo")  # reads MASTER_ADDR/PORT, RANK, WORLD_SIZE
    p = af.from_torch_dataset(list(range(64)), shuffle=True, seed=3, shard="env").batch(
        8, collate="torch"
    )
    mine = [b.tolist() for b in p]
    everyone = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, mine)
    if dist.get_rank() == 0:
        flat = [x for batches in everyone for b in batches for x in b]
        assert sorted(flat) == list(range(64)), flat
        print("ok", [len(b) for b in everyone])
    dist.destroy_process_group()
    """
)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(code: str, world: int = 2) -> list[str]:
    """Start ``world`` processes the way torchrun does (one per rank) and collect stdout."""
    port = str(_free_port())
    procs = []
    for rank in range(world):
        env = {
            **os.environ,
            "RANK": str(rank),
            "LOCAL_RANK": "0",  # one process per "host"
            "WORLD_SIZE": str(world),
            "LOCAL_WORLD_SIZE": "1",
            "GROUP_RANK": str(rank),
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": port,
        }
        procs.append(
            subprocess.Popen(
                [sys.executable, "-c", code],
                env=env,
                cwd=ROOT,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
        )
    outs = []
    for p in procs:
        out, err = p.communicate(timeout=50)
        assert p.returncode == 0, err
        outs.append(out)
    return outs


def test_two_ranks_read_disjoint_shards_that_cover_the_data():
    res = [json.loads(o) for o in launch(WORKER)]
    assert [r["env"] for r in res] == [[2, 0], [2, 1]]
    ranges = [r["range"] for r in res]
    assert ranges == [list(range(0, 101, 2)), list(range(1, 101, 2))]
    for epoch in range(2):
        parts = [r["epochs"][epoch] for r in res]
        assert set(parts[0]).isdisjoint(parts[1])
        assert sorted(parts[0] + parts[1]) == list(range(101))
        assert [len(x) for x in parts] == [51, 50]
    # every rank reshuffles each epoch, all with the same permutation (seed 0 when sharded)
    assert res[0]["epochs"][0] != res[0]["epochs"][1]


def test_two_ranks_under_torch_distributed_gloo_gather_the_whole_dataset():
    pytest.importorskip("torch.distributed")
    outs = launch(GLOO_WORKER)
    assert outs[0].strip() == "ok [4, 4]"
