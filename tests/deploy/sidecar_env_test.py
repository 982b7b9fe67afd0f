#!/usr/bin/env python3
"""The chart's worker sidecar, run for real: helm renders the inference patch
(plaintext, host memory), and two real wsync-worker processes start with
exactly its environment as pods vllm-0 and vllm-1 of a StatefulSet would get
it (downward API values filled in: POD_NAME, the node, the pod IP), beside a
real controller. Each must take its rank from its pod name, pass the sidecar's
startup probe (its command, run as the kubelet would) and liveness probe
(GET /metrics), and register: the controller lists inference ranks 0 and 1
live. Only what one host cannot share is changed: the controller address (the
Service name does not resolve here), the metrics port (0: two "pods" share
one network namespace) and /run/wsync (a directory per pod, mode 0777 like an
emptyDir).
usage: sidecar_env_test.py BUILD_DIR (helm and the yaml module from
scripts/install_deploy_tools.sh's cache, ${WSYNC_DEPLOY_TOOLS:-~/.cache/wsync-deploy-tools});
prints "SKIPPED: <reason>" and exits 0 without them.
"""
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
CHART = os.path.join(HERE, "..", "..", "helm", "wsync")
SIDE = {"name": "inference", "group": "inference", "groupSize": "2", "device": "-1",
        "ownerContainer": "vllm", "workload": {"kind": "StatefulSet", "name": "vllm"}}

EXTRACT = """
const [modules, file] = process.argv.slice(1);
const YAML = require(require("path").join(modules, "yaml"));
const cm = YAML.parse(require("fs").readFileSync(file, "utf8"));
const patch = YAML.parse(cm.data["inference.yaml"]);
console.log(JSON.stringify(patch.spec.template.spec.initContainers[0]));
"""


def wait_for(what, check, timeout, proc=None):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        result = check()
        if result:
            return result
        if proc is not None and proc.poll() is not None:
            sys.exit(f"FAILED: {what}: the process exited with {proc.returncode}")
        time.sleep(0.1)
    sys.exit(f"FAILED: {what} within {timeout} s")


def read_ports(path):
    try:
        with open(path) as f:
            return dict(line.strip().split("=", 1) for line in f if "=" in line)
    except OSError:
        return None


def main():
    build = sys.argv[1]
    tools = os.environ.get("WSYNC_DEPLOY_TOOLS") or os.path.expanduser("~/.cache/wsync-deploy-tools")
    helm = os.path.join(tools, "layer", "helm", "helm")
    modules = os.path.join(tools, "node", "node_modules")
    if not os.access(helm, os.X_OK) or not os.path.isdir(os.path.join(modules, "yaml")):
        print(f"SKIPPED: no helm / npm yaml in {tools} (scripts/install_deploy_tools.sh)")
        return
    if shutil.which("node") is None:
        print("SKIPPED: node missing")
        return
    work = tempfile.mkdtemp(prefix="wsync-sidecar-")
    procs = []
    try:
        rendered = os.path.join(work, "configmap.yaml")
        with open(rendered, "w") as out:
            subprocess.run([helm, "template", "wsync", CHART, "--show-only",
                            "templates/worker-sidecar-configmap.yaml", "--set", "tls.enabled=false",
                            "--set", "tls.tokensSecret=", "--set-json",
                            f"worker.sides=[{json.dumps(SIDE)}]"],
                           stdout=out, stderr=subprocess.PIPE, check=True, text=True)
        sidecar = json.loads(subprocess.run(["node", "-e", EXTRACT, modules, rendered],
                                            capture_output=True, text=True, check=True).stdout)
        controller_ports = os.path.join(work, "controller.ports")
        controller = subprocess.Popen(
            [os.path.join(build, "controller/server/wsync-controller"), "--insecure",
             "--listen=127.0.0.1:0", "--metrics_port=-1", f"--port_file={controller_ports}",
             "--state_file="], stdout=open(os.path.join(work, "controller.log"), "w"),
            stderr=subprocess.STDOUT)
        procs.append(controller)
        port = wait_for("controller start", lambda: (read_ports(controller_ports) or {}).get(
            "grpc_port"), 20, controller)
        workers = []
        for ordinal in range(2):
            run_dir = os.path.join(work, f"vllm-{ordinal}", "run")
            os.makedirs(run_dir)
            os.chmod(run_dir, 0o777)
            fields = {"metadata.name": f"vllm-{ordinal}", "spec.nodeName": "node-a",
                      "status.podIP": "127.0.0.1"}
            env = {"PATH": os.environ["PATH"], "KUBERNETES_SERVICE_HOST": "10.96.0.1",
                   "HOME": work}
            for e in sidecar["env"]:
                value = e["value"] if "value" in e else fields[e["valueFrom"]["fieldRef"]["fieldPath"]]
                env[e["name"]] = value.replace("/run/wsync", run_dir)
            env["WSYNC_CONTROLLER"] = f"127.0.0.1:{port}"
            env["WSYNC_METRICS_PORT"] = "0"
            args = [os.path.join(build, "worker/agent/wsync-worker")] + sidecar.get("args", [])
            proc = subprocess.Popen(args, env=env, stdout=open(
                os.path.join(work, f"worker-{ordinal}.log"), "w"), stderr=subprocess.STDOUT)
            procs.append(proc)
            workers.append((proc, run_dir, env))
        probe = sidecar["startupProbe"]
        budget = probe["periodSeconds"] * probe["failureThreshold"]
        for ordinal, (proc, run_dir, env) in enumerate(workers):
            command = [c.replace("/run/wsync", run_dir) for c in probe["exec"]["command"]]
            wait_for(f"vllm-{ordinal}: startup probe {command}",
                     lambda: subprocess.run(command).returncode == 0, budget, proc)
            metrics_port = read_ports(env["WSYNC_PORT_FILE"])["metrics_port"]
            path = sidecar["livenessProbe"]["httpGet"]["path"]
            with urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}{path}", timeout=5) as r:
                if r.status != 200:
                    sys.exit(f"FAILED: vllm-{ordinal}: liveness probe GET {path}: {r.status}")
        print("both sidecars passed their startup and liveness probes")

        def registered():
            r = subprocess.run([os.path.join(build, "tools/wsyncctl"), "replicas",
                                f"--controller=127.0.0.1:{port}", "--group=inference", "--json"],
                               capture_output=True, text=True)
            if r.returncode != 0:
                return None
            ranks = [k for rep in json.loads(r.stdout).get("replicas", [])
                     for k in rep.get("ranks", []) if k.get("live")]
            return sorted(k.get("rank", 0) for k in ranks) == [0, 1]
        wait_for("inference ranks 0 and 1 registered", registered, 30)
        print("OK: pods vllm-0 and vllm-1 registered as inference ranks 0 and 1 of 2")
    finally:
        for p in procs:
            if p.poll() is None:
                p.terminate()
        for p in procs:
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                p.kill()
        if os.environ.get("WSYNC_KEEP_WORK") != "1":
            shutil.rmtree(work, ignore_errors=True)
        else:
            print(f"work directory kept: {work}")


if __name__ == "__main__":
    main()
