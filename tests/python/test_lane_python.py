"""The pure-Python control fast lane (wsync._lane; wsync.Client(lane=,
lane_impl="python"), the one used without wsync._native): Sync and WaitSync
over the controller's --lane_socket against a real controller and real
workers reporting on the lane; the same answers and exceptions as over gRPC;
fallbacks (absent lane, a listener of another user, the controller's
refusal, a request over the limit) warn and go over gRPC; answers over the
limit, a trainer that leaves mid-sync, an interrupted wait."""
import importlib.util
import os
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
import warnings

import pytest
import torch

import wsync
import wsync.torch
from wsync import _lane
from wsync._proto import controller_pb2 as pb
from wsync.v1 import lane_pb2

from harness import freeze
from lane_setup import (READER, TRAINER, assert_falls_back_to_grpc_once,  # noqa
                        assert_workers_reported_over_the_lane, lane_cluster, ready,
                        unreachable_address)
from test_errors import W


def py_client(address, lane, **kw):
    return wsync.Client(address, timeout=10, lane=lane, lane_impl="python", **kw)


def test_request_frames_are_the_lane_request_bytes():
    req = pb.SyncRequest(transfer="weights", version=7, wait_ms=60000)
    for call_id in (1, 127, 128, 300, 2**40):
        for token in ("", "tok", "x" * 200):
            for method, (tag, _) in _lane.CALLS.items():
                sub = req if method == "Sync" else pb.WaitSyncRequest(sync_id="s-1", timeout_ms=5)
                frame = _lane.encode_request(call_id, _lane.token_field(token), tag,
                                             sub.SerializeToString())
                want = lane_pb2.LaneRequest(call_id=call_id, token=token)
                getattr(want, "sync" if method == "Sync" else "wait_sync").CopyFrom(sub)
                body = want.SerializeToString()
                assert frame == struct.pack("<I", len(body)) + body
    # call_id 1, no token: 7 bytes of LaneRequest around a payload of 4-byte length.
    at_limit = _lane.encode_request(1, b"", _lane.CALLS["Sync"][0],
                                    b"x" * (_lane.MAX_REQUEST_BYTES - 7))
    assert len(at_limit) == 4 + _lane.MAX_REQUEST_BYTES
    assert _lane.encode_request(1, b"", _lane.CALLS["Sync"][0],
                                b"x" * (_lane.MAX_REQUEST_BYTES - 6)) is None


def test_listener_check_with_crafted_credentials():
    me = os.geteuid()
    other = me + 4242 if me != 0 else 4242
    cred = struct.pack("iII", 123, other, other)
    why = _lane.untrusted_listener("/x/lane.sock", cred, euid=me if me != 0 else 1000)
    assert f"served by uid {other}" in why and "not trusted" in why
    assert _lane.untrusted_listener("/x", struct.pack("iII", 1, 0, 0), euid=1000) is None
    assert _lane.untrusted_listener("/x", struct.pack("iII", 1, 1000, 5), euid=1000) is None
    assert "not a struct ucred" in _lane.untrusted_listener("/x", b"\0" * 4, euid=1000)


def test_sync_and_wait_over_the_python_lane(lane_cluster, monkeypatch):
    dest = {W: torch.zeros(8, 4)}
    _, regs = ready(lane_cluster, dest)  # noqa: F841 (kept registered)
    # gRPC cannot reach the controller from these clients: only the lane can.
    client = py_client(unreachable_address(), lane_cluster.lane, token=TRAINER)
    assert client.lane_impl == "python"
    status = client.sync(1, transfer="t", wait=30).wait(timeout=30, show_progress=False)
    assert status.phase == pb.SYNC_SUCCEEDED, status.error
    assert torch.equal(dest[W][:4], torch.zeros(4, 4))
    assert torch.equal(dest[W][4:], torch.ones(4, 4))
    dest[W].fill_(-1)
    handle = client.sync(2, transfer="t")  # wait(): WaitSync over the lane
    assert handle.wait(timeout=30, show_progress=False).phase == pb.SYNC_SUCCEEDED
    assert torch.equal(dest[W], torch.cat([torch.zeros(4, 4), torch.ones(4, 4)]))
    assert handle.poll().phase == pb.SYNC_SUCCEEDED
    spinning = py_client(unreachable_address(), lane_cluster.lane, token=TRAINER,
                         busy_wait=True)
    assert spinning.busy_wait
    assert spinning.sync(3, transfer="t", wait=30).wait(
        timeout=30, show_progress=False).phase == pb.SYNC_SUCCEEDED
    # Without the native client (auto): the pure-Python lane.
    monkeypatch.setenv("WSYNC_NATIVE_CLIENT", "0")
    plain = wsync.Client(unreachable_address(), timeout=10, token=TRAINER, lane=lane_cluster.lane)
    assert plain.lane_impl == "python"
    assert plain.sync(4, transfer="t", wait=30).wait(
        timeout=30, show_progress=False).phase == pb.SYNC_SUCCEEDED
    assert_workers_reported_over_the_lane(lane_cluster)


