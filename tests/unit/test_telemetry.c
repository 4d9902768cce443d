/* Telemetry records of DESIGN 4.4: one JSON object per decision and line, parsed back with
 * jansson and checked field by field against values worked out by hand. Doubles must be the
 * shortest text that reads back exactly; NaN and Inf are written as null. */
#include "testutil.h"

#include "telemetry.h"

#include <jansson.h>
#include <math.h>
#include <float.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Thresholds exact in binary, a decision at every step, a window of one step, no cooldown. */
static const char *const EXACT =
    "{\"bf16_threshold\": 0.5, \"int8_threshold\": 0.25, \"hysteresis_margin\": 0.125,"
    " \"grad_sensitivity_threshold\": 2.0, \"warmup_steps\": 1, \"update_interval_steps\": 1,"
    " \"history_window\": 1, \"min_steps_between_switches\": 0}";

static prism_policy *make_policy(const char *extra)
{
    prism_config cfg;
    prism_error err;
    CU_ASSERT_FATAL(prism_config_init(&cfg, &err) == PRISM_OK);
    const char *texts[2] = {EXACT, extra};
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
    prism_policy *p = prism_policy_create(&cfg, &err);
    prism_config_free(&cfg);
    CU_ASSERT_FATAL(p != NULL);
    return p;
}

static void feed(prism_policy *p, uint64_t step, const double *l2, size_t count, prism_step_result *out)
{
    prism_block_stats blocks[64];
    CU_ASSERT_FATAL(count <= 64);
    for (size_t i = 0; i < count; i++) {
        prism_block_stats s = {(uint32_t)i, l2[i], 1.0, 0.0, 0.25, 1000, 0, false, 0, 0};
        blocks[i] = s;
    }
    prism_error err;
    prism_status st = prism_policy_add_step(p, step, NULL, blocks, count, out, &err);
    if (st)
        fprintf(stderr, "add_step: %s\n", err.message);
    CU_ASSERT_FATAL(st == PRISM_OK);
}

/* Writes the record of r and parses it back; checks it is exactly one line. */
static json_t *record(const prism_policy *p, const prism_step_result *r, double timestamp)
{
    CU_ASSERT_FATAL(r->decided);
    prism_buf b = {NULL, 0, 0};
    CU_ASSERT_FATAL(prism_telemetry_append(&b, p, &r->summary, timestamp, NULL) == PRISM_OK);
    CU_ASSERT_FATAL(b.len > 0);
    CU_ASSERT_EQUAL(b.data[b.len - 1], '\n');
    CU_ASSERT_PTR_NULL(memchr(b.data, '\n', b.len - 1));
    json_error_t jerr;
    json_t *obj = json_loadb(b.data, b.len, JSON_REJECT_DUPLICATES, &jerr);
    if (!obj)
        fprintf(stderr, "record does not parse: %s\n%.*s\n", jerr.text, (int)b.len, b.data);
    CU_ASSERT_FATAL(obj != NULL);
    CU_ASSERT_FATAL(json_is_object(obj));
    prism_buf_free(&b);
    return obj;
}

static double num(const json_t *obj, const char *key)
{
    const json_t *v = json_object_get(obj, key);
    if (!json_is_number(v))
        fprintf(stderr, "%s: not a number\n", key);
    CU_ASSERT_FATAL(json_is_number(v));
    return json_number_value(v);
}

static json_int_t integer(const json_t *obj, const char *key)
{
    const json_t *v = json_object_get(obj, key);
    if (!json_is_integer(v))
        fprintf(stderr, "%s: not an integer\n", key);
    CU_ASSERT_FATAL(json_is_integer(v));
    return json_integer_value(v);
}

static const char *str(const json_t *obj, const char *key)
{
    const json_t *v = json_object_get(obj, key);
    CU_ASSERT_FATAL(json_is_string(v));
    return json_string_value(v);
}

static bool is_null(const json_t *obj, const char *key)
{
    const json_t *v = json_object_get(obj, key);
    return v != NULL && json_is_null(v);
}

