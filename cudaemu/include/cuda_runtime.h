/* The device emulation's cuda_runtime.h (cudaemu/README.md). It stands in front of the toolkit's:
 * the host API, types and vector helpers are the toolkit's own (cuda_runtime_api.h and friends,
 * which compile with g++ and are implemented by libprism_cudaemu.so), and what nvcc alone gives
 * a .cu file (kernels, threadIdx, __syncthreads, warp intrinsics, atomics, the launch) comes
 * from prism_cudaemu/device.h. Found first because cudaemu/include is ahead of the toolkit on the
 * include path of an emulated build; a build with nvcc never sees this folder. */
#ifndef PRISM_CUDAEMU_CUDA_RUNTIME_H
#define PRISM_CUDAEMU_CUDA_RUNTIME_H

#include_next <cuda_runtime.h>

#ifdef __cplusplus /* C files that include it call the runtime only */
#include "prism_cudaemu/device.h"
#endif

#endif
