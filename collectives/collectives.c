/* The quantized collectives' core (include/prism/collectives.h): argument checks, the row layout,
 * the headers every rank checks before the data, and the five steps, run through the backend's
 * table (collectives_internal.h). Everything that decides a byte on the wire or a bit of a result
 * is here, once, for both backends: which rows go to which slice, the codes-then-scales form of a
 * slice, the order of the FP32 sums, the saturation and AVG, the requantization, and the way rows
 * come back into the tensors. The host memory space (the CPU kernels) is at the end. */
#include "collectives_internal.h"
#include "process_totals.h"

#include <float.h>
#include <inttypes.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>

/* ---- layout --------------------------------------------------------------------------------- */

static size_t dtype_size(prism_dtype dtype)
{
    switch (dtype) {
    case PRISM_DTYPE_F32: return 4;
    case PRISM_DTYPE_BF16:
    case PRISM_DTYPE_F16: return 2;
    default: return 0;
    }
}

static const char *dtype_name(prism_dtype dtype)
{
    switch (dtype) {
    case PRISM_DTYPE_F32: return "f32";
    case PRISM_DTYPE_BF16: return "bf16";
    case PRISM_DTYPE_F16: return "f16";
    default: return "?";
    }
}

/* Bytes of codes of n elements of a wire format (INT4: two per byte, the last one half used). */
static size_t code_bytes(prism_precision wire, size_t n)
{
    return wire == PRISM_PRECISION_INT4 ? n / 2 + n % 2 : n;
}

static size_t rows_of(size_t numel, size_t row_width)
{
    return numel / row_width + (numel % row_width != 0);
}

/* The spec's fields, each named when refused; *row_width gets the width with 0 resolved. */
static prism_status check_spec(const prism_coll_spec *spec, uint32_t *row_width, prism_error *err)
{
    if (!spec)
        return prism_error_set(err, PRISM_ERR_INVALID, "spec: NULL");
    switch (spec->wire) {
    case PRISM_PRECISION_INT8:
    case PRISM_PRECISION_FP8_E4M3:
    case PRISM_PRECISION_FP8_E5M2:
    case PRISM_PRECISION_INT4: break;
    case PRISM_PRECISION_BF16:
        return prism_error_set(err, PRISM_ERR_INVALID,
                               "wire: bf16 is not a quantized wire format (int8, fp8_e4m3, fp8_e5m2, int4)");
    default:
        return prism_error_set(err, PRISM_ERR_INVALID,
                               "wire: unknown precision %d (int8 1, fp8_e4m3 2, fp8_e5m2 3, int4 4)", (int)spec->wire);
    }
    uint32_t w = spec->row_width ? spec->row_width : PRISM_COLL_ROW_WIDTH_DEFAULT;
    if (w % 8 || w > PRISM_COLL_ROW_WIDTH_MAX)
        return prism_error_set(err, PRISM_ERR_INVALID,
                               "row_width: %" PRIu32 " is not a multiple of 8 from 8 to %u (0: %u)", spec->row_width,
                               PRISM_COLL_ROW_WIDTH_MAX, PRISM_COLL_ROW_WIDTH_DEFAULT);
    if (spec->op != PRISM_COLL_SUM && spec->op != PRISM_COLL_AVG)
        return prism_error_set(err, PRISM_ERR_INVALID, "op: unknown value %d (sum 0, avg 1)", (int)spec->op);
    if (spec->scale_mode != PRISM_SCALE_FP32 && spec->scale_mode != PRISM_SCALE_POW2)
        return prism_error_set(err, PRISM_ERR_INVALID, "scale_mode: unknown value %d (fp32 0, pow2 1)",
                               (int)spec->scale_mode);
    *row_width = w;
    return PRISM_OK;
}

