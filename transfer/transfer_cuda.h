/* The CUDA half of the transfer engine (transfer_cuda.cu), seen from transfer.c:
 * streams, staging buffers, pinned memory and the events behind tickets. transfer.c keeps the
 * blocks, their images, the counters and the Conductor's slots; it calls in here only in a build
 * with CUDA (PRISM_TRANSFER_HAVE_CUDA). Internal: no prism_ prefix, so nothing here is exported from
 * libprism.so. */
#ifndef PRISM_TRANSFER_TRANSFER_CUDA_H
#define PRISM_TRANSFER_TRANSFER_CUDA_H

#include "prism/transfer.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct transfer_cuda transfer_cuda;

/* Streams, events and `staging` device buffers of staging_bytes each on `device`. */
prism_status transfer_cuda_create(int device, unsigned staging, size_t staging_bytes,
                                  transfer_cuda **out, prism_error *err);

/* Waits for all work, then frees everything (pinned blocks are the caller's to free first). */
void transfer_cuda_destroy(transfer_cuda *cu);

/* Pinned host memory (cudaHostAlloc), and its free. */
prism_status transfer_cuda_host_alloc(transfer_cuda *cu, size_t bytes, void **out, prism_error *err);
void transfer_cuda_host_free(transfer_cuda *cu, void *p);

/* One transfer: `bytes` of pinned src to the device, into dst (spec NULL: BF16) or through a
 * staging buffer and prism_dequantize_cuda into dst (numel BF16 elements; the image's scales at
 * scales_offset). Remembered as in flight under seq until its events say it has finished. */
typedef struct transfer_cuda_job {
    uint64_t seq;
    const void *src;
    size_t bytes;
    void *dst;
    prism_cuda_stream dst_stream;
    const prism_quant_spec *spec;
    size_t numel;
    size_t scales_offset;
} transfer_cuda_job;

prism_status transfer_cuda_issue(transfer_cuda *cu, const transfer_cuda_job *job, prism_error *err);

/* Looks at the events of what is in flight (never waits): *copies_done gets the number of
 * transfers whose copy has finished since the last call (each held a slot), and transfers that
 * have finished altogether are forgotten. */
prism_status transfer_cuda_poll(transfer_cuda *cu, unsigned *copies_done, prism_error *err);

/* Waits (host) for the oldest copy that has not been seen finished; *waited false when there is
 * none. Poll afterwards to count it. */
prism_status transfer_cuda_wait_oldest_copy(transfer_cuda *cu, bool *waited, prism_error *err);

/* A transfer not in flight any more (or never: seq 0) is done. copy_only: only its copy (the
 * host memory it reads is free again). */
prism_status transfer_cuda_query(transfer_cuda *cu, uint64_t seq, bool *done, prism_error *err);
prism_status transfer_cuda_wait(transfer_cuda *cu, uint64_t seq, bool copy_only, prism_error *err);
prism_status transfer_cuda_wait_stream(transfer_cuda *cu, uint64_t seq, prism_cuda_stream stream,
                                       prism_error *err);

/* Waits for both streams; everything in flight is done after the next poll. */
prism_status transfer_cuda_synchronize(transfer_cuda *cu, prism_error *err);

#ifdef __cplusplus
}
#endif

#endif
