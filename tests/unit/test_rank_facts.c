/* The rank facts' helpers of snapshot.c that GET /v1/jobs/{job}/ranks and the counts of GET
 * /v1/jobs are made of: lagging, acked_current_map, and the bounded copies of node and device
 * strings (cut at a UTF-8 character boundary, so that the JSON answer can always hold them). */
#define _POSIX_C_SOURCE 200809L
#include "testutil.h"

#include "snapshot.h"

#include <stdlib.h>
#include <string.h>

static void test_lagging_is_more_than_two_steps_behind_the_newest_step(void)
{
    static const struct {
        bool known, connected, has_step;
        uint64_t last_step;
        bool has_newest;
        uint64_t newest;
        bool expected;
    } cases[] = {
        {true, true, true, 120, true, 120, false},
        {true, true, true, 118, true, 120, false}, /* exactly PRISMD_RANK_LAG_STEPS behind */
        {true, true, true, 117, true, 120, true},
        {true, false, true, 0, true, 120, false},  /* not connected: never lagging */
        {true, true, false, 0, true, 0, true},     /* reported nothing while another rank has */
        {true, true, false, 0, false, 0, false},   /* nobody reported */
        {false, false, false, 0, true, 120, false}, /* never connected */
        {true, true, true, 121, true, 120, false}, /* ahead of the snapshot's newest: not behind */
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        prismd_rank_facts f = {.connected = cases[i].connected, .has_step = cases[i].has_step,
                               .last_step = cases[i].last_step};
        CU_ASSERT_EQUAL(prismd_rank_lagging(cases[i].known ? &f : NULL, cases[i].has_newest, cases[i].newest),
                        cases[i].expected);
    }
}

static void test_acked_current_map_is_the_jobs_version_or_no_map_yet(void)
{
    prismd_rank_facts f = {.has_ack = true, .acked_map_version = 5};
    CU_ASSERT_TRUE(prismd_rank_acked_current(&f, 5));
    CU_ASSERT_FALSE(prismd_rank_acked_current(&f, 6));
    CU_ASSERT_TRUE(prismd_rank_acked_current(&f, 0));
    f.has_ack = false;
    CU_ASSERT_FALSE(prismd_rank_acked_current(&f, 5));
    CU_ASSERT_FALSE(prismd_rank_acked_current(NULL, 5));
    CU_ASSERT_TRUE(prismd_rank_acked_current(NULL, 0));
}

static void test_text_is_cut_at_255_bytes_on_a_character_boundary(void)
{
    char in[600];
    memset(in, 'a', 300);
    in[300] = '\0';
    char *out = prismd_text_copy(in);
    CU_ASSERT_EQUAL(strlen(out), 255);
    free(out);
    /* 254 ASCII bytes then "é" (2 bytes): the 255th byte starts é, which does not fit whole. */
    memset(in, 'a', 254);
    strcpy(in + 254, "\xc3\xa9z");
    out = prismd_text_copy(in);
    CU_ASSERT_EQUAL(strlen(out), 254);
    free(out);
    /* 253 bytes then "é": it ends exactly at 255. */
    memset(in, 'a', 253);
    strcpy(in + 253, "\xc3\xa9z");
    out = prismd_text_copy(in);
    CU_ASSERT_EQUAL(strlen(out), 255);
    CU_ASSERT_EQUAL((unsigned char)out[254], 0xa9);
    free(out);
    /* A 4-byte character across the cut goes whole. */
    memset(in, 'a', 253);
    strcpy(in + 253, "\xf0\x9f\x98\x80");
    out = prismd_text_copy(in);
    CU_ASSERT_EQUAL(strlen(out), 253);
    free(out);
    out = prismd_text_copy("node-a");
    CU_ASSERT_STRING_EQUAL(out, "node-a");
    free(out);
}

static void test_copy_owns_its_strings(void)
{
    prismd_rank_facts a = {.rank = 3, .connected = true, .node = prismd_text_copy("n"), .has_device = true,
                           .device_class = prismd_text_copy("c"), .device_name = prismd_text_copy("d"),
                           .memory_bytes = 7};
    prismd_rank_facts b;
    CU_ASSERT_FATAL(prismd_rank_facts_copy(&b, &a));
    prismd_rank_facts_clear(&a);
    CU_ASSERT_PTR_NULL(a.node);
    CU_ASSERT_STRING_EQUAL(b.node, "n");
    CU_ASSERT_STRING_EQUAL(b.device_class, "c");
    CU_ASSERT_STRING_EQUAL(b.device_name, "d");
    CU_ASSERT_EQUAL(b.rank, 3);
    CU_ASSERT_EQUAL(b.memory_bytes, 7);
    prismd_rank_facts_clear(&b);
}

int main(int argc, char **argv)
{
    static const prism_test_case cases[] = {
        {"lagging_is_more_than_two_steps_behind_the_newest_step", test_lagging_is_more_than_two_steps_behind_the_newest_step},
        {"acked_current_map_is_the_jobs_version_or_no_map_yet", test_acked_current_map_is_the_jobs_version_or_no_map_yet},
        {"text_is_cut_at_255_bytes_on_a_character_boundary", test_text_is_cut_at_255_bytes_on_a_character_boundary},
        {"copy_owns_its_strings", test_copy_owns_its_strings},
        {NULL, NULL},
    };
    static const prism_test_suite suites[] = {{"rank_facts", cases}, {NULL, NULL}};
    return prism_test_main(argc, argv, suites);
}
