/* The gRPC server of prismd (rpc.h) on the gRPC core C API, and the streams the jobs send on
 * (stream.h).
 *
 * One policy thread drives one completion queue. Every call has a state struct (prismd_stream)
 * whose embedded tags are what the queue hands back, so an event names both the call and the
 * operation that finished. Per call there is at most one read and one write in flight; messages
 * to send wait in the call's outbound queue, which is bounded: a peer that stops reading is cut
 * off rather than allowed to grow prismd's memory. The thread also ticks the jobs, so steps
 * whose ranks went missing complete on their timeout. */
#define _GNU_SOURCE
#include "rpc.h"
#include "stream.h"

#include "mem_limits.h"
#include "log.h"

#include <grpc/byte_buffer.h>
#include <grpc/byte_buffer_reader.h>
#include <grpc/grpc.h>
#include <grpc/grpc_security.h>
#include <grpc/support/alloc.h>
#include <grpc/support/time.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* The policy thread wakes at least this often to tick the jobs, run REST changes and check
 * for stop: a REST change waits at most this long to be picked up. */
#define TICK_MS 20
/* Shutdown: calls get this long to finish after their status was sent, then are cancelled. */
#define DRAIN_MS 2000

/* CALL_UNKNOWN: a call of any method prismd does not serve, requested apart from the registered
 * ones (grpc_server_request_call) and answered UNIMPLEMENTED at once, so that it neither waits
 * for the client's deadline nor stays in memory until then. */
typedef enum call_kind { CALL_CONNECT, CALL_GET_MAP, CALL_WATCH, CALL_UNKNOWN } call_kind;
#define CALL_KINDS 4
static const char *const call_names[CALL_KINDS] = {"Connect", "GetBlockMap", "Watch", "unknown method"};

/* Calls answered in one batch as they arrive, with no stream to end at shutdown. */
static bool answered_at_once(call_kind kind)
{
    return kind == CALL_GET_MAP || kind == CALL_UNKNOWN;
}

typedef enum tag_kind { TAG_NEW, TAG_READ, TAG_WRITE, TAG_STATUS, TAG_CLOSE, TAG_SHUTDOWN } tag_kind;

typedef struct call_tag {
    tag_kind kind;
    prismd_stream *call; /* NULL for TAG_SHUTDOWN */
} call_tag;

/* A packed message that one or more streams send (stream.h): its bytes exist once however many
 * queues hold it, and count once in the total of unsent bytes while any queue does. */
struct prismd_message {
    grpc_slice slice;
    size_t len;
    unsigned refs;   /* the creator's, until it releases it, and one per queue entry */
    unsigned queued; /* queue entries holding it */
};

typedef struct outmsg {
    struct outmsg *next;
    grpc_byte_buffer *bb;  /* refers to msg's slice, no copy */
    prismd_message *msg;
    size_t len;
} outmsg;

struct prismd_stream {
    call_kind kind;
    prismd_rpc *rpc;
    grpc_call *call;
    gpr_timespec deadline;
    grpc_metadata_array md;
    grpc_call_details details; /* CALL_UNKNOWN only: the method that was called */
    grpc_byte_buffer *payload; /* the request of GetBlockMap and Watch */
    grpc_byte_buffer *recv;    /* a Connect read in flight */
    call_tag t_new, t_read, t_write, t_status, t_close;
    int pending;               /* batches in flight */
    bool started;              /* the call arrived */
    bool md_sent;              /* initial metadata went out */
    bool reading, writing;
    bool closed;               /* RECV_CLOSE_ON_SERVER finished: the call is over */
    bool ending;               /* a status is due once the queue is sent */
    int cancelled;
    grpc_status_code end_code;
    grpc_slice end_details;
    bool has_details;
    outmsg *head, *tail;
    size_t queued_bytes;
    size_t reply_bytes;        /* GetBlockMap: its answer, in gRPC's hands until the call is over */
    prismd_peer peer;
    prismd_stream *prev, *next; /* every call of the server, for shutdown */
};

