#!/usr/bin/env python3
"""Chaos test of wsync (issue 18 item 7), loopback only, bounded.

A real wsync-controller and four wsync-worker processes (host transport,
trainer:2 -> inference:2, every tensor resharded from dim 0 to dim 1) with
shared-memory owners in this process run `--syncs` syncs. Around a random
share of them one fault hits at a random moment: SIGKILL of a worker or of
the controller (restarted afterwards), or SIGSTOP of a worker or of the
controller (SIGCONT after a random pause). Every sync must

  * succeed with every destination byte equal to the source's version, or
  * fail within its deadline (+ --failure_grace + slack), naming the faulted
    worker when a worker was faulted, or
  * be cut by a controller kill (its id then answers "unknown after restart"
    or its saved outcome),

no wait may hang (each step bounded), and the last delivered version the
controller reports never goes backwards, across controller restarts too.
Prints a summary (counts by outcome, the slowest failure) and exits 1 on any
violation.

    python3 tests/chaos/chaos_sync.py --build build --syncs 40 --seed 1
"""
import argparse
import collections
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))

GROUPS = [("trainer", 0), ("trainer", 1), ("inference", 0), ("inference", 1)]
SHAPES = {"a": (512, 1024), "b": (128, 2048), "c": (2048, 256)}  # fp32, 6 MB in all
LEASE_TTL_S = 2.0
GRACE_S = 1.0
SLACK_S = 3.0  # scheduling on a loaded 2-core machine
SPILL_S = 25.0  # how long a worker fault may still fail later syncs (see below)


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--build", default=os.path.join(ROOT, "build"))
    p.add_argument("--syncs", type=int, default=40)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--fault_rate", type=float, default=0.35,
                   help="share of syncs with a fault injected")
    p.add_argument("--deadline", type=float, default=4.0, help="each sync's deadline, s")
    p.add_argument("--keep", action="store_true", help="keep the run directory")
    return p.parse_args()


class Proc:
    """A child process with its log; restartable."""

    def __init__(self, name, argv, log):
        self.name, self.argv, self.log = name, argv, log
        self.p = None
        self.stopped = False

    def start(self):
        with open(self.log, "ab") as out:
            self.p = subprocess.Popen(self.argv, stdout=out, stderr=subprocess.STDOUT,
                                      start_new_session=True)
        self.stopped = False

    def signal(self, sig):
        if self.p is not None and self.p.poll() is None:
            os.kill(self.p.pid, sig)
        self.stopped = sig == signal.SIGSTOP

    def kill(self):
        if self.p is not None and self.p.poll() is None:
            self.p.kill()
            self.p.wait(timeout=10)

    def stop(self):
        """SIGTERM, then SIGKILL after 5 s; True when it ended by itself."""
        if self.p is None or self.p.poll() is not None:
            return True
        os.kill(self.p.pid, signal.SIGCONT)
        self.p.terminate()
        try:
            self.p.wait(timeout=5)
            return True
        except subprocess.TimeoutExpired:
            self.p.kill()
            self.p.wait(timeout=10)
            return False


def wait_port_file(path, key, proc, timeout=20.0):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if os.path.exists(path):
            for line in open(path).read().split():
                if line.startswith(key + "="):
                    return line.split("=", 1)[1]
        if proc.p.poll() is not None:
            raise RuntimeError(f"{proc.name} exited: {open(proc.log).read()[-2000:]}")
        time.sleep(0.02)
    raise RuntimeError(f"{path}: no {key} after {timeout} s")


class Cluster:
    """The controller (restartable on its port) and one worker per rank."""

    def __init__(self, build, run_dir, controller_flags=()):
        self.dir = run_dir
        self.build = build
        self.controller_flags = list(controller_flags)
        self.port = 0
        self.ctl = None
        self.workers = {}
        self.start_controller()
        for g, r in GROUPS:
            self.workers[(g, r)] = self._worker(g, r)
            self.workers[(g, r)].start()
            wait_port_file(self._ports(g, r), "local_socket", self.workers[(g, r)])

    def _ports(self, g, r):
        return os.path.join(self.dir, f"{g}{r}.ports")

    def socket(self, g, r):
        return os.path.join(self.dir, f"{g}{r}.sock")

    def start_controller(self):
        pf = os.path.join(self.dir, "controller.ports")
        if os.path.exists(pf):
            os.unlink(pf)
        self.ctl = Proc("controller", [
            os.path.join(self.build, "controller", "server", "wsync-controller"),
            f"--listen=127.0.0.1:{self.port}", "--insecure", "--metrics_port=-1",
            f"--port_file={pf}", f"--lease_ttl={LEASE_TTL_S}s", *self.controller_flags],
            os.path.join(self.dir, "controller.log"))
        self.ctl.start()
        self.port = int(wait_port_file(pf, "grpc_port", self.ctl))

    def _worker(self, g, r):
        if os.path.exists(self._ports(g, r)):
            os.unlink(self._ports(g, r))
        return Proc(f"{g}/{r}", [
            os.path.join(self.build, "worker", "agent", "wsync-worker"),
            f"--controller=127.0.0.1:{self.port}", "--insecure", f"--groups={g}:{r}:2",
            f"--local_socket={self.socket(g, r)}", "--metrics_port=-1",
            f"--port_file={self._ports(g, r)}", "--node=n0", "--round_timeout=30s"],
            os.path.join(self.dir, f"{g}{r}.log"))

    def restart_worker(self, g, r):
        self.workers[(g, r)].kill()
        w = self._worker(g, r)
        w.start()
        wait_port_file(self._ports(g, r), "local_socket", w)
        self.workers[(g, r)] = w

    def close(self):
        hung = [w.name for w in self.workers.values() if not w.stop()]
        if not self.ctl.stop():
            hung.append("controller")
        return hung


