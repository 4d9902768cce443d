/* prismd ingest of streamed block statistics (DESIGN 13: at least 1,000,000 block records/s on
 * 2 cores), measured end to end against the real prismd over gRPC on loopback.
 *
 * Napkin math. A block record is one BlockGradStats: a 2-byte submessage header, block_id
 * (2-4 bytes), four tagged doubles (36 bytes) and numel (4-5 bytes), about 48 bytes on the
 * wire, so 1,000,000 records/s is ~48 MB/s of HTTP/2 DATA on loopback: a few memcpys, well under
 * 5% of one core. What bounds ingest is the policy thread, which does everything in one place:
 *   - protobuf-c unpack of an AgentMessage with B blocks: one allocation per BlockGradStats plus
 *     the pointer array, and the varint/double decode: ~40-80 ns per record;
 *   - the copy into prism_block_stats (one malloc per report) and the check of each record;
 *   - the rank merge: one hash lookup per record (block id -> dense slot) and an accumulate
 *     (sums, max, Chan's variance merge): ~15-30 ns per record;
 *   - one prism_policy_add_step per completed step, touching each block once more (another
 *     hash lookup and a window update, ~20-40 ns per block, divided by the ranks), and at each
 *     decision (every update_interval_steps) the score pass, a SQLite write of the changes and
 *     a PrecisionUpdate to every rank.
 * So ~100-200 ns of one core per record: 5-10 M records/s is the ceiling of a single policy
 * thread, and the target leaves ~1 us of the two cores per record for gRPC's own threads
 * (reading the socket, HPACK, framing) and for this client. Small reports (B ~ 100) pay the
 * per-message costs (the gRPC completion, the merge's step bookkeeping, one policy step per
 * step) over fewer records, and this client's one send in flight per rank (a round trip through
 * gRPC's threads per message) bounds them too, so records/s falls with B.
 *
 * The client is one thread per rank, each with its own channel and completion queue, one
 * SEND_MESSAGE and one RECV_MESSAGE in flight (updates are read and dropped, so prismd's
 * outbound queue never fills). Its own cost is kept small: each rank packs a few StepReport
 * bodies with protobuf-c before the clock starts, and per step only prepends the AgentMessage
 * and step fields (valid protobuf: a message is the concatenation of its fields) and copies
 * the bytes into a slice. Ranks keep within LOCKSTEP_STEPS of each other, as training ranks do,
 * because prismd's merge closes a step once 64 later ones are open.
 *
 * The clock runs from the first step report sent until prismd's GET /metrics shows every
 * record accepted (prism_block_records_received_total == R*S*B and the accepted step reports
 * == R*S), polled every 10 ms. The client shares the two cores with prismd, so the figure is
 * for the whole system, not prismd alone.
 *
 * Usage: bench_ingest PRISMD_PATH [--quick] [--ranks R --steps S --blocks B]. Every wait is
 * bounded; prismd gets SIGTERM, then SIGKILL after 5 s, on every path (and dies with us). */
#define _GNU_SOURCE
#include "prism/v1/prism.pb-c.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <grpc/byte_buffer.h>
#include <grpc/byte_buffer_reader.h>
#include <grpc/grpc.h>
#include <grpc/grpc_security.h>
#include <grpc/support/alloc.h>
#include <grpc/support/time.h>
#include <netinet/in.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define TARGET_RECORDS_PER_SECOND 1e6
#define MAX_RANKS 64
#define VARIANTS 8              /* distinct statistics per rank, cycled over the steps */
#define LOCKSTEP_STEPS 8        /* a rank sends step s once every rank has sent step s - 8 */
#define START_TIMEOUT_S 20.0    /* prismd up, every rank welcomed */
#define INGEST_TIMEOUT_S 120.0  /* from the first report until everything is counted */
#define POLL_INTERVAL_S 0.010
#define CLOSE_TIMEOUT_S 5.0     /* a stream's status after the close, then after a cancel */
#define KILL_AFTER_S 5.0        /* SIGTERM, then SIGKILL */
#define CALL_DEADLINE_S 300     /* gRPC deadline of a Connect call */

static const char *const bench_config_json =
    "{\"warmup_steps\": 10, \"update_interval_steps\": 10, \"step_timeout_ms\": 60000}\n";

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static void sleep_s(double s)
{
    struct timespec ts = {(time_t)s, (long)((s - (double)(time_t)s) * 1e9)};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
    }
}

static gpr_timespec deadline_in(double s)
{
    return gpr_time_add(gpr_now(GPR_CLOCK_MONOTONIC), gpr_time_from_micros((int64_t)(s * 1e6), GPR_TIMESPAN));
}

/* ---- the run shared by the rank threads and main ---- */

typedef struct bench_run {
    char target[64];            /* 127.0.0.1:PORT of prismd's gRPC */
    uint32_t ranks, blocks;
    uint64_t steps;
    _Atomic uint64_t sent[MAX_RANKS];   /* step reports whose send completed, per rank */
    atomic_int ready;           /* ranks welcomed */
    atomic_int failed;          /* a rank gave up; main stops */
    atomic_bool go;             /* main started the clock */
    atomic_bool stop;           /* main is done: close the streams */
} bench_run;

