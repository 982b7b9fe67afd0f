"""Review findings on re-registration (no worker needed): the embedded worker
keeps the registered memory alive after the trainer reallocates a parameter,
and a failed CudaRegistration.refresh() leaves the moved tensors stale so the
next refresh() tries again."""
import pytest
import torch

import wsync.errors
import wsync.torch
from wsync import cuda_ipc, embedded


def test_embedded_pointer_keeps_the_registered_memory():
    param = torch.nn.Parameter(torch.ones(4))
    old_ptr = param.data_ptr()
    p = embedded.pointer_of("w", param)
    param.data = torch.zeros(8)  # the trainer reallocates
    tensor, memory = p.keep
    assert tensor is param and memory.data_ptr() == old_ptr  # still alive for the worker
    assert torch.equal(memory, torch.ones(4))


def test_a_failed_cuda_refresh_is_retried(monkeypatch):
    def fake_export(name, local, segments, uuids):
        return dict(gpu_uuid="GPU-test", handle=b"h" * 64, base_size=local.numel() * 4,
                    offset=0, size=local.numel() * local.element_size())

    monkeypatch.setattr(cuda_ipc, "export", fake_export)
    class NoExpandableSegments:  # torch.cuda.memory_snapshot() needs CUDA
        def is_expandable(self, name, device, ptr):
            return False

    monkeypatch.setattr(cuda_ipc, "SegmentSizes", NoExpandableSegments)
    reg = wsync.torch.CudaRegistration("/nonexistent.sock", "trainer", 0.2)
    w = torch.zeros(4)
    reg.add([("w", w)])
    w.data = torch.zeros(6)
    assert reg.stale() == ["w"]

    def failing_send(replace=True):
        raise wsync.errors.Unavailable("worker restarting")

    monkeypatch.setattr(reg, "send", failing_send)
    with pytest.raises(wsync.errors.Unavailable):
        reg.refresh()
    assert reg.stale() == ["w"] and reg.bytes == 16
    monkeypatch.setattr(reg, "send", lambda replace=True: None)
    assert reg.refresh() and reg.stale() == [] and reg.bytes == 24
