/* prismd's store on a real SQLite file: a job saved at a decision and restored goes on deciding
 * exactly as if it had never stopped; the switch history, the calibration cache, the token and
 * world size come back; a damaged or foreign file is refused with a message. */
#include "testutil.h"

#include "store.h"
#include "telemetry.h"

#include <math.h>
#include <sqlite3.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define NBLOCKS 6

static prism_config make_config(const char *json)
{
    prism_config base, cfg;
    prism_error err;
    CU_ASSERT_FATAL(prism_config_init(&base, &err) == PRISM_OK);
    json_error_t jerr;
    json_t *obj = json_loads(json, 0, &jerr);
    CU_ASSERT_FATAL(obj != NULL);
    CU_ASSERT_FATAL(prism_config_apply_json(&base, obj, "", &cfg, &err) == PRISM_OK);
    json_decref(obj);
    prism_config_free(&base);
    return cfg;
}

static const char *const CONFIG_JSON =
    "{\"warmup_steps\": 3, \"update_interval_steps\": 3, \"history_window\": 4, \"min_steps_between_switches\": 5}";

/* Deterministic statistics: blocks drift between sensitive and not, block 4 has a non-finite
 * step now and then, block ids are sparse. */
static size_t fill_step(uint64_t step, prism_block_stats *b)
{
    for (size_t i = 0; i < NBLOCKS; i++) {
        double phase = (double)step / 7.0 + (double)i;
        b[i] = (prism_block_stats){(uint32_t)(i * 10 + 1), 1.0 + (double)i * 0.3 + sin(phase), 1.0, 0.0, 1e-4, 64,
                                   (i == 4 && step % 11 == 0) ? 2u : 0u, false, 0, 0};
    }
    return NBLOCKS;
}

/* Feeds steps [from, to] and appends each decision's telemetry line to out. Saves the state at
 * every decision when store is given, as prismd does. */
static void run_steps(prism_policy *p, uint64_t from, uint64_t to, prism_buf *out, prismd_store *store)
{
    prism_block_stats b[NBLOCKS];
    prism_error err;
    for (uint64_t step = from; step <= to; step++) {
        size_t n = fill_step(step, b);
        prism_step_result r;
        CU_ASSERT_FATAL(prism_policy_add_step(p, step, NULL, b, n, &r, &err) == PRISM_OK);
        if (r.decided)
            CU_ASSERT_FATAL(prism_telemetry_append(out, p, &r.summary, 1.0, NULL) == PRISM_OK);
        if (store && (r.decided || r.map_changed))
            CU_ASSERT_FATAL(prismd_store_save_state(store, "job-1", p, r.decided_step, r.effective_step, r.changes,
                                                    r.change_count, NULL, NAN, NULL, &err) == PRISM_OK);
    }
}

typedef struct loaded {
    size_t count;
    char id[64];
    char token[64];
    bool has_token;
    uint32_t world_size;
    prism_policy *policy;
    uint64_t decided_step, effective_step;
    bool has_summary;
    prism_summary summary;
    double decided_unix;
} loaded;

static bool collect(void *ctx, prismd_saved_job *job)
{
    loaded *l = ctx;
    l->count++;
    snprintf(l->id, sizeof l->id, "%s", job->id);
    l->has_token = job->token != NULL;
    snprintf(l->token, sizeof l->token, "%s", job->token ? job->token : "");
    l->world_size = job->world_size;
    prism_policy_destroy(l->policy);
    l->policy = job->policy;
    l->decided_step = job->decided_step;
    l->effective_step = job->effective_step;
    l->has_summary = job->has_summary;
    l->summary = job->summary;
    l->decided_unix = job->decided_unix;
    return true;
}

static const char *fresh_dir(const char *name)
{
    static char dir[512];
    snprintf(dir, sizeof dir, "%s/%s", prism_scratch_dir(), name);
    char cmd[600];
    snprintf(cmd, sizeof cmd, "mkdir -p '%s'", dir);
    CU_ASSERT_FATAL(system(cmd) == 0);
    return dir;
}

