/* The plan file (client/plans.h) and the client's side of hybrid plans (include/prism/client.h:
 * the layout's cost fields in Hello, prism_client_stage_tensor_stats, prism_client_compute_precision
 * and prism_client_get_plan), against a test that plays the agent: a real Unix socket, a real
 * hint table and a real plan file in a scratch directory, frames decoded with protobuf-c.
 *
 * Pinned: the plan file's offsets (read as raw bytes, five slots), a write read back exactly, the
 * slot rule (the kept versions stay, a version rewritten in place; in the agent's order, the plan
 * of a map waiting in the hint table survives the next map's plan), a writer that
 * died mid-write (odd seq: no consistent read, never a torn plan; an emptied slot: no plan; a
 * new agent makes seq even and keeps the slots), files of another kind refused; the layout's
 * cost figures in Hello's BlockInfo; tensor statistics validated naming the entry, sent whole
 * with the next report written whole and cleared then, kept when the report is dropped; the
 * compute plan switching exactly at the map's effective step, with the map and only with it,
 * a map without a plan running every block high, a plan file mid-write holding back map and
 * plan together, a trainer with no plan file (an older agent) running every block high, a plan
 * file that appears after the trainer started taken within a reconnect interval, a plan
 * withdrawn or rewritten for the map in use read again, an unusable plan file counted, and the
 * plan file named after the hint table. */
#define _GNU_SOURCE
#include "testutil.h"

#include "hints.h"
#include "local.h"
#include "plans.h"
#include "prism/client.h"
#include "prism/v1/prism.pb-c.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

static const char *test_dir(void)
{
    static char dir[256];
    static unsigned n;
    snprintf(dir, sizeof dir, "%s/p%u", prism_scratch_dir(), n++);
    CU_ASSERT_EQUAL_FATAL(mkdir(dir, 0700), 0);
    return dir;
}

static char *path_in(const char *dir, const char *name)
{
    static char path[4][512];
    static unsigned i;
    char *p = path[i++ % 4];
    snprintf(p, sizeof path[0], "%s/%s", dir, name);
    return p;
}

static prism_plans_entry entry(uint64_t version, const char *cls)
{
    prism_plans_entry e;
    memset(&e, 0, sizeof e);
    e.map_version = version;
    e.low_format = PRISM_PRECISION_INT8;
    e.high_fp16 = 1;
    e.predicted_iteration_seconds = 0.25;
    e.compute_seconds = 0.125;
    snprintf(e.device_class, sizeof e.device_class, "%s", cls);
    return e;
}

/* Publishes keeping `keep` (0: nothing kept). */
static void publish_ok(prism_plans *t, uint64_t version, const uint8_t *blocks, uint32_t n, uint64_t keep)
{
    prism_plans_entry e = entry(version, "t4-16gb");
    prism_error err;
    prism_status s = prism_plans_publish(t, &e, blocks, n, keep ? &keep : NULL, keep ? 1u : 0u, &err);
    if (s != PRISM_OK)
        fprintf(stderr, "publish: %s\n", err.message);
    CU_ASSERT_EQUAL_FATAL(s, PRISM_OK);
}

/* ---- the file ---- */

static void test_offsets_are_pinned(void)
{
    const char *dir = test_dir();
    prism_plans t;
    CU_ASSERT_EQUAL_FATAL(prism_plans_create(&t, path_in(dir, PRISM_LOCAL_PLANS_NAME), 8, NULL), PRISM_OK);
    static const uint8_t blocks[3] = {0, PRISM_PRECISION_FP8_E4M3, PRISM_PRECISION_INT8};
    publish_ok(&t, 7, blocks, 3, 0);
    size_t len = 0;
    uint8_t *raw = (uint8_t *)prism_read_file(path_in(dir, PRISM_LOCAL_PLANS_NAME), &len);
    CU_ASSERT_PTR_NOT_NULL_FATAL(raw);
    CU_ASSERT_EQUAL(len, 1024 + 5 * 8); /* five slots: the hint table's four and one */
    uint64_t u64;
    uint32_t u32;
    double d;
    memcpy(&u64, raw + 0, 8);
    CU_ASSERT_EQUAL(u64, 0x314e4c5053495250ull);
    CU_ASSERT_EQUAL(memcmp(raw, "PRISPLN1", 8), 0);
    memcpy(&u32, raw + 8, 4);
    CU_ASSERT_EQUAL(u32, 2); /* layout version 2: five slots */
    memcpy(&u32, raw + 12, 4);
    CU_ASSERT_EQUAL(u32, 8);
    memcpy(&u64, raw + 16, 8);
    CU_ASSERT_EQUAL(u64, 1024 + 5 * 8);
    memcpy(&u64, raw + 24, 8);
    CU_ASSERT_EQUAL(u64, 1); /* generation */
    memcpy(&u64, raw + 64, 8);
    CU_ASSERT_EQUAL(u64, 4); /* seq: two writes (open, publish) */
    memcpy(&u64, raw + 72, 8);
    CU_ASSERT_EQUAL(u64, (uint64_t)getpid());
    const uint8_t *slot = raw + 128; /* slot 0 */
    memcpy(&u64, slot + 0, 8);
    CU_ASSERT_EQUAL(u64, 7);
    memcpy(&u32, slot + 8, 4);
    CU_ASSERT_EQUAL(u32, 3);
    memcpy(&u32, slot + 12, 4);
    CU_ASSERT_EQUAL(u32, PRISM_PRECISION_INT8);
    memcpy(&u32, slot + 16, 4);
    CU_ASSERT_EQUAL(u32, 1);
    memcpy(&u32, slot + 20, 4);
    CU_ASSERT_EQUAL(u32, 2);
    memcpy(&d, slot + 24, 8);
    CU_ASSERT_EQUAL(d, 0.25);
    memcpy(&d, slot + 32, 8);
    CU_ASSERT_EQUAL(d, 0.125);
    CU_ASSERT_STRING_EQUAL((const char *)slot + 40, "t4-16gb");
    static const uint8_t want[8] = {0, PRISM_PRECISION_FP8_E4M3, PRISM_PRECISION_INT8, 0, 0, 0, 0, 0};
    CU_ASSERT_EQUAL(memcmp(raw + 1024, want, 8), 0);
    free(raw);
    /* The fifth slot, at 128 + 4 * 168, and its bytes after the fourth slot's. */
    for (uint64_t v = 8; v <= 11; v++)
        publish_ok(&t, v, blocks, 3, 0);
    raw = (uint8_t *)prism_read_file(path_in(dir, PRISM_LOCAL_PLANS_NAME), &len);
    CU_ASSERT_PTR_NOT_NULL_FATAL(raw);
    memcpy(&u64, raw + 128 + 4 * 168, 8);
    CU_ASSERT_EQUAL(u64, 11);
    CU_ASSERT_EQUAL(memcmp(raw + 1024 + 4 * 8, want, 8), 0);
    free(raw);
    prism_plans_close(&t);
}

