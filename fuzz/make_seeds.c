/* Writes the seed inputs of the agent_message, agent_frames, hints and plans targets from real
 * messages, a real hint table and a real plan file:  fuzz_make_seeds CORPUS_DIR  (CORPUS_DIR/<target>/seed-*).
 * The committed corpora began as these seeds; README.md says how they are kept. */
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "hints.h"
#include "plans.h"
#include "prism/v1/prism.pb-c.h"

typedef struct buf {
    uint8_t *data;
    size_t len;
} buf;

static void put(buf *b, const void *p, size_t n)
{
    if (n == 0)
        return;
    uint8_t *d = realloc(b->data, b->len + n);
    if (!d) {
        fprintf(stderr, "out of memory\n");
        exit(1);
    }
    memcpy(d + b->len, p, n);
    b->data = d;
    b->len += n;
}

static void put_byte(buf *b, uint8_t x)
{
    put(b, &x, 1);
}

static void save(const char *dir, const char *target, const char *name, const buf *b)
{
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", dir, target);
    mkdir(path, 0755);
    snprintf(path, sizeof path, "%s/%s/seed-%s", dir, target, name);
    FILE *f = fopen(path, "wb");
    if (!f || fwrite(b->data, 1, b->len, f) != b->len || fclose(f) != 0) {
        fprintf(stderr, "cannot write %s\n", path);
        exit(1);
    }
}

/* ---- messages ---- */

static buf pack(const Prism__V1__AgentMessage *m)
{
    buf b = {malloc(prism__v1__agent_message__get_packed_size(m) + 1), 0};
    b.len = prism__v1__agent_message__pack(m, b.data);
    return b;
}

static buf hello(const char *job, uint32_t rank, uint32_t world, const char *token, uint32_t nblocks)
{
    static Prism__V1__BlockInfo info[8];
    static Prism__V1__BlockInfo *infos[8];
    static char names[8][32];
    for (uint32_t i = 0; i < nblocks; i++) {
        prism__v1__block_info__init(&info[i]);
        info[i].id = i;
        snprintf(names[i], sizeof names[i], "model.layers.%u", i);
        info[i].name = names[i];
        info[i].param_bytes_bf16 = 1u << (20 + i);
        infos[i] = &info[i];
    }
    static uint8_t fp[32];
    for (size_t i = 0; i < sizeof fp; i++)
        fp[i] = (uint8_t)(0x40 + i);
    Prism__V1__ModelLayout layout = PRISM__V1__MODEL_LAYOUT__INIT;
    layout.fingerprint.data = fp;
    layout.fingerprint.len = sizeof fp;
    layout.model_id = (char *)"gpt-mini@r1";
    layout.n_blocks = nblocks;
    layout.blocks = infos;
    Prism__V1__LinearCost cost = PRISM__V1__LINEAR_COST__INIT;
    cost.fixed_seconds = 1e-5;
    cost.seconds_per_byte = 1e-11;
    Prism__V1__DeviceProfile dev = PRISM__V1__DEVICE_PROFILE__INIT;
    dev.device_class = (char *)"cpu";
    dev.device_name = (char *)"x86_64";
    dev.memory_bytes = 1ull << 34;
    dev.bf16_ops_per_second = 1e11;
    dev.quantize_cost = &cost;
    dev.cast_cost = &cost;
    Prism__V1__Hello h = PRISM__V1__HELLO__INIT;
    h.job_id = (char *)job;
    h.rank = rank;
    h.world_size = world;
    h.node = (char *)"node-a";
    h.token = (char *)token;
    h.device = &dev;
    h.layout = &layout;
    Prism__V1__AgentMessage m = PRISM__V1__AGENT_MESSAGE__INIT;
    m.kind_case = PRISM__V1__AGENT_MESSAGE__KIND_HELLO;
    m.hello = &h;
    return pack(&m);
}

