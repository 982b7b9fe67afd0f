"""One vLLM TP rank of the issue-17 proof (vllm_engine_proof.py) in its own
process, as a vLLM worker process is: spawned ("spawn") by the proof rank that
owns its GPU and driven over a multiprocessing Pipe.

The child builds the vLLM stand-in model of one TP rank (vllm_standins:
vLLM's classes, attributes, parameter names and shapes from the recorder's
builders; bf16 parameters) whose parameters live in memory made as vLLM's
sleep-mode allocator makes it (nohandle_memory: cuMemCreate without a
shareable handle type) or, with no device, in plain host memory. It shows
that wsync.cuda_vmm cannot export that memory, then creates the wsync engine
through the stand-in WeightTransferEngineFactory and drives it with
vllm_engine_standins.GpuWorkerCalls, the calls of vLLM's gpu_worker.py.

Protocol: the parent sends (command, kwargs); the child answers ("ok", value)
or ("error", exception class name, message). Tensors travel as raw bytes
(`encode` / `decode`). The child exits on "exit", when the parent's end of
the pipe closes, or after `idle_timeout` seconds without a command.
"""
import os
import sys
import time
import types

HERE = os.path.dirname(os.path.abspath(__file__))

_ANSWER_POLL_S = 0.2


def encode(t):
    """(dtype name, shape, raw bytes) of a tensor, via a host copy."""
    import torch
    t = t.detach().contiguous().cpu()
    raw = t.reshape(-1).view(torch.uint8).numpy().tobytes()
    return str(t.dtype).replace("torch.", ""), tuple(t.shape), raw


def decode(item):
    import torch
    dtype, shape, raw = item
    return torch.frombuffer(bytearray(raw), dtype=getattr(torch, dtype)).reshape(shape)


class ChildError(Exception):
    """An exception raised in the child: `kind` is its class name."""

    def __init__(self, kind, message):
        super().__init__(f"{kind}: {message}")
        self.kind, self.message = kind, message


class Child:
    """The parent's handle on one receiver process. Every wait is bounded: a
    child that does not answer in time raises TimeoutError (the run fails,
    never hangs), one that died raises ChildError("died")."""

    def __init__(self, name, opts, idle_timeout=900.0):
        import multiprocessing
        ctx = multiprocessing.get_context("spawn")
        self.name = name
        self.conn, theirs = ctx.Pipe()
        self.proc = ctx.Process(target=serve, args=(theirs, dict(opts, idle_timeout=idle_timeout)),
                                daemon=True, name=name)
        self.proc.start()
        theirs.close()
        self.pending = None

    def send(self, cmd, **kwargs):
        if self.pending is not None:
            raise RuntimeError(f"{self.name}: {cmd} sent while {self.pending} is unanswered")
        self.conn.send((cmd, kwargs))
        self.pending = cmd

    def ready(self):
        """True once the pending command's answer is there."""
        return self.conn.poll(0)

    def result(self, timeout):
        cmd, end = self.pending, time.monotonic() + timeout
        if cmd is None:
            raise RuntimeError(f"{self.name}: no command is waiting for an answer")
        while not self.conn.poll(_ANSWER_POLL_S):
            if not self.proc.is_alive() and not self.conn.poll(0):
                self.pending = None
                raise ChildError("died", f"{self.name} exited with {self.proc.exitcode} "
                                 f"during {cmd}")
            if time.monotonic() > end:
                raise TimeoutError(f"{self.name}: no answer to {cmd} after {timeout} s")
        self.pending = None
        reply = self.conn.recv()
        if reply[0] == "error":
            raise ChildError(reply[1], reply[2])
        return reply[1]

    def __call__(self, cmd, timeout, **kwargs):
        self.send(cmd, **kwargs)
        return self.result(timeout)

    def close(self, timeout=60.0):
        try:
            if self.proc.is_alive():
                if self.pending is not None:
                    self.result(timeout)
                self("exit", timeout)
        except (TimeoutError, ChildError, OSError, EOFError):
            pass
        self.proc.join(timeout)
        if self.proc.is_alive():
            self.proc.kill()
            self.proc.join(10)


def serve(conn, opts):
    """The child's command loop (the target of Child's process)."""
    for p in (HERE, os.path.dirname(HERE)):
        if p not in sys.path:
            sys.path.insert(0, p)
    rank = _Rank(opts)
    try:
        while True:
            if not conn.poll(opts["idle_timeout"]):
                return  # the parent stopped talking: leave rather than linger
            try:
                cmd, kwargs = conn.recv()
            except EOFError:
                return
            try:
                value = getattr(rank, "cmd_" + cmd)(**kwargs)
                conn.send(("ok", value))
            except Exception as e:  # reported to the parent, which decides
                conn.send(("error", type(e).__name__, str(e)))
            if cmd == "exit":
                return
    finally:
        rank.cmd_close_model()


def _vllm_config(tp):
    """The parts of vLLM's VllmConfig the engine reads (one replica, no PP)."""
    return types.SimpleNamespace(
        parallel_config=types.SimpleNamespace(tensor_parallel_size=tp, pipeline_parallel_size=1,
                                              data_parallel_size=1, data_parallel_rank=0),
        model_config=types.SimpleNamespace(enable_sleep_mode=False))