static const json_t *details_of(const json_t *rec, const char *id)
{
    const json_t *details = json_object_get(rec, "block_details");
    CU_ASSERT_FATAL(json_is_object(details));
    const json_t *d = json_object_get(details, id);
    if (!json_is_object(d))
        fprintf(stderr, "block_details has no \"%s\"\n", id);
    CU_ASSERT_FATAL(json_is_object(d));
    return d;
}

/* ---- buffers and doubles ---- */

static char *double_text(double x)
{
    prism_buf b = {NULL, 0, 0};
    CU_ASSERT_FATAL(prism_buf_append_double(&b, x) == PRISM_OK);
    char *s = malloc(b.len + 1);
    CU_ASSERT_FATAL(s != NULL);
    memcpy(s, b.data, b.len);
    s[b.len] = '\0';
    prism_buf_free(&b);
    return s;
}

static void test_double_is_written_as_shortest_exact_text(void)
{
    static const struct {
        double x;
        const char *want;
    } cases[] = {
        {0.3, "0.3"},
        {0.1 + 0.2, "0.30000000000000004"},
        {0.5, "0.5"},
        {0.125, "0.125"},
        {30.2, "30.2"},
        {-2.5, "-2.5"},
        {0.6, "0.6"},
        {0.7 * 0.5 + 0.3 * 0.5, NULL}, /* round trip only */
        {1.0 / 3.0, "0.3333333333333333"},
        {DBL_MAX, NULL},
        {DBL_MIN, NULL},
        {5e-324, "5e-324"}, /* subnormal: shortest is one digit */
        {123456789.125, "123456789.125"},
        {1e21, NULL},
        {1700000000.25, "1700000000.25"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char *s = double_text(cases[i].x);
        if (cases[i].want && strcmp(s, cases[i].want) != 0)
            fprintf(stderr, "case %zu: \"%s\", want \"%s\"\n", i, s, cases[i].want);
        if (cases[i].want) {
            CU_ASSERT_STRING_EQUAL(s, cases[i].want);
        }
        CU_ASSERT_EQUAL(strtod(s, NULL), cases[i].x);
        /* Valid JSON: parses with jansson to the same value. */
        json_error_t jerr;
        json_t *v = json_loads(s, JSON_DECODE_ANY, &jerr);
        CU_ASSERT_FATAL(v != NULL);
        CU_ASSERT_EQUAL(json_number_value(v), cases[i].x);
        json_decref(v);
        free(s);
    }
    /* Integral values read back exactly too (as text "2" or "2.0"). */
    char *s = double_text(2.0);
    CU_ASSERT_EQUAL(strtod(s, NULL), 2.0);
    free(s);
}

static void test_nonfinite_doubles_are_written_as_null(void)
{
    static const double xs[] = {NAN, INFINITY, -INFINITY};
    for (size_t i = 0; i < 3; i++) {
        char *s = double_text(xs[i]);
        CU_ASSERT_STRING_EQUAL(s, "null");
        free(s);
    }
}

static void test_buf_append_grows_and_keeps_every_byte(void)
{
    prism_buf b = {NULL, 0, 0};
    char want[5000];
    size_t n = 0;
    for (int i = 0; i < 500; i++) {
        char piece[16];
        int len = snprintf(piece, sizeof piece, "%d,", i);
        CU_ASSERT_FATAL(prism_buf_append(&b, piece, (size_t)len) == PRISM_OK);
        memcpy(want + n, piece, (size_t)len);
        n += (size_t)len;
    }
    CU_ASSERT_EQUAL_FATAL(b.len, n);
    CU_ASSERT_TRUE(b.cap >= b.len);
    CU_ASSERT_EQUAL(memcmp(b.data, want, n), 0);
    prism_buf_free(&b);
    CU_ASSERT_PTR_NULL(b.data);
}

/* ---- records ---- */

static void test_record_has_every_field_with_exact_values(void)
{
    /* l2 0, 1, 1, 2: mean 1, rel 0, 1, 1, 2; grad_score 0, 0.5, 0.5, 1.
     * Block 1 has a calibration error 0.0125 (error_score 0.25) and weights 0.5/0.5:
     * s = 0.25 + 0.125 = 0.375 (ambiguous: bf16). s = 0, 0.375, 0.5, 1 -> int8, bf16, bf16, bf16.
     * mean 1.875 / 4 = 0.46875, max 1, min 0; one change; saving 100 * 0.5 / 4 = 12.5. */
    prism_policy *p = make_policy("{\"grad_weight\": 0.5, \"error_weight\": 0.5, \"apply_lag_steps\": 2}");
    prism_error err;
    CU_ASSERT_EQUAL(prism_policy_set_calibration(p, PRISM_PRECISION_INT8, 1, 0.0125, &err), PRISM_OK);
    double l2[4] = {0.0, 1.0, 1.0, 2.0};
    prism_step_result r;
    feed(p, 42, l2, 4, &r);
    CU_ASSERT_EQUAL(r.effective_step, 44);
    json_t *rec = record(p, &r, 1700000000.25);
    CU_ASSERT_EQUAL(integer(rec, "step_id"), 42);
    CU_ASSERT_EQUAL(num(rec, "timestamp"), 1700000000.25);
    CU_ASSERT_EQUAL(integer(rec, "blocks_bf16"), 3);
    CU_ASSERT_EQUAL(integer(rec, "blocks_int8"), 1);
    CU_ASSERT_EQUAL(num(rec, "mean_sensitivity"), 0.46875);
    CU_ASSERT_EQUAL(num(rec, "max_sensitivity"), 1.0);
    CU_ASSERT_EQUAL(num(rec, "min_sensitivity"), 0.0);
    CU_ASSERT_EQUAL(integer(rec, "precision_changes"), 1);
    CU_ASSERT_EQUAL(num(rec, "estimated_bandwidth_saving_pct"), 12.5);
    CU_ASSERT_STRING_EQUAL(str(rec, "low_precision"), "int8");
    CU_ASSERT_EQUAL(integer(rec, "map_version"), 1);
    const json_t *details = json_object_get(rec, "block_details");
    CU_ASSERT_FATAL(json_is_object(details));
    CU_ASSERT_EQUAL(json_object_size(details), 4);
    static const struct {
        const char *id;
        const char *precision;
        double sensitivity, grad_score, relative_magnitude;
        bool has_error;
        double error_score;
    } want[] = {
        {"0", "int8", 0.0, 0.0, 0.0, false, 0},
        {"1", "bf16", 0.375, 0.5, 1.0, true, 0.25},
        {"2", "bf16", 0.5, 0.5, 1.0, false, 0},
        {"3", "bf16", 1.0, 1.0, 2.0, false, 0},
    };
    for (size_t i = 0; i < 4; i++) {
        const json_t *d = details_of(rec, want[i].id);
        CU_ASSERT_STRING_EQUAL(str(d, "precision"), want[i].precision);
        CU_ASSERT_EQUAL(num(d, "sensitivity"), want[i].sensitivity);
        CU_ASSERT_EQUAL(num(d, "grad_score"), want[i].grad_score);
        CU_ASSERT_EQUAL(num(d, "relative_magnitude"), want[i].relative_magnitude);
        if (want[i].has_error) {
            CU_ASSERT_EQUAL(num(d, "error_score"), want[i].error_score);
        } else {
            CU_ASSERT_TRUE(is_null(d, "error_score"));
        }
    }
    json_decref(rec);
    prism_policy_destroy(p);
}

static void test_sensitivities_are_null_when_no_block_has_a_score(void)
{
    prism_policy *p = make_policy("{\"mode\": \"off\", \"force_int8_blocks\": [1]}");
    double l2[2] = {1.0, 3.0};
    prism_step_result r;
    feed(p, 1, l2, 2, &r);
    json_t *rec = record(p, &r, 10.5);
    CU_ASSERT_TRUE(is_null(rec, "mean_sensitivity"));
    CU_ASSERT_TRUE(is_null(rec, "max_sensitivity"));
    CU_ASSERT_TRUE(is_null(rec, "min_sensitivity"));
    CU_ASSERT_EQUAL(integer(rec, "blocks_bf16"), 1);
    CU_ASSERT_EQUAL(integer(rec, "blocks_int8"), 1);
    CU_ASSERT_EQUAL(num(rec, "estimated_bandwidth_saving_pct"), 25.0);
    static const char *const ids[] = {"0", "1"};
    static const char *const precisions[] = {"bf16", "int8"};
    for (size_t i = 0; i < 2; i++) {
        const json_t *d = details_of(rec, ids[i]);
        CU_ASSERT_STRING_EQUAL(str(d, "precision"), precisions[i]);
        CU_ASSERT_TRUE(is_null(d, "sensitivity"));
        CU_ASSERT_TRUE(is_null(d, "grad_score"));
        CU_ASSERT_TRUE(is_null(d, "error_score"));
        CU_ASSERT_TRUE(is_null(d, "relative_magnitude"));
    }
    json_decref(rec);
    prism_policy_destroy(p);
}

static void test_sensitivity_figures_skip_blocks_without_a_score(void)
{
    /* Block 2 only ever reports non-finite steps: no score, null details; the figures are over
     * blocks 0 and 1 (l2 0.25 and 0.75: s 0.25 and 0.75). */
    prism_policy *p = make_policy(NULL);
    prism_block_stats blocks[3] = {
        {0, 0.25, 1.0, 0.0, 0.25, 100, 0, false, 0, 0}, {1, 0.75, 1.0, 0.0, 0.25, 100, 0, false, 0, 0}, {2, NAN, 1.0, 0.0, 0.25, 100, 3, false, 0, 0}};
    prism_step_result r;
    prism_error err;
    CU_ASSERT_FATAL(prism_policy_add_step(p, 5, NULL, blocks, 3, &r, &err) == PRISM_OK);
    json_t *rec = record(p, &r, 0.0);
    CU_ASSERT_EQUAL(num(rec, "mean_sensitivity"), 0.5);
    CU_ASSERT_EQUAL(num(rec, "max_sensitivity"), 0.75);
    CU_ASSERT_EQUAL(num(rec, "min_sensitivity"), 0.25);
    const json_t *d = details_of(rec, "2");
    CU_ASSERT_STRING_EQUAL(str(d, "precision"), "bf16");
    CU_ASSERT_TRUE(is_null(d, "sensitivity"));
    CU_ASSERT_TRUE(is_null(d, "relative_magnitude"));
    json_decref(rec);
    prism_policy_destroy(p);
}

static void test_record_of_29_of_48_int8_blocks_saves_30_2_percent(void)
{
    char cfg[512];
    int used = snprintf(cfg, sizeof cfg, "{\"mode\": \"static\", \"warmup_steps\": 2, \"force_int8_blocks\": [");
    for (int i = 0; i < 29; i++)
        used += snprintf(cfg + used, sizeof cfg - (size_t)used, "%s%d", i ? "," : "", i);
    snprintf(cfg + used, sizeof cfg - (size_t)used, "]}");
    prism_policy *p = make_policy(cfg);
    double l2[48];
    for (int i = 0; i < 48; i++)
        l2[i] = 1.0;
    prism_step_result r;
    feed(p, 1, l2, 48, &r);
    CU_ASSERT_FALSE(r.decided);
    CU_ASSERT_EQUAL(r.map_version, 1); /* the forced blocks' first report */
    feed(p, 2, l2, 48, &r);
    json_t *rec = record(p, &r, 1.0);
    CU_ASSERT_EQUAL(integer(rec, "blocks_int8"), 29);
    CU_ASSERT_EQUAL(integer(rec, "blocks_bf16"), 19);
    CU_ASSERT_EQUAL(num(rec, "estimated_bandwidth_saving_pct"), 30.2);
    CU_ASSERT_EQUAL(integer(rec, "precision_changes"), 0);
    CU_ASSERT_EQUAL(integer(rec, "map_version"), 1);
    CU_ASSERT_EQUAL(json_object_size(json_object_get(rec, "block_details")), 48);
    /* Scores are computed in static mode: rel 1, grad_score 0.5. */
    CU_ASSERT_EQUAL(num(rec, "mean_sensitivity"), 0.5);
    CU_ASSERT_EQUAL(num(details_of(rec, "47"), "relative_magnitude"), 1.0);
    CU_ASSERT_STRING_EQUAL(str(details_of(rec, "28"), "precision"), "int8");
    CU_ASSERT_STRING_EQUAL(str(details_of(rec, "29"), "precision"), "bf16");
    json_decref(rec);
    prism_policy_destroy(p);
}

static void test_record_weights_saving_by_bf16_bytes(void)
{
    /* Blocks 0 and 3 low; bytes 100, 100, 200, 600: 100 * 700 * 0.5 / 1000 = 35. */
    prism_policy *p = make_policy("{\"mode\": \"static\", \"warmup_steps\": 2, \"force_int8_blocks\": [0, 3]}");
    double l2[4] = {1.0, 1.0, 1.0, 1.0};
    prism_step_result r;
    feed(p, 1, l2, 4, &r);
    static const uint64_t bytes[4] = {100, 100, 200, 600};
    prism_error err;
    for (uint32_t id = 0; id < 4; id++)
        CU_ASSERT_EQUAL(prism_policy_set_block_bytes(p, id, bytes[id], &err), PRISM_OK);
    feed(p, 2, l2, 4, &r);
    json_t *rec = record(p, &r, 1.0);
    CU_ASSERT_EQUAL(num(rec, "estimated_bandwidth_saving_pct"), 35.0);
    json_decref(rec);
    prism_policy_destroy(p);
}

static void test_record_of_int4_and_fp8_low_formats(void)
{
    static const struct {
        const char *format;
        double saving;
    } cases[] = {{"int4", 37.5}, {"fp8_e4m3", 25.0}, {"fp8_e5m2", 25.0}, {"int8", 25.0}};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char cfg[256];
        snprintf(cfg, sizeof cfg, "{\"mode\": \"static\", \"force_int8_blocks\": [1, 2], \"low_precision\": \"%s\"}",
                 cases[i].format);
        prism_policy *p = make_policy(cfg);
        double l2[4] = {1.0, 1.0, 1.0, 1.0};
        prism_step_result r;
        feed(p, 1, l2, 4, &r);
        json_t *rec = record(p, &r, 1.0);
        CU_ASSERT_STRING_EQUAL(str(rec, "low_precision"), cases[i].format);
        CU_ASSERT_EQUAL(integer(rec, "blocks_int8"), 2);
        CU_ASSERT_EQUAL(integer(rec, "blocks_bf16"), 2);
        CU_ASSERT_EQUAL(num(rec, "estimated_bandwidth_saving_pct"), cases[i].saving);
        CU_ASSERT_STRING_EQUAL(str(details_of(rec, "1"), "precision"), cases[i].format);
        CU_ASSERT_STRING_EQUAL(str(details_of(rec, "0"), "precision"), "bf16");
        json_decref(rec);
        prism_policy_destroy(p);
    }
}

