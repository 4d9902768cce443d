/* The CUDA half of the transfer engine (transfer_cuda.h): two streams, the staging buffers
 * and the events that order them, and the transfers in flight.
 *
 * Order of one quantized transfer into staging buffer k, all on the device:
 *   copy stream:     wait stage_free[k]; copy image -> stage[k]; record copied
 *   compute stream:  wait copied (and dst_ready); dequantize stage[k] -> dst;
 *                    record stage_free[k]; record done
 * A BF16 transfer is the copy alone, straight into dst, after the last dequantize queued (the
 * `dequantized` event): otherwise a BF16 block could land in a dst before an older quantized
 * block's dequantize writes over it. The other orders need nothing: copies follow each other on
 * the copy stream, dequantizes on the compute stream, and a dequantize follows its own copy.
 * The host never waits here except where transfer_cuda.h says so (wait, wait_oldest_copy,
 * synchronize, destroy). */
#include "transfer_cuda.h"

#include "prism/cuda.h"

#include <cuda_runtime.h>
#include <stdlib.h>
#include <string.h>

namespace {

/* One transfer in flight. done is the compute stream's event of a quantized transfer, NULL for a
 * BF16 one (whose copy is the whole transfer). copy_seen: copied was found complete, and its
 * slot counted back. */
struct Inflight {
    uint64_t seq;
    cudaEvent_t copied;
    cudaEvent_t done;
    bool copy_seen;
};

/* cudaEventQuery as done / not yet / error. A not-ready answer is cleared from the runtime's
 * last-error slot, so that a later launch check does not report it. */
prism_status event_done(cudaEvent_t e, bool *done, prism_error *err)
{
    cudaError_t rc = cudaEventQuery(e);
    if (rc == cudaErrorNotReady) {
        (void)cudaGetLastError();
        *done = false;
        return PRISM_OK;
    }
    PRISM_CUDA_CHECK(rc);
    *done = true;
    return PRISM_OK;
}

} /* namespace */

struct transfer_cuda {
    int device;
    cudaStream_t copy, compute;
    unsigned staging;
    unsigned next; /* the staging buffer the next quantized transfer uses */
    uint8_t *stage[PRISM_TRANSFER_MAX_STAGING];
    cudaEvent_t stage_free[PRISM_TRANSFER_MAX_STAGING];
    cudaEvent_t dst_ready;   /* recorded on the caller's dst_stream, waited for at once */
    cudaEvent_t dequantized; /* after the last dequantize queued */
    Inflight *inflight; /* in issue order */
    size_t n_inflight, cap_inflight;
    cudaEvent_t *pool; /* events free for reuse */
    size_t n_pool, cap_pool;
};

static prism_status take_event(transfer_cuda *cu, cudaEvent_t *out, prism_error *err)
{
    if (cu->n_pool) {
        *out = cu->pool[--cu->n_pool];
        return PRISM_OK;
    }
    PRISM_CUDA_CHECK(cudaEventCreateWithFlags(out, cudaEventDisableTiming));
    return PRISM_OK;
}

static void give_event(transfer_cuda *cu, cudaEvent_t e)
{
    if (!e)
        return;
    if (cu->n_pool == cu->cap_pool) {
        size_t cap = cu->cap_pool ? 2 * cu->cap_pool : 16;
        cudaEvent_t *grown = static_cast<cudaEvent_t *>(realloc(cu->pool, cap * sizeof *grown));
        if (!grown) {
            cudaEventDestroy(e);
            return;
        }
        cu->pool = grown;
        cu->cap_pool = cap;
    }
    cu->pool[cu->n_pool++] = e;
}

