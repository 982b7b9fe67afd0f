"""Rolling waves from Python (docs/staging-rollout.md, "Rolling waves"): the tiny
Llama of test_sync.py into vLLM's TP=2 layout, staged in host shadows, with
each destination rank its own replica (`replica_ranks=1`) and one replica
committing at a time. `define_transfer(rollout=...)` checks its argument,
the sync's status tells the waves, `replica_versions()` / `replicas_on()` and
`workers()` tell which replica serves which version, the asyncio client the
same."""
import asyncio
import time

import pytest
import torch

import wsync
import wsync.aio
import wsync.torch
from wsync import layouts, vllm
from wsync._proto import controller_pb2 as pb
from wsync._proto import layout_pb2 as layout_pb
from wsync._proto import worker_local_pb2 as lpb

from harness import full_tensors
from models import TINY_LLAMA, trainer_tensors
from staged_events import follow_receivers
from test_sync import TP, check_receivers, fsdp_params, setup_transfer

ROLLOUT = {"max_unavailable": 1, "replica_ranks": 1}


def test_rollout_argument_is_checked_before_any_call():
    client = wsync.Client("127.0.0.1:1", timeout=1)
    with pytest.raises(wsync.errors.InvalidArgument, match=r"unknown keys \['max_unavail'\]"):
        client.define_transfer("t", layout_pb.TransferSpec(), rollout={"max_unavail": 1})
    with pytest.raises(wsync.errors.InvalidArgument, match="not a non-negative int"):
        client.define_transfer("t", layout_pb.TransferSpec(), rollout={"max_unavailable": -1})
    with pytest.raises(wsync.errors.InvalidArgument, match="must be a dict or RolloutPolicy"):
        client.define_transfer("t", layout_pb.TransferSpec(), rollout=1)
    assert wsync.client.rollout_policy(ROLLOUT).replica_ranks == 1


def test_waves_commit_one_replica_at_a_time_and_report_versions(cluster):
    client, spec, full, params, regs, receivers = setup_transfer(cluster)
    with pytest.raises(wsync.errors.InvalidArgument, match="needs a staged transfer"):
        client.define_transfer("weights", spec, rollout=ROLLOUT)  # in place: refused
    client.define_transfer("weights", spec, staging="host_shadow", rollout=ROLLOUT)
    assert client.transfer_status().rollout.max_unavailable == 1
    events, threads = follow_receivers(receivers, 1)
    st = client.sync(1).wait(timeout=60)
    for t in threads:
        t.join(30)
    assert st.phase == pb.SYNC_SUCCEEDED and not st.uncommitted
    assert (st.rollout.waves_total, st.rollout.waves_done, st.rollout.committing) == (2, 2, 0)
    assert [(r.replica, list(r.ranks), r.state, r.version, r.wave)
            for r in st.rollout.replicas] == [("ranks-0-0", [0], "committed", 1, 0),
                                              ("ranks-1-1", [1], "committed", 1, 1)]
    check_receivers(spec, full, receivers)
    # The owners' events: rank 1's COMMIT follows rank 0's COMMITTED.
    K = lpb.SyncEvent

    def at(r, kind):
        return next(e.unix_us for e in events[r] if e.kind == kind)
    assert 0 < at(0, K.COMMIT) <= at(0, K.COMMITTED) < at(1, K.COMMIT) <= at(1, K.COMMITTED)
    assert [(r.replica, r.version, r.state) for r in client.replica_versions()] == [
        ("ranks-0-0", 1, "serving"), ("ranks-1-1", 1, "serving")]
    assert client.replicas_on(1) == ["ranks-0-0", "ranks-1-1"] and client.replicas_on(2) == []
    served = {(v.group, v.rank): v.version for w in client.workers("inference")
              for v in w.serving_versions if v.transfer == "weights"}
    assert served == {("inference", 0): 1, ("inference", 1): 1}

    async def aio():
        async with wsync.aio.Client(cluster.address, timeout=20) as c:
            c.transfer = "weights"
            return await c.replicas_on(1), len(await c.replica_versions())
    assert asyncio.run(aio()) == (["ranks-0-0", "ranks-1-1"], 2)


