/* `prismctl replay` end to end: the real binary, real files, exact telemetry values. */
#include "testutil.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define TS "1700000000.5"

/* Runs prismctl replay with the given config text (NULL: none) and trace text. */
static prism_proc_result replay(const char *config, const char *trace, const char *extra1, const char *extra2)
{
    const char *dir = prism_scratch_dir();
    char trace_path[512], config_path[512];
    snprintf(trace_path, sizeof trace_path, "%s", prism_write_file(dir, "trace.jsonl", trace));
    char *argv[12];
    int n = 0;
    char bin[512];
    snprintf(bin, sizeof bin, "%s", prism_build_path("service/prismctl"));
    argv[n++] = bin;
    argv[n++] = "replay";
    argv[n++] = "--timestamp";
    argv[n++] = TS;
    if (config) {
        snprintf(config_path, sizeof config_path, "%s", prism_write_file(dir, "cfg.json", config));
        argv[n++] = "--config";
        argv[n++] = config_path;
    }
    if (extra1)
        argv[n++] = (char *)extra1;
    if (extra2)
        argv[n++] = (char *)extra2;
    argv[n++] = trace_path;
    argv[n] = NULL;
    prism_proc_result res;
    CU_ASSERT_FATAL(prism_run_process(argv, NULL, 60, &res) == 0);
    return res;
}

/* Splits stdout into parsed JSON lines; returns the count. */
static size_t parse_lines(const char *out, json_t **lines, size_t max)
{
    size_t n = 0;
    const char *p = out;
    while (*p && n < max) {
        const char *nl = strchr(p, '\n');
        CU_ASSERT_FATAL(nl != NULL); /* every record ends with a newline */
        json_error_t jerr;
        lines[n] = json_loadb(p, (size_t)(nl - p), 0, &jerr);
        CU_ASSERT_FATAL(lines[n] != NULL);
        n++;
        p = nl + 1;
    }
    return n;
}

static void free_lines(json_t **lines, size_t n)
{
    for (size_t i = 0; i < n; i++)
        json_decref(lines[i]);
}

static double num(const json_t *obj, const char *key)
{
    const json_t *v = json_object_get(obj, key);
    CU_ASSERT_FATAL(v != NULL && json_is_number(v));
    return json_number_value(v);
}

static const json_t *block(const json_t *rec, const char *id)
{
    const json_t *d = json_object_get(json_object_get(rec, "block_details"), id);
    CU_ASSERT_FATAL(d != NULL);
    return d;
}

static const char *str(const json_t *obj, const char *key)
{
    const json_t *v = json_object_get(obj, key);
    CU_ASSERT_FATAL(v != NULL && json_is_string(v));
    return json_string_value(v);
}

/* Appends a step line with two blocks (ids 0 and 1) of the given l2 norms. */
static void add_step(char *buf, size_t cap, unsigned step, unsigned rank, double l2a, double l2b)
{
    size_t used = strlen(buf);
    snprintf(buf + used, cap - used,
             "{\"step\": %u, \"rank\": %u, \"blocks\": [{\"id\": 0, \"l2\": %g, \"max_abs\": 1, \"numel\": 100},"
             " {\"id\": 1, \"l2\": %g, \"max_abs\": 1, \"numel\": 100}]}\n",
             step, rank, l2a, l2b);
}

static const char *const small_config = "{\"warmup_steps\": 2, \"update_interval_steps\": 2, \"history_window\": 2}";

/* Block 0 has three times block 1's norm: rel 1.5 and 0.5, grad scores 0.75 and 0.25, so the
 * first decision (step 2) puts 0 in bf16 and 1 in int8. */
