"""The embedded worker (wsync.embedded): the worker agent inside the owner's
process, tensors registered by pointer. A trainer of 2 wsync-worker processes
(shared memory) syncs a tiny Llama into vLLM's TP=2 layout whose ranks are
embedded workers, each in its own child Python process; every destination byte
is checked after every version. Also re-registration, stop while idle and the
errors, in this process."""
import multiprocessing
import os
import threading
import time

import pytest
import torch

import wsync
import wsync.torch
from wsync import dtypes, embedded, errors, layouts, vllm

import ducks
import embedded_rank
from harness import expected_destination, full_tensors
from models import TINY_LLAMA, trainer_tensors

TP = 2
TIMEOUT = 60


class Child:
    """One inference rank: a child process owning an embedded worker."""

    def __init__(self, controller, groups):
        ctx = multiprocessing.get_context("spawn")
        self.conn, theirs = ctx.Pipe()
        self.proc = ctx.Process(target=embedded_rank.serve, args=(theirs, controller, groups),
                                daemon=True)
        self.proc.start()

    def __call__(self, cmd, *args, **kwargs):
        self.conn.send((cmd, args, kwargs))
        if not self.conn.poll(TIMEOUT):
            raise TimeoutError(f"child: no answer to {cmd} in {TIMEOUT} s")
        reply = self.conn.recv()
        if reply[0] == "error":
            raise getattr(errors, reply[1])(reply[2])
        return reply[1]

    def close(self):
        if self.proc.is_alive():
            try:
                self("exit")
            except (TimeoutError, OSError, EOFError):
                pass
            self.proc.join(10)
        if self.proc.is_alive():
            self.proc.kill()
            self.proc.join(5)


@pytest.fixture
def children():
    made = []
    yield made
    for c in made:
        c.close()


def setup_transfer(cluster, children):
    shapes = {n: s for n, s, _ in trainer_tensors("tiny-llama")}
    full = full_tensors(shapes, torch.float32)
    params = {r: {n: ducks.DTensor(t, [0, 1], [ducks.Shard(0)], r) for n, t in full.items()}
              for r in range(2)}
    src = layouts.source_side(layouts.describe(params[0].items(), rank=0))
    spec = layouts.transfer_spec(src, vllm.destination(TINY_LLAMA, tp=TP), name="tiny")
    regs = []
    for r in range(2):
        sock = cluster.worker(f"trainer:{r}:2")
        regs.append(wsync.torch.register({n: p.to_local() for n, p in params[r].items()},
                                         group="trainer", rank=r, socket=sock))
    for r in range(TP):
        children.append(Child(cluster.address, f"inference:{r}:{TP}"))
    for r, c in enumerate(children):
        assert c("start") == "host"
        sizes = {b: n for b, (_, n) in layouts.local_buffers(spec.destination, r).items()}
        num, nbytes = c("alloc_register", sizes)
        assert num == len(sizes) and nbytes == 2 * sum(sizes.values())
    client = wsync.Client(cluster.address, timeout=20)
    client.wait_for_workers({"trainer": 2, "inference": TP}, timeout=30, buffers=True)
    client.define_transfer("weights", spec, source_group="trainer",
                           destination_group="inference")
    return client, spec, full, params


def check_children(spec, full, children):
    for r, c in enumerate(children):
        want = expected_destination(spec, full, r, torch.bfloat16)
        got = {n: embedded_rank.decode(v) for n, v in c("dump").items()}
        assert set(want) <= set(got)
        for b, w in want.items():
            assert torch.equal(got[b][:w.numel()], w), f"rank {r} buffer {b}"


def step(full, params, scale, shift):
    """An optimizer step, in place on the trainer's shards and the reference."""
    for r in range(2):
        for t in params[r].values():
            t.to_local().mul_(scale).add_(shift)
    for t in full.values():
        t.mul_(scale).add_(shift)


def test_embedded_receivers_several_versions_bit_exact(cluster, children):
    client, spec, full, params = setup_transfer(cluster, children)
    for version in (1, 2, 3):
        if version > 1:
            step(full, params, -0.5, float(version))
        status = client.sync(version).wait(timeout=TIMEOUT, show_progress=False)
        assert status.phase == wsync._proto.controller_pb2.SYNC_SUCCEEDED
        check_children(spec, full, children)
    for c in children:
        st = c("status")
        assert st["last_version"] == 3 and st["syncs_ok"] == 3 and st["syncs_failed"] == 0
        seen = [(e["kind"], e["version"], e["ok"]) for e in c("get_events")]
        assert ("finished", 3, True) in seen and ("started", 1, False) in seen
    assert client.transfer_status("weights").last_success_version == 3


