/* Live updates: one event stream on v1/jobs/{job}/events for the job on screen, and a
 * coalescing runner so that a burst of events costs one refetch in flight plus one after.
 *
 * The stream is an EventSource; it is read with fetch instead when prismd needs a token for
 * reads (an EventSource cannot send one), and when an EventSource was refused: an EventSource
 * that gets an answer other than 200 (503 past --http-max-event-streams-per-job, 401 before the
 * tab has a token) closes for good without saying why, while fetch sees the status and the
 * Retry-After. A stream refused or ended is opened again after the larger of Retry-After and
 * RECONNECT_MS; one refused for want of a (right) token waits for the user to give one. */
import { getToken, readsNeedAToken } from "./api";
import { parseSse } from "./sse";
import { apiUrl, jobPath } from "./url";
import type { DecisionEvent, MapEvent } from "./types";

/**
 * off: no job on screen; connecting; live: the stream is open; waiting: refused or ended, opened
 * again after a wait; refused: prismd wants a token (or another one), opened again once one is
 * given; deleted: the job was deleted.
 */
export type LiveState = "off" | "connecting" | "live" | "waiting" | "refused" | "deleted";

/** The shortest wait before a stream that was refused or ended is opened again. */
export const RECONNECT_MS = 5000;
/** The longest: a Retry-After beyond it is read as this. */
export const RECONNECT_MAX_MS = 300000;

/**
 * The wait before a stream is opened again after an answer with this Retry-After (delay seconds
 * or an HTTP date; null when there was none): the larger of it and RECONNECT_MS, at most
 * RECONNECT_MAX_MS. nowMs is the time (Date.now()) the answer came, for the date form.
 */
export function reconnectDelayMs(retryAfter: string | null, nowMs: number): number {
  let ms = 0;
  const text = retryAfter?.trim() ?? "";
  if (/^[0-9]+$/.test(text)) ms = Number(text) * 1000;
  else if (text !== "") {
    const at = Date.parse(text);
    if (Number.isFinite(at)) ms = at - nowMs;
  }
  return Math.min(RECONNECT_MAX_MS, Math.max(RECONNECT_MS, ms));
}

/** What the stream reader does after an answer that is not an open stream, or a stream that ended. */
export type NextTry =
  | { kind: "retry"; delayMs: number; withToken: boolean }
  | { kind: "refused" }
  | { kind: "deleted" };

/**
 * The next try after an answer of status (0: no answer, the request failed; 200: a stream that
 * ended) to a request sent with the tab's token or not (sentToken), when the tab holds one or
 * not (haveToken): a 401 to a request without the token is tried again at once with it; a 401
 * or 403 otherwise waits for a token (refused); 404: the job is gone; anything else is tried
 * again after reconnectDelayMs(retryAfter).
 */
export function nextTry(status: number, retryAfter: string | null, sentToken: boolean, haveToken: boolean, nowMs: number): NextTry {
  if (status === 401 && !sentToken && haveToken) return { kind: "retry", delayMs: 0, withToken: true };
  if (status === 401 || status === 403) return { kind: "refused" };
  if (status === 404) return { kind: "deleted" };
  return { kind: "retry", delayMs: reconnectDelayMs(retryAfter, nowMs), withToken: sentToken };
}

/** prismd's error.message in an answer's text, else "HTTP status". */
function refusal(status: number, text: string): string {
  try {
    const m = (JSON.parse(text) as { error?: { message?: unknown } }).error?.message;
    if (typeof m === "string") return `HTTP ${status}: ${m}`;
  } catch {
    /* not prismd's error body */
  }
  return `HTTP ${status}`;
}

export class LiveJob {
  private close: (() => void) | null = null;
  private job: string | null = null;
  private withToken = false;
  private state: LiveState = "off";
  /** counts the streams opened: a stream closed since cannot change the state any more */
  private opened = 0;

  constructor(
    private readonly onMap: (e: MapEvent) => void,
    private readonly onDecision: (e: DecisionEvent) => void,
    private readonly onState: (s: LiveState, detail: string) => void,
  ) {}

  /** Follows job's events (null: none); the stream of the job before is closed. A stream of
   * the same job is kept, unless it was refused for want of a token (tried again). */
  watch(job: string | null): void {
    const withToken = readsNeedAToken() && getToken() !== "";
    if (job === this.job && withToken === this.withToken && this.close !== null && this.state !== "refused") return;
    this.open(job, withToken);
  }

  /**
   * The user gave a token (the config view): a stream refused for want of one is opened again
   * now, and one read without the token is opened with it once reads need it.
   */
  tokenGiven(): void {
    if (this.job === null || this.state === "deleted") return;
    const withToken = readsNeedAToken() && getToken() !== "";
    if (this.state === "refused" || withToken !== this.withToken) this.open(this.job, withToken);
  }

