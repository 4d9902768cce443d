/* The hybrid-devices model of issue 15 (service/policy/hybrid.h): every formula and every rule,
 * table-driven, against values worked out by hand. The inputs are small numbers chosen so that
 * every intermediate is exact in binary (powers of two, x/127 with x a multiple of 127/2^n), so
 * each expected value is compared with ==. */
#include "testutil.h"

#include "hybrid.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

#define P14 (1.0 / 16384.0) /* 2^-14: bf16's 2^(-2m) */

static prism_hybrid_stats stats(double x_l2, double x_max_abs, double x_numel, double w_l2, double w_max_abs,
                                double w_numel, double g_l2, double g_max_abs, double y_numel)
{
    prism_hybrid_stats s = {x_l2, x_max_abs, x_numel, w_l2, w_max_abs, w_numel, g_l2, g_max_abs, y_numel};
    return s;
}

/* Block A: eX = 3 (sqrt(64/4) = 4), eW = 3 (sqrt 32), eG = 0 (eps(0.5)); SX = 254/127 = 2, SW = 1.
 *   float: fwd = 2^-2m (64*4*3 + 64*2*3)/6 = 192 * 2^-2m, bwd = 2^-2m (2*4*3 + 0)/6 = 4 * 2^-2m;
 *   int8, k = 7: fwd = (64*4*4 + 64*1*2)/6 = 192, bwd = (2*4*4 + 64*2^-8*1024)/6 = 48;
 *   int8, k = 10: bwd = (32 + 64*2^-14*1024)/6 = 6. */
#define STATS_A stats(64, 254, 4, 64, 127, 2, 2, 0.5, 1024)
/* Block B: eX = 2 (sqrt 8), eW = 2 (sqrt 4), eG = 2; float fwd 32p, bwd 24p; int8 fwd 32, bwd 171/32. */
#define STATS_B stats(8, 254, 1, 32, 127, 8, 8, 2, 8)
/* Block C: eX = eW = 2 (sqrt 6), eG = 5 (eps(16)); SX = 1/4, SW = 1/2; float fwd 16p, bwd 56p;
 *   int8 fwd (0.75*2 + 3*2)/6 = 1.25, bwd (1.5*2 + 12*2^-10*4)/6 = 65/128. */
#define STATS_C stats(12, 31.75, 2, 12, 63.5, 2, 24, 16, 4)

static void test_epsilon_is_the_frexp_exponent_and_zero_for_zero(void)
{
    static const struct {
        double v;
        int e;
    } rows[] = {{0, 0}, {1, 1}, {0.5, 0}, {0.75, 0}, {0.25, -1}, {3, 2}, {1024, 11}, {1.0 / 1024, -9}, {-4, 3}};
    for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++)
        CU_ASSERT_EQUAL(prism_hybrid_epsilon(rows[i].v), rows[i].e);
}

static void test_e_is_the_absolute_exponent_clamped_at_5(void)
{
    static const struct {
        double v;
        int e;
    } rows[] = {{0, 0},  {0.5, 0}, {8, 4},         {16, 5},         {32, 5},
                {0.03125, 4} /* 2^-5: eps -4 */,  {1.0 / 1024, 5} /* eps -9 */, {0.0625, 3}};
    for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++)
        CU_ASSERT_EQUAL(prism_hybrid_clamped_exponent(rows[i].v), rows[i].e);
}

typedef struct omega_row {
    const char *what;
    prism_hybrid_stats s;
    size_t i, L;
    double gamma;
    prism_hybrid_format b, high;
    double expected;
} omega_row;

