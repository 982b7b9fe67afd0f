"""The embedded worker on GPUs (run by the lead on the GPU machine; skipped
without 2 GPUs or without a CUDA build of wsync._native): a trainer rank on
cuda:0 and an inference rank on cuda:1, each an embedded CUDA-backend worker
in its own child process with its CUDA tensors registered by pointer (no CUDA
IPC), sync a tiny Llama into vLLM's TP=1 layout over NCCL; after every version
every destination byte equals the mappings applied to the trainer's tensors.

    PYTHONPATH=python:build-gpu/python WSYNC_BUILD_DIR=build-gpu \\
        python3 -m pytest tests/python/gpu/test_embedded_cuda.py
"""
import multiprocessing
import os
import sys

import pytest
import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

if "RANK" in os.environ:
    pytest.skip("starts its own processes: run without torchrun", allow_module_level=True)
if not torch.cuda.is_available() or torch.cuda.device_count() < 2:
    pytest.skip("needs 2 CUDA devices", allow_module_level=True)
embedded = pytest.importorskip("wsync.embedded")
try:
    if "cuda" not in embedded.backends():
        pytest.skip("wsync._native was built without WSYNC_WITH_CUDA", allow_module_level=True)
except ImportError as e:
    pytest.skip(f"no wsync._native: {e}", allow_module_level=True)

import wsync  # noqa: E402
from wsync import errors, layouts, vllm  # noqa: E402

import embedded_rank  # noqa: E402
from harness import Cluster, expected_destination, full_tensors  # noqa: E402
from models import TINY_LLAMA, trainer_tensors  # noqa: E402

TIMEOUT = 120


class Child:
    def __init__(self, controller, groups, device):
        ctx = multiprocessing.get_context("spawn")
        self.conn, theirs = ctx.Pipe()
        self.proc = ctx.Process(target=embedded_rank.serve,
                                args=(theirs, controller, groups, device), daemon=True)
        self.proc.start()

    def __call__(self, cmd, *args, **kwargs):
        self.conn.send((cmd, args, kwargs))
        if not self.conn.poll(TIMEOUT):
            raise TimeoutError(f"child: no answer to {cmd} in {TIMEOUT} s")
        reply = self.conn.recv()
        if reply[0] == "error":
            raise getattr(errors, reply[1])(reply[2])
        return reply[1]

    def close(self):
        if self.proc.is_alive():
            try:
                self("exit")
            except (TimeoutError, OSError, EOFError):
                pass
            self.proc.join(20)
        if self.proc.is_alive():
            self.proc.kill()


def test_embedded_cuda_workers_sync_by_pointer():
    cluster = Cluster()
    children = []
    try:
        shapes = {n: s for n, s, _ in trainer_tensors("tiny-llama")}
        full = full_tensors(shapes, torch.float32)
        src = layouts.source_side(layouts.describe(list(full.items()), rank=0))
        spec = layouts.transfer_spec(src, vllm.destination(TINY_LLAMA, tp=1), name="tiny")
        trainer = Child(cluster.address, "trainer:0:1", 0)
        inference = Child(cluster.address, "inference:0:1", 1)
        children += [trainer, inference]
        assert trainer("start") == "cuda:0" and inference("start") == "cuda:1"
        trainer("register_values", embedded_rank.encode_all(full))
        sizes = {b: n for b, (_, n) in layouts.local_buffers(spec.destination, 0).items()}
        inference("alloc_register", sizes)
        client = wsync.Client(cluster.address, timeout=30)
        client.wait_for_workers({"trainer": 1, "inference": 1}, timeout=60, buffers=True)
        client.define_transfer("weights", spec, source_group="trainer",
                               destination_group="inference")
        for version in (1, 2, 3):
            if version > 1:
                trainer("step", -0.5, float(version))
                for t in full.values():
                    t.mul_(-0.5).add_(float(version))
            client.sync(version).wait(timeout=TIMEOUT, show_progress=False)
            want = expected_destination(spec, full, 0, torch.bfloat16)
            got = {n: embedded_rank.decode(v) for n, v in inference("dump").items()}
            for b, w in want.items():
                assert torch.equal(got[b][:w.numel()], w), f"version {version} buffer {b}"
        assert inference("status")["last_version"] == 3
    finally:
        for c in children:
            c.close()
        cluster.close()