static void test_restored_job_decides_exactly_as_one_that_never_stopped(void)
{
    prism_config cfg = make_config(CONFIG_JSON);
    prism_error err;
    /* The reference: 60 steps without a stop. */
    prism_policy *ref = prism_policy_create(&cfg, &err);
    prism_policy_set_block_bytes(ref, 11, 4096, &err);
    prism_policy_set_calibration(ref, PRISM_PRECISION_INT8, 21, 0.02, &err);
    prism_buf before = {0}, want = {0};
    run_steps(ref, 1, 30, &before, NULL);
    run_steps(ref, 31, 60, &want, NULL);
    prism_buf_free(&before);

    /* The same job saved at each decision up to step 30, then restored from the file. */
    const char *dir = fresh_dir("restore");
    prismd_store *store = prismd_store_open(dir, &err);
    CU_ASSERT_FATAL(store != NULL);
    CU_ASSERT_EQUAL_FATAL(prismd_store_save_job(store, "job-1", "secret", 4, &cfg, &err), PRISM_OK);
    prism_policy *p = prism_policy_create(&cfg, &err);
    prism_policy_set_block_bytes(p, 11, 4096, &err);
    prism_policy_set_calibration(p, PRISM_PRECISION_INT8, 21, 0.02, &err);
    prism_buf ignored = {0};
    run_steps(p, 1, 30, &ignored, store);
    prism_policy_destroy(p);
    prismd_store_close(store);

    store = prismd_store_open(dir, &err);
    CU_ASSERT_FATAL(store != NULL);
    loaded l = {0};
    CU_ASSERT_EQUAL_FATAL(prismd_store_load_jobs(store, &cfg, collect, &l, &err), PRISM_OK);
    CU_ASSERT_EQUAL(l.count, 1);
    CU_ASSERT_STRING_EQUAL(l.id, "job-1");
    CU_ASSERT_TRUE(l.has_token);
    CU_ASSERT_STRING_EQUAL(l.token, "secret");
    CU_ASSERT_EQUAL(l.world_size, 4);
    prism_policy_progress progress;
    prism_policy_progress_get(l.policy, &progress);
    CU_ASSERT_EQUAL(progress.steps_collected, 30);
    CU_ASSERT_EQUAL(progress.last_step, 30);
    CU_ASSERT_EQUAL(prism_policy_block_count(l.policy), NBLOCKS);
    CU_ASSERT_EQUAL(prism_policy_find_block(l.policy, 11)->param_bytes_bf16, 4096);

    prism_buf got = {0};
    run_steps(l.policy, 31, 60, &got, store);
    CU_ASSERT_EQUAL(got.len, want.len);
    CU_ASSERT_TRUE(got.len == want.len && memcmp(got.data, want.data, got.len) == 0);
    if (got.len != want.len || memcmp(got.data, want.data, got.len) != 0)
        fprintf(stderr, "\nwant:\n%s\ngot:\n%s\n", want.data, got.data);
    prism_buf_free(&want);
    prism_buf_free(&got);
    prism_buf_free(&ignored);
    prism_policy_destroy(l.policy);
    prism_policy_destroy(ref);
    prismd_store_close(store);
    prism_config_free(&cfg);
}

static long count_rows(const char *dir, const char *sql)
{
    char path[600];
    snprintf(path, sizeof path, "%s/prism.db", dir);
    sqlite3 *db = NULL;
    long n = -1;
    if (sqlite3_open(path, &db) == SQLITE_OK) {
        sqlite3_stmt *st = NULL;
        if (sqlite3_prepare_v2(db, sql, -1, &st, NULL) == SQLITE_OK && sqlite3_step(st) == SQLITE_ROW)
            n = (long)sqlite3_column_int64(st, 0);
        sqlite3_finalize(st);
    }
    sqlite3_close(db);
    return n;
}