/* One rank's stream. The tags are the addresses of distinct members. */
typedef struct rank_ctx {
    bench_run *run;
    uint32_t rank;
    char error[512];
    uint8_t *body[VARIANTS];    /* packed StepReport without its step field */
    size_t body_len[VARIANTS];
    grpc_channel *channel;
    grpc_completion_queue *cq;
    grpc_call *call;
    grpc_byte_buffer *send_bb, *recv_bb;
    grpc_metadata_array initial_md, trailing_md;
    grpc_status_code status;
    grpc_slice status_details;
    const char *status_error;
    bool send_busy, recv_busy, close_busy, status_busy;
    bool stream_ended, welcomed;
    uint64_t updates;           /* ServiceMessages after the Welcome */
    char tag_send, tag_recv, tag_close, tag_status;
} rank_ctx;

static void rank_fail(rank_ctx *r, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void rank_fail(rank_ctx *r, const char *fmt, ...)
{
    if (r->error[0])
        return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(r->error, sizeof r->error, fmt, ap);
    va_end(ap);
    atomic_fetch_add(&r->run->failed, 1);
}

/* A deterministic pseudo-random stream (xorshift), so every run sends the same statistics. */
static double rnd(uint64_t *state)
{
    *state ^= *state << 13;
    *state ^= *state >> 7;
    *state ^= *state << 17;
    return (double)(*state >> 11) / 9007199254740992.0;
}

/* Packs the rank's VARIANTS StepReport bodies (blocks only; step 0 and no loss leave nothing
 * else on the wire). A third of the blocks drift between variants, so the scores move; the map
 * itself settles at the first decision (one PrecisionUpdate per rank). */
static bool pack_bodies(rank_ctx *r)
{
    uint32_t nb = r->run->blocks;
    Prism__V1__BlockGradStats *stats = calloc(nb, sizeof *stats);
    Prism__V1__BlockGradStats **ptrs = calloc(nb, sizeof *ptrs);
    bool ok = stats && ptrs;
    uint64_t seed = 0x9E3779B97F4A7C15ull ^ ((uint64_t)r->rank << 32);
    for (int v = 0; ok && v < VARIANTS; v++) {
        for (uint32_t i = 0; i < nb; i++) {
            double base = (i % 3 == 0) ? 0.5 + (double)((i + (uint32_t)v) % 5) / 4.0 : 0.2 + 1.6 * (double)(i % 7) / 7.0;
            double l2 = base * (0.9 + 0.2 * rnd(&seed));
            prism__v1__block_grad_stats__init(&stats[i]);
            stats[i].block_id = i;
            stats[i].l2_norm = l2;
            stats[i].max_abs = l2 * 0.01;
            stats[i].mean = (rnd(&seed) - 0.5) * 1e-6;
            stats[i].variance = l2 * l2 / 1048576.0;
            stats[i].numel = 1048576;
            stats[i].nonfinite = 0;
            ptrs[i] = &stats[i];
        }
        Prism__V1__StepReport sr = PRISM__V1__STEP_REPORT__INIT;
        sr.n_blocks = nb;
        sr.blocks = ptrs;
        r->body_len[v] = prism__v1__step_report__get_packed_size(&sr);
        r->body[v] = malloc(r->body_len[v] ? r->body_len[v] : 1);
        if (!r->body[v])
            ok = false;
        else
            prism__v1__step_report__pack(&sr, r->body[v]);
    }
    free(stats);
    free(ptrs);
    if (!ok)
        rank_fail(r, "out of memory packing %u blocks", nb);
    return ok;
}

static size_t put_varint(uint8_t *p, uint64_t v)
{
    size_t n = 0;
    while (v >= 0x80) {
        p[n++] = (uint8_t)(v | 0x80);
        v >>= 7;
    }
    p[n++] = (uint8_t)v;
    return n;
}

/* AgentMessage{step_report (field 2) = StepReport{step (field 1), body}} as one slice. */
static grpc_byte_buffer *step_message(const rank_ctx *r, uint64_t step)
{
    int v = (int)(step % VARIANTS);
    uint8_t step_field[11];
    step_field[0] = 0x08; /* field 1, varint */
    size_t step_len = 1 + put_varint(step_field + 1, step);
    uint64_t report_len = step_len + r->body_len[v];
    uint8_t head[11];
    head[0] = 0x12; /* field 2, length-delimited */
    size_t head_len = 1 + put_varint(head + 1, report_len);
    grpc_slice s = grpc_slice_malloc(head_len + report_len);
    uint8_t *p = GRPC_SLICE_START_PTR(s);
    memcpy(p, head, head_len);
    memcpy(p + head_len, step_field, step_len);
    memcpy(p + head_len + step_len, r->body[v], r->body_len[v]);
    grpc_byte_buffer *bb = grpc_raw_byte_buffer_create(&s, 1);
    grpc_slice_unref(s);
    return bb;
}

static grpc_slice buffer_bytes(grpc_byte_buffer *bb)
{
    grpc_byte_buffer_reader reader;
    if (!grpc_byte_buffer_reader_init(&reader, bb))
        return grpc_empty_slice();
    grpc_slice all = grpc_byte_buffer_reader_readall(&reader);
    grpc_byte_buffer_reader_destroy(&reader);
    return all;
}

/* The hand-made framing must read back as what prismd expects: checked once per rank. */
static bool check_step_message(rank_ctx *r, grpc_byte_buffer *bb, uint64_t step)
{
    grpc_slice s = buffer_bytes(bb);
    Prism__V1__AgentMessage *m =
        prism__v1__agent_message__unpack(NULL, GRPC_SLICE_LENGTH(s), GRPC_SLICE_START_PTR(s));
    grpc_slice_unref(s);
    bool ok = m && m->kind_case == PRISM__V1__AGENT_MESSAGE__KIND_STEP_REPORT && m->step_report->step == step &&
              m->step_report->n_blocks == r->run->blocks &&
              m->step_report->blocks[r->run->blocks - 1]->block_id == r->run->blocks - 1;
    if (m)
        prism__v1__agent_message__free_unpacked(m, NULL);
    if (!ok)
        rank_fail(r, "rank %u: the framed step report does not unpack as one", r->rank);
    return ok;
}

static bool start_batch(rank_ctx *r, const grpc_op *ops, size_t n, void *tag, const char *what)
{
    grpc_call_error e = grpc_call_start_batch(r->call, ops, n, tag, NULL);
    if (e != GRPC_CALL_OK) {
        rank_fail(r, "rank %u: grpc_call_start_batch(%s): error %d", r->rank, what, (int)e);
        return false;
    }
    return true;
}

static bool post_recv(rank_ctx *r)
{
    grpc_op ops[2];
    memset(ops, 0, sizeof ops);
    size_t n = 0;
    if (!r->welcomed) {
        ops[n].op = GRPC_OP_RECV_INITIAL_METADATA;
        ops[n++].data.recv_initial_metadata.recv_initial_metadata = &r->initial_md;
    }
    ops[n].op = GRPC_OP_RECV_MESSAGE;
    ops[n++].data.recv_message.recv_message = &r->recv_bb;
    r->recv_busy = start_batch(r, ops, n, &r->tag_recv, "recv");
    return r->recv_busy;
}

static bool post_send(rank_ctx *r, grpc_byte_buffer *bb, bool first)
{
    grpc_op ops[2];
    memset(ops, 0, sizeof ops);
    size_t n = 0;
    if (first) {
        ops[n].op = GRPC_OP_SEND_INITIAL_METADATA;
        ops[n].flags = GRPC_INITIAL_METADATA_WAIT_FOR_READY | GRPC_INITIAL_METADATA_WAIT_FOR_READY_EXPLICITLY_SET;
        ops[n++].data.send_initial_metadata.count = 0;
    }
    ops[n].op = GRPC_OP_SEND_MESSAGE;
    ops[n++].data.send_message.send_message = bb;
    r->send_bb = bb;
    r->send_busy = start_batch(r, ops, n, &r->tag_send, "send");
    if (!r->send_busy) {
        grpc_byte_buffer_destroy(bb);
        r->send_bb = NULL;
    }
    return r->send_busy;
}

/* The first ServiceMessage must be the Welcome. */
static void on_first_message(rank_ctx *r, grpc_byte_buffer *bb)
{
    grpc_slice s = buffer_bytes(bb);
    Prism__V1__ServiceMessage *m =
        prism__v1__service_message__unpack(NULL, GRPC_SLICE_LENGTH(s), GRPC_SLICE_START_PTR(s));
    grpc_slice_unref(s);
    if (!m)
        rank_fail(r, "rank %u: the first answer is not a prism.v1.ServiceMessage", r->rank);
    else if (m->kind_case == PRISM__V1__SERVICE_MESSAGE__KIND_ERROR)
        rank_fail(r, "rank %u: prismd answered Error %u: %s", r->rank, m->error->code,
                  m->error->message ? m->error->message : "");
    else if (m->kind_case != PRISM__V1__SERVICE_MESSAGE__KIND_WELCOME)
        rank_fail(r, "rank %u: the first answer is not a Welcome (kind %d)", r->rank, (int)m->kind_case);
    else
        r->welcomed = true;
    if (m)
        prism__v1__service_message__free_unpacked(m, NULL);
}

/* Waits up to `seconds` for one event and handles it; false when nothing came. */
static bool next_event(rank_ctx *r, double seconds)
{
    grpc_event ev = grpc_completion_queue_next(r->cq, deadline_in(seconds), NULL);
    if (ev.type != GRPC_OP_COMPLETE)
        return false;
    if (ev.tag == &r->tag_send) {
        r->send_busy = false;
        grpc_byte_buffer_destroy(r->send_bb);
        r->send_bb = NULL;
        if (!ev.success) {
            r->stream_ended = true;
            rank_fail(r, "rank %u: a send failed (the stream broke)", r->rank);
        }
    } else if (ev.tag == &r->tag_recv) {
        r->recv_busy = false;
        if (!ev.success || !r->recv_bb) {
            r->stream_ended = true;
        } else {
            if (!r->welcomed)
                on_first_message(r, r->recv_bb);
            else
                r->updates++;
            grpc_byte_buffer_destroy(r->recv_bb);
            r->recv_bb = NULL;
            if (!r->error[0])
                post_recv(r);
        }
    } else if (ev.tag == &r->tag_close) {
        r->close_busy = false;
    } else if (ev.tag == &r->tag_status) {
        r->status_busy = false;
        r->stream_ended = true;
    }
    return true;
}

static bool rank_setup(rank_ctx *r)
{
    grpc_channel_credentials *creds = grpc_insecure_credentials_create();
    grpc_arg arg;
    memset(&arg, 0, sizeof arg);
    arg.type = GRPC_ARG_INTEGER;
    arg.key = (char *)GRPC_ARG_MAX_RECEIVE_MESSAGE_LENGTH;
    arg.value.integer = -1;
    grpc_channel_args args = {1, &arg};
    r->channel = grpc_channel_create(r->run->target, creds, &args);
    grpc_channel_credentials_release(creds);
    r->cq = grpc_completion_queue_create_for_next(NULL);
    if (!r->channel || !r->cq) {
        rank_fail(r, "rank %u: cannot create a channel to %s", r->rank, r->run->target);
        return false;
    }
    grpc_slice method = grpc_slice_from_static_string("/prism.v1.PolicyService/Connect");
    gpr_timespec deadline =
        gpr_time_add(gpr_now(GPR_CLOCK_REALTIME), gpr_time_from_seconds(CALL_DEADLINE_S, GPR_TIMESPAN));
    r->call = grpc_channel_create_call(r->channel, NULL, GRPC_PROPAGATE_DEFAULTS, r->cq, method, NULL, deadline,
                                       NULL);
    grpc_slice_unref(method);
    if (!r->call) {
        rank_fail(r, "rank %u: cannot create the Connect call", r->rank);
        return false;
    }
    grpc_metadata_array_init(&r->initial_md);
    grpc_metadata_array_init(&r->trailing_md);
    grpc_op op;
    memset(&op, 0, sizeof op);
    op.op = GRPC_OP_RECV_STATUS_ON_CLIENT;
    op.data.recv_status_on_client.trailing_metadata = &r->trailing_md;
    op.data.recv_status_on_client.status = &r->status;
    op.data.recv_status_on_client.status_details = &r->status_details;
    op.data.recv_status_on_client.error_string = &r->status_error;
    r->status_busy = start_batch(r, &op, 1, &r->tag_status, "status");
    return r->status_busy;
}

/* Hello, then wait for its send and the Welcome. */
static bool rank_hello(rank_ctx *r)
{
    Prism__V1__Hello h = PRISM__V1__HELLO__INIT;
    h.job_id = (char *)"bench-ingest";
    h.rank = r->rank;
    h.world_size = r->run->ranks;
    h.node = (char *)"127.0.0.1";
    Prism__V1__AgentMessage m = PRISM__V1__AGENT_MESSAGE__INIT;
    m.kind_case = PRISM__V1__AGENT_MESSAGE__KIND_HELLO;
    m.hello = &h;
    size_t len = prism__v1__agent_message__get_packed_size(&m);
    grpc_slice s = grpc_slice_malloc(len);
    prism__v1__agent_message__pack(&m, GRPC_SLICE_START_PTR(s));
    grpc_byte_buffer *bb = grpc_raw_byte_buffer_create(&s, 1);
    grpc_slice_unref(s);
    if (!post_send(r, bb, true) || !post_recv(r))
        return false;
    double end = now_s() + START_TIMEOUT_S;
    while ((r->send_busy || !r->welcomed) && !r->error[0] && !r->stream_ended && now_s() < end)
        next_event(r, 0.1);
    if (!r->welcomed && !r->error[0])
        rank_fail(r, "rank %u: no Welcome from prismd within %.0f s%s", r->rank, START_TIMEOUT_S,
                  r->stream_ended ? " (the stream ended)" : "");
    return r->welcomed && !r->error[0];
}

static bool lockstep_allows(const bench_run *run, uint64_t step)
{
    for (uint32_t q = 0; q < run->ranks; q++)
        if (atomic_load(&run->sent[q]) + LOCKSTEP_STEPS < step)
            return false;
    return true;
}

/* Sends steps 1..S, one send in flight, reading whatever prismd sends meanwhile. */
static void rank_stream(rank_ctx *r)
{
    bench_run *run = r->run;
    double end = now_s() + INGEST_TIMEOUT_S + START_TIMEOUT_S;
    uint64_t step = 1;
    while (step <= run->steps && !r->error[0] && !r->stream_ended && !atomic_load(&run->stop)) {
        if (now_s() > end) {
            rank_fail(r, "rank %u: still at step %llu after %.0f s", r->rank, (unsigned long long)step,
                      INGEST_TIMEOUT_S + START_TIMEOUT_S);
            return;
        }
        if (!lockstep_allows(run, step)) {
            next_event(r, 0.0005);
            continue;
        }
        grpc_byte_buffer *bb = step_message(r, step);
        if (step == 1 && !check_step_message(r, bb, step)) {
            grpc_byte_buffer_destroy(bb);
            return;
        }
        if (!post_send(r, bb, false))
            return;
        while (r->send_busy && !r->stream_ended && now_s() < end)
            next_event(r, 0.1);
        if (r->send_busy || r->error[0])
            return;
        atomic_store(&run->sent[r->rank], step);
        step++;
    }
    if (r->stream_ended && !r->error[0] && step <= run->steps)
        rank_fail(r, "rank %u: prismd ended the stream at step %llu", r->rank, (unsigned long long)step);
}

/* Half-closes and waits for the status, cancelling when it does not come; then frees. */
static void rank_teardown(rank_ctx *r)
{
    if (r->call) {
        if (!r->stream_ended && !r->send_busy) {
            grpc_op op;
            memset(&op, 0, sizeof op);
            op.op = GRPC_OP_SEND_CLOSE_FROM_CLIENT;
            r->close_busy = start_batch(r, &op, 1, &r->tag_close, "close");
        }
        for (int attempt = 0; attempt < 2; attempt++) {
            double end = now_s() + CLOSE_TIMEOUT_S;
            while ((r->send_busy || r->recv_busy || r->close_busy || r->status_busy) && now_s() < end)
                next_event(r, 0.1);
            if (!(r->send_busy || r->recv_busy || r->close_busy || r->status_busy))
                break;
            grpc_call_cancel(r->call, NULL);
        }
        if (!r->status_busy && r->status != GRPC_STATUS_OK && !r->error[0] && !atomic_load(&r->run->stop)) {
            char *details = grpc_slice_to_c_string(r->status_details);
            rank_fail(r, "rank %u: stream ended with status %d: %s", r->rank, (int)r->status, details);
            gpr_free(details);
        }
        if (!r->status_busy) {
            grpc_slice_unref(r->status_details);
            gpr_free((void *)r->status_error);
        }
        grpc_call_unref(r->call);
        grpc_metadata_array_destroy(&r->initial_md);
        grpc_metadata_array_destroy(&r->trailing_md);
    }
    if (r->cq) {
        grpc_completion_queue_shutdown(r->cq);
        double end = now_s() + CLOSE_TIMEOUT_S;
        while (now_s() < end) {
            grpc_event ev = grpc_completion_queue_next(r->cq, deadline_in(0.1), NULL);
            if (ev.type == GRPC_QUEUE_SHUTDOWN)
                break;
        }
        grpc_completion_queue_destroy(r->cq);
    }
    if (r->channel)
        grpc_channel_destroy(r->channel);
    for (int v = 0; v < VARIANTS; v++)
        free(r->body[v]);
}

static void *rank_main(void *arg)
{
    rank_ctx *r = arg;
    bench_run *run = r->run;
    if (pack_bodies(r) && rank_setup(r) && rank_hello(r)) {
        atomic_fetch_add(&run->ready, 1);
        double end = now_s() + 2 * START_TIMEOUT_S;
        while (!atomic_load(&run->go) && !atomic_load(&run->stop) && !atomic_load(&run->failed) && now_s() < end)
            next_event(r, 0.005);
        if (atomic_load(&run->go)) {
            rank_stream(r);
            /* Keep reading updates until main has its figure. */
            end = now_s() + INGEST_TIMEOUT_S + START_TIMEOUT_S;
            while (!atomic_load(&run->stop) && !r->error[0] && !r->stream_ended && now_s() < end)
                next_event(r, 0.02);
        }
    }
    rank_teardown(r);
    return NULL;
}

/* ---- prismd: start, HTTP, stop ---- */

static volatile sig_atomic_t child_pid = 0;

static void on_signal(int sig)
{
    if (child_pid > 0)
        kill((pid_t)child_pid, SIGKILL);
    signal(sig, SIG_DFL);
    raise(sig);
}

static int free_port(int *fd_out)
{
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = 0};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof a;
    if (fd < 0 || bind(fd, (struct sockaddr *)&a, sizeof a) != 0 || getsockname(fd, (struct sockaddr *)&a, &len)) {
        if (fd >= 0)
            close(fd);
        return -1;
    }
    *fd_out = fd;
    return ntohs(a.sin_port);
}

