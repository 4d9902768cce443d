/* The upstream half of prism-agent (agent.h): one Connect stream to prismd on the gRPC core C
 * API, driven by one thread that is also the hint table's only writer.
 *
 * A stream starts once the trainer said Hello (the layout is the trainer's; the agent adds its
 * node, token and the measured DeviceProfile). prismd answers Welcome with the config and the
 * current map; each PrecisionUpdate after it becomes a whole map in the hint table, which the
 * trainer picks up at the update's effective step; what the trainer applied comes back through
 * the table and goes up as an Ack. When the stream ends, for any reason, the table keeps the last
 * map (fail-static) and the next attempt waits an exponential backoff with jitter:
 *   wait = min(max, initial * 2^failures) * (1/2 + u/2),  u uniform in [0, 1),
 * reset once a stream is welcomed. While there is no welcomed stream, reports are dropped and
 * counted: a report is only worth its step, and prismd merges steps as they come. */
#define _GNU_SOURCE
#include "agent.h"

#include "prism/v1/prism.pb-c.h"

#include <grpc/byte_buffer.h>
#include <grpc/byte_buffer_reader.h>
#include <grpc/grpc.h>
#include <grpc/grpc_security.h>
#include <grpc/support/alloc.h>
#include <grpc/support/time.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

/* The thread wakes at least this often: frames from the trainer wait at most this long. */
#define TICK_MS 5
/* At stop, the stream gets this long to end with its status before it is cancelled. */
#define CLOSE_MS 2000

typedef enum tag_kind { TAG_START, TAG_RECV_MD, TAG_STATUS, TAG_READ, TAG_WRITE } tag_kind;

typedef struct outmsg {
    struct outmsg *next;
    int kind;
    grpc_byte_buffer *bb;
    size_t len;
} outmsg;

typedef struct upstream upstream;

typedef struct stream_tag {
    tag_kind kind;
    struct stream *s;
} stream_tag;

/* One Connect call and everything that lives as long as it. */
typedef struct stream {
    upstream *u;
    grpc_call *call;
    stream_tag t_start, t_recv_md, t_status, t_read, t_write;
    int pending;               /* batches in flight */
    grpc_metadata auth;
    grpc_metadata_array recv_md, trailing_md;
    grpc_byte_buffer *recv;
    grpc_status_code status;
    grpc_slice details;
    bool ended;                /* the status arrived */
    bool welcomed;
    bool writing;
    bool cancelled;
    outmsg *head, *tail;
    size_t queued_bytes;
} stream;

struct upstream {
    agent *a;
    grpc_completion_queue *cq;
    grpc_channel *channel;
    stream *live;              /* the current call, NULL between attempts */
    int streams;               /* calls not yet freed: an ended call may still have batches out */
    bool cal_needed, run_calibration; /* the last Welcome's, kept in the table while disconnected */
    uint32_t cal_samples;
    prism_precision low;
    uint8_t *hello;            /* the trainer's Hello completed by the agent, serialized */
    size_t hello_len;
    int64_t next_attempt_ms;
    unsigned failures;         /* consecutive calls that ended without a Welcome */
    uint64_t rng;
    uint8_t *map;              /* the newest whole map: opts.max_blocks bytes */
    uint8_t *plan;             /* scratch for a compute plan's bytes: opts.max_blocks */
    uint32_t map_blocks;
    uint64_t map_version;
    uint64_t acked_version, acked_step;
    prism_hints_trainer line;   /* the trainer line as last read (line.published 0: no counters) */
    bool counters_sent;         /* this stream's last Heartbeat carried the counters below */
    uint64_t sent_dropped, sent_late;
    int64_t last_send_ms;
    uint64_t last_step;
    char details[256];
};

const char *const agent_drop_names[AGENT_DROPS] = {"disconnected", "queue_full", "inbox_full"};
const char *const agent_plan_ignored_names[AGENT_PLAN_IGNORED_REASONS] = {"low_format", "device_class", "file"};

static int64_t now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static gpr_timespec in_ms(int64_t ms)
{
    return gpr_time_add(gpr_now(GPR_CLOCK_MONOTONIC), gpr_time_from_millis(ms, GPR_TIMESPAN));
}

/* xorshift64*: the jitter only has to differ between agents, not be unpredictable. */
static double next_uniform(upstream *u)
{
    u->rng ^= u->rng >> 12;
    u->rng ^= u->rng << 25;
    u->rng ^= u->rng >> 27;
    return (double)((u->rng * 0x2545f4914f6cdd1dull) >> 11) / 9007199254740992.0;
}

/* ---- the inbox ---- */

void agent_inbox_init(agent_inbox *in, size_t max_bytes)
{
    memset(in, 0, sizeof *in);
    pthread_mutex_init(&in->mu, NULL);
    in->max_bytes = max_bytes;
}

bool agent_inbox_put(agent_inbox *in, agent_frame *f)
{
    pthread_mutex_lock(&in->mu);
    bool fits = in->bytes + f->len <= in->max_bytes || !in->head;
    if (fits) {
        f->next = NULL;
        if (in->tail)
            in->tail->next = f;
        else
            in->head = f;
        in->tail = f;
        in->bytes += f->len;
    }
    pthread_mutex_unlock(&in->mu);
    if (!fits)
        free(f);
    return fits;
}

agent_frame *agent_inbox_take(agent_inbox *in)
{
    pthread_mutex_lock(&in->mu);
    agent_frame *f = in->head;
    in->head = in->tail = NULL;
    in->bytes = 0;
    pthread_mutex_unlock(&in->mu);
    return f;
}

void agent_inbox_destroy(agent_inbox *in)
{
    for (agent_frame *f = agent_inbox_take(in), *next; f; f = next) {
        next = f->next;
        free(f);
    }
    pthread_mutex_destroy(&in->mu);
}

/* ---- one call ---- */

