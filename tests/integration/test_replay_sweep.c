/* `prismctl replay --sweep` and `--record`, the real binary on real files: every line of a sweep
 * equals what a separate replay with that config decides (figures recomputed here from its
 * telemetry records), exact values for a hand-made trace, every bad --sweep argument refused
 * naming the key, and --record's binary trace replaying to the same records. */
#define _POSIX_C_SOURCE 200809L
#include "testutil.h"

#include "telemetry.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define TS "1700000000.5"

/* Runs prismctl replay with argv[2..] = args (NULL-terminated). */
static prism_proc_result run_prismctl(const char *const *args)
{
    char bin[512];
    snprintf(bin, sizeof bin, "%s", prism_build_path("service/prismctl"));
    char *argv[32];
    int n = 0;
    argv[n++] = bin;
    argv[n++] = "replay";
    for (size_t i = 0; args[i]; i++)
        argv[n++] = (char *)args[i];
    argv[n] = NULL;
    prism_proc_result res;
    CU_ASSERT_FATAL(prism_run_process(argv, NULL, 120, &res) == 0);
    return res;
}

/* Four blocks of BF16 sizes 1000, 1000, 2000, 4000 over 12 steps from two ranks. Block 0 is
 * always large, block 1 always small; block 2 small until step 6 and large after; block 3
 * in the middle. */
static const char *write_trace(void)
{
    static char text[1 << 15];
    strcpy(text, "{\"layout\": {\"blocks\": [{\"id\": 0, \"param_bytes_bf16\": 1000}, {\"id\": 1, \"param_bytes_bf16\": "
                 "1000}, {\"id\": 2, \"param_bytes_bf16\": 2000}, {\"id\": 3, \"param_bytes_bf16\": 4000}]}}\n");
    for (unsigned s = 1; s <= 12; s++) {
        if (s == 3)
            strcat(text, "{\"calibration\": {\"format\": \"int8\", \"errors\": {\"3\": 0.01}}}\n");
        for (unsigned r = 0; r < 2; r++) {
            double l2[4] = {4, 0.25, s <= 6 ? 0.25 : 6, 1};
            sprintf(text + strlen(text), "{\"step\": %u, \"rank\": %u, \"loss\": %g, \"blocks\": [", s, r, 3.0 - 0.125 * s);
            for (unsigned b = 0; b < 4; b++)
                sprintf(text + strlen(text), "%s{\"id\": %u, \"l2\": %g, \"max_abs\": 1, \"numel\": 100}", b ? ", " : "",
                        b, l2[b] * (r ? 1.5 : 0.5));
            strcat(text, "]}\n");
        }
    }
    return prism_write_file(prism_scratch_dir(), "sweep.jsonl", text);
}

static const char *const base_config = "{\"warmup_steps\": 2, \"update_interval_steps\": 2, \"history_window\": 2, "
                                       "\"min_steps_between_switches\": 0}";

/* The figures a sweep line gives, recomputed from a replay's telemetry of `steps` steps 1..steps. */
typedef struct figures {
    double saving_end, saving_avg;
    long long switches, twice, first, decisions;
} figures;

static figures figures_of_records(const char *out, unsigned steps)
{
    figures f = {0, 0, 0, 0, -1, 0};
    char prev[16][8];
    int changes[16] = {0};
    for (int b = 0; b < 16; b++)
        strcpy(prev[b], "bf16");
    double saving_at[64] = {0};
    const char *p = out;
    double current = 0;
    unsigned next_step = 1;
    while (*p) {
        const char *nl = strchr(p, '\n');
        CU_ASSERT_FATAL(nl != NULL);
        json_error_t jerr;
        json_t *rec = json_loadb(p, (size_t)(nl - p), 0, &jerr);
        CU_ASSERT_FATAL(rec != NULL);
        unsigned step = (unsigned)json_integer_value(json_object_get(rec, "step_id"));
        for (; next_step < step; next_step++)
            saving_at[next_step] = current;
        current = json_real_value(json_object_get(rec, "estimated_bandwidth_saving_pct"));
        if (f.first < 0)
            f.first = step;
        f.decisions++;
        f.saving_end = current;
        f.switches += json_integer_value(json_object_get(rec, "precision_changes"));
        const char *id;
        json_t *d;
        json_object_foreach(json_object_get(rec, "block_details"), id, d) {
            int b = atoi(id);
            const char *now = json_string_value(json_object_get(d, "precision"));
            if (strcmp(now, prev[b]) != 0 && ++changes[b] == 2)
                f.twice++;
            snprintf(prev[b], sizeof prev[b], "%s", now);
        }
        json_decref(rec);
        p = nl + 1;
    }
    for (; next_step <= steps; next_step++)
        saving_at[next_step] = current;
    double sum = 0;
    for (unsigned s = 1; s <= steps; s++)
        sum += saving_at[s];
    f.saving_avg = sum / steps;
    return f;
}

