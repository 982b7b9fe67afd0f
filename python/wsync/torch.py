"""Registration of a rank's tensors with its local worker (worker_local.proto).

    reg = wsync.torch.register(model, group="trainer", rank=rank)

Host (CPU) tensors are moved into one POSIX shared-memory object that the
worker maps: each tensor's data is copied there and the tensor (parameter)
is re-pointed at it in place (``tensor.data = shm_view``), so the trainer keeps
using the same objects and the worker reads / writes the live values. The
mapping lives as long as any tensor viewing it (the tensors hold the mmap). The
shm name stays until ``Registration.close()`` or the process exits (peer
workers open it by name for direct writes).
If the trainer reallocates a registered tensor (optimizer offload/reload,
``param.data = new``) ``Registration.stale()`` names it and ``refresh()``
moves and registers it again.

Device (CUDA) tensors need the worker's CUDA IPC / SCM_RIGHTS path, which this
package does not provide yet: they are refused with an error saying so, and so
are DTensors (their owner, e.g. FSDP2's padded shard buffer, would not follow a
move): register the local tensors your code owns.
"""
import atexit
import mmap
import os
import uuid

import grpc
import torch as _torch

from wsync import dtypes, errors
from wsync._proto import worker_local_pb2 as lpb
from wsync._proto import worker_local_pb2_grpc as lpb_grpc

_ALIGN = 64


def default_socket(group, rank):
    """$WSYNC_LOCAL_SOCKET, else the worker's default for group/rank."""
    return os.environ.get("WSYNC_LOCAL_SOCKET") or f"/tmp/wsync-worker-{group}-{rank}.sock"


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
            f"tensor {name!r} is on {t.device}: this package registers host tensors only "
            "(shared memory, host workers); device tensors need the CUDA IPC path")


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
        old = self._arena
        self.tensors, self._views, self._offsets, self.bytes = {}, {}, {}, 0
        self._move(items)
        self.send(replace=True)
        old.unlink()
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


def register(tensors, *, group, rank=None, socket=None, names=None, replace=True, timeout=10.0):
    """Registers `tensors` (a torch.nn.Module, a dict or (name, tensor) pairs of
    host tensors this process owns) with the worker of `group`/`rank`
    (rank default: $RANK) at `socket` (default: default_socket). `names`
    maps a tensor's name to the buffer name of the layout (default: the same).
    Returns a Registration. Raises FailedPrecondition for device tensors and
    the worker's errors as WsyncError (InvalidArgument: not one of its groups,
    bad shape; Unavailable: no worker at the socket)."""
    if rank is None:
        rank = int(os.environ.get("RANK", "0"))
    items = []
    for name, t in _named(tensors):
        _check_movable(name, t)
        _check_host(name, t)
        if not t.is_contiguous():
            raise errors.InvalidArgument(f"tensor {name!r} is not contiguous")
        items.append(((names or {}).get(name, name), t))
    reg = Registration(socket or default_socket(group, rank), group, timeout)
    reg._move(items)
    try:
        reg.send(replace=replace)
    except BaseException:
        reg.close()
        raise
    return reg


def sync_events(socket, timeout=None):
    """Yields the worker's SyncEvents (STARTED / FINISHED per sync) from `socket`."""
    with grpc.insecure_channel("unix:" + socket) as channel:
        stub = lpb_grpc.WorkerLocalStub(channel)
        try:
            for ev in stub.SyncEvents(lpb.SyncEventsRequest(), timeout=timeout):
                yield ev
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
