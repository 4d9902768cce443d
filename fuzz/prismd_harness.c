/* The in-process prismd of the rest and agent_message fuzz targets (prismd_harness.h). */
#include "prismd_harness.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz.h"
#include "log.h"
#include "prism/v1/prism.pb-c.h"

void prismd_stream_send(prismd_stream *s, const uint8_t *data, size_t len)
{
    /* What the jobs send must be a message the peer can decode. */
    if (s->watch) {
        Prism__V1__PrecisionUpdate *u = prism__v1__precision_update__unpack(NULL, len, data);
        FUZZ_CHECK(u != NULL);
        prism__v1__precision_update__free_unpacked(u, NULL);
    } else {
        Prism__V1__ServiceMessage *m = prism__v1__service_message__unpack(NULL, len, data);
        FUZZ_CHECK(m != NULL);
        prism__v1__service_message__free_unpacked(m, NULL);
    }
    s->sends++;
    s->bytes += len;
}

/* A shared message: the harness's streams check and drop what they are sent at once, so the
 * bytes need live only as long as the creator's reference. */
struct prismd_message {
    uint8_t *data;
    size_t len;
};

prismd_message *prismd_message_create(const uint8_t *data, size_t len)
{
    prismd_message *m = malloc(sizeof *m);
    FUZZ_CHECK(m != NULL);
    m->data = malloc(len ? len : 1);
    FUZZ_CHECK(m->data != NULL);
    memcpy(m->data, data, len);
    m->len = len;
    return m;
}

void prismd_message_release(prismd_message *m)
{
    if (m) {
        free(m->data);
        free(m);
    }
}

void prismd_stream_send_message(prismd_stream *s, prismd_message *m)
{
    prismd_stream_send(s, m->data, m->len);
}

void prismd_stream_end(prismd_stream *s, int code, const char *message)
{
    /* The jobs end a stream only with a status that says why. */
    FUZZ_CHECK(code != 0 && message != NULL && message[0] != '\0');
    s->ended = true;
}

void harness_init(harness *h)
{
    /* The defaults, made once: prism_config_init is the dearest part of a fresh harness. */
    static prism_config defaults;
    static bool have_defaults;
    prism_error err;
    if (!have_defaults) {
        prism_log_threshold = PRISM_LOG_ERROR + 1; /* quiet: a finding is a crash, not a log line */
        FUZZ_CHECK(prism_config_init(&defaults, &err) == PRISM_OK);
        /* Decide early, so that a few reports reach the decision path. */
        defaults.warmup_steps = 2;
        defaults.update_interval_steps = 1;
        defaults.min_steps_between_switches = 0;
        have_defaults = true;
    }
    memset(h, 0, sizeof *h);
    prismd_snapshots_init(&h->snapshots);
    prismd_commands_init(&h->commands);
    prismd_jobs_limits limits = {
        .max_jobs = 4,
        .max_blocks = 64,
        .auto_create = true,
        .admin_token = HARNESS_ADMIN_TOKEN,
        .data_dir = NULL,
        .hints = {.max_inflight_h2d = 2, .max_inflight_d2h = 2, .prefetch_window = 1, .vram_pressure_threshold = 0.9},
    };
    h->jobs = prismd_jobs_create(&defaults, &limits, NULL, &h->snapshots, &err);
    if (!h->jobs) {
        fprintf(stderr, "prismd_jobs_create: %s\n", err.message);
        abort();
    }
    h->now_ms = 1000;
}

void harness_free(harness *h)
{
    prismd_jobs_destroy(h->jobs);
    prismd_commands_destroy(&h->commands);
    prismd_snapshots_destroy(&h->snapshots);
}

bool harness_send(harness *h, prismd_stream *s, prismd_peer *peer, const void *msg)
{
    const Prism__V1__AgentMessage *m = msg;
    size_t len = prism__v1__agent_message__get_packed_size(m);
    uint8_t *buf = malloc(len ? len : 1);
    FUZZ_CHECK(buf != NULL);
    prism__v1__agent_message__pack(m, buf);
    prismd_status end = {0};
    bool ok = prismd_jobs_agent_message(h->jobs, s, peer, buf, len, h->now_ms, &end);
    free(buf);
    return ok;
}

