/* The scalar reference: the specification of every CPU kernel, one element at a time, in plain C.
 * Other paths (avx2.c, kernels/cuda) are tested against these functions. The order of the
 * floating-point sums is part of the definition (kernels.h): eight lanes per chunk, folded as
 * ((l0+l4) + (l2+l6)) + ((l1+l5) + (l3+l7)). */
#include "cpu.h"
#include "quant_core.h"

#include <math.h>

/* Element i of x, exactly, as binary32. */
static float load(const prism_tensor *x, size_t i)
{
    switch (x->dtype) {
    case PRISM_DTYPE_BF16: return prism_qc_bf16_to_f32(((const uint16_t *)x->data)[i]);
    case PRISM_DTYPE_F16: return prism_qc_f16_to_f32(((const uint16_t *)x->data)[i]);
    default: return ((const float *)x->data)[i];
    }
}

static double fold8(const double l[8])
{
    return ((l[0] + l[4]) + (l[2] + l[6])) + ((l[1] + l[5]) + (l[3] + l[7]));
}

static void scalar_stats_chunk(const prism_tensor *x, size_t begin, size_t end, prism_moments *out)
{
    double sum[8] = {0}, sumsq[8] = {0}, dev[8] = {0};
    double max_abs = 0;
    uint64_t n = 0, nonfinite = 0;
    for (size_t i = begin; i < end; i++) {
        float v = load(x, i);
        if (prism_qc_nonfinite(v)) {
            nonfinite++;
            continue;
        }
        double d = v;
        sum[(i - begin) % 8] += d;
        sumsq[(i - begin) % 8] += d * d;
        if (fabs(d) > max_abs)
            max_abs = fabs(d);
        n++;
    }
    double mean = n ? fold8(sum) / (double)n : 0.0;
    for (size_t i = begin; i < end; i++) {
        float v = load(x, i);
        if (prism_qc_nonfinite(v))
            continue;
        double d = (double)v - mean;
        dev[(i - begin) % 8] += d * d;
    }
    out->n = (double)n;
    out->mean = mean;
    out->m2 = fold8(dev);
    out->sumsq = fold8(sumsq);
    out->max_abs = max_abs;
    out->nonfinite = nonfinite;
}

static void scalar_amax(const prism_tensor *x, size_t begin, size_t end, float *amax,
                        uint64_t *nonfinite)
{
    float m = 0.0f;
    uint64_t bad = 0;
    for (size_t i = begin; i < end; i++) {
        float v = load(x, i);
        if (prism_qc_nonfinite(v)) {
            bad++;
            continue;
        }
        float a = prism_qc_abs(v);
        if (a > m)
            m = a;
    }
    *amax = m;
    *nonfinite = bad;
}

static void put_code(uint8_t *codes, prism_precision format, size_t i, uint8_t code)
{
    if (format != PRISM_PRECISION_INT4) {
        codes[i] = code;
        return;
    }
    uint8_t *byte = &codes[i / 2];
    if (i % 2)
        *byte = (uint8_t)((*byte & 0x0fu) | (code << 4));
    else
        *byte = (uint8_t)((*byte & 0xf0u) | code);
}

static uint8_t get_code(const uint8_t *codes, prism_precision format, size_t i)
{
    if (format != PRISM_PRECISION_INT4)
        return codes[i];
    return (uint8_t)(i % 2 ? codes[i / 2] >> 4 : codes[i / 2] & 0x0fu);
}

static void scalar_quantize_range(const prism_quant_spec *spec, const prism_tensor *x, size_t begin,
                                  size_t end, float s, uint8_t *codes)
{
    int format = (int)spec->format;
    for (size_t i = begin; i < end; i++) {
        float v = load(x, i);
        uint8_t code = 0;
        if (!prism_qc_nonfinite(v)) {
            float q = v / s;
            code = spec->rounding == PRISM_ROUNDING_STOCHASTIC
                       ? prism_qc_code_stochastic(q, format, prism_qc_random(i, spec->seed))
                       : prism_qc_code_nearest(q, format);
        }
        put_code(codes, spec->format, i, code);
    }
}

static void scalar_quantize_groups(const prism_quant_spec *spec, size_t group_len,
                                   const prism_tensor *x, size_t g0, size_t g1, float *scales,
                                   uint8_t *codes, uint64_t *nonfinite)
{
    uint64_t total = 0; /* summed here: *nonfinite may share a cache line with another task's */
    for (size_t g = g0; g < g1; g++) {
        size_t begin = g * group_len;
        size_t end = begin + group_len < x->numel ? begin + group_len : x->numel;
        float amax;
        uint64_t bad;
        scalar_amax(x, begin, end, &amax, &bad);
        total += bad;
        scales[g] = prism_qc_scale(amax, (int)spec->format, spec->scale_mode == PRISM_SCALE_POW2);
        scalar_quantize_range(spec, x, begin, end, scales[g], codes);
    }
    *nonfinite += total;
}

