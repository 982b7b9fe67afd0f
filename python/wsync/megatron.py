"""Megatron-core GPT models (Llama, Qwen2/3, Qwen3-MoE, DeepSeek-V3 / Kimi-K2
multi-latent attention) as a wsync source.

Megatron-core holds some Hugging Face tensors fused, in layouts that are not
a concatenation of the HF tensors:

* ``self_attention.linear_qkv.weight`` (and ``.bias``): rows
  ``[num_query_groups * (q_per_group + 2) * head_dim]`` interleaved per
  query group (the group's q heads, then its k head, then its v head), split
  over tensor parallelism on dim 0 as one contiguous chunk per rank (with
  ``num_query_groups >= tp`` each rank holds whole groups; with
  ``tp % num_query_groups == 0`` a group is split over ranks).
  See megatron/core/transformer/attention.py ``get_query_key_value_tensors``
  and tools/checkpoint (``loader_mixtral_hf.set_attn_state``, ``saver_base``).
* ``mlp.linear_fc1.weight`` with ``gated_linear_unit`` (SwiGLU): each TP rank
  holds its chunk of gate, then its chunk of up (``saver_base``: ``cat(W_r,
  V_r)``), whatever ``partition_stride`` (1, or 2 in newer releases) says.
  Expert ``linear_fc1`` tensors likewise over the expert-TP group.
* FusedMLASelfAttention's ``linear_qkv_down_proj.weight``: ``[q_a_proj;
  kv_a_proj_with_mqa]``, duplicated or one contiguous TP chunk per rank.
  The other MLA projections are plain tensors in HF's row order (Megatron
  de-interleaves the rope dims at run time, as HF DeepSeek-V3 does).

``describe`` turns a rank's Megatron parameters into wsync.layouts records
of the HF-named tensors wsync.vllm.destination maps from: a fused tensor
becomes one box per contiguous run of rows of q_proj / k_proj / v_proj (or
gate_proj / up_proj), each at its byte offset in the rank's fused buffer;
every other tensor keeps Megatron's tensor-parallel attributes (wsync.layouts).
The buffers are the rank's own parameters under their Megatron names:
register ``buffers(model)`` so names match.

    cfg = wsync.megatron.Config.from_transformer_config(model.config, vocab_size=hf_vocab)
    meg = wsync.layouts.Megatron(tp_rank, tp_size, ep_rank=ep_rank, ep_size=ep_size)
    recs = wsync.megatron.describe(model, rank=rank, megatron=meg, config=cfg)
    side = wsync.layouts.source_side(wsync.layouts.gather(recs))
    wsync.torch.register(wsync.megatron.buffers(model), group="trainer", rank=rank)
"""
import math
import re

from wsync import dtypes, layouts

_TOP = {"embedding.word_embeddings.weight": "model.embed_tokens.weight",
        "decoder.final_layernorm.weight": "model.norm.weight",
        "output_layer.weight": "lm_head.weight"}
_LAYER = {"self_attention.linear_qkv.layer_norm_weight": "input_layernorm.weight",
          "input_layernorm.weight": "input_layernorm.weight",
          "self_attention.k_layernorm.weight": "self_attn.k_norm.weight",
          "self_attention.linear_proj.weight": "self_attn.o_proj.weight",
          "mlp.linear_fc1.layer_norm_weight": "post_attention_layernorm.weight",
          "pre_mlp_layernorm.weight": "post_attention_layernorm.weight",
          "mlp.linear_fc2.weight": "mlp.down_proj.weight",
          "mlp.router.weight": "mlp.gate.weight",
          "mlp.router.expert_bias": "mlp.gate.e_score_correction_bias",
          "mlp.shared_experts.linear_fc2.weight": "mlp.shared_experts.down_proj.weight",
          # Multi-latent attention (DeepSeek-V3 / Kimi-K2): no reordering,
          # Megatron applies DeepSeek's rope de-interleave on the fly as HF does.
          "self_attention.linear_q_proj.weight": "self_attn.q_proj.weight",
          "self_attention.linear_q_down_proj.weight": "self_attn.q_a_proj.weight",
          "self_attention.linear_q_up_proj.weight": "self_attn.q_b_proj.weight",
          "self_attention.linear_q_up_proj.layer_norm_weight": "self_attn.q_a_layernorm.weight",
          "self_attention.linear_kv_down_proj.weight": "self_attn.kv_a_proj_with_mqa.weight",
          "self_attention.linear_kv_up_proj.weight": "self_attn.kv_b_proj.weight",
          "self_attention.linear_kv_up_proj.layer_norm_weight": "self_attn.kv_a_layernorm.weight",
          "self_attention.kv_layernorm.weight": "self_attn.kv_a_layernorm.weight",
          "self_attention.linear_qkv_down_proj.layer_norm_weight": "input_layernorm.weight"}
