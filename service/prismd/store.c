/* The store (store.h). A job's blocks are saved as one blob per state row: one row written per
 * decision whatever the number of blocks, and read back whole at start. Blob layout, host byte
 * order (little-endian on every machine Prism runs on):
 *   "PRB3" u32 count, then the job's numerics (issue 17, DESIGN 4.7): u64 loss_spikes,
 *   loss_spike_decisions, blocks_rolled_back (prism_policy_counters), u32 loss_len, f64
 *   losses[loss_len] (W, oldest first); then per block: u32 id, u8 precision, u8 reason, u8 flags
 *   (1 has_switch, 2 assigned), u8 0, u64 last_switch_step, u64 param_bytes_bf16, f64
 *   calibration[5], u32 window_len, f64 window[window_len] (oldest first), then the scores of the
 *   last decision: u8 flags (1 has_score, 2 has_error_score), u8 0[7], f64 sensitivity,
 *   grad_score, relative_magnitude, error_score; then its numerics: u8 candidate (a low format),
 *   u8 flags (1 held, 2 has_saturation, 4 the window's entries carry figures), u8 0[6], u64
 *   hold_until (0 unless held), f64 saturated_fraction, underflowed_fraction (the view's, 0 unless
 *   has_saturation), and with flag 4: u8 has[window_len] (0 or 1), f64 saturated[window_len],
 *   f64 underflowed[window_len] (0 where has is 0).
 * "PRB2" blobs (schemas 2 and 3, before issue 17) are read too: the same less the job's numerics
 * and the blocks' (W empty, counters 0, no hold, no figures; the candidate is the config's one
 * low format until the next decision); "PRB1" (schema 1) less the scores as well, which come back
 * unknown. A prismd older than PRB3 refuses a PRB3 blob as damaged.
 * The summary column holds the telemetry summary of the job's last decision (NULL: none):
 *   "PRS3" u32 low_precision, u64 step_id, map_version, blocks_bf16, blocks_low,
 *   precision_changes, scored, f64 mean_sensitivity, max_sensitivity, min_sensitivity,
 *   bandwidth_saving_pct, decided_unix (the decision's wall-clock time, Unix seconds; NaN: not
 *   known), u64 blocks_by_precision[5] (enum order), u8 loss_spike (0 or 1), u8 0[7].
 *   "PRS2" blobs are read too: the same less blocks_by_precision and loss_spike (a single low
 *   format then: blocks_bf16 at bf16, blocks_low at low_precision; loss_spike false); "PRS1"
 *   (written before decided_unix) less decided_unix as well, which comes back not known. A prismd
 *   older than a blob's version refuses it as damaged: going back to one needs a store it wrote.
 * Schema 2 added job_state.summary and the scores; schema 3 the table job_plan (hybrid-device
 * plans, issue 15). Older stores are migrated when opened, one version at a time. */
#define _POSIX_C_SOURCE 200809L
#include "store.h"

#include <jansson.h>
#include <math.h>
#include <sqlite3.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define SCHEMA_VERSION "3"

const double prismd_store_write_buckets[PRISMD_STORE_WRITE_BUCKETS] = {0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025,
                                                                      0.05,   0.1,   0.25,   0.5,   1,    2.5};

struct prismd_store {
    sqlite3 *db;
    sqlite3_stmt *save_state, *save_switch, *save_calibration;
    prismd_store_writes writes; /* committed write transactions, for /metrics */
};

/* The start of a write transaction, for write_committed. */
static struct timespec write_start(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t;
}

/* Counts a write transaction that started at t0 and has just committed. */
static void write_committed(prismd_store *s, struct timespec t0)
{
    struct timespec t1;
    clock_gettime(CLOCK_MONOTONIC, &t1);
    double seconds = (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) / 1e9;
    for (int b = 0; b < PRISMD_STORE_WRITE_BUCKETS; b++)
        if (seconds <= prismd_store_write_buckets[b])
            s->writes.buckets[b]++;
    s->writes.count++;
    s->writes.seconds += seconds;
}

void prismd_store_writes_get(const prismd_store *s, prismd_store_writes *out)
{
    *out = s->writes;
}

static const char *const schema =
    "CREATE TABLE IF NOT EXISTS meta(key TEXT PRIMARY KEY, value TEXT NOT NULL);"
    "CREATE TABLE IF NOT EXISTS jobs(id TEXT PRIMARY KEY, token TEXT, world_size INTEGER NOT NULL,"
    " config TEXT NOT NULL);"
    "CREATE TABLE IF NOT EXISTS job_state(job_id TEXT PRIMARY KEY REFERENCES jobs(id), map_version INTEGER NOT NULL,"
    " decided_step INTEGER NOT NULL, effective_step INTEGER NOT NULL, steps_collected INTEGER NOT NULL,"
    " has_last_step INTEGER NOT NULL, last_step INTEGER NOT NULL, blocks BLOB NOT NULL, summary BLOB);"
    "CREATE TABLE IF NOT EXISTS switches(job_id TEXT NOT NULL, block_id INTEGER NOT NULL, from_precision TEXT NOT NULL,"
    " to_precision TEXT NOT NULL, step INTEGER NOT NULL, reason TEXT NOT NULL, map_version INTEGER NOT NULL);"
    "CREATE INDEX IF NOT EXISTS switches_by_block ON switches(job_id, block_id, step);"
    "CREATE TABLE IF NOT EXISTS calibration(fingerprint BLOB NOT NULL, format TEXT NOT NULL, block_id INTEGER NOT NULL,"
    " relative_error REAL NOT NULL, PRIMARY KEY(fingerprint, format, block_id));"
    "CREATE TABLE IF NOT EXISTS job_activity(job_id TEXT PRIMARY KEY, last_active_ms INTEGER NOT NULL);"
    "CREATE TABLE IF NOT EXISTS calibration_owner(fingerprint BLOB PRIMARY KEY, job_id TEXT NOT NULL);"
    "CREATE TABLE IF NOT EXISTS job_plan(job_id TEXT PRIMARY KEY REFERENCES jobs(id), map_version INTEGER NOT NULL,"
    " decided_step INTEGER NOT NULL, effective_step INTEGER NOT NULL, status TEXT NOT NULL, message TEXT NOT NULL,"
    " plan TEXT);"
    "INSERT OR IGNORE INTO meta(key, value) VALUES('schema_version', '" SCHEMA_VERSION "');";

