/* Jobs (jobs.h): Hello and Welcome, step reports through the rank merge into the policy, and
 * every changed map pushed to all agents and watchers of the job with the same effective step. */
#define _POSIX_C_SOURCE 200809L
#define _XOPEN_SOURCE 700 /* nftw */
#include "jobs.h"
#include "stream.h"

#include "idmap.h"
#include "log.h"
#include "merge.h"
#include "plans.h"
#include "policy.h"
#include "telemetry.h"
#include "telemetry_files.h"
#include "trace_bin.h"
#include "trace_files.h"
#include "prism/v1/prism.pb-c.h"
#include "wire_check.h"

#include <grpc/status.h>
#include <jansson.h>
#include <errno.h>
#include <ftw.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <sys/stat.h>
#include <time.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define JOB_ID_MAX 128

typedef struct agent {
    prismd_stream *stream;
    prismd_peer *peer;      /* the stream's, cleared when the job lets go of the stream */
    uint32_t rank;
} agent;

typedef struct watcher {
    prismd_stream *stream;
    prismd_peer *peer;
} watcher;

struct prismd_job {
    char id[JOB_ID_MAX + 1];
    char *token;            /* NULL: the job takes any caller */
    uint32_t world_size;
    prism_policy *policy;
    prism_merger *merger;
    uint64_t decided_step;  /* of the current map */
    uint64_t effective_step;
    bool calibrated[PRISM_PRECISION_COUNT]; /* by format: the fingerprint has errors for it (cache or report) */
    uint8_t fingerprint[64]; /* the model's, from the layout of a Hello */
    size_t fingerprint_len;
    agent *agents;
    size_t nagents, cap_agents;
    watcher *watchers;
    size_t nwatchers, cap_watchers;
    prismd_rank_facts *ranks; /* ascending rank: each rank that sent a Hello (at most world_size) */
    size_t nranks, cap_ranks;
    bool has_newest_step;
    uint64_t newest_step;   /* the newest step of any rank's accepted reports */
    prism_idmap name_ix;    /* block id -> index in names */
    prism_idmap block_ix;   /* every block id of the job: its layouts', its accepted reports', its
                             * restored policy's; block_ix.count is what --max-blocks limits */
    char **names;           /* block names from the layouts of Hellos */
    size_t nnames, cap_names;
    bool hints_sent;        /* the hints last sent to an agent of the job */
    prismd_hints hints;
    uint64_t hints_map_version;
    FILE *telemetry;        /* the job's telemetry JSONL, opened at its first record */
    char telemetry_name[256]; /* the telemetry_file it was opened as */
    uint64_t telemetry_size;  /* bytes in it, for --telemetry-max-bytes */
    prismd_trace *trace;    /* the job's binary trace (DESIGN 4.6); NULL: none kept */
    char *creator;          /* the address that auto-created the job, or NULL (restored, provisioned) */
    uint64_t switches[PRISMD_REASONS];
    bool has_summary;
    prism_summary summary;  /* of the last decision */
    double decided_unix;    /* with has_summary: the last decision's wall-clock time, Unix seconds; NaN: not
                             * known (restored from a store written before prismd kept it) */
    int64_t last_active_ms; /* wall clock of the last agent message or disconnect (--job-idle-expiry) */
    int64_t saved_active_ms; /* the last_active_ms the store has */
    uint64_t decisions;     /* made since prismd started */
    prismd_plans *plans;    /* hybrid-device compute plans (DESIGN 11) */
    bool map_unsent;        /* the map in memory is not yet saved or not yet sent (a save or a
                             * broadcast failed): saved then broadcast at the next decision or tick */
    int64_t unsent_retry_ms; /* monotonic ms of the next retry at a tick */
    int64_t unsent_backoff_ms; /* the wait after the last failed save: 1 s doubling to 60 s; 0 after a success */
};

struct prismd_jobs {
    prism_config defaults;
    prismd_jobs_limits limits;
    prismd_store *store;
    prismd_snapshots *snapshots;
    prism_buf line;         /* scratch for telemetry records */
    prism_buf record;       /* scratch for trace records */
    bool dirty, urgent;     /* something REST shows changed since the last publish */
    int64_t last_publish_ms;
    uint64_t decision_buckets[PRISMD_DECISION_BUCKETS];
    uint64_t decision_count;
    double decision_seconds;
    prismd_job **jobs;
    size_t njobs, cap_jobs;
    prismd_jobs_counters counters;
    prismd_auth_rule rule;  /* admin token, --require-read-token */
    prismd_tokens *tokens;  /* provisioned job tokens in force; NULL: none */
    int64_t last_expiry_check_ms;
    uint64_t token_loads_failed_seen; /* a failed reload changes only /metrics */
    uint64_t store_writes_published;  /* the store's write count in the last snapshot */
};

/* Wall-clock milliseconds: job activity is kept across restarts, so it cannot be monotonic. */
static int64_t wall_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* Monotonic milliseconds, the clock of the now_ms rpc.c passes in (CLOCK_MONOTONIC). */
static int64_t mono_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static bool fail(prismd_status *end, int code, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

static bool fail(prismd_status *end, int code, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(end->message, sizeof end->message, fmt, ap);
    va_end(ap);
    end->code = code;
    return false;
}

/* Refuses, before unpacking, a message with a string that protobuf-c would cut at a NUL byte
 * (a Hello for job "x\0y" would join job "x") or pass on without checking its UTF-8. */
static bool strings_ok(const ProtobufCMessageDescriptor *desc, const uint8_t *data, size_t len, prismd_status *end)
{
    char path[128];
    if (prism_proto_strings_ok(desc, data, len, path, sizeof path))
        return true;
    return fail(end, GRPC_STATUS_INVALID_ARGUMENT, "%s: a string that is not UTF-8 or holds a NUL byte", path);
}

/* Whether id is one of the job's blocks (block_ix). */
static bool job_has_block(const prismd_job *job, uint32_t id)
{
    return prism_idmap_get(&job->block_ix, id) != PRISM_IDMAP_NONE;
}

/* Makes id one of the job's blocks; false when memory runs out. */
static bool job_add_block(prismd_job *job, uint32_t id)
{
    return job_has_block(job, id) || prism_idmap_put(&job->block_ix, id, 0) == PRISM_OK;
}

static prismd_job *job_new(prismd_jobs *j, const char *id, uint32_t world_size, const char *token,
                           prism_policy *policy, prismd_status *end);

static bool restore_job(void *ctx, prismd_saved_job *saved)
{
    prismd_jobs *j = ctx;
    prismd_status end;
    prismd_job *job = job_new(j, saved->id, saved->world_size, saved->token, saved->policy, &end);
    if (!job)
        return false;
    job->decided_step = saved->decided_step;
    job->effective_step = saved->effective_step;
    job->has_summary = saved->has_summary;
    job->summary = saved->summary;
    job->decided_unix = saved->has_summary ? saved->decided_unix : NAN;
    if (job->trace)
        prismd_trace_mark_restored(job->trace);
    prism_error perr;
    if (saved->has_plan_row &&
        !prismd_plans_restore(job->plans, &saved->plan, prism_policy_config(job->policy)->hybrid, &perr))
        prism_log(PRISM_LOG_ERROR, "the stored hybrid plan is not restored", "job", job->id, "error", perr.message,
                  LOG_END);
    /* Idle from the restart until the store says otherwise; saved_active_ms 0 (never saved) makes
     * housekeeping store this time once for a job that has no activity row yet (a schema-1 store),
     * so its idle time counts across later restarts too. */
    job->last_active_ms = wall_ms();
    job->saved_active_ms = 0;
    for (size_t i = 0; i < prism_policy_block_count(job->policy); i++)
        if (!job_add_block(job, prism_policy_block(job->policy, i)->id))
            return false;
    prism_policy_progress progress;
    prism_policy_progress_get(job->policy, &progress);
    if (progress.has_last_step)
        prism_merger_skip_to(job->merger, progress.last_step);
    char version[24];
    snprintf(version, sizeof version, "%llu", (unsigned long long)progress.map_version);
    prism_log(PRISM_LOG_INFO, "job restored", "job", job->id, "map_version", version, LOG_END);
    return true;
}

static prismd_job *find_job(const prismd_jobs *j, const char *id);

static void restore_activity(void *ctx, const char *job_id, int64_t last_active_ms)
{
    prismd_job *job = find_job(ctx, job_id);
    if (job)
        job->last_active_ms = job->saved_active_ms = last_active_ms;
}

prismd_jobs *prismd_jobs_create(const prism_config *defaults, const prismd_jobs_limits *limits, prismd_store *store,
                                prismd_snapshots *snapshots, prism_error *err)
{
    prismd_jobs *j = calloc(1, sizeof *j);
    if (!j) {
        prism_error_set(err, PRISM_ERR_NOMEM, "out of memory");
        return NULL;
    }
    if (prism_config_copy(&j->defaults, defaults, err)) {
        free(j);
        return NULL;
    }
    j->limits = *limits;
    j->store = store;
    j->snapshots = snapshots;
    j->urgent = true;
    j->rule = (prismd_auth_rule){limits->admin_token, limits->require_read_token};
    if (limits->tokens)
        prismd_token_box_take(limits->tokens, &j->tokens);
    if (store && (prismd_store_load_jobs(store, defaults, restore_job, j, err) ||
                  prismd_store_load_activity(store, restore_activity, j, err) < 0)) {
        prismd_jobs_destroy(j);
        return NULL;
    }
    return j;
}

static void job_free(prismd_job *job)
{
    for (size_t i = 0; i < job->nnames; i++)
        free(job->names[i]);
    free(job->names);
    prism_idmap_free(&job->name_ix);
    prism_idmap_free(&job->block_ix);
    if (job->telemetry)
        fclose(job->telemetry);
    prismd_trace_destroy(job->trace);
    prism_policy_destroy(job->policy);
    prism_merger_destroy(job->merger);
    prismd_plans_destroy(job->plans);
    free(job->token);
    free(job->creator);
    free(job->agents);
    free(job->watchers);
    for (size_t i = 0; i < job->nranks; i++)
        prismd_rank_facts_clear(&job->ranks[i]);
    free(job->ranks);
    free(job);
}

void prismd_jobs_destroy(prismd_jobs *j)
{
    if (!j)
        return;
    for (size_t i = 0; i < j->njobs; i++)
        job_free(j->jobs[i]);
    free(j->jobs);
    prismd_tokens_free(j->tokens);
    prism_config_free(&j->defaults);
    prism_buf_free(&j->line);
    prism_buf_free(&j->record);
    free(j);
}

const prismd_jobs_counters *prismd_jobs_counters_get(const prismd_jobs *j)
{
    return &j->counters;
}

static prismd_job *find_job(const prismd_jobs *j, const char *id)
{
    for (size_t i = 0; i < j->njobs; i++)
        if (strcmp(j->jobs[i]->id, id) == 0)
            return j->jobs[i];
    return NULL;
}

/* The job's token in force: its provisioned one, else the one its first Hello brought. */
static const char *job_token(const prismd_jobs *j, const prismd_job *job)
{
    const char *provisioned = prismd_tokens_find(j->tokens, job->id);
    return provisioned ? provisioned : job->token;
}

/* False with *end set (UNAUTHENTICATED or PERMISSION_DENIED) for a refusal a; true for OK. */
static bool refuse(prismd_status *end, const char *id, prismd_auth a)
{
    if (a == PRISMD_AUTH_MISSING)
        return fail(end, GRPC_STATUS_UNAUTHENTICATED,
                    "job %s: wrong or missing token (none was sent; the job's or the admin token is needed)", id);
    if (a == PRISMD_AUTH_WRONG)
        return fail(end, GRPC_STATUS_PERMISSION_DENIED,
                    "job %s: wrong or missing token (the one sent is neither the job's nor the admin token)", id);
    return true;
}

/* The auth rule (auth.h) for a gRPC call; false with *end set when it refuses. */
static bool grpc_authorized(const prismd_jobs *j, const char *id, const char *token, const char *bearer,
                            prismd_access access, prismd_status *end)
{
    return refuse(end, id, prismd_auth_check(&j->rule, token, bearer, access));
}

static bool grow(void **arr, size_t *cap, size_t need, size_t size)
{
    if (*cap >= need)
        return true;
    size_t ncap = *cap ? *cap * 2 : 8;
    while (ncap < need)
        ncap *= 2;
    void *n = realloc(*arr, ncap * size);
    if (!n)
        return false;
    *arr = n;
    *cap = ncap;
    return true;
}

/* The facts of rank in job, or NULL when it never sent a Hello. */
static prismd_rank_facts *rank_find(prismd_job *job, uint32_t rank)
{
    size_t lo = 0, hi = job->nranks;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (job->ranks[mid].rank == rank)
            return &job->ranks[mid];
        if (job->ranks[mid].rank < rank)
            lo = mid + 1;
        else
            hi = mid;
    }
    return NULL;
}

/* The facts of rank in job, added (all unknown) in rank order when it has none; NULL when memory
 * runs out. Pointers into job->ranks are not kept across calls: adding moves them. */
static prismd_rank_facts *rank_add(prismd_job *job, uint32_t rank)
{
    prismd_rank_facts *f = rank_find(job, rank);
    if (f)
        return f;
    if (!grow((void **)&job->ranks, &job->cap_ranks, job->nranks + 1, sizeof *job->ranks))
        return NULL;
    size_t at = job->nranks;
    while (at > 0 && job->ranks[at - 1].rank > rank)
        at--;
    memmove(&job->ranks[at + 1], &job->ranks[at], (job->nranks - at) * sizeof *job->ranks);
    job->nranks++;
    job->ranks[at] = (prismd_rank_facts){.rank = rank};
    return &job->ranks[at];
}

