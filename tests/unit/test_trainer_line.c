/* The hint table's trainer line (client/hints.h) and what libprism's client publishes in it:
 * a whole line written by the trainer reads back field for field, at the offsets older agents
 * read; a line an older trainer wrote (counters_published 1, the extension zero) reads as the two
 * counters it has, and a table no trainer published in as nothing; the apply lag's bucket edges
 * are inclusive upper bounds; the client counts each report it drops under its reason (no agent,
 * the agent not reading, the connection lost with the frame in flight, a failed statistics pass;
 * every reason named as the agent exports it), times the apply lag of each map that arrives while
 * it runs (and no other: not a map an older agent wrote into a slot stamped for another version),
 * and publishes the block transfer engine's
 * totals by precision. A scratch directory; the "agent" is a listening socket of the test's own
 * that reads nothing, and the hint table's writer side. */
#define _GNU_SOURCE
#include "testutil.h"

#include "client_ext.h"
#include "hints.h"
#include "local.h"
#include "prism/client.h"
#include "prism/transfer.h"

#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

static const char *fresh_dir(void)
{
    static char dir[80]; /* the socket's path must fit a sockaddr_un */
    static unsigned n;
    int len = snprintf(dir, sizeof dir, "%s/line-%u", prism_scratch_dir(), n++);
    CU_ASSERT_TRUE_FATAL(len > 0 && (size_t)len < sizeof dir);
    CU_ASSERT_EQUAL_FATAL(mkdir(dir, 0700), 0);
    return dir;
}

static const char *hints_in(const char *dir)
{
    static char path[600];
    snprintf(path, sizeof path, "%s/%s", dir, PRISM_LOCAL_HINTS_NAME);
    return path;
}

static uint64_t raw_u64(const prism_hints *t, size_t offset)
{
    uint64_t v;
    memcpy(&v, (const uint8_t *)t->h + offset, sizeof v);
    return v;
}

static prism_hints_trainer read_line(const prism_hints *agent)
{
    prism_hints_trainer line;
    memset(&line, 0xa5, sizeof line);
    CU_ASSERT_TRUE_FATAL(prism_hints_read_trainer(agent, &line));
    return line;
}

static bool ext_is_zero(const prism_hints_trainer_ext *x)
{
    static const prism_hints_trainer_ext zero;
    return memcmp(x, &zero, sizeof zero) == 0;
}

static void test_a_whole_line_reads_back_and_keeps_the_old_offsets(void)
{
    const char *path = hints_in(fresh_dir());
    prism_hints agent, trainer;
    prism_error err;
    CU_ASSERT_EQUAL_FATAL(prism_hints_create(&agent, path, 8, &err), PRISM_OK);
    CU_ASSERT_EQUAL_FATAL(prism_hints_open(&trainer, path, &err), PRISM_OK);

    prism_hints_trainer line;
    memset(&line, 0, sizeof line);
    uint64_t *words = (uint64_t *)&line;
    for (size_t i = 0; i < sizeof line / sizeof *words; i++)
        words[i] = 1000 + i; /* every field its own value */
    line.published = 77;     /* ignored: the writer says 2 */
    prism_hints_write_trainer(&trainer, &line);

    prism_hints_trainer got = read_line(&agent);
    CU_ASSERT_EQUAL(got.published, 2);
    line.published = 2;
    CU_ASSERT_EQUAL(memcmp(&got, &line, sizeof got), 0);
    /* Where an agent of an earlier build reads them. */
    CU_ASSERT_EQUAL(raw_u64(&agent, 328), line.applied_version);
    CU_ASSERT_EQUAL(raw_u64(&agent, 336), line.applied_step);
    CU_ASSERT_EQUAL(raw_u64(&agent, 344), (uint64_t)getpid());
    CU_ASSERT_EQUAL(raw_u64(&agent, 352), 2);
    CU_ASSERT_EQUAL(raw_u64(&agent, 360), line.reports_dropped);
    CU_ASSERT_EQUAL(raw_u64(&agent, 368), line.late_switches);
    CU_ASSERT_EQUAL(raw_u64(&agent, 376), line.ext.reports_sent);
    /* The extension as this build lays it out (test_trainer_metrics.py writes it there). */
    for (unsigned r = 0; r < PRISM_HINTS_DROP_REASONS; r++)
        CU_ASSERT_EQUAL(raw_u64(&agent, 384 + 8 * r), line.ext.dropped[r]);
    CU_ASSERT_EQUAL(raw_u64(&agent, 376 + 456 - 8), line.ext.allreduce_ns[PRISM_PRECISION_COUNT - 1]);
    uint64_t v = 0, s = 0;
    CU_ASSERT_TRUE(prism_hints_read_applied(&agent, &v, &s));
    CU_ASSERT_EQUAL(v, line.applied_version);
    CU_ASSERT_EQUAL(s, line.applied_step);
    prism_hints_close(&trainer);
    prism_hints_close(&agent);
}

