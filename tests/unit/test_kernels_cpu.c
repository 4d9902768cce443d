#define _POSIX_C_SOURCE 200809L
/* The CPU kernels against their definitions (kernels.h): exact conversions (every f16 and FP8
 * code checked), FP8 rounding and saturation at known values, Philox against its published
 * answers, scales and codes of every format worked out by hand, the edge cases of DESIGN 8, the
 * block gradient statistics of DESIGN 3 on values whose figures are exact in binary, and
 * stochastic rounding unbiased within 3 sigma. */
#include "testutil.h"

#include "prism/kernels.h"

#include <math.h>
#include <pthread.h>
#include <sys/wait.h>
#include <unistd.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void test_bf16_to_f32_known_values(void)
{
    static const struct {
        uint16_t bits;
        float want;
    } cases[] = {{0x3f80, 1.0f}, {0xc000, -2.0f}, {0x4040, 3.0f}, {0x3e80, 0.25f}, {0x0000, 0.0f}};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        CU_ASSERT_EQUAL(prism_bf16_to_f32(cases[i].bits), cases[i].want);
    CU_ASSERT_EQUAL(prism_bf16_to_f32(0x0001), ldexpf(1.0f, -133)); /* smallest subnormal */
    CU_ASSERT_TRUE(isinf(prism_bf16_to_f32(0x7f80)) && prism_bf16_to_f32(0x7f80) > 0);
    CU_ASSERT_TRUE(isinf(prism_bf16_to_f32(0xff80)) && prism_bf16_to_f32(0xff80) < 0);
    CU_ASSERT_TRUE(isnan(prism_bf16_to_f32(0x7fc0)));
    CU_ASSERT_TRUE(signbit(prism_bf16_to_f32(0x8000)));
}

/* Every one of the 65,536 f16 codes against the definition: (-1)^s * m * 2^(e-25), with the
 * implicit bit for normal numbers. */
static void test_f16_to_f32_every_code(void)
{
    unsigned wrong = 0;
    for (uint32_t code = 0; code < 65536; code++) {
        uint16_t bits = (uint16_t)code;
        float got = prism_f16_to_f32(bits);
        unsigned e = (bits >> 10) & 0x1f, m = bits & 0x3ff;
        bool negative = bits >> 15;
        if (e == 0x1f) {
            bool ok = m ? isnan(got) : (isinf(got) && (got < 0) == negative);
            wrong += !ok;
            continue;
        }
        double want = ldexp((double)(e ? m + 1024 : m), (e ? (int)e : 1) - 25);
        if (negative)
            want = -want;
        if ((double)got != want || (signbit(got) != 0) != negative) {
            if (wrong < 5)
                fprintf(stderr, "f16 0x%04x: got %.9g, want %.9g\n", code, (double)got, want);
            wrong++;
        }
    }
    CU_ASSERT_EQUAL(wrong, 0);
    CU_ASSERT_EQUAL(prism_f16_to_f32(0x7bff), 65504.0f);
    CU_ASSERT_EQUAL(prism_f16_to_f32(0x0001), ldexpf(1.0f, -24));
}

static prism_grad_stats stats_of(const prism_tensor *t, size_t n)
{
    prism_grad_stats s;
    prism_error err;
    CU_ASSERT_EQUAL_FATAL(prism_grad_stats_cpu(t, n, &s, &err), PRISM_OK);
    return s;
}

static void assert_stats(prism_grad_stats s, double l2, double max_abs, double mean, double variance, uint64_t numel,
                         uint64_t nonfinite)
{
    CU_ASSERT_EQUAL(s.l2_norm, l2);
    CU_ASSERT_EQUAL(s.max_abs, max_abs);
    CU_ASSERT_EQUAL(s.mean, mean);
    CU_ASSERT_EQUAL(s.variance, variance);
    CU_ASSERT_EQUAL(s.numel, numel);
    CU_ASSERT_EQUAL(s.nonfinite, nonfinite);
}

static void test_grad_stats_of_one_f32_tensor(void)
{
    const float x[] = {1, -2, 3, -4};
    prism_tensor t = {x, 4, PRISM_DTYPE_F32};
    /* sum of squares 30; mean -0.5; deviations 1.5 -1.5 3.5 -3.5: squares sum 29, /4 */
    assert_stats(stats_of(&t, 1), sqrt(30.0), 4.0, -0.5, 7.25, 4, 0);
}

static void test_grad_stats_leave_nonfinite_elements_out_and_count_them(void)
{
    const float x[] = {1, NAN, 3, INFINITY, -INFINITY};
    prism_tensor t = {x, 5, PRISM_DTYPE_F32};
    assert_stats(stats_of(&t, 1), sqrt(10.0), 3.0, 2.0, 1.0, 5, 3);
    const float all_bad[] = {NAN, INFINITY};
    prism_tensor u = {all_bad, 2, PRISM_DTYPE_F32};
    assert_stats(stats_of(&u, 1), 0.0, 0.0, 0.0, 0.0, 2, 2);
}

/* [1, 2] f32, [3] bf16, [4] f16: the figures of [1, 2, 3, 4] (Chan's merge across tensors). */
static void test_grad_stats_merge_tensors_of_every_dtype(void)
{
    const float a[] = {1, 2};
    const uint16_t b[] = {0x4040};      /* bf16 3.0 */
    const uint16_t c[] = {0x4400};      /* f16 4.0 */
    prism_tensor t[] = {{a, 2, PRISM_DTYPE_F32}, {b, 1, PRISM_DTYPE_BF16}, {c, 1, PRISM_DTYPE_F16}};
    assert_stats(stats_of(t, 3), sqrt(30.0), 4.0, 2.5, 1.25, 4, 0);
}

/* A large offset: E[x^2] - E[x]^2 in float would lose the variance; Welford keeps it exact. */
static void test_grad_stats_variance_survives_a_large_offset(void)
{
    const float x[] = {1000001, 1000002, 1000003, 1000004};
    prism_tensor t = {x, 4, PRISM_DTYPE_F32};
    prism_grad_stats s = stats_of(&t, 1);
    CU_ASSERT_EQUAL(s.mean, 1000002.5);
    CU_ASSERT_EQUAL(s.variance, 1.25);
}

static void test_grad_stats_of_nothing_are_zero(void)
{
    assert_stats(stats_of(NULL, 0), 0, 0, 0, 0, 0, 0);
    prism_tensor empty = {NULL, 0, PRISM_DTYPE_BF16};
    assert_stats(stats_of(&empty, 1), 0, 0, 0, 0, 0, 0);
}

