/* prism_client_report_step_cuda (include/prism/cuda.h): a step report whose statistics the GPU
 * computes where the gradients are, sent without the host ever waiting for the GPU.
 *
 * The call queues three things on the caller's stream: the statistics kernel
 * (prism_grad_stats_blocks_cuda) into device memory the client owns, a copy of the results into
 * its pinned host memory, and an event. The report itself is sent by the first client call that
 * finds the event complete (cudaEventQuery: a look, never a wait): begin_step, a report, or
 * this call. One report is in flight at a time: a GPU more than a step behind the host drops the
 * newer report, counted (reason stats_pending), rather than making anyone wait; a statistics pass
 * that cannot be queued (the current device unknown included) or fails on the GPU drops its report
 * too (stats_failed), and so does a first call with no memory for the client's state (no_memory):
 * every report this call does not queue is counted. Buffers are allocated at the first call
 * (and again if a later call has more blocks or runs on another device); prism_client_close waits
 * for a report still in flight before it frees them, the one wait there is, outside any step. */
#define _GNU_SOURCE
#define PRISM_CUDA_RUNTIME_API
#include "client_ext.h"
#include "prism/cuda.h"

#include <cuda_runtime_api.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct cuda_reports {
    prism_grad_stats *dev;  /* cap entries, device memory */
    prism_grad_stats *host; /* cap entries, pinned */
    uint32_t *ids;          /* the report's block ids */
    prism_block_fractions *frac; /* cap entries: the report's fractions when has_frac */
    bool has_frac;
    size_t cap, n;
    int device;             /* where dev lives */
    cudaEvent_t done;
    bool busy;              /* a report is in flight */
    uint64_t step;
    bool has_loss;
    double loss;
} cuda_reports;

static void release(cuda_reports *r)
{
    if (r->busy)
        cudaEventSynchronize(r->done);
    int current = 0;
    bool switched = r->dev && cudaGetDevice(&current) == cudaSuccess && current != r->device &&
                    cudaSetDevice(r->device) == cudaSuccess;
    if (r->dev)
        cudaFree(r->dev);
    if (r->host)
        cudaFreeHost(r->host);
    if (r->done)
        cudaEventDestroy(r->done);
    if (switched)
        cudaSetDevice(current);
    free(r->ids);
    free(r->frac);
    memset(r, 0, sizeof *r);
}

static void destroy(void *state)
{
    cuda_reports *r = state;
    release(r);
    free(r);
}

/* Sends the report in flight once its copy is done. */
static void poll(prism_client *c, void *state)
{
    cuda_reports *r = state;
    if (!r->busy)
        return;
    cudaError_t rc = cudaEventQuery(r->done);
    if (rc == cudaErrorNotReady)
        return;
    r->busy = false;
    if (rc != cudaSuccess) {
        char why[160];
        snprintf(why, sizeof why, "step %llu dropped: the GPU statistics failed: %s",
                 (unsigned long long)r->step, cudaGetErrorString(rc));
        cudaGetLastError(); /* reported here, once */
        prism_client_note_dropped(c, PRISM_HINTS_DROP_STATS_FAILED, why);
        return;
    }
    prism_error err;
    /* Counted by the report itself when it cannot go out. */
    prism_client_report_step_ex(c, r->step, r->has_loss ? &r->loss : NULL, r->ids, r->host,
                                r->has_frac ? r->frac : NULL, r->n, &err);
}

static prism_status reserve(cuda_reports *r, size_t blocks, int device, prism_error *err)
{
    if (r->dev && r->cap >= blocks && r->device == device)
        return PRISM_OK;
    release(r);
    size_t cap = blocks < 64 ? 64 : blocks;
    r->device = device;
    PRISM_CUDA_CHECK(cudaMalloc((void **)&r->dev, cap * sizeof *r->dev));
    PRISM_CUDA_CHECK(cudaMallocHost((void **)&r->host, cap * sizeof *r->host));
    PRISM_CUDA_CHECK(cudaEventCreateWithFlags(&r->done, cudaEventDisableTiming));
    if (!(r->ids = malloc(cap * sizeof *r->ids)) || !(r->frac = malloc(cap * sizeof *r->frac)))
        return prism_error_set(err, PRISM_ERR_NOMEM, "out of memory for %zu block ids and fractions", cap);
    r->cap = cap;
    return PRISM_OK;
}

