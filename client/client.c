/* libprism's client (include/prism/client.h): the layout and its fingerprint, reports framed as
 * local.h says on a non-blocking Unix socket, and the per-step copy of the hint table.
 *
 * Everything a report needs is allocated at prism_client_register, sized for the layout: the
 * protobuf-c message arrays, the duplicate-id stamps, the statistics of the _cpu variant and the
 * frame buffer. A report only fills them, packs and calls send(2). */
#define _GNU_SOURCE
#include "prism/client.h"

#include "client_ext.h"
#include "hints.h"
#include "local.h"
#include "plans.h"
#include "process_totals.h"
#include "sha256.h"
#include "prism/v1/prism.pb-c.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

_Static_assert(PRISM_FINGERPRINT_BYTES == PRISM_SHA256_BYTES, "a fingerprint is a SHA-256 digest");
_Static_assert(PRISM_CLIENT_MAX_BLOCKS == PRISM_HINTS_MAX_BLOCKS_LIMIT, "one block limit");

/* Seqlock attempts per begin_step. The agent holds the lock for one map copy (microseconds), so
 * a few attempts catch the common case of a read that overlapped the end of a write; more would
 * only spin. */
#define HINT_READ_TRIES 64

/* What the frame in flight is, so that finishing or losing it is counted right. */
typedef enum frame_kind { FRAME_HELLO, FRAME_STEP, FRAME_CALIBRATION } frame_kind;

struct prism_client {
    /* identity and places */
    char *job_id;
    uint32_t rank, world_size;
    uint64_t interval_ms;
    struct sockaddr_un addr;
    char *hints_path;
    char *plans_path;

    /* the registered layout: only what reports and reconnections need */
    bool registered;
    uint32_t n_blocks;
    uint8_t fingerprint[PRISM_FINGERPRINT_BYTES];
    uint8_t *hello;  /* the whole Hello frame, sent first on every connection */
    size_t hello_len;

    /* the connection */
    int fd;                    /* -1: not connected */
    bool attempted;            /* a connection was tried at least once */
    uint64_t next_connect_ms;  /* no attempt before this (CLOCK_MONOTONIC) */
    const uint8_t *pend;       /* the frame in flight (hello or out), NULL when none */
    size_t pend_len, pend_off;
    frame_kind pend_kind;
    uint8_t *out;              /* frame buffer of reports */
    size_t out_cap;

    /* reused by every report */
    Prism__V1__BlockGradStats *gs;
    Prism__V1__BlockGradStats **gs_ptr;
    Prism__V1__BlockError *be;
    Prism__V1__BlockError **be_ptr;
    prism_grad_stats *cpu_stats;
    uint32_t *seen;            /* seen[id] == stamp: id already in this call */
    uint32_t stamp;

    /* tensor statistics staged for the next report written whole (prism_client_stage_tensor_stats) */
    prism_block_tensor_stats *staged; /* n_blocks of room (ids are distinct) */
    size_t n_staged;
    uint64_t staged_gen;       /* +1 at each stage call: a frame in flight clears only its own */
    Prism__V1__BlockTensorStats *ts;
    Prism__V1__BlockTensorStats **ts_ptr;
    size_t pend_ts;            /* entries in the step frame in flight */
    uint64_t pend_ts_gen;      /* the staged_gen they were */

    /* the hint table and the client's copy of the map in use */
    prism_hints hints;
    uint64_t next_hints_ms;
    uint8_t *prec;             /* n_blocks precisions of the map in use */
    uint8_t *prec_next;        /* where the next read goes; swapped with prec on success */
    prism_hints_view view;
    /* the plan file and the compute plan that came with the map in use */
    prism_plans plans;
    uint64_t next_plans_ms;    /* no attempt to map the plan file before this */
    uint64_t plans_seq;        /* the plan file's seq when the plan in use was read (plans.h) */
    bool plan_stale;           /* read the plan of the map in use again (new room, a new file, a write) */
    uint8_t *cprec;            /* n_blocks compute formats: 0 high, else the low precision */
    uint8_t *cprec_next;
    prism_client_plan plan;
    bool stepped;              /* begin_step ran at least once */
    uint64_t last_step;
    /* The trainer line (hints.h) as this client last built it, and whether it is in this table
     * as it stands: begin_step writes it when it changed (or the table is new). */
    prism_hints_trainer line;
    prism_hints_trainer written; /* what was last written (valid when line_written) */
    bool line_written;
    uint64_t dropped_by[PRISM_HINTS_DROP_REASONS]; /* reports_dropped by the reasons it has */
    uint64_t opened_ns;        /* CLOCK_MONOTONIC at open: maps written before are not timed */
    uint64_t lag_version;      /* the newest map whose apply lag was counted */

    prism_client_counters n;
    char last_error[sizeof ((prism_error *)0)->message];
    prism_client_ext ext;      /* client_cuda.c's reports in flight on a GPU stream */
    bool polling;              /* inside ext.poll: its own report does not poll again */
};

static uint64_t now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

static void note_failure(prism_client *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

static void note_failure(prism_client *c, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(c->last_error, sizeof c->last_error, fmt, ap);
    va_end(ap);
}

/* A refused call: counted, and err says why. */
static prism_status refuse(prism_client *c, prism_error *err, prism_status status, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

static prism_status refuse(prism_client *c, prism_error *err, prism_status status, const char *fmt, ...)
{
    if (c)
        c->n.invalid_calls++;
    if (err) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err->message, sizeof err->message, fmt, ap);
        va_end(ap);
        err->status = status;
    }
    return status;
}

/* Strict UTF-8 (no overlong forms, no surrogates, nothing above U+10FFFF): protobuf strings
 * must be valid, and the agent's and prismd's parsers may check. */
static bool utf8_valid(const char *s)
{
    const unsigned char *p = (const unsigned char *)s;
    while (*p) {
        unsigned char b = *p;
        size_t len;
        uint32_t cp, min;
        if (b < 0x80) {
            p++;
            continue;
        } else if ((b & 0xe0) == 0xc0) {
            len = 2, cp = b & 0x1f, min = 0x80;
        } else if ((b & 0xf0) == 0xe0) {
            len = 3, cp = b & 0x0f, min = 0x800;
        } else if ((b & 0xf8) == 0xf0) {
            len = 4, cp = b & 0x07, min = 0x10000;
        } else {
            return false;
        }
        for (size_t i = 1; i < len; i++) {
            if ((p[i] & 0xc0) != 0x80)
                return false;
            cp = cp << 6 | (p[i] & 0x3f);
        }
        if (cp < min || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff))
            return false;
        p += len;
    }
    return true;
}

static bool text_ok(const char *s)
{
    return s && s[0] && utf8_valid(s);
}

/* ---- layout and fingerprint ------------------------------------------------------------- */

