"""The trainer's client of the controller (TrainerService, docs/api.md).

    client = wsync.Client("controller:50051")
    client.define_transfer("weights", spec, source_group="trainer",
                           destination_group="inference")
    client.sync(version).wait()

Every RPC error becomes a wsync.WsyncError subclass (errors.py); every call has
a timeout (``timeout`` seconds, default 30) and waits are bounded.
"""
import os
import time

import grpc

from wsync import _channel, errors, progress as progress_mod, specs
from wsync._proto import controller_pb2 as pb
from wsync._proto import controller_pb2_grpc as pb_grpc
from wsync._proto import layout_pb2 as lpb

_RUNNING = pb.SYNC_RUNNING
_ROLLOUT_FIELDS = ("max_unavailable", "max_staleness", "replica_ranks")


def rollout_policy(rollout):
    """A RolloutPolicy from a RolloutPolicy or a dict of its fields
    (docs/staging-rollout.md, "Rolling waves"); InvalidArgument names an unknown key
    or a value that is not a non-negative int."""
    if isinstance(rollout, lpb.RolloutPolicy):
        return rollout
    if not isinstance(rollout, dict):
        raise errors.InvalidArgument(
            f"define_transfer: rollout must be a dict or RolloutPolicy, not {type(rollout).__name__}")
    unknown = sorted(set(rollout) - set(_ROLLOUT_FIELDS))
    if unknown:
        raise errors.InvalidArgument(
            f"define_transfer: rollout has unknown keys {unknown} (known: {list(_ROLLOUT_FIELDS)})")
    for key, value in rollout.items():
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise errors.InvalidArgument(
                f"define_transfer: rollout[{key!r}] = {value!r} is not a non-negative int")
    return lpb.RolloutPolicy(**rollout)


# define_transfer's staging modes -> StagingMode (docs/staging.md).
STAGING_MODES = {"in_place": lpb.STAGING_IN_PLACE, "host_shadow": lpb.STAGING_HOST_SHADOW,
                 "device_shadow": lpb.STAGING_DEVICE_SHADOW}
_WATCH_SLICE_S = 30.0  # longest single WatchSync call
_POLL_MS = 1000  # longest single WaitSync call of a wait loop


_METHOD_PREFIX = "/wsync.v1.TrainerService/"
_WAITING_CALLS = ("Sync", "WaitSync")  # the calls a busy_wait client spins on
_NO_DEADLINE_S = 365 * 24 * 3600.0
_RESPONSE_TYPES = {}
_LANE_IMPLS = ("auto", "native", "python")


def _lane_impl(value):
    """`lane_impl` (or WSYNC_LANE_IMPL) checked: "auto", "native" or "python"."""
    if value is None:
        value = os.environ.get("WSYNC_LANE_IMPL", "") or "auto"
    if value not in _LANE_IMPLS:
        raise ValueError(f"wsync: lane_impl (or WSYNC_LANE_IMPL) {value!r} is not one of "
                         f"{list(_LANE_IMPLS)}")
    return value


def _response_type(method):
    """The response message class of TrainerService's unary `method`."""
    cls = _RESPONSE_TYPES.get(method)
    if cls is None:
        desc = pb.DESCRIPTOR.services_by_name["TrainerService"].methods_by_name[method]
        cls = _RESPONSE_TYPES[method] = getattr(pb, desc.output_type.name)
    return cls


def _result(status):
    """`status` if it succeeded, else the matching exception."""
    if status.phase == pb.SYNC_SUCCEEDED:
        return status
    if status.phase == pb.SYNC_CANCELLED:
        raise errors.SyncCancelled(status)
    raise errors.SyncFailed(status)


def sync_request(transfer, version, deadline=None, wait=None, resend=False):
    """The SyncRequest of Client.sync (seconds -> milliseconds)."""
    return pb.SyncRequest(transfer=transfer, version=version,
                          deadline_ms=0 if deadline is None else int(deadline * 1000),
                          wait_ms=0 if wait is None else max(1, int(wait * 1000)),
                          resend=resend)


