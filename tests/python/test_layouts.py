"""The source side derived from the model (wsync.layouts) equals what the C++
catalog emits for the same trainer: FSDP2 and HSDP from DTensor-like
parameters, Megatron-core from its tensor-parallel attributes; plus the
layout-spec examples (uneven shards, _StridedShard, Partial) and annotations."""
import pickle

import pytest
import torch

from wsync import layouts
from wsync._proto import layout_pb2

import ducks
from catalog_specs import tensors_by_name, wsyncctl_spec
from models import dtype_of, trainer_tensors


def assert_same_tensors(side, want_side):
    got, want = tensors_by_name(side), tensors_by_name(want_side)
    assert sorted(got) == sorted(want)  # order: first seen over the ranks
    for name, w in want.items():
        assert got[name] == w, f"{name}:\n{got[name]}\nwant:\n{w}"


def dtensor_side(model, mesh, placements, world, experts="separate"):
    """Describe on every rank (DTensor-like params), then merge."""
    per_rank = []
    for rank in range(world):
        params = [(n, ducks.DTensor(torch.zeros(s, dtype=dtype_of(i, torch.bfloat16)), mesh,
                                    placements, rank))
                  for n, s, i in trainer_tensors(model, experts)]
        per_rank.append(layouts.describe(params, rank=rank))
    # The records travel through all_gather_object: they must pickle.
    per_rank = pickle.loads(pickle.dumps(per_rank))
    return layouts.source_side(per_rank)


@pytest.mark.parametrize("model", ["tiny-llama", "tiny-qwen3-moe", "tiny-mla"])
def test_fsdp2_matches_catalog(model):
    side = dtensor_side(model, [0, 1, 2], [ducks.Shard(0)], 3)
    want = wsyncctl_spec("--model", model, "--source", "fsdp:3", "--destination", "vllm-tp:1")
    assert_same_tensors(side, want.source)


def test_hsdp_matches_catalog():
    side = dtensor_side("tiny-llama", [[0, 1, 2], [3, 4, 5]],
                        [ducks.Replicate(), ducks.Shard(0)], 6)
    want = wsyncctl_spec("--model", "tiny-llama", "--source", "hsdp:2x3", "--destination",
                         "vllm-tp:1")
    assert_same_tensors(side, want.source)


MEGATRON_SPLIT = {"vocab": 0, "column": 0, "row": 1, "expert_column": 0, "expert_row": 1}


