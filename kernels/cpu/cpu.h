/* Inside the CPU backend: the element-range primitives that each path (the scalar reference,
 * AVX2) implements, and the drivers that cut a call into ranges, run them (on threads for large
 * inputs) and combine the results in a fixed order. Because every path's primitives give the same
 * bits for the same range, and the drivers combine ranges in the same order whatever the number
 * of threads, every path and thread count gives the reference's result.
 *
 * Internal to kernels/: tests include it to run one path against another. */
#ifndef PRISM_KERNELS_CPU_H
#define PRISM_KERNELS_CPU_H

#include "checks.h" /* PRISM_HIDDEN: internal symbols stay out of libprism.so's exported ABI */
#include "prism/kernels.h"

/* Figures of the finite elements of a range, merged by Chan's update. */
typedef struct prism_moments {
    double n, mean, m2, sumsq, max_abs;
    uint64_t nonfinite;
} prism_moments;

/* a <- a merged with b (Chan et al.); with a empty, a becomes b exactly. */
PRISM_HIDDEN void prism_moments_merge(prism_moments *a, const prism_moments *b);

/* Element type size in bytes; 0 for an unknown dtype. */
PRISM_HIDDEN size_t prism_dtype_size(prism_dtype dtype);

typedef struct prism_cpu_path {
    const char *name;
    /* Moments of elements [begin, end) of x, a range of at most PRISM_STATS_CHUNK elements that
     * starts at a multiple of it, by the chunked two-pass rule of kernels.h. */
    void (*stats_chunk)(const prism_tensor *x, size_t begin, size_t end, prism_moments *out);
    /* Largest finite |x| over [begin, end) (0 when none) and the count of NaN/Inf there. */
    void (*amax)(const prism_tensor *x, size_t begin, size_t end, float *amax, uint64_t *nonfinite);
    /* Codes of elements [begin, end), all under the one scale s. INT4 nibbles are written into
     * their bytes without touching the other nibble, so begin and end may be odd. */
    void (*quantize_range)(const prism_quant_spec *spec, const prism_tensor *x, size_t begin,
                           size_t end, float s, uint8_t *codes);
    /* Groups [g0, g1) of group_len elements each (the last group of the tensor may be shorter):
     * amax, scale into scales[g], codes; adds the NaN/Inf count to *nonfinite. */
    void (*quantize_groups)(const prism_quant_spec *spec, size_t group_len, const prism_tensor *x,
                            size_t g0, size_t g1, float *scales, uint8_t *codes, uint64_t *nonfinite);
    /* quantize_range, counted: the same codes, and *counts set to what the range's elements
     * counted (kernels.h: saturated, underflowed, nonfinite); *amax (may be NULL) set to the
     * range's largest finite |x| (0 when none). */
    void (*quantize_range_counted)(const prism_quant_spec *spec, const prism_tensor *x,
                                   size_t begin, size_t end, float s, uint8_t *codes, float *amax,
                                   prism_quant_counts *counts);
    /* Groups [g0, g1) as quantize_groups, counted: with given != NULL group g is quantized under
     * given[g]; else its scale comes from its amax (spec->scale_mode) and is written to
     * scales[g]. amax (may be NULL) gets each group's largest finite |x|; *counts is set to the
     * sum over the groups. */
    void (*quantize_groups_counted)(const prism_quant_spec *spec, size_t group_len,
                                    const prism_tensor *x, size_t g0, size_t g1,
                                    const float *given, float *scales, uint8_t *codes, float *amax,
                                    prism_quant_counts *counts);
    /* out[i] (as dtype) for elements [begin, end). */
    void (*dequantize_range)(prism_precision format, size_t group_len, const uint8_t *codes,
                             const float *scales, size_t begin, size_t end, void *out,
                             prism_dtype dtype);
    /* acc[i] += decoded element i, for [begin, end). */
    void (*accumulate_range)(prism_precision format, size_t group_len, const uint8_t *codes,
                             const float *scales, size_t begin, size_t end, float *acc);
    /* sums[0] = sum of (a - b)^2, sums[1] = sum of a^2 over [begin, end) (a chunk as for
     * stats_chunk, same lanes and fold); *nonfinite gets 1 when any element is NaN/Inf. */
    void (*error_chunk)(const prism_tensor *a, const prism_tensor *b, size_t begin, size_t end,
                        double sums[2], int *nonfinite);
} prism_cpu_path;

extern PRISM_HIDDEN const prism_cpu_path prism_cpu_scalar;

/* The AVX2 + F16C path (avx2.c), built on x86 only; it may run only where the CPU reports both
 * (__builtin_cpu_supports("avx2") and ("f16c")). */
#if defined(__x86_64__) || defined(__i386__)
#define PRISM_CPU_HAVE_AVX2 1
extern PRISM_HIDDEN const prism_cpu_path prism_cpu_avx2;
#else
#define PRISM_CPU_HAVE_AVX2 0
#endif

/* The path the public *_cpu functions take, chosen once: AVX2 when the build has it and the CPU
 * reports AVX2 and F16C (FMA is not needed), else the scalar one. The environment variable
 * PRISM_CPU_PATH=scalar forces the reference; =avx2 asks for AVX2, which is taken only where it
 * runs; any other value is ignored. */
PRISM_HIDDEN const prism_cpu_path *prism_cpu_best(void);

/* The drivers: the public *_cpu functions are these with prism_cpu_best() and threads = 0
 * (as many as the input is worth, up to the CPUs online). threads = 1 runs on the caller's
 * thread. Arguments are checked here, once, for every path. */
PRISM_HIDDEN prism_status prism_grad_stats_blocks_with(const prism_cpu_path *path, int threads,
                                          const prism_tensor *tensors, const size_t *block_start,
                                          size_t blocks, prism_grad_stats *out, prism_error *err);
PRISM_HIDDEN prism_status prism_quantize_with(const prism_cpu_path *path, int threads,
                                 const prism_quant_spec *spec, const prism_tensor *x,
                                 uint8_t *codes, float *scales, uint64_t *nonfinite,
                                 prism_error *err);
/* prism_quantize_counted_cpu and prism_quantize_scaled_cpu on a given path and thread count:
 * with given != NULL the caller's scales (checked) and amax out, else the computed scales
 * written to scales. */
PRISM_HIDDEN prism_status prism_quantize_counted_with(const prism_cpu_path *path, int threads,
                                         const prism_quant_spec *spec, const prism_tensor *x,
                                         uint8_t *codes, float *scales,
                                         prism_quant_counts *counts, prism_error *err);
PRISM_HIDDEN prism_status prism_quantize_scaled_with(const prism_cpu_path *path, int threads,
                                        const prism_quant_spec *spec, const prism_tensor *x,
                                        const float *scales, uint8_t *codes, float *amax,
                                        prism_quant_counts *counts, prism_error *err);
PRISM_HIDDEN prism_status prism_dequantize_with(const prism_cpu_path *path, int threads,
                                   const prism_quant_spec *spec, const uint8_t *codes,
                                   const float *scales, size_t numel, void *out,
                                   prism_dtype out_dtype, prism_error *err);
PRISM_HIDDEN prism_status prism_dequantize_accumulate_with(const prism_cpu_path *path, int threads,
                                              const prism_quant_spec *spec, const uint8_t *codes,
                                              const float *scales, size_t numel, float *acc,
                                              prism_error *err);
PRISM_HIDDEN prism_status prism_relative_error_with(const prism_cpu_path *path, int threads,
                                       const prism_tensor *a, const prism_tensor *b, double *out,
                                       prism_error *err);

#endif
