/* Every CPU path and thread count against the scalar reference on one thread (kernels/cpu/cpu.h):
 * codes, scales, non-finite counts, dequantized outputs in every dtype, accumulated sums,
 * relative errors and block statistics must be the same bytes (memcmp), for every format,
 * granularity, input dtype, rounding, scale mode, length and kind of content in the tables
 * below. On a CPU without AVX2 the AVX2 runs report themselves skipped and the threaded scalar
 * runs are still compared. */
#define _POSIX_C_SOURCE 200809L
#include "testutil.h"

#include "cpu/cpu.h"
#include "prism/kernels.h"

#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- paths ------------------------------------------------------------------------------ */

/* The AVX2 path when this build has it and this CPU runs it, else NULL. */
static const prism_cpu_path *avx2_path(void)
{
#if PRISM_CPU_HAVE_AVX2
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("f16c"))
        return &prism_cpu_avx2;
#endif
    return NULL;
}

static void report_avx2_skipped(void)
{
    if (!avx2_path())
        printf("(SKIPPED: no AVX2) ");
}

/* One way to run the kernels. */
typedef struct runner {
    const prism_cpu_path *path;
    int threads;
} runner;

/* Elements above which the drivers cut a call into several tasks (driver.c's TASK_ELEMENTS):
 * below it, every thread count runs the same single range, so only the paths are compared. */
#define ONE_TASK_ELEMENTS ((size_t)64 * 1024)

/* Which of automatic, two and three threads the scalar path runs on for the next input of
 * several tasks: they take turns, so that a long input costs two scalar runs, not four. */
static unsigned scalar_turn;

/* The runs compared with the reference: AVX2 on automatic threads and on one; for inputs of
 * several tasks also the scalar path on automatic, two or three threads (taking turns). */
static size_t runners_for(size_t numel, runner out[3])
{
    static const int scalar_threads[] = {0, 2, 3};
    size_t n = 0;
    if (avx2_path()) {
        out[n++] = (runner){avx2_path(), 0};
        out[n++] = (runner){avx2_path(), 1};
    }
    if (numel > ONE_TASK_ELEMENTS)
        out[n++] = (runner){&prism_cpu_scalar, scalar_threads[scalar_turn++ % 3]};
    return n;
}

/* ---- mismatches ------------------------------------------------------------------------- */

static unsigned mismatches; /* reset by each test; the first few are described on stderr */

static void note_mismatch(const char *what, const char *label, runner r, const char *detail)
{
    if (mismatches < 12)
        fprintf(stderr, "\n  %s differs: %s, %s path on %d threads%s%s", what, label, r.path->name,
                r.threads, detail ? ": " : "", detail ? detail : "");
    mismatches++;
}

static void expect_same_bytes(const void *want, const void *got, size_t bytes, const char *what,
                              const char *label, runner r)
{
    if (memcmp(want, got, bytes) == 0)
        return;
    size_t at = 0;
    while (((const uint8_t *)want)[at] == ((const uint8_t *)got)[at])
        at++;
    char detail[96];
    snprintf(detail, sizeof detail, "byte %zu of %zu is 0x%02x, reference 0x%02x", at, bytes,
             ((const uint8_t *)got)[at], ((const uint8_t *)want)[at]);
    note_mismatch(what, label, r, detail);
}

static void expect_ok(prism_status st, const prism_error *err, const char *what, const char *label,
                      runner r)
{
    if (st != PRISM_OK)
        note_mismatch(what, label, r, err->message);
}

static void *xmalloc(size_t bytes)
{
    void *p = malloc(bytes ? bytes : 1);
    CU_ASSERT_PTR_NOT_NULL_FATAL(p);
    return p;
}

/* ---- inputs ----------------------------------------------------------------------------- */

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

typedef enum contents {
    CONTENTS_MIXED,     /* normal-ish, with wide magnitudes, grid values, +-0, ~1% NaN/Inf */
    CONTENTS_SUBNORMAL, /* subnormals of the input dtype */
    CONTENTS_HUGE,      /* near the dtype's largest finite value, ~1% +-Inf */
    CONTENTS_ZEROS,     /* +0 and -0 */
    CONTENTS_CONSTANT,  /* one value */
    CONTENTS_COUNT
} contents;

static const char *const contents_names[] = {"mixed", "subnormal", "huge", "zeros", "constant"};
static const char *const dtype_names[] = {"f32", "bf16", "f16"};