static prism_status db_error(prismd_store *s, prism_error *err, const char *what)
{
    return prism_error_set(err, PRISM_ERR_IO, "store: %s: %s", what, sqlite3_errmsg(s->db));
}

static prism_status exec(prismd_store *s, const char *sql, prism_error *err)
{
    char *msg = NULL;
    if (sqlite3_exec(s->db, sql, NULL, NULL, &msg) != SQLITE_OK) {
        prism_status st = prism_error_set(err, PRISM_ERR_IO, "store: %s", msg ? msg : sqlite3_errmsg(s->db));
        sqlite3_free(msg);
        return st;
    }
    return PRISM_OK;
}

/* The store's schema version as text in out ("" when the store has none). */
static void schema_version(prismd_store *s, char *out, size_t len)
{
    sqlite3_stmt *version = NULL;
    out[0] = '\0';
    if (sqlite3_prepare_v2(s->db, "SELECT value FROM meta WHERE key='schema_version'", -1, &version, NULL) ==
            SQLITE_OK &&
        sqlite3_step(version) == SQLITE_ROW && sqlite3_column_text(version, 0))
        snprintf(out, len, "%s", (const char *)sqlite3_column_text(version, 0));
    sqlite3_finalize(version);
}

/* Brings a store of schema 1 to schema 2 in one transaction (job_state gains its summary
 * column; saved blocks keep their PRB1 blobs, read as before), then schema 2 to 3 (job_plan, made
 * by the schema text already: only the version moves); refuses any other version. */
static prism_status migrate(prismd_store *s, const char *path, prism_error *err)
{
    char version[32];
    schema_version(s, version, sizeof version);
    if (strcmp(version, "1") == 0) {
        prism_status rc = exec(s, "BEGIN IMMEDIATE; ALTER TABLE job_state ADD COLUMN summary BLOB;"
                                  " UPDATE meta SET value = '2' WHERE key = 'schema_version';"
                                  " COMMIT;", err);
        if (rc) {
            if (!sqlite3_get_autocommit(s->db))
                exec(s, "ROLLBACK", NULL);
            prism_error_prefix(err, "%s: migrating schema 1 to 2", path);
            return rc;
        }
        schema_version(s, version, sizeof version);
    }
    if (strcmp(version, "2") == 0) {
        prism_status rc = exec(s, "UPDATE meta SET value = '3' WHERE key = 'schema_version'", err);
        if (rc) {
            prism_error_prefix(err, "%s: migrating schema 2 to 3", path);
            return rc;
        }
        schema_version(s, version, sizeof version);
    }
    if (strcmp(version, SCHEMA_VERSION) != 0)
        return prism_error_set(err, PRISM_ERR_INVALID, "store: %s has schema version %s; this prismd reads 1 to %s",
                               path, version, SCHEMA_VERSION);
    return PRISM_OK;
}

void prismd_store_close(prismd_store *s)
{
    if (!s)
        return;
    sqlite3_finalize(s->save_state);
    sqlite3_finalize(s->save_switch);
    sqlite3_finalize(s->save_calibration);
    sqlite3_close(s->db);
    free(s);
}

prismd_store *prismd_store_open(const char *data_dir, prism_error *err)
{
    prismd_store *s = calloc(1, sizeof *s);
    if (!s) {
        prism_error_set(err, PRISM_ERR_NOMEM, "out of memory");
        return NULL;
    }
    char path[4096];
    snprintf(path, sizeof path, "%s/prism.db", data_dir);
    if (sqlite3_open_v2(path, &s->db, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE | SQLITE_OPEN_FULLMUTEX, NULL) !=
        SQLITE_OK) {
        prism_error_set(err, PRISM_ERR_IO, "store: cannot open %s: %s", path,
                        s->db ? sqlite3_errmsg(s->db) : "out of memory");
        prismd_store_close(s);
        return NULL;
    }
    sqlite3_busy_timeout(s->db, 5000);
    /* WAL with full sync: a committed decision survives kill -9 and power loss alike. */
    if (exec(s, "PRAGMA journal_mode=WAL; PRAGMA synchronous=FULL; PRAGMA foreign_keys=ON;", err) ||
        exec(s, schema, err)) {
        prism_error_prefix(err, "%s", path);
        prismd_store_close(s);
        return NULL;
    }
    if (migrate(s, path, err)) {
        prismd_store_close(s);
        return NULL;
    }
    if (sqlite3_prepare_v2(s->db,
                           "INSERT OR REPLACE INTO job_state(job_id, map_version, decided_step, effective_step,"
                           " steps_collected, has_last_step, last_step, blocks, summary) VALUES(?,?,?,?,?,?,?,?,?)",
                           -1, &s->save_state, NULL) != SQLITE_OK ||
        sqlite3_prepare_v2(s->db,
                           "INSERT INTO switches(job_id, block_id, from_precision, to_precision, step, reason,"
                           " map_version) VALUES(?,?,?,?,?,?,?)",
                           -1, &s->save_switch, NULL) != SQLITE_OK ||
        sqlite3_prepare_v2(s->db,
                           "INSERT OR REPLACE INTO calibration(fingerprint, format, block_id, relative_error)"
                           " VALUES(?,?,?,?)",
                           -1, &s->save_calibration, NULL) != SQLITE_OK) {
        db_error(s, err, "prepare");
        prismd_store_close(s);
        return NULL;
    }
    return s;
}