static void test_write_read_round_trip(void)
{
    const char *dir = test_dir();
    const char *path = path_in(dir, PRISM_LOCAL_PLANS_NAME);
    prism_plans w, r;
    CU_ASSERT_EQUAL_FATAL(prism_plans_create(&w, path, 8, NULL), PRISM_OK);
    CU_ASSERT_EQUAL_FATAL(prism_plans_open(&r, path, NULL), PRISM_OK);
    static const uint8_t blocks[4] = {0, PRISM_PRECISION_INT8, 0, PRISM_PRECISION_INT8};
    publish_ok(&w, 3, blocks, 4, 0);
    prism_plans_entry e;
    uint8_t out[6];
    memset(out, 0xee, sizeof out);
    CU_ASSERT_EQUAL(prism_plans_read(&r, 3, &e, out, 6, 4), PRISM_PLANS_FOUND);
    static const uint8_t want[6] = {0, PRISM_PRECISION_INT8, 0, PRISM_PRECISION_INT8, 0, 0};
    CU_ASSERT_EQUAL(memcmp(out, want, 6), 0);
    CU_ASSERT_EQUAL(e.map_version, 3);
    CU_ASSERT_EQUAL(e.n_blocks, 4);
    CU_ASSERT_EQUAL(e.low_blocks, 2);
    CU_ASSERT_EQUAL(e.low_format, PRISM_PRECISION_INT8);
    CU_ASSERT_EQUAL(e.high_fp16, 1);
    CU_ASSERT_EQUAL(e.predicted_iteration_seconds, 0.25);
    CU_ASSERT_EQUAL(e.compute_seconds, 0.125);
    CU_ASSERT_STRING_EQUAL(e.device_class, "t4-16gb");
    /* A trainer with fewer blocks: the count is over what it copied. */
    CU_ASSERT_EQUAL(prism_plans_read(&r, 3, &e, out, 2, 4), PRISM_PLANS_FOUND);
    CU_ASSERT_EQUAL(e.low_blocks, 1);
    /* No slot for a version: no plan. Version 0 never has one. */
    CU_ASSERT_EQUAL(prism_plans_read(&r, 4, &e, out, 6, 4), PRISM_PLANS_NONE);
    CU_ASSERT_EQUAL(prism_plans_read(&r, 0, &e, out, 6, 4), PRISM_PLANS_NONE);
    /* The same version again is rewritten in its slot. */
    static const uint8_t again[2] = {PRISM_PRECISION_INT8, 0};
    publish_ok(&w, 3, again, 2, 0);
    CU_ASSERT_EQUAL(prism_plans_read(&r, 3, &e, out, 6, 4), PRISM_PLANS_FOUND);
    CU_ASSERT_EQUAL(out[0], PRISM_PRECISION_INT8);
    CU_ASSERT_EQUAL(out[1] + out[2] + out[3] + out[4] + out[5], 0);
    unsigned with_3 = 0;
    for (unsigned i = 0; i < PRISM_PLANS_SLOTS; i++)
        with_3 += w.h->slots[i].map_version == 3;
    CU_ASSERT_EQUAL(with_3, 1);
    prism_plans_close(&r);
    prism_plans_close(&w);
}

static void test_slot_reuse_keeps_the_kept_versions(void)
{
    const char *dir = test_dir();
    const char *path = path_in(dir, PRISM_LOCAL_PLANS_NAME);
    prism_plans w, r;
    CU_ASSERT_EQUAL_FATAL(prism_plans_create(&w, path, 4, NULL), PRISM_OK);
    CU_ASSERT_EQUAL_FATAL(prism_plans_open(&r, path, NULL), PRISM_OK);
    uint8_t b[1];
    for (uint64_t v = 1; v <= 5; v++) {
        b[0] = (uint8_t)(v % 2 ? PRISM_PRECISION_INT8 : PRISM_PRECISION_FP8_E4M3);
        publish_ok(&w, v, b, 1, 0);
    }
    /* Full; 2, 4 and 5 kept: 1 goes, then 3, then 6 (the lowest not kept). */
    static const uint64_t keep[3] = {2, 4, 5};
    prism_error err;
    for (uint64_t v = 6; v <= 8; v++) {
        prism_plans_entry e = entry(v, "c");
        CU_ASSERT_EQUAL(prism_plans_publish(&w, &e, b, 1, keep, 3, &err), PRISM_OK);
    }
    prism_plans_entry e;
    uint8_t out[1];
    static const int present[9] = {0, 0, 1, 0, 1, 1, 0, 1, 1};
    for (uint64_t v = 1; v <= 8; v++) {
        prism_plans_found f = prism_plans_read(&r, v, &e, out, 1, 4);
        CU_ASSERT_EQUAL(f, present[v] ? PRISM_PLANS_FOUND : PRISM_PLANS_NONE);
        if (v == 2 && f == PRISM_PLANS_FOUND)
            CU_ASSERT_EQUAL(out[0], PRISM_PRECISION_FP8_E4M3);
    }
    /* A version rewritten in place, whatever is kept: nothing else goes. */
    prism_plans_entry e7 = entry(7, "rewritten");
    CU_ASSERT_EQUAL(prism_plans_publish(&w, &e7, b, 1, keep, 3, &err), PRISM_OK);
    CU_ASSERT_EQUAL(prism_plans_read(&r, 7, &e, out, 1, 4), PRISM_PLANS_FOUND);
    CU_ASSERT_STRING_EQUAL(e.device_class, "rewritten");
    for (uint64_t v = 1; v <= 8; v++)
        CU_ASSERT_EQUAL(prism_plans_read(&r, v, &e, out, 1, 4), present[v] ? PRISM_PLANS_FOUND : PRISM_PLANS_NONE);
    /* Nothing kept: the lowest goes (2). Four kept, one slot left to write: always. */
    publish_ok(&w, 9, b, 1, 0);
    CU_ASSERT_EQUAL(prism_plans_read(&r, 2, &e, out, 1, 4), PRISM_PLANS_NONE);
    static const uint64_t keep4[4] = {4, 5, 7, 8};
    prism_plans_entry e10 = entry(10, "c");
    CU_ASSERT_EQUAL(prism_plans_publish(&w, &e10, b, 1, keep4, 4, &err), PRISM_OK);
    for (unsigned i = 0; i < 4; i++)
        CU_ASSERT_EQUAL(prism_plans_read(&r, keep4[i], &e, out, 1, 4), PRISM_PLANS_FOUND);
    CU_ASSERT_EQUAL(prism_plans_read(&r, 9, &e, out, 1, 4), PRISM_PLANS_NONE);
    CU_ASSERT_EQUAL(prism_plans_read(&r, 10, &e, out, 1, 4), PRISM_PLANS_FOUND);
    prism_plans_close(&r);
    prism_plans_close(&w);
}

