/* The transfer engine's CPU backend (include/prism/transfer.h): a BF16 fetch is the registered
 * block byte for byte; a low-precision fetch is exactly prism_dequantize_cpu(prism_quantize_cpu
 * (block)) to BF16, computed here independently with the kernels; update_block makes the
 * quantized copy again; prefetches ask the Conductor and refusals are counted by rule; every
 * counter is exact; bad arguments are refused naming the argument. */
#include "testutil.h"

#include "prism/transfer.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const prism_precision low_formats[] = {PRISM_PRECISION_INT8, PRISM_PRECISION_FP8_E4M3,
                                              PRISM_PRECISION_FP8_E5M2, PRISM_PRECISION_INT4};
#define N_LOW (sizeof low_formats / sizeof low_formats[0])

/* n BF16 weights: values of varied magnitude per 100 elements (so groups get different scales),
 * a run of zeros, and the seed's own pattern. */
static uint16_t *make_weights(size_t n, uint32_t seed)
{
    uint16_t *w = malloc(n * sizeof *w);
    CU_ASSERT_FATAL(w != NULL);
    uint32_t s = seed * 2654435761u + 1;
    for (size_t i = 0; i < n; i++) {
        s = s * 1664525u + 1013904223u;
        float u = (float)(s >> 8) / 16777216.0f - 0.5f;
        float mag = ldexpf(1.0f, (int)((i / 100) % 24) - 16);
        w[i] = prism_f32_to_bf16((i / 50) % 7 == 3 ? 0.0f : u * mag);
    }
    return w;
}

static prism_transfer *make_engine(const prism_quant_spec *quant, prism_conductor *c, size_t max_bytes)
{
    prism_transfer_options o = {.backend = PRISM_TRANSFER_CPU, .max_block_bytes = max_bytes,
                                .quant = quant, .conductor = c};
    prism_transfer *t = NULL;
    prism_error err = {0};
    prism_status st = prism_transfer_create(&o, &t, &err);
    if (st != PRISM_OK)
        fprintf(stderr, "create: %s\n", err.message);
    CU_ASSERT_FATAL(st == PRISM_OK && t != NULL);
    return t;
}

static void add_ok(prism_transfer *t, uint32_t id, const uint16_t *w, size_t n)
{
    prism_error err = {0};
    prism_status st = prism_transfer_add_block(t, id, w, n, &err);
    if (st != PRISM_OK)
        fprintf(stderr, "add %u: %s\n", (unsigned)id, err.message);
    CU_ASSERT_FATAL(st == PRISM_OK);
}

static void fetch_ok(prism_transfer *t, uint32_t id, prism_precision p, uint16_t *dst)
{
    prism_error err = {0};
    prism_transfer_ticket tk;
    prism_status st = prism_transfer_fetch(t, id, p, dst, NULL, &tk, &err);
    if (st != PRISM_OK)
        fprintf(stderr, "fetch %u %s: %s\n", (unsigned)id, prism_precision_name(p), err.message);
    CU_ASSERT_FATAL(st == PRISM_OK);
    CU_ASSERT(tk.seq > 0);
    CU_ASSERT_EQUAL(tk.verdict, PRISM_CONDUCTOR_ALLOW);
}

/* The reference: the kernels' quantize then dequantize to BF16, on buffers of our own. */
static uint16_t *reference(const prism_quant_spec *base, prism_precision p, const uint16_t *w, size_t n)
{
    prism_quant_spec spec = *base;
    spec.format = p;
    size_t groups = 0, code_bytes = 0;
    prism_error err = {0};
    CU_ASSERT_FATAL(prism_quant_layout(&spec, n, &groups, NULL, &code_bytes, &err) == PRISM_OK);
    uint8_t *codes = malloc(code_bytes + 1);
    float *scales = malloc(groups * sizeof *scales + 1);
    uint16_t *out = malloc(n * sizeof *out);
    CU_ASSERT_FATAL(codes && scales && out);
    prism_tensor x = {w, n, PRISM_DTYPE_BF16};
    CU_ASSERT_FATAL(prism_quantize_cpu(&spec, &x, codes, scales, NULL, &err) == PRISM_OK);
    CU_ASSERT_FATAL(prism_dequantize_cpu(&spec, codes, scales, n, out, PRISM_DTYPE_BF16, &err) == PRISM_OK);
    free(codes);
    free(scales);
    return out;
}

