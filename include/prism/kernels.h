/* Prism's kernels (DESIGN 3, 8): one C API over the CPU and CUDA backends. kernels/cpu holds the
 * reference of every operation (the specification); other paths are tested against it.
 *
 * This header grows with the kernels; what it declares is implemented and tested. */
#ifndef PRISM_KERNELS_H
#define PRISM_KERNELS_H

#include "prism/common.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Element types of gradient tensors. */
typedef enum prism_dtype {
    PRISM_DTYPE_F32 = 0,
    PRISM_DTYPE_BF16 = 1, /* bfloat16: the top 16 bits of an IEEE binary32 */
    PRISM_DTYPE_F16 = 2   /* IEEE binary16 */
} prism_dtype;

/* A tensor's elements, contiguous, in host memory for the CPU backend. */
typedef struct prism_tensor {
    const void *data;
    size_t numel;
    prism_dtype dtype;
} prism_tensor;

/* The statistics of DESIGN 3 over all elements of a block's gradient tensors. */
typedef struct prism_grad_stats {
    double l2_norm;     /* sqrt of the sum of squares of the finite elements */
    double max_abs;     /* largest |x| of the finite elements (0 when there are none) */
    double mean;        /* mean of the finite elements (0 when there are none) */
    double variance;    /* population variance of the finite elements (0 when there are none) */
    uint64_t numel;     /* every element, non-finite ones included */
    uint64_t nonfinite; /* NaN and +-Inf elements: counted, and left out of every other figure */
} prism_grad_stats;

/* Exact conversions to binary32 (every bf16 and f16 value, subnormals, infinities and NaNs
 * included, is a binary32 value). */
float prism_bf16_to_f32(uint16_t bits);
float prism_f16_to_f32(uint16_t bits);

/* binary32 to bf16 and f16, rounding to nearest, ties to even. Values beyond the f16 range become
 * +-Inf (IEEE overflow); a NaN stays a NaN (quiet, sign kept). */
uint16_t prism_f32_to_bf16(float x);
uint16_t prism_f32_to_f16(float x);

/* ---------------------------------------------------------------------------------------------
 * Block gradient statistics (DESIGN 3)
 *
 * The order of the arithmetic is part of the definition, so that every path (scalar, AVX2,
 * threaded) gives the same bits. A tensor is cut into chunks of PRISM_STATS_CHUNK elements (the
 * last one shorter). Within a chunk, element i belongs to lane i % 8; each lane sums its finite
 * elements and their squares in double, and keeps its largest |x|. The lanes are folded as
 * ((l0+l4) + (l2+l6)) + ((l1+l5) + (l3+l7)). The chunk's mean is sum/n, and a second pass over
 * the chunk sums (x - mean)^2 in the same lanes and fold. Chunks, then tensors, are merged in
 * order by Chan's update of (n, mean, M2): the variance is never E[x^2] - E[x]^2.
 * ------------------------------------------------------------------------------------------- */

#define PRISM_STATS_CHUNK 2048

/* Block gradient statistics on the CPU, one pass over every tensor (the chunked two-pass above
 * reads each chunk from memory once). count may be 0 (all figures 0). A tensor with numel > 0
 * and no data, or an unknown dtype, is PRISM_ERR_INVALID naming the tensor. */
prism_status prism_grad_stats_cpu(const prism_tensor *tensors, size_t count, prism_grad_stats *out,
                                  prism_error *err);

/* The statistics of many blocks in one call: block b is tensors[block_start[b]] up to (not
 * including) tensors[block_start[b + 1]]; block_start has blocks + 1 entries, non-decreasing,
 * starting at 0. out has one entry per block. Each block's figures are those
 * prism_grad_stats_cpu gives for its tensors. */
prism_status prism_grad_stats_blocks_cpu(const prism_tensor *tensors, const size_t *block_start,
                                         size_t blocks, prism_grad_stats *out, prism_error *err);