def test_the_same_exceptions_as_over_grpc(lane_cluster):
    grpc_client, regs = ready(lane_cluster)
    grpc_client.sync(2, transfer="t", wait=30).wait(timeout=30, show_progress=False)
    far = unreachable_address()
    with pytest.raises(wsync.Unauthenticated, match="Sync: no credentials"):
        py_client(far, lane_cluster.lane).sync(3, transfer="t", wait=10)
    with pytest.raises(wsync.PermissionDenied, match="needs role trainer"):
        py_client(far, lane_cluster.lane, token=READER).sync(3, transfer="t", wait=10)
    lane_client = py_client(far, lane_cluster.lane, token=TRAINER)
    got = []
    for client in (lane_client, grpc_client):
        with pytest.raises(wsync.FailedPrecondition) as older:
            client.sync(1, transfer="t", wait=10)
        with pytest.raises(wsync.NotFound) as missing:
            client.sync(3, transfer="nope", wait=10)
        with pytest.raises(wsync.NotFound) as no_sync:
            wsync.SyncHandle(client, "t", 9, pb.SyncResponse(sync_id="no-such-sync")).wait(5)
        got.append([(type(e.value), e.value.message) for e in (older, missing, no_sync)])
    assert got[0] == got[1]
    # A failed sync: SyncFailed naming the failed group and rank, as over gRPC.
    lane_cluster.workers["trainer:1:2"].stop(signal.SIGKILL)
    with pytest.raises(wsync.WsyncError) as failed:
        lane_client.sync(3, transfer="t", wait=30).wait(timeout=30, show_progress=False)
    assert (failed.value.group, failed.value.rank) == ("trainer", 1), str(failed.value)


def test_an_absent_lane_warns_and_calls_go_over_grpc(lane_cluster):
    _, regs = ready(lane_cluster)  # noqa: F841
    client = py_client(lane_cluster.address, lane_cluster.lane + ".absent", token=TRAINER)
    assert_falls_back_to_grpc_once(client, "absent: No such file.*calls go over gRPC")


class FakeLane:
    """A listener of this user at `path` answering each connection with
    `answer(request_bytes)` (bytes to write, then it closes)."""

    def __init__(self, path, answer, hold=0.0):
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.bind(path)
        self.sock.listen(4)
        self.answer = answer
        self.hold = hold  # seconds the connection stays open after the answer
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self):
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            with conn:
                data = conn.recv(1 << 16)
                conn.sendall(self.answer(data))
                time.sleep(self.hold)

    def close(self):
        self.sock.shutdown(socket.SHUT_RDWR)
        self.sock.close()


def frame(resp):
    body = resp.SerializeToString()
    return struct.pack("<I", len(body)) + body


