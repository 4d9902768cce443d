/* The transfer engine's scale modes (include/prism/transfer.h, prism_transfer_scale_mode), CPU
 * backend: each mode's fetched block is bit for bit what the kernels give with scales worked out
 * here independently (CURRENT and POW2: prism_quantize_counted_cpu; STATIC: the scales of the
 * weights as registered, whatever came after; DELAYED: prism_quant_scale_delayed over the max of
 * exactly the last N prepared versions' amax, one history per block whatever the formats,
 * computed here from the BF16 weights); each prepare's counts
 * are the kernel's; the counters sum them; prism_transfer_set_scale_mode starts histories afresh
 * and keeps the static scales; bad values are refused naming the field. */
#include "testutil.h"

#include "prism/transfer.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const prism_precision low_formats[] = {PRISM_PRECISION_INT8, PRISM_PRECISION_FP8_E4M3,
                                              PRISM_PRECISION_FP8_E5M2, PRISM_PRECISION_INT4};
#define N_LOW (sizeof low_formats / sizeof low_formats[0])
#define GROUP 128

/* n BF16 weights of varied magnitude per 100 elements, runs of zeros, times 2^shift (exact). */
static uint16_t *make_weights(size_t n, uint32_t seed, int shift)
{
    uint16_t *w = malloc(n * sizeof *w);
    CU_ASSERT_FATAL(w != NULL);
    uint32_t s = seed * 2654435761u + 1;
    for (size_t i = 0; i < n; i++) {
        s = s * 1664525u + 1013904223u;
        float u = (float)(s >> 8) / 16777216.0f - 0.5f;
        float mag = ldexpf(1.0f, (int)((i / 100) % 24) - 16 + shift);
        w[i] = prism_f32_to_bf16((i / 50) % 7 == 3 ? 0.0f : u * mag);
    }
    return w;
}

static prism_transfer *make_engine(prism_transfer_scale_mode mode, uint32_t hist_len, int32_t margin, size_t n)
{
    prism_quant_spec q = {.granularity = PRISM_GRANULARITY_BLOCK, .group = GROUP};
    prism_transfer_options o = {.backend = PRISM_TRANSFER_CPU, .max_block_bytes = 2 * n, .quant = &q,
                                .scale_mode = mode, .amax_history_len = hist_len, .scale_margin = margin};
    prism_transfer *t = NULL;
    prism_error err = {0};
    prism_status st = prism_transfer_create(&o, &t, &err);
    if (st != PRISM_OK)
        fprintf(stderr, "create: %s\n", err.message);
    CU_ASSERT_FATAL(st == PRISM_OK && t != NULL);
    return t;
}

static void ok(prism_status st, const prism_error *err, const char *what)
{
    if (st != PRISM_OK)
        fprintf(stderr, "%s: %s\n", what, err->message);
    CU_ASSERT_FATAL(st == PRISM_OK);
}

static void fetch_ok(prism_transfer *t, uint32_t id, prism_precision p, uint16_t *dst)
{
    prism_error err = {0};
    prism_transfer_ticket tk;
    ok(prism_transfer_fetch(t, id, p, dst, NULL, &tk, &err), &err, "fetch");
}

static size_t groups_of(prism_precision p, size_t n)
{
    prism_quant_spec spec = {.format = p, .granularity = PRISM_GRANULARITY_BLOCK, .group = GROUP};
    size_t groups = 0;
    prism_error err = {0};
    CU_ASSERT_FATAL(prism_quant_layout(&spec, n, &groups, NULL, NULL, &err) == PRISM_OK);
    return groups;
}

/* The reference block: w quantized in format p (with `scales` given: prism_quantize_scaled_cpu;
 * NULL: prism_quantize_counted_cpu under scale_mode, its scales copied to scales_out when not
 * NULL), then dequantized to BF16. *counts gets the kernel's counts. */