class _Rank:
    """Command handlers (cmd_<name>) of one receiver rank."""

    def __init__(self, opts):
        import torch
        import vllm_engine_standins as standins
        self.torch, self.standins = torch, standins
        self.tp_rank = opts["tp_rank"]
        index = opts.get("device")
        self.device = torch.device("cpu") if index is None else torch.device("cuda", index)
        if index is not None:
            torch.cuda.set_device(self.device)
        standins.install()  # vLLM's base class, factory, CuMemAllocator (test stand-ins)
        import wsync.vllm_engine as engine
        engine.register()  # what vLLM's plugin entry point does in every process
        self.model = self.worker = self.pool = None
        self.ptrs = {}

    # ------------------------------------------------------------- model --
    def _build(self, builder, cfg, tp, ep):
        from vllm_standins import build_model, loaded_before, tiny_ranks
        rec = tiny_ranks(builder, dict(cfg, max_position_embeddings=64), tp, ep)[self.tp_rank]
        for entry in rec["parameters"] + rec["buffers"]:
            entry["dtype"] = "bfloat16"
        bf16 = self.torch.bfloat16
        if self.device.type == "cuda":
            from nohandle_memory import NoHandlePool
            self.pool = NoHandlePool(self.device.index)

            def fill(p):
                t = self.pool.tensor(p["shape"], bf16)
                t.copy_(loaded_before(p).to(bf16))
                return t
        else:
            def fill(p):
                return loaded_before(p).to(bf16)
        model = build_model(rec, fill=fill)
        if self.device.type == "cuda":
            self.torch.cuda.synchronize(self.device)
        return model

    def _export_refusal(self):
        """What wsync.cuda_vmm says when asked to export the weights' memory
        to another process (a sidecar worker): every allocation is refused."""
        from wsync import cuda_vmm
        exp = cuda_vmm.Export()
        for name, p in self.model.named_parameters():
            exp.add(name, p.data_ptr(), p.numel() * p.element_size(), "GPU-proof")
        drv, refused, exported = cuda_vmm._driver(), [], []
        for i, base in enumerate(exp.bases):
            try:
                os.close(cuda_vmm._export_chunk(drv, f"allocation {i}", base))
                exported.append(f"{base:#x}")
            except cuda_vmm.VmmExportError as e:
                refused.append(str(e))
        return {"allocations": len(exp.bases), "refused": len(refused),
                "exported": exported, "message": refused[0] if refused else "",
                "names_embedded": bool(refused) and all("wsync.embedded" in m for m in refused)}

    def cmd_init(self, model, cfg, tp, ep, init_info):
        """Builds the model, checks the export refusal, creates and initializes
        the engine as vLLM's Worker does. Returns what the parent needs."""
        from vllm_standins import RECORDER
        builder = {"llama": RECORDER.llama, "qwen3_moe": RECORDER.qwen3_moe}[model]
        self.model = self._build(builder, cfg, tp, ep)
        params = dict(self.model.named_parameters())
        refusal = self._export_refusal() if self.pool is not None else None
        in_pool = self.pool is None or all(self.pool.owns(p) for p in params.values())
        config = types.SimpleNamespace(backend="wsync")  # --weight-transfer-config
        self.worker = self.standins.GpuWorkerCalls(config, _vllm_config(tp), self.device,
                                                   self.model)
        self.worker.init_weight_transfer_engine(init_info)
        rx = self.worker.engine.receiver
        self.ptrs = {n: p.data_ptr() for n, p in params.items()}
        return {"membership": rx.membership, "spec": rx.live.spec.SerializeToString(),
                "registered_in_place": set(rx.live.buffers) == set(params) and all(
                    rx.live.buffers[n] is p for n, p in params.items()),
                "in_memory_kind": in_pool, "export_refusal": refusal,
                "memory": "cumem-no-handle" if self.pool is not None else "host",
                "bytes": sum(p.numel() * p.element_size() for p in params.values()),
                "dtypes": sorted({str(p.dtype) for p in params.values()})}

    # ---------------------------------------------------- gpu_worker calls --
    def cmd_start(self):
        self.worker.start_weight_update()

    def cmd_update(self, version, timeout):
        t0 = time.perf_counter()
        self.worker.update_weights({"version": version, "timeout": timeout})
        return time.perf_counter() - t0

    def cmd_finish(self):
        self.worker.finish_weight_update()
        return self.worker.engine.weight_version

    def cmd_leave_update(self):
        """vLLM's worker leaves an update whose finish raised (as the CPU test does)."""
        self.worker.active = False

    # ------------------------------------------------------------ checks --
    def cmd_state(self):
        st = self.worker.engine.status()
        now = {n: p.data_ptr() for n, p in self.model.named_parameters()}
        return {"active": self.worker.active, "weight_version": self.worker.engine.weight_version,
                "mixed": st["mixed"], "window_open": st["window_open"],
                "outside_window": st["outside_window"],
                "moved": sorted(n for n in self.ptrs if now.get(n) != self.ptrs[n])}

    def cmd_corrupt(self, name):
        """A stray write into one live parameter (the proof's self-check:
        its comparison must then fail naming `name`)."""
        p = dict(self.model.named_parameters())[name]
        with self.torch.no_grad():
            p.view(-1)[0] += 1.0

    def cmd_dump(self):
        return {n: encode(p) for n, p in self.model.named_parameters()}

    # ----------------------------------------------------------- teardown --
    def cmd_close_model(self):
        if self.worker is not None:
            self.worker.shutdown()
        self.worker = self.model = None
        if self.pool is not None:
            self.pool.close()
            self.pool = None

    def cmd_exit(self):
        self.cmd_close_model()
