/* Snapshots (DESIGN 7): the policy thread publishes an immutable copy of what REST and
 * /metrics show after every change; HTTP handlers take a reference to the latest one and never
 * touch live job state. */
#ifndef PRISMD_SNAPSHOT_H
#define PRISMD_SNAPSHOT_H

#include "policy.h"

#include <pthread.h>
#include <stdatomic.h>

#define PRISMD_REASONS 6 /* prism_reason values */
#define PRISMD_DECISION_BUCKETS 8

extern const double prismd_decision_buckets[PRISMD_DECISION_BUCKETS]; /* seconds, upper bounds */

typedef struct prismd_snap_job {
    char id[129];
    uint32_t world_size;
    uint32_t agents;             /* Connect streams bound to the job */
    bool has_step;
    uint64_t last_step;          /* the last step the policy collected */
    uint64_t map_version, decided_step, effective_step;
    prism_config config;         /* in force */
    bool has_summary;            /* a decision was made since start */
    prism_summary summary;       /* of the last decision */
    size_t nblocks;
    prism_block_view *blocks;    /* ascending id */
    char **names;                /* parallel to blocks: the layout's name, or NULL */
    char *token;                 /* the job's bearer token in force (never shown), or NULL */
    bool hints_sent;             /* runtime hints went to an agent of the job */
    uint32_t hints_h2d, hints_d2h, hints_prefetch;
    double hints_vram;
    bool hints_suppress_backward, hints_suppress_optimizer;
    uint64_t hints_map_version;
    uint64_t switches[PRISMD_REASONS]; /* changes since start, by reason */
    _Atomic(char *) blocks_json; /* GET .../blocks, rendered by the first request that needs it */
    _Atomic(char *) blocks_gzip; /* the same, gzip-compressed (length-prefixed, see rest.c) */
} prismd_snap_job;

typedef struct prismd_snapshot {
    atomic_int refs;
    size_t njobs;
    prismd_snap_job *jobs;       /* ascending id */
    /* service-wide counters */
    uint64_t reports_accepted, reports_rejected, reports_dropped_late, reports_dropped_repeated;
    uint64_t block_records, decisions, updates_sent, store_errors, agents_refused, streams_broken;
    uint64_t reports_step_out_of_range, calibrations_accepted, calibrations_malformed, calibrations_foreign;
    uint64_t unimplemented_calls;
    uint64_t agents_replaced, jobs_deleted, jobs_expired;        /* auth.h, jobs.c */
    uint64_t tokens_loads_ok, tokens_loads_failed, tokens_provisioned;
    uint64_t decision_buckets[PRISMD_DECISION_BUCKETS]; /* cumulative counts per bucket */
    uint64_t decision_count;
    double decision_seconds;
    _Atomic(char *) jobs_json;   /* GET /v1/jobs, rendered once */
    _Atomic(char *) jobs_gzip;
} prismd_snapshot;

/* The cached text in *slot, or render()'s result stored there by the first caller (a race
 * renders twice and keeps one). The snapshot owns it. */
const char *prismd_snapshot_cached(_Atomic(char *) *slot, char *(*render)(const void *ctx), const void *ctx);

typedef struct prismd_snapshots {
    pthread_mutex_t lock;
    prismd_snapshot *current;
    void (*on_publish)(void *ctx); /* called after each publish (server-sent events); may be NULL */
    void *on_publish_ctx;
    atomic_llong policy_alive_ms;  /* CLOCK_MONOTONIC ms of the policy thread's last loop; 0: not started */
} prismd_snapshots;

void prismd_snapshots_init(prismd_snapshots *s);
void prismd_snapshots_destroy(prismd_snapshots *s);

/* Makes snap the current one (taking the caller's reference). */
void prismd_snapshots_publish(prismd_snapshots *s, prismd_snapshot *snap);

/* The current snapshot with one more reference (NULL before the first publish). */
prismd_snapshot *prismd_snapshots_get(prismd_snapshots *s);
void prismd_snapshot_release(prismd_snapshot *snap);

const prismd_snap_job *prismd_snapshot_find(const prismd_snapshot *snap, const char *job_id);

#endif
