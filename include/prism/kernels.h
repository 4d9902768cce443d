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

/* Block gradient statistics on the CPU, one pass over every tensor: sums of squares and the
 * maximum in double; mean and variance by Welford's update within a tensor and Chan's merge
 * across tensors, never as E[x^2] - E[x]^2. count may be 0 (all figures 0). A tensor with
 * numel > 0 and no data, or an unknown dtype, is PRISM_ERR_INVALID naming the tensor. */
prism_status prism_grad_stats_cpu(const prism_tensor *tensors, size_t count, prism_grad_stats *out,
                                  prism_error *err);

#ifdef __cplusplus
}
#endif

#endif
