"""wsync.Client(lane=...) through the native client: sync() and wait() over
the controller's control fast lane (--lane_socket), the workers reporting on
it too (--controller_lane); the same answers and exceptions as over gRPC; an
absent lane falls back to gRPC with a RuntimeWarning. Real controller and
workers."""
import warnings

import pytest
import torch

import wsync
import wsync.torch
from wsync._proto import controller_pb2 as pb

from lane_setup import (READER, TRAINER, assert_falls_back_to_grpc_once,  # noqa
                        assert_workers_reported_over_the_lane, lane_cluster, ready,
                        unreachable_address)
from test_errors import W

native = pytest.importorskip("wsync._native")


def test_sync_and_wait_go_over_the_lane(lane_cluster):
    dest = {W: torch.zeros(8, 4)}
    _, regs = ready(lane_cluster, dest)  # noqa: F841 (kept registered)
    # gRPC cannot reach the controller from this client: only the lane can.
    lane_client = wsync.Client(unreachable_address(), timeout=10, token=TRAINER,
                               lane=lane_cluster.lane)
    assert lane_client.lane == lane_cluster.lane
    status = lane_client.sync(1, transfer="t", wait=30).wait(timeout=30, show_progress=False)
    assert status.phase == pb.SYNC_SUCCEEDED, status.error
    assert torch.equal(dest[W][:4], torch.zeros(4, 4))
    assert torch.equal(dest[W][4:], torch.ones(4, 4))
    # wait() of a sync started without waiting: WaitSync over the lane.
    handle = lane_client.sync(2, transfer="t")
    assert handle.wait(timeout=30, show_progress=False).phase == pb.SYNC_SUCCEEDED
    # busy_wait spins on the socket; same answer.
    spinning = wsync.Client(unreachable_address(), timeout=10, token=TRAINER,
                            lane=lane_cluster.lane, busy_wait=True)
    assert spinning.sync(3, transfer="t", wait=30).wait(
        timeout=30, show_progress=False).phase == pb.SYNC_SUCCEEDED
    assert_workers_reported_over_the_lane(lane_cluster)


def test_the_same_exceptions_as_over_grpc(lane_cluster):
    grpc_client, regs = ready(lane_cluster)  # noqa: F841
    grpc_client.sync(2, transfer="t", wait=30).wait(timeout=30, show_progress=False)
    far = unreachable_address()
    with pytest.raises(wsync.Unauthenticated) as e:
        wsync.Client(far, timeout=10, lane=lane_cluster.lane).sync(3, transfer="t", wait=10)
    assert "Sync: no credentials" in e.value.message
    with pytest.raises(wsync.PermissionDenied) as e:
        wsync.Client(far, timeout=10, token=READER, lane=lane_cluster.lane).sync(
            3, transfer="t", wait=10)
    assert "needs role trainer" in e.value.message
    lane_client = wsync.Client(far, timeout=10, token=TRAINER, lane=lane_cluster.lane)
    errs = []
    for client in (lane_client, grpc_client):
        with pytest.raises(wsync.FailedPrecondition) as older:
            client.sync(1, transfer="t", wait=10)
        errs.append((type(older.value), older.value.message))
        with pytest.raises(wsync.NotFound) as missing:
            client.sync(3, transfer="nope", wait=10)
        assert "nope" in missing.value.message
    assert errs[0] == errs[1]


def test_an_absent_lane_warns_and_calls_go_over_grpc(lane_cluster):
    _, regs = ready(lane_cluster)  # noqa: F841
    client = wsync.Client(lane_cluster.address, timeout=10, token=TRAINER,
                          lane=lane_cluster.lane + ".absent")
    assert_falls_back_to_grpc_once(client, "absent.*calls go over gRPC")


def test_the_lane_comes_from_the_environment(lane_cluster, monkeypatch):
    monkeypatch.setenv("WSYNC_CONTROLLER_LANE", lane_cluster.lane)
    client = wsync.Client(lane_cluster.address)
    assert (client.lane, client.lane_impl) == (lane_cluster.lane, "native")
    monkeypatch.setenv("WSYNC_LANE_IMPL", "python")  # forced, for A/B
    assert wsync.Client(lane_cluster.address).lane_impl == "python"
    monkeypatch.setenv("WSYNC_LANE_IMPL", "carrier-pigeon")
    with pytest.raises(ValueError, match="carrier-pigeon"):
        wsync.Client(lane_cluster.address)
    monkeypatch.delenv("WSYNC_LANE_IMPL")
    # Without the native client the pure-Python lane speaks (before: the
    # lane was dropped with a warning); forcing the native one is an error.
    monkeypatch.setenv("WSYNC_NATIVE_CLIENT", "0")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert wsync.Client(lane_cluster.address).lane_impl == "python"
    with pytest.raises(ValueError, match="needs the wsync._native client"):
        wsync.Client(lane_cluster.address, lane_impl="native")
