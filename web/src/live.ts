/* Live updates: one event stream on v1/jobs/{job}/events for the job on screen (an
 * EventSource; read with fetch instead when prismd needs a token for reads, which an
 * EventSource cannot send), and a coalescing runner so that a burst of map events costs one
 * refetch in flight plus one after. */
import { getToken, readsNeedAToken } from "./api";
import { parseSse } from "./sse";
import { apiUrl, jobPath } from "./url";
import type { MapEvent } from "./types";

export type LiveState = "off" | "connecting" | "live" | "deleted";

/** The wait before a token-bearing stream that ended is opened again. */
export const RECONNECT_MS = 5000;

export class LiveJob {
  private close: (() => void) | null = null;
  private job: string | null = null;
  private withToken = false;

  constructor(
    private readonly onMap: (e: MapEvent) => void,
    private readonly onState: (s: LiveState) => void,
  ) {}

  /** Follows job's events (null: none); the stream of the job before is closed. */
  watch(job: string | null): void {
    const withToken = readsNeedAToken() && getToken() !== "";
    if (job === this.job && withToken === this.withToken) return;
    this.close?.();
    this.close = null;
    this.job = job;
    this.withToken = withToken;
    if (job === null) {
      this.onState("off");
      return;
    }
    const url = apiUrl(jobPath(job, "events"), document.baseURI);
    this.close = withToken ? this.fetchStream(url) : this.eventSource(url);
  }

  private dispatch(type: string, data: string): boolean {
    if (type === "deleted") {
      this.onState("deleted");
      return false;
    }
    if (type === "map") {
      try {
        this.onMap(JSON.parse(data) as MapEvent);
      } catch {
        /* a malformed event is skipped; the next one refetches everything anyway */
      }
    }
    return true;
  }

  private eventSource(url: string): () => void {
    const es = new EventSource(url);
    this.onState("connecting");
    es.addEventListener("open", () => this.onState("live"));
    es.addEventListener("error", () => this.onState(es.readyState === EventSource.CLOSED ? "off" : "connecting"));
    es.addEventListener("map", (ev) => this.dispatch("map", (ev as MessageEvent<string>).data));
    es.addEventListener("deleted", () => {
      es.close();
      this.dispatch("deleted", "");
    });
    return () => es.close();
  }

  /** The stream read with fetch and the tab's token, opened again RECONNECT_MS after it ends. */
  private fetchStream(url: string): () => void {
    const stop = new AbortController();
    const run = async () => {
      while (!stop.signal.aborted) {
        this.onState("connecting");
        try {
          const res = await fetch(url, {
            headers: { Accept: "text/event-stream", Authorization: `Bearer ${getToken()}` },
            cache: "no-store",
            signal: stop.signal,
          });
          if (!res.ok || !res.body) throw new Error(`HTTP ${res.status}`);
          this.onState("live");
          const reader = res.body.pipeThrough(new TextDecoderStream()).getReader();
          let rest = "";
          for (;;) {
            const { value, done } = await reader.read();
            if (done) break;
            const parsed = parseSse(rest + value);
            rest = parsed.rest;
            for (const e of parsed.events) if (!this.dispatch(e.event, e.data)) return stop.abort();
          }
        } catch {
          /* refused or cut: try again after the wait, as an EventSource would */
        }
        if (stop.signal.aborted) return;
        this.onState("connecting");
        await new Promise((ok) => setTimeout(ok, RECONNECT_MS));
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
