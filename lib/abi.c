/* The layouts of the public structs, as python/prism/_lib.py declares them with ctypes (and as
 * tests/python/test_kernels.py checks from Python's side). A change to a struct in
 * include/prism/ that moves a field fails the build here, not a Python caller at run time:
 * change _lib.py and these figures together. x86-64 and aarch64 Linux (LP64) only. */
#include "prism/client.h"
#include "prism/kernels.h"
#include "prism/transfer.h"

#include <stddef.h>

#define PRISM_ABI(cond) _Static_assert(cond, #cond " (python/prism/_lib.py relies on it)")

PRISM_ABI(sizeof(prism_status) == 4 && sizeof(prism_dtype) == 4 && sizeof(prism_precision) == 4);
PRISM_ABI(sizeof(prism_granularity) == 4 && sizeof(prism_scale_mode) == 4 &&
          sizeof(prism_rounding) == 4);

PRISM_ABI(offsetof(prism_error, status) == 0 && offsetof(prism_error, message) == 4);
PRISM_ABI(sizeof(((prism_error *)0)->message) == 512 && sizeof(prism_error) == 516);

PRISM_ABI(offsetof(prism_tensor, data) == 0 && offsetof(prism_tensor, numel) == 8);
PRISM_ABI(offsetof(prism_tensor, dtype) == 16 && sizeof(prism_tensor) == 24);

PRISM_ABI(offsetof(prism_quant_spec, format) == 0 && offsetof(prism_quant_spec, granularity) == 4);
PRISM_ABI(offsetof(prism_quant_spec, group) == 8 && offsetof(prism_quant_spec, scale_mode) == 16);
PRISM_ABI(offsetof(prism_quant_spec, rounding) == 20 && offsetof(prism_quant_spec, seed) == 24);
PRISM_ABI(sizeof(prism_quant_spec) == 32);

PRISM_ABI(offsetof(prism_grad_stats, l2_norm) == 0 && offsetof(prism_grad_stats, max_abs) == 8);
PRISM_ABI(offsetof(prism_grad_stats, mean) == 16 && offsetof(prism_grad_stats, variance) == 24);
PRISM_ABI(offsetof(prism_grad_stats, numel) == 32 && offsetof(prism_grad_stats, nonfinite) == 40);
PRISM_ABI(sizeof(prism_grad_stats) == 48);

PRISM_ABI(offsetof(prism_quant_counts, saturated) == 0 && offsetof(prism_quant_counts, underflowed) == 8);
PRISM_ABI(offsetof(prism_quant_counts, nonfinite) == 16 && offsetof(prism_quant_counts, bad_scale) == 24);
PRISM_ABI(sizeof(prism_quant_counts) == 32);

/* include/prism/client.h, as python/prism/client.py declares it. */
PRISM_ABI(offsetof(prism_client_options, dir) == 0 && offsetof(prism_client_options, socket_name) == 8);
PRISM_ABI(offsetof(prism_client_options, hints_name) == 16 && offsetof(prism_client_options, job_id) == 24);
PRISM_ABI(offsetof(prism_client_options, rank) == 32 && offsetof(prism_client_options, world_size) == 36);
PRISM_ABI(offsetof(prism_client_options, reconnect_interval_ms) == 40 && sizeof(prism_client_options) == 48);
PRISM_ABI(offsetof(prism_quant_config, format) == 0 && offsetof(prism_quant_config, granularity) == 4);
PRISM_ABI(offsetof(prism_quant_config, block_size) == 8 && sizeof(prism_quant_config) == 12);
PRISM_ABI(offsetof(prism_block_layout, name) == 0 && offsetof(prism_block_layout, param_bytes_bf16) == 8);
PRISM_ABI(offsetof(prism_block_layout, shape) == 16 && offsetof(prism_block_layout, shape_len) == 24);
PRISM_ABI(offsetof(prism_block_layout, flops) == 32 && offsetof(prism_block_layout, activation_bytes_bf16) == 40);
PRISM_ABI(offsetof(prism_block_layout, state_bytes) == 48 && sizeof(prism_block_layout) == 56);
PRISM_ABI(offsetof(prism_model_layout, model_id) == 0 && offsetof(prism_model_layout, quant) == 8);
PRISM_ABI(offsetof(prism_model_layout, blocks) == 24 && offsetof(prism_model_layout, n_blocks) == 32);
PRISM_ABI(sizeof(prism_model_layout) == 40);
PRISM_ABI(offsetof(prism_client_runtime_hints, map_version) == 0 && offsetof(prism_client_runtime_hints, max_inflight_h2d) == 8);
PRISM_ABI(offsetof(prism_client_runtime_hints, max_inflight_d2h) == 12 && offsetof(prism_client_runtime_hints, prefetch_window) == 16);
PRISM_ABI(offsetof(prism_client_runtime_hints, suppress_prefetch_in_backward) == 20 && offsetof(prism_client_runtime_hints, suppress_prefetch_in_optimizer) == 21);
PRISM_ABI(offsetof(prism_client_runtime_hints, vram_pressure_threshold) == 24 && sizeof(prism_client_runtime_hints) == 32);
PRISM_ABI(offsetof(prism_client_state, map_version) == 0 && offsetof(prism_client_state, decided_step) == 8);
PRISM_ABI(offsetof(prism_client_state, effective_step) == 16 && offsetof(prism_client_state, map_blocks) == 24);
PRISM_ABI(offsetof(prism_client_state, registered) == 28 && offsetof(prism_client_state, connected) == 29);
PRISM_ABI(offsetof(prism_client_state, hints_mapped) == 30 && offsetof(prism_client_state, upstream_connected) == 31);
PRISM_ABI(offsetof(prism_client_state, calibration_needed) == 32 && offsetof(prism_client_state, run_calibration) == 33);
PRISM_ABI(offsetof(prism_client_state, calibration_samples) == 36 && offsetof(prism_client_state, low_precision) == 40);
PRISM_ABI(offsetof(prism_client_state, hints) == 48 && offsetof(prism_client_state, scale_mode) == 80);
/* The numerics config (issue 17), appended. */
PRISM_ABI(offsetof(prism_client_state, amax_history_len) == 84 && offsetof(prism_client_state, scale_margin) == 88);
PRISM_ABI(offsetof(prism_client_state, low_auto) == 92 && offsetof(prism_client_state, n_low_formats) == 96);
PRISM_ABI(offsetof(prism_client_state, low_formats) == 100 &&
          offsetof(prism_client_state, n_calibration_formats) == 116);
