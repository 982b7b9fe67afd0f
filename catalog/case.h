// A catalog case: model + trainer layout + vLLM layout + placement on nodes,
// named the way the CLI names it:
//   --model llama3-8b --source fsdp:8 --destination vllm-tp:2x4
//   --source hsdp:2x8 | megatron:tp2,pp2,dp2[,ep2]   --destination vllm-tp:16x8,ep
//   --gpus-per-node 8 --colocated --trainer-dtype fp32 --experts stacked|separate --fp8-block
#ifndef WSYNC_CATALOG_CASE_H_
#define WSYNC_CATALOG_CASE_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "catalog/model_config.h"
#include "catalog/sides.h"
#include "catalog/vllm_layout.h"
#include "wsync/v1/layout.pb.h"

namespace wsync::catalog {

struct CaseOptions {
  std::string model;
  TrainerParallel source;
  VllmGroup destination;
  int64_t gpus_per_node = 8;
  bool colocated = false;  // inference rank i runs on trainer worker i
  v1::DType trainer_dtype = v1::BF16;
  v1::DType inference_dtype = v1::BF16;
  // vLLM fp8 serving: linear weights block-quantized (FP8_E4M3 + fp32 scale
  // per 128x128 block, vllm_fp8.h); the rest stays in inference_dtype.
  bool fp8_block = false;
  // Unset: separate (HF) experts for FSDP, stacked (grouped GEMM) for Megatron.
  bool expert_style_set = false;
  ExpertStyle expert_style = ExpertStyle::kSeparate;
};

// "fsdp:N", "hsdp:RxN", "megatron:tpA,ppB,dpC[,epD]" (omitted factors are 1).
absl::StatusOr<TrainerParallel> ParseSource(absl::string_view text);
// "vllm-tp:T" or "vllm-tp:TxR" (R replicas of TP T), optional ",ep".
absl::StatusOr<VllmGroup> ParseDestination(absl::string_view text);
absl::StatusOr<ExpertStyle> ParseExpertStyle(absl::string_view text);
// A case named the way the CLI names it (`experts` "" = the default style)
// as CaseOptions; the other fields keep their defaults.
absl::StatusOr<CaseOptions> ParseCase(absl::string_view model, absl::string_view source,
                                      absl::string_view destination,
                                      absl::string_view experts = "");

std::string SourceToString(const TrainerParallel& p);
std::string DestinationToString(const VllmGroup& g);

// Default link model of the catalog (H100/H200 class, see docs/plan-format.md).
v1::LinkModel DefaultLinkModel();

// Side ranks -> workers and nodes: trainer rank i is worker i on node
// "node<i / G>"; inference rank j is worker j on the same node when colocated,
// else worker S + j on nodes that follow the trainer's nodes.
absl::StatusOr<v1::TransferSpec> BuildCase(const CaseOptions& options);

}  // namespace wsync::catalog

#endif  // WSYNC_CATALOG_CASE_H_
