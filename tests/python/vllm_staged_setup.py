"""The CPU harness of the staged vLLM tests (test_vllm_staged.py).

* ``EngineCoreLoop``: a stand-in of vLLM's engine-core busy loop
  (vllm/v1/engine/core.py, ``EngineCoreProc.run_busy_loop``): each turn first
  handles every queued client request (``_process_input_queue`` ->
  ``_handle_client_request``: a UTILITY request such as ``collective_rpc``
  runs the method on every worker through the executor, which returns when
  every worker returned), then runs one engine step (``_process_engine_step``)
  unless the scheduler is paused (``pause_scheduler`` / ``resume_scheduler``).
  Its forward reads every weight of every rank: it records one digest per rank
  per step, in two halves with a pause between them, so that a write during a
  forward shows as a digest of no version.
* ``StagedSetup``: a trainer wsync-worker holding the full HF tensors, vLLM
  ranks of the stand-in model (vllm_standins) receiving staged syncs through
  the engine route (GpuWorkerCalls) or the worker extension, driven by an
  EngineCoreLoop per replica, and optionally sidecar replicas (wsync-worker
  processes with plain buffers) that a test can freeze or kill.
"""
import concurrent.futures
import hashlib
import queue
import threading
import time
import types

import torch

import wsync
import wsync.torch
from wsync import layouts, vllm
from wsync._proto import controller_pb2 as pb

import vllm_engine_standins as standins
from harness import full_tensors
from vllm_engine_setup import vllm_config
from vllm_standins import RECORDER, TINY, build_model, hf_shapes, loaded_before, tiny_ranks, \
    vllm_rank_tensors

TIMEOUT = 60


