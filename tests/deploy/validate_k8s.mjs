#!/usr/bin/env node
// Validates Kubernetes manifests without a cluster, for tests/helm.cmake: every object of every
// YAML stream given is checked against the Kubernetes OpenAPI schemas of the npm package
// kubernetes-models (Prometheus Operator's ServiceMonitor, PodMonitor and PrometheusRule against
// @kubernetes-models/prometheus-operator). An object passes when
//   - its apiVersion and kind name a model of those packages (any other kind fails: no object
//     goes unchecked),
//   - it validates against the model's schema (types, required fields, enums, formats), and
//   - it has no field the schema does not know: the schemas themselves let unknown fields
//     through, so each object is validated through a Proxy that records which fields the
//     validator looked at; a field it never read (a typo such as readinesProbe) is unknown.
// With --schema, Helm values are checked too, with ajv (JSON Schema draft-07, as Helm uses):
// --chart-values alone, then merged with each --values file as Helm merges them (a second
// opinion on the renderer's own schema check), and each --refuse-values file merged must fail.
//
// Usage: node validate_k8s.mjs [--schema values.schema.json --chart-values values.yaml
//          [--values FILE]... [--refuse-values FILE]...] [MANIFEST.yaml]...
// Exit status 0 when everything is valid, 1 otherwise (each problem on one line), 2 for usage.
// kubernetes-models, yaml and ajv come from web/node_modules (scripts/install-deps.sh).
import { createRequire } from "node:module";
import { readFileSync } from "node:fs";
import { dirname, join, resolve } from "node:path";
import { fileURLToPath } from "node:url";

const source = resolve(dirname(fileURLToPath(import.meta.url)), "..", "..");
const webRequire = createRequire(join(source, "web", "package.json"));
const YAML = webRequire("yaml");
const Ajv = webRequire("ajv");

// The module of the model of apiVersion/kind, or null when the packages have none.
function loadModel(apiVersion, kind) {
  if (typeof apiVersion !== "string" || typeof kind !== "string" || !/^[A-Za-z]+$/.test(kind)) return null;
  const [group, version] = apiVersion.includes("/") ? apiVersion.split("/") : ["", apiVersion];
  const candidates = group === "monitoring.coreos.com"
    ? [`@kubernetes-models/prometheus-operator/${group}/${version}/${kind}`]
    : [`kubernetes-models/${group ? group + "/" : ""}${version}/${kind}`];
  for (const id of candidates) {
    try {
      const mod = webRequire(id);
      const model = mod[kind];
      if (model && model.kind === kind && model.apiVersion === apiVersion) return model;
    } catch {
      // not a model of these packages
    }
  }
  return null;
}

// Wraps value so that the validator's reads are recorded: seen gets one record per object, with
// the keys read and whether the validator enumerated its keys (a map: every key is known).
function track(value, path, seen) {
  if (value === null || typeof value !== "object") return value;
  const rec = { path, value, read: new Set(), enumerated: false };
  seen.push(rec);
  const copy = Array.isArray(value)
    ? value.map((v, i) => track(v, `${path}[${i}]`, seen))
    : Object.fromEntries(Object.entries(value).map(([k, v]) => [k, track(v, path ? `${path}.${k}` : k, seen)]));
  return new Proxy(copy, {
    get(target, key, receiver) {
      if (typeof key === "string") rec.read.add(key);
      return Reflect.get(target, key, receiver);
    },
    ownKeys(target) {
      rec.enumerated = true;
      return Reflect.ownKeys(target);
    },
  });
}

// The problems of one object: a schema violation, or the fields no schema knows (only the
// outermost unknown field of a subtree is named).
function validateObject(obj) {
  const model = loadModel(obj?.apiVersion, obj?.kind);
  if (!model) return [`unknown kind: apiVersion ${JSON.stringify(obj?.apiVersion)} kind ${JSON.stringify(obj?.kind)} is not a model of kubernetes-models or @kubernetes-models/prometheus-operator`];
  const problems = [];
  if (!obj.metadata || typeof obj.metadata.name !== "string" || obj.metadata.name === "") problems.push("metadata.name is missing");
  const seen = [];
  const proxy = track(obj, "", seen);
  try {
    model.prototype.validate.call(proxy);
  } catch (e) {
    problems.push(`schema: ${e.message}`);
    return problems;
  }
  const unknown = [];
  for (const rec of seen) {
    if (Array.isArray(rec.value) || rec.enumerated) continue;
    for (const key of Object.keys(rec.value)) {
      const path = rec.path ? `${rec.path}.${key}` : key;
      if (!rec.read.has(key) && !unknown.some((u) => path.startsWith(u + ".") || path.startsWith(u + "["))) unknown.push(path);
    }
  }
  for (const u of unknown) problems.push(`unknown field ${u}`);
  return problems;
}