static void test_indicator_float_and_int8_formulas_with_depth_and_gamma(void)
{
    const omega_row rows[] = {
        /* omega = (gamma (L - d)) fwd + d bwd, d = i + 1 */
        {"A bf16 depth 1 of 3", STATS_A, 0, 3, 4, PRISM_HYBRID_BF16, PRISM_HYBRID_BF16, 1540 * P14},
        {"A int8 depth 1 of 3", STATS_A, 0, 3, 4, PRISM_HYBRID_INT8, PRISM_HYBRID_BF16, 1584},
        {"B bf16 depth 2 of 3", STATS_B, 1, 3, 4, PRISM_HYBRID_BF16, PRISM_HYBRID_BF16, 176 * P14},
        {"B int8 depth 2 of 3", STATS_B, 1, 3, 4, PRISM_HYBRID_INT8, PRISM_HYBRID_BF16, 138.6875},
        {"C bf16 depth 3 of 3", STATS_C, 2, 3, 4, PRISM_HYBRID_BF16, PRISM_HYBRID_BF16, 168 * P14},
        {"C int8 depth 3 of 3", STATS_C, 2, 3, 4, PRISM_HYBRID_INT8, PRISM_HYBRID_BF16, 1.5234375},
        {"A fp16 (m 10)", STATS_A, 0, 3, 4, PRISM_HYBRID_FP16, PRISM_HYBRID_FP16, 1540.0 / 1048576.0},
        {"A fp8_e4m3 (m 3)", STATS_A, 0, 3, 4, PRISM_HYBRID_FP8_E4M3, PRISM_HYBRID_BF16, 1540.0 / 64.0},
        {"A int8 on an fp16-high class (k 10)", STATS_A, 0, 3, 4, PRISM_HYBRID_INT8, PRISM_HYBRID_FP16, 1542},
        {"A int8 gamma 0", STATS_A, 0, 3, 0, PRISM_HYBRID_INT8, PRISM_HYBRID_BF16, 48},
        {"A int8 gamma 2", STATS_A, 0, 3, 2, PRISM_HYBRID_INT8, PRISM_HYBRID_BF16, 816},
        {"A int8 at the last block: no forward term", STATS_A, 2, 3, 4, PRISM_HYBRID_INT8, PRISM_HYBRID_BF16, 144},
        /* eX = min(5, |eps(64)| = 7) = 5, eG = min(5, |eps(64)|) = 5, eW = eps(0) = 0:
         * bwd = 2^-14 (2048*1*5 + 4096*1*5)/6 = 5120 * 2^-14 */
        {"clamp of large exponents", stats(4096, 0, 1, 0, 0, 1, 2048, 64, 1), 0, 1, 4, PRISM_HYBRID_BF16,
         PRISM_HYBRID_BF16, 0.3125},
        /* eX = min(5, |eps(2^-10)| = 9) = 5: bwd = 2^-14 (6*2^20*5 + 0)/6 = 320 */
        {"clamp of small exponents", stats(1, 0, 1048576, 0, 0, 1, 6, 0.5, 1), 0, 1, 4, PRISM_HYBRID_BF16,
         PRISM_HYBRID_BF16, 320},
    };
    for (size_t r = 0; r < sizeof rows / sizeof rows[0]; r++) {
        const omega_row *x = &rows[r];
        double got = prism_hybrid_omega(&x->s, x->i, x->L, x->gamma, x->b, x->high);
        if (got != x->expected)
            fprintf(stderr, "%s: got %.17g, expected %.17g\n", x->what, got, x->expected);
        CU_ASSERT_EQUAL(got, x->expected);
    }
}

/* The worked example of tests/integration/test_prismctl_plan.py: blocks A, B, C; a100 fixed by
 * default (bf16 64 ops/s), t4 (bf16 8, int8 32, quantize 1 s fixed); link 8 B/s, 0.25 s. */
static prism_hybrid_block example_blocks[3];
static prism_hybrid_class example_classes[2];

static prism_hybrid_problem example(void)
{
    const prism_hybrid_block blocks[3] = {
        {32, 16, 64, 4, STATS_A},
        {8, 8, 8, 4, STATS_B},
        {16, 8, 0, 4, STATS_C},
    };
    const prism_hybrid_class classes[2] = {
        {"a100", 1024, 64, 64, 128, 0, 0, 0, false},
        {"t4", 64, 8, 0, 32, 0, 1, 0, false},
    };
    memcpy(example_blocks, blocks, sizeof blocks);
    memcpy(example_classes, classes, sizeof classes);
    prism_hybrid_problem p;
    prism_hybrid_problem_defaults(&p);
    p.blocks = example_blocks;
    p.block_count = 3;
    p.classes = example_classes;
    p.class_count = 2;
    p.link_bytes_per_second = 8;
    p.link_latency_seconds = 0.25;
    p.memory_fraction = 0.8125;
    return p;
}

static void test_defaults(void)
{
    prism_hybrid_problem p;
    prism_hybrid_problem_defaults(&p);
    CU_ASSERT_EQUAL(p.memory_fraction, 0.9);
    CU_ASSERT_EQUAL(p.gamma, 4.0);
    CU_ASSERT_EQUAL(p.low_format, PRISM_HYBRID_LOW_AUTO);
    CU_ASSERT_FALSE(p.fixed_given);
    CU_ASSERT_PTR_NULL(p.force_high);
}

