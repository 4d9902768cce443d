/* The shell: hash routing, the header and job bar, the 5 s poll of v1/jobs, the one event
 * stream of the job on screen, and window.prismDashboard for the browser tests. */
import { ApiError, getJson } from "./api";
import { h, replace } from "./dom";
import { num } from "./format";
import { type LiveState, LiveJob, coalescing } from "./live";
import { type Route, parseRoute, routeHash } from "./route";
import type { Job, JobList } from "./types";
import type { View, ViewContext } from "./view";
import { blockView } from "./views/block";
import { chartsView } from "./views/charts";
import { configView } from "./views/config";
import { jobsView } from "./views/jobs";
import { mapProbe, mapView } from "./views/map";
import { ranksView } from "./views/ranks";

/** The slowest data on screen may be this old: the poll of v1/jobs (plan 13: never faster). */
export const POLL_MS = 5000;

type Reason = "open" | "map" | "poll";

const main = document.getElementById("view") as HTMLElement;
const crumbs = document.getElementById("crumbs") as HTMLElement;
const tabs = document.getElementById("tabs") as HTMLElement;
const live = document.getElementById("live") as HTMLElement;

let jobs: Job[] | null = null;
let route: Route = { view: "jobs" };
let view: View | null = null;
let generation = 0;
let jobHead: HTMLElement | null = null;
let alertBox: HTMLElement | null = null;
let runner: { run: () => Promise<void> } | null = null;
let want: Reason | null = null;

function showError(e: unknown): void {
  if (!alertBox) return;
  if (e === null) {
    alertBox.hidden = true;
    return;
  }
  alertBox.hidden = false;
  alertBox.textContent = e instanceof ApiError ? `${e.message}${e.status ? ` (HTTP ${e.status})` : ""}` : `Error: ${String(e)}`;
}

function drawJobHead(): void {
  const r = route;
  if (!jobHead || r.view === "jobs") return;
  const j = jobs?.find((x) => x.job_id === r.job);
  const stat = (k: string, v: string, bad = false) => h("div", { class: bad ? "stat bad" : "stat" }, h("span", { class: "k" }, k), h("span", { class: "v num" }, v));
  const warn: string[] = [];
  if (j?.ranks_lagging) warn.push(`${j.ranks_lagging} lagging`);
  if (j?.ranks_not_acked) warn.push(`${j.ranks_not_acked} not acked`);
  replace(
    jobHead,
    h("h1", null, r.job),
    j
      ? [
          stat("step", num(j.step)),
          stat("map version", num(j.map_version)),
          stat("ranks", `${j.agents_connected} / ${j.world_size}`, j.agents_connected < j.world_size),
          stat("blocks", num(j.blocks)),
          warn.length ? h("a", { class: "warn", href: routeHash({ view: "ranks", job: r.job }) }, `⚠ ${warn.join(" · ")}`) : null,
        ]
      : jobs
        ? h("span", { class: "warn" }, "not in v1/jobs (deleted?)")
        : null,
  );
}

function drawNav(): void {
  const r = route;
  if (r.view === "jobs") {
    replace(crumbs);
    replace(tabs);
    document.title = "Jobs · Prism";
    return;
  }
  const job = r.job;
  const here = r.view;
  replace(
    crumbs,
    h("a", { href: "#/" }, "jobs"),
    h("span", { class: "sep", "aria-hidden": "true" }, "/"),
    h("a", { href: routeHash({ view: "map", job }), "aria-current": here === "block" ? null : "page" }, job),
    r.view === "block" ? [h("span", { class: "sep", "aria-hidden": "true" }, "/"), h("span", { "aria-current": "page" }, `block ${r.block}`)] : null,
  );
  const tab = (v: "map" | "charts" | "ranks" | "config", label: string) =>
    h("a", { href: routeHash({ view: v, job }), class: here === v ? "tab on" : "tab", "aria-current": here === v ? "page" : null }, label);
  replace(tabs, tab("map", "block map"), tab("charts", "charts"), tab("ranks", "ranks"), tab("config", "config"));
  document.title = `${job} · ${r.view === "block" ? `block ${r.block}` : r.view} · Prism`;
}

function setLive(s: LiveState): void {
  const text: Record<LiveState, string> = { off: "", connecting: "● connecting", live: "● live", deleted: "● job deleted" };
  live.textContent = text[s];
  live.className = s;
  if (s === "deleted") showError(new ApiError(404, "not_found", `job ${route.view === "jobs" ? "" : route.job} was deleted`));
}

/** Asks the view for fresh data; a map event or an open outranks a poll waiting behind it. */
function refresh(reason: Reason): void {
  want = want === null || reason !== "poll" ? reason : want;
  void runner?.run();
}

function makeView(ctx: ViewContext, r: Route): View {
  switch (r.view) {
    case "jobs":
      return jobsView(ctx);
    case "map":
      return mapView(ctx, r.job);
    case "charts":
      return chartsView(ctx, r.job);
    case "ranks":
      return ranksView(ctx, r.job);
    case "config":
      return configView(ctx, r.job);
    case "block":
      return blockView(ctx, r.job, r.block);
  }
}

const liveJob = new LiveJob(() => refresh("map"), setLive);

function open(): void {
  view?.destroy();
  route = parseRoute(location.hash);
  const gen = ++generation;
  main.dataset["view"] = route.view;
  main.dataset["ready"] = "false";
  jobHead = route.view === "jobs" ? null : h("div", { class: "job-head" });
  alertBox = h("div", { class: "alert", role: "alert", hidden: true });
  const body = h("div", { class: "body" });
  replace(main, jobHead, alertBox, body);
  const ctx: ViewContext = {
    body,
    ready: () => {
      if (gen === generation) main.dataset["ready"] = "true";
    },
    error: (e) => {
      if (gen === generation) showError(e);
    },
    job: (id) => jobs?.find((j) => j.job_id === id),
    jobs: () => jobs,
  };
  view = makeView(ctx, route);
  const v = view;
  runner = coalescing(async () => {
    const reason = want ?? "poll";
    want = null;
    try {
      await v.refresh(reason);
      if (gen === generation && reason !== "poll") showError(null);
    } catch (e) {
      if (gen === generation) showError(e);
    }
  });
  drawNav();
  drawJobHead();
  liveJob.watch(route.view === "jobs" ? null : route.job);
  window.scrollTo(0, 0);
  refresh("open");
}

/** GET v1/jobs now and every POLL_MS after the answer (a slow prismd is never asked twice at once). */
async function poll(): Promise<void> {
  try {
    jobs = (await getJson<JobList>("v1/jobs")).jobs;
    drawJobHead();
    if (route.view === "jobs" || route.view === "ranks") refresh("poll");
  } catch (e) {
    showError(e);
  }
  setTimeout(() => void poll(), POLL_MS);
}

declare global {
  interface Window {
    prismDashboard: {
      cellCenter(blockIndex: number): { x: number; y: number } | null;
      cellColor(blockIndex: number): string | null;
    };
  }
}
window.prismDashboard = {
  cellCenter: (i) => mapProbe()?.cellCenter(i) ?? null,
  cellColor: (i) => mapProbe()?.cellColor(i) ?? null,
};

window.addEventListener("hashchange", open);
open();
void poll();
