"""The GPU proof of issue 17: a real FSDP2 trainer syncs into vLLM ranks that
run wsync's weight-transfer backend ("wsync", wsync.vllm_engine) with its
embedded worker, their weights in sleep-mode-style memory. Run by
run_gpu_proof.sh (stages vllm_colocated, vllm_disjoint):

    torchrun --nproc_per_node 2 tests/python/gpu/vllm_engine_proof.py \\
        --placement colocated --run-dir DIR --out OUT     # 4 GPUs: --placement disjoint

Trainers (sync_proof's roles, trainers, services): colocated, ranks 0-1 train
(FSDP2 over both); disjoint, ranks 0-1 train and ranks 2-3 only receive.
Colocated, each trainer rank registers its FSDP2 shards with the embedded
worker of the vLLM rank on its GPU (init_info colocated: that worker also
holds the trainer rank and serves the local API; NCCL refuses two ranks of one
GPU, and the sleep-mode weights cannot be mapped by the trainer); disjoint
(or colocated --sidecar), with its `wsync-worker --device r` sidecar (group
trainer). Receivers: one process per vLLM TP rank (TP=2; EP for
the MoE), spawned by the rank that owns that GPU (vllm_rank_child), holding
the vLLM stand-in model's parameters (bf16) in cuMem memory without a
shareable handle (nohandle_memory) that wsync.cuda_vmm is shown to refuse to
export; each runs the engine through the calls of vLLM's gpu_worker.py
(init_weight_transfer_engine with the controller, hf_config, embedded worker
options; start_weight_update / update_weights / finish_weight_update per
version) while rank 0 runs client.sync. The transfer's destination is what
the ranks derived from their live models, merged (wsync.vllm_live).

Checks, per model and version: every receiver parameter equals the trainer's
full_tensor() put into vLLM's layout by vllm_standins.vllm_rank_tensors (an
independent reading of vLLM's loaders) cast to bf16, bit for bit; data_ptr()s
never change; the engine reports weight_version == V and no mixed state. Last,
the kill case (on the last model, with sidecars: colocated, a dead trainer
process fails no sync, as its memory stays mapped by the vLLM rank's worker):
version V+1 starts, a trainer sidecar is
frozen (SIGSTOP) so the sync cannot finish, then killed (SIGKILL); every
receiver must end on version V: update_weights fails naming V+1, finish
refuses, weight_version stays V, and every parameter still equals version V.

--cpu: host tensors, gloo, host workers, plain host memory, tiny configs, the
DTensor stand-in trainer (test_vllm_engine_proof_cpu.py). Records: one JSON
line per model, version and placement ("VLLM_PROOF {...}" on stdout and in
--out/vllm_proof.jsonl); exit status 0 only if every check held.
"""
import argparse
import datetime
import json
import os
import signal
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.dirname(HERE))

import sync_proof  # noqa: E402  (first: it loads the messages before wsync is imported)

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

import wsync  # noqa: E402
import wsync.torch  # noqa: E402
from wsync import errors, layouts, vllm_live  # noqa: E402

import harness  # noqa: E402
import proof_models  # noqa: E402
import trainers  # noqa: E402
from vllm_proof_checks import agree, attempt, compare, gathered  # noqa: E402
from vllm_rank_child import Child, ChildError  # noqa: E402

RANK, WORLD = sync_proof.RANK, sync_proof.WORLD
TP = proof_models.TP
HOST = sync_proof.HOST


class TRAINERS:
    """The gloo group of the trainer ranks (the stand-in trainer's gathers)."""
    group = None
log = sync_proof.log


