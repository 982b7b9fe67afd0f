"""Sidecar launcher: ``python -m wsync.worker`` execs wsync-worker, whose
memberships come from the environment a launcher sets, so a Kubernetes
sidecar or a torchrun job needs no per-rank arguments.

    RANK=3 WORLD_SIZE=8 python -m wsync.worker --group trainer
      -> wsync-worker --groups=trainer   (the worker reads rank 3, size 8)
    python -m wsync.worker --group trainer --group inference:2 --device local -- --node=n0

The environment is read by wsync-worker itself (worker/agent/launch_env.h,
docs/flags-and-metrics.md): the rank is $RANK, else $WSYNC_RANK, else
$JOB_COMPLETION_INDEX (Kubernetes Indexed Jobs), else the ordinal ending
$POD_NAME or $HOSTNAME (StatefulSet pod ``vllm-3``); the size of a group is
its ``:SIZE`` suffix, else $WSYNC_GROUP_SIZE, else $WORLD_SIZE; the device is
$LOCAL_RANK in a CUDA build unless given. Conflicting or missing values are
errors that name the variables read. This launcher only passes through:
``--group`` (default: the worker's $WSYNC_GROUPS / $WSYNC_GROUP), an explicit
``--rank`` / ``--world_size`` (which then need no environment), and
``--device N`` or ``--device local`` ($LOCAL_RANK, required). Everything
after ``--`` goes to wsync-worker unchanged; its other settings come from its
own WSYNC_<FLAG> variables (WSYNC_CONTROLLER, WSYNC_LOCAL_SOCKET, ...). The
binary is --bin, else $WSYNC_WORKER_BIN, else wsync-worker on PATH.
"""
import argparse
import os
import shutil
import sys


def _int(text, what):
    try:
        return int(text)
    except ValueError:
        raise SystemExit(f"wsync.worker: {what} {text!r} is not an integer")


def parse(argv):
    p = argparse.ArgumentParser(prog="python -m wsync.worker", description=__doc__.split("\n")[0])
    p.add_argument("--group", action="append", metavar="NAME[:SIZE]",
                   help="a group this worker is a rank of (repeat for colocated workers; "
                        "default: $WSYNC_GROUPS or $WSYNC_GROUP, read by the worker)")
    p.add_argument("--rank", type=int, help="rank in every group (default: from the environment)")
    p.add_argument("--world_size", type=int, help="size of groups without :SIZE")
    p.add_argument("--device", help="GPU index, or 'local' for $LOCAL_RANK (default: the "
                                    "worker's: $LOCAL_RANK in a CUDA build, else host)")
    p.add_argument("--bin", help="the wsync-worker binary")
    p.add_argument("--print", action="store_true", help="print the command instead of running it")
    p.add_argument("extra", nargs=argparse.REMAINDER, help="-- then flags for wsync-worker")
    return p.parse_args(argv)


def _membership(group, rank, world):
    name, _, size_text = group.partition(":")
    if not name or ":" in size_text:
        raise SystemExit(f"wsync.worker: --group {group!r}: want NAME or NAME:SIZE")
    size = _int(size_text, f"size of group {name}") if size_text else world
    if size is not None and size < 1:
        raise SystemExit(f"wsync.worker: group {name} of size {size}: want >= 1")
    if rank is None:
        return name if size is None else f"{name}:{size}"
    if size is None:
        raise SystemExit(f"wsync.worker: --rank {rank} for group {name!r}, which has no size: "
                         "give NAME:SIZE or --world_size")
    if not 0 <= rank < size:
        raise SystemExit(f"wsync.worker: rank {rank} is outside group {name} of size {size}")
    return f"{name}:{rank}:{size}"


def command(args, env):
    """The wsync-worker argv for parsed `args` under environment `env`."""
    binary = args.bin or env.get("WSYNC_WORKER_BIN") or shutil.which("wsync-worker")
    if not binary:
        raise SystemExit("wsync.worker: wsync-worker not found: pass --bin or set "
                         "$WSYNC_WORKER_BIN")
    argv = [binary]
    if args.group:
        argv.append("--groups=" + ",".join(_membership(g, args.rank, args.world_size)
                                           for g in args.group))
    elif args.rank is not None or args.world_size is not None:
        raise SystemExit("wsync.worker: --rank / --world_size need --group")
    if args.device is not None:
        device = args.device
        if device == "local":
            device = env.get("LOCAL_RANK", "")
            if device == "":
                raise SystemExit("wsync.worker: --device local needs $LOCAL_RANK")
            device = _int(device, "$LOCAL_RANK")
        argv.append(f"--device={_int(str(device), '--device')}")
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