static void test_grad_stats_refuse_missing_data_and_unknown_dtypes(void)
{
    const float x[] = {1};
    prism_tensor t[] = {{x, 1, PRISM_DTYPE_F32}, {NULL, 3, PRISM_DTYPE_F32}};
    prism_grad_stats s;
    prism_error err;
    CU_ASSERT_EQUAL(prism_grad_stats_cpu(t, 2, &s, &err), PRISM_ERR_INVALID);
    CU_ASSERT_STRING_EQUAL(err.message, "tensor 1: 3 elements but no data");
    prism_tensor u = {x, 1, (prism_dtype)9};
    CU_ASSERT_EQUAL(prism_grad_stats_cpu(&u, 1, &s, &err), PRISM_ERR_INVALID);
    CU_ASSERT_STRING_EQUAL(err.message, "tensor 0: unknown dtype 9");
}


/* ---- FP8 and the other conversions ------------------------------------------------------ */

/* Every finite FP8 code decodes to a value that encodes back to the same code (NaN codes to
 * 0x7f), in both formats. */
static void test_every_fp8_code_round_trips(void)
{
    const prism_precision formats[] = {PRISM_PRECISION_FP8_E4M3, PRISM_PRECISION_FP8_E5M2};
    for (int f = 0; f < 2; f++) {
        unsigned wrong = 0, nans = 0, infs = 0;
        for (unsigned c = 0; c < 256; c++) {
            float v = prism_fp8_to_f32((uint8_t)c, formats[f]);
            if (isnan(v)) {
                nans++;
                wrong += prism_f32_to_fp8(v, formats[f]) != 0x7f;
                continue;
            }
            if (isinf(v)) {
                infs++;
                continue;
            }
            if (prism_f32_to_fp8(v, formats[f]) != c) {
                if (wrong < 5)
                    fprintf(stderr, "%s code 0x%02x -> %.9g -> 0x%02x\n", prism_precision_name(formats[f]), c,
                            (double)v, prism_f32_to_fp8(v, formats[f]));
                wrong++;
            }
        }
        CU_ASSERT_EQUAL(wrong, 0);
        /* E4M3 fn: only S.1111.111 is NaN, no infinities; E5M2: 6 NaNs and +-Inf. */
        CU_ASSERT_EQUAL(nans, f == 0 ? 2u : 6u);
        CU_ASSERT_EQUAL(infs, f == 0 ? 0u : 2u);
    }
}

static void test_fp8_known_values_rounding_and_saturation(void)
{
    static const struct {
        prism_precision format;
        float x;
        uint8_t code;
    } cases[] = {
        {PRISM_PRECISION_FP8_E4M3, 1.0f, 0x38},
        {PRISM_PRECISION_FP8_E4M3, 448.0f, 0x7e},        /* the largest finite */
        {PRISM_PRECISION_FP8_E4M3, 464.0f, 0x7e},        /* past the max: saturates, never NaN */
        {PRISM_PRECISION_FP8_E4M3, 1000.0f, 0x7e},
        {PRISM_PRECISION_FP8_E4M3, -1000.0f, 0xfe},
        {PRISM_PRECISION_FP8_E4M3, INFINITY, 0x7e},
        {PRISM_PRECISION_FP8_E4M3, 17.0f, 0x58},         /* tie 16|18: even mantissa, 16 */
        {PRISM_PRECISION_FP8_E4M3, 19.0f, 0x5a},         /* tie 18|20: even mantissa, 20 */
        {PRISM_PRECISION_FP8_E4M3, 0.015625f, 0x08},     /* 2^-6, the smallest normal */
        {PRISM_PRECISION_FP8_E4M3, 0x1p-9f, 0x01},       /* the smallest subnormal */
        {PRISM_PRECISION_FP8_E4M3, 0x1p-10f, 0x00},      /* half of it: tie to even zero */
        {PRISM_PRECISION_FP8_E4M3, 0x1.8p-9f, 0x02},     /* 1.5 ulps: tie to even, 2 */
        {PRISM_PRECISION_FP8_E4M3, 0x1.ep-7f, 0x08},     /* 7.5 ulps rounds up to the normal 2^-6 */
        {PRISM_PRECISION_FP8_E4M3, -0.0f, 0x80},         /* the raw conversion keeps -0 */
        {PRISM_PRECISION_FP8_E5M2, 1.0f, 0x3c},
        {PRISM_PRECISION_FP8_E5M2, 57344.0f, 0x7b},
        {PRISM_PRECISION_FP8_E5M2, 61440.0f, 0x7b},      /* would round to Inf: saturates */
        {PRISM_PRECISION_FP8_E5M2, -INFINITY, 0xfb},
        {PRISM_PRECISION_FP8_E5M2, 0x1p-16f, 0x01},
        {PRISM_PRECISION_FP8_E5M2, 0x1p-14f, 0x04},
        {PRISM_PRECISION_FP8_E5M2, 4.5f, 0x44},          /* tie 4|5: even, 4 */
        {PRISM_PRECISION_FP8_E5M2, 5.5f, 0x46},          /* tie 5|6: even, 6 */
        {PRISM_PRECISION_FP8_E4M3, NAN, 0x7f},
        {PRISM_PRECISION_FP8_E5M2, -NAN, 0x7f},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        uint8_t got = prism_f32_to_fp8(cases[i].x, cases[i].format);
        if (got != cases[i].code)
            fprintf(stderr, "case %zu: %s(%a) = 0x%02x, want 0x%02x\n", i,
                    prism_precision_name(cases[i].format), (double)cases[i].x, got, cases[i].code);
        CU_ASSERT_EQUAL(got, cases[i].code);
    }
    CU_ASSERT_EQUAL(prism_fp8_to_f32(0x7e, PRISM_PRECISION_FP8_E4M3), 448.0f);
    CU_ASSERT_EQUAL(prism_fp8_to_f32(0x01, PRISM_PRECISION_FP8_E4M3), 0x1p-9f);
    CU_ASSERT_EQUAL(prism_fp8_to_f32(0xfb, PRISM_PRECISION_FP8_E5M2), -57344.0f);
    CU_ASSERT_TRUE(isinf(prism_fp8_to_f32(0x7c, PRISM_PRECISION_FP8_E5M2)));
}

/* f32 -> bf16 and f16 round to nearest even, overflow to Inf, keep NaN a NaN; every bf16 and
 * every finite f16 value converts back to its own code. */
