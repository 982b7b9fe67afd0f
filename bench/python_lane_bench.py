#!/usr/bin/env python3
"""The Python client's control path, one near-empty sync at a time
(one trainer worker -> one inference worker, 16 bytes, host workers on
loopback): wsync.Client.sync(v, wait=...).wait() timed as the trainer sees
it, for each way the Python client can reach the controller, modes
alternating within each round:

  grpcio        grpcio (WSYNC_NATIVE_CLIENT=0), no lane
  native        gRPC C++ through wsync._native, no lane
  native-lane   the control fast lane through wsync._native
  python-lane   the control fast lane through wsync._lane (pure Python)
  python-lane+spin  the same with busy_wait (spins on the socket)

Real wsync-controller (--lane_socket) and wsync-worker (--controller_lane)
processes of a build tree. Prints per mode the p50 / p90 / mean over every
round (ms), then one JSON line.

  PYTHONPATH=python:build/python /usr/bin/python3 bench/python_lane_bench.py \\
      [--build build] [--syncs 50] [--rounds 3] [--pause_ms 0] [--modes ...]
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

MODES = ("grpcio", "native", "native-lane", "python-lane", "python-lane+spin")


def start(args, log, port_file, key):
    proc = subprocess.Popen(args, stdout=open(log, "wb"), stderr=subprocess.STDOUT)
    end = time.monotonic() + 30
    while time.monotonic() < end:
        if os.path.exists(port_file):
            for line in open(port_file).read().splitlines():
                k, _, v = line.partition("=")
                if k == key:
                    return proc, v
        if proc.poll() is not None:
            sys.exit(f"{args[0]} exited with {proc.returncode}; see {log}")
        time.sleep(0.02)
    sys.exit(f"{args[0]}: no {key} in {port_file} after 30 s")


def spec():
    from wsync._proto import layout_pb2
    s = layout_pb2.TransferSpec(name="bench")
    for side, group in ((s.source, "trainer"), (s.destination, "inference")):
        side.name = group
        t = side.tensors.add(name="w", dtype=layout_pb2.FP32, shape=[4])
        t.mesh.mesh_shape.append(1)
        t.mesh.ranks.append(0)
        t.mesh.placements.add().replicate.SetInParent()
    return s


def client_for(mode, address, lane):
    import wsync
    os.environ["WSYNC_NATIVE_CLIENT"] = "0" if mode == "grpcio" else "1"
    kw = {}
    if mode.startswith("native-lane"):
        kw = {"lane": lane, "lane_impl": "native"}
    elif mode.startswith("python-lane"):
        kw = {"lane": lane, "lane_impl": "python", "busy_wait": mode.endswith("+spin")}
    else:
        kw = {"lane": ""}
    return wsync.Client(address, timeout=30, **kw)


def percentile(xs, q):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--build", default="build")
    ap.add_argument("--syncs", type=int, default=50, help="measured syncs per mode and round")
    ap.add_argument("--warmup", type=int, default=5, help="unmeasured syncs per mode and round")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--pause_ms", type=float, default=0.0, help="idle time before each sync")
    ap.add_argument("--modes", default=",".join(MODES))
    ap.add_argument("--work_dir", default="/dev/shm")
    ap.add_argument("--controller_flags", default="", help="extra controller flags")
    ap.add_argument("--worker_flags", default="", help="extra worker flags")
    a = ap.parse_args()
    modes = a.modes.split(",")
    for m in modes:
        if m not in MODES:
            sys.exit(f"unknown mode {m!r} (known: {', '.join(MODES)})")
    import torch
    import wsync.torch

    d = tempfile.mkdtemp(prefix="wsync-pybench-", dir=a.work_dir)
    lane = os.path.join(d, "lane.sock")
    procs = []
    try:
        ctl, port = start([os.path.join(a.build, "controller/server/wsync-controller"),
                           "--listen=127.0.0.1:0", "--metrics_port=-1", "--insecure",
                           f"--port_file={d}/c.ports", f"--state_file={d}/c.state",
                           f"--lane_socket={lane}", *a.controller_flags.split()],
                          f"{d}/controller.log", f"{d}/c.ports", "grpc_port")
        procs.append(ctl)
        address = f"127.0.0.1:{port}"
        socks = {}
        for group in ("trainer", "inference"):
            w, sock = start([os.path.join(a.build, "worker/agent/wsync-worker"),
                             f"--controller={address}", "--insecure", f"--groups={group}:0:1",
                             f"--local_socket={d}/{group}.sock", "--metrics_port=-1",
                             f"--port_file={d}/{group}.ports", "--node=n0",
                             f"--controller_lane={lane}", *a.worker_flags.split()],
                            f"{d}/{group}.log", f"{d}/{group}.ports", "local_socket")
            procs.append(w)
            socks[group] = sock
        regs = [wsync.torch.register({"w": torch.full((4,), 1.0 + (g == "trainer"))}, group=g,
                                     rank=0, socket=socks[g]) for g in socks]
        setup = client_for("native" if "native" in a.modes else "grpcio", address, lane)
        setup.wait_for_workers({"trainer": 1, "inference": 1}, timeout=30)
        setup.define_transfer("bench", spec())
        clients = {m: client_for(m, address, lane) for m in modes}
        times = {m: [] for m in modes}
        version = 0
        for _ in range(a.rounds):
            for m in modes:
                c = clients[m]
                for i in range(a.warmup + a.syncs):
                    version += 1
                    if a.pause_ms:
                        time.sleep(a.pause_ms / 1000)
                    t0 = time.perf_counter()
                    c.sync(version, transfer="bench", wait=30).wait(timeout=30, show_progress=False)
                    dt = time.perf_counter() - t0
                    if i >= a.warmup:
                        times[m].append(dt * 1000)
        out = {"host_cpus": os.cpu_count(), "load": os.getloadavg()[0], "pause_ms": a.pause_ms,
               "syncs": a.syncs, "rounds": a.rounds, "modes": {}}
        print(f"# {time.strftime('%FT%TZ', time.gmtime())} {os.cpu_count()} cpus, load "
              f"{os.getloadavg()[0]:.1f}, pause {a.pause_ms} ms, {a.rounds} x {a.syncs} syncs")
        for m in modes:
            xs = times[m]
            row = {"p50": percentile(xs, 0.5), "p90": percentile(xs, 0.9),
                   "mean": statistics.fmean(xs)}
            out["modes"][m] = row
            print(f"{m:17s} p50 {row['p50']:.3f} ms  p90 {row['p90']:.3f} ms  "
                  f"mean {row['mean']:.3f} ms")
        print(json.dumps(out))
        del regs
    finally:
        for p in reversed(procs):
            p.terminate()
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                p.kill()


if __name__ == "__main__":
    main()
