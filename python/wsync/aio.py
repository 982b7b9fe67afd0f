"""asyncio variants of the trainer client (grpc.aio):

    client = wsync.aio.Client("controller:50051")
    await client.define_transfer("weights", spec)
    handle = await client.sync(version)
    await handle.wait(timeout=60)
"""
import asyncio
import os
import time

import grpc

from wsync import _channel, errors, progress as progress_mod, specs
from wsync.client import (_NO_DEADLINE_S, _POLL_MS, _RUNNING, _WATCH_SLICE_S, _result,
                          replicas_serving, rollout_policy, sync_request)
from wsync._proto import controller_pb2 as pb
from wsync._proto import controller_pb2_grpc as pb_grpc
from wsync._proto import layout_pb2 as lpb


class SyncHandle:
    """A started sync; the coroutine versions of wsync.SyncHandle's methods."""

    def __init__(self, client, transfer, version, response):
        self._client = client
        self.transfer = transfer
        self.version = version
        self.sync_id = response.sync_id
        self.plan_key = response.plan_key
        self.plan_cache_hit = response.plan_cache_hit
        self.status = response.status if response.HasField("status") else None

    async def poll(self):
        self.status = await self._client._rpc("WaitSync", pb.WaitSyncRequest(
            sync_id=self.sync_id, timeout_ms=1))
        return self.status

    async def progress(self):
        return progress_mod.Progress.from_status(await self.poll())

    async def wait(self, timeout=None, show_progress=False):
        """As wsync.SyncHandle.wait: the SyncStatus, or SyncFailed /
        SyncCancelled / DeadlineExceeded."""
        if self.status is not None and self.status.phase != _RUNNING:
            return _result(self.status)  # it ended in Sync's own round trip
        display = (progress_mod.Display(f"sync {self.transfer} v{self.version}")
                   if progress_mod.want_display(show_progress) else None)
        end = None if timeout is None else time.monotonic() + timeout
        while True:
            left_ms = _POLL_MS if end is None else int(1000 * (end - time.monotonic()))
            if left_ms <= 0:
                raise errors.DeadlineExceeded(
                    f"sync {self.sync_id} (transfer {self.transfer!r}, version {self.version}) "
                    f"still running after {timeout} s", status=self.status)
            wait_ms = max(1, min(_POLL_MS if display is None else 100, left_ms))
            self.status = await self._client._rpc(
                "WaitSync", pb.WaitSyncRequest(sync_id=self.sync_id, timeout_ms=wait_ms),
                timeout=wait_ms / 1000 + self._client.timeout)
            if display is not None:
                p = progress_mod.Progress.from_status(self.status)
                display.update(p, final=p.done)
            if self.status.phase != _RUNNING:
                return _result(self.status)

    async def watch(self, timeout=None):
        """Async iterator of SyncStatus updates until the sync ends (the stream
        is reopened every _WATCH_SLICE_S seconds, as the sync client does)."""
        end = None if timeout is None else time.monotonic() + timeout
        while True:
            left = _WATCH_SLICE_S if end is None else min(_WATCH_SLICE_S, end - time.monotonic())
            if left <= 0:
                raise errors.DeadlineExceeded(
                    f"sync {self.sync_id} still running after {timeout} s", status=self.status)
            call = self._client._stub.WatchSync(pb.WatchSyncRequest(sync_id=self.sync_id),
                                                timeout=left, metadata=self._client._metadata)
            try:
                async for status in call:
                    self.status = status
                    yield status
                return
            except grpc.RpcError as e:
                if e.code() != grpc.StatusCode.DEADLINE_EXCEEDED:
                    raise errors.from_rpc_error(e, self._client._where) from None
            finally:
                call.cancel()

    async def cancel(self, reason="cancelled by the trainer"):
        self.status = await self._client._rpc("Cancel", pb.CancelRequest(
            sync_id=self.sync_id, reason=reason))
        return self.status


