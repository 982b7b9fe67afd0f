"""Real wsync-controller / wsync-worker processes for the Python tests.

Binaries come from $WSYNC_BUILD_DIR (default: build/ of this checkout). Every
process gets a port file and sockets in a private temp dir; every wait is
bounded.
"""
import os
import signal
import subprocess
import tempfile
import time

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BUILD = os.environ.get("WSYNC_BUILD_DIR", os.path.join(ROOT, "build"))
CONTROLLER_BIN = os.path.join(BUILD, "controller", "server", "wsync-controller")
WORKER_BIN = os.path.join(BUILD, "worker", "agent", "wsync-worker")
WSYNCCTL_BIN = os.path.join(BUILD, "tools", "wsyncctl")


def read_port_file(path, key, timeout=20.0, proc=None):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if os.path.exists(path):
            for line in open(path).read().splitlines():
                k, _, v = line.partition("=")
                if k == key:
                    return v
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"{proc.args[0]} exited with {proc.returncode} before serving")
        time.sleep(0.02)
    raise TimeoutError(f"no {key} in {path} after {timeout} s")


class Process:
    def __init__(self, args, log):
        self.log = open(log, "wb")
        self.proc = subprocess.Popen(args, stdout=self.log, stderr=subprocess.STDOUT)

    def stop(self, sig=signal.SIGTERM, timeout=10.0):
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        self.log.close()


def freeze(proc, timeout=5.0):
    """SIGSTOPs `proc` (a Popen) and returns once it is stopped: the signal
    is delivered asynchronously, and a fast sync can still finish between
    send_signal and the stop."""
    proc.send_signal(signal.SIGSTOP)
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        with open(f"/proc/{proc.pid}/stat") as f:
            if f.read().rsplit(")", 1)[1].split()[0] in ("T", "t"):
                return
        time.sleep(0.002)
    raise TimeoutError(f"pid {proc.pid} not stopped {timeout} s after SIGSTOP")


class Cluster:
    """A controller plus workers; ``worker(group, rank, size)`` starts one."""

    def __init__(self, controller_flags=()):
        self.dir = tempfile.mkdtemp(prefix="wsync-py-")
        pf = os.path.join(self.dir, "controller.ports")
        self.controller = Process(
            [CONTROLLER_BIN, "--listen=127.0.0.1:0", "--metrics_port=-1", f"--port_file={pf}",
             "--insecure",
             f"--state_file={os.path.join(self.dir, 'controller.state')}", *controller_flags],
            os.path.join(self.dir, "controller.log"))
        port = read_port_file(pf, "grpc_port", proc=self.controller.proc)
        self.address = f"127.0.0.1:{port}"
        self.workers = {}

    def worker(self, groups, flags=()):
        """Starts a worker of memberships `groups` ("trainer:0:2[,...]");
        returns its local socket path."""
        name = groups.replace(":", "_").replace(",", "+")
        sock = os.path.join(self.dir, f"{name}.sock")
        pf = os.path.join(self.dir, f"{name}.ports")
        p = Process([WORKER_BIN, f"--controller={self.address}", "--insecure", f"--groups={groups}",
                     f"--local_socket={sock}", "--metrics_port=-1", f"--port_file={pf}",
                     "--node=n0", *flags], os.path.join(self.dir, f"{name}.log"))
        read_port_file(pf, "local_socket", proc=p.proc)
        self.workers[groups] = p
        return sock

    def logs(self):
        out = []
        for f in sorted(os.listdir(self.dir)):
            if f.endswith(".log"):
                out.append(f"--- {f}\n" + open(os.path.join(self.dir, f), errors="replace")
                           .read()[-3000:])
        return "\n".join(out)

    def close(self):
        for w in self.workers.values():
            w.stop()
        self.controller.stop()


# ---------------------------------------------------------- reference data --

def full_tensors(named_shapes, dtype=torch.float32, seed=0):
    """Deterministic full (global) tensors with distinct values."""
    g = torch.Generator().manual_seed(seed)
    return {n: torch.randn(*s, generator=g).to(dtype) for n, s in named_shapes.items()}


def chunk_bounds(length, parts, index):
    """torch.chunk semantics: chunk size ceil(length / parts)."""
    cs = -(-length // parts) if parts else 0
    lo = min(index * cs, length)
    return lo, min(lo + cs, length)


def expected_destination(spec, full, rank, dtype):
    """{buffer: flat tensor} rank `rank` of the destination must hold: the
    mappings applied to the full source tensors, each fragment row-major at
    its byte offset (an independent reading of docs/layout-spec.md)."""
    dst_full = {}
    for t in spec.destination.tensors:
        dst_full[t.name] = torch.zeros(list(t.shape), dtype=torch.float32)
    mapped = set()
    for m in spec.mappings:
        mapped.add(m.dst)
        src = full[m.src]
        sl = tuple(slice(o, o + n) for o, n in zip(m.src_box.offset, m.src_box.length))
        dl = tuple(slice(o, o + n) for o, n in zip(m.dst_offset, m.src_box.length))
        dst_full[m.dst][dl] = src[sl].float()
    for t in spec.destination.tensors:
        if t.name not in mapped and t.name in full:
            dst_full[t.name] = full[t.name].float()
    buffers = {}
    for t in spec.destination.tensors:
        for f in t.fragments.fragments:
            if f.rank != rank:
                continue
            sl = tuple(slice(o, o + n) for o, n in zip(f.box.offset, f.box.length))
            part = dst_full[t.name][sl].to(dtype).flatten()
            elem = part.element_size()
            buf = f.buffer or t.name
            start = f.byte_offset // elem
            cur = buffers.get(buf)
            need = start + part.numel()
            if cur is None or cur.numel() < need:
                grown = torch.zeros(need, dtype=dtype)
                if cur is not None:
                    grown[:cur.numel()] = cur
                cur = grown
            cur[start:need] = part
            buffers[buf] = cur
    return buffers
