// Architectures of real models (numbers from their public config.json files)
// and the list of weight tensors a trainer holds for them, in Hugging Face
// naming. The catalog turns these into TransferSpecs for benchmarks, tests and
// `wsyncctl catalog`.
#ifndef WSYNC_CATALOG_MODEL_CONFIG_H_
#define WSYNC_CATALOG_MODEL_CONFIG_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace wsync::catalog {

enum class Attention { kGqa, kMla };

struct ModelConfig {
  std::string name;    // catalog key, e.g. "llama3-8b"
  std::string source;  // where the numbers come from
  int64_t hidden = 0;
  int64_t intermediate = 0;  // dense MLP width
  int64_t num_layers = 0;
  int64_t num_heads = 0;
  int64_t num_kv_heads = 0;  // GQA only
  int64_t head_dim = 0;      // GQA only
  int64_t vocab = 0;
  bool qk_norm = false;  // Qwen3: per-head RMSNorm on q and k
  Attention attention = Attention::kGqa;
  // MLA (DeepSeek-V3 / Kimi-K2).
  int64_t q_lora_rank = 0;
  int64_t kv_lora_rank = 0;
  int64_t qk_nope_head_dim = 0;
  int64_t qk_rope_head_dim = 0;
  int64_t v_head_dim = 0;
  // MoE: 0 experts = dense model.
  int64_t num_experts = 0;
  int64_t moe_intermediate = 0;
  int64_t num_shared_experts = 0;
  int64_t first_dense_layers = 0;  // DeepSeek first_k_dense_replace
  bool router_bias = false;        // DeepSeek e_score_correction_bias (kept fp32)

  bool IsMoeLayer(int64_t layer) const { return num_experts > 0 && layer >= first_dense_layers; }
};

// How a trainer tensor is split by tensor/expert parallelism (Megatron
// semantics; FSDP ignores it and shards dim 0 of everything).
enum class ParallelKind {
  kVocab,         // [V, H]: vocab-parallel rows
  kColumn,        // [out, in]: Shard(0)
  kRow,           // [out, in]: Shard(1)
  kReplicated,    // norms, routers, MLA down-projections
  kExpertColumn,  // expert gate/up: [I, H] or stacked [E, I, H]
  kExpertRow,     // expert down:    [H, I] or stacked [E, H, I]
};

// Separate experts: one tensor per expert and projection (HF checkpoints).
// Stacked: one [E, ...] tensor per layer and projection (grouped GEMM).
enum class ExpertStyle { kSeparate, kStacked };

struct ModelTensor {
  std::string name;
  std::vector<int64_t> shape;
  ParallelKind kind = ParallelKind::kReplicated;
  int64_t layer = -1;       // -1: embedding (first stage) / final norm, head (last stage)
  bool last_stage = false;  // for layer == -1: lives on the last pipeline stage
  bool stacked = false;     // leading dim is the expert dim
  int64_t expert = -1;      // separate expert tensors: which expert
  bool keep_fp32 = false;   // never cast (router bias)

  int64_t NumElements() const;
};

// Every catalog model: the real ones and scaled-down "tiny-*" test models.
const std::vector<ModelConfig>& AllModels();
absl::StatusOr<ModelConfig> FindModel(absl::string_view name);
std::string ModelNames();  // "llama3-8b, llama3-70b, ..." for error messages

// The trainer's tensors in HF naming, in checkpoint order.
std::vector<ModelTensor> ModelTensors(const ModelConfig& config, ExpertStyle style);
int64_t ParameterCount(const ModelConfig& config);

// Names shared by the source and destination builders.
std::string LayerPrefix(int64_t layer);  // "model.layers.<layer>."

}  // namespace wsync::catalog

#endif  // WSYNC_CATALOG_MODEL_CONFIG_H_