/* ---------------------------------------------------------------------------------------------
 * Quantization (DESIGN 8)
 *
 * Formats, as prism_precision values (bf16 is not a quantized format and is refused):
 *   INT8      int8_t codes in [-127, 127] (two's complement; -128 is never written)
 *   FP8_E4M3  OCP E4M3 "fn": bias 7, no infinities, 0x7f/0xff are NaN, max 448, saturating
 *   FP8_E5M2  OCP E5M2: bias 15, max finite 57344, saturating (Inf is never written)
 *   INT4      [-7, 7] as a two's-complement nibble, two per byte, low nibble first: element i
 *             is in byte i / 2, bits 0-3 when i is even and 4-7 when odd. With an odd numel the
 *             last byte's high nibble is 0. Codes take (numel + 1) / 2 bytes.
 * qmax is 127, 448, 57344 and 7.
 *
 * Granularity: the elements are cut into groups of consecutive elements, each with one scale:
 *   TENSOR  one group of numel elements
 *   ROW     rows of `group` elements (the row length); numel must be a multiple of it
 *   BLOCK   groups of `group` elements (K; 0 means PRISM_QUANT_BLOCK_DEFAULT), the last one
 *           shorter when numel is not a multiple
 *
 * Scale (the dequantization multiplier s, x ~ q * s), from amax, the largest finite |x| of the
 * group:
 *   FP32  s = amax / qmax, one binary32 division; if that underflows to 0 (amax below about
 *         qmax * 2^-150), s is the smallest positive binary32, 2^-149.
 *   POW2  s = 2^e with e the smallest integer such that qmax * 2^e >= amax, at least -149: exact
 *         to rescale and storable as E8M0.
 *   amax == 0 (all zeros, or nothing finite): s = 1 and every code is 0.
 *
 * Codes: v = x / s (one binary32 division, correctly rounded, never a multiplication by 1/s, so
 * tiny and subnormal scales work), then:
 *   NEAREST     INT: v rounded to the nearest integer, ties to even, clamped to [-qmax, qmax].
 *               FP8: v rounded to the nearest FP8 value, ties to even mantissa, |v| beyond the
 *               largest finite value saturates to it (the same as cuda_fp8.h's
 *               __nv_cvt_float_to_fp8 with __NV_SATFINITE). Subnormal FP8 values are used.
 *   STOCHASTIC  v goes to one of the two representable neighbours around it, the one farther
 *               from zero with probability (|v| - |lo|) / (|hi| - |lo|), so E[q * s] = x. The
 *               random bits come from Philox4x32-10 keyed by the seed: element i uses word i % 4
 *               of the block with counter (i / 4 as 64 bits, 0, 0); the same seed gives the same
 *               codes on every path and device. INT and the FP8 subnormal range compare 24 random
 *               bits with the fraction (bias below 2^-24); the FP8 normal range adds 20 (E4M3) or
 *               21 (E5M2) random bits below the kept mantissa and truncates.
 * Non-finite inputs (NaN, +-Inf) are left out of amax, written as code 0 (never encoded as a
 * value), and counted into *nonfinite; the call still succeeds. The caller decides what a
 * non-zero count means (prism's statistics report the same count to the policy).
 * Zero: a value that rounds to zero is written as code 0 (never FP8's negative zero, 0x80), so
 * equal tensors give equal codes whatever the signs of their zeros.
 * ------------------------------------------------------------------------------------------- */

#define PRISM_QUANT_BLOCK_DEFAULT 128

typedef enum prism_granularity {
    PRISM_GRANULARITY_TENSOR = 0,
    PRISM_GRANULARITY_ROW = 1,
    PRISM_GRANULARITY_BLOCK = 2
} prism_granularity;

typedef enum prism_scale_mode {
    PRISM_SCALE_FP32 = 0,
    PRISM_SCALE_POW2 = 1
} prism_scale_mode;

typedef enum prism_rounding {
    PRISM_ROUNDING_NEAREST = 0,
    PRISM_ROUNDING_STOCHASTIC = 1
} prism_rounding;

/* How a tensor is quantized. Zero-initialised, every field but format has its default (per
 * tensor, FP32 scale, nearest rounding); format 0 is bf16, which is refused. */