static bool start_batch(stream *s, grpc_op *ops, size_t n, stream_tag *tag)
{
    grpc_call_error rc = grpc_call_start_batch(s->call, ops, n, tag, NULL);
    if (rc != GRPC_CALL_OK) {
        prism_log(PRISM_LOG_ERROR, "grpc_call_start_batch failed", "error", grpc_call_error_to_string(rc), LOG_END);
        return false;
    }
    s->pending++;
    return true;
}

static void stream_free(stream *s)
{
    while (s->head) {
        outmsg *m = s->head;
        s->head = m->next;
        grpc_byte_buffer_destroy(m->bb);
        free(m);
    }
    if (s->recv)
        grpc_byte_buffer_destroy(s->recv);
    grpc_metadata_array_destroy(&s->recv_md);
    grpc_metadata_array_destroy(&s->trailing_md);
    grpc_slice_unref(s->auth.value);
    grpc_slice_unref(s->details);
    if (s->call)
        grpc_call_unref(s->call);
    free(s);
}

/* Queues a serialized AgentMessage. Reports past --queue-bytes are refused (false); every other
 * kind is small and always queued. */
static bool stream_queue(stream *s, int kind, const uint8_t *data, size_t len)
{
    agent *a = s->u->a;
    bool report = kind == PRISM__V1__AGENT_MESSAGE__KIND_STEP_REPORT;
    if (report && s->queued_bytes + len > a->opts.queue_bytes)
        return false;
    outmsg *m = malloc(sizeof *m);
    if (!m)
        return false;
    grpc_slice slice = grpc_slice_from_copied_buffer((const char *)data, len);
    m->bb = grpc_raw_byte_buffer_create(&slice, 1);
    grpc_slice_unref(slice);
    m->kind = kind;
    m->len = len;
    m->next = NULL;
    if (s->tail)
        s->tail->next = m;
    else
        s->head = m;
    s->tail = m;
    s->queued_bytes += len;
    return true;
}

static void stream_pump(stream *s)
{
    if (s->writing || !s->head || s->ended || s->cancelled)
        return;
    grpc_op op = {.op = GRPC_OP_SEND_MESSAGE};
    op.data.send_message.send_message = s->head->bb;
    if (start_batch(s, &op, 1, &s->t_write))
        s->writing = true;
}

static void start_read(stream *s)
{
    grpc_op op = {.op = GRPC_OP_RECV_MESSAGE};
    op.data.recv_message.recv_message = &s->recv;
    start_batch(s, &op, 1, &s->t_read);
}

static void upstream_cancel(upstream *u, const char *why)
{
    stream *s = u->live;
    if (!s)
        return;
    prism_log(PRISM_LOG_INFO, "closing the stream to prismd", "reason", why, LOG_END);
    s->cancelled = true;
    grpc_call_cancel_with_status(s->call, GRPC_STATUS_CANCELLED, why, NULL);
}

static void start_call(upstream *u)
{
    agent *a = u->a;
    stream *s = calloc(1, sizeof *s);
    if (!s) {
        u->next_attempt_ms = now_ms() + (int64_t)a->opts.backoff_max_ms;
        return;
    }
    s->u = u;
    s->t_start = (stream_tag){TAG_START, s};
    s->t_recv_md = (stream_tag){TAG_RECV_MD, s};
    s->t_status = (stream_tag){TAG_STATUS, s};
    s->t_read = (stream_tag){TAG_READ, s};
    s->t_write = (stream_tag){TAG_WRITE, s};
    s->details = grpc_empty_slice();
    s->auth.value = grpc_empty_slice();
    grpc_metadata_array_init(&s->recv_md);
    grpc_metadata_array_init(&s->trailing_md);
    grpc_slice method = grpc_slice_from_static_string("/prism.v1.PolicyService/Connect");
    s->call = grpc_channel_create_call(u->channel, NULL, GRPC_PROPAGATE_DEFAULTS, u->cq, method, NULL,
                                       gpr_inf_future(GPR_CLOCK_REALTIME), NULL);
    atomic_fetch_add_explicit(&a->stats.upstream_attempts, 1, memory_order_relaxed);
    u->live = s;
    u->streams++;

    grpc_op ops[2];
    memset(ops, 0, sizeof ops);
    ops[0].op = GRPC_OP_SEND_INITIAL_METADATA;
    if (a->opts.token) {
        char *bearer = NULL;
        if (asprintf(&bearer, "Bearer %s", a->opts.token) >= 0) {
            s->auth.key = grpc_slice_from_static_string("authorization");
            grpc_slice_unref(s->auth.value);
            s->auth.value = grpc_slice_from_copied_string(bearer);
            free(bearer);
            ops[0].data.send_initial_metadata.count = 1;
            ops[0].data.send_initial_metadata.metadata = &s->auth;
        }
    }
    start_batch(s, ops, 1, &s->t_start);

    memset(ops, 0, sizeof ops);
    ops[0].op = GRPC_OP_RECV_INITIAL_METADATA;
    ops[0].data.recv_initial_metadata.recv_initial_metadata = &s->recv_md;
    start_batch(s, ops, 1, &s->t_recv_md);

    memset(ops, 0, sizeof ops);
    ops[0].op = GRPC_OP_RECV_STATUS_ON_CLIENT;
    ops[0].data.recv_status_on_client.trailing_metadata = &s->trailing_md;
    ops[0].data.recv_status_on_client.status = &s->status;
    ops[0].data.recv_status_on_client.status_details = &s->details;
    start_batch(s, ops, 1, &s->t_status);

    stream_queue(s, PRISM__V1__AGENT_MESSAGE__KIND_HELLO, u->hello, u->hello_len);
    stream_pump(s);
    start_read(s);
}

/* ---- applying what prismd sends ---- */