/* The line as trainers of earlier builds leave it, written byte for byte at their offsets. */
static void test_an_older_trainers_line_reads_as_what_it_published(void)
{
    const char *path = hints_in(fresh_dir());
    prism_hints agent;
    prism_error err;
    CU_ASSERT_EQUAL_FATAL(prism_hints_create(&agent, path, 8, &err), PRISM_OK);

    /* Nobody published: a zeroed line is "not published", its counters zero. */
    prism_hints_trainer line = read_line(&agent);
    CU_ASSERT_EQUAL(line.published, 0);
    CU_ASSERT_EQUAL(line.applied_version, 0);
    CU_ASSERT_EQUAL(line.reports_dropped, 0);
    CU_ASSERT_TRUE(ext_is_zero(&line.ext));

    /* A trainer before the counters: only applied_version and applied_step. */
    uint8_t *h = (uint8_t *)agent.h;
    uint64_t applied[2] = {4, 40};
    memcpy(h + 328, applied, sizeof applied);
    line = read_line(&agent);
    CU_ASSERT_EQUAL(line.published, 0);
    CU_ASSERT_EQUAL(line.applied_version, 4);
    CU_ASSERT_EQUAL(line.applied_step, 40);

    /* A trainer of the first counters: published 1, dropped 5, late 2, the extension zero. */
    uint64_t counters[3] = {1, 5, 2};
    memcpy(h + 352, counters, sizeof counters);
    line = read_line(&agent);
    CU_ASSERT_EQUAL(line.published, 1);
    CU_ASSERT_EQUAL(line.reports_dropped, 5);
    CU_ASSERT_EQUAL(line.late_switches, 2);
    CU_ASSERT_TRUE(ext_is_zero(&line.ext));

    /* Bytes past its line are not an older trainer's to vouch for: read as zero. */
    memset(h + 376, 0x11, sizeof(prism_hints_trainer_ext));
    line = read_line(&agent);
    CU_ASSERT_EQUAL(line.published, 1);
    CU_ASSERT_TRUE(ext_is_zero(&line.ext));
    prism_hints_close(&agent);
}

static void test_the_apply_lag_bucket_edges_are_inclusive_upper_bounds(void)
{
    static const struct {
        uint64_t ns;
        unsigned bucket;
    } cases[] = {
        {0, 0},
        {1000000ull, 0},           /* 0.001 s: le="0.001" */
        {1000001ull, 1},
        {10000000ull, 1},          /* 0.01 s */
        {10000001ull, 2},
        {100000000ull, 2},         /* 0.1 s */
        {500000000ull, 3},         /* 0.5 s */
        {500000001ull, 4},
        {1000000000ull, 4},        /* 1 s */
        {2000000000ull, 5},        /* 2 s */
        {5000000000ull, 6},        /* 5 s */
        {10000000000ull, 7},       /* 10 s */
        {30000000000ull, 8},       /* 30 s */
        {60000000000ull, 9},       /* 60 s */
        {300000000000ull, 10},     /* 300 s */
        {300000000001ull, 11},     /* +Inf */
        {UINT64_MAX, 11},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        unsigned b = prism_hints_lag_bucket(cases[i].ns);
        if (b != cases[i].bucket)
            fprintf(stderr, "lag %llu ns: bucket %u, want %u\n", (unsigned long long)cases[i].ns, b,
                    cases[i].bucket);
        CU_ASSERT_EQUAL(b, cases[i].bucket);
    }
    CU_ASSERT_EQUAL(PRISM_HINTS_LAG_BUCKETS, 12);
}

static const prism_block_layout blocks[] = {{"b0", 32, NULL, 0, 0, 0, 0}, {"b1", 32, NULL, 0, 0, 0, 0}};

