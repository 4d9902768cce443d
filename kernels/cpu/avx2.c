/* The AVX2 path: the primitives of scalar.c eight or sixteen elements at a time, giving the
 * reference's bits for every input (codes, scales, doubles and counts;
 * tests/unit/test_kernels_paths.c compares them). What keeps them equal:
 *   - the same operations in the same order on the same values: one correctly rounded binary32
 *     division x / s per element (never a reciprocal), no fused multiply-add (this file asks for
 *     AVX2 and F16C, not FMA, and is built with -ffp-contract=off, so that no product and sum is
 *     fused even in a build that enables FMA), and the statistics' eight double lanes are the
 *     reference's lanes (element i - begin in lane (i - begin) % 8, added in element order);
 *   - a non-finite element's lane is blended to +0 before any sum: adding +0 changes no lane,
 *     because no lane sum can be -0 (it starts at +0 and +0 + -0 is +0);
 *   - every conversion is exact (bf16/f16/FP8 to binary32) or correctly rounded to nearest even
 *     (binary32 to bf16/f16, binary32 to integer), with NaN outputs rebuilt as the reference
 *     builds them;
 *   - the heads and tails of quantize and decode ranges (fewer than sixteen elements, an odd
 *     INT4 start, a stochastic start that is not on a Philox block) are handed to the scalar
 *     reference itself; the statistics pad a short tail with lanes that add nothing.
 * Like the reference, results assume the default MXCSR: round to nearest even, no flush-to-zero,
 * no denormals-are-zero.
 *
 * Speed: the loops are written once (always inline) and instantiated per input dtype, format and
 * rounding, so that no per-batch branch asks which; see kernels/README.md for the figures.
 * Built only for x86 (kernels/CMakeLists.txt); driver.c picks it when the CPU has AVX2 and F16C. */
#include "cpu.h"
#include "quant_core.h"

#include <immintrin.h>

#if !defined(__AVX2__) || !defined(__F16C__)
#error "avx2.c is compiled with -mavx2 -mf16c -ffp-contract=off (kernels/CMakeLists.txt)"
#endif

/* Loop bodies that take their dtype and format as constants, one copy per caller. */
#define AVX2_INLINE static inline __attribute__((always_inline))

/* ---- loads ------------------------------------------------------------------------------ */

/* Elements i..i+7 of data (of the given dtype) as binary32, exactly as scalar.c's load() gives
 * them. F16 goes through F16C, exact for every finite value and subnormal; a NaN's payload may
 * differ from the reference's, which never matters: non-finite elements are left out of
 * everything. */
AVX2_INLINE __m256 load8(const void *data, size_t i, prism_dtype dtype)
{
    switch (dtype) {
    case PRISM_DTYPE_BF16: {
        __m128i h = _mm_loadu_si128((const __m128i *)((const uint16_t *)data + i));
        return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
    }
    case PRISM_DTYPE_F16:
        return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)((const uint16_t *)data + i)));
    default: return _mm256_loadu_ps((const float *)data + i);
    }
}

/* Elements i..i+n-1 (n < 8) in the first n lanes, +0 in the others. */
static __m256 load_tail(const void *data, size_t i, size_t n, prism_dtype dtype)
{
    float v[8] = {0};
    for (size_t k = 0; k < n; k++) {
        switch (dtype) {
        case PRISM_DTYPE_BF16: v[k] = prism_qc_bf16_to_f32(((const uint16_t *)data)[i + k]); break;
        case PRISM_DTYPE_F16: v[k] = prism_qc_f16_to_f32(((const uint16_t *)data)[i + k]); break;
        default: v[k] = ((const float *)data)[i + k]; break;
        }
    }
    return _mm256_loadu_ps(v);
}

/* All ones in the lanes of v that hold NaN or +-Inf (prism_qc_nonfinite). */
static inline __m256i nonfinite8(__m256 v)
{
    const __m256i exp = _mm256_set1_epi32(0x7f800000);
    return _mm256_cmpeq_epi32(_mm256_and_si256(_mm256_castps_si256(v), exp), exp);
}

