#!/usr/bin/env python3
"""Applies the last stage of a Dockerfile to a root filesystem, without a
container engine (tests/deploy/image_rootfs_test.sh).

The caller builds the stage's base (FROM) as a root filesystem and runs this
inside a private mount namespace with /proc, /dev and /tmp mounted in it.
Instructions: COPY from the build context or `--from=<stage>` (the stage's
paths mapped onto local directories with --map SRC=DST: the local build
standing in for the image's build stage), RUN (in the root, through
/bin/sh -c, with the stage's ENV), ENV, USER, WORKDIR, ENTRYPOINT,
HEALTHCHECK, EXPOSE, ARG, LABEL. Anything else is an error, so a new
instruction in the Dockerfile cannot be skipped silently. Prints the image's
config (user, workdir, env, entrypoint, healthcheck command) as JSON.
"""
import argparse
import glob
import json
import os
import re
import shlex
import shutil
import subprocess
import sys


def instructions(path):
    """(keyword, argument text) of every instruction, continuation lines joined."""
    out, current = [], ""
    for raw in open(path, encoding="utf-8"):
        line = raw.rstrip("\n")
        if not current and (not line.strip() or line.lstrip().startswith("#")):
            continue
        if current and line.lstrip().startswith("#"):
            continue  # a comment inside a continued instruction
        if line.endswith("\\"):
            current += line[:-1] + " "
            continue
        current += line
        keyword, _, rest = current.strip().partition(" ")
        out.append((keyword.upper(), rest.strip()))
        current = ""
    return out


def last_stage(steps):
    starts = [i for i, (k, _) in enumerate(steps) if k == "FROM"]
    if not starts:
        sys.exit("no FROM in the Dockerfile")
    return steps[starts[-1]], steps[starts[-1] + 1:]


def expand(text, env):
    return re.sub(r"\$\{(\w+)(:-([^}]*))?\}|\$(\w+)",
                  lambda m: env.get(m.group(1) or m.group(4)) or (m.group(3) or ""), text)


def copy(sources, dest, root, workdir):
    target = os.path.join(root, os.path.join(workdir, dest).lstrip("/"))
    into_dir = dest.endswith("/") or len(sources) > 1
    for src in sources:
        matches = glob.glob(src.rstrip("/")) or sys.exit(f"COPY: nothing at {src}")
        for m in matches:
            if os.path.isdir(m):
                shutil.copytree(m, target if not into_dir or src.endswith("/") else
                                os.path.join(target, os.path.basename(m)),
                                symlinks=True, dirs_exist_ok=True)
            else:
                os.makedirs(target if into_dir else os.path.dirname(target), exist_ok=True)
                shutil.copy2(m, os.path.join(target, os.path.basename(m)) if into_dir else target)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("dockerfile")
    ap.add_argument("--root", required=True)
    ap.add_argument("--context", required=True)
    ap.add_argument("--map", action="append", default=[],
                    help="STAGE_PATH=LOCAL_PATH for COPY --from=<stage>")
    args = ap.parse_args()
    mapping = [tuple(m.split("=", 1)) for m in args.map]
    (_, base), steps = last_stage(instructions(args.dockerfile))
    config = {"base": base, "user": "0", "workdir": "/", "entrypoint": [], "healthcheck": "",
              "env": {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"}}
    env = config["env"]
    for keyword, rest in steps:
        if keyword == "COPY":
            words = shlex.split(rest)
            stage = next((w.split("=", 1)[1] for w in words if w.startswith("--from=")), None)
            paths = [w for w in words if not w.startswith("--")]
            sources, dest = paths[:-1], paths[-1]
            if stage is None:
                sources = [os.path.join(args.context, s) for s in sources]
            else:
                mapped = []
                for s in sources:
                    hit = next(((a, b) for a, b in mapping if s.startswith(a)), None)
                    if hit is None:
                        sys.exit(f"COPY --from={stage} {s}: no --map for it")
                    mapped.append(hit[1] + s[len(hit[0]):])
                sources = mapped
            copy(sources, dest, args.root, config["workdir"])
        elif keyword == "RUN":
            cmd = ["chroot", args.root, "/bin/sh", "-c", f"cd {shlex.quote(config['workdir'])} && {rest}"]
            r = subprocess.run(cmd, env={**env, "DEBIAN_FRONTEND": "noninteractive"},
                               capture_output=True, text=True)
            if r.returncode != 0:
                sys.exit(f"RUN {rest}\nfailed ({r.returncode}):\n{r.stdout}{r.stderr}")
        elif keyword == "ENV":
            for k, v in re.findall(r'(\w+)=("[^"]*"|\S+)', rest):
                env[k] = expand(v.strip('"'), env)
        elif keyword == "USER":
            config["user"] = rest
        elif keyword == "WORKDIR":
            config["workdir"] = os.path.join(config["workdir"], rest)
            os.makedirs(os.path.join(args.root, config["workdir"].lstrip("/")), exist_ok=True)
        elif keyword == "ENTRYPOINT":
            config["entrypoint"] = json.loads(rest)
        elif keyword == "HEALTHCHECK":
            config["healthcheck"] = rest[rest.index("CMD ") + 4:] if "CMD " in rest else ""
        elif keyword not in ("EXPOSE", "ARG", "LABEL"):
            sys.exit(f"{keyword}: not an instruction this emulation knows")
    json.dump(config, sys.stdout)


if __name__ == "__main__":
    main()
