"""wsync.megatron on a DeepSeek-V3-shaped model (multi-latent attention,
a dense first layer, routed experts with a router bias, a shared expert).

The Megatron ranks are built here from the catalog's HF tensors the way
Megatron-core holds them: MLASelfAttention with duplicated down projections
and local-spec norms on layer 0, FusedMLASelfAttention with TE-fused norms
and linear_qkv_down_proj = [q_a_proj; kv_a_proj_with_mqa] (split over TP
where its rows divide) on the others; up projections and linear_proj split
over TP; expert and shared-expert fc1 as [gate_r; up_r]. The derived side is
read back element by element and synced into vLLM's TP=2 layout (fused_qkv_a_proj,
gate_up_proj, FusedMoE) through real processes."""
import pytest
import torch

from wsync import _native, layouts, megatron, vllm

from megatron_ranks import assert_hf_tensors, gated_fc1, sync_into_vllm, tp_param
from models import TINY_MLA

CFG = _native.catalog_model("tiny-mla")


def hf_tensors(seed=0):
    g = torch.Generator().manual_seed(seed)
    return {t["name"]: torch.randn(*t["shape"], generator=g)
            for t in _native.model_tensors(CFG, "separate")}


def attention(full, p, m, fused, tp, r):
    """Layer `p`'s MLA tensors under Megatron names (prefix `m`)."""
    a, out = p + "self_attn.", {}
    q_a, kv_a = full[a + "q_a_proj.weight"], full[a + "kv_a_proj_with_mqa.weight"]
    if fused:
        down = torch.cat([q_a, kv_a])
        split = down.shape[0] % tp == 0
        out[m + "self_attention.linear_qkv_down_proj.weight"] = tp_param(
            down, 0 if split else None, tp, r)
        out[m + "self_attention.linear_qkv_down_proj.layer_norm_weight"] = tp_param(
            full[p + "input_layernorm.weight"], None, tp, r)
        out[m + "self_attention.linear_q_up_proj.layer_norm_weight"] = tp_param(
            full[a + "q_a_layernorm.weight"], None, tp, r)
        out[m + "self_attention.linear_kv_up_proj.layer_norm_weight"] = tp_param(
            full[a + "kv_a_layernorm.weight"], None, tp, r)
    else:  # TELinear parallel_mode="duplicated": every rank holds them whole
        out[m + "input_layernorm.weight"] = full[p + "input_layernorm.weight"].clone()
        out[m + "self_attention.linear_q_down_proj.weight"] = tp_param(q_a, None, tp, r)
        out[m + "self_attention.linear_kv_down_proj.weight"] = tp_param(kv_a, None, tp, r)
        out[m + "self_attention.q_layernorm.weight"] = full[a + "q_a_layernorm.weight"].clone()
        out[m + "self_attention.kv_layernorm.weight"] = full[a + "kv_a_layernorm.weight"].clone()
    out[m + "self_attention.linear_q_up_proj.weight"] = tp_param(full[a + "q_b_proj.weight"], 0,
                                                                 tp, r)
    out[m + "self_attention.linear_kv_up_proj.weight"] = tp_param(full[a + "kv_b_proj.weight"],
                                                                  0, tp, r)
    out[m + "self_attention.linear_proj.weight"] = tp_param(full[a + "o_proj.weight"], 1, tp, r)
    return out


def mlp(full, p, m, tp, r, ep, ep_rank):
    out = {m + "pre_mlp_layernorm.weight": full[p + "post_attention_layernorm.weight"].clone()}
    if p + "mlp.gate_proj.weight" in full:  # dense layer
        out[m + "mlp.linear_fc1.weight"] = gated_fc1(full[p + "mlp.gate_proj.weight"],
                                                     full[p + "mlp.up_proj.weight"], tp, r)
        out[m + "mlp.linear_fc2.weight"] = tp_param(full[p + "mlp.down_proj.weight"], 1, tp, r)
        return out
    out[m + "mlp.router.weight"] = tp_param(full[p + "mlp.gate.weight"], None, tp, r)
    out[m + "mlp.router.expert_bias"] = full[p + "mlp.gate.e_score_correction_bias"].clone()
    s = p + "mlp.shared_experts."
    out[m + "mlp.shared_experts.linear_fc1.weight"] = gated_fc1(
        full[s + "gate_proj.weight"], full[s + "up_proj.weight"], tp, r)
    out[m + "mlp.shared_experts.linear_fc2.weight"] = tp_param(full[s + "down_proj.weight"], 1,
                                                               tp, r)
    local = CFG["num_experts"] // ep
    for j in range(local):
        e = f"{p}mlp.experts.{ep_rank * local + j}."
        fc1 = gated_fc1(full[e + "gate_proj.weight"], full[e + "up_proj.weight"], tp, r,
                        expert=True)
        fc2 = tp_param(full[e + "down_proj.weight"], 1, tp, r)
        fc2.allreduce = False
        out[m + f"mlp.experts.linear_fc1.weight{j}"] = fc1
        out[m + f"mlp.experts.linear_fc2.weight{j}"] = fc2
    return out


