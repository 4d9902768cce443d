/* The element-wise arithmetic of quantization (include/prism/kernels.h says what it means), in
 * one place that C and CUDA C++ both compile: the CPU reference, the AVX2 path's tails and the
 * CUDA kernels call these same functions, which is how their codes agree bit for bit.
 *
 * Internal to kernels/: not installed, not part of the C ABI. Everything here is exact integer
 * or correctly rounded binary32 arithmetic, with no fused multiply-add and no library call whose
 * result could differ between a host libm and the device. */
#ifndef PRISM_KERNELS_QUANT_CORE_H
#define PRISM_KERNELS_QUANT_CORE_H

#include <stdint.h>
#include <string.h>

#ifdef __CUDACC__
#define PRISM_QC static __host__ __device__ __forceinline__
#else
#define PRISM_QC static inline
#endif

/* Format numbers as in prism_precision (the wire's Precision). */
enum { PRISM_QC_INT8 = 1, PRISM_QC_E4M3 = 2, PRISM_QC_E5M2 = 3, PRISM_QC_INT4 = 4 };

PRISM_QC uint32_t prism_qc_bits(float x)
{
    uint32_t u;
    memcpy(&u, &x, sizeof u);
    return u;
}

PRISM_QC float prism_qc_float(uint32_t u)
{
    float x;
    memcpy(&x, &u, sizeof x);
    return x;
}

/* NaN or +-Inf: the exponent field is all ones. */
PRISM_QC int prism_qc_nonfinite(float x)
{
    return (prism_qc_bits(x) & 0x7f800000u) == 0x7f800000u;
}

PRISM_QC float prism_qc_abs(float x)
{
    return prism_qc_float(prism_qc_bits(x) & 0x7fffffffu);
}

PRISM_QC float prism_qc_bf16_to_f32(uint16_t h)
{
    return prism_qc_float((uint32_t)h << 16);
}

PRISM_QC float prism_qc_f16_to_f32(uint16_t h)
{
    uint32_t sign = (uint32_t)(h >> 15) << 31;
    uint32_t exp = (h >> 10) & 0x1fu;
    uint32_t man = h & 0x3ffu;
    if (exp == 0x1f)
        return prism_qc_float(sign | 0x7f800000u | (man << 13)); /* Inf; NaN keeps its payload */
    if (exp != 0)
        return prism_qc_float(sign | ((exp + 112) << 23) | (man << 13)); /* rebias 15 -> 127 */
    /* Zero or subnormal: man * 2^-24, exact in binary32 (a product by a power of two). */
    float mag = (float)man * 5.9604644775390625e-8f;
    return prism_qc_float(sign | prism_qc_bits(mag));
}

