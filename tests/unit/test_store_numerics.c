/* prismd's store keeps the numerics state of issue 17 (DESIGN 4.7) on a real SQLite file: W (the
 * losses of the spike rule), the spike counters, each block's candidate format, hold and
 * saturation figures (the view's and each window entry's) and the summary's blocks per precision
 * come back exactly, and the restored job goes on deciding as one that never stopped; a row
 * written before issue 17 (PRB2 blocks, PRS2 summary) still loads, with those things empty; a
 * damaged new blob is refused with the job named. Expected values are worked out by hand in the
 * comments. */
#include "testutil.h"

#include "store.h"
#include "telemetry.h"

#include <jansson.h>
#include <math.h>
#include <sqlite3.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static prism_config make_config(const char *json)
{
    prism_config base, cfg;
    prism_error err;
    CU_ASSERT_FATAL(prism_config_init(&base, &err) == PRISM_OK);
    json_error_t jerr;
    json_t *obj = json_loads(json, 0, &jerr);
    CU_ASSERT_FATAL(obj != NULL);
    prism_status st = prism_config_apply_json(&base, obj, "", &cfg, &err);
    if (st)
        fprintf(stderr, "config: %s\n", err.message);
    CU_ASSERT_FATAL(st == PRISM_OK);
    json_decref(obj);
    prism_config_free(&base);
    return cfg;
}

/* Thresholds exact in binary, s = grad_score (error_weight 0), a decision at every step, a window
 * of two steps, no cooldown; spikes: factor 2 over a W of 3, held 10 steps; a low format per block. */
static const char *const CONFIG_JSON =
    "{\"bf16_threshold\": 0.5, \"int8_threshold\": 0.25, \"hysteresis_margin\": 0.125,"
    " \"grad_sensitivity_threshold\": 2.0, \"grad_weight\": 1.0, \"error_weight\": 0.0, \"warmup_steps\": 1,"
    " \"update_interval_steps\": 1, \"history_window\": 2, \"min_steps_between_switches\": 0,"
    " \"loss_spike_factor\": 2, \"loss_spike_window\": 3, \"loss_spike_hold_steps\": 10,"
    " \"low_precision\": \"auto\", \"low_formats\": [\"int4\", \"fp8_e4m3\", \"int8\"]}";

typedef struct loaded {
    size_t count;
    prism_policy *policy;
    bool has_summary;
    prism_summary summary;
} loaded;

static bool collect(void *ctx, prismd_saved_job *job)
{
    loaded *l = ctx;
    l->count++;
    prism_policy_destroy(l->policy);
    l->policy = job->policy;
    l->has_summary = job->has_summary;
    l->summary = job->summary;
    return true;
}

