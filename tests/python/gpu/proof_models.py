"""The proof's models (HF config dicts), their HF tensor shapes, and an
independent reading of vLLM's TP layout: what each TP rank's parameters hold,
written from vLLM's weight loaders (QKVParallelLinear with GQA kv-head
replication, MergedColumnParallelLinear gate_up, RowParallelLinear,
VocabParallelEmbedding / ParallelLMHead padded to multiples of 64, FusedMoE
w13 = [gate; up] and w2 per expert), not from wsync's spec."""
import torch

# "gpu": the sizes the GPU proof trains ("large" for timing); "tiny": the CPU variant's.
CONFIGS = {
    ("llama", "gpu"): {
        "model_type": "llama", "architectures": ["LlamaForCausalLM"], "hidden_size": 1024,
        "intermediate_size": 2816, "num_hidden_layers": 4, "num_attention_heads": 16,
        "num_key_value_heads": 4, "head_dim": 64, "vocab_size": 32000,
        "tie_word_embeddings": False, "torch_dtype": "bfloat16"},
    ("qwen3_moe", "gpu"): {
        "model_type": "qwen3_moe", "architectures": ["Qwen3MoeForCausalLM"],
        "hidden_size": 512, "intermediate_size": 1024, "num_hidden_layers": 4,
        "num_attention_heads": 8, "num_key_value_heads": 4, "head_dim": 64,
        "vocab_size": 32000, "num_experts": 16, "num_experts_per_tok": 4,
        "moe_intermediate_size": 256, "decoder_sparse_step": 1, "mlp_only_layers": [],
        "tie_word_embeddings": False, "torch_dtype": "bfloat16"},
    # ~0.5 B parameters: the size at which the Python path is compared with
    # the data-plane benchmark (control overhead amortised as in real syncs).
    ("llama", "large"): {
        "model_type": "llama", "architectures": ["LlamaForCausalLM"], "hidden_size": 2048,
        "intermediate_size": 5632, "num_hidden_layers": 8, "num_attention_heads": 16,
        "num_key_value_heads": 4, "head_dim": 128, "vocab_size": 32000,
        "tie_word_embeddings": False, "torch_dtype": "bfloat16"},
    # Llama-3-8B's widths and vocabulary with 8 of its 32 layers (~2.8 B
    # parameters, 5.6 GB bf16 receivers): a sync of realistic size, where the
    # fixed control path is measured against a data plane of tens of ms.
    ("llama", "xl"): {
        "model_type": "llama", "architectures": ["LlamaForCausalLM"], "hidden_size": 4096,
        "intermediate_size": 14336, "num_hidden_layers": 8, "num_attention_heads": 32,
        "num_key_value_heads": 8, "head_dim": 128, "vocab_size": 128256,
        "tie_word_embeddings": False, "torch_dtype": "bfloat16"},
    # Llama-3-8B itself (32 layers, 8.0 B parameters, 16.1 GB bf16 receivers):
    # the timing stage's realistic size (WSYNC_TIMING_SIZE=8b). Its trainer
    # keeps bf16 weights and AdamW states (fp32 would not fit 2 GPUs beside
    # the receivers), so the wire carries bf16 as it is.
    ("llama", "8b"): {
        "model_type": "llama", "architectures": ["LlamaForCausalLM"], "hidden_size": 4096,
        "intermediate_size": 14336, "num_hidden_layers": 32, "num_attention_heads": 32,
        "num_key_value_heads": 8, "head_dim": 128, "vocab_size": 128256,
        "tie_word_embeddings": False, "torch_dtype": "bfloat16", "trainer_dtype": "bfloat16"},
    ("llama", "tiny"): {
        "model_type": "llama", "architectures": ["LlamaForCausalLM"], "hidden_size": 64,
        "intermediate_size": 96, "num_hidden_layers": 2, "num_attention_heads": 8,
        "num_key_value_heads": 2, "head_dim": 8, "vocab_size": 100,
        "tie_word_embeddings": False, "torch_dtype": "bfloat16"},
    ("qwen3_moe", "tiny"): {
        "model_type": "qwen3_moe", "architectures": ["Qwen3MoeForCausalLM"],
        "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
        "num_attention_heads": 8, "num_key_value_heads": 2, "head_dim": 4, "vocab_size": 100,
        "num_experts": 8, "num_experts_per_tok": 2, "moe_intermediate_size": 16,
        "decoder_sparse_step": 1, "mlp_only_layers": [], "tie_word_embeddings": False,
        "torch_dtype": "bfloat16"},
}
TP = 2


def _dims(c):
    return (c["hidden_size"], c["num_attention_heads"], c["num_key_value_heads"],
            c["head_dim"], c["vocab_size"])


