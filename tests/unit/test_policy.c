/* The decision rules of DESIGN 4.2 and the summary of 4.4, one test per rule. Every expected
 * value is worked out by hand from DESIGN, never taken from a run of the code.
 *
 * Most tests use thresholds that are exact in binary (bf16 0.5, int8 0.25, margin 0.125) and
 * two blocks whose l2 norms a and 1 - a add up to 1: the mean is 0.5, block 0's rel is 2a and,
 * with grad_sensitivity_threshold 2, its grad_score is exactly a (block 1's is 1 - a). */
#include "testutil.h"

#include "policy.h"

#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

/* Thresholds exact in binary, a decision at every step, a window of one step, no cooldown. */
static const char *const EXACT =
    "{\"bf16_threshold\": 0.5, \"int8_threshold\": 0.25, \"hysteresis_margin\": 0.125,"
    " \"grad_sensitivity_threshold\": 2.0, \"warmup_steps\": 1, \"update_interval_steps\": 1,"
    " \"history_window\": 1, \"min_steps_between_switches\": 0}";

/* Applies the JSON objects base and extra (either may be NULL) on top of the defaults. */
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

static prism_block_stats stats(uint32_t id, double l2)
{
    prism_block_stats s = {id, l2, 1.0, 0.0, 0.25, 1000, 0, false, 0, 0};
    return s;
}

/* Feeds one step with count blocks of ids 0..count-1 and the given norms. */
static void feed(prism_policy *p, uint64_t step, const double *l2, size_t count, prism_step_result *out)
{
    prism_block_stats blocks[64];
    CU_ASSERT_FATAL(count <= 64);
    for (size_t i = 0; i < count; i++)
        blocks[i] = stats((uint32_t)i, l2[i]);
    prism_error err;
    prism_status st = prism_policy_add_step(p, step, NULL, blocks, count, out, &err);
    if (st)
        fprintf(stderr, "add_step: %s\n", err.message);
    CU_ASSERT_FATAL(st == PRISM_OK);
}

/* Blocks 0 and 1 with norms a and 1 - a: block 0's grad_score is a (EXACT config). */
static void feed_pair(prism_policy *p, uint64_t step, double a, prism_step_result *out)
{
    double l2[2] = {a, 1.0 - a};
    feed(p, step, l2, 2, out);
}