/* What a Hello says of its rank: node and DeviceProfile, replacing the previous Hello's. The
 * previous agent's Ack and trainer counters go with it (a new agent has acked nothing yet; it
 * tells its own in its Ack and Heartbeat); the last step the rank reported stays. false when
 * memory runs out: the rank's facts are then as they were, or a new entry with every fact
 * unknown. */
static bool rank_hello(prismd_job *job, const Prism__V1__Hello *h)
{
    prismd_rank_facts *f = rank_add(job, h->rank);
    if (!f)
        return false;
    const Prism__V1__DeviceProfile *d = h->device;
    char *node = prismd_text_copy(h->node ? h->node : "");
    char *cls = d ? prismd_text_copy(d->device_class ? d->device_class : "") : NULL;
    char *name = d ? prismd_text_copy(d->device_name ? d->device_name : "") : NULL;
    if (!node || (d && (!cls || !name))) {
        free(node);
        free(cls);
        free(name);
        return false;
    }
    if (!f->has_device != !d || (d && (!f->device_class || strcmp(f->device_class, cls) != 0)))
        prismd_plans_classes_changed(job->plans);
    prismd_rank_facts_clear(f);
    f->has_ack = false;
    f->acked_map_version = f->applied_step = 0;
    f->has_reports_dropped = f->has_late_switches = false;
    f->reports_dropped = f->late_switches = 0;
    f->connected = true;
    f->node = node;
    f->has_device = d != NULL;
    f->device_class = cls;
    f->device_name = name;
    f->memory_bytes = d ? d->memory_bytes : 0;
    f->bf16_ops_per_second = d ? d->bf16_ops_per_second : 0;
    f->fp16_ops_per_second = d ? d->fp16_ops_per_second : 0;
    f->int8_ops_per_second = d ? d->int8_ops_per_second : 0;
    f->fp8_ops_per_second = d ? d->fp8_ops_per_second : 0;
    f->h2d_bytes_per_second = d ? d->h2d_bytes_per_second : 0;
    f->quantize_fixed_seconds = d && d->quantize_cost ? d->quantize_cost->fixed_seconds : 0;
    f->quantize_seconds_per_byte = d && d->quantize_cost ? d->quantize_cost->seconds_per_byte : 0;
    return true;
}

/* Adds a job around policy (taken over, also on failure). */
static prismd_job *job_new(prismd_jobs *j, const char *id, uint32_t world_size, const char *token,
                           prism_policy *policy, prismd_status *end)
{
    prism_error err;
    prismd_job *job = calloc(1, sizeof *job);
    if (!job || !grow((void **)&j->jobs, &j->cap_jobs, j->njobs + 1, sizeof *j->jobs)) {
        free(job);
        prism_policy_destroy(policy);
        fail(end, GRPC_STATUS_RESOURCE_EXHAUSTED, "out of memory");
        return NULL;
    }
    snprintf(job->id, sizeof job->id, "%s", id);
    job->world_size = world_size;
    job->policy = policy;
    job->decided_unix = NAN;
    prism_idmap_init(&job->name_ix);
    prism_idmap_init(&job->block_ix);
    job->merger = prism_merger_create(world_size, prism_policy_config(policy)->step_timeout_ms, &err);
    job->plans = prismd_plans_create(j->limits.hybrid_max_pairs, j->limits.hybrid_max_classes);
    job->token = token && token[0] ? strdup(token) : NULL;
    if (prismd_trace_enabled(j->limits.mem, j->limits.data_dir) &&
        !(job->trace = prismd_trace_create(j->limits.data_dir, id)))
        prism_log(PRISM_LOG_ERROR, "out of memory: the job's trace is not kept", "job", id, LOG_END);
    if (!job->merger || !job->plans || (token && token[0] && !job->token) ||
        prism_merger_set_limits(job->merger, PRISM_MERGE_MAX_OPEN_STEPS, j->limits.max_blocks, &err)) {
        job_free(job);
        fail(end, GRPC_STATUS_RESOURCE_EXHAUSTED, "job %s: cannot be created", id);
        return NULL;
    }
    j->jobs[j->njobs++] = job;
    j->urgent = true;
    return job;
}

static prismd_job *create_job(prismd_jobs *j, const char *id, uint32_t world_size, const char *token,
                              prismd_status *end)
{
    if (j->njobs >= j->limits.max_jobs) {
        fail(end, GRPC_STATUS_RESOURCE_EXHAUSTED, "job %s: prismd already has %zu jobs, its limit", id, j->njobs);
        return NULL;
    }
    prism_error err;
    if (j->store && prismd_store_save_job(j->store, id, token && token[0] ? token : NULL, world_size, &j->defaults,
                                          &err)) {
        prism_log(PRISM_LOG_ERROR, "cannot save a new job", "job", id, "error", err.message, LOG_END);
        fail(end, GRPC_STATUS_UNAVAILABLE, "job %s: the store cannot save it", id);
        return NULL;
    }
    prism_policy *policy = prism_policy_create(&j->defaults, &err);
    if (!policy) {
        fail(end, GRPC_STATUS_RESOURCE_EXHAUSTED, "job %s: %s", id, err.message);
        return NULL;
    }
    prismd_job *job = job_new(j, id, world_size, token, policy, end);
    if (job)
        prism_log(PRISM_LOG_INFO, "job created", "job", id, "token", job->token ? "set" : "none", LOG_END);
    return job;
}

/* ---- the job's binary trace (DESIGN 4.6, trace_files.h) ----
 * Each input the job's policy was given goes to its trace right after the policy took it, in
 * the same order, so that `prismctl replay` of the trace decides as the policy did. */

/* Appends the record built in j->record (built: the writer's status). */
static void trace_put(prismd_jobs *j, prismd_job *job, int kind, prism_status built)
{
    if (built)
        prismd_trace_lost(job->trace, "a record (out of memory)");
    else
        prismd_trace_append(job->trace, j->limits.mem, job->policy, kind, j->record.data, j->record.len);
}

/* The first n blocks of a Hello's layout, given to the policy's block sizes. */
static void trace_layout(prismd_jobs *j, prismd_job *job, const Prism__V1__ModelLayout *l, size_t n)
{
    if (!job->trace || n == 0)
        return;
    uint32_t *ids = malloc(n * sizeof *ids);
    uint64_t *bytes = malloc(n * sizeof *bytes);
    prism_error err;
    prism_status built = PRISM_ERR_NOMEM;
    if (ids && bytes) {
        for (size_t i = 0; i < n; i++) {
            ids[i] = l->blocks[i]->id;
            bytes[i] = l->blocks[i]->param_bytes_bf16;
        }
        j->record.len = 0;
        built = prism_trace_bin_layout(&j->record, ids, bytes, n, &err);
    }
    trace_put(j, job, PRISMD_TRACE_LAYOUT, built);
    free(ids);
    free(bytes);
}

static void trace_calibration(prismd_jobs *j, prismd_job *job, prism_precision format, const uint32_t *ids,
                              const double *errors, size_t n)
{
    if (!job->trace || n == 0)
        return;
    prism_error err;
    j->record.len = 0;
    trace_put(j, job, PRISMD_TRACE_CALIBRATION, prism_trace_bin_calibration(&j->record, format, ids, errors, n, &err));
}

/* The cached errors a Hello's fingerprint gave the policy (cal_collect), a record per format. */
static void trace_cached_calibration(prismd_jobs *j, prismd_job *job, const Prism__V1__BlockError *cached,
                                     const prism_precision *formats, size_t n)
{
    if (!job->trace || n == 0)
        return;
    uint32_t *ids = malloc(n * sizeof *ids);
    double *errors = malloc(n * sizeof *errors);
    if (!ids || !errors) {
        prismd_trace_lost(job->trace, "a record (out of memory)");
    } else {
        for (int f = 0; f < PRISM_PRECISION_COUNT; f++) {
            size_t k = 0;
            for (size_t i = 0; i < n; i++)
                if (formats[i] == (prism_precision)f) {
                    ids[k] = cached[i].block_id;
                    errors[k++] = cached[i].relative_error;
                }
            trace_calibration(j, job, (prism_precision)f, ids, errors, k);
        }
    }
    free(ids);
    free(errors);
}

static void trace_config(prismd_jobs *j, prismd_job *job, const prism_config *cfg)
{
    if (!job->trace)
        return;
    prism_error err;
    j->record.len = 0;
    trace_put(j, job, PRISMD_TRACE_CONFIG, prism_trace_bin_config(&j->record, cfg, &err));
}

static void trace_step(prismd_jobs *j, prismd_job *job, const prism_merged_step *m, bool version_bumped)
{
    if (!job->trace)
        return;
    prism_error err;
    j->record.len = 0;
    trace_put(j, job, PRISMD_TRACE_STEP, prism_trace_bin_step(&j->record, m, version_bumped, &err));
}

/* ---- messages out ---- */

static Prism__V1__Precision wire_precision(prism_precision p)
{
    return (Prism__V1__Precision)p; /* the values match by design (common.h) */
}

/* The job's whole map as a PrecisionUpdate; the arrays live in *storage (freed by map_free). */
typedef struct map_storage {
    Prism__V1__BlockPrecision *blocks;
    Prism__V1__BlockPrecision **ptrs;
} map_storage;

static bool map_build(const prismd_job *job, Prism__V1__PrecisionUpdate *u, map_storage *st)
{
    prism__v1__precision_update__init(u);
    size_t n = prism_policy_block_count(job->policy);
    st->blocks = calloc(n ? n : 1, sizeof *st->blocks);
    st->ptrs = calloc(n ? n : 1, sizeof *st->ptrs);
    if (!st->blocks || !st->ptrs)
        return false;
    for (size_t i = 0; i < n; i++) {
        const prism_block_view *v = prism_policy_block(job->policy, i);
        Prism__V1__BlockPrecision *b = &st->blocks[i];
        prism__v1__block_precision__init(b);
        b->block_id = v->id;
        b->precision = wire_precision(v->precision);
        b->reason = (Prism__V1__SwitchReason)v->reason;
        b->last_switch_step = v->has_switch ? v->last_switch_step : 0;
        if (v->has_score) {
            b->optional_sensitivity_case = PRISM__V1__BLOCK_PRECISION__OPTIONAL_SENSITIVITY_SENSITIVITY;
            b->sensitivity = v->sensitivity;
        }
        st->ptrs[i] = b;
    }
    u->job_id = (char *)job->id;
    u->map_version = prism_policy_map_version(job->policy);
    u->decided_step = job->decided_step;
    u->effective_step = job->effective_step;
    u->full = true;
    u->n_blocks = n;
    u->blocks = st->ptrs;
    return true;
}

static void map_free(map_storage *st)
{
    free(st->blocks);
    free(st->ptrs);
}

static uint8_t *pack_service(const Prism__V1__ServiceMessage *m, size_t *len)
{
    *len = prism__v1__service_message__get_packed_size(m);
    uint8_t *buf = malloc(*len ? *len : 1);
    if (buf)
        prism__v1__service_message__pack(m, buf);
    return buf;
}

/* Packs m and queues it on s. */
static void send_service(prismd_stream *s, const Prism__V1__ServiceMessage *m)
{
    size_t len;
    uint8_t *buf = pack_service(m, &len);
    if (buf)
        prismd_stream_send(s, buf, len);
    free(buf);
}

/* A bare PrecisionUpdate (what Watch streams carry), packed; caller frees. */
static uint8_t *pack_update(const Prism__V1__PrecisionUpdate *u, size_t *len)
{
    *len = prism__v1__precision_update__get_packed_size(u);
    uint8_t *buf = malloc(*len ? *len : 1);
    if (buf)
        prism__v1__precision_update__pack(u, buf);
    return buf;
}

static void send_error(prismd_stream *s, int code, const char *message)
{
    Prism__V1__Error e = PRISM__V1__ERROR__INIT;
    e.code = (uint32_t)code;
    e.message = (char *)message;
    Prism__V1__ServiceMessage m = PRISM__V1__SERVICE_MESSAGE__INIT;
    m.kind_case = PRISM__V1__SERVICE_MESSAGE__KIND_ERROR;
    m.error = &e;
    send_service(s, &m);
}

/* The compute plan in force for an agent of rank (its class's, by its last Hello's device
 * class), or NULL: no plan, or none for its class. */
static const prismd_plan_class *agent_plan(prismd_job *job, uint32_t rank)
{
    const prismd_rank_facts *f = rank_find(job, rank);
    return f && f->has_device ? prismd_plans_class(job->plans, f->device_class) : NULL;
}

/* c as the wire's ComputePlan (pointing into c), with the plan's predicted iteration time. */
static void fill_compute_plan(const prismd_plan_class *c, double iteration_seconds, Prism__V1__ComputePlan *cp)
{
    prism__v1__compute_plan__init(cp);
    cp->device_class = c->name;
    cp->low_format = wire_precision(c->low_format);
    cp->high_format = (char *)c->high_format;
    cp->n_low_blocks = c->nlow;
    cp->low_blocks = c->low_blocks;
    cp->predicted_iteration_seconds = iteration_seconds;
    cp->compute_seconds = c->compute_seconds;
}

/* u as a ServiceMessage, shared by the streams it goes to (NULL when memory runs out). */
static prismd_message *update_message(Prism__V1__PrecisionUpdate *u)
{
    Prism__V1__ServiceMessage m = PRISM__V1__SERVICE_MESSAGE__INIT;
    m.kind_case = PRISM__V1__SERVICE_MESSAGE__KIND_UPDATE;
    m.update = u;
    size_t len;
    uint8_t *buf = pack_service(&m, &len);
    prismd_message *msg = buf ? prismd_message_create(buf, len) : NULL;
    free(buf);
    return msg;
}

