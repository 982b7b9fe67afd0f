#include "catalog/vllm_layout.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "catalog/fragment_builders.h"
#include "common/dtype.h"
#include "common/status_macros.h"

namespace wsync::catalog {
namespace {

absl::Status CheckDivides(const std::string& what, int64_t n, int64_t parts) {
  if (parts <= 0 || n % parts != 0) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": ", n, " does not divide evenly by ",
                                                   parts,
                                                   " (vLLM requires even tensor-parallel shards)"));
  }
  return absl::OkStatus();
}

void AddMapping(BuiltGroup* g, const std::string& dst, const std::vector<int64_t>& dst_offset,
                const std::string& src, const std::vector<int64_t>& src_offset,
                const std::vector<int64_t>& src_length) {
  v1::TensorMapping* m = &g->mappings.emplace_back();
  m->set_dst(dst);
  for (int64_t o : dst_offset) m->add_dst_offset(o);
  m->set_src(src);
  for (int64_t o : src_offset) m->mutable_src_box()->add_offset(o);
  for (int64_t l : src_length) m->mutable_src_box()->add_length(l);
}

// Every rank of every replica holds `box` of `t`.
void AddOnAllRanks(v1::TensorLayout* t, const std::vector<int64_t>& offset,
                   const std::vector<int64_t>& length, const VllmGroup& group) {
  for (int64_t rep = 0; rep < group.replicas; ++rep) {
    for (int64_t r = 0; r < group.tp; ++r) {
      AddFragment(t, group.rank(rep, r), offset, length, t->name(), 0);
    }
  }
}

}  // namespace

void BuiltGroup::Append(BuiltGroup other) {
  for (auto& t : other.tensors) tensors.push_back(std::move(t));
  for (auto& m : other.mappings) mappings.push_back(std::move(m));
}

absl::StatusOr<BuiltGroup> BuildFusedPerRank(const std::string& name, const std::string& buffer,
                                             int64_t byte_offset, v1::DType dtype,
                                             std::vector<int64_t> shape, int dim,
                                             const std::vector<std::vector<Segment>>& per_rank,
                                             const VllmGroup& group) {
  if (static_cast<int64_t>(per_rank.size()) != group.tp || dim < 0 ||
      dim >= static_cast<int>(shape.size())) {
    return absl::InvalidArgumentError(
        absl::StrCat(name, ": fused layout needs one segment list per tp rank (", group.tp,
                     ") and a valid fused dim"));
  }
  int64_t local = -1;
  for (int64_t r = 0; r < group.tp; ++r) {
    int64_t rows = 0;
    for (const Segment& s : per_rank[r]) rows += s.rows;
    if (local >= 0 && rows != local) {
      return absl::InvalidArgumentError(absl::StrCat(name, ": tp rank ", r, " holds ", rows,
                                                     " rows of the fused dim, rank 0 holds ", local,
                                                     "; vLLM needs equal shards"));
    }
    local = rows;
  }
  std::vector<int64_t> global = shape;
  global[dim] = local * group.tp;
  BuiltGroup out;
  v1::TensorLayout t = NewTensor(name, dtype, global);
  for (int64_t rep = 0; rep < group.replicas; ++rep) {
    for (int64_t r = 0; r < group.tp; ++r) {
      std::vector<int64_t> offset(shape.size(), 0), length = shape;
      offset[dim] = r * local;
      length[dim] = local;
      AddFragment(&t, group.rank(rep, r), offset, length, buffer, byte_offset);
    }
  }
  for (int64_t r = 0; r < group.tp; ++r) {
    int64_t at = r * local;
    for (const Segment& s : per_rank[r]) {
      std::vector<int64_t> dst_offset(shape.size(), 0), src_offset(shape.size(), 0);
      std::vector<int64_t> src_length = shape;
      dst_offset[dim] = at;
      src_offset[dim] = s.src_begin;
      src_length[dim] = s.rows;
      AddMapping(&out, name, dst_offset, s.src, src_offset, src_length);
      at += s.rows;
    }
  }
  out.tensors.push_back(std::move(t));
  return out;
}

absl::StatusOr<BuiltGroup> BuildFusedQkv(const std::string& prefix, int64_t num_heads,
                                         int64_t num_kv_heads, int64_t head_dim, int64_t hidden,
                                         v1::DType dtype, const VllmGroup& group) {
  const std::string name = prefix + "qkv_proj.weight";
  RETURN_IF_ERROR(CheckDivides(name + " query heads", num_heads, group.tp));
  int64_t kv_per_rank = 1, kv_replicas = 1;
  if (group.tp >= num_kv_heads) {
    RETURN_IF_ERROR(CheckDivides(name + " tp over kv heads", group.tp, num_kv_heads));
    kv_replicas = group.tp / num_kv_heads;
  } else {
    RETURN_IF_ERROR(CheckDivides(name + " kv heads", num_kv_heads, group.tp));
    kv_per_rank = num_kv_heads / group.tp;
  }
  const int64_t q_per_rank = num_heads / group.tp;
  std::vector<std::vector<Segment>> per_rank(group.tp);
  for (int64_t r = 0; r < group.tp; ++r) {
    const int64_t kv_first = (r / kv_replicas) * kv_per_rank;
    per_rank[r] = {{prefix + "q_proj.weight", r * q_per_rank * head_dim, q_per_rank * head_dim},
                   {prefix + "k_proj.weight", kv_first * head_dim, kv_per_rank * head_dim},
                   {prefix + "v_proj.weight", kv_first * head_dim, kv_per_rank * head_dim}};
  }
  return BuildFusedPerRank(name, name, 0, dtype, {0, hidden}, 0, per_rank, group);
}