prism_status prism_coll_layout_of(const prism_coll_spec *spec, const prism_coll_tensor *tensors, size_t count,
                                  int world, prism_coll_layout *out, prism_error *err)
{
    if (!out)
        return prism_error_set(err, PRISM_ERR_INVALID, "out: NULL");
    memset(out, 0, sizeof *out);
    uint32_t w = 0;
    prism_status st = check_spec(spec, &w, err);
    if (st != PRISM_OK)
        return st;
    if (world < 1)
        return prism_error_set(err, PRISM_ERR_INVALID, "world: %d ranks (at least 1)", world);
    if (count && !tensors)
        return prism_error_set(err, PRISM_ERR_INVALID, "tensors: NULL with count %zu", count);
    size_t rows = 0;
    for (size_t i = 0; i < count; i++) {
        if (dtype_size(tensors[i].dtype) == 0)
            return prism_error_set(err, PRISM_ERR_INVALID, "tensors[%zu].dtype: unknown dtype %d (f32 0, bf16 1, f16 2)",
                                   i, (int)tensors[i].dtype);
        size_t r = rows_of(tensors[i].numel, w);
        if (r > SIZE_MAX - rows)
            return prism_error_set(err, PRISM_ERR_LIMIT, "tensors: more rows than size_t holds");
        rows += r;
    }
    size_t p = (size_t)world;
    size_t rpr = rows / p + (rows % p != 0);
    size_t row_bytes = code_bytes(spec->wire, w) + sizeof(float);
    /* The two wire buffers hold padded_rows rows each, so that product must fit. */
    if (rpr > SIZE_MAX / p || rpr * p > SIZE_MAX / row_bytes)
        return prism_error_set(err, PRISM_ERR_LIMIT, "tensors: %zu rows of %zu bytes do not fit in memory", rows,
                               row_bytes);
    out->rows = rows;
    out->padded_rows = rpr * p;
    out->rows_per_rank = rpr;
    out->row_bytes = row_bytes;
    out->wire_bytes = 2 * (uint64_t)(p - 1) * (uint64_t)rpr * (uint64_t)row_bytes;
    out->row_width = w;
    return PRISM_OK;
}

/* FNV-1a 64 over the tensors' sizes: two ranks with the same row count but different tensors
 * still disagree in their headers. */
static uint64_t sizes_hash(const prism_coll_tensor *tensors, size_t count)
{
    uint64_t h = UINT64_C(14695981039346656037);
    for (size_t i = 0; i < count; i++) {
        uint64_t n = tensors[i].numel;
        for (int b = 0; b < 8; b++) {
            h ^= (n >> (8 * b)) & 0xff;
            h *= UINT64_C(1099511628211);
        }
    }
    return h;
}

/* ---- segments: runs of one tensor's rows inside one slice --------------------------------- */

/* A tensor's rows are consecutive in the layout, so the rows it has in one slice are consecutive
 * there too: one kernel call quantizes (or dequantizes) them. */
typedef struct coll_segment {
    size_t tensor;     /* index in the list */
    size_t elem_begin; /* first element of the tensor */
    size_t elem_count; /* elements (the last row may be partial) */
    size_t rows;       /* rows of the segment */
    size_t slice;      /* the rank that owns them */
    size_t pos;        /* row of the first one inside the slice */
} coll_segment;

typedef struct segment_iter {
    const prism_coll_tensor *tensors;
    size_t count, row_width, rows_per_rank;
    size_t t;      /* the tensor */
    size_t row;    /* its next row */
    size_t global; /* that row's index in the layout */
} segment_iter;

static segment_iter segments_of(const prism_coll_tensor *tensors, size_t count, const prism_coll_layout *lay)
{
    segment_iter it = {.tensors = tensors, .count = count, .row_width = lay->row_width,
                       .rows_per_rank = lay->rows_per_rank};
    return it;
}

static bool segment_next(segment_iter *it, coll_segment *s)
{
    for (; it->t < it->count; it->t++, it->row = 0) {
        size_t numel = it->tensors[it->t].numel;
        size_t trows = rows_of(numel, it->row_width);
        if (it->row == trows)
            continue;
        size_t pos = it->global % it->rows_per_rank;
        size_t n = trows - it->row;
        if (n > it->rows_per_rank - pos)
            n = it->rows_per_rank - pos;
        s->tensor = it->t;
        s->slice = it->global / it->rows_per_rank;
        s->pos = pos;
        s->rows = n;
        s->elem_begin = it->row * it->row_width;
        size_t end = (it->row + n) * it->row_width;
        s->elem_count = (end < numel ? end : numel) - s->elem_begin;
        it->row += n;
        it->global += n;
        return true;
    }
    return false;
}

/* ---- the call ------------------------------------------------------------------------------ */

/* Where a slice's codes and scales are: slice k of a wire buffer starts at k x slice_bytes, its
 * codes block first (rows_per_rank rows of code_row bytes), then its scales block. */
