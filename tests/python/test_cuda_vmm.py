"""The descriptor socket (SCM_RIGHTS) that CUDA virtual memory travels over,
against a real wsync-worker on the host: descriptors arrive and are claimed
once by the registration that names their token, unknown tokens and a host
worker's refusal of device memory come back as errors naming the tensor. The
CUDA export itself (cuMemExportToShareableHandle of expandable segments) runs
on GPUs: tests/python/gpu/sync_proof.py with expandable_segments:True."""
import os

import grpc
import pytest

import wsync.cuda_vmm
import wsync.errors
from wsync._proto import worker_local_pb2 as lpb
from wsync._proto import worker_local_pb2_grpc as lpb_grpc


def _memfds(n):
    return [os.memfd_create(f"wsync-test-{i}") for i in range(n)]


def _register(sock, token, name="w", index=0):
    req = lpb.RegisterTensorsRequest(group="trainer", replace=True)
    req.tensors.add(name=name, dtype=1, shape=[4],
                    cuda_vmm=lpb.CudaVmm(fd_token=token, size=16, gpu_uuid="GPU-x",
                                         chunks=[lpb.CudaVmm.Chunk(fd_index=index,
                                                                   bytes=2 << 20)]))
    with grpc.insecure_channel("unix:" + sock) as ch:
        return lpb_grpc.WorkerLocalStub(ch).RegisterTensors(req, timeout=10)


def test_descriptors_reach_the_worker_and_a_token_serves_one_registration(cluster):
    sock = cluster.worker("trainer:0:1")
    fds = _memfds(300)  # more than one message (250 per message)
    try:
        token = wsync.cuda_vmm.send_fds(wsync.cuda_vmm.fd_socket_path(sock), fds)
    finally:
        for fd in fds:
            os.close(fd)
    assert len(token) == 32
    # The host worker claims the batch, then refuses device memory by name.
    with pytest.raises(grpc.RpcError) as e:
        _register(sock, token)
    assert e.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "'w'" in e.value.details() and "GPU data plane" in e.value.details()
    # Claimed: the same token is gone.
    with pytest.raises(grpc.RpcError) as e:
        _register(sock, token, name="v")
    assert e.value.code() == grpc.StatusCode.NOT_FOUND
    assert "tensor 'v'" in e.value.details() and "already used or expired" in e.value.details()


def test_unknown_token_names_the_tensor(cluster):
    sock = cluster.worker("trainer:0:1")
    with pytest.raises(grpc.RpcError) as e:
        _register(sock, "f" * 32, name="layers.0.w")
    assert e.value.code() == grpc.StatusCode.NOT_FOUND
    assert "layers.0.w" in e.value.details()


def test_no_worker_at_the_descriptor_socket(tmp_path):
    fds = _memfds(1)
    try:
        with pytest.raises(wsync.errors.Unavailable, match="descriptor socket"):
            wsync.cuda_vmm.send_fds(str(tmp_path / "none.sock.fds"), fds, timeout=2)
    finally:
        os.close(fds[0])


def test_export_without_a_gpu_is_a_clear_error():
    exp = wsync.cuda_vmm.Export()
    try:
        exp.add("w", 0x1000, 16, "GPU-x")
    except wsync.errors.FailedPrecondition as e:
        # No driver here (libcuda missing) or no CUDA memory at the address.
        assert "libcuda" in str(e) or "'w'" in str(e)
    else:
        pytest.fail("exporting a host address as CUDA virtual memory succeeded")


def test_a_worker_that_is_still_starting_is_waited_for(cluster, tmp_path):
    # Review finding: the descriptor path failed at once where the CUDA IPC
    # path waits for the worker's socket (a sidecar starting beside its owner).
    import threading
    sock = str(tmp_path / "late.sock")
    starter = threading.Timer(0.5, lambda: cluster.worker(
        "trainer:0:1", flags=[f"--local_socket={sock}"]))
    starter.start()
    fds = _memfds(1)
    try:
        token = wsync.cuda_vmm.send_fds(wsync.cuda_vmm.fd_socket_path(sock), fds, timeout=15)
    finally:
        os.close(fds[0])
        starter.join()
    assert len(token) == 32


def test_a_refused_batch_reports_the_workers_reason(cluster):
    # 300 descriptors against a worker that takes at most 250 per message is
    # still fine (the client splits); a bad tag is refused with the worker's
    # own message, not a broken pipe.
    import socket
    sock = cluster.worker("trainer:0:1")
    fds = _memfds(1)
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET) as s:
            s.connect(wsync.cuda_vmm.fd_socket_path(sock))
            socket.send_fds(s, [b"NOPE"], fds)
            assert "expected" in s.recv(4096).decode()
    finally:
        os.close(fds[0])


def test_export_sends_its_chunks_250_at_a_time_and_closes_each_slice(cluster, monkeypatch):
    # The CUDA export itself needs a GPU (tests/python/gpu/export_check.py);
    # here each "chunk" exports as a memfd, to check the slicing and that no
    # descriptor outlives its slice (review finding: ~800 open at once).
    sock = cluster.worker("trainer:0:1")
    open_now = []
    most = [0]

    def fake_export(drv, name, base):
        fd = os.memfd_create(f"chunk-{base}")
        open_now.append(fd)
        most[0] = max(most[0], len(open_now))
        return fd

    real_close = os.close

    def tracking_close(fd):
        if fd in open_now:
            open_now.remove(fd)
        real_close(fd)

    monkeypatch.setattr(wsync.cuda_vmm, "_driver", lambda: None)
    monkeypatch.setattr(wsync.cuda_vmm, "_export_chunk", fake_export)
    monkeypatch.setattr(wsync.cuda_vmm.os, "close", tracking_close)
    exp = wsync.cuda_vmm.Export()
    exp.bases = list(range(0x1000, 0x1000 + 600))
    exp._owner = {i: "w" for i in range(600)}
    token = exp.send(wsync.cuda_vmm.fd_socket_path(sock))
    assert len(token) == 32
    assert open_now == [] and most[0] == 250