static void publish(upstream *u, uint64_t decided, uint64_t effective)
{
    agent *a = u->a;
    prism_error err;
    if (prism_hints_publish_map(&a->hints, u->map_version, decided, effective, u->map, u->map_blocks, &err)) {
        prism_log(PRISM_LOG_ERROR, "cannot write the map to the hint table", "error", err.message, LOG_END);
        return;
    }
    atomic_store_explicit(&a->stats.map_version, u->map_version, memory_order_relaxed);
    atomic_store_explicit(&a->stats.map_effective_step, effective, memory_order_relaxed);
    atomic_fetch_add_explicit(&a->stats.maps_applied, 1, memory_order_relaxed);
    char version[24], step[24];
    snprintf(version, sizeof version, "%" PRIu64, u->map_version);
    snprintf(step, sizeof step, "%" PRIu64, effective);
    prism_log(PRISM_LOG_INFO, "map applied", "version", version, "effective_step", step, LOG_END);
}

/* Writes the compute plan that came with map p->map_version into the plan file (plans.h), before
 * the map goes into the hint table, so that a trainer that sees the map finds its plan. The slot
 * it takes keeps the plan of every map the hint table holds (the applied one and those waiting
 * for their effective step), so no plan of a map about to take effect is evicted. Not written
 * (no plan: every block high), logged and counted by reason: a plan for another device class
 * than this agent's profile's (prismd sends each class its own), a low format other than INT8
 * or FP8_E4M3, a plan the file refuses. Low block ids past --max-blocks are left out (high) and
 * counted like the map's. */
static void write_plan(upstream *u, const Prism__V1__PrecisionUpdate *p)
{
    agent *a = u->a;
    const Prism__V1__ComputePlan *cp = p->compute_plan;
    char version[24];
    snprintf(version, sizeof version, "%" PRIu64, p->map_version);
    const char *plan_class = cp->device_class ? cp->device_class : "";
    if (strcmp(plan_class, a->profile.device_class) != 0) {
        atomic_fetch_add_explicit(&a->stats.plans_ignored[AGENT_PLAN_DEVICE_CLASS], 1, memory_order_relaxed);
        prism_log(PRISM_LOG_WARN, "compute plan ignored: it is another device class's", "version", version,
                  "plan_class", plan_class, "agent_class", a->profile.device_class, LOG_END);
        return;
    }
    if (cp->low_format != PRISM__V1__PRECISION__INT8 &&
        cp->low_format != PRISM__V1__PRECISION__FP8_E4M3) {
        atomic_fetch_add_explicit(&a->stats.plans_ignored[AGENT_PLAN_LOW_FORMAT], 1, memory_order_relaxed);
        char fmt[16];
        snprintf(fmt, sizeof fmt, "%d", (int)cp->low_format);
        prism_log(PRISM_LOG_WARN, "compute plan ignored: its low format is not int8 or fp8_e4m3", "version", version,
                  "low_format", fmt, LOG_END);
        return;
    }
    uint32_t n = 0;
    memset(u->plan, 0, a->opts.max_blocks);
    for (size_t i = 0; i < cp->n_low_blocks; i++) {
        uint32_t b = cp->low_blocks[i];
        if (b >= a->opts.max_blocks) {
            atomic_fetch_add_explicit(&a->stats.blocks_out_of_range, 1, memory_order_relaxed);
            continue;
        }
        u->plan[b] = (uint8_t)cp->low_format;
        if (b + 1 > n)
            n = b + 1;
    }
    prism_plans_entry e;
    memset(&e, 0, sizeof e);
    e.map_version = p->map_version;
    e.low_format = (uint32_t)cp->low_format;
    e.high_fp16 = cp->high_format && strcmp(cp->high_format, "fp16") == 0;
    e.predicted_iteration_seconds = cp->predicted_iteration_seconds;
    e.compute_seconds = cp->compute_seconds;
    snprintf(e.device_class, sizeof e.device_class, "%s", cp->device_class ? cp->device_class : "");
    uint64_t keep[PRISM_HINTS_SLOTS];
    unsigned n_keep = prism_hints_held_versions(&a->hints, keep);
    prism_error err;
    if (prism_plans_publish(&a->plans, &e, u->plan, n, keep, n_keep, &err)) {
        atomic_fetch_add_explicit(&a->stats.plans_ignored[AGENT_PLAN_FILE], 1, memory_order_relaxed);
        prism_log(PRISM_LOG_ERROR, "cannot write the compute plan", "version", version, "error", err.message, LOG_END);
        return;
    }
    uint64_t low = 0;
    for (uint32_t i = 0; i < n; i++)
        low += u->plan[i] != 0;
    atomic_store_explicit(&a->stats.plan_map_version, p->map_version, memory_order_relaxed);
    atomic_store_explicit(&a->stats.plan_low_blocks, low, memory_order_relaxed);
    atomic_fetch_add_explicit(&a->stats.plans_written, 1, memory_order_relaxed);
    char low_text[24];
    snprintf(low_text, sizeof low_text, "%" PRIu64, low);
    prism_log(PRISM_LOG_INFO, "compute plan written", "version", version, "class", plan_class, "low_blocks",
              low_text, LOG_END);
}

/* Withdraws the plan the file holds for the held map `version` (prismd's Welcome repeated that
 * map without a plan: it has none now). The trainer notices the write (plans.h: seq) and reads
 * the plan of its map again: every block high. The gauges stop naming a plan that is gone. */
static void withdraw_plan(upstream *u, uint64_t version)
{
    agent *a = u->a;
    if (!prism_plans_clear(&a->plans, version))
        return;
    atomic_fetch_add_explicit(&a->stats.plans_withdrawn, 1, memory_order_relaxed);
    if (atomic_load_explicit(&a->stats.plan_map_version, memory_order_relaxed) == version) {
        atomic_store_explicit(&a->stats.plan_map_version, 0, memory_order_relaxed);
        atomic_store_explicit(&a->stats.plan_low_blocks, 0, memory_order_relaxed);
    }
    char text[24];
    snprintf(text, sizeof text, "%" PRIu64, version);
    prism_log(PRISM_LOG_INFO, "compute plan withdrawn: prismd repeated the held map without one", "version", text,
              LOG_END);
}

