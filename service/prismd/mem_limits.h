/* prismd's memory and disk limits (issue 12, item 5): what one client may make prismd hold, the
 * options that set it, and the counters that say how often a limit was reached. main.c fills one
 * prismd_memory_limits from its option table before any thread starts; it is read-only from then
 * on. The counters are atomics, written by whichever thread hits a limit and read by /metrics. */
#ifndef PRISMD_MEM_LIMITS_H
#define PRISMD_MEM_LIMITS_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct prismd_memory_limits {
    size_t telemetry_answer_bytes;    /* GET .../telemetry: record bytes one answer returns at most */
    size_t max_streamed_answers;      /* answers streamed from files or large maps at once */
    size_t max_metrics_streams;       /* /metrics answers streamed at once (a pool of their own) */
    size_t total_stream_buffer_bytes; /* unsent gRPC bytes over all calls (queues, GetBlockMap answers) */
    size_t max_auto_jobs_per_peer;    /* jobs a client address may auto-create (0: no limit) */
    size_t telemetry_max_bytes;       /* a job's telemetry file is rotated past this (0: never) */
    size_t telemetry_keep;            /* rotated telemetry files kept per job */
    size_t trace_max_bytes;           /* a job's binary trace segments together at most (0: no traces) */
    size_t trace_segment_bytes;       /* a new trace segment starts past this */
} prismd_memory_limits;

/* The record kinds of a binary trace, as prism_trace_records_total counts them. */
enum { PRISMD_TRACE_HEADER, PRISMD_TRACE_LAYOUT, PRISMD_TRACE_CALIBRATION, PRISMD_TRACE_CONFIG, PRISMD_TRACE_STEP,
       PRISMD_TRACE_KINDS };

/* Counted whenever a limit above was reached; /metrics shows them. */
typedef struct prismd_limit_counters {
    atomic_ullong telemetry_answers_truncated; /* answers cut at telemetry_answer_bytes */
    atomic_ullong streamed_answers_refused;    /* 503s past max_streamed_answers */
    atomic_ullong streamed_answers_active;     /* gauge */
    atomic_ullong metrics_streams_refused;     /* 503s past max_metrics_streams */
    atomic_ullong metrics_streams_active;      /* gauge */
    atomic_ullong streams_cut_stream_buffer;   /* gRPC streams ended past --stream-buffer-bytes */
    atomic_ullong streams_cut_total_buffer;    /* ... past --total-stream-buffer-bytes */
    atomic_ullong stream_buffer_bytes;         /* gauge: unsent bytes over all streams */
    atomic_ullong auto_jobs_refused;           /* Hellos refused past max_auto_jobs_per_peer */
    atomic_ullong telemetry_rotations;         /* telemetry files rotated */
    atomic_ullong telemetry_files_dropped;     /* rotated telemetry files deleted (the oldest) */
    atomic_ullong trace_bytes_written;         /* binary trace bytes written, all jobs */
    atomic_ullong trace_records[PRISMD_TRACE_KINDS]; /* trace records written, by kind */
    atomic_ullong trace_segments_dropped;      /* oldest trace segments deleted past trace_max_bytes */
    atomic_ullong trace_write_errors;          /* failed trace writes (the job's trace is off until its next segment) */
} prismd_limit_counters;

extern prismd_limit_counters prismd_limits;

/* Takes one of max_streamed_answers slots; false (and counted) when all are taken. */
bool prismd_streamed_answer_acquire(const prismd_memory_limits *m);
void prismd_streamed_answer_release(void);

/* The same for a streamed /metrics answer, from max_metrics_streams: a pool of its own, so that
 * REST clients holding every streamed answer cannot keep monitoring out. */
bool prismd_metrics_stream_acquire(const prismd_memory_limits *m);
void prismd_metrics_stream_release(void);

#endif
