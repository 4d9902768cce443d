/* The numerics rules of DESIGN 4.7 (issue 17), one test per rule: loss spikes (detection with odd
 * and even windows, W, the rollback on and off the schedule, the window bound, the hold,
 * overrides), a low format per block (candidates, the error score of the candidate, the format
 * rule under cooldown, forced blocks, fixed -> auto) and the saturation rule. Every expected value
 * is worked out by hand from the text and written beside it, never taken from a run.
 *
 * Most tests use thresholds exact in binary (bf16 0.5, int8 0.25, margin 0.125) and two blocks
 * whose l2 norms a and 1 - a add up to 1: the mean is 0.5, block 0's rel is 2a and, with
 * grad_sensitivity_threshold 2, its grad_score is exactly a (block 1's is 1 - a). */
#include "testutil.h"

#include "policy.h"
#include "telemetry.h"

#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

/* Thresholds exact in binary, a window of one step, no cooldown. */
static const char *const EXACT =
    "{\"bf16_threshold\": 0.5, \"int8_threshold\": 0.25, \"hysteresis_margin\": 0.125,"
    " \"grad_sensitivity_threshold\": 2.0, \"warmup_steps\": 1, \"update_interval_steps\": 1,"
    " \"history_window\": 1, \"min_steps_between_switches\": 0}";

#define NO_LOSS (-1.0) /* in the tables below: the step has no loss (NULL) */

static prism_config make_config(const char *base, const char *extra)
{
    prism_config cfg;
    prism_error err;
    CU_ASSERT_FATAL(prism_config_init(&cfg, &err) == PRISM_OK);
    const char *texts[2] = {base, extra};
    for (int i = 0; i < 2; i++) {
        if (!texts[i])
            continue;
        json_error_t jerr;
        json_t *obj = json_loads(texts[i], 0, &jerr);
        if (!obj)
            fprintf(stderr, "config text: %s\n", jerr.text);
        CU_ASSERT_FATAL(obj != NULL);
        prism_status st = prism_config_apply_json(&cfg, obj, "", &cfg, &err);
        if (st)
            fprintf(stderr, "config: %s\n", err.message);
        json_decref(obj);
        CU_ASSERT_FATAL(st == PRISM_OK);
    }
    return cfg;
}

static prism_policy *make_policy(const char *base, const char *extra)
{
    prism_config cfg = make_config(base, extra);
    prism_error err;
    prism_policy *p = prism_policy_create(&cfg, &err);
    prism_config_free(&cfg);
    CU_ASSERT_FATAL(p != NULL);
    return p;
}

static void set_config(prism_policy *p, const char *base, const char *extra)
{
    prism_config cfg = make_config(base, extra);
    prism_error err;
    CU_ASSERT_FATAL(prism_policy_set_config(p, &cfg, &err) == PRISM_OK);
    prism_config_free(&cfg);
}

static void set_calibration(prism_policy *p, prism_precision format, uint32_t id, double e)
{
    prism_error err;
    CU_ASSERT_FATAL(prism_policy_set_calibration(p, format, id, e, &err) == PRISM_OK);
}

static prism_block_stats stats(uint32_t id, double l2)
{
    prism_block_stats s = {id, l2, 1.0, 0.0, 0.25, 1000, 0, false, 0, 0};
    return s;
}

static void feed_blocks(prism_policy *p, uint64_t step, double loss, const prism_block_stats *blocks, size_t count,
                        prism_step_result *out)
{
    prism_error err;
    prism_status st = prism_policy_add_step(p, step, loss == NO_LOSS ? NULL : &loss, blocks, count, out, &err);
    if (st)
        fprintf(stderr, "add_step: %s\n", err.message);
    CU_ASSERT_FATAL(st == PRISM_OK);
}

/* Blocks 0 and 1 with norms a and 1 - a (block 0's grad_score is a), and the step's loss. */
static void feed_pair(prism_policy *p, uint64_t step, double a, double loss, prism_step_result *out)
{
    prism_block_stats b[2] = {stats(0, a), stats(1, 1.0 - a)};
    feed_blocks(p, step, loss, b, 2, out);
}

static const prism_block_view *block(const prism_policy *p, uint32_t id)
{
    const prism_block_view *v = prism_policy_find_block(p, id);
    CU_ASSERT_FATAL(v != NULL);
    return v;
}

static const prism_change *find_change(const prism_step_result *r, uint32_t id)
{
    for (size_t i = 0; i < r->change_count; i++)
        if (r->changes[i].block_id == id)
            return &r->changes[i];
    return NULL;
}

static void assert_change(const prism_step_result *r, uint32_t id, prism_precision from, prism_precision to,
                          uint64_t step, prism_reason reason)
{
    const prism_change *c = find_change(r, id);
    CU_ASSERT_FATAL(c != NULL);
    CU_ASSERT_EQUAL(c->from, from);
    CU_ASSERT_EQUAL(c->to, to);
    CU_ASSERT_EQUAL(c->step, step);
    CU_ASSERT_EQUAL(c->reason, reason);
}

static prism_policy_counters counters(const prism_policy *p)
{
    prism_policy_counters c;
    prism_policy_counters_get(p, &c);
    return c;
}

/* ---- rule 1: loss spikes ---- */

static void test_spike_detection_uses_the_median_of_the_full_window(void)
{
    /* No block and no decision (warmup 1000): only the spike test and W. Each row's steps are
     * 1, 2, ...; a spike is loss > factor * median(W) with W full; spikes do not enter W. */
    static const struct {
        const char *config;
        double loss[8];
        size_t n;
        bool spike[8];
    } rows[] = {
        /* window 3 (odd), factor 2. s1-s3 fill W = [1, 50, 2] (50 > 2 * 1 but W is not full);
         * s4 4.1 > 2 * median 2 = 4: spike (W kept); s5 4 is not > 4: W = [50, 2, 4];
         * s6 8.1 > 2 * 4: spike; s7 8 is not > 8. */
        {"{\"loss_spike_factor\": 2, \"loss_spike_window\": 3}", {1, 50, 2, 4.1, 4, 8.1, 8}, 7,
         {false, false, false, true, false, true, false}},
        /* window 4 (even), factor 1.5. W = [1, 2, 3, 4] after s4; s5 3.8 > 1.5 * (2 + 3) / 2 =
         * 3.75: spike; s6 3.7: W = [2, 3, 4, 3.7]; s7 5: 1.5 * (3 + 3.7) / 2 = 5.025, not a
         * spike: W = [3, 4, 3.7, 5]; s8 5.8 > 1.5 * (3.7 + 4) / 2 = 5.775: spike. */
        {"{\"loss_spike_factor\": 1.5, \"loss_spike_window\": 4}", {1, 2, 3, 4, 3.8, 3.7, 5, 5.8}, 8,
         {false, false, false, false, true, false, false, true}},
        /* window 2, factor 2: steps without a loss or with a non-finite one add nothing:
         * s1 W = [1]; s2 NaN, s3 none, s5 +Inf: no loss; s4 W = [1, 1]; s6 3 > 2 * 1: spike. */
        {"{\"loss_spike_factor\": 2, \"loss_spike_window\": 2}", {1, NAN, NO_LOSS, 1, INFINITY, 3}, 6,
         {false, false, false, false, false, true}},
        /* a spike does not enter W: window 2, factor 2, W = [1, 1]; s3 10 and s4 10 are both
         * spikes (had s3 entered W, s4's median would be 5.5 and 10 < 11). */
        {"{\"loss_spike_factor\": 2, \"loss_spike_window\": 2}", {1, 1, 10, 10}, 4, {false, false, true, true}},
        /* factor 0: never a spike. */
        {"{\"loss_spike_factor\": 0, \"loss_spike_window\": 2}", {1, 1, 1000, 1e300}, 4, {false, false, false, false}},
    };
    for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++) {
        prism_policy *p = make_policy("{\"warmup_steps\": 1000}", rows[i].config);
        uint64_t spikes = 0;
        for (size_t k = 0; k < rows[i].n; k++) {
            prism_step_result r;
            feed_blocks(p, k + 1, rows[i].loss[k], NULL, 0, &r);
            if (r.loss_spike != rows[i].spike[k])
                fprintf(stderr, "row %zu step %zu: loss_spike %d\n", i, k + 1, (int)r.loss_spike);
            CU_ASSERT_EQUAL(r.loss_spike, rows[i].spike[k]);
            CU_ASSERT_FALSE(r.decided); /* no block to roll back: no decision, no record */
            CU_ASSERT_FALSE(r.map_changed);
            spikes += rows[i].spike[k];
        }
        CU_ASSERT_EQUAL(counters(p).loss_spikes, spikes);
        CU_ASSERT_EQUAL(counters(p).loss_spike_decisions, 0);
        prism_policy_destroy(p);
    }
}