static void test_record_is_written_for_a_decision_without_change(void)
{
    prism_policy *p = make_policy(NULL);
    double l2[2] = {0.0, 1.0}; /* block 0 int8 at the first decision, then nothing changes */
    prism_step_result r;
    feed(p, 1, l2, 2, &r);
    json_t *rec = record(p, &r, 1.0);
    CU_ASSERT_EQUAL(integer(rec, "precision_changes"), 1);
    CU_ASSERT_EQUAL(integer(rec, "map_version"), 1);
    json_decref(rec);
    feed(p, 2, l2, 2, &r);
    CU_ASSERT_TRUE(r.decided);
    CU_ASSERT_FALSE(r.map_changed);
    rec = record(p, &r, 2.0);
    CU_ASSERT_EQUAL(integer(rec, "step_id"), 2);
    CU_ASSERT_EQUAL(integer(rec, "precision_changes"), 0);
    CU_ASSERT_EQUAL(integer(rec, "map_version"), 1);
    CU_ASSERT_EQUAL(integer(rec, "blocks_int8"), 1);
    CU_ASSERT_EQUAL(num(rec, "timestamp"), 2.0);
    json_decref(rec);
    prism_policy_destroy(p);
}

static void test_records_append_one_line_each(void)
{
    prism_policy *p = make_policy(NULL);
    double l2[2] = {0.5, 0.5};
    prism_buf b = {NULL, 0, 0};
    for (uint64_t step = 1; step <= 3; step++) {
        prism_step_result r;
        feed(p, step, l2, 2, &r);
        CU_ASSERT_FATAL(prism_telemetry_append(&b, p, &r.summary, (double)step, NULL) == PRISM_OK);
    }
    size_t lines = 0;
    const char *start = b.data;
    for (size_t i = 0; i < b.len; i++) {
        if (b.data[i] != '\n')
            continue;
        json_error_t jerr;
        json_t *rec = json_loadb(start, (size_t)(b.data + i - start), 0, &jerr);
        CU_ASSERT_FATAL(rec != NULL);
        CU_ASSERT_EQUAL(integer(rec, "step_id"), (json_int_t)(lines + 1));
        json_decref(rec);
        lines++;
        start = b.data + i + 1;
    }
    CU_ASSERT_EQUAL(lines, 3);
    CU_ASSERT_EQUAL(start, b.data + b.len);
    prism_buf_free(&b);
    prism_policy_destroy(p);
}