/* Whether the plan file holds, for map p->map_version, exactly the plan p carries as write_plan
 * would write it: the same figures (formats, predicted times, class) and the same block bytes.
 * false when it holds none or another, or memory for the comparison runs out (the plan is then
 * written again, which is harmless). */
static bool plan_held_same(upstream *u, const Prism__V1__PrecisionUpdate *p)
{
    agent *a = u->a;
    const Prism__V1__ComputePlan *cp = p->compute_plan;
    uint32_t max = a->opts.max_blocks;
    uint8_t *want = calloc(2, max ? max : 1);
    if (!want)
        return false;
    uint8_t *held = want + (max ? max : 1);
    uint32_t n = 0;
    for (size_t i = 0; i < cp->n_low_blocks; i++)
        if (cp->low_blocks[i] < max) {
            want[cp->low_blocks[i]] = (uint8_t)cp->low_format;
            if (cp->low_blocks[i] + 1 > n)
                n = cp->low_blocks[i] + 1;
        }
    prism_plans_entry e;
    bool same = prism_plans_read(&a->plans, p->map_version, &e, held, max, 64) == PRISM_PLANS_FOUND &&
                memcmp(want, held, max) == 0 && e.n_blocks == n && e.low_format == (uint32_t)cp->low_format &&
                e.high_fp16 == (uint32_t)(cp->high_format && strcmp(cp->high_format, "fp16") == 0) &&
                e.predicted_iteration_seconds == cp->predicted_iteration_seconds &&
                e.compute_seconds == cp->compute_seconds &&
                strncmp(e.device_class, cp->device_class ? cp->device_class : "", sizeof e.device_class) == 0;
    free(want);
    return same;
}

/* Applies a map from prismd: a whole one (Welcome, full updates) or the changed blocks. Returns
 * false when a partial update does not follow the map held (a version was missed): the stream
 * is then restarted, and its Welcome brings the whole map. */
static bool apply_update(upstream *u, const Prism__V1__PrecisionUpdate *p, bool full)
{
    agent *a = u->a;
    if (p->map_version <= u->map_version) {
        /* Already held: a Welcome after a reconnect repeats the current map. A Welcome with an
         * older version means prismd lost its store; the table only moves forward, so the last
         * map stays until prismd's versions pass it. The held map's plan is written when the
         * plan file lacks it (a file this agent had to replace, or one that appeared after the
         * trainer started: the trainer maps it within a reconnect interval and reads the plan
         * of the map in use) or holds another plan for it (entry figures or block bytes: the
         * Welcome carries prismd's saved pair, which wins); a Welcome that repeats the held map without a plan withdraws the
         * one the file holds for it. Either write moves the file's seq, so the trainer reads
         * the plan of its map again at its next begin_step. */
        if (p->map_version == u->map_version && p->map_version != 0) {
            if (p->compute_plan && !plan_held_same(u, p))
                write_plan(u, p);
            else if (!p->compute_plan && full)
                withdraw_plan(u, p->map_version);
        }
        if (full && p->map_version < u->map_version) {
            char held[24], got[24];
            snprintf(held, sizeof held, "%" PRIu64, u->map_version);
            snprintf(got, sizeof got, "%" PRIu64, p->map_version);
            prism_log(PRISM_LOG_WARN, "prismd's map is older than the one held; keeping the held map", "held", held,
                      "prismd", got, LOG_END);
        }
        return true;
    }
    if (!full && p->map_version != u->map_version + 1)
        return false;
    if (full) {
        memset(u->map, PRISM_PRECISION_BF16, a->opts.max_blocks);
        u->map_blocks = 0;
    }
    for (size_t i = 0; i < p->n_blocks; i++) {
        const Prism__V1__BlockPrecision *b = p->blocks[i];
        if (b->block_id >= a->opts.max_blocks || (unsigned)b->precision >= PRISM_PRECISION_COUNT) {
            if (atomic_fetch_add_explicit(&a->stats.blocks_out_of_range, 1, memory_order_relaxed) == 0) {
                char id[16];
                snprintf(id, sizeof id, "%u", b->block_id);
                prism_log(PRISM_LOG_WARN, "map entry ignored: block id past --max-blocks or unknown precision",
                          "block", id, LOG_END);
            }
            continue;
        }
        u->map[b->block_id] = (uint8_t)b->precision;
        if (b->block_id + 1 > u->map_blocks)
            u->map_blocks = b->block_id + 1;
    }
    u->map_version = p->map_version;
    if (p->compute_plan)
        write_plan(u, p); /* before the map: see write_plan */
    publish(u, p->decided_step, p->effective_step);
    return true;
}

static void apply_runtime(upstream *u, const Prism__V1__RuntimeHints *h)
{
    prism_runtime_hints r = {
        .map_version = h->map_version,
        .max_inflight_h2d = h->max_inflight_h2d,
        .max_inflight_d2h = h->max_inflight_d2h,
        .prefetch_window = h->prefetch_window,
        .suppress_prefetch_in_backward = h->suppress_prefetch_in_backward,
        .suppress_prefetch_in_optimizer = h->suppress_prefetch_in_optimizer,
        .vram_pressure_threshold = h->vram_pressure_threshold,
    };
    prism_hints_set_runtime(&u->a->hints, &r);
}

/* Takes a PolicyConfig's status and numerics fields (a Welcome's or a ConfigUpdate's, issue 17)
 * into the hint table: calibration_needed and the formats prismd wants calibrated come with it.
 * prismd's calibration_needed speaks of PolicyConfig.low_precision only (for agents older than
 * calibration_formats); calibration is needed when it says so or when any format is wanted.
 * Formats that are not a low prism_precision are left out (a newer prismd's). */
