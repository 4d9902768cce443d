/* The fast path for JSONL step lines of `prismctl replay` (service/prismctl/replay_load.c) against
 * the strict parser (prism_trace_parse_line, jansson): a line the fast path takes must parse to
 * exactly the same record, every number bit for bit, and a line it leaves must be one the strict
 * parser is asked about (so every error message stays the strict parser's). The usual forms must
 * take the fast path, or the replay would not be fast. */
#define _POSIX_C_SOURCE 200809L
#include "testutil.h"

#include "replay.h"
#include "trace_bin.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static bool same_double(double a, double b)
{
    return memcmp(&a, &b, sizeof a) == 0;
}

/* Parses line both ways; returns whether the fast path took it (and then checks equality). */
static bool compare(const char *line)
{
    prism_trace_record fast, strict;
    prism_trace_record_init(&fast);
    prism_trace_record_init(&strict);
    bool took = replay_parse_step_fast(line, strlen(line), &fast);
    prism_error err = {0};
    prism_status st = prism_trace_parse_line(line, strlen(line), &strict, &err);
    if (took) {
        CU_ASSERT_EQUAL(st, PRISM_OK);
        bool ok = st == PRISM_OK && fast.kind == strict.kind && fast.step == strict.step &&
                  fast.rank == strict.rank && fast.has_loss == strict.has_loss && fast.count == strict.count &&
                  (!fast.has_loss || same_double(fast.loss, strict.loss));
        for (size_t i = 0; ok && i < fast.count; i++) {
            const prism_block_stats *a = &fast.blocks[i], *b = &strict.blocks[i];
            ok = a->block_id == b->block_id && same_double(a->l2_norm, b->l2_norm) &&
                 same_double(a->max_abs, b->max_abs) && same_double(a->mean, b->mean) &&
                 same_double(a->variance, b->variance) && a->numel == b->numel && a->nonfinite == b->nonfinite;
        }
        if (!ok)
            fprintf(stderr, "differs: %s (%s)\n", line, st ? err.message : "");
        CU_ASSERT_TRUE(ok);
    }
    prism_trace_record_free(&fast);
    prism_trace_record_free(&strict);
    return took;
}

static void test_fast_path_takes_the_usual_lines(void)
{
    static const char *const lines[] = {
        "{\"step\": 1, \"rank\": 0, \"loss\": 2.5, \"blocks\": [{\"id\": 0, \"l2\": 1, \"max_abs\": 1, \"numel\": 100}]}",
        "{\"step\":7,\"blocks\":[{\"id\":3,\"l2\":0.1,\"max_abs\":0.01,\"mean\":-1e-05,\"variance\":2.5e-7,\"numel\":10,"
        "\"nonfinite\":0},{\"id\":1,\"l2\":3.14159,\"max_abs\":1E2,\"numel\":1}]}",
        "  {\"blocks\": [], \"step\": 9007199253740991, \"loss\": null}\r",
        "{\"step\": 2, \"loss\": -0.0, \"blocks\": [{\"numel\": 4, \"id\": 4294967295, \"max_abs\": 0, \"l2\": -0}]}",
        "{\"step\": 3, \"blocks\": [{\"id\": 2, \"l2\": 0.30000000000000004, \"max_abs\": 1.7976931348623157e308, "
        "\"numel\": 999999999999999999, \"nonfinite\": 999999999999999999}]}",
        "{\"step\": 4, \"blocks\": [{\"id\": 2, \"l2\": 4.9406564584124654e-324, \"max_abs\": 1234567890123456789012.5, "
        "\"numel\": 1}, {\"id\": 1, \"l2\": 1e-400, \"max_abs\": 0.000000000000000000000000001, \"numel\": 1}]}",
    };
    for (size_t i = 0; i < sizeof lines / sizeof lines[0]; i++) {
        bool took = compare(lines[i]);
        if (!took)
            fprintf(stderr, "not taken: %s\n", lines[i]);
        CU_ASSERT_TRUE(took);
    }
}

/* Lines the fast path must leave to the strict parser: errors of every kind, escapes, and
 * numbers jansson refuses or reads as integers where a real is expected. */
