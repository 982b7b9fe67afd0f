"""Checks shared by the ranks of the issue-17 proof (vllm_engine_proof.py):
gathering every rank's findings, recording a failed step without leaving the
ranks out of step, and comparing a receiver's parameters bit for bit with the
trainer's weights put into vLLM's layout."""
import torch
import torch.distributed as dist

import proof_models
import sync_proof
from vllm_rank_child import decode

WORLD, HOST = sync_proof.WORLD, sync_proof.HOST
RANK = sync_proof.RANK
TP = proof_models.TP


def gathered(value):
    out = [None] * WORLD
    dist.all_gather_object(out, value, group=HOST.group)
    return out


def attempt(problems, what, fn, *a, **kw):
    """fn(...), an exception recorded in `problems` (the ranks stay in step)."""
    try:
        return fn(*a, **kw)
    except Exception as e:  # every failure is a finding of the proof
        problems.append(f"rank {RANK}: {what}: {type(e).__name__}: {e}")
        return None


def agree(problems):
    """Every rank's problems so far (all ranks call it at the same point)."""
    return [p for per in gathered(list(problems)) for p in per]


def compare(cfg, full, r, ep, dump):
    """Mismatches of receiver TP rank r's parameters against the reference."""
    from vllm_standins import vllm_rank_tensors
    ref = vllm_rank_tensors(cfg, full, TP, r, ep)
    bad = []
    if set(ref) != set(dump):
        bad.append(f"rank {r}: names differ: only reference {sorted(set(ref) - set(dump))[:4]}, "
                   f"only receiver {sorted(set(dump) - set(ref))[:4]}")
    for name in sorted(set(ref) & set(dump)):
        want, got = ref[name].to(torch.bfloat16), decode(dump[name])
        if got.dtype != torch.bfloat16 or tuple(got.shape) != tuple(want.shape):
            bad.append(f"rank {r}: {name}: receiver {got.dtype} {tuple(got.shape)}, reference "
                       f"bfloat16 {tuple(want.shape)}")
        elif not torch.equal(got.view(torch.int16), want.view(torch.int16)):
            n = int((got.view(torch.int16) != want.view(torch.int16)).sum())
            bad.append(f"rank {r}: {name}: {n} of {want.numel()} elements differ")
    return bad