static void take_config(upstream *u, const Prism__V1__PolicyConfig *c, bool calibration_needed,
                        const Prism__V1__Precision *wanted, size_t n_wanted)
{
    agent *a = u->a;
    calibration_needed = calibration_needed || n_wanted > 0;
    u->cal_needed = calibration_needed;
    u->run_calibration = c && c->run_calibration;
    u->cal_samples = c ? c->calibration_samples : 0;
    u->low = c && (unsigned)c->low_precision < PRISM_PRECISION_COUNT ? (prism_precision)c->low_precision
                                                                     : PRISM_PRECISION_INT8;
    prism_hints_numerics n;
    memset(&n, 0, sizeof n);
    if (c) {
        n.scale_mode = (unsigned)c->scale_mode <= PRISM__V1__SCALE_MODE__SCALE_STATIC ? (uint32_t)c->scale_mode : 0;
        n.amax_history_len = c->amax_history_len;
        n.scale_margin = c->scale_margin;
        n.low_auto = c->low_precision_auto ? 1u : 0u;
        for (size_t i = 0; i < c->n_low_formats && n.n_low_formats < PRISM_HINTS_FORMATS_MAX; i++)
            if (c->low_formats[i] > PRISM__V1__PRECISION__BF16 && (unsigned)c->low_formats[i] < PRISM_PRECISION_COUNT)
                n.low_formats[n.n_low_formats++] = (uint8_t)c->low_formats[i];
    }
    for (size_t i = 0; calibration_needed && i < n_wanted && n.n_calibration_formats < PRISM_HINTS_FORMATS_MAX; i++)
        if (wanted[i] > PRISM__V1__PRECISION__BF16 && (unsigned)wanted[i] < PRISM_PRECISION_COUNT)
            n.calibration_formats[n.n_calibration_formats++] = (uint8_t)wanted[i];
    if (calibration_needed && n_wanted == 0)
        n.calibration_formats[n.n_calibration_formats++] = (uint8_t)u->low; /* an older prismd: its one format */
    /* The numerics first: a reader that sees upstream_connected sees this Welcome's numerics. */
    prism_hints_set_numerics(&a->hints, &n);
    prism_hints_set_status(&a->hints, true, u->cal_needed, u->run_calibration, u->cal_samples, u->low);
}

static void on_welcome(upstream *u, stream *s, const Prism__V1__Welcome *w)
{
    agent *a = u->a;
    s->welcomed = true;
    u->failures = 0;
    atomic_store_explicit(&a->stats.backoff_ms, 0, memory_order_relaxed);
    atomic_fetch_add_explicit(&a->stats.upstream_welcomes, 1, memory_order_relaxed);
    atomic_store_explicit(&a->stats.upstream_connected, 1, memory_order_relaxed);
    take_config(u, w->config, w->calibration_needed, w->calibration_formats, w->n_calibration_formats);
    if (w->map)
        apply_update(u, w->map, true);
    if (w->hints)
        apply_runtime(u, w->hints);
    u->acked_version = u->acked_step = 0; /* this stream has not heard what the trainer applied */
    u->counters_sent = false;
    prism_log(PRISM_LOG_INFO, "connected to prismd", "target", a->opts.prismd, "calibration_needed",
              w->calibration_needed ? "true" : "false", LOG_END);
}

static void on_message(upstream *u, stream *s, const uint8_t *data, size_t len)
{
    agent *a = u->a;
    Prism__V1__ServiceMessage *m = prism__v1__service_message__unpack(NULL, len, data);
    if (!m) {
        prism_log(PRISM_LOG_ERROR, "prismd sent a message that does not parse", LOG_END);
        upstream_cancel(u, "unparsable message from prismd");
        return;
    }
    if (m->kind_case >= 1 && m->kind_case <= 5)
        atomic_fetch_add_explicit(&a->stats.messages_received[m->kind_case], 1, memory_order_relaxed);
    switch (m->kind_case) {
    case PRISM__V1__SERVICE_MESSAGE__KIND_WELCOME: on_welcome(u, s, m->welcome); break;
    case PRISM__V1__SERVICE_MESSAGE__KIND_UPDATE:
        if (!apply_update(u, m->update, m->update->full))
            upstream_cancel(u, "a map version was missed; reconnecting for the whole map");
        break;
    case PRISM__V1__SERVICE_MESSAGE__KIND_HINTS: apply_runtime(u, m->hints); break;
    case PRISM__V1__SERVICE_MESSAGE__KIND_CONFIG:
        /* A config a decision applied (issue 17): into the table now, like a Welcome's. */
        if (s->welcomed && m->config->config)
            take_config(u, m->config->config, m->config->calibration_needed, m->config->calibration_formats,
                        m->config->n_calibration_formats);
        break;
    case PRISM__V1__SERVICE_MESSAGE__KIND_ERROR: {
        char code[16];
        snprintf(code, sizeof code, "%u", m->error->code);
        prism_log(PRISM_LOG_ERROR, "prismd reported an error", "code", code, "message",
                  m->error->message ? m->error->message : "", LOG_END);
        break;
    }
    default: break;
    }
    prism__v1__service_message__free_unpacked(m, NULL);
}

/* ---- what goes up ---- */

static void send_message(upstream *u, const Prism__V1__AgentMessage *m)
{
    stream *s = u->live;
    if (!s || !s->welcomed)
        return;
    size_t len = prism__v1__agent_message__get_packed_size(m);
    uint8_t small[256];
    uint8_t *buf = len <= sizeof small ? small : malloc(len);
    if (!buf)
        return;
    prism__v1__agent_message__pack(m, buf);
    stream_queue(s, m->kind_case, buf, len);
    if (buf != small)
        free(buf);
}

/* Reads the hint table's trainer line (one seqlock read) and hands it to /metrics when it
 * changed. A read that found the trainer mid-write keeps the line read last. */
static void refresh_trainer(upstream *u)
{
    prism_hints_trainer line;
    if (!prism_hints_read_trainer(&u->a->hints, &line) || memcmp(&line, &u->line, sizeof line) == 0)
        return;
    u->line = line;
    agent_trainer *t = &u->a->trainer;
    pthread_mutex_lock(&t->mu);
    t->line = line;
    pthread_mutex_unlock(&t->mu);
}

