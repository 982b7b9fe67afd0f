"""The source side of a TransferSpec, derived from the trainer's model.

Each rank describes what it holds (``describe``): a DTensor parameter
(FSDP2 ``fully_shard``, ``parallelize_module``, HSDP, ``_StridedShard``)
carries its whole layout in its mesh and placements; a Megatron-core
parameter says by its attributes (``tensor_model_parallel``,
``partition_dim``, ``partition_stride``) how it is split over the
tensor-parallel ranks (Megatron's fused qkv / gated fc1 and its names:
wsync.megatron); any other tensor is held whole by the rank unless it
was ``annotate``d (a mesh layout, or the box of the global tensor the rank
holds). A box record may also give the box's ``byte_offset`` in its buffer
and element ``strides`` (several boxes of one buffer). ``source_side``
merges the descriptions of every rank (gathered with ``gather`` or passed
in) into a wsync.v1.Side (docs/layout-spec.md).

Records are plain dicts, so they pickle through
``torch.distributed.all_gather_object``.
"""
from wsync import dtypes
from wsync._proto import layout_pb2

ANNOTATION = "_wsync_layout"
_COMPILE_PREFIXES = ("_orig_mod.", "_fsdp_wrapped_module.", "_checkpoint_wrapped_module.")


# ------------------------------------------------------------- placements --

def shard(dim):
    return {"shard": {"dim": dim}}


def strided_shard(dim, split_factor):
    return {"stridedShard": {"dim": dim, "splitFactor": split_factor}}


def replicate():
    return {"replicate": {}}


def partial(op="sum"):
    ops = {"sum": "REDUCE_SUM", "avg": "REDUCE_AVG", "REDUCE_SUM": "REDUCE_SUM",
           "REDUCE_AVG": "REDUCE_AVG"}
    if op not in ops:
        raise ValueError(f"partial reduce op {op!r}: wsync reduces sum or avg")
    return {"partial": {"op": ops[op]}}


def placement_of(p):
    """A torch.distributed.tensor Placement (or an object with the same
    methods and attributes) as a placement dict."""
    # _StridedShard first: whether it also answers is_shard() differs between
    # torch versions (a Shard subclass in Python, its own class in C++ later).
    if getattr(p, "split_factor", None) is not None:
        return strided_shard(p.dim, p.split_factor)
    if p.is_shard():
        return shard(p.dim)
    if p.is_replicate():
        return replicate()
    if p.is_partial():
        return partial(getattr(p, "reduce_op", "sum"))
    raise ValueError(f"unsupported placement {p!r}")


# -------------------------------------------------------------- annotate --

def annotate(tensor, *, shape=None, mesh_shape=None, ranks=None, placements=None, box=None,
             buffer=None, name=None):
    """Says how `tensor` (this rank's local part) lies in the global tensor:
    either the whole mesh layout (``mesh_shape``, ``ranks`` (side-local rank
    per mesh coordinate, row-major) and ``placements``), or ``box=(offset,
    length)``: this rank holds that box, row-major and contiguous. ``shape`` is
    the global shape (default: the local one). Returns `tensor`."""
    if (box is None) == (mesh_shape is None):
        raise ValueError("annotate: give either box=(offset, length) or mesh_shape/ranks/"
                         "placements")
    info = {"shape": list(shape if shape is not None else tensor.shape), "buffer": buffer,
            "name": name}
    if box is None:
        if ranks is None or placements is None:
            raise ValueError("annotate: a mesh layout needs ranks and placements")
        info.update(kind="mesh", mesh_shape=list(mesh_shape), ranks=list(ranks),
                    placements=list(placements))
    else:
        info.update(kind="box", offset=list(box[0]), length=list(box[1]))
    setattr(tensor, ANNOTATION, info)
    return tensor


# -------------------------------------------------------------- describe --

class Megatron:
    """This rank's place in Megatron-core's parallel state: its tensor-parallel
    rank and size (parallel_state.get_tensor_model_parallel_rank() / _world_size()),
    its expert-parallel rank (for the name map: local expert i of ep rank e is
    global expert e * num_local_experts + i) and its pipeline stage."""

    def __init__(self, tp_rank, tp_size, ep_rank=0, ep_size=1, pp_rank=0, etp_rank=None,
                 etp_size=None):
        self.tp_rank, self.tp_size = tp_rank, tp_size
        self.ep_rank, self.ep_size = ep_rank, ep_size
        self.pp_rank = pp_rank
        # Expert tensor parallelism (expert_tensor_parallel_size): expert
        # parameters (Megatron marks them allreduce=False) split over these.
        self.etp_rank = tp_rank if etp_rank is None else etp_rank
        self.etp_size = tp_size if etp_size is None else etp_size

    def tp_of(self, tensor):
        """(rank, size) of the tensor-parallel group that splits `tensor`."""
        if getattr(tensor, "allreduce", True) is False:
            return self.etp_rank, self.etp_size
        return self.tp_rank, self.tp_size