static void test_replay_prints_one_record_per_decision_with_exact_values(void)
{
    char trace[4096] = "";
    for (unsigned s = 1; s <= 4; s++)
        add_step(trace, sizeof trace, s, 0, 3, 1);
    prism_proc_result r = replay(small_config, trace, NULL, NULL);
    CU_ASSERT_EQUAL(r.exit_code, 0);
    json_t *lines[8];
    size_t n = parse_lines(r.out, lines, 8);
    CU_ASSERT_EQUAL_FATAL(n, 2);
    const json_t *first = lines[0];
    CU_ASSERT_EQUAL(num(first, "step_id"), 2);
    CU_ASSERT_EQUAL(num(first, "timestamp"), 1700000000.5);
    CU_ASSERT_EQUAL(num(first, "blocks_bf16"), 1);
    CU_ASSERT_EQUAL(num(first, "blocks_int8"), 1);
    CU_ASSERT_EQUAL(num(first, "mean_sensitivity"), 0.5);
    CU_ASSERT_EQUAL(num(first, "max_sensitivity"), 0.75);
    CU_ASSERT_EQUAL(num(first, "min_sensitivity"), 0.25);
    CU_ASSERT_EQUAL(num(first, "precision_changes"), 1);
    CU_ASSERT_EQUAL(num(first, "estimated_bandwidth_saving_pct"), 25.0);
    CU_ASSERT_STRING_EQUAL(str(first, "low_precision"), "int8");
    CU_ASSERT_EQUAL(num(first, "map_version"), 1);
    CU_ASSERT_STRING_EQUAL(str(block(first, "0"), "precision"), "bf16");
    CU_ASSERT_EQUAL(num(block(first, "0"), "sensitivity"), 0.75);
    CU_ASSERT_EQUAL(num(block(first, "0"), "grad_score"), 0.75);
    CU_ASSERT_EQUAL(num(block(first, "0"), "relative_magnitude"), 1.5);
    CU_ASSERT_TRUE(json_is_null(json_object_get(block(first, "0"), "error_score")));
    CU_ASSERT_STRING_EQUAL(str(block(first, "1"), "precision"), "int8");
    CU_ASSERT_EQUAL(num(block(first, "1"), "sensitivity"), 0.25);
    /* Step 4: nothing changes, the record is still written with the same map version. */
    CU_ASSERT_EQUAL(num(lines[1], "step_id"), 4);
    CU_ASSERT_EQUAL(num(lines[1], "precision_changes"), 0);
    CU_ASSERT_EQUAL(num(lines[1], "map_version"), 1);
    CU_ASSERT_PTR_NOT_NULL(strstr(r.err, "4 steps, 2 decisions, map_version 1, world_size 1"));
    free_lines(lines, n);
    prism_proc_result_free(&r);
}

static void test_replay_record_has_every_field_of_design_4_4(void)
{
    static const char *const keys[] = {"step_id", "timestamp", "blocks_bf16", "blocks_int8", "mean_sensitivity",
                                       "max_sensitivity", "min_sensitivity", "precision_changes",
                                       "estimated_bandwidth_saving_pct", "block_details", "low_precision",
                                       "map_version", /* issue 17 */ "blocks_by_precision", "loss_spike"};
    static const char *const detail_keys[] = {"precision", "sensitivity", "grad_score", "error_score",
                                              "relative_magnitude"};
    char trace[4096] = "";
    for (unsigned s = 1; s <= 2; s++)
        add_step(trace, sizeof trace, s, 0, 3, 1);
    prism_proc_result r = replay(small_config, trace, NULL, NULL);
    json_t *lines[2];
    CU_ASSERT_EQUAL_FATAL(parse_lines(r.out, lines, 2), 1);
    CU_ASSERT_EQUAL(json_object_size(lines[0]), sizeof keys / sizeof keys[0]);
    for (size_t i = 0; i < sizeof keys / sizeof keys[0]; i++)
        CU_ASSERT_PTR_NOT_NULL(json_object_get(lines[0], keys[i]));
    const json_t *d = block(lines[0], "1");
    CU_ASSERT_EQUAL(json_object_size(d), sizeof detail_keys / sizeof detail_keys[0]);
    for (size_t i = 0; i < sizeof detail_keys / sizeof detail_keys[0]; i++)
        CU_ASSERT_PTR_NOT_NULL(json_object_get(d, detail_keys[i]));
    free_lines(lines, 1);
    prism_proc_result_free(&r);
}

/* Two ranks: rank 0 reports norms 2 and 1, rank 1 reports 4 and 1; merged (mean over ranks)
 * 3 and 1, the same decision as one rank reporting 3 and 1. */
