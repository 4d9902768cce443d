import assert from "node:assert/strict";
import { test } from "node:test";
import { fractionPct, numericsRows, showsFractions } from "../src/numerics";
import type { Block } from "../src/types";

function block(id: number, extra: Partial<Block> = {}): Block {
  return {
    id,
    name: `layer.${id}`,
    precision: "bf16",
    sensitivity: 0.5,
    grad_score: 0.5,
    error_score: null,
    relative_magnitude: 1,
    last_switch_step: null,
    reason: "none",
    forced: false,
    candidate: "int8",
    hold_until: null,
    ...extra,
  };
}

test("the table lists low, held, rolled-back and measured blocks, the most saturated first", () => {
  const blocks = [
    block(0),
    block(1, { precision: "int4", reason: "score", saturated_fraction: 0.25, underflowed_fraction: 0.125 }),
    block(2, { precision: "fp8_e4m3", reason: "score", saturated_fraction: 0.125, underflowed_fraction: 0.375 }),
    block(3, { reason: "saturation", saturated_fraction: 0.75, underflowed_fraction: 0 }),
    block(4, { reason: "loss_spike", hold_until: 15 }),
    block(5, { precision: "int8", reason: "score" }),
    block(6, { reason: "score", saturated_fraction: null, underflowed_fraction: null }),
  ];
  assert.deepEqual(numericsRows(blocks).rows.map((b) => b.id), [3, 1, 2, 4, 5]);
  assert.equal(numericsRows(blocks).total, 5);
  assert.deepEqual(numericsRows(blocks, 2), { rows: [blocks[3], blocks[1]], total: 5 });
  assert.deepEqual(numericsRows([block(0), block(1, { reason: "score" })]), { rows: [], total: 0 });
});

test("SAT and UNDER columns come when the blocks carry the fractions, null (no figures yet) included", () => {
  assert.equal(showsFractions([block(0), block(1)]), false);
  assert.equal(showsFractions([block(0), block(1, { saturated_fraction: null, underflowed_fraction: null })]), true);
  assert.equal(showsFractions([block(0), block(1, { saturated_fraction: 0, underflowed_fraction: 0 })]), true);
});

test("a fraction reads as a percent with 4 decimals", () => {
  assert.equal(fractionPct(0.125), "12.5000 %");
  assert.equal(fractionPct(0), "0.0000 %");
  assert.equal(fractionPct(1), "100.0000 %");
  assert.equal(fractionPct(null), "—");
  assert.equal(fractionPct(undefined), "—");
});
