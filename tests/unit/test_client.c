/* libprism's client (include/prism/client.h) against a test that plays the agent: it listens on a
 * real Unix socket and writes a real hint table in a scratch directory, reads the frames the
 * client sends and decodes them with protobuf-c.
 *
 * Pinned: the fingerprint equals a digest computed independently with Python's hashlib over the
 * encoding client.h documents, and changes with every part of the identity; Hello carries the
 * job, rank, world size, fingerprint, blocks and shapes; StepReports carry exactly what
 * prism_grad_stats_blocks_cpu computes; CalibrationReports carry the fingerprint; a client opened
 * before its agent exists drops and counts reports, then connects after the interval with Hello
 * first; an agent that stops reading never blocks the trainer; a closed connection is reconnected
 * with Hello again; begin_step switches exactly at effective_step, keeps its copy when the table
 * is mid-write, finds a table created late, and remaps a replaced one; bad arguments are refused
 * naming the argument. SIGPIPE is left at its default, so a send without MSG_NOSIGNAL would kill
 * the test. */
#define _GNU_SOURCE
#include "testutil.h"

#include "hints.h"
#include "local.h"
#include "prism/client.h"
#include "prism/v1/prism.pb-c.h"
#ifdef PRISM_TEST_CUDA
#define PRISM_CUDA_RUNTIME_API
#include "prism/cuda.h"
#endif
#ifdef PRISM_CUDAEMU
#include "prism_cudaemu.h" /* the emulated device's hold on a stream: a GPU that is behind */
#endif

#include <errno.h>
#include <math.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

/* ---------------------------------------------------------------------------------------------
 * The test layout and its digest.
 *
 * The digest below was computed once with Python's hashlib over the encoding client.h documents:
 *
 *   import hashlib, struct
 *   def enc(model_id, fmt, gran, k, blocks):
 *       b = b"prism.fingerprint.v1"
 *       m = model_id.encode(); b += struct.pack("<Q", len(m)) + m
 *       b += struct.pack("<IIQ", fmt, gran, k) + struct.pack("<I", len(blocks))
 *       for name, shape in blocks:
 *           n = name.encode(); b += struct.pack("<Q", len(n)) + n
 *           b += struct.pack("<Q", len(shape)) + b"".join(struct.pack("<Q", x) for x in shape)
 *       return hashlib.sha256(b).hexdigest()
 *   enc("tiny-llama@r1", 1, 2, 128, [("model.embed", [2, 1000, 64]),
 *       ("model.layers.0", [2, 64, 64, 1, 64]), ("model.layers.1", [2, 64, 64, 1, 64]),
 *       ("lm_head", [])])
 * ------------------------------------------------------------------------------------------- */

#define TEST_FINGERPRINT "d6179a871d4a63b5bc7b6041f4e895dbcdbce8759a167b6f741b37e21ef5a883"

static const uint64_t shape_embed[] = {2, 1000, 64};
static const uint64_t shape_layer[] = {2, 64, 64, 1, 64};

static const prism_block_layout test_blocks[] = {
    {"model.embed", 128000, shape_embed, 3, 0, 0, 0},
    {"model.layers.0", 8320, shape_layer, 5, 0, 0, 0},
    {"model.layers.1", 8320, shape_layer, 5, 0, 0, 0},
    {"lm_head", 0, NULL, 0, 0, 0, 0},
};

static prism_model_layout test_layout(void)
{
    prism_model_layout l = {
        .model_id = "tiny-llama@r1",
        .quant = {.format = PRISM_PRECISION_INT8, .granularity = PRISM_GRANULARITY_BLOCK, .block_size = 0},
        .blocks = test_blocks,
        .n_blocks = 4,
    };
    return l;
}

static void hex(const uint8_t *d, size_t n, char *out)
{
    for (size_t i = 0; i < n; i++)
        snprintf(out + 2 * i, 3, "%02x", d[i]);
}

/* ---------------------------------------------------------------------------------------------
 * The test as the agent. */

/* A fresh directory per test, under the scratch directory. */
static const char *test_dir(void)
{
    static char dir[256];
    static unsigned n;
    snprintf(dir, sizeof dir, "%s/t%u", prism_scratch_dir(), n++);
    CU_ASSERT_EQUAL_FATAL(mkdir(dir, 0700), 0);
    return dir;
}

static const char *path_in(const char *dir, const char *name)
{
    static char path[512];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    return path;
}

static int agent_listen(const char *dir)
{
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    CU_ASSERT_FATAL(fd >= 0);
    struct sockaddr_un a = {.sun_family = AF_UNIX};
    snprintf(a.sun_path, sizeof a.sun_path, "%s/%s", dir, PRISM_LOCAL_SOCKET_NAME);
    unlink(a.sun_path);
    CU_ASSERT_EQUAL_FATAL(bind(fd, (struct sockaddr *)&a, sizeof a), 0);
    CU_ASSERT_EQUAL_FATAL(listen(fd, 4), 0);
    return fd;
}

/* The next connection, or -1 when none comes within timeout_ms. */
static int agent_accept(int lfd, int timeout_ms)
{
    struct pollfd p = {.fd = lfd, .events = POLLIN};
    if (poll(&p, 1, timeout_ms) != 1)
        return -1;
    return accept4(lfd, NULL, NULL, SOCK_CLOEXEC);
}

static bool read_exact(int fd, uint8_t *buf, size_t n, int timeout_ms)
{
    size_t got = 0;
    while (got < n) {
        struct pollfd p = {.fd = fd, .events = POLLIN};
        if (poll(&p, 1, timeout_ms) != 1)
            return false;
        ssize_t r = read(fd, buf + got, n - got);
        if (r <= 0)
            return false;
        got += (size_t)r;
    }
    return true;
}

/* The next frame, decoded; NULL when none arrives within timeout_ms or it does not parse. */
static Prism__V1__AgentMessage *agent_read(int fd, int timeout_ms)
{
    uint8_t hdr[PRISM_LOCAL_FRAME_HEADER];
    if (!read_exact(fd, hdr, sizeof hdr, timeout_ms))
        return NULL;
    uint32_t len = prism_local_get_len(hdr);
    if (len > PRISM_LOCAL_MAX_FRAME)
        return NULL;
    uint8_t *buf = malloc(len ? len : 1);
    CU_ASSERT_PTR_NOT_NULL_FATAL(buf);
    Prism__V1__AgentMessage *m = NULL;
    if (read_exact(fd, buf, len, timeout_ms))
        m = prism__v1__agent_message__unpack(NULL, len, buf);
    free(buf);
    return m;
}

static void agent_free(Prism__V1__AgentMessage *m)
{
    if (m)
        prism__v1__agent_message__free_unpacked(m, NULL);
}

/* Reads the next frame and checks it is a Hello of the test layout. */
static void expect_hello(int fd)
{
    Prism__V1__AgentMessage *m = agent_read(fd, 2000);
    CU_ASSERT_PTR_NOT_NULL_FATAL(m);
    CU_ASSERT_EQUAL(m->kind_case, PRISM__V1__AGENT_MESSAGE__KIND_HELLO);
    if (m->kind_case == PRISM__V1__AGENT_MESSAGE__KIND_HELLO)
        CU_ASSERT_STRING_EQUAL(m->hello->layout->model_id, "tiny-llama@r1");
    agent_free(m);
}

/* Reads the next frame and checks it is the StepReport of `step`. */
static void expect_step(int fd, uint64_t step)
{
    Prism__V1__AgentMessage *m = agent_read(fd, 2000);
    CU_ASSERT_PTR_NOT_NULL_FATAL(m);
    CU_ASSERT_EQUAL(m->kind_case, PRISM__V1__AGENT_MESSAGE__KIND_STEP_REPORT);
    if (m->kind_case == PRISM__V1__AGENT_MESSAGE__KIND_STEP_REPORT)
        CU_ASSERT_EQUAL(m->step_report->step, step);
    agent_free(m);
}

static prism_client *open_client(const char *dir, uint32_t interval_ms)
{
    prism_client_options o = {.dir = dir, .job_id = "job-a", .rank = 1, .world_size = 4,
                              .reconnect_interval_ms = interval_ms};
    prism_client *c = NULL;
    prism_error err;
    prism_status s = prism_client_open(&o, &c, &err);
    if (s != PRISM_OK)
        fprintf(stderr, "open: %s\n", err.message);
    CU_ASSERT_EQUAL_FATAL(s, PRISM_OK);
    return c;
}

static void register_ok(prism_client *c)
{
    prism_model_layout l = test_layout();
    prism_error err;
    prism_status s = prism_client_register(c, &l, &err);
    if (s != PRISM_OK)
        fprintf(stderr, "register: %s\n", err.message);
    CU_ASSERT_EQUAL_FATAL(s, PRISM_OK);
}

static prism_client_counters counters(const prism_client *c)
{
    prism_client_counters n;
    CU_ASSERT_EQUAL_FATAL(prism_client_get_counters(c, &n, NULL), PRISM_OK);
    return n;
}

static prism_client_state state(const prism_client *c)
{
    prism_client_state s;
    CU_ASSERT_EQUAL_FATAL(prism_client_get_state(c, &s, NULL), PRISM_OK);
    return s;
}

