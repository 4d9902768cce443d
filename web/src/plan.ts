/* What the plan view says about a hybrid-device plan (GET v1/jobs/{job}/plan, DESIGN 11), as
 * pure functions the unit tests pin: the status in words, durations, Σω, the raise log counted,
 * a class's low blocks and its memory share. */
import type { HybridPlan, JobPlan } from "./types";

export type PlanClass = HybridPlan["classes"][number];
export type Raise = HybridPlan["raises"][number];

/** The status in a few words, for the heading beside prismd's own message. */
export function statusText(p: Pick<JobPlan, "status" | "blocks_missing_statistics" | "classes_seen">): string {
  switch (p.status) {
    case "disabled":
      return "off";
    case "single_class":
      return `one device class (${p.classes_seen.length === 0 ? "no rank said Hello" : p.classes_seen.join(", ")}): nothing to plan`;
    case "waiting_for_statistics":
      return p.blocks_missing_statistics > 0
        ? `waiting for statistics: ${p.blocks_missing_statistics} ${p.blocks_missing_statistics === 1 ? "block lacks" : "blocks lack"} them`
        : "waiting for the next decision";
    case "planned":
      return "planned";
    case "refused":
      return "refused: the plan in force stays";
  }
}

/**
 * A predicted time in seconds with 4 significant digits in the unit that reads best: "812.3 µs",
 * "45.67 ms", "1.234 s"; a dash when not finite. (The browser tests print the same rule.)
 */
export function seconds(x: number | null | undefined): string {
  if (x === null || x === undefined || !Number.isFinite(x)) return "—";
  const a = Math.abs(x);
  if (a === 0) return "0 s";
  if (a < 1e-3) return `${+(x * 1e6).toPrecision(4)} µs`;
  if (a < 1) return `${+(x * 1e3).toPrecision(4)} ms`;
  return `${+x.toPrecision(4)} s`;
}

/** Σω (the plan's variance-increment indicator): 4 significant digits, exponent form. */
export function indicator(x: number): string {
  return Number.isFinite(x) ? x.toExponential(3) : "—";
}

/** The raise log counted: accepted, refused for memory, refused for time. */
export function raiseCounts(raises: readonly Raise[]): { accepted: number; memory: number; time: number } {
  const c = { accepted: 0, memory: 0, time: 0 };
  for (const r of raises) {
    if (r.accepted) c.accepted++;
    else if (r.reason === "memory") c.memory++;
    else if (r.reason === "time") c.time++;
  }
  return c;
}

/** How many blocks the class runs in its low format (every entry that is not its high one). */
export function lowCount(c: PlanClass): number {
  return c.plan.reduce((n, f) => (f === c.high_format ? n : n + 1), 0);
}

/** The share of the memory budget the plan uses, for the bar: [0, 1] (over budget reads 1). */
export function memoryShare(c: PlanClass): number {
  if (!(c.budget_bytes > 0)) return c.memory_bytes > 0 ? 1 : 0;
  return Math.min(1, Math.max(0, c.memory_bytes / c.budget_bytes));
}