static prism_status check_layout(const prism_model_layout *l, prism_error *err)
{
    if (!l)
        return prism_error_set(err, PRISM_ERR_INVALID, "layout: NULL");
    if (!text_ok(l->model_id))
        return prism_error_set(err, PRISM_ERR_INVALID, "model_id: %s",
                               !l->model_id ? "NULL" : !l->model_id[0] ? "empty" : "not valid UTF-8");
    if ((l->quant.format <= PRISM_PRECISION_BF16 || l->quant.format >= PRISM_PRECISION_COUNT) &&
        l->quant.format != PRISM_QUANT_FORMAT_AUTO)
        return prism_error_set(err, PRISM_ERR_INVALID,
                               "quant.format: %d is not a low precision (int8, fp8_e4m3, fp8_e5m2, int4) nor "
                               "PRISM_QUANT_FORMAT_AUTO (255)",
                               (int)l->quant.format);
    if (l->quant.granularity != PRISM_GRANULARITY_TENSOR && l->quant.granularity != PRISM_GRANULARITY_ROW &&
        l->quant.granularity != PRISM_GRANULARITY_BLOCK)
        return prism_error_set(err, PRISM_ERR_INVALID, "quant.granularity: %d is not tensor, row or block",
                               (int)l->quant.granularity);
    if (l->n_blocks == 0 || l->n_blocks > PRISM_CLIENT_MAX_BLOCKS)
        return prism_error_set(err, PRISM_ERR_INVALID, "n_blocks: %u is outside [1, %u]", l->n_blocks,
                               PRISM_CLIENT_MAX_BLOCKS);
    if (!l->blocks)
        return prism_error_set(err, PRISM_ERR_INVALID, "blocks: NULL with n_blocks %u", l->n_blocks);
    for (uint32_t i = 0; i < l->n_blocks; i++) {
        const prism_block_layout *b = &l->blocks[i];
        if (!text_ok(b->name))
            return prism_error_set(err, PRISM_ERR_INVALID, "blocks[%u].name: %s", i,
                                   !b->name ? "NULL" : !b->name[0] ? "empty" : "not valid UTF-8");
        if (b->shape_len > 0 && !b->shape)
            return prism_error_set(err, PRISM_ERR_INVALID, "blocks[%u].shape: NULL with shape_len %zu", i,
                                   b->shape_len);
        size_t tensor = 0;
        for (size_t p = 0; p < b->shape_len; tensor++) {
            uint64_t rank = b->shape[p];
            if (rank > b->shape_len - p - 1)
                return prism_error_set(err, PRISM_ERR_INVALID,
                                       "blocks[%u].shape: tensor %zu has rank %llu but only %zu words follow", i,
                                       tensor, (unsigned long long)rank, b->shape_len - p - 1);
            p += 1 + (size_t)rank;
        }
    }
    return PRISM_OK;
}

static void hash_u32(prism_sha256_ctx *s, uint32_t v)
{
    uint8_t b[4] = {(uint8_t)v, (uint8_t)(v >> 8), (uint8_t)(v >> 16), (uint8_t)(v >> 24)};
    prism_sha256_update(s, b, sizeof b);
}

static void hash_u64(prism_sha256_ctx *s, uint64_t v)
{
    uint8_t b[8];
    for (unsigned i = 0; i < 8; i++)
        b[i] = (uint8_t)(v >> (8 * i));
    prism_sha256_update(s, b, sizeof b);
}

static void hash_text(prism_sha256_ctx *s, const char *text)
{
    size_t len = strlen(text);
    hash_u64(s, len);
    prism_sha256_update(s, text, len);
}

/* The encoding of client.h, on a layout check_layout accepted. */
static void fingerprint_of(const prism_model_layout *l, uint8_t out[PRISM_FINGERPRINT_BYTES])
{
    static const char domain[] = "prism.fingerprint.v1";
    prism_sha256_ctx s;
    prism_sha256_init(&s);
    prism_sha256_update(&s, domain, sizeof domain - 1);
    hash_text(&s, l->model_id);
    hash_u32(&s, (uint32_t)l->quant.format);
    hash_u32(&s, (uint32_t)l->quant.granularity);
    uint64_t k = 0;
    if (l->quant.granularity == PRISM_GRANULARITY_BLOCK)
        k = l->quant.block_size ? l->quant.block_size : PRISM_QUANT_BLOCK_DEFAULT;
    hash_u64(&s, k);
    hash_u32(&s, l->n_blocks);
    for (uint32_t i = 0; i < l->n_blocks; i++) {
        hash_text(&s, l->blocks[i].name);
        hash_u64(&s, l->blocks[i].shape_len);
        for (size_t j = 0; j < l->blocks[i].shape_len; j++)
            hash_u64(&s, l->blocks[i].shape[j]);
    }
    prism_sha256_final(&s, out);
}

prism_status prism_model_fingerprint(const prism_model_layout *layout, uint8_t out[PRISM_FINGERPRINT_BYTES],
                                     prism_error *err)
{
    if (!out)
        return prism_error_set(err, PRISM_ERR_INVALID, "out: NULL");
    prism_status s = check_layout(layout, err);
    if (s != PRISM_OK)
        return s;
    fingerprint_of(layout, out);
    return PRISM_OK;
}

/* ---- the connection --------------------------------------------------------------------- */

/* A report dropped for one of the reasons the agent exports (hints.h's prism_hints_drop). */
static void drop_report(prism_client *c, prism_hints_drop why)
{
    c->n.reports_dropped++;
    c->dropped_by[why]++;
}

static void count_lost_frame(prism_client *c, frame_kind kind)
{
    if (kind == FRAME_STEP)
        drop_report(c, PRISM_HINTS_DROP_CONNECTION_LOST);
    else if (kind == FRAME_CALIBRATION)
        c->n.calibrations_dropped++;
}

static void disconnect(prism_client *c)
{
    close(c->fd);
    c->fd = -1;
    c->n.disconnects++;
    if (c->pend) {
        count_lost_frame(c, c->pend_kind);
        c->pend = NULL;
    }
    /* The agent is gone or restarting: try again one interval from now, at a later call. */
    c->next_connect_ms = now_ms() + c->interval_ms;
}

/* Maps the hint table if it is there; false (counted) when it is not or is not valid. */
static bool open_hints(prism_client *c)
{
    prism_error e;
    if (prism_hints_open(&c->hints, c->hints_path, &e) != PRISM_OK) {
        c->n.hint_open_failures++;
        note_failure(c, "hint table: %s", e.message);
        return false;
    }
    c->line_written = false;
    return true;
}

/* Maps the plan file if it is there (an agent built before plans makes none: then every block
 * runs high); false when it is not, and the next attempt waits a reconnect interval. A missing
 * file is not counted: its absence is normal with an older agent. Any other failure (a file of
 * another layout version, size or kind, a permission) is counted in hint_open_failures and
 * recorded as the last error. A newly mapped file makes the plan of the map in use worth reading
 * again. */
static bool open_plans(prism_client *c)
{
    prism_error e;
    prism_status s = prism_plans_open(&c->plans, c->plans_path, &e);
    if (s != PRISM_OK) {
        c->next_plans_ms = now_ms() + c->interval_ms;
        if (s != PRISM_ERR_NOT_FOUND) {
            c->n.hint_open_failures++;
            note_failure(c, "plan file: %s", e.message);
        }
        return false;
    }
    c->plan_stale = true;
    return true;
}

/* At begin_step, with the hint table mapped: a plan file not mapped yet (an agent upgraded from
 * one without plans while the trainer runs) is tried again once per reconnect interval; a mapped
 * one is looked at with one atomic load (no system call), and a write since the plan in use was
 * read (a plan rewritten or withdrawn for the map in use) makes it worth reading again. */
static void poll_plans(prism_client *c)
{
    if (c->plans.h) {
        if (prism_plans_seq(&c->plans) != c->plans_seq)
            c->plan_stale = true;
    } else if (now_ms() >= c->next_plans_ms) {
        open_plans(c);
    }
}

/* At a new connection: a restarted agent may have replaced the hint table or the plan file (a
 * new file renamed over the path); the old mapping stays valid but is dead, so map the new one.
 * The copies in use stay until the next begin_step reads the new files. */
static void check_hints_file(prism_client *c)
{
    if (c->plans.h && prism_plans_replaced(&c->plans, c->plans_path)) {
        prism_plans_close(&c->plans);
        open_plans(c);
    }
    if (!c->hints.h || !prism_hints_replaced(&c->hints, c->hints_path))
        return;
    prism_hints_close(&c->hints);
    if (open_hints(c))
        c->n.hint_remaps++;
    else
        c->next_hints_ms = now_ms() + c->interval_ms;
}