/* All ones in the first n lanes. */
static inline __m256i first_lanes(size_t n)
{
    return _mm256_cmpgt_epi32(_mm256_set1_epi32((int)n), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}

/* Elements i..min(i+8, end)-1 and, in *use, the lanes to use: in range and finite. */
AVX2_INLINE __m256 load_finite(const void *data, size_t i, size_t end, prism_dtype dtype,
                               __m256i *use)
{
    if (end - i >= 8) {
        __m256 v = load8(data, i, dtype);
        *use = _mm256_xor_si256(nonfinite8(v), _mm256_set1_epi32(-1));
        return v;
    }
    __m256 v = load_tail(data, i, end - i, dtype);
    *use = _mm256_andnot_si256(nonfinite8(v), first_lanes(end - i));
    return v;
}

/* ---- reductions ------------------------------------------------------------------------- */

/* ((l0+l4) + (l2+l6)) + ((l1+l5) + (l3+l7)) of lanes 0-3 in lo and 4-7 in hi: scalar.c's
 * fold8. */
static inline double fold8(__m256d lo, __m256d hi)
{
    double t[4];
    _mm256_storeu_pd(t, _mm256_add_pd(lo, hi)); /* l0+l4, l1+l5, l2+l6, l3+l7 */
    return (t[0] + t[2]) + (t[1] + t[3]);
}

static inline int32_t max_epi32_8(__m256i v)
{
    __m128i m = _mm_max_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    m = _mm_max_epi32(m, _mm_shuffle_epi32(m, 0x4e));
    m = _mm_max_epi32(m, _mm_shuffle_epi32(m, 0xb1));
    return _mm_cvtsi128_si32(m);
}

static inline int64_t sum_epi32_8(__m256i v)
{
    int32_t t[8];
    _mm256_storeu_si256((__m256i *)t, v);
    int64_t s = 0;
    for (int k = 0; k < 8; k++)
        s += t[k];
    return s;
}

static inline __m256d lanes_0_3(__m256 v)
{
    return _mm256_cvtps_pd(_mm256_castps256_ps128(v));
}

static inline __m256d lanes_4_7(__m256 v)
{
    return _mm256_cvtps_pd(_mm256_extractf128_ps(v, 1));
}

/* ---- statistics ------------------------------------------------------------------------- */

/* The first pass of the statistics over eight elements: each lane's sum, sum of squares and
 * largest magnitude, and minus the count of NaN/Inf lanes. */
typedef struct stats_lanes {
    __m256d sum_lo, sum_hi, sq_lo, sq_hi;
    __m256i max_abs; /* bit patterns: ordered as the magnitudes */
    __m256i bad;     /* minus the NaN/Inf elements per lane */
} stats_lanes;

AVX2_INLINE void stats_add8(stats_lanes *l, __m256 v)
{
    __m256i bad = nonfinite8(v);
    v = _mm256_andnot_ps(_mm256_castsi256_ps(bad), v);
    __m256d lo = lanes_0_3(v), hi = lanes_4_7(v);
    l->sum_lo = _mm256_add_pd(l->sum_lo, lo);
    l->sum_hi = _mm256_add_pd(l->sum_hi, hi);
    l->sq_lo = _mm256_add_pd(l->sq_lo, _mm256_mul_pd(lo, lo));
    l->sq_hi = _mm256_add_pd(l->sq_hi, _mm256_mul_pd(hi, hi));
    l->max_abs = _mm256_max_epi32(
        l->max_abs, _mm256_and_si256(_mm256_castps_si256(v), _mm256_set1_epi32(0x7fffffff)));
    l->bad = _mm256_add_epi32(l->bad, bad);
}

/* The second pass over eight elements: each lane's sum of (x - mean)^2, the lanes of use kept
 * (unused ones add +0). */
AVX2_INLINE void deviations_add8(__m256d *dev_lo, __m256d *dev_hi, __m256 v, __m256d mean,
                                 __m256i use)
{
    __m256d use_lo = _mm256_castsi256_pd(_mm256_cvtepi32_epi64(_mm256_castsi256_si128(use)));
    __m256d use_hi = _mm256_castsi256_pd(_mm256_cvtepi32_epi64(_mm256_extracti128_si256(use, 1)));
    __m256d d_lo = _mm256_and_pd(_mm256_sub_pd(lanes_0_3(v), mean), use_lo);
    __m256d d_hi = _mm256_and_pd(_mm256_sub_pd(lanes_4_7(v), mean), use_hi);
    *dev_lo = _mm256_add_pd(*dev_lo, _mm256_mul_pd(d_lo, d_lo));
    *dev_hi = _mm256_add_pd(*dev_hi, _mm256_mul_pd(d_hi, d_hi));
}

/* Elements i..i+7 widened to double, 0-3 in *lo and 4-7 in *hi (F32 straight from memory). */
AVX2_INLINE void load8_pd(const void *data, size_t i, prism_dtype dtype, __m256d *lo, __m256d *hi)
{
    if (dtype == PRISM_DTYPE_F32) {
        *lo = _mm256_cvtps_pd(_mm_loadu_ps((const float *)data + i));
        *hi = _mm256_cvtps_pd(_mm_loadu_ps((const float *)data + i + 4));
        return;
    }
    __m256 v = load8(data, i, dtype);
    *lo = lanes_0_3(v);
    *hi = lanes_4_7(v);
}

/* stats_add8 for eight finite elements: no mask, no count. */
AVX2_INLINE void stats_add8_finite(stats_lanes *l, __m256 v, __m256d lo, __m256d hi)
{
    l->sum_lo = _mm256_add_pd(l->sum_lo, lo);
    l->sum_hi = _mm256_add_pd(l->sum_hi, hi);
    l->sq_lo = _mm256_add_pd(l->sq_lo, _mm256_mul_pd(lo, lo));
    l->sq_hi = _mm256_add_pd(l->sq_hi, _mm256_mul_pd(hi, hi));
    l->max_abs = _mm256_max_epi32(
        l->max_abs, _mm256_and_si256(_mm256_castps_si256(v), _mm256_set1_epi32(0x7fffffff)));
}

/* All ones in the 64-bit lanes of x that hold NaN or +-Inf. */
static inline __m256i nonfinite4(__m256d x)
{
    const __m256i exp = _mm256_set1_epi64x(0x7ff0000000000000);
    return _mm256_cmpeq_epi64(_mm256_and_si256(_mm256_castpd_si256(x), exp), exp);
}

/* A tail of fewer than eight pads with +0: finite, it adds +0 to every sum and nothing to the
 * largest magnitude, and the count of elements is taken from the range, not the lanes.
 * The first pass first assumes every element finite (no masks): a lane's sum is then finite
 * exactly when its elements are (2048 binary32 values cannot overflow a double), and only a
 * chunk with a NaN or Inf is summed again, with masks. */
AVX2_INLINE void stats_chunk_as(const void *data, size_t begin, size_t end, prism_dtype dtype,
                                prism_moments *out)
{
    const stats_lanes zero = {_mm256_setzero_pd(), _mm256_setzero_pd(),    _mm256_setzero_pd(),
                              _mm256_setzero_pd(), _mm256_setzero_si256(), _mm256_setzero_si256()};
    stats_lanes l = zero;
    size_t full = begin + (end - begin) / 8 * 8;
    for (size_t i = begin; i < full; i += 8) {
        __m256d lo, hi;
        load8_pd(data, i, dtype, &lo, &hi);
        stats_add8_finite(&l, load8(data, i, dtype), lo, hi);
    }
    if (full < end) {
        __m256 v = load_tail(data, full, end - full, dtype);
        stats_add8_finite(&l, v, lanes_0_3(v), lanes_4_7(v));
    }
    __m256i sum_bad = _mm256_or_si256(nonfinite4(l.sum_lo), nonfinite4(l.sum_hi));
    if (!_mm256_testz_si256(sum_bad, sum_bad)) {
        l = zero;
        for (size_t i = begin; i < full; i += 8)
            stats_add8(&l, load8(data, i, dtype));
        if (full < end)
            stats_add8(&l, load_tail(data, full, end - full, dtype));
    }
    uint64_t n = (uint64_t)(end - begin) - (uint64_t)-sum_epi32_8(l.bad);
    double mean = n ? fold8(l.sum_lo, l.sum_hi) / (double)n : 0.0;

    /* Second pass: without masks when every element is finite, except in the padded tail. */
    const __m256d mean4 = _mm256_set1_pd(mean);
    __m256d dev_lo = _mm256_setzero_pd(), dev_hi = _mm256_setzero_pd();
    size_t i = begin;
    if (n == end - begin) {
        for (; i < full; i += 8) {
            __m256d lo, hi;
            load8_pd(data, i, dtype, &lo, &hi);
            __m256d d_lo = _mm256_sub_pd(lo, mean4), d_hi = _mm256_sub_pd(hi, mean4);
            dev_lo = _mm256_add_pd(dev_lo, _mm256_mul_pd(d_lo, d_lo));
            dev_hi = _mm256_add_pd(dev_hi, _mm256_mul_pd(d_hi, d_hi));
        }
    }
    for (; i < end; i += 8) {
        __m256i use;
        __m256 v = load_finite(data, i, end, dtype, &use);
        deviations_add8(&dev_lo, &dev_hi, v, mean4, use);
    }
    out->n = (double)n;
    out->mean = mean;
    out->m2 = fold8(dev_lo, dev_hi);
    out->sumsq = fold8(l.sq_lo, l.sq_hi);
    out->max_abs = (double)prism_qc_float((uint32_t)max_epi32_8(l.max_abs));
    out->nonfinite = (uint64_t)(end - begin) - n;
}

static void avx2_stats_chunk(const prism_tensor *x, size_t begin, size_t end, prism_moments *out)
{
    switch (x->dtype) {
    case PRISM_DTYPE_BF16: stats_chunk_as(x->data, begin, end, PRISM_DTYPE_BF16, out); break;
    case PRISM_DTYPE_F16: stats_chunk_as(x->data, begin, end, PRISM_DTYPE_F16, out); break;
    default: stats_chunk_as(x->data, begin, end, PRISM_DTYPE_F32, out); break;
    }
}

/* The largest finite |x| and the NaN/Inf count over [begin, end), eight binary32 lanes at a
 * time. The magnitudes' bit patterns are compared as integers (the same order as the values); a
 * non-finite one is above FLT_MAX's and is replaced by 0 before the maximum. */
AVX2_INLINE void amax_as(const void *data, size_t begin, size_t end, prism_dtype dtype, float *amax,
                         uint64_t *nonfinite)
{
    const __m256i abs_mask = _mm256_set1_epi32(0x7fffffff), flt_max = _mm256_set1_epi32(0x7f7fffff);
    __m256i m0 = _mm256_setzero_si256(), m1 = _mm256_setzero_si256();
    uint64_t bad = 0;
    size_t i = begin;
    while (end - i >= 16) {
        /* Per-lane counts (minus the NaN/Inf lanes) are summed every 2^28 elements at most. */
        size_t stop = end - i > ((size_t)1 << 28) ? i + ((size_t)1 << 28) : end;
        __m256i bad0 = _mm256_setzero_si256(), bad1 = _mm256_setzero_si256();
        for (; stop - i >= 16; i += 16) {
            __m256i a0 = _mm256_and_si256(_mm256_castps_si256(load8(data, i, dtype)), abs_mask);
            __m256i a1 = _mm256_and_si256(_mm256_castps_si256(load8(data, i + 8, dtype)), abs_mask);
            __m256i b0 = _mm256_cmpgt_epi32(a0, flt_max), b1 = _mm256_cmpgt_epi32(a1, flt_max);
            m0 = _mm256_max_epi32(m0, _mm256_andnot_si256(b0, a0));
            m1 = _mm256_max_epi32(m1, _mm256_andnot_si256(b1, a1));
            bad0 = _mm256_add_epi32(bad0, b0);
            bad1 = _mm256_add_epi32(bad1, b1);
        }
        __m256i bad01 = _mm256_add_epi32(bad0, bad1);
        if (!_mm256_testz_si256(bad01, bad01))
            bad += (uint64_t)-sum_epi32_8(bad01);
    }
    for (; i < end; i += 8) { /* +0 pads the tail */
        __m256 v = end - i >= 8 ? load8(data, i, dtype) : load_tail(data, i, end - i, dtype);
        __m256i a = _mm256_and_si256(_mm256_castps_si256(v), abs_mask);
        __m256i b = _mm256_cmpgt_epi32(a, flt_max);
        m0 = _mm256_max_epi32(m0, _mm256_andnot_si256(b, a));
        bad += (uint64_t)__builtin_popcount((unsigned)_mm256_movemask_ps(_mm256_castsi256_ps(b)));
    }
    *amax = prism_qc_float((uint32_t)max_epi32_8(_mm256_max_epi32(m0, m1)));
    *nonfinite = bad;
}

/* amax_as for bf16 and f16, sixteen elements at a time on their own bit patterns: |x|'s 15 bits
 * order as the magnitudes, the non-finite ones lie above the largest finite (0x7f7f, 0x7bff), and
 * the largest pattern converts exactly to the binary32 amax. The last fewer than 32 elements go
 * through amax_as. */
AVX2_INLINE void amax16_as(const uint16_t *h, size_t begin, size_t end, prism_dtype dtype,
                           float *amax, uint64_t *nonfinite)
{
    const __m256i abs_mask = _mm256_set1_epi16(0x7fff);
    const __m256i top = _mm256_set1_epi16(dtype == PRISM_DTYPE_BF16 ? 0x7f7f : 0x7bff);
    __m256i m0 = _mm256_setzero_si256(), m1 = _mm256_setzero_si256();
    uint64_t bad = 0;
    size_t i = begin;
    while (end - i >= 32) {
        /* 16-bit counts (minus the NaN/Inf lanes), summed before one could overflow. */
        size_t stop = end - i > (size_t)32 * 32767 ? i + (size_t)32 * 32767 : end;
        __m256i bad0 = _mm256_setzero_si256(), bad1 = _mm256_setzero_si256();
        for (; stop - i >= 32; i += 32) {
            __m256i a0 = _mm256_and_si256(_mm256_loadu_si256((const __m256i *)(h + i)), abs_mask);
            __m256i a1 =
                _mm256_and_si256(_mm256_loadu_si256((const __m256i *)(h + i + 16)), abs_mask);
            __m256i b0 = _mm256_cmpgt_epi16(a0, top), b1 = _mm256_cmpgt_epi16(a1, top);
            m0 = _mm256_max_epi16(m0, _mm256_andnot_si256(b0, a0));
            m1 = _mm256_max_epi16(m1, _mm256_andnot_si256(b1, a1));
            bad0 = _mm256_add_epi16(bad0, b0);
            bad1 = _mm256_add_epi16(bad1, b1);
        }
        __m256i bad32 = _mm256_add_epi32(_mm256_madd_epi16(bad0, _mm256_set1_epi16(1)),
                                         _mm256_madd_epi16(bad1, _mm256_set1_epi16(1)));
        if (!_mm256_testz_si256(bad32, bad32))
            bad += (uint64_t)-sum_epi32_8(bad32);
    }
    __m256i m = _mm256_max_epi16(m0, m1);
    __m128i m8 = _mm_max_epi16(_mm256_castsi256_si128(m), _mm256_extracti128_si256(m, 1));
    m8 = _mm_max_epi16(m8, _mm_shuffle_epi32(m8, 0x4e));
    m8 = _mm_max_epi16(m8, _mm_shuffle_epi32(m8, 0xb1));
    m8 = _mm_max_epi16(m8, _mm_srli_epi32(m8, 16));
    uint16_t top_bits = (uint16_t)_mm_cvtsi128_si32(m8);
    float most =
        dtype == PRISM_DTYPE_BF16 ? prism_qc_bf16_to_f32(top_bits) : prism_qc_f16_to_f32(top_bits);
    float rest_max = 0.0f;
    uint64_t rest_bad = 0;
    if (i < end)
        amax_as(h, i, end, dtype, &rest_max, &rest_bad);
    *amax = rest_max > most ? rest_max : most;
    *nonfinite = bad + rest_bad;
}

/* The amax of a range, with the loop that suits the dtype. */
AVX2_INLINE void amax_any(const void *data, size_t begin, size_t end, prism_dtype dtype,
                          float *amax, uint64_t *nonfinite)
{
    if (dtype == PRISM_DTYPE_F32)
        amax_as(data, begin, end, dtype, amax, nonfinite);
    else
        amax16_as(data, begin, end, dtype, amax, nonfinite);
}

static void avx2_amax(const prism_tensor *x, size_t begin, size_t end, float *amax,
                      uint64_t *nonfinite)
{
    switch (x->dtype) {
    case PRISM_DTYPE_BF16: amax_any(x->data, begin, end, PRISM_DTYPE_BF16, amax, nonfinite); break;
    case PRISM_DTYPE_F16: amax_any(x->data, begin, end, PRISM_DTYPE_F16, amax, nonfinite); break;
    default: amax_any(x->data, begin, end, PRISM_DTYPE_F32, amax, nonfinite); break;
    }
}

/* ---- codes ------------------------------------------------------------------------------ */

/* prism_qc_code_nearest of every lane of v (an INT code as an int32, an FP8 code in 0..255), v
 * finite or +-Inf, never NaN (an element over a positive scale). INT: clamping to +-qmax before
 * the conversion to integer (nearest even) is the reference's rounding then clamping, the bounds
 * being integers. FP8: prism_qc_fp8_encode's three ranges on the magnitude's bit pattern, the
 * sign put back only on a non-zero code (0x80 is written as 0). */
AVX2_INLINE __m256i code_nearest8(__m256 v, int format)
{
    if (format == PRISM_QC_INT8 || format == PRISM_QC_INT4) {
        const float qmax = prism_qc_qmax(format);
        __m256 r = _mm256_min_ps(_mm256_max_ps(v, _mm256_set1_ps(-qmax)), _mm256_set1_ps(qmax));
        return _mm256_cvtps_epi32(r);
    }
    const prism_qc_fp8 f = prism_qc_fp8_shape(format);
    const int drop = 23 - f.mbits;
    __m256i u = _mm256_castps_si256(v);
    __m256i a = _mm256_and_si256(u, _mm256_set1_epi32(0x7fffffff));
    /* Normal: round the bit pattern to nearest even at the kept mantissa (a carry moves into
     * the exponent, as it should), then rebias the exponent. */
    __m256i odd = _mm256_and_si256(_mm256_srli_epi32(a, drop), _mm256_set1_epi32(1));
    __m256i half_less_1 = _mm256_set1_epi32((1 << (drop - 1)) - 1);
    __m256i kept = _mm256_srli_epi32(_mm256_add_epi32(a, _mm256_add_epi32(half_less_1, odd)), drop);
    __m256i normal = _mm256_sub_epi32(kept, _mm256_set1_epi32((127 - f.bias) << f.mbits));
    /* Subnormal: ulps of the format, an exact scaling rounded to nearest even. */
    __m256i code =
        _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_castsi256_ps(a), _mm256_set1_ps(f.sub_scale)));
    __m256i is_normal =
        _mm256_cmpgt_epi32(a, _mm256_set1_epi32((int)prism_qc_bits(f.min_normal) - 1));
    code = _mm256_blendv_epi8(code, normal, is_normal);
    __m256i saturate = _mm256_cmpgt_epi32(a, _mm256_set1_epi32((int)prism_qc_bits(f.max)));
    code = _mm256_blendv_epi8(code, _mm256_set1_epi32(f.maxcode), saturate);
    __m256i sign = _mm256_and_si256(_mm256_srli_epi32(u, 24), _mm256_set1_epi32(0x80));
    sign = _mm256_andnot_si256(_mm256_cmpeq_epi32(code, _mm256_setzero_si256()), sign);
    return _mm256_or_si256(code, sign);
}

