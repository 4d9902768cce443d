/* Quantization with caller-given scales, its saturation and underflow counts, and the delayed
 * scale (include/prism/kernels.h, "Caller-given scales, and what quantization clipped"):
 *   - the saturation boundary of every format, just below, at and just above it, under nearest
 *     rounding and (built from the element's own random bits) stochastic rounding;
 *   - underflow, NaN/Inf, amax out, refused scales named by group, INT4 odd lengths;
 *   - given scales equal to the computed ones give prism_quantize_cpu's codes, and the counts
 *     agree with a count the test makes itself from the codes;
 *   - prism_quant_scale_delayed's values, worked out by hand;
 *   - every CPU path and thread count against the scalar reference on one thread, bit for bit
 *     (codes, scales, amax, counts), as tests/unit/test_kernels_paths.c does for the others. */
#define _POSIX_C_SOURCE 200809L
#include "testutil.h"

#include "cpu/cpu.h"
#include "prism/kernels.h"

#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define COUNT(a) (sizeof(a) / sizeof((a)[0]))

static void *xmalloc(size_t bytes)
{
    void *p = malloc(bytes ? bytes : 1);
    CU_ASSERT_PTR_NOT_NULL_FATAL(p);
    return p;
}

static const prism_precision all_formats[] = {PRISM_PRECISION_INT8, PRISM_PRECISION_FP8_E4M3,
                                              PRISM_PRECISION_FP8_E5M2, PRISM_PRECISION_INT4};
static const prism_dtype all_dtypes[] = {PRISM_DTYPE_F32, PRISM_DTYPE_BF16, PRISM_DTYPE_F16};
static const char *const dtype_names[] = {"f32", "bf16", "f16"};

/* The random word of element i under seed (kernels.h: Philox block i / 4, word i % 4). */
static uint32_t random_word(size_t i, uint64_t seed)
{
    uint32_t ctr[4] = {(uint32_t)(i / 4), (uint32_t)((uint64_t)(i / 4) >> 32), 0, 0};
    uint32_t key[2] = {(uint32_t)seed, (uint32_t)(seed >> 32)}, out[4];
    prism_philox4x32_10(ctr, key, out);
    return out[i % 4];
}

