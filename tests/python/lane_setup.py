"""A controller serving the control fast lane (--lane_socket, a tokens file)
and workers reporting on it (--controller_lane): trainer ranks 0-1 and one
inference rank, for the lane tests (test_lane*.py, test_wsyncctl_lane.py);
ready() registers their buffers and defines the transfer "t"."""
import contextlib
import os
import socket
import tempfile
import warnings

import pytest

import wsync
from wsync._proto import controller_pb2 as pb
from harness import Cluster
from test_errors import register_all, spec_of

TRAINER = "lane-trainer-token-0123456789"
READER = "lane-reader-token-0123456789"


@contextlib.contextmanager
def lane_cluster_with(*controller_flags):
    """The cluster, its controller given `controller_flags` too."""
    d = tempfile.mkdtemp(prefix="wsync-lane-")
    lane = os.path.join(d, "lane.sock")
    tokens = os.path.join(d, "tokens")
    with open(tokens, "w") as f:
        f.write(f"{TRAINER} trainer t\n{READER} reader r\n")
    c = Cluster(controller_flags=[f"--lane_socket={lane}", f"--tokens_file={tokens}",
                                  *controller_flags])
    try:
        socks = {r: c.worker(f"trainer:{r}:2", flags=[f"--controller_lane={lane}"])
                 for r in range(2)}
        socks["inference"] = c.worker("inference:0:1", flags=[f"--controller_lane={lane}"])
        c.lane = lane
        c.socks = socks
        yield c
    finally:
        c.close()


@pytest.fixture
def lane_cluster():
    with lane_cluster_with() as c:
        yield c


def unreachable_address():
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{s.getsockname()[1]}"


def ready(c, dest=None):
    """A gRPC client with the transfer "t" defined; the registrations (keep
    them: the buffers stay registered while they live)."""
    grpc_client = wsync.Client(c.address, timeout=10, token=TRAINER)
    grpc_client.wait_for_workers({"trainer": 2, "inference": 1}, timeout=30)
    regs = register_all(c.socks, dest=dest)
    grpc_client.define_transfer("t", spec_of())
    return grpc_client, regs


def assert_workers_reported_over_the_lane(c):
    """Each of the three workers bound its reports to the lane, and none fell
    back to gRPC."""
    logs = c.logs()
    assert logs.count("reports over the control lane") == 3, logs
    assert "reporting over gRPC" not in logs, logs


def assert_falls_back_to_grpc_once(client, match):
    """`client`'s lane does not carry its calls: its first sync warns
    (`match`) and goes over gRPC; the next one, within the 10 s before the
    lane is tried again, does not warn."""
    with pytest.warns(RuntimeWarning, match=match):
        status = client.sync(1, transfer="t", wait=30).wait(timeout=30, show_progress=False)
    assert status.phase == pb.SYNC_SUCCEEDED
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        client.sync(2, transfer="t", wait=30).wait(timeout=30, show_progress=False)
