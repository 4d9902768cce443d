/* Snapshots (DESIGN 7): the policy thread publishes an immutable copy of what REST and
 * /metrics show after every change; HTTP handlers take a reference to the latest one and never
 * touch live job state. */
#ifndef PRISMD_SNAPSHOT_H
#define PRISMD_SNAPSHOT_H

#include "policy.h"
#include "store.h"

#include <pthread.h>
#include <stdatomic.h>

#define PRISMD_REASONS (PRISM_REASON_MAX + 1) /* prism_reason values */
#define PRISMD_DECISION_BUCKETS 8

extern const double prismd_decision_buckets[PRISMD_DECISION_BUCKETS]; /* seconds, upper bounds */

/* A rank is lagging when it is connected and its last step is more than this many steps behind
 * the newest step any rank of its job reported (GET /v1/jobs/{job}/ranks). */
#define PRISMD_RANK_LAG_STEPS 2
/* node, device_class and device_name are kept to at most this many bytes (cut at a UTF-8
 * character boundary). */
#define PRISMD_RANK_TEXT_MAX 255

/* What prismd knows of one rank of a job (DESIGN 6, GET /v1/jobs/{job}/ranks): the policy
 * thread keeps one per rank that ever sent a Hello, and snapshots carry copies. Strings are
 * owned by the struct (prismd_rank_facts_clear frees them); has_* false means not known (null). */
typedef struct prismd_rank_facts {
    uint32_t rank;
    bool connected;               /* a Connect stream of this rank is bound to the job */
    char *node;                   /* from the last Hello */
    bool has_device;              /* the last Hello carried a DeviceProfile */
    char *device_class, *device_name;
    uint64_t memory_bytes;
    double bf16_ops_per_second, fp16_ops_per_second, int8_ops_per_second, fp8_ops_per_second;
    double h2d_bytes_per_second;
    double quantize_fixed_seconds, quantize_seconds_per_byte; /* its quantize_cost */
    bool has_step;
    uint64_t last_step;           /* the highest step of its accepted reports */
    bool has_ack;
    uint64_t acked_map_version, applied_step; /* its last Ack */
    bool has_reports_dropped, has_late_switches; /* from its last Heartbeat */
    uint64_t reports_dropped, late_switches;
} prismd_rank_facts;

/* A copy of src with its own strings; false (dst cleared) when memory runs out. */
bool prismd_rank_facts_copy(prismd_rank_facts *dst, const prismd_rank_facts *src);
void prismd_rank_facts_clear(prismd_rank_facts *f);
/* Copies text (a rank's node and device, a block's name) into a new string of at most
 * PRISMD_RANK_TEXT_MAX bytes, cut before a UTF-8 character that would not fit whole; NULL when
 * memory runs out. */
char *prismd_text_copy(const char *text);
/* lagging of the ranks answer: connected, and either more than PRISMD_RANK_LAG_STEPS behind
 * newest (the newest step any rank reported; has_newest false: none did) or reported nothing
 * while another rank has. f may be NULL (a rank that never connected: not lagging). */
bool prismd_rank_lagging(const prismd_rank_facts *f, bool has_newest, uint64_t newest);
/* acked_current_map: its last Ack names map_version, or the job has no map yet (version 0). */
bool prismd_rank_acked_current(const prismd_rank_facts *f, uint64_t map_version);

/* An immutable text shared by reference count (atomic: snapshots are released on REST threads):
 * a plan object is made once and every snapshot that shows it holds a reference, not a copy. */
typedef struct prismd_shared_text prismd_shared_text;

/* A new text of the len bytes at s (with a NUL after them), one reference; NULL: out of memory. */
prismd_shared_text *prismd_shared_text_create(const char *s, size_t len);
prismd_shared_text *prismd_shared_text_retain(prismd_shared_text *t); /* t may be NULL */
void prismd_shared_text_release(prismd_shared_text *t);              /* t may be NULL */
const char *prismd_shared_text_str(const prismd_shared_text *t);

/* One device class of the plan in force, as pushed to its agents (prism.v1.ComputePlan). */
typedef struct prismd_plan_class {
    char *name;
    prism_precision low_format;  /* PRISM_PRECISION_INT8 or FP8_E4M3 */
    const char *high_format;     /* "bf16" or "fp16" (static text) */
    uint32_t *low_blocks;        /* ascending */
    size_t nlow;
    double compute_seconds;      /* f_k(0) */
} prismd_plan_class;

/* What GET /v1/jobs/{job}/plan and /metrics show (a snapshot's copy; strings owned). */
typedef struct prismd_plan_view {
    bool hybrid;
    const char *status;          /* static text: disabled, single_class, waiting_for_statistics, planned, refused */
    char *message;
    char **classes_seen;         /* byte order */
    size_t nclasses_seen;
    uint64_t blocks_missing;     /* blocks 0..L-1 without both halves of their statistics or gradients */
    bool has_plan;
    uint64_t map_version, decided_step, effective_step; /* of the map the plan in force went out with */
    uint64_t replans, kept, refused; /* since prismd started */
    prismd_shared_text *plan_json; /* the plan object (hybrid_json.h), a reference; NULL: none */
    double iteration_seconds;
    prismd_plan_class *classes;  /* of the plan in force: compute_seconds and low blocks per class */
    size_t nclasses;
} prismd_plan_view;

void prismd_plan_view_free(prismd_plan_view *v);

typedef struct prismd_snap_job {
    char id[129];
    uint32_t world_size;
    uint32_t agents;             /* Connect streams bound to the job */
    bool has_step;
    uint64_t last_step;          /* the last step the policy collected */
    uint64_t map_version, decided_step, effective_step;
    prism_config config;         /* in force */
    bool has_summary;            /* a decision was made since start (or restored with the job) */
    prism_summary summary;       /* of the last decision */
    double decided_unix;         /* with has_summary: the last decision's wall-clock time, Unix
                                  * seconds; NaN: not known */
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
    size_t nranks;
    prismd_rank_facts *ranks;    /* ascending rank, only ranks that sent a Hello; the rest unknown */
    bool has_newest_step;
    uint64_t newest_step;        /* the newest step any rank reported */
    uint32_t ranks_lagging;      /* ranks with prismd_rank_lagging */
    uint32_t ranks_not_acked;    /* connected ranks without prismd_rank_acked_current */
    uint64_t late_switches;      /* the ranks' late_switches summed (unknown ones count 0; at most
                                  * UINT64_MAX) */
    uint64_t decisions;          /* decisions made for the job since prismd started */
    prism_policy_counters counters; /* loss spikes, their decisions and rollbacks (kept by the store) */
    prismd_plan_view plan;       /* hybrid-device plans (GET .../plan, /metrics) */
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
    uint64_t maps_unsent;                                       /* broadcasts put off for want of memory */
    uint64_t store_retries;                                     /* failed retries of an unsent map's save */
    uint64_t tensor_stats_accepted, tensor_stats_refused;       /* BlockTensorStats entries (hybrid plans) */
    uint64_t tokens_loads_ok, tokens_loads_failed, tokens_provisioned;
    uint64_t decision_buckets[PRISMD_DECISION_BUCKETS]; /* cumulative counts per bucket */
    uint64_t decision_count;
    double decision_seconds;
    prismd_store_writes store_writes; /* the store's committed write transactions */
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
