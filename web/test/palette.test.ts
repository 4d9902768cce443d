import assert from "node:assert/strict";
import { test } from "node:test";
import {
  MAP_BACKGROUND,
  PRECISIONS,
  PRECISION_COLOURS,
  cellColour,
  dimmed,
  levelBrightness,
  parseHex,
  precisionColour,
  sensitivityLevel,
} from "../src/palette";

test("the palette is Okabe-Ito's, one distinct colour per precision, most precise first", () => {
  assert.deepEqual([...PRECISIONS], ["bf16", "fp8_e4m3", "fp8_e5m2", "int8", "int4"]);
  assert.deepEqual(PRECISION_COLOURS, { bf16: "#56b4e9", fp8_e4m3: "#009e73", fp8_e5m2: "#cc79a7", int8: "#e69f00", int4: "#f0e442" });
  assert.equal(new Set(Object.values(PRECISION_COLOURS)).size, 5);
  assert.equal(precisionColour("fp6"), "#999999");
  assert.equal(MAP_BACKGROUND, "#101317");
});

test("parseHex reads #rrggbb and refuses anything else", () => {
  assert.deepEqual(parseHex("#56b4e9"), [86, 180, 233]);
  assert.deepEqual(parseHex("#E69F00"), [230, 159, 0]);
  assert.throws(() => parseHex("#fff"), /not a #rrggbb colour/);
});

test("sensitivity levels cut [0, 1] into 8 steps; no score is -1", () => {
  const cases: [number | null | undefined, number][] = [
    [null, -1], [undefined, -1], [Number.NaN, -1], [-0.2, 0], [0, 0], [0.124, 0], [0.125, 1],
    [0.5, 4], [0.874, 6], [0.875, 7], [0.999, 7], [1, 7], [1.5, 7],
  ];
  for (const [s, level] of cases) assert.equal(sensitivityLevel(s), level, `sensitivity ${s}`);
});

test("brightness runs from 0.4 at level 0 to 1 at level 7; 0.25 without a score", () => {
  assert.equal(levelBrightness(0), 0.4);
  assert.equal(levelBrightness(7), 1);
  assert.equal(levelBrightness(-1), 0.25);
  assert.equal(levelBrightness(3), 0.6571428571428571);
  assert.equal(levelBrightness(4), 0.7428571428571429);
});

test("a cell's colour: the precision's hue mixed with the background by brightness", () => {
  assert.equal(cellColour("bf16", 1), "rgb(86, 180, 233)");
  assert.equal(cellColour("bf16", 0.95), "rgb(86, 180, 233)");
  assert.equal(cellColour("bf16", 0), "rgb(44, 83, 107)");
  assert.equal(cellColour("int8", null), "rgb(70, 54, 17)");
  assert.equal(cellColour("int8", 0.5), "rgb(175, 123, 6)");
  assert.equal(cellColour("int4", 1), "rgb(240, 228, 66)");
  assert.equal(cellColour("fp6", 1), "rgb(153, 153, 153)");
  assert.equal(dimmed("#ffffff", 0), "rgb(16, 19, 23)");
});

test("brighter means more sensitive, for every precision", () => {
  for (const p of PRECISIONS) {
    const sum = (s: number) => cellColour(p, s).match(/\d+/g)!.map(Number).reduce((a, b) => a + b, 0);
    for (let l = 1; l < 8; l++) assert.ok(sum(l / 8) > sum((l - 1) / 8), `${p} level ${l}`);
  }
});
