/* The NCCL backend of the quantized collectives (prism/collectives.h): tensors and outputs in
 * device memory, the element work with the CUDA kernels (cuda.h) and the transport with NCCL, all
 * queued on one CUDA stream. Built only with the CUDA toolkit and NCCL (target prism_coll_nccl).
 *
 * On the stream, per call: quantize (one launch per run of a tensor's rows in one slice), the
 * 80-byte headers (ncclAllGather), the all-to-all (ncclGroupStart, ncclSend/ncclRecv for every
 * peer, self included, ncclGroupEnd), the FP32 accumulation in rank order, saturation and AVG,
 * requantization, ncclAllGather in place, dequantization into the tensors.
 *
 * The host waits once per call: after the header all-gather it reads the headers back
 * (cudaMemcpyAsync to pinned memory, cudaStreamSynchronize), so that a mismatch between ranks is
 * PRISM_ERR_INVALID everywhere instead of an NCCL hang, and so that prism_coll_stats (the job's
 * NaN/Inf count included) is complete when the call returns. That wait also waits for the work
 * queued on the stream before the call. Everything after it is queued and the call returns
 * without waiting: the tensors (or out) hold the result once the stream has run that far.
 * Scratch is cudaMallocAsync'd on the stream and grown when a call needs more. */
#ifndef PRISM_COLLECTIVES_NCCL_H
#define PRISM_COLLECTIVES_NCCL_H

#include <nccl.h>

#include "prism/collectives.h"
#include "prism/cuda.h"

#ifdef __cplusplus
extern "C" {
#endif

/* A communicator over an NCCL communicator the caller made (ncclCommInitRank, ncclCommInitAll)
 * and keeps: it is borrowed, never destroyed here, and must outlive the prism communicator; it
 * must be a blocking one (the default config). Work runs on the comm's device and on `stream`
 * (NULL: the legacy default stream), which must outlive the communicator (destroy waits for it
 * and frees the scratch on it). No collective call is made. PRISM_ERR_INVALID names comm
 * when it is NULL; NCCL and CUDA failures are PRISM_ERR_IO / the CUDA error's status. */
prism_status prism_coll_comm_from_nccl(ncclComm_t comm, prism_cuda_stream stream, prism_coll_comm **out,
                                       prism_error *err);

/* Later calls run on `stream`. The new stream first waits (an event, not the host) for the work
 * queued on the old one, so the scratch buffers are never used by two streams at once.
 * PRISM_ERR_INVALID when c is not an NCCL communicator. */
prism_status prism_coll_nccl_set_stream(prism_coll_comm *c, prism_cuda_stream stream, prism_error *err);

#ifdef __cplusplus
}
#endif

#endif