static void sleep_ms(unsigned ms)
{
    struct timespec ts = {.tv_sec = ms / 1000, .tv_nsec = (long)(ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
    }
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* A report of the 4 test blocks with simple figures. */
static prism_status report(prism_client *c, uint64_t step, prism_error *err)
{
    static const uint32_t ids[4] = {0, 1, 2, 3};
    prism_grad_stats st[4];
    for (int i = 0; i < 4; i++)
        st[i] = (prism_grad_stats){.l2_norm = i + 1.0, .max_abs = 0.5, .mean = 0.25, .variance = 0.125,
                                   .numel = 1000, .nonfinite = 0};
    return prism_client_report_step(c, step, NULL, ids, st, 4, err);
}

/* ---------------------------------------------------------------------------------------------
 * Fingerprint */

static void test_fingerprint_is_the_documented_sha256(void)
{
    prism_model_layout l = test_layout();
    uint8_t fp[PRISM_FINGERPRINT_BYTES];
    prism_error err;
    CU_ASSERT_EQUAL_FATAL(prism_model_fingerprint(&l, fp, &err), PRISM_OK);
    char got[2 * PRISM_FINGERPRINT_BYTES + 1];
    hex(fp, sizeof fp, got);
    CU_ASSERT_STRING_EQUAL(got, TEST_FINGERPRINT);
    /* BLOCK with K = 128 is the default spelled out: the same model. */
    l.quant.block_size = 128;
    uint8_t same[PRISM_FINGERPRINT_BYTES];
    CU_ASSERT_EQUAL(prism_model_fingerprint(&l, same, &err), PRISM_OK);
    CU_ASSERT_EQUAL(memcmp(fp, same, sizeof fp), 0);
}

static void test_fingerprint_changes_with_every_part_of_the_identity(void)
{
    enum { BASE, MODEL_ID, NAME, DIM, SHAPE_SPLIT, TENSOR_ADDED, FORMAT, GRANULARITY, BLOCK_SIZE, FEWER_BLOCKS,
           SWAPPED, VARIANTS };
    static const uint64_t dim_changed[] = {2, 64, 65, 1, 64};
    static const uint64_t split_changed[] = {1, 64, 2, 64, 64};
    static const uint64_t tensor_added[] = {2, 64, 64, 1, 64, 0};
    uint8_t fp[VARIANTS][PRISM_FINGERPRINT_BYTES];
    for (int v = 0; v < VARIANTS; v++) {
        prism_block_layout blocks[4];
        memcpy(blocks, test_blocks, sizeof blocks);
        prism_model_layout l = test_layout();
        l.blocks = blocks;
        switch (v) {
        case MODEL_ID: l.model_id = "tiny-llama@r2"; break;
        case NAME: blocks[2].name = "model.layers.2"; break;
        case DIM: blocks[1].shape = dim_changed; break;
        case SHAPE_SPLIT: blocks[1].shape = split_changed; break;
        case TENSOR_ADDED: blocks[1].shape = tensor_added, blocks[1].shape_len = 6; break;
        case FORMAT: l.quant.format = PRISM_PRECISION_FP8_E4M3; break;
        case GRANULARITY: l.quant.granularity = PRISM_GRANULARITY_ROW; break;
        case BLOCK_SIZE: l.quant.block_size = 64; break;
        case FEWER_BLOCKS: l.n_blocks = 3; break;
        case SWAPPED: blocks[0] = test_blocks[3], blocks[3] = test_blocks[0]; break;
        }
        prism_error err;
        CU_ASSERT_EQUAL_FATAL(prism_model_fingerprint(&l, fp[v], &err), PRISM_OK);
    }
    for (int a = 0; a < VARIANTS; a++)
        for (int b = a + 1; b < VARIANTS; b++)
            if (memcmp(fp[a], fp[b], PRISM_FINGERPRINT_BYTES) == 0) {
                fprintf(stderr, "variants %d and %d share a fingerprint\n", a, b);
                CU_FAIL("two layouts share a fingerprint");
            }
    /* Not identity: the BF16 byte sizes, and K outside BLOCK granularity. */
    prism_block_layout blocks[4];
    memcpy(blocks, test_blocks, sizeof blocks);
    blocks[0].param_bytes_bf16 = 1;
    prism_model_layout l = test_layout();
    l.blocks = blocks;
    uint8_t same[PRISM_FINGERPRINT_BYTES];
    CU_ASSERT_EQUAL(prism_model_fingerprint(&l, same, NULL), PRISM_OK);
    CU_ASSERT_EQUAL(memcmp(same, fp[BASE], sizeof same), 0);
    l.quant.granularity = PRISM_GRANULARITY_ROW;
    l.quant.block_size = 4096;
    CU_ASSERT_EQUAL(prism_model_fingerprint(&l, same, NULL), PRISM_OK);
    CU_ASSERT_EQUAL(memcmp(same, fp[GRANULARITY], sizeof same), 0);
}

static void test_layout_errors_name_the_field(void)
{
    static const uint64_t rank_too_big[] = {2, 64, 64, 3, 64};
    for (int v = 0; v < 11; v++) {
        prism_block_layout blocks[4];
        memcpy(blocks, test_blocks, sizeof blocks);
        prism_model_layout l = test_layout();
        l.blocks = blocks;
        const char *names = NULL;
        switch (v) {
        case 0: l.model_id = NULL, names = "model_id: NULL"; break;
        case 1: l.model_id = "", names = "model_id: empty"; break;
        case 2: l.quant.format = PRISM_PRECISION_BF16, names = "quant.format: 0"; break;
        case 3: l.quant.granularity = (prism_granularity)7, names = "quant.granularity: 7"; break;
        case 4: l.n_blocks = 0, names = "n_blocks: 0"; break;
        case 5: l.blocks = NULL, names = "blocks: NULL"; break;
        case 6: blocks[1].name = "", names = "blocks[1].name: empty"; break;
        case 7: blocks[2].name = "layer\xc0\xaf", names = "blocks[2].name: not valid UTF-8"; break;
        case 8: blocks[0].shape = NULL, names = "blocks[0].shape: NULL with shape_len 3"; break;
        case 9: blocks[1].shape = rank_too_big, names = "blocks[1].shape: tensor 1 has rank 3"; break;
        case 10: l.n_blocks = PRISM_CLIENT_MAX_BLOCKS + 1, names = "n_blocks: 1048577"; break;
        }
        uint8_t fp[PRISM_FINGERPRINT_BYTES];
        prism_error err = {0};
        CU_ASSERT_EQUAL(prism_model_fingerprint(&l, fp, &err), PRISM_ERR_INVALID);
        if (!strstr(err.message, names))
            fprintf(stderr, "case %d: got \"%s\", want \"%s\"\n", v, err.message, names);
        CU_ASSERT_PTR_NOT_NULL(strstr(err.message, names));
    }
    prism_error err;
    CU_ASSERT_EQUAL(prism_model_fingerprint(NULL, (uint8_t[32]){0}, &err), PRISM_ERR_INVALID);
    CU_ASSERT_STRING_EQUAL(err.message, "layout: NULL");
}

/* ---------------------------------------------------------------------------------------------
 * Options and arguments */

static void test_open_refuses_bad_options_naming_them(void)
{
    char long_dir[200];
    memset(long_dir, 'd', sizeof long_dir - 1);
    long_dir[sizeof long_dir - 1] = '\0';
    unsetenv("PRISM_JOB_ID");
    static const char *const names[] = {"options: NULL", "job_id: not set", "job_id: empty", "rank: 4 is not below world_size 4",
                                        "dir: the socket path", "socket_name: empty", "hints_name: empty",
                                        "job_id: not valid UTF-8"};
    for (int v = 0; v < 8; v++) {
        prism_client_options o = {.dir = "/tmp", .job_id = "j", .rank = 0, .world_size = 4};
        switch (v) {
        case 1: o.job_id = NULL; break;
        case 2: o.job_id = ""; break;
        case 3: o.rank = 4; break;
        case 4: o.dir = long_dir; break;
        case 5: o.socket_name = ""; break;
        case 6: o.hints_name = ""; break;
        case 7: o.job_id = "\xff"; break;
        }
        prism_client *c = (prism_client *)&v;
        prism_error err = {0};
        CU_ASSERT_EQUAL(prism_client_open(v == 0 ? NULL : &o, &c, &err), PRISM_ERR_INVALID);
        CU_ASSERT_PTR_NULL(c);
        if (!strstr(err.message, names[v]))
            fprintf(stderr, "case %d: got \"%s\"\n", v, err.message);
        CU_ASSERT_PTR_NOT_NULL(strstr(err.message, names[v]));
    }
    prism_error err;
    prism_client_options o = {.job_id = "j"};
    CU_ASSERT_EQUAL(prism_client_open(&o, NULL, &err), PRISM_ERR_INVALID);
    CU_ASSERT_STRING_EQUAL(err.message, "out: NULL");

    /* Defaults: $PRISM_AGENT_DIR and $PRISM_JOB_ID, world size 1. */
    const char *dir = test_dir();
    setenv("PRISM_AGENT_DIR", dir, 1);
    setenv("PRISM_JOB_ID", "job-from-env", 1);
    int lfd = agent_listen(dir);
    prism_client_options none = {0};
    prism_client *c = NULL;
    CU_ASSERT_EQUAL_FATAL(prism_client_open(&none, &c, &err), PRISM_OK);
    register_ok(c);
    int fd = agent_accept(lfd, 2000);
    CU_ASSERT_FATAL(fd >= 0);
    Prism__V1__AgentMessage *m = agent_read(fd, 2000);
    CU_ASSERT_PTR_NOT_NULL_FATAL(m);
    CU_ASSERT_STRING_EQUAL(m->hello->job_id, "job-from-env");
    CU_ASSERT_EQUAL(m->hello->rank, 0);
    CU_ASSERT_EQUAL(m->hello->world_size, 1);
    agent_free(m);
    unsetenv("PRISM_AGENT_DIR");
    unsetenv("PRISM_JOB_ID");
    prism_client_close(c);
    close(fd);
    close(lfd);
}

static void test_bad_calls_are_refused_naming_the_argument_and_counted(void)
{
    const char *dir = test_dir();
    prism_client *c = open_client(dir, 1000);
    prism_grad_stats st[2] = {{0}};
    prism_error err;
    const uint32_t ids_out[2] = {0, 9}, ids_dup[2] = {2, 2}, ids_ok[2] = {0, 1};
    const double nan_err[1] = {NAN}, neg_err[1] = {-0.5}, ok_err[1] = {0.1};

    CU_ASSERT_EQUAL(prism_client_report_step(c, 1, NULL, ids_ok, st, 2, &err), PRISM_ERR_STATE);
    CU_ASSERT_PTR_NOT_NULL(strstr(err.message, "no layout registered"));
    CU_ASSERT_EQUAL(prism_client_report_calibration(c, PRISM_PRECISION_INT8, 1, ids_ok, ok_err, 1, &err),
                    PRISM_ERR_STATE);
    uint8_t fp[PRISM_FINGERPRINT_BYTES];
    CU_ASSERT_EQUAL(prism_client_fingerprint(c, fp, &err), PRISM_ERR_STATE);
    register_ok(c);
    prism_model_layout l = test_layout();
    CU_ASSERT_EQUAL(prism_client_register(c, &l, &err), PRISM_ERR_STATE);
    CU_ASSERT_PTR_NOT_NULL(strstr(err.message, "already registered"));

    static const struct {
        int call;
        const char *names;
    } cases[] = {
        {0, "block_ids: NULL with n 2"},
        {1, "stats: NULL with n 2"},
        {2, "block_ids[1]: block 9 is not in the registered layout (4 blocks)"},
        {3, "block_ids[1]: block 2 appears twice"},
        {4, "n: 5 blocks, the registered layout has 4"},
        {5, "format: 0 is not a low precision"},
        {6, "samples: 0"},
        {7, "errors[0]: nan"},
        {8, "errors[0]: -0.5"},
        {9, "errors: NULL with n 1"},
        {10, "block_start: NULL"},
        {11, "blocks: 5 blocks, the registered layout has 4"},
        {12, "client: NULL"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        prism_status s = PRISM_OK;
        size_t starts[6] = {0};
        err.message[0] = '\0';
        switch (cases[i].call) {
        case 0: s = prism_client_report_step(c, 1, NULL, NULL, st, 2, &err); break;
        case 1: s = prism_client_report_step(c, 1, NULL, ids_ok, NULL, 2, &err); break;
        case 2: s = prism_client_report_step(c, 1, NULL, ids_out, st, 2, &err); break;
        case 3: s = prism_client_report_step(c, 1, NULL, ids_dup, st, 2, &err); break;
        case 4: s = prism_client_report_step(c, 1, NULL, ids_ok, st, 5, &err); break;
        case 5: s = prism_client_report_calibration(c, PRISM_PRECISION_BF16, 1, ids_ok, ok_err, 1, &err); break;
        case 6: s = prism_client_report_calibration(c, PRISM_PRECISION_INT8, 0, ids_ok, ok_err, 1, &err); break;
        case 7: s = prism_client_report_calibration(c, PRISM_PRECISION_INT8, 1, ids_ok, nan_err, 1, &err); break;
        case 8: s = prism_client_report_calibration(c, PRISM_PRECISION_INT8, 1, ids_ok, neg_err, 1, &err); break;
        case 9: s = prism_client_report_calibration(c, PRISM_PRECISION_INT8, 1, ids_ok, NULL, 1, &err); break;
        case 10: s = prism_client_report_step_cpu(c, 1, NULL, NULL, NULL, NULL, 1, &err); break;
        case 11: s = prism_client_report_step_cpu(c, 1, NULL, NULL, starts, NULL, 5, &err); break;
        case 12: s = prism_client_report_step(NULL, 1, NULL, ids_ok, st, 2, &err); break;
        }
        CU_ASSERT_EQUAL(s, PRISM_ERR_INVALID);
        if (!strstr(err.message, cases[i].names))
            fprintf(stderr, "case %zu: got \"%s\"\n", i, err.message);
        CU_ASSERT_PTR_NOT_NULL(strstr(err.message, cases[i].names));
    }
    /* Every refusal but the NULL client's was counted; nothing was sent or dropped. */
    prism_client_counters n = counters(c);
    CU_ASSERT_EQUAL(n.invalid_calls, 2 + 1 + 12); /* before register, register again, the table */
    CU_ASSERT_EQUAL(n.reports_dropped, 0);
    CU_ASSERT_EQUAL(n.reports_sent, 0);

    /* Safe on NULL. */
    CU_ASSERT_EQUAL(prism_client_begin_step(NULL, 5), 0);
    CU_ASSERT_EQUAL(prism_client_block_precision(NULL, 0), PRISM_PRECISION_BF16);
    CU_ASSERT_EQUAL(prism_client_map_version(NULL), 0);
    CU_ASSERT_STRING_EQUAL(prism_client_last_error(NULL), "");
    CU_ASSERT_EQUAL(prism_client_get_state(NULL, NULL, &err), PRISM_ERR_INVALID);
    CU_ASSERT_EQUAL(prism_client_get_counters(c, NULL, &err), PRISM_ERR_INVALID);
    CU_ASSERT_STRING_EQUAL(err.message, "out: NULL");
    prism_client_close(NULL);
    prism_client_close(c);
}

/* ---------------------------------------------------------------------------------------------
 * Frames */

static void test_hello_carries_identity_layout_fingerprint_and_shapes(void)
{
    const char *dir = test_dir();
    int lfd = agent_listen(dir);
    prism_client *c = open_client(dir, 1000);
    CU_ASSERT_FALSE(state(c).connected); /* no layout yet: no connection */
    register_ok(c);
    CU_ASSERT_TRUE(state(c).connected);
    CU_ASSERT_TRUE(state(c).registered);
    int fd = agent_accept(lfd, 2000);
    CU_ASSERT_FATAL(fd >= 0);
    Prism__V1__AgentMessage *m = agent_read(fd, 2000);
    CU_ASSERT_PTR_NOT_NULL_FATAL(m);
    CU_ASSERT_EQUAL_FATAL(m->kind_case, PRISM__V1__AGENT_MESSAGE__KIND_HELLO);
    const Prism__V1__Hello *h = m->hello;
    CU_ASSERT_STRING_EQUAL(h->job_id, "job-a");
    CU_ASSERT_EQUAL(h->rank, 1);
    CU_ASSERT_EQUAL(h->world_size, 4);
    CU_ASSERT_STRING_EQUAL(h->node, "");
    CU_ASSERT_STRING_EQUAL(h->token, "");
    CU_ASSERT_PTR_NULL(h->device);
    CU_ASSERT_PTR_NOT_NULL_FATAL(h->layout);
    CU_ASSERT_EQUAL_FATAL(h->layout->fingerprint.len, 32);
    char fp[65];
    hex(h->layout->fingerprint.data, 32, fp);
    CU_ASSERT_STRING_EQUAL(fp, TEST_FINGERPRINT);
    uint8_t mine[32];
    CU_ASSERT_EQUAL(prism_client_fingerprint(c, mine, NULL), PRISM_OK);
    CU_ASSERT_EQUAL(memcmp(mine, h->layout->fingerprint.data, 32), 0);
    CU_ASSERT_STRING_EQUAL(h->layout->model_id, "tiny-llama@r1");
    CU_ASSERT_EQUAL_FATAL(h->layout->n_blocks, 4);
    for (unsigned i = 0; i < 4; i++) {
        const Prism__V1__BlockInfo *b = h->layout->blocks[i];
        CU_ASSERT_EQUAL(b->id, i);
        CU_ASSERT_STRING_EQUAL(b->name, test_blocks[i].name);
        CU_ASSERT_EQUAL(b->param_bytes_bf16, test_blocks[i].param_bytes_bf16);
        CU_ASSERT_EQUAL_FATAL(b->n_shape, test_blocks[i].shape_len);
        for (size_t j = 0; j < b->n_shape; j++)
            CU_ASSERT_EQUAL(b->shape[j], test_blocks[i].shape[j]);
    }
    agent_free(m);
    prism_client_counters n = counters(c);
    CU_ASSERT_EQUAL(n.hellos_sent, 1);
    CU_ASSERT_EQUAL(n.connects, 1);
    CU_ASSERT_EQUAL(n.reconnects, 0);
    CU_ASSERT_EQUAL(n.connect_failures, 0);
    prism_client_close(c);
    /* The client closed: the agent reads end of file, nothing else. */
    uint8_t byte;
    CU_ASSERT_EQUAL(read(fd, &byte, 1), 0);
    close(fd);
    close(lfd);
}

static void test_step_report_carries_the_cpu_kernel_statistics(void)
{
    const char *dir = test_dir();
    int lfd = agent_listen(dir);
    prism_client *c = open_client(dir, 1000);
    register_ok(c);
    int fd = agent_accept(lfd, 2000);
    CU_ASSERT_FATAL(fd >= 0);
    expect_hello(fd);

    /* Block 2: [3, 4] (f32) -> l2 5, max 4, mean 3.5, variance 0.25. Block 0: a bf16 tensor
     * [1, -1, 2, NaN] and an f32 tensor of 5000 elements i % 7 - 3 (two chunks). */
    const float t0[2] = {3.0f, 4.0f};
    const uint16_t t1[4] = {0x3f80, 0xbf80, 0x4000, 0x7fc0};
    static float t2[5000];
    for (int i = 0; i < 5000; i++)
        t2[i] = (float)(i % 7 - 3);
    const prism_tensor tensors[3] = {
        {t0, 2, PRISM_DTYPE_F32}, {t1, 4, PRISM_DTYPE_BF16}, {t2, 5000, PRISM_DTYPE_F32}};
    const size_t starts[3] = {0, 1, 3};
    const uint32_t ids[2] = {2, 0};
    prism_grad_stats want[2];
    CU_ASSERT_EQUAL_FATAL(prism_grad_stats_blocks_cpu(tensors, starts, 2, want, NULL), PRISM_OK);
    CU_ASSERT_EQUAL(want[0].l2_norm, 5.0);
    CU_ASSERT_EQUAL(want[0].max_abs, 4.0);
    CU_ASSERT_EQUAL(want[0].mean, 3.5);
    CU_ASSERT_EQUAL(want[0].variance, 0.25);
    CU_ASSERT_EQUAL(want[1].nonfinite, 1);
    CU_ASSERT_EQUAL(want[1].numel, 5004);

    double loss = 2.75;
    prism_error err;
    CU_ASSERT_EQUAL_FATAL(prism_client_report_step_cpu(c, 41, &loss, tensors, starts, ids, 2, &err), PRISM_OK);
    Prism__V1__AgentMessage *m = agent_read(fd, 2000);
    CU_ASSERT_PTR_NOT_NULL_FATAL(m);
    CU_ASSERT_EQUAL_FATAL(m->kind_case, PRISM__V1__AGENT_MESSAGE__KIND_STEP_REPORT);
    const Prism__V1__StepReport *r = m->step_report;
    CU_ASSERT_EQUAL(r->step, 41);
    CU_ASSERT_EQUAL(r->optional_loss_case, PRISM__V1__STEP_REPORT__OPTIONAL_LOSS_LOSS);
    CU_ASSERT_EQUAL(r->loss, 2.75);
    CU_ASSERT_EQUAL_FATAL(r->n_blocks, 2);
    for (int i = 0; i < 2; i++) {
        const Prism__V1__BlockGradStats *g = r->blocks[i];
        CU_ASSERT_EQUAL(g->block_id, ids[i]);
        CU_ASSERT_EQUAL(g->l2_norm, want[i].l2_norm);
        CU_ASSERT_EQUAL(g->max_abs, want[i].max_abs);
        CU_ASSERT_EQUAL(g->mean, want[i].mean);
        CU_ASSERT_EQUAL(g->variance, want[i].variance);
        CU_ASSERT_EQUAL(g->numel, want[i].numel);
        CU_ASSERT_EQUAL(g->nonfinite, want[i].nonfinite);
    }
    agent_free(m);

    /* Block ids default to 0..blocks-1; no loss means absent, not zero; n = 0 is a report too. */
    CU_ASSERT_EQUAL_FATAL(prism_client_report_step_cpu(c, 42, NULL, tensors, starts, NULL, 2, &err), PRISM_OK);
    m = agent_read(fd, 2000);
    CU_ASSERT_PTR_NOT_NULL_FATAL(m);
    CU_ASSERT_EQUAL(m->step_report->optional_loss_case, PRISM__V1__STEP_REPORT__OPTIONAL_LOSS__NOT_SET);
    CU_ASSERT_EQUAL_FATAL(m->step_report->n_blocks, 2);
    CU_ASSERT_EQUAL(m->step_report->blocks[0]->block_id, 0);
    CU_ASSERT_EQUAL(m->step_report->blocks[1]->block_id, 1);
    CU_ASSERT_EQUAL(m->step_report->blocks[1]->numel, 5004);
    agent_free(m);
    double nan_loss = NAN;
    CU_ASSERT_EQUAL_FATAL(prism_client_report_step(c, 43, &nan_loss, NULL, NULL, 0, &err), PRISM_OK);
    m = agent_read(fd, 2000);
    CU_ASSERT_PTR_NOT_NULL_FATAL(m);
    CU_ASSERT_EQUAL(m->step_report->step, 43);
    CU_ASSERT_EQUAL(m->step_report->n_blocks, 0);
    CU_ASSERT_TRUE(isnan(m->step_report->loss));
    agent_free(m);

    /* A kernel refusal is returned and counted as a dropped report. */
    const prism_tensor bad[1] = {{NULL, 4, PRISM_DTYPE_F32}};
    const size_t bad_starts[2] = {0, 1};
    CU_ASSERT_EQUAL(prism_client_report_step_cpu(c, 44, NULL, bad, bad_starts, NULL, 1, &err), PRISM_ERR_INVALID);
    prism_client_counters n = counters(c);
    CU_ASSERT_EQUAL(n.reports_sent, 3);
    CU_ASSERT_EQUAL(n.reports_dropped, 1);
    CU_ASSERT_EQUAL(n.invalid_calls, 1);
    CU_ASSERT_EQUAL(n.send_errors, 0);
    prism_client_close(c);
    close(fd);
    close(lfd);
}

#ifdef PRISM_TEST_CUDA
/* prism_client_report_step_cuda: the statistics of device tensors, reported at a later client
 * call once the GPU is done, equal to the CPU's within the tolerance cuda.h gives (exact for
 * numel, nonfinite and max_abs). Runs where there is a GPU; says so and passes where not. */
static void test_step_report_from_cuda_tensors_goes_out_at_a_later_call(void)
{
    int devices = 0;
    if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
        cudaGetLastError();
        printf("(no CUDA device: this case checks nothing here) ");
        return;
    }
    const char *dir = test_dir();
    int lfd = agent_listen(dir);
    prism_client *c = open_client(dir, 1000);
    register_ok(c);
    int fd = agent_accept(lfd, 2000);
    CU_ASSERT_FATAL(fd >= 0);
    expect_hello(fd);

    enum { N = 300000 };
    static float host[N];
    for (int i = 0; i < N; i++)
        host[i] = (float)((i * 37) % 1001 - 500) / 64.0f;
    host[123] = NAN;
    float *dev = NULL;
    CU_ASSERT_EQUAL_FATAL(cudaMalloc((void **)&dev, sizeof host), cudaSuccess);
    CU_ASSERT_EQUAL_FATAL(cudaMemcpy(dev, host, sizeof host, cudaMemcpyHostToDevice), cudaSuccess);
    const prism_tensor dt[2] = {{dev, 1000, PRISM_DTYPE_F32}, {dev + 1000, N - 1000, PRISM_DTYPE_F32}};
    const prism_tensor ht[2] = {{host, 1000, PRISM_DTYPE_F32}, {host + 1000, N - 1000, PRISM_DTYPE_F32}};
    const size_t starts[3] = {0, 1, 2};
    const uint32_t ids[2] = {3, 1};
    prism_grad_stats want[2];
    CU_ASSERT_EQUAL_FATAL(prism_grad_stats_blocks_cpu(ht, starts, 2, want, NULL), PRISM_OK);
    cudaStream_t stream;
    CU_ASSERT_EQUAL_FATAL(cudaStreamCreate(&stream), cudaSuccess);
    prism_error err;
    double loss = 1.5;
    CU_ASSERT_EQUAL_FATAL(prism_client_report_step_cuda(c, 7, &loss, dt, starts, ids, 2, stream, &err), PRISM_OK);
    CU_ASSERT_EQUAL_FATAL(cudaStreamSynchronize(stream), cudaSuccess);
    CU_ASSERT_EQUAL(counters(c).reports_sent, 0); /* nothing went out inside the call */
    prism_client_begin_step(c, 8);                 /* the stream is done: this call sends it */
    Prism__V1__AgentMessage *m = agent_read(fd, 2000);
    CU_ASSERT_PTR_NOT_NULL_FATAL(m);
    const Prism__V1__StepReport *r = m->step_report;
    CU_ASSERT_EQUAL(r->step, 7);
    CU_ASSERT_EQUAL(r->loss, 1.5);
    CU_ASSERT_EQUAL_FATAL(r->n_blocks, 2);
    for (int i = 0; i < 2; i++) {
        const Prism__V1__BlockGradStats *g = r->blocks[i];
        CU_ASSERT_EQUAL(g->block_id, ids[i]);
        CU_ASSERT_EQUAL(g->numel, want[i].numel);
        CU_ASSERT_EQUAL(g->nonfinite, want[i].nonfinite);
        CU_ASSERT_EQUAL(g->max_abs, want[i].max_abs);
        CU_ASSERT_DOUBLE_EQUAL(g->l2_norm, want[i].l2_norm, 1e-9 * want[i].l2_norm);
        CU_ASSERT_DOUBLE_EQUAL(g->mean, want[i].mean, 1e-9 * fabs(want[i].mean) + 1e-12);
        CU_ASSERT_DOUBLE_EQUAL(g->variance, want[i].variance, 1e-9 * want[i].variance);
    }
    agent_free(m);
    CU_ASSERT_EQUAL(counters(c).reports_sent, 1);
    CU_ASSERT_EQUAL(counters(c).reports_dropped, 0);
    cudaStreamDestroy(stream);
    cudaFree(dev);
    prism_client_close(c);
    close(fd);
    close(lfd);
}

/* prism_client_report_step_cuda_ex: the fractions are checked at the call (one out of [0, 1] is
 * refused, nothing queued) and copied (the caller's array overwritten after the call changes
 * nothing); they go out with the report: block 3's pair, block 1 none (NaN). */
static void test_step_report_from_cuda_tensors_carries_fractions(void)
{
    int devices = 0;
    if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
        cudaGetLastError();
        printf("(no CUDA device: this case checks nothing here) ");
        return;
    }
    const char *dir = test_dir();
    int lfd = agent_listen(dir);
    prism_client *c = open_client(dir, 1000);
    register_ok(c);
    int fd = agent_accept(lfd, 2000);
    CU_ASSERT_FATAL(fd >= 0);
    expect_hello(fd);
    static float host[2000];
    for (int i = 0; i < 2000; i++)
        host[i] = (float)(i % 13) - 6.0f;
    float *dev = NULL;
    CU_ASSERT_EQUAL_FATAL(cudaMalloc((void **)&dev, sizeof host), cudaSuccess);
    CU_ASSERT_EQUAL_FATAL(cudaMemcpy(dev, host, sizeof host, cudaMemcpyHostToDevice), cudaSuccess);
    const prism_tensor dt[2] = {{dev, 1000, PRISM_DTYPE_F32}, {dev + 1000, 1000, PRISM_DTYPE_F32}};
    const size_t starts[3] = {0, 1, 2};
    const uint32_t ids[2] = {3, 1};
    cudaStream_t stream;
    CU_ASSERT_EQUAL_FATAL(cudaStreamCreate(&stream), cudaSuccess);
    prism_error err;
    prism_block_fractions frac[2] = {{0.25, 1.5}, {NAN, NAN}};
    CU_ASSERT_EQUAL(prism_client_report_step_cuda_ex(c, 6, NULL, dt, starts, ids, frac, 2, stream, &err),
                    PRISM_ERR_INVALID);
    CU_ASSERT_STRING_EQUAL(err.message, "fractions[0].underflowed (block 3): 1.5 is not a fraction in [0, 1]");
    CU_ASSERT_EQUAL(counters(c).invalid_calls, 1);
    frac[0].underflowed = 0.5;
    CU_ASSERT_EQUAL_FATAL(prism_client_report_step_cuda_ex(c, 7, NULL, dt, starts, ids, frac, 2, stream, &err),
                          PRISM_OK);
    frac[0].saturated = frac[0].underflowed = 0.0; /* copied at the call: this changes nothing */
    CU_ASSERT_EQUAL_FATAL(cudaStreamSynchronize(stream), cudaSuccess);
    prism_client_begin_step(c, 8);
    Prism__V1__AgentMessage *m = agent_read(fd, 2000);
    CU_ASSERT_PTR_NOT_NULL_FATAL(m);
    const Prism__V1__StepReport *r = m->step_report;
    CU_ASSERT_PTR_NOT_NULL_FATAL(r);
    CU_ASSERT_EQUAL(r->step, 7);
    CU_ASSERT_EQUAL_FATAL(r->n_blocks, 2);
    CU_ASSERT_EQUAL(r->blocks[0]->block_id, 3);
    CU_ASSERT_EQUAL(r->blocks[0]->optional_saturated_fraction_case,
                    PRISM__V1__BLOCK_GRAD_STATS__OPTIONAL_SATURATED_FRACTION_SATURATED_FRACTION);
    CU_ASSERT_EQUAL(r->blocks[0]->saturated_fraction, 0.25);
    CU_ASSERT_EQUAL(r->blocks[0]->optional_underflowed_fraction_case,
                    PRISM__V1__BLOCK_GRAD_STATS__OPTIONAL_UNDERFLOWED_FRACTION_UNDERFLOWED_FRACTION);
    CU_ASSERT_EQUAL(r->blocks[0]->underflowed_fraction, 0.5);
    CU_ASSERT_EQUAL(r->blocks[1]->block_id, 1);
    CU_ASSERT_EQUAL(r->blocks[1]->optional_saturated_fraction_case,
                    PRISM__V1__BLOCK_GRAD_STATS__OPTIONAL_SATURATED_FRACTION__NOT_SET);
    CU_ASSERT_EQUAL(r->blocks[1]->optional_underflowed_fraction_case,
                    PRISM__V1__BLOCK_GRAD_STATS__OPTIONAL_UNDERFLOWED_FRACTION__NOT_SET);
    agent_free(m);
    CU_ASSERT_EQUAL(counters(c).reports_sent, 1);
    CU_ASSERT_EQUAL(counters(c).reports_dropped, 0);
    CU_ASSERT_EQUAL(counters(c).invalid_calls, 1);
    cudaStreamDestroy(stream);
    cudaFree(dev);
    prism_client_close(c);
    close(fd);
    close(lfd);
}

#ifdef PRISM_CUDAEMU
/* The paths real GPUs take only by chance: a report whose statistics the GPU has not finished is
 * not sent by a later call (cudaEventQuery says not ready), a second report meanwhile is dropped
 * and counted (reason stats_pending in the hint table's trainer line), and once the GPU gets
 * there the first one goes out, whole; a statistics pass the kernels refuse drops its report as
 * stats_failed. The emulated device's stream hold is the slow GPU. */
static void test_step_report_waits_for_a_gpu_that_is_behind(void)
{
    const char *dir = test_dir();
    prism_hints table;
    prism_error terr;
    CU_ASSERT_EQUAL_FATAL(prism_hints_create(&table, path_in(dir, PRISM_LOCAL_HINTS_NAME), 16, &terr), PRISM_OK);
    int lfd = agent_listen(dir);
    prism_client *c = open_client(dir, 1000);
    register_ok(c);
    int fd = agent_accept(lfd, 2000);
    CU_ASSERT_FATAL(fd >= 0);
    expect_hello(fd);

    enum { N = 5000 };
    static float host[N];
    for (int i = 0; i < N; i++)
        host[i] = (float)(i % 17) - 8.0f;
    float *dev = NULL;
    CU_ASSERT_EQUAL_FATAL(cudaMalloc((void **)&dev, sizeof host), cudaSuccess);
    CU_ASSERT_EQUAL_FATAL(cudaMemcpy(dev, host, sizeof host, cudaMemcpyHostToDevice), cudaSuccess);
    const prism_tensor dt[1] = {{dev, N, PRISM_DTYPE_F32}};
    const prism_tensor ht[1] = {{host, N, PRISM_DTYPE_F32}};
    const size_t starts[2] = {0, 1};
    prism_grad_stats want[1];
    CU_ASSERT_EQUAL_FATAL(prism_grad_stats_blocks_cpu(ht, starts, 1, want, NULL), PRISM_OK);
    cudaStream_t stream;
    CU_ASSERT_EQUAL_FATAL(cudaStreamCreate(&stream), cudaSuccess);
    CU_ASSERT_EQUAL_FATAL(prism_cudaemu_stream_hold(stream), cudaSuccess);
    prism_error err;
    CU_ASSERT_EQUAL_FATAL(prism_client_report_step_cuda(c, 7, NULL, dt, starts, NULL, 1, stream, &err), PRISM_OK);
    prism_client_begin_step(c, 8); /* the GPU is behind: nothing to send yet */
    CU_ASSERT_EQUAL(counters(c).reports_sent, 0);
    CU_ASSERT_EQUAL(prism_client_report_step_cuda(c, 8, NULL, dt, starts, NULL, 1, stream, &err),
                    PRISM_ERR_UNAVAILABLE);
    CU_ASSERT_STRING_EQUAL(err.message, "step 8 dropped: the GPU has not finished the statistics of step 7");
    CU_ASSERT_EQUAL(counters(c).reports_dropped, 1);
    CU_ASSERT_EQUAL(prism_cudaemu_stream_release(stream), cudaSuccess);
    CU_ASSERT_EQUAL_FATAL(cudaStreamSynchronize(stream), cudaSuccess);
    prism_client_begin_step(c, 9); /* now it goes out */
    Prism__V1__AgentMessage *m = agent_read(fd, 2000);
    CU_ASSERT_PTR_NOT_NULL_FATAL(m);
    CU_ASSERT_PTR_NOT_NULL_FATAL(m->step_report);
    CU_ASSERT_EQUAL(m->step_report->step, 7);
    CU_ASSERT_EQUAL_FATAL(m->step_report->n_blocks, 1);
    CU_ASSERT_EQUAL(m->step_report->blocks[0]->numel, want[0].numel);
    CU_ASSERT_EQUAL(m->step_report->blocks[0]->max_abs, want[0].max_abs);
    CU_ASSERT_DOUBLE_EQUAL(m->step_report->blocks[0]->l2_norm, want[0].l2_norm, 1e-9 * want[0].l2_norm);
    agent_free(m);
    CU_ASSERT_EQUAL(counters(c).reports_sent, 1);
    CU_ASSERT_EQUAL(counters(c).reports_dropped, 1);
    const size_t bad_starts[2] = {1, 1}; /* refused by the kernels: block_start[0] is not 0 */
    CU_ASSERT_EQUAL(prism_client_report_step_cuda(c, 10, NULL, dt, bad_starts, NULL, 1, stream, &err),
                    PRISM_ERR_INVALID);
    CU_ASSERT_EQUAL(counters(c).reports_dropped, 2);
    prism_client_begin_step(c, 10); /* publishes the trainer line */
    prism_hints_trainer line;
    CU_ASSERT_TRUE_FATAL(prism_hints_read_trainer(&table, &line));
    CU_ASSERT_EQUAL(line.reports_dropped, 2);
    for (unsigned r = 0; r < PRISM_HINTS_DROP_REASONS; r++)
        CU_ASSERT_EQUAL(line.ext.dropped[r],
                        r == PRISM_HINTS_DROP_STATS_PENDING || r == PRISM_HINTS_DROP_STATS_FAILED ? 1u : 0u);
    prism_hints_close(&table);
    cudaStreamDestroy(stream);
    cudaFree(dev);
    prism_client_close(c);
    close(fd);
    close(lfd);
}

/* Failures that a GPU or the allocator give only by chance, made certain by the link: the emulated
 * build links this test with --wrap=calloc,--wrap=cudaGetDevice (tests/client.cmake), so each
 * call of those from the test and libprism's static code comes here first. Armed (on this
 * thread), the next call fails once; otherwise it is the real one. */
static _Thread_local bool fail_next_calloc, fail_next_get_device;
void *__real_calloc(size_t n, size_t size);
void *__wrap_calloc(size_t n, size_t size);
cudaError_t __real_cudaGetDevice(int *device);
cudaError_t __wrap_cudaGetDevice(int *device);

void *__wrap_calloc(size_t n, size_t size)
{
    if (fail_next_calloc) {
        fail_next_calloc = false;
        errno = ENOMEM;
        return NULL;
    }
    return __real_calloc(n, size);
}

cudaError_t __wrap_cudaGetDevice(int *device)
{
    if (fail_next_get_device) {
        fail_next_get_device = false;
        return cudaErrorNoDevice;
    }
    return __real_cudaGetDevice(device);
}

/* A first GPU report with no memory for the client's state drops as no_memory, and one whose
 * current device cannot be known (cudaGetDevice fails) as stats_failed, also for a caller that
 * passes no prism_error: each counted, in the client's counters and by reason in the hint table's
 * trainer line, and the next report goes out whole. */
static void test_step_report_cuda_counts_no_memory_and_an_unknown_device(void)
{
    const char *dir = test_dir();
    prism_hints table;
    prism_error terr;
    CU_ASSERT_EQUAL_FATAL(prism_hints_create(&table, path_in(dir, PRISM_LOCAL_HINTS_NAME), 16, &terr), PRISM_OK);
    int lfd = agent_listen(dir);
    prism_client *c = open_client(dir, 1000);
    register_ok(c);
    int fd = agent_accept(lfd, 2000);
    CU_ASSERT_FATAL(fd >= 0);
    expect_hello(fd);

    enum { N = 64 };
    static float host[N];
    for (int i = 0; i < N; i++)
        host[i] = (float)(i % 5) - 2.0f;
    float *dev = NULL;
    CU_ASSERT_EQUAL_FATAL(cudaMalloc((void **)&dev, sizeof host), cudaSuccess);
    CU_ASSERT_EQUAL_FATAL(cudaMemcpy(dev, host, sizeof host, cudaMemcpyHostToDevice), cudaSuccess);
    const prism_tensor dt[1] = {{dev, N, PRISM_DTYPE_F32}};
    const size_t starts[2] = {0, 1};
    cudaStream_t stream;
    CU_ASSERT_EQUAL_FATAL(cudaStreamCreate(&stream), cudaSuccess);
    prism_error err;

    fail_next_calloc = true; /* the client's first GPU report allocates its state first */
    CU_ASSERT_EQUAL(prism_client_report_step_cuda(c, 7, NULL, dt, starts, NULL, 1, stream, &err), PRISM_ERR_NOMEM);
    CU_ASSERT_FALSE(fail_next_calloc); /* the failure armed was the one the call met */
    CU_ASSERT_STRING_EQUAL(err.message, "step 7 dropped: out of memory for the GPU reports' state");
    CU_ASSERT_EQUAL(counters(c).reports_dropped, 1);

    fail_next_get_device = true;
    CU_ASSERT_EQUAL(prism_client_report_step_cuda(c, 8, NULL, dt, starts, NULL, 1, stream, &err),
                    PRISM_ERR_UNAVAILABLE);
    CU_ASSERT_FALSE(fail_next_get_device);
    CU_ASSERT_PTR_NOT_NULL(strstr(err.message, "cudaGetDevice(&device)"));
    CU_ASSERT_PTR_NOT_NULL(strstr(err.message, "(cudaErrorNoDevice)"));
    CU_ASSERT_EQUAL(counters(c).reports_dropped, 2);
    fail_next_get_device = true; /* the same with no prism_error to fill: still counted */
    CU_ASSERT_EQUAL(prism_client_report_step_cuda(c, 8, NULL, dt, starts, NULL, 1, stream, NULL),
                    PRISM_ERR_UNAVAILABLE);
    CU_ASSERT_FALSE(fail_next_get_device);
    CU_ASSERT_EQUAL(counters(c).reports_dropped, 3);
    CU_ASSERT_PTR_NOT_NULL(strstr(prism_client_last_error(c), "(cudaErrorNoDevice)"));

    CU_ASSERT_EQUAL_FATAL(prism_client_report_step_cuda(c, 9, NULL, dt, starts, NULL, 1, stream, &err), PRISM_OK);
    CU_ASSERT_EQUAL_FATAL(cudaStreamSynchronize(stream), cudaSuccess);
    prism_client_begin_step(c, 10); /* sends step 9 and publishes the trainer line */
    Prism__V1__AgentMessage *m = agent_read(fd, 2000);
    CU_ASSERT_PTR_NOT_NULL_FATAL(m);
    CU_ASSERT_PTR_NOT_NULL_FATAL(m->step_report);
    CU_ASSERT_EQUAL(m->step_report->step, 9);
    CU_ASSERT_EQUAL(m->step_report->n_blocks, 1);
    agent_free(m);
    prism_client_counters n = counters(c);
    CU_ASSERT_EQUAL(n.reports_sent, 1);
    CU_ASSERT_EQUAL(n.reports_dropped, 3);
    prism_hints_trainer line;
    CU_ASSERT_TRUE_FATAL(prism_hints_read_trainer(&table, &line));
    CU_ASSERT_EQUAL(line.reports_dropped, 3);
    for (unsigned r = 0; r < PRISM_HINTS_DROP_REASONS; r++)
        CU_ASSERT_EQUAL(line.ext.dropped[r], r == PRISM_HINTS_DROP_NO_MEMORY      ? 1u
                                             : r == PRISM_HINTS_DROP_STATS_FAILED ? 2u
                                                                                  : 0u);
    prism_hints_close(&table);
    cudaStreamDestroy(stream);
    cudaFree(dev);
    prism_client_close(c);
    close(fd);
    close(lfd);
}
#endif
#endif

static void test_calibration_report_carries_the_registered_fingerprint(void)
{
    const char *dir = test_dir();
    int lfd = agent_listen(dir);
    prism_client *c = open_client(dir, 1000);
    register_ok(c);
    int fd = agent_accept(lfd, 2000);
    CU_ASSERT_FATAL(fd >= 0);
    expect_hello(fd);
    const uint32_t ids[3] = {3, 0, 1};
    const double errors[3] = {0.0125, 0.5, INFINITY};
    prism_error err;
    CU_ASSERT_EQUAL_FATAL(
        prism_client_report_calibration(c, PRISM_PRECISION_FP8_E4M3, 4, ids, errors, 3, &err), PRISM_OK);
    Prism__V1__AgentMessage *m = agent_read(fd, 2000);
    CU_ASSERT_PTR_NOT_NULL_FATAL(m);
    CU_ASSERT_EQUAL_FATAL(m->kind_case, PRISM__V1__AGENT_MESSAGE__KIND_CALIBRATION);
    const Prism__V1__CalibrationReport *r = m->calibration;
    char fp[65];
    CU_ASSERT_EQUAL_FATAL(r->fingerprint.len, 32);
    hex(r->fingerprint.data, 32, fp);
    CU_ASSERT_STRING_EQUAL(fp, TEST_FINGERPRINT);
    CU_ASSERT_EQUAL(r->format, PRISM__V1__PRECISION__FP8_E4M3);
    CU_ASSERT_EQUAL(r->samples, 4);
    CU_ASSERT_EQUAL_FATAL(r->n_errors, 3);
    for (int i = 0; i < 3; i++) {
        CU_ASSERT_EQUAL(r->errors[i]->block_id, ids[i]);
        CU_ASSERT_EQUAL(r->errors[i]->relative_error, errors[i]);
    }
    agent_free(m);
    prism_client_counters n = counters(c);
    CU_ASSERT_EQUAL(n.calibrations_sent, 1);
    CU_ASSERT_EQUAL(n.calibrations_dropped, 0);
    prism_client_close(c);
    close(fd);
    close(lfd);
}

/* ---------------------------------------------------------------------------------------------
 * The agent's absence and failures */

static void test_agent_started_late_gets_hello_then_reports(void)
{
    const char *dir = test_dir();
    const unsigned interval = 400;
    prism_client *c = open_client(dir, interval);
    double t0 = now_s();
    register_ok(c); /* no agent: still registered */
    prism_client_state s = state(c);
    CU_ASSERT_TRUE(s.registered);
    CU_ASSERT_FALSE(s.connected);
    CU_ASSERT_FALSE(s.hints_mapped);
    CU_ASSERT_PTR_NOT_NULL(strstr(prism_client_last_error(c), "prism-agent.sock"));
    prism_error err;
    CU_ASSERT_EQUAL(report(c, 1, &err), PRISM_ERR_UNAVAILABLE);
    CU_ASSERT_PTR_NOT_NULL(strstr(err.message, "step 1 dropped: no connection to the agent"));
    int lfd = agent_listen(dir);
    /* Within the interval no new attempt is made, even though the agent is there now. */
    CU_ASSERT_EQUAL(report(c, 2, &err), PRISM_ERR_UNAVAILABLE);
    CU_ASSERT_TRUE_FATAL(now_s() - t0 < interval / 1000.0); /* the test itself was not too slow */
    prism_client_counters n = counters(c);
    CU_ASSERT_EQUAL(n.connect_failures, 1);
    CU_ASSERT_EQUAL(n.reports_dropped, 2);
    CU_ASSERT_EQUAL(n.connects, 0);
    CU_ASSERT_EQUAL(agent_accept(lfd, 0), -1);

    sleep_ms(interval + 50);
    CU_ASSERT_EQUAL(report(c, 3, &err), PRISM_OK);
    int fd = agent_accept(lfd, 2000);
    CU_ASSERT_FATAL(fd >= 0);
    expect_hello(fd);
    expect_step(fd, 3);
    n = counters(c);
    CU_ASSERT_EQUAL(n.connects, 1);
    CU_ASSERT_EQUAL(n.reconnects, 0);
    CU_ASSERT_EQUAL(n.hellos_sent, 1);
    CU_ASSERT_EQUAL(n.reports_sent, 1);
    CU_ASSERT_EQUAL(n.reports_dropped, 2);
    CU_ASSERT_TRUE(state(c).connected);
    prism_client_close(c);
    close(fd);
    close(lfd);
}

static void test_agent_closing_the_connection_gets_a_reconnect_and_hello(void)
{
    const char *dir = test_dir();
    const unsigned interval = 200;
    int lfd = agent_listen(dir);
    prism_client *c = open_client(dir, interval);
    register_ok(c);
    int fd = agent_accept(lfd, 2000);
    CU_ASSERT_FATAL(fd >= 0);
    expect_hello(fd);
    prism_error err;
    CU_ASSERT_EQUAL(report(c, 1, &err), PRISM_OK);
    expect_step(fd, 1);
    close(fd); /* the agent goes away */

    CU_ASSERT_EQUAL(report(c, 2, &err), PRISM_ERR_UNAVAILABLE); /* EPIPE, not SIGPIPE */
    CU_ASSERT_PTR_NOT_NULL(strstr(err.message, "step 2 dropped"));
    CU_ASSERT_FALSE(state(c).connected);
    CU_ASSERT_EQUAL(report(c, 3, &err), PRISM_ERR_UNAVAILABLE); /* no attempt within the interval */
    prism_client_counters n = counters(c);
    CU_ASSERT_EQUAL(n.send_errors, 1);
    CU_ASSERT_EQUAL(n.disconnects, 1);
    CU_ASSERT_EQUAL(n.reports_dropped, 2);
    CU_ASSERT_EQUAL(n.connects, 1);
    CU_ASSERT_EQUAL(n.connect_failures, 0);

    sleep_ms(interval + 50);
    CU_ASSERT_EQUAL(report(c, 4, &err), PRISM_OK);
    fd = agent_accept(lfd, 2000);
    CU_ASSERT_FATAL(fd >= 0);
    expect_hello(fd); /* Hello again, before anything else */
    expect_step(fd, 4);
    n = counters(c);
    CU_ASSERT_EQUAL(n.connects, 2);
    CU_ASSERT_EQUAL(n.reconnects, 1);
    CU_ASSERT_EQUAL(n.hellos_sent, 2);
    CU_ASSERT_EQUAL(n.reports_sent, 2);
    prism_client_close(c);
    close(fd);
    close(lfd);
}

/* The agent accepts but never reads: 100,000 reports finish quickly, the socket fills, later
 * reports are dropped; what did go out is whole frames in order. */
static void test_agent_that_stops_reading_never_blocks_the_trainer(void)
{
    const char *dir = test_dir();
    int lfd = agent_listen(dir);
    prism_client *c = open_client(dir, 1000);
    register_ok(c);
    int fd = agent_accept(lfd, 2000);
    CU_ASSERT_FATAL(fd >= 0);
    const unsigned total = 100000;
    double t0 = now_s();
    unsigned ok = 0, unavailable = 0;
    for (unsigned step = 1; step <= total; step++) {
        prism_status s = report(c, step, NULL);
        ok += s == PRISM_OK;
        unavailable += s == PRISM_ERR_UNAVAILABLE;
    }
    double took = now_s() - t0;
    prism_client_counters n = counters(c);
    printf("\n    %u reports in %.3f s: %llu sent whole, %llu dropped\n", total, took,
           (unsigned long long)n.reports_sent, (unsigned long long)n.reports_dropped);
    CU_ASSERT_TRUE(took < 20.0);
    CU_ASSERT_EQUAL(ok + unavailable, total);
    CU_ASSERT_TRUE(n.reports_dropped > 0);
    CU_ASSERT_TRUE(n.reports_sent > 0);
    CU_ASSERT_EQUAL(n.reports_dropped, unavailable);
    /* Each accepted report is sent whole, or is the one frame still in flight. */
    CU_ASSERT_TRUE(n.reports_sent == ok || n.reports_sent + 1 == ok);
    CU_ASSERT_EQUAL(n.send_errors, 0);

    /* The agent catches up: every frame parses, Hello first, then steps in increasing order. */
    expect_hello(fd);
    uint64_t last = 0, received = 0;
    while (received < n.reports_sent) { /* not the frame in flight, if any: it is not whole yet */
        Prism__V1__AgentMessage *m = agent_read(fd, 2000);
        CU_ASSERT_PTR_NOT_NULL_FATAL(m);
        CU_ASSERT_EQUAL(m->kind_case, PRISM__V1__AGENT_MESSAGE__KIND_STEP_REPORT);
        CU_ASSERT_TRUE(m->step_report->step > last);
        last = m->step_report->step;
        received++;
        agent_free(m);
    }
    /* The next report finishes the one in flight, if any, and goes out itself. */
    CU_ASSERT_EQUAL(report(c, total + 1, NULL), PRISM_OK);
    n = counters(c);
    CU_ASSERT_EQUAL(n.reports_sent, ok + 1);
    while (received < n.reports_sent) {
        Prism__V1__AgentMessage *m = agent_read(fd, 2000);
        CU_ASSERT_PTR_NOT_NULL_FATAL(m);
        CU_ASSERT_TRUE(m->step_report->step > last);
        last = m->step_report->step;
        received++;
        agent_free(m);
    }
    CU_ASSERT_EQUAL(last, total + 1);
    prism_client_close(c);
    close(fd);
    close(lfd);
}

/* ---------------------------------------------------------------------------------------------
 * The map */

static void test_begin_step_switches_exactly_at_effective_step(void)
{
    const char *dir = test_dir();
    prism_hints agent;
    prism_error err;
    CU_ASSERT_EQUAL_FATAL(prism_hints_create(&agent, path_in(dir, PRISM_LOCAL_HINTS_NAME), 16, &err), PRISM_OK);
    static const uint8_t m1[4] = {1, 0, 2, 4};
    static const uint8_t m2[3] = {0, 3, 1};
    CU_ASSERT_EQUAL_FATAL(prism_hints_publish_map(&agent, 1, 4, 5, m1, 4, &err), PRISM_OK);
    CU_ASSERT_EQUAL_FATAL(prism_hints_publish_map(&agent, 2, 7, 8, m2, 3, &err), PRISM_OK);
    prism_hints_set_status(&agent, true, true, true, 4, PRISM_PRECISION_FP8_E4M3);
    prism_runtime_hints rh = {.map_version = 2, .max_inflight_h2d = 3, .max_inflight_d2h = 2, .prefetch_window = 5,
                              .suppress_prefetch_in_backward = 1, .vram_pressure_threshold = 0.9};
    prism_hints_set_runtime(&agent, &rh);

    prism_client *c = open_client(dir, 1000); /* no agent socket: the table is enough */
    register_ok(c);
    static const struct {
        uint64_t step, version;
        const uint8_t *want;
        uint32_t n;
    } cases[] = {{4, 0, NULL, 0}, {5, 1, m1, 4}, {7, 1, m1, 4}, {8, 2, m2, 3}, {9, 2, m2, 3}, {100, 2, m2, 3}};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        CU_ASSERT_EQUAL(prism_client_begin_step(c, cases[i].step), cases[i].version);
        CU_ASSERT_EQUAL(prism_client_map_version(c), cases[i].version);
        for (uint32_t b = 0; b < 4; b++)
            CU_ASSERT_EQUAL(prism_client_block_precision(c, b),
                            b < cases[i].n ? (prism_precision)cases[i].want[b] : PRISM_PRECISION_BF16);
        CU_ASSERT_EQUAL(prism_client_block_precision(c, 99), PRISM_PRECISION_BF16);
    }
    /* The trainer wrote back when the version changed, with the step it switched at. */
    uint64_t applied = 0, applied_step = 0;
    CU_ASSERT_TRUE(prism_hints_read_applied(&agent, &applied, &applied_step));
    CU_ASSERT_EQUAL(applied, 2);
    CU_ASSERT_EQUAL(applied_step, 8);

    prism_client_state s = state(c);
    CU_ASSERT_EQUAL(s.map_version, 2);
    CU_ASSERT_EQUAL(s.decided_step, 7);
    CU_ASSERT_EQUAL(s.effective_step, 8);
    CU_ASSERT_EQUAL(s.map_blocks, 3);
    CU_ASSERT_TRUE(s.hints_mapped);
    CU_ASSERT_FALSE(s.connected);
    CU_ASSERT_TRUE(s.upstream_connected);
    CU_ASSERT_TRUE(s.calibration_needed);
    CU_ASSERT_TRUE(s.run_calibration);
    CU_ASSERT_EQUAL(s.calibration_samples, 4);
    CU_ASSERT_EQUAL(s.low_precision, PRISM_PRECISION_FP8_E4M3);
    CU_ASSERT_EQUAL(s.hints.map_version, 2);
    CU_ASSERT_EQUAL(s.hints.max_inflight_h2d, 3);
    CU_ASSERT_EQUAL(s.hints.max_inflight_d2h, 2);
    CU_ASSERT_EQUAL(s.hints.prefetch_window, 5);
    CU_ASSERT_TRUE(s.hints.suppress_prefetch_in_backward);
    CU_ASSERT_FALSE(s.hints.suppress_prefetch_in_optimizer);
    CU_ASSERT_EQUAL(s.hints.vram_pressure_threshold, 0.9);
    prism_client_counters n = counters(c);
    CU_ASSERT_EQUAL(n.hint_reads, 6);
    CU_ASSERT_EQUAL(n.hint_read_failures, 0);
    CU_ASSERT_EQUAL(n.hint_open_failures, 0);

    /* The agent is mid-write (or died there): the client keeps the map it has, and counts. */
    const uint8_t m3[4] = {4, 4, 4, 4};
    CU_ASSERT_EQUAL_FATAL(prism_hints_publish_map(&agent, 3, 100, 101, m3, 4, &err), PRISM_OK);
    atomic_fetch_add(&agent.h->seq, 1);
    CU_ASSERT_EQUAL(prism_client_begin_step(c, 101), 2);
    CU_ASSERT_EQUAL(prism_client_block_precision(c, 1), PRISM_PRECISION_FP8_E5M2);
    CU_ASSERT_EQUAL(counters(c).hint_read_failures, 1);
    atomic_fetch_add(&agent.h->seq, 1);
    CU_ASSERT_EQUAL(prism_client_begin_step(c, 101), 3);
    CU_ASSERT_EQUAL(prism_client_block_precision(c, 1), PRISM_PRECISION_INT4);
    CU_ASSERT_TRUE(prism_hints_read_applied(&agent, &applied, &applied_step));
    CU_ASSERT_EQUAL(applied, 3);
    CU_ASSERT_EQUAL(applied_step, 101);
    prism_client_close(c);
    prism_hints_close(&agent);
}

