// Validates every object of rendered Kubernetes manifests (multi-document
// YAML files) offline against the Kubernetes and prometheus-operator schemas
// (npm kubernetes-models, @kubernetes-models/prometheus-operator), plus what
// those schemas do not say: names and label values within 63 characters,
// no unknown kinds. With --patches DIR, also writes each worker-sidecar
// patch of the chart's ConfigMap to DIR/<side>.yaml (for kubectl kustomize).
// usage: node validate_manifests.mjs NODE_MODULES [--patches DIR] FILE...
// Exit 1 naming the file, object and field of the first problems.
import fs from "node:fs";
import path from "node:path";
import { createRequire } from "node:module";
import { pathToFileURL } from "node:url";

const [modules, ...rest] = process.argv.slice(2);
let patchesDir = null;
const files = [];
for (let i = 0; i < rest.length; i++) {
  if (rest[i] === "--patches") patchesDir = rest[++i];
  else files.push(rest[i]);
}
const YAML = createRequire(path.join(modules, "noop.js"))("yaml");

function modelPath(apiVersion, kind) {
  if (apiVersion === "monitoring.coreos.com/v1") {
    return `@kubernetes-models/prometheus-operator/monitoring.coreos.com/v1/${kind}.js`;
  }
  const [group, version] = apiVersion.includes("/") ? apiVersion.split("/") : [null, apiVersion];
  return `kubernetes-models/${group ? `${group}/` : ""}${version}/${kind}.js`;
}

const problems = [];
let count = 0;
const dns1123Label = /^[a-z0-9]([-a-z0-9]*[a-z0-9])?$/;

async function validate(file, obj) {
  const where = `${file}: ${obj.kind} ${obj.metadata?.name}`;
  const model = path.join(modules, modelPath(obj.apiVersion, obj.kind));
  if (!fs.existsSync(model)) {
    problems.push(`${where}: no schema for ${obj.apiVersion} ${obj.kind}`);
    return;
  }
  const mod = await import(pathToFileURL(model).href);
  try {
    new mod[obj.kind](obj).validate();
  } catch (e) {
    problems.push(`${where}: ${e.message}`);
  }
  const name = obj.metadata?.name ?? "";
  if (name.length > 63) problems.push(`${where}: name of ${name.length} characters (> 63)`);
  if (obj.kind === "Service" && !dns1123Label.test(name)) {
    problems.push(`${where}: not a DNS-1123 label`);
  }
  const labelSets = [obj.metadata?.labels, obj.spec?.template?.metadata?.labels,
    obj.spec?.selector?.matchLabels];
  for (const labels of labelSets) {
    for (const [k, v] of Object.entries(labels ?? {})) {
      if (String(v).length > 63) problems.push(`${where}: label ${k} value over 63 characters`);
    }
  }
  count++;
}

// A sidecar patch is a pod template patch: completed with a stand-in owner
// container it must be a valid PodTemplateSpec.
async function validatePatch(file, side, text) {
  const patch = YAML.parse(text);
  const template = structuredClone(patch?.spec?.template ?? {});
  template.spec = template.spec ?? {};
  const owners = template.spec.containers ?? [];
  template.spec.containers = owners.length ? owners.map((c) => ({ image: "owner", ...c }))
    : [{ name: "owner", image: "owner" }];
  const mod = await import(pathToFileURL(path.join(modules, "kubernetes-models/v1/PodTemplate.js")).href);
  try {
    new mod.PodTemplate({ metadata: { name: side }, template }).validate();
  } catch (e) {
    problems.push(`${file}: worker sidecar patch ${side}: ${e.message}`);
  }
  const sidecar = (patch?.spec?.template?.spec?.initContainers ?? [])[0];
  if (sidecar?.restartPolicy !== "Always") {
    problems.push(`${file}: worker sidecar patch ${side}: not a native sidecar (restartPolicy Always)`);
  }
  if (patchesDir) fs.writeFileSync(path.join(patchesDir, `${side}.yaml`), text);
}

for (const file of files) {
  const docs = YAML.parseAllDocuments(fs.readFileSync(file, "utf8"));
  for (const doc of docs) {
    if (doc.errors.length) problems.push(`${file}: ${doc.errors[0].message}`);
    const obj = doc.toJS();
    if (!obj) continue;
    await validate(file, obj);
    if (obj.kind === "ConfigMap" && obj.metadata?.name?.endsWith("-worker-sidecar")) {
      for (const [key, text] of Object.entries(obj.data ?? {})) {
        await validatePatch(file, key.replace(/\.yaml$/, ""), text);
      }
    }
  }
}
if (problems.length) {
  console.log(problems.join("\n"));
  process.exit(1);
}
console.log(`${count} objects valid (${files.join(", ")})`);