struct prismd_rpc {
    grpc_server *server;
    grpc_completion_queue *cq;
    void *methods[3];
    prismd_jobs *jobs;
    prismd_commands *commands;
    prismd_snapshots *snapshots;
    size_t stream_buffer_bytes;
    size_t total_stream_buffer_bytes; /* 0: no cap */
    size_t total_queued;              /* unsent bytes over every stream */
    pthread_t thread;
    atomic_bool stop;
    bool shutting_down;
    bool server_shut;
    call_tag t_shutdown;
    prismd_stream *live;
    char listen[256];
};

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

/* ---- call lifetime ---- */

/* The total of unsent bytes, kept with every stream's queued_bytes and shown in /metrics. */
static void queued_add(prismd_rpc *r, size_t n)
{
    r->total_queued += n;
    atomic_store(&prismd_limits.stream_buffer_bytes, r->total_queued);
}

static void queued_sub(prismd_rpc *r, size_t n)
{
    r->total_queued -= n;
    atomic_store(&prismd_limits.stream_buffer_bytes, r->total_queued);
}

prismd_message *prismd_message_create(const uint8_t *data, size_t len)
{
    prismd_message *m = malloc(sizeof *m);
    if (!m)
        return NULL;
    m->slice = grpc_slice_from_copied_buffer((const char *)data, len);
    m->len = len;
    m->refs = 1;
    m->queued = 0;
    return m;
}

static void message_unref(prismd_message *m)
{
    if (--m->refs == 0) {
        grpc_slice_unref(m->slice);
        free(m);
    }
}

void prismd_message_release(prismd_message *m)
{
    if (m)
        message_unref(m);
}

/* Frees one entry of s's queue (already unlinked), keeping the byte counts. */
static void outmsg_free(prismd_stream *s, outmsg *e)
{
    s->queued_bytes -= e->len;
    if (--e->msg->queued == 0)
        queued_sub(s->rpc, e->len);
    grpc_byte_buffer_destroy(e->bb);
    message_unref(e->msg);
    free(e);
}

static void call_free(prismd_stream *s)
{
    prismd_rpc *r = s->rpc;
    if (s->prev)
        s->prev->next = s->next;
    else
        r->live = s->next;
    if (s->next)
        s->next->prev = s->prev;
    while (s->head) {
        outmsg *m = s->head;
        s->head = m->next;
        outmsg_free(s, m);
    }
    queued_sub(r, s->reply_bytes);
    free(s->peer.address);
    if (s->payload)
        grpc_byte_buffer_destroy(s->payload);
    if (s->recv)
        grpc_byte_buffer_destroy(s->recv);
    if (s->has_details)
        grpc_slice_unref(s->end_details);
    grpc_metadata_array_destroy(&s->md);
    if (s->kind == CALL_UNKNOWN)
        grpc_call_details_destroy(&s->details);
    if (s->call)
        grpc_call_unref(s->call);
    free(s->peer.auth);
    free(s);
}

/* A call is freed once nothing of it is in flight and it is over (or never began). */
static void call_maybe_free(prismd_stream *s)
{
    if (s->pending == 0 && (!s->started || s->closed))
        call_free(s);
}

static bool start_batch(prismd_stream *s, grpc_op *ops, size_t n, call_tag *tag)
{
    grpc_call_error e = grpc_call_start_batch(s->call, ops, n, tag, NULL);
    if (e != GRPC_CALL_OK) {
        /* The call cannot go on: cancel it; it is freed once nothing of it is in flight. */
        grpc_call_cancel(s->call, NULL);
        s->ending = true;
        if (tag->kind == TAG_CLOSE)
            s->closed = true;
        char code[16];
        snprintf(code, sizeof code, "%d", (int)e);
        prism_log(PRISM_LOG_ERROR, "grpc_call_start_batch failed", "call", call_names[s->kind], "error", code,
                   LOG_END);
        return false;
    }
    s->pending++;
    return true;
}

static size_t add_initial_metadata(prismd_stream *s, grpc_op *op)
{
    if (s->md_sent)
        return 0;
    memset(op, 0, sizeof *op);
    op->op = GRPC_OP_SEND_INITIAL_METADATA;
    s->md_sent = true;
    return 1;
}