prism_status prism_client_report_step_cuda(prism_client *c, uint64_t step, const double *loss,
                                           const prism_tensor *tensors, const size_t *block_start,
                                           const uint32_t *block_ids, size_t blocks, prism_cuda_stream stream,
                                           prism_error *err)
{
    return prism_client_report_step_cuda_ex(c, step, loss, tensors, block_start, block_ids, NULL, blocks, stream,
                                            err);
}

prism_status prism_client_report_step_cuda_ex(prism_client *c, uint64_t step, const double *loss,
                                              const prism_tensor *tensors, const size_t *block_start,
                                              const uint32_t *block_ids, const prism_block_fractions *fractions,
                                              size_t blocks, prism_cuda_stream stream, prism_error *err)
{
    prism_error own; /* err may be NULL; the drops below keep its message for last_error */
    if (!err)
        err = &own;
    prism_status s = prism_client_check_report(c, block_ids, blocks, err);
    if (s == PRISM_OK)
        s = prism_client_check_fractions(c, fractions, block_ids, blocks, err);
    if (s != PRISM_OK)
        return s;
    if (!block_start)
        return prism_error_set(err, PRISM_ERR_INVALID, "block_start: NULL");
    prism_client_ext *ext = prism_client_extension(c);
    if (!ext->state) {
        if (!(ext->state = calloc(1, sizeof(cuda_reports)))) {
            char why[96];
            snprintf(why, sizeof why, "step %llu dropped: out of memory for the GPU reports' state",
                     (unsigned long long)step);
            prism_client_note_dropped(c, PRISM_HINTS_DROP_NO_MEMORY, why);
            return prism_error_set(err, PRISM_ERR_NOMEM, "%s", why);
        }
        ext->poll = poll;
        ext->destroy = destroy;
    }
    cuda_reports *r = ext->state;
    if (r->busy) {
        char why[128];
        snprintf(why, sizeof why, "step %llu dropped: the GPU has not finished the statistics of step %llu",
                 (unsigned long long)step, (unsigned long long)r->step);
        prism_client_note_dropped(c, PRISM_HINTS_DROP_STATS_PENDING, why);
        return prism_error_set(err, PRISM_ERR_UNAVAILABLE, "%s", why);
    }
    int device = 0;
    cudaError_t rc = cudaGetDevice(&device);
    if (rc != cudaSuccess) {
        s = prism_cuda_error(err, rc, "cudaGetDevice(&device)", __FILE__, __LINE__);
        prism_client_note_dropped(c, PRISM_HINTS_DROP_STATS_FAILED, err->message);
        return s;
    }
    if ((s = reserve(r, blocks, device, err)) != PRISM_OK) {
        release(r);
        prism_client_note_dropped(c, PRISM_HINTS_DROP_STATS_FAILED, err->message);
        return s;
    }
    if ((s = prism_grad_stats_blocks_cuda(tensors, block_start, blocks, r->dev, stream, err)) != PRISM_OK) {
        prism_client_note_dropped(c, PRISM_HINTS_DROP_STATS_FAILED, err->message);
        return s;
    }
    rc = cudaMemcpyAsync(r->host, r->dev, blocks * sizeof *r->dev, cudaMemcpyDeviceToHost,
                                     (cudaStream_t)stream);
    if (rc == cudaSuccess)
        rc = cudaEventRecord(r->done, (cudaStream_t)stream);
    if (rc != cudaSuccess) {
        s = prism_cuda_error(err, rc, "queueing the statistics' copy", __FILE__, __LINE__);
        prism_client_note_dropped(c, PRISM_HINTS_DROP_STATS_FAILED, err->message);
        return s;
    }
    for (size_t b = 0; b < blocks; b++)
        r->ids[b] = block_ids ? block_ids[b] : (uint32_t)b;
    r->has_frac = fractions != NULL;
    if (fractions)
        memcpy(r->frac, fractions, blocks * sizeof *r->frac);
    r->n = blocks;
    r->step = step;
    r->has_loss = loss != NULL;
    r->loss = loss ? *loss : 0.0;
    r->busy = true;
    return PRISM_OK;
}
