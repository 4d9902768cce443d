/* The ranks of a job (GET v1/jobs/{job}/ranks): who is connected, where, on what, how far it
 * got and which map it acknowledged. Polled with the shell's 5 s tick: ranks move on without
 * map events. */
import { getJson } from "../api";
import { h, replace, source, table } from "../dom";
import { DASH, bytes, num, si } from "../format";
import type { Rank, RanksAnswer } from "../types";
import { jobPath } from "../url";
import type { View, ViewContext } from "../view";

function flags(r: Rank): HTMLElement {
  if (!r.connected) return h("span", { class: "muted" }, "not connected");
  const bad: string[] = [];
  if (r.lagging) bad.push("lagging");
  if (!r.acked_current_map) bad.push("not acked");
  return bad.length ? h("span", { class: "warn", title: `acknowledged map version ${r.acked_map_version ?? "none"}` }, `⚠ ${bad.join(" · ")}`) : h("span", { class: "ok" }, "ok");
}

export function ranksView(ctx: ViewContext, job: string): View {
  const { table: t, body } = table("ranks-table", `Ranks of job ${job}`, [
    { label: "rank", num: true },
    { label: "connected" },
    { label: "node" },
    { label: "device", title: "device class and name" },
    { label: "memory", num: true },
    { label: "ops/s bf16 · int8 · fp8", num: true, title: "measured matrix-multiply throughput" },
    { label: "h2d", num: true, title: "host-to-device bandwidth, bytes/s" },
    { label: "last step", num: true },
    { label: "acked map", num: true },
    { label: "from step", num: true, title: "the step the acknowledged map applies from" },
    { label: "dropped", num: true, title: "step reports the trainer dropped (as the rank's agent knows)" },
    { label: "late", num: true, title: "late switches: maps applied after their effective step (as the rank's agent knows)" },
    { label: "status" },
  ]);
  const note = h("p", { class: "note" });
  replace(ctx.body, h("section", { class: "panel wide" }, h("div", { class: "panel-head" }, h("h2", null, "Ranks"), source(jobPath(job, "ranks"))), note, t));
  return {
    async refresh(reason) {
      if (reason === "decision") return; /* ranks move with steps and acks: the 5 s poll, map events */
      const a = await getJson<RanksAnswer>(jobPath(job, "ranks"));
      ctx.facts({
        world_size: a.world_size,
        map_version: a.map_version,
        step: a.last_step,
        agents_connected: a.ranks.filter((r) => r.connected).length,
        ranks_lagging: a.ranks.filter((r) => r.connected && r.lagging).length,
        ranks_not_acked: a.ranks.filter((r) => r.connected && !r.acked_current_map).length,
      });
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
            h("td", { title: r.device?.device_name ?? null }, r.device ? [r.device.device_class, h("span", { class: "muted" }, ` ${r.device.device_name}`)] : DASH),
            h("td", { class: "num" }, bytes(r.device?.memory_bytes)),
            h("td", { class: "num" }, r.device ? [si(r.device.bf16_ops_per_second), " · ", si(r.device.int8_ops_per_second), " · ", si(r.device.fp8_ops_per_second)] : DASH),
            h("td", { class: "num" }, r.device ? `${si(r.device.h2d_bytes_per_second)}B/s` : DASH),
            h("td", { class: r.lagging ? "num bad" : "num" }, num(r.last_step)),
            h("td", { class: r.connected && !r.acked_current_map ? "num bad" : "num" }, num(r.acked_map_version)),
            h("td", { class: "num" }, num(r.applied_step)),
            h("td", { class: r.reports_dropped ? "num bad" : "num" }, num(r.reports_dropped)),
            h("td", { class: r.late_switches ? "num bad" : "num" }, num(r.late_switches)),
            h("td", null, flags(r)),
          ),
        ),
      );
      ctx.ready();
    },
    destroy() {},
  };
}
