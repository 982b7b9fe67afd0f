"""Peer approaches to the same weight syncs, with torch.distributed (NCCL),
one process per GPU, on the tensors wsync syncs (shapes from the catalog:
`wsync_bench_gpu_sync --model M --dump-shapes FILE`, or --shapes FILE).

Two GPUs (default --cases when WORLD_SIZE is 2):
  GPU0 -> GPU1 (trainer -> vLLM TP=1):
    per_tensor_broadcast   one dist.broadcast per tensor (veRL / OpenRLHF style)
    bucketed_broadcast     512 MiB buckets: pack, broadcast, unpack
  colocated, FSDP2 Shard(0) on both GPUs -> vLLM TP=2 on the same GPUs:
    allgather_slice        per tensor: all_gather_into_tensor of the full tensor,
                           then copy this rank's TP slice into its parameter

Four GPUs (default --cases when WORLD_SIZE is 4):
  fanout_tp2             Megatron TP=2 trainer on ranks 0,1 -> two vLLM TP=1 replicas
                         on ranks 2,3: per tensor, all_gather the TP shards in {0,1}
                         (row-parallel halves interleaved back along dim 1), then
                         dist.broadcast from rank 0 to {0,2,3}
  fanout_tp2_bucketed    same gathers; broadcast in 512 MiB packed buckets
  fanout_dp2             two full trainer replicas (DP=2) on ranks 0,1 -> two vLLM
                         TP=1 replicas on ranks 2,3: rank 0 broadcasts every tensor to
                         {0,2,3}; rank 1 idles (its replica is not even allocated)
  fanout_dp2_bucketed    same in 512 MiB packed buckets
  colocated4             FSDP2 Shard(0) over 4 ranks -> two vLLM TP=2 replicas on the
                         same ranks (ranks 0,1 and 2,3; TP rank = rank % 2): per tensor,
                         all_gather_into_tensor over the 4 ranks, copy this rank's slice

torchrun --standalone --nproc_per_node=2 bench/gpu/peers.py --model llama3-8b --iters 5
torchrun --standalone --nproc_per_node=4 bench/gpu/peers.py --model qwen3-30b-a3b --iters 5
Prints one `RESULT {json}` line per case (rank 0).

The 4-GPU cases fill every source with integers that are a function of (tensor index,
element index) (exact in bf16), check after the first iteration (the warm-up, reported
as first_s) that every receiver holds exactly the expected values ("correct",
"mismatched_elements" per receiver), and time each iteration as the slowest rank's
(torch.cuda.synchronize + dist.barrier before, synchronize after); median_s is the
median of --iters such iterations. Each rank holds its sources, its destinations
(one allocation each) and one tensor / bucket of scratch; a case that would not fit
(torch.cuda.mem_get_info, less --mem-margin-gib) prints a RESULT with "skipped". Each case agrees on its phases across ranks (plan and
memory check, setup, run), so an exception or a shortfall of memory on one rank
prints `FAILED case ...` / a `skipped` RESULT and the next case still runs; an
exception inside the NCCL calls of the run itself cannot be recovered from on the
other ranks, which then abort after --pg-timeout-s.
"""
import argparse
import gc
import json
import math
import os
import statistics
import subprocess
import sys
import time
import traceback
from datetime import timedelta

import torch
import torch.distributed as dist

from peers_cases import BUCKET, make_case, tp_slice  # beside this script

GIB = 1 << 30
OLD_CASES = ("per_tensor_broadcast", "bucketed_broadcast", "allgather_slice")
NEW_CASES = ("fanout_tp2", "fanout_tp2_bucketed", "fanout_dp2", "fanout_dp2_bucketed",
             "colocated4")


def load_shapes(args):
    path = args.shapes
    if not path:
        path = f"/tmp/wsync-shapes-{args.model}.json"
        err = ""
        if int(os.environ.get("LOCAL_RANK", "0")) == 0 and not os.path.exists(path):
            tmp = f"{path}.tmp{os.getpid()}"  # no half-written file left for the next run
            try:
                subprocess.check_call([args.sync_bench, "--model", args.model,
                                       "--dump-shapes", tmp])
                os.replace(tmp, path)
            except Exception:
                err = traceback.format_exc()
                print(f"FAILED dump-shapes ({args.sync_bench}):\n{err}", flush=True)
        # Every rank learns whether the dump worked (a bare barrier would hang on failure).
        ok = torch.tensor([0 if err else 1], dtype=torch.int32, device="cuda")
        dist.all_reduce(ok, op=dist.ReduceOp.MIN)
        if ok.item() != 1:
            raise SystemExit(f"no shapes for {args.model}: --dump-shapes failed on rank 0")
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


