#!/usr/bin/env python3
"""Records vLLM's per-rank parameters for real models as test data.

vLLM cannot be installed or imported on these machines, so this script
*transcribes* the rules by which vLLM builds its parameters (names, local
shapes, dtypes, the modules' attributes and which region of which Hugging
Face checkpoint tensor each local parameter is loaded from) from vLLM's
sources at commit VLLM_COMMIT, and applies them to the models' HF configs
(configs/*.json). Every rule below names the vLLM file and function it
transcribes. It is the independent oracle of tests/python/test_vllm_live.py:
it must not import wsync.

    python3 record.py            # rewrites <model>.json next to this file
    python3 record.py --check    # exit 1 if the files differ from a fresh recording

The configs carry the numbers of the models' public config.json on the
Hugging Face hub (meta-llama/Meta-Llama-3-8B, Qwen/Qwen3-30B-A3B,
deepseek-ai/DeepSeek-V3), typed in from those files as quoted in vLLM's and
wsync's own sources (catalog/model_config.cc): nothing could be downloaded.

Only a few layers are recorded per model (Llama: the first and the last;
Qwen3-MoE: the first and the last, both MoE; DeepSeek-V3: the first, dense,
and the first MoE layer; plus embeddings, final norm and lm_head) to keep
the files small. A
"source piece" says: local rows/columns [local_start, local_start + length)
of dim `dim` of the parameter are loaded from [src_start, src_start +
length) of the same dim of HF tensor `hf` (every other dim whole). Expert
parameters give their local experts' global ids as [first, stop) (vLLM's
default linear placement: local expert i is global expert first + i) and
per-expert pieces whose `hf` has an `{e}` for the global
expert id. Block-fp8 scales say whose scales they hold (`scale_of`).

The parameters are recorded as vLLM's create_weights makes them, i.e. as
the checkpoint is loaded into them (before process_weights_after_loading,
which for some fp8 kernels re-lays the scales out).
"""
import json
import os
import sys

VLLM_COMMIT = "9aaf83ef502fc37bc647f6e474314d48ba36cd1c"
VLLM_COMMIT_NOTE = (
    "vllm-project/vllm commit 9aaf83ef502fc37bc647f6e474314d48ba36cd1c (2026-05-19, "
    "'[CI failure] Temporarily disable using persistent cache for flashinfer autotune "
    "(#43119)'), read from the history of a fork snapshot (local-inference-lab/vllm) "
    "with `git show <commit>:<path>`: the vllm-project/vllm snapshot was over the "
    "fetch size limit")

HERE = os.path.dirname(os.path.abspath(__file__))
L = "vllm/model_executor/layers/"
M = "vllm/model_executor/models/"
RULES = {}


def rule(key, text):
    RULES[key] = text
    return key


R_DIVIDE = "vllm/distributed/utils.py:divide"
R_QKV = rule("qkv", L + "linear.py:QKVParallelLinear.__init__ / .weight_loader")
R_MERGED = rule("merged", L + "linear.py:MergedColumnParallelLinear.__init__ / .weight_loader")
R_COL = rule("column", L + "linear.py:ColumnParallelLinear.__init__ / .weight_loader")
R_ROW = rule("row", L + "linear.py:RowParallelLinear.__init__ / .weight_loader")
R_REPL = rule("replicated", L + "linear.py:ReplicatedLinear.__init__ / .weight_loader")
R_VOCAB = rule("vocab", L + "vocab_parallel_embedding.py:pad_vocab_size, "
               "VocabParallelEmbedding.__init__ / ._get_indices / .weight_loader")
R_MOE = rule("moe", L + "fused_moe/layer.py:FusedMoE.__init__ / ._load_w13 / ._load_w2; "
             + L + "fused_moe/config.py:FusedMoEParallelConfig.make; "
             + L + "fused_moe/expert_map_manager.py:determine_expert_map; "
             + L + "fused_moe/unquantized_fused_moe_method.py:create_weights")
R_FP8 = rule("fp8", L + "quantization/fp8.py:Fp8LinearMethod.create_weights; "
             + L + "quantization/utils/fp8_utils.py:create_fp8_weight_parameter / "
             "create_fp8_scale_parameter / validate_fp8_block_shape")