static void exec_sql(const char *dir, const char *sql)
{
    char path[600];
    snprintf(path, sizeof path, "%s/prism.db", dir);
    sqlite3 *db = NULL;
    CU_ASSERT_FATAL(sqlite3_open(path, &db) == SQLITE_OK);
    CU_ASSERT_EQUAL(sqlite3_exec(db, sql, NULL, NULL, NULL), SQLITE_OK);
    sqlite3_close(db);
}

/* Blocks 1 and 2 of norms 3 and 1 (warmup 1): block 2 goes int8 at step 1, one switch row. */
static void save_one_decision(prismd_store *store, prism_config *cfg)
{
    prism_error err;
    CU_ASSERT_EQUAL_FATAL(prismd_store_save_job(store, "job-1", NULL, 1, cfg, &err), PRISM_OK);
    prism_policy *p = prism_policy_create(cfg, &err);
    prism_block_stats b[2] = {{1, 3.0, 1, 0, 0, 4, 0, false, 0, 0}, {2, 1.0, 1, 0, 0, 4, 0, false, 0, 0}};
    prism_step_result r;
    CU_ASSERT_EQUAL_FATAL(prism_policy_add_step(p, 7, NULL, b, 2, &r, &err), PRISM_OK);
    CU_ASSERT_EQUAL_FATAL(r.change_count, 1);
    CU_ASSERT_EQUAL_FATAL(prismd_store_save_state(store, "job-1", p, 7, 8, r.changes, r.change_count, NULL, NAN, NULL, &err),
                          PRISM_OK);
    prism_policy_destroy(p);
}

static void test_switch_history_is_one_row_per_change(void)
{
    prism_config cfg = make_config("{\"warmup_steps\": 1}");
    prism_error err;
    const char *dir = fresh_dir("switches");
    prismd_store *store = prismd_store_open(dir, &err);
    CU_ASSERT_FATAL(store != NULL);
    save_one_decision(store, &cfg);
    prismd_store_close(store);
    CU_ASSERT_EQUAL(count_rows(dir, "SELECT count(*) FROM switches"), 1);
    CU_ASSERT_EQUAL(count_rows(dir, "SELECT count(*) FROM switches WHERE job_id = 'job-1' AND block_id = 2 AND"
                                    " from_precision = 'bf16' AND to_precision = 'int8' AND step = 7 AND"
                                    " reason = 'score' AND map_version = 1"),
                    1);
    CU_ASSERT_EQUAL(count_rows(dir, "SELECT count(*) FROM job_state WHERE job_id = 'job-1' AND map_version = 1 AND"
                                    " decided_step = 7 AND effective_step = 8 AND steps_collected = 1"),
                    1);
    prism_config_free(&cfg);
}

static void test_job_without_token_comes_back_without_one(void)
{
    prism_config cfg = make_config("{\"warmup_steps\": 1}");
    prism_error err;
    const char *dir = fresh_dir("no-token");
    prismd_store *store = prismd_store_open(dir, &err);
    save_one_decision(store, &cfg);
    prismd_store_close(store);
    store = prismd_store_open(dir, &err);
    loaded l = {0};
    CU_ASSERT_EQUAL_FATAL(prismd_store_load_jobs(store, &cfg, collect, &l, &err), PRISM_OK);
    CU_ASSERT_FALSE(l.has_token);
    CU_ASSERT_EQUAL(l.decided_step, 7);
    CU_ASSERT_EQUAL(l.effective_step, 8);
    CU_ASSERT_EQUAL(prism_policy_map_version(l.policy), 1);
    CU_ASSERT_EQUAL(prism_policy_find_block(l.policy, 2)->precision, PRISM_PRECISION_INT8);
    CU_ASSERT_EQUAL(prism_policy_find_block(l.policy, 2)->last_switch_step, 7);
    prism_policy_destroy(l.policy);
    prismd_store_close(store);
    prism_config_free(&cfg);
}

