"""Peer approaches to the same weight syncs, with torch.distributed (NCCL),
one process per GPU, on the tensors wsync syncs (shapes from the catalog:
`wsync_bench_gpu_sync --model M --dump-shapes FILE`, or --shapes FILE).

  GPU0 -> GPU1 (trainer -> vLLM TP=1):
    per_tensor_broadcast   one dist.broadcast per tensor (veRL / OpenRLHF style)
    bucketed_broadcast     512 MiB buckets: pack, broadcast, unpack
  colocated, FSDP2 Shard(0) on both GPUs -> vLLM TP=2 on the same GPUs:
    allgather_slice        per tensor: all_gather_into_tensor of the full tensor,
                           then copy this rank's TP slice into its parameter

torchrun --standalone --nproc_per_node=2 bench/gpu/peers.py --model llama3-8b --iters 5
Prints one `RESULT {json}` line per case (rank 0).
"""
import argparse
import json
import os
import statistics
import subprocess
import time

import torch
import torch.distributed as dist

BUCKET = 512 << 20


def load_shapes(args):
    path = args.shapes
    if not path:
        path = f"/tmp/wsync-shapes-{args.model}.json"
        if int(os.environ.get("LOCAL_RANK", "0")) == 0 and not os.path.exists(path):
            subprocess.check_call([args.sync_bench, "--model", args.model, "--dump-shapes", path])
        dist.barrier()
    with open(path) as f:
        return [(n, tuple(s)) for n, s in json.load(f)]


def timed(fn, iters):
    times = []
    for i in range(iters + 1):
        torch.cuda.synchronize()
        dist.barrier()
        t0 = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    return times[0], statistics.median(times[1:])


def tp_slice(name, full, rank, tp):
    """This rank's part of a full tensor under vLLM TP (fusion only moves it)."""
    if full.dim() == 1 or "norm" in name or "router" in name or name.endswith("mlp.gate.weight"):
        return full
    row_parallel = any(k in name for k in ("o_proj", "down_proj"))
    dim = 1 if row_parallel else 0
    n = full.shape[dim] // tp
    return full.narrow(dim, rank * n, n)


def broadcast_cases(shapes, cases, rank, iters, report):
    """GPU0 -> GPU1; locals (60 GB for the big models) are freed on return."""
    tensors = [torch.empty(s, dtype=torch.bfloat16, device="cuda") for _, s in shapes]
    if rank == 0:
        for t in tensors:
            t.normal_()
    if "per_tensor_broadcast" in cases:
        def per_tensor():
            for t in tensors:
                dist.broadcast(t, src=0)
        report("per_tensor_broadcast", *timed(per_tensor, iters))
    if "bucketed_broadcast" in cases:
        bucket = torch.empty(BUCKET // 2, dtype=torch.bfloat16, device="cuda")
        groups, cur, size = [], [], 0
        for t in tensors:
            n = t.numel()
            if cur and size + n > bucket.numel():
                groups.append(cur)
                cur, size = [], 0
            cur.append(t)
            size += n
        if cur:
            groups.append(cur)

        def bucketed():
            for g in groups:
                if sum(t.numel() for t in g) > bucket.numel():  # one huge tensor
                    dist.broadcast(g[0], src=0)
                    continue
                off = 0
                views = []
                for t in g:
                    v = bucket[off:off + t.numel()]
                    if rank == 0:
                        v.copy_(t.view(-1))
                    views.append((v, t))
                    off += t.numel()
                dist.broadcast(bucket[:off], src=0)
                if rank != 0:
                    for v, t in views:
                        t.view(-1).copy_(v)
        report("bucketed_broadcast", *timed(bucketed, iters), {"bucket_bytes": BUCKET})


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--model", default="llama3-8b")
    p.add_argument("--shapes", default="")
    p.add_argument("--iters", type=int, default=5)
    p.add_argument("--sync-bench", default=".devbundle/bin/wsync_bench_gpu_sync")
    p.add_argument("--cases", default="per_tensor_broadcast,bucketed_broadcast,allgather_slice")
    args = p.parse_args()
    rank = int(os.environ["RANK"])
    torch.cuda.set_device(rank)
    t0 = time.perf_counter()
    dist.init_process_group("nccl", device_id=torch.device("cuda", rank))
    x = torch.ones(1, device="cuda")
    dist.all_reduce(x)
    torch.cuda.synchronize()
    init_s = time.perf_counter() - t0
    shapes = load_shapes(args)
    total = sum(torch.Size(s).numel() * 2 for _, s in shapes)
    cases = args.cases.split(",")

    def report(case, first, med, extra=None):
        if rank == 0:
            r = {"bench": "peer", "impl": f"torch {torch.__version__} nccl "
                 + ".".join(map(str, torch.cuda.nccl.version())), "model": args.model,
                 "case": case, "tensors": len(shapes), "bytes": total, "iters": args.iters,
                 "first_s": round(first, 6), "median_s": round(med, 6),
                 "gbps": round(total / med / 1e9, 1), "process_group_init_s": round(init_s, 3)}
            r.update(extra or {})
            print("RESULT " + json.dumps(r), flush=True)

    if "per_tensor_broadcast" in cases or "bucketed_broadcast" in cases:
        broadcast_cases(shapes, cases, rank, args.iters, report)
        torch.cuda.empty_cache()

    if "allgather_slice" in cases:
        world = dist.get_world_size()
        shards, outs = [], []
        for name, s in shapes:
            full = torch.Size(s)
            rows = (full[0] + world - 1) // world
            shard = torch.empty((rows,) + tuple(full[1:]), dtype=torch.bfloat16, device="cuda")
            shard.normal_()
            shards.append(shard)
            outs.append(torch.empty_like(tp_slice(name, torch.empty(full, device="meta"), rank,
                                                  world), device="cuda"))
        max_full = max(sh.numel() * world for sh in shards)
        gather = torch.empty(max_full, dtype=torch.bfloat16, device="cuda")

        def allgather_slice():
            for (name, s), shard, out in zip(shapes, shards, outs):
                g = gather[:shard.numel() * world]
                dist.all_gather_into_tensor(g, shard)
                full = g.view((shard.shape[0] * world,) + tuple(shard.shape[1:]))[:s[0]]
                out.copy_(tp_slice(name, full, rank, world))
        report("allgather_slice", *timed(allgather_slice, args.iters))

    dist.destroy_process_group()


if __name__ == "__main__":
    main()
