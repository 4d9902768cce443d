/* The policy core of DESIGN 4.2 to 4.4 and 4.7: per-block windows, scores, first assignment,
 * hysteresis, cooldown, the non-finite rule, modes, overrides, the loss-spike rollback, a low
 * format per block, the saturation rule and the telemetry summary of every decision. It does no
 * I/O, starts no thread and reads no clock: a caller (prismd's policy thread, `prismctl replay`)
 * feeds it complete, rank-merged steps in order. One
 * prism_policy is one job; it is not thread-safe, and needs no locking when one thread owns it. */
#ifndef PRISM_POLICY_POLICY_H
#define PRISM_POLICY_POLICY_H

#include "config.h"

/* Per block, per step statistics (DESIGN 3), one rank's or already merged over ranks. */
typedef struct prism_block_stats {
    uint32_t block_id;
    double l2_norm;   /* sqrt of the sum of squares over the block's gradient tensors */
    double max_abs;
    double mean;
    double variance;  /* population variance of the finite elements */
    uint64_t numel;   /* all elements, non-finite ones included */
    uint64_t nonfinite; /* NaN/Inf elements, left out of every other figure */
    /* Issue 17: the step's fractions of the block's elements that the quantizer saturated (the
     * clamp to the format's largest value changed the code: prism_quant_counts in kernels.h) and
     * flushed to zero (x != 0 quantized to 0).
     * Optional: has_saturation false (zero-initialised) when not reported. */
    bool has_saturation;
    double saturated_fraction;
    double underflowed_fraction;
} prism_block_stats;

/* A report is well formed when its figures are non-negative and nonfinite <= numel, and, when
 * it carries saturation figures, both are finite and in [0, 1].
 * NaN or Inf in l2_norm is allowed: the block counts as non-finite for that step. */
prism_status prism_block_stats_check(const prism_block_stats *s, prism_error *err);

/* True when the block's figures for this step may enter its window. */
bool prism_block_stats_finite(const prism_block_stats *s);

/* Values match the wire enum prism.v1.SwitchReason. */
typedef enum prism_reason {
    PRISM_REASON_NONE = 0, /* never changed: the state it was first reported in */
    PRISM_REASON_SCORE = 1,
    PRISM_REASON_OVERRIDE = 2,
    PRISM_REASON_MODE = 3,
    PRISM_REASON_NONFINITE = 4,
    PRISM_REASON_LOSS_SPIKE = 5,
    PRISM_REASON_FORMAT = 6,    /* a low block moved to its candidate low format (low_precision auto) */
    PRISM_REASON_SATURATION = 7 /* a low block whose saturated fraction passed saturation_threshold */
} prism_reason;

#define PRISM_REASON_MAX PRISM_REASON_SATURATION /* the largest value */

/* "none", "score", "override", "mode", "nonfinite", "loss_spike", "format", "saturation". */
const char *prism_reason_name(prism_reason r);

typedef struct prism_change {
    uint32_t block_id;
    prism_precision from, to;
    uint64_t step;
    prism_reason reason;
} prism_change;

/* What the policy knows of one block, as callers see it. */
typedef struct prism_block_view {
    /* (Fields grouped by size, 4-byte, then 8-byte, then the bools, so that the struct has no
     * padding but its tail: a decision at 100,000 blocks reads every view.) */
    uint32_t id;
    prism_precision precision;
    prism_reason reason;          /* of the last change */
    /* Issue 17, as of the last scheduled decision (or the block's first report). */
    prism_precision candidate;    /* the low format the block would get: under low_precision auto the first
                                     of low_formats whose calibration error is <= quant_error_threshold,
                                     else the last of them; otherwise low_precision */
    uint64_t last_switch_step;    /* valid when has_switch */
    double sensitivity;           /* s, in [0, 1] */
    double grad_score;
    double relative_magnitude;    /* mean of rel over the window */
    double error_score;           /* valid when has_error_score */
    uint64_t param_bytes_bf16;    /* 0: not reported */
    uint64_t hold_until;          /* the score rule does not move it low at a decision before this step
                                   * (at most PRISM_STEP_MAX); valid when held */
    double saturated_fraction;    /* mean over the window entries that carried figures */
    double underflowed_fraction;
    bool has_switch;              /* last_switch_step is valid */
    bool forced;                  /* in a force list of the active config (and enabled) */
    bool has_score;               /* false: empty window, or a mode that computes no score */
    bool has_error_score;         /* a calibration error for the candidate format is known */
    bool held;                    /* a loss spike rolled it back at some step: hold_until is valid (the
                                   * hold is in force while the step is below it; held stays set after) */
    bool has_saturation;          /* some entry of its window carried saturation figures */
} prism_block_view;