class Run:
    """One model's run on this rank (see the module docstring)."""

    def __init__(self, args, roles, services, client, child, device, model):
        self.args, self.roles, self.services = args, roles, services
        self.client, self.child, self.device, self.model = client, child, device, model
        self.size = "tiny" if args.cpu else args.size
        self.cfg = proof_models.CONFIGS[(model, self.size)]
        self.ep = self.cfg["model_type"] == "qwen3_moe"
        self.group = f"inference_{model}"  # a group per model: each has its own receivers
        self.problems, self.full = [], None
        self.trainer = self.reg = self.init = None
        self.timeout = args.timeout

    def rec(self, **fields):
        r = {"model": self.model, "size": self.size, "placement": self.roles.placement,
             "device": str(self.device), "memory": None}
        r.update(fields)
        return r

    # --------------------------------------------------------------- setup --
    def setup(self):
        """Trainer, receivers (engine initialized), transfer defined. False on failure."""
        args, roles = self.args, self.roles
        self.trainer = attempt(self.problems, "trainer", self.make_trainer)
        fused = sync_proof.dist_any(self.trainer is not None and self.trainer.fused_experts)
        if self.child is not None:
            info = {"controller": self.services.address, "group": self.group,
                    "hf_config": self.cfg, "experts": "stacked" if fused else "separate",
                    "timeout": self.timeout, "worker": {"round_timeout": args.round_timeout,
                                                        "node": "n0"}}
            if args.colocate:
                info["colocated"] = {"group": "trainer", "size": len(roles.trainers),
                                     "socket": self.colocated_socket("{rank}")}
            self.init = attempt(self.problems, "receiver init", self.child, "init",
                                self.timeout, model=self.model, cfg=self.cfg, tp=TP, ep=self.ep,
                                init_info=info)
        if self.init is not None:
            self.check_init(self.init)
        parts = [p for p in gathered(None if self.init is None else
                                     (roles.receiver_rank, self.init["spec"])) if p]
        items = self.trainer.describe_items() if self.trainer is not None else []
        src = layouts.source_side(layouts.gather(layouts.describe(items, rank=RANK),
                                                 group=HOST.group))
        if self.trainer is not None:
            self.reg = attempt(self.problems, "register trainer", wsync.torch.register,
                               self.trainer.register_items(), group="trainer",
                               rank=roles.trainer_rank,
                               socket=(self.colocated_socket(roles.trainer_rank)
                                       if args.colocate else self.services.socket))
        if agree(self.problems):
            return False
        if RANK == 0:
            attempt(self.problems, "define transfer", self.define, src, parts, fused)
        return not agree(self.problems)

    def colocated_socket(self, rank):
        """The local socket of the vLLM rank's worker where trainer `rank` registers."""
        return os.path.join(self.args.run_dir, f"colo-{self.model}-{rank}.sock")

    def make_trainer(self):
        """sync_proof's trainer; the stand-in gathers over the trainer ranks only."""
        roles = self.roles
        mesh = roles.meshes(self.device)[0] if self.device.type == "cuda" else None
        if roles.trainer_rank is None:
            return None
        return trainers.make(self.cfg, self.device, roles.trainer_rank, len(roles.trainers),
                             prefer_real=not self.args.stand_in,
                             fused_experts=self.args.fused_experts, mesh=mesh,
                             group=TRAINERS.group)

    def check_init(self, init):
        if not init["registered_in_place"]:
            self.problems.append(f"rank {RANK}: the engine did not register every live "
                                 "parameter where it lives")
        if not init["in_memory_kind"]:
            self.problems.append(f"rank {RANK}: parameters outside the no-handle pool")
        if init["dtypes"] != ["torch.bfloat16"]:
            self.problems.append(f"rank {RANK}: receiver dtypes {init['dtypes']}")
        ref = init["export_refusal"]
        if ref is not None and not (ref["refused"] == ref["allocations"] > 0 and
                                    ref["names_embedded"]):
            self.problems.append(f"rank {RANK}: wsync.cuda_vmm did not refuse the no-handle "
                                 f"memory as expected: {ref}")
        if ref is not None and RANK == self.roles.receivers[0]:
            log(f"{self.model}: {ref['refused']} of {ref['allocations']} allocations refused by "
                f"wsync.cuda_vmm: {ref['message'][:300]}")

    def define(self, src, parts, fused):
        live = []
        for r, raw in sorted(parts):
            d = vllm_live.LiveDestination(r, self.group)
            d.spec.ParseFromString(raw)
            live.append(d)
        dst = vllm_live.merge(live, name=self.group)
        if fused:
            dst = sync_proof.fused_expert_mappings(dst, self.cfg["moe_intermediate_size"])
        spec = layouts.transfer_spec(src, dst, name=self.model)
        self.client.wait_for_workers({"trainer": len(self.roles.trainers), self.group: TP},
                                     timeout=self.timeout, buffers=True)
        self.client.define_transfer(self.model, spec, source_group="trainer",
                                    destination_group=self.group)

    # ------------------------------------------------------------ versions --
    def barrier(self):
        dist.barrier(group=HOST.group)

    def step(self, version):
        if self.trainer is not None:
            attempt(self.problems, f"step {version}", self.trainer.step, version)
            if self.device.type == "cuda":
                torch.cuda.synchronize(self.device)

    def version(self, v):
        """One version through the engine's lifecycle; returns the record."""
        self.step(v)
        self.barrier()
        mine = {"rank": RANK}
        t0 = time.perf_counter()
        if self.child is not None:
            attempt(self.problems, f"start_weight_update {v}", self.child, "start", self.timeout)
        self.barrier()  # the window is open on every rank before the trainer syncs
        if self.child is not None:
            attempt(self.problems, f"send update {v}", self.child.send, "update", version=v,
                    timeout=self.timeout)
        status, wait_s = None, None
        if RANK == 0:
            t1 = time.perf_counter()
            status = attempt(self.problems, f"sync {v}", lambda: self.client.sync(
                v, transfer=self.model, wait=self.timeout).wait(timeout=self.timeout,
                                                                 show_progress=False))
            wait_s = time.perf_counter() - t1
        if self.child is not None:
            mine["update_s"] = attempt(self.problems, f"update_weights {v}", self.child.result,
                                       self.timeout + 30)
            mine["finished"] = attempt(self.problems, f"finish_weight_update {v}", self.child,
                                       "finish", self.timeout)
            mine["start_to_finish_s"] = round(time.perf_counter() - t0, 6)
        if v == self.args.corrupt_after and self.roles.receiver_rank == 0:
            attempt(self.problems, "corrupt", self.child, "corrupt", self.timeout,
                    name="model.norm.weight")
        self.barrier()
        self.full = sync_proof.reference_full(self.roles, self.trainer)
        bad = self.check_receiver(self.full, v, mine) if self.child is not None else []
        per = gathered({"bad": bad, **mine})
        problems = agree(self.problems)
        self.problems.clear()
        mismatches = [m for p in per for m in p["bad"]] + problems
        r = self.rec(version=v, sync_wait_s=None if wait_s is None else round(wait_s, 6),
                     start_to_finish_s=[p["start_to_finish_s"] for p in per
                                        if "start_to_finish_s" in p],
                     weight_versions=[p["finished"] for p in per if "finished" in p],
                     mismatches=mismatches[:20], bit_exact=not mismatches)
        if status is not None:
            r.update(bytes=status.bytes_total,
                     controller_elapsed_s=round(status.elapsed_seconds, 6))
        return r

    def check_receiver(self, full, v, mine):
        """This rank's receiver after version v: state and bit-exact parameters."""
        bad = []
        state = attempt(bad, "state", self.child, "state", self.timeout)
        if state is not None:
            if state["weight_version"] != v or state["active"] or state["mixed"] is not None:
                bad.append(f"rank {RANK}: engine reports version {state['weight_version']}, "
                           f"active {state['active']}, mixed {state['mixed']} after {v}")
            if state["moved"] or state["outside_window"]:
                bad.append(f"rank {RANK}: parameters moved: {state['moved'][:5]}; syncs "
                           f"outside an update window: {state['outside_window']}")
        dump = attempt(bad, "dump", self.child, "dump", self.timeout)
        if dump is not None and full is not None:
            bad += compare(self.cfg, full, self.roles.receiver_rank, self.ep, dump)
        return bad

    # ----------------------------------------------------------- kill case --
    def victim(self):
        return self.roles.trainers[-1]

    def kill_case(self, v):
        """Version v (= V + 1) with a trainer sidecar frozen, then killed."""
        kept = self.full  # version V's full tensors
        self.step(v)
        self.barrier()
        if self.child is not None:
            attempt(self.problems, f"start_weight_update {v}", self.child, "start", self.timeout)
        sidecar = self.services.procs[-1].proc if RANK == self.victim() else None
        if sidecar is not None:
            harness.freeze(sidecar)
        self.barrier()
        if self.child is not None:
            attempt(self.problems, f"send update {v}", self.child.send, "update", version=v,
                    timeout=self.args.kill_timeout)
        handle = None
        if RANK == 0:
            handle = attempt(self.problems, f"sync {v} start", self.client.sync, v,
                             transfer=self.model)
        time.sleep(1.0)
        if self.child is not None and self.child.ready():
            self.problems.append(f"rank {RANK}: update_weights({v}) returned while a trainer "
                                 "sidecar was frozen")
        self.barrier()
        if sidecar is not None:
            sidecar.send_signal(signal.SIGKILL)
            sidecar.wait(30)
        mine = {"rank": RANK}
        if self.child is not None:
            mine["update_error"] = self.expect_error(
                f"update_weights {v}", lambda: self.child.result(self.args.kill_timeout + 60),
                ("Aborted", "DeadlineExceeded"), f"version {v}")
        if handle is not None:
            try:
                handle.wait(timeout=self.args.kill_timeout + 60, show_progress=False)
                self.problems.append(f"rank 0: the sync of version {v} succeeded without a "
                                     "trainer sidecar")
            except errors.WsyncError as e:
                mine["sync_error"] = f"{type(e).__name__}: {str(e)[:300]}"
        self.barrier()
        bad = self.check_kept(kept, v, mine) if self.child is not None else []
        if RANK == 0:
            at = attempt(self.problems, "replicas_at", self.client.replicas_at, v,
                         group=self.group)
            if at:
                self.problems.append(f"rank 0: replicas {at} claim version {v}")
        per = gathered({"bad": bad, **mine})
        mismatches = [m for p in per for m in p["bad"]] + agree(self.problems)
        self.problems.clear()
        return self.rec(version=v, case="killed trainer sidecar", kept_version=v - 1,
                        killed_rank=self.victim(),
                        update_errors=[p.get("update_error") for p in per if "update_error" in p],
                        mixed_reported=[p.get("mixed") for p in per if "rank_tp" in p],
                        finish_refusals=[f for p in per for f in p.get("refusals", [])],
                        sync_error=next((p["sync_error"] for p in per if "sync_error" in p), None),
                        mismatches=mismatches[:20], bit_exact=not mismatches)

    def expect_error(self, what, fn, kinds, needle):
        try:
            fn()
        except ChildError as e:
            if e.kind not in kinds or needle not in e.message:
                self.problems.append(f"rank {RANK}: {what}: expected {kinds} naming "
                                     f"'{needle}', got {e}")
            return f"{e.kind}: {e.message[:300]}"
        except Exception as e:
            self.problems.append(f"rank {RANK}: {what}: {type(e).__name__}: {e}")
            return None
        self.problems.append(f"rank {RANK}: {what} returned; expected {kinds}")
        return None

    def check_kept(self, kept, v, mine):
        """After the failed version v: paused on v - 1, refusing to finish,
        every parameter still version v - 1's."""
        bad = []
        state = attempt(bad, "state", self.child, "state", self.timeout)
        if state is None:
            return bad
        mixed = state["mixed"] and dict(state["mixed"], error=state["mixed"]["error"][:200])
        mine.update(mixed=mixed, rank_tp=self.roles.receiver_rank, refusals=[])
        if state["active"] or state["weight_version"] != v - 1:
            bad.append(f"rank {RANK}: after the failed {v}: active {state['active']}, version "
                       f"{state['weight_version']} (expected {v - 1})")
        mine["refusals"].append(self.expect_error(
            f"finish_weight_update after the failed {v}",
            lambda: self.child("finish", self.timeout), ("RuntimeError",),
            "without a matching start"))
        if state["mixed"] is not None:
            if state["mixed"]["version"] != v:
                bad.append(f"rank {RANK}: mixed state names {state['mixed']}, not {v}")
            attempt(bad, "start again", self.child, "start", self.timeout)
            mine["refusals"].append(self.expect_error(
                f"finish_weight_update of a mixed {v}", lambda: self.child("finish", self.timeout),
                ("FailedPrecondition",), f"version {v}"))
            attempt(bad, "leave update", self.child, "leave_update", self.timeout)
        dump = attempt(bad, "dump", self.child, "dump", self.timeout)
        if dump is not None and kept is not None:
            bad += [f"kept version {v - 1}: {m}" for m in compare(
                self.cfg, kept, self.roles.receiver_rank, self.ep, dump)]
        return bad

    def close(self):
        if self.child is not None:
            attempt(self.problems, "close model", self.child, "close_model", self.timeout)
        if self.reg is not None:
            attempt(self.problems, "close registration", self.reg.close)


