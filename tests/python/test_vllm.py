"""vLLM destination layouts from HF configs (wsync.vllm over wsync._native)
equal the C++ catalog's (wsyncctl catalog) for the same model and TP/EP; the
HF-only features (Qwen2 qkv bias, tied embeddings, fp8 quantization_config)
and config errors."""
import pytest

from wsync import _native, layouts, vllm

from catalog_specs import tensors_by_name, wsyncctl_spec
from models import CATALOG_NAME, TINY_LLAMA, TINY_MLA

# huggingface.co/meta-llama/Meta-Llama-3-8B/blob/main/config.json (no head_dim:
# hidden / heads).
LLAMA3_8B = {"architectures": ["LlamaForCausalLM"], "model_type": "llama",
             "hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32,
             "num_attention_heads": 32, "num_key_value_heads": 8, "vocab_size": 128256,
             "tie_word_embeddings": False, "torch_dtype": "bfloat16", "attention_bias": False,
             "mlp_bias": False, "rope_theta": 500000.0}


# huggingface.co/moonshotai/Kimi-K2-Instruct/blob/main/config.json (fp8 block checkpoint).
KIMI_K2 = {"architectures": ["DeepseekV3ForCausalLM"], "model_type": "kimi_k2",
           "hidden_size": 7168, "intermediate_size": 18432, "moe_intermediate_size": 2048,
           "num_hidden_layers": 61, "num_attention_heads": 64, "n_routed_experts": 384,
           "n_shared_experts": 1, "first_k_dense_replace": 1, "moe_layer_freq": 1,
           "q_lora_rank": 1536, "kv_lora_rank": 512, "qk_nope_head_dim": 128,
           "qk_rope_head_dim": 64, "v_head_dim": 128, "vocab_size": 163840,
           "topk_method": "noaux_tc", "tie_word_embeddings": False, "torch_dtype": "bfloat16",
           "quantization_config": {"activation_scheme": "dynamic", "fmt": "e4m3",
                                   "quant_method": "fp8", "weight_block_size": [128, 128]}}


def assert_same_destination(spec, want):
    got_t, want_t = tensors_by_name(spec.destination), tensors_by_name(want.destination)
    assert list(got_t) == list(want_t)
    for name in want_t:
        assert got_t[name] == want_t[name], name
    assert list(spec.mappings) == list(want.mappings)


@pytest.mark.parametrize("model,dest,experts", [
    ("tiny-llama", "vllm-tp:1", "separate"), ("tiny-llama", "vllm-tp:2x2", "separate"),
    ("tiny-llama", "vllm-tp:4", "separate"), ("tiny-qwen3-moe", "vllm-tp:2", "separate"),
    ("tiny-qwen3-moe", "vllm-tp:2,ep", "stacked"), ("tiny-mla", "vllm-tp:2", "separate"),
    ("tiny-mla", "vllm-tp:4,ep", "stacked")])
def test_hf_config_matches_catalog(model, dest, experts):
    tp_rep, _, ep = dest[len("vllm-tp:"):].partition(",")
    tp, _, rep = tp_rep.partition("x")
    spec = vllm.destination(CATALOG_NAME[model], tp=int(tp), replicas=int(rep or 1),
                            expert_parallel=bool(ep), experts=experts)
    want = wsyncctl_spec("--model", model, "--source", "fsdp:2", "--destination", dest,
                         "--experts", experts)
    assert_same_destination(spec, want)
    assert spec.destination.name == "inference"


def test_hf_config_fields_match_catalog_models():
    for model, hf in CATALOG_NAME.items():
        got, _ = vllm.model_config(hf)
        want = _native.catalog_model(model)
        for k, v in got.items():
            if k != "name":
                assert want[k] == v, f"{model}: {k}"


def test_real_llama3_8b_config_matches_catalog():
    spec = vllm.destination(LLAMA3_8B, tp=8)
    want = wsyncctl_spec("--model", "llama3-8b", "--source", "fsdp:8", "--destination",
                         "vllm-tp:8")
    assert_same_destination(spec, want)


def test_real_kimi_k2_fp8_config_matches_catalog():
    spec = vllm.destination(KIMI_K2, tp=8, expert_parallel=True, experts="stacked")
    want = wsyncctl_spec("--model", "kimi-k2", "--source", "megatron:tp8,dp2,ep2",
                         "--destination", "vllm-tp:8,ep", "--experts", "stacked", "--fp8-block")
    assert_same_destination(spec, want)


def test_fp8_block_from_quantization_config():
    cfg = dict(TINY_MLA, hidden_size=256, intermediate_size=256, moe_intermediate_size=128,
               q_lora_rank=128, kv_lora_rank=128, num_hidden_layers=2,
               quantization_config={"quant_method": "fp8", "weight_block_size": [128, 128]})
    spec = vllm.destination(cfg, tp=1)
    t = tensors_by_name(spec.destination)
    w = t["model.layers.0.mlp.down_proj.weight"]
    assert w.dtype == layouts.layout_pb2.FP8_E4M3
    assert w.block_quantization.scale_tensor == "model.layers.0.mlp.down_proj.weight_scale_inv"
    assert "model.layers.0.mlp.down_proj.weight_scale_inv" in t
    assert t["model.embed_tokens.weight"].dtype == layouts.layout_pb2.BF16
    plain = vllm.destination(cfg, tp=1, fp8_block=False)
    assert tensors_by_name(plain.destination)["model.layers.0.mlp.down_proj.weight"].dtype == \
        layouts.layout_pb2.BF16


def test_qwen2_bias_and_tied_embeddings():
    cfg = dict(TINY_LLAMA, model_type="qwen2", tie_word_embeddings=True)
    spec = vllm.destination(cfg, tp=4)
    t = tensors_by_name(spec.destination)
    assert "lm_head.weight" not in t
    assert all(m.dst != "lm_head.weight" for m in spec.mappings)
    bias = t["model.layers.1.self_attn.qkv_proj.bias"]
    weight = t["model.layers.1.self_attn.qkv_proj.weight"]
    assert list(bias.shape) == [weight.shape[0]]
    # rank 3 of TP 4 over 2 kv heads: q heads 6-7, kv head 1 (replicated on ranks 2, 3).
    src = [(m.src, list(m.src_box.offset), list(m.src_box.length), list(m.dst_offset))
           for m in spec.mappings if m.dst == bias.name and m.dst_offset[0] >= 3 * 32]
    p = "model.layers.1.self_attn."
    assert src == [(p + "q_proj.bias", [48], [16], [96]), (p + "k_proj.bias", [8], [8], [112]),
                   (p + "v_proj.bias", [8], [8], [120])]


def test_transformers_style_config_object():
    class Config:
        def to_dict(self):
            return dict(TINY_LLAMA)
    assert vllm.destination(Config(), tp=2) == vllm.destination(TINY_LLAMA, tp=2)


@pytest.mark.parametrize("cfg,match", [
    ({"model_type": "gpt2"}, "unsupported model_type 'gpt2'"),
    (dict(TINY_LLAMA, num_attention_heads=6), "do(es)? not divide"),
    (dict(TINY_LLAMA, attention_bias=True), "attention_bias"),
    ({k: v for k, v in TINY_LLAMA.items() if k != "vocab_size"}, "'vocab_size' is missing"),
    (dict(TINY_MLA, q_lora_rank=None), "q_lora_rank null")])
def test_config_errors(cfg, match):
    with pytest.raises(ValueError, match=match):
        vllm.destination(cfg, tp=4)