/* One element of the mixed contents, as binary32. */
static float mixed_value(uint64_t *state)
{
    uint64_t pick = next_random(state) % 1000;
    float sign = next_random(state) & 1 ? -1.0f : 1.0f;
    if (pick < 4)
        return NAN;
    if (pick < 7)
        return sign * INFINITY;
    if (pick < 10)
        return -NAN;
    if (pick < 30)
        return sign * 0.0f;
    if (pick < 130) /* magnitudes from 2^-40 to 2^8: FP8 subnormals, codes that round to 0 */
        return sign * (float)ldexp(1.0 + uniform01(state), (int)(next_random(state) % 49) - 40);
    if (pick < 230) /* k/8: exact ties for nearest rounding under power-of-two scales */
        return (float)((int)(next_random(state) % 129) - 64) / 8.0f;
    double g = uniform01(state) + uniform01(state) + uniform01(state) + uniform01(state) - 2.0;
    return (float)(g * 1.7);
}

/* n elements of the given dtype and contents, the same for the same seed. */
static void *make_input(prism_dtype dtype, contents kind, size_t n, uint64_t seed)
{
    void *data = xmalloc(n * (dtype == PRISM_DTYPE_F32 ? 4 : 2));
    float *f = data;
    uint16_t *h = data;
    uint64_t state = seed;
    for (size_t i = 0; i < n; i++) {
        uint64_t r = next_random(&state);
        uint32_t sign = (uint32_t)(r >> 63);
        float v = 0.0f;
        uint32_t bits = 0; /* a bit pattern of the dtype, used when v is not */
        int use_bits = 1;
        switch (kind) {
        case CONTENTS_MIXED:
            v = mixed_value(&state);
            use_bits = 0;
            break;
        case CONTENTS_SUBNORMAL:
            bits = dtype == PRISM_DTYPE_F32    ? (sign << 31) | (uint32_t)(r & 0x7fffff)
                   : dtype == PRISM_DTYPE_BF16 ? (sign << 15) | (uint32_t)(r & 0x7f)
                                               : (sign << 15) | (uint32_t)(r & 0x3ff);
            break;
        case CONTENTS_HUGE:
            if ((r >> 20) % 100 == 0)
                bits = dtype == PRISM_DTYPE_F32
                           ? (sign << 31) | 0x7f800000u
                           : (sign << 15) | (dtype == PRISM_DTYPE_BF16 ? 0x7f80u : 0x7c00u);
            else
                bits = dtype == PRISM_DTYPE_F32
                           ? (sign << 31) | 0x7f000000u | (uint32_t)(r & 0x7fffff)
                       : dtype == PRISM_DTYPE_BF16 ? (sign << 15) | 0x7f00u | (uint32_t)(r & 0x7f)
                                                   : (sign << 15) | 0x7800u | (uint32_t)(r & 0x3ff);
            break;
        case CONTENTS_ZEROS:
            v = sign ? -0.0f : 0.0f;
            use_bits = 0;
            break;
        default:
            v = -0.3f;
            use_bits = 0;
            break;
        }
        if (dtype == PRISM_DTYPE_F32) {
            if (use_bits)
                memcpy(&f[i], &bits, sizeof bits);
            else
                f[i] = v;
        } else if (use_bits) {
            h[i] = (uint16_t)bits;
        } else {
            h[i] = dtype == PRISM_DTYPE_BF16 ? prism_f32_to_bf16(v) : prism_f32_to_f16(v);
        }
    }
    return data;
}

/* Accumulators to add into: finite values with ~1% NaN/Inf. Decoded codes that come from
 * prism_quantize are never NaN, so no element adds two NaNs, the one case whose result bits
 * depend on the compiler's operand order (avx2.c). */
static float *make_accumulators(size_t n, uint64_t seed)
{
    float *acc = xmalloc(n * sizeof *acc);
    uint64_t state = seed;
    for (size_t i = 0; i < n; i++)
        acc[i] = mixed_value(&state);
    return acc;
}

/* ---- quantize, dequantize, accumulate, relative error ---------------------------------- */

static const prism_dtype all_dtypes[] = {PRISM_DTYPE_F32, PRISM_DTYPE_BF16, PRISM_DTYPE_F16};

/* Quantizes x under spec on the reference and every runner, then decodes the reference's codes
 * into the dtypes of out_dtypes (bit d: all_dtypes[d]) and into accumulators, and measures the
 * relative error of each decoding: every result must be the reference's bytes. */