static uint16_t *reference(prism_precision p, prism_scale_mode scale_mode, const uint16_t *w, size_t n,
                           const float *scales, float *scales_out, prism_quant_counts *counts)
{
    prism_quant_spec spec = {.format = p, .granularity = PRISM_GRANULARITY_BLOCK, .group = GROUP,
                             .scale_mode = scale_mode};
    size_t groups = 0, code_bytes = 0;
    prism_error err = {0};
    CU_ASSERT_FATAL(prism_quant_layout(&spec, n, &groups, NULL, &code_bytes, &err) == PRISM_OK);
    uint8_t *codes = malloc(code_bytes);
    float *s = malloc(groups * sizeof *s);
    uint16_t *out = malloc(n * sizeof *out);
    CU_ASSERT_FATAL(codes && s && out);
    prism_tensor x = {w, n, PRISM_DTYPE_BF16};
    if (scales) {
        memcpy(s, scales, groups * sizeof *s);
        ok(prism_quantize_scaled_cpu(&spec, &x, s, codes, NULL, counts, &err), &err, "quantize_scaled");
    } else {
        ok(prism_quantize_counted_cpu(&spec, &x, codes, s, counts, &err), &err, "quantize_counted");
        if (scales_out)
            memcpy(scales_out, s, groups * sizeof *s);
    }
    ok(prism_dequantize_cpu(&spec, codes, s, n, out, PRISM_DTYPE_BF16, &err), &err, "dequantize");
    free(codes);
    free(s);
    return out;
}

/* The block's last counts are the expected ones, over all n elements. */
static void expect_counts(prism_transfer *t, uint32_t id, prism_precision p, const prism_quant_counts *want,
                          size_t n)
{
    prism_quant_counts got = {99, 99, 99, 99};
    size_t numel = 1;
    prism_error err = {0};
    ok(prism_transfer_block_counts(t, id, p, &got, &numel, &err), &err, "block_counts");
    CU_ASSERT_EQUAL(numel, n);
    CU_ASSERT_EQUAL(got.saturated, want->saturated);
    CU_ASSERT_EQUAL(got.underflowed, want->underflowed);
    CU_ASSERT_EQUAL(got.nonfinite, want->nonfinite);
}

/* Per group of GROUP elements, the largest |x| (by hand, from the BF16 values). */
static void amax_by_hand(const uint16_t *w, size_t n, float *amax)
{
    for (size_t g = 0; g * GROUP < n; g++) {
        float m = 0.0f;
        for (size_t i = g * GROUP; i < n && i < (g + 1) * GROUP; i++) {
            float v = fabsf(prism_bf16_to_f32(w[i]));
            if (v > m)
                m = v;
        }
        amax[g] = m;
    }
}

static void test_current_and_pow2_are_the_counted_kernel(void)
{
    const size_t n = 5000; /* the last group short */
    uint16_t *w = make_weights(n, 3, 0);
    uint16_t *dst = malloc(n * sizeof *dst);
    CU_ASSERT_FATAL(dst != NULL);
    for (int m = 0; m < 2; m++) {
        prism_transfer_scale_mode mode = m ? PRISM_TRANSFER_SCALE_POW2 : PRISM_TRANSFER_SCALE_CURRENT;
        prism_transfer *t = make_engine(mode, 0, 0, n);
        prism_error err = {0};
        ok(prism_transfer_add_block(t, 7, w, n, &err), &err, "add");
        for (size_t f = 0; f < N_LOW; f++) {
            prism_quant_counts want = {0};
            uint16_t *ref = reference(low_formats[f], m ? PRISM_SCALE_POW2 : PRISM_SCALE_FP32, w, n, NULL, NULL,
                                      &want);
            fetch_ok(t, 7, low_formats[f], dst);
            CU_ASSERT(memcmp(dst, ref, n * sizeof *dst) == 0);
            expect_counts(t, 7, low_formats[f], &want, n);
            free(ref);
        }
        prism_transfer_destroy(t);
    }
    free(w);
    free(dst);
}

/* STATIC: the scales of the weights as registered, even when the block was updated before its
 * first prepare. Registered w0, updated to w1 (4x) before the first fetch: w1 under w0's scales
 * saturates, and the counts say so (the kernel's, and not 0); back to w0: w0's own current
 * quantization. Registered w1, updated to w0 first: w0 under w1's scales, nothing saturated. */