def test_embedded_reregistration_moves_the_destination(cluster, children):
    client, spec, full, params = setup_transfer(cluster, children)
    client.sync(1).wait(timeout=TIMEOUT)
    check_children(spec, full, children)
    old = [c("dump") for c in children]
    # Rank 0's owner reallocates its buffers (e.g. woken from sleep mode).
    sizes = {b: n for b, (_, n) in layouts.local_buffers(spec.destination, 0).items()}
    num, _ = children[0]("alloc_register", sizes, replace=True, fill=7.0)
    assert num == len(sizes)
    step(full, params, 2.0, -1.0)
    client.sync(2).wait(timeout=TIMEOUT)
    check_children(spec, full, children)
    assert old[0] != children[0]("dump")


def wait_until(pred, what, timeout=20.0):
    end = time.monotonic() + timeout
    while not pred():
        assert time.monotonic() < end, what
        time.sleep(0.05)


def live(client, group):
    return [w for w in client.workers(group) if w.alive and w.streaming]


def test_embedded_stop_while_idle_ends_the_lease(cluster):
    client = wsync.Client(cluster.address, timeout=20)
    w = embedded.Worker(cluster.address, "inference:0:1", metrics_port=0)
    assert w.running and w.backend == "host" and w.metrics_port > 0
    t = torch.arange(16, dtype=torch.float32)
    assert w.register({"x": t}) == (1, 64)
    w.wait_registered()
    wait_until(lambda: any(b.name == "x" for x in live(client, "inference") for b in x.buffers),
               "the controller never saw the embedded worker's buffer")
    start = time.monotonic()
    w.stop()
    assert time.monotonic() - start < 10 and not w.running
    wait_until(lambda: not live(client, "inference"), "the controller still lists the worker")
    w.stop()  # idempotent
    with pytest.raises(errors.FailedPrecondition, match="tensor 'y'.*stopped"):
        w.register({"y": torch.zeros(4)})
    with pytest.raises(errors.FailedPrecondition, match="stopped"):
        w.start()
    assert w.status()["running"] is False


def test_embedded_registration_errors_name_the_tensor(cluster):
    with embedded.Worker(cluster.address, "inference:0:1") as w:
        good = torch.zeros(8, dtype=torch.bfloat16)
        assert w.register({"good": good}) == (1, 16)
        fp32 = dtypes.value("fp32")

        def bad(p, code, pattern):
            with pytest.raises(code, match=pattern):
                w.register_pointers([p])
            assert w.register_pointers([]) == (1, 16)  # nothing changed

        bad(embedded.Pointer("nul", fp32, (4,), 0, 16), errors.InvalidArgument,
            "tensor 'nul'.*null data pointer")
        bad(embedded.Pointer("small", fp32, (4, 4), good.data_ptr(), 16), errors.InvalidArgument,
            "tensor 'small'.*16 bytes cannot hold.*64 bytes")
        bad(embedded.Pointer("neg", fp32, (-1,), good.data_ptr(), 16), errors.InvalidArgument,
            "tensor 'neg'.*negative dimension")
        bad(embedded.Pointer("nodt", 0, (4,), good.data_ptr(), 16), errors.InvalidArgument,
            "tensor 'nodt'.*no dtype")
        bad(embedded.Pointer("gpu", fp32, (4,), good.data_ptr(), 16, 0),
            errors.FailedPrecondition, "tensor 'gpu'.*cuda:0.*host memory")
        # A batch with one bad entry registers none of it.
        with pytest.raises(errors.InvalidArgument, match="tensor 'nul2'"):
            w.register_pointers([embedded.Pointer("ok2", fp32, (2,), good.data_ptr(), 16),
                                 embedded.Pointer("nul2", fp32, (4,), 0, 16)])
        assert w.register_pointers([]) == (1, 16)
        with pytest.raises(errors.InvalidArgument, match="not in group 'trainer'"):
            w.register({"t": good}, group="trainer")
        with pytest.raises(errors.AlreadyExists, match="tensor 'good'"):
            w.register({"good": torch.zeros(8, dtype=torch.bfloat16)})
        with pytest.raises(errors.InvalidArgument, match="tensor 'strided' is not contiguous"):
            w.register({"strided": torch.zeros(4, 4).t()})
        # Same memory again is no conflict; replace drops the group's others.
        assert w.register({"good": good}) == (1, 16)
        assert w.register({"other": torch.zeros(2)}, replace=True) == (1, 8)
        # Re-registration after a reallocation is detected and cheap.
        p = torch.zeros(4)
        w.register({"p": p})
        assert w.stale() == [] and w.refresh() is False
        p.data = torch.ones(4)
        assert w.stale() == ["p"] and w.refresh() is True and w.stale() == []