def megatron_params(model, tp, pp, dp, ep, rank, num_layers, num_experts):
    """Rank `rank`'s parameters as Megatron-core holds them: local TP shards
    with tensor_model_parallel / partition_dim / partition_stride, local
    experts named by their local index, only its pipeline stage's layers."""
    tp_rank, dp_rank, pp_rank = rank % tp, (rank // tp) % dp, rank // (tp * dp)
    ep_rank = dp_rank % ep
    local_experts = num_experts // ep if num_experts else 0
    out = []
    for name, shape, info in trainer_tensors(model, "separate"):
        layer = info["layer"]
        stage = (pp - 1 if info["last_stage"] else 0) if layer < 0 else layer * pp // num_layers
        if stage != pp_rank:
            continue
        if info["expert"] >= 0:
            if info["expert"] // local_experts != ep_rank:
                continue
            name = name.replace(f"experts.{info['expert']}.",
                                f"experts.local.{info['expert'] % local_experts}.")
        shape = list(shape)
        dim = MEGATRON_SPLIT.get(info["kind"])
        if dim is not None:
            shape[dim] //= tp
        t = torch.zeros(shape, dtype=dtype_of(info, torch.bfloat16))
        t.tensor_model_parallel = dim is not None
        t.partition_dim = -1 if dim is None else dim
        t.partition_stride = 1
        out.append((name, t))
    return out, layouts.Megatron(tp_rank, tp, ep_rank=ep_rank, ep_size=ep, pp_rank=pp_rank)


def global_expert_name(local_experts):
    def name_map(name, meg):
        if ".experts.local." not in name:
            return name
        head, rest = name.split(".experts.local.")
        idx, tail = rest.split(".", 1)
        return f"{head}.experts.{meg.ep_rank * local_experts + int(idx)}.{tail}"
    return name_map


@pytest.mark.parametrize("model,tp,pp,dp,ep", [
    ("tiny-llama", 2, 2, 2, 1), ("tiny-llama", 2, 1, 1, 1), ("tiny-qwen3-moe", 2, 2, 2, 2),
    ("tiny-mla", 2, 1, 2, 2)])
def test_megatron_matches_catalog(model, tp, pp, dp, ep):
    from wsync import _native
    cfg = _native.catalog_model(model)
    per_rank = []
    for rank in range(tp * pp * dp):
        params, meg = megatron_params(model, tp, pp, dp, ep, rank, cfg["num_layers"],
                                      cfg["num_experts"])
        name_map = global_expert_name(cfg["num_experts"] // ep) if cfg["num_experts"] else None
        per_rank.append(layouts.describe(params, rank=rank, megatron=meg, name_map=name_map))
    side = layouts.source_side(per_rank)
    src = f"megatron:tp{tp},pp{pp},dp{dp}" + (f",ep{ep}" if ep > 1 else "")
    want = wsyncctl_spec("--model", model, "--source", src, "--destination", "vllm-tp:1",
                         "--experts", "separate")
    assert_same_tensors(side, want.source)


def mesh_json(t):
    from google.protobuf import json_format
    return json_format.MessageToDict(t.mesh)


def test_strided_shard_doc_example_and_local_buffers():
    # docs/layout-spec.md: FSDP2 over TP, shape [8, 2], mesh (dp=2, tp=2),
    # [_StridedShard(0, 2), Shard(0)]: rank (i, j) holds rows [4j + 2i, 4j + 2i + 2).
    full = torch.arange(16.).reshape(8, 2)
    mesh, pl = [[0, 1], [2, 3]], [ducks.StridedShard(0, 2), ducks.Shard(0)]
    side = layouts.source_side(layouts.describe([("w", ducks.DTensor(full, mesh, pl, 0))]))
    assert mesh_json(side.tensors[0]) == {
        "meshShape": ["2", "2"], "ranks": [0, 1, 2, 3],
        "placements": [{"stridedShard": {"splitFactor": 2}}, {"shard": {}}]}  # dim 0: default
    for rank in range(4):
        i, j = divmod(rank, 2)
        local = ducks.DTensor(full, mesh, pl, rank).to_local()
        assert torch.equal(local, full[4 * j + 2 * i:4 * j + 2 * i + 2])
        assert layouts.local_buffers(side, rank) == {"w": ("FP32", local.numel())}


def test_sub_meshes_of_each_tp_rank_merge_as_replicas():
    # TP x FSDP on a (dp=2, tp=2) mesh: a norm weight is not tensor-parallel,
    # so FSDP2 shards it over each tp rank's dp sub-mesh: ranks {0, 2} and
    # {1, 3} each hold Shard(0) of it. Merged: an outer Replicate over them.
    full = torch.arange(8.)
    per_rank = []
    for rank in range(4):
        sub = [rank % 2, rank % 2 + 2]
        per_rank.append(layouts.describe(
            [("norm", ducks.DTensor(full, sub, [ducks.Shard(0)], rank))], rank=rank))
    # Review finding: the same name on separate meshes may be different data
    # (experts named by local index per EP rank): merged only when asked.
    with pytest.raises(ValueError, match="separate meshes.*replicated_meshes=True"):
        layouts.source_side(per_rank)
    side = layouts.source_side(per_rank, replicated_meshes=True)
    assert mesh_json(side.tensors[0]) == {
        "meshShape": ["2", "2"], "ranks": [0, 2, 1, 3],
        "placements": [{"replicate": {}}, {"shard": {}}]}
    for rank in range(4):
        local = ducks.DTensor(full, [rank % 2, rank % 2 + 2], [ducks.Shard(0)], rank).to_local()
        assert layouts.local_buffers(side, rank) == {"norm": ("FP32", local.numel())}
    overlapping = [layouts.describe([("n", ducks.DTensor(full, m, [ducks.Shard(0)], r))], rank=r)
                   for r, m in ((0, [0, 1]), (1, [1, 2]))]
    with pytest.raises(ValueError, match="overlapping meshes"):
        layouts.source_side(overlapping, replicated_meshes=True)


def test_uneven_shards_and_empty_rank():
    # shape [5, 3] over 4 ranks: chunks 2, 2, 1 and nothing on rank 3.
    full = torch.zeros(5, 3)
    side = layouts.source_side(layouts.describe(
        [("w", ducks.DTensor(full, [0, 1, 2, 3], [ducks.Shard(0)], 0))]))
    sizes = [layouts.local_buffers(side, r).get("w", ("FP32", 0))[1] for r in range(4)]
    assert sizes == [6, 6, 3, 0]
    assert [ducks.DTensor(full, [0, 1, 2, 3], [ducks.Shard(0)], r).to_local().numel()
            for r in range(4)] == sizes


def test_partial_and_rank_map():
    full = torch.zeros(2, 2)
    d = ducks.DTensor(full, [[4, 5], [6, 7]], [ducks.Replicate(), ducks.Partial("avg")], 4)
    side = layouts.source_side(layouts.describe([("g", d)], rank_of=lambda r: r - 4))
    m = mesh_json(side.tensors[0])
    assert m["ranks"] == [0, 1, 2, 3]
    assert m["placements"][1] == {"partial": {"op": "REDUCE_AVG"}}


def test_annotations_and_plain_tensors():
    # Rank r holds rows [2r, 2r + 2) of a [4, 3] tensor (box annotation); a
    # mesh-annotated tensor; a plain tensor every rank holds whole.
    per_rank = []
    for r in range(2):
        a = layouts.annotate(torch.zeros(2, 3), shape=[4, 3], box=([2 * r, 0], [2, 3]),
                             buffer="flat")
        b = layouts.annotate(torch.zeros(3), shape=[6], mesh_shape=[2], ranks=[0, 1],
                             placements=[layouts.shard(0)])
        per_rank.append(layouts.describe([("a", a), ("b", b), ("c", torch.zeros(2))], rank=r))
    side = layouts.source_side(per_rank)
    a, b, c = side.tensors
    assert [(f.rank, list(f.box.offset), list(f.box.length), f.buffer)
            for f in a.fragments.fragments] == [(0, [0, 0], [2, 3], "flat"),
                                                (1, [2, 0], [2, 3], "flat")]
    assert mesh_json(b)["placements"] == [{"shard": {}}]  # dim 0 (proto default)
    assert [f.rank for f in c.fragments.fragments] == [0, 1]
    assert layouts.local_buffers(side, 1) == {"flat": ("FP32", 6), "b": ("FP32", 3),
                                              "c": ("FP32", 2)}


def test_ranks_that_disagree_are_refused():
    a = [{"kind": "box", "name": "x", "dtype": "FP32", "shape": [4], "rank": 0,
          "offset": [0], "length": [2]}]
    b = [{"kind": "box", "name": "x", "dtype": "BF16", "shape": [4], "rank": 1,
          "offset": [2], "length": [2]}]
    with pytest.raises(ValueError, match="disagree on dtype"):
        layouts.source_side([a, b])
    with pytest.raises(ValueError, match="box=.*or mesh_shape"):
        layouts.annotate(torch.zeros(1))


def test_transfer_spec_allows_the_casts_it_needs():
    src = layout_pb2.Side(name="trainer")
    src.tensors.add(name="w", dtype=layout_pb2.FP32, shape=[2])
    dst = layout_pb2.TransferSpec()
    dst.destination.tensors.add(name="w", dtype=layout_pb2.BF16, shape=[2])
    spec = layouts.transfer_spec(src, dst, name="t")
    assert [(getattr(c, "from"), c.to) for c in spec.options.allowed_casts] == [
        (layout_pb2.FP32, layout_pb2.BF16)]


def test_megatron_strided_and_expert_tensor_parallel():
    # partition_stride 2 (Megatron's strided init: rank r holds chunks r, r + tp
    # of 2 * tp) is _StridedShard(dim, 2); an expert parameter (allreduce=False)
    # is split over the expert-TP group, here of size 1.
    per_rank = []
    for rank in range(2):
        w = torch.zeros(4, 3)
        w.tensor_model_parallel, w.partition_dim, w.partition_stride = True, 0, 2
        e = torch.zeros(6, 3)
        e.tensor_model_parallel, e.partition_dim, e.partition_stride = True, 0, 1
        e.allreduce = False
        meg = layouts.Megatron(rank, 2, etp_rank=0, etp_size=1)
        per_rank.append(layouts.describe([("w", w), ("e", e)], rank=rank, megatron=meg))
    w, e = layouts.source_side(per_rank).tensors
    assert list(w.shape) == [8, 3] and mesh_json(w)["placements"][1] == {
        "stridedShard": {"splitFactor": 2}}
    assert list(e.shape) == [6, 3] and mesh_json(e)["meshShape"] == ["2", "1"]
    # Megatron's rank 1 holds rows 2-3 and 6-7: what the spec's rule gives.
    full = torch.arange(24.).reshape(8, 3)
    d = ducks.DTensor(full, [0, 1], [ducks.StridedShard(0, 2)], 1)
    assert torch.equal(d.to_local(), torch.cat([full[2:4], full[6:8]]))