static void compare_quantize(const prism_quant_spec *spec, const prism_tensor *x,
                             unsigned out_dtypes, const char *label)
{
    size_t groups, group_len, code_bytes, n = x->numel;
    prism_error err;
    if (prism_quant_layout(spec, n, &groups, &group_len, &code_bytes, &err) != PRISM_OK) {
        note_mismatch("layout", label, (runner){&prism_cpu_scalar, 1}, err.message);
        return;
    }
    runner ref = {&prism_cpu_scalar, 1}, runs[3];
    size_t nruns = runners_for(n, runs);

    uint8_t *codes_ref = xmalloc(code_bytes), *codes = xmalloc(code_bytes);
    float *scales_ref = xmalloc(groups * sizeof(float)), *scales = xmalloc(groups * sizeof(float));
    uint64_t bad_ref = 7, bad = 7;
    memset(codes_ref, 0xa5, code_bytes);
    memset(scales_ref, 0xa5, groups * sizeof(float));
    expect_ok(
        prism_quantize_with(ref.path, ref.threads, spec, x, codes_ref, scales_ref, &bad_ref, &err),
        &err, "quantize status", label, ref);
    for (size_t r = 0; r < nruns; r++) {
        memset(codes, 0xa5, code_bytes);
        memset(scales, 0xa5, groups * sizeof(float));
        bad = 7;
        expect_ok(
            prism_quantize_with(runs[r].path, runs[r].threads, spec, x, codes, scales, &bad, &err),
            &err, "quantize status", label, runs[r]);
        expect_same_bytes(codes_ref, codes, code_bytes, "codes", label, runs[r]);
        expect_same_bytes(scales_ref, scales, groups * sizeof(float), "scales", label, runs[r]);
        expect_same_bytes(&bad_ref, &bad, sizeof bad, "nonfinite count", label, runs[r]);
    }

    void *out_ref = xmalloc(n * 4), *out = xmalloc(n * 4);
    for (size_t d = 0; d < 3; d++) {
        if (!(out_dtypes >> d & 1))
            continue;
        prism_dtype dt = all_dtypes[d];
        size_t bytes = n * prism_dtype_size(dt);
        char what[64];
        snprintf(what, sizeof what, "dequantized %s", dtype_names[d]);
        memset(out_ref, 0xa5, bytes);
        expect_ok(prism_dequantize_with(ref.path, ref.threads, spec, codes_ref, scales_ref, n,
                                        out_ref, dt, &err),
                  &err, what, label, ref);
        for (size_t r = 0; r < nruns; r++) {
            memset(out, 0xa5, bytes);
            expect_ok(prism_dequantize_with(runs[r].path, runs[r].threads, spec, codes_ref,
                                            scales_ref, n, out, dt, &err),
                      &err, what, label, runs[r]);
            expect_same_bytes(out_ref, out, bytes, what, label, runs[r]);
        }
        /* The error of the decoding against the input: a and b of the same or of different
         * dtypes. */
        prism_tensor b = {out_ref, n, dt};
        double e_ref = -1, e = -1;
        snprintf(what, sizeof what, "relative error to %s", dtype_names[d]);
        expect_ok(prism_relative_error_with(ref.path, ref.threads, x, &b, &e_ref, &err), &err, what,
                  label, ref);
        for (size_t r = 0; r < nruns; r++) {
            e = -1;
            expect_ok(prism_relative_error_with(runs[r].path, runs[r].threads, x, &b, &e, &err),
                      &err, what, label, runs[r]);
            expect_same_bytes(&e_ref, &e, sizeof e, what, label, runs[r]);
        }
    }

    float *acc0 = make_accumulators(n, n * 31 + 5), *acc_ref = out_ref, *acc = out;
    memcpy(acc_ref, acc0, n * sizeof(float));
    expect_ok(prism_dequantize_accumulate_with(ref.path, ref.threads, spec, codes_ref, scales_ref,
                                               n, acc_ref, &err),
              &err, "accumulated", label, ref);
    for (size_t r = 0; r < nruns; r++) {
        memcpy(acc, acc0, n * sizeof(float));
        expect_ok(prism_dequantize_accumulate_with(runs[r].path, runs[r].threads, spec, codes_ref,
                                                   scales_ref, n, acc, &err),
                  &err, "accumulated", label, runs[r]);
        expect_same_bytes(acc_ref, acc, n * sizeof(float), "accumulated", label, runs[r]);
    }
    free(acc0);
    free(out_ref);
    free(out);
    free(codes_ref);
    free(codes);
    free(scales_ref);
    free(scales);
}

/* ---- statistics ------------------------------------------------------------------------- */

/* The statistics of three blocks, {x}, {x, y, x} and {}, on the reference and every runner. */
static void compare_stats(const prism_tensor *x, const prism_tensor *y, const char *label)
{
    prism_tensor tensors[4] = {*x, *x, *y, *x};
    size_t block_start[4] = {0, 1, 4, 4};
    prism_grad_stats want[3], got[3];
    runner ref = {&prism_cpu_scalar, 1}, runs[3];
    size_t nruns = runners_for(x->numel, runs);
    prism_error err;
    memset(want, 0xa5, sizeof want);
    expect_ok(
        prism_grad_stats_blocks_with(ref.path, ref.threads, tensors, block_start, 3, want, &err),
        &err, "grad stats status", label, ref);
    for (size_t r = 0; r < nruns; r++) {
        memset(got, 0xa5, sizeof got);
        expect_ok(prism_grad_stats_blocks_with(runs[r].path, runs[r].threads, tensors, block_start,
                                               3, got, &err),
                  &err, "grad stats status", label, runs[r]);
        expect_same_bytes(want, got, sizeof want, "grad stats", label, runs[r]);
    }
}