static void test_torn_write_is_never_read(void)
{
    const char *dir = test_dir();
    const char *path = path_in(dir, PRISM_LOCAL_PLANS_NAME);
    prism_plans w, r;
    CU_ASSERT_EQUAL_FATAL(prism_plans_create(&w, path, 4, NULL), PRISM_OK);
    CU_ASSERT_EQUAL_FATAL(prism_plans_open(&r, path, NULL), PRISM_OK);
    static const uint8_t b[2] = {PRISM_PRECISION_INT8, PRISM_PRECISION_INT8};
    publish_ok(&w, 1, b, 2, 0);
    publish_ok(&w, 2, b, 2, 0);
    /* A writer that died mid-write of version 2's slot: seq odd, the slot emptied first. */
    uint64_t seq = atomic_load(&w.h->seq);
    atomic_store(&w.h->seq, seq + 1);
    unsigned slot2 = w.h->slots[0].map_version == 2 ? 0u : 1u;
    w.h->slots[slot2].map_version = 0;
    w.blocks[(size_t)slot2 * 4] = 0xff; /* half-written bytes */
    prism_plans_entry e = entry(99, "untouched");
    uint8_t out[2] = {7, 7};
    CU_ASSERT_EQUAL(prism_plans_read(&r, 1, &e, out, 2, 16), PRISM_PLANS_INCONSISTENT);
    CU_ASSERT_EQUAL(e.map_version, 99);
    CU_ASSERT_STRING_EQUAL(e.device_class, "untouched");
    prism_plans_close(&w);
    /* A new agent: seq even again, the slots kept, the emptied one empty (no torn plan). */
    CU_ASSERT_EQUAL_FATAL(prism_plans_create(&w, path, 4, NULL), PRISM_OK);
    CU_ASSERT_EQUAL(atomic_load(&w.h->seq) % 2, 0);
    CU_ASSERT_EQUAL(w.h->generation, 2);
    CU_ASSERT_EQUAL(prism_plans_read(&r, 1, &e, out, 2, 1), PRISM_PLANS_FOUND);
    CU_ASSERT_EQUAL(prism_plans_read(&r, 2, &e, out, 2, 1), PRISM_PLANS_NONE);
    CU_ASSERT_FALSE(prism_plans_replaced(&r, path));
    prism_plans_close(&r);
    prism_plans_close(&w);
}

static void test_bad_files_and_writes_are_refused(void)
{
    const char *dir = test_dir();
    const char *path = path_in(dir, PRISM_LOCAL_PLANS_NAME);
    prism_plans t;
    prism_error err;
    CU_ASSERT_EQUAL(prism_plans_open(&t, path, &err), PRISM_ERR_NOT_FOUND);
    prism_write_file(dir, PRISM_LOCAL_PLANS_NAME, "not a plan file");
    CU_ASSERT_EQUAL(prism_plans_open(&t, path, &err), PRISM_ERR_INVALID);
    /* A hint table is not a plan file. */
    prism_hints h;
    CU_ASSERT_EQUAL_FATAL(prism_hints_create(&h, path_in(dir, "hints"), 4, NULL), PRISM_OK);
    CU_ASSERT_EQUAL(prism_plans_open(&t, path_in(dir, "hints"), &err), PRISM_ERR_INVALID);
    CU_ASSERT_PTR_NOT_NULL(strstr(err.message, "magic"));
    prism_hints_close(&h);
    /* The agent replaces what it cannot keep: a trainer's old mapping stays valid. */
    CU_ASSERT_EQUAL_FATAL(prism_plans_create(&t, path, 4, NULL), PRISM_OK);
    prism_plans r;
    CU_ASSERT_EQUAL_FATAL(prism_plans_open(&r, path, NULL), PRISM_OK);
    prism_plans_close(&t);
    CU_ASSERT_EQUAL_FATAL(prism_plans_create(&t, path, 16, NULL), PRISM_OK);
    CU_ASSERT_TRUE(prism_plans_replaced(&r, path));
    CU_ASSERT_EQUAL(r.h->max_blocks, 4);
    prism_plans_close(&r);

    uint8_t b[17] = {0};
    prism_plans_entry e = entry(0, "x");
    CU_ASSERT_EQUAL(prism_plans_publish(&t, &e, b, 1, NULL, 0, &err), PRISM_ERR_INVALID);
    e.map_version = 1;
    CU_ASSERT_EQUAL(prism_plans_publish(&t, &e, b, 17, NULL, 0, &err), PRISM_ERR_LIMIT);
    b[2] = 9;
    CU_ASSERT_EQUAL(prism_plans_publish(&t, &e, b, 3, NULL, 0, &err), PRISM_ERR_INVALID);
    CU_ASSERT_PTR_NOT_NULL(strstr(err.message, "blocks[2]"));
    b[2] = 0;
    static const uint64_t keep5[5] = {1, 2, 3, 4, 5};
    CU_ASSERT_EQUAL(prism_plans_publish(&t, &e, b, 3, keep5, 5, &err), PRISM_ERR_INVALID);
    CU_ASSERT_PTR_NOT_NULL(strstr(err.message, "keep"));
    CU_ASSERT_EQUAL(prism_plans_publish(&t, &e, b, 3, NULL, 1, &err), PRISM_ERR_INVALID);
    e.low_format = PRISM_PRECISION_BF16;
    CU_ASSERT_EQUAL(prism_plans_publish(&t, &e, b, 3, NULL, 0, &err), PRISM_ERR_INVALID);
    CU_ASSERT_PTR_NOT_NULL(strstr(err.message, "low_format"));
    for (unsigned i = 0; i < PRISM_PLANS_SLOTS; i++)
        CU_ASSERT_EQUAL(t.h->slots[i].map_version, 0);
    prism_plans_close(&t);
}

/* ---- the client, with the test as its agent ---- */

static const uint64_t shape_a[] = {2, 8, 8};
static const prism_block_layout blocks4[] = {
    {"b0", 128, shape_a, 3, 1024, 2048, 4096},
    {"b1", 128, shape_a, 3, 1ull << 40, 0, 7},
    {"b2", 128, shape_a, 3, 0, 3, 0},
    {"b3", 0, NULL, 0, 5, 6, 18446744073709551615ull},
};

static prism_model_layout layout4(void)
{
    prism_model_layout l = {.model_id = "hybrid@1",
                            .quant = {.format = PRISM_PRECISION_INT8, .granularity = PRISM_GRANULARITY_TENSOR},
                            .blocks = blocks4,
                            .n_blocks = 4};
    return l;
}

static int agent_listen(const char *dir)
{
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    CU_ASSERT_FATAL(fd >= 0);
    struct sockaddr_un a = {.sun_family = AF_UNIX};
    snprintf(a.sun_path, sizeof a.sun_path, "%s/%s", dir, PRISM_LOCAL_SOCKET_NAME);
    CU_ASSERT_EQUAL_FATAL(bind(fd, (struct sockaddr *)&a, sizeof a), 0);
    CU_ASSERT_EQUAL_FATAL(listen(fd, 4), 0);
    return fd;
}

static int agent_accept(int lfd)
{
    struct pollfd p = {.fd = lfd, .events = POLLIN};
    if (poll(&p, 1, 5000) != 1)
        return -1;
    return accept4(lfd, NULL, NULL, SOCK_CLOEXEC);
}

static bool read_exact(int fd, uint8_t *buf, size_t n)
{
    size_t got = 0;
    while (got < n) {
        struct pollfd p = {.fd = fd, .events = POLLIN};
        if (poll(&p, 1, 5000) != 1)
            return false;
        ssize_t r = read(fd, buf + got, n - got);
        if (r <= 0)
            return false;
        got += (size_t)r;
    }
    return true;
}

static Prism__V1__AgentMessage *agent_read(int fd)
{
    uint8_t hdr[PRISM_LOCAL_FRAME_HEADER];
    if (!read_exact(fd, hdr, sizeof hdr))
        return NULL;
    uint32_t len = prism_local_get_len(hdr);
    uint8_t *buf = malloc(len ? len : 1);
    CU_ASSERT_PTR_NOT_NULL_FATAL(buf);
    Prism__V1__AgentMessage *m = NULL;
    if (read_exact(fd, buf, len))
        m = prism__v1__agent_message__unpack(NULL, len, buf);
    free(buf);
    return m;
}