prismd_store *prismd_store_open_reader(const char *data_dir, prism_error *err)
{
    prismd_store *s = calloc(1, sizeof *s);
    if (!s) {
        prism_error_set(err, PRISM_ERR_NOMEM, "out of memory");
        return NULL;
    }
    char path[4096];
    snprintf(path, sizeof path, "%s/prism.db", data_dir);
    if (sqlite3_open_v2(path, &s->db, SQLITE_OPEN_READONLY | SQLITE_OPEN_FULLMUTEX, NULL) != SQLITE_OK) {
        prism_error_set(err, PRISM_ERR_IO, "store: cannot open %s: %s", path,
                        s->db ? sqlite3_errmsg(s->db) : "out of memory");
        prismd_store_close(s);
        return NULL;
    }
    sqlite3_busy_timeout(s->db, 1000);
    return s;
}

long prismd_store_switch_history(prismd_store *s, const char *job_id, uint32_t block_id, prismd_switch_row *rows,
                                 size_t max, prism_error *err)
{
    sqlite3_stmt *st = NULL;
    if (sqlite3_prepare_v2(s->db,
                           "SELECT from_precision, to_precision, reason, step, map_version FROM switches"
                           " WHERE job_id = ? AND block_id = ? ORDER BY step DESC, rowid DESC LIMIT ?",
                           -1, &st, NULL) != SQLITE_OK) {
        db_error(s, err, "switch history");
        return -1;
    }
    sqlite3_bind_text(st, 1, job_id, -1, SQLITE_STATIC);
    sqlite3_bind_int64(st, 2, block_id);
    sqlite3_bind_int64(st, 3, (sqlite3_int64)max);
    long n = 0;
    int step;
    while ((step = sqlite3_step(st)) == SQLITE_ROW) {
        prismd_switch_row *r = &rows[n++];
        snprintf(r->from, sizeof r->from, "%s", (const char *)sqlite3_column_text(st, 0));
        snprintf(r->to, sizeof r->to, "%s", (const char *)sqlite3_column_text(st, 1));
        snprintf(r->reason, sizeof r->reason, "%s", (const char *)sqlite3_column_text(st, 2));
        r->step = (uint64_t)sqlite3_column_int64(st, 3);
        r->map_version = (uint64_t)sqlite3_column_int64(st, 4);
    }
    if (step != SQLITE_DONE) {
        db_error(s, err, "switch history");
        n = -1;
    }
    sqlite3_finalize(st);
    return n;
}

prism_status prismd_store_save_job(prismd_store *s, const char *job_id, const char *token, uint32_t world_size,
                                   const prism_config *cfg, prism_error *err)
{
    json_t *obj = prism_config_to_json(cfg);
    char *config = obj ? json_dumps(obj, JSON_COMPACT | JSON_SORT_KEYS) : NULL;
    json_decref(obj);
    if (!config)
        return prism_error_set(err, PRISM_ERR_NOMEM, "out of memory");
    sqlite3_stmt *st = NULL;
    prism_status rc = PRISM_OK;
    struct timespec t0 = write_start();
    if (sqlite3_prepare_v2(s->db, "INSERT INTO jobs(id, token, world_size, config) VALUES(?,?,?,?) ON CONFLICT(id) DO UPDATE SET"
                           " token = excluded.token, world_size = excluded.world_size, config = excluded.config", -1,
                           &st, NULL) != SQLITE_OK) {
        rc = db_error(s, err, "save job");
    } else {
        sqlite3_bind_text(st, 1, job_id, -1, SQLITE_TRANSIENT);
        if (token)
            sqlite3_bind_text(st, 2, token, -1, SQLITE_TRANSIENT);
        else
            sqlite3_bind_null(st, 2);
        sqlite3_bind_int64(st, 3, world_size);
        sqlite3_bind_text(st, 4, config, -1, SQLITE_TRANSIENT);
        if (sqlite3_step(st) != SQLITE_DONE)
            rc = db_error(s, err, "save job");
    }
    sqlite3_finalize(st);
    if (!rc)
        write_committed(s, t0);
    free(config);
    return rc;
}

/* ---- the blocks blob ---- */

typedef struct blob {
    uint8_t *data;
    size_t len, cap;
    bool failed;
} blob;

static void put(blob *b, const void *p, size_t n)
{
    if (b->failed)
        return;
    if (b->len + n > b->cap) {
        size_t ncap = b->cap ? b->cap * 2 : 4096;
        while (ncap < b->len + n)
            ncap *= 2;
        uint8_t *nd = realloc(b->data, ncap);
        if (!nd) {
            b->failed = true;
            return;
        }
        b->data = nd;
        b->cap = ncap;
    }
    memcpy(b->data + b->len, p, n);
    b->len += n;
}

/* Room for one block's record (prism_policy_block_record) while encoding. */
typedef struct record_room {
    double window[PRISM_WINDOW_MAX];
    uint8_t has[PRISM_WINDOW_MAX];
    double saturated[PRISM_WINDOW_MAX], underflowed[PRISM_WINDOW_MAX];
} record_room;

