/* prism_quantize_scaled_cuda and prism_quantize_counted_cuda (include/prism/cuda.h) against the
 * CPU reference (kernels.h) on the same data: codes, amax, scales and the saturated, underflowed
 * and NaN/Inf counts must be the same bits.
 *
 * The table is formats x granularities (tensor; rows of a team's length, of an even and an odd
 * length that is not a multiple of 8; blocks of 128, 7 and an odd length longer than a chunk) x
 * input dtypes x roundings x lengths (0, 1, 7, 129, 2049, TEST_BIG_LEN) x contents (normal values
 * with NaN/Inf, random bit patterns, subnormals, zeros, halves that tie), the given scales being
 * the computed ones times factors from 0.1 to 4 (so that values saturate and underflow), with the
 * input and codes one element off alignment where the length is small. Without a device every
 * GPU test prints "(SKIPPED: no CUDA device)" and returns; the argument checks made on the host
 * before any GPU work run anyway. */
#include "prism/cuda.h"
#include "prism/kernels.h"
#include "testutil.h"

#include <cuda_runtime_api.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifndef TEST_BIG_LEN
#define TEST_BIG_LEN ((size_t)1048576 + 3)
#endif
#ifndef TEST_CASE_STRIDE
#define TEST_CASE_STRIDE 1
#endif

#define COUNT(a) (sizeof(a) / sizeof((a)[0]))

static int device_count(void)
{
    static int count = -1;
    if (count < 0) {
        prism_error err = {0};
        if (prism_cuda_device_count(&count, &err) != PRISM_OK)
            count = 0;
    }
    return count;
}

static bool skip_without_device(void)
{
    if (device_count() > 0)
        return false;
    printf("(SKIPPED: no CUDA device) ");
    return true;
}

static cudaStream_t test_stream(void)
{
    static cudaStream_t stream;
    static bool made;
    if (!made) {
        CU_ASSERT_EQUAL_FATAL(cudaStreamCreate(&stream), cudaSuccess);
        made = true;
    }
    return stream;
}

static void *dev_alloc(size_t n)
{
    void *p = NULL;
    CU_ASSERT_EQUAL_FATAL(cudaMalloc(&p, n ? n : 1), cudaSuccess);
    CU_ASSERT_EQUAL_FATAL(cudaMemset(p, 0xa5, n ? n : 1), cudaSuccess);
    return p;
}

static void *dev_upload(const void *host, size_t n, size_t pad)
{
    char *p = dev_alloc(n + pad);
    if (n)
        CU_ASSERT_EQUAL_FATAL(cudaMemcpy(p + pad, host, n, cudaMemcpyHostToDevice), cudaSuccess);
    return p;
}

static void dev_download(void *host, const void *dev, size_t n)
{
    if (n)
        CU_ASSERT_EQUAL_FATAL(cudaMemcpy(host, dev, n, cudaMemcpyDeviceToHost), cudaSuccess);
}

static void dev_sync(void)
{
    CU_ASSERT_EQUAL_FATAL(cudaStreamSynchronize(test_stream()), cudaSuccess);
    CU_ASSERT_EQUAL_FATAL(cudaGetLastError(), cudaSuccess);
}

static void *xmalloc(size_t n)
{
    void *p = malloc(n ? n : 1);
    CU_ASSERT_PTR_NOT_NULL_FATAL(p);
    return p;
}

/* ---- data ------------------------------------------------------------------------------------ */

typedef enum content { C_NORMAL, C_BITS, C_SUBNORMAL, C_ZEROS, C_HALVES, C_COUNT } content;
static const char *const content_names[] = {"normal", "bits", "subnormal", "zeros", "halves"};
static const char *const dtype_names[] = {"f32", "bf16", "f16"};

static uint64_t rng_next(uint64_t *s)
{
    *s ^= *s >> 12;
    *s ^= *s << 25;
    *s ^= *s >> 27;
    return *s * 0x2545F4914F6CDD1Dull;
}

static size_t dtype_size(prism_dtype dtype)
{
    return dtype == PRISM_DTYPE_F32 ? 4 : 2;
}

static void put_value(void *data, prism_dtype dtype, size_t i, float v)
{
    switch (dtype) {
    case PRISM_DTYPE_F32: ((float *)data)[i] = v; break;
    case PRISM_DTYPE_BF16: ((uint16_t *)data)[i] = prism_f32_to_bf16(v); break;
    default: ((uint16_t *)data)[i] = prism_f32_to_f16(v); break;
    }
}