// Helm's merge of a values file over the chart's: maps merge, other values replace, null removes.
function mergeValues(base, over) {
  const out = { ...base };
  for (const [k, v] of Object.entries(over ?? {})) {
    if (v === null) delete out[k];
    else if (v && typeof v === "object" && !Array.isArray(v) && out[k] && typeof out[k] === "object" && !Array.isArray(out[k])) out[k] = mergeValues(out[k], v);
    else out[k] = v;
  }
  return out;
}

function main(argv) {
  const opts = { values: [], refuse: [], manifests: [] };
  for (let i = 0; i < argv.length; i++) {
    const a = argv[i];
    if (a === "--schema") opts.schema = argv[++i];
    else if (a === "--chart-values") opts.chartValues = argv[++i];
    else if (a === "--values") opts.values.push(argv[++i]);
    else if (a === "--refuse-values") opts.refuse.push(argv[++i]);
    else if (a.startsWith("--")) { console.error(`validate_k8s: unknown option ${a}`); return 2; }
    else opts.manifests.push(a);
  }
  if ((opts.schema === undefined) !== (opts.chartValues === undefined) || (!opts.schema && opts.manifests.length === 0)) {
    console.error("usage: validate_k8s.mjs [--schema SCHEMA --chart-values VALUES [--values FILE]... [--refuse-values FILE]...] [MANIFEST]...");
    return 2;
  }
  let failed = 0;
  if (opts.schema) {
    const ajv = new Ajv({ allErrors: true, strict: true, allowUnionTypes: true });
    const check = ajv.compile(JSON.parse(readFileSync(opts.schema, "utf8")));
    const chart = YAML.parse(readFileSync(opts.chartValues, "utf8")) ?? {};
    const sets = [[opts.chartValues, chart, true], ...opts.values.map((f) => [f, mergeValues(chart, YAML.parse(readFileSync(f, "utf8")) ?? {}), true]),
      ...opts.refuse.map((f) => [f, mergeValues(chart, YAML.parse(readFileSync(f, "utf8")) ?? {}), false])];
    for (const [file, values, wanted] of sets) {
      const ok = check(values);
      if (ok === wanted) {
        console.log(`validate_k8s: ${file}: values ${ok ? "valid" : "refused as expected: " + ajv.errorsText(check.errors)}`);
      } else {
        failed++;
        console.log(`validate_k8s: ${file}: values ${ok ? "accepted, but they must be refused" : "invalid: " + ajv.errorsText(check.errors)}`);
      }
    }
  }
  for (const file of opts.manifests) {
    const docs = YAML.parseAllDocuments(readFileSync(file, "utf8"));
    const kinds = {};
    let count = 0;
    docs.forEach((doc, i) => {
      if (doc.errors.length) {
        failed++;
        console.log(`validate_k8s: ${file}: document ${i + 1}: YAML error: ${doc.errors[0].message}`);
        return;
      }
      const obj = doc.toJS();
      if (obj === null || obj === undefined) return;
      count++;
      const name = `${obj.kind}/${obj.metadata?.name}`;
      const problems = validateObject(obj);
      for (const p of problems) console.log(`validate_k8s: ${file}: ${name}: ${p}`);
      if (problems.length) failed++;
      kinds[obj.kind] = (kinds[obj.kind] ?? 0) + 1;
    });
    if (count === 0) {
      failed++;
      console.log(`validate_k8s: ${file}: no objects`);
    }
    const summary = Object.entries(kinds).sort().map(([k, n]) => `${k} ${n}`).join(", ");
    console.log(`validate_k8s: ${file}: ${count} objects checked (${summary})`);
  }
  console.log(failed ? `validate_k8s: ${failed} failed` : "validate_k8s: all valid");
  return failed ? 1 : 0;
}

process.exitCode = main(process.argv.slice(2));