/* Connects when not connected, registered, and the interval since the last attempt has passed.
 * A new connection starts with Hello in flight. */
static bool ensure_connected(prism_client *c)
{
    if (c->fd >= 0)
        return true;
    if (!c->registered)
        return false;
    uint64_t now = now_ms();
    if (c->attempted && now < c->next_connect_ms)
        return false;
    c->attempted = true;
    c->next_connect_ms = now + c->interval_ms;
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) {
        c->n.connect_failures++;
        note_failure(c, "socket: %s", strerror(errno));
        return false;
    }
    /* A Unix socket connects at once or not at all (EAGAIN: the agent's backlog is full). */
    if (connect(fd, (const struct sockaddr *)&c->addr, sizeof c->addr) != 0) {
        c->n.connect_failures++;
        note_failure(c, "connect %s: %s", c->addr.sun_path, strerror(errno));
        close(fd);
        return false;
    }
    c->fd = fd;
    if (c->n.connects++ > 0)
        c->n.reconnects++;
    c->pend = c->hello;
    c->pend_len = c->hello_len;
    c->pend_off = 0;
    c->pend_kind = FRAME_HELLO;
    check_hints_file(c);
    return true;
}

/* A step frame went out whole: its tensor statistics are sent, and the staged ones are cleared
 * when they are still the ones it carried (not replaced by a later stage call meanwhile). */
static void step_written(prism_client *c)
{
    c->n.reports_sent++;
    if (c->pend_ts == 0)
        return;
    c->n.tensor_stats_sent += c->pend_ts;
    if (c->pend_ts_gen == c->staged_gen)
        c->n_staged = 0;
    c->pend_ts = 0;
}

/* Writes what the socket takes of the frame in flight: 1 when it is done (or there was none),
 * 0 when the socket is full, -1 when the connection was lost. */