static buf step_report(uint64_t step, uint32_t nblocks, bool nonfinite)
{
    Prism__V1__BlockGradStats st[8];
    Prism__V1__BlockGradStats *sts[8];
    for (uint32_t i = 0; i < nblocks; i++) {
        prism__v1__block_grad_stats__init(&st[i]);
        st[i].block_id = i;
        st[i].l2_norm = 0.25 * (double)(i + 1) + 0.01 * (double)step;
        st[i].max_abs = 0.002 * (double)(i + 1);
        st[i].mean = 1e-5;
        st[i].variance = 4e-6;
        st[i].numel = 4096;
        st[i].nonfinite = nonfinite && i == 1 ? 3 : 0;
        sts[i] = &st[i];
    }
    Prism__V1__StepReport r = PRISM__V1__STEP_REPORT__INIT;
    r.step = step;
    r.optional_loss_case = PRISM__V1__STEP_REPORT__OPTIONAL_LOSS_LOSS;
    r.loss = 2.5 - 0.01 * (double)step;
    r.n_blocks = nblocks;
    r.blocks = sts;
    Prism__V1__AgentMessage m = PRISM__V1__AGENT_MESSAGE__INIT;
    m.kind_case = PRISM__V1__AGENT_MESSAGE__KIND_STEP_REPORT;
    m.step_report = &r;
    return pack(&m);
}

static buf calibration(uint32_t nblocks)
{
    Prism__V1__BlockError e[8];
    Prism__V1__BlockError *es[8];
    for (uint32_t i = 0; i < nblocks; i++) {
        prism__v1__block_error__init(&e[i]);
        e[i].block_id = i;
        e[i].relative_error = 0.01 * (double)(i + 1);
        es[i] = &e[i];
    }
    static uint8_t fp[32];
    for (size_t i = 0; i < sizeof fp; i++)
        fp[i] = (uint8_t)(0x40 + i);
    Prism__V1__CalibrationReport c = PRISM__V1__CALIBRATION_REPORT__INIT;
    c.fingerprint.data = fp;
    c.fingerprint.len = sizeof fp;
    c.format = PRISM__V1__PRECISION__INT8;
    c.samples = 4;
    c.n_errors = nblocks;
    c.errors = es;
    Prism__V1__AgentMessage m = PRISM__V1__AGENT_MESSAGE__INIT;
    m.kind_case = PRISM__V1__AGENT_MESSAGE__KIND_CALIBRATION;
    m.calibration = &c;
    return pack(&m);
}

static buf ack(uint64_t version, uint64_t step)
{
    Prism__V1__Ack a = PRISM__V1__ACK__INIT;
    a.map_version = version;
    a.applied_step = step;
    Prism__V1__AgentMessage m = PRISM__V1__AGENT_MESSAGE__INIT;
    m.kind_case = PRISM__V1__AGENT_MESSAGE__KIND_ACK;
    m.ack = &a;
    return pack(&m);
}

static buf heartbeat(uint64_t last_step)
{
    Prism__V1__Heartbeat h = PRISM__V1__HEARTBEAT__INIT;
    h.unix_time_ms = 1700000000000ull;
    h.last_step = last_step;
    Prism__V1__AgentMessage m = PRISM__V1__AGENT_MESSAGE__INIT;
    m.kind_case = PRISM__V1__AGENT_MESSAGE__KIND_HEARTBEAT;
    m.heartbeat = &h;
    return pack(&m);
}

/* ---- agent_message: the operations of agent_message.c ---- */

static void op_message(buf *out, unsigned stream, bool auth, buf msg)
{
    put_byte(out, (uint8_t)(stream | (auth ? 0x20 : 0)));
    put_byte(out, (uint8_t)msg.len);
    put_byte(out, (uint8_t)(msg.len >> 8));
    put(out, msg.data, msg.len);
    free(msg.data);
}

static void op_tick(buf *out, uint8_t units)
{
    put_byte(out, 4 << 2);
    put_byte(out, units);
}

static void op_request(buf *out, unsigned stream, unsigned op, bool auth, const char *job, uint64_t after)
{
    uint8_t data[256];
    size_t len;
    if (op == 5) {
        Prism__V1__BlockMapRequest r = PRISM__V1__BLOCK_MAP_REQUEST__INIT;
        r.job_id = (char *)job;
        len = prism__v1__block_map_request__pack(&r, data);
    } else {
        Prism__V1__WatchRequest r = PRISM__V1__WATCH_REQUEST__INIT;
        r.job_id = (char *)job;
        r.after_version = after;
        len = prism__v1__watch_request__pack(&r, data);
    }
    put_byte(out, (uint8_t)(stream | op << 2 | (auth ? 0x20 : 0)));
    put_byte(out, (uint8_t)len);
    put(out, data, len);
}

