"""An owner holding syncs off (docs/staging.md, "An owner holding syncs off"):
a staged sync stages into the shadow while held and its commit waits until
the owner admits syncs; still held at the sync's deadline, the live tensors
stay untouched and the receiver is listed uncommitted; an in-place sync is
refused. Receiver 0 is an embedded worker in this process (its owner holds),
receiver 1 a wsync-worker."""
import time

import pytest
import torch

import wsync
import wsync.torch
from wsync import embedded
from wsync._proto import controller_pb2 as pb

from harness import expected_destination
from test_sync import TP
from tiny_pool import TinyLlamaPool


def next_kind(events, kind, timeout=30.0):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        ev = events.next(0.2)
        if ev is not None and ev["kind"] == kind:
            return ev
    raise AssertionError(f"no {kind} event in {timeout} s")


def kinds_within(events, seconds):
    out, end = [], time.monotonic() + seconds
    while time.monotonic() < end:
        ev = events.next(0.1)
        if ev is not None:
            out.append(ev["kind"])
    return out


class HeldPool(TinyLlamaPool):
    """Two trainer ranks and two receivers: receiver 0 an embedded worker in
    this process (its owner holds), receiver 1 a wsync-worker."""

    def __init__(self, cluster):
        super().__init__(cluster)
        self.w = embedded.Worker(cluster.address, f"inference:0:{TP}")
        self.live = self.receiver0_buffers()
        self.w.register(self.live)
        self.w.wait_registered()
        self.connect(cluster)

    def close(self):
        self.w.stop()


def test_a_held_owner_commits_only_once_admitted_or_not_at_all(cluster):
    pool = HeldPool(cluster)
    spec, full, params, live, w, client = (pool.spec, pool.full, pool.params, pool.live, pool.w,
                                           pool.client)
    try:
        client.define_transfer("weights", spec, staging="host_shadow")
        want = expected_destination(spec, full, 0, torch.bfloat16)
        events = w.events()

        # 1. Held before the sync: it stages, and commits once admitted.
        w.hold("generating")
        handle = client.sync(1, deadline=30)
        next_kind(events, "staged")
        seen = kinds_within(events, 1.5)
        assert "commit" not in seen and "committed" not in seen, seen
        assert all(not t.any() for t in live.values()), "a held owner's tensors were written"
        assert handle.poll().commit_decided, "the pool decided; the commit waits"
        w.admit()
        assert next_kind(events, "committed")["serving_version"] == 1
        st = handle.wait(timeout=30)
        assert st.phase == pb.SYNC_SUCCEEDED and not st.uncommitted, (st.error, st.uncommitted)
        for b, x in want.items():
            assert torch.equal(live[b][:x.numel()], x), b

        # 2. Still held at the deadline: untouched, rolled back, uncommitted.
        for t in full.values():
            t.mul_(-0.5)
        for r in range(2):
            for p in params[r].values():
                p.to_local().mul_(-0.5)
        before = {b: t.clone() for b, t in live.items()}
        w.hold("generating")
        handle = client.sync(2, deadline=4)
        next_kind(events, "staged")
        ev = next_kind(events, "rolled_back", timeout=20)
        assert "held syncs off (generating)" in ev["error"], ev
        st = handle.wait(timeout=30)
        assert st.phase == pb.SYNC_SUCCEEDED and st.commit_decided, st.error
        assert len(st.uncommitted) == 1, st.uncommitted
        assert "inference/0" in st.uncommitted[0], st.uncommitted
        assert "held syncs off" in st.uncommitted[0], st.uncommitted
        for b, t in live.items():
            assert torch.equal(t, before[b]), f"{b} written while held"

        # 3. In place while held: refused, nothing written.
        client.define_transfer("weights", spec)
        with pytest.raises(wsync.errors.SyncFailed, match="holds syncs off: generating"):
            client.sync(3).wait(timeout=30)
        for b, t in live.items():
            assert torch.equal(t, before[b]), f"{b} written while held"
        w.admit()
        events.close()
    finally:
        pool.close()


def test_a_held_replica_holds_no_wave_back_and_commits_once_admitted(cluster):
    """Rolling waves, one replica at a time: receiver 0's owner holds syncs
    off when its wave comes, so it reports `commit_held` at once; receiver
    1's wave goes out meanwhile (before session 16 it waited for receiver 0
    until the deadline); admitted, receiver 0 commits in a later wave."""
    pool = HeldPool(cluster)
    try:
        pool.client.define_transfer("weights", pool.spec, staging="host_shadow",
                                    rollout={"max_unavailable": 1, "replica_ranks": 1})
        events = pool.w.events()
        pool.w.hold("generating")
        handle = pool.client.sync(1, deadline=30)
        # An owner subscribed to its worker's events reads STAGED before the
        # worker reports it staged (--staged_flush_timeout).
        next_kind(events, "staged")
        end = time.monotonic() + 15
        states = []
        while time.monotonic() < end:
            states = [(r.replica, r.state) for r in handle.poll().rollout.replicas]
            if states == [("ranks-0-0", "held"), ("ranks-1-1", "committed")]:
                break
            time.sleep(0.05)
        assert states == [("ranks-0-0", "held"), ("ranks-1-1", "committed")], states
        assert all(not t.any() for t in pool.live.values()), "a held owner's tensors were written"
        pool.w.admit()
        assert next_kind(events, "committed")["serving_version"] == 1
        st = handle.wait(timeout=30)
        assert st.phase == pb.SYNC_SUCCEEDED and not st.uncommitted, (st.error, st.uncommitted)
        assert [(r.replica, r.state, r.version) for r in st.rollout.replicas] == [
            ("ranks-0-0", "committed", 1), ("ranks-1-1", "committed", 1)]
        for b, x in expected_destination(pool.spec, pool.full, 0, torch.bfloat16).items():
            assert torch.equal(pool.live[b][:x.numel()], x), b
        events.close()
    finally:
        pool.close()


def test_the_decision_slack_is_a_worker_flag(cluster):
    """--decision_slack (docs/staging.md, "Flags"): how long past a staged
    sync's deadline a receiver waits for the decision; negative or over one
    hour refused."""
    with pytest.raises(RuntimeError, match="exited with 2"):
        cluster.worker("inference:0:1", flags=["--decision_slack=-1s"])
    with pytest.raises(RuntimeError, match="exited with 2"):  # over its limit, one hour
        cluster.worker("inference:0:1", flags=["--decision_slack=2h"])
    cluster.worker("inference:0:1", flags=["--decision_slack=250ms"])
    client = wsync.Client(cluster.address, timeout=20)
    client.wait_for_workers({"inference": 1}, timeout=30)