def test_a_warm_up_runs_beside_a_receiver_awaiting_its_wave(cluster, monkeypatch):
    """A receiver awaiting its commit wave leaves its worker free for other
    transfers' warm-ups (docs/staging-rollout.md, "Rolling waves"): replica 0's
    commit is slow (the test failpoint --test_commit_delay), replica 1 awaits
    its wave meanwhile, and the warm-up of transfer "solo" (the trainers into
    a second group of replica 1's worker) completes on replica 1's worker
    then. Before session 16 that worker's assignment loop sat in the commit
    wait: the warm-up came only after replica 1 committed."""
    monkeypatch.setenv("WSYNC_TEST_FAILPOINTS", "1")
    socks = {("trainer", r): cluster.worker(f"trainer:{r}:2") for r in range(2)}
    socks[("inference", 0)] = cluster.worker(f"inference:0:{TP}",
                                             flags=["--test_commit_delay=10s"])
    socks[("inference", 1)] = cluster.worker(f"inference:1:{TP},solo:0:1")
    shapes = {n: s for n, s, _ in trainer_tensors("tiny-llama")}
    full = full_tensors(shapes, torch.float32)
    params = {r: fsdp_params(full, r) for r in range(2)}
    src = layouts.source_side(layouts.describe(params[0].items(), rank=0))
    spec = layouts.transfer_spec(src, vllm.destination(TINY_LLAMA, tp=TP), name="tiny")
    solo = layouts.transfer_spec(src, vllm.destination(TINY_LLAMA, tp=1), name="tiny")
    regs = [wsync.torch.register({n: p.to_local() for n, p in params[r].items()},
                                 group="trainer", rank=r, socket=socks[("trainer", r)])
            for r in range(2)]
    receivers = [wsync.torch.register(
        {b: torch.zeros(n, dtype=torch.bfloat16)
         for b, (_, n) in layouts.local_buffers(spec.destination, r).items()},
        group="inference", rank=r, socket=socks[("inference", r)]) for r in range(TP)]
    regs.append(wsync.torch.register(
        {b: torch.zeros(n, dtype=torch.bfloat16)
         for b, (_, n) in layouts.local_buffers(solo.destination, 0).items()},
        group="solo", rank=0, socket=socks[("inference", 1)]))
    client = wsync.Client(cluster.address, timeout=20)
    client.wait_for_workers({"trainer": 2, "inference": TP, "solo": 1}, timeout=30, buffers=True)
    client.define_transfer("weights", spec, staging="host_shadow", rollout=ROLLOUT,
                           warm_up=False)
    handle = client.sync(1, deadline=60)

    def states():
        return [r.state for r in handle.poll().rollout.replicas]
    end = time.monotonic() + 20
    while states() != ["committing", "waiting"] and time.monotonic() < end:
        time.sleep(0.02)
    assert states() == ["committing", "waiting"], states()
    client.define_transfer("solo", solo, destination_group="solo")  # its warm-up starts
    warm, end = None, time.monotonic() + 8
    while time.monotonic() < end:
        warm = client.transfer_status("solo").warm_up
        if warm.state != pb.WARM_UP_RUNNING:
            break
        time.sleep(0.02)
    seen = states()
    assert warm.state == pb.WARM_UP_WARM, (pb.WarmUpState.Name(warm.state), warm.reason)
    assert seen == ["committing", "waiting"], f"replica 1 left its wait first: {seen}"
    st = handle.wait(timeout=60)
    assert st.phase == pb.SYNC_SUCCEEDED and not st.uncommitted, (st.error, st.uncommitted)
    check_receivers(spec, full, receivers)
    del regs