def spec_proto(lpb):
    spec = lpb.TransferSpec()
    for name, shape in SHAPES.items():
        for side, dim in ((spec.source, 0), (spec.destination, 1)):
            t = side.tensors.add(name=name, dtype=lpb.FP32, shape=list(shape))
            t.mesh.mesh_shape.append(2)
            t.mesh.ranks.extend([0, 1])
            t.mesh.placements.add().shard.dim = dim
    return spec


def full_tensor(torch, name, version):
    shape = SHAPES[name]
    n = shape[0] * shape[1]
    base = torch.arange(n, dtype=torch.float32) + {"a": 0, "b": 1e5, "c": 2e5}[name]
    return (base + version * 1000.0).reshape(shape)  # exact in fp32 up to 2^24


class Owners:
    """The ranks' tensors in shared memory, registered with their workers."""

    def __init__(self, cluster, torch, wtorch):
        self.torch, self.wtorch, self.cluster = torch, wtorch, cluster
        self.regs = {}
        for g, r in GROUPS:
            tensors = {}
            for name, (rows, cols) in SHAPES.items():
                shape = (rows // 2, cols) if g == "trainer" else (rows, cols // 2)
                tensors[name] = torch.zeros(shape, dtype=torch.float32)
            self.regs[(g, r)] = wtorch.register(tensors, group=g, rank=r,
                                                socket=cluster.socket(g, r), timeout=20)

    def reregister(self, g, r):
        self.regs[(g, r)].send(replace=True)

    def fill(self, version):
        for r in range(2):
            for name, t in self.regs[("trainer", r)].tensors.items():
                full = full_tensor(self.torch, name, version)
                t.copy_(full.chunk(2, dim=0)[r])
            for t in self.regs[("inference", r)].tensors.values():
                t.fill_(-1.0)

    def wrong_bytes(self, version):
        """Destination elements that differ from `version`'s."""
        wrong = 0
        for r in range(2):
            for name, t in self.regs[("inference", r)].tensors.items():
                want = full_tensor(self.torch, name, version).chunk(2, dim=1)[r]
                wrong += int((t != want).sum())
        return wrong


class Fault:
    """One fault at a random moment of a sync, on a background thread."""

    def __init__(self, cluster, rng, deadline):
        self.cluster = cluster
        kinds = ["kill_worker"] * 4 + ["stop_worker"] * 4 + ["kill_controller", "stop_controller"]
        self.kind = rng.choice(kinds)
        self.target = rng.choice(GROUPS) if self.kind.endswith("worker") else None
        # Negative: before the sync starts (it then starts against it).
        self.delay = rng.uniform(-0.05, 0.15)
        # A stopped worker: shorter than the lease, longer than the deadline,
        # or in between (lease expiry). The controller: below the lease, so
        # that its own stall does not expire every lease at once.
        self.pause = rng.choice([0.3, LEASE_TTL_S * 1.5, deadline + 1.0]) \
            if self.kind == "stop_worker" else rng.uniform(0.2, LEASE_TTL_S * 0.5)
        self.applied = threading.Event()
        self.resumed = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def start(self):
        self.thread.start()

    def proc(self):
        return self.cluster.ctl if self.target is None else self.cluster.workers[self.target]

    def _run(self):
        time.sleep(max(0.0, self.delay))
        p = self.proc()
        if self.kind.startswith("kill"):
            p.kill()
            self.applied.set()
            self.resumed.set()
            return
        p.signal(signal.SIGSTOP)
        self.applied.set()
        time.sleep(self.pause)
        p.signal(signal.SIGCONT)
        self.resumed.set()

    def join(self):
        if self.thread.ident is None:
            return  # never started: the sync was refused before its fault
        self.resumed.wait(timeout=60)
        self.thread.join(timeout=5)
        if self.thread.is_alive():
            raise RuntimeError(f"fault thread {self.kind} hung")


def stale_leases(client, cluster):
    """Ranks whose live lease belongs to another process than the one the
    cluster runs now (a killed worker the controller has not noticed yet)."""
    stale = []
    for w in client.workers():
        for m in w.memberships:
            proc = cluster.workers.get((m.group, m.rank))
            if w.alive and proc is not None and proc.p is not None and w.pid != proc.p.pid:
                stale.append(f"{m.group}/{m.rank} (pid {w.pid}, running {proc.p.pid})")
    return stale


def recovered(client, wsync, cluster, timeout=30.0):
    """Waits for every worker, each rank leased by the process running it now
    (the first calls after a controller restart may find the old connection
    closed); returns the transfer's status."""
    end = time.monotonic() + timeout
    while True:
        try:
            client.wait_for_workers({"trainer": 2, "inference": 2}, timeout=timeout,
                                    buffers=True)
            stale = stale_leases(client, cluster)
            if not stale:
                return client.transfer_status("chaos")
            if time.monotonic() > end:
                raise wsync.errors.DeadlineExceeded(
                    f"leases of killed workers still live after {timeout} s: {stale}")
        except wsync.errors.Unavailable:
            if time.monotonic() > end:
                raise
        time.sleep(0.05)


def cut_sync_outcome(client, handle, wsync, pb):
    """What the restarted controller says about a sync cut by its kill: its
    saved outcome, or NOT_FOUND naming the earlier instance."""
    end = time.monotonic() + 20
    while True:
        try:
            st = handle.poll()
            if st.phase == pb.SYNC_RUNNING:
                return "CUT_SYNC_STILL_RUNNING", handle.sync_id
            return "cut_by_controller_kill_outcome_kept", ""
        except wsync.errors.NotFound as e:
            if "earlier controller instance" in str(e):
                return "cut_by_controller_kill_unknown", ""
            return "BAD_UNKNOWN_SYNC_MESSAGE", str(e)
        except wsync.errors.Unavailable:
            if time.monotonic() > end:
                return "CONTROLLER_DID_NOT_COME_BACK", ""
            time.sleep(0.1)


def main():
    args = parse_args()
    sys.path[:0] = [os.path.join(ROOT, "python"), os.path.join(args.build, "python")]
    import torch
    import wsync
    import wsync.torch as wtorch
    from wsync._proto import controller_pb2 as pb, layout_pb2 as lpb

    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # runs the cleanup below
    rng = random.Random(args.seed)
    run_dir = tempfile.mkdtemp(prefix="wsync-chaos-")
    cluster = Cluster(args.build, run_dir, [
        f"--state_file={os.path.join(run_dir, 'controller.state')}",
        f"--failure_grace={GRACE_S}s"])
    try:
        return run(args, rng, run_dir, cluster, torch, wsync, wtorch, pb, lpb)
    finally:
        cluster.close()  # also when interrupted: no process outlives the test


def run(args, rng, run_dir, cluster, torch, wsync, wtorch, pb, lpb):
    owners = Owners(cluster, torch, wtorch)
    client = wsync.Client(f"127.0.0.1:{cluster.port}", timeout=10)
    client.wait_for_workers({"trainer": 2, "inference": 2}, timeout=30, buffers=True)
    client.define_transfer("chaos", spec_proto(lpb), source_group="trainer",
                           destination_group="inference")

    counts = collections.Counter()
    faults = collections.Counter()
    spill_until = 0.0
    last_target = None
    spillover = []  # failures within SPILL_S of a worker fault, listed apart
    ok_times = []
    violations = []
    max_fail_s = 0.0
    delivered = 0  # highest version the controller confirmed
    t0 = time.monotonic()
    for version in range(1, args.syncs + 1):
        owners.fill(version)
        fault = Fault(cluster, rng, args.deadline) if rng.random() < args.fault_rate else None
        start = time.monotonic()
        outcome, detail = None, ""
        if fault and fault.delay < 0:
            fault.start()
            fault.applied.wait(timeout=10)
        try:
            handle = None
            handle = client.sync(version, deadline=args.deadline)
            if fault and fault.delay >= 0:
                fault.start()
            handle.wait(timeout=args.deadline + GRACE_S + SLACK_S + 10)
            wrong = owners.wrong_bytes(version)
            outcome = "succeeded" if wrong == 0 else "BAD_BYTES"
            ok_times.append(time.monotonic() - start)
            detail = f"{wrong} wrong elements"
            if fault:
                fault.join()
        except wsync.errors.SyncFailed as e:
            took = time.monotonic() - start
            max_fail_s = max(max_fail_s, took)
            if fault:
                fault.join()
            named = (e.group, e.rank)
            if took > args.deadline + GRACE_S + SLACK_S:
                outcome, detail = "LATE_FAILURE", f"{took:.1f} s: {e}"
            elif fault is None and time.monotonic() < spill_until:
                # A restarted worker's first assignment may meet its
                # predecessor's closed stream. (Before gloo_mesh.h, a worker
                # could also still be inside an aborted sync's Gloo connect:
                # 20 s on a 4 s deadline.)
                outcome = "failed_after_previous_fault"
                spillover.append(f"v{version}: {e}")
            elif fault is None:
                outcome, detail = "UNEXPLAINED_FAILURE", str(e)
            elif fault.target is None:
                outcome = "failed_controller_fault"
            elif named == fault.target:
                outcome = "failed_named_right"
            else:
                outcome, detail = "WRONG_BLAME", f"{fault.kind} {fault.target}: {e}"
        except wsync.WsyncError as e:
            if fault:
                fault.join()
            target = fault.target if fault and fault.target else last_target
            g, r = target if target else ("", -1)
            if handle is None and target is not None \
                    and (fault is not None or time.monotonic() < spill_until) \
                    and (f"{g}' rank {r}" in str(e) or f"{g}/{r}" in str(e)):
                # The faulted worker was already gone (killed, or its lease
                # expired while stopped, possibly just after the last check).
                outcome = "refused_at_start_naming_it"
            elif fault is None or fault.target is not None:
                outcome, detail = "CONTROLLER_ERROR", f"{type(e).__name__}: {e}"
            elif handle is None:
                outcome = "refused_at_start_controller_faulted"
            else:
                outcome = "cut_by_controller_fault"
        # Recovery: restart what was killed, wait for every worker.
        if fault and fault.target is not None:
            spill_until = time.monotonic() + SPILL_S
            last_target = fault.target
        if fault:
            faults[fault.kind] += 1
        if fault and fault.kind == "kill_controller":
            cluster.start_controller()
            if outcome == "cut_by_controller_fault" and handle is not None:
                outcome, detail = cut_sync_outcome(client, handle, wsync, pb)
        if fault and fault.kind == "kill_worker":
            cluster.restart_worker(*fault.target)
            owners.reregister(*fault.target)
        for key, w in cluster.workers.items():
            if w.p.poll() is not None:  # not killed by a fault: it crashed
                violations.append(f"v{version}: worker {w.name} exited by itself "
                                  f"({w.p.returncode}); log: {w.log}")
                cluster.restart_worker(*key)
                owners.reregister(*key)
        try:
            st = recovered(client, wsync, cluster)
        except wsync.WsyncError as e:
            violations.append(f"v{version}: cluster did not recover: {e}")
            break
        if st.last_success_version < delivered:
            violations.append(f"v{version}: last delivered version went back from {delivered} "
                              f"to {st.last_success_version}")
        delivered = max(delivered, st.last_success_version)
        if outcome == "succeeded" and st.last_success_version != version:
            violations.append(f"v{version}: succeeded but the controller says "
                              f"{st.last_success_version}")
        counts[outcome] += 1
        if outcome.isupper():
            violations.append(f"v{version}: {outcome}: {detail}")
        if version % 50 == 0:
            print(f"  {version} syncs, {time.monotonic() - t0:.0f} s: {dict(counts)}", flush=True)

    hung = cluster.close()
    if hung:
        violations.append(f"did not exit on SIGTERM within 5 s: {hung}")
    total = time.monotonic() - t0
    print(f"chaos: {sum(counts.values())} syncs in {total:.0f} s (seed {args.seed}), "
          f"last delivered version {delivered}")
    for k, v in sorted(counts.items()):
        print(f"  {k:28s} {v}")
    print(f"  faults injected: {dict(sorted(faults.items()))}")
    if ok_times:
        ok_times.sort()
        print(f"  successful sync (start to verified): median {ok_times[len(ok_times) // 2]:.3f} s,"
              f" max {ok_times[-1]:.3f} s")
    print(f"  slowest failure: {max_fail_s:.2f} s (deadline {args.deadline} s + grace {GRACE_S} s)")
    print(f"  failures within {SPILL_S:.0f} s after a worker fault, without one: "
          f"{len(spillover)}")
    for v in spillover:
        print("    ", v[:300])
    for v in violations:
        print("VIOLATION", v)
    if violations:
        print(f"run directory kept: {run_dir}")
        return 1
    if not args.keep:
        shutil.rmtree(run_dir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
