// vLLM's parameter set for a model described by its Hugging Face config
// (wsync._native, python/wsync/vllm.py): the catalog's whole-model builder
// (sides.h) plus what real HF configs add beyond the catalog's models.
#ifndef WSYNC_CATALOG_VLLM_HF_H_
#define WSYNC_CATALOG_VLLM_HF_H_

#include "absl/status/statusor.h"
#include "catalog/model_config.h"
#include "catalog/vllm_layout.h"
#include "wsync/v1/layout.pb.h"

namespace wsync::catalog {

struct HfExtras {
  // Qwen2: q/k/v projections have biases; vLLM fuses them like the weights
  // into "<prefix>qkv_proj.bias" (rank r: [q_r; k_r; v_r], GQA-replicated).
  bool qkv_bias = false;
  // lm_head shares embed_tokens (Llama-3.2-1B, Qwen2-0.5B...): vLLM has no
  // lm_head parameter, so the destination has none.
  bool tie_word_embeddings = false;
  // vLLM fp8 block serving (HF quantization_config fp8 with
  // weight_block_size [128, 128]): linear weights block-quantized (vllm_fp8.h).
  bool fp8_block = false;
};

// BuildVllmTensors(model, ...) adjusted by `extras`. Errors name the tensor
// and the size that does not divide by tp.
absl::StatusOr<BuiltGroup> BuildVllmTensorsForHf(const ModelConfig& model, const HfExtras& extras,
                                                 ExpertStyle source_style, const VllmGroup& group,
                                                 v1::DType dtype);

}  // namespace wsync::catalog

#endif  // WSYNC_CATALOG_VLLM_HF_H_
