/* The quantized collectives' core in one process (include/prism/collectives.h): the row layout
 * worked out by hand, the argument checks and the field each one names, the exact bytes of the
 * wire, and the header checks that make a mismatch an error on every rank.
 *
 * The wire and the headers are seen through a "mirror" transport (the host memory space of
 * collectives.c and a transport of this file): this process plays rank r of P ranks that all
 * hold the same tensors, so the all-to-all gives it its own slice from every rank, and each
 * header it sends comes back P times (a test may change the copies to play a rank that
 * disagrees). The all-gather needs the other ranks' sums, so all-reduce runs with P = 1 only;
 * the many-rank paths run for real in test_collectives_mpi.c. */
#include "collectives_internal.h"
#include "prism/collectives.h"
#include "testutil.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* ---- the mirror transport ----------------------------------------------------------------- */

static uint8_t g_sent[4096]; /* the last all-to-all's send buffer */
static size_t g_sent_len;
static void (*g_tamper)(prism_coll_header *all, int size); /* changes the other ranks' headers */

static prism_status mirror_exchange(prism_coll_comm *c, prism_coll_header *mine, size_t slots, prism_coll_header *all,
                                    prism_error *err)
{
    (void)err;
    mine->nonfinite += prism_coll_host_nonfinite(c, slots);
    for (int k = 0; k < c->size; k++)
        all[k] = *mine;
    if (g_tamper)
        g_tamper(all, c->size);
    return PRISM_OK;
}

static prism_status mirror_alltoall(prism_coll_comm *c, const uint8_t *send, uint8_t *recv, size_t row_bytes,
                                    size_t rows, prism_error *err)
{
    size_t slice = row_bytes * rows, total = slice * (size_t)c->size;
    if (total > sizeof g_sent)
        return prism_error_set(err, PRISM_ERR_LIMIT, "mirror: %zu bytes", total);
    memcpy(g_sent, send, total);
    g_sent_len = total;
    for (int k = 0; k < c->size; k++)
        memcpy(recv + (size_t)k * slice, send + (size_t)c->rank * slice, slice);
    return PRISM_OK;
}

static prism_status mirror_allgather(prism_coll_comm *c, uint8_t *buf, size_t row_bytes, size_t rows,
                                     prism_error *err)
{
    (void)buf;
    (void)row_bytes;
    (void)rows;
    if (c->size != 1)
        return prism_error_set(err, PRISM_ERR_STATE, "mirror: an all-gather needs P = 1");
    return PRISM_OK;
}

static void mirror_destroy(prism_coll_comm *c)
{
    (void)c;
}

static const prism_coll_backend mirror_backend = {
    .name = "mirror",
    .alloc = prism_coll_host_alloc,
    .release = prism_coll_host_release,
    .quantize = prism_coll_host_quantize,
    .accumulate = prism_coll_host_accumulate,
    .dequantize = prism_coll_host_dequantize,
    .zero = prism_coll_host_zero,
    .fill_ones = prism_coll_host_fill_ones,
    .finish_sum = prism_coll_host_finish_sum,
    .exchange_headers = mirror_exchange,
    .alltoall = mirror_alltoall,
    .allgather = mirror_allgather,
    .destroy = mirror_destroy,
};

static prism_coll_comm *mirror(int rank, int size)
{
    prism_coll_comm *c = NULL;
    prism_error err = {0};
    CU_ASSERT_EQUAL_FATAL(prism_coll_comm_new(&mirror_backend, NULL, rank, size, &c, &err), PRISM_OK);
    g_tamper = NULL;
    g_sent_len = 0;
    return c;
}

/* ---- layout ------------------------------------------------------------------------------- */

typedef struct layout_case {
    const char *name;
    prism_precision wire;
    uint32_t row_width;
    size_t numel[4];
    size_t count;
    int world;
    prism_coll_layout want;
} layout_case;

