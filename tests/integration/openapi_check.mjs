#!/usr/bin/env node
// Checks prismd's HTTP answers against its OpenAPI document (service/prismd/openapi.json), for
// the integration tests: a long-running process that reads one JSON line per answer on stdin,
//   {"method", "path" (with its query), "status", "content_type", "body", "headers" (optional,
//    names in lower case), "body_omitted" (optional: a body that is not JSON, not sent)}
// and writes one JSON line per answer, {"ok": true} or {"ok": false, "error": "..."}.
//
// An answer passes when the document lists its path (matched against the path templates, the
// literal ones first), its method (HEAD as GET, body not checked) and its status (or `default`);
// when its Content-Type is one the response lists; when a JSON body validates against the
// response's schema (ajv, JSON Schema 2020-12 as OpenAPI 3.1 uses it) and the response's
// required headers are there. A path no template matches, or a method its path does not take,
// is checked against the document's x-prism-unrouted (404, 405 ...); a request to the health
// listener ("listener": "health") against x-prism-health-listener; libmicrohttpd's own answers
// (no Content-Type) against x-prism-below-prismd. Anything else is an error. A line
// {"kind": "event", "path", "event", "data"} checks one server-sent event's data against the
// schema the stream's response names for it (x-prism-event-data).
//
// Usage: node openapi_check.mjs [--self-check] [OPENAPI_JSON]  (default: the source tree's
// document); --self-check checks the document itself and exits.
// ajv and ajv-formats come from web/node_modules (scripts/install-deps.sh runs npm ci there).
import { createRequire } from "node:module";
import { readFileSync, existsSync } from "node:fs";
import { dirname, join, resolve } from "node:path";
import { fileURLToPath } from "node:url";
import { createInterface } from "node:readline";

const here = dirname(fileURLToPath(import.meta.url));
const source = resolve(here, "..", "..");
const docPath = process.argv.slice(2).find((a) => !a.startsWith("--")) || join(source, "service", "prismd", "openapi.json");
const webPackage = join(source, "web", "package.json");

function fatal(message) {
  process.stderr.write(`openapi_check: ${message}\n`);
  process.exit(2);
}

let Ajv2020, addFormats;
try {
  if (!existsSync(join(source, "web", "node_modules")))
    throw new Error("no web/node_modules");
  const require = createRequire(webPackage);
  Ajv2020 = require("ajv/dist/2020").default;
  addFormats = require("ajv-formats").default;
} catch (e) {
  fatal(`cannot load ajv from ${join(source, "web", "node_modules")} (${e.message}): run scripts/install-deps.sh`);
}

let doc;
try {
  doc = JSON.parse(readFileSync(docPath, "utf8"));
} catch (e) {
  fatal(`cannot read ${docPath}: ${e.message}`);
}

const ROOT = "prism-openapi";
const SCHEMA_PREFIX = "#/components/schemas/";

// A deep copy of a schema of the document with its component references pointed at the
// combined schema this process registers (ROOT's $defs).
function rebase(schema, inRoot) {
  if (Array.isArray(schema)) return schema.map((s) => rebase(s, inRoot));
  if (schema === null || typeof schema !== "object") return schema;
  const out = {};
  for (const [k, v] of Object.entries(schema)) {
    if (k === "$ref" && typeof v === "string") {
      if (!v.startsWith(SCHEMA_PREFIX)) fatal(`unsupported $ref ${v} in a schema`);
      out[k] = `${inRoot ? "" : ROOT}#/$defs/${v.slice(SCHEMA_PREFIX.length)}`;
    } else {
      out[k] = rebase(v, inRoot);
    }
  }
  return out;
}

const ajv = new Ajv2020({ strict: true, allowUnionTypes: true, allErrors: true });
addFormats(ajv);
try {
  ajv.addSchema({ $id: ROOT, $defs: rebase(doc.components?.schemas ?? {}, true) });
} catch (e) {
  fatal(`the document's schemas do not compile: ${e.message}`);
}