static bool encode_blocks(const prism_policy *p, blob *b)
{
    uint32_t count = (uint32_t)prism_policy_block_count(p);
    put(b, "PRB3", 4);
    put(b, &count, 4);
    prism_policy_progress progress;
    prism_policy_progress_get(p, &progress);
    uint64_t counters[3] = {progress.counters.loss_spikes, progress.counters.loss_spike_decisions,
                            progress.counters.blocks_rolled_back};
    double *losses = malloc(((size_t)progress.loss_len + 1) * sizeof *losses);
    record_room *room = malloc(sizeof *room);
    if (!losses || !room) {
        free(losses);
        free(room);
        return false;
    }
    uint32_t loss_len = (uint32_t)prism_policy_loss_window(p, losses);
    put(b, counters, sizeof counters);
    put(b, &loss_len, 4);
    put(b, losses, loss_len * sizeof *losses);
    free(losses);
    for (uint32_t i = 0; i < count; i++) {
        prism_block_record r = {.window = room->window, .window_has_saturation = room->has,
                                .window_saturated = room->saturated, .window_underflowed = room->underflowed};
        prism_policy_block_record(p, i, &r);
        uint8_t head[4] = {(uint8_t)r.view.precision, (uint8_t)r.view.reason,
                           (uint8_t)((r.view.has_switch ? 1 : 0) | (r.assigned ? 2 : 0)), 0};
        uint64_t last = r.view.has_switch ? r.view.last_switch_step : 0;
        put(b, &r.view.id, 4);
        put(b, head, 4);
        put(b, &last, 8);
        put(b, &r.view.param_bytes_bf16, 8);
        put(b, r.calibration, sizeof r.calibration);
        put(b, &r.window_len, 4);
        put(b, r.window, r.window_len * sizeof *r.window);
        uint8_t scores[8] = {(uint8_t)((r.view.has_score ? 1 : 0) | (r.view.has_error_score ? 2 : 0))};
        double values[4] = {r.view.sensitivity, r.view.grad_score, r.view.relative_magnitude, r.view.error_score};
        put(b, scores, sizeof scores);
        put(b, values, sizeof values);
        bool figures = false;
        for (uint32_t k = 0; k < r.window_len; k++) {
            if (!r.window_has_saturation[k])
                r.window_saturated[k] = r.window_underflowed[k] = 0.0;
            figures = figures || r.window_has_saturation[k];
        }
        uint8_t numerics[8] = {(uint8_t)r.view.candidate,
                               (uint8_t)((r.view.held ? 1 : 0) | (r.view.has_saturation ? 2 : 0) | (figures ? 4 : 0))};
        uint64_t hold_until = r.view.held ? r.view.hold_until : 0;
        double fractions[2] = {r.view.has_saturation ? r.view.saturated_fraction : 0.0,
                               r.view.has_saturation ? r.view.underflowed_fraction : 0.0};
        put(b, numerics, sizeof numerics);
        put(b, &hold_until, 8);
        put(b, fractions, sizeof fractions);
        if (figures) {
            put(b, r.window_has_saturation, r.window_len);
            put(b, r.window_saturated, r.window_len * sizeof(double));
            put(b, r.window_underflowed, r.window_len * sizeof(double));
        }
    }
    free(room);
    return !b->failed;
}

static bool encode_summary(const prism_summary *sm, double decided_unix, blob *b)
{
    uint32_t low = (uint32_t)sm->low_precision;
    uint64_t counts[6] = {sm->step_id, sm->map_version, sm->blocks_bf16, sm->blocks_low, sm->precision_changes,
                          sm->scored};
    double values[5] = {sm->mean_sensitivity, sm->max_sensitivity, sm->min_sensitivity, sm->bandwidth_saving_pct,
                        decided_unix};
    uint64_t by_precision[PRISM_PRECISION_COUNT];
    for (int k = 0; k < PRISM_PRECISION_COUNT; k++)
        by_precision[k] = sm->blocks_by_precision[k];
    uint8_t spike[8] = {sm->loss_spike ? 1 : 0};
    put(b, "PRS3", 4);
    put(b, &low, 4);
    put(b, counts, sizeof counts);
    put(b, values, sizeof values);
    put(b, by_precision, sizeof by_precision);
    put(b, spike, sizeof spike);
    return !b->failed;
}

typedef struct reader {
    const uint8_t *p;
    size_t left;
} reader;

static bool get(reader *r, void *out, size_t n)
{
    if (r->left < n)
        return false;
    memcpy(out, r->p, n);
    r->p += n;
    r->left -= n;
    return true;
}

/* Decodes a summary blob (PRS3; PRS2: blocks_by_precision from blocks_bf16 and blocks_low, no
 * spike; PRS1: that and *decided_unix NaN); false when it is damaged. */
static bool decode_summary(const uint8_t *data, size_t len, prism_summary *out, double *decided_unix)
{
    reader r = {data, len};
    char magic[4];
    uint32_t low;
    uint64_t counts[6];
    double values[5] = {0, 0, 0, 0, NAN};
    uint64_t by_precision[PRISM_PRECISION_COUNT] = {0};
    uint8_t spike[8] = {0};
    if (!get(&r, magic, 4) || memcmp(magic, "PRS", 3) != 0 || magic[3] < '1' || magic[3] > '3')
        return false;
    size_t nvalues = magic[3] >= '2' ? 5 : 4;
    bool numerics = magic[3] == '3';
    if (!get(&r, &low, 4) || !get(&r, counts, sizeof counts) || !get(&r, values, nvalues * sizeof *values) ||
        (numerics && (!get(&r, by_precision, sizeof by_precision) || !get(&r, spike, sizeof spike))) ||
        r.left != 0 || (low >= PRISM_PRECISION_COUNT && low != (uint32_t)PRISM_LOW_AUTO) || spike[0] > 1)
        return false;
    *decided_unix = values[4];
    *out = (prism_summary){.step_id = counts[0], .map_version = counts[1], .low_precision = (prism_precision)low,
                           .blocks_bf16 = (size_t)counts[2], .blocks_low = (size_t)counts[3],
                           .precision_changes = (size_t)counts[4], .scored = (size_t)counts[5],
                           .mean_sensitivity = values[0], .max_sensitivity = values[1],
                           .min_sensitivity = values[2], .bandwidth_saving_pct = values[3],
                           .loss_spike = spike[0] != 0};
    if (numerics) {
        for (int k = 0; k < PRISM_PRECISION_COUNT; k++)
            out->blocks_by_precision[k] = (size_t)by_precision[k];
    } else {
        /* Before issue 17 a job had one low format: every low block was in it. */
        out->blocks_by_precision[PRISM_PRECISION_BF16] = out->blocks_bf16;
        if (low < PRISM_PRECISION_COUNT && low != PRISM_PRECISION_BF16)
            out->blocks_by_precision[low] = out->blocks_low;
    }
    return true;
}