/* prism_qc_code_stochastic of every lane of v with the random words r. v is finite or +-Inf,
 * never NaN (an element over a positive scale). */
AVX2_INLINE __m256i code_stochastic8(__m256 v, __m256i r, int format)
{
    const __m256 one = _mm256_set1_ps(1.0f), two24 = _mm256_set1_ps(16777216.0f);
    __m256 r24 = _mm256_cvtepi32_ps(_mm256_srli_epi32(r, 8));
    if (format == PRISM_QC_INT8 || format == PRISM_QC_INT4) {
        const float qmax = prism_qc_qmax(format);
        __m256 lo = _mm256_floor_ps(v);
        __m256 frac = _mm256_sub_ps(v, lo);
        __m256 up = _mm256_cmp_ps(r24, _mm256_mul_ps(frac, two24), _CMP_LT_OQ);
        __m256 q = _mm256_add_ps(lo, _mm256_and_ps(up, one));
        q = _mm256_min_ps(_mm256_max_ps(q, _mm256_set1_ps(-qmax)), _mm256_set1_ps(qmax));
        return _mm256_cvtps_epi32(q);
    }
    const prism_qc_fp8 f = prism_qc_fp8_shape(format);
    const int drop = 23 - f.mbits;
    const __m256i max_bits = _mm256_set1_epi32((int)prism_qc_bits(f.max));
    const __m256i maxcode = _mm256_set1_epi32(f.maxcode),
                  below = _mm256_set1_epi32((1 << drop) - 1);
    __m256i u = _mm256_castps_si256(v);
    __m256i a = _mm256_and_si256(u, _mm256_set1_epi32(0x7fffffff));
    __m256i sign = _mm256_and_si256(_mm256_srli_epi32(u, 24), _mm256_set1_epi32(0x80));
    /* Subnormal range: ulps, up with probability the fraction. */
    __m256 t = _mm256_mul_ps(_mm256_castsi256_ps(a), _mm256_set1_ps(f.sub_scale));
    __m256 lo = _mm256_floor_ps(t);
    __m256 up = _mm256_cmp_ps(r24, _mm256_mul_ps(_mm256_sub_ps(t, lo), two24), _CMP_LT_OQ);
    __m256i sub = _mm256_cvtps_epi32(_mm256_add_ps(lo, _mm256_and_ps(up, one)));
    /* Normal range: random bits added below the kept mantissa, then truncated; the result is an
     * FP8 value (its code is the rebiased pattern) or just above the largest one. */
    __m256i g = _mm256_andnot_si256(below, _mm256_add_epi32(a, _mm256_and_si256(r, below)));
    __m256i normal =
        _mm256_sub_epi32(_mm256_srli_epi32(g, drop), _mm256_set1_epi32((127 - f.bias) << f.mbits));
    normal = _mm256_blendv_epi8(normal, maxcode, _mm256_cmpgt_epi32(g, max_bits));
    __m256i is_sub = _mm256_cmpgt_epi32(_mm256_set1_epi32((int)prism_qc_bits(f.min_normal)), a);
    __m256i code = _mm256_blendv_epi8(normal, sub, is_sub);
    __m256i saturate = _mm256_cmpgt_epi32(a, _mm256_sub_epi32(max_bits, _mm256_set1_epi32(1)));
    code = _mm256_blendv_epi8(code, maxcode, saturate);
    __m256i zero = _mm256_cmpeq_epi32(code, _mm256_setzero_si256());
    return _mm256_andnot_si256(zero, _mm256_or_si256(code, sign));
}