# q_layernorm is Qwen3's per-head q_norm, or MLA's q_a_layernorm.
_Q_NORM = "self_attention.q_layernorm.weight"
_GATE_UP = {"mlp.linear_fc1.weight": "mlp.", "mlp.shared_experts.linear_fc1.weight":
            "mlp.shared_experts."}
_QKV = {"self_attention.linear_qkv.weight": "weight", "self_attention.linear_qkv.bias": "bias"}
_LAYER_RE = re.compile(r"^decoder\.layers\.(\d+)\.(.+)$")
# SequentialMLP: experts.local_experts.<i>.linear_fc<n>.weight;
# TEGroupedMLP: experts.linear_fc<n>.weight<i>.
_EXPERT_RE = re.compile(r"^mlp\.experts\.(?:local_experts\.(\d+)\.linear_fc(\d)\.weight|"
                        r"linear_fc(\d)\.weight(\d+))$")
_VOCAB = ("model.embed_tokens.weight", "lm_head.weight")


class Config:
    """The model shape the fused layouts need (Megatron's TransformerConfig
    fields): attention heads, query groups (None: no GQA), head dim
    (kv_channels), whether the MLP is gated, the number of MoE experts, the
    HF vocabulary size (vocab_size; Megatron pads its embedding rows, the
    padding rows are not synced; None: no padding), and for multi-latent
    attention the flag and q_lora_rank (FusedMLASelfAttention's
    linear_qkv_down_proj is [q_a_proj; kv_a_proj_with_mqa])."""

    def __init__(self, num_attention_heads, kv_channels, num_query_groups=None,
                 gated_linear_unit=True, num_moe_experts=0, vocab_size=None,
                 multi_latent_attention=False, q_lora_rank=None):
        self.num_attention_heads = int(num_attention_heads)
        self.num_query_groups = int(num_query_groups or num_attention_heads)
        self.kv_channels = int(kv_channels)
        self.gated_linear_unit = bool(gated_linear_unit)
        self.num_moe_experts = int(num_moe_experts or 0)
        self.vocab_size = None if vocab_size is None else int(vocab_size)
        self.multi_latent_attention = bool(multi_latent_attention)
        self.q_lora_rank = None if q_lora_rank is None else int(q_lora_rank)
        if self.num_attention_heads % self.num_query_groups:
            raise ValueError(f"num_query_groups {self.num_query_groups} does not divide "
                             f"num_attention_heads {self.num_attention_heads}")

    @classmethod
    def from_transformer_config(cls, c, vocab_size=None):
        """From megatron.core.transformer.TransformerConfig (or any object with
        its field names)."""
        groups = c.num_query_groups if getattr(c, "group_query_attention", True) else None
        return cls(c.num_attention_heads, c.kv_channels or c.hidden_size // c.num_attention_heads,
                   num_query_groups=groups,
                   gated_linear_unit=getattr(c, "gated_linear_unit", True),
                   num_moe_experts=getattr(c, "num_moe_experts", 0) or 0, vocab_size=vocab_size,
                   multi_latent_attention=getattr(c, "multi_latent_attention", False),
                   q_lora_rank=getattr(c, "q_lora_rank", None))


# ------------------------------------------------------------ HF names --