/* GET path on 127.0.0.1:port; the body (NUL-terminated) into buf. Returns the HTTP status or -1. */
static int http_get(int port, const char *path, char *buf, size_t cap)
{
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return -1;
    struct timeval tv = {2, 0};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    char req[256];
    int n = snprintf(req, sizeof req, "GET %s HTTP/1.1\r\nHost: 127.0.0.1:%d\r\nConnection: close\r\n\r\n", path,
                     port);
    if (connect(fd, (struct sockaddr *)&a, sizeof a) != 0 || send(fd, req, (size_t)n, MSG_NOSIGNAL) != n) {
        close(fd);
        return -1;
    }
    size_t len = 0;
    for (int reads = 0; len + 1 < cap && reads < 100000; reads++) {
        ssize_t got = recv(fd, buf + len, cap - 1 - len, 0);
        if (got <= 0)
            break;
        len += (size_t)got;
    }
    close(fd);
    buf[len] = '\0';
    int status = -1;
    if (sscanf(buf, "HTTP/1.%*d %d", &status) != 1)
        return -1;
    return status;
}

/* The value of the sample line `name VALUE` in a Prometheus text exposition. */
static bool metric_value(const char *text, const char *name, uint64_t *out)
{
    size_t nl = strlen(name);
    for (const char *p = text; (p = strstr(p, name)) != NULL; p += nl) {
        if ((p == text || p[-1] == '\n') && p[nl] == ' ') {
            *out = strtoull(p + nl + 1, NULL, 10);
            return true;
        }
    }
    return false;
}

