"""Registration of a rank's tensors with its local worker (worker_local.proto).

    reg = wsync.torch.register(model, group="trainer", rank=rank)

Device (CUDA) tensors, for a worker started with ``--device N`` on the same
GPU, are registered by legacy CUDA IPC (wsync.cuda_ipc): the handle of the
cudaMalloc allocation holding each tensor, the allocation's size and the
tensor's byte range in it. Nothing is copied or re-pointed: the worker reads
and writes the trainer's live memory. DTensors register their local tensor
(``to_local()``), which is the parameter's own storage: for FSDP2's
``fully_shard`` it views the padded shard buffer from offset 0 with the
unpadded local shard's size (torch.chunk rows), so the registered range is
exactly the local shard and the padding is not registered. Memory from
``PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True`` (cuMem) has no legacy
handle and is refused with a FailedPrecondition naming the setting (the
SCM_RIGHTS file-descriptor path is future work). Legacy IPC handles open only
inside the owner's PID namespace (docs/gpu.md).

Host (CPU) tensors are moved into one POSIX shared-memory object that the
worker maps: each tensor's data is copied there and the tensor (parameter)
is re-pointed at it in place (``tensor.data = shm_view``), so the trainer keeps
using the same objects and the worker reads / writes the live values. The
mapping lives as long as any tensor viewing it (the tensors hold the mmap). The
shm name stays until ``Registration.close()`` or the process exits (peer
workers open it by name for direct writes). Host DTensors are refused (their
owner, e.g. FSDP2's padded shard buffer, would not follow a move).

If the trainer reallocates a registered tensor (optimizer offload/reload,
``param.data = new``) ``Registration.stale()`` names it and ``refresh()``
registers it again (host: moved into a new shm object; device: exported
again where it now lives).
"""
import atexit
import mmap
import os
import uuid

import grpc
import torch as _torch

from wsync import cuda_ipc, cuda_vmm, dtypes, errors
from wsync._proto import worker_local_pb2 as lpb
from wsync._proto import worker_local_pb2_grpc as lpb_grpc

_ALIGN = 64


def default_socket_dir():
    """The worker's private socket directory: $XDG_RUNTIME_DIR/wsync, else
    /tmp/wsync-<uid> (worker/agent/local_socket.h)."""
    xdg = os.environ.get("XDG_RUNTIME_DIR", "")
    if xdg.startswith("/"):
        return os.path.join(xdg, "wsync")
    return f"/tmp/wsync-{os.getuid()}"


def default_socket(group, rank):
    """$WSYNC_LOCAL_SOCKET, else the worker's default for group/rank."""
    return (os.environ.get("WSYNC_LOCAL_SOCKET")
            or os.path.join(default_socket_dir(), f"worker-{group}-{rank}.sock"))


def _named(tensors):
    if hasattr(tensors, "named_parameters"):
        return list(tensors.named_parameters())
    if isinstance(tensors, dict):
        return list(tensors.items())
    return list(tensors)


def _check_movable(name, t):
    if hasattr(t, "placements") and hasattr(t, "device_mesh"):
        raise errors.FailedPrecondition(
            f"tensor {name!r} is a DTensor: host registration moves a tensor's storage into "
            "shared memory, which a DTensor's owner (FSDP2's padded shard buffer) would not "
            "follow; pass local tensors you own (e.g. {name: shard}) or use the device path")


def _check_host(name, t):
    if t.device.type != "cpu":
        raise errors.FailedPrecondition(
            f"tensor {name!r} is on {t.device}: wsync registers host tensors only (shared "
            "memory, host workers) or CUDA tensors (CUDA IPC, workers with --device)")


def _aligned(n):
    return (n + _ALIGN - 1) // _ALIGN * _ALIGN