static void test_hint_table_created_after_open_is_found_later(void)
{
    const char *dir = test_dir();
    const unsigned interval = 400;
    double t0 = now_s();
    prism_client *c = open_client(dir, interval); /* the first attempt to map the table */
    register_ok(c);
    CU_ASSERT_FALSE(state(c).hints_mapped);
    CU_ASSERT_EQUAL(prism_client_begin_step(c, 10), 0);
    CU_ASSERT_EQUAL(prism_client_block_precision(c, 0), PRISM_PRECISION_BF16);

    prism_hints agent;
    prism_error err;
    CU_ASSERT_EQUAL_FATAL(prism_hints_create(&agent, path_in(dir, PRISM_LOCAL_HINTS_NAME), 4, &err), PRISM_OK);
    const uint8_t m[4] = {1, 1, 1, 1};
    CU_ASSERT_EQUAL_FATAL(prism_hints_publish_map(&agent, 1, 0, 1, m, 4, &err), PRISM_OK);
    CU_ASSERT_EQUAL(prism_client_begin_step(c, 11), 0); /* not retried within the interval */
    CU_ASSERT_TRUE_FATAL(now_s() - t0 < interval / 1000.0);
    CU_ASSERT_EQUAL(counters(c).hint_open_failures, 1);
    sleep_ms(interval + 50);
    CU_ASSERT_EQUAL(prism_client_begin_step(c, 12), 1);
    CU_ASSERT_EQUAL(prism_client_block_precision(c, 3), PRISM_PRECISION_INT8);
    CU_ASSERT_TRUE(state(c).hints_mapped);
    CU_ASSERT_EQUAL(counters(c).hint_open_failures, 1);
    prism_client_close(c);
    prism_hints_close(&agent);
}