static void test_forward_and_backward_seconds_per_format(void)
{
    prism_hybrid_problem p = example();
    prism_hybrid_class q = {"q", 64, 8, 4, 32, 16, 0.25, 0.0625, false};
    prism_hybrid_class_formats int8 = {PRISM_HYBRID_BF16, PRISM_HYBRID_INT8, false};
    prism_hybrid_class_formats fp8 = {PRISM_HYBRID_BF16, PRISM_HYBRID_FP8_E4M3, false};
    prism_hybrid_class_formats fp16 = {PRISM_HYBRID_FP16, PRISM_HYBRID_INT8, false};
    const prism_hybrid_block *b0 = &p.blocks[0]; /* F 32, W 16, A 64 */
    /* high: F/ops, no quantize cost */
    CU_ASSERT_EQUAL(prism_hybrid_forward_seconds(b0, &q, &int8, PRISM_HYBRID_BF16), 4.0);
    CU_ASSERT_EQUAL(prism_hybrid_backward_seconds(b0, &q, &int8, PRISM_HYBRID_BF16), 8.0);
    /* int8: 32/32 + (0.25 + 0.0625 * (16 + 64)) = 1 + 5.25; backward in the high format */
    CU_ASSERT_EQUAL(prism_hybrid_forward_seconds(b0, &q, &int8, PRISM_HYBRID_INT8), 6.25);
    CU_ASSERT_EQUAL(prism_hybrid_backward_seconds(b0, &q, &int8, PRISM_HYBRID_INT8), 8.0);
    CU_ASSERT_EQUAL(prism_hybrid_backward_seconds(b0, &q, &fp16, PRISM_HYBRID_INT8), 16.0);
    /* fp8: 32/16 + 5.25; backward in fp8: 64/16 */
    CU_ASSERT_EQUAL(prism_hybrid_forward_seconds(b0, &q, &fp8, PRISM_HYBRID_FP8_E4M3), 7.25);
    CU_ASSERT_EQUAL(prism_hybrid_backward_seconds(b0, &q, &fp8, PRISM_HYBRID_FP8_E4M3), 4.0);
}

typedef struct time_row {
    const char *what;
    prism_hybrid_format t4[3];
    double bytes_per_second;
    double expected, compute_a100, compute_t4;
} time_row;

#define I8 PRISM_HYBRID_INT8
#define BF PRISM_HYBRID_BF16

static void test_iteration_time_waits_for_the_slowest_class_and_the_previous_all_reduce(void)
{
    /* a100 (all bf16): fwd 0.5, 0.125, 0.25; bwd 1, 0.25, 0.5: f(2) 1.375, f(1) 1.625, f(0) 2.625.
     * t4 int8: fwd 2, 1.25, 1.5; bwd 8, 2, 4: f(2) 8.75, f(1) 10.75, f(0) 18.75.
     * Link 8 B/s: W/bps 2, 1, 1; end(2) = 8.75 + 0.25 + 1 = 10, end(1) = 10.75 + 1.25 = 12,
     * end(0) = 18.75 + 2.25 = 21. Link 1 B/s: W/bps 16, 8, 8; end(2) = 17, end(1) = max(10.75, 17)
     * + 8.25 = 25.25 (the previous all-reduce is later), end(0) = 25.25 + 16.25 = 41.5. */
    const time_row rows[] = {
        {"start", {I8, I8, I8}, 8, 21, 2.625, 18.75},
        {"block 1 raised (fwd 1 < 1.25)", {I8, BF, I8}, 8, 20.75, 2.625, 18.5},
        {"block 2 raised (fwd 2 > 1.5)", {I8, I8, BF}, 8, 21.5, 2.625, 19.25},
        {"blocks 1 and 2 raised", {I8, BF, BF}, 8, 21.25, 2.625, 19},
        {"all high", {BF, BF, BF}, 8, 23.25, 2.625, 21},
        {"slow link", {I8, I8, I8}, 1, 41.5, 2.625, 18.75},
    };
    for (size_t r = 0; r < sizeof rows / sizeof rows[0]; r++) {
        prism_hybrid_problem p = example();
        p.link_bytes_per_second = rows[r].bytes_per_second;
        prism_hybrid_class_formats fm[2];
        prism_error err;
        CU_ASSERT_FATAL(prism_hybrid_resolve(&p, fm, &err) == PRISM_OK);
        prism_hybrid_format plan[6] = {BF, BF, BF, rows[r].t4[0], rows[r].t4[1], rows[r].t4[2]};
        double compute[2], t = 0;
        CU_ASSERT_FATAL(prism_hybrid_iteration_seconds(&p, fm, plan, compute, &t) == PRISM_OK);
        if (t != rows[r].expected)
            fprintf(stderr, "%s: T %.17g, expected %.17g\n", rows[r].what, t, rows[r].expected);
        CU_ASSERT_EQUAL(t, rows[r].expected);
        CU_ASSERT_EQUAL(compute[0], rows[r].compute_a100);
        CU_ASSERT_EQUAL(compute[1], rows[r].compute_t4);
    }
}

