"""Device memory made the way vLLM's sleep-mode allocator makes it (GPU only).

vLLM's CuMemAllocator (vllm/device_allocator/cumem.py and its csrc/cumem
allocator) backs the weights with the CUDA virtual memory API: per allocation
cuMemCreate with a CUmemAllocationProp whose requestedHandleTypes is 0 (no
shareable handle type), cuMemAddressReserve, cuMemMap, cuMemSetAccess. Such
memory can be exported to no other process (cuMemExportToShareableHandle has
no handle type to give), which is why wsync's vLLM backend runs the worker
inside the vLLM process (wsync.embedded).

    pool = NoHandlePool(device_index)
    t = pool.tensor((4096, 1024), torch.bfloat16)   # lives in cuMem memory
    ...
    pool.close()                                     # unmaps and frees everything

Contracts: tensors are carved from segments of at least SEGMENT bytes (one
cuMemCreate each, like the caching allocator's segments inside vLLM's memory
pool), at ALIGN-byte offsets; a tensor never spans two segments. Every
tensor keeps its memory mapped until close(); using a tensor after close() is
an error of the caller (the pool forgets them but cannot revoke them).
Errors name the driver call, its CUresult and the sizes asked for.
"""
import ctypes

import torch

SEGMENT = 32 << 20
ALIGN = 512

_ALLOCATION_PINNED = 1        # CU_MEM_ALLOCATION_TYPE_PINNED
_LOCATION_DEVICE = 1          # CU_MEM_LOCATION_TYPE_DEVICE
_ACCESS_READWRITE = 3         # CU_MEM_ACCESS_FLAGS_PROT_READWRITE
_GRANULARITY_MINIMUM = 0      # CU_MEM_ALLOC_GRANULARITY_MINIMUM
MEMORY_KIND = "cumem-no-handle"


class _Prop(ctypes.Structure):
    """CUmemAllocationProp (cuda.h)."""
    _fields_ = [("type", ctypes.c_int), ("requestedHandleTypes", ctypes.c_int),
                ("loc_type", ctypes.c_int), ("loc_id", ctypes.c_int),
                ("win32HandleMetaData", ctypes.c_void_p), ("compressionType", ctypes.c_ubyte),
                ("gpuDirectRDMACapable", ctypes.c_ubyte), ("usage", ctypes.c_ushort),
                ("reserved", ctypes.c_ubyte * 4)]


class _Access(ctypes.Structure):
    """CUmemAccessDesc (cuda.h)."""
    _fields_ = [("loc_type", ctypes.c_int), ("loc_id", ctypes.c_int), ("flags", ctypes.c_int)]


class _Driver:
    def __init__(self):
        lib = ctypes.CDLL("libcuda.so.1")
        u64, sz, p, ull = ctypes.c_uint64, ctypes.c_size_t, ctypes.POINTER, ctypes.c_ulonglong
        self.granularity = self._fn(lib, "cuMemGetAllocationGranularity",
                                    [p(sz), p(_Prop), ctypes.c_int])
        self.create = self._fn(lib, "cuMemCreate", [p(u64), sz, p(_Prop), ull])
        self.reserve = self._fn(lib, "cuMemAddressReserve", [p(u64), sz, sz, u64, ull])
        self.map = self._fn(lib, "cuMemMap", [u64, sz, sz, u64, ull])
        self.set_access = self._fn(lib, "cuMemSetAccess", [u64, sz, p(_Access), sz])
        self.unmap = self._fn(lib, "cuMemUnmap", [u64, sz])
        self.address_free = self._fn(lib, "cuMemAddressFree", [u64, sz])
        self.release = self._fn(lib, "cuMemRelease", [u64])
        self.error_name = self._fn(lib, "cuGetErrorName", [ctypes.c_int, p(ctypes.c_char_p)])

    @staticmethod
    def _fn(lib, name, argtypes):
        f = getattr(lib, name)
        f.argtypes, f.restype = argtypes, ctypes.c_int
        return f

    def check(self, res, what):
        if res != 0:
            name = ctypes.c_char_p()
            self.error_name(res, ctypes.byref(name))
            raise RuntimeError(f"{what} failed: {(name.value or b'?').decode()} ({res})")