static void test_w_is_kept_with_factor_zero_and_a_new_factor_waits_for_the_decision(void)
{
    /* Factor 0, window 2, first decision at n = 3. s1, s2 fill W = [1, 1] while the rule is off;
     * a config with factor 2 is set: at s3, a scheduled decision step, it is applied before the
     * spike test: 2.5 > 2 * 1: a spike. */
    prism_policy *p = make_policy("{\"warmup_steps\": 3, \"loss_spike_window\": 2}", NULL);
    prism_step_result r;
    feed_blocks(p, 1, 1.0, NULL, 0, &r);
    feed_blocks(p, 2, 1.0, NULL, 0, &r);
    set_config(p, "{\"warmup_steps\": 3, \"loss_spike_window\": 2}", "{\"loss_spike_factor\": 2}");
    feed_blocks(p, 3, 2.5, NULL, 0, &r);
    CU_ASSERT_TRUE(r.scheduled);
    CU_ASSERT_TRUE(r.loss_spike);
    CU_ASSERT_EQUAL(counters(p).loss_spikes, 1);
    prism_policy_destroy(p);
    /* Off the schedule the config in force decides: the same, with the first decision at n = 10
     * (the new factor waits for it): s3 is no spike, 2.5 enters W. */
    p = make_policy("{\"warmup_steps\": 10, \"loss_spike_window\": 2}", NULL);
    feed_blocks(p, 1, 1.0, NULL, 0, &r);
    feed_blocks(p, 2, 1.0, NULL, 0, &r);
    set_config(p, "{\"warmup_steps\": 10, \"loss_spike_window\": 2}", "{\"loss_spike_factor\": 2}");
    feed_blocks(p, 3, 2.5, NULL, 0, &r);
    CU_ASSERT_FALSE(r.scheduled);
    CU_ASSERT_FALSE(r.loss_spike);
    CU_ASSERT_EQUAL(prism_policy_config(p)->loss_spike_factor, 0.0);
    prism_policy_destroy(p);
}

static void test_a_new_loss_spike_window_keeps_the_newest_losses(void)
{
    /* Factor 2, a decision every step (the new window applies at the next step), no block.
     * (a) window 3 -> 2: W = [9, 1, 1] becomes [1, 1] (the newest two): 2.5 > 2 * 1 is a spike
     *     (had the oldest two been kept, [9, 1], the median 5 would make it none). */
    const char *w3 = "{\"warmup_steps\": 1, \"update_interval_steps\": 1, \"loss_spike_factor\": 2,"
                     " \"loss_spike_window\": 3}";
    const char *w2 = "{\"warmup_steps\": 1, \"update_interval_steps\": 1, \"loss_spike_factor\": 2,"
                     " \"loss_spike_window\": 2}";
    prism_policy *p = make_policy(w3, NULL);
    prism_step_result r;
    feed_blocks(p, 1, 9.0, NULL, 0, &r);
    feed_blocks(p, 2, 1.0, NULL, 0, &r);
    feed_blocks(p, 3, 1.0, NULL, 0, &r);
    set_config(p, w2, NULL);
    feed_blocks(p, 4, 2.5, NULL, 0, &r);
    CU_ASSERT_TRUE(r.loss_spike);
    prism_policy_destroy(p);
    /* (b) window 2 -> 3: W = [1, 1] is no longer full: 2.5 is no spike and enters W =
     *     [1, 1, 2.5]; then 3 > 2 * median 1: a spike. */
    p = make_policy(w2, NULL);
    feed_blocks(p, 1, 1.0, NULL, 0, &r);
    feed_blocks(p, 2, 1.0, NULL, 0, &r);
    set_config(p, w3, NULL);
    feed_blocks(p, 3, 2.5, NULL, 0, &r);
    CU_ASSERT_FALSE(r.loss_spike);
    feed_blocks(p, 4, 3.0, NULL, 0, &r);
    CU_ASSERT_TRUE(r.loss_spike);
    prism_policy_destroy(p);
}

/* Decisions at n = 1, 5, 9 ...; block 0 goes low by score at step 1 (s = 0.125), block 1 stays
 * bf16 (s = 0.875); W = [1, 1, 1] after step 3. */
static const char *const SPIKE =
    "{\"bf16_threshold\": 0.5, \"int8_threshold\": 0.25, \"hysteresis_margin\": 0.125,"
    " \"grad_sensitivity_threshold\": 2.0, \"warmup_steps\": 1, \"update_interval_steps\": 4,"
    " \"history_window\": 1, \"min_steps_between_switches\": 100, \"loss_spike_factor\": 2,"
    " \"loss_spike_window\": 3, \"loss_spike_hold_steps\": 10, \"apply_lag_steps\": 2}";