static int flush_pending(prism_client *c)
{
    unsigned interrupted = 0;
    while (c->pend && c->pend_off < c->pend_len) {
        ssize_t w = send(c->fd, c->pend + c->pend_off, c->pend_len - c->pend_off, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (w > 0) {
            c->pend_off += (size_t)w;
            c->n.bytes_sent += (uint64_t)w;
            continue;
        }
        if (w < 0 && errno == EINTR && ++interrupted < 8)
            continue;
        if (w == 0 || errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)
            return 0;
        c->n.send_errors++;
        note_failure(c, "send to %s: %s", c->addr.sun_path, strerror(errno));
        disconnect(c);
        return -1;
    }
    if (c->pend) {
        if (c->pend_kind == FRAME_HELLO)
            c->n.hellos_sent++;
        else if (c->pend_kind == FRAME_STEP)
            step_written(c);
        else
            c->n.calibrations_sent++;
        c->pend = NULL;
    }
    return 1;
}

/* Whether a new frame can go out now: connected, and nothing left of an earlier one.
 * PRISM_ERR_UNAVAILABLE (the caller counts the drop, for the reason in *why) otherwise: no
 * connection (the one just lost included: the frame it held is counted as lost with it), or the
 * agent has not read the previous frame. */
static prism_status ready_to_send(prism_client *c, prism_hints_drop *why, prism_error *err)
{
    *why = PRISM_HINTS_DROP_NO_AGENT;
    if (!ensure_connected(c))
        return prism_error_set(err, PRISM_ERR_UNAVAILABLE, "no connection to the agent at %s (%s)",
                               c->addr.sun_path, c->last_error[0] ? c->last_error : "not tried yet");
    int r = flush_pending(c);
    if (r < 0)
        return prism_error_set(err, PRISM_ERR_UNAVAILABLE, "connection to the agent lost: %s", c->last_error);
    *why = PRISM_HINTS_DROP_AGENT_BUSY;
    if (r == 0)
        return prism_error_set(err, PRISM_ERR_UNAVAILABLE,
                               "the agent has not read the previous frame yet (%zu of %zu bytes sent)", c->pend_off,
                               c->pend_len);
    return PRISM_OK;
}

/* Packs msg as a frame into c->out and starts sending it. The report is the caller's to count
 * as dropped on a failure. */
static prism_status send_message(prism_client *c, const Prism__V1__AgentMessage *msg, frame_kind kind,
                                 prism_error *err)
{
    size_t size = protobuf_c_message_get_packed_size(&msg->base);
    if (size > PRISM_LOCAL_MAX_FRAME)
        return prism_error_set(err, PRISM_ERR_LIMIT, "message of %zu bytes exceeds the frame limit of %u bytes",
                               size, PRISM_LOCAL_MAX_FRAME);
    size_t need = PRISM_LOCAL_FRAME_HEADER + size;
    if (need > c->out_cap) {
        uint8_t *grown = realloc(c->out, need);
        if (!grown)
            return prism_error_set(err, PRISM_ERR_NOMEM, "frame buffer of %zu bytes", need);
        c->out = grown;
        c->out_cap = need;
    }
    prism_local_put_len(c->out, (uint32_t)size);
    protobuf_c_message_pack(&msg->base, c->out + PRISM_LOCAL_FRAME_HEADER);
    c->pend = c->out;
    c->pend_len = need;
    c->pend_off = 0;
    c->pend_kind = kind;
    if (flush_pending(c) < 0)
        return prism_error_set(err, PRISM_ERR_UNAVAILABLE, "connection to the agent lost: %s", c->last_error);
    return PRISM_OK;
}

/* send_message for a step frame carrying n_ts staged tensor statistics: the frame in flight
 * remembers them, so that writing it whole counts them and clears what was staged. */
static prism_status send_message_ts(prism_client *c, const Prism__V1__AgentMessage *msg, size_t n_ts,
                                    prism_error *err)
{
    c->pend_ts = n_ts;
    c->pend_ts_gen = c->staged_gen;
    prism_status s = send_message(c, msg, FRAME_STEP, err);
    if (s != PRISM_OK && s != PRISM_ERR_UNAVAILABLE)
        c->pend_ts = 0; /* never packed: nothing in flight */
    return s;
}

/* ---- open, register, close -------------------------------------------------------------- */

prism_status prism_client_open(const prism_client_options *o, prism_client **out, prism_error *err)
{
    if (!out)
        return prism_error_set(err, PRISM_ERR_INVALID, "out: NULL");
    *out = NULL;
    if (!o)
        return prism_error_set(err, PRISM_ERR_INVALID, "options: NULL");
    const char *dir = o->dir;
    if (!dir) {
        dir = getenv("PRISM_AGENT_DIR");
        if (!dir || !dir[0])
            dir = ".";
    }
    if (!dir[0])
        return prism_error_set(err, PRISM_ERR_INVALID, "dir: empty");
    const char *socket_name = o->socket_name ? o->socket_name : PRISM_LOCAL_SOCKET_NAME;
    const char *hints_name = o->hints_name ? o->hints_name : PRISM_LOCAL_HINTS_NAME;
    if (!socket_name[0])
        return prism_error_set(err, PRISM_ERR_INVALID, "socket_name: empty");
    if (!hints_name[0])
        return prism_error_set(err, PRISM_ERR_INVALID, "hints_name: empty");
    const char *job_id = o->job_id ? o->job_id : getenv("PRISM_JOB_ID");
    if (!text_ok(job_id))
        return prism_error_set(err, PRISM_ERR_INVALID, "job_id: %s",
                               !job_id ? "not set (options.job_id or $PRISM_JOB_ID)"
                               : !job_id[0] ? "empty"
                                            : "not valid UTF-8");
    uint32_t world_size = o->world_size ? o->world_size : 1;
    if (o->rank >= world_size)
        return prism_error_set(err, PRISM_ERR_INVALID, "rank: %u is not below world_size %u", o->rank, world_size);

    prism_client *c = calloc(1, sizeof *c);
    if (!c)
        return prism_error_set(err, PRISM_ERR_NOMEM, "client");
    c->fd = -1;
    c->hints.fd = -1;
    c->rank = o->rank;
    c->world_size = world_size;
    c->interval_ms = o->reconnect_interval_ms ? o->reconnect_interval_ms : PRISM_CLIENT_RECONNECT_MS_DEFAULT;
    c->addr.sun_family = AF_UNIX;
    int len = snprintf(c->addr.sun_path, sizeof c->addr.sun_path, "%s/%s", dir, socket_name);
    if (len < 0 || (size_t)len >= sizeof c->addr.sun_path) {
        free(c);
        return prism_error_set(err, PRISM_ERR_INVALID,
                               "dir: the socket path %s/%s is %d bytes, a Unix socket address holds at most %zu",
                               dir, socket_name, len, sizeof c->addr.sun_path - 1);
    }
    size_t hints_len = strlen(dir) + 1 + strlen(hints_name) + 1;
    c->hints_path = malloc(hints_len);
    c->job_id = strdup(job_id);
    if (!c->hints_path || !c->job_id) {
        prism_client_close(c);
        return prism_error_set(err, PRISM_ERR_NOMEM, "client paths");
    }
    snprintf(c->hints_path, hints_len, "%s/%s", dir, hints_name);
    size_t plans_len = hints_len + strlen(PRISM_LOCAL_PLANS_SUFFIX);
    c->plans_path = malloc(plans_len);
    if (!c->plans_path) {
        prism_client_close(c);
        return prism_error_set(err, PRISM_ERR_NOMEM, "client paths");
    }
    snprintf(c->plans_path, plans_len, "%s/%s%s", dir, hints_name, PRISM_LOCAL_PLANS_SUFFIX);
    c->plans.fd = -1;
    c->opened_ns = prism_totals_now_ns();
    /* The plan file first: an agent creates it before the hint table, so a trainer that finds
     * the table finds it too. */
    open_plans(c);
    if (!open_hints(c))
        c->next_hints_ms = now_ms() + c->interval_ms;
    *out = c;
    return PRISM_OK;
}

void prism_client_close(prism_client *c)
{
    if (!c)
        return;
    if (c->ext.destroy)
        c->ext.destroy(c->ext.state);
    if (c->fd >= 0)
        close(c->fd);
    prism_hints_close(&c->hints);
    prism_plans_close(&c->plans);
    free(c->job_id);
    free(c->hints_path);
    free(c->plans_path);
    free(c->hello);
    free(c->out);
    free(c->gs);
    free(c->gs_ptr);
    free(c->be);
    free(c->be_ptr);
    free(c->cpu_stats);
    free(c->seen);
    free(c->prec);
    free(c->prec_next);
    free(c->cprec);
    free(c->cprec_next);
    free(c->staged);
    free(c->ts);
    free(c->ts_ptr);
    free(c);
}

/* The Hello frame of a checked layout, into c->hello. */
static prism_status encode_hello(prism_client *c, const prism_model_layout *l, prism_error *err)
{
    Prism__V1__BlockInfo *info = calloc(l->n_blocks, sizeof *info);
    Prism__V1__BlockInfo **info_ptr = calloc(l->n_blocks, sizeof *info_ptr);
    prism_status s = PRISM_OK;
    if (!info || !info_ptr) {
        s = prism_error_set(err, PRISM_ERR_NOMEM, "Hello of %u blocks", l->n_blocks);
        goto done;
    }
    for (uint32_t i = 0; i < l->n_blocks; i++) {
        prism__v1__block_info__init(&info[i]);
        info[i].id = i;
        info[i].name = (char *)l->blocks[i].name;
        info[i].param_bytes_bf16 = l->blocks[i].param_bytes_bf16;
        info[i].n_shape = l->blocks[i].shape_len;
        info[i].shape = (uint64_t *)l->blocks[i].shape;
        info[i].flops = l->blocks[i].flops;
        info[i].activation_bytes_bf16 = l->blocks[i].activation_bytes_bf16;
        info[i].state_bytes = l->blocks[i].state_bytes;
        info_ptr[i] = &info[i];
    }
    Prism__V1__ModelLayout layout = PRISM__V1__MODEL_LAYOUT__INIT;
    layout.fingerprint.len = PRISM_FINGERPRINT_BYTES;
    layout.fingerprint.data = c->fingerprint;
    layout.model_id = (char *)l->model_id;
    layout.n_blocks = l->n_blocks;
    layout.blocks = info_ptr;
    Prism__V1__Hello hello = PRISM__V1__HELLO__INIT;
    hello.job_id = c->job_id;
    hello.rank = c->rank;
    hello.world_size = c->world_size;
    hello.layout = &layout;
    Prism__V1__AgentMessage msg = PRISM__V1__AGENT_MESSAGE__INIT;
    msg.kind_case = PRISM__V1__AGENT_MESSAGE__KIND_HELLO;
    msg.hello = &hello;
    size_t size = protobuf_c_message_get_packed_size(&msg.base);
    if (size > PRISM_LOCAL_MAX_FRAME) {
        s = prism_error_set(err, PRISM_ERR_LIMIT, "layout: its Hello is %zu bytes, a frame holds at most %u", size,
                            PRISM_LOCAL_MAX_FRAME);
        goto done;
    }
    c->hello = malloc(PRISM_LOCAL_FRAME_HEADER + size);
    if (!c->hello) {
        s = prism_error_set(err, PRISM_ERR_NOMEM, "Hello frame of %zu bytes", size);
        goto done;
    }
    prism_local_put_len(c->hello, (uint32_t)size);
    protobuf_c_message_pack(&msg.base, c->hello + PRISM_LOCAL_FRAME_HEADER);
    c->hello_len = PRISM_LOCAL_FRAME_HEADER + size;
done:
    free(info);
    free(info_ptr);
    return s;
}

/* The largest StepReport frame of n blocks, with tensor statistics for each: every field at its
 * longest varint or fixed size. */
static size_t step_frame_bound(uint32_t n)
{
    const size_t per_block = 2 + 10 /* len */ + 6 /* block_id */ + 4 * 9 /* doubles */ + 2 * 11 /* u64 */;
    const size_t per_tensor_stats = 2 + 10 /* len */ + 6 /* block_id */ + 4 * 9 /* doubles */ + 3 * 11 /* u64 */;
    return PRISM_LOCAL_FRAME_HEADER + 2 + 10 + 11 /* step */ + 9 /* loss */ +
           (size_t)n * (per_block + per_tensor_stats);
}

static void free_arrays(prism_client *c)
{
    free(c->gs), c->gs = NULL;
    free(c->gs_ptr), c->gs_ptr = NULL;
    free(c->be), c->be = NULL;
    free(c->be_ptr), c->be_ptr = NULL;
    free(c->cpu_stats), c->cpu_stats = NULL;
    free(c->seen), c->seen = NULL;
    free(c->prec), c->prec = NULL;
    free(c->prec_next), c->prec_next = NULL;
    free(c->cprec), c->cprec = NULL;
    free(c->cprec_next), c->cprec_next = NULL;
    free(c->staged), c->staged = NULL;
    free(c->ts), c->ts = NULL;
    free(c->ts_ptr), c->ts_ptr = NULL;
    free(c->hello), c->hello = NULL;
}

/* Makes the trainer line (hints.h) from the client's counters and the process totals of the
 * transfers and collectives, and writes it into the table when it changed since it was last
 * written there. On the training path: copies and relaxed loads, no system call. */
static void publish_line(prism_client *c)
{
    if (!c->hints.h)
        return;
    prism_hints_trainer *l = &c->line;
    l->published = 2;
    l->reports_dropped = c->n.reports_dropped;
    l->late_switches = c->n.late_switches;
    l->ext.reports_sent = c->n.reports_sent;
    memcpy(l->ext.dropped, c->dropped_by, sizeof l->ext.dropped);
    prism_process_totals t;
    prism_totals_read(&t);
    memcpy(l->ext.transfers, t.transfers, sizeof t.transfers);
    memcpy(l->ext.transfer_bytes, t.transfer_bytes, sizeof t.transfer_bytes);
    memcpy(l->ext.transfer_bf16_bytes, t.transfer_bf16_bytes, sizeof t.transfer_bf16_bytes);
    memcpy(l->ext.allreduce_calls, t.collective_calls, sizeof t.collective_calls);
    memcpy(l->ext.allreduce_wire_bytes, t.collective_wire_bytes, sizeof t.collective_wire_bytes);
    memcpy(l->ext.allreduce_bf16_bytes, t.collective_bf16_bytes, sizeof t.collective_bf16_bytes);
    memcpy(l->ext.allreduce_ns, t.collective_ns, sizeof t.collective_ns);
    if (c->line_written && memcmp(&c->written, l, sizeof *l) == 0)
        return;
    prism_hints_write_trainer(&c->hints, l);
    c->written = *l;
    c->line_written = true;
}

/* The apply lag of a map this client uses for the first time: from the agent writing it to now
 * (one clock_gettime(CLOCK_MONOTONIC), a vDSO call: no system call). Maps without a write time
 * (an older agent) and maps written before the client opened (a restarted trainer finding the
 * map already there: no arrival to time) are not counted. */
static void count_apply_lag(prism_client *c, const prism_hints_view *v)
{
    if (v->map_version <= c->lag_version || v->written_ns == 0 || v->written_ns < c->opened_ns)
        return;
    c->lag_version = v->map_version;
    uint64_t now = prism_totals_now_ns();
    uint64_t lag = now > v->written_ns ? now - v->written_ns : 0;
    c->line.ext.lag_buckets[prism_hints_lag_bucket(lag)]++;
    c->line.ext.lag_count++;
    c->line.ext.lag_sum_ns += lag;
}

/* Reads the compute plan of map `version` into cprec_next and *plan (plans.h): the plan file
 * mapped when it was not (at most once per reconnect interval). False when the file was
 * mid-write in every try: the caller keeps the map in use too, so that map and plan switch
 * together. */
static bool read_plan(prism_client *c, uint64_t version, prism_client_plan *plan)
{
    uint32_t cap = c->registered ? c->n_blocks : 0;
    memset(plan, 0, sizeof *plan);
    plan->low_format = PRISM_PRECISION_BF16;
    plan->map_version = version;
    if (!c->plans.h && now_ms() >= c->next_plans_ms)
        open_plans(c);
    prism_plans_entry e;
    prism_plans_found found = PRISM_PLANS_NONE;
    uint64_t seq = prism_plans_seq(&c->plans); /* before the read: a write during it reads again */
    if (c->plans.h && version != 0)
        found = prism_plans_read(&c->plans, version, &e, c->cprec_next, cap, HINT_READ_TRIES);
    if (found == PRISM_PLANS_INCONSISTENT)
        return false;
    c->plans_seq = seq;
    if (found == PRISM_PLANS_NONE) {
        if (cap > 0)
            memset(c->cprec_next, 0, cap);
        return true;
    }
    plan->has_plan = true;
    plan->high_fp16 = e.high_fp16 != 0;
    plan->low_format = (prism_precision)e.low_format;
    plan->low_blocks = e.low_blocks;
    plan->predicted_iteration_seconds = e.predicted_iteration_seconds;
    plan->compute_seconds = e.compute_seconds;
    _Static_assert(sizeof plan->device_class <= sizeof e.device_class, "device class room");
    memcpy(plan->device_class, e.device_class, sizeof plan->device_class - 1);
    plan->device_class[sizeof plan->device_class - 1] = '\0';
    return true;
}

/* Reads the table into prec_next and, when the map changes (or the plan of the map in use must
 * be read again), the plan file into cprec_next; on success both become the ones in use. prev:
 * the step of the previous begin_step (NULL: none), for counting a newer map that arrived after
 * its effective step had begun as a late switch. */
static uint64_t read_map(prism_client *c, uint64_t step, const uint64_t *prev)
{
    prism_hints_view v;
    if (!prism_hints_read(&c->hints, step, &v, c->prec_next, c->registered ? c->n_blocks : 0, HINT_READ_TRIES)) {
        c->n.hint_read_failures++;
        return c->view.map_version;
    }
    bool changed = v.map_version != c->view.map_version;
    if (changed || c->plan_stale) {
        prism_client_plan plan;
        if (!read_plan(c, v.map_version, &plan)) {
            c->n.hint_read_failures++; /* the plan file mid-write: map and plan next time */
            return c->view.map_version;
        }
        if (plan.has_plan && (!c->plan.has_plan || c->plan.map_version != plan.map_version))
            c->n.plans_applied++;
        c->plan = plan;
        c->plan_stale = false;
        uint8_t *ct = c->cprec;
        c->cprec = c->cprec_next;
        c->cprec_next = ct;
    }
    c->n.hint_reads++;
    uint8_t *t = c->prec;
    c->prec = c->prec_next;
    c->prec_next = t;
    if (v.map_version > c->view.map_version && prev && *prev >= v.effective_step)
        c->n.late_switches++;
    c->view = v;
    if (changed) {
        c->line.applied_version = v.map_version;
        c->line.applied_step = step;
        count_apply_lag(c, &v);
    } else if (!c->line_written) {
        c->line.applied_step = step; /* a new table: the version in use from here on */
    }
    return v.map_version;
}

prism_status prism_client_register(prism_client *c, const prism_model_layout *layout, prism_error *err)
{
    if (!c)
        return refuse(c, err, PRISM_ERR_INVALID, "client: NULL");
    if (c->registered)
        return refuse(c, err, PRISM_ERR_STATE, "layout: already registered (once per client)");
    prism_status s = check_layout(layout, err);
    if (s != PRISM_OK) {
        c->n.invalid_calls++;
        return s;
    }
    fingerprint_of(layout, c->fingerprint);
    uint32_t n = layout->n_blocks;
    s = encode_hello(c, layout, err);
    if (s != PRISM_OK) {
        c->n.invalid_calls += s == PRISM_ERR_LIMIT;
        return s;
    }
    c->gs = calloc(n, sizeof *c->gs);
    c->gs_ptr = calloc(n, sizeof *c->gs_ptr);
    c->be = calloc(n, sizeof *c->be);
    c->be_ptr = calloc(n, sizeof *c->be_ptr);
    c->cpu_stats = calloc(n, sizeof *c->cpu_stats);
    c->seen = calloc(n, sizeof *c->seen);
    c->prec = calloc(n, 1); /* zeros: bf16 */
    c->prec_next = calloc(n, 1);
    c->cprec = calloc(n, 1); /* zeros: high */
    c->cprec_next = calloc(n, 1);
    c->staged = calloc(n, sizeof *c->staged);
    c->ts = calloc(n, sizeof *c->ts);
    c->ts_ptr = calloc(n, sizeof *c->ts_ptr);
    size_t bound = step_frame_bound(n);
    if (bound > c->out_cap) {
        uint8_t *grown = realloc(c->out, bound);
        if (grown) {
            c->out = grown;
            c->out_cap = bound;
        }
    }
    if (!c->gs || !c->gs_ptr || !c->be || !c->be_ptr || !c->cpu_stats || !c->seen || !c->prec || !c->prec_next ||
        !c->cprec || !c->cprec_next || !c->staged || !c->ts || !c->ts_ptr || c->out_cap < bound) {
        free_arrays(c);
        return prism_error_set(err, PRISM_ERR_NOMEM, "report buffers for %u blocks", n);
    }
    for (uint32_t i = 0; i < n; i++) {
        prism__v1__block_grad_stats__init(&c->gs[i]);
        prism__v1__block_error__init(&c->be[i]);
        prism__v1__block_tensor_stats__init(&c->ts[i]);
    }
    c->n_blocks = n;
    c->registered = true;
    c->plan_stale = true; /* the copy so far had no room for the blocks */
    if (c->stepped && c->hints.h) {
        read_map(c, c->last_step, NULL); /* the copy so far had no room for the blocks */
        publish_line(c);
    }
    if (ensure_connected(c))
        flush_pending(c);
    return PRISM_OK;
}

prism_status prism_client_fingerprint(const prism_client *c, uint8_t out[PRISM_FINGERPRINT_BYTES], prism_error *err)
{
    if (!c || !out)
        return prism_error_set(err, PRISM_ERR_INVALID, "%s: NULL", !c ? "client" : "out");
    if (!c->registered)
        return prism_error_set(err, PRISM_ERR_STATE, "fingerprint: no layout registered");
    memcpy(out, c->fingerprint, PRISM_FINGERPRINT_BYTES);
    return PRISM_OK;
}

/* ---- reports ---------------------------------------------------------------------------- */

/* Checks ids (NULL: 0 .. n-1) against the layout, each at most once. */
static prism_status check_block_ids(prism_client *c, const uint32_t *ids, size_t n, const char *what,
                                    prism_error *err)
{
    if (n > c->n_blocks)
        return refuse(c, err, PRISM_ERR_INVALID, "%s: %zu blocks, the registered layout has %u", what, n,
                      c->n_blocks);
    if (!ids)
        return PRISM_OK;
    if (++c->stamp == 0) {
        memset(c->seen, 0, (size_t)c->n_blocks * sizeof *c->seen);
        c->stamp = 1;
    }
    for (size_t i = 0; i < n; i++) {
        if (ids[i] >= c->n_blocks)
            return refuse(c, err, PRISM_ERR_INVALID,
                          "block_ids[%zu]: block %u is not in the registered layout (%u blocks)", i, ids[i],
                          c->n_blocks);
        if (c->seen[ids[i]] == c->stamp)
            return refuse(c, err, PRISM_ERR_INVALID, "block_ids[%zu]: block %u appears twice", i, ids[i]);
        c->seen[ids[i]] = c->stamp;
    }
    return PRISM_OK;
}

/* Sends what an extension has ready (a GPU report whose copy finished). Reentrant calls (the
 * extension reporting through prism_client_report_step) do not poll again. */
static void poll_extension(prism_client *c)
{
    if (!c->ext.poll || c->polling)
        return;
    c->polling = true;
    c->ext.poll(c, c->ext.state);
    c->polling = false;
}

static prism_status check_report_state(prism_client *c, prism_error *err)
{
    if (!c)
        return refuse(c, err, PRISM_ERR_INVALID, "client: NULL");
    poll_extension(c);
    if (!c->registered)
        return refuse(c, err, PRISM_ERR_STATE, "no layout registered (call prism_client_register first)");
    return PRISM_OK;
}

prism_client_ext *prism_client_extension(prism_client *c)
{
    return &c->ext;
}

prism_status prism_client_check_report(prism_client *c, const uint32_t *block_ids, size_t n, prism_error *err)
{
    prism_status s = check_report_state(c, err);
    if (s != PRISM_OK)
        return s;
    return check_block_ids(c, block_ids, n, "blocks", err);
}

void prism_client_note_dropped(prism_client *c, prism_hints_drop reason, const char *why)
{
    drop_report(c, reason);
    note_failure(c, "%s", why);
}

prism_hints_drop prism_client_send_drop_reason(prism_status s)
{
    return s == PRISM_ERR_LIMIT ? PRISM_HINTS_DROP_TOO_BIG : PRISM_HINTS_DROP_NO_MEMORY;
}

/* The common path of every report_step variant: arguments checked, ready_to_send said yes. */
static prism_status send_step(prism_client *c, uint64_t step, const double *loss, const uint32_t *ids,
                              const prism_grad_stats *stats, const prism_block_fractions *fractions, size_t n,
                              prism_error *err)
{
    for (size_t i = 0; i < n; i++) {
        Prism__V1__BlockGradStats *g = &c->gs[i];
        /* Both figures or neither (a NaN pair: not measured); checked by check_fractions. */
        bool frac = fractions && !isnan(fractions[i].saturated);
        g->optional_saturated_fraction_case =
            frac ? PRISM__V1__BLOCK_GRAD_STATS__OPTIONAL_SATURATED_FRACTION_SATURATED_FRACTION
                 : PRISM__V1__BLOCK_GRAD_STATS__OPTIONAL_SATURATED_FRACTION__NOT_SET;
        g->saturated_fraction = frac ? fractions[i].saturated : 0.0;
        g->optional_underflowed_fraction_case =
            frac ? PRISM__V1__BLOCK_GRAD_STATS__OPTIONAL_UNDERFLOWED_FRACTION_UNDERFLOWED_FRACTION
                 : PRISM__V1__BLOCK_GRAD_STATS__OPTIONAL_UNDERFLOWED_FRACTION__NOT_SET;
        g->underflowed_fraction = frac ? fractions[i].underflowed : 0.0;
        g->block_id = ids ? ids[i] : (uint32_t)i;
        g->l2_norm = stats[i].l2_norm;
        g->max_abs = stats[i].max_abs;
        g->mean = stats[i].mean;
        g->variance = stats[i].variance;
        g->numel = stats[i].numel;
        g->nonfinite = stats[i].nonfinite;
        c->gs_ptr[i] = g;
    }
    Prism__V1__StepReport report = PRISM__V1__STEP_REPORT__INIT;
    report.step = step;
    if (loss) {
        report.optional_loss_case = PRISM__V1__STEP_REPORT__OPTIONAL_LOSS_LOSS;
        report.loss = *loss;
    }
    report.n_blocks = n;
    report.blocks = c->gs_ptr;
    for (size_t i = 0; i < c->n_staged; i++) {
        const prism_block_tensor_stats *t = &c->staged[i];
        Prism__V1__BlockTensorStats *m = &c->ts[i];
        m->block_id = t->block_id;
        m->x_l2 = t->x_l2;
        m->x_max_abs = t->x_max_abs;
        m->x_numel = t->x_numel;
        m->w_l2 = t->w_l2;
        m->w_max_abs = t->w_max_abs;
        m->w_numel = t->w_numel;
        m->y_numel = t->y_numel;
        c->ts_ptr[i] = m;
    }
    report.n_tensor_stats = c->n_staged;
    report.tensor_stats = c->ts_ptr;
    Prism__V1__AgentMessage msg = PRISM__V1__AGENT_MESSAGE__INIT;
    msg.kind_case = PRISM__V1__AGENT_MESSAGE__KIND_STEP_REPORT;
    msg.step_report = &report;
    /* The frame carries them from here; counted (and cleared) when it is written whole. */
    c->pend_ts = 0;
    prism_status s = send_message_ts(c, &msg, c->n_staged, err);
    if (s != PRISM_OK && s != PRISM_ERR_UNAVAILABLE) /* UNAVAILABLE: counted with the lost frame */
        drop_report(c, prism_client_send_drop_reason(s));
    return s;
}

prism_status prism_client_stage_tensor_stats(prism_client *c, const prism_block_tensor_stats *stats, size_t n,
                                             prism_error *err)
{
    if (!c)
        return refuse(c, err, PRISM_ERR_INVALID, "client: NULL");
    if (!c->registered)
        return refuse(c, err, PRISM_ERR_STATE, "no layout registered (call prism_client_register first)");
    if (n > 0 && !stats)
        return refuse(c, err, PRISM_ERR_INVALID, "stats: NULL with n %zu", n);
    if (n > c->n_blocks)
        return refuse(c, err, PRISM_ERR_INVALID, "n: %zu entries, the registered layout has %u blocks", n,
                      c->n_blocks);
    if (++c->stamp == 0) {
        memset(c->seen, 0, (size_t)c->n_blocks * sizeof *c->seen);
        c->stamp = 1;
    }
    for (size_t i = 0; i < n; i++) {
        const prism_block_tensor_stats *t = &stats[i];
        if (t->block_id >= c->n_blocks)
            return refuse(c, err, PRISM_ERR_INVALID,
                          "stats[%zu].block_id: block %u is not in the registered layout (%u blocks)", i, t->block_id,
                          c->n_blocks);
        if (c->seen[t->block_id] == c->stamp)
            return refuse(c, err, PRISM_ERR_INVALID, "stats[%zu].block_id: block %u appears twice", i, t->block_id);
        c->seen[t->block_id] = c->stamp;
        if (t->reserved != 0)
            return refuse(c, err, PRISM_ERR_INVALID, "stats[%zu].reserved: %u, must be 0", i, t->reserved);
        const struct {
            const char *name;
            double v;
        } figures[] = {{"x_l2", t->x_l2}, {"x_max_abs", t->x_max_abs}, {"w_l2", t->w_l2}, {"w_max_abs", t->w_max_abs}};
        for (size_t f = 0; f < sizeof figures / sizeof figures[0]; f++)
            if (!isfinite(figures[f].v) || figures[f].v < 0)
                return refuse(c, err, PRISM_ERR_INVALID, "stats[%zu].%s: %g is not a finite figure >= 0", i,
                              figures[f].name, figures[f].v);
    }
    if (n > 0)
        memcpy(c->staged, stats, n * sizeof *stats);
    c->n_staged = n;
    c->staged_gen++;
    return PRISM_OK;
}

/* Each entry of fractions (NULL: none) is a pair of finite fractions in [0, 1] or a pair of
 * NaNs; PRISM_ERR_INVALID naming the entry and its block otherwise. */
static prism_status check_fractions(prism_client *c, const prism_block_fractions *fractions, const uint32_t *ids,
                                    size_t n, prism_error *err)
{
    for (size_t i = 0; fractions && i < n; i++) {
        uint32_t id = ids ? ids[i] : (uint32_t)i;
        const prism_block_fractions *f = &fractions[i];
        if (isnan(f->saturated) != isnan(f->underflowed))
            return refuse(c, err, PRISM_ERR_INVALID,
                          "fractions[%zu] (block %u): saturated %g and underflowed %g: both NaN (not measured) or "
                          "neither", i, id, f->saturated, f->underflowed);
        if (isnan(f->saturated))
            continue;
        const char *name = !(f->saturated >= 0 && f->saturated <= 1) ? "saturated" : "underflowed";
        double v = name[0] == 's' ? f->saturated : f->underflowed;
        if (!(v >= 0 && v <= 1) || !(f->underflowed >= 0 && f->underflowed <= 1))
            return refuse(c, err, PRISM_ERR_INVALID, "fractions[%zu].%s (block %u): %g is not a fraction in [0, 1]",
                          i, name, id, v);
    }
    return PRISM_OK;
}

prism_status prism_client_check_fractions(prism_client *c, const prism_block_fractions *fractions,
                                          const uint32_t *block_ids, size_t n, prism_error *err)
{
    return check_fractions(c, fractions, block_ids, n, err);
}

prism_status prism_client_report_step(prism_client *c, uint64_t step, const double *loss, const uint32_t *block_ids,
                                      const prism_grad_stats *stats, size_t n, prism_error *err)
{
    return prism_client_report_step_ex(c, step, loss, block_ids, stats, NULL, n, err);
}

prism_status prism_client_report_step_ex(prism_client *c, uint64_t step, const double *loss,
                                         const uint32_t *block_ids, const prism_grad_stats *stats,
                                         const prism_block_fractions *fractions, size_t n, prism_error *err)
{
    prism_status s = check_report_state(c, err);
    if (s != PRISM_OK)
        return s;
    if (n > 0 && (!block_ids || !stats))
        return refuse(c, err, PRISM_ERR_INVALID, "%s: NULL with n %zu", !block_ids ? "block_ids" : "stats", n);
    s = check_block_ids(c, block_ids, n, "n", err);
    if (s != PRISM_OK)
        return s;
    s = check_fractions(c, fractions, block_ids, n, err);
    if (s != PRISM_OK)
        return s;
    prism_hints_drop why;
    s = ready_to_send(c, &why, err);
    if (s != PRISM_OK) {
        drop_report(c, why);
        prism_error_prefix(err, "step %llu dropped", (unsigned long long)step);
        return s;
    }
    s = send_step(c, step, loss, block_ids, stats, fractions, n, err);
    if (s != PRISM_OK)
        prism_error_prefix(err, "step %llu dropped", (unsigned long long)step);
    return s;
}

prism_status prism_client_report_step_cpu(prism_client *c, uint64_t step, const double *loss,
                                          const prism_tensor *tensors, const size_t *block_start,
                                          const uint32_t *block_ids, size_t blocks, prism_error *err)
{
    return prism_client_report_step_cpu_ex(c, step, loss, tensors, block_start, block_ids, NULL, blocks, err);
}

prism_status prism_client_report_step_cpu_ex(prism_client *c, uint64_t step, const double *loss,
                                             const prism_tensor *tensors, const size_t *block_start,
                                             const uint32_t *block_ids, const prism_block_fractions *fractions,
                                             size_t blocks, prism_error *err)
{
    prism_status s = check_report_state(c, err);
    if (s != PRISM_OK)
        return s;
    if (!block_start)
        return refuse(c, err, PRISM_ERR_INVALID, "block_start: NULL");
    s = check_block_ids(c, block_ids, blocks, "blocks", err);
    if (s != PRISM_OK)
        return s;
    s = check_fractions(c, fractions, block_ids, blocks, err);
    if (s != PRISM_OK)
        return s;
    /* Not worth the kernels' time when the report would be dropped. */
    prism_hints_drop why;
    s = ready_to_send(c, &why, err);
    if (s != PRISM_OK) {
        drop_report(c, why);
        prism_error_prefix(err, "step %llu dropped", (unsigned long long)step);
        return s;
    }
    s = prism_grad_stats_blocks_cpu(tensors, block_start, blocks, c->cpu_stats, err);
    if (s != PRISM_OK) {
        c->n.invalid_calls++;
        drop_report(c, PRISM_HINTS_DROP_STATS_FAILED);
        return s;
    }
    s = send_step(c, step, loss, block_ids, c->cpu_stats, fractions, blocks, err);
    if (s != PRISM_OK)
        prism_error_prefix(err, "step %llu dropped", (unsigned long long)step);
    return s;
}

prism_status prism_client_report_calibration(prism_client *c, prism_precision format, uint32_t samples,
                                             const uint32_t *block_ids, const double *errors, size_t n,
                                             prism_error *err)
{
    prism_status s = check_report_state(c, err);
    if (s != PRISM_OK)
        return s;
    if (format <= PRISM_PRECISION_BF16 || format >= PRISM_PRECISION_COUNT)
        return refuse(c, err, PRISM_ERR_INVALID, "format: %d is not a low precision", (int)format);
    if (samples == 0)
        return refuse(c, err, PRISM_ERR_INVALID, "samples: 0 (at least one forward pass)");
    if (n > 0 && (!block_ids || !errors))
        return refuse(c, err, PRISM_ERR_INVALID, "%s: NULL with n %zu", !block_ids ? "block_ids" : "errors", n);
    s = check_block_ids(c, block_ids, n, "n", err);
    if (s != PRISM_OK)
        return s;
    for (size_t i = 0; i < n; i++)
        if (isnan(errors[i]) || errors[i] < 0)
            return refuse(c, err, PRISM_ERR_INVALID, "errors[%zu]: %g is not a relative error (>= 0)", i, errors[i]);
    prism_hints_drop why;
    s = ready_to_send(c, &why, err);
    if (s != PRISM_OK) {
        c->n.calibrations_dropped++;
        prism_error_prefix(err, "calibration dropped");
        return s;
    }
    for (size_t i = 0; i < n; i++) {
        c->be[i].block_id = block_ids[i];
        c->be[i].relative_error = errors[i];
        c->be_ptr[i] = &c->be[i];
    }
    Prism__V1__CalibrationReport report = PRISM__V1__CALIBRATION_REPORT__INIT;
    report.fingerprint.len = PRISM_FINGERPRINT_BYTES;
    report.fingerprint.data = c->fingerprint;
    report.format = (Prism__V1__Precision)format;
    report.samples = samples;
    report.n_errors = n;
    report.errors = c->be_ptr;
    Prism__V1__AgentMessage msg = PRISM__V1__AGENT_MESSAGE__INIT;
    msg.kind_case = PRISM__V1__AGENT_MESSAGE__KIND_CALIBRATION;
    msg.calibration = &report;
    s = send_message(c, &msg, FRAME_CALIBRATION, err);
    if (s != PRISM_OK && s != PRISM_ERR_UNAVAILABLE)
        c->n.calibrations_dropped++;
    if (s != PRISM_OK)
        prism_error_prefix(err, "calibration dropped");
    return s;
}

/* ---- the map ---------------------------------------------------------------------------- */

uint64_t prism_client_begin_step(prism_client *c, uint64_t step)
{
    if (!c)
        return 0;
    poll_extension(c);
    bool had_step = c->stepped;
    uint64_t prev = c->last_step;
    c->stepped = true;
    c->last_step = step;
    if (!c->hints.h) {
        uint64_t now = now_ms();
        if (now < c->next_hints_ms)
            return c->view.map_version;
        if (!open_hints(c)) {
            c->next_hints_ms = now + c->interval_ms;
            return c->view.map_version;
        }
        if (!c->plans.h)
            open_plans(c); /* the agent made it before the table */
    }
    poll_plans(c);
    uint64_t version = read_map(c, step, had_step ? &prev : NULL);
    publish_line(c);
    return version;
}

prism_precision prism_client_block_precision(const prism_client *c, uint32_t block)
{
    if (!c || !c->registered || block >= c->n_blocks)
        return PRISM_PRECISION_BF16;
    uint8_t p = c->prec[block];
    return p < PRISM_PRECISION_COUNT ? (prism_precision)p : PRISM_PRECISION_BF16;
}

uint64_t prism_client_map_version(const prism_client *c)
{
    return c ? c->view.map_version : 0;
}

prism_precision prism_client_compute_precision(const prism_client *c, uint32_t block)
{
    if (!c || !c->registered || !c->plan.has_plan || block >= c->n_blocks)
        return PRISM_PRECISION_BF16;
    uint8_t p = c->cprec[block];
    return p > PRISM_PRECISION_BF16 && p < PRISM_PRECISION_COUNT ? (prism_precision)p : PRISM_PRECISION_BF16;
}

prism_status prism_client_get_plan(const prism_client *c, prism_client_plan *out, prism_error *err)
{
    if (!c || !out)
        return prism_error_set(err, PRISM_ERR_INVALID, "%s: NULL", !c ? "client" : "out");
    *out = c->plan;
    out->map_version = c->view.map_version;
    if (!out->has_plan)
        out->low_format = PRISM_PRECISION_BF16;
    return PRISM_OK;
}

prism_status prism_client_get_state(const prism_client *c, prism_client_state *out, prism_error *err)
{
    if (!c || !out)
        return prism_error_set(err, PRISM_ERR_INVALID, "%s: NULL", !c ? "client" : "out");
    const prism_hints_view *v = &c->view;
    memset(out, 0, sizeof *out);
    out->map_version = v->map_version;
    out->decided_step = v->decided_step;
    out->effective_step = v->effective_step;
    out->map_blocks = v->n_blocks;
    out->registered = c->registered;
    out->connected = c->fd >= 0;
    out->hints_mapped = c->hints.h != NULL;
    out->upstream_connected = v->upstream_connected;
    out->calibration_needed = v->calibration_needed;
    out->run_calibration = v->run_calibration;
    out->calibration_samples = v->calibration_samples;
    out->low_precision = (unsigned)v->low_precision < PRISM_PRECISION_COUNT ? v->low_precision : PRISM_PRECISION_BF16;
    out->hints.map_version = v->hints.map_version;
    out->hints.max_inflight_h2d = v->hints.max_inflight_h2d;
    out->hints.max_inflight_d2h = v->hints.max_inflight_d2h;
    out->hints.prefetch_window = v->hints.prefetch_window;
    out->hints.suppress_prefetch_in_backward = v->hints.suppress_prefetch_in_backward != 0;
    out->hints.suppress_prefetch_in_optimizer = v->hints.suppress_prefetch_in_optimizer != 0;
    out->hints.vram_pressure_threshold = v->hints.vram_pressure_threshold;
    /* The numerics config (issue 17); an agent that predates it leaves published 0: defaults. */
    const prism_hints_numerics *nu = &v->numerics;
    out->amax_history_len = 16;
    out->n_low_formats = 1;
    out->low_formats[0] = out->low_precision;
    if (out->calibration_needed) {
        out->n_calibration_formats = 1;
        out->calibration_formats[0] = out->low_precision;
    }
    if (nu->published) {
        out->scale_mode = nu->scale_mode;
        out->amax_history_len = nu->amax_history_len;
        out->scale_margin = nu->scale_margin;
        out->low_auto = nu->low_auto != 0;
        out->n_low_formats = out->n_calibration_formats = 0;
        for (uint32_t i = 0; i < nu->n_low_formats && i < PRISM_HINTS_FORMATS_MAX; i++)
            if (nu->low_formats[i] > PRISM_PRECISION_BF16 && nu->low_formats[i] < PRISM_PRECISION_COUNT)
                out->low_formats[out->n_low_formats++] = (prism_precision)nu->low_formats[i];
        for (uint32_t i = 0; out->calibration_needed && i < nu->n_calibration_formats && i < PRISM_HINTS_FORMATS_MAX;
             i++)
            if (nu->calibration_formats[i] > PRISM_PRECISION_BF16 && nu->calibration_formats[i] < PRISM_PRECISION_COUNT)
                out->calibration_formats[out->n_calibration_formats++] = (prism_precision)nu->calibration_formats[i];
    }
    return PRISM_OK;
}

prism_status prism_client_get_counters(const prism_client *c, prism_client_counters *out, prism_error *err)
{
    if (!c || !out)
        return prism_error_set(err, PRISM_ERR_INVALID, "%s: NULL", !c ? "client" : "out");
    *out = c->n;
    return PRISM_OK;
}

const char *prism_client_last_error(const prism_client *c)
{
    return c ? c->last_error : "";
}