static void test_f32_to_bf16_and_f16_round_to_nearest_even(void)
{
    CU_ASSERT_EQUAL(prism_f32_to_bf16(1.0f), 0x3f80);
    CU_ASSERT_EQUAL(prism_f32_to_bf16(0x1.01p0f), 0x3f80);   /* tie: even */
    CU_ASSERT_EQUAL(prism_f32_to_bf16(0x1.03p0f), 0x3f82);   /* tie: even, up */
    CU_ASSERT_EQUAL(prism_f32_to_bf16(0x1.0101p0f), 0x3f81); /* past the tie */
    CU_ASSERT_TRUE((prism_f32_to_bf16(NAN) & 0x7fc0) == 0x7fc0);
    CU_ASSERT_EQUAL(prism_f32_to_f16(65504.0f), 0x7bff);
    CU_ASSERT_EQUAL(prism_f32_to_f16(65519.0f), 0x7bff);
    CU_ASSERT_EQUAL(prism_f32_to_f16(65520.0f), 0x7c00); /* rounds past the max: Inf */
    CU_ASSERT_EQUAL(prism_f32_to_f16(-1e9f), 0xfc00);
    CU_ASSERT_EQUAL(prism_f32_to_f16(0x1p-24f), 0x0001);
    CU_ASSERT_EQUAL(prism_f32_to_f16(0x1p-25f), 0x0000);   /* tie: even zero */
    CU_ASSERT_EQUAL(prism_f32_to_f16(0x1.8p-24f), 0x0002); /* tie: even, 2 */
    CU_ASSERT_EQUAL(prism_f32_to_f16(0x1.ffcp-15f), 0x0400); /* rounds up into the normals */
    unsigned wrong = 0;
    for (uint32_t c = 0; c < 65536; c++) {
        uint16_t h = (uint16_t)c;
        if ((h & 0x7f80) != 0x7f80 && prism_f32_to_bf16(prism_bf16_to_f32(h)) != h)
            wrong++;
        if ((h & 0x7c00) != 0x7c00 && prism_f32_to_f16(prism_f16_to_f32(h)) != h)
            wrong++;
    }
    CU_ASSERT_EQUAL(wrong, 0);
}

/* Random123's published answers for Philox4x32-10. */
static void test_philox_matches_the_published_answers(void)
{
    static const struct {
        uint32_t ctr[4], key[2], out[4];
    } kat[] = {
        {{0, 0, 0, 0}, {0, 0}, {0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8}},
        {{0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff},
         {0xffffffff, 0xffffffff},
         {0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd}},
        {{0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344},
         {0xa4093822, 0x299f31d0},
         {0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1}},
    };
    for (size_t i = 0; i < 3; i++) {
        uint32_t out[4];
        prism_philox4x32_10(kat[i].ctr, kat[i].key, out);
        CU_ASSERT_EQUAL(memcmp(out, kat[i].out, sizeof out), 0);
    }
}

/* ---- quantization ----------------------------------------------------------------------- */

typedef struct quantized {
    uint8_t codes[64];
    float scales[16];
    uint64_t nonfinite;
} quantized;

static quantized quantize_f32(const float *x, size_t n, prism_quant_spec spec)
{
    quantized q;
    memset(&q, 0xaa, sizeof q);
    prism_tensor t = {x, n, PRISM_DTYPE_F32};
    prism_error err = {0};
    prism_status st = prism_quantize_cpu(&spec, &t, q.codes, q.scales, &q.nonfinite, &err);
    if (st != PRISM_OK)
        fprintf(stderr, "quantize: %s\n", err.message);
    CU_ASSERT_EQUAL_FATAL(st, PRISM_OK);
    return q;
}

static void test_quant_qmax_of_every_format(void)
{
    CU_ASSERT_EQUAL(prism_quant_qmax(PRISM_PRECISION_INT8), 127.0f);
    CU_ASSERT_EQUAL(prism_quant_qmax(PRISM_PRECISION_FP8_E4M3), 448.0f);
    CU_ASSERT_EQUAL(prism_quant_qmax(PRISM_PRECISION_FP8_E5M2), 57344.0f);
    CU_ASSERT_EQUAL(prism_quant_qmax(PRISM_PRECISION_INT4), 7.0f);
    CU_ASSERT_EQUAL(prism_quant_qmax(PRISM_PRECISION_BF16), 0.0f);
}

/* amax 127 makes s = 1 exactly, so the codes are the inputs rounded to nearest even. */
static void test_quantize_int8_per_tensor_rounds_to_nearest_even(void)
{
    const float x[] = {0, 63.5f, -127, 1.5f, 2.5f, -0.5f, 100.2f, -0.0f};
    quantized q = quantize_f32(x, 8, (prism_quant_spec){.format = PRISM_PRECISION_INT8});
    const int8_t want[] = {0, 64, -127, 2, 2, 0, 100, 0};
    CU_ASSERT_EQUAL(memcmp(q.codes, want, 8), 0);
    CU_ASSERT_EQUAL(q.scales[0], 1.0f);
    CU_ASSERT_EQUAL(q.nonfinite, 0);
}

/* Seven INT4 values: two per byte, low nibble first, the last high nibble 0. */
static void test_quantize_int4_packs_low_nibble_first_with_odd_length(void)
{
    const float x[] = {7, -7, 1, -1, 3, 0, -3.5f};
    quantized q = quantize_f32(x, 7, (prism_quant_spec){.format = PRISM_PRECISION_INT4});
    const uint8_t want[] = {0x97, 0xf1, 0x03, 0x0c}; /* -3.5 -> -4 (even) = 0xc */
    CU_ASSERT_EQUAL(memcmp(q.codes, want, 4), 0);
    CU_ASSERT_EQUAL(q.scales[0], 1.0f);
    size_t bytes = 0;
    prism_quant_spec spec = {.format = PRISM_PRECISION_INT4};
    CU_ASSERT_EQUAL(prism_quant_layout(&spec, 7, NULL, NULL, &bytes, NULL), PRISM_OK);
    CU_ASSERT_EQUAL(bytes, 4);
}

/* Per block of K = 3 over 7 elements: three groups, the last of one element. */
static void test_quantize_per_block_gives_one_scale_per_group(void)
{
    const float x[] = {127, 1, 2, 254, -127, 0.5f, -12.7f};
    quantized q = quantize_f32(x, 7,
                               (prism_quant_spec){.format = PRISM_PRECISION_INT8,
                                                  .granularity = PRISM_GRANULARITY_BLOCK,
                                                  .group = 3});
    CU_ASSERT_EQUAL(q.scales[0], 1.0f);
    CU_ASSERT_EQUAL(q.scales[1], 2.0f);
    CU_ASSERT_EQUAL(q.scales[2], 12.7f / 127.0f);
    const int8_t want[] = {127, 1, 2, 127, -64, 0, -127}; /* -127/2 = -63.5 -> -64 */
    CU_ASSERT_EQUAL(memcmp(q.codes, want, 7), 0);
    size_t groups = 0, len = 0;
    prism_quant_spec spec = {.format = PRISM_PRECISION_INT8, .granularity = PRISM_GRANULARITY_BLOCK};
    CU_ASSERT_EQUAL(prism_quant_layout(&spec, 300, &groups, &len, NULL, NULL), PRISM_OK);
    CU_ASSERT_EQUAL(groups, 3); /* K defaults to 128 */
    CU_ASSERT_EQUAL(len, 128);
}