absl::StatusOr<BuiltGroup> BuildGateUp(const std::string& name, const std::string& gate_src,
                                       const std::string& up_src, int64_t intermediate,
                                       int64_t hidden, v1::DType dtype, const VllmGroup& group) {
  RETURN_IF_ERROR(CheckDivides(name + " intermediate", intermediate, group.tp));
  const int64_t i = intermediate / group.tp;
  std::vector<std::vector<Segment>> per_rank(group.tp);
  for (int64_t r = 0; r < group.tp; ++r) {
    per_rank[r] = {{gate_src, r * i, i}, {up_src, r * i, i}};
  }
  return BuildFusedPerRank(name, name, 0, dtype, {0, hidden}, 0, per_rank, group);
}

namespace {

// A [rows, cols] parameter split evenly over the TP ranks along `dim` (0:
// rows, 1: columns), the same in every replica.
absl::StatusOr<BuiltGroup> BuildSplit(const std::string& name, int64_t rows, int64_t cols,
                                      v1::DType dtype, const VllmGroup& group, int dim) {
  const int64_t shape[2] = {rows, cols};
  RETURN_IF_ERROR(CheckDivides(name + (dim == 0 ? " rows" : " columns"), shape[dim], group.tp));
  const int64_t local = shape[dim] / group.tp;
  BuiltGroup out;
  v1::TensorLayout t = NewTensor(name, dtype, {rows, cols});
  for (int64_t rep = 0; rep < group.replicas; ++rep) {
    for (int64_t r = 0; r < group.tp; ++r) {
      std::vector<int64_t> offset = {0, 0}, length = {rows, cols};
      offset[dim] = r * local;
      length[dim] = local;
      AddFragment(&t, group.rank(rep, r), offset, length, name, 0);
    }
  }
  out.tensors.push_back(std::move(t));
  return out;
}

}  // namespace

absl::StatusOr<BuiltGroup> BuildColumnParallel(const std::string& name, int64_t rows, int64_t cols,
                                               v1::DType dtype, const VllmGroup& group) {
  return BuildSplit(name, rows, cols, dtype, group, 0);
}

absl::StatusOr<BuiltGroup> BuildRowParallel(const std::string& name, int64_t rows, int64_t cols,
                                            v1::DType dtype, const VllmGroup& group) {
  return BuildSplit(name, rows, cols, dtype, group, 1);
}

BuiltGroup BuildReplicated(const std::string& name, const std::vector<int64_t>& shape,
                           v1::DType dtype, const VllmGroup& group) {
  BuiltGroup out;
  v1::TensorLayout t = NewTensor(name, dtype, shape);
  AddOnAllRanks(&t, std::vector<int64_t>(shape.size(), 0), shape, group);
  out.tensors.push_back(std::move(t));
  return out;
}

BuiltGroup BuildReplicatedConcat(const std::string& name,
                                 const std::vector<std::pair<std::string, int64_t>>& srcs_rows,
                                 int64_t cols, v1::DType dtype, const VllmGroup& group) {
  BuiltGroup out;
  int64_t rows = 0;
  for (const auto& [src, n] : srcs_rows) {
    AddMapping(&out, name, {rows, 0}, src, {0, 0}, {n, cols});
    rows += n;
  }
  v1::TensorLayout t = NewTensor(name, dtype, {rows, cols});
  AddOnAllRanks(&t, {0, 0}, {rows, cols}, group);
  out.tensors.push_back(std::move(t));
  return out;
}

int64_t PaddedVocab(int64_t vocab) {
  // vLLM's pad_vocab_size(vocab, DEFAULT_VOCAB_PADDING_SIZE = 64), independent of tp.
  constexpr int64_t kPad = 64;
  return (vocab + kPad - 1) / kPad * kPad;
}

absl::StatusOr<BuiltGroup> BuildPaddedVocab(const std::string& name, int64_t vocab, int64_t hidden,
                                            v1::DType dtype, const VllmGroup& group) {
  if (vocab <= 0 || hidden <= 0 || group.tp <= 0) {
    return absl::InvalidArgumentError(absl::StrCat(name, ": bad vocab/hidden/tp"));
  }
  const int64_t padded = PaddedVocab(vocab);
  RETURN_IF_ERROR(CheckDivides(name + " padded vocab", padded, group.tp));
  const int64_t per_rank = padded / group.tp;
  BuiltGroup out;
  v1::TensorLayout t = NewTensor(name, dtype, {padded, hidden});
  for (int64_t rep = 0; rep < group.replicas; ++rep) {
    for (int64_t r = 0; r < group.tp; ++r) {
      const int64_t begin = r * per_rank;
      const int64_t real = std::min(vocab, begin + per_rank) - begin;
      if (real <= 0) continue;
      AddFragment(&t, group.rank(rep, r), {begin, 0}, {real, hidden}, name, 0);
    }
  }
  AddMapping(&out, name, {0, 0}, name, {0, 0}, {vocab, hidden});
  out.tensors.push_back(std::move(t));
  return out;
}

}  // namespace wsync::catalog