static prism_client *open_client(const char *dir)
{
    prism_client_options o = {.dir = dir, .job_id = "job-h", .rank = 0, .world_size = 2, .reconnect_interval_ms = 1};
    prism_client *c = NULL;
    CU_ASSERT_EQUAL_FATAL(prism_client_open(&o, &c, NULL), PRISM_OK);
    return c;
}

static prism_client *open_client_with(const char *dir, const char *hints_name, uint32_t interval_ms)
{
    prism_client_options o = {.dir = dir, .hints_name = hints_name, .job_id = "job-h", .rank = 0, .world_size = 2,
                              .reconnect_interval_ms = interval_ms};
    prism_client *c = NULL;
    CU_ASSERT_EQUAL_FATAL(prism_client_open(&o, &c, NULL), PRISM_OK);
    return c;
}

static uint64_t mono_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

/* Returns once CLOCK_MONOTONIC has moved `ms` milliseconds past `from` (the client's reconnect
 * interval has passed: the condition itself, not a guess at how long an event takes). */
static void pass_ms(uint64_t from, uint64_t ms)
{
    while (mono_ms() < from + ms + 1) {
        struct timespec d = {0, 500000};
        nanosleep(&d, NULL);
    }
}

static void register4(prism_client *c)
{
    prism_model_layout l = layout4();
    prism_error err;
    prism_status s = prism_client_register(c, &l, &err);
    if (s)
        fprintf(stderr, "register: %s\n", err.message);
    CU_ASSERT_EQUAL_FATAL(s, PRISM_OK);
}

static prism_client_counters counters(const prism_client *c)
{
    prism_client_counters n;
    CU_ASSERT_EQUAL_FATAL(prism_client_get_counters(c, &n, NULL), PRISM_OK);
    return n;
}

static prism_status report(prism_client *c, uint64_t step)
{
    static const uint32_t ids[1] = {0};
    prism_grad_stats st = {.l2_norm = 1, .max_abs = 1, .numel = 64};
    return prism_client_report_step(c, step, NULL, ids, &st, 1, NULL);
}

static void test_hello_carries_the_layout_cost_figures(void)
{
    const char *dir = test_dir();
    int lfd = agent_listen(dir);
    prism_client *c = open_client(dir);
    register4(c);
    int fd = agent_accept(lfd);
    CU_ASSERT_FATAL(fd >= 0);
    Prism__V1__AgentMessage *m = agent_read(fd);
    CU_ASSERT_PTR_NOT_NULL_FATAL(m);
    CU_ASSERT_EQUAL_FATAL(m->kind_case, PRISM__V1__AGENT_MESSAGE__KIND_HELLO);
    const Prism__V1__ModelLayout *l = m->hello->layout;
    CU_ASSERT_EQUAL_FATAL(l->n_blocks, 4);
    for (unsigned i = 0; i < 4; i++) {
        CU_ASSERT_EQUAL(l->blocks[i]->flops, blocks4[i].flops);
        CU_ASSERT_EQUAL(l->blocks[i]->activation_bytes_bf16, blocks4[i].activation_bytes_bf16);
        CU_ASSERT_EQUAL(l->blocks[i]->state_bytes, blocks4[i].state_bytes);
        CU_ASSERT_EQUAL(l->blocks[i]->param_bytes_bf16, blocks4[i].param_bytes_bf16);
    }
    prism__v1__agent_message__free_unpacked(m, NULL);
    /* The cost figures are not identity: the fingerprint ignores them. */
    prism_block_layout other[4];
    memcpy(other, blocks4, sizeof other);
    for (unsigned i = 0; i < 4; i++)
        other[i].flops = other[i].activation_bytes_bf16 = other[i].state_bytes = 0;
    prism_model_layout lo = layout4();
    lo.blocks = other;
    uint8_t a[PRISM_FINGERPRINT_BYTES], b[PRISM_FINGERPRINT_BYTES];
    prism_model_layout l4 = layout4();
    CU_ASSERT_EQUAL(prism_model_fingerprint(&l4, a, NULL), PRISM_OK);
    CU_ASSERT_EQUAL(prism_model_fingerprint(&lo, b, NULL), PRISM_OK);
    CU_ASSERT_EQUAL(memcmp(a, b, sizeof a), 0);
    prism_client_close(c);
    close(fd);
    close(lfd);
}

static prism_block_tensor_stats ts(uint32_t id, double x)
{
    prism_block_tensor_stats t = {.block_id = id, .x_l2 = x, .x_max_abs = x / 2, .x_numel = 100 + id,
                                  .w_l2 = x * 3, .w_max_abs = x / 4, .w_numel = 64, .y_numel = 200 + id};
    return t;
}

static void test_stage_tensor_stats_refuses_bad_entries_naming_them(void)
{
    const char *dir = test_dir();
    prism_client *c = open_client(dir);
    prism_error err;
    prism_block_tensor_stats s[2] = {ts(0, 1), ts(1, 2)};
    CU_ASSERT_EQUAL(prism_client_stage_tensor_stats(c, s, 2, &err), PRISM_ERR_STATE);
    register4(c);
    CU_ASSERT_EQUAL(prism_client_stage_tensor_stats(NULL, s, 2, &err), PRISM_ERR_INVALID);
    CU_ASSERT_EQUAL(prism_client_stage_tensor_stats(c, NULL, 2, &err), PRISM_ERR_INVALID);
    s[1].block_id = 4;
    CU_ASSERT_EQUAL(prism_client_stage_tensor_stats(c, s, 2, &err), PRISM_ERR_INVALID);
    CU_ASSERT_PTR_NOT_NULL(strstr(err.message, "stats[1].block_id"));
    s[1].block_id = 0;
    CU_ASSERT_EQUAL(prism_client_stage_tensor_stats(c, s, 2, &err), PRISM_ERR_INVALID);
    CU_ASSERT_PTR_NOT_NULL(strstr(err.message, "appears twice"));
    s[1] = ts(1, 2);
    s[1].reserved = 1;
    CU_ASSERT_EQUAL(prism_client_stage_tensor_stats(c, s, 2, &err), PRISM_ERR_INVALID);
    CU_ASSERT_PTR_NOT_NULL(strstr(err.message, "stats[1].reserved"));
    const char *names[4] = {"x_l2", "x_max_abs", "w_l2", "w_max_abs"};
    const double bad[3] = {-1.0, NAN, INFINITY};
    for (unsigned f = 0; f < 4; f++)
        for (unsigned k = 0; k < 3; k++) {
            s[1] = ts(1, 2);
            double *field = f == 0 ? &s[1].x_l2 : f == 1 ? &s[1].x_max_abs : f == 2 ? &s[1].w_l2 : &s[1].w_max_abs;
            *field = bad[k];
            CU_ASSERT_EQUAL(prism_client_stage_tensor_stats(c, s, 2, &err), PRISM_ERR_INVALID);
            char want[32];
            snprintf(want, sizeof want, "stats[1].%s", names[f]);
            CU_ASSERT_PTR_NOT_NULL(strstr(err.message, want));
        }
    prism_block_tensor_stats five[5] = {ts(0, 1), ts(1, 1), ts(2, 1), ts(3, 1), ts(0, 1)};
    CU_ASSERT_EQUAL(prism_client_stage_tensor_stats(c, five, 5, &err), PRISM_ERR_INVALID);
    /* Every refusal counted but the NULL client's: state, NULL stats, id, twice, reserved, 12 figures, too many. */
    CU_ASSERT_EQUAL(counters(c).invalid_calls, 18);
    /* Zero figures and a missing half are fine. */
    s[0] = (prism_block_tensor_stats){.block_id = 3};
    CU_ASSERT_EQUAL(prism_client_stage_tensor_stats(c, s, 1, &err), PRISM_OK);
    CU_ASSERT_EQUAL(prism_client_stage_tensor_stats(c, NULL, 0, &err), PRISM_OK);
    prism_client_close(c);
}