extern "C" prism_status transfer_cuda_create(int device, unsigned staging, size_t staging_bytes,
                                             transfer_cuda **out, prism_error *err)
{
    *out = NULL;
    int count = 0;
    prism_status st = prism_cuda_device_count(&count, err);
    if (st != PRISM_OK)
        return st;
    if (device < 0 || device >= count)
        return prism_error_set(err, PRISM_ERR_INVALID, "device: %d is not a CUDA device (0 to %d)",
                               device, count - 1);
    prism_cuda_device_scope scope;
    st = scope.enter(device, err);
    if (st != PRISM_OK)
        return st;
    transfer_cuda *cu = static_cast<transfer_cuda *>(calloc(1, sizeof *cu));
    if (!cu)
        return prism_error_set(err, PRISM_ERR_NOMEM, "transfer: out of memory");
    cu->device = device;
    cu->staging = staging;
    *out = cu; /* from here on, a failure is cleaned up by transfer_cuda_destroy */
    do {
        cudaError_t rc = cudaSuccess;
        const char *call = NULL;
        if ((rc = cudaStreamCreateWithFlags(&cu->copy, cudaStreamNonBlocking)) != cudaSuccess)
            call = "cudaStreamCreateWithFlags(copy)";
        else if ((rc = cudaStreamCreateWithFlags(&cu->compute, cudaStreamNonBlocking)) != cudaSuccess)
            call = "cudaStreamCreateWithFlags(compute)";
        else if ((rc = cudaEventCreateWithFlags(&cu->dst_ready, cudaEventDisableTiming)) != cudaSuccess)
            call = "cudaEventCreateWithFlags(dst_ready)";
        else if ((rc = cudaEventCreateWithFlags(&cu->dequantized, cudaEventDisableTiming)) != cudaSuccess)
            call = "cudaEventCreateWithFlags(dequantized)";
        for (unsigned k = 0; !call && k < staging; k++) {
            if ((rc = cudaMalloc(reinterpret_cast<void **>(&cu->stage[k]), staging_bytes)) != cudaSuccess)
                call = "cudaMalloc(staging)";
            else if ((rc = cudaEventCreateWithFlags(&cu->stage_free[k], cudaEventDisableTiming)) !=
                     cudaSuccess)
                call = "cudaEventCreateWithFlags(stage_free)";
        }
        if (!call)
            return PRISM_OK;
        st = prism_cuda_error(err, rc, call, __FILE__, __LINE__);
    } while (0);
    transfer_cuda_destroy(cu);
    *out = NULL;
    return st;
}

extern "C" void transfer_cuda_destroy(transfer_cuda *cu)
{
    if (!cu)
        return;
    prism_cuda_device_scope scope;
    scope.enter(cu->device, NULL);
    if (cu->copy)
        cudaStreamSynchronize(cu->copy);
    if (cu->compute)
        cudaStreamSynchronize(cu->compute);
    for (size_t i = 0; i < cu->n_inflight; i++) {
        cudaEventDestroy(cu->inflight[i].copied);
        if (cu->inflight[i].done)
            cudaEventDestroy(cu->inflight[i].done);
    }
    for (size_t i = 0; i < cu->n_pool; i++)
        cudaEventDestroy(cu->pool[i]);
    for (unsigned k = 0; k < cu->staging; k++) {
        if (cu->stage[k])
            cudaFree(cu->stage[k]);
        if (cu->stage_free[k])
            cudaEventDestroy(cu->stage_free[k]);
    }
    if (cu->dst_ready)
        cudaEventDestroy(cu->dst_ready);
    if (cu->dequantized)
        cudaEventDestroy(cu->dequantized);
    if (cu->copy)
        cudaStreamDestroy(cu->copy);
    if (cu->compute)
        cudaStreamDestroy(cu->compute);
    free(cu->inflight);
    free(cu->pool);
    free(cu);
}

extern "C" prism_status transfer_cuda_host_alloc(transfer_cuda *cu, size_t bytes, void **out,
                                                 prism_error *err)
{
    prism_cuda_device_scope scope;
    prism_status st = scope.enter(cu->device, err);
    if (st != PRISM_OK)
        return st;
    PRISM_CUDA_CHECK(cudaHostAlloc(out, bytes ? bytes : 1, cudaHostAllocDefault));
    return PRISM_OK;
}