static void test_memory_counts_8_or_16_bit_activations_and_budget_is_fraction_of_memory(void)
{
    prism_hybrid_problem p = example();
    static const struct {
        prism_hybrid_format row[3];
        double bytes;
    } rows[] = {
        {{I8, I8, I8}, 48}, /* (4 + 32) + (4 + 4) + (4 + 0) */
        {{BF, I8, I8}, 80},
        {{I8, BF, I8}, 52},
        {{BF, BF, BF}, 84},
        {{PRISM_HYBRID_FP8_E4M3, PRISM_HYBRID_FP16, I8}, 52},
    };
    for (size_t r = 0; r < sizeof rows / sizeof rows[0]; r++)
        CU_ASSERT_EQUAL(prism_hybrid_memory(&p, rows[r].row), rows[r].bytes);
    CU_ASSERT_EQUAL(prism_hybrid_budget(&p, 1), 52.0);
    CU_ASSERT_EQUAL(prism_hybrid_budget(&p, 0), 832.0);
}

typedef struct resolve_row {
    const char *what;
    prism_hybrid_class classes[4];
    size_t count;
    bool fixed_given;
    prism_hybrid_low_choice low;
    prism_status status;
    prism_hybrid_class_formats expected[4];
    const char *message;
} resolve_row;

#define F_ PRISM_HYBRID_FP16
#define E4 PRISM_HYBRID_FP8_E4M3