static void test_tensor_stats_go_with_the_next_report_written_whole(void)
{
    const char *dir = test_dir();
    prism_client *c = open_client(dir);
    register4(c);
    prism_block_tensor_stats s[2] = {ts(2, 1.5), ts(0, 0.75)};
    CU_ASSERT_EQUAL_FATAL(prism_client_stage_tensor_stats(c, s, 2, NULL), PRISM_OK);
    /* No agent: the report is dropped and the statistics stay staged. */
    CU_ASSERT_EQUAL(report(c, 1), PRISM_ERR_UNAVAILABLE);
    CU_ASSERT_EQUAL(counters(c).tensor_stats_sent, 0);
    int lfd = agent_listen(dir);
    prism_status st = PRISM_ERR_UNAVAILABLE;
    for (int i = 0; i < 2000 && st != PRISM_OK; i++) { /* the reconnect interval is 1 ms */
        st = report(c, 2);
        if (st != PRISM_OK)
            usleep(1000);
    }
    CU_ASSERT_EQUAL_FATAL(st, PRISM_OK);
    int fd = agent_accept(lfd);
    CU_ASSERT_FATAL(fd >= 0);
    Prism__V1__AgentMessage *m = agent_read(fd);
    CU_ASSERT_PTR_NOT_NULL_FATAL(m);
    CU_ASSERT_EQUAL(m->kind_case, PRISM__V1__AGENT_MESSAGE__KIND_HELLO);
    prism__v1__agent_message__free_unpacked(m, NULL);
    m = agent_read(fd);
    CU_ASSERT_PTR_NOT_NULL_FATAL(m);
    CU_ASSERT_EQUAL_FATAL(m->kind_case, PRISM__V1__AGENT_MESSAGE__KIND_STEP_REPORT);
    const Prism__V1__StepReport *r = m->step_report;
    CU_ASSERT_EQUAL(r->step, 2);
    CU_ASSERT_EQUAL_FATAL(r->n_tensor_stats, 2);
    for (unsigned i = 0; i < 2; i++) {
        const Prism__V1__BlockTensorStats *t = r->tensor_stats[i];
        CU_ASSERT_EQUAL(t->block_id, s[i].block_id);
        CU_ASSERT_EQUAL(t->x_l2, s[i].x_l2);
        CU_ASSERT_EQUAL(t->x_max_abs, s[i].x_max_abs);
        CU_ASSERT_EQUAL(t->x_numel, s[i].x_numel);
        CU_ASSERT_EQUAL(t->w_l2, s[i].w_l2);
        CU_ASSERT_EQUAL(t->w_max_abs, s[i].w_max_abs);
        CU_ASSERT_EQUAL(t->w_numel, s[i].w_numel);
        CU_ASSERT_EQUAL(t->y_numel, s[i].y_numel);
    }
    prism__v1__agent_message__free_unpacked(m, NULL);
    CU_ASSERT_EQUAL(counters(c).tensor_stats_sent, 2);
    /* Cleared: the next report carries none. */
    CU_ASSERT_EQUAL(report(c, 3), PRISM_OK);
    m = agent_read(fd);
    CU_ASSERT_PTR_NOT_NULL_FATAL(m);
    CU_ASSERT_EQUAL(m->step_report->n_tensor_stats, 0);
    prism__v1__agent_message__free_unpacked(m, NULL);
    CU_ASSERT_EQUAL(counters(c).tensor_stats_sent, 2);
    CU_ASSERT_EQUAL(counters(c).reports_sent, 2);
    prism_client_close(c);
    close(fd);
    close(lfd);
}

/* The agent's side: plan of `version` (blocks low as given) first, then the map. */
static void agent_publish(prism_plans *plans, prism_hints *hints, uint64_t version, uint64_t effective,
                          const uint8_t *low, uint32_t n)
{
    if (low)
        publish_ok(plans, version, low, n, 0);
    uint8_t map[4] = {0, 0, 0, 0};
    CU_ASSERT_EQUAL_FATAL(prism_hints_publish_map(hints, version, effective - 2, effective, map, 4, NULL), PRISM_OK);
}

static void expect_compute(const prism_client *c, const uint8_t want[4])
{
    for (uint32_t b = 0; b < 4; b++)
        CU_ASSERT_EQUAL(prism_client_compute_precision(c, b), (prism_precision)want[b]);
    CU_ASSERT_EQUAL(prism_client_compute_precision(c, 4), PRISM_PRECISION_BF16);
}