/* Each row worked by hand: rows = sum of ceil(numel / width), padded up to a multiple of P,
 * row_bytes = width (or width / 2) + 4, wire_bytes = 2 (P - 1) rows_per_rank row_bytes. */
static const layout_case layout_cases[] = {
    /* 1000 = 3 x 256 + 232: 4 rows, and 3 elements 1 row: 5, padded to 6 on 3 ranks */
    {"fp8 1000+3 P3", PRISM_PRECISION_FP8_E4M3, 256, {1000, 3}, 2, 3, {5, 6, 2, 260, 2 * 2 * 2 * 260, 256}},
    {"int4 1000+3 P3", PRISM_PRECISION_INT4, 256, {1000, 3}, 2, 3, {5, 6, 2, 132, 2 * 2 * 2 * 132, 256}},
    {"int8 default width", PRISM_PRECISION_INT8, 0, {1000, 3}, 2, 3, {5, 6, 2, 260, 2080, 256}},
    {"one element P4", PRISM_PRECISION_INT8, 8, {1}, 1, 4, {1, 4, 1, 12, 2 * 3 * 1 * 12, 8}},
    {"exact rows P2", PRISM_PRECISION_FP8_E5M2, 256, {512}, 1, 2, {2, 2, 1, 260, 2 * 1 * 1 * 260, 256}},
    {"one rank sends nothing", PRISM_PRECISION_FP8_E4M3, 256, {1000, 3}, 2, 1, {5, 5, 5, 260, 0, 256}},
    {"empty list", PRISM_PRECISION_INT8, 64, {0}, 0, 4, {0, 0, 0, 68, 0, 64}},
    {"empty tensors make no rows", PRISM_PRECISION_INT8, 64, {0, 65, 0}, 3, 2, {2, 2, 1, 68, 2 * 1 * 1 * 68, 64}},
    {"widest rows, int4", PRISM_PRECISION_INT4, 65536, {65537}, 1, 3, {2, 3, 1, 32772, 2 * 2 * 32772, 65536}},
};

static void test_layout_matches_hand_worked_cases(void)
{
    for (size_t i = 0; i < sizeof layout_cases / sizeof layout_cases[0]; i++) {
        const layout_case *lc = &layout_cases[i];
        prism_coll_tensor t[4] = {{0}};
        for (size_t k = 0; k < lc->count; k++)
            t[k] = (prism_coll_tensor){NULL, lc->numel[k], PRISM_DTYPE_F32};
        prism_coll_spec spec = {.wire = lc->wire, .row_width = lc->row_width};
        prism_coll_layout got;
        prism_error err = {0};
        CU_ASSERT_EQUAL(prism_coll_layout_of(&spec, lc->count ? t : NULL, lc->count, lc->world, &got, &err),
                        PRISM_OK);
        bool same = got.rows == lc->want.rows && got.padded_rows == lc->want.padded_rows &&
                    got.rows_per_rank == lc->want.rows_per_rank && got.row_bytes == lc->want.row_bytes &&
                    got.wire_bytes == lc->want.wire_bytes && got.row_width == lc->want.row_width;
        if (!same)
            printf("\n%s: rows %zu padded %zu per rank %zu row_bytes %zu wire %llu width %u\n", lc->name, got.rows,
                   got.padded_rows, got.rows_per_rank, got.row_bytes, (unsigned long long)got.wire_bytes,
                   got.row_width);
        CU_ASSERT(same);
    }
}

/* FP8 with rows of 256 sends (1 + 4/256) / 2 = 0.5078 of a BF16 ring all-reduce. */
static void test_layout_fp8_wire_is_0508_of_bf16(void)
{
    prism_coll_tensor t = {NULL, 1 << 20, PRISM_DTYPE_BF16};
    prism_coll_spec spec = {.wire = PRISM_PRECISION_FP8_E4M3};
    prism_coll_layout lay;
    CU_ASSERT_EQUAL_FATAL(prism_coll_layout_of(&spec, &t, 1, 4, &lay, NULL), PRISM_OK);
    double bf16 = 2.0 * 3.0 / 4.0 * (double)(1 << 20) * 2.0;
    CU_ASSERT_DOUBLE_EQUAL((double)lay.wire_bytes / bf16, 0.5078125, 1e-12);
}