/* A map read before the layout is registered has no room for blocks; registering re-reads it. */
static void test_register_after_begin_step_fills_the_map(void)
{
    const char *dir = test_dir();
    prism_hints agent;
    prism_error err;
    CU_ASSERT_EQUAL_FATAL(prism_hints_create(&agent, path_in(dir, PRISM_LOCAL_HINTS_NAME), 4, &err), PRISM_OK);
    const uint8_t m[4] = {0, 2, 0, 2};
    CU_ASSERT_EQUAL_FATAL(prism_hints_publish_map(&agent, 1, 0, 1, m, 4, &err), PRISM_OK);
    prism_client *c = open_client(dir, 1000);
    CU_ASSERT_EQUAL(prism_client_begin_step(c, 3), 1);
    CU_ASSERT_EQUAL(prism_client_block_precision(c, 1), PRISM_PRECISION_BF16); /* no layout yet */
    register_ok(c);
    CU_ASSERT_EQUAL(prism_client_block_precision(c, 1), PRISM_PRECISION_FP8_E4M3);
    CU_ASSERT_EQUAL(prism_client_map_version(c), 1);
    prism_client_close(c);
    prism_hints_close(&agent);
}

/* A restarted agent that had to replace its table (here: another max_blocks) renames a new file
 * over the path; the client finds out when it reconnects and maps the new one. One that keeps its
 * table keeps the inode, and the client keeps its mapping. */