class _ShmArena:
    """One POSIX shared-memory object mapped into this process. The tensors
    made from it keep the mapping alive (torch.frombuffer holds the mmap), so
    it stays valid after this object is gone; unlink() only removes the name."""

    def __init__(self, size):
        self.name = f"/wsync-{os.getpid()}-{uuid.uuid4().hex[:12]}"
        fd = _shm_open(self.name)
        try:
            os.ftruncate(fd, size)
            self.map = mmap.mmap(fd, size)
        except BaseException:
            _shm_unlink(self.name)
            raise
        finally:
            os.close(fd)
        self.bytes = _torch.frombuffer(self.map, dtype=_torch.uint8)
        self.linked = True
        _LINKED[self.name] = self

    def unlink(self):
        if self.linked:
            _shm_unlink(self.name)
            self.linked = False
            _LINKED.pop(self.name, None)


# Names stay linked while registered: peer workers open them by name when they
# write directly. They go at close(), at refresh() (the old one) or at exit.
_LINKED = {}


@atexit.register
def _unlink_all():
    for arena in list(_LINKED.values()):
        arena.unlink()


def _shm_open(name):
    try:
        import _posixshmem
        return _posixshmem.shm_open(name, os.O_CREAT | os.O_EXCL | os.O_RDWR, mode=0o600)
    except ImportError:  # pragma: no cover - CPython has it on Linux
        return os.open("/dev/shm" + name, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)


def _shm_unlink(name):
    try:
        import _posixshmem
        _posixshmem.shm_unlink(name)
    except FileNotFoundError:
        pass
    except ImportError:  # pragma: no cover
        os.unlink("/dev/shm" + name)


class Registration:
    """Tensors of one group registered with one worker, held in one shm object."""

    def __init__(self, socket, group, timeout):
        self.socket = socket
        self.group = group
        self.timeout = timeout
        self.tensors = {}  # registered name -> tensor (re-pointed into shm)
        self._views = {}   # registered name -> the shm view it was given
        self._offsets = {}
        self._arena = None
        self.bytes = 0

    @property
    def shm_name(self):
        return self._arena.name if self._arena else ""

    def _layout(self, items):
        off = 0
        for name, t in items:
            self._offsets[name] = off
            off += _aligned(t.numel() * t.element_size())
        return max(off, _ALIGN)

    def _move(self, items):
        """Creates the shm object and re-points every tensor into it."""
        self._arena = _ShmArena(self._layout(items))
        base = self._arena.bytes
        for name, t in items:
            nbytes = t.numel() * t.element_size()
            off = self._offsets[name]
            view = base[off:off + nbytes].view(t.dtype).view(t.shape)
            with _torch.no_grad():
                view.copy_(t)
                t.data = view
            self.tensors[name] = t
            self._views[name] = view
            self.bytes += nbytes

    def request(self, replace=True):
        req = lpb.RegisterTensorsRequest(group=self.group, replace=replace)
        for name, t in self.tensors.items():
            nbytes = t.numel() * t.element_size()
            req.tensors.add(name=name, dtype=dtypes.value(t.dtype), shape=list(t.shape),
                            shm=lpb.HostShm(name=self.shm_name, offset=self._offsets[name],
                                            size=nbytes))
        return req

    def send(self, replace=True):
        """RegisterTensors on the worker; returns its response."""
        with grpc.insecure_channel("unix:" + self.socket) as channel:
            stub = lpb_grpc.WorkerLocalStub(channel)
            try:
                return stub.RegisterTensors(self.request(replace), timeout=self.timeout,
                                            wait_for_ready=True)
            except grpc.RpcError as e:
                if e.code() == grpc.StatusCode.DEADLINE_EXCEEDED and not os.path.exists(
                        self.socket):
                    raise errors.Unavailable(
                        f"worker socket {self.socket}: no worker is listening (waited "
                        f"{self.timeout} s for it to start)") from None
                err = errors.from_rpc_error(e, f"worker socket {self.socket}")
                err.message = f"RegisterTensors (group {self.group!r}): {err.message}"
                err.args = (err.message,)
                raise err from None

    def set_serving(self, version, state, *, replica="", replica_ranks=0):
        """wsync.torch.set_serving for this registration's worker and group."""
        set_serving(self.socket, self.group, version, state, replica=replica,
                    replica_ranks=replica_ranks, timeout=self.timeout)

    def stale(self):
        """Names of registered tensors whose data no longer lives where it was
        registered (reallocated since)."""
        return [n for n, t in self.tensors.items()
                if t.data_ptr() != self._views[n].data_ptr() or t.shape != self._views[n].shape
                or t.dtype != self._views[n].dtype]

    def refresh(self):
        """Registers again if any tensor was reallocated (cheap when none was):
        moves every tensor into a new shm object and replaces the
        registration. Returns whether it registered again."""
        if not self.stale():
            return False
        items = list(self.tensors.items())
        saved = (self._arena, self.tensors, self._views, self._offsets, self.bytes)
        # Where each tensor lives now (the trainer's new memory): if the worker
        # does not take the new object, the tensors go back there, so stale()
        # still names them and a later refresh() tries again.
        current = {name: t.data for name, t in items}
        self.tensors, self._views, self._offsets, self.bytes = {}, {}, {}, 0
        self._move(items)
        try:
            self.send(replace=True)
        except BaseException:
            fresh = self._arena
            with _torch.no_grad():
                for name, t in items:
                    t.data = current[name]
            self._arena, self.tensors, self._views, self._offsets, self.bytes = saved
            fresh.unlink()
            raise
        saved[0].unlink()
        return True

    def close(self):
        """Unlinks the shm object's name (the tensors keep their memory mapped;
        the worker keeps its mapping until the group registers again)."""
        if self._arena is not None:
            self._arena.unlink()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def _is_dtensor(t):
    return hasattr(t, "placements") and hasattr(t, "device_mesh")


