// vLLM fp8 serving of block-quantized checkpoints (DeepSeek-V3 / Kimi-K2
// "fp8 block" format): linear weights in FP8_E4M3 with one fp32
// `weight_scale_inv` per 128x128 block; embeddings, lm_head, norms, router
// gates and biases stay in the inference dtype.
#ifndef WSYNC_CATALOG_VLLM_FP8_H_
#define WSYNC_CATALOG_VLLM_FP8_H_

#include <string>

#include "absl/status/status.h"
#include "catalog/vllm_layout.h"

namespace wsync::catalog {

// Whether `name` is a linear weight vLLM serves block-quantized: *_proj.weight,
// FusedMoE w13_weight / w2_weight (stacked or per expert).
bool IsBlockFp8Linear(const std::string& name);

// "x.weight" -> "x.weight_scale_inv", "experts.w13_weight.3" ->
// "experts.w13_weight_scale_inv.3".
std::string ScaleTensorName(const std::string& weight_name);

// Turns every linear weight of `group` (explicit fragments, row-major local
// buffers) into FP8_E4M3 with block_quantization and adds its scale tensor:
// each fragment's scales live on its rank in buffer "<buffer>_scale_inv",
// row-major over the local buffer's block grid. A weight whose fragments do
// not hold whole blocks (in the global tensor and in the local buffer) stays
// in its dtype; `kept` (optional) counts those.
absl::Status QuantizeLinearWeightsBlockFp8(BuiltGroup* group, int* kept = nullptr);

}  // namespace wsync::catalog

#endif  // WSYNC_CATALOG_VLLM_FP8_H_
