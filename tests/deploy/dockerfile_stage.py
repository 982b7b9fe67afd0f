#!/usr/bin/env python3
"""Applies a stage of a Dockerfile (default: the last) to a root filesystem,
without a container engine (tests/deploy/image_rootfs_test.sh).

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


def find_stage(steps, name):
    """The FROM step and the steps of stage `name` ("" : the last stage)."""
    starts = [i for i, (k, _) in enumerate(steps) if k == "FROM"] + [len(steps)]
    if len(starts) == 1:
        sys.exit("no FROM in the Dockerfile")
    for begin, end in zip(starts, starts[1:]):
        words = steps[begin][1].split()
        if (name and len(words) == 3 and words[1].upper() == "AS" and words[2] == name) or (
                not name and end == len(steps)):
            return steps[begin], steps[begin + 1:end]
    sys.exit(f"no stage '{name}' in the Dockerfile")


def expand(text, env):
    return re.sub(r"\$\{(\w+)(:-([^}]*))?\}|\$(\w+)",
                  lambda m: env.get(m.group(1) or m.group(4)) or (m.group(3) or ""), text)


def ignored_by(context):
    """A predicate over context-relative paths from the context's .dockerignore
    (patterns as Docker reads them: `*` within a segment, `**` across
    segments, a trailing `/` ignored, `!` re-includes)."""
    rules = []
    path = os.path.join(context, ".dockerignore")
    for line in open(path, encoding="utf-8") if os.path.exists(path) else []:
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        negate = line.startswith("!")
        pattern = line.lstrip("!").strip("/")
        regex = re.escape(pattern).replace(r"\*\*/", "(.*/)?").replace(r"\*\*", ".*")
        regex = regex.replace(r"\*", "[^/]*").replace(r"\?", "[^/]")
        rules.append((negate, re.compile(f"^{regex}(/.*)?$")))

    def ignored(rel):
        result = False
        for negate, rx in rules:
            if rx.match(rel):
                result = not negate
        return result
    return ignored


def copy_context(context, rel_sources, dest, root, workdir):
    """COPY from the build context, without what .dockerignore excludes."""
    ignored = ignored_by(context)
    target = os.path.join(root, os.path.join(workdir, dest).lstrip("/"))
    for rel in rel_sources:
        rel = os.path.normpath(rel)
        base = os.path.join(context, rel)
        if os.path.isfile(base):
            into = target if not dest.endswith("/") else os.path.join(target, os.path.basename(rel))
            os.makedirs(os.path.dirname(into), exist_ok=True)
            shutil.copy2(base, into)
            continue
        for dirpath, dirnames, filenames in os.walk(base):
            reldir = os.path.relpath(dirpath, context)
            reldir = "" if reldir == "." else reldir
            dirnames[:] = [d for d in dirnames if not ignored(os.path.join(reldir, d))]
            for f in filenames:
                relf = os.path.join(reldir, f)
                if ignored(relf):
                    continue
                out = os.path.join(target, os.path.relpath(os.path.join(dirpath, f), base))
                os.makedirs(os.path.dirname(out), exist_ok=True)
                shutil.copy2(os.path.join(dirpath, f), out, follow_symlinks=False)


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
    ap.add_argument("--stage", default="", help="the stage to apply (default: the last)")
    ap.add_argument("--ninja_dry_run", action="store_true",
                    help="RUN lines call `ninja -n` (configure for real, check the targets, "
                         "compile nothing)")
    args = ap.parse_args()
    mapping = [tuple(m.split("=", 1)) for m in args.map]
    all_steps = instructions(args.dockerfile)
    (_, base), steps = find_stage(all_steps, args.stage)
    # ARGs before the first FROM parameterise the FROM lines.
    global_args = {}
    for keyword, rest in all_steps:
        if keyword == "FROM":
            break
        if keyword == "ARG" and "=" in rest:
            k, v = rest.split("=", 1)
            global_args[k.strip()] = v.strip()
    base = expand(base, global_args)
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
                copy_context(args.context, sources, dest, args.root, config["workdir"])
                continue
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
            if args.ninja_dry_run:
                rest = re.sub(r"\bninja ", "ninja -n ", rest)
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