/* Sends the job's current map to every agent (as a ServiceMessage, with its class's compute
 * plan when the plan in force has one: one packed message per class that has a plan) and
 * watcher (as a bare PrecisionUpdate, never with a plan). Either every stream gets its message or
 * none does: false (logged, counted) when memory runs out, the map then stays to be sent. */
static bool broadcast_map(prismd_jobs *j, prismd_job *job)
{
    Prism__V1__PrecisionUpdate u;
    map_storage st;
    if (!map_build(job, &u, &st)) {
        map_free(&st);
        prism_log(PRISM_LOG_ERROR, "out of memory building a map; it is sent later", "job", job->id, LOG_END);
        j->counters.maps_unsent++;
        return false;
    }
    /* One copy of each message however many streams it goes to (stream.h). */
    size_t nclasses = prismd_plans_class_count(job->plans);
    prismd_message *base = update_message(&u);
    prismd_message **per_class = nclasses ? calloc(nclasses, sizeof *per_class) : NULL;
    bool ok = base && (!nclasses || per_class);
    double t = prismd_plans_iteration_seconds(job->plans);
    for (size_t k = 0; ok && k < nclasses; k++) {
        const prismd_plan_class *c = prismd_plans_class_at(job->plans, k);
        Prism__V1__ComputePlan cp;
        fill_compute_plan(c, t, &cp);
        u.compute_plan = &cp;
        ok = (per_class[k] = update_message(&u)) != NULL;
        u.compute_plan = NULL;
    }
    prismd_message *umsg = NULL;
    if (ok && job->nwatchers) {
        size_t ulen;
        uint8_t *ubuf = pack_update(&u, &ulen);
        umsg = ubuf ? prismd_message_create(ubuf, ulen) : NULL;
        free(ubuf);
        ok = umsg != NULL;
    }
    if (ok) {
        for (size_t i = 0; i < job->nagents; i++) {
            const prismd_plan_class *c = agent_plan(job, job->agents[i].rank);
            prismd_message *msg = c ? per_class[c - prismd_plans_class_at(job->plans, 0)] : base;
            prismd_stream_send_message(job->agents[i].stream, msg);
            j->counters.updates_sent++;
        }
        for (size_t i = 0; i < job->nwatchers; i++)
            prismd_stream_send_message(job->watchers[i].stream, umsg);
    } else {
        prism_log(PRISM_LOG_ERROR, "out of memory packing a map's messages; it is sent later", "job", job->id,
                  LOG_END);
        j->counters.maps_unsent++;
    }
    prismd_message_release(umsg);
    prismd_message_release(base);
    for (size_t k = 0; per_class && k < nclasses; k++)
        prismd_message_release(per_class[k]);
    free(per_class);
    map_free(&st);
    return ok;
}

/* ---- the calibration cache (DESIGN 4.5) ---- */

typedef struct cal_list {
    prism_policy *policy;
    size_t n, cap;
    Prism__V1__BlockError *errors;
    prism_precision *formats;
} cal_list;

static void cal_collect(void *ctx, prism_precision format, uint32_t block_id, double error)
{
    cal_list *l = ctx;
    prism_error err;
    if (prism_policy_set_calibration(l->policy, format, block_id, error, &err))
        return;
    if (l->n == l->cap) {
        size_t ncap = l->cap ? l->cap * 2 : 64;
        Prism__V1__BlockError *ne = realloc(l->errors, ncap * sizeof *ne);
        if (ne)
            l->errors = ne;
        prism_precision *nf = realloc(l->formats, ncap * sizeof *nf);
        if (nf)
            l->formats = nf;
        if (!ne || !nf)
            return;
        l->cap = ncap;
    }
    prism__v1__block_error__init(&l->errors[l->n]);
    l->errors[l->n].block_id = block_id;
    l->errors[l->n].relative_error = error;
    l->formats[l->n++] = format;
}

static void cal_free(cal_list *l)
{
    free(l->errors);
    free(l->formats);
}

/* Fills p from c; p points into c and into formats (room for PRISM_LOW_FORMATS_MAX), which must
 * outlive it. */
static void fill_policy_config(const prism_config *c, Prism__V1__PolicyConfig *p,
                               Prism__V1__Precision formats[PRISM_LOW_FORMATS_MAX])
{
    prism__v1__policy_config__init(p);
    p->enabled = c->enabled;
    p->mode = c->mode == PRISM_MODE_OFF      ? PRISM__V1__POLICY_MODE__MODE_OFF
              : c->mode == PRISM_MODE_STATIC ? PRISM__V1__POLICY_MODE__MODE_STATIC
                                             : PRISM__V1__POLICY_MODE__MODE_DYNAMIC;
    p->bf16_threshold = c->bf16_threshold;
    p->int8_threshold = c->int8_threshold;
    p->ambiguous_default = c->ambiguous_default == PRISM_AMBIGUOUS_LOW ? PRISM__V1__AMBIGUOUS_DEFAULT__AMBIGUOUS_LOW
                                                                        : PRISM__V1__AMBIGUOUS_DEFAULT__AMBIGUOUS_BF16;
    p->hysteresis_margin = c->hysteresis_margin;
    p->grad_weight = c->grad_weight;
    p->error_weight = c->error_weight;
    p->grad_sensitivity_threshold = c->grad_sensitivity_threshold;
    p->run_calibration = c->run_calibration;
    p->calibration_samples = (uint32_t)c->calibration_samples;
    p->quant_error_threshold = c->quant_error_threshold;
    p->warmup_steps = (uint32_t)c->warmup_steps;
    p->history_window = (uint32_t)c->history_window;
    p->update_interval_steps = (uint32_t)c->update_interval_steps;
    p->min_steps_between_switches = (uint32_t)c->min_steps_between_switches;
    p->n_force_bf16_blocks = c->force_bf16_blocks.count;
    p->force_bf16_blocks = c->force_bf16_blocks.ids;
    p->n_force_int8_blocks = c->force_int8_blocks.count;
    p->force_int8_blocks = c->force_int8_blocks.ids;
    p->log_decisions = c->log_decisions;
    p->telemetry_enabled = c->telemetry_enabled;
    p->telemetry_file = c->telemetry_file;
    /* Under "auto" old agents get one concrete format: the last (least saving) of low_formats, the
     * one a block without calibration gets (a later part adds the Welcome fields for the list). */
    p->low_precision = wire_precision(prism_config_low_format(c));
    p->apply_lag_steps = (uint32_t)c->apply_lag_steps;
    p->step_timeout_ms = (uint32_t)c->step_timeout_ms;
    p->world_size = (uint32_t)c->world_size;
    /* The numerics keys (issue 17); low_formats points into c, as the block lists do. */
    p->low_precision_auto = c->low_precision == PRISM_LOW_AUTO;
    p->n_low_formats = c->low_formats.count;
    for (size_t i = 0; i < c->low_formats.count && i < PRISM_LOW_FORMATS_MAX; i++)
        formats[i] = wire_precision(c->low_formats.formats[i]);
    p->low_formats = formats;
    p->scale_mode = c->scale_mode == PRISM_SCALE_POW2      ? PRISM__V1__SCALE_MODE__SCALE_POW2
                    : c->scale_mode == PRISM_SCALE_DELAYED ? PRISM__V1__SCALE_MODE__SCALE_DELAYED
                    : c->scale_mode == PRISM_SCALE_STATIC  ? PRISM__V1__SCALE_MODE__SCALE_STATIC
                                                           : PRISM__V1__SCALE_MODE__SCALE_CURRENT;
    p->amax_history_len = (uint32_t)c->amax_history_len;
    p->scale_margin = (int32_t)c->scale_margin;
}

/* The formats the job still wants calibrated under config c (issue 17 item 2): none without
 * run_calibration; under low_precision "auto" every format of low_formats (in its order) that the
 * job's fingerprint has no errors for; otherwise low_precision alone when it has none. Writes at
 * most PRISM_LOW_FORMATS_MAX into out and returns how many. */
static size_t calibration_wanted(const prismd_job *job, const prism_config *c,
                                 Prism__V1__Precision out[PRISM_LOW_FORMATS_MAX])
{
    if (!c->run_calibration)
        return 0;
    size_t n = 0;
    if (c->low_precision != PRISM_LOW_AUTO) {
        if ((unsigned)c->low_precision < PRISM_PRECISION_COUNT && !job->calibrated[c->low_precision])
            out[n++] = wire_precision(c->low_precision);
        return n;
    }
    for (size_t i = 0; i < c->low_formats.count && i < PRISM_LOW_FORMATS_MAX; i++) {
        prism_precision f = c->low_formats.formats[i];
        if ((unsigned)f < PRISM_PRECISION_COUNT && !job->calibrated[f])
            out[n++] = wire_precision(f);
    }
    return n;
}

/* Welcome's and ConfigUpdate's calibration_needed, in the meaning an agent of before issue 17
 * gives it: calibration of the one format it knows (PolicyConfig.low_precision, the last of
 * low_formats under "auto") is wanted. An older agent calibrates that format when told so and
 * would be told again forever if the flag also stood for the other formats of low_formats;
 * newer agents read calibration_formats for the whole list. */
static bool legacy_calibration_needed(const prismd_job *job, const prism_config *c)
{
    prism_precision f = prism_config_low_format(c);
    return c->run_calibration && (unsigned)f < PRISM_PRECISION_COUNT && !job->calibrated[f];
}

/* Whether two configs differ in what agents and trainers use of a PolicyConfig (the hint table's
 * status and numerics: run_calibration, calibration_samples, low_precision with "auto",
 * low_formats, scale_mode, amax_history_len, scale_margin). A new config that changes none of
 * them is not pushed: the agents would write the same table. */
static bool agent_config_differs(const prism_config *a, const prism_config *b)
{
    if (a->run_calibration != b->run_calibration || a->calibration_samples != b->calibration_samples ||
        a->low_precision != b->low_precision || a->scale_mode != b->scale_mode ||
        a->amax_history_len != b->amax_history_len || a->scale_margin != b->scale_margin ||
        a->low_formats.count != b->low_formats.count)
        return true;
    for (size_t i = 0; i < a->low_formats.count && i < PRISM_LOW_FORMATS_MAX; i++)
        if (a->low_formats.formats[i] != b->low_formats.formats[i])
            return true;
    return false;
}

/* Sends the config now in force, with the calibration it wants, to every agent of the job
 * (ServiceMessage.config): called when a decision applied a new config that changes what agents
 * use (agent_config_differs), so that every rank's hint table takes it at once (the map of the
 * same decision follows it). */
static void broadcast_config(prismd_job *job)
{
    const prism_config *c = prism_policy_config(job->policy);
    Prism__V1__Precision formats[PRISM_LOW_FORMATS_MAX], wanted[PRISM_LOW_FORMATS_MAX];
    Prism__V1__PolicyConfig cfg;
    fill_policy_config(c, &cfg, formats);
    Prism__V1__ConfigUpdate cu = PRISM__V1__CONFIG_UPDATE__INIT;
    cu.config = &cfg;
    cu.n_calibration_formats = calibration_wanted(job, c, wanted);
    cu.calibration_formats = wanted;
    cu.calibration_needed = legacy_calibration_needed(job, c);
    Prism__V1__ServiceMessage m = PRISM__V1__SERVICE_MESSAGE__INIT;
    m.kind_case = PRISM__V1__SERVICE_MESSAGE__KIND_CONFIG;
    m.config = &cu;
    size_t len;
    uint8_t *buf = pack_service(&m, &len);
    prismd_message *msg = buf ? prismd_message_create(buf, len) : NULL;
    free(buf);
    if (!msg) {
        prism_log(PRISM_LOG_ERROR, "out of memory packing a config update; agents get it at their next Welcome",
                  "job", job->id, LOG_END);
        return;
    }
    for (size_t i = 0; i < job->nagents; i++)
        prismd_stream_send_message(job->agents[i].stream, msg);
    prismd_message_release(msg);
}