typedef struct ingest_counts {
    uint64_t records, accepted, malformed, late, repeated;
} ingest_counts;

static bool read_counts(int port, char *buf, size_t cap, ingest_counts *c)
{
    if (http_get(port, "/metrics", buf, cap) != 200)
        return false;
    return metric_value(buf, "prism_block_records_received_total", &c->records) &&
           metric_value(buf, "prism_step_reports_total{outcome=\"accepted\"}", &c->accepted) &&
           metric_value(buf, "prism_step_reports_total{outcome=\"malformed\"}", &c->malformed) &&
           metric_value(buf, "prism_step_reports_total{outcome=\"late\"}", &c->late) &&
           metric_value(buf, "prism_step_reports_total{outcome=\"repeated\"}", &c->repeated);
}

static pid_t start_prismd(const char *prismd, const char *dir, int grpc_port, int http_port)
{
    char grpc_addr[32], http_addr[32], data_dir[4096], config[4096], log_path[4096];
    snprintf(grpc_addr, sizeof grpc_addr, "127.0.0.1:%d", grpc_port);
    snprintf(http_addr, sizeof http_addr, "127.0.0.1:%d", http_port);
    snprintf(data_dir, sizeof data_dir, "%s/data", dir);
    snprintf(config, sizeof config, "%s/config.json", dir);
    snprintf(log_path, sizeof log_path, "%s/prismd.log", dir);
    FILE *f = fopen(config, "w");
    if (!f || fputs(bench_config_json, f) < 0 || fclose(f) != 0) {
        fprintf(stderr, "bench_ingest: cannot write %s\n", config);
        return -1;
    }
    int log_fd = open(log_path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0640);
    int null_fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
    if (log_fd < 0 || null_fd < 0) {
        fprintf(stderr, "bench_ingest: cannot open %s\n", log_path);
        return -1;
    }
    char *argv[] = {(char *)prismd, (char *)"--grpc-listen", grpc_addr, (char *)"--http-listen", http_addr,
                    (char *)"--data-dir", data_dir, (char *)"--config", config, NULL};
    pid_t parent = getpid();
    pid_t pid = fork();
    if (pid == 0) {
        /* Dies with the benchmark, whatever ends it. */
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        if (getppid() != parent)
            _exit(127);
        dup2(null_fd, 0);
        dup2(log_fd, 1);
        dup2(log_fd, 2);
        execv(prismd, argv);
        _exit(127);
    }
    close(log_fd);
    close(null_fd);
    if (pid < 0)
        fprintf(stderr, "bench_ingest: fork: %s\n", strerror(errno));
    else
        child_pid = pid;
    return pid;
}

