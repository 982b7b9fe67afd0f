"""Host registration by shared memory: tensors are re-pointed into one shm
object in place, stay valid however long the Registration object lives, and
the name goes at close(); the runnable example (examples/rl_loop.py)."""
import gc
import os
import subprocess
import sys
import time

import torch

import wsync.errors
import wsync.torch

from harness import BUILD, ROOT


def test_tensors_move_into_shm_in_place_and_outlive_the_registration(cluster):
    sock = cluster.worker("trainer:0:1")
    model = torch.nn.Linear(4, 3)
    weight = model.weight
    before = weight.detach().clone()
    reg = wsync.torch.register(model, group="trainer", rank=0, socket=sock)
    name = reg.shm_name
    assert model.weight is weight and torch.equal(weight.detach(), before)
    assert set(reg.tensors) == {"weight", "bias"} and reg.bytes == (12 + 3) * 4
    req = reg.request()
    assert [(t.name, list(t.shape), t.shm.offset, t.shm.size) for t in req.tensors] == [
        ("weight", [3, 4], 0, 48), ("bias", [3], 64, 12)]
    # The worker takes its controller lease a moment after it serves its socket.
    deadline = time.monotonic() + 20
    while not wsync.torch.local_status(sock).registered and time.monotonic() < deadline:
        time.sleep(0.02)
    assert wsync.torch.local_status(sock).registered
    del reg
    gc.collect()
    # The mapping lives with the tensors; training goes on.
    (model(torch.ones(2, 4)) ** 2).sum().backward()
    with torch.no_grad():
        weight.sub_(weight.grad)
    assert os.path.exists("/dev/shm" + name)  # still registered: the name stays


def test_a_failed_refresh_leaves_the_tensors_stale_and_retries(cluster):
    # Review finding: refresh() used to re-point the tensors into a new shm object
    # before the worker took it; when that failed, stale() named nothing and the
    # worker kept reading memory the trainer no longer wrote.
    sock = cluster.worker("trainer:0:1")
    w = torch.zeros(8)
    reg = wsync.torch.register([("w", w)], group="trainer", rank=0, socket=sock)
    first = reg.shm_name
    w.data = torch.full((8,), 2.0)  # the trainer reallocates
    assert reg.stale() == ["w"]
    reg.socket, reg.timeout = sock + ".gone", 0.5
    try:
        reg.refresh()
        raise AssertionError("refresh() through a missing socket must fail")
    except wsync.errors.WsyncError:
        pass
    assert reg.stale() == ["w"] and reg.shm_name == first
    assert torch.equal(w, torch.full((8,), 2.0))
    reg.socket, reg.timeout = sock, 10.0
    assert reg.refresh() and reg.stale() == [] and reg.shm_name != first
    assert not os.path.exists("/dev/shm" + first)
    assert torch.equal(w, torch.full((8,), 2.0))


def test_buffer_names_can_differ_from_tensor_names(cluster):
    sock = cluster.worker("trainer:0:1")
    reg = wsync.torch.register([("x", torch.zeros(2)), ("y", torch.ones(3))], group="trainer",
                               rank=0, socket=sock, names={"x": "flat_x"})
    assert [t.name for t in reg.request().tensors] == ["flat_x", "y"]
    reg.close()


def test_close_unlinks_the_name(cluster):
    sock = cluster.worker("trainer:0:1")
    reg = wsync.torch.register({"x": torch.arange(5.)}, group="trainer", rank=0, socket=sock)
    path = "/dev/shm" + reg.shm_name
    assert os.path.exists(path)
    reg.close()
    assert not os.path.exists(path)
    assert torch.equal(reg.tensors["x"], torch.arange(5.))


def test_rl_loop_example_runs():
    env = dict(os.environ, WSYNC_BUILD_DIR=BUILD)
    out = subprocess.run([sys.executable, os.path.join(ROOT, "examples", "rl_loop.py"),
                          "--steps", "2"], capture_output=True, text=True, env=env, timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "step 2:" in out.stdout and out.stdout.count("inference weights match") == 2
