"""A controller serving the control fast lane (--lane_socket, a tokens file)
and workers reporting on it (--controller_lane): trainer ranks 0-1 and one
inference rank, for the lane tests (test_lane*.py)."""
import os
import socket
import tempfile

import pytest

from harness import Cluster

TRAINER = "lane-trainer-token-0123456789"
READER = "lane-reader-token-0123456789"


@pytest.fixture
def lane_cluster():
    d = tempfile.mkdtemp(prefix="wsync-lane-")
    lane = os.path.join(d, "lane.sock")
    tokens = os.path.join(d, "tokens")
    with open(tokens, "w") as f:
        f.write(f"{TRAINER} trainer t\n{READER} reader r\n")
    c = Cluster(controller_flags=[f"--lane_socket={lane}", f"--tokens_file={tokens}"])
    socks = {r: c.worker(f"trainer:{r}:2", flags=[f"--controller_lane={lane}"]) for r in range(2)}
    socks["inference"] = c.worker("inference:0:1", flags=[f"--controller_lane={lane}"])
    c.lane = lane
    c.socks = socks
    yield c
    c.close()


def unreachable_address():
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{s.getsockname()[1]}"
