/* The ranks of a job (GET v1/jobs/{job}/ranks): who is connected, where, on what, how far it
 * got and which map it acknowledged. Polled with the shell's 5 s tick: ranks move on without
 * map events. */
import { getJson } from "../api";
import { h, replace, table } from "../dom";
import { DASH, bytes, num, si } from "../format";
import type { Rank, RanksAnswer } from "../types";
import { jobPath } from "../url";
import type { View, ViewContext } from "../view";

function flags(r: Rank, mapVersion: number): HTMLElement {
  if (!r.connected) return h("span", { class: "muted" }, "not connected");
  const bad: string[] = [];
  if (r.lagging) bad.push("lagging");
  if (!r.acked_current_map) bad.push(`not acked v${mapVersion}`);
  return bad.length ? h("span", { class: "warn" }, `⚠ ${bad.join(" · ")}`) : h("span", { class: "ok" }, "ok");
}

export function ranksView(ctx: ViewContext, job: string): View {
  const { table: t, body } = table("ranks-table", `Ranks of job ${job}`, [
    { label: "rank", num: true },
    { label: "connected" },
    { label: "node" },
    { label: "device class" },
    { label: "device" },
    { label: "memory", num: true },
    { label: "BF16 ops/s", num: true },
    { label: "INT8 ops/s", num: true },
    { label: "FP8 ops/s", num: true },
    { label: "H2D B/s", num: true },
    { label: "last step", num: true },
    { label: "acked map", num: true },
    { label: "applied from", num: true, title: "the step the acknowledged map applies from" },
    { label: "reports dropped", num: true },
    { label: "late switches", num: true },
    { label: "status" },
  ]);
  const note = h("p", { class: "note" });
  replace(ctx.body, h("section", { class: "panel wide" }, h("h2", null, "Ranks"), note, t));
  return {
    async refresh() {
      const a = await getJson<RanksAnswer>(jobPath(job, "ranks"));
      note.textContent = `world size ${a.world_size} · map version ${a.map_version} · newest step ${num(a.last_step)}`;
      replace(
        body,
        a.ranks.map((r) =>
          h(
            "tr",
            { "data-rank": r.rank, class: r.connected ? null : "off" },
            h("th", { scope: "row", class: "num" }, String(r.rank)),
            h("td", null, r.connected ? "yes" : "no"),
            h("td", null, r.node ?? DASH),
            h("td", null, r.device?.device_class ?? DASH),
            h("td", null, r.device?.device_name ?? DASH),
            h("td", { class: "num" }, bytes(r.device?.memory_bytes)),
            h("td", { class: "num" }, si(r.device?.bf16_ops_per_second)),
            h("td", { class: "num" }, si(r.device?.int8_ops_per_second)),
            h("td", { class: "num" }, si(r.device?.fp8_ops_per_second)),
            h("td", { class: "num" }, si(r.device?.h2d_bytes_per_second)),
            h("td", { class: r.lagging ? "num bad" : "num" }, num(r.last_step)),
            h("td", { class: r.connected && !r.acked_current_map ? "num bad" : "num" }, num(r.acked_map_version)),
            h("td", { class: "num" }, num(r.applied_step)),
            h("td", { class: r.reports_dropped ? "num bad" : "num" }, num(r.reports_dropped)),
            h("td", { class: r.late_switches ? "num bad" : "num" }, num(r.late_switches)),
            h("td", null, flags(r, a.map_version)),
          ),
        ),
      );
      ctx.ready();
    },
    destroy() {},
  };
}
