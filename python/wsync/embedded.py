"""The embedded worker: wsync's worker agent running inside this process.

    worker = wsync.embedded.Worker(controller, groups="inference:0:2")
    worker.register(model)          # by pointer: nothing is copied or shared
    ...                             # the controller's syncs write into the tensors
    worker.stop()

The worker is the one ``wsync-worker`` runs (controller lease, assignment
stream, the sync runner over the host backend, or the CUDA backend in a CUDA
build when ``device`` is given), built in this process by the extension
``wsync._native`` (its ``worker`` part). Tensors are registered by their data pointer, dtype and
shape: no shared memory, no CUDA IPC, so memory no other process can map (vLLM's
sleep-mode allocations) can be synced. The worker keeps a reference to every
registered tensor while it may touch it; the tensor must stay where it is
(``stale()`` names those whose storage moved, ``refresh()`` registers them
again). An embedded worker takes no part in direct writes (peers cannot map its
memory): its buckets travel over the transport.

Errors are wsync.errors exceptions (``InvalidArgument``, ``FailedPrecondition``,
``AlreadyExists``, ...) whose message names the tensor.
"""
import atexit
import collections
import os
import threading
import time
import weakref

from wsync import dtypes, errors
from wsync.torch import SERVING_STATES  # set_serving's states
from wsync.torch import _named  # (name, tensor) pairs of a module, dict or list

# One tensor by pointer: what the worker needs to read and write it.
Pointer = collections.namedtuple("Pointer", "name dtype shape data_ptr nbytes device keep")
Pointer.__new__.__defaults__ = (-1, None)

_CODES = {"INVALID_ARGUMENT": errors.InvalidArgument, "NOT_FOUND": errors.NotFound,
          "ALREADY_EXISTS": errors.AlreadyExists,
          "FAILED_PRECONDITION": errors.FailedPrecondition,
          "UNAVAILABLE": errors.Unavailable, "DEADLINE_EXCEEDED": errors.DeadlineExceeded,
          "ABORTED": errors.Aborted, "CANCELLED": errors.Cancelled,
          "RESOURCE_EXHAUSTED": errors.ResourceExhausted, "INTERNAL": errors.Internal}

_LIVE = weakref.WeakSet()



def _native():
    # torch first: a CUDA build's libnccl.so.2 then binds to the copy torch
    # loaded (one libnccl per process; python/README.md).
    try:
        import torch  # noqa: F401
    except ImportError:
        pass
    try:
        from wsync import _native
    except ImportError as e:
        raise ImportError("wsync._native (with the embedded worker) is not built: build the "
                          "CMake target wsync_native (needs pybind11-dev)") from e
    return _native.worker


def _call(fn, *args, **kwargs):
    """fn(...), with wsync._native.worker.Error raised as the wsync.errors class of its code."""
    try:
        return fn(*args, **kwargs)
    except _native().Error as e:
        code, message = e.args
        raise _CODES.get(code, errors.WsyncError)(message) from None


def backends():
    """The data-plane backends this build has: ["host"], or ["host", "cuda"] with CUDA."""
    return list(_native().backends())


def parse_groups(groups):
    """[(group, rank, size)] from "g:r:s[,g:r:s]" or an iterable of triples."""
    if isinstance(groups, str):
        out = []
        for item in filter(None, groups.split(",")):
            parts = item.split(":")
            if len(parts) != 3:
                raise errors.InvalidArgument(f"bad membership {item!r} (want group:rank:size)")
            out.append((parts[0], int(parts[1]), int(parts[2])))
        return out
    return [(str(g), int(r), int(s)) for g, r, s in groups]


def _local(name, t):
    """The plain tensor whose memory `t` names (a DTensor's local shard)."""
    if hasattr(t, "placements") and hasattr(t, "to_local"):
        t = t.to_local()
    if not t.is_contiguous():
        raise errors.InvalidArgument(
            f"tensor {name!r} is not contiguous (strides {tuple(t.stride())}): the worker "
            "reads and writes registered tensors row-major; register a contiguous tensor")
    return t


