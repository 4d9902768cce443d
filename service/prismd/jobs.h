/* prismd's jobs: every job's policy, rank merge, agents and watchers, owned by the policy thread
 * alone (DESIGN 7). The gRPC layer (rpc.c) hands it decoded requests and gets back bytes to
 * send or a status to end a call with; nothing here knows about completion queues. The jobs send
 * on a call through stream.h, which rpc.c implements; they never include rpc.h. */
#ifndef PRISMD_JOBS_H
#define PRISMD_JOBS_H

#include "auth.h"
#include "commands.h"
#include "config.h"
#include "mem_limits.h"
#include "prism/common.h"
#include "snapshot.h"
#include "store.h"
#include "stream.h"

typedef struct prismd_job prismd_job;
typedef struct prismd_jobs prismd_jobs;

/* What a call is bound to, kept by rpc.c inside its call state. */
typedef struct prismd_peer {
    prismd_job *job;  /* NULL until Hello (Connect) or the request (Watch) */
    uint32_t rank;    /* Connect: the Hello's rank */
    bool watcher;
    char *auth;       /* the bearer token of the call's metadata, or NULL; owned by rpc.c */
    char *address;    /* the client's address without its port ("ipv4:10.0.0.7"), or NULL; owned by rpc.c */
} prismd_peer;

/* A gRPC status code (0: OK) and its message, to end a call with. */
typedef struct prismd_status {
    int code;
    char message[256];
} prismd_status;

/* The Conductor-style transfer limits prismd sends each agent (DESIGN 9): libprism applies them
 * locally; prismd only chooses their parameters. */
typedef struct prismd_hints {
    uint32_t max_inflight_h2d;
    uint32_t max_inflight_d2h;
    uint32_t prefetch_window;
    double vram_pressure_threshold;
    bool suppress_prefetch_in_backward;
    bool suppress_prefetch_in_optimizer;
} prismd_hints;

typedef struct prismd_jobs_limits {
    size_t max_jobs;
    size_t max_blocks;   /* per job */
    bool auto_create;    /* a Hello for an unknown job creates it; false: NOT_FOUND */
    const char *admin_token; /* accepted for every job's mutations; NULL: none */
    const char *data_dir;    /* jobs' files (telemetry) go under DATA_DIR/jobs/JOB/; NULL: none */
    prismd_hints hints;      /* sent in every Welcome */
    bool require_read_token; /* reads need the job's or the admin token (DESIGN 6) */
    prismd_token_box *tokens; /* provisioned job tokens, reloaded by main.c; NULL: none */
    bool require_provisioned_tokens; /* a Hello for a job without a provisioned token is refused */
    int64_t idle_expiry_ms;  /* a job without agents and activity this long is deleted; 0: never */
    const prismd_memory_limits *mem; /* auto-created jobs per address, telemetry rotation; NULL: none */
    size_t hybrid_max_pairs;   /* (class, block) pairs of non-fixed classes one hybrid plan may have */
    size_t hybrid_max_classes; /* device classes a hybrid plan may have */
} prismd_jobs_limits;

typedef struct prismd_jobs_counters {
    uint64_t reports_accepted;
    uint64_t reports_rejected;   /* malformed: answered with an Error message */
    uint64_t reports_dropped_late;
    uint64_t reports_dropped_repeated;
    uint64_t block_records;
    uint64_t decisions;
    uint64_t updates_sent;
    uint64_t store_errors;     /* state not saved: its map was not sent */
    uint64_t store_retries;    /* failed retries of an unsent map's save (tick or Welcome; backing off) */
    uint64_t streams_refused;  /* Connect streams ended for a bad Hello, token or order */
    uint64_t streams_broken;   /* Connect streams whose read failed: an oversized message, a lost peer */
    uint64_t reports_step_out_of_range; /* step reports refused: step id above PRISM_STEP_MAX */
    uint64_t calibrations_accepted;
    uint64_t calibrations_malformed;    /* refused whole: a bad format, value or block */
    uint64_t calibrations_foreign;      /* refused: a fingerprint not the job's registered layout's */
    uint64_t unimplemented_calls;       /* gRPC calls of methods prismd does not serve */
    uint64_t agents_replaced;  /* Connect streams ended because a newer agent took their rank */
    uint64_t jobs_deleted;     /* by DELETE /v1/jobs/JOB */
    uint64_t jobs_expired;     /* by --job-idle-expiry */
    uint64_t tensor_stats_accepted; /* BlockTensorStats entries kept for hybrid plans */
    uint64_t tensor_stats_refused;  /* refused: an unknown block, a negative or non-finite figure */
    uint64_t maps_unsent;           /* maps not broadcast for want of memory (retried later) */
} prismd_jobs_counters;

/* Restores every job saved in store (which may be NULL: nothing is kept). The store stays the
 * caller's; jobs writes to it from then on. */
prismd_jobs *prismd_jobs_create(const prism_config *defaults, const prismd_jobs_limits *limits, prismd_store *store,
                                prismd_snapshots *snapshots, prism_error *err);
void prismd_jobs_destroy(prismd_jobs *j);

/* One AgentMessage of a Connect stream. Returns false, with *end filled, when the stream must
 * end (no Hello first, unknown job, wrong token, a Hello that does not fit the job). */
bool prismd_jobs_agent_message(prismd_jobs *j, prismd_stream *s, prismd_peer *peer, const uint8_t *data,
                               size_t len, int64_t now_ms, prismd_status *end);

/* A Connect stream's read failed (rpc.c cannot tell an oversized message from a lost peer). */
void prismd_jobs_stream_broken(prismd_jobs *j);

/* A call of a method prismd does not serve was answered UNIMPLEMENTED (counted for /metrics). */
void prismd_jobs_count_unimplemented(prismd_jobs *j);

/* A Connect or Watch stream is gone: forget it. */
void prismd_jobs_stream_gone(prismd_jobs *j, prismd_stream *s, prismd_peer *peer);

/* GetBlockMap: on success *out is a packed BlockMap (caller frees); else *end says why. */
bool prismd_jobs_get_block_map(prismd_jobs *j, const char *auth, const uint8_t *req, size_t len, uint8_t **out,
                               size_t *out_len, prismd_status *end);

/* Watch: binds s to the job and queues the current map when it is newer than after_version. */
bool prismd_jobs_watch(prismd_jobs *j, prismd_stream *s, prismd_peer *peer, const uint8_t *req, size_t len,
                       prismd_status *end);

/* Completes steps whose timeout passed and publishes a snapshot when something changed (at
 * once for decisions, agents and jobs; at most every 250 ms for plain steps). Returns
 * milliseconds until the next step may time out (-1: none). */
int64_t prismd_jobs_tick(prismd_jobs *j, int64_t now_ms);

/* Writes DATA_DIR/jobs/JOB/NAME into out; returns what snprintf returns. */
int prismd_job_file(const char *data_dir, const char *job_id, const char *name, char *out, size_t len);

/* Runs the queued REST mutations and answers them. Mutations of a job that has a token (or
 * when an admin token is set) need one of them as the request's bearer token. */
void prismd_jobs_run_commands(prismd_jobs *j, prismd_commands *q);

/* Ends every stream of every job (shutdown). */
void prismd_jobs_for_each_stream(prismd_jobs *j, void (*fn)(prismd_stream *s, void *ctx), void *ctx);

const prismd_jobs_counters *prismd_jobs_counters_get(const prismd_jobs *j);

#endif
