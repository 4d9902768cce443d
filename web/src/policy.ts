/* What a decision would need to change a block's precision (DESIGN 4.2), in words for the
 * block map's tooltip and the block view: the threshold its score must cross and, within the
 * cooldown, the step before which it cannot switch at all. */
import type { ThresholdBands } from "./series";

export interface FlipFacts {
  precision: string;
  sensitivity: number | null;
  forced: boolean;
  last_switch_step: number | null;
}

export interface FlipRules {
  bands: ThresholdBands;
  /** config.enabled and config.mode: only "dynamic" decides by score */
  enabled: boolean;
  mode: string;
  min_steps_between_switches: number;
  /** the job's last collected step (null before any) */
  step: number | null;
}

const f3 = (x: number) => x.toFixed(3);

/**
 * The condition under which the next decision would switch block b by its score, e.g.
 * "to go low: score < 0.200 (now 0.471)". Overrides, modes without score decisions and blocks
 * without a score say so instead; a block in its cooldown (a switch fewer than
 * min_steps_between_switches steps ago) adds the step it ends at.
 */
export function flipHint(b: FlipFacts, r: FlipRules): string {
  if (b.forced) return "held by an override";
  if (!r.enabled) return "policy disabled: bf16";
  if (r.mode !== "dynamic") return `mode ${r.mode}: no decisions by score`;
  if (b.sensitivity === null) return "no score yet";
  const hint =
    b.precision === "bf16"
      ? `to go low: score < ${f3(r.bands.leaveBf16)} (now ${f3(b.sensitivity)})`
      : `to go bf16: score ≥ ${f3(r.bands.bf16)} (now ${f3(b.sensitivity)})`;
  if (b.last_switch_step !== null && r.step !== null && r.step - b.last_switch_step < r.min_steps_between_switches)
    return `${hint}; not before step ${b.last_switch_step + r.min_steps_between_switches} (cooldown)`;
  return hint;
}
