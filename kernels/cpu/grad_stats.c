/* Block gradient statistics, the scalar reference (kernels.h). Every element is widened to
 * double exactly, so the figures depend only on the values and their order. */
#include "prism/kernels.h"

#include <math.h>
#include <string.h>

float prism_bf16_to_f32(uint16_t bits)
{
    uint32_t wide = (uint32_t)bits << 16;
    float f;
    memcpy(&f, &wide, sizeof f);
    return f;
}

float prism_f16_to_f32(uint16_t bits)
{
    uint32_t sign = (uint32_t)(bits >> 15) << 31;
    uint32_t exp = (bits >> 10) & 0x1f;
    uint32_t man = bits & 0x3ff;
    uint32_t out;
    if (exp == 0x1f) {
        out = sign | 0x7f800000u | (man << 13); /* Inf, NaN (payload kept) */
    } else if (exp != 0) {
        out = sign | ((exp + 112) << 23) | (man << 13); /* rebias 15 -> 127 */
    } else if (man == 0) {
        out = sign; /* +-0 */
    } else {
        /* Subnormal: value man * 2^-24, normal in binary32. */
        int shift = 0;
        while (!(man & 0x400)) {
            man <<= 1;
            shift++;
        }
        man &= 0x3ff;
        out = sign | ((uint32_t)(113 - shift) << 23) | (man << 13);
    }
    float f;
    memcpy(&f, &out, sizeof f);
    return f;
}

/* Running figures of finite elements. */
typedef struct acc {
    double n, mean, m2, sumsq, max_abs;
    uint64_t nonfinite;
} acc;

static void add_value(acc *a, double x)
{
    if (!isfinite(x)) {
        a->nonfinite++;
        return;
    }
    a->n += 1;
    double delta = x - a->mean;
    a->mean += delta / a->n;
    a->m2 += delta * (x - a->mean);
    a->sumsq += x * x;
    double ax = fabs(x);
    if (ax > a->max_abs)
        a->max_abs = ax;
}

/* Chan et al.: b's figures folded into a. */
static void merge(acc *a, const acc *b)
{
    if (b->n > 0) {
        double n = a->n + b->n;
        double delta = b->mean - a->mean;
        a->mean += delta * b->n / n;
        a->m2 += b->m2 + delta * delta * a->n * b->n / n;
        a->n = n;
    }
    a->sumsq += b->sumsq;
    if (b->max_abs > a->max_abs)
        a->max_abs = b->max_abs;
    a->nonfinite += b->nonfinite;
}

prism_status prism_grad_stats_cpu(const prism_tensor *tensors, size_t count, prism_grad_stats *out,
                                  prism_error *err)
{
    memset(out, 0, sizeof *out);
    acc total = {0};
    uint64_t numel = 0;
    for (size_t t = 0; t < count; t++) {
        const prism_tensor *x = &tensors[t];
        if (x->numel && !x->data)
            return prism_error_set(err, PRISM_ERR_INVALID, "tensor %zu: %zu elements but no data", t, x->numel);
        acc a = {0};
        switch (x->dtype) {
        case PRISM_DTYPE_F32:
            for (size_t i = 0; i < x->numel; i++)
                add_value(&a, ((const float *)x->data)[i]);
            break;
        case PRISM_DTYPE_BF16:
            for (size_t i = 0; i < x->numel; i++)
                add_value(&a, prism_bf16_to_f32(((const uint16_t *)x->data)[i]));
            break;
        case PRISM_DTYPE_F16:
            for (size_t i = 0; i < x->numel; i++)
                add_value(&a, prism_f16_to_f32(((const uint16_t *)x->data)[i]));
            break;
        default:
            return prism_error_set(err, PRISM_ERR_INVALID, "tensor %zu: unknown dtype %d", t, (int)x->dtype);
        }
        merge(&total, &a);
        numel += x->numel;
    }
    out->l2_norm = sqrt(total.sumsq);
    out->max_abs = total.max_abs;
    out->mean = total.n > 0 ? total.mean : 0.0;
    out->variance = total.n > 0 ? total.m2 / total.n : 0.0;
    out->numel = numel;
    out->nonfinite = total.nonfinite;
    return PRISM_OK;
}
