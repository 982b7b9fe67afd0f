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
import time

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
        text = drv.text(res)
        # INVALID_VALUE / NOT_SUPPORTED: the allocation has no POSIX handle type.
        advice = NO_HANDLE_ADVICE if text in ("CUDA_ERROR_INVALID_VALUE",
                                              "CUDA_ERROR_NOT_SUPPORTED") else (
            "(out of open files? check RLIMIT_NOFILE)")
        raise VmmExportError(f"tensor {name!r}: cuMemExportToShareableHandle(POSIX fd) failed "
                             f"with {text}: {advice}")
    return fd.value


class Export:
    """The chunks behind a set of tensors and, per tensor, its CudaVmm fields
    except the token. add() only reads the layout; send() exports the chunks
    and hands them to the worker at most 250 at a time, closing each slice's
    descriptors once sent, so a large model never holds more than 250 open."""

    def __init__(self):
        self.bases = []      # chunk base addresses, in discovery order
        self._index = {}     # chunk base -> index into bases
        self.tensors = {}    # name -> {"chunks": [(index, bytes)], "offset", "size", "gpu_uuid"}
        self._owner = {}     # chunk index -> the first tensor using it (for errors)

    def add(self, name, ptr, nbytes, gpu_uuid):
        """Records the chunks [ptr, ptr + nbytes) touches (at least one)."""
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
            if size <= 0:
                raise VmmExportError(f"tensor {name!r}: an empty mapping at {base:#x}")
            if base not in self._index:
                self._index[base] = len(self.bases)
                self._owner[len(self.bases)] = name
                self.bases.append(base)
            chunks.append((self._index[base], size))
            addr = base + size
        self.tensors[name] = {"chunks": chunks, "offset": ptr - first, "size": nbytes,
                              "gpu_uuid": gpu_uuid}

    def send(self, fd_socket, timeout=10.0):
        """Exports every chunk and hands the descriptors to the worker's
        descriptor socket; returns the token naming them."""
        if not self.bases:
            raise errors.InvalidArgument("no CUDA virtual memory to export")
        drv = _driver()

        def export(lo, hi):
            fds = []
            try:
                for j in range(lo, hi):
                    fds.append(_export_chunk(drv, self._owner[j], self.bases[j]))
            except BaseException:
                _close(fds)
                raise
            return fds
        return _handover(fd_socket, timeout, len(self.bases), export, _close)


def _close(fds):
    for fd in fds:
        os.close(fd)


def _handover(fd_socket, timeout, count, fds_of, release):
    """The descriptor protocol (worker/agent/fd_inbox.h): `count` descriptors,
    made by fds_of(lo, hi) at most 250 at a time and passed to release()
    once sent (or failed), then DONE; returns the worker's token."""
    with _connect(fd_socket, timeout) as s:
        for lo in range(0, count, _MAX_FDS_PER_MESSAGE):
            fds = fds_of(lo, min(lo + _MAX_FDS_PER_MESSAGE, count))
            try:
                _send(s, fd_socket, [b"WSFD"], fds)
            finally:
                release(fds)
        _send(s, fd_socket, [b"DONE"], [])
        return _reply(s, fd_socket)


def _connect(fd_socket, timeout):
    """A connection to the worker's descriptor socket, waiting up to `timeout`
    for a worker that is still starting."""
    end = time.monotonic() + timeout
    while True:
        s = _socket.socket(_socket.AF_UNIX, _socket.SOCK_SEQPACKET)
        s.settimeout(timeout)
        try:
            s.connect(fd_socket)
            return s
        except (FileNotFoundError, ConnectionRefusedError) as e:
            s.close()
            if time.monotonic() >= end:
                raise errors.Unavailable(
                    f"worker descriptor socket {fd_socket}: {e} after {timeout} s (is the worker "
                    "running on this machine, as this user?)") from None
            time.sleep(0.05)
        except OSError as e:
            s.close()
            raise errors.Unavailable(f"worker descriptor socket {fd_socket}: {e}") from None


def _reply(s, fd_socket):
    try:
        reply = s.recv(4096).decode(errors="replace")
    except OSError as e:
        raise errors.Unavailable(f"worker descriptor socket {fd_socket}: no answer: {e}") from None
    if reply.startswith("OK "):
        return reply[3:].strip()
    if reply.startswith("ERR "):
        raise errors.FailedPrecondition(f"worker descriptor socket {fd_socket}: {reply[4:]}")
    raise errors.Unavailable(f"worker descriptor socket {fd_socket}: closed without an answer")


def _send(s, fd_socket, data, fds):
    """One message; if the worker already refused the batch (it answers, then
    closes), its answer is the error rather than a broken pipe."""
    try:
        if fds:
            _socket.send_fds(s, data, fds)
        else:
            s.send(data[0])
    except (BrokenPipeError, ConnectionResetError):
        _reply(s, fd_socket)  # raises with the worker's message
        raise errors.Unavailable(f"worker descriptor socket {fd_socket}: closed") from None
    except OSError as e:
        raise errors.Unavailable(f"worker descriptor socket {fd_socket}: {e}") from None


def send_fds(fd_socket, fds, timeout=10.0):
    """Hands already open `fds` to the worker's descriptor socket (at most 250
    per message); returns the token. The caller keeps and closes its fds."""
    return _handover(fd_socket, timeout, len(fds), lambda lo, hi: fds[lo:hi], lambda _: None)
