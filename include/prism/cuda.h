/* The CUDA backend of libprism, seen from C: which devices there are, and the kernels of
 * include/prism/kernels.h on the GPU. Built only when the toolkit is found (target prism_cuda); a
 * build without it has no such functions, and the CPU kernels are the whole of libprism.
 *
 * Inside .cu files the header also gives PRISM_CUDA_CHECK, the one place where a failed CUDA
 * runtime call becomes a prism_status and a message. */
#ifndef PRISM_CUDA_H
#define PRISM_CUDA_H

#include "prism/common.h"
#include "prism/client.h"
#include "prism/kernels.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Number of CUDA devices this process can use. No driver, a driver older than the runtime, or
 * no device: PRISM_ERR_UNAVAILABLE with the CUDA runtime's message, and *count = 0. */
prism_status prism_cuda_device_count(int *count, prism_error *err);

/* The marketing name of device `device` ("NVIDIA H100 80GB HBM3"), NUL-terminated and cut to
 * fit len bytes. A device index out of range: PRISM_ERR_INVALID; no driver or device:
 * PRISM_ERR_UNAVAILABLE. */
prism_status prism_cuda_device_name(int device, char *buf, size_t len, prism_error *err);

/* ---------------------------------------------------------------------------------------------
 * Kernels (DESIGN 8). Each one is its *_cpu counterpart of kernels.h on the current device: the
 * same arguments, checks and messages (PRISM_ERR_INVALID naming the field at fault, before any
 * GPU work), and the same results:
 *   quantize, dequantize, dequantize_accumulate  bit-identical codes, scales and outputs, for
 *                                                both roundings (Philox is counted per element)
 *   grad_stats_blocks, relative_error            sums in double in another (fixed) order: a
 *                                                few units of double rounding from the CPU's
 *                                                (tests/unit/test_kernels_cuda.c allows 1e-9 and
 *                                                1e-12 relative); numel, nonfinite and max_abs
 *                                                exact
 * A NaN that dequantize produces (FP8 NaN codes, which quantize never writes, or an Inf times a
 * zero scale) is a NaN on both backends, with the GPU's canonical bits rather than the CPU's.
 * Pointers to elements, codes, scales and results are device (or managed) memory; descriptor
 * arrays (the tensor list, block_start, the prism_tensor and spec structs) are host memory, read
 * before the call returns. The work is queued on `stream` (NULL: the legacy default stream) and
 * the call returns without waiting for it: results are there once the stream has run that far
 * (cudaStreamSynchronize, an event). Scratch memory comes from cudaMallocAsync on the same stream.
 * A failed launch or runtime call is reported through PRISM_CUDA_CHECK's message; an error the
 * GPU meets while running shows at the caller's next synchronisation, as for any CUDA work.
 * ------------------------------------------------------------------------------------------- */

/* cudaStream_t without the CUDA headers: the runtime's own typedef of the same struct. */
typedef struct CUstream_st *prism_cuda_stream;

/* prism_grad_stats_blocks_cpu on the GPU: tensors[t].data are device pointers, the tensors and
 * block_start arrays are host memory, out (blocks entries) is device memory. All tensors are read
 * in one pass (one launch per 512 tensors that hold elements, then one per 1,024 blocks). */
prism_status prism_grad_stats_blocks_cuda(const prism_tensor *tensors, const size_t *block_start,
                                          size_t blocks, prism_grad_stats *out,
                                          prism_cuda_stream stream, prism_error *err);

/* prism_quantize_cpu on the GPU: x->data, codes, scales device memory; *nonfinite (device, may be
 * NULL) is set to the NaN/Inf count (not added to). */
prism_status prism_quantize_cuda(const prism_quant_spec *spec, const prism_tensor *x, uint8_t *codes,
                                 float *scales, unsigned long long *nonfinite,
                                 prism_cuda_stream stream, prism_error *err);

/* prism_quantize_counted_cpu on the GPU: x->data, codes, scales and *counts device memory (counts
 * may be NULL; set, not added to). The same codes and scales as prism_quantize_cuda; counting
 * takes a second pass over the input. */
prism_status prism_quantize_counted_cuda(const prism_quant_spec *spec, const prism_tensor *x,
                                         uint8_t *codes, float *scales, prism_quant_counts *counts,
                                         prism_cuda_stream stream, prism_error *err);

/* prism_quantize_scaled_cpu on the GPU: x->data, scales, codes, amax (may be NULL) and *counts
 * (may be NULL; set, not added to) device memory; one pass over the input. The same checks and
 * messages as the CPU's, except for the given scales, which the host never reads (the call does
 * not wait for the stream, and may be captured into a graph): a group whose scale is not finite
 * and > 0 gets code 0 for every element, its elements in neither saturated nor underflowed, and
 * is counted in counts->bad_scale, where the CPU refuses the call. */
prism_status prism_quantize_scaled_cuda(const prism_quant_spec *spec, const prism_tensor *x,
                                        const float *scales, uint8_t *codes, float *amax,
                                        prism_quant_counts *counts, prism_cuda_stream stream,
                                        prism_error *err);

/* prism_dequantize_cpu on the GPU: codes, scales and out device memory. */
prism_status prism_dequantize_cuda(const prism_quant_spec *spec, const uint8_t *codes,
                                   const float *scales, size_t numel, void *out,
                                   prism_dtype out_dtype, prism_cuda_stream stream,
                                   prism_error *err);

