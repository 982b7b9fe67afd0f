#!/usr/bin/env python3
"""Staged syncs under faults (issue 20), loopback only, bounded.

The cluster of chaos_sync.py (a real wsync-controller, wsync-worker processes
trainer:2 -> inference:2 over the host transport, shared-memory owners in this
process) with the transfer defined `staging=host_shadow, checksums=True`.
The owner side checks the invariant of docs/staging.md from outside: the
inference group is one replica (TP 2); an owner thread samples both ranks'
live tensors all the time and classifies every tensor by the version whose
bytes it holds (owner-side checksums). Outside a commit window (the replica's
first COMMIT event up to every rank's COMMITTED / FINISHED) the replica must
be entirely on one version: every tensor of every rank the same version.

Two scenarios:

  --scenario receiver_kill: sync V-1, then sync V with inference/1 stopped
      (SIGSTOP) so that the pool cannot decide; inference/0 stages (its
      STAGED event), is killed, the sync fails naming it, every replica
      still holds V-1; then inference/0 restarts and V succeeds.
  --scenario chaos (default): --syncs staged syncs; around a random share of
      them one SIGKILL at a random moment, of a sender, a receiver or the
      controller (restarted afterwards). Each sync ends succeeded (all bytes
      V), failed (all bytes still the last committed version), resumed by the
      restarted controller when its commit was decided before the kill (all
      bytes V), or cut by the controller's kill before the decision (all
      bytes the last committed version); the sampler's invariant holds
      throughout, a replica's commit window lasting from its first rank's
      COMMIT to every rank's COMMITTED (docs/staging.md).

    python3 tests/chaos/chaos_staged.py --build build --syncs 200 --seed 1
"""
import argparse
import collections
import os
import random
import signal
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import chaos_sync as cs  # noqa: E402  (the cluster and the spec)

# Also what rolling_waves.py and staged_commit_crash.py use as chaos_staged.*.
from staged_helpers import (RANKS, Versions, define, fill_sources,  # noqa: E402,F401
                            replica_versions, report, resumed_outcome, setup,
                            status_after_restart)

SENDERS = [("trainer", 0), ("trainer", 1)]


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--build", default=os.path.join(cs.ROOT, "build"))
    p.add_argument("--scenario", choices=["chaos", "receiver_kill"], default="chaos")
    p.add_argument("--syncs", type=int, default=200)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--fault_rate", type=float, default=0.25)
    p.add_argument("--deadline", type=float, default=4.0, help="each sync's deadline, s")
    p.add_argument("--staging", default="host_shadow",
                   help="the transfer's staging mode (in_place shows what staging prevents)")
    p.add_argument("--checksums", type=int, default=1, help="per-bucket checksums (0: off)")
    p.add_argument("--budget", type=float, default=170.0,
                   help="stop starting syncs after this many seconds (bounded run)")
    return p.parse_args()


