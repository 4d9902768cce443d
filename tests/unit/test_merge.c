/* Rank merge of DESIGN 4.3: which steps are ready when, and the exact merged figures (l2 mean
 * over ranks, max_abs max, mean and population variance pooled with Chan's formula weighted by
 * finite element counts, numel and nonfinite summed). Expected values are worked out by hand
 * with numbers exact in binary. */
#include "testutil.h"

#include "merge.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

static prism_block_stats bs(uint32_t id, double l2, double max_abs, double mean, double variance, uint64_t numel,
                            uint64_t nonfinite)
{
    prism_block_stats s = {id, l2, max_abs, mean, variance, numel, nonfinite, false, 0, 0};
    return s;
}

static prism_merger *make_merger(uint32_t world_size, int64_t timeout_ms)
{
    prism_error err;
    prism_merger *m = prism_merger_create(world_size, timeout_ms, &err);
    CU_ASSERT_FATAL(m != NULL);
    return m;
}

/* Adds a report and returns its outcome (the call itself must succeed). */
static prism_merge_outcome add(prism_merger *m, uint32_t rank, uint64_t step, const prism_block_stats *blocks,
                               size_t count, int64_t now_ms)
{
    prism_merge_outcome outcome = PRISM_MERGE_ACCEPTED;
    prism_error err;
    prism_status st = prism_merger_add(m, rank, step, false, 0.0, blocks, count, now_ms, &outcome, &err);
    if (st)
        fprintf(stderr, "merger_add: %s\n", err.message);
    CU_ASSERT_FATAL(st == PRISM_OK);
    return outcome;
}

static prism_merge_outcome add_one(prism_merger *m, uint32_t rank, uint64_t step, int64_t now_ms)
{
    prism_block_stats b = bs(0, 1.0, 1.0, 0.0, 1.0, 4, 0);
    return add(m, rank, step, &b, 1, now_ms);
}

static const prism_block_stats *merged_block(const prism_merged_step *s, uint32_t id)
{
    for (size_t i = 0; i < s->count; i++)
        if (s->blocks[i].block_id == id)
            return &s->blocks[i];
    return NULL;
}

static void test_create_rejects_zero_world_size_or_timeout(void)
{
    prism_error err;
    CU_ASSERT_PTR_NULL(prism_merger_create(0, 100, &err));
    CU_ASSERT_PTR_NULL(prism_merger_create(2, 0, &err));
    CU_ASSERT_PTR_NULL(prism_merger_create(2, -5, &err));
}

static void test_two_ranks_merge_with_chan_pooling(void)
{
    prism_merger *m = make_merger(2, 1000);
    /* Rank 0: n = 4, mean 1, var 2 (M2 8). Rank 1: n = 6 - 2 = 4, mean 3, var 1 (M2 4).
     * Pooled: n 8, mean 2, M2 = 8 + 4 + (3 - 1)^2 * 4 * 4 / 8 = 20, variance 2.5. */
    prism_block_stats r0[1] = {bs(0, 3.0, 2.0, 1.0, 2.0, 4, 0)};
    prism_block_stats r1[1] = {bs(0, 5.0, 4.0, 3.0, 1.0, 6, 2)};
    prism_merged_step out;
    CU_ASSERT_EQUAL(add(m, 0, 1, r0, 1, 0), PRISM_MERGE_ACCEPTED);
    CU_ASSERT_FALSE(prism_merger_next(m, 0, &out));
    CU_ASSERT_EQUAL(prism_merger_open_steps(m), 1);
    CU_ASSERT_EQUAL(add(m, 1, 1, r1, 1, 10), PRISM_MERGE_ACCEPTED);
    CU_ASSERT_TRUE_FATAL(prism_merger_next(m, 10, &out));
    CU_ASSERT_EQUAL(out.step, 1);
    CU_ASSERT_EQUAL(out.ranks, 2);
    CU_ASSERT_FALSE(out.has_loss);
    CU_ASSERT_EQUAL_FATAL(out.count, 1);
    const prism_block_stats *b = &out.blocks[0];
    CU_ASSERT_EQUAL(b->block_id, 0);
    CU_ASSERT_EQUAL(b->l2_norm, 4.0);
    CU_ASSERT_EQUAL(b->max_abs, 4.0);
    CU_ASSERT_EQUAL(b->mean, 2.0);
    CU_ASSERT_EQUAL(b->variance, 2.5);
    CU_ASSERT_EQUAL(b->numel, 10);
    CU_ASSERT_EQUAL(b->nonfinite, 2);
    CU_ASSERT_FALSE(prism_merger_next(m, 10, &out));
    CU_ASSERT_EQUAL(prism_merger_open_steps(m), 0);
    CU_ASSERT_EQUAL(prism_merger_counters(m)->accepted, 2);
    CU_ASSERT_EQUAL(prism_merger_counters(m)->timed_out, 0);
    CU_ASSERT_EQUAL(prism_merger_counters(m)->closed_early, 0);
    prism_merger_destroy(m);
}