typedef struct prism_quant_spec {
    prism_precision format;        /* INT8, FP8_E4M3, FP8_E5M2 or INT4 */
    prism_granularity granularity; /* TENSOR, ROW or BLOCK */
    size_t group;                  /* ROW: row length; BLOCK: K (0: 128); TENSOR: ignored */
    prism_scale_mode scale_mode;   /* FP32 or POW2 */
    prism_rounding rounding;       /* NEAREST or STOCHASTIC */
    uint64_t seed;                 /* STOCHASTIC: Philox key */
} prism_quant_spec;

/* Checks a spec against numel (format, enums, the row length dividing numel) and fills the
 * layout: *groups scales, *group_len elements per group (the last group may be shorter for
 * BLOCK), *code_bytes bytes of codes. NULL outputs are skipped. PRISM_ERR_INVALID names the
 * field at fault. */
prism_status prism_quant_layout(const prism_quant_spec *spec, size_t numel, size_t *groups,
                                size_t *group_len, size_t *code_bytes, prism_error *err);

/* The largest finite value of an 8-bit or 4-bit format (qmax above); 0 for bf16. */
float prism_quant_qmax(prism_precision format);

/* Quantizes x (F32, BF16 or F16, host memory) into codes (prism_quant_layout's code_bytes) and
 * scales (one per group). *nonfinite (may be NULL) gets the count of NaN/Inf inputs. */
prism_status prism_quantize_cpu(const prism_quant_spec *spec, const prism_tensor *x, uint8_t *codes,
                                float *scales, uint64_t *nonfinite, prism_error *err);

/* ---------------------------------------------------------------------------------------------
 * Caller-given scales, and what quantization clipped (DESIGN 4.7, scale modes)
 *
 * Counted per call, over the finite elements x (v = x / s as above):
 *   saturated    the clamp to qmax changed the code. With NEAREST: v rounded to the format's grid
 *                as if it had no largest value lands above qmax, i.e.
 *                  INT8      |v| >= 127.5  (127.5 is the tie between 127 and 128: even 128)
 *                  INT4      |v| >= 7.5    (7.5 ties 7 and 8: even 8)
 *                  FP8_E4M3  |v| > 464     (464 ties 448 = 1.110b*2^8 and 480 = 1.111b*2^8: even
 *                                           448, so 464 itself is not saturated)
 *                  FP8_E5M2  |v| >= 61440  (61440 ties 57344 = 1.11b*2^15 and 65536 = 2^16: even
 *                                           65536)
 *                and every v that overflowed to +-Inf. This is deliberately not |v| > qmax: under
 *                the FP32 scale (amax / qmax) the largest element lands on qmax up to one unit
 *                of rounding and is never counted; under POW2 it lands at or below qmax.
 *                With STOCHASTIC: the neighbour the random bits chose lies above qmax: for INT,
 *                lo + up beyond +-qmax (v = 127.3 saturates when its bits round it up to 128);
 *                for FP8, the normal-range rule (random bits added below the kept mantissa,
 *                then truncated) applied on the grid extended past the largest value gives a
 *                value above qmax (|v| in (448, 480) for E4M3: with probability
 *                (|v| - 448) / 32). The code is qmax's either way.
 *   underflowed  x != 0 and the code is 0 (FP8's negative zero is never written, so a negative
 *                value that rounds to zero is counted here too).
 *   nonfinite    NaN and +-Inf elements, written as code 0 and counted in neither of the above.
 * ------------------------------------------------------------------------------------------- */

typedef struct prism_quant_counts {
    uint64_t saturated;   /* finite elements whose code the format's largest value replaced */
    uint64_t underflowed; /* finite non-zero elements written as code 0 */
    uint64_t nonfinite;   /* NaN/Inf elements (code 0, counted in neither of the above) */
    uint64_t bad_scale;   /* prism_quantize_scaled_cuda only: groups whose given scale is not finite
                           * and > 0 (every element code 0, in neither saturated nor underflowed);
                           * always 0 on the CPU, which refuses such scales */
} prism_quant_counts;

/* prism_quantize_cpu (the same codes and scales, bit for bit), plus the counts of the call in
 * *counts (set, not added to; may be NULL). */
