"""wsync.aio.Client(lane=): Sync and WaitSync over the controller's control
fast lane from asyncio (wsync._lane_aio) without blocking the event loop;
the same answers and exceptions as over gRPC; an absent lane warns and goes
over gRPC; a cancelled wait drops the connection. Real controller and
workers reporting on the lane."""
import asyncio
import os
import signal
import time

import pytest
import torch

import wsync
import wsync.aio
import wsync.torch
from wsync._proto import controller_pb2 as pb

from harness import freeze
from lane_setup import (READER, TRAINER, lane_cluster, ready,  # noqa: F401,F811
                        unreachable_address)
from test_errors import W


def test_aio_sync_and_wait_over_the_lane_without_blocking_the_loop(lane_cluster):
    dest = {W: torch.zeros(8, 4)}
    _, regs = ready(lane_cluster, dest)  # noqa: F841
    worker = lane_cluster.workers["trainer:1:2"].proc

    async def main():
        # gRPC cannot reach the controller from this client: only the lane can.
        client = wsync.aio.Client(unreachable_address(), timeout=10, token=TRAINER,
                                  lane=lane_cluster.lane)
        status = await (await client.sync(1, transfer="t", wait=30)).wait(timeout=30)
        assert status.phase == pb.SYNC_SUCCEEDED, status.error
        freeze(worker)  # the next sync waits; the loop must keep running meanwhile
        ticks = 0

        async def tick():
            nonlocal ticks
            while True:
                ticks += 1
                await asyncio.sleep(0.01)

        ticker = asyncio.ensure_future(tick())
        asyncio.get_running_loop().call_later(0.5, os.kill, worker.pid, signal.SIGCONT)
        t0 = time.monotonic()
        handle = await client.sync(2, transfer="t")
        status = await handle.wait(timeout=30)  # WaitSync over the lane
        waited = time.monotonic() - t0
        ticker.cancel()
        await client.close()
        return status, ticks, waited

    try:
        status, ticks, waited = asyncio.run(main())
    finally:
        os.kill(worker.pid, signal.SIGCONT)
    assert status.phase == pb.SYNC_SUCCEEDED
    assert waited >= 0.4 and ticks >= 0.25 * waited / 0.01, (ticks, waited)
    assert torch.equal(dest[W], torch.cat([torch.zeros(4, 4), torch.ones(4, 4)]))
    logs = lane_cluster.logs()
    assert logs.count("reports over the control lane") == 3, logs


def test_aio_lane_errors_are_the_grpc_ones(lane_cluster):
    grpc_client, regs = ready(lane_cluster)
    grpc_client.sync(2, transfer="t", wait=30).wait(timeout=30, show_progress=False)
    far = unreachable_address()

    async def main():
        got = []
        for token, kind in ((None, wsync.Unauthenticated), (READER, wsync.PermissionDenied)):
            c = wsync.aio.Client(far, timeout=10, token=token, lane=lane_cluster.lane)
            with pytest.raises(kind):
                await c.sync(3, transfer="t", wait=10)
        c = wsync.aio.Client(far, timeout=10, token=TRAINER, lane=lane_cluster.lane)
        for version, transfer in ((1, "t"), (3, "nope")):
            with pytest.raises(wsync.WsyncError) as e:
                await c.sync(version, transfer=transfer, wait=10)
            got.append((type(e.value), e.value.message))
        return got

    want = []
    for version, transfer in ((1, "t"), (3, "nope")):
        with pytest.raises(wsync.WsyncError) as e:
            grpc_client.sync(version, transfer=transfer, wait=10)
        want.append((type(e.value), e.value.message))
    assert asyncio.run(main()) == want
    assert [k for k, _ in want] == [wsync.FailedPrecondition, wsync.NotFound]


def test_aio_absent_lane_and_cancelled_wait(lane_cluster, monkeypatch):
    _, regs = ready(lane_cluster)  # noqa: F841
    worker = lane_cluster.workers["trainer:1:2"].proc

    async def main():
        absent = wsync.aio.Client(lane_cluster.address, timeout=10, token=TRAINER,
                                  lane=lane_cluster.lane + ".absent")
        with pytest.warns(RuntimeWarning, match="absent: No such file.*calls go over gRPC"):
            status = await (await absent.sync(1, transfer="t", wait=30)).wait(timeout=30)
        assert status.phase == pb.SYNC_SUCCEEDED
        monkeypatch.setenv("WSYNC_CONTROLLER_LANE", lane_cluster.lane)
        client = wsync.aio.Client(unreachable_address(), timeout=10, token=TRAINER)
        assert client.lane == lane_cluster.lane
        freeze(worker)
        try:
            handle = await client.sync(2, transfer="t")
            with pytest.raises(asyncio.TimeoutError):
                await asyncio.wait_for(handle.wait(timeout=20), 0.3)
            assert client._lane._sock is None  # its answer would come out of turn
        finally:
            os.kill(worker.pid, signal.SIGCONT)
        return await handle.wait(timeout=30)

    try:
        assert asyncio.run(main()).phase == pb.SYNC_SUCCEEDED
    finally:
        os.kill(worker.pid, signal.SIGCONT)


def test_aio_closing_the_client_ends_a_wait_in_progress(tmp_path):
    """close() while a call awaits a silent lane: the call ends at once with
    Unavailable, not at its deadline (its reader is removed before the
    socket closes)."""
    path = str(tmp_path / "silent.sock")

    async def main():
        conns = []

        async def hold(reader, writer):
            conns.append(writer)  # reads nothing, answers nothing
            await asyncio.sleep(30)

        server = await asyncio.start_unix_server(hold, path=path)
        client = wsync.aio.Client(unreachable_address(), timeout=10, token=TRAINER, lane=path)
        call = asyncio.ensure_future(client._rpc(
            "WaitSync", pb.WaitSyncRequest(sync_id="s", timeout_ms=1), timeout=20))
        await asyncio.sleep(0.3)
        assert not call.done()
        t0 = time.monotonic()
        await client.close()
        with pytest.raises(wsync.Unavailable, match="closed"):
            await asyncio.wait_for(call, timeout=5)
        assert time.monotonic() - t0 < 3
        for w in conns:
            w.close()
        server.close()
        await server.wait_closed()

    asyncio.run(main())
