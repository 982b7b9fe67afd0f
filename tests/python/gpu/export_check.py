"""GPU-only checks of wsync.cuda_ipc's export, no worker needed (run by
run_gpu_proof.sh, one process per mode):

    python3 export_check.py legacy       # fields of a live export are right
    PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True python3 export_check.py expandable
    python3 export_check.py nohandle

legacy: a tensor carved from a caching-allocator segment exports the 64-byte
handle of the segment's base, the segment's size, the tensor's offset inside
it (block offset + storage offset) and nvidia-smi's GPU UUID; FSDP2-style
views (a prefix of a padded buffer) register their own bytes only.
expandable: expandable segments export as POSIX descriptors (wsync.cuda_vmm),
one per physical allocation a tensor touches; memory without a shareable
handle type (vLLM sleep mode) is refused naming the embedded worker.
nohandle: the vLLM proof's allocator (nohandle_memory.py): contents, carving,
refusal by wsync.cuda_vmm, release.
"""
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import pbload  # noqa: E402

pbload.install()

import torch  # noqa: E402

import wsync.torch  # noqa: E402
from wsync import cuda_ipc  # noqa: E402


def legacy():
    big = torch.zeros(3 << 20, dtype=torch.float32, device="cuda:0")  # its own segment
    padded = torch.zeros(1000, dtype=torch.bfloat16, device="cuda:0")
    view = padded[:999].view(27, 37)  # FSDP2: unpadded shard viewing the padded buffer
    tail = big[1000:2000]
    seg, uuids = cuda_ipc.SegmentSizes(), {}
    smi = subprocess.run(["nvidia-smi", "--query-gpu=uuid", "--format=csv,noheader", "-i",
                          os.environ.get("CUDA_VISIBLE_DEVICES", "0").split(",")[0]],
                         capture_output=True, text=True).stdout.strip()
    for name, t in (("big", big), ("tail", tail), ("view", view)):
        f = cuda_ipc.export(name, t, seg, uuids)
        base = t.data_ptr() - f["offset"]
        snap = {s["address"]: s["total_size"] for s in torch.cuda.memory_snapshot()}
        assert len(f["handle"]) == 64, f
        assert snap.get(base) == f["base_size"], (name, hex(base), f["base_size"])
        assert f["size"] == t.numel() * t.element_size(), (name, f)
        assert f["offset"] + f["size"] <= f["base_size"]
        assert f["gpu_uuid"] == smi, (f["gpu_uuid"], smi)
        print(f"{name}: offset {f['offset']} size {f['size']} of base {f['base_size']} "
              f"on {f['gpu_uuid']}")
    assert cuda_ipc.export("tail", tail, seg, uuids)["offset"] == \
        cuda_ipc.export("big", big, seg, uuids)["offset"] + 4000
    print("legacy export OK")


def _no_handle_allocation(nbytes):
    """cuMemCreate'd device memory with no shareable handle type, mapped
    (vLLM's sleep-mode allocator does this): (ptr, release)."""
    import ctypes
    cu = ctypes.CDLL("libcuda.so.1")

    class Prop(ctypes.Structure):  # CUmemAllocationProp (cuda.h), zeroed fields
        _fields_ = [("type", ctypes.c_int), ("requestedHandleTypes", ctypes.c_int),
                    ("loc_type", ctypes.c_int), ("loc_id", ctypes.c_int),
                    ("win32", ctypes.c_void_p), ("compression", ctypes.c_ubyte),
                    ("gpuDirect", ctypes.c_ubyte), ("usage", ctypes.c_ushort),
                    ("reserved", ctypes.c_ubyte * 4)]

    class Access(ctypes.Structure):  # CUmemAccessDesc
        _fields_ = [("loc_type", ctypes.c_int), ("loc_id", ctypes.c_int), ("flags", ctypes.c_int)]

    torch.cuda.init()
    prop = Prop(type=1, requestedHandleTypes=0, loc_type=1, loc_id=torch.cuda.current_device())
    h, ptr = ctypes.c_uint64(), ctypes.c_uint64()
    assert cu.cuMemCreate(ctypes.byref(h), ctypes.c_size_t(nbytes), ctypes.byref(prop),
                          ctypes.c_ulonglong(0)) == 0
    assert cu.cuMemAddressReserve(ctypes.byref(ptr), ctypes.c_size_t(nbytes),
                                  ctypes.c_size_t(0), ctypes.c_uint64(0),
                                  ctypes.c_ulonglong(0)) == 0
    assert cu.cuMemMap(ptr, ctypes.c_size_t(nbytes), ctypes.c_size_t(0), h,
                       ctypes.c_ulonglong(0)) == 0
    acc = Access(loc_type=1, loc_id=torch.cuda.current_device(), flags=3)
    assert cu.cuMemSetAccess(ptr, ctypes.c_size_t(nbytes), ctypes.byref(acc),
                             ctypes.c_size_t(1)) == 0

    def release():
        cu.cuMemUnmap(ptr, ctypes.c_size_t(nbytes))
        cu.cuMemAddressFree(ptr, ctypes.c_size_t(nbytes))
        cu.cuMemRelease(h)
    return ptr.value, release


