#!/usr/bin/env python3
"""Rolling waves (issue 20 item 4, docs/staging-rollout.md "Rolling waves"),
loopback only, bounded.

A real wsync-controller and wsync-worker processes over the host transport:
trainer:1 -> inference:4, every inference rank a whole model copy (a
replicated layout, `replica_ranks=1`: four replicas), staged in host shadows
with checksums, rollout `max_unavailable=U`. Owners in this process hold the
tensors in shared memory and check from outside:

  * at every instant (ordered by the events' own clock, SyncEvent.unix_us,
    one host) at most U replicas are between COMMIT and COMMITTED;
  * a sampler thread classifies each replica's live tensors by the version
    whose bytes they hold: outside its own commit window a replica is
    entirely on one version (never mixed weights);
  * while waves run, the status the trainer watches (WatchSync) reports per
    replica which version it serves (some on V, the others still waiting on
    V-1) and the waves' progress;
  * every replica ends on V; GetStatus (replica_versions), ListWorkers
    (serving_versions) and replicas_on(V) say so.

Then the controller is killed mid-rollout (its test-only failpoint
--test_crash_after_commits=1, WSYNC_TEST_FAILPOINTS=1: after the first
replica confirmed) and restarted on its state file: the remaining waves
resume one at a time (U=1), no replica rolls back, every replica ends on V.

    python3 tests/chaos/rolling_waves.py --build build --syncs 6
"""
import argparse
import collections
import os
import signal
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import chaos_staged as st  # noqa: E402
import chaos_sync as cs  # noqa: E402

REPLICAS = 4
GROUPS = [("trainer", 0)] + [("inference", r) for r in range(REPLICAS)]
SHAPES = {"a": (512, 1024), "b": (256, 1024)}  # fp32, 3 MiB per replica
DEADLINE_S = 20.0


class Cluster(cs.Cluster):
    """chaos_sync's cluster with trainer:1 and inference:REPLICAS."""

    def __init__(self, build, run_dir, controller_flags=()):
        self.dir, self.build = run_dir, build
        self.controller_flags = list(controller_flags)
        self.port, self.ctl, self.workers = 0, None, {}
        self.start_controller()
        for g, r in GROUPS:
            self.workers[(g, r)] = self._worker(g, r)
            self.workers[(g, r)].start()
            cs.wait_port_file(self._ports(g, r), "local_socket", self.workers[(g, r)])

    def _worker(self, g, r):
        if os.path.exists(self._ports(g, r)):
            os.unlink(self._ports(g, r))
        size = 1 if g == "trainer" else REPLICAS
        return cs.Proc(f"{g}/{r}", [
            os.path.join(self.build, "worker", "agent", "wsync-worker"),
            f"--controller=127.0.0.1:{self.port}", "--insecure", f"--groups={g}:{r}:{size}",
            f"--local_socket={self.socket(g, r)}", "--metrics_port=-1",
            f"--port_file={self._ports(g, r)}", "--node=n0", "--round_timeout=30s"],
            os.path.join(self.dir, f"{g}{r}.log"))


def spec_proto(lpb):
    spec = lpb.TransferSpec()
    for name, shape in SHAPES.items():
        for side, n in ((spec.source, 1), (spec.destination, REPLICAS)):
            t = side.tensors.add(name=name, dtype=lpb.FP32, shape=list(shape))
            t.mesh.mesh_shape.append(n)
            t.mesh.ranks.extend(range(n))
            t.mesh.placements.add().replicate.SetInParent()
    spec.options.disable_relay = True  # every replica fed by the trainer
    return spec


_EXPECTED = {}


def full_tensor(torch, name, version):
    """Tensor `name` of weight `version` (cached: the sampler compares often)."""
    key = (name, version)
    if key not in _EXPECTED:
        if len(_EXPECTED) > 16:
            _EXPECTED.clear()
        rows, cols = SHAPES[name]
        base = torch.arange(rows * cols, dtype=torch.float32) + (0 if name == "a" else 1e6)
        _EXPECTED[key] = (base + version * 1000.0).reshape(rows, cols)  # exact below 2^24
    return _EXPECTED[key]


