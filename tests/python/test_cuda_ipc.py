"""CUDA IPC export (wsync.cuda_ipc): torch's handle formats, the
expandable-segments setting and its error. The export of live CUDA tensors
runs on GPUs (tests/python/gpu/run_gpu_proof.sh)."""
import pytest
import torch

import wsync
import wsync.torch
from wsync import cuda_ipc

HANDLE = bytes(range(64))


def test_bare_and_versioned_cuda_malloc_handles():
    assert cuda_ipc.parse_handle("w", HANDLE) == HANDLE
    assert cuda_ipc.parse_handle("w", b"\x02c" + HANDLE) == HANDLE


def test_expandable_segment_handle_names_the_setting():
    with pytest.raises(cuda_ipc.ExpandableSegmentsError,
                       match="'w'.*expandable_segments:True.*SCM_RIGHTS") as e:
        cuda_ipc.parse_handle("w", b"\x02e" + b"\x00" * 80)
    assert isinstance(e.value, wsync.FailedPrecondition)


def test_unknown_handle_format():
    with pytest.raises(wsync.FailedPrecondition, match="unknown format .*3 bytes"):
        cuda_ipc.parse_handle("w", b"\x07xx")
    with pytest.raises(wsync.FailedPrecondition, match="unknown format"):
        cuda_ipc.parse_handle("w", b"\x02c" + HANDLE[:10])


@pytest.mark.parametrize("env,on", [
    ({}, False), ({"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"}, True),
    ({"PYTORCH_CUDA_ALLOC_CONF": "max_split_size_mb:64, expandable_segments:True"}, True),
    ({"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:False"}, False),
    ({"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True",
      "PYTORCH_ALLOC_CONF": "expandable_segments:False"}, False),
    ({"PYTORCH_ALLOC_CONF": "expandable_segments:true"}, True)])
def test_expandable_segments_setting(env, on):
    assert cuda_ipc.expandable_segments_setting(env) is on


def test_meta_tensors_are_refused_naming_both_paths(tmp_path):
    with pytest.raises(wsync.FailedPrecondition, match="host tensors only .* or CUDA tensors"):
        wsync.torch.register({"w": torch.empty(2, device="meta")}, group="g", rank=0,
                             socket=str(tmp_path / "none.sock"))
