"""Rolling waves from Python (docs/staging.md, "Rolling waves"): the tiny
Llama of test_sync.py into vLLM's TP=2 layout, staged in host shadows, with
each destination rank its own replica (`replica_ranks=1`) and one replica
committing at a time. `define_transfer(rollout=...)` checks its argument,
the sync's status tells the waves, `replica_versions()` / `replicas_on()` and
`workers()` tell which replica serves which version, the asyncio client the
same."""
import asyncio
import threading
import time

import pytest

import wsync
import wsync.aio
import wsync.torch
from wsync._proto import controller_pb2 as pb
from wsync._proto import layout_pb2 as layout_pb
from wsync._proto import worker_local_pb2 as lpb

from test_sync import TP, check_receivers, setup_transfer

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


def follow(socket, events, subscribed, until_version):
    subscribed.set()
    for ev in wsync.torch.sync_events(socket, timeout=60):
        events.append(ev)
        if ev.kind == lpb.SyncEvent.FINISHED and ev.version == until_version:
            return


def test_waves_commit_one_replica_at_a_time_and_report_versions(cluster):
    client, spec, full, params, regs, receivers = setup_transfer(cluster)
    with pytest.raises(wsync.errors.InvalidArgument, match="needs a staged transfer"):
        client.define_transfer("weights", spec, rollout=ROLLOUT)  # in place: refused
    client.define_transfer("weights", spec, staging="host_shadow", rollout=ROLLOUT)
    assert client.transfer_status().rollout.max_unavailable == 1
    events = [[] for _ in range(TP)]
    threads = []
    for r in range(TP):
        subscribed = threading.Event()
        t = threading.Thread(target=follow, args=(receivers[r].socket, events[r], subscribed, 1))
        t.start()
        subscribed.wait(5)
        threads.append(t)
    time.sleep(0.3)  # the event streams are open before the sync starts
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
