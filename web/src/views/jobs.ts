/* The jobs view: one row per job of GET v1/jobs (polled by the shell every 5 s), with the share
 * of blocks at each precision, the saving and the time since the last decision from the same
 * answer (its per-job summary): one small request per poll whatever the jobs' sizes, and no
 * read of any job's block map or telemetry. */
import { h, replace, source, table } from "../dom";
import { DASH, age, num, pct } from "../format";
import { PRECISIONS, isPrecision, precisionColour } from "../palette";
import { shares, wholePercents } from "../scale";
import type { Job } from "../types";
import type { View, ViewContext } from "../view";

/**
 * The last decision's cell: "12 s (step 340)", the time since it by the page's clock (a clock
 * ahead of the page's reads as 0 s); its step alone when prismd has no time for it (a job
 * restored from a store without one); a dash before any decision.
 */
export function lastDecisionText(step: number | null | undefined, unix: number | null | undefined, nowUnix: number): string {
  if (step === null || step === undefined) return DASH;
  return unix === null || unix === undefined ? `step ${num(step)}` : `${age(nowUnix - unix)} (step ${num(step)})`;
}

function precisionBar(counts: Record<string, number>): HTMLElement {
  const keys = [...PRECISIONS, ...Object.keys(counts).filter((k) => !isPrecision(k)).sort()];
  const segs = shares(counts, keys);
  const percents = wholePercents(segs.map((s) => s.fraction));
  const text = segs.map((s, i) => `${s.key} ${percents[i]} %`).join(", ");
  return h(
    "div",
    { class: "share" },
    h(
      "div",
      { class: "bar", role: "img", "aria-label": text || "no blocks" },
      segs.map((s) => h("span", { style: `width:${(s.fraction * 100).toFixed(3)}%;background:${precisionColour(s.key)}`, title: `${s.key}: ${s.count}` })),
    ),
    h("span", { class: "share-text" }, text || DASH),
  );
}

function warning(job: Job): HTMLElement | null {
  const parts: string[] = [];
  if (job.ranks_lagging) parts.push(`${job.ranks_lagging} ${job.ranks_lagging === 1 ? "rank lags" : "ranks lag"}`);
  if (job.ranks_not_acked) parts.push(`${job.ranks_not_acked} not acked`);
  if (parts.length === 0) return null;
  return h("a", { class: "warn", "data-warning": true, href: `#/jobs/${encodeURIComponent(job.job_id)}/ranks` }, `⚠ ${parts.join(" · ")}`);
}

export function jobsView(ctx: ViewContext): View {
  const { table: t, body } = table("jobs-table", "Jobs", [
    { label: "job" },
    { label: "step", num: true },
    { label: "map", num: true, title: "map version" },
    { label: "ranks", num: true, title: "ranks connected / world size" },
    { label: "blocks", num: true },
    { label: "precisions", title: "share of blocks at each precision" },
    { label: "saving", num: true, title: "estimated bandwidth saving" },
    { label: "last decision", num: true, title: "time since the last decision (its step)" },
    { label: "status" },
  ]);
  const empty = h("p", { class: "empty", hidden: true }, "No jobs yet: prismd lists a job once an agent says Hello.");
  replace(ctx.body, h("section", { class: "panel" }, h("div", { class: "panel-head" }, h("h1", null, "Jobs"), source("v1/jobs")), t, empty));

  const draw = (jobs: Job[]) => {
    const now = Date.now() / 1000;
    empty.hidden = jobs.length > 0;
    replace(
      body,
      jobs.map((job) => {
        const href = `#/jobs/${encodeURIComponent(job.job_id)}`;
        const short = job.agents_connected < job.world_size;
        return h(
          "tr",
          { "data-job": job.job_id },
          h("th", { scope: "row" }, h("a", { href }, job.job_id)),
          h("td", { class: "num" }, num(job.step)),
          h("td", { class: "num" }, num(job.map_version)),
          h("td", { class: short ? "num bad" : "num" }, `${job.agents_connected} / ${job.world_size}`),
          h("td", { class: "num" }, num(job.blocks)),
          h("td", null, precisionBar(job.precisions)),
          h("td", { class: "num" }, pct(job.bandwidth_saving_pct)),
          h("td", { class: "num" }, lastDecisionText(job.last_decision_step, job.last_decision_unix, now)),
          h("td", null, warning(job) ?? h("span", { class: "ok" }, "ok")),
        );
      }),
    );
  };

  return {
    async refresh() {
      const jobs = ctx.jobs();
      if (!jobs) return;
      draw(jobs);
      ctx.ready();
    },
    destroy() {},
  };
}
