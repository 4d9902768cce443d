/* What the device emulation (cudaemu/README.md) offers beyond the CUDA API: hooks for tests that
 * need the emulated device to be slow or that check what it reported. C, so that the C tests can
 * call it; present only in an emulated build (PRISM_CUDAEMU is defined there), never in what
 * users install. */
#ifndef PRISM_CUDAEMU_H
#define PRISM_CUDAEMU_H

#include <cuda_runtime_api.h>
#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Holds a stream (NULL: the current device's legacy default stream): work already running
 * finishes, and nothing queued on it starts until prism_cudaemu_stream_release. Its events
 * answer cudaErrorNotReady meanwhile, which is how a test makes the "GPU not there yet" paths
 * run. Holds nest (each hold needs its release). cudaErrorInvalidResourceHandle for a stream
 * that does not exist. */
cudaError_t prism_cudaemu_stream_hold(cudaStream_t stream);
cudaError_t prism_cudaemu_stream_release(cudaStream_t stream);

/* The report of the last kernel fault on `device` ("" when none since the start or the last
 * cudaDeviceReset): the kernel, its launch site, the block and thread, and what went wrong with
 * file:line, e.g. "kernel finish (x.cu:12), block (0,0,0) thread (31,0,0): __syncthreads at
 * x.cu:40: thread (7,0,0) exited before reaching it". Valid until the next fault or reset. */
const char *prism_cudaemu_last_fault(int device);

/* Kernel faults reported since the process started, on any device. */
unsigned long long prism_cudaemu_fault_count(void);

/* Bytes of device memory allocated and not freed on `device` (cudaMalloc, cudaMallocAsync). */
size_t prism_cudaemu_device_bytes_in_use(int device);

#ifdef __cplusplus
}
#endif

#endif