static void hello(harness *h, prismd_stream *s, prismd_peer *peer, const char *job, const char *token,
                  uint32_t nblocks)
{
    Prism__V1__BlockInfo info[4];
    Prism__V1__BlockInfo *infos[4];
    static const char *const names[4] = {"model.embed", "model.layers.0", "model.layers.1", "lm_head"};
    for (uint32_t i = 0; i < nblocks; i++) {
        prism__v1__block_info__init(&info[i]);
        info[i].id = i;
        info[i].name = (char *)names[i];
        info[i].param_bytes_bf16 = 1u << (20 + i);
        infos[i] = &info[i];
    }
    uint8_t fp[32];
    for (size_t i = 0; i < sizeof fp; i++)
        fp[i] = (uint8_t)(i * 7 + (unsigned char)job[0]);
    Prism__V1__ModelLayout layout = PRISM__V1__MODEL_LAYOUT__INIT;
    layout.fingerprint.data = fp;
    layout.fingerprint.len = sizeof fp;
    layout.model_id = (char *)"fuzz-model";
    layout.n_blocks = nblocks;
    layout.blocks = infos;
    Prism__V1__Hello hl = PRISM__V1__HELLO__INIT;
    hl.job_id = (char *)job;
    hl.rank = 0;
    hl.world_size = 1;
    hl.node = (char *)"node-0";
    hl.token = (char *)(token ? token : "");
    hl.layout = &layout;
    Prism__V1__AgentMessage m = PRISM__V1__AGENT_MESSAGE__INIT;
    m.kind_case = PRISM__V1__AGENT_MESSAGE__KIND_HELLO;
    m.hello = &hl;
    FUZZ_CHECK(harness_send(h, s, peer, &m));
}

static void report(harness *h, prismd_stream *s, prismd_peer *peer, uint64_t step, uint32_t nblocks)
{
    Prism__V1__BlockGradStats st[4];
    Prism__V1__BlockGradStats *sts[4];
    for (uint32_t i = 0; i < nblocks; i++) {
        prism__v1__block_grad_stats__init(&st[i]);
        st[i].block_id = i;
        st[i].l2_norm = 0.5 + (double)i * (double)(step % 3);
        st[i].max_abs = 0.01 * (double)(i + 1);
        st[i].variance = 1e-6;
        st[i].numel = 1000;
        sts[i] = &st[i];
    }
    Prism__V1__StepReport r = PRISM__V1__STEP_REPORT__INIT;
    r.step = step;
    r.optional_loss_case = PRISM__V1__STEP_REPORT__OPTIONAL_LOSS_LOSS;
    r.loss = 3.0 - 0.1 * (double)step;
    r.n_blocks = nblocks;
    r.blocks = sts;
    Prism__V1__AgentMessage m = PRISM__V1__AGENT_MESSAGE__INIT;
    m.kind_case = PRISM__V1__AGENT_MESSAGE__KIND_STEP_REPORT;
    m.step_report = &r;
    FUZZ_CHECK(harness_send(h, s, peer, &m));
}

void harness_populate(harness *h, prismd_stream *streams, prismd_peer *peers)
{
    hello(h, &streams[0], &peers[0], "demo", HARNESS_JOB_TOKEN, 4);
    hello(h, &streams[1], &peers[1], "open", NULL, 1);
    for (uint64_t step = 1; step <= 4; step++) {
        report(h, &streams[0], &peers[0], step, 4);
        report(h, &streams[1], &peers[1], step, 1);
        h->now_ms += 100;
        prismd_jobs_tick(h->jobs, h->now_ms);
    }
    h->now_ms += 1000;
    prismd_jobs_tick(h->jobs, h->now_ms);
}