static void test_three_ranks_merge_blocks_losses_and_partial_blocks(void)
{
    prism_merger *m = make_merger(3, 1000);
    /* Block 0 over three ranks: n 4, 4, 8; means 1, 3, 2; variances 2, 1, 0.5 (M2 8, 4, 4).
     * n 16, mean (4 + 12 + 16) / 16 = 2, M2 = 16 + 4*1 + 4*1 + 8*0 = 24, variance 1.5.
     * l2 (3 + 5 + 1) / 3 = 3, max_abs 7, numel 18, nonfinite 2.
     * Block 1 only on ranks 0 and 2: l2 (6 + 2) / 2 = 4, n 2 and 6, means 0.5 and 0.5 -> 0.5,
     * variances 0.25 and 0.25 -> 0.25. Block 2 only on rank 1: its own figures. */
    prism_block_stats r0[2] = {bs(0, 3.0, 2.0, 1.0, 2.0, 4, 0), bs(1, 6.0, 1.0, 0.5, 0.25, 2, 0)};
    prism_block_stats r1[2] = {bs(2, 9.0, 3.0, -1.5, 0.75, 8, 1), bs(0, 5.0, 4.0, 3.0, 1.0, 6, 2)};
    prism_block_stats r2[2] = {bs(1, 2.0, 0.5, 0.5, 0.25, 6, 0), bs(0, 1.0, 7.0, 2.0, 0.5, 8, 0)};
    prism_error err;
    prism_merge_outcome oc;
    CU_ASSERT_EQUAL(prism_merger_add(m, 2, 5, true, 3.0, r2, 2, 0, &oc, &err), PRISM_OK);
    CU_ASSERT_EQUAL(prism_merger_add(m, 0, 5, true, 2.0, r0, 2, 1, &oc, &err), PRISM_OK);
    prism_merged_step out;
    CU_ASSERT_FALSE(prism_merger_next(m, 2, &out));
    CU_ASSERT_EQUAL(prism_merger_add(m, 1, 5, false, 100.0, r1, 2, 2, &oc, &err), PRISM_OK);
    CU_ASSERT_EQUAL(oc, PRISM_MERGE_ACCEPTED);
    CU_ASSERT_TRUE_FATAL(prism_merger_next(m, 3, &out));
    CU_ASSERT_EQUAL(out.step, 5);
    CU_ASSERT_EQUAL(out.ranks, 3);
    CU_ASSERT_TRUE(out.has_loss);
    CU_ASSERT_EQUAL(out.loss, 2.5); /* ranks 0 and 2 sent one */
    CU_ASSERT_EQUAL_FATAL(out.count, 3);
    const prism_block_stats *b = merged_block(&out, 0);
    CU_ASSERT_FATAL(b != NULL);
    CU_ASSERT_EQUAL(b->l2_norm, 3.0);
    CU_ASSERT_EQUAL(b->max_abs, 7.0);
    /* Pairwise Chan merging in arrival order passes through n = 12 (thirds): inexact. */
    CU_ASSERT_DOUBLE_EQUAL(b->mean, 2.0, 1e-12);
    CU_ASSERT_DOUBLE_EQUAL(b->variance, 1.5, 1e-12);
    CU_ASSERT_EQUAL(b->numel, 18);
    CU_ASSERT_EQUAL(b->nonfinite, 2);
    b = merged_block(&out, 1);
    CU_ASSERT_FATAL(b != NULL);
    CU_ASSERT_EQUAL(b->l2_norm, 4.0);
    CU_ASSERT_EQUAL(b->max_abs, 1.0);
    CU_ASSERT_EQUAL(b->mean, 0.5);
    CU_ASSERT_EQUAL(b->variance, 0.25);
    CU_ASSERT_EQUAL(b->numel, 8);
    CU_ASSERT_EQUAL(b->nonfinite, 0);
    b = merged_block(&out, 2);
    CU_ASSERT_FATAL(b != NULL);
    CU_ASSERT_EQUAL(b->l2_norm, 9.0);
    CU_ASSERT_EQUAL(b->max_abs, 3.0);
    CU_ASSERT_EQUAL(b->mean, -1.5);
    CU_ASSERT_EQUAL(b->variance, 0.75);
    CU_ASSERT_EQUAL(b->numel, 8);
    CU_ASSERT_EQUAL(b->nonfinite, 1);
    prism_merger_destroy(m);
}

