/* Telemetry records (one per decision, DESIGN 4.4) turned into what the charts draw. A record
 * of a big job carries every block's details; they are read once, counted or picked from, and
 * not kept. */
import type { TelemetryRecord } from "./types";
import { PRECISIONS, isPrecision } from "./palette";

/** What the charts keep of one record. */
export interface TelemetryPoint {
  step: number;
  timestamp: number;
  saving: number;
  changes: number;
  loss: number | null;
  meanSensitivity: number | null;
  minSensitivity: number | null;
  maxSensitivity: number | null;
  /**
   * blocks per precision: from blocks_by_precision when the record has it (issue 17: a low format
   * per block), else counted from block_details, else bf16 and the one low format of the summary
   */
  counts: Record<string, number>;
}

/** The name low blocks are counted under when a record says only "auto" (no breakdown). */
export const LOW_ANY = "low";

/**
 * Blocks per precision of one record. blocks_by_precision first: it counts every block whatever
 * the size of block_details. Its zero entries are left out (as a precision no block had). Under
 * low_precision "auto" without a breakdown, the low blocks go under LOW_ANY: "auto" is not a
 * precision and must not become a series of its own name.
 */
export function recordCounts(r: TelemetryRecord): Record<string, number> {
  const counts: Record<string, number> = {};
  const by = r.blocks_by_precision as Record<string, number> | undefined;
  if (by && typeof by === "object") {
    for (const k in by) if ((by[k] ?? 0) > 0) counts[k] = by[k]!;
    if (Object.keys(counts).length === 0) counts["bf16"] = 0;
  } else if (r.block_details && Object.keys(r.block_details).length > 0) {
    for (const id in r.block_details) {
      const p = r.block_details[id]!.precision;
      counts[p] = (counts[p] ?? 0) + 1;
    }
  } else {
    const low = r.low_precision === "auto" ? LOW_ANY : r.low_precision;
    counts["bf16"] = r.blocks_bf16;
    counts[low] = (counts[low] ?? 0) + r.blocks_int8;
  }
  return counts;
}

/** One record's point. */
export function toPoint(r: TelemetryRecord): TelemetryPoint {
  const counts = recordCounts(r);
  return {
    step: r.step_id,
    timestamp: r.timestamp,
    saving: r.estimated_bandwidth_saving_pct,
    changes: r.precision_changes,
    loss: typeof r.loss === "number" && Number.isFinite(r.loss) ? r.loss : null,
    meanSensitivity: r.mean_sensitivity,
    minSensitivity: r.min_sensitivity,
    maxSensitivity: r.max_sensitivity,
    counts,
  };
}

/**
 * points and more, ordered by step, one point per step (a later one replaces an earlier one of
 * the same step: a record read again after a refetch).
 */
export function mergePoints<T extends { step: number }>(points: readonly T[], more: readonly T[]): T[] {
  const byStep = new Map<number, T>();
  for (const p of points) byStep.set(p.step, p);
  for (const p of more) byStep.set(p.step, p);
  return [...byStep.values()].sort((a, b) => a.step - b.step);
}

export interface ChartSeries {
  steps: number[];
  saving: number[];
  changes: number[];
  /** null where a record had no loss */
  loss: (number | null)[];
  /** true when at least one record reported a loss */
  hasLoss: boolean;
  mean: (number | null)[];
  min: (number | null)[];
  max: (number | null)[];
  /** the precisions seen in any record, most precise first, unknown names last */
  precisions: string[];
  /** blocks per precision, one array per entry of precisions; 0 where a record had none */
  perPrecision: number[][];
}

/** The columns of the charts over steps, from points ordered by step. */
export function chartSeries(points: readonly TelemetryPoint[]): ChartSeries {
  const seen = new Set<string>();
  for (const p of points) for (const k in p.counts) seen.add(k);
  const precisions = [
    ...PRECISIONS.filter((p) => seen.has(p)),
    ...[...seen].filter((p) => !isPrecision(p)).sort(),
  ];
  return {
    steps: points.map((p) => p.step),
    saving: points.map((p) => p.saving),
    changes: points.map((p) => p.changes),
    loss: points.map((p) => p.loss),
    hasLoss: points.some((p) => p.loss !== null),
    mean: points.map((p) => p.meanSensitivity),
    min: points.map((p) => p.minSensitivity),
    max: points.map((p) => p.maxSensitivity),
    precisions,
    perPrecision: precisions.map((k) => points.map((p) => p.counts[k] ?? 0)),
  };
}

/** What the block view keeps of one record: that block's figures at that decision. */
export interface BlockPoint {
  step: number;
  precision: string | null;
  sensitivity: number | null;
  gradScore: number | null;
  errorScore: number | null;
}

/** Block id's point of a record; precision null when the record does not list the block. */
export function toBlockPoint(r: TelemetryRecord, id: number): BlockPoint {
  const d = r.block_details?.[String(id)];
  return {
    step: r.step_id,
    precision: d ? d.precision : null,
    sensitivity: d ? d.sensitivity : null,
    gradScore: d ? d.grad_score : null,
    errorScore: d ? d.error_score : null,
  };
}

/**
 * The y value of a precision on the block view's precision chart: its index in PRECISIONS
 * counted from the bottom (int4 0 .. bf16 4), so higher is more precise; null for none.
 */
export function precisionRank(p: string | null): number | null {
  if (p === null || !isPrecision(p)) return null;
  return PRECISIONS.length - 1 - PRECISIONS.indexOf(p);
}

/** Bands of the block view's sensitivity chart from the job's config (DESIGN 4.1, 4.2). */
export interface ThresholdBands {
  bf16: number;
  low: number;
  /** below this a BF16 block goes low: low - hysteresis_margin (never below 0) */
  leaveBf16: number;
}

/**
 * The thresholds a decision compares a score with: at or above bf16 a block goes (or stays)
 * BF16; below low a fresh block goes low; a BF16 block goes low only below leaveBf16. Between
 * leaveBf16 and bf16 a block keeps the precision it has: the hysteresis band.
 */
export function thresholdBands(config: { bf16_threshold: number; int8_threshold: number; hysteresis_margin: number }): ThresholdBands {
  return {
    bf16: config.bf16_threshold,
    low: config.int8_threshold,
    leaveBf16: Math.max(0, config.int8_threshold - config.hysteresis_margin),
  };
}

/** About the bytes of one telemetry record of a job: its summary, then each block's details. */
export const RECORD_BYTES = 320;
export const RECORD_BYTES_PER_BLOCK = 130;
/** What a view reads of a job's telemetry when it opens, about, in bytes. */
export const HISTORY_BUDGET_BYTES = 32 * 1024 * 1024;

/**
 * The first step a view asks telemetry from when it opens: far enough back for as many
 * decisions (every interval steps) as fit in budget bytes of records of a job of that many
 * blocks (at least 20, at most 5,000 decisions), 0 when the whole run fits or the step is
 * not known. Every record carries every block's details, so a 10,000-block job's history is
 * read from its last few dozen decisions and a small job's from its start.
 */
export function historySince(step: number | null | undefined, blocks: number | null | undefined, interval: number, budget = HISTORY_BUDGET_BYTES): number {
  if (step === null || step === undefined || !Number.isFinite(step)) return 0;
  const perRecord = RECORD_BYTES + RECORD_BYTES_PER_BLOCK * Math.max(0, blocks ?? 0);
  const records = Math.min(5000, Math.max(20, Math.floor(budget / perRecord)));
  return Math.max(0, step - records * Math.max(1, interval));
}