def emit(out, rec):
    if RANK == 0:
        print("VLLM_PROOF " + json.dumps(rec), flush=True)
        out.write(json.dumps(rec) + "\n")
        out.flush()


def run_model(args, roles, services, client, child, device, model, kill, out):
    run = Run(args, roles, services, client, child, device, model)
    ok = True
    try:
        if not run.setup():
            problems = agree(run.problems)
            emit(out, run.rec(version=0, case="setup", mismatches=problems[:20],
                              bit_exact=False))
            return False
        inits = [i for i in gathered(run.init and {
            "memory": run.init["memory"], "refusal": run.init["export_refusal"]}) if i]
        memory = {"memory": inits[0]["memory"], "export_refused": [
            None if i["refusal"] is None else f"{i['refusal']['refused']} of "
            f"{i['refusal']['allocations']} allocations" for i in inits]}
        for v in range(1, args.versions + 1):
            rec = dict(run.version(v), **memory)
            ok = ok and rec["bit_exact"]
            emit(out, rec)
        if kill:
            rec = dict(run.kill_case(args.versions + 1), **memory)
            ok = ok and rec["bit_exact"]
            emit(out, rec)
    finally:
        run.close()
        dist.barrier(group=HOST.group)
    return ok


def parse_args():
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", default="llama,qwen3_moe")
    ap.add_argument("--versions", type=int, default=3)
    ap.add_argument("--size", default="gpu", help="proof_models.CONFIGS size on GPUs")
    ap.add_argument("--placement", default="colocated", choices=("colocated", "disjoint"))
    ap.add_argument("--cpu", action="store_true",
                    help="host tensors, gloo, host workers, tiny configs (the CPU variant)")
    ap.add_argument("--stand-in", action="store_true",
                    help="the DTensor stand-in trainer even where FSDP2 and transformers exist")
    ap.add_argument("--fused-experts", action="store_true",
                    help="the stand-in holds MoE experts fused, as transformers >= 5 does")
    ap.add_argument("--no-kill", action="store_true", help="skip the killed-trainer case")
    ap.add_argument("--sidecar", action="store_true",
                    help="colocated: trainers register with sidecar workers (on GPUs NCCL then "
                         "refuses the two ranks per GPU); default: with the vLLM ranks' "
                         "workers (init_info colocated)")
    ap.add_argument("--timeout", type=float, default=120.0, help="seconds for every wait")
    ap.add_argument("--kill-timeout", type=float, default=60.0,
                    help="update_weights' wait in the kill case")
    ap.add_argument("--round-timeout", type=float, default=30.0,
                    help="the embedded workers' round_timeout")
    ap.add_argument("--corrupt-after", type=int, default=0,
                    help="self-check: after this version a stray write hits receiver 0's "
                         "model.norm.weight, so the run must fail naming it")
    ap.add_argument("--run-dir", required=True, help="shared by the ranks: ports, sockets, logs")
    ap.add_argument("--bin-dir", default="",
                    help="holds wsync-controller and wsync-worker (default: the build tree)")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    args.tiny = args.cpu  # sync_proof.make_trainer's reading
    # Colocated trainers register with the vLLM rank's embedded worker on
    # their device (init_info colocated): no sidecar, no second rank per GPU.
    args.colocate = args.placement == "colocated" and not args.sidecar
    return args