def megatron_params(full, tp, r, ep, ep_rank):
    out = {"embedding.word_embeddings.weight": tp_param(full["model.embed_tokens.weight"], 0,
                                                        tp, r),
           "output_layer.weight": tp_param(full["lm_head.weight"], 0, tp, r),
           "decoder.final_layernorm.weight": full["model.norm.weight"].clone()}
    for i in range(CFG["num_layers"]):
        p, m = f"model.layers.{i}.", f"decoder.layers.{i}."
        out.update(attention(full, p, m, fused=i > 0, tp=tp, r=r))
        out.update(mlp(full, p, m, tp, r, ep, ep_rank))
    return out


def derive(full, tp, dp=1, ep=1):
    cfg = megatron.Config(CFG["num_heads"], 0, num_moe_experts=CFG["num_experts"],
                          multi_latent_attention=True, q_lora_rank=CFG["q_lora_rank"])
    per_rank, bufs = [], {}
    for rank in range(tp * dp):
        tp_rank, ep_rank = rank % tp, (rank // tp) % ep
        params = megatron_params(full, tp, tp_rank, ep, ep_rank)
        meg = layouts.Megatron(tp_rank, tp, ep_rank=ep_rank, ep_size=ep)
        per_rank.append(megatron.describe(params.items(), rank=rank, megatron=meg, config=cfg))
        bufs[rank] = megatron.buffers(params.items())
    return layouts.source_side(per_rank), bufs


@pytest.mark.parametrize("tp,dp,ep", [(1, 1, 1), (2, 1, 1), (4, 1, 1), (2, 2, 2)])
def test_mla_moe_reads_back_as_hf_tensors(tp, dp, ep):
    full = hf_tensors()
    side, bufs = derive(full, tp, dp, ep)
    assert_hf_tensors(side, bufs, full)


def test_fused_down_projection_boxes():
    # TP=2: rank 0 holds rows 0-12 of [q_a (16); kv_a (10)], rank 1 rows 13-25.
    side, _ = derive(hf_tensors(), 2)
    by_name = {t.name: t for t in side.tensors}
    got = []
    for part in ("q_a_proj", "kv_a_proj_with_mqa"):
        for f in by_name[f"model.layers.1.self_attn.{part}.weight"].fragments.fragments:
            assert f.buffer == "decoder.layers.1.self_attention.linear_qkv_down_proj.weight"
            got.append((part, f.rank, f.box.offset[0], f.box.length[0], f.byte_offset))
    row = CFG["hidden"] * 4  # fp32 bytes per row
    assert got == [("q_a_proj", 0, 0, 13, 0), ("q_a_proj", 1, 13, 3, 0),
                   ("kv_a_proj_with_mqa", 1, 0, 10, 3 * row)]


def test_fused_down_projection_needs_q_lora_rank():
    params = megatron_params(hf_tensors(), 1, 0, 1, 0)
    with pytest.raises(ValueError, match="linear_qkv_down_proj.weight'.*q_lora_rank"):
        megatron.describe(params.items(), rank=0, megatron=layouts.Megatron(0, 1),
                          config=megatron.Config(CFG["num_heads"], 0,
                                                 multi_latent_attention=True))


def test_mla_megatron_trainer_syncs_into_vllm(cluster):
    full = hf_tensors(seed=3)
    side, bufs = derive(full, 2)
    spec = layouts.transfer_spec(side, vllm.destination(TINY_MLA, tp=2, dtype="bf16"),
                                 name="mla")
    sync_into_vllm(cluster, spec, bufs, full, vtp=2)