def replicas_serving(replicas, version):
    """Labels of the ReplicaServing entries serving exactly `version`."""
    return [r.replica for r in replicas
            if r.state == pb.REPLICA_SERVING and r.version == version]


class SyncHandle:
    """A started sync: ``wait()``, ``progress()``, ``cancel()``, ``watch()``."""

    def __init__(self, client, transfer, version, response):
        self._client = client
        self.transfer = transfer
        self.version = version
        self.sync_id = response.sync_id
        self.plan_key = response.plan_key
        self.plan_cache_hit = response.plan_cache_hit
        # The last SyncStatus seen (Sync with `wait` answers with one).
        self.status = response.status if response.HasField("status") else None

    def __repr__(self):
        return f"SyncHandle({self.transfer!r}, version={self.version}, id={self.sync_id!r})"

    def poll(self):
        """The current SyncStatus (one short RPC)."""
        self.status = self._client._rpc("WaitSync", pb.WaitSyncRequest(
            sync_id=self.sync_id, timeout_ms=1))
        return self.status

    def progress(self):
        """A progress_mod.Progress snapshot (bytes, GB/s, workers done)."""
        return progress_mod.Progress.from_status(self.poll())

    def done(self):
        return self.poll().phase != _RUNNING

    def wait(self, timeout=None, show_progress=None):
        """Blocks until the sync ends; returns its SyncStatus on success.

        Raises SyncFailed (first cause: message, failed group/rank, round,
        peer) or SyncCancelled, and DeadlineExceeded when `timeout` seconds
        pass first (the sync keeps running; wait again or cancel()). With
        `show_progress` (default: when stderr is a terminal) a live line
        shows bytes, GB/s and workers done."""
        if self.status is not None and self.status.phase != _RUNNING:
            return _result(self.status)  # it ended in Sync's own round trip
        if progress_mod.want_display(show_progress):
            return self._wait_displayed(timeout)
        end = None if timeout is None else time.monotonic() + timeout
        while True:
            left_ms = _POLL_MS if end is None else int(1000 * (end - time.monotonic()))
            if left_ms <= 0:
                raise errors.DeadlineExceeded(
                    f"sync {self.sync_id} (transfer {self.transfer!r}, version {self.version}) "
                    f"still running after {timeout} s", status=self.status)
            self.status = self._client._rpc("WaitSync", pb.WaitSyncRequest(
                sync_id=self.sync_id, timeout_ms=max(1, min(_POLL_MS, left_ms))),
                timeout=_POLL_MS / 1000 + self._client.timeout)
            if self.status.phase != _RUNNING:
                return _result(self.status)

    def _wait_displayed(self, timeout):
        display = progress_mod.Display(f"sync {self.transfer} v{self.version}")
        for status in self.watch(timeout=timeout):
            p = progress_mod.Progress.from_status(status)
            display.update(p, final=p.done)
            if p.done:
                return _result(status)
        # The stream ended without a final status (server shutdown): ask once.
        return self.wait(timeout=1.0, show_progress=False)

    def watch(self, timeout=None):
        """Yields a SyncStatus on every change until the sync ends (WatchSync).

        The stream is reopened every _WATCH_SLICE_S seconds, so no single call
        waits without a deadline on a connection that stopped answering."""
        end = None if timeout is None else time.monotonic() + timeout
        while True:
            left = _WATCH_SLICE_S if end is None else min(_WATCH_SLICE_S, end - time.monotonic())
            if left <= 0:
                raise errors.DeadlineExceeded(
                    f"sync {self.sync_id} (transfer {self.transfer!r}, version {self.version}) "
                    f"still running after {timeout} s", status=self.status)
            stream = self._client._stub.WatchSync(pb.WatchSyncRequest(sync_id=self.sync_id),
                                                  timeout=left, metadata=self._client._metadata)
            try:
                for status in stream:
                    self.status = status
                    yield status
                return
            except grpc.RpcError as e:
                if e.code() != grpc.StatusCode.DEADLINE_EXCEEDED:
                    raise errors.from_rpc_error(e, self._client._where) from None
            finally:
                stream.cancel()

    def cancel(self, reason="cancelled by the trainer"):
        """Ends the sync as SYNC_CANCELLED; returns its SyncStatus."""
        self.status = self._client._rpc("Cancel", pb.CancelRequest(sync_id=self.sync_id,
                                                                   reason=reason))
        return self.status