def _is_cuda(t):
    return (t.to_local() if _is_dtensor(t) else t).device.type == "cuda"


def register(tensors, *, group, rank=None, socket=None, names=None, replace=True, timeout=10.0):
    """Registers `tensors` (a torch.nn.Module, a dict or (name, tensor) pairs
    this process owns; all on the host or all on CUDA) with the worker of
    `group`/`rank` (rank default: $RANK) at `socket` (default:
    default_socket). `names` maps a tensor's name to the buffer name of the
    layout (default: the same). Returns a Registration (host) or a
    CudaRegistration (device). Raises FailedPrecondition for host DTensors
    and for CUDA memory legacy IPC cannot export (expandable segments),
    InvalidArgument for a mix of host and device tensors, and the worker's
    errors as WsyncError (InvalidArgument: not one of its groups, bad shape,
    wrong GPU; Unavailable: no worker at the socket)."""
    if rank is None:
        rank = int(os.environ.get("RANK", "0"))
    named = [((names or {}).get(n, n), n, t) for n, t in _named(tensors)]
    on_cuda = {n for _, n, t in named if _is_cuda(t)}
    if on_cuda and len(on_cuda) != len(named):
        host = next(n for _, n, _ in named if n not in on_cuda)
        raise errors.InvalidArgument(
            f"tensor {host!r} is on the host but {sorted(on_cuda)[0]!r} is on CUDA: one "
            "registration holds host tensors (host worker) or device tensors (worker with "
            "--device), not both")
    socket = socket or default_socket(group, rank)
    if on_cuda:
        reg = CudaRegistration(socket, group, timeout)
        reg.add([(buf, t) for buf, _, t in named])
        reg.send(replace=replace)
        return reg
    items = []
    for buf, name, t in named:
        _check_movable(name, t)
        _check_host(name, t)
        if not t.is_contiguous():
            raise errors.InvalidArgument(f"tensor {name!r} is not contiguous")
        items.append((buf, t))
    reg = Registration(socket, group, timeout)
    reg._move(items)
    try:
        reg.send(replace=replace)
    except BaseException:
        reg.close()
        raise
    return reg