static const prism_quant_spec default_spec = {.granularity = PRISM_GRANULARITY_BLOCK, .group = 128};

static void test_bf16_fetch_is_the_source_byte_for_byte(void)
{
    static const size_t lens[] = {1, 2, 127, 4099, 65541};
    prism_transfer *t = make_engine(NULL, NULL, 65541 * 2);
    for (size_t i = 0; i < sizeof lens / sizeof lens[0]; i++) {
        uint16_t *w = make_weights(lens[i], (uint32_t)i);
        add_ok(t, (uint32_t)i, w, lens[i]);
        uint16_t *dst = calloc(lens[i], sizeof *dst);
        fetch_ok(t, (uint32_t)i, PRISM_PRECISION_BF16, dst);
        CU_ASSERT_EQUAL(memcmp(dst, w, lens[i] * 2), 0);
        free(dst);
        free(w);
    }
    prism_transfer_destroy(t);
}

/* Every low format, for the default spec (blocks of 128) and others, at lengths around group
 * boundaries. */
static void test_each_low_precision_fetch_is_quantize_then_dequantize(void)
{
    static const size_t lens[] = {1, 7, 127, 128, 129, 1000, 4099, 65536 + 5};
    const prism_quant_spec specs[] = {
        default_spec,
        {.granularity = PRISM_GRANULARITY_TENSOR, .scale_mode = PRISM_SCALE_POW2},
        {.granularity = PRISM_GRANULARITY_BLOCK, .group = 24, .scale_mode = PRISM_SCALE_POW2},
        {.granularity = PRISM_GRANULARITY_BLOCK, .group = 32, .rounding = PRISM_ROUNDING_STOCHASTIC, .seed = 7},
    };
    for (size_t s = 0; s < sizeof specs / sizeof specs[0]; s++) {
        prism_transfer *t = make_engine(s == 0 ? NULL : &specs[s], NULL, 65541 * 2);
        for (size_t i = 0; i < sizeof lens / sizeof lens[0]; i++) {
            uint16_t *w = make_weights(lens[i], (uint32_t)(10 * s + i));
            add_ok(t, (uint32_t)i, w, lens[i]);
            uint16_t *dst = malloc(lens[i] * sizeof *dst);
            for (size_t f = 0; f < N_LOW; f++) {
                memset(dst, 0xa5, lens[i] * 2);
                fetch_ok(t, (uint32_t)i, low_formats[f], dst);
                uint16_t *want = reference(&specs[s], low_formats[f], w, lens[i]);
                int same = memcmp(dst, want, lens[i] * 2) == 0;
                if (!same)
                    fprintf(stderr, "spec %zu, %s, numel %zu: differs from the kernels\n", s,
                            prism_precision_name(low_formats[f]), lens[i]);
                CU_ASSERT_TRUE(same);
                free(want);
            }
            free(dst);
            free(w);
        }
        prism_transfer_destroy(t);
    }
}

static void test_rows_granularity_needs_blocks_that_are_whole_rows(void)
{
    const prism_quant_spec rows = {.granularity = PRISM_GRANULARITY_ROW, .group = 64};
    prism_transfer *t = make_engine(&rows, NULL, 1 << 20);
    uint16_t *w = make_weights(64 * 5 + 1, 3);
    add_ok(t, 0, w, 64 * 5);
    uint16_t dst[64 * 5];
    fetch_ok(t, 0, PRISM_PRECISION_FP8_E4M3, dst);
    uint16_t *want = reference(&rows, PRISM_PRECISION_FP8_E4M3, w, 64 * 5);
    CU_ASSERT_EQUAL(memcmp(dst, want, sizeof dst), 0);
    free(want);
    prism_error err = {0};
    CU_ASSERT_EQUAL(prism_transfer_add_block(t, 1, w, 64 * 5 + 1, &err), PRISM_ERR_INVALID);
    CU_ASSERT_EQUAL(strncmp(err.message, "block 1: quant: ", 16), 0);
    CU_ASSERT_EQUAL(prism_transfer_fetch(t, 1, PRISM_PRECISION_BF16, dst, NULL, NULL, &err),
                    PRISM_ERR_NOT_FOUND);
    free(w);
    prism_transfer_destroy(t);
}