/* Per row: rows of 2 over 6 elements. */
static void test_quantize_per_row_scales_each_row(void)
{
    const float x[] = {448, -224, 1, 0.5f, 0, 0};
    quantized q = quantize_f32(x, 6,
                               (prism_quant_spec){.format = PRISM_PRECISION_FP8_E4M3,
                                                  .granularity = PRISM_GRANULARITY_ROW,
                                                  .group = 2});
    CU_ASSERT_EQUAL(q.scales[0], 1.0f);
    CU_ASSERT_EQUAL(q.scales[1], 1.0f / 448.0f);
    CU_ASSERT_EQUAL(q.scales[2], 1.0f); /* amax 0 */
    CU_ASSERT_EQUAL(q.codes[0], 0x7e);
    CU_ASSERT_EQUAL(q.codes[1], 0xf6); /* -224 = -1.75 * 2^7 */
    CU_ASSERT_EQUAL(q.codes[2], prism_f32_to_fp8(1.0f / (1.0f / 448.0f), PRISM_PRECISION_FP8_E4M3));
    CU_ASSERT_EQUAL(q.codes[4], 0);
    CU_ASSERT_EQUAL(q.codes[5], 0);
}

/* Power-of-two scales: the smallest 2^e with qmax * 2^e >= amax. */
static void test_quantize_pow2_scale_is_the_smallest_power_that_covers_amax(void)
{
    static const struct {
        prism_precision format;
        float amax, scale;
    } cases[] = {
        {PRISM_PRECISION_INT8, 127.0f, 1.0f},
        {PRISM_PRECISION_INT8, 128.0f, 2.0f},
        {PRISM_PRECISION_INT8, 4.0f, 0.0625f},        /* 127/16 >= 4 > 127/32 */
        {PRISM_PRECISION_INT8, 0x1p-140f, 0x1p-146f}, /* a subnormal input */
        {PRISM_PRECISION_INT8, 0x1p-149f, 0x1p-149f}, /* e would be below -149 */
        {PRISM_PRECISION_FP8_E4M3, 448.0f, 1.0f},
        {PRISM_PRECISION_FP8_E4M3, 449.0f, 2.0f},
        {PRISM_PRECISION_FP8_E5M2, 1.0f, 0x1p-15f},   /* 57344 = 1.75 * 2^15 */
        {PRISM_PRECISION_INT4, 7.0f, 1.0f},
        {PRISM_PRECISION_INT4, 8.0f, 2.0f},
        {PRISM_PRECISION_INT4, 3.4e38f, 0x1p126f},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        float x[2] = {cases[i].amax, 0};
        quantized q = quantize_f32(x, 2,
                                   (prism_quant_spec){.format = cases[i].format,
                                                      .scale_mode = PRISM_SCALE_POW2});
        if (q.scales[0] != cases[i].scale)
            fprintf(stderr, "case %zu: scale %a, want %a\n", i, (double)q.scales[0], (double)cases[i].scale);
        CU_ASSERT_EQUAL(q.scales[0], cases[i].scale);
    }
}

/* Subnormal inputs quantize like any others: the division by a subnormal scale is exact here. */
static void test_quantize_subnormal_inputs_keep_their_codes(void)
{
    const float x[] = {0x1p-140f, -0x1p-141f, 0x1p-146f};
    quantized q = quantize_f32(x, 3,
                               (prism_quant_spec){.format = PRISM_PRECISION_INT8,
                                                  .scale_mode = PRISM_SCALE_POW2});
    CU_ASSERT_EQUAL(q.scales[0], 0x1p-146f);
    const int8_t want[] = {64, -32, 1};
    CU_ASSERT_EQUAL(memcmp(q.codes, want, 3), 0);
    /* FP32 scale of amax 2^-149 with E5M2: amax / 57344 underflows, s is 2^-149. */
    const float tiny[] = {0x1p-149f};
    q = quantize_f32(tiny, 1, (prism_quant_spec){.format = PRISM_PRECISION_FP8_E5M2});
    CU_ASSERT_EQUAL(q.scales[0], 0x1p-149f);
    CU_ASSERT_EQUAL(q.codes[0], 0x3c); /* 1.0 */
}

/* FP8 subnormal outputs: with s = 1, values below 2^-6 use E4M3's subnormal codes. */
static void test_quantize_fp8_uses_subnormal_codes(void)
{
    const float x[] = {448, 0x1p-9f, 0x1p-10f, 0x1.8p-9f, -0x1p-11f};
    quantized q = quantize_f32(x, 5, (prism_quant_spec){.format = PRISM_PRECISION_FP8_E4M3});
    CU_ASSERT_EQUAL(q.scales[0], 1.0f);
    const uint8_t want[] = {0x7e, 0x01, 0x00, 0x02, 0x00}; /* -2^-11 rounds to zero: code 0 */
    CU_ASSERT_EQUAL(memcmp(q.codes, want, 5), 0);
}

/* NaN and Inf: counted, left out of amax, written as code 0 in every format. */
static void test_quantize_counts_nonfinite_inputs_and_writes_zero_codes(void)
{
    const float x[] = {NAN, 2, -INFINITY, -4, INFINITY};
    const prism_precision formats[] = {PRISM_PRECISION_INT8, PRISM_PRECISION_FP8_E4M3,
                                       PRISM_PRECISION_FP8_E5M2, PRISM_PRECISION_INT4};
    for (int f = 0; f < 4; f++) {
        quantized q = quantize_f32(x, 5,
                                   (prism_quant_spec){.format = formats[f],
                                                      .scale_mode = PRISM_SCALE_POW2});
        CU_ASSERT_EQUAL(q.nonfinite, 3);
        CU_ASSERT_TRUE(q.scales[0] > 0 && isfinite(q.scales[0]));
        float back[5];
        prism_error err;
        prism_quant_spec spec = {.format = formats[f]};
        CU_ASSERT_EQUAL(prism_dequantize_cpu(&spec, q.codes, q.scales, 5, back, PRISM_DTYPE_F32, &err),
                        PRISM_OK);
        CU_ASSERT_EQUAL(back[0], 0.0f);
        CU_ASSERT_EQUAL(back[2], 0.0f);
        CU_ASSERT_EQUAL(back[4], 0.0f);
        CU_ASSERT_EQUAL(back[1], 2.0f); /* pow2 scales make these exact in every format */
        CU_ASSERT_EQUAL(back[3], -4.0f);
    }
    quantized q = quantize_f32(x, 5,
                               (prism_quant_spec){.format = PRISM_PRECISION_INT8,
                                                  .scale_mode = PRISM_SCALE_POW2});
    const int8_t want[] = {0, 32, 0, -64, 0};
    CU_ASSERT_EQUAL(q.scales[0], 0.0625f);
    CU_ASSERT_EQUAL(memcmp(q.codes, want, 5), 0);
    const float all_bad[] = {NAN, NAN};
    q = quantize_f32(all_bad, 2, (prism_quant_spec){.format = PRISM_PRECISION_FP8_E4M3});
    CU_ASSERT_EQUAL(q.scales[0], 1.0f);
    CU_ASSERT_EQUAL(q.codes[0], 0);
    CU_ASSERT_EQUAL(q.codes[1], 0);
    CU_ASSERT_EQUAL(q.nonfinite, 2);
}

