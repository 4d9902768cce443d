/* What every view gets from the shell (main.ts) and gives back. */
import type { Job } from "./types";

export interface ViewContext {
  /** where the view draws (inside main#view, under the job's header) */
  body: HTMLElement;
  /** marks main#view data-ready="true": the view drew its first data */
  ready(): void;
  /** shows an error above the view (prismd's message as it is), or clears it (null) */
  error(e: unknown): void;
  /** facts about the job on screen that the view's answers carry, for the job bar */
  facts(f: Partial<Job>): void;
  /** what the shell knows of the job on screen (v1/jobs' entry, read before the first refresh) */
  current(): Partial<Job>;
  /** the latest GET v1/jobs (null before the first answer) */
  jobs(): Job[] | null;
  /** the user gave a token (the config view): a live stream refused for want of one tries again */
  tokenGiven(): void;
}

export interface View {
  /** fetches and redraws what the view shows: at open, on each map event, on each decision
   * event (a decision that changed no precision: per-decision data only), and on the 5 s poll of
   * the jobs and ranks views */
  refresh(reason: "open" | "map" | "decision" | "poll"): Promise<void>;
  destroy(): void;
}
