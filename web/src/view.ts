/* What every view gets from the shell (main.ts) and gives back. */
import type { Job } from "./types";

export interface ViewContext {
  /** where the view draws (inside main#view, under the job's header) */
  body: HTMLElement;
  /** marks main#view data-ready="true": the view drew its first data */
  ready(): void;
  /** shows an error above the view (prismd's message as it is), or clears it (null) */
  error(e: unknown): void;
  /** the job's entry from the latest GET v1/jobs, when the shell has one */
  job(id: string): Job | undefined;
  /** the latest GET v1/jobs (null before the first answer) */
  jobs(): Job[] | null;
}

export interface View {
  /** fetches and redraws what the view shows; called on each map event and on the 5 s poll */
  refresh(reason: "open" | "map" | "poll"): Promise<void>;
  destroy(): void;
}
