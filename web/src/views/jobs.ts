/* The jobs view: one row per job of GET v1/jobs (polled by the shell every 5 s), with the share
 * of blocks at each precision, the saving and the time since the last decision, read from the
 * job's block map and last telemetry record when its map changed, or DETAIL_MAX_AGE_MS after
 * they were read (a decision that changed nothing moves the last decision on, not the map): a
 * 10,000-block job's map is megabytes, not something to read every 5 s. */
import { getJson } from "../api";
import { h, replace, source, table } from "../dom";
import { DASH, age, num, pct } from "../format";
import { PRECISIONS, isPrecision, precisionColour } from "../palette";
import { shares } from "../scale";
import type { BlockMap, Job, TelemetryPage } from "../types";
import { jobPath } from "../url";
import type { View, ViewContext } from "../view";

/** The longest the precisions, saving and last decision of a row go unread. */
export const DETAIL_MAX_AGE_MS = 30000;

interface JobDetail {
  /** the job's map_version when these were read */
  mapVersion: number;
  /** when (Date.now()) they were read */
  readAt: number;
  counts: Record<string, number>;
  saving: number | null;
  decisionStep: number | null;
  decisionTime: number | null;
}

/** Kept across visits of the view, so that coming back draws at once. */
const details = new Map<string, JobDetail>();
const pending = new Set<string>();

async function fetchDetail(job: Job): Promise<void> {
  const map = await getJson<BlockMap>(jobPath(job.job_id, "blocks"));
  const counts: Record<string, number> = {};
  for (const b of map.blocks) counts[b.precision] = (counts[b.precision] ?? 0) + 1;
  const t = map.telemetry;
  const before = details.get(job.job_id);
  let decisionTime = before && t && before.decisionStep === t.step_id ? before.decisionTime : null;
  if (t && decisionTime === null) {
    const page = await getJson<TelemetryPage>(jobPath(job.job_id, "telemetry"), { since_step: t.step_id, limit: 1 });
    const r = page.records[0];
    decisionTime = r && r.step_id === t.step_id ? r.timestamp : null;
  }
  details.set(job.job_id, {
    mapVersion: job.map_version,
    readAt: Date.now(),
    counts,
    saving: t ? t.estimated_bandwidth_saving_pct : null,
    decisionStep: t ? t.step_id : null,
    decisionTime,
  });
}

function precisionBar(counts: Record<string, number>): HTMLElement {
  const keys = [...PRECISIONS, ...Object.keys(counts).filter((k) => !isPrecision(k)).sort()];
  const segs = shares(counts, keys);
  const text = segs.map((s) => `${s.key} ${num(s.fraction * 100, 0)} %`).join(", ");
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
        const d = details.get(job.job_id);
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
          h("td", null, d ? precisionBar(d.counts) : DASH),
          h("td", { class: "num" }, d ? pct(d.saving) : DASH),
          h(
            "td",
            { class: "num" },
            d && d.decisionStep !== null ? `${d.decisionTime !== null ? age(now - d.decisionTime) : DASH} (step ${num(d.decisionStep)})` : DASH,
          ),
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
      const now = Date.now();
      const stale = jobs.filter((j) => {
        const d = details.get(j.job_id);
        return !pending.has(j.job_id) && (!d || d.mapVersion !== j.map_version || now - d.readAt >= DETAIL_MAX_AGE_MS);
      });
      await Promise.all(
        stale.map(async (j) => {
          pending.add(j.job_id);
          try {
            await fetchDetail(j);
          } catch (e) {
            ctx.error(e);
          } finally {
            pending.delete(j.job_id);
          }
        }),
      );
      if (stale.length) draw(ctx.jobs() ?? jobs);
      /* Ready once every row has had its first try at the precisions, saving and decision. */
      ctx.ready();
    },
    destroy() {},
  };
}
