"""Sidecar launcher: ``python -m wsync.worker`` execs wsync-worker with its
memberships taken from the environment a launcher sets, so a Kubernetes
sidecar or a torchrun job needs no per-rank arguments.

    RANK=3 WORLD_SIZE=8 python -m wsync.worker --group trainer
      -> wsync-worker --groups=trainer:3:8
    python -m wsync.worker --group trainer --group inference:2 --device local -- --node=n0

The rank is --rank, else $RANK (torchrun, Megatron), else $WSYNC_RANK, else
$JOB_COMPLETION_INDEX (Kubernetes indexed Jobs); the size of a group is its
``:SIZE`` suffix, else --world_size, else $WORLD_SIZE. ``--device local``
uses $LOCAL_RANK (GPU workers). Everything after ``--`` goes to wsync-worker
unchanged; its other settings come from its own WSYNC_<FLAG> variables
(WSYNC_CONTROLLER, WSYNC_LOCAL_SOCKET, ...). The binary is --bin, else
$WSYNC_WORKER_BIN, else wsync-worker on PATH.
"""
import argparse
import os
import shutil
import sys

RANK_VARS = ("RANK", "WSYNC_RANK", "JOB_COMPLETION_INDEX")


def _env_int(env, names, what):
    for n in names:
        if env.get(n, "") != "":
            try:
                return int(env[n])
            except ValueError:
                raise SystemExit(f"wsync.worker: ${n}={env[n]!r} is not an integer ({what})")
    return None


def parse(argv):
    p = argparse.ArgumentParser(prog="python -m wsync.worker", description=__doc__.split("\n")[0])
    p.add_argument("--group", action="append", required=True, metavar="NAME[:SIZE]",
                   help="a group this worker is a rank of (repeat for colocated workers)")
    p.add_argument("--rank", type=int, help="rank in every group (default: from the environment)")
    p.add_argument("--world_size", type=int, help="size of groups without :SIZE")
    p.add_argument("--device", help="GPU index, or 'local' for $LOCAL_RANK (default: host)")
    p.add_argument("--bin", help="the wsync-worker binary")
    p.add_argument("--print", action="store_true", help="print the command instead of running it")
    p.add_argument("extra", nargs=argparse.REMAINDER, help="-- then flags for wsync-worker")
    return p.parse_args(argv)


def command(args, env):
    """The wsync-worker argv for parsed `args` under environment `env`."""
    rank = args.rank if args.rank is not None else _env_int(env, RANK_VARS, "rank")
    if rank is None:
        raise SystemExit("wsync.worker: no rank: pass --rank or set one of $"
                         + ", $".join(RANK_VARS))
    world = args.world_size if args.world_size is not None else _env_int(
        env, ("WORLD_SIZE",), "world size")
    members = []
    for g in args.group:
        name, _, size = g.partition(":")
        size = int(size) if size else world
        if not name or size is None:
            raise SystemExit(f"wsync.worker: group {g!r} has no size: give NAME:SIZE, "
                             "--world_size or $WORLD_SIZE")
        if not 0 <= rank < size:
            raise SystemExit(f"wsync.worker: rank {rank} is outside group {name} of size {size}")
        members.append(f"{name}:{rank}:{size}")
    binary = args.bin or env.get("WSYNC_WORKER_BIN") or shutil.which("wsync-worker")
    if not binary:
        raise SystemExit("wsync.worker: wsync-worker not found: pass --bin or set "
                         "$WSYNC_WORKER_BIN")
    argv = [binary, "--groups=" + ",".join(members)]
    if args.device is not None:
        device = args.device
        if device == "local":
            local = _env_int(env, ("LOCAL_RANK",), "local rank")
            if local is None:
                raise SystemExit("wsync.worker: --device local needs $LOCAL_RANK")
            device = str(local)
        argv.append(f"--device={int(device)}")
    extra = args.extra[1:] if args.extra[:1] == ["--"] else args.extra
    return argv + extra


def main(argv=None):
    args = parse(sys.argv[1:] if argv is None else argv)
    argv = command(args, os.environ)
    if args.print:
        print(" ".join(argv))
        return 0
    os.execv(argv[0], argv)


if __name__ == "__main__":
    sys.exit(main())