PRISM_ABI(offsetof(prism_client_state, calibration_formats) == 120 && sizeof(prism_client_state) == 136);
PRISM_ABI(offsetof(prism_block_fractions, saturated) == 0 && offsetof(prism_block_fractions, underflowed) == 8);
PRISM_ABI(sizeof(prism_block_fractions) == 16);
PRISM_ABI(sizeof(prism_client_counters) == 152); /* 19 uint64_t counters */
PRISM_ABI(offsetof(prism_block_tensor_stats, block_id) == 0 && offsetof(prism_block_tensor_stats, x_l2) == 8);
PRISM_ABI(offsetof(prism_block_tensor_stats, x_max_abs) == 16 && offsetof(prism_block_tensor_stats, x_numel) == 24);
PRISM_ABI(offsetof(prism_block_tensor_stats, w_l2) == 32 && offsetof(prism_block_tensor_stats, w_max_abs) == 40);
PRISM_ABI(offsetof(prism_block_tensor_stats, w_numel) == 48 && offsetof(prism_block_tensor_stats, y_numel) == 56);
PRISM_ABI(sizeof(prism_block_tensor_stats) == 64);
PRISM_ABI(offsetof(prism_client_plan, has_plan) == 0 && offsetof(prism_client_plan, high_fp16) == 1);
PRISM_ABI(offsetof(prism_client_plan, low_format) == 4 && offsetof(prism_client_plan, map_version) == 8);
PRISM_ABI(offsetof(prism_client_plan, low_blocks) == 16 && offsetof(prism_client_plan, predicted_iteration_seconds) == 24);
PRISM_ABI(offsetof(prism_client_plan, compute_seconds) == 32 && offsetof(prism_client_plan, device_class) == 40);
PRISM_ABI(sizeof(prism_client_plan) == 168);

/* include/prism/transfer.h, as python/prism/transfer.py declares it. */
PRISM_ABI(offsetof(prism_transfer_options, backend) == 0 && offsetof(prism_transfer_options, device) == 4);
PRISM_ABI(offsetof(prism_transfer_options, staging_buffers) == 8 &&
          offsetof(prism_transfer_options, max_block_bytes) == 16);
PRISM_ABI(offsetof(prism_transfer_options, quant) == 24 && offsetof(prism_transfer_options, conductor) == 32);
PRISM_ABI(offsetof(prism_transfer_options, scale_mode) == 40 &&
          offsetof(prism_transfer_options, amax_history_len) == 44);
PRISM_ABI(offsetof(prism_transfer_options, scale_margin) == 48 && sizeof(prism_transfer_options) == 56);
PRISM_ABI(offsetof(prism_transfer_ticket, seq) == 0 && offsetof(prism_transfer_ticket, verdict) == 8);
PRISM_ABI(sizeof(prism_transfer_ticket) == 16);
PRISM_ABI(offsetof(prism_transfer_counters, fetches) == 0 && offsetof(prism_transfer_counters, wire_bytes) == 40);
PRISM_ABI(offsetof(prism_transfer_counters, bf16_bytes) == 80 && offsetof(prism_transfer_counters, prefetches) == 120);
PRISM_ABI(offsetof(prism_transfer_counters, refused) == 128 && offsetof(prism_transfer_counters, demand_waits) == 168);
PRISM_ABI(offsetof(prism_transfer_counters, demand_over_limit) == 176 &&
          offsetof(prism_transfer_counters, prepares) == 184);
PRISM_ABI(offsetof(prism_transfer_counters, nonfinite) == 192 && offsetof(prism_transfer_counters, quantized) == 200);
PRISM_ABI(offsetof(prism_transfer_counters, saturated) == 240 &&
          offsetof(prism_transfer_counters, underflowed) == 280);
PRISM_ABI(sizeof(prism_transfer_counters) == 320);
