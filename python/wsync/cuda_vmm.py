"""Export of CUDA virtual memory (cuMemCreate) to the worker, as POSIX file
descriptors passed over its descriptor socket with SCM_RIGHTS.

PyTorch with ``PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True`` allocates
with the CUDA virtual memory API: an expandable segment is one reserved
address range into which the allocator maps physical allocations ("chunks",
one cuMemCreate each, 2 MiB or 20 MiB) as it grows. Such memory has no legacy
CUDA IPC handle. Each chunk a tensor's bytes touch is exported here with
``cuMemExportToShareableHandle(POSIX_FILE_DESCRIPTOR)`` (torch requests that
handle type for its expandable segments), the descriptors go to the worker's
descriptor socket (``<local socket>.fds``, worker/agent/fd_inbox.h) in
batches of at most 250, and the worker answers with a token that the
registration names (``CudaVmm`` in worker_local.proto). The worker maps the
chunks back to back as this process does. Nothing needs CAP_SYS_PTRACE or
pidfd_getfd; the socket serves only processes of the worker's own user.

Memory created without a shareable handle type (vLLM's sleep-mode allocator)
cannot be exported by any process: ``VmmExportError`` says so and points at
the embedded worker (wsync.embedded), which registers by pointer.

The chunk layout is read from the driver (ctypes over libcuda.so.1):
``cuMemGetAddressRange`` gives the mapping that holds an address and
``cuMemRetainAllocationHandle`` its allocation.
"""
import ctypes
import os
import socket as _socket

from wsync import errors

_POSIX_FD = 1          # CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR
_MAX_FDS_PER_MESSAGE = 250  # worker/agent/fd_inbox.h kMaxFdsPerMessage

NO_HANDLE_ADVICE = (
    "its memory was allocated with the CUDA virtual memory API without a shareable "
    "handle type (as vLLM's sleep-mode allocator does), so no other process can map it; "
    "run the worker inside this process instead (wsync.embedded), or allocate the "
    "weights with PyTorch's allocator (expandable_segments exports POSIX descriptors)")


class VmmExportError(errors.FailedPrecondition):
    """The tensor's virtual memory cannot be exported as file descriptors."""


def fd_socket_path(local_socket):
    """The worker's descriptor socket beside its local API socket."""
    return local_socket + ".fds"


class _Driver:
    def __init__(self):
        try:
            lib = ctypes.CDLL("libcuda.so.1")
        except OSError as e:
            raise errors.FailedPrecondition(f"cannot load the CUDA driver (libcuda.so.1): {e}")
        u64, p = ctypes.c_uint64, ctypes.POINTER
        self.range = self._fn(lib, "cuMemGetAddressRange_v2", [p(u64), p(ctypes.c_size_t), u64])
        self.retain = self._fn(lib, "cuMemRetainAllocationHandle", [p(u64), ctypes.c_void_p])
        self.export = self._fn(lib, "cuMemExportToShareableHandle",
                               [ctypes.c_void_p, u64, ctypes.c_int, ctypes.c_ulonglong])
        self.release = self._fn(lib, "cuMemRelease", [u64])
        self.error_name = self._fn(lib, "cuGetErrorName", [ctypes.c_int, p(ctypes.c_char_p)])

    @staticmethod
    def _fn(lib, name, argtypes):
        f = getattr(lib, name)
        f.argtypes, f.restype = argtypes, ctypes.c_int
        return f

    def text(self, res):
        name = ctypes.c_char_p()
        self.error_name(res, ctypes.byref(name))
        return (name.value or b"CUresult %d" % res).decode()


_DRIVER = None


def _driver():
    global _DRIVER
    if _DRIVER is None:
        _DRIVER = _Driver()
    return _DRIVER


def _chunk_at(drv, name, addr):
    """(base, size) of the mapping that holds `addr`."""
    base, size = ctypes.c_uint64(), ctypes.c_size_t()
    res = drv.range(ctypes.byref(base), ctypes.byref(size), ctypes.c_uint64(addr))
    if res != 0:
        raise errors.FailedPrecondition(
            f"tensor {name!r}: cuMemGetAddressRange({addr:#x}) failed: {drv.text(res)}")
    return base.value, size.value


def _export_chunk(drv, name, base):
    """A new file descriptor for the allocation mapped at `base`."""
    handle = ctypes.c_uint64()
    res = drv.retain(ctypes.byref(handle), ctypes.c_void_p(base))
    if res != 0:
        raise VmmExportError(
            f"tensor {name!r}: address {base:#x} is not CUDA virtual memory "
            f"(cuMemRetainAllocationHandle: {drv.text(res)})")
    fd = ctypes.c_int(-1)
    try:
        res = drv.export(ctypes.byref(fd), handle.value, _POSIX_FD, 0)
    finally:
        drv.release(handle.value)
    if res != 0:
        raise VmmExportError(f"tensor {name!r}: cuMemExportToShareableHandle(POSIX fd) failed "
                             f"with {drv.text(res)}: {NO_HANDLE_ADVICE}")
    return fd.value


class Export:
    """The chunks behind a set of tensors: one descriptor per distinct chunk
    and, per tensor, its CudaVmm fields except the token. close() closes the
    descriptors (after they were sent, the worker holds its own copies)."""

    def __init__(self):
        self.fds = []        # descriptor per chunk, in discovery order
        self._index = {}     # chunk base -> index into fds
        self.tensors = {}    # name -> {"chunks": [(index, bytes)], "offset", "size", "gpu_uuid"}

    def add(self, name, ptr, nbytes, gpu_uuid):
        """Exports the chunks [ptr, ptr + nbytes) touches (at least one)."""
        drv = _driver()
        chunks, first, addr, end = [], None, ptr, ptr + max(nbytes, 1)
        while addr < end:
            base, size = _chunk_at(drv, name, addr)
            if first is None:
                first = base
            elif base != addr:
                raise VmmExportError(
                    f"tensor {name!r}: its memory is not one contiguous run of mappings "
                    f"(a mapping starts at {base:#x}, expected {addr:#x})")
            if base not in self._index:
                self._index[base] = len(self.fds)
                self.fds.append(_export_chunk(drv, name, base))
            chunks.append((self._index[base], size))
            addr = base + size
        self.tensors[name] = {"chunks": chunks, "offset": ptr - first, "size": nbytes,
                              "gpu_uuid": gpu_uuid}

    def close(self):
        for fd in self.fds:
            os.close(fd)
        self.fds = []


def send_fds(fd_socket, fds, timeout=10.0):
    """Hands `fds` to the worker's descriptor socket; returns the token."""
    with _socket.socket(_socket.AF_UNIX, _socket.SOCK_SEQPACKET) as s:
        s.settimeout(timeout)
        try:
            s.connect(fd_socket)
        except OSError as e:
            raise errors.Unavailable(
                f"worker descriptor socket {fd_socket}: {e} (is the worker started with "
                "--device, and is this the same machine and user?)") from None
        for i in range(0, len(fds), _MAX_FDS_PER_MESSAGE):
            _socket.send_fds(s, [b"WSFD"], fds[i:i + _MAX_FDS_PER_MESSAGE])
        s.send(b"DONE")
        reply = s.recv(4096).decode(errors="replace")
    if reply.startswith("OK "):
        return reply[3:].strip()
    raise errors.FailedPrecondition(
        f"worker descriptor socket {fd_socket}: {reply[4:] if reply.startswith('ERR ') else reply!r}")
