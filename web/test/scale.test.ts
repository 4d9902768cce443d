import assert from "node:assert/strict";
import { test } from "node:test";
import { PRECISIONS } from "../src/palette";
import { clamp, linear, shares } from "../src/scale";

test("linear maps a domain onto a range, reversed ranges too", () => {
  assert.equal(linear(0, 1, 0, 100)(0.25), 25);
  assert.equal(linear(0, 10, 100, 0)(2), 80);
  assert.equal(linear(-1, 1, 0, 50)(0), 25);
  assert.equal(linear(3, 3, 7, 9)(100), 7, "a zero-width domain maps to the range's start");
});

test("clamp", () => {
  assert.equal(clamp(-1, 0, 1), 0);
  assert.equal(clamp(2, 0, 1), 1);
  assert.equal(clamp(0.5, 0, 1), 0.5);
});

test("shares of a stacked bar: in the keys' order, empty ones left out", () => {
  assert.deepEqual(shares({ int8: 1, bf16: 3, int4: 0 }, PRECISIONS), [
    { key: "bf16", count: 3, fraction: 0.75, offset: 0 },
    { key: "int8", count: 1, fraction: 0.25, offset: 0.75 },
  ]);
  assert.deepEqual(shares({ bf16: 29, int8: 19 }, ["bf16", "int8"]).map((s) => s.fraction), [29 / 48, 19 / 48]);
  assert.deepEqual(shares({}, PRECISIONS), []);
  assert.deepEqual(shares({ fp6: 2 }, PRECISIONS), [], "only the keys asked for");
});
