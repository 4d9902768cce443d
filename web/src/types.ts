/* The shapes of prismd's REST answers, from the types web/build.mjs generates out of
 * service/prismd/openapi.json (module "prism-api", in the build tree): the contract is the one
 * source, and a change to it that breaks the dashboard fails the type check. */
import type { components } from "prism-api";

type S = components["schemas"];

export type Precision = S["Precision"];
export type Job = S["Job"];
export type JobList = S["JobList"];
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
/** a decision that changed no block's precision (no map event follows it) */
export type DecisionEvent = S["DecisionEvent"];

/**
 * A telemetry record as the charts read it: block_details may be missing (the charts then count
 * blocks from the summary). `loss` is there when a trainer reported one for the decision's step.
 */
export type TelemetryRecord = Omit<S["TelemetryRecord"], "block_details"> & {
  block_details?: S["TelemetryRecord"]["block_details"];
};

export type TelemetryPage = Omit<S["Telemetry"], "records"> & { records: TelemetryRecord[] };
/** a job's hybrid-device plan state (GET v1/jobs/{job}/plan) and the plan object in it */
export type JobPlan = S["JobPlan"];
export type HybridPlan = S["HybridPlan"];