static void test_replay_merges_ranks_by_mean_norm(void)
{
    char trace[8192] = "";
    for (unsigned s = 1; s <= 2; s++) {
        add_step(trace, sizeof trace, s, 1, 4, 1);
        add_step(trace, sizeof trace, s, 0, 2, 1);
    }
    prism_proc_result r = replay(small_config, trace, NULL, NULL);
    CU_ASSERT_EQUAL(r.exit_code, 0);
    json_t *lines[2];
    CU_ASSERT_EQUAL_FATAL(parse_lines(r.out, lines, 2), 1);
    CU_ASSERT_EQUAL(num(block(lines[0], "0"), "relative_magnitude"), 1.5);
    CU_ASSERT_EQUAL(num(block(lines[0], "1"), "relative_magnitude"), 0.5);
    CU_ASSERT_STRING_EQUAL(str(block(lines[0], "1"), "precision"), "int8");
    CU_ASSERT_PTR_NOT_NULL(strstr(r.err, "world_size 2"));
    free_lines(lines, 1);
    prism_proc_result_free(&r);
}

/* With --world-size 3 and two ranks in the trace no step is ever complete: all of them
 * complete in order at the end, so the decisions are the same. */
static void test_replay_completes_open_steps_in_order_at_the_end(void)
{
    char trace[8192] = "";
    for (unsigned s = 1; s <= 4; s++) {
        add_step(trace, sizeof trace, s, 0, 2, 1);
        add_step(trace, sizeof trace, s, 1, 4, 1);
    }
    prism_proc_result r = replay(small_config, trace, "--world-size", "3");
    CU_ASSERT_EQUAL(r.exit_code, 0);
    json_t *lines[4];
    CU_ASSERT_EQUAL_FATAL(parse_lines(r.out, lines, 4), 2);
    CU_ASSERT_EQUAL(num(lines[0], "step_id"), 2);
    CU_ASSERT_EQUAL(num(lines[1], "step_id"), 4);
    CU_ASSERT_EQUAL(num(block(lines[0], "0"), "relative_magnitude"), 1.5);
    free_lines(lines, 2);
    prism_proc_result_free(&r);
}

/* A report for a step that has already completed is dropped and counted. */
/* A trace holding rank 0's whole run, then rank 1's: every step still merges both ranks. */
static void test_replay_merges_ranks_sent_one_after_another(void)
{
    static char trace[65536];
    trace[0] = '\0';
    for (unsigned rank = 0; rank < 2; rank++)
        for (unsigned s = 1; s <= 100; s++)
            add_step(trace, sizeof trace, s, rank, rank ? 4 : 2, 1);
    prism_proc_result r = replay(small_config, trace, NULL, NULL);
    CU_ASSERT_EQUAL(r.exit_code, 0);
    CU_ASSERT_PTR_NOT_NULL(strstr(r.err, "100 steps, 50 decisions"));
    CU_ASSERT_PTR_NOT_NULL(strstr(r.err, "reports dropped: 0 late, 0 repeated; steps completed with ranks missing: 0"));
    json_t *lines[64];
    CU_ASSERT_EQUAL_FATAL(parse_lines(r.out, lines, 64), 50);
    CU_ASSERT_EQUAL(num(block(lines[49], "0"), "relative_magnitude"), 1.5);
    free_lines(lines, 50);
    prism_proc_result_free(&r);
}

static void test_replay_drops_reports_for_completed_steps(void)
{
    char trace[8192] = "";
    add_step(trace, sizeof trace, 1, 0, 3, 1);
    add_step(trace, sizeof trace, 1, 1, 3, 1);
    add_step(trace, sizeof trace, 2, 0, 3, 1);
    add_step(trace, sizeof trace, 2, 1, 3, 1);
    add_step(trace, sizeof trace, 1, 1, 30, 1); /* late: step 1 is done */
    prism_proc_result r = replay(small_config, trace, NULL, NULL);
    CU_ASSERT_EQUAL(r.exit_code, 0);
    json_t *lines[2];
    CU_ASSERT_EQUAL_FATAL(parse_lines(r.out, lines, 2), 1);
    CU_ASSERT_EQUAL(num(block(lines[0], "0"), "relative_magnitude"), 1.5);
    CU_ASSERT_PTR_NOT_NULL(strstr(r.err, "reports dropped: 1 late, 0 repeated"));
    free_lines(lines, 1);
    prism_proc_result_free(&r);
}

