/* A job's telemetry files (service/prismd/telemetry_files.c): rotation keeps N files and drops
 * the oldest; the reader streams the records across them, oldest first, in bounded chunks, with
 * exact output for since_step, limit, the byte cap, lines still being written and lines longer
 * than its buffer. */
#include "testutil.h"

#include "telemetry_files.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static char path[4096];

static void write_text(const char *name, const char *text)
{
    FILE *f = fopen(name, "w");
    CU_ASSERT_FATAL(f != NULL);
    fputs(text, f);
    fclose(f);
}

static const char *suffixed(const char *suffix)
{
    static char name[4200];
    snprintf(name, sizeof name, "%s%s", path, suffix);
    return name;
}

static void fresh(void)
{
    snprintf(path, sizeof path, "%s/t.jsonl", prism_scratch_dir());
    for (int i = 0; i < 6; i++) {
        char s[8] = "";
        if (i)
            snprintf(s, sizeof s, ".%d", i);
        unlink(suffixed(s));
    }
}

/* The whole answer of a reader, read in pieces of at most step bytes. Caller frees. */
static char *read_all(prismd_telemetry_reader *r, size_t step)
{
    size_t cap = 1 << 16, len = 0;
    char *out = malloc(cap);
    for (int guard = 0; guard < 10000000; guard++) {
        if (cap - len < step + 1) {
            cap = 2 * cap + step;
            out = realloc(out, cap);
        }
        ssize_t n = prismd_telemetry_reader_read(r, out + len, step);
        CU_ASSERT_FATAL(n >= 0);
        if (n == 0)
            break;
        len += (size_t)n;
    }
    out[len] = '\0';
    return out;
}

static char *answer(size_t keep, uint64_t since, uint64_t limit, size_t max_bytes, size_t step)
{
    prismd_telemetry_reader *r = prismd_telemetry_reader_open(path, keep, "job-a", since, limit, max_bytes);
    CU_ASSERT_FATAL(r != NULL);
    char *text = read_all(r, step);
    prismd_telemetry_reader_close(r);
    return text;
}

static void test_reader_reads_rotated_files_oldest_first(void)
{
    fresh();
    write_text(suffixed(".2"), "{\"step_id\":2}\n{\"step_id\":4}\n");
    write_text(suffixed(".1"), "{\"step_id\":6}\n");
    write_text(path, "{\"step_id\":8}\n{\"step_id\":10}\n");
    char *all = answer(3, 0, 1000, SIZE_MAX, 65536);
    CU_ASSERT_STRING_EQUAL(all, "{\"job_id\":\"job-a\",\"records\":[{\"step_id\":2},{\"step_id\":4},{\"step_id\":6},"
                                "{\"step_id\":8},{\"step_id\":10}]}");
    free(all);
    /* keep 1: PATH.2 is not read. */
    all = answer(1, 0, 1000, SIZE_MAX, 65536);
    CU_ASSERT_STRING_EQUAL(all,
                           "{\"job_id\":\"job-a\",\"records\":[{\"step_id\":6},{\"step_id\":8},{\"step_id\":10}]}");
    free(all);
}

static void test_reader_applies_since_and_limit(void)
{
    fresh();
    write_text(suffixed(".1"), "{\"step_id\":2}\n{\"step_id\":4}\n");
    write_text(path, "{\"step_id\":6}\n{\"step_id\":8}\n");
    char *text = answer(2, 4, 2, SIZE_MAX, 65536);
    CU_ASSERT_STRING_EQUAL(text, "{\"job_id\":\"job-a\",\"records\":[{\"step_id\":4},{\"step_id\":6}]}");
    free(text);
    text = answer(2, 9, 1000, SIZE_MAX, 65536);
    CU_ASSERT_STRING_EQUAL(text, "{\"job_id\":\"job-a\",\"records\":[]}");
    free(text);
}

static void test_reader_without_files_answers_no_records(void)
{
    fresh();
    char *text = answer(3, 0, 1000, SIZE_MAX, 65536);
    CU_ASSERT_STRING_EQUAL(text, "{\"job_id\":\"job-a\",\"records\":[]}");
    free(text);
}

static void test_reader_skips_lines_that_are_not_records_or_not_complete(void)
{
    fresh();
    write_text(suffixed(".1"), "{\"step_id\":1}\n{\"step_id\":2, cut by a crash");
    write_text(path, "garbage\n\n{\"step\":3}\n{\"step_id\":x}\n{\"step_id\":4}\n{\"step_id\":5,\"still\":\"writ");
    char *text = answer(1, 0, 1000, SIZE_MAX, 65536);
    CU_ASSERT_STRING_EQUAL(text, "{\"job_id\":\"job-a\",\"records\":[{\"step_id\":1},{\"step_id\":4}]}");
    free(text);
}

static void test_reader_stops_at_max_bytes_and_says_where_to_go_on(void)
{
    fresh();
    write_text(path, "{\"step_id\":1,\"a\":1}\n{\"step_id\":2,\"a\":2}\n{\"step_id\":3,\"a\":3}\n");
    /* Records are 20 bytes: 40 take two, the third would pass. */
    char *text = answer(0, 0, 1000, 40, 65536);
    CU_ASSERT_STRING_EQUAL(text, "{\"job_id\":\"job-a\",\"records\":[{\"step_id\":1,\"a\":1},{\"step_id\":2,\"a\":2}],"
                                 "\"truncated\":true,\"next_since_step\":3}");
    free(text);
    /* The first record always goes out whole, so paging always advances. */
    text = answer(0, 2, 1000, 5, 65536);
    CU_ASSERT_STRING_EQUAL(text, "{\"job_id\":\"job-a\",\"records\":[{\"step_id\":2,\"a\":2}],"
                                 "\"truncated\":true,\"next_since_step\":3}");
    free(text);
    /* The limit reached first is not a truncation. */
    text = answer(0, 0, 2, 40, 65536);
    CU_ASSERT_STRING_EQUAL(text,
                           "{\"job_id\":\"job-a\",\"records\":[{\"step_id\":1,\"a\":1},{\"step_id\":2,\"a\":2}]}");
    free(text);
}

