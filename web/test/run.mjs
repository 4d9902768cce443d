// Runs the dashboard's unit tests: compiles each test/*.test.ts with esbuild (bundled with the
// modules it imports) into --out, then runs them with `node --test` (Node 18 and later).
//
//   node web/test/run.mjs [--out DIR]
import { spawnSync } from "node:child_process";
import fs from "node:fs";
import path from "node:path";
import { fileURLToPath } from "node:url";
import * as esbuild from "esbuild";

const TEST = path.dirname(fileURLToPath(import.meta.url));
const argv = process.argv.slice(2);
const outIndex = argv.indexOf("--out");
const out = outIndex >= 0 && argv[outIndex + 1] ? path.resolve(argv[outIndex + 1]) : path.join(TEST, "..", "..", "build", "web", "test");

const sources = fs.readdirSync(TEST).filter((f) => f.endsWith(".test.ts")).sort();
if (sources.length === 0) {
  console.error("run.mjs: no test/*.test.ts");
  process.exit(1);
}
fs.rmSync(out, { recursive: true, force: true });
await esbuild.build({
  entryPoints: sources.map((f) => path.join(TEST, f)),
  bundle: true,
  platform: "node",
  format: "esm",
  target: "node18",
  outdir: out,
  outExtension: { ".js": ".mjs" },
  logLevel: "warning",
});
const files = sources.map((f) => path.join(out, f.replace(/\.ts$/, ".mjs")));
const r = spawnSync(process.execPath, ["--test", ...files], { stdio: "inherit" });
process.exit(r.status ?? 1);
