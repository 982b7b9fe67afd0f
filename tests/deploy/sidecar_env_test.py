#!/usr/bin/env python3
"""The chart's worker sidecar and controller probes, run for real.

helm renders the inference patch (host memory) and the controller
Deployment; two real wsync-worker processes start with exactly the sidecar's
environment as pods vllm-0 and vllm-1 of a StatefulSet would get it
(downward API values filled in: POD_NAME, the node, the pod IP), beside a
real controller started with the Deployment's TLS / token arguments. Each
worker must take its rank from its pod name, pass the sidecar's startup probe
(its command, run as the kubelet would) and liveness probe (GET /metrics),
and register: the controller lists inference ranks 0 and 1 live. The
controller's readiness probe must pass too (plaintext: the gRPC health
service; TLS: the chart's exec probe, `wsyncctl health` with the CA and
--tls_server_name). Twice: plaintext, and TLS with certificates made with
openssl as docs/deployment.md asks for them (the controller's names the
Service, each worker's carries wsync://group/inference).

Only what one host cannot share is changed: the controller address the
workers dial (the Service name does not resolve here; the TLS run's
controller certificate also names 127.0.0.1 for it), the metrics port (0: two "pods" share one
network namespace) and the mounted directories (/run/wsync, /etc/wsync/*: a
directory per pod).
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
NAMESPACE = "wsync-test"
TOKEN = "sidecar-test-reader-token-0123456789"

EXTRACT = """
const [modules, file] = process.argv.slice(1);
const YAML = require(require("path").join(modules, "yaml"));
const docs = YAML.parseAllDocuments(require("fs").readFileSync(file, "utf8")).map((d) => d.toJS());
const cm = docs.find((d) => d && d.kind === "ConfigMap");
const deploy = docs.find((d) => d && d.kind === "Deployment");
const patch = YAML.parse(cm.data["inference.yaml"]);
console.log(JSON.stringify({sidecar: patch.spec.template.spec.initContainers[0],
                            controller: deploy.spec.template.spec.containers[0]}));
"""


def wait_for(what, check, timeout, proc=None):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        result = check()
        if result:
            return result
        if proc is not None and proc.poll() is not None:
            raise SystemExit(f"FAILED: {what}: the process exited with {proc.returncode}")
        time.sleep(0.1)
    raise SystemExit(f"FAILED: {what} within {timeout} s")


def read_ports(path):
    try:
        with open(path) as f:
            return dict(line.strip().split("=", 1) for line in f if "=" in line)
    except OSError:
        return None


def openssl(cwd, *commands):
    for c in commands:
        subprocess.run(["bash", "-c", c], cwd=cwd, check=True, capture_output=True, timeout=60)


def make_secrets(d, controller_name):
    """cert-manager's layout (tls.crt, tls.key, ca.crt) for the controller and
    worker Secrets, and the tokens Secret's file."""
    ec = "-newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes"
    openssl(d, f"openssl req -x509 {ec} -keyout ca.key -out ca.crt -days 2 -subj /CN=test-ca")
    sans = {"controller": f"DNS:{controller_name},DNS:{controller_name}.{NAMESPACE}.svc,IP:127.0.0.1",
            "worker": "URI:wsync://group/inference"}
    for name, san in sans.items():
        os.makedirs(os.path.join(d, name))
        openssl(d, f"openssl req {ec} -keyout {name}/tls.key -out {name}.csr -subj /CN={name}",
                f"printf 'subjectAltName={san}\\n' > {name}.ext",
                f"openssl x509 -req -in {name}.csr -CA ca.crt -CAkey ca.key -CAcreateserial "
                f"-days 2 -out {name}/tls.crt -extfile {name}.ext",
                f"cp ca.crt {name}/ca.crt")
    os.makedirs(os.path.join(d, "tokens"))
    with open(os.path.join(d, "tokens", "tokens"), "w") as f:
        f.write(f"{TOKEN} reader sidecar-test\n")


