// Builders for vLLM's tensor-parallel parameter layouts, as explicit
// destination fragments plus the TensorMappings that feed them from the
// trainer's (Hugging Face named) tensors.
//
// Conventions shared by every builder:
//  * A group is `replicas` independent vLLM servers of `tp` ranks each; the
//    destination side rank of (replica, tp_rank) is replica * tp + tp_rank.
//  * A fused parameter (qkv_proj, gate_up_proj, w13) is one destination tensor
//    whose global shape stacks the per-rank local parameters along the fused
//    dim: rank r's local parameter is the box [r*L, (r+1)*L) of that dim. The
//    mappings say which source region feeds which part of it, so one source
//    region may feed several ranks (GQA kv-head replication).
//  * Every rank's local parameter lives in its own buffer named after the
//    parameter (contiguous, row-major); fragments use byte_offset 0 unless
//    several destination tensors share one buffer (per-expert slices of w13).
//  * vLLM divides evenly: dims that do not divide by tp are errors.
#ifndef WSYNC_CATALOG_VLLM_LAYOUT_H_
#define WSYNC_CATALOG_VLLM_LAYOUT_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "catalog/model_config.h"
#include "wsync/v1/layout.pb.h"

namespace wsync::catalog {

struct VllmGroup {
  int64_t tp = 1;
  int64_t replicas = 1;
  bool expert_parallel = false;  // experts sharded over the tp ranks (EP = TP)
  int64_t rank(int64_t replica, int64_t tp_rank) const { return replica * tp + tp_rank; }
};

struct BuiltGroup {
  std::vector<v1::TensorLayout> tensors;
  std::vector<v1::TensorMapping> mappings;

  void Append(BuiltGroup other);
};

// One part of a fused rank-local parameter: rows [src_begin, src_begin + rows)
// of the fused dim of source tensor `src` (all other dims whole).
struct Segment {
  std::string src;
  int64_t src_begin = 0;
  int64_t rows = 0;
};

// Rank r's local parameter is the concatenation of per_rank[r] along `dim`;
// `shape` is the local parameter's shape except that shape[dim] is ignored.
// Every rank must have the same local extent. Buffer `buffer` at byte_offset.
absl::StatusOr<BuiltGroup> BuildFusedPerRank(const std::string& name, const std::string& buffer,
                                             int64_t byte_offset, v1::DType dtype,
                                             std::vector<int64_t> shape, int dim,
                                             const std::vector<std::vector<Segment>>& per_rank,
                                             const VllmGroup& group);

// vLLM QKVParallelLinear: rank r holds [q heads of r; k head(s) of r; v head(s) of r].
// With tp > num_kv_heads each rank holds one kv head, kv head r / (tp / num_kv_heads).
absl::StatusOr<BuiltGroup> BuildFusedQkv(const std::string& prefix, int64_t num_heads,
                                         int64_t num_kv_heads, int64_t head_dim, int64_t hidden,
                                         v1::DType dtype, const VllmGroup& group);

// vLLM MergedColumnParallelLinear gate_up_proj: rank r holds [gate_r; up_r].
absl::StatusOr<BuiltGroup> BuildGateUp(const std::string& name, const std::string& gate_src,
                                       const std::string& up_src, int64_t intermediate,
                                       int64_t hidden, v1::DType dtype, const VllmGroup& group);

// ColumnParallelLinear (Shard(0)) and RowParallelLinear (Shard(1)) of a
// [rows, cols] source of the same name.
absl::StatusOr<BuiltGroup> BuildColumnParallel(const std::string& name, int64_t rows, int64_t cols,
                                               v1::DType dtype, const VllmGroup& group);
absl::StatusOr<BuiltGroup> BuildRowParallel(const std::string& name, int64_t rows, int64_t cols,
                                            v1::DType dtype, const VllmGroup& group);

// Every rank holds the whole tensor (norms, routers).
BuiltGroup BuildReplicated(const std::string& name, const std::vector<int64_t>& shape,
                           v1::DType dtype, const VllmGroup& group);

// Every rank holds the row-concatenation of whole 2-D sources (vLLM's
// MergedReplicatedLinear fused_qkv_a_proj = [q_a_proj; kv_a_proj_with_mqa]).
BuiltGroup BuildReplicatedConcat(const std::string& name,
                                 const std::vector<std::pair<std::string, int64_t>>& srcs_rows,
                                 int64_t cols, v1::DType dtype, const VllmGroup& group);

// VocabParallelEmbedding / ParallelLMHead: the vocab is padded to a multiple of
// 64 (vLLM's pad_vocab_size with DEFAULT_VOCAB_PADDING_SIZE, whatever the tp),
// the padded vocab must divide by tp (vLLM's divide()), rank r owns padded rows
// [r*P, (r+1)*P); its fragment covers only the real rows in that range (padding
// receives nothing; a rank of only padding has no fragment). Destination shape
// [padded, hidden].
absl::StatusOr<BuiltGroup> BuildPaddedVocab(const std::string& name, int64_t vocab, int64_t hidden,
                                            v1::DType dtype, const VllmGroup& group);
int64_t PaddedVocab(int64_t vocab);

// FusedMoE: w13 [E, 2I, H] (per expert [gate; up]) and w2 [E, H, I].
// TP: rank r holds every expert's [gate_r; up_r] and down[:, I_r]; EP: rank r
// holds whole experts [r*E/tp, (r+1)*E/tp). Sources are either stacked
// ("<prefix>experts.gate_proj" [E, I, H], ...) or separate HF tensors
// ("<prefix>experts.<e>.gate_proj.weight" [I, H], ...); with separate sources
// each expert's slice of w13/w2 is its own destination tensor
// "<prefix>experts.w13_weight.<e>" placed into the shared buffer at its offset.
absl::StatusOr<BuiltGroup> BuildStackedExperts(const std::string& prefix, int64_t num_experts,
                                               int64_t intermediate, int64_t hidden,
                                               v1::DType dtype, ExpertStyle source_style,
                                               const VllmGroup& group);

}  // namespace wsync::catalog

#endif  // WSYNC_CATALOG_VLLM_LAYOUT_H_
