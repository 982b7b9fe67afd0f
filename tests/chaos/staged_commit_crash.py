#!/usr/bin/env python3
"""A controller killed in the middle of a staged sync's commit (issue 20,
docs/staging.md "The commit rule"), loopback only, bounded.

The cluster of chaos_staged.py (real wsync-controller and wsync-worker
processes, trainer:2 -> inference:2 over the host transport, staged in host
shadows with checksums, shared-memory owners in this process). The controller
runs with the test-only failpoint --test_crash_after_commits=N
(WSYNC_TEST_FAILPOINTS=1): at the commit decision of a staged sync it saves
the decision, sends CommitSync to its first N receivers only and SIGKILLs
itself once they confirmed. It is then restarted on the same state file
without the failpoint. Checked from the owner side (the live tensors'
bytes, each rank's SyncEvents) and from the trainer's:

  1. N = 1: one receiver committed before the kill, the other still holds
     its shadow; after the restart that one commits too (COMMITTED, no
     ROLLED_BACK), every replica holds V, none V-1, and the sync's final
     status is SUCCEEDED with nothing uncommitted.
  2. N = 0: the decision saved, no CommitSync sent: both commit after the
     restart.
  3. N = 1, and the receiver still waiting is killed while the controller is
     down (it loses its shadow): its restarted process tells the restarted
     controller it holds no shadow, the sync succeeds listing it
     uncommitted, the other replica rank holds V; a resend of V brings both.

Fails on the code before the fix: there the waiting receiver rolled back to
V-1 when the controller's stream ended while the other had committed V.

    python3 tests/chaos/staged_commit_crash.py --build build
"""
import argparse
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import chaos_staged as st  # noqa: E402
import chaos_sync as cs  # noqa: E402

DEADLINE_S = 20.0  # each sync's; the restart must come well within it


class Events:
    """Each inference rank's SyncEvents (kind name, version), followed on
    one subscription per worker process."""

    def __init__(self, cluster, wtorch):
        self.cluster, self.wtorch = cluster, wtorch
        self.lock = threading.Lock()
        self.seen = {r: [] for r in st.RANKS}

    def follow(self, rank):
        def run():
            lpb = self.wtorch.lpb
            try:
                for ev in self.wtorch.sync_events(self.cluster.socket(*rank), timeout=300):
                    with self.lock:
                        self.seen[rank].append((lpb.SyncEvent.Kind.Name(ev.kind), ev.version))
            except Exception:  # noqa: BLE001 (the worker was killed)
                pass
        threading.Thread(target=run, daemon=True).start()
        time.sleep(0.3)  # subscribed before anything happens

    def of(self, rank, version):
        with self.lock:
            return [k for k, v in self.seen[rank] if v == version]

    def wait_for(self, rank, version, kind, timeout):
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            if kind in self.of(rank, version):
                return True
            time.sleep(0.05)
        return False


def restart_controller(cluster, failpoint):
    cluster.ctl.stop()
    cluster.controller_flags = [f for f in cluster.controller_flags
                                if not f.startswith("--test_crash_after_commits")]
    if failpoint is not None:
        cluster.controller_flags.append(f"--test_crash_after_commits={failpoint}")
    cluster.start_controller()