static void send_ack(upstream *u)
{
    uint64_t version = u->line.applied_version, step = u->line.applied_step;
    if (version == 0 || (version == u->acked_version && step == u->acked_step))
        return;
    Prism__V1__Ack ack = PRISM__V1__ACK__INIT;
    ack.map_version = version;
    ack.applied_step = step;
    Prism__V1__AgentMessage m = PRISM__V1__AGENT_MESSAGE__INIT;
    m.kind_case = PRISM__V1__AGENT_MESSAGE__KIND_ACK;
    m.ack = &ack;
    send_message(u, &m);
    u->acked_version = version;
    u->acked_step = step;
}

/* Whether the trainer's counters moved since this stream's last Heartbeat carried them: then a
 * Heartbeat goes at once rather than after --heartbeat-ms of quiet. */
static bool trainer_counters_moved(upstream *u)
{
    return u->line.published && (!u->counters_sent || u->line.reports_dropped != u->sent_dropped ||
                                 u->line.late_switches != u->sent_late);
}

/* A Heartbeat, with the trainer's counters when the agent knows them (DESIGN 12): its dropped
 * reports are the total of every reason. */
static void send_heartbeat(upstream *u)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    Prism__V1__Heartbeat hb = PRISM__V1__HEARTBEAT__INIT;
    hb.unix_time_ms = (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
    hb.last_step = u->last_step;
    if (u->line.published) {
        hb.optional_trainer_reports_dropped_case =
            PRISM__V1__HEARTBEAT__OPTIONAL_TRAINER_REPORTS_DROPPED_TRAINER_REPORTS_DROPPED;
        hb.trainer_reports_dropped = u->line.reports_dropped;
        hb.optional_trainer_late_switches_case =
            PRISM__V1__HEARTBEAT__OPTIONAL_TRAINER_LATE_SWITCHES_TRAINER_LATE_SWITCHES;
        hb.trainer_late_switches = u->line.late_switches;
        u->counters_sent = true;
        u->sent_dropped = u->line.reports_dropped;
        u->sent_late = u->line.late_switches;
    }
    Prism__V1__AgentMessage m = PRISM__V1__AGENT_MESSAGE__INIT;
    m.kind_case = PRISM__V1__AGENT_MESSAGE__KIND_HEARTBEAT;
    m.heartbeat = &hb;
    send_message(u, &m);
}

static void fill_profile(const prism_device_profile *p, Prism__V1__DeviceProfile *d, Prism__V1__LinearCost *q,
                         Prism__V1__LinearCost *c)
{
    d->device_class = (char *)p->device_class;
    d->device_name = (char *)p->device_name;
    d->memory_bytes = p->memory_bytes;
    d->bf16_ops_per_second = p->bf16_ops_per_second;
    d->fp16_ops_per_second = p->fp16_ops_per_second;
    d->int8_ops_per_second = p->int8_ops_per_second;
    d->fp8_ops_per_second = p->fp8_ops_per_second;
    q->fixed_seconds = p->quantize_cost.fixed_seconds;
    q->seconds_per_byte = p->quantize_cost.seconds_per_byte;
    c->fixed_seconds = p->cast_cost.fixed_seconds;
    c->seconds_per_byte = p->cast_cost.seconds_per_byte;
    d->quantize_cost = q;
    d->cast_cost = c;
    d->h2d_bytes_per_second = p->h2d_bytes_per_second;
}

/* The trainer's Hello, completed with the agent's node, token and device. A Hello that differs
 * from the one the live stream began with (another job, rank or layout) restarts the stream. */
static void take_hello(upstream *u, const agent_frame *f)
{
    agent *a = u->a;
    Prism__V1__AgentMessage *m = prism__v1__agent_message__unpack(NULL, f->len, f->data);
    if (!m)
        return; /* checked by the socket thread */
    Prism__V1__Hello *h = m->hello;
    char *trainer_token = h->token;
    h->node = a->opts.node;
    h->token = a->opts.token ? a->opts.token : (char *)"";
    Prism__V1__DeviceProfile dev = PRISM__V1__DEVICE_PROFILE__INIT;
    Prism__V1__LinearCost q = PRISM__V1__LINEAR_COST__INIT, c = PRISM__V1__LINEAR_COST__INIT;
    fill_profile(&a->profile, &dev, &q, &c);
    Prism__V1__DeviceProfile *trainer_device = h->device;
    h->device = &dev;
    size_t len = prism__v1__agent_message__get_packed_size(m);
    uint8_t *buf = malloc(len ? len : 1);
    if (buf)
        prism__v1__agent_message__pack(m, buf);
    h->token = trainer_token;
    h->node = NULL; /* the agent's, not the unpacked message's to free */
    h->device = trainer_device;
    char rank[16];
    snprintf(rank, sizeof rank, "%u", h->rank);
    prism_log(PRISM_LOG_INFO, "trainer said hello", "job", h->job_id ? h->job_id : "", "rank", rank, LOG_END);
    char *job = strdup(h->job_id ? h->job_id : "");
    if (job) { /* for prism_agent_info */
        agent_trainer *t = &a->trainer;
        pthread_mutex_lock(&t->mu);
        free(t->job);
        t->job = job;
        t->rank = h->rank;
        t->said_hello = true;
        pthread_mutex_unlock(&t->mu);
    }
    prism__v1__agent_message__free_unpacked(m, NULL);
    if (!buf)
        return;
    bool same = u->hello && u->hello_len == len && memcmp(u->hello, buf, len) == 0;
    free(u->hello);
    u->hello = buf;
    u->hello_len = len;
    if (!same && u->live)
        upstream_cancel(u, "the trainer said a new Hello");
    if (!same)
        u->next_attempt_ms = 0; /* a new Hello is not a failure: connect now */
}