/* The figures of one decision (DESIGN 4.4, less the per-block details). */
typedef struct prism_summary {
    uint64_t step_id;
    uint64_t map_version;
    prism_precision low_precision;
    size_t blocks_bf16;
    size_t blocks_low;        /* "blocks_int8": blocks at the low precision, whatever its format */
    size_t precision_changes; /* blocks whose precision changed at this decision */
    size_t scored;            /* blocks with a score; the three sensitivities are null when 0 */
    double mean_sensitivity, max_sensitivity, min_sensitivity;
    double bandwidth_saving_pct; /* rounded to one decimal */
    size_t blocks_by_precision[PRISM_PRECISION_COUNT]; /* reported blocks per precision */
    bool loss_spike;          /* the decision's step was a loss spike */
} prism_summary;

typedef struct prism_step_result {
    bool decided;          /* a decision ran (scheduled, or a loss spike's of its own); summary is filled */
    bool scheduled;        /* the step was a scheduled decision step (DESIGN 4.2) */
    bool loss_spike;       /* the step was a loss spike (DESIGN 4.7) */
    size_t rolled_back;    /* blocks the spike sent to bf16 */
    bool map_changed;      /* map_version moved: send the map */
    uint64_t map_version;
    uint64_t decided_step;
    uint64_t effective_step; /* decided_step + apply_lag_steps */
    const prism_change *changes; /* valid until the next call on the policy */
    size_t change_count;
    prism_summary summary;
} prism_step_result;

typedef struct prism_policy prism_policy;

/* Copies cfg, which must be valid. Returns NULL (and fills err) on failure. */
prism_policy *prism_policy_create(const prism_config *cfg, prism_error *err);
void prism_policy_destroy(prism_policy *p);

/* The config in force (a new one set with prism_policy_set_config waits for the next decision). */
const prism_config *prism_policy_config(const prism_policy *p);

/* The config the next decision will use: the one set last, or the one in force. */
const prism_config *prism_policy_next_config(const prism_policy *p);

/* Validates and copies cfg; it takes effect at the next decision (DESIGN 4.2, 6). */
prism_status prism_policy_set_config(prism_policy *p, const prism_config *cfg, prism_error *err);

/* The BF16 byte size of a block's parameters, used to weight the bandwidth saving. */
prism_status prism_policy_set_block_bytes(prism_policy *p, uint32_t block_id, uint64_t bytes,
                                          prism_error *err);

/* A calibration error (DESIGN 4.5) for a block in a low format; used from the next decision on
 * whenever format is the config's low_precision. */
prism_status prism_policy_set_calibration(prism_policy *p, prism_precision format, uint32_t block_id,
                                          double relative_error, prism_error *err);

/* A whole calibration report: every error is checked (a low format, finite and >= 0) and every
 * block given room before any is set, so on error nothing is changed and *bad is the index of
 * the entry at fault. Used from the next decision on, as prism_policy_set_calibration. */
prism_status prism_policy_set_calibrations(prism_policy *p, prism_precision format, const uint32_t *block_ids,
                                           const double *errors, size_t count, size_t *bad, prism_error *err);

/* Feeds one complete step. Steps must come in increasing order and be at most PRISM_STEP_MAX;
 * block ids in one step must be distinct. On error nothing is changed. On a decision step runs
 * the decision. loss: the step's loss (the mean of its ranks' finite losses, merge.h), NULL when
 * it has none; a non-finite loss counts as none. */
prism_status prism_policy_add_step(prism_policy *p, uint64_t step, const double *loss,
                                   const prism_block_stats *blocks, size_t count, prism_step_result *out,
                                   prism_error *err);

/* Commits a new map version with the same precisions (prismd: a new hybrid compute plan must go
 * out with a map of its own when the decision changed none). Returns the new version; the map
 * it names is the current one, decided at the last step collected. */
uint64_t prism_policy_bump_version(prism_policy *p);

