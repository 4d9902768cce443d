/* The hybrid-device plan of a job (GET v1/jobs/{job}/plan, DESIGN 11): the planning status and
 * prismd's message, the predicted iteration time against uniform low and uniform high, Σω, per
 * device class its formats, memory against budget and compute time, a strip of its blocks
 * coloured by planned format (the block map's palette), and the raise log counted. Read again
 * at open and on each map or decision event (a plan goes out with a map; a refusal or a kept
 * plan comes at a decision). */
import { getJson } from "../api";
import { h, replace, source, table } from "../dom";
import { DASH, bytes, num, pct } from "../format";
import { precisionColour } from "../palette";
import { type PlanClass, indicator, lowCount, memoryShare, raiseCounts, seconds, statusText } from "../plan";
import type { HybridPlan, JobPlan } from "../types";
import { jobPath } from "../url";
import type { View, ViewContext } from "../view";

function stat(id: string, k: string, v: string, extra?: HTMLElement | null): HTMLElement {
  return h("div", { class: "stat", id }, h("span", { class: "k" }, k), h("span", { class: "v num" }, v), extra ?? null);
}

/** A baseline's time and whether it fits every class's memory. */
function baseline(id: string, label: string, b: HybridPlan["baselines"]["uniform_low"]): HTMLElement {
  return stat(id, label, seconds(b.iteration_seconds), h("span", { class: b.fits ? "fit ok" : "fit bad" }, b.fits ? "fits" : "does not fit"));
}

/** Memory used against the budget: a bar (red past the budget) and the figures. */
function memoryCell(c: PlanClass): HTMLElement {
  const share = memoryShare(c);
  const over = c.memory_bytes > c.budget_bytes;
  const text = `${bytes(c.memory_bytes)} / ${bytes(c.budget_bytes)} (${pct(c.budget_bytes > 0 ? (100 * c.memory_bytes) / c.budget_bytes : null)})`;
  return h(
    "div",
    { class: "share" },
    h("div", { class: "bar", role: "img", "aria-label": `memory ${text}${over ? ", over budget" : ""}` },
      h("span", { style: `width:${(share * 100).toFixed(2)}%;background:${over ? "var(--bad)" : "var(--good)"}` })),
    h("span", { class: over ? "share-text bad" : "share-text" }, text),
  );
}

/** One class's blocks, one cell per block in id order, coloured by its planned format. */
function strip(c: PlanClass): HTMLElement {
  return h(
    "div",
    { class: "plan-strip", "data-class": c.name, "data-blocks": c.plan.length, role: "img", "aria-label": `${c.name}: ${lowCount(c)} of ${c.plan.length} blocks ${c.low_format}, the others ${c.high_format}` },
    c.plan.map((f, i) => h("span", { "data-block": i, "data-format": f, title: `block ${i}: ${f}`, style: `background:${precisionColour(f)}` })),
  );
}

export function planView(ctx: ViewContext, job: string): View {
  const status = h("h2", { id: "plan-status" });
  const message = h("p", { id: "plan-message", class: "note" });
  const facts = h("div", { class: "stats", id: "plan-facts" });
  const detail = h("div", { id: "plan-detail" });
  replace(ctx.body, h("section", { class: "panel wide" }, h("div", { class: "panel-head" }, status, source(jobPath(job, "plan"))), message, facts, detail));

  function draw(p: JobPlan): void {
    status.dataset["status"] = p.status;
    status.textContent = `Plan: ${statusText(p)}`;
    message.textContent = p.message;
    message.hidden = p.message === "";
    const plan = p.plan;
    replace(
      facts,
      stat("plan-classes-seen", "device classes", p.classes_seen.length ? p.classes_seen.join(", ") : DASH),
      stat("plan-map", "plan's map", p.map_version === null ? "none" : `v${num(p.map_version)} from step ${num(p.effective_step)}`),
      stat("plan-replans", "plans made · kept", `${num(p.replans)} · ${num(p.plans_kept)}`),
      p.status === "waiting_for_statistics" ? stat("plan-missing", "blocks missing statistics", num(p.blocks_missing_statistics)) : null,
    );
    if (!plan) {
      replace(detail, h("p", { class: "empty", id: "plan-none" }, "No plan in force: every block runs in its high format on every class."));
      return;
    }
    const { table: t, body } = table("plan-classes", `Device classes of the plan of job ${job}`, [
      { label: "class" },
      { label: "fixed", title: "a fixed class runs every block in its high format" },
      { label: "high" },
      { label: "low" },
      { label: "low blocks", num: true },
      { label: "memory / budget", title: "predicted memory of the plan against the class's budget" },
      { label: "compute", num: true, title: "predicted compute time of one iteration on this class" },
    ]);
    replace(
      body,
      plan.classes.map((c) =>
        h(
          "tr",
          { "data-class": c.name },
          h("th", { scope: "row" }, c.name),
          h("td", null, c.fixed ? "fixed" : "no"),
          h("td", null, c.high_format),
          h("td", null, c.low_format),
          h("td", { class: "num" }, `${num(lowCount(c))} / ${num(c.plan.length)}`),
          h("td", null, memoryCell(c)),
          h("td", { class: "num" }, seconds(c.compute_seconds)),
        ),
      ),
    );
    const formats = [...new Set(plan.classes.flatMap((c) => c.plan))];
    const rc = raiseCounts(plan.raises);
    replace(
      detail,
      h(
        "div",
        { class: "stats", id: "plan-times" },
        stat("plan-iteration", "predicted iteration", seconds(plan.iteration_seconds)),
        baseline("plan-uniform-low", "uniform low", plan.baselines.uniform_low),
        baseline("plan-uniform-high", "uniform high", plan.baselines.uniform_high),
        stat("plan-indicator", "Σω", indicator(plan.indicator)),
      ),
      t,
      h("h2", null, "Blocks by class"),
      h("div", { class: "legend", id: "plan-legend", "aria-label": "legend" },
        formats.map((f) => h("span", { class: "item" }, h("span", { class: "swatch", style: `background:${precisionColour(f)}` }), f))),
      h("div", { class: "strips" }, plan.classes.flatMap((c) => [h("div", { class: "strip-name" }, c.name), strip(c)])),
      h("p", { id: "plan-raises", class: "summary" },
        `Raises tried: ${num(plan.raises.length)} · accepted ${num(rc.accepted)} · refused for memory ${num(rc.memory)} · refused for time ${num(rc.time)}`),
    );
  }

  return {
    async refresh(reason) {
      if (reason === "poll") return;
      draw(await getJson<JobPlan>(jobPath(job, "plan")));
      ctx.ready();
    },
    destroy() {},
  };
}