static void drain_inbox(upstream *u)
{
    agent *a = u->a;
    for (agent_frame *f = agent_inbox_take(&a->inbox), *next; f; f = next) {
        next = f->next;
        if (f->kind == PRISM__V1__AGENT_MESSAGE__KIND_HELLO) {
            take_hello(u, f);
        } else {
            stream *s = u->live;
            bool report = f->kind == PRISM__V1__AGENT_MESSAGE__KIND_STEP_REPORT;
            if (!s || !s->welcomed || s->cancelled) {
                if (report)
                    atomic_fetch_add_explicit(&a->stats.reports_dropped[AGENT_DROP_DISCONNECTED], 1,
                                              memory_order_relaxed);
            } else if (!stream_queue(s, f->kind, f->data, f->len) && report) {
                /* Only step reports are counted: prism_agent_reports_dropped_total's share is taken
                   over prism_agent_reports_received_total, which counts step reports alone. */
                atomic_fetch_add_explicit(&a->stats.reports_dropped[AGENT_DROP_QUEUE_FULL], 1, memory_order_relaxed);
            }
            if (report)
                u->last_step = atomic_load_explicit(&a->stats.last_step, memory_order_relaxed);
        }
        free(f);
    }
}

/* ---- the completion queue ---- */

static void on_status(upstream *u, stream *s)
{
    agent *a = u->a;
    s->ended = true;
    char *details = grpc_slice_to_c_string(s->details);
    char code[16];
    snprintf(code, sizeof code, "%d", (int)s->status);
    if (u->live == s) {
        u->live = NULL;
        atomic_store_explicit(&a->stats.upstream_connected, 0, memory_order_relaxed);
        atomic_fetch_add_explicit(&a->stats.upstream_failures, 1, memory_order_relaxed);
        prism_hints_set_status(&a->hints, false, u->cal_needed, u->run_calibration, u->cal_samples, u->low);
        /* A Welcome resets the count: a stream that worked and then ended is tried again soon. */
        int64_t wait = (int64_t)a->opts.backoff_initial_ms, most = (int64_t)a->opts.backoff_max_ms;
        for (unsigned i = 0; i < u->failures && wait < most; i++)
            wait *= 2;
        if (wait > most)
            wait = most;
        wait = (int64_t)((double)wait * (0.5 + 0.5 * next_uniform(u)));
        if (s->cancelled && !atomic_load(&a->stop))
            wait = 0; /* we ended it on purpose, to start again */
        if (!s->welcomed && !s->cancelled)
            u->failures++;
        u->next_attempt_ms = now_ms() + wait;
        atomic_store_explicit(&a->stats.backoff_ms, (uint64_t)wait, memory_order_relaxed);
        char wait_text[24];
        snprintf(wait_text, sizeof wait_text, "%" PRId64, wait);
        const char *what = s->welcomed ? "stream to prismd ended; keeping the last map"
                                       : "cannot reach prismd; keeping the last map";
        prism_log(s->welcomed || s->cancelled ? PRISM_LOG_INFO : PRISM_LOG_WARN, what, "target", a->opts.prismd, "code", code, "details", details ? details : "", "retry_ms", wait_text,
                  LOG_END);
    }
    gpr_free(details);
}

static void on_event(upstream *u, stream_tag *t, bool ok)
{
    stream *s = t->s;
    agent *a = u->a;
    s->pending--;
    switch (t->kind) {
    case TAG_START:
    case TAG_RECV_MD: break;
    case TAG_STATUS: on_status(u, s); break;
    case TAG_WRITE: {
        s->writing = false;
        outmsg *m = s->head;
        if (m) {
            s->head = m->next;
            if (!s->head)
                s->tail = NULL;
            s->queued_bytes -= m->len;
            if (ok) {
                atomic_fetch_add_explicit(&a->stats.messages_sent[m->kind], 1, memory_order_relaxed);
                atomic_fetch_add_explicit(&a->stats.bytes_sent, m->len, memory_order_relaxed);
            }
            grpc_byte_buffer_destroy(m->bb);
            free(m);
        }
        if (ok)
            stream_pump(s);
        break;
    }
    case TAG_READ:
        if (ok && s->recv) {
            grpc_byte_buffer_reader reader;
            if (grpc_byte_buffer_reader_init(&reader, s->recv)) {
                grpc_slice all = grpc_byte_buffer_reader_readall(&reader);
                grpc_byte_buffer_reader_destroy(&reader);
                on_message(u, s, GRPC_SLICE_START_PTR(all), GRPC_SLICE_LENGTH(all));
                grpc_slice_unref(all);
            }
            grpc_byte_buffer_destroy(s->recv);
            s->recv = NULL;
            if (!s->ended)
                start_read(s);
        }
        break;
    }
    if (s->ended && s->pending == 0) {
        stream_free(s);
        u->streams--;
    }
}

static void process(upstream *u, gpr_timespec deadline)
{
    for (;;) {
        grpc_event ev = grpc_completion_queue_next(u->cq, deadline, NULL);
        if (ev.type != GRPC_OP_COMPLETE)
            return;
        on_event(u, ev.tag, ev.success != 0);
        deadline = gpr_time_0(GPR_CLOCK_MONOTONIC); /* take whatever else is ready, then go on */
    }
}

static grpc_channel *make_channel(const agent_options *o)
{
    grpc_arg args[4];
    args[0] = (grpc_arg){.type = GRPC_ARG_INTEGER, .key = (char *)GRPC_ARG_MAX_RECEIVE_MESSAGE_LENGTH,
                         .value.integer = (int)o->max_message_bytes};
    args[1] = (grpc_arg){.type = GRPC_ARG_INTEGER, .key = (char *)GRPC_ARG_MAX_SEND_MESSAGE_LENGTH,
                         .value.integer = (int)o->max_message_bytes};
    /* The channel's own reconnects follow our backoff, not gRPC's default (up to 120 s). */
    args[2] = (grpc_arg){.type = GRPC_ARG_INTEGER, .key = (char *)GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS,
                         .value.integer = (int)o->backoff_initial_ms};
    args[3] = (grpc_arg){.type = GRPC_ARG_INTEGER, .key = (char *)GRPC_ARG_MAX_RECONNECT_BACKOFF_MS,
                         .value.integer = (int)o->backoff_max_ms};
    grpc_channel_args ch_args = {.num_args = 4, .args = args};
    grpc_channel_credentials *creds =
        o->tls_ca ? grpc_ssl_credentials_create(o->tls_ca, NULL, NULL, NULL) : grpc_insecure_credentials_create();
    grpc_channel *ch = grpc_channel_create(o->prismd, creds, &ch_args);
    grpc_channel_credentials_release(creds);
    return ch;
}