static prism_client *open_client(const char *dir)
{
    prism_client_options o = {.dir = dir, .job_id = "job-line", .rank = 0, .world_size = 1,
                              .reconnect_interval_ms = 1};
    prism_client *c = NULL;
    prism_error err;
    CU_ASSERT_EQUAL_FATAL(prism_client_open(&o, &c, &err), PRISM_OK);
    prism_model_layout layout = {.model_id = "m", .quant = {.format = PRISM_PRECISION_INT8,
                                 .granularity = PRISM_GRANULARITY_BLOCK}, .blocks = blocks, .n_blocks = 2};
    CU_ASSERT_EQUAL_FATAL(prism_client_register(c, &layout, &err), PRISM_OK);
    return c;
}

static prism_status report(prism_client *c, uint64_t step)
{
    static const uint32_t ids[2] = {0, 1};
    prism_grad_stats st[2] = {{.l2_norm = 1, .numel = 16}, {.l2_norm = 2, .numel = 16}};
    prism_error err;
    return prism_client_report_step(c, step, NULL, ids, st, 2, &err);
}

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* A socket in the client's directory that accepts and never reads: the agent, stopped. */
static int listen_at(const char *dir)
{
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    snprintf(sa.sun_path, sizeof sa.sun_path, "%s/%s", dir, PRISM_LOCAL_SOCKET_NAME);
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    CU_ASSERT_TRUE_FATAL(fd >= 0);
    CU_ASSERT_EQUAL_FATAL(bind(fd, (struct sockaddr *)&sa, sizeof sa), 0);
    CU_ASSERT_EQUAL_FATAL(listen(fd, 4), 0);
    return fd;
}

static void test_drops_are_counted_by_reason_and_published(void)
{
    const char *dir = fresh_dir();
    prism_hints agent;
    prism_error err;
    CU_ASSERT_EQUAL_FATAL(prism_hints_create(&agent, hints_in(dir), 16, &err), PRISM_OK);
    prism_client *c = open_client(dir);

    /* No agent: two drops, no_agent. */
    CU_ASSERT_EQUAL(report(c, 1), PRISM_ERR_UNAVAILABLE);
    CU_ASSERT_EQUAL(report(c, 2), PRISM_ERR_UNAVAILABLE);
    prism_client_begin_step(c, 2);
    prism_hints_trainer line = read_line(&agent);
    CU_ASSERT_EQUAL(line.published, 2);
    CU_ASSERT_EQUAL(line.reports_dropped, 2);
    CU_ASSERT_EQUAL(line.ext.dropped[PRISM_HINTS_DROP_NO_AGENT], 2);
    CU_ASSERT_EQUAL(line.ext.reports_sent, 0);

    /* An agent that accepts and never reads: reports go until the socket is full, then one more
     * finds the frame before it still unfinished (agent_busy), and so do the next three. The
     * reconnect interval is 1 ms: wait for it on the clock, never in a sleep. */
    int lfd = listen_at(dir);
    for (uint64_t until = now_ns() + 2000000; now_ns() < until;) {
    }
    uint64_t sent = 0;
    prism_status s = PRISM_OK;
    for (unsigned i = 0; i < 1000000 && (s = report(c, 3 + i)) == PRISM_OK; i++)
        sent++;
    CU_ASSERT_EQUAL_FATAL(s, PRISM_ERR_UNAVAILABLE);
    for (unsigned i = 0; i < 3; i++)
        CU_ASSERT_EQUAL(report(c, 10), PRISM_ERR_UNAVAILABLE);
    prism_client_counters n;
    CU_ASSERT_EQUAL_FATAL(prism_client_get_counters(c, &n, NULL), PRISM_OK);
    CU_ASSERT_TRUE(sent > 0);
    /* The last report that returned PRISM_OK is the frame in flight: not sent whole. */
    CU_ASSERT_EQUAL(n.reports_sent, sent - 1);
    CU_ASSERT_EQUAL(n.reports_dropped, 2 + 4);
    prism_client_begin_step(c, 11);
    line = read_line(&agent);
    CU_ASSERT_EQUAL(line.ext.reports_sent, sent - 1);
    CU_ASSERT_EQUAL(line.ext.dropped[PRISM_HINTS_DROP_AGENT_BUSY], 4);
    CU_ASSERT_EQUAL(line.reports_dropped, 6);

    /* The agent goes: the frame in flight is lost with the connection, and the report that found
     * it gone had no agent. */
    int afd = accept(lfd, NULL, NULL);
    CU_ASSERT_TRUE_FATAL(afd >= 0);
    close(afd);
    close(lfd);
    CU_ASSERT_EQUAL(report(c, 12), PRISM_ERR_UNAVAILABLE);
    prism_client_begin_step(c, 12);
    line = read_line(&agent);
    CU_ASSERT_EQUAL(line.ext.dropped[PRISM_HINTS_DROP_NO_AGENT], 3);
    CU_ASSERT_EQUAL(line.ext.dropped[PRISM_HINTS_DROP_AGENT_BUSY], 4);
    CU_ASSERT_EQUAL(line.ext.dropped[PRISM_HINTS_DROP_CONNECTION_LOST], 1);
    CU_ASSERT_EQUAL(line.reports_dropped, 8);
    prism_client_close(c);
    prism_hints_close(&agent);
}