static int ascending(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* The median kept in step with W (sorted on each push) is the median of a sorted copy: 600 steps
 * of losses with many repeats, windows of odd and even length; each step's loss_spike is the
 * reference's (a spike: loss > 1.25 x the median of a full W, and kept out of W). */
static void test_spike_median_matches_a_sorted_copy_over_many_steps(void)
{
    for (int window = 6; window <= 7; window++) {
        char extra[96];
        snprintf(extra, sizeof extra, "{\"loss_spike_window\": %d, \"loss_spike_factor\": 1.25}", window);
        prism_policy *p = make_policy(SPIKE, extra);
        double ring[7], sorted[7];
        size_t len = 0, head = 0, spikes = 0;
        uint32_t seed = 12345;
        for (uint64_t step = 1; step <= 600; step++) {
            seed = seed * 1664525u + 1013904223u;
            double loss = 1.0 + (double)((seed >> 16) % 9) * 0.125; /* 1 .. 2, 9 values */
            bool want = false;
            if (len == (size_t)window) {
                for (size_t i = 0; i < len; i++)
                    sorted[i] = ring[(head + i) % (size_t)window];
                qsort(sorted, len, sizeof *sorted, ascending);
                double median = len % 2 ? sorted[len / 2] : (sorted[len / 2 - 1] + sorted[len / 2]) / 2.0;
                want = loss > 1.25 * median;
            }
            if (!want) {
                if (len < (size_t)window) {
                    ring[(head + len) % (size_t)window] = loss;
                    len++;
                } else {
                    ring[head] = loss;
                    head = (head + 1) % (size_t)window;
                }
            }
            prism_step_result r;
            feed_pair(p, step, 0.625, loss, &r);
            CU_ASSERT_EQUAL(r.loss_spike, want);
            spikes += want;
        }
        CU_ASSERT(spikes > 10); /* the losses do spike, and W moves on */
        CU_ASSERT_EQUAL(counters(p).loss_spikes, spikes);
        prism_policy_destroy(p);
    }
}

static void test_spike_off_the_schedule_is_a_decision_of_its_own(void)
{
    prism_policy *p = make_policy(SPIKE, NULL);
    prism_step_result r;
    feed_pair(p, 1, 0.125, 1.0, &r);
    CU_ASSERT_EQUAL(block(p, 0)->precision, PRISM_PRECISION_INT8);
    CU_ASSERT_EQUAL(r.map_version, 1);
    feed_pair(p, 2, 0.125, 1.0, &r);
    feed_pair(p, 3, 0.125, 1.0, &r);
    /* A pending config (lag 3) must not apply off the schedule. */
    set_config(p, SPIKE, "{\"apply_lag_steps\": 3}");
    /* s4 (n = 4, not a decision step): 3 > 2 * 1. Block 0: low, by score at d = 1, 4 - 1 = 3 <=
     * 3: to bf16 at 4 despite its cooldown (100), held until 4 + 10 = 14. A decision of its own:
     * map version 2, effective 4 + 2 (the lag in force), one change, its record. */
    feed_pair(p, 4, 0.125, 3.0, &r);
    CU_ASSERT_TRUE(r.loss_spike);
    CU_ASSERT_TRUE(r.decided);
    CU_ASSERT_FALSE(r.scheduled);
    CU_ASSERT_TRUE(r.map_changed);
    CU_ASSERT_EQUAL(r.rolled_back, 1);
    CU_ASSERT_EQUAL(r.map_version, 2);
    CU_ASSERT_EQUAL(r.decided_step, 4);
    CU_ASSERT_EQUAL(r.effective_step, 6);
    CU_ASSERT_EQUAL(r.change_count, 1);
    assert_change(&r, 0, PRISM_PRECISION_INT8, PRISM_PRECISION_BF16, 4, PRISM_REASON_LOSS_SPIKE);
    CU_ASSERT_TRUE(r.summary.loss_spike);
    CU_ASSERT_EQUAL(r.summary.step_id, 4);
    CU_ASSERT_EQUAL(r.summary.map_version, 2);
    CU_ASSERT_EQUAL(r.summary.precision_changes, 1);
    CU_ASSERT_EQUAL(r.summary.blocks_bf16, 2);
    CU_ASSERT_EQUAL(r.summary.blocks_low, 0);
    CU_ASSERT_EQUAL(r.summary.blocks_by_precision[PRISM_PRECISION_BF16], 2);
    CU_ASSERT_EQUAL(prism_policy_config(p)->apply_lag_steps, 2);
    const prism_block_view *v = block(p, 0);
    CU_ASSERT_EQUAL(v->reason, PRISM_REASON_LOSS_SPIKE);
    CU_ASSERT_EQUAL(v->last_switch_step, 4);
    CU_ASSERT_TRUE(v->held);
    CU_ASSERT_EQUAL(v->hold_until, 14);
    CU_ASSERT_EQUAL(v->sensitivity, 0.125); /* the scores of the last scheduled decision */
    prism_policy_counters c = counters(p);
    CU_ASSERT_EQUAL(c.loss_spikes, 1);
    CU_ASSERT_EQUAL(c.loss_spike_decisions, 1);
    CU_ASSERT_EQUAL(c.blocks_rolled_back, 1);
    /* The schedule did not move: n = 5 is the next decision, where the pending config applies
     * (lag 3); block 0 is held (5 < 14) and stays bf16: no change, no new version. */
    feed_pair(p, 5, 0.0625, 1.0, &r);
    CU_ASSERT_TRUE(r.scheduled);
    CU_ASSERT_TRUE(r.decided);
    CU_ASSERT_FALSE(r.loss_spike);
    CU_ASSERT_FALSE(r.summary.loss_spike);
    CU_ASSERT_EQUAL(r.change_count, 0);
    CU_ASSERT_EQUAL(r.map_version, 2);
    CU_ASSERT_EQUAL(prism_policy_config(p)->apply_lag_steps, 3);
    CU_ASSERT_EQUAL(block(p, 0)->precision, PRISM_PRECISION_BF16);
    prism_policy_destroy(p);
}

/* A hold that would end past the largest step ends at it (kept within 2^53 for JSON readers). */
static void test_a_hold_past_the_largest_step_ends_at_it(void)
{
    prism_policy *p = make_policy(SPIKE, "{\"loss_spike_hold_steps\": 1000000000}");
    prism_step_result r;
    uint64_t base = PRISM_STEP_MAX - 10;
    for (uint64_t i = 1; i <= 3; i++)
        feed_pair(p, base + i, 0.125, 1.0, &r);
    CU_ASSERT_EQUAL(block(p, 0)->precision, PRISM_PRECISION_INT8);
    feed_pair(p, base + 4, 0.125, 3.0, &r);
    CU_ASSERT_EQUAL(r.rolled_back, 1);
    CU_ASSERT_TRUE(block(p, 0)->held);
    CU_ASSERT_EQUAL(block(p, 0)->hold_until, PRISM_STEP_MAX);
    /* A hold that fits is step + hold_steps exactly. */
    prism_policy_destroy(p);
    p = make_policy(SPIKE, "{\"loss_spike_hold_steps\": 6}");
    for (uint64_t i = 1; i <= 3; i++)
        feed_pair(p, base + i, 0.125, 1.0, &r);
    feed_pair(p, base + 4, 0.125, 3.0, &r);
    CU_ASSERT_EQUAL(r.rolled_back, 1);
    CU_ASSERT_EQUAL(block(p, 0)->hold_until, PRISM_STEP_MAX);
    prism_policy_destroy(p);
    p = make_policy(SPIKE, "{\"loss_spike_hold_steps\": 5}");
    for (uint64_t i = 1; i <= 3; i++)
        feed_pair(p, base + i, 0.125, 1.0, &r);
    feed_pair(p, base + 4, 0.125, 3.0, &r);
    CU_ASSERT_EQUAL(block(p, 0)->hold_until, PRISM_STEP_MAX - 1);
    prism_policy_destroy(p);
}

static void test_spike_on_a_scheduled_step_rolls_back_inside_the_decision(void)
{
    /* Decisions at n = 1, 5, 9; the rule off (factor 0), window 4, hold 0, no cooldown; W fills
     * anyway (s1-s4: [1, 1, 1, 1]). A config with factor 2 is set before s5, a decision step:
     * applied first, then 3 > 2 * 1 is a spike. Block 0 (low by score at 1, 5 - 1 = 4 <= 4) goes
     * to bf16 with reason loss_spike and skips the other rules of the decision: its score 0.0625
     * would send it low again (0.0625 < 0.25 - 0.125, no cooldown, the hold of 0 ends at 5). One
     * record: loss_spike, one change. */
    const char *base = "{\"bf16_threshold\": 0.5, \"int8_threshold\": 0.25, \"hysteresis_margin\": 0.125,"
                       " \"grad_sensitivity_threshold\": 2.0, \"warmup_steps\": 1, \"update_interval_steps\": 4,"
                       " \"history_window\": 1, \"min_steps_between_switches\": 0, \"loss_spike_window\": 4,"
                       " \"loss_spike_hold_steps\": 0}";
    prism_policy *p = make_policy(base, NULL);
    prism_step_result r;
    feed_pair(p, 1, 0.125, 1.0, &r);
    CU_ASSERT_EQUAL(block(p, 0)->precision, PRISM_PRECISION_INT8);
    for (uint64_t s = 2; s <= 4; s++)
        feed_pair(p, s, 0.125, 1.0, &r); /* W = [1, 1, 1, 1] */
    set_config(p, base, "{\"loss_spike_factor\": 2}");
    feed_pair(p, 5, 0.0625, 3.0, &r);
    CU_ASSERT_TRUE(r.scheduled);
    CU_ASSERT_TRUE(r.decided);
    CU_ASSERT_TRUE(r.loss_spike);
    CU_ASSERT_EQUAL(r.rolled_back, 1);
    CU_ASSERT_EQUAL(r.change_count, 1);
    assert_change(&r, 0, PRISM_PRECISION_INT8, PRISM_PRECISION_BF16, 5, PRISM_REASON_LOSS_SPIKE);
    CU_ASSERT_TRUE(r.summary.loss_spike);
    CU_ASSERT_EQUAL(r.summary.precision_changes, 1);
    CU_ASSERT_EQUAL(r.map_version, 2);
    CU_ASSERT_EQUAL(r.effective_step, 6);
    /* scores were computed for the view and the record */
    CU_ASSERT_TRUE(block(p, 0)->has_score);
    CU_ASSERT_EQUAL(block(p, 0)->sensitivity, 0.0625);
    prism_policy_counters c = counters(p);
    CU_ASSERT_EQUAL(c.loss_spikes, 1);
    CU_ASSERT_EQUAL(c.loss_spike_decisions, 0); /* inside a scheduled decision */
    CU_ASSERT_EQUAL(c.blocks_rolled_back, 1);
    /* The next decision (n = 9): the hold (until 5) is over and there is no cooldown: low again. */
    for (uint64_t s = 6; s <= 9; s++)
        feed_pair(p, s, 0.0625, 1.0, &r);
    assert_change(&r, 0, PRISM_PRECISION_BF16, PRISM_PRECISION_INT8, 9, PRISM_REASON_SCORE);
    prism_policy_destroy(p);
}

/* Decisions at n = 1, 5, 9, 13; factor 2, window 4, hold 0, no cooldown. Block 0: bf16 at 1
 * (score 0.625), low by score at 5 (0.0625: below 0.25 - 0.125). `spike_at` is 6 (off the
 * schedule) or 9 (a decision); at it the loss is 3 (W [1, 1, 1, 1]) and block 0's statistics
 * are non-finite. */
static const char *const NF_SPIKE =
    "{\"bf16_threshold\": 0.5, \"int8_threshold\": 0.25, \"hysteresis_margin\": 0.125,"
    " \"grad_sensitivity_threshold\": 2.0, \"warmup_steps\": 1, \"update_interval_steps\": 4,"
    " \"history_window\": 1, \"min_steps_between_switches\": 0, \"loss_spike_factor\": 2,"
    " \"loss_spike_window\": 4, \"loss_spike_hold_steps\": 0}";

static prism_policy *spike_with_nonfinite(uint64_t spike_at, prism_step_result *r)
{
    prism_policy *p = make_policy(NF_SPIKE, NULL);
    feed_pair(p, 1, 0.625, 1.0, r);
    CU_ASSERT_EQUAL(block(p, 0)->precision, PRISM_PRECISION_BF16);
    for (uint64_t s = 2; s < spike_at; s++)
        feed_pair(p, s, 0.0625, 1.0, r);
    CU_ASSERT_EQUAL(block(p, 0)->precision, PRISM_PRECISION_INT8);
    prism_block_stats b[2] = {stats(0, 0.0625), stats(1, 0.9375)};
    b[0].nonfinite = 3;
    feed_blocks(p, spike_at, 3.0, b, 2, r);
    CU_ASSERT_TRUE(r->loss_spike);
    CU_ASSERT_EQUAL(r->rolled_back, 1);
    assert_change(r, 0, PRISM_PRECISION_INT8, PRISM_PRECISION_BF16, spike_at, PRISM_REASON_LOSS_SPIKE);
    return p;
}

/* Off the schedule (s6) the rollback leaves the block's non-finite flag pending: the decision at
 * s9 applies the non-finite rule (bf16, no change) where the score alone (0.0625, no hold, no
 * cooldown) would move it low; the one at s13, with finite statistics since, does. */
static void test_a_spike_off_the_schedule_leaves_nonfinite_flags_pending(void)
{
    prism_step_result r;
    prism_policy *p = spike_with_nonfinite(6, &r);
    CU_ASSERT_FALSE(r.scheduled);
    for (uint64_t s = 7; s <= 9; s++)
        feed_pair(p, s, 0.0625, 1.0, &r);
    CU_ASSERT_TRUE(r.scheduled);
    CU_ASSERT_EQUAL(r.change_count, 0);
    CU_ASSERT_EQUAL(block(p, 0)->precision, PRISM_PRECISION_BF16);
    CU_ASSERT_EQUAL(block(p, 0)->reason, PRISM_REASON_LOSS_SPIKE);
    for (uint64_t s = 10; s <= 13; s++)
        feed_pair(p, s, 0.0625, 1.0, &r);
    assert_change(&r, 0, PRISM_PRECISION_BF16, PRISM_PRECISION_INT8, 13, PRISM_REASON_SCORE);
    prism_policy_destroy(p);
}

/* At a scheduled decision (s9) the rollback clears the block's non-finite flag with its other
 * rules: the next decision (s13) moves it low by score at once. */
static void test_a_spike_at_a_decision_clears_the_blocks_nonfinite_flag(void)
{
    prism_step_result r;
    prism_policy *p = spike_with_nonfinite(9, &r);
    CU_ASSERT_TRUE(r.scheduled);
    CU_ASSERT_EQUAL(r.change_count, 1);
    for (uint64_t s = 10; s <= 13; s++)
        feed_pair(p, s, 0.0625, 1.0, &r);
    assert_change(&r, 0, PRISM_PRECISION_BF16, PRISM_PRECISION_INT8, 13, PRISM_REASON_SCORE);
    prism_policy_destroy(p);
}

/* A pending loss_spike_window applied at the spike's decision decides qualification: block 0
 * moved low by score at 5; at s9 the new window 3 is in force (W keeps its newest 3 losses, full),
 * 3 > 2 x 1 is a spike, but 9 - 5 = 4 > 3: nothing is rolled back (under the old 4 it would be). */
static void test_a_new_spike_window_at_the_decision_decides_who_is_rolled_back(void)
{
    prism_policy *p = make_policy(NF_SPIKE, NULL);
    prism_step_result r;
    feed_pair(p, 1, 0.625, 1.0, &r);
    for (uint64_t s = 2; s <= 8; s++)
        feed_pair(p, s, 0.0625, 1.0, &r);
    CU_ASSERT_EQUAL(block(p, 0)->precision, PRISM_PRECISION_INT8);
    set_config(p, NF_SPIKE, "{\"loss_spike_window\": 3}");
    feed_pair(p, 9, 0.0625, 3.0, &r);
    CU_ASSERT_TRUE(r.scheduled);
    CU_ASSERT_TRUE(r.loss_spike);
    CU_ASSERT_EQUAL(r.rolled_back, 0);
    CU_ASSERT_EQUAL(block(p, 0)->precision, PRISM_PRECISION_INT8);
    CU_ASSERT_EQUAL(prism_policy_config(p)->loss_spike_window, 3);
    prism_policy_destroy(p);
}

static void test_spike_window_bound_on_both_sides(void)
{
    /* SPIKE with decisions at n = 1 and 11 (interval 10). Block 0 goes low by score at d = 1.
     * The first loss comes at step first; W (3) is full after first + 2; the spike at step s:
     *   s = 4 (first 1): 4 - 1 = 3 <= 3: rolled back, a decision of its own
     *   s = 5 (first 2): 5 - 1 = 4 > 3: no qualifying block: counted, nothing else */
    static const struct {
        uint64_t first, spike_step;
        bool rolled;
    } rows[] = {{1, 4, true}, {2, 5, false}};
    for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++) {
        prism_policy *p = make_policy(SPIKE, "{\"update_interval_steps\": 10}");
        prism_step_result r;
        for (uint64_t s = 1; s < rows[i].spike_step; s++)
            feed_pair(p, s, 0.125, s >= rows[i].first ? 1.0 : NO_LOSS, &r);
        CU_ASSERT_EQUAL(block(p, 0)->precision, PRISM_PRECISION_INT8);
        feed_pair(p, rows[i].spike_step, 0.125, 3.0, &r);
        CU_ASSERT_TRUE(r.loss_spike);
        CU_ASSERT_EQUAL(r.decided, rows[i].rolled);
        CU_ASSERT_EQUAL(r.map_changed, rows[i].rolled);
        CU_ASSERT_EQUAL(r.rolled_back, rows[i].rolled ? 1 : 0);
        CU_ASSERT_EQUAL(r.map_version, rows[i].rolled ? 2 : 1);
        CU_ASSERT_EQUAL(block(p, 0)->precision, rows[i].rolled ? PRISM_PRECISION_BF16 : PRISM_PRECISION_INT8);
        prism_policy_counters c = counters(p);
        CU_ASSERT_EQUAL(c.loss_spikes, 1);
        CU_ASSERT_EQUAL(c.loss_spike_decisions, rows[i].rolled ? 1 : 0);
        CU_ASSERT_EQUAL(c.blocks_rolled_back, rows[i].rolled ? 1 : 0);
        prism_policy_destroy(p);
    }
}

