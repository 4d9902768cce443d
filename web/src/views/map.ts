/* A job's block map: one cell per block on a canvas, hue = precision, brightness = sensitivity.
 * Drawing is one pass over the blocks, batched by colour; hover, click and keys find a block by
 * arithmetic on the grid (grid.ts). The canvas is an image to assistive technology, with a
 * text summary beside it. */
import { getJson } from "../api";
import { h, replace, source, table } from "../dom";
import { DASH, num, pct } from "../format";
import { type GridLayout, cellAt, cellCentre, cellOrigin, gridLayout } from "../grid";
import {
  BRIGHTNESS_LEVELS,
  MAP_BACKGROUND,
  PRECISIONS,
  cellColour,
  dimmed,
  isPrecision,
  levelBrightness,
  precisionColour,
} from "../palette";
import { NUMERICS_ROWS_MAX, fractionPct, numericsRows, showsFractions } from "../numerics";
import { type FlipRules, flipHint } from "../policy";
import { thresholdBands } from "../series";
import type { Block, BlockMap, Config } from "../types";
import { jobPath } from "../url";
import type { View, ViewContext } from "../view";

/** What the page exposes for the browser tests (plan 13's DOM contract). */
export interface MapProbe {
  cellCenter(i: number): { x: number; y: number } | null;
  cellColor(i: number): string | null;
}

let probe: MapProbe | null = null;
export function mapProbe(): MapProbe | null {
  return probe;
}

function blockName(b: Block): string {
  return b.name ?? `block ${b.id}`;
}

function fixed(x: number | null, digits = 3): string {
  return x === null ? DASH : num(x, digits);
}

/** The tooltip's lines: the block's name first. */
function tooltipContent(b: Block, rules: FlipRules | null): HTMLElement[] {
  const row = (k: string, v: string) => h("div", { class: "kv" }, h("span", null, k), h("span", { class: "num" }, v));
  return [
    h("div", { class: "tt-name" }, blockName(b)),
    row("id", String(b.id)),
    row("precision", b.precision),
    row("score", fixed(b.sensitivity)),
    row("grad part", fixed(b.grad_score)),
    row("error part", fixed(b.error_score)),
    row("relative magnitude", fixed(b.relative_magnitude)),
    row("last switch", b.last_switch_step === null ? "never" : `step ${num(b.last_switch_step)} (${b.reason})`),
    row("forced", b.forced ? "yes (override)" : "no"),
    row("candidate format", b.candidate),
    b.hold_until !== null ? row("held (loss spike) until", `step ${num(b.hold_until)}`) : null,
    b.saturated_fraction !== undefined ? row("saturated", fractionPct(b.saturated_fraction)) : null,
    b.underflowed_fraction !== undefined ? row("underflowed", fractionPct(b.underflowed_fraction)) : null,
    rules ? h("div", { class: "tt-flip" }, flipHint(b, rules)) : null,
  ].filter((e): e is HTMLDivElement => e !== null);
}

