import assert from "node:assert/strict";
import { test } from "node:test";
import { cellAt, cellCentre, cellGap, cellOrigin, gridLayout } from "../src/grid";

test("the gap between cells: 2 px from pitch 28, 1 px from 6, none below", () => {
  assert.deepEqual([40, 34, 28, 22, 6, 5, 3].map(cellGap), [2, 2, 2, 1, 1, 0, 0]);
});

test("one block: a single 40-pixel cell", () => {
  const g = gridLayout(1, 1000, 600);
  assert.deepEqual(g, { n: 1, cols: 1, rows: 1, pitch: 40, cell: 38, width: 40, height: 40 });
  assert.equal(cellAt(g, 0, 0), 0);
  assert.equal(cellAt(g, 39.9, 39.9), 0);
  assert.equal(cellAt(g, 40, 0), -1);
  assert.equal(cellAt(g, 0, 40), -1);
  assert.equal(cellAt(g, -0.1, 5), -1);
  assert.deepEqual(cellCentre(g, 0), { x: 19, y: 19 });
});

test("48 blocks across a 1538-pixel panel: 40-pixel cells, 38 to a row, the second row holds 10", () => {
  const g = gridLayout(48, 1538, 700);
  assert.deepEqual(g, { n: 48, cols: 38, rows: 2, pitch: 40, cell: 38, width: 1520, height: 80 });
  assert.equal(cellAt(g, 1519.9, 39.9), 37);
  assert.equal(cellAt(g, 38.5, 10), 0, "the gap after a cell belongs to it");
  assert.equal(cellAt(g, 40, 10), 1);
  assert.equal(cellAt(g, 0, 40), 38);
  assert.deepEqual(cellOrigin(g, 47), { x: 360, y: 40 });
  assert.deepEqual(cellCentre(g, 47), { x: 379, y: 59 });
  assert.equal(cellAt(g, 379, 59), 47);
  assert.equal(cellAt(g, 399.9, 79.9), 47);
  assert.equal(cellAt(g, 400, 59), -1, "past the last block on the last row");
  assert.equal(cellAt(g, 1520, 10), -1, "right of the grid");
});

test("seven blocks in a narrow box: 40 and 34 px are too tall, 28 px makes 3 columns", () => {
  const g = gridLayout(7, 100, 100);
  assert.deepEqual(g, { n: 7, cols: 3, rows: 3, pitch: 28, cell: 26, width: 84, height: 84 });
  assert.equal(cellAt(g, 1, 57), 6);
  assert.equal(cellAt(g, 83.9, 55.9), 5);
  assert.equal(cellAt(g, 29, 57), -1, "past the last block on the last row");
  assert.equal(cellAt(g, 83.9, 83.9), -1);
  assert.deepEqual(cellOrigin(g, 6), { x: 0, y: 56 });
  assert.deepEqual(cellCentre(g, 6), { x: 13, y: 69 });
});

test("1,000 blocks: the largest pitch whose grid fits the height", () => {
  const g = gridLayout(1000, 1200, 600);
  assert.deepEqual(g, { n: 1000, cols: 54, rows: 19, pitch: 22, cell: 21, width: 1188, height: 418 });
  assert.deepEqual(cellOrigin(g, 999), { x: 594, y: 396 });
  assert.deepEqual(cellCentre(g, 999), { x: 604.5, y: 406.5 });
  assert.equal(cellAt(g, 604.5, 406.5), 999);
  assert.equal(cellAt(g, 615.9, 417.9), 999, "the gap after a cell belongs to it");
  assert.equal(cellAt(g, 616, 396), -1);
  assert.equal(cellAt(g, 1187.9, 0), 53);
  assert.equal(cellAt(g, 0, 22), 54);
});

test("10,000 blocks: pitch 10 in 1550 x 700, the last cell at row 64", () => {
  const g = gridLayout(10000, 1550, 700);
  assert.deepEqual(g, { n: 10000, cols: 155, rows: 65, pitch: 10, cell: 9, width: 1550, height: 650 });
  assert.deepEqual(cellCentre(g, 9999), { x: 794.5, y: 644.5 });
  assert.equal(cellAt(g, 794.5, 644.5), 9999);
  assert.equal(cellAt(g, 800, 644.5), -1);
  assert.equal(cellAt(g, 1549.9, 639.9), 9919);
  assert.equal(cellAt(g, 1550, 0), -1);
  assert.equal(cellAt(g, 0, 650), -1);
});

test("10,000 blocks in a small box: the smallest pitch, no gap, taller than the box", () => {
  const g = gridLayout(10000, 300, 100);
  assert.deepEqual(g, { n: 10000, cols: 100, rows: 100, pitch: 3, cell: 3, width: 300, height: 300 });
  assert.equal(cellAt(g, 299.9, 299.9), 9999);
});

test("no blocks: an empty grid where nothing is found", () => {
  const g = gridLayout(0, 500, 500);
  assert.equal(g.cols, 0);
  assert.equal(g.width, 0);
  assert.equal(cellAt(g, 0, 0), -1);
});

test("pixel -> block -> pixel round trip at 1, 7, 48, 1,000 and 10,000 blocks", () => {
  for (const [n, w, h] of [[1, 800, 600], [7, 100, 100], [48, 1538, 700], [48, 500, 300], [1000, 1200, 600], [10000, 1550, 700], [10000, 977, 333]] as const) {
    const g = gridLayout(n, w, h);
    for (let i = 0; i < n; i++) {
      const c = cellCentre(g, i);
      const o = cellOrigin(g, i);
      assert.equal(cellAt(g, c.x, c.y), i);
      assert.equal(cellAt(g, o.x, o.y), i);
      assert.equal(cellAt(g, o.x + g.pitch - 0.01, o.y + g.pitch - 0.01), i);
    }
  }
});