static void test_quantize_all_zeros_gives_scale_one_and_zero_codes(void)
{
    const float x[] = {0, -0.0f, 0};
    const prism_precision formats[] = {PRISM_PRECISION_INT8, PRISM_PRECISION_FP8_E4M3,
                                       PRISM_PRECISION_FP8_E5M2, PRISM_PRECISION_INT4};
    for (int f = 0; f < 4; f++)
        for (int pow2 = 0; pow2 < 2; pow2++) {
            quantized q = quantize_f32(x, 3,
                                       (prism_quant_spec){.format = formats[f],
                                                          .scale_mode = (prism_scale_mode)pow2});
            CU_ASSERT_EQUAL(q.scales[0], 1.0f);
            CU_ASSERT_EQUAL(q.codes[0], 0);
            CU_ASSERT_EQUAL(q.codes[1], 0);
        }
}

/* Whatever amax is, +-amax quantizes to +-qmax: a quotient a hair above qmax saturates. */
static void test_quantize_amax_always_lands_on_qmax(void)
{
    const prism_precision formats[] = {PRISM_PRECISION_INT8, PRISM_PRECISION_FP8_E4M3,
                                       PRISM_PRECISION_FP8_E5M2, PRISM_PRECISION_INT4};
    const uint8_t want_pos[] = {0x7f, 0x7e, 0x7b, 0x77};
    const uint8_t want_neg[] = {0x81, 0xfe, 0xfb, 0x99};
    uint32_t state = 12345;
    unsigned wrong = 0;
    for (int i = 0; i < 20000; i++) {
        state = state * 1664525u + 1013904223u;
        uint32_t bits = (state >> 1) % 0x7f000000u + 0x00800000u; /* a normal positive float */
        float amax;
        memcpy(&amax, &bits, sizeof amax);
        const float x[2] = {amax, -amax};
        for (int f = 0; f < 4; f++) {
            quantized q = quantize_f32(x, 2, (prism_quant_spec){.format = formats[f]});
            uint8_t pos = q.codes[0], neg = q.codes[1];
            if (formats[f] == PRISM_PRECISION_INT4) { /* both nibbles in byte 0, spread to compare */
                pos = (uint8_t)((q.codes[0] & 0x0fu) * 0x11u);
                neg = (uint8_t)((q.codes[0] >> 4) * 0x11u);
            }
            wrong += pos != want_pos[f] || neg != want_neg[f];
        }
    }
    CU_ASSERT_EQUAL(wrong, 0);
}

/* Dequantize: code * scale in binary32, then the output type's rounding; F16 overflows to Inf. */
static void test_dequantize_writes_every_output_type(void)
{
    const float x[] = {448, -1, 0.5f};
    quantized q = quantize_f32(x, 3, (prism_quant_spec){.format = PRISM_PRECISION_FP8_E4M3});
    prism_quant_spec spec = {.format = PRISM_PRECISION_FP8_E4M3};
    float f32[3];
    uint16_t bf16[3], f16[3];
    prism_error err;
    CU_ASSERT_EQUAL(prism_dequantize_cpu(&spec, q.codes, q.scales, 3, f32, PRISM_DTYPE_F32, &err), PRISM_OK);
    CU_ASSERT_EQUAL(prism_dequantize_cpu(&spec, q.codes, q.scales, 3, bf16, PRISM_DTYPE_BF16, &err), PRISM_OK);
    CU_ASSERT_EQUAL(prism_dequantize_cpu(&spec, q.codes, q.scales, 3, f16, PRISM_DTYPE_F16, &err), PRISM_OK);
    CU_ASSERT_EQUAL(f32[0], 448.0f);
    CU_ASSERT_EQUAL(f32[1], -1.0f);
    CU_ASSERT_EQUAL(f32[2], 0.5f);
    CU_ASSERT_EQUAL(bf16[0], 0x43e0);
    CU_ASSERT_EQUAL(bf16[1], 0xbf80);
    CU_ASSERT_EQUAL(f16[0], 0x5f00);
    CU_ASSERT_EQUAL(f16[2], 0x3800);
    /* E5M2's max times a scale of 2 is beyond f16: Inf. */
    const uint8_t code = 0x7b;
    const float two = 2.0f;
    prism_quant_spec e5 = {.format = PRISM_PRECISION_FP8_E5M2};
    CU_ASSERT_EQUAL(prism_dequantize_cpu(&e5, &code, &two, 1, f16, PRISM_DTYPE_F16, &err), PRISM_OK);
    CU_ASSERT_EQUAL(f16[0], 0x7c00);
    CU_ASSERT_EQUAL(prism_dequantize_cpu(&e5, &code, &two, 1, f32, PRISM_DTYPE_F32, &err), PRISM_OK);
    CU_ASSERT_EQUAL(f32[0], 114688.0f);
}

/* acc + code * s, two roundings: 1 + 2^-24 * 1 stays 1 in binary32, and the codes add exactly. */
static void test_dequantize_accumulate_adds_in_fp32(void)
{
    const int8_t codes[] = {1, -2, 127, 0};
    const float scale = 0x1p-24f;
    float acc[] = {1.0f, 0.0f, 0.0f, 5.0f};
    prism_quant_spec spec = {.format = PRISM_PRECISION_INT8};
    prism_error err;
    CU_ASSERT_EQUAL(prism_dequantize_accumulate_cpu(&spec, (const uint8_t *)codes, &scale, 4, acc, &err),
                    PRISM_OK);
    CU_ASSERT_EQUAL(acc[0], 1.0f); /* 1 + 2^-24: the tie goes to even, 1 */
    CU_ASSERT_EQUAL(acc[1], -0x1p-23f);
    CU_ASSERT_EQUAL(acc[2], 127 * 0x1p-24f);
    CU_ASSERT_EQUAL(acc[3], 5.0f);
    /* Per block of 2 with INT4 (odd length): each element uses its own group's scale. */
    const uint8_t nibbles[] = {0x21, 0x0f}; /* 1, 2, -1 */
    const float scales[] = {1.0f, 10.0f};
    float acc3[] = {0, 0, 0};
    prism_quant_spec blocks = {.format = PRISM_PRECISION_INT4, .granularity = PRISM_GRANULARITY_BLOCK,
                               .group = 2};
    CU_ASSERT_EQUAL(prism_dequantize_accumulate_cpu(&blocks, nibbles, scales, 3, acc3, &err), PRISM_OK);
    CU_ASSERT_EQUAL(acc3[0], 1.0f);
    CU_ASSERT_EQUAL(acc3[1], 2.0f);
    CU_ASSERT_EQUAL(acc3[2], -10.0f);
}