/* After a restart a block the score already placed keeps hysteresis: at int8 with s = 0.4
 * (between the thresholds) it stays int8; a fresh assignment would have put it in bf16. */
static void test_restored_block_keeps_hysteresis_not_a_fresh_assignment(void)
{
    prism_config cfg = make_config("{\"warmup_steps\": 1, \"update_interval_steps\": 1, \"history_window\": 1, \"min_steps_between_switches\": 0}");
    prism_error err;
    const char *dir = fresh_dir("hysteresis");
    prismd_store *store = prismd_store_open(dir, &err);
    save_one_decision(store, &cfg); /* block 2 int8 at step 7 */
    prismd_store_close(store);
    store = prismd_store_open(dir, &err);
    loaded l = {0};
    CU_ASSERT_EQUAL_FATAL(prismd_store_load_jobs(store, &cfg, collect, &l, &err), PRISM_OK);
    prism_block_stats b[2] = {{1, 1.5, 1, 0, 0, 4, 0, false, 0, 0}, {2, 1.0, 1, 0, 0, 4, 0, false, 0, 0}};
    prism_step_result r;
    CU_ASSERT_EQUAL_FATAL(prism_policy_add_step(l.policy, 8, NULL, b, 2, &r, &err), PRISM_OK);
    CU_ASSERT_TRUE(r.decided);
    CU_ASSERT_EQUAL(prism_policy_find_block(l.policy, 2)->sensitivity, 0.4);
    CU_ASSERT_EQUAL(prism_policy_find_block(l.policy, 2)->precision, PRISM_PRECISION_INT8);
    CU_ASSERT_EQUAL(r.change_count, 0);
    prism_policy_destroy(l.policy);
    prismd_store_close(store);
    prism_config_free(&cfg);
}

static void test_damaged_blocks_are_refused_with_the_job_named(void)
{
    prism_config cfg = make_config("{\"warmup_steps\": 1}");
    prism_error err;
    const char *dir = fresh_dir("damaged");
    prismd_store *store = prismd_store_open(dir, &err);
    save_one_decision(store, &cfg);
    prismd_store_close(store);
    exec_sql(dir, "UPDATE job_state SET blocks = x'5052423102000000'");
    store = prismd_store_open(dir, &err);
    loaded l = {0};
    CU_ASSERT_EQUAL(prismd_store_load_jobs(store, &cfg, collect, &l, &err), PRISM_ERR_INVALID);
    CU_ASSERT_STRING_EQUAL(err.message, "store: job job-1: the saved blocks are damaged");
    CU_ASSERT_EQUAL(l.count, 0);
    prismd_store_close(store);
    prism_config_free(&cfg);
}

static void test_a_store_of_another_schema_version_is_refused(void)
{
    prism_error err;
    const char *dir = fresh_dir("schema");
    prismd_store *store = prismd_store_open(dir, &err);
    CU_ASSERT_FATAL(store != NULL);
    prismd_store_close(store);
    exec_sql(dir, "UPDATE meta SET value = '99' WHERE key = 'schema_version'");
    CU_ASSERT_PTR_NULL(prismd_store_open(dir, &err));
    CU_ASSERT_PTR_NOT_NULL(strstr(err.message, "has schema version 99; this prismd reads 1 to 3"));
}

static void test_unopenable_store_names_the_file(void)
{
    prism_error err;
    CU_ASSERT_PTR_NULL(prismd_store_open("/nonexistent/dir", &err));
    CU_ASSERT_PTR_NOT_NULL(strstr(err.message, "/nonexistent/dir/prism.db"));
}

typedef struct cal_seen {
    size_t n;
    prism_precision format[4];
    uint32_t id[4];
    double error[4];
} cal_seen;

static void cal_collect(void *ctx, prism_precision format, uint32_t block_id, double error)
{
    cal_seen *c = ctx;
    if (c->n < 4) {
        c->format[c->n] = format;
        c->id[c->n] = block_id;
        c->error[c->n++] = error;
    }
}