R_FP8_MOE = rule("fp8_moe", L + "quantization/fp8.py:Fp8MoEMethod.create_weights")
R_NORM = rule("norm", L + "layernorm.py:RMSNorm.__init__")
R_ROPE = rule("rope", L + "rotary_embedding/base.py:RotaryEmbeddingBase.__init__ "
              "(cos_sin_cache buffer)")
R_GATE = rule("gate", L + "fused_moe/router/gate_linear.py:GateLinear.__init__ "
              "(ReplicatedLinear, quant_config=None)")
R_DSV3_MOE = rule("deepseek_moe", M + "deepseek_v2.py:DeepseekV2MoE.__init__ "
                  "(gate.e_score_correction_bias)")


def divide(a, b):
    if a % b:
        raise ValueError(f"{a} is not divisible by {b} ({R_DIVIDE})")
    return a // b


def cdiv(a, b):
    return -(-a // b)


class Rank:
    """One vLLM rank's recorded modules, parameters and buffers."""

    def __init__(self, tp_rank, tp_size, ep, dtype, fp8_block):
        self.tp_rank, self.tp_size, self.ep = tp_rank, tp_size, ep
        self.dtype, self.fp8_block = dtype, fp8_block
        self.modules, self.parameters, self.buffers = {}, [], []

    def module(self, name, cls, bases, rule, **attrs):
        rules = rule if isinstance(rule, list) else [rule]
        self.modules[name] = {"class": cls, "bases": bases, "rules": rules, "attrs": attrs}

    def param(self, name, module, shape, dtype, rule, **extra):
        rules = rule if isinstance(rule, list) else [rule]
        self.parameters.append(dict(name=name, module=module, shape=list(shape), dtype=dtype,
                                    rules=rules, **extra))

    def whole(self, name, shape):
        return [{"hf": name, "dim": 0, "src_start": 0, "length": shape[0], "local_start": 0}]

    # ------------------------------------------------------------- layers --

    def norm(self, name, size):
        self.module(name, "RMSNorm", ["CustomOp"], R_NORM, hidden_size=size)
        self.param(name + ".weight", name, [size], self.dtype, R_NORM,
                   sources=self.whole(name + ".weight", [size]))

    def linear(self, name, cls, bases, rule, out_pp, in_pp, sources, quant, **attrs):
        """A LinearBase: weight [out_pp, in_pp]; with block fp8 (quant) the
        weight is float8_e4m3fn and weight_scale_inv [ceil(out_pp/128),
        ceil(in_pp/128)] fp32 (R_FP8)."""
        fp8 = quant and self.fp8_block
        attrs.update(output_size_per_partition=out_pp, input_size_per_partition=in_pp,
                     quant_method="Fp8LinearMethod" if fp8 else "UnquantizedLinearMethod",
                     weight_block_size=[128, 128] if fp8 else None)
        self.module(name, cls, bases, rule, **attrs)
        self.param(name + ".weight", name, [out_pp, in_pp],
                   "float8_e4m3fn" if fp8 else self.dtype, [rule, R_FP8] if fp8 else [rule],
                   sources=sources)
        if fp8:
            self.param(name + ".weight_scale_inv", name, [cdiv(out_pp, 128), cdiv(in_pp, 128)],
                       "float32", R_FP8, scale_of=name + ".weight", block=[128, 128])

    def lin_attrs(self, input_size, output_size, disable_tp=False):
        tp = 1 if disable_tp else self.tp_size
        return dict(input_size=input_size, output_size=output_size, disable_tp=disable_tp,
                    tp_rank=0 if disable_tp else self.tp_rank, tp_size=tp)

    def qkv(self, prefix, hidden, heads, kv_heads, head_size):
        """QKVParallelLinear: q heads divided by tp; kv heads divided, or one
        per rank replicated tp / kv_heads times; rank r loads k/v head block
        tp_rank // num_kv_head_replicas (R_QKV)."""
        tp, r = self.tp_size, self.tp_rank
        nh = divide(heads, tp)
        if tp >= kv_heads:
            nkv, reps = 1, divide(tp, kv_heads)
        else:
            nkv, reps = divide(kv_heads, tp), 1
        name = prefix + "qkv_proj"
        kv_rank = r // reps
        src = [{"hf": prefix + "q_proj.weight", "dim": 0, "src_start": r * nh * head_size,
                "length": nh * head_size, "local_start": 0},
               {"hf": prefix + "k_proj.weight", "dim": 0, "src_start": kv_rank * nkv * head_size,
                "length": nkv * head_size, "local_start": nh * head_size},
               {"hf": prefix + "v_proj.weight", "dim": 0, "src_start": kv_rank * nkv * head_size,
                "length": nkv * head_size, "local_start": (nh + nkv) * head_size}]
        out_sizes = [nh * head_size * tp, nkv * head_size * tp, nkv * head_size * tp]
        self.linear(name, "QKVParallelLinear", ["ColumnParallelLinear", "LinearBase"], R_QKV,
                    (nh + 2 * nkv) * head_size, hidden, src, True,
                    hidden_size=hidden, head_size=head_size, v_head_size=head_size,
                    total_num_heads=heads, total_num_kv_heads=kv_heads, num_heads=nh,
                    num_kv_heads=nkv, num_kv_head_replicas=reps, output_sizes=out_sizes,
                    **self.lin_attrs(hidden, sum(out_sizes)))

    def merged(self, name, hf_names, sizes, input_size, cls="MergedColumnParallelLinear",
               bases=("ColumnParallelLinear", "LinearBase"), disable_tp=False):
        """MergedColumnParallelLinear: each output size divided by tp, rank r
        loads rows [r * size/tp, (r+1) * size/tp) of each (R_MERGED)."""
        a = self.lin_attrs(input_size, sum(sizes), disable_tp)
        tp, r = a["tp_size"], a["tp_rank"]
        parts = [divide(s, tp) for s in sizes]
        src, at = [], 0
        for hf, p in zip(hf_names, parts):
            src.append({"hf": hf, "dim": 0, "src_start": r * p, "length": p, "local_start": at})
            at += p
        self.linear(name, cls, list(bases), R_MERGED, sum(parts), input_size, src, True,
                    output_sizes=list(sizes), output_partition_sizes=parts, **a)

    def column(self, name, out_size, in_size):
        p = divide(out_size, self.tp_size)
        src = [{"hf": name + ".weight", "dim": 0, "src_start": self.tp_rank * p, "length": p,
                "local_start": 0}]
        self.linear(name, "ColumnParallelLinear", ["LinearBase"], R_COL, p, in_size, src, True,
                    **self.lin_attrs(in_size, out_size))

    def row(self, name, out_size, in_size):
        p = divide(in_size, self.tp_size)
        src = [{"hf": name + ".weight", "dim": 1, "src_start": self.tp_rank * p, "length": p,
                "local_start": 0}]
        self.linear(name, "RowParallelLinear", ["LinearBase"], R_ROW, out_size, p, src, True,
                    **self.lin_attrs(in_size, out_size))

    def replicated(self, name, out_size, in_size, cls="ReplicatedLinear", bases=("LinearBase",),
                   rule=R_REPL, quant=True):
        self.linear(name, cls, list(bases), rule, out_size, in_size,
                    self.whole(name + ".weight", [out_size]), quant,
                    **self.lin_attrs(in_size, out_size, disable_tp=True))

    def vocab(self, name, cls, vocab, hidden):
        """Padded to 64 whatever the tp, then divided by tp; rank r's padded
        rows [r*P, (r+1)*P), of which the real vocab rows are loaded (R_VOCAB)."""
        padded = cdiv(vocab, 64) * 64
        per = divide(padded, self.tp_size)
        start, end = self.tp_rank * per, (self.tp_rank + 1) * per
        org_start, org_end = min(start, vocab), min(end, vocab)
        bases = ["VocabParallelEmbedding"] if cls == "ParallelLMHead" else []
        self.module(name, cls, bases + ["PluggableLayer"], R_VOCAB, num_embeddings=vocab,
                    org_vocab_size=vocab, org_vocab_size_padded=padded,
                    num_embeddings_padded=padded, num_embeddings_per_partition=per,
                    embedding_dim=hidden, tp_size=self.tp_size,
                    shard_indices={"padded_org_vocab_start_index": start,
                                   "padded_org_vocab_end_index": end,
                                   "org_vocab_start_index": org_start,
                                   "org_vocab_end_index": org_end},
                    quant_method="UnquantizedEmbeddingMethod")
        src = []
        if org_end > org_start:
            src = [{"hf": name + ".weight", "dim": 0, "src_start": org_start,
                    "length": org_end - org_start, "local_start": 0}]
        self.param(name + ".weight", name, [per, hidden], self.dtype, R_VOCAB, sources=src)

    def experts(self, prefix, num_experts, inter, hidden):
        """FusedMoE: with expert parallelism (DP 1) ep_size = tp_size, ep_rank =
        tp_rank and the experts' tp is 1; experts placed linearly (base E/ep,
        the first E % ep ranks one more); w13 [E_local, 2*I_pp, H] = per expert
        [gate rows of the rank; up rows], w2 [E_local, H, I_pp] (R_MOE)."""
        name = prefix + "experts"
        if self.ep:
            ep_size, ep_rank, tp, tr = self.tp_size, self.tp_rank, 1, 0
            base, rem = divmod(num_experts, ep_size)
            local = base + (1 if ep_rank < rem else 0)
            first = ep_rank * base + min(ep_rank, rem)
            ids = list(range(first, first + local))
            emap = [-1] * num_experts
            for i, e in enumerate(ids):
                emap[e] = i
        else:
            ep_size, ep_rank, tp, tr = 1, 0, self.tp_size, self.tp_rank
            local, ids, emap = num_experts, list(range(num_experts)), None
        ipp = divide(inter, tp)
        fp8 = self.fp8_block
        if fp8 and ipp % 128:  # block_n (and, with tp > 1, block_k) must divide it
            raise ValueError(f"{name}: intermediate_size_per_partition {ipp} not a multiple of "
                             f"block 128 ({R_FP8_MOE})")
        self.module(name, "FusedMoE", ["PluggableLayer"], [R_MOE, R_FP8_MOE] if fp8 else [R_MOE],
                    global_num_experts=num_experts, local_num_experts=local,
                    intermediate_size_per_partition=ipp, hidden_size=hidden, tp_size=tp,
                    tp_rank=tr, ep_size=ep_size, ep_rank=ep_rank, use_ep=bool(self.ep),
                    expert_map=emap,
                    quant_method="Fp8MoEMethod" if fp8 else "UnquantizedFusedMoEMethod",
                    weight_block_size=[128, 128] if fp8 else None)
        wdt = "float8_e4m3fn" if fp8 else self.dtype
        rules = [R_MOE, R_FP8_MOE] if fp8 else [R_MOE]
        e = prefix + "experts.{e}."
        held = [ids[0], ids[-1] + 1]
        self.param(name + ".w13_weight", name, [local, 2 * ipp, hidden], wdt, rules, experts=held,
                   pieces=[{"hf": e + "gate_proj.weight", "dim": 0, "src_start": tr * ipp,
                            "length": ipp, "local_start": 0},
                           {"hf": e + "up_proj.weight", "dim": 0, "src_start": tr * ipp,
                            "length": ipp, "local_start": ipp}])
        self.param(name + ".w2_weight", name, [local, hidden, ipp], wdt, rules, experts=held,
                   pieces=[{"hf": e + "down_proj.weight", "dim": 1, "src_start": tr * ipp,
                            "length": ipp, "local_start": 0}])
        if fp8:
            self.param(name + ".w13_weight_scale_inv", name,
                       [local, 2 * cdiv(ipp, 128), cdiv(hidden, 128)], "float32", R_FP8_MOE,
                       scale_of=name + ".w13_weight", block=[128, 128])
            self.param(name + ".w2_weight_scale_inv", name,
                       [local, cdiv(hidden, 128), cdiv(ipp, 128)], "float32", R_FP8_MOE,
                       scale_of=name + ".w2_weight", block=[128, 128])
        if emap is not None:
            self.buffers.append({"name": name + "._expert_map", "shape": [num_experts],
                                 "dtype": "int32", "rules": [R_MOE]})

    def dense_mlp(self, prefix, hidden, inter):
        """LlamaMLP / Qwen3MoeMLP / DeepseekV2MLP: gate_up_proj [gate; up] and
        down_proj (models' load_weights stacked_params_mapping)."""
        self.merged(prefix + "gate_up_proj", [prefix + "gate_proj.weight",
                                              prefix + "up_proj.weight"], [inter, inter], hidden)
        self.row(prefix + "down_proj", hidden, inter)


# ---------------------------------------------------------------- models --

def llama(r, c, layers):
    """llama.py: LlamaModel / LlamaDecoderLayer / LlamaAttention / LlamaMLP."""
    h, heads = c["hidden_size"], c["num_attention_heads"]
    hd = c.get("head_dim") or h // heads
    r.vocab("model.embed_tokens", "VocabParallelEmbedding", c["vocab_size"], h)
    for i in layers:
        p = f"model.layers.{i}."
        r.qkv(p + "self_attn.", h, heads, c["num_key_value_heads"], hd)
        r.row(p + "self_attn.o_proj", h, heads * hd)
        if i == layers[0]:
            r.buffers.append({"name": p + "self_attn.rotary_emb.cos_sin_cache",
                              "shape": [c["max_position_embeddings"], hd], "dtype": r.dtype,
                              "rules": [R_ROPE]})
        r.dense_mlp(p + "mlp.", h, c["intermediate_size"])
        r.norm(p + "input_layernorm", h)
        r.norm(p + "post_attention_layernorm", h)
    r.norm("model.norm", h)
    r.vocab("lm_head", "ParallelLMHead", c["vocab_size"], h)


def qwen3_moe(r, c, layers):
    """qwen3_moe.py: Qwen3MoeAttention (qkv_proj, o_proj, q_norm, k_norm),
    Qwen3MoeSparseMoeBlock (gate ReplicatedLinear, experts FusedMoE)."""
    h, heads, hd = c["hidden_size"], c["num_attention_heads"], c["head_dim"]
    r.vocab("model.embed_tokens", "VocabParallelEmbedding", c["vocab_size"], h)
    for i in layers:
        p = f"model.layers.{i}."
        r.qkv(p + "self_attn.", h, heads, c["num_key_value_heads"], hd)
        r.row(p + "self_attn.o_proj", h, heads * hd)
        r.norm(p + "self_attn.q_norm", hd)
        r.norm(p + "self_attn.k_norm", hd)
        if i == layers[0]:
            r.buffers.append({"name": p + "self_attn.rotary_emb.cos_sin_cache",
                              "shape": [c["max_position_embeddings"], hd], "dtype": r.dtype,
                              "rules": [R_ROPE]})
        r.replicated(p + "mlp.gate", c["num_experts"], h)
        r.experts(p + "mlp.", c["num_experts"], c["moe_intermediate_size"], h)
        r.norm(p + "input_layernorm", h)
        r.norm(p + "post_attention_layernorm", h)
    r.norm("model.norm", h)
    r.vocab("lm_head", "ParallelLMHead", c["vocab_size"], h)


def deepseek_v3(r, c, layers):
    """deepseek_v2.py: DeepseekV2MLAAttention (fused_qkv_a_proj =
    DeepSeekV2FusedQkvAProjLinear, a MergedColumnParallelLinear with
    disable_tp; q_a_layernorm, q_b_proj, kv_a_layernorm, kv_b_proj, o_proj),
    DeepseekV2MoE (gate GateLinear + e_score_correction_bias fp32 for
    noaux_tc, shared_experts DeepseekV2MLP, experts FusedMoE), dense
    DeepseekV2MLP below first_k_dense_replace; load_weights'
    stacked_params_mapping names the HF tensors."""
    h, heads = c["hidden_size"], c["num_attention_heads"]
    qr, kvr = c["q_lora_rank"], c["kv_lora_rank"]
    nope, rope, vd = c["qk_nope_head_dim"], c["qk_rope_head_dim"], c["v_head_dim"]
    r.vocab("model.embed_tokens", "VocabParallelEmbedding", c["vocab_size"], h)
    for i in layers:
        p = f"model.layers.{i}."
        a = p + "self_attn."
        r.merged(a + "fused_qkv_a_proj", [a + "q_a_proj.weight", a + "kv_a_proj_with_mqa.weight"],
                 [qr, kvr + rope], h, cls="DeepSeekV2FusedQkvAProjLinear",
                 bases=("MergedColumnParallelLinear", "ColumnParallelLinear", "LinearBase"),
                 disable_tp=True)
        r.norm(a + "q_a_layernorm", qr)
        r.column(a + "q_b_proj", heads * (nope + rope), qr)
        r.norm(a + "kv_a_layernorm", kvr)
        r.column(a + "kv_b_proj", heads * (nope + vd), kvr)
        r.row(a + "o_proj", h, heads * vd)
        if i >= c["first_k_dense_replace"]:
            m = p + "mlp."
            r.replicated(m + "gate", c["n_routed_experts"], h, cls="GateLinear",
                         bases=("ReplicatedLinear", "LinearBase"), rule=R_GATE, quant=False)
            r.param(m + "gate.e_score_correction_bias", m + "gate", [c["n_routed_experts"]],
                    "float32", R_DSV3_MOE,
                    sources=r.whole(m + "gate.e_score_correction_bias", [c["n_routed_experts"]]))
            r.dense_mlp(m + "shared_experts.", h,
                        c["moe_intermediate_size"] * c["n_shared_experts"])
            r.experts(m, c["n_routed_experts"], c["moe_intermediate_size"], h)
        else:
            r.dense_mlp(p + "mlp.", h, c["intermediate_size"])
        r.norm(p + "input_layernorm", h)
        r.norm(p + "post_attention_layernorm", h)
    r.norm("model.norm", h)
    r.vocab("lm_head", "ParallelLMHead", c["vocab_size"], h)


MODELS = {
    # name: (config file, builder, recorded layers, source file)
    "llama3-8b": ("llama3_8b.json", llama, [0, 31], M + "llama.py"),
    "qwen3-30b-a3b": ("qwen3_30b_a3b.json", qwen3_moe, [0, 47], M + "qwen3_moe.py"),
    "deepseek-v3": ("deepseek_v3.json", deepseek_v3, [0, 3], M + "deepseek_v2.py"),
}
TPS = (1, 2, 4, 8)


def config(model):
    with open(os.path.join(HERE, "configs", MODELS[model][0])) as f:
        return json.load(f)


def record_case(model, tp, ep):
    _, build, layers, src = MODELS[model]
    c = config(model)
    q = c.get("quantization_config") or {}
    fp8 = q.get("quant_method") == "fp8" and q.get("weight_block_size") == [128, 128]
    ranks = []
    for tr in range(tp):
        r = Rank(tr, tp, ep, c.get("torch_dtype", "bfloat16"), fp8)
        build(r, c, layers)
        ranks.append({"tp_rank": tr, "ep_rank": tr if ep else 0, "modules": r.modules,
                      "parameters": r.parameters, "buffers": r.buffers})
    return {"tp": tp, "ep": ep, "model_source": src, "ranks": ranks}


def record(model):
    cases = []
    moe = "num_experts" in config(model) or "n_routed_experts" in config(model)
    for tp in TPS:
        cases.append(record_case(model, tp, False))
        # vLLM enables EP only when tp * dp > 1 (FusedMoEParallelConfig.make).
        if moe and tp > 1:
            cases.append(record_case(model, tp, True))
    return {"model": model, "config": "configs/" + MODELS[model][0],
            "vllm_commit": VLLM_COMMIT, "vllm_source": VLLM_COMMIT_NOTE,
            "layers": MODELS[model][2], "rules": RULES, "cases": cases}


def dumps(data):
    return json.dumps(data, sort_keys=True, separators=(",", ":")) + "\n"


def main(argv):
    check = "--check" in argv
    stale = []
    for model in MODELS:
        path = os.path.join(HERE, model + ".json")
        text = dumps(record(model))
        if check:
            with open(path) as f:
                if f.read() != text:
                    stale.append(path)
        else:
            with open(path, "w") as f:
                f.write(text)
    if stale:
        print("stale recordings: " + ", ".join(stale))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