/* All ones in the lanes whose code_nearest8 clamped the rounding to qmax
 * (prism_qc_saturates_nearest): |v|'s bit pattern at or above the format's boundary. */
AVX2_INLINE __m256i saturated_nearest8(__m256 v, int format)
{
    __m256i a = _mm256_and_si256(_mm256_castps_si256(v), _mm256_set1_epi32(0x7fffffff));
    return _mm256_cmpgt_epi32(a, _mm256_set1_epi32((int)(prism_qc_saturating_bits(format) - 1u)));
}

/* All ones in the lanes whose code_stochastic8 clamped the chosen neighbour to qmax
 * (prism_qc_saturates_stochastic), with the same random words. */
AVX2_INLINE __m256i saturated_stochastic8(__m256 v, __m256i r, int format)
{
    if (format == PRISM_QC_INT8 || format == PRISM_QC_INT4) {
        const float qmax = prism_qc_qmax(format);
        __m256 r24 = _mm256_cvtepi32_ps(_mm256_srli_epi32(r, 8));
        __m256 lo = _mm256_floor_ps(v);
        __m256 frac = _mm256_sub_ps(v, lo);
        __m256 up = _mm256_cmp_ps(r24, _mm256_mul_ps(frac, _mm256_set1_ps(16777216.0f)), _CMP_LT_OQ);
        __m256 q = _mm256_add_ps(lo, _mm256_and_ps(up, _mm256_set1_ps(1.0f)));
        __m256 out = _mm256_or_ps(_mm256_cmp_ps(q, _mm256_set1_ps(qmax), _CMP_GT_OQ),
                                  _mm256_cmp_ps(q, _mm256_set1_ps(-qmax), _CMP_LT_OQ));
        return _mm256_castps_si256(out);
    }
    const prism_qc_fp8 f = prism_qc_fp8_shape(format);
    const __m256i below = _mm256_set1_epi32((1 << (23 - f.mbits)) - 1);
    __m256i a = _mm256_and_si256(_mm256_castps_si256(v), _mm256_set1_epi32(0x7fffffff));
    __m256i g = _mm256_andnot_si256(below, _mm256_add_epi32(a, _mm256_and_si256(r, below)));
    return _mm256_cmpgt_epi32(g, _mm256_set1_epi32((int)prism_qc_bits(f.max)));
}

/* Sixteen codes of elements i..i+15 (i even for INT4), int16 lanes in sequence, into their
 * bytes: INT8 as two's complement, FP8 as they are, INT4 as nibbles, element 2k low and 2k+1
 * high. */
AVX2_INLINE void store_codes16(uint8_t *codes, size_t i, __m256i code, int format)
{
    if (format == PRISM_QC_INT4) {
        /* Each 32-bit lane holds an even and an odd element; its low byte becomes
         * even | odd << 4, and bytes 0, 4, 8, 12 of each half are the eight bytes. */
        __m256i nibble = _mm256_and_si256(code, _mm256_set1_epi16(0x0f));
        __m256i pair = _mm256_or_si256(nibble, _mm256_srli_epi32(nibble, 12));
        const __m256i pick =
            _mm256_setr_epi8(0, 4, 8, 12, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, 0, 4, 8,
                             12, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1);
        __m256i bytes = _mm256_shuffle_epi8(pair, pick);
        __m128i both =
            _mm_unpacklo_epi32(_mm256_castsi256_si128(bytes), _mm256_extracti128_si256(bytes, 1));
        _mm_storel_epi64((__m128i *)(codes + i / 2), both);
        return;
    }
    __m128i lo = _mm256_castsi256_si128(code), hi = _mm256_extracti128_si256(code, 1);
    __m128i bytes = format == PRISM_QC_INT8 ? _mm_packs_epi16(lo, hi) : _mm_packus_epi16(lo, hi);
    _mm_storeu_si128((__m128i *)(codes + i), bytes);
}

/* ---- Philox ----------------------------------------------------------------------------- */

/* The Philox key of every round, in every lane. */
typedef struct philox_keys {
    __m256i k0[10], k1[10];
} philox_keys;

static void philox_keys_init(philox_keys *k, uint64_t seed)
{
    uint32_t k0 = (uint32_t)seed, k1 = (uint32_t)(seed >> 32);
    for (int round = 0; round < 10; round++) {
        k->k0[round] = _mm256_set1_epi32((int)k0);
        k->k1[round] = _mm256_set1_epi32((int)k1);
        k0 += 0x9E3779B9u;
        k1 += 0xBB67AE85u;
    }
}

/* The high 32 bits of c * m in each lane; *lo gets the low 32. */
static inline __m256i mul_hi_lo(__m256i c, __m256i m, __m256i *lo)
{
    __m256i even = _mm256_mul_epu32(c, m);                       /* lanes 0, 2, 4, 6 */
    __m256i odd = _mm256_mul_epu32(_mm256_srli_epi64(c, 32), m); /* lanes 1, 3, 5, 7 */
    *lo = _mm256_blend_epi32(even, _mm256_slli_epi64(odd, 32), 0xaa);
    return _mm256_blend_epi32(_mm256_srli_epi64(even, 32), odd, 0xaa);
}

/* prism_qc_random of elements 4 * block .. 4 * block + 31: eight Philox blocks, one per lane,
 * then transposed so that out[j] holds elements 8j..8j+7 in order. */
