"""The vLLM weight-transfer backend "wsync" (wsync.vllm_engine) and the worker
extension (wsync.vllm_extension), on CPU with the host transport.

A real wsync-controller and a trainer-side wsync-worker process holding the
full Hugging Face tensors sync into receivers that are the vLLM stand-in
model's own parameters (tests/python/vllm_standins.py: vLLM's classes,
attributes and parameter shapes, real CPU storage), one engine per vLLM rank,
each with its embedded worker in this process. The engine is created and
driven exactly as vLLM's GPU worker does (vllm_engine_standins.GpuWorkerCalls
lists the calls from vllm/v1/worker/gpu_worker.py). After every version each
receiver parameter equals the trainer's tensors cut by the independent
reference of test_vllm_live (vllm_rank_tensors). Also: a trainer worker killed
mid-sync leaves the receivers on the old version or refusing to finish
(reported, naming the version), sleep-mode weights are woken first, the
post-processing runs only where needed, and the extension route."""
import concurrent.futures
import signal
import time
import types

import pytest
import torch

import wsync
import wsync.torch
from wsync import errors, layouts, vllm_live

import vllm_engine_standins as standins
from harness import freeze, full_tensors
from vllm_standins import (RECORDER, TINY, TINY_MOE, build_model, hf_shapes, loaded_before,
                           tiny_ranks, vllm_rank_tensors)

from vllm_engine_setup import TIMEOUT, Setup, engine_mod, setups, vllm_config  # noqa: F401


def test_engine_driven_like_gpu_worker_several_versions(cluster, engine_mod, setups):
    s = Setup(cluster)
    setups.append(s)
    parts = [w.engine.receiver.live for w in s.workers]
    assert [w.engine.receiver.membership for w in s.workers] == ["inference:0:2",
                                                                 "inference:1:2"]
    # Every live parameter is registered where it lives (no copy).
    for w, model in zip(s.workers, s.models):
        params = dict(model.named_parameters())
        assert set(w.engine.receiver.live.buffers) == set(params)
        assert all(w.engine.receiver.live.buffers[n] is p for n, p in params.items())
    # The trainer's HF-config destination is the merge of what the ranks derived.
    merged = vllm_live.merge(parts)
    assert {t.name for t in merged.destination.tensors} == \
        {t.name for t in s.spec.destination.tensors}
    ptrs = [{n: p.data_ptr() for n, p in m.named_parameters()} for m in s.models]
    for version in (1, 2, 3):
        if version > 1:
            s.step(-0.5, float(version))
        s.update(version)
        s.check()
        for w in s.workers:
            assert w.engine.weight_version == version and not w.active
            assert w.engine.status()["mixed"] is None
    assert ptrs == [{n: p.data_ptr() for n, p in m.named_parameters()} for m in s.models]
    assert s.client.transfer_status("weights").last_success_version == 3
    # Issue 17 item 3: the server (replica dp0, both TP ranks) reports what it serves.
    assert standins.replicas_at(s.client, 3, ["dp0"]) == ["dp0"]
    assert s.client.replicas_at(2) == []


def test_data_parallel_replicas_are_ranks_of_one_group(cluster, engine_mod, setups):
    s = Setup(cluster, cfg=TINY, builder=RECORDER.llama, tp=2, ep=False, dp=2)
    setups.append(s)
    assert [w.engine.receiver.membership for w in s.workers] == \
        [f"inference:{r}:4" for r in range(4)]
    s.update(1)
    s.check()


