/* Charts over steps from the job's telemetry: bandwidth saving, blocks per precision, switches
 * per decision, sensitivity, loss when reported. Live: every decision adds a record, so the
 * charts refresh on map events and on decision events (a decision that changed no precision).
 * Records are read once: a refresh asks only for the steps after the last one it has. */
import type uPlot from "uplot";
import { eachTelemetry, getJson } from "../api";
import { type Chart, makeChart } from "../chart";
import { h, replace, source } from "../dom";
import { num } from "../format";
import { precisionColour } from "../palette";
import { type TelemetryPoint, chartSeries, historySince, mergePoints, toPoint } from "../series";
import type { Config } from "../types";
import { jobPath } from "../url";
import type { View, ViewContext } from "../view";

/** Points kept per job while the page is open (and the step the first read started from), so
 * that a refresh reads only new records. */
const cache = new Map<string, { points: TelemetryPoint[]; since: number }>();

/**
 * The points of job, extended with the records after the last one read; the first read starts
 * at first() (historySince: a big job's recent decisions only).
 */
async function jobPoints(job: string, first: () => Promise<number>): Promise<{ points: TelemetryPoint[]; since: number }> {
  const have = cache.get(job);
  const since = have ? have.points.length ? have.points[have.points.length - 1]!.step + 1 : have.since : await first();
  const more: TelemetryPoint[] = [];
  await eachTelemetry(job, since, (r) => more.push(toPoint(r)));
  const entry = { points: mergePoints(have?.points ?? [], more), since: have?.since ?? since };
  cache.set(job, entry);
  return entry;
}

interface Panel {
  key: string;
  title: string;
  note: HTMLElement;
  box: HTMLElement;
  chart: Chart | null;
}

export function chartsView(ctx: ViewContext, job: string): View {
  const panels: Panel[] = [
    ["saving", "Estimated bandwidth saving (%)"],
    ["precisions", "Blocks per precision"],
    ["switches", "Switches per decision (precision changes)"],
    ["sensitivity", "Sensitivity: mean, min and max over scored blocks"],
    ["loss", "Loss (when the trainer reports it)"],
  ].map(([key, title]) => ({ key: key!, title: title!, note: h("p", { class: "note" }), box: h("div", { class: "plot" }), chart: null }));
  replace(
    ctx.body,
    h(
      "div",
      { class: "charts" },
      panels.map((p) => h("section", { class: "panel chart", "data-chart": p.key, "aria-label": p.title }, h("div", { class: "panel-head" }, h("h2", null, p.title), source(jobPath(job, "telemetry"))), p.note, p.box)),
    ),
  );
  let precisionsKey = "";

  const draw = (points: TelemetryPoint[], since: number) => {
    const s = chartSeries(points);
    const x = s.steps;
    const put = (p: Panel, spec: Parameters<typeof makeChart>[1], data: uPlot.AlignedData, rebuild = false) => {
      if (p.chart && !rebuild) return p.chart.setData(data);
      p.chart?.destroy();
      p.chart = makeChart(p.box, spec, data);
    };
    const [saving, precisions, switches, sensitivity, loss] = panels as [Panel, Panel, Panel, Panel, Panel];
    saving.note.textContent = points.length
      ? `${num(points.length)} decisions, steps ${num(x[0])} to ${num(x[x.length - 1])}` +
        (since > 0 ? ` (from step ${num(since)}: every record holds every block, so a job this size shows its recent decisions)` : "")
      : "no decision yet";
    put(saving, { label: saving.title, series: [{ label: "saving %", colour: "#56b4e9", fill: "rgba(86,180,233,0.12)", value: (v) => (v === null ? "—" : `${v.toFixed(1)} %`) }] }, [x, s.saving]);
    const key = s.precisions.join(",");
    precisions.note.textContent = s.precisions.length ? s.precisions.join(", ") : "";
    put(
      precisions,
      { label: precisions.title, series: s.precisions.map((p) => ({ label: p, colour: precisionColour(p), width: 2 })) },
      [x, ...s.perPrecision],
      key !== precisionsKey,
    );
    precisionsKey = key;
    put(switches, { label: switches.title, series: [{ label: "changes", colour: "#e69f00", stepped: true }] }, [x, s.changes]);
    put(
      sensitivity,
      {
        label: sensitivity.title,
        yRange: [0, 1],
        series: [
          { label: "max", colour: "#cc79a7", dash: [4, 3] },
          { label: "mean", colour: "#f0e442", width: 2 },
          { label: "min", colour: "#009e73", dash: [4, 3] },
        ],
      },
      [x, s.max, s.mean, s.min],
    );
    loss.note.textContent = s.hasLoss
      ? ""
      : points.length
        ? "No loss in these records: a record carries one when the trainer reported a loss for the decision's step."
        : "";
    loss.box.hidden = !s.hasLoss;
    put(loss, { label: loss.title, series: [{ label: "loss", colour: "#d55e00" }] }, [x, s.loss]);
  };

  return {
    async refresh(reason) {
      if (reason === "poll") return; /* open, map and decision events: the records since the last one */
      const first = async () => {
        const c = await getJson<Config>(jobPath(job, "config"));
        const now = ctx.current();
        return historySince(now.step, now.blocks, c.update_interval_steps);
      };
      const { points, since } = await jobPoints(job, first);
      draw(points, since);
      ctx.ready();
    },
    destroy() {
      for (const p of panels) p.chart?.destroy();
    },
  };
}

