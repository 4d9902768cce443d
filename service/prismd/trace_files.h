/* A job's binary trace on disk (DESIGN 4.6, trace_bin.h): the policy thread appends each record
 * the job's policy was given, in order, to DATA_DIR/jobs/JOB/trace/NNNNNN.ptrace, a segment at a
 * time (--trace-segment-bytes), all segments together bounded by --trace-max-bytes (the oldest
 * deleted and counted). Every segment begins with a header (the config in force), a layout of
 * every block with a known BF16 size, a calibration record per format the policy holds errors
 * for, and the config set for the next decision when it differs: a segment replays on its own.
 * GET /v1/jobs/JOB/trace streams the segments back, oldest first, each cut at its last whole
 * record. */
#ifndef PRISMD_TRACE_FILES_H
#define PRISMD_TRACE_FILES_H

#include "mem_limits.h"
#include "policy.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

/* ---- writing (the policy thread) ---- */

typedef struct prismd_trace prismd_trace;

/* The trace of job_id under data_dir (nothing is read or written yet). NULL when out of memory. */
prismd_trace *prismd_trace_create(const char *data_dir, const char *job_id);
void prismd_trace_destroy(prismd_trace *t);

/* The job was restored from the store: the next segment's header says so. */
void prismd_trace_mark_restored(prismd_trace *t);

/* Whether records are kept at all (a data directory and --trace-max-bytes > 0). */
bool prismd_trace_enabled(const prismd_memory_limits *m, const char *data_dir);

/* Appends one framed record (trace_bin.h's writers; kind is PRISMD_TRACE_*) that policy was just
 * given. The first record after prismd started and one that would take the segment past
 * --trace-segment-bytes start a new segment (numbered after the highest on disk; a file already
 * there is never overwritten) with the policy's state as it is now, and the record follows that
 * start. Each record or segment start is one write(2) to the local file, nothing else: a failed
 * write (or a trace directory that cannot be listed, or a segment that cannot be made) is logged
 * once per job and counted, the job's trace is off until its next segment, and that segment's
 * header says records were lost before it (gap_before). */
void prismd_trace_append(prismd_trace *t, const prismd_memory_limits *m, const prism_policy *policy, int kind,
                         const void *record, size_t len);

/* A record that could not be built (out of memory): counted and logged as a failed write, and
 * the job's trace is off until its next segment (a trace missing an input would replay wrong). */
void prismd_trace_lost(prismd_trace *t, const char *what);

/* ---- reading (GET /v1/jobs/JOB/trace, on libmicrohttpd's threads) ---- */

typedef struct prismd_trace_reader prismd_trace_reader;

/* A reader of the job's trace: its newest segments (at most 4096 files), oldest first, each
 * opened now (a segment deleted while the answer is sent is still sent whole). A job without a
 * trace gives an empty answer. Entries that are not regular files are passed over; a segment
 * deleted by the writer between the listing and its opening is left out with every older one
 * (as if dropped a moment earlier). Any other failure fails the open: PRISM_ERR_NOMEM, or
 * PRISM_ERR_UNAVAILABLE (out of file descriptors: try again), or PRISM_ERR_IO, with err naming
 * the segment; never an answer with a hole in it. */
prism_status prismd_trace_reader_open(const char *data_dir, const char *job_id, prismd_trace_reader **out,
                                      prism_error *err);

/* Up to max bytes of the trace into buf: each segment's whole records (a record still being
 * written, or cut by a failed write, is left out); 0 at the end, -1 on a read error. A read
 * error after some bytes were gathered returns those bytes; the next call returns -1. */
ssize_t prismd_trace_reader_read(prismd_trace_reader *r, char *buf, size_t max);

void prismd_trace_reader_close(prismd_trace_reader *r);

#endif