static __attribute__((noinline)) void philox_random32(const philox_keys *k, uint64_t block,
                                                      __m256i out[4])
{
    const __m256i m0 = _mm256_set1_epi32((int)0xD2511F53u),
                  m1 = _mm256_set1_epi32((int)0xCD9E8D57u);
    const __m256i flip = _mm256_set1_epi32((int)0x80000000u);
    __m256i base = _mm256_set1_epi32((int)(uint32_t)block);
    __m256i c0 = _mm256_add_epi32(base, _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
    /* The counter's high word, plus one where the low word wrapped (c0 < base, unsigned). */
    __m256i wrapped = _mm256_cmpgt_epi32(_mm256_xor_si256(base, flip), _mm256_xor_si256(c0, flip));
    __m256i c1 = _mm256_sub_epi32(_mm256_set1_epi32((int)(uint32_t)(block >> 32)), wrapped);
    __m256i c2 = _mm256_setzero_si256(), c3 = _mm256_setzero_si256();
    for (int round = 0; round < 10; round++) {
        __m256i lo0, lo2;
        __m256i hi0 = mul_hi_lo(c0, m0, &lo0);
        __m256i hi2 = mul_hi_lo(c2, m1, &lo2);
        __m256i n0 = _mm256_xor_si256(_mm256_xor_si256(hi2, c1), k->k0[round]);
        __m256i n2 = _mm256_xor_si256(_mm256_xor_si256(hi0, c3), k->k1[round]);
        c1 = lo2;
        c3 = lo0;
        c0 = n0;
        c2 = n2;
    }
    /* Lane b of cw is word w of block b; element 4b + w wants it. */
    __m256i t0 = _mm256_unpacklo_epi32(c0, c1), t1 = _mm256_unpackhi_epi32(c0, c1);
    __m256i t2 = _mm256_unpacklo_epi32(c2, c3), t3 = _mm256_unpackhi_epi32(c2, c3);
    __m256i b04 = _mm256_unpacklo_epi64(t0, t2), b15 = _mm256_unpackhi_epi64(t0, t2);
    __m256i b26 = _mm256_unpacklo_epi64(t1, t3), b37 = _mm256_unpackhi_epi64(t1, t3);
    out[0] = _mm256_permute2x128_si256(b04, b15, 0x20);
    out[1] = _mm256_permute2x128_si256(b26, b37, 0x20);
    out[2] = _mm256_permute2x128_si256(b04, b15, 0x31);
    out[3] = _mm256_permute2x128_si256(b26, b37, 0x31);
}

/* ---- quantize --------------------------------------------------------------------------- */

/* Elements i..i+15 as binary32 in "pack order": *lo holds elements 0-3 and 8-11, *hi 4-7 and
 * 12-15, the order _mm256_packs_epi32(lo, hi) puts back in sequence (bf16 widens into it for
 * free). *bad: all ones in the 16-bit lanes, in sequence, of NaN/Inf elements. */
AVX2_INLINE void load16(const void *data, size_t i, prism_dtype dtype, __m256 *lo, __m256 *hi,
                        __m256i *bad)
{
    if (dtype == PRISM_DTYPE_F32) {
        __m256 a = _mm256_loadu_ps((const float *)data + i),
               b = _mm256_loadu_ps((const float *)data + i + 8);
        *lo = _mm256_permute2f128_ps(a, b, 0x20);
        *hi = _mm256_permute2f128_ps(a, b, 0x31);
        *bad = _mm256_packs_epi32(nonfinite8(*lo), nonfinite8(*hi));
        return;
    }
    __m256i h = _mm256_loadu_si256((const __m256i *)((const uint16_t *)data + i));
    __m256i exp = _mm256_set1_epi16(dtype == PRISM_DTYPE_BF16 ? 0x7f80 : 0x7c00);
    *bad = _mm256_cmpeq_epi16(_mm256_and_si256(h, exp), exp);
    if (dtype == PRISM_DTYPE_BF16) {
        *lo = _mm256_castsi256_ps(_mm256_unpacklo_epi16(_mm256_setzero_si256(), h));
        *hi = _mm256_castsi256_ps(_mm256_unpackhi_epi16(_mm256_setzero_si256(), h));
        return;
    }
    __m256 a = _mm256_cvtph_ps(_mm256_castsi256_si128(h)),
           b = _mm256_cvtph_ps(_mm256_extracti128_si256(h, 1));
    *lo = _mm256_permute2f128_ps(a, b, 0x20);
    *hi = _mm256_permute2f128_ps(a, b, 0x31);
}

/* The codes of elements i..i+15 under the scale s (in every lane): x / s, the code, 0 where the
 * element is NaN/Inf. random: the words of elements i..i+7 and i+8..i+15 (stochastic only). */
AVX2_INLINE void quantize16(const void *data, size_t i, __m256 s, uint8_t *codes, prism_dtype dtype,
                            int format, int stochastic, __m256i random0, __m256i random1)
{
    __m256 lo, hi;
    __m256i bad, clo, chi;
    load16(data, i, dtype, &lo, &hi, &bad);
    __m256 qlo = _mm256_div_ps(lo, s), qhi = _mm256_div_ps(hi, s);
    if (stochastic) {
        clo = code_stochastic8(qlo, _mm256_permute2x128_si256(random0, random1, 0x20), format);
        chi = code_stochastic8(qhi, _mm256_permute2x128_si256(random0, random1, 0x31), format);
    } else {
        clo = code_nearest8(qlo, format);
        chi = code_nearest8(qhi, format);
    }
    store_codes16(codes, i, _mm256_andnot_si256(bad, _mm256_packs_epi32(clo, chi)), format);
}

/* The codes of [begin, end) under the scale s: the reference for the elements before an INT4
 * byte (and, stochastic, a Philox block) starts and for the last fewer than sixteen, sixteen at
 * a time in between. keys: the seed's Philox keys (stochastic only). */
AVX2_INLINE void quantize_range_as(const prism_quant_spec *spec, const prism_tensor *x,
                                   size_t begin, size_t end, float s, uint8_t *codes,
                                   const philox_keys *keys, prism_dtype dtype, int format,
                                   int stochastic)
{
    size_t align = stochastic ? 4 : (format == PRISM_QC_INT4 ? 2 : 1);
    size_t i = (begin + align - 1) / align * align;
    if (i > end)
        i = end;
    if (begin < i)
        prism_cpu_scalar.quantize_range(spec, x, begin, i, s, codes);
    const __m256 s8 = _mm256_set1_ps(s);
    const void *data = x->data;
    if (!stochastic) {
        for (; end - i >= 16; i += 16)
            quantize16(data, i, s8, codes, dtype, format, 0, _mm256_setzero_si256(),
                       _mm256_setzero_si256());
    } else {
        while (end - i >= 16) {
            __m256i random[4];
            philox_random32(keys, (uint64_t)i / 4, random);
            quantize16(data, i, s8, codes, dtype, format, 1, random[0], random[1]);
            i += 16;
            if (end - i >= 16) {
                quantize16(data, i, s8, codes, dtype, format, 1, random[2], random[3]);
                i += 16;
            }
        }
    }
    if (i < end)
        prism_cpu_scalar.quantize_range(spec, x, i, end, s, codes);
}

/* What the counted loop adds up: the bits of 16-bit lane masks (two bits an element) of the
 * saturated, underflowed and NaN/Inf elements, and the largest finite |x| as bit patterns. */
typedef struct count_lanes {
    uint64_t saturated2, underflowed2, nonfinite2;
    __m256i amax;
} count_lanes;

static inline uint64_t mask_bits(__m256i m)
{
    return (uint64_t)__builtin_popcount((unsigned)_mm256_movemask_epi8(m));
}

/* quantize16, counted into *k: the same codes, and per element whether it saturated (the masks
 * of saturated_*8), whether a non-zero finite x got code 0, whether it is NaN/Inf, and |x| for
 * amax (NaN/Inf lanes, whose patterns lie above FLT_MAX's, as 0). */
AVX2_INLINE void quantize16_counted(const void *data, size_t i, __m256 s, uint8_t *codes,
                                    prism_dtype dtype, int format, int stochastic, __m256i random0,
                                    __m256i random1, count_lanes *k)
{
    __m256 lo, hi;
    __m256i bad, clo, chi, slo, shi;
    load16(data, i, dtype, &lo, &hi, &bad);
    __m256 qlo = _mm256_div_ps(lo, s), qhi = _mm256_div_ps(hi, s);
    if (stochastic) {
        __m256i rlo = _mm256_permute2x128_si256(random0, random1, 0x20);
        __m256i rhi = _mm256_permute2x128_si256(random0, random1, 0x31);
        clo = code_stochastic8(qlo, rlo, format);
        chi = code_stochastic8(qhi, rhi, format);
        slo = saturated_stochastic8(qlo, rlo, format);
        shi = saturated_stochastic8(qhi, rhi, format);
    } else {
        clo = code_nearest8(qlo, format);
        chi = code_nearest8(qhi, format);
        slo = saturated_nearest8(qlo, format);
        shi = saturated_nearest8(qhi, format);
    }
    __m256i code = _mm256_andnot_si256(bad, _mm256_packs_epi32(clo, chi));
    store_codes16(codes, i, code, format);
    const __m256i abs_mask = _mm256_set1_epi32(0x7fffffff), zero = _mm256_setzero_si256();
    __m256i alo = _mm256_and_si256(_mm256_castps_si256(lo), abs_mask);
    __m256i ahi = _mm256_and_si256(_mm256_castps_si256(hi), abs_mask);
    __m256i zero_x = _mm256_packs_epi32(_mm256_cmpeq_epi32(alo, zero), _mm256_cmpeq_epi32(ahi, zero));
    __m256i sat = _mm256_andnot_si256(bad, _mm256_packs_epi32(slo, shi));
    __m256i und = _mm256_andnot_si256(_mm256_or_si256(bad, zero_x), _mm256_cmpeq_epi16(code, zero));
    k->saturated2 += mask_bits(sat);
    k->underflowed2 += mask_bits(und);
    k->nonfinite2 += mask_bits(bad);
    const __m256i flt_max = _mm256_set1_epi32(0x7f7fffff);
    alo = _mm256_andnot_si256(_mm256_cmpgt_epi32(alo, flt_max), alo);
    ahi = _mm256_andnot_si256(_mm256_cmpgt_epi32(ahi, flt_max), ahi);
    k->amax = _mm256_max_epi32(k->amax, _mm256_max_epi32(alo, ahi));
}

/* quantize_range_as, counted: the same heads and tails on the scalar reference's counted
 * primitive, sixteen at a time in between; *amax and *counts set for the range. */
AVX2_INLINE void quantize_range_counted_as(const prism_quant_spec *spec, const prism_tensor *x,
                                           size_t begin, size_t end, float s, uint8_t *codes,
                                           const philox_keys *keys, prism_dtype dtype, int format,
                                           int stochastic, float *amax, prism_quant_counts *counts)
{
    size_t align = stochastic ? 4 : (format == PRISM_QC_INT4 ? 2 : 1);
    size_t i = (begin + align - 1) / align * align;
    if (i > end)
        i = end;
    prism_quant_counts head = {0}, tail = {0};
    float head_amax = 0.0f, tail_amax = 0.0f;
    if (begin < i)
        prism_cpu_scalar.quantize_range_counted(spec, x, begin, i, s, codes, &head_amax, &head);
    count_lanes k = {0, 0, 0, _mm256_setzero_si256()};
    const __m256 s8 = _mm256_set1_ps(s);
    const void *data = x->data;
    if (!stochastic) {
        for (; end - i >= 16; i += 16)
            quantize16_counted(data, i, s8, codes, dtype, format, 0, _mm256_setzero_si256(),
                               _mm256_setzero_si256(), &k);
    } else {
        while (end - i >= 16) {
            __m256i random[4];
            philox_random32(keys, (uint64_t)i / 4, random);
            quantize16_counted(data, i, s8, codes, dtype, format, 1, random[0], random[1], &k);
            i += 16;
            if (end - i >= 16) {
                quantize16_counted(data, i, s8, codes, dtype, format, 1, random[2], random[3], &k);
                i += 16;
            }
        }
    }
    if (i < end)
        prism_cpu_scalar.quantize_range_counted(spec, x, i, end, s, codes, &tail_amax, &tail);
    float m = prism_qc_float((uint32_t)max_epi32_8(k.amax));
    m = head_amax > m ? head_amax : m;
    *amax = tail_amax > m ? tail_amax : m;
    counts->saturated = head.saturated + tail.saturated + k.saturated2 / 2;
    counts->underflowed = head.underflowed + tail.underflowed + k.underflowed2 / 2;
    counts->nonfinite = head.nonfinite + tail.nonfinite + k.nonfinite2 / 2;
}

/* Groups [g0, g1), counted (cpu.h's quantize_groups_counted): each group's scale given or from
 * its amax, then its codes and counts in one counted range. */
AVX2_INLINE void quantize_groups_counted_as(const prism_quant_spec *spec, size_t group_len,
                                            const prism_tensor *x, size_t g0, size_t g1,
                                            const float *given, float *scales, uint8_t *codes,
                                            float *amax, prism_quant_counts *counts,
                                            const philox_keys *keys, prism_dtype dtype, int format,
                                            int stochastic)
{
    int pow2 = spec->scale_mode == PRISM_SCALE_POW2;
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
            amax_any(x->data, begin, end, dtype, &group_amax, &bad);
            s = scales[g] = prism_qc_scale(group_amax, format, pow2);
        }
        float a;
        prism_quant_counts c;
        quantize_range_counted_as(spec, x, begin, end, s, codes, keys, dtype, format, stochastic,
                                  &a, &c);
        if (amax)
            amax[g] = a;
        total.saturated += c.saturated;
        total.underflowed += c.underflowed;
        total.nonfinite += c.nonfinite;
    }
    *counts = total;
}