/* Every drop has a reason the agent exports under a fixed name: the names, the reasons a failed
 * framing maps to (a report over a frame cannot be made with the block limit, 64 bytes at most a
 * block: the mapping is checked here), and a statistics pass the CPU kernels refuse, counted as
 * stats_failed with the reasons adding up to the total. */
static void test_every_drop_has_a_named_reason(void)
{
    static const char *const want[PRISM_HINTS_DROP_REASONS] = {
        "no_agent", "agent_busy", "connection_lost", "stats_pending", "stats_failed", "too_big", "no_memory",
    };
    for (unsigned r = 0; r < PRISM_HINTS_DROP_REASONS; r++)
        CU_ASSERT_STRING_EQUAL(prism_hints_drop_names[r], want[r]);
    CU_ASSERT_EQUAL(prism_client_send_drop_reason(PRISM_ERR_LIMIT), PRISM_HINTS_DROP_TOO_BIG);
    CU_ASSERT_EQUAL(prism_client_send_drop_reason(PRISM_ERR_NOMEM), PRISM_HINTS_DROP_NO_MEMORY);

    const char *dir = fresh_dir();
    prism_hints agent;
    prism_error err;
    CU_ASSERT_EQUAL_FATAL(prism_hints_create(&agent, hints_in(dir), 16, &err), PRISM_OK);
    int lfd = listen_at(dir); /* connected: the report gets as far as its statistics */
    prism_client *c = open_client(dir);
    static float grads[2][32];
    const prism_tensor tensors[2] = {{grads[0], 32, PRISM_DTYPE_F32}, {grads[1], 32, PRISM_DTYPE_F32}};
    const size_t bad_start[3] = {1, 1, 2}; /* the kernels refuse: block_start[0] is not 0 */
    CU_ASSERT_EQUAL(prism_client_report_step_cpu(c, 1, NULL, tensors, bad_start, NULL, 2, &err), PRISM_ERR_INVALID);
    const size_t start[3] = {0, 1, 2}; /* one tensor a block */
    CU_ASSERT_EQUAL(prism_client_report_step_cpu(c, 2, NULL, tensors, start, NULL, 2, &err), PRISM_OK);
    prism_client_begin_step(c, 3);
    prism_hints_trainer line = read_line(&agent);
    CU_ASSERT_EQUAL(line.reports_dropped, 1);
    uint64_t by_reason = 0;
    for (unsigned r = 0; r < PRISM_HINTS_DROP_REASONS; r++) {
        CU_ASSERT_EQUAL(line.ext.dropped[r], r == PRISM_HINTS_DROP_STATS_FAILED ? 1u : 0u);
        by_reason += line.ext.dropped[r];
    }
    CU_ASSERT_EQUAL(by_reason, line.reports_dropped);
    prism_client_close(c);
    close(lfd);
    prism_hints_close(&agent);
}

/* A map as an agent of an earlier build writes it into `slot`: the slot's fields under the
 * seqlock, version last, and nothing of the write times. */
static void old_agent_writes(prism_hints *t, unsigned slot, uint64_t version, uint64_t decided, uint64_t effective,
                             const uint8_t *precisions, uint32_t n)
{
    prism_hints_header *h = t->h;
    uint64_t seq = atomic_load(&h->seq);
    atomic_store(&h->seq, seq + 1);
    h->slots[slot].map_version = 0;
    memcpy(t->precisions + (size_t)slot * h->max_blocks, precisions, n);
    h->slots[slot].decided_step = decided;
    h->slots[slot].effective_step = effective;
    h->slots[slot].n_blocks = n;
    h->slots[slot].map_version = version;
    atomic_store(&h->seq, seq + 2);
}