/* ---- the tables ------------------------------------------------------------------------- */

static const prism_precision all_formats[] = {PRISM_PRECISION_INT8, PRISM_PRECISION_FP8_E4M3,
                                              PRISM_PRECISION_FP8_E5M2, PRISM_PRECISION_INT4};

static const size_t short_lengths[] = {0, 1, 2, 7, 8, 9, 31, 127, 128, 129, 2047, 2048, 2049};

/* Over 1.3M elements: several driver tasks, so automatic threads use every CPU. Odd (INT4's
 * last byte), 5 * 3^3 * 7 * 19 * 73, so rows of 1387 fit. */
#define LONG_LENGTH ((size_t)1310715)

typedef enum grouping {
    GROUP_TENSOR,
    GROUP_ROW_ODD,  /* rows of an odd length */
    GROUP_ROW_EVEN, /* rows of an even length (none for an odd numel) */
    GROUP_BLOCK_128,
    GROUP_BLOCK_7,
    GROUP_BLOCK_1,
    GROUP_COUNT
} grouping;

static const char *const grouping_names[] = {"tensor",   "row-odd", "row-even",
                                             "block128", "block7",  "block1"};

/* The largest divisor of n that is at most 150 and odd (or even): a row length. 0 if none. */
static size_t row_length(size_t n, int even)
{
    if (n == 0)
        return even ? 2 : 3;
    if (n == LONG_LENGTH)
        return even ? 0 : 1387;
    for (size_t d = 150; d >= 1; d--)
        if (n % d == 0 && (d % 2 == 0) == (even != 0))
            return d;
    return 0;
}

/* Fills spec's granularity and group for n elements; false when the grouping does not apply. */
static bool set_grouping(prism_quant_spec *spec, grouping g, size_t n)
{
    switch (g) {
    case GROUP_TENSOR:
        spec->granularity = PRISM_GRANULARITY_TENSOR;
        spec->group = 0;
        return true;
    case GROUP_ROW_ODD:
    case GROUP_ROW_EVEN:
        spec->granularity = PRISM_GRANULARITY_ROW;
        spec->group = row_length(n, g == GROUP_ROW_EVEN);
        return spec->group != 0;
    case GROUP_BLOCK_128:
        spec->granularity = PRISM_GRANULARITY_BLOCK;
        spec->group = 128;
        return true;
    case GROUP_BLOCK_7:
        spec->granularity = PRISM_GRANULARITY_BLOCK;
        spec->group = 7;
        return true;
    default:
        spec->granularity = PRISM_GRANULARITY_BLOCK;
        spec->group = 1;
        return true;
    }
}

static void describe(char *label, size_t size, const prism_quant_spec *spec, grouping g, size_t d,
                     contents kind, size_t n)
{
    snprintf(label, size, "%s %s(%zu) %s %s %s, %zu %s elements",
             prism_precision_name(spec->format), grouping_names[g], spec->group, dtype_names[d],
             spec->rounding == PRISM_ROUNDING_STOCHASTIC ? "stochastic" : "nearest",
             spec->scale_mode == PRISM_SCALE_POW2 ? "pow2" : "fp32", n, contents_names[kind]);
}

/* Every format x grouping x input dtype x rounding x scale mode x short length x contents. */
static void test_every_path_quantizes_short_inputs_like_the_reference(void)
{
    mismatches = 0;
    report_avx2_skipped();
    size_t configs = 0;
    for (size_t l = 0; l < sizeof short_lengths / sizeof short_lengths[0]; l++) {
        size_t n = short_lengths[l];
        for (size_t d = 0; d < 3; d++) {
            for (contents kind = 0; kind < CONTENTS_COUNT; kind++) {
                void *data = make_input(all_dtypes[d], kind, n, 1000 * n + 10 * d + kind);
                prism_tensor x = {data, n, all_dtypes[d]};
                char label[160];
                snprintf(label, sizeof label, "%s, %zu %s elements", dtype_names[d], n,
                         contents_names[kind]);
                prism_tensor y = {data, n / 2, all_dtypes[d]};
                compare_stats(&x, &y, label);
                for (size_t f = 0; f < 4; f++)
                    for (grouping g = 0; g < GROUP_COUNT; g++)
                        for (int mode = 0; mode < 4; mode++) {
                            prism_quant_spec spec = {.format = all_formats[f],
                                                     .scale_mode = (prism_scale_mode)(mode & 1),
                                                     .rounding = (prism_rounding)(mode >> 1),
                                                     .seed = 0xfeedface12345678ull ^ configs};
                            if (!set_grouping(&spec, g, n))
                                continue;
                            describe(label, sizeof label, &spec, g, d, kind, n);
                            compare_quantize(&spec, &x, 7, label);
                            configs++;
                        }
                free(data);
            }
        }
    }
    printf("(%zu configurations) ", configs);
    CU_ASSERT_EQUAL(mismatches, 0);
}

