/* Rank merge of DESIGN 4.3: gathers every rank's report of a step and hands out complete,
 * merged steps in step order. A step is ready when all world_size ranks reported it, when
 * step_timeout_ms passed since its first report, when a later step became ready (ranks send
 * their steps in order), or when the caller closes everything. Time is passed in. */
#ifndef PRISM_POLICY_MERGE_H
#define PRISM_POLICY_MERGE_H

#include "policy.h"

/* Default limits: at most this many steps open at once (one more makes the oldest ready), and
 * at most this many distinct block ids (a report with a new id past it is refused). */
#define PRISM_MERGE_MAX_OPEN_STEPS 64
#define PRISM_MERGE_MAX_BLOCKS 1000000

typedef enum prism_merge_outcome {
    PRISM_MERGE_ACCEPTED = 0,
    PRISM_MERGE_DROPPED_LATE,      /* the step is not newer than the last one handed out */
    PRISM_MERGE_DROPPED_DUPLICATE  /* this rank already reported this step */
} prism_merge_outcome;

typedef struct prism_merge_counters {
    uint64_t accepted;
    uint64_t dropped_late;
    uint64_t dropped_duplicate;
    uint64_t timed_out;        /* steps handed out after their timeout with ranks missing */
    uint64_t closed_early;     /* steps handed out incomplete because a later one was ready */
} prism_merge_counters;

typedef struct prism_merged_step {
    uint64_t step;
    uint32_t ranks;            /* ranks that reported it */
    bool has_loss;             /* at least one rank sent a finite loss */
    double loss;               /* the mean of the finite losses sent (summed in the order added) */
    const prism_block_stats *blocks; /* valid until the next call on the merger */
    size_t count;
} prism_merged_step;

typedef struct prism_merger prism_merger;

prism_merger *prism_merger_create(uint32_t world_size, int64_t step_timeout_ms, prism_error *err);
void prism_merger_destroy(prism_merger *m);

/* Changes the limits above; max_open_steps >= 1 (an offline replay, whose ranks may come one
 * after another, allows many). Returns PRISM_ERR_INVALID for a zero limit. */
prism_status prism_merger_set_limits(prism_merger *m, size_t max_open_steps, size_t max_blocks, prism_error *err);

/* Adds one rank's report. A loss that is NaN or infinite is left out of the step's loss (the
 * report is accepted). A block's saturation figures are averaged over the ranks that sent them.
 * A malformed report (rank >= world_size, a step above PRISM_STEP_MAX,
 * duplicate block ids, bad figures) is an error; a report with a block id beyond max_blocks is PRISM_ERR_LIMIT; a
 * late or repeated one is dropped, counted and reported in *outcome. None of these changes a
 * step. Sums saturate: numel and nonfinite never wrap. */
prism_status prism_merger_add(prism_merger *m, uint32_t rank, uint64_t step, bool has_loss, double loss,
                              const prism_block_stats *blocks, size_t count, int64_t now_ms,
                              prism_merge_outcome *outcome, prism_error *err);

/* Treats every step up to and including step as handed out (after a restart: the steps the
 * saved state already holds). Later reports for them are dropped as late. */
void prism_merger_skip_to(prism_merger *m, uint64_t step);

/* Hands out the oldest ready step, if any. */
bool prism_merger_next(prism_merger *m, int64_t now_ms, prism_merged_step *out);

/* Makes every open step ready (end of a replay, shutdown). */
void prism_merger_close_all(prism_merger *m);

/* Milliseconds until the oldest open step times out (0 if one is ready now, -1 if none is open). */
int64_t prism_merger_wait_ms(const prism_merger *m, int64_t now_ms);

size_t prism_merger_open_steps(const prism_merger *m);
const prism_merge_counters *prism_merger_counters(const prism_merger *m);

#endif