static void test_only_blocks_last_moved_low_by_score_are_rolled_back(void)
{
    /* Four blocks, a decision every step, cooldown 0, W (2) full after s2, the spike at s3.
     * Norms 0.25, 0.25, 3.5, 0.0: mean 1; grad_score 0.125, 0.125, 1 (1.75 capped), 0.
     *   block 0: low by score at 1: 3 - 1 = 2 <= 2: rolled back
     *   block 1: low by override at its first report (force_int8_blocks): not rolled back
     *   block 2: bf16: nothing to roll back
     *   block 3: low by score at 1: rolled back */
    const char *base = "{\"bf16_threshold\": 0.5, \"int8_threshold\": 0.25, \"hysteresis_margin\": 0.125,"
                       " \"grad_sensitivity_threshold\": 2.0, \"warmup_steps\": 1, \"update_interval_steps\": 1,"
                       " \"history_window\": 1, \"min_steps_between_switches\": 0, \"loss_spike_factor\": 2,"
                       " \"loss_spike_window\": 2, \"force_int8_blocks\": [1]}";
    prism_policy *p = make_policy(base, NULL);
    prism_block_stats b[4] = {stats(0, 0.25), stats(1, 0.25), stats(2, 3.5), stats(3, 0.0)};
    prism_step_result r;
    feed_blocks(p, 1, 1.0, b, 4, &r);
    feed_blocks(p, 2, 1.0, b, 4, &r);
    CU_ASSERT_EQUAL(block(p, 0)->precision, PRISM_PRECISION_INT8);
    CU_ASSERT_EQUAL(block(p, 1)->reason, PRISM_REASON_OVERRIDE);
    CU_ASSERT_EQUAL(block(p, 3)->precision, PRISM_PRECISION_INT8);
    feed_blocks(p, 3, 3.0, b, 4, &r);
    CU_ASSERT_TRUE(r.loss_spike);
    CU_ASSERT_EQUAL(r.rolled_back, 2); /* blocks 0 and 3 */
    assert_change(&r, 0, PRISM_PRECISION_INT8, PRISM_PRECISION_BF16, 3, PRISM_REASON_LOSS_SPIKE);
    assert_change(&r, 3, PRISM_PRECISION_INT8, PRISM_PRECISION_BF16, 3, PRISM_REASON_LOSS_SPIKE);
    CU_ASSERT_PTR_NULL(find_change(&r, 1));
    CU_ASSERT_PTR_NULL(find_change(&r, 2));
    CU_ASSERT_EQUAL(block(p, 1)->precision, PRISM_PRECISION_INT8);
    prism_policy_destroy(p);
    /* Under a pending mode static applied at the spike's decision step: no block qualifies; the
     * mode rule sends blocks 0 and 3 to bf16 with reason mode. */
    p = make_policy(base, NULL);
    feed_blocks(p, 1, 1.0, b, 4, &r);
    feed_blocks(p, 2, 1.0, b, 4, &r);
    set_config(p, base, "{\"mode\": \"static\"}");
    feed_blocks(p, 3, 3.0, b, 4, &r);
    CU_ASSERT_TRUE(r.loss_spike);
    CU_ASSERT_EQUAL(r.rolled_back, 0);
    assert_change(&r, 0, PRISM_PRECISION_INT8, PRISM_PRECISION_BF16, 3, PRISM_REASON_MODE);
    assert_change(&r, 3, PRISM_PRECISION_INT8, PRISM_PRECISION_BF16, 3, PRISM_REASON_MODE);
    CU_ASSERT_EQUAL(counters(p).loss_spikes, 1);
    CU_ASSERT_EQUAL(counters(p).blocks_rolled_back, 0);
    prism_policy_destroy(p);
}