static void test_formats_and_fixed_classes_by_default_and_by_config(void)
{
    const resolve_row rows[] = {
        {"fixed by default: the largest ops(high), ties all fixed, fp16 counted by its own ops",
         {{"x", 1, 8, 0, 1, 0, 0, 0, false},
          {"y", 1, 8, 0, 1, 1, 0, 0, false},
          {"z", 1, 4, 0, 1, 0, 0, 0, false},
          {"w", 1, 0, 8, 1, 0, 0, 0, false}},
         4, false, PRISM_HYBRID_LOW_AUTO, PRISM_OK,
         {{BF, I8, true}, {BF, E4, true}, {BF, I8, false}, {F_, I8, true}}, NULL},
        {"fixed by the config only",
         {{"x", 1, 8, 0, 1, 0, 0, 0, false}, {"z", 1, 4, 0, 1, 0, 0, 0, true}}, 2, true, PRISM_HYBRID_LOW_INT8,
         PRISM_OK, {{BF, I8, false}, {BF, I8, true}}, NULL},
        {"explicit fp8_e4m3", {{"x", 1, 8, 0, 0, 2, 0, 0, false}}, 1, false, PRISM_HYBRID_LOW_FP8_E4M3, PRISM_OK,
         {{BF, E4, true}}, NULL},
        {"explicit int8 without int8 ops",
         {{"x", 1, 8, 0, 1, 2, 0, 0, false}, {"z", 1, 4, 0, 0, 2, 0, 0, false}}, 2, false, PRISM_HYBRID_LOW_INT8,
         PRISM_ERR_INVALID, {{BF, I8, false}},
         "classes[1].profile.int8_ops_per_second: must be > 0: the class's low format is int8"},
        {"auto without fp8 or int8 ops",
         {{"x", 1, 8, 0, 1, 2, 0, 0, false}, {"z", 1, 4, 0, 0, 0, 0, 0, false}}, 2, false, PRISM_HYBRID_LOW_AUTO,
         PRISM_ERR_INVALID, {{BF, I8, false}},
         "classes[1].profile.int8_ops_per_second: must be > 0: the class's low format is int8"},
        {"explicit fp8 without fp8 ops",
         {{"x", 1, 8, 0, 1, 2, 0, 0, false}, {"z", 1, 4, 0, 1, 0, 0, 0, false}}, 2, false,
         PRISM_HYBRID_LOW_FP8_E4M3, PRISM_ERR_INVALID, {{BF, I8, false}},
         "classes[1].profile.fp8_ops_per_second: must be > 0: the class's low format is fp8_e4m3"},
        {"a fixed class needs no throughput in its low format (it never runs it)",
         {{"x", 1, 8, 0, 0, 0, 0, 0, false}, {"z", 1, 4, 0, 1, 0, 0, 0, false}}, 2, false, PRISM_HYBRID_LOW_AUTO,
         PRISM_OK, {{BF, I8, true}, {BF, I8, false}}, NULL},
        {"the same by the config", {{"x", 1, 8, 0, 1, 0, 0, 0, false}, {"z", 1, 4, 0, 1, 0, 0, 0, true}}, 2, true,
         PRISM_HYBRID_LOW_FP8_E4M3, PRISM_ERR_INVALID, {{BF, E4, false}},
         "classes[0].profile.fp8_ops_per_second: must be > 0: the class's low format is fp8_e4m3"},
        {"no 16-bit format", {{"x", 1, 0, 0, 1, 0, 0, 0, false}}, 1, false, PRISM_HYBRID_LOW_AUTO, PRISM_ERR_INVALID,
         {{BF, I8, false}},
         "classes[0].profile.fp16_ops_per_second: must be > 0 when bf16_ops_per_second is 0 (the class needs a "
         "16-bit high format)"},
    };
    for (size_t r = 0; r < sizeof rows / sizeof rows[0]; r++) {
        const resolve_row *x = &rows[r];
        prism_hybrid_problem p;
        prism_hybrid_problem_defaults(&p);
        p.classes = x->classes;
        p.class_count = x->count;
        p.fixed_given = x->fixed_given;
        p.low_format = x->low;
        prism_hybrid_class_formats fm[4];
        prism_error err = {0};
        prism_status st = prism_hybrid_resolve(&p, fm, &err);
        if (st != x->status)
            fprintf(stderr, "%s: status %d (%s)\n", x->what, st, err.message);
        CU_ASSERT_EQUAL(st, x->status);
        if (x->message) {
            CU_ASSERT_STRING_EQUAL(err.message, x->message);
            continue;
        }
        for (size_t k = 0; k < x->count; k++) {
            CU_ASSERT_EQUAL(fm[k].high, x->expected[k].high);
            CU_ASSERT_EQUAL(fm[k].low, x->expected[k].low);
            CU_ASSERT_EQUAL(fm[k].fixed, x->expected[k].fixed);
        }
    }
}

typedef struct raise_expect {
    size_t class_index, block;
    double delta;
    bool accepted;
    prism_hybrid_reason reason;
} raise_expect;

static void check_raises(const prism_hybrid_result *res, const raise_expect *want, size_t n)
{
    CU_ASSERT_EQUAL_FATAL(res->raise_count, n);
    for (size_t r = 0; r < n; r++) {
        CU_ASSERT_EQUAL(res->raises[r].class_index, want[r].class_index);
        CU_ASSERT_EQUAL(res->raises[r].block, want[r].block);
        CU_ASSERT_EQUAL(res->raises[r].delta, want[r].delta);
        CU_ASSERT_EQUAL(res->raises[r].accepted, want[r].accepted);
        CU_ASSERT_EQUAL(res->raises[r].reason, want[r].reason);
    }
}

