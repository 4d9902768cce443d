/* The shapes of prismd's REST answers the dashboard reads (DESIGN 6; /ranks as plan 13 says).
 * TEMPORARY: written by hand from real answers until service/prismd/openapi.json lands; then
 * these names become aliases of the types generated from it. */

export interface Job {
  job_id: string;
  step: number | null;
  map_version: number;
  decided_step: number;
  effective_step: number;
  agents_connected: number;
  world_size: number;
  blocks: number;
  ranks_lagging?: number;
  ranks_not_acked?: number;
}

export interface JobList {
  jobs: Job[];
}

export interface Block {
  id: number;
  name: string | null;
  precision: string;
  sensitivity: number | null;
  grad_score: number | null;
  error_score: number | null;
  relative_magnitude: number | null;
  last_switch_step: number | null;
  reason: string;
  forced: boolean;
}

export interface TelemetrySummary {
  step_id: number;
  blocks_bf16: number;
  blocks_int8: number;
  mean_sensitivity: number | null;
  max_sensitivity: number | null;
  min_sensitivity: number | null;
  precision_changes: number;
  estimated_bandwidth_saving_pct: number;
  low_precision: string;
  map_version: number;
}

export interface BlockMap extends Omit<Job, "blocks"> {
  blocks: Block[];
  telemetry: TelemetrySummary | null;
}

export interface Switch {
  step: number;
  from: string;
  to: string;
  reason: string;
  map_version: number;
}

export interface BlockDetail extends Block {
  job_id: string;
  history: Switch[];
}

export interface BlockTelemetry {
  precision: string;
  sensitivity: number | null;
  grad_score: number | null;
  error_score: number | null;
  relative_magnitude: number | null;
}

export interface TelemetryRecord extends TelemetrySummary {
  timestamp: number;
  block_details?: Record<string, BlockTelemetry>;
  loss?: number | null;
}

export interface TelemetryPage {
  job_id: string;
  records: TelemetryRecord[];
  truncated?: boolean;
  next_since_step?: number;
}

export type Config = Record<string, unknown> & {
  bf16_threshold: number;
  int8_threshold: number;
  hysteresis_margin: number;
  force_bf16_blocks: number[];
  force_int8_blocks: number[];
};

export interface Device {
  device_class: string;
  device_name: string;
  memory_bytes: number;
  bf16_ops_per_second: number;
  fp16_ops_per_second: number;
  int8_ops_per_second: number;
  fp8_ops_per_second: number;
  h2d_bytes_per_second: number;
}

export interface Rank {
  rank: number;
  connected: boolean;
  node: string | null;
  device: Device | null;
  last_step: number | null;
  acked_map_version: number | null;
  applied_step: number | null;
  reports_dropped: number | null;
  late_switches: number | null;
  lagging: boolean;
  acked_current_map: boolean;
}

export interface RanksAnswer {
  job_id: string;
  world_size: number;
  map_version: number;
  last_step: number | null;
  ranks: Rank[];
}

export interface ConfigChange {
  job_id: string;
  applies: string;
  config: Config;
}

export interface ErrorBody {
  error: { code: string; message: string };
}

/** The data of an SSE "map" event (events.c). */
export interface MapEvent {
  job_id: string;
  map_version: number;
  decided_step: number;
  effective_step: number;
  blocks: number;
  blocks_bf16: number;
  blocks_low: number;
}