static void test_update_block_makes_the_quantized_copy_again(void)
{
    const size_t n = 1000;
    prism_transfer *t = make_engine(NULL, NULL, n * 2);
    uint16_t *a = make_weights(n, 1), *b = make_weights(n, 2);
    add_ok(t, 4, a, n);
    prism_error err = {0};
    CU_ASSERT_EQUAL(prism_transfer_prepare(t, 4, PRISM_PRECISION_INT8, &err), PRISM_OK);
    CU_ASSERT_EQUAL(prism_transfer_prepare(t, 4, PRISM_PRECISION_INT8, &err), PRISM_OK); /* kept */
    CU_ASSERT_EQUAL(prism_transfer_prepare(t, 4, PRISM_PRECISION_BF16, &err), PRISM_OK); /* nothing */
    prism_transfer_counters c;
    prism_transfer_get_counters(t, &c);
    CU_ASSERT_EQUAL(c.prepares, 1);

    uint16_t dst[1000];
    fetch_ok(t, 4, PRISM_PRECISION_INT8, dst);
    uint16_t *want_a = reference(&default_spec, PRISM_PRECISION_INT8, a, n);
    CU_ASSERT_EQUAL(memcmp(dst, want_a, sizeof dst), 0);
    prism_transfer_get_counters(t, &c);
    CU_ASSERT_EQUAL(c.prepares, 1); /* the fetch used the prepared copy */

    CU_ASSERT_EQUAL(prism_transfer_update_block(t, 4, b, n, &err), PRISM_OK);
    fetch_ok(t, 4, PRISM_PRECISION_INT8, dst);
    uint16_t *want_b = reference(&default_spec, PRISM_PRECISION_INT8, b, n);
    CU_ASSERT_EQUAL(memcmp(dst, want_b, sizeof dst), 0);
    CU_ASSERT_NOT_EQUAL(memcmp(want_a, want_b, sizeof dst), 0);
    fetch_ok(t, 4, PRISM_PRECISION_BF16, dst);
    CU_ASSERT_EQUAL(memcmp(dst, b, sizeof dst), 0);
    fetch_ok(t, 4, PRISM_PRECISION_INT4, dst);
    fetch_ok(t, 4, PRISM_PRECISION_INT4, dst);
    prism_transfer_get_counters(t, &c);
    CU_ASSERT_EQUAL(c.prepares, 3); /* int8 before, int8 after the update, int4 once */

    /* The update is a copy: the caller's buffer is free again. */
    memset(b, 0, n * 2);
    fetch_ok(t, 4, PRISM_PRECISION_INT8, dst);
    CU_ASSERT_EQUAL(memcmp(dst, want_b, sizeof dst), 0);
    free(want_a);
    free(want_b);
    free(a);
    free(b);
    prism_transfer_destroy(t);
}

/* Wire bytes, worked by hand: 1000 elements in blocks of 128 are 8 groups (32 bytes of scales);
 * 8-bit codes 1000 bytes padded to 1008, INT4 500 bytes padded to 512. */
