/* The plan object of the hybrid model (issue 15 item 2) as JSON text: what `prismctl plan`
 * prints and what prismd stores and serves (GET /v1/jobs/{job}/plan), written by one function
 * so that the two cannot differ. Pure C, no I/O. */
#ifndef PRISM_POLICY_HYBRID_JSON_H
#define PRISM_POLICY_HYBRID_JSON_H

#include "hybrid.h"
#include "telemetry.h"

/* Appends the plan object of res (planned from p) to b, in the documented key order, on one
 * line without a newline: {"iteration_seconds", "start_seconds", "indicator", "classes": [...],
 * "baselines": {...}, "raises": [...]}. Doubles are written as the shortest text that reads back
 * exactly (prism_buf_append_double); block ids as integers. ids (may be NULL: the index is the id)
 * gives the id of each block index, for callers whose blocks are not numbered 0..L-1. */
prism_status prism_hybrid_json_write(prism_buf *b, const prism_hybrid_problem *p, const prism_hybrid_result *res,
                                     const uint32_t *ids);

#endif
