"""Megatron-core's fused tensors as a wsync source (wsync.megatron).

Each rank's Megatron parameters are built here from known Hugging Face
tensors by an independent transform (Megatron's own checkpoint converters:
tools/checkpoint loader_mixtral_hf.set_attn_state interleaves q/k/v per query
group, saver_base chunks the result over TP and concatenates each rank's gate
and up chunks). The derived source side is then evaluated element by element
(every fragment / mesh shard read back out of the rank's buffers per
docs/layout-spec.md) and must give back exactly the HF tensors, covering
every element; the mappings of vLLM's destination must find those tensors.
End to end, a Megatron TP=4 trainer with GQA, qkv bias and a padded
vocabulary syncs into vLLM's TP=2 layout through real wsync processes."""
import pytest
import torch

import wsync
import wsync.torch
from wsync import layouts, megatron, vllm
from wsync._proto import layout_pb2

from harness import expected_destination
from megatron_ranks import assert_hf_tensors, gated_fc1, interleave_qkv, tp_param
from models import TINY_LLAMA

HIDDEN = 16
VOCAB = 32  # divisible by tp: Megatron pads it so (see the padded case)


def hf_config(heads, groups, head_dim=4, layers=2, inter=24, kind="llama", experts=0):
    c = {"model_type": kind, "hidden_size": HIDDEN, "intermediate_size": inter,
         "num_hidden_layers": layers, "num_attention_heads": heads,
         "num_key_value_heads": groups, "head_dim": head_dim, "vocab_size": VOCAB,
         "tie_word_embeddings": False}
    if experts:
        c.update(num_experts=experts, moe_intermediate_size=inter)
    return c


def hf_tensors(c, seed=0):
    """{HF name: tensor} of a Llama / Qwen2 / Qwen3(-MoE)-shaped model."""
    g = torch.Generator().manual_seed(seed)
    h, hd = c["hidden_size"], c["head_dim"]
    q, kv = c["num_attention_heads"] * hd, c["num_key_value_heads"] * hd
    shapes = {"model.embed_tokens.weight": [c["vocab_size"], h], "model.norm.weight": [h],
              "lm_head.weight": [c["vocab_size"], h]}
    for i in range(c["num_hidden_layers"]):
        p = f"model.layers.{i}."
        shapes.update({p + "input_layernorm.weight": [h],
                       p + "post_attention_layernorm.weight": [h],
                       p + "self_attn.q_proj.weight": [q, h],
                       p + "self_attn.k_proj.weight": [kv, h],
                       p + "self_attn.v_proj.weight": [kv, h],
                       p + "self_attn.o_proj.weight": [h, q]})
        if c["model_type"] == "qwen2":
            shapes.update({p + "self_attn.q_proj.bias": [q], p + "self_attn.k_proj.bias": [kv],
                           p + "self_attn.v_proj.bias": [kv]})
        if c["model_type"] in ("qwen3", "qwen3_moe"):
            shapes.update({p + "self_attn.q_norm.weight": [hd],
                           p + "self_attn.k_norm.weight": [hd]})
        mlps = ([f"{p}mlp.experts.{e}." for e in range(c["num_experts"])]
                if c.get("num_experts") else [p + "mlp."])
        if c.get("num_experts"):
            shapes[p + "mlp.gate.weight"] = [c["num_experts"], h]
        inter = c.get("moe_intermediate_size") or c["intermediate_size"]
        for m in mlps:
            shapes.update({m + "gate_proj.weight": [inter, h], m + "up_proj.weight": [inter, h],
                           m + "down_proj.weight": [h, inter]})
    return {n: torch.randn(*s, generator=g) for n, s in shapes.items()}