static void test_counters_are_exact(void)
{
    const size_t n = 1000;
    prism_transfer *t = make_engine(NULL, NULL, n * 2);
    uint16_t *w = make_weights(n, 5);
    add_ok(t, 0, w, n);
    add_ok(t, 1, w, 256);
    static const struct {
        prism_precision p;
        size_t wire0, wire1; /* blocks 0 (1000) and 1 (256: 2 groups) */
    } want[] = {
        {PRISM_PRECISION_BF16, 2000, 512},
        {PRISM_PRECISION_INT8, 1040, 264},
        {PRISM_PRECISION_FP8_E4M3, 1040, 264},
        {PRISM_PRECISION_FP8_E5M2, 1040, 264},
        {PRISM_PRECISION_INT4, 544, 136},
    };
    prism_error err = {0};
    uint16_t dst[1000];
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
        size_t bytes = 0;
        CU_ASSERT_EQUAL(prism_transfer_wire_bytes(t, 0, want[i].p, &bytes, &err), PRISM_OK);
        CU_ASSERT_EQUAL(bytes, want[i].wire0);
        CU_ASSERT_EQUAL(prism_transfer_wire_bytes(t, 1, want[i].p, &bytes, &err), PRISM_OK);
        CU_ASSERT_EQUAL(bytes, want[i].wire1);
        /* (i + 1) fetches of block 0, one of block 1 */
        for (size_t k = 0; k <= i; k++)
            fetch_ok(t, 0, want[i].p, dst);
        fetch_ok(t, 1, want[i].p, dst);
    }
    prism_transfer_counters c;
    prism_transfer_get_counters(t, &c);
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
        prism_precision p = want[i].p;
        CU_ASSERT_EQUAL(c.fetches[p], i + 2);
        CU_ASSERT_EQUAL(c.wire_bytes[p], (i + 1) * want[i].wire0 + want[i].wire1);
        CU_ASSERT_EQUAL(c.bf16_bytes[p], (i + 1) * 2000 + 512);
    }
    CU_ASSERT_EQUAL(c.prefetches, 0);
    CU_ASSERT_EQUAL(c.prepares, 8); /* 4 low formats x 2 blocks */
    CU_ASSERT_EQUAL(c.nonfinite, 0);
    CU_ASSERT_EQUAL(c.demand_waits, 0);
    CU_ASSERT_EQUAL(c.demand_over_limit, 0);
    for (int v = 0; v < PRISM_CONDUCTOR_VERDICT_COUNT; v++)
        CU_ASSERT_EQUAL(c.refused[v], 0);
    free(w);
    prism_transfer_destroy(t);
}

static void test_nonfinite_weights_are_counted_and_sent_as_code_zero(void)
{
    const size_t n = 300;
    uint16_t *w = make_weights(n, 9);
    w[3] = 0x7fc0;  /* NaN */
    w[200] = 0x7f80; /* +Inf */
    w[201] = 0xff80; /* -Inf */
    prism_transfer *t = make_engine(NULL, NULL, n * 2);
    add_ok(t, 0, w, n);
    uint16_t dst[300];
    fetch_ok(t, 0, PRISM_PRECISION_FP8_E4M3, dst);
    uint16_t *want = reference(&default_spec, PRISM_PRECISION_FP8_E4M3, w, n);
    CU_ASSERT_EQUAL(memcmp(dst, want, sizeof dst), 0);
    CU_ASSERT_EQUAL(dst[3], 0);
    CU_ASSERT_EQUAL(dst[200], 0);
    prism_transfer_counters c;
    prism_transfer_get_counters(t, &c);
    CU_ASSERT_EQUAL(c.nonfinite, 3);
    fetch_ok(t, 0, PRISM_PRECISION_BF16, dst); /* BF16 moves them as they are */
    CU_ASSERT_EQUAL(dst[3], 0x7fc0);
    free(want);
    free(w);
    prism_transfer_destroy(t);
}

static prism_transfer_ticket prefetch(prism_transfer *t, uint32_t id, uint16_t *dst, prism_conductor_phase phase,
                                      uint32_t distance, uint64_t used, uint64_t total)
{
    prism_conductor_request why = {phase, distance, used, total};
    prism_transfer_ticket tk = {99, PRISM_CONDUCTOR_ALLOW};
    prism_error err = {0};
    prism_status st = prism_transfer_prefetch(t, id, PRISM_PRECISION_INT8, dst, NULL, &why, &tk, &err);
    if (st != PRISM_OK)
        fprintf(stderr, "prefetch: %s\n", err.message);
    CU_ASSERT_EQUAL(st, PRISM_OK);
    return tk;
}