/* One input of LONG_LENGTH elements, cut into tasks and run on threads: every format x grouping
 * x rounding, the input dtype, scale mode and output dtype taking turns. */
static void test_every_path_and_thread_count_quantizes_a_long_input_like_the_reference(void)
{
    mismatches = 0;
    report_avx2_skipped();
    size_t n = LONG_LENGTH, configs = 0;
    void *inputs[3];
    for (size_t d = 0; d < 3; d++)
        inputs[d] = make_input(all_dtypes[d], CONTENTS_MIXED, n, 77 + d);
    char label[160];
    for (size_t d = 0; d < 3; d++) {
        prism_tensor x = {inputs[d], n, all_dtypes[d]};
        prism_tensor y = {inputs[(d + 1) % 3], n - 4097, all_dtypes[(d + 1) % 3]};
        snprintf(label, sizeof label, "%s, %zu mixed elements", dtype_names[d], n);
        compare_stats(&x, &y, label);
    }
    for (size_t f = 0; f < 4; f++)
        for (grouping g = 0; g < GROUP_COUNT; g++)
            for (int stochastic = 0; stochastic < 2; stochastic++) {
                size_t d = configs % 3;
                prism_quant_spec spec = {.format = all_formats[f],
                                         .scale_mode = (prism_scale_mode)((configs / 3) % 2),
                                         .rounding = (prism_rounding)stochastic,
                                         .seed = 0x0123456789abcdefull + configs};
                if (!set_grouping(&spec, g, n))
                    continue;
                prism_tensor x = {inputs[d], n, all_dtypes[d]};
                describe(label, sizeof label, &spec, g, d, CONTENTS_MIXED, n);
                compare_quantize(&spec, &x, 1u << (configs / 2 % 3), label);
                configs++;
            }
    for (size_t d = 0; d < 3; d++)
        free(inputs[d]);
    printf("(%zu configurations) ", configs);
    CU_ASSERT_EQUAL(mismatches, 0);
}

/* Codes of every byte value, FP8 NaN codes and INT8's -128 included, under scales from the
 * smallest subnormal to FLT_MAX (products that overflow bf16, f16 and f32): the decodings and
 * sums of every path are the reference's. */
static void test_every_path_decodes_arbitrary_codes_like_the_reference(void)
{
    mismatches = 0;
    report_avx2_skipped();
    static const float scale_values[] = {1.0f,    0.75f, 0x1p-149f, 1e-30f,
                                         3.0e-5f, 1e30f, FLT_MAX,   5.0f};
    static const size_t lengths[] = {1, 7, 9, 64, 129, 2049, 70001};
    for (size_t l = 0; l < sizeof lengths / sizeof lengths[0]; l++) {
        size_t n = lengths[l];
        uint64_t state = n;
        uint8_t *codes = xmalloc(n);
        for (size_t i = 0; i < n; i++)
            codes[i] = (uint8_t)next_random(&state);
        float *acc0 = xmalloc(n * sizeof(float)), *acc_ref = xmalloc(n * sizeof(float)),
              *acc = xmalloc(n * sizeof(float));
        for (size_t i = 0; i < n;
             i++) /* finite: a NaN code decodes to NaN (see make_accumulators) */
            acc0[i] = (float)(uniform01(&state) * 200.0 - 100.0);
        void *out_ref = xmalloc(n * 4), *out = xmalloc(n * 4);
        for (size_t f = 0; f < 4; f++)
            for (grouping g = 0; g < GROUP_COUNT; g++) {
                prism_quant_spec spec = {.format = all_formats[f]};
                if (!set_grouping(&spec, g, n))
                    continue;
                size_t groups;
                prism_error err;
                if (prism_quant_layout(&spec, n, &groups, NULL, NULL, &err) != PRISM_OK)
                    continue;
                float *scales = xmalloc(groups * sizeof(float));
                for (size_t k = 0; k < groups; k++)
                    scales[k] =
                        scale_values[(k + f) % (sizeof scale_values / sizeof scale_values[0])];
                char label[160];
                snprintf(label, sizeof label, "%s %s(%zu), %zu arbitrary codes",
                         prism_precision_name(spec.format), grouping_names[g], spec.group, n);
                runner ref = {&prism_cpu_scalar, 1}, runs[3];
                size_t nruns = runners_for(n, runs);
                for (size_t d = 0; d < 3; d++) {
                    size_t bytes = n * prism_dtype_size(all_dtypes[d]);
                    memset(out_ref, 0xa5, bytes);
                    expect_ok(prism_dequantize_with(ref.path, 1, &spec, codes, scales, n, out_ref,
                                                    all_dtypes[d], &err),
                              &err, "dequantized", label, ref);
                    for (size_t r = 0; r < nruns; r++) {
                        memset(out, 0xa5, bytes);
                        expect_ok(prism_dequantize_with(runs[r].path, runs[r].threads, &spec, codes,
                                                        scales, n, out, all_dtypes[d], &err),
                                  &err, "dequantized", label, runs[r]);
                        expect_same_bytes(out_ref, out, bytes, dtype_names[d], label, runs[r]);
                    }
                }
                memcpy(acc_ref, acc0, n * sizeof(float));
                expect_ok(prism_dequantize_accumulate_with(ref.path, 1, &spec, codes, scales, n,
                                                           acc_ref, &err),
                          &err, "accumulated", label, ref);
                for (size_t r = 0; r < nruns; r++) {
                    memcpy(acc, acc0, n * sizeof(float));
                    expect_ok(prism_dequantize_accumulate_with(runs[r].path, runs[r].threads, &spec,
                                                               codes, scales, n, acc, &err),
                              &err, "accumulated", label, runs[r]);
                    expect_same_bytes(acc_ref, acc, n * sizeof(float), "accumulated", label,
                                      runs[r]);
                }
                free(scales);
            }
        free(codes);
        free(acc0);
        free(acc_ref);
        free(acc);
        free(out_ref);
        free(out);
    }
    CU_ASSERT_EQUAL(mismatches, 0);
}