static void test_record_of_per_block_formats_counts_each_precision(void)
{
    /* EXACT thresholds (bf16 0.5, int8 0.25), weights 0.5/0.5, low_precision auto over
     * [int4, fp8_e4m3, int8], quant_error_threshold 0.0625. l2 0, 0, 0, 4: mean 1, rel 0, 0, 0,
     * 4, grad_score 0, 0, 0, 1.
     *   block 0: int4 error 0.015625 <= 0.0625: candidate int4, error_score 0.25,
     *            s = 0.5 * 0 + 0.5 * 0.25 = 0.125 < 0.25: int4
     *   block 1: int4 0.125 > 0.0625, fp8_e4m3 0.0078125: candidate fp8_e4m3, error_score
     *            0.125, s = 0.0625: fp8_e4m3
     *   block 2: no calibration: candidate int8 (the last), s = 0: int8
     *   block 3: s = 1: bf16
     * blocks_by_precision bf16 1, int8 1, fp8_e4m3 1, fp8_e5m2 0, int4 1; blocks_int8 3;
     * saving (0.75 + 0.5 + 0.5 + 0) / 4 = 0.4375: 43.75, rounded half away from zero 43.8.
     * Block 0 reported saturation figures 0.25 / 0.125: its details carry them, no other's do. */
    prism_policy *p = make_policy("{\"grad_weight\": 0.5, \"error_weight\": 0.5, \"low_precision\": \"auto\","
                                  " \"quant_error_threshold\": 0.0625, \"low_formats\": [\"int4\", \"fp8_e4m3\", \"int8\"]}");
    prism_error err;
    CU_ASSERT_EQUAL(prism_policy_set_calibration(p, PRISM_PRECISION_INT4, 0, 0.015625, &err), PRISM_OK);
    CU_ASSERT_EQUAL(prism_policy_set_calibration(p, PRISM_PRECISION_INT4, 1, 0.125, &err), PRISM_OK);
    CU_ASSERT_EQUAL(prism_policy_set_calibration(p, PRISM_PRECISION_FP8_E4M3, 1, 0.0078125, &err), PRISM_OK);
    prism_block_stats blocks[4] = {
        {0, 0.0, 1.0, 0.0, 0.25, 100, 0, true, 0.25, 0.125}, {1, 0.0, 1.0, 0.0, 0.25, 100, 0, false, 0, 0},
        {2, 0.0, 1.0, 0.0, 0.25, 100, 0, false, 0, 0}, {3, 4.0, 1.0, 0.0, 0.25, 100, 0, false, 0, 0}};
    prism_step_result r;
    double loss = 2.5;
    CU_ASSERT_FATAL(prism_policy_add_step(p, 3, &loss, blocks, 4, &r, &err) == PRISM_OK);
    CU_ASSERT_TRUE_FATAL(r.decided);
    json_t *rec = record(p, &r, 1.5);
    CU_ASSERT_STRING_EQUAL(str(rec, "low_precision"), "auto");
    CU_ASSERT_EQUAL(integer(rec, "blocks_bf16"), 1);
    CU_ASSERT_EQUAL(integer(rec, "blocks_int8"), 3);
    CU_ASSERT_EQUAL(num(rec, "estimated_bandwidth_saving_pct"), 43.8);
    CU_ASSERT_TRUE(json_is_false(json_object_get(rec, "loss_spike")));
    const json_t *by = json_object_get(rec, "blocks_by_precision");
    CU_ASSERT_FATAL(json_is_object(by));
    CU_ASSERT_EQUAL(json_object_size(by), 5);
    CU_ASSERT_EQUAL(integer(by, "bf16"), 1);
    CU_ASSERT_EQUAL(integer(by, "int8"), 1);
    CU_ASSERT_EQUAL(integer(by, "fp8_e4m3"), 1);
    CU_ASSERT_EQUAL(integer(by, "fp8_e5m2"), 0);
    CU_ASSERT_EQUAL(integer(by, "int4"), 1);
    static const char *const precisions[] = {"int4", "fp8_e4m3", "int8", "bf16"};
    static const char *const ids[] = {"0", "1", "2", "3"};
    for (size_t i = 0; i < 4; i++)
        CU_ASSERT_STRING_EQUAL(str(details_of(rec, ids[i]), "precision"), precisions[i]);
    CU_ASSERT_EQUAL(num(details_of(rec, "0"), "error_score"), 0.25);
    CU_ASSERT_EQUAL(num(details_of(rec, "1"), "error_score"), 0.125);
    CU_ASSERT_TRUE(is_null(details_of(rec, "2"), "error_score"));
    CU_ASSERT_EQUAL(num(details_of(rec, "0"), "saturated_fraction"), 0.25);
    CU_ASSERT_EQUAL(num(details_of(rec, "0"), "underflowed_fraction"), 0.125);
    CU_ASSERT_PTR_NULL(json_object_get(details_of(rec, "1"), "saturated_fraction"));
    CU_ASSERT_PTR_NULL(json_object_get(details_of(rec, "1"), "underflowed_fraction"));
    /* The key order of the record: blocks_by_precision and loss_spike after block_details, last. */
    prism_buf b = {0};
    CU_ASSERT_EQUAL_FATAL(prism_telemetry_append(&b, p, &r.summary, 1.5, NULL), PRISM_OK);
    CU_ASSERT_PTR_NOT_NULL(strstr(b.data, ",\"map_version\":1,\"block_details\":{"));
    CU_ASSERT_PTR_NOT_NULL(strstr(b.data, "}},\"blocks_by_precision\":{\"bf16\":1,\"int8\":1,\"fp8_e4m3\":1,"
                                          "\"fp8_e5m2\":0,\"int4\":1},\"loss_spike\":false}\n"));
    prism_buf_free(&b);
    json_decref(rec);
    prism_policy_destroy(p);
}