static void test_prefetch_asks_the_conductor_and_counts_refusals(void)
{
    prism_conductor *c = NULL;
    prism_error err = {0};
    CU_ASSERT_FATAL(prism_conductor_create(NULL, &c, &err) == PRISM_OK);
    prism_transfer *t = make_engine(NULL, c, 4096);
    uint16_t *w = make_weights(512, 4);
    add_ok(t, 0, w, 512);
    uint16_t dst[512];
    uint16_t *want = reference(&default_spec, PRISM_PRECISION_INT8, w, 512);

    static const struct {
        prism_conductor_phase phase;
        uint32_t distance;
        uint64_t used, total;
        prism_conductor_verdict want;
    } asks[] = {
        {PRISM_CONDUCTOR_OPTIMIZER, 1, 0, 100, PRISM_CONDUCTOR_REFUSE_OPTIMIZER},
        {PRISM_CONDUCTOR_BACKWARD, 1, 81, 100, PRISM_CONDUCTOR_REFUSE_PRESSURE},
        {PRISM_CONDUCTOR_BACKWARD, 1, 80, 100, PRISM_CONDUCTOR_ALLOW},
        {PRISM_CONDUCTOR_FORWARD, 3, 0, 100, PRISM_CONDUCTOR_REFUSE_WINDOW},
        {PRISM_CONDUCTOR_FORWARD, 0, 0, 100, PRISM_CONDUCTOR_REFUSE_WINDOW},
        {PRISM_CONDUCTOR_FORWARD, 2, 99, 100, PRISM_CONDUCTOR_ALLOW},
    };
    for (size_t i = 0; i < sizeof asks / sizeof asks[0]; i++) {
        memset(dst, 0xa5, sizeof dst);
        prism_transfer_ticket tk = prefetch(t, 0, dst, asks[i].phase, asks[i].distance, asks[i].used, asks[i].total);
        CU_ASSERT_EQUAL(tk.verdict, asks[i].want);
        if (asks[i].want == PRISM_CONDUCTOR_ALLOW) {
            CU_ASSERT(tk.seq > 0);
            CU_ASSERT_EQUAL(memcmp(dst, want, sizeof dst), 0);
        } else {
            CU_ASSERT_EQUAL(tk.seq, 0);
            CU_ASSERT_EQUAL(dst[0], 0xa5a5); /* nothing was written */
        }
        CU_ASSERT_EQUAL(prism_conductor_inflight(c, PRISM_CONDUCTOR_H2D), 0);
    }
    /* Slots: the conductor's H2D slots taken by someone else. */
    CU_ASSERT_TRUE(prism_conductor_try_acquire(c, PRISM_CONDUCTOR_H2D));
    CU_ASSERT_TRUE(prism_conductor_try_acquire(c, PRISM_CONDUCTOR_H2D));
    prism_transfer_ticket tk = prefetch(t, 0, dst, PRISM_CONDUCTOR_FORWARD, 1, 0, 0);
    CU_ASSERT_EQUAL(tk.verdict, PRISM_CONDUCTOR_REFUSE_SLOTS);
    CU_ASSERT_EQUAL(tk.seq, 0);
    /* A demand fetch still goes: it takes a slot above the limit and gives it back. */
    fetch_ok(t, 0, PRISM_PRECISION_INT8, dst);
    CU_ASSERT_EQUAL(prism_conductor_inflight(c, PRISM_CONDUCTOR_H2D), 2);
    CU_ASSERT_EQUAL(prism_conductor_release(c, PRISM_CONDUCTOR_H2D, &err), PRISM_OK);
    CU_ASSERT_EQUAL(prism_conductor_release(c, PRISM_CONDUCTOR_H2D, &err), PRISM_OK);
    fetch_ok(t, 0, PRISM_PRECISION_INT8, dst); /* within the limit now */

    /* A tightened limit applies to the very next prefetch; demand fetches go one at a time. */
    prism_conductor_limits l = prism_conductor_default_limits();
    l.max_inflight_h2d = 0;
    CU_ASSERT_EQUAL(prism_conductor_set_limits(c, &l, &err), PRISM_OK);
    tk = prefetch(t, 0, dst, PRISM_CONDUCTOR_FORWARD, 1, 0, 0);
    CU_ASSERT_EQUAL(tk.verdict, PRISM_CONDUCTOR_REFUSE_SLOTS);
    fetch_ok(t, 0, PRISM_PRECISION_BF16, dst);
    CU_ASSERT_EQUAL(prism_conductor_inflight(c, PRISM_CONDUCTOR_H2D), 0);

    prism_transfer_counters n;
    prism_transfer_get_counters(t, &n);
    CU_ASSERT_EQUAL(n.refused[PRISM_CONDUCTOR_ALLOW], 0);
    CU_ASSERT_EQUAL(n.refused[PRISM_CONDUCTOR_REFUSE_OPTIMIZER], 1);
    CU_ASSERT_EQUAL(n.refused[PRISM_CONDUCTOR_REFUSE_PRESSURE], 1);
    CU_ASSERT_EQUAL(n.refused[PRISM_CONDUCTOR_REFUSE_WINDOW], 2);
    CU_ASSERT_EQUAL(n.refused[PRISM_CONDUCTOR_REFUSE_SLOTS], 2);
    CU_ASSERT_EQUAL(n.prefetches, 2);
    CU_ASSERT_EQUAL(n.fetches[PRISM_PRECISION_INT8], 4); /* 2 prefetches + 2 demand */
    CU_ASSERT_EQUAL(n.fetches[PRISM_PRECISION_BF16], 1);
    CU_ASSERT_EQUAL(n.demand_over_limit, 2); /* slots held elsewhere; then a limit of 0 */
    CU_ASSERT_EQUAL(n.demand_waits, 0);       /* the CPU never has a copy of its own in flight */
    CU_ASSERT_EQUAL(n.prepares, 1);

    prism_transfer_destroy(t);
    prism_conductor_destroy(c);
    free(want);
    free(w);
}