def test_killed_trainer_mid_sync_leaves_receivers_paused_not_mixed(cluster, engine_mod, setups):
    s = Setup(cluster, init={"timeout": 40.0})
    setups.append(s)
    s.update(1)
    s.check()
    v1 = {k: t.clone() for k, t in s.full.items()}
    s.step(3.0, -1.0)
    for w in s.workers:
        w.start_weight_update()
    # The trainer's worker is frozen, so the sync cannot end before it dies.
    trainer = s.cluster.workers["trainer:0:1"].proc
    freeze(trainer)
    handle = s.client.sync(2)
    with concurrent.futures.ThreadPoolExecutor(len(s.workers)) as pool:
        futures = [pool.submit(w.update_weights, {"version": 2}) for w in s.workers]
        time.sleep(0.5)
        assert not any(f.done() for f in futures)
        trainer.send_signal(signal.SIGKILL)
        for f in futures:
            with pytest.raises((errors.Aborted, errors.DeadlineExceeded), match="version 2") as e:
                f.result(timeout=TIMEOUT)
            if isinstance(e.value, errors.Aborted):  # the controller's first cause
                assert e.value.group and e.value.rank >= 0 and "mixed" in str(e.value)
    with pytest.raises(errors.WsyncError):
        handle.wait(timeout=TIMEOUT, show_progress=False)
    # No replica serves version 2, and none claims to serve 1 while some rank's
    # weights may be mixed.
    assert standins.replicas_at(s.client, 2, []) == []
    for i, w in enumerate(s.workers):
        # vLLM's worker left the update; finish refuses; the version is still 1.
        assert not w.active and w.engine.weight_version == 1
        with pytest.raises(RuntimeError, match="without a matching start"):
            w.finish_weight_update()
        st = w.engine.status()
        if st["mixed"] is None:  # nothing of version 2 reached this rank
            want = s.expected(i, v1)
            for name, p in s.models[i].named_parameters():
                assert torch.equal(p.data, want[name]), f"rank {i}: {name} changed"
        else:
            assert st["mixed"]["version"] == 2
            w.start_weight_update()  # a further finish without a good sync refuses
            with pytest.raises(errors.FailedPrecondition, match="version 2 .*mixed"):
                w.finish_weight_update()
            w.active = False  # vLLM's worker would have raised out of its finish too
    # Recovery: the trainer comes back and syncs version 2 again.
    s.cluster.workers["trainer:0:1"].stop()
    s.start_trainer()
    s.define()
    s.update(2)
    s.check()
    assert all(w.engine.weight_version == 2 and w.engine.status()["mixed"] is None
               for w in s.workers)
    assert standins.replicas_at(s.client, 2, ["dp0"]) == ["dp0"]


def test_retry_policy_waits_through_a_failed_attempt(cluster, engine_mod, setups):
    """retries=1: update_weights waits through the killed trainer's failed
    attempt and returns once the trainer's second attempt succeeds."""
    s = Setup(cluster, init={"retries": 1, "timeout": 50.0})
    setups.append(s)
    s.update(1)
    s.step(0.25, 4.0)
    trainer = s.cluster.workers["trainer:0:1"].proc
    freeze(trainer)
    for w in s.workers:
        w.start_weight_update()
    first = s.client.sync(2)
    with concurrent.futures.ThreadPoolExecutor(len(s.workers)) as pool:
        futures = [pool.submit(w.update_weights, {"version": 2}) for w in s.workers]
        time.sleep(0.5)
        trainer.send_signal(signal.SIGKILL)
        with pytest.raises(errors.SyncFailed):
            first.wait(timeout=TIMEOUT, show_progress=False)
        end = time.monotonic() + 10
        while any(w.engine.status()["mixed"] is None for w in s.workers):
            assert time.monotonic() < end, "the receivers never saw the failed attempt"
            time.sleep(0.05)
        assert not any(f.done() for f in futures)  # still waiting: one retry allowed
        s.cluster.workers["trainer:0:1"].stop()
        s.start_trainer()
        s.define()
        send = engine_mod.WsyncWeightTransferEngine.trainer_send_weights
        send(iter(()), {"client": s.client, "version": 2, "timeout": TIMEOUT})
        for f in futures:
            f.result(timeout=TIMEOUT)
    for w in s.workers:
        w.finish_weight_update()
        assert w.engine.weight_version == 2
    s.check()


