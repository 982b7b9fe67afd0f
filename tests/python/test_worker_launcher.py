"""python -m wsync.worker: memberships from RANK / WORLD_SIZE / LOCAL_RANK,
and a real worker started that way that serves a sync."""
import os
import subprocess
import sys
import time

import pytest
import torch

import wsync
import wsync.torch
from wsync import worker

from harness import WORKER_BIN, read_port_file


LAUNCHER_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "JOB_COMPLETION_INDEX", "POD_NAME",
                 "HOSTNAME", "KUBERNETES_SERVICE_HOST")


def clean_env(**extra):
    """os.environ without launcher or WSYNC_* variables, plus `extra`."""
    env = {k: v for k, v in os.environ.items()
           if k not in LAUNCHER_VARS and not k.startswith("WSYNC_")}
    env.update(extra)
    return env


def cmd(argv, env):
    return worker.command(worker.parse(argv), dict(env, WSYNC_WORKER_BIN="/bin/wsync-worker"))


def test_groups_pass_through_for_the_worker_to_resolve():
    # The worker reads RANK / WORLD_SIZE itself: the launcher passes the names.
    assert cmd(["--group", "trainer"], {"RANK": "3", "WORLD_SIZE": "8"}) == [
        "/bin/wsync-worker", "--groups=trainer"]
    assert cmd(["--group", "trainer", "--group", "inference:4", "--device", "local", "--",
                "--node=n1"], {"LOCAL_RANK": "1"}) == [
        "/bin/wsync-worker", "--groups=trainer,inference:4", "--device=1", "--node=n1"]
    assert cmd(["--group", "t", "--world_size", "2"], {})[1] == "--groups=t:2"
    assert cmd(["--group", "t", "--rank", "0", "--world_size", "1"], {})[1] == "--groups=t:0:1"
    assert cmd(["--group", "t:4", "--rank", "3"], {})[1] == "--groups=t:3:4"
    assert cmd([], {"WSYNC_GROUP": "t"}) == ["/bin/wsync-worker"]


@pytest.mark.parametrize("argv,env,match", [
    (["--group", "t", "--rank", "0"], {}, "has no size"),
    (["--group", "t:2", "--rank", "2"], {}, "outside group t of size 2"),
    (["--group", "t:x"], {}, "'x' is not an integer"),
    (["--group", "t:1:2"], {}, "want NAME or NAME:SIZE"),
    (["--rank", "0"], {}, "need --group"),
    (["--group", "t:2", "--device", "local"], {}, "LOCAL_RANK"),
    (["--group", "t:2", "--device", "local"], {"LOCAL_RANK": "a"}, "not an integer")])
def test_bad_arguments(argv, env, match):
    with pytest.raises(SystemExit, match=match):
        cmd(argv, env)


def start_worker(cluster, tmp_path, name, env):
    """The real wsync-worker with no arguments: everything from `env`."""
    sock, pf = str(tmp_path / f"{name}.sock"), str(tmp_path / f"{name}.ports")
    log = open(tmp_path / f"{name}.log", "wb")
    env = dict(env, WSYNC_CONTROLLER=cluster.address, WSYNC_INSECURE="true", WSYNC_LOCAL_SOCKET=sock,
               WSYNC_METRICS_PORT="-1", WSYNC_PORT_FILE=pf)
    proc = subprocess.Popen([WORKER_BIN], env=env, stdout=log, stderr=subprocess.STDOUT)
    return proc, pf


def registered(client, group):
    """{rank: group size} of `group`'s registered workers."""
    out = {}
    for w in client.workers(group):
        for m in w.memberships:
            if m.group == group:
                out[m.rank] = m.group_size
    return out


def test_worker_binary_takes_group_and_rank_from_the_environment(cluster, tmp_path):
    """torchrun style (RANK / WORLD_SIZE / WSYNC_GROUP) and StatefulSet style
    (pod ordinal / WSYNC_GROUP_SIZE): each worker registers with the
    controller under the group and rank its environment gives."""
    workers = {
        "t1": clean_env(WSYNC_GROUP="trainer", RANK="1", WORLD_SIZE="2"),
        "t0": clean_env(WSYNC_GROUP="trainer", RANK="0", WORLD_SIZE="2"),
        "vllm-1": clean_env(WSYNC_GROUPS="inference", POD_NAME="vllm-1", WSYNC_GROUP_SIZE="2",
                            KUBERNETES_SERVICE_HOST="10.0.0.1"),
    }
    procs = []
    try:
        for name, env in workers.items():
            procs.append(start_worker(cluster, tmp_path, name, env))
        for proc, pf in procs:
            read_port_file(pf, "local_socket", proc=proc)
        client = wsync.Client(cluster.address, timeout=10)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            got = (registered(client, "trainer"), registered(client, "inference"))
            if got == ({0: 2, 1: 2}, {1: 2}):
                break
            time.sleep(0.05)
        assert got == ({0: 2, 1: 2}, {1: 2})
        log = open(tmp_path / "vllm-1.log", errors="replace").read()
        assert "group 'inference': rank 1 from POD_NAME=vllm-1, size 2 from WSYNC_GROUP_SIZE=2" \
            in log, log
    finally:
        for proc, _ in procs:
            proc.terminate()
            proc.wait(10)


@pytest.mark.parametrize("env,match", [
    (dict(WSYNC_GROUP="trainer", WORLD_SIZE="2"),
     "no rank for group 'trainer': read RANK (unset), WSYNC_RANK (unset), "
     "JOB_COMPLETION_INDEX (unset), POD_NAME (unset) (not in a Kubernetes pod), "
     "HOSTNAME (unset) (not in a Kubernetes pod)"),
    (dict(WSYNC_GROUP="trainer", RANK="1", JOB_COMPLETION_INDEX="0", WORLD_SIZE="2"),
     "conflicting ranks in the environment: RANK=1 but JOB_COMPLETION_INDEX=0"),
    (dict(RANK="0", WORLD_SIZE="1"), "no groups")])
def test_worker_binary_refuses_incomplete_environment(tmp_path, env, match):
    # No controller is needed: the worker exits before it connects.
    res = subprocess.run([WORKER_BIN, "--controller=127.0.0.1:1", "--metrics_port=-1",
                          f"--local_socket={tmp_path}/w.sock"], env=clean_env(**env),
                         capture_output=True, timeout=30)
    assert res.returncode == 2
    assert match in res.stdout.decode() + res.stderr.decode()


def test_launched_worker_serves_a_sync(cluster, tmp_path):
    procs = []
    socks = {}
    try:
        for group, rank in (("trainer", 0), ("inference", 0)):
            sock = str(tmp_path / f"{group}.sock")
            env = dict(os.environ, RANK=str(rank), WORLD_SIZE="1", WSYNC_WORKER_BIN=WORKER_BIN,
                       WSYNC_CONTROLLER=cluster.address, WSYNC_INSECURE="true",
                       WSYNC_LOCAL_SOCKET=sock,
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
