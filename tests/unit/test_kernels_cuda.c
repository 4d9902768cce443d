/* The CUDA kernels (include/prism/cuda.h) against the CPU reference (kernels.h), on the same
 * data: quantize, dequantize and dequantize-accumulate must give the same bits (codes, scales,
 * outputs; a NaN output only has to be a NaN, since the GPU's NaNs carry no payload), gradient
 * statistics and relative error must agree within a tolerance (their double sums run in another
 * order), with counts and max_abs exact.
 *
 * The quantization table is formats x granularities (tensor; rows of even, odd, vector-sized
 * and very long length; blocks of 128, 24, 7, the default and an odd length longer than a CUDA
 * team holds) x input dtypes x roundings x scale modes x lengths (0, 1, 7, 129, 2049, 1M + 3)
 * x contents (normal values with NaN/Inf, random bit patterns, subnormals, zeros of both signs,
 * halves that tie), each also with input and codes one element off 16-byte alignment where the
 * length is small. Without a device every GPU test prints "(SKIPPED: no CUDA device)" and
 * returns; the argument checks, which run on the host before any GPU work, run anyway. */
#include "prism/cuda.h"
#include "prism/kernels.h"
#include "testutil.h"

#include <cuda_runtime_api.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The longest tensor of the tables. */
#ifndef TEST_BIG_LEN
#define TEST_BIG_LEN ((size_t)1048576 + 3)
#endif

/* Every TEST_CASE_STRIDE-th case of the quantization table runs (1: all). The ThreadSanitizer
 * build takes every 7th (7 is prime to every dimension of the table, so each value of each
 * dimension still runs), offset by the rounding so the two tables take different cases. */
#ifndef TEST_CASE_STRIDE
#define TEST_CASE_STRIDE 1
#endif

/* Relative tolerances, GPU against CPU. Both sum in double: the GPU's order differs, so the last
 * few bits do (about 1e-15 relative); these leave room without hiding a wrong formula. */
#define STATS_RTOL 1e-9
#define ERROR_RTOL 1e-12

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

/* ---- buffers ---------------------------------------------------------------------------- */

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

/* A device buffer of n bytes (at least 1) filled with the byte 0xa5, so bytes a kernel should
 * have written but did not show up. */
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

/* ---- data ------------------------------------------------------------------------------- */

typedef enum content {
    CONTENT_NORMAL,    /* values of many magnitudes, with NaN, +Inf and -Inf here and there */
    CONTENT_BITS,      /* random bit patterns of the dtype: every exponent, NaNs, subnormals */
    CONTENT_SUBNORMAL, /* subnormals of the dtype (and a few zeros): tiny amax and scales */
    CONTENT_ZEROS,     /* +0 and -0 only: amax 0, scale 1, codes 0 */
    CONTENT_HALVES,    /* multiples of 1/2 up to 127: x / s lands on rounding ties */
    CONTENT_COUNT
} content;

static const char *const content_names[] = {"normal", "bits", "subnormal", "zeros", "halves"};
static const char *const dtype_names[] = {"f32", "bf16", "f16"};

static uint64_t rng_next(uint64_t *s)
{
    *s ^= *s >> 12;
    *s ^= *s << 25;
    *s ^= *s >> 27;
    return *s * 0x2545F4914F6CDD1Dull;
}

