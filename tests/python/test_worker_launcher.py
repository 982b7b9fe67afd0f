"""python -m wsync.worker: memberships from RANK / WORLD_SIZE / LOCAL_RANK,
and a real worker started that way that serves a sync."""
import os
import subprocess
import sys

import pytest
import torch

import wsync
import wsync.torch
from wsync import worker

from harness import WORKER_BIN, read_port_file


def cmd(argv, env):
    return worker.command(worker.parse(argv), dict(env, WSYNC_WORKER_BIN="/bin/wsync-worker"))


def test_rank_and_size_from_torchrun_environment():
    assert cmd(["--group", "trainer"], {"RANK": "3", "WORLD_SIZE": "8"}) == [
        "/bin/wsync-worker", "--groups=trainer:3:8"]
    assert cmd(["--group", "trainer", "--group", "inference:4", "--device", "local", "--",
                "--node=n1"], {"RANK": "1", "WORLD_SIZE": "8", "LOCAL_RANK": "1"}) == [
        "/bin/wsync-worker", "--groups=trainer:1:8,inference:1:4", "--device=1", "--node=n1"]
    assert cmd(["--group", "t:2"], {"JOB_COMPLETION_INDEX": "1"})[1] == "--groups=t:1:2"
    assert cmd(["--group", "t", "--rank", "0", "--world_size", "1"], {})[1] == "--groups=t:0:1"


@pytest.mark.parametrize("argv,env,match", [
    (["--group", "t"], {"WORLD_SIZE": "2"}, "no rank"),
    (["--group", "t"], {"RANK": "0"}, "no size"),
    (["--group", "t:2"], {"RANK": "2"}, "outside group t of size 2"),
    (["--group", "t"], {"RANK": "x", "WORLD_SIZE": "2"}, "not an integer"),
    (["--group", "t:2", "--device", "local"], {"RANK": "0"}, "LOCAL_RANK")])
def test_bad_environment(argv, env, match):
    with pytest.raises(SystemExit, match=match):
        cmd(argv, env)


def test_launched_worker_serves_a_sync(cluster, tmp_path):
    procs = []
    socks = {}
    try:
        for group, rank in (("trainer", 0), ("inference", 0)):
            sock = str(tmp_path / f"{group}.sock")
            env = dict(os.environ, RANK=str(rank), WORLD_SIZE="1", WSYNC_WORKER_BIN=WORKER_BIN,
                       WSYNC_CONTROLLER=cluster.address, WSYNC_LOCAL_SOCKET=sock,
                       WSYNC_METRICS_PORT="-1", WSYNC_PORT_FILE=str(tmp_path / f"{group}.ports"))
            procs.append(subprocess.Popen([sys.executable, "-m", "wsync.worker", "--group", group],
                                          env=env, stdout=subprocess.DEVNULL,
                                          stderr=subprocess.DEVNULL))
            read_port_file(str(tmp_path / f"{group}.ports"), "local_socket", proc=procs[-1])
            socks[group] = sock
        src = {"w": torch.arange(6.)}
        dst = {"w": torch.zeros(6)}
        wsync.torch.register(src, group="trainer", rank=0, socket=socks["trainer"])
        reg = wsync.torch.register(dst, group="inference", rank=0, socket=socks["inference"])
        client = wsync.Client(cluster.address, timeout=10)
        client.wait_for_workers({"trainer": 1, "inference": 1}, timeout=30, buffers=True)
        spec = {"source": {"name": "trainer", "tensors": [
                    {"name": "w", "dtype": "FP32", "shape": [6],
                     "mesh": {"meshShape": [1], "ranks": [0], "placements": [{"replicate": {}}]}}]},
                "destination": {"name": "inference", "tensors": [
                    {"name": "w", "dtype": "FP32", "shape": [6],
                     "mesh": {"meshShape": [1], "ranks": [0], "placements": [{"replicate": {}}]}}]}}
        client.define_transfer("t", spec)
        client.sync(1).wait(timeout=30)
        assert torch.equal(reg.tensors["w"], torch.arange(6.))
        status = wsync.torch.local_status(socks["inference"])
        assert status.registered and status.last_version == 1
    finally:
        for p in procs:
            p.terminate()
            p.wait(10)
