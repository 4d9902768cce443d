/* `prismctl replay` of binary traces (DESIGN 4.6): the real binary on traces written with the
 * writers prismd uses (service/policy/trace_bin.h). A binary trace of merged steps replays to
 * exactly the records of the JSONL trace of the ranks' reports; its configs, layout,
 * calibration and map-version bumps apply as prismd applied them; every bad record is refused
 * with its number and byte offset. */
#define _POSIX_C_SOURCE 200809L
#include "testutil.h"

#include "merge.h"
#include "prism/v1/prism.pb-c.h"
#include "trace_bin.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define TS "1700000000.5"

static const char *write_bytes(const char *name, const void *data, size_t len)
{
    static char path[1024];
    snprintf(path, sizeof path, "%s/%s", prism_scratch_dir(), name);
    FILE *f = fopen(path, "wb");
    CU_ASSERT_FATAL(f != NULL);
    CU_ASSERT_FATAL(len == 0 || fwrite(data, 1, len, f) == len);
    CU_ASSERT_FATAL(fclose(f) == 0);
    return path;
}

/* Runs prismctl replay --timestamp TS [extra...] path. */
static prism_proc_result run_replay(const char *path, const char *extra1, const char *extra2)
{
    char bin[512], trace[1024];
    snprintf(bin, sizeof bin, "%s", prism_build_path("service/prismctl"));
    snprintf(trace, sizeof trace, "%s", path);
    char *argv[10];
    int n = 0;
    argv[n++] = bin;
    argv[n++] = "replay";
    argv[n++] = "--timestamp";
    argv[n++] = TS;
    if (extra1)
        argv[n++] = (char *)extra1;
    if (extra2)
        argv[n++] = (char *)extra2;
    argv[n++] = trace;
    argv[n] = NULL;
    prism_proc_result res;
    CU_ASSERT_FATAL(prism_run_process(argv, NULL, 120, &res) == 0);
    return res;
}

static const char *const small_config = "{\"warmup_steps\": 2, \"update_interval_steps\": 2, \"history_window\": 2, "
                                        "\"min_steps_between_switches\": 0}";

static void load_config(const char *text, prism_config *cfg)
{
    prism_error err = {0};
    CU_ASSERT_FATAL(prism_config_load_buffer(text, strlen(text), "test", cfg, &err) == PRISM_OK);
}

/* The figures rank r reports for block b at step s: every block differs, and block 2's norm
 * changes over the run so that it switches. */
static prism_block_stats report(unsigned s, unsigned r, unsigned b)
{
    double l2 = (double)(b + 1) * (r ? 1.25 : 0.75);
    if (b == 2)
        l2 = s <= 4 ? 0.1 : 9.0;
    return (prism_block_stats){b, l2, 0.5 + b, 0.01 * (r + 1), 0.25 * (b + 1), 1000 + 10 * b, 0, false, 0, 0};
}

#define NBLOCKS 5
#define NSTEPS 10

/* The same run twice: as a JSONL trace of two ranks' reports (with a layout and a calibration
 * line) and as the binary trace prismd would record of it (merged by the same merger). */
