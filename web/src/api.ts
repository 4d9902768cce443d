/* Requests to prismd's REST API, every URL relative to the page (url.ts). An answer that is not
 * 2xx becomes an ApiError carrying prismd's own error.message, which the page shows verbatim. */
import { apiUrl, jobPath } from "./url";
import type { TelemetryPage, TelemetryRecord } from "./types";

const TOKEN_KEY = "prism.token";

/** The bearer token the user gave, kept for this tab only (sessionStorage). */
export function getToken(): string {
  try {
    return sessionStorage.getItem(TOKEN_KEY) ?? "";
  } catch {
    return "";
  }
}

export function setToken(token: string): void {
  try {
    if (token) sessionStorage.setItem(TOKEN_KEY, token);
    else sessionStorage.removeItem(TOKEN_KEY);
  } catch {
    /* storage refused (a privacy mode): the token lasts as long as the input holds it */
  }
}

export class ApiError extends Error {
  constructor(
    readonly status: number,
    readonly code: string,
    message: string,
  ) {
    super(message);
  }
}

type Query = Record<string, string | number | undefined>;

async function send(method: string, path: string, query: Query | undefined, body: string | undefined, token: string): Promise<unknown> {
  const headers: Record<string, string> = { Accept: "application/json" };
  if (token) headers["Authorization"] = `Bearer ${token}`;
  if (body !== undefined) headers["Content-Type"] = "application/json";
  let res: Response;
  try {
    res = await fetch(apiUrl(path, document.baseURI, query), { method, headers, body, cache: "no-store" });
  } catch (e) {
    throw new ApiError(0, "network", `prismd cannot be reached: ${(e as Error).message}`);
  }
  const text = await res.text();
  let doc: unknown = null;
  try {
    doc = text ? JSON.parse(text) : null;
  } catch {
    doc = null;
  }
  if (!res.ok) {
    const err = (doc as { error?: { code?: unknown; message?: unknown } } | null)?.error;
    throw new ApiError(
      res.status,
      typeof err?.code === "string" ? err.code : "http",
      typeof err?.message === "string" ? err.message : `HTTP ${res.status} ${res.statusText}`,
    );
  }
  if (doc === null) throw new ApiError(res.status, "bad_answer", `${method} ${path}: the answer is not JSON`);
  return doc;
}

let readsNeedToken = false;

/** True once prismd refused a read without a token and took it with the tab's (--require-read-token). */
export function readsNeedAToken(): boolean {
  return readsNeedToken;
}

/**
 * GET a JSON answer. Reads go without a token (a job's token would be refused on another job);
 * when prismd asks for one (401, --require-read-token) and the user gave one, it is sent, and
 * from then on at once.
 */
export async function getJson<T>(path: string, query?: Query): Promise<T> {
  const token = getToken();
  if (readsNeedToken && token) return (await send("GET", path, query, undefined, token)) as T;
  try {
    return (await send("GET", path, query, undefined, "")) as T;
  } catch (e) {
    if (!(e instanceof ApiError && e.status === 401 && token)) throw e;
    const answer = (await send("GET", path, query, undefined, token)) as T;
    readsNeedToken = true;
    return answer;
  }
}

/** PATCH/PUT with the user's token; body goes as the user wrote it (prismd's syntax errors name its line and column). */
export async function mutate<T>(method: "PATCH" | "PUT", path: string, body: string): Promise<T> {
  return (await send(method, path, undefined, body, getToken())) as T;
}

/** Pages of telemetry read per call at most: a bound on what one refresh downloads. */
export const TELEMETRY_MAX_PAGES = 20;

/**
 * A job's telemetry records with step_id >= since, oldest first, following prismd's paging
 * (truncated / next_since_step) for at most TELEMETRY_MAX_PAGES pages. each(record) sees every
 * record once, so a caller keeps only what it needs of a big job's block_details.
 */
export async function eachTelemetry(job: string, since: number, each: (r: TelemetryRecord) => void): Promise<{ complete: boolean }> {
  let from = since;
  for (let page = 0; page < TELEMETRY_MAX_PAGES; page++) {
    const answer = await getJson<TelemetryPage>(jobPath(job, "telemetry"), { since_step: from, limit: 1000 });
    for (const r of answer.records) each(r);
    if (!answer.truncated || answer.next_since_step === undefined || answer.next_since_step <= from) return { complete: true };
    from = answer.next_since_step;
  }
  return { complete: false };
}