class Owners:
    """Each rank's tensors in shared memory, the inference ranks' events
    (kind, version, unix_us, sync id) and a sampler of their bytes."""

    def __init__(self, cluster, torch, wtorch):
        self.torch, self.wtorch, self.cluster = torch, wtorch, cluster
        self.regs = {}
        for g, r in GROUPS:
            tensors = {n: torch.zeros(s, dtype=torch.float32) for n, s in SHAPES.items()}
            self.regs[(g, r)] = wtorch.register(tensors, group=g, rank=r,
                                                socket=cluster.socket(g, r), timeout=20)
        self.lock = threading.Lock()
        self.events = {r: [] for r in range(REPLICAS)}
        self.open = set()  # replicas between COMMIT and their end, by arrival
        self.last_commit = 0.0
        self.candidates = [0]
        self.samples, self.mixed_excused, self.violations = 0, 0, []
        self.stop = threading.Event()
        for r in range(REPLICAS):
            threading.Thread(target=self._follow, args=(r,), daemon=True).start()
        threading.Thread(target=self._sample, daemon=True).start()
        time.sleep(0.3)  # subscribed before anything happens

    def fill(self, version):
        for name, t in self.regs[("trainer", 0)].tensors.items():
            t.copy_(full_tensor(self.torch, name, version))

    def _follow(self, r):
        K = self.wtorch.lpb.SyncEvent
        while not self.stop.is_set():
            try:
                # One long subscription: events published between two would be lost.
                for ev in self.wtorch.sync_events(self.cluster.socket("inference", r),
                                                  timeout=600.0):
                    with self.lock:
                        self.events[r].append((K.Kind.Name(ev.kind), ev.version, ev.unix_us,
                                               ev.sync_id))
                        if ev.kind == K.COMMIT:
                            self.open.add(r)
                            self.last_commit = time.monotonic()
                        elif ev.kind in (K.COMMITTED, K.FINISHED, K.ROLLED_BACK):
                            self.open.discard(r)
            except Exception:  # noqa: BLE001 (the stream's timeout; a restart)
                time.sleep(0.02)

    def version_of(self, r):
        """The versions held by replica r's tensors (None: no known one)."""
        out = set()
        for name, t in self.regs[("inference", r)].tensors.items():
            snap = t.clone()
            found = None
            for v in self.candidates:
                if self.torch.equal(snap, full_tensor(self.torch, name, v) if v else
                                    self.torch.zeros_like(snap)):
                    found = v
                    break
            out.add(found)
        return out

    def _sample(self):
        while not self.stop.is_set():
            time.sleep(0.002)  # leaves the (2-core) machine to the workers now and then
            for r in range(REPLICAS):
                with self.lock:
                    was_open = r in self.open
                start = time.monotonic()
                vs = self.version_of(r)
                self.samples += 1
                if len(vs) == 1 and None not in vs:
                    continue
                time.sleep(1.0)  # events may trail the copy they describe
                with self.lock:
                    excused = was_open or r in self.open or self.last_commit >= start - 0.001
                if excused:
                    self.mixed_excused += 1
                else:
                    self.violations.append(f"replica {r} mixed outside its commit window: {vs}")

    def windows(self, version):
        """Per replica its commit window (COMMIT, end) in worker clock µs."""
        out = {}
        with self.lock:
            for r, evs in self.events.items():
                start = [t for k, v, t, _ in evs if k == "COMMIT" and v == version]
                end = [t for k, v, t, _ in evs if k in ("COMMITTED", "FINISHED") and v == version]
                if start:
                    out[r] = (start[0], min([t for t in end if t >= start[0]], default=None))
        return out

    def kinds(self, r, version):
        with self.lock:
            return [k for k, v, _, _ in self.events[r] if v == version]


def max_overlap(windows):
    """The most windows open at one instant (an unended one stays open)."""
    points = []
    for start, end in windows.values():
        points.append((start, 1))
        points.append((end if end is not None else float("inf"), -1))
    points.sort(key=lambda p: (p[0], p[1]))  # an end before a start at the same µs
    most = now = 0
    for _, d in points:
        now += d
        most = max(most, now)
    return most