/* Group g's amax and scale (written to scales[g]); its NaN/Inf count is added to *bad. */
AVX2_INLINE float group_scale(const prism_tensor *x, size_t group_len, size_t g, float *scales,
                              uint64_t *bad, int pow2, prism_dtype dtype, int format)
{
    size_t begin = g * group_len;
    size_t end = begin + group_len < x->numel ? begin + group_len : x->numel;
    float amax;
    uint64_t group_bad;
    amax_any(x->data, begin, end, dtype, &amax, &group_bad);
    *bad += group_bad;
    scales[g] = prism_qc_scale(amax, format, pow2);
    return scales[g];
}

/* Groups [g0, g1): amax, scale, codes, as scalar.c's quantize_groups. A short group's codes are
 * cheap next to the chain of dependent steps that gives its scale (amax, reduction, division),
 * so for groups of up to 1 KiB the scale of group g + 1 is worked out before the codes of group
 * g, to overlap with them; a longer group is quantized while it is still in L1 instead. */
AVX2_INLINE void quantize_groups_as(const prism_quant_spec *spec, size_t group_len,
                                    const prism_tensor *x, size_t g0, size_t g1, float *scales,
                                    uint8_t *codes, uint64_t *nonfinite, const philox_keys *keys,
                                    prism_dtype dtype, int format, int stochastic)
{
    int pow2 = spec->scale_mode == PRISM_SCALE_POW2;
    int ahead = group_len * (dtype == PRISM_DTYPE_F32 ? 4 : 2) <= 1024;
    uint64_t bad = 0; /* added to *nonfinite once: other threads' counts may share its line */
    float s = g0 < g1 ? group_scale(x, group_len, g0, scales, &bad, pow2, dtype, format) : 0.0f;
    for (size_t g = g0; g < g1; g++) {
        float s_next = 0.0f;
        if (ahead && g + 1 < g1)
            s_next = group_scale(x, group_len, g + 1, scales, &bad, pow2, dtype, format);
        size_t begin = g * group_len;
        size_t end = begin + group_len < x->numel ? begin + group_len : x->numel;
        quantize_range_as(spec, x, begin, end, s, codes, keys, dtype, format, stochastic);
        if (!ahead && g + 1 < g1)
            s_next = group_scale(x, group_len, g + 1, scales, &bad, pow2, dtype, format);
        s = s_next;
    }
    *nonfinite += bad;
}

/* What a quantize call runs on: the arguments of both primitives (a range under one scale, or
 * groups), and the Philox keys of the seed. */
typedef struct quantize_call {
    const prism_quant_spec *spec;
    const prism_tensor *x;
    uint8_t *codes;
    size_t begin, end; /* range */
    float s;
    size_t group_len, g0, g1; /* groups */
    float *scales;
    uint64_t *nonfinite;
    const float *given;         /* counted groups: the caller's scales, or NULL */
    float *amax;                /* counted: per group (groups) or of the range; may be NULL */
    prism_quant_counts *counts; /* counted */
    philox_keys keys;
} quantize_call;

/* One instance of the quantize loops per input dtype, format, rounding and counting. */
AVX2_INLINE void quantize_as(quantize_call *c, int groups, prism_dtype dtype, int format,
                             int stochastic, int counted)
{
    if (counted) {
        if (groups) {
            quantize_groups_counted_as(c->spec, c->group_len, c->x, c->g0, c->g1, c->given,
                                       c->scales, c->codes, c->amax, c->counts, &c->keys, dtype,
                                       format, stochastic);
        } else {
            float a;
            quantize_range_counted_as(c->spec, c->x, c->begin, c->end, c->s, c->codes, &c->keys,
                                      dtype, format, stochastic, &a, c->counts);
            if (c->amax)
                *c->amax = a;
        }
    } else if (groups)
        quantize_groups_as(c->spec, c->group_len, c->x, c->g0, c->g1, c->scales, c->codes,
                           c->nonfinite, &c->keys, dtype, format, stochastic);
    else
        quantize_range_as(c->spec, c->x, c->begin, c->end, c->s, c->codes, &c->keys, dtype, format,
                          stochastic);
}

#define QUANTIZE_FORMATS(c, groups, dtype, stochastic, counted)                                    \
    switch ((int)(c)->spec->format) {                                                              \
    case PRISM_QC_INT8: quantize_as(c, groups, dtype, PRISM_QC_INT8, stochastic, counted); break;  \
    case PRISM_QC_INT4: quantize_as(c, groups, dtype, PRISM_QC_INT4, stochastic, counted); break;  \
    case PRISM_QC_E4M3: quantize_as(c, groups, dtype, PRISM_QC_E4M3, stochastic, counted); break;  \
    default: quantize_as(c, groups, dtype, PRISM_QC_E5M2, stochastic, counted); break;             \
    }

#define QUANTIZE_DTYPES(c, groups, stochastic, counted)                                            \
    switch ((c)->x->dtype) {                                                                       \
    case PRISM_DTYPE_BF16: QUANTIZE_FORMATS(c, groups, PRISM_DTYPE_BF16, stochastic, counted) break; \
    case PRISM_DTYPE_F16: QUANTIZE_FORMATS(c, groups, PRISM_DTYPE_F16, stochastic, counted) break; \
    default: QUANTIZE_FORMATS(c, groups, PRISM_DTYPE_F32, stochastic, counted) break;              \
    }

static void quantize_nearest(quantize_call *c, int groups)
{
    QUANTIZE_DTYPES(c, groups, 0, 0)
}

static void quantize_stochastic(quantize_call *c, int groups)
{
    philox_keys_init(&c->keys, c->spec->seed);
    QUANTIZE_DTYPES(c, groups, 1, 0)
}

static void quantize_nearest_counted(quantize_call *c, int groups)
{
    QUANTIZE_DTYPES(c, groups, 0, 1)
}

static void quantize_stochastic_counted(quantize_call *c, int groups)
{
    philox_keys_init(&c->keys, c->spec->seed);
    QUANTIZE_DTYPES(c, groups, 1, 1)
}

static void avx2_quantize_range(const prism_quant_spec *spec, const prism_tensor *x, size_t begin,
                                size_t end, float s, uint8_t *codes)
{
    quantize_call c = {.spec = spec, .x = x, .codes = codes, .begin = begin, .end = end, .s = s};
    if (spec->rounding == PRISM_ROUNDING_STOCHASTIC)
        quantize_stochastic(&c, 0);
    else
        quantize_nearest(&c, 0);
}

/* Groups shorter than one batch of sixteen have nothing for the vector loop: the reference does
 * them, faster than the vector path's heads and tails would. */
static void avx2_quantize_groups(const prism_quant_spec *spec, size_t group_len,
                                 const prism_tensor *x, size_t g0, size_t g1, float *scales,
                                 uint8_t *codes, uint64_t *nonfinite)
{
    if (group_len < 16) {
        prism_cpu_scalar.quantize_groups(spec, group_len, x, g0, g1, scales, codes, nonfinite);
        return;
    }
    quantize_call c = {.spec = spec,
                       .x = x,
                       .codes = codes,
                       .group_len = group_len,
                       .g0 = g0,
                       .g1 = g1,
                       .scales = scales,
                       .nonfinite = nonfinite};
    if (spec->rounding == PRISM_ROUNDING_STOCHASTIC)
        quantize_stochastic(&c, 1);
    else
        quantize_nearest(&c, 1);
}

/* ---- dequantize ------------------------------------------------------------------------- */

/* prism_qc_decode of the codes of elements i..i+15 (i even for INT4): *v0 gets elements 0-7,
 * *v1 8-15. FP8 goes through F16C: an E5M2 code is the top byte of the f16 of the same value,
 * and an E4M3 magnitude shifted into an f16's exponent and mantissa is its value times 2^-8; both
 * exact. NaN codes become the reference's NaN, sign | 0x7fc00000. */
