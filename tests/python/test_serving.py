"""Serving versions (issue 17, item 3): owners tell their workers which weight
version they serve; the controller aggregates it per replica; the trainer asks
"which replicas run version V" through wsync.Client, wsync.aio.Client and
`wsyncctl replicas`, and both Prometheus endpoints export it. Real
wsync-controller / wsync-worker processes on loopback (host backend), plus
embedded workers in this process."""
import asyncio
import json
import os
import signal
import subprocess
import time
import urllib.request

import pytest
import torch

import wsync
import wsync.aio
import wsync.torch
from wsync import embedded, errors, layouts, vllm
from wsync._proto import controller_pb2 as pb

import ducks
from harness import Cluster, WSYNCCTL_BIN, full_tensors, read_port_file
from models import TINY_LLAMA, trainer_tensors

TP = 2


def wait_until(pred, what, timeout=20.0):
    end = time.monotonic() + timeout
    while True:
        got = pred()
        if got:
            return got
        assert time.monotonic() < end, what
        time.sleep(0.05)


def set_serving(sock, version, state, replica="a", replica_ranks=TP, group="inference"):
    """SetServing over a wsync-worker's local socket, as an owner process does
    (wsync.torch.set_serving)."""
    wsync.torch.set_serving(sock, group, version, state, replica=replica,
                            replica_ranks=replica_ranks, timeout=10)


def scrape(port):
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
        return r.read().decode()


def replica(client, label, group="inference"):
    for r in client.serving(group):
        if r.replica == label:
            return r
    return None


def wsyncctl(cluster, *args):
    return subprocess.run([WSYNCCTL_BIN, "replicas", f"--controller={cluster.address}", *args],
                          capture_output=True, text=True, timeout=30)


@pytest.fixture
def metered():
    """A cluster whose controller serves /metrics on a free port."""
    c = Cluster(controller_flags=("--metrics_port=0",))
    yield c
    c.close()


def start_sync_cluster(cluster):
    """Trainer (2 FSDP ranks) -> vLLM TP=2 receivers, as test_sync.py; the
    receivers' workers serve /metrics. Returns (client, inference sockets,
    their metrics ports)."""
    shapes = {n: s for n, s, _ in trainer_tensors("tiny-llama")}
    full = full_tensors(shapes, torch.float32)
    params = {r: {n: ducks.DTensor(t, [0, 1], [ducks.Shard(0)], r) for n, t in full.items()}
              for r in range(2)}
    src = layouts.source_side(layouts.describe(params[0].items(), rank=0))
    spec = layouts.transfer_spec(src, vllm.destination(TINY_LLAMA, tp=TP), name="tiny")
    keep = []
    for r in range(2):
        sock = cluster.worker(f"trainer:{r}:2")
        keep.append(wsync.torch.register({n: p.to_local() for n, p in params[r].items()},
                                         group="trainer", rank=r, socket=sock))
    socks, ports = [], []
    for r in range(TP):
        groups = f"inference:{r}:{TP}"
        socks.append(cluster.worker(groups, flags=("--metrics_port=0",)))
        ports.append(int(read_port_file(os.path.join(cluster.dir, f"inference_{r}_{TP}.ports"),
                                        "metrics_port")))
        bufs = {b: torch.zeros(n, dtype=torch.bfloat16)
                for b, (_, n) in layouts.local_buffers(spec.destination, r).items()}
        keep.append(wsync.torch.register(bufs, group="inference", rank=r, socket=socks[-1]))
    client = wsync.Client(cluster.address, timeout=20)
    client.wait_for_workers({"trainer": 2, "inference": TP}, timeout=30, buffers=True)
    client.define_transfer("weights", spec, source_group="trainer", destination_group="inference")
    return client, socks, ports, keep