def clean_name(name):
    for p in _COMPILE_PREFIXES:
        name = name.replace(p, "")
    return name


def _is_dtensor(t):
    return hasattr(t, "device_mesh") and hasattr(t, "placements")


def _mesh_record(name, t, rank_of):
    mesh = t.device_mesh
    grid = mesh.mesh
    ranks = [rank_of(int(r)) for r in grid.flatten().tolist()]
    return {"kind": "mesh", "name": name, "dtype": dtypes.name(t.dtype),
            "shape": list(t.shape), "mesh_shape": list(grid.shape), "ranks": ranks,
            "placements": [placement_of(p) for p in t.placements], "buffer": None}


def _megatron_record(name, t, rank, meg):
    tp_split = bool(getattr(t, "tensor_model_parallel", False))
    tp_rank, tp_size = meg.tp_of(t)
    shape = list(t.shape)
    dim = getattr(t, "partition_dim", -1) if tp_split else None
    if tp_split:
        if dim is None or not 0 <= dim < len(shape):
            raise ValueError(f"{name}: tensor_model_parallel with partition_dim {dim} outside "
                             f"its {len(shape)} dims")
        shape[dim] *= tp_size
    return {"kind": "megatron", "name": name, "dtype": dtypes.name(t.dtype), "shape": shape,
            "rank": rank, "tp_rank": tp_rank, "tp_size": tp_size, "partition_dim": dim,
            "stride": int(getattr(t, "partition_stride", 1) or 1), "buffer": None}


def describe(named_tensors, *, rank=0, rank_of=None, megatron=None, name_map=None):
    """This rank's records for `named_tensors` ((name, tensor) pairs or a
    torch.nn.Module). `rank` is this rank's side-local rank; `rank_of` maps a
    DTensor mesh's global ranks to side-local ranks (default: the same).
    With `megatron` (a Megatron instance), parameters carrying Megatron's
    tensor-parallel attributes are described by them. `name_map(name, info)`
    renames tensors (e.g. Megatron -> HF names, local -> global experts; info
    is the Megatron instance or None); returning None skips a tensor."""
    if hasattr(named_tensors, "named_parameters"):
        named_tensors = named_tensors.named_parameters()
    rank_of = rank_of or (lambda r: r)
    records = []
    for raw_name, t in named_tensors:
        name = clean_name(raw_name)
        if name_map is not None:
            name = name_map(name, megatron)
            if name is None:
                continue
        info = getattr(t, ANNOTATION, None)
        if info is not None:
            rec = dict(info, name=info.get("name") or name, dtype=dtypes.name(t.dtype))
            if rec["kind"] == "box":
                rec["rank"] = rank
        elif _is_dtensor(t):
            rec = _mesh_record(name, t, rank_of)
        elif megatron is not None and hasattr(t, "tensor_model_parallel"):
            rec = _megatron_record(name, t, rank, megatron)
        else:
            shape = list(t.shape)
            rec = {"kind": "box", "name": name, "dtype": dtypes.name(t.dtype), "shape": shape,
                   "rank": rank, "offset": [0] * len(shape), "length": shape, "buffer": None}
        records.append(rec)
    return records


def gather(records, group=None):
    """Every rank's records (torch.distributed.all_gather_object), rank order."""
    import torch.distributed as dist
    out = [None] * dist.get_world_size(group)
    dist.all_gather_object(out, records, group=group)
    return out


# ----------------------------------------------------------------- merge --

def _flatten(records):
    if records and isinstance(records[0], list):
        return [r for per_rank in records for r in per_rank]
    return list(records)


def _check_same(name, recs, keys):
    first = recs[0]
    for r in recs[1:]:
        for k in keys:
            if r.get(k) != first.get(k):
                raise ValueError(f"tensor {name!r}: ranks disagree on {k} "
                                 f"({first.get(k)} vs {r.get(k)})")


def _layout(name, dtype, shape):
    t = layout_pb2.TensorLayout(name=name, dtype=dtypes.value(dtype), shape=shape)
    return t


