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
from wsync import embedded, layouts, vllm
from wsync._proto import controller_pb2 as pb

from harness import expected_destination, full_tensors
from models import TINY_LLAMA, trainer_tensors
from test_sync import TP, fsdp_params


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


def test_a_held_owner_commits_only_once_admitted_or_not_at_all(cluster):
    shapes = {n: s for n, s, _ in trainer_tensors("tiny-llama")}
    full = full_tensors(shapes, torch.bfloat16)
    params = {r: fsdp_params(full, r) for r in range(2)}
    src = layouts.source_side(layouts.describe(params[0].items(), rank=0))
    spec = layouts.transfer_spec(src, vllm.destination(TINY_LLAMA, tp=TP), name="tiny")
    regs = [wsync.torch.register({n: p.to_local() for n, p in params[r].items()},
                                 group="trainer", rank=r, socket=cluster.worker(f"trainer:{r}:2"))
            for r in range(2)]
    sock1 = cluster.worker(f"inference:1:{TP}")
    bufs1 = {b: torch.zeros(n, dtype=torch.bfloat16)
             for b, (_, n) in layouts.local_buffers(spec.destination, 1).items()}
    reg1 = wsync.torch.register(bufs1, group="inference", rank=1, socket=sock1)
    with embedded.Worker(cluster.address, f"inference:0:{TP}") as w:
        live = {b: torch.zeros(n, dtype=torch.bfloat16)
                for b, (_, n) in layouts.local_buffers(spec.destination, 0).items()}
        w.register(live)
        w.wait_registered()
        client = wsync.Client(cluster.address, timeout=20)
        client.wait_for_workers({"trainer": 2, "inference": TP}, timeout=30, buffers=True)
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
    del regs, reg1


def test_the_decision_slack_is_a_worker_flag(cluster):
    """--decision_slack (docs/staging.md, "Flags"): how long past a staged
    sync's deadline a receiver waits for the decision; negative refused."""
    with pytest.raises(RuntimeError, match="exited with 2"):
        cluster.worker("inference:0:1", flags=["--decision_slack=-1s"])
    cluster.worker("inference:0:1", flags=["--decision_slack=250ms"])
    client = wsync.Client(cluster.address, timeout=20)
    client.wait_for_workers({"inference": 1}, timeout=30)