static void start_status(prismd_stream *s)
{
    grpc_op ops[2];
    size_t n = add_initial_metadata(s, &ops[0]);
    memset(&ops[n], 0, sizeof ops[n]);
    ops[n].op = GRPC_OP_SEND_STATUS_FROM_SERVER;
    ops[n].data.send_status_from_server.status = s->end_code;
    ops[n].data.send_status_from_server.status_details = s->has_details ? &s->end_details : NULL;
    start_batch(s, ops, n + 1, &s->t_status);
}

/* Ends the call with a status once what is queued has been sent. */
static void call_end(prismd_stream *s, grpc_status_code code, const char *message)
{
    if (s->ending || s->closed || !s->started)
        return;
    s->ending = true;
    s->end_code = code;
    if (message && message[0]) {
        s->end_details = grpc_slice_from_copied_string(message);
        s->has_details = true;
    }
    if (code != GRPC_STATUS_OK) {
        char c[16];
        snprintf(c, sizeof c, "%d", (int)code);
        prism_log(PRISM_LOG_INFO, "call ended", "call", call_names[s->kind], "status", c, "message",
                   message ? message : "", LOG_END);
    }
    if (!s->writing)
        start_status(s);
}

void prismd_stream_end(prismd_stream *s, int code, const char *message)
{
    call_end(s, (grpc_status_code)code, message);
}

static void start_write(prismd_stream *s)
{
    grpc_op ops[2];
    size_t n = add_initial_metadata(s, &ops[0]);
    memset(&ops[n], 0, sizeof ops[n]);
    ops[n].op = GRPC_OP_SEND_MESSAGE;
    ops[n].data.send_message.send_message = s->head->bb;
    if (start_batch(s, ops, n + 1, &s->t_write))
        s->writing = true;
}

/* Cuts a stream off for unsent data: the call is cancelled at once with RESOURCE_EXHAUSTED (its
 * write in flight would never finish) and what waits in its queue is dropped; the message in
 * flight is freed when its batch completes. Counted by the limit that was reached. */
static void cut_off(prismd_stream *s, bool total)
{
    const char *why = total ? "prismd's unsent stream data is at its limit (--total-stream-buffer-bytes) and this "
                              "stream holds the most of it: it is behind on reading"
                            : "the stream fell too far behind on reading updates (--stream-buffer-bytes)";
    atomic_fetch_add(total ? &prismd_limits.streams_cut_total_buffer : &prismd_limits.streams_cut_stream_buffer, 1);
    prism_log(PRISM_LOG_WARN, "call cut off", "call", call_names[s->kind], "message", why, LOG_END);
    s->ending = true;
    grpc_call_cancel_with_status(s->call, GRPC_STATUS_RESOURCE_EXHAUSTED, why, NULL);
    queued_sub(s->rpc, s->reply_bytes); /* a GetBlockMap answer: gRPC drops it with the call */
    s->reply_bytes = 0;
    outmsg *keep = s->writing ? s->head : NULL; /* owned by the batch in flight until it completes */
    for (outmsg *m = keep ? keep->next : s->head; m;) {
        outmsg *next = m->next;
        outmsg_free(s, m);
        m = next;
    }
    s->head = s->tail = keep;
    if (keep)
        keep->next = NULL;
}

/* Bytes of a stream's queue that cutting it off would free now (not the message in flight). */
static size_t droppable(const prismd_stream *s)
{
    if (s->kind == CALL_GET_MAP)
        return s->reply_bytes; /* cancelling the call frees its answer */
    return s->writing && s->head ? s->queued_bytes - s->head->len : s->queued_bytes;
}

/* Whether cutting o off would free anything: a stream still going, or a GetBlockMap call whose
 * answer its client has not taken. */
static bool cuttable(const prismd_stream *o)
{
    if (o->closed)
        return false;
    return o->kind == CALL_GET_MAP ? o->reply_bytes > 0 : !o->ending;
}

/* Makes room for need more unsent bytes under --total-stream-buffer-bytes by cutting off the
 * calls furthest behind, those holding the most droppable bytes (a stream's queue, a
 * GetBlockMap answer not taken), so that clients that read keep going whoever fills the
 * buffers. A stall shared by several streams (watchers that all stopped reading hold the same
 * messages) frees memory only once all of them are gone, so they go one after the other.
 * False when s itself should go: it holds at least as much as any other. */