static void test_calibration_cache_returns_what_was_saved_for_the_fingerprint(void)
{
    prism_error err;
    const char *dir = fresh_dir("calibration");
    prismd_store *store = prismd_store_open(dir, &err);
    const uint8_t fp_a[4] = {1, 2, 3, 4}, fp_b[4] = {1, 2, 3, 5};
    const uint32_t ids[2] = {7, 9};
    const double errors[2] = {0.125, 0.25};
    char owner[32] = "";
    CU_ASSERT_EQUAL(prismd_store_calibration_owner(store, fp_a, 4, owner, sizeof owner, &err), 0);
    CU_ASSERT_EQUAL(prismd_store_save_calibration(store, fp_a, 4, "job-a", PRISM_PRECISION_FP8_E4M3, ids, errors, 2,
                                                  &err),
                    PRISM_OK);
    const double again[1] = {0.5}; /* replaces block 7's error */
    CU_ASSERT_EQUAL(prismd_store_save_calibration(store, fp_a, 4, "job-a", PRISM_PRECISION_FP8_E4M3, ids, again, 1,
                                                  &err),
                    PRISM_OK);
    prismd_store_close(store);
    store = prismd_store_open(dir, &err);
    /* The first writer owns the entry, across a reopen; deleting that job releases it. */
    CU_ASSERT_EQUAL(prismd_store_calibration_owner(store, fp_a, 4, owner, sizeof owner, &err), 1);
    CU_ASSERT_STRING_EQUAL(owner, "job-a");
    CU_ASSERT_EQUAL(prismd_store_calibration_owner(store, fp_b, 4, owner, sizeof owner, &err), 0);
    cal_seen seen = {0};
    CU_ASSERT_EQUAL(prismd_store_load_calibration(store, fp_a, 4, cal_collect, &seen, &err), 2);
    CU_ASSERT_EQUAL(seen.n, 2);
    for (size_t i = 0; i < seen.n; i++) {
        CU_ASSERT_EQUAL(seen.format[i], PRISM_PRECISION_FP8_E4M3);
        CU_ASSERT_EQUAL(seen.error[i], seen.id[i] == 7 ? 0.5 : 0.25);
    }
    cal_seen none = {0};
    CU_ASSERT_EQUAL(prismd_store_load_calibration(store, fp_b, 4, cal_collect, &none, &err), 0);
    CU_ASSERT_EQUAL(prismd_store_delete_job(store, "job-a", &err), PRISM_OK);
    CU_ASSERT_EQUAL(prismd_store_calibration_owner(store, fp_a, 4, owner, sizeof owner, &err), 0);
    cal_seen kept = {0}; /* the errors stay cached: the model's, not the job's */
    CU_ASSERT_EQUAL(prismd_store_load_calibration(store, fp_a, 4, cal_collect, &kept, &err), 2);
    prismd_store_close(store);
}

/* The scores of the last decision and its telemetry summary come back exactly (issue 12: they
 * were null after a restart while the map was kept). */
