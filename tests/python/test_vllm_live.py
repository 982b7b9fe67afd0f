"""wsync.vllm_live against vLLM's real parameters, as recorded from vLLM's
sources (tests/python/data/vllm/record.py, vLLM commit in the files):
stand-in module trees with the recorded classes, attributes and parameter
shapes (meta device) for Llama-3-8B, Qwen3-30B-A3B and DeepSeek-V3 (block
fp8) at TP 1/2/4/8 (+EP) are derived and checked (a) against the recorded
per-rank names, shapes, dtypes and HF source regions, (b) against the
HF-config path (wsync.vllm.destination), (c) for refusals naming the
parameter; and end to end on CPU with real tensors: a tiny model's vLLM-layout
rank tensors, built here by an independent transform, equal what the derived
layout says each destination element receives."""
import copy
import os

import pytest
import torch

from wsync import layouts, vllm, vllm_live

from harness import expected_destination, full_tensors
from vllm_standins import (DATA, MODELS, RECORDER, RECORDINGS, TINY, TINY_MOE, build_model,
                           hf_config, hf_shapes, loaded_before, tiny_ranks, vllm_rank_tensors)

CASES = [(m, i) for m in MODELS for i in range(len(RECORDINGS[m]["cases"]))]


def case_id(c):
    case = RECORDINGS[c[0]]["cases"][c[1]]
    return f"{c[0]}-tp{case['tp']}" + ("-ep" if case["ep"] else "")


def derive_case(model, case, experts="separate"):
    cfg = hf_config(model)
    return [vllm_live.destination_from_model(
        build_model(r), tp_rank=r["tp_rank"], tp_size=case["tp"], ep_rank=r["ep_rank"],
        ep_size=case["tp"] if case["ep"] else 1, hf_config=cfg, experts=experts)
        for r in case["ranks"]]


# ---------------------------------------------- (a) recorded parameters --

def row_major(shape):
    return layouts._row_major(list(shape))


def derived_pieces(spec, rank, elem_of):
    """{(buffer, first local element, region lengths, local strides, src, src
    offset)} of what the spec writes into this rank's buffers."""
    maps = {}
    for m in spec.mappings:
        maps.setdefault(m.dst, []).append(
            (list(m.dst_offset), m.src, list(m.src_box.offset), list(m.src_box.length)))
    scales = {t.block_quantization.scale_tensor for t in spec.destination.tensors}
    out = set()
    for t in spec.destination.tensors:
        if t.name in scales:  # computed from the weight: checked by check_scales
            continue
        feeds = maps.get(t.name) or [([0] * len(t.shape), t.name, [0] * len(t.shape),
                                      list(t.shape))]
        for f in t.fragments.fragments:
            if f.rank != rank:
                continue
            fo, fl = list(f.box.offset), list(f.box.length)
            fs = list(f.strides) or row_major(fl)
            for d_off, src, s_off, s_len in feeds:
                lo = [max(a, b) for a, b in zip(fo, d_off)]
                hi = [min(a + n, b + m) for a, n, b, m in zip(fo, fl, d_off, s_len)]
                if any(h <= l for l, h in zip(lo, hi)):
                    continue
                first = f.byte_offset // elem_of(f.buffer) + sum(
                    (l - o) * s for l, o, s in zip(lo, fo, fs))
                out.add((f.buffer, first, tuple(h - l for l, h in zip(lo, hi)), tuple(fs), src,
                         tuple(so + l - d for so, l, d in zip(s_off, lo, d_off))))
    return out