static void test_static_takes_the_scales_of_the_registered_weights(void)
{
    const size_t n = 4096;
    uint16_t *w[2] = {make_weights(n, 5, 0), make_weights(n, 5, 2)}; /* w[1]: the same values times 4 */
    uint16_t *dst = malloc(n * sizeof *dst);
    CU_ASSERT_FATAL(dst != NULL);
    for (size_t f = 0; f < N_LOW; f++) {
        prism_precision p = low_formats[f];
        for (int r = 0; r < 2; r++) {
            const uint16_t *reg = w[r], *other = w[1 - r];
            prism_transfer *t = make_engine(PRISM_TRANSFER_SCALE_STATIC, 0, 0, n);
            prism_error err = {0};
            ok(prism_transfer_add_block(t, 0, reg, n, &err), &err, "add");
            float *s = malloc(groups_of(p, n) * sizeof *s);
            CU_ASSERT_FATAL(s != NULL);
            prism_quant_counts own = {0}, want = {0};
            uint16_t *own_ref = reference(p, PRISM_SCALE_FP32, reg, n, NULL, s, &own);
            ok(prism_transfer_update_block(t, 0, other, n, &err), &err, "update before the first fetch");
            uint16_t *ref = reference(p, PRISM_SCALE_FP32, other, n, s, NULL, &want);
            if (r == 0) {
                CU_ASSERT(want.saturated > 0);
            } else {
                CU_ASSERT_EQUAL(want.saturated, 0);
            }
            fetch_ok(t, 0, p, dst);
            CU_ASSERT(memcmp(dst, ref, n * sizeof *dst) == 0);
            expect_counts(t, 0, p, &want, n);
            ok(prism_transfer_update_block(t, 0, reg, n, &err), &err, "update back");
            fetch_ok(t, 0, p, dst);
            CU_ASSERT(memcmp(dst, own_ref, n * sizeof *dst) == 0);
            expect_counts(t, 0, p, &own, n);
            free(ref);
            free(own_ref);
            free(s);
            prism_transfer_destroy(t);
        }
    }
    free(w[0]);
    free(w[1]);
    free(dst);
}

/* DELAYED with a history of 3 and margin `margin`: weights scaled by 2^shift[k] at prepare k. The
 * scales of prepare k are scale_delayed(max of the amax of prepares k-3 .. k-1) (prepare 0: its
 * own amax); the large prepare 0 leaves the window at prepare 4, so prepares 3 and 4 of the same
 * weights differ. */
static void delayed_case(int32_t margin)
{
    const size_t n = 3000;
    static const int shift[] = {3, 0, 0, 0, 0, 0, 1, -2};
    const size_t steps = sizeof shift / sizeof shift[0];
    const uint32_t hist_len = 3;
    uint16_t *dst = malloc(n * sizeof *dst);
    uint16_t *prev = malloc(n * sizeof *prev);
    CU_ASSERT_FATAL(dst && prev);
    for (size_t f = 0; f < N_LOW; f++) {
        prism_precision p = low_formats[f];
        size_t groups = groups_of(p, n);
        float *amax = malloc(steps * groups * sizeof *amax);
        float *scales = malloc(groups * sizeof *scales);
        CU_ASSERT_FATAL(amax && scales);
        prism_transfer *t = make_engine(PRISM_TRANSFER_SCALE_DELAYED, hist_len, margin, n);
        prism_error err = {0};
        for (size_t k = 0; k < steps; k++) {
            /* Prepare 0 other values (8x larger): their amax is no power of two times the
             * others', so its leaving the history shows in every format, FP8 too. */
            uint16_t *w = make_weights(n, k == 0 ? 12 : 11, shift[k]);
            amax_by_hand(w, n, amax + k * groups);
            for (size_t g = 0; g < groups; g++) {
                float m = 0.0f;
                size_t from = k == 0 ? 0 : (k > hist_len ? k - hist_len : 0), to = k == 0 ? 1 : k;
                for (size_t h = from; h < to; h++)
                    m = fmaxf(m, amax[h * groups + g]);
                scales[g] = prism_quant_scale_delayed(m, margin, p);
            }
            if (k == 0)
                ok(prism_transfer_add_block(t, 1, w, n, &err), &err, "add");
            else
                ok(prism_transfer_update_block(t, 1, w, n, &err), &err, "update");
            prism_quant_counts want = {0};
            uint16_t *ref = reference(p, PRISM_SCALE_FP32, w, n, scales, NULL, &want);
            fetch_ok(t, 1, p, dst);
            if (memcmp(dst, ref, n * sizeof *dst) != 0)
                fprintf(stderr, "delayed %s margin %d: prepare %zu differs\n", prism_precision_name(p), (int)margin, k);
            CU_ASSERT(memcmp(dst, ref, n * sizeof *dst) == 0);
            expect_counts(t, 1, p, &want, n);
            if (k == 4) /* the same weights as prepare 3, but the 8x amax has left the history */
                CU_ASSERT(memcmp(dst, prev, n * sizeof *dst) != 0);
            memcpy(prev, dst, n * sizeof *dst);
            free(ref);
            free(w);
        }
        prism_transfer_destroy(t);
        free(amax);
        free(scales);
    }
    free(dst);
    free(prev);
}

