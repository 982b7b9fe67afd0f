"""The tiny-llama pool the staged-commit tests share (test_commit_swap,
test_staged_hold): two FSDP trainer ranks registered with their
wsync-workers and receiver 1 a wsync-worker with zeroed buffers. Receiver 0
is each test's own embedded worker, made by the subclass."""
import torch

import wsync
import wsync.torch
from wsync import layouts, vllm

from harness import full_tensors
from models import TINY_LLAMA, trainer_tensors
from test_sync import TP, fsdp_params


class TinyLlamaPool:
    def __init__(self, cluster):
        shapes = {n: s for n, s, _ in trainer_tensors("tiny-llama")}
        self.full = full_tensors(shapes, torch.bfloat16)
        self.params = {r: fsdp_params(self.full, r) for r in range(2)}
        src = layouts.source_side(layouts.describe(self.params[0].items(), rank=0))
        self.spec = layouts.transfer_spec(src, vllm.destination(TINY_LLAMA, tp=TP), name="tiny")
        self.regs = [wsync.torch.register({n: p.to_local() for n, p in self.params[r].items()},
                                          group="trainer", rank=r,
                                          socket=cluster.worker(f"trainer:{r}:2"))
                     for r in range(2)]
        bufs1 = {b: torch.zeros(n, dtype=torch.bfloat16)
                 for b, (_, n) in layouts.local_buffers(self.spec.destination, 1).items()}
        self.regs.append(wsync.torch.register(bufs1, group="inference", rank=1,
                                              socket=cluster.worker(f"inference:1:{TP}")))

    def receiver0_buffers(self):
        """Zeroed buffers for receiver 0, by name."""
        return {b: torch.zeros(n, dtype=torch.bfloat16)
                for b, (_, n) in layouts.local_buffers(self.spec.destination, 0).items()}

    def connect(self, cluster):
        """The trainer's client, once every worker has registered its buffers."""
        self.client = wsync.Client(cluster.address, timeout=20)
        self.client.wait_for_workers({"trainer": 2, "inference": TP}, timeout=30, buffers=True)
