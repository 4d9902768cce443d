/* The argument checks every backend's entry points share, so that the CPU and CUDA calls refuse
 * the same inputs with the same messages. Internal to kernels/ (hidden in libprism.so);
 * implemented in cpu/formats.c. */
#ifndef PRISM_KERNELS_CHECKS_H
#define PRISM_KERNELS_CHECKS_H

#include "prism/kernels.h"

#ifdef __cplusplus
extern "C" {
#endif

#define PRISM_HIDDEN __attribute__((visibility("hidden")))

/* A tensor descriptor: present, a known dtype, data when it has elements. The message names it
 * as "<what> <index>". */
PRISM_HIDDEN prism_status prism_check_tensor(const prism_tensor *x, const char *what, size_t index,
                                             prism_error *err);

/* The arguments of a grad_stats_blocks call: block_start (blocks + 1 entries, from 0, never
 * decreasing), out, and every tensor; *count gets the number of tensors. */
PRISM_HIDDEN prism_status prism_check_blocks(const prism_tensor *tensors, const size_t *block_start,
                                             size_t blocks, const void *out, size_t *count,
                                             prism_error *err);

/* The arguments of a relative_error call: two tensors of the same numel, and out. */
PRISM_HIDDEN prism_status prism_check_pair(const prism_tensor *a, const prism_tensor *b,
                                           const void *out, prism_error *err);

#ifdef __cplusplus
}
#endif

#endif