typedef struct bad_case {
    prism_coll_spec spec;
    size_t count;
    prism_dtype dtype1;
    int world;
    bool null_tensors;
    const char *field; /* the message starts with it */
} bad_case;

static void test_layout_names_the_field_at_fault(void)
{
    const bad_case cases[] = {
        {{.wire = PRISM_PRECISION_BF16}, 2, PRISM_DTYPE_F32, 2, false, "wire: bf16"},
        {{.wire = (prism_precision)9}, 2, PRISM_DTYPE_F32, 2, false, "wire: unknown precision 9"},
        {{.wire = PRISM_PRECISION_INT8, .row_width = 12}, 2, PRISM_DTYPE_F32, 2, false, "row_width: 12"},
        {{.wire = PRISM_PRECISION_INT4, .row_width = 4}, 2, PRISM_DTYPE_F32, 2, false, "row_width: 4"},
        {{.wire = PRISM_PRECISION_INT8, .row_width = 65544}, 2, PRISM_DTYPE_F32, 2, false, "row_width: 65544"},
        {{.wire = PRISM_PRECISION_INT8, .op = (prism_coll_op)2}, 2, PRISM_DTYPE_F32, 2, false, "op: unknown value 2"},
        {{.wire = PRISM_PRECISION_INT8, .scale_mode = (prism_scale_mode)3}, 2, PRISM_DTYPE_F32, 2, false,
         "scale_mode: unknown value 3"},
        {{.wire = PRISM_PRECISION_INT8}, 2, (prism_dtype)7, 2, false, "tensors[1].dtype: unknown dtype 7"},
        {{.wire = PRISM_PRECISION_INT8}, 2, PRISM_DTYPE_F32, 0, false, "world: 0 ranks"},
        {{.wire = PRISM_PRECISION_INT8}, 2, PRISM_DTYPE_F32, 2, true, "tensors: NULL with count 2"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        prism_coll_tensor t[2] = {{NULL, 10, PRISM_DTYPE_F32}, {NULL, 10, cases[i].dtype1}};
        prism_coll_layout lay;
        prism_error err = {0};
        prism_status st = prism_coll_layout_of(&cases[i].spec, cases[i].null_tensors ? NULL : t, cases[i].count,
                                               cases[i].world, &lay, &err);
        CU_ASSERT_EQUAL(st, PRISM_ERR_INVALID);
        if (strncmp(err.message, cases[i].field, strlen(cases[i].field)) != 0) {
            printf("\nwanted '%s...', got '%s'\n", cases[i].field, err.message);
            CU_FAIL("message");
        }
    }
    prism_error err = {0};
    CU_ASSERT_EQUAL(prism_coll_layout_of(NULL, NULL, 0, 1, &(prism_coll_layout){0}, &err), PRISM_ERR_INVALID);
    CU_ASSERT_STRING_EQUAL(err.message, "spec: NULL");
}

/* ---- the wire ------------------------------------------------------------------------------ */

static void put_f32(uint8_t *p, float v)
{
    memcpy(p, &v, 4);
}

/* Two tensors, rows of 8, INT8, rank 0 of 2: rows a0 a1 | b0 (empty), each slice its codes block
 * then its scales block. Values chosen so that every scale is exact (amax 127 -> 1, 63.5 -> 0.5). */
static void test_wire_is_codes_block_then_scales_block_per_slice(void)
{
    float a[10] = {1, -2, 3, -4, 5, -6, 7, 127, 63.5f, -25};
    float b[3] = {-63.5f, 0, 4.5f};
    prism_coll_tensor t[2] = {{a, 10, PRISM_DTYPE_F32}, {b, 3, PRISM_DTYPE_F32}};
    prism_coll_spec spec = {.wire = PRISM_PRECISION_INT8, .row_width = 8, .op = PRISM_COLL_SUM};
    prism_coll_comm *c = mirror(0, 2);
    float out[16];
    prism_coll_stats stats;
    prism_error err = {0};
    CU_ASSERT_EQUAL_FATAL(prism_coll_reduce_scatter(c, &spec, t, 2, out, 16, &stats, &err), PRISM_OK);

    uint8_t want[48] = {0};
    const int8_t row0[8] = {1, -2, 3, -4, 5, -6, 7, 127}, row1[2] = {127, -50}, row2[3] = {-127, 0, 9};
    memcpy(want, row0, 8);
    memcpy(want + 8, row1, 2);
    put_f32(want + 16, 1.0f);
    put_f32(want + 20, 0.5f);
    memcpy(want + 24, row2, 3);
    put_f32(want + 40, 0.5f);
    put_f32(want + 44, 1.0f); /* the empty row */
    CU_ASSERT_EQUAL(g_sent_len, sizeof want);
    CU_ASSERT_EQUAL(memcmp(g_sent, want, sizeof want), 0);

    /* Rank 0 owns rows 0 and 1: twice each row (every rank holds the same tensors). */
    for (int i = 0; i < 8; i++)
        CU_ASSERT_EQUAL(out[i], 2 * a[i]);
    CU_ASSERT_EQUAL(out[8], 127.0f);
    CU_ASSERT_EQUAL(out[9], -50.0f);
    for (int i = 10; i < 16; i++)
        CU_ASSERT_EQUAL(out[i], 0.0f);
    CU_ASSERT_EQUAL(stats.bytes_sent, 24u); /* one slice of 2 rows x 12 bytes to the other rank */
    CU_ASSERT_EQUAL(stats.bytes_received, 24u);
    CU_ASSERT_EQUAL(stats.nonfinite, 0u);
    prism_coll_comm_destroy(c);

    /* Rank 1 owns b's row and the empty one; AVG gives b back. */
    c = mirror(1, 2);
    spec.op = PRISM_COLL_AVG;
    CU_ASSERT_EQUAL_FATAL(prism_coll_reduce_scatter(c, &spec, t, 2, out, 16, &stats, &err), PRISM_OK);
    float want_out[16] = {-63.5f, 0, 4.5f};
    CU_ASSERT_EQUAL(memcmp(out, want_out, sizeof want_out), 0);
    prism_coll_comm_destroy(c);
}

/* INT4: two codes per byte, low nibble first, a tensor's odd last element in a low nibble. */
static void test_wire_int4_packs_low_nibble_first(void)
{
    float x[5] = {7, -7, 1, 0, -3};
    prism_coll_tensor t = {x, 5, PRISM_DTYPE_F32};
    prism_coll_spec spec = {.wire = PRISM_PRECISION_INT4, .row_width = 8};
    prism_coll_comm *c = mirror(0, 1);
    prism_coll_stats stats;
    prism_error err = {0};
    CU_ASSERT_EQUAL_FATAL(prism_coll_allreduce(c, &spec, &t, 1, &stats, &err), PRISM_OK);
    uint8_t want[8] = {0x97, 0x01, 0x0d, 0x00};
    put_f32(want + 4, 1.0f);
    CU_ASSERT_EQUAL(g_sent_len, 8u);
    CU_ASSERT_EQUAL(memcmp(g_sent, want, 8), 0);
    const float back[5] = {7, -7, 1, 0, -3};
    CU_ASSERT_EQUAL(memcmp(x, back, sizeof back), 0); /* exact, and one rank: the same values */
    CU_ASSERT_EQUAL(stats.bytes_sent, 0u);
    prism_coll_comm_destroy(c);
}

/* NaN and Inf go out as code 0 and are counted once per rank that holds them. */
static void test_nonfinite_sent_as_zero_and_counted_over_ranks(void)
{
    float x[8] = {1, NAN, 2, INFINITY, -INFINITY, 4, 0, -127};
    prism_coll_tensor t = {x, 8, PRISM_DTYPE_F32};
    prism_coll_spec spec = {.wire = PRISM_PRECISION_INT8, .row_width = 8};
    prism_coll_comm *c = mirror(0, 3);
    float out[8];
    prism_coll_stats stats;
    prism_error err = {0};
    CU_ASSERT_EQUAL_FATAL(prism_coll_reduce_scatter(c, &spec, &t, 1, out, 8, &stats, &err), PRISM_OK);
    const int8_t codes[8] = {1, 0, 2, 0, 0, 4, 0, -127};
    CU_ASSERT_EQUAL(memcmp(g_sent, codes, 8), 0);
    CU_ASSERT_EQUAL(stats.nonfinite, 3u * 3u);
    const float want[8] = {3, 0, 6, 0, 0, 12, 0, -381};
    CU_ASSERT_EQUAL(memcmp(out, want, sizeof want), 0);
    prism_coll_comm_destroy(c);
}

/* ---- checks and headers ------------------------------------------------------------------- */

static void test_call_checks_name_the_field(void)
{
    float x[4] = {0};
    prism_coll_tensor t[2] = {{x, 4, PRISM_DTYPE_F32}, {NULL, 3, PRISM_DTYPE_F32}};
    prism_coll_spec spec = {.wire = PRISM_PRECISION_FP8_E4M3, .row_width = 8};
    prism_coll_comm *c = mirror(0, 2);
    prism_error err = {0};
    float out[8];
    CU_ASSERT_EQUAL(prism_coll_reduce_scatter(c, &spec, t, 2, out, 8, NULL, &err), PRISM_ERR_INVALID);
    CU_ASSERT_STRING_EQUAL(err.message, "tensors[1].data: NULL with 3 elements");
    CU_ASSERT_EQUAL(prism_coll_reduce_scatter(c, &spec, t, 1, out, 7, NULL, &err), PRISM_ERR_INVALID);
    CU_ASSERT_STRING_EQUAL(err.message,
                           "out_len: 7 floats, the slice needs 8 (rows_per_rank 1 x row_width 8)");
    CU_ASSERT_EQUAL(prism_coll_reduce_scatter(c, &spec, t, 1, NULL, 0, NULL, &err), PRISM_ERR_INVALID);
    CU_ASSERT_STRING_EQUAL(err.message, "out: NULL (the slice is 8 floats)");
    CU_ASSERT_EQUAL(prism_coll_allreduce(NULL, &spec, t, 1, NULL, &err), PRISM_ERR_INVALID);
    CU_ASSERT_STRING_EQUAL(err.message, "comm: NULL");
    prism_coll_comm_destroy(c);
}

static void tamper_wire(prism_coll_header *all, int size)
{
    all[size - 1].wire = PRISM_PRECISION_INT8;
}
static void tamper_op(prism_coll_header *all, int size)
{
    all[size - 1].op = PRISM_COLL_AVG;
}
static void tamper_rows(prism_coll_header *all, int size)
{
    all[size - 1].rows += 1;
}
static void tamper_sizes(prism_coll_header *all, int size)
{
    all[size - 1].sizes_hash ^= 1;
}
static void tamper_kind(prism_coll_header *all, int size)
{
    all[size - 1].magic = PRISM_COLL_MAGIC | PRISM_COLL_KIND_REDUCE_SCATTER;
}
static void tamper_refused(prism_coll_header *all, int size)
{
    all[size - 1].refused = PRISM_ERR_INVALID;
}

/* A rank that disagrees, or that refused its own arguments, is an error on this rank too. */
static void test_headers_that_disagree_are_refused_on_every_rank(void)
{
    const struct {
        void (*tamper)(prism_coll_header *, int);
        const char *message;
    } cases[] = {
        {tamper_wire, "wire: rank 0 passed fp8_e4m3, rank 2 int8"},
        {tamper_op, "op: rank 0 passed sum, rank 2 avg"},
        {tamper_rows, "tensors: rank 0's tensors make 1 rows, rank 2's 2"},
        {tamper_sizes, "tensors: rank 0 and rank 2 passed tensors of different sizes (the same number of rows)"},
        {tamper_kind, "call: rank 0 called allreduce, rank 2 reduce_scatter"},
        {tamper_refused, "rank 2 refused the call (invalid); no rank sent data"},
    };
    float x[8] = {1, 2, 3};
    prism_coll_tensor t = {x, 8, PRISM_DTYPE_F32};
    prism_coll_spec spec = {.wire = PRISM_PRECISION_FP8_E4M3, .row_width = 8};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        prism_coll_comm *c = mirror(0, 3);
        g_tamper = cases[i].tamper;
        prism_error err = {0};
        CU_ASSERT_EQUAL(prism_coll_allreduce(c, &spec, &t, 1, NULL, &err), PRISM_ERR_INVALID);
        CU_ASSERT_STRING_EQUAL(err.message, cases[i].message);
        CU_ASSERT_EQUAL(g_sent_len, 0u); /* nothing was exchanged */
        g_tamper = NULL;
        prism_coll_comm_destroy(c);
    }
}