static void test_pooling_gives_no_weight_to_a_rank_with_only_nonfinite_elements(void)
{
    prism_merger *m = make_merger(2, 1000);
    /* Rank 0's 4 elements are all non-finite: n_0 = 0, so mean and variance are rank 1's. */
    prism_block_stats r0[1] = {bs(0, 0.0, 0.0, 0.0, 0.0, 4, 4)};
    prism_block_stats r1[1] = {bs(0, 4.0, 2.0, 3.0, 1.0, 4, 0)};
    add(m, 0, 1, r0, 1, 0);
    add(m, 1, 1, r1, 1, 0);
    prism_merged_step out;
    CU_ASSERT_TRUE_FATAL(prism_merger_next(m, 0, &out));
    const prism_block_stats *b = merged_block(&out, 0);
    CU_ASSERT_FATAL(b != NULL);
    CU_ASSERT_EQUAL(b->l2_norm, 2.0);
    CU_ASSERT_EQUAL(b->max_abs, 2.0);
    CU_ASSERT_EQUAL(b->mean, 3.0);
    CU_ASSERT_EQUAL(b->variance, 1.0);
    CU_ASSERT_EQUAL(b->numel, 8);
    CU_ASSERT_EQUAL(b->nonfinite, 4);
    prism_merger_destroy(m);
}

static void test_world_size_one_makes_every_report_ready_at_once(void)
{
    prism_merger *m = make_merger(1, 1000);
    prism_block_stats r[1] = {bs(4, 2.5, 1.0, 0.25, 0.125, 16, 0)};
    prism_merged_step out;
    for (uint64_t step = 1; step <= 3; step++) {
        add(m, 0, step * 10, r, 1, 0);
        CU_ASSERT_TRUE_FATAL(prism_merger_next(m, 0, &out));
        CU_ASSERT_EQUAL(out.step, step * 10);
        CU_ASSERT_EQUAL(out.ranks, 1);
        CU_ASSERT_EQUAL_FATAL(out.count, 1);
        CU_ASSERT_EQUAL(out.blocks[0].block_id, 4);
        CU_ASSERT_EQUAL(out.blocks[0].l2_norm, 2.5);
        CU_ASSERT_EQUAL(out.blocks[0].mean, 0.25);
        CU_ASSERT_EQUAL(out.blocks[0].variance, 0.125);
        CU_ASSERT_EQUAL(out.blocks[0].numel, 16);
        CU_ASSERT_FALSE(prism_merger_next(m, 0, &out));
    }
    CU_ASSERT_EQUAL(prism_merger_counters(m)->timed_out, 0);
    prism_merger_destroy(m);
}

static void test_incomplete_step_is_ready_at_its_timeout(void)
{
    prism_merger *m = make_merger(2, 100);
    prism_merged_step out;
    CU_ASSERT_EQUAL(prism_merger_wait_ms(m, 1000), -1);
    add_one(m, 0, 1, 1000);
    CU_ASSERT_EQUAL(prism_merger_wait_ms(m, 1000), 100);
    CU_ASSERT_EQUAL(prism_merger_wait_ms(m, 1030), 70);
    CU_ASSERT_FALSE(prism_merger_next(m, 1050, &out));
    CU_ASSERT_FALSE(prism_merger_next(m, 1099, &out));
    CU_ASSERT_EQUAL(prism_merger_wait_ms(m, 1100), 0);
    CU_ASSERT_TRUE_FATAL(prism_merger_next(m, 1100, &out));
    CU_ASSERT_EQUAL(out.step, 1);
    CU_ASSERT_EQUAL(out.ranks, 1);
    CU_ASSERT_EQUAL(out.blocks[0].l2_norm, 1.0);
    CU_ASSERT_EQUAL(prism_merger_counters(m)->timed_out, 1);
    CU_ASSERT_EQUAL(prism_merger_open_steps(m), 0);
    CU_ASSERT_EQUAL(prism_merger_wait_ms(m, 1100), -1);
    /* The missing rank's report arrives after the step was handed out: dropped as late. */
    CU_ASSERT_EQUAL(add_one(m, 1, 1, 1200), PRISM_MERGE_DROPPED_LATE);
    CU_ASSERT_EQUAL(prism_merger_counters(m)->dropped_late, 1);
    CU_ASSERT_EQUAL(prism_merger_open_steps(m), 0);
    prism_merger_destroy(m);
}

static void test_timeout_counts_from_first_report_of_each_step(void)
{
    prism_merger *m = make_merger(3, 100);
    prism_merged_step out;
    add_one(m, 0, 1, 0);
    add_one(m, 1, 1, 60); /* a second report does not restart the clock */
    add_one(m, 0, 2, 50);
    CU_ASSERT_EQUAL(prism_merger_wait_ms(m, 60), 40);
    CU_ASSERT_FALSE(prism_merger_next(m, 99, &out));
    CU_ASSERT_TRUE_FATAL(prism_merger_next(m, 100, &out));
    CU_ASSERT_EQUAL(out.step, 1);
    CU_ASSERT_EQUAL(out.ranks, 2);
    CU_ASSERT_EQUAL(prism_merger_wait_ms(m, 100), 50); /* step 2: first report at 50 */
    CU_ASSERT_FALSE(prism_merger_next(m, 149, &out));
    CU_ASSERT_TRUE_FATAL(prism_merger_next(m, 150, &out));
    CU_ASSERT_EQUAL(out.step, 2);
    CU_ASSERT_EQUAL(out.ranks, 1);
    CU_ASSERT_EQUAL(prism_merger_counters(m)->timed_out, 2);
    prism_merger_destroy(m);
}