class CudaRegistration(Registration):
    """Device tensors of one group registered with one worker by CUDA IPC.
    ``tensors`` holds what was passed (DTensors included); the registered
    memory is each one's local tensor where it lives."""

    def __init__(self, socket, group, timeout):
        super().__init__(socket, group, timeout)
        self._ipc = {}    # registered name -> CudaIpc fields (cudaMalloc memory)
        self._vmm = {}    # registered name -> (device, data_ptr, bytes, gpu_uuid) (cuMem memory)
        self._size = {}   # registered name -> bytes
        self._where = {}  # registered name -> (data_ptr, shape, dtype) at export
        self._vmm_fields = {}  # registered name -> CudaVmm fields of the last send

    @staticmethod
    def _local(t):
        return t.to_local() if _is_dtensor(t) else t

    def add(self, items):
        """Exports each (name, tensor) where it lives (no copy): by CUDA IPC,
        or, for expandable segments, as file descriptors at send()."""
        segments, uuids = cuda_ipc.SegmentSizes(), {}
        for name, t in items:
            local = self._local(t)
            self._ipc.pop(name, None)
            self._vmm.pop(name, None)
            if segments.is_expandable(name, local.device.index, local.data_ptr()):
                nbytes = _vmm_checked_bytes(name, local)
                self._vmm[name] = (local.device.index, local.data_ptr(), nbytes,
                                   cuda_ipc.cached_uuid(uuids, local.device.index))
            else:
                self._ipc[name] = cuda_ipc.export(name, local, segments, uuids)
                nbytes = self._ipc[name]["size"]
            self._where[name] = (local.data_ptr(), tuple(local.shape), local.dtype)
            self.tensors[name] = t
            self._size[name] = nbytes
            self.bytes += nbytes

    def _export_vmm(self):
        """Hands the worker the descriptors of every cuMem chunk the tensors
        use; returns the CudaVmm fields per tensor (with the token)."""
        if not self._vmm:
            return {}
        export = cuda_vmm.Export()
        devices = {device for device, _, _, _ in self._vmm.values()}
        for name, (device, ptr, nbytes, uuid_) in self._vmm.items():
            with _torch.cuda.device(device):
                export.add(name, ptr, nbytes, uuid_)
        if len(devices) > 1:
            raise errors.InvalidArgument(
                f"tensors on {len(devices)} devices {sorted(devices)}: a worker maps one GPU's "
                "memory; register each device's tensors with its own worker")
        with _torch.cuda.device(devices.pop()):
            token = export.send(cuda_vmm.fd_socket_path(self.socket), self.timeout)
        out = {}
        for name, f in export.tensors.items():
            chunks = [lpb.CudaVmm.Chunk(fd_index=i, bytes=b) for i, b in f["chunks"]]
            out[name] = lpb.CudaVmm(fd_token=token, chunks=chunks, offset=f["offset"],
                                    size=f["size"], gpu_uuid=f["gpu_uuid"])
        return out

    def send(self, replace=True):
        self._vmm_fields = self._export_vmm()
        return super().send(replace)

    def request(self, replace=True):
        req = lpb.RegisterTensorsRequest(group=self.group, replace=replace)
        for name, t in self.tensors.items():
            local = self._local(t)
            entry = req.tensors.add(name=name, dtype=dtypes.value(local.dtype),
                                    shape=list(local.shape))
            if name in self._vmm:
                entry.cuda_vmm.CopyFrom(self._vmm_fields[name])
            else:
                entry.cuda_ipc.CopyFrom(lpb.CudaIpc(**self._ipc[name]))
        return req

    def stale(self):
        out = []
        for name, t in self.tensors.items():
            local = self._local(t)
            if (local.data_ptr(), tuple(local.shape), local.dtype) != self._where[name]:
                out.append(name)
        return out

    def refresh(self):
        """Exports the reallocated tensors again and replaces the
        registration; returns whether it registered again. Tensors in
        expandable segments are always registered again: the allocator may map
        new physical memory at the same address (offload / reload,
        empty_cache), which stale()'s pointer check cannot see, while the
        worker would keep the old memory mapped. That costs one descriptor per
        chunk and one RegisterTensors call."""
        moved = self.stale()
        if not moved:
            if not self._vmm:
                return False
            self.send(replace=True)
            return True
        items = [(n, self.tensors[n]) for n in moved]
        # Until the worker took the new handles, stale() must still name the
        # moved tensors (a failed send or export is retried by the next refresh).
        saved = (dict(self._ipc), dict(self._vmm), dict(self._size), dict(self._where),
                 dict(self.tensors), self.bytes)
        try:
            for n in moved:
                self.bytes -= self._size[n]
            self.add(items)
            self.send(replace=True)
        except BaseException:
            (self._ipc, self._vmm, self._size, self._where, self.tensors,
             self.bytes) = saved
            raise
        return True

    def close(self):
        """Nothing to release here: the worker unmaps a base when the group
        registers again or the worker goes."""