def _set_mesh(t, mesh_shape, ranks, placements, buffer):
    from google.protobuf import json_format
    mesh = {"meshShape": mesh_shape, "ranks": ranks, "placements": placements}
    if buffer:
        mesh["buffer"] = buffer
    json_format.ParseDict(mesh, t.mesh)


def _merge_mesh(name, recs, replicated_meshes=False):
    """One mesh layout. Records of several disjoint meshes of the same shape
    and placements (e.g. a norm weight FSDP-sharded over each tensor-parallel
    rank's data-parallel sub-mesh) are replicas, an outer Replicate dim, only
    with `replicated_meshes`: the same name on separate meshes may also be
    different data (experts named by their local index on each expert-parallel
    rank), which nothing in a DTensor tells apart."""
    _check_same(name, recs, ("dtype", "shape", "mesh_shape", "placements", "buffer"))
    groups = sorted({tuple(r["ranks"]) for r in recs})
    if len(groups) > 1 and not replicated_meshes:
        raise ValueError(
            f"tensor {name!r}: ranks hold it on {len(groups)} separate meshes {groups[:4]}; if "
            "each mesh holds the same tensor (e.g. a norm weight under TP x FSDP2, sharded over "
            "each TP rank's data-parallel sub-mesh), pass source_side(..., "
            "replicated_meshes=True); if they hold different data, give them distinct names")
    seen = set()
    for g in groups:
        if seen & set(g):
            raise ValueError(f"tensor {name!r}: ranks describe overlapping meshes {groups}")
        seen |= set(g)
    r = recs[0]
    t = _layout(name, r["dtype"], r["shape"])
    if len(groups) == 1:
        _set_mesh(t, r["mesh_shape"], r["ranks"], r["placements"], r.get("buffer"))
    else:
        _set_mesh(t, [len(groups)] + list(r["mesh_shape"]), [x for g in groups for x in g],
                  [replicate()] + list(r["placements"]), r.get("buffer"))
    return t


def _merge_megatron(name, recs):
    _check_same(name, recs, ("dtype", "shape", "tp_size", "partition_dim", "stride"))
    r0 = recs[0]
    tp = r0["tp_size"]
    by_tp = {}
    for r in sorted(recs, key=lambda r: r["rank"]):
        by_tp.setdefault(r["tp_rank"], []).append(r["rank"])
    if sorted(by_tp) != list(range(tp)) or len({len(v) for v in by_tp.values()}) != 1:
        counts = {k: len(v) for k, v in sorted(by_tp.items())}
        raise ValueError(f"tensor {name!r}: holders per tensor-parallel rank {counts} do not "
                         f"form replicas of tp {tp}")
    replicas = len(by_tp[0])
    ranks = [by_tp[j][i] for i in range(replicas) for j in range(tp)]
    dim, stride = r0["partition_dim"], r0["stride"]
    if dim is None:
        inner = replicate()
    elif stride > 1:
        inner = strided_shard(dim, stride)
    else:
        inner = shard(dim)
    t = _layout(name, r0["dtype"], r0["shape"])
    _set_mesh(t, [replicas, tp], ranks, [replicate(), inner], r0.get("buffer"))
    return t


def _merge_boxes(name, recs):
    _check_same(name, recs, ("dtype", "shape"))
    t = _layout(name, recs[0]["dtype"], recs[0]["shape"])
    t.fragments.SetInParent()
    for r in sorted(recs, key=lambda r: r["rank"]):
        f = t.fragments.fragments.add(rank=r["rank"])
        f.box.offset.extend(r["offset"])
        f.box.length.extend(r["length"])
        if r.get("buffer"):
            f.buffer = r["buffer"]
        f.byte_offset = r.get("byte_offset", 0)
        if r.get("strides"):
            f.strides.extend(r["strides"])
    return t


_MERGE = {"mesh": _merge_mesh, "megatron": _merge_megatron, "box": _merge_boxes}