static void write_run(const char *config_text, char **jsonl_path, char **bin_path)
{
    static char jsonl[1 << 16];
    jsonl[0] = '\0';
    prism_buf bin = {0};
    prism_error err = {0};
    prism_config cfg;
    load_config(config_text, &cfg);
    CU_ASSERT_FATAL(prism_trace_bin_header(&bin, "job-a", 1, 1700000000000ull, &cfg, false, &err) == PRISM_OK);
    uint32_t ids[NBLOCKS];
    uint64_t bytes[NBLOCKS];
    strcat(jsonl, "{\"layout\": {\"blocks\": [");
    for (unsigned b = 0; b < NBLOCKS; b++) {
        ids[b] = b;
        bytes[b] = 1000u * (b + 1);
        sprintf(jsonl + strlen(jsonl), "%s{\"id\": %u, \"param_bytes_bf16\": %llu}", b ? ", " : "", b,
                (unsigned long long)bytes[b]);
    }
    strcat(jsonl, "]}}\n");
    CU_ASSERT_FATAL(prism_trace_bin_layout(&bin, ids, bytes, NBLOCKS, &err) == PRISM_OK);
    prism_merger *m = prism_merger_create(2, 2000, &err);
    CU_ASSERT_FATAL(m != NULL);
    for (unsigned s = 1; s <= NSTEPS; s++) {
        if (s == 5) {
            uint32_t cal_ids[] = {1, 3};
            double cal_errors[] = {0.01, 0.2};
            strcat(jsonl, "{\"calibration\": {\"format\": \"int8\", \"errors\": {\"1\": 0.01, \"3\": 0.2}}}\n");
            CU_ASSERT_FATAL(prism_trace_bin_calibration(&bin, PRISM_PRECISION_INT8, cal_ids, cal_errors, 2, &err) ==
                            PRISM_OK);
        }
        for (unsigned r = 0; r < 2; r++) {
            prism_block_stats blocks[NBLOCKS];
            sprintf(jsonl + strlen(jsonl), "{\"step\": %u, \"rank\": %u, \"loss\": %g, \"blocks\": [", s, r,
                    2.0 + 0.125 * r - 0.0625 * s);
            for (unsigned b = 0; b < NBLOCKS; b++) {
                blocks[b] = report(s, r, b);
                sprintf(jsonl + strlen(jsonl),
                        "%s{\"id\": %u, \"l2\": %.17g, \"max_abs\": %.17g, \"mean\": %.17g, \"variance\": %.17g, "
                        "\"numel\": %llu}",
                        b ? ", " : "", b, blocks[b].l2_norm, blocks[b].max_abs, blocks[b].mean, blocks[b].variance,
                        (unsigned long long)blocks[b].numel);
            }
            strcat(jsonl, "]}\n");
            prism_merge_outcome outcome;
            CU_ASSERT_FATAL(prism_merger_add(m, r, s, true, 2.0 + 0.125 * r - 0.0625 * s, blocks, NBLOCKS, 0,
                                             &outcome, &err) == PRISM_OK);
        }
        prism_merged_step ms;
        CU_ASSERT_FATAL(prism_merger_next(m, 0, &ms));
        CU_ASSERT_FATAL(prism_trace_bin_step(&bin, &ms, false, &err) == PRISM_OK);
    }
    prism_merger_destroy(m);
    prism_config_free(&cfg);
    *jsonl_path = strdup(prism_write_file(prism_scratch_dir(), "run.jsonl", jsonl));
    *bin_path = strdup(write_bytes("run.ptrace", bin.data, bin.len));
    prism_buf_free(&bin);
}

/* The binary trace (its header's config) and the JSONL trace (the same config by --config) give
 * the same records byte for byte, "loss" included. */
static void test_binary_replay_equals_the_jsonl_replay_of_the_same_steps(void)
{
    char *jsonl, *bin;
    write_run(small_config, &jsonl, &bin);
    const char *cfg_path = prism_write_file(prism_scratch_dir(), "cfg.json", small_config);
    char config_arg[1024];
    snprintf(config_arg, sizeof config_arg, "--config=%s", cfg_path);
    prism_proc_result a = run_replay(jsonl, config_arg, NULL);
    prism_proc_result b = run_replay(bin, NULL, NULL);
    CU_ASSERT_EQUAL(a.exit_code, 0);
    CU_ASSERT_EQUAL(b.exit_code, 0);
    CU_ASSERT(a.out_len > 0);
    CU_ASSERT_EQUAL(a.out_len, b.out_len);
    CU_ASSERT_STRING_EQUAL(a.out, b.out);
    /* 10 steps, decisions at 2, 4, 6, 8, 10; the step-2 record's loss is the mean of the ranks'. */
    CU_ASSERT_PTR_NOT_NULL(strstr(b.err, "10 steps, 5 decisions"));
    CU_ASSERT_PTR_NOT_NULL(strstr(b.out, "{\"step_id\":2,\"timestamp\":1700000000.5,"));
    CU_ASSERT_PTR_NOT_NULL(strstr(b.out, ",\"loss\":1.9375,\"block_details\""));
    /* Blocks 0 and 2 (1000 and 3000 of 15000 bytes) go low at step 2; block 2's norm grows at
     * step 5, and it goes back to bf16 at step 6. */
    CU_ASSERT_PTR_NOT_NULL(strstr(b.out, "\"precision_changes\":2,\"estimated_bandwidth_saving_pct\":13.3,"
                                         "\"low_precision\":\"int8\",\"map_version\":1,\"loss\":1.9375,"));
    CU_ASSERT_PTR_NOT_NULL(strstr(b.out, "\"precision_changes\":1,\"estimated_bandwidth_saving_pct\":3.3,"
                                         "\"low_precision\":\"int8\",\"map_version\":2,\"loss\":1.6875,"));
    /* The same binary trace with --config: the header's config is ignored, and said so. */
    prism_proc_result c = run_replay(bin, config_arg, NULL);
    CU_ASSERT_EQUAL(c.exit_code, 0);
    CU_ASSERT_STRING_EQUAL(c.out, b.out);
    CU_ASSERT_PTR_NOT_NULL(strstr(c.err, "the trace's 1 configs (headers and PATCHes) were ignored"));
    prism_proc_result_free(&a);
    prism_proc_result_free(&b);
    prism_proc_result_free(&c);
    free(jsonl);
    free(bin);
}