def crash_mid_commit(cluster, owners, client, events, wsync, pb, version, n, kill_waiting):
    """One staged sync of `version` through a controller that dies after `n`
    commits; returns a list of violations."""
    torch = owners.torch
    regs, versions = owners.regs, st.Versions(torch)
    bad = []
    restart_controller(cluster, n)
    cs.recovered(client, wsync, cluster)
    st.fill_sources(regs, torch, version)
    handle = client.sync(version, deadline=DEADLINE_S)
    try:
        cluster.ctl.p.wait(timeout=DEADLINE_S)
    except Exception:  # noqa: BLE001
        return [f"v{version}: the controller did not hit its failpoint (N={n})"]
    log = open(cluster.ctl.log, errors="replace").read()
    if cluster.ctl.p.returncode != -signal.SIGKILL or "test failpoint" not in log[-4000:]:
        return [f"v{version}: the controller ended with {cluster.ctl.p.returncode}, "
                f"not by its failpoint"]
    end = time.monotonic() + 3  # the events trail the commit a little
    while True:
        committed_before = [r for r in st.RANKS if "COMMITTED" in events.of(r, version)]
        if len(committed_before) >= n or time.monotonic() > end:
            break
        time.sleep(0.05)
    if len(committed_before) != n:
        bad.append(f"v{version}: {committed_before} committed before the kill, expected {n}")
    waiting = [r for r in st.RANKS if r not in committed_before]
    print(f"  v{version} N={n}: killed after the commits of {committed_before}; "
          f"waiting with a shadow: {waiting}", flush=True)
    lost = None
    if kill_waiting:
        lost = waiting[0]
        cluster.restart_worker(*lost)  # the shadow dies with it
        owners.reregister(*lost)
        events.follow(lost)
    time.sleep(0.5)  # the controller is down a while; nobody rolls back
    restart_controller(cluster, None)
    status, problem = st.status_after_restart(handle, wsync, version, DEADLINE_S)
    if problem:
        return bad + [problem]
    print(f"  v{version}: {pb.SyncPhase.Name(status.phase)} after the restart, "
          f"uncommitted {list(status.uncommitted)}", flush=True)
    for r in st.RANKS:
        if r != lost and not events.wait_for(r, version, "FINISHED", 10):
            bad.append(f"v{version}: {r} never finished the sync")
    cs.recovered(client, wsync, cluster)
    got = st.replica_versions(regs, versions, [0, version - 1, version])
    print(f"  v{version}: by rank {got}; events "
          f"{ {r: events.of(r, version) for r in st.RANKS} }", flush=True)
    for r in st.RANKS:
        if r == lost:
            continue
        if got[r] != {version}:
            bad.append(f"v{version}: {r} holds {got[r]}, expected {version} (none on "
                       f"{version - 1})")
        if "ROLLED_BACK" in events.of(r, version):
            bad.append(f"v{version}: {r} rolled back although the commit was decided")
    if client.transfer_status("chaos").last_success_version != version:
        bad.append(f"v{version}: the controller's last delivered version is not {version}")
    if lost is None:
        if status.uncommitted:
            bad.append(f"v{version}: uncommitted {list(status.uncommitted)}")
        return bad
    name = f"{lost[0]}/{lost[1]} "
    if len(status.uncommitted) != 1 or name not in status.uncommitted[0] \
            or "no staged shadow" not in status.uncommitted[0]:
        bad.append(f"v{version}: uncommitted {list(status.uncommitted)}, expected {name}"
                   "holding no staged shadow")
    client.sync(version, deadline=DEADLINE_S, resend=True).wait(timeout=DEADLINE_S + 10)
    got = st.replica_versions(regs, versions, [0, version - 1, version])
    if got != {r: {version} for r in st.RANKS}:
        bad.append(f"v{version}: after the resend the replica holds {got}")
    return bad


def failpoint_needs_the_env(build):
    """The failpoint flag is refused unless WSYNC_TEST_FAILPOINTS=1."""
    env = {k: v for k, v in os.environ.items() if k != "WSYNC_TEST_FAILPOINTS"}
    r = subprocess.run([os.path.join(build, "controller", "server", "wsync-controller"),
                        "--listen=127.0.0.1:0", "--insecure", "--metrics_port=-1",
                        "--state_file=", "--test_crash_after_commits=0"],
                       env=env, capture_output=True, text=True, timeout=30)
    if r.returncode != 2 or "WSYNC_TEST_FAILPOINTS=1" not in r.stdout + r.stderr:
        return [f"--test_crash_after_commits without WSYNC_TEST_FAILPOINTS: exit {r.returncode}, "
                f"{(r.stdout + r.stderr)[-300:]}"]
    return []


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--build", default=os.path.join(cs.ROOT, "build"))
    args = p.parse_args()
    sys.stdout.reconfigure(line_buffering=True)  # what ran shows even if cut
    refused = failpoint_needs_the_env(args.build)
    if refused:
        print("VIOLATION", refused[0])
        return 1
    torch, wsync, wtorch, pb, lpb = st.setup(args)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    os.environ["WSYNC_TEST_FAILPOINTS"] = "1"  # the controller's failpoint flag
    run_dir = tempfile.mkdtemp(prefix="wsync-commit-crash-")
    cluster = cs.Cluster(args.build, run_dir, [
        f"--state_file={os.path.join(run_dir, 'controller.state')}",
        f"--failure_grace={cs.GRACE_S}s"])
    bad = []
    try:
        owners = cs.Owners(cluster, torch, wtorch)
        client = wsync.Client(f"127.0.0.1:{cluster.port}", timeout=10)
        client.wait_for_workers({"trainer": 2, "inference": 2}, timeout=30, buffers=True)
        st.define(client, lpb, "host_shadow")
        events = Events(cluster, wtorch)
        for r in st.RANKS:
            events.follow(r)
        st.fill_sources(owners.regs, torch, 1)
        client.sync(1, deadline=DEADLINE_S).wait(timeout=30)
        for version, n, kill_waiting in ((2, 1, False), (3, 0, False), (4, 1, True)):
            bad += crash_mid_commit(cluster, owners, client, events, wsync, pb, version, n,
                                    kill_waiting)
            if bad:
                break
    finally:
        hung = cluster.close()
    return st.report(bad, hung, run_dir, "staged_commit_crash")


if __name__ == "__main__":
    sys.exit(main())