static bool make_room(prismd_stream *s, size_t need)
{
    prismd_rpc *r = s->rpc;
    while (r->total_queued + need > r->total_stream_buffer_bytes) {
        prismd_stream *worst = NULL;
        for (prismd_stream *o = r->live; o; o = o->next)
            if (o != s && cuttable(o) && (!worst || droppable(o) > droppable(worst)))
                worst = o;
        if (!worst || droppable(worst) <= droppable(s))
            return false;
        cut_off(worst, true);
    }
    return true;
}

void prismd_stream_send(prismd_stream *s, const uint8_t *data, size_t len)
{
    prismd_message *msg = prismd_message_create(data, len);
    if (!msg) {
        call_end(s, GRPC_STATUS_RESOURCE_EXHAUSTED, "out of memory");
        return;
    }
    prismd_stream_send_message(s, msg);
    prismd_message_release(msg);
}

void prismd_stream_send_message(prismd_stream *s, prismd_message *msg)
{
    if (s->ending || s->closed)
        return;
    /* A peer that stopped reading is cut off rather than allowed to grow prismd's memory, one
     * stream at a time (--stream-buffer-bytes) and all together (--total-stream-buffer-bytes). */
    prismd_rpc *r = s->rpc;
    size_t len = msg->len;
    if (s->queued_bytes + len > r->stream_buffer_bytes) {
        cut_off(s, false);
        return;
    }
    if (r->total_stream_buffer_bytes && !make_room(s, msg->queued ? 0 : len)) {
        cut_off(s, true);
        return;
    }
    outmsg *m = malloc(sizeof *m);
    if (!m) {
        call_end(s, GRPC_STATUS_RESOURCE_EXHAUSTED, "out of memory");
        return;
    }
    m->bb = grpc_raw_byte_buffer_create(&msg->slice, 1);
    m->msg = msg;
    msg->refs++;
    if (msg->queued++ == 0)
        queued_add(r, len);
    m->len = len;
    m->next = NULL;
    if (s->tail)
        s->tail->next = m;
    else
        s->head = m;
    s->tail = m;
    s->queued_bytes += len;
    if (!s->writing)
        start_write(s);
}

static void start_read(prismd_stream *s)
{
    grpc_op ops[2];
    size_t n = add_initial_metadata(s, &ops[0]);
    memset(&ops[n], 0, sizeof ops[n]);
    ops[n].op = GRPC_OP_RECV_MESSAGE;
    ops[n].data.recv_message.recv_message = &s->recv;
    if (start_batch(s, ops, n + 1, &s->t_read))
        s->reading = true;
}

static void start_close_watch(prismd_stream *s)
{
    grpc_op op;
    memset(&op, 0, sizeof op);
    op.op = GRPC_OP_RECV_CLOSE_ON_SERVER;
    op.data.recv_close_on_server.cancelled = &s->cancelled;
    start_batch(s, &op, 1, &s->t_close);
}

/* The whole of a byte buffer as one slice (the caller unrefs it). */
static grpc_slice buffer_bytes(grpc_byte_buffer *bb)
{
    grpc_byte_buffer_reader reader;
    if (!grpc_byte_buffer_reader_init(&reader, bb))
        return grpc_empty_slice();
    grpc_slice all = grpc_byte_buffer_reader_readall(&reader);
    grpc_byte_buffer_reader_destroy(&reader);
    return all;
}

/* The token of "authorization: Bearer TOKEN", or NULL. */
static char *bearer_token(const grpc_metadata_array *md)
{
    for (size_t i = 0; i < md->count; i++) {
        const grpc_metadata *m = &md->metadata[i];
        size_t klen = GRPC_SLICE_LENGTH(m->key);
        if (klen != 13 || memcmp(GRPC_SLICE_START_PTR(m->key), "authorization", 13) != 0)
            continue;
        size_t vlen = GRPC_SLICE_LENGTH(m->value);
        const char *v = (const char *)GRPC_SLICE_START_PTR(m->value);
        if (vlen > 7 && strncasecmp(v, "Bearer ", 7) == 0)
            return strndup(v + 7, vlen - 7);
    }
    return NULL;
}