/* A trace of one block per step, steps 1..n, equal norms (every block low at the first decision
 * under int8_threshold 0.55: s = 0.5). */
static void append_steps(prism_buf *bin, unsigned from, unsigned to, bool bump_at_decisions)
{
    prism_error err = {0};
    for (unsigned s = from; s <= to; s++) {
        prism_block_stats blocks[2] = {{0, 1.0, 1, 0, 0, 10, 0, false, 0, 0}, {1, 1.0, 1, 0, 0, 10, 0, false, 0, 0}};
        prism_merged_step m = {s, 1, false, 0, blocks, 2};
        CU_ASSERT_FATAL(prism_trace_bin_step(bin, &m, bump_at_decisions && s % 2 == 0, &err) == PRISM_OK);
    }
}

/* A config record (a PATCH) applies at the next decision; a later segment's header repeating the
 * config in force changes nothing; a bumped step's record shows the new map version. */
static void test_binary_replay_applies_config_records_headers_and_version_bumps(void)
{
    prism_buf bin = {0};
    prism_error err = {0};
    prism_config cfg, patched;
    load_config(small_config, &cfg);
    load_config("{\"warmup_steps\": 2, \"update_interval_steps\": 2, \"history_window\": 2, "
                "\"min_steps_between_switches\": 0, \"low_precision\": \"fp8_e4m3\"}",
                &patched);
    CU_ASSERT_FATAL(prism_trace_bin_header(&bin, "job-b", 1, 1, &cfg, false, &err) == PRISM_OK);
    append_steps(&bin, 1, 2, false); /* decision at 2: both blocks int8 (s = 0.5 is ambiguous: bf16) */
    CU_ASSERT_FATAL(prism_trace_bin_config(&bin, &patched, &err) == PRISM_OK);
    append_steps(&bin, 3, 3, false);
    /* segment 2 starts: the config in force is still cfg, the next one patched */
    CU_ASSERT_FATAL(prism_trace_bin_header(&bin, "job-b", 2, 2, &cfg, false, &err) == PRISM_OK);
    CU_ASSERT_FATAL(prism_trace_bin_config(&bin, &patched, &err) == PRISM_OK);
    append_steps(&bin, 4, 6, true); /* decisions at 4 (fp8) and 6, each followed by a bump */
    const char *path = write_bytes("cfg.ptrace", bin.data, bin.len);
    prism_proc_result r = run_replay(path, NULL, NULL);
    CU_ASSERT_EQUAL(r.exit_code, 0);
    const char *expect[] = {
        "{\"step_id\":2,\"timestamp\":1700000000.5,\"blocks_bf16\":2,\"blocks_int8\":0,\"mean_sensitivity\":0.5,"
        "\"max_sensitivity\":0.5,\"min_sensitivity\":0.5,\"precision_changes\":0,\"estimated_bandwidth_saving_pct\":0.0,"
        "\"low_precision\":\"int8\",\"map_version\":0,\"block_details\":{",
        "{\"step_id\":4,\"timestamp\":1700000000.5,\"blocks_bf16\":2,\"blocks_int8\":0,\"mean_sensitivity\":0.5,"
        "\"max_sensitivity\":0.5,\"min_sensitivity\":0.5,\"precision_changes\":0,\"estimated_bandwidth_saving_pct\":0.0,"
        "\"low_precision\":\"fp8_e4m3\",\"map_version\":1,\"block_details\":{",
        "{\"step_id\":6,\"timestamp\":1700000000.5,\"blocks_bf16\":2,\"blocks_int8\":0,\"mean_sensitivity\":0.5,"
        "\"max_sensitivity\":0.5,\"min_sensitivity\":0.5,\"precision_changes\":0,\"estimated_bandwidth_saving_pct\":0.0,"
        "\"low_precision\":\"fp8_e4m3\",\"map_version\":2,\"block_details\":{",
    };
    const char *line = r.out;
    for (size_t i = 0; i < sizeof expect / sizeof expect[0]; i++) {
        CU_ASSERT_FATAL(line != NULL && *line);
        if (strncmp(line, expect[i], strlen(expect[i])) != 0)
            fprintf(stderr, "record %zu: %.300s\n", i, line);
        CU_ASSERT_EQUAL(strncmp(line, expect[i], strlen(expect[i])), 0);
        line = strchr(line, '\n');
        line = line ? line + 1 : NULL;
    }
    CU_ASSERT_PTR_NOT_NULL(strstr(r.err, "6 steps, 3 decisions, map_version 2; binary trace: 10 records, segments 1 to 2"));
    prism_proc_result_free(&r);
    prism_buf_free(&bin);
    prism_config_free(&cfg);
    prism_config_free(&patched);
}