static void test_compute_plan_switches_with_the_map_at_its_effective_step(void)
{
    const char *dir = test_dir();
    prism_plans plans;
    prism_hints hints;
    CU_ASSERT_EQUAL_FATAL(prism_plans_create(&plans, path_in(dir, PRISM_LOCAL_PLANS_NAME), 16, NULL), PRISM_OK);
    CU_ASSERT_EQUAL_FATAL(prism_hints_create(&hints, path_in(dir, PRISM_LOCAL_HINTS_NAME), 16, NULL), PRISM_OK);
    prism_client *c = open_client(dir);
    register4(c);
    static const uint8_t high[4] = {0, 0, 0, 0};
    static const uint8_t low12[4] = {0, PRISM_PRECISION_INT8, PRISM_PRECISION_INT8, 0};
    agent_publish(&plans, &hints, 1, 5, low12, 3);
    prism_client_plan p;
    CU_ASSERT_EQUAL(prism_client_begin_step(c, 4), 0);
    expect_compute(c, high);
    CU_ASSERT_EQUAL(prism_client_get_plan(c, &p, NULL), PRISM_OK);
    CU_ASSERT_FALSE(p.has_plan);
    CU_ASSERT_EQUAL(p.low_format, PRISM_PRECISION_BF16);
    CU_ASSERT_EQUAL(prism_client_begin_step(c, 5), 1);
    expect_compute(c, low12);
    CU_ASSERT_EQUAL(prism_client_get_plan(c, &p, NULL), PRISM_OK);
    CU_ASSERT_TRUE(p.has_plan);
    CU_ASSERT_TRUE(p.high_fp16);
    CU_ASSERT_EQUAL(p.low_format, PRISM_PRECISION_INT8);
    CU_ASSERT_EQUAL(p.map_version, 1);
    CU_ASSERT_EQUAL(p.low_blocks, 2);
    CU_ASSERT_EQUAL(p.predicted_iteration_seconds, 0.25);
    CU_ASSERT_EQUAL(p.compute_seconds, 0.125);
    CU_ASSERT_STRING_EQUAL(p.device_class, "t4-16gb");
    CU_ASSERT_EQUAL(counters(c).plans_applied, 1);
    /* The same map at the next step: the plan stays, not counted again. */
    CU_ASSERT_EQUAL(prism_client_begin_step(c, 6), 1);
    expect_compute(c, low12);
    CU_ASSERT_EQUAL(counters(c).plans_applied, 1);

    /* Map 2 comes without a plan: from its effective step every block is high. */
    agent_publish(&plans, &hints, 2, 8, NULL, 0);
    CU_ASSERT_EQUAL(prism_client_begin_step(c, 7), 1);
    expect_compute(c, low12);
    CU_ASSERT_EQUAL(prism_client_begin_step(c, 8), 2);
    expect_compute(c, high);
    CU_ASSERT_EQUAL(prism_client_get_plan(c, &p, NULL), PRISM_OK);
    CU_ASSERT_FALSE(p.has_plan);
    CU_ASSERT_EQUAL(p.map_version, 2);
    CU_ASSERT_EQUAL(counters(c).plans_applied, 1);

    /* Map 3 with a plan, the plan file mid-write at its effective step: map and plan wait
     * together (the map in use stays 2), then switch together. */
    static const uint8_t low0[4] = {PRISM_PRECISION_FP8_E4M3, 0, 0, 0};
    agent_publish(&plans, &hints, 3, 10, low0, 1);
    uint64_t seq = atomic_load(&plans.h->seq);
    atomic_store(&plans.h->seq, seq + 1);
    uint64_t failures = counters(c).hint_read_failures;
    CU_ASSERT_EQUAL(prism_client_begin_step(c, 10), 2);
    CU_ASSERT_EQUAL(counters(c).hint_read_failures, failures + 1);
    expect_compute(c, high);
    atomic_store(&plans.h->seq, seq + 2);
    CU_ASSERT_EQUAL(prism_client_begin_step(c, 11), 3);
    expect_compute(c, low0);
    CU_ASSERT_EQUAL(counters(c).plans_applied, 2);
    CU_ASSERT_EQUAL(counters(c).late_switches, 1);
    CU_ASSERT_EQUAL(prism_client_get_plan(c, &p, NULL), PRISM_OK);
    CU_ASSERT_EQUAL(p.low_blocks, 1);

    /* NULL arguments. */
    CU_ASSERT_EQUAL(prism_client_compute_precision(NULL, 0), PRISM_PRECISION_BF16);
    CU_ASSERT_EQUAL(prism_client_get_plan(NULL, &p, NULL), PRISM_ERR_INVALID);
    CU_ASSERT_EQUAL(prism_client_get_plan(c, NULL, NULL), PRISM_ERR_INVALID);
    prism_client_close(c);
    prism_hints_close(&hints);
    prism_plans_close(&plans);
}

static void test_register_after_begin_step_reads_the_plan(void)
{
    const char *dir = test_dir();
    prism_plans plans;
    prism_hints hints;
    CU_ASSERT_EQUAL_FATAL(prism_plans_create(&plans, path_in(dir, PRISM_LOCAL_PLANS_NAME), 16, NULL), PRISM_OK);
    CU_ASSERT_EQUAL_FATAL(prism_hints_create(&hints, path_in(dir, PRISM_LOCAL_HINTS_NAME), 16, NULL), PRISM_OK);
    static const uint8_t low3[4] = {0, 0, 0, PRISM_PRECISION_INT8};
    agent_publish(&plans, &hints, 1, 2, low3, 4);
    prism_client *c = open_client(dir);
    CU_ASSERT_EQUAL(prism_client_begin_step(c, 2), 1);
    CU_ASSERT_EQUAL(prism_client_compute_precision(c, 3), PRISM_PRECISION_BF16); /* no layout yet */
    register4(c);
    expect_compute(c, low3);
    prism_client_close(c);
    prism_hints_close(&hints);
    prism_plans_close(&plans);
}

static void test_without_a_plan_file_every_block_runs_high(void)
{
    const char *dir = test_dir();
    prism_hints hints;
    CU_ASSERT_EQUAL_FATAL(prism_hints_create(&hints, path_in(dir, PRISM_LOCAL_HINTS_NAME), 16, NULL), PRISM_OK);
    uint8_t map[4] = {0, 1, 0, 1};
    CU_ASSERT_EQUAL_FATAL(prism_hints_publish_map(&hints, 1, 0, 2, map, 4, NULL), PRISM_OK);
    prism_client *c = open_client(dir);
    register4(c);
    CU_ASSERT_EQUAL(prism_client_begin_step(c, 2), 1);
    static const uint8_t high[4] = {0, 0, 0, 0};
    expect_compute(c, high);
    CU_ASSERT_EQUAL(prism_client_block_precision(c, 1), PRISM_PRECISION_INT8); /* the map itself applies */
    prism_client_plan p;
    CU_ASSERT_EQUAL(prism_client_get_plan(c, &p, NULL), PRISM_OK);
    CU_ASSERT_FALSE(p.has_plan);
    CU_ASSERT_EQUAL(counters(c).plans_applied, 0);
    CU_ASSERT_EQUAL(counters(c).hint_read_failures, 0);
    prism_client_close(c);
    prism_hints_close(&hints);
}


/* The agent's order for one map (upstream.c): the plan first, keeping the plans of every map the
 * hint table holds, then the map. */
static void agent_write_plan(prism_plans *plans, const prism_hints *hints, uint64_t version, const uint8_t *low,
                             uint32_t n)
{
    uint64_t keep[PRISM_HINTS_SLOTS];
    unsigned n_keep = prism_hints_held_versions(hints, keep);
    prism_plans_entry e = entry(version, "t4-16gb");
    prism_error err;
    prism_status s = prism_plans_publish(plans, &e, low, n, keep, n_keep, &err);
    if (s != PRISM_OK)
        fprintf(stderr, "publish: %s\n", err.message);
    CU_ASSERT_EQUAL_FATAL(s, PRISM_OK);
}

static void agent_write_map(prism_hints *hints, uint64_t version, uint64_t effective)
{
    uint8_t map[4] = {0, 0, 0, 0};
    CU_ASSERT_EQUAL_FATAL(prism_hints_publish_map(hints, version, effective - 1, effective, map, 4, NULL), PRISM_OK);
}

/* The trainer applied A (1); V, W, X (2, 3, 4) wait in the hint table for their effective
 * steps; the plan of Z (5) is written before map Z goes in. V's plan must survive that write: a
 * trainer reaching V's effective step before map Z lands uses V with its plan. Once map Z is in
 * the table (it took V's slot there), V's plan is the one the next plan may take. */
