import assert from "node:assert/strict";
import { test } from "node:test";
import { type PlanClass, indicator, lowCount, memoryShare, raiseCounts, seconds, statusText } from "../src/plan";

const none = { blocks_missing_statistics: 0, classes_seen: [] as string[] };

test("the plan's status in words", () => {
  assert.equal(statusText({ ...none, status: "disabled" }), "off");
  assert.equal(statusText({ ...none, status: "single_class", classes_seen: ["h100"] }), "one device class (h100): nothing to plan");
  assert.equal(statusText({ ...none, status: "single_class" }), "one device class (no rank said Hello): nothing to plan");
  assert.equal(statusText({ ...none, status: "waiting_for_statistics", blocks_missing_statistics: 1 }), "waiting for statistics: 1 block lacks them");
  assert.equal(statusText({ ...none, status: "waiting_for_statistics", blocks_missing_statistics: 48 }), "waiting for statistics: 48 blocks lack them");
  assert.equal(statusText({ ...none, status: "waiting_for_statistics" }), "waiting for the next decision");
  assert.equal(statusText({ ...none, status: "planned" }), "planned");
  assert.equal(statusText({ ...none, status: "refused" }), "refused: the plan in force stays");
});

test("predicted times in the unit that reads best, and Σω", () => {
  assert.equal(seconds(0.00081234), "812.3 µs");
  assert.equal(seconds(0.0456749), "45.67 ms");
  assert.equal(seconds(0.5), "500 ms");
  assert.equal(seconds(1.23449), "1.234 s");
  assert.equal(seconds(120), "120 s");
  assert.equal(seconds(0), "0 s");
  assert.equal(seconds(null), "—");
  assert.equal(seconds(Number.NaN), "—");
  assert.equal(indicator(0.000123456), "1.235e-4");
  assert.equal(indicator(0), "0.000e+0");
});

const cls = (plan: PlanClass["plan"], memory: number, budget: number): PlanClass => ({
  name: "t4", fixed: false, low_format: "int8", high_format: "fp16", plan, memory_bytes: memory, budget_bytes: budget, compute_seconds: 0.1,
});

test("a class's low blocks and memory share; the raise log counted", () => {
  assert.equal(lowCount(cls(["fp16", "int8", "int8", "fp16"], 1, 2)), 2);
  assert.equal(lowCount(cls([], 1, 2)), 0);
  assert.equal(memoryShare(cls([], 3, 4)), 0.75);
  assert.equal(memoryShare(cls([], 5, 4)), 1, "over budget: a full bar");
  assert.equal(memoryShare(cls([], 0, 0)), 0);
  assert.equal(memoryShare(cls([], 1, 0)), 1);
  assert.deepEqual(
    raiseCounts([
      { class: "t4", block: 1, delta: 3, accepted: true, reason: "ok" },
      { class: "t4", block: 2, delta: 2, accepted: false, reason: "memory" },
      { class: "t4", block: 3, delta: 1, accepted: false, reason: "time" },
      { class: "t4", block: 4, delta: 0.5, accepted: false, reason: "time" },
      { class: "t4", block: 5, delta: 0.1, accepted: true, reason: "ok" },
    ]),
    { accepted: 2, memory: 1, time: 2 },
  );
  assert.deepEqual(raiseCounts([]), { accepted: 0, memory: 0, time: 0 });
});