def _vmm_checked_bytes(name, t):
    if not t.is_contiguous():
        raise errors.InvalidArgument(f"tensor {name!r} is not contiguous")
    nbytes = t.numel() * t.element_size()
    if nbytes == 0:
        raise errors.InvalidArgument(f"tensor {name!r} has no data (0 bytes): nothing to register")
    return nbytes


def sync_events(socket, timeout=None):
    """Yields the worker's SyncEvents (STARTED / FINISHED per sync) from `socket`."""
    with grpc.insecure_channel("unix:" + socket) as channel:
        stub = lpb_grpc.WorkerLocalStub(channel)
        try:
            for ev in stub.SyncEvents(lpb.SyncEventsRequest(), timeout=timeout):
                yield ev
        except grpc.RpcError as e:
            raise errors.from_rpc_error(e, f"worker socket {socket}") from None


# set_serving's states -> the ServingState values of worker_local.proto.
SERVING_STATES = {"serving": lpb.SERVING_STATE_SERVING, "paused": lpb.SERVING_STATE_PAUSED,
                  "updating": lpb.SERVING_STATE_UPDATING, "failed": lpb.SERVING_STATE_FAILED}


def set_serving(socket, group, version, state, *, replica="", replica_ranks=0, timeout=5.0):
    """Tells the worker at `socket` which weight `version` this process
    serves for `group`, in `state` ("serving", "paused", "updating",
    "failed"); the controller then answers Client.serving / replicas_at with
    it (docs/api.md, "Serving versions"). For owners beside a wsync-worker
    process; an embedded worker has Worker.set_serving."""
    if state not in SERVING_STATES:
        raise errors.InvalidArgument(
            f"set_serving: state {state!r} is not one of {sorted(SERVING_STATES)}")
    req = lpb.SetServingRequest(group=group, version=int(version), state=SERVING_STATES[state],
                                replica=replica, replica_ranks=int(replica_ranks))
    with grpc.insecure_channel("unix:" + socket) as channel:
        try:
            lpb_grpc.WorkerLocalStub(channel).SetServing(req, timeout=timeout)
        except grpc.RpcError as e:
            raise errors.from_rpc_error(e, f"worker socket {socket}") from None


def local_status(socket, timeout=5.0):
    """The worker's LocalStatusResponse (lease, last version, sync counts)."""
    with grpc.insecure_channel("unix:" + socket) as channel:
        try:
            return lpb_grpc.WorkerLocalStub(channel).Status(lpb.LocalStatusRequest(),
                                                            timeout=timeout)
        except grpc.RpcError as e:
            raise errors.from_rpc_error(e, f"worker socket {socket}") from None


# Weight arenas for swap commits (docs/commit-swap.md); at the end: it imports this module.
from wsync.torch_arena import (  # noqa: E402,F401
    FlipArenas, WeightArena, pack_into_arena, pack_into_flip_arenas)
