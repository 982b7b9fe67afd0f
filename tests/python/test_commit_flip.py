"""Flip commits (docs/commit-flip.md): receiver 0 is an embedded worker in this
process whose destination buffers were packed into a flip pair of arenas
(wsync.torch.pack_into_flip_arenas) beside an unsynced tensor; receiver 1 a
wsync-worker. Each staged sync writes the arena the owner does not serve; the
owner serves V-1, whole, until the commit hands the other arena over, and then
switches its tensors there (FlipArenas.flip). A sync waits for that switch,
and fails naming the flip when the owner never makes it; a rollback leaves
the served arena as it was."""
import pytest
import torch

import wsync
import wsync.torch
from wsync import embedded
from wsync._proto import controller_pb2 as pb

from harness import expected_destination
from test_commit_swap import EventReader, next_kind
from test_sync import TP
from tiny_pool import TinyLlamaPool

EXTRA = 1 << 12  # elements of the unsynced fp32 tensor packed beside the buffers


class FlipPool(TinyLlamaPool):
    """Two trainer ranks, receiver 0 embedded here (its buffers and `extra`
    in a flip pair), receiver 1 a wsync-worker."""

    def __init__(self, cluster, flip_ack_wait=30.0):
        super().__init__(cluster)
        self.w = embedded.Worker(cluster.address, f"inference:0:{TP}",
                                 flip_ack_wait=flip_ack_wait)
        self.live = self.receiver0_buffers()
        self.extra = torch.arange(EXTRA, dtype=torch.float32)
        self.flips = wsync.torch.pack_into_flip_arenas(self.w, {**self.live, "extra": self.extra},
                                                       name="weights")
        self.w.register(self.live)
        self.w.wait_registered()
        self.connect(cluster)

    def serving_arena(self):
        return self.flips.arenas[self.flips.serving]

    def lies_in(self, arena):
        return all(arena.ptr <= t.data_ptr() < arena.ptr + arena.nbytes
                   for t in (*self.live.values(), self.extra))

    def next_version(self):
        for t in self.full.values():
            t.mul_(-0.5).add_(0.25)
        for r in range(2):
            for p in self.params[r].values():
                p.to_local().mul_(-0.5).add_(0.25)

    def want(self):
        return expected_destination(self.spec, self.full, 0, torch.bfloat16)

    def expect_live(self, want, what):
        for b, x in want.items():
            assert torch.equal(self.live[b][:x.numel()], x), (what, b)

    def close(self):
        self.w.stop()


def test_flip_commits_hand_over_the_other_arena_and_the_owner_serves_whole_versions(cluster):
    pool = FlipPool(cluster)
    try:
        pool.client.define_transfer("weights", pool.spec, staging="host_shadow")
        events = EventReader(pool.w.events())
        extra_before = pool.extra.clone()
        served = {b: t.clone() for b, t in pool.live.items()}  # version 0: zeros
        for version in (1, 2, 3, 4):
            if version > 1:
                pool.next_version()
            before = pool.serving_arena()
            handle = pool.client.sync(version, deadline=30)
            next_kind(events, "staged")
            # Staged: the new version sits in the other arena; the owner still
            # serves the previous one, whole, from the arena it had.
            assert pool.lies_in(before), version
            for b, t in pool.live.items():
                assert torch.equal(t, served[b]), (version, b)
            ev = next_kind(events, "committed")
            assert ev["version"] == version and ev["commit_kind"] == "flip", ev
            other = pool.flips.arenas[1 - pool.flips.serving]
            assert ev["flipped_onto"] == other.handle, ev
            assert pool.flips.flip(ev)
            assert pool.lies_in(other) and pool.serving_arena() is other, version
            st = handle.wait(timeout=30)
            assert st.phase == pb.SYNC_SUCCEEDED, st.error
            pool.expect_live(pool.want(), version)
            assert torch.equal(pool.extra, extra_before), "unsynced arena bytes changed"
            assert pool.w.stale() == [], "the flip left the registrations behind"
            # Views of the arena the flip left are never registered again: a sync
            # would take it for live and write the arena the owner serves.
            left = pool.flips.views[1 - pool.flips.serving]
            name = next(iter(pool.live))
            with pytest.raises(wsync.errors.FailedPrecondition, match=rf"{name}.*flip of sync"):
                pool.w.register({name: left[name]}, replace=True)
            served = {b: t.clone() for b, t in pool.live.items()}
        events.close()
    finally:
        pool.close()