prism_status prism_quantize_counted_cpu(const prism_quant_spec *spec, const prism_tensor *x,
                                        uint8_t *codes, float *scales, prism_quant_counts *counts,
                                        prism_error *err);

/* Quantizes with the caller's scales (one per group, as prism_quant_layout counts them): one pass
 * over x, the codes of each element as above under its group's given scale. Every scale must be
 * finite and > 0, else PRISM_ERR_INVALID ("scales[G]: V is not a finite scale > 0", G the first
 * such group) and nothing is written. amax (may be NULL; one per group) gets each group's largest
 * finite |x| (0 when none), for a delayed-scaling history; counts (may be NULL) as above, set.
 * spec->scale_mode is not used. With the scales prism_quantize_cpu computes, the codes are its
 * codes. */
prism_status prism_quantize_scaled_cpu(const prism_quant_spec *spec, const prism_tensor *x,
                                       const float *scales, uint8_t *codes, float *amax,
                                       prism_quant_counts *counts, prism_error *err);

/* The delayed-scaling scale (DESIGN 4.7, scale_mode "delayed"): hist_max * 2^margin rounded once
 * to binary32 (what ldexpf gives), then one binary32 division by qmax(format). hist_max not > 0
 * or not finite (no history yet), or bf16 (no qmax): 1. A result that overflows gives FLT_MAX,
 * one that underflows to 0 gives 2^-149 (the FP32 rule above). With margin 0 and hist_max the
 * group's amax it is the FP32 scale. The same bits on the CPU and the GPU (quant_core.h). */
float prism_quant_scale_delayed(float hist_max, int margin, prism_precision format);

/* Decodes numel elements: out[i] = decode(code i) * scale of its group, one binary32
 * multiplication, then written as out_dtype (F32 exact; BF16 and F16 rounded to nearest even,
 * F16 overflowing to Inf). FP8 NaN codes (never written by prism_quantize) decode to NaN. */
prism_status prism_dequantize_cpu(const prism_quant_spec *spec, const uint8_t *codes,
                                  const float *scales, size_t numel, void *out, prism_dtype out_dtype,
                                  prism_error *err);

/* acc[i] = acc[i] + decode(code i) * scale: the product rounded to binary32, then the sum
 * (two roundings, never a fused multiply-add), so every path gives the same bits. */
prism_status prism_dequantize_accumulate_cpu(const prism_quant_spec *spec, const uint8_t *codes,
                                             const float *scales, size_t numel, float *acc,
                                             prism_error *err);

/* ||a - b|| / ||a|| over the elements (the same numel, any dtypes): the squares summed in double
 * in the chunks, lanes and fold of the statistics, chunks added in order, then
 * sqrt(sum (a-b)^2 / sum a^2). ||a|| == 0: 0 when b is all zero too, +Inf otherwise. A NaN or Inf
 * element in either gives NaN. */
prism_status prism_relative_error_cpu(const prism_tensor *a, const prism_tensor *b, double *out,
                                      prism_error *err);

/* The scalar conversions the quantizer is built from, exported for tests and the Python binding;
 * format is PRISM_PRECISION_FP8_E4M3 or _E5M2. prism_f32_to_fp8 rounds to nearest even and
 * saturates finite values and infinities to the largest finite code, keeping the sign, exactly
 * as cuda_fp8.h's __nv_cvt_float_to_fp8(x, __NV_SATFINITE, ...) does, negative zero (0x80)
 * included; every NaN gives 0x7f, as cuda_fp8.h does (the quantizer never passes one).
 * prism_fp8_to_f32 is exact. */
uint8_t prism_f32_to_fp8(float x, prism_precision format);
float prism_fp8_to_f32(uint8_t code, prism_precision format);

/* Philox4x32-10 (Salmon et al., SC'11): the four 32-bit words for counter ctr under key. The
 * quantizer's element i uses ctr = {low and high words of i / 4, 0, 0}, key = {low and high
 * words of the seed}, and word i % 4 of the result. */
void prism_philox4x32_10(const uint32_t ctr[4], const uint32_t key[2], uint32_t out[4]);

#ifdef __cplusplus
}
#endif

#endif
