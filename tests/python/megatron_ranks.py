"""Megatron-core ranks built from Hugging Face tensors for the tests, and a
reader of a source side: every fragment / mesh shard read back out of the
ranks' buffers per docs/layout-spec.md (an independent reading of it)."""
import math

import torch


def tp_param(t, dim, tp, r, stride=1):
    """Shard r of `t` over tp on `dim`, with Megatron's attributes."""
    p = t.chunk(tp, dim)[r].clone() if dim is not None else t.clone()
    p.tensor_model_parallel = dim is not None
    p.partition_dim = -1 if dim is None else dim
    p.partition_stride = stride
    return p


def interleave_qkv(q, k, v, groups):
    """Megatron's linear_qkv from HF q/k/v (per group: its q heads, k, v)."""
    rest = q.shape[1:]
    return torch.cat([q.reshape(groups, -1, *rest), k.reshape(groups, -1, *rest),
                      v.reshape(groups, -1, *rest)], dim=1).reshape(-1, *rest)


def gated_fc1(gate, up, tp, r, expert=False):
    """saver_base: cat(chunk(W)[r], chunk(V)[r]); newer Megatron marks it stride 2."""
    p = tp_param(torch.cat([gate.chunk(tp)[r], up.chunk(tp)[r]]), 0, 1, 0, stride=2)
    if expert:
        p.allreduce = False
    return p


def chunk(n, parts, i):
    cs = -(-n // parts)
    lo = min(i * cs, n)
    return lo, min(lo + cs, n)


def shard_box(t, flat):
    """(offset, length) rank `flat` of a mesh tensor holds (Shard / Replicate)."""
    coord, rest = [], flat
    for n in reversed(t.mesh.mesh_shape):
        coord.append(rest % n)
        rest //= n
    coord.reverse()
    offset, length = [0] * len(t.shape), list(t.shape)
    for m, p in enumerate(t.mesh.placements):
        kind = p.WhichOneof("kind")
        assert kind in ("shard", "replicate"), kind
        if kind == "shard":
            d = p.shard.dim
            lo, hi = chunk(length[d], t.mesh.mesh_shape[m], coord[m])
            offset[d] += lo
            length[d] = hi - lo
    return offset, length


def read_back(side, rank_buffers):
    """{tensor: global tensor} read out of every rank's buffers as `side`
    says (an element two ranks hold must agree; every element must be held)."""
    out = {}
    for t in side.tensors:
        full = torch.full(list(t.shape), math.nan)
        pieces = []  # (rank, offset, length, values)
        if t.WhichOneof("layout") == "mesh":
            for flat, rank in enumerate(t.mesh.ranks):
                offset, length = shard_box(t, flat)
                buf = rank_buffers[rank][t.mesh.buffer or t.name]
                pieces.append((rank, offset, length, buf.reshape(length)))
        else:
            for f in t.fragments.fragments:
                length = list(f.box.length)
                strides = list(f.strides) or [math.prod(length[d + 1:]) for d in range(len(length))]
                buf = rank_buffers[f.rank][f.buffer or t.name].flatten()
                assert f.byte_offset % buf.element_size() == 0
                view = torch.as_strided(buf, length, strides, f.byte_offset // buf.element_size())
                pieces.append((f.rank, list(f.box.offset), length, view))
        for rank, offset, length, values in pieces:
            sl = tuple(slice(o, o + n) for o, n in zip(offset, length))
            held = full[sl]
            seen = ~torch.isnan(held)
            assert torch.equal(held[seen], values[seen]), f"{t.name}: rank {rank} disagrees"
            full[sl] = values
        assert not torch.isnan(full).any(), f"{t.name}: elements no rank holds"
        out[t.name] = full
    return out


def assert_hf_tensors(side, bufs, full):
    got = read_back(side, bufs)
    assert sorted(got) == sorted(full)
    for name, want in full.items():
        assert torch.equal(got[name], want), name


def sync_into_vllm(cluster, spec, bufs, full, vtp):
    """Registers the trainer ranks' `bufs` and vLLM receivers (bf16) with real
    workers, syncs version 1 of `spec` and checks every destination element
    against the HF tensors `full` (the mappings applied to them)."""
    import wsync
    import wsync.torch
    from wsync import layouts
    from harness import expected_destination
    tp = len(bufs)
    socks = {("trainer", r): cluster.worker(f"trainer:{r}:{tp}") for r in range(tp)}
    socks.update({("inference", r): cluster.worker(f"inference:{r}:{vtp}") for r in range(vtp)})
    regs = [wsync.torch.register(bufs[r], group="trainer", rank=r, socket=socks[("trainer", r)])
            for r in range(tp)]
    receivers, kinds = [], {"BF16": torch.bfloat16, "FP32": torch.float32}
    for r in range(vtp):
        dst = {b: torch.zeros(n, dtype=kinds[d])  # vLLM keeps some tensors fp32
               for b, (d, n) in layouts.local_buffers(spec.destination, r).items()}
        receivers.append(wsync.torch.register(dst, group="inference", rank=r,
                                              socket=socks[("inference", r)]))
    client = wsync.Client(cluster.address, timeout=20)
    client.wait_for_workers({"trainer": tp, "inference": vtp}, timeout=30, buffers=True)
    client.define_transfer(spec.name or "t", spec)
    client.sync(1).wait(timeout=60)
    for r, reg in enumerate(receivers):
        want = {d: expected_destination(spec, full, r, d) for d in kinds.values()}
        for buf, got in reg.tensors.items():
            values = want[got.dtype][buf]
            assert torch.equal(got.flatten()[:values.numel()], values), \
                f"inference rank {r} buffer {buf}"
    for reg in regs + receivers:
        reg.close()