/* The primitives themselves, on ranges that start and end anywhere: quantize_range over about a
 * million binary32 bit patterns spread over all 2^32 (every class: subnormals, FP8 subnormal and
 * saturating ranges, NaN and Inf, ties), under the scales 1 and 0.75 and a scale so small that
 * quotients overflow to Inf; dequantize_range and accumulate_range over odd INT4 ranges. Bytes
 * outside the range (the other nibble of a shared INT4 byte included) must be left alone. */
static void test_every_path_primitive_matches_the_reference_on_any_range(void)
{
    mismatches = 0;
    report_avx2_skipped();
    const prism_cpu_path *avx2 = avx2_path();
    if (!avx2) {
        CU_PASS("no AVX2 path to compare");
        return;
    }
    runner run = {avx2, 1};
    size_t n = ((size_t)1 << 32) / 4099 + 1;
    float *x = xmalloc(n * sizeof *x);
    for (size_t i = 0; i < n; i++) {
        uint32_t bits = (uint32_t)(i * 4099u);
        memcpy(&x[i], &bits, sizeof bits);
    }
    prism_tensor t = {x, n, PRISM_DTYPE_F32};
    uint8_t *want = xmalloc(n), *got = xmalloc(n);
    /* Ranges [begin, end) with end counted from n when from_end: whole, odd ends, short. The
     * scale 2^-140 makes most quotients overflow to +-Inf. */
    static const struct {
        float scale;
        size_t begin, end;
        bool from_end;
    } ranges[] = {{1.0f, 0, 0, true},   {0.75f, 1, 1, true},   {0x1p-140f, 3, 0, true},
                  {0.75f, 0, 0, false}, {0.75f, 0, 1, false},  {1.0f, 1, 2, false},
                  {1.0f, 1, 8, false},  {0.75f, 3, 12, false}, {1.0f, 5, 40, false}};
    for (size_t f = 0; f < 4; f++)
        for (int stochastic = 0; stochastic < 2; stochastic++)
            for (size_t r = 0; r < sizeof ranges / sizeof ranges[0]; r++) {
                size_t begin = ranges[r].begin,
                       end = ranges[r].from_end ? n - ranges[r].end : ranges[r].end;
                prism_quant_spec spec = {.format = all_formats[f],
                                         .rounding = (prism_rounding)stochastic,
                                         .seed = 0xabcdef0123456789ull};
                memset(want, 0x5a, n);
                memset(got, 0x5a, n);
                prism_cpu_scalar.quantize_range(&spec, &t, begin, end, ranges[r].scale, want);
                avx2->quantize_range(&spec, &t, begin, end, ranges[r].scale, got);
                char label[160];
                snprintf(label, sizeof label, "quantize_range %s %s scale %g [%zu, %zu)",
                         prism_precision_name(spec.format), stochastic ? "stochastic" : "nearest",
                         (double)ranges[r].scale, begin, end);
                expect_same_bytes(want, got, n, "codes", label, run);
            }

    /* amax over one range of almost only infinities, longer than the AVX2 path's 16-bit NaN/Inf
     * counters hold between two of their sums (32 * 32767 elements), in every dtype. */
    for (size_t d = 0; d < 3; d++) {
        size_t len = 1100003;
        void *data = make_input(all_dtypes[d], CONTENTS_MIXED, len, 4242 + d);
        for (size_t i = 0; i < len; i++) {
            if (i % 1000 == 0)
                continue;
            if (all_dtypes[d] == PRISM_DTYPE_F32)
                ((float *)data)[i] = i % 2 ? INFINITY : -INFINITY;
            else
                ((uint16_t *)data)[i] =
                    (uint16_t)(all_dtypes[d] == PRISM_DTYPE_BF16 ? 0x7f80 : 0x7c00);
        }
        prism_tensor long_x = {data, len, all_dtypes[d]};
        float amax_want, amax_got;
        uint64_t bad_want, bad_got;
        prism_cpu_scalar.amax(&long_x, 3, len - 5, &amax_want, &bad_want);
        avx2->amax(&long_x, 3, len - 5, &amax_got, &bad_got);
        char label[64];
        snprintf(label, sizeof label, "amax of %zu %s elements", len - 8, dtype_names[d]);
        expect_same_bytes(&amax_want, &amax_got, sizeof amax_want, "amax", label, run);
        expect_same_bytes(&bad_want, &bad_got, sizeof bad_want, "nonfinite count", label, run);
        free(data);
    }

    /* Decoding odd ranges of INT4 (and every other format) into prefilled outputs. */
    size_t m = 301;
    uint8_t *codes = xmalloc(m);
    float group_scales[301];
    uint64_t state = 99;
    for (size_t i = 0; i < m; i++) {
        codes[i] = (uint8_t)next_random(&state);
        group_scales[i] = (float)(uniform01(&state) * 4.0);
    }
    float out_want[301], out_got[301];
    for (size_t f = 0; f < 4; f++)
        for (size_t group_len = 1; group_len <= 12; group_len += 5)
            for (size_t begin = 0; begin < 4; begin++)
                for (size_t end = m - 3; end <= m; end++) {
                    char label[160];
                    snprintf(label, sizeof label, "%s decode, groups of %zu, [%zu, %zu)",
                             prism_precision_name(all_formats[f]), group_len, begin, end);
                    for (size_t d = 0; d < 3; d++) {
                        memset(out_want, 0x5a, sizeof out_want);
                        memset(out_got, 0x5a, sizeof out_got);
                        prism_cpu_scalar.dequantize_range(all_formats[f], group_len, codes,
                                                          group_scales, begin, end, out_want,
                                                          all_dtypes[d]);
                        avx2->dequantize_range(all_formats[f], group_len, codes, group_scales,
                                               begin, end, out_got, all_dtypes[d]);
                        expect_same_bytes(out_want, out_got, sizeof out_want, dtype_names[d], label,
                                          run);
                    }
                    for (size_t i = 0; i < m; i++)
                        out_want[i] = out_got[i] = (float)i - 150.0f;
                    prism_cpu_scalar.accumulate_range(all_formats[f], group_len, codes,
                                                      group_scales, begin, end, out_want);
                    avx2->accumulate_range(all_formats[f], group_len, codes, group_scales, begin,
                                           end, out_got);
                    expect_same_bytes(out_want, out_got, sizeof out_want, "accumulated", label,
                                      run);
                }
    free(codes);
    free(x);
    free(want);
    free(got);
    CU_ASSERT_EQUAL(mismatches, 0);
}