/* A decoded blocks blob: the records, the arrays their windows point into, and the job's numerics
 * (W and the counters; empty for PRB1 and PRB2). */
typedef struct decoded {
    prism_block_record *recs;
    size_t count;
    double *windows, *saturated, *underflowed, *losses;
    uint8_t *has;
    uint32_t loss_len;
    prism_policy_counters counters;
} decoded;

static void decoded_free(decoded *d)
{
    free(d->recs);
    free(d->windows);
    free(d->saturated);
    free(d->underflowed);
    free(d->losses);
    free(d->has);
    memset(d, 0, sizeof *d);
}

static bool fraction(double x)
{
    return x >= 0.0 && x <= 1.0; /* false for NaN */
}

/* Decodes a blob into d (PRB3, PRB2 or PRB1); false (d empty) when it is damaged: a short or long
 * blob, a value out of its range (a precision, reason, candidate or flag; a loss not finite; a
 * fraction outside [0, 1]). */
static bool decode_blocks(const uint8_t *data, size_t len, decoded *d)
{
    reader r = {data, len};
    char magic[4];
    uint32_t n;
    memset(d, 0, sizeof *d);
    if (!get(&r, magic, 4) || memcmp(magic, "PRB", 3) != 0 || magic[3] < '1' || magic[3] > '3' || !get(&r, &n, 4))
        return false;
    bool has_scores = magic[3] >= '2', numerics = magic[3] == '3';
    /* Every window value and every figure takes at least 8 bytes of the blob (a has byte 1), so
     * the blob bounds each array. */
    d->recs = calloc(n ? n : 1, sizeof *d->recs);
    d->windows = malloc(len + 8);
    d->has = numerics ? malloc(len + 1) : NULL;
    d->saturated = numerics ? malloc(len + 8) : NULL;
    d->underflowed = numerics ? malloc(len + 8) : NULL;
    d->losses = numerics ? malloc(len + 8) : NULL;
    if (!d->recs || !d->windows || (numerics && (!d->has || !d->saturated || !d->underflowed || !d->losses)))
        goto damaged;
    if (numerics) {
        uint64_t counters[3];
        if (!get(&r, counters, sizeof counters) || !get(&r, &d->loss_len, 4) || d->loss_len > PRISM_LOSS_WINDOW_MAX ||
            !get(&r, d->losses, d->loss_len * sizeof(double)))
            goto damaged;
        for (uint32_t k = 0; k < d->loss_len; k++)
            if (!isfinite(d->losses[k]))
                goto damaged;
        d->counters = (prism_policy_counters){counters[0], counters[1], counters[2]};
    }
    size_t used = 0, figures_used = 0;
    for (uint32_t i = 0; i < n; i++) {
        prism_block_record *rec = &d->recs[i];
        uint8_t head[4];
        uint64_t last;
        if (!get(&r, &rec->view.id, 4) || !get(&r, head, 4) || !get(&r, &last, 8) ||
            !get(&r, &rec->view.param_bytes_bf16, 8) || !get(&r, rec->calibration, sizeof rec->calibration) ||
            !get(&r, &rec->window_len, 4) || rec->window_len > PRISM_WINDOW_MAX ||
            head[0] >= PRISM_PRECISION_COUNT || head[1] > PRISM_REASON_MAX)
            goto damaged;
        rec->view.precision = (prism_precision)head[0];
        rec->view.reason = (prism_reason)head[1];
        rec->view.has_switch = head[2] & 1;
        rec->assigned = (head[2] & 2) != 0;
        rec->view.last_switch_step = last;
        rec->window = d->windows + used;
        if (!get(&r, rec->window, rec->window_len * sizeof(double)))
            goto damaged;
        used += rec->window_len;
        if (has_scores) {
            uint8_t scores[8];
            double values[4];
            if (!get(&r, scores, sizeof scores) || !get(&r, values, sizeof values) || scores[0] > 3)
                goto damaged;
            rec->view.has_score = scores[0] & 1;
            rec->view.has_error_score = (scores[0] & 2) != 0;
            rec->view.sensitivity = values[0];
            rec->view.grad_score = values[1];
            rec->view.relative_magnitude = values[2];
            rec->view.error_score = values[3];
        }
        if (!numerics)
            continue; /* candidate BF16: prism_policy_restore shows the config's low format */
        uint8_t head2[8];
        uint64_t hold_until;
        double fractions[2];
        if (!get(&r, head2, sizeof head2) || !get(&r, &hold_until, 8) || !get(&r, fractions, sizeof fractions) ||
            head2[0] >= PRISM_PRECISION_COUNT || head2[0] == PRISM_PRECISION_BF16 || head2[1] > 7 ||
            !fraction(fractions[0]) || !fraction(fractions[1]))
            goto damaged;
        rec->view.candidate = (prism_precision)head2[0];
        rec->view.held = head2[1] & 1;
        rec->view.hold_until = hold_until;
        rec->view.has_saturation = (head2[1] & 2) != 0;
        rec->view.saturated_fraction = fractions[0];
        rec->view.underflowed_fraction = fractions[1];
        if (!(head2[1] & 4))
            continue;
        rec->window_has_saturation = d->has + figures_used;
        rec->window_saturated = d->saturated + figures_used;
        rec->window_underflowed = d->underflowed + figures_used;
        if (!get(&r, rec->window_has_saturation, rec->window_len) ||
            !get(&r, rec->window_saturated, rec->window_len * sizeof(double)) ||
            !get(&r, rec->window_underflowed, rec->window_len * sizeof(double)))
            goto damaged;
        for (uint32_t k = 0; k < rec->window_len; k++)
            if (rec->window_has_saturation[k] > 1 || !fraction(rec->window_saturated[k]) ||
                !fraction(rec->window_underflowed[k]))
                goto damaged;
        figures_used += rec->window_len;
    }
    if (r.left != 0)
        goto damaged;
    d->count = n;
    return true;
damaged:
    decoded_free(d);
    return false;
}