static const char *fresh_dir(const char *name)
{
    static char dir[512];
    snprintf(dir, sizeof dir, "%s/%s", prism_scratch_dir(), name);
    char cmd[1200];
    snprintf(cmd, sizeof cmd, "rm -rf '%s' && mkdir -p '%s'", dir, dir);
    CU_ASSERT_FATAL(system(cmd) == 0);
    return dir;
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

/* Writes a job_state row for job-1 holding the given blobs as they are (summary NULL: none). */
static void put_state_row(const char *dir, const void *blocks, size_t blocks_len, const void *summary,
                          size_t summary_len)
{
    char path[600];
    snprintf(path, sizeof path, "%s/prism.db", dir);
    sqlite3 *db = NULL;
    CU_ASSERT_FATAL(sqlite3_open(path, &db) == SQLITE_OK);
    sqlite3_stmt *st = NULL;
    CU_ASSERT_FATAL(sqlite3_prepare_v2(db,
                                       "INSERT OR REPLACE INTO job_state(job_id, map_version, decided_step,"
                                       " effective_step, steps_collected, has_last_step, last_step, blocks, summary)"
                                       " VALUES('job-1', 2, 5, 6, 5, 1, 5, ?, ?)",
                                       -1, &st, NULL) == SQLITE_OK);
    sqlite3_bind_blob(st, 1, blocks, (int)blocks_len, SQLITE_STATIC);
    if (summary)
        sqlite3_bind_blob(st, 2, summary, (int)summary_len, SQLITE_STATIC);
    else
        sqlite3_bind_null(st, 2);
    CU_ASSERT_EQUAL(sqlite3_step(st), SQLITE_DONE);
    sqlite3_finalize(st);
    sqlite3_close(db);
}

/* Blocks 0 and 1 with l2 norms a and 1 - a: the mean is 0.5, so with grad_sensitivity_threshold 2
 * block 0's grad_score (its s) is a and block 1's is 1 - a. sat: block 0's (saturated,
 * underflowed) figures, or NULL. */
static void feed(prism_policy *p, uint64_t step, double a, double loss, const double *sat, prism_step_result *r,
                 prismd_store *store, prism_buf *telemetry)
{
    prism_block_stats b[2] = {{0, a, 1.0, 0.0, 0.25, 1000, 0, false, 0, 0},
                              {1, 1.0 - a, 1.0, 0.0, 0.25, 1000, 0, false, 0, 0}};
    if (sat) {
        b[0].has_saturation = true;
        b[0].saturated_fraction = sat[0];
        b[0].underflowed_fraction = sat[1];
    }
    prism_error err;
    prism_status st = prism_policy_add_step(p, step, &loss, b, 2, r, &err);
    if (st)
        fprintf(stderr, "add_step: %s\n", err.message);
    CU_ASSERT_FATAL(st == PRISM_OK);
    if (telemetry && r->decided)
        CU_ASSERT_FATAL(prism_telemetry_append(telemetry, p, &r->summary, 1.0, NULL) == PRISM_OK);
    if (store && (r->decided || r->map_changed))
        CU_ASSERT_FATAL(prismd_store_save_state(store, "job-1", p, r->decided_step, r->effective_step, r->changes,
                                                r->change_count, r->decided ? &r->summary : NULL, 1764150000.5, NULL,
                                                &err) == PRISM_OK);
}

/* Steps 1 to 5 of the job (every step a decision), saved at each:
 *   calibration: block 0 int4 0.01 (<= 0.05: candidate int4); block 1 int4 0.5, fp8_e4m3 0.01
 *   (candidate fp8_e4m3).
 *   1: a 0.875, loss 1: s0 0.875 >= 0.5 bf16, s1 0.125 <= 0.25 low: fp8_e4m3 by score at 1. W [1].
 *   2, 3: the same, loss 1: W [1, 1, 1] (full).
 *   4: loss 3 > 2 x median 1: a spike on a decision step. Block 1 is low, by score at 1, 4 - 1 = 3
 *      <= 3: back to bf16 (loss_spike), held until 4 + 10 = 14. W keeps [1, 1, 1]. Block 0 reports
 *      figures (0.25, 0.125).
 *   5: loss 1.5 (not > 2): W [1, 1, 1.5]. Block 0 reports (0.5, 0.25): its window (steps 4, 5)
 *      has both, saturated mean 0.375, underflowed 0.1875. Summary: 2 bf16, no spike. */
static void run_first_steps(prism_policy *p, prismd_store *store)
{
    prism_error err;
    CU_ASSERT_FATAL(prism_policy_set_calibration(p, PRISM_PRECISION_INT4, 0, 0.01, &err) == PRISM_OK);
    CU_ASSERT_FATAL(prism_policy_set_calibration(p, PRISM_PRECISION_INT4, 1, 0.5, &err) == PRISM_OK);
    CU_ASSERT_FATAL(prism_policy_set_calibration(p, PRISM_PRECISION_FP8_E4M3, 1, 0.01, &err) == PRISM_OK);
    prism_step_result r;
    for (uint64_t step = 1; step <= 3; step++)
        feed(p, step, 0.875, 1.0, NULL, &r, store, NULL);
    const double sat4[2] = {0.25, 0.125}, sat5[2] = {0.5, 0.25};
    feed(p, 4, 0.875, 3.0, sat4, &r, store, NULL);
    CU_ASSERT_TRUE(r.loss_spike && r.scheduled && r.rolled_back == 1);
    feed(p, 5, 0.875, 1.5, sat5, &r, store, NULL);
    CU_ASSERT_TRUE(r.decided && !r.loss_spike);
}

/* Steps 6 to 9 after the state of step 5: step 7's loss 9 > 2 x 1 is a spike with no qualifying
 * block (block 1 is bf16), counted only; block 1 stays held (its s 0.125 would take it low). */
static void run_last_steps(prism_policy *p, prism_buf *telemetry, prism_change *changes, size_t *nchanges)
{
    static const double losses[4] = {1.0, 9.0, 1.0, 1.25};
    const double sat[2] = {0.0625, 0.5};
    *nchanges = 0;
    for (uint64_t step = 6; step <= 9; step++) {
        prism_step_result r;
        feed(p, step, 0.875, losses[step - 6], step == 8 ? sat : NULL, &r, NULL, telemetry);
        for (size_t c = 0; c < r.change_count && *nchanges < 8; c++)
            changes[(*nchanges)++] = r.changes[c];
    }
}

static void assert_same_view(const prism_block_view *got, const prism_block_view *want)
{
    CU_ASSERT_EQUAL(got->id, want->id);
    CU_ASSERT_EQUAL(got->precision, want->precision);
    CU_ASSERT_EQUAL(got->reason, want->reason);
    CU_ASSERT_EQUAL(got->has_switch, want->has_switch);
    CU_ASSERT_EQUAL(got->last_switch_step, want->last_switch_step);
    CU_ASSERT_EQUAL(got->has_score, want->has_score);
    CU_ASSERT_EQUAL(got->sensitivity, want->sensitivity);
    CU_ASSERT_EQUAL(got->candidate, want->candidate);
    CU_ASSERT_EQUAL(got->held, want->held);
    CU_ASSERT_EQUAL(got->hold_until, want->hold_until);
    CU_ASSERT_EQUAL(got->has_saturation, want->has_saturation);
    CU_ASSERT_EQUAL(got->saturated_fraction, want->saturated_fraction);
    CU_ASSERT_EQUAL(got->underflowed_fraction, want->underflowed_fraction);
}

static void test_w_holds_counters_and_fractions_come_back_exactly(void)
{
    prism_config cfg = make_config(CONFIG_JSON);
    prism_error err;
    const char *dir = fresh_dir("numerics-restore");
    prismd_store *store = prismd_store_open(dir, &err);
    CU_ASSERT_FATAL(store != NULL);
    CU_ASSERT_EQUAL_FATAL(prismd_store_save_job(store, "job-1", NULL, 1, &cfg, &err), PRISM_OK);
    prism_policy *ref = prism_policy_create(&cfg, &err);
    run_first_steps(ref, store);
    prismd_store_close(store);

    store = prismd_store_open(dir, &err);
    CU_ASSERT_FATAL(store != NULL);
    loaded l = {0};
    CU_ASSERT_EQUAL_FATAL(prismd_store_load_jobs(store, &cfg, collect, &l, &err), PRISM_OK);
    CU_ASSERT_EQUAL_FATAL(l.count, 1);

    /* W and the counters: one spike (on the schedule: no decision of its own), one block back. */
    double w[PRISM_LOSS_WINDOW_MAX];
    CU_ASSERT_EQUAL_FATAL(prism_policy_loss_window(l.policy, w), 3);
    CU_ASSERT_TRUE(w[0] == 1.0 && w[1] == 1.0 && w[2] == 1.5);
    prism_policy_counters c;
    prism_policy_counters_get(l.policy, &c);
    CU_ASSERT_EQUAL(c.loss_spikes, 1);
    CU_ASSERT_EQUAL(c.loss_spike_decisions, 0);
    CU_ASSERT_EQUAL(c.blocks_rolled_back, 1);

    const prism_block_view *b0 = prism_policy_find_block(l.policy, 0), *b1 = prism_policy_find_block(l.policy, 1);
    CU_ASSERT_FATAL(b0 && b1);
    CU_ASSERT_EQUAL(b0->precision, PRISM_PRECISION_BF16);
    CU_ASSERT_EQUAL(b0->candidate, PRISM_PRECISION_INT4);
    CU_ASSERT_FALSE(b0->held);
    CU_ASSERT_TRUE(b0->has_saturation);
    CU_ASSERT_EQUAL(b0->saturated_fraction, 0.375);
    CU_ASSERT_EQUAL(b0->underflowed_fraction, 0.1875);
    CU_ASSERT_EQUAL(b1->precision, PRISM_PRECISION_BF16);
    CU_ASSERT_EQUAL(b1->reason, PRISM_REASON_LOSS_SPIKE);
    CU_ASSERT_EQUAL(b1->last_switch_step, 4);
    CU_ASSERT_EQUAL(b1->candidate, PRISM_PRECISION_FP8_E4M3);
    CU_ASSERT_TRUE(b1->held);
    CU_ASSERT_EQUAL(b1->hold_until, 14);
    CU_ASSERT_FALSE(b1->has_saturation);
    for (uint32_t id = 0; id < 2; id++)
        assert_same_view(prism_policy_find_block(l.policy, id), prism_policy_find_block(ref, id));

    /* Block 0's window entries (steps 4 and 5) with their figures. */
    static double window[PRISM_WINDOW_MAX], saturated[PRISM_WINDOW_MAX], underflowed[PRISM_WINDOW_MAX];
    static uint8_t has[PRISM_WINDOW_MAX];
    prism_block_record rec = {.window = window, .window_has_saturation = has, .window_saturated = saturated,
                              .window_underflowed = underflowed};
    prism_policy_block_record(l.policy, 0, &rec);
    CU_ASSERT_EQUAL_FATAL(rec.window_len, 2);
    CU_ASSERT_TRUE(has[0] == 1 && has[1] == 1);
    CU_ASSERT_TRUE(saturated[0] == 0.25 && saturated[1] == 0.5);
    CU_ASSERT_TRUE(underflowed[0] == 0.125 && underflowed[1] == 0.25);

    /* The summary of step 5: 2 bf16 (blocks_by_precision too), not a spike. */
    CU_ASSERT_TRUE_FATAL(l.has_summary);
    CU_ASSERT_EQUAL(l.summary.step_id, 5);
    CU_ASSERT_EQUAL(l.summary.low_precision, PRISM_LOW_AUTO);
    CU_ASSERT_EQUAL(l.summary.blocks_by_precision[PRISM_PRECISION_BF16], 2);
    for (int k = 1; k < PRISM_PRECISION_COUNT; k++)
        CU_ASSERT_EQUAL(l.summary.blocks_by_precision[k], 0);
    CU_ASSERT_FALSE(l.summary.loss_spike);

    /* Both go on alike: the same changes (none: block 1 is held, step 7's spike finds no block)
     * and the same telemetry, byte for byte. */
    prism_buf want = {0}, got = {0};
    prism_change want_changes[8], got_changes[8];
    size_t nwant, ngot;
    run_last_steps(ref, &want, want_changes, &nwant);
    run_last_steps(l.policy, &got, got_changes, &ngot);
    CU_ASSERT_EQUAL(nwant, 0);
    CU_ASSERT_EQUAL(ngot, 0);
    CU_ASSERT_TRUE(got.len == want.len && memcmp(got.data, want.data, got.len) == 0);
    if (got.len != want.len || memcmp(got.data, want.data, got.len) != 0)
        fprintf(stderr, "\nwant:\n%s\ngot:\n%s\n", want.data, got.data);
    prism_policy_counters_get(l.policy, &c);
    CU_ASSERT_EQUAL(c.loss_spikes, 2);
    CU_ASSERT_EQUAL(c.blocks_rolled_back, 1);
    CU_ASSERT_EQUAL(prism_policy_loss_window(l.policy, w), 3); /* 6: 1, 7 a spike, 8: 1, 9: 1.25 */
    CU_ASSERT_TRUE(w[0] == 1.0 && w[1] == 1.0 && w[2] == 1.25);
    for (uint32_t id = 0; id < 2; id++)
        assert_same_view(prism_policy_find_block(l.policy, id), prism_policy_find_block(ref, id));
    prism_buf_free(&want);
    prism_buf_free(&got);
    prism_policy_destroy(l.policy);
    prism_policy_destroy(ref);
    prismd_store_close(store);
    prism_config_free(&cfg);
}

/* A summary saved at a spike decision keeps its blocks per precision and its spike flag. */
static void test_a_spike_summary_comes_back_with_its_formats(void)
{
    prism_config cfg = make_config(CONFIG_JSON);
    prism_error err;
    const char *dir = fresh_dir("numerics-summary");
    prismd_store *store = prismd_store_open(dir, &err);
    CU_ASSERT_FATAL(store != NULL);
    CU_ASSERT_EQUAL_FATAL(prismd_store_save_job(store, "job-1", NULL, 1, &cfg, &err), PRISM_OK);
    prism_policy *p = prism_policy_create(&cfg, &err);
    CU_ASSERT_FATAL(prism_policy_set_calibration(p, PRISM_PRECISION_INT4, 1, 0.01, &err) == PRISM_OK);
    prism_step_result r;
    /* Steps 1-3: block 0 bf16, block 1 int4 (its candidate). Step 4, loss 2.5 > 2: block 1 back to
     * bf16 (int4 at 1, 4 - 1 <= 3); the summary: 2 bf16 and a spike. Step 3's (before it): 1 bf16,
     * 1 int4, no spike. */
    for (uint64_t step = 1; step <= 3; step++)
        feed(p, step, 0.875, 1.0, NULL, &r, step == 3 ? store : NULL, NULL);
    CU_ASSERT_EQUAL(r.summary.blocks_by_precision[PRISM_PRECISION_INT4], 1);
    prismd_store_close(store);
    store = prismd_store_open(dir, &err);
    loaded l = {0};
    CU_ASSERT_EQUAL_FATAL(prismd_store_load_jobs(store, &cfg, collect, &l, &err), PRISM_OK);
    CU_ASSERT_TRUE_FATAL(l.has_summary);
    CU_ASSERT_EQUAL(l.summary.blocks_by_precision[PRISM_PRECISION_BF16], 1);
    CU_ASSERT_EQUAL(l.summary.blocks_by_precision[PRISM_PRECISION_INT4], 1);
    CU_ASSERT_EQUAL(l.summary.blocks_by_precision[PRISM_PRECISION_INT8], 0);
    CU_ASSERT_FALSE(l.summary.loss_spike);
    CU_ASSERT_EQUAL(prism_policy_find_block(l.policy, 1)->precision, PRISM_PRECISION_INT4);

    feed(p, 4, 0.875, 2.5, NULL, &r, store, NULL);
    CU_ASSERT_TRUE(r.loss_spike);
    prismd_store_close(store);
    store = prismd_store_open(dir, &err);
    CU_ASSERT_EQUAL_FATAL(prismd_store_load_jobs(store, &cfg, collect, &l, &err), PRISM_OK);
    CU_ASSERT_EQUAL(l.summary.step_id, 4);
    CU_ASSERT_EQUAL(l.summary.blocks_by_precision[PRISM_PRECISION_BF16], 2);
    CU_ASSERT_EQUAL(l.summary.blocks_by_precision[PRISM_PRECISION_INT4], 0);
    CU_ASSERT_TRUE(l.summary.loss_spike);
    prism_policy_destroy(l.policy);
    prism_policy_destroy(p);
    prismd_store_close(store);
    prism_config_free(&cfg);
}

/* A growing byte buffer for hand-made blobs. */
typedef struct bytes {
    uint8_t data[512];
    size_t len;
} bytes;

static void add(bytes *b, const void *p, size_t n)
{
    CU_ASSERT_FATAL(b->len + n <= sizeof b->data);
    memcpy(b->data + b->len, p, n);
    b->len += n;
}

static void add_u32(bytes *b, uint32_t x) { add(b, &x, 4); }
static void add_u64(bytes *b, uint64_t x) { add(b, &x, 8); }
static void add_f64(bytes *b, double x) { add(b, &x, 8); }

/* A row as the prismd before issue 17 wrote it: blocks "PRB2" (one block: id 3, int8 by score at
 * step 5, assigned, 1024 bytes, int8 calibration 0.01, window [0.5, 0.25], scores), summary "PRS2"
 * (low int8, step 5, version 2, 1 bf16, 1 low). It loads: the block as saved, W empty, counters 0,
 * no hold, no figures, the candidate the config's one low format (int8 by default); the summary's
 * blocks per precision 1 bf16 and 1 int8, no spike. */
static void test_a_row_written_before_issue_17_still_loads(void)
{
    prism_config cfg = make_config("{\"warmup_steps\": 1}");
    prism_error err;
    const char *dir = fresh_dir("numerics-old");
    prismd_store *store = prismd_store_open(dir, &err);
    CU_ASSERT_FATAL(store != NULL);
    CU_ASSERT_EQUAL_FATAL(prismd_store_save_job(store, "job-1", NULL, 1, &cfg, &err), PRISM_OK);
    prismd_store_close(store);

    bytes blocks = {.len = 0}, summary = {.len = 0};
    add(&blocks, "PRB2", 4);
    add_u32(&blocks, 1);
    add_u32(&blocks, 3);
    const uint8_t head[4] = {PRISM_PRECISION_INT8, PRISM_REASON_SCORE, 3, 0};
    add(&blocks, head, 4);
    add_u64(&blocks, 5);
    add_u64(&blocks, 1024);
    const double calibration[PRISM_PRECISION_COUNT] = {NAN, 0.01, NAN, NAN, NAN};
    add(&blocks, calibration, sizeof calibration);
    add_u32(&blocks, 2);
    add_f64(&blocks, 0.5);
    add_f64(&blocks, 0.25);
    const uint8_t scores[8] = {1};
    add(&blocks, scores, 8);
    add_f64(&blocks, 0.25);  /* sensitivity */
    add_f64(&blocks, 0.25);  /* grad_score */
    add_f64(&blocks, 0.375); /* relative_magnitude */
    add_f64(&blocks, 0.0);   /* error_score */

    add(&summary, "PRS2", 4);
    add_u32(&summary, PRISM_PRECISION_INT8);
    const uint64_t counts[6] = {5, 2, 1, 1, 1, 2};
    add(&summary, counts, sizeof counts);
    const double values[5] = {0.5, 0.75, 0.25, 25.0, 1764150000.25};
    add(&summary, values, sizeof values);
    put_state_row(dir, blocks.data, blocks.len, summary.data, summary.len);

    store = prismd_store_open(dir, &err);
    CU_ASSERT_FATAL(store != NULL);
    loaded l = {0};
    CU_ASSERT_EQUAL_FATAL(prismd_store_load_jobs(store, &cfg, collect, &l, &err), PRISM_OK);
    double w[PRISM_LOSS_WINDOW_MAX];
    CU_ASSERT_EQUAL(prism_policy_loss_window(l.policy, w), 0);
    prism_policy_counters c;
    prism_policy_counters_get(l.policy, &c);
    CU_ASSERT_TRUE(c.loss_spikes == 0 && c.loss_spike_decisions == 0 && c.blocks_rolled_back == 0);
    const prism_block_view *v = prism_policy_find_block(l.policy, 3);
    CU_ASSERT_FATAL(v != NULL);
    CU_ASSERT_EQUAL(v->precision, PRISM_PRECISION_INT8);
    CU_ASSERT_EQUAL(v->reason, PRISM_REASON_SCORE);
    CU_ASSERT_EQUAL(v->last_switch_step, 5);
    CU_ASSERT_EQUAL(v->param_bytes_bf16, 1024);
    CU_ASSERT_EQUAL(v->sensitivity, 0.25);
    CU_ASSERT_EQUAL(v->candidate, PRISM_PRECISION_INT8);
    CU_ASSERT_FALSE(v->held);
    CU_ASSERT_FALSE(v->has_saturation);
    static double window[PRISM_WINDOW_MAX], saturated[PRISM_WINDOW_MAX], underflowed[PRISM_WINDOW_MAX];
    static uint8_t has[PRISM_WINDOW_MAX];
    prism_block_record rec = {.window = window, .window_has_saturation = has, .window_saturated = saturated,
                              .window_underflowed = underflowed};
    prism_policy_block_record(l.policy, 0, &rec);
    CU_ASSERT_EQUAL_FATAL(rec.window_len, 2);
    CU_ASSERT_TRUE(window[0] == 0.5 && window[1] == 0.25);
    CU_ASSERT_TRUE(has[0] == 0 && has[1] == 0);
    CU_ASSERT_TRUE_FATAL(l.has_summary);
    CU_ASSERT_EQUAL(l.summary.step_id, 5);
    CU_ASSERT_EQUAL(l.summary.blocks_by_precision[PRISM_PRECISION_BF16], 1);
    CU_ASSERT_EQUAL(l.summary.blocks_by_precision[PRISM_PRECISION_INT8], 1);
    CU_ASSERT_EQUAL(l.summary.blocks_by_precision[PRISM_PRECISION_INT4], 0);
    CU_ASSERT_FALSE(l.summary.loss_spike);
    prism_policy_destroy(l.policy);
    prismd_store_close(store);
    prism_config_free(&cfg);
}

/* A damaged PRB3 or PRS3 blob is refused naming the job, as older damaged blobs are. */
static void test_a_damaged_numerics_blob_is_refused(void)
{
    static const struct {
        const char *sql;
        const char *message;
    } cases[] = {
        {"UPDATE job_state SET blocks = substr(blocks, 1, length(blocks) - 1)",
         "store: job job-1: the saved blocks are damaged"},
        {"UPDATE job_state SET blocks = blocks || x'00'", "store: job job-1: the saved blocks are damaged"},
        /* "PRB3", 0 blocks, counters, W of one NaN */
        {"UPDATE job_state SET blocks = x'505242330000000000000000000000000000000000000000000000000000000001000000"
         "000000000000f87f'",
         "store: job job-1: the saved blocks are damaged"},
        {"UPDATE job_state SET blocks = x'5052423400000000'", "store: job job-1: the saved blocks are damaged"},
        {"UPDATE job_state SET summary = substr(summary, 1, length(summary) - 1)",
         "store: job job-1: the saved summary is damaged"},
    };
    prism_config cfg = make_config(CONFIG_JSON);
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        prism_error err;
        const char *dir = fresh_dir("numerics-damaged");
        prismd_store *store = prismd_store_open(dir, &err);
        CU_ASSERT_FATAL(store != NULL);
        CU_ASSERT_EQUAL_FATAL(prismd_store_save_job(store, "job-1", NULL, 1, &cfg, &err), PRISM_OK);
        prism_policy *p = prism_policy_create(&cfg, &err);
        run_first_steps(p, store);
        prism_policy_destroy(p);
        prismd_store_close(store);
        exec_sql(dir, cases[i].sql);
        store = prismd_store_open(dir, &err);
        loaded l = {0};
        CU_ASSERT_EQUAL(prismd_store_load_jobs(store, &cfg, collect, &l, &err), PRISM_ERR_INVALID);
        CU_ASSERT_STRING_EQUAL(err.message, cases[i].message);
        CU_ASSERT_EQUAL(l.count, 0);
        prismd_store_close(store);
    }
    prism_config_free(&cfg);
}

static const prism_test_case cases[] = {
    {"test_w_holds_counters_and_fractions_come_back_exactly", test_w_holds_counters_and_fractions_come_back_exactly},
    {"test_a_spike_summary_comes_back_with_its_formats", test_a_spike_summary_comes_back_with_its_formats},
    {"test_a_row_written_before_issue_17_still_loads", test_a_row_written_before_issue_17_still_loads},
    {"test_a_damaged_numerics_blob_is_refused", test_a_damaged_numerics_blob_is_refused},
    {NULL, NULL},
};

static const prism_test_suite suites[] = {{"store_numerics", cases}, {NULL, NULL}};

int main(int argc, char **argv)
{
    return prism_test_main(argc, argv, suites);
}