export function mapView(ctx: ViewContext, job: string): View {
  const canvas = h("canvas", { id: "block-map", tabindex: 0, role: "img", "aria-describedby": "map-summary", "data-blocks": 0, "data-map-version": 0 });
  const hover = h("div", { class: "cell-hover", hidden: true });
  const tooltip = h("div", { id: "block-tooltip", role: "tooltip", hidden: true });
  const legend = h("div", { id: "legend", "aria-label": "legend" });
  const summary = h("p", { id: "map-summary", class: "summary" });
  const stats = h("div", { class: "stats" });
  const find = h("input", { id: "block-find", type: "search", placeholder: "name contains…", autocomplete: "off", spellcheck: "false" });
  const found = h("span", { class: "muted", "aria-live": "polite" });
  const finder = h("div", { class: "find" }, h("label", { for: "block-find" }, "Outline blocks whose name contains"), find, found);
  const wrap = h("div", { class: "map-wrap" }, canvas, hover);
  const numerics = h("section", { id: "numerics", class: "panel", "aria-label": "low formats and numerics" });
  replace(ctx.body, h("section", { class: "panel" }, h("div", { class: "panel-head" }, stats, source(jobPath(job, "blocks"))), legend, summary, finder, wrap), numerics, tooltip);

  let blocks: Block[] = [];
  let colours: string[] = [];
  let layout: GridLayout = gridLayout(0, 1, 1);
  let mapVersion = 0;
  let rules: FlipRules | null = null;
  let query = "";
  let focus = -1;

  /** Redraws every cell: blocks grouped by colour, one fill per colour. */
  const draw = () => {
    const top = wrap.getBoundingClientRect().top + window.scrollY;
    const maxHeight = Math.max(240, window.innerHeight - top - 24);
    drawnWidth = wrap.clientWidth;
    layout = gridLayout(blocks.length, Math.max(120, drawnWidth), maxHeight);
    const dpr = window.devicePixelRatio || 1;
    canvas.style.width = `${layout.width}px`;
    canvas.style.height = `${layout.height}px`;
    canvas.width = Math.max(1, Math.round(layout.width * dpr));
    canvas.height = Math.max(1, Math.round(layout.height * dpr));
    const g = canvas.getContext("2d");
    colours = blocks.map((b) => cellColour(b.precision, b.sensitivity));
    if (g) {
      g.setTransform(dpr, 0, 0, dpr, 0, 0);
      g.fillStyle = MAP_BACKGROUND;
      g.fillRect(0, 0, layout.width, layout.height);
      const byColour = new Map<string, number[]>();
      colours.forEach((c, i) => {
        const list = byColour.get(c);
        if (list) list.push(i);
        else byColour.set(c, [i]);
      });
      for (const [c, list] of byColour) {
        g.fillStyle = c;
        g.beginPath();
        for (const i of list) {
          const o = cellOrigin(layout, i);
          g.rect(o.x, o.y, layout.cell, layout.cell);
        }
        g.fill();
      }
      /* Forced blocks: a light corner, where cells are big enough to show one. */
      if (layout.cell >= 7) {
        g.fillStyle = "#f5f7fa";
        g.beginPath();
        blocks.forEach((b, i) => {
          if (!b.forced) return;
          const o = cellOrigin(layout, i);
          const k = Math.floor(layout.cell / 2.5);
          g.moveTo(o.x, o.y);
          g.lineTo(o.x + k, o.y);
          g.lineTo(o.x, o.y + k);
          g.closePath();
        });
        g.fill();
      }
      /* Blocks whose name holds the text of the find box: an outline inside the cell, which
       * leaves its centre (and so the colour cellColor reports) as it is. */
      let matches = 0;
      if (query) {
        g.strokeStyle = "#ffffff";
        g.lineWidth = 1;
        g.beginPath();
        blocks.forEach((b, i) => {
          if (!(b.name ?? `block ${b.id}`).toLowerCase().includes(query)) return;
          matches++;
          if (layout.cell < 5) return;
          const o = cellOrigin(layout, i);
          g.rect(o.x + 0.5, o.y + 0.5, layout.cell - 1, layout.cell - 1);
        });
        g.stroke();
      }
      found.textContent = query
        ? `${num(matches)} of ${num(blocks.length)} blocks match${matches && layout.cell < 5 ? " (cells too small to outline: widen the window)" : ""}`
        : "";
    }
    canvas.dataset["blocks"] = String(blocks.length);
    canvas.dataset["mapVersion"] = String(mapVersion);
    canvas.setAttribute(
      "aria-label",
      `Block map of job ${job}: ${blocks.length} blocks, one cell per block in id order, colour = precision, brightness = sensitivity`,
    );
    if (focus >= blocks.length) focus = -1;
    if (!hover.hidden && focus >= 0) showAt(focus);
  };

  const showAt = (i: number, clientX?: number, clientY?: number) => {
    const b = blocks[i];
    if (!b) return hide();
    const o = cellOrigin(layout, i);
    hover.hidden = false;
    hover.style.left = `${o.x - 1}px`;
    hover.style.top = `${o.y - 1}px`;
    hover.style.width = hover.style.height = `${layout.cell + 2}px`;
    replace(tooltip, tooltipContent(b, rules));
    tooltip.hidden = false;
    const r = canvas.getBoundingClientRect();
    const x = clientX ?? r.left + o.x + layout.cell;
    const y = clientY ?? r.top + o.y + layout.cell;
    const tw = tooltip.offsetWidth;
    const th = tooltip.offsetHeight;
    tooltip.style.left = `${Math.min(x + 14, window.innerWidth - tw - 8)}px`;
    tooltip.style.top = `${y + 14 + th > window.innerHeight ? y - th - 10 : y + 14}px`;
  };
  const hide = () => {
    hover.hidden = true;
    tooltip.hidden = true;
  };
  const at = (ev: MouseEvent) => {
    const r = canvas.getBoundingClientRect();
    return cellAt(layout, ev.clientX - r.left, ev.clientY - r.top);
  };
  const open = (i: number) => {
    const b = blocks[i];
    if (b) location.hash = `#/jobs/${encodeURIComponent(job)}/blocks/${b.id}`;
  };
  canvas.addEventListener("mousemove", (ev) => {
    const i = at(ev);
    if (i < 0) return hide();
    focus = i;
    showAt(i, ev.clientX, ev.clientY);
  });
  canvas.addEventListener("mouseleave", hide);
  find.addEventListener("input", () => {
    query = find.value.trim().toLowerCase();
    draw();
  });
  canvas.addEventListener("click", (ev) => open(at(ev)));
  canvas.addEventListener("blur", hide);
  canvas.addEventListener("keydown", (ev) => {
    const n = blocks.length;
    if (n === 0) return;
    const step: Record<string, number> = { ArrowRight: 1, ArrowLeft: -1, ArrowDown: layout.cols, ArrowUp: -layout.cols, Home: -n, End: n };
    if (ev.key === "Enter" && focus >= 0) return open(focus);
    if (ev.key === "Escape") return hide();
    const d = step[ev.key];
    if (d === undefined) return;
    ev.preventDefault();
    focus = Math.min(n - 1, Math.max(0, (focus < 0 ? 0 : focus) + d));
    showAt(focus);
  });
  /* A redraw when the width changes (the window, the layout), not when the map's own height does. */
  let drawnWidth = -1;
  const resize = new ResizeObserver(() => {
    if (wrap.clientWidth !== drawnWidth && blocks.length) draw();
  });
  resize.observe(wrap);

  const drawText = (m: BlockMap) => {
    const counts: Record<string, number> = {};
    let forced = 0;
    let unscored = 0;
    let sum = 0;
    for (const b of m.blocks) {
      counts[b.precision] = (counts[b.precision] ?? 0) + 1;
      if (b.forced) forced++;
      if (b.sensitivity === null) unscored++;
      else sum += b.sensitivity;
    }
    const present = [...PRECISIONS.filter((p) => counts[p]), ...Object.keys(counts).filter((p) => !isPrecision(p))];
    const n = m.blocks.length;
    const t = m.telemetry;
    const stat = (k: string, v: string) => h("div", { class: "stat" }, h("span", { class: "k" }, k), h("span", { class: "v num" }, v));
    replace(
      stats,
      stat("applies from", num(m.effective_step)),
      stat("saving", pct(t?.estimated_bandwidth_saving_pct)),
      stat("last decision", t ? `step ${num(t.step_id)}` : DASH),
      stat("changes then", t ? num(t.precision_changes) : DASH),
    );
    const swatch = (colour: string) => h("span", { class: "swatch", style: `background:${colour}` });
    const ramp = Array.from({ length: BRIGHTNESS_LEVELS }, (_, l) => swatch(dimmed(precisionColour(present[0] ?? "bf16"), levelBrightness(l))));
    replace(
      legend,
      PRECISIONS.map((p) => h("span", { class: counts[p] ? "item" : "item none" }, swatch(precisionColour(p)), `${p} `, h("span", { class: "num" }, num(counts[p] ?? 0)))),
      present.filter((p) => !isPrecision(p)).map((p) => h("span", { class: "item" }, swatch(precisionColour(p)), `${p} ${counts[p]}`)),
      h("span", { class: "item ramp" }, "sensitivity 0", ramp, "1"),
      h("span", { class: "item" }, swatch(cellColour(present[0] ?? "bf16", null)), "no score yet"),
      h("span", { class: "item" }, h("span", { class: "swatch forced" }), "forced (override)"),
    );
    const parts = present.map((p) => `${num(counts[p] ?? 0)} ${p} (${pct(((counts[p] ?? 0) / n) * 100)})`);
    summary.textContent =
      n === 0
        ? "No blocks yet: the job's layout arrives with its agents' Hello."
        : `${num(n)} blocks: ${parts.join(", ")}; ${num(forced)} forced; ${num(unscored)} without a score` +
          (n > unscored ? `; mean sensitivity ${num(sum / (n - unscored), 3)}` : "") +
          ". Hover a cell for its figures, click it (or Enter) for its history.";
  };

  /* The blocks the numerics rules concern (numerics.ts): format (its colour), reason, candidate,
   * hold and, when the blocks carry the fractions (showsFractions), SAT and UNDER. Hidden when no block is listed. */
  const drawNumerics = (m: BlockMap) => {
    const { rows, total } = numericsRows(m.blocks);
    numerics.hidden = total === 0;
    if (total === 0) return replace(numerics);
    const figures = showsFractions(m.blocks);
    const headers = [
      { label: "block" },
      { label: "format" },
      { label: "reason", title: "why its precision last changed" },
      { label: "candidate", title: "the low format it would get now" },
      { label: "held until", num: true, title: "a loss spike's hold: no score move to low before this step" },
      ...(figures
        ? [
            { label: "sat", num: true, title: "saturated fraction: mean over its window" },
            { label: "under", num: true, title: "underflowed fraction: mean over its window" },
          ]
        : []),
    ];
    const t = table("numerics-table", "Blocks in a low format or moved by the numerics rules", headers);
    const swatch = (p: string) => h("span", { class: "swatch", style: `background:${precisionColour(p)}` });
    for (const b of rows) {
      t.body.append(
        h(
          "tr",
          { "data-block": b.id, "data-precision": b.precision },
          h("th", { scope: "row" }, h("a", { href: `#/jobs/${encodeURIComponent(job)}/blocks/${b.id}` }, blockName(b))),
          h("td", { class: "format" }, swatch(b.precision), ` ${b.precision}`),
          h("td", null, b.reason),
          h("td", null, swatch(b.candidate), ` ${b.candidate}`),
          h("td", { class: "num" }, b.hold_until === null ? DASH : num(b.hold_until)),
          figures ? h("td", { class: "num" }, fractionPct(b.saturated_fraction)) : null,
          figures ? h("td", { class: "num" }, fractionPct(b.underflowed_fraction)) : null,
        ),
      );
    }
    replace(
      numerics,
      h("h2", null, "Low formats and numerics"),
      t.table,
      total > rows.length ? h("p", { class: "muted" }, `${num(total - rows.length)} more not shown (the ${NUMERICS_ROWS_MAX} most saturated, then by id)`) : null,
    );
  };

  probe = {
    cellCenter(i) {
      if (i < 0 || i >= blocks.length) return null;
      const r = canvas.getBoundingClientRect();
      const c = cellCentre(layout, i);
      return { x: r.left + window.scrollX + c.x, y: r.top + window.scrollY + c.y };
    },
    cellColor(i) {
      return colours[i] ?? null;
    },
  };

  return {
    async refresh(reason) {
      /* The map changes only with a map event: a decision that changed nothing is not worth a
       * 10,000-block map (its scores show at the next map event; the job bar shows the decision). */
      if (reason === "poll" || reason === "decision") return;
      const [m, c] = await Promise.all([getJson<BlockMap>(jobPath(job, "blocks")), getJson<Config>(jobPath(job, "config"))]);
      rules = {
        bands: thresholdBands(c),
        enabled: c.enabled,
        mode: c.mode,
        min_steps_between_switches: c.min_steps_between_switches,
        step: m.step,
      };
      blocks = m.blocks;
      mapVersion = m.map_version;
      ctx.facts({
        job_id: m.job_id,
        step: m.step,
        map_version: m.map_version,
        decided_step: m.decided_step,
        effective_step: m.effective_step,
        agents_connected: m.agents_connected,
        world_size: m.world_size,
        blocks: m.blocks.length,
      });
      drawText(m);
      drawNumerics(m);
      draw();
      ctx.ready();
    },
    destroy() {
      resize.disconnect();
      probe = null;
      tooltip.remove();
    },
  };
}