def test_a_sync_waits_for_the_owners_flip_and_fails_naming_it_when_none_comes(cluster):
    pool = FlipPool(cluster, flip_ack_wait=1.0)
    try:
        pool.client.define_transfer("weights", pool.spec, staging="host_shadow")
        events = EventReader(pool.w.events())
        assert pool.client.sync(1, deadline=30).wait(timeout=30).phase == pb.SYNC_SUCCEEDED
        ev = next_kind(events, "committed")
        zeros = {b: t.clone() for b, t in pool.live.items()}
        # The owner does not switch: version 2 may not write the arena it reads.
        pool.next_version()
        with pytest.raises(wsync.errors.SyncFailed, match=r"inference.*AckFlip"):
            pool.client.sync(2, deadline=30).wait(timeout=30)
        for b, t in pool.live.items():
            assert torch.equal(t, zeros[b]), f"{b}: the arena the owner reads was written"
        # It switches (onto version 1) and acknowledges: version 3 flips back.
        assert pool.flips.flip(ev)
        pool.next_version()
        st = pool.client.sync(3, deadline=30).wait(timeout=30)
        assert st.phase == pb.SYNC_SUCCEEDED, st.error
        assert pool.flips.flip(next_kind(events, "committed"))
        assert pool.flips.serving == 0
        pool.expect_live(pool.want(), 3)
        events.close()
    finally:
        pool.close()


def test_a_rolled_back_flip_sync_leaves_the_served_arena_and_the_next_one_flips(cluster):
    pool = FlipPool(cluster)
    try:
        pool.client.define_transfer("weights", pool.spec, staging="host_shadow")
        events = EventReader(pool.w.events())
        assert pool.client.sync(1, deadline=30).wait(timeout=30).phase == pb.SYNC_SUCCEEDED
        assert pool.flips.flip(next_kind(events, "committed"))
        before = {b: t.clone() for b, t in pool.live.items()}
        serving = pool.flips.serving
        pool.next_version()
        pool.w.hold("generating")
        handle = pool.client.sync(2, deadline=4)
        next_kind(events, "staged")
        next_kind(events, "rolled_back", timeout=20)
        handle.wait(timeout=30)
        assert pool.flips.serving == serving
        for b, t in pool.live.items():
            assert torch.equal(t, before[b]), f"{b} changed by a rolled-back sync"
        pool.w.admit()
        st = pool.client.sync(3, deadline=30).wait(timeout=30)
        assert st.phase == pb.SYNC_SUCCEEDED, st.error
        assert pool.flips.flip(next_kind(events, "committed"))
        assert pool.flips.serving != serving
        pool.expect_live(pool.want(), 3)
        events.close()
    finally:
        pool.close()


def test_flip_arenas_are_checked(cluster):
    for bad in (0, -1.0, float("inf")):
        with pytest.raises(wsync.errors.InvalidArgument, match="flip_ack_wait"):
            embedded.Worker(cluster.address, "inference:0:1", flip_ack_wait=bad, start=False)
    w = embedded.Worker(cluster.address, "inference:0:1", start=False)
    try:
        model = torch.nn.Linear(7, 3).to(torch.float16)
        want = {n: p.detach().clone() for n, p in model.named_parameters()}
        flips = wsync.torch.pack_into_flip_arenas(w, model, name="pair")
        a, b = flips.arenas
        for n, p in model.named_parameters():
            assert p.data_ptr() == flips.views[0][n].data_ptr(), n
            assert torch.equal(flips.views[1][n], want[n]), n
            assert flips.views[1][n].data_ptr() - b.ptr == p.data_ptr() - a.ptr, n
        # No flip awaits an acknowledgement; events that are not flips change nothing.
        with pytest.raises(wsync.errors.FailedPrecondition, match=r"pair\.1.*no flip onto it"):
            embedded._call(w._w.ack_flip, b.handle)
        with pytest.raises(wsync.errors.NotFound, match="handle"):
            embedded._call(w._w.ack_flip, 12345)
        assert not flips.flip({"kind": "committed", "commit_kind": "swap"})
        with pytest.raises(wsync.errors.InvalidArgument, match="not one of this pair"):
            flips.flip({"kind": "committed", "commit_kind": "flip", "flipped_onto": 999})
        with pytest.raises(wsync.errors.InvalidArgument, match="host or CUDA memory"):
            wsync.torch.pack_into_flip_arenas(
                w, {"x": torch.zeros(2), "y": torch.zeros(2, device="meta")})
    finally:
        w.stop()