typedef struct wire_shape {
    size_t code_row;    /* code bytes of a row */
    size_t slice_bytes; /* rows_per_rank x row_bytes */
    size_t rows_per_rank;
} wire_shape;

static uint8_t *slice_codes(uint8_t *buf, const wire_shape *w, size_t slice, size_t pos)
{
    return buf + slice * w->slice_bytes + pos * w->code_row;
}

static float *slice_scales(uint8_t *buf, const wire_shape *w, size_t slice, size_t pos)
{
    /* 4-byte aligned: slice_bytes and the codes block are multiples of 4 (row_width % 8 == 0). */
    return (float *)(void *)(buf + slice * w->slice_bytes + w->rows_per_rank * w->code_row) + pos;
}

/* Grows one scratch buffer to at least need bytes (its contents are not kept). */
static prism_status grow(prism_coll_comm *c, void **buf, size_t *cap, size_t need, prism_error *err)
{
    if (need <= *cap)
        return PRISM_OK;
    c->be->release(c, *buf);
    *buf = NULL;
    *cap = 0;
    prism_status st = c->be->alloc(c, buf, need, err);
    if (st == PRISM_OK)
        *cap = need;
    return st;
}

/* The checks a call makes on its own arguments, before anything is sent. */
static prism_status check_call(const prism_coll_comm *c, const prism_coll_spec *spec, const prism_coll_tensor *tensors,
                               size_t count, unsigned kind, const float *out, size_t out_len,
                               prism_coll_layout *lay, prism_error *err)
{
    prism_status st = prism_coll_layout_of(spec, tensors, count, c->size, lay, err);
    if (st != PRISM_OK)
        return st;
    for (size_t i = 0; i < count; i++)
        if (tensors[i].numel && !tensors[i].data)
            return prism_error_set(err, PRISM_ERR_INVALID, "tensors[%zu].data: NULL with %zu elements", i,
                                   tensors[i].numel);
    if (kind == PRISM_COLL_KIND_REDUCE_SCATTER) {
        size_t need = lay->rows_per_rank * lay->row_width;
        if (need && !out)
            return prism_error_set(err, PRISM_ERR_INVALID, "out: NULL (the slice is %zu floats)", need);
        if (out_len < need)
            return prism_error_set(err, PRISM_ERR_INVALID,
                                   "out_len: %zu floats, the slice needs %zu (rows_per_rank %zu x row_width %" PRIu32 ")",
                                   out_len, need, lay->rows_per_rank, lay->row_width);
    }
    return PRISM_OK;
}

/* Step 1: every row of every tensor, quantized into its slice of wire_a; the empty padding rows
 * as codes 0 and scale 1. One quantize call (and counter slot) per segment. */
static prism_status pack(prism_coll_comm *c, const prism_coll_spec *spec, const prism_coll_layout *lay,
                         const wire_shape *w, const prism_coll_tensor *tensors, size_t count, prism_error *err)
{
    const prism_coll_backend *be = c->be;
    prism_quant_spec q = {.format = spec->wire, .granularity = PRISM_GRANULARITY_BLOCK, .group = lay->row_width,
                          .scale_mode = spec->scale_mode, .rounding = PRISM_ROUNDING_NEAREST};
    segment_iter it = segments_of(tensors, count, lay);
    coll_segment s;
    size_t slot = 0;
    prism_status st;
    while (segment_next(&it, &s)) {
        const prism_coll_tensor *t = &tensors[s.tensor];
        prism_tensor x = {.data = (const char *)t->data + s.elem_begin * dtype_size(t->dtype),
                          .numel = s.elem_count, .dtype = t->dtype};
        uint8_t *codes = slice_codes(c->wire_a, w, s.slice, s.pos);
        st = be->quantize(c, &q, &x, codes, slice_scales(c->wire_a, w, s.slice, s.pos), slot++, err);
        if (st != PRISM_OK)
            return st;
        size_t written = code_bytes(spec->wire, s.elem_count), full = s.rows * w->code_row;
        if (written < full && (st = be->zero(c, codes + written, full - written, err)) != PRISM_OK)
            return st;
    }
    for (size_t g = lay->rows; g < lay->padded_rows;) {
        size_t slice = g / lay->rows_per_rank, pos = g % lay->rows_per_rank;
        size_t n = lay->rows_per_rank - pos;
        if ((st = be->zero(c, slice_codes(c->wire_a, w, slice, pos), n * w->code_row, err)) != PRISM_OK ||
            (st = be->fill_ones(c, slice_scales(c->wire_a, w, slice, pos), n, err)) != PRISM_OK)
            return st;
        g += n;
    }
    return PRISM_OK;
}