def hf_name(name, *, layer_offset=0, expert_offset=0, mla=False):
    """(kind, HF name or HF prefix) of Megatron parameter `name`: kind "plain"
    (the HF tensor), "qkv" (prefix ``model.layers.L.self_attn.``, suffix
    weight/bias after ``|``), "gate_up" (prefix of gate_proj / up_proj) or
    "qkv_a" (MLA's fused down projection; prefix ``...self_attn.``).
    Local layer i is global layer layer_offset + i; local expert i is global
    expert expert_offset + i; `mla`: the model uses multi-latent attention.
    Raises ValueError for a name it does not know."""
    if name in _TOP:
        return "plain", _TOP[name]
    m = _LAYER_RE.match(name)
    if m is None:
        raise ValueError(f"Megatron tensor {name!r}: no Hugging Face name for it (known: "
                         f"{', '.join(_TOP)}, decoder.layers.<i>.<...>)")
    layer = f"model.layers.{layer_offset + int(m.group(1))}."
    rest = m.group(2)
    if rest in _LAYER:
        return "plain", layer + _LAYER[rest]
    if rest == _Q_NORM:
        return "plain", layer + ("self_attn.q_a_layernorm.weight" if mla
                                 else "self_attn.q_norm.weight")
    if rest in _QKV:
        return "qkv", f"{layer}self_attn.|{_QKV[rest]}"
    if rest == "self_attention.linear_qkv_down_proj.weight":
        return "qkv_a", layer + "self_attn."
    if rest in _GATE_UP:
        return "gate_up", layer + _GATE_UP[rest]
    e = _EXPERT_RE.match(rest)
    if e is not None:
        idx, fc = (e.group(1), e.group(2)) if e.group(1) is not None else (e.group(4), e.group(3))
        prefix = f"{layer}mlp.experts.{expert_offset + int(idx)}."
        return ("gate_up", prefix) if fc == "1" else ("plain", prefix + "down_proj.weight")
    raise ValueError(f"Megatron tensor {name!r}: no Hugging Face name for layer part {rest!r}")


# -------------------------------------------------------------- records --

def _box(name, t, shape, rank, rows, row_elems, local_row, buffer):
    """A box record: rows [rows[0], rows[1]) of HF tensor `name` (shape
    `shape`) at local row `local_row` of `buffer`."""
    length = [rows[1] - rows[0]] + list(shape[1:])
    return {"kind": "box", "name": name, "dtype": dtypes.name(t.dtype), "shape": list(shape),
            "rank": rank, "offset": [rows[0]] + [0] * (len(shape) - 1), "length": length,
            "buffer": buffer, "byte_offset": local_row * row_elems * t.element_size()}


def _tp_shard(name, t, meg, what):
    if not getattr(t, "tensor_model_parallel", False) or getattr(t, "partition_dim", 0) != 0:
        raise ValueError(f"Megatron tensor {name!r} ({what}): expected tensor_model_parallel "
                         f"with partition_dim 0, got tensor_model_parallel="
                         f"{getattr(t, 'tensor_model_parallel', None)} partition_dim="
                         f"{getattr(t, 'partition_dim', None)}")
    tp_rank, tp = meg.tp_of(t)
    return tp_rank, tp, math.prod(t.shape[1:])


def _window(name, t, meg, segments):
    """Box records of this rank's rows of a global tensor that is `segments`
    [(HF name, HF shape, first HF row, rows)] end to end, split over TP as
    one contiguous chunk per rank (or held whole when not tensor-parallel)."""
    if getattr(t, "tensor_model_parallel", False):
        tp_rank, tp, row_elems = _tp_shard(name, t, meg, "fused")
    else:
        tp_rank, tp, row_elems = 0, 1, math.prod(t.shape[1:])
    total = sum(n for _, _, _, n in segments)
    if t.shape[0] * tp != total:
        return None, (t.shape[0], tp, total)
    lo, hi = tp_rank * t.shape[0], (tp_rank + 1) * t.shape[0]
    out, start = [], 0
    for hf, shape, first, n in segments:
        a, b = max(lo, start), min(hi, start + n)
        if a < b:
            rows = (first + a - start, first + b - start)
            out.append((hf, shape, rows, row_elems, a - lo))
        start += n
    return out, None