def test_a_sync_outside_the_update_window_is_refused_untouched(cluster, engine_mod, setups):
    # vLLM was not paused (no start_weight_update): the held worker refuses
    # before touching a weight, and the trainer hears why.
    s = Setup(cluster, cfg=TINY, builder=RECORDER.llama, tp=1, ep=False)
    setups.append(s)
    s.update(1)
    v1 = {k: t.clone() for k, t in s.full.items()}
    s.step(1.0, 1.0)
    with pytest.raises(errors.WsyncError, match="not in a weight update"):
        s.client.sync(2).wait(timeout=TIMEOUT, show_progress=False)
    s.check(v1)
    # The refusal's FINISHED event reaches the receiver's event thread
    # independently of the trainer's answer: wait (bounded) for it.
    deadline = time.monotonic() + 10
    st = s.workers[0].engine.status()
    while st["outside_window"] != [2] and time.monotonic() < deadline:
        time.sleep(0.01)
        st = s.workers[0].engine.status()
    assert st["outside_window"] == [2] and st["mixed"] is None
    s.update(3)
    s.check()


def test_without_the_hold_a_sync_outside_the_window_is_reported(cluster, engine_mod, setups):
    s = Setup(cluster, cfg=TINY, builder=RECORDER.llama, tp=1, ep=False,
              init={"hold_outside_window": False})
    setups.append(s)
    s.update(1)
    s.client.sync(2).wait(timeout=TIMEOUT, show_progress=False)  # vLLM was not paused
    s.update(3)
    assert s.workers[0].engine.status()["outside_window"] == [2]
    s.check()


def test_asleep_weights_are_woken_before_the_update(cluster, engine_mod, setups):
    s = Setup(cluster, sleep=True)
    setups.append(s)
    alloc = standins.CuMemAllocator.get_instance()
    s.update(1)
    assert alloc.calls == []  # awake: nothing to do
    v1 = {k: t.clone() for k, t in s.full.items()}
    alloc.sleep(offload_tags=("weights",))
    assert all(torch.isnan(p.data).all() for m in s.models for p in m.parameters())
    s.step(0.5, 1.0)
    for w in s.workers:
        w.start_weight_update()
    assert alloc.calls == [("sleep", ("weights",)), ("wake_up", ["weights"])]
    assert not any(d.is_asleep for d in alloc.pointer_to_data.values())
    s.check(v1)  # woken with the version-1 weights, before anything was written
    s.client.sync(2).wait(timeout=TIMEOUT, show_progress=False)
    for w in s.workers:
        w.update_weights({"version": 2})
        w.finish_weight_update()
    s.check()
    # Weights that stay asleep are never updated: start_weight_update refuses.
    alloc.sleep(offload_tags=("weights",))
    alloc.wake_up = lambda tags=None: alloc.calls.append(("wake_up (fails)", tags))
    with pytest.raises(errors.FailedPrecondition, match="still asleep"):
        s.workers[0].start_weight_update()
    assert not s.workers[0].active


def test_a_sync_into_asleep_weights_before_the_window_is_refused(cluster, engine_mod, setups):
    """Without the hold, a trainer that syncs before start_weight_update
    writes into asleep weights; waking then restores the old contents: the
    engine refuses that version (one vLLM rank: in vLLM each rank has its own
    allocator). With the hold (the default) such a sync never writes."""
    s = Setup(cluster, cfg=TINY, builder=RECORDER.llama, tp=1, ep=False, sleep=True,
              init={"hold_outside_window": False})
    setups.append(s)
    alloc = standins.CuMemAllocator.get_instance()
    s.update(1)
    v1 = {k: t.clone() for k, t in s.full.items()}
    alloc.sleep(offload_tags=("weights",))
    s.step(2.0, 0.5)
    s.client.sync(2).wait(timeout=TIMEOUT, show_progress=False)
    w = s.workers[0]
    w.start_weight_update()
    s.check(v1)  # the wake restored version 1
    with pytest.raises(errors.Aborted, match="version 2 .*woke the weights"):
        w.update_weights({"version": 2})
    assert w.engine.weight_version == 1 and 2 in w.engine.status()["outside_window"]
    s.step(0.5, 0.0)
    s.update(3)
    s.check()
    assert w.engine.weight_version == 3 and w.engine.status()["mixed"] is None


class Fp8Method:
    """A quantization method whose final layout differs from the wire one."""

    def __init__(self, replace=False):
        self.calls, self.replace = 0, replace

    def process_weights_after_loading(self, layer):
        self.calls += 1
        if self.replace:
            layer.weight = torch.nn.Parameter(layer.weight.data.clone(), requires_grad=False)


