"""The GPU proof (issue 16): a real trainer syncs every new version into
vLLM-layout receivers, checked bit for bit. Run by run_gpu_proof.sh:

    torchrun --nproc_per_node 2 tests/python/gpu/sync_proof.py --out $OUT

Each of the 2 ranks (one GPU each) trains a transformers model built from a
small config with random init (Llama-shaped and Qwen3-MoE-shaped; no
downloads), wrapped with FSDP2 fully_shard, with AdamW steps. Its worker
(`wsync-worker --device r`, memberships trainer:r:2 and inference:r:2: the
receivers are colocated on the same GPUs) gets the rank's FSDP2 shards and the
receivers' vLLM-layout parameters (fused qkv / gate_up / stacked experts,
TP=2, bf16, plain CUDA tensors), all registered by CUDA IPC through
wsync.torch.register. The transfer is the source side derived from the model
(wsync.layouts) and the destination side of wsync.vllm (from a committed
fixture: wsync._native does not load on the GPU machine's Python). After
every sync every receiver parameter must equal the trainer's full_tensor()
put into vLLM's layout by an independent reading of vLLM's loaders
(proof_models.vllm_reference) and cast to bf16, bit for bit; the untouched
vocab padding must stay zero.

Without CUDA (or with --cpu) the same script runs on the host: gloo, host
workers, shared memory; with torch < 2.6 or without transformers the trainer
is the tests' DTensor stand-in (ducks) over the same HF tensors, updated in
place each version. Results: one JSON line per model and version on stdout
("PROOF {...}") and in --out/proof.jsonl; exit status 0 only if every check
held.
"""
import argparse
import json
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.dirname(HERE))

import pbload  # noqa: E402

PROTOBUF = pbload.install()

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from google.protobuf import json_format  # noqa: E402

import wsync  # noqa: E402
import wsync.torch  # noqa: E402
from wsync import layouts  # noqa: E402
from wsync._proto import layout_pb2  # noqa: E402

import proof_models  # noqa: E402
import trainers  # noqa: E402
import harness  # noqa: E402
from harness import Process, read_port_file  # noqa: E402

RANK = int(os.environ.get("RANK", "0"))
WORLD = int(os.environ.get("WORLD_SIZE", "1"))


class HOST:
    """The process group the script meets on: gloo (host), never the GPUs'
    NCCL. A rank waiting in an NCCL barrier spins a kernel on its GPU, and
    kernels of different processes time-slice a GPU: a colocated worker's
    sync would be slowed by the trainer ranks waiting for rank 0's
    sync().wait() (measured 3-4x on 2 x H100). Trainers should wait the same
    way (README, "Use it from your trainer")."""
    group = None