/* Every line of a 2 x 3 sweep equals the separate replay of its config, in the grid's order. */
static void test_sweep_lines_equal_separate_replays(void)
{
    const char *trace = write_trace();
    char trace_path[512], cfg_arg[600];
    snprintf(trace_path, sizeof trace_path, "%s", trace);
    snprintf(cfg_arg, sizeof cfg_arg, "--config=%s", prism_write_file(prism_scratch_dir(), "base.json", base_config));
    const char *args[] = {"--timestamp", TS, cfg_arg, "--sweep", "force_bf16_blocks=[],[1,3]", "--sweep",
                          "int8_threshold=0.1,0.3,0.5", "--format", "json", trace_path, NULL};
    prism_proc_result r = run_prismctl(args);
    CU_ASSERT_EQUAL_FATAL(r.exit_code, 0);
    CU_ASSERT_PTR_NOT_NULL(strstr(r.err, "6 configurations, 12 steps each"));
    const char *forces[] = {"[]", "[1,3]"};
    const char *thresholds[] = {"0.1", "0.3", "0.5"};
    const char *line = r.out;
    for (int i = 0; i < 6; i++) {
        const char *force = forces[i / 3], *thr = thresholds[i % 3];
        char cfg[512];
        snprintf(cfg, sizeof cfg,
                 "{\"warmup_steps\": 2, \"update_interval_steps\": 2, \"history_window\": 2, "
                 "\"min_steps_between_switches\": 0, \"force_bf16_blocks\": %s, \"int8_threshold\": %s}",
                 force, thr);
        char one_arg[600];
        snprintf(one_arg, sizeof one_arg, "--config=%s", prism_write_file(prism_scratch_dir(), "one.json", cfg));
        const char *one_args[] = {"--timestamp", TS, one_arg, trace_path, NULL};
        prism_proc_result one = run_prismctl(one_args);
        CU_ASSERT_EQUAL_FATAL(one.exit_code, 0);
        figures want = figures_of_records(one.out, 12);
        prism_proc_result_free(&one);

        CU_ASSERT_FATAL(line != NULL && *line);
        const char *nl = strchr(line, '\n');
        json_error_t jerr;
        json_t *got = json_loadb(line, (size_t)(nl - line), 0, &jerr);
        CU_ASSERT_FATAL(got != NULL);
        /* the config object as written: the keys in order, the values as given */
        char expect_config[128];
        snprintf(expect_config, sizeof expect_config, "{\"config\":{\"force_bf16_blocks\":%s,\"int8_threshold\":%s},",
                 force, thr);
        CU_ASSERT_EQUAL(strncmp(line, expect_config, strlen(expect_config)), 0);
        CU_ASSERT_EQUAL(json_number_value(json_object_get(got, "saving_end_pct")), want.saving_end);
        CU_ASSERT_EQUAL(json_number_value(json_object_get(got, "saving_avg_pct")), want.saving_avg);
        CU_ASSERT_EQUAL(json_integer_value(json_object_get(got, "switches")), want.switches);
        CU_ASSERT_EQUAL(json_integer_value(json_object_get(got, "blocks_switched_more_than_once")), want.twice);
        CU_ASSERT_EQUAL(json_integer_value(json_object_get(got, "first_decision_step")), want.first);
        CU_ASSERT_EQUAL(json_integer_value(json_object_get(got, "decisions")), want.decisions);
        CU_ASSERT_EQUAL(json_integer_value(json_object_get(got, "steps")), 12);
        json_decref(got);
        line = nl + 1;
    }
    CU_ASSERT_EQUAL(*line, '\0');
    prism_proc_result_free(&r);
}

/* The table for the hand-made trace, worked out by hand. History 2, decisions at 2, 4, ..., 12.
 * Merged norms (the mean of the ranks' 0.5x and 1.5x): 4, 0.25, 0.25 (6 from step 7), 1; their
 * mean 1.375, then 2.8125. Steps 1-6: rel 2.909, 0.182, 0.182, 0.727, grad scores 1, 0.091,
 * 0.091, 0.364. Step 2 puts blocks 1 and 2 low (s < 0.3) and keeps 0 and 3 bf16 (3 is
 * ambiguous): saving (1000 + 2000) / 8000 * 50 = 18.75 -> 18.8. Block 3's calibration (0.01 /
 * 0.05 = 0.2, from step 3) gives s = 0.7 * 0.364 + 0.3 * 0.2 = 0.315: not below 0.3 - 0.1, it stays
 * bf16. Step 8 (window 7, 8): block 2's rel 2.133 sends it back to bf16; block 3's rel 0.356
 * gives s = 0.7 * 0.178 + 0.06 = 0.184 < 0.2: low. Saving (1000 + 4000) / 8000 * 50 = 31.25 ->
 * 31.3 (C's round, halves away from zero). */
static void test_sweep_table_has_exact_values(void)
{
    const char *trace = write_trace();
    char trace_path[512], cfg_arg[600];
    snprintf(trace_path, sizeof trace_path, "%s", trace);
    snprintf(cfg_arg, sizeof cfg_arg, "--config=%s", prism_write_file(prism_scratch_dir(), "base.json", base_config));
    const char *args[] = {"--timestamp", TS, cfg_arg, "--sweep", "int8_threshold=0.3", "--sweep",
                          "mode=dynamic,static", trace_path, NULL};
    prism_proc_result r = run_prismctl(args);
    CU_ASSERT_EQUAL(r.exit_code, 0);
    /* dynamic: saving 0 at step 1, 18.8 at steps 2-7, 31.3 at steps 8-12: (6 * 18.8 + 5 * 31.3) / 12
     * = 22.44; 4 switches (two at step 2, two at step 8), block 2 twice. static: nothing low. */
    const char *expected = "int8_threshold  mode       saving_end_pct  saving_avg_pct  switches  "
                           "blocks_switched_more_than_once  first_decision_step  decisions\n"
                           "0.3             \"dynamic\"            31.3           22.44         4                  "
                           "             1                    2          6\n"
                           "0.3             \"static\"              0.0            0.00         0                  "
                           "             0                    2          6\n";
    if (strcmp(r.out, expected) != 0)
        fprintf(stderr, "got:\n%s", r.out);
    CU_ASSERT_STRING_EQUAL(r.out, expected);
    prism_proc_result_free(&r);
}