/* The client's address as gRPC names it, without the port: "ipv4:127.0.0.1", "ipv6:[::1]";
 * NULL when unknown. The caller frees it. */
static char *peer_address(grpc_call *call)
{
    char *p = grpc_call_get_peer(call);
    if (!p)
        return NULL;
    char *colon = strrchr(p, ':');
    const char *close = strrchr(p, ']');
    size_t n = strlen(p);
    if (colon && (!close || colon > close) && strncmp(p, "unix", 4) != 0 && colon != strchr(p, ':'))
        n = (size_t)(colon - p); /* "ipv4:1.2.3.4:5678": the port goes; "unix:/path" stays whole */
    char *out = strndup(p, n);
    gpr_free(p);
    return out;
}

static void request_call(prismd_rpc *r, call_kind kind);

/* ---- the three methods ---- */

static void on_get_block_map(prismd_stream *s)
{
    prismd_status end = {GRPC_STATUS_OK, ""};
    uint8_t *out = NULL;
    size_t out_len = 0;
    bool ok = false;
    if (!s->payload) {
        end.code = GRPC_STATUS_INVALID_ARGUMENT;
        snprintf(end.message, sizeof end.message, "no request message");
    } else {
        grpc_slice req = buffer_bytes(s->payload);
        ok = prismd_jobs_get_block_map(s->rpc->jobs, s->peer.auth, GRPC_SLICE_START_PTR(req), GRPC_SLICE_LENGTH(req),
                                       &out, &out_len, &end);
        grpc_slice_unref(req);
    }
    grpc_op ops[4];
    memset(ops, 0, sizeof ops);
    size_t n = 0;
    ops[n++].op = GRPC_OP_SEND_INITIAL_METADATA;
    prismd_rpc *r = s->rpc;
    if (ok && r->total_stream_buffer_bytes && !make_room(s, out_len)) {
        /* The answer would pass the total of unsent bytes, and no call is further behind. */
        atomic_fetch_add(&prismd_limits.streams_cut_total_buffer, 1);
        ok = false;
        end.code = GRPC_STATUS_RESOURCE_EXHAUSTED;
        snprintf(end.message, sizeof end.message,
                 "prismd's unsent answers are at their limit (--total-stream-buffer-bytes); try again");
    }
    if (ok) {
        s->reply_bytes = out_len;
        queued_add(r, out_len);
    }
    grpc_byte_buffer *bb = NULL;
    if (ok) {
        grpc_slice slice = grpc_slice_from_copied_buffer((const char *)out, out_len);
        bb = grpc_raw_byte_buffer_create(&slice, 1);
        grpc_slice_unref(slice);
        ops[n].op = GRPC_OP_SEND_MESSAGE;
        ops[n++].data.send_message.send_message = bb;
    }
    free(out);
    s->end_details = grpc_slice_from_copied_string(end.message);
    s->has_details = true;
    ops[n].op = GRPC_OP_SEND_STATUS_FROM_SERVER;
    ops[n].data.send_status_from_server.status = (grpc_status_code)end.code;
    ops[n++].data.send_status_from_server.status_details = &s->end_details;
    ops[n].op = GRPC_OP_RECV_CLOSE_ON_SERVER;
    ops[n++].data.recv_close_on_server.cancelled = &s->cancelled;
    s->md_sent = true;
    s->ending = true;
    start_batch(s, ops, n, &s->t_close);
    if (bb)
        grpc_byte_buffer_destroy(bb);
}

/* Answers a call of a method prismd does not serve with UNIMPLEMENTED, in one batch that also
 * waits for the call to close: the call is freed when that batch completes. Nothing is read. */