class Client:
    """Synchronous client of the controller's TrainerService."""

    def __init__(self, address, *, timeout=30.0, channel=None, options=(), tls=False,
                 token=None, busy_wait=None, lane=None, lane_impl=None):
        """`tls`: False (plaintext, a --insecure controller), True (TLS with
        the system roots), a CA file path, or wsync.Tls(ca, cert, key) for
        mutual TLS. `token`: a bearer token of the controller's
        --tokens_file, sent with every call (docs/security.md).
        `busy_wait`: while a sync call (Sync with `wait`, WaitSync) waits
        for its answer, the calling thread spins on it instead of sleeping:
        one core busy for the sync's duration, and the answer is seen without
        a wake-up (a few hundred microseconds on virtual machines after a
        quiet spell; docs/performance-notes.md, "The control path").
        Default: WSYNC_CLIENT_BUSY_WAIT=1 in the environment, else off.
        Needs the wsync._native extension, or the pure-Python lane (its lane
        calls spin; sched_yield between polls).
        `lane`: the controller's control fast lane, the path of its
        --lane_socket (a trainer on the controller's host, as the
        controller's user): sync() and wait() go over that Unix socket, with
        no gRPC thread on the controller's side (docs/performance-notes.md);
        the same requests, answers and exceptions. An absent lane, or one
        that refuses or whose listener is not this user's or root's, warns
        (RuntimeWarning) and the calls go over gRPC. Default:
        WSYNC_CONTROLLER_LANE in the environment, else none.
        `lane_impl`: who speaks the lane: "native" (wsync._native's C++
        client; ValueError without it), "python" (wsync._lane, sockets of
        this process) or "auto" (native when the native client is in use,
        else python). Default: WSYNC_LANE_IMPL, else "auto"."""
        self.address = address
        self.timeout = timeout
        self._channel = channel or _channel.open_channel(address, tls, token, options)
        # Unary calls go through gRPC C++ (wsync._native) unless the caller
        # brought its own channel or the extension is missing; streams
        # (WatchSync) always use the grpcio channel.
        if lane is None:
            lane = os.environ.get("WSYNC_CONTROLLER_LANE", "")
        lane_impl = _lane_impl(lane_impl)
        self._where = f"controller {address}"
        self._native = None if channel else _channel.open_native(
            address, tls, token, options, lane if lane_impl != "python" else "")
        self.lane = lane or None
        # Who speaks the lane: "native", "python" or None (no lane).
        self.lane_impl = None
        self._lane = None
        if self.lane:
            if lane_impl == "native" and self._native is None:
                raise ValueError("wsync: lane_impl='native' needs the wsync._native client "
                                 "(not built, WSYNC_NATIVE_CLIENT=0 or a channel of the "
                                 "caller's); lane_impl='python' needs none")
            if lane_impl == "python" or self._native is None:
                from wsync import _lane  # its stubs load only for a lane
                self._lane = _lane.LaneChannel(self.lane, token, self._where)
                self.lane_impl = "python"
            else:
                self.lane_impl = "native"
        if busy_wait is None:
            busy_wait = os.environ.get("WSYNC_CLIENT_BUSY_WAIT", "0") == "1"
        self.busy_wait = bool(busy_wait) and (self._native is not None or self._lane is not None)
        self._metadata = _channel.token_metadata(token)
        self._stub = pb_grpc.TrainerServiceStub(self._channel)
        self.transfer = None  # the last transfer defined (default of sync())

    def close(self):
        self._native = None
        if self._lane is not None:
            self._lane.close()
        self._channel.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def _rpc(self, method, request, timeout=None):
        if self._lane is not None:
            t = timeout or self.timeout
            t = _NO_DEADLINE_S if t is None else t
            resp = self._lane.call(method, request, t, t if self.busy_wait else 0.0)
            if resp is not None:
                return resp
        if self._native is not None:
            return self._native_rpc(method, request, timeout or self.timeout)
        try:
            return getattr(self._stub, method)(request, timeout=timeout or self.timeout,
                                               metadata=self._metadata)
        except grpc.RpcError as e:
            raise errors.from_rpc_error(e, self._where) from None

    def _native_rpc(self, method, request, timeout):
        from wsync._native import client as native_client
        if timeout is None:  # as grpcio: no deadline (a year is the native form of it)
            timeout = _NO_DEADLINE_S
        spin = timeout if self.busy_wait and method in _WAITING_CALLS else 0.0
        try:
            raw = self._native.call(_METHOD_PREFIX + method, request.SerializeToString(),
                                    timeout, spin)
        except native_client.RpcError as e:
            code, details = e.args
            raise errors.from_status(code, details, self._where) from None
        return _response_type(method).FromString(raw)

    def define_transfer(self, name, spec, *, source_group="trainer",
                        destination_group="inference", staging=None, checksums=None,
                        verify=None, rollout=None, warm_up=True):
        """Binds `spec` (TransferSpec, its JSON dict/text, or a layouts
        builder) to the registered workers of both groups and plans it.
        `staging` ("in_place", "host_shadow", "device_shadow"),
        `checksums` and `verify` (compare every live destination with its
        source after the commit / the run: SyncStatus.verify_buckets,
        verify_bytes, verify_not_verifiable, not_verifiable) override the
        spec's staging options (docs/staging.md).
        `warm_up=False`: no warm-up of the workers for this definition
        (docs/warm-up.md; the response's warm_up_id names the one started).
        `rollout` (a RolloutPolicy or a dict of max_unavailable,
        max_staleness, replica_ranks) overrides the spec's rolling-wave
        policy (docs/staging-rollout.md, "Rolling waves").
        Returns the DefineTransferResponse (workers, plan key, summary, the
        receivers' shadow memory)."""
        proto = specs.to_proto(spec)
        if (staging is not None or checksums is not None or verify is not None
                or rollout is not None):
            copy = lpb.TransferSpec()
            copy.CopyFrom(proto)  # the caller's spec stays as it was
            proto = copy
        if staging is not None:
            if staging not in STAGING_MODES:
                raise errors.InvalidArgument(
                    f"define_transfer: staging {staging!r} is not one of {sorted(STAGING_MODES)}")
            proto.staging.mode = STAGING_MODES[staging]
        if checksums is not None:
            proto.staging.checksums = bool(checksums)
        if rollout is not None:
            proto.rollout.CopyFrom(rollout_policy(rollout))
        if verify is not None:
            proto.staging.verify = bool(verify)
        resp = self._rpc("DefineTransfer", pb.DefineTransferRequest(
            name=name, source_group=source_group, destination_group=destination_group,
            spec=proto, no_warm_up=not warm_up))
        self.transfer = name
        return resp

    def plan(self, transfer=None, full=False):
        return self._rpc("Plan", pb.PlanRequest(transfer=transfer or self._transfer(), full=full))

    def sync(self, version, transfer=None, deadline=None, wait=None, resend=False):
        """Starts syncing weight `version`; returns a SyncHandle. `deadline`
        (seconds) bounds the sync (default: the controller's). With `wait`
        (seconds) the controller answers once the sync ended or `wait`
        passed, so ``client.sync(v, wait=60).wait(timeout=60)`` costs one
        round trip for a sync shorter than a minute (``wait()`` then returns
        at once); without it Sync answers as soon as the sync started.
        Versions never go backwards: a version older than the transfer's last
        delivered one raises FailedPrecondition, the same one too unless
        `resend` (send those weights again, e.g. to a replaced replica)."""
        req = sync_request(transfer or self._transfer(), version, deadline, wait, resend)
        resp = self._rpc("Sync", req, timeout=req.wait_ms / 1000 + self.timeout)
        return SyncHandle(self, req.transfer, version, resp)

    def status(self):
        """GetStatusResponse: transfers, worker counts, plan cache stats."""
        return self._rpc("GetStatus", pb.GetStatusRequest())

    def transfer_status(self, transfer=None):
        name = transfer or self._transfer()
        for t in self.status().transfers:
            if t.name == name:
                return t
        raise errors.NotFound(f"no transfer {name!r} on {self._where}")

    def workers(self, group=""):
        """The registered workers (RegisteredWorker list), of `group` or all,
        over every ListWorkers page."""
        out, token = [], ""
        while True:
            resp = self._rpc("ListWorkers", pb.ListWorkersRequest(group=group, page_token=token))
            out.extend(resp.workers)
            token = resp.next_page_token
            if not token:
                return out

    def cancel(self, sync_id, reason="cancelled by the trainer"):
        return self._rpc("Cancel", pb.CancelRequest(sync_id=sync_id, reason=reason))

    def serving(self, group="inference"):
        """What each replica of destination `group` serves: a list of
        ReplicaServing (replica label, state, version, expected ranks, and per
        rank its version, state, last synced version and report age), by
        label. A replica serves version V (state REPLICA_SERVING) only when
        every rank it expects is live and its owner reported serving V
        (docs/api.md, "Serving versions")."""
        return list(self._rpc("Replicas", pb.ReplicasRequest(group=group)).replicas)

    def replicas_at(self, version, group="inference"):
        """Labels of the replicas of `group` whose every rank serves `version`."""
        return replicas_serving(self.serving(group), version)

    def replica_versions(self, transfer=None):
        """Per replica of the transfer's destination, the version it serves as
        the controller knows it (ReplicaVersion list: label, ranks, version,
        state; every rank confirmed the version's commit). While a rolling
        sync runs, its SyncStatus.rollout tells the waves' progress
        (docs/staging-rollout.md, "Rolling waves")."""
        return list(self.transfer_status(transfer).replicas)

    def replicas_on(self, version, transfer=None):
        """Labels of the replicas that serve `version` as the controller
        knows it (every rank confirmed its commit): where a router may send
        requests for that version."""
        return [r.replica for r in self.replica_versions(transfer)
                if r.version == version and r.state == "serving"]

    def wait_for_workers(self, groups, timeout=30.0, buffers=False):
        """Waits until every rank of `groups` ({group: size}) holds a live lease
        with its assignment stream open (and, with `buffers`, has registered
        buffers). Raises DeadlineExceeded naming the missing ranks."""
        end = time.monotonic() + timeout
        while True:
            missing = self._missing(groups, buffers)
            if not missing:
                return
            if time.monotonic() > end:
                raise errors.DeadlineExceeded(
                    f"workers not ready on {self._where} after {timeout} s: "
                    + ", ".join(missing))
            time.sleep(0.05)

    def _missing(self, groups, buffers):
        ready = set()
        for w in self.workers():
            if not (w.alive and w.streaming):
                continue
            for m in w.memberships:
                if not buffers or any(b.group == m.group for b in w.buffers):
                    ready.add((m.group, m.rank))
        return [f"{g}/{r}" for g, size in groups.items() for r in range(size)
                if (g, r) not in ready]

    def _transfer(self):
        if self.transfer is None:
            raise errors.FailedPrecondition("no transfer: call define_transfer() first or pass "
                                            "transfer=")
        return self.transfer