/* A rank that refuses its own arguments keeps its own message (and still sends its header). */
static void test_refusing_rank_keeps_its_message(void)
{
    prism_coll_comm *c = mirror(1, 2);
    prism_coll_spec spec = {.wire = PRISM_PRECISION_INT4, .row_width = 6};
    float x[4] = {0};
    prism_coll_tensor t = {x, 4, PRISM_DTYPE_F32};
    prism_error err = {0};
    prism_coll_stats stats = {1, 1, 1};
    CU_ASSERT_EQUAL(prism_coll_allreduce(c, &spec, &t, 1, &stats, &err), PRISM_ERR_INVALID);
    CU_ASSERT_EQUAL(strncmp(err.message, "row_width: 6 ", 13), 0);
    CU_ASSERT_EQUAL(stats.bytes_sent + stats.bytes_received + stats.nonfinite, 0u);
    prism_coll_comm_destroy(c);
}

static const prism_test_case layout_tests[] = {
    {"test_layout_matches_hand_worked_cases", test_layout_matches_hand_worked_cases},
    {"test_layout_fp8_wire_is_0508_of_bf16", test_layout_fp8_wire_is_0508_of_bf16},
    {"test_layout_names_the_field_at_fault", test_layout_names_the_field_at_fault},
    {NULL, NULL},
};

static const prism_test_case wire_tests[] = {
    {"test_wire_is_codes_block_then_scales_block_per_slice", test_wire_is_codes_block_then_scales_block_per_slice},
    {"test_wire_int4_packs_low_nibble_first", test_wire_int4_packs_low_nibble_first},
    {"test_nonfinite_sent_as_zero_and_counted_over_ranks", test_nonfinite_sent_as_zero_and_counted_over_ranks},
    {NULL, NULL},
};

static const prism_test_case check_tests[] = {
    {"test_call_checks_name_the_field", test_call_checks_name_the_field},
    {"test_headers_that_disagree_are_refused_on_every_rank", test_headers_that_disagree_are_refused_on_every_rank},
    {"test_refusing_rank_keeps_its_message", test_refusing_rank_keeps_its_message},
    {NULL, NULL},
};

int main(int argc, char **argv)
{
    const prism_test_suite suites[] = {
        {"layout", layout_tests},
        {"wire", wire_tests},
        {"checks", check_tests},
        {NULL, NULL},
    };
    return prism_test_main(argc, argv, suites);
}