static void on_unknown_method(prismd_stream *s)
{
    size_t len = GRPC_SLICE_LENGTH(s->details.method);
    char message[320];
    snprintf(message, sizeof message, "method %.*s%s is not served by prismd (prism.v1.PolicyService has "
             "Connect, GetBlockMap and Watch)", (int)(len > 200 ? 200 : len),
             (const char *)GRPC_SLICE_START_PTR(s->details.method), len > 200 ? "..." : "");
    s->end_details = grpc_slice_from_copied_string(message);
    s->has_details = true;
    grpc_op ops[3];
    memset(ops, 0, sizeof ops);
    ops[0].op = GRPC_OP_SEND_INITIAL_METADATA;
    ops[1].op = GRPC_OP_SEND_STATUS_FROM_SERVER;
    ops[1].data.send_status_from_server.status = GRPC_STATUS_UNIMPLEMENTED;
    ops[1].data.send_status_from_server.status_details = &s->end_details;
    ops[2].op = GRPC_OP_RECV_CLOSE_ON_SERVER;
    ops[2].data.recv_close_on_server.cancelled = &s->cancelled;
    s->md_sent = true;
    s->ending = true;
    prismd_jobs_count_unimplemented(s->rpc->jobs);
    start_batch(s, ops, 3, &s->t_close);
}

static void on_call_started(prismd_stream *s)
{
    s->started = true;
    s->peer.auth = bearer_token(&s->md);
    s->peer.address = peer_address(s->call);
    prismd_rpc *r = s->rpc;
    request_call(r, s->kind); /* the next call of this method */
    if (r->shutting_down && !answered_at_once(s->kind)) {
        start_close_watch(s);
        call_end(s, GRPC_STATUS_UNAVAILABLE, "prismd is shutting down");
        return;
    }
    switch (s->kind) {
    case CALL_CONNECT:
        start_close_watch(s);
        start_read(s);
        break;
    case CALL_GET_MAP:
        on_get_block_map(s);
        break;
    case CALL_UNKNOWN:
        on_unknown_method(s);
        break;
    case CALL_WATCH: {
        start_close_watch(s);
        prismd_status end = {GRPC_STATUS_OK, ""};
        if (!s->payload) {
            call_end(s, GRPC_STATUS_INVALID_ARGUMENT, "no request message");
            break;
        }
        grpc_slice req = buffer_bytes(s->payload);
        if (!prismd_jobs_watch(r->jobs, s, &s->peer, GRPC_SLICE_START_PTR(req), GRPC_SLICE_LENGTH(req), &end))
            call_end(s, (grpc_status_code)end.code, end.message);
        grpc_slice_unref(req);
        break;
    }
    }
}

static void on_read(prismd_stream *s, bool ok)
{
    s->reading = false;
    if (s->closed || s->ending) {
        /* The call is over or being ended: what arrived is not acted on. */
        if (s->recv)
            grpc_byte_buffer_destroy(s->recv);
        s->recv = NULL;
        return;
    }
    if (!ok)
        prismd_jobs_stream_broken(s->rpc->jobs);
    if (!ok || !s->recv) {
        /* The agent closed its side (or the call broke): finish cleanly. */
        call_end(s, GRPC_STATUS_OK, NULL);
        return;
    }
    grpc_slice msg = buffer_bytes(s->recv);
    grpc_byte_buffer_destroy(s->recv);
    s->recv = NULL;
    prismd_status end = {GRPC_STATUS_OK, ""};
    bool go_on = prismd_jobs_agent_message(s->rpc->jobs, s, &s->peer, GRPC_SLICE_START_PTR(msg),
                                           GRPC_SLICE_LENGTH(msg), now_ms(), &end);
    grpc_slice_unref(msg);
    if (!go_on)
        call_end(s, (grpc_status_code)end.code, end.message);
    else if (!s->ending && !s->closed)
        start_read(s);
}

static void on_written(prismd_stream *s, bool ok)
{
    s->writing = false;
    outmsg *m = s->head;
    if (m) {
        s->head = m->next;
        if (!s->head)
            s->tail = NULL;
        outmsg_free(s, m);
    }
    if (!ok)
        return; /* the call is broken; RECV_CLOSE_ON_SERVER will say so */
    if (s->head)
        start_write(s);
    else if (s->ending)
        start_status(s);
}

static void on_event(prismd_rpc *r, call_tag *t, bool ok)
{
    if (t->kind == TAG_SHUTDOWN) {
        r->server_shut = true;
        return;
    }
    prismd_stream *s = t->call;
    s->pending--;
    switch (t->kind) {
    case TAG_NEW:
        if (ok)
            on_call_started(s);
        break;
    case TAG_READ: on_read(s, ok); break;
    case TAG_WRITE: on_written(s, ok); break;
    case TAG_STATUS: break;
    case TAG_CLOSE:
        s->closed = true;
        prismd_jobs_stream_gone(r->jobs, s, &s->peer);
        break;
    case TAG_SHUTDOWN: break;
    }
    call_maybe_free(s);
}

