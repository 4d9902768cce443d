/* Plain arithmetic of what is drawn: linear scales and the shares of a stacked bar. */

export function clamp(x: number, lo: number, hi: number): number {
  return x < lo ? lo : x > hi ? hi : x;
}

/** A linear map of [d0, d1] onto [r0, r1] (not clamped); a zero-width domain maps to r0. */
export function linear(d0: number, d1: number, r0: number, r1: number): (x: number) => number {
  const span = d1 - d0;
  if (span === 0) return () => r0;
  const k = (r1 - r0) / span;
  return (x) => r0 + (x - d0) * k;
}

export interface Share {
  key: string;
  count: number;
  /** count / total, in [0, 1] */
  fraction: number;
  /** the sum of the fractions before this one: where its segment starts */
  offset: number;
}

/**
 * The segments of a stacked bar, in the order of keys, leaving out keys with no count; every
 * fraction is 0 when the total is 0. Fractions of the segments present sum to 1.
 */
export function shares(counts: Readonly<Record<string, number>>, keys: readonly string[]): Share[] {
  const total = keys.reduce((sum, k) => sum + (counts[k] ?? 0), 0);
  const out: Share[] = [];
  let offset = 0;
  for (const key of keys) {
    const count = counts[key] ?? 0;
    if (count <= 0) continue;
    const fraction = total > 0 ? count / total : 0;
    out.push({ key, count, fraction, offset });
    offset += fraction;
  }
  return out;
}