typedef struct bad_sweep {
    const char *args[4];
    const char *expected;
} bad_sweep;

/* Every bad --sweep argument exits 2 with nothing on stdout and a message naming the key. */
static void test_sweep_rejects_bad_arguments_naming_the_key(void)
{
    const char *trace = write_trace();
    char trace_path[512];
    snprintf(trace_path, sizeof trace_path, "%s", trace);
    static const bad_sweep cases[] = {
        {{"--sweep", "bf16_treshold=0.5", NULL}, "--sweep: bf16_treshold: unknown key (did you mean bf16_threshold?)"},
        {{"--sweep", "bf16_threshold=0.5,2", NULL}, "--sweep bf16_threshold=2: bf16_threshold: 2 is outside [0, 1]"},
        {{"--sweep", "mode=dynamic,fast", NULL}, "--sweep mode=\"fast\": mode:"},
        {{"--sweep", "force_bf16_blocks=[],[1,-2]", NULL}, "--sweep force_bf16_blocks=[1,-2]: force_bf16_blocks"},
        {{"--sweep", "int8_threshold=0.7", NULL}, "--sweep int8_threshold=0.7: int8_threshold: must be less than "
                                                  "bf16_threshold"},
        {{"--sweep", "bf16_threshold=0.9,0.4", "--sweep", "int8_threshold=0.5"},
         "--sweep combination 2 (bf16_threshold=0.4, int8_threshold=0.5): int8_threshold: must be less than "
         "bf16_threshold"},
        {{"--sweep", "hysteresis_margin=0.1,0.1", "--sweep", "hysteresis_margin=0.2"},
         "--sweep hysteresis_margin: the key is given twice"},
        {{"--sweep", "world_size=1,2", NULL}, "--sweep world_size: the key shapes the rank merge"},
        {{"--sweep", "bf16_threshold=", NULL}, "--sweep bf16_threshold: value 1 \"\" is neither JSON nor a bare word"},
        /* a value left open is an error naming it, not a crash or a value dropped */
        {{"--sweep", "force_bf16_blocks=[1,2", NULL}, "--sweep force_bf16_blocks: value 1 \"[1,2\" has an unclosed ["},
        {{"--sweep", "mode=\"abc", NULL}, "--sweep mode: value 1 \"\"abc\" has an unclosed string"},
        {{"--sweep", "force_bf16_blocks={", NULL}, "--sweep force_bf16_blocks: value 1 \"{\" has an unclosed {"},
        {{"--sweep", "force_bf16_blocks=[],[1", NULL}, "--sweep force_bf16_blocks: value 2 \"[1\" has an unclosed ["},
        {{"--sweep", "mode=dynamic,\"x", NULL}, "--sweep mode: value 2 \"\"x\" has an unclosed string"},
        {{"--sweep", "force_bf16_blocks=[[1],{", NULL},
         "--sweep force_bf16_blocks: value 1 \"[[1],{\" has an unclosed {"},
        {{"--sweep", "mode=\"a\\", NULL}, "--sweep mode: value 1 \"\"a\\\" has an unclosed string"},
        /* a number too large for a double is not taken as a bare word */
        {{"--sweep", "bf16_threshold=0.5,1e999", NULL},
         "--sweep bf16_threshold: value 2 \"1e999\" is not a finite number"},
        {{"--sweep", "bf16_threshold=-1e999", NULL},
         "--sweep bf16_threshold: value 1 \"-1e999\" is not a finite number"},
        {{"--sweep", "warmup_steps=99999999999999999999", NULL},
         "--sweep warmup_steps: value 1 \"99999999999999999999\" is an integer out of range"},
        {{"--sweep", "=1", NULL}, "--sweep \"=1\": expected KEY=V1,V2,..."},
        {{"--format", "json", NULL}, "--format applies to --sweep's output only"},
        {{"--sweep", "mode=off", "--record"}, "--record and --sweep do not go together"},
    };
    char never[600];
    snprintf(never, sizeof never, "%s/never-written.ptrace", prism_scratch_dir());
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        const char *args[12];
        size_t n = 0;
        for (size_t k = 0; k < 4 && cases[i].args[k]; k++)
            args[n++] = cases[i].args[k];
        if (n == 3)
            args[n++] = never;
        args[n++] = trace_path;
        args[n] = NULL;
        prism_proc_result r = run_prismctl(args);
        if (r.exit_code != 2 || r.out_len || !strstr(r.err, cases[i].expected))
            fprintf(stderr, "case %zu: exit %d, stderr: %s", i, r.exit_code, r.err);
        CU_ASSERT_EQUAL(r.exit_code, 2);
        CU_ASSERT_EQUAL(r.out_len, 0);
        CU_ASSERT_PTR_NOT_NULL(strstr(r.err, cases[i].expected));
        prism_proc_result_free(&r);
    }
    /* 17 x 16 x 16 = 4352 combinations: more than 4096. */
    char a[256] = "bf16_threshold=", b[256] = "hysteresis_margin=", c[256] = "grad_weight=";
    for (int v = 0; v < 17; v++)
        sprintf(a + strlen(a), "%s0.%02d", v ? "," : "", 60 + v);
    for (int v = 0; v < 16; v++) {
        sprintf(b + strlen(b), "%s0.%02d", v ? "," : "", v);
        sprintf(c + strlen(c), "%s0.%02d", v ? "," : "", v);
    }
    const char *args[] = {"--sweep", a, "--sweep", b, "--sweep", c, trace_path, NULL};
    prism_proc_result r = run_prismctl(args);
    CU_ASSERT_EQUAL(r.exit_code, 2);
    CU_ASSERT_PTR_NOT_NULL(strstr(r.err, "--sweep grad_weight: 272 x 16 combinations, more than the 4096 a sweep replays"));
    prism_proc_result_free(&r);
    CU_ASSERT_EQUAL(access(never, F_OK), -1);
}