class UnquantizedLinearMethod(Fp8Method):
    pass


def test_post_processing_only_where_the_wire_format_is_not_final(cluster, engine_mod, setups):
    s = Setup(cluster, cfg=TINY, builder=RECORDER.llama, tp=1, ep=False)
    setups.append(s)
    layers = s.models[0].model.layers
    fp8, plain = Fp8Method(), UnquantizedLinearMethod()
    getattr(layers, "0").self_attn.o_proj.quant_method = fp8
    getattr(layers, "0").self_attn.qkv_proj.quant_method = plain
    s.update(1)
    s.update(2)
    assert (fp8.calls, plain.calls) == (2, 0)
    assert s.workers[0].engine.receiver.post_processed == ["model.layers.0.self_attn.o_proj"]
    getattr(layers, "1").self_attn.o_proj.quant_method = Fp8Method(replace=True)
    s.workers[0].start_weight_update()
    s.client.sync(3).wait(timeout=TIMEOUT, show_progress=False)
    s.workers[0].update_weights({"version": 3})
    with pytest.raises(errors.FailedPrecondition,
                       match="layers.1.self_attn.o_proj.weight.*in place"):
        s.workers[0].finish_weight_update()
    assert s.workers[0].engine.weight_version == 2


def test_engine_refusals_name_what_was_expected(cluster, engine_mod, monkeypatch):
    rec = tiny_ranks(RECORDER.llama, TINY, 1, False)[0]
    config = types.SimpleNamespace(backend="wsync")
    w = standins.GpuWorkerCalls(config, vllm_config(1), torch.device("cpu"),
                                build_model(rec, fill=loaded_before))
    with pytest.raises(ValueError, match="invalid init_info.*controler"):
        w.init_weight_transfer_engine({"controler": cluster.address})
    monkeypatch.delenv("WSYNC_CONTROLLER", raising=False)
    with pytest.raises(errors.InvalidArgument, match="no wsync controller address"):
        w.init_weight_transfer_engine({})
    with pytest.raises(errors.FailedPrecondition, match="not initialized"):
        w.start_weight_update()
    monkeypatch.setenv("WSYNC_CONTROLLER", cluster.address)
    w.init_weight_transfer_engine({"hf_config": TINY})
    with pytest.raises(ValueError, match="version 0.*positive integer"):
        w.engine.parse_update_info({"version": 0})
    w.start_weight_update()
    with pytest.raises(errors.DeadlineExceeded, match="version 1 not received after 0.3 s"):
        w.update_weights({"version": 1, "timeout": 0.3})
    assert not w.active and w.engine.status()["mixed"] is None
    w.start_weight_update()  # the failed update closed the window: a new one opens
    with pytest.raises(errors.FailedPrecondition, match="without a received version"):
        w.finish_weight_update()
    w.shutdown()
    bad = standins.GpuWorkerCalls(config, vllm_config(4), torch.device("cpu"),
                                  build_model(rec, fill=loaded_before))
    with pytest.raises(errors.InvalidArgument, match="tensor_parallel_size is 4.*tp_size 1"):
        bad.init_weight_transfer_engine({"controller": cluster.address})