static void test_replaced_hint_table_is_remapped_at_reconnect(void)
{
    const char *dir = test_dir();
    const char *hints_path = path_in(dir, PRISM_LOCAL_HINTS_NAME);
    const unsigned interval = 150;
    prism_hints agent;
    prism_error err;
    CU_ASSERT_EQUAL_FATAL(prism_hints_create(&agent, hints_path, 4, &err), PRISM_OK);
    const uint8_t m_old[4] = {1, 1, 1, 1};
    CU_ASSERT_EQUAL_FATAL(prism_hints_publish_map(&agent, 5, 0, 1, m_old, 4, &err), PRISM_OK);
    int lfd = agent_listen(dir);
    prism_client *c = open_client(dir, interval);
    register_ok(c);
    int fd = agent_accept(lfd, 2000);
    CU_ASSERT_FATAL(fd >= 0);
    expect_hello(fd);
    CU_ASSERT_EQUAL(prism_client_begin_step(c, 2), 5);

    /* Restart 1: same table size, kept in place. */
    close(fd);
    prism_hints_close(&agent);
    CU_ASSERT_EQUAL_FATAL(prism_hints_create(&agent, hints_path, 4, &err), PRISM_OK);
    CU_ASSERT_EQUAL(report(c, 3, &err), PRISM_ERR_UNAVAILABLE);
    sleep_ms(interval + 50);
    CU_ASSERT_EQUAL(report(c, 4, &err), PRISM_OK);
    fd = agent_accept(lfd, 2000);
    CU_ASSERT_FATAL(fd >= 0);
    expect_hello(fd);
    CU_ASSERT_EQUAL(counters(c).hint_remaps, 0);
    CU_ASSERT_EQUAL(prism_client_begin_step(c, 4), 5);

    /* Restart 2: a table of another size replaces the file. */
    close(fd);
    prism_hints_close(&agent);
    CU_ASSERT_EQUAL_FATAL(prism_hints_create(&agent, hints_path, 8, &err), PRISM_OK);
    const uint8_t m_new[4] = {3, 0, 3, 0};
    CU_ASSERT_EQUAL_FATAL(prism_hints_publish_map(&agent, 1, 0, 1, m_new, 4, &err), PRISM_OK);
    /* Until the client reconnects it reads its old (still mapped) table. */
    CU_ASSERT_EQUAL(prism_client_begin_step(c, 5), 5);
    CU_ASSERT_EQUAL(report(c, 5, &err), PRISM_ERR_UNAVAILABLE);
    sleep_ms(interval + 50);
    CU_ASSERT_EQUAL(report(c, 6, &err), PRISM_OK);
    fd = agent_accept(lfd, 2000);
    CU_ASSERT_FATAL(fd >= 0);
    expect_hello(fd);
    expect_step(fd, 6);
    CU_ASSERT_EQUAL(counters(c).hint_remaps, 1);
    CU_ASSERT_EQUAL(prism_client_begin_step(c, 7), 1);
    for (uint32_t b = 0; b < 4; b++)
        CU_ASSERT_EQUAL(prism_client_block_precision(c, b), (prism_precision)m_new[b]);
    uint64_t applied = 0, applied_step = 0;
    CU_ASSERT_TRUE(prism_hints_read_applied(&agent, &applied, &applied_step));
    CU_ASSERT_EQUAL(applied, 1);
    CU_ASSERT_EQUAL(applied_step, 7);
    prism_client_close(c);
    prism_hints_close(&agent);
    close(fd);
    close(lfd);
}

