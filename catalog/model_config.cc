#include "catalog/model_config.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace wsync::catalog {
namespace {

ModelConfig Gqa(std::string name, std::string source, int64_t hidden, int64_t intermediate,
                int64_t layers, int64_t heads, int64_t kv_heads, int64_t head_dim, int64_t vocab) {
  ModelConfig c;
  c.name = std::move(name);
  c.source = std::move(source);
  c.hidden = hidden;
  c.intermediate = intermediate;
  c.num_layers = layers;
  c.num_heads = heads;
  c.num_kv_heads = kv_heads;
  c.head_dim = head_dim;
  c.vocab = vocab;
  return c;
}

ModelConfig Qwen3Moe(std::string name, std::string source, int64_t hidden, int64_t layers,
                     int64_t heads, int64_t kv_heads, int64_t head_dim, int64_t vocab,
                     int64_t experts, int64_t moe_intermediate) {
  ModelConfig c =
      Gqa(std::move(name), std::move(source), hidden, 0, layers, heads, kv_heads, head_dim, vocab);
  c.qk_norm = true;
  c.num_experts = experts;
  c.moe_intermediate = moe_intermediate;
  return c;
}

ModelConfig Mla(std::string name, std::string source, int64_t hidden, int64_t intermediate,
                int64_t layers, int64_t heads, int64_t vocab, int64_t q_lora, int64_t kv_lora,
                int64_t nope, int64_t rope, int64_t v_dim, int64_t experts,
                int64_t moe_intermediate, int64_t shared, int64_t first_dense) {
  ModelConfig c;
  c.name = std::move(name);
  c.source = std::move(source);
  c.attention = Attention::kMla;
  c.hidden = hidden;
  c.intermediate = intermediate;
  c.num_layers = layers;
  c.num_heads = heads;
  c.vocab = vocab;
  c.q_lora_rank = q_lora;
  c.kv_lora_rank = kv_lora;
  c.qk_nope_head_dim = nope;
  c.qk_rope_head_dim = rope;
  c.v_head_dim = v_dim;
  c.num_experts = experts;
  c.moe_intermediate = moe_intermediate;
  c.num_shared_experts = shared;
  c.first_dense_layers = first_dense;
  c.router_bias = true;
  return c;
}

std::vector<ModelConfig> MakeModels() {
  std::vector<ModelConfig> m;
  // huggingface.co/meta-llama/Meta-Llama-3-8B/blob/main/config.json
  m.push_back(Gqa("llama3-8b", "meta-llama/Meta-Llama-3-8B config.json", 4096, 14336, 32, 32, 8,
                  128, 128256));
  // huggingface.co/meta-llama/Meta-Llama-3-70B/blob/main/config.json
  m.push_back(Gqa("llama3-70b", "meta-llama/Meta-Llama-3-70B config.json", 8192, 28672, 80, 64, 8,
                  128, 128256));
  // huggingface.co/Qwen/Qwen3-30B-A3B/blob/main/config.json (moe_intermediate_size 768,
  // 128 experts, decoder_sparse_step 1, no shared experts, tie_word_embeddings false)
  m.push_back(Qwen3Moe("qwen3-30b-a3b", "Qwen/Qwen3-30B-A3B config.json", 2048, 48, 32, 4, 128,
                       151936, 128, 768));
  // huggingface.co/Qwen/Qwen3-235B-A22B/blob/main/config.json
  m.push_back(Qwen3Moe("qwen3-235b-a22b", "Qwen/Qwen3-235B-A22B config.json", 4096, 94, 64, 4, 128,
                       151936, 128, 1536));
  // huggingface.co/deepseek-ai/DeepSeek-V3/blob/main/config.json (the MTP layer 61,
  // num_nextn_predict_layers, is not part of the served model and is left out)
  m.push_back(Mla("deepseek-v3", "deepseek-ai/DeepSeek-V3 config.json", 7168, 18432, 61, 128,
                  129280, 1536, 512, 128, 64, 128, 256, 2048, 1, 3));
  // huggingface.co/moonshotai/Kimi-K2-Instruct/blob/main/config.json
  m.push_back(Mla("kimi-k2", "moonshotai/Kimi-K2-Instruct config.json", 7168, 18432, 61, 64, 163840,
                  1536, 512, 128, 64, 128, 384, 2048, 1, 1));
  // Scaled-down models with the same structure, for tests (vocab not a multiple of 64 so
  // that vLLM's padded vocab is exercised).
  m.push_back(Gqa("tiny-llama", "scaled-down Llama-3", 64, 96, 2, 8, 2, 8, 100));
  // Llama-3 shape at 78 M parameters (156 MB in bf16): a sync over a few GB/s
  // (NCCL's socket transport, bench/gpu/run_two_nodes.sh) takes ~40 ms, and
  // wsync-demo checks every byte of several versions in seconds.
  m.push_back(Gqa("small-llama", "scaled-down Llama-3", 1024, 2816, 4, 16, 4, 64, 16000));
  m.push_back(Qwen3Moe("tiny-qwen3-moe", "scaled-down Qwen3-MoE", 32, 2, 8, 2, 4, 100, 8, 16));
  m.push_back(
      Mla("tiny-mla", "scaled-down DeepSeek-V3", 32, 48, 3, 4, 100, 16, 8, 4, 2, 4, 8, 8, 1, 1));
  return m;
}

void Add(std::vector<ModelTensor>* out, std::string name, std::vector<int64_t> shape,
         ParallelKind kind, int64_t layer) {
  ModelTensor t;
  t.name = std::move(name);
  t.shape = std::move(shape);
  t.kind = kind;
  t.layer = layer;
  out->push_back(std::move(t));
}

void AddAttention(const ModelConfig& c, int64_t l, std::vector<ModelTensor>* out) {
  const std::string p = LayerPrefix(l) + "self_attn.";
  const int64_t h = c.hidden;
  if (c.attention == Attention::kGqa) {
    Add(out, p + "q_proj.weight", {c.num_heads * c.head_dim, h}, ParallelKind::kColumn, l);
    Add(out, p + "k_proj.weight", {c.num_kv_heads * c.head_dim, h}, ParallelKind::kColumn, l);
    Add(out, p + "v_proj.weight", {c.num_kv_heads * c.head_dim, h}, ParallelKind::kColumn, l);
    Add(out, p + "o_proj.weight", {h, c.num_heads * c.head_dim}, ParallelKind::kRow, l);
    if (c.qk_norm) {
      Add(out, p + "q_norm.weight", {c.head_dim}, ParallelKind::kReplicated, l);
      Add(out, p + "k_norm.weight", {c.head_dim}, ParallelKind::kReplicated, l);
    }
    return;
  }
  const int64_t qk_head = c.qk_nope_head_dim + c.qk_rope_head_dim;
  Add(out, p + "q_a_proj.weight", {c.q_lora_rank, h}, ParallelKind::kReplicated, l);
  Add(out, p + "q_a_layernorm.weight", {c.q_lora_rank}, ParallelKind::kReplicated, l);
  Add(out, p + "q_b_proj.weight", {c.num_heads * qk_head, c.q_lora_rank}, ParallelKind::kColumn, l);
  Add(out, p + "kv_a_proj_with_mqa.weight", {c.kv_lora_rank + c.qk_rope_head_dim, h},
      ParallelKind::kReplicated, l);
  Add(out, p + "kv_a_layernorm.weight", {c.kv_lora_rank}, ParallelKind::kReplicated, l);
  Add(out, p + "kv_b_proj.weight",
      {c.num_heads * (c.qk_nope_head_dim + c.v_head_dim), c.kv_lora_rank}, ParallelKind::kColumn,
      l);
  Add(out, p + "o_proj.weight", {h, c.num_heads * c.v_head_dim}, ParallelKind::kRow, l);
}

void AddDenseMlp(const std::string& p, int64_t hidden, int64_t inter, int64_t l,
                 std::vector<ModelTensor>* out) {
  Add(out, p + "gate_proj.weight", {inter, hidden}, ParallelKind::kColumn, l);
  Add(out, p + "up_proj.weight", {inter, hidden}, ParallelKind::kColumn, l);
  Add(out, p + "down_proj.weight", {hidden, inter}, ParallelKind::kRow, l);
}

void AddMoe(const ModelConfig& c, int64_t l, ExpertStyle style, std::vector<ModelTensor>* out) {
  const std::string p = LayerPrefix(l) + "mlp.";
  const int64_t h = c.hidden;
  const int64_t i = c.moe_intermediate;
  Add(out, p + "gate.weight", {c.num_experts, h}, ParallelKind::kReplicated, l);
  if (c.router_bias) {
    Add(out, p + "gate.e_score_correction_bias", {c.num_experts}, ParallelKind::kReplicated, l);
    out->back().keep_fp32 = true;
  }
  if (style == ExpertStyle::kStacked) {
    for (const char* proj : {"gate_proj", "up_proj", "down_proj"}) {
      const bool down = std::string(proj) == "down_proj";
      Add(out, absl::StrCat(p, "experts.", proj),
          down ? std::vector<int64_t>{c.num_experts, h, i}
               : std::vector<int64_t>{c.num_experts, i, h},
          down ? ParallelKind::kExpertRow : ParallelKind::kExpertColumn, l);
      out->back().stacked = true;
    }
  } else {
    for (int64_t e = 0; e < c.num_experts; ++e) {
      const std::string ep = absl::StrCat(p, "experts.", e, ".");
      Add(out, ep + "gate_proj.weight", {i, h}, ParallelKind::kExpertColumn, l);
      out->back().expert = e;
      Add(out, ep + "up_proj.weight", {i, h}, ParallelKind::kExpertColumn, l);
      out->back().expert = e;
      Add(out, ep + "down_proj.weight", {h, i}, ParallelKind::kExpertRow, l);
      out->back().expert = e;
    }
  }
  if (c.num_shared_experts > 0) {
    AddDenseMlp(p + "shared_experts.", h, i * c.num_shared_experts, l, out);
  }
}

}  // namespace

