"""The destination side for vLLM, from a model's Hugging Face config.

    dst = wsync.vllm.destination(hf_config, tp=2)      # TransferSpec: side + mappings
    spec = wsync.layouts.transfer_spec(src_side, dst)

The layouts come from the C++ catalog's vLLM builders (wsync._native): fused
qkv_proj with GQA kv-head replication (and Qwen2's fused qkv bias),
gate_up_proj, FusedMoE w13/w2 stacked experts (TP or EP), padded vocab, MLA
fused_qkv_a_proj, block-fp8 with weight_scale_inv. The mappings name the
trainer's tensors in HF naming.
"""
from wsync import dtypes
from wsync._proto import layout_pb2

_GQA = ("llama", "mistral", "qwen2", "qwen3", "qwen3_moe")
_MLA = ("deepseek_v3", "kimi_k2")
_ARCH = {"LlamaForCausalLM": "llama", "MistralForCausalLM": "mistral",
         "Qwen2ForCausalLM": "qwen2", "Qwen3ForCausalLM": "qwen3",
         "Qwen3MoeForCausalLM": "qwen3_moe", "DeepseekV3ForCausalLM": "deepseek_v3",
         "KimiK2ForCausalLM": "kimi_k2"}


def _native():
    try:
        from wsync import _native
    except ImportError as e:  # pragma: no cover - depends on the build
        raise ImportError("wsync._native (the catalog's layout builders) is not built: build "
                          "with pybind11-dev installed (WSYNC_BUILD_PYTHON=ON)") from e
    return _native


def _as_dict(config):
    if hasattr(config, "to_dict"):
        return config.to_dict()
    return dict(config)


def model_type(config):
    c = _as_dict(config)
    t = c.get("model_type")
    if t in _GQA + _MLA:
        return t
    for arch in c.get("architectures") or []:
        if arch in _ARCH:
            return _ARCH[arch]
    raise ValueError(f"unsupported model_type {t!r} (architectures {c.get('architectures')}); "
                     f"supported: {', '.join(_GQA + _MLA)}")


def _need(c, key, what):
    if c.get(key) is None:
        raise ValueError(f"{what} config: {key!r} is missing")
    return int(c[key])


def _gqa(c, kind):
    heads = _need(c, "num_attention_heads", kind)
    hidden = _need(c, "hidden_size", kind)
    m = {"attention": "gqa", "hidden": hidden, "num_layers": _need(c, "num_hidden_layers", kind),
         "num_heads": heads, "num_kv_heads": int(c.get("num_key_value_heads") or heads),
         "head_dim": int(c.get("head_dim") or hidden // heads),
         "vocab": _need(c, "vocab_size", kind),
         "intermediate": int(c.get("intermediate_size") or 0),
         "qk_norm": kind in ("qwen3", "qwen3_moe")}
    if kind == "qwen3_moe":
        if int(c.get("decoder_sparse_step", 1)) != 1 or c.get("mlp_only_layers"):
            raise ValueError("qwen3_moe config: only decoder_sparse_step 1 without "
                             "mlp_only_layers (every layer MoE) is supported")
        # Every layer is MoE: the dense width (intermediate_size) is unused.
        m.update(intermediate=0, num_experts=_need(c, "num_experts", kind),
                 moe_intermediate=_need(c, "moe_intermediate_size", kind))
    if kind != "qwen2" and (c.get("attention_bias") or c.get("mlp_bias")):
        raise ValueError(f"{kind} config: attention_bias / mlp_bias are not supported")
    return m


def _mla(c, kind):
    if c.get("q_lora_rank") is None:
        raise ValueError(f"{kind} config: q_lora_rank null (no q LoRA, DeepSeek-V2-Lite style) "
                         "is not supported")
    if int(c.get("moe_layer_freq", 1)) != 1:
        raise ValueError(f"{kind} config: moe_layer_freq other than 1 is not supported")
    return {"attention": "mla", "hidden": _need(c, "hidden_size", kind),
            "intermediate": _need(c, "intermediate_size", kind),
            "num_layers": _need(c, "num_hidden_layers", kind),
            "num_heads": _need(c, "num_attention_heads", kind),
            "vocab": _need(c, "vocab_size", kind), "q_lora_rank": int(c["q_lora_rank"]),
            "kv_lora_rank": _need(c, "kv_lora_rank", kind),
            "qk_nope_head_dim": _need(c, "qk_nope_head_dim", kind),
            "qk_rope_head_dim": _need(c, "qk_rope_head_dim", kind),
            "v_head_dim": _need(c, "v_head_dim", kind),
            "num_experts": int(c.get("n_routed_experts") or 0),
            "moe_intermediate": int(c.get("moe_intermediate_size") or 0),
            "num_shared_experts": int(c.get("n_shared_experts") or 0),
            "first_dense_layers": int(c.get("first_k_dense_replace") or 0),
            "router_bias": c.get("topk_method", "noaux_tc") == "noaux_tc"}


def model_config(config):
    """(catalog ModelConfig dict, extras) of an HF config (dict or
    transformers PretrainedConfig). Extras: qkv_bias, tie_word_embeddings,
    fp8_block (from quantization_config: fp8 with weight_block_size [128, 128])."""
    c = _as_dict(config)
    kind = model_type(c)
    m = _gqa(c, kind) if kind in _GQA else _mla(c, kind)
    m["name"] = c.get("_name_or_path") or kind
    q = c.get("quantization_config") or {}
    fp8 = q.get("quant_method") == "fp8" and list(q.get("weight_block_size") or []) == [128, 128]
    extras = {"qkv_bias": kind == "qwen2",
              "tie_word_embeddings": bool(c.get("tie_word_embeddings", False)),
              "fp8_block": fp8}
    return m, extras


def destination(config, tp, *, replicas=1, expert_parallel=False, dtype=None,
                experts="separate", fp8_block=None, name="inference"):
    """A TransferSpec holding vLLM's destination side (explicit fragments; ranks
    left for the controller to fill: rank = replica * tp + tp_rank) and the
    mappings from the trainer's HF-named tensors. `experts`: how the trainer
    holds MoE experts ("separate" HF tensors or "stacked" [E, ...]). `dtype`:
    vLLM's dtype (default: the config's torch_dtype, else bf16). `fp8_block`:
    default from the config's quantization_config."""
    m, extras = model_config(config)
    if fp8_block is not None:
        extras["fp8_block"] = bool(fp8_block)
    if dtype is None:
        dtype = _as_dict(config).get("torch_dtype") or "bf16"
    spec = layout_pb2.TransferSpec.FromString(_native().vllm_destination(
        m, tp, replicas=replicas, expert_parallel=expert_parallel,
        dtype=dtypes.name(dtype), experts=experts, **extras))
    spec.destination.name = name
    return spec