/* Combinations x the trace's blocks is bounded (each combination keeps state for every block):
 * 4096 combinations over a trace of 4000 blocks (named by its layout) are refused once the trace
 * is loaded, naming the numbers; 2 combinations of the same trace replay. */
static void test_sweep_bounds_combinations_times_blocks(void)
{
    prism_buf text = {0};
    const char *head = "{\"layout\": {\"blocks\": [";
    CU_ASSERT_FATAL(prism_buf_append(&text, head, strlen(head)) == PRISM_OK);
    for (unsigned b = 0; b < 4000; b++) {
        char one[64];
        int n = snprintf(one, sizeof one, "%s{\"id\": %u, \"param_bytes_bf16\": 10}", b ? ", " : "", b);
        CU_ASSERT_FATAL(prism_buf_append(&text, one, (size_t)n) == PRISM_OK);
    }
    const char *tail = "]}}\n{\"step\": 1, \"blocks\": []}\n";
    CU_ASSERT_FATAL(prism_buf_append(&text, tail, strlen(tail) + 1) == PRISM_OK);
    char trace_path[512];
    snprintf(trace_path, sizeof trace_path, "%s", prism_write_file(prism_scratch_dir(), "wide.jsonl", text.data));
    prism_buf_free(&text);
    /* 16 x 16 x 16 = 4096 combinations, the most --sweep takes */
    char a[256] = "bf16_threshold=", b[256] = "hysteresis_margin=", c[256] = "grad_weight=";
    for (int v = 0; v < 16; v++) {
        sprintf(a + strlen(a), "%s0.%02d", v ? "," : "", 60 + v);
        sprintf(b + strlen(b), "%s0.%02d", v ? "," : "", v);
        sprintf(c + strlen(c), "%s0.%02d", v ? "," : "", v);
    }
    const char *args[] = {"--sweep", a, "--sweep", b, "--sweep", c, trace_path, NULL};
    prism_proc_result r = run_prismctl(args);
    if (r.exit_code != 2)
        fprintf(stderr, "exit %d, stderr: %s", r.exit_code, r.err);
    CU_ASSERT_EQUAL(r.exit_code, 2);
    CU_ASSERT_EQUAL(r.out_len, 0);
    CU_ASSERT_PTR_NOT_NULL(strstr(r.err, "--sweep: 4096 combinations x 4000 blocks = 16384000 block states, more "
                                         "than the 16000000 a sweep holds in memory"));
    prism_proc_result_free(&r);
    const char *two[] = {"--sweep", "bf16_threshold=0.6,0.7", trace_path, NULL};
    r = run_prismctl(two);
    CU_ASSERT_EQUAL(r.exit_code, 0);
    CU_ASSERT_PTR_NOT_NULL(strstr(r.err, "2 configurations, 1 steps each"));
    prism_proc_result_free(&r);
}

/* A value longer than any fixed cell shows whole in the table, its column padded to it: every
 * line of the table is as long as the header. */
static void test_sweep_table_shows_long_values_whole(void)
{
    const char *trace = write_trace();
    char trace_path[512], cfg_arg[600], value[400] = "force_bf16_blocks=[],[", list[400] = "[";
    snprintf(trace_path, sizeof trace_path, "%s", trace);
    snprintf(cfg_arg, sizeof cfg_arg, "--config=%s", prism_write_file(prism_scratch_dir(), "base.json", base_config));
    for (unsigned id = 0; id < 30; id++) {
        sprintf(value + strlen(value), "%s%u", id ? "," : "", 1000 + id);
        sprintf(list + strlen(list), "%s%u", id ? "," : "", 1000 + id);
    }
    strcat(value, "]");
    strcat(list, "]");
    CU_ASSERT_FATAL(strlen(list) > 100);
    const char *args[] = {"--timestamp", TS, cfg_arg, "--sweep", value, trace_path, NULL};
    prism_proc_result r = run_prismctl(args);
    CU_ASSERT_EQUAL_FATAL(r.exit_code, 0);
    const char *l1 = r.out, *l2 = strchr(l1, '\n') + 1, *l3 = strchr(l2, '\n') + 1;
    size_t n1 = (size_t)(strchr(l1, '\n') - l1), n2 = (size_t)(strchr(l2, '\n') - l2), n3 = strlen(l3) - 1;
    CU_ASSERT_EQUAL(n1, n2);
    CU_ASSERT_EQUAL(n1, n3);
    CU_ASSERT_EQUAL(strncmp(l3, list, strlen(list)), 0);
    CU_ASSERT_EQUAL(strncmp(l3 + strlen(list), "  ", 2), 0);
    CU_ASSERT_EQUAL(strncmp(l1, "force_bf16_blocks ", 18), 0);
    if (n1 != n3 || strncmp(l3, list, strlen(list)) != 0)
        fprintf(stderr, "got:\n%s", r.out);
    prism_proc_result_free(&r);
}