/* SIGTERM, SIGKILL after KILL_AFTER_S; returns prismd's exit code (or -signal). */
static int stop_prismd(pid_t pid)
{
    int st = 0;
    kill(pid, SIGTERM);
    double end = now_s() + KILL_AFTER_S;
    pid_t w = 0;
    while ((w = waitpid(pid, &st, WNOHANG)) == 0 && now_s() < end)
        sleep_s(0.01);
    if (w == 0) {
        fprintf(stderr, "bench_ingest: prismd did not exit within %.0f s of SIGTERM; SIGKILL\n", KILL_AFTER_S);
        kill(pid, SIGKILL);
        waitpid(pid, &st, 0);
    }
    child_pid = 0;
    return WIFEXITED(st) ? WEXITSTATUS(st) : -WTERMSIG(st);
}

static int remove_entry(const char *path, const struct stat *sb, int flag, struct FTW *ftw)
{
    (void)sb;
    (void)flag;
    (void)ftw;
    remove(path);
    return 0;
}

static void print_log_tail(const char *dir)
{
    char path[4096];
    snprintf(path, sizeof path, "%s/prismd.log", dir);
    FILE *f = fopen(path, "r");
    if (!f)
        return;
    static char tail[4096];
    fseek(f, 0, SEEK_END);
    long size = ftell(f);
    fseek(f, size > (long)sizeof tail - 1 ? size - (long)sizeof tail + 1 : 0, SEEK_SET);
    size_t n = fread(tail, 1, sizeof tail - 1, f);
    tail[n] = '\0';
    fclose(f);
    fprintf(stderr, "---- end of prismd's log ----\n%s\n----\n", tail);
}