static void *make_data(prism_dtype dtype, content c, size_t n, uint64_t seed)
{
    void *data = xmalloc(n * dtype_size(dtype));
    uint64_t s = seed * 0x9E3779B97F4A7C15ull + 1;
    for (size_t i = 0; i < n; i++) {
        uint64_t r = rng_next(&s);
        switch (c) {
        case C_NORMAL: {
            unsigned pick = (unsigned)(r % 211);
            float v = pick == 0   ? NAN
                      : pick == 1 ? INFINITY
                      : pick == 2 ? -INFINITY
                                  : (float)(((double)(rng_next(&s) >> 11) / 9007199254740992.0 * 2.0 - 1.0) *
                                            ldexp(1.0, (int)(r >> 40) % 24 - 12));
            put_value(data, dtype, i, v);
            break;
        }
        case C_BITS:
            if (dtype == PRISM_DTYPE_F32)
                ((uint32_t *)data)[i] = (uint32_t)(r >> 32);
            else
                ((uint16_t *)data)[i] = (uint16_t)(r >> 48);
            break;
        case C_SUBNORMAL: {
            uint32_t man = r % 17 == 0 ? 0 : (uint32_t)(r >> 40);
            uint32_t sign = (uint32_t)(r & 1) << 31;
            if (dtype == PRISM_DTYPE_F32)
                ((uint32_t *)data)[i] = sign | (man & 0x7fffffu);
            else if (dtype == PRISM_DTYPE_BF16)
                ((uint16_t *)data)[i] = (uint16_t)(sign >> 16 | (man & 0x7fu));
            else
                ((uint16_t *)data)[i] = (uint16_t)(sign >> 16 | (man & 0x3ffu));
            break;
        }
        case C_ZEROS: put_value(data, dtype, i, (r & 1) ? -0.0f : 0.0f); break;
        default: put_value(data, dtype, i, (float)((int)(r % 509) - 254) * 0.5f); break;
        }
    }
    return data;
}

/* ---- comparisons ----------------------------------------------------------------------------- */

static int failures_shown;

