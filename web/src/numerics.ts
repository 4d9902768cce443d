/* The numerics of issue 17 (DESIGN 4.7) as the block map's table shows them: which blocks it
 * lists, in which order, and how a saturation figure reads. Plain functions, no DOM. */
import type { Block } from "./types";

/** Reasons set by the numerics rules (a loss spike's rollback, a move to the candidate format, saturation). */
export const NUMERICS_REASONS: readonly string[] = ["loss_spike", "format", "saturation"];

/** The most rows the table shows; a note counts the rest. */
export const NUMERICS_ROWS_MAX = 100;

/**
 * True when the table shows the SAT and UNDER columns: when the REST blocks carry the fractions,
 * which they do under a scale mode other than current (null before any figures came) or when a
 * block has figures. The rule of prismctl blocks.
 */
export function showsFractions(blocks: readonly Block[]): boolean {
  return blocks.some((b) => b.saturated_fraction !== undefined || b.underflowed_fraction !== undefined);
}

/**
 * The blocks the table lists: those in a low format, held by a loss spike, moved by a numerics
 * rule, or with saturation figures; the most saturated first (blocks without figures after
 * those with), then by id. At most max of them; total counts them all.
 */
export function numericsRows(blocks: readonly Block[], max = NUMERICS_ROWS_MAX): { rows: Block[]; total: number } {
  const listed = blocks.filter(
    (b) =>
      b.precision !== "bf16" ||
      (b.hold_until ?? null) !== null ||
      NUMERICS_REASONS.includes(b.reason) ||
      typeof b.saturated_fraction === "number",
  );
  const sat = (b: Block) => (typeof b.saturated_fraction === "number" ? b.saturated_fraction : -1);
  listed.sort((a, b) => sat(b) - sat(a) || a.id - b.id);
  return { rows: listed.slice(0, Math.max(0, max)), total: listed.length };
}

/** A fraction as a percent with 4 decimals ("12.5000 %"), as prismctl blocks prints it; null: "—". */
export function fractionPct(x: number | null | undefined): string {
  if (x === null || x === undefined || !Number.isFinite(x)) return "—";
  return `${(x * 100).toFixed(4)} %`;
}
