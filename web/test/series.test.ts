import assert from "node:assert/strict";
import { test } from "node:test";
import { chartSeries, historySince, mergePoints, precisionRank, thresholdBands, toBlockPoint, toPoint } from "../src/series";
import type { Precision, TelemetryRecord } from "../src/types";

/** A precision a newer prismd may send: drawn in grey, counted apart. */
const FP6 = "fp6" as unknown as Precision;

function record(step: number, extra: Partial<TelemetryRecord> = {}): TelemetryRecord {
  return {
    step_id: step,
    timestamp: 1795683194.5 + step,
    blocks_bf16: 2,
    blocks_int8: 1,
    mean_sensitivity: 0.5,
    max_sensitivity: 0.9,
    min_sensitivity: 0.1,
    precision_changes: 1,
    estimated_bandwidth_saving_pct: 16.7,
    low_precision: "int8",
    map_version: step / 10,
    block_details: {
      "0": { precision: "bf16", sensitivity: 0.9, grad_score: 0.9, error_score: null, relative_magnitude: 1.8 },
      "1": { precision: "bf16", sensitivity: 0.5, grad_score: 0.4, error_score: 0.7, relative_magnitude: 1.0 },
      "2": { precision: "int4", sensitivity: 0.1, grad_score: 0.1, error_score: null, relative_magnitude: 0.2 },
    },
    ...extra,
  };
}

test("a point counts blocks per precision from block_details", () => {
  const p = toPoint(record(10));
  assert.deepEqual(p, {
    step: 10,
    timestamp: 1795683204.5,
    saving: 16.7,
    changes: 1,
    loss: null,
    meanSensitivity: 0.5,
    minSensitivity: 0.1,
    maxSensitivity: 0.9,
    counts: { bf16: 2, int4: 1 },
  });
});

test("without block_details a point counts bf16 and the low format from the summary", () => {
  const { block_details: _, ...bare } = record(20, { low_precision: "fp8_e4m3", blocks_bf16: 40, blocks_int8: 8 });
  assert.deepEqual(toPoint(bare).counts, { bf16: 40, fp8_e4m3: 8 });
  assert.deepEqual(toPoint(record(20, { block_details: {}, blocks_bf16: 5, blocks_int8: 0 })).counts, { bf16: 5, int8: 0 });
});

test("a reported loss is kept; a missing or non-finite one is null", () => {
  assert.equal(toPoint(record(10, { loss: 2.25 })).loss, 2.25);
  assert.equal(toPoint(record(10, { loss: null })).loss, null);
  assert.equal(toPoint(record(10, { loss: Number.NaN })).loss, null);
});

test("merging points orders by step and keeps the later of two at the same step", () => {
  const a = [{ step: 10, v: "a" }, { step: 30, v: "a" }];
  const b = [{ step: 20, v: "b" }, { step: 30, v: "b" }];
  assert.deepEqual(mergePoints(a, b), [{ step: 10, v: "a" }, { step: 20, v: "b" }, { step: 30, v: "b" }]);
  assert.deepEqual(mergePoints([], []), []);
});

test("chart series: one column per chart, precisions most precise first, zero where absent", () => {
  const points = [
    toPoint(record(10, { estimated_bandwidth_saving_pct: 10, precision_changes: 3, loss: 3.5 })),
    toPoint(
      record(20, {
        estimated_bandwidth_saving_pct: 20.5,
        precision_changes: 0,
        mean_sensitivity: null,
        min_sensitivity: null,
        max_sensitivity: null,
        block_details: {
          "0": { precision: "int8", sensitivity: null, grad_score: null, error_score: null, relative_magnitude: null },
          "1": { precision: FP6, sensitivity: null, grad_score: null, error_score: null, relative_magnitude: null },
        },
      }),
    ),
  ];
  assert.deepEqual(chartSeries(points), {
    steps: [10, 20],
    saving: [10, 20.5],
    changes: [3, 0],
    loss: [3.5, null],
    hasLoss: true,
    mean: [0.5, null],
    min: [0.1, null],
    max: [0.9, null],
    precisions: ["bf16", "int8", "int4", "fp6"],
    perPrecision: [
      [2, 0],
      [0, 1],
      [1, 0],
      [0, 1],
    ],
  });
  assert.equal(chartSeries([toPoint(record(10))]).hasLoss, false);
  assert.deepEqual(chartSeries([]).steps, []);
});

test("a block's point of a record; a block the record does not list has nulls", () => {
  assert.deepEqual(toBlockPoint(record(30), 1), { step: 30, precision: "bf16", sensitivity: 0.5, gradScore: 0.4, errorScore: 0.7 });
  assert.deepEqual(toBlockPoint(record(30), 7), { step: 30, precision: null, sensitivity: null, gradScore: null, errorScore: null });
});

test("precision ranks put bf16 on top and int4 at the bottom", () => {
  assert.deepEqual(
    ["bf16", "fp8_e4m3", "fp8_e5m2", "int8", "int4", "fp6", null].map(precisionRank),
    [4, 3, 2, 1, 0, null, null],
  );
});

test("threshold bands: the hysteresis band runs from int8_threshold - margin to bf16_threshold", () => {
  assert.deepEqual(thresholdBands({ bf16_threshold: 0.6, int8_threshold: 0.3, hysteresis_margin: 0.1 }), {
    bf16: 0.6,
    low: 0.3,
    leaveBf16: 0.19999999999999998,
  });
  assert.deepEqual(thresholdBands({ bf16_threshold: 0.5, int8_threshold: 0.25, hysteresis_margin: 0.5 }), { bf16: 0.5, low: 0.25, leaveBf16: 0 });
});

test("history since: as many decisions as fit the byte budget, 20 to 5,000 of them", () => {
  const MB32 = 32 * 1024 * 1024;
  // 96 blocks: 12,800 bytes a record, 2,621 records, 26,210 steps at 10 per decision
  assert.equal(historySince(100000, 96, 10, MB32), 73790);
  // 10,000 blocks: 1,300,320 bytes a record: 25 records
  assert.equal(historySince(100000, 10000, 10, MB32), 99750);
  // 100,000 blocks: the floor of 20 decisions
  assert.equal(historySince(100000, 100000, 10, MB32), 99800);
  // no blocks known: the ceiling of 5,000 decisions
  assert.equal(historySince(100000, undefined, 10, MB32), 50000);
  assert.equal(historySince(500, 96, 10, MB32), 0, "the whole run fits");
  assert.equal(historySince(null, 96, 10, MB32), 0);
  assert.equal(historySince(1000, 96, 0, MB32), 0, "an interval below 1 counts as 1");
});

test("blocks_by_precision gives the counts when a record has it; auto is never a precision", () => {
  const by = { bf16: 3, int8: 0, fp8_e4m3: 1, fp8_e5m2: 0, int4: 1 };
  assert.deepEqual(toPoint(record(30, { low_precision: "auto", blocks_by_precision: by })).counts, { bf16: 3, fp8_e4m3: 1, int4: 1 });
  const { block_details: _, ...bare } = record(40, { low_precision: "auto", blocks_bf16: 4, blocks_int8: 2 });
  assert.deepEqual(toPoint(bare).counts, { bf16: 4, low: 2 });
  const s = chartSeries([toPoint(record(30, { low_precision: "auto", blocks_by_precision: by })), toPoint(record(40))]);
  assert.deepEqual(s.precisions, ["bf16", "fp8_e4m3", "int4"]);
  assert.deepEqual(s.perPrecision, [[3, 2], [1, 0], [1, 1]]);
});