def test_answers_over_the_limit_and_refusals(lane_cluster, tmp_path):
    _, regs = ready(lane_cluster)  # noqa: F841
    over = FakeLane(str(tmp_path / "over.sock"),
                    lambda _: struct.pack("<I", _lane.MAX_RESPONSE_BYTES + 1) + b"\0" * 64)
    client = py_client(lane_cluster.address, str(tmp_path / "over.sock"), token=TRAINER)
    with pytest.raises(wsync.Unavailable, match="announces 268435457 bytes, over the limit"):
        client.sync(1, transfer="t", wait=10)
    over.close()
    # The controller's refusal of a connection (call_id 0): nothing was run,
    # the call goes over gRPC.
    refusal = lane_pb2.LaneResponse(call_id=0, code=7, message="only the controller's user")
    no = FakeLane(str(tmp_path / "no.sock"), lambda _: frame(refusal))
    client = py_client(lane_cluster.address, str(tmp_path / "no.sock"), token=TRAINER)
    with pytest.warns(RuntimeWarning, match="refused the connection: only the controller's user"):
        status = client.sync(1, transfer="t", wait=30).wait(timeout=30, show_progress=False)
    assert status.phase == pb.SYNC_SUCCEEDED
    no.close()
    # The native lane reads the refusal the same way (LaneClient::refused).
    if importlib.util.find_spec("wsync._native") is not None:
        no = FakeLane(str(tmp_path / "no2.sock"), lambda _: frame(refusal))
        client = wsync.Client(lane_cluster.address, timeout=10, token=TRAINER,
                              lane=str(tmp_path / "no2.sock"), lane_impl="native")
        with pytest.warns(RuntimeWarning,
                          match="refused the connection: only the controller's user"):
            status = client.sync(2, transfer="t", wait=30).wait(timeout=30, show_progress=False)
        assert status.phase == pb.SYNC_SUCCEEDED
        no.close()
    # A request over the lane's 16 MiB: refused before a byte is written,
    # the call goes over gRPC (unreachable here: gRPC's own error).
    seen = []
    quiet = FakeLane(str(tmp_path / "quiet.sock"), lambda data: seen.append(data) or b"")
    far = unreachable_address()
    client = py_client(far, str(tmp_path / "quiet.sock"), token=TRAINER)
    client.timeout = 2
    with pytest.warns(RuntimeWarning, match="over the lane's limit of 16777216 bytes"):
        with pytest.raises(wsync.Unavailable, match=f"controller {far}"):
            client.sync(2, transfer="t" * (17 << 20), wait=1)
    quiet.close()
    assert seen in ([], [b""]), "the lane got bytes of a request over its limit"
    # The controller refuses a frame over its limit from a raw peer.
    raw = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    raw.connect(lane_cluster.lane)
    raw.sendall(struct.pack("<I", _lane.MAX_REQUEST_BYTES + 1))
    raw.settimeout(10)
    frames = _lane.Frames()
    while (resp := frames.take()) is None:
        n = raw.recv_into(frames.free())
        assert n > 0
        frames.have += n
    assert resp.call_id == 0 and "over the limit of 16777216" in resp.message
    raw.close()


def test_a_silent_lane_times_out_and_a_lost_connection_is_unavailable(tmp_path):
    silent = FakeLane(str(tmp_path / "silent.sock"), lambda _: b"", hold=5)
    client = py_client(unreachable_address(), str(tmp_path / "silent.sock"), token=TRAINER)
    t0 = time.monotonic()
    with pytest.raises(wsync.DeadlineExceeded):
        client._rpc("WaitSync", pb.WaitSyncRequest(sync_id="s", timeout_ms=1), timeout=0.3)
    assert 0.25 < time.monotonic() - t0 < 3
    assert client._lane._sock is None  # a late answer would come out of turn
    silent.close()
    # Closed after the request was written: the call may have run, so no
    # second try over gRPC: Unavailable.
    closing = FakeLane(str(tmp_path / "closing.sock"), lambda _: b"")
    client = py_client(unreachable_address(), str(tmp_path / "closing.sock"), token=TRAINER)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(wsync.Unavailable, match="the controller closed the connection"):
            client.sync(1, transfer="t", wait=1)
    closing.close()


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to serve a socket as another uid")
def test_a_listener_of_another_user_is_refused(lane_cluster):
    _, regs = ready(lane_cluster)  # noqa: F841
    d = tempfile.mkdtemp(prefix="wsync-nobody-")
    os.chmod(d, 0o777)
    path = os.path.join(d, "lane.sock")
    nobody = subprocess.Popen([sys.executable, "-c", (
        "import os, socket, time\n"
        "os.setgid(65534); os.setuid(65534)\n"
        f"s = socket.socket(socket.AF_UNIX); s.bind({path!r}); s.listen(4)\n"
        "print('listening', flush=True)\n"
        "time.sleep(60)\n")], stdout=subprocess.PIPE)
    try:
        assert nobody.stdout.readline() == b"listening\n"
        client = py_client(lane_cluster.address, path, token=TRAINER)
        with pytest.warns(RuntimeWarning, match="served by uid 65534, not by this user"):
            status = client.sync(1, transfer="t", wait=30).wait(timeout=30, show_progress=False)
        assert status.phase == pb.SYNC_SUCCEEDED  # over gRPC; the token never went there
    finally:
        nobody.kill()
        nobody.wait()


