import assert from "node:assert/strict";
import { test } from "node:test";
import { apiUrl, jobPath, segment } from "../src/url";
import { parseRoute, routeHash } from "../src/route";

test("API URLs are relative to the page, under a path prefix and over TLS", () => {
  assert.equal(apiUrl("v1/jobs", "https://gpu.example/prism/"), "https://gpu.example/prism/v1/jobs");
  assert.equal(apiUrl("v1/jobs", "https://gpu.example/prism/#/jobs/a/charts"), "https://gpu.example/prism/v1/jobs");
  assert.equal(apiUrl("v1/jobs", "https://gpu.example/prism/index.html?x=1"), "https://gpu.example/prism/v1/jobs");
  assert.equal(apiUrl("v1/jobs", "http://127.0.0.1:8080/"), "http://127.0.0.1:8080/v1/jobs");
  assert.equal(apiUrl("v1/jobs", "https://a.example/x/y/prism/"), "https://a.example/x/y/prism/v1/jobs");
});

test("job paths escape every segment; queries keep their order and skip undefined", () => {
  assert.equal(segment("a b"), "a%20b");
  assert.equal(jobPath("llama-7b", "blocks", 7), "v1/jobs/llama-7b/blocks/7");
  assert.equal(jobPath("a b?#"), "v1/jobs/a%20b%3F%23");
  assert.equal(
    apiUrl(jobPath("j/1", "telemetry"), "https://gpu.example/prism/", { since_step: 5, limit: 1000, x: undefined }),
    "https://gpu.example/prism/v1/jobs/j%2F1/telemetry?since_step=5&limit=1000",
  );
});

test("an absolute path or URL is refused: it would leave the prefix", () => {
  assert.throws(() => apiUrl("/v1/jobs", "https://gpu.example/prism/"), /not a relative path/);
  assert.throws(() => apiUrl("https://elsewhere.example/v1/jobs", "https://gpu.example/prism/"), /not a relative path/);
});

test("hash routes of plan 13 and back", () => {
  const cases: [string, ReturnType<typeof parseRoute>][] = [
    ["", { view: "jobs" }],
    ["#/", { view: "jobs" }],
    ["#/jobs/llama", { view: "map", job: "llama" }],
    ["#/jobs/a%20b/charts", { view: "charts", job: "a b" }],
    ["#/jobs/j/ranks", { view: "ranks", job: "j" }],
    ["#/jobs/j/config", { view: "config", job: "j" }],
    ["#/jobs/j/plan", { view: "plan", job: "j" }],
    ["#/jobs/j/blocks/9999", { view: "block", job: "j", block: 9999 }],
  ];
  for (const [hash, route] of cases) {
    assert.deepEqual(parseRoute(hash), route, hash);
    if (hash) assert.equal(routeHash(route), hash === "" ? "#/" : hash);
  }
  assert.deepEqual(parseRoute("#/jobs/j/blocks/x"), { view: "map", job: "j" });
  assert.deepEqual(parseRoute("#/nothing"), { view: "jobs" });
  assert.deepEqual(parseRoute("#/jobs/%E0%A4%A"), { view: "jobs" }, "a malformed escape");
});
