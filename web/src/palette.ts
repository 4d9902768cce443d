/* Colours of the block map: hue = precision (Okabe & Ito's palette, which stays distinct under
 * the common colour-vision deficiencies), brightness = sensitivity. The map draws a few dozen
 * distinct colours at most: sensitivity is cut into BRIGHTNESS_LEVELS steps, so a redraw of
 * 10,000 cells changes fill style a few dozen times, not 10,000. */
import { clamp, linear } from "./scale";

/** Precisions from the most to the least precise (the legend's order). */
export const PRECISIONS = ["bf16", "fp8_e4m3", "fp8_e5m2", "int8", "int4"] as const;
export type Precision = (typeof PRECISIONS)[number];

/** Okabe-Ito: sky blue, bluish green, reddish purple, orange, yellow. */
export const PRECISION_COLOURS: Readonly<Record<Precision, string>> = {
  bf16: "#56b4e9",
  fp8_e4m3: "#009e73",
  fp8_e5m2: "#cc79a7",
  int8: "#e69f00",
  int4: "#f0e442",
};
/** A precision this page does not know (a newer prismd): Okabe-Ito's grey. */
export const UNKNOWN_COLOUR = "#999999";
/** The map's background, which dim cells fade towards. */
export const MAP_BACKGROUND = "#101317";

export const BRIGHTNESS_LEVELS = 8;
/** Brightness of the dimmest scored level and of a block without a score. */
export const MIN_BRIGHTNESS = 0.4;
export const UNSCORED_BRIGHTNESS = 0.25;

export function isPrecision(p: string): p is Precision {
  return (PRECISIONS as readonly string[]).includes(p);
}

export function precisionColour(p: string): string {
  return isPrecision(p) ? PRECISION_COLOURS[p] : UNKNOWN_COLOUR;
}

/** "#rrggbb" as [r, g, b]. */
export function parseHex(hex: string): [number, number, number] {
  const m = /^#([0-9a-f]{2})([0-9a-f]{2})([0-9a-f]{2})$/i.exec(hex);
  if (!m) throw new Error(`not a #rrggbb colour: ${hex}`);
  return [parseInt(m[1]!, 16), parseInt(m[2]!, 16), parseInt(m[3]!, 16)];
}

/** The level of a sensitivity: 0 .. BRIGHTNESS_LEVELS-1 over [0, 1], -1 for no score. */
export function sensitivityLevel(s: number | null | undefined): number {
  if (s === null || s === undefined || !Number.isFinite(s)) return -1;
  return clamp(Math.floor(s * BRIGHTNESS_LEVELS), 0, BRIGHTNESS_LEVELS - 1);
}

const brightnessOfLevel = linear(0, BRIGHTNESS_LEVELS - 1, MIN_BRIGHTNESS, 1);

/** The brightness of a level: MIN_BRIGHTNESS at level 0 up to 1 at the top level. */
export function levelBrightness(level: number): number {
  return level < 0 ? UNSCORED_BRIGHTNESS : brightnessOfLevel(level);
}

/** The colour of hex at a brightness in [0, 1]: mixed with the background, as "rgb(r, g, b)". */
export function dimmed(hex: string, brightness: number): string {
  const c = parseHex(hex);
  const bg = parseHex(MAP_BACKGROUND);
  const mix = (i: number) => Math.round(bg[i]! + (c[i]! - bg[i]!) * brightness);
  return `rgb(${mix(0)}, ${mix(1)}, ${mix(2)})`;
}

/** The CSS colour a cell is drawn with: hue from precision, brightness from sensitivity. */
export function cellColour(precision: string, sensitivity: number | null | undefined): string {
  return dimmed(precisionColour(precision), levelBrightness(sensitivityLevel(sensitivity)));
}