static void test_delayed_uses_the_max_of_exactly_the_last_n_prepares(void)
{
    delayed_case(0);
    delayed_case(1);
    delayed_case(-2);
}

/* DELAYED keeps one history per block, whatever the formats fetched, of the versions that were
 * prepared: history 2, margin 0. v0 in int8 and fp8: its own amax; v1 in fp8 and int8: max(v0);
 * v2 never fetched; v3 in int4: max(v0, v1); v4 in int8: max(v1, v3) (v2 never entered, v0 left). */
static void test_delayed_history_is_the_blocks_prepared_versions(void)
{
    const size_t n = 1000;
    const size_t groups = groups_of(PRISM_PRECISION_INT8, n);
    static const struct {
        int version;
        prism_precision p;
        int from[2]; /* the versions whose amax max gives the scales; -1: none */
    } fetches[] = {
        {0, PRISM_PRECISION_INT8, {0, -1}},     {0, PRISM_PRECISION_FP8_E4M3, {0, -1}},
        {1, PRISM_PRECISION_FP8_E4M3, {0, -1}}, {1, PRISM_PRECISION_INT8, {0, -1}},
        {3, PRISM_PRECISION_INT4, {0, 1}},      {4, PRISM_PRECISION_INT8, {1, 3}},
    };
    uint16_t *w[5];
    float *amax = malloc(5 * groups * sizeof *amax), *scales = malloc(groups * sizeof *scales);
    uint16_t *dst = malloc(n * sizeof *dst);
    CU_ASSERT_FATAL(amax && scales && dst);
    for (int v = 0; v < 5; v++) {
        w[v] = make_weights(n, 40 + (uint32_t)v, v % 3);
        amax_by_hand(w[v], n, amax + (size_t)v * groups);
    }
    prism_transfer *t = make_engine(PRISM_TRANSFER_SCALE_DELAYED, 2, 0, n);
    prism_error err = {0};
    ok(prism_transfer_add_block(t, 2, w[0], n, &err), &err, "add");
    int version = 0;
    for (size_t i = 0; i < sizeof fetches / sizeof fetches[0]; i++) {
        while (version < fetches[i].version) {
            version++;
            ok(prism_transfer_update_block(t, 2, w[version], n, &err), &err, "update");
        }
        for (size_t g = 0; g < groups; g++) {
            float m = 0.0f;
            for (int h = 0; h < 2; h++)
                if (fetches[i].from[h] >= 0)
                    m = fmaxf(m, amax[(size_t)fetches[i].from[h] * groups + g]);
            scales[g] = prism_quant_scale_delayed(m, 0, fetches[i].p);
        }
        prism_quant_counts want = {0};
        uint16_t *ref = reference(fetches[i].p, PRISM_SCALE_FP32, w[version], n, scales, NULL, &want);
        fetch_ok(t, 2, fetches[i].p, dst);
        if (memcmp(dst, ref, n * sizeof *dst) != 0)
            fprintf(stderr, "delayed history: fetch %zu differs\n", i);
        CU_ASSERT(memcmp(dst, ref, n * sizeof *dst) == 0);
        expect_counts(t, 2, fetches[i].p, &want, n);
        free(ref);
    }
    prism_transfer_destroy(t);
    for (int v = 0; v < 5; v++)
        free(w[v]);
    free(amax);
    free(scales);
    free(dst);
}

/* With margin 0 the first delayed prepare is the CURRENT image. */
static void test_delayed_first_prepare_is_current_with_margin_zero(void)
{
    const size_t n = 1000;
    uint16_t *w = make_weights(n, 17, 0);
    uint16_t *dst = malloc(n * sizeof *dst);
    CU_ASSERT_FATAL(dst != NULL);
    prism_transfer *t = make_engine(PRISM_TRANSFER_SCALE_DELAYED, 0, 0, n);
    prism_error err = {0};
    ok(prism_transfer_add_block(t, 2, w, n, &err), &err, "add");
    for (size_t f = 0; f < N_LOW; f++) {
        prism_quant_counts want = {0};
        uint16_t *ref = reference(low_formats[f], PRISM_SCALE_FP32, w, n, NULL, NULL, &want);
        fetch_ok(t, 2, low_formats[f], dst);
        CU_ASSERT(memcmp(dst, ref, n * sizeof *dst) == 0);
        expect_counts(t, 2, low_formats[f], &want, n);
        free(ref);
    }
    prism_transfer_destroy(t);
    free(w);
    free(dst);
}

/* set_scale_mode: the same mode changes nothing; another mode clears the counts, and back to
 * STATIC the scales are still those of the weights as registered. */