static void test_later_complete_step_closes_earlier_ones_early_in_order(void)
{
    prism_merger *m = make_merger(2, 10000);
    prism_merged_step out;
    add_one(m, 0, 1, 0);
    add_one(m, 0, 2, 1);
    add_one(m, 0, 3, 2);
    CU_ASSERT_FALSE(prism_merger_next(m, 3, &out));
    add_one(m, 1, 3, 3); /* step 3 complete: 1 and 2 go out first */
    CU_ASSERT_EQUAL(prism_merger_wait_ms(m, 3), 0);
    CU_ASSERT_TRUE_FATAL(prism_merger_next(m, 3, &out));
    CU_ASSERT_EQUAL(out.step, 1);
    CU_ASSERT_EQUAL(out.ranks, 1);
    CU_ASSERT_TRUE_FATAL(prism_merger_next(m, 3, &out));
    CU_ASSERT_EQUAL(out.step, 2);
    CU_ASSERT_EQUAL(out.ranks, 1);
    CU_ASSERT_TRUE_FATAL(prism_merger_next(m, 3, &out));
    CU_ASSERT_EQUAL(out.step, 3);
    CU_ASSERT_EQUAL(out.ranks, 2);
    CU_ASSERT_FALSE(prism_merger_next(m, 3, &out));
    CU_ASSERT_EQUAL(prism_merger_counters(m)->closed_early, 2);
    CU_ASSERT_EQUAL(prism_merger_counters(m)->timed_out, 0);
    CU_ASSERT_EQUAL(prism_merger_counters(m)->accepted, 4);
    /* Rank 1's reports of steps 1 and 2 now come late. */
    CU_ASSERT_EQUAL(add_one(m, 1, 1, 4), PRISM_MERGE_DROPPED_LATE);
    CU_ASSERT_EQUAL(add_one(m, 1, 2, 4), PRISM_MERGE_DROPPED_LATE);
    CU_ASSERT_EQUAL(add_one(m, 0, 3, 4), PRISM_MERGE_DROPPED_LATE);
    CU_ASSERT_EQUAL(prism_merger_counters(m)->dropped_late, 3);
    CU_ASSERT_EQUAL(prism_merger_counters(m)->accepted, 4);
    CU_ASSERT_EQUAL(prism_merger_open_steps(m), 0);
    /* A newer step is accepted again. */
    CU_ASSERT_EQUAL(add_one(m, 1, 4, 5), PRISM_MERGE_ACCEPTED);
    CU_ASSERT_EQUAL(prism_merger_open_steps(m), 1);
    prism_merger_destroy(m);
}

static void test_close_all_makes_every_open_step_ready(void)
{
    prism_merger *m = make_merger(4, 10000);
    prism_merged_step out;
    add_one(m, 0, 5, 0);
    add_one(m, 2, 6, 0);
    add_one(m, 3, 6, 0);
    CU_ASSERT_EQUAL(prism_merger_open_steps(m), 2);
    CU_ASSERT_FALSE(prism_merger_next(m, 0, &out));
    prism_merger_close_all(m);
    CU_ASSERT_EQUAL(prism_merger_wait_ms(m, 0), 0);
    CU_ASSERT_TRUE_FATAL(prism_merger_next(m, 0, &out));
    CU_ASSERT_EQUAL(out.step, 5);
    CU_ASSERT_EQUAL(out.ranks, 1);
    CU_ASSERT_TRUE_FATAL(prism_merger_next(m, 0, &out));
    CU_ASSERT_EQUAL(out.step, 6);
    CU_ASSERT_EQUAL(out.ranks, 2);
    CU_ASSERT_FALSE(prism_merger_next(m, 0, &out));
    CU_ASSERT_EQUAL(prism_merger_open_steps(m), 0);
    CU_ASSERT_EQUAL(prism_merger_wait_ms(m, 0), -1);
    prism_merger_destroy(m);
}

