"""Export of CUDA tensors by legacy CUDA IPC, in pure Python (torch only).

A tensor is registered as ``CudaIpc{handle, base_size, offset, size,
gpu_uuid}`` (worker_local.proto): the cudaIpcMemHandle of the cudaMalloc
allocation that holds it, that allocation's size, and the tensor's byte range
inside it. The worker opens the allocation base once and reads / writes the
tensor's live memory: nothing is copied or moved.

Where the fields come from (torch >= 2.0, native caching allocator):

* ``storage._share_cuda_()`` (torch/csrc/StorageSharing.cpp) returns
  ``(device, handle, storage_nbytes, offset_bytes, ref_counter_handle,
  ref_counter_offset, event_handle, event_sync_required)``. ``handle`` comes
  from ``CUDACachingAllocator::shareIpcHandle``: since torch 2.2 it is
  ``b"\\x02" + b"c" + <64-byte cudaIpcMemHandle_t>`` for memory from
  cudaMalloc (the handle of the segment's first block, i.e. the cudaMalloc
  base) and ``b"\\x02" + b"e" + ...`` for an expandable segment (cuMem);
  older releases return the bare 64 bytes. ``offset_bytes`` is the storage's
  start inside that cudaMalloc allocation (a storage always starts at its
  caching-allocator block; blocks are carved out of segments).
* The allocation's size is the segment's ``total_size`` in
  ``torch.cuda.memory_snapshot()`` (the segment is one cudaMalloc).
* The tensor's offset is ``offset_bytes + tensor.storage_offset() *
  element_size``, its size ``numel * element_size`` (contiguous tensors only).

``_share_cuda_`` also puts the storage behind torch's IPC reference counter
(CudaIPCSentData): when the trainer later frees that storage the caching
allocator keeps the block until the counter drops, which the worker never
does, so a freed registered storage stays allocated until the process exits
(torch warns once about blocks "in limbo"). Registered weights live for the
whole run, so this costs nothing in practice; re-registration after a
reallocation leaks the old block.

Memory from cuMemCreate (``PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True``)
has no legacy handle: wsync.torch registers it through wsync.cuda_vmm (POSIX
file descriptors over the worker's descriptor socket, SCM_RIGHTS) instead;
``export`` itself refuses it with ExpandableSegmentsError.
"""
import os

from wsync import errors

_HANDLE_SIZE = 64
_VERSIONED = 2  # SHAREABLE_HANDLE_VERSION in c10/cuda/CUDACachingAllocator.cpp
_CUDA_MALLOC = ord("c")
_EXPANDABLE = ord("e")

EXPANDABLE_ADVICE = (
    "memory from PyTorch's expandable segments (PYTORCH_CUDA_ALLOC_CONF="
    "expandable_segments:True) is allocated with cuMemCreate and has no legacy CUDA IPC "
    "handle, so the worker cannot open it. Start the trainer without expandable_segments "
    "(unset it, or PYTORCH_CUDA_ALLOC_CONF=expandable_segments:False) for the weights "
    "wsync reads or writes, or register through wsync.torch.register, which exports cuMem "
    "memory as POSIX file descriptors over the worker's descriptor socket (SCM_RIGHTS)")


class ExpandableSegmentsError(errors.FailedPrecondition):
    """The tensor lives in cuMem memory (expandable segments)."""


def expandable_segments_setting(env=None):
    """True when PYTORCH_CUDA_ALLOC_CONF / PYTORCH_ALLOC_CONF turns
    expandable_segments on (the later variable's value wins, as in torch)."""
    env = os.environ if env is None else env
    on = False
    for var in ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF"):
        for item in (env.get(var) or "").split(","):
            key, _, val = item.partition(":")
            if key.strip() == "expandable_segments":
                on = val.strip().lower() == "true"
    return on


def parse_handle(name, raw):
    """The 64-byte cudaIpcMemHandle_t from _share_cuda_'s handle field;
    ExpandableSegmentsError for an expandable segment's handle."""
    raw = bytes(raw)
    if len(raw) == _HANDLE_SIZE:
        return raw
    if len(raw) >= 2 and raw[0] == _VERSIONED and raw[1] == _EXPANDABLE:
        raise ExpandableSegmentsError(f"tensor {name!r}: {EXPANDABLE_ADVICE}")
    if len(raw) == _HANDLE_SIZE + 2 and raw[0] == _VERSIONED and raw[1] == _CUDA_MALLOC:
        return raw[2:]
    raise errors.FailedPrecondition(
        f"tensor {name!r}: torch's IPC handle has an unknown format ({len(raw)} bytes, "
        f"starting {raw[:2]!r}); expected a 64-byte cudaIpcMemHandle_t, optionally after "
        "version 2 and type 'c'")