def megatron_params(full, c, tp, tp_rank, ep=1, ep_rank=0, padded_vocab=None):
    """One rank's parameters as Megatron-core (TE spec) names and holds them."""
    groups = c["num_key_value_heads"]
    out = {}
    emb = full["model.embed_tokens.weight"]
    head = full["lm_head.weight"]
    if padded_vocab:  # Megatron pads the vocabulary; padding rows must not be synced
        pad = torch.full((padded_vocab - emb.shape[0], emb.shape[1]), 1e6)
        emb, head = torch.cat([emb, pad]), torch.cat([head, pad])
    out["embedding.word_embeddings.weight"] = tp_param(emb, 0, tp, tp_rank)
    out["output_layer.weight"] = tp_param(head, 0, tp, tp_rank)
    out["decoder.final_layernorm.weight"] = full["model.norm.weight"].clone()  # no attributes
    for i in range(c["num_hidden_layers"]):
        p, m = f"model.layers.{i}.", f"decoder.layers.{i}."
        a = p + "self_attn."
        out[m + "self_attention.linear_qkv.layer_norm_weight"] = tp_param(
            full[p + "input_layernorm.weight"], None, tp, tp_rank)
        out[m + "self_attention.linear_qkv.weight"] = tp_param(interleave_qkv(
            full[a + "q_proj.weight"], full[a + "k_proj.weight"], full[a + "v_proj.weight"],
            groups), 0, tp, tp_rank)
        if a + "q_proj.bias" in full:
            out[m + "self_attention.linear_qkv.bias"] = tp_param(interleave_qkv(
                full[a + "q_proj.bias"], full[a + "k_proj.bias"], full[a + "v_proj.bias"],
                groups), 0, tp, tp_rank)
        if a + "q_norm.weight" in full:
            out[m + "self_attention.q_layernorm.weight"] = full[a + "q_norm.weight"].clone()
            out[m + "self_attention.k_layernorm.weight"] = full[a + "k_norm.weight"].clone()
        out[m + "self_attention.linear_proj.weight"] = tp_param(full[a + "o_proj.weight"], 1, tp,
                                                                tp_rank)
        out[m + "pre_mlp_layernorm.weight"] = full[p + "post_attention_layernorm.weight"].clone()
        experts = c.get("num_experts", 0)
        if experts:
            out[m + "mlp.router.weight"] = tp_param(full[p + "mlp.gate.weight"], None, tp, tp_rank)
            local = experts // ep
            for j in range(local):
                e = f"{p}mlp.experts.{ep_rank * local + j}."
                # Alternate SequentialMLP and TEGroupedMLP names.
                fc1, fc2 = ((f"mlp.experts.local_experts.{j}.linear_fc1.weight",
                             f"mlp.experts.local_experts.{j}.linear_fc2.weight") if j % 2 == 0
                            else (f"mlp.experts.linear_fc1.weight{j}",
                                  f"mlp.experts.linear_fc2.weight{j}"))
                out[m + fc1] = gated_fc1(full[e + "gate_proj.weight"], full[e + "up_proj.weight"],
                                         tp, tp_rank, expert=True)
                out[m + fc2] = tp_param(full[e + "down_proj.weight"], 1, tp, tp_rank)
                out[m + fc2].allreduce = False
        else:
            out[m + "mlp.linear_fc1.weight"] = gated_fc1(
                full[p + "mlp.gate_proj.weight"], full[p + "mlp.up_proj.weight"], tp, tp_rank)
            out[m + "mlp.linear_fc2.weight"] = tp_param(full[p + "mlp.down_proj.weight"], 1, tp,
                                                        tp_rank)
    return out


def derive(full, c, tp, dp=1, ep=1, padded_vocab=None):
    """(side, {rank: {buffer: tensor}}) for Megatron ranks tp x dp (ep over dp)."""
    cfg = megatron.Config(c["num_attention_heads"], c["head_dim"],
                          num_query_groups=c["num_key_value_heads"],
                          num_moe_experts=c.get("num_experts", 0),
                          vocab_size=c["vocab_size"] if padded_vocab else None)
    per_rank, bufs = [], {}
    for rank in range(tp * dp):
        tp_rank, dp_rank = rank % tp, rank // tp
        ep_rank = dp_rank % ep
        params = megatron_params(full, c, tp, tp_rank, ep, ep_rank, padded_vocab)
        meg = layouts.Megatron(tp_rank, tp, ep_rank=ep_rank, ep_size=ep)
        per_rank.append(megatron.describe(params.items(), rank=rank, megatron=meg, config=cfg))
        bufs[rank] = megatron.buffers(params.items())
    return layouts.source_side(per_rank), bufs