static unsigned slot_of(const prism_hints *t, uint64_t version)
{
    for (unsigned i = 0; i < PRISM_HINTS_SLOTS; i++)
        if (t->h->slots[i].map_version == version)
            return i;
    CU_FAIL_FATAL("no slot holds the version");
    return 0;
}

static void test_apply_lag_is_timed_for_maps_that_arrive_while_the_client_runs(void)
{
    const char *dir = fresh_dir();
    prism_hints agent;
    prism_error err;
    CU_ASSERT_EQUAL_FATAL(prism_hints_create(&agent, hints_in(dir), 16, &err), PRISM_OK);
    static const uint8_t low[2] = {PRISM_PRECISION_INT8, PRISM_PRECISION_INT8};
    /* Map 1 was there before the trainer started: nothing arrived, nothing to time. */
    CU_ASSERT_EQUAL_FATAL(prism_hints_publish_map(&agent, 1, 0, 1, low, 2, &err), PRISM_OK);
    prism_client *c = open_client(dir);
    CU_ASSERT_EQUAL(prism_client_begin_step(c, 1), 1);
    prism_hints_trainer line = read_line(&agent);
    CU_ASSERT_EQUAL(line.ext.lag_count, 0);

    /* Map 2 arrives, effective at step 3: timed once, at step 3, not at step 2 nor again at 4. */
    uint64_t before = now_ns();
    CU_ASSERT_EQUAL_FATAL(prism_hints_publish_map(&agent, 2, 1, 3, low, 2, &err), PRISM_OK);
    CU_ASSERT_EQUAL(prism_client_begin_step(c, 2), 1);
    CU_ASSERT_EQUAL(read_line(&agent).ext.lag_count, 0);
    CU_ASSERT_EQUAL(prism_client_begin_step(c, 3), 2);
    uint64_t after = now_ns();
    CU_ASSERT_EQUAL(prism_client_begin_step(c, 4), 2);
    line = read_line(&agent);
    CU_ASSERT_EQUAL(line.ext.lag_count, 1);
    CU_ASSERT_TRUE(line.ext.lag_sum_ns <= after - before);
    uint64_t total = 0;
    for (unsigned i = 0; i < PRISM_HINTS_LAG_BUCKETS; i++) {
        CU_ASSERT_EQUAL(line.ext.lag_buckets[i], i == prism_hints_lag_bucket(line.ext.lag_sum_ns) ? 1u : 0u);
        total += line.ext.lag_buckets[i];
    }
    CU_ASSERT_EQUAL(total, 1);

    /* Map 3 from an agent of an earlier build in a fresh table (no write time): used, not timed. */
    CU_ASSERT_EQUAL_FATAL(prism_hints_publish_map(&agent, 3, 4, 5, low, 2, &err), PRISM_OK);
    memset(&agent.h->slot_written[slot_of(&agent, 3)], 0, sizeof agent.h->slot_written[0]);
    CU_ASSERT_EQUAL(prism_client_begin_step(c, 5), 3);
    line = read_line(&agent);
    CU_ASSERT_EQUAL(line.ext.lag_count, 1);
    CU_ASSERT_EQUAL(line.applied_version, 3);
    CU_ASSERT_EQUAL(line.applied_step, 5);

    /* An agent of an earlier build took the table over and rewrites map 2's slot with map 4: the
     * slot keeps map 2's write time, taken after the client opened, stamped with version 2. Map 4
     * is used and not timed from map 2's write. */
    unsigned two = slot_of(&agent, 2);
    CU_ASSERT_EQUAL(agent.h->slot_written[two].map_version, 2);
    CU_ASSERT_TRUE(agent.h->slot_written[two].ns >= before);
    old_agent_writes(&agent, two, 4, 5, 6, low, 2);
    CU_ASSERT_EQUAL(prism_client_begin_step(c, 6), 4);
    line = read_line(&agent);
    CU_ASSERT_EQUAL(line.applied_version, 4);
    CU_ASSERT_EQUAL(line.ext.lag_count, 1);

    /* A current agent again: its map is timed. */
    CU_ASSERT_EQUAL_FATAL(prism_hints_publish_map(&agent, 5, 6, 7, low, 2, &err), PRISM_OK);
    CU_ASSERT_EQUAL(agent.h->slot_written[slot_of(&agent, 5)].map_version, 5);
    CU_ASSERT_EQUAL(prism_client_begin_step(c, 7), 5);
    line = read_line(&agent);
    CU_ASSERT_EQUAL(line.ext.lag_count, 2);
    prism_client_close(c);
    prism_hints_close(&agent);
}