static void test_set_scale_mode_starts_afresh(void)
{
    const size_t n = 2048;
    const prism_precision p = PRISM_PRECISION_INT8;
    uint16_t *w0 = make_weights(n, 23, 0);
    uint16_t *w1 = make_weights(n, 23, 3);
    uint16_t *dst = malloc(n * sizeof *dst);
    float *s0 = malloc(groups_of(p, n) * sizeof *s0);
    CU_ASSERT_FATAL(dst && s0);
    prism_transfer *t = make_engine(PRISM_TRANSFER_SCALE_STATIC, 0, 0, n);
    prism_error err = {0};
    ok(prism_transfer_add_block(t, 4, w0, n, &err), &err, "add");
    prism_quant_counts want = {0};
    free(reference(p, PRISM_SCALE_FP32, w0, n, NULL, s0, &want));
    fetch_ok(t, 4, p, dst);
    ok(prism_transfer_update_block(t, 4, w1, n, &err), &err, "update");
    ok(prism_transfer_set_scale_mode(t, PRISM_TRANSFER_SCALE_STATIC, 16, 0, &err), &err, "same mode");
    uint16_t *ref = reference(p, PRISM_SCALE_FP32, w1, n, s0, NULL, &want);
    fetch_ok(t, 4, p, dst);
    CU_ASSERT(memcmp(dst, ref, n * sizeof *dst) == 0);
    free(ref);

    ok(prism_transfer_set_scale_mode(t, PRISM_TRANSFER_SCALE_DELAYED, 4, 0, &err), &err, "delayed");
    prism_quant_counts got = {1, 1, 1, 1};
    size_t numel = 1;
    ok(prism_transfer_block_counts(t, 4, p, &got, &numel, &err), &err, "block_counts");
    CU_ASSERT_EQUAL(numel, 0);
    CU_ASSERT_EQUAL(got.saturated + got.underflowed + got.nonfinite, 0);
    ok(prism_transfer_set_scale_mode(t, PRISM_TRANSFER_SCALE_STATIC, 0, 0, &err), &err, "static again");
    ref = reference(p, PRISM_SCALE_FP32, w1, n, s0, NULL, &want);
    fetch_ok(t, 4, p, dst);
    CU_ASSERT(memcmp(dst, ref, n * sizeof *dst) == 0);
    expect_counts(t, 4, p, &want, n);
    free(ref);
    prism_transfer_destroy(t);
    free(w0);
    free(w1);
    free(dst);
    free(s0);
}

/* The counters: elements quantized and the counts, summed per precision over the prepares only
 * (a second fetch of a made image adds nothing). */
static void test_counters_sum_the_prepares(void)
{
    const size_t n = 1500;
    uint16_t *w0 = make_weights(n, 29, 0);
    uint16_t *w1 = make_weights(n, 29, 2);
    uint16_t *dst = malloc(n * sizeof *dst);
    float *s0 = malloc(groups_of(PRISM_PRECISION_INT4, n) * sizeof *s0);
    CU_ASSERT_FATAL(dst && s0);
    prism_transfer *t = make_engine(PRISM_TRANSFER_SCALE_STATIC, 0, 0, n);
    prism_error err = {0};
    ok(prism_transfer_add_block(t, 0, w0, n, &err), &err, "add");
    prism_quant_counts a = {0}, b = {0};
    free(reference(PRISM_PRECISION_INT4, PRISM_SCALE_FP32, w0, n, NULL, s0, &a));
    free(reference(PRISM_PRECISION_INT4, PRISM_SCALE_FP32, w1, n, s0, NULL, &b));
    fetch_ok(t, 0, PRISM_PRECISION_INT4, dst);
    fetch_ok(t, 0, PRISM_PRECISION_INT4, dst);
    ok(prism_transfer_update_block(t, 0, w1, n, &err), &err, "update");
    ok(prism_transfer_prepare(t, 0, PRISM_PRECISION_INT4, &err), &err, "prepare");
    fetch_ok(t, 0, PRISM_PRECISION_INT4, dst);
    fetch_ok(t, 0, PRISM_PRECISION_BF16, dst);
    prism_transfer_counters c;
    prism_transfer_get_counters(t, &c);
    CU_ASSERT_EQUAL(c.prepares, 2);
    CU_ASSERT_EQUAL(c.quantized[PRISM_PRECISION_INT4], 2 * n);
    CU_ASSERT_EQUAL(c.saturated[PRISM_PRECISION_INT4], a.saturated + b.saturated);
    CU_ASSERT_EQUAL(c.underflowed[PRISM_PRECISION_INT4], a.underflowed + b.underflowed);
    CU_ASSERT(b.saturated > 0);
    for (int p = 0; p < PRISM_PRECISION_COUNT; p++)
        if (p != PRISM_PRECISION_INT4)
            CU_ASSERT_EQUAL(c.quantized[p] + c.saturated[p] + c.underflowed[p], 0);
    prism_transfer_destroy(t);
    free(w0);
    free(w1);
    free(dst);
    free(s0);
}