def test_a_trainer_leaving_mid_sync(lane_cluster):
    grpc_client, regs = ready(lane_cluster)
    worker = lane_cluster.workers["trainer:1:2"].proc
    freeze(worker)  # the sync cannot end while the trainer waits
    trainer = subprocess.Popen([sys.executable, "-c", (
        "import wsync\n"
        f"c = wsync.Client('127.0.0.1:1', timeout=30, token={TRAINER!r}, "
        f"lane={lane_cluster.lane!r}, lane_impl='python')\n"
        "print('syncing', flush=True)\n"
        "c.sync(1, transfer='t', wait=60)\n")], stdout=subprocess.PIPE,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    try:
        assert trainer.stdout.readline() == b"syncing\n"
        end = time.monotonic() + 20
        while grpc_client.transfer_status("t").in_flight_version != 1:
            assert time.monotonic() < end, "the sync did not start"
            time.sleep(0.02)
        trainer.kill()
        trainer.wait()
    finally:
        os.kill(worker.pid, signal.SIGCONT)
    # The sync goes on and ends; the controller serves the next trainer.
    end = time.monotonic() + 30
    while grpc_client.transfer_status("t").last_success_version != 1:
        assert time.monotonic() < end, grpc_client.transfer_status("t")
        time.sleep(0.02)
    client = py_client(unreachable_address(), lane_cluster.lane, token=TRAINER)
    assert client.sync(2, transfer="t", wait=30).wait(
        timeout=30, show_progress=False).phase == pb.SYNC_SUCCEEDED


def test_an_interrupted_wait_drops_the_connection(lane_cluster):
    grpc_client, regs = ready(lane_cluster)
    client = py_client(unreachable_address(), lane_cluster.lane, token=TRAINER)
    worker = lane_cluster.workers["trainer:1:2"].proc
    freeze(worker)

    def interrupt(*_):
        raise KeyboardInterrupt

    old = signal.signal(signal.SIGALRM, interrupt)
    try:
        handle = client.sync(1, transfer="t")
        signal.setitimer(signal.ITIMER_REAL, 0.3)
        with pytest.raises(KeyboardInterrupt):
            handle.wait(timeout=20, show_progress=False)
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)
        os.kill(worker.pid, signal.SIGCONT)
    assert client._lane._sock is None  # its answer would have come out of turn
    assert handle.wait(timeout=30, show_progress=False).phase == pb.SYNC_SUCCEEDED
    with pytest.raises(wsync.DeadlineExceeded, match="still running"):
        freeze(worker)
        try:
            client.sync(2, transfer="t").wait(timeout=0.3, show_progress=False)
        finally:
            os.kill(worker.pid, signal.SIGCONT)


def test_closing_the_client_ends_a_call_in_progress_at_once(tmp_path):
    """close() from another thread while a call waits on a silent lane: the
    call ends with Unavailable at once and close() does not wait out the
    call's deadline (it held the connection's lock)."""
    silent = FakeLane(str(tmp_path / "silent.sock"), lambda _: b"", hold=30)
    client = py_client(unreachable_address(), str(tmp_path / "silent.sock"), token=TRAINER)
    raised = []

    def wait():
        try:
            client._rpc("WaitSync", pb.WaitSyncRequest(sync_id="s", timeout_ms=1), timeout=20)
        except Exception as e:  # noqa: BLE001 - recorded and checked below
            raised.append(e)

    caller = threading.Thread(target=wait)
    caller.start()
    time.sleep(0.3)  # the request is written, the call waits for its answer
    t0 = time.monotonic()
    client.close()
    caller.join(timeout=5)
    assert not caller.is_alive(), "the call still waits after close()"
    assert time.monotonic() - t0 < 3
    assert len(raised) == 1 and isinstance(raised[0], wsync.Unavailable), raised
    silent.close()
