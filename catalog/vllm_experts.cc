// FusedMoE expert layouts (declared in vllm_layout.h).
#include "absl/strings/str_cat.h"
#include "common/dtype.h"
#include "common/status_macros.h"
#include "catalog/fragment_builders.h"
#include "catalog/vllm_layout.h"

namespace wsync::catalog {
namespace {

void Map(BuiltGroup* g, const std::string& dst, const std::vector<int64_t>& dst_offset,
         const std::string& src, const std::vector<int64_t>& src_length) {
  v1::TensorMapping* m = &g->mappings.emplace_back();
  m->set_dst(dst);
  for (int64_t o : dst_offset) m->add_dst_offset(o);
  m->set_src(src);
  for (size_t d = 0; d < src_length.size(); ++d) {
    m->mutable_src_box()->add_offset(0);
    m->mutable_src_box()->add_length(src_length[d]);
  }
}

struct ExpertNames {
  std::string w13, w2;
  std::string Gate(const std::string& prefix, ExpertStyle style, int64_t e) const {
    return style == ExpertStyle::kStacked
               ? prefix + "experts.gate_proj"
               : absl::StrCat(prefix, "experts.", e, ".gate_proj.weight");
  }
  std::string Up(const std::string& prefix, ExpertStyle style, int64_t e) const {
    return style == ExpertStyle::kStacked ? prefix + "experts.up_proj"
                                          : absl::StrCat(prefix, "experts.", e, ".up_proj.weight");
  }
  std::string Down(const std::string& prefix, ExpertStyle style, int64_t e) const {
    return style == ExpertStyle::kStacked
               ? prefix + "experts.down_proj"
               : absl::StrCat(prefix, "experts.", e, ".down_proj.weight");
  }
};

absl::StatusOr<BuiltGroup> TensorParallelExperts(const std::string& prefix, int64_t E, int64_t I,
                                                 int64_t H, v1::DType dtype, ExpertStyle style,
                                                 const VllmGroup& group) {
  const ExpertNames n{prefix + "experts.w13_weight", prefix + "experts.w2_weight"};
  if (I % group.tp != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(n.w13, ": moe intermediate ", I, " does not divide evenly by tp ", group.tp));
  }
  const int64_t i = I / group.tp;
  const int64_t elem = DTypeSize(dtype);
  BuiltGroup out;
  const int64_t tensors = style == ExpertStyle::kStacked ? 1 : E;
  for (int64_t e = 0; e < tensors; ++e) {
    const bool stacked = style == ExpertStyle::kStacked;
    std::vector<std::vector<Segment>> per_rank(group.tp);
    for (int64_t r = 0; r < group.tp; ++r) {
      per_rank[r] = {{n.Gate(prefix, style, e), r * i, i}, {n.Up(prefix, style, e), r * i, i}};
    }
    const std::string w13 = stacked ? n.w13 : absl::StrCat(n.w13, ".", e);
    ASSIGN_OR_RETURN(
        BuiltGroup g13,
        BuildFusedPerRank(w13, n.w13, stacked ? 0 : e * 2 * i * H * elem, dtype,
                          stacked ? std::vector<int64_t>{E, 0, H} : std::vector<int64_t>{0, H},
                          stacked ? 1 : 0, per_rank, group));
    out.Append(std::move(g13));
    // w2: Shard of the last (intermediate) dim, fed whole from down_proj.
    const std::string w2 = stacked ? n.w2 : absl::StrCat(n.w2, ".", e);
    std::vector<int64_t> shape =
        stacked ? std::vector<int64_t>{E, H, I} : std::vector<int64_t>{H, I};
    v1::TensorLayout t = NewTensor(w2, dtype, shape);
    for (int64_t rep = 0; rep < group.replicas; ++rep) {
      for (int64_t r = 0; r < group.tp; ++r) {
        std::vector<int64_t> offset(shape.size(), 0), length = shape;
        offset.back() = r * i;
        length.back() = i;
        AddFragment(&t, group.rank(rep, r), offset, length, n.w2, stacked ? 0 : e * H * i * elem);
      }
    }
    Map(&out, w2, std::vector<int64_t>(shape.size(), 0), n.Down(prefix, style, e), shape);
    out.tensors.push_back(std::move(t));
  }
  return out;
}

absl::StatusOr<BuiltGroup> ExpertParallelExperts(const std::string& prefix, int64_t E, int64_t I,
                                                 int64_t H, v1::DType dtype, ExpertStyle style,
                                                 const VllmGroup& group) {
  const ExpertNames n{prefix + "experts.w13_weight", prefix + "experts.w2_weight"};
  if (E % group.tp != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        n.w13, ": ", E, " experts do not divide evenly over ", group.tp, " expert-parallel ranks"));
  }
  const int64_t el = E / group.tp;
  const int64_t elem = DTypeSize(dtype);
  BuiltGroup out;
  if (style == ExpertStyle::kStacked) {
    v1::TensorLayout w13 = NewTensor(n.w13, dtype, {E, 2 * I, H});
    v1::TensorLayout w2 = NewTensor(n.w2, dtype, {E, H, I});
    for (int64_t rep = 0; rep < group.replicas; ++rep) {
      for (int64_t r = 0; r < group.tp; ++r) {
        AddFragment(&w13, group.rank(rep, r), {r * el, 0, 0}, {el, 2 * I, H}, n.w13, 0);
        AddFragment(&w2, group.rank(rep, r), {r * el, 0, 0}, {el, H, I}, n.w2, 0);
      }
    }
    Map(&out, n.w13, {0, 0, 0}, n.Gate(prefix, style, 0), {E, I, H});
    Map(&out, n.w13, {0, I, 0}, n.Up(prefix, style, 0), {E, I, H});
    Map(&out, n.w2, {0, 0, 0}, n.Down(prefix, style, 0), {E, H, I});
    out.tensors.push_back(std::move(w13));
    out.tensors.push_back(std::move(w2));
    return out;
  }
  for (int64_t e = 0; e < E; ++e) {
    const int64_t r = e / el, local = e - r * el;
    v1::TensorLayout w13 = NewTensor(absl::StrCat(n.w13, ".", e), dtype, {2 * I, H});
    v1::TensorLayout w2 = NewTensor(absl::StrCat(n.w2, ".", e), dtype, {H, I});
    for (int64_t rep = 0; rep < group.replicas; ++rep) {
      AddFragment(&w13, group.rank(rep, r), {0, 0}, {2 * I, H}, n.w13, local * 2 * I * H * elem);
      AddFragment(&w2, group.rank(rep, r), {0, 0}, {H, I}, n.w2, local * H * I * elem);
    }
    Map(&out, w13.name(), {0, 0}, n.Gate(prefix, style, e), {I, H});
    Map(&out, w13.name(), {I, 0}, n.Up(prefix, style, e), {I, H});
    Map(&out, w2.name(), {0, 0}, n.Down(prefix, style, e), {H, I});
    out.tensors.push_back(std::move(w13));
    out.tensors.push_back(std::move(w2));
  }
  return out;
}

}  // namespace

absl::StatusOr<BuiltGroup> BuildStackedExperts(const std::string& prefix, int64_t num_experts,
                                               int64_t intermediate, int64_t hidden,
                                               v1::DType dtype, ExpertStyle source_style,
                                               const VllmGroup& group) {
  if (num_experts <= 0 || intermediate <= 0 || hidden <= 0) {
    return absl::InvalidArgumentError(absl::StrCat(prefix, "experts: bad expert dims"));
  }
  return group.expert_parallel ? ExpertParallelExperts(prefix, num_experts, intermediate, hidden,
                                                       dtype, source_style, group)
                               : TensorParallelExperts(prefix, num_experts, intermediate, hidden,
                                                       dtype, source_style, group);
}

}  // namespace wsync::catalog