static const char *kind_name(uint64_t magic)
{
    switch (magic ^ PRISM_COLL_MAGIC) {
    case PRISM_COLL_KIND_ALLREDUCE: return "allreduce";
    case PRISM_COLL_KIND_REDUCE_SCATTER: return "reduce_scatter";
    default: return "something that is not a Prism collective";
    }
}

static const char *wire_name(uint64_t wire)
{
    return wire < PRISM_PRECISION_COUNT ? prism_precision_name((prism_precision)wire) : "?";
}

static const char *op_name(uint64_t op)
{
    return op == PRISM_COLL_SUM ? "sum" : op == PRISM_COLL_AVG ? "avg" : "?";
}

static const char *scale_mode_name(uint64_t mode)
{
    return mode == PRISM_SCALE_FP32 ? "fp32" : mode == PRISM_SCALE_POW2 ? "pow2" : "?";
}

/* Every rank checks the same headers in the same order, so every rank reaches the same verdict:
 * a rank that refused its own arguments first (its status, for everyone), then each field
 * against rank 0's. The refusing rank keeps its own message. */
static prism_status check_headers(const prism_coll_comm *c, const prism_coll_header *all, prism_error *err)
{
    if (all[c->rank].refused)
        return (prism_status)all[c->rank].refused;
    for (int k = 0; k < c->size; k++)
        if (all[k].refused) {
            prism_status st = (prism_status)all[k].refused;
            return prism_error_set(err, st, "rank %d refused the call (%s); no rank sent data", k,
                                   prism_status_name(st));
        }
    const prism_coll_header *h0 = &all[0];
    for (int k = 1; k < c->size; k++) {
        const prism_coll_header *h = &all[k];
        if (h->magic != h0->magic)
            return prism_error_set(err, PRISM_ERR_INVALID, "call: rank 0 called %s, rank %d %s", kind_name(h0->magic),
                                   k, kind_name(h->magic));
        if (h->wire != h0->wire)
            return prism_error_set(err, PRISM_ERR_INVALID, "wire: rank 0 passed %s, rank %d %s", wire_name(h0->wire), k,
                                   wire_name(h->wire));
        if (h->op != h0->op)
            return prism_error_set(err, PRISM_ERR_INVALID, "op: rank 0 passed %s, rank %d %s", op_name(h0->op), k,
                                   op_name(h->op));
        if (h->scale_mode != h0->scale_mode)
            return prism_error_set(err, PRISM_ERR_INVALID, "scale_mode: rank 0 passed %s, rank %d %s",
                                   scale_mode_name(h0->scale_mode), k, scale_mode_name(h->scale_mode));
        if (h->row_width != h0->row_width)
            return prism_error_set(err, PRISM_ERR_INVALID, "row_width: rank 0 uses %" PRIu64 ", rank %d %" PRIu64,
                                   h0->row_width, k, h->row_width);
        if (h->count != h0->count)
            return prism_error_set(err, PRISM_ERR_INVALID, "tensors: rank 0 passed %" PRIu64 " tensors, rank %d %" PRIu64,
                                   h0->count, k, h->count);
        if (h->rows != h0->rows)
            return prism_error_set(err, PRISM_ERR_INVALID,
                                   "tensors: rank 0's tensors make %" PRIu64 " rows, rank %d's %" PRIu64, h0->rows, k,
                                   h->rows);
        if (h->sizes_hash != h0->sizes_hash)
            return prism_error_set(err, PRISM_ERR_INVALID,
                                   "tensors: rank 0 and rank %d passed tensors of different sizes (the same number of rows)",
                                   k);
    }
    return PRISM_OK;
}

/* Steps 2 to 5 once the headers agree. target is where the slice's FP32 sums go: the caller's
 * out for a reduce-scatter, c->acc for an all-reduce. */