AVX2_INLINE void decode16(const uint8_t *codes, size_t i, int format, __m256 *v0, __m256 *v1)
{
    if (format == PRISM_QC_INT8) {
        __m128i b = _mm_loadu_si128((const __m128i *)(codes + i));
        *v0 = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(b));
        *v1 = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(b, 8)));
        return;
    }
    if (format == PRISM_QC_INT4) {
        /* Nibble k of a 32-bit word is element k of its eight: shifted to the top, then down
         * with the sign. */
        const __m256i to_top = _mm256_setr_epi32(28, 24, 20, 16, 12, 8, 4, 0);
        uint32_t w[2];
        memcpy(w, codes + i / 2, sizeof w);
        *v0 = _mm256_cvtepi32_ps(
            _mm256_srai_epi32(_mm256_sllv_epi32(_mm256_set1_epi32((int)w[0]), to_top), 28));
        *v1 = _mm256_cvtepi32_ps(
            _mm256_srai_epi32(_mm256_sllv_epi32(_mm256_set1_epi32((int)w[1]), to_top), 28));
        return;
    }
    __m256i b = _mm256_cvtepu8_epi16(_mm_loadu_si128((const __m128i *)(codes + i)));
    __m256i mag = _mm256_and_si256(b, _mm256_set1_epi16(0x7f));
    __m256i h, nan;
    if (format == PRISM_QC_E5M2) {
        h = _mm256_slli_epi16(b, 8);
        nan = _mm256_cmpgt_epi16(mag, _mm256_set1_epi16(0x7c));
    } else {
        h = _mm256_or_si256(_mm256_slli_epi16(mag, 7),
                            _mm256_slli_epi16(_mm256_and_si256(b, _mm256_set1_epi16(0x80)), 8));
        nan = _mm256_cmpeq_epi16(mag, _mm256_set1_epi16(0x7f));
    }
    *v0 = _mm256_cvtph_ps(_mm256_castsi256_si128(h));
    *v1 = _mm256_cvtph_ps(_mm256_extracti128_si256(h, 1));
    if (format == PRISM_QC_E4M3) {
        *v0 = _mm256_mul_ps(*v0, _mm256_set1_ps(256.0f));
        *v1 = _mm256_mul_ps(*v1, _mm256_set1_ps(256.0f));
    }
    if (_mm256_testz_si256(nan, nan))
        return;
    /* sign | 0x7fc00000 where the code is NaN. */
    __m256i quiet =
        _mm256_or_si256(_mm256_slli_epi16(_mm256_and_si256(b, _mm256_set1_epi16(0x80)), 8),
                        _mm256_set1_epi16(0x7fc0));
    __m256i q0 = _mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm256_castsi256_si128(quiet)), 16);
    __m256i q1 = _mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm256_extracti128_si256(quiet, 1)), 16);
    __m256 n0 = _mm256_castsi256_ps(_mm256_cvtepi16_epi32(_mm256_castsi256_si128(nan)));
    __m256 n1 = _mm256_castsi256_ps(_mm256_cvtepi16_epi32(_mm256_extracti128_si256(nan, 1)));
    *v0 = _mm256_blendv_ps(*v0, _mm256_castsi256_ps(q0), n0);
    *v1 = _mm256_blendv_ps(*v1, _mm256_castsi256_ps(q1), n1);
}

/* The scales of consecutive batches of eight elements: the group of the batch's first element
 * and where the next group starts. */
typedef struct scale_cursor {
    size_t group_len, group, next;
} scale_cursor;

static scale_cursor scale_cursor_at(size_t group_len, size_t i)
{
    size_t group = group_len ? i / group_len : 0;
    scale_cursor c = {group_len, group, (group + 1) * group_len};
    return c;
}

/* scales[e / group_len] for e = i..i+7; batches come in order, eight elements apart. */
static inline __m256 scales8(scale_cursor *c, const float *scales, size_t i)
{
    if (c->group_len == 1)
        return _mm256_loadu_ps(scales + i);
    if (i >= c->next) {
        c->group++;
        c->next += c->group_len;
    }
    if (i + 8 <= c->next)
        return _mm256_set1_ps(scales[c->group]);
    float lane[8];
    for (size_t k = 0; k < 8; k++) {
        if (i + k == c->next) {
            c->group++;
            c->next += c->group_len;
        }
        lane[k] = scales[c->group];
    }
    return _mm256_loadu_ps(lane);
}

/* All ones in the lanes of y that hold a NaN. */
static inline __m256i nan8(__m256 y)
{
    __m256i a = _mm256_and_si256(_mm256_castps_si256(y), _mm256_set1_epi32(0x7fffffff));
    return _mm256_cmpgt_epi32(a, _mm256_set1_epi32(0x7f800000));
}

/* prism_qc_f32_to_bf16 of sixteen lanes (y0: elements 0-7, y1: 8-15), in sequence: nearest even
 * on the bit pattern, a NaN quieted ((u >> 16) | 0x40). */
static inline __m256i f32_to_bf16_16(__m256 y0, __m256 y1)
{
    const __m256i round = _mm256_set1_epi32(0x7fff), one = _mm256_set1_epi32(1);
    __m256i u0 = _mm256_castps_si256(y0), u1 = _mm256_castps_si256(y1);
    __m256i r0 = _mm256_add_epi32(
        u0, _mm256_add_epi32(round, _mm256_and_si256(_mm256_srli_epi32(u0, 16), one)));
    __m256i r1 = _mm256_add_epi32(
        u1, _mm256_add_epi32(round, _mm256_and_si256(_mm256_srli_epi32(u1, 16), one)));
    r0 = _mm256_srli_epi32(r0, 16);
    r1 = _mm256_srli_epi32(r1, 16);
    __m256i nan0 = nan8(y0), nan1 = nan8(y1);
    if (!_mm256_testz_si256(_mm256_or_si256(nan0, nan1), _mm256_or_si256(nan0, nan1))) {
        const __m256i quiet = _mm256_set1_epi32(0x40);
        r0 = _mm256_blendv_epi8(r0, _mm256_or_si256(_mm256_srli_epi32(u0, 16), quiet), nan0);
        r1 = _mm256_blendv_epi8(r1, _mm256_or_si256(_mm256_srli_epi32(u1, 16), quiet), nan1);
    }
    /* packus interleaves the 128-bit halves; the permute puts them back in sequence. */
    return _mm256_permute4x64_epi64(_mm256_packus_epi32(r0, r1), 0xd8);
}

/* prism_qc_f32_to_f16 of eight lanes: F16C rounds to nearest even (overflow to Inf, f16
 * subnormals correctly rounded). A NaN is rebuilt as the reference builds it; F16C gives the
 * same bits on the CPUs checked, the rebuild keeps that from resting on the CPU. */
static inline __m128i f32_to_f16_8(__m256 y)
{
    __m128i h = _mm256_cvtps_ph(y, _MM_FROUND_TO_NEAREST_INT);
    __m256i nan = nan8(y);
    if (_mm256_testz_si256(nan, nan))
        return h;
    __m256i u = _mm256_castps_si256(y);
    __m256i q = _mm256_or_si256(
        _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(0x8000)),
        _mm256_or_si256(_mm256_set1_epi32(0x7e00),
                        _mm256_and_si256(_mm256_srli_epi32(u, 13), _mm256_set1_epi32(0x3ff))));
    __m128i q16 = _mm_packus_epi32(_mm256_castsi256_si128(q), _mm256_extracti128_si256(q, 1));
    __m128i nan16 = _mm_packs_epi32(_mm256_castsi256_si128(nan), _mm256_extracti128_si256(nan, 1));
    return _mm_blendv_epi8(h, q16, nan16);
}

/* The first element the vector loops of dequantize and accumulate take: begin, or begin + 1
 * when an INT4 range starts in the middle of a byte (not past end). */
static size_t decode_start(prism_precision format, size_t begin, size_t end)
{
    return format == PRISM_PRECISION_INT4 && begin % 2 && begin < end ? begin + 1 : begin;
}

/* out[i] as dtype for [i, end), sixteen at a time; returns where fewer than sixteen remain. */
AVX2_INLINE size_t dequantize_as(const uint8_t *codes, const float *scales, size_t group_len,
                                 size_t i, size_t end, void *out, int format, prism_dtype dtype)
{
    scale_cursor cursor = scale_cursor_at(group_len, i);
    for (; end - i >= 16; i += 16) {
        __m256 v0, v1;
        decode16(codes, i, format, &v0, &v1);
        __m256 y0 = _mm256_mul_ps(v0, scales8(&cursor, scales, i));
        __m256 y1 = _mm256_mul_ps(v1, scales8(&cursor, scales, i + 8));
        switch (dtype) {
        case PRISM_DTYPE_BF16:
            _mm256_storeu_si256((__m256i *)((uint16_t *)out + i), f32_to_bf16_16(y0, y1));
            break;
        case PRISM_DTYPE_F16:
            _mm_storeu_si128((__m128i *)((uint16_t *)out + i), f32_to_f16_8(y0));
            _mm_storeu_si128((__m128i *)((uint16_t *)out + i + 8), f32_to_f16_8(y1));
            break;
        default:
            _mm256_storeu_ps((float *)out + i, y0);
            _mm256_storeu_ps((float *)out + i + 8, y1);
            break;
        }
    }
    return i;
}