static void test_hold_blocks_the_score_until_its_end_then_cooldown_applies(void)
{
    /* A decision every step, W (2) full after s2, the spike at s3 rolls block 0 back (low by
     * score at 1: 3 - 1 = 2 <= 2) whatever the cooldown, hold_until = 3 + hold. From s4 on block
     * 0's score is 0.0625 < 0.25 - 0.125: the score wants it low. It goes low at the first step t
     * with t >= 3 + hold (the hold) and t - 3 >= min_steps (the cooldown from the rollback):
     *   hold 4, cooldown 2: max(7, 5) = 7 (the hold decides; 5 and 6 are blocked by it alone)
     *   hold 1, cooldown 3: max(4, 6) = 6 (after the hold, the cooldown decides)
     *   hold 0, cooldown 0: 4
     * Before: bf16 with reason loss_spike. */
    static const struct {
        int hold, cooldown;
        uint64_t low_at;
    } rows[] = {{4, 2, 7}, {1, 3, 6}, {0, 0, 4}};
    for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++) {
        char extra[200];
        snprintf(extra, sizeof extra,
                 "{\"loss_spike_factor\": 2, \"loss_spike_window\": 2, \"loss_spike_hold_steps\": %d,"
                 " \"min_steps_between_switches\": %d}",
                 rows[i].hold, rows[i].cooldown);
        prism_policy *p = make_policy(EXACT, extra);
        prism_step_result r;
        feed_pair(p, 1, 0.125, 1.0, &r);
        feed_pair(p, 2, 0.125, 1.0, &r);
        feed_pair(p, 3, 0.125, 3.0, &r);
        assert_change(&r, 0, PRISM_PRECISION_INT8, PRISM_PRECISION_BF16, 3, PRISM_REASON_LOSS_SPIKE);
        CU_ASSERT_EQUAL(block(p, 0)->hold_until, 3 + (uint64_t)rows[i].hold);
        for (uint64_t t = 4; t <= rows[i].low_at; t++) {
            feed_pair(p, t, 0.0625, 1.0, &r);
            if (t < rows[i].low_at) {
                CU_ASSERT_EQUAL(block(p, 0)->precision, PRISM_PRECISION_BF16);
                CU_ASSERT_EQUAL(r.change_count, 0);
            }
        }
        assert_change(&r, 0, PRISM_PRECISION_BF16, PRISM_PRECISION_INT8, rows[i].low_at, PRISM_REASON_SCORE);
        prism_policy_destroy(p);
    }
}

static void test_overrides_win_over_the_spike_and_its_hold(void)
{
    prism_step_result r;
    /* (a) A block forced low by the config in force is never rolled back: block 0 low by score
     * at 1; force_int8_blocks [0] is applied at s3's decision (it is low already: no change, its
     * reason stays score), then the spike: it is forced, so it stays low. */
    prism_policy *p = make_policy(EXACT, "{\"loss_spike_factor\": 2, \"loss_spike_window\": 2}");
    feed_pair(p, 1, 0.125, 1.0, &r);
    feed_pair(p, 2, 0.125, 1.0, &r);
    set_config(p, EXACT, "{\"loss_spike_factor\": 2, \"loss_spike_window\": 2, \"force_int8_blocks\": [0]}");
    feed_pair(p, 3, 0.125, 3.0, &r);
    CU_ASSERT_TRUE(r.loss_spike);
    CU_ASSERT_TRUE(r.summary.loss_spike);
    CU_ASSERT_EQUAL(r.rolled_back, 0);
    CU_ASSERT_EQUAL(r.change_count, 0);
    CU_ASSERT_EQUAL(block(p, 0)->precision, PRISM_PRECISION_INT8);
    CU_ASSERT_EQUAL(block(p, 0)->reason, PRISM_REASON_SCORE);
    prism_policy_destroy(p);
    /* (b) force_bf16_blocks [0] applied at the spike's decision: block 0 goes bf16 with reason
     * override (the override, not the spike). */
    p = make_policy(EXACT, "{\"loss_spike_factor\": 2, \"loss_spike_window\": 2}");
    feed_pair(p, 1, 0.125, 1.0, &r);
    feed_pair(p, 2, 0.125, 1.0, &r);
    set_config(p, EXACT, "{\"loss_spike_factor\": 2, \"loss_spike_window\": 2, \"force_bf16_blocks\": [0]}");
    feed_pair(p, 3, 0.125, 3.0, &r);
    CU_ASSERT_TRUE(r.loss_spike);
    CU_ASSERT_EQUAL(r.rolled_back, 0);
    assert_change(&r, 0, PRISM_PRECISION_INT8, PRISM_PRECISION_BF16, 3, PRISM_REASON_OVERRIDE);
    prism_policy_destroy(p);
    /* (c) A held block forced low moves at once (override), before its hold (until 3 + 100). */
    p = make_policy(EXACT, "{\"loss_spike_factor\": 2, \"loss_spike_window\": 2, \"loss_spike_hold_steps\": 100}");
    feed_pair(p, 1, 0.125, 1.0, &r);
    feed_pair(p, 2, 0.125, 1.0, &r);
    feed_pair(p, 3, 0.125, 3.0, &r);
    CU_ASSERT_EQUAL(block(p, 0)->precision, PRISM_PRECISION_BF16);
    set_config(p, EXACT, "{\"loss_spike_factor\": 2, \"loss_spike_window\": 2, \"loss_spike_hold_steps\": 100,"
                         " \"force_int8_blocks\": [0]}");
    feed_pair(p, 4, 0.125, 1.0, &r);
    assert_change(&r, 0, PRISM_PRECISION_BF16, PRISM_PRECISION_INT8, 4, PRISM_REASON_OVERRIDE);
    prism_policy_destroy(p);
}

/* ---- rule 2: a low format per block ---- */

/* Auto over [int4, fp8_e4m3, int8] with a threshold exact in binary, weights 0.5 / 0.5. */
static const char *const AUTO =
    "{\"low_precision\": \"auto\", \"low_formats\": [\"int4\", \"fp8_e4m3\", \"int8\"],"
    " \"quant_error_threshold\": 0.0625, \"grad_weight\": 0.5, \"error_weight\": 0.5}";

static void test_candidate_format_with_and_without_calibration(void)
{
    /* Block 0 with a = 0.125 (grad_score 0.125) at its fresh assignment. error_score =
     * e(candidate) / 0.0625; s = 0.5 * 0.125 + 0.5 * error_score; low below 0.25, bf16 from 0.5. */
    static const struct {
        const char *config;   /* on top of EXACT */
        double e[PRISM_PRECISION_COUNT]; /* block 0's errors by format; NaN: none */
        prism_precision candidate;
        bool has_error;
        double error_score, s;
        prism_precision precision;
    } rows[] = {
        /* no calibration: the last of the list, s = grad_score */
        {AUTO, {NAN, NAN, NAN, NAN, NAN}, PRISM_PRECISION_INT8, false, 0, 0.125, PRISM_PRECISION_INT8},
        /* int4 0.0625 <= 0.0625 (at the threshold): int4; error_score 1, s = 0.5625: bf16 */
        {AUTO, {NAN, NAN, NAN, NAN, 0.0625}, PRISM_PRECISION_INT4, true, 1.0, 0.5625, PRISM_PRECISION_BF16},
        /* int4 0.125 > 0.0625, fp8_e4m3 0.015625: fp8_e4m3; error_score 0.25, s = 0.1875 */
        {AUTO, {NAN, NAN, 0.015625, NAN, 0.125}, PRISM_PRECISION_FP8_E4M3, true, 0.25, 0.1875,
         PRISM_PRECISION_FP8_E4M3},
        /* all above: the last, int8, with its own error: error_score min(2, 1) = 1, s = 0.5625 */
        {AUTO, {NAN, 0.125, 0.125, NAN, 0.125}, PRISM_PRECISION_INT8, true, 1.0, 0.5625, PRISM_PRECISION_BF16},
        /* int4 and fp8_e4m3 unknown, int8 0.015625: int8; error_score 0.25, s = 0.1875 */
        {AUTO, {NAN, 0.015625, NAN, NAN, NAN}, PRISM_PRECISION_INT8, true, 0.25, 0.1875, PRISM_PRECISION_INT8},
        /* unknown above, known below: int4 unknown, fp8_e4m3 0.0: fp8_e4m3, error_score 0, s = 0.0625 */
        {AUTO, {NAN, 0.0, 0.0, NAN, NAN}, PRISM_PRECISION_FP8_E4M3, true, 0.0, 0.0625, PRISM_PRECISION_FP8_E4M3},
        /* a fixed low_precision: the candidate is it; an int4 error is not its error */
        {"{\"low_precision\": \"fp8_e5m2\", \"grad_weight\": 0.5, \"error_weight\": 0.5}",
         {NAN, NAN, NAN, NAN, 0.0}, PRISM_PRECISION_FP8_E5M2, false, 0, 0.125, PRISM_PRECISION_FP8_E5M2},
        /* a list of one, above the threshold: that one (the last) */
        {"{\"low_precision\": \"auto\", \"low_formats\": [\"fp8_e5m2\"], \"quant_error_threshold\": 0.0625,"
         " \"grad_weight\": 0.5, \"error_weight\": 0.5}",
         {NAN, NAN, NAN, 0.125, NAN}, PRISM_PRECISION_FP8_E5M2, true, 1.0, 0.5625, PRISM_PRECISION_BF16},
    };
    for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++) {
        prism_policy *p = make_policy(EXACT, rows[i].config);
        for (int f = 1; f < PRISM_PRECISION_COUNT; f++)
            if (!isnan(rows[i].e[f]))
                set_calibration(p, (prism_precision)f, 0, rows[i].e[f]);
        prism_step_result r;
        feed_pair(p, 1, 0.125, NO_LOSS, &r);
        const prism_block_view *v = block(p, 0);
        if (v->candidate != rows[i].candidate || v->precision != rows[i].precision)
            fprintf(stderr, "row %zu: candidate %d precision %d\n", i, (int)v->candidate, (int)v->precision);
        CU_ASSERT_EQUAL(v->candidate, rows[i].candidate);
        CU_ASSERT_EQUAL(v->has_error_score, rows[i].has_error);
        if (rows[i].has_error)
            CU_ASSERT_EQUAL(v->error_score, rows[i].error_score);
        CU_ASSERT_EQUAL(v->sensitivity, rows[i].s);
        CU_ASSERT_EQUAL(v->precision, rows[i].precision);
        if (rows[i].precision != PRISM_PRECISION_BF16)
            assert_change(&r, 0, PRISM_PRECISION_BF16, rows[i].precision, 1, PRISM_REASON_SCORE);
        prism_policy_destroy(p);
    }
}