def exchange(ctx, vals):
    """Every rank's list of floats (same length on all ranks), on every rank."""
    t = torch.tensor([float(v) for v in vals], dtype=torch.float64, device="cuda")
    out = torch.empty(ctx.world * len(vals), dtype=torch.float64, device="cuda")
    dist.all_gather_into_tensor(out, t)
    return out.view(ctx.world, len(vals)).tolist()


def agree_failed(ctx, case, phase, err, rows):
    """True (on every rank) when this phase raised on any rank; rows[r][0] is r's flag."""
    if err:
        print(f"FAILED case {case} rank {ctx.rank} ({phase}):\n{err}", flush=True)
    bad = [r for r, row in enumerate(rows) if row[0] != 0]
    if bad and ctx.rank == 0:
        print(f"FAILED case {case}: {phase} raised on rank(s) {bad}", flush=True)
    return bool(bad)


def one_iteration(step):
    torch.cuda.synchronize()
    dist.barrier()
    t0 = time.perf_counter()
    step()
    torch.cuda.synchronize()
    return time.perf_counter() - t0


def run_case(ctx, case):
    """Every rank runs this for every case, reaching the same collectives in the same
    order whatever raised where (bar an exception between the NCCL calls of step)."""
    base = {"bench": "peer", "impl": ctx.impl, "model": ctx.model, "case": case,
            "world_size": ctx.world, "tensors": len(ctx.shapes), "bytes": ctx.total}
    if ctx.world != 4:
        if ctx.rank == 0:
            print("RESULT " + json.dumps(dict(base, skipped=f"needs world_size 4, has "
                                                           f"{ctx.world}")), flush=True)
        return True
    # Plan (shape arithmetic only) and memory check.
    err, c, need = "", None, 0
    try:
        c = make_case(ctx, case)
        need = c.need_bytes
    except Exception:
        err = traceback.format_exc()
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    free, _ = torch.cuda.mem_get_info()
    free += torch.cuda.memory_reserved() - torch.cuda.memory_allocated()
    rows = exchange(ctx, [1 if err else 0, need, free])
    if agree_failed(ctx, case, "plan", err, rows):
        return False
    margin = ctx.margin_gib * GIB
    short = [(r, n, f) for r, (_, n, f) in enumerate(rows) if n + margin > f]
    if short:
        if ctx.rank == 0:
            r, n, f = max(short, key=lambda x: x[1] + margin - x[2])
            print("RESULT " + json.dumps(dict(
                base, skipped=f"needs {(n + margin) / GIB:.1f} GiB, has {f / GIB:.1f} GiB "
                              f"(rank {r}; {ctx.margin_gib} GiB margin)",
                need_gib={str(q): round(x[1] / GIB, 2) for q, x in enumerate(rows)},
                free_gib={str(q): round(x[2] / GIB, 2) for q, x in enumerate(rows)})),
                flush=True)
        return True
    # Setup: allocate sources, destinations and scratch once; fill the sources.
    try:
        c.setup()
        torch.cuda.synchronize()
    except Exception:
        err = traceback.format_exc()
    rows = exchange(ctx, [1 if err else 0])
    if agree_failed(ctx, case, "setup", err, rows):
        return False
    # Run: one first iteration, the check, then --iters timed ones.
    times, bad, verr = [0.0] * (ctx.iters + 1), -1, ""
    try:
        times[0] = one_iteration(c.step)
        try:  # local only: a failing check must not skip this rank's iterations
            bad = c.verify()
        except Exception:
            verr = traceback.format_exc()
            bad = -2
            print(f"FAILED case {case} rank {ctx.rank} (check):\n{verr}", flush=True)
        for k in range(1, ctx.iters + 1):
            times[k] = one_iteration(c.step)
    except Exception:
        err = traceback.format_exc()
    rows = exchange(ctx, [1 if err else 0, bad] + times)
    if agree_failed(ctx, case, "run", err, rows):
        return False
    if ctx.rank == 0:
        slowest = [max(row[2 + k] for row in rows) for k in range(ctx.iters + 1)]
        med = statistics.median(slowest[1:]) if ctx.iters > 0 else slowest[0]
        checked = {r: int(row[1]) for r, row in enumerate(rows) if row[1] != -1}
        correct = bool(checked) and all(v == 0 for v in checked.values())
        r = dict(base, iters=ctx.iters, first_s=round(slowest[0], 6), median_s=round(med, 6),
                 gbps=round(ctx.total / med / 1e9, 1) if med > 0 else None,
                 process_group_init_s=round(ctx.init_s, 3), correct=correct,
                 mismatched_elements={str(q): v for q, v in checked.items()},
                 received_bytes={str(q): v for q, v in c.received.items()},
                 destination_bytes={str(q): v for q, v in c.dest_bytes.items()},
                 rank0_median_s=round(statistics.median(rows[0][3:]), 6)
                 if ctx.iters > 0 else None)
        r.update(c.extra)
        print("RESULT " + json.dumps(r), flush=True)
    return not any(row[1] == -2 for row in rows)