static void send_welcome(prismd_jobs *j, prismd_job *job, prismd_stream *s, uint32_t rank, const cal_list *cached)
{
    Prism__V1__PolicyConfig cfg;
    Prism__V1__Precision formats[PRISM_LOW_FORMATS_MAX], wanted[PRISM_LOW_FORMATS_MAX];
    fill_policy_config(prism_policy_config(job->policy), &cfg, formats);
    Prism__V1__PrecisionUpdate u;
    map_storage st;
    if (!map_build(job, &u, &st)) {
        map_free(&st);
        send_error(s, GRPC_STATUS_RESOURCE_EXHAUSTED, "out of memory");
        return;
    }
    /* The last durable plan of the rank's class: a plan is durable before it is sent (DESIGN 7). */
    Prism__V1__ComputePlan cp;
    const prismd_rank_facts *facts = rank_find(job, rank);
    double t = 0;
    const prismd_plan_class *plan =
        facts && facts->has_device ? prismd_plans_durable_class(job->plans, facts->device_class, &t) : NULL;
    if (plan) {
        fill_compute_plan(plan, t, &cp);
        u.compute_plan = &cp;
    }
    Prism__V1__Welcome w = PRISM__V1__WELCOME__INIT;
    w.config = &cfg;
    w.map = &u;
    w.n_calibration_formats = calibration_wanted(job, prism_policy_config(job->policy), wanted);
    w.calibration_formats = wanted;
    w.calibration_needed = legacy_calibration_needed(job, prism_policy_config(job->policy));
    /* The cached errors, one CalibrationErrors per format. */
    Prism__V1__CalibrationErrors groups[PRISM_PRECISION_COUNT];
    Prism__V1__CalibrationErrors *group_ptrs[PRISM_PRECISION_COUNT];
    Prism__V1__BlockError **error_ptrs = cached->n ? malloc(cached->n * sizeof *error_ptrs) : NULL;
    size_t used = 0;
    for (int f = 0; error_ptrs && f < PRISM_PRECISION_COUNT; f++) {
        Prism__V1__CalibrationErrors *g = &groups[w.n_cached_errors];
        prism__v1__calibration_errors__init(g);
        g->format = wire_precision((prism_precision)f);
        g->errors = error_ptrs + used;
        for (size_t i = 0; i < cached->n; i++)
            if (cached->formats[i] == (prism_precision)f)
                error_ptrs[used + g->n_errors++] = &cached->errors[i];
        used += g->n_errors;
        if (g->n_errors)
            group_ptrs[w.n_cached_errors++] = g;
    }
    w.cached_errors = group_ptrs;
    const prismd_hints *h = &j->limits.hints;
    Prism__V1__RuntimeHints hints = PRISM__V1__RUNTIME_HINTS__INIT;
    hints.map_version = u.map_version;
    hints.max_inflight_h2d = h->max_inflight_h2d;
    hints.max_inflight_d2h = h->max_inflight_d2h;
    hints.prefetch_window = h->prefetch_window;
    hints.vram_pressure_threshold = h->vram_pressure_threshold;
    hints.suppress_prefetch_in_backward = h->suppress_prefetch_in_backward;
    hints.suppress_prefetch_in_optimizer = h->suppress_prefetch_in_optimizer;
    w.hints = &hints;
    job->hints_sent = true;
    job->hints = *h;
    job->hints_map_version = u.map_version;
    Prism__V1__ServiceMessage m = PRISM__V1__SERVICE_MESSAGE__INIT;
    m.kind_case = PRISM__V1__SERVICE_MESSAGE__KIND_WELCOME;
    m.welcome = &w;
    send_service(s, &m);
    free(error_ptrs);
    map_free(&st);
}

/* ---- messages in ---- */

/* Remembers a block of a layout and its name (at most 255 bytes, cut at a UTF-8 character
 * boundary so that JSON can carry it; NULL when it has none). At
 * most max blocks are remembered per job; false when that or memory runs out. */
static bool remember_layout_block(prismd_job *job, uint32_t id, const char *name, size_t max)
{
    char *copy = NULL;
    if (name && name[0] && !(copy = prismd_text_copy(name)))
        return false;
    uint32_t ix = prism_idmap_get(&job->name_ix, id);
    if (ix != PRISM_IDMAP_NONE) {
        if (copy) {
            free(job->names[ix]);
            job->names[ix] = copy;
        }
        return true;
    }
    if (job->nnames >= max || !grow((void **)&job->names, &job->cap_names, job->nnames + 1, sizeof *job->names) ||
        prism_idmap_put(&job->name_ix, id, (uint32_t)job->nnames)) {
        free(copy);
        return false;
    }
    job->names[job->nnames++] = copy;
    return true;
}

/* Checks a Hello's layout whole before any of it is applied (a refused Hello changes nothing):
 * each block id once, the fingerprint's size, and the job's blocks (block_ix: from layouts and
 * reports together), those it has and the new ones, within max. job is NULL for a job the Hello would create. */
static bool layout_fits(const prismd_job *job, const Prism__V1__ModelLayout *l, size_t max, prismd_status *end)
{
    if (l->fingerprint.len > sizeof job->fingerprint)
        return fail(end, GRPC_STATUS_INVALID_ARGUMENT, "hello.layout.fingerprint: %zu bytes, at most %zu",
                    l->fingerprint.len, sizeof job->fingerprint);
    if (l->n_blocks > max)
        return fail(end, GRPC_STATUS_RESOURCE_EXHAUSTED, "hello.layout: %zu blocks, the limit is %zu", l->n_blocks,
                    max);
    prism_idmap seen;
    prism_idmap_init(&seen);
    size_t fresh = 0;
    bool ok = true;
    for (size_t i = 0; ok && i < l->n_blocks; i++) {
        uint32_t id = l->blocks[i]->id;
        if (prism_idmap_get(&seen, id) != PRISM_IDMAP_NONE) {
            ok = fail(end, GRPC_STATUS_INVALID_ARGUMENT, "hello.layout.blocks[%zu].id: block %u appears twice", i, id);
        } else if (prism_idmap_put(&seen, id, 0)) {
            ok = fail(end, GRPC_STATUS_RESOURCE_EXHAUSTED, "out of memory");
        } else if (!job || !job_has_block(job, id)) {
            fresh++;
        }
    }
    prism_idmap_free(&seen);
    size_t have = job ? job->block_ix.count : 0;
    if (ok && have + fresh > max)
        ok = fail(end, GRPC_STATUS_RESOURCE_EXHAUSTED,
                  "hello.layout: %zu new blocks on the job's %zu would pass the limit of %zu", fresh, have, max);
    return ok;
}

/* Whether address may auto-create one more job: each client address (gRPC's peer, its port left
 * out) may have created --max-auto-jobs-per-peer of the jobs held; past it the Hello is refused
 * with RESOURCE_EXHAUSTED and counted. Jobs restored from the store have no creator. */
static bool auto_job_allowed(prismd_jobs *j, const char *job_id, const char *address, prismd_status *end)
{
    const prismd_memory_limits *m = j->limits.mem;
    if (!m || !m->max_auto_jobs_per_peer || !address)
        return true;
    size_t mine = 0;
    for (size_t i = 0; i < j->njobs; i++)
        if (j->jobs[i]->creator && strcmp(j->jobs[i]->creator, address) == 0)
            mine++;
    if (mine < m->max_auto_jobs_per_peer)
        return true;
    atomic_fetch_add(&prismd_limits.auto_jobs_refused, 1);
    return fail(end, GRPC_STATUS_RESOURCE_EXHAUSTED,
                "job %s: %.64s already created %zu jobs, the limit (--max-auto-jobs-per-peer)", job_id, address,
                mine);
}

/* A DeviceProfile's measured figures are finite and not negative (the ranks answer and the
 * hybrid-device plans read them as such); INVALID_ARGUMENT naming the first that is not. */
static bool device_ok(const Prism__V1__DeviceProfile *d, prismd_status *end)
{
    if (!d)
        return true;
    const struct {
        const char *name;
        double value;
    } figures[] = {{"bf16_ops_per_second", d->bf16_ops_per_second}, {"fp16_ops_per_second", d->fp16_ops_per_second},
                   {"int8_ops_per_second", d->int8_ops_per_second}, {"fp8_ops_per_second", d->fp8_ops_per_second},
                   {"h2d_bytes_per_second", d->h2d_bytes_per_second},
                   {"quantize_cost.fixed_seconds", d->quantize_cost ? d->quantize_cost->fixed_seconds : 0},
                   {"quantize_cost.seconds_per_byte", d->quantize_cost ? d->quantize_cost->seconds_per_byte : 0}};
    for (size_t i = 0; i < sizeof figures / sizeof *figures; i++)
        if (!isfinite(figures[i].value) || figures[i].value < 0)
            return fail(end, GRPC_STATUS_INVALID_ARGUMENT, "hello.device.%s: %g is not a finite number >= 0",
                        figures[i].name, figures[i].value);
    return true;
}

static bool save_and_send(prismd_jobs *j, prismd_job *job, const prism_change *changes, size_t change_count,
                          bool map_changed, bool retry, int64_t now_ms);

static bool on_hello(prismd_jobs *j, prismd_stream *s, prismd_peer *peer, const Prism__V1__Hello *h, int64_t now_ms,
                     prismd_status *end)
{
    if (peer->job)
        return fail(end, GRPC_STATUS_FAILED_PRECONDITION, "a second Hello on one stream");
    if (!h->job_id || !prismd_job_id_valid(h->job_id))
        return fail(end, GRPC_STATUS_INVALID_ARGUMENT,
                    "hello.job_id: 1 to %d characters of letters, digits, '-', '_' or '.', starting with a letter or digit",
                    JOB_ID_MAX);
    if (!device_ok(h->device, end))
        return false;
    const char *token = peer->auth ? peer->auth : (h->token && h->token[0] ? h->token : NULL);
    const char *provisioned = prismd_tokens_find(j->tokens, h->job_id);
    /* Refused as a wrong (or missing) token is, word for word, so that the answer does not tell
     * which job ids are provisioned; the log says why. */
    if (!provisioned && j->limits.require_provisioned_tokens) {
        prism_log(PRISM_LOG_WARN, "hello refused: the job has no provisioned token (--require-provisioned-tokens)",
                  "job", h->job_id, LOG_END);
        return refuse(end, h->job_id, token ? PRISMD_AUTH_WRONG : PRISMD_AUTH_MISSING);
    }
    prismd_job *job = find_job(j, h->job_id);
    if (!job) {
        if (provisioned && !grpc_authorized(j, h->job_id, provisioned, token, PRISMD_ACCESS_AGENT, end))
            return false;
        if (!j->limits.auto_create)
            return fail(end, GRPC_STATUS_NOT_FOUND, "job %s does not exist", h->job_id);
        /* Everything checked before the job is made, so a refused Hello leaves nothing behind. */
        uint32_t world = j->defaults.world_size ? (uint32_t)j->defaults.world_size : h->world_size;
        if (world == 0 || world > 1000000)
            return fail(end, GRPC_STATUS_INVALID_ARGUMENT, "hello.world_size: %u is not from 1 to 1000000",
                        h->world_size);
        if (h->world_size && h->world_size != world)
            return fail(end, GRPC_STATUS_INVALID_ARGUMENT, "hello.world_size: %u, but new jobs have %u ranks",
                        h->world_size, world);
        if (h->rank >= world)
            return fail(end, GRPC_STATUS_INVALID_ARGUMENT, "hello.rank: %u is not below the world size %u", h->rank,
                        world);
        if (h->layout && !layout_fits(NULL, h->layout, j->limits.max_blocks, end))
            return false;
        /* A job with a provisioned token was authenticated above; the others count against
         * the address that made them (--max-auto-jobs-per-peer). */
        if (!provisioned && !auto_job_allowed(j, h->job_id, peer->address, end))
            return false;
        /* Trust on first use keeps the Hello's token, never the admin token. */
        const char *first = token && !prismd_token_equal(token, j->rule.admin_token) ? token : NULL;
        if (!(job = create_job(j, h->job_id, world, first, end)))
            return false;
        job->creator = !provisioned && peer->address ? strdup(peer->address) : NULL;
    } else if (!grpc_authorized(j, job->id, job_token(j, job), token, PRISMD_ACCESS_AGENT, end)) {
        return false;
    }
    if (h->world_size && h->world_size != job->world_size)
        return fail(end, GRPC_STATUS_INVALID_ARGUMENT, "hello.world_size: %u, but job %s has %u ranks",
                    h->world_size, job->id, job->world_size);
    if (h->rank >= job->world_size)
        return fail(end, GRPC_STATUS_INVALID_ARGUMENT, "hello.rank: %u is not below the world size %u", h->rank,
                    job->world_size);
    if (h->layout && !layout_fits(job, h->layout, j->limits.max_blocks, end))
        return false;
    if (h->layout) {
        prism_error err;
        for (size_t i = 0; i < h->layout->n_blocks; i++) {
            const Prism__V1__BlockInfo *b = h->layout->blocks[i];
            if (!remember_layout_block(job, b->id, b->name, j->limits.max_blocks) || !job_add_block(job, b->id)) {
                trace_layout(j, job, h->layout, i); /* the sizes the policy was given before the refusal */
                return fail(end, GRPC_STATUS_RESOURCE_EXHAUSTED, "hello.layout: block %u: the job already has %zu "
                            "layout blocks, the limit", b->id, j->limits.max_blocks);
            }
            if (prism_policy_set_block_bytes(job->policy, b->id, b->param_bytes_bf16, &err)) {
                trace_layout(j, job, h->layout, i);
                return fail(end, GRPC_STATUS_RESOURCE_EXHAUSTED, "hello.layout: %s", err.message);
            }
            if (!prismd_plans_layout(job->plans, b->id, (double)b->param_bytes_bf16, (double)b->flops,
                                     (double)b->activation_bytes_bf16, (double)b->state_bytes)) {
                trace_layout(j, job, h->layout, i + 1);
                return fail(end, GRPC_STATUS_RESOURCE_EXHAUSTED, "out of memory");
            }
        }
        trace_layout(j, job, h->layout, h->layout->n_blocks);
    }
    /* A Welcome carries the map in memory with the last durable plan: both must be the saved
     * pair (DESIGN 7). A map a failed save left unsaved is saved (and sent) first; when the store
     * still cannot take it, the stream ends UNAVAILABLE and the agent reconnects later. */
    if (job->map_unsent && !save_and_send(j, job, NULL, 0, false, true, now_ms))
        return fail(end, GRPC_STATUS_UNAVAILABLE, "prismd cannot save the job's state; retry");
    cal_list cached = {.policy = job->policy};
    if (h->layout && h->layout->fingerprint.len) {
        memcpy(job->fingerprint, h->layout->fingerprint.data, h->layout->fingerprint.len);
        job->fingerprint_len = h->layout->fingerprint.len;
        prism_error err;
        if (j->store && prismd_store_load_calibration(j->store, job->fingerprint, job->fingerprint_len, cal_collect,
                                                      &cached, &err) > 0)
            for (size_t i = 0; i < cached.n; i++)
                if ((unsigned)cached.formats[i] < PRISM_PRECISION_COUNT)
                    job->calibrated[cached.formats[i]] = true; /* the cache has rows per format */
        trace_cached_calibration(j, job, cached.errors, cached.formats, cached.n);
    }
    if (!grow((void **)&job->agents, &job->cap_agents, job->nagents + 1, sizeof *job->agents) ||
        !rank_hello(job, h)) {
        cal_free(&cached);
        return fail(end, GRPC_STATUS_RESOURCE_EXHAUSTED, "out of memory");
    }
    /* One stream per rank: the newer agent wins, so that a restarted agent is never locked out
     * by its own half-open old stream. The older one is told why. */
    for (size_t i = 0; i < job->nagents; i++) {
        if (job->agents[i].rank != h->rank)
            continue;
        agent old = job->agents[i];
        job->agents[i] = job->agents[--job->nagents];
        old.peer->job = NULL;
        char why[96], rank[16];
        snprintf(why, sizeof why, "replaced by a newer agent for rank %u", h->rank);
        snprintf(rank, sizeof rank, "%u", h->rank);
        prismd_stream_end(old.stream, GRPC_STATUS_ABORTED, why);
        j->counters.agents_replaced++;
        prism_log(PRISM_LOG_WARN, "agent replaced", "job", job->id, "rank", rank, "node", h->node ? h->node : "",
                  LOG_END);
        break;
    }
    job->agents[job->nagents++] = (agent){s, peer, h->rank};
    job->last_active_ms = wall_ms();
    j->urgent = true;
    peer->job = job;
    peer->rank = h->rank;
    char rank[16];
    snprintf(rank, sizeof rank, "%u", h->rank);
    prism_log(PRISM_LOG_INFO, "agent connected", "job", job->id, "rank", rank, "node", h->node ? h->node : "",
               LOG_END);
    send_welcome(j, job, s, h->rank, &cached);
    cal_free(&cached);
    return true;
}

