/* REST /v1 and /metrics (rest.h). JSON through jansson; the Prometheus text exposition written
 * by hand, one family at a time, HELP and TYPE first. */
#define _GNU_SOURCE
#include "rest.h"

#include "http_guard.h"
#include "auth.h"
#include "jobs.h"
#include "telemetry.h"
#include "telemetry_files.h"
#include "trace_files.h"

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <math.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define HISTORY_MAX 20

/* ---- HTTP request metrics ---- */

#define HTTP_BUCKETS 8
static const double http_bounds[HTTP_BUCKETS] = {1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 1e-2, 0.1};
static atomic_ullong http_bucket_counts[HTTP_BUCKETS];
static atomic_ullong http_count;
static atomic_ullong http_micros; /* sum of durations in microseconds */
static atomic_ullong http_by_class[6]; /* 1xx..5xx by status / 100 */

void prismd_http_observe(unsigned status, double seconds)
{
    for (int b = 0; b < HTTP_BUCKETS; b++)
        if (seconds <= http_bounds[b])
            atomic_fetch_add(&http_bucket_counts[b], 1);
    atomic_fetch_add(&http_count, 1);
    atomic_fetch_add(&http_micros, (unsigned long long)llround(seconds * 1e6));
    if (status / 100 < 6)
        atomic_fetch_add(&http_by_class[status / 100], 1);
}

/* ---- answers ---- */

static void answer_json(prismd_answer *a, unsigned status, json_t *obj)
{
    a->status = status;
    a->content_type = "application/json";
    a->body = obj ? prism_json_dumps_exact(obj, JSON_COMPACT | JSON_PRESERVE_ORDER) : NULL;
    json_decref(obj);
}