static void avx2_dequantize_range(prism_precision format, size_t group_len, const uint8_t *codes,
                                  const float *scales, size_t begin, size_t end, void *out,
                                  prism_dtype dtype)
{
#define DEQUANTIZE_AS(fmt)                                                                         \
    switch (dtype) {                                                                               \
    case PRISM_DTYPE_BF16:                                                                         \
        i = dequantize_as(codes, scales, group_len, i, end, out, fmt, PRISM_DTYPE_BF16);           \
        break;                                                                                     \
    case PRISM_DTYPE_F16:                                                                          \
        i = dequantize_as(codes, scales, group_len, i, end, out, fmt, PRISM_DTYPE_F16);            \
        break;                                                                                     \
    default: i = dequantize_as(codes, scales, group_len, i, end, out, fmt, PRISM_DTYPE_F32);       \
        break;                                                                                     \
    }
    size_t i = decode_start(format, begin, end);
    if (begin < i)
        prism_cpu_scalar.dequantize_range(format, group_len, codes, scales, begin, i, out, dtype);
    switch ((int)format) {
    case PRISM_QC_INT8: DEQUANTIZE_AS(PRISM_QC_INT8) break;
    case PRISM_QC_INT4: DEQUANTIZE_AS(PRISM_QC_INT4) break;
    case PRISM_QC_E4M3: DEQUANTIZE_AS(PRISM_QC_E4M3) break;
    default: DEQUANTIZE_AS(PRISM_QC_E5M2) break;
    }
#undef DEQUANTIZE_AS
    if (i < end)
        prism_cpu_scalar.dequantize_range(format, group_len, codes, scales, i, end, out, dtype);
}

/* acc[i] + y for [i, end), sixteen at a time, written y + acc as gcc -O2 orders scalar.c's
 * addition. The order shows only when both are NaN (which NaN survives), and the compiler is
 * free to swap it on either path, so that one case is not part of the promise. */
AVX2_INLINE size_t accumulate_as(const uint8_t *codes, const float *scales, size_t group_len,
                                 size_t i, size_t end, float *acc, int format)
{
    scale_cursor cursor = scale_cursor_at(group_len, i);
    for (; end - i >= 16; i += 16) {
        __m256 v0, v1;
        decode16(codes, i, format, &v0, &v1);
        __m256 y0 = _mm256_mul_ps(v0, scales8(&cursor, scales, i));
        __m256 y1 = _mm256_mul_ps(v1, scales8(&cursor, scales, i + 8));
        _mm256_storeu_ps(acc + i, _mm256_add_ps(y0, _mm256_loadu_ps(acc + i)));
        _mm256_storeu_ps(acc + i + 8, _mm256_add_ps(y1, _mm256_loadu_ps(acc + i + 8)));
    }
    return i;
}

static void avx2_accumulate_range(prism_precision format, size_t group_len, const uint8_t *codes,
                                  const float *scales, size_t begin, size_t end, float *acc)
{
    size_t i = decode_start(format, begin, end);
    if (begin < i)
        prism_cpu_scalar.accumulate_range(format, group_len, codes, scales, begin, i, acc);
    switch ((int)format) {
    case PRISM_QC_INT8:
        i = accumulate_as(codes, scales, group_len, i, end, acc, PRISM_QC_INT8);
        break;
    case PRISM_QC_INT4:
        i = accumulate_as(codes, scales, group_len, i, end, acc, PRISM_QC_INT4);
        break;
    case PRISM_QC_E4M3:
        i = accumulate_as(codes, scales, group_len, i, end, acc, PRISM_QC_E4M3);
        break;
    default: i = accumulate_as(codes, scales, group_len, i, end, acc, PRISM_QC_E5M2); break;
    }
    if (i < end)
        prism_cpu_scalar.accumulate_range(format, group_len, codes, scales, i, end, acc);
}

/* ---- relative error --------------------------------------------------------------------- */

/* sums[0] = sum of (a - b)^2, sums[1] = sum of a^2 in the statistics' lanes, NaN/Inf lanes
 * blended to +0 (and reported); a tail pads with +0, which adds nothing. */
AVX2_INLINE void error_chunk_as(const void *a, const void *b, size_t begin, size_t end,
                                prism_dtype a_dtype, prism_dtype b_dtype, double sums[2],
                                int *nonfinite)
{
    __m256d diff_lo = _mm256_setzero_pd(), diff_hi = _mm256_setzero_pd();
    __m256d norm_lo = _mm256_setzero_pd(), norm_hi = _mm256_setzero_pd();
    __m256i any_bad = _mm256_setzero_si256();
    for (size_t i = begin; i < end; i += 8) {
        __m256 va, vb;
        if (end - i >= 8) {
            va = load8(a, i, a_dtype);
            vb = load8(b, i, b_dtype);
        } else {
            va = load_tail(a, i, end - i, a_dtype);
            vb = load_tail(b, i, end - i, b_dtype);
        }
        __m256i bad = _mm256_or_si256(nonfinite8(va), nonfinite8(vb));
        any_bad = _mm256_or_si256(any_bad, bad);
        va = _mm256_andnot_ps(_mm256_castsi256_ps(bad), va);
        vb = _mm256_andnot_ps(_mm256_castsi256_ps(bad), vb);
        __m256d a_lo = lanes_0_3(va), a_hi = lanes_4_7(va);
        __m256d d_lo = _mm256_sub_pd(a_lo, lanes_0_3(vb)),
                d_hi = _mm256_sub_pd(a_hi, lanes_4_7(vb));
        diff_lo = _mm256_add_pd(diff_lo, _mm256_mul_pd(d_lo, d_lo));
        diff_hi = _mm256_add_pd(diff_hi, _mm256_mul_pd(d_hi, d_hi));
        norm_lo = _mm256_add_pd(norm_lo, _mm256_mul_pd(a_lo, a_lo));
        norm_hi = _mm256_add_pd(norm_hi, _mm256_mul_pd(a_hi, a_hi));
    }
    sums[0] = fold8(diff_lo, diff_hi);
    sums[1] = fold8(norm_lo, norm_hi);
    *nonfinite = !_mm256_testz_si256(any_bad, any_bad);
}

/* One instance per dtype when a and b share it (the common case: a tensor and its decoding),
 * and one that asks per batch otherwise. */
static void avx2_error_chunk(const prism_tensor *a, const prism_tensor *b, size_t begin, size_t end,
                             double sums[2], int *nonfinite)
{
    if (a->dtype != b->dtype) {
        error_chunk_as(a->data, b->data, begin, end, a->dtype, b->dtype, sums, nonfinite);
        return;
    }
    switch (a->dtype) {
    case PRISM_DTYPE_BF16:
        error_chunk_as(a->data, b->data, begin, end, PRISM_DTYPE_BF16, PRISM_DTYPE_BF16, sums,
                       nonfinite);
        break;
    case PRISM_DTYPE_F16:
        error_chunk_as(a->data, b->data, begin, end, PRISM_DTYPE_F16, PRISM_DTYPE_F16, sums,
                       nonfinite);
        break;
    default:
        error_chunk_as(a->data, b->data, begin, end, PRISM_DTYPE_F32, PRISM_DTYPE_F32, sums,
                       nonfinite);
        break;
    }
}

static void avx2_quantize_range_counted(const prism_quant_spec *spec, const prism_tensor *x,
                                        size_t begin, size_t end, float s, uint8_t *codes,
                                        float *amax, prism_quant_counts *counts)
{
    quantize_call c = {.spec = spec, .x = x, .codes = codes, .begin = begin, .end = end, .s = s,
                       .amax = amax, .counts = counts};
    if (spec->rounding == PRISM_ROUNDING_STOCHASTIC)
        quantize_stochastic_counted(&c, 0);
    else
        quantize_nearest_counted(&c, 0);
}

/* Groups shorter than one batch of sixteen go to the reference, as in avx2_quantize_groups. */
static void avx2_quantize_groups_counted(const prism_quant_spec *spec, size_t group_len,
                                         const prism_tensor *x, size_t g0, size_t g1,
                                         const float *given, float *scales, uint8_t *codes,
                                         float *amax, prism_quant_counts *counts)
{
    if (group_len < 16) {
        prism_cpu_scalar.quantize_groups_counted(spec, group_len, x, g0, g1, given, scales, codes,
                                                 amax, counts);
        return;
    }
    quantize_call c = {.spec = spec,
                       .x = x,
                       .codes = codes,
                       .group_len = group_len,
                       .g0 = g0,
                       .g1 = g1,
                       .scales = scales,
                       .given = given,
                       .amax = amax,
                       .counts = counts};
    if (spec->rounding == PRISM_ROUNDING_STOCHASTIC)
        quantize_stochastic_counted(&c, 1);
    else
        quantize_nearest_counted(&c, 1);
}

const prism_cpu_path prism_cpu_avx2 = {
    .name = "avx2",
    .stats_chunk = avx2_stats_chunk,
    .amax = avx2_amax,
    .quantize_range = avx2_quantize_range,
    .quantize_groups = avx2_quantize_groups,
    .quantize_range_counted = avx2_quantize_range_counted,
    .quantize_groups_counted = avx2_quantize_groups_counted,
    .dequantize_range = avx2_dequantize_range,
    .accumulate_range = avx2_accumulate_range,
    .error_chunk = avx2_error_chunk,
};
