"""Real DTensors (torch >= 2.4): the source side wsync.layouts derives from a
model wrapped with FSDP2 fully_shard (1-D, uneven), HSDP (2-D mesh),
parallelize_module TP, and TP x FSDP (_StridedShard on 4 ranks) says exactly
which elements every rank holds: for every parameter, the global index lists
the spec's rules (docs/layout-spec.md) give for this rank select
full_tensor() into to_local(), and the spec's local buffer size is the local
shard's.

    torchrun --nproc_per_node 2 -m pytest tests/python/gpu   # gloo on CPU, nccl on GPUs
    torchrun --nproc_per_node 4 -m pytest tests/python/gpu   # adds TP x FSDP
"""
import os

import pytest
import torch

dt = pytest.importorskip("torch.distributed.tensor")
if "RANK" not in os.environ:
    pytest.skip("run under torchrun (needs RANK / WORLD_SIZE)", allow_module_level=True)

import torch.distributed as dist  # noqa: E402
from torch.distributed.device_mesh import init_device_mesh  # noqa: E402
from torch.distributed.tensor.parallel import (  # noqa: E402
    ColwiseParallel, RowwiseParallel, parallelize_module)

try:
    from torch.distributed.fsdp import fully_shard  # noqa: E402
except ImportError:  # torch < 2.6
    from torch.distributed._composable.fsdp import fully_shard  # noqa: E402

from wsync import layouts  # noqa: E402

WORLD = int(os.environ.get("WORLD_SIZE", "1"))
RANK = int(os.environ.get("RANK", "0"))
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


@pytest.fixture(scope="module", autouse=True)
def process_group():
    if DEVICE == "cuda":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    dist.init_process_group("nccl" if DEVICE == "cuda" else "gloo")
    yield
    dist.destroy_process_group()


def chunk(idx, parts, i):
    cs = -(-len(idx) // parts)
    return idx[min(i * cs, len(idx)):min((i + 1) * cs, len(idx))]


def local_indices(t, rank):
    """Per dim, the global positions `rank` holds by the spec's rules."""
    ranks = list(t.mesh.ranks)
    flat, coord = ranks.index(rank), []
    for n in reversed(t.mesh.mesh_shape):
        coord.append(flat % n)
        flat //= n
    coord.reverse()
    idx = [list(range(n)) for n in t.shape]
    for m, p in enumerate(t.mesh.placements):
        n, c, kind = t.mesh.mesh_shape[m], coord[m], p.WhichOneof("kind")
        if kind == "shard":
            idx[p.shard.dim] = chunk(idx[p.shard.dim], n, c)
        elif kind == "strided_shard":
            d, sf = p.strided_shard.dim, p.strided_shard.split_factor
            idx[d] = [x for j in range(sf) for x in chunk(chunk(idx[d], sf, j), n, c)]
    return idx


def check(model, replicated_meshes=False):
    records = layouts.gather(layouts.describe(model, rank=RANK))
    side = layouts.source_side(records, replicated_meshes=replicated_meshes)
    by_name = {t.name: t for t in side.tensors}
    placements = set()
    for name, p in model.named_parameters():
        t = by_name[layouts.clean_name(name)]
        placements.add(tuple(type(x).__name__ for x in p.placements))
        full = p.full_tensor().cpu()
        local = p.to_local().cpu()
        idx = local_indices(t, RANK)
        want = full
        for d, ix in enumerate(idx):
            want = want.index_select(d, torch.as_tensor(ix, dtype=torch.long))
        assert torch.equal(want, local), name
        size = layouts.local_buffers(side, RANK).get(t.mesh.buffer or t.name, ("", 0))[1]
        assert size == local.numel(), name
    return placements


def mlp(out_features=16):
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, out_features), torch.nn.ReLU(),
                               torch.nn.Linear(out_features, 8)).to(DEVICE)


def test_fsdp2_uneven():
    model = mlp(out_features=2 * WORLD + 1)  # dim 0 not a multiple of the world
    fully_shard(model, mesh=init_device_mesh(DEVICE, (WORLD,)))
    assert ("Shard",) in check(model)


@pytest.mark.skipif(WORLD % 2, reason="HSDP needs an even world")
def test_hsdp_2d_mesh():
    mesh = init_device_mesh(DEVICE, (2, WORLD // 2), mesh_dim_names=("replicate", "shard"))
    model = mlp()
    fully_shard(model, mesh=mesh)
    assert ("Replicate", "Shard") in check(model)


def test_tensor_parallel():
    mesh = init_device_mesh(DEVICE, (WORLD,))
    model = parallelize_module(mlp(), mesh, {"0": ColwiseParallel(), "2": RowwiseParallel()})
    assert ("Shard",) in check(model)


@pytest.mark.skipif(WORLD < 4 or WORLD % 2, reason="TP x FSDP needs dp >= 2 and tp = 2")
def test_tp_times_fsdp_strided_shard():
    mesh = init_device_mesh(DEVICE, (WORLD // 2, 2), mesh_dim_names=("dp", "tp"))
    model = parallelize_module(mlp(), mesh["tp"], {"0": ColwiseParallel(),
                                                   "2": RowwiseParallel()})
    fully_shard(model, mesh=mesh["dp"])
    placements = check(model, replicated_meshes=True)  # the row-parallel bias: per-TP-rank dp meshes
    assert any("_StridedShard" in p for p in placements), placements
