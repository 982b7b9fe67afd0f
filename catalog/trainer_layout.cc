// Trainer-side layouts (declared in sides.h).
#include "absl/strings/str_cat.h"
#include "catalog/sides.h"
#include "common/status_macros.h"

namespace wsync::catalog {
namespace {

v1::Placement ShardOn(int dim) {
  v1::Placement p;
  p.mutable_shard()->set_dim(dim);
  return p;
}
v1::Placement Rep() {
  v1::Placement p;
  p.mutable_replicate();
  return p;
}

// Sets t's mesh. `ranks` is copied in one allocation: a catalog side of
// 256 ranks and 69 k tensors copies 69 k rank lists, and growing each one
// element by element was most of the spec's allocations.
void SetMesh(v1::TensorLayout* t, const std::vector<int64_t>& mesh_shape,
             const std::vector<int32_t>& ranks, const std::vector<v1::Placement>& placements) {
  v1::MeshLayout* m = t->mutable_mesh();
  m->mutable_mesh_shape()->Add(mesh_shape.begin(), mesh_shape.end());
  m->mutable_ranks()->Reserve(static_cast<int>(ranks.size()));
  m->mutable_ranks()->Add(ranks.begin(), ranks.end());
  for (const v1::Placement& p : placements) *m->add_placements() = p;
}

absl::Status CheckMegatron(const ModelConfig& c, const TrainerParallel& p) {
  if (p.tp < 1 || p.pp < 1 || p.dp < 1 || p.ep < 1) {
    return absl::InvalidArgumentError("megatron: tp, pp, dp and ep must be >= 1");
  }
  if (p.pp > c.num_layers) {
    return absl::InvalidArgumentError(
        absl::StrCat("megatron: pp ", p.pp, " exceeds the ", c.num_layers, " layers of ", c.name));
  }
  if (c.num_heads % p.tp != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("megatron: ", c.num_heads, " attention heads do not divide by tp ", p.tp));
  }
  if (c.attention == Attention::kGqa && c.num_kv_heads % p.tp != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "megatron: ", c.num_kv_heads, " query groups (kv heads) do not divide by tp ", p.tp));
  }
  if (p.ep > 1 && c.num_experts == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("megatron: ep ", p.ep, " on dense model ", c.name));
  }
  if (p.dp % p.ep != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("megatron: ep ", p.ep, " must divide dp ", p.dp, " (EP is carved from DP)"));
  }
  if (c.num_experts > 0 && c.num_experts % p.ep != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("megatron: ", c.num_experts, " experts do not divide by ep ", p.ep));
  }
  return absl::OkStatus();
}

int64_t Stage(const ModelConfig& c, const ModelTensor& t, int64_t pp) {
  if (t.layer < 0) return t.last_stage ? pp - 1 : 0;
  return t.layer * pp / c.num_layers;
}

void MegatronMesh(const ModelConfig& c, const ModelTensor& t, const TrainerParallel& p,
                  v1::TensorLayout* out) {
  const int64_t s = Stage(c, t, p.pp);
  auto rank = [&](int64_t tp_rank, int64_t dp_rank) {
    return static_cast<int32_t>(tp_rank + p.tp * (dp_rank + p.dp * s));
  };
  const bool expert = t.kind == ParallelKind::kExpertColumn || t.kind == ParallelKind::kExpertRow;
  if (!expert) {
    std::vector<int32_t> ranks;
    for (int64_t d = 0; d < p.dp; ++d) {
      for (int64_t r = 0; r < p.tp; ++r) ranks.push_back(rank(r, d));
    }
    v1::Placement inner = Rep();
    if (t.kind == ParallelKind::kVocab || t.kind == ParallelKind::kColumn) inner = ShardOn(0);
    if (t.kind == ParallelKind::kRow) inner = ShardOn(1);
    SetMesh(out, {p.dp, p.tp}, ranks, {Rep(), inner});
    return;
  }
  const int64_t edp = p.dp / p.ep;
  const int tp_dim = (t.kind == ParallelKind::kExpertColumn ? 0 : 1) + (t.stacked ? 1 : 0);
  if (t.stacked) {
    std::vector<int32_t> ranks;
    for (int64_t x = 0; x < edp; ++x) {
      for (int64_t e = 0; e < p.ep; ++e) {
        for (int64_t r = 0; r < p.tp; ++r) ranks.push_back(rank(r, e + p.ep * x));
      }
    }
    SetMesh(out, {edp, p.ep, p.tp}, ranks, {Rep(), ShardOn(0), ShardOn(tp_dim)});
    return;
  }
  const int64_t owner = t.expert / (c.num_experts / p.ep);
  std::vector<int32_t> ranks;
  for (int64_t x = 0; x < edp; ++x) {
    for (int64_t r = 0; r < p.tp; ++r) ranks.push_back(rank(r, owner + p.ep * x));
  }
  SetMesh(out, {edp, p.tp}, ranks, {Rep(), ShardOn(tp_dim)});
}

}  // namespace

absl::StatusOr<std::vector<v1::TensorLayout>> BuildTrainerTensors(const ModelConfig& model,
                                                                  ExpertStyle style,
                                                                  const TrainerParallel& par,
                                                                  v1::DType dtype) {
  if (par.kind == TrainerParallel::Kind::kMegatron) {
    RETURN_IF_ERROR(CheckMegatron(model, par));
  } else if (par.shards < 1 || par.replicas < 1) {
    return absl::InvalidArgumentError("fsdp: shards and replicas must be >= 1");
  }
  // FSDP and HSDP: one rank list for every tensor (case.cc bounds a side
  // to 2^16 ranks).
  std::vector<int32_t> fsdp_ranks;
  if (par.kind != TrainerParallel::Kind::kMegatron) {
    fsdp_ranks.reserve(static_cast<size_t>(par.NumRanks()));
    for (int64_t i = 0; i < par.NumRanks(); ++i) fsdp_ranks.push_back(static_cast<int32_t>(i));
  }
  const std::vector<ModelTensor> tensors = ModelTensors(model, style);
  std::vector<v1::TensorLayout> out;
  out.reserve(tensors.size());
  for (const ModelTensor& t : tensors) {
    v1::TensorLayout& l = out.emplace_back();
    l.set_name(t.name);
    l.set_dtype(t.keep_fp32 ? v1::FP32 : dtype);
    for (int64_t d : t.shape) l.add_shape(d);
    if (par.kind == TrainerParallel::Kind::kMegatron) {
      MegatronMesh(model, t, par, &l);
      continue;
    }
    if (par.replicas > 1) {
      SetMesh(&l, {par.replicas, par.shards}, fsdp_ranks, {Rep(), ShardOn(0)});
    } else {
      SetMesh(&l, {par.shards}, fsdp_ranks, {ShardOn(0)});
    }
  }
  return out;
}

}  // namespace wsync::catalog
