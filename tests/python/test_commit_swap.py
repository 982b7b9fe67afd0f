"""Swap commits (docs/commit-swap.md): receiver 0 is an embedded worker in this
process whose destination buffers were packed into one weight arena
(wsync.torch.pack_into_arena) beside an unsynced tensor; receiver 1 a
wsync-worker. Staged syncs commit on receiver 0 by swapping the arena's memory
with a twin: bit-exact versions at unchanged addresses (views taken before see
them), the unsynced bytes survive, a rollback leaves V-1, a twin over the
worker's budget is refused naming it, and tensors outside one arena commit by
copying. The COMMITTED events say which."""
import queue
import threading
import time

import numpy as np
import pytest
import torch

import wsync
import wsync.torch
from wsync import embedded, layouts
from wsync._proto import controller_pb2 as pb

from harness import expected_destination
from test_sync import TP
from tiny_pool import TinyLlamaPool

EXTRA = 1 << 16  # elements of the unsynced fp32 tensor packed beside the buffers


class EventReader:
    """Reads a worker's event subscription at once on a thread (an owner must
    read STAGED before its worker reports staged: --staged_flush_timeout) and
    hands the events to the test in order."""

    def __init__(self, events):
        self._events, self._queue = events, queue.Queue()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()

    def _read(self):
        while not self._stop.is_set():
            ev = self._events.next(0.1)
            if ev is not None:
                self._queue.put(ev)

    def next(self, timeout):
        try:
            return self._queue.get(timeout=timeout)
        except queue.Empty:
            return None

    def close(self):
        self._stop.set()
        self._thread.join(5)
        self._events.close()


def next_kind(events, kind, timeout=30.0):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        ev = events.next(0.2)
        if ev is not None and ev["kind"] == kind:
            return ev
    raise AssertionError(f"no {kind} event in {timeout} s")


class ArenaPool(TinyLlamaPool):
    """Two trainer ranks, receiver 0 embedded here (its buffers in an arena
    when `arena`), receiver 1 a wsync-worker."""

    def __init__(self, cluster, arena=True, short_budget=False):
        super().__init__(cluster)
        mine = layouts.local_buffers(self.spec.destination, 0)
        # short_budget: over the buffers (the plan's shadow fits), under the
        # arena, which also holds `extra` (its twin does not fit).
        self.budget = sum(n for _, n in mine.values()) * 2 + EXTRA * 2 if short_budget else 0
        self.w = embedded.Worker(cluster.address, f"inference:0:{TP}",
                                 staging_budget_bytes=self.budget)
        live = self.receiver0_buffers()
        extra = torch.arange(EXTRA, dtype=torch.float32)
        self.arena = None
        if arena:
            self.arena, views = wsync.torch.pack_into_arena(self.w, {**live, "extra": extra},
                                                            name="weights")
            self.extra = views.pop("extra")
            self.live = views
        else:
            self.extra, self.live = extra, live
        self.w.register(self.live)
        self.w.wait_registered()
        self.connect(cluster)

    def next_version(self):
        for t in self.full.values():
            t.mul_(-0.5).add_(0.25)
        for r in range(2):
            for p in self.params[r].values():
                p.to_local().mul_(-0.5).add_(0.25)

    def close(self):
        self.w.stop()


def test_swap_commits_are_bit_exact_at_unchanged_addresses(cluster):
    pool = ArenaPool(cluster)
    try:
        pool.client.define_transfer("weights", pool.spec, staging="host_shadow")
        events = EventReader(pool.w.events())
        ptrs = {b: t.data_ptr() for b, t in pool.live.items()}
        first = next(iter(pool.live))
        # Views taken before any sync: numpy over the arena's host memory and
        # a torch view of one buffer.
        whole = np.frombuffer(pool.arena._native, dtype=np.uint8)
        held = pool.live[first][:8]
        extra_before = pool.extra.clone()
        assert pool.arena.ptr <= min(ptrs.values())
        for version in (1, 2, 3):
            if version > 1:
                pool.next_version()
            st = pool.client.sync(version, deadline=30).wait(timeout=30)
            assert st.phase == pb.SYNC_SUCCEEDED, st.error
            ev = next_kind(events, "committed")
            assert ev["version"] == version and ev["commit_kind"] == "swap", ev
            assert ev["commit_seconds"] > 0, ev
            want = expected_destination(pool.spec, pool.full, 0, torch.bfloat16)
            for b, x in want.items():
                assert pool.live[b].data_ptr() == ptrs[b], b
                assert torch.equal(pool.live[b][:x.numel()], x), (version, b)
            assert torch.equal(held, want[first][:8]), version
            start = pool.live[first].data_ptr() - pool.arena.ptr
            got = torch.from_numpy(whole[start:start + 16].copy()).view(torch.bfloat16)
            assert torch.equal(got, want[first][:8]), version
            assert torch.equal(pool.extra, extra_before), "unsynced arena bytes changed"
        events.close()
    finally:
        pool.close()