/* A grid that moves both thresholds: int8_threshold 0.9 and 0.95 fail on the base config alone
 * (bf16_threshold 0.6) but every combination with bf16_threshold 0.97 or 0.99 is valid, so the sweep
 * runs all four. A combination that fails is named with its values; a value that fails in every
 * combination is named alone. */
static void test_sweep_checks_whole_combinations(void)
{
    const char *trace = write_trace();
    char trace_path[512];
    snprintf(trace_path, sizeof trace_path, "%s", trace);
    const char *args[] = {"--timestamp", TS, "--sweep", "bf16_threshold=0.97,0.99", "--sweep",
                          "int8_threshold=0.9,0.95", trace_path, NULL};
    prism_proc_result r = run_prismctl(args);
    if (r.exit_code != 0)
        fprintf(stderr, "stderr: %s", r.err);
    CU_ASSERT_EQUAL(r.exit_code, 0);
    size_t lines = 0;
    for (size_t i = 0; i < r.out_len; i++)
        lines += r.out[i] == '\n';
    CU_ASSERT_EQUAL(lines, 5); /* the header and four configurations */
    prism_proc_result_free(&r);
    const char *bad[] = {"--sweep", "bf16_threshold=0.97,0.99", "--sweep", "int8_threshold=0.9,0.98", trace_path,
                         NULL};
    r = run_prismctl(bad);
    CU_ASSERT_EQUAL(r.exit_code, 2);
    CU_ASSERT_PTR_NOT_NULL(strstr(r.err, "--sweep combination 2 (bf16_threshold=0.97, int8_threshold=0.98): "
                                         "int8_threshold: must be less than bf16_threshold"));
    prism_proc_result_free(&r);
    const char *alone[] = {"--sweep", "bf16_threshold=0.97,0.99", "--sweep", "int8_threshold=0.9,0.995", trace_path,
                           NULL};
    r = run_prismctl(alone);
    CU_ASSERT_EQUAL(r.exit_code, 2);
    CU_ASSERT_PTR_NOT_NULL(strstr(r.err, "--sweep int8_threshold=0.995: int8_threshold: must be less than "
                                         "bf16_threshold"));
    prism_proc_result_free(&r);
}

/* --record converts the JSONL trace to a binary one that replays (its header's config, no
 * --config) to the same records; recording that again gives the same records once more. A replay
 * that fails writes no file. */
static void test_record_round_trip(void)
{
    const char *trace = write_trace();
    char trace_path[512], cfg_arg[600], rec1[600], rec2[600];
    snprintf(trace_path, sizeof trace_path, "%s", trace);
    snprintf(cfg_arg, sizeof cfg_arg, "--config=%s", prism_write_file(prism_scratch_dir(), "base.json", base_config));
    snprintf(rec1, sizeof rec1, "%s/one.ptrace", prism_scratch_dir());
    snprintf(rec2, sizeof rec2, "%s/two.ptrace", prism_scratch_dir());
    const char *a1[] = {"--timestamp", TS, cfg_arg, "--record", rec1, trace_path, NULL};
    prism_proc_result r1 = run_prismctl(a1);
    CU_ASSERT_EQUAL_FATAL(r1.exit_code, 0);
    CU_ASSERT(r1.out_len > 0);
    const char *a2[] = {"--timestamp", TS, "--record", rec2, rec1, NULL};
    prism_proc_result r2 = run_prismctl(a2);
    CU_ASSERT_EQUAL(r2.exit_code, 0);
    CU_ASSERT_STRING_EQUAL(r2.out, r1.out);
    /* header, layout, calibration, 12 merged steps */
    CU_ASSERT_PTR_NOT_NULL(strstr(r2.err, "12 steps, 6 decisions, map_version 2; binary trace: 15 records"));
    const char *a3[] = {"--timestamp", TS, rec2, NULL};
    prism_proc_result r3 = run_prismctl(a3);
    CU_ASSERT_EQUAL(r3.exit_code, 0);
    CU_ASSERT_STRING_EQUAL(r3.out, r1.out);
    /* Re-recording a recording gives the same bytes (same --timestamp, same job). */
    size_t n2 = 0, n3 = 0;
    char *b2 = prism_read_file(rec2, &n2);
    char rec3[600];
    snprintf(rec3, sizeof rec3, "%s/three.ptrace", prism_scratch_dir());
    const char *a4[] = {"--timestamp", TS, "--record", rec3, rec2, NULL};
    prism_proc_result r4 = run_prismctl(a4);
    CU_ASSERT_EQUAL(r4.exit_code, 0);
    char *b3 = prism_read_file(rec3, &n3);
    CU_ASSERT_FATAL(b2 && b3);
    CU_ASSERT_EQUAL(n2, n3);
    CU_ASSERT(n2 == n3 && memcmp(b2, b3, n2) == 0);
    free(b2);
    free(b3);
    /* A bad trace: exit 2, no file. */
    char bad_out[600];
    snprintf(bad_out, sizeof bad_out, "%s/bad.ptrace", prism_scratch_dir());
    const char *bad_trace = prism_write_file(prism_scratch_dir(), "bad.jsonl",
                                             "{\"step\": 1, \"blocks\": []}\n{\"step\": 2, \"blocks\": 7}\n");
    char bad_path[512];
    snprintf(bad_path, sizeof bad_path, "%s", bad_trace);
    const char *a5[] = {"--record", bad_out, bad_path, NULL};
    prism_proc_result r5 = run_prismctl(a5);
    CU_ASSERT_EQUAL(r5.exit_code, 2);
    CU_ASSERT_PTR_NOT_NULL(strstr(r5.err, "bad.jsonl:2: blocks: expected an array, got a number"));
    CU_ASSERT_EQUAL(access(bad_out, F_OK), -1);
    /* A --record path in a folder that does not exist: the message names that path, not the
     * temporary file beside it. */
    char missing[600], expect[700];
    snprintf(missing, sizeof missing, "%s/missing/x.ptrace", prism_scratch_dir());
    snprintf(expect, sizeof expect, "prismctl replay: --record %s: No such file or directory\n", missing);
    const char *a6[] = {"--record", missing, trace_path, NULL};
    prism_proc_result r6 = run_prismctl(a6);
    CU_ASSERT_EQUAL(r6.exit_code, 1);
    CU_ASSERT_EQUAL(r6.out_len, 0);
    CU_ASSERT_STRING_EQUAL(r6.err, expect);
    CU_ASSERT_PTR_NULL(strstr(r6.err, ".partial"));
    prism_proc_result_free(&r6);
    prism_proc_result_free(&r1);
    prism_proc_result_free(&r2);
    prism_proc_result_free(&r3);
    prism_proc_result_free(&r4);
    prism_proc_result_free(&r5);
}