static void test_same_rank_twice_for_a_step_is_dropped_as_duplicate(void)
{
    prism_merger *m = make_merger(2, 1000);
    prism_block_stats first[1] = {bs(0, 2.0, 1.0, 0.0, 1.0, 4, 0)};
    prism_block_stats again[1] = {bs(0, 100.0, 50.0, 0.0, 1.0, 4, 0)};
    prism_block_stats other[1] = {bs(0, 4.0, 3.0, 0.0, 1.0, 4, 0)};
    CU_ASSERT_EQUAL(add(m, 0, 1, first, 1, 0), PRISM_MERGE_ACCEPTED);
    CU_ASSERT_EQUAL(add(m, 0, 1, again, 1, 0), PRISM_MERGE_DROPPED_DUPLICATE);
    prism_merged_step out;
    CU_ASSERT_FALSE(prism_merger_next(m, 0, &out)); /* the duplicate does not complete the step */
    CU_ASSERT_EQUAL(add(m, 1, 1, other, 1, 0), PRISM_MERGE_ACCEPTED);
    CU_ASSERT_TRUE_FATAL(prism_merger_next(m, 0, &out));
    CU_ASSERT_EQUAL(out.ranks, 2);
    CU_ASSERT_EQUAL(out.blocks[0].l2_norm, 3.0); /* the first report kept: (2 + 4) / 2 */
    CU_ASSERT_EQUAL(out.blocks[0].max_abs, 3.0);
    const prism_merge_counters *c = prism_merger_counters(m);
    CU_ASSERT_EQUAL(c->dropped_duplicate, 1);
    CU_ASSERT_EQUAL(c->accepted, 2);
    CU_ASSERT_EQUAL(c->dropped_late, 0);
    prism_merger_destroy(m);
}

static void test_malformed_reports_are_rejected_and_change_nothing(void)
{
    static const struct {
        uint32_t rank;
        prism_block_stats blocks[2];
        size_t count;
    } cases[] = {
        {2, {{0, 1.0, 1.0, 0.0, 1.0, 4, 0, false, 0, 0}}, 1},                              /* rank >= world_size */
        {0, {{3, 1.0, 1.0, 0.0, 1.0, 4, 0, false, 0, 0}, {3, 2.0, 1.0, 0.0, 1.0, 4, 0, false, 0, 0}}, 2}, /* duplicate block id */
        {0, {{0, -1.0, 1.0, 0.0, 1.0, 4, 0, false, 0, 0}}, 1},                             /* negative l2 */
        {0, {{0, 1.0, -1.0, 0.0, 1.0, 4, 0, false, 0, 0}}, 1},                             /* negative max_abs */
        {0, {{0, 1.0, 1.0, 0.0, -1.0, 4, 0, false, 0, 0}}, 1},                             /* negative variance */
        {0, {{0, 1.0, 1.0, 0.0, 1.0, 4, 5, false, 0, 0}}, 1},                              /* nonfinite > numel */
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        prism_merger *m = make_merger(2, 1000);
        add_one(m, 1, 7, 0);
        prism_error err;
        prism_merge_outcome oc = PRISM_MERGE_ACCEPTED;
        prism_status st = prism_merger_add(m, cases[i].rank, 7, false, 0.0, cases[i].blocks, cases[i].count, 0,
                                           &oc, &err);
        if (st != PRISM_ERR_INVALID)
            fprintf(stderr, "case %zu: status %d\n", i, (int)st);
        CU_ASSERT_EQUAL(st, PRISM_ERR_INVALID);
        CU_ASSERT_EQUAL(prism_merger_open_steps(m), 1);
        const prism_merge_counters *c = prism_merger_counters(m);
        CU_ASSERT_EQUAL(c->accepted, 1);
        CU_ASSERT_EQUAL(c->dropped_late + c->dropped_duplicate, 0);
        /* Rank 0 can still report step 7 (nothing of the bad report was kept). */
        prism_merged_step out;
        CU_ASSERT_FALSE(prism_merger_next(m, 0, &out));
        CU_ASSERT_EQUAL(add_one(m, 0, 7, 0), PRISM_MERGE_ACCEPTED);
        CU_ASSERT_TRUE_FATAL(prism_merger_next(m, 0, &out));
        CU_ASSERT_EQUAL(out.ranks, 2);
        CU_ASSERT_EQUAL_FATAL(out.count, 1);
        CU_ASSERT_EQUAL(out.blocks[0].l2_norm, 1.0);
        CU_ASSERT_EQUAL(out.blocks[0].numel, 8);
        prism_merger_destroy(m);
    }
}

static void test_too_many_open_steps_make_the_oldest_ready(void)
{
    prism_merger *m = make_merger(2, 1000000);
    prism_merged_step out;
    for (uint64_t step = 1; step <= PRISM_MERGE_MAX_OPEN_STEPS; step++)
        add_one(m, 0, step, 0);
    CU_ASSERT_EQUAL(prism_merger_open_steps(m), PRISM_MERGE_MAX_OPEN_STEPS);
    CU_ASSERT_FALSE(prism_merger_next(m, 0, &out));
    add_one(m, 0, PRISM_MERGE_MAX_OPEN_STEPS + 1, 0);
    CU_ASSERT_TRUE_FATAL(prism_merger_next(m, 0, &out));
    CU_ASSERT_EQUAL(out.step, 1);
    CU_ASSERT_FALSE(prism_merger_next(m, 0, &out));
    CU_ASSERT_EQUAL(prism_merger_open_steps(m), PRISM_MERGE_MAX_OPEN_STEPS);
    prism_merger_destroy(m);
}