static void agent_message_seeds(const char *dir)
{
    /* One rank: Hello, reports past the warm-up, calibration, acks, a heartbeat, a block map. */
    buf b = {0};
    op_message(&b, 0, false, hello("job-a", 0, 1, "tok-a", 4));
    for (uint64_t s = 1; s <= 5; s++) {
        op_message(&b, 0, false, step_report(s, 4, s == 4));
        op_tick(&b, 2);
    }
    op_message(&b, 0, false, calibration(4));
    op_message(&b, 0, false, ack(1, 4));
    op_message(&b, 0, false, heartbeat(5));
    op_request(&b, 1, 5, true, "job-a", 0);
    save(dir, "agent_message", "one-rank", &b);
    free(b.data);

    /* Two ranks of one job, a watcher, a rank that leaves and comes back, a timeout. */
    b = (buf){0};
    op_message(&b, 0, true, hello("demo", 0, 2, "demo-secret", 3));
    op_message(&b, 1, true, hello("demo", 1, 2, "", 3));
    op_request(&b, 2, 6, true, "demo", 0);
    for (uint64_t s = 1; s <= 4; s++) {
        op_message(&b, 0, true, step_report(s, 3, false));
        if (s != 3)
            op_message(&b, 1, true, step_report(s, 3, false));
        op_tick(&b, 10);
    }
    put_byte(&b, 1 | 3 << 2); /* rank 1 leaves */
    op_message(&b, 1, true, hello("demo", 1, 2, "demo-secret", 3));
    op_message(&b, 1, true, step_report(5, 3, false));
    op_message(&b, 0, true, step_report(5, 3, false));
    op_tick(&b, 200);
    save(dir, "agent_message", "two-ranks", &b);
    free(b.data);

    /* Refusals: a report before Hello, a wrong token, a rank past the world, an empty message. */
    b = (buf){0};
    op_message(&b, 0, false, step_report(1, 2, false));
    op_message(&b, 1, false, hello("job-b", 0, 1, "right", 2));
    op_message(&b, 2, false, hello("job-b", 0, 1, "wrong", 2));
    op_message(&b, 3, false, hello("job-c", 5, 2, "", 2));
    op_message(&b, 1, false, (buf){NULL, 0});
    op_message(&b, 1, false, step_report(UINT64_MAX, 2, false));
    op_message(&b, 1, false, step_report(1, 2, false));
    put_byte(&b, 7 << 2);
    save(dir, "agent_message", "refusals", &b);
    free(b.data);
}

/* ---- agent_frames: chunks of the local stream ---- */

static void frame(buf *stream, buf msg)
{
    uint8_t h[4] = {(uint8_t)msg.len, (uint8_t)(msg.len >> 8), (uint8_t)(msg.len >> 16), (uint8_t)(msg.len >> 24)};
    put(stream, h, 4);
    put(stream, msg.data, msg.len);
    free(msg.data);
}

static void chunks(buf *out, const buf *stream, size_t every)
{
    for (size_t at = 0; at < stream->len; at += every) {
        size_t n = stream->len - at < every ? stream->len - at : every;
        put_byte(out, (uint8_t)n);
        put_byte(out, (uint8_t)(n >> 8));
        put(out, stream->data + at, n);
    }
}

static void agent_frames_seeds(const char *dir)
{
    buf s = {0};
    frame(&s, hello("job-a", 0, 1, "", 4));
    frame(&s, step_report(1, 4, false));
    frame(&s, step_report(2, 4, true));
    frame(&s, calibration(4));
    buf b = {0};
    chunks(&b, &s, 65535);
    save(dir, "agent_frames", "whole", &b);
    free(b.data);
    b = (buf){0};
    chunks(&b, &s, 7);
    save(dir, "agent_frames", "split", &b);
    free(b.data);
    /* A kind trainers do not send, then a frame cut off by the end of the stream. */
    buf bad = {0};
    frame(&bad, hello("job-a", 0, 1, "", 1));
    frame(&bad, ack(1, 1));
    b = (buf){0};
    chunks(&b, &bad, 65535);
    save(dir, "agent_frames", "ack", &b);
    free(b.data);
    bad.len -= 3;
    b = (buf){0};
    chunks(&b, &bad, 65535);
    save(dir, "agent_frames", "cut", &b);
    free(b.data);
    free(bad.data);
    free(s.data);
}