/* Calibration applies from its line on, for the configured low format only:
 * grad_score 0.25, error 0.05 / 0.05 = 1 -> s = 0.7 * 0.25 + 0.3 * 1 = 0.475. */
static void test_replay_calibration_applies_from_its_line_on(void)
{
    char trace[8192] = "";
    add_step(trace, sizeof trace, 1, 0, 3, 1);
    add_step(trace, sizeof trace, 2, 0, 3, 1);
    strcat(trace, "{\"calibration\": {\"format\": \"fp8_e4m3\", \"errors\": {\"1\": 0.01}}}\n");
    strcat(trace, "{\"calibration\": {\"format\": \"int8\", \"errors\": {\"1\": 0.05}}}\n");
    add_step(trace, sizeof trace, 3, 0, 3, 1);
    add_step(trace, sizeof trace, 4, 0, 3, 1);
    prism_proc_result r = replay(small_config, trace, NULL, NULL);
    CU_ASSERT_EQUAL(r.exit_code, 0);
    json_t *lines[4];
    CU_ASSERT_EQUAL_FATAL(parse_lines(r.out, lines, 4), 2);
    CU_ASSERT_TRUE(json_is_null(json_object_get(block(lines[0], "1"), "error_score")));
    CU_ASSERT_EQUAL(num(block(lines[0], "1"), "sensitivity"), 0.25);
    CU_ASSERT_EQUAL(num(block(lines[1], "1"), "error_score"), 1.0);
    CU_ASSERT_DOUBLE_EQUAL(num(block(lines[1], "1"), "sensitivity"), 0.7 * 0.25 + 0.3 * 1.0, 1e-15);
    free_lines(lines, 2);
    prism_proc_result_free(&r);
}

/* 29 of 48 equal blocks forced to int8 saves 29/48 * 50% = 30.2%. */
static void test_replay_saving_of_29_of_48_equal_blocks_is_30_2(void)
{
    char config[1024] = "{\"mode\": \"static\", \"warmup_steps\": 1, \"force_int8_blocks\": [";
    for (int i = 0; i < 29; i++)
        sprintf(config + strlen(config), "%s%d", i ? ", " : "", i);
    strcat(config, "]}");
    static char trace[16384];
    strcpy(trace, "{\"step\": 1, \"blocks\": [");
    for (int i = 0; i < 48; i++)
        sprintf(trace + strlen(trace), "%s{\"id\": %d, \"l2\": 1, \"max_abs\": 1, \"numel\": 10}", i ? ", " : "", i);
    strcat(trace, "]}\n");
    prism_proc_result r = replay(config, trace, NULL, NULL);
    CU_ASSERT_EQUAL(r.exit_code, 0);
    json_t *lines[2];
    CU_ASSERT_EQUAL_FATAL(parse_lines(r.out, lines, 2), 1);
    CU_ASSERT_EQUAL(num(lines[0], "estimated_bandwidth_saving_pct"), 30.2);
    CU_ASSERT_EQUAL(num(lines[0], "blocks_int8"), 29);
    CU_ASSERT_EQUAL(num(lines[0], "blocks_bf16"), 19);
    free_lines(lines, 1);
    prism_proc_result_free(&r);
}

/* With a layout line the saving is weighted by BF16 bytes: block 1 (int8) has 3 of 4 bytes
 * -> 0.75 * 50% = 37.5%. */
static void test_replay_layout_weights_saving_by_bf16_bytes(void)
{
    char trace[8192] =
        "{\"layout\": {\"blocks\": [{\"id\": 0, \"name\": \"h.0\", \"param_bytes_bf16\": 1000},"
        " {\"id\": 1, \"name\": \"h.1\", \"param_bytes_bf16\": 3000}]}}\n";
    add_step(trace, sizeof trace, 1, 0, 3, 1);
    add_step(trace, sizeof trace, 2, 0, 3, 1);
    prism_proc_result r = replay(small_config, trace, NULL, NULL);
    CU_ASSERT_EQUAL(r.exit_code, 0);
    json_t *lines[2];
    CU_ASSERT_EQUAL_FATAL(parse_lines(r.out, lines, 2), 1);
    CU_ASSERT_EQUAL(num(lines[0], "estimated_bandwidth_saving_pct"), 37.5);
    free_lines(lines, 1);
    prism_proc_result_free(&r);
}

