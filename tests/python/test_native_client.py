"""wsync.Client's unary calls through gRPC C++ (wsync._native.client) give
the same answers and the same exceptions as through grpcio: a real
controller and workers, each call made both ways."""
import os
import signal
import socket
import time

import grpc
import pytest
import torch

import wsync
import wsync.torch
from wsync import _channel
from wsync._proto import controller_pb2 as pb

from harness import freeze
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
    # timeout=None is no deadline (grpcio's meaning), not a TypeError.
    with pytest.raises(wsync.Unavailable):
        wsync.Client(f"127.0.0.1:{port}", timeout=None).status()
    # A huge timeout is "no limit", not an overflow; the call still fails
    # at once on a refused connection.
    with pytest.raises(native.client.RpcError) as refused:
        c._native.call("/wsync.v1.TrainerService/GetStatus", b"", 1e300, 1e300)
    assert refused.value.args[0] == grpc.StatusCode.UNAVAILABLE.value[0]
    with pytest.raises(ValueError):
        c._native.call("/wsync.v1.TrainerService/GetStatus", b"", -1.0)
    with pytest.raises(ValueError):
        c._native.call("/wsync.v1.TrainerService/GetStatus", b"", float("nan"))


def test_wait_past_the_call_timeout_is_deadline_exceeded(cluster, ranks):  # noqa: F811
    fast = client_for(cluster)
    register_all(ranks)
    fast.define_transfer("t", spec_of())
    with pytest.raises(wsync.NotFound):
        fast._native_rpc("WaitSync", pb.WaitSyncRequest(sync_id="no-such-sync", timeout_ms=5000),
                         0.2)
    proc = cluster.workers["trainer:1:2"].proc
    freeze(proc)
    try:
        handle = fast.sync(1, deadline=60)
        # The controller would wait 5 s; the call's own deadline ends it
        # first, sleeping or spinning.
        for spin in (0.0, 0.3):
            fast.busy_wait = spin > 0
            t = time.monotonic()
            with pytest.raises(wsync.DeadlineExceeded):
                fast._native_rpc("WaitSync", pb.WaitSyncRequest(sync_id=handle.sync_id,
                                                                timeout_ms=5000), 0.3)
            assert time.monotonic() - t < 3
        handle.cancel("test")
    finally:
        os.kill(proc.pid, signal.SIGCONT)


def test_tls_and_token_reach_the_native_channel(tmp_path):
    # The channel is built from the same arguments as grpcio's: a CA file
    # that does not exist fails the same way for both (before any call).
    with pytest.raises(FileNotFoundError):
        _channel.open_native("127.0.0.1:1", str(tmp_path / "missing-ca.pem"), "tok", ())
    with pytest.raises(TypeError):
        _channel.open_native("127.0.0.1:1", False, None, (("grpc.some_option", 1.5),))


def test_busy_wait_spins_only_on_sync_calls_and_gives_the_same_answers(cluster, ranks,  # noqa: F811
                                                                      monkeypatch):
    register_all(ranks)
    spinning = wsync.Client(cluster.address, timeout=10, busy_wait=True)
    assert spinning.busy_wait
    spinning.wait_for_workers({"trainer": 2, "inference": 1}, timeout=30)
    spinning.define_transfer("t", spec_of())
    calls = []
    real = spinning._native

    class Spy:
        def call(self, method, request, timeout, spin=0.0):
            calls.append((method.rsplit("/", 1)[1], spin))
            return real.call(method, request, timeout, spin)

    spinning._native = Spy()
    for v in (1, 2):
        s = spinning.sync(v, transfer="t", wait=30).wait(timeout=30, show_progress=False)
        assert s.phase == pb.SYNC_SUCCEEDED
    spinning.status()
    assert [m for m, spin in calls if spin > 0] == ["Sync", "Sync"]
    assert [m for m, spin in calls if spin == 0] == ["GetStatus"]
    # The environment switches it on; without the extension it is off.
    monkeypatch.setenv("WSYNC_CLIENT_BUSY_WAIT", "1")
    assert wsync.Client(cluster.address).busy_wait
    assert not wsync.Client(cluster.address, channel=grpc.insecure_channel("x:1")).busy_wait
    with pytest.raises(ValueError):
        real.call("/wsync.v1.TrainerService/GetStatus", b"", 1.0, -1.0)


def test_ctrl_c_cancels_a_native_call_and_no_timeout_means_none():
    # A listener that accepts and never answers: the call would wait its
    # whole timeout; a signal's exception ends it at the next check (100 ms).
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen(1)
        port = server.getsockname()[1]
        c = wsync.Client(f"127.0.0.1:{port}", timeout=30)  # finite: a regression fails, not hangs

        class Interrupted(Exception):
            pass

        def on_alarm(signum, frame):
            raise Interrupted()

        old = signal.signal(signal.SIGALRM, on_alarm)
        try:
            for busy in (False, True):
                c.busy_wait = busy
                signal.setitimer(signal.ITIMER_REAL, 0.3)
                t = time.monotonic()
                with pytest.raises(Interrupted):
                    c._rpc("WaitSync", pb.WaitSyncRequest(sync_id="x", timeout_ms=1))
                assert time.monotonic() - t < 5  # the signal, not the 30 s timeout

        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, old)