/* ---- hints: a real table's file ---- */

static void hints_seeds(const char *dir)
{
    char tmp[] = "/tmp/prism-seed-hints-XXXXXX";
    if (!mkdtemp(tmp)) {
        perror("mkdtemp");
        exit(1);
    }
    char path[128];
    snprintf(path, sizeof path, "%s/prism-hints", tmp);
    prism_hints t;
    prism_error err;
    if (prism_hints_create(&t, path, 8, &err) != PRISM_OK) {
        fprintf(stderr, "%s\n", err.message);
        exit(1);
    }
    uint8_t map[8] = {0, 1, 2, 3, 4, 1, 0, 1};
    prism_hints_set_status(&t, true, true, true, 8, PRISM_PRECISION_FP8_E4M3);
    prism_runtime_hints rh = {.map_version = 2, .max_inflight_h2d = 2, .max_inflight_d2h = 1,
                              .prefetch_window = 3, .vram_pressure_threshold = 0.85};
    prism_hints_set_runtime(&t, &rh);
    if (prism_hints_publish_map(&t, 1, 2, 4, map, 8, &err) || prism_hints_publish_map(&t, 2, 6, 8, map, 5, &err)) {
        fprintf(stderr, "%s\n", err.message);
        exit(1);
    }
    prism_hints_write_applied(&t, 1, 4);
    buf b = {0};
    put(&b, t.h, t.bytes);
    save(dir, "hints", "table", &b);
    prism_hints_close(&t);
    b.len = 1024 + 8; /* the header and a piece of the first slot: a shrunk file */
    save(dir, "hints", "short", &b);
    free(b.data);
    unlink(path);
    rmdir(tmp);
}

/* ---- plans: a real plan file ---- */

static void plans_seeds(const char *dir)
{
    char tmp[] = "/tmp/prism-seed-plans-XXXXXX";
    if (!mkdtemp(tmp)) {
        perror("mkdtemp");
        exit(1);
    }
    char path[128];
    snprintf(path, sizeof path, "%s/prism-hints.plans", tmp);
    prism_plans t;
    prism_error err;
    if (prism_plans_create(&t, path, 8, &err) != PRISM_OK) {
        fprintf(stderr, "%s\n", err.message);
        exit(1);
    }
    uint8_t low[8] = {0, 1, 1, 0, 2, 0, 1, 0};
    prism_plans_entry e;
    memset(&e, 0, sizeof e);
    e.map_version = 1;
    e.low_format = PRISM_PRECISION_INT8;
    e.high_fp16 = 1;
    e.predicted_iteration_seconds = 0.25;
    e.compute_seconds = 0.2;
    snprintf(e.device_class, sizeof e.device_class, "t4-16gb");
    if (prism_plans_publish(&t, &e, low, 8, NULL, 0, &err)) {
        fprintf(stderr, "%s\n", err.message);
        exit(1);
    }
    e.map_version = 3;
    e.low_format = PRISM_PRECISION_FP8_E4M3;
    low[1] = low[2] = low[6] = 2;
    static const uint64_t keep[1] = {1};
    if (prism_plans_publish(&t, &e, low, 5, keep, 1, &err)) {
        fprintf(stderr, "%s\n", err.message);
        exit(1);
    }
    buf b = {0};
    put(&b, t.h, t.bytes);
    save(dir, "plans", "file", &b);
    prism_plans_close(&t);
    b.len = 1024 + 8; /* the header and a piece of the first slot: a shrunk file */
    save(dir, "plans", "short", &b);
    free(b.data);
    unlink(path);
    rmdir(tmp);
}

int main(int argc, char **argv)
{
    if (argc != 2) {
        fprintf(stderr, "usage: fuzz_make_seeds CORPUS_DIR\n");
        return 2;
    }
    agent_message_seeds(argv[1]);
    agent_frames_seeds(argv[1]);
    hints_seeds(argv[1]);
    plans_seeds(argv[1]);
    return 0;
}