static void test_relative_error_known_values_and_edges(void)
{
    const float a[] = {3, 4}, b[] = {3, 0}, zero[] = {0, 0}, one[] = {0, 1}, bad[] = {NAN, 1};
    prism_tensor ta = {a, 2, PRISM_DTYPE_F32}, tb = {b, 2, PRISM_DTYPE_F32};
    prism_tensor tz = {zero, 2, PRISM_DTYPE_F32}, t1 = {one, 2, PRISM_DTYPE_F32};
    prism_tensor tbad = {bad, 2, PRISM_DTYPE_F32};
    double e = -1;
    prism_error err;
    CU_ASSERT_EQUAL(prism_relative_error_cpu(&ta, &tb, &e, &err), PRISM_OK);
    CU_ASSERT_EQUAL(e, 0.8); /* sqrt(16 / 25) */
    CU_ASSERT_EQUAL(prism_relative_error_cpu(&ta, &ta, &e, &err), PRISM_OK);
    CU_ASSERT_EQUAL(e, 0.0);
    CU_ASSERT_EQUAL(prism_relative_error_cpu(&tz, &tz, &e, &err), PRISM_OK);
    CU_ASSERT_EQUAL(e, 0.0);
    CU_ASSERT_EQUAL(prism_relative_error_cpu(&tz, &t1, &e, &err), PRISM_OK);
    CU_ASSERT_TRUE(isinf(e) && e > 0);
    CU_ASSERT_EQUAL(prism_relative_error_cpu(&ta, &tbad, &e, &err), PRISM_OK);
    CU_ASSERT_TRUE(isnan(e));
    /* Mixed dtypes: bf16 [3, 4] against f32 [3, 0]. */
    const uint16_t a16[] = {0x4040, 0x4080};
    prism_tensor tab = {a16, 2, PRISM_DTYPE_BF16};
    CU_ASSERT_EQUAL(prism_relative_error_cpu(&tab, &tb, &e, &err), PRISM_OK);
    CU_ASSERT_EQUAL(e, 0.8);
    prism_tensor shorter = {a, 1, PRISM_DTYPE_F32};
    CU_ASSERT_EQUAL(prism_relative_error_cpu(&ta, &shorter, &e, &err), PRISM_ERR_INVALID);
    CU_ASSERT_STRING_EQUAL(err.message, "relative_error: a has 2 elements and b has 1");
}

/* Round trips of normal-looking data stay within the error each format's step allows. */
static void test_round_trip_error_per_format(void)
{
    enum { N = 4096 };
    float *x = malloc(N * sizeof *x), *y = malloc(N * sizeof *y);
    uint8_t *codes = malloc(N);
    float scales[N / 128];
    uint32_t state = 7;
    for (int i = 0; i < N; i++) {
        double s = 0;
        for (int k = 0; k < 4; k++) {
            state = state * 1664525u + 1013904223u;
            s += (state >> 8) / 16777216.0 - 0.5;
        }
        x[i] = (float)s;
    }
    static const struct {
        prism_precision format;
        double bound;
    } cases[] = {{PRISM_PRECISION_INT8, 0.01},
                 {PRISM_PRECISION_FP8_E4M3, 0.04},
                 {PRISM_PRECISION_FP8_E5M2, 0.08},
                 {PRISM_PRECISION_INT4, 0.2}};
    for (size_t c = 0; c < 4; c++) {
        prism_quant_spec spec = {.format = cases[c].format, .granularity = PRISM_GRANULARITY_BLOCK};
        prism_tensor tx = {x, N, PRISM_DTYPE_F32}, ty = {y, N, PRISM_DTYPE_F32};
        prism_error err;
        CU_ASSERT_EQUAL_FATAL(prism_quantize_cpu(&spec, &tx, codes, scales, NULL, &err), PRISM_OK);
        CU_ASSERT_EQUAL_FATAL(prism_dequantize_cpu(&spec, codes, scales, N, y, PRISM_DTYPE_F32, &err), PRISM_OK);
        double e;
        CU_ASSERT_EQUAL_FATAL(prism_relative_error_cpu(&tx, &ty, &e, &err), PRISM_OK);
        if (!(e < cases[c].bound))
            fprintf(stderr, "%s: relative error %g\n", prism_precision_name(cases[c].format), e);
        CU_ASSERT_TRUE(e > 0 && e < cases[c].bound);
    }
    free(x);
    free(y);
    free(codes);
}

/* Stochastic rounding: the mean of the dequantized values is the input within 3 sigma, for
 * integers, FP8 normals and FP8 subnormals; the same seed gives the same codes, another seed
 * other codes. Scales are fixed at 1 by an element equal to qmax. */
static void test_stochastic_rounding_is_unbiased_within_3_sigma(void)
{
    enum { N = 200001 };
    static const struct {
        prism_precision format;
        float v, lo, hi; /* v between the neighbours lo and hi */
    } cases[] = {
        {PRISM_PRECISION_INT8, 10.3f, 10, 11},
        {PRISM_PRECISION_INT8, -10.3f, -11, -10},
        {PRISM_PRECISION_INT4, 2.75f, 2, 3},
        {PRISM_PRECISION_FP8_E4M3, 17.3f, 16, 18},
        {PRISM_PRECISION_FP8_E4M3, 0x1.4p-9f, 0x1p-9f, 0x1p-8f},   /* subnormal range */
        {PRISM_PRECISION_FP8_E5M2, -5.5f, -6, -5},
        {PRISM_PRECISION_FP8_E5M2, 0x1.8p-16f, 0x1p-16f, 0x1p-15f}, /* subnormal range */
    };
    float *x = malloc(N * sizeof *x), *y = malloc(N * sizeof *y);
    uint8_t *codes = malloc(N), *again = malloc(N);
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        float qmax = prism_quant_qmax(cases[c].format);
        x[0] = qmax;
        for (int i = 1; i < N; i++)
            x[i] = cases[c].v;
        prism_quant_spec spec = {.format = cases[c].format, .rounding = PRISM_ROUNDING_STOCHASTIC,
                                 .seed = 42 + c};
        prism_tensor t = {x, N, PRISM_DTYPE_F32};
        float scale;
        prism_error err;
        CU_ASSERT_EQUAL_FATAL(prism_quantize_cpu(&spec, &t, codes, &scale, NULL, &err), PRISM_OK);
        CU_ASSERT_EQUAL(scale, 1.0f);
        CU_ASSERT_EQUAL_FATAL(prism_dequantize_cpu(&spec, codes, &scale, N, y, PRISM_DTYPE_F32, &err), PRISM_OK);
        double sum = 0;
        unsigned outside = 0;
        for (int i = 1; i < N; i++) {
            sum += y[i];
            outside += y[i] != cases[c].lo && y[i] != cases[c].hi;
        }
        CU_ASSERT_EQUAL(outside, 0);
        double mean = sum / (N - 1);
        double p = ((double)cases[c].v - cases[c].lo) / ((double)cases[c].hi - cases[c].lo);
        double sigma = ((double)cases[c].hi - cases[c].lo) * sqrt(p * (1 - p) / (N - 1));
        if (!(fabs(mean - cases[c].v) < 3 * sigma))
            fprintf(stderr, "case %zu: mean %.9g, want %.9g +- %.3g\n", c, mean, (double)cases[c].v, 3 * sigma);
        CU_ASSERT_TRUE(fabs(mean - cases[c].v) < 3 * sigma);
        CU_ASSERT_EQUAL_FATAL(prism_quantize_cpu(&spec, &t, again, &scale, NULL, &err), PRISM_OK);
        CU_ASSERT_EQUAL(memcmp(codes, again, prism_quant_qmax(spec.format) == 7.0f ? N / 2 + 1 : N), 0);
        spec.seed += 1000;
        CU_ASSERT_EQUAL_FATAL(prism_quantize_cpu(&spec, &t, again, &scale, NULL, &err), PRISM_OK);
        CU_ASSERT_NOT_EQUAL(memcmp(codes, again, N / 2), 0);
    }
    free(x);
    free(y);
    free(codes);
    free(again);
}