def pointer_of(name, tensor):
    """The Pointer of a torch tensor (keeping the tensor alive)."""
    t = _local(name, tensor)
    device = -1 if t.device.type == "cpu" else (t.device.index or 0)
    # The worker keeps (tensor, the view of its memory now): after
    # `param.data = new` the Parameter alone no longer holds the registered
    # storage, which the worker may still touch until refresh().
    return Pointer(name, dtypes.value(t.dtype), tuple(t.shape), t.data_ptr(),
                   t.numel() * t.element_size(), device, _Held(tensor, t.detach()))


class _Held(tuple):
    """What the worker keeps for a torch tensor: (the tensor, its registered memory)."""

    def __new__(cls, tensor, memory):
        return super().__new__(cls, (tensor, memory))


def _owner(keep):
    """The tensor a Pointer's keep stands for (itself unless _Held)."""
    return keep[0] if isinstance(keep, _Held) else keep


class Worker:
    """A worker in this process for `groups` ("group:rank:size[,...]" or
    triples), connected to `controller` (host:port). `device`: the CUDA device
    of the tensors it moves (needs a CUDA build), None for host memory.
    `metrics_port`: None for no /metrics endpoint, 0 for any free port.
    `controller_ca`: PEM CA of the controller's certificate (TLS; empty:
    plaintext, for a --insecure controller); `cert` / `key`: this worker's
    client certificate (mutual TLS, docs/security.md).
    `local_socket`: also serve the local API there (wsync.torch.register and
    the descriptor socket beside it), so that another process on this
    device, e.g. a colocated trainer, registers its tensors with this worker:
    it then holds both sides and copies between them locally, where no NCCL
    communicator could (NCCL refuses two ranks on one GPU).
    Starts at once unless `start=False`; ``stop()`` (or the end of a ``with``
    block, or process exit) ends it.
    `staging_budget_bytes`: the most shadow memory a staged sync may allocate
    on this worker (wsync-worker's --staging_budget_bytes, docs/staging.md;
    0: no limit); sent at registration, so the controller refuses a staged
    plan over it up front.
    `busy_poll_ms`: the low-latency mode (wsync-worker's --busy_poll_ms,
    docs/performance-notes.md): after each assignment or report, two of the
    worker's threads poll for this many milliseconds instead of sleeping (a
    core each), so a sync after an idle spell pays no thread wake-up; -1
    spins forever, 0 is off; None (default): $WSYNC_BUSY_POLL_MS (which
    wsync-worker and wsync-controller read too), else 0.
    `controller_lane`: the controller's control fast lane (its --lane_socket;
    wsync-worker's --controller_lane): results are reported on that Unix
    socket, over gRPC when it is absent or refuses; None (default):
    $WSYNC_CONTROLLER_LANE, else gRPC only.
    `flip_ack_wait`: seconds a staged sync into a flip pair of arenas
    (wsync.torch.pack_into_flip_arenas, docs/commit-flip.md) waits for the
    owner's acknowledgement of the pair's last flip before it fails."""

    def __init__(self, controller, groups, *, device=None, node="", data_address="127.0.0.1",
                 metrics_port=None, metrics_host="127.0.0.1", round_timeout=60.0,
                 staging_limit_bytes=0, staging_budget_bytes=0, instance_id="", controller_ca="",
                 cert="", key="", local_socket=None, busy_poll_ms=None, controller_lane=None,
                 flip_ack_wait=30.0, start=True):
        self.groups = parse_groups(groups)
        self.device = -1 if device is None else int(device)  # -1: host memory
        if busy_poll_ms is None:
            env = os.environ.get("WSYNC_BUSY_POLL_MS", "0")
            try:
                busy_poll_ms = int(env)
            except ValueError:
                raise errors.InvalidArgument(
                    f"WSYNC_BUSY_POLL_MS={env!r}: want -1 (spin forever), 0 (off) or a spin "
                    "window in milliseconds") from None
        self._w = _call(_native().EmbeddedWorker, controller, self.groups,
                        device=-1 if device is None else int(device), node=node,
                        data_address=data_address,
                        metrics_port=-1 if metrics_port is None else int(metrics_port),
                        metrics_host=metrics_host, round_timeout_s=float(round_timeout),
                        staging_limit_bytes=int(staging_limit_bytes),
                        staging_budget_bytes=int(staging_budget_bytes), instance_id=instance_id,
                        controller_ca=controller_ca, cert=cert, key=key,
                        local_socket=local_socket or "", busy_poll_ms=int(busy_poll_ms),
                        controller_lane=controller_lane if controller_lane is not None
                        else os.environ.get("WSYNC_CONTROLLER_LANE", ""),
                        flip_ack_wait_s=float(flip_ack_wait))
        self.local_socket = local_socket or None
        self._lock = threading.Lock()
        self._registered = {}  # (group, name) -> (tensor, data_ptr)
        self._following = []  # tensors flip commits moved ({name: tensor} each); _apply_follows
        _LIVE.add(self)
        if start:
            self.start()

    # ------------------------------------------------------------ lifecycle --
    def start(self):
        _call(self._w.start)

    def stop(self):
        """Ends the lease (the controller drops this worker), aborts a running
        sync and joins the worker's threads. Final: a stopped worker refuses
        registrations and cannot start again."""
        self._w.stop()

    @property
    def running(self):
        return self._w.running

    @property
    def backend(self):
        return self._w.backend

    @property
    def metrics_port(self):
        port = self._w.metrics_port
        return None if port < 0 else port

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()

    # --------------------------------------------------------- registration --
    def _group(self, group):
        if group is not None:
            return group
        if len(self.groups) != 1:
            raise errors.InvalidArgument(
                f"this worker is in groups {[g for g, _, _ in self.groups]}: name the group")
        return self.groups[0][0]

    def register(self, tensors, group=None, replace=False):
        """Registers `tensors` (a module's parameters, {name: tensor} or
        (name, tensor) pairs) for `group` (default: the worker's only group)
        by pointer. `replace`: the group's earlier registrations go. A bad
        entry changes nothing. Returns (tensors of the group, bytes)."""
        pointers = [pointer_of(n, t) for n, t in _named(tensors)]
        return self.register_pointers(pointers, group=group, replace=replace)

    def register_pointers(self, pointers, group=None, replace=False):
        """Registers raw Pointer records (memory that is not a torch tensor);
        `keep` of each is held while the worker may touch the memory."""
        group = self._group(group)
        args = [(p.name, int(p.dtype), [int(d) for d in p.shape], int(p.data_ptr),
                 int(p.nbytes), int(p.device), p.keep) for p in pointers]
        with self._lock:
            self._apply_follows()
            result = _call(self._w.register, group, args, replace=replace)
            if replace:
                self._registered = {k: v for k, v in self._registered.items() if k[0] != group}
            for p in pointers:
                self._registered[(group, p.name)] = p
        return result

    def _moved(self):
        """{group: [name]} of tensors whose storage moved since registration
        (under _lock)."""
        self._apply_follows()
        moved = {}
        for (group, name), p in self._registered.items():
            t = _owner(p.keep)
            if not hasattr(t, "data_ptr"):
                continue
            now = _local(name, t)
            if (now.data_ptr() != p.data_ptr or tuple(now.shape) != tuple(p.shape)
                    or dtypes.value(now.dtype) != p.dtype):
                moved.setdefault(group, []).append(name)
        return moved

    def _follow(self, tensors):
        """After a flip commit moved the registered memory of `tensors`
        ({name: tensor}, rebound by the owner; FlipArenas.flip): their
        records are brought up to date before the next look at them
        (_moved, register), as the worker already holds the new memory, so
        stale() and refresh() do not register them again. Cheap: the flip
        is inside the owner's pause."""
        with self._lock:
            self._following.append(tensors)

    def _apply_follows(self):
        """Records the memory of every tensor a flip moved (under _lock)."""
        if not self._following:
            return
        ids = {id(t) for tensors in self._following for t in tensors.values()}
        self._following = []
        for key, p in list(self._registered.items()):
            t = _owner(p.keep)
            if id(t) in ids:
                self._registered[key] = pointer_of(key[1], t)

    def stale(self):
        """Names of registered tensors whose storage moved since (e.g. after
        an offload / reload); the worker still holds their old memory."""
        with self._lock:
            return [n for names in self._moved().values() for n in names]

    def refresh(self):
        """Registers the groups of stale tensors again (by pointer: cheap);
        False when none moved."""
        with self._lock:
            moved = self._moved()
            again = {g: [pointer_of(n, _owner(p.keep)) if hasattr(_owner(p.keep), "data_ptr") else p
                         for (gg, n), p in self._registered.items() if gg == g]
                     for g in moved}
        for group, pointers in again.items():
            self.register_pointers(pointers, group=group, replace=True)
        return bool(moved)

    # --------------------------------------------------------------- status --
    def status(self):
        """{registered, lease_id, last_version, syncs_ok, syncs_failed, running}."""
        return self._w.status()

    def hold(self, reason):
        """Holds syncs off: each in-place sync the controller assigns while
        held fails at once, naming `reason`, before any registered tensor is
        touched (event "finished" with ``untouched``). A staged sync stages
        into its shadow while held and commits (event "commit") only once
        admit() is called; still held at its deadline it rolls back, the
        tensors untouched (docs/staging.md). For memory that must not be
        written now (an inference engine generating, weights asleep).

        A staged commit that began before the hold (the worker found no hold
        when it began it) is not cut: hold() waits for it to end (up to the
        worker's hold_commit_wait, 10 s). Returns the sync id of the last
        commit that began since syncs were last admitted ("" when none began:
        nothing was written); its events (COMMITTED or FINISHED) are
        published by then. DeadlineExceeded: it still writes after that
        wait (the hold stands; its outcome follows as events)."""
        if not reason:
            raise errors.InvalidArgument("hold: give the reason syncs are held off")
        return _call(self._w.hold_syncs, str(reason))

    def admit(self):
        """Admits syncs again after hold()."""
        self._w.hold_syncs("")

    def set_serving(self, version, state, *, group=None, replica="", replica_ranks=0):
        """Tells the worker which weight `version` this process serves for
        `group` (default: the worker's only group) and in what `state`: one
        of "serving", "paused", "updating", "failed" (SERVING_STATES). The
        worker exports it on /metrics (wsync_worker_serving_version /
        _state) and reports it to the controller at once, where
        ``Client.serving()`` shows it per replica. `replica` labels the model
        copy this rank belongs to (e.g. one vLLM server's TP ranks; "": the
        group's unlabelled ranks form one replica) and `replica_ranks` its
        number of ranks (0: unknown). docs/api.md, "Serving versions"."""
        if state not in SERVING_STATES:
            raise errors.InvalidArgument(
                f"set_serving: state {state!r} is not one of {sorted(SERVING_STATES)}")
        if isinstance(version, bool) or not isinstance(version, int) or version < 0:
            raise errors.InvalidArgument(
                f"set_serving: version {version!r} is not a non-negative int")
        _call(self._w.set_serving, self._group(group), version, SERVING_STATES[state],
              replica=str(replica), replica_ranks=int(replica_ranks))

    def events(self):
        """A subscription to sync events from now on: ``next(timeout)`` gives
        {kind: "started"|"finished" (staged syncs: also "staged", "commit",
        "committed", "rolled_back"; docs/staging.md), sync_id, transfer,
        version, ok, error, untouched, serving_version}
        or None; ``close()`` ends it."""
        return self._w.events()

    def wait_registered(self, timeout=30.0):
        """Waits until the worker holds a controller lease."""
        end = time.monotonic() + timeout
        while not self.status()["registered"]:
            if time.monotonic() > end:
                raise errors.DeadlineExceeded(
                    f"embedded worker {self.groups} holds no lease after {timeout} s")
            time.sleep(0.02)

    def wait_version(self, version, timeout=60.0):
        """Waits until this worker finished `version` (or a later one) successfully."""
        end = time.monotonic() + timeout
        while self.status()["last_version"] < version:
            if time.monotonic() > end:
                raise errors.DeadlineExceeded(
                    f"embedded worker {self.groups}: version {version} not done after "
                    f"{timeout} s (status {self.status()})")
            time.sleep(0.02)


@atexit.register
def _stop_all():
    for w in list(_LIVE):
        w.stop()
