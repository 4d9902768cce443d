/* prismd's store (DESIGN 2, 7): SQLite in WAL mode under the data dir. Jobs with their token,
 * world size and config; each job's state (map version, steps, every block's precision, last
 * switch, calibration errors and window) written in one transaction at each decision boundary,
 * before the map is sent; the switch history; the calibration cache by model fingerprint.
 * Only the policy thread uses it. */
#ifndef PRISMD_STORE_H
#define PRISMD_STORE_H

#include "policy.h"

typedef struct prismd_store prismd_store;

/* The write transactions a store committed (its /metrics histogram,
 * prism_store_write_duration_seconds): each one's time from its first statement to its COMMIT
 * (a single statement in autocommit mode is its own transaction), on CLOCK_MONOTONIC. Counted
 * once committed; a write that failed or was rolled back is not (prism_store_errors_total counts
 * those). The schema made or migrated at open is not counted either: only what prismd writes
 * while it serves. */
#define PRISMD_STORE_WRITE_BUCKETS 12
extern const double prismd_store_write_buckets[PRISMD_STORE_WRITE_BUCKETS]; /* seconds, upper bounds */

typedef struct prismd_store_writes {
    uint64_t buckets[PRISMD_STORE_WRITE_BUCKETS]; /* cumulative: writes of at most each bound */
    uint64_t count;                                /* every committed write (the +Inf bucket) */
    double seconds;                                /* their times summed */
} prismd_store_writes;

/* The store's committed writes so far (all zero for a reader). */
void prismd_store_writes_get(const prismd_store *s, prismd_store_writes *out);

/* Opens (creating) DATA_DIR/prism.db. */
prismd_store *prismd_store_open(const char *data_dir, prism_error *err);

/* A read-only connection to an existing store, for another thread (REST's history). */
prismd_store *prismd_store_open_reader(const char *data_dir, prism_error *err);
void prismd_store_close(prismd_store *s);

prism_status prismd_store_save_job(prismd_store *s, const char *job_id, const char *token, uint32_t world_size,
                                   const prism_config *cfg, prism_error *err);

/* A job's hybrid-device plan as the store keeps it (table job_plan): the map the plan in force
 * went out with, the status of the last attempt ("planned", "refused", "none") and its message,
 * and the plan object (hybrid_json.h; NULL: no plan in force). */
typedef struct prismd_plan_row {
    uint64_t map_version, decided_step, effective_step;
    const char *status, *message, *plan_json;
} prismd_plan_row;

/* The job's whole state and the changes that led to it, in one transaction: every block's view
 * (the scores of the last decision included) and summary, the telemetry summary of the job's
 * last decision (NULL: none yet) and that decision's wall-clock time (Unix seconds; NaN: not
 * known; kept only with a summary), so that a restart serves the values served before it; and,
 * when plan is not NULL, the job's hybrid plan row (replacing the one kept). */
prism_status prismd_store_save_state(prismd_store *s, const char *job_id, const prism_policy *p,
                                     uint64_t decided_step, uint64_t effective_step, const prism_change *changes,
                                     size_t change_count, const prism_summary *summary, double decided_unix,
                                     const prismd_plan_row *plan, prism_error *err);

/* Calibration errors by model fingerprint (DESIGN 4.5), written by job_id: the first job to
 * write a fingerprint's errors owns that entry (until the job is deleted), in the same
 * transaction as the errors. */
prism_status prismd_store_save_calibration(prismd_store *s, const uint8_t *fingerprint, size_t fingerprint_len,
                                           const char *job_id, prism_precision format, const uint32_t *block_ids,
                                           const double *errors, size_t count, prism_error *err);

/* The job that owns a fingerprint's cached errors: 1 with its id in owner (cut to owner_len), 0
 * when no job does (nothing cached, or its writer was deleted), -1 on a store error. */
int prismd_store_calibration_owner(prismd_store *s, const uint8_t *fingerprint, size_t fingerprint_len, char *owner,
                                   size_t owner_len, prism_error *err);

/* Calls fn for each cached error of the fingerprint; returns how many there were (-1: error). */
long prismd_store_load_calibration(prismd_store *s, const uint8_t *fingerprint, size_t fingerprint_len,
                                   void (*fn)(void *ctx, prism_precision format, uint32_t block_id, double error),
                                   void *ctx, prism_error *err);

typedef struct prismd_switch_row {
    char from[16], to[16], reason[16];
    uint64_t step;
    uint64_t map_version;
} prismd_switch_row;

/* The newest switches of one block, newest first; returns how many (-1: error). */
long prismd_store_switch_history(prismd_store *s, const char *job_id, uint32_t block_id, prismd_switch_row *rows,
                                 size_t max, prism_error *err);

/* A job as saved: its policy is restored and owned by the callee from then on. */
typedef struct prismd_saved_job {
    const char *id;
    const char *token; /* NULL: none */
    uint32_t world_size;
    prism_policy *policy;
    uint64_t decided_step;
    uint64_t effective_step;
    bool has_summary;      /* the telemetry summary of the job's last decision was saved */
    prism_summary summary;
    double decided_unix;   /* with a summary: its decision's wall-clock time, Unix seconds; NaN: not known */
    bool has_plan_row;     /* the job_plan row: valid during the callback only */
    prismd_plan_row plan;
} prismd_saved_job;

/* Restores every saved job, calling fn for each; fn owns job->policy whatever it returns, and
 * returns false to stop with an error.
 * defaults fills keys a saved config lacks. */
prism_status prismd_store_load_jobs(prismd_store *s, const prism_config *defaults,
                                    bool (*fn)(void *ctx, prismd_saved_job *job), void *ctx, prism_error *err);

/* Removes the job, its state and its switch history in one transaction (the calibration cache,
 * kept by model fingerprint, stays). Deleting a job that is not there is no error. */
prism_status prismd_store_delete_job(prismd_store *s, const char *job_id, prism_error *err);

/* The wall-clock time (ms since the epoch) of the job's last agent activity, for
 * --job-idle-expiry across restarts. */
prism_status prismd_store_save_activity(prismd_store *s, const char *job_id, int64_t last_active_ms,
                                        prism_error *err);

/* Calls fn for each saved activity time; returns how many (-1: error). */
long prismd_store_load_activity(prismd_store *s, void (*fn)(void *ctx, const char *job_id, int64_t last_active_ms),
                                void *ctx, prism_error *err);

#endif