class Sampler:
    """Owner-side monitor of the replica (both inference ranks): samples the
    live tensors and follows each rank's SyncEvents."""

    def __init__(self, cluster, regs, versions, wtorch):
        self.cluster, self.regs, self.versions, self.wtorch = cluster, regs, versions, wtorch
        self.lock = threading.Lock()
        self.open = {}          # rank -> sync id between COMMIT and its end
        # Sync id -> ranks yet to end it, from the replica's first COMMIT (an
        # engine over several ranks pauses until every rank COMMITTED).
        self.pending = {}
        self.last_commit = 0.0  # monotonic time of the latest COMMIT event
        self.committed = {r: 0 for r in RANKS}  # last COMMITTED version per rank
        self.unsafe = set()     # ranks whose commit was cut (worker died): serve nothing
        # rank -> sync id between its STAGED and its outcome: an owner whose
        # worker dies then cannot tell whether the pool committed, so it
        # serves nothing until its next COMMITTED (docs/staging.md, "The
        # owner's view"); the controller may list it uncommitted only after
        # the sync's deadline plus the worker's --decision_slack.
        self.staged_open = {}
        self.events = collections.Counter()
        self.samples = 0
        self.mixed_excused = 0
        self.violations = []
        self.candidates = [0]
        self.stop = threading.Event()
        self.staged_versions = set()  # versions a rank reported STAGED for
        self.staged_cv = threading.Condition(self.lock)
        self.threads = [threading.Thread(target=self._sample, daemon=True)]
        for r in RANKS:
            self.threads.append(threading.Thread(target=self._follow, args=(r,), daemon=True))

    def start(self):
        for t in self.threads:
            t.start()

    def _follow(self, rank):
        lpb = self.wtorch.lpb
        while not self.stop.is_set():
            try:
                for ev in self.wtorch.sync_events(self.cluster.socket(*rank), timeout=2.0):
                    kind = lpb.SyncEvent.Kind.Name(ev.kind)
                    with self.lock:
                        self.events[kind] += 1
                        if ev.kind == lpb.SyncEvent.STAGED:
                            self.staged_open[rank] = ev.sync_id
                            self.staged_versions.add(ev.version)
                            self.staged_cv.notify_all()
                        if ev.kind == lpb.SyncEvent.COMMIT:
                            self.open[rank] = ev.sync_id
                            self.pending.setdefault(ev.sync_id, set(RANKS))
                            self.last_commit = time.monotonic()
                        elif ev.kind == lpb.SyncEvent.COMMITTED:
                            self.staged_open.pop(rank, None)
                            self.open.pop(rank, None)
                            self._ended(rank, ev.sync_id)
                            self.committed[rank] = ev.version
                            self.unsafe.discard(rank)
                        elif ev.kind == lpb.SyncEvent.FINISHED:
                            if self.staged_open.get(rank) == ev.sync_id:
                                self.staged_open.pop(rank, None)
                            self._ended(rank, ev.sync_id)
                            if self.open.get(rank) == ev.sync_id:
                                self.open.pop(rank, None)
                                if not ev.ok:
                                    self.unsafe.add(rank)  # its commit failed midway
                    if self.stop.is_set():
                        return
            except Exception:  # the worker is being restarted, or the deadline
                time.sleep(0.02)

    def _ended(self, rank, sync_id):
        if sync_id in self.pending:
            self.pending[sync_id].discard(rank)
            if not self.pending[sync_id]:
                del self.pending[sync_id]

    def worker_killed(self, rank, mid_sync=False):
        with self.lock:
            for sync_id in list(self.pending):
                self._ended(rank, sync_id)
            # Died between STAGED and its outcome, or during a staged sync at
            # all. The worker reports `staged` only once each subscriber read
            # STAGED (session 17, --staged_flush_timeout), but for a
            # SyncEvents stream "read" means the worker's stream wrote it to
            # gRPC: this checker, a separate process, may not have processed
            # it when the worker dies. So the stricter rule stays here: an
            # owner over a stream that lost its worker mid-sync serves nothing
            # until its next COMMITTED (docs/staging.md, "The owner's view").
            # An embedded owner (the vLLM receiver) pops the event in its own
            # process, so keying on STAGED is exact there.
            if self.staged_open.pop(rank, None) is not None or mid_sync:
                self.unsafe.add(rank)
            if rank in self.open:  # died mid-commit: its bytes are mixed
                self.open.pop(rank, None)
                self.unsafe.add(rank)

    def _classify(self):
        out = {}
        for rank in RANKS:
            reg = self.regs[rank]
            vs = set()
            for name, t in reg.tensors.items():
                snap = t.clone()
                vs.add(self.versions.version_of(snap, name, rank[1], self.candidates))
            out[rank] = vs
        return out

    def _sample(self):
        while not self.stop.is_set():
            with self.lock:
                was_open = bool(self.open) or bool(self.pending) or bool(self.unsafe)
            start = time.monotonic()
            seen = self._classify()
            self.samples += 1
            versions = set().union(*seen.values())
            if len(versions) == 1 and None not in versions:
                continue
            # Mixed: allowed only inside a commit window (or on a rank whose
            # commit was cut). Events may trail the copy: a COMMIT heard up
            # to a second after the sample also explains it.
            time.sleep(1.0)
            with self.lock:
                excused = was_open or bool(self.open) or bool(self.pending) \
                    or bool(self.unsafe) \
                    or self.last_commit >= start - 0.001
            if excused:
                self.mixed_excused += 1
            else:
                self.violations.append(f"replica mixed outside a commit window: {seen}")