static float from_bits(uint32_t u)
{
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

static uint32_t to_bits(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

/* Quantizes n binary32 values as one tensor under the scale s; the codes and counts out. */
static prism_status quantize_one_scale(prism_precision format, prism_rounding rounding,
                                       uint64_t seed, const float *x, size_t n, float s,
                                       uint8_t *codes, prism_quant_counts *counts, float *amax)
{
    prism_quant_spec spec = {.format = format, .rounding = rounding, .seed = seed};
    prism_tensor t = {x, n, PRISM_DTYPE_F32};
    prism_error err;
    float scales[1] = {s};
    prism_status st = prism_quantize_scaled_cpu(&spec, &t, scales, codes, amax, counts, &err);
    if (st != PRISM_OK)
        fprintf(stderr, "\n  quantize_scaled: %s", err.message);
    return st;
}

/* ---- saturation boundaries ---------------------------------------------------------------- */

/* Nearest rounding: the boundaries of kernels.h, each just below, at and just above, both signs,
 * and quotients that are huge or overflow to Inf (x finite: counted as saturated). */
static void test_nearest_saturation_boundaries_of_every_format(void)
{
    const float inf = INFINITY;
    const struct {
        prism_precision format;
        float x, s;
        uint8_t code; /* INT4: the nibble */
        uint64_t saturated;
    } cases[] = {
        {PRISM_PRECISION_INT8, 127.0f, 1.0f, 0x7f, 0},
        {PRISM_PRECISION_INT8, nextafterf(127.5f, 0.0f), 1.0f, 0x7f, 0},
        {PRISM_PRECISION_INT8, 127.5f, 1.0f, 0x7f, 1},
        {PRISM_PRECISION_INT8, nextafterf(127.5f, inf), 1.0f, 0x7f, 1},
        {PRISM_PRECISION_INT8, -127.5f, 1.0f, 0x81, 1},
        {PRISM_PRECISION_INT8, nextafterf(-127.5f, 0.0f), 1.0f, 0x81, 0},
        {PRISM_PRECISION_INT8, 254.0f, 2.0f, 0x7f, 0}, /* v = 127 */
        {PRISM_PRECISION_INT8, 255.0f, 2.0f, 0x7f, 1}, /* v = 127.5 */
        {PRISM_PRECISION_INT8, 1.0f, 0x1p-140f, 0x7f, 1},
        {PRISM_PRECISION_INT8, -FLT_MAX, 0x1p-149f, 0x81, 1}, /* v = -Inf */
        {PRISM_PRECISION_INT4, 7.0f, 1.0f, 0x7, 0},
        {PRISM_PRECISION_INT4, nextafterf(7.5f, 0.0f), 1.0f, 0x7, 0},
        {PRISM_PRECISION_INT4, 7.5f, 1.0f, 0x7, 1},
        {PRISM_PRECISION_INT4, nextafterf(7.5f, inf), 1.0f, 0x7, 1},
        {PRISM_PRECISION_INT4, -7.5f, 1.0f, 0x9, 1},
        {PRISM_PRECISION_INT4, nextafterf(-7.5f, 0.0f), 1.0f, 0x9, 0},
        {PRISM_PRECISION_INT4, FLT_MAX, 0x1p-149f, 0x7, 1},
        {PRISM_PRECISION_FP8_E4M3, 448.0f, 1.0f, 0x7e, 0},
        {PRISM_PRECISION_FP8_E4M3, nextafterf(464.0f, 0.0f), 1.0f, 0x7e, 0},
        {PRISM_PRECISION_FP8_E4M3, 464.0f, 1.0f, 0x7e, 0}, /* the tie goes to even 448 */
        {PRISM_PRECISION_FP8_E4M3, nextafterf(464.0f, inf), 1.0f, 0x7e, 1},
        {PRISM_PRECISION_FP8_E4M3, -464.0f, 1.0f, 0xfe, 0},
        {PRISM_PRECISION_FP8_E4M3, nextafterf(-464.0f, -inf), 1.0f, 0xfe, 1},
        {PRISM_PRECISION_FP8_E4M3, 480.0f, 1.0f, 0x7e, 1},
        {PRISM_PRECISION_FP8_E4M3, 928.0f, 2.0f, 0x7e, 0}, /* v = 464 */
        {PRISM_PRECISION_FP8_E4M3, FLT_MAX, 0.5f, 0x7e, 1},  /* v = Inf */
        {PRISM_PRECISION_FP8_E5M2, 57344.0f, 1.0f, 0x7b, 0},
        {PRISM_PRECISION_FP8_E5M2, nextafterf(61440.0f, 0.0f), 1.0f, 0x7b, 0},
        {PRISM_PRECISION_FP8_E5M2, 61440.0f, 1.0f, 0x7b, 1}, /* the tie goes to even 65536 */
        {PRISM_PRECISION_FP8_E5M2, nextafterf(61440.0f, inf), 1.0f, 0x7b, 1},
        {PRISM_PRECISION_FP8_E5M2, -61440.0f, 1.0f, 0xfb, 1},
        {PRISM_PRECISION_FP8_E5M2, nextafterf(-61440.0f, 0.0f), 1.0f, 0xfb, 0},
        {PRISM_PRECISION_FP8_E5M2, 65536.0f, 1.0f, 0x7b, 1},
    };
    for (size_t c = 0; c < COUNT(cases); c++) {
        uint8_t code = 0xa5;
        prism_quant_counts counts = {9, 9, 9, 9};
        float amax = -1.0f;
        CU_ASSERT_EQUAL_FATAL(quantize_one_scale(cases[c].format, PRISM_ROUNDING_NEAREST, 0,
                                                 &cases[c].x, 1, cases[c].s, &code, &counts, &amax),
                              PRISM_OK);
        uint8_t got = cases[c].format == PRISM_PRECISION_INT4 ? (uint8_t)(code & 0xf) : code;
        if (got != cases[c].code || counts.saturated != cases[c].saturated)
            fprintf(stderr, "\n  case %zu: %s x=%.9g s=%g: code 0x%02x (want 0x%02x), saturated %llu",
                    c, prism_precision_name(cases[c].format), (double)cases[c].x,
                    (double)cases[c].s, got, cases[c].code, (unsigned long long)counts.saturated);
        CU_ASSERT_EQUAL(got, cases[c].code);
        CU_ASSERT_EQUAL(counts.saturated, cases[c].saturated);
        CU_ASSERT_EQUAL(counts.bad_scale, 0); /* set: the CPU refuses bad scales instead */
        CU_ASSERT_EQUAL(counts.underflowed, 0);
        CU_ASSERT_EQUAL(counts.nonfinite, 0);
        CU_ASSERT_EQUAL(amax, fabsf(cases[c].x));
    }
}

/* Stochastic rounding: each element is built from its own random word r so that its rounding sits
 * exactly one step short of going above qmax (first half) or exactly on it (second half):
 *   INT8  x = 127 + k 2^-17 (exact: the binary32 step at 127); up when r >> 8 < k * 128, so
 *         k = (r >> 8) >> 7 stays at 127 and k + 1 goes to 128 (saturated)
 *   INT4  x = 7 + k 2^-21; up when r >> 8 < k * 8: k = (r >> 8) >> 3, and k + 1
 *   E4M3  x = 448 + j binary32 steps (20 bits dropped): up to 480 when j + (r & 0xfffff) >= 2^20,
 *         so j = 2^20 - 1 - (r & 0xfffff) stays at 448 and one step more goes above
 *   E5M2  the same from 57344 with 21 bits.
 * The codes are qmax's in both halves; only the second half counts. */
static void test_stochastic_saturation_boundaries_of_every_format(void)
{
    const size_t half = 500, n = 2 * half;
    const uint64_t seed = 0x5a7a5a7a12345678ull;
    float *x = xmalloc(n * sizeof *x);
    uint8_t *codes = xmalloc(n);
    for (size_t f = 0; f < COUNT(all_formats); f++) {
        prism_precision format = all_formats[f];
        for (size_t i = 0; i < n; i++) {
            uint32_t r = random_word(i, seed), r24 = r >> 8, up = (uint32_t)(i >= half);
            switch (format) {
            case PRISM_PRECISION_INT8: x[i] = 127.0f + (float)((r24 >> 7) + up) * 0x1p-17f; break;
            case PRISM_PRECISION_INT4: x[i] = 7.0f + (float)((r24 >> 3) + up) * 0x1p-21f; break;
            case PRISM_PRECISION_FP8_E4M3:
                x[i] = from_bits(to_bits(448.0f) + (1u << 20) - 1u - (r & 0xfffffu) + up);
                break;
            default: x[i] = from_bits(to_bits(57344.0f) + (1u << 21) - 1u - (r & 0x1fffffu) + up);
                break;
            }
            if (format == PRISM_PRECISION_FP8_E4M3 || format == PRISM_PRECISION_FP8_E5M2)
                if (i % 3 == 1)
                    x[i] = -x[i]; /* FP8 rounds the magnitude: either sign */
        }
        prism_quant_counts counts;
        float amax;
        size_t bytes = format == PRISM_PRECISION_INT4 ? n / 2 : n;
        /* The first half alone: nothing saturates. */
        CU_ASSERT_EQUAL_FATAL(quantize_one_scale(format, PRISM_ROUNDING_STOCHASTIC, seed, x, half,
                                                 1.0f, codes, &counts, &amax),
                              PRISM_OK);
        CU_ASSERT_EQUAL(counts.saturated, 0);
        CU_ASSERT_EQUAL_FATAL(quantize_one_scale(format, PRISM_ROUNDING_STOCHASTIC, seed, x, n, 1.0f,
                                                 codes, &counts, &amax),
                              PRISM_OK);
        if (counts.saturated != half)
            fprintf(stderr, "\n  %s: saturated %llu, want %zu", prism_precision_name(format),
                    (unsigned long long)counts.saturated, half);
        CU_ASSERT_EQUAL(counts.saturated, half);
        CU_ASSERT_EQUAL(counts.underflowed, 0);
        size_t wrong = 0;
        for (size_t b = 0; b < bytes; b++) {
            uint8_t want;
            switch (format) {
            case PRISM_PRECISION_INT8: want = 0x7f; break;
            case PRISM_PRECISION_INT4: want = 0x77; break;
            case PRISM_PRECISION_FP8_E4M3: want = (uint8_t)(0x7e | (b % 3 == 1 ? 0x80 : 0)); break;
            default: want = (uint8_t)(0x7b | (b % 3 == 1 ? 0x80 : 0)); break;
            }
            wrong += (size_t)(codes[b] != want);
        }
        CU_ASSERT_EQUAL(wrong, 0);
    }
    /* Integers already on the grid: 127 never goes up, 128 is beyond whatever the bits say. */
    const float ints[4] = {127.0f, -127.0f, 128.0f, -128.0f};
    uint8_t c4[4];
    prism_quant_counts counts;
    CU_ASSERT_EQUAL_FATAL(quantize_one_scale(PRISM_PRECISION_INT8, PRISM_ROUNDING_STOCHASTIC, seed,
                                             ints, 4, 1.0f, c4, &counts, NULL),
                          PRISM_OK);
    CU_ASSERT_EQUAL(counts.saturated, 2);
    CU_ASSERT_EQUAL(c4[0], 0x7f);
    CU_ASSERT_EQUAL(c4[1], 0x81);
    CU_ASSERT_EQUAL(c4[2], 0x7f);
    CU_ASSERT_EQUAL(c4[3], 0x81);
    free(x);
    free(codes);
}

/* ---- underflow, NaN/Inf, amax, groups -------------------------------------------------------- */

static void test_underflow_counts_nonzero_values_coded_zero(void)
{
    const float nearest_int[8] = {0.5f, -0.5f, nextafterf(0.5f, 1.0f), 0.0f, -0.0f, 1e-45f,
                                  nextafterf(0.5f, 0.0f), 1.5f};
    uint8_t codes[8];
    prism_quant_counts counts;
    CU_ASSERT_EQUAL_FATAL(quantize_one_scale(PRISM_PRECISION_INT8, PRISM_ROUNDING_NEAREST, 0,
                                             nearest_int, 8, 1.0f, codes, &counts, NULL),
                          PRISM_OK);
    const uint8_t want8[8] = {0, 0, 1, 0, 0, 0, 0, 2};
    CU_ASSERT_EQUAL(memcmp(codes, want8, 8), 0);
    CU_ASSERT_EQUAL(counts.underflowed, 4);
    CU_ASSERT_EQUAL(counts.saturated, 0);
    CU_ASSERT_EQUAL_FATAL(quantize_one_scale(PRISM_PRECISION_INT4, PRISM_ROUNDING_NEAREST, 0,
                                             nearest_int, 8, 1.0f, codes, &counts, NULL),
                          PRISM_OK);
    const uint8_t want4[4] = {0x00, 0x01, 0x00, 0x20};
    CU_ASSERT_EQUAL(memcmp(codes, want4, 4), 0);
    CU_ASSERT_EQUAL(counts.underflowed, 4);

    /* E4M3: 2^-10 is the tie between 0 and the smallest subnormal 2^-9 (even: 0). */
    const float e4m3[7] = {0x1p-10f, -0x1p-10f, nextafterf(0x1p-10f, 1.0f), 0x1p-9f, 0.0f, -0.0f,
                           0x1p-12f};
    CU_ASSERT_EQUAL_FATAL(quantize_one_scale(PRISM_PRECISION_FP8_E4M3, PRISM_ROUNDING_NEAREST, 0,
                                             e4m3, 7, 1.0f, codes, &counts, NULL),
                          PRISM_OK);
    const uint8_t want_e4m3[7] = {0, 0, 1, 1, 0, 0, 0};
    CU_ASSERT_EQUAL(memcmp(codes, want_e4m3, 7), 0);
    CU_ASSERT_EQUAL(counts.underflowed, 3);
    /* E5M2: 2^-17 ties 0 and 2^-16. */
    const float e5m2[4] = {0x1p-17f, -0x1p-17f, nextafterf(0x1p-17f, 1.0f), 0x1p-16f};
    CU_ASSERT_EQUAL_FATAL(quantize_one_scale(PRISM_PRECISION_FP8_E5M2, PRISM_ROUNDING_NEAREST, 0,
                                             e5m2, 4, 1.0f, codes, &counts, NULL),
                          PRISM_OK);
    const uint8_t want_e5m2[4] = {0, 0, 1, 1};
    CU_ASSERT_EQUAL(memcmp(codes, want_e5m2, 4), 0);
    CU_ASSERT_EQUAL(counts.underflowed, 2);
    /* A large scale: 1 / 1000 rounds to 0. */
    const float one = 1.0f;
    CU_ASSERT_EQUAL_FATAL(quantize_one_scale(PRISM_PRECISION_INT8, PRISM_ROUNDING_NEAREST, 0, &one,
                                             1, 1000.0f, codes, &counts, NULL),
                          PRISM_OK);
    CU_ASSERT_EQUAL(codes[0], 0);
    CU_ASSERT_EQUAL(counts.underflowed, 1);

    /* Stochastic: x = k 2^-24 goes up to 1 when r >> 8 < k: k = r >> 8 stays 0 (counted), k + 1
     * goes to 1. */
    const size_t half = 300, n = 2 * half;
    const uint64_t seed = 77;
    float *x = xmalloc(n * sizeof *x);
    uint8_t *c = xmalloc(n);
    for (size_t i = 0; i < n; i++)
        x[i] = (float)((random_word(i, seed) >> 8) + (i >= half)) * 0x1p-24f;
    CU_ASSERT_EQUAL_FATAL(quantize_one_scale(PRISM_PRECISION_INT8, PRISM_ROUNDING_STOCHASTIC, seed,
                                             x, n, 1.0f, c, &counts, NULL),
                          PRISM_OK);
    size_t zeros = 0, zero_x = 0;
    for (size_t i = 0; i < n; i++) {
        zeros += (size_t)(c[i] == 0);
        zero_x += (size_t)(x[i] == 0.0f);
    }
    CU_ASSERT_EQUAL(zeros, half);
    CU_ASSERT_EQUAL(counts.underflowed, half - zero_x);
    free(x);
    free(c);
}

/* NaN and +-Inf: code 0, counted apart, left out of amax. Groups: each its own scale and amax. */
static void test_nonfinite_amax_and_groups(void)
{
    const float x[5] = {NAN, INFINITY, -INFINITY, 1000.0f, 0.001f};
    uint8_t codes[5];
    prism_quant_counts counts;
    float amax;
    CU_ASSERT_EQUAL_FATAL(quantize_one_scale(PRISM_PRECISION_INT8, PRISM_ROUNDING_NEAREST, 0, x, 5,
                                             1.0f, codes, &counts, &amax),
                          PRISM_OK);
    const uint8_t want[5] = {0, 0, 0, 0x7f, 0};
    CU_ASSERT_EQUAL(memcmp(codes, want, 5), 0);
    CU_ASSERT_EQUAL(counts.saturated, 1);
    CU_ASSERT_EQUAL(counts.underflowed, 1);
    CU_ASSERT_EQUAL(counts.nonfinite, 3);
    CU_ASSERT_EQUAL(amax, 1000.0f);

    /* Blocks of 3 over 8 elements (the last block of 2): scales 1, 1, 0.5. */
    const float g[8] = {1.0f, -5.0f, 2.0f, NAN, 0.0f, -0.0f, -0.25f, 3.0f};
    const float scales[3] = {1.0f, 1.0f, 0.5f};
    float amaxes[3] = {-1, -1, -1};
    prism_quant_spec spec = {.format = PRISM_PRECISION_INT8,
                             .granularity = PRISM_GRANULARITY_BLOCK,
                             .group = 3};
    prism_tensor t = {g, 8, PRISM_DTYPE_F32};
    prism_error err;
    uint8_t c8[8];
    CU_ASSERT_EQUAL_FATAL(prism_quantize_scaled_cpu(&spec, &t, scales, c8, amaxes, &counts, &err),
                          PRISM_OK);
    const uint8_t want_g[8] = {1, 0xfb, 2, 0, 0, 0, 0, 6}; /* -0.25 / 0.5 = -0.5: rounds to 0 */
    CU_ASSERT_EQUAL(memcmp(c8, want_g, 8), 0);
    CU_ASSERT_EQUAL(amaxes[0], 5.0f);
    CU_ASSERT_EQUAL(amaxes[1], 0.0f);
    CU_ASSERT_EQUAL(amaxes[2], 3.0f);
    CU_ASSERT_EQUAL(counts.saturated, 0);
    CU_ASSERT_EQUAL(counts.underflowed, 1);
    CU_ASSERT_EQUAL(counts.nonfinite, 1);
    /* Rows of 4, with one scale too small for the second row. */
    const float rows_scales[2] = {0.5f, 0.01f};
    spec.granularity = PRISM_GRANULARITY_ROW;
    spec.group = 4;
    CU_ASSERT_EQUAL_FATAL(prism_quantize_scaled_cpu(&spec, &t, rows_scales, c8, amaxes, &counts, &err),
                          PRISM_OK);
    /* Row 1 over 0.5: 2, -10, 4, NaN. Row 2: 0 / 0.01, -0 / 0.01, -0.25 / 0.01 = -25, 3 / 0.01 = 300 (saturated). */
    CU_ASSERT_EQUAL(c8[0], 2);
    CU_ASSERT_EQUAL(c8[1], 0xf6);
    CU_ASSERT_EQUAL(c8[2], 4);
    CU_ASSERT_EQUAL(c8[3], 0);
    CU_ASSERT_EQUAL(c8[4], 0);
    CU_ASSERT_EQUAL(c8[5], 0);
    CU_ASSERT_EQUAL(c8[6], 0xe7);
    CU_ASSERT_EQUAL(c8[7], 0x7f);
    CU_ASSERT_EQUAL(amaxes[0], 5.0f);
    CU_ASSERT_EQUAL(amaxes[1], 3.0f);
    CU_ASSERT_EQUAL(counts.saturated, 1);
    CU_ASSERT_EQUAL(counts.underflowed, 0);
    CU_ASSERT_EQUAL(counts.nonfinite, 1);
}

/* A scale that is not finite and > 0 is refused naming its group, before anything is written. */
static void test_bad_scales_are_refused_by_group(void)
{
    float x[6] = {1, 2, 3, 4, 5, 6};
    prism_quant_spec spec = {.format = PRISM_PRECISION_INT8,
                             .granularity = PRISM_GRANULARITY_BLOCK,
                             .group = 2};
    prism_tensor t = {x, 6, PRISM_DTYPE_F32};
    const struct {
        float scales[3];
        const char *message;
    } cases[] = {
        {{1.0f, 0.0f, 1.0f}, "scales[1]: 0 is not a finite scale > 0"},
        {{1.0f, -1.0f, 1.0f}, "scales[1]: -1 is not a finite scale > 0"},
        {{1.0f, 1.0f, NAN}, "scales[2]: nan is not a finite scale > 0"},
        {{INFINITY, 1.0f, 1.0f}, "scales[0]: inf is not a finite scale > 0"},
        {{1.0f, -0.0f, 1.0f}, "scales[1]: -0 is not a finite scale > 0"},
    };
    for (size_t c = 0; c < COUNT(cases); c++) {
        uint8_t codes[6];
        float amax[3] = {-1, -1, -1};
        prism_quant_counts counts = {7, 7, 7, 7};
        prism_error err = {0};
        memset(codes, 0xa5, sizeof codes);
        CU_ASSERT_EQUAL(prism_quantize_scaled_cpu(&spec, &t, cases[c].scales, codes, amax, &counts, &err),
                        PRISM_ERR_INVALID);
        CU_ASSERT_STRING_EQUAL(err.message, cases[c].message);
        CU_ASSERT_EQUAL(codes[0], 0xa5);
        CU_ASSERT_EQUAL(amax[0], -1.0f);
        CU_ASSERT_EQUAL(counts.saturated, 7);
    }
    prism_error err = {0};
    uint8_t codes[6];
    CU_ASSERT_EQUAL(prism_quantize_scaled_cpu(&spec, &t, NULL, codes, NULL, NULL, &err),
                    PRISM_ERR_INVALID);
    CU_ASSERT_STRING_EQUAL(err.message, "quantize: codes or scales is NULL");
    /* Nothing to quantize: no scales needed, counts zeroed. */
    prism_tensor empty = {NULL, 0, PRISM_DTYPE_F32};
    prism_quant_counts counts = {7, 7, 7, 7};
    CU_ASSERT_EQUAL(prism_quantize_scaled_cpu(&spec, &empty, NULL, NULL, NULL, &counts, &err), PRISM_OK);
    CU_ASSERT_EQUAL(counts.saturated + counts.underflowed + counts.nonfinite, 0);
    CU_ASSERT_EQUAL(prism_quantize_counted_cpu(&spec, &empty, NULL, NULL, &counts, &err), PRISM_OK);
}

/* INT4 with an odd numel: the last byte's high nibble is 0, whatever was there; every
 * granularity. */
static void test_int4_odd_lengths(void)
{
    const float x[7] = {1, 2, 3, -1, -2, -3, 7};
    const uint8_t want[4] = {0x21, 0xf3, 0xde, 0x07};
    const struct {
        prism_granularity granularity;
        size_t group;
    } grans[] = {{PRISM_GRANULARITY_TENSOR, 0}, {PRISM_GRANULARITY_ROW, 7},
                 {PRISM_GRANULARITY_BLOCK, 3}, {PRISM_GRANULARITY_BLOCK, 1}};
    const float ones[7] = {1, 1, 1, 1, 1, 1, 1};
    for (size_t g = 0; g < COUNT(grans); g++) {
        prism_quant_spec spec = {.format = PRISM_PRECISION_INT4,
                                 .granularity = grans[g].granularity,
                                 .group = grans[g].group};
        prism_tensor t = {x, 7, PRISM_DTYPE_F32};
        uint8_t codes[4];
        memset(codes, 0xff, sizeof codes);
        prism_quant_counts counts;
        prism_error err;
        CU_ASSERT_EQUAL_FATAL(prism_quantize_scaled_cpu(&spec, &t, ones, codes, NULL, &counts, &err),
                              PRISM_OK);
        CU_ASSERT_EQUAL(memcmp(codes, want, 4), 0);
        CU_ASSERT_EQUAL(counts.saturated, 0);
    }
}

/* ---- the delayed scale ------------------------------------------------------------------------ */

static void test_delayed_scale_values(void)
{
    const float inf = INFINITY;
    const struct {
        float hist_max;
        int margin;
        prism_precision format;
        float want;
    } cases[] = {
        {254.0f, 0, PRISM_PRECISION_INT8, 2.0f},
        {254.0f, 1, PRISM_PRECISION_INT8, 4.0f},
        {254.0f, -1, PRISM_PRECISION_INT8, 1.0f},
        {448.0f, -1, PRISM_PRECISION_FP8_E4M3, 0.5f},
        {57344.0f, 3, PRISM_PRECISION_FP8_E5M2, 8.0f},
        {14.0f, 2, PRISM_PRECISION_INT4, 8.0f},
        {1.0f, 0, PRISM_PRECISION_INT8, 1.0f / 127.0f},
        {0.0f, 0, PRISM_PRECISION_INT8, 1.0f},
        {-3.0f, 0, PRISM_PRECISION_INT8, 1.0f},
        {NAN, 0, PRISM_PRECISION_INT8, 1.0f},
        {inf, 0, PRISM_PRECISION_INT8, 1.0f},
        {5.0f, 0, PRISM_PRECISION_BF16, 1.0f},
        {FLT_MAX, 1, PRISM_PRECISION_INT4, FLT_MAX},  /* 2 FLT_MAX overflows before the division */
        {FLT_MAX, 0, PRISM_PRECISION_INT4, FLT_MAX / 7.0f},
        {0x1p100f, 100, PRISM_PRECISION_INT8, FLT_MAX},
        {0x1p100f, 1000, PRISM_PRECISION_INT8, FLT_MAX},
        {0x1p-149f, 0, PRISM_PRECISION_INT8, 0x1p-149f}, /* 2^-149 / 127 underflows to 0 */
        {1.0f, -200, PRISM_PRECISION_INT8, 0x1p-149f},
        {1.0f, -100000, PRISM_PRECISION_INT8, 0x1p-149f},
        {1.0f, -140, PRISM_PRECISION_INT8, 0x1p-140f / 127.0f},
        /* 1 + 2^-23 times 2^-130 is subnormal: rounded once to 2^-130, then / 7. */
        {1.00000012f, -130, PRISM_PRECISION_INT4, 0x1p-130f / 7.0f},
        /* 1.5 * 2^-149 ties 2^-149 and 2^-148 (even: 2^-148); / 7 then underflows to 0. */
        {1.5f, -149, PRISM_PRECISION_INT4, 0x1p-149f},
    };
    for (size_t c = 0; c < COUNT(cases); c++) {
        float got = prism_quant_scale_delayed(cases[c].hist_max, cases[c].margin, cases[c].format);
        if (to_bits(got) != to_bits(cases[c].want))
            fprintf(stderr, "\n  case %zu: got %a, want %a", c, (double)got, (double)cases[c].want);
        CU_ASSERT_EQUAL(to_bits(got), to_bits(cases[c].want));
    }
    /* Margin 0 on a group's amax is the FP32 scale prism_quantize_cpu computes, and the result
     * is ldexpf then one division, over many values. */
    uint64_t s = 12345;
    size_t wrong = 0;
    for (int k = 0; k < 20000; k++) {
        s = s * 6364136223846793005ull + 1442695040888963407ull;
        float h = from_bits((uint32_t)(s >> 33) % 0x7f800000u);
        int margin = (int)((s >> 20) % 41) - 20;
        for (size_t f = 0; f < COUNT(all_formats); f++) {
            float q = prism_quant_qmax(all_formats[f]);
            float want = h > 0.0f ? ldexpf(h, margin) / q : 1.0f;
            if (isinf(want))
                want = FLT_MAX;
            else if (want == 0.0f)
                want = 0x1p-149f;
            wrong += (size_t)(to_bits(prism_quant_scale_delayed(h, margin, all_formats[f])) != to_bits(want));
            if (margin == 0 && h > 0.0f) {
                prism_quant_spec spec = {.format = all_formats[f]};
                prism_tensor t = {&h, 1, PRISM_DTYPE_F32};
                uint8_t code[1];
                float scale;
                prism_error err;
                if (prism_quantize_cpu(&spec, &t, code, &scale, NULL, &err) == PRISM_OK)
                    wrong += (size_t)(to_bits(scale) != to_bits(prism_quant_scale_delayed(h, 0, all_formats[f])));
                else
                    wrong++;
            }
        }
    }
    CU_ASSERT_EQUAL(wrong, 0);
}

/* ---- inputs for the tables -------------------------------------------------------------------- */

static uint64_t next_random(uint64_t *state) /* splitmix64 */
{
    uint64_t z = (*state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static double uniform01(uint64_t *state)
{
    return (double)(next_random(state) >> 11) * 0x1p-53;
}

/* n elements of dtype: wide magnitudes, ties, +-0, subnormal-ish values, ~1% NaN/Inf. */
static void *make_input(prism_dtype dtype, size_t n, uint64_t seed)
{
    void *data = xmalloc(n * (dtype == PRISM_DTYPE_F32 ? 4 : 2));
    uint64_t state = seed;
    for (size_t i = 0; i < n; i++) {
        uint64_t pick = next_random(&state) % 1000;
        float sign = next_random(&state) & 1 ? -1.0f : 1.0f, v;
        if (pick < 4)
            v = NAN;
        else if (pick < 8)
            v = sign * INFINITY;
        else if (pick < 30)
            v = sign * 0.0f;
        else if (pick < 130)
            v = sign * (float)ldexp(1.0 + uniform01(&state), (int)(next_random(&state) % 49) - 40);
        else if (pick < 230)
            v = (float)((int)(next_random(&state) % 129) - 64) / 8.0f;
        else
            v = (float)((uniform01(&state) + uniform01(&state) + uniform01(&state) - 1.5) * 3.0);
        if (dtype == PRISM_DTYPE_F32)
            ((float *)data)[i] = v;
        else
            ((uint16_t *)data)[i] = dtype == PRISM_DTYPE_BF16 ? prism_f32_to_bf16(v) : prism_f32_to_f16(v);
    }
    return data;
}

static float element(const prism_tensor *x, size_t i)
{
    switch (x->dtype) {
    case PRISM_DTYPE_BF16: return prism_bf16_to_f32(((const uint16_t *)x->data)[i]);
    case PRISM_DTYPE_F16: return prism_f16_to_f32(((const uint16_t *)x->data)[i]);
    default: return ((const float *)x->data)[i];
    }
}

static uint8_t code_of(const uint8_t *codes, prism_precision format, size_t i)
{
    if (format != PRISM_PRECISION_INT4)
        return codes[i];
    return (uint8_t)(i % 2 ? codes[i / 2] >> 4 : codes[i / 2] & 0xf);
}

typedef struct grouping {
    prism_granularity granularity;
    size_t group;
    const char *name;
} grouping;

static const grouping groupings[] = {
    {PRISM_GRANULARITY_TENSOR, 0, "tensor"},   {PRISM_GRANULARITY_ROW, 0, "row"},
    {PRISM_GRANULARITY_BLOCK, 128, "block128"}, {PRISM_GRANULARITY_BLOCK, 7, "block7"},
    {PRISM_GRANULARITY_BLOCK, 1, "block1"},     {PRISM_GRANULARITY_BLOCK, 20001, "block20001"},
};

/* A row length dividing n (the largest odd divisor up to 150, else n itself). */
static size_t row_of(size_t n)
{
    for (size_t d = 150; d >= 2; d--)
        if (n % d == 0 && d % 2 == 1)
            return d;
    return n ? n : 1;
}

/* ---- given scales equal to the computed ones ------------------------------------------------- */

/* Counts the test makes itself, nearest rounding: saturated when |x / s| reaches the boundary
 * of the format (kernels.h), underflowed when a non-zero finite x has code 0. */
static void own_counts(const prism_quant_spec *spec, const prism_tensor *x, const float *scales,
                       size_t group_len, const uint8_t *codes, prism_quant_counts *out)
{
    prism_quant_counts c = {0};
    for (size_t i = 0; i < x->numel; i++) {
        float v = element(x, i);
        if (isnan(v) || isinf(v)) {
            c.nonfinite++;
            continue;
        }
        float q = fabsf(v / scales[i / group_len]);
        int sat;
        switch (spec->format) {
        case PRISM_PRECISION_INT8: sat = q >= 127.5f; break;
        case PRISM_PRECISION_INT4: sat = q >= 7.5f; break;
        case PRISM_PRECISION_FP8_E4M3: sat = q > 464.0f; break;
        default: sat = q >= 61440.0f; break;
        }
        c.saturated += (uint64_t)sat;
        c.underflowed += (uint64_t)(v != 0.0f && code_of(codes, spec->format, i) == 0);
    }
    *out = c;
}

static bool same_counts(const prism_quant_counts *a, const prism_quant_counts *b)
{
    return a->saturated == b->saturated && a->underflowed == b->underflowed &&
           a->nonfinite == b->nonfinite;
}

/* For every format x grouping x dtype x rounding x scale mode x length: prism_quantize_counted_cpu
 * gives prism_quantize_cpu's codes, scales and NaN/Inf count; prism_quantize_scaled_cpu with
 * those scales gives the same codes and counts, and amaxes whose FP32 scale is the scale (or,
 * POW2, that the scale covers); nearest rounding never counts a saturation under computed scales,
 * and its counts are the test's own. Then the scales halved and quartered: the counts are still
 * the test's own (nearest). */
static void test_given_scales_reproduce_quantize_and_counts(void)
{
    static const size_t lengths[] = {1, 7, 128, 129, 2049, 70001};
    size_t configs = 0, failures = 0;
    for (size_t l = 0; l < COUNT(lengths); l++) {
        size_t n = lengths[l];
        for (size_t d = 0; d < COUNT(all_dtypes); d++) {
            void *data = make_input(all_dtypes[d], n, 31 * n + d);
            prism_tensor x = {data, n, all_dtypes[d]};
            for (size_t f = 0; f < COUNT(all_formats); f++)
                for (size_t g = 0; g < COUNT(groupings); g++)
                    for (int mode = 0; mode < 4; mode++) {
                        prism_quant_spec spec = {.format = all_formats[f],
                                                 .granularity = groupings[g].granularity,
                                                 .group = groupings[g].granularity == PRISM_GRANULARITY_ROW
                                                              ? row_of(n)
                                                              : groupings[g].group,
                                                 .scale_mode = (prism_scale_mode)(mode & 1),
                                                 .rounding = (prism_rounding)(mode >> 1),
                                                 .seed = 0xabcull + configs};
                        size_t groups, group_len, bytes;
                        prism_error err = {0};
                        CU_ASSERT_EQUAL_FATAL(prism_quant_layout(&spec, n, &groups, &group_len, &bytes, &err),
                                              PRISM_OK);
                        uint8_t *cq = xmalloc(bytes), *cc = xmalloc(bytes), *cs = xmalloc(bytes);
                        float *sq = xmalloc(groups * 4), *sc = xmalloc(groups * 4), *am = xmalloc(groups * 4);
                        uint64_t bad = 9;
                        prism_quant_counts counted = {9, 9, 9, 9}, scaled = {8, 8, 8, 8}, own;
                        bool ok = prism_quantize_cpu(&spec, &x, cq, sq, &bad, &err) == PRISM_OK &&
                                  prism_quantize_counted_cpu(&spec, &x, cc, sc, &counted, &err) == PRISM_OK &&
                                  prism_quantize_scaled_cpu(&spec, &x, sq, cs, am, &scaled, &err) == PRISM_OK;
                        ok = ok && memcmp(cq, cc, bytes) == 0 && memcmp(cq, cs, bytes) == 0 &&
                             memcmp(sq, sc, groups * 4) == 0 && counted.nonfinite == bad &&
                             same_counts(&counted, &scaled);
                        for (size_t k = 0; ok && k < groups; k++) {
                            float want = spec.scale_mode == PRISM_SCALE_FP32
                                             ? prism_quant_scale_delayed(am[k], 0, spec.format)
                                             : sq[k];
                            /* POW2: the power of two covers amax (FP32's quotient may round
                             * below it). */
                            ok = to_bits(want) == to_bits(sq[k]) &&
                                 (spec.scale_mode == PRISM_SCALE_FP32 ||
                                  am[k] <= prism_quant_qmax(spec.format) * sq[k]);
                        }
                        if (ok && spec.rounding == PRISM_ROUNDING_NEAREST) {
                            own_counts(&spec, &x, sq, group_len, cq, &own);
                            ok = counted.saturated == 0 && same_counts(&own, &counted);
                            /* Smaller scales: now things saturate. */
                            for (size_t k = 0; k < groups; k++)
                                sq[k] = sq[k] * (k % 2 ? 0.25f : 0.5f);
                            ok = ok && prism_quantize_scaled_cpu(&spec, &x, sq, cs, am, &scaled, &err) == PRISM_OK;
                            own_counts(&spec, &x, sq, group_len, cs, &own);
                            ok = ok && same_counts(&own, &scaled);
                        }
                        if (!ok && failures++ < 10)
                            fprintf(stderr, "\n  %s %s(%zu) %s %s %s n=%zu: differs (%s)",
                                    prism_precision_name(spec.format), groupings[g].name, spec.group,
                                    dtype_names[d], mode & 1 ? "pow2" : "fp32",
                                    mode >> 1 ? "stochastic" : "nearest", n, err.message);
                        configs++;
                        free(cq);
                        free(cc);
                        free(cs);
                        free(sq);
                        free(sc);
                        free(am);
                    }
            free(data);
        }
    }
    printf("(%zu configurations) ", configs);
    CU_ASSERT_EQUAL(failures, 0);
}

/* ---- every path and thread count ------------------------------------------------------------ */

static const prism_cpu_path *avx2_path(void)
{
#if PRISM_CPU_HAVE_AVX2
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("f16c"))
        return &prism_cpu_avx2;
#endif
    return NULL;
}

typedef struct runner {
    const prism_cpu_path *path;
    int threads;
} runner;

static unsigned mismatches;

static void note(const char *what, const char *label, runner r)
{
    if (mismatches++ < 12)
        fprintf(stderr, "\n  %s differs: %s, %s path on %d threads", what, label, r.path->name, r.threads);
}

/* The runs compared with the scalar path on one thread: AVX2 on automatic threads and on one;
 * for inputs of several driver tasks also the scalar path on automatic or three threads, taking
 * turns (a long input costs two scalar runs, not three). */
static unsigned scalar_turn;

static size_t runners_for(size_t numel, runner out[3])
{
    size_t n = 0;
    if (avx2_path()) {
        out[n++] = (runner){avx2_path(), 0};
        out[n++] = (runner){avx2_path(), 1};
    }
    if (numel > (size_t)64 * 1024)
        out[n++] = (runner){&prism_cpu_scalar, scalar_turn++ % 2 ? 3 : 0};
    return n;
}

/* One configuration on every runner: the counted quantizer (codes, scales, counts) and the scaled
 * one under the computed scales times factors that make values saturate and underflow (codes,
 * amax, counts). */
static void compare_paths(const prism_quant_spec *spec, const prism_tensor *x, const char *label)
{
    size_t groups, group_len, bytes, n = x->numel;
    prism_error err;
    if (prism_quant_layout(spec, n, &groups, &group_len, &bytes, &err) != PRISM_OK) {
        note("layout", label, (runner){&prism_cpu_scalar, 1});
        return;
    }
    runner ref = {&prism_cpu_scalar, 1}, runs[3];
    size_t nruns = runners_for(n, runs);
    uint8_t *c_ref = xmalloc(bytes), *c = xmalloc(bytes);
    float *s_ref = xmalloc(groups * 4), *s = xmalloc(groups * 4);
    float *a_ref = xmalloc(groups * 4), *a = xmalloc(groups * 4);
    prism_quant_counts k_ref, k;
    memset(c_ref, 0x5a, bytes);
    if (prism_quantize_counted_with(ref.path, 1, spec, x, c_ref, s_ref, &k_ref, &err) != PRISM_OK)
        note("counted status", label, ref);
    for (size_t r = 0; r < nruns; r++) {
        memset(c, 0x5a, bytes);
        memset(s, 0x5a, groups * 4);
        if (prism_quantize_counted_with(runs[r].path, runs[r].threads, spec, x, c, s, &k, &err) != PRISM_OK)
            note("counted status", label, runs[r]);
        if (memcmp(c_ref, c, bytes) != 0)
            note("counted codes", label, runs[r]);
        if (memcmp(s_ref, s, groups * 4) != 0)
            note("counted scales", label, runs[r]);
        if (!same_counts(&k_ref, &k))
            note("counted counts", label, runs[r]);
    }
    /* Scales from a quarter to four times the computed ones. */
    static const float factors[] = {0.25f, 0.3f, 1.0f, 0.71f, 4.0f, 0.1f, 1.9f};
    for (size_t g = 0; g < groups; g++) {
        float f = s_ref[g] * factors[g % COUNT(factors)];
        s_ref[g] = f > 0.0f && !isinf(f) ? f : s_ref[g]; /* stay a valid scale */
    }
    memset(c_ref, 0x5a, bytes);
    if (prism_quantize_scaled_with(ref.path, 1, spec, x, s_ref, c_ref, a_ref, &k_ref, &err) != PRISM_OK)
        note("scaled status", label, ref);
    for (size_t r = 0; r < nruns; r++) {
        memset(c, 0x5a, bytes);
        memset(a, 0x5a, groups * 4);
        if (prism_quantize_scaled_with(runs[r].path, runs[r].threads, spec, x, s_ref, c, a, &k, &err) != PRISM_OK)
            note("scaled status", label, runs[r]);
        if (memcmp(c_ref, c, bytes) != 0)
            note("scaled codes", label, runs[r]);
        if (memcmp(a_ref, a, groups * 4) != 0)
            note("scaled amax", label, runs[r]);
        if (!same_counts(&k_ref, &k))
            note("scaled counts", label, runs[r]);
    }
    free(c_ref);
    free(c);
    free(s_ref);
    free(s);
    free(a_ref);
    free(a);
}

/* Every format x grouping x dtype x rounding x scale mode on short lengths; then one long input,
 * cut into tasks and run on threads, for every format x grouping (but the two slowest) x
 * rounding, the dtype and scale mode taking turns. */
static void test_every_path_counts_like_the_reference(void)
{
    mismatches = 0;
    if (!avx2_path())
        printf("(SKIPPED: no AVX2) ");
    static const size_t lengths[] = {0, 1, 2, 15, 16, 17, 33, 127, 129, 2049};
    size_t configs = 0;
    char label[160];
    for (size_t l = 0; l < COUNT(lengths); l++) {
        size_t n = lengths[l];
        for (size_t d = 0; d < COUNT(all_dtypes); d++) {
            void *data = make_input(all_dtypes[d], n, 1000 * n + d);
            prism_tensor x = {data, n, all_dtypes[d]};
            for (size_t f = 0; f < COUNT(all_formats); f++)
                for (size_t g = 0; g < COUNT(groupings); g++)
                    for (int mode = 0; mode < 4; mode++) {
                        prism_quant_spec spec = {.format = all_formats[f],
                                                 .granularity = groupings[g].granularity,
                                                 .group = groupings[g].granularity == PRISM_GRANULARITY_ROW
                                                              ? row_of(n)
                                                              : groupings[g].group,
                                                 .scale_mode = (prism_scale_mode)(mode & 1),
                                                 .rounding = (prism_rounding)(mode >> 1),
                                                 .seed = 0xfeedull + configs};
                        snprintf(label, sizeof label, "%s %s(%zu) %s %s %s n=%zu",
                                 prism_precision_name(spec.format), groupings[g].name, spec.group,
                                 dtype_names[d], mode & 1 ? "pow2" : "fp32",
                                 mode >> 1 ? "stochastic" : "nearest", n);
                        compare_paths(&spec, &x, label);
                        configs++;
                    }
            free(data);
        }
    }
    /* Over 1.3M elements (5 * 3^3 * 7 * 19 * 73, odd: INT4's last byte; rows of 135). */
    const size_t n = 1310715;
    void *inputs[3];
    for (size_t d = 0; d < 3; d++)
        inputs[d] = make_input(all_dtypes[d], n, 77 + d);
    for (size_t f = 0; f < COUNT(all_formats); f++)
        for (size_t g = 0; g < 4; g++) /* tensor, row, block128, block7 */
            for (int stochastic = 0; stochastic < 2; stochastic++) {
                size_t d = configs % 3;
                prism_quant_spec spec = {.format = all_formats[f],
                                         .granularity = groupings[g].granularity,
                                         .group = groupings[g].granularity == PRISM_GRANULARITY_ROW
                                                      ? row_of(n)
                                                      : groupings[g].group,
                                         .scale_mode = (prism_scale_mode)((configs / 3) % 2),
                                         .rounding = (prism_rounding)stochastic,
                                         .seed = 0x0123456789ull + configs};
                prism_tensor x = {inputs[d], n, all_dtypes[d]};
                snprintf(label, sizeof label, "%s %s(%zu) %s %s %s n=%zu",
                         prism_precision_name(spec.format), groupings[g].name, spec.group, dtype_names[d],
                         spec.scale_mode == PRISM_SCALE_POW2 ? "pow2" : "fp32",
                         stochastic ? "stochastic" : "nearest", n);
                compare_paths(&spec, &x, label);
                configs++;
            }
    for (size_t d = 0; d < 3; d++)
        free(inputs[d]);
    printf("(%zu configurations) ", configs);
    CU_ASSERT_EQUAL(mismatches, 0);
}

/* The counted range primitive itself on about a million binary32 bit patterns spread over all
 * 2^32 (every class: subnormals, ties, the saturating ranges, NaN and Inf), on ranges that start
 * and end anywhere, under scales 1, 0.75 and 2^-140 (most quotients overflow to Inf). */
static void test_every_path_counted_primitive_on_any_range(void)
{
    mismatches = 0;
    const prism_cpu_path *avx2 = avx2_path();
    if (!avx2) {
        printf("(SKIPPED: no AVX2) ");
        return;
    }
    runner run = {avx2, 1};
    size_t n = ((size_t)1 << 32) / 4099 + 1;
    float *x = xmalloc(n * sizeof *x);
    for (size_t i = 0; i < n; i++)
        x[i] = from_bits((uint32_t)(i * 4099u));
    prism_tensor t = {x, n, PRISM_DTYPE_F32};
    uint8_t *want = xmalloc(n), *got = xmalloc(n);
    static const struct {
        float scale;
        size_t begin, end;
        bool from_end;
    } ranges[] = {{1.0f, 0, 0, true},   {0.75f, 1, 1, true},   {0x1p-140f, 3, 0, true},
                  {0.75f, 0, 0, false}, {0.75f, 0, 1, false},  {1.0f, 1, 2, false},
                  {1.0f, 1, 8, false},  {0.75f, 3, 12, false}, {1.0f, 5, 40, false}};
    for (size_t f = 0; f < COUNT(all_formats); f++)
        for (int stochastic = 0; stochastic < 2; stochastic++)
            for (size_t r = 0; r < COUNT(ranges); r++) {
                size_t begin = ranges[r].begin, end = ranges[r].from_end ? n - ranges[r].end : ranges[r].end;
                prism_quant_spec spec = {.format = all_formats[f],
                                         .rounding = (prism_rounding)stochastic,
                                         .seed = 0xabcdef0123456789ull};
                memset(want, 0x5a, n);
                memset(got, 0x5a, n);
                float a_want = -1, a_got = -2;
                prism_quant_counts k_want, k_got;
                prism_cpu_scalar.quantize_range_counted(&spec, &t, begin, end, ranges[r].scale, want,
                                                        &a_want, &k_want);
                avx2->quantize_range_counted(&spec, &t, begin, end, ranges[r].scale, got, &a_got, &k_got);
                char label[160];
                snprintf(label, sizeof label, "quantize_range_counted %s %s scale %g [%zu, %zu)",
                         prism_precision_name(spec.format), stochastic ? "stochastic" : "nearest",
                         (double)ranges[r].scale, begin, end);
                if (memcmp(want, got, n) != 0)
                    note("codes", label, run);
                if (to_bits(a_want) != to_bits(a_got))
                    note("amax", label, run);
                if (!same_counts(&k_want, &k_got))
                    note("counts", label, run);
                /* The plain primitive writes the same codes. */
                memset(got, 0x5a, n);
                prism_cpu_scalar.quantize_range(&spec, &t, begin, end, ranges[r].scale, got);
                if (memcmp(want, got, n) != 0)
                    note("codes of quantize_range", label, (runner){&prism_cpu_scalar, 1});
            }
    free(x);
    free(want);
    free(got);
    CU_ASSERT_EQUAL(mismatches, 0);
}

static const prism_test_case cases[] = {
    {"test_nearest_saturation_boundaries_of_every_format",
     test_nearest_saturation_boundaries_of_every_format},
    {"test_stochastic_saturation_boundaries_of_every_format",
     test_stochastic_saturation_boundaries_of_every_format},
    {"test_underflow_counts_nonzero_values_coded_zero", test_underflow_counts_nonzero_values_coded_zero},
    {"test_nonfinite_amax_and_groups", test_nonfinite_amax_and_groups},
    {"test_bad_scales_are_refused_by_group", test_bad_scales_are_refused_by_group},
    {"test_int4_odd_lengths", test_int4_odd_lengths},
    {"test_delayed_scale_values", test_delayed_scale_values},
    {"test_given_scales_reproduce_quantize_and_counts", test_given_scales_reproduce_quantize_and_counts},
    {"test_every_path_counts_like_the_reference", test_every_path_counts_like_the_reference},
    {"test_every_path_counted_primitive_on_any_range", test_every_path_counted_primitive_on_any_range},
    {NULL, NULL},
};

static const prism_test_suite suites[] = {{"kernels_scaled", cases}, {NULL, NULL}};

int main(int argc, char **argv)
{
    return prism_test_main(argc, argv, suites);
}