static double rng_unit(uint64_t *s)
{
    return (double)(rng_next(s) >> 11) / 9007199254740992.0;
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

static float get_value(const void *data, prism_dtype dtype, size_t i)
{
    switch (dtype) {
    case PRISM_DTYPE_F32: return ((const float *)data)[i];
    case PRISM_DTYPE_BF16: return prism_bf16_to_f32(((const uint16_t *)data)[i]);
    default: return prism_f16_to_f32(((const uint16_t *)data)[i]);
    }
}

/* n elements of dtype with the given content, from seed. */
static void *make_data(prism_dtype dtype, content c, size_t n, uint64_t seed)
{
    void *data = xmalloc(n * dtype_size(dtype));
    uint64_t s = seed * 0x9E3779B97F4A7C15ull + 1;
    for (size_t i = 0; i < n; i++) {
        uint64_t r = rng_next(&s);
        float v;
        switch (c) {
        case CONTENT_NORMAL: {
            unsigned pick = (unsigned)(r % 211);
            if (pick == 0)
                v = NAN;
            else if (pick == 1)
                v = INFINITY;
            else if (pick == 2)
                v = -INFINITY;
            else /* a spread of exponents around 1 */
                v = (float)((rng_unit(&s) * 2.0 - 1.0) * ldexp(1.0, (int)(r >> 40) % 24 - 12));
            put_value(data, dtype, i, v);
            break;
        }
        case CONTENT_BITS:
            if (dtype == PRISM_DTYPE_F32)
                ((uint32_t *)data)[i] = (uint32_t)(r >> 32);
            else
                ((uint16_t *)data)[i] = (uint16_t)(r >> 48);
            break;
        case CONTENT_SUBNORMAL: {
            uint32_t man = (uint32_t)(r >> 40);
            if (r % 17 == 0)
                man = 0;
            uint32_t sign = (uint32_t)(r & 1) << 31;
            if (dtype == PRISM_DTYPE_F32) {
                ((uint32_t *)data)[i] = sign | (man & 0x7fffffu);
            } else if (dtype == PRISM_DTYPE_BF16) {
                ((uint16_t *)data)[i] = (uint16_t)(sign >> 16 | (man & 0x7fu));
            } else {
                ((uint16_t *)data)[i] = (uint16_t)(sign >> 16 | (man & 0x3ffu));
            }
            break;
        }
        case CONTENT_ZEROS: put_value(data, dtype, i, (r & 1) ? -0.0f : 0.0f); break;
        default: put_value(data, dtype, i, (float)((int)(r % 509) - 254) * 0.5f); break;
        }
    }
    return data;
}

/* ---- comparisons -------------------------------------------------------------------------- */

static int failures_shown;

/* Prints the first failures of a test (a table can fail in thousands of cases at once). */
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

/* Equal bytes; the first difference is reported. */
static bool same_bytes(const char *what, const void *want, const void *got, size_t n)
{
    const uint8_t *a = want, *b = got;
    for (size_t i = 0; i < n; i++)
        if (a[i] != b[i]) {
            show_failure(what, "byte %zu: cpu 0x%02x, cuda 0x%02x", i, a[i], b[i]);
            return false;
        }
    return true;
}

static bool is_nan_bits(uint32_t bits, prism_dtype dtype)
{
    switch (dtype) {
    case PRISM_DTYPE_F32: return (bits & 0x7fffffffu) > 0x7f800000u;
    case PRISM_DTYPE_BF16: return (bits & 0x7fffu) > 0x7f80u;
    default: return (bits & 0x7fffu) > 0x7c00u;
    }
}

/* Equal elements, bit for bit, except that any NaN equals any NaN. */
static bool same_values(const char *what, const void *want, const void *got, size_t n, prism_dtype dtype)
{
    for (size_t i = 0; i < n; i++) {
        uint32_t a, b;
        if (dtype == PRISM_DTYPE_F32) {
            memcpy(&a, (const char *)want + 4 * i, 4);
            memcpy(&b, (const char *)got + 4 * i, 4);
        } else {
            a = ((const uint16_t *)want)[i];
            b = ((const uint16_t *)got)[i];
        }
        if (a != b && !(is_nan_bits(a, dtype) && is_nan_bits(b, dtype))) {
            show_failure(what, "element %zu: cpu 0x%08x, cuda 0x%08x", i, a, b);
            return false;
        }
    }
    return true;
}

static bool close_to(double want, double got, double rtol)
{
    if (isnan(want) || isnan(got))
        return isnan(want) && isnan(got);
    if (isinf(want) || isinf(got))
        return want == got;
    return fabs(got - want) <= rtol * fabs(want);
}

/* ---- quantization table ------------------------------------------------------------------- */

typedef struct granularity_case {
    prism_granularity granularity;
    size_t group;
} granularity_case;

static const granularity_case granularities[] = {
    {PRISM_GRANULARITY_TENSOR, 0},
    {PRISM_GRANULARITY_ROW, 4096},  /* a CUDA team per row, in registers */
    {PRISM_GRANULARITY_ROW, 130},   /* even, not a multiple of 8: element by element */
    {PRISM_GRANULARITY_ROW, 129},   /* odd: INT4 rows share bytes */
    {PRISM_GRANULARITY_ROW, 32768}, /* longer than a team holds: pieces and atomics */
    {PRISM_GRANULARITY_BLOCK, 128},
    {PRISM_GRANULARITY_BLOCK, 0}, /* the default, 128 */
    {PRISM_GRANULARITY_BLOCK, 24},
    {PRISM_GRANULARITY_BLOCK, 7},
    {PRISM_GRANULARITY_BLOCK, 20001}, /* odd and longer than a team holds */
};

static const prism_precision formats[] = {PRISM_PRECISION_INT8, PRISM_PRECISION_FP8_E4M3,
                                          PRISM_PRECISION_FP8_E5M2, PRISM_PRECISION_INT4};

static const size_t lengths[] = {0, 1, 7, 129, 2049, TEST_BIG_LEN};

#define COUNT(a) (sizeof(a) / sizeof((a)[0]))

/* The elements a case quantizes: rows need a whole number of them, so a row case takes as many
 * whole rows as fit in the length, and one row when none does. */
static size_t case_numel(const granularity_case *g, size_t len)
{
    if (g->granularity != PRISM_GRANULARITY_ROW || len == 0)
        return len;
    size_t rows = len / g->group;
    return (rows ? rows : 1) * g->group;
}

/* Quantizes host data (numel elements of dtype) on both backends and compares codes, scales and
 * the NaN/Inf count; with decode set, also dequantizes and accumulates the codes on both. The
 * CUDA side reads the input at an element offset and writes codes at a byte offset of `pad`
 * (0 or 1), which takes the kernels off their aligned paths. */
static void check_quantize(const prism_quant_spec *spec, const void *host, prism_dtype dtype,
                           size_t numel, size_t pad, bool decode, const char *what)
{
    prism_error err = {0};
    size_t groups = 0, group_len = 0, code_bytes = 0;
    CU_ASSERT_EQUAL_FATAL(prism_quant_layout(spec, numel, &groups, &group_len, &code_bytes, &err), PRISM_OK);

    prism_tensor hx = {host, numel, dtype};
    uint8_t *codes = xmalloc(code_bytes), *gcodes = xmalloc(code_bytes);
    float *scales = xmalloc(groups * 4), *gscales = xmalloc(groups * 4);
    uint64_t nonfinite = 0;
    unsigned long long gnonfinite = 0;
    CU_ASSERT_EQUAL_FATAL(prism_quantize_cpu(spec, &hx, codes, scales, &nonfinite, &err), PRISM_OK);

    size_t esize = dtype_size(dtype);
    char *dx = dev_upload(host, numel * esize, pad * esize);
    uint8_t *dcodes = dev_alloc(code_bytes + pad);
    float *dscales = dev_alloc(groups * 4);
    unsigned long long *dnonfinite = dev_alloc(sizeof *dnonfinite);
    prism_tensor gx = {dx + pad * esize, numel, dtype};
    prism_status st = prism_quantize_cuda(spec, &gx, dcodes + pad, dscales, dnonfinite,
                                          (prism_cuda_stream)test_stream(), &err);
    if (st != PRISM_OK)
        fprintf(stderr, "\n  %s: %s", what, err.message);
    CU_ASSERT_EQUAL_FATAL(st, PRISM_OK);
    dev_sync();
    dev_download(gcodes, dcodes + pad, code_bytes);
    dev_download(gscales, dscales, groups * 4);
    dev_download(&gnonfinite, dnonfinite, sizeof gnonfinite);

    char label[256];
    snprintf(label, sizeof label, "%s codes", what);
    CU_ASSERT_TRUE(same_bytes(label, codes, gcodes, code_bytes));
    snprintf(label, sizeof label, "%s scales", what);
    CU_ASSERT_TRUE(same_bytes(label, scales, gscales, groups * 4));
    if (gnonfinite != nonfinite)
        show_failure(what, "nonfinite: cpu %llu, cuda %llu", (unsigned long long)nonfinite, gnonfinite);
    CU_ASSERT_EQUAL(gnonfinite, nonfinite);

    if (decode && numel) {
        /* Both backends decode the reference's codes. */
        CU_ASSERT_EQUAL_FATAL(cudaMemcpy(dcodes + pad, codes, code_bytes, cudaMemcpyHostToDevice), cudaSuccess);
        CU_ASSERT_EQUAL_FATAL(cudaMemcpy(dscales, scales, groups * 4, cudaMemcpyHostToDevice), cudaSuccess);
        for (prism_dtype out = PRISM_DTYPE_F32; out <= PRISM_DTYPE_F16; out++) {
            size_t osize = dtype_size(out);
            void *want = xmalloc(numel * osize), *got = xmalloc(numel * osize);
            char *dout = dev_alloc(numel * osize + pad * osize);
            CU_ASSERT_EQUAL_FATAL(prism_dequantize_cpu(spec, codes, scales, numel, want, out, &err), PRISM_OK);
            CU_ASSERT_EQUAL_FATAL(prism_dequantize_cuda(spec, dcodes + pad, dscales, numel, dout + pad * osize, out,
                                                        (prism_cuda_stream)test_stream(), &err),
                                  PRISM_OK);
            dev_sync();
            dev_download(got, dout + pad * osize, numel * osize);
            snprintf(label, sizeof label, "%s dequantize to %s", what, dtype_names[out]);
            CU_ASSERT_TRUE(same_values(label, want, got, numel, out));
            cudaFree(dout);
            free(want);
            free(got);
        }
        float *acc = make_data(PRISM_DTYPE_F32, CONTENT_NORMAL, numel, numel + 7);
        float *gacc = xmalloc(numel * 4);
        char *dacc = dev_upload(acc, numel * 4, pad * 4);
        CU_ASSERT_EQUAL_FATAL(prism_dequantize_accumulate_cpu(spec, codes, scales, numel, acc, &err), PRISM_OK);
        CU_ASSERT_EQUAL_FATAL(prism_dequantize_accumulate_cuda(spec, dcodes + pad, dscales, numel,
                                                               (float *)(dacc + pad * 4),
                                                               (prism_cuda_stream)test_stream(), &err),
                              PRISM_OK);
        dev_sync();
        dev_download(gacc, dacc + pad * 4, numel * 4);
        snprintf(label, sizeof label, "%s accumulate", what);
        CU_ASSERT_TRUE(same_values(label, acc, gacc, numel, PRISM_DTYPE_F32));
        cudaFree(dacc);
        free(acc);
        free(gacc);
    }
    cudaFree(dx);
    cudaFree(dcodes);
    cudaFree(dscales);
    cudaFree(dnonfinite);
    free(codes);
    free(gcodes);
    free(scales);
    free(gscales);
}

/* Every case of the table for one rounding; decoding is checked for f32 inputs (the codes of the
 * other dtypes are the same kind of bytes). */
static void run_quantize_table(prism_rounding rounding)
{
    failures_shown = 0;
    size_t cases = 0, seen = 0;
    for (int c = 0; c < CONTENT_COUNT; c++)
        for (size_t li = 0; li < COUNT(lengths); li++)
            for (prism_dtype dtype = PRISM_DTYPE_F32; dtype <= PRISM_DTYPE_F16; dtype++) {
                /* Enough data for the longest case of this length (a row case may round up). */
                size_t most = lengths[li] < 32768 ? 32768 : lengths[li];
                void *data = make_data(dtype, (content)c, most, (uint64_t)(c * 131 + li * 7 + dtype));
                for (size_t fi = 0; fi < COUNT(formats); fi++)
                    for (size_t gi = 0; gi < COUNT(granularities); gi++)
                        for (int pow2 = 0; pow2 <= 1; pow2++)
                            for (size_t pad = 0; pad <= (lengths[li] <= 2049 ? 1u : 0u); pad++) {
                                prism_quant_spec spec = {
                                    .format = formats[fi],
                                    .granularity = granularities[gi].granularity,
                                    .group = granularities[gi].group,
                                    .scale_mode = pow2 ? PRISM_SCALE_POW2 : PRISM_SCALE_FP32,
                                    .rounding = rounding,
                                    .seed = 0x5eed0000u + li,
                                };
                                if ((seen++ + (size_t)rounding) % TEST_CASE_STRIDE != 0)
                                    continue;
                                size_t numel = case_numel(&granularities[gi], lengths[li]);
                                char what[200];
                                snprintf(what, sizeof what, "%s %s/%d/%zu %s %s n=%zu pad=%zu",
                                         prism_precision_name(spec.format), pow2 ? "pow2" : "fp32",
                                         (int)spec.granularity, spec.group, dtype_names[dtype],
                                         content_names[c], numel, pad);
                                check_quantize(&spec, data, dtype, numel, pad, dtype == PRISM_DTYPE_F32, what);
                                cases++;
                            }
                free(data);
            }
    printf("(%zu cases) ", cases);
}

static void test_quantize_nearest_matches_cpu_bit_for_bit(void)
{
    if (skip_without_device())
        return;
    run_quantize_table(PRISM_ROUNDING_NEAREST);
}

static void test_quantize_stochastic_matches_cpu_bit_for_bit(void)
{
    if (skip_without_device())
        return;
    run_quantize_table(PRISM_ROUNDING_STOCHASTIC);
}

/* Codes the quantizer never writes (FP8 NaNs and E5M2 infinities, INT8 -128, INT4 -8) and scales
 * of every size decode the same on both backends. */
static void test_dequantize_any_codes_matches_cpu(void)
{
    if (skip_without_device())
        return;
    failures_shown = 0;
    const size_t numel = 70001;
    uint64_t s = 42;
    uint8_t *codes = xmalloc(numel);
    for (size_t i = 0; i < numel; i++)
        codes[i] = (uint8_t)rng_next(&s);
    for (size_t fi = 0; fi < COUNT(formats); fi++)
        for (size_t gi = 1; gi < COUNT(granularities); gi++) {
            prism_quant_spec spec = {.format = formats[fi], .granularity = PRISM_GRANULARITY_BLOCK,
                                     .group = granularities[gi].group};
            size_t groups = 0, code_bytes = 0;
            prism_error err;
            CU_ASSERT_EQUAL_FATAL(prism_quant_layout(&spec, numel, &groups, NULL, &code_bytes, &err), PRISM_OK);
            float *scales = xmalloc(groups * 4);
            for (size_t g = 0; g < groups; g++) /* subnormal to huge, powers of two and not */
                scales[g] = (float)ldexp(1.0 + rng_unit(&s) * (g % 2), (int)(rng_next(&s) % 270) - 150);
            uint8_t *dcodes = dev_upload(codes, code_bytes, 0);
            float *dscales = dev_upload(scales, groups * 4, 0);
            for (prism_dtype out = PRISM_DTYPE_F32; out <= PRISM_DTYPE_F16; out++) {
                size_t osize = dtype_size(out);
                void *want = xmalloc(numel * osize), *got = xmalloc(numel * osize);
                void *dout = dev_alloc(numel * osize);
                CU_ASSERT_EQUAL_FATAL(prism_dequantize_cpu(&spec, codes, scales, numel, want, out, &err), PRISM_OK);
                CU_ASSERT_EQUAL_FATAL(prism_dequantize_cuda(&spec, dcodes, dscales, numel, dout, out, NULL, &err),
                                      PRISM_OK);
                CU_ASSERT_EQUAL_FATAL(cudaDeviceSynchronize(), cudaSuccess);
                dev_download(got, dout, numel * osize);
                char what[128];
                snprintf(what, sizeof what, "%s block %zu to %s", prism_precision_name(spec.format), spec.group,
                         dtype_names[out]);
                CU_ASSERT_TRUE(same_values(what, want, got, numel, out));
                cudaFree(dout);
                free(want);
                free(got);
            }
            cudaFree(dcodes);
            cudaFree(dscales);
            free(scales);
        }
    free(codes);
}

/* ---- statistics --------------------------------------------------------------------------- */

static bool same_stats(const char *what, size_t block, const prism_grad_stats *want, const prism_grad_stats *got)
{
    bool ok = close_to(want->l2_norm, got->l2_norm, STATS_RTOL) && want->max_abs == got->max_abs &&
              close_to(want->variance, got->variance, STATS_RTOL) && want->numel == got->numel &&
              want->nonfinite == got->nonfinite;
    /* The mean's own scale is the spread of the data: a mean near 0 of large values is known only
     * to a fraction of the standard deviation. */
    double spread = sqrt(want->variance) + fabs(want->mean);
    ok = ok && fabs(got->mean - want->mean) <= STATS_RTOL * spread;
    if (!ok && failures_shown++ < 20)
        fprintf(stderr,
                "\n  %s block %zu: cpu l2 %.17g max %.17g mean %.17g var %.17g n %llu bad %llu;"
                " cuda l2 %.17g max %.17g mean %.17g var %.17g n %llu bad %llu",
                what, block, want->l2_norm, want->max_abs, want->mean, want->variance,
                (unsigned long long)want->numel, (unsigned long long)want->nonfinite, got->l2_norm, got->max_abs,
                got->mean, got->variance, (unsigned long long)got->numel, (unsigned long long)got->nonfinite);
    return ok;
}

/* Runs both backends on blocks of host tensors (data uploaded, `pad` elements off alignment). */
static void check_stats(const prism_tensor *tensors, const size_t *block_start, size_t blocks, size_t pad,
                        const char *what)
{
    size_t count = block_start[blocks];
    prism_grad_stats *want = xmalloc(blocks * sizeof *want), *got = xmalloc(blocks * sizeof *got);
    prism_error err = {0};
    CU_ASSERT_EQUAL_FATAL(prism_grad_stats_blocks_cpu(tensors, block_start, blocks, want, &err), PRISM_OK);
    prism_tensor *dev = xmalloc(count * sizeof *dev);
    for (size_t t = 0; t < count; t++) {
        size_t esize = dtype_size(tensors[t].dtype);
        dev[t] = tensors[t];
        dev[t].data = tensors[t].numel
                          ? (char *)dev_upload(tensors[t].data, tensors[t].numel * esize, pad * esize) + pad * esize
                          : NULL;
    }
    prism_grad_stats *dout = dev_alloc(blocks * sizeof *dout);
    prism_status st = prism_grad_stats_blocks_cuda(dev, block_start, blocks, dout, (prism_cuda_stream)test_stream(), &err);
    if (st != PRISM_OK)
        fprintf(stderr, "\n  %s: %s", what, err.message);
    CU_ASSERT_EQUAL_FATAL(st, PRISM_OK);
    dev_sync();
    dev_download(got, dout, blocks * sizeof *got);
    for (size_t b = 0; b < blocks; b++)
        CU_ASSERT_TRUE(same_stats(what, b, &want[b], &got[b]));
    for (size_t t = 0; t < count; t++)
        if (dev[t].data)
            cudaFree((char *)dev[t].data - pad * dtype_size(dev[t].dtype));
    cudaFree(dout);
    free(dev);
    free(want);
    free(got);
}

/* Blocks of tensors of every length, dtype and content, some empty, in one call. */
static void test_grad_stats_blocks_match_cpu(void)
{
    if (skip_without_device())
        return;
    failures_shown = 0;
    enum { TENSORS = COUNT(lengths) * 3 * CONTENT_COUNT };
    prism_tensor tensors[TENSORS];
    size_t start[TENSORS + 2], blocks = 0, t = 0;
    start[0] = 0;
    for (int c = 0; c < CONTENT_COUNT; c++)
        for (size_t li = 0; li < COUNT(lengths); li++) {
            /* One block per content and length: its three dtypes. */
            for (prism_dtype dtype = PRISM_DTYPE_F32; dtype <= PRISM_DTYPE_F16; dtype++, t++) {
                tensors[t].numel = lengths[li];
                tensors[t].dtype = dtype;
                tensors[t].data = make_data(dtype, (content)c, lengths[li], (uint64_t)(t * 3 + 1));
            }
            start[++blocks] = t;
        }
    start[blocks + 1] = t; /* and an empty block at the end */
    for (size_t pad = 0; pad <= 1; pad++) {
        check_stats(tensors, start, blocks + 1, pad, pad ? "misaligned" : "aligned");
        /* Each tensor as its own block. */
        size_t each[TENSORS + 1];
        for (size_t i = 0; i <= TENSORS; i++)
            each[i] = i;
        check_stats(tensors, each, TENSORS, pad, pad ? "one tensor a block, misaligned" : "one tensor a block");
    }
    for (size_t i = 0; i < t; i++)
        free((void *)tensors[i].data);
}

/* More tensors and blocks than one launch takes (512 tensors, 1,024 blocks), empty tensors and
 * empty blocks among them. */
static void test_grad_stats_many_small_tensors_match_cpu(void)
{
    if (skip_without_device())
        return;
    failures_shown = 0;
    enum { TENSORS = 2600 };
    prism_tensor *tensors = xmalloc(TENSORS * sizeof *tensors);
    size_t *start = xmalloc((2 * TENSORS + 2) * sizeof *start), blocks = 0;
    uint64_t s = 7;
    start[0] = 0;
    for (size_t t = 0; t < TENSORS; t++) {
        tensors[t].numel = t % 13 == 0 ? 0 : (size_t)(rng_next(&s) % 3000);
        tensors[t].dtype = (prism_dtype)(t % 3);
        tensors[t].data = make_data(tensors[t].dtype, (content)(t % 3 == 2 ? CONTENT_BITS : CONTENT_NORMAL),
                                    tensors[t].numel, t);
        if (rng_next(&s) % 2) /* blocks of 1 or more tensors */
            start[++blocks] = t + 1;
        if (t % 101 == 0) /* and now and then an empty block */
            start[++blocks] = t + 1;
    }
    if (start[blocks] != TENSORS)
        start[++blocks] = TENSORS;
    check_stats(tensors, start, blocks, 0, "many tensors");
    for (size_t t = 0; t < TENSORS; t++)
        free((void *)tensors[t].data);
    free(tensors);
    free(start);
}

/* A large offset and a small spread: the variance is found by deviations, not E[x^2] - E[x]^2. */
static void test_grad_stats_variance_survives_a_large_offset(void)
{
    if (skip_without_device())
        return;
    failures_shown = 0;
    const size_t n = 300001;
    float *x = xmalloc(n * 4);
    uint64_t s = 99;
    for (size_t i = 0; i < n; i++)
        x[i] = 1.0e6f + (float)(rng_unit(&s) * 2.0 - 1.0);
    prism_tensor t = {x, n, PRISM_DTYPE_F32};
    size_t start[2] = {0, 1};
    check_stats(&t, start, 1, 0, "offset");
    free(x);
}

/* ---- relative error ----------------------------------------------------------------------- */

static void check_error(const prism_tensor *a, const prism_tensor *b, const char *what)
{
    prism_error err = {0};
    double want = 0, got = 0;
    CU_ASSERT_EQUAL_FATAL(prism_relative_error_cpu(a, b, &want, &err), PRISM_OK);
    void *da = dev_upload(a->data, a->numel * dtype_size(a->dtype), 0);
    void *db = dev_upload(b->data, b->numel * dtype_size(b->dtype), 0);
    double *dout = dev_alloc(sizeof *dout);
    prism_tensor ga = {a->numel ? da : NULL, a->numel, a->dtype}, gb = {b->numel ? db : NULL, b->numel, b->dtype};
    CU_ASSERT_EQUAL_FATAL(prism_relative_error_cuda(&ga, &gb, dout, (prism_cuda_stream)test_stream(), &err),
                          PRISM_OK);
    dev_sync();
    dev_download(&got, dout, sizeof got);
    if (!close_to(want, got, ERROR_RTOL) && failures_shown++ < 20)
        fprintf(stderr, "\n  %s: cpu %.17g, cuda %.17g", what, want, got);
    CU_ASSERT_TRUE(close_to(want, got, ERROR_RTOL));
    cudaFree(da);
    cudaFree(db);
    cudaFree(dout);
}

/* b is a rounded copy of a (in b's dtype, with noise), so the error is small but not zero. */
static void test_relative_error_matches_cpu(void)
{
    if (skip_without_device())
        return;
    failures_shown = 0;
    for (int c = 0; c < CONTENT_COUNT; c++)
        for (size_t li = 0; li < COUNT(lengths); li++)
            for (prism_dtype da = PRISM_DTYPE_F32; da <= PRISM_DTYPE_F16; da++)
                for (prism_dtype db = PRISM_DTYPE_F32; db <= PRISM_DTYPE_F16; db++) {
                    size_t n = lengths[li];
                    void *x = make_data(da, (content)c, n, (uint64_t)(li * 10 + c));
                    void *y = xmalloc(n * dtype_size(db));
                    uint64_t s = 5;
                    for (size_t i = 0; i < n; i++)
                        put_value(y, db, i, get_value(x, da, i) * (float)(1.0 + 1e-3 * (rng_unit(&s) - 0.5)));
                    prism_tensor a = {x, n, da}, b = {y, n, db};
                    char what[128];
                    snprintf(what, sizeof what, "%s vs %s %s n=%zu", dtype_names[da], dtype_names[db], content_names[c],
                             n);
                    check_error(&a, &b, what);
                    free(x);
                    free(y);
                }
}

/* ||a|| == 0: 0 when b is zero too, +Inf otherwise; a NaN or Inf anywhere: NaN. */
static void test_relative_error_special_values_match_cpu(void)
{
    if (skip_without_device())
        return;
    failures_shown = 0;
    const size_t n = 5000;
    float *zero = xmalloc(n * 4), *one = xmalloc(n * 4), *with_nan = xmalloc(n * 4);
    for (size_t i = 0; i < n; i++) {
        zero[i] = (i % 2) ? -0.0f : 0.0f;
        one[i] = 1.0f;
        with_nan[i] = i == 4321 ? NAN : 1.0f;
    }
    prism_tensor z = {zero, n, PRISM_DTYPE_F32}, o = {one, n, PRISM_DTYPE_F32}, w = {with_nan, n, PRISM_DTYPE_F32};
    check_error(&z, &z, "zero vs zero");
    check_error(&z, &o, "zero vs one");
    check_error(&o, &w, "one vs nan");
    check_error(&w, &o, "nan vs one");
    free(zero);
    free(one);
    free(with_nan);
}

/* ---- argument checks (host only: these run without a device) ------------------------------ */

/* The CUDA call refuses what the CPU call refuses, with the same status and message. */
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

static void test_quantize_refuses_what_the_cpu_refuses_with_its_message(void)
{
    float x[8] = {0};
    uint8_t codes[8];
    float scales[8];
    uint64_t nf;
    unsigned long long gnf;
    prism_tensor t = {x, 8, PRISM_DTYPE_F32}, bad_dtype = {x, 8, (prism_dtype)9}, no_data = {NULL, 8, PRISM_DTYPE_F32};
    prism_quant_spec ok = {.format = PRISM_PRECISION_INT8}, bf16 = {.format = PRISM_PRECISION_BF16},
                     rows = {.format = PRISM_PRECISION_INT8, .granularity = PRISM_GRANULARITY_ROW, .group = 3},
                     gran = {.format = PRISM_PRECISION_INT8, .granularity = (prism_granularity)7},
                     round = {.format = PRISM_PRECISION_INT4, .rounding = (prism_rounding)2};
    ASSERT_SAME_REFUSAL(prism_quantize_cpu(NULL, &t, codes, scales, &nf, err),
                        prism_quantize_cuda(NULL, &t, codes, scales, &gnf, NULL, err));
    ASSERT_SAME_REFUSAL(prism_quantize_cpu(&bf16, &t, codes, scales, &nf, err),
                        prism_quantize_cuda(&bf16, &t, codes, scales, &gnf, NULL, err));
    ASSERT_SAME_REFUSAL(prism_quantize_cpu(&rows, &t, codes, scales, &nf, err),
                        prism_quantize_cuda(&rows, &t, codes, scales, &gnf, NULL, err));
    ASSERT_SAME_REFUSAL(prism_quantize_cpu(&gran, &t, codes, scales, &nf, err),
                        prism_quantize_cuda(&gran, &t, codes, scales, &gnf, NULL, err));
    ASSERT_SAME_REFUSAL(prism_quantize_cpu(&round, &t, codes, scales, &nf, err),
                        prism_quantize_cuda(&round, &t, codes, scales, &gnf, NULL, err));
    ASSERT_SAME_REFUSAL(prism_quantize_cpu(&ok, NULL, codes, scales, &nf, err),
                        prism_quantize_cuda(&ok, NULL, codes, scales, &gnf, NULL, err));
    ASSERT_SAME_REFUSAL(prism_quantize_cpu(&ok, &bad_dtype, codes, scales, &nf, err),
                        prism_quantize_cuda(&ok, &bad_dtype, codes, scales, &gnf, NULL, err));
    ASSERT_SAME_REFUSAL(prism_quantize_cpu(&ok, &no_data, codes, scales, &nf, err),
                        prism_quantize_cuda(&ok, &no_data, codes, scales, &gnf, NULL, err));
    ASSERT_SAME_REFUSAL(prism_quantize_cpu(&ok, &t, NULL, scales, &nf, err),
                        prism_quantize_cuda(&ok, &t, NULL, scales, &gnf, NULL, err));
    ASSERT_SAME_REFUSAL(prism_quantize_cpu(&ok, &t, codes, NULL, &nf, err),
                        prism_quantize_cuda(&ok, &t, codes, NULL, &gnf, NULL, err));
}

static void test_decode_refuses_what_the_cpu_refuses_with_its_message(void)
{
    uint8_t codes[8] = {0};
    float scales[8] = {1}, out[8];
    prism_quant_spec ok = {.format = PRISM_PRECISION_FP8_E4M3}, bf16 = {.format = PRISM_PRECISION_BF16},
                     rows = {.format = PRISM_PRECISION_INT4, .granularity = PRISM_GRANULARITY_ROW, .group = 0};
    ASSERT_SAME_REFUSAL(prism_dequantize_cpu(&bf16, codes, scales, 8, out, PRISM_DTYPE_F32, err),
                        prism_dequantize_cuda(&bf16, codes, scales, 8, out, PRISM_DTYPE_F32, NULL, err));
    ASSERT_SAME_REFUSAL(prism_dequantize_cpu(&rows, codes, scales, 8, out, PRISM_DTYPE_F32, err),
                        prism_dequantize_cuda(&rows, codes, scales, 8, out, PRISM_DTYPE_F32, NULL, err));
    ASSERT_SAME_REFUSAL(prism_dequantize_cpu(&ok, NULL, scales, 8, out, PRISM_DTYPE_F32, err),
                        prism_dequantize_cuda(&ok, NULL, scales, 8, out, PRISM_DTYPE_F32, NULL, err));
    ASSERT_SAME_REFUSAL(prism_dequantize_cpu(&ok, codes, scales, 8, NULL, PRISM_DTYPE_F32, err),
                        prism_dequantize_cuda(&ok, codes, scales, 8, NULL, PRISM_DTYPE_F32, NULL, err));
    ASSERT_SAME_REFUSAL(prism_dequantize_cpu(&ok, codes, scales, 8, out, (prism_dtype)5, err),
                        prism_dequantize_cuda(&ok, codes, scales, 8, out, (prism_dtype)5, NULL, err));
    ASSERT_SAME_REFUSAL(prism_dequantize_accumulate_cpu(&ok, codes, NULL, 8, out, err),
                        prism_dequantize_accumulate_cuda(&ok, codes, NULL, 8, out, NULL, err));
    ASSERT_SAME_REFUSAL(prism_dequantize_accumulate_cpu(&ok, codes, scales, 8, NULL, err),
                        prism_dequantize_accumulate_cuda(&ok, codes, scales, 8, NULL, NULL, err));
    ASSERT_SAME_REFUSAL(prism_dequantize_accumulate_cpu(NULL, codes, scales, 8, out, err),
                        prism_dequantize_accumulate_cuda(NULL, codes, scales, 8, out, NULL, err));
}

static void test_grad_stats_and_error_refuse_what_the_cpu_refuses_with_its_message(void)
{
    float x[4] = {0};
    prism_tensor ts[2] = {{x, 4, PRISM_DTYPE_F32}, {NULL, 5, PRISM_DTYPE_BF16}};
    prism_tensor bad_dtype[1] = {{x, 4, (prism_dtype)3}};
    prism_grad_stats out[2];
    size_t zero_start[2] = {1, 1}, falling[3] = {0, 2, 1}, two[2] = {0, 2}, one[2] = {0, 1};
    ASSERT_SAME_REFUSAL(prism_grad_stats_blocks_cpu(ts, NULL, 1, out, err),
                        prism_grad_stats_blocks_cuda(ts, NULL, 1, out, NULL, err));
    ASSERT_SAME_REFUSAL(prism_grad_stats_blocks_cpu(ts, one, 1, NULL, err),
                        prism_grad_stats_blocks_cuda(ts, one, 1, NULL, NULL, err));
    ASSERT_SAME_REFUSAL(prism_grad_stats_blocks_cpu(ts, zero_start, 1, out, err),
                        prism_grad_stats_blocks_cuda(ts, zero_start, 1, out, NULL, err));
    ASSERT_SAME_REFUSAL(prism_grad_stats_blocks_cpu(ts, falling, 2, out, err),
                        prism_grad_stats_blocks_cuda(ts, falling, 2, out, NULL, err));
    ASSERT_SAME_REFUSAL(prism_grad_stats_blocks_cpu(NULL, one, 1, out, err),
                        prism_grad_stats_blocks_cuda(NULL, one, 1, out, NULL, err));
    ASSERT_SAME_REFUSAL(prism_grad_stats_blocks_cpu(ts, two, 1, out, err),
                        prism_grad_stats_blocks_cuda(ts, two, 1, out, NULL, err));
    ASSERT_SAME_REFUSAL(prism_grad_stats_blocks_cpu(bad_dtype, one, 1, out, err),
                        prism_grad_stats_blocks_cuda(bad_dtype, one, 1, out, NULL, err));

    double r;
    prism_tensor a = {x, 4, PRISM_DTYPE_F32}, shorter = {x, 3, PRISM_DTYPE_F32};
    ASSERT_SAME_REFUSAL(prism_relative_error_cpu(&a, &shorter, &r, err),
                        prism_relative_error_cuda(&a, &shorter, &r, NULL, err));
    ASSERT_SAME_REFUSAL(prism_relative_error_cpu(&a, &a, NULL, err),
                        prism_relative_error_cuda(&a, &a, NULL, NULL, err));
    ASSERT_SAME_REFUSAL(prism_relative_error_cpu(NULL, &a, &r, err),
                        prism_relative_error_cuda(NULL, &a, &r, NULL, err));
    ASSERT_SAME_REFUSAL(prism_relative_error_cpu(&a, &ts[1], &r, err),
                        prism_relative_error_cuda(&a, &ts[1], &r, NULL, err));
}

/* Nothing to do is done without touching the GPU. */
static void test_empty_calls_succeed_without_gpu_work(void)
{
    prism_error err = {0};
    prism_quant_spec spec = {.format = PRISM_PRECISION_INT8};
    prism_tensor empty = {NULL, 0, PRISM_DTYPE_F32};
    CU_ASSERT_EQUAL(prism_quantize_cuda(&spec, &empty, NULL, NULL, NULL, NULL, &err), PRISM_OK);
    CU_ASSERT_EQUAL(prism_dequantize_cuda(&spec, NULL, NULL, 0, NULL, PRISM_DTYPE_BF16, NULL, &err), PRISM_OK);
    CU_ASSERT_EQUAL(prism_dequantize_accumulate_cuda(&spec, NULL, NULL, 0, NULL, NULL, &err), PRISM_OK);
    CU_ASSERT_EQUAL(prism_grad_stats_blocks_cuda(NULL, NULL, 0, NULL, NULL, &err), PRISM_OK);
}

static const prism_test_case cases[] = {
    {"test_quantize_refuses_what_the_cpu_refuses_with_its_message",
     test_quantize_refuses_what_the_cpu_refuses_with_its_message},
    {"test_decode_refuses_what_the_cpu_refuses_with_its_message",
     test_decode_refuses_what_the_cpu_refuses_with_its_message},
    {"test_grad_stats_and_error_refuse_what_the_cpu_refuses_with_its_message",
     test_grad_stats_and_error_refuse_what_the_cpu_refuses_with_its_message},
    {"test_empty_calls_succeed_without_gpu_work", test_empty_calls_succeed_without_gpu_work},
    {"test_quantize_nearest_matches_cpu_bit_for_bit", test_quantize_nearest_matches_cpu_bit_for_bit},
    {"test_quantize_stochastic_matches_cpu_bit_for_bit", test_quantize_stochastic_matches_cpu_bit_for_bit},
    {"test_dequantize_any_codes_matches_cpu", test_dequantize_any_codes_matches_cpu},
    {"test_grad_stats_blocks_match_cpu", test_grad_stats_blocks_match_cpu},
    {"test_grad_stats_many_small_tensors_match_cpu", test_grad_stats_many_small_tensors_match_cpu},
    {"test_grad_stats_variance_survives_a_large_offset", test_grad_stats_variance_survives_a_large_offset},
    {"test_relative_error_matches_cpu", test_relative_error_matches_cpu},
    {"test_relative_error_special_values_match_cpu", test_relative_error_special_values_match_cpu},
    {NULL, NULL},
};

static const prism_test_suite suites[] = {{"kernels_cuda", cases}, {NULL, NULL}};

int main(int argc, char **argv)
{
    if (device_count() == 0)
        printf("SKIPPED: no CUDA device (the GPU-only checks below pass without running)\n");
    return prism_test_main(argc, argv, suites);
}
