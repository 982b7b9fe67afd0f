"""The destination side for vLLM, derived from the live model of one vLLM rank.

Inside a vLLM worker (after load_weights), on every tensor-parallel rank:

    live = wsync.vllm_live.destination_from_model(model, tp_rank=r, tp_size=tp)
    live.buffers       # {buffer name: the live parameter}: what this rank registers
    live.spec          # TransferSpec: this rank's fragments + the HF-name mappings
    spec = wsync.vllm_live.merge(every_rank_live)   # the whole destination side

The layout is read from ``model.named_modules()``: each parameter's owning
module says by its class (duck-typed by the names in its class hierarchy:
vLLM cannot be imported here) and attributes how vLLM split and fused it:
QKVParallelLinear (GQA kv heads replicated over tp / kv_heads ranks),
MergedColumnParallelLinear (gate_up_proj, MLA fused_qkv_a_proj),
Column/RowParallelLinear, ReplicatedLinear, VocabParallelEmbedding /
ParallelLMHead (vocab padded, only real rows are written), FusedMoE
(w13/w2 stacked local experts, TP or EP, the expert map), norms. Block-fp8
weights (float8_e4m3fn with ``weight_scale_inv``) are block-quantized
destinations whose scale tensors live in the scale parameters.

The result has the same form as wsync.vllm.destination (the HF-config path):
destination tensors named after vLLM's parameters, fragments with rank =
``rank`` (default tp_rank), buffer = the parameter's name, and mappings from
the trainer's Hugging Face names (experts "separate": experts.<e>.gate_proj;
"stacked": experts.gate_proj [E, ...]). Parameters of modules it does not
know, or that disagree with their module's attributes, are errors naming
the parameter and what was expected; ``skip`` (names or fnmatch patterns)
lists parameters the caller leaves out on purpose; module buffers (rotary
caches, expert maps) are never transferred and are listed.

The parameters are taken as vLLM's create_weights lays them out (the
checkpoint's form). Where a quantization method re-lays them out in
process_weights_after_loading (e.g. fp8 scales for DeepGEMM), that
destination is not the final one: the caller must run the post-processing
after each version, or derive before it and keep the pre-processed storage.
"""
import fnmatch

from wsync import dtypes
from wsync._proto import layout_pb2

# vLLM's fused parameters and the HF tensors they stack, in order (the
# models' load_weights stacked_params_mapping).
FUSED = {"qkv_proj": ("q_proj", "k_proj", "v_proj"), "gate_up_proj": ("gate_proj", "up_proj"),
         "fused_qkv_a_proj": ("q_a_proj", "kv_a_proj_with_mqa")}
_NORMS = ("RMSNorm", "LayerNorm", "GemmaRMSNorm")
_FP8 = "FP8_E4M3"


def _kinds(module):
    return {c.__name__ for c in type(module).__mro__}


