"""Stand-ins for vLLM models in tests (vLLM cannot be installed here): module
trees whose classes carry vLLM's class names and whose attributes and
parameters are those recorded from vLLM's sources (data/vllm/*.json, made by
data/vllm/record.py); and, for tiny models, vLLM's per-rank tensors cut from
full Hugging Face tensors by an independent transform written here from the
rules of vLLM's weight loaders."""
import importlib.util
import json
import os
import types

import torch

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


def hf_config(model):
    return RECORDER.config(model)


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
    # vLLM's construction order (that of the parameters; the recorded modules
    # are sorted by name): named_parameters() lists a tied weight under the
    # first module holding it, embed_tokens before lm_head.
    order = list(dict.fromkeys(p["module"] for p in rank_rec["parameters"]))
    for name in order + sorted(set(rank_rec["modules"]) - set(order)):
        if name not in rank_rec["modules"]:
            continue
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


TINY_MOE = dict(TINY_QWEN3_MOE, max_position_embeddings=32, torch_dtype="float32")
TINY = dict(TINY_LLAMA, max_position_embeddings=32, torch_dtype="float32")


def tiny_ranks(builder, cfg, tp, ep, fp8_block=False):
    """Every rank of a tiny model in the recordings' form, by the recorder's
    rules (names, shapes, module attributes); every layer, float32 (bf16
    and float8_e4m3fn weights with their block scales with `fp8_block`)."""
    out = []
    for r in range(tp):
        rank = RECORDER.Rank(r, tp, ep, "bfloat16" if fp8_block else "float32", fp8_block)
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
