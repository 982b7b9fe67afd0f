// vLLM's parameter set for a whole catalog model (declared in sides.h). The
// parameter names follow vLLM's model classes (LlamaForCausalLM,
// Qwen3MoeForCausalLM, DeepseekV3ForCausalLM): fused qkv_proj / gate_up_proj,
// FusedMoE w13_weight / w2_weight, MLA fused_qkv_a_proj.
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "catalog/sides.h"

namespace wsync::catalog {
namespace {

absl::Status AddDenseMlp(const std::string& p, int64_t hidden, int64_t inter, v1::DType dtype,
                         const VllmGroup& g, BuiltGroup* out) {
  ASSIGN_OR_RETURN(BuiltGroup gate_up,
                   BuildGateUp(p + "gate_up_proj.weight", p + "gate_proj.weight",
                               p + "up_proj.weight", inter, hidden, dtype, g));
  out->Append(std::move(gate_up));
  ASSIGN_OR_RETURN(BuiltGroup down,
                   BuildRowParallel(p + "down_proj.weight", hidden, inter, dtype, g));
  out->Append(std::move(down));
  return absl::OkStatus();
}

absl::Status AddAttention(const ModelConfig& c, int64_t l, v1::DType dtype, const VllmGroup& g,
                          BuiltGroup* out) {
  const std::string p = LayerPrefix(l) + "self_attn.";
  if (c.attention == Attention::kGqa) {
    ASSIGN_OR_RETURN(BuiltGroup qkv,
                     BuildFusedQkv(p, c.num_heads, c.num_kv_heads, c.head_dim, c.hidden, dtype, g));
    out->Append(std::move(qkv));
    ASSIGN_OR_RETURN(BuiltGroup o, BuildRowParallel(p + "o_proj.weight", c.hidden,
                                                    c.num_heads * c.head_dim, dtype, g));
    out->Append(std::move(o));
    if (c.qk_norm) {
      out->Append(BuildReplicated(p + "q_norm.weight", {c.head_dim}, dtype, g));
      out->Append(BuildReplicated(p + "k_norm.weight", {c.head_dim}, dtype, g));
    }
    return absl::OkStatus();
  }
  if (c.num_heads % g.tp != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(p, ": ", c.num_heads, " attention heads do not divide by tp ", g.tp));
  }
  out->Append(BuildReplicatedConcat(
      p + "fused_qkv_a_proj.weight",
      {{p + "q_a_proj.weight", c.q_lora_rank},
       {p + "kv_a_proj_with_mqa.weight", c.kv_lora_rank + c.qk_rope_head_dim}},
      c.hidden, dtype, g));
  out->Append(BuildReplicated(p + "q_a_layernorm.weight", {c.q_lora_rank}, dtype, g));
  out->Append(BuildReplicated(p + "kv_a_layernorm.weight", {c.kv_lora_rank}, dtype, g));
  const int64_t qk_head = c.qk_nope_head_dim + c.qk_rope_head_dim;
  ASSIGN_OR_RETURN(BuiltGroup qb, BuildColumnParallel(p + "q_b_proj.weight", c.num_heads * qk_head,
                                                      c.q_lora_rank, dtype, g));
  out->Append(std::move(qb));
  ASSIGN_OR_RETURN(
      BuiltGroup kvb,
      BuildColumnParallel(p + "kv_b_proj.weight", c.num_heads * (c.qk_nope_head_dim + c.v_head_dim),
                          c.kv_lora_rank, dtype, g));
  out->Append(std::move(kvb));
  ASSIGN_OR_RETURN(BuiltGroup o, BuildRowParallel(p + "o_proj.weight", c.hidden,
                                                  c.num_heads * c.v_head_dim, dtype, g));
  out->Append(std::move(o));
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<BuiltGroup> BuildVllmTensors(const ModelConfig& c, ExpertStyle source_style,
                                            const VllmGroup& g, v1::DType dtype) {
  if (g.tp < 1 || g.replicas < 1) {
    return absl::InvalidArgumentError("vllm: tp and replicas must be >= 1");
  }
  if (g.expert_parallel && c.num_experts == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("vllm: expert parallelism requested for dense model ", c.name));
  }
  BuiltGroup out;
  ASSIGN_OR_RETURN(BuiltGroup embed,
                   BuildPaddedVocab("model.embed_tokens.weight", c.vocab, c.hidden, dtype, g));
  out.Append(std::move(embed));
  for (int64_t l = 0; l < c.num_layers; ++l) {
    const std::string p = LayerPrefix(l);
    out.Append(BuildReplicated(p + "input_layernorm.weight", {c.hidden}, dtype, g));
    RETURN_IF_ERROR(AddAttention(c, l, dtype, g, &out));
    out.Append(BuildReplicated(p + "post_attention_layernorm.weight", {c.hidden}, dtype, g));
    if (!c.IsMoeLayer(l)) {
      RETURN_IF_ERROR(AddDenseMlp(p + "mlp.", c.hidden, c.intermediate, dtype, g, &out));
      continue;
    }
    out.Append(BuildReplicated(p + "mlp.gate.weight", {c.num_experts, c.hidden}, dtype, g));
    if (c.router_bias) {
      out.Append(
          BuildReplicated(p + "mlp.gate.e_score_correction_bias", {c.num_experts}, v1::FP32, g));
    }
    ASSIGN_OR_RETURN(BuiltGroup experts,
                     BuildStackedExperts(p + "mlp.", c.num_experts, c.moe_intermediate, c.hidden,
                                         dtype, source_style, g));
    out.Append(std::move(experts));
    if (c.num_shared_experts > 0) {
      RETURN_IF_ERROR(AddDenseMlp(p + "mlp.shared_experts.", c.hidden,
                                  c.moe_intermediate * c.num_shared_experts, dtype, g, &out));
    }
  }
  out.Append(BuildReplicated("model.norm.weight", {c.hidden}, dtype, g));
  ASSIGN_OR_RETURN(BuiltGroup head,
                   BuildPaddedVocab("lm_head.weight", c.vocab, c.hidden, dtype, g));
  out.Append(std::move(head));
  return out;
}

}  // namespace wsync::catalog