static void test_fast_path_leaves_errors_and_rare_forms_to_the_strict_parser(void)
{
    static const char *const lines[] = {
        "",
        "   ",
        "{\"calibration\": {\"format\": \"int8\", \"errors\": {\"1\": 0.1}}}",
        "{\"layout\": {\"blocks\": []}}",
        "{\"step\": 1, \"blocks\": [{\"id\": 0, \"l2\": \"x\", \"max_abs\": 1, \"numel\": 1}]}",
        "{\"step\": 1, \"blocks\": [{\"id\": 0, \"l2\": -1, \"max_abs\": 1, \"numel\": 1}]}",
        "{\"step\": 1, \"blocks\": [{\"id\": 0, \"l2\": 1, \"numel\": 1}]}",
        "{\"step\": 1, \"blocks\": [{\"id\": 0, \"l2\": 1, \"max_abs\": 1, \"numel\": 1, \"colour\": 2}]}",
        "{\"step\": 1, \"blocks\": [{\"id\": 0, \"l2\": 1, \"max_abs\": 1, \"numel\": 1}, {\"id\": 0, \"l2\": 1, "
        "\"max_abs\": 1, \"numel\": 1}]}",
        "{\"step\": -3, \"blocks\": []}",
        "{\"blocks\": []}",
        "{\"step\": 1}",
        "{\"step\": 1, \"step\": 2, \"blocks\": []}",
        "{\"step\": 1, \"blocks\": [{\"id\": 0, \"l2\": 1, \"l2\": 2, \"max_abs\": 1, \"numel\": 1}]}",
        "{\"step\": 1, \"blocks\": [{\"id\": 0, \"l2\": 1, \"max_abs\": 1, \"numel\": 1, \"nonfinite\": 2}]}",
        "{\"step\": 1, \"blocks\": [}",
        "{\"step\": 1, \"blocks\": []} x",
        "{\"step\": 1, \"blocks\": [],}",
        "{\"st\\u0065p\": 1, \"blocks\": []}",
        "{\"step\": 1.0, \"blocks\": []}",
        "{\"step\": 1e2, \"blocks\": []}",
        "{\"step\": 01, \"blocks\": []}",
        "{\"step\": 1, \"blocks\": [{\"id\": 0, \"l2\": .5, \"max_abs\": 1, \"numel\": 1}]}",
        "{\"step\": 1, \"blocks\": [{\"id\": 0, \"l2\": 1., \"max_abs\": 1, \"numel\": 1}]}",
        "{\"step\": 1, \"blocks\": [{\"id\": 0, \"l2\": +1, \"max_abs\": 1, \"numel\": 1}]}",
        "{\"step\": 1, \"blocks\": [{\"id\": 0, \"l2\": 1e999, \"max_abs\": 1, \"numel\": 1}]}",
        "{\"step\": 1, \"blocks\": [{\"id\": 0, \"l2\": 1, \"max_abs\": 1, \"numel\": 99999999999999999999}]}",
        "{\"step\": 1, \"blocks\": [{\"id\": 0, \"l2\": 1, \"max_abs\": 123456789012345678901234567890, \"numel\": 1}]}",
        "{\"step\": 1, \"blocks\": [{\"id\": 0, \"l2\": 1, \"max_abs\": 1, \"numel\": 9223372036854775807}]}",
        "{\"step\": 1, \"blocks\": [{\"id\": 4294967296, \"l2\": 1, \"max_abs\": 1, \"numel\": 1}]}",
        "{\"step\": 1, \"rank\": 4294967295, \"blocks\": []}",
        "{\"step\": 9007199253740992, \"blocks\": []}",
        "{\"step\": 1, \"loss\": true, \"blocks\": []}",
        "{\"step\": 1, \"blocks\": [7]}",
        "{\"step\": 1, \"blocks\": [{}]}",
        "[1, 2]",
        "{\"step\": 1, \"blocks\": []}\x01",
        "{\"step\": 1, \"blocks\": [{\"id\": 0, \"l2\": 1, \"max_abs\": 1, \"numel\": 1, \"nonfinite\": -1}]}",
    };
    for (size_t i = 0; i < sizeof lines / sizeof lines[0]; i++) {
        bool took = compare(lines[i]);
        if (took)
            fprintf(stderr, "taken: %s\n", lines[i]);
        CU_ASSERT_FALSE(took);
    }
}