@pytest.mark.parametrize("tp", [1, 2, 4])
@pytest.mark.parametrize("heads,groups", [(8, 2), (8, 8), (8, 1), (12, 4)])
def test_fused_qkv_and_gate_up_read_back_as_hf_tensors(tp, heads, groups):
    if groups % tp and tp % groups:
        pytest.skip("Megatron-core refuses this split (test_tp_not_dividing_groups)")
    c = hf_config(heads, groups, kind="qwen2")  # qkv bias too
    full = hf_tensors(c)
    side, bufs = derive(full, c, tp)
    assert_hf_tensors(side, bufs, full)
    # One box per k head: each lies whole in one rank's shard (with fewer
    # groups than ranks, a group's q heads are split over ranks instead).
    k = {t.name: t for t in side.tensors}["model.layers.0.self_attn.k_proj.weight"]
    assert len(k.fragments.fragments) == groups


def test_replicas_padded_vocab_and_vllm_mappings():
    c = dict(hf_config(8, 2), vocab_size=30)
    full = hf_tensors(c)
    side, bufs = derive(full, c, tp=2, dp=2, padded_vocab=32)
    assert_hf_tensors(side, bufs, full)
    emb = {t.name: t for t in side.tensors}["model.embed_tokens.weight"]
    assert sorted((f.rank, f.box.offset[0], f.box.length[0]) for f in emb.fragments.fragments) == [
        (0, 0, 16), (1, 16, 14), (2, 0, 16), (3, 16, 14)]
    # Every mapping of vLLM's TP=2 destination reads inside a source tensor.
    spec = layouts.transfer_spec(side, vllm.destination(c, tp=2))
    shapes = {t.name: list(t.shape) for t in side.tensors}
    for m in spec.mappings:
        assert m.src in shapes, m.src
        assert all(o + n <= s for o, n, s in zip(m.src_box.offset, m.src_box.length,
                                                 shapes[m.src])), m
    for t in spec.destination.tensors:
        if not any(m.dst == t.name for m in spec.mappings):
            assert shapes[t.name] == list(t.shape), t.name


def test_moe_experts_over_expert_parallel_ranks():
    c = hf_config(8, 2, kind="qwen3_moe", experts=4, inter=8)
    full = hf_tensors(c)
    side, bufs = derive(full, c, tp=2, dp=2, ep=2)
    assert_hf_tensors(side, bufs, full)


