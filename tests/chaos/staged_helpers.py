"""The helpers of chaos_staged.py: the owner side's expected bytes per
version, the transfer, filling the trainers' sources, reading each rank's
versions, the outcome of a sync cut by the controller's kill, and the
report. The checker itself (the sampler) stays in chaos_staged.py."""
import os
import shutil
import sys
import time

import chaos_sync as cs

RANKS = [("inference", 0), ("inference", 1)]


class Versions:
    """Each tensor's expected bytes per version, as checksums the sampler
    compares against (the owner side's view)."""

    def __init__(self, torch):
        self.torch = torch
        self.cache = {}

    def part(self, name, version, rank):
        key = (name, version, rank)
        if key not in self.cache:
            if len(self.cache) > 64:
                self.cache.clear()
            full = cs.full_tensor(self.torch, name, version)
            self.cache[key] = full.chunk(2, dim=1)[rank].contiguous()
        return self.cache[key]

    def version_of(self, t, name, rank, candidates):
        for v in candidates:
            if v == 0:
                if bool((t == 0).all()):
                    return 0
            elif self.torch.equal(t, self.part(name, v, rank)):
                return v
        return None


def define(client, lpb, staging, checksums=True):
    client.define_transfer("chaos", cs.spec_proto(lpb), source_group="trainer",
                           destination_group="inference", staging=staging,
                           checksums=checksums)


def fill_sources(regs, torch, version):
    for r in range(2):
        for name, t in regs[("trainer", r)].tensors.items():
            t.copy_(cs.full_tensor(torch, name, version).chunk(2, dim=0)[r])


def replica_versions(regs, versions, candidates):
    out = {}
    for rank in RANKS:
        out[rank] = {versions.version_of(t.clone(), name, rank[1], candidates)
                     for name, t in regs[rank].tensors.items()}
    return out


def setup(args):
    sys.path[:0] = [os.path.join(cs.ROOT, "python"), os.path.join(args.build, "python")]
    import torch
    import wsync
    import wsync.torch as wtorch
    from wsync._proto import controller_pb2 as pb, layout_pb2 as lpb
    from wsync._proto import worker_local_pb2
    wtorch.lpb = worker_local_pb2
    return torch, wsync, wtorch, pb, lpb


def resumed_outcome(handle, args, wsync, pb):
    """The outcome of a sync cut by the controller's kill, as the restarted
    controller tells it: a decided commit resumes and ends (succeeded), an
    undecided one is unknown (its receivers roll back)."""
    if handle is None:
        return "cut_or_refused", None
    end = time.monotonic() + args.deadline + 15
    while True:
        try:
            st = handle.wait(timeout=max(1.0, end - time.monotonic()))
            return ("resumed_after_restart_uncommitted" if st.uncommitted
                    else "resumed_after_restart"), st
        except wsync.errors.NotFound:
            return "cut_unknown_after_restart", None
        except wsync.errors.Unavailable:  # the old connection, once
            if time.monotonic() > end:
                return "cut_or_refused", None
            time.sleep(0.05)
        except wsync.WsyncError:
            return "cut_or_refused", None


def status_after_restart(handle, wsync, version, deadline_s):
    """(status, None) once the restarted controller tells how sync `version`
    ended (it was decided: it must end), or (None, the problem)."""
    end = time.monotonic() + deadline_s + 10
    while True:
        try:
            return handle.wait(timeout=max(1.0, end - time.monotonic())), None
        except wsync.errors.Unavailable:
            # The first calls after the restart may find the old connection.
            if time.monotonic() > end:
                return None, f"v{version}: the restarted controller is unavailable"
            time.sleep(0.05)
        except wsync.WsyncError as e:
            return None, f"v{version}: after the restart the sync did not succeed: {e}"


def report(bad, hung, run_dir, name):
    """Prints the violations (a process that did not exit on SIGTERM is one)
    and returns the exit status; the run directory is kept when any."""
    if hung:
        bad.append(f"did not exit on SIGTERM within 5 s: {hung}")
    for v in bad:
        print("VIOLATION", v)
    if bad:
        print(f"run directory kept: {run_dir}")
        return 1
    shutil.rmtree(run_dir, ignore_errors=True)
    print(f"{name}: OK")
    return 0
