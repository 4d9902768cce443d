/* The trainer-side counters of DESIGN 12 on their way from libprism to prism-agent: the client
 * counts a map it first uses after its effective step had begun (a late switch) and the reports
 * it drops, and publishes both in the hint table at begin_step, where the agent's side reads
 * them (and sends them up in its Heartbeat). A table no trainer published in reads as unknown,
 * not as zeros. The test plays the agent with the real hint table in a scratch directory; no
 * agent socket, so reports are dropped. */
#define _GNU_SOURCE
#include "testutil.h"

#include "hints.h"
#include "local.h"
#include "prism/client.h"

#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

static const char *hints_path(char *dir, size_t len)
{
    snprintf(dir, len, "%s/counters", prism_scratch_dir());
    CU_ASSERT_EQUAL_FATAL(mkdir(dir, 0700), 0);
    static char path[512];
    snprintf(path, sizeof path, "%s/%s", dir, PRISM_LOCAL_HINTS_NAME);
    return path;
}

/* The two counters of the trainer line; false when the trainer published none. */
static bool read_counters(const prism_hints *agent, uint64_t *dropped, uint64_t *late)
{
    prism_hints_trainer line;
    if (!prism_hints_read_trainer(agent, &line) || !line.published)
        return false;
    *dropped = line.reports_dropped;
    *late = line.late_switches;
    return true;
}

static prism_client_counters counters(const prism_client *c)
{
    prism_client_counters n;
    CU_ASSERT_EQUAL_FATAL(prism_client_get_counters(c, &n, NULL), PRISM_OK);
    return n;
}

static void test_late_switches_and_drops_are_counted_and_published(void)
{
    char dir[256];
    const char *path = hints_path(dir, sizeof dir);
    prism_hints agent;
    prism_error err;
    CU_ASSERT_EQUAL_FATAL(prism_hints_create(&agent, path, 16, &err), PRISM_OK);
    uint64_t dropped = 7, late = 7;
    CU_ASSERT_FALSE(read_counters(&agent, &dropped, &late)); /* no trainer yet */

    prism_client_options o = {.dir = dir, .job_id = "job-a", .rank = 0, .world_size = 1,
                              .reconnect_interval_ms = 60000};
    prism_client *c = NULL;
    CU_ASSERT_EQUAL_FATAL(prism_client_open(&o, &c, &err), PRISM_OK);
    static const prism_block_layout blocks[] = {{"b0", 32, NULL, 0, 0, 0, 0}, {"b1", 32, NULL, 0, 0, 0, 0}};
    prism_model_layout layout = {.model_id = "m", .quant = {.format = PRISM_PRECISION_INT8,
                                 .granularity = PRISM_GRANULARITY_BLOCK}, .blocks = blocks, .n_blocks = 2};
    CU_ASSERT_EQUAL_FATAL(prism_client_register(c, &layout, &err), PRISM_OK);

    /* Map 1 is effective at step 5 and there at step 5: on time. */
    static const uint8_t low[2] = {PRISM_PRECISION_INT8, PRISM_PRECISION_INT8};
    CU_ASSERT_EQUAL_FATAL(prism_hints_publish_map(&agent, 1, 3, 5, low, 2, &err), PRISM_OK);
    CU_ASSERT_EQUAL(prism_client_begin_step(c, 4), 0);
    CU_ASSERT_EQUAL(prism_client_begin_step(c, 5), 1);
    CU_ASSERT_EQUAL(counters(c).late_switches, 0);
    CU_ASSERT_TRUE_FATAL(read_counters(&agent, &dropped, &late));
    CU_ASSERT_EQUAL(dropped, 0);
    CU_ASSERT_EQUAL(late, 0);

    /* Map 2 is effective at step 6 but only arrives once step 7 has begun: late. */
    CU_ASSERT_EQUAL(prism_client_begin_step(c, 6), 1);
    CU_ASSERT_EQUAL(prism_client_begin_step(c, 7), 1);
    CU_ASSERT_EQUAL_FATAL(prism_hints_publish_map(&agent, 2, 4, 6, low, 2, &err), PRISM_OK);
    CU_ASSERT_EQUAL(prism_client_begin_step(c, 8), 2);
    CU_ASSERT_EQUAL(counters(c).late_switches, 1);

    /* Two reports with no agent to take them: dropped, and published at the next begin_step. */
    static const uint32_t ids[2] = {0, 1};
    prism_grad_stats st[2] = {{.l2_norm = 1, .numel = 16}, {.l2_norm = 1, .numel = 16}};
    CU_ASSERT_EQUAL(prism_client_report_step(c, 8, NULL, ids, st, 2, &err), PRISM_ERR_UNAVAILABLE);
    CU_ASSERT_EQUAL(prism_client_report_step(c, 9, NULL, ids, st, 2, &err), PRISM_ERR_UNAVAILABLE);
    CU_ASSERT_EQUAL(counters(c).reports_dropped, 2);
    CU_ASSERT_TRUE_FATAL(read_counters(&agent, &dropped, &late));
    CU_ASSERT_EQUAL(dropped, 0); /* not yet: the trainer publishes at begin_step */
    CU_ASSERT_EQUAL(prism_client_begin_step(c, 9), 2);
    CU_ASSERT_TRUE_FATAL(read_counters(&agent, &dropped, &late));
    CU_ASSERT_EQUAL(dropped, 2);
    CU_ASSERT_EQUAL(late, 1);

    /* A map with a later effective step waits; taking it at that step is on time. */
    CU_ASSERT_EQUAL_FATAL(prism_hints_publish_map(&agent, 3, 9, 12, low, 2, &err), PRISM_OK);
    CU_ASSERT_EQUAL(prism_client_begin_step(c, 11), 2);
    CU_ASSERT_EQUAL(prism_client_begin_step(c, 12), 3);
    CU_ASSERT_EQUAL(counters(c).late_switches, 1);
    prism_client_close(c);
    prism_hints_close(&agent);
}

int main(int argc, char **argv)
{
    static const prism_test_case cases[] = {
        {"late_switches_and_drops_are_counted_and_published", test_late_switches_and_drops_are_counted_and_published},
        {NULL, NULL},
    };
    static const prism_test_suite suites[] = {{"trainer_counters", cases}, {NULL, NULL}};
    return prism_test_main(argc, argv, suites);
}