static void test_ambiguous_default_low_takes_the_candidate(void)
{
    /* a = 0.375: s = 0.375 between 0.25 and 0.5; ambiguous_default low: the candidate (no
     * calibration: int8, the last; with an int4 error of 0 it would be int4, but then s =
     * 0.1875 + 0 = 0.1875 < 0.25 anyway, so keep it uncalibrated and the list [fp8_e5m2, int4]). */
    prism_policy *p = make_policy(EXACT, "{\"low_precision\": \"auto\", \"low_formats\": [\"fp8_e5m2\", \"int4\"],"
                                         " \"ambiguous_default\": \"low\"}");
    prism_step_result r;
    feed_pair(p, 1, 0.375, NO_LOSS, &r);
    assert_change(&r, 0, PRISM_PRECISION_BF16, PRISM_PRECISION_INT4, 1, PRISM_REASON_SCORE);
    prism_policy_destroy(p);
}

static void test_format_switch_waits_for_the_cooldown(void)
{
    /* AUTO, a decision every step, cooldown 4. s1: no calibration: block 0 (s 0.125) goes to
     * int8 (the last). An int4 error of 0.015625 arrives: from s2 the candidate is int4 (s =
     * 0.0625 + 0.125 = 0.1875: still low). 2 - 1, 3 - 1, 4 - 1 < 4: cooling, it stays int8;
     * at s5 (5 - 1 = 4) it moves to int4 with reason format. */
    prism_policy *p = make_policy(EXACT, "{\"low_precision\": \"auto\", \"low_formats\": [\"int4\", \"fp8_e4m3\","
                                         " \"int8\"], \"quant_error_threshold\": 0.0625, \"grad_weight\": 0.5,"
                                         " \"error_weight\": 0.5, \"min_steps_between_switches\": 4}");
    prism_step_result r;
    feed_pair(p, 1, 0.125, NO_LOSS, &r);
    assert_change(&r, 0, PRISM_PRECISION_BF16, PRISM_PRECISION_INT8, 1, PRISM_REASON_SCORE);
    set_calibration(p, PRISM_PRECISION_INT4, 0, 0.015625);
    for (uint64_t s = 2; s <= 4; s++) {
        feed_pair(p, s, 0.125, NO_LOSS, &r);
        CU_ASSERT_EQUAL(r.change_count, 0);
        CU_ASSERT_EQUAL(block(p, 0)->precision, PRISM_PRECISION_INT8);
        CU_ASSERT_EQUAL(block(p, 0)->candidate, PRISM_PRECISION_INT4);
        CU_ASSERT_EQUAL(block(p, 0)->sensitivity, 0.1875);
    }
    feed_pair(p, 5, 0.125, NO_LOSS, &r);
    assert_change(&r, 0, PRISM_PRECISION_INT8, PRISM_PRECISION_INT4, 5, PRISM_REASON_FORMAT);
    CU_ASSERT_EQUAL(block(p, 0)->reason, PRISM_REASON_FORMAT);
    CU_ASSERT_EQUAL(r.summary.blocks_by_precision[PRISM_PRECISION_INT4], 1);
    CU_ASSERT_EQUAL(r.summary.blocks_by_precision[PRISM_PRECISION_BF16], 1);
    CU_ASSERT_EQUAL(r.summary.blocks_low, 1);
    CU_ASSERT_EQUAL(r.summary.bandwidth_saving_pct, 37.5); /* (0.75 + 0) / 2 */
    prism_policy_destroy(p);
}

static void test_forced_blocks_under_auto_follow_their_candidate_at_once(void)
{
    /* force_int8_blocks [0] under AUTO with an int4 error 0.015625: at its first report block 0
     * goes to int4 (override). Then its int4 error becomes 0.125 and fp8_e4m3 0.015625: at the
     * next decision it moves to fp8_e4m3 at once despite the cooldown (100), reason format. */
    prism_step_result r;
    prism_policy *p = make_policy(EXACT, "{\"low_precision\": \"auto\", \"low_formats\": [\"int4\", \"fp8_e4m3\", \"int8\"],"
                           " \"quant_error_threshold\": 0.0625, \"min_steps_between_switches\": 100,"
                           " \"force_int8_blocks\": [0]}");
    set_calibration(p, PRISM_PRECISION_INT4, 0, 0.015625);
    feed_pair(p, 1, 0.125, NO_LOSS, &r);
    assert_change(&r, 0, PRISM_PRECISION_BF16, PRISM_PRECISION_INT4, 1, PRISM_REASON_OVERRIDE);
    set_calibration(p, PRISM_PRECISION_INT4, 0, 0.125);
    set_calibration(p, PRISM_PRECISION_FP8_E4M3, 0, 0.015625);
    feed_pair(p, 2, 0.125, NO_LOSS, &r);
    assert_change(&r, 0, PRISM_PRECISION_INT4, PRISM_PRECISION_FP8_E4M3, 2, PRISM_REASON_FORMAT);
    CU_ASSERT_TRUE(block(p, 0)->forced);
    prism_policy_destroy(p);
}

static void test_fixed_to_auto_takes_the_format_rule(void)
{
    /* Fixed int8: block 0 goes low by score at 1. The config becomes AUTO with an int4 error of
     * 0.015625 for block 0: at s2 it moves int8 -> int4 with reason format (no cooldown here).
     * With a cooldown of 100 it would stay int8 (the format rule waits; a fixed low_precision's
     * change would move it at once with reason mode). */
    static const struct {
        int cooldown;
        bool moves;
    } rows[] = {{0, true}, {100, false}};
    for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++) {
        char extra[300];
        snprintf(extra, sizeof extra,
                 "{\"low_precision\": \"auto\", \"low_formats\": [\"int4\", \"int8\"],"
                 " \"quant_error_threshold\": 0.0625, \"min_steps_between_switches\": %d}",
                 rows[i].cooldown);
        prism_policy *p = make_policy(EXACT, NULL);
        prism_step_result r;
        feed_pair(p, 1, 0.125, NO_LOSS, &r);
        CU_ASSERT_EQUAL(block(p, 0)->precision, PRISM_PRECISION_INT8);
        set_calibration(p, PRISM_PRECISION_INT4, 0, 0.015625);
        set_config(p, EXACT, extra);
        feed_pair(p, 2, 0.125, NO_LOSS, &r);
        CU_ASSERT_EQUAL(r.summary.low_precision, PRISM_LOW_AUTO);
        if (rows[i].moves)
            assert_change(&r, 0, PRISM_PRECISION_INT8, PRISM_PRECISION_INT4, 2, PRISM_REASON_FORMAT);
        else
            CU_ASSERT_EQUAL(r.change_count, 0);
        CU_ASSERT_EQUAL(block(p, 0)->candidate, PRISM_PRECISION_INT4);
        prism_policy_destroy(p);
    }
}

/* ---- rule 3: saturation ---- */

static void test_saturated_fraction_over_the_window_sends_low_blocks_to_bf16(void)
{
    /* EXACT with history_window 2, decisions at n = 1 and 3 (interval 2), cooldown 100, threshold
     * 0.25. Block 0 (a = 0.125) goes low by score at 1. Its window at s3 holds the entries of s2
     * and s3; the saturated fraction is the mean over those that carried figures (sat[k] < 0:
     * none). Above the threshold (strict): bf16 at 3 with reason saturation despite the cooldown. */
    static const struct {
        double sat[3], und[3];
        bool has;
        double mean_sat, mean_und;
        bool to_bf16;
    } rows[] = {
        {{-1, 0.25, 0.5}, {-1, 0.5, 0.25}, true, 0.375, 0.375, true},      /* (0.25 + 0.5) / 2 > 0.25 */
        {{-1, 0.25, 0.25}, {-1, 0, 0}, true, 0.25, 0.0, false},            /* 0.25 is not > 0.25 */
        {{-1, -1, 0.5}, {-1, -1, 0.125}, true, 0.5, 0.125, true},          /* s2 carried none: 0.5 / 1 */
        {{-1, -1, -1}, {-1, -1, -1}, false, 0, 0, false},                  /* no figures: no rule */
        {{1.0, 0.125, 0.125}, {1.0, 0, 0}, true, 0.125, 0.0, false},       /* s1 fell out of the window */
    };
    for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++) {
        prism_policy *p = make_policy(EXACT, "{\"history_window\": 2, \"update_interval_steps\": 2,"
                                             " \"min_steps_between_switches\": 100, \"saturation_threshold\": 0.25}");
        prism_step_result r;
        for (uint64_t s = 1; s <= 3; s++) {
            prism_block_stats b[2] = {stats(0, 0.125), stats(1, 0.875)};
            if (rows[i].sat[s - 1] >= 0) {
                b[0].has_saturation = true;
                b[0].saturated_fraction = rows[i].sat[s - 1];
                b[0].underflowed_fraction = rows[i].und[s - 1];
            }
            feed_blocks(p, s, NO_LOSS, b, 2, &r);
            if (s == 1)
                CU_ASSERT_EQUAL(block(p, 0)->precision, PRISM_PRECISION_INT8); /* bf16 at 1: the rule did not apply */
        }
        const prism_block_view *v = block(p, 0);
        CU_ASSERT_EQUAL(v->has_saturation, rows[i].has);
        CU_ASSERT_EQUAL(v->saturated_fraction, rows[i].mean_sat);
        CU_ASSERT_EQUAL(v->underflowed_fraction, rows[i].mean_und);
        if (rows[i].to_bf16)
            assert_change(&r, 0, PRISM_PRECISION_INT8, PRISM_PRECISION_BF16, 3, PRISM_REASON_SATURATION);
        else
            CU_ASSERT_EQUAL(r.change_count, 0);
        prism_policy_destroy(p);
    }
}