def test_layer_offset_from_the_pipeline_stage():
    c = hf_config(4, 2, layers=1)
    params = megatron_params(hf_tensors(c), c, 1, 0)

    class Inner(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.decoder = torch.nn.Module()
            self.decoder.layers = torch.nn.ModuleList([torch.nn.Module()])
            self.decoder.layers[0].layer_number = 4

    class Stage(torch.nn.Module):
        """Pipeline stage 2 of 2 wrapped as DDP wraps it (module.decoder...,
        for parameters and modules alike): its local layer 0 is global layer
        3 (TransformerLayer.layer_number is 1-based, global)."""

        def __init__(self):
            super().__init__()
            self.module = Inner()

        def named_parameters(self):
            return [("module." + n, t) for n, t in params.items() if n.startswith("decoder.l")]

    cfg = megatron.Config(4, 4, num_query_groups=2)
    stage2 = layouts.Megatron(0, 1, pp_rank=1)
    names = {r["name"] for r in megatron.describe(Stage(), rank=0, megatron=stage2, config=cfg)}
    assert "model.layers.3.self_attn.q_proj.weight" in names
    assert "model.layers.3.mlp.up_proj.weight" in names
    assert not any(".layers.0." in n for n in names)
    # Review finding: a later stage whose layers cannot be placed was silently
    # mapped onto layers 0.. of the first stage.
    with pytest.raises(ValueError, match="pipeline stage 1.*layer_offset"):
        megatron.describe(params.items(), rank=0, megatron=stage2, config=cfg)
    explicit = megatron.describe(params.items(), rank=0, megatron=layouts.Megatron(0, 1),
                                 config=cfg, layer_offset=5)
    assert "model.layers.5.input_layernorm.weight" in {r["name"] for r in explicit}


def test_hf_names():
    assert megatron.hf_name("decoder.layers.2.mlp.experts.linear_fc2.weight3",
                            layer_offset=1, expert_offset=4) == (
        "plain", "model.layers.3.mlp.experts.7.down_proj.weight")
    assert megatron.hf_name("decoder.layers.0.self_attention.linear_qkv.bias") == (
        "qkv", "model.layers.0.self_attn.|bias")
    with pytest.raises(ValueError, match="'decoder.layers.0.mlp.shared_experts.gate_weight'"):
        megatron.hf_name("decoder.layers.0.mlp.shared_experts.gate_weight")
    with pytest.raises(ValueError, match="no Hugging Face name"):
        megatron.hf_name("vision_model.patch_embed.weight")


def test_tp_not_dividing_the_query_groups_is_refused():
    c = hf_config(6, 3)
    full = hf_tensors(c)
    with pytest.raises(ValueError, match="linear_qkv.weight'.*tensor-parallel size 2 and "
                                         "num_query_groups 3"):
        derive(full, c, tp=2)
    # A shard whose rows do not match the config names the expected count.
    cfg = megatron.Config(8, 4, num_query_groups=2)
    t = tp_param(torch.zeros(10, HIDDEN), 0, 1, 0)
    with pytest.raises(ValueError, match=r"local rows 10 x tp 2 = 20, expected num_query_groups 2 "
                                         r"x \(q_per_group 4 \+ 2\) x head_dim 4 = 48"):
        megatron.qkv_records("x.linear_qkv.weight", t, rank=0, megatron=layouts.Megatron(0, 2),
                             config=cfg, prefix="p.", suffix="weight")
    with pytest.raises(ValueError,
                       match="num_query_groups 3 does not divide num_attention_heads 8"):
        megatron.Config(8, 4, num_query_groups=3)


def test_megatron_trainer_syncs_into_vllm_and_hf_layouts(cluster):
    """Megatron TP=4 (GQA: 2 query groups split over 4 ranks; qkv bias; padded
    vocabulary) -> vLLM TP=2 (qkv_proj, gate_up_proj), and -> one rank holding
    the HF tensors as they are, through real wsync processes; every
    destination element checked against the HF tensors."""
    tp, vtp = 4, 2
    c = dict(TINY_LLAMA, model_type="qwen2", architectures=["Qwen2ForCausalLM"])
    c.pop("torch_dtype")
    full = hf_tensors(c, seed=1)
    side, bufs = derive(full, c, tp, padded_vocab=128)
    spec = layouts.transfer_spec(side, vllm.destination(c, tp=vtp, dtype="bf16"), name="meg")
    hf_side = layouts.source_side(layouts.describe(full.items(), rank=0), name="hf")
    hf_spec = layouts.transfer_spec(side, layout_pb2.TransferSpec(destination=hf_side),
                                    name="meg-hf")
    socks = {}
    for r in range(tp):
        socks[("trainer", r)] = cluster.worker(f"trainer:{r}:{tp}")
    for r in range(vtp):
        socks[("inference", r)] = cluster.worker(f"inference:{r}:{vtp}")
    socks[("hf", 0)] = cluster.worker("hf:0:1")
    regs = [wsync.torch.register(bufs[r], group="trainer", rank=r, socket=socks[("trainer", r)])
            for r in range(tp)]
    receivers = []
    for r in range(vtp):
        dst = {b: torch.zeros(n, dtype=torch.bfloat16)
               for b, (_, n) in layouts.local_buffers(spec.destination, r).items()}
        receivers.append(wsync.torch.register(dst, group="inference", rank=r,
                                              socket=socks[("inference", r)]))
    hf = wsync.torch.register({n: torch.zeros(t.numel()) for n, t in full.items()}, group="hf",
                              rank=0, socket=socks[("hf", 0)])
    client = wsync.Client(cluster.address, timeout=20)
    client.wait_for_workers({"trainer": tp, "inference": vtp, "hf": 1}, timeout=30,
                            buffers=True)
    client.define_transfer("meg", spec)
    client.define_transfer("meg-hf", hf_spec, destination_group="hf")
    client.sync(1, transfer="meg").wait(timeout=60)
    client.sync(1, transfer="meg-hf").wait(timeout=60)
    for r, reg in enumerate(receivers):
        want = expected_destination(spec, full, r, torch.bfloat16)
        for buf, values in want.items():
            got = reg.tensors[buf].flatten()[:values.numel()]
            assert torch.equal(got, values), f"inference rank {r} buffer {buf}"
    for name, t in full.items():
        assert torch.equal(hf.tensors[name], t.flatten()), name
    for reg in regs + receivers + [hf]:
        reg.close()