/* A sweep over a binary trace takes its base config from the header. */
static void test_sweep_of_a_binary_trace_uses_its_header_config(void)
{
    const char *trace = write_trace();
    char trace_path[512], cfg_arg[600], rec[600];
    snprintf(trace_path, sizeof trace_path, "%s", trace);
    snprintf(cfg_arg, sizeof cfg_arg, "--config=%s", prism_write_file(prism_scratch_dir(), "base.json", base_config));
    snprintf(rec, sizeof rec, "%s/sweep.ptrace", prism_scratch_dir());
    const char *a1[] = {"--timestamp", TS, cfg_arg, "--record", rec, trace_path, NULL};
    prism_proc_result r1 = run_prismctl(a1);
    CU_ASSERT_EQUAL_FATAL(r1.exit_code, 0);
    const char *a2[] = {"--sweep", "int8_threshold=0.3", "--sweep", "mode=dynamic,static", cfg_arg, trace_path, NULL};
    prism_proc_result r2 = run_prismctl(a2);
    const char *a3[] = {"--sweep", "int8_threshold=0.3", "--sweep", "mode=dynamic,static", rec, NULL};
    prism_proc_result r3 = run_prismctl(a3);
    CU_ASSERT_EQUAL(r2.exit_code, 0);
    CU_ASSERT_EQUAL(r3.exit_code, 0);
    CU_ASSERT_STRING_EQUAL(r3.out, r2.out);
    /* A value the header's config refuses names the record. */
    const char *a4[] = {"--sweep", "int8_threshold=0.65", rec, NULL};
    prism_proc_result r4 = run_prismctl(a4);
    CU_ASSERT_EQUAL(r4.exit_code, 2);
    CU_ASSERT_PTR_NOT_NULL(strstr(r4.err, "sweep.ptrace: record 1 (byte 0): --sweep int8_threshold=0.65: int8_threshold: "
                                          "must be less than bf16_threshold"));
    prism_proc_result_free(&r1);
    prism_proc_result_free(&r2);
    prism_proc_result_free(&r3);
    prism_proc_result_free(&r4);
}

/* write_trace's steps with a loss of 1 except 5 at step 3, and an int4 calibration error of 0.01
 * for block 1 before step 1 (issue 17's keys need a spike and a second format). */
static const char *write_spike_trace(void)
{
    static char text[1 << 15];
    strcpy(text, "{\"layout\": {\"blocks\": [{\"id\": 0, \"param_bytes_bf16\": 1000}, {\"id\": 1, \"param_bytes_bf16\": "
                 "1000}, {\"id\": 2, \"param_bytes_bf16\": 2000}, {\"id\": 3, \"param_bytes_bf16\": 4000}]}}\n"
                 "{\"calibration\": {\"format\": \"int4\", \"errors\": {\"1\": 0.01}}}\n");
    for (unsigned s = 1; s <= 12; s++) {
        if (s == 3)
            strcat(text, "{\"calibration\": {\"format\": \"int8\", \"errors\": {\"3\": 0.01}}}\n");
        for (unsigned r = 0; r < 2; r++) {
            double l2[4] = {4, 0.25, s <= 6 ? 0.25 : 6, 1};
            sprintf(text + strlen(text), "{\"step\": %u, \"rank\": %u, \"loss\": %g, \"blocks\": [", s, r,
                    s == 3 ? 5.0 : 1.0);
            for (unsigned b = 0; b < 4; b++)
                sprintf(text + strlen(text), "%s{\"id\": %u, \"l2\": %g, \"max_abs\": 1, \"numel\": 100}", b ? ", " : "",
                        b, l2[b] * (r ? 1.5 : 0.5));
            strcat(text, "]}\n");
        }
    }
    return prism_write_file(prism_scratch_dir(), "spike.jsonl", text);
}

