"""The verify mode end to end on the host transport (docs/staging.md,
"Verify"): after the run (in place) or the commit (staged) every live
destination is compared with its source through the plan's buckets. A clean
sync verifies every bucket; a receiver whose live memory is corrupted after
the commit (the worker's test failpoint) is caught and named, and listed
uncommitted; with verify off no worker runs a verify pass."""
import pytest
import torch

import wsync
from wsync._proto import controller_pb2 as pb
from wsync.v1 import plan_pb2
from wsync import layouts, vllm

from harness import expected_destination, full_tensors
from models import TINY_LLAMA, trainer_tensors
from test_sync import TP, check_receivers, fsdp_params


def start(cluster, inference_flags=None, src_dtype=torch.bfloat16, dst_dtype=torch.bfloat16):
    """The tiny Llama, FSDP on 2 trainer ranks into vLLM TP=2 (test_sync.py),
    with extra flags for some inference ranks."""
    inference_flags = inference_flags or {}
    socks = {("trainer", r): cluster.worker(f"trainer:{r}:2") for r in range(2)}
    for r in range(TP):
        socks[("inference", r)] = cluster.worker(f"inference:{r}:{TP}",
                                                 flags=inference_flags.get(r, ()))
    shapes = {n: s for n, s, _ in trainer_tensors("tiny-llama")}
    full = full_tensors(shapes, src_dtype)
    params = {r: fsdp_params(full, r) for r in range(2)}
    spec = destination_spec(params, dst_dtype)
    for r in range(2):
        wsync.torch.register({n: p.to_local() for n, p in params[r].items()},
                             group="trainer", rank=r, socket=socks[("trainer", r)])
    receivers = []
    for r in range(TP):
        bufs = {b: torch.zeros(n, dtype=dst_dtype)
                for b, (_, n) in layouts.local_buffers(spec.destination, r).items()}
        receivers.append(wsync.torch.register(bufs, group="inference", rank=r,
                                              socket=socks[("inference", r)]))
    client = wsync.Client(cluster.address, timeout=20)
    client.wait_for_workers({"trainer": 2, "inference": TP}, timeout=30, buffers=True)
    return client, spec, full, receivers


def destination_spec(params, dst_dtype=torch.bfloat16):
    src = layouts.source_side(layouts.describe(params[0].items(), rank=0))
    dtype = {torch.bfloat16: "bf16", torch.float32: "fp32"}[dst_dtype]
    return layouts.transfer_spec(src, vllm.destination(TINY_LLAMA, tp=TP, dtype=dtype),
                                 name="tiny")


def first_buffer(rank):
    shapes = {n: s for n, s, _ in trainer_tensors("tiny-llama")}
    spec = destination_spec({0: fsdp_params(full_tensors(shapes, torch.bfloat16), 0)})
    return sorted(layouts.local_buffers(spec.destination, rank))[0]


def failed(handle):
    with pytest.raises(wsync.errors.SyncFailed) as e:
        handle.wait(timeout=60)
    return e.value.status


def plan_buckets(client):
    buckets = client.plan(full=True).plan.buckets
    return len(buckets), sum(b.bytes for b in buckets)


def test_a_clean_sync_verifies_every_bucket_and_verify_off_runs_no_pass(cluster):
    client, spec, full, receivers = start(cluster)
    for version, staging in ((1, "in_place"), (2, "host_shadow")):
        client.define_transfer("weights", spec, staging=staging, verify=True)
        n, nbytes = plan_buckets(client)
        st = client.sync(version).wait(timeout=60)
        assert st.phase == pb.SYNC_SUCCEEDED, st.error
        assert st.verify_passes == 2 + TP, staging  # every sender and receiver
        assert (st.verify_buckets, st.verify_bytes) == (n, nbytes), staging
        assert st.verify_not_verifiable == 0 and not st.not_verifiable
        assert not st.uncommitted
        check_receivers(spec, full, receivers)
    client.define_transfer("weights", spec, staging="host_shadow", verify=False)
    st = client.sync(3).wait(timeout=60)
    assert st.phase == pb.SYNC_SUCCEEDED, st.error
    assert st.verify_passes == 0, "verify off: no worker ran a verify pass"
    assert st.verify_buckets == 0


def test_a_receiver_corrupted_after_the_commit_is_caught_and_named(cluster, monkeypatch):
    target = f"inference/{first_buffer(1)}"
    with pytest.raises(RuntimeError, match="exited with 2"):
        # The failpoint is refused outside tests.
        cluster.worker("inference:9:10", flags=[f"--test_corrupt_after_sync={target}"])
    monkeypatch.setenv("WSYNC_TEST_FAILPOINTS", "1")
    client, spec, full, receivers = start(
        cluster, {1: [f"--test_corrupt_after_sync={target}"]})
    client.define_transfer("weights", spec, staging="host_shadow", verify=True)
    st = failed(client.sync(1))
    assert st.phase == pb.SYNC_FAILED
    assert st.error_code == 15  # DATA_LOSS
    assert st.commit_decided
    assert "inference/1" in st.error and "bucket " in st.error, st.error
    assert "tensor " in st.error and "must not serve" in st.error, st.error
    assert len(st.uncommitted) == 1 and "inference/1" in st.uncommitted[0], st.uncommitted
    assert st.failed_group == "inference" and st.failed_rank == 1
    # In place too: the run writes the live tensors, the corruption follows.
    client.define_transfer("weights", spec, staging="in_place", verify=True)
    st = failed(client.sync(2))
    assert st.phase == pb.SYNC_FAILED and st.error_code == 15, st.error
    assert "inference/1" in st.error and "must not serve" in st.error, st.error
    # Without verify the same corruption goes unseen: the comparison is real.
    client.define_transfer("weights", spec, staging="in_place", verify=False)
    st = client.sync(3).wait(timeout=60)
    assert st.phase == pb.SYNC_SUCCEEDED and st.verify_passes == 0


def test_pieces_cast_on_receive_are_counted_not_verifiable(cluster):
    # bf16 sources into fp32 destinations: the narrower wire dtype is bf16,
    # cast on the receiver, so those buckets cannot match the wire byte for
    # byte; each is counted and named, none claimed verified.
    client, spec, full, receivers = start(cluster, dst_dtype=torch.float32)
    client.define_transfer("weights", spec, verify=True)
    buckets = client.plan(full=True).plan.buckets
    cast = [b for b in buckets if b.transport == plan_pb2.TRANSPORT_NETWORK and
            any(p.wire_dtype != p.dst.dtype for p in b.pieces)]
    assert cast, "no bucket cast on receive: nothing to count"
    st = client.sync(1).wait(timeout=60)
    assert st.phase == pb.SYNC_SUCCEEDED, st.error
    assert st.verify_not_verifiable == len(cast)
    assert st.verify_buckets == len(buckets) - len(cast)
    assert st.not_verifiable, "named"
    for name in st.not_verifiable:
        assert "cast on receive from bf16 to fp32" in name and "tensor " in name, name
    for r, reg in enumerate(receivers):
        for b, w in expected_destination(spec, full, r, torch.float32).items():
            assert torch.equal(reg.tensors[b][:w.numel()], w), f"rank {r} buffer {b}"
