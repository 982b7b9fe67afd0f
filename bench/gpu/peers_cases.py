"""The 4-GPU peer cases of bench/gpu/peers.py (fan-out to two replicas, colocated
over four ranks), the TP slicing they share with its 2-GPU cases, and the
arena, pattern and bucket helpers they are built from. See peers.py's
docstring for what each case does and how it is checked."""
import math

import torch
import torch.distributed as dist


BUCKET = 512 << 20
FILL_CHUNK = 1 << 24  # elements per step of the pattern fill (bounds its int64 temporaries)
ALIGN = 128  # elements (256 bytes) between tensors carved from one arena


def tp_dim(name, ndim):
    """Dim a tensor is split along under TP (None: replicated)."""
    if ndim == 1 or "norm" in name or "router" in name or name.endswith("mlp.gate.weight"):
        return None
    row_parallel = any(k in name for k in ("o_proj", "down_proj"))
    return 1 if row_parallel else 0


def tp_slice(name, full, rank, tp):
    """This rank's part of a full tensor under vLLM TP (fusion only moves it)."""
    dim = tp_dim(name, full.dim())
    if dim is None:
        return full
    n = full.shape[dim] // tp
    return full.narrow(dim, rank * n, n)


# ---------------------------------------------------------------------------
# Four-GPU cases.


def fill_pattern(flat, tidx, base=0):
    """flat[k] = element base+k of tensor tidx: integers in [-125, 125], exact in bf16,
    different between neighbouring tensors and not periodic in 251 elements."""
    n = flat.numel()
    for s in range(0, n, FILL_CHUNK):
        e = min(n, s + FILL_CHUNK)
        i = torch.arange(base + s, base + e, dtype=torch.int64, device=flat.device)
        v = (i + torch.div(i, 251, rounding_mode="floor") * 3
             + torch.div(i, 63001, rounding_mode="floor") * 5 + tidx * 7)
        flat[s:e].copy_(v.remainder_(251).sub_(125))