static void test_without_a_conductor_every_prefetch_in_the_window_starts(void)
{
    prism_transfer *t = make_engine(NULL, NULL, 4096);
    uint16_t *w = make_weights(512, 4);
    add_ok(t, 0, w, 512);
    uint16_t dst[512];
    prism_transfer_ticket tk = prefetch(t, 0, dst, PRISM_CONDUCTOR_OPTIMIZER, 40, 100, 100);
    CU_ASSERT_EQUAL(tk.verdict, PRISM_CONDUCTOR_ALLOW);
    CU_ASSERT(tk.seq > 0);
    tk = prefetch(t, 0, dst, PRISM_CONDUCTOR_FORWARD, 0, 0, 0);
    CU_ASSERT_EQUAL(tk.verdict, PRISM_CONDUCTOR_REFUSE_WINDOW);
    CU_ASSERT_EQUAL(tk.seq, 0);
    prism_transfer_counters n;
    prism_transfer_get_counters(t, &n);
    CU_ASSERT_EQUAL(n.prefetches, 1);
    CU_ASSERT_EQUAL(n.refused[PRISM_CONDUCTOR_REFUSE_WINDOW], 1);
    free(w);
    prism_transfer_destroy(t);
}

static void test_cpu_tickets_are_complete_when_the_call_returns(void)
{
    prism_transfer *t = make_engine(NULL, NULL, 4096);
    uint16_t *w = make_weights(100, 4);
    add_ok(t, 0, w, 100);
    uint16_t dst[100];
    prism_error err = {0};
    prism_transfer_ticket tk;
    CU_ASSERT_EQUAL(prism_transfer_fetch(t, 0, PRISM_PRECISION_INT4, dst, NULL, &tk, &err), PRISM_OK);
    CU_ASSERT_EQUAL(tk.seq, 1);
    bool done = false;
    CU_ASSERT_EQUAL(prism_transfer_ticket_query(t, &tk, &done, &err), PRISM_OK);
    CU_ASSERT_TRUE(done);
    CU_ASSERT_EQUAL(prism_transfer_ticket_wait(t, &tk, &err), PRISM_OK);
    CU_ASSERT_EQUAL(prism_transfer_ticket_wait_stream(t, &tk, NULL, &err), PRISM_OK);
    prism_transfer_ticket refused = {0, PRISM_CONDUCTOR_REFUSE_WINDOW};
    done = false;
    CU_ASSERT_EQUAL(prism_transfer_ticket_query(t, &refused, &done, &err), PRISM_OK);
    CU_ASSERT_TRUE(done);
    prism_transfer_ticket bogus = {2, PRISM_CONDUCTOR_ALLOW};
    CU_ASSERT_EQUAL(prism_transfer_ticket_wait(t, &bogus, &err), PRISM_ERR_INVALID);
    CU_ASSERT_STRING_EQUAL(err.message, "ticket: 2 was not issued by this engine");
    CU_ASSERT_EQUAL(prism_transfer_synchronize(t, &err), PRISM_OK);
    CU_ASSERT_STRING_EQUAL(prism_transfer_backend_name(t), "cpu");
    free(w);
    prism_transfer_destroy(t);
}