static void test_the_plan_of_a_pending_map_is_never_evicted(void)
{
    const char *dir = test_dir();
    prism_plans plans;
    prism_hints hints;
    CU_ASSERT_EQUAL_FATAL(prism_plans_create(&plans, path_in(dir, PRISM_LOCAL_PLANS_NAME), 16, NULL), PRISM_OK);
    CU_ASSERT_EQUAL_FATAL(prism_hints_create(&hints, path_in(dir, PRISM_LOCAL_HINTS_NAME), 16, NULL), PRISM_OK);
    prism_client *c = open_client(dir);
    register4(c);
    static const uint8_t lows[7][4] = {
        {0},
        {PRISM_PRECISION_INT8, 0, 0, 0},
        {0, PRISM_PRECISION_INT8, 0, 0},
        {0, 0, PRISM_PRECISION_INT8, 0},
        {0, 0, 0, PRISM_PRECISION_INT8},
        {PRISM_PRECISION_FP8_E4M3, 0, 0, 0},
        {0, PRISM_PRECISION_FP8_E4M3, 0, 0},
    };
    agent_write_plan(&plans, &hints, 1, lows[1], 4);
    agent_write_map(&hints, 1, 1);
    CU_ASSERT_EQUAL(prism_client_begin_step(c, 1), 1); /* A applied (the trainer line says so) */
    uint64_t applied = 0;
    CU_ASSERT_TRUE(prism_hints_read_applied(&hints, &applied, NULL));
    CU_ASSERT_EQUAL(applied, 1);
    for (uint64_t v = 2; v <= 4; v++) {
        agent_write_plan(&plans, &hints, v, lows[v], 4);
        agent_write_map(&hints, v, 98 + v); /* V at 100, W at 101, X at 102 */
    }
    agent_write_plan(&plans, &hints, 5, lows[5], 4); /* Z's plan, map Z not yet in the table */
    prism_plans_entry e;
    uint8_t out[4];
    for (uint64_t v = 1; v <= 5; v++)
        CU_ASSERT_EQUAL(prism_plans_read(&plans, v, &e, out, 4, 4), PRISM_PLANS_FOUND);
    /* The trainer reaches V's effective step now: V with its plan. */
    CU_ASSERT_EQUAL(prism_client_begin_step(c, 100), 2);
    expect_compute(c, lows[2]);
    prism_client_plan p;
    CU_ASSERT_EQUAL(prism_client_get_plan(c, &p, NULL), PRISM_OK);
    CU_ASSERT_TRUE(p.has_plan);
    CU_ASSERT_EQUAL(p.map_version, 2);
    /* Map Z lands (the hint table drops A, no longer applied); the next plan takes a plan the
     * table no longer holds, the newest maps' stay. */
    agent_write_map(&hints, 5, 103);
    uint64_t held[PRISM_HINTS_SLOTS];
    CU_ASSERT_EQUAL(prism_hints_held_versions(&hints, held), 4);
    agent_write_plan(&plans, &hints, 6, lows[6], 4);
    bool in_table[7] = {false};
    for (unsigned i = 0; i < 4; i++)
        if (held[i] < 7)
            in_table[held[i]] = true;
    for (uint64_t v = 1; v <= 5; v++)
        if (in_table[v])
            CU_ASSERT_EQUAL(prism_plans_read(&plans, v, &e, out, 4, 4), PRISM_PLANS_FOUND);
    CU_ASSERT_EQUAL(prism_plans_read(&plans, 6, &e, out, 4, 4), PRISM_PLANS_FOUND);
    CU_ASSERT_TRUE(in_table[2]); /* V is the map in use: the table kept it */
    unsigned gone = 0;
    for (uint64_t v = 1; v <= 5; v++)
        gone += prism_plans_read(&plans, v, &e, out, 4, 4) == PRISM_PLANS_NONE;
    CU_ASSERT_EQUAL(gone, 1);
    prism_client_close(c);
    prism_hints_close(&hints);
    prism_plans_close(&plans);
}

/* A rolling upgrade: the trainer started beside an agent without plans (no plan file) and is at
 * a map; the new agent creates the plan file with that map's plan. The trainer maps it at its
 * first begin_step after a reconnect interval and takes the plan of the map in use there; a
 * trainer whose interval has not passed makes no attempt. */
static void test_a_plan_file_that_appears_later_is_taken(void)
{
    const char *dir = test_dir();
    prism_hints hints;
    CU_ASSERT_EQUAL_FATAL(prism_hints_create(&hints, path_in(dir, PRISM_LOCAL_HINTS_NAME), 16, NULL), PRISM_OK);
    agent_write_map(&hints, 1, 1);
    prism_client *c = open_client_with(dir, NULL, 20);
    prism_client *slow = open_client_with(dir, NULL, 600000);
    register4(c);
    register4(slow);
    static const uint8_t high[4] = {0, 0, 0, 0};
    static const uint8_t low13[4] = {0, PRISM_PRECISION_INT8, 0, PRISM_PRECISION_INT8};
    CU_ASSERT_EQUAL(prism_client_begin_step(c, 1), 1);
    CU_ASSERT_EQUAL(prism_client_begin_step(slow, 1), 1);
    expect_compute(c, high);
    uint64_t last_attempt = mono_ms(); /* no attempt of c's is later than this */
    CU_ASSERT_EQUAL(prism_client_begin_step(c, 2), 1);
    CU_ASSERT_EQUAL(counters(c).hint_open_failures, 0); /* a missing plan file is normal */

    prism_plans plans;
    CU_ASSERT_EQUAL_FATAL(prism_plans_create(&plans, path_in(dir, PRISM_LOCAL_PLANS_NAME), 16, NULL), PRISM_OK);
    publish_ok(&plans, 1, low13, 4, 0);
    pass_ms(last_attempt, 20);
    CU_ASSERT_EQUAL(prism_client_begin_step(c, 3), 1);
    expect_compute(c, low13);
    prism_client_plan p;
    CU_ASSERT_EQUAL(prism_client_get_plan(c, &p, NULL), PRISM_OK);
    CU_ASSERT_TRUE(p.has_plan);
    CU_ASSERT_EQUAL(p.map_version, 1);
    CU_ASSERT_EQUAL(counters(c).plans_applied, 1);
    /* The other trainer's interval (600 s) has not passed: no attempt, still every block high. */
    for (uint64_t s = 2; s < 50; s++)
        CU_ASSERT_EQUAL(prism_client_begin_step(slow, s), 1);
    expect_compute(slow, high);
    CU_ASSERT_EQUAL(counters(slow).plans_applied, 0);
    prism_client_close(slow);
    prism_client_close(c);
    prism_hints_close(&hints);
    prism_plans_close(&plans);
}

/* The agent withdraws the plan of the map in use (prismd's Welcome repeated the map without one)
 * or rewrites it: the trainer notices the write at its next begin_step (one atomic load) and
 * reads the plan of its map again. */