static void test_raises_by_delta_kept_when_they_fit_and_refused_for_memory_and_time(void)
{
    prism_hybrid_problem p = example();
    prism_hybrid_result res;
    prism_error err;
    CU_ASSERT_FATAL(prism_hybrid_plan(&p, &res, &err) == PRISM_OK);
    CU_ASSERT_EQUAL(res.start_seconds, 21.0);
    CU_ASSERT_EQUAL(res.iteration_seconds, 20.75);
    /* block 0: 80 > 52 bytes; block 1: 52 <= 52 and 20.75 <= 21; block 2: 21.25 > 21 */
    const raise_expect want[] = {
        {1, 0, 1584 - 1540 * P14, false, PRISM_HYBRID_MEMORY},
        {1, 1, 138.6875 - 176 * P14, true, PRISM_HYBRID_OK},
        {1, 2, 1.5234375 - 168 * P14, false, PRISM_HYBRID_TIME},
    };
    check_raises(&res, want, 3);
    const prism_hybrid_format plan[6] = {BF, BF, BF, I8, BF, I8};
    CU_ASSERT_EQUAL(memcmp(res.plan, plan, sizeof plan), 0);
    CU_ASSERT_EQUAL(res.indicator, 1584 + 176 * P14 + 1.5234375);
    CU_ASSERT_EQUAL(res.memory_bytes[0], 84.0);
    CU_ASSERT_EQUAL(res.memory_bytes[1], 52.0);
    CU_ASSERT_EQUAL(res.budget_bytes[1], 52.0);
    CU_ASSERT_EQUAL(res.compute_seconds[0], 2.625);
    CU_ASSERT_EQUAL(res.compute_seconds[1], 18.5);
    CU_ASSERT(res.formats[0].fixed && !res.formats[1].fixed);
    CU_ASSERT_EQUAL(res.uniform_low.iteration_seconds, 21.0);
    CU_ASSERT_EQUAL(res.uniform_low.indicator, 1584 + 138.6875 + 1.5234375);
    CU_ASSERT_TRUE(res.uniform_low.fits);
    CU_ASSERT_EQUAL(res.uniform_high.iteration_seconds, 23.25);
    CU_ASSERT_EQUAL(res.uniform_high.indicator, 1884 * P14);
    CU_ASSERT_FALSE(res.uniform_high.fits);
    prism_hybrid_result_free(&res);
}

static void test_force_bf16_blocks_start_high_and_are_never_tried(void)
{
    prism_hybrid_problem p = example();
    const bool force[3] = {false, true, false};
    p.force_high = force;
    prism_hybrid_result res;
    prism_error err;
    CU_ASSERT_FATAL(prism_hybrid_plan(&p, &res, &err) == PRISM_OK);
    CU_ASSERT_EQUAL(res.start_seconds, 20.75);
    const raise_expect want[] = {
        {1, 0, 1584 - 1540 * P14, false, PRISM_HYBRID_MEMORY},
        {1, 2, 1.5234375 - 168 * P14, false, PRISM_HYBRID_TIME},
    };
    check_raises(&res, want, 2);
    /* uniform_low ignores the forced blocks */
    CU_ASSERT_EQUAL(res.uniform_low.iteration_seconds, 21.0);
    prism_hybrid_result_free(&res);
}

static void test_delta_ties_go_by_class_name_then_block_id(void)
{
    /* Two identical non-fixed classes "b" and "a" (file order b, a) and a fixed "fast". Block 0
     * has zero statistics: omega 0 in every format, delta 0. Block 1 (C's statistics, depth 2 of
     * 2, gamma 4): omega = 2 bwd: int8 65/64, bf16 112 * 2^-14. */
    const prism_hybrid_block blocks[2] = {
        {8, 8, 8, 4, stats(0, 0, 1, 0, 0, 1, 0, 0, 1)},
        {8, 8, 8, 4, STATS_C},
    };
    const prism_hybrid_class classes[3] = {
        {"b", 1024, 8, 0, 32, 0, 0, 0, false},
        {"fast", 1024, 64, 0, 128, 0, 0, 0, false},
        {"a", 1024, 8, 0, 32, 0, 0, 0, false},
    };
    prism_hybrid_problem p;
    prism_hybrid_problem_defaults(&p);
    p.blocks = blocks;
    p.block_count = 2;
    p.classes = classes;
    p.class_count = 3;
    p.link_bytes_per_second = 1;
    prism_hybrid_result res;
    prism_error err;
    CU_ASSERT_FATAL(prism_hybrid_plan(&p, &res, &err) == PRISM_OK);
    double d1 = 65.0 / 64.0 - 112 * P14;
    /* int8 fwd 8/32 = 0.25 < bf16's 1: every raise costs time */
    const raise_expect want[] = {
        {2, 1, d1, false, PRISM_HYBRID_TIME}, {0, 1, d1, false, PRISM_HYBRID_TIME},
        {2, 0, 0, false, PRISM_HYBRID_TIME},  {0, 0, 0, false, PRISM_HYBRID_TIME},
    };
    check_raises(&res, want, 4);
    prism_hybrid_result_free(&res);
}