def test_replicas_follow_owner_reports_sync_and_lost_ranks(metered):
    cluster = metered
    client, socks, ports, _keep = start_sync_cluster(cluster)
    # Nobody said anything yet: one unlabelled replica of two silent ranks.
    [r] = client.serving("inference")
    assert r.replica == "" and r.state == pb.REPLICA_INCOMPLETE and r.expected_ranks == TP
    assert [(x.rank, x.live, x.reported) for x in r.ranks] == [(0, True, False), (1, True, False)]

    # The owners' lifecycle around version 1: updating, sync, serving.
    for s in socks:
        set_serving(s, 0, "updating")
    wait_until(lambda: (replica(client, "a") or pb.ReplicaServing()).state == pb.REPLICA_UPDATING,
               "replica a never showed updating")
    client.sync(1).wait(timeout=60, show_progress=False)
    set_serving(socks[0], 1, "serving")
    set_serving(socks[1], 0, "paused")
    a = wait_until(lambda: replica(client, "a") if replica(client, "a").state == pb.REPLICA_PAUSED
                   else None, "replica a never showed paused")
    assert a.version == 0 and client.replicas_at(1, "inference") == []
    assert [(x.rank, x.version, x.last_synced_version) for x in a.ranks] == [(0, 1, 1), (1, 0, 1)]
    set_serving(socks[1], 1, "serving")
    wait_until(lambda: client.replicas_at(1, "inference") == ["a"], "replica a never served v1")
    a = replica(client, "a")
    assert a.state == pb.REPLICA_SERVING and a.last_synced_version == 1
    assert all(x.live and x.reported and 0 <= x.ms_since_report < 20000 and x.set_unix_ms > 0
               for x in a.ranks)
    assert [r.replica for r in client.serving("inference")] == ["a"]  # no silent rank left
    assert asyncio.run(_aio_replicas_at(cluster.address, 1)) == ["a"]

    # wsyncctl sees the same.
    out = wsyncctl(cluster, "--group=inference", "--version=1")
    assert out.returncode == 0 and out.stdout.split() == ["a"], out.stderr
    out = wsyncctl(cluster, "--group=inference", "--version=2")
    assert out.returncode == 1 and out.stdout == ""
    out = wsyncctl(cluster, "--group=inference")
    assert out.returncode == 0, out.stderr
    assert "replica a" in out.stdout and "serving" in out.stdout and "rank 1" in out.stdout
    doc = json.loads(wsyncctl(cluster, "--group=inference", "--json").stdout)
    assert doc["replicas"][0]["state"] == "REPLICA_SERVING" and doc["replicas"][0]["version"] == "1"

    # The worker's and the controller's /metrics.
    text = scrape(ports[1])
    assert 'wsync_worker_serving_version{group="inference"} 1' in text
    assert 'wsync_worker_serving_state{group="inference",state="serving"} 1' in text
    assert 'wsync_worker_serving_state{group="inference",state="paused"} 0' in text
    cport = int(read_port_file(os.path.join(cluster.dir, "controller.ports"), "metrics_port"))
    wait_until(lambda: 'wsync_replica_serving_version{group="inference",replica="a"} 1'
               in scrape(cport), "the controller never exported replica a at version 1")
    assert 'wsync_replica_state{group="inference",replica="a",state="serving"} 1' in scrape(cport)

    # A rank's worker dies: its replica no longer counts as serving v1.
    cluster.workers[f"inference:1:{TP}"].stop(sig=signal.SIGKILL)
    a = wait_until(lambda: replica(client, "a") if replica(client, "a").state
                   == pb.REPLICA_INCOMPLETE else None, "replica a still complete after a kill")
    assert client.replicas_at(1, "inference") == []
    lost = a.ranks[1]
    assert not lost.live and lost.version == 1  # the stale report, marked lost
    out = wsyncctl(cluster, "--group=inference")
    assert "incomplete" in out.stdout and "lost" in out.stdout


async def _aio_replicas_at(address, version):
    async with wsync.aio.Client(address, timeout=20) as c:
        reps = await c.serving("inference")
        assert [r.replica for r in reps] == ["a"]
        return await c.replicas_at(version, "inference")


def test_embedded_workers_report_serving(cluster):
    client = wsync.Client(cluster.address, timeout=20)
    ws = [embedded.Worker(cluster.address, f"serve:{r}:4", metrics_port=0 if r == 0 else None)
          for r in range(4)]
    try:
        for w in ws:
            w.wait_registered()
        # Two servers of two ranks; server "y" has one rank a version behind.
        ws[0].set_serving(3, "serving", replica="x", replica_ranks=2)
        ws[1].set_serving(3, "serving", replica="x", replica_ranks=2)
        ws[2].set_serving(3, "serving", replica="y", replica_ranks=2)
        ws[3].set_serving(2, "serving", replica="y", replica_ranks=2)
        wait_until(lambda: client.replicas_at(3, "serve") == ["x"], "replica x never served 3")
        y = replica(client, "y", group="serve")
        assert y.state == pb.REPLICA_MIXED and y.version == 0
        ws[3].set_serving(3, "failed", replica="y", replica_ranks=2)
        wait_until(lambda: replica(client, "y", group="serve").state == pb.REPLICA_FAILED,
                   "replica y never showed failed")
        ws[3].set_serving(3, "serving", replica="y", replica_ranks=2)
        wait_until(lambda: client.replicas_at(3, "serve") == ["x", "y"], "y never served 3")
        text = scrape(ws[0].metrics_port)
        assert 'wsync_worker_serving_version{group="serve"} 3' in text

        with pytest.raises(errors.InvalidArgument, match="'sleeping'"):
            ws[0].set_serving(3, "sleeping")
        with pytest.raises(errors.InvalidArgument, match="version -1"):
            ws[0].set_serving(-1, "serving")
        with pytest.raises(errors.InvalidArgument, match="group 'other'.*not in it"):
            ws[0].set_serving(3, "serving", group="other")
        with pytest.raises(errors.InvalidArgument, match="Replicas: name"):
            client.serving("")
        ws[1].stop()
        with pytest.raises(errors.FailedPrecondition, match="group 'serve'.*stopped"):
            ws[1].set_serving(4, "serving")
        wait_until(lambda: replica(client, "x", group="serve").state == pb.REPLICA_INCOMPLETE,
                   "replica x still complete after its rank 1 stopped")
        assert client.replicas_at(3, "serve") == ["y"]
    finally:
        for w in ws:
            w.stop()


def test_an_owner_beside_a_worker_process_reports_through_its_registration(cluster):
    sock = cluster.worker("inference:0:1")
    reg = wsync.torch.register({"w": torch.zeros(4)}, group="inference", rank=0, socket=sock)
    try:
        reg.set_serving(7, "serving", replica="r0", replica_ranks=1)
        client = wsync.Client(cluster.address, timeout=20)
        end = time.monotonic() + 10
        while client.replicas_at(7) != ["r0"] and time.monotonic() < end:
            time.sleep(0.05)
        assert client.replicas_at(7) == ["r0"]
        client.close()
        with pytest.raises(errors.InvalidArgument, match="'asleep' is not one of"):
            reg.set_serving(8, "asleep")
        with pytest.raises(errors.InvalidArgument, match="group 'trainer'"):
            wsync.torch.set_serving(sock, "trainer", 8, "serving")
    finally:
        reg.close()