def test_worker_extension_route(cluster, engine_mod):
    """--worker-extension-cls: vLLM appends the class to its Worker's bases;
    the trainer calls the methods on every rank (collective_rpc). Asleep
    weights are woken through the Worker's own wake_up."""
    from wsync.vllm_extension import WsyncWorkerExtension

    class WorkerBase:
        pass

    class Worker(WorkerBase):  # the parts of vLLM's GPU Worker the extension uses
        def __init__(self, model, tp):
            self.model_runner = types.SimpleNamespace(model=model, get_model=lambda: model)
            self.vllm_config = vllm_config(tp)
            self.device = torch.device("cpu")

        def wake_up(self, tags=None):
            woken.append(tags)
            standins.CuMemAllocator.get_instance().wake_up(tags)

    Worker.__bases__ += (WsyncWorkerExtension,)  # as vLLM's WorkerWrapperBase.init_worker
    cfg, tp = TINY_MOE, 2
    full = full_tensors(hf_shapes(cfg), seed=5)
    reg = wsync.torch.register(full, group="trainer", rank=0,
                               socket=cluster.worker("trainer:0:1"))
    models = [build_model(r, fill=loaded_before) for r in tiny_ranks(RECORDER.qwen3_moe, cfg,
                                                                      tp, True)]
    workers = [Worker(m, tp) for m in models]
    woken, alloc = [], standins.CuMemAllocator.get_instance()
    for m in models:
        alloc.track([p.data for p in m.parameters()])

    def collective_rpc(method, *args):
        with concurrent.futures.ThreadPoolExecutor(len(workers)) as pool:
            return [f.result(timeout=TIMEOUT) for f in
                    [pool.submit(getattr(w, method), *args) for w in workers]]

    try:
        out = collective_rpc("wsync_start", cluster.address)
        assert [o["membership"] for o in out] == ["inference:0:2", "inference:1:2"]
        parts = [vllm_live.LiveDestination(0, "inference") for _ in out]
        for p, o in zip(parts, out):
            p.spec.ParseFromString(o["spec"])
        src = layouts.source_side(layouts.describe(full.items(), rank=0))
        spec = layouts.transfer_spec(src, vllm_live.merge(parts), name="ext")
        client = wsync.Client(cluster.address, timeout=20)
        client.wait_for_workers({"trainer": 1, "inference": tp}, timeout=30, buffers=True)
        client.define_transfer("weights", spec)
        for version in (1, 2):
            if version > 1:
                for t in full.values():
                    t.mul_(2.0).add_(-3.0)
                alloc.sleep(offload_tags=("weights",))
            collective_rpc("wsync_begin_update")
            handle = client.sync(version)
            assert collective_rpc("wsync_receive", version) == [version, version]
            assert collective_rpc("wsync_finish_update") == [version, version]
            handle.wait(timeout=TIMEOUT, show_progress=False)
            for r, m in enumerate(models):
                want = vllm_rank_tensors(cfg, full, tp, r, True)
                for name, p in m.named_parameters():
                    assert torch.equal(p.data, want[name]), f"rank {r}: {name}"
        assert [st["weight_version"] for st in collective_rpc("wsync_status")] == [2, 2]
        # Version 2 found the weights asleep: woken through Worker.wake_up (the
        # ranks share this process's allocator, so the first rank wakes them all).
        assert woken and all(tags == ["weights"] for tags in woken)
    finally:
        collective_rpc("wsync_stop")
        reg.close()


def test_refuses_layouts_it_cannot_derive():
    from wsync.vllm_receiver import receiver_for
    moe = build_model(tiny_ranks(RECORDER.qwen3_moe, TINY_MOE, 2, True)[1], fill=loaded_before)
    with pytest.raises(errors.InvalidArgument, match="expert parallelism across 2 data-parallel"):
        receiver_for(moe, parallel_config=vllm_config(2, dp=2).parallel_config)
    pp = vllm_config(2).parallel_config
    pp.pipeline_parallel_size = 2
    with pytest.raises(errors.InvalidArgument, match="pipeline_parallel_size must be 1"):
        receiver_for(moe, parallel_config=pp)
    with pytest.raises(errors.InvalidArgument, match="postprocess 'sometimes'"):
        receiver_for(moe, parallel_config=vllm_config(2).parallel_config,
                     postprocess="sometimes")
    rx = receiver_for(moe, parallel_config=vllm_config(2).parallel_config)
    assert (rx.membership, rx.tp_rank) == ("inference:1:2", 1)


def test_vllm_plugin_entry_point_registers_the_backend(engine_mod):
    """vLLM runs the ``vllm.general_plugins`` entry points in every process."""
    import importlib
    import os
    import tomllib
    from harness import ROOT
    with open(os.path.join(ROOT, "python", "pyproject.toml"), "rb") as f:
        eps = tomllib.load(f)["project"]["entry-points"]["vllm.general_plugins"]
    module, _, fn = eps["wsync"].partition(":")
    assert getattr(importlib.import_module(module), fn) is engine_mod.register
    factory = standins.WeightTransferEngineFactory
    assert factory._registry["wsync"]() is engine_mod.WsyncWeightTransferEngine