extern "C" void transfer_cuda_host_free(transfer_cuda *cu, void *p)
{
    prism_cuda_device_scope scope;
    scope.enter(cu->device, NULL);
    cudaFreeHost(p);
}

/* Queues the work of one transfer; the events it records are copied and done. */
static prism_status queue_transfer(transfer_cuda *cu, const transfer_cuda_job *job, cudaEvent_t copied,
                                   cudaEvent_t done, prism_error *err)
{
    cudaStream_t user = reinterpret_cast<cudaStream_t>(job->dst_stream);
    if (user)
        PRISM_CUDA_CHECK(cudaEventRecord(cu->dst_ready, user));
    if (!job->spec) {
        PRISM_CUDA_CHECK(cudaStreamWaitEvent(cu->copy, cu->dequantized, 0));
        if (user)
            PRISM_CUDA_CHECK(cudaStreamWaitEvent(cu->copy, cu->dst_ready, 0));
        PRISM_CUDA_CHECK(cudaMemcpyAsync(job->dst, job->src, job->bytes, cudaMemcpyHostToDevice, cu->copy));
        PRISM_CUDA_CHECK(cudaEventRecord(copied, cu->copy));
        return PRISM_OK;
    }
    unsigned k = cu->next;
    cu->next = (k + 1) % cu->staging;
    uint8_t *stage = cu->stage[k];
    PRISM_CUDA_CHECK(cudaStreamWaitEvent(cu->copy, cu->stage_free[k], 0));
    PRISM_CUDA_CHECK(cudaMemcpyAsync(stage, job->src, job->bytes, cudaMemcpyHostToDevice, cu->copy));
    PRISM_CUDA_CHECK(cudaEventRecord(copied, cu->copy));
    PRISM_CUDA_CHECK(cudaStreamWaitEvent(cu->compute, copied, 0));
    if (user)
        PRISM_CUDA_CHECK(cudaStreamWaitEvent(cu->compute, cu->dst_ready, 0));
    prism_status st = prism_dequantize_cuda(job->spec, stage,
                                            reinterpret_cast<const float *>(stage + job->scales_offset),
                                            job->numel, job->dst, PRISM_DTYPE_BF16,
                                            reinterpret_cast<prism_cuda_stream>(cu->compute), err);
    if (st != PRISM_OK)
        return st;
    PRISM_CUDA_CHECK(cudaEventRecord(cu->stage_free[k], cu->compute));
    PRISM_CUDA_CHECK(cudaEventRecord(cu->dequantized, cu->compute));
    PRISM_CUDA_CHECK(cudaEventRecord(done, cu->compute));
    return PRISM_OK;
}

extern "C" prism_status transfer_cuda_issue(transfer_cuda *cu, const transfer_cuda_job *job,
                                            prism_error *err)
{
    prism_cuda_device_scope scope;
    prism_status st = scope.enter(cu->device, err);
    if (st != PRISM_OK)
        return st;
    if (cu->n_inflight == cu->cap_inflight) {
        size_t cap = cu->cap_inflight ? 2 * cu->cap_inflight : 16;
        Inflight *grown = static_cast<Inflight *>(realloc(cu->inflight, cap * sizeof *grown));
        if (!grown)
            return prism_error_set(err, PRISM_ERR_NOMEM, "transfer: out of memory");
        cu->inflight = grown;
        cu->cap_inflight = cap;
    }
    cudaEvent_t copied = NULL, done = NULL;
    st = take_event(cu, &copied, err);
    if (st == PRISM_OK && job->spec)
        st = take_event(cu, &done, err);
    if (st == PRISM_OK)
        st = queue_transfer(cu, job, copied, done, err);
    if (st != PRISM_OK) {
        /* Part of it may be queued: let the copy finish reading host memory before the caller
         * reuses it, since this transfer will not be tracked. */
        cudaStreamSynchronize(cu->copy);
        (void)cudaGetLastError();
        give_event(cu, copied);
        give_event(cu, done);
        return st;
    }
    cu->inflight[cu->n_inflight++] = Inflight{job->seq, copied, done, false};
    return PRISM_OK;
}