def receiver_kill(args, cluster, owners, client, torch, wsync, wtorch, pb, lpb):
    """Returns a list of violations."""
    regs, versions = owners.regs, Versions(torch)
    bad = []
    fill_sources(regs, torch, 1)
    client.sync(1, deadline=args.deadline).wait(timeout=30)
    got = replica_versions(regs, versions, [0, 1])
    if got != {r: {1} for r in RANKS}:
        return [f"v1 did not arrive whole: {got}"]
    fill_sources(regs, torch, 2)
    staged = threading.Event()

    def watch():
        for ev in wtorch.sync_events(cluster.socket("inference", 0), timeout=20):
            if ev.kind == wtorch.lpb.SyncEvent.STAGED and ev.version == 2:
                staged.set()
                return

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    time.sleep(0.2)  # the subscription is open
    cluster.workers[("inference", 1)].signal(signal.SIGSTOP)  # no decision possible
    handle = client.sync(2, deadline=args.deadline)
    if not staged.wait(timeout=15):
        bad.append("inference/0 never reported STAGED for v2")
    cluster.workers[("inference", 0)].kill()  # staged, not committed
    cluster.workers[("inference", 1)].signal(signal.SIGCONT)
    try:
        handle.wait(timeout=30)
        bad.append("v2 succeeded although a receiver died before the commit")
    except wsync.errors.SyncFailed as e:
        if (e.group, e.rank) != ("inference", 0):
            bad.append(f"v2 failed naming {e.group}/{e.rank}, not inference/0: {e}")
        print(f"  v2 failed as it must: {str(e)[:200]}")
    got = replica_versions(regs, versions, [0, 1, 2])
    print(f"  after the failed v2, by rank: {got}")
    if got != {r: {1} for r in RANKS}:
        bad.append(f"a replica left version 1 after the failed staged sync: {got}")
    cluster.restart_worker("inference", 0)
    owners.reregister("inference", 0)
    cs.recovered(client, wsync, cluster)
    st = client.sync(2, deadline=args.deadline * 2).wait(timeout=30)
    got = replica_versions(regs, versions, [0, 1, 2])
    print(f"  retried v2: {pb.SyncPhase.Name(st.phase)}, by rank: {got}, "
          f"max commit {st.max_commit_seconds * 1e3:.2f} ms, "
          f"{st.buckets_verified} buckets verified")
    if got != {r: {2} for r in RANKS}:
        bad.append(f"the retried v2 did not arrive whole: {got}")
    return bad