static const prism_test_case cases[] = {
    {"test_double_is_written_as_shortest_exact_text", test_double_is_written_as_shortest_exact_text},
    {"test_nonfinite_doubles_are_written_as_null", test_nonfinite_doubles_are_written_as_null},
    {"test_buf_append_grows_and_keeps_every_byte", test_buf_append_grows_and_keeps_every_byte},
    {"test_record_has_every_field_with_exact_values", test_record_has_every_field_with_exact_values},
    {"test_sensitivities_are_null_when_no_block_has_a_score", test_sensitivities_are_null_when_no_block_has_a_score},
    {"test_sensitivity_figures_skip_blocks_without_a_score", test_sensitivity_figures_skip_blocks_without_a_score},
    {"test_record_of_29_of_48_int8_blocks_saves_30_2_percent",
     test_record_of_29_of_48_int8_blocks_saves_30_2_percent},
    {"test_record_weights_saving_by_bf16_bytes", test_record_weights_saving_by_bf16_bytes},
    {"test_record_of_int4_and_fp8_low_formats", test_record_of_int4_and_fp8_low_formats},
    {"test_record_is_written_for_a_decision_without_change", test_record_is_written_for_a_decision_without_change},
    {"test_records_append_one_line_each", test_records_append_one_line_each},
    {"test_record_of_per_block_formats_counts_each_precision",
     test_record_of_per_block_formats_counts_each_precision},
    {NULL, NULL},
};

static const prism_test_suite suites[] = {{"telemetry", cases}, {NULL, NULL}};

int main(int argc, char **argv)
{
    return prism_test_main(argc, argv, suites);
}