/* DATA_DIR/jobs/JOB/NAME: where a job's files live. */
int prismd_job_file(const char *data_dir, const char *job_id, const char *name, char *out, size_t len)
{
    return snprintf(out, len, "%s/jobs/%s/%s", data_dir, job_id, name);
}

/* Keeps the job's telemetry file under --telemetry-max-bytes: when the record in j->line would
 * take a non-empty file past it, the file becomes NAME.1 (NAME.1 NAME.2, ..., the oldest beyond
 * --telemetry-keep dropped and counted) and a new one is started. A single record larger than
 * the limit still goes out, alone in its file. */
static void rotate_telemetry(prismd_jobs *j, prismd_job *job, const char *name)
{
    const prismd_memory_limits *m = j->limits.mem;
    if (!m || !m->telemetry_max_bytes || job->telemetry_size == 0 ||
        job->telemetry_size + j->line.len <= m->telemetry_max_bytes)
        return;
    char path[4096];
    prismd_job_file(j->limits.data_dir, job->id, name, path, sizeof path);
    fclose(job->telemetry);
    unsigned dropped = prismd_telemetry_rotate(path, m->telemetry_keep);
    atomic_fetch_add(&prismd_limits.telemetry_rotations, 1);
    atomic_fetch_add(&prismd_limits.telemetry_files_dropped, dropped);
    job->telemetry = fopen(path, "a");
    job->telemetry_size = 0;
    if (!job->telemetry)
        prism_log(PRISM_LOG_ERROR, "cannot open the telemetry file", "job", job->id, "path", path, "error",
                  strerror(errno), LOG_END);
}

/* Appends the decision's record, made at wall-clock time now (Unix seconds), to the job's
 * telemetry JSONL (DESIGN 4.4). */
static void write_telemetry(prismd_jobs *j, prismd_job *job, const prism_summary *summary, double now,
                            const double *loss)
{
    const prism_config *cfg = prism_policy_config(job->policy);
    if (!cfg->telemetry_enabled || !j->limits.data_dir)
        return;
    if (job->telemetry && strcmp(job->telemetry_name, cfg->telemetry_file) != 0) {
        fclose(job->telemetry); /* the config names another file now */
        job->telemetry = NULL;
    }
    if (!job->telemetry) {
        snprintf(job->telemetry_name, sizeof job->telemetry_name, "%s", cfg->telemetry_file);
        char path[4096];
        prismd_job_file(j->limits.data_dir, "", "", path, sizeof path);
        mkdir(path, 0750);
        prismd_job_file(j->limits.data_dir, job->id, "", path, sizeof path);
        mkdir(path, 0750);
        prismd_job_file(j->limits.data_dir, job->id, cfg->telemetry_file, path, sizeof path);
        job->telemetry = fopen(path, "a");
        if (!job->telemetry) {
            prism_log(PRISM_LOG_ERROR, "cannot open the telemetry file", "job", job->id, "path", path, "error",
                       strerror(errno), LOG_END);
            return;
        }
        struct stat st;
        job->telemetry_size = fstat(fileno(job->telemetry), &st) == 0 ? (uint64_t)st.st_size : 0;
    }
    j->line.len = 0;
    if (prism_telemetry_append(&j->line, job->policy, summary, now, loss)) {
        prism_log(PRISM_LOG_ERROR, "cannot write telemetry", "job", job->id, LOG_END);
        return;
    }
    rotate_telemetry(j, job, cfg->telemetry_file);
    if (!job->telemetry)
        return;
    if (fwrite(j->line.data, 1, j->line.len, job->telemetry) != j->line.len || fflush(job->telemetry) != 0)
        prism_log(PRISM_LOG_ERROR, "cannot write telemetry", "job", job->id, LOG_END);
    job->telemetry_size += j->line.len;
}

static void log_changes(const prismd_job *job, const prism_step_result *r)
{
    if (!prism_policy_config(job->policy)->log_decisions)
        return;
    for (size_t i = 0; i < r->change_count; i++) {
        const prism_change *c = &r->changes[i];
        char block[16], step[24];
        snprintf(block, sizeof block, "%u", c->block_id);
        snprintf(step, sizeof step, "%llu", (unsigned long long)c->step);
        prism_log(PRISM_LOG_INFO, "precision changed", "job", job->id, "block", block, "from",
                   prism_precision_name(c->from), "to", prism_precision_name(c->to), "reason",
                   prism_reason_name(c->reason), "step", step, LOG_END);
    }
}

/* Plans the job's hybrid compute plans at a decision (DESIGN 11) from the decision's merged step.
 * A plan whose per-class low sets differ from those in force goes out with a map: the decision's
 * own when it changed the map, else a new version of the same precisions committed here (r is
 * updated as if the decision had changed the map). */
static void plan_at_decision(prismd_job *job, const prism_merged_step *m, prism_step_result *r)
{
    bool changed = false;
    if (!prismd_plans_gradients(job->plans, m->blocks, m->count))
        prism_log(PRISM_LOG_ERROR, "out of memory keeping gradient statistics for hybrid plans", "job", job->id,
                  LOG_END);
    prismd_plans_decide(job->plans, job->id, prism_policy_config(job->policy), job->ranks, job->nranks,
                        job->world_size, &changed);
    if (changed) {
        if (!r->map_changed) {
            r->map_version = prism_policy_bump_version(job->policy);
            r->summary.map_version = r->map_version;
            r->map_changed = true;
            job->summary.map_version = r->map_version;
            job->decided_step = r->decided_step;
            job->effective_step = r->effective_step;
        }
        prismd_plans_set_map(job->plans, prism_policy_map_version(job->policy), job->decided_step,
                             job->effective_step);
    }
}

/* Saves the job's state (with its plan row while that changed since the store took it) and
 * then, when the map changed or an earlier one is still unsent, sends it. A map is durable
 * before it is sent (DESIGN 7): a failed save leaves it unsent (map_unsent), retried by the next
 * decision, a tick at unsent_retry_ms (1 s after the first failure, doubling to 60 s) or a Hello.
 * retry: a tick's or a Hello's retry of an unsent map (a failure counts in store_retries, logged
 * once per backoff step at WARN), not a decision's save (store_errors, ERROR). false: the save
 * failed. */
static bool save_and_send(prismd_jobs *j, prismd_job *job, const prism_change *changes, size_t change_count,
                          bool map_changed, bool retry, int64_t now_ms)
{
    prism_error err;
    prismd_plan_row row;
    bool with_row = prismd_plans_row_dirty(job->plans);
    if (with_row)
        prismd_plans_row(job->plans, &row);
    if (j->store && prismd_store_save_state(j->store, job->id, job->policy, job->decided_step, job->effective_step,
                                            changes, change_count, job->has_summary ? &job->summary : NULL,
                                            job->decided_unix, with_row ? &row : NULL, &err)) {
        job->map_unsent = job->map_unsent || map_changed;
        /* Retries back off (1 s doubling to 60 s): each may wait out the store's busy timeout
         * on the policy thread while another process holds the lock. */
        job->unsent_backoff_ms = job->unsent_backoff_ms ? job->unsent_backoff_ms * 2 : 1000;
        if (job->unsent_backoff_ms > 60000)
            job->unsent_backoff_ms = 60000;
        /* counted from when the failed save returned: it may have waited out the busy timeout */
        int64_t after = mono_ms();
        job->unsent_retry_ms = (after > now_ms ? after : now_ms) + job->unsent_backoff_ms;
        char wait_text[24];
        snprintf(wait_text, sizeof wait_text, "%lld", (long long)job->unsent_backoff_ms);
        if (retry) {
            j->counters.store_retries++;
            prism_log(PRISM_LOG_WARN, "still cannot save the job's state; its map is not sent", "job", job->id,
                      "retry_in_ms", wait_text, "error", err.message, LOG_END);
        } else {
            j->counters.store_errors++;
            prism_log(PRISM_LOG_ERROR, "cannot save a decision; its map is not sent", "job", job->id, "retry_in_ms",
                      wait_text, "error", err.message, LOG_END);
        }
        return false;
    }
    job->unsent_backoff_ms = 0;
    prismd_plans_saved(job->plans);
    if (map_changed || job->map_unsent) {
        job->map_unsent = !broadcast_map(j, job);
        job->unsent_retry_ms = now_ms + 1000;
    }
    return true;
}

/* Hands every ready merged step to the policy and pushes a changed map. Each decision's
 * wall-clock time is taken once: GET /v1/jobs' last_decision_unix, the store's copy of it and
 * the decision's telemetry timestamp are the same number. */
static void drain_steps(prismd_jobs *j, prismd_job *job, int64_t now_ms)
{
    prism_merged_step m;
    while (prism_merger_next(job->merger, now_ms, &m)) {
        prism_step_result r;
        prism_error err;
        struct timespec t0, t1;
        /* A config set by PATCH waits in the policy (next_config) until a decision applies it. */
        bool pending = prism_policy_next_config(job->policy) != prism_policy_config(job->policy) &&
                       agent_config_differs(prism_policy_next_config(job->policy), prism_policy_config(job->policy));
        clock_gettime(CLOCK_MONOTONIC, &t0);
        prism_status added =
            prism_policy_add_step(job->policy, m.step, m.has_loss ? &m.loss : NULL, m.blocks, m.count, &r, &err);
        clock_gettime(CLOCK_MONOTONIC, &t1);
        if (added == PRISM_OK && pending && prism_policy_next_config(job->policy) == prism_policy_config(job->policy))
            broadcast_config(job); /* before the decision's map: a rank sees the config first */
        j->dirty = true;
        if (added == PRISM_OK && r.decided) {
            double seconds = (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) / 1e9;
            j->decision_count++;
            j->decision_seconds += seconds;
            for (int b = 0; b < PRISMD_DECISION_BUCKETS; b++)
                if (seconds <= prismd_decision_buckets[b])
                    j->decision_buckets[b]++;
            struct timespec wall;
            clock_gettime(CLOCK_REALTIME, &wall);
            job->has_summary = true;
            job->summary = r.summary;
            job->decided_unix = (double)wall.tv_sec + (double)wall.tv_nsec / 1e9;
            j->urgent = true;
        }
        for (size_t c = 0; added == PRISM_OK && c < r.change_count; c++)
            if ((unsigned)r.changes[c].reason < PRISMD_REASONS)
                job->switches[r.changes[c].reason]++;
        if (added) {
            prism_log(PRISM_LOG_ERROR, "step refused by the policy", "job", job->id, "error", err.message,
                       LOG_END);
            continue;
        }
        if (r.decided) {
            j->counters.decisions++;
            job->decisions++;
        }
        if (r.map_changed) {
            job->decided_step = r.decided_step;
            job->effective_step = r.effective_step;
            j->urgent = true;
        }
        bool map_changed = r.map_changed;
        if (r.decided)
            plan_at_decision(job, &m, &r);
        /* after the plan: whether it alone committed a new map version (replay does the same) */
        trace_step(j, job, &m, r.map_changed && !map_changed);
        if (!r.decided && !r.map_changed)
            continue;
        if (!save_and_send(j, job, r.changes, r.change_count, r.map_changed, false, now_ms))
            continue;
        log_changes(job, &r);
        if (r.decided)
            write_telemetry(j, job, &r.summary, job->decided_unix, m.has_loss ? &m.loss : NULL);
    }
}

/* A report's weight and activation statistics (DESIGN 11) for the hybrid plans, checked like its
 * BlockGradStats: an entry naming a block the job does not have, or with a negative or non-finite
 * figure, is refused and counted; the others are kept (a late report's too: the later step wins
 * per half whatever the order of arrival). */