/* Round to nearest even on the bit pattern; NaN stays a quiet NaN with its sign. */
PRISM_QC uint16_t prism_qc_f32_to_bf16(float x)
{
    uint32_t u = prism_qc_bits(x);
    if ((u & 0x7fffffffu) > 0x7f800000u)
        return (uint16_t)((u >> 16) | 0x40u);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

PRISM_QC uint16_t prism_qc_f32_to_f16(float x)
{
    uint32_t u = prism_qc_bits(x);
    uint16_t sign = (uint16_t)((u >> 16) & 0x8000u);
    uint32_t a = u & 0x7fffffffu;
    if (a > 0x7f800000u)
        return (uint16_t)(sign | 0x7e00u | ((a >> 13) & 0x3ffu)); /* quiet NaN */
    if (a >= 0x477ff000u) /* 65520 = 65504 + half an ulp and above: rounds to Inf */
        return (uint16_t)(sign | 0x7c00u);
    if (a >= 0x38800000u) { /* 2^-14 and above: normal in f16 */
        uint32_t r = a + 0xfffu + ((a >> 13) & 1u);
        return (uint16_t)(sign | ((r - 0x38000000u) >> 13)); /* rebias 127 -> 15 */
    }
    /* Subnormal f16 (or zero): |x| / 2^-24 rounded to an integer, ties to even. The quotient is
     * exact (a power of two) and below 1024; the rounding is done on it with the 2^23 trick,
     * which is exact in binary32 round-to-nearest-even. */
    float t = prism_qc_float(a) * 16777216.0f;
    float r = (t + 8388608.0f) - 8388608.0f;
    return (uint16_t)(sign | (uint16_t)r);
}

/* Round to nearest integer, ties to even, for |v| < 2^23 (the magic-number trick, exact in
 * binary32 round-to-nearest-even arithmetic; nvcc and C compile it without contraction because
 * there is no multiplication to fuse). */
PRISM_QC float prism_qc_rint(float v)
{
    float a = prism_qc_abs(v);
    if (a >= 8388608.0f)
        return v;
    float r = (a + 8388608.0f) - 8388608.0f;
    return prism_qc_float(prism_qc_bits(r) | (prism_qc_bits(v) & 0x80000000u));
}

/* Round toward minus infinity, for |v| < 2^23. */
PRISM_QC float prism_qc_floor(float v)
{
    float r = prism_qc_rint(v);
    return r > v ? r - 1.0f : r;
}

/* Shape of an FP8 format: mantissa bits, exponent bias, largest finite value and its code. */
typedef struct prism_qc_fp8 {
    int mbits;
    int bias;
    float max;
    uint8_t maxcode;
    float sub_scale; /* 2^(bias - 1 + mbits): |v| * sub_scale counts subnormal ulps */
    float min_normal;
} prism_qc_fp8;

PRISM_QC prism_qc_fp8 prism_qc_fp8_shape(int format)
{
    prism_qc_fp8 e4m3 = {3, 7, 448.0f, 0x7e, 512.0f, 0.015625f};
    prism_qc_fp8 e5m2 = {2, 15, 57344.0f, 0x7b, 65536.0f, 6.103515625e-05f};
    return format == PRISM_QC_E4M3 ? e4m3 : e5m2;
}

/* binary32 -> FP8, nearest even, saturating to the largest finite code (cuda_fp8.h's
 * __nv_cvt_float_to_fp8 with __NV_SATFINITE, bit for bit, negative zero and NaN included). */
PRISM_QC uint8_t prism_qc_fp8_encode(float x, int format)
{
    prism_qc_fp8 f = prism_qc_fp8_shape(format);
    uint32_t u = prism_qc_bits(x);
    uint8_t sign = (uint8_t)((u >> 24) & 0x80u);
    uint32_t a = u & 0x7fffffffu;
    if (a > 0x7f800000u)
        return 0x7fu; /* cuda_fp8.h makes every NaN the canonical positive one first */
    float mag = prism_qc_float(a);
    if (mag > f.max)
        return (uint8_t)(sign | f.maxcode); /* values that round back to max land here too */
    if (mag >= f.min_normal) {
        int drop = 23 - f.mbits;
        uint32_t keep = a >> drop; /* exponent and kept mantissa, still biased by 127 */
        uint32_t rest = a & ((1u << drop) - 1u);
        uint32_t half = 1u << (drop - 1);
        if (rest > half || (rest == half && (keep & 1u)))
            keep++;
        /* Rebias the exponent from 127 to the format's bias. */
        uint32_t code = keep - ((uint32_t)(127 - f.bias) << f.mbits);
        return (uint8_t)(sign | code);
    }
    /* Subnormal FP8: count ulps of 2^(1 - bias - mbits), an exact scaling; rounding to 2^mbits
     * gives the smallest normal's code, which is what the carry means. */
    float ulps = prism_qc_rint(mag * f.sub_scale);
    return (uint8_t)(sign | (uint8_t)ulps);
}

/* FP8 -> binary32, exact. */
PRISM_QC float prism_qc_fp8_decode(uint8_t code, int format)
{
    prism_qc_fp8 f = prism_qc_fp8_shape(format);
    uint32_t sign = (uint32_t)(code & 0x80u) << 24;
    uint32_t exp = (uint32_t)(code & 0x7fu) >> f.mbits;
    uint32_t man = code & ((1u << f.mbits) - 1u);
    uint32_t top = format == PRISM_QC_E4M3 ? 15u : 31u;
    if (exp == top && (format == PRISM_QC_E5M2 || man == (1u << f.mbits) - 1u)) {
        if (format == PRISM_QC_E5M2 && man == 0)
            return prism_qc_float(sign | 0x7f800000u);
        return prism_qc_float(sign | 0x7fc00000u);
    }
    if (exp == 0) {
        float mag = (float)man / f.sub_scale; /* exact: a division by a power of two */
        return prism_qc_float(sign | prism_qc_bits(mag));
    }
    return prism_qc_float(sign | ((exp + (uint32_t)(127 - f.bias)) << 23) | (man << (23 - f.mbits)));
}

/* Philox4x32-10. */
PRISM_QC void prism_qc_philox(const uint32_t ctr[4], const uint32_t key[2], uint32_t out[4])
{
    uint32_t c0 = ctr[0], c1 = ctr[1], c2 = ctr[2], c3 = ctr[3];
    uint32_t k0 = key[0], k1 = key[1];
    for (int round = 0; round < 10; round++) {
        uint64_t p0 = (uint64_t)0xD2511F53u * c0;
        uint64_t p1 = (uint64_t)0xCD9E8D57u * c2;
        uint32_t n0 = (uint32_t)(p1 >> 32) ^ c1 ^ k0;
        uint32_t n2 = (uint32_t)(p0 >> 32) ^ c3 ^ k1;
        c1 = (uint32_t)p1;
        c3 = (uint32_t)p0;
        c0 = n0;
        c2 = n2;
        k0 += 0x9E3779B9u;
        k1 += 0xBB67AE85u;
    }
    out[0] = c0;
    out[1] = c1;
    out[2] = c2;
    out[3] = c3;
}

/* The 32 random bits of element i under seed. */
PRISM_QC uint32_t prism_qc_random(uint64_t i, uint64_t seed)
{
    uint64_t block = i >> 2;
    uint32_t ctr[4] = {(uint32_t)block, (uint32_t)(block >> 32), 0, 0};
    uint32_t key[2] = {(uint32_t)seed, (uint32_t)(seed >> 32)};
    uint32_t out[4];
    prism_qc_philox(ctr, key, out);
    return out[i & 3];
}

PRISM_QC float prism_qc_qmax(int format)
{
    switch (format) {
    case PRISM_QC_INT8: return 127.0f;
    case PRISM_QC_E4M3: return 448.0f;
    case PRISM_QC_E5M2: return 57344.0f;
    case PRISM_QC_INT4: return 7.0f;
    default: return 0.0f;
    }
}

/* The dequantization multiplier of a group whose largest finite |x| is amax (kernels.h). */
PRISM_QC float prism_qc_scale(float amax, int format, int pow2)
{
    float qmax = prism_qc_qmax(format);
    if (!(amax > 0.0f))
        return 1.0f;
    if (!pow2) {
        float s = amax / qmax;
        return s > 0.0f ? s : prism_qc_float(1u); /* 2^-149 when the quotient underflows */
    }
    /* Smallest e with qmax * 2^e >= amax. With amax = ma * 2^ea and qmax = mq * 2^eq (both
     * mantissas in [1, 2)), e = ea - eq when mq >= ma, else ea - eq + 1. */
    uint32_t ua = prism_qc_bits(amax), uq = prism_qc_bits(qmax);
    int ea, eq = (int)(uq >> 23) - 127;
    uint32_t ma;
    if ((ua >> 23) == 0) { /* subnormal amax: normalise its mantissa */
        ma = ua & 0x7fffffu;
        ea = -126;
        while (!(ma & 0x800000u)) {
            ma <<= 1;
            ea--;
        }
        ma &= 0x7fffffu;
    } else {
        ea = (int)(ua >> 23) - 127;
        ma = ua & 0x7fffffu;
    }
    int e = ea - eq + ((uq & 0x7fffffu) >= ma ? 0 : 1);
    if (e < -149)
        e = -149;
    if (e >= -126)
        return prism_qc_float((uint32_t)(e + 127) << 23);
    return prism_qc_float(1u << (e + 149)); /* subnormal power of two */
}

/* ---- saturation and the delayed scale (kernels.h: prism_quant_counts, prism_quant_scale_delayed) */

/* The smallest |v|, as a binary32 bit pattern, whose nearest-even rounding on the format's grid
 * extended past its largest value lands above qmax, so that the clamp to qmax changes the code:
 *   INT8  127.5 (0x42ff0000): the tie between 127 and 128 goes to even 128
 *   INT4  7.5 (0x40f00000): the tie between 7 and 8 goes to even 8
 *   E4M3  the value just above 464 (0x43e80001): 464 = 1.8125 * 2^8 is the tie between
 *         448 = 1.110b * 2^8 (mantissa 110, even) and 480 = 1.111b * 2^8 (odd), so 464 itself
 *         goes to 448 and only larger values round to 480
 *   E5M2  61440 (0x47700000): 61440 = 1.875 * 2^15 is the tie between 57344 = 1.11b * 2^15
 *         (mantissa 11, odd) and 65536 = 1.00b * 2^16 (even), so it goes to 65536
 * Bit patterns of non-negative binary32 values order like the values, +Inf above them all. */
PRISM_QC uint32_t prism_qc_saturating_bits(int format)
{
    switch (format) {
    case PRISM_QC_INT8: return 0x42ff0000u;
    case PRISM_QC_INT4: return 0x40f00000u;
    case PRISM_QC_E4M3: return 0x43e80001u;
    default: return 0x47700000u;
    }
}

/* 1 when prism_qc_code_nearest(v, format) clamped v's rounding to qmax (v never NaN). */
PRISM_QC int prism_qc_saturates_nearest(float v, int format)
{
    return (prism_qc_bits(v) & 0x7fffffffu) >= prism_qc_saturating_bits(format);
}

/* 1 when prism_qc_code_stochastic(v, format, r) clamped the neighbour its random bits chose to
 * qmax (v never NaN). INT: the integer lo + up of the rounding lies beyond +-qmax. FP8: the same
 * bit trick as the normal range of the rounding (random bits added below the kept mantissa,
 * then truncated), on the grid extended past the largest value, gives a pattern above qmax's;
 * below the largest value it never does, and +-Inf always does. */
PRISM_QC int prism_qc_saturates_stochastic(float v, int format, uint32_t r)
{
    if (format == PRISM_QC_INT8 || format == PRISM_QC_INT4) {
        float qmax = prism_qc_qmax(format);
        float lo = prism_qc_floor(v);
        float frac = v - lo;
        float q = lo + ((float)(r >> 8) < frac * 16777216.0f ? 1.0f : 0.0f);
        return q > qmax || q < -qmax;
    }
    prism_qc_fp8 f = prism_qc_fp8_shape(format);
    int drop = 23 - f.mbits;
    uint32_t mask = (1u << drop) - 1u;
    uint32_t g = ((prism_qc_bits(v) & 0x7fffffffu) + (r & mask)) & ~mask; /* at most 0x7f9fffff */
    return g > prism_qc_bits(f.max);
}

/* The delayed-scaling scale: t = hist_max * 2^margin rounded once to binary32 (ldexpf's result,
 * computed as an exact double product by a power of two, then one conversion), then t / qmax,
 * one binary32 division. hist_max not > 0 or not finite (no history), or a format without qmax:
 * 1. A quotient that overflows (t or t / qmax infinite) gives FLT_MAX; one that underflows to 0
 * gives 2^-149. Margins beyond +-300 are clamped: from any finite hist_max > 0 they already
 * overflow or underflow. */
PRISM_QC float prism_qc_scale_delayed(float hist_max, int margin, int format)
{
    float qmax = prism_qc_qmax(format);
    if (!(hist_max > 0.0f) || prism_qc_nonfinite(hist_max) || !(qmax > 0.0f))
        return 1.0f;
    int m = margin > 300 ? 300 : (margin < -300 ? -300 : margin);
    uint64_t pbits = (uint64_t)(m + 1023) << 52;
    double p;
    memcpy(&p, &pbits, sizeof p);
    float t = (float)((double)hist_max * p);
    float s = t / qmax;
    if (prism_qc_nonfinite(s))
        return prism_qc_float(0x7f7fffffu); /* FLT_MAX */
    return s > 0.0f ? s : prism_qc_float(1u);
}

/* The code of v = x / s with nearest-even rounding: an int8 in its byte, an int4 in the low
 * nibble, or an FP8 code. Zero is always code 0. */
PRISM_QC uint8_t prism_qc_code_nearest(float v, int format)
{
    if (format == PRISM_QC_INT8 || format == PRISM_QC_INT4) {
        float qmax = prism_qc_qmax(format);
        float r = prism_qc_rint(v);
        r = r > qmax ? qmax : (r < -qmax ? -qmax : r);
        int q = (int)r;
        return (uint8_t)(format == PRISM_QC_INT8 ? (uint8_t)(int8_t)q : ((unsigned)q & 0xfu));
    }
    uint8_t code = prism_qc_fp8_encode(v, format);
    return (code & 0x7fu) ? code : 0;
}

/* Stochastic rounding of v with the 32 random bits r (kernels.h: the top 24 bits against the
 * fraction for integers and FP8 subnormals; the low 20/21 bits added below the kept mantissa in
 * the FP8 normal range). */
PRISM_QC uint8_t prism_qc_code_stochastic(float v, int format, uint32_t r)
{
    float r24 = (float)(r >> 8);
    if (format == PRISM_QC_INT8 || format == PRISM_QC_INT4) {
        float qmax = prism_qc_qmax(format);
        float lo = prism_qc_floor(v);
        float frac = v - lo; /* exact */
        float q = lo + (r24 < frac * 16777216.0f ? 1.0f : 0.0f);
        q = q > qmax ? qmax : (q < -qmax ? -qmax : q);
        int qi = (int)q;
        return (uint8_t)(format == PRISM_QC_INT8 ? (uint8_t)(int8_t)qi : ((unsigned)qi & 0xfu));
    }
    prism_qc_fp8 f = prism_qc_fp8_shape(format);
    uint32_t u = prism_qc_bits(v);
    uint8_t sign = (uint8_t)((u >> 24) & 0x80u);
    float mag = prism_qc_abs(v);
    uint8_t code;
    if (mag >= f.max) {
        code = f.maxcode;
    } else if (mag < f.min_normal) {
        float t = mag * f.sub_scale; /* exact, below 2^mbits */
        float lo = prism_qc_floor(t);
        float up = r24 < (t - lo) * 16777216.0f ? 1.0f : 0.0f;
        code = (uint8_t)(lo + up);
    } else {
        int drop = 23 - f.mbits;
        uint32_t mask = (1u << drop) - 1u;
        uint32_t a = ((u & 0x7fffffffu) + (r & mask)) & ~mask;
        float g = prism_qc_float(a); /* an FP8 value, or just above max */
        code = g > f.max ? f.maxcode : prism_qc_fp8_encode(g, format);
    }
    return code ? (uint8_t)(sign | code) : 0;
}

/* The value of a code, before scaling. */
PRISM_QC float prism_qc_decode(uint8_t code, int format)
{
    switch (format) {
    case PRISM_QC_INT8: return (float)(int8_t)code;
    case PRISM_QC_INT4: return (float)((int)(code & 0xfu) - ((code & 0x8u) ? 16 : 0));
    default: return prism_qc_fp8_decode(code, format);
    }
}

#endif