/* --sweep takes issue 17's keys (through the one config table), a list value included. Each
 * line equals a separate replay of its config, and the figures are worked out by hand (the
 * steps of test_sweep_table_has_exact_values, with loss_spike_window 2):
 *   factor 0: as that test: 4 switches (blocks 1, 2 low at 2; block 2 bf16, block 3 low at 8),
 *     6 decisions (2, 4, ..., 12), block 2 switched twice.
 *   factor 1.5: W = [1, 1] after step 2; step 3's 5 > 1.5 * 1 is a spike: blocks 1 and 2 (low by
 *     score at 2, 3 - 2 <= 2) go back to bf16 at 3, a decision of its own, held for 100 steps;
 *     block 3 goes low at 8: 5 switches, 7 decisions, blocks 1 and 2 switched twice.
 *   low_precision auto (low_formats [int4, fp8_e4m3, int8]): block 1's candidate is int4 (0.01 <=
 *     0.05), the others' int8 (block 3's int8 error 0.01; blocks 0, 2 uncalibrated: the last);
 *     the same switches. At the end (factor 0) blocks 1 and 3 are low: int8 (1000 + 4000) * 0.5 /
 *     8000 = 31.25 -> 31.3; auto (1000 * 0.75 + 4000 * 0.5) / 8000 = 34.375 -> 34.4. With the spike
 *     block 1 is bf16 at the end: 4000 * 0.5 / 8000 = 25.0 either way.
 *   low_formats ["int8"] under auto: like int8 (31.3); ["int4","int8"]: like the default (34.4).
 * The other keys of issue 17 (the spike's window and hold, the scale mode with its history length
 * and margin, the saturation threshold) are swept too; their lines are checked against separate
 * replays only (pinned: false), which is what taking a key means: the same as the key in --config. */