/* ---- one configuration ---- */

typedef struct bench_case {
    uint32_t ranks, blocks;
    uint64_t steps;
} bench_case;

static char metrics_buf[1 << 20];

/* Runs one configuration against a fresh prismd; prints its line. Returns 0 on success. */
static int run_case(const char *prismd, const bench_case *c)
{
    char dir[] = "/tmp/prism-bench-ingest-XXXXXX";
    if (!mkdtemp(dir)) {
        fprintf(stderr, "bench_ingest: mkdtemp: %s\n", strerror(errno));
        return 1;
    }
    int fd_a = -1, fd_b = -1;
    int grpc_port = free_port(&fd_a), http_port = free_port(&fd_b);
    if (fd_a >= 0)
        close(fd_a);
    if (fd_b >= 0)
        close(fd_b);
    if (grpc_port < 0 || http_port < 0) {
        fprintf(stderr, "bench_ingest: no free port on 127.0.0.1\n");
        nftw(dir, remove_entry, 16, FTW_DEPTH | FTW_PHYS);
        return 1;
    }
    pid_t pid = start_prismd(prismd, dir, grpc_port, http_port);
    if (pid < 0) {
        nftw(dir, remove_entry, 16, FTW_DEPTH | FTW_PHYS);
        return 1;
    }
    int failed = 0;
    const char *why = "";
    /* prismd is up when /metrics answers. */
    ingest_counts counts = {0};
    double end = now_s() + START_TIMEOUT_S;
    bool up = false;
    while (!up && now_s() < end) {
        int st;
        if (waitpid(pid, &st, WNOHANG) == pid) {
            child_pid = 0;
            pid = -1;
            break;
        }
        up = read_counts(http_port, metrics_buf, sizeof metrics_buf, &counts);
        if (!up)
            sleep_s(0.02);
    }
    bench_run *run = calloc(1, sizeof *run);
    rank_ctx *ranks = calloc(c->ranks, sizeof *ranks);
    pthread_t threads[MAX_RANKS];
    uint32_t started = 0;
    double seconds = 0;
    if (!up) {
        failed = 1;
        why = pid < 0 ? "prismd exited at start" : "prismd's /metrics did not answer";
    } else if (!run || !ranks) {
        failed = 1;
        why = "out of memory";
    } else {
        snprintf(run->target, sizeof run->target, "127.0.0.1:%d", grpc_port);
        run->ranks = c->ranks;
        run->blocks = c->blocks;
        run->steps = c->steps;
        for (; started < c->ranks; started++) {
            ranks[started].run = run;
            ranks[started].rank = started;
            if (pthread_create(&threads[started], NULL, rank_main, &ranks[started]) != 0) {
                failed = 1;
                why = "pthread_create";
                break;
            }
        }
        end = now_s() + START_TIMEOUT_S;
        while (!failed && atomic_load(&run->ready) < (int)c->ranks && !atomic_load(&run->failed) && now_s() < end)
            sleep_s(0.005);
        if (!failed && atomic_load(&run->ready) < (int)c->ranks) {
            failed = 1;
            why = "the ranks did not all get a Welcome";
        }
        uint64_t want_records = (uint64_t)c->ranks * c->steps * c->blocks;
        uint64_t want_reports = (uint64_t)c->ranks * c->steps;
        if (!failed) {
            double t0 = now_s();
            atomic_store(&run->go, true);
            end = t0 + INGEST_TIMEOUT_S;
            bool done = false;
            while (!done && !failed && now_s() < end) {
                sleep_s(POLL_INTERVAL_S);
                if (atomic_load(&run->failed)) {
                    failed = 1;
                    why = "a rank failed";
                } else if (read_counts(http_port, metrics_buf, sizeof metrics_buf, &counts)) {
                    done = counts.records == want_records && counts.accepted == want_reports;
                    if (!done && counts.accepted + counts.malformed + counts.late + counts.repeated >= want_reports) {
                        failed = 1;
                        why = "prismd did not accept every report";
                    }
                }
            }
            seconds = now_s() - t0;
            if (!done && !failed) {
                failed = 1;
                why = "timed out waiting for prismd to count every record";
            }
        }
        atomic_store(&run->stop, true);
        for (uint32_t i = 0; i < started; i++)
            pthread_join(threads[i], NULL);
        for (uint32_t i = 0; i < started; i++)
            if (ranks[i].error[0])
                fprintf(stderr, "bench_ingest: %s\n", ranks[i].error);
        uint64_t records = want_records;
        if (!failed) {
            double rate = (double)records / seconds;
            uint64_t updates = 0;
            for (uint32_t i = 0; i < started; i++)
                updates += ranks[i].updates;
            printf("ranks=%-2u steps=%-5llu blocks=%-6u records=%-9llu seconds=%7.3f records/s=%10.0f "
                   "target=%.2fx  (updates read: %llu)\n",
                   c->ranks, (unsigned long long)c->steps, c->blocks, (unsigned long long)records, seconds, rate,
                   rate / TARGET_RECORDS_PER_SECOND, (unsigned long long)updates);
            fflush(stdout);
        }
    }
    if (failed)
        fprintf(stderr,
                "bench_ingest: ranks=%u steps=%llu blocks=%u FAILED: %s (prismd counted records=%llu "
                "accepted=%llu malformed=%llu late=%llu repeated=%llu)\n",
                c->ranks, (unsigned long long)c->steps, c->blocks, why, (unsigned long long)counts.records,
                (unsigned long long)counts.accepted, (unsigned long long)counts.malformed,
                (unsigned long long)counts.late, (unsigned long long)counts.repeated);
    if (pid > 0) {
        int code = stop_prismd(pid);
        if (code != 0) {
            fprintf(stderr, "bench_ingest: prismd exited with %d after SIGTERM\n", code);
            failed = 1;
        }
    }
    if (failed)
        print_log_tail(dir);
    nftw(dir, remove_entry, 16, FTW_DEPTH | FTW_PHYS);
    free(ranks);
    free(run);
    return failed;
}