/* Element counts from many ranks saturate instead of wrapping, and nonfinite stays <= numel. */
static void test_counts_saturate_instead_of_wrapping(void)
{
    prism_merger *m = make_merger(3, 1000);
    prism_block_stats a = bs(0, 1.0, 1.0, 0.0, 0.0, UINT64_MAX - 1, 0);
    prism_block_stats b = bs(0, 1.0, 1.0, 0.0, 0.0, UINT64_MAX - 1, UINT64_MAX - 1);
    prism_block_stats c = bs(0, 1.0, 1.0, 0.0, 0.0, 2, 1);
    add(m, 0, 1, &a, 1, 0);
    add(m, 1, 1, &b, 1, 0);
    add(m, 2, 1, &c, 1, 0);
    prism_merged_step out;
    CU_ASSERT_FATAL(prism_merger_next(m, 0, &out));
    CU_ASSERT_EQUAL(out.blocks[0].numel, UINT64_MAX);
    CU_ASSERT_EQUAL(out.blocks[0].nonfinite, UINT64_MAX);
    prism_error err;
    CU_ASSERT_EQUAL(prism_block_stats_check(&out.blocks[0], &err), PRISM_OK);
    prism_merger_destroy(m);
}

/* The mean norm over ranks of two huge norms is the norm, not Inf. */
static void test_l2_mean_over_ranks_does_not_overflow(void)
{
    prism_merger *m = make_merger(2, 1000);
    prism_block_stats a = bs(0, 1e308, 1.0, 0.0, 0.0, 4, 0);
    add(m, 0, 1, &a, 1, 0);
    add(m, 1, 1, &a, 1, 0);
    prism_merged_step out;
    CU_ASSERT_FATAL(prism_merger_next(m, 0, &out));
    CU_ASSERT_EQUAL(out.blocks[0].l2_norm, 1e308);
    prism_merger_destroy(m);
}

/* Past max_blocks distinct ids a report is refused whole: no step opens, nothing is counted. */
static void test_block_limit_refuses_a_report_with_a_new_id(void)
{
    prism_merger *m = make_merger(1, 1000);
    prism_error err;
    CU_ASSERT_EQUAL_FATAL(prism_merger_set_limits(m, 4, 2, &err), PRISM_OK);
    prism_block_stats two[2] = {bs(0, 1, 1, 0, 0, 1, 0), bs(1, 1, 1, 0, 0, 1, 0)};
    prism_block_stats three[3] = {bs(0, 1, 1, 0, 0, 1, 0), bs(1, 1, 1, 0, 0, 1, 0), bs(2, 1, 1, 0, 0, 1, 0)};
    prism_merge_outcome outcome;
    CU_ASSERT_EQUAL(prism_merger_add(m, 0, 1, false, 0, three, 3, 0, &outcome, &err), PRISM_ERR_LIMIT);
    CU_ASSERT_PTR_NOT_NULL(strstr(err.message, "block 2"));
    CU_ASSERT_EQUAL(prism_merger_open_steps(m), 0);
    CU_ASSERT_EQUAL(prism_merger_counters(m)->accepted, 0);
    CU_ASSERT_EQUAL(add(m, 0, 1, two, 2, 0), PRISM_MERGE_ACCEPTED);
    prism_merged_step out;
    CU_ASSERT_FATAL(prism_merger_next(m, 0, &out));
    CU_ASSERT_EQUAL(out.count, 2);
    CU_ASSERT_EQUAL(prism_merger_set_limits(m, 0, 2, &err), PRISM_ERR_INVALID);
    prism_merger_destroy(m);
}

/* With room for many open steps, rank 0's whole run then rank 1's merges every step fully. */
static void test_raised_open_step_limit_merges_ranks_sent_one_after_another(void)
{
    prism_merger *m = make_merger(2, 1000);
    prism_error err;
    CU_ASSERT_EQUAL_FATAL(prism_merger_set_limits(m, 200, 10, &err), PRISM_OK);
    for (uint32_t rank = 0; rank < 2; rank++)
        for (uint64_t step = 1; step <= 100; step++)
            CU_ASSERT_EQUAL(add_one(m, rank, step, 0), PRISM_MERGE_ACCEPTED);
    prism_merged_step out;
    for (uint64_t step = 1; step <= 100; step++) {
        CU_ASSERT_FATAL(prism_merger_next(m, 0, &out));
        CU_ASSERT_EQUAL(out.step, step);
        CU_ASSERT_EQUAL(out.ranks, 2);
    }
    CU_ASSERT_FALSE(prism_merger_next(m, 0, &out));
    CU_ASSERT_EQUAL(prism_merger_counters(m)->closed_early, 0);
    prism_merger_destroy(m);
}