static void feed_blocks(prism_policy *p, uint64_t step, const prism_block_stats *blocks, size_t count,
                        prism_step_result *out)
{
    prism_error err;
    prism_status st = prism_policy_add_step(p, step, NULL, blocks, count, out, &err);
    if (st)
        fprintf(stderr, "add_step: %s\n", err.message);
    CU_ASSERT_FATAL(st == PRISM_OK);
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

/* ---- statistics checks ---- */

static void test_block_stats_check_rejects_negative_figures_and_excess_nonfinite(void)
{
    static const struct {
        prism_block_stats s;
        prism_status want;
    } cases[] = {
        {{0, 1.0, 1.0, 0.0, 1.0, 10, 0, false, 0, 0}, PRISM_OK},
        {{0, 0.0, 0.0, 0.0, 0.0, 0, 0, false, 0, 0}, PRISM_OK},
        {{0, 1.0, 1.0, -3.5, 1.0, 10, 0, false, 0, 0}, PRISM_OK}, /* a mean may be negative */
        {{0, 1.0, 1.0, 0.0, 1.0, 10, 10, false, 0, 0}, PRISM_OK},
        {{0, -1.0, 1.0, 0.0, 1.0, 10, 0, false, 0, 0}, PRISM_ERR_INVALID},
        {{0, 1.0, -1.0, 0.0, 1.0, 10, 0, false, 0, 0}, PRISM_ERR_INVALID},
        {{0, 1.0, 1.0, 0.0, -0.5, 10, 0, false, 0, 0}, PRISM_ERR_INVALID},
        {{0, 1.0, 1.0, 0.0, 1.0, 10, 11, false, 0, 0}, PRISM_ERR_INVALID},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        prism_error err;
        CU_ASSERT_EQUAL(prism_block_stats_check(&cases[i].s, &err), cases[i].want);
    }
    /* NaN or Inf in l2_norm is allowed: the block is non-finite for that step. */
    prism_block_stats nan_norm = {0, NAN, 1.0, 0.0, 1.0, 10, 0, false, 0, 0};
    prism_block_stats inf_norm = {0, INFINITY, 1.0, 0.0, 1.0, 10, 0, false, 0, 0};
    prism_error err;
    CU_ASSERT_EQUAL(prism_block_stats_check(&nan_norm, &err), PRISM_OK);
    CU_ASSERT_EQUAL(prism_block_stats_check(&inf_norm, &err), PRISM_OK);
}

static void test_block_stats_finite_needs_no_nonfinite_and_a_finite_norm(void)
{
    static const struct {
        double l2;
        uint64_t nonfinite;
        bool want;
    } cases[] = {
        {1.0, 0, true}, {0.0, 0, true}, {1.0, 1, false}, {NAN, 0, false}, {INFINITY, 0, false}, {NAN, 3, false},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        prism_block_stats s = {0, cases[i].l2, 1.0, 0.0, 1.0, 10, cases[i].nonfinite, false, 0, 0};
        CU_ASSERT_EQUAL(prism_block_stats_finite(&s), cases[i].want);
    }
}

static void test_reason_names_match_design(void)
{
    CU_ASSERT_STRING_EQUAL(prism_reason_name(PRISM_REASON_NONE), "none");
    CU_ASSERT_STRING_EQUAL(prism_reason_name(PRISM_REASON_SCORE), "score");
    CU_ASSERT_STRING_EQUAL(prism_reason_name(PRISM_REASON_OVERRIDE), "override");
    CU_ASSERT_STRING_EQUAL(prism_reason_name(PRISM_REASON_MODE), "mode");
    CU_ASSERT_STRING_EQUAL(prism_reason_name(PRISM_REASON_NONFINITE), "nonfinite");
    CU_ASSERT_STRING_EQUAL(prism_reason_name(PRISM_REASON_LOSS_SPIKE), "loss_spike");
}

/* ---- creation, config and input checks ---- */

static void test_create_rejects_invalid_config(void)
{
    prism_config cfg = make_config(NULL, NULL);
    cfg.int8_threshold = 0.7; /* >= bf16_threshold 0.6 */
    prism_error err;
    CU_ASSERT_PTR_NULL(prism_policy_create(&cfg, &err));
    CU_ASSERT_PTR_NOT_NULL(strstr(err.message, "int8_threshold"));
    prism_config_free(&cfg);
}

static void test_set_config_rejects_invalid_config_and_keeps_the_old_one(void)
{
    prism_policy *p = make_policy(EXACT, NULL);
    prism_config cfg = make_config(EXACT, NULL);
    cfg.int8_threshold = 0.5; /* == bf16_threshold */
    prism_error err;
    CU_ASSERT_EQUAL(prism_policy_set_config(p, &cfg, &err), PRISM_ERR_INVALID);
    prism_config_free(&cfg);
    prism_step_result r;
    feed_pair(p, 1, 0.0, &r);
    CU_ASSERT_EQUAL(prism_policy_config(p)->int8_threshold, 0.25);
    CU_ASSERT_EQUAL(block(p, 0)->precision, PRISM_PRECISION_INT8);
    prism_policy_destroy(p);
}

static void test_add_step_rejects_bad_input_and_changes_nothing(void)
{
    prism_policy *p = make_policy(EXACT, "{\"warmup_steps\": 5}");
    prism_step_result r;
    feed_pair(p, 10, 0.5, &r);
    prism_error err;
    prism_block_stats dup[2] = {stats(3, 1.0), stats(3, 2.0)};
    CU_ASSERT_EQUAL(prism_policy_add_step(p, 11, NULL, dup, 2, &r, &err), PRISM_ERR_INVALID);
    prism_block_stats neg[2] = {stats(0, 1.0), stats(4, -1.0)};
    CU_ASSERT_EQUAL(prism_policy_add_step(p, 11, NULL, neg, 2, &r, &err), PRISM_ERR_INVALID);
    prism_block_stats bad_nonfinite[1] = {{5, 1.0, 1.0, 0.0, 1.0, 10, 11, false, 0, 0}};
    CU_ASSERT_EQUAL(prism_policy_add_step(p, 11, NULL, bad_nonfinite, 1, &r, &err), PRISM_ERR_INVALID);
    prism_block_stats ok[1] = {stats(6, 1.0)};
    CU_ASSERT_NOT_EQUAL(prism_policy_add_step(p, 10, NULL, ok, 1, &r, &err), PRISM_OK); /* not increasing */
    CU_ASSERT_NOT_EQUAL(prism_policy_add_step(p, 9, NULL, ok, 1, &r, &err), PRISM_OK);
    CU_ASSERT_EQUAL(prism_policy_steps_collected(p), 1);
    CU_ASSERT_EQUAL(prism_policy_block_count(p), 2);
    CU_ASSERT_PTR_NULL(prism_policy_find_block(p, 3));
    CU_ASSERT_PTR_NULL(prism_policy_find_block(p, 4));
    CU_ASSERT_PTR_NULL(prism_policy_find_block(p, 6));
    CU_ASSERT_EQUAL(prism_policy_map_version(p), 0);
    prism_policy_destroy(p);
}

static void test_blocks_are_listed_in_ascending_id_order(void)
{
    prism_policy *p = make_policy(EXACT, "{\"warmup_steps\": 5}");
    prism_block_stats blocks[3] = {stats(7, 1.0), stats(2, 1.0), stats(5, 1.0)};
    prism_step_result r;
    feed_blocks(p, 1, blocks, 3, &r);
    CU_ASSERT_EQUAL_FATAL(prism_policy_block_count(p), 3);
    CU_ASSERT_EQUAL(prism_policy_block(p, 0)->id, 2);
    CU_ASSERT_EQUAL(prism_policy_block(p, 1)->id, 5);
    CU_ASSERT_EQUAL(prism_policy_block(p, 2)->id, 7);
    CU_ASSERT_PTR_NULL(prism_policy_find_block(p, 3));
    prism_policy_destroy(p);
}

/* ---- decision steps ---- */

static void test_decision_steps_follow_warmup_then_update_interval(void)
{
    static const struct {
        const char *cfg;
        size_t steps;
        const char *decide; /* per collected step n = 1..steps: 'D' decision, '.' none */
    } cases[] = {
        {"{\"warmup_steps\": 10, \"update_interval_steps\": 10}", 31, ".........D.........D.........D."},
        {"{\"warmup_steps\": 3, \"update_interval_steps\": 4}", 12, "..D...D...D."},
        {"{\"warmup_steps\": 0, \"update_interval_steps\": 2}", 6, "D.D.D."},
        {"{\"warmup_steps\": 1, \"update_interval_steps\": 1}", 4, "DDDD"},
        {"{\"warmup_steps\": 2, \"update_interval_steps\": 3}", 9, ".D..D..D."},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        prism_policy *p = make_policy(EXACT, cases[i].cfg);
        for (size_t n = 1; n <= cases[i].steps; n++) {
            /* Step ids are spaced 7 apart: decisions count collected steps, not ids. */
            uint64_t step = 100 + 7 * n;
            prism_step_result r;
            feed_pair(p, step, 0.5, &r);
            bool want = cases[i].decide[n - 1] == 'D';
            if (r.decided != want)
                fprintf(stderr, "case %zu: n=%zu decided=%d want %d\n", i, n, r.decided, want);
            CU_ASSERT_EQUAL(r.decided, want);
            if (want) {
                CU_ASSERT_EQUAL(r.decided_step, step);
                CU_ASSERT_EQUAL(r.summary.step_id, step);
            }
            CU_ASSERT_EQUAL(prism_policy_steps_collected(p), n);
        }
        prism_policy_destroy(p);
    }
}

static void test_no_score_before_the_first_decision(void)
{
    prism_policy *p = make_policy(EXACT, "{\"warmup_steps\": 3}");
    prism_step_result r;
    feed_pair(p, 1, 0.0, &r);
    feed_pair(p, 2, 0.0, &r);
    CU_ASSERT_FALSE(r.decided);
    CU_ASSERT_EQUAL(block(p, 0)->precision, PRISM_PRECISION_BF16);
    CU_ASSERT_EQUAL(block(p, 0)->reason, PRISM_REASON_NONE);
    CU_ASSERT_FALSE(block(p, 0)->has_switch);
    feed_pair(p, 3, 0.0, &r);
    CU_ASSERT_TRUE(r.decided);
    CU_ASSERT_EQUAL(block(p, 0)->precision, PRISM_PRECISION_INT8);
    prism_policy_destroy(p);
}

/* ---- first assignment ---- */

static void test_first_assignment_uses_thresholds_and_ambiguous_default(void)
{
    static const struct {
        double s;
        const char *ambiguous;
        prism_precision want;
    } cases[] = {
        {0.75, "bf16", PRISM_PRECISION_BF16},
        {0.5, "bf16", PRISM_PRECISION_BF16},          /* exactly at bf16_threshold */
        {0.5, "int8", PRISM_PRECISION_BF16},
        {0.4990234375, "bf16", PRISM_PRECISION_BF16}, /* just below bf16_threshold: ambiguous */
        {0.4990234375, "int8", PRISM_PRECISION_INT8},
        {0.375, "bf16", PRISM_PRECISION_BF16},
        {0.375, "int8", PRISM_PRECISION_INT8},
        {0.375, "low", PRISM_PRECISION_INT8},
        {0.25, "bf16", PRISM_PRECISION_BF16},         /* exactly at int8_threshold: ambiguous */
        {0.25, "int8", PRISM_PRECISION_INT8},
        {0.2490234375, "bf16", PRISM_PRECISION_INT8}, /* just below int8_threshold */
        {0.2490234375, "int8", PRISM_PRECISION_INT8},
        {0.0, "bf16", PRISM_PRECISION_INT8},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char extra[128];
        snprintf(extra, sizeof extra, "{\"ambiguous_default\": \"%s\", \"min_steps_between_switches\": 50}",
                 cases[i].ambiguous);
        prism_policy *p = make_policy(EXACT, extra);
        prism_step_result r;
        feed_pair(p, 40, cases[i].s, &r);
        CU_ASSERT_TRUE_FATAL(r.decided);
        const prism_block_view *v = block(p, 0);
        CU_ASSERT_TRUE(v->has_score);
        CU_ASSERT_EQUAL(v->sensitivity, cases[i].s);
        CU_ASSERT_EQUAL(v->grad_score, cases[i].s);
        CU_ASSERT_EQUAL(v->relative_magnitude, 2 * cases[i].s);
        CU_ASSERT_FALSE(v->has_error_score);
        if (v->precision != cases[i].want)
            fprintf(stderr, "case %zu: s=%.17g got %s\n", i, cases[i].s, prism_precision_name(v->precision));
        CU_ASSERT_EQUAL(v->precision, cases[i].want);
        if (cases[i].want == PRISM_PRECISION_INT8) {
            /* No cooldown applies to a first assignment, even with min_steps 50. */
            assert_change(&r, 0, PRISM_PRECISION_BF16, PRISM_PRECISION_INT8, 40, PRISM_REASON_SCORE);
            CU_ASSERT_EQUAL(v->reason, PRISM_REASON_SCORE);
            CU_ASSERT_TRUE(v->has_switch);
            CU_ASSERT_EQUAL(v->last_switch_step, 40);
        } else {
            CU_ASSERT_PTR_NULL(find_change(&r, 0));
            CU_ASSERT_EQUAL(v->reason, PRISM_REASON_NONE);
            CU_ASSERT_FALSE(v->has_switch);
        }
        prism_policy_destroy(p);
    }
}

static void test_first_assignment_with_design_default_thresholds(void)
{
    /* Defaults: bf16 0.6, int8 0.3, ambiguous bf16; grad_sensitivity_threshold 2. */
    static const struct {
        double a;
        prism_precision want;
    } cases[] = {
        {0.75, PRISM_PRECISION_BF16},
        {0.625, PRISM_PRECISION_BF16},
        {0.5, PRISM_PRECISION_BF16}, /* ambiguous, default bf16 */
        {0.3125, PRISM_PRECISION_BF16},
        {0.28125, PRISM_PRECISION_INT8},
        {0.125, PRISM_PRECISION_INT8},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        prism_policy *p = make_policy("{\"warmup_steps\": 1}", NULL);
        prism_step_result r;
        feed_pair(p, 1, cases[i].a, &r);
        CU_ASSERT_TRUE_FATAL(r.decided);
        CU_ASSERT_EQUAL(block(p, 0)->sensitivity, cases[i].a);
        CU_ASSERT_EQUAL(block(p, 0)->precision, cases[i].want);
        prism_policy_destroy(p);
    }
}

static void test_ambiguous_default_low_means_configured_low_precision(void)
{
    prism_policy *p = make_policy(EXACT, "{\"ambiguous_default\": \"low\", \"low_precision\": \"fp8_e4m3\"}");
    prism_step_result r;
    feed_pair(p, 1, 0.375, &r);
    CU_ASSERT_EQUAL(block(p, 0)->precision, PRISM_PRECISION_FP8_E4M3);
    assert_change(&r, 0, PRISM_PRECISION_BF16, PRISM_PRECISION_FP8_E4M3, 1, PRISM_REASON_SCORE);
    prism_policy_destroy(p);
}

/* ---- hysteresis ---- */

static void test_hysteresis_keeps_bf16_until_below_int8_threshold_minus_margin(void)
{
    /* int8_threshold - hysteresis_margin = 0.25 - 0.125 = 0.125. */
    static const struct {
        double s;
        prism_precision want;
    } cases[] = {
        {0.375, PRISM_PRECISION_BF16},
        {0.2490234375, PRISM_PRECISION_BF16}, /* below int8_threshold, a fresh block would go low */
        {0.1875, PRISM_PRECISION_BF16},
        {0.125, PRISM_PRECISION_BF16},        /* exactly at the margin: not below */
        {0.1240234375, PRISM_PRECISION_INT8},
        {0.0, PRISM_PRECISION_INT8},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        prism_policy *p = make_policy(EXACT, NULL);
        prism_step_result r;
        feed_pair(p, 1, 0.75, &r);
        CU_ASSERT_EQUAL_FATAL(block(p, 0)->precision, PRISM_PRECISION_BF16);
        feed_pair(p, 2, cases[i].s, &r);
        CU_ASSERT_TRUE_FATAL(r.decided);
        CU_ASSERT_EQUAL(block(p, 0)->sensitivity, cases[i].s);
        if (block(p, 0)->precision != cases[i].want)
            fprintf(stderr, "case %zu: s=%.17g\n", i, cases[i].s);
        CU_ASSERT_EQUAL(block(p, 0)->precision, cases[i].want);
        if (cases[i].want == PRISM_PRECISION_INT8)
            assert_change(&r, 0, PRISM_PRECISION_BF16, PRISM_PRECISION_INT8, 2, PRISM_REASON_SCORE);
        else
            CU_ASSERT_PTR_NULL(find_change(&r, 0));
        prism_policy_destroy(p);
    }
}

static void test_hysteresis_keeps_int8_in_ambiguous_zone(void)
{
    static const struct {
        double s;
        prism_precision want;
    } cases[] = {
        {0.1875, PRISM_PRECISION_INT8},
        {0.25, PRISM_PRECISION_INT8},
        {0.375, PRISM_PRECISION_INT8},
        {0.4990234375, PRISM_PRECISION_INT8}, /* just below bf16_threshold */
        {0.5, PRISM_PRECISION_BF16},          /* at bf16_threshold */
        {0.75, PRISM_PRECISION_BF16},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        /* ambiguous_default bf16: a fresh block would go bf16 in the ambiguous zone. */
        prism_policy *p = make_policy(EXACT, NULL);
        prism_step_result r;
        feed_pair(p, 1, 0.0, &r);
        CU_ASSERT_EQUAL_FATAL(block(p, 0)->precision, PRISM_PRECISION_INT8);
        feed_pair(p, 2, cases[i].s, &r);
        CU_ASSERT_TRUE_FATAL(r.decided);
        if (block(p, 0)->precision != cases[i].want)
            fprintf(stderr, "case %zu: s=%.17g\n", i, cases[i].s);
        CU_ASSERT_EQUAL(block(p, 0)->precision, cases[i].want);
        if (cases[i].want == PRISM_PRECISION_BF16) {
            assert_change(&r, 0, PRISM_PRECISION_INT8, PRISM_PRECISION_BF16, 2, PRISM_REASON_SCORE);
            CU_ASSERT_EQUAL(block(p, 0)->last_switch_step, 2);
        } else {
            CU_ASSERT_PTR_NULL(find_change(&r, 0));
            CU_ASSERT_EQUAL(block(p, 0)->last_switch_step, 1);
        }
        prism_policy_destroy(p);
    }
}

/* ---- cooldown ---- */

static void test_cooldown_counts_step_ids_not_collected_steps(void)
{
    prism_policy *p = make_policy(EXACT, "{\"min_steps_between_switches\": 10}");
    static const struct {
        uint64_t step;
        double s;
        prism_precision want;
        uint64_t last_switch;
    } seq[] = {
        {100, 0.0, PRISM_PRECISION_INT8, 100}, /* first assignment: no cooldown */
        {105, 0.75, PRISM_PRECISION_INT8, 100}, /* 105 - 100 = 5 < 10: kept */
        {109, 0.75, PRISM_PRECISION_INT8, 100}, /* 9 < 10: kept */
        {110, 0.75, PRISM_PRECISION_BF16, 110}, /* 10: the third step after, by id */
        {115, 0.0, PRISM_PRECISION_BF16, 110},
        {119, 0.0, PRISM_PRECISION_BF16, 110},
        {120, 0.0, PRISM_PRECISION_INT8, 120},
    };
    for (size_t i = 0; i < sizeof seq / sizeof seq[0]; i++) {
        prism_step_result r;
        feed_pair(p, seq[i].step, seq[i].s, &r);
        CU_ASSERT_TRUE(r.decided);
        const prism_block_view *v = block(p, 0);
        if (v->precision != seq[i].want)
            fprintf(stderr, "step %llu: got %s\n", (unsigned long long)seq[i].step,
                    prism_precision_name(v->precision));
        CU_ASSERT_EQUAL(v->precision, seq[i].want);
        CU_ASSERT_TRUE(v->has_switch);
        CU_ASSERT_EQUAL(v->last_switch_step, seq[i].last_switch);
        CU_ASSERT_EQUAL(v->reason, PRISM_REASON_SCORE);
        /* Block 1 (s = 1 - a) stays bf16 throughout: only block 0 ever changes. */
        CU_ASSERT_EQUAL(r.change_count, seq[i].last_switch == seq[i].step ? 1u : 0u);
    }
    prism_policy_destroy(p);
}

static void test_cooldown_blocks_a_change_back_by_score(void)
{
    /* Only block 0 is checked here: a switch at step 1, then a score that wants it back. */
    prism_policy *p = make_policy(EXACT, "{\"min_steps_between_switches\": 3}");
    prism_step_result r;
    feed_pair(p, 1, 0.0, &r); /* int8 at 1 */
    feed_pair(p, 2, 0.75, &r);
    CU_ASSERT_EQUAL(block(p, 0)->precision, PRISM_PRECISION_INT8);
    CU_ASSERT_PTR_NULL(find_change(&r, 0));
    feed_pair(p, 3, 0.75, &r);
    CU_ASSERT_EQUAL(block(p, 0)->precision, PRISM_PRECISION_INT8);
    feed_pair(p, 4, 0.75, &r);
    CU_ASSERT_EQUAL(block(p, 0)->precision, PRISM_PRECISION_BF16);
    assert_change(&r, 0, PRISM_PRECISION_INT8, PRISM_PRECISION_BF16, 4, PRISM_REASON_SCORE);
    prism_policy_destroy(p);
}

/* DESIGN 4.2: no cooldown applies to a fresh assignment, even when an override switched the
 * block a few steps before; cooldown counts again from the fresh assignment's change. */
static void test_fresh_assignment_after_removed_override_ignores_cooldown(void)
{
    prism_policy *p = make_policy(EXACT, "{\"min_steps_between_switches\": 10, \"force_int8_blocks\": [0]}");
    prism_step_result r;
    feed_pair(p, 100, 0.375, &r);
    CU_ASSERT_EQUAL(block(p, 0)->precision, PRISM_PRECISION_INT8);
    CU_ASSERT_EQUAL(block(p, 0)->last_switch_step, 100);
    set_config(p, EXACT, "{\"min_steps_between_switches\": 10}");
    /* Never placed by its score: 0.375 is ambiguous, so ambiguous_default bf16, at once
     * (105 - 100 < 10, but no cooldown applies to a fresh assignment). */
    feed_pair(p, 105, 0.375, &r);
    CU_ASSERT_EQUAL(block(p, 0)->precision, PRISM_PRECISION_BF16);
    CU_ASSERT_FALSE(block(p, 0)->forced);
    assert_change(&r, 0, PRISM_PRECISION_INT8, PRISM_PRECISION_BF16, 105, PRISM_REASON_SCORE);
    /* Now assigned: a score of 0 wants int8, but 108 - 105 < 10 keeps bf16 ... */
    feed_pair(p, 108, 0.0, &r);
    CU_ASSERT_EQUAL(block(p, 0)->precision, PRISM_PRECISION_BF16);
    CU_ASSERT_PTR_NULL(find_change(&r, 0));
    /* ... until 115 - 105 = 10. */
    feed_pair(p, 115, 0.0, &r);
    CU_ASSERT_EQUAL(block(p, 0)->precision, PRISM_PRECISION_INT8);
    assert_change(&r, 0, PRISM_PRECISION_BF16, PRISM_PRECISION_INT8, 115, PRISM_REASON_SCORE);
    prism_policy_destroy(p);
}

/* ---- window and scores ---- */

static void test_window_drops_values_older_than_history_window(void)
{
    prism_policy *p = make_policy(EXACT, "{\"history_window\": 2}");
    /* block 0 rel per step = 2a: 1.0, 0.5, 0.0, 1.5, 1.5 */
    static const struct {
        double a;
        double rm;
    } seq[] = {{0.5, 1.0}, {0.25, 0.75}, {0.0, 0.25}, {0.75, 0.75}, {0.75, 1.5}};
    for (size_t i = 0; i < sizeof seq / sizeof seq[0]; i++) {
        prism_step_result r;
        feed_pair(p, i + 1, seq[i].a, &r);
        const prism_block_view *v = block(p, 0);
        CU_ASSERT_TRUE(v->has_score);
        CU_ASSERT_EQUAL(v->relative_magnitude, seq[i].rm);
        CU_ASSERT_EQUAL(v->grad_score, seq[i].rm / 2);
        CU_ASSERT_EQUAL(v->sensitivity, seq[i].rm / 2);
        /* block 1: rel = 2 (1 - a) */
        double rm1 = i == 0 ? 2 * (1 - seq[0].a) : (2 * (1 - seq[i - 1].a) + 2 * (1 - seq[i].a)) / 2;
        CU_ASSERT_EQUAL(block(p, 1)->relative_magnitude, rm1);
    }
    prism_policy_destroy(p);
}

static void test_window_mean_at_first_decision_covers_last_history_window_steps(void)
{
    prism_policy *p = make_policy(EXACT, "{\"history_window\": 3, \"warmup_steps\": 5}");
    /* rel of block 0: 1, 1, 0.25, 0.5, 0.75; the last three average 0.5 (all five: 0.7). */
    static const double a[] = {0.5, 0.5, 0.125, 0.25, 0.375};
    prism_step_result r;
    for (size_t i = 0; i < 5; i++)
        feed_pair(p, i + 1, a[i], &r);
    CU_ASSERT_TRUE(r.decided);
    CU_ASSERT_EQUAL(block(p, 0)->relative_magnitude, 0.5);
    CU_ASSERT_EQUAL(block(p, 0)->grad_score, 0.25);
    CU_ASSERT_EQUAL(block(p, 0)->precision, PRISM_PRECISION_BF16); /* 0.25: ambiguous, default bf16 */
    /* block 1: rel 1, 1, 1.75, 1.5, 1.25 -> last three 1.5 -> grad_score 0.75 */
    CU_ASSERT_EQUAL(block(p, 1)->relative_magnitude, 1.5);
    CU_ASSERT_EQUAL(block(p, 1)->grad_score, 0.75);
    prism_policy_destroy(p);
}

static void test_shorter_history_window_keeps_the_newest_values(void)
{
    prism_policy *p = make_policy(EXACT, "{\"history_window\": 3}");
    prism_step_result r;
    feed_pair(p, 1, 0.5, &r);  /* rel 1 */
    feed_pair(p, 2, 0.25, &r); /* rel 0.5 */
    feed_pair(p, 3, 0.0, &r);  /* rel 0 */
    CU_ASSERT_EQUAL(block(p, 0)->relative_magnitude, 0.5);
    set_config(p, EXACT, "{\"history_window\": 2}");
    feed_pair(p, 4, 0.75, &r); /* rel 1.5; window of 2: {0, 1.5} */
    CU_ASSERT_TRUE(r.decided);
    CU_ASSERT_EQUAL(block(p, 0)->relative_magnitude, 0.75);
    feed_pair(p, 5, 0.5, &r); /* {1.5, 1} */
    CU_ASSERT_EQUAL(block(p, 0)->relative_magnitude, 1.25);
    prism_policy_destroy(p);
}

static void test_rel_divides_by_mean_norm_of_the_step(void)
{
    prism_policy *p = make_policy(EXACT, NULL);
    /* l2 1, 1, 1, 5: mean 2, rel 0.5, 0.5, 0.5, 2.5 */
    double l2[4] = {1.0, 1.0, 1.0, 5.0};
    prism_step_result r;
    feed(p, 1, l2, 4, &r);
    CU_ASSERT_EQUAL(block(p, 0)->relative_magnitude, 0.5);
    CU_ASSERT_EQUAL(block(p, 0)->grad_score, 0.25);
    CU_ASSERT_EQUAL(block(p, 3)->relative_magnitude, 2.5);
    CU_ASSERT_EQUAL(block(p, 3)->grad_score, 1.0);
    prism_policy_destroy(p);
}

static void test_grad_score_caps_at_one_but_relative_magnitude_does_not(void)
{
    prism_policy *p = make_policy(EXACT, NULL);
    double l2[3] = {3.0, 0.0, 0.0}; /* mean 1: rel 3, 0, 0 */
    prism_step_result r;
    feed(p, 1, l2, 3, &r);
    CU_ASSERT_EQUAL(block(p, 0)->relative_magnitude, 3.0);
    CU_ASSERT_EQUAL(block(p, 0)->grad_score, 1.0);
    CU_ASSERT_EQUAL(block(p, 0)->sensitivity, 1.0);
    CU_ASSERT_EQUAL(block(p, 0)->precision, PRISM_PRECISION_BF16);
    CU_ASSERT_EQUAL(block(p, 1)->sensitivity, 0.0);
    prism_policy_destroy(p);
}

static void test_all_zero_norms_give_zero_rel_and_zero_score(void)
{
    prism_policy *p = make_policy(EXACT, "{\"history_window\": 2}");
    double l2[3] = {0.0, 0.0, 0.0};
    prism_step_result r;
    feed(p, 1, l2, 3, &r);
    feed(p, 2, l2, 3, &r);
    for (uint32_t id = 0; id < 3; id++) {
        const prism_block_view *v = block(p, id);
        CU_ASSERT_TRUE(v->has_score);
        CU_ASSERT_EQUAL(v->relative_magnitude, 0.0);
        CU_ASSERT_EQUAL(v->grad_score, 0.0);
        CU_ASSERT_EQUAL(v->sensitivity, 0.0);
        CU_ASSERT_EQUAL(v->precision, PRISM_PRECISION_INT8);
        CU_ASSERT_FALSE(isnan(v->sensitivity));
    }
    prism_policy_destroy(p);
}

static void test_calibration_error_weights_the_score(void)
{
    /* Defaults: grad_weight 0.7, error_weight 0.3, quant_error_threshold 0.05. */
    prism_policy *p = make_policy(EXACT, NULL);
    prism_error err;
    CU_ASSERT_EQUAL(prism_policy_set_calibration(p, PRISM_PRECISION_INT8, 0, 0.025, &err), PRISM_OK);
    prism_step_result r;
    feed_pair(p, 1, 0.5, &r); /* grad_score 0.5 */
    const prism_block_view *v = block(p, 0);
    CU_ASSERT_EQUAL(v->grad_score, 0.5);
    CU_ASSERT_TRUE(v->has_error_score);
    CU_ASSERT_DOUBLE_EQUAL(v->error_score, 0.5, 1e-12);
    double grad_weight = 0.7, error_weight = 0.3;
    CU_ASSERT_DOUBLE_EQUAL(v->sensitivity, grad_weight * 0.5 + error_weight * 0.5, 1e-12);
    CU_ASSERT_FALSE(block(p, 1)->has_error_score);
    CU_ASSERT_EQUAL(block(p, 1)->sensitivity, 0.5);
    prism_policy_destroy(p);
}

static void test_calibration_error_can_move_a_block_to_bf16(void)
{
    /* grad_score 0.125 alone gives int8; with e = 0.1 (error_score min(2, 1) = 1) and weights
     * 0.5/0.5: s = 0.0625 + 0.5 = 0.5625 -> bf16. */
    static const struct {
        bool calibrated;
        double s;
        prism_precision want;
    } cases[] = {{false, 0.125, PRISM_PRECISION_INT8}, {true, 0.5625, PRISM_PRECISION_BF16}};
    for (size_t i = 0; i < 2; i++) {
        prism_policy *p = make_policy(EXACT, "{\"grad_weight\": 0.5, \"error_weight\": 0.5}");
        prism_error err;
        if (cases[i].calibrated)
            CU_ASSERT_EQUAL(prism_policy_set_calibration(p, PRISM_PRECISION_INT8, 0, 0.1, &err), PRISM_OK);
        prism_step_result r;
        feed_pair(p, 1, 0.125, &r);
        const prism_block_view *v = block(p, 0);
        CU_ASSERT_EQUAL(v->has_error_score, cases[i].calibrated);
        if (cases[i].calibrated)
            CU_ASSERT_EQUAL(v->error_score, 1.0);
        CU_ASSERT_EQUAL(v->grad_score, 0.125);
        CU_ASSERT_EQUAL(v->sensitivity, cases[i].s);
        CU_ASSERT_EQUAL(v->precision, cases[i].want);
        prism_policy_destroy(p);
    }
}

static void test_calibration_for_another_format_than_low_precision_is_ignored(void)
{
    prism_policy *p = make_policy(EXACT, "{\"grad_weight\": 0.5, \"error_weight\": 0.5}");
    prism_error err;
    CU_ASSERT_EQUAL(prism_policy_set_calibration(p, PRISM_PRECISION_FP8_E4M3, 0, 0.1, &err), PRISM_OK);
    CU_ASSERT_EQUAL(prism_policy_set_calibration(p, PRISM_PRECISION_INT4, 0, 0.1, &err), PRISM_OK);
    prism_step_result r;
    feed_pair(p, 1, 0.125, &r);
    const prism_block_view *v = block(p, 0);
    CU_ASSERT_FALSE(v->has_error_score);
    CU_ASSERT_EQUAL(v->sensitivity, 0.125);
    CU_ASSERT_EQUAL(v->precision, PRISM_PRECISION_INT8);
    prism_policy_destroy(p);
}

static void test_score_is_clamped_to_one(void)
{
    /* grad_score 0.75, error_score 1, both weights 1: 1.75 clamps to 1. */
    prism_policy *p = make_policy(EXACT, "{\"grad_weight\": 1.0, \"error_weight\": 1.0}");
    prism_error err;
    CU_ASSERT_EQUAL(prism_policy_set_calibration(p, PRISM_PRECISION_INT8, 0, 0.2, &err), PRISM_OK);
    prism_step_result r;
    feed_pair(p, 1, 0.75, &r);
    CU_ASSERT_EQUAL(block(p, 0)->grad_score, 0.75);
    CU_ASSERT_EQUAL(block(p, 0)->error_score, 1.0);
    CU_ASSERT_EQUAL(block(p, 0)->sensitivity, 1.0);
    prism_policy_destroy(p);
}

static void test_low_format_change_moves_low_blocks_with_reason_mode(void)
{
    /* After the switch to fp8_e4m3 the fp8 calibration applies: error_score 0.0125/0.05 = 0.25,
     * s = 0.5*0.125 + 0.5*0.25 = 0.1875: still low. */
    prism_policy *p = make_policy(EXACT, "{\"grad_weight\": 0.5, \"error_weight\": 0.5}");
    prism_error err;
    CU_ASSERT_EQUAL(prism_policy_set_calibration(p, PRISM_PRECISION_FP8_E4M3, 0, 0.0125, &err), PRISM_OK);
    prism_step_result r;
    feed_pair(p, 1, 0.125, &r);
    CU_ASSERT_EQUAL(block(p, 0)->precision, PRISM_PRECISION_INT8);
    CU_ASSERT_FALSE(block(p, 0)->has_error_score);
    set_config(p, EXACT, "{\"grad_weight\": 0.5, \"error_weight\": 0.5, \"low_precision\": \"fp8_e4m3\"}");
    feed_pair(p, 2, 0.125, &r);
    CU_ASSERT_TRUE(r.decided);
    CU_ASSERT_EQUAL(block(p, 0)->precision, PRISM_PRECISION_FP8_E4M3);
    CU_ASSERT_EQUAL(block(p, 0)->reason, PRISM_REASON_MODE);
    assert_change(&r, 0, PRISM_PRECISION_INT8, PRISM_PRECISION_FP8_E4M3, 2, PRISM_REASON_MODE);
    CU_ASSERT_TRUE(block(p, 0)->has_error_score);
    CU_ASSERT_EQUAL(block(p, 0)->error_score, 0.25);
    CU_ASSERT_EQUAL(block(p, 0)->sensitivity, 0.1875);
    CU_ASSERT_EQUAL(block(p, 1)->precision, PRISM_PRECISION_BF16);
    CU_ASSERT_PTR_NULL(find_change(&r, 1));
    CU_ASSERT_EQUAL(r.summary.low_precision, PRISM_PRECISION_FP8_E4M3);
    CU_ASSERT_EQUAL(r.summary.blocks_low, 1);
    prism_policy_destroy(p);
}

/* ---- non-finite ---- */

static void test_nonfinite_block_goes_bf16_despite_cooldown(void)
{
    prism_policy *p = make_policy(EXACT, "{\"min_steps_between_switches\": 100}");
    prism_step_result r;
    feed_pair(p, 1, 0.0, &r);
    CU_ASSERT_EQUAL_FATAL(block(p, 0)->precision, PRISM_PRECISION_INT8);
    prism_block_stats blocks[2] = {stats(0, 0.0), stats(1, 1.0)};
    blocks[0].nonfinite = 3;
    feed_blocks(p, 2, blocks, 2, &r);
    CU_ASSERT_TRUE(r.decided);
    CU_ASSERT_EQUAL(block(p, 0)->precision, PRISM_PRECISION_BF16);
    CU_ASSERT_EQUAL(block(p, 0)->reason, PRISM_REASON_NONFINITE);
    CU_ASSERT_EQUAL(block(p, 0)->last_switch_step, 2);
    assert_change(&r, 0, PRISM_PRECISION_INT8, PRISM_PRECISION_BF16, 2, PRISM_REASON_NONFINITE);
    prism_policy_destroy(p);
}

static void test_nonfinite_steps_never_enter_window_and_mean_excludes_them(void)
{
    prism_policy *p = make_policy(EXACT, "{\"history_window\": 2}");
    prism_step_result r;
    double l2[3] = {0.0, 1.0, 2.0}; /* mean 1: rel 0, 1, 2 */
    feed(p, 1, l2, 3, &r);
    /* Step 2: block 0 has non-finite elements (its finite l2 100 must not count anywhere);
     * mean over blocks 1, 2 is 2: rel 0.5, 1.5. */
    prism_block_stats blocks[3] = {stats(0, 100.0), stats(1, 1.0), stats(2, 3.0)};
    blocks[0].nonfinite = 1;
    feed_blocks(p, 2, blocks, 3, &r);
    CU_ASSERT_EQUAL(block(p, 0)->relative_magnitude, 0.0);
    CU_ASSERT_EQUAL(block(p, 1)->relative_magnitude, 0.75);
    CU_ASSERT_EQUAL(block(p, 2)->relative_magnitude, 1.75);
    /* Step 3: block 0's norm is NaN, same rule. l2 of 1, 2: 3, 1 -> mean 2 -> rel 1.5, 0.5 */
    prism_block_stats blocks3[3] = {stats(0, NAN), stats(1, 3.0), stats(2, 1.0)};
    feed_blocks(p, 3, blocks3, 3, &r);
    CU_ASSERT_EQUAL(block(p, 0)->relative_magnitude, 0.0);
    CU_ASSERT_EQUAL(block(p, 1)->relative_magnitude, 1.0);
    CU_ASSERT_EQUAL(block(p, 2)->relative_magnitude, 1.0);
    /* Step 4: Inf norm. Blocks 1, 2: 1, 1 -> rel 1, 1. */
    prism_block_stats blocks4[3] = {stats(0, INFINITY), stats(1, 1.0), stats(2, 1.0)};
    feed_blocks(p, 4, blocks4, 3, &r);
    CU_ASSERT_EQUAL(block(p, 0)->relative_magnitude, 0.0); /* still step 1's value only */
    CU_ASSERT_TRUE(block(p, 0)->has_score);
    CU_ASSERT_EQUAL(block(p, 1)->relative_magnitude, 1.25);
    CU_ASSERT_EQUAL(block(p, 2)->relative_magnitude, 0.75);
    /* Step 5: block 0 finite again with rel 0.5 (l2 0.5, 1, 1.5: mean 1). */
    double l2_5[3] = {0.5, 1.0, 1.5};
    feed(p, 5, l2_5, 3, &r);
    CU_ASSERT_EQUAL(block(p, 0)->relative_magnitude, 0.25); /* (0 + 0.5) / 2 */
    prism_policy_destroy(p);
}

static void test_nonfinite_flag_clears_at_every_decision(void)
{
    prism_policy *p = make_policy(EXACT, NULL);
    prism_step_result r;
    feed_pair(p, 1, 0.0, &r);
    CU_ASSERT_EQUAL_FATAL(block(p, 0)->precision, PRISM_PRECISION_INT8);
    prism_block_stats blocks[2] = {stats(0, 0.0), stats(1, 1.0)};
    blocks[0].nonfinite = 1;
    feed_blocks(p, 2, blocks, 2, &r);
    CU_ASSERT_EQUAL(block(p, 0)->precision, PRISM_PRECISION_BF16);
    /* Finite again with s = 0 < 0.125: the score takes it back to int8 at the next decision. */
    feed_pair(p, 3, 0.0, &r);
    CU_ASSERT_EQUAL(block(p, 0)->precision, PRISM_PRECISION_INT8);
    assert_change(&r, 0, PRISM_PRECISION_BF16, PRISM_PRECISION_INT8, 3, PRISM_REASON_SCORE);
    prism_policy_destroy(p);
}

static void test_nonfinite_between_decisions_acts_at_next_decision(void)
{
    prism_policy *p = make_policy(EXACT, "{\"update_interval_steps\": 3, \"history_window\": 5}");
    prism_step_result r;
    feed_pair(p, 1, 0.0, &r); /* decision n = 1 */
    CU_ASSERT_EQUAL_FATAL(block(p, 0)->precision, PRISM_PRECISION_INT8);
    prism_block_stats blocks[2] = {stats(0, 0.0), stats(1, 1.0)};
    blocks[0].nonfinite = 2;
    feed_blocks(p, 2, blocks, 2, &r); /* n = 2 */
    CU_ASSERT_FALSE(r.decided);
    CU_ASSERT_EQUAL(block(p, 0)->precision, PRISM_PRECISION_INT8);
    feed_pair(p, 3, 0.0, &r);
    feed_pair(p, 4, 0.0, &r); /* decision n = 4 */
    CU_ASSERT_TRUE(r.decided);
    CU_ASSERT_EQUAL(block(p, 0)->precision, PRISM_PRECISION_BF16);
    assert_change(&r, 0, PRISM_PRECISION_INT8, PRISM_PRECISION_BF16, 4, PRISM_REASON_NONFINITE);
    /* The window holds steps 1, 3, 4 only, all rel 0. */
    CU_ASSERT_EQUAL(block(p, 0)->relative_magnitude, 0.0);
    prism_policy_destroy(p);
}

static void test_block_with_empty_window_keeps_precision_and_has_no_score(void)
{
    prism_policy *p = make_policy(EXACT, NULL);
    prism_step_result r;
    prism_block_stats blocks[3] = {stats(0, 0.5), stats(1, 0.5), stats(5, INFINITY)};
    feed_blocks(p, 1, blocks, 3, &r);
    CU_ASSERT_TRUE(r.decided);
    const prism_block_view *v = block(p, 5);
    CU_ASSERT_FALSE(v->has_score);
    CU_ASSERT_EQUAL(v->precision, PRISM_PRECISION_BF16);
    CU_ASSERT_EQUAL(r.summary.scored, 2);
    /* Step 2 without block 5: its window is still empty; it keeps bf16. */
    feed_pair(p, 2, 0.5, &r);
    CU_ASSERT_FALSE(block(p, 5)->has_score);
    CU_ASSERT_EQUAL(block(p, 5)->precision, PRISM_PRECISION_BF16);
    CU_ASSERT_EQUAL(r.summary.scored, 2);
    CU_ASSERT_EQUAL(r.summary.blocks_bf16, 3);
    prism_policy_destroy(p);
}

/* ---- blocks that appear late ---- */

static void test_block_first_seen_after_first_decision_is_assigned_fresh(void)
{
    prism_policy *p = make_policy(EXACT, "{\"warmup_steps\": 2, \"update_interval_steps\": 2,"
                                         " \"history_window\": 2, \"min_steps_between_switches\": 100}");
    prism_step_result r;
    feed_pair(p, 1, 0.5, &r);
    feed_pair(p, 2, 0.5, &r);
    CU_ASSERT_TRUE(r.decided);
    /* Block 2 appears at step 3: l2 2, 0.75, 0.25 -> mean 1 -> block 2 rel 0.25, grad_score 0.125:
     * fresh -> int8 (hysteresis from bf16 would keep it, 0.125 is not below 0.125). */
    double l2[3] = {2.0, 0.75, 0.25};
    feed(p, 3, l2, 3, &r);
    CU_ASSERT_FALSE(r.decided);
    CU_ASSERT_EQUAL(block(p, 2)->precision, PRISM_PRECISION_BF16);
    CU_ASSERT_EQUAL(block(p, 2)->reason, PRISM_REASON_NONE);
    CU_ASSERT_FALSE(block(p, 2)->has_switch);
    CU_ASSERT_EQUAL(r.change_count, 0);
    feed(p, 4, l2, 3, &r);
    CU_ASSERT_TRUE(r.decided);
    CU_ASSERT_EQUAL(block(p, 2)->sensitivity, 0.125);
    CU_ASSERT_EQUAL(block(p, 2)->precision, PRISM_PRECISION_INT8);
    assert_change(&r, 2, PRISM_PRECISION_BF16, PRISM_PRECISION_INT8, 4, PRISM_REASON_SCORE);
    prism_policy_destroy(p);
}

/* ---- overrides ---- */

static void test_first_report_of_forced_block_is_an_override_change(void)
{
    prism_policy *p = make_policy(EXACT, "{\"warmup_steps\": 5, \"force_int8_blocks\": [3],"
                                         " \"force_bf16_blocks\": [4]}");
    prism_block_stats blocks[3] = {stats(3, 1.0), stats(4, 1.0), stats(5, 1.0)};
    prism_step_result r;
    feed_blocks(p, 7, blocks, 3, &r);
    CU_ASSERT_FALSE(r.decided);
    CU_ASSERT_TRUE(r.map_changed);
    CU_ASSERT_EQUAL(r.map_version, 1);
    CU_ASSERT_EQUAL(prism_policy_map_version(p), 1);
    CU_ASSERT_EQUAL(r.change_count, 1);
    assert_change(&r, 3, PRISM_PRECISION_BF16, PRISM_PRECISION_INT8, 7, PRISM_REASON_OVERRIDE);
    const prism_block_view *v = block(p, 3);
    CU_ASSERT_EQUAL(v->precision, PRISM_PRECISION_INT8);
    CU_ASSERT_EQUAL(v->reason, PRISM_REASON_OVERRIDE);
    CU_ASSERT_TRUE(v->has_switch);
    CU_ASSERT_EQUAL(v->last_switch_step, 7);
    CU_ASSERT_TRUE(v->forced);
    v = block(p, 4);
    CU_ASSERT_EQUAL(v->precision, PRISM_PRECISION_BF16);
    CU_ASSERT_EQUAL(v->reason, PRISM_REASON_NONE);
    CU_ASSERT_FALSE(v->has_switch);
    CU_ASSERT_TRUE(v->forced);
    v = block(p, 5);
    CU_ASSERT_EQUAL(v->precision, PRISM_PRECISION_BF16);
    CU_ASSERT_FALSE(v->has_switch);
    CU_ASSERT_FALSE(v->forced);
    /* Nothing new: the version stays. */
    feed_blocks(p, 8, blocks, 3, &r);
    CU_ASSERT_FALSE(r.map_changed);
    CU_ASSERT_EQUAL(r.change_count, 0);
    CU_ASSERT_EQUAL(r.map_version, 1);
    prism_policy_destroy(p);
}

static void test_forced_int8_uses_configured_low_precision(void)
{
    prism_policy *p = make_policy(EXACT, "{\"warmup_steps\": 5, \"force_int8_blocks\": [0],"
                                         " \"low_precision\": \"int4\"}");
    prism_step_result r;
    feed_pair(p, 1, 0.75, &r);
    CU_ASSERT_EQUAL(block(p, 0)->precision, PRISM_PRECISION_INT4);
    assert_change(&r, 0, PRISM_PRECISION_BF16, PRISM_PRECISION_INT4, 1, PRISM_REASON_OVERRIDE);
    prism_policy_destroy(p);
}

static void test_overrides_ignore_cooldown_and_wait_for_next_decision(void)
{
    prism_policy *p = make_policy(EXACT, "{\"min_steps_between_switches\": 100, \"update_interval_steps\": 2}");
    prism_step_result r;
    feed_pair(p, 1, 0.0, &r); /* decision n = 1: block 0 int8 by score at step 1 */
    CU_ASSERT_EQUAL_FATAL(block(p, 0)->precision, PRISM_PRECISION_INT8);
    set_config(p, EXACT, "{\"min_steps_between_switches\": 100, \"update_interval_steps\": 2,"
                         " \"force_bf16_blocks\": [0]}");
    /* Not in force until the next decision. */
    CU_ASSERT_EQUAL(prism_policy_config(p)->force_bf16_blocks.count, 0);
    feed_pair(p, 2, 0.0, &r);
    CU_ASSERT_FALSE(r.decided);
    CU_ASSERT_EQUAL(block(p, 0)->precision, PRISM_PRECISION_INT8);
    CU_ASSERT_EQUAL(prism_policy_config(p)->force_bf16_blocks.count, 0);
    feed_pair(p, 3, 0.0, &r); /* decision n = 3 */
    CU_ASSERT_TRUE(r.decided);
    CU_ASSERT_EQUAL(prism_policy_config(p)->force_bf16_blocks.count, 1);
    CU_ASSERT_EQUAL(block(p, 0)->precision, PRISM_PRECISION_BF16);
    CU_ASSERT_TRUE(block(p, 0)->forced);
    assert_change(&r, 0, PRISM_PRECISION_INT8, PRISM_PRECISION_BF16, 3, PRISM_REASON_OVERRIDE);
    /* And back to int8 by an int8 override at the next decision, 2 steps after the switch. */
    set_config(p, EXACT, "{\"min_steps_between_switches\": 100, \"update_interval_steps\": 2,"
                         " \"force_int8_blocks\": [0, 1]}");
    feed_pair(p, 4, 0.75, &r);
    feed_pair(p, 5, 0.75, &r);
    CU_ASSERT_TRUE(r.decided);
    CU_ASSERT_EQUAL(block(p, 0)->precision, PRISM_PRECISION_INT8);
    CU_ASSERT_EQUAL(block(p, 1)->precision, PRISM_PRECISION_INT8);
    assert_change(&r, 0, PRISM_PRECISION_BF16, PRISM_PRECISION_INT8, 5, PRISM_REASON_OVERRIDE);
    assert_change(&r, 1, PRISM_PRECISION_BF16, PRISM_PRECISION_INT8, 5, PRISM_REASON_OVERRIDE);
    CU_ASSERT_EQUAL(r.change_count, 2);
    CU_ASSERT_EQUAL(r.summary.precision_changes, 2);
    prism_policy_destroy(p);
}

static void test_override_wins_over_nonfinite(void)
{
    prism_policy *p = make_policy(EXACT, "{\"force_int8_blocks\": [0]}");
    prism_block_stats blocks[2] = {stats(0, NAN), stats(1, 1.0)};
    blocks[0].nonfinite = 5;
    prism_step_result r;
    feed_blocks(p, 1, blocks, 2, &r);
    feed_blocks(p, 2, blocks, 2, &r);
    CU_ASSERT_TRUE(r.decided);
    CU_ASSERT_EQUAL(block(p, 0)->precision, PRISM_PRECISION_INT8);
    CU_ASSERT_PTR_NULL(find_change(&r, 0));
    prism_policy_destroy(p);
}

/* ---- modes ---- */

static void test_enabled_false_puts_every_block_bf16_and_ignores_overrides(void)
{
    prism_policy *p = make_policy(EXACT, "{\"enabled\": false, \"force_int8_blocks\": [0]}");
    prism_step_result r;
    double l2[3] = {0.0, 0.0, 3.0};
    feed(p, 1, l2, 3, &r);
    CU_ASSERT_TRUE(r.decided);
    CU_ASSERT_EQUAL(r.change_count, 0);
    CU_ASSERT_FALSE(r.map_changed);
    CU_ASSERT_EQUAL(r.map_version, 0);
    for (uint32_t id = 0; id < 3; id++) {
        CU_ASSERT_EQUAL(block(p, id)->precision, PRISM_PRECISION_BF16);
        CU_ASSERT_FALSE(block(p, id)->has_score);
        CU_ASSERT_FALSE(block(p, id)->forced);
    }
    CU_ASSERT_EQUAL(r.summary.scored, 0);
    CU_ASSERT_EQUAL(r.summary.blocks_bf16, 3);
    CU_ASSERT_EQUAL(r.summary.blocks_low, 0);
    prism_policy_destroy(p);
}

static void test_disabling_moves_low_blocks_to_bf16_with_reason_mode(void)
{
    prism_policy *p = make_policy(EXACT, "{\"force_int8_blocks\": [2], \"min_steps_between_switches\": 100}");
    prism_step_result r;
    double l2[3] = {0.0, 1.0, 1.0}; /* block 0 int8 by score, block 2 by override */
    feed(p, 1, l2, 3, &r);
    CU_ASSERT_EQUAL_FATAL(block(p, 0)->precision, PRISM_PRECISION_INT8);
    CU_ASSERT_EQUAL_FATAL(block(p, 2)->precision, PRISM_PRECISION_INT8);
    uint64_t version = r.map_version;
    set_config(p, EXACT, "{\"enabled\": false, \"force_int8_blocks\": [2], \"min_steps_between_switches\": 100}");
    feed(p, 2, l2, 3, &r);
    CU_ASSERT_EQUAL(block(p, 0)->precision, PRISM_PRECISION_BF16);
    CU_ASSERT_EQUAL(block(p, 2)->precision, PRISM_PRECISION_BF16);
    assert_change(&r, 0, PRISM_PRECISION_INT8, PRISM_PRECISION_BF16, 2, PRISM_REASON_MODE);
    assert_change(&r, 2, PRISM_PRECISION_INT8, PRISM_PRECISION_BF16, 2, PRISM_REASON_MODE);
    CU_ASSERT_EQUAL(r.change_count, 2);
    CU_ASSERT_EQUAL(r.map_version, version + 1);
    CU_ASSERT_FALSE(block(p, 2)->forced);
    prism_policy_destroy(p);
}

static void test_mode_off_keeps_overrides_and_computes_no_scores(void)
{
    prism_policy *p = make_policy(EXACT, "{\"force_int8_blocks\": [2]}");
    prism_step_result r;
    double l2[4] = {0.0, 0.0, 2.0, 2.0}; /* blocks 0, 1 int8 by score */
    feed(p, 1, l2, 4, &r);
    CU_ASSERT_EQUAL_FATAL(block(p, 0)->precision, PRISM_PRECISION_INT8);
    uint64_t version = r.map_version;
    set_config(p, EXACT, "{\"mode\": \"off\", \"force_int8_blocks\": [2]}");
    feed(p, 2, l2, 4, &r);
    CU_ASSERT_TRUE(r.decided);
    CU_ASSERT_EQUAL(block(p, 0)->precision, PRISM_PRECISION_BF16);
    CU_ASSERT_EQUAL(block(p, 1)->precision, PRISM_PRECISION_BF16);
    CU_ASSERT_EQUAL(block(p, 2)->precision, PRISM_PRECISION_INT8);
    CU_ASSERT_EQUAL(block(p, 3)->precision, PRISM_PRECISION_BF16);
    assert_change(&r, 0, PRISM_PRECISION_INT8, PRISM_PRECISION_BF16, 2, PRISM_REASON_MODE);
    assert_change(&r, 1, PRISM_PRECISION_INT8, PRISM_PRECISION_BF16, 2, PRISM_REASON_MODE);
    CU_ASSERT_EQUAL(r.change_count, 2);
    CU_ASSERT_EQUAL(r.map_version, version + 1);
    for (uint32_t id = 0; id < 4; id++)
        CU_ASSERT_FALSE(block(p, id)->has_score);
    CU_ASSERT_EQUAL(r.summary.scored, 0);
    CU_ASSERT_EQUAL(r.summary.blocks_low, 1);
    CU_ASSERT_EQUAL(r.summary.blocks_bf16, 3);
    prism_policy_destroy(p);
}

static void test_mode_static_keeps_overrides_and_reports_scores(void)
{
    prism_policy *p = make_policy(EXACT, "{\"mode\": \"static\", \"force_int8_blocks\": [2]}");
    prism_step_result r;
    double l2[4] = {0.0, 0.0, 2.0, 2.0}; /* mean 1: rel 0, 0, 2, 2 -> s 0, 0, 1, 1 */
    feed(p, 1, l2, 4, &r);
    CU_ASSERT_TRUE(r.decided);
    CU_ASSERT_EQUAL(block(p, 0)->precision, PRISM_PRECISION_BF16); /* s 0 would be int8 in dynamic */
    CU_ASSERT_EQUAL(block(p, 1)->precision, PRISM_PRECISION_BF16);
    CU_ASSERT_EQUAL(block(p, 2)->precision, PRISM_PRECISION_INT8); /* s 1, but forced */
    CU_ASSERT_EQUAL(block(p, 3)->precision, PRISM_PRECISION_BF16);
    CU_ASSERT_TRUE(block(p, 0)->has_score);
    CU_ASSERT_EQUAL(block(p, 0)->sensitivity, 0.0);
    CU_ASSERT_TRUE(block(p, 2)->has_score);
    CU_ASSERT_EQUAL(block(p, 2)->sensitivity, 1.0);
    CU_ASSERT_EQUAL(block(p, 2)->relative_magnitude, 2.0);
    CU_ASSERT_EQUAL(r.summary.scored, 4);
    CU_ASSERT_EQUAL(r.summary.mean_sensitivity, 0.5);
    CU_ASSERT_EQUAL(r.summary.max_sensitivity, 1.0);
    CU_ASSERT_EQUAL(r.summary.min_sensitivity, 0.0);
    /* The non-finite rule is a dynamic-mode rule: a non-finite block stays bf16 by mode, unchanged,
     * and a forced one keeps its override. */
    prism_block_stats blocks[4] = {stats(0, 0.0), stats(1, 0.0), stats(2, 2.0), stats(3, 2.0)};
    blocks[0].nonfinite = 1;
    blocks[2].nonfinite = 1;
    feed_blocks(p, 2, blocks, 4, &r);
    CU_ASSERT_TRUE(r.decided);
    CU_ASSERT_EQUAL(block(p, 0)->precision, PRISM_PRECISION_BF16);
    CU_ASSERT_EQUAL(block(p, 0)->reason, PRISM_REASON_NONE);
    CU_ASSERT_EQUAL(block(p, 2)->precision, PRISM_PRECISION_INT8);
    CU_ASSERT_EQUAL(r.change_count, 0);
    prism_policy_destroy(p);
}

static void test_switching_static_to_dynamic_assigns_fresh(void)
{
    prism_policy *p = make_policy(EXACT, "{\"mode\": \"static\", \"min_steps_between_switches\": 100}");
    prism_step_result r;
    feed_pair(p, 1, 0.0, &r);
    CU_ASSERT_EQUAL(block(p, 0)->precision, PRISM_PRECISION_BF16);
    set_config(p, EXACT, "{\"min_steps_between_switches\": 100}");
    /* Never assigned by score and no switch: fresh, no cooldown; s 0.2490234375 -> int8
     * (hysteresis from bf16 would keep it). */
    feed_pair(p, 2, 0.2490234375, &r);
    CU_ASSERT_EQUAL(block(p, 0)->precision, PRISM_PRECISION_INT8);
    assert_change(&r, 0, PRISM_PRECISION_BF16, PRISM_PRECISION_INT8, 2, PRISM_REASON_SCORE);
    prism_policy_destroy(p);
}

/* ---- versions, effective step, summary ---- */

static void test_map_version_counts_calls_with_changes_and_effective_step_adds_lag(void)
{
    /* grad_sensitivity_threshold 8: four equal blocks have rel 1, grad_score 0.125 -> all int8. */
    prism_policy *p = make_policy(EXACT, "{\"grad_sensitivity_threshold\": 8.0, \"apply_lag_steps\": 3,"
                                         " \"warmup_steps\": 2, \"update_interval_steps\": 2}");
    double l2[4] = {1.0, 1.0, 1.0, 1.0};
    prism_step_result r;
    CU_ASSERT_EQUAL(prism_policy_map_version(p), 0);
    feed(p, 10, l2, 4, &r);
    CU_ASSERT_FALSE(r.decided);
    CU_ASSERT_FALSE(r.map_changed);
    CU_ASSERT_EQUAL(r.map_version, 0);
    feed(p, 11, l2, 4, &r);
    CU_ASSERT_TRUE(r.decided);
    CU_ASSERT_TRUE(r.map_changed);
    CU_ASSERT_EQUAL(r.change_count, 4);
    CU_ASSERT_EQUAL(r.map_version, 1); /* four changes, one version */
    CU_ASSERT_EQUAL(prism_policy_map_version(p), 1);
    CU_ASSERT_EQUAL(r.decided_step, 11);
    CU_ASSERT_EQUAL(r.effective_step, 14);
    CU_ASSERT_EQUAL(r.summary.precision_changes, 4);
    CU_ASSERT_EQUAL(r.summary.map_version, 1);
    CU_ASSERT_EQUAL(r.summary.step_id, 11);
    feed(p, 12, l2, 4, &r);
    feed(p, 20, l2, 4, &r);
    CU_ASSERT_TRUE(r.decided);
    CU_ASSERT_FALSE(r.map_changed);
    CU_ASSERT_EQUAL(r.change_count, 0);
    CU_ASSERT_EQUAL(r.map_version, 1);
    CU_ASSERT_EQUAL(r.decided_step, 20);
    CU_ASSERT_EQUAL(r.effective_step, 23);
    CU_ASSERT_EQUAL(r.summary.precision_changes, 0);
    CU_ASSERT_EQUAL(r.summary.map_version, 1);
    /* An override set between decisions moves one block at the next decision: one more version. */
    set_config(p, EXACT, "{\"grad_sensitivity_threshold\": 8.0, \"apply_lag_steps\": 3,"
                         " \"warmup_steps\": 2, \"update_interval_steps\": 2, \"force_bf16_blocks\": [1]}");
    feed(p, 21, l2, 4, &r); /* not a decision: nothing moves yet */
    CU_ASSERT_FALSE(r.decided);
    CU_ASSERT_EQUAL(r.map_version, 1);
    feed(p, 22, l2, 4, &r);
    CU_ASSERT_TRUE(r.decided);
    CU_ASSERT_EQUAL(r.change_count, 1);
    CU_ASSERT_EQUAL(r.map_version, 2);
    CU_ASSERT_EQUAL(r.effective_step, 25);
    prism_policy_destroy(p);
}

static void test_summary_counts_blocks_and_sensitivities(void)
{
    prism_policy *p = make_policy(EXACT, NULL);
    double l2[4] = {1.0, 1.0, 1.0, 5.0}; /* rel 0.5, 0.5, 0.5, 2.5 -> s 0.25, 0.25, 0.25, 1 */
    prism_step_result r;
    feed(p, 1, l2, 4, &r);
    CU_ASSERT_TRUE(r.decided);
    /* 0.25 is ambiguous: bf16 by default. */
    CU_ASSERT_EQUAL(r.summary.blocks_bf16, 4);
    CU_ASSERT_EQUAL(r.summary.blocks_low, 0);
    CU_ASSERT_EQUAL(r.summary.scored, 4);
    CU_ASSERT_EQUAL(r.summary.mean_sensitivity, 0.4375);
    CU_ASSERT_EQUAL(r.summary.max_sensitivity, 1.0);
    CU_ASSERT_EQUAL(r.summary.min_sensitivity, 0.25);
    CU_ASSERT_EQUAL(r.summary.precision_changes, 0);
    CU_ASSERT_EQUAL(r.summary.bandwidth_saving_pct, 0.0);
    CU_ASSERT_EQUAL(r.summary.low_precision, PRISM_PRECISION_INT8);
    /* l2 0, 0, 1, 3: mean 1 -> s 0, 0, 0.5, 1 -> int8, int8, bf16, bf16; 2 of 4 at 50%: 25.0 */
    double l2b[4] = {0.0, 0.0, 1.0, 3.0};
    feed(p, 2, l2b, 4, &r);
    CU_ASSERT_EQUAL(r.summary.blocks_bf16, 2);
    CU_ASSERT_EQUAL(r.summary.blocks_low, 2);
    CU_ASSERT_EQUAL(r.summary.precision_changes, 2);
    CU_ASSERT_EQUAL(r.summary.mean_sensitivity, 0.375);
    CU_ASSERT_EQUAL(r.summary.max_sensitivity, 1.0);
    CU_ASSERT_EQUAL(r.summary.min_sensitivity, 0.0);
    CU_ASSERT_EQUAL(r.summary.bandwidth_saving_pct, 25.0);
    prism_policy_destroy(p);
}

static void test_summary_has_no_sensitivities_when_no_block_is_scored(void)
{
    prism_policy *p = make_policy(EXACT, "{\"mode\": \"off\"}");
    prism_step_result r;
    feed_pair(p, 1, 0.25, &r);
    CU_ASSERT_TRUE(r.decided);
    CU_ASSERT_EQUAL(r.summary.scored, 0);
    CU_ASSERT_EQUAL(r.summary.blocks_bf16, 2);
    prism_policy_destroy(p);
}

/* n of 48 equal blocks forced low (static mode) with the given low format. */
static double saving_of_forced_blocks(size_t total, size_t low, const char *format)
{
    char cfg[1024];
    int used = snprintf(cfg, sizeof cfg, "{\"mode\": \"static\", \"warmup_steps\": 2, \"low_precision\": \"%s\","
                                         " \"force_int8_blocks\": [", format);
    for (size_t i = 0; i < low; i++)
        used += snprintf(cfg + used, sizeof cfg - (size_t)used, "%s%zu", i ? ", " : "", i);
    snprintf(cfg + used, sizeof cfg - (size_t)used, "]}");
    prism_policy *p = make_policy(EXACT, cfg);
    double l2[64];
    for (size_t i = 0; i < total; i++)
        l2[i] = 1.0;
    prism_step_result r;
    feed(p, 1, l2, total, &r);
    feed(p, 2, l2, total, &r);
    CU_ASSERT_TRUE(r.decided);
    CU_ASSERT_EQUAL(r.summary.blocks_low, low);
    CU_ASSERT_EQUAL(r.summary.blocks_bf16, total - low);
    CU_ASSERT_EQUAL(r.summary.precision_changes, 0);
    double pct = r.summary.bandwidth_saving_pct;
    prism_policy_destroy(p);
    return pct;
}

static void test_bandwidth_saving_of_29_of_48_equal_int8_blocks_is_30_2(void)
{
    /* 100 * 29 * 0.5 / 48 = 30.208... -> 30.2 */
    CU_ASSERT_DOUBLE_EQUAL(saving_of_forced_blocks(48, 29, "int8"), 30.2, 1e-12);
}

static void test_bandwidth_saving_per_low_format(void)
{
    static const struct {
        size_t total, low;
        const char *format;
        double want;
    } cases[] = {
        {4, 2, "int4", 37.5},      /* 100 * 2 * 0.75 / 4 */
        {4, 2, "fp8_e4m3", 25.0},
        {4, 2, "fp8_e5m2", 25.0},
        {4, 4, "int4", 75.0},
        {4, 0, "int8", 0.0},
        {3, 1, "int8", 16.7},      /* 16.666... */
        {3, 2, "int4", 50.0},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        double got = saving_of_forced_blocks(cases[i].total, cases[i].low, cases[i].format);
        if (fabs(got - cases[i].want) > 1e-12)
            fprintf(stderr, "case %zu: got %.17g\n", i, got);
        CU_ASSERT_DOUBLE_EQUAL(got, cases[i].want, 1e-12);
    }
}

static void test_bandwidth_saving_weighted_by_bf16_bytes_when_every_block_has_them(void)
{
    static const struct {
        uint64_t bytes[4]; /* 0: not reported */
        double want;
    } cases[] = {
        {{100, 100, 200, 600}, 35.0}, /* blocks 0 and 3 low: 100 * (100 + 600) * 0.5 / 1000 */
        {{100, 100, 200, 0}, 25.0},   /* block 3 has none: equal weights, 2 of 4 */
        {{1, 1, 1, 1}, 25.0},
        {{300, 100, 100, 100}, 33.3}, /* 100 * (300 + 100) * 0.5 / 600 = 33.33... */
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        double want = cases[i].want;
        prism_policy *p = make_policy(EXACT, "{\"mode\": \"static\", \"warmup_steps\": 2,"
                                             " \"force_int8_blocks\": [0, 3]}");
        double l2[4] = {1.0, 1.0, 1.0, 1.0};
        prism_step_result r;
        feed(p, 1, l2, 4, &r);
        prism_error err;
        for (uint32_t id = 0; id < 4; id++)
            if (cases[i].bytes[id])
                CU_ASSERT_EQUAL(prism_policy_set_block_bytes(p, id, cases[i].bytes[id], &err), PRISM_OK);
        CU_ASSERT_EQUAL(block(p, 3)->param_bytes_bf16, cases[i].bytes[3]);
        feed(p, 2, l2, 4, &r);
        CU_ASSERT_TRUE(r.decided);
        if (fabs(r.summary.bandwidth_saving_pct - want) > 1e-12)
            fprintf(stderr, "case %zu: got %.17g\n", i, r.summary.bandwidth_saving_pct);
        CU_ASSERT_DOUBLE_EQUAL(r.summary.bandwidth_saving_pct, want, 1e-12);
        prism_policy_destroy(p);
    }
}

/* Norms near the largest double: their sum overflows, their mean does not. Two equal blocks
 * have rel 1, grad_score 1 / 2.0 = 0.5 each (and stay bf16), not rel 0. */
static void test_huge_norms_do_not_overflow_the_step_mean(void)
{
    prism_policy *p = make_policy("{\"warmup_steps\": 1}", NULL);
    prism_block_stats b[2] = {{0, 1e308, 1, 0, 0, 4, 0, false, 0, 0}, {1, 1e308, 1, 0, 0, 4, 0, false, 0, 0}};
    prism_step_result r;
    prism_error err;
    CU_ASSERT_EQUAL_FATAL(prism_policy_add_step(p, 1, NULL, b, 2, &r, &err), PRISM_OK);
    CU_ASSERT_EQUAL(block(p, 0)->relative_magnitude, 1.0);
    CU_ASSERT_EQUAL(block(p, 1)->sensitivity, 0.5);
    CU_ASSERT_EQUAL(block(p, 0)->precision, PRISM_PRECISION_BF16);
    prism_policy_destroy(p);
}

/* A config built in code with a value out of range is refused like a parsed one. */
static void test_create_and_set_config_check_ranges_of_configs_built_in_code(void)
{
    prism_config cfg = make_config(NULL, NULL);
    prism_error err;
    cfg.update_interval_steps = 0;
    CU_ASSERT_PTR_NULL(prism_policy_create(&cfg, &err));
    CU_ASSERT_PTR_NOT_NULL(strstr(err.message, "update_interval_steps"));
    cfg.update_interval_steps = 10;
    cfg.bf16_threshold = NAN;
    CU_ASSERT_PTR_NULL(prism_policy_create(&cfg, &err));
    CU_ASSERT_PTR_NOT_NULL(strstr(err.message, "bf16_threshold"));
    cfg.bf16_threshold = 0.6;
    prism_policy *p = prism_policy_create(&cfg, &err);
    CU_ASSERT_FATAL(p != NULL);
    cfg.history_window = 0;
    CU_ASSERT_EQUAL(prism_policy_set_config(p, &cfg, &err), PRISM_ERR_INVALID);
    CU_ASSERT_PTR_NOT_NULL(strstr(err.message, "history_window"));
    cfg.history_window = 5;
    cfg.mode = (prism_mode)7;
    CU_ASSERT_EQUAL(prism_policy_set_config(p, &cfg, &err), PRISM_ERR_INVALID);
    CU_ASSERT_PTR_NOT_NULL(strstr(err.message, "mode"));
    cfg.mode = PRISM_MODE_DYNAMIC;
    prism_policy_destroy(p);
    prism_config_free(&cfg);
}

/* Steps are bounded (PRISM_STEP_MAX) so that effective_step never wraps: the largest is taken
 * and its effective step is exact; one past it is refused and changes nothing. */
static void test_step_ids_past_the_bound_are_refused(void)
{
    prism_policy *p = make_policy("{\"warmup_steps\": 1, \"update_interval_steps\": 1, \"apply_lag_steps\": 1000000}",
                                  NULL);
    prism_block_stats b[1] = {stats(0, 1.0)};
    prism_step_result r;
    prism_error err;
    CU_ASSERT_EQUAL(prism_policy_add_step(p, UINT64_MAX, NULL, b, 1, &r, &err), PRISM_ERR_INVALID);
    CU_ASSERT_PTR_NOT_NULL(strstr(err.message, "is above the largest step id 9007199253740991"));
    CU_ASSERT_EQUAL(prism_policy_add_step(p, PRISM_STEP_MAX + 1, NULL, b, 1, &r, &err), PRISM_ERR_INVALID);
    CU_ASSERT_EQUAL(prism_policy_steps_collected(p), 0);
    CU_ASSERT_EQUAL_FATAL(prism_policy_add_step(p, PRISM_STEP_MAX, NULL, b, 1, &r, &err), PRISM_OK);
    CU_ASSERT_EQUAL(r.effective_step, (UINT64_C(1) << 53) - 1);
    prism_policy_destroy(p);
}

/* A calibration report is checked whole before any of it is set: a NaN in its second entry
 * leaves the first unset too (issue 12: block 0 got 0.05 from a refused report). */
static void test_a_calibration_report_is_applied_whole_or_not_at_all(void)
{
    prism_policy *p = make_policy("{\"warmup_steps\": 1, \"update_interval_steps\": 1, \"history_window\": 1}",
                                  NULL);
    prism_step_result r;
    feed_pair(p, 1, 0.5, &r);
    uint32_t ids[2] = {0, 1};
    double bad[2] = {0.05, NAN}, good[2] = {0.01, 0.02};
    size_t at = 9;
    prism_error err;
    CU_ASSERT_EQUAL(prism_policy_set_calibrations(p, PRISM_PRECISION_INT8, ids, bad, 2, &at, &err), PRISM_ERR_INVALID);
    CU_ASSERT_EQUAL(at, 1);
    CU_ASSERT_EQUAL(prism_policy_set_calibrations(p, PRISM_PRECISION_BF16, ids, good, 2, &at, &err), PRISM_ERR_INVALID);
    feed_pair(p, 2, 0.5, &r);
    CU_ASSERT_FALSE(block(p, 0)->has_error_score);
    CU_ASSERT_FALSE(block(p, 1)->has_error_score);
    CU_ASSERT_EQUAL(prism_policy_set_calibrations(p, PRISM_PRECISION_INT8, ids, good, 2, &at, &err), PRISM_OK);
    feed_pair(p, 3, 0.5, &r);
    CU_ASSERT_TRUE(block(p, 0)->has_error_score);
    CU_ASSERT_TRUE(block(p, 1)->has_error_score);
    prism_policy_destroy(p);
}

/* Issue 18's ingest keeps the last step's record order to find slots without the hash table
 * and makes the saturation arrays only at the first figures: neither may change a result. P gets
 * every step's records in id order; Q gets them rotated (a new order each step), a block that
 * appears only from step 5, and before step 6 a step refused for a duplicate id at a position
 * the order cache knows. At step 8 (a decision) a smaller history_window takes effect and
 * block 2 reports the first saturation figures of either policy. The norms are small dyadic
 * numbers, so the step's mean is exact in any order. Every step's result and every view at the
 * end must be the same, to the last bit; block 2's fractions are those of its one entry. */
static void assert_same_result(const prism_step_result *a, const prism_step_result *b)
{
    CU_ASSERT_EQUAL(a->decided, b->decided);
    CU_ASSERT_EQUAL(a->map_version, b->map_version);
    CU_ASSERT_EQUAL_FATAL(a->change_count, b->change_count);
    for (size_t i = 0; i < a->change_count; i++) {
        CU_ASSERT_EQUAL(a->changes[i].block_id, b->changes[i].block_id);
        CU_ASSERT_EQUAL(a->changes[i].to, b->changes[i].to);
        CU_ASSERT_EQUAL(a->changes[i].reason, b->changes[i].reason);
    }
    CU_ASSERT_EQUAL(memcmp(&a->summary.mean_sensitivity, &b->summary.mean_sensitivity, sizeof(double)), 0);
    CU_ASSERT_EQUAL(memcmp(&a->summary.bandwidth_saving_pct, &b->summary.bandwidth_saving_pct, sizeof(double)), 0);
    CU_ASSERT_EQUAL(a->summary.blocks_low, b->summary.blocks_low);
    CU_ASSERT_EQUAL(a->summary.scored, b->summary.scored);
}

static void test_record_order_and_first_figures_change_no_result(void)
{
    const char *cfg = "{\"warmup_steps\": 2, \"update_interval_steps\": 2, \"history_window\": 3}";
    prism_policy *p = make_policy(EXACT, cfg), *q = make_policy(EXACT, cfg);
    static const double norms[4] = {0.5, 1.0, 2.0, 0.25};
    for (uint64_t step = 1; step <= 12; step++) {
        if (step == 8) {
            set_config(p, EXACT, "{\"warmup_steps\": 2, \"update_interval_steps\": 2, \"history_window\": 2}");
            set_config(q, EXACT, "{\"warmup_steps\": 2, \"update_interval_steps\": 2, \"history_window\": 2}");
        }
        size_t n = step >= 5 ? 5 : 4;
        prism_block_stats in_order[5], rotated[5];
        for (size_t i = 0; i < n; i++) {
            in_order[i] = stats((uint32_t)i, norms[(i + step) % 4]);
            if (step == 8 && i == 2) {
                in_order[i].has_saturation = true;
                in_order[i].saturated_fraction = 0.25;
                in_order[i].underflowed_fraction = 0.5;
            }
        }
        for (size_t i = 0; i < n; i++)
            rotated[i] = in_order[(i + step) % n];
        if (step == 6) {
            /* position 2 repeats position 1's id: refused, after the first positions went through
             * the order cache */
            prism_block_stats dup[5];
            memcpy(dup, rotated, sizeof dup);
            dup[2] = dup[1];
            prism_error err;
            prism_step_result refused;
            CU_ASSERT_EQUAL(prism_policy_add_step(q, step, NULL, dup, n, &refused, &err), PRISM_ERR_INVALID);
        }
        prism_step_result rp, rq;
        feed_blocks(p, step, in_order, n, &rp);
        feed_blocks(q, step, rotated, n, &rq);
        assert_same_result(&rp, &rq);
        if (step == 8) {
            CU_ASSERT_TRUE(rp.decided);
            for (int k = 0; k < 2; k++) {
                const prism_block_view *v = block(k ? q : p, 2);
                CU_ASSERT_TRUE(v->has_saturation);
                CU_ASSERT_EQUAL(v->saturated_fraction, 0.25);
                CU_ASSERT_EQUAL(v->underflowed_fraction, 0.5);
            }
        }
    }
    CU_ASSERT_EQUAL_FATAL(prism_policy_block_count(p), 5);
    CU_ASSERT_EQUAL_FATAL(prism_policy_block_count(q), 5);
    for (size_t i = 0; i < 5; i++) {
        const prism_block_view *a = prism_policy_block(p, i), *b = prism_policy_block(q, i);
        CU_ASSERT_EQUAL(a->id, b->id);
        CU_ASSERT_EQUAL(a->precision, b->precision);
        CU_ASSERT_EQUAL(a->reason, b->reason);
        CU_ASSERT_EQUAL(a->last_switch_step, b->last_switch_step);
        CU_ASSERT_EQUAL(memcmp(&a->sensitivity, &b->sensitivity, sizeof(double)), 0);
        CU_ASSERT_EQUAL(memcmp(&a->relative_magnitude, &b->relative_magnitude, sizeof(double)), 0);
        CU_ASSERT_EQUAL(a->has_saturation, b->has_saturation);
    }
    /* Block 2's figures came at step 8 only and left its window of 2 with step 10's entry. */
    CU_ASSERT_FALSE(block(p, 2)->has_saturation);
    prism_policy_destroy(p);
    prism_policy_destroy(q);
}

/* The saturation arrays are made only at the first figures; before that a block's record reads
 * as entries without figures, and the block's fractions are those of the entries that had them. */
static void test_first_saturation_figures_after_steps_without(void)
{
    prism_policy *p = make_policy(EXACT, "{\"warmup_steps\": 3, \"history_window\": 3}");
    prism_step_result r;
    feed_pair(p, 1, 0.5, &r);
    feed_pair(p, 2, 0.5, &r);
    double window[PRISM_WINDOW_MAX], sat[PRISM_WINDOW_MAX], und[PRISM_WINDOW_MAX];
    uint8_t has[PRISM_WINDOW_MAX];
    memset(has, 7, sizeof has);
    prism_block_record rec = {.window = window, .window_has_saturation = has, .window_saturated = sat,
                              .window_underflowed = und};
    prism_policy_block_record(p, 0, &rec);
    CU_ASSERT_EQUAL_FATAL(rec.window_len, 2);
    CU_ASSERT_EQUAL(has[0], 0);
    CU_ASSERT_EQUAL(has[1], 0);
    CU_ASSERT_EQUAL(sat[1], 0.0);
    prism_block_stats blocks[2] = {stats(0, 0.5), stats(1, 0.5)};
    blocks[0].has_saturation = true;
    blocks[0].saturated_fraction = 0.125;
    blocks[0].underflowed_fraction = 0.375;
    feed_blocks(p, 3, blocks, 2, &r); /* the first decision */
    CU_ASSERT_TRUE(r.decided);
    CU_ASSERT_TRUE(block(p, 0)->has_saturation);
    CU_ASSERT_EQUAL(block(p, 0)->saturated_fraction, 0.125);
    CU_ASSERT_EQUAL(block(p, 0)->underflowed_fraction, 0.375);
    CU_ASSERT_FALSE(block(p, 1)->has_saturation);
    prism_policy_block_record(p, 0, &rec);
    CU_ASSERT_EQUAL_FATAL(rec.window_len, 3);
    CU_ASSERT_EQUAL(has[0], 0);
    CU_ASSERT_EQUAL(has[2], 1);
    CU_ASSERT_EQUAL(sat[2], 0.125);
    CU_ASSERT_EQUAL(und[2], 0.375);
    prism_policy_destroy(p);
}

static const prism_test_case cases[] = {
    {"test_step_ids_past_the_bound_are_refused", test_step_ids_past_the_bound_are_refused},
    {"test_a_calibration_report_is_applied_whole_or_not_at_all",
     test_a_calibration_report_is_applied_whole_or_not_at_all},
    {"test_block_stats_check_rejects_negative_figures_and_excess_nonfinite",
     test_block_stats_check_rejects_negative_figures_and_excess_nonfinite},
    {"test_block_stats_finite_needs_no_nonfinite_and_a_finite_norm",
     test_block_stats_finite_needs_no_nonfinite_and_a_finite_norm},
    {"test_reason_names_match_design", test_reason_names_match_design},
    {"test_create_rejects_invalid_config", test_create_rejects_invalid_config},
    {"test_set_config_rejects_invalid_config_and_keeps_the_old_one",
     test_set_config_rejects_invalid_config_and_keeps_the_old_one},
    {"test_add_step_rejects_bad_input_and_changes_nothing", test_add_step_rejects_bad_input_and_changes_nothing},
    {"test_blocks_are_listed_in_ascending_id_order", test_blocks_are_listed_in_ascending_id_order},
    {"test_decision_steps_follow_warmup_then_update_interval",
     test_decision_steps_follow_warmup_then_update_interval},
    {"test_no_score_before_the_first_decision", test_no_score_before_the_first_decision},
    {"test_first_assignment_uses_thresholds_and_ambiguous_default",
     test_first_assignment_uses_thresholds_and_ambiguous_default},
    {"test_first_assignment_with_design_default_thresholds", test_first_assignment_with_design_default_thresholds},
    {"test_ambiguous_default_low_means_configured_low_precision",
     test_ambiguous_default_low_means_configured_low_precision},
    {"test_hysteresis_keeps_bf16_until_below_int8_threshold_minus_margin",
     test_hysteresis_keeps_bf16_until_below_int8_threshold_minus_margin},
    {"test_hysteresis_keeps_int8_in_ambiguous_zone", test_hysteresis_keeps_int8_in_ambiguous_zone},
    {"test_cooldown_counts_step_ids_not_collected_steps", test_cooldown_counts_step_ids_not_collected_steps},
    {"test_cooldown_blocks_a_change_back_by_score", test_cooldown_blocks_a_change_back_by_score},
    {"test_fresh_assignment_after_removed_override_ignores_cooldown",
     test_fresh_assignment_after_removed_override_ignores_cooldown},
    {"test_window_drops_values_older_than_history_window", test_window_drops_values_older_than_history_window},
    {"test_window_mean_at_first_decision_covers_last_history_window_steps",
     test_window_mean_at_first_decision_covers_last_history_window_steps},
    {"test_shorter_history_window_keeps_the_newest_values", test_shorter_history_window_keeps_the_newest_values},
    {"test_rel_divides_by_mean_norm_of_the_step", test_rel_divides_by_mean_norm_of_the_step},
    {"test_grad_score_caps_at_one_but_relative_magnitude_does_not",
     test_grad_score_caps_at_one_but_relative_magnitude_does_not},
    {"test_all_zero_norms_give_zero_rel_and_zero_score", test_all_zero_norms_give_zero_rel_and_zero_score},
    {"test_calibration_error_weights_the_score", test_calibration_error_weights_the_score},
    {"test_calibration_error_can_move_a_block_to_bf16", test_calibration_error_can_move_a_block_to_bf16},
    {"test_calibration_for_another_format_than_low_precision_is_ignored",
     test_calibration_for_another_format_than_low_precision_is_ignored},
    {"test_score_is_clamped_to_one", test_score_is_clamped_to_one},
    {"test_low_format_change_moves_low_blocks_with_reason_mode",
     test_low_format_change_moves_low_blocks_with_reason_mode},
    {"test_nonfinite_block_goes_bf16_despite_cooldown", test_nonfinite_block_goes_bf16_despite_cooldown},
    {"test_nonfinite_steps_never_enter_window_and_mean_excludes_them",
     test_nonfinite_steps_never_enter_window_and_mean_excludes_them},
    {"test_nonfinite_flag_clears_at_every_decision", test_nonfinite_flag_clears_at_every_decision},
    {"test_nonfinite_between_decisions_acts_at_next_decision",
     test_nonfinite_between_decisions_acts_at_next_decision},
    {"test_block_with_empty_window_keeps_precision_and_has_no_score",
     test_block_with_empty_window_keeps_precision_and_has_no_score},
    {"test_block_first_seen_after_first_decision_is_assigned_fresh",
     test_block_first_seen_after_first_decision_is_assigned_fresh},
    {"test_first_report_of_forced_block_is_an_override_change",
     test_first_report_of_forced_block_is_an_override_change},
    {"test_forced_int8_uses_configured_low_precision", test_forced_int8_uses_configured_low_precision},
    {"test_overrides_ignore_cooldown_and_wait_for_next_decision",
     test_overrides_ignore_cooldown_and_wait_for_next_decision},
    {"test_override_wins_over_nonfinite", test_override_wins_over_nonfinite},
    {"test_enabled_false_puts_every_block_bf16_and_ignores_overrides",
     test_enabled_false_puts_every_block_bf16_and_ignores_overrides},
    {"test_disabling_moves_low_blocks_to_bf16_with_reason_mode",
     test_disabling_moves_low_blocks_to_bf16_with_reason_mode},
    {"test_mode_off_keeps_overrides_and_computes_no_scores", test_mode_off_keeps_overrides_and_computes_no_scores},
    {"test_mode_static_keeps_overrides_and_reports_scores", test_mode_static_keeps_overrides_and_reports_scores},
    {"test_switching_static_to_dynamic_assigns_fresh", test_switching_static_to_dynamic_assigns_fresh},
    {"test_map_version_counts_calls_with_changes_and_effective_step_adds_lag",
     test_map_version_counts_calls_with_changes_and_effective_step_adds_lag},
    {"test_summary_counts_blocks_and_sensitivities", test_summary_counts_blocks_and_sensitivities},
    {"test_summary_has_no_sensitivities_when_no_block_is_scored",
     test_summary_has_no_sensitivities_when_no_block_is_scored},
    {"test_bandwidth_saving_of_29_of_48_equal_int8_blocks_is_30_2",
     test_bandwidth_saving_of_29_of_48_equal_int8_blocks_is_30_2},
    {"test_bandwidth_saving_per_low_format", test_bandwidth_saving_per_low_format},
    {"test_bandwidth_saving_weighted_by_bf16_bytes_when_every_block_has_them",
     test_bandwidth_saving_weighted_by_bf16_bytes_when_every_block_has_them},
    {"test_huge_norms_do_not_overflow_the_step_mean", test_huge_norms_do_not_overflow_the_step_mean},
    {"test_create_and_set_config_check_ranges_of_configs_built_in_code", test_create_and_set_config_check_ranges_of_configs_built_in_code},
    {"test_record_order_and_first_figures_change_no_result", test_record_order_and_first_figures_change_no_result},
    {"test_first_saturation_figures_after_steps_without", test_first_saturation_figures_after_steps_without},
    {NULL, NULL},
};

static const prism_test_suite suites[] = {{"policy", cases}, {NULL, NULL}};

int main(int argc, char **argv)
{
    return prism_test_main(argc, argv, suites);
}
