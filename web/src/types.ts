/* The shapes of prismd's REST answers, from the types web/build.mjs generates out of
 * service/prismd/openapi.json (module "prism-api", in the build tree): the contract is the one
 * source, and a change to it that breaks the dashboard fails the type check. */
import type { components } from "prism-api";

type S = components["schemas"];

export type Precision = S["Precision"];
/* Until the contract lists them: GET v1/jobs' per-job summary of the current map and the last
 * decision (plan 13, round 2), written here by hand. */
type JobSummaryFields = {
  precisions: Record<Precision, number>;
  bandwidth_saving_pct: number | null;
  last_decision_step: number | null;
  last_decision_unix: number | null;
};
export type Job = S["Job"] & JobSummaryFields;
export type JobList = Omit<S["JobList"], "jobs"> & { jobs: Job[] };
export type Block = S["Block"];
export type TelemetrySummary = S["Summary"];
export type BlockMap = S["BlockMap"];
export type Switch = S["Switch"];
export type BlockDetail = S["BlockDetail"];
export type BlockTelemetry = S["TelemetryBlock"];
export type Config = S["Config"];
export type ConfigChange = S["ConfigChange"];
export type Device = S["Device"];
export type Rank = S["Rank"];
export type RanksAnswer = S["Ranks"];
export type ApiErrorBody = S["Error"];
export type MapEvent = S["MapEvent"];

/**
 * The data of an `event: decision` (plan 13, round 2): a decision that changed no block's
 * precision, so no map event follows it. Written here until the contract describes the event.
 */
export type DecisionEvent = { job_id: string; step: number; map_version: number };

/**
 * A telemetry record as the charts read it: block_details may be missing (the charts then count
 * blocks from the summary). `loss` is there when a trainer reported one for the decision's step.
 */
export type TelemetryRecord = Omit<S["TelemetryRecord"], "block_details"> & {
  block_details?: S["TelemetryRecord"]["block_details"];
};

export type TelemetryPage = Omit<S["Telemetry"], "records"> & { records: TelemetryRecord[] };