def chaos(args, cluster, owners, client, torch, wsync, wtorch, pb, lpb):
    rng = random.Random(args.seed)
    regs, versions = owners.regs, Versions(torch)
    sampler = Sampler(cluster, regs, versions, wtorch)
    sampler.start()
    counts, faults, bad = collections.Counter(), collections.Counter(), []
    committed = 0  # the version the replica holds (last succeeded sync)
    commit_ms, sync_ms = [], []
    t0 = time.monotonic()
    version = 0
    try:
        for _ in range(args.syncs):
            if time.monotonic() - t0 > args.budget:
                bad.append(f"time budget of {args.budget} s spent after {version} syncs")
                break
            version += 1
            with sampler.lock:
                sampler.pending.clear()  # every earlier sync ended (see below)
            sampler.candidates = [committed, version] if committed else [0, version]
            fill_sources(regs, torch, version)
            kind = target = None
            if rng.random() < args.fault_rate:
                kind = rng.choice(["sender", "receiver", "controller"])
                target = rng.choice(SENDERS if kind == "sender" else RANKS) \
                    if kind != "controller" else None
            # A random moment of a ~20 ms sync, or right when a receiver
            # staged (between the phases: the pool's decision pending or
            # just taken).
            delay = rng.uniform(0.0, 0.03)
            at_staged = rng.random() < 0.4
            start = time.monotonic()
            handle, outcome, uncommitted = None, None, set()
            timer = None
            if kind:
                proc = cluster.ctl if target is None else cluster.workers[target]

                def fire(proc=proc, target=target, v=version, at_staged=at_staged):
                    if at_staged:
                        with sampler.lock:
                            sampler.staged_cv.wait_for(lambda: v in sampler.staged_versions,
                                                       timeout=args.deadline)
                    proc.kill()
                    if target in RANKS:
                        sampler.worker_killed(target, mid_sync=True)
                timer = threading.Timer(0.0 if at_staged else delay, fire)
            try:
                handle = client.sync(version, deadline=args.deadline)
                if timer:
                    timer.start()
                st = handle.wait(timeout=args.deadline + 10)
                outcome = "succeeded"
                commit_ms.append(st.max_commit_seconds * 1e3)
                sync_ms.append((time.monotonic() - start) * 1e3)
                if st.uncommitted:
                    # Lost after the pool decided: serves nothing until it
                    # commits a version again (docs/staging.md).
                    outcome = "succeeded_with_uncommitted"
                    uncommitted = {r for r in RANKS for u in st.uncommitted
                                   if f"{r[0]}/{r[1]} " in u}
                    with sampler.lock:
                        sampler.unsafe |= uncommitted
            except wsync.errors.SyncFailed:
                outcome = "failed"
            except wsync.WsyncError:
                outcome = "cut_or_refused"
            if timer:
                timer.join()
                if not timer.finished.is_set():
                    timer.cancel()
            if kind:
                faults[kind] += 1
                if kind == "controller" and cluster.ctl.p.poll() is not None:
                    cluster.start_controller()
                for key, w in cluster.workers.items():
                    if w.p.poll() is not None:
                        cluster.restart_worker(*key)
                        owners.reregister(*key)
            try:
                st = cs.recovered(client, wsync, cluster)
                if kind == "controller" and outcome not in ("succeeded", "failed"):
                    # A decision saved before the kill: the restarted
                    # controller resumes the commit (docs/staging.md).
                    outcome, resumed = resumed_outcome(handle, args, wsync, pb)
                    if resumed is not None and resumed.uncommitted:
                        with sampler.lock:
                            sampler.unsafe |= {r for r in RANKS for u in resumed.uncommitted
                                               if f"{r[0]}/{r[1]} " in u}
                    st = client.transfer_status("chaos")
            except wsync.WsyncError as e:
                bad.append(f"v{version}: cluster did not recover: {e}")
                break
            # Settle: a receiver may still be finishing (rolling back).
            time.sleep(0.05)
            delivered = st.last_success_version
            if outcome == "succeeded" and delivered != version:
                bad.append(f"v{version}: succeeded, controller says {delivered}")
            want = {version} if delivered == version else {committed}
            if kind == "controller" and outcome not in ("succeeded", "resumed_after_restart"):
                # Cut by the controller's kill: its outcome died with it.
                # Committed everywhere or rolled back everywhere, never mixed
                # (the controller then reports the older version).
                want = {committed, version}
            got = replica_versions(regs, versions, sorted({0, committed, version}))
            with sampler.lock:
                # Serving nothing: cut mid-commit, or lost after the decision
                # (until their next COMMITTED).
                unsafe = set(sampler.unsafe)
            held = set()
            for rank in RANKS:
                if rank in unsafe:
                    continue  # its commit was cut: it serves nothing until re-synced
                if len(got[rank]) != 1 or not got[rank] <= want:
                    bad.append(f"v{version} ({outcome}, fault {kind} {target}): {rank} holds "
                               f"{got[rank]}, expected one of {want}")
                held |= got[rank]
            if len(held) > 1:
                bad.append(f"v{version} ({outcome}, fault {kind} {target}): ranks of the "
                           f"replica hold different versions {got}")
            if delivered == version or held == {version}:
                committed = version
            counts[outcome] += 1
            if version % 50 == 0:
                print(f"  {version} syncs, {time.monotonic() - t0:.0f} s: {dict(counts)}",
                      flush=True)
            if bad:
                break
    finally:
        sampler.stop.set()
        time.sleep(0.3)
    bad.extend(sampler.violations)
    total = time.monotonic() - t0
    print(f"chaos_staged: {version} staged syncs in {total:.0f} s (seed {args.seed}), "
          f"committed version {committed}")
    for k, v in sorted(counts.items()):
        print(f"  {k:28s} {v}")
    print(f"  faults: {dict(faults)}; owner samples {sampler.samples}, "
          f"mixed inside commit windows {sampler.mixed_excused}; events {dict(sampler.events)}")
    if commit_ms:
        commit_ms.sort()
        sync_ms.sort()
        print(f"  commit (receiver pause) median {commit_ms[len(commit_ms) // 2]:.2f} ms, "
              f"max {commit_ms[-1]:.2f} ms; sync median {sync_ms[len(sync_ms) // 2]:.1f} ms")
    return bad


def main():
    args = parse_args()
    torch, wsync, wtorch, pb, lpb = setup(args)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    run_dir = tempfile.mkdtemp(prefix="wsync-staged-")
    cluster = cs.Cluster(args.build, run_dir, [
        f"--state_file={os.path.join(run_dir, 'controller.state')}",
        f"--failure_grace={cs.GRACE_S}s"])
    try:
        owners = cs.Owners(cluster, torch, wtorch)
        client = wsync.Client(f"127.0.0.1:{cluster.port}", timeout=10)
        client.wait_for_workers({"trainer": 2, "inference": 2}, timeout=30, buffers=True)
        define(client, lpb, args.staging, bool(args.checksums))
        print("  shadow bytes by receiver: " + ", ".join(
            f"{w.group}/{w.rank} {w.shadow_bytes}" for w in client.plan("chaos").shadow))
        run = receiver_kill if args.scenario == "receiver_kill" else chaos
        bad = run(args, cluster, owners, client, torch, wsync, wtorch, pb, lpb)
    finally:
        hung = cluster.close()
    return report(bad, hung, run_dir, args.scenario)


if __name__ == "__main__":
    sys.exit(main())