static prism_status exchange_and_reduce(prism_coll_comm *c, unsigned kind, const prism_coll_spec *spec,
                                        const prism_coll_layout *lay, const wire_shape *w,
                                        const prism_coll_tensor *tensors, size_t count, float *target,
                                        prism_error *err)
{
    const prism_coll_backend *be = c->be;
    size_t rpr = lay->rows_per_rank, n = rpr * lay->row_width;
    prism_quant_spec rows = {.format = spec->wire, .granularity = PRISM_GRANULARITY_ROW, .group = lay->row_width,
                             .scale_mode = spec->scale_mode, .rounding = PRISM_ROUNDING_NEAREST};
    prism_status st;
    if ((st = be->alltoall(c, c->wire_a, c->wire_b, lay->row_bytes, rpr, err)) != PRISM_OK)
        return st;
    /* Step 3, in rank order whatever the transport did first. */
    if ((st = be->zero(c, target, n * sizeof(float), err)) != PRISM_OK)
        return st;
    for (int q = 0; q < c->size; q++)
        if ((st = be->accumulate(c, &rows, slice_codes(c->wire_b, w, (size_t)q, 0),
                                 slice_scales(c->wire_b, w, (size_t)q, 0), n, target, err)) != PRISM_OK)
            return st;
    if ((st = be->finish_sum(c, target, n, spec->op == PRISM_COLL_AVG ? c->size : 1, err)) != PRISM_OK)
        return st;
    if (kind == PRISM_COLL_KIND_REDUCE_SCATTER)
        return PRISM_OK;

    /* Step 4: the slice requantized into its place in wire_a, which the all-gather fills. */
    prism_tensor sums = {.data = target, .numel = n, .dtype = PRISM_DTYPE_F32};
    size_t me = (size_t)c->rank;
    if ((st = be->quantize(c, &rows, &sums, slice_codes(c->wire_a, w, me, 0), slice_scales(c->wire_a, w, me, 0),
                           PRISM_COLL_NO_SLOT, err)) != PRISM_OK)
        return st;
    if ((st = be->allgather(c, c->wire_a, lay->row_bytes, rpr, err)) != PRISM_OK)
        return st;

    /* Step 5: every row back into its tensor, padding left out. */
    prism_quant_spec q = rows;
    q.granularity = PRISM_GRANULARITY_BLOCK;
    segment_iter it = segments_of(tensors, count, lay);
    coll_segment s;
    while (segment_next(&it, &s)) {
        const prism_coll_tensor *t = &tensors[s.tensor];
        void *dst = (char *)t->data + s.elem_begin * dtype_size(t->dtype);
        if ((st = be->dequantize(c, &q, slice_codes(c->wire_a, w, s.slice, s.pos),
                                 slice_scales(c->wire_a, w, s.slice, s.pos), s.elem_count, dst, t->dtype, err)) !=
            PRISM_OK)
            return st;
    }
    return PRISM_OK;
}

/* Adds a call that succeeded to the process totals the trainer publishes for its agent
 * (DESIGN 12): the payload bytes it sent (prism_coll_stats.bytes_sent), and what a ring
 * all-reduce of the same elements in BF16 sends per rank, 2 bytes x elements x 2 (P-1) / P
 * (a reduce-scatter: half), rounded down. */
static void count_call(const prism_coll_comm *c, unsigned kind, prism_precision wire, const prism_coll_layout *lay,
                       const prism_coll_tensor *tensors, size_t count, uint64_t ns)
{
    uint64_t elements = 0;
    for (size_t i = 0; i < count; i++)
        elements += tensors[i].numel;
    uint64_t p = (uint64_t)c->size;
    uint64_t bf16 = (kind == PRISM_COLL_KIND_ALLREDUCE ? 4 : 2) * elements * (p - 1) / p;
    uint64_t sent = kind == PRISM_COLL_KIND_ALLREDUCE ? lay->wire_bytes : lay->wire_bytes / 2;
    prism_totals_add_collective(wire, sent, bf16, ns);
}

/* The whole call on this rank. Whatever happens before the headers, this rank still sends its
 * header (with `refused` set), so the others learn of it instead of waiting for data. */