def gpu_uuid(device_index):
    """The device's UUID as nvidia-smi prints it ("GPU-xxxxxxxx-xxxx-...")."""
    import torch
    uuid = torch.cuda.get_device_properties(device_index).uuid
    raw = getattr(uuid, "bytes", None)
    if raw is not None and len(bytes(raw)) == 16:
        h = bytes(raw).hex()
        text = f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"
    else:
        text = str(uuid)
    return text if text.startswith("GPU-") else "GPU-" + text


class SegmentSizes:
    """Sizes of the caching allocator's segments (cudaMalloc allocations) by
    (device, base address), read once from torch.cuda.memory_snapshot()."""

    def __init__(self):
        import torch
        self._sizes, self._expandable = {}, set()
        for seg in torch.cuda.memory_snapshot():
            key = (seg["device"], seg["address"])
            self._sizes[key] = seg["total_size"]
            if seg.get("is_expandable"):
                self._expandable.add(key)

    def is_expandable(self, name, device, ptr):
        """Whether `ptr` lies in an expandable segment (cuMem memory, exported
        by wsync.cuda_vmm), or in no segment torch knows while expandable
        segments are on."""
        for dev, base in self._expandable:
            if dev == device and base <= ptr < base + self._sizes[(dev, base)]:
                return True
        if any(dev == device and base <= ptr < base + size
               for (dev, base), size in self._sizes.items()):
            return False
        return expandable_segments_setting()

    def check_legacy(self, name, device, ptr):
        """ExpandableSegmentsError when `ptr` lies in an expandable segment
        (checked before asking torch to export it)."""
        for dev, base in self._expandable:
            if dev == device and base <= ptr < base + self._sizes[(dev, base)]:
                raise ExpandableSegmentsError(f"tensor {name!r}: {EXPANDABLE_ADVICE}")

    def size(self, name, device, base):
        key = (device, base)
        if key in self._expandable:
            raise ExpandableSegmentsError(f"tensor {name!r}: {EXPANDABLE_ADVICE}")
        if key not in self._sizes:
            if expandable_segments_setting():
                raise ExpandableSegmentsError(f"tensor {name!r}: {EXPANDABLE_ADVICE}")
            raise errors.FailedPrecondition(
                f"tensor {name!r}: its allocation base {base:#x} on cuda:{device} is not a "
                "segment of PyTorch's caching allocator (torch.cuda.memory_snapshot()); "
                "register tensors allocated by PyTorch's native allocator")
        return self._sizes[key]


def cached_uuid(uuids, device):
    """gpu_uuid(device), once per device in `uuids`."""
    if device not in uuids:
        uuids[device] = gpu_uuid(device)
    return uuids[device]


def export(name, t, segments, uuids):
    """The CudaIpc fields {handle, device, offset, size, gpu_uuid, base_size}
    of contiguous CUDA tensor `t`, which stays where it is."""
    if not t.is_contiguous():
        raise errors.InvalidArgument(f"tensor {name!r} is not contiguous")
    nbytes = t.numel() * t.element_size()
    storage = t.untyped_storage()
    if storage.nbytes() == 0:
        raise errors.InvalidArgument(
            f"tensor {name!r} has no storage (0 bytes): nothing to register")
    segments.check_legacy(name, t.device.index, storage.data_ptr())
    try:
        shared = storage._share_cuda_()
    except RuntimeError as e:
        if "expandable" in str(e).lower():
            raise ExpandableSegmentsError(f"tensor {name!r}: {EXPANDABLE_ADVICE} ({e})") from None
        raise errors.FailedPrecondition(
            f"tensor {name!r}: torch could not export its storage by CUDA IPC: {e}") from None
    device, raw_handle, _, storage_offset = shared[0], shared[1], shared[2], shared[3]
    handle = parse_handle(name, raw_handle)
    base = storage.data_ptr() - storage_offset
    base_size = segments.size(name, device, base)
    offset = storage_offset + t.storage_offset() * t.element_size()
    if offset + nbytes > base_size:
        raise errors.InvalidArgument(
            f"tensor {name!r}: {nbytes} bytes at offset {offset} run past its allocation of "
            f"{base_size} bytes")
    return {"handle": handle, "device": device, "offset": offset, "size": nbytes,
            "gpu_uuid": cached_uuid(uuids, device), "base_size": base_size}