  private open(job: string | null, withToken: boolean): void {
    this.close?.();
    this.close = null;
    this.job = job;
    this.withToken = withToken;
    const n = ++this.opened;
    const set = (s: LiveState, detail = "") => {
      if (n !== this.opened) return;
      this.state = s;
      this.onState(s, detail);
    };
    if (job === null) {
      set("off");
      return;
    }
    const url = apiUrl(jobPath(job, "events"), document.baseURI);
    this.close = withToken ? this.fetchStream(url, true, 0, set) : this.eventSource(url, set);
  }

  /** Passes one event on; false once the stream is over (the job was deleted). */
  private dispatch(type: string, data: string, set: (s: LiveState) => void): boolean {
    if (type === "deleted") {
      set("deleted");
      return false;
    }
    try {
      if (type === "map") this.onMap(JSON.parse(data) as MapEvent);
      else if (type === "decision") this.onDecision(JSON.parse(data) as DecisionEvent);
    } catch {
      /* a malformed event is skipped; the next one refetches anyway */
    }
    return true;
  }

  private eventSource(url: string, set: (s: LiveState, detail?: string) => void): () => void {
    const es = new EventSource(url);
    let fallback: (() => void) | null = null;
    set("connecting");
    es.addEventListener("open", () => set("live"));
    es.addEventListener("error", () => {
      if (es.readyState !== EventSource.CLOSED) return set("connecting"); /* it tries again itself */
      /* Refused: an EventSource gives up for good. Read with fetch from now on (the same stream),
       * RECONNECT_MS from now: it sees the status and Retry-After of the next answers. */
      if (!fallback) fallback = this.fetchStream(url, false, RECONNECT_MS, set, "prismd refused the event stream");
    });
    es.addEventListener("map", (ev) => this.dispatch("map", (ev as MessageEvent<string>).data, set));
    es.addEventListener("decision", (ev) => this.dispatch("decision", (ev as MessageEvent<string>).data, set));
    es.addEventListener("deleted", () => {
      es.close();
      this.dispatch("deleted", "", set);
    });
    return () => {
      es.close();
      fallback?.();
    };
  }

  /**
   * The stream read with fetch (with the tab's token when sendToken), first after delayMs, and
   * again after each refusal or end as nextTry says, until closed, the job is deleted or prismd
   * wants a token the tab does not have.
   */
  private fetchStream(url: string, sendToken: boolean, delayMs: number, set: (s: LiveState, detail?: string) => void, why = ""): () => void {
    const stop = new AbortController();
    const sleep = (ms: number) =>
      new Promise<void>((ok) => {
        const done = () => {
          clearTimeout(timer);
          stop.signal.removeEventListener("abort", done);
          ok();
        };
        const timer = setTimeout(done, ms);
        stop.signal.addEventListener("abort", done);
      });
    const run = async () => {
      let token = sendToken;
      let wait = delayMs;
      let detail = why;
      for (;;) {
        if (wait > 0) {
          set("waiting", `${detail ? `${detail}; ` : ""}next try in ${Math.round(wait / 1000)} s`);
          await sleep(wait);
        }
        if (stop.signal.aborted) return;
        set("connecting");
        let status = 0;
        let retryAfter: string | null = null;
        try {
          const headers: Record<string, string> = { Accept: "text/event-stream" };
          if (token) headers["Authorization"] = `Bearer ${getToken()}`;
          const res = await fetch(url, { headers, cache: "no-store", signal: stop.signal });
          status = res.status;
          retryAfter = res.headers.get("Retry-After");
          if (res.ok && res.body) {
            set("live");
            detail = "the event stream ended";
            const reader = res.body.pipeThrough(new TextDecoderStream()).getReader();
            let rest = "";
            for (;;) {
              const { value, done } = await reader.read();
              if (done) break;
              const parsed = parseSse(rest + value);
              rest = parsed.rest;
              for (const e of parsed.events) if (!this.dispatch(e.event, e.data, set)) return stop.abort();
            }
          } else {
            detail = `prismd refused the event stream (${refusal(status, await res.text())})`;
          }
        } catch (e) {
          if (stop.signal.aborted) return;
          detail = status ? "the event stream was cut" : `prismd cannot be reached (${(e as Error).message})`;
        }
        if (stop.signal.aborted) return;
        const next = nextTry(status, retryAfter, token, getToken() !== "", Date.now());
        if (next.kind === "deleted") return set("deleted");
        if (next.kind === "refused") return set("refused", `${detail}; give the job's token on the config view`);
        token = next.withToken;
        wait = next.delayMs;
      }
    };
    void run();
    return () => stop.abort();
  }
}

/**
 * run() calls fn unless a call is in flight, in which case fn runs once more when it ends,
 * however many run() calls came meanwhile: what is drawn is never older than the last event,
 * and never more than one request waits.
 */
export function coalescing(fn: () => Promise<void>): { run: () => Promise<void> } {
  let inFlight: Promise<void> | null = null;
  let again = false;
  const loop = async (): Promise<void> => {
    do {
      again = false;
      try {
        await fn();
      } catch {
        /* fn reports its own errors */
      }
    } while (again);
    inFlight = null;
  };
  return {
    run: () => {
      if (inFlight) {
        again = true;
        return inFlight;
      }
      inFlight = loop();
      return inFlight;
    },
  };
}