/* ---- main ---- */

static void usage(FILE *out)
{
    fprintf(out,
            "usage: bench_ingest PRISMD_PATH [--quick] [--ranks R --steps S --blocks B]\n"
            "Streams block statistics into a fresh prismd (127.0.0.1, scratch data dir) per configuration\n"
            "over gRPC Connect and times until GET /metrics counts every record (DESIGN 13: >= 1,000,000\n"
            "block records/s on 2 cores). Prints one line per configuration.\n"
            "  --quick      small sizes, a smoke test\n"
            "  --ranks R    run only this configuration (with --steps and --blocks; defaults 2, 2000, 1000)\n"
            "  --steps S\n"
            "  --blocks B\n"
            "  --help       this text\n");
}

static bool parse_u64(const char *s, uint64_t lo, uint64_t hi, uint64_t *out)
{
    char *end;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 10);
    if (errno || end == s || *end || v < lo || v > hi)
        return false;
    *out = v;
    return true;
}

int main(int argc, char **argv)
{
    const char *prismd = NULL;
    bool quick = false, single = false;
    uint64_t ranks = 2, steps = 2000, blocks = 1000;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
            usage(stdout);
            return 0;
        } else if (strcmp(a, "--quick") == 0) {
            quick = true;
        } else if ((strcmp(a, "--ranks") == 0 || strcmp(a, "--steps") == 0 || strcmp(a, "--blocks") == 0) &&
                   i + 1 < argc) {
            bool ok = strcmp(a, "--ranks") == 0    ? parse_u64(argv[i + 1], 1, MAX_RANKS, &ranks)
                      : strcmp(a, "--steps") == 0 ? parse_u64(argv[i + 1], 1, 10000000, &steps)
                                                  : parse_u64(argv[i + 1], 1, 100000, &blocks);
            if (!ok) {
                fprintf(stderr, "bench_ingest: %s %s: out of range\n", a, argv[i + 1]);
                return 2;
            }
            single = true;
            i++;
        } else if (a[0] != '-' && !prismd) {
            prismd = a;
        } else {
            fprintf(stderr, "bench_ingest: unknown argument %s\n", a);
            usage(stderr);
            return 2;
        }
    }
    if (!prismd) {
        usage(stderr);
        return 2;
    }
    if (access(prismd, X_OK) != 0) {
        fprintf(stderr, "bench_ingest: %s is not an executable\n", prismd);
        return 2;
    }
    signal(SIGINT, on_signal);
    signal(SIGTERM, on_signal);
    signal(SIGPIPE, SIG_IGN);

    static const bench_case full[] = {
        {1, 1000, 2000}, {2, 1000, 2000}, {4, 250, 2000}, {2, 100, 2000}, {2, 10000, 200},
    };
    static const bench_case smoke[] = {{1, 100, 50}, {2, 1000, 50}, {4, 250, 20}};
    bench_case one = {(uint32_t)ranks, (uint32_t)blocks, steps};
    const bench_case *cases = single ? &one : quick ? smoke : full;
    size_t ncases = single ? 1 : quick ? sizeof smoke / sizeof smoke[0] : sizeof full / sizeof full[0];

    printf("# prismd ingest over gRPC on 127.0.0.1, client and prismd on %ld online cores; "
           "target 1,000,000 block records/s\n",
           sysconf(_SC_NPROCESSORS_ONLN));
    fflush(stdout);
    grpc_init();
    int failures = 0;
    for (size_t i = 0; i < ncases; i++)
        failures += run_case(prismd, &cases[i]);
    grpc_shutdown();
    return failures ? 1 : 0;
}