static void expect_invalid(prism_status st, const prism_error *err, const char *field)
{
    CU_ASSERT_EQUAL(st, PRISM_ERR_INVALID);
    if (!strstr(err->message, field))
        fprintf(stderr, "expected '%s' in: %s\n", field, err->message);
    CU_ASSERT_PTR_NOT_NULL(strstr(err->message, field));
}

static void test_bad_scale_values_are_refused_naming_the_field(void)
{
    prism_transfer_options o = {.backend = PRISM_TRANSFER_CPU, .max_block_bytes = 256};
    prism_transfer *t = NULL;
    prism_error err = {0};
    o.scale_mode = (prism_transfer_scale_mode)4;
    expect_invalid(prism_transfer_create(&o, &t, &err), &err, "scale_mode");
    o.scale_mode = PRISM_TRANSFER_SCALE_DELAYED;
    o.amax_history_len = 1025;
    expect_invalid(prism_transfer_create(&o, &t, &err), &err, "amax_history_len");
    o.amax_history_len = 1024;
    o.scale_margin = -33;
    expect_invalid(prism_transfer_create(&o, &t, &err), &err, "scale_margin");
    CU_ASSERT_PTR_NULL(t);
    o.scale_margin = 32;
    ok(prism_transfer_create(&o, &t, &err), &err, "create");
    expect_invalid(prism_transfer_set_scale_mode(t, (prism_transfer_scale_mode)9, 0, 0, &err), &err, "scale_mode");
    expect_invalid(prism_transfer_set_scale_mode(t, PRISM_TRANSFER_SCALE_POW2, 2000, 0, &err), &err,
                   "amax_history_len");
    expect_invalid(prism_transfer_set_scale_mode(t, PRISM_TRANSFER_SCALE_POW2, 0, 40, &err), &err, "scale_margin");
    uint16_t w[4] = {0x3f80, 0, 0, 0};
    ok(prism_transfer_add_block(t, 0, w, 4, &err), &err, "add");
    prism_quant_counts c;
    size_t numel;
    expect_invalid(prism_transfer_block_counts(t, 0, PRISM_PRECISION_BF16, &c, &numel, &err), &err, "precision");
    CU_ASSERT_EQUAL(prism_transfer_block_counts(t, 1, PRISM_PRECISION_INT8, &c, &numel, &err), PRISM_ERR_NOT_FOUND);
    CU_ASSERT_STRING_EQUAL(prism_transfer_scale_mode_name(PRISM_TRANSFER_SCALE_DELAYED), "delayed");
    CU_ASSERT_STRING_EQUAL(prism_transfer_scale_mode_name((prism_transfer_scale_mode)7), "?");
    prism_transfer_destroy(t);
}

static const prism_test_case cases[] = {
    {"test_current_and_pow2_are_the_counted_kernel", test_current_and_pow2_are_the_counted_kernel},
    {"test_static_takes_the_scales_of_the_registered_weights", test_static_takes_the_scales_of_the_registered_weights},
    {"test_delayed_history_is_the_blocks_prepared_versions", test_delayed_history_is_the_blocks_prepared_versions},
    {"test_delayed_uses_the_max_of_exactly_the_last_n_prepares",
     test_delayed_uses_the_max_of_exactly_the_last_n_prepares},
    {"test_delayed_first_prepare_is_current_with_margin_zero", test_delayed_first_prepare_is_current_with_margin_zero},
    {"test_set_scale_mode_starts_afresh", test_set_scale_mode_starts_afresh},
    {"test_counters_sum_the_prepares", test_counters_sum_the_prepares},
    {"test_bad_scale_values_are_refused_naming_the_field", test_bad_scale_values_are_refused_naming_the_field},
    {NULL, NULL},
};

static const prism_test_suite suites[] = {{"transfer_scales", cases}, {NULL, NULL}};

int main(int argc, char **argv)
{
    return prism_test_main(argc, argv, suites);
}