class _Memory:
    """A contiguous device range for torch.as_tensor (__cuda_array_interface__),
    as int16 elements (numpy's typestr has no bfloat16; callers view it)."""

    def __init__(self, ptr, nbytes):
        self.__cuda_array_interface__ = {"shape": (nbytes // 2,), "typestr": "<i2",
                                         "data": (ptr, False), "version": 2, "strides": None}


class NoHandlePool:
    """Tensors in cuMem memory with no shareable handle type on one device."""

    def __init__(self, device_index):
        self.device = torch.device("cuda", device_index)
        torch.cuda.set_device(self.device)
        torch.empty(1, device=self.device)  # the primary context, current on this thread
        self.drv = _Driver()
        self.prop = _Prop(type=_ALLOCATION_PINNED, requestedHandleTypes=0,
                          loc_type=_LOCATION_DEVICE, loc_id=device_index)
        gran = ctypes.c_size_t()
        self.drv.check(self.drv.granularity(ctypes.byref(gran), ctypes.byref(self.prop),
                                            _GRANULARITY_MINIMUM),
                       "cuMemGetAllocationGranularity")
        self.granularity = gran.value
        self.segments = []  # (ptr, size, handle)
        self._cursor = self._end = 0

    def _segment(self, nbytes):
        """A new mapped segment of at least `nbytes`; returns its base."""
        size = -(-max(nbytes, SEGMENT) // self.granularity) * self.granularity
        handle, ptr = ctypes.c_uint64(), ctypes.c_uint64()
        d = self.drv
        d.check(d.create(ctypes.byref(handle), size, ctypes.byref(self.prop), 0),
                f"cuMemCreate({size} bytes, requestedHandleTypes=0) on {self.device}")
        try:
            d.check(d.reserve(ctypes.byref(ptr), size, 0, 0, 0), f"cuMemAddressReserve({size})")
        except RuntimeError:
            d.release(handle.value)
            raise
        try:
            d.check(d.map(ptr.value, size, 0, handle.value, 0), f"cuMemMap({size})")
            acc = _Access(loc_type=_LOCATION_DEVICE, loc_id=self.device.index,
                          flags=_ACCESS_READWRITE)
            d.check(d.set_access(ptr.value, size, ctypes.byref(acc), 1),
                    f"cuMemSetAccess({size})")
        except RuntimeError:
            d.unmap(ptr.value, size)
            d.address_free(ptr.value, size)
            d.release(handle.value)
            raise
        self.segments.append((ptr.value, size, handle.value))
        self._cursor, self._end = ptr.value, ptr.value + size
        return ptr.value

    def tensor(self, shape, dtype):
        """An uninitialized tensor of `shape` / `dtype` in this pool's memory."""
        elem = torch.empty((), dtype=dtype).element_size()
        nbytes = max(1, int(torch.Size(shape).numel())) * elem
        nbytes = -(-nbytes // 2) * 2
        start = -(-self._cursor // ALIGN) * ALIGN
        if not self.segments or start + nbytes > self._end:
            start = self._segment(nbytes)
        self._cursor = start + nbytes
        raw = torch.as_tensor(_Memory(start, nbytes), device=self.device)
        if raw.data_ptr() != start:
            raise RuntimeError(f"torch wrapped {start:#x} at {raw.data_ptr():#x}")
        return raw.view(torch.uint8)[:nbytes].view(dtype)[:torch.Size(shape).numel()] \
            .view(shape)

    def owns(self, tensor):
        """True if `tensor`'s bytes lie inside one of this pool's segments."""
        lo = tensor.data_ptr()
        hi = lo + tensor.numel() * tensor.element_size()
        return any(base <= lo and hi <= base + size for base, size, _ in self.segments)

    def close(self):
        """Unmaps and frees every segment (the tensors must no longer be used)."""
        torch.cuda.synchronize(self.device)
        for ptr, size, handle in reversed(self.segments):
            self.drv.unmap(ptr, size)
            self.drv.address_free(ptr, size)
            self.drv.release(handle)
        self.segments = []
        self._cursor = self._end = 0