prism_status prismd_store_save_state(prismd_store *s, const char *job_id, const prism_policy *p,
                                     uint64_t decided_step, uint64_t effective_step, const prism_change *changes,
                                     size_t change_count, const prism_summary *summary, double decided_unix,
                                     const prismd_plan_row *plan, prism_error *err)
{
    blob b = {0}, sb = {0};
    if (!encode_blocks(p, &b) || (summary && !encode_summary(summary, decided_unix, &sb))) {
        free(b.data);
        free(sb.data);
        return prism_error_set(err, PRISM_ERR_NOMEM, "out of memory");
    }
    prism_policy_progress progress;
    prism_policy_progress_get(p, &progress);
    struct timespec t0 = write_start();
    prism_status rc = exec(s, "BEGIN IMMEDIATE", err);
    if (rc) {
        free(b.data);
        free(sb.data);
        return rc;
    }
    sqlite3_stmt *st = s->save_state;
    sqlite3_reset(st);
    sqlite3_bind_text(st, 1, job_id, -1, SQLITE_TRANSIENT);
    sqlite3_bind_int64(st, 2, (sqlite3_int64)progress.map_version);
    sqlite3_bind_int64(st, 3, (sqlite3_int64)decided_step);
    sqlite3_bind_int64(st, 4, (sqlite3_int64)effective_step);
    sqlite3_bind_int64(st, 5, (sqlite3_int64)progress.steps_collected);
    sqlite3_bind_int(st, 6, progress.has_last_step);
    sqlite3_bind_int64(st, 7, (sqlite3_int64)progress.last_step);
    sqlite3_bind_blob(st, 8, b.data, (int)b.len, SQLITE_STATIC);
    if (summary)
        sqlite3_bind_blob(st, 9, sb.data, (int)sb.len, SQLITE_STATIC);
    else
        sqlite3_bind_null(st, 9);
    if (sqlite3_step(st) != SQLITE_DONE)
        rc = db_error(s, err, "save state");
    sqlite3_clear_bindings(st);
    for (size_t i = 0; !rc && i < change_count; i++) {
        const prism_change *c = &changes[i];
        sqlite3_stmt *w = s->save_switch;
        sqlite3_reset(w);
        sqlite3_bind_text(w, 1, job_id, -1, SQLITE_TRANSIENT);
        sqlite3_bind_int64(w, 2, c->block_id);
        sqlite3_bind_text(w, 3, prism_precision_name(c->from), -1, SQLITE_STATIC);
        sqlite3_bind_text(w, 4, prism_precision_name(c->to), -1, SQLITE_STATIC);
        sqlite3_bind_int64(w, 5, (sqlite3_int64)c->step);
        sqlite3_bind_text(w, 6, prism_reason_name(c->reason), -1, SQLITE_STATIC);
        sqlite3_bind_int64(w, 7, (sqlite3_int64)progress.map_version);
        if (sqlite3_step(w) != SQLITE_DONE)
            rc = db_error(s, err, "save switch");
    }
    if (!rc && plan) {
        sqlite3_stmt *w = NULL;
        if (sqlite3_prepare_v2(s->db,
                               "INSERT OR REPLACE INTO job_plan(job_id, map_version, decided_step, effective_step,"
                               " status, message, plan) VALUES(?,?,?,?,?,?,?)",
                               -1, &w, NULL) != SQLITE_OK) {
            rc = db_error(s, err, "save plan");
        } else {
            sqlite3_bind_text(w, 1, job_id, -1, SQLITE_TRANSIENT);
            sqlite3_bind_int64(w, 2, (sqlite3_int64)plan->map_version);
            sqlite3_bind_int64(w, 3, (sqlite3_int64)plan->decided_step);
            sqlite3_bind_int64(w, 4, (sqlite3_int64)plan->effective_step);
            sqlite3_bind_text(w, 5, plan->status, -1, SQLITE_STATIC);
            sqlite3_bind_text(w, 6, plan->message ? plan->message : "", -1, SQLITE_STATIC);
            if (plan->plan_json)
                sqlite3_bind_text(w, 7, plan->plan_json, -1, SQLITE_STATIC);
            else
                sqlite3_bind_null(w, 7);
            if (sqlite3_step(w) != SQLITE_DONE)
                rc = db_error(s, err, "save plan");
        }
        sqlite3_finalize(w);
    }
    if (rc) {
        prism_error keep = *err;
        exec(s, "ROLLBACK", NULL);
        *err = keep;
    } else if ((rc = exec(s, "COMMIT", err)) && !sqlite3_get_autocommit(s->db)) {
        prism_error keep = *err;
        exec(s, "ROLLBACK", NULL); /* a failed COMMIT can leave the transaction open */
        *err = keep;
    }
    if (!rc)
        write_committed(s, t0);
    free(b.data);
    free(sb.data);
    return rc;
}