def _cdiv(a, b):
    return -(-a // b)


def _scale_name(weight_name):
    """vLLM's block-scale name of a weight: "x.weight" -> "x.weight_scale_inv",
    "w13_weight.5" -> "w13_weight_scale_inv.5"."""
    at = weight_name.rfind("weight")
    return weight_name[:at + 6] + "_scale_inv" + weight_name[at + 6:]


class LiveDestination:
    """One rank's derivation: ``spec`` (destination side + mappings),
    ``buffers`` {name: tensor} to register, ``skipped`` parameter names,
    ``not_transferred`` module buffer names."""

    def __init__(self, rank, name):
        self.rank = rank
        self.spec = layout_pb2.TransferSpec()
        self.spec.destination.name = name
        self.buffers, self.skipped, self.not_transferred = {}, [], []
        self._tensors, self._maps = {}, set()

    def tensor(self, name, dtype, shape, offset, length, buffer, byte_offset=0, strides=None,
               scale=None):
        t = self._tensors.get(name)
        if t is None:
            t = self.spec.destination.tensors.add(name=name, dtype=dtypes.value(dtype),
                                                  shape=list(shape))
            t.fragments.SetInParent()
            if scale:
                t.block_quantization.scale_tensor = scale
            self._tensors[name] = t
        f = t.fragments.fragments.add(rank=self.rank, buffer=buffer, byte_offset=byte_offset)
        f.box.offset.extend(offset)
        f.box.length.extend(length)
        f.strides.extend(strides or [])

    def map(self, dst, dst_offset, src, src_offset, src_length):
        key = (dst, tuple(dst_offset), src, tuple(src_offset), tuple(src_length))
        if key in self._maps:
            return
        self._maps.add(key)
        m = self.spec.mappings.add(dst=dst, src=src)
        m.dst_offset.extend(dst_offset)
        m.src_box.offset.extend(src_offset)
        m.src_box.length.extend(src_length)


class _Param:
    def __init__(self, module_name, pname, tensor):
        self.name = f"{module_name}.{pname}" if module_name else pname
        self.tensor = tensor
        self.shape = list(tensor.shape)
        self.dtype = dtypes.name(tensor.dtype)


def _fail(param, what):
    raise ValueError(f"vLLM parameter {param.name!r} (shape {param.shape}, {param.dtype}): "
                     f"{what}")


def _expect_shape(p, want, why):
    if p.shape != list(want):
        _fail(p, f"expected shape {list(want)} ({why})")


def _attr(module, mname, key, default=None, required=True):
    v = getattr(module, key, default)
    if v is None and required:
        raise ValueError(f"vLLM module {mname!r} ({type(module).__name__}): attribute {key!r} "
                         "is missing")
    return v


def _strides(shape):
    out, acc = [], 1
    for n in reversed(shape):
        out.append(acc)
        acc *= n
    return list(reversed(out))


class _Deriver:
    """Emits one rank's tensors, buffers and mappings, layer by layer."""

    def __init__(self, out, *, tp_rank, tp_size, ep_rank, ep_size, config, experts):
        self.out, self.cfg, self.experts = out, config, experts
        self.tp_rank, self.tp_size, self.ep_rank, self.ep_size = tp_rank, tp_size, ep_rank, ep_size

    # --------------------------------------------------------- emitting --

    def emit(self, p, shape, offset, length, byte_offset=0, name=None, scale=None):
        """Fragment of destination tensor `name` (default the parameter's) held
        at element `byte_offset` of parameter `p`'s buffer; with `scale` (the
        live scale parameter) the tensor is block-fp8 quantized."""
        name = name or p.name
        if not p.tensor.is_contiguous():
            _fail(p, "expected a contiguous parameter (wsync writes it row-major)")
        elem = dtypes.size(p.dtype)
        scale_name = _scale_name(name) if scale is not None else None
        if (p.dtype == _FP8) != (scale is not None):
            _fail(p, "float8_e4m3fn weight without a weight_scale_inv parameter: only vLLM's "
                  "block-fp8 (weight_block_size [128, 128]) is supported" if scale is None else
                  f"block scales {scale.name!r} given for a {p.dtype} weight (expected "
                  "float8_e4m3fn)")
        self.out.tensor(name, p.dtype, shape, offset, length, p.name, byte_offset * elem,
                        scale=scale_name)
        self.out.buffers[p.name] = p.tensor
        if scale is not None:
            self.emit_scale(p, scale, scale_name, shape, offset, length, byte_offset)

    def emit_scale(self, p, s, name, shape, offset, length, first):
        """The scale fragment of a weight fragment: blocks of 128 x 128 of the
        last two dims, located in the live scale parameter `s`."""
        inner = p.shape[-2] * p.shape[-1]
        lead, rest = divmod(first, inner)
        row, col = divmod(rest, p.shape[-1])
        want = p.shape[:-2] + [_cdiv(p.shape[-2], 128), _cdiv(p.shape[-1], 128)]
        if row % 128 or col % 128 or any(o % 128 for o in offset[-2:]):
            _fail(p, f"fragment at {offset} does not start on a 128-block (block fp8)")
        if s.shape != want:
            _fail(s, f"expected the block scales of {p.name!r}: shape {want} (weight_block_size "
                  "[128, 128])")
        sstr = _strides(s.shape)
        at = (lead * sstr[-3] if len(s.shape) > 2 else 0) + row // 128 * sstr[-2] + col // 128
        nlead = len(shape) - 2
        s_off = list(offset[:nlead]) + [o // 128 for o in offset[-2:]]
        s_len = list(length[:nlead]) + [_cdiv(o + n, 128) - o // 128
                                        for o, n in zip(offset[-2:], length[-2:])]
        s_shape = list(shape[:nlead]) + [_cdiv(n, 128) for n in shape[-2:]]
        strides = ([sstr[-3]] if nlead else []) + sstr[-2:]
        if s.dtype != "FP32":
            _fail(s, f"block scales of dtype {s.dtype}: only fp32 weight_scale_inv is supported")
        self.out.tensor(name, s.dtype, s_shape, s_off, s_len, s.name, 4 * at, strides=strides)
        self.out.buffers[s.name] = s.tensor

    def whole(self, p):
        self.emit(p, p.shape, [0] * len(p.shape), p.shape)

    # ------------------------------------------------------------ layers --

    def linear(self, mname, m, kinds, params):
        """A LinearBase: weight (bf16, or float8_e4m3fn with its block scales
        weight_scale_inv), optional bias; DeepSeek's router keeps its
        e_score_correction_bias on the gate, a ReplicatedLinear."""
        w = params.pop("weight", None)
        if w is None:
            raise ValueError(f"vLLM module {mname!r} ({type(m).__name__}): no weight parameter")
        scale = params.pop("weight_scale_inv", None)
        if scale is not None and list(_attr(m, mname, "weight_block_size")) != [128, 128]:
            _fail(scale, f"weight_block_size {m.weight_block_size}: only [128, 128] is supported")
        bias = params.pop("bias", None)
        router_bias = params.pop("e_score_correction_bias", None)
        if params:
            _fail(next(iter(params.values())), f"unexpected parameter of {type(m).__name__} "
                  "(only weight, bias and block-fp8 weight_scale_inv are understood)")
        if router_bias is not None:
            self.whole(router_bias)
        tp = 1 if getattr(m, "disable_tp", False) else int(getattr(m, "tp_size", 1))
        rank = int(getattr(m, "tp_rank", 0)) if tp > 1 else 0
        if tp not in (1, self.tp_size) or (tp > 1 and rank != self.tp_rank):
            _fail(w, f"module tp_size {tp} tp_rank {rank}, expected tp_size 1 or "
                  f"{self.tp_size} with tp_rank {self.tp_rank}")
        if "ReplicatedLinear" in kinds:
            _expect_shape(w, [_attr(m, mname, "output_size"), _attr(m, mname, "input_size")],
                          "ReplicatedLinear [output_size, input_size]")
            self.emit(w, w.shape, [0, 0], w.shape, scale=scale)
        elif "RowParallelLinear" in kinds:
            self.row_linear(mname, m, w, scale, tp, rank)
        else:
            self.column_linear(mname, m, kinds, w, scale, bias, tp, rank)
            return
        if bias is not None:  # replicated, and a row-parallel layer's bias is whole
            self.whole(bias)

    def row_linear(self, mname, m, w, scale, tp, rank):
        ipp = w.shape[1]
        _expect_shape(w, [_attr(m, mname, "output_size"), _attr(m, mname, "input_size") // tp],
                      "RowParallelLinear [output_size, input_size / tp]")
        self.emit(w, [w.shape[0], ipp * tp], [0, rank * ipp], w.shape, scale=scale)

    def column_linear(self, mname, m, kinds, w, scale, bias, tp, rank):
        """Column-parallel (and fused: qkv, gate_up, fused_qkv_a): rank r's
        rows [r*L, (r+1)*L) of the stacked local weights, fed per segment."""
        segs = self.column_segments(mname, m, kinds, w, tp, rank)
        out_pp = sum(n for _, _, n in segs)
        _expect_shape(w, [out_pp, _attr(m, mname, "input_size")],
                      f"{type(m).__name__} rows {[n for _, _, n in segs]} x input_size")
        self.emit(w, [out_pp * tp, w.shape[1]], [rank * out_pp, 0], w.shape, scale=scale)
        if bias is not None:
            _expect_shape(bias, [out_pp], "the fused rows of the weight")
            self.emit(bias, [out_pp * tp], [rank * out_pp], [out_pp])
        if len(segs) == 1 and segs[0][0] == w.name:
            return  # fed whole by the source of the same name
        at = rank * out_pp
        for src, start, n in segs:
            self.out.map(w.name, [at, 0], src, [start, 0], [n, w.shape[1]])
            if bias is not None:
                self.out.map(bias.name, [at], src[:-len("weight")] + "bias", [start], [n])
            at += n

    def column_segments(self, mname, m, kinds, w, tp, rank):
        """[(HF source, first row, rows)] of this rank's column-parallel weight."""
        prefix, _, short = mname.rpartition(".")
        prefix = prefix + "." if prefix else ""
        if "QKVParallelLinear" in kinds:
            hd = _attr(m, mname, "head_size")
            vd = getattr(m, "v_head_size", hd) or hd
            nh, nkv = _attr(m, mname, "num_heads"), _attr(m, mname, "num_kv_heads")
            total_kv = _attr(m, mname, "total_num_kv_heads")
            reps = getattr(m, "num_kv_head_replicas", None) or max(1, tp // total_kv)
            self.check_config(w, "num_attention_heads", _attr(m, mname, "total_num_heads"))
            self.check_config(w, "num_key_value_heads", total_kv)
            if nh * tp != m.total_num_heads or max(nkv * tp // reps, 1) != total_kv:
                _fail(w, f"QKVParallelLinear heads {nh} q / {nkv} kv per rank with "
                      f"{reps} kv replicas do not make {m.total_num_heads} / {total_kv} over "
                      f"tp {tp}")
            kv = rank // reps
            names = [prefix + n + ".weight" for n in FUSED["qkv_proj"]]
            return [(names[0], rank * nh * hd, nh * hd), (names[1], kv * nkv * hd, nkv * hd),
                    (names[2], kv * nkv * vd, nkv * vd)]
        if "MergedColumnParallelLinear" in kinds:
            sizes = list(_attr(m, mname, "output_sizes"))
            hf = FUSED.get(short)
            if hf is None or len(hf) != len(sizes):
                _fail(w, f"unknown fused layer {short!r} ({type(m).__name__} with output sizes "
                      f"{sizes}): known fused layers are "
                      + ", ".join(f"{k} = {' + '.join(v)}" for k, v in FUSED.items()))
            out = []
            for n, size in zip(hf, sizes):
                if size % tp:
                    _fail(w, f"output size {size} of {n} does not divide by tp {tp}")
                out.append((prefix + n + ".weight", rank * (size // tp), size // tp))
            return out
        if not kinds & {"ColumnParallelLinear"}:
            _fail(w, f"unknown linear layer {type(m).__name__}")
        size = _attr(m, mname, "output_size")
        if size % tp:
            _fail(w, f"output_size {size} does not divide by tp {tp}")
        return [(w.name, rank * (size // tp), size // tp)]

    def vocab(self, mname, m, params):
        w = params.pop("weight", None)
        if w is None or params:
            found = sorted(params) + (["weight"] if w else [])
            raise ValueError(f"vLLM module {mname!r} ({type(m).__name__}): expected exactly one "
                             f"parameter 'weight', found {found}")
        vocab, org = _attr(m, mname, "num_embeddings"), _attr(m, mname, "org_vocab_size")
        if vocab != org:
            _fail(w, f"{vocab - org} added (LoRA) vocabulary rows are not supported")
        self.check_config(w, "vocab_size", org)
        padded, per = _attr(m, mname, "num_embeddings_padded"), \
            _attr(m, mname, "num_embeddings_per_partition")
        _expect_shape(w, [per, _attr(m, mname, "embedding_dim")],
                      "[num_embeddings_per_partition, embedding_dim]")
        si = _attr(m, mname, "shard_indices")
        get = (lambda k: si[k]) if isinstance(si, dict) else (lambda k: getattr(si, k))
        start, lo, hi = (get("padded_org_vocab_start_index"), get("org_vocab_start_index"),
                         get("org_vocab_end_index"))
        if (padded != per * self.tp_size or start != self.tp_rank * per or lo != min(start, org)
                or hi != min(start + per, org)):
            _fail(w, f"shard [{lo}, {hi}) at padded row {start} of {padded}: expected rank "
                  f"{self.tp_rank}'s {per} rows of {per * self.tp_size}")
        if hi > lo:
            self.emit(w, [padded, w.shape[1]], [start, 0], [hi - lo, w.shape[1]])
        self.out.map(w.name, [0, 0], w.name, [0, 0], [org, w.shape[1]])

    def fused_moe(self, mname, m, params):
        w13, w2 = params.pop("w13_weight", None), params.pop("w2_weight", None)
        s13, s2 = params.pop("w13_weight_scale_inv", None), params.pop("w2_weight_scale_inv", None)
        if w13 is None or w2 is None or params or (s13 is None) != (s2 is None):
            raise ValueError(f"vLLM module {mname!r} (FusedMoE): expected w13_weight, w2_weight "
                             f"(and block-fp8 w13/w2_weight_scale_inv), found "
                             f"{sorted(params) + [p.name for p in (w13, w2, s13, s2) if p]}")
        E, local = _attr(m, mname, "global_num_experts"), _attr(m, mname, "local_num_experts")
        ipp, H = _attr(m, mname, "intermediate_size_per_partition"), _attr(m, mname, "hidden_size")
        tp, ep = int(getattr(m, "tp_size", 1)), int(getattr(m, "ep_size", 1))
        tr = int(getattr(m, "tp_rank", 0)) if tp > 1 else 0
        er = int(getattr(m, "ep_rank", 0)) if ep > 1 else 0
        if (tp, ep) not in ((self.tp_size, 1), (1, self.ep_size)) or \
                (ep > 1 and er != self.ep_rank) or (tp > 1 and tr != self.tp_rank):
            _fail(w13, f"FusedMoE tp {tp} rank {tr}, ep {ep} rank {er}: "
                  f"expected tp {self.tp_size} rank {self.tp_rank} or ep {self.ep_size} rank "
                  f"{self.ep_rank} (expert parallelism over the tp ranks)")
        self.check_config(w13, ("num_experts", "n_routed_experts"), E)
        ids = self.local_experts(w13, m, E, local)
        _expect_shape(w13, [local, 2 * ipp, H], "[local_num_experts, 2 * "
                      "intermediate_size_per_partition, hidden_size]")
        _expect_shape(w2, [local, H, ipp], "[local_num_experts, hidden_size, "
                      "intermediate_size_per_partition]")
        prefix = mname[:-len("experts")] if mname.endswith("experts") else mname + "."
        I = ipp * tp
        if self.experts == "separate":
            for i, e in enumerate(ids):
                n13, n2 = f"{w13.name}.{e}", f"{w2.name}.{e}"
                self.emit(w13, [2 * I, H], [tr * 2 * ipp, 0], [2 * ipp, H], i * 2 * ipp * H, n13,
                          scale=s13)
                self.emit(w2, [H, I], [0, tr * ipp], [H, ipp], i * H * ipp, n2, scale=s2)
                src = f"{prefix}experts.{e}."
                self.out.map(n13, [tr * 2 * ipp, 0], src + "gate_proj.weight", [tr * ipp, 0],
                             [ipp, H])
                self.out.map(n13, [tr * 2 * ipp + ipp, 0], src + "up_proj.weight",
                             [tr * ipp, 0], [ipp, H])
                self.out.map(n2, [0, 0], src + "down_proj.weight", [0, 0], [H, I])
            return
        runs = [(i, e) for i, e in enumerate(ids) if i == 0 or e != ids[i - 1] + 1]
        for k, (i, e) in enumerate(runs):
            n = (runs[k + 1][0] if k + 1 < len(runs) else local) - i
            self.emit(w13, [E, 2 * I, H], [e, tr * 2 * ipp, 0], [n, 2 * ipp, H],
                      i * 2 * ipp * H, scale=s13)
            self.emit(w2, [E, H, I], [e, 0, tr * ipp], [n, H, ipp], i * H * ipp, scale=s2)
        src = f"{prefix}experts."
        self.out.map(w13.name, [0, tr * 2 * ipp, 0], src + "gate_proj", [0, tr * ipp, 0],
                     [E, ipp, H])
        self.out.map(w13.name, [0, tr * 2 * ipp + ipp, 0], src + "up_proj", [0, tr * ipp, 0],
                     [E, ipp, H])
        self.out.map(w2.name, [0, 0, 0], src + "down_proj", [0, 0, 0], [E, H, I])

    def local_experts(self, w13, m, E, local):
        """Global expert id of each local expert, from the module's expert map
        (global -> local index, -1 elsewhere; None: every expert is local)."""
        emap = getattr(m, "expert_map", None)
        if emap is None:
            emap = getattr(m, "_expert_map", None)
        if emap is None:
            if local != E:
                _fail(w13, f"{local} local of {E} experts but no expert_map")
            return list(range(E))
        emap = emap.tolist() if hasattr(emap, "tolist") else list(emap)
        ids = [None] * local
        for e, i in enumerate(emap):
            if i >= 0:
                if i >= local or ids[i] is not None:
                    _fail(w13, f"expert_map sends expert {e} to local slot {i} of {local}")
                ids[i] = e
        if len(emap) != E or None in ids:
            _fail(w13, f"expert_map of {len(emap)} entries does not place {local} local experts "
                  f"of {E}")
        return ids

    def check_config(self, p, keys, got):
        if self.cfg is None:
            return
        for k in (keys,) if isinstance(keys, str) else keys:
            want = self.cfg.get(k)
            if want is not None:
                if int(want) != int(got):
                    _fail(p, f"the module says {got}, the model config's {k} is {want}")
                return


def _config_dict(model, hf_config):
    c = hf_config if hf_config is not None else getattr(model, "config", None)
    if c is None:
        return None
    if hasattr(c, "to_dict"):
        c = c.to_dict()
    return dict(c)


def destination_from_model(model, *, tp_rank, tp_size, ep_rank=0, ep_size=1, hf_config=None,
                           experts="separate", rank=None, skip=(), name="inference"):
    """This rank's LiveDestination for `model` (a torch.nn.Module tree of
    vLLM layers). ``ep_size`` > 1: FusedMoE experts are split over the tp
    ranks (vLLM's enable_expert_parallel with one data-parallel rank). The
    HF config (``hf_config`` or ``model.config``) cross-checks head, expert
    and vocabulary counts when given."""
    if experts not in ("separate", "stacked"):
        raise ValueError(f"experts {experts!r}: expected 'separate' or 'stacked'")
    if not 0 <= tp_rank < tp_size or not 0 <= ep_rank < ep_size or ep_size not in (1, tp_size):
        raise ValueError(f"tp rank {tp_rank} of {tp_size}, ep rank {ep_rank} of {ep_size}: "
                         "expected ranks in range and ep_size 1 or tp_size")
    out = LiveDestination(tp_rank if rank is None else rank, name)
    d = _Deriver(out, tp_rank=tp_rank, tp_size=tp_size, ep_rank=ep_rank, ep_size=ep_size,
                 config=_config_dict(model, hf_config), experts=experts)
    seen, unknown = set(), []
    for mname, m in model.named_modules():
        params = {}
        for pname, t in m.named_parameters(recurse=False):
            if id(t) in seen:  # tied (lm_head = embed_tokens): vLLM holds it once
                continue
            seen.add(id(t))
            p = _Param(mname, pname, t)
            if any(fnmatch.fnmatchcase(p.name, s) for s in skip):
                out.skipped.append(p.name)
            else:
                params[pname] = p
        for bname, _ in m.named_buffers(recurse=False):
            out.not_transferred.append(f"{mname}.{bname}" if mname else bname)
        if not params:
            continue
        kinds = _kinds(m)
        if kinds & {"VocabParallelEmbedding", "ParallelLMHead"}:
            d.vocab(mname, m, params)
        elif "FusedMoE" in kinds:
            d.fused_moe(mname, m, params)
        elif "LinearBase" in kinds:
            d.linear(mname, m, kinds, params)
        elif kinds & set(_NORMS) and list(params) == ["weight"]:
            d.whole(params["weight"])
        else:
            unknown += [f"{p.name} ({type(m).__name__})" for p in params.values()]
    if unknown:
        raise ValueError("vLLM parameters of modules wsync does not understand (pass them in "
                         "skip= to leave them out): " + ", ".join(unknown))
    return out


def merge(parts, *, name="inference"):
    """One TransferSpec from every rank's LiveDestination: tensors in order of
    first appearance, their fragments in rank order; the ranks must agree on
    each tensor's dtype, shape and quantization. Mappings deduplicated."""
    spec = layout_pb2.TransferSpec()
    spec.destination.name = name
    tensors, seen = {}, set()
    for part in sorted(parts, key=lambda p: p.rank):
        for t in part.spec.destination.tensors:
            have = tensors.get(t.name)
            if have is None:
                have = tensors[t.name] = spec.destination.tensors.add()
                have.CopyFrom(t)
                continue
            if (have.dtype, list(have.shape), have.block_quantization) != \
                    (t.dtype, list(t.shape), t.block_quantization):
                raise ValueError(f"tensor {t.name!r}: rank {part.rank} has dtype "
                                 f"{layout_pb2.DType.Name(t.dtype)} shape {list(t.shape)}, an "
                                 f"earlier rank {layout_pb2.DType.Name(have.dtype)} "
                                 f"{list(have.shape)}")
            have.fragments.fragments.extend(t.fragments.fragments)
        for m in part.spec.mappings:
            key = m.SerializeToString(deterministic=True)
            if key not in seen:
                seen.add(key)
                spec.mappings.add().CopyFrom(m)
    return spec