static void take_tensor_stats(prismd_jobs *j, prismd_job *job, uint32_t rank, const Prism__V1__StepReport *r)
{
    if (r->n_tensor_stats)
        j->dirty = true; /* /metrics counts them */
    for (size_t i = 0; i < r->n_tensor_stats; i++) {
        const Prism__V1__BlockTensorStats *t = r->tensor_stats[i];
        double figures[] = {t->x_l2, t->x_max_abs, t->w_l2, t->w_max_abs};
        bool ok = job_has_block(job, t->block_id);
        for (size_t f = 0; ok && f < sizeof figures / sizeof *figures; f++)
            ok = isfinite(figures[f]) && figures[f] >= 0;
        if (!ok) {
            j->counters.tensor_stats_refused++;
            continue;
        }
        if (!prismd_plans_tensor_stats(job->plans, rank, r->step, t->block_id, t->x_l2, t->x_max_abs,
                                       (double)t->x_numel, t->w_l2, t->w_max_abs, (double)t->w_numel,
                                       (double)t->y_numel)) {
            prism_log(PRISM_LOG_ERROR, "out of memory keeping tensor statistics", "job", job->id, LOG_END);
            return;
        }
        j->counters.tensor_stats_accepted++;
    }
}

static void on_step_report(prismd_jobs *j, prismd_stream *s, prismd_peer *peer, const Prism__V1__StepReport *r,
                           int64_t now_ms)
{
    prismd_job *job = peer->job;
    if (r->step > PRISM_STEP_MAX) {
        /* Refused before the merger sees it: a step past the bound would wrap effective_step
         * (or lose precision in JSON) and make every later report late. */
        j->counters.reports_step_out_of_range++;
        char message[200];
        snprintf(message, sizeof message, "step_report.step: %llu is above the largest step id %llu (2^53 - 1 less "
                 "the largest apply_lag_steps)", (unsigned long long)r->step, (unsigned long long)PRISM_STEP_MAX);
        send_error(s, GRPC_STATUS_INVALID_ARGUMENT, message);
        return;
    }
    prism_block_stats *blocks = malloc((r->n_blocks ? r->n_blocks : 1) * sizeof *blocks);
    if (!blocks) {
        send_error(s, GRPC_STATUS_RESOURCE_EXHAUSTED, "out of memory");
        return;
    }
    prism_merge_outcome outcome;
    prism_error err;
    prism_status st = PRISM_OK;
    for (size_t i = 0; i < r->n_blocks; i++) {
        const Prism__V1__BlockGradStats *b = r->blocks[i];
        /* The saturation figures (issue 17) come together or not at all; the merger checks them. */
        bool sat = b->optional_saturated_fraction_case ==
                   PRISM__V1__BLOCK_GRAD_STATS__OPTIONAL_SATURATED_FRACTION_SATURATED_FRACTION;
        bool und = b->optional_underflowed_fraction_case ==
                   PRISM__V1__BLOCK_GRAD_STATS__OPTIONAL_UNDERFLOWED_FRACTION_UNDERFLOWED_FRACTION;
        if (sat != und && st == PRISM_OK)
            st = prism_error_set(&err, PRISM_ERR_INVALID,
                                 "block %u: saturated_fraction and underflowed_fraction come together", b->block_id);
        blocks[i] = (prism_block_stats){b->block_id, b->l2_norm, b->max_abs, b->mean, b->variance, b->numel,
                                        b->nonfinite, sat && und, sat ? b->saturated_fraction : 0.0,
                                        und ? b->underflowed_fraction : 0.0};
    }
    /* A NaN or infinite loss is accepted and left out of the step's loss (merge.h). */
    bool has_loss = r->optional_loss_case == PRISM__V1__STEP_REPORT__OPTIONAL_LOSS_LOSS;
    /* The ids the job does not have yet, each once: with the job's blocks from layouts and
     * reports together, they must stay within --max-blocks (one count for both). */
    prism_idmap fresh;
    prism_idmap_init(&fresh);
    for (size_t i = 0; st == PRISM_OK && i < r->n_blocks; i++) {
        uint32_t id = blocks[i].block_id;
        if (!job_has_block(job, id) && prism_idmap_get(&fresh, id) == PRISM_IDMAP_NONE &&
            prism_idmap_put(&fresh, id, 0))
            st = prism_error_set(&err, PRISM_ERR_LIMIT, "out of memory");
    }
    if (st == PRISM_OK && job->block_ix.count + fresh.count > j->limits.max_blocks)
        st = prism_error_set(&err, PRISM_ERR_LIMIT, "%zu new blocks on the job's %zu would pass the limit of %zu",
                             fresh.count, job->block_ix.count, j->limits.max_blocks);
    if (st == PRISM_OK)
        st = prism_merger_add(job->merger, peer->rank, r->step, has_loss, has_loss ? r->loss : 0.0, blocks,
                              r->n_blocks, now_ms, &outcome, &err);
    if (st == PRISM_OK && outcome == PRISM_MERGE_ACCEPTED)
        for (size_t i = 0; st == PRISM_OK && i < r->n_blocks; i++)
            if (!job_add_block(job, blocks[i].block_id))
                st = prism_error_set(&err, PRISM_ERR_LIMIT, "out of memory");
    prism_idmap_free(&fresh);
    free(blocks);
    if (st) {
        j->counters.reports_rejected++;
        char message[600];
        snprintf(message, sizeof message, "step_report %llu: %s", (unsigned long long)r->step, err.message);
        send_error(s, st == PRISM_ERR_LIMIT ? GRPC_STATUS_RESOURCE_EXHAUSTED : GRPC_STATUS_INVALID_ARGUMENT,
                   message);
        return;
    }
    take_tensor_stats(j, job, peer->rank, r);
    /* The rank reported this step, whether the merger still takes it or not (a straggler's
     * late reports show how far behind it is). */
    prismd_rank_facts *f = rank_find(job, peer->rank);
    if (f && (!f->has_step || r->step > f->last_step)) {
        f->has_step = true;
        f->last_step = r->step;
    }
    if (!job->has_newest_step || r->step > job->newest_step) {
        job->has_newest_step = true;
        job->newest_step = r->step;
    }
    if (outcome == PRISM_MERGE_DROPPED_LATE) {
        j->counters.reports_dropped_late++;
        return;
    }
    if (outcome == PRISM_MERGE_DROPPED_DUPLICATE) {
        j->counters.reports_dropped_repeated++;
        return;
    }
    j->counters.reports_accepted++;
    j->counters.block_records += r->n_blocks;
    drain_steps(j, job, now_ms);
}

/* A CalibrationReport (DESIGN 4.5), validated whole and then applied whole: a refused report
 * changes neither the job's policy nor the cache. Who may write the cache: a job writes the
 * errors of its own registered layout only, under the fingerprint of that layout (the
 * ModelLayout of its Hello); a report naming another fingerprint, or one sent by a job that
 * registered no fingerprint, is refused with PERMISSION_DENIED. */
static int compare_u32_ids(const void *a, const void *b)
{
    uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
    return (x > y) - (x < y);
}

/* A calibration names each block once: a repeat would make the kept error depend on the order of
 * the entries, and a recorded trace with it would not replay. Writes "calibration.errors[I]: block
 * B appears twice in the report" (I: the second entry) into message; PRISM_ERR_NOMEM when the
 * check could not be made. */
static prism_status calibration_repeats(const Prism__V1__CalibrationReport *c, char *message, size_t size)
{
    if (c->n_errors < 2)
        return PRISM_OK;
    uint32_t *ids = malloc(c->n_errors * sizeof *ids);
    if (!ids)
        return PRISM_ERR_NOMEM;
    for (size_t i = 0; i < c->n_errors; i++)
        ids[i] = c->errors[i]->block_id;
    qsort(ids, c->n_errors, sizeof *ids, compare_u32_ids);
    bool repeated = false;
    uint32_t id = 0;
    for (size_t i = 1; i < c->n_errors && !repeated; i++)
        if (ids[i] == ids[i - 1]) {
            repeated = true;
            id = ids[i];
        }
    free(ids);
    for (size_t i = 0, seen = 0; repeated && i < c->n_errors; i++)
        if (c->errors[i]->block_id == id && ++seen == 2) {
            snprintf(message, size, "calibration.errors[%zu]: block %u appears twice in the report", i, id);
            break;
        }
    return PRISM_OK;
}

static void on_calibration(prismd_jobs *j, prismd_stream *s, prismd_peer *peer, const Prism__V1__CalibrationReport *c)
{
    prismd_job *job = peer->job;
    prism_error err;
    /* Checked whole before anything is kept: the cache and the policy only take blocks the job
     * knows (from a layout or a report), so a report cannot grow either. */
    char message[256] = "";
    if (c->fingerprint.len > sizeof job->fingerprint)
        snprintf(message, sizeof message, "calibration.fingerprint: %zu bytes, at most %zu", c->fingerprint.len,
                 sizeof job->fingerprint);
    else if (c->n_errors > j->limits.max_blocks)
        snprintf(message, sizeof message, "calibration: %zu errors, more than the %zu blocks a job may have",
                 c->n_errors, j->limits.max_blocks);
    for (size_t i = 0; !message[0] && i < c->n_errors; i++) {
        uint32_t id = c->errors[i]->block_id;
        if (!job_has_block(job, id))
            snprintf(message, sizeof message, "calibration.errors[%zu]: block %u is in no layout or report of the job",
                     i, id);
    }
    if (!message[0] && calibration_repeats(c, message, sizeof message) == PRISM_ERR_NOMEM) {
        send_error(s, GRPC_STATUS_RESOURCE_EXHAUSTED, "out of memory");
        return;
    }
    if (message[0]) {
        j->counters.reports_rejected++;
        j->counters.calibrations_malformed++;
        send_error(s, GRPC_STATUS_INVALID_ARGUMENT, message);
        return;
    }
    if (c->fingerprint.len && (c->fingerprint.len != job->fingerprint_len ||
                               memcmp(c->fingerprint.data, job->fingerprint, job->fingerprint_len) != 0)) {
        j->counters.calibrations_foreign++;
        send_error(s, GRPC_STATUS_PERMISSION_DENIED,
                   job->fingerprint_len
                       ? "calibration.fingerprint: not the fingerprint of the job's model layout (a job may only "
                         "calibrate its own model)"
                       : "calibration.fingerprint: the job registered no model layout with a fingerprint (a job may "
                         "only calibrate its own model)");
        return;
    }
    /* The cache entry of a model belongs to the job that wrote it first: a job that claims
     * another job's model in its Hello still cannot overwrite that job's errors. */
    char owner[JOB_ID_MAX + 1];
    if (j->store && job->fingerprint_len && c->n_errors &&
        prismd_store_calibration_owner(j->store, job->fingerprint, job->fingerprint_len, owner, sizeof owner, &err) ==
            1 &&
        strcmp(owner, job->id) != 0) {
        j->counters.calibrations_foreign++;
        send_error(s, GRPC_STATUS_PERMISSION_DENIED,
                   "calibration: the cached errors of this model were written by another job (a job may only "
                   "calibrate its own model)");
        return;
    }
    uint32_t *ids = malloc((c->n_errors ? c->n_errors : 1) * sizeof *ids);
    double *errors = malloc((c->n_errors ? c->n_errors : 1) * sizeof *errors);
    if (!ids || !errors) {
        free(ids);
        free(errors);
        send_error(s, GRPC_STATUS_RESOURCE_EXHAUSTED, "out of memory");
        return;
    }
    for (size_t i = 0; i < c->n_errors; i++) {
        ids[i] = c->errors[i]->block_id;
        errors[i] = c->errors[i]->relative_error;
    }
    size_t bad;
    if (prism_policy_set_calibrations(job->policy, (prism_precision)c->format, ids, errors, c->n_errors, &bad,
                                      &err)) {
        j->counters.reports_rejected++;
        j->counters.calibrations_malformed++;
        bool bad_format = c->format == PRISM__V1__PRECISION__BF16 || (unsigned)c->format >= PRISM_PRECISION_COUNT;
        char why[700];
        if (bad_format)
            snprintf(why, sizeof why, "calibration.format: %s", err.message);
        else
            snprintf(why, sizeof why, "calibration.errors[%zu]: %s", bad, err.message);
        send_error(s, GRPC_STATUS_INVALID_ARGUMENT, why);
        free(ids);
        free(errors);
        return;
    }
    trace_calibration(j, job, (prism_precision)c->format, ids, errors, c->n_errors);
    j->counters.calibrations_accepted++;
    /* Any format is kept (the policy keeps errors per format), wanted or not. One that was still
     * wanted changes what every rank is asked for: each agent gets the config again with the
     * formats still wanted (ServiceMessage.config), so that a trainer calibrating format after
     * format, or another rank, sees at once which remain. */
    Prism__V1__Precision wanted[PRISM_LOW_FORMATS_MAX];
    size_t n_wanted = calibration_wanted(job, prism_policy_config(job->policy), wanted);
    bool was_wanted = false;
    for (size_t i = 0; i < n_wanted; i++)
        was_wanted = was_wanted || wanted[i] == c->format;
    job->calibrated[(prism_precision)c->format] = true;
    if (was_wanted)
        broadcast_config(job);
    /* Cached under the job's own fingerprint (the report's, when it names one, is the same). */
    if (j->store && job->fingerprint_len && c->n_errors &&
        prismd_store_save_calibration(j->store, job->fingerprint, job->fingerprint_len, job->id,
                                      (prism_precision)c->format, ids, errors, c->n_errors, &err))
        prism_log(PRISM_LOG_ERROR, "cannot cache calibration errors", "job", job->id, LOG_END);
    free(ids);
    free(errors);
}

/* An Ack: the map version the rank's trainer uses and the step it started at. */
static void on_ack(prismd_peer *peer, const Prism__V1__Ack *a)
{
    prismd_rank_facts *f = rank_find(peer->job, peer->rank);
    if (!f)
        return;
    f->has_ack = true;
    f->acked_map_version = a->map_version;
    f->applied_step = a->applied_step;
}