def test_a_rolled_back_swap_staged_sync_leaves_the_previous_version(cluster):
    pool = ArenaPool(cluster)
    try:
        pool.client.define_transfer("weights", pool.spec, staging="host_shadow")
        events = EventReader(pool.w.events())
        assert pool.client.sync(1, deadline=30).wait(timeout=30).phase == pb.SYNC_SUCCEEDED
        assert next_kind(events, "committed")["commit_kind"] == "swap"
        before = {b: t.clone() for b, t in pool.live.items()}
        pool.next_version()
        pool.w.hold("generating")
        handle = pool.client.sync(2, deadline=4)
        next_kind(events, "staged")
        next_kind(events, "rolled_back", timeout=20)
        handle.wait(timeout=30)
        for b, t in pool.live.items():
            assert torch.equal(t, before[b]), f"{b} changed by a rolled-back sync"
        # Admitted again, the next sync swaps V in (the twin was written again).
        pool.w.admit()
        st = pool.client.sync(3, deadline=30).wait(timeout=30)
        assert st.phase == pb.SYNC_SUCCEEDED, st.error
        assert next_kind(events, "committed")["commit_kind"] == "swap"
        want = expected_destination(pool.spec, pool.full, 0, torch.bfloat16)
        for b, x in want.items():
            assert torch.equal(pool.live[b][:x.numel()], x), b
        events.close()
    finally:
        pool.close()


def test_a_twin_over_the_budget_is_refused_naming_the_worker(cluster):
    pool = ArenaPool(cluster, short_budget=True)
    try:
        assert pool.arena.nbytes > pool.budget
        pool.client.define_transfer("weights", pool.spec, staging="host_shadow")
        with pytest.raises(wsync.errors.SyncFailed,
                           match=r"inference.*swap commit.*--staging_budget_bytes"):
            pool.client.sync(1, deadline=30).wait(timeout=30)
        assert all(not t.any() for t in pool.live.values())
    finally:
        pool.close()


def test_tensors_outside_one_arena_commit_by_copying(cluster):
    pool = ArenaPool(cluster, arena=False)
    try:
        pool.client.define_transfer("weights", pool.spec, staging="host_shadow")
        events = EventReader(pool.w.events())
        st = pool.client.sync(1, deadline=30).wait(timeout=30)
        assert st.phase == pb.SYNC_SUCCEEDED, st.error
        assert next_kind(events, "committed")["commit_kind"] == "copy"
        want = expected_destination(pool.spec, pool.full, 0, torch.bfloat16)
        for b, x in want.items():
            assert torch.equal(pool.live[b][:x.numel()], x), b
        events.close()
    finally:
        pool.close()


def test_pack_into_arena_rebinds_parameters_and_checks_devices(cluster):
    w = embedded.Worker(cluster.address, "inference:0:1", start=False)
    try:
        model = torch.nn.Linear(7, 3).to(torch.float16)
        want = {n: p.detach().clone() for n, p in model.named_parameters()}
        arena, views = wsync.torch.pack_into_arena(w, model)
        for n, p in model.named_parameters():
            assert p.data_ptr() == views[n].data_ptr(), n
            assert arena.ptr <= p.data_ptr() < arena.ptr + arena.nbytes, n
            assert p.data_ptr() % wsync.torch_arena.ALIGN == 0, n
            assert torch.equal(p.detach(), want[n]), n
        with pytest.raises(wsync.errors.InvalidArgument, match="does not fit"):
            arena.view(arena.nbytes - 2, torch.float32, (1,))
        with pytest.raises(wsync.errors.FailedPrecondition, match="cuda:0"):
            wsync.torch.WeightArena(w, 4096, device="cuda:0")
        arena.free()
        with pytest.raises(wsync.errors.NotFound, match="handle"):
            arena.free()
    finally:
        w.stop()