/* A report of a step above PRISM_STEP_MAX is malformed: refused, nothing opened, and the
 * rank may still report a valid step. */
static void test_a_step_past_the_bound_is_refused(void)
{
    prism_merger *m = make_merger(1, 1000);
    prism_block_stats b[1] = {{0, 1.0, 1.0, 0.0, 0.0, 4, 0, false, 0, 0}};
    prism_merge_outcome outcome;
    prism_error err;
    CU_ASSERT_EQUAL(prism_merger_add(m, 0, UINT64_MAX, false, 0.0, b, 1, 0, &outcome, &err), PRISM_ERR_INVALID);
    CU_ASSERT_EQUAL(prism_merger_add(m, 0, PRISM_STEP_MAX + 1, false, 0.0, b, 1, 0, &outcome, &err),
                    PRISM_ERR_INVALID);
    CU_ASSERT_EQUAL(prism_merger_open_steps(m), 0);
    CU_ASSERT_EQUAL(add(m, 0, PRISM_STEP_MAX, b, 1, 0), PRISM_MERGE_ACCEPTED);
    prism_merged_step out;
    CU_ASSERT_TRUE(prism_merger_next(m, 0, &out));
    CU_ASSERT_EQUAL(out.step, PRISM_STEP_MAX);
    prism_merger_destroy(m);
}

/* Adds a report with a loss (the call must succeed and be accepted). */
static void add_loss(prism_merger *m, uint32_t rank, uint64_t step, double loss, const prism_block_stats *b, size_t n)
{
    prism_merge_outcome outcome = PRISM_MERGE_DROPPED_LATE;
    prism_error err;
    CU_ASSERT_EQUAL_FATAL(prism_merger_add(m, rank, step, true, loss, b, n, 0, &outcome, &err), PRISM_OK);
    CU_ASSERT_EQUAL(outcome, PRISM_MERGE_ACCEPTED);
}

static void test_non_finite_losses_are_left_out_of_the_step_loss(void)
{
    static const struct {
        double loss[3];
        bool has_loss;
        double want;
    } cases[] = {
        {{1.0, NAN, 2.0}, true, 1.5},              /* (1 + 2) / 2 */
        {{INFINITY, 4.0, -INFINITY}, true, 4.0},   /* 4 / 1 */
        {{NAN, INFINITY, NAN}, false, 0.0},        /* none finite: no loss */
        {{0.5, 0.25, 2.25}, true, 1.0},            /* (0.5 + 0.25 + 2.25) / 3 */
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        prism_merger *m = make_merger(3, 1000);
        prism_block_stats b = bs(0, 1.0, 1.0, 0.0, 1.0, 4, 0);
        for (uint32_t r = 0; r < 3; r++)
            add_loss(m, r, 1, cases[i].loss[r], &b, 1);
        prism_merged_step out;
        CU_ASSERT_TRUE_FATAL(prism_merger_next(m, 0, &out));
        CU_ASSERT_EQUAL(out.ranks, 3); /* every report counted, NaN loss or not */
        CU_ASSERT_EQUAL(out.has_loss, cases[i].has_loss);
        if (cases[i].has_loss)
            CU_ASSERT_EQUAL(out.loss, cases[i].want);
        prism_merger_destroy(m);
    }
}