/* Stochastic rounding goes up when the 24 random bits are strictly below the fraction times 2^24
 * (kernels.h). Elements built from their own random words sit exactly on that comparison (code 0:
 * a tie stays down) or one step above it (code 1), for the integers and the FP8 subnormal range,
 * under the scale 1; every path must write exactly those codes. */
static void test_every_path_rounds_a_stochastic_tie_down(void)
{
    mismatches = 0;
    report_avx2_skipped();
    const size_t half = 1000, n = 2 * half;
    const uint64_t seed = 0x5eed5eed00000001ull;
    static const struct {
        prism_precision format;
        float ulp; /* the value of the fraction's unit: 1, or the smallest FP8 subnormal */
    } formats[] = {{PRISM_PRECISION_INT8, 1.0f},
                   {PRISM_PRECISION_INT4, 1.0f},
                   {PRISM_PRECISION_FP8_E4M3, 0x1p-9f},
                   {PRISM_PRECISION_FP8_E5M2, 0x1p-16f}};
    float *x = xmalloc(n * sizeof *x);
    uint8_t *want = xmalloc(n), *got = xmalloc(n);
    runner runs[2] = {{&prism_cpu_scalar, 1}, {avx2_path(), 1}};
    for (size_t f = 0; f < sizeof formats / sizeof formats[0]; f++) {
        for (size_t i = 0; i < n; i++) {
            uint32_t ctr[4] = {(uint32_t)(i / 4), 0, 0, 0},
                     key[2] = {(uint32_t)seed, (uint32_t)(seed >> 32)}, out[4];
            prism_philox4x32_10(ctr, key, out);
            uint32_t r24 = out[i % 4] >> 8;
            x[i] = (float)(r24 + (i >= half)) * 0x1p-24f * formats[f].ulp; /* exact */
        }
        prism_quant_spec spec = {
            .format = formats[f].format, .rounding = PRISM_ROUNDING_STOCHASTIC, .seed = seed};
        prism_tensor t = {x, n, PRISM_DTYPE_F32};
        size_t bytes = formats[f].format == PRISM_PRECISION_INT4 ? n / 2 : n;
        for (size_t i = 0; i < bytes; i++)
            want[i] = formats[f].format == PRISM_PRECISION_INT4
                          ? (uint8_t)(2 * i >= half ? 0x11 : 0x00)
                          : (uint8_t)(i >= half);
        for (size_t r = 0; r < 2 && runs[r].path; r++) {
            memset(got, 0x5a, n);
            runs[r].path->quantize_range(&spec, &t, 0, n, 1.0f, got);
            expect_same_bytes(want, got, bytes, "codes", prism_precision_name(formats[f].format),
                              runs[r]);
        }
    }
    free(x);
    free(want);
    free(got);
    CU_ASSERT_EQUAL(mismatches, 0);
}