static uint64_t state = 0x243f6a8885a308d3ull;

static uint64_t next_u64(void)
{
    uint64_t z = (state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* Numbers written every way a program writes them read back bit for bit as jansson reads them. */
static void test_fast_path_reads_numbers_as_jansson_does(void)
{
    char line[2048];
    size_t taken = 0, total = 0;
    for (int i = 0; i < 60000; i++) {
        double x;
        uint64_t r = next_u64();
        switch (i % 4) {
        case 0: x = (double)(r >> 11) / 9007199254740992.0; break;
        case 1: x = (double)(r >> 11) * pow(10, (int)(next_u64() % 60) - 30); break;
        case 2: x = (double)(r % 100000) / 1000.0; break;
        default: memcpy(&x, &r, sizeof x); x = isfinite(x) ? fabs(x) : 1.0; break;
        }
        char num[400];
        switch (i % 10) {
        case 0: snprintf(num, sizeof num, "%.17g", x); break;
        case 1: snprintf(num, sizeof num, "%.15g", x); break;
        case 2: snprintf(num, sizeof num, "%g", x); break;
        case 3: snprintf(num, sizeof num, "%.3e", x); break;
        case 4: snprintf(num, sizeof num, "%.20e", x); break;
        case 5: snprintf(num, sizeof num, "%.1f", x); break;
        case 6: snprintf(num, sizeof num, "%.25f", x); break;
        case 7: snprintf(num, sizeof num, "%.0f", x); break;
        case 8: snprintf(num, sizeof num, "%E", x); break;
        default: snprintf(num, sizeof num, "%.16g", x); break;
        }
        snprintf(line, sizeof line,
                 "{\"step\": %d, \"loss\": -%s, \"blocks\": [{\"id\": 1, \"l2\": %s, \"max_abs\": %s, \"mean\": -%s, "
                 "\"numel\": %llu}]}",
                 i, num, num, num, num, (unsigned long long)(r >> (12 + r % 52)));
        total++;
        taken += compare(line);
    }
    /* Left: numbers longer than the fast path's buffer (%.25f of huge values) and the %.0f of
     * values past 18 digits (integers jansson may refuse). */
    if (taken <= total * 8 / 10)
        fprintf(stderr, "fast path took %zu of %zu lines\n", taken, total);
    CU_ASSERT(taken > total * 8 / 10);
}

/* Issue 17's per-block "saturated" and "underflowed": read by the strict parser only (the fast
 * path leaves such lines to it), both or neither, each in [0, 1]; and carried by the binary
 * trace both ways. */
static void test_saturation_figures_in_jsonl_and_binary_traces(void)
{
    const char *line = "{\"step\": 5, \"blocks\": [{\"id\": 1, \"l2\": 1, \"max_abs\": 1, \"numel\": 8, "
                       "\"saturated\": 0.25, \"underflowed\": 0.125}, {\"id\": 2, \"l2\": 1, \"max_abs\": 1, "
                       "\"numel\": 8}]}";
    CU_ASSERT_FALSE(compare(line));
    prism_trace_record rec;
    prism_trace_record_init(&rec);
    prism_error err = {0};
    CU_ASSERT_EQUAL_FATAL(prism_trace_parse_line(line, strlen(line), &rec, &err), PRISM_OK);
    CU_ASSERT_EQUAL_FATAL(rec.count, 2);
    CU_ASSERT_TRUE(rec.blocks[0].has_saturation);
    CU_ASSERT_EQUAL(rec.blocks[0].saturated_fraction, 0.25);
    CU_ASSERT_EQUAL(rec.blocks[0].underflowed_fraction, 0.125);
    CU_ASSERT_FALSE(rec.blocks[1].has_saturation);
    static const struct {
        const char *block;
        const char *want;
    } bad[] = {
        {"\"saturated\": 0.5", "blocks[0].underflowed: missing"},
        {"\"underflowed\": 0.5", "blocks[0].saturated: missing"},
        {"\"saturated\": 1.5, \"underflowed\": 0", "blocks[0].saturated: 1.5 is above 1"},
        {"\"saturated\": 0, \"underflowed\": 2", "blocks[0].underflowed: 2 is above 1"},
        {"\"saturated\": -0.5, \"underflowed\": 0", "blocks[0].saturated: -0.5 is negative"},
        {"\"saturated\": \"x\", \"underflowed\": 0", "blocks[0].saturated: expected a number"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        char text[256];
        snprintf(text, sizeof text, "{\"step\": 1, \"blocks\": [{\"id\": 0, \"l2\": 1, \"max_abs\": 1, \"numel\": 1, %s}]}",
                 bad[i].block);
        CU_ASSERT_FALSE(compare(text));
        prism_status st = prism_trace_parse_line(text, strlen(text), &rec, &err);
        if (st != PRISM_ERR_INVALID || !strstr(err.message, bad[i].want))
            fprintf(stderr, "case %zu: %s\n", i, err.message);
        CU_ASSERT_EQUAL(st, PRISM_ERR_INVALID);
        CU_ASSERT_PTR_NOT_NULL(strstr(err.message, bad[i].want));
    }
    /* The binary trace: written by prismd's writer, read back the same. */
    prism_block_stats blocks[2] = {{1, 1, 1, 0, 0, 8, 0, true, 0.25, 0.125}, {2, 1, 1, 0, 0, 8, 0, false, 0, 0}};
    prism_merged_step m = {5, 2, true, 1.5, blocks, 2};
    prism_buf buf = {0};
    CU_ASSERT_EQUAL_FATAL(prism_trace_bin_step(&buf, &m, false, &err), PRISM_OK);
    prism_trace_bin_reader rd;
    prism_trace_bin_reader_init(&rd, buf.data, buf.len);
    CU_ASSERT_EQUAL_FATAL(prism_trace_bin_next(&rd, &rec, &err), PRISM_OK);
    CU_ASSERT_EQUAL(rec.kind, PRISM_TRACE_STEP);
    CU_ASSERT_EQUAL_FATAL(rec.count, 2);
    CU_ASSERT_TRUE(rec.blocks[0].has_saturation);
    CU_ASSERT_EQUAL(rec.blocks[0].saturated_fraction, 0.25);
    CU_ASSERT_EQUAL(rec.blocks[0].underflowed_fraction, 0.125);
    CU_ASSERT_FALSE(rec.blocks[1].has_saturation);
    CU_ASSERT_EQUAL(rec.blocks[1].saturated_fraction, 0.0);
    /* A figure out of range in a binary trace is refused as the live policy refuses it. */
    buf.len = 0;
    blocks[0].saturated_fraction = 2.0;
    CU_ASSERT_EQUAL_FATAL(prism_trace_bin_step(&buf, &m, false, &err), PRISM_OK);
    prism_trace_bin_reader_init(&rd, buf.data, buf.len);
    CU_ASSERT_EQUAL(prism_trace_bin_next(&rd, &rec, &err), PRISM_ERR_INVALID);
    CU_ASSERT_PTR_NOT_NULL(strstr(err.message, "block 1: saturated_fraction 2 is not in [0, 1]"));
    prism_buf_free(&buf);
    prism_trace_record_free(&rec);
}

static const prism_test_case cases[] = {
    {"test_fast_path_takes_the_usual_lines", test_fast_path_takes_the_usual_lines},
    {"test_fast_path_leaves_errors_and_rare_forms_to_the_strict_parser",
     test_fast_path_leaves_errors_and_rare_forms_to_the_strict_parser},
    {"test_fast_path_reads_numbers_as_jansson_does", test_fast_path_reads_numbers_as_jansson_does},
    {"test_saturation_figures_in_jsonl_and_binary_traces", test_saturation_figures_in_jsonl_and_binary_traces},
    {NULL, NULL},
};

static const prism_test_suite suites[] = {{"replay_parse", cases}, {NULL, NULL}};

int main(int argc, char **argv)
{
    return prism_test_main(argc, argv, suites);
}