class Run:
    def __init__(self, helm, modules, build, tls):
        self.helm, self.modules, self.build, self.tls = helm, modules, build, tls
        self.work = tempfile.mkdtemp(prefix=f"wsync-sidecar-{'tls' if tls else 'plain'}-")
        self.procs = []

    def render(self):
        rendered = os.path.join(self.work, "chart.yaml")
        tls = ["--set", "tls.enabled=true"] if self.tls else [
            "--set", "tls.enabled=false", "--set", "tls.tokensSecret="]
        with open(rendered, "w") as out:
            subprocess.run([self.helm, "template", "wsync", CHART, "-n", NAMESPACE,
                            "--show-only", "templates/worker-sidecar-configmap.yaml",
                            "--show-only", "templates/controller-deployment.yaml", *tls,
                            "--set-json", f"worker.sides=[{json.dumps(SIDE)}]"],
                           stdout=out, stderr=subprocess.PIPE, check=True, text=True)
        return json.loads(subprocess.run(["node", "-e", EXTRACT, self.modules, rendered],
                                         capture_output=True, text=True, check=True).stdout)

    def start(self, args, env, log):
        proc = subprocess.Popen(args, env=env, stdout=open(os.path.join(self.work, log), "w"),
                                stderr=subprocess.STDOUT)
        self.procs.append(proc)
        return proc

    def controller(self, spec, secrets):
        """The Deployment's container: its args with the pod's paths mapped
        here, listening on an ephemeral port of POD_IP 127.0.0.1."""
        ports = os.path.join(self.work, "controller.ports")
        mounts = {"/etc/wsync/tls": os.path.join(secrets, "controller"),
                  "/etc/wsync/tokens": os.path.join(secrets, "tokens"),
                  "/var/lib/wsync": self.work}
        args = []
        for a in spec["args"]:
            for pod_path, here in mounts.items():
                a = a.replace(pod_path, here)
            if a.startswith("--listen="):
                a = "--listen=127.0.0.1:0"
            if a.startswith("--metrics_port="):
                a = "--metrics_port=-1"
            args.append(a)
        env = {"PATH": os.environ["PATH"], "POD_IP": "127.0.0.1"}
        proc = self.start([os.path.join(self.build, "controller/server/wsync-controller"), *args,
                           f"--port_file={ports}"], env, "controller.log")
        port = wait_for("controller start", lambda: (read_ports(ports) or {}).get("grpc_port"),
                        20, proc)
        probe = spec["readinessProbe"]
        if "exec" in probe:  # TLS: the chart's wsyncctl health command, in the pod's shell
            command = [c.replace("/etc/wsync/tls", mounts["/etc/wsync/tls"])
                       .replace(f":{spec['ports'][0]['containerPort']}", f":{port}")
                       .replace("/usr/local/bin/wsyncctl", os.path.join(self.build, "tools/wsyncctl"))
                       for c in probe["exec"]["command"]]
        else:  # plaintext: the kubelet's gRPC probe of the health service
            command = [os.path.join(self.build, "tools/wsyncctl"), "health",
                       f"--controller=127.0.0.1:{port}"]
        wait_for(f"controller readiness probe {command}", lambda: subprocess.run(
            command, env=env, capture_output=True).returncode == 0, 20, proc)
        return port

    def workers(self, sidecar, port, secrets):
        started = []
        for ordinal in range(2):
            pod = os.path.join(self.work, f"vllm-{ordinal}")
            run_dir = os.path.join(pod, "run")
            os.makedirs(run_dir)
            os.chmod(run_dir, 0o777)  # an emptyDir
            mounts = {"/run/wsync": run_dir, "/etc/wsync/tls": os.path.join(secrets, "worker")}
            fields = {"metadata.name": f"vllm-{ordinal}", "spec.nodeName": "node-a",
                      "status.podIP": "127.0.0.1"}
            env = {"PATH": os.environ["PATH"], "KUBERNETES_SERVICE_HOST": "10.96.0.1",
                   "HOME": pod}
            for e in sidecar["env"]:
                value = e["value"] if "value" in e else fields[e["valueFrom"]["fieldRef"]["fieldPath"]]
                for pod_path, here in mounts.items():
                    value = value.replace(pod_path, here)
                env[e["name"]] = value
            env["WSYNC_CONTROLLER"] = f"127.0.0.1:{port}"
            env["WSYNC_METRICS_PORT"] = "0"
            args = [os.path.join(self.build, "worker/agent/wsync-worker")] + sidecar.get("args", [])
            started.append((self.start(args, env, f"worker-{ordinal}.log"), mounts, env))
        probe = sidecar["startupProbe"]
        budget = probe["periodSeconds"] * probe["failureThreshold"]
        for ordinal, (proc, mounts, env) in enumerate(started):
            command = [c.replace("/run/wsync", mounts["/run/wsync"]) for c in probe["exec"]["command"]]
            wait_for(f"vllm-{ordinal}: startup probe {command}",
                     lambda: subprocess.run(command).returncode == 0, budget, proc)
            metrics_port = read_ports(env["WSYNC_PORT_FILE"])["metrics_port"]
            path = sidecar["livenessProbe"]["httpGet"]["path"]
            with urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}{path}", timeout=5) as r:
                if r.status != 200:
                    raise SystemExit(f"FAILED: vllm-{ordinal}: liveness GET {path}: {r.status}")

    def registered(self, port, secrets):
        token_file = os.path.join(self.work, "token")
        with open(token_file, "w") as f:
            f.write(TOKEN)
        tls = [f"--controller_ca={secrets}/ca.crt", f"--token_file={token_file}"] if self.tls else []

        def check():
            r = subprocess.run([os.path.join(self.build, "tools/wsyncctl"), "replicas",
                                f"--controller=127.0.0.1:{port}", "--group=inference", "--json",
                                *tls], capture_output=True, text=True)
            if r.returncode != 0:
                return None
            ranks = [k for rep in json.loads(r.stdout).get("replicas", [])
                     for k in rep.get("ranks", []) if k.get("live")]
            return sorted(k.get("rank", 0) for k in ranks) == [0, 1]
        wait_for("inference ranks 0 and 1 registered", check, 30)

    def main(self):
        rendered = self.render()
        secrets = os.path.join(self.work, "secrets")
        os.makedirs(secrets)
        if self.tls:
            make_secrets(secrets, "wsync-controller")
        port = self.controller(rendered["controller"], secrets)
        self.workers(rendered["sidecar"], port, secrets)
        self.registered(port, secrets)
        mode = "TLS (mutual, exec health probe, token)" if self.tls else "plaintext"
        print(f"OK ({mode}): controller ready; pods vllm-0 and vllm-1 passed their startup and "
              "liveness probes and registered as inference ranks 0 and 1 of 2")

    def close(self, failed):
        for p in self.procs:
            if p.poll() is None:
                p.terminate()
        for p in self.procs:
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                p.kill()
        if failed:
            for log in sorted(f for f in os.listdir(self.work) if f.endswith(".log")):
                print(f"--- {log}\n" + open(os.path.join(self.work, log)).read()[-3000:])
        shutil.rmtree(self.work, ignore_errors=True)


def main():
    build = os.path.abspath(sys.argv[1])
    tools = os.environ.get("WSYNC_DEPLOY_TOOLS") or os.path.expanduser("~/.cache/wsync-deploy-tools")
    helm = os.path.join(tools, "layer", "helm", "helm")
    modules = os.path.join(tools, "node", "node_modules")
    if not os.access(helm, os.X_OK) or not os.path.isdir(os.path.join(modules, "yaml")):
        print(f"SKIPPED: no helm / npm yaml in {tools} (scripts/install_deploy_tools.sh)")
        return
    for tool in ("node", "openssl"):
        if shutil.which(tool) is None:
            print(f"SKIPPED: {tool} missing")
            return
    for tls in (False, True):
        run = Run(helm, modules, build, tls)
        failed = True
        try:
            run.main()
            failed = False
        finally:
            run.close(failed)


if __name__ == "__main__":
    main()
