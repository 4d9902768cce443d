/* The shell: hash routing, the header and job bar, the one event stream of the job on screen,
 * the 5 s poll of the jobs and ranks views (the only polls: every other view refetches on the
 * stream's map and decision events), and window.prismDashboard for the browser tests. */
import { ApiError, getJson } from "./api";
import { h, replace } from "./dom";
import { DASH, num } from "./format";
import { type LiveState, LiveJob, coalescing } from "./live";
import { type Route, parseRoute, routeHash } from "./route";
import type { Job, JobList } from "./types";
import type { View, ViewContext } from "./view";
import { blockView } from "./views/block";
import { chartsView } from "./views/charts";
import { configView } from "./views/config";
import { jobsView } from "./views/jobs";
import { mapProbe, mapView } from "./views/map";
import { planView } from "./views/plan";
import { ranksView } from "./views/ranks";

/** The slowest data on screen may be this old: the poll of v1/jobs (plan 13: never faster). */
export const POLL_MS = 5000;

type Reason = "open" | "map" | "decision" | "poll";

/** Which of two reasons a refetch waiting for its turn keeps: a view may do less for the lesser
 * (the block map is read again on map events, not on decisions that changed nothing). */
const RANK: Record<Reason, number> = { poll: 0, decision: 1, map: 2, open: 3 };

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
/** Asks the view on screen for fresh data (set by open() for each view). */
let request: (reason: Reason) => void = () => {};
/** What the job bar shows: v1/jobs' entry at open, then map events and the views' answers. */
let facts: Partial<Job> = {};
let pollTimer: ReturnType<typeof setTimeout> | undefined;

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
  const j = facts.job_id === r.job ? facts : undefined;
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
          stat("map decided at", num(j.decided_step)),
          stat("last decision", j.last_decision_step === null ? "none yet" : j.last_decision_step === undefined ? DASH : `step ${num(j.last_decision_step)}`),
          stat("ranks", `${num(j.agents_connected)} / ${num(j.world_size)}`, (j.agents_connected ?? 0) < (j.world_size ?? 0)),
          stat("blocks", num(j.blocks)),
          warn.length ? h("a", { class: "warn", href: routeHash({ view: "ranks", job: r.job }) }, `⚠ ${warn.join(" · ")}`) : null,
        ]
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
  const tab = (v: "map" | "charts" | "ranks" | "config" | "plan", label: string) =>
    h("a", { href: routeHash({ view: v, job }), class: here === v ? "tab on" : "tab", "aria-current": here === v ? "page" : null }, label);
  replace(tabs, tab("map", "block map"), tab("charts", "charts"), tab("ranks", "ranks"), tab("plan", "plan"), tab("config", "config"));
  document.title = `${job} · ${r.view === "block" ? `block ${r.block}` : r.view} · Prism`;
}

function setLive(s: LiveState, detail: string): void {
  const text: Record<LiveState, string> = {
    off: "",
    connecting: "● connecting",
    live: "● live",
    waiting: "○ not live: reconnecting",
    refused: "○ not live: needs a token (config)",
    deleted: "● job deleted",
  };
  live.textContent = text[s];
  live.className = s;
  live.title = detail;
  if (s === "deleted") showError(new ApiError(404, "not_found", `job ${route.view === "jobs" ? "" : route.job} was deleted`));
}

function refresh(reason: Reason): void {
  request(reason);
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
    case "plan":
      return planView(ctx, r.job);
    case "block":
      return blockView(ctx, r.job, r.block);
  }
}

/** New facts about the job on screen, for its bar. */
function noteFacts(f: Partial<Job>): void {
  if (route.view === "jobs" || (f.job_id !== undefined && f.job_id !== route.job)) return;
  facts = { ...facts, ...f, job_id: route.job };
  drawJobHead();
}

/** The newest of the step the bar shows and a step an event names (events carry no job step). */
function newestStep(step: number): number {
  const now = facts.step;
  return now === null || now === undefined || now < step ? step : now;
}

const liveJob = new LiveJob(
  (e) => {
    const f: Partial<Job> = { job_id: e.job_id, map_version: e.map_version, decided_step: e.decided_step, effective_step: e.effective_step, blocks: e.blocks };
    if (e.map_version > 0) {
      /* a map was decided at decided_step: a decision at least that recent */
      f.step = newestStep(e.decided_step);
      f.last_decision_step = Math.max(e.decided_step, facts.last_decision_step ?? 0);
    }
    noteFacts(f);
    refresh("map");
  },
  (e) => {
    noteFacts({ job_id: e.job_id, map_version: e.map_version, step: newestStep(e.step), last_decision_step: e.step });
    refresh("decision");
  },
  setLive,
);

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
    jobs: () => jobs,
    facts: (f) => {
      if (gen === generation) noteFacts(f);
    },
    current: () => facts,
    tokenGiven: () => {
      if (gen === generation) liveJob.tokenGiven();
    },
  };
  view = makeView(ctx, route);
  const v = view;
  /* What the next run asks for: the highest RANK of the reasons that came while one ran.
   * Nothing runs before started: a job view waits for the job's facts (v1/jobs) first. */
  let want: Reason | null = null;
  let started = route.view === "jobs";
  const runner = coalescing(async () => {
    const reason = want ?? "poll";
    want = null;
    try {
      await v.refresh(reason);
      if (gen === generation && reason !== "poll") showError(null);
    } catch (e) {
      if (gen === generation) showError(e);
    }
  });
  request = (reason) => {
    if (gen !== generation) return;
    want = want === null || RANK[reason] > RANK[want] ? reason : want;
    if (started) void runner.run();
  };
  drawNav();
  if (route.view !== "jobs") {
    const job = route.job;
    if (facts.job_id !== job) facts = { ...(jobs?.find((j) => j.job_id === job) ?? {}), job_id: job };
    drawJobHead();
    /* Once per opened view, not a loop: the bar's step and ranks as they are now, before the
     * view's first refresh (which sizes what it reads by the job's step and blocks). */
    void getJson<JobList>("v1/jobs")
      .then(
        (list) => {
          jobs = list.jobs;
          const j = list.jobs.find((x) => x.job_id === job);
          if (j && gen === generation) noteFacts(j);
        },
        () => {},
      )
      .then(() => {
        if (gen !== generation) return;
        /* After a read: it tells whether the stream needs the tab's token (live.ts). */
        liveJob.watch(job);
        started = true;
        refresh("open");
      });
  }
  if (route.view === "jobs") liveJob.watch(null);
  window.scrollTo(0, 0);
  clearTimeout(pollTimer);
  if (route.view === "jobs") void pollJobs(gen);
  if (route.view === "ranks") pollTimer = setTimeout(function tick() {
    refresh("poll");
    pollTimer = setTimeout(tick, POLL_MS);
  }, POLL_MS);
}

/** The jobs view's poll: GET v1/jobs now and POLL_MS after each answer (never two at once). */
async function pollJobs(gen: number): Promise<void> {
  try {
    jobs = (await getJson<JobList>("v1/jobs")).jobs;
    if (gen !== generation) return;
    refresh("poll");
  } catch (e) {
    if (gen === generation) showError(e);
  }
  if (gen === generation) pollTimer = setTimeout(() => void pollJobs(gen), POLL_MS);
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