static void *upstream_thread(void *arg)
{
    upstream *u = arg;
    agent *a = u->a;
    int64_t stop_at = 0;
    for (;;) {
        process(u, in_ms(TICK_MS));
        bool stopping = atomic_load(&a->stop);
        if (stopping) {
            if (!stop_at) {
                stop_at = now_ms() + CLOSE_MS;
                if (u->live) {
                    /* Half-close: prismd sees the end of our messages and ends the call. */
                    grpc_op op = {.op = GRPC_OP_SEND_CLOSE_FROM_CLIENT};
                    if (!u->live->writing && !u->live->head)
                        start_batch(u->live, &op, 1, &u->live->t_start);
                    else
                        upstream_cancel(u, "prism-agent is stopping");
                }
            }
            if (u->live && now_ms() >= stop_at && !u->live->cancelled)
                upstream_cancel(u, "prism-agent is stopping");
            if (u->streams == 0)
                break;
            if (now_ms() >= stop_at + CLOSE_MS)
                break; /* a call that never completes: leave it to process exit */
            continue;
        }
        drain_inbox(u);
        refresh_trainer(u);
        if (!u->live && u->hello && now_ms() >= u->next_attempt_ms)
            start_call(u);
        stream *s = u->live;
        if (s && s->welcomed && !s->cancelled) {
            send_ack(u);
            if (now_ms() - u->last_send_ms >= (int64_t)a->opts.heartbeat_ms || trainer_counters_moved(u)) {
                send_heartbeat(u);
                u->last_send_ms = now_ms();
            }
            if (s->head)
                u->last_send_ms = now_ms();
            stream_pump(s);
        }
    }
    prism_hints_set_status(&a->hints, false, u->cal_needed, u->run_calibration, u->cal_samples, u->low);
    atomic_store_explicit(&a->stats.upstream_connected, 0, memory_order_relaxed);
    return u;
}

/* The thread's state lives until the thread returns it; agent_upstream_join frees it. */
static void *upstream_main(void *arg)
{
    upstream *u = upstream_thread(arg);
    grpc_channel_destroy(u->channel);
    grpc_completion_queue_shutdown(u->cq);
    while (grpc_completion_queue_next(u->cq, gpr_inf_future(GPR_CLOCK_REALTIME), NULL).type != GRPC_QUEUE_SHUTDOWN) {
    }
    grpc_completion_queue_destroy(u->cq);
    free(u->hello);
    free(u->map);
    free(u->plan);
    free(u);
    return NULL;
}

prism_status agent_upstream_start(agent *a, pthread_t *thread, prism_error *err)
{
    upstream *u = calloc(1, sizeof *u);
    if (!u || !(u->map = malloc(a->opts.max_blocks)) || !(u->plan = malloc(a->opts.max_blocks))) {
        if (u) {
            free(u->map);
            free(u->plan);
        }
        free(u);
        return prism_error_set(err, PRISM_ERR_NOMEM, "out of memory for the map");
    }
    memset(u->map, PRISM_PRECISION_BF16, a->opts.max_blocks);
    u->a = a;
    u->low = PRISM_PRECISION_INT8;
    /* A restarted agent starts from the newest map its table kept, so prismd's Welcome, which
     * repeats that map, is not taken for a new one. */
    prism_hints_view view;
    if (prism_hints_read(&a->hints, UINT64_MAX, &view, u->map, (uint32_t)a->opts.max_blocks, 64)) {
        u->map_version = view.map_version;
        u->map_blocks = view.n_blocks;
        atomic_store_explicit(&a->stats.map_version, view.map_version, memory_order_relaxed);
        atomic_store_explicit(&a->stats.map_effective_step, view.effective_step, memory_order_relaxed);
        /* The kept map's plan, if the plan file kept it too, is the one in force: the gauges
         * say so until this agent writes another. */
        prism_plans_entry e;
        if (prism_plans_read(&a->plans, view.map_version, &e, u->plan, (uint32_t)a->opts.max_blocks, 64) ==
            PRISM_PLANS_FOUND) {
            atomic_store_explicit(&a->stats.plan_map_version, view.map_version, memory_order_relaxed);
            atomic_store_explicit(&a->stats.plan_low_blocks, e.low_blocks, memory_order_relaxed);
        }
    } else {
        memset(u->map, PRISM_PRECISION_BF16, a->opts.max_blocks); /* a failed read may leave a torn copy */
    }
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    u->rng = ((uint64_t)ts.tv_nsec << 20) ^ (uint64_t)getpid() ^ 0x9e3779b97f4a7c15ull;
    u->cq = grpc_completion_queue_create_for_next(NULL);
    u->channel = make_channel(&a->opts);
    if (!u->cq || !u->channel) {
        if (u->channel)
            grpc_channel_destroy(u->channel);
        if (u->cq)
            grpc_completion_queue_destroy(u->cq);
        free(u->map);
        free(u->plan);
        free(u);
        return prism_error_set(err, PRISM_ERR_UNAVAILABLE, "cannot create the gRPC channel to %s", a->opts.prismd);
    }
    int rc = pthread_create(thread, NULL, upstream_main, u);
    if (rc) {
        grpc_channel_destroy(u->channel);
        grpc_completion_queue_destroy(u->cq);
        free(u->map);
        free(u->plan);
        free(u);
        return prism_error_set(err, PRISM_ERR_NOMEM, "cannot start the upstream thread: %s", strerror(rc));
    }
    return PRISM_OK;
}