/* Nearest rounding of a value already on the grid is exact; stochastic rounding of it too. */
static void test_stochastic_rounding_keeps_representable_values(void)
{
    const float x[] = {448, 16, -18, 0x1p-9f, 0, -0.0f, 448};
    quantized n = quantize_f32(x, 7, (prism_quant_spec){.format = PRISM_PRECISION_FP8_E4M3});
    quantized s = quantize_f32(x, 7,
                               (prism_quant_spec){.format = PRISM_PRECISION_FP8_E4M3,
                                                  .rounding = PRISM_ROUNDING_STOCHASTIC, .seed = 9});
    CU_ASSERT_EQUAL(memcmp(n.codes, s.codes, 7), 0);
    CU_ASSERT_EQUAL(s.codes[5], 0);
}

static void test_quantize_refuses_bad_specs_naming_the_field(void)
{
    const float x[6] = {0};
    prism_tensor t = {x, 6, PRISM_DTYPE_F32};
    uint8_t codes[8];
    float scales[8];
    prism_error err;
    static const struct {
        prism_quant_spec spec;
        const char *message;
    } cases[] = {
        {{.format = PRISM_PRECISION_BF16}, "format: bf16 is not a quantized format (int8, fp8_e4m3, fp8_e5m2, int4)"},
        {{.format = (prism_precision)7}, "format: unknown precision 7"},
        {{.format = PRISM_PRECISION_INT8, .granularity = (prism_granularity)3},
         "granularity: unknown value 3 (tensor 0, row 1, block 2)"},
        {{.format = PRISM_PRECISION_INT8, .granularity = PRISM_GRANULARITY_ROW, .group = 4},
         "group: 6 elements are not a whole number of rows of 4"},
        {{.format = PRISM_PRECISION_INT8, .granularity = PRISM_GRANULARITY_ROW},
         "group: the row length must be at least 1"},
        {{.format = PRISM_PRECISION_INT8, .scale_mode = (prism_scale_mode)2},
         "scale_mode: unknown value 2 (fp32 0, pow2 1)"},
        {{.format = PRISM_PRECISION_INT8, .rounding = (prism_rounding)5},
         "rounding: unknown value 5 (nearest 0, stochastic 1)"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        memset(codes, 0x55, sizeof codes);
        CU_ASSERT_EQUAL(prism_quantize_cpu(&cases[i].spec, &t, codes, scales, NULL, &err), PRISM_ERR_INVALID);
        CU_ASSERT_STRING_EQUAL(err.message, cases[i].message);
        CU_ASSERT_EQUAL(codes[0], 0x55); /* nothing written */
    }
    prism_quant_spec ok = {.format = PRISM_PRECISION_INT8};
    prism_tensor nodata = {NULL, 6, PRISM_DTYPE_F32};
    CU_ASSERT_EQUAL(prism_quantize_cpu(&ok, &nodata, codes, scales, NULL, &err), PRISM_ERR_INVALID);
    CU_ASSERT_STRING_EQUAL(err.message, "input 0: 6 elements but no data");
    CU_ASSERT_EQUAL(prism_dequantize_cpu(&ok, codes, scales, 6, codes, (prism_dtype)4, &err), PRISM_ERR_INVALID);
    CU_ASSERT_STRING_EQUAL(err.message, "out_dtype: unknown dtype 4");
    /* Nothing to do is not an error. */
    prism_tensor empty = {NULL, 0, PRISM_DTYPE_F32};
    uint64_t bad = 99;
    CU_ASSERT_EQUAL(prism_quantize_cpu(&ok, &empty, NULL, NULL, &bad, &err), PRISM_OK);
    CU_ASSERT_EQUAL(bad, 0);
}

/* The statistics of many blocks in one call equal those of each block alone, and a tensor longer
 * than a chunk (with an offset that E[x^2] - E[x]^2 would lose) keeps its exact variance. */
static void test_grad_stats_blocks_match_single_blocks_across_chunks(void)
{
    enum { N = 3 * PRISM_STATS_CHUNK + 5 };
    float *x = malloc(N * sizeof *x);
    for (int i = 0; i < N; i++)
        x[i] = 4096.0f + (float)(i % 2); /* mean 4096.5 (odd N: a hair below), variance ~0.25 */
    const float y[] = {1, -2, 3, -4};
    prism_tensor t[] = {{x, N, PRISM_DTYPE_F32}, {y, 4, PRISM_DTYPE_F32}, {y, 2, PRISM_DTYPE_F32}};
    size_t start[] = {0, 1, 1, 3};
    prism_grad_stats out[3];
    prism_error err;
    CU_ASSERT_EQUAL_FATAL(prism_grad_stats_blocks_cpu(t, start, 3, out, &err), PRISM_OK);
    prism_grad_stats one = stats_of(&t[0], 1);
    CU_ASSERT_EQUAL(memcmp(&out[0], &one, sizeof one), 0);
    assert_stats(out[1], 0, 0, 0, 0, 0, 0); /* an empty block */
    prism_grad_stats two = stats_of(&t[1], 2);
    CU_ASSERT_EQUAL(memcmp(&out[2], &two, sizeof two), 0);
    /* (N+1)/2 values 4096 and (N-1)/2 values 4097 (N is odd). */
    double n0 = (N + 1) / 2, n1 = (N - 1) / 2;
    double mean = (4096 * n0 + 4097 * n1) / N;
    double var = n0 * n1 / ((double)N * N);
    CU_ASSERT_DOUBLE_EQUAL(out[0].mean, mean, 1e-12);
    CU_ASSERT_DOUBLE_EQUAL(out[0].variance, var, 1e-12);
    CU_ASSERT_EQUAL(out[0].numel, N);
    size_t bad_start[] = {0, 2, 1};
    CU_ASSERT_EQUAL(prism_grad_stats_blocks_cpu(t, bad_start, 2, out, &err), PRISM_ERR_INVALID);
    CU_ASSERT_STRING_EQUAL(err.message, "block_start[2] = 1 is below block_start[1] = 2");
    free(x);
}


/* ---- the worker pool -------------------------------------------------------------------- */

enum { POOL_N = 3 * 512 * 1024 + 17 }; /* large enough for the threaded driver */

typedef struct pool_case {
    const float *x;
    const uint8_t *want;
    int mismatches;
} pool_case;

static void quantize_big(const float *x, uint8_t *codes, float *scales)
{
    prism_quant_spec spec = {.format = PRISM_PRECISION_FP8_E4M3, .granularity = PRISM_GRANULARITY_BLOCK,
                             .rounding = PRISM_ROUNDING_STOCHASTIC, .seed = 3};
    prism_tensor t = {x, POOL_N, PRISM_DTYPE_F32};
    prism_error err;
    CU_ASSERT_EQUAL(prism_quantize_cpu(&spec, &t, codes, scales, NULL, &err), PRISM_OK);
}

static void *quantize_again(void *arg)
{
    pool_case *c = arg;
    uint8_t *codes = malloc(POOL_N);
    float *scales = malloc(POOL_N / 128 * sizeof *scales + 64);
    for (int r = 0; r < 5; r++) {
        quantize_big(c->x, codes, scales);
        c->mismatches += memcmp(codes, c->want, POOL_N) != 0;
    }
    free(codes);
    free(scales);
    return NULL;
}

/* Calls from two threads at once (one finds the pool busy and works alone) and a call in a child
 * after fork() (where the pool's workers do not exist) give the same codes as a lone call. */
static void test_concurrent_and_forked_calls_give_the_same_codes(void)
{
    float *x = malloc(POOL_N * sizeof *x);
    uint8_t *want = malloc(POOL_N);
    float *scales = malloc(POOL_N / 128 * sizeof *scales + 64);
    uint32_t state = 99;
    for (int i = 0; i < POOL_N; i++) {
        state = state * 1664525u + 1013904223u;
        x[i] = ((float)(state >> 8) / 16777216.0f - 0.5f) * 3.0f;
    }
    quantize_big(x, want, scales);
    pool_case a = {x, want, 0}, b = {x, want, 0};
    pthread_t ta, tb;
    CU_ASSERT_EQUAL_FATAL(pthread_create(&ta, NULL, quantize_again, &a), 0);
    CU_ASSERT_EQUAL_FATAL(pthread_create(&tb, NULL, quantize_again, &b), 0);
    pthread_join(ta, NULL);
    pthread_join(tb, NULL);
    CU_ASSERT_EQUAL(a.mismatches, 0);
    CU_ASSERT_EQUAL(b.mismatches, 0);
    fflush(NULL);
    pid_t child = fork();
    CU_ASSERT_FATAL(child >= 0);
    if (child == 0) {
        pool_case c = {x, want, 0};
        alarm(60); /* a hung pool would hang the child: die instead */
        quantize_again(&c);
        _exit(c.mismatches == 0 ? 0 : 1);
    }
    int status = 0;
    CU_ASSERT_EQUAL(waitpid(child, &status, 0), child);
    if (!(WIFEXITED(status) && WEXITSTATUS(status) == 0))
        fprintf(stderr, "child: status 0x%x\n", status);
    CU_ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    free(x);
    free(want);
    free(scales);
}

static const prism_test_case cases[] = {
    {"test_bf16_to_f32_known_values", test_bf16_to_f32_known_values},
    {"test_f16_to_f32_every_code", test_f16_to_f32_every_code},
    {"test_grad_stats_of_one_f32_tensor", test_grad_stats_of_one_f32_tensor},
    {"test_grad_stats_leave_nonfinite_elements_out_and_count_them",
     test_grad_stats_leave_nonfinite_elements_out_and_count_them},
    {"test_grad_stats_merge_tensors_of_every_dtype", test_grad_stats_merge_tensors_of_every_dtype},
    {"test_grad_stats_variance_survives_a_large_offset", test_grad_stats_variance_survives_a_large_offset},
    {"test_grad_stats_of_nothing_are_zero", test_grad_stats_of_nothing_are_zero},
    {"test_grad_stats_refuse_missing_data_and_unknown_dtypes", test_grad_stats_refuse_missing_data_and_unknown_dtypes},
    {"test_every_fp8_code_round_trips", test_every_fp8_code_round_trips},
    {"test_fp8_known_values_rounding_and_saturation", test_fp8_known_values_rounding_and_saturation},
    {"test_f32_to_bf16_and_f16_round_to_nearest_even", test_f32_to_bf16_and_f16_round_to_nearest_even},
    {"test_philox_matches_the_published_answers", test_philox_matches_the_published_answers},
    {"test_quant_qmax_of_every_format", test_quant_qmax_of_every_format},
    {"test_quantize_int8_per_tensor_rounds_to_nearest_even", test_quantize_int8_per_tensor_rounds_to_nearest_even},
    {"test_quantize_int4_packs_low_nibble_first_with_odd_length", test_quantize_int4_packs_low_nibble_first_with_odd_length},
    {"test_quantize_per_block_gives_one_scale_per_group", test_quantize_per_block_gives_one_scale_per_group},
    {"test_quantize_per_row_scales_each_row", test_quantize_per_row_scales_each_row},
    {"test_quantize_pow2_scale_is_the_smallest_power_that_covers_amax", test_quantize_pow2_scale_is_the_smallest_power_that_covers_amax},
    {"test_quantize_subnormal_inputs_keep_their_codes", test_quantize_subnormal_inputs_keep_their_codes},
    {"test_quantize_fp8_uses_subnormal_codes", test_quantize_fp8_uses_subnormal_codes},
    {"test_quantize_counts_nonfinite_inputs_and_writes_zero_codes", test_quantize_counts_nonfinite_inputs_and_writes_zero_codes},
    {"test_quantize_all_zeros_gives_scale_one_and_zero_codes", test_quantize_all_zeros_gives_scale_one_and_zero_codes},
    {"test_quantize_amax_always_lands_on_qmax", test_quantize_amax_always_lands_on_qmax},
    {"test_dequantize_writes_every_output_type", test_dequantize_writes_every_output_type},
    {"test_dequantize_accumulate_adds_in_fp32", test_dequantize_accumulate_adds_in_fp32},
    {"test_relative_error_known_values_and_edges", test_relative_error_known_values_and_edges},
    {"test_round_trip_error_per_format", test_round_trip_error_per_format},
    {"test_stochastic_rounding_is_unbiased_within_3_sigma", test_stochastic_rounding_is_unbiased_within_3_sigma},
    {"test_stochastic_rounding_keeps_representable_values", test_stochastic_rounding_keeps_representable_values},
    {"test_quantize_refuses_bad_specs_naming_the_field", test_quantize_refuses_bad_specs_naming_the_field},
    {"test_grad_stats_blocks_match_single_blocks_across_chunks", test_grad_stats_blocks_match_single_blocks_across_chunks},
    {"test_concurrent_and_forked_calls_give_the_same_codes", test_concurrent_and_forked_calls_give_the_same_codes},
    {NULL, NULL},
};

static const prism_test_suite suites[] = {{"kernels_cpu", cases}, {NULL, NULL}};

int main(int argc, char **argv)
{
    return prism_test_main(argc, argv, suites);
}