static void test_sweep_takes_the_numerics_keys(void)
{
    const char *trace = write_spike_trace();
    char trace_path[512], cfg_arg[600];
    snprintf(trace_path, sizeof trace_path, "%s", trace);
    const char *base = "{\"warmup_steps\": 2, \"update_interval_steps\": 2, \"history_window\": 2, "
                       "\"min_steps_between_switches\": 0, \"loss_spike_window\": 2}";
    snprintf(cfg_arg, sizeof cfg_arg, "--config=%s", prism_write_file(prism_scratch_dir(), "spike.json", base));
    static const struct {
        const char *keys[4];           /* --sweep arguments (NULL: fewer) */
        const char *values[4];         /* each combination's keys as a JSON object's members */
        double saving_end[4];
        long long switches[4], decisions[4], twice[4];
        bool unpinned;                 /* checked against separate replays only */
    } sweeps[] = {
        {{"loss_spike_factor=0,1.5", "low_precision=int8,auto"},
         {"\"loss_spike_factor\": 0, \"low_precision\": \"int8\"", "\"loss_spike_factor\": 0, \"low_precision\": \"auto\"",
          "\"loss_spike_factor\": 1.5, \"low_precision\": \"int8\"", "\"loss_spike_factor\": 1.5, \"low_precision\": \"auto\""},
         {31.3, 34.4, 25.0, 25.0}, {4, 4, 5, 5}, {6, 6, 7, 7}, {1, 1, 2, 2}, false},
        {{"low_precision=auto", "low_formats=[\"int8\"],[\"int4\",\"int8\"]"},
         {"\"low_precision\": \"auto\", \"low_formats\": [\"int8\"]",
          "\"low_precision\": \"auto\", \"low_formats\": [\"int4\", \"int8\"]", NULL, NULL},
         {31.3, 34.4}, {4, 4}, {6, 6}, {1, 1}, false},
        {{"loss_spike_factor=1.5", "loss_spike_window=2,3", "loss_spike_hold_steps=0,100"},
         {"\"loss_spike_factor\": 1.5, \"loss_spike_window\": 2, \"loss_spike_hold_steps\": 0",
          "\"loss_spike_factor\": 1.5, \"loss_spike_window\": 2, \"loss_spike_hold_steps\": 100",
          "\"loss_spike_factor\": 1.5, \"loss_spike_window\": 3, \"loss_spike_hold_steps\": 0",
          "\"loss_spike_factor\": 1.5, \"loss_spike_window\": 3, \"loss_spike_hold_steps\": 100"},
         {0}, {0}, {0}, {0}, true},
        {{"scale_mode=delayed,static", "amax_history_len=4", "scale_margin=1", "saturation_threshold=0.0001,0.5"},
         {"\"scale_mode\": \"delayed\", \"amax_history_len\": 4, \"scale_margin\": 1, \"saturation_threshold\": 0.0001",
          "\"scale_mode\": \"delayed\", \"amax_history_len\": 4, \"scale_margin\": 1, \"saturation_threshold\": 0.5",
          "\"scale_mode\": \"static\", \"amax_history_len\": 4, \"scale_margin\": 1, \"saturation_threshold\": 0.0001",
          "\"scale_mode\": \"static\", \"amax_history_len\": 4, \"scale_margin\": 1, \"saturation_threshold\": 0.5"},
         {0}, {0}, {0}, {0}, true},
    };
    for (size_t k = 0; k < sizeof sweeps / sizeof sweeps[0]; k++) {
        const char *args[16] = {"--timestamp", TS, cfg_arg};
        size_t n = 3;
        for (int i = 0; i < 4 && sweeps[k].keys[i]; i++) {
            args[n++] = "--sweep";
            args[n++] = sweeps[k].keys[i];
        }
        args[n++] = "--format";
        args[n++] = "json";
        args[n++] = trace_path;
        args[n] = NULL;
        prism_proc_result r = run_prismctl(args);
        if (r.exit_code != 0)
            fprintf(stderr, "sweep %zu: %s\n", k, r.err);
        CU_ASSERT_EQUAL_FATAL(r.exit_code, 0);
        const char *line = r.out;
        for (int i = 0; i < 4 && sweeps[k].values[i]; i++) {
            /* The base config with this combination's keys over it (a swept key replaces the
             * base's, as --sweep does). */
            char members[512];
            snprintf(members, sizeof members, "{%s}", sweeps[k].values[i]);
            json_t *cfg = json_loads(base, 0, NULL), *over = json_loads(members, 0, NULL);
            CU_ASSERT_FATAL(cfg != NULL && over != NULL);
            json_object_update(cfg, over);
            char *cfg_text = json_dumps(cfg, JSON_COMPACT);
            json_decref(over);
            json_decref(cfg);
            char one_arg[600];
            snprintf(one_arg, sizeof one_arg, "--config=%s", prism_write_file(prism_scratch_dir(), "one.json", cfg_text));
            free(cfg_text);
            const char *one_args[] = {"--timestamp", TS, one_arg, trace_path, NULL};
            prism_proc_result one = run_prismctl(one_args);
            if (one.exit_code != 0)
                fprintf(stderr, "sweep %zu, replay %d: %s\n", k, i, one.err);
            CU_ASSERT_EQUAL_FATAL(one.exit_code, 0);
            figures want = figures_of_records(one.out, 12);
            prism_proc_result_free(&one);
            CU_ASSERT_FATAL(line != NULL && *line);
            const char *nl = strchr(line, '\n');
            CU_ASSERT_FATAL(nl != NULL);
            json_error_t jerr;
            json_t *got = json_loadb(line, (size_t)(nl - line), 0, &jerr);
            CU_ASSERT_FATAL(got != NULL);
            double saving_end = json_number_value(json_object_get(got, "saving_end_pct"));
            long long switches = json_integer_value(json_object_get(got, "switches"));
            long long decisions = json_integer_value(json_object_get(got, "decisions"));
            long long twice = json_integer_value(json_object_get(got, "blocks_switched_more_than_once"));
            if (!sweeps[k].unpinned && (saving_end != sweeps[k].saving_end[i] || switches != sweeps[k].switches[i] ||
                                        decisions != sweeps[k].decisions[i] || twice != sweeps[k].twice[i]))
                fprintf(stderr, "sweep %zu line %d: %.*s\n", k, i, (int)(nl - line), line);
            CU_ASSERT_EQUAL(saving_end, want.saving_end);
            CU_ASSERT_EQUAL(switches, want.switches);
            CU_ASSERT_EQUAL(decisions, want.decisions);
            CU_ASSERT_EQUAL(twice, want.twice);
            if (!sweeps[k].unpinned) {
                CU_ASSERT_EQUAL(saving_end, sweeps[k].saving_end[i]);
                CU_ASSERT_EQUAL(switches, sweeps[k].switches[i]);
                CU_ASSERT_EQUAL(decisions, sweeps[k].decisions[i]);
                CU_ASSERT_EQUAL(twice, sweeps[k].twice[i]);
            }
            json_decref(got);
            line = nl + 1;
        }
        CU_ASSERT_EQUAL(*line, '\0');
        prism_proc_result_free(&r);
    }
}

static const prism_test_case cases[] = {
    {"test_sweep_lines_equal_separate_replays", test_sweep_lines_equal_separate_replays},
    {"test_sweep_table_has_exact_values", test_sweep_table_has_exact_values},
    {"test_sweep_rejects_bad_arguments_naming_the_key", test_sweep_rejects_bad_arguments_naming_the_key},
    {"test_sweep_bounds_combinations_times_blocks", test_sweep_bounds_combinations_times_blocks},
    {"test_sweep_table_shows_long_values_whole", test_sweep_table_shows_long_values_whole},
    {"test_sweep_checks_whole_combinations", test_sweep_checks_whole_combinations},
    {"test_record_round_trip", test_record_round_trip},
    {"test_sweep_of_a_binary_trace_uses_its_header_config", test_sweep_of_a_binary_trace_uses_its_header_config},
    {"test_sweep_takes_the_numerics_keys", test_sweep_takes_the_numerics_keys},
    {NULL, NULL},
};

static const prism_test_suite suites[] = {{"replay_sweep", cases}, {NULL, NULL}};

int main(int argc, char **argv)
{
    return prism_test_main(argc, argv, suites);
}
