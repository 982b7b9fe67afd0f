// Whole-model layouts: the trainer side (FSDP2 / HSDP or Megatron
// TP x PP x EP x DP, DTensor mesh form) and the vLLM side (explicit fused
// fragments from vllm_layout.h).
#ifndef WSYNC_CATALOG_SIDES_H_
#define WSYNC_CATALOG_SIDES_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "catalog/model_config.h"
#include "catalog/vllm_layout.h"
#include "wsync/v1/layout.pb.h"

namespace wsync::catalog {

struct TrainerParallel {
  enum class Kind { kFsdp, kMegatron };
  Kind kind = Kind::kFsdp;
  // FSDP2: Shard(0) over `shards` ranks; HSDP: `replicas` copies of that.
  int64_t shards = 1;
  int64_t replicas = 1;
  // Megatron: rank = tp_rank + tp * (dp_rank + dp * pp_rank); experts are
  // split over `ep` groups carved from dp (dp_rank = ep_rank + ep * edp_rank)
  // and tensor-parallel over tp inside an expert (ETP = TP).
  int64_t tp = 1, pp = 1, dp = 1, ep = 1;

  int64_t NumRanks() const { return kind == Kind::kFsdp ? shards * replicas : tp * pp * dp; }
};

// Tensors (mesh layouts) of the trainer side; ranks are filled by the caller.
// `dtype` applies to all but keep_fp32 tensors.
absl::StatusOr<std::vector<v1::TensorLayout>> BuildTrainerTensors(const ModelConfig& model,
                                                                  ExpertStyle style,
                                                                  const TrainerParallel& par,
                                                                  v1::DType dtype);

// vLLM's parameters for the whole model plus the mappings from HF names.
absl::StatusOr<BuiltGroup> BuildVllmTensors(const ModelConfig& model, ExpertStyle source_style,
                                            const VllmGroup& group, v1::DType dtype);

}  // namespace wsync::catalog

#endif  // WSYNC_CATALOG_SIDES_H_
