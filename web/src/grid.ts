/* The block map's geometry: blocks in id order, row by row, in square cells. Hover and click
 * find a block by arithmetic on the pointer position (no search), so a map of 10,000 blocks
 * answers as fast as one of 10. All figures are CSS pixels. */

export interface GridLayout {
  /** number of blocks */
  n: number;
  cols: number;
  rows: number;
  /** distance from one cell to the next */
  pitch: number;
  /** side of the drawn square: pitch minus the gap */
  cell: number;
  width: number;
  height: number;
}

/** Cell pitches tried, largest first: a small job gets big cells, rows wrapping at maxWidth. */
export const PITCHES = [40, 34, 28, 22, 18, 15, 12, 10, 8, 6, 5, 4, 3] as const;

/** The gap between two cells at a pitch: 2 px from 28 px, 1 px from 6 px, none below. */
export function cellGap(pitch: number): number {
  return pitch >= 28 ? 2 : pitch >= 6 ? 1 : 0;
}

/**
 * The layout of n blocks in at most maxWidth: the largest pitch of PITCHES whose grid fits
 * within maxHeight, else the smallest (the map then grows taller than maxHeight and scrolls).
 * Rows are as wide as maxWidth allows (the last one may be shorter); cells are pitch minus
 * cellGap(pitch) square.
 */
export function gridLayout(n: number, maxWidth: number, maxHeight: number): GridLayout {
  let pitch: number = PITCHES[PITCHES.length - 1]!;
  for (const p of PITCHES) {
    const cols = Math.max(1, Math.floor(maxWidth / p));
    if (Math.ceil(n / cols) * p <= maxHeight) {
      pitch = p;
      break;
    }
  }
  const cols = n === 0 ? 0 : Math.min(n, Math.max(1, Math.floor(maxWidth / pitch)));
  const rows = cols === 0 ? 0 : Math.ceil(n / cols);
  const cell = pitch - cellGap(pitch);
  return { n, cols, rows, pitch, cell, width: cols * pitch, height: rows * pitch };
}

/**
 * The block under point (x, y), relative to the grid's top-left corner, or -1 where there is
 * none (outside the grid, or past the last block on the last row). A gap belongs to the cell
 * before it, so no pointer position between two cells finds nothing.
 */
export function cellAt(g: GridLayout, x: number, y: number): number {
  if (!(x >= 0 && y >= 0 && x < g.width && y < g.height)) return -1;
  const col = Math.floor(x / g.pitch);
  const row = Math.floor(y / g.pitch);
  const i = row * g.cols + col;
  return i < g.n ? i : -1;
}

/** The top-left corner of block i's square. */
export function cellOrigin(g: GridLayout, i: number): { x: number; y: number } {
  const row = Math.floor(i / g.cols);
  return { x: (i - row * g.cols) * g.pitch, y: row * g.pitch };
}

/** The centre of block i's square. */
export function cellCentre(g: GridLayout, i: number): { x: number; y: number } {
  const o = cellOrigin(g, i);
  return { x: o.x + g.cell / 2, y: o.y + g.cell / 2 };
}
