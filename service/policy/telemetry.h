/* Telemetry records of DESIGN 4.4: one JSON object per decision, written as one line. */
#ifndef PRISM_POLICY_TELEMETRY_H
#define PRISM_POLICY_TELEMETRY_H

#include "policy.h"

/* A growable text buffer. */
typedef struct prism_buf {
    char *data;
    size_t len, cap;
} prism_buf;

void prism_buf_free(prism_buf *b);
prism_status prism_buf_append(prism_buf *b, const char *s, size_t n);

/* Appends the shortest decimal text that reads back as exactly x (JSON has no NaN/Inf: those
 * are written as null). */
prism_status prism_buf_append_double(prism_buf *b, double x);

/* Appends the record of the decision summarised in s, with the details of every block of p,
 * and a newline. Keys: step_id, timestamp, blocks_bf16, blocks_int8, mean_sensitivity,
 * max_sensitivity, min_sensitivity, precision_changes, estimated_bandwidth_saving_pct,
 * low_precision ("auto" under auto), map_version, then "loss" only when loss is not NULL (prismd's records: the
 * decision step's loss, the mean over the ranks that reported one; the dashboard charts it),
 * then block_details (each block's saturated_fraction and underflowed_fraction only when it has
 * saturation figures), then blocks_by_precision (every precision name in enum order, zeros
 * included) and loss_spike (DESIGN 4.7). */
prism_status prism_telemetry_append(prism_buf *b, const prism_policy *p, const prism_summary *s,
                                    double timestamp, const double *loss);

#endif