static void test_replay_accepts_the_nested_training_config(void)
{
    char trace[4096] = "";
    add_step(trace, sizeof trace, 1, 0, 3, 1);
    prism_proc_result r = replay("{\"optimizer\": {\"lr\": 0.001}, \"memory\": {\"stagehand\": {\"selective_precision\":"
                                 " {\"warmup_steps\": 1, \"low_precision\": \"fp8_e5m2\"}}}}",
                                 trace, NULL, NULL);
    CU_ASSERT_EQUAL(r.exit_code, 0);
    json_t *lines[2];
    CU_ASSERT_EQUAL_FATAL(parse_lines(r.out, lines, 2), 1);
    CU_ASSERT_STRING_EQUAL(str(lines[0], "low_precision"), "fp8_e5m2");
    CU_ASSERT_STRING_EQUAL(str(block(lines[0], "1"), "precision"), "fp8_e5m2");
    free_lines(lines, 1);
    prism_proc_result_free(&r);
}

typedef struct bad_input_case {
    const char *config;   /* NULL: defaults */
    const char *trace;
    const char *expected; /* in stderr */
} bad_input_case;

static const bad_input_case bad_inputs[] = {
    {NULL, "{\"step\": 1, \"blocks\": [{\"id\": 0, \"l2\": 1, \"max_abs\": 1, \"numel\": 1}]}\n{\"step\": 2, \"blocks\": [{\"id\": 0, \"l2\": \"x\", \"max_abs\": 1, \"numel\": 1}]}\n",
     "trace.jsonl:2: blocks[0].l2: expected a number, got a string"},
    {NULL, "{\"step\": 1, \"blocks\": [{\"id\": 0, \"l2\": -1, \"max_abs\": 1, \"numel\": 1}]}\n",
     "trace.jsonl:1: blocks[0].l2: -1 is negative"},
    {NULL, "{\"step\": 1, \"blocks\": [{\"id\": 0, \"l2\": 1, \"numel\": 1}]}\n", "trace.jsonl:1: blocks[0].max_abs: missing"},
    {NULL, "\n{\"step\": 1, \"blocks\": [{\"id\": 0, \"l2\": 1, \"max_abs\": 1, \"numel\": 1, \"colour\": 2}]}\n",
     "trace.jsonl:2: blocks[0].colour: unknown key"},
    {NULL, "{\"step\": 1, \"blocks\": [{\"id\": 0, \"l2\": 1, \"max_abs\": 1, \"numel\": 1}, {\"id\": 0, \"l2\": 1, \"max_abs\": 1, \"numel\": 1}]}\n",
     "trace.jsonl:1: blocks[1].id: block 0 appears twice in this line"},
    {NULL, "{\"step\": -3, \"blocks\": []}\n", "trace.jsonl:1: step: expected an integer"},
    {NULL, "{\"blocks\": []}\n", "trace.jsonl:1: step: missing"},
    {NULL, "{\"step\": 1, \"blocks\": [{\"id\": 0, \"l2\": 1, \"max_abs\": 1, \"numel\": 1, \"nonfinite\": 2}]}\n",
     "trace.jsonl:1: blocks[0].nonfinite: 2 exceeds numel 1"},
    {NULL, "{\"step\": 1, \"blocks\": [}\n", "trace.jsonl:1: column"},
    {NULL, "{\"calibration\": {\"format\": \"bf16\", \"errors\": {}}}\n", "trace.jsonl:1: calibration.format"},
    {NULL, "{\"calibration\": {\"format\": \"int8\", \"errors\": {\"x\": 0.1}}}\n",
     "trace.jsonl:1: calibration.errors.x: key is not a block id"},
    {NULL, "{\"calibration\": {\"format\": \"int8\", \"errors\": {\" 7\": 0.1}}}\n",
     "trace.jsonl:1: calibration.errors. 7: key is not a block id"},
    {NULL, "{\"calibration\": {\"format\": \"int8\", \"errors\": {\"2\": -0.1}}}\n",
     "trace.jsonl:1: calibration.errors.2: expected a number >= 0"},
    {"{\"bf16_treshold\": 0.5}", "", "cfg.json: bf16_treshold: unknown key (did you mean bf16_threshold?)"},
    {"{\"int8_threshold\": 0.7}", "", "cfg.json: int8_threshold: must be less than bf16_threshold"},
    {"{\n  \"mode\": \"dynamic\",\n  \"history_window\": ,\n}", "", "cfg.json:3:"},
    {"{\"memory\": {\"stagehand\": {\"selective_precision\": {\"history_window\": 0}}}}", "",
     "cfg.json: memory.stagehand.selective_precision.history_window: 0 is outside [1, 1000]"},
    {"{\"force_bf16_blocks\": [3], \"force_int8_blocks\": [3]}", "",
     "cfg.json: force_int8_blocks: block 3 is also in force_bf16_blocks"},
};