static void test_a_withdrawn_or_rewritten_plan_of_the_map_in_use_is_read_again(void)
{
    const char *dir = test_dir();
    prism_plans plans;
    prism_hints hints;
    CU_ASSERT_EQUAL_FATAL(prism_plans_create(&plans, path_in(dir, PRISM_LOCAL_PLANS_NAME), 16, NULL), PRISM_OK);
    CU_ASSERT_EQUAL_FATAL(prism_hints_create(&hints, path_in(dir, PRISM_LOCAL_HINTS_NAME), 16, NULL), PRISM_OK);
    prism_client *c = open_client(dir);
    register4(c);
    static const uint8_t high[4] = {0, 0, 0, 0};
    static const uint8_t low12[4] = {0, PRISM_PRECISION_INT8, PRISM_PRECISION_INT8, 0};
    static const uint8_t low0[4] = {PRISM_PRECISION_FP8_E4M3, 0, 0, 0};
    agent_publish(&plans, &hints, 1, 2, low12, 3);
    CU_ASSERT_EQUAL(prism_client_begin_step(c, 2), 1);
    expect_compute(c, low12);
    CU_ASSERT_EQUAL(prism_client_begin_step(c, 3), 1);
    expect_compute(c, low12);

    CU_ASSERT_TRUE(prism_plans_clear(&plans, 1));
    CU_ASSERT_FALSE(prism_plans_clear(&plans, 1)); /* nothing left to clear: no write */
    CU_ASSERT_FALSE(prism_plans_clear(&plans, 0));
    prism_plans_entry e;
    uint8_t out[4];
    CU_ASSERT_EQUAL(prism_plans_read(&plans, 1, &e, out, 4, 4), PRISM_PLANS_NONE);
    CU_ASSERT_EQUAL(prism_client_begin_step(c, 4), 1);
    expect_compute(c, high);
    prism_client_plan p;
    CU_ASSERT_EQUAL(prism_client_get_plan(c, &p, NULL), PRISM_OK);
    CU_ASSERT_FALSE(p.has_plan);
    CU_ASSERT_EQUAL(p.map_version, 1);

    publish_ok(&plans, 1, low0, 1, 0); /* a plan for the held map again */
    CU_ASSERT_EQUAL(prism_client_begin_step(c, 5), 1);
    expect_compute(c, low0);
    CU_ASSERT_EQUAL(counters(c).plans_applied, 2);
    /* Quiet file: nothing read again, nothing counted. */
    uint64_t reads = counters(c).hint_reads;
    CU_ASSERT_EQUAL(prism_client_begin_step(c, 6), 1);
    expect_compute(c, low0);
    CU_ASSERT_EQUAL(counters(c).hint_reads, reads + 1);
    CU_ASSERT_EQUAL(counters(c).plans_applied, 2);
    prism_client_close(c);
    prism_hints_close(&hints);
    prism_plans_close(&plans);
}

/* A plan file that is there but cannot be used (here: another layout version) is counted in
 * hint_open_failures with the reason as the last error; the trainer runs every block high. */
static void test_a_plan_file_of_another_layout_is_counted(void)
{
    const char *dir = test_dir();
    prism_plans plans;
    prism_hints hints;
    CU_ASSERT_EQUAL_FATAL(prism_plans_create(&plans, path_in(dir, PRISM_LOCAL_PLANS_NAME), 16, NULL), PRISM_OK);
    CU_ASSERT_EQUAL_FATAL(prism_hints_create(&hints, path_in(dir, PRISM_LOCAL_HINTS_NAME), 16, NULL), PRISM_OK);
    static const uint8_t low12[4] = {0, PRISM_PRECISION_INT8, PRISM_PRECISION_INT8, 0};
    agent_publish(&plans, &hints, 1, 1, low12, 3);
    plans.h->layout_version = 1; /* a file of the four-slot layout */
    prism_client *c = open_client_with(dir, NULL, 600000);
    CU_ASSERT_EQUAL(counters(c).hint_open_failures, 1);
    const char *why = prism_client_last_error(c);
    CU_ASSERT_PTR_NOT_NULL_FATAL(why);
    CU_ASSERT_PTR_NOT_NULL(strstr(why, "plan file: "));
    CU_ASSERT_PTR_NOT_NULL(strstr(why, "layout_version 1, this build reads 2"));
    register4(c);
    CU_ASSERT_EQUAL(prism_client_begin_step(c, 1), 1);
    static const uint8_t high[4] = {0, 0, 0, 0};
    expect_compute(c, high);
    CU_ASSERT_EQUAL(counters(c).hint_open_failures, 1); /* the next attempt waits its interval */
    prism_client_close(c);
    prism_hints_close(&hints);
    prism_plans_close(&plans);
}

/* The plan file is named after the hint table: a trainer whose table is "other-hints" reads
 * "other-hints.plans", not the default's file beside it. */
static void test_the_plan_file_is_named_after_the_hint_table(void)
{
    CU_ASSERT_STRING_EQUAL(PRISM_LOCAL_PLANS_NAME, "prism-hints.plans");
    const char *dir = test_dir();
    prism_plans mine, other;
    prism_hints hints;
    CU_ASSERT_EQUAL_FATAL(prism_plans_create(&mine, path_in(dir, "other-hints" PRISM_LOCAL_PLANS_SUFFIX), 16, NULL),
                          PRISM_OK);
    CU_ASSERT_EQUAL_FATAL(prism_plans_create(&other, path_in(dir, PRISM_LOCAL_PLANS_NAME), 16, NULL), PRISM_OK);
    CU_ASSERT_EQUAL_FATAL(prism_hints_create(&hints, path_in(dir, "other-hints"), 16, NULL), PRISM_OK);
    static const uint8_t low3[4] = {0, 0, 0, PRISM_PRECISION_INT8};
    static const uint8_t low0[4] = {PRISM_PRECISION_INT8, 0, 0, 0};
    publish_ok(&other, 1, low0, 1, 0);
    agent_publish(&mine, &hints, 1, 1, low3, 4);
    prism_client *c = open_client_with(dir, "other-hints", 600000);
    register4(c);
    CU_ASSERT_EQUAL(prism_client_begin_step(c, 1), 1);
    expect_compute(c, low3);
    prism_client_close(c);
    prism_hints_close(&hints);
    prism_plans_close(&other);
    prism_plans_close(&mine);
}

static const prism_test_case file_cases[] = {
    {"test_offsets_are_pinned", test_offsets_are_pinned},
    {"test_write_read_round_trip", test_write_read_round_trip},
    {"test_slot_reuse_keeps_the_kept_versions", test_slot_reuse_keeps_the_kept_versions},
    {"test_torn_write_is_never_read", test_torn_write_is_never_read},
    {"test_bad_files_and_writes_are_refused", test_bad_files_and_writes_are_refused},
    {NULL, NULL},
};

static const prism_test_case client_cases[] = {
    {"test_hello_carries_the_layout_cost_figures", test_hello_carries_the_layout_cost_figures},
    {"test_stage_tensor_stats_refuses_bad_entries_naming_them", test_stage_tensor_stats_refuses_bad_entries_naming_them},
    {"test_tensor_stats_go_with_the_next_report_written_whole", test_tensor_stats_go_with_the_next_report_written_whole},
    {"test_compute_plan_switches_with_the_map_at_its_effective_step",
     test_compute_plan_switches_with_the_map_at_its_effective_step},
    {"test_register_after_begin_step_reads_the_plan", test_register_after_begin_step_reads_the_plan},
    {"test_without_a_plan_file_every_block_runs_high", test_without_a_plan_file_every_block_runs_high},
    {"test_the_plan_of_a_pending_map_is_never_evicted", test_the_plan_of_a_pending_map_is_never_evicted},
    {"test_a_plan_file_that_appears_later_is_taken", test_a_plan_file_that_appears_later_is_taken},
    {"test_a_withdrawn_or_rewritten_plan_of_the_map_in_use_is_read_again",
     test_a_withdrawn_or_rewritten_plan_of_the_map_in_use_is_read_again},
    {"test_a_plan_file_of_another_layout_is_counted", test_a_plan_file_of_another_layout_is_counted},
    {"test_the_plan_file_is_named_after_the_hint_table", test_the_plan_file_is_named_after_the_hint_table},
    {NULL, NULL},
};

static const prism_test_suite suites[] = {{"plans", file_cases}, {"client_plans", client_cases}, {NULL, NULL}};

int main(int argc, char **argv)
{
    return prism_test_main(argc, argv, suites);
}