class Ctx:
    pass


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--model", default="llama3-8b")
    p.add_argument("--shapes", default="")
    p.add_argument("--iters", type=int, default=5)
    p.add_argument("--sync-bench", default=".devbundle/bin/wsync_bench_gpu_sync")
    p.add_argument("--cases", default="",
                   help="comma-separated; default: " + ",".join(OLD_CASES)
                   + " with 2 ranks, " + ",".join(NEW_CASES) + " with 4")
    p.add_argument("--pg-timeout-s", type=int, default=300,
                   help="NCCL collective timeout: a rank stuck this long aborts (no endless hang)")
    p.add_argument("--mem-margin-gib", type=float, default=3.0,
                   help="4-GPU cases: headroom kept free (NCCL, fill temporaries, check)")
    args = p.parse_args()
    rank = int(os.environ["RANK"])
    torch.cuda.set_device(rank)
    t0 = time.perf_counter()
    dist.init_process_group("nccl", device_id=torch.device("cuda", rank),
                            timeout=timedelta(seconds=args.pg_timeout_s))
    x = torch.ones(1, device="cuda")
    dist.all_reduce(x)
    torch.cuda.synchronize()
    init_s = time.perf_counter() - t0
    world = dist.get_world_size()
    if args.cases:
        cases = args.cases.split(",")
    else:
        cases = list(NEW_CASES if world == 4 else OLD_CASES)
    unknown = [c for c in cases if c not in OLD_CASES + NEW_CASES]
    if unknown:  # same arguments on every rank: all leave here together
        if rank == 0:
            print(f"FAILED unknown case(s) {unknown}; known: {OLD_CASES + NEW_CASES}", flush=True)
        dist.destroy_process_group()
        sys.exit(2)
    shapes = load_shapes(args)
    total = sum(torch.Size(s).numel() * 2 for _, s in shapes)
    impl = f"torch {torch.__version__} nccl " + ".".join(map(str, torch.cuda.nccl.version()))

    def report(case, first, med, extra=None):
        if rank == 0:
            r = {"bench": "peer", "impl": impl, "model": args.model,
                 "case": case, "tensors": len(shapes), "bytes": total, "iters": args.iters,
                 "first_s": round(first, 6), "median_s": round(med, 6),
                 "gbps": round(total / med / 1e9, 1), "process_group_init_s": round(init_s, 3)}
            r.update(extra or {})
            print("RESULT " + json.dumps(r), flush=True)

    if "per_tensor_broadcast" in cases or "bucketed_broadcast" in cases:
        broadcast_cases(shapes, cases, rank, args.iters, report)
        torch.cuda.empty_cache()

    if "allgather_slice" in cases:
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
        del shards, outs, gather, allgather_slice
        torch.cuda.empty_cache()

    new = [c for c in cases if c in NEW_CASES]
    ok = True
    if new:
        ctx = Ctx()
        ctx.rank, ctx.world, ctx.iters, ctx.model = rank, world, args.iters, args.model
        ctx.shapes = shapes
        ctx.numels = [math.prod(s) for _, s in shapes]
        ctx.total, ctx.init_s, ctx.impl = total, init_s, impl
        ctx.margin_gib = args.mem_margin_gib
        ctx.tp_group = ctx.bcast_group = None
        if world == 4:  # every rank creates every group, in this order
            ctx.tp_group = dist.new_group([0, 1])
            ctx.bcast_group = dist.new_group([0, 2, 3])
        for case in new:
            ok = run_case(ctx, case) and ok
            gc.collect()
            torch.cuda.synchronize()
            torch.cuda.empty_cache()

    dist.destroy_process_group()
    if not ok:
        sys.exit(1)


if __name__ == "__main__":
    main()
