/* The replay trace format of `prismctl replay` (one JSON object per line):
 *   {"step": S, "rank": R, "loss": L, "blocks": [{"id", "l2", "max_abs", "mean", "variance",
 *    "numel", "nonfinite", "saturated", "underflowed"}]}
 *                                         rank, loss, mean, variance, nonfinite optional; saturated
 *                                         and underflowed (fractions in [0, 1], issue 17) both or neither
 *   {"calibration": {"format": "int8", "errors": {"<id>": e}}}
 *   {"layout": {"blocks": [{"id": I, "param_bytes_bf16": B}]}}   BF16 sizes, as a Hello carries
 * Blank lines are skipped. */
#ifndef PRISM_POLICY_TRACE_H
#define PRISM_POLICY_TRACE_H

#include "policy.h"

typedef enum prism_trace_kind {
    PRISM_TRACE_BLANK = 0,
    PRISM_TRACE_STEP,
    PRISM_TRACE_CALIBRATION,
    PRISM_TRACE_LAYOUT,
    PRISM_TRACE_HEADER, /* binary traces only (trace_bin.h): a segment starts */
    PRISM_TRACE_CONFIG  /* binary traces only: a new policy config */
} prism_trace_kind;

typedef struct prism_trace_entry {
    uint32_t block_id;
    double value;     /* relative error (calibration) */
    uint64_t bytes;   /* param_bytes_bf16 (layout) */
} prism_trace_entry;

typedef struct prism_trace_record {
    prism_trace_kind kind;
    uint64_t step;
    uint32_t rank;
    bool has_loss;
    double loss;
    prism_block_stats *blocks; /* step: count entries */
    prism_trace_entry *entries; /* calibration, layout: count entries */
    size_t count;
    size_t cap_blocks, cap_entries;
    prism_precision format;    /* calibration */
    /* Binary traces only (trace_bin.h). */
    bool merged;               /* step: already merged over ranks (feed it to the policy, not a merger) */
    uint32_t ranks;            /* step: ranks merged into it */
    bool version_bumped;       /* step: its decision committed a new map version for a hybrid plan alone */
    uint64_t segment;          /* header */
    uint64_t unix_time_ms;     /* header */
    bool restored;             /* header: prismd restored the job from its store before this segment */
    bool gap_before;           /* header: records of the job were lost before this segment (a failed write) */
    char *job_id;              /* header (owned, NUL-terminated) */
    char *config_json;         /* header, config: the config as JSON text (owned, NUL-terminated) */
} prism_trace_record;

void prism_trace_record_init(prism_trace_record *r);
void prism_trace_record_free(prism_trace_record *r);

/* Parses one line into r (reusing its arrays). Errors name the field, e.g. "blocks[2].l2:
 * expected a number >= 0"; the caller adds the file and line. */
prism_status prism_trace_parse_line(const char *line, size_t len, prism_trace_record *r, prism_error *err);

/* Grows *arr (of *cap elements of size bytes) to hold at least need elements: doubling from 64. */
prism_status prism_trace_reserve(void **arr, size_t *cap, size_t need, size_t size, prism_error *err);

/* "blocks[I].id: block B appears twice in this line" when a block id repeats. */
prism_status prism_trace_check_unique_ids(const prism_block_stats *blocks, size_t n, prism_error *err);

#endif