static prism_status coll_run(prism_coll_comm *c, unsigned kind, const prism_coll_spec *spec,
                             const prism_coll_tensor *tensors, size_t count, float *out, size_t out_len,
                             prism_coll_stats *stats, prism_error *err)
{
    if (stats)
        memset(stats, 0, sizeof *stats);
    if (!c)
        return prism_error_set(err, PRISM_ERR_INVALID, "comm: NULL");
    uint64_t started_ns = prism_totals_now_ns();
    const prism_coll_backend *be = c->be;
    prism_status st = be->begin ? be->begin(c, err) : PRISM_OK;
    if (st != PRISM_OK)
        return st;

    prism_coll_layout lay;
    prism_coll_header mine = {.magic = PRISM_COLL_MAGIC | kind};
    size_t segments = 0;
    wire_shape w = {0};
    st = check_call(c, spec, tensors, count, kind, out, out_len, &lay, err);
    if (st == PRISM_OK) {
        mine.wire = (uint64_t)spec->wire;
        mine.op = (uint64_t)spec->op;
        mine.scale_mode = (uint64_t)spec->scale_mode;
        mine.row_width = lay.row_width;
        mine.count = count;
        mine.rows = lay.rows;
        mine.sizes_hash = sizes_hash(tensors, count);
        w.code_row = code_bytes(spec->wire, lay.row_width);
        w.slice_bytes = lay.rows_per_rank * lay.row_bytes;
        w.rows_per_rank = lay.rows_per_rank;
        segment_iter it = segments_of(tensors, count, &lay);
        coll_segment s;
        while (segment_next(&it, &s))
            segments++;
        size_t wire_total = lay.padded_rows * lay.row_bytes;
        if (wire_total) {
            if ((st = grow(c, (void **)&c->wire_a, &c->wire_a_cap, wire_total, err)) == PRISM_OK &&
                (st = grow(c, (void **)&c->wire_b, &c->wire_b_cap, wire_total, err)) == PRISM_OK &&
                kind == PRISM_COLL_KIND_ALLREDUCE)
                st = grow(c, (void **)&c->acc, &c->acc_cap, lay.rows_per_rank * lay.row_width * sizeof(float), err);
            if (st == PRISM_OK && segments)
                st = grow(c, (void **)&c->counters, &c->counters_cap, segments * sizeof(uint64_t), err);
            if (st == PRISM_OK)
                st = pack(c, spec, &lay, &w, tensors, count, err);
        }
    }
    mine.refused = (uint64_t)st;

    /* The refusing rank keeps its own message; the exchange writes into a spare one. */
    prism_error xerr = {0};
    prism_status xst = be->exchange_headers(c, &mine, st == PRISM_OK ? segments : 0, c->headers, &xerr);
    if (xst != PRISM_OK) {
        if (st == PRISM_OK)
            st = prism_error_set(err, xst, "%s", xerr.message);
    } else {
        st = check_headers(c, c->headers, err);
    }
    if (st == PRISM_OK && lay.rows_per_rank)
        st = exchange_and_reduce(c, kind, spec, &lay, &w, tensors, count,
                                 kind == PRISM_COLL_KIND_REDUCE_SCATTER ? out : c->acc, err);
    if (st == PRISM_OK && stats) {
        uint64_t half = lay.wire_bytes / 2;
        stats->bytes_sent = stats->bytes_received = kind == PRISM_COLL_KIND_ALLREDUCE ? lay.wire_bytes : half;
        for (int k = 0; k < c->size; k++)
            stats->nonfinite += c->headers[k].nonfinite;
    }
    if (be->end)
        be->end(c);
    if (st == PRISM_OK)
        count_call(c, kind, spec->wire, &lay, tensors, count, prism_totals_now_ns() - started_ns);
    return st;
}

prism_status prism_coll_allreduce(prism_coll_comm *c, const prism_coll_spec *spec, prism_coll_tensor *tensors,
                                  size_t count, prism_coll_stats *stats, prism_error *err)
{
    return coll_run(c, PRISM_COLL_KIND_ALLREDUCE, spec, tensors, count, NULL, 0, stats, err);
}

prism_status prism_coll_reduce_scatter(prism_coll_comm *c, const prism_coll_spec *spec,
                                       const prism_coll_tensor *tensors, size_t count, float *out, size_t out_len,
                                       prism_coll_stats *stats, prism_error *err)
{
    return coll_run(c, PRISM_COLL_KIND_REDUCE_SCATTER, spec, tensors, count, out, out_len, stats, err);
}

/* ---- the communicator ---------------------------------------------------------------------- */