class Roles:
    """Which ranks train and which receive, per --placement:
    colocated  every rank trains (FSDP2 over all); ranks 0..TP-1 also receive
    disjoint   ranks 0..WORLD/2-1 train (FSDP2 over them); the others receive
               (TP=2 on their own GPUs)
    tpfsdp     every rank trains on a (dp, tp=2) mesh: TP by parallelize_module,
               FSDP2 over dp on top; ranks 0..TP-1 also receive."""

    def __init__(self, placement):
        tp = proof_models.TP
        self.placement = placement
        if placement == "disjoint":
            if WORLD < 2 * tp:
                raise SystemExit(f"--placement disjoint needs {2 * tp} ranks, got {WORLD}")
            self.trainers = list(range(WORLD - tp))
            self.receivers = list(range(WORLD - tp, WORLD))
        elif placement in ("colocated", "tpfsdp"):
            self.trainers, self.receivers = list(range(WORLD)), list(range(tp))
        else:
            raise SystemExit(f"unknown --placement {placement}")
        self.trainer_rank = RANK if RANK in self.trainers else None
        self.receiver_rank = self.receivers.index(RANK) if RANK in self.receivers else None

    def groups(self):
        g = []
        if self.trainer_rank is not None:
            g.append(f"trainer:{self.trainer_rank}:{len(self.trainers)}")
        if self.receiver_rank is not None:
            g.append(f"inference:{self.receiver_rank}:{len(self.receivers)}")
        return ",".join(g)

    def meshes(self, device):
        """(FSDP mesh, TP mesh or None) of this rank's trainer; made on every
        rank (mesh creation is collective), None for a receiver-only rank."""
        from torch.distributed.device_mesh import init_device_mesh
        if self.placement == "tpfsdp":
            m = init_device_mesh(device.type, (WORLD // proof_models.TP, proof_models.TP),
                                 mesh_dim_names=("dp", "tp"))
            return m["dp"], m["tp"]
        if self.placement == "disjoint":
            m = init_device_mesh(device.type, (2, WORLD // 2), mesh_dim_names=("role", "dp"))
            return (m["dp"] if self.trainer_rank is not None else None), None
        return init_device_mesh(device.type, (WORLD,)), None

    def bench_spec(self, spec):
        """`spec` with its sides' workers, as the controller places them here
        (worker w = global rank w, one node), for the data-plane bench."""
        out = type(spec)()
        out.CopyFrom(spec)
        for side, ranks in ((out.source, self.trainers), (out.destination, self.receivers)):
            del side.ranks[:]
            for r in ranks:
                side.ranks.add(worker=r, node="node0")
        return out


def log(*a):
    print(f"[rank {RANK}]", *a, flush=True)


def load_destination(model, size, experts):
    path = os.path.join(HERE, "fixtures", proof_models.fixture_name(model, size, experts))
    return json_format.Parse(open(path).read(), layout_pb2.TransferSpec())


def fused_expert_mappings(dst, moe_intermediate):
    """Mappings of the stacked fixture (experts.gate_proj / up_proj [E, I, H])
    rewritten for transformers >= 5's fused experts.gate_up_proj [E, 2I, H]
    (gate rows first)."""
    for m in dst.mappings:
        if m.src.endswith("mlp.experts.gate_proj"):
            m.src = m.src[:-len("gate_proj")] + "gate_up_proj"
        elif m.src.endswith("mlp.experts.up_proj"):
            m.src = m.src[:-len("up_proj")] + "gate_up_proj"
            m.src_box.offset[1] += moe_intermediate
    return dst


class Services:
    """The controller (rank 0) and this rank's worker (none without `groups`),
    sharing run_dir."""

    def __init__(self, run_dir, bin_dir, device, groups):
        self.dir = run_dir
        controller, worker = harness.CONTROLLER_BIN, harness.WORKER_BIN
        if bin_dir:
            controller = os.path.join(bin_dir, "wsync-controller")
            worker = os.path.join(bin_dir, "wsync-worker")
        self.procs = []
        pf = os.path.join(run_dir, "controller.ports")
        if RANK == 0:
            self.procs.append(Process(
                [controller, "--listen=127.0.0.1:0", "--insecure",
                 "--metrics_port=-1", f"--port_file={pf}",
                 f"--state_file={os.path.join(run_dir, 'controller.state')}"],
                os.path.join(run_dir, "controller.log")))
        self.address = "127.0.0.1:" + read_port_file(
            pf, "grpc_port", timeout=60, proc=self.procs[0].proc if self.procs else None)
        self.socket = None
        if not groups:  # a rank with nothing to serve (the receivers may embed theirs)
            return
        self.socket = os.path.join(run_dir, f"worker{RANK}.sock")
        wpf = os.path.join(run_dir, f"worker{RANK}.ports")
        # Host: -1 explicitly, or a CUDA build would take $LOCAL_RANK as the device.
        flags = [f"--device={device.index if device.type == 'cuda' else -1}"]
        flags += os.environ.get("WSYNC_PROOF_WORKER_FLAGS", "").split()
        self.procs.append(Process(
            [worker, f"--controller={self.address}", "--insecure",
             f"--groups={groups}",
             f"--local_socket={self.socket}", "--metrics_port=-1", f"--port_file={wpf}",
             "--node=n0", *flags], os.path.join(run_dir, f"worker{RANK}.log")))
        read_port_file(wpf, "local_socket", timeout=60, proc=self.procs[-1].proc)

    def close(self):
        for p in reversed(self.procs):
            p.stop()


def receivers_for(spec, device, rank):
    return {b: torch.zeros(n, dtype=torch.bfloat16, device=device)
            for b, (_, n) in layouts.local_buffers(spec.destination, rank).items()}


def reference_full(roles, trainer, device=None):
    """The trainer's full tensors on every rank that receives (the trainers'
    full_tensor() is collective over their mesh; receiver-only ranks get
    rank 0's copy). On `device` (a GPU) when every rank trains, so nothing
    is broadcast, and the GPU has room for them and their vLLM-layout copy;
    else on the host."""
    on_device = (device is not None and device.type == "cuda" and trainer is not None
                 and roles.placement != "disjoint"
                 and torch.cuda.mem_get_info(device)[0] > 2.5 * trainer.full_bytes())
    if device is not None:
        on_device = not dist_any(not on_device)  # full_tensor() is collective: agree
    full = trainer.full_tensors(on_device=on_device) if trainer is not None else None
    if roles.placement == "disjoint":
        box = [full]
        dist.broadcast_object_list(box, src=0, group=HOST.group)
        full = box[0]
    return full


def check(cfg, full, recv, rank):
    """Mismatches of receiver rank `rank`'s tensors against the reference."""
    ref = proof_models.vllm_reference(cfg, full, proof_models.TP, rank)
    bad = []
    if set(ref) != set(recv):
        bad.append(f"receiver names differ: only reference {sorted(set(ref) - set(recv))[:4]}, "
                   f"only receivers {sorted(set(recv) - set(ref))[:4]}")
    for name in sorted(set(ref) & set(recv)):
        want = ref[name].to(torch.bfloat16).flatten()
        got = recv[name]
        n = want.numel()
        if got.numel() < n:
            bad.append(f"{name}: receiver has {got.numel()} elements, reference {n}")
        elif not torch.equal(got[:n].view(torch.int16), want.to(got.device).view(torch.int16)):
            diff = (got[:n].float() != want.to(got.device).float()).sum().item()
            bad.append(f"{name}: {diff} of {n} elements differ")
        elif got.numel() > n and got[n:].view(torch.int16).any():
            bad.append(f"{name}: the padding past {n} elements was written")
    return bad


def make_trainer(args, roles, cfg, device):
    fsdp_mesh, tp_mesh = roles.meshes(device) if device.type == "cuda" else (None, None)
    if roles.trainer_rank is None:
        return None
    return trainers.make(cfg, device, roles.trainer_rank, len(roles.trainers),
                         prefer_real=not args.stand_in, fused_experts=args.fused_experts,
                         mesh=fsdp_mesh, tp_mesh=tp_mesh)


def register_all(roles, trainer, spec, device, services):
    reg = rreg = recv = None
    if trainer is not None:
        reg = wsync.torch.register(trainer.register_items(), group="trainer",
                                   rank=roles.trainer_rank, socket=services.socket)
    if roles.receiver_rank is not None:
        recv = receivers_for(spec, device, roles.receiver_rank)
        rreg = wsync.torch.register(recv, group="inference", rank=roles.receiver_rank,
                                    socket=services.socket)
    return reg, rreg, recv


def run_model(args, roles, model, device, services, client, out):
    size = "tiny" if args.tiny else args.size
    cfg = proof_models.CONFIGS[(model, size)]
    trainer = make_trainer(args, roles, cfg, device)
    fused = bool(dist_any(trainer is not None and trainer.fused_experts))
    dst = load_destination(model, size, "stacked" if fused else "separate")
    if fused:
        dst = fused_expert_mappings(dst, cfg["moe_intermediate_size"])
    items = trainer.describe_items() if trainer is not None else []
    src = layouts.source_side(layouts.gather(layouts.describe(items, rank=RANK), group=HOST.group),
                              replicated_meshes=roles.placement == "tpfsdp")
    spec = layouts.transfer_spec(src, dst, name=model)
    reg, rreg, recv = register_all(roles, trainer, spec, device, services)
    kind = dist_first(trainer.kind if trainer is not None else None)
    log(f"{model}: {kind}, registered {reg.bytes if reg else 0} trainer bytes "
        f"({type(reg).__name__}), {rreg.bytes if rreg else 0} receiver bytes")
    ok = True
    dist.barrier(group=HOST.group)  # every rank registered this model's tensors (replacing the last model's)
    if RANK == 0:
        client.wait_for_workers({"trainer": len(roles.trainers),
                                 "inference": len(roles.receivers)}, timeout=60, buffers=True)
        # WSYNC_PROOF_STAGING: staged syncs (docs/staging.md) through the
        # real workers: shadows, the CUDA checksums, the two-phase commit.
        staging = os.environ.get("WSYNC_PROOF_STAGING") or None
        client.define_transfer(model, spec, source_group="trainer",
                               destination_group="inference", staging=staging,
                               checksums=True if staging else None)
        tag = f"{model}_{size}_{roles.placement}"
        with open(os.path.join(args.out, f"spec_{tag}.json"), "w") as f:
            f.write(json_format.MessageToJson(roles.bench_spec(spec)))
    dist.barrier(group=HOST.group)
    times = []
    last_sync_id = None
    for version in range(1, args.versions + 1):
        if trainer is not None:
            trainer.step(version)
        t_step = time.perf_counter()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        dist.barrier(group=HOST.group)
        rec = {"model": model, "size": size, "placement": roles.placement, "trainer": kind,
               "version": version, "device": str(device),
               "alloc_conf": os.environ.get("PYTORCH_CUDA_ALLOC_CONF", "")}
        if RANK == 0:
            mode = client_mode(client, version)
            rec["client_mode"] = mode
            ping = rpc_ping(client, last_sync_id) if last_sync_id else None
            ping_grpcio = rpc_ping(grpcio_client(client), last_sync_id) if last_sync_id else None
            u0 = time.time_ns() // 1000
            t0 = time.perf_counter()
            status = client.sync(version, transfer=model, wait=120).wait(
                timeout=120, show_progress=False)  # one round trip (SyncRequest.wait_ms)
            t1 = time.perf_counter()
            u1 = time.time_ns() // 1000
            last_sync_id = status.sync_id
            # The round trip split by the controller's clock (same host):
            # request (call -> trigger), sync, answer (end -> returned).
            if status.started_unix_us and status.finished_unix_us:
                rec.update(request_s=(status.started_unix_us - u0) / 1e6,
                           answer_s=(u1 - status.finished_unix_us) / 1e6)
            rec.update(rpc_ping_s=ping, rpc_ping_grpcio_s=ping_grpcio)
            rec.update(sync_wait_s=round(t1 - t0, 6), step_to_synced_s=round(t1 - t_step, 6),
                       controller_elapsed_s=round(status.elapsed_seconds, 6),
                       plan_s=round(status.plan_seconds, 6),
                       dispatch_s=round(status.dispatch_seconds, 6),
                       max_setup_s=round(status.max_setup_seconds, 6),
                       max_execute_s=round(status.max_execute_seconds, 6),
                       max_deliver_s=round(status.max_deliver_seconds, 6),
                       max_queue_s=round(status.max_queue_seconds, 6),
                       max_bind_s=round(status.max_bind_seconds, 6),
                       max_run_s=round(status.max_run_seconds, 6),
                       max_report_s=round(status.max_report_seconds, 6),
                       bytes=status.bytes_total, direct_pairs=status.direct_pairs,
                       staging=lpb_staging_name(status.staging),
                       max_commit_s=round(status.max_commit_seconds, 6),
                       buckets_verified=status.buckets_verified,
                       uncommitted=list(status.uncommitted),
                       gbps=round(status.bytes_total / max(t1 - t0, 1e-9) / 1e9, 3))
            times.append((t1 - t0, t1 - t_step))
        dist.barrier(group=HOST.group)
        full = reference_full(roles, trainer, device)
        bad = check(cfg, full, recv, roles.receiver_rank) if recv is not None else []
        flags = [None] * WORLD
        dist.all_gather_object(flags, bad, group=HOST.group)
        rec["mismatches"] = [m for per in flags for m in per][:20]
        rec["bit_exact"] = not rec["mismatches"]
        ok = ok and rec["bit_exact"]
        if RANK == 0:
            print("PROOF " + json.dumps(rec), flush=True)
            out.write(json.dumps(rec) + "\n")
            out.flush()
    if RANK == 0 and len(times) > 1:
        steady = sorted(times[1:])  # version 1 also sets up the transport
        med = steady[len(steady) // 2]
        log(f"{model}: steady-state sync {med[0] * 1e3:.2f} ms, optimizer.step() -> "
            f"sync().wait() {med[1] * 1e3:.2f} ms (median of versions 2..{args.versions}; "
            f"{rec.get('bytes', 0)} bytes)")
    stale = reg.stale() if reg is not None else []
    if stale:
        log(f"{model}: registered tensors moved during training: {stale[:4]}")
        ok = False
    dist.barrier(group=HOST.group)
    return ok


def lpb_staging_name(mode):
    """SyncStatus.staging as the name define_transfer takes."""
    return {0: "in_place", 1: "host_shadow", 2: "device_shadow"}.get(int(mode), str(mode))


_GRPCIO_CLIENTS = {}
_NATIVE = {}


def client_mode(client, version):
    """Sets how `client` makes this version's sync call and returns it:
    WSYNC_PROOF_CLIENT_MODES (e.g. "grpcio,native,busy_wait") cycles through
    the modes version by version from version 2 (version 1 sets up the
    transport), so each mode is timed in the same run; unset: the client's
    own defaults."""
    modes = [m for m in os.environ.get("WSYNC_PROOF_CLIENT_MODES", "").split(",") if m]
    _NATIVE.setdefault(id(client), client._native)
    if not modes:
        return ("busy_wait" if client.busy_wait else "native") if client._native else "grpcio"
    mode = modes[(version - 2) % len(modes)] if version >= 2 else modes[0]
    if mode not in ("grpcio", "native", "busy_wait"):
        raise SystemExit(f"WSYNC_PROOF_CLIENT_MODES: unknown mode {mode!r}")
    native = _NATIVE[id(client)]
    if mode != "grpcio" and native is None:
        raise SystemExit(f"client mode {mode}: wsync._native is not importable here")
    client._native = None if mode == "grpcio" else native
    client.busy_wait = mode == "busy_wait"
    return mode


def grpcio_client(client):
    """A client of the same controller whose calls all go through grpcio
    (its own channel): the ping's other path, for comparison."""
    if client.address not in _GRPCIO_CLIENTS:
        import grpc
        _GRPCIO_CLIENTS[client.address] = wsync.Client(
            client.address, channel=grpc.insecure_channel(client.address))
    return _GRPCIO_CLIENTS[client.address]


def rpc_ping(client, sync_id):
    """Seconds of one short unary RPC from this process (WaitSync of a
    finished sync: answered at once), the floor of any call's round trip."""
    t = time.perf_counter()
    client._rpc("WaitSync", wsync._proto.controller_pb2.WaitSyncRequest(sync_id=sync_id,
                                                                        timeout_ms=1))
    return round(time.perf_counter() - t, 6)


def dist_any(flag):
    flags = [None] * WORLD
    dist.all_gather_object(flags, bool(flag), group=HOST.group)
    return any(flags)


def dist_first(value):
    """The first rank's non-None `value`."""
    values = [None] * WORLD
    dist.all_gather_object(values, value, group=HOST.group)
    return next(v for v in values if v is not None)



def rendezvous():
    """init_process_group's rendezvous: a file when WSYNC_PROOF_INIT_FILE
    names one (the CPU tests: a MASTER_PORT picked in advance can be taken by
    another process while torch imports), else torchrun's environment."""
    path = os.environ.get("WSYNC_PROOF_INIT_FILE")
    if not path:
        return {}
    return {"init_method": f"file://{path}", "rank": int(os.environ["RANK"]),
            "world_size": int(os.environ["WORLD_SIZE"])}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", default="llama,qwen3_moe")
    ap.add_argument("--versions", type=int, default=3)
    ap.add_argument("--tiny", action="store_true", help="the tiny configs (CPU variant)")
    ap.add_argument("--size", default="gpu", help="proof_models.CONFIGS size on GPUs")
    ap.add_argument("--placement", default="colocated", help="colocated, disjoint or tpfsdp")
    ap.add_argument("--cpu", action="store_true", help="host tensors and gloo even with CUDA")
    ap.add_argument("--stand-in", action="store_true",
                    help="the DTensor stand-in trainer even where FSDP2 and transformers exist")
    ap.add_argument("--fused-experts", action="store_true",
                    help="the stand-in holds MoE experts fused, as transformers >= 5 does")
    ap.add_argument("--run-dir", required=True, help="shared by the ranks: ports, sockets, logs")
    ap.add_argument("--bin-dir", default="",
                    help="holds wsync-controller and wsync-worker (default: the build tree)")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    cuda = torch.cuda.is_available() and not args.cpu
    if cuda:
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", RANK)))
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")
    dist.init_process_group("nccl" if cuda else "gloo", **rendezvous())
    HOST.group = dist.new_group(backend="gloo") if cuda else None
    os.makedirs(args.out, exist_ok=True)
    log(f"torch {torch.__version__}, protobuf runtime {PROTOBUF}, device {device}")
    roles = Roles(args.placement)
    services = Services(args.run_dir, args.bin_dir, device, roles.groups())
    client = wsync.Client(services.address, timeout=60) if RANK == 0 else None
    ok = True
    try:
        with open(os.path.join(args.out, f"proof{RANK}.jsonl"), "a") as out:
            for model in args.models.split(","):
                ok = run_model(args, roles, model, device, services, client, out) and ok
    finally:
        dist.barrier(group=HOST.group)
        services.close()
        dist.destroy_process_group()
    log("PROOF " + ("PASSED" if ok else "FAILED"))
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
