"""The CPU harness of the vLLM backend tests: the engine imported over the
stand-in vLLM modules (fixture ``engine_mod``), the vLLM config a GPU worker
hands it, and ``Setup``: a trainer plus one GpuWorkerCalls per vLLM rank,
transfer defined (fixture ``setups`` closes them)."""
import concurrent.futures
import types

import pytest
import torch

import wsync
import wsync.torch
from wsync import layouts, vllm

import vllm_engine_standins as standins
from harness import full_tensors
from vllm_standins import RECORDER, TINY_MOE, build_model, hf_shapes, loaded_before, tiny_ranks, \
    vllm_rank_tensors

TIMEOUT = 60


@pytest.fixture
def engine_mod():
    """wsync.vllm_engine imported over the stand-in vLLM base / factory."""
    import importlib
    import sys
    standins.install()
    try:
        sys.modules.pop("wsync.vllm_engine", None)
        mod = importlib.import_module("wsync.vllm_engine")
        assert issubclass(mod.WsyncWeightTransferEngine, standins.WeightTransferEngine)
        mod.register()
        mod.register()  # idempotent
        yield mod
    finally:
        sys.modules.pop("wsync.vllm_engine", None)
        standins.uninstall()


def vllm_config(tp, dp=1, sleep=False):
    return types.SimpleNamespace(
        parallel_config=types.SimpleNamespace(tensor_parallel_size=tp, pipeline_parallel_size=1,
                                              data_parallel_size=dp, data_parallel_rank=0),
        model_config=types.SimpleNamespace(enable_sleep_mode=sleep))


class Setup:
    """Trainer worker + one GpuWorkerCalls per vLLM rank, transfer defined."""

    def __init__(self, cluster, cfg=TINY_MOE, builder=RECORDER.qwen3_moe, tp=2, ep=True, dp=1,
                 sleep=False, init=None, seed=0):
        self.cluster, self.cfg, self.tp, self.ep, self.dp = cluster, cfg, tp, ep, dp
        self.full = full_tensors(hf_shapes(cfg), seed=seed)
        self.start_trainer()
        self.models, self.workers = [], []
        config = types.SimpleNamespace(backend="wsync")
        for d in range(dp):
            for rec in tiny_ranks(builder, cfg, tp, ep):
                model = build_model(rec, fill=loaded_before)
                vc = vllm_config(tp, dp, sleep)
                vc.parallel_config.data_parallel_rank = d
                if sleep:
                    standins.CuMemAllocator.get_instance().track(
                        [p.data for p in model.parameters()])
                self.models.append(model)
                self.workers.append(standins.GpuWorkerCalls(config, vc, torch.device("cpu"),
                                                            model))
        info = dict({"controller": cluster.address, "hf_config": cfg,
                     "worker": {"round_timeout": 5.0}, "timeout": 30.0}, **(init or {}))
        for w in self.workers:
            w.init_weight_transfer_engine(info)
        self.client = wsync.Client(cluster.address, timeout=20)
        self.define()

    def start_trainer(self):
        sock = self.cluster.worker("trainer:0:1")
        self.reg = wsync.torch.register(self.full, group="trainer", rank=0, socket=sock)

    def define(self):
        self.client.wait_for_workers({"trainer": 1, "inference": self.tp * self.dp},
                                     timeout=30, buffers=True)
        src = layouts.source_side(layouts.describe(self.full.items(), rank=0))
        dst = vllm.destination(self.cfg, tp=self.tp, replicas=self.dp, expert_parallel=self.ep,
                               dtype="fp32")
        self.spec = layouts.transfer_spec(src, dst, name="vllm")
        self.client.define_transfer("weights", self.spec, source_group="trainer",
                                    destination_group="inference")

    def step(self, scale, shift):
        for t in self.full.values():
            t.mul_(scale).add_(shift)

    def update(self, version, sync=True):
        """One version the way a trainer drives vLLM: (pause) ->
        start_weight_update -> update_weights concurrently with wsync's sync ->
        finish_weight_update -> (resume). Returns the sync's handle."""
        for w in self.workers:
            w.start_weight_update()
        handle = self.client.sync(version) if sync else None
        with concurrent.futures.ThreadPoolExecutor(len(self.workers)) as pool:
            for f in [pool.submit(w.update_weights, {"version": version})
                      for w in self.workers]:
                f.result(timeout=TIMEOUT)
        for w in self.workers:
            w.finish_weight_update()
        if handle is not None:
            handle.wait(timeout=TIMEOUT, show_progress=False)
        return handle

    def expected(self, i, full=None):
        r = i % self.tp
        return vllm_rank_tensors(self.cfg, full or self.full, self.tp, r, self.ep)

    def check(self, full=None):
        for i, model in enumerate(self.models):
            want = self.expected(i, full)
            for name, p in model.named_parameters():
                assert torch.equal(p.data, want[name]), f"vLLM rank {i}: {name}"

    def close(self):
        for w in self.workers:
            w.shutdown()
        self.reg.close()
        self.client.close()


@pytest.fixture
def setups():
    made = []
    yield made
    for s in made:
        s.close()