/* A trace whose first header is of a later segment, or restored: it replays, with a note. */
static void test_binary_replay_notes_dropped_segments_and_restarts(void)
{
    for (int restored = 0; restored < 2; restored++) {
        prism_buf bin = {0};
        prism_error err = {0};
        prism_config cfg;
        load_config(small_config, &cfg);
        CU_ASSERT_FATAL(prism_trace_bin_header(&bin, "job-c", restored ? 1 : 7, 1, &cfg, restored, &err) == PRISM_OK);
        append_steps(&bin, 40, 41, false);
        const char *path = write_bytes("late.ptrace", bin.data, bin.len);
        prism_proc_result r = run_replay(path, NULL, NULL);
        CU_ASSERT_EQUAL(r.exit_code, 0);
        CU_ASSERT_PTR_NOT_NULL(strstr(r.out, "{\"step_id\":41,"));
        CU_ASSERT_PTR_NOT_NULL(strstr(r.err, restored ? "note: the trace continues after prismd restored the job"
                                                      : "note: the trace starts after older segments were dropped"));
        prism_proc_result_free(&r);
        prism_buf_free(&bin);
        prism_config_free(&cfg);
    }
}

/* Packs one TraceRecord with its length prefix into out (at most cap bytes); returns the length. */
static size_t frame(const Prism__V1__TraceRecord *rec, uint8_t *out, size_t cap)
{
    size_t size = protobuf_c_message_get_packed_size(&rec->base);
    CU_ASSERT_FATAL(size < 128 && size + 1 <= cap);
    out[0] = (uint8_t)size;
    protobuf_c_message_pack(&rec->base, out + 1);
    return size + 1;
}

typedef struct bad_case {
    const char *what;
    uint8_t bytes[256];
    size_t len;
    const char *expected;
} bad_case;

