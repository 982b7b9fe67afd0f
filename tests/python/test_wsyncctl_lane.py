"""`wsyncctl sync --lane` (or WSYNC_CONTROLLER_LANE): the Sync goes over the
controller's control fast lane, with the same answer, exit code and errors
as over gRPC; a lane that does not carry it (absent, refusing connections,
its waits full) warns once and the call goes over gRPC, unless
--lane-required. The Python clients fall back on full waits too. Real
controller and workers reporting on the lane."""
import asyncio
import importlib.util
import json
import os
import signal
import socket
import subprocess
import threading
import time
import warnings

import pytest

import wsync
import wsync.aio
from wsync import _lane
from wsync._proto import controller_pb2 as pb

from harness import WSYNCCTL_BIN, freeze
from lane_setup import (TRAINER, lane_cluster, lane_cluster_with, ready,  # noqa: F401,F811
                        unreachable_address)


def ctl(address, *args, env=None):
    return subprocess.run([WSYNCCTL_BIN, "sync", f"--controller={address}", "--insecure",
                           f"--token={TRAINER}", *args], capture_output=True, text=True,
                          timeout=60, env={**os.environ, **(env or {})})


def test_wsyncctl_sync_over_the_lane(lane_cluster):
    _, regs = ready(lane_cluster)  # noqa: F841
    far = unreachable_address()  # gRPC cannot reach the controller: only the lane can
    ok = ctl(far, "t", "1", "--wait", "--json", f"--lane={lane_cluster.lane}")
    assert ok.returncode == 0, ok.stdout + ok.stderr
    status = json.loads(ok.stdout)
    assert status["phase"] == "SYNC_SUCCEEDED" and status["round_trip_ms"] > 0
    by_env = ctl(far, "t", "2", "--wait", env={"WSYNC_CONTROLLER_LANE": lane_cluster.lane})
    assert by_env.returncode == 0 and "SUCCEEDED" in by_env.stdout, by_env.stdout + by_env.stderr
    older = ctl(far, "t", "1", "--wait", f"--lane={lane_cluster.lane}")
    assert older.returncode == 1
    assert "FAILED_PRECONDITION" in older.stderr and "(over the lane)" in older.stderr, older.stderr
    # An absent lane: a warning, then gRPC.
    absent = ctl(lane_cluster.address, "t", "3", "--wait", f"--lane={lane_cluster.lane}.absent")
    assert absent.returncode == 0, absent.stdout + absent.stderr
    assert "absent: No such file" in absent.stderr and "goes over gRPC" in absent.stderr
    logs = lane_cluster.logs()
    assert logs.count("reports over the control lane") == 3, logs


def dead_socket(path):
    """A socket file nothing listens on (connect: ECONNREFUSED)."""
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.bind(path)
    s.close()
    return path


def hold_the_lanes_waits(lane, sync_id, count):
    """`count` WaitSyncs on the lane (threads) until the lane holds them: its
    waits (--max_waiters=count) are all taken then. The threads."""
    def wait():
        _lane.LaneChannel(lane, TRAINER, "hold").call(
            "WaitSync", pb.WaitSyncRequest(sync_id=sync_id, timeout_ms=30000), 40)

    waiters = [threading.Thread(target=wait, daemon=True) for _ in range(count)]
    for w in waiters:
        w.start()
    # A Sync that would wait: refused unstarted while the waits are full,
    # else refused as version 1 is in flight (a probe that takes no wait).
    probe = _lane.LaneChannel(lane, TRAINER, "probe")
    for _ in range(100):
        try:
            with warnings.catch_warnings(record=True) as seen:
                warnings.simplefilter("always", RuntimeWarning)
                answer = probe.call("Sync", pb.SyncRequest(transfer="t", version=2,
                                                           wait_ms=1000), 5)
            if answer is None:  # not started, to go over gRPC
                assert any("waits already" in str(w.message) for w in seen), seen
                return waiters
        except wsync.FailedPrecondition:
            time.sleep(0.05)
    pytest.fail("the lane never held the waits")


def test_wsyncctl_falls_back_to_grpc_where_the_lane_refuses_unless_required():
    # The limit bounds the lane's waits and, apart, the gRPC waits (the
    # workers' rendezvous among them): 4 leaves those room.
    with lane_cluster_with("--max_waiters=4") as c:
        grpc_client, regs = ready(c)  # noqa: F841
        worker = c.workers["trainer:1:2"].proc
        freeze(worker)  # sync 1 runs until it thaws
        try:
            first = grpc_client.sync(1, transfer="t")
            waiters = hold_the_lanes_waits(c.lane, first.sync_id, 4)
            # The lane refuses a Sync that would wait (RESOURCE_EXHAUSTED,
            # not started): gRPC answers, here that version 1 is in flight.
            fell = ctl(c.address, "t", "2", "--wait=1s", f"--lane={c.lane}")
            assert fell.returncode == 1, fell.stdout + fell.stderr
            assert fell.stderr.count("goes over gRPC") == 1, fell.stderr
            assert "waits already" in fell.stderr and "in flight" in fell.stderr, fell.stderr
            assert "(over the lane)" not in fell.stderr, fell.stderr
            # Required: the lane's refusal, and no gRPC call.
            req = ctl(c.address, "t", "2", "--wait=1s", f"--lane={c.lane}", "--lane-required")
            assert req.returncode == 1, req.stdout + req.stderr
            assert "waits already" in req.stderr and "--lane-required" in req.stderr, req.stderr
            assert "in flight" not in req.stderr and "over gRPC" not in req.stderr, req.stderr
            # The Python clients, both lanes and asyncio, fall back the same
            # way: a warning, then gRPC's answer.
            impls = ["python"]
            if importlib.util.find_spec("wsync._native") is not None:
                impls.append("native")
            for impl in impls:
                with wsync.Client(c.address, timeout=10, token=TRAINER, lane=c.lane,
                                  lane_impl=impl) as client:
                    with pytest.warns(RuntimeWarning, match="waits already"):
                        with pytest.raises(wsync.FailedPrecondition, match="in flight"):
                            client.sync(2, transfer="t", wait=1)

            async def aio_sync():
                async with wsync.aio.Client(c.address, timeout=10, token=TRAINER,
                                            lane=c.lane) as client:
                    await client.sync(2, transfer="t", wait=1)

            with pytest.warns(RuntimeWarning, match="waits already"):
                with pytest.raises(wsync.FailedPrecondition, match="in flight"):
                    asyncio.run(aio_sync())
        finally:
            os.kill(worker.pid, signal.SIGCONT)
        assert first.wait(timeout=30, show_progress=False).phase == pb.SYNC_SUCCEEDED
        for w in waiters:
            w.join(timeout=30)
        # A socket that refuses connections: gRPC carries it, or, required, nothing.
        dead = dead_socket(os.path.join(c.dir, "dead.sock"))
        req = ctl(c.address, "t", "2", "--wait", f"--lane={dead}", "--lane-required")
        assert req.returncode == 1 and "Connection refused" in req.stderr, req.stderr
        assert grpc_client.transfer_status("t").last_success_version == 1
        fell = ctl(c.address, "t", "2", "--wait", f"--lane={dead}")
        assert fell.returncode == 0 and "SUCCEEDED" in fell.stdout, fell.stdout + fell.stderr
        assert fell.stderr.count("goes over gRPC") == 1, fell.stderr
        # Usage: --lane-required without --lane.
        assert ctl(c.address, "t", "3", "--lane-required").returncode == 2