def recorded_pieces(p):
    shape, st = p["shape"], row_major(p["shape"])
    out = set()
    for s in p.get("sources", []):
        length = list(shape)
        length[s["dim"]] = s["length"]
        off = [0] * len(shape)
        off[s["dim"]] = s["src_start"]
        out.add((p["name"], s["local_start"] * st[s["dim"]], tuple(length), tuple(st), s["hf"],
                 tuple(off)))
    if "experts" in p:
        for i, e in enumerate(range(*p["experts"])):
            for s in p["pieces"]:
                length = list(shape[1:])
                length[s["dim"]] = s["length"]
                off = [0] * (len(shape) - 1)
                off[s["dim"]] = s["src_start"]
                out.add((p["name"], i * st[0] + s["local_start"] * st[1 + s["dim"]],
                         tuple(length), tuple(st[1:]), s["hf"].format(e=e), tuple(off)))
    return out


@pytest.mark.parametrize("case_key", CASES, ids=case_id)
def test_derived_layout_matches_recorded_vllm_parameters(case_key):
    model, i = case_key
    rec = RECORDINGS[model]
    case = rec["cases"][i]
    assert len(rec["vllm_commit"]) == 40
    for r, live in zip(case["ranks"], derive_case(model, case)):
        params = {p["name"]: p for p in r["parameters"]}
        written = {n for n, p in params.items() if p.get("sources") != []}
        assert set(live.buffers) == written, f"rank {r['tp_rank']}"
        for n in written:
            assert list(live.buffers[n].shape) == params[n]["shape"], n
            assert str(live.buffers[n].dtype).replace("torch.", "") == params[n]["dtype"], n
        assert sorted(live.not_transferred) == sorted(b["name"] for b in r["buffers"])
        assert live.skipped == []
        elem = {n: (1 if p["dtype"] == "float8_e4m3fn" else
                    torch.empty(0, dtype=getattr(torch, p["dtype"])).element_size())
                for n, p in params.items()}
        want = set().union(*(recorded_pieces(p) for p in params.values()))
        got = derived_pieces(live.spec, live.rank, elem.__getitem__)
        assert got == want, (f"rank {r['tp_rank']}: derived only {sorted(got - want)[:3]}, "
                             f"recorded only {sorted(want - got)[:3]}")
        check_scales(live, params)