/* Every bad input of the binary reader: exit 2, nothing on stdout, the record, byte and field. */
static void test_binary_replay_rejects_bad_records_naming_record_and_byte(void)
{
    prism_buf good = {0};
    prism_error err = {0};
    prism_config cfg;
    load_config(small_config, &cfg);
    CU_ASSERT_FATAL(prism_trace_bin_header(&good, "j", 1, 1, &cfg, false, &err) == PRISM_OK);
    append_steps(&good, 1, 2, false);
    size_t head = good.len;
    static bad_case cases[10];
    size_t n = 0;
    /* truncated: the last record cut short by 3 bytes */
    cases[n] = (bad_case){"truncated", {0}, 0, NULL};
    n++;
    /* bad length: a varint of 11 bytes */
    cases[n] = (bad_case){"bad length", {0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01}, 11,
                          "the length prefix is cut short or longer than 10 bytes"};
    n++;
    /* a length over the 1 GiB record limit: 2^30 + 1 */
    cases[n] = (bad_case){"over the limit", {0x81, 0x80, 0x80, 0x80, 0x04}, 5,
                          "a length of 1073741825 bytes is over the 1073741824-byte limit of a record"};
    n++;
    /* a calibration naming block 7 twice */
    {
        Prism__V1__BlockError e[3] = {PRISM__V1__BLOCK_ERROR__INIT, PRISM__V1__BLOCK_ERROR__INIT,
                                      PRISM__V1__BLOCK_ERROR__INIT};
        e[0].block_id = 7;
        e[0].relative_error = 0.1;
        e[1].block_id = 3;
        e[1].relative_error = 0.2;
        e[2].block_id = 7;
        e[2].relative_error = 0.3;
        Prism__V1__BlockError *ep[3] = {&e[0], &e[1], &e[2]};
        Prism__V1__CalibrationErrors cal = PRISM__V1__CALIBRATION_ERRORS__INIT;
        cal.format = PRISM__V1__PRECISION__INT8;
        cal.n_errors = 3;
        cal.errors = ep;
        Prism__V1__TraceRecord rec = PRISM__V1__TRACE_RECORD__INIT;
        rec.record_case = PRISM__V1__TRACE_RECORD__RECORD_CALIBRATION;
        rec.calibration = &cal;
        cases[n] = (bad_case){"repeated calibration block", {0}, 0,
                              "calibration.errors[2].block_id: block 7 appears twice in this record"};
        cases[n].len = frame(&rec, cases[n].bytes, sizeof cases[n].bytes);
        n++;
    }
    /* unknown kind: a record holding only field 9 */
    cases[n] = (bad_case){"unknown kind", {0x02, 0x4a, 0x00}, 3, "a record of an unknown kind"};
    n++;
    /* not a TraceRecord at all */
    cases[n] = (bad_case){"garbage", {0x02, 0xff, 0xff}, 3, "not a prism.v1.TraceRecord"};
    n++;
    /* a config record the loader refuses */
    {
        Prism__V1__TraceRecord rec = PRISM__V1__TRACE_RECORD__INIT;
        rec.record_case = PRISM__V1__TRACE_RECORD__RECORD_CONFIG_JSON;
        rec.config_json = "{\"bf16_threshold\": 2}";
        cases[n] = (bad_case){"bad config", {0}, 0, "config_json: bf16_threshold: 2 is outside [0, 1]"};
        cases[n].len = frame(&rec, cases[n].bytes, sizeof cases[n].bytes);
        n++;
    }
    /* a step with a negative norm */
    {
        Prism__V1__BlockGradStats b = PRISM__V1__BLOCK_GRAD_STATS__INIT;
        b.block_id = 4;
        b.l2_norm = -1;
        b.numel = 1;
        Prism__V1__BlockGradStats *bp = &b;
        Prism__V1__StepReport sr = PRISM__V1__STEP_REPORT__INIT;
        sr.step = 3;
        sr.n_blocks = 1;
        sr.blocks = &bp;
        Prism__V1__TraceStep ts = PRISM__V1__TRACE_STEP__INIT;
        ts.merged = &sr;
        ts.ranks = 1;
        Prism__V1__TraceRecord rec = PRISM__V1__TRACE_RECORD__INIT;
        rec.record_case = PRISM__V1__TRACE_RECORD__RECORD_STEP;
        rec.step = &ts;
        cases[n] = (bad_case){"negative figure", {0}, 0, "step.merged.blocks[0]: block 4: l2_norm -1 is negative"};
        cases[n].len = frame(&rec, cases[n].bytes, sizeof cases[n].bytes);
        n++;
    }
    /* a step the policy refuses: not after the last one */
    {
        prism_buf one = {0};
        append_steps(&one, 2, 2, false);
        CU_ASSERT_FATAL(one.len <= sizeof cases[n].bytes);
        cases[n] = (bad_case){"step out of order", {0}, one.len, "step 2 is not after the last step 2"};
        memcpy(cases[n].bytes, one.data, one.len);
        prism_buf_free(&one);
        n++;
    }
    for (size_t i = 0; i < n; i++) {
        prism_buf trace = {0};
        char expected[256];
        if (i == 0) {
            CU_ASSERT_FATAL(prism_buf_append(&trace, good.data, good.len - 3) == PRISM_OK);
            /* the third record (the second step) starts after the header and one step */
            prism_buf probe = {0};
            append_steps(&probe, 1, 1, false);
            snprintf(expected, sizeof expected, "record 3 (byte %zu): a length of", head - probe.len);
            prism_buf_free(&probe);
        } else {
            CU_ASSERT_FATAL(prism_buf_append(&trace, good.data, good.len) == PRISM_OK);
            CU_ASSERT_FATAL(prism_buf_append(&trace, (const char *)cases[i].bytes, cases[i].len) == PRISM_OK);
            snprintf(expected, sizeof expected, "bad.ptrace: record 4 (byte %zu): %s", good.len, cases[i].expected);
        }
        const char *path = write_bytes("bad.ptrace", trace.data, trace.len);
        prism_proc_result r = run_replay(path, NULL, NULL);
        if (r.exit_code != 2 || r.out_len != 0 || !strstr(r.err, expected))
            fprintf(stderr, "case %s: exit %d, stdout %zu bytes, stderr: %s(expected: %s)\n", cases[i].what,
                    r.exit_code, r.out_len, r.err, expected);
        CU_ASSERT_EQUAL(r.exit_code, 2);
        CU_ASSERT_EQUAL(r.out_len, 0);
        CU_ASSERT_PTR_NOT_NULL(strstr(r.err, expected));
        prism_proc_result_free(&r);
        prism_buf_free(&trace);
    }
    /* A trace without a header replays only with --config. */
    prism_buf headless = {0};
    append_steps(&headless, 1, 2, false);
    const char *path = write_bytes("headless.ptrace", headless.data, headless.len);
    prism_proc_result r = run_replay(path, NULL, NULL);
    CU_ASSERT_EQUAL(r.exit_code, 2);
    CU_ASSERT_EQUAL(r.out_len, 0);
    CU_ASSERT_PTR_NOT_NULL(strstr(r.err, "record 1 (byte 0): the trace does not start with a header"));
    prism_proc_result_free(&r);
    const char *cfg_path = prism_write_file(prism_scratch_dir(), "cfg.json", small_config);
    char config_arg[1024];
    snprintf(config_arg, sizeof config_arg, "--config=%s", cfg_path);
    path = write_bytes("headless.ptrace", headless.data, headless.len);
    r = run_replay(path, config_arg, NULL);
    CU_ASSERT_EQUAL(r.exit_code, 0);
    CU_ASSERT_PTR_NOT_NULL(strstr(r.out, "{\"step_id\":2,"));
    prism_proc_result_free(&r);
    prism_buf_free(&headless);
    prism_buf_free(&good);
    prism_config_free(&cfg);
}