def _records(name, t, rank, boxes):
    return [_box(hf, t, shape, rank, rows, row_elems, local, name)
            for hf, shape, rows, row_elems, local in boxes]


def qkv_records(name, t, *, rank, megatron, config, prefix, suffix):
    """Box records of HF q_proj / k_proj / v_proj (prefix + "q_proj." + suffix)
    for this rank's shard `t` of Megatron's interleaved linear_qkv."""
    _, tp = megatron.tp_of(t)
    groups, hd = config.num_query_groups, config.kv_channels
    qpg = config.num_attention_heads // groups
    if groups % tp and tp % groups:
        raise ValueError(f"Megatron tensor {name!r}: tensor-parallel size {tp} and "
                         f"num_query_groups {groups}: Megatron-core needs one to divide the "
                         "other (each rank holds whole query groups, or a group is split evenly)")
    cols = list(t.shape[1:])
    q, q_shape = f"{prefix}q_proj.{suffix}", [groups * qpg * hd] + cols
    k, v, kv_shape = f"{prefix}k_proj.{suffix}", f"{prefix}v_proj.{suffix}", [groups * hd] + cols
    segments = []  # per query group: its q heads, its k head, its v head
    for g in range(groups):
        segments += [(q, q_shape, g * qpg * hd, qpg * hd), (k, kv_shape, g * hd, hd),
                     (v, kv_shape, g * hd, hd)]
    boxes, bad = _window(name, t, megatron, segments)
    if bad is not None:
        raise ValueError(f"Megatron tensor {name!r}: local rows {bad[0]} x tp {bad[1]} = "
                         f"{bad[0] * bad[1]}, expected num_query_groups {groups} x (q_per_group "
                         f"{qpg} + 2) x head_dim {hd} = {bad[2]}")
    return _records(name, t, rank, boxes)


def qkv_a_records(name, t, *, rank, megatron, config, prefix):
    """Box records of HF q_a_proj / kv_a_proj_with_mqa for this rank's part of
    FusedMLASelfAttention's linear_qkv_down_proj ([q_a_proj; kv_a_proj_with_mqa],
    duplicated on every rank or split over TP)."""
    if config.q_lora_rank is None:
        raise ValueError(f"Megatron tensor {name!r}: fused MLA down projection needs "
                         "Config(q_lora_rank=...)")
    _, tp = megatron.tp_of(t) if getattr(t, "tensor_model_parallel", False) else (0, 1)
    cols, ql = list(t.shape[1:]), config.q_lora_rank
    kv_rows = t.shape[0] * tp - ql
    if kv_rows <= 0:
        raise ValueError(f"Megatron tensor {name!r}: {t.shape[0] * tp} rows, not more than "
                         f"q_lora_rank {ql}")
    boxes, _ = _window(name, t, megatron, [
        (prefix + "q_a_proj.weight", [ql] + cols, 0, ql),
        (prefix + "kv_a_proj_with_mqa.weight", [kv_rows] + cols, 0, kv_rows)])
    return _records(name, t, rank, boxes)


def gate_up_records(name, t, *, rank, megatron, prefix):
    """Box records of HF gate_proj / up_proj weights (prefix + "gate_proj.weight")
    for this rank's shard `t` of Megatron's gated linear_fc1 ([gate_r; up_r])."""
    tp_rank, tp, row_elems = _tp_shard(name, t, megatron, "gated linear_fc1")
    if t.shape[0] % 2:
        raise ValueError(f"Megatron tensor {name!r}: gated linear_fc1 with an odd row count "
                         f"{t.shape[0]} (want [gate; up] halves)")
    half = t.shape[0] // 2
    shape = [half * tp] + list(t.shape[1:])
    rows = (tp_rank * half, (tp_rank + 1) * half)
    return [_box(f"{prefix}gate_proj.weight", t, shape, rank, rows, row_elems, 0, name),
            _box(f"{prefix}up_proj.weight", t, shape, rank, rows, row_elems, half, name)]


