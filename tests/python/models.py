"""HF config.json contents of the catalog's tiny test models (the same
numbers as catalog/model_config.cc, in Hugging Face's field names)."""
import torch

from wsync import _native

TINY_LLAMA = {"model_type": "llama", "architectures": ["LlamaForCausalLM"], "hidden_size": 64,
              "intermediate_size": 96, "num_hidden_layers": 2, "num_attention_heads": 8,
              "num_key_value_heads": 2, "head_dim": 8, "vocab_size": 100,
              "tie_word_embeddings": False, "torch_dtype": "bfloat16"}
TINY_QWEN3_MOE = {"model_type": "qwen3_moe", "hidden_size": 32, "intermediate_size": 64,
                  "num_hidden_layers": 2, "num_attention_heads": 8, "num_key_value_heads": 2,
                  "head_dim": 4, "vocab_size": 100, "num_experts": 8,
                  "moe_intermediate_size": 16, "decoder_sparse_step": 1, "mlp_only_layers": [],
                  "tie_word_embeddings": False}
TINY_MLA = {"model_type": "deepseek_v3", "architectures": ["DeepseekV3ForCausalLM"],
            "hidden_size": 32, "intermediate_size": 48, "num_hidden_layers": 3,
            "num_attention_heads": 4, "vocab_size": 100, "q_lora_rank": 16, "kv_lora_rank": 8,
            "qk_nope_head_dim": 4, "qk_rope_head_dim": 2, "v_head_dim": 4,
            "n_routed_experts": 8, "moe_intermediate_size": 8, "n_shared_experts": 1,
            "first_k_dense_replace": 1, "moe_layer_freq": 1, "topk_method": "noaux_tc"}
CATALOG_NAME = {"tiny-llama": TINY_LLAMA, "tiny-qwen3-moe": TINY_QWEN3_MOE,
                "tiny-mla": TINY_MLA}


def trainer_tensors(catalog_model, experts="separate"):
    """[(name, shape, info)] of the trainer's tensors for a catalog model."""
    cfg = _native.catalog_model(catalog_model)
    return [(t["name"], t["shape"], t) for t in _native.model_tensors(cfg, experts)]


def dtype_of(info, dtype):
    return torch.float32 if info["keep_fp32"] else dtype