/* A Heartbeat: the trainer-side counters as the agent knows them; a counter it leaves out is
 * unknown again (an older agent never sends them). */
static void on_heartbeat(prismd_peer *peer, const Prism__V1__Heartbeat *h)
{
    prismd_rank_facts *f = rank_find(peer->job, peer->rank);
    if (!f)
        return;
    f->has_reports_dropped =
        h->optional_trainer_reports_dropped_case == PRISM__V1__HEARTBEAT__OPTIONAL_TRAINER_REPORTS_DROPPED_TRAINER_REPORTS_DROPPED;
    f->reports_dropped = f->has_reports_dropped ? h->trainer_reports_dropped : 0;
    f->has_late_switches =
        h->optional_trainer_late_switches_case == PRISM__V1__HEARTBEAT__OPTIONAL_TRAINER_LATE_SWITCHES_TRAINER_LATE_SWITCHES;
    f->late_switches = f->has_late_switches ? h->trainer_late_switches : 0;
}

bool prismd_jobs_agent_message(prismd_jobs *j, prismd_stream *s, prismd_peer *peer, const uint8_t *data,
                               size_t len, int64_t now_ms, prismd_status *end)
{
    j->dirty = true; /* every message moves a counter that /metrics shows */
    if (!strings_ok(&prism__v1__agent_message__descriptor, data, len, end)) {
        j->counters.streams_refused++;
        return false;
    }
    Prism__V1__AgentMessage *m = prism__v1__agent_message__unpack(NULL, len, data);
    if (!m) {
        j->counters.streams_refused++;
        return fail(end, GRPC_STATUS_INVALID_ARGUMENT, "a message that is not a prism.v1.AgentMessage");
    }
    bool ok = true;
    if (m->kind_case == PRISM__V1__AGENT_MESSAGE__KIND_HELLO) {
        ok = on_hello(j, s, peer, m->hello, now_ms, end);
    } else if (!peer->job) {
        ok = fail(end, GRPC_STATUS_FAILED_PRECONDITION, "the first message of a stream must be a Hello");
    } else {
        switch (m->kind_case) {
        case PRISM__V1__AGENT_MESSAGE__KIND_STEP_REPORT: on_step_report(j, s, peer, m->step_report, now_ms); break;
        case PRISM__V1__AGENT_MESSAGE__KIND_CALIBRATION: on_calibration(j, s, peer, m->calibration); break;
        case PRISM__V1__AGENT_MESSAGE__KIND_ACK: on_ack(peer, m->ack); break;
        case PRISM__V1__AGENT_MESSAGE__KIND_HEARTBEAT: on_heartbeat(peer, m->heartbeat); break;
        default: send_error(s, GRPC_STATUS_INVALID_ARGUMENT, "an AgentMessage with no kind set"); break;
        }
    }
    prism__v1__agent_message__free_unpacked(m, NULL);
    if (!ok)
        j->counters.streams_refused++;
    else if (peer->job)
        peer->job->last_active_ms = wall_ms();
    return ok;
}

void prismd_jobs_count_unimplemented(prismd_jobs *j)
{
    j->counters.unimplemented_calls++;
    j->dirty = true;
}

void prismd_jobs_stream_broken(prismd_jobs *j)
{
    j->counters.streams_broken++;
    j->dirty = true;
}

void prismd_jobs_stream_gone(prismd_jobs *j, prismd_stream *s, prismd_peer *peer)
{
    prismd_job *job = peer->job;
    if (!job)
        return;
    for (size_t i = 0; i < job->nagents; i++) {
        if (job->agents[i].stream == s) {
            job->agents[i] = job->agents[--job->nagents];
            prismd_rank_facts *f = rank_find(job, peer->rank);
            if (f)
                f->connected = false; /* its other facts stay: what it last said */
            job->last_active_ms = wall_ms(); /* the job is idle from now when it was its last agent */
            j->urgent = true;
            char rank[16];
            snprintf(rank, sizeof rank, "%u", peer->rank);
            prism_log(PRISM_LOG_INFO, "agent disconnected", "job", job->id, "rank", rank, LOG_END);
            break;
        }
    }
    for (size_t i = 0; i < job->nwatchers; i++) {
        if (job->watchers[i].stream == s) {
            job->watchers[i] = job->watchers[--job->nwatchers];
            break;
        }
    }
    peer->job = NULL;
}

bool prismd_jobs_get_block_map(prismd_jobs *j, const char *auth, const uint8_t *req, size_t len, uint8_t **out,
                               size_t *out_len, prismd_status *end)
{
    if (!strings_ok(&prism__v1__block_map_request__descriptor, req, len, end))
        return false;
    Prism__V1__BlockMapRequest *r = prism__v1__block_map_request__unpack(NULL, len, req);
    if (!r)
        return fail(end, GRPC_STATUS_INVALID_ARGUMENT, "a request that is not a prism.v1.BlockMapRequest");
    prismd_job *job = find_job(j, r->job_id ? r->job_id : "");
    bool ok = false;
    if (!job) {
        fail(end, GRPC_STATUS_NOT_FOUND, "job %s does not exist", r->job_id ? r->job_id : "");
    } else if (!grpc_authorized(j, job->id, job_token(j, job), auth, PRISMD_ACCESS_READ, end)) {
        /* end says why */
    } else {
        Prism__V1__PrecisionUpdate u;
        map_storage st;
        if (map_build(job, &u, &st)) {
            Prism__V1__BlockMap m = PRISM__V1__BLOCK_MAP__INIT;
            m.job_id = job->id;
            m.map_version = u.map_version;
            m.decided_step = u.decided_step;
            m.effective_step = u.effective_step;
            m.n_blocks = u.n_blocks;
            m.blocks = u.blocks;
            *out_len = prism__v1__block_map__get_packed_size(&m);
            *out = malloc(*out_len ? *out_len : 1);
            if (*out) {
                prism__v1__block_map__pack(&m, *out);
                ok = true;
            }
        }
        map_free(&st);
        if (!ok)
            fail(end, GRPC_STATUS_RESOURCE_EXHAUSTED, "out of memory");
    }
    prism__v1__block_map_request__free_unpacked(r, NULL);
    return ok;
}

bool prismd_jobs_watch(prismd_jobs *j, prismd_stream *s, prismd_peer *peer, const uint8_t *req, size_t len,
                       prismd_status *end)
{
    if (!strings_ok(&prism__v1__watch_request__descriptor, req, len, end))
        return false;
    Prism__V1__WatchRequest *r = prism__v1__watch_request__unpack(NULL, len, req);
    if (!r)
        return fail(end, GRPC_STATUS_INVALID_ARGUMENT, "a request that is not a prism.v1.WatchRequest");
    prismd_job *job = find_job(j, r->job_id ? r->job_id : "");
    bool ok = false;
    if (!job) {
        fail(end, GRPC_STATUS_NOT_FOUND, "job %s does not exist", r->job_id ? r->job_id : "");
    } else if (!grpc_authorized(j, job->id, job_token(j, job), peer->auth, PRISMD_ACCESS_READ, end)) {
        /* end says why */
    } else if (!grow((void **)&job->watchers, &job->cap_watchers, job->nwatchers + 1, sizeof *job->watchers)) {
        fail(end, GRPC_STATUS_RESOURCE_EXHAUSTED, "out of memory");
    } else {
        job->watchers[job->nwatchers++] = (watcher){s, peer};
        peer->job = job;
        peer->watcher = true;
        ok = true;
        if (prism_policy_map_version(job->policy) > r->after_version) {
            Prism__V1__PrecisionUpdate u;
            map_storage st;
            size_t ulen;
            uint8_t *ubuf = map_build(job, &u, &st) ? pack_update(&u, &ulen) : NULL;
            if (ubuf)
                prismd_stream_send(s, ubuf, ulen);
            free(ubuf);
            map_free(&st);
        }
    }
    prism__v1__watch_request__free_unpacked(r, NULL);
    return ok;
}

static int compare_snap_jobs(const void *a, const void *b)
{
    return strcmp(((const prismd_snap_job *)a)->id, ((const prismd_snap_job *)b)->id);
}

/* Frees what publish copied into a snapshot job that is not kept. */
static void snap_job_free(prismd_snap_job *sj)
{
    prism_config_free(&sj->config);
    for (size_t b = 0; b < sj->nblocks; b++)
        free(sj->names[b]);
    free(sj->names);
    free(sj->blocks);
    free(sj->token);
    for (size_t r = 0; r < sj->nranks; r++)
        prismd_rank_facts_clear(&sj->ranks[r]);
    free(sj->ranks);
    prismd_plan_view_free(&sj->plan);
}

/* Copies the job's rank facts into sj with the two counts of GET /v1/jobs; false when memory
 * runs out (sj->ranks then holds what was copied, for snap_job_free). */
static bool snap_ranks(prismd_snap_job *sj, const prismd_job *job)
{
    sj->has_newest_step = job->has_newest_step;
    sj->newest_step = job->newest_step;
    sj->ranks = calloc(job->nranks ? job->nranks : 1, sizeof *sj->ranks);
    if (!sj->ranks)
        return false;
    for (size_t r = 0; r < job->nranks; r++) {
        if (!prismd_rank_facts_copy(&sj->ranks[r], &job->ranks[r]))
            return false;
        sj->nranks++;
        const prismd_rank_facts *f = &sj->ranks[r];
        if (prismd_rank_lagging(f, sj->has_newest_step, sj->newest_step))
            sj->ranks_lagging++;
        if (f->connected && !prismd_rank_acked_current(f, sj->map_version))
            sj->ranks_not_acked++;
        if (f->has_late_switches) /* summed up to UINT64_MAX (counts from the wire) */
            sj->late_switches = f->late_switches > UINT64_MAX - sj->late_switches
                                    ? UINT64_MAX
                                    : sj->late_switches + f->late_switches;
    }
    return true;
}

/* Copies what REST and /metrics show into a new snapshot and makes it current. */
static void publish(prismd_jobs *j)
{
    prismd_snapshot *snap = calloc(1, sizeof *snap);
    if (!snap || !(snap->jobs = calloc(j->njobs ? j->njobs : 1, sizeof *snap->jobs))) {
        free(snap);
        return;
    }
    atomic_init(&snap->refs, 1);
    for (size_t i = 0; i < j->njobs; i++) {
        const prismd_job *job = j->jobs[i];
        prismd_snap_job *sj = &snap->jobs[snap->njobs];
        prism_error err;
        if (prism_config_copy(&sj->config, prism_policy_config(job->policy), &err))
            break;
        size_t n = prism_policy_block_count(job->policy);
        sj->blocks = malloc((n ? n : 1) * sizeof *sj->blocks);
        if (!sj->blocks) {
            prism_config_free(&sj->config);
            break;
        }
        sj->names = calloc(n ? n : 1, sizeof *sj->names);
        if (!sj->names) {
            free(sj->blocks);
            prism_config_free(&sj->config);
            break;
        }
        for (size_t b = 0; b < n; b++) {
            sj->blocks[b] = *prism_policy_block(job->policy, b);
            uint32_t ix = prism_idmap_get(&job->name_ix, sj->blocks[b].id);
            sj->names[b] = ix != PRISM_IDMAP_NONE && job->names[ix] ? strdup(job->names[ix]) : NULL;
        }
        sj->nblocks = n;
        snprintf(sj->id, sizeof sj->id, "%s", job->id);
        const char *token = job_token(j, job);
        sj->token = token ? strdup(token) : NULL;
        sj->hints_sent = job->hints_sent;
        sj->hints_h2d = job->hints.max_inflight_h2d;
        sj->hints_d2h = job->hints.max_inflight_d2h;
        sj->hints_prefetch = job->hints.prefetch_window;
        sj->hints_vram = job->hints.vram_pressure_threshold;
        sj->hints_suppress_backward = job->hints.suppress_prefetch_in_backward;
        sj->hints_suppress_optimizer = job->hints.suppress_prefetch_in_optimizer;
        sj->hints_map_version = job->hints_map_version;
        sj->world_size = job->world_size;
        sj->agents = (uint32_t)job->nagents;
        prism_policy_progress progress;
        prism_policy_progress_get(job->policy, &progress);
        sj->has_step = progress.has_last_step;
        sj->last_step = progress.last_step;
        sj->map_version = progress.map_version;
        sj->decided_step = job->decided_step;
        sj->effective_step = job->effective_step;
        sj->has_summary = job->has_summary;
        sj->summary = job->summary;
        sj->decided_unix = job->decided_unix;
        sj->decisions = job->decisions;
        sj->counters = progress.counters;
        memcpy(sj->switches, job->switches, sizeof sj->switches);
        if (!snap_ranks(sj, job) ||
            !prismd_plans_view(job->plans, prism_policy_config(job->policy), job->ranks, job->nranks, &sj->plan)) {
            snap_job_free(sj);
            break;
        }
        snap->njobs++;
    }
    qsort(snap->jobs, snap->njobs, sizeof *snap->jobs, compare_snap_jobs);
    const prismd_jobs_counters *c = &j->counters;
    snap->reports_accepted = c->reports_accepted;
    snap->reports_rejected = c->reports_rejected;
    snap->reports_dropped_late = c->reports_dropped_late;
    snap->reports_dropped_repeated = c->reports_dropped_repeated;
    snap->block_records = c->block_records;
    snap->decisions = c->decisions;
    snap->updates_sent = c->updates_sent;
    snap->store_errors = c->store_errors;
    snap->store_retries = c->store_retries;
    snap->maps_unsent = c->maps_unsent;
    snap->agents_refused = c->streams_refused;
    snap->streams_broken = c->streams_broken;
    snap->reports_step_out_of_range = c->reports_step_out_of_range;
    snap->calibrations_accepted = c->calibrations_accepted;
    snap->calibrations_malformed = c->calibrations_malformed;
    snap->calibrations_foreign = c->calibrations_foreign;
    snap->unimplemented_calls = c->unimplemented_calls;
    snap->agents_replaced = c->agents_replaced;
    snap->jobs_deleted = c->jobs_deleted;
    snap->jobs_expired = c->jobs_expired;
    snap->tensor_stats_accepted = c->tensor_stats_accepted;
    snap->tensor_stats_refused = c->tensor_stats_refused;
    if (j->limits.tokens) {
        snap->tokens_loads_ok = atomic_load(&j->limits.tokens->loads_ok);
        snap->tokens_loads_failed = atomic_load(&j->limits.tokens->loads_failed);
    }
    snap->tokens_provisioned = prismd_tokens_count(j->tokens);
    memcpy(snap->decision_buckets, j->decision_buckets, sizeof snap->decision_buckets);
    snap->decision_count = j->decision_count;
    snap->decision_seconds = j->decision_seconds;
    if (j->store)
        prismd_store_writes_get(j->store, &snap->store_writes);
    j->store_writes_published = snap->store_writes.count;
    prismd_snapshots_publish(j->snapshots, snap);
}

