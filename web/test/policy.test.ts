import assert from "node:assert/strict";
import { test } from "node:test";
import { flipHint } from "../src/policy";
import { thresholdBands } from "../src/series";

const rules = {
  bands: thresholdBands({ bf16_threshold: 0.6, int8_threshold: 0.3, hysteresis_margin: 0.1 }),
  enabled: true,
  mode: "dynamic",
  min_steps_between_switches: 20,
  step: 100,
};
const block = { precision: "bf16", sensitivity: 0.4711, forced: false, last_switch_step: null };

test("a BF16 block goes low below int8_threshold - hysteresis_margin", () => {
  assert.equal(flipHint(block, rules), "to go low: score < 0.200 (now 0.471)");
});

test("a low block goes back to BF16 at bf16_threshold, whatever its format", () => {
  assert.equal(flipHint({ ...block, precision: "int8", sensitivity: 0.125 }, rules), "to go bf16: score ≥ 0.600 (now 0.125)");
  assert.equal(flipHint({ ...block, precision: "int4", sensitivity: 0 }, rules), "to go bf16: score ≥ 0.600 (now 0.000)");
});

test("within the cooldown the hint names the step it ends at; at its end it does not", () => {
  assert.equal(flipHint({ ...block, last_switch_step: 90 }, rules), "to go low: score < 0.200 (now 0.471); not before step 110 (cooldown)");
  assert.equal(flipHint({ ...block, last_switch_step: 80 }, rules), "to go low: score < 0.200 (now 0.471)");
  assert.equal(flipHint({ ...block, last_switch_step: 90 }, { ...rules, step: null }), "to go low: score < 0.200 (now 0.471)");
});

test("overrides, modes and missing scores say why no score decides", () => {
  assert.equal(flipHint({ ...block, forced: true }, rules), "held by an override");
  assert.equal(flipHint(block, { ...rules, enabled: false }), "policy disabled: bf16");
  assert.equal(flipHint(block, { ...rules, mode: "static" }), "mode static: no decisions by score");
  assert.equal(flipHint({ ...block, sensitivity: null }, rules), "no score yet");
});