/* A text file whose first non-blank byte is not '{' is a JSONL trace with a bad line, not a
 * binary one: the message is the JSONL reader's, naming the line. */
static void test_text_that_is_not_jsonl_gets_the_jsonl_message(void)
{
    static const struct {
        const char *text;
        const char *expected;
    } cases[] = {
        {"[1,2]\n", "text.jsonl:1: expected a JSON object, got an array"},
        {"\n  \n[1,2]\n", "text.jsonl:3: expected a JSON object, got an array"},
        {"\xef\xbb\xbf{\"step\": 1, \"blocks\": []}\n", "text.jsonl:1: "},
        {"hello, world\n", "text.jsonl:1: "},
        {"17\n", "text.jsonl:1: column 2: JSON syntax error: '[' or '{' expected near '17'"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        const char *path = write_bytes("text.jsonl", cases[i].text, strlen(cases[i].text));
        prism_proc_result r = run_replay(path, NULL, NULL);
        if (r.exit_code != 2 || !strstr(r.err, cases[i].expected) || strstr(r.err, "record 1"))
            fprintf(stderr, "case %zu: exit %d, stderr: %s", i, r.exit_code, r.err);
        CU_ASSERT_EQUAL(r.exit_code, 2);
        CU_ASSERT_EQUAL(r.out_len, 0);
        CU_ASSERT_PTR_NOT_NULL(strstr(r.err, cases[i].expected));
        CU_ASSERT_PTR_NULL(strstr(r.err, "record 1"));
        prism_proc_result_free(&r);
    }
    /* Bytes that are not text keep the binary reader's message. */
    const char bin[] = {0x05, 0x01, 0x02};
    const char *path = write_bytes("text.jsonl", bin, sizeof bin);
    prism_proc_result r = run_replay(path, NULL, NULL);
    CU_ASSERT_EQUAL(r.exit_code, 2);
    CU_ASSERT_PTR_NOT_NULL(strstr(r.err, "text.jsonl: record 1 (byte 0): a length of 5 bytes runs past the end"));
    prism_proc_result_free(&r);
}

/* prismd bumps the map version only at a decision: a recorded bump applies when the replayed
 * policy decides at that step too. The trace decided (and bumped) at steps 2, 4, 6 under
 * update_interval_steps 2; replayed under 3 (decisions at 2 and 5) only step 2's bump applies. */
static void test_binary_replay_bumps_only_at_replayed_decisions(void)
{
    prism_buf bin = {0};
    prism_error err = {0};
    prism_config cfg;
    load_config(small_config, &cfg);
    CU_ASSERT_FATAL(prism_trace_bin_header(&bin, "job-v", 1, 1, &cfg, false, &err) == PRISM_OK);
    append_steps(&bin, 1, 6, true);
    const char *path = write_bytes("bumps.ptrace", bin.data, bin.len);
    char trace[1024];
    snprintf(trace, sizeof trace, "%s", path);
    /* as recorded: three decisions, three bumps */
    prism_proc_result r = run_replay(trace, NULL, NULL);
    CU_ASSERT_EQUAL(r.exit_code, 0);
    CU_ASSERT_PTR_NOT_NULL(strstr(r.err, "6 steps, 3 decisions, map_version 3;"));
    prism_proc_result_free(&r);
    const char *interval3 = "{\"warmup_steps\": 2, \"update_interval_steps\": 3, \"history_window\": 2, "
                            "\"min_steps_between_switches\": 0}";
    const char *cfg_path = prism_write_file(prism_scratch_dir(), "interval3.json", interval3);
    char config_arg[1024], rec_arg[1024];
    snprintf(config_arg, sizeof config_arg, "--config=%s", cfg_path);
    snprintf(rec_arg, sizeof rec_arg, "--record=%s/bumps-again.ptrace", prism_scratch_dir());
    r = run_replay(trace, config_arg, rec_arg);
    CU_ASSERT_EQUAL(r.exit_code, 0);
    if (!strstr(r.err, "6 steps, 2 decisions, map_version 1;"))
        fprintf(stderr, "stderr: %s\nstdout: %s", r.err, r.out);
    CU_ASSERT_PTR_NOT_NULL(strstr(r.err, "6 steps, 2 decisions, map_version 1;"));
    CU_ASSERT_PTR_NOT_NULL(strstr(r.out, "{\"step_id\":5,"));
    CU_ASSERT_PTR_NOT_NULL(strstr(r.out, "\"map_version\":1,"));
    CU_ASSERT_PTR_NULL(strstr(r.out, "\"map_version\":2,"));
    /* --record writes the bumps this replay made: its replay agrees */
    char again[1024];
    snprintf(again, sizeof again, "%s/bumps-again.ptrace", prism_scratch_dir());
    prism_proc_result r2 = run_replay(again, NULL, NULL);
    CU_ASSERT_EQUAL(r2.exit_code, 0);
    CU_ASSERT_STRING_EQUAL(r2.out, r.out);
    CU_ASSERT_PTR_NOT_NULL(strstr(r2.err, "6 steps, 2 decisions, map_version 1;"));
    prism_proc_result_free(&r2);
    prism_proc_result_free(&r);
    prism_buf_free(&bin);
    prism_config_free(&cfg);
}

static const prism_test_case cases[] = {
    {"test_binary_replay_equals_the_jsonl_replay_of_the_same_steps",
     test_binary_replay_equals_the_jsonl_replay_of_the_same_steps},
    {"test_binary_replay_applies_config_records_headers_and_version_bumps",
     test_binary_replay_applies_config_records_headers_and_version_bumps},
    {"test_binary_replay_notes_dropped_segments_and_restarts", test_binary_replay_notes_dropped_segments_and_restarts},
    {"test_binary_replay_rejects_bad_records_naming_record_and_byte",
     test_binary_replay_rejects_bad_records_naming_record_and_byte},
    {"test_text_that_is_not_jsonl_gets_the_jsonl_message", test_text_that_is_not_jsonl_gets_the_jsonl_message},
    {"test_binary_replay_bumps_only_at_replayed_decisions", test_binary_replay_bumps_only_at_replayed_decisions},
    {NULL, NULL},
};

static const prism_test_suite suites[] = {{"replay_binary", cases}, {NULL, NULL}};

int main(int argc, char **argv)
{
    return prism_test_main(argc, argv, suites);
}
