/* One block: its figures now, its switch history, and its sensitivity and precision over the
 * run from the telemetry records' block_details, with the job's thresholds and hysteresis band
 * drawn (DESIGN 4.1, 4.2). */
import type uPlot from "uplot";
import { eachTelemetry, getJson } from "../api";
import { type Chart, hband, hline, makeChart } from "../chart";
import { h, replace, source, table } from "../dom";
import { DASH, num } from "../format";
import { PRECISIONS, precisionColour } from "../palette";
import { type BlockPoint, type ThresholdBands, historySince, mergePoints, precisionRank, thresholdBands, toBlockPoint } from "../series";
import { fractionPct } from "../numerics";
import { flipHint } from "../policy";
import type { BlockDetail, Config } from "../types";
import { jobPath } from "../url";
import type { View, ViewContext } from "../view";

export function blockView(ctx: ViewContext, job: string, id: number): View {
  const title = h("h1", null, `block ${id}`);
  const facts = h("dl", { class: "facts" });
  const sensBox = h("div", { class: "plot" });
  const precBox = h("div", { class: "plot" });
  const bandNote = h("p", { class: "note" });
  const { table: history, body: historyBody } = table("history-table", "Switch history", [
    { label: "step", num: true },
    { label: "from" },
    { label: "to" },
    { label: "reason" },
    { label: "map version", num: true },
  ]);
  replace(
    ctx.body,
    h(
      "div",
      { class: "block" },
      h("section", { class: "panel" }, h("div", { class: "panel-head" }, title, source(jobPath(job, "blocks", id))), facts, h("h2", null, "Switches (newest first)"), history),
      h(
        "div",
        { class: "block-charts" },
        h("section", { class: "panel chart", "data-chart": "block-sensitivity" }, h("h2", null, "Sensitivity over the run"), bandNote, sensBox),
        h("section", { class: "panel chart", "data-chart": "block-precision" }, h("h2", null, "Precision over the run"), precBox),
      ),
    ),
  );

  let points: BlockPoint[] = [];
  /** the first step read: a big job's recent decisions only (historySince) */
  let windowStart: number | null = null;
  let bands: ThresholdBands | null = null;
  let sensChart: Chart | null = null;
  let precChart: Chart | null = null;

  const under = (u: uPlot) => {
    if (!bands) return;
    hband(u, bands.leaveBf16, bands.bf16, "rgba(240, 228, 66, 0.09)");
    hline(u, bands.bf16, precisionColour("bf16"));
    hline(u, bands.low, precisionColour("int8"));
    hline(u, bands.leaveBf16, precisionColour("int8"), [4, 4]);
  };

  const drawCharts = () => {
    const x = points.map((p) => p.step);
    const sens = points.map((p) => p.sensitivity);
    const grad = points.map((p) => p.gradScore);
    const err = points.map((p) => p.errorScore);
    const prec = points.map((p) => precisionRank(p.precision));
    if (!sensChart)
      sensChart = makeChart(
        sensBox,
        {
          label: `Sensitivity of block ${id} over the run, with the thresholds`,
          yRange: [0, 1],
          series: [
            { label: "score", colour: "#f5f7fa", width: 2 },
            { label: "grad part", colour: "#56b4e9", dash: [3, 3] },
            { label: "error part", colour: "#cc79a7", dash: [3, 3] },
          ],
          under,
        },
        [x, sens, grad, err],
      );
    else sensChart.setData([x, sens, grad, err]);
    const order = [...PRECISIONS].reverse();
    if (!precChart)
      precChart = makeChart(
        precBox,
        {
          label: `Precision of block ${id} over the run`,
          height: 150,
          ySize: 76,
          yRange: [-0.5, PRECISIONS.length - 0.5],
          ySplits: order.map((_, i) => i),
          yValues: (v) => order[v] ?? "",
          series: [{ label: "precision", colour: "#e69f00", width: 2, stepped: true, value: (v) => (v === null ? DASH : order[v] ?? DASH) }],
        },
        [x, prec],
      );
    else precChart.setData([x, prec]);
  };

  const drawFacts = (b: BlockDetail, c: Config) => {
    title.textContent = `${b.name ?? `block ${b.id}`}`;
    const row = (k: string, v: string) => [h("dt", null, k), h("dd", { class: "num" }, v)];
    const f = (x: number | null) => (x === null ? DASH : num(x, 3));
    replace(
      facts,
      row("id", String(b.id)),
      row("precision", b.precision),
      row("score", f(b.sensitivity)),
      row("grad part", f(b.grad_score)),
      row("error part", f(b.error_score)),
      row("relative magnitude", f(b.relative_magnitude)),
      row("last switch", b.last_switch_step === null ? "never" : `step ${num(b.last_switch_step)} (${b.reason})`),
      row("forced", b.forced ? "yes (override)" : "no"),
      row("candidate format", b.candidate),
      b.hold_until !== null ? row("held (loss spike) until", `step ${num(b.hold_until)}`) : null,
      b.saturated_fraction !== undefined ? row("saturated", fractionPct(b.saturated_fraction)) : null,
      b.underflowed_fraction !== undefined ? row("underflowed", fractionPct(b.underflowed_fraction)) : null,
      row(
        "next switch",
        flipHint(b, {
          bands: thresholdBands(c),
          enabled: c.enabled,
          mode: c.mode,
          min_steps_between_switches: c.min_steps_between_switches,
          step: ctx.current().step ?? null,
        }),
      ),
      row("bf16 threshold", num(c.bf16_threshold, 2)),
      row("low threshold", num(c.int8_threshold, 2)),
      row("hysteresis margin", num(c.hysteresis_margin, 2)),
    );
    replace(
      historyBody,
      b.history.length
        ? b.history.map((s) =>
            h("tr", null, h("td", { class: "num" }, num(s.step)), h("td", null, s.from), h("td", null, s.to), h("td", null, s.reason), h("td", { class: "num" }, num(s.map_version))),
          )
        : h("tr", null, h("td", { colspan: 5, class: "muted" }, "no switch yet")),
    );
    const t = thresholdBands(c);
    bands = t;
    bandNote.textContent =
      `Solid lines: bf16 threshold ${num(t.bf16, 2)} (at or above: BF16) and low threshold ${num(t.low, 2)} (below: a fresh block goes low). ` +
      `Dashed: ${num(t.leaveBf16, 2)}, below which a BF16 block leaves BF16. Shaded: the hysteresis band, where a block keeps its precision.` +
      (windowStart ? ` From step ${num(windowStart)}: every telemetry record holds every block, so a job this size shows its recent decisions.` : "");
  };

  return {
    async refresh(reason) {
      /* At open, map and decision events (each decision scores the block anew): its figures,
       * the config (thresholds change at a decision) and the records after the last one drawn. */
      if (reason === "poll") return;
      const [b, c] = await Promise.all([getJson<BlockDetail>(jobPath(job, "blocks", id)), getJson<Config>(jobPath(job, "config"))]);
      const now = ctx.current();
      if (windowStart === null) windowStart = historySince(now.step, now.blocks, c.update_interval_steps);
      drawFacts(b, c);
      const since = points.length ? points[points.length - 1]!.step + 1 : windowStart;
      const more: BlockPoint[] = [];
      await eachTelemetry(job, since, (r) => more.push(toBlockPoint(r, id)));
      points = mergePoints(points, more);
      drawCharts();
      ctx.ready();
    },
    destroy() {
      sensChart?.destroy();
      precChart?.destroy();
    },
  };
}