static void answer_error(prismd_answer *a, unsigned status, const char *code, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

static void answer_error(prismd_answer *a, unsigned status, const char *code, const char *fmt, ...)
{
    char message[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(message, sizeof message, fmt, ap);
    va_end(ap);
    answer_json(a, status, json_pack("{s:{s:s, s:s}}", "error", "code", code, "message", message));
    if (!a->body) /* a message cut inside a multi-byte character: the code still goes out */
        answer_json(a, status, json_pack("{s:{s:s, s:s}}", "error", "code", code, "message", code));
}

static json_t *opt_real(bool present, double x)
{
    return present && isfinite(x) ? json_real(x) : json_null();
}

/* Blocks per precision, every name a key, in the wire enum's order (the telemetry record's). */
static json_t *by_precision_json(const size_t counts[PRISM_PRECISION_COUNT])
{
    json_t *obj = json_object();
    for (int k = 0; obj && k < PRISM_PRECISION_COUNT; k++)
        json_object_set_new(obj, prism_precision_name((prism_precision)k), json_integer((json_int_t)counts[k]));
    return obj;
}

static json_t *summary_json(const prismd_snap_job *j)
{
    if (!j->has_summary)
        return json_null();
    const prism_summary *s = &j->summary;
    bool scored = s->scored > 0;
    return json_pack("{s:I, s:I, s:I, s:o, s:o, s:o, s:I, s:f, s:s, s:I, s:o, s:b}", "step_id", (json_int_t)s->step_id,
                     "blocks_bf16", (json_int_t)s->blocks_bf16, "blocks_int8", (json_int_t)s->blocks_low,
                     "mean_sensitivity", opt_real(scored, s->mean_sensitivity), "max_sensitivity",
                     opt_real(scored, s->max_sensitivity), "min_sensitivity", opt_real(scored, s->min_sensitivity),
                     "precision_changes", (json_int_t)s->precision_changes, "estimated_bandwidth_saving_pct",
                     s->bandwidth_saving_pct, "low_precision", prism_low_precision_name(s->low_precision), "map_version",
                     (json_int_t)s->map_version, "blocks_by_precision", by_precision_json(s->blocks_by_precision),
                     "loss_spike", s->loss_spike);
}

/* The job's fields of GET /v1/jobs and GET .../blocks, the loss-spike counters (DESIGN 4.7: every
 * spike, the decisions of their own, the blocks rolled back; kept across restarts) included. */
static json_t *job_json(const prismd_snap_job *j)
{
    return json_pack("{s:s, s:o, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I}", "job_id", j->id, "step",
                     j->has_step ? json_integer((json_int_t)j->last_step) : json_null(), "map_version",
                     (json_int_t)j->map_version, "decided_step", (json_int_t)j->decided_step, "effective_step",
                     (json_int_t)j->effective_step, "agents_connected", (json_int_t)j->agents, "world_size",
                     (json_int_t)j->world_size, "blocks", (json_int_t)j->nblocks, "loss_spikes",
                     (json_int_t)j->counters.loss_spikes, "loss_spike_decisions",
                     (json_int_t)j->counters.loss_spike_decisions, "blocks_rolled_back",
                     (json_int_t)j->counters.blocks_rolled_back);
}

/* Block b of job j (GET .../blocks and .../blocks/{id}): its format, the reason of its last
 * change, its candidate low format, the end of a loss spike's hold while the hold can still bind
 * (null once the job's last step has reached it, or when it was never held) and, when the job's
 * scale_mode is not "current" or the block has figures, its saturated and underflowed fractions
 * (the means over its window, null without figures). */
static json_t *block_json(const prismd_snap_job *j, size_t b)
{
    const prism_block_view *v = &j->blocks[b];
    const char *name = j->names ? j->names[b] : NULL;
    bool holding = v->held && (!j->has_step || j->last_step < v->hold_until);
    json_t *obj = json_pack("{s:I, s:o, s:s, s:o, s:o, s:o, s:o, s:o, s:s, s:b, s:s, s:o}", "id", (json_int_t)v->id,
                            "name", name ? json_string(name) : json_null(), "precision",
                            prism_precision_name(v->precision), "sensitivity", opt_real(v->has_score, v->sensitivity),
                            "grad_score", opt_real(v->has_score, v->grad_score), "error_score",
                            opt_real(v->has_score && v->has_error_score, v->error_score), "relative_magnitude",
                            opt_real(v->has_score, v->relative_magnitude), "last_switch_step",
                            v->has_switch ? json_integer((json_int_t)v->last_switch_step) : json_null(), "reason",
                            prism_reason_name(v->reason), "forced", v->forced, "candidate",
                            prism_precision_name(v->candidate), "hold_until",
                            holding ? json_integer((json_int_t)v->hold_until) : json_null());
    if (obj && (j->config.scale_mode != PRISM_SCALE_CURRENT || v->has_saturation)) {
        json_object_set_new(obj, "saturated_fraction", opt_real(v->has_saturation, v->saturated_fraction));
        json_object_set_new(obj, "underflowed_fraction", opt_real(v->has_saturation, v->underflowed_fraction));
    }
    return obj;
}

/* The blocks of the job's current map at each precision, every precision a key. */
static json_t *precisions_json(const prismd_snap_job *j)
{
    static const prism_precision order[PRISM_PRECISION_COUNT] = {
        PRISM_PRECISION_BF16, PRISM_PRECISION_FP8_E4M3, PRISM_PRECISION_FP8_E5M2, PRISM_PRECISION_INT8,
        PRISM_PRECISION_INT4};
    size_t counts[PRISM_PRECISION_COUNT] = {0};
    for (size_t i = 0; i < j->nblocks; i++)
        if ((unsigned)j->blocks[i].precision < PRISM_PRECISION_COUNT)
            counts[j->blocks[i].precision]++;
    json_t *obj = json_object();
    for (size_t k = 0; obj && k < PRISM_PRECISION_COUNT; k++)
        json_object_set_new(obj, prism_precision_name(order[k]), json_integer((json_int_t)counts[order[k]]));
    return obj;
}

/* A job of GET /v1/jobs: job_json, the two rank counts the jobs view warns with, the blocks at
 * each precision and the last decision (null before any: its time also when the store had none). */
static json_t *job_entry_json(const prismd_snap_job *j)
{
    json_t *obj = job_json(j);
    if (obj) {
        json_object_set_new(obj, "ranks_lagging", json_integer((json_int_t)j->ranks_lagging));
        json_object_set_new(obj, "ranks_not_acked", json_integer((json_int_t)j->ranks_not_acked));
        json_object_set_new(obj, "precisions", precisions_json(j));
        json_object_set_new(obj, "bandwidth_saving_pct", opt_real(j->has_summary, j->summary.bandwidth_saving_pct));
        json_object_set_new(obj, "last_decision_step",
                            j->has_summary ? json_integer((json_int_t)j->summary.step_id) : json_null());
        json_object_set_new(obj, "last_decision_unix", opt_real(j->has_summary, j->decided_unix));
        json_object_set_new(obj, "blocks_by_precision",
                            j->has_summary ? by_precision_json(j->summary.blocks_by_precision) : json_null());
    }
    return obj;
}

static char *render_jobs(const void *ctx)
{
    const prismd_snapshot *snap = ctx;
    json_t *jobs = json_array();
    for (size_t i = 0; jobs && i < snap->njobs; i++)
        json_array_append_new(jobs, job_entry_json(&snap->jobs[i]));
    json_t *obj = json_pack("{s:o}", "jobs", jobs);
    char *text = obj ? prism_json_dumps_exact(obj, JSON_COMPACT | JSON_PRESERVE_ORDER) : NULL;
    json_decref(obj);
    return text;
}

static char *render_blocks(const void *ctx)
{
    const prismd_snap_job *j = ctx;
    json_t *blocks = json_array();
    for (size_t i = 0; blocks && i < j->nblocks; i++)
        json_array_append_new(blocks, block_json(j, i));
    json_t *obj = job_json(j);
    if (obj) {
        json_object_set_new(obj, "blocks", blocks);
        json_object_set_new(obj, "telemetry", summary_json(j));
    }
    char *text = obj ? prism_json_dumps_exact(obj, JSON_COMPACT | JSON_PRESERVE_ORDER) : NULL;
    json_decref(obj);
    return text;
}

/* Block maps of more blocks than this are streamed, one block at a time, rather than rendered
 * whole (and cached) per snapshot: rendering 100,000 blocks at once built a JSON tree of ~150 MB. */
#define PRISMD_BLOCKS_CACHED_MAX 4096

/* A streamed block map: the same document as render_blocks, written a block at a time from the
 * snapshot it holds a reference to. */
typedef struct blocks_stream {
    prismd_snapshot *snap;
    const prismd_snap_job *j;
    size_t next;         /* the next block to render */
    int stage;           /* 0: the job's fields, 1: blocks, 2: the telemetry summary, 3: done */
    char *piece;         /* rendered and not yet all handed out */
    size_t piece_len, piece_pos;
} blocks_stream;

/* The next piece of the document, malloc'd; NULL when out of memory. */
static char *blocks_piece(blocks_stream *b)
{
    const prismd_snap_job *j = b->j;
    char *piece = NULL, *text = NULL;
    json_t *obj = NULL;
    switch (b->stage) {
    case 0: /* {"job_id":...,"blocks":[ (the job's block count dropped: the array takes its place) */
        obj = job_json(j);
        json_object_del(obj, "blocks");
        text = obj ? prism_json_dumps_exact(obj, JSON_COMPACT | JSON_PRESERVE_ORDER) : NULL;
        if (text && asprintf(&piece, "%.*s,\"blocks\":[", (int)strlen(text) - 1, text) < 0)
            piece = NULL;
        b->stage = 1;
        break;
    case 1:
        obj = block_json(j, b->next);
        text = obj ? prism_json_dumps_exact(obj, JSON_COMPACT | JSON_PRESERVE_ORDER) : NULL;
        if (text && asprintf(&piece, "%s%s", b->next ? "," : "", text) < 0)
            piece = NULL;
        if (++b->next == j->nblocks)
            b->stage = 2;
        break;
    default: /* ],"telemetry":{...}} */
        obj = summary_json(j);
        text = obj ? prism_json_dumps_exact(obj, JSON_COMPACT | JSON_PRESERVE_ORDER | JSON_ENCODE_ANY) : NULL;
        if (text && asprintf(&piece, "],\"telemetry\":%s}", text) < 0)
            piece = NULL;
        b->stage = 3;
        break;
    }
    free(text);
    json_decref(obj);
    return piece;
}

static ssize_t blocks_read(void *cls, char *buf, size_t max)
{
    blocks_stream *b = cls;
    size_t n = 0;
    while (n < max) {
        if (b->piece_pos < b->piece_len) {
            n = prismd_piece_copy(buf, n, max, b->piece, b->piece_len, &b->piece_pos);
            continue;
        }
        free(b->piece);
        b->piece = NULL;
        b->piece_len = b->piece_pos = 0;
        if (b->stage == 3)
            break;
        if (b->stage == 1 && b->next == b->j->nblocks)
            b->stage = 2;
        if (!(b->piece = blocks_piece(b)))
            return -1;
        b->piece_len = strlen(b->piece);
    }
    return (ssize_t)n;
}

static void blocks_done(void *cls)
{
    blocks_stream *b = cls;
    free(b->piece);
    prismd_snapshot_release(b->snap);
    free(b);
    prismd_streamed_answer_release();
}

static void answer_cached(prismd_answer *a, prismd_snapshot *snap, _Atomic(char *) *slot, _Atomic(char *) *gz_slot,
                          char *(*render)(const void *), const void *ctx);

/* GET .../blocks: from the snapshot's cache for a map of up to PRISMD_BLOCKS_CACHED_MAX blocks
 * (made once per snapshot, gzip too), streamed beyond it (plain JSON, one of
 * --max-streamed-answers), so that memory per answer is one block's rendering. */
static void get_blocks(prismd_rest *r, prismd_snapshot *snap, const prismd_snap_job *j, prismd_answer *a)
{
    prismd_snap_job *mj = (prismd_snap_job *)j;
    if (j->nblocks <= PRISMD_BLOCKS_CACHED_MAX) {
        answer_cached(a, snap, &mj->blocks_json, &mj->blocks_gzip, render_blocks, j);
        return;
    }
    if (!prismd_streamed_answer_acquire(r->mem)) {
        answer_error(a, 503, "unavailable", "%zu large answers are being sent, the limit "
                     "(--max-streamed-answers); try again", r->mem->max_streamed_answers);
        return;
    }
    blocks_stream *b = calloc(1, sizeof *b);
    if (!b) {
        prismd_streamed_answer_release();
        answer_error(a, 500, "internal", "out of memory");
        return;
    }
    atomic_fetch_add(&snap->refs, 1);
    b->snap = snap;
    b->j = j;
    a->status = 200;
    a->content_type = "application/json";
    a->read = blocks_read;
    a->done = blocks_done;
    a->stream_cls = b;
}

/* gzip of text, stored as an 8-byte length then the bytes, so that it sits in a char* slot. */
typedef struct gzip_job {
    _Atomic(char *) *plain;
    char *(*render)(const void *ctx);
    const void *ctx;
} gzip_job;

static char *render_gzip(const void *arg)
{
    const gzip_job *g = arg;
    const char *text = prismd_snapshot_cached(g->plain, g->render, g->ctx);
    if (!text)
        return NULL;
    size_t len = strlen(text);
    z_stream z;
    memset(&z, 0, sizeof z);
    if (deflateInit2(&z, 6, Z_DEFLATED, 15 + 16, 8, Z_DEFAULT_STRATEGY) != Z_OK)
        return NULL;
    uLong bound = deflateBound(&z, (uLong)len);
    char *out = malloc(sizeof(uint64_t) + bound);
    if (out) {
        z.next_in = (Bytef *)text;
        z.avail_in = (uInt)len;
        z.next_out = (Bytef *)out + sizeof(uint64_t);
        z.avail_out = (uInt)bound;
        if (deflate(&z, Z_FINISH) != Z_STREAM_END) {
            free(out);
            out = NULL;
        } else {
            uint64_t n = z.total_out;
            memcpy(out, &n, sizeof n);
        }
    }
    deflateEnd(&z);
    return out;
}

/* A rendering kept in the snapshot and sent as it is (no copy), gzip-compressed when the
 * client accepts it (compressed once per snapshot too): the answer holds a reference to the
 * snapshot until the response is gone. */
static void answer_cached(prismd_answer *a, prismd_snapshot *snap, _Atomic(char *) *slot, _Atomic(char *) *gz_slot,
                          char *(*render)(const void *), const void *ctx)
{
    const char *text;
    if (a->accept_gzip) {
        gzip_job g = {slot, render, ctx};
        text = prismd_snapshot_cached(gz_slot, render_gzip, &g);
        if (text) {
            uint64_t n;
            memcpy(&n, text, sizeof n);
            a->body_len = (size_t)n;
            a->gzip = true;
            text += sizeof n;
        }
    } else {
        text = prismd_snapshot_cached(slot, render, ctx);
    }
    if (!text) {
        answer_error(a, 500, "internal", "out of memory");
        return;
    }
    atomic_fetch_add(&snap->refs, 1);
    a->hold = snap;
    a->body = (char *)text;
    a->status = 200;
    a->content_type = "application/json";
}

/* ---- GET /v1/jobs/{job}/ranks ---- */

/* A count from the wire as a JSON integer: values past what JSON integers hold here (2^63 - 1)
 * are shown as that. */
static json_t *wire_count(uint64_t v)
{
    return json_integer(v > (uint64_t)INT64_MAX ? INT64_MAX : (json_int_t)v);
}

static json_t *opt_count(bool present, uint64_t v)
{
    return present ? wire_count(v) : json_null();
}

/* One rank of the answer; f NULL: a rank that never sent a Hello (every fact null). */
static json_t *rank_json(const prismd_snap_job *j, uint32_t rank, const prismd_rank_facts *f)
{
    json_t *device = json_null();
    if (f && f->has_device)
        device = json_pack("{s:s, s:s, s:o, s:o, s:o, s:o, s:o, s:o}", "device_class", f->device_class,
                           "device_name", f->device_name, "memory_bytes", wire_count(f->memory_bytes),
                           "bf16_ops_per_second", opt_real(true, f->bf16_ops_per_second), "fp16_ops_per_second",
                           opt_real(true, f->fp16_ops_per_second), "int8_ops_per_second",
                           opt_real(true, f->int8_ops_per_second), "fp8_ops_per_second",
                           opt_real(true, f->fp8_ops_per_second), "h2d_bytes_per_second",
                           opt_real(true, f->h2d_bytes_per_second));
    return json_pack("{s:I, s:b, s:o, s:o, s:o, s:o, s:o, s:o, s:o, s:b, s:b}", "rank", (json_int_t)rank, "connected",
                     f && f->connected, "node", f && f->node ? json_string(f->node) : json_null(), "device", device,
                     "last_step", opt_count(f && f->has_step, f ? f->last_step : 0), "acked_map_version",
                     opt_count(f && f->has_ack, f ? f->acked_map_version : 0), "applied_step",
                     opt_count(f && f->has_ack, f ? f->applied_step : 0), "reports_dropped",
                     opt_count(f && f->has_reports_dropped, f ? f->reports_dropped : 0), "late_switches",
                     opt_count(f && f->has_late_switches, f ? f->late_switches : 0), "lagging",
                     prismd_rank_lagging(f, j->has_newest_step, j->newest_step), "acked_current_map",
                     prismd_rank_acked_current(f, j->map_version));
}

/* Answers of more ranks than this are streamed, one rank at a time. */
#define PRISMD_RANKS_WHOLE_MAX 4096

/* The ranks answer as pieces: the job's fields, then each rank 0..world_size-1 (the known ones
 * from the snapshot, the others all null), then the end; the same for a whole and a streamed
 * answer. */
typedef struct ranks_stream {
    prismd_snapshot *snap; /* held by a streamed answer; NULL for a whole one */
    const prismd_snap_job *j;
    uint64_t next;         /* the next rank to render */
    size_t known;          /* the index in j->ranks of the first known rank >= next */
    int stage;             /* 0: the job's fields, 1: ranks, 2: the end, 3: done */
    char *piece;
    size_t piece_len, piece_pos;
} ranks_stream;

/* The next piece of the ranks answer, malloc'd; NULL when out of memory. */
static char *ranks_piece(ranks_stream *r)
{
    const prismd_snap_job *j = r->j;
    char *piece = NULL, *text = NULL;
    json_t *obj = NULL;
    if (r->stage == 1 && r->next >= j->world_size)
        r->stage = 2;
    switch (r->stage) {
    case 0: /* {"job_id":...,"ranks":[ */
        obj = json_pack("{s:s, s:I, s:I, s:o}", "job_id", j->id, "world_size", (json_int_t)j->world_size,
                        "map_version", (json_int_t)j->map_version, "last_step",
                        opt_count(j->has_newest_step, j->newest_step));
        text = obj ? prism_json_dumps_exact(obj, JSON_COMPACT | JSON_PRESERVE_ORDER) : NULL;
        if (text && asprintf(&piece, "%.*s,\"ranks\":[", (int)strlen(text) - 1, text) < 0)
            piece = NULL;
        r->stage = 1;
        break;
    case 1: {
        const prismd_rank_facts *f = NULL;
        if (r->known < j->nranks && j->ranks[r->known].rank == r->next)
            f = &j->ranks[r->known++];
        obj = rank_json(j, (uint32_t)r->next, f);
        text = obj ? prism_json_dumps_exact(obj, JSON_COMPACT | JSON_PRESERVE_ORDER) : NULL;
        if (text && asprintf(&piece, "%s%s", r->next ? "," : "", text) < 0)
            piece = NULL;
        r->next++;
        break;
    }
    default:
        piece = strdup("]}");
        r->stage = 3;
        break;
    }
    free(text);
    json_decref(obj);
    return piece;
}

static ssize_t ranks_read(void *cls, char *buf, size_t max)
{
    ranks_stream *r = cls;
    size_t n = 0;
    while (n < max) {
        if (r->piece_pos < r->piece_len) {
            n = prismd_piece_copy(buf, n, max, r->piece, r->piece_len, &r->piece_pos);
            continue;
        }
        free(r->piece);
        r->piece = NULL;
        r->piece_len = r->piece_pos = 0;
        if (r->stage == 3)
            break;
        if (!(r->piece = ranks_piece(r)))
            return -1;
        r->piece_len = strlen(r->piece);
    }
    return (ssize_t)n;
}

static void ranks_done(void *cls)
{
    ranks_stream *r = cls;
    free(r->piece);
    prismd_snapshot_release(r->snap);
    free(r);
    prismd_streamed_answer_release();
}

/* GET .../ranks: rendered whole for up to PRISMD_RANKS_WHOLE_MAX ranks, streamed beyond it (one
 * of --max-streamed-answers), so that memory per answer is one rank's rendering. */
static void get_ranks(prismd_rest *rest, prismd_snapshot *snap, const prismd_snap_job *j, prismd_answer *a)
{
    if (j->world_size <= PRISMD_RANKS_WHOLE_MAX) {
        ranks_stream r = {.j = j};
        char *text = NULL;
        size_t len = 0;
        FILE *f = open_memstream(&text, &len);
        bool ok = f != NULL;
        while (ok && r.stage != 3) {
            char *piece = ranks_piece(&r);
            ok = piece && fputs(piece, f) >= 0;
            free(piece);
        }
        if (f && fclose(f) != 0)
            ok = false;
        if (!ok) {
            free(text);
            answer_error(a, 500, "internal", "out of memory");
            return;
        }
        a->status = 200;
        a->content_type = "application/json";
        a->body = text;
        a->body_len = len;
        return;
    }
    if (!prismd_streamed_answer_acquire(rest->mem)) {
        answer_error(a, 503, "unavailable", "%zu large answers are being sent, the limit "
                     "(--max-streamed-answers); try again", rest->mem->max_streamed_answers);
        return;
    }
    ranks_stream *r = calloc(1, sizeof *r);
    if (!r) {
        prismd_streamed_answer_release();
        answer_error(a, 500, "internal", "out of memory");
        return;
    }
    atomic_fetch_add(&snap->refs, 1);
    r->snap = snap;
    r->j = j;
    a->status = 200;
    a->content_type = "application/json";
    a->read = ranks_read;
    a->done = ranks_done;
    a->stream_cls = r;
}

static const prism_block_view *find_block(const prismd_snap_job *j, uint32_t id)
{
    size_t lo = 0, hi = j->nblocks;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (j->blocks[mid].id == id)
            return &j->blocks[mid];
        if (j->blocks[mid].id < id)
            lo = mid + 1;
        else
            hi = mid;
    }
    return NULL;
}

static void get_block(prismd_rest *r, const prismd_snap_job *j, const char *id_text, prismd_answer *a)
{
    char *end = NULL;
    unsigned long long id = strtoull(id_text, &end, 10);
    if (id_text[0] < '0' || id_text[0] > '9' || *end || id > UINT32_MAX) {
        answer_error(a, 400, "invalid_argument", "block id \"%.64s\" is not an integer from 0 to 4294967295",
                     id_text);
        return;
    }
    const prism_block_view *v = find_block(j, (uint32_t)id);
    if (!v) {
        answer_error(a, 404, "not_found", "job %s has no block %llu", j->id, id);
        return;
    }
    json_t *obj = block_json(j, (size_t)(v - j->blocks));
    json_t *history = json_array();
    prismd_switch_row rows[HISTORY_MAX];
    prism_error err;
    long n = r->reader ? prismd_store_switch_history(r->reader, j->id, (uint32_t)id, rows, HISTORY_MAX, &err) : 0;
    for (long i = 0; i < n; i++)
        json_array_append_new(history, json_pack("{s:I, s:s, s:s, s:s, s:I}", "step", (json_int_t)rows[i].step, "from",
                                                 rows[i].from, "to", rows[i].to, "reason", rows[i].reason,
                                                 "map_version", (json_int_t)rows[i].map_version));
    if (obj) {
        json_object_set_new(obj, "job_id", json_string(j->id));
        json_object_set_new(obj, "history", history);
    }
    answer_json(a, 200, obj);
}

/* A query integer in [min, max], or def when absent; false when present but not one. */
static bool query_int(prismd_query_fn query, void *ctx, const char *name, unsigned long long def,
                      unsigned long long min, unsigned long long max, unsigned long long *out, prismd_answer *a)
{
    const char *text = query ? query(ctx, name) : NULL;
    if (!text) {
        *out = def;
        return true;
    }
    char *end = NULL;
    unsigned long long x = strtoull(text, &end, 10);
    if (text[0] < '0' || text[0] > '9' || *end || x < min || x > max) {
        answer_error(a, 400, "invalid_argument", "%s: \"%.64s\" is not an integer from %llu to %llu", name, text, min,
                     max);
        return false;
    }
    *out = x;
    return true;
}

/* A streamed telemetry answer: the reader and its slot among --max-streamed-answers. */
static ssize_t telemetry_read(void *cls, char *buf, size_t max)
{
    return prismd_telemetry_reader_read(cls, buf, max);
}

static void telemetry_done(void *cls)
{
    if (prismd_telemetry_reader_truncated(cls))
        atomic_fetch_add(&prismd_limits.telemetry_answers_truncated, 1);
    prismd_telemetry_reader_close(cls);
    prismd_streamed_answer_release();
}

/* The job's telemetry records with step_id >= since_step, oldest first, at most limit, read
 * across the rotated files and streamed (telemetry_files.h): memory per answer is one chunk
 * however large the records, and an answer stops at --telemetry-answer-bytes of records. */
static void get_telemetry(prismd_rest *r, const prismd_snap_job *j, prismd_query_fn query, void *ctx,
                          prismd_answer *a)
{
    unsigned long long since, limit;
    if (!query_int(query, ctx, "since_step", 0, 0, UINT64_MAX >> 1, &since, a) ||
        !query_int(query, ctx, "limit", 100, 1, 1000, &limit, a))
        return;
    char path[4096];
    prismd_job_file(r->data_dir ? r->data_dir : "", j->id, j->config.telemetry_file, path, sizeof path);
    size_t max_bytes = r->mem && r->mem->telemetry_answer_bytes ? r->mem->telemetry_answer_bytes : SIZE_MAX;
    size_t keep = r->mem ? r->mem->telemetry_keep : 0;
    if (!prismd_streamed_answer_acquire(r->mem)) {
        answer_error(a, 503, "unavailable", "%zu large answers are being sent, the limit "
                     "(--max-streamed-answers); try again", r->mem->max_streamed_answers);
        return;
    }
    prismd_telemetry_reader *reader =
        prismd_telemetry_reader_open(r->data_dir ? path : "", r->data_dir ? keep : 0, j->id, since, limit, max_bytes);
    if (!reader) {
        prismd_streamed_answer_release();
        answer_error(a, 500, "internal", "out of memory");
        return;
    }
    a->status = 200;
    a->content_type = "application/json";
    a->read = telemetry_read;
    a->done = telemetry_done;
    a->stream_cls = reader;
}

/* A streamed trace answer: the reader and its slot among --max-streamed-answers. */
static ssize_t trace_read(void *cls, char *buf, size_t max)
{
    return prismd_trace_reader_read(cls, buf, max);
}

static void trace_done(void *cls)
{
    prismd_trace_reader_close(cls);
    prismd_streamed_answer_release();
}

/* The job's binary trace (DESIGN 4.6): every segment, oldest first, each cut at its last whole
 * record, streamed a chunk at a time (trace_files.h). A job with no trace yet: 200, empty. A trace
 * that cannot be read whole: 500 (503 when prismd is out of file descriptors), never a 200 with a
 * hole in it. */
static void get_trace(prismd_rest *r, const prismd_snap_job *j, prismd_answer *a)
{
    if (!prismd_streamed_answer_acquire(r->mem)) {
        answer_error(a, 503, "unavailable", "%zu large answers are being sent, the limit "
                     "(--max-streamed-answers); try again", r->mem->max_streamed_answers);
        return;
    }
    prismd_trace_reader *reader;
    prism_error err;
    prism_status st = prismd_trace_reader_open(r->data_dir, j->id, &reader, &err);
    if (st) {
        prismd_streamed_answer_release();
        if (st == PRISM_ERR_UNAVAILABLE)
            answer_error(a, 503, "unavailable", "job %s's trace cannot be read now: %s; try again", j->id,
                         err.message);
        else
            answer_error(a, 500, "internal", "job %s's trace cannot be read: %s", j->id, err.message);
        return;
    }
    a->status = 200;
    a->content_type = "application/x-prism-trace";
    a->read = trace_read;
    a->done = trace_done;
    a->stream_cls = reader;
}

/* ---- /metrics ---- */

typedef struct text {
    char *data;
    size_t len, cap;
    bool failed;
} text;

static void add(text *t, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

static void add(text *t, const char *fmt, ...)
{
    for (int attempt = 0; attempt < 2 && !t->failed; attempt++) {
        va_list ap;
        va_start(ap, fmt);
        int n = vsnprintf(t->data ? t->data + t->len : NULL, t->data ? t->cap - t->len : 0, fmt, ap);
        va_end(ap);
        if (n < 0) {
            t->failed = true;
            return;
        }
        if (t->data && t->len + (size_t)n < t->cap) {
            t->len += (size_t)n;
            return;
        }
        size_t ncap = t->cap ? t->cap : 8192;
        while (ncap <= t->len + (size_t)n)
            ncap *= 2;
        char *nd = realloc(t->data, ncap);
        if (!nd) {
            t->failed = true;
            return;
        }
        t->data = nd;
        t->cap = ncap;
    }
}

static void family(text *t, const char *name, const char *type, const char *help)
{
    add(t, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
}

/* The limits of mem_limits.h: how often each was reached, and the gauges they bound. */
static void limits_metrics(text *t)
{
    const prismd_limit_counters *c = &prismd_limits;
    family(t, "prism_stream_buffer_bytes", "gauge",
           "Unsent bytes held for gRPC calls (stream queues, GetBlockMap answers).");
    add(t, "prism_stream_buffer_bytes %llu\n", (unsigned long long)atomic_load(&c->stream_buffer_bytes));
    family(t, "prism_streams_cut_off_total", "counter",
           "gRPC streams ended with RESOURCE_EXHAUSTED for unsent data, by the limit reached.");
    add(t, "prism_streams_cut_off_total{limit=\"stream\"} %llu\n",
        (unsigned long long)atomic_load(&c->streams_cut_stream_buffer));
    add(t, "prism_streams_cut_off_total{limit=\"total\"} %llu\n",
        (unsigned long long)atomic_load(&c->streams_cut_total_buffer));
    family(t, "prism_auto_jobs_refused_total", "counter",
           "Hellos refused because their address already auto-created --max-auto-jobs-per-peer jobs.");
    add(t, "prism_auto_jobs_refused_total %llu\n", (unsigned long long)atomic_load(&c->auto_jobs_refused));
    family(t, "prism_telemetry_rotations_total", "counter", "Telemetry files rotated at --telemetry-max-bytes.");
    add(t, "prism_telemetry_rotations_total %llu\n", (unsigned long long)atomic_load(&c->telemetry_rotations));
    family(t, "prism_telemetry_files_dropped_total", "counter",
           "Oldest rotated telemetry files deleted (past --telemetry-keep).");
    add(t, "prism_telemetry_files_dropped_total %llu\n",
        (unsigned long long)atomic_load(&c->telemetry_files_dropped));
    family(t, "prism_telemetry_answers_truncated_total", "counter",
           "GET .../telemetry answers cut at --telemetry-answer-bytes.");
    add(t, "prism_telemetry_answers_truncated_total %llu\n",
        (unsigned long long)atomic_load(&c->telemetry_answers_truncated));
    family(t, "prism_trace_bytes_written_total", "counter",
           "Bytes written to the jobs' binary traces (DATA_DIR/jobs/JOB/trace/, GET /v1/jobs/{job}/trace).");
    add(t, "prism_trace_bytes_written_total %llu\n", (unsigned long long)atomic_load(&c->trace_bytes_written));
    family(t, "prism_trace_records_total", "counter",
           "Records written to the jobs' binary traces, by kind (each segment starts with a header and the layout, "
           "calibration and config in force).");
    static const char *const kinds[PRISMD_TRACE_KINDS] = {"header", "layout", "calibration", "config", "step"};
    for (int k = 0; k < PRISMD_TRACE_KINDS; k++)
        add(t, "prism_trace_records_total{kind=\"%s\"} %llu\n", kinds[k],
            (unsigned long long)atomic_load(&c->trace_records[k]));
    family(t, "prism_trace_segments_dropped_total", "counter",
           "Oldest trace segments deleted to keep a job's trace under --trace-max-bytes.");
    add(t, "prism_trace_segments_dropped_total %llu\n", (unsigned long long)atomic_load(&c->trace_segments_dropped));
    family(t, "prism_trace_write_errors_total", "counter",
           "Trace writes that failed (logged once per job); the job's trace is off until its next segment.");
    add(t, "prism_trace_write_errors_total %llu\n", (unsigned long long)atomic_load(&c->trace_write_errors));
    family(t, "prism_streamed_answers", "gauge", "HTTP answers being streamed now.");
    add(t, "prism_streamed_answers %llu\n", (unsigned long long)atomic_load(&c->streamed_answers_active));
    family(t, "prism_streamed_answers_refused_total", "counter",
           "HTTP answers refused with 503 past --max-streamed-answers.");
    add(t, "prism_streamed_answers_refused_total %llu\n",
        (unsigned long long)atomic_load(&c->streamed_answers_refused));
    family(t, "prism_metrics_streams", "gauge",
           "/metrics answers of over 4096 blocks being streamed now (this one not counted).");
    add(t, "prism_metrics_streams %llu\n", (unsigned long long)atomic_load(&c->metrics_streams_active));
    family(t, "prism_metrics_streams_refused_total", "counter",
           "/metrics answers refused with 503 past --max-metrics-streams.");
    add(t, "prism_metrics_streams_refused_total %llu\n", (unsigned long long)atomic_load(&c->metrics_streams_refused));
}

/* A Prometheus label value: backslash, double quote and newline escaped (device class names are
 * any text a Hello brought). */
static void label_value(const char *in, char *out, size_t len)
{
    size_t n = 0;
    for (const char *c = in; *c && n + 3 < len; c++) {
        if (*c == '\\' || *c == '"' || *c == '\n') {
            out[n++] = '\\';
            out[n++] = *c == '\n' ? 'n' : *c;
        } else {
            out[n++] = *c;
        }
    }
    out[n] = '\0';
}

/* The hybrid-device plan families (DESIGN 11): of the plan in force, per job and device class,
 * and the planning outcomes at decisions since start. */
static void plan_metrics(text *t, const prismd_snapshot *snap)
{
    family(t, "prism_job_plan_iteration_seconds", "gauge",
           "Predicted iteration time T of the job's hybrid plan in force (GET /v1/jobs/{job}/plan).");
    for (size_t i = 0; i < snap->njobs; i++)
        if (snap->jobs[i].plan.has_plan)
            add(t, "prism_job_plan_iteration_seconds{job=\"%s\"} %.17g\n", snap->jobs[i].id,
                snap->jobs[i].plan.iteration_seconds);
    family(t, "prism_job_plan_compute_seconds", "gauge",
           "Predicted compute time f_k(0) of each device class under the job's hybrid plan in force: when its last "
           "gradients are ready.");
    for (size_t i = 0; i < snap->njobs; i++)
        for (size_t k = 0; k < snap->jobs[i].plan.nclasses; k++) {
            char cls[3 * PRISMD_RANK_TEXT_MAX + 4];
            label_value(snap->jobs[i].plan.classes[k].name, cls, sizeof cls);
            add(t, "prism_job_plan_compute_seconds{job=\"%s\",device_class=\"%s\"} %.17g\n", snap->jobs[i].id, cls,
                snap->jobs[i].plan.classes[k].compute_seconds);
        }
    family(t, "prism_job_plan_low_blocks", "gauge",
           "Blocks that the job's hybrid plan in force runs in the low format on each device class.");
    for (size_t i = 0; i < snap->njobs; i++)
        for (size_t k = 0; k < snap->jobs[i].plan.nclasses; k++) {
            char cls[3 * PRISMD_RANK_TEXT_MAX + 4];
            label_value(snap->jobs[i].plan.classes[k].name, cls, sizeof cls);
            add(t, "prism_job_plan_low_blocks{job=\"%s\",device_class=\"%s\"} %zu\n", snap->jobs[i].id, cls,
                snap->jobs[i].plan.classes[k].nlow);
        }
    family(t, "prism_job_plans_total", "counter",
           "Hybrid planning at the job's decisions since start, by outcome: planned (a new plan), kept (the ranking "
           "and inputs of the last plan: not re-planned), refused (the plan in force stays).");
    for (size_t i = 0; i < snap->njobs; i++) {
        const prismd_plan_view *v = &snap->jobs[i].plan;
        add(t, "prism_job_plans_total{job=\"%s\",outcome=\"planned\"} %llu\n", snap->jobs[i].id,
            (unsigned long long)v->replans);
        add(t, "prism_job_plans_total{job=\"%s\",outcome=\"kept\"} %llu\n", snap->jobs[i].id,
            (unsigned long long)v->kept);
        add(t, "prism_job_plans_total{job=\"%s\",outcome=\"refused\"} %llu\n", snap->jobs[i].id,
            (unsigned long long)v->refused);
    }
    family(t, "prism_tensor_stats_total", "counter",
           "BlockTensorStats entries of step reports (hybrid plans' weight and activation statistics), by outcome: "
           "accepted, or refused (an unknown block, a negative or non-finite figure).");
    add(t, "prism_tensor_stats_total{outcome=\"accepted\"} %llu\n", (unsigned long long)snap->tensor_stats_accepted);
    add(t, "prism_tensor_stats_total{outcome=\"refused\"} %llu\n", (unsigned long long)snap->tensor_stats_refused);
}

/* The numerics families (issue 17, DESIGN 4.7): per job the loss spikes and the blocks they rolled
 * back (the policy's counters, kept by the store across restarts), and the mean saturated and
 * underflowed fractions over the job's low blocks that have figures (summed in block id order;
 * no sample when none has). */
static void numerics_metrics(text *t, const prismd_snapshot *snap)
{
    family(t, "prism_loss_spikes_total", "counter",
           "Loss spikes of the job (a step's loss above loss_spike_factor x the median of the last "
           "loss_spike_window losses), whether or not a block was rolled back.");
    for (size_t i = 0; i < snap->njobs; i++)
        add(t, "prism_loss_spikes_total{job=\"%s\"} %llu\n", snap->jobs[i].id,
            (unsigned long long)snap->jobs[i].counters.loss_spikes);
    family(t, "prism_loss_spike_rollbacks_total", "counter",
           "Blocks of the job that a loss spike sent back to bf16 (reason loss_spike).");
    for (size_t i = 0; i < snap->njobs; i++)
        add(t, "prism_loss_spike_rollbacks_total{job=\"%s\"} %llu\n", snap->jobs[i].id,
            (unsigned long long)snap->jobs[i].counters.blocks_rolled_back);
    static const char *const names[2] = {"prism_saturated_fraction", "prism_underflowed_fraction"};
    static const char *const helps[2] = {
        "Mean over the job's low blocks with figures of each one's saturated fraction (the mean over its window "
        "of the fraction of elements whose code the clamp to the format's largest value changed); absent when no "
        "low block has figures.",
        "Mean over the job's low blocks with figures of each one's underflowed fraction (the mean over its window "
        "of the fraction of non-zero elements quantized to 0); absent when no low block has figures."};
    for (int f = 0; f < 2; f++) {
        family(t, names[f], "gauge", helps[f]);
        for (size_t i = 0; i < snap->njobs; i++) {
            const prismd_snap_job *j = &snap->jobs[i];
            double sum = 0.0;
            size_t n = 0;
            for (size_t b = 0; b < j->nblocks; b++) {
                const prism_block_view *v = &j->blocks[b];
                if (v->precision != PRISM_PRECISION_BF16 && v->has_saturation) {
                    sum += f == 0 ? v->saturated_fraction : v->underflowed_fraction;
                    n++;
                }
            }
            if (n)
                add(t, "%s{job=\"%s\"} %.17g\n", names[f], j->id, sum / (double)n);
        }
    }
}

/* The per-block families of /metrics, in this order, each a sample per block of every job that
 * has its figure: the sensitivity of the scored blocks; every block's precision and the reason
 * of its last change (an info-style 1, so that a switch shows as a new series); the saturated and
 * underflowed fractions of the blocks that have figures (the means over the window, as REST). */
enum { BLOCK_SENSITIVITY, BLOCK_PRECISION, BLOCK_SATURATED, BLOCK_UNDERFLOWED, BLOCK_FAMILIES };

static const char *const block_family_heads[BLOCK_FAMILIES] = {
    "# HELP prism_block_sensitivity Sensitivity score s of each scored block at the last decision.\n"
    "# TYPE prism_block_sensitivity gauge\n",
    "# HELP prism_block_precision 1 for each block's precision now and the reason of its last change.\n"
    "# TYPE prism_block_precision gauge\n",
    "# HELP prism_block_saturated_fraction Each block's saturated fraction, the mean over its window of the steps "
    "that reported one (no sample without).\n"
    "# TYPE prism_block_saturated_fraction gauge\n",
    "# HELP prism_block_underflowed_fraction Each block's underflowed fraction, the mean over its window of the "
    "steps that reported one (no sample without).\n"
    "# TYPE prism_block_underflowed_fraction gauge\n",
};

/* The sample of family f for block b of job j into out; false when the block has no such figure
 * (or out is short). */
static bool block_sample(char *out, size_t len, int f, const prismd_snap_job *j, size_t b)
{
    const prism_block_view *v = &j->blocks[b];
    int n = -1;
    switch (f) {
    case BLOCK_SENSITIVITY:
        if (v->has_score)
            n = snprintf(out, len, "prism_block_sensitivity{job=\"%s\",block=\"%u\"} %.17g\n", j->id, v->id,
                         v->sensitivity);
        break;
    case BLOCK_PRECISION:
        n = snprintf(out, len, "prism_block_precision{job=\"%s\",block=\"%u\",precision=\"%s\",reason=\"%s\"} 1\n",
                     j->id, v->id, prism_precision_name(v->precision), prism_reason_name(v->reason));
        break;
    case BLOCK_SATURATED:
    case BLOCK_UNDERFLOWED:
        if (v->has_saturation)
            n = snprintf(out, len, "prism_block_%s_fraction{job=\"%s\",block=\"%u\"} %.17g\n",
                         f == BLOCK_SATURATED ? "saturated" : "underflowed", j->id, v->id,
                         f == BLOCK_SATURATED ? v->saturated_fraction : v->underflowed_fraction);
        break;
    default:
        break;
    }
    return n > 0 && (size_t)n < len;
}

/* /metrics when the jobs hold more than PRISMD_BLOCKS_CACHED_MAX blocks: every other family
 * made whole (their size does not grow with blocks), then the per-block samples written a line
 * at a time from the snapshot the answer holds, so that an answer of millions of samples holds
 * one line of them. Each holds its snapshot for as long as its client reads, so at most
 * --max-metrics-streams are streamed at once (a pool apart from --max-streamed-answers, which
 * REST clients can fill); one more gets 503 and Prometheus scrapes again at its next interval. */
typedef struct metrics_stream {
    prismd_snapshot *snap;
    char *head;                 /* the other families */
    size_t head_len, head_pos;
    const char *pending;        /* text due before the next sample */
    size_t pending_len, pending_pos;
    int family;                 /* the per-block family being written */
    size_t job, block;          /* the next sample to look at */
    char line[256];
} metrics_stream;

static ssize_t metrics_read(void *cls, char *buf, size_t max)
{
    metrics_stream *m = cls;
    size_t n = 0;
    while (n < max) {
        if (m->head_pos < m->head_len) {
            n = prismd_piece_copy(buf, n, max, m->head, m->head_len, &m->head_pos);
        } else if (m->pending_pos < m->pending_len) {
            n = prismd_piece_copy(buf, n, max, m->pending, m->pending_len, &m->pending_pos);
        } else if (m->job < m->snap->njobs) {
            const prismd_snap_job *j = &m->snap->jobs[m->job];
            if (m->block >= j->nblocks) {
                m->job++;
                m->block = 0;
            } else if (block_sample(m->line, sizeof m->line, m->family, j, m->block++)) {
                m->pending = m->line;
                m->pending_len = strlen(m->line);
                m->pending_pos = 0;
            }
        } else if (m->family + 1 < BLOCK_FAMILIES) {
            m->family++;
            m->job = m->block = 0;
            m->pending = block_family_heads[m->family];
            m->pending_len = strlen(m->pending);
            m->pending_pos = 0;
        } else {
            break;
        }
    }
    return (ssize_t)n;
}

static void metrics_done(void *cls)
{
    metrics_stream *m = cls;
    prismd_snapshot_release(m->snap);
    free(m->head);
    free(m);
    prismd_metrics_stream_release();
}

static void get_metrics(const prismd_rest *rest, const prismd_snapshot *snap, prismd_answer *a)
{
    text t = {0};
    family(&t, "prism_ready", "gauge",
           "1 when /readyz answers 200 (the data directory locked and writable, the policy thread running), else 0.");
    add(&t, "prism_ready %d\n", !rest->ready || rest->ready(rest->ready_ctx) ? 1 : 0);
    family(&t, "prism_jobs", "gauge", "Jobs held by this prismd.");
    add(&t, "prism_jobs %zu\n", snap->njobs);
    family(&t, "prism_agents_connected", "gauge", "Agent streams connected, per job.");
    for (size_t i = 0; i < snap->njobs; i++)
        add(&t, "prism_agents_connected{job=\"%s\"} %u\n", snap->jobs[i].id, snap->jobs[i].agents);
    family(&t, "prism_world_size", "gauge", "Ranks per step of the job.");
    for (size_t i = 0; i < snap->njobs; i++)
        add(&t, "prism_world_size{job=\"%s\"} %u\n", snap->jobs[i].id, snap->jobs[i].world_size);
    family(&t, "prism_blocks", "gauge", "Blocks per job and precision.");
    for (size_t i = 0; i < snap->njobs; i++) {
        size_t count[PRISM_PRECISION_COUNT] = {0};
        for (size_t b = 0; b < snap->jobs[i].nblocks; b++)
            count[snap->jobs[i].blocks[b].precision]++;
        for (int p = 0; p < PRISM_PRECISION_COUNT; p++)
            add(&t, "prism_blocks{job=\"%s\",precision=\"%s\"} %zu\n", snap->jobs[i].id,
                prism_precision_name((prism_precision)p), count[p]);
    }
    family(&t, "prism_precision_switches_total", "counter", "Block precision changes since start, by reason.");
    for (size_t i = 0; i < snap->njobs; i++)
        for (int r = 1; r < PRISMD_REASONS; r++)
            add(&t, "prism_precision_switches_total{job=\"%s\",reason=\"%s\"} %llu\n", snap->jobs[i].id,
                prism_reason_name((prism_reason)r), (unsigned long long)snap->jobs[i].switches[r]);
    numerics_metrics(&t, snap);
    size_t all_blocks = 0;
    for (size_t i = 0; i < snap->njobs; i++)
        all_blocks += snap->jobs[i].nblocks;
    bool stream_blocks = all_blocks > PRISMD_BLOCKS_CACHED_MAX; /* the per-block families go last, streamed */
    for (int f = 0; !stream_blocks && f < BLOCK_FAMILIES; f++) {
        add(&t, "%s", block_family_heads[f]);
        for (size_t i = 0; i < snap->njobs; i++)
            for (size_t b = 0; b < snap->jobs[i].nblocks; b++) {
                char line[256];
                if (block_sample(line, sizeof line, f, &snap->jobs[i], b))
                    add(&t, "%s", line);
            }
    }
    family(&t, "prism_bandwidth_saving_percent", "gauge",
           "Estimated transfer bandwidth saved by low-precision blocks at the last decision.");
    for (size_t i = 0; i < snap->njobs; i++)
        if (snap->jobs[i].has_summary)
            add(&t, "prism_bandwidth_saving_percent{job=\"%s\"} %.17g\n", snap->jobs[i].id,
                snap->jobs[i].summary.bandwidth_saving_pct);
    family(&t, "prism_last_step", "gauge", "The last step the policy collected, per job.");
    for (size_t i = 0; i < snap->njobs; i++)
        if (snap->jobs[i].has_step)
            add(&t, "prism_last_step{job=\"%s\"} %llu\n", snap->jobs[i].id,
                (unsigned long long)snap->jobs[i].last_step);
    family(&t, "prism_map_version", "gauge", "Version of the job's precision map.");
    for (size_t i = 0; i < snap->njobs; i++)
        add(&t, "prism_map_version{job=\"%s\"} %llu\n", snap->jobs[i].id, (unsigned long long)snap->jobs[i].map_version);
    family(&t, "prism_job_decisions_total", "counter", "Policy decisions made for the job since prismd started.");
    for (size_t i = 0; i < snap->njobs; i++)
        add(&t, "prism_job_decisions_total{job=\"%s\"} %llu\n", snap->jobs[i].id,
            (unsigned long long)snap->jobs[i].decisions);
    family(&t, "prism_job_last_decision_timestamp_seconds", "gauge",
           "Unix time of the job's last decision, kept across restarts (GET /v1/jobs' last_decision_unix); 0: none "
           "yet, or its time is not known.");
    for (size_t i = 0; i < snap->njobs; i++) {
        const prismd_snap_job *j = &snap->jobs[i];
        add(&t, "prism_job_last_decision_timestamp_seconds{job=\"%s\"} %.17g\n", j->id,
            j->has_summary && isfinite(j->decided_unix) ? j->decided_unix : 0.0);
    }
    family(&t, "prism_job_ranks_lagging", "gauge",
           "Connected ranks of the job more than 2 steps behind its newest reported step, or that reported nothing "
           "while another rank did (GET /v1/jobs' ranks_lagging).");
    for (size_t i = 0; i < snap->njobs; i++)
        add(&t, "prism_job_ranks_lagging{job=\"%s\"} %u\n", snap->jobs[i].id, snap->jobs[i].ranks_lagging);
    family(&t, "prism_job_ranks_not_acked", "gauge",
           "Connected ranks of the job whose agent has not acknowledged its current map (GET /v1/jobs' "
           "ranks_not_acked).");
    for (size_t i = 0; i < snap->njobs; i++)
        add(&t, "prism_job_ranks_not_acked{job=\"%s\"} %u\n", snap->jobs[i].id, snap->jobs[i].ranks_not_acked);
    family(&t, "prism_job_ranks_late_switches", "gauge",
           "Late switches of the job's trainers: the trainer_late_switches of each rank's last Heartbeat, summed "
           "(a rank that sent none counts 0).");
    for (size_t i = 0; i < snap->njobs; i++)
        add(&t, "prism_job_ranks_late_switches{job=\"%s\"} %llu\n", snap->jobs[i].id,
            (unsigned long long)snap->jobs[i].late_switches);
    plan_metrics(&t, snap);
    family(&t, "prism_step_reports_total", "counter", "Step reports received from agents, by outcome.");
    add(&t, "prism_step_reports_total{outcome=\"accepted\"} %llu\n", (unsigned long long)snap->reports_accepted);
    add(&t, "prism_step_reports_total{outcome=\"malformed\"} %llu\n", (unsigned long long)snap->reports_rejected);
    add(&t, "prism_step_reports_total{outcome=\"late\"} %llu\n", (unsigned long long)snap->reports_dropped_late);
    add(&t, "prism_step_reports_total{outcome=\"repeated\"} %llu\n",
        (unsigned long long)snap->reports_dropped_repeated);
    add(&t, "prism_step_reports_total{outcome=\"step_out_of_range\"} %llu\n",
        (unsigned long long)snap->reports_step_out_of_range);
    family(&t, "prism_calibration_reports_total", "counter",
           "Calibration reports received from agents, by outcome (a refused report changes nothing).");
    add(&t, "prism_calibration_reports_total{outcome=\"accepted\"} %llu\n",
        (unsigned long long)snap->calibrations_accepted);
    add(&t, "prism_calibration_reports_total{outcome=\"malformed\"} %llu\n",
        (unsigned long long)snap->calibrations_malformed);
    add(&t, "prism_calibration_reports_total{outcome=\"foreign_fingerprint\"} %llu\n",
        (unsigned long long)snap->calibrations_foreign);
    family(&t, "prism_grpc_unimplemented_calls_total", "counter",
           "gRPC calls of methods prismd does not serve, answered UNIMPLEMENTED.");
    add(&t, "prism_grpc_unimplemented_calls_total %llu\n", (unsigned long long)snap->unimplemented_calls);
    family(&t, "prism_block_records_received_total", "counter", "Per-block statistics records accepted.");
    add(&t, "prism_block_records_received_total %llu\n", (unsigned long long)snap->block_records);
    family(&t, "prism_decisions_total", "counter", "Policy decisions made.");
    add(&t, "prism_decisions_total %llu\n", (unsigned long long)snap->decisions);
    family(&t, "prism_map_updates_sent_total", "counter", "Precision map updates queued to agents.");
    add(&t, "prism_map_updates_sent_total %llu\n", (unsigned long long)snap->updates_sent);
    family(&t, "prism_store_errors_total", "counter", "Decisions the store could not save (their maps were not sent).");
    add(&t, "prism_store_errors_total %llu\n", (unsigned long long)snap->store_errors);
    family(&t, "prism_store_retries_total", "counter",
           "Retries of an unsaved map's save that failed again (backing off from 1 s to 60 s).");
    add(&t, "prism_store_retries_total %llu\n", (unsigned long long)snap->store_retries);
    family(&t, "prism_maps_unsent_total", "counter",
           "Map broadcasts put off because their messages could not be packed (out of memory); the map is sent at "
           "the next decision or tick.");
    add(&t, "prism_maps_unsent_total %llu\n", (unsigned long long)snap->maps_unsent);
    family(&t, "prism_agent_streams_refused_total", "counter",
           "Agent streams ended for a bad Hello, a wrong token, an unknown job or a message out of order.");
    add(&t, "prism_agent_streams_refused_total %llu\n", (unsigned long long)snap->agents_refused);
    family(&t, "prism_agent_streams_broken_total", "counter",
           "Agent streams whose read failed: a message over --max-message-bytes, or a peer that went away.");
    add(&t, "prism_agent_streams_broken_total %llu\n", (unsigned long long)snap->streams_broken);
    family(&t, "prism_agent_streams_replaced_total", "counter",
           "Agent streams ended with ABORTED because a newer agent connected for the same job and rank.");
    add(&t, "prism_agent_streams_replaced_total %llu\n", (unsigned long long)snap->agents_replaced);
    family(&t, "prism_jobs_deleted_total", "counter",
           "Jobs deleted with their state and files: by DELETE /v1/jobs/JOB (admin), or idle past --job-idle-expiry.");
    add(&t, "prism_jobs_deleted_total{reason=\"admin\"} %llu\n", (unsigned long long)snap->jobs_deleted);
    add(&t, "prism_jobs_deleted_total{reason=\"idle\"} %llu\n", (unsigned long long)snap->jobs_expired);
    family(&t, "prism_job_tokens_provisioned", "gauge",
           "Job tokens in force from --job-tokens-dir and --job-tokens-file.");
    add(&t, "prism_job_tokens_provisioned %llu\n", (unsigned long long)snap->tokens_provisioned);
    family(&t, "prism_job_tokens_loads_total", "counter",
           "Loads of the provisioned job tokens (at start, on SIGHUP, periodically), by outcome; a failed one "
           "keeps the tokens in force.");
    add(&t, "prism_job_tokens_loads_total{outcome=\"ok\"} %llu\n", (unsigned long long)snap->tokens_loads_ok);
    add(&t, "prism_job_tokens_loads_total{outcome=\"error\"} %llu\n", (unsigned long long)snap->tokens_loads_failed);
    family(&t, "prism_decision_duration_seconds", "histogram", "Time of one policy decision, ingest of its step included.");
    for (int b = 0; b < PRISMD_DECISION_BUCKETS; b++)
        add(&t, "prism_decision_duration_seconds_bucket{le=\"%g\"} %llu\n", prismd_decision_buckets[b],
            (unsigned long long)snap->decision_buckets[b]);
    add(&t, "prism_decision_duration_seconds_bucket{le=\"+Inf\"} %llu\n", (unsigned long long)snap->decision_count);
    add(&t, "prism_decision_duration_seconds_sum %.9f\n", snap->decision_seconds);
    add(&t, "prism_decision_duration_seconds_count %llu\n", (unsigned long long)snap->decision_count);
    family(&t, "prism_store_write_duration_seconds", "histogram",
           "Time of each SQLite write transaction prismd committed since it started (a decision's map and state, "
           "a job's config, deletion and activity time, calibration errors), from its first statement to COMMIT.");
    const prismd_store_writes *w = &snap->store_writes;
    for (int b = 0; b < PRISMD_STORE_WRITE_BUCKETS; b++)
        add(&t, "prism_store_write_duration_seconds_bucket{le=\"%g\"} %llu\n", prismd_store_write_buckets[b],
            (unsigned long long)w->buckets[b]);
    add(&t, "prism_store_write_duration_seconds_bucket{le=\"+Inf\"} %llu\n", (unsigned long long)w->count);
    add(&t, "prism_store_write_duration_seconds_sum %.9f\n", w->seconds);
    add(&t, "prism_store_write_duration_seconds_count %llu\n", (unsigned long long)w->count);
    family(&t, "prism_http_requests_total", "counter", "HTTP requests answered, by status class.");
    static const char *const classes[6] = {"0xx", "1xx", "2xx", "3xx", "4xx", "5xx"};
    for (int c = 1; c < 6; c++)
        add(&t, "prism_http_requests_total{code=\"%s\"} %llu\n", classes[c],
            (unsigned long long)atomic_load(&http_by_class[c]));
    family(&t, "prism_http_request_duration_seconds", "histogram", "Time to answer an HTTP request.");
    for (int b = 0; b < HTTP_BUCKETS; b++)
        add(&t, "prism_http_request_duration_seconds_bucket{le=\"%g\"} %llu\n", http_bounds[b],
            (unsigned long long)atomic_load(&http_bucket_counts[b]));
    unsigned long long count = atomic_load(&http_count);
    add(&t, "prism_http_request_duration_seconds_bucket{le=\"+Inf\"} %llu\n", count);
    add(&t, "prism_http_request_duration_seconds_sum %.6f\n", (double)atomic_load(&http_micros) / 1e6);
    add(&t, "prism_http_request_duration_seconds_count %llu\n", count);
    family(&t, "prism_http_refused_total", "counter",
           "HTTP connections closed or requests refused by a limit, by listener and limit (see prismd --help).");
    for (int l = 0; l < PRISMD_LISTENERS; l++)
        for (int r = 0; r < PRISMD_REFUSALS; r++)
            add(&t, "prism_http_refused_total{listener=\"%s\",reason=\"%s\"} %llu\n",
                prismd_listener_name((prismd_listener)l), prismd_refusal_name((prismd_refusal)r),
                prismd_http_refusals((prismd_listener)l, (prismd_refusal)r));
    family(&t, "prism_http_connections", "gauge", "HTTP connections open now, by listener.");
    for (int l = 0; l < PRISMD_LISTENERS; l++)
        add(&t, "prism_http_connections{listener=\"%s\"} %llu\n", prismd_listener_name((prismd_listener)l),
            prismd_http_connections((prismd_listener)l));
    family(&t, "prism_http_event_streams", "gauge", "GET /v1/jobs/JOB/events streams open now.");
    add(&t, "prism_http_event_streams %llu\n", prismd_http_event_streams());
    limits_metrics(&t);
    if (t.failed) {
        free(t.data);
        answer_error(a, 500, "internal", "out of memory");
        return;
    }
    a->status = 200;
    a->content_type = "text/plain; version=0.0.4; charset=utf-8";
    if (!stream_blocks) {
        a->body = t.data;
        return;
    }
    if (!prismd_metrics_stream_acquire(rest->mem)) {
        free(t.data);
        answer_error(a, 503, "unavailable", "%zu /metrics answers of over %d blocks are being sent, the limit "
                     "(--max-metrics-streams); try again", rest->mem->max_metrics_streams, PRISMD_BLOCKS_CACHED_MAX);
        return;
    }
    metrics_stream *m = calloc(1, sizeof *m);
    if (!m) {
        prismd_metrics_stream_release();
        free(t.data);
        answer_error(a, 500, "internal", "out of memory");
        return;
    }
    atomic_fetch_add(&((prismd_snapshot *)snap)->refs, 1);
    m->snap = (prismd_snapshot *)snap;
    m->head = t.data;
    m->head_len = t.len;
    m->family = 0;
    m->pending = block_family_heads[0];
    m->pending_len = strlen(m->pending);
    a->read = metrics_read;
    a->done = metrics_done;
    a->stream_cls = m;
}

/* ---- routing ---- */

/* Splits "/v1/jobs/JOB/REST" into JOB and REST; false when path is not under /v1/jobs/. */
static bool job_path(const char *path, char *job, size_t job_len, const char **rest)
{
    static const char prefix[] = "/v1/jobs/";
    if (strncmp(path, prefix, sizeof prefix - 1) != 0)
        return false;
    const char *id = path + sizeof prefix - 1;
    const char *slash = strchr(id, '/');
    size_t n = slash ? (size_t)(slash - id) : strlen(id);
    if (n == 0 || n >= job_len)
        return false;
    memcpy(job, id, n);
    job[n] = '\0';
    *rest = slash ? slash : "";
    return true;
}

const char *prismd_rest_allowed(const char *path)
{
    char job[160];
    const char *rest;
    if (strcmp(path, "/metrics") == 0 || strcmp(path, "/v1/jobs") == 0)
        return "GET, HEAD";
    if (!job_path(path, job, sizeof job, &rest))
        return NULL;
    if (rest[0] == '\0')
        return "DELETE";
    if (strcmp(rest, "/blocks") == 0 || strncmp(rest, "/blocks/", 8) == 0)
        return "GET, HEAD";
    if (strcmp(rest, "/config") == 0)
        return "GET, HEAD, PATCH";
    if (strcmp(rest, "/telemetry") == 0 || strcmp(rest, "/trace") == 0)
        return "GET, HEAD";
    if (strcmp(rest, "/events") == 0)
        return "GET";
    if (strcmp(rest, "/hints") == 0 || strcmp(rest, "/ranks") == 0 || strcmp(rest, "/plan") == 0)
        return "GET, HEAD";
    if (strcmp(rest, "/overrides") == 0)
        return "PUT";
    return NULL;
}

static bool readable(const char *path)
{
    const char *allowed = prismd_rest_allowed(path);
    size_t n = strlen(path);
    bool events = n > 7 && strcmp(path + n - 7, "/events") == 0; /* main.c streams those */
    return allowed && strncmp(allowed, "GET", 3) == 0 && !events;
}

/* PATCH .../config naming a telemetry_file: the file must be one prismd can open for append in
 * the job's directory. Checked without changing anything there (REST never touches what the
 * policy thread writes, DESIGN 7): an existing file must be a regular file that opens for
 * append; a missing one needs its nearest existing directory (the job's, DATA_DIR/jobs or the
 * data directory) writable, where a decision will create it. The name's own rules are the policy
 * core's (checked after this, on the policy thread); a name it refuses is left to it. False
 * with a 400 in a when the file cannot be used. */
static bool telemetry_file_usable(const prismd_rest *r, const char *job, const char *body, size_t body_len,
                                  prismd_answer *a)
{
    json_t *doc = r->data_dir ? json_loadb(body, body_len, 0, NULL) : NULL;
    const char *name = json_string_value(json_object_get(doc, "telemetry_file"));
    if (!name || prism_config_file_name_problem(name)) {
        json_decref(doc);
        return true;
    }
    char path[4096];
    int n = prismd_job_file(r->data_dir, job, name, path, sizeof path);
    const char *why = NULL;
    struct stat st;
    if (n < 0 || (size_t)n >= sizeof path) {
        why = "the path in the job's directory is too long";
    } else if (lstat(path, &st) == 0) {
        int fd = S_ISREG(st.st_mode) ? open(path, O_WRONLY | O_APPEND | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC) : -1;
        if (!S_ISREG(st.st_mode))
            why = "not a regular file";
        else if (fd < 0)
            why = strerror(errno);
        if (fd >= 0)
            close(fd);
    } else if (errno != ENOENT) {
        why = strerror(errno);
    } else {
        /* The nearest directory that exists: the job's, then DATA_DIR/jobs, then DATA_DIR. */
        char dir[4096];
        const char *const levels[][2] = {{job, ""}, {"", ""}};
        bool found = false;
        for (size_t i = 0; i < 2 && !found && !why; i++) {
            n = prismd_job_file(r->data_dir, levels[i][0], levels[i][1], dir, sizeof dir);
            if (n > 0 && (size_t)n < sizeof dir && stat(dir, &st) == 0) {
                found = true;
                if (!S_ISDIR(st.st_mode))
                    why = "its directory is not a directory";
                else if (access(dir, W_OK | X_OK) != 0)
                    why = strerror(errno);
            }
        }
        if (!found && !why && access(r->data_dir, W_OK | X_OK) != 0)
            why = strerror(errno);
    }
    if (why)
        answer_error(a, 400, "invalid_argument", "telemetry_file: \"%.64s\" cannot be opened for append in job %s's "
                     "directory: %s", name, job, why);
    json_decref(doc);
    return !why;
}

bool prismd_rest_mutate(prismd_rest *r, const char *method, const char *path, const char *auth, const char *body,
                        size_t body_len, prismd_answer *a)
{
    char job[160];
    const char *rest;
    if (!job_path(path, job, sizeof job, &rest))
        return false;
    prismd_command_kind kind;
    if (strcmp(method, "PATCH") == 0 && strcmp(rest, "/config") == 0)
        kind = PRISMD_COMMAND_PATCH_CONFIG;
    else if (strcmp(method, "PUT") == 0 && strcmp(rest, "/overrides") == 0)
        kind = PRISMD_COMMAND_PUT_OVERRIDES;
    else if (strcmp(method, "DELETE") == 0 && rest[0] == '\0')
        kind = PRISMD_COMMAND_DELETE_JOB;
    else
        return false;
    /* The cheap refusals are answered here, from the snapshot, without waiting for the policy
     * thread (which checks again: the snapshot may be a moment old). */
    prismd_snapshot *snap = prismd_snapshots_get(r->snapshots);
    const prismd_snap_job *j = snap ? prismd_snapshot_find(snap, job) : NULL;
    prismd_access access = kind == PRISMD_COMMAND_DELETE_JOB ? PRISMD_ACCESS_DELETE : PRISMD_ACCESS_CHANGE;
    prismd_auth_rule rule = {r->admin_token, r->require_read_token};
    prismd_auth verdict = j ? prismd_auth_check(&rule, j->token, auth, access) : PRISMD_AUTH_OK;
    if (!j) {
        answer_error(a, 404, "not_found", "job %.128s does not exist", job);
    } else if (verdict != PRISMD_AUTH_OK) {
        a->status = verdict == PRISMD_AUTH_MISSING ? 401 : 403;
        a->content_type = "application/json";
        a->body = prismd_auth_answer(verdict, access, j->id);
    }
    prismd_snapshot_release(snap);
    if (a->body)
        return true;
    if (kind == PRISMD_COMMAND_PATCH_CONFIG && !telemetry_file_usable(r, job, body, body_len, a))
        return true;
    a->status = prismd_commands_run(r->commands, kind, job, auth, body, body_len, 5000, &a->body);
    a->content_type = "application/json";
    return true;
}

/* The auth rule for a read of snapshot job j; false with *a holding the refusal. */
static bool check_read(const prismd_rest *r, const prismd_snap_job *j, const char *auth, prismd_answer *a)
{
    prismd_auth_rule rule = {r->admin_token, r->require_read_token};
    prismd_auth verdict = prismd_auth_check(&rule, j->token, auth, PRISMD_ACCESS_READ);
    if (verdict == PRISMD_AUTH_OK)
        return true;
    a->status = verdict == PRISMD_AUTH_MISSING ? 401 : 403;
    a->content_type = "application/json";
    a->body = prismd_auth_answer(verdict, PRISMD_ACCESS_READ, j->id);
    if (!a->body)
        answer_error(a, 500, "internal", "out of memory");
    return false;
}

bool prismd_rest_may_read(prismd_rest *r, const char *job_id, const char *auth, prismd_answer *a)
{
    prismd_snapshot *snap = prismd_snapshots_get(r->snapshots);
    const prismd_snap_job *j = snap ? prismd_snapshot_find(snap, job_id) : NULL;
    bool ok = false;
    if (!j)
        answer_error(a, 404, "not_found", "job %.128s does not exist", job_id);
    else
        ok = check_read(r, j, auth, a);
    prismd_snapshot_release(snap);
    return ok;
}

/* GET /v1/jobs, by the rule of auth.h: without a token every job, unless --require-read-token
 * (401); with the admin token every job; with another token, which must open at least one job
 * (else 403, as a wrong token anywhere), every job when reads are open and the jobs it opens
 * when they are not. */
static void get_jobs(prismd_rest *r, prismd_snapshot *snap, const char *auth, prismd_answer *a)
{
    prismd_auth_rule rule = {r->admin_token, r->require_read_token};
    if ((!auth && !r->require_read_token) || (auth && prismd_token_equal(auth, r->admin_token))) {
        answer_cached(a, snap, &snap->jobs_json, &snap->jobs_gzip, render_jobs, snap);
        return;
    }
    if (!auth) {
        answer_error(a, 401, "unauthenticated", "listing jobs needs a bearer token (--require-read-token)");
        return;
    }
    json_t *jobs = json_array();
    size_t opened = 0;
    for (size_t i = 0; jobs && i < snap->njobs; i++) {
        const prismd_snap_job *j = &snap->jobs[i];
        if (prismd_auth_check(&rule, j->token, auth, PRISMD_ACCESS_READ) == PRISMD_AUTH_OK) {
            json_array_append_new(jobs, job_entry_json(j));
            opened++;
        }
    }
    if (!opened && (snap->njobs || r->admin_token)) {
        json_decref(jobs);
        answer_error(a, 403, "permission_denied", "wrong token (it opens no job and is not the admin token)");
    } else if (!r->require_read_token) {
        json_decref(jobs);
        answer_cached(a, snap, &snap->jobs_json, &snap->jobs_gzip, render_jobs, snap);
    } else {
        answer_json(a, 200, json_pack("{s:o}", "jobs", jobs));
    }
}

static json_t *opt_u64(bool present, uint64_t x)
{
    return present ? json_integer((json_int_t)x) : json_null();
}

/* GET .../plan: the job's hybrid-device plan state (DESIGN 11); "plan" is the stored plan object
 * text itself (the object `prismctl plan` prints on the same inputs), spliced in unchanged. */
static void get_plan(const prismd_snap_job *j, prismd_answer *a)
{
    const prismd_plan_view *v = &j->plan;
    json_t *seen = json_array();
    for (size_t k = 0; seen && k < v->nclasses_seen; k++)
        json_array_append_new(seen, json_string(v->classes_seen[k]));
    json_t *obj = json_pack("{s:s, s:b, s:s, s:s, s:o, s:I, s:o, s:o, s:o, s:I, s:I}", "job", j->id, "hybrid",
                            v->hybrid, "status", v->status ? v->status : "disabled", "message",
                            v->message ? v->message : "", "classes_seen", seen, "blocks_missing_statistics",
                            (json_int_t)v->blocks_missing, "map_version", opt_u64(v->has_plan, v->map_version),
                            "decided_step", opt_u64(v->has_plan, v->decided_step), "effective_step",
                            opt_u64(v->has_plan, v->effective_step), "replans", (json_int_t)v->replans,
                            "plans_kept", (json_int_t)v->kept);
    char *head = obj ? json_dumps(obj, JSON_COMPACT | JSON_PRESERVE_ORDER) : NULL;
    json_decref(obj);
    char *body = NULL;
    if (head && asprintf(&body, "%.*s,\"plan\":%s}", (int)strlen(head) - 1, head,
                         v->plan_json ? prismd_shared_text_str(v->plan_json) : "null") < 0)
        body = NULL;
    free(head);
    if (!body) {
        answer_error(a, 500, "internal", "out of memory");
        return;
    }
    a->status = 200;
    a->content_type = "application/json";
    a->body = body;
}

bool prismd_rest_get(prismd_rest *r, const char *path, const char *auth, prismd_query_fn query, void *query_ctx,
                     prismd_answer *a)
{
    if (!readable(path))
        return false;
    prismd_snapshot *snap = prismd_snapshots_get(r->snapshots);
    if (!snap) {
        answer_error(a, 503, "not_ready", "prismd is starting");
        return true;
    }
    char job_id[160];
    const char *rest = "";
    if (strcmp(path, "/metrics") == 0) {
        get_metrics(r, snap, a);
    } else if (strcmp(path, "/v1/jobs") == 0) {
        get_jobs(r, snap, auth, a);
    } else {
        job_path(path, job_id, sizeof job_id, &rest);
        const prismd_snap_job *j = prismd_snapshot_find(snap, job_id);
        if (!j)
            answer_error(a, 404, "not_found", "job %.128s does not exist", job_id);
        else if (!check_read(r, j, auth, a))
            ; /* a says why */
        else if (strcmp(rest, "/blocks") == 0)
            get_blocks(r, snap, j, a);
        else if (strcmp(rest, "/config") == 0)
            answer_json(a, 200, prism_config_to_json(&j->config));
        else if (strcmp(rest, "/telemetry") == 0)
            get_telemetry(r, j, query, query_ctx, a);
        else if (strcmp(rest, "/trace") == 0)
            get_trace(r, j, a);
        else if (strcmp(rest, "/ranks") == 0)
            get_ranks(r, snap, j, a);
        else if (strcmp(rest, "/plan") == 0)
            get_plan(j, a);
        else if (strcmp(rest, "/hints") == 0)
            answer_json(a, 200,
                        json_pack("{s:s, s:o}", "job_id", j->id, "hints",
                                  !j->hints_sent ? json_null()
                                                 : json_pack("{s:I, s:I, s:I, s:I, s:f, s:b, s:b}", "map_version",
                                                             (json_int_t)j->hints_map_version, "max_inflight_h2d",
                                                             (json_int_t)j->hints_h2d, "max_inflight_d2h",
                                                             (json_int_t)j->hints_d2h, "prefetch_window",
                                                             (json_int_t)j->hints_prefetch, "vram_pressure_threshold",
                                                             j->hints_vram, "suppress_prefetch_in_backward",
                                                             j->hints_suppress_backward, "suppress_prefetch_in_optimizer",
                                                             j->hints_suppress_optimizer)));
        else
            get_block(r, j, rest + 8, a);
    }
    prismd_snapshot_release(snap);
    return true;
}