static void test_saturation_fractions_are_averaged_over_the_ranks_that_sent_them(void)
{
    prism_merger *m = make_merger(3, 1000);
    /* Block 0: ranks 0 and 2 send fractions (0.25, 0.5) and (0.75, 0): means 0.5 and 0.25.
     * Block 1: only rank 1 sends (0.125, 0.0625). Block 2: nobody: has_saturation false. */
    prism_block_stats r0[2] = {bs(0, 1, 1, 0, 1, 4, 0), bs(2, 1, 1, 0, 1, 4, 0)};
    r0[0].has_saturation = true;
    r0[0].saturated_fraction = 0.25;
    r0[0].underflowed_fraction = 0.5;
    prism_block_stats r1[2] = {bs(0, 1, 1, 0, 1, 4, 0), bs(1, 1, 1, 0, 1, 4, 0)};
    r1[1].has_saturation = true;
    r1[1].saturated_fraction = 0.125;
    r1[1].underflowed_fraction = 0.0625;
    prism_block_stats r2[1] = {bs(0, 1, 1, 0, 1, 4, 0)};
    r2[0].has_saturation = true;
    r2[0].saturated_fraction = 0.75;
    r2[0].underflowed_fraction = 0.0;
    add(m, 0, 1, r0, 2, 0);
    add(m, 1, 1, r1, 2, 0);
    add(m, 2, 1, r2, 1, 0);
    prism_merged_step out;
    CU_ASSERT_TRUE_FATAL(prism_merger_next(m, 0, &out));
    const prism_block_stats *b0 = merged_block(&out, 0), *b1 = merged_block(&out, 1), *b2 = merged_block(&out, 2);
    CU_ASSERT_FATAL(b0 && b1 && b2);
    CU_ASSERT_TRUE(b0->has_saturation);
    CU_ASSERT_EQUAL(b0->saturated_fraction, 0.5);    /* (0.25 + 0.75) / 2 */
    CU_ASSERT_EQUAL(b0->underflowed_fraction, 0.25); /* (0.5 + 0) / 2 */
    CU_ASSERT_TRUE(b1->has_saturation);
    CU_ASSERT_EQUAL(b1->saturated_fraction, 0.125);
    CU_ASSERT_EQUAL(b1->underflowed_fraction, 0.0625);
    CU_ASSERT_FALSE(b2->has_saturation);
    CU_ASSERT_EQUAL(b2->saturated_fraction, 0.0);
    /* A bad fraction refuses the report, naming the block and the field. */
    prism_block_stats bad = bs(5, 1, 1, 0, 1, 4, 0);
    bad.has_saturation = true;
    bad.saturated_fraction = 1.5;
    prism_merge_outcome outcome;
    prism_error err;
    CU_ASSERT_EQUAL(prism_merger_add(m, 0, 2, false, 0, &bad, 1, 0, &outcome, &err), PRISM_ERR_INVALID);
    CU_ASSERT_PTR_NOT_NULL(strstr(err.message, "block 5: saturated_fraction"));
    bad.saturated_fraction = 0;
    bad.underflowed_fraction = NAN;
    CU_ASSERT_EQUAL(prism_merger_add(m, 0, 2, false, 0, &bad, 1, 0, &outcome, &err), PRISM_ERR_INVALID);
    CU_ASSERT_PTR_NOT_NULL(strstr(err.message, "block 5: underflowed_fraction"));
    prism_merger_destroy(m);
}

static const prism_test_case cases[] = {
    {"test_a_step_past_the_bound_is_refused", test_a_step_past_the_bound_is_refused},
    {"test_create_rejects_zero_world_size_or_timeout", test_create_rejects_zero_world_size_or_timeout},
    {"test_two_ranks_merge_with_chan_pooling", test_two_ranks_merge_with_chan_pooling},
    {"test_three_ranks_merge_blocks_losses_and_partial_blocks",
     test_three_ranks_merge_blocks_losses_and_partial_blocks},
    {"test_pooling_gives_no_weight_to_a_rank_with_only_nonfinite_elements",
     test_pooling_gives_no_weight_to_a_rank_with_only_nonfinite_elements},
    {"test_world_size_one_makes_every_report_ready_at_once", test_world_size_one_makes_every_report_ready_at_once},
    {"test_incomplete_step_is_ready_at_its_timeout", test_incomplete_step_is_ready_at_its_timeout},
    {"test_timeout_counts_from_first_report_of_each_step", test_timeout_counts_from_first_report_of_each_step},
    {"test_later_complete_step_closes_earlier_ones_early_in_order",
     test_later_complete_step_closes_earlier_ones_early_in_order},
    {"test_close_all_makes_every_open_step_ready", test_close_all_makes_every_open_step_ready},
    {"test_same_rank_twice_for_a_step_is_dropped_as_duplicate",
     test_same_rank_twice_for_a_step_is_dropped_as_duplicate},
    {"test_malformed_reports_are_rejected_and_change_nothing",
     test_malformed_reports_are_rejected_and_change_nothing},
    {"test_too_many_open_steps_make_the_oldest_ready", test_too_many_open_steps_make_the_oldest_ready},
    {"test_counts_saturate_instead_of_wrapping", test_counts_saturate_instead_of_wrapping},
    {"test_l2_mean_over_ranks_does_not_overflow", test_l2_mean_over_ranks_does_not_overflow},
    {"test_block_limit_refuses_a_report_with_a_new_id", test_block_limit_refuses_a_report_with_a_new_id},
    {"test_raised_open_step_limit_merges_ranks_sent_one_after_another", test_raised_open_step_limit_merges_ranks_sent_one_after_another},
    {"test_non_finite_losses_are_left_out_of_the_step_loss", test_non_finite_losses_are_left_out_of_the_step_loss},
    {"test_saturation_fractions_are_averaged_over_the_ranks_that_sent_them",
     test_saturation_fractions_are_averaged_over_the_ranks_that_sent_them},
    {NULL, NULL},
};

static const prism_test_suite suites[] = {{"merge", cases}, {NULL, NULL}};

int main(int argc, char **argv)
{
    return prism_test_main(argc, argv, suites);
}
