"""End to end on the host transport: a trainer of 2 FSDP2 ranks (DTensor-like
parameters, registered by shared memory) syncs a tiny Llama into vLLM's TP=2
layout (fused qkv / gate_up, padded vocab) through real wsync processes;
every destination byte is checked against the mappings applied to the full
tensors."""
import time

import pytest
import torch

import wsync
import wsync.torch
from wsync import layouts, vllm

import ducks
from harness import expected_destination, full_tensors
from models import TINY_LLAMA, trainer_tensors

TP = 2


def start_ranks(cluster, n_trainer=2, n_inference=TP, inference_flags=None):
    """`inference_flags`: {rank: [flags]} for those inference workers."""
    socks = {}
    for r in range(n_trainer):
        socks[("trainer", r)] = cluster.worker(f"trainer:{r}:{n_trainer}")
    for r in range(n_inference):
        socks[("inference", r)] = cluster.worker(f"inference:{r}:{n_inference}",
                                                 flags=(inference_flags or {}).get(r, ()))
    return socks


def fsdp_params(full, rank, world=2):
    return {n: ducks.DTensor(t, list(range(world)), [ducks.Shard(0)], rank)
            for n, t in full.items()}


def setup_transfer(cluster, src_dtype=torch.float32, inference_flags=None):
    socks = start_ranks(cluster, inference_flags=inference_flags)
    shapes = {n: s for n, s, _ in trainer_tensors("tiny-llama")}
    full = full_tensors(shapes, src_dtype)
    params = {r: fsdp_params(full, r) for r in range(2)}
    src = layouts.source_side(layouts.describe(params[0].items(), rank=0))
    spec = layouts.transfer_spec(src, vllm.destination(TINY_LLAMA, tp=TP), name="tiny")
    regs = [wsync.torch.register({n: p.to_local() for n, p in params[r].items()},
                                 group="trainer", rank=r, socket=socks[("trainer", r)])
            for r in range(2)]
    receivers = []
    for r in range(TP):
        bufs = {b: torch.zeros(n, dtype=torch.bfloat16)
                for b, (_, n) in layouts.local_buffers(spec.destination, r).items()}
        receivers.append(wsync.torch.register(bufs, group="inference", rank=r,
                                              socket=socks[("inference", r)]))
    client = wsync.Client(cluster.address, timeout=20)
    client.wait_for_workers({"trainer": 2, "inference": TP}, timeout=30, buffers=True)
    return client, spec, full, params, regs, receivers


def check_receivers(spec, full, receivers):
    for r, reg in enumerate(receivers):
        want = expected_destination(spec, full, r, torch.bfloat16)
        assert set(want) <= set(reg.tensors)
        for b, w in want.items():
            got = reg.tensors[b][:w.numel()]
            assert torch.equal(got, w), f"rank {r} buffer {b}"


def test_sync_fsdp2_to_vllm_tp2_bit_exact(cluster):
    client, spec, full, params, regs, receivers = setup_transfer(cluster)
    resp = client.define_transfer("weights", spec, source_group="trainer",
                                  destination_group="inference")
    assert resp.num_workers == 2 + TP
    plan = client.plan()
    assert plan.plan_key == resp.plan_key and plan.cache_hit
    full_plan = client.plan(full=True).plan
    assert full_plan.key == resp.plan_key and len(full_plan.ranks) == 2 + TP
    handle = client.sync(1)
    status = handle.wait(timeout=60, show_progress=False)
    assert status.phase == wsync._proto.controller_pb2.SYNC_SUCCEEDED
    check_receivers(spec, full, receivers)
    p = handle.progress()
    assert p.done and p.bytes_done == p.bytes_total > 0
    assert p.workers_done == p.workers_total == 2 + TP

    # An optimizer step changes the trainer's tensors in place: version 2 moves them.
    for r in range(2):
        for t in params[r].values():
            t.to_local().mul_(-0.5).add_(1.0)
    for t in full.values():
        t.mul_(-0.5).add_(1.0)
    client.sync(2).wait(timeout=60)
    check_receivers(spec, full, receivers)
    t = client.transfer_status("weights")
    assert t.last_success_version == 2
    assert {w.memberships[0].group for w in client.workers()} == {"trainer", "inference"}
    for reg in regs + receivers:
        reg.close()