/* Removes a file tree bottom up, not following links. */
static int remove_entry(const char *path, const struct stat *sb, int flag, struct FTW *ftw)
{
    (void)sb;
    (void)ftw;
    if ((flag == FTW_DP ? rmdir(path) : unlink(path)) != 0)
        prism_log(PRISM_LOG_WARN, "cannot remove a deleted job's file", "path", path, "error", strerror(errno),
                  LOG_END);
    return 0;
}

/* Deletes the job at index i: durable first (the store), then its streams end with code and
 * why, it leaves memory, and its files under DATA_DIR/jobs/JOB/ go. When the store cannot
 * delete it, nothing changes and err says why. */
static prism_status delete_job(prismd_jobs *j, size_t i, int code, const char *why, prism_error *err)
{
    prismd_job *job = j->jobs[i];
    if (j->store && prismd_store_delete_job(j->store, job->id, err)) {
        j->counters.store_errors++;
        return err->status;
    }
    for (size_t k = 0; k < job->nagents; k++) {
        job->agents[k].peer->job = NULL;
        prismd_stream_end(job->agents[k].stream, code, why);
    }
    for (size_t k = 0; k < job->nwatchers; k++) {
        job->watchers[k].peer->job = NULL;
        prismd_stream_end(job->watchers[k].stream, code, why);
    }
    j->jobs[i] = j->jobs[--j->njobs];
    char dir[4096] = "";
    if (j->limits.data_dir)
        prismd_job_file(j->limits.data_dir, job->id, "", dir, sizeof dir);
    job_free(job); /* closes the telemetry file first */
    struct stat sb;
    if (dir[0] && lstat(dir, &sb) == 0 && S_ISDIR(sb.st_mode))
        nftw(dir, remove_entry, 16, FTW_DEPTH | FTW_PHYS);
    j->urgent = true;
    return PRISM_OK;
}

/* Takes a reloaded token table, saves activity times the store lacks (at once for a job with no
 * agent, whose idle time counts; at most every tenth of the expiry, 1 s to 5 min, otherwise),
 * and deletes jobs idle past --job-idle-expiry. At most every 100 ms. */
static void housekeeping(prismd_jobs *j, int64_t now_ms)
{
    prismd_tokens *fresh;
    if (j->limits.tokens && prismd_token_box_take(j->limits.tokens, &fresh)) {
        bool changed = !prismd_tokens_same(j->tokens, fresh);
        prismd_tokens_free(j->tokens);
        j->tokens = fresh;
        if (changed)
            j->urgent = true; /* REST checks tokens from the snapshot */
        else
            j->dirty = true;  /* the count of loads moved */
    }
    if (j->limits.tokens && atomic_load(&j->limits.tokens->loads_failed) != j->token_loads_failed_seen) {
        j->token_loads_failed_seen = atomic_load(&j->limits.tokens->loads_failed);
        j->dirty = true;
    }
    if (j->last_expiry_check_ms && now_ms - j->last_expiry_check_ms < 100)
        return;
    j->last_expiry_check_ms = now_ms;
    int64_t wall = wall_ms();
    /* While agents are connected the stored time may lag by a tenth of the expiry (1 s to
     * 5 min): what a kill -9 then costs is expiring that much early. */
    int64_t save_every = j->limits.idle_expiry_ms ? j->limits.idle_expiry_ms / 10 : 300000;
    save_every = save_every < 1000 ? 1000 : save_every > 300000 ? 300000 : save_every;
    for (size_t i = 0; i < j->njobs;) {
        prismd_job *job = j->jobs[i];
        int64_t idle = wall - job->last_active_ms;
        if (j->limits.idle_expiry_ms > 0 && job->nagents == 0 && idle > j->limits.idle_expiry_ms) {
            char id[sizeof job->id], why[320], seconds[32];
            snprintf(id, sizeof id, "%s", job->id);
            snprintf(seconds, sizeof seconds, "%.3f", (double)idle / 1000.0);
            snprintf(why, sizeof why, "job %s was deleted: idle for %s s, over --job-idle-expiry", id, seconds);
            prism_error err;
            if (delete_job(j, i, GRPC_STATUS_NOT_FOUND, why, &err) == PRISM_OK) {
                j->counters.jobs_expired++;
                prism_log(PRISM_LOG_INFO, "job expired", "job", id, "idle_s", seconds, LOG_END);
                continue; /* another job moved to i */
            }
            prism_log(PRISM_LOG_ERROR, "cannot delete an expired job", "job", id, "error", err.message, LOG_END);
        }
        if (j->store && job->last_active_ms != job->saved_active_ms &&
            (job->nagents == 0 || job->last_active_ms - job->saved_active_ms >= save_every)) {
            prism_error err;
            if (prismd_store_save_activity(j->store, job->id, job->last_active_ms, &err) == PRISM_OK)
                job->saved_active_ms = job->last_active_ms;
            else
                prism_log(PRISM_LOG_ERROR, "cannot save a job's activity", "job", job->id, "error", err.message,
                          LOG_END);
        }
        i++;
    }
}

int64_t prismd_jobs_tick(prismd_jobs *j, int64_t now_ms)
{
    housekeeping(j, now_ms);
    int64_t next = -1;
    for (size_t i = 0; i < j->njobs; i++) {
        prismd_job *job = j->jobs[i];
        drain_steps(j, job, now_ms);
        int64_t wait = prism_merger_wait_ms(job->merger, now_ms);
        if (job->map_unsent) { /* a map not saved or not sent: retried at unsent_retry_ms (backing off) */
            if (now_ms >= job->unsent_retry_ms && save_and_send(j, job, NULL, 0, false, true, now_ms))
                j->urgent = true;
            if (job->map_unsent) {
                int64_t until = job->unsent_retry_ms > now_ms ? job->unsent_retry_ms - now_ms : 0;
                if (wait < 0 || wait > until)
                    wait = until;
            }
        }
        if (wait >= 0 && (next < 0 || wait < next))
            next = wait;
    }
    if (j->store) { /* a write no other change published (an activity time, a config) still shows */
        prismd_store_writes w;
        prismd_store_writes_get(j->store, &w);
        if (w.count != j->store_writes_published)
            j->dirty = true;
    }
    if (j->snapshots && (j->urgent || (j->dirty && now_ms - j->last_publish_ms >= 250))) {
        publish(j);
        j->urgent = j->dirty = false;
        j->last_publish_ms = now_ms;
    }
    return next;
}

void prismd_jobs_for_each_stream(prismd_jobs *j, void (*fn)(prismd_stream *s, void *ctx), void *ctx)
{
    for (size_t i = 0; i < j->njobs; i++) {
        prismd_job *job = j->jobs[i];
        for (size_t k = 0; k < job->nagents; k++)
            fn(job->agents[k].stream, ctx);
        for (size_t k = 0; k < job->nwatchers; k++)
            fn(job->watchers[k].stream, ctx);
    }
}

/* ---- REST mutations ---- */

/* A JSON answer (malloc'd) from a jansson object (taken). */
static char *render(json_t *obj)
{
    char *text = obj ? prism_json_dumps_exact(obj, JSON_COMPACT | JSON_PRESERVE_ORDER) : NULL;
    json_decref(obj);
    return text;
}

static char *error_answer(const char *code, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

static char *error_answer(const char *code, const char *fmt, ...)
{
    char message[600];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(message, sizeof message, fmt, ap);
    va_end(ap);
    return render(json_pack("{s:{s:s, s:s}}", "error", "code", code, "message", message));
}

static unsigned run_command(prismd_jobs *j, const prismd_command *c, char **answer)
{
    prismd_job *job = find_job(j, c->job_id);
    if (!job) {
        *answer = error_answer("not_found", "job %.128s does not exist", c->job_id);
        return 404;
    }
    bool deleting = c->kind == PRISMD_COMMAND_DELETE_JOB;
    prismd_auth a = prismd_auth_check(&j->rule, job_token(j, job), c->auth,
                                      deleting ? PRISMD_ACCESS_DELETE : PRISMD_ACCESS_CHANGE);
    if (a != PRISMD_AUTH_OK) {
        *answer = prismd_auth_answer(a, deleting ? PRISMD_ACCESS_DELETE : PRISMD_ACCESS_CHANGE, job->id);
        return a == PRISMD_AUTH_MISSING ? 401 : 403;
    }
    if (deleting) {
        prism_error err;
        char why[320];
        snprintf(why, sizeof why, "job %s was deleted (DELETE /v1/jobs/%s)", job->id, job->id);
        char id[sizeof job->id];
        snprintf(id, sizeof id, "%s", job->id);
        size_t i = 0;
        while (j->jobs[i] != job)
            i++;
        if (delete_job(j, i, GRPC_STATUS_NOT_FOUND, why, &err)) {
            *answer = error_answer("unavailable", "the store cannot delete job %s: %s", id, err.message);
            return 503;
        }
        j->counters.jobs_deleted++;
        prism_log(PRISM_LOG_INFO, "job deleted", "job", id, LOG_END);
        *answer = render(json_pack("{s:s, s:b}", "job_id", id, "deleted", 1));
        return *answer ? 200 : 500;
    }
    json_error_t jerr;
    json_t *body = json_loadb(c->body, c->body_len, JSON_REJECT_DUPLICATES, &jerr);
    if (!body) {
        *answer = error_answer("invalid_argument", "body: line %d, column %d: %s", jerr.line, jerr.column, jerr.text);
        return 400;
    }
    if (!json_is_object(body)) {
        json_decref(body);
        *answer = error_answer("invalid_argument", "body: expected a JSON object");
        return 400;
    }
    json_t *changes = body;
    if (c->kind == PRISMD_COMMAND_PUT_OVERRIDES) {
        /* PUT replaces both lists: a missing one is empty. */
        const char *key;
        json_t *value;
        json_object_foreach(body, key, value) {
            if (strcmp(key, "force_bf16_blocks") != 0 && strcmp(key, "force_int8_blocks") != 0) {
                *answer = error_answer("invalid_argument",
                                       "%s: unknown key (overrides take force_bf16_blocks and force_int8_blocks)", key);
                json_decref(body);
                return 400;
            }
        }
        changes = json_object();
        json_t *bf16 = json_object_get(body, "force_bf16_blocks");
        json_t *low = json_object_get(body, "force_int8_blocks");
        json_object_set_new(changes, "force_bf16_blocks", bf16 ? json_incref(bf16) : json_array());
        json_object_set_new(changes, "force_int8_blocks", low ? json_incref(low) : json_array());
        json_decref(body);
    }
    prism_config cfg;
    prism_error err;
    prism_status st = prism_config_apply_json(prism_policy_next_config(job->policy), changes, "", &cfg, &err);
    json_decref(changes);
    if (st) {
        *answer = error_answer("invalid_argument", "%s", err.message);
        return 400;
    }
    /* Durable first, as every change of a job. */
    if (j->store && prismd_store_save_job(j->store, job->id, job->token, job->world_size, &cfg, &err)) {
        prism_config_free(&cfg);
        j->counters.store_errors++;
        *answer = error_answer("unavailable", "the store cannot save the change: %s", err.message);
        return 503;
    }
    if ((st = prism_policy_set_config(job->policy, &cfg, &err))) {
        prism_config_free(&cfg);
        *answer = error_answer("invalid_argument", "%s", err.message);
        return 400;
    }
    trace_config(j, job, &cfg);
    prism_log(PRISM_LOG_INFO, c->kind == PRISMD_COMMAND_PATCH_CONFIG ? "config changed" : "overrides changed", "job",
               job->id, "applies", "at the next decision", LOG_END);
    *answer = render(json_pack("{s:s, s:s, s:o}", "job_id", job->id, "applies", "at the next decision", "config",
                               prism_config_to_json(&cfg)));
    prism_config_free(&cfg);
    return *answer ? 200 : 500;
}

void prismd_jobs_run_commands(prismd_jobs *j, prismd_commands *q)
{
    prismd_command *c = prismd_commands_take(q);
    while (c) {
        prismd_command *next = c->next;
        char *answer = NULL;
        /* A change whose caller gave up waiting (and was told so) is not applied. */
        unsigned status = prismd_commands_abandoned(q, c) ? 503 : run_command(j, c, &answer);
        prismd_commands_answer(q, c, status, answer);
        c = next;
    }
}