def test_embedded_worker_bad_options():
    with pytest.raises(errors.InvalidArgument, match="bad membership"):
        embedded.Worker("127.0.0.1:1", "inference:2:2")
    with pytest.raises(errors.InvalidArgument, match="bad membership"):
        embedded.Worker("127.0.0.1:1", "inference:0")


def test_embedded_staging_budget_is_sent_and_enforced(cluster):
    """staging_budget_bytes (wsync-worker's --staging_budget_bytes,
    docs/staging.md): refused when negative, listed by the controller, and a
    staged plan whose shadow exceeds it is refused naming the worker."""
    with pytest.raises(errors.InvalidArgument, match="staging_budget_bytes.*got -1"):
        embedded.Worker("127.0.0.1:1", "inference:0:1", staging_budget_bytes=-1)
    shapes = {n: s for n, s, _ in trainer_tensors("tiny-llama")}
    full = full_tensors(shapes, torch.float32)
    params = {r: {n: ducks.DTensor(t, [0, 1], [ducks.Shard(0)], r) for n, t in full.items()}
              for r in range(2)}
    src = layouts.source_side(layouts.describe(params[0].items(), rank=0))
    spec = layouts.transfer_spec(src, vllm.destination(TINY_LLAMA, tp=1), name="tiny")
    regs = [wsync.torch.register({n: p.to_local() for n, p in params[r].items()},
                                 group="trainer", rank=r, socket=cluster.worker(f"trainer:{r}:2"))
            for r in range(2)]
    with embedded.Worker(cluster.address, "inference:0:1", staging_budget_bytes=1024) as w:
        sizes = {b: n for b, (_, n) in layouts.local_buffers(spec.destination, 0).items()}
        w.register({b: torch.zeros(n, dtype=torch.bfloat16) for b, n in sizes.items()})
        w.wait_registered()
        client = wsync.Client(cluster.address, timeout=20)
        client.wait_for_workers({"trainer": 2, "inference": 1}, timeout=30, buffers=True)
        assert [x.staging_budget_bytes for x in live(client, "inference")] == [1024]
        with pytest.raises(errors.InvalidArgument,
                           match=r"inference/0 .*over its --staging_budget_bytes of 1024"):
            client.define_transfer("weights", spec, staging="host_shadow")
        assert not client.define_transfer("weights", spec).shadow  # in place: no shadow
    del regs


def test_embedded_on_both_sides(cluster, children):
    """Trainer and receivers all embedded (the GPU test's steps, on the host)."""
    shapes = {n: s for n, s, _ in trainer_tensors("tiny-llama")}
    full = full_tensors(shapes, torch.float32, seed=3)
    src = layouts.source_side(layouts.describe(list(full.items()), rank=0))
    spec = layouts.transfer_spec(src, vllm.destination(TINY_LLAMA, tp=TP), name="tiny")
    trainer = Child(cluster.address, "trainer:0:1")
    children.append(trainer)
    assert trainer("start") == "host"
    num, _ = trainer("register_values", embedded_rank.encode_all(full))
    assert num == len(full)
    receivers = [Child(cluster.address, f"inference:{r}:{TP}") for r in range(TP)]
    children.extend(receivers)
    for r, c in enumerate(receivers):
        c("start")
        c("alloc_register", {b: n for b, (_, n) in
                             layouts.local_buffers(spec.destination, r).items()})
    client = wsync.Client(cluster.address, timeout=20)
    client.wait_for_workers({"trainer": 1, "inference": TP}, timeout=30, buffers=True)
    client.define_transfer("weights", spec)
    for version in (1, 2):
        if version > 1:
            trainer("step", 0.25, -2.0)
            for t in full.values():
                t.mul_(0.25).add_(-2.0)
        client.sync(version).wait(timeout=TIMEOUT)
        check_children(spec, full, receivers)
    assert trainer("status")["last_version"] == 2