def test_reregistration_after_reallocation(cluster):
    client, spec, full, params, regs, receivers = setup_transfer(cluster)
    client.define_transfer("weights", spec)
    client.sync(1).wait(timeout=60)
    # "offload/reload": the trainer replaces a tensor's storage.
    name = "model.layers.0.self_attn.q_proj.weight"
    local = params[0][name].to_local()
    assert regs[0].stale() == []
    local.data = local.data.clone() + 3.0
    assert regs[0].stale() == [name]
    assert regs[0].refresh() is True
    assert regs[0].refresh() is False  # nothing moved since: cheap
    # Rank 0's shard of `name` changed; the full tensor follows.
    rows = local.shape[0]
    full[name][:rows] += 3.0
    client.sync(2).wait(timeout=60)
    check_receivers(spec, full, receivers)


def test_progress_display_and_watch(cluster, capsys):
    client, spec, full, params, regs, receivers = setup_transfer(cluster)
    client.define_transfer("weights", spec)
    handle = client.sync(1)
    statuses = list(handle.watch(timeout=60))
    assert statuses[-1].phase == wsync._proto.controller_pb2.SYNC_SUCCEEDED
    handle2 = client.sync(2)
    handle2.wait(timeout=60, show_progress=True)
    err = capsys.readouterr().err
    assert "sync weights v2" in err and "GB/s" in err and "workers 4/4" in err


def test_sync_events_reach_the_owner(cluster):
    """An inference owner follows STARTED / FINISHED(ok) to pause and resume."""
    import threading
    from wsync._proto import worker_local_pb2 as lpb
    client, spec, full, params, regs, receivers = setup_transfer(cluster)
    client.define_transfer("weights", spec)
    events, subscribed = [], threading.Event()

    def follow():
        subscribed.set()
        for ev in wsync.torch.sync_events(receivers[0].socket, timeout=30):
            events.append(ev)
            if ev.kind == lpb.SyncEvent.FINISHED:
                return
    t = threading.Thread(target=follow)
    t.start()
    subscribed.wait(5)
    time.sleep(0.3)  # the event stream is open before the sync starts
    client.sync(7).wait(timeout=60)
    t.join(30)
    assert [(e.kind, e.version, e.transfer) for e in events] == [
        (lpb.SyncEvent.STARTED, 7, "weights"), (lpb.SyncEvent.FINISHED, 7, "weights")]
    assert events[-1].ok


@pytest.mark.asyncio
async def test_async_client(cluster):
    client, spec, full, params, regs, receivers = setup_transfer(cluster)
    client.close()
    import wsync.aio
    async with wsync.aio.Client(cluster.address, timeout=20) as ac:
        await ac.wait_for_workers({"trainer": 2, "inference": TP}, timeout=30, buffers=True)
        await ac.define_transfer("weights", spec)
        handle = await ac.sync(1)
        status = await handle.wait(timeout=60)
        assert status.bytes_done == status.bytes_total
        seen = [s async for s in (await ac.sync(2)).watch(timeout=60)]
        assert seen[-1].phase == wsync._proto.controller_pb2.SYNC_SUCCEEDED
        st = await ac.status()
        assert st.transfers[0].last_success_version == 2
    check_receivers(spec, full, receivers)


def test_sync_with_wait_ends_in_one_round_trip(cluster):
    client, spec, full, params, regs, receivers = setup_transfer(cluster)
    client.define_transfer("weights", spec)
    handle = client.sync(1, wait=60)
    # The controller answered once the sync had ended: no WaitSync needed.
    assert handle.status is not None
    assert handle.status.phase == wsync._proto.controller_pb2.SYNC_SUCCEEDED
    calls = []
    rpc = client._rpc
    client._rpc = lambda *a, **k: calls.append(a[0]) or rpc(*a, **k)
    assert handle.wait(timeout=60).bytes_done == handle.status.bytes_total
    assert calls == []
    client._rpc = rpc
    check_receivers(spec, full, receivers)
    # A wait shorter than the sync answers with a running status; wait() goes on.
    slow = client.sync(2, wait=0.001)
    assert slow.wait(timeout=60).phase == wsync._proto.controller_pb2.SYNC_SUCCEEDED
    with pytest.raises(wsync.errors.InvalidArgument, match="negative wait_ms"):
        client._rpc("Sync", wsync._proto.controller_pb2.SyncRequest(
            transfer="weights", version=3, wait_ms=-1))
    client.close()


@pytest.mark.asyncio
async def test_async_sync_with_wait(cluster):
    client, spec, full, params, regs, receivers = setup_transfer(cluster)
    client.define_transfer("weights", spec)
    client.close()
    import wsync.aio
    async with wsync.aio.Client(cluster.address, timeout=20) as ac:
        handle = await ac.sync(1, transfer="weights", wait=60)
        assert handle.status.phase == wsync._proto.controller_pb2.SYNC_SUCCEEDED
        assert (await handle.wait(timeout=60)).version == 1