static void test_start_over_budget_is_refused_naming_the_class(void)
{
    prism_hybrid_problem p = example();
    example_classes[1].memory_bytes = 47;
    p.memory_fraction = 1;
    prism_hybrid_result res;
    prism_error err;
    CU_ASSERT_EQUAL(prism_hybrid_plan(&p, &res, &err), PRISM_ERR_LIMIT);
    CU_ASSERT_EQUAL(res.refused_class, 1);
    CU_ASSERT_EQUAL(res.refused_bytes, 48.0);
    CU_ASSERT_EQUAL(res.refused_budget, 47.0);
    CU_ASSERT_PTR_NULL(res.plan);
    CU_ASSERT_STRING_EQUAL(err.message, "class \"t4\" does not fit: its start needs 48 bytes, its budget is 47 bytes");
    /* exactly at the budget fits */
    example_classes[1].memory_bytes = 48;
    CU_ASSERT_EQUAL(prism_hybrid_plan(&p, &res, &err), PRISM_OK);
    prism_hybrid_result_free(&res);
}

static void test_fixed_classes_memory_is_not_checked_and_all_fixed_means_all_high(void)
{
    prism_hybrid_problem p = example();
    example_classes[0].memory_bytes = 1; /* a100 needs 84 bytes: fixed, so not checked */
    prism_hybrid_result res;
    prism_error err;
    CU_ASSERT_FATAL(prism_hybrid_plan(&p, &res, &err) == PRISM_OK);
    CU_ASSERT_EQUAL(res.iteration_seconds, 20.75);
    prism_hybrid_result_free(&res);

    p = example();
    example_classes[0].fixed = example_classes[1].fixed = true;
    p.fixed_given = true;
    CU_ASSERT_FATAL(prism_hybrid_plan(&p, &res, &err) == PRISM_OK);
    CU_ASSERT_EQUAL(res.raise_count, 0);
    CU_ASSERT_EQUAL(res.start_seconds, 23.25);
    CU_ASSERT_EQUAL(res.iteration_seconds, 23.25);
    CU_ASSERT_EQUAL(res.indicator, 0.0);
    for (size_t i = 0; i < 6; i++)
        CU_ASSERT_EQUAL(res.plan[i], BF);
    CU_ASSERT_TRUE(res.uniform_low.fits);
    prism_hybrid_result_free(&res);
}

static void test_raise_within_the_relative_slack_of_1e_9_is_kept(void)
{
    /* One non-fixed class (fixed_classes []), one block of F 1, W 0, A 0: low fwd = 1/2 + q, high
     * fwd = 1/1, bwd 2/1 either way, no link time: T0 = 2.5 + q, the raise gives T = 3. q = 0.5:
     * T unchanged, kept. */
    const prism_hybrid_block blocks[1] = {{1, 0, 0, 0, STATS_A}};
    prism_hybrid_class classes[1] = {{"only", 1, 1, 0, 2, 0, 0.5, 0, false}};
    prism_hybrid_problem p;
    prism_hybrid_problem_defaults(&p);
    p.blocks = blocks;
    p.block_count = 1;
    p.classes = classes;
    p.class_count = 1;
    p.fixed_given = true;
    p.link_bytes_per_second = 1;
    prism_hybrid_result res;
    prism_error err;
    CU_ASSERT_FATAL(prism_hybrid_plan(&p, &res, &err) == PRISM_OK);
    CU_ASSERT_EQUAL(res.start_seconds, 3.0); /* fwd 1 + bwd 2/1 */
    CU_ASSERT_EQUAL_FATAL(res.raise_count, 1);
    CU_ASSERT_TRUE(res.raises[0].accepted);
    CU_ASSERT_EQUAL(res.plan[0], BF);
    prism_hybrid_result_free(&res);
    /* q = 0.5 - 2^-30: T0 = 3 - 2^-30, T0 (1 + 1e-9) = 3 + 2.07e-9 >= 3: kept. */
    classes[0].quantize_fixed_seconds = 0.5 - 1.0 / 1073741824.0;
    CU_ASSERT_FATAL(prism_hybrid_plan(&p, &res, &err) == PRISM_OK);
    CU_ASSERT_TRUE(res.raises[0].accepted);
    prism_hybrid_result_free(&res);
    /* q = 0.5 - 2^-28: T0 (1 + 1e-9) = 3 - 3.73e-9 + 3e-9 < 3: refused for time. */
    classes[0].quantize_fixed_seconds = 0.5 - 1.0 / 268435456.0;
    CU_ASSERT_FATAL(prism_hybrid_plan(&p, &res, &err) == PRISM_OK);
    CU_ASSERT_FALSE(res.raises[0].accepted);
    CU_ASSERT_EQUAL(res.raises[0].reason, PRISM_HYBRID_TIME);
    prism_hybrid_result_free(&res);
}