/* Loss spikes seen (every one, rolling back blocks or not), decisions of their own made off the
 * schedule for them, and blocks sent to bf16 by them. */
typedef struct prism_policy_counters {
    uint64_t loss_spikes;
    uint64_t loss_spike_decisions;
    uint64_t blocks_rolled_back;
} prism_policy_counters;

void prism_policy_counters_get(const prism_policy *p, prism_policy_counters *out);

/* Steps collected so far (n of DESIGN 4.2), last step id, current map version. */
uint64_t prism_policy_steps_collected(const prism_policy *p);
uint64_t prism_policy_map_version(const prism_policy *p);

/* The reported blocks in ascending id order; the view is valid until the next mutating call. */
size_t prism_policy_block_count(const prism_policy *p);
const prism_block_view *prism_policy_block(const prism_policy *p, size_t index);
/* One block by id, or NULL when it was never reported. */
const prism_block_view *prism_policy_find_block(const prism_policy *p, uint32_t block_id);

/* Every block the policy holds an input for, reported or not (a layout's BF16 size or a
 * calibration error may come before the block's first step), in the order the policy first met
 * each: prismd writes them at the start of each trace segment (trace_bin.h) so that a segment
 * replays on its own. index < prism_policy_input_count; bytes 0: not given; calibration NaN:
 * not known for that format. */
size_t prism_policy_input_count(const prism_policy *p);
void prism_policy_input(const prism_policy *p, size_t index, uint32_t *block_id, uint64_t *bytes,
                        double calibration[PRISM_PRECISION_COUNT]);

/* ---- saving and restoring a job (prismd's store) ----
 * What a policy must keep across a restart: its progress (with W, the losses of the spike rule,
 * and its counters), and per block the view (the candidate format and the spike's hold
 * included), whether the score has placed it yet, its calibration errors and its window (oldest
 * value first) with each entry's saturation figures. */

typedef struct prism_policy_progress {
    uint64_t steps_collected;
    bool has_last_step;
    uint64_t last_step;
    uint64_t map_version;
    /* Issue 17. */
    prism_policy_counters counters;
    uint32_t loss_len;     /* values in W, at most PRISM_LOSS_WINDOW_MAX */
    const double *losses;  /* restore: loss_len values, oldest first (NULL when loss_len is 0);
                              prism_policy_progress_get leaves it NULL: prism_policy_loss_window
                              copies them */
} prism_policy_progress;

#define PRISM_WINDOW_MAX 1000 /* history_window's upper bound (config.c) */

typedef struct prism_block_record {
    prism_block_view view;
    bool assigned;
    double calibration[PRISM_PRECISION_COUNT]; /* NaN: not known */
    uint32_t window_len;
    double *window; /* prism_policy_block_record fills the caller's PRISM_WINDOW_MAX doubles here */
    /* Issue 17, parallel to window: each entry's saturation figures. All three NULL: not wanted
     * (block_record) or none known (restore: the entries carry none); else PRISM_WINDOW_MAX
     * entries of room each. */
    uint8_t *window_has_saturation;
    double *window_saturated;
    double *window_underflowed;
} prism_block_record;

void prism_policy_progress_get(const prism_policy *p, prism_policy_progress *out);

/* Copies W (oldest first) into out, room for PRISM_LOSS_WINDOW_MAX doubles; returns the count. */
size_t prism_policy_loss_window(const prism_policy *p, double *out);

/* The record of the block at index (ascending id order, as prism_policy_block). The caller sets
 * four fields before the call, all others are written: out->window, room for PRISM_WINDOW_MAX
 * doubles; and window_has_saturation, window_saturated, window_underflowed, either all NULL (the
 * figures are not wanted) or each room for PRISM_WINDOW_MAX entries. Start from a zeroed record
 * (`prism_block_record r = {.window = room};`): a pointer left uninitialised is written through. */
void prism_policy_block_record(const prism_policy *p, size_t index, prism_block_record *out);

/* Puts a saved state into a policy that has seen no step yet. Each block's view (its scores of
 * the last decision included) is shown as saved until the next decision recomputes it. Windows
 * longer than the config's history_window, and a W longer than loss_spike_window, keep their
 * newest values. Losses must be finite and saturation figures in [0, 1]. */
prism_status prism_policy_restore(prism_policy *p, const prism_policy_progress *progress,
                                  const prism_block_record *blocks, size_t count, prism_error *err);

#endif