/* quantize_range with the counts of kernels.h: each finite element's code, whether the clamp to
 * qmax changed it (prism_qc_saturates_*) and whether a non-zero x got code 0; NaN/Inf counted
 * apart. The codes are those of scalar_quantize_range, element for element. */
static void scalar_quantize_range_counted(const prism_quant_spec *spec, const prism_tensor *x,
                                          size_t begin, size_t end, float s, uint8_t *codes,
                                          float *amax, prism_quant_counts *counts)
{
    int format = (int)spec->format;
    int stochastic = spec->rounding == PRISM_ROUNDING_STOCHASTIC;
    float m = 0.0f;
    uint64_t saturated = 0, underflowed = 0, bad = 0;
    for (size_t i = begin; i < end; i++) {
        float v = load(x, i);
        uint8_t code = 0;
        if (prism_qc_nonfinite(v)) {
            bad++;
        } else {
            float a = prism_qc_abs(v);
            if (a > m)
                m = a;
            float q = v / s;
            if (stochastic) {
                uint32_t r = prism_qc_random(i, spec->seed);
                code = prism_qc_code_stochastic(q, format, r);
                saturated += (uint64_t)prism_qc_saturates_stochastic(q, format, r);
            } else {
                code = prism_qc_code_nearest(q, format);
                saturated += (uint64_t)prism_qc_saturates_nearest(q, format);
            }
            underflowed += (uint64_t)(code == 0 && a != 0.0f);
        }
        put_code(codes, spec->format, i, code);
    }
    if (amax)
        *amax = m;
    counts->saturated = saturated;
    counts->underflowed = underflowed;
    counts->nonfinite = bad;
}

static void scalar_quantize_groups_counted(const prism_quant_spec *spec, size_t group_len,
                                           const prism_tensor *x, size_t g0, size_t g1,
                                           const float *given, float *scales, uint8_t *codes,
                                           float *amax, prism_quant_counts *counts)
{
    prism_quant_counts total = {0};
    for (size_t g = g0; g < g1; g++) {
        size_t begin = g * group_len;
        size_t end = begin + group_len < x->numel ? begin + group_len : x->numel;
        float s;
        if (given) {
            s = given[g];
        } else {
            float group_amax;
            uint64_t bad;
            scalar_amax(x, begin, end, &group_amax, &bad);
            s = scales[g] =
                prism_qc_scale(group_amax, (int)spec->format, spec->scale_mode == PRISM_SCALE_POW2);
        }
        prism_quant_counts c;
        scalar_quantize_range_counted(spec, x, begin, end, s, codes, amax ? &amax[g] : NULL, &c);
        total.saturated += c.saturated;
        total.underflowed += c.underflowed;
        total.nonfinite += c.nonfinite;
    }
    *counts = total;
}

static void scalar_dequantize_range(prism_precision format, size_t group_len, const uint8_t *codes,
                                    const float *scales, size_t begin, size_t end, void *out,
                                    prism_dtype dtype)
{
    for (size_t i = begin; i < end; i++) {
        float y = prism_qc_decode(get_code(codes, format, i), (int)format) * scales[i / group_len];
        switch (dtype) {
        case PRISM_DTYPE_BF16: ((uint16_t *)out)[i] = prism_qc_f32_to_bf16(y); break;
        case PRISM_DTYPE_F16: ((uint16_t *)out)[i] = prism_qc_f32_to_f16(y); break;
        default: ((float *)out)[i] = y; break;
        }
    }
}

static void scalar_accumulate_range(prism_precision format, size_t group_len, const uint8_t *codes,
                                    const float *scales, size_t begin, size_t end, float *acc)
{
    for (size_t i = begin; i < end; i++) {
        float y = prism_qc_decode(get_code(codes, format, i), (int)format) * scales[i / group_len];
        acc[i] = acc[i] + y;
    }
}

static void scalar_error_chunk(const prism_tensor *a, const prism_tensor *b, size_t begin,
                               size_t end, double sums[2], int *nonfinite)
{
    double diff[8] = {0}, norm[8] = {0};
    int bad = 0;
    for (size_t i = begin; i < end; i++) {
        float va = load(a, i), vb = load(b, i);
        if (prism_qc_nonfinite(va) || prism_qc_nonfinite(vb)) {
            bad = 1;
            continue;
        }
        double d = (double)va - (double)vb;
        diff[(i - begin) % 8] += d * d;
        norm[(i - begin) % 8] += (double)va * (double)va;
    }
    sums[0] = fold8(diff);
    sums[1] = fold8(norm);
    *nonfinite = bad;
}

const prism_cpu_path prism_cpu_scalar = {
    .name = "scalar",
    .stats_chunk = scalar_stats_chunk,
    .amax = scalar_amax,
    .quantize_range = scalar_quantize_range,
    .quantize_groups = scalar_quantize_groups,
    .quantize_range_counted = scalar_quantize_range_counted,
    .quantize_groups_counted = scalar_quantize_groups_counted,
    .dequantize_range = scalar_dequantize_range,
    .accumulate_range = scalar_accumulate_range,
    .error_chunk = scalar_error_chunk,
};
