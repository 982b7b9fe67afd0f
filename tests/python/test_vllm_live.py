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
import importlib.util
import json
import os
import types

import pytest
import torch

from wsync import layouts, vllm, vllm_live

from harness import expected_destination, full_tensors
from models import TINY_LLAMA, TINY_QWEN3_MOE

DATA = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "vllm")
MODELS = ("llama3-8b", "qwen3-30b-a3b", "deepseek-v3")


def load_recorder():
    spec = importlib.util.spec_from_file_location("vllm_record", os.path.join(DATA, "record.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


RECORDER = load_recorder()
RECORDINGS = {}
for _m in MODELS:
    with open(os.path.join(DATA, _m + ".json")) as _f:
        RECORDINGS[_m] = json.load(_f)
CASES = [(m, i) for m in MODELS for i in range(len(RECORDINGS[m]["cases"]))]


def case_id(c):
    case = RECORDINGS[c[0]]["cases"][c[1]]
    return f"{c[0]}-tp{case['tp']}" + ("-ep" if case["ep"] else "")


def hf_config(model):
    return RECORDER.config(model)


# ------------------------------------------------------------ stand-ins --

class Fp8Parameter(torch.nn.Parameter):
    """torch 1.13 has no float8_e4m3fn: a one-byte parameter that says it is."""

    @property
    def dtype(self):
        return "float8_e4m3fn"


_CLASSES = {}


def vllm_class(name, bases):
    """A stand-in class named like vLLM's, with vLLM's base class names."""
    key = (name, tuple(bases))
    if key not in _CLASSES:
        parent = vllm_class(bases[0], bases[1:]) if bases else torch.nn.Module
        _CLASSES[key] = type(name, (parent,), {})
    return _CLASSES[key]


def submodule(root, path):
    m = root
    for part in path.split(".") if path else []:
        if part not in m._modules:
            m.add_module(part, torch.nn.Module())
        m = m._modules[part]
    return m


def build_model(rank_rec, device="meta", fill=None):
    """The module tree of one recorded rank: vLLM's classes (by name),
    attributes, parameters of the recorded shapes and dtypes, buffers."""
    root = torch.nn.Module()
    for name in sorted(rank_rec["modules"], key=lambda n: n.count(".")):
        info = rank_rec["modules"][name]
        parent, _, short = name.rpartition(".")
        m = vllm_class(info["class"], info["bases"])()
        for k, v in info["attrs"].items():
            setattr(m, k, types.SimpleNamespace(**v) if k == "shard_indices" else v)
        old = submodule(root, parent)._modules.get(short)
        if old is not None:
            m._modules.update(old._modules)
        submodule(root, parent).add_module(short, m)
    for p in rank_rec["parameters"]:
        owner, _, pname = p["name"].rpartition(".")
        fp8 = p["dtype"] == "float8_e4m3fn"
        dt = torch.uint8 if fp8 else getattr(torch, p["dtype"])
        t = fill(p) if fill else torch.empty(p["shape"], dtype=dt, device=device)
        param = Fp8Parameter(t, requires_grad=False) if fp8 else \
            torch.nn.Parameter(t, requires_grad=False)
        submodule(root, owner).register_parameter(pname, param)
    for b in rank_rec["buffers"]:
        owner, _, bname = b["name"].rpartition(".")
        submodule(root, owner).register_buffer(
            bname, torch.empty(b["shape"], dtype=getattr(torch, b["dtype"]), device=device))
    return root


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

TINY_MOE = dict(TINY_QWEN3_MOE, max_position_embeddings=32, torch_dtype="float32")
TINY = dict(TINY_LLAMA, max_position_embeddings=32, torch_dtype="float32")


def tiny_ranks(builder, cfg, tp, ep):
    out = []
    for r in range(tp):
        rank = RECORDER.Rank(r, tp, ep, "float32", False)
        builder(rank, cfg, list(range(cfg["num_hidden_layers"])))
        out.append({"tp_rank": r, "ep_rank": r if ep else 0, "modules": rank.modules,
                    "parameters": rank.parameters, "buffers": rank.buffers})
    return out


def hf_shapes(cfg):
    """The trainer's HF tensors (names, full shapes) of a tiny Llama / Qwen3-MoE."""
    h, nh, kv, hd = (cfg["hidden_size"], cfg["num_attention_heads"],
                     cfg["num_key_value_heads"], cfg["head_dim"])
    out = {"model.embed_tokens.weight": [cfg["vocab_size"], h], "model.norm.weight": [h],
           "lm_head.weight": [cfg["vocab_size"], h]}
    for l in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{l}."
        out.update({p + "self_attn.q_proj.weight": [nh * hd, h],
                    p + "self_attn.k_proj.weight": [kv * hd, h],
                    p + "self_attn.v_proj.weight": [kv * hd, h],
                    p + "self_attn.o_proj.weight": [h, nh * hd],
                    p + "input_layernorm.weight": [h], p + "post_attention_layernorm.weight": [h]})
        if "num_experts" in cfg:
            E, i = cfg["num_experts"], cfg["moe_intermediate_size"]
            out.update({p + "self_attn.q_norm.weight": [hd], p + "self_attn.k_norm.weight": [hd],
                        p + "mlp.gate.weight": [E, h]})
            for e in range(E):
                x = f"{p}mlp.experts.{e}."
                out.update({x + "gate_proj.weight": [i, h], x + "up_proj.weight": [i, h],
                            x + "down_proj.weight": [h, i]})
        else:
            i = cfg["intermediate_size"]
            out.update({p + "mlp.gate_proj.weight": [i, h], p + "mlp.up_proj.weight": [i, h],
                        p + "mlp.down_proj.weight": [h, i]})
    return out


def vllm_rank_tensors(cfg, full, tp, r, ep):
    """vLLM's parameters of TP rank r, cut from the full HF tensors by the
    rules of vLLM's weight loaders (written here independently of wsync and
    of the recorder): qkv [q_r; k; v] with kv head r // (tp / kv_heads) when
    tp > kv_heads, gate_up [gate_r; up_r], row splits, vocab padded to 64 and
    split in tp equal parts, experts stacked (EP: ranks own E / tp whole
    experts; TP: every expert's rows / columns of rank r)."""
    h, nh, kv, hd = (cfg["hidden_size"], cfg["num_attention_heads"],
                     cfg["num_key_value_heads"], cfg["head_dim"])
    qn, kn = nh // tp, max(kv // tp, 1)
    kr = r // max(tp // kv, 1)
    rows = lambda t, n, k: t[k * n:(k + 1) * n]  # noqa: E731
    cols = lambda t, n, k: t[:, k * n:(k + 1) * n]  # noqa: E731
    out = {}
    padded = -(-cfg["vocab_size"] // 64) * 64
    per = padded // tp
    for name in ("model.embed_tokens.weight", "lm_head.weight"):
        w = torch.zeros(per, h)
        real = full[name][r * per:(r + 1) * per]
        w[:real.shape[0]] = real
        out[name] = w
    out["model.norm.weight"] = full["model.norm.weight"]
    for l in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{l}."
        a = p + "self_attn."
        out[a + "qkv_proj.weight"] = torch.cat([rows(full[a + "q_proj.weight"], qn * hd, r),
                                                rows(full[a + "k_proj.weight"], kn * hd, kr),
                                                rows(full[a + "v_proj.weight"], kn * hd, kr)])
        out[a + "o_proj.weight"] = cols(full[a + "o_proj.weight"], qn * hd, r)
        for n in ("input_layernorm.weight", "post_attention_layernorm.weight"):
            out[p + n] = full[p + n]
        if "num_experts" not in cfg:
            i = cfg["intermediate_size"] // tp
            out[p + "mlp.gate_up_proj.weight"] = torch.cat(
                [rows(full[p + "mlp.gate_proj.weight"], i, r),
                 rows(full[p + "mlp.up_proj.weight"], i, r)])
            out[p + "mlp.down_proj.weight"] = cols(full[p + "mlp.down_proj.weight"], i, r)
            continue
        for n in ("self_attn.q_norm.weight", "self_attn.k_norm.weight", "mlp.gate.weight"):
            out[p + n] = full[p + n]
        E, I = cfg["num_experts"], cfg["moe_intermediate_size"]
        ids = range(r * E // tp, (r + 1) * E // tp) if ep else range(E)
        i, k = (I, 0) if ep else (I // tp, r)
        x = p + "mlp.experts."
        out[x + "w13_weight"] = torch.stack([torch.cat(
            [rows(full[f"{x}{e}.gate_proj.weight"], i, k),
             rows(full[f"{x}{e}.up_proj.weight"], i, k)]) for e in ids])
        out[x + "w2_weight"] = torch.stack([cols(full[f"{x}{e}.down_proj.weight"], i, k)
                                            for e in ids])
    return out


def loaded_before(p):
    """A parameter as vLLM loaded it before: NaN (so that an element wsync
    does not write shows), except the vocabulary padding rows, which vLLM's
    VocabParallelEmbedding.weight_loader zero-fills and wsync leaves alone."""
    t = torch.full(p["shape"], float("nan"))
    if p["name"] in ("model.embed_tokens.weight", "lm_head.weight"):
        t[sum(s["length"] for s in p["sources"]):] = 0
    return t


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