static void test_format_and_reason_names(void)
{
    CU_ASSERT_STRING_EQUAL(prism_hybrid_format_name(PRISM_HYBRID_BF16), "bf16");
    CU_ASSERT_STRING_EQUAL(prism_hybrid_format_name(PRISM_HYBRID_FP16), "fp16");
    CU_ASSERT_STRING_EQUAL(prism_hybrid_format_name(PRISM_HYBRID_INT8), "int8");
    CU_ASSERT_STRING_EQUAL(prism_hybrid_format_name(PRISM_HYBRID_FP8_E4M3), "fp8_e4m3");
    CU_ASSERT_EQUAL(prism_hybrid_mantissa_bits(PRISM_HYBRID_BF16), 7);
    CU_ASSERT_EQUAL(prism_hybrid_mantissa_bits(PRISM_HYBRID_FP16), 10);
    CU_ASSERT_EQUAL(prism_hybrid_mantissa_bits(PRISM_HYBRID_FP8_E4M3), 3);
    CU_ASSERT_STRING_EQUAL(prism_hybrid_reason_name(PRISM_HYBRID_OK), "ok");
    CU_ASSERT_STRING_EQUAL(prism_hybrid_reason_name(PRISM_HYBRID_MEMORY), "memory");
    CU_ASSERT_STRING_EQUAL(prism_hybrid_reason_name(PRISM_HYBRID_TIME), "time");
}

static const prism_test_case cases[] = {
    {"test_epsilon_is_the_frexp_exponent_and_zero_for_zero", test_epsilon_is_the_frexp_exponent_and_zero_for_zero},
    {"test_e_is_the_absolute_exponent_clamped_at_5", test_e_is_the_absolute_exponent_clamped_at_5},
    {"test_indicator_float_and_int8_formulas_with_depth_and_gamma",
     test_indicator_float_and_int8_formulas_with_depth_and_gamma},
    {"test_defaults", test_defaults},
    {"test_forward_and_backward_seconds_per_format", test_forward_and_backward_seconds_per_format},
    {"test_iteration_time_waits_for_the_slowest_class_and_the_previous_all_reduce",
     test_iteration_time_waits_for_the_slowest_class_and_the_previous_all_reduce},
    {"test_memory_counts_8_or_16_bit_activations_and_budget_is_fraction_of_memory",
     test_memory_counts_8_or_16_bit_activations_and_budget_is_fraction_of_memory},
    {"test_formats_and_fixed_classes_by_default_and_by_config",
     test_formats_and_fixed_classes_by_default_and_by_config},
    {"test_raises_by_delta_kept_when_they_fit_and_refused_for_memory_and_time",
     test_raises_by_delta_kept_when_they_fit_and_refused_for_memory_and_time},
    {"test_force_bf16_blocks_start_high_and_are_never_tried", test_force_bf16_blocks_start_high_and_are_never_tried},
    {"test_delta_ties_go_by_class_name_then_block_id", test_delta_ties_go_by_class_name_then_block_id},
    {"test_start_over_budget_is_refused_naming_the_class", test_start_over_budget_is_refused_naming_the_class},
    {"test_fixed_classes_memory_is_not_checked_and_all_fixed_means_all_high",
     test_fixed_classes_memory_is_not_checked_and_all_fixed_means_all_high},
    {"test_raise_within_the_relative_slack_of_1e_9_is_kept", test_raise_within_the_relative_slack_of_1e_9_is_kept},
    {"test_format_and_reason_names", test_format_and_reason_names},
    {NULL, NULL},
};

static const prism_test_suite suites[] = {{"hybrid", cases}, {NULL, NULL}};

int main(int argc, char **argv)
{
    return prism_test_main(argc, argv, suites);
}