extern "C" prism_status transfer_cuda_poll(transfer_cuda *cu, unsigned *copies_done, prism_error *err)
{
    *copies_done = 0;
    prism_cuda_device_scope scope;
    prism_status st = scope.enter(cu->device, err);
    size_t kept = 0;
    for (size_t i = 0; i < cu->n_inflight; i++) {
        Inflight f = cu->inflight[i];
        bool finished = false;
        if (st == PRISM_OK && !f.copy_seen) {
            bool c = false;
            st = event_done(f.copied, &c, err);
            if (c) {
                f.copy_seen = true;
                (*copies_done)++;
            }
        }
        if (st == PRISM_OK && f.copy_seen) {
            finished = true;
            if (f.done)
                st = event_done(f.done, &finished, err);
        }
        if (finished) {
            give_event(cu, f.copied);
            give_event(cu, f.done);
        } else {
            cu->inflight[kept++] = f;
        }
    }
    cu->n_inflight = kept;
    return st;
}

extern "C" prism_status transfer_cuda_wait_oldest_copy(transfer_cuda *cu, bool *waited, prism_error *err)
{
    *waited = false;
    prism_cuda_device_scope scope;
    prism_status st = scope.enter(cu->device, err);
    if (st != PRISM_OK)
        return st;
    for (size_t i = 0; i < cu->n_inflight; i++) {
        if (cu->inflight[i].copy_seen)
            continue;
        PRISM_CUDA_CHECK(cudaEventSynchronize(cu->inflight[i].copied));
        *waited = true;
        break;
    }
    return PRISM_OK;
}

static Inflight *find(transfer_cuda *cu, uint64_t seq)
{
    for (size_t i = 0; i < cu->n_inflight; i++)
        if (cu->inflight[i].seq == seq)
            return &cu->inflight[i];
    return NULL;
}

extern "C" prism_status transfer_cuda_query(transfer_cuda *cu, uint64_t seq, bool *done, prism_error *err)
{
    *done = true;
    Inflight *f = find(cu, seq);
    if (!f)
        return PRISM_OK;
    prism_cuda_device_scope scope;
    prism_status st = scope.enter(cu->device, err);
    if (st != PRISM_OK)
        return st;
    return event_done(f->done ? f->done : f->copied, done, err);
}

extern "C" prism_status transfer_cuda_wait(transfer_cuda *cu, uint64_t seq, bool copy_only, prism_error *err)
{
    Inflight *f = find(cu, seq);
    if (!f)
        return PRISM_OK;
    prism_cuda_device_scope scope;
    prism_status st = scope.enter(cu->device, err);
    if (st != PRISM_OK)
        return st;
    PRISM_CUDA_CHECK(cudaEventSynchronize(copy_only || !f->done ? f->copied : f->done));
    return PRISM_OK;
}

extern "C" prism_status transfer_cuda_wait_stream(transfer_cuda *cu, uint64_t seq, prism_cuda_stream stream,
                                                  prism_error *err)
{
    Inflight *f = find(cu, seq);
    if (!f)
        return PRISM_OK;
    prism_cuda_device_scope scope;
    prism_status st = scope.enter(cu->device, err);
    if (st != PRISM_OK)
        return st;
    PRISM_CUDA_CHECK(cudaStreamWaitEvent(reinterpret_cast<cudaStream_t>(stream), f->done ? f->done : f->copied, 0));
    return PRISM_OK;
}

extern "C" prism_status transfer_cuda_synchronize(transfer_cuda *cu, prism_error *err)
{
    prism_cuda_device_scope scope;
    prism_status st = scope.enter(cu->device, err);
    if (st != PRISM_OK)
        return st;
    PRISM_CUDA_CHECK(cudaStreamSynchronize(cu->copy));
    PRISM_CUDA_CHECK(cudaStreamSynchronize(cu->compute));
    return PRISM_OK;
}