/* Block transfers add into libprism's process totals, which the client publishes at begin_step.
 * The totals are the process's: the test reads them before and after its own transfers. */
static void test_block_transfers_are_published_by_precision(void)
{
    const char *dir = fresh_dir();
    prism_hints agent;
    prism_error err;
    CU_ASSERT_EQUAL_FATAL(prism_hints_create(&agent, hints_in(dir), 16, &err), PRISM_OK);
    prism_client *c = open_client(dir);
    prism_client_begin_step(c, 0);
    prism_hints_trainer was = read_line(&agent);

    enum { NUMEL = 1024 };
    static uint16_t weights[NUMEL], dst[NUMEL];
    for (unsigned i = 0; i < NUMEL; i++)
        weights[i] = (uint16_t)(0x3f80 + (i % 64)); /* bf16 1.0 .. 1.49 */
    prism_transfer_options o = {.backend = PRISM_TRANSFER_CPU, .max_block_bytes = NUMEL * 2};
    prism_transfer *t = NULL;
    CU_ASSERT_EQUAL_FATAL(prism_transfer_create(&o, &t, &err), PRISM_OK);
    CU_ASSERT_EQUAL_FATAL(prism_transfer_add_block(t, 0, weights, NUMEL, &err), PRISM_OK);
    /* Per block of 128 with FP32 scales: codes padded to 16 bytes, then 8 scales of 4 bytes. */
    static const struct {
        prism_precision p;
        unsigned fetches;
        uint64_t image;
    } runs[] = {{PRISM_PRECISION_BF16, 1, 2048},
                {PRISM_PRECISION_INT8, 2, 1024 + 32},
                {PRISM_PRECISION_FP8_E4M3, 1, 1024 + 32},
                {PRISM_PRECISION_INT4, 3, 512 + 32}};
    for (size_t r = 0; r < sizeof runs / sizeof runs[0]; r++)
        for (unsigned k = 0; k < runs[r].fetches; k++) {
            prism_transfer_ticket ticket;
            CU_ASSERT_EQUAL_FATAL(prism_transfer_fetch(t, 0, runs[r].p, dst, NULL, &ticket, &err), PRISM_OK);
        }
    prism_transfer_destroy(t);
    prism_client_begin_step(c, 1);
    prism_hints_trainer now = read_line(&agent);
    for (size_t r = 0; r < sizeof runs / sizeof runs[0]; r++) {
        unsigned p = runs[r].p;
        CU_ASSERT_EQUAL(now.ext.transfers[p] - was.ext.transfers[p], runs[r].fetches);
        CU_ASSERT_EQUAL(now.ext.transfer_bytes[p] - was.ext.transfer_bytes[p], runs[r].fetches * runs[r].image);
        CU_ASSERT_EQUAL(now.ext.transfer_bf16_bytes[p] - was.ext.transfer_bf16_bytes[p], runs[r].fetches * 2048u);
    }
    CU_ASSERT_EQUAL(now.ext.transfers[PRISM_PRECISION_FP8_E5M2], was.ext.transfers[PRISM_PRECISION_FP8_E5M2]);
    prism_client_close(c);
    prism_hints_close(&agent);
}

int main(int argc, char **argv)
{
    static const prism_test_case cases[] = {
        {"a_whole_line_reads_back_and_keeps_the_old_offsets", test_a_whole_line_reads_back_and_keeps_the_old_offsets},
        {"an_older_trainers_line_reads_as_what_it_published", test_an_older_trainers_line_reads_as_what_it_published},
        {"the_apply_lag_bucket_edges_are_inclusive_upper_bounds",
         test_the_apply_lag_bucket_edges_are_inclusive_upper_bounds},
        {"drops_are_counted_by_reason_and_published", test_drops_are_counted_by_reason_and_published},
        {"every_drop_has_a_named_reason", test_every_drop_has_a_named_reason},
        {"apply_lag_is_timed_for_maps_that_arrive_while_the_client_runs",
         test_apply_lag_is_timed_for_maps_that_arrive_while_the_client_runs},
        {"block_transfers_are_published_by_precision", test_block_transfers_are_published_by_precision},
        {NULL, NULL},
    };
    static const prism_test_suite suites[] = {{"trainer_line", cases}, {NULL, NULL}};
    return prism_test_main(argc, argv, suites);
}