def check_version(owners, client, version, u, bad, label):
    by_replica = {r: owners.version_of(r) for r in range(REPLICAS)}
    if any(v != {version} for v in by_replica.values()):
        bad.append(f"{label}: replicas hold {by_replica}, expected all on {version}")
    wins = owners.windows(version)
    overlap = max_overlap(wins)
    if len(wins) != REPLICAS or any(e is None for _, e in wins.values()):
        bad.append(f"{label}: commit windows {wins}: not every replica committed once")
    if overlap > u:
        bad.append(f"{label}: {overlap} replicas committing at once, max_unavailable {u}: {wins}")
    for r in range(REPLICAS):
        if "ROLLED_BACK" in owners.kinds(r, version):
            bad.append(f"{label}: replica {r} rolled back")
    versions = [(x.replica, x.version, x.state) for x in client.replica_versions("waves")]
    if versions != [(f"ranks-{r}-{r}", version, "serving") for r in range(REPLICAS)]:
        bad.append(f"{label}: GetStatus replica versions {versions}")
    if len(client.replicas_on(version, "waves")) != REPLICAS:
        bad.append(f"{label}: replicas_on({version}) = {client.replicas_on(version, 'waves')}")
    served = sorted((v.rank, v.version) for w in client.workers("inference")
                    for v in w.serving_versions if v.transfer == "waves")
    if served != [(r, version) for r in range(REPLICAS)]:
        bad.append(f"{label}: ListWorkers serving_versions {served}")
    return overlap