/* ---- the path the public functions take ------------------------------------------------- */

/* `test_kernels_paths --print-best-path` prints prism_cpu_best()'s name: the tests below run it
 * with PRISM_CPU_PATH set, since the choice is made once per process. */
static const char *best_path_in_child(const char *env_value)
{
    static char name[64];
    char *argv[] = {"/proc/self/exe", "--print-best-path", NULL};
    if (env_value)
        setenv("PRISM_CPU_PATH", env_value, 1);
    else
        unsetenv("PRISM_CPU_PATH");
    prism_proc_result res;
    int rc = prism_run_process(argv, NULL, 30, &res);
    snprintf(name, sizeof name, "%s", rc == 0 && res.exit_code == 0 ? res.out : "(failed)");
    name[strcspn(name, "\n")] = '\0';
    if (rc == 0)
        prism_proc_result_free(&res);
    return name;
}

static void test_best_path_is_avx2_on_a_cpu_with_avx2(void)
{
    const char *saved = getenv("PRISM_CPU_PATH");
    char keep[64] = "";
    if (saved)
        snprintf(keep, sizeof keep, "%s", saved);
    const char *detected = avx2_path() ? "avx2" : "scalar";
    if (!avx2_path())
        printf("(SKIPPED: no AVX2) ");
    CU_ASSERT_STRING_EQUAL(best_path_in_child(NULL), detected);
    if (!saved)
        CU_ASSERT_STRING_EQUAL(prism_cpu_best()->name, detected);
    if (saved)
        setenv("PRISM_CPU_PATH", keep, 1);
    else
        unsetenv("PRISM_CPU_PATH");
}

/* PRISM_CPU_PATH=scalar forces the reference; avx2 is taken only where the CPU runs it; other
 * values keep the detected path. */
static void test_prism_cpu_path_forces_scalar_and_ignores_unknown_values(void)
{
    const char *saved = getenv("PRISM_CPU_PATH");
    char keep[64] = "";
    if (saved)
        snprintf(keep, sizeof keep, "%s", saved);
    const char *detected = avx2_path() ? "avx2" : "scalar";
    static const struct {
        const char *env;
        const char *want; /* NULL: the detected path */
    } cases[] = {
        {"scalar", "scalar"}, {"avx2", NULL}, {"sse9", NULL}, {"", NULL}, {"SCALAR", NULL}};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        CU_ASSERT_STRING_EQUAL(best_path_in_child(cases[i].env),
                               cases[i].want ? cases[i].want : detected);
    if (saved)
        setenv("PRISM_CPU_PATH", keep, 1);
    else
        unsetenv("PRISM_CPU_PATH");
}

static const prism_test_case cases[] = {
    {"test_every_path_quantizes_short_inputs_like_the_reference",
     test_every_path_quantizes_short_inputs_like_the_reference},
    {"test_every_path_and_thread_count_quantizes_a_long_input_like_the_reference",
     test_every_path_and_thread_count_quantizes_a_long_input_like_the_reference},
    {"test_every_path_decodes_arbitrary_codes_like_the_reference",
     test_every_path_decodes_arbitrary_codes_like_the_reference},
    {"test_every_path_primitive_matches_the_reference_on_any_range",
     test_every_path_primitive_matches_the_reference_on_any_range},
    {"test_every_path_rounds_a_stochastic_tie_down", test_every_path_rounds_a_stochastic_tie_down},
    {"test_best_path_is_avx2_on_a_cpu_with_avx2", test_best_path_is_avx2_on_a_cpu_with_avx2},
    {"test_prism_cpu_path_forces_scalar_and_ignores_unknown_values",
     test_prism_cpu_path_forces_scalar_and_ignores_unknown_values},
    {NULL, NULL},
};

static const prism_test_suite suites[] = {{"kernels_paths", cases}, {NULL, NULL}};

int main(int argc, char **argv)
{
    if (argc > 1 && strcmp(argv[1], "--print-best-path") == 0) {
        printf("%s\n", prism_cpu_best()->name);
        return 0;
    }
    return prism_test_main(argc, argv, suites);
}