static void expect_error(prism_status got, prism_status want, const prism_error *err, const char *message)
{
    CU_ASSERT_EQUAL(got, want);
    if (strcmp(err->message, message) != 0)
        fprintf(stderr, "message: got \"%s\", want \"%s\"\n", err->message, message);
    CU_ASSERT_STRING_EQUAL(err->message, message);
}

static void test_bad_arguments_are_refused_naming_the_argument(void)
{
    prism_transfer *t = make_engine(NULL, NULL, 200);
    uint16_t *w = make_weights(101, 4);
    uint16_t dst[101];
    prism_error err = {0};
    add_ok(t, 0, w, 100);
    expect_error(prism_transfer_add_block(t, 1, w, 101, &err), PRISM_ERR_LIMIT, &err,
                 "numel: block 1 has 101 elements (202 bytes of BF16), above max_block_bytes 200");
    expect_error(prism_transfer_add_block(t, 0, w, 10, &err), PRISM_ERR_STATE, &err,
                 "block_id: block 0 is already registered");
    expect_error(prism_transfer_add_block(t, 2, w, 0, &err), PRISM_ERR_INVALID, &err,
                 "numel: block 2 has no elements");
    expect_error(prism_transfer_add_block(t, 2, NULL, 10, &err), PRISM_ERR_INVALID, &err,
                 "bf16: NULL for block 2");
    expect_error(prism_transfer_add_block(t, PRISM_TRANSFER_MAX_BLOCKS, w, 10, &err), PRISM_ERR_INVALID, &err,
                 "block_id: 1048576 is above the limit 1048575");
    expect_error(prism_transfer_fetch(t, 9, PRISM_PRECISION_INT8, dst, NULL, NULL, &err), PRISM_ERR_NOT_FOUND,
                 &err, "block_id: block 9 is not registered");
    expect_error(prism_transfer_fetch(t, 0, (prism_precision)5, dst, NULL, NULL, &err), PRISM_ERR_INVALID, &err,
                 "precision: 5 is not bf16, int8, fp8_e4m3, fp8_e5m2 or int4");
    expect_error(prism_transfer_fetch(t, 0, PRISM_PRECISION_INT8, NULL, NULL, NULL, &err), PRISM_ERR_INVALID,
                 &err, "dst: NULL");
    expect_error(prism_transfer_prefetch(t, 0, PRISM_PRECISION_INT8, dst, NULL, NULL, NULL, &err),
                 PRISM_ERR_INVALID, &err, "why: NULL (a prefetch says its phase and distance)");
    prism_conductor_request why = {(prism_conductor_phase)3, 1, 0, 0};
    expect_error(prism_transfer_prefetch(t, 0, PRISM_PRECISION_INT8, dst, NULL, &why, NULL, &err),
                 PRISM_ERR_INVALID, &err, "phase: 3 is not forward, backward or optimizer");
    expect_error(prism_transfer_prepare(t, 9, PRISM_PRECISION_INT8, &err), PRISM_ERR_NOT_FOUND, &err,
                 "block_id: block 9 is not registered");
    expect_error(prism_transfer_prepare(t, 0, (prism_precision)-1, &err), PRISM_ERR_INVALID, &err,
                 "precision: -1 is not bf16, int8, fp8_e4m3, fp8_e5m2 or int4");
    expect_error(prism_transfer_update_block(t, 0, w, 101, &err), PRISM_ERR_INVALID, &err,
                 "numel: block 0 has 100 elements, not 101");
    expect_error(prism_transfer_update_block(t, 3, w, 100, &err), PRISM_ERR_NOT_FOUND, &err,
                 "block_id: block 3 is not registered");
    size_t bytes;
    expect_error(prism_transfer_wire_bytes(t, 0, (prism_precision)7, &bytes, &err), PRISM_ERR_INVALID, &err,
                 "precision: 7 is not bf16, int8, fp8_e4m3, fp8_e5m2 or int4");
    prism_transfer_counters c;
    prism_transfer_get_counters(t, &c);
    for (int p = 0; p < PRISM_PRECISION_COUNT; p++)
        CU_ASSERT_EQUAL(c.fetches[p], 0);
    free(w);
    prism_transfer_destroy(t);
}

