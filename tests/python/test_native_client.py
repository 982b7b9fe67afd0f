"""wsync.Client's unary calls through gRPC C++ (wsync._native.client) give
the same answers and the same exceptions as through grpcio: a real
controller and workers, each call made both ways."""
import socket

import grpc
import pytest
import torch

import wsync
import wsync.torch
from wsync import _channel
from wsync._proto import controller_pb2 as pb

from test_errors import client_for, ranks, register_all, spec_of  # noqa: F401 (fixture)

native = pytest.importorskip("wsync._native")


def both_clients(cluster):
    """(native, grpcio) clients of the same controller."""
    fast = client_for(cluster)
    slow = wsync.Client(cluster.address, timeout=10, channel=grpc.insecure_channel(
        cluster.address))
    return fast, slow


def test_client_uses_the_native_channel_unless_disabled(cluster, monkeypatch):
    assert wsync.Client(cluster.address)._native is not None
    monkeypatch.setenv("WSYNC_NATIVE_CLIENT", "0")
    assert wsync.Client(cluster.address)._native is None
    # A caller's own channel is used as given.
    monkeypatch.delenv("WSYNC_NATIVE_CLIENT")
    assert wsync.Client(cluster.address, channel=grpc.insecure_channel("x:1"))._native is None


def test_same_answers_both_ways(cluster, ranks):  # noqa: F811
    fast, slow = both_clients(cluster)
    register_all(ranks)
    fast.define_transfer("t", spec_of())
    status = fast.sync(1, transfer="t", wait=30).wait(timeout=30, show_progress=False)
    assert status.phase == pb.SYNC_SUCCEEDED
    again = slow._rpc("WaitSync", pb.WaitSyncRequest(sync_id=status.sync_id, timeout_ms=1))
    assert fast._rpc("WaitSync", pb.WaitSyncRequest(sync_id=status.sync_id,
                                                    timeout_ms=1)) == again
    assert [t.name for t in fast.status().transfers] == [t.name for t in slow.status().transfers]
    assert sorted(w.instance_id for w in fast.workers()) == sorted(
        w.instance_id for w in slow.workers())


def test_same_errors_both_ways(cluster, ranks):  # noqa: F811
    fast, slow = both_clients(cluster)
    register_all(ranks)
    fast.define_transfer("t", spec_of())
    fast.sync(2, transfer="t", wait=30).wait(timeout=30, show_progress=False)
    for client in (fast, slow):
        with pytest.raises(wsync.FailedPrecondition) as older:
            client.sync(1, transfer="t")
        assert "version" in older.value.message
        with pytest.raises(wsync.NotFound) as missing:
            client.sync(3, transfer="nope")
        assert "nope" in missing.value.message
    # Same class, same message, same member (none here), either way.
    errs = []
    for client in (fast, slow):
        try:
            client.sync(1, transfer="t")
        except wsync.WsyncError as e:
            errs.append((type(e), e.message, e.group, e.rank))
    assert errs[0] == errs[1]


def test_controller_down_and_timeouts_raise_named_errors():
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    c = wsync.Client(f"127.0.0.1:{port}", timeout=0.5)
    assert c._native is not None
    with pytest.raises(wsync.Unavailable) as down:
        c.status()
    assert f"controller 127.0.0.1:{port}" in str(down.value)
    with pytest.raises(ValueError):
        c._native.call("/wsync.v1.TrainerService/GetStatus", b"", -1.0)
    with pytest.raises(ValueError):
        c._native.call("/wsync.v1.TrainerService/GetStatus", b"", float("nan"))


def test_wait_past_the_call_timeout_is_deadline_exceeded(cluster, ranks):  # noqa: F811
    fast = client_for(cluster)
    register_all(ranks)
    fast.define_transfer("t", spec_of())
    s = fast.sync(1, transfer="t", wait=30).wait(timeout=30, show_progress=False)
    # A sync id that never ends: the controller waits timeout_ms; the call's
    # own deadline (0.2 s) ends it first.
    with pytest.raises(wsync.NotFound):
        fast._native_rpc("WaitSync", pb.WaitSyncRequest(sync_id="no-such-sync", timeout_ms=5000),
                         0.2)
    with pytest.raises(wsync.DeadlineExceeded):
        fast._native_rpc("WaitSync",
                         pb.WaitSyncRequest(sync_id=s.sync_id, timeout_ms=1), 1e-6)


def test_tls_and_token_reach_the_native_channel(tmp_path):
    # The channel is built from the same arguments as grpcio's: a CA file
    # that does not exist fails the same way for both (before any call).
    with pytest.raises(FileNotFoundError):
        _channel.open_native("127.0.0.1:1", str(tmp_path / "missing-ca.pem"), "tok", ())
    with pytest.raises(TypeError):
        _channel.open_native("127.0.0.1:1", False, None, (("grpc.some_option", 1.5),))