def digest(named):
    """One digest of (name, tensor) pairs, in order."""
    h = hashlib.blake2b(digest_size=16)
    for name, t in named:
        h.update(name.encode())
        h.update(t.detach().contiguous().view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


class EngineCoreLoop:
    """One vLLM engine (a replica): `ranks` are its workers (objects whose
    methods collective_rpc calls), `models` their live models."""

    def __init__(self, ranks, models, forward_pause=0.002):
        self.ranks, self.models, self.forward_pause = ranks, models, forward_pause
        self._input = queue.Queue()
        self.steps = []  # (t0, t1, (digest per rank))
        self.utilities = []  # (method, t0, t1)
        self.paused = False
        self._stop = False
        self._pool = concurrent.futures.ThreadPoolExecutor(len(ranks))
        self._thread = threading.Thread(target=self._run, name="engine-core", daemon=True)
        self._thread.start()

    # --------------------------------------------------- client requests --
    def collective_rpc(self, method, timeout=None, args=(), kwargs=None):
        """LLM.collective_rpc: a UTILITY request, run between two steps."""
        fut = concurrent.futures.Future()
        self._input.put((method, tuple(args), dict(kwargs or {}), fut))
        return fut.result(timeout or TIMEOUT)

    def pause_generation(self):
        return self.collective_rpc("__pause__")

    def resume_generation(self):
        return self.collective_rpc("__resume__")

    # -------------------------------------------------------- busy loop --
    def _run(self):
        while not self._stop:
            while True:  # _process_input_queue
                try:
                    req = self._input.get_nowait()
                except queue.Empty:
                    break
                self._utility(*req)
            if self.paused:
                time.sleep(0.002)
                continue
            self._step()  # _process_engine_step

    def _utility(self, method, args, kwargs, fut):
        t0 = time.monotonic()
        try:
            if method in ("__pause__", "__resume__"):
                self.paused = method == "__pause__"
                out = None
            else:  # the executor's collective_rpc: every worker, all awaited
                futs = [self._pool.submit(getattr(r, method), *args, **kwargs)
                        for r in self.ranks]
                out = [f.result() for f in futs]
        except BaseException as e:  # noqa: BLE001 - handed to the caller
            self.utilities.append((method, t0, time.monotonic()))
            fut.set_exception(e)
            return
        self.utilities.append((method, t0, time.monotonic()))
        fut.set_result(out)

    def _step(self):
        t0 = time.monotonic()
        digests = []
        for m in self.models:
            params = list(m.named_parameters())
            half = len(params) // 2
            first = digest(params[:half])
            time.sleep(self.forward_pause)  # the forward is still reading
            digests.append(first + digest(params[half:]))
        self.steps.append((t0, time.monotonic(), tuple(digests)))
        time.sleep(0.001)

    def steps_between(self, t0, t1):
        return [s for s in self.steps if s[1] > t0 and s[0] < t1]

    def stop(self):
        self._stop = True
        self._thread.join(10)
        self._pool.shutdown()


class ExtWorker:
    """The parts of vLLM's GPU Worker the extension uses; vLLM's
    WorkerWrapperBase.init_worker appends the extension to its bases."""

    def __init__(self, model, tp, dp, d):
        self.model_runner = types.SimpleNamespace(model=model, get_model=lambda: model)
        self.vllm_config = vllm_config(tp, dp)
        self.vllm_config.parallel_config.data_parallel_rank = d
        self.device = torch.device("cpu")

    def wake_up(self, tags=None):  # vLLM's Worker.wake_up: the process's CuMemAllocator
        standins.CuMemAllocator.get_instance().wake_up(tags)


def ext_worker_class():
    from wsync.vllm_extension import WsyncWorkerExtension
    return type("Worker", (ExtWorker, WsyncWorkerExtension), {})


class StagedSetup:
    """`dp` replicas of `tp` vLLM ranks (tiny Llama, fp32) on `route`
    ("engine" or "extension"), plus `sidecars` replicas of wsync-worker
    processes; the transfer defined staged (host shadows) with `rollout`."""

    def __init__(self, cluster, *, tp=2, dp=1, sidecars=0, route="engine", rollout=None,
                 init=None, seed=0, sleep=False):
        self.cluster, self.cfg, self.tp, self.route = cluster, TINY, tp, route
        self.replicas = dp + sidecars
        self.full = full_tensors(hf_shapes(self.cfg), seed=seed)
        self.reg = wsync.torch.register(self.full, group="trainer", rank=0,
                                        socket=cluster.worker("trainer:0:1"))
        self.models, self.workers, self.engines = [], [], []
        info = dict({"controller": cluster.address, "hf_config": self.cfg, "staged": True,
                     "worker": {"round_timeout": 5.0}, "timeout": 30.0}, **(init or {}))
        for d in range(dp):
            models, ranks = [], []
            for rec in tiny_ranks(RECORDER.llama, self.cfg, tp, False):
                model = build_model(rec, fill=loaded_before)
                if sleep:  # vLLM's sleep mode: the weights live in its CuMemAllocator
                    standins.CuMemAllocator.get_instance().track(
                        [p.data for p in model.parameters()])
                models.append(model)
                ranks.append(self._rank(model, tp, self.replicas, d, info))
            self.models += models
            self.workers += ranks
            self.engines.append(EngineCoreLoop(ranks, models))
        self.client = wsync.Client(cluster.address, timeout=20)
        src = layouts.source_side(layouts.describe(self.full.items(), rank=0))
        dst = vllm.destination(self.cfg, tp=tp, replicas=self.replicas, dtype="fp32")
        self.spec = layouts.transfer_spec(src, dst, name="vllm")
        self.sidecars = [self._sidecar(r) for r in range(dp * tp, self.replicas * tp)]
        self.client.wait_for_workers({"trainer": 1, "inference": self.replicas * tp},
                                     timeout=30, buffers=True)
        self.client.define_transfer("weights", self.spec, staging="host_shadow",
                                    checksums=True, rollout=rollout)

    def _rank(self, model, tp, dp, d, info):
        if self.route == "engine":
            vc = vllm_config(tp, dp)
            vc.parallel_config.data_parallel_rank = d
            w = standins.GpuWorkerCalls(types.SimpleNamespace(backend="wsync"), vc,
                                        torch.device("cpu"), model)
            w.init_weight_transfer_engine(info)
            return w
        w = ext_worker_class()(model, tp, dp, d)
        opts = {k: v for k, v in info.items() if k not in ("controller", "hf_config")}
        w.wsync_start(info["controller"], hf_config=info["hf_config"], **opts)
        return w

    def _sidecar(self, rank):
        sock = self.cluster.worker(f"inference:{rank}:{self.replicas * self.tp}")
        bufs = {b: torch.zeros(n, dtype=torch.float32)
                for b, (_, n) in layouts.local_buffers(self.spec.destination, rank).items()}
        return wsync.torch.register(bufs, group="inference", rank=rank, socket=sock), bufs

    def receiver(self, i):
        w = self.workers[i]
        return w.engine.receiver if self.route == "engine" else w._wsync_receiver

    def step(self, scale, shift):
        for t in self.full.values():
            t.mul_(scale).add_(shift)

    def version_digests(self, full=None):
        """(digest per rank of one replica) of the weights `full` gives."""
        out = []
        for r in range(self.tp):
            want = vllm_rank_tensors(self.cfg, full or self.full, self.tp, r, False)
            names = [n for n, _ in self.models[r].named_parameters()]
            params = [(n, want[n]) for n in names]
            half = len(params) // 2
            out.append(digest(params[:half]) + digest(params[half:]))
        return tuple(out)

    def live_digests(self, replica=0):
        out = []
        for m in self.models[replica * self.tp:(replica + 1) * self.tp]:
            params = list(m.named_parameters())
            half = len(params) // 2
            out.append(digest(params[:half]) + digest(params[half:]))
        return tuple(out)

    def wait_decided(self, handle, timeout=TIMEOUT):
        """The trainer's side: waits until the pool decided the commit (every
        receiver staged and verified), or the sync ended."""
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            st = handle.poll()
            if st.commit_decided or st.phase != pb.SYNC_RUNNING:
                return st
            time.sleep(0.02)
        raise AssertionError(f"sync {handle} not decided in {timeout} s")

    def close(self):
        for e in self.engines:
            e.stop()
        for w in self.workers:
            if self.route == "engine":
                w.shutdown()
            else:
                w.wsync_stop()
        self.reg.close()
        for reg, _ in self.sidecars:
            reg.close()
        self.client.close()