def hf_shapes(c):
    """{HF name: shape} of a model (separate experts, transformers 4.x naming)."""
    h, nh, nkv, hd, v = _dims(c)
    out = {"model.embed_tokens.weight": [v, h], "model.norm.weight": [h],
           "lm_head.weight": [v, h]}
    moe = c["model_type"] == "qwen3_moe"
    for l in range(c["num_hidden_layers"]):
        p = f"model.layers.{l}."
        out.update({p + "input_layernorm.weight": [h], p + "post_attention_layernorm.weight": [h],
                    p + "self_attn.q_proj.weight": [nh * hd, h],
                    p + "self_attn.k_proj.weight": [nkv * hd, h],
                    p + "self_attn.v_proj.weight": [nkv * hd, h],
                    p + "self_attn.o_proj.weight": [h, nh * hd]})
        if moe:
            i = c["moe_intermediate_size"]
            out[p + "self_attn.q_norm.weight"] = [hd]
            out[p + "self_attn.k_norm.weight"] = [hd]
            out[p + "mlp.gate.weight"] = [c["num_experts"], h]
            for e in range(c["num_experts"]):
                q = f"{p}mlp.experts.{e}."
                out.update({q + "gate_proj.weight": [i, h], q + "up_proj.weight": [i, h],
                            q + "down_proj.weight": [h, i]})
        else:
            i = c["intermediate_size"]
            out.update({p + "mlp.gate_proj.weight": [i, h], p + "mlp.up_proj.weight": [i, h],
                        p + "mlp.down_proj.weight": [h, i]})
    return out


def unfuse_experts(c, full):
    """transformers >= 5 holds each layer's experts fused: gate_up_proj
    [E, 2I, H] (gate rows first) and down_proj [E, H, I]. Returns `full` in
    the separate-expert naming hf_shapes uses."""
    out = {}
    for name, t in full.items():
        if name.endswith("mlp.experts.gate_up_proj"):
            i = t.shape[1] // 2
            for e in range(t.shape[0]):
                out[f"{name[:-len('gate_up_proj')]}{e}.gate_proj.weight"] = t[e, :i]
                out[f"{name[:-len('gate_up_proj')]}{e}.up_proj.weight"] = t[e, i:]
        elif name.endswith("mlp.experts.down_proj"):
            for e in range(t.shape[0]):
                out[f"{name[:-len('down_proj')]}{e}.down_proj.weight"] = t[e]
        elif name.endswith("mlp.gate.weight") or "experts" not in name:
            out[name] = t
        else:
            raise ValueError(f"unexpected expert tensor {name}")
    return out


def fuse_experts(c, full):
    """The inverse of unfuse_experts: transformers >= 5's naming."""
    out, layers = {}, set()
    for name, t in full.items():
        if ".mlp.experts." not in name:
            out[name] = t
        else:
            layers.add(name[:name.index(".mlp.experts.")])
    for p in sorted(layers):
        ex = [f"{p}.mlp.experts.{e}." for e in range(c["num_experts"])]
        out[f"{p}.mlp.experts.gate_up_proj"] = torch.stack(
            [torch.cat([full[x + "gate_proj.weight"], full[x + "up_proj.weight"]]) for x in ex])
        out[f"{p}.mlp.experts.down_proj"] = torch.stack([full[x + "down_proj.weight"] for x in ex])
    return out


def _rows(t, lo, n):
    return t[lo:lo + n]


def vllm_reference(c, full, tp, r):
    """{vLLM parameter name: TP rank r's tensor} from HF full tensors. The
    vocab-parallel tensors hold only the real rows of the rank's padded slice."""
    h, nh, nkv, hd, v = _dims(c)
    per = -(-v // 64) * 64 // tp
    lo, hi = min(r * per, v), min((r + 1) * per, v)
    out = {"model.embed_tokens.weight": full["model.embed_tokens.weight"][lo:hi],
           "lm_head.weight": full["lm_head.weight"][lo:hi],
           "model.norm.weight": full["model.norm.weight"]}
    qh = nh // tp
    for l in range(c["num_hidden_layers"]):
        p = f"model.layers.{l}."
        a = p + "self_attn."
        if nkv >= tp:
            kv0, kvn = r * (nkv // tp), nkv // tp
        else:
            kv0, kvn = r * nkv // tp, 1
        out[a + "qkv_proj.weight"] = torch.cat([
            _rows(full[a + "q_proj.weight"], r * qh * hd, qh * hd),
            _rows(full[a + "k_proj.weight"], kv0 * hd, kvn * hd),
            _rows(full[a + "v_proj.weight"], kv0 * hd, kvn * hd)])
        out[a + "o_proj.weight"] = full[a + "o_proj.weight"][:, r * qh * hd:(r + 1) * qh * hd]
        for n in ("input_layernorm.weight", "post_attention_layernorm.weight"):
            out[p + n] = full[p + n]
        m = p + "mlp."
        if c["model_type"] == "qwen3_moe":
            out[a + "q_norm.weight"] = full[a + "q_norm.weight"]
            out[a + "k_norm.weight"] = full[a + "k_norm.weight"]
            out[m + "gate.weight"] = full[m + "gate.weight"]
            il = c["moe_intermediate_size"] // tp
            ex = [f"{m}experts.{e}." for e in range(c["num_experts"])]
            out[m + "experts.w13_weight"] = torch.stack([torch.cat([
                _rows(full[x + "gate_proj.weight"], r * il, il),
                _rows(full[x + "up_proj.weight"], r * il, il)]) for x in ex])
            out[m + "experts.w2_weight"] = torch.stack(
                [full[x + "down_proj.weight"][:, r * il:(r + 1) * il] for x in ex])
        else:
            il = c["intermediate_size"] // tp
            out[m + "gate_up_proj.weight"] = torch.cat([
                _rows(full[m + "gate_proj.weight"], r * il, il),
                _rows(full[m + "up_proj.weight"], r * il, il)])
            out[m + "down_proj.weight"] = full[m + "down_proj.weight"][:, r * il:(r + 1) * il]
    return out


def fixture_name(model, size, experts):
    return f"{model}_{size}_vllm_tp{TP}_{experts}.json"
