// Validates Kubernetes manifests offline against the Kubernetes OpenAPI schemas that the
// npm package kubernetes-models carries (no API server needed).
//
//   node deploy/k8s/validate.mjs FILE.yaml...     (NODE_PATH: where kubernetes-models and
//                                                  js-yaml are installed)
//
// Every document must be a known apiVersion/kind and valid; a Kustomization (not an API
// object) is skipped, and so is a kustomize Component. Prints one line per document and
// exits 1 if any is invalid.
import fs from "node:fs";
import { createRequire } from "node:module";
import path from "node:path";

const require = createRequire(path.join(process.env.NODE_PATH || process.cwd(), "x.js"));
const yaml = require("js-yaml");
const modelsRoot = path.dirname(require.resolve("kubernetes-models/package.json"));

// The Prometheus Operator's kinds (ServiceMonitor, PrometheusRule) come from their own
// package, @kubernetes-models/prometheus-operator, when it is installed.
function rootFor(apiVersion) {
  if (!apiVersion.startsWith("monitoring.coreos.com/")) return modelsRoot;
  try {
    return path.dirname(require.resolve("@kubernetes-models/prometheus-operator/package.json"));
  } catch {
    return null;
  }
}

// "apps/v1" -> "apps/v1", "v1" -> "v1", "policy/v1" -> "policy/v1".
async function modelFor(apiVersion, kind) {
  const root = rootFor(apiVersion);
  if (root === null) return null;
  const file = path.join(root, apiVersion, `${kind}.js`);
  if (!fs.existsSync(file)) return null;
  const mod = await import(file);
  return mod[kind] || mod.default;
}

let bad = 0;
for (const file of process.argv.slice(2)) {
  const docs = yaml.loadAll(fs.readFileSync(file, "utf8")).filter((d) => d != null);
  for (const doc of docs) {
    const where = `${file}: ${doc.kind || "?"} ${doc.metadata?.name || ""}`.trim();
    if (doc.kind === "Kustomization" || doc.kind === "Component") {
      console.log(`skip ${where} (not an API object)`);
      continue;
    }
    const Model = await modelFor(doc.apiVersion || "", doc.kind || "");
    if (!Model) {
      console.log(`FAIL ${where}: unknown apiVersion/kind ${doc.apiVersion}/${doc.kind}`);
      bad++;
      continue;
    }
    try {
      new Model(doc).validate();
      console.log(`ok   ${where}`);
    } catch (e) {
      console.log(`FAIL ${where}: ${e.message}`);
      bad++;
    }
  }
}
process.exit(bad ? 1 : 0);