static void show_failure(const char *what, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void show_failure(const char *what, const char *fmt, ...)
{
    if (failures_shown++ >= 20)
        return;
    fprintf(stderr, "\n  %s: ", what);
    va_list ap;
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
}

static bool same_bytes(const char *what, const char *part, const void *want, const void *got, size_t n)
{
    const uint8_t *a = want, *b = got;
    for (size_t i = 0; i < n; i++)
        if (a[i] != b[i]) {
            show_failure(what, "%s byte %zu: cpu 0x%02x, cuda 0x%02x", part, i, a[i], b[i]);
            return false;
        }
    return true;
}

static bool same_counts(const char *what, const prism_quant_counts *want, const prism_quant_counts *got)
{
    if (want->saturated == got->saturated && want->underflowed == got->underflowed &&
        want->nonfinite == got->nonfinite && want->bad_scale == got->bad_scale)
        return true;
    show_failure(what, "counts: cpu %llu/%llu/%llu/%llu, cuda %llu/%llu/%llu/%llu",
                 (unsigned long long)want->saturated, (unsigned long long)want->underflowed,
                 (unsigned long long)want->nonfinite, (unsigned long long)want->bad_scale,
                 (unsigned long long)got->saturated, (unsigned long long)got->underflowed,
                 (unsigned long long)got->nonfinite, (unsigned long long)got->bad_scale);
    return false;
}

/* ---- the table ------------------------------------------------------------------------------- */

typedef struct granularity_case {
    prism_granularity granularity;
    size_t group;
} granularity_case;

static const granularity_case granularities[] = {
    {PRISM_GRANULARITY_TENSOR, 0}, {PRISM_GRANULARITY_ROW, 4096}, {PRISM_GRANULARITY_ROW, 130},
    {PRISM_GRANULARITY_ROW, 129},  {PRISM_GRANULARITY_BLOCK, 128}, {PRISM_GRANULARITY_BLOCK, 7},
    {PRISM_GRANULARITY_BLOCK, 20001},
};

static const prism_precision formats[] = {PRISM_PRECISION_INT8, PRISM_PRECISION_FP8_E4M3,
                                          PRISM_PRECISION_FP8_E5M2, PRISM_PRECISION_INT4};

static const size_t lengths[] = {0, 1, 7, 129, 2049, TEST_BIG_LEN};

static size_t case_numel(const granularity_case *g, size_t len)
{
    if (g->granularity != PRISM_GRANULARITY_ROW || len == 0)
        return len;
    size_t rows = len / g->group;
    return (rows ? rows : 1) * g->group;
}

/* Both forms on both backends: the counted one (codes, scales, counts), then the scaled one under
 * `given` scales, or (NULL) the computed ones times factors (codes, amax, counts). The CUDA side reads the input at an element
 * offset and writes codes at a byte offset of `pad`. */
static void check_case(const prism_quant_spec *spec, const void *host, prism_dtype dtype, size_t numel,
                       size_t pad, const float *given, const char *what)
{
    prism_error err = {0};
    size_t groups = 0, group_len = 0, code_bytes = 0;
    CU_ASSERT_EQUAL_FATAL(prism_quant_layout(spec, numel, &groups, &group_len, &code_bytes, &err), PRISM_OK);
    prism_tensor hx = {host, numel, dtype};
    uint8_t *codes = xmalloc(code_bytes), *gcodes = xmalloc(code_bytes);
    float *scales = xmalloc(groups * 4), *gscales = xmalloc(groups * 4);
    float *amax = xmalloc(groups * 4), *gamax = xmalloc(groups * 4);
    prism_quant_counts counts, gcounts;
    CU_ASSERT_EQUAL_FATAL(prism_quantize_counted_cpu(spec, &hx, codes, scales, &counts, &err), PRISM_OK);

    size_t esize = dtype_size(dtype);
    char *dx = dev_upload(host, numel * esize, pad * esize);
    uint8_t *dcodes = dev_alloc(code_bytes + pad);
    float *dscales = dev_alloc(groups * 4), *damax = dev_alloc(groups * 4);
    prism_quant_counts *dcounts = dev_alloc(sizeof *dcounts);
    prism_tensor gx = {dx + pad * esize, numel, dtype};
    prism_status st = prism_quantize_counted_cuda(spec, &gx, dcodes + pad, dscales, dcounts,
                                                  (prism_cuda_stream)test_stream(), &err);
    if (st != PRISM_OK)
        show_failure(what, "counted: %s", err.message);
    CU_ASSERT_EQUAL_FATAL(st, PRISM_OK);
    dev_sync();
    dev_download(gcodes, dcodes + pad, code_bytes);
    dev_download(gscales, dscales, groups * 4);
    dev_download(&gcounts, dcounts, sizeof gcounts);
    CU_ASSERT_TRUE(same_bytes(what, "counted codes", codes, gcodes, code_bytes));
    CU_ASSERT_TRUE(same_bytes(what, "counted scales", scales, gscales, groups * 4));
    CU_ASSERT_TRUE(same_counts(what, &counts, &gcounts));

    static const float factors[] = {0.25f, 1.0f, 0.3f, 4.0f, 0.71f, 0.1f, 1.9f};
    for (size_t g = 0; g < groups; g++) {
        /* A product that leaves the binary32 range (2^-149 * 0.25, FLT_MAX * 4) keeps the scale. */
        float f = given ? given[g] : scales[g] * factors[g % COUNT(factors)];
        scales[g] = f > 0.0f && !isinf(f) ? f : scales[g];
    }
    CU_ASSERT_EQUAL_FATAL(prism_quantize_scaled_cpu(spec, &hx, scales, codes, amax, &counts, &err), PRISM_OK);
    if (groups)
        CU_ASSERT_EQUAL_FATAL(cudaMemcpy(dscales, scales, groups * 4, cudaMemcpyHostToDevice), cudaSuccess);
    CU_ASSERT_EQUAL_FATAL(cudaMemset(dcodes, 0xa5, code_bytes + pad), cudaSuccess);
    st = prism_quantize_scaled_cuda(spec, &gx, dscales, dcodes + pad, damax, dcounts,
                                    (prism_cuda_stream)test_stream(), &err);
    if (st != PRISM_OK)
        show_failure(what, "scaled: %s", err.message);
    CU_ASSERT_EQUAL_FATAL(st, PRISM_OK);
    dev_sync();
    dev_download(gcodes, dcodes + pad, code_bytes);
    dev_download(gamax, damax, groups * 4);
    dev_download(&gcounts, dcounts, sizeof gcounts);
    CU_ASSERT_TRUE(same_bytes(what, "scaled codes", codes, gcodes, code_bytes));
    CU_ASSERT_TRUE(same_bytes(what, "scaled amax", amax, gamax, groups * 4));
    CU_ASSERT_TRUE(same_counts(what, &counts, &gcounts));

    cudaFree(dx);
    cudaFree(dcodes);
    cudaFree(dscales);
    cudaFree(damax);
    cudaFree(dcounts);
    free(codes);
    free(gcodes);
    free(scales);
    free(gscales);
    free(amax);
    free(gamax);
}

static void run_table(prism_rounding rounding)
{
    failures_shown = 0;
    size_t cases = 0, seen = 0;
    for (int c = 0; c < C_COUNT; c++)
        for (size_t li = 0; li < COUNT(lengths); li++)
            for (prism_dtype dtype = PRISM_DTYPE_F32; dtype <= PRISM_DTYPE_F16; dtype++) {
                size_t most = lengths[li] < 32768 ? 32768 : lengths[li];
                void *data = make_data(dtype, (content)c, most, (uint64_t)(c * 131 + li * 7 + dtype));
                for (size_t fi = 0; fi < COUNT(formats); fi++)
                    for (size_t gi = 0; gi < COUNT(granularities); gi++)
                        for (int pow2 = 0; pow2 <= 1; pow2++)
                            for (size_t pad = 0; pad <= (lengths[li] <= 2049 ? 1u : 0u); pad++) {
                                if ((seen++ + (size_t)rounding) % TEST_CASE_STRIDE != 0)
                                    continue;
                                prism_quant_spec spec = {
                                    .format = formats[fi],
                                    .granularity = granularities[gi].granularity,
                                    .group = granularities[gi].group,
                                    .scale_mode = pow2 ? PRISM_SCALE_POW2 : PRISM_SCALE_FP32,
                                    .rounding = rounding,
                                    .seed = 0x5ca1ed00u + li,
                                };
                                size_t numel = case_numel(&granularities[gi], lengths[li]);
                                char what[200];
                                snprintf(what, sizeof what, "%s %s/%d/%zu %s %s n=%zu pad=%zu",
                                         prism_precision_name(spec.format), pow2 ? "pow2" : "fp32",
                                         (int)spec.granularity, spec.group, dtype_names[dtype], content_names[c],
                                         numel, pad);
                                check_case(&spec, data, dtype, numel, pad, NULL, what);
                                cases++;
                            }
                free(data);
            }
    printf("(%zu cases) ", cases);
}

static void test_scaled_and_counted_nearest_match_cpu_bit_for_bit(void)
{
    if (skip_without_device())
        return;
    run_table(PRISM_ROUNDING_NEAREST);
}

static void test_scaled_and_counted_stochastic_match_cpu_bit_for_bit(void)
{
    if (skip_without_device())
        return;
    run_table(PRISM_ROUNDING_STOCHASTIC);
}

/* The saturation boundaries of kernels.h on the device, just below, at and above. */
static void test_boundaries_count_as_on_the_cpu(void)
{
    if (skip_without_device())
        return;
    const float x[] = {127.0f, nextafterf(127.5f, 0.0f), 127.5f, 7.5f, nextafterf(7.5f, 0.0f), 464.0f,
                       nextafterf(464.0f, INFINITY), 61440.0f, nextafterf(61440.0f, 0.0f), 0.5f, -0.5f,
                       1e-45f, NAN, -INFINITY, 0.0f, -0.0f};
    for (size_t fi = 0; fi < COUNT(formats); fi++)
        for (int stochastic = 0; stochastic < 2; stochastic++) {
            prism_quant_spec spec = {.format = formats[fi], .rounding = (prism_rounding)stochastic, .seed = 3};
            char what[64];
            snprintf(what, sizeof what, "%s boundaries %s", prism_precision_name(spec.format),
                     stochastic ? "stochastic" : "nearest");
            float ones[COUNT(x)]; /* one group (per tensor) takes ones[0]; sized so that no compiler doubts it */
            for (size_t i = 0; i < COUNT(x); i++)
                ones[i] = 1.0f;
            check_case(&spec, x, PRISM_DTYPE_F32, COUNT(x), 0, ones, what);
        }
}

/* ---- refusals -------------------------------------------------------------------------------- */

#define ASSERT_SAME_REFUSAL(cpu_call, cuda_call)                                                \
    do {                                                                                        \
        prism_error cpu_err_ = {0}, cuda_err_ = {0};                                            \
        prism_error *err = &cpu_err_;                                                           \
        prism_status cpu_st_ = (cpu_call);                                                      \
        err = &cuda_err_;                                                                       \
        prism_status cuda_st_ = (cuda_call);                                                    \
        CU_ASSERT_NOT_EQUAL(cpu_st_, PRISM_OK);                                                 \
        CU_ASSERT_EQUAL(cuda_st_, cpu_st_);                                                     \
        CU_ASSERT_STRING_EQUAL(cuda_err_.message, cpu_err_.message);                            \
    } while (0)

/* The checks made on the host before any GPU work: spec, tensor, NULL buffers. */
static void test_refuses_what_the_cpu_refuses_with_its_message(void)
{
    float x[8] = {0}, s[8] = {1, 1, 1, 1, 1, 1, 1, 1}, a[8];
    uint8_t codes[8];
    prism_quant_counts k;
    prism_tensor t = {x, 8, PRISM_DTYPE_F32}, bad_dtype = {x, 8, (prism_dtype)9}, no_data = {NULL, 8, PRISM_DTYPE_F32};
    prism_quant_spec ok = {.format = PRISM_PRECISION_INT8}, bf16 = {.format = PRISM_PRECISION_BF16},
                     rows = {.format = PRISM_PRECISION_INT8, .granularity = PRISM_GRANULARITY_ROW, .group = 3};
    ASSERT_SAME_REFUSAL(prism_quantize_scaled_cpu(NULL, &t, s, codes, a, &k, err),
                        prism_quantize_scaled_cuda(NULL, &t, s, codes, a, &k, NULL, err));
    ASSERT_SAME_REFUSAL(prism_quantize_scaled_cpu(&bf16, &t, s, codes, a, &k, err),
                        prism_quantize_scaled_cuda(&bf16, &t, s, codes, a, &k, NULL, err));
    ASSERT_SAME_REFUSAL(prism_quantize_scaled_cpu(&rows, &t, s, codes, a, &k, err),
                        prism_quantize_scaled_cuda(&rows, &t, s, codes, a, &k, NULL, err));
    ASSERT_SAME_REFUSAL(prism_quantize_scaled_cpu(&ok, NULL, s, codes, a, &k, err),
                        prism_quantize_scaled_cuda(&ok, NULL, s, codes, a, &k, NULL, err));
    ASSERT_SAME_REFUSAL(prism_quantize_scaled_cpu(&ok, &bad_dtype, s, codes, a, &k, err),
                        prism_quantize_scaled_cuda(&ok, &bad_dtype, s, codes, a, &k, NULL, err));
    ASSERT_SAME_REFUSAL(prism_quantize_scaled_cpu(&ok, &no_data, s, codes, a, &k, err),
                        prism_quantize_scaled_cuda(&ok, &no_data, s, codes, a, &k, NULL, err));
    ASSERT_SAME_REFUSAL(prism_quantize_scaled_cpu(&ok, &t, NULL, codes, a, &k, err),
                        prism_quantize_scaled_cuda(&ok, &t, NULL, codes, a, &k, NULL, err));
    ASSERT_SAME_REFUSAL(prism_quantize_scaled_cpu(&ok, &t, s, NULL, a, &k, err),
                        prism_quantize_scaled_cuda(&ok, &t, s, NULL, a, &k, NULL, err));
    ASSERT_SAME_REFUSAL(prism_quantize_counted_cpu(&bf16, &t, codes, s, &k, err),
                        prism_quantize_counted_cuda(&bf16, &t, codes, s, &k, NULL, err));
    ASSERT_SAME_REFUSAL(prism_quantize_counted_cpu(&ok, &t, codes, NULL, &k, err),
                        prism_quantize_counted_cuda(&ok, &t, codes, NULL, &k, NULL, err));
}

/* Bad scales in device memory: the host never reads them (no wait on the stream). A group whose
 * scale is 0, negative, NaN or Inf gets code 0 for every element and is counted in bad_scale, its
 * elements in neither saturated nor underflowed (a NaN element still in nonfinite); the other
 * groups are quantized as the CPU does under their scales (1 here: the codes are the values); amax
 * is every group's own. The CPU refuses the same scales by name. */
static void test_bad_device_scales_are_code_zero_and_counted(void)
{
    if (skip_without_device())
        return;
    float x[7] = {1, 2, 3, 4, 5, 6, NAN};
    const float cases[][4] = {{1, 0, 1, 1}, {1, -1, 1, 1}, {1, 1, NAN, 1}, {INFINITY, 1, 1, 1}, {0, 0, 0, NAN}};
    const uint8_t want_codes[][7] = {{1, 2, 0, 0, 5, 6, 0}, {1, 2, 0, 0, 5, 6, 0}, {1, 2, 3, 4, 0, 0, 0},
                                     {0, 0, 3, 4, 5, 6, 0}, {0, 0, 0, 0, 0, 0, 0}};
    const uint64_t want_bad[] = {1, 1, 1, 1, 4};
    const float want_amax[4] = {2, 4, 6, 0};
    float *dx = dev_upload(x, sizeof x, 0), *ds = dev_alloc(4 * 4), *damax = dev_alloc(4 * 4);
    uint8_t codes[7], *dcodes = dev_alloc(7);
    prism_quant_counts *dcounts = dev_alloc(sizeof *dcounts);
    prism_quant_spec spec = {.format = PRISM_PRECISION_INT8, .granularity = PRISM_GRANULARITY_BLOCK, .group = 2};
    prism_tensor t = {x, 7, PRISM_DTYPE_F32}, gt = {dx, 7, PRISM_DTYPE_F32};
    for (size_t c = 0; c < COUNT(cases); c++) {
        prism_error err = {0};
        CU_ASSERT_EQUAL(prism_quantize_scaled_cpu(&spec, &t, cases[c], codes, NULL, NULL, &err), PRISM_ERR_INVALID);
        CU_ASSERT_PTR_NOT_NULL(strstr(err.message, "is not a finite scale > 0"));
        CU_ASSERT_EQUAL_FATAL(cudaMemcpy(ds, cases[c], 4 * 4, cudaMemcpyHostToDevice), cudaSuccess);
        CU_ASSERT_EQUAL_FATAL(prism_quantize_scaled_cuda(&spec, &gt, ds, dcodes, damax, dcounts,
                                                         (prism_cuda_stream)test_stream(), &err),
                              PRISM_OK);
        CU_ASSERT_EQUAL_FATAL(cudaStreamSynchronize(test_stream()), cudaSuccess);
        prism_quant_counts got;
        float amax[4];
        dev_download(codes, dcodes, sizeof codes);
        dev_download(&got, dcounts, sizeof got);
        dev_download(amax, damax, sizeof amax);
        CU_ASSERT(memcmp(codes, want_codes[c], sizeof codes) == 0);
        CU_ASSERT(memcmp(amax, want_amax, sizeof amax) == 0);
        CU_ASSERT_EQUAL(got.saturated, 0);
        CU_ASSERT_EQUAL(got.underflowed, 0);
        CU_ASSERT_EQUAL(got.nonfinite, 1);
        CU_ASSERT_EQUAL(got.bad_scale, want_bad[c]);
    }
    cudaFree(dx);
    cudaFree(ds);
    cudaFree(damax);
    cudaFree(dcodes);
    cudaFree(dcounts);
}

/* Bad scales over many CTAs, INT4 packing and groups of 3 that cross the 16-element chunks of the
 * kernel's threads: 10000 elements (3334 groups, the last of one element), scale 1 everywhere but
 * groups 5 (elements 15-17, across the chunk boundary at 16), 1000, 1365 (4095-4097, across the
 * first CTA's end at 4096), 2133 (6399-6401, across 6400) and 3333 (the last). Values -2 .. 4, so
 * that every bad group, the last included, has an element whose good code is not 0: a good
 * group's codes are its values; a bad one's nibbles are 0; bad_scale counts each bad group once;
 * the CPU's codes under scale 1 everywhere agree on every other element. */
static void test_bad_device_scales_across_chunks_and_ctas(void)
{
    if (skip_without_device())
        return;
    enum { N = 10000, GROUP = 3, GROUPS = (N + GROUP - 1) / GROUP };
    static float x[N], scales[GROUPS], ones[GROUPS];
    static uint8_t want[N / 2], got[N / 2];
    static const size_t bad[] = {5, 1000, 1365, 2133, 3333};
    for (size_t i = 0; i < N; i++)
        x[i] = (float)((int)(i % 7) - 2);
    for (size_t g = 0; g < GROUPS; g++)
        scales[g] = ones[g] = 1.0f;
    for (size_t k = 0; k < COUNT(bad); k++)
        scales[bad[k]] = k % 2 ? -0.0f : NAN;
    prism_quant_spec spec = {.format = PRISM_PRECISION_INT4, .granularity = PRISM_GRANULARITY_BLOCK, .group = GROUP};
    prism_tensor t = {x, N, PRISM_DTYPE_F32};
    prism_error err = {0};
    CU_ASSERT_EQUAL_FATAL(prism_quantize_scaled_cpu(&spec, &t, ones, want, NULL, NULL, &err), PRISM_OK);
    for (size_t k = 0; k < COUNT(bad); k++)
        for (size_t i = bad[k] * GROUP; i < N && i < (bad[k] + 1) * GROUP; i++)
            want[i / 2] &= (uint8_t)(i % 2 ? 0x0f : 0xf0); /* that element's nibble 0 */
    float *dx = dev_upload(x, sizeof x, 0), *ds = dev_upload(scales, sizeof scales, 0);
    uint8_t *dcodes = dev_alloc(sizeof got);
    prism_quant_counts *dcounts = dev_alloc(sizeof *dcounts);
    prism_tensor gt = {dx, N, PRISM_DTYPE_F32};
    CU_ASSERT_EQUAL_FATAL(prism_quantize_scaled_cuda(&spec, &gt, ds, dcodes, NULL, dcounts,
                                                     (prism_cuda_stream)test_stream(), &err),
                          PRISM_OK);
    dev_sync();
    prism_quant_counts counts;
    dev_download(got, dcodes, sizeof got);
    dev_download(&counts, dcounts, sizeof counts);
    CU_ASSERT(memcmp(got, want, sizeof got) == 0);
    CU_ASSERT_EQUAL(counts.bad_scale, COUNT(bad));
    CU_ASSERT_EQUAL(counts.saturated, 0);
    CU_ASSERT_EQUAL(counts.underflowed, 0);
    CU_ASSERT_EQUAL(counts.nonfinite, 0);
    cudaFree(dx);
    cudaFree(ds);
    cudaFree(dcodes);
    cudaFree(dcounts);
}

static void test_empty_calls_succeed_without_gpu_work(void)
{
    prism_error err = {0};
    prism_quant_spec spec = {.format = PRISM_PRECISION_INT4};
    prism_tensor empty = {NULL, 0, PRISM_DTYPE_F32};
    CU_ASSERT_EQUAL(prism_quantize_scaled_cuda(&spec, &empty, NULL, NULL, NULL, NULL, NULL, &err), PRISM_OK);
    CU_ASSERT_EQUAL(prism_quantize_counted_cuda(&spec, &empty, NULL, NULL, NULL, NULL, &err), PRISM_OK);
}

static const prism_test_case cases[] = {
    {"test_refuses_what_the_cpu_refuses_with_its_message", test_refuses_what_the_cpu_refuses_with_its_message},
    {"test_empty_calls_succeed_without_gpu_work", test_empty_calls_succeed_without_gpu_work},
    {"test_bad_device_scales_are_code_zero_and_counted", test_bad_device_scales_are_code_zero_and_counted},
    {"test_bad_device_scales_across_chunks_and_ctas", test_bad_device_scales_across_chunks_and_ctas},
    {"test_boundaries_count_as_on_the_cpu", test_boundaries_count_as_on_the_cpu},
    {"test_scaled_and_counted_nearest_match_cpu_bit_for_bit",
     test_scaled_and_counted_nearest_match_cpu_bit_for_bit},
    {"test_scaled_and_counted_stochastic_match_cpu_bit_for_bit",
     test_scaled_and_counted_stochastic_match_cpu_bit_for_bit},
    {NULL, NULL},
};

static const prism_test_suite suites[] = {{"kernels_scaled_cuda", cases}, {NULL, NULL}};

int main(int argc, char **argv)
{
    if (device_count() == 0)
        printf("SKIPPED: no CUDA device (the GPU-only checks below pass without running)\n");
    return prism_test_main(argc, argv, suites);
}