static void test_scores_and_summary_come_back_exactly(void)
{
    prism_config cfg = make_config("{\"warmup_steps\": 1, \"history_window\": 1}");
    prism_error err;
    const char *dir = fresh_dir("scores");
    prismd_store *store = prismd_store_open(dir, &err);
    CU_ASSERT_FATAL(store != NULL);
    CU_ASSERT_EQUAL_FATAL(prismd_store_save_job(store, "job-1", NULL, 1, &cfg, &err), PRISM_OK);
    prism_policy *p = prism_policy_create(&cfg, &err);
    prism_policy_set_calibration(p, PRISM_PRECISION_INT8, 2, 0.01, &err);
    prism_block_stats b[2] = {{1, 3.0, 1, 0, 0, 4, 0, false, 0, 0}, {2, 1.0, 1, 0, 0, 4, 0, false, 0, 0}};
    prism_step_result r;
    CU_ASSERT_EQUAL_FATAL(prism_policy_add_step(p, 7, NULL, b, 2, &r, &err), PRISM_OK);
    CU_ASSERT_TRUE_FATAL(r.decided);
    CU_ASSERT_EQUAL_FATAL(prismd_store_save_state(store, "job-1", p, 7, 8, r.changes, r.change_count, &r.summary,
                                                  1764150000.125, NULL, &err), PRISM_OK);
    prismd_store_close(store);
    store = prismd_store_open(dir, &err);
    CU_ASSERT_FATAL(store != NULL);
    loaded l = {0};
    CU_ASSERT_EQUAL_FATAL(prismd_store_load_jobs(store, &cfg, collect, &l, &err), PRISM_OK);
    CU_ASSERT_TRUE(l.has_summary);
    const prism_summary *g = &l.summary, *w = &r.summary;
    CU_ASSERT_TRUE(g->step_id == 7 && g->step_id == w->step_id && g->map_version == w->map_version &&
                   g->low_precision == w->low_precision && g->blocks_bf16 == w->blocks_bf16 &&
                   g->blocks_low == w->blocks_low && g->precision_changes == w->precision_changes &&
                   g->scored == w->scored && g->mean_sensitivity == w->mean_sensitivity &&
                   g->max_sensitivity == w->max_sensitivity && g->min_sensitivity == w->min_sensitivity &&
                   g->bandwidth_saving_pct == w->bandwidth_saving_pct);
    CU_ASSERT_EQUAL(l.decided_unix, 1764150000.125); /* the decision's time too (GET /v1/jobs) */
    for (uint32_t id = 1; id <= 2; id++) {
        const prism_block_view *want = prism_policy_find_block(p, id), *got = prism_policy_find_block(l.policy, id);
        CU_ASSERT_TRUE(want->has_score && got->has_score);
        CU_ASSERT_EQUAL(got->sensitivity, want->sensitivity);
        CU_ASSERT_EQUAL(got->grad_score, want->grad_score);
        CU_ASSERT_EQUAL(got->relative_magnitude, want->relative_magnitude);
        CU_ASSERT_EQUAL(got->has_error_score, want->has_error_score);
        CU_ASSERT_EQUAL(got->error_score, want->error_score);
    }
    CU_ASSERT_TRUE(prism_policy_find_block(l.policy, 2)->has_error_score);
    prism_policy_destroy(l.policy);
    prism_policy_destroy(p);
    prismd_store_close(store);
    prism_config_free(&cfg);
}

static const prism_test_case cases[] = {
    {"test_scores_and_summary_come_back_exactly", test_scores_and_summary_come_back_exactly},
    {"test_restored_job_decides_exactly_as_one_that_never_stopped",
     test_restored_job_decides_exactly_as_one_that_never_stopped},
    {"test_switch_history_is_one_row_per_change", test_switch_history_is_one_row_per_change},
    {"test_job_without_token_comes_back_without_one", test_job_without_token_comes_back_without_one},
    {"test_restored_block_keeps_hysteresis_not_a_fresh_assignment",
     test_restored_block_keeps_hysteresis_not_a_fresh_assignment},
    {"test_damaged_blocks_are_refused_with_the_job_named", test_damaged_blocks_are_refused_with_the_job_named},
    {"test_a_store_of_another_schema_version_is_refused", test_a_store_of_another_schema_version_is_refused},
    {"test_unopenable_store_names_the_file", test_unopenable_store_names_the_file},
    {"test_calibration_cache_returns_what_was_saved_for_the_fingerprint",
     test_calibration_cache_returns_what_was_saved_for_the_fingerprint},
    {NULL, NULL},
};

static const prism_test_suite suites[] = {{"store", cases}, {NULL, NULL}};

int main(int argc, char **argv)
{
    return prism_test_main(argc, argv, suites);
}