def test_embedded_worker_without_controller_stops_promptly():
    w = embedded.Worker("127.0.0.1:1", "inference:0:1")
    with pytest.raises(errors.DeadlineExceeded, match="holds no lease"):
        w.wait_registered(timeout=0.5)
    assert w.register({"x": torch.zeros(4)}) == (1, 16)  # kept for when it registers
    start = time.monotonic()
    w.stop()
    assert time.monotonic() - start < 10 and not w.running


def _runnable_shares(window=1.0):
    """The share of the next `window` seconds each of this process's other
    threads spent runnable (running or waiting for a CPU: schedstat), largest
    first: near 1 for a spinner, loaded machine or not (it yields its core);
    small for a thread that sleeps between short bursts of work."""
    me = str(threading.get_native_id())

    def runnable():
        out = {}
        for tid in os.listdir("/proc/self/task"):
            if tid == me:
                continue
            try:
                with open(f"/proc/self/task/{tid}/schedstat") as f:
                    run, wait = f.read().split()[:2]
            except (OSError, ValueError):
                continue
            out[tid] = int(run) + int(wait)
        return out

    before, t0 = runnable(), time.monotonic()
    time.sleep(window)
    after, wall = runnable(), (time.monotonic() - t0) * 1e9
    return sorted(((ns - before.get(t, 0)) / wall for t, ns in after.items()), reverse=True) + [0, 0]


def test_embedded_busy_poll_passes_through(cluster):
    """busy_poll_ms (wsync-worker's --busy_poll_ms, docs/performance-notes.md):
    refused out of range naming it; at -1 (spin forever) the embedded worker's
    two pollers spin in this process while it idles, its syncs are bit-exact,
    and stop() ends the spinning promptly."""
    with pytest.raises(errors.InvalidArgument, match=r"busy_poll_ms must be -1 .*got -2"):
        embedded.Worker("127.0.0.1:1", "inference:0:1", busy_poll_ms=-2)
    shapes = {n: s for n, s, _ in trainer_tensors("tiny-llama")}
    full = full_tensors(shapes, torch.float32, seed=5)
    params = {r: {n: ducks.DTensor(t, [0, 1], [ducks.Shard(0)], r) for n, t in full.items()}
              for r in range(2)}
    src = layouts.source_side(layouts.describe(params[0].items(), rank=0))
    spec = layouts.transfer_spec(src, vllm.destination(TINY_LLAMA, tp=1), name="tiny")
    regs = [wsync.torch.register({n: p.to_local() for n, p in params[r].items()},
                                 group="trainer", rank=r, socket=cluster.worker(f"trainer:{r}:2"))
            for r in range(2)]
    w = embedded.Worker(cluster.address, "inference:0:1", busy_poll_ms=-1)
    try:
        sizes = {b: n for b, (_, n) in layouts.local_buffers(spec.destination, 0).items()}
        bufs = {b: torch.zeros(n, dtype=torch.bfloat16) for b, n in sizes.items()}
        w.register(bufs)
        w.wait_registered()
        client = wsync.Client(cluster.address, timeout=20)
        client.wait_for_workers({"trainer": 2, "inference": 1}, timeout=30, buffers=True)
        client.define_transfer("weights", spec, source_group="trainer",
                               destination_group="inference")
        for version in (1, 2):
            if version > 1:
                time.sleep(0.3)  # an idle spell: the pollers keep spinning
                step(full, params, 0.5, 1.0)
            status = client.sync(version).wait(timeout=TIMEOUT, show_progress=False)
            assert status.phase == wsync._proto.controller_pb2.SYNC_SUCCEEDED
            for b, want in expected_destination(spec, full, 0, torch.bfloat16).items():
                assert torch.equal(bufs[b][:want.numel()], want), f"buffer {b}"
        spun = _runnable_shares()
        assert spun[0] > 0.8 and spun[1] > 0.15, f"the embedded worker does not spin: {spun[:2]}"
    finally:
        start = time.monotonic()
        w.stop()
        assert time.monotonic() - start < 5
    assert _runnable_shares()[0] < 0.5, "still spinning after stop()"
    del regs