def source_side(records, *, name="trainer", replicated_meshes=False):
    """A wsync.v1.Side from the records of every rank (a list of per-rank lists,
    as ``gather`` returns, or one flat list). Tensors keep the order of first
    appearance. The side's ranks are left empty: the controller fills them
    from the registered workers. `replicated_meshes`: a tensor that ranks
    hold on several disjoint meshes of one shape is the same tensor on each
    (TP x FSDP2's non-TP parameters); otherwise that is an error."""
    by_name = {}
    for r in _flatten(records):
        by_name.setdefault(r["name"], []).append(r)
    side = layout_pb2.Side(name=name)
    for tname, recs in by_name.items():
        kinds = {r["kind"] for r in recs}
        if len(kinds) != 1:
            raise ValueError(f"tensor {tname!r}: ranks describe it differently ({sorted(kinds)})")
        kind = kinds.pop()
        if kind == "mesh":
            side.tensors.append(_merge_mesh(tname, recs, replicated_meshes))
        else:
            side.tensors.append(_MERGE[kind](tname, recs))
    return side


def source_from_module(module, **kwargs):
    """source_side(describe(module)) for a model whose layouts are all known
    on this rank (DTensors, mesh annotations); otherwise gather first."""
    return source_side(describe(module, **kwargs), name=kwargs.get("name", "trainer"))


def transfer_spec(source, destination, *, name="", options=None):
    """The TransferSpec of `source` (a Side) and `destination` (the spec
    wsync.vllm.destination returns: destination side and mappings). Casts
    between the two sides' float dtypes are allowed (block-fp8 destinations
    need none)."""
    spec = layout_pb2.TransferSpec(name=name)
    spec.source.CopyFrom(source)
    spec.destination.CopyFrom(destination.destination)
    spec.mappings.extend(destination.mappings)
    if options is not None:
        spec.options.CopyFrom(options)
    floats = {layout_pb2.FP32, layout_pb2.BF16, layout_pb2.FP16}
    src = {t.dtype for t in source.tensors} & floats
    dst = {t.dtype for t in spec.destination.tensors} & floats
    have = {(c.to, getattr(c, "from")) for c in spec.options.allowed_casts}
    for f in sorted(src):
        for to in sorted(dst):
            if f != to and (to, f) not in have:
                c = spec.options.allowed_casts.add(to=to)
                setattr(c, "from", f)
    return spec


# --------------------------------------------------------- local buffers --

def _chunk_len(length, parts, index):
    cs = -(-length // parts) if parts else 0
    lo = min(index * cs, length)
    return min(lo + cs, length) - lo


def _mesh_local_shape(t, coord):
    shape = list(t.shape)
    for m, p in enumerate(t.mesh.placements):
        n, c = t.mesh.mesh_shape[m], coord[m]
        kind = p.WhichOneof("kind")
        if kind == "shard":
            shape[p.shard.dim] = _chunk_len(shape[p.shard.dim], n, c)
        elif kind == "strided_shard":
            d, sf = p.strided_shard.dim, p.strided_shard.split_factor
            shape[d] = sum(_chunk_len(_chunk_len(shape[d], sf, j), n, c) for j in range(sf))
    return shape


def local_buffers(side, rank):
    """{buffer name: (DType name, element count)} that side-local rank `rank`
    holds for `side` (a wsync.v1.Side): what a receiver (or a test owner) must
    allocate and register. Buffers shared by several tensors (per-expert
    slices) are sized to hold all of them."""
    out = {}
    for t in side.tensors:
        elem = dtypes.size(t.dtype)
        if t.WhichOneof("layout") == "mesh":
            ranks = list(t.mesh.ranks)
            if rank not in ranks:
                continue
            flat = ranks.index(rank)
            coord = []
            for n in reversed(t.mesh.mesh_shape):
                coord.append(flat % n)
                flat //= n
            shape = _mesh_local_shape(t, list(reversed(coord)))
            need = 1
            for d in shape:
                need *= d
            if need:
                _grow(out, t.mesh.buffer or t.name, t.dtype, need)
            continue
        for f in t.fragments.fragments:
            if f.rank != rank:
                continue
            lengths = list(f.box.length)
            strides = list(f.strides) or _row_major(lengths)
            last = sum((n - 1) * s for n, s in zip(lengths, strides)) + 1
            if all(n > 0 for n in lengths):
                _grow(out, f.buffer or t.name, t.dtype, f.byte_offset // elem + last)
    return out


def _row_major(lengths):
    strides, acc = [], 1
    for n in reversed(lengths):
        strides.append(acc)
        acc *= n
    return list(reversed(strides))


def _grow(out, buffer, dtype, elements):
    name = dtypes.name(dtype)
    old = out.get(buffer)
    if old is not None and old[0] != name:
        raise ValueError(f"buffer {buffer!r} holds both {old[0]} and {name} tensors")
    out[buffer] = (name, max(elements, old[1] if old else 0))