static const prism_test_case cases[] = {
    {"test_fingerprint_is_the_documented_sha256", test_fingerprint_is_the_documented_sha256},
    {"test_fingerprint_changes_with_every_part_of_the_identity", test_fingerprint_changes_with_every_part_of_the_identity},
    {"test_layout_errors_name_the_field", test_layout_errors_name_the_field},
    {"test_open_refuses_bad_options_naming_them", test_open_refuses_bad_options_naming_them},
    {"test_bad_calls_are_refused_naming_the_argument_and_counted", test_bad_calls_are_refused_naming_the_argument_and_counted},
    {"test_hello_carries_identity_layout_fingerprint_and_shapes", test_hello_carries_identity_layout_fingerprint_and_shapes},
    {"test_step_report_carries_the_cpu_kernel_statistics", test_step_report_carries_the_cpu_kernel_statistics},
#ifdef PRISM_TEST_CUDA
    {"test_step_report_from_cuda_tensors_goes_out_at_a_later_call", test_step_report_from_cuda_tensors_goes_out_at_a_later_call},
    {"test_step_report_from_cuda_tensors_carries_fractions", test_step_report_from_cuda_tensors_carries_fractions},
#endif
#ifdef PRISM_CUDAEMU
    {"test_step_report_waits_for_a_gpu_that_is_behind", test_step_report_waits_for_a_gpu_that_is_behind},
    {"test_step_report_cuda_counts_no_memory_and_an_unknown_device",
     test_step_report_cuda_counts_no_memory_and_an_unknown_device},
#endif
    {"test_calibration_report_carries_the_registered_fingerprint", test_calibration_report_carries_the_registered_fingerprint},
    {"test_agent_started_late_gets_hello_then_reports", test_agent_started_late_gets_hello_then_reports},
    {"test_agent_closing_the_connection_gets_a_reconnect_and_hello", test_agent_closing_the_connection_gets_a_reconnect_and_hello},
    {"test_agent_that_stops_reading_never_blocks_the_trainer", test_agent_that_stops_reading_never_blocks_the_trainer},
    {"test_begin_step_switches_exactly_at_effective_step", test_begin_step_switches_exactly_at_effective_step},
    {"test_hint_table_created_after_open_is_found_later", test_hint_table_created_after_open_is_found_later},
    {"test_register_after_begin_step_fills_the_map", test_register_after_begin_step_fills_the_map},
    {"test_replaced_hint_table_is_remapped_at_reconnect", test_replaced_hint_table_is_remapped_at_reconnect},
    {NULL, NULL},
};

static const prism_test_suite suites[] = {{"client", cases}, {NULL, NULL}};

int main(int argc, char **argv)
{
    return prism_test_main(argc, argv, suites);
}