prism_status prismd_store_save_calibration(prismd_store *s, const uint8_t *fingerprint, size_t fingerprint_len,
                                           const char *job_id, prism_precision format, const uint32_t *block_ids,
                                           const double *errors, size_t count, prism_error *err)
{
    struct timespec t0 = write_start();
    prism_status rc = exec(s, "BEGIN IMMEDIATE", err);
    sqlite3_stmt *own = NULL;
    if (!rc && sqlite3_prepare_v2(s->db, "INSERT OR IGNORE INTO calibration_owner(fingerprint, job_id) VALUES(?, ?)",
                                  -1, &own, NULL) != SQLITE_OK)
        rc = db_error(s, err, "save calibration owner");
    if (!rc) {
        sqlite3_bind_blob(own, 1, fingerprint, (int)fingerprint_len, SQLITE_TRANSIENT);
        sqlite3_bind_text(own, 2, job_id, -1, SQLITE_TRANSIENT);
        if (sqlite3_step(own) != SQLITE_DONE)
            rc = db_error(s, err, "save calibration owner");
    }
    sqlite3_finalize(own);
    for (size_t i = 0; !rc && i < count; i++) {
        sqlite3_stmt *st = s->save_calibration;
        sqlite3_reset(st);
        sqlite3_bind_blob(st, 1, fingerprint, (int)fingerprint_len, SQLITE_TRANSIENT);
        sqlite3_bind_text(st, 2, prism_precision_name(format), -1, SQLITE_STATIC);
        sqlite3_bind_int64(st, 3, block_ids[i]);
        sqlite3_bind_double(st, 4, errors[i]);
        if (sqlite3_step(st) != SQLITE_DONE)
            rc = db_error(s, err, "save calibration");
    }
    if (rc) {
        exec(s, "ROLLBACK", NULL);
        return rc;
    }
    if ((rc = exec(s, "COMMIT", err)) && !sqlite3_get_autocommit(s->db))
        exec(s, "ROLLBACK", NULL);
    if (!rc)
        write_committed(s, t0);
    return rc;
}

int prismd_store_calibration_owner(prismd_store *s, const uint8_t *fingerprint, size_t fingerprint_len, char *owner,
                                   size_t owner_len, prism_error *err)
{
    sqlite3_stmt *st = NULL;
    if (sqlite3_prepare_v2(s->db, "SELECT job_id FROM calibration_owner WHERE fingerprint = ?", -1, &st, NULL) !=
        SQLITE_OK) {
        db_error(s, err, "load calibration owner");
        return -1;
    }
    sqlite3_bind_blob(st, 1, fingerprint, (int)fingerprint_len, SQLITE_STATIC);
    int found = 0;
    int step = sqlite3_step(st);
    if (step == SQLITE_ROW) {
        snprintf(owner, owner_len, "%s", (const char *)sqlite3_column_text(st, 0));
        found = 1;
    } else if (step != SQLITE_DONE) {
        db_error(s, err, "load calibration owner");
        found = -1;
    }
    sqlite3_finalize(st);
    return found;
}

long prismd_store_load_calibration(prismd_store *s, const uint8_t *fingerprint, size_t fingerprint_len,
                                   void (*fn)(void *ctx, prism_precision format, uint32_t block_id, double error),
                                   void *ctx, prism_error *err)
{
    sqlite3_stmt *st = NULL;
    if (sqlite3_prepare_v2(s->db, "SELECT format, block_id, relative_error FROM calibration WHERE fingerprint = ?",
                           -1, &st, NULL) != SQLITE_OK) {
        db_error(s, err, "load calibration");
        return -1;
    }
    sqlite3_bind_blob(st, 1, fingerprint, (int)fingerprint_len, SQLITE_STATIC);
    long n = 0;
    int step;
    while ((step = sqlite3_step(st)) == SQLITE_ROW) {
        prism_precision format;
        if (!prism_precision_parse((const char *)sqlite3_column_text(st, 0), &format))
            continue;
        fn(ctx, format, (uint32_t)sqlite3_column_int64(st, 1), sqlite3_column_double(st, 2));
        n++;
    }
    if (step != SQLITE_DONE) {
        db_error(s, err, "load calibration");
        n = -1;
    }
    sqlite3_finalize(st);
    return n;
}

