"""GPU-only checks of wsync.cuda_ipc's export, no worker needed (run by
run_gpu_proof.sh, one process per mode):

    python3 export_check.py legacy       # fields of a live export are right
    PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True python3 export_check.py expandable

legacy: a tensor carved from a caching-allocator segment exports the 64-byte
handle of the segment's base, the segment's size, the tensor's offset inside
it (block offset + storage offset) and nvidia-smi's GPU UUID; FSDP2-style
views (a prefix of a padded buffer) register their own bytes only.
expandable: register() refuses the tensor with ExpandableSegmentsError naming
the setting, before contacting any worker.
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


def expandable():
    assert cuda_ipc.expandable_segments_setting(), "run with expandable_segments:True"
    t = torch.ones(1 << 20, device="cuda:0")
    try:
        wsync.torch.register({"w": t}, group="trainer", rank=0, socket="/nonexistent.sock",
                             timeout=1)
    except cuda_ipc.ExpandableSegmentsError as e:
        assert "expandable_segments:True" in str(e) and "SCM_RIGHTS" in str(e), e
        print(f"expandable segments refused: {e}")
        return
    raise AssertionError("a tensor in an expandable segment was not refused")


if __name__ == "__main__":
    {"legacy": legacy, "expandable": expandable}[sys.argv[1]]()