// A "$ref": "#/components/..." of the document resolved (one level at a time, at most 8).
function deref(obj) {
  for (let i = 0; i < 8 && obj && typeof obj.$ref === "string"; i++) {
    const parts = obj.$ref.replace(/^#\//, "").split("/");
    obj = parts.reduce((o, p) => (o ? o[p.replace(/~1/g, "/").replace(/~0/g, "~")] : undefined), doc);
  }
  if (!obj) throw new Error("a $ref that does not resolve");
  return obj;
}

// The templates of doc.paths, each as its segments, literal ones before templated ones so that
// /v1/openapi.json wins over /{asset} and /v1/jobs/{job}/blocks over nothing else.
const templates = Object.keys(doc.paths ?? {}).map((t) => ({ t, segs: t.split("/").slice(1) }));
const literals = (x) => x.segs.filter((s) => !s.startsWith("{")).length;
templates.sort((a, b) => literals(b) - literals(a));

function matchPath(path) {
  const segs = path.split("/").slice(1);
  for (const { t, segs: ts } of templates) {
    if (ts.length !== segs.length) continue;
    if (ts.every((s, i) => (s.startsWith("{") ? segs[i].length > 0 : s === segs[i]))) return t;
  }
  return null;
}

const normType = (ct) => String(ct ?? "").toLowerCase().replace(/\s*;\s*/g, "; ").trim();
const isJson = (ct) => /^application\/([a-z0-9.+-]*\+)?json(;|$)/.test(ct);
const compiled = new Map();

function validatorFor(key, schema) {
  let v = compiled.get(key);
  if (!v) {
    v = ajv.compile(rebase(schema, false));
    compiled.set(key, v);
  }
  return v;
}

function describe(errors) {
  return (errors ?? [])
    .slice(0, 5)
    .map((e) => `${e.instancePath || "/"} ${e.message}${e.params && Object.keys(e.params).length ? " " + JSON.stringify(e.params) : ""}`)
    .join("; ");
}

// The error of one answer, or null when it conforms.
function check(a) {
  const method = String(a.method ?? "").toUpperCase();
  const status = String(a.status);
  const full = String(a.path ?? "");
  const path = full.split("?")[0];
  const where = `${method} ${full} -> ${status}`;
  if (!a.content_type && (doc["x-prism-below-prismd"]?.statuses ?? []).includes(status)) return null;
  const health = a.listener === "health";
  const template = health ? (HEALTH_PATHS.includes(path) ? path : null) : matchPath(path);
  const unrouted = doc[health ? "x-prism-health-listener" : "x-prism-unrouted"];
  let responses, label;
  if (!template) {
    responses = unrouted?.unknown_path;
    label = `${health ? "x-prism-health-listener" : "x-prism-unrouted"}.unknown_path`;
  } else {
    const item = doc.paths[template];
    const op = item[method === "HEAD" ? "get" : method.toLowerCase()];
    if (op && (method !== "HEAD" || template !== "/v1/jobs/{job}/events")) {
      responses = op.responses;
      label = `${template} ${method}`;
    } else {
      responses = unrouted?.unknown_method;
      label = `${health ? "x-prism-health-listener" : "x-prism-unrouted"}.unknown_method (${template} has no ${method})`;
    }
  }
  if (!responses) return `${where}: the document has no ${label}`;
  const resp0 = responses[status] ?? responses[`${status[0]}XX`] ?? responses.default;
  if (!resp0) return `${where}: status ${status} is not documented for ${label} (documented: ${Object.keys(responses).join(", ")})`;
  const resp = deref(resp0);
  const headers = a.headers ?? {};
  for (const [name, h0] of Object.entries(resp.headers ?? {})) {
    const h = deref(h0);
    const value = headers[name.toLowerCase()];
    if (value === undefined) {
      if (h.required) return `${where}: header ${name} is missing`;
      continue;
    }
    const hs = h.schema ?? {};
    if ("const" in hs && value !== hs.const) return `${where}: header ${name} is ${JSON.stringify(value)}, not ${JSON.stringify(hs.const)}`;
    if (hs.type === "integer" && !/^[0-9]+$/.test(value)) return `${where}: header ${name} ${JSON.stringify(value)} is not an integer`;
  }
  const content = resp.content ?? {};
  const body = a.body ?? "";
  if (Object.keys(content).length === 0) {
    return body === "" && !a.body_omitted ? null : `${where}: the document says no body, got one`;
  }
  const ct = normType(a.content_type);
  const mediaKey = Object.keys(content).find((k) => normType(k) === ct);
  if (!mediaKey) return `${where}: Content-Type ${JSON.stringify(a.content_type)} is not one of ${Object.keys(content).join(", ")}`;
  if (method === "HEAD" || !isJson(ct)) return null;
  let value;
  try {
    value = JSON.parse(body);
  } catch (e) {
    return `${where}: the body is not JSON (${e.message}): ${body.slice(0, 200)}`;
  }
  const schema = content[mediaKey].schema;
  if (!schema) return null;
  const validate = validatorFor(`${label} ${status} ${mediaKey}`, schema);
  if (!validate(value)) return `${where}: the body does not match ${label} ${status}: ${describe(validate.errors)}; body: ${body.slice(0, 300)}`;
  return null;
}

const HEALTH_PATHS = doc["x-prism-health-listener"]?.paths ?? [];

// The error of one server-sent event of a GET of path, or null: its data (JSON text) against the
// schema the stream's 200 response names for the event in x-prism-event-data.
function checkEvent(a) {
  const path = String(a.path ?? "").split("?")[0];
  const where = `event ${JSON.stringify(a.event)} of GET ${path}`;
  const template = matchPath(path);
  const content = template && doc.paths[template].get ? deref(doc.paths[template].get.responses["200"]).content : null;
  const events = content?.["text/event-stream"]?.["x-prism-event-data"];
  if (!events) return `${where}: the document lists no event stream there`;
  const schema = events[a.event];
  if (!schema) return `${where}: the document lists no such event (listed: ${Object.keys(events).join(", ")})`;
  let value;
  try {
    value = JSON.parse(a.data);
  } catch (e) {
    return `${where}: the data is not JSON (${e.message}): ${String(a.data).slice(0, 200)}`;
  }
  const validate = validatorFor(`${template} event ${a.event}`, schema);
  if (!validate(value)) return `${where}: the data does not match: ${describe(validate.errors)}; data: ${String(a.data).slice(0, 300)}`;
  return null;
}

// --self-check: the document itself. Every $ref resolves, every schema compiles, every path
// template's parameters are declared, every operation has responses, each with a description.
function selfCheck() {
  const problems = [];
  const walk = (node, where) => {
    if (Array.isArray(node)) return node.forEach((n, i) => walk(n, `${where}/${i}`));
    if (!node || typeof node !== "object") return;
    if (typeof node.$ref === "string") {
      try {
        deref(node);
      } catch {
        problems.push(`${where}: $ref ${node.$ref} does not resolve`);
      }
    }
    for (const [k, v] of Object.entries(node)) walk(v, `${where}/${k}`);
  };
  walk(doc, "#");
  if (!/^3\.1\./.test(doc.openapi ?? "")) problems.push(`openapi is ${doc.openapi}, not 3.1.x`);
  for (const name of Object.keys(doc.components?.schemas ?? {})) {
    try {
      validatorFor(`component ${name}`, { $ref: `${SCHEMA_PREFIX}${name}` });
    } catch (e) {
      problems.push(`components.schemas.${name}: ${e.message}`);
    }
  }
  const methods = ["get", "put", "post", "delete", "options", "head", "patch", "trace"];
  for (const [template, item] of Object.entries(doc.paths ?? {})) {
    const names = [...template.matchAll(/\{([^}]+)\}/g)].map((m) => m[1]);
    for (const method of methods.filter((m) => item[m])) {
      const op = item[method];
      const where = `${method.toUpperCase()} ${template}`;
      const params = [...(item.parameters ?? []), ...(op.parameters ?? [])].map((p) => {
        try {
          return deref(p);
        } catch {
          return {};
        }
      });
      for (const n of names)
        if (!params.some((p) => p.in === "path" && p.name === n && p.required === true))
          problems.push(`${where}: path parameter ${n} is not declared (required, in: path)`);
      if (!op.responses || Object.keys(op.responses).length === 0) problems.push(`${where}: no responses`);
      for (const [status, r0] of Object.entries(op.responses ?? {})) {
        let r;
        try {
          r = deref(r0);
        } catch {
          continue;
        }
        if (!r.description) problems.push(`${where} ${status}: no description`);
        for (const [media, m] of Object.entries(r.content ?? {})) {
          try {
            if (m.schema) validatorFor(`${where} ${status} ${media}`, m.schema);
          } catch (e) {
            problems.push(`${where} ${status} ${media}: ${e.message}`);
          }
        }
      }
    }
  }
  return problems;
}

if (process.argv.includes("--self-check")) {
  const problems = selfCheck();
  for (const p of problems) process.stderr.write(`openapi_check: ${p}\n`);
  process.stdout.write(`${problems.length} problems in ${docPath}\n`);
  process.exit(problems.length ? 1 : 0);
}

const rl = createInterface({ input: process.stdin, crlfDelay: Infinity });
rl.on("line", (line) => {
  if (!line.trim()) return;
  let out;
  try {
    const a = JSON.parse(line);
    const error = a.kind === "event" ? checkEvent(a) : check(a);
    out = error ? { ok: false, error } : { ok: true };
  } catch (e) {
    out = { ok: false, error: `openapi_check: ${e.message}` };
  }
  process.stdout.write(JSON.stringify(out) + "\n");
});
rl.on("close", () => process.exit(0));
