/* The CUDA backend of libprism, seen from C: which devices there are. Built only when the
 * toolkit is found (target prism_cuda); a build without it has no such functions, and the CPU
 * kernels are the whole of libprism.
 *
 * Inside .cu files the header also gives PRISM_CUDA_CHECK, the one place where a failed CUDA
 * runtime call becomes a prism_status and a message. */
#ifndef PRISM_CUDA_H
#define PRISM_CUDA_H

#include "prism/common.h"

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

#ifdef __cplusplus
}
#endif

#ifdef __CUDACC__
#include <cuda_runtime_api.h>

/* Turns a failed runtime call into the caller's error: "file:line: call: message (name)".
 * Also clears the runtime's last-error slot, so the failure is reported once, here. */
prism_status prism_cuda_error(prism_error *err, cudaError_t rc, const char *call,
                              const char *file, int line);

/* Runs a CUDA runtime call; on failure fills the `prism_error *err` in scope and returns its
 * status from the enclosing function. */
#define PRISM_CUDA_CHECK(call)                                                               \
    do {                                                                                     \
        cudaError_t prism_cuda_rc_ = (call);                                                 \
        if (prism_cuda_rc_ != cudaSuccess)                                                   \
            return prism_cuda_error(err, prism_cuda_rc_, #call, __FILE__, __LINE__);         \
    } while (0)
#endif

#endif