prism_status prismd_store_load_jobs(prismd_store *s, const prism_config *defaults,
                                    bool (*fn)(void *ctx, prismd_saved_job *job), void *ctx, prism_error *err)
{
    sqlite3_stmt *st = NULL;
    if (sqlite3_prepare_v2(s->db,
                           "SELECT j.id, j.token, j.world_size, j.config, s.map_version, s.decided_step,"
                           " s.effective_step, s.steps_collected, s.has_last_step, s.last_step, s.blocks, s.summary,"
                           " p.map_version, p.decided_step, p.effective_step, p.status, p.message, p.plan"
                           " FROM jobs j LEFT JOIN job_state s ON s.job_id = j.id"
                           " LEFT JOIN job_plan p ON p.job_id = j.id ORDER BY j.id",
                           -1, &st, NULL) != SQLITE_OK)
        return db_error(s, err, "load jobs");
    prism_status rc = PRISM_OK;
    int step = SQLITE_DONE;
    while (!rc && (step = sqlite3_step(st)) == SQLITE_ROW) {
        const char *id = (const char *)sqlite3_column_text(st, 0);
        json_error_t jerr;
        json_t *obj = json_loads((const char *)sqlite3_column_text(st, 3), 0, &jerr);
        prism_config cfg;
        if (!obj) {
            rc = prism_error_set(err, PRISM_ERR_INVALID, "store: job %s: saved config does not parse: %s", id,
                                 jerr.text);
            break;
        }
        if ((rc = prism_config_apply_json(defaults, obj, "", &cfg, err))) {
            json_decref(obj);
            prism_error_prefix(err, "store: job %s: saved config", id);
            break;
        }
        json_decref(obj);
        prism_policy *policy = prism_policy_create(&cfg, err);
        prism_config_free(&cfg);
        if (!policy) {
            rc = err ? err->status : PRISM_ERR_INVALID;
            break;
        }
        prismd_saved_job job = {
            .id = id,
            .token = (const char *)sqlite3_column_text(st, 1),
            .world_size = (uint32_t)sqlite3_column_int64(st, 2),
            .policy = policy,
            .decided_unix = NAN,
        };
        if (sqlite3_column_type(st, 15) != SQLITE_NULL) {
            job.has_plan_row = true;
            job.plan = (prismd_plan_row){
                .map_version = (uint64_t)sqlite3_column_int64(st, 12),
                .decided_step = (uint64_t)sqlite3_column_int64(st, 13),
                .effective_step = (uint64_t)sqlite3_column_int64(st, 14),
                .status = (const char *)sqlite3_column_text(st, 15),
                .message = (const char *)sqlite3_column_text(st, 16),
                .plan_json = (const char *)sqlite3_column_text(st, 17),
            };
        }
        if (sqlite3_column_type(st, 4) != SQLITE_NULL) {
            prism_policy_progress progress = {
                .map_version = (uint64_t)sqlite3_column_int64(st, 4),
                .steps_collected = (uint64_t)sqlite3_column_int64(st, 7),
                .has_last_step = sqlite3_column_int(st, 8) != 0,
                .last_step = (uint64_t)sqlite3_column_int64(st, 9),
            };
            job.decided_step = (uint64_t)sqlite3_column_int64(st, 5);
            job.effective_step = (uint64_t)sqlite3_column_int64(st, 6);
            decoded d;
            if (!decode_blocks(sqlite3_column_blob(st, 10), (size_t)sqlite3_column_bytes(st, 10), &d)) {
                rc = prism_error_set(err, PRISM_ERR_INVALID, "store: job %s: the saved blocks are damaged", id);
            } else {
                progress.counters = d.counters;
                progress.loss_len = d.loss_len;
                progress.losses = d.loss_len ? d.losses : NULL;
                rc = prism_policy_restore(policy, &progress, d.recs, d.count, err);
            }
            if (!rc && sqlite3_column_type(st, 11) != SQLITE_NULL) {
                if (decode_summary(sqlite3_column_blob(st, 11), (size_t)sqlite3_column_bytes(st, 11), &job.summary,
                                   &job.decided_unix))
                    job.has_summary = true;
                else
                    rc = prism_error_set(err, PRISM_ERR_INVALID, "store: job %s: the saved summary is damaged", id);
            }
            decoded_free(&d);
        }
        if (rc) {
            prism_policy_destroy(policy);
            break;
        }
        if (!fn(ctx, &job)) {
            rc = prism_error_set(err, PRISM_ERR_NOMEM, "store: job %s could not be restored", id);
            break;
        }
    }
    if (!rc && step != SQLITE_DONE)
        rc = db_error(s, err, "load jobs");
    sqlite3_finalize(st);
    return rc;
}

/* ---- job deletion and activity (--job-idle-expiry) ---- */

prism_status prismd_store_delete_job(prismd_store *s, const char *job_id, prism_error *err)
{
    static const char *const sql[] = {"DELETE FROM switches WHERE job_id = ?", "DELETE FROM job_plan WHERE job_id = ?",
                                      "DELETE FROM job_state WHERE job_id = ?",
                                      "DELETE FROM job_activity WHERE job_id = ?",
                                      "DELETE FROM calibration_owner WHERE job_id = ?", "DELETE FROM jobs WHERE id = ?"};
    struct timespec t0 = write_start();
    prism_status rc = exec(s, "BEGIN IMMEDIATE", err);
    for (size_t i = 0; !rc && i < sizeof sql / sizeof sql[0]; i++) {
        sqlite3_stmt *st = NULL;
        if (sqlite3_prepare_v2(s->db, sql[i], -1, &st, NULL) != SQLITE_OK) {
            rc = db_error(s, err, "delete job");
            break;
        }
        sqlite3_bind_text(st, 1, job_id, -1, SQLITE_TRANSIENT);
        if (sqlite3_step(st) != SQLITE_DONE)
            rc = db_error(s, err, "delete job");
        sqlite3_finalize(st);
    }
    if (rc) {
        prism_error keep = *err;
        exec(s, "ROLLBACK", NULL);
        *err = keep;
        return rc;
    }
    if ((rc = exec(s, "COMMIT", err)) && !sqlite3_get_autocommit(s->db)) {
        prism_error keep = *err;
        exec(s, "ROLLBACK", NULL);
        *err = keep;
    }
    if (!rc)
        write_committed(s, t0);
    return rc;
}

prism_status prismd_store_save_activity(prismd_store *s, const char *job_id, int64_t last_active_ms,
                                        prism_error *err)
{
    sqlite3_stmt *st = NULL;
    prism_status rc = PRISM_OK;
    struct timespec t0 = write_start();
    if (sqlite3_prepare_v2(s->db, "INSERT OR REPLACE INTO job_activity(job_id, last_active_ms) VALUES(?,?)", -1, &st,
                           NULL) != SQLITE_OK)
        return db_error(s, err, "save activity");
    sqlite3_bind_text(st, 1, job_id, -1, SQLITE_TRANSIENT);
    sqlite3_bind_int64(st, 2, last_active_ms);
    if (sqlite3_step(st) != SQLITE_DONE)
        rc = db_error(s, err, "save activity");
    sqlite3_finalize(st);
    if (!rc)
        write_committed(s, t0);
    return rc;
}

long prismd_store_load_activity(prismd_store *s, void (*fn)(void *ctx, const char *job_id, int64_t last_active_ms),
                                void *ctx, prism_error *err)
{
    sqlite3_stmt *st = NULL;
    if (sqlite3_prepare_v2(s->db, "SELECT job_id, last_active_ms FROM job_activity", -1, &st, NULL) != SQLITE_OK) {
        db_error(s, err, "load activity");
        return -1;
    }
    long n = 0;
    int step;
    while ((step = sqlite3_step(st)) == SQLITE_ROW) {
        fn(ctx, (const char *)sqlite3_column_text(st, 0), (int64_t)sqlite3_column_int64(st, 1));
        n++;
    }
    if (step != SQLITE_DONE) {
        db_error(s, err, "load activity");
        n = -1;
    }
    sqlite3_finalize(st);
    return n;
}