static void test_reader_output_does_not_depend_on_read_sizes(void)
{
    fresh();
    /* A line of 200,000 bytes: longer than the reader's 64 KiB buffer. */
    size_t big = 200000;
    char *line = malloc(big + 2);
    int head = snprintf(line, big + 2, "{\"step_id\":7,\"pad\":\"");
    memset(line + head, 'x', big - (size_t)head - 2);
    memcpy(line + big - 2, "\"}\n", 4); /* big bytes, then the newline */
    write_text(suffixed(".1"), "{\"step_id\":6}\n");
    write_text(path, line);
    char *whole = answer(1, 0, 1000, SIZE_MAX, 65536);
    /* The record is the line without its newline: big bytes. */
    CU_ASSERT_EQUAL(strlen(whole), strlen("{\"job_id\":\"job-a\",\"records\":[{\"step_id\":6},]}") + big);
    CU_ASSERT_EQUAL(memcmp(whole + strlen("{\"job_id\":\"job-a\",\"records\":[{\"step_id\":6},"), line, big), 0);
    static const size_t steps[] = {1, 2, 7, 4096, 65535, 65537, 1 << 20};
    for (size_t i = 0; i < sizeof steps / sizeof steps[0]; i++) {
        char *text = answer(1, 0, 1000, SIZE_MAX, steps[i]);
        CU_ASSERT_STRING_EQUAL(text, whole);
        free(text);
    }
    free(whole);
    free(line);
}

static void test_rotation_keeps_n_files_and_counts_the_dropped(void)
{
    fresh();
    write_text(path, "a\n");
    CU_ASSERT_EQUAL(prismd_telemetry_rotate(path, 2), 0u);
    write_text(path, "b\n");
    CU_ASSERT_EQUAL(prismd_telemetry_rotate(path, 2), 0u);
    write_text(path, "c\n");
    CU_ASSERT_EQUAL(prismd_telemetry_rotate(path, 2), 1u); /* "a" goes */
    CU_ASSERT_EQUAL(access(path, F_OK), -1);
    size_t len;
    char *text = prism_read_file(suffixed(".1"), &len);
    CU_ASSERT_STRING_EQUAL(text, "c\n");
    free(text);
    text = prism_read_file(suffixed(".2"), &len);
    CU_ASSERT_STRING_EQUAL(text, "b\n");
    free(text);
    CU_ASSERT_EQUAL(access(suffixed(".3"), F_OK), -1);
    /* keep 0: the file is removed. */
    write_text(path, "d\n");
    CU_ASSERT_EQUAL(prismd_telemetry_rotate(path, 0), 1u);
    CU_ASSERT_EQUAL(access(path, F_OK), -1);
}

static void test_a_rotation_while_reading_neither_loses_nor_repeats_a_file(void)
{
    fresh();
    write_text(suffixed(".1"), "{\"step_id\":1}\n");
    write_text(path, "{\"step_id\":2}\n");
    prismd_telemetry_reader *r = prismd_telemetry_reader_open(path, 2, "job-a", 0, 1000, SIZE_MAX);
    CU_ASSERT_FATAL(r != NULL);
    CU_ASSERT_EQUAL(prismd_telemetry_rotate(path, 2), 0u);
    write_text(path, "{\"step_id\":3}\n"); /* newer than the answer: not in it */
    char *text = read_all(r, 3);
    CU_ASSERT_STRING_EQUAL(text, "{\"job_id\":\"job-a\",\"records\":[{\"step_id\":1},{\"step_id\":2}]}");
    free(text);
    prismd_telemetry_reader_close(r);
    text = answer(2, 0, 1000, SIZE_MAX, 65536);
    CU_ASSERT_STRING_EQUAL(text,
                           "{\"job_id\":\"job-a\",\"records\":[{\"step_id\":1},{\"step_id\":2},{\"step_id\":3}]}");
    free(text);
}

static const prism_test_case cases[] = {
    {"test_reader_reads_rotated_files_oldest_first", test_reader_reads_rotated_files_oldest_first},
    {"test_reader_applies_since_and_limit", test_reader_applies_since_and_limit},
    {"test_reader_without_files_answers_no_records", test_reader_without_files_answers_no_records},
    {"test_reader_skips_lines_that_are_not_records_or_not_complete",
     test_reader_skips_lines_that_are_not_records_or_not_complete},
    {"test_reader_stops_at_max_bytes_and_says_where_to_go_on", test_reader_stops_at_max_bytes_and_says_where_to_go_on},
    {"test_reader_output_does_not_depend_on_read_sizes", test_reader_output_does_not_depend_on_read_sizes},
    {"test_rotation_keeps_n_files_and_counts_the_dropped", test_rotation_keeps_n_files_and_counts_the_dropped},
    {"test_a_rotation_while_reading_neither_loses_nor_repeats_a_file",
     test_a_rotation_while_reading_neither_loses_nor_repeats_a_file},
    {NULL, NULL},
};

static const prism_test_suite suites[] = {{"telemetry_files", cases}, {NULL, NULL}};

int main(int argc, char **argv)
{
    int rc = prism_test_main(argc, argv, suites);
    prism_scratch_cleanup();
    return rc;
}
