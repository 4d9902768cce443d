/* Live updates: one EventSource on v1/jobs/{job}/events for the job on screen, and a
 * coalescing runner so that a burst of map events costs one refetch in flight plus one after. */
import { apiUrl, jobPath } from "./url";
import type { MapEvent } from "./types";

export type LiveState = "off" | "connecting" | "live" | "deleted";

export class LiveJob {
  private source: EventSource | null = null;
  private job: string | null = null;

  constructor(
    private readonly onMap: (e: MapEvent) => void,
    private readonly onState: (s: LiveState) => void,
  ) {}

  /** Follows job's events (null: none); the stream of the job before is closed. */
  watch(job: string | null): void {
    if (job === this.job) return;
    this.source?.close();
    this.source = null;
    this.job = job;
    if (job === null) {
      this.onState("off");
      return;
    }
    const es = new EventSource(apiUrl(jobPath(job, "events"), document.baseURI));
    this.source = es;
    this.onState("connecting");
    es.addEventListener("open", () => this.onState("live"));
    es.addEventListener("error", () => this.onState(es.readyState === EventSource.CLOSED ? "off" : "connecting"));
    es.addEventListener("map", (ev) => {
      try {
        this.onMap(JSON.parse((ev as MessageEvent<string>).data) as MapEvent);
      } catch {
        /* a malformed event is skipped; the next one refetches everything anyway */
      }
    });
    es.addEventListener("deleted", () => {
      es.close();
      this.onState("deleted");
    });
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