def _vocab_records(name, hf, t, rank, meg, vocab):
    """Rows of the HF vocabulary a rank holds of Megatron's padded embedding
    or output layer (TP shards of the padded rows, padding dropped)."""
    tp_rank, tp, row_elems = _tp_shard(name, t, meg, "vocab-parallel")
    padded = t.shape[0] * tp
    if padded < vocab:
        raise ValueError(f"Megatron tensor {name!r}: {padded} rows over tp {tp}, fewer than "
                         f"the vocabulary size {vocab}")
    lo = tp_rank * t.shape[0]
    hi = min(lo + t.shape[0], vocab)
    if hi <= lo:
        return []
    return [_box(hf, t, [vocab] + list(t.shape[1:]), rank, (lo, hi), row_elems, 0, name)]


def _layer_modules(module):
    """{wrapper-stripped name: module} of `module`'s submodules (DDP and
    Float16Module add "module." prefixes that parameter names lose in
    buffers())."""
    return {_strip(n): m for n, m in module.named_modules()} if module is not None else {}


def _layer_offset(layers, name, layer_offset, megatron):
    """Global index of local layer 0 of `name`'s block: `layer_offset` when
    given, else the layer module's layer_number (1-based, global) minus its
    local index; 0 only on the first pipeline stage."""
    if layer_offset is not None:
        return layer_offset
    m = _LAYER_RE.match(name)
    if m is None:
        return 0
    number = getattr(layers.get(f"decoder.layers.{m.group(1)}"), "layer_number", None)
    if number is not None:
        return int(number) - 1 - int(m.group(1))
    if megatron.pp_rank == 0:
        return 0
    raise ValueError(
        f"Megatron tensor {name!r}: pipeline stage {megatron.pp_rank} but no layer_number on "
        "its layer module to place its layers globally; pass describe(..., layer_offset=N) "
        "(the global index of this stage's first layer)")


def _strip(name):
    name = layouts.clean_name(name)
    while name.startswith("module."):  # DDP / Float16Module wrappers
        name = name[len("module."):]
    return name


def buffers(model):
    """{buffer name: tensor} of this rank's parameters as ``describe`` names
    their buffers (Megatron names without wrapper prefixes): what to
    register with the worker."""
    named = model.named_parameters() if hasattr(model, "named_parameters") else model
    return {_strip(n): t for n, t in named}


def describe(model, *, rank, megatron, config, layer_offset=None):
    """This rank's wsync.layouts records (HF names) for a Megatron-core GPT
    model (a module, or (name, tensor) pairs). `megatron` is this rank's
    wsync.layouts.Megatron; `config` a Config. `layer_offset`: global index of
    this pipeline stage's first layer (default: from the layers' layer_number
    when `model` is a module, else 0). Local experts are numbered globally
    from ep_rank * num_local_experts."""
    layers = _layer_modules(model if hasattr(model, "named_parameters") else None)
    named = list(buffers(model).items())
    local_experts = config.num_moe_experts // megatron.ep_size if config.num_moe_experts else 0
    records = []
    for name, t in named:
        kind, hf = hf_name(name, layer_offset=_layer_offset(layers, name, layer_offset, megatron),
                           expert_offset=megatron.ep_rank * local_experts,
                           mla=config.multi_latent_attention)
        if kind == "qkv":
            prefix, suffix = hf.split("|")
            records += qkv_records(name, t, rank=rank, megatron=megatron, config=config,
                                   prefix=prefix, suffix=suffix)
        elif kind == "qkv_a":
            records += qkv_a_records(name, t, rank=rank, megatron=megatron, config=config,
                                     prefix=hf)
        elif kind == "gate_up":
            if not config.gated_linear_unit:
                raise ValueError(f"Megatron tensor {name!r}: linear_fc1 without "
                                 "gated_linear_unit has no Hugging Face gate_proj / up_proj")
            records += gate_up_records(name, t, rank=rank, megatron=megatron, prefix=hf)
        elif hf in _VOCAB and config.vocab_size is not None:
            records += _vocab_records(name, hf, t, rank, megatron, config.vocab_size)
        else:
            rec = layouts.describe([(hf, t)], rank=rank, megatron=megatron)[0]
            rec["buffer"] = name
            records.append(rec)
    return records