prism_status prism_coll_comm_new(const prism_coll_backend *be, void *impl, int rank, int size,
                                 prism_coll_comm **out, prism_error *err)
{
    prism_coll_comm *c = calloc(1, sizeof *c);
    prism_coll_header *headers = size > 0 ? calloc((size_t)size, sizeof *headers) : NULL;
    if (!c || !headers) {
        prism_coll_comm tmp = {.be = be, .impl = impl, .rank = rank, .size = size};
        be->destroy(&tmp);
        free(c);
        free(headers);
        *out = NULL;
        return prism_error_set(err, PRISM_ERR_NOMEM, "collectives: no memory for a communicator of %d ranks", size);
    }
    c->be = be;
    c->impl = impl;
    c->rank = rank;
    c->size = size;
    c->headers = headers;
    *out = c;
    return PRISM_OK;
}

int prism_coll_rank(const prism_coll_comm *c)
{
    return c ? c->rank : -1;
}

int prism_coll_size(const prism_coll_comm *c)
{
    return c ? c->size : 0;
}

void prism_coll_comm_destroy(prism_coll_comm *c)
{
    if (!c)
        return;
    prism_error ignored = {0};
    bool entered = !c->be->begin || c->be->begin(c, &ignored) == PRISM_OK;
    c->be->release(c, c->wire_a);
    c->be->release(c, c->wire_b);
    c->be->release(c, c->acc);
    c->be->release(c, c->counters);
    if (entered && c->be->end)
        c->be->end(c);
    c->be->destroy(c);
    free(c->headers);
    free(c);
}

/* ---- the host memory space ------------------------------------------------------------------ */

prism_status prism_coll_host_alloc(prism_coll_comm *c, void **p, size_t bytes, prism_error *err)
{
    (void)c;
    *p = malloc(bytes);
    if (!*p)
        return prism_error_set(err, PRISM_ERR_NOMEM, "collectives: no memory for %zu bytes of scratch", bytes);
    return PRISM_OK;
}

void prism_coll_host_release(prism_coll_comm *c, void *p)
{
    (void)c;
    free(p);
}

prism_status prism_coll_host_quantize(prism_coll_comm *c, const prism_quant_spec *spec, const prism_tensor *x,
                                      uint8_t *codes, float *scales, size_t slot, prism_error *err)
{
    uint64_t bad = 0;
    prism_status st = prism_quantize_cpu(spec, x, codes, scales, &bad, err);
    if (st == PRISM_OK && slot != PRISM_COLL_NO_SLOT)
        c->counters[slot] = bad;
    return st;
}

prism_status prism_coll_host_accumulate(prism_coll_comm *c, const prism_quant_spec *spec, const uint8_t *codes,
                                        const float *scales, size_t numel, float *acc, prism_error *err)
{
    (void)c;
    return prism_dequantize_accumulate_cpu(spec, codes, scales, numel, acc, err);
}

prism_status prism_coll_host_dequantize(prism_coll_comm *c, const prism_quant_spec *spec, const uint8_t *codes,
                                        const float *scales, size_t numel, void *out, prism_dtype out_dtype,
                                        prism_error *err)
{
    (void)c;
    prism_status st = prism_dequantize_cpu(spec, codes, scales, numel, out, out_dtype, err);
    if (st != PRISM_OK)
        prism_error_prefix(err, "dequantize into %s", dtype_name(out_dtype));
    return st;
}

prism_status prism_coll_host_zero(prism_coll_comm *c, void *dst, size_t bytes, prism_error *err)
{
    (void)c;
    (void)err;
    memset(dst, 0, bytes);
    return PRISM_OK;
}

prism_status prism_coll_host_fill_ones(prism_coll_comm *c, float *dst, size_t n, prism_error *err)
{
    (void)c;
    (void)err;
    for (size_t i = 0; i < n; i++)
        dst[i] = 1.0f;
    return PRISM_OK;
}

prism_status prism_coll_host_finish_sum(prism_coll_comm *c, float *acc, size_t n, int divisor, prism_error *err)
{
    (void)c;
    (void)err;
    float d = (float)divisor;
    for (size_t i = 0; i < n; i++) {
        float v = acc[i];
        if (v > FLT_MAX)
            v = FLT_MAX;
        else if (v < -FLT_MAX)
            v = -FLT_MAX;
        if (divisor > 1)
            v = v / d;
        acc[i] = v;
    }
    return PRISM_OK;
}

uint64_t prism_coll_host_nonfinite(const prism_coll_comm *c, size_t slots)
{
    uint64_t total = 0;
    for (size_t i = 0; i < slots; i++)
        total += c->counters[i];
    return total;
}