/* prism_dequantize_accumulate_cpu on the GPU: acc[i] = acc[i] + decode(code i) * scale, two
 * roundings (never a fused multiply-add); codes, scales and acc device memory. */
prism_status prism_dequantize_accumulate_cuda(const prism_quant_spec *spec, const uint8_t *codes,
                                              const float *scales, size_t numel, float *acc,
                                              prism_cuda_stream stream, prism_error *err);

/* prism_relative_error_cpu on the GPU: a->data and b->data device memory, *out (device) gets
 * ||a - b|| / ||a||. */
prism_status prism_relative_error_cuda(const prism_tensor *a, const prism_tensor *b, double *out,
                                       prism_cuda_stream stream, prism_error *err);

/* ---------------------------------------------------------------------------------------------
 * The trainer's client (include/prism/client.h) with gradients on the GPU. */

/* prism_client_report_step_cpu for gradients in device memory, without the host waiting for the
 * GPU: the statistics (prism_grad_stats_blocks_cuda) and a copy of them to pinned host memory
 * are queued on `stream`, and the StepReport goes out from the first later client call
 * (prism_client_begin_step, any report) that finds the copy done: cudaEventQuery, never a wait.
 * One report is in flight at a time; a call that finds the previous one still running on the
 * GPU drops its own (PRISM_ERR_UNAVAILABLE, counted). PRISM_OK: queued. Refused arguments are
 * PRISM_ERR_INVALID / PRISM_ERR_STATE as for the CPU variant. The first call allocates the
 * client's buffers on the current device (cudaMalloc, which may synchronise once). */
prism_status prism_client_report_step_cuda(prism_client *c, uint64_t step, const double *loss,
                                           const prism_tensor *tensors, const size_t *block_start,
                                           const uint32_t *block_ids, size_t blocks, prism_cuda_stream stream,
                                           prism_error *err);

/* prism_client_report_step_cuda with each block's fractions of the step (issue 17): fractions
 * NULL (none) or `blocks` entries in host memory, checked now as prism_client_report_step_ex
 * checks them and copied, so the caller may reuse them at once; they go out with the report. */
prism_status prism_client_report_step_cuda_ex(prism_client *c, uint64_t step, const double *loss,
                                              const prism_tensor *tensors, const size_t *block_start,
                                              const uint32_t *block_ids, const prism_block_fractions *fractions,
                                              size_t blocks, prism_cuda_stream stream, prism_error *err);

#ifdef __cplusplus
}
#endif

/* Inside libprism: .cu files (compiled by nvcc, or by g++ against the device emulation of
 * cudaemu/, which defines PRISM_CUDAEMU), and C files that define PRISM_CUDA_RUNTIME_API (they
 * call the CUDA runtime themselves). */
#if defined(__CUDACC__) || defined(PRISM_CUDAEMU) || defined(PRISM_CUDA_RUNTIME_API)
#include <cuda_runtime_api.h>

#ifdef __cplusplus
extern "C" {
#endif
/* Turns a failed runtime call into the caller's error: "file:line: call: message (name)".
 * Also clears the runtime's last-error slot, so the failure is reported once, here. */
prism_status prism_cuda_error(prism_error *err, cudaError_t rc, const char *call,
                              const char *file, int line);
#ifdef __cplusplus
}
#endif

/* Runs a CUDA runtime call; on failure fills the `prism_error *err` in scope and returns its
 * status from the enclosing function. */
#define PRISM_CUDA_CHECK(call)                                                               \
    do {                                                                                     \
        cudaError_t prism_cuda_rc_ = (call);                                                 \
        if (prism_cuda_rc_ != cudaSuccess)                                                   \
            return prism_cuda_error(err, prism_cuda_rc_, #call, __FILE__, __LINE__);         \
    } while (0)
/* Launches a kernel on a stream: every launch in Prism's .cu files is this macro, so that the one
 * shape of launch they use is written once, and the emulated build (cudaemu/README.md) can run
 * the same sources with g++, which has no <<<>>>. */
#ifdef PRISM_CUDAEMU
#define PRISM_LAUNCH(kernel, grid, block, stream, ...) \
    PRISM_CUDAEMU_LAUNCH(kernel, grid, block, stream, __VA_ARGS__)
#else
#define PRISM_LAUNCH(kernel, grid, block, stream, ...) \
    kernel<<<(grid), (block), 0, (stream)>>>(__VA_ARGS__)
#endif
#ifdef __cplusplus
/* In .cu files: makes a device current for the length of a scope and puts the caller's device
 * back when the scope ends, so a libprism call never leaves the caller on another device.
 *   prism_cuda_device_scope scope; prism_status st = scope.enter(device, err); */
struct prism_cuda_device_scope {
    int prev = -1;
    bool changed = false;
    prism_status enter(int device, prism_error *err)
    {
        cudaError_t rc = cudaGetDevice(&prev);
        if (rc == cudaSuccess && prev != device) {
            rc = cudaSetDevice(device);
            changed = rc == cudaSuccess;
        }
        return rc == cudaSuccess ? PRISM_OK : prism_cuda_error(err, rc, "cudaSetDevice", __FILE__, __LINE__);
    }
    ~prism_cuda_device_scope()
    {
        if (changed)
            cudaSetDevice(prev);
    }
};
#endif
#endif

#endif