def main():
    args = parse_args()
    cuda = torch.cuda.is_available() and not args.cpu
    if cuda:
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", RANK)))
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")
    limit = datetime.timedelta(seconds=4 * args.timeout + 2 * args.kill_timeout)
    dist.init_process_group("nccl" if cuda else "gloo", timeout=limit, **sync_proof.rendezvous())
    HOST.group = dist.new_group(backend="gloo", timeout=limit) if cuda else None
    os.makedirs(args.out, exist_ok=True)
    roles = sync_proof.Roles(args.placement)
    TRAINERS.group = dist.new_group(ranks=roles.trainers, backend="gloo", timeout=limit)
    log(f"torch {torch.__version__}, protobuf runtime {sync_proof.PROTOBUF}, device {device}, "
        f"trains {roles.trainer_rank is not None}, receiver {roles.receiver_rank}")
    groups = (f"trainer:{roles.trainer_rank}:{len(roles.trainers)}"
              if roles.trainer_rank is not None and not args.colocate else "")
    services = sync_proof.Services(args.run_dir, args.bin_dir, device, groups)
    client = wsync.Client(services.address, timeout=60) if RANK == 0 else None
    child = None
    if roles.receiver_rank is not None:
        child = Child(f"vllm-rank-{roles.receiver_rank}",
                      {"tp_rank": roles.receiver_rank,
                       "device": device.index if device.type == "cuda" else None})
    models = args.models.split(",")
    ok = True
    try:
        with open(os.path.join(args.out, "vllm_proof.jsonl"), "a") as out:
            for model in models:
                # Colocated, the trainer's memory stays mapped by the vLLM
                # rank's worker: a dead trainer process fails no sync there.
                kill = not args.no_kill and not args.colocate and model == models[-1]
                ok = run_model(args, roles, services, client, child, device, model, kill,
                               out) and ok
    finally:
        if child is not None:
            child.close()
        dist.barrier(group=HOST.group)
        services.close()
    ok = all(gathered(ok))
    dist.destroy_process_group()
    log("VLLM PROOF " + ("PASSED" if ok else "FAILED"))
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