def check_scales(live, params):
    """Each recorded block scale parameter holds exactly the scales of its
    weight's block-quantized destination tensors, blocks of [128, 128]."""
    tensors = {t.name: t for t in live.spec.destination.tensors}
    for name, p in params.items():
        if "scale_of" not in p:
            continue
        quantized = [t for t in tensors.values() if t.block_quantization.scale_tensor and
                     any(f.buffer == p["scale_of"] for f in t.fragments.fragments)]
        assert quantized, f"{p['scale_of']} is not block-quantized"
        covered = 0
        for t in quantized:
            s = tensors[t.block_quantization.scale_tensor]
            assert {f.buffer for f in s.fragments.fragments} == {name}
            assert list(s.shape) == list(t.shape[:-2]) + [-(-n // 128) for n in t.shape[-2:]]
            for f in s.fragments.fragments:
                n = 1
                for x in f.box.length:
                    n *= x
                covered += n
        total = 1
        for x in p["shape"]:
            total *= x
        assert covered == total, name


def test_recordings_are_reproducible():
    for model in MODELS:
        assert RECORDER.dumps(RECORDER.record(model)) == \
            open(os.path.join(DATA, model + ".json")).read(), model


# ------------------------------------------------ (b) the HF-config path --

def normalized(t):
    t = copy.deepcopy(t)
    for f in t.fragments.fragments:
        if not f.strides:
            f.strides.extend(row_major(f.box.length))
    return t


@pytest.mark.parametrize("case_key", CASES, ids=case_id)
@pytest.mark.parametrize("experts", ["separate", "stacked"])
def test_derived_layout_matches_hf_config_path(case_key, experts):
    model, i = case_key
    case = RECORDINGS[model]["cases"][i]
    got = vllm_live.merge(derive_case(model, case, experts))
    want = vllm.destination(hf_config(model), tp=case["tp"], expert_parallel=case["ep"],
                            experts=experts)
    want_t = {t.name: t for t in want.destination.tensors}
    names = [t.name for t in got.destination.tensors]
    for t in got.destination.tensors:
        assert t.name in want_t, t.name
        assert normalized(t) == normalized(want_t[t.name]), t.name
    key = lambda m: m.SerializeToString(deterministic=True)  # noqa: E731
    dst = set(names)
    assert sorted(map(key, got.mappings)) == \
        sorted(key(m) for m in want.mappings if m.dst in dst)


# ------------------------------------------------------- (c) refusals --

def first_case(model, tp, ep=False):
    return next(c for c in RECORDINGS[model]["cases"] if c["tp"] == tp and c["ep"] == ep)


def derive_rank(model, rank_rec, tp, ep=False, **kw):
    return vllm_live.destination_from_model(
        build_model(rank_rec), tp_rank=rank_rec["tp_rank"], tp_size=tp,
        ep_rank=rank_rec["ep_rank"], ep_size=tp if ep else 1, hf_config=hf_config(model), **kw)


def edit(rank_rec, name, **changes):
    r = copy.deepcopy(rank_rec)
    for p in r["parameters"]:
        if p["name"] == name:
            p.update(changes)
    return r


QKV0 = "model.layers.0.self_attn.qkv_proj.weight"
DS_KVB = "model.layers.0.self_attn.kv_b_proj.weight"


def test_refuses_a_shape_that_disagrees_with_the_attributes():
    r = first_case("llama3-8b", 2)["ranks"][1]
    with pytest.raises(ValueError, match=rf"'{QKV0}' \(shape \[3073, 4096\].*expected shape "
                                         r"\[3072, 4096\]"):
        derive_rank("llama3-8b", edit(r, QKV0, shape=[3073, 4096]), 2)
    moe = first_case("qwen3-30b-a3b", 4, True)["ranks"][2]
    w13 = "model.layers.0.mlp.experts.w13_weight"
    with pytest.raises(ValueError, match=rf"'{w13}'.*expected shape \[32, 1536, 2048\]"):
        derive_rank("qwen3-30b-a3b", edit(moe, w13, shape=[31, 1536, 2048]), 4, True)


def test_refuses_a_block_fp8_weight_without_its_scale():
    r = first_case("deepseek-v3", 2)["ranks"][0]
    r = copy.deepcopy(r)
    r["parameters"] = [p for p in r["parameters"] if p["name"] != DS_KVB + "_scale_inv"]
    with pytest.raises(ValueError, match=rf"'{DS_KVB}'.*without a weight_scale_inv"):
        derive_rank("deepseek-v3", r, 2)
    bad = edit(first_case("deepseek-v3", 2)["ranks"][0], DS_KVB + "_scale_inv", shape=[128, 5])
    with pytest.raises(ValueError, match=rf"'{DS_KVB}_scale_inv'.*block scales of '{DS_KVB}': "
                                         r"shape \[128, 4\]"):
        derive_rank("deepseek-v3", bad, 2)


def test_refuses_an_unknown_fused_layer():
    r = copy.deepcopy(first_case("llama3-8b", 4)["ranks"][0])
    old, new = "model.layers.0.mlp.gate_up_proj", "model.layers.0.mlp.wk_weights_proj"
    r["modules"][new] = r["modules"].pop(old)
    for p in r["parameters"]:
        if p["name"].startswith(old + "."):
            p["name"] = p["name"].replace(old, new)
    with pytest.raises(ValueError, match=r"'model.layers.0.mlp.wk_weights_proj.weight'.*unknown "
                                         r"fused layer 'wk_weights_proj'"):
        derive_rank("llama3-8b", r, 4)


def test_unknown_parameters_are_refused_or_listed_when_skipped():
    r = copy.deepcopy(first_case("llama3-8b", 1)["ranks"][0])
    r["parameters"].append({"name": "model.layers.0.self_attn.attn.k_scale",
                            "module": "model.layers.0.self_attn.attn", "shape": [],
                            "dtype": "float32"})
    with pytest.raises(ValueError, match=r"does not understand.*model.layers.0.self_attn.attn"
                                         r".k_scale \(Module\)"):
        derive_rank("llama3-8b", r, 1)
    live = derive_rank("llama3-8b", r, 1, skip=("*.attn.k_scale",))
    assert live.skipped == ["model.layers.0.self_attn.attn.k_scale"]
    assert "model.layers.0.self_attn.attn.k_scale" not in live.buffers


def test_refuses_counts_that_disagree_with_the_config_and_a_bad_expert_map():
    r = first_case("qwen3-30b-a3b", 2, True)["ranks"][1]
    with pytest.raises(ValueError, match=r"qkv_proj.weight'.*num_key_value_heads is 8"):
        vllm_live.destination_from_model(
            build_model(r), tp_rank=1, tp_size=2, ep_rank=1, ep_size=2,
            hf_config=dict(hf_config("qwen3-30b-a3b"), num_key_value_heads=8))
    bad = copy.deepcopy(r)
    emap = bad["modules"]["model.layers.0.mlp.experts"]["attrs"]["expert_map"]
    emap[0] = 1  # expert 65 is local slot 1 already
    with pytest.raises(ValueError, match=r"experts.w13_weight'.*expert_map sends expert 65 to "
                                         r"local slot 1 of 64"):
        derive_rank("qwen3-30b-a3b", bad, 2, True)


def test_round_robin_expert_map_places_each_expert():
    """vLLM's expert_placement_strategy "round_robin": rank r holds experts
    r, r + ep, ...; the fragments follow the map, the mappings stay global."""
    case = first_case("qwen3-30b-a3b", 2, True)
    parts = []
    for r in case["ranks"]:
        rr = copy.deepcopy(r)
        emap = [-1] * 128
        for i, e in enumerate(range(r["tp_rank"], 128, 2)):
            emap[e] = i
        rr["modules"]["model.layers.0.mlp.experts"]["attrs"]["expert_map"] = emap
        parts.append(derive_rank("qwen3-30b-a3b", rr, 2, True, experts="stacked"))
    w13 = "model.layers.0.mlp.experts.w13_weight"
    frags = [f for t in parts[1].spec.destination.tensors if t.name == w13
             for f in t.fragments.fragments]
    assert [(list(f.box.offset), f.byte_offset) for f in frags[:2]] == \
        [([1, 0, 0], 0), ([3, 0, 0], 2 * 768 * 2048 * 2)]
    assert len(frags) == 64 and all(list(f.box.length) == [1, 1536, 2048] for f in frags)
    merged = vllm_live.merge(parts)
    t = next(t for t in merged.destination.tensors if t.name == w13)
    assert sorted(f.box.offset[0] for f in t.fragments.fragments) == list(range(128))
    want = vllm.destination(hf_config("qwen3-30b-a3b"), tp=2, expert_parallel=True,
                            experts="stacked")
    assert [m for m in merged.mappings if m.dst == w13] == \
        [m for m in want.mappings if m.dst == w13]


# ----------------------------------------------- end to end, real tensors --

@pytest.mark.parametrize("builder,cfg,tp,ep,experts", [
    (RECORDER.llama, TINY, 4, False, "separate"), (RECORDER.llama, TINY, 1, False, "separate"),
    (RECORDER.qwen3_moe, TINY_MOE, 2, False, "separate"),
    (RECORDER.qwen3_moe, TINY_MOE, 2, True, "stacked"),
    (RECORDER.qwen3_moe, TINY_MOE, 4, True, "separate")])
def test_every_destination_element_comes_from_the_right_source_element(builder, cfg, tp, ep,
                                                                       experts):
    full = full_tensors(hf_shapes(cfg))
    if experts == "stacked":  # the trainer holds experts.gate_proj [E, I, H], ...
        for l in range(cfg["num_hidden_layers"]):
            x = f"model.layers.{l}.mlp.experts."
            for n in ("gate_proj", "up_proj", "down_proj"):
                full[x + n] = torch.stack([full[f"{x}{e}.{n}.weight"]
                                           for e in range(cfg["num_experts"])])
    for rank_rec in tiny_ranks(builder, cfg, tp, ep):
        r = rank_rec["tp_rank"]
        model = build_model(rank_rec, fill=loaded_before)
        live = vllm_live.destination_from_model(model, tp_rank=r, tp_size=tp, ep_rank=r if ep
                                                else 0, ep_size=tp if ep else 1, hf_config=cfg,
                                                experts=experts)
        # What wsync writes into this rank's buffers (the spec applied to the
        # full tensors), written into the live parameters themselves.
        written = expected_destination(live.spec, full, r, torch.float32)
        params = dict(model.named_parameters())
        assert set(written) == set(live.buffers) == set(params)
        for name, flat in written.items():
            assert live.buffers[name] is params[name]
            params[name].data.view(-1)[:flat.numel()].copy_(flat)
        want = vllm_rank_tensors(cfg, full, tp, r, ep)
        assert set(want) == set(params)
        for name, w in want.items():
            assert torch.equal(params[name].data, w), f"rank {r}: {name}"


def test_sync_writes_into_the_live_parameters(cluster):
    """Through real wsync processes (host transport): one trainer rank holding
    the full HF tensors syncs into two vLLM ranks (tiny Qwen3-MoE, TP 2 with
    EP) whose registered buffers are the stand-in model's parameters."""
    import wsync
    import wsync.torch
    cfg, tp = TINY_MOE, 2
    full = full_tensors(hf_shapes(cfg))
    socks = {r: cluster.worker(f"inference:{r}:{tp}") for r in range(tp)}
    trainer_sock = cluster.worker("trainer:0:1")
    models, parts = [], []
    for rec in tiny_ranks(RECORDER.qwen3_moe, cfg, tp, True):
        models.append(build_model(rec, fill=loaded_before))
        parts.append(vllm_live.destination_from_model(
            models[-1], tp_rank=rec["tp_rank"], tp_size=tp, ep_rank=rec["ep_rank"], ep_size=tp,
            hf_config=cfg))
    src = layouts.source_side(layouts.describe(full.items(), rank=0))
    spec = layouts.transfer_spec(src, vllm_live.merge(parts), name="live")
    regs = [wsync.torch.register(full, group="trainer", rank=0, socket=trainer_sock)]
    regs += [wsync.torch.register(p.buffers, group="inference", rank=p.rank, socket=socks[p.rank])
             for p in parts]
    client = wsync.Client(cluster.address, timeout=20)
    client.wait_for_workers({"trainer": 1, "inference": tp}, timeout=30, buffers=True)
    client.define_transfer("weights", spec, source_group="trainer", destination_group="inference")
    status = client.sync(1).wait(timeout=60, show_progress=False)
    assert status.phase == wsync._proto.controller_pb2.SYNC_SUCCEEDED
    for r, model in enumerate(models):
        want = vllm_rank_tensors(cfg, full, tp, r, True)
        for name, p in model.named_parameters():
            assert torch.equal(p.data, want[name]), f"rank {r}: {name}"
    for reg in regs:
        reg.close()


# Block-fp8 DeepSeek-V3 scaled down to dims vLLM accepts for 128 x 128 blocks at TP 2.
TINY_FP8_MLA = {"architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3",
                "hidden_size": 256, "intermediate_size": 256, "moe_intermediate_size": 256,
                "num_hidden_layers": 2, "num_attention_heads": 4, "n_routed_experts": 4,
                "n_shared_experts": 1, "first_k_dense_replace": 1, "moe_layer_freq": 1,
                "q_lora_rank": 128, "kv_lora_rank": 128, "qk_nope_head_dim": 64,
                "qk_rope_head_dim": 64, "v_head_dim": 64, "vocab_size": 100,
                "topk_method": "noaux_tc", "torch_dtype": "bfloat16",
                "quantization_config": {"quant_method": "fp8", "weight_block_size": [128, 128]}}


@pytest.mark.parametrize("ep,experts", [(False, "separate"), (True, "stacked")])
def test_block_fp8_mla_plan_replays_every_element(tmp_path, ep, experts):
    """A tiny block-fp8 DeepSeek-V3 at TP 2: the merged live derivation equals
    the HF-config path, and wsyncctl plan --verify (the planner's replay
    oracle: quantizes receiver-side and checks every destination element and
    scale) accepts it with the scales written into the live scale parameters."""
    import subprocess
    from google.protobuf import json_format
    from harness import WSYNCCTL_BIN
    from wsync import _native
    cfg, tp = TINY_FP8_MLA, 2
    parts = []
    for rec in tiny_ranks(RECORDER.deepseek_v3, cfg, tp, ep, fp8_block=True):
        parts.append(vllm_live.destination_from_model(
            build_model(rec), tp_rank=rec["tp_rank"], tp_size=tp, ep_rank=rec["ep_rank"],
            ep_size=tp if ep else 1, hf_config=cfg, experts=experts))
    dst = vllm_live.merge(parts)
    want = vllm.destination(cfg, tp=tp, expert_parallel=ep, experts=experts)
    assert {t.name: normalized(t) for t in dst.destination.tensors} == \
        {t.name: normalized(t) for t in want.destination.tensors}
    assert sorted(m.SerializeToString() for m in dst.mappings) == \
        sorted(m.SerializeToString() for m in want.mappings)
    scales = [t for t in dst.destination.tensors if "w13_weight_scale_inv" in t.name]
    assert scales and all(f.buffer == "model.layers.1.mlp.experts.w13_weight_scale_inv"
                          for t in scales for f in t.fragments.fragments)
    src = layouts.source_side(layouts.describe(
        [(t["name"], torch.empty(t["shape"], dtype=torch.float32 if t["keep_fp32"] else
                                 torch.bfloat16, device="meta"))
         for t in _native.model_tensors(vllm.model_config(cfg)[0], experts)]))
    src.ranks.add(worker=0, node="n0")
    spec = layouts.transfer_spec(src, dst, name="tiny-fp8")
    for r in range(tp):
        spec.destination.ranks.add(worker=1 + r, node="n1")
    path = tmp_path / "spec.json"
    path.write_text(json_format.MessageToJson(spec))
    out = subprocess.run([WSYNCCTL_BIN, "plan", str(path), "--verify"], capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0 and "verify: OK" in out.stdout, out.stdout + out.stderr


def test_qwen2_qkv_bias_and_tied_embeddings_match_the_hf_config_path():
    """Qwen2's fused qkv bias (rows of the weight's segments) and tied
    embeddings (vLLM's ParallelLMHead.tie_weights: lm_head.weight is
    embed_tokens.weight, held once) at TP 4 over 2 kv heads."""
    cfg, tp = dict(TINY, model_type="qwen2", tie_word_embeddings=True), 4
    parts = []
    for rec in tiny_ranks(RECORDER.llama, cfg, tp, False):
        for p in list(rec["parameters"]):
            if p["name"].endswith("qkv_proj.weight"):
                rec["parameters"].append(dict(p, name=p["name"][:-len("weight")] + "bias",
                                              shape=p["shape"][:1]))
        model = build_model(rec)
        model.lm_head.weight = model.model.embed_tokens.weight
        parts.append(vllm_live.destination_from_model(model, tp_rank=rec["tp_rank"],
                                                      tp_size=tp, hf_config=cfg))
    assert "lm_head.weight" not in parts[0].buffers
    got = vllm_live.merge(parts)
    want = vllm.destination(cfg, tp=tp, dtype="fp32")
    assert {t.name: normalized(t) for t in got.destination.tensors} == \
        {t.name: normalized(t) for t in want.destination.tensors}
    assert sorted(m.SerializeToString() for m in got.mappings) == \
        sorted(m.SerializeToString() for m in want.mappings)