def rolling(owners, client, wsync, pb, u, first, syncs):
    """`syncs` syncs from version `first` with max_unavailable `u`."""
    bad = []
    client.define_transfer("waves", spec_proto(owners.wtorch.layout_pb), source_group="trainer",
                           destination_group="inference", staging="host_shadow", checksums=True,
                           rollout={"max_unavailable": u, "replica_ranks": 1, "max_staleness": 1})
    mid_rollout = most_committing = 0
    for version in range(first, first + syncs):
        owners.candidates = [version - 1, version] if version > 1 else [0, 1]
        owners.fill(version)
        handle = client.sync(version, deadline=DEADLINE_S)
        for s in handle.watch(timeout=DEADLINE_S + 10):
            ro = s.rollout
            states = collections.Counter(x.state for x in ro.replicas)
            if 0 < ro.waves_done < ro.waves_total and states["committed"] and (
                    states["waiting"] or states["committing"]):
                mid_rollout += 1
                if any(x.state == "committed" and x.version != version for x in ro.replicas):
                    bad.append(f"v{version}: a committed replica reported {ro}")
            most_committing = max(most_committing, ro.committing)
            if ro.committing > u:
                bad.append(f"v{version}: status reports {ro.committing} committing, max {u}")
        status = handle.wait(timeout=DEADLINE_S + 10)
        if status.phase != pb.SYNC_SUCCEEDED or status.uncommitted:
            bad.append(f"v{version}: {pb.SyncPhase.Name(status.phase)} {status.error} "
                       f"{list(status.uncommitted)}")
        want_waves = -(-REPLICAS // u)
        if (status.rollout.waves_total, status.rollout.waves_done) != (want_waves, want_waves):
            bad.append(f"v{version}: waves {status.rollout.waves_done}/"
                       f"{status.rollout.waves_total}, expected {want_waves}")
        time.sleep(0.1)  # the last COMMITTED event trails the report a little
        overlap = check_version(owners, client, version, u, bad, f"v{version} U={u}")
        print(f"  v{version} U={u}: {status.rollout.waves_done} waves, at most {overlap} "
              f"committing at once, max commit {status.max_commit_seconds * 1e3:.2f} ms, "
              f"sync {status.elapsed_seconds * 1e3:.1f} ms", flush=True)
        if bad:
            break
    print(f"  U={u}: {mid_rollout} watched statuses mid-rollout, at most {most_committing} "
          f"replicas committing in the controller's status", flush=True)
    if not mid_rollout:
        bad.append(f"U={u}: no watched status showed a rollout in progress")
    if most_committing != u:
        bad.append(f"U={u}: the status never showed {u} replicas committing (at most "
                   f"{most_committing})")
    return bad


def ready(client, wsync):
    """Every worker registered with the controller running now (the first
    calls after a restart may find the old connection closed)."""
    end = time.monotonic() + 30
    while True:
        try:
            client.wait_for_workers({"trainer": 1, "inference": REPLICAS}, timeout=30,
                                    buffers=True)
            return
        except wsync.errors.Unavailable:
            if time.monotonic() > end:
                raise
            time.sleep(0.05)


def crash_mid_rollout(cluster, owners, client, wsync, pb, version):
    """The controller dies once the first wave confirmed; restarted, it
    resumes the remaining waves one at a time."""
    cluster.ctl.stop()
    cluster.controller_flags.append("--test_crash_after_commits=1")
    cluster.start_controller()
    ready(client, wsync)
    time.sleep(0.5)  # every worker re-registered with this instance
    client.define_transfer("waves", spec_proto(owners.wtorch.layout_pb), source_group="trainer",
                           destination_group="inference", staging="host_shadow", checksums=True,
                           rollout={"max_unavailable": 1, "replica_ranks": 1})
    owners.candidates = [version - 1, version]
    owners.fill(version)
    handle = client.sync(version, deadline=DEADLINE_S)
    try:
        cluster.ctl.p.wait(timeout=DEADLINE_S)
    except Exception:  # noqa: BLE001
        return [f"v{version}: the controller did not hit its failpoint"]
    end = time.monotonic() + 3  # the events trail the commit a little
    while True:
        done_before = [r for r in range(REPLICAS) if "COMMITTED" in owners.kinds(r, version)]
        if done_before or time.monotonic() > end:
            break
        time.sleep(0.05)
    time.sleep(0.5)  # down a while: the waiting replicas keep their shadows
    cluster.controller_flags.remove("--test_crash_after_commits=1")
    cluster.start_controller()
    status, problem = st.status_after_restart(handle, wsync, version, DEADLINE_S)
    if problem:
        return [problem]
    bad = []
    if status.phase != pb.SYNC_SUCCEEDED or status.uncommitted:
        bad.append(f"v{version}: {pb.SyncPhase.Name(status.phase)} {list(status.uncommitted)}")
    time.sleep(0.2)
    ready(client, wsync)
    overlap = check_version(owners, client, version, 1, bad, f"v{version} restarted")
    print(f"  v{version}: controller killed after replicas {done_before} committed; resumed: "
          f"{pb.SyncPhase.Name(status.phase)}, at most {overlap} committing at once, "
          f"waves {status.rollout.waves_done}", flush=True)
    if done_before != [0]:
        bad.append(f"v{version}: replicas {done_before} committed before the kill, expected [0]")
    return bad


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--build", default=os.path.join(cs.ROOT, "build"))
    p.add_argument("--syncs", type=int, default=6)
    args = p.parse_args()
    sys.stdout.reconfigure(line_buffering=True)
    torch, wsync, wtorch, pb, lpb = st.setup(args)
    from wsync._proto import layout_pb2
    wtorch.layout_pb = layout_pb2
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    os.environ["WSYNC_TEST_FAILPOINTS"] = "1"  # the controller's failpoint flag
    run_dir = tempfile.mkdtemp(prefix="wsync-waves-")
    cluster = Cluster(args.build, run_dir, [
        f"--state_file={os.path.join(run_dir, 'controller.state')}",
        f"--failure_grace={cs.GRACE_S}s"])
    bad, owners = [], None
    try:
        owners = Owners(cluster, torch, wtorch)
        client = wsync.Client(f"127.0.0.1:{cluster.port}", timeout=10)
        client.wait_for_workers({"trainer": 1, "inference": REPLICAS}, timeout=30, buffers=True)
        bad += rolling(owners, client, wsync, pb, 1, 1, args.syncs)
        if not bad:
            bad += rolling(owners, client, wsync, pb, 2, 1 + args.syncs, args.syncs)
        if not bad:
            bad += crash_mid_rollout(cluster, owners, client, wsync, pb, 1 + 2 * args.syncs)
        bad += owners.violations
        print(f"  sampler: {owners.samples} samples, {owners.mixed_excused} mixed inside a "
              f"commit window", flush=True)
    finally:
        if owners is not None:
            owners.stop.set()
        hung = cluster.close()
    return st.report(bad, hung, run_dir, "rolling_waves")


if __name__ == "__main__":
    sys.exit(main())
