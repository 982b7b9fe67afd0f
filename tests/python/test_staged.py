"""Staged syncs end to end on the host transport (docs/staging.md): the tiny
Llama of test_sync.py into vLLM's TP=2 layout with `staging="host_shadow"`
and checksums. The owner sees STARTED, STAGED, COMMIT, COMMITTED, FINISHED
with the version its live tensors hold; `plan()` reports each receiver's
shadow memory; every destination byte arrives."""

import pytest

import wsync
from wsync._proto import controller_pb2 as pb
from wsync._proto import worker_local_pb2 as lpb

from harness import full_tensors
from staged_events import follow_receivers
from models import TINY_LLAMA, trainer_tensors
from test_sync import TP, check_receivers, fsdp_params, setup_transfer
from wsync import layouts, vllm


def test_staged_sync_commits_pool_wide_and_tells_the_owner(cluster):
    client, spec, full, params, regs, receivers = setup_transfer(cluster)
    resp = client.define_transfer("weights", spec, staging="host_shadow", checksums=True)
    assert [(s.group, s.rank) for s in resp.shadow] == [("inference", r) for r in range(TP)]
    plan = client.plan()
    assert plan.staging == wsync.client.STAGING_MODES["host_shadow"]
    # Each receiver's shadow covers what its part writes: its buffers.
    for s, reg in zip(plan.shadow, receivers):
        assert 0 < s.shadow_bytes <= sum(t.numel() * t.element_size()
                                         for t in reg.tensors.values())
    (events,), (t,) = follow_receivers(receivers[:1], 2)
    st = client.sync(1).wait(timeout=60)
    assert st.phase == pb.SYNC_SUCCEEDED and st.commit_decided
    assert st.workers_staged == TP and st.buckets_verified > 0 and not st.uncommitted
    assert st.max_commit_seconds > 0
    check_receivers(spec, full, receivers)
    for r in range(2):
        for p in params[r].values():
            p.to_local().mul_(-0.5).add_(1.0)
    for x in full.values():
        x.mul_(-0.5).add_(1.0)
    client.sync(2).wait(timeout=60)
    t.join(30)
    check_receivers(spec, full, receivers)
    K = lpb.SyncEvent
    kinds = [(e.kind, e.version, e.serving_version) for e in events]
    assert kinds == [(K.STARTED, 1, 0), (K.STAGED, 1, 0), (K.COMMIT, 1, 0), (K.COMMITTED, 1, 1),
                     (K.FINISHED, 1, 0), (K.STARTED, 2, 0), (K.STAGED, 2, 1), (K.COMMIT, 2, 1),
                     (K.COMMITTED, 2, 2), (K.FINISHED, 2, 0)], kinds


def test_a_shadow_over_a_workers_budget_is_refused_naming_it(cluster):
    for r in range(2):
        cluster.worker(f"trainer:{r}:2")
    cluster.worker("inference:0:2")
    cluster.worker("inference:1:2", flags=["--staging_budget_bytes=1024"])
    shapes = {n: s for n, s, _ in trainer_tensors("tiny-llama")}
    params = fsdp_params(full_tensors(shapes), 0)
    src = layouts.source_side(layouts.describe(params.items(), rank=0))
    spec = layouts.transfer_spec(src, vllm.destination(TINY_LLAMA, tp=TP), name="tiny")
    client = wsync.Client(cluster.address, timeout=20)
    client.wait_for_workers({"trainer": 2, "inference": TP}, timeout=30)
    with pytest.raises(wsync.errors.InvalidArgument, match="staging 'pinned' is not one of"):
        client.define_transfer("weights", spec, staging="pinned")
    with pytest.raises(wsync.errors.InvalidArgument,
                       match=r"inference/1 .*over its --staging_budget_bytes of 1024"):
        client.define_transfer("weights", spec, staging="host_shadow")
    resp = client.define_transfer("weights", spec)  # in place needs no shadow
    assert not resp.shadow