static void test_saturation_rule_leaves_forced_blocks_and_bf16_blocks_alone(void)
{
    /* Block 0 forced low, block 1 bf16 (s = 0.875), both fully saturated: neither changes. */
    prism_policy *p = make_policy(EXACT, "{\"force_int8_blocks\": [0], \"saturation_threshold\": 0}");
    prism_step_result r;
    for (uint64_t s = 1; s <= 2; s++) {
        prism_block_stats b[2] = {stats(0, 0.125), stats(1, 0.875)};
        for (int k = 0; k < 2; k++) {
            b[k].has_saturation = true;
            b[k].saturated_fraction = 1.0;
        }
        feed_blocks(p, s, NO_LOSS, b, 2, &r);
    }
    CU_ASSERT_EQUAL(r.change_count, 0);
    CU_ASSERT_EQUAL(block(p, 0)->precision, PRISM_PRECISION_INT8);
    CU_ASSERT_EQUAL(block(p, 1)->precision, PRISM_PRECISION_BF16);
    CU_ASSERT_EQUAL(block(p, 0)->saturated_fraction, 1.0);
    prism_policy_destroy(p);
}

static void test_saturation_figures_are_checked(void)
{
    prism_policy *p = make_policy(EXACT, NULL);
    prism_block_stats b = stats(7, 1.0);
    b.has_saturation = true;
    b.saturated_fraction = -0.5;
    prism_step_result r;
    prism_error err;
    CU_ASSERT_EQUAL(prism_policy_add_step(p, 1, NULL, &b, 1, &r, &err), PRISM_ERR_INVALID);
    CU_ASSERT_PTR_NOT_NULL(strstr(err.message, "block 7: saturated_fraction"));
    b.saturated_fraction = 0;
    b.underflowed_fraction = INFINITY;
    CU_ASSERT_EQUAL(prism_policy_add_step(p, 1, NULL, &b, 1, &r, &err), PRISM_ERR_INVALID);
    CU_ASSERT_PTR_NOT_NULL(strstr(err.message, "block 7: underflowed_fraction"));
    b.saturated_fraction = NAN; /* NaN saturated, a valid underflowed */
    b.underflowed_fraction = 0.5;
    CU_ASSERT_EQUAL(prism_policy_add_step(p, 1, NULL, &b, 1, &r, &err), PRISM_ERR_INVALID);
    CU_ASSERT_PTR_NOT_NULL(strstr(err.message, "block 7: saturated_fraction"));
    b.saturated_fraction = 0.5;
    b.underflowed_fraction = NAN;
    CU_ASSERT_EQUAL(prism_policy_add_step(p, 1, NULL, &b, 1, &r, &err), PRISM_ERR_INVALID);
    CU_ASSERT_PTR_NOT_NULL(strstr(err.message, "block 7: underflowed_fraction"));
    b.underflowed_fraction = 1.5;
    CU_ASSERT_EQUAL(prism_policy_add_step(p, 1, NULL, &b, 1, &r, &err), PRISM_ERR_INVALID);
    CU_ASSERT_PTR_NOT_NULL(strstr(err.message, "block 7: underflowed_fraction"));
    CU_ASSERT_EQUAL(prism_policy_steps_collected(p), 0);
    prism_policy_destroy(p);
}

static void test_new_reasons_have_their_wire_values_and_names(void)
{
    CU_ASSERT_EQUAL(PRISM_REASON_FORMAT, 6);
    CU_ASSERT_EQUAL(PRISM_REASON_SATURATION, 7);
    CU_ASSERT_EQUAL(PRISM_REASON_MAX, PRISM_REASON_SATURATION);
    CU_ASSERT_STRING_EQUAL(prism_reason_name(PRISM_REASON_LOSS_SPIKE), "loss_spike");
    CU_ASSERT_STRING_EQUAL(prism_reason_name(PRISM_REASON_FORMAT), "format");
    CU_ASSERT_STRING_EQUAL(prism_reason_name(PRISM_REASON_SATURATION), "saturation");
}

/* ---- saving and restoring the new state ---- */

/* Steps of a small job that exercise every new rule: 4 blocks, norms moving with the step, a
 * loss with spikes at steps 4, 7, 11 and 14 (7: right after the restore, against the restored W), saturation figures on blocks 0 and 2 (block 0's high
 * from step 12). */
static void round_trip_step(uint64_t step, prism_block_stats *b, double *loss)
{
    static const double base[4] = {0.125, 0.25, 1.5, 2.125};
    for (uint32_t i = 0; i < 4; i++) {
        b[i] = stats(i, base[i] * (1.0 + 0.125 * (double)((step + i) % 3)));
        if (i == 0 || (i == 2 && step % 2 == 0)) {
            b[i].has_saturation = true;
            b[i].saturated_fraction = i == 0 && step >= 12 ? 0.5 : 0.0625 * (double)(step % 3);
            b[i].underflowed_fraction = 0.03125 * (double)(i + 1);
        }
    }
    b[3].l2_norm = step == 9 ? 0.0625 : b[3].l2_norm; /* block 3 dips low at 9 */
    *loss = step == 4 || step == 7 || step == 11 || step == 14 ? 10.0 : 1.0 + 0.0625 * (double)(step % 4);
}

static void assert_same_view(const prism_block_view *a, const prism_block_view *b)
{
    CU_ASSERT_EQUAL(a->id, b->id);
    CU_ASSERT_EQUAL(a->precision, b->precision);
    CU_ASSERT_EQUAL(a->reason, b->reason);
    CU_ASSERT_EQUAL(a->has_switch, b->has_switch);
    CU_ASSERT_EQUAL(a->last_switch_step, b->last_switch_step);
    CU_ASSERT_EQUAL(a->forced, b->forced);
    CU_ASSERT_EQUAL(a->has_score, b->has_score);
    CU_ASSERT_EQUAL(a->sensitivity, b->sensitivity);
    CU_ASSERT_EQUAL(a->has_error_score, b->has_error_score);
    CU_ASSERT_EQUAL(a->error_score, b->error_score);
    CU_ASSERT_EQUAL(a->candidate, b->candidate);
    CU_ASSERT_EQUAL(a->held, b->held);
    CU_ASSERT_EQUAL(a->hold_until, b->hold_until);
    CU_ASSERT_EQUAL(a->has_saturation, b->has_saturation);
    CU_ASSERT_EQUAL(a->saturated_fraction, b->saturated_fraction);
    CU_ASSERT_EQUAL(a->underflowed_fraction, b->underflowed_fraction);
    CU_ASSERT_EQUAL(a->param_bytes_bf16, b->param_bytes_bf16);
}