class Client:
    """asyncio client of the controller's TrainerService (same methods as
    wsync.Client, as coroutines). Create it inside the running event loop."""

    def __init__(self, address, *, timeout=30.0, channel=None, options=(), tls=False,
                 token=None, lane=None):
        """`tls` and `token` as for wsync.Client. `lane`: the controller's
        control fast lane (its --lane_socket; default WSYNC_CONTROLLER_LANE):
        sync() and wait() go over that Unix socket (wsync._lane_aio: the
        loop is never blocked), with the same answers, exceptions and
        fallback to gRPC (a RuntimeWarning) as wsync.Client(lane=)."""
        self.address = address
        self.timeout = timeout
        self._channel = channel or _channel.open_channel(address, tls, token, options, aio=True)
        self._metadata = _channel.token_metadata(token)
        self._stub = pb_grpc.TrainerServiceStub(self._channel)
        self._where = f"controller {address}"
        if lane is None:
            lane = os.environ.get("WSYNC_CONTROLLER_LANE", "")
        self.lane = lane or None
        self._lane = None
        if self.lane:
            from wsync import _lane_aio  # its stubs load only for a lane
            self._lane = _lane_aio.AsyncLaneChannel(lane, token, self._where)
        self.transfer = None

    async def close(self):
        if self._lane is not None:
            self._lane.close()
        await self._channel.close()

    async def __aenter__(self):
        return self

    async def __aexit__(self, *exc):
        await self.close()

    async def _rpc(self, method, request, timeout=None):
        if self._lane is not None:
            t = timeout or self.timeout
            resp = await self._lane.call(method, request, _NO_DEADLINE_S if t is None else t)
            if resp is not None:
                return resp
        try:
            return await getattr(self._stub, method)(request, timeout=timeout or self.timeout,
                                                     metadata=self._metadata)
        except grpc.RpcError as e:
            raise errors.from_rpc_error(e, self._where) from None

    async def define_transfer(self, name, spec, *, source_group="trainer",
                              destination_group="inference", rollout=None, warm_up=True):
        """As wsync.Client.define_transfer (`rollout`: the rolling-wave policy;
        `warm_up=False`: no warm-up for this definition)."""
        proto = specs.to_proto(spec)
        if rollout is not None:
            copy = lpb.TransferSpec()
            copy.CopyFrom(proto)
            copy.rollout.CopyFrom(rollout_policy(rollout))
            proto = copy
        resp = await self._rpc("DefineTransfer", pb.DefineTransferRequest(
            name=name, source_group=source_group, destination_group=destination_group,
            spec=proto, no_warm_up=not warm_up))
        self.transfer = name
        return resp

    async def plan(self, transfer=None, full=False):
        return await self._rpc("Plan", pb.PlanRequest(transfer=transfer or self._transfer(),
                                                      full=full))

    async def sync(self, version, transfer=None, deadline=None, wait=None, resend=False):
        """As wsync.Client.sync (`wait`: answered once the sync ended or
        `wait` seconds passed)."""
        req = sync_request(transfer or self._transfer(), version, deadline, wait, resend)
        resp = await self._rpc("Sync", req, timeout=req.wait_ms / 1000 + self.timeout)
        return SyncHandle(self, req.transfer, version, resp)

    async def status(self):
        return await self._rpc("GetStatus", pb.GetStatusRequest())

    async def workers(self, group=""):
        """As wsync.Client.workers: every page."""
        out, token = [], ""
        while True:
            resp = await self._rpc("ListWorkers",
                                   pb.ListWorkersRequest(group=group, page_token=token))
            out.extend(resp.workers)
            token = resp.next_page_token
            if not token:
                return out

    async def cancel(self, sync_id, reason="cancelled by the trainer"):
        return await self._rpc("Cancel", pb.CancelRequest(sync_id=sync_id, reason=reason))

    async def serving(self, group="inference"):
        """As wsync.Client.serving: the ReplicaServing list of `group`."""
        resp = await self._rpc("Replicas", pb.ReplicasRequest(group=group))
        return list(resp.replicas)

    async def replicas_at(self, version, group="inference"):
        """As wsync.Client.replicas_at: labels of the replicas serving `version`."""
        return replicas_serving(await self.serving(group), version)

    async def replica_versions(self, transfer=None):
        """As wsync.Client.replica_versions: per replica, the version it
        serves as the controller knows it."""
        name = transfer or self._transfer()
        for t in (await self.status()).transfers:
            if t.name == name:
                return list(t.replicas)
        raise errors.NotFound(f"no transfer {name!r} on {self._where}")

    async def replicas_on(self, version, transfer=None):
        """As wsync.Client.replicas_on."""
        return [r.replica for r in await self.replica_versions(transfer)
                if r.version == version and r.state == "serving"]

    async def wait_for_workers(self, groups, timeout=30.0, buffers=False):
        end = time.monotonic() + timeout
        while True:
            ready = set()
            for w in await self.workers():
                if w.alive and w.streaming:
                    for m in w.memberships:
                        if not buffers or any(b.group == m.group for b in w.buffers):
                            ready.add((m.group, m.rank))
            missing = [f"{g}/{r}" for g, n in groups.items() for r in range(n)
                       if (g, r) not in ready]
            if not missing:
                return
            if time.monotonic() > end:
                raise errors.DeadlineExceeded(
                    f"workers not ready on {self._where} after {timeout} s: "
                    + ", ".join(missing))
            await asyncio.sleep(0.05)

    def _transfer(self):
        if self.transfer is None:
            raise errors.FailedPrecondition("no transfer: call define_transfer() first or pass "
                                            "transfer=")
        return self.transfer