static void test_bad_options_are_refused_naming_the_option(void)
{
    prism_transfer *t = NULL;
    prism_error err = {0};
    prism_transfer_options o = {.backend = PRISM_TRANSFER_CPU, .max_block_bytes = 1024};
    o.backend = (prism_transfer_backend)7;
    expect_error(prism_transfer_create(&o, &t, &err), PRISM_ERR_INVALID, &err,
                 "backend: 7 is not cpu (0) or cuda (1)");
    o.backend = PRISM_TRANSFER_CPU;
    o.staging_buffers = 9;
    expect_error(prism_transfer_create(&o, &t, &err), PRISM_ERR_INVALID, &err, "staging_buffers: 9 is above 8");
    o.staging_buffers = 0;
    o.max_block_bytes = 1;
    expect_error(prism_transfer_create(&o, &t, &err), PRISM_ERR_INVALID, &err,
                 "max_block_bytes: 1 is less than one BF16 element");
    o.max_block_bytes = 1024;
    prism_quant_spec bad = {.granularity = (prism_granularity)9};
    o.quant = &bad;
    CU_ASSERT_EQUAL(prism_transfer_create(&o, &t, &err), PRISM_ERR_INVALID);
    CU_ASSERT_EQUAL(strncmp(err.message, "quant: ", 7), 0);
    CU_ASSERT_PTR_NULL(t);
    expect_error(prism_transfer_create(NULL, &t, &err), PRISM_ERR_INVALID, &err, "options: NULL");

    /* CUDA: there in a build with CUDA and a device; otherwise UNAVAILABLE, never a crash. */
    o.quant = NULL;
    o.backend = PRISM_TRANSFER_CUDA;
    prism_status st = prism_transfer_create(&o, &t, &err);
    if (st == PRISM_OK) {
        CU_ASSERT_STRING_EQUAL(prism_transfer_backend_name(t), "cuda");
        prism_transfer_destroy(t);
    } else {
        CU_ASSERT_EQUAL(st, PRISM_ERR_UNAVAILABLE);
        CU_ASSERT_PTR_NULL(t);
        printf("(cuda backend: %s) ", err.message);
    }
}

static const prism_test_case cases[] = {
    {"test_bf16_fetch_is_the_source_byte_for_byte", test_bf16_fetch_is_the_source_byte_for_byte},
    {"test_each_low_precision_fetch_is_quantize_then_dequantize",
     test_each_low_precision_fetch_is_quantize_then_dequantize},
    {"test_rows_granularity_needs_blocks_that_are_whole_rows", test_rows_granularity_needs_blocks_that_are_whole_rows},
    {"test_update_block_makes_the_quantized_copy_again", test_update_block_makes_the_quantized_copy_again},
    {"test_counters_are_exact", test_counters_are_exact},
    {"test_nonfinite_weights_are_counted_and_sent_as_code_zero",
     test_nonfinite_weights_are_counted_and_sent_as_code_zero},
    {"test_prefetch_asks_the_conductor_and_counts_refusals", test_prefetch_asks_the_conductor_and_counts_refusals},
    {"test_without_a_conductor_every_prefetch_in_the_window_starts",
     test_without_a_conductor_every_prefetch_in_the_window_starts},
    {"test_cpu_tickets_are_complete_when_the_call_returns", test_cpu_tickets_are_complete_when_the_call_returns},
    {"test_bad_arguments_are_refused_naming_the_argument", test_bad_arguments_are_refused_naming_the_argument},
    {"test_bad_options_are_refused_naming_the_option", test_bad_options_are_refused_naming_the_option},
    {NULL, NULL},
};

static const prism_test_suite suites[] = {{"transfer", cases}, {NULL, NULL}};

int main(int argc, char **argv)
{
    return prism_test_main(argc, argv, suites);
}