int64_t ModelTensor::NumElements() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

std::string LayerPrefix(int64_t layer) { return absl::StrCat("model.layers.", layer, "."); }

const std::vector<ModelConfig>& AllModels() {
  static const std::vector<ModelConfig>* models = new std::vector<ModelConfig>(MakeModels());
  return *models;
}

std::string ModelNames() {
  std::vector<std::string> names;
  for (const ModelConfig& m : AllModels()) names.push_back(m.name);
  return absl::StrJoin(names, ", ");
}

absl::StatusOr<ModelConfig> FindModel(absl::string_view name) {
  for (const ModelConfig& m : AllModels()) {
    if (m.name == name) return m;
  }
  return absl::NotFoundError(
      absl::StrCat("unknown model '", name, "'; known models: ", ModelNames()));
}

std::vector<ModelTensor> ModelTensors(const ModelConfig& c, ExpertStyle style) {
  std::vector<ModelTensor> out;
  Add(&out, "model.embed_tokens.weight", {c.vocab, c.hidden}, ParallelKind::kVocab, -1);
  for (int64_t l = 0; l < c.num_layers; ++l) {
    const std::string p = LayerPrefix(l);
    Add(&out, p + "input_layernorm.weight", {c.hidden}, ParallelKind::kReplicated, l);
    AddAttention(c, l, &out);
    Add(&out, p + "post_attention_layernorm.weight", {c.hidden}, ParallelKind::kReplicated, l);
    if (c.IsMoeLayer(l)) {
      AddMoe(c, l, style, &out);
    } else {
      AddDenseMlp(p + "mlp.", c.hidden, c.intermediate, l, &out);
    }
  }
  Add(&out, "model.norm.weight", {c.hidden}, ParallelKind::kReplicated, -1);
  out.back().last_stage = true;
  Add(&out, "lm_head.weight", {c.vocab, c.hidden}, ParallelKind::kVocab, -1);
  out.back().last_stage = true;
  return out;
}

int64_t ParameterCount(const ModelConfig& config) {
  int64_t n = 0;
  for (const ModelTensor& t : ModelTensors(config, ExpertStyle::kStacked)) n += t.NumElements();
  return n;
}

}  // namespace wsync::catalog