static void request_call(prismd_rpc *r, call_kind kind)
{
    if (r->shutting_down)
        return;
    prismd_stream *s = calloc(1, sizeof *s);
    if (!s) {
        prism_log(PRISM_LOG_ERROR, "out of memory: no more calls accepted", "call", call_names[kind], LOG_END);
        return;
    }
    s->kind = kind;
    s->rpc = r;
    grpc_metadata_array_init(&s->md);
    s->t_new = (call_tag){TAG_NEW, s};
    s->t_read = (call_tag){TAG_READ, s};
    s->t_write = (call_tag){TAG_WRITE, s};
    s->t_status = (call_tag){TAG_STATUS, s};
    s->t_close = (call_tag){TAG_CLOSE, s};
    s->next = r->live;
    if (r->live)
        r->live->prev = s;
    r->live = s;
    grpc_call_error e;
    if (kind == CALL_UNKNOWN) {
        grpc_call_details_init(&s->details);
        e = grpc_server_request_call(r->server, &s->call, &s->details, &s->md, r->cq, r->cq, &s->t_new);
    } else {
        e = grpc_server_request_registered_call(r->server, r->methods[kind], &s->call, &s->deadline, &s->md,
                                                kind == CALL_CONNECT ? NULL : &s->payload, r->cq, r->cq, &s->t_new);
    }
    if (e != GRPC_CALL_OK) {
        prism_log(PRISM_LOG_ERROR, "cannot wait for calls", "call", call_names[kind], LOG_END);
        call_free(s);
        return;
    }
    s->pending = 1;
}

/* ---- the policy thread ---- */

static void process(prismd_rpc *r, gpr_timespec deadline)
{
    grpc_event ev = grpc_completion_queue_next(r->cq, deadline, NULL);
    if (ev.type == GRPC_OP_COMPLETE)
        on_event(r, ev.tag, ev.success != 0);
}

static void *policy_thread(void *arg)
{
    prismd_rpc *r = arg;
    for (int k = 0; k < CALL_KINDS; k++)
        request_call(r, (call_kind)k);
    while (!atomic_load(&r->stop)) {
        if (r->commands)
            prismd_jobs_run_commands(r->jobs, r->commands);
        int64_t now = now_ms();
        if (r->snapshots)
            atomic_store(&r->snapshots->policy_alive_ms, now); /* for /readyz */
        int64_t wait = prismd_jobs_tick(r->jobs, now);
        if (wait < 0 || wait > TICK_MS)
            wait = TICK_MS;
        process(r, in_ms(wait));
    }
    /* Shutdown: every stream ends with UNAVAILABLE; no new call or command is taken. */
    r->shutting_down = true;
    if (r->commands)
        prismd_commands_close(r->commands);
    for (prismd_stream *s = r->live; s; s = s->next)
        if (s->started && !answered_at_once(s->kind))
            call_end(s, GRPC_STATUS_UNAVAILABLE, "prismd is shutting down");
    grpc_server_shutdown_and_notify(r->server, r->cq, &r->t_shutdown);
    int64_t give_up = now_ms() + DRAIN_MS;
    bool cancelled = false;
    while (!r->server_shut || r->live) {
        if (!cancelled && now_ms() >= give_up) {
            grpc_server_cancel_all_calls(r->server);
            cancelled = true;
        }
        process(r, in_ms(TICK_MS));
    }
    return NULL;
}