/* Every bad input: exit 2, nothing on stdout, a message naming file, line and key. */
static void test_replay_rejects_bad_input_with_file_line_and_key(void)
{
    for (size_t i = 0; i < sizeof bad_inputs / sizeof bad_inputs[0]; i++) {
        char good[4096] = "";
        add_step(good, sizeof good, 1, 0, 3, 1);
        const bad_input_case *c = &bad_inputs[i];
        prism_proc_result r = replay(c->config ? c->config : "{\"warmup_steps\": 1}", c->config ? good : c->trace,
                                     NULL, NULL);
        if (r.exit_code != 2 || r.out_len != 0 || !strstr(r.err, bad_inputs[i].expected))
            fprintf(stderr, "case %zu: exit %d, stdout %zu bytes, stderr: %s", i, r.exit_code, r.out_len, r.err);
        CU_ASSERT_EQUAL(r.exit_code, 2);
        CU_ASSERT_EQUAL(r.out_len, 0);
        CU_ASSERT_PTR_NOT_NULL(strstr(r.err, bad_inputs[i].expected));
        prism_proc_result_free(&r);
    }
}

/* The bad line is the last one: decisions before it were possible but nothing is printed. */
static void test_replay_prints_nothing_when_a_late_line_is_bad(void)
{
    char trace[8192] = "";
    for (unsigned s = 1; s <= 4; s++)
        add_step(trace, sizeof trace, s, 0, 3, 1);
    strcat(trace, "{\"step\": 5, \"blocks\": [{\"id\": 0}]}\n");
    prism_proc_result r = replay(small_config, trace, NULL, NULL);
    CU_ASSERT_EQUAL(r.exit_code, 2);
    CU_ASSERT_EQUAL(r.out_len, 0);
    CU_ASSERT_PTR_NOT_NULL(strstr(r.err, "trace.jsonl:5: blocks[0].l2: missing"));
    prism_proc_result_free(&r);
}

static void test_replay_rejects_a_rank_outside_the_world_size(void)
{
    char trace[4096] = "";
    add_step(trace, sizeof trace, 1, 0, 3, 1);
    add_step(trace, sizeof trace, 1, 2, 3, 1);
    prism_proc_result r = replay(small_config, trace, "--world-size", "2");
    CU_ASSERT_EQUAL(r.exit_code, 2);
    CU_ASSERT_EQUAL(r.out_len, 0);
    CU_ASSERT_PTR_NOT_NULL(strstr(r.err, "trace.jsonl:2: rank: 2 is not below the world size 2"));
    prism_proc_result_free(&r);
}