def expandable():
    """Expandable segments export as POSIX descriptors, one per physical
    allocation the tensor touches; legacy export still refuses them by name;
    memory without a shareable handle type is refused naming the embedded
    worker."""
    from wsync import cuda_vmm
    assert cuda_ipc.expandable_segments_setting(), "run with expandable_segments:True"
    small = torch.ones(1 << 10, device="cuda:0")
    big = torch.ones(60 << 18, device="cuda:0")  # 60 MiB: several 20 MiB chunks
    seg, uuids = cuda_ipc.SegmentSizes(), {}
    assert seg.is_expandable("big", 0, big.data_ptr())
    try:
        cuda_ipc.export("big", big, seg, uuids)
        raise AssertionError("legacy export took an expandable segment")
    except cuda_ipc.ExpandableSegmentsError as e:
        assert "expandable_segments:True" in str(e), e
    exp = cuda_vmm.Export()
    for name, t in (("small", small), ("big", big)):
        exp.add(name, t.data_ptr(), t.numel() * t.element_size(), "GPU-x")
    for name, f in exp.tensors.items():
        sizes = [b for _, b in f["chunks"]]
        print(f"{name}: {len(sizes)} chunks of {sizes} bytes, offset {f['offset']}")
        assert all(b > 0 and b % (2 << 20) == 0 for b in sizes), sizes
        assert f["offset"] + f["size"] <= sum(sizes), f
    assert len(exp.tensors["big"]["chunks"]) >= 3, exp.tensors["big"]
    assert len(exp.bases) == len({i for f in exp.tensors.values() for i, _ in f["chunks"]})
    drv = cuda_vmm._driver()
    for base in exp.bases:  # what send() does per chunk, without a worker
        fd = cuda_vmm._export_chunk(drv, "chunk", base)
        assert fd >= 0
        os.close(fd)
    ptr, release = _no_handle_allocation(2 << 20)
    try:
        sleeping = cuda_vmm.Export()
        sleeping.add("sleeping", ptr, 4096, "GPU-x")  # the layout reads fine ...
        cuda_vmm._export_chunk(drv, "sleeping", sleeping.bases[0])  # ... the export cannot
        raise AssertionError("memory without a shareable handle type was exported")
    except cuda_vmm.VmmExportError as e:
        assert "wsync.embedded" in str(e), e
        print(f"no-handle memory refused: {e}")
    finally:
        release()
    print("expandable export OK")


def nohandle():
    """nohandle_memory (the vLLM proof's sleep-mode-style weights): tensors
    carved from cuMem segments without a shareable handle hold what is
    written, have the pool's addresses, are refused by wsync.cuda_vmm naming
    the embedded worker, and the segments are freed by close()."""
    from wsync import cuda_vmm
    from nohandle_memory import SEGMENT, NoHandlePool
    pool = NoHandlePool(0)
    a = pool.tensor((1000, 3), torch.bfloat16)
    b = pool.tensor((7,), torch.float32)
    big = pool.tensor((SEGMENT // 2 + 1,), torch.bfloat16)  # does not fit: a new segment
    assert len(pool.segments) == 2 and all(pool.owns(t) for t in (a, b, big)), pool.segments
    assert b.data_ptr() % 512 == 0 and b.data_ptr() >= a.data_ptr() + a.numel() * 2
    want = (torch.arange(3000) % 200).float().view(1000, 3)  # exact in bf16
    a.copy_(want)
    b.fill_(1.5)
    big.fill_(-2.0)
    assert torch.equal(a.float().cpu(), want)
    assert b.sum().item() == 10.5 and bool((big == -2.0).all())
    exp = cuda_vmm.Export()
    for name, t in (("a", a), ("b", b), ("big", big)):
        exp.add(name, t.data_ptr(), t.numel() * t.element_size(), "GPU-x")
    assert len(exp.bases) == 2, exp.bases
    for base in exp.bases:
        try:
            cuda_vmm._export_chunk(cuda_vmm._driver(), "weights", base)
            raise AssertionError("no-handle memory was exported")
        except cuda_vmm.VmmExportError as e:
            assert "wsync.embedded" in str(e), e
    print(f"nohandle pool: {len(pool.segments)} segments of {[s for _, s, _ in pool.segments]} "
          "bytes, contents right, export refused")
    del a, b, big
    pool.close()
    assert pool.segments == []
    print("nohandle memory OK")


if __name__ == "__main__":
    {"legacy": legacy, "expandable": expandable, "nohandle": nohandle}[sys.argv[1]]()