def arena_elems(numels):
    return sum((n + ALIGN - 1) // ALIGN * ALIGN for n in numels)


class Arena:
    """One allocation carved into contiguous, aligned tensors (no allocator rounding per
    tensor, so what a rank needs is known before allocating)."""

    def __init__(self, shapes):
        numels = [math.prod(s) for s in shapes]
        self.buf = torch.empty(max(arena_elems(numels), 1), dtype=torch.bfloat16, device="cuda")
        self.views, off = [], 0
        for s, n in zip(shapes, numels):
            self.views.append(self.buf[off:off + n].view(s))
            off += (n + ALIGN - 1) // ALIGN * ALIGN


def empty_flat(n):
    return torch.empty(max(n, 1), dtype=torch.bfloat16, device="cuda")


def make_buckets(numels, cap):
    """(direct, indices): consecutive tensors packed up to cap elements; a tensor over cap
    goes alone and direct (broadcast from its own buffer), as in bucketed_broadcast."""
    out, cur, size = [], [], 0
    for i, n in enumerate(numels):
        if n > cap:
            if cur:
                out.append((False, cur))
                cur, size = [], 0
            out.append((True, [i]))
            continue
        if cur and size + n > cap:
            out.append((False, cur))
            cur, size = [], 0
        cur.append(i)
        size += n
    if cur:
        out.append((False, cur))
    return out


def interleave(dst, gathered, shape):
    """dst (flat, the full tensor of `shape`) <- the two dim-1 halves that an
    all_gather_into_tensor of row-parallel shards left in gathered ([2, a, b/2, ...])."""
    a, b, rest = shape[0], shape[1], tuple(shape[2:])
    dst.view((a, 2, b // 2) + rest).copy_(gathered.view((2, a, b // 2) + rest).transpose(0, 1))


class Fanout:
    """Trainer on ranks 0,1 (TP=2 shards, or two DP replicas) -> two vLLM TP=1 replicas on
    ranks 2,3, each receiving every full tensor by a broadcast from rank 0 to {0,2,3}."""

    def __init__(self, ctx, tp, bucketed):
        self.ctx, self.tp, self.bucketed = ctx, tp, bucketed
        shapes, numels, rank = ctx.shapes, ctx.numels, ctx.rank
        self.dims = [None] * len(shapes)  # dim of the TP split; None: whole on both TP ranks
        if tp == 2:
            for i, (name, s) in enumerate(shapes):
                d = tp_dim(name, len(s))
                if d is not None and s[d] % 2 == 0:
                    self.dims[i] = d
        self.buckets = make_buckets(numels, BUCKET // 2) if bucketed else None
        self.bucket_tot = ([sum(numels[i] for i in idx) for _, idx in self.buckets]
                           if bucketed else None)
        if rank == 0:
            self.role = "send"
        elif rank == 1:
            self.role = "tp_peer" if tp == 2 else "idle"
        else:
            self.role = "recv"
        sharded = [numels[i] for i, d in enumerate(self.dims) if d is not None]
        self.gather_numel = max(sharded, default=0)
        # Row-parallel tensors broadcast from their own buffer need one to interleave into;
        # in a bucket they are interleaved straight into their slot.
        direct = (range(len(shapes)) if not bucketed
                  else [idx[0] for dr, idx in self.buckets if dr])
        self.perm_numel = max((numels[i] for i in direct if self.dims[i] == 1), default=0)
        self.src_shapes = []
        for (name, s), d in zip(shapes, self.dims):
            s = list(s)
            if d is not None:
                s[d] //= 2
            self.src_shapes.append(tuple(s))
        self.full_max = max(numels)
        self.scratch_numel = max(self.full_max, BUCKET // 2 if bucketed else 0)
        src = arena_elems([math.prod(s) for s in self.src_shapes])
        need = {"send": src + self.gather_numel + self.perm_numel
                        + (BUCKET // 2 if bucketed else 0),
                "tp_peer": src + self.gather_numel,
                "recv": arena_elems(numels) + self.scratch_numel,
                "idle": 0}[self.role]
        self.need_bytes = need * 2
        half = sum(n // 2 for n in sharded) * 2
        self.received = {0: half, 1: half, 2: ctx.total, 3: ctx.total}
        self.dest_bytes = {2: ctx.total, 3: ctx.total}
        src_desc = ("megatron tp2 on ranks 0,1 (all_gather in {0,1})" if tp == 2
                    else "2 full replicas (dp2) on ranks 0,1, rank 1 idle")
        self.extra = {"source": src_desc,
                      "destination": "2 vllm tp1 replicas on ranks 2,3 (broadcast from rank 0"
                                     " to {0,2,3})"}
        if tp == 2:  # tensors both TP ranks hold whole (norms, router, odd split dims)
            self.extra["replicated_tensors"] = sum(d is None for d in self.dims)
        if bucketed:
            self.extra["bucket_bytes"] = BUCKET

    def setup(self):
        ctx = self.ctx
        if self.role in ("send", "tp_peer"):
            self.g = empty_flat(self.gather_numel)
            self.src = Arena(self.src_shapes)
            for i, (name, s) in enumerate(ctx.shapes):
                d, t = self.dims[i], self.src.views[i]
                if d is None:
                    fill_pattern(t.view(-1), i)
                    continue
                full = self.g[:ctx.numels[i]]
                fill_pattern(full, i)
                h = s[d] // 2
                t.copy_(full.view(s).narrow(d, ctx.rank * h, h))
            if self.role == "send":
                self.perm = empty_flat(self.perm_numel)
                if self.bucketed:
                    self.bucket = empty_flat(BUCKET // 2)
        elif self.role == "recv":
            self.dst = Arena([s for _, s in ctx.shapes])
            self.dst.buf.zero_()  # no stale bytes of an earlier case pass the check
            self.scratch = empty_flat(self.scratch_numel)

    def _send_one(self, i):
        """Rank 0: tensor i whole, from its own buffer, to {0,2,3}."""
        ctx = self.ctx
        d = self.dims[i]
        if d is None:
            dist.broadcast(self.src.views[i], src=0, group=ctx.bcast_group)
            return
        n = ctx.numels[i]
        out = self.g[:n]
        dist.all_gather_into_tensor(out, self.src.views[i], group=ctx.tp_group)
        if d == 1:
            interleave(self.perm[:n], out, ctx.shapes[i][1])
            out = self.perm[:n]
        dist.broadcast(out, src=0, group=ctx.bcast_group)

    def step(self):
        ctx = self.ctx
        numels = ctx.numels
        if self.role == "tp_peer":  # same gathers, in the same (index) order as rank 0
            for i, d in enumerate(self.dims):
                if d is not None:
                    dist.all_gather_into_tensor(self.g[:numels[i]], self.src.views[i],
                                                group=ctx.tp_group)
        elif self.role == "send" and not self.bucketed:
            for i in range(len(numels)):
                self._send_one(i)
        elif self.role == "send":
            for (direct, idx), tot in zip(self.buckets, self.bucket_tot):
                if direct:
                    self._send_one(idx[0])
                    continue
                off = 0
                for i in idx:
                    n, d = numels[i], self.dims[i]
                    slot = self.bucket[off:off + n]
                    if d is None:
                        slot.copy_(self.src.views[i].view(-1))
                    elif d == 0:
                        dist.all_gather_into_tensor(slot, self.src.views[i], group=ctx.tp_group)
                    else:
                        dist.all_gather_into_tensor(self.g[:n], self.src.views[i],
                                                    group=ctx.tp_group)
                        interleave(slot, self.g[:n], ctx.shapes[i][1])
                    off += n
                dist.broadcast(self.bucket[:tot], src=0, group=ctx.bcast_group)
        elif self.role == "recv" and not self.bucketed:
            for t in self.dst.views:
                dist.broadcast(t, src=0, group=ctx.bcast_group)
        elif self.role == "recv":
            for (direct, idx), tot in zip(self.buckets, self.bucket_tot):
                if direct:
                    dist.broadcast(self.dst.views[idx[0]], src=0, group=ctx.bcast_group)
                    continue
                buf = self.scratch[:tot]
                dist.broadcast(buf, src=0, group=ctx.bcast_group)
                off = 0
                for i in idx:
                    self.dst.views[i].view(-1).copy_(buf[off:off + numels[i]])
                    off += numels[i]

    def verify(self):
        """Mismatched elements among this rank's destinations (-1: holds none)."""
        if self.role != "recv":
            return -1
        bad = torch.zeros((), dtype=torch.int64, device="cuda")
        for i, t in enumerate(self.dst.views):
            exp = self.scratch[:self.ctx.numels[i]]
            fill_pattern(exp, i)
            bad += (t.view(-1) != exp).sum()
        return int(bad.item())


class Colocated4:
    """FSDP2 Shard(0) over the 4 ranks -> two vLLM TP=2 replicas on the same ranks."""

    WORLD, TP = 4, 2

    def __init__(self, ctx):
        self.ctx = ctx
        w = self.WORLD
        self.tpr = ctx.rank % self.TP
        self.rows, self.inner, self.slice_shapes = [], [], {0: [], 1: []}
        for name, s in ctx.shapes:
            self.rows.append((s[0] + w - 1) // w)  # torch.chunk's chunk size; tail chunks padded
            self.inner.append(math.prod(s[1:]))
            meta = torch.empty(s, device="meta")
            for r in (0, 1):
                self.slice_shapes[r].append(tuple(tp_slice(name, meta, r, self.TP).shape))
        self.shard_shapes = [(r,) + tuple(s[1:]) for r, (_, s) in zip(self.rows, ctx.shapes)]
        self.gather_numel = max(r * w * n for r, n in zip(self.rows, self.inner))
        shard = arena_elems([r * n for r, n in zip(self.rows, self.inner)])
        dst = arena_elems([math.prod(s) for s in self.slice_shapes[self.tpr]])
        self.need_bytes = (shard + dst + self.gather_numel) * 2
        recv = sum((w - 1) * r * n for r, n in zip(self.rows, self.inner)) * 2
        self.received = {r: recv for r in range(w)}
        self.dest_bytes = {r: sum(math.prod(s) for s in self.slice_shapes[r % 2]) * 2
                           for r in range(w)}
        self.extra = {"source": "fsdp2 Shard(0) over ranks 0-3 (padded chunks)",
                      "destination": "2 vllm tp2 replicas on ranks 0,1 and 2,3 (colocated)"}

    def setup(self):
        ctx = self.ctx
        self.g = empty_flat(self.gather_numel)
        self.src = Arena(self.shard_shapes)
        for i, (_, s) in enumerate(ctx.shapes):
            rows, inner = self.rows[i], self.inner[i]
            valid = max(0, min(rows, s[0] - ctx.rank * rows))
            flat = self.src.views[i].view(-1)
            flat[valid * inner:].zero_()
            fill_pattern(flat[:valid * inner], i, base=ctx.rank * rows * inner)
        self.dst = Arena(self.slice_shapes[self.tpr])
        self.dst.buf.zero_()

    def step(self):
        ctx, w = self.ctx, self.WORLD
        for i, (name, s) in enumerate(ctx.shapes):
            rows = self.rows[i]
            out = self.g[:rows * w * self.inner[i]]
            dist.all_gather_into_tensor(out, self.src.views[i])
            full = out.view((rows * w,) + tuple(s[1:]))[:s[0]]
            self.dst.views[i].copy_(tp_slice(name, full, self.tpr, self.TP))

    def verify(self):
        ctx = self.ctx
        bad = torch.zeros((), dtype=torch.int64, device="cuda")
        for i, (name, s) in enumerate(ctx.shapes):
            exp = self.g[:ctx.numels[i]]
            fill_pattern(exp, i)
            bad += (self.dst.views[i] != tp_slice(name, exp.view(s), self.tpr, self.TP)).sum()
        return int(bad.item())


def make_case(ctx, case):
    if case == "fanout_tp2":
        return Fanout(ctx, tp=2, bucketed=False)
    if case == "fanout_tp2_bucketed":
        return Fanout(ctx, tp=2, bucketed=True)
    if case == "fanout_dp2":
        return Fanout(ctx, tp=1, bucketed=False)
    if case == "fanout_dp2_bucketed":
        return Fanout(ctx, tp=1, bucketed=True)
    if case == "colocated4":
        return Colocated4(ctx)
    raise ValueError(f"unknown case {case}")