static void test_replay_help_lists_options_and_every_config_key(void)
{
    char bin[512];
    snprintf(bin, sizeof bin, "%s", prism_build_path("service/prismctl"));
    char *argv[] = {bin, "replay", "--help", NULL};
    prism_proc_result r;
    CU_ASSERT_FATAL(prism_run_process(argv, NULL, 30, &r) == 0);
    CU_ASSERT_EQUAL(r.exit_code, 0);
    static const char *const expected[] = {"--config", "--world-size", "--timestamp", "bf16_threshold", "int8_threshold",
                                           "ambiguous_default", "hysteresis_margin", "min_steps_between_switches",
                                           "force_int8_blocks", "low_precision", "apply_lag_steps", "step_timeout_ms",
                                           "world_size", "telemetry_file"};
    for (size_t i = 0; i < sizeof expected / sizeof expected[0]; i++)
        CU_ASSERT_PTR_NOT_NULL(strstr(r.out, expected[i]));
    prism_proc_result_free(&r);
}

static void test_replay_usage_errors_exit_2(void)
{
    char bin[512];
    snprintf(bin, sizeof bin, "%s", prism_build_path("service/prismctl"));
    char *no_trace[] = {bin, "replay", NULL};
    char *bad_option[] = {bin, "replay", "--wrold-size", "2", "x.jsonl", NULL};
    char *bad_world[] = {bin, "replay", "--world-size", "0", "x.jsonl", NULL};
    char *bad_time[] = {bin, "replay", "--timestamp=nan", "x.jsonl", NULL};
    char *missing_file[] = {bin, "replay", "/nonexistent/trace.jsonl", NULL};
    char *bad_command[] = {bin, "replya", NULL};
    struct {
        char **argv;
        int code;
        const char *msg;
    } cases[] = {{no_trace, 2, "no trace file given"},
                 {bad_option, 2, "unknown option --wrold-size"},
                 {bad_world, 2, "--world-size: \"0\""},
                 {bad_time, 2, "--timestamp: \"nan\""},
                 {missing_file, 1, "/nonexistent/trace.jsonl: cannot open: No such file or directory"},
                 {bad_command, 2, "unknown command \"replya\""}};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        prism_proc_result r;
        CU_ASSERT_FATAL(prism_run_process(cases[i].argv, NULL, 30, &r) == 0);
        CU_ASSERT_EQUAL(r.exit_code, cases[i].code);
        CU_ASSERT_EQUAL(r.out_len, 0);
        CU_ASSERT_PTR_NOT_NULL(strstr(r.err, cases[i].msg));
        prism_proc_result_free(&r);
    }
}

static const prism_test_case cases[] = {
    {"test_replay_prints_one_record_per_decision_with_exact_values",
     test_replay_prints_one_record_per_decision_with_exact_values},
    {"test_replay_record_has_every_field_of_design_4_4", test_replay_record_has_every_field_of_design_4_4},
    {"test_replay_merges_ranks_by_mean_norm", test_replay_merges_ranks_by_mean_norm},
    {"test_replay_completes_open_steps_in_order_at_the_end", test_replay_completes_open_steps_in_order_at_the_end},
    {"test_replay_drops_reports_for_completed_steps", test_replay_drops_reports_for_completed_steps},
    {"test_replay_merges_ranks_sent_one_after_another", test_replay_merges_ranks_sent_one_after_another},
    {"test_replay_calibration_applies_from_its_line_on", test_replay_calibration_applies_from_its_line_on},
    {"test_replay_saving_of_29_of_48_equal_blocks_is_30_2", test_replay_saving_of_29_of_48_equal_blocks_is_30_2},
    {"test_replay_layout_weights_saving_by_bf16_bytes", test_replay_layout_weights_saving_by_bf16_bytes},
    {"test_replay_accepts_the_nested_training_config", test_replay_accepts_the_nested_training_config},
    {"test_replay_rejects_bad_input_with_file_line_and_key", test_replay_rejects_bad_input_with_file_line_and_key},
    {"test_replay_prints_nothing_when_a_late_line_is_bad", test_replay_prints_nothing_when_a_late_line_is_bad},
    {"test_replay_rejects_a_rank_outside_the_world_size", test_replay_rejects_a_rank_outside_the_world_size},
    {"test_replay_help_lists_options_and_every_config_key", test_replay_help_lists_options_and_every_config_key},
    {"test_replay_usage_errors_exit_2", test_replay_usage_errors_exit_2},
    {NULL, NULL},
};

static const prism_test_suite suites[] = {{"replay", cases}, {NULL, NULL}};

int main(int argc, char **argv)
{
    return prism_test_main(argc, argv, suites);
}