static void test_save_and_restore_keep_w_holds_counters_and_saturation_figures(void)
{
    const char *config = "{\"low_precision\": \"auto\", \"low_formats\": [\"int4\", \"fp8_e4m3\", \"int8\"],"
                         " \"quant_error_threshold\": 0.0625, \"update_interval_steps\": 2, \"history_window\": 3,"
                         " \"loss_spike_factor\": 2, \"loss_spike_window\": 3, \"loss_spike_hold_steps\": 4,"
                         " \"saturation_threshold\": 0.25, \"min_steps_between_switches\": 1}";
    prism_policy *a = make_policy(EXACT, config);
    set_calibration(a, PRISM_PRECISION_INT4, 0, 0.015625);
    set_calibration(a, PRISM_PRECISION_FP8_E4M3, 1, 0.03125);
    prism_error err;
    CU_ASSERT_EQUAL(prism_policy_set_block_bytes(a, 2, 4096, &err), PRISM_OK);
    prism_step_result ra, rb;
    prism_block_stats b[4];
    double loss;
    for (uint64_t s = 1; s <= 6; s++) {
        round_trip_step(s, b, &loss);
        feed_blocks(a, s, loss, b, 4, &ra);
    }
    CU_ASSERT_EQUAL(counters(a).loss_spikes, 1); /* step 4 */
    /* Save. */
    prism_policy_progress progress;
    prism_policy_progress_get(a, &progress);
    static double losses[PRISM_LOSS_WINDOW_MAX];
    CU_ASSERT_EQUAL(prism_policy_loss_window(a, losses), progress.loss_len);
    CU_ASSERT_EQUAL(progress.loss_len, 3);
    progress.losses = losses;
    size_t n = prism_policy_block_count(a);
    CU_ASSERT_EQUAL_FATAL(n, 4);
    prism_block_record recs[4];
    static double windows[4][PRISM_WINDOW_MAX], sat[4][PRISM_WINDOW_MAX], und[4][PRISM_WINDOW_MAX];
    static uint8_t has[4][PRISM_WINDOW_MAX];
    for (size_t i = 0; i < n; i++) {
        recs[i] = (prism_block_record){.window = windows[i], .window_has_saturation = has[i],
                                       .window_saturated = sat[i], .window_underflowed = und[i]};
        prism_policy_block_record(a, i, &recs[i]);
    }
    /* Restore into a fresh policy of the same config. */
    prism_policy *c = make_policy(EXACT, config);
    CU_ASSERT_EQUAL_FATAL(prism_policy_restore(c, &progress, recs, n, &err), PRISM_OK);
    prism_policy_counters ca = counters(a), cc = counters(c);
    CU_ASSERT_EQUAL(ca.loss_spikes, cc.loss_spikes);
    CU_ASSERT_EQUAL(ca.loss_spike_decisions, cc.loss_spike_decisions);
    CU_ASSERT_EQUAL(ca.blocks_rolled_back, cc.blocks_rolled_back);
    /* The same further steps: the same results, views and records. */
    size_t by_reason[PRISM_REASON_MAX + 1] = {0};
    for (uint64_t s = 7; s <= 24; s++) {
        round_trip_step(s, b, &loss);
        feed_blocks(a, s, loss, b, 4, &ra);
        feed_blocks(c, s, loss, b, 4, &rb);
        CU_ASSERT_EQUAL(ra.decided, rb.decided);
        CU_ASSERT_EQUAL(ra.scheduled, rb.scheduled);
        CU_ASSERT_EQUAL(ra.loss_spike, rb.loss_spike);
        CU_ASSERT_EQUAL(ra.rolled_back, rb.rolled_back);
        CU_ASSERT_EQUAL(ra.map_version, rb.map_version);
        CU_ASSERT_EQUAL(ra.effective_step, rb.effective_step);
        CU_ASSERT_EQUAL_FATAL(ra.change_count, rb.change_count);
        for (size_t k = 0; k < ra.change_count; k++) {
            CU_ASSERT_EQUAL(ra.changes[k].block_id, rb.changes[k].block_id);
            CU_ASSERT_EQUAL(ra.changes[k].from, rb.changes[k].from);
            CU_ASSERT_EQUAL(ra.changes[k].to, rb.changes[k].to);
            CU_ASSERT_EQUAL(ra.changes[k].step, rb.changes[k].step);
            CU_ASSERT_EQUAL(ra.changes[k].reason, rb.changes[k].reason);
            by_reason[ra.changes[k].reason]++;
        }
        for (uint32_t id = 0; id < 4; id++)
            assert_same_view(block(a, id), block(c, id));
        if (ra.decided) {
            prism_buf ta = {0}, tc = {0};
            CU_ASSERT_EQUAL_FATAL(prism_telemetry_append(&ta, a, &ra.summary, 1.0, &loss), PRISM_OK);
            CU_ASSERT_EQUAL_FATAL(prism_telemetry_append(&tc, c, &rb.summary, 1.0, &loss), PRISM_OK);
            CU_ASSERT_STRING_EQUAL(ta.data, tc.data);
            prism_buf_free(&ta);
            prism_buf_free(&tc);
        }
    }
    ca = counters(a);
    cc = counters(c);
    CU_ASSERT_EQUAL(ca.loss_spikes, cc.loss_spikes);
    CU_ASSERT_EQUAL(ca.loss_spike_decisions, cc.loss_spike_decisions);
    CU_ASSERT_EQUAL(ca.blocks_rolled_back, cc.blocks_rolled_back);
    CU_ASSERT_EQUAL(ca.loss_spikes, 4); /* 4, 7, 11, 14 */
    /* The steps after the restore exercised the new rules. */
    if (!by_reason[PRISM_REASON_LOSS_SPIKE] || !by_reason[PRISM_REASON_SATURATION])
        fprintf(stderr, "after restore: loss_spike %zu saturation %zu format %zu score %zu\n",
                by_reason[PRISM_REASON_LOSS_SPIKE], by_reason[PRISM_REASON_SATURATION], by_reason[PRISM_REASON_FORMAT],
                by_reason[PRISM_REASON_SCORE]);
    CU_ASSERT_TRUE(by_reason[PRISM_REASON_LOSS_SPIKE] > 0);
    CU_ASSERT_TRUE(by_reason[PRISM_REASON_SATURATION] > 0);
    prism_policy_destroy(a);
    prism_policy_destroy(c);
    /* A damaged loss window is refused before anything changes. */
    prism_policy *d = make_policy(EXACT, config);
    double bad[2] = {1.0, NAN};
    prism_policy_progress broken = {.loss_len = 2, .losses = bad};
    CU_ASSERT_EQUAL(prism_policy_restore(d, &broken, NULL, 0, &err), PRISM_ERR_INVALID);
    CU_ASSERT_EQUAL(prism_policy_steps_collected(d), 0);
    prism_policy_destroy(d);
}

static const prism_test_case cases[] = {
    {"test_spike_detection_uses_the_median_of_the_full_window", test_spike_detection_uses_the_median_of_the_full_window},
    {"test_spike_median_matches_a_sorted_copy_over_many_steps",
     test_spike_median_matches_a_sorted_copy_over_many_steps},
    {"test_w_is_kept_with_factor_zero_and_a_new_factor_waits_for_the_decision",
     test_w_is_kept_with_factor_zero_and_a_new_factor_waits_for_the_decision},
    {"test_a_new_loss_spike_window_keeps_the_newest_losses", test_a_new_loss_spike_window_keeps_the_newest_losses},
    {"test_spike_off_the_schedule_is_a_decision_of_its_own", test_spike_off_the_schedule_is_a_decision_of_its_own},
    {"test_a_hold_past_the_largest_step_ends_at_it", test_a_hold_past_the_largest_step_ends_at_it},
    {"test_spike_on_a_scheduled_step_rolls_back_inside_the_decision",
     test_spike_on_a_scheduled_step_rolls_back_inside_the_decision},
    {"test_a_spike_off_the_schedule_leaves_nonfinite_flags_pending",
     test_a_spike_off_the_schedule_leaves_nonfinite_flags_pending},
    {"test_a_spike_at_a_decision_clears_the_blocks_nonfinite_flag",
     test_a_spike_at_a_decision_clears_the_blocks_nonfinite_flag},
    {"test_a_new_spike_window_at_the_decision_decides_who_is_rolled_back",
     test_a_new_spike_window_at_the_decision_decides_who_is_rolled_back},
    {"test_spike_window_bound_on_both_sides", test_spike_window_bound_on_both_sides},
    {"test_only_blocks_last_moved_low_by_score_are_rolled_back", test_only_blocks_last_moved_low_by_score_are_rolled_back},
    {"test_hold_blocks_the_score_until_its_end_then_cooldown_applies",
     test_hold_blocks_the_score_until_its_end_then_cooldown_applies},
    {"test_overrides_win_over_the_spike_and_its_hold", test_overrides_win_over_the_spike_and_its_hold},
    {"test_candidate_format_with_and_without_calibration", test_candidate_format_with_and_without_calibration},
    {"test_ambiguous_default_low_takes_the_candidate", test_ambiguous_default_low_takes_the_candidate},
    {"test_format_switch_waits_for_the_cooldown", test_format_switch_waits_for_the_cooldown},
    {"test_forced_blocks_under_auto_follow_their_candidate_at_once",
     test_forced_blocks_under_auto_follow_their_candidate_at_once},
    {"test_fixed_to_auto_takes_the_format_rule", test_fixed_to_auto_takes_the_format_rule},
    {"test_saturated_fraction_over_the_window_sends_low_blocks_to_bf16",
     test_saturated_fraction_over_the_window_sends_low_blocks_to_bf16},
    {"test_saturation_rule_leaves_forced_blocks_and_bf16_blocks_alone",
     test_saturation_rule_leaves_forced_blocks_and_bf16_blocks_alone},
    {"test_saturation_figures_are_checked", test_saturation_figures_are_checked},
    {"test_new_reasons_have_their_wire_values_and_names", test_new_reasons_have_their_wire_values_and_names},
    {"test_save_and_restore_keep_w_holds_counters_and_saturation_figures",
     test_save_and_restore_keep_w_holds_counters_and_saturation_figures},
    {NULL, NULL},
};

static const prism_test_suite suites[] = {{"policy_numerics", cases}, {NULL, NULL}};

int main(int argc, char **argv)
{
    return prism_test_main(argc, argv, suites);
}
