/* Hash routes (plan 13's DOM contract): #/ jobs; #/jobs/{job} the block map; #/jobs/{job}/charts,
 * /ranks, /config, /plan; #/jobs/{job}/blocks/{id} one block. */

export type ViewName = "jobs" | "map" | "charts" | "ranks" | "config" | "plan" | "block";

export type Route = { view: "jobs" } | { view: "map" | "charts" | "ranks" | "config" | "plan"; job: string } | { view: "block"; job: string; block: number };

/** The route of a location hash; anything unknown is the jobs view. */
export function parseRoute(hash: string): Route {
  const parts = hash.replace(/^#\/?/, "").split("/").filter((p) => p !== "");
  if (parts[0] !== "jobs" || parts.length < 2) return { view: "jobs" };
  let job: string;
  try {
    job = decodeURIComponent(parts[1]!);
  } catch {
    return { view: "jobs" };
  }
  if (parts.length === 2) return { view: "map", job };
  const sub = parts[2];
  if (parts.length === 3 && (sub === "charts" || sub === "ranks" || sub === "config" || sub === "plan")) return { view: sub, job };
  if (parts.length === 4 && sub === "blocks" && /^\d+$/.test(parts[3]!)) return { view: "block", job, block: Number(parts[3]) };
  return { view: "map", job };
}

/** The hash of a route: the inverse of parseRoute. */
export function routeHash(r: Route): string {
  if (r.view === "jobs") return "#/";
  const base = `#/jobs/${encodeURIComponent(r.job)}`;
  if (r.view === "map") return base;
  if (r.view === "block") return `${base}/blocks/${r.block}`;
  return `${base}/${r.view}`;
}