prismd_rpc *prismd_rpc_start(const prismd_rpc_options *opts, const prism_config *defaults, prism_error *err)
{
    prismd_rpc *r = calloc(1, sizeof *r);
    if (!r) {
        prism_error_set(err, PRISM_ERR_NOMEM, "out of memory");
        return NULL;
    }
    snprintf(r->listen, sizeof r->listen, "%s", opts->listen);
    r->commands = opts->commands;
    r->snapshots = opts->snapshots;
    r->stream_buffer_bytes = opts->stream_buffer_bytes ? opts->stream_buffer_bytes : (64u << 20);
    r->total_stream_buffer_bytes = opts->total_stream_buffer_bytes;
    r->t_shutdown = (call_tag){TAG_SHUTDOWN, NULL};
    r->jobs = prismd_jobs_create(defaults, &opts->limits, opts->store, opts->snapshots, err);
    if (!r->jobs) {
        free(r);
        return NULL;
    }
    grpc_init();
    /* Keepalive pings find peers that vanished without a word (every 30 s, 10 s to answer). */
    grpc_arg args[3] = {
        {.type = GRPC_ARG_INTEGER, .key = GRPC_ARG_MAX_RECEIVE_MESSAGE_LENGTH,
         .value.integer = (int)opts->max_message_bytes},
        {.type = GRPC_ARG_INTEGER, .key = GRPC_ARG_KEEPALIVE_TIME_MS, .value.integer = 30000},
        {.type = GRPC_ARG_INTEGER, .key = GRPC_ARG_KEEPALIVE_TIMEOUT_MS, .value.integer = 10000},
    };
    grpc_channel_args channel_args = {3, args};
    r->server = grpc_server_create(&channel_args, NULL);
    r->cq = grpc_completion_queue_create_for_next(NULL);
    grpc_server_register_completion_queue(r->server, r->cq, NULL);
    static const char *const paths[3] = {"/prism.v1.PolicyService/Connect", "/prism.v1.PolicyService/GetBlockMap",
                                         "/prism.v1.PolicyService/Watch"};
    for (int k = 0; k < 3; k++)
        r->methods[k] = grpc_server_register_method(r->server, paths[k], NULL,
                                                    k == CALL_CONNECT ? GRPC_SRM_PAYLOAD_NONE
                                                                      : GRPC_SRM_PAYLOAD_READ_INITIAL_BYTE_BUFFER,
                                                    0);
    grpc_server_credentials *creds;
    if (opts->tls_cert) {
        grpc_ssl_pem_key_cert_pair pair = {opts->tls_key, opts->tls_cert};
        creds = grpc_ssl_server_credentials_create(NULL, &pair, 1, 0, NULL);
    } else {
        creds = grpc_insecure_server_credentials_create();
    }
    int port = grpc_server_add_http2_port(r->server, opts->listen, creds);
    grpc_server_credentials_release(creds);
    if (port == 0) {
        prism_error_set(err, PRISM_ERR_IO, "cannot listen on %s (address in use or not local?)", opts->listen);
        grpc_server_destroy(r->server);
        grpc_completion_queue_shutdown(r->cq);
        while (grpc_completion_queue_next(r->cq, gpr_inf_future(GPR_CLOCK_MONOTONIC), NULL).type != GRPC_QUEUE_SHUTDOWN)
            ;
        grpc_completion_queue_destroy(r->cq);
        prismd_jobs_destroy(r->jobs);
        grpc_shutdown();
        free(r);
        return NULL;
    }
    grpc_server_start(r->server);
    prismd_jobs_tick(r->jobs, now_ms()); /* the first snapshot, before any request is served */
    atomic_init(&r->stop, false);
    if (pthread_create(&r->thread, NULL, policy_thread, r) != 0) {
        prism_error_set(err, PRISM_ERR_NOMEM, "cannot start the policy thread");
        atomic_store(&r->stop, true);
        policy_thread(r);
        grpc_server_destroy(r->server);
        grpc_completion_queue_destroy(r->cq);
        prismd_jobs_destroy(r->jobs);
        grpc_shutdown();
        free(r);
        return NULL;
    }
    return r;
}

void prismd_rpc_stop(prismd_rpc *r)
{
    if (!r)
        return;
    atomic_store(&r->stop, true);
    pthread_join(r->thread, NULL);
    grpc_server_destroy(r->server);
    grpc_completion_queue_shutdown(r->cq);
    for (;;) {
        grpc_event ev = grpc_completion_queue_next(r->cq, gpr_inf_future(GPR_CLOCK_MONOTONIC), NULL);
        if (ev.type == GRPC_QUEUE_SHUTDOWN)
            break;
    }
    grpc_completion_queue_destroy(r->cq);
    prismd_jobs_destroy(r->jobs);
    grpc_shutdown();
    free(r);
}
