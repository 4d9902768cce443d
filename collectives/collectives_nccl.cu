/* The NCCL backend (include/prism/collectives_nccl.h): device memory, the CUDA kernels of cuda.h
 * for the element work, NCCL for the transport, all on the communicator's stream. The core
 * (collectives.c) decides every byte and every sum; this file only queues the steps it is given.
 * Three small kernels of its own: the scales of empty rows (1.0f), the saturation and AVG of the
 * FP32 sums, and the sum of the quantize calls' NaN/Inf counters into this rank's header. */
#include "collectives_internal.h"

#include "prism/collectives_nccl.h"
#include "prism/cuda.h"

#include <cuda_runtime.h>
#include <float.h>
#include <nccl.h>
#include <stdlib.h>
#include <string.h>

static_assert(sizeof(unsigned long long) == sizeof(uint64_t), "the NaN/Inf counters are 64-bit");

namespace {

constexpr int kThreads = 256;
constexpr unsigned kMaxBlocks = 4096;

struct NcclImpl {
    ncclComm_t comm;  /* borrowed */
    cudaStream_t stream;
    int device;
    int prev_device;  /* the caller's, put back by end() */
    bool switched;
    cudaEvent_t handoff;             /* set_stream: the new stream waits for the old one */
    prism_coll_header *host_headers; /* pinned, size + 1: [0, size) gathered, [size] this rank's */
    prism_coll_header *dev_headers;  /* device, the same shape */
};

NcclImpl *impl_of(prism_coll_comm *c)
{
    return static_cast<NcclImpl *>(c->impl);
}

prism_status nccl_failed(prism_error *err, ncclComm_t comm, ncclResult_t rc, const char *call)
{
    const char *last = comm ? ncclGetLastError(comm) : NULL;
    if (last && *last)
        return prism_error_set(err, PRISM_ERR_IO, "%s: %s (%s)", call, ncclGetErrorString(rc), last);
    return prism_error_set(err, PRISM_ERR_IO, "%s: %s", call, ncclGetErrorString(rc));
}

/* Runs an NCCL call; a failure becomes the caller's PRISM_ERR_IO, naming the call. */
#define NCCL_CHECK(comm, call)                                                                     \
    do {                                                                                           \
        ncclResult_t nccl_rc_ = (call);                                                            \
        if (nccl_rc_ != ncclSuccess)                                                               \
            return nccl_failed(err, (comm), nccl_rc_, #call);                                      \
    } while (0)

unsigned blocks_for(size_t n)
{
    size_t b = (n + kThreads - 1) / kThreads;
    return b == 0 ? 1u : b > kMaxBlocks ? kMaxBlocks : (unsigned)b;
}

__global__ void fill_ones_kernel(float *dst, size_t n)
{
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        dst[i] = 1.0f;
}

/* prism_coll_host_finish_sum on the device: the same comparisons and the same IEEE division. */
__global__ void finish_sum_kernel(float *acc, size_t n, int divisor)
{
    const float d = (float)divisor;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        float v = acc[i];
        if (v > FLT_MAX)
            v = FLT_MAX;
        else if (v < -FLT_MAX)
            v = -FLT_MAX;
        if (divisor > 1)
            v = __fdiv_rn(v, d);
        acc[i] = v;
    }
}

/* One block: header->nonfinite += counters[0 .. slots). */
__global__ void add_counters_kernel(prism_coll_header *header, const unsigned long long *counters, size_t slots)
{
    __shared__ unsigned long long part[kThreads];
    unsigned long long sum = 0;
    for (size_t i = threadIdx.x; i < slots; i += blockDim.x)
        sum += counters[i];
    part[threadIdx.x] = sum;
    __syncthreads();
    for (int half = kThreads / 2; half > 0; half >>= 1) {
        if ((int)threadIdx.x < half)
            part[threadIdx.x] += part[threadIdx.x + half];
        __syncthreads();
    }
    if (threadIdx.x == 0)
        header->nonfinite += part[0];
}

prism_status nccl_begin(prism_coll_comm *c, prism_error *err)
{
    NcclImpl *m = impl_of(c);
    PRISM_CUDA_CHECK(cudaGetDevice(&m->prev_device));
    m->switched = m->prev_device != m->device;
    if (m->switched)
        PRISM_CUDA_CHECK(cudaSetDevice(m->device));
    return PRISM_OK;
}

void nccl_end(prism_coll_comm *c)
{
    NcclImpl *m = impl_of(c);
    if (m->switched)
        cudaSetDevice(m->prev_device);
    m->switched = false;
}

prism_status nccl_alloc(prism_coll_comm *c, void **p, size_t bytes, prism_error *err)
{
    PRISM_CUDA_CHECK(cudaMallocAsync(p, bytes, impl_of(c)->stream));
    return PRISM_OK;
}

void nccl_release(prism_coll_comm *c, void *p)
{
    if (p)
        cudaFreeAsync(p, impl_of(c)->stream);
}

prism_status nccl_quantize(prism_coll_comm *c, const prism_quant_spec *spec, const prism_tensor *x, uint8_t *codes,
                           float *scales, size_t slot, prism_error *err)
{
    unsigned long long *count =
        slot == PRISM_COLL_NO_SLOT ? NULL : reinterpret_cast<unsigned long long *>(c->counters + slot);
    return prism_quantize_cuda(spec, x, codes, scales, count, impl_of(c)->stream, err);
}

prism_status nccl_accumulate(prism_coll_comm *c, const prism_quant_spec *spec, const uint8_t *codes,
                             const float *scales, size_t numel, float *acc, prism_error *err)
{
    return prism_dequantize_accumulate_cuda(spec, codes, scales, numel, acc, impl_of(c)->stream, err);
}

prism_status nccl_dequantize(prism_coll_comm *c, const prism_quant_spec *spec, const uint8_t *codes,
                             const float *scales, size_t numel, void *out, prism_dtype out_dtype, prism_error *err)
{
    return prism_dequantize_cuda(spec, codes, scales, numel, out, out_dtype, impl_of(c)->stream, err);
}

prism_status nccl_zero(prism_coll_comm *c, void *dst, size_t bytes, prism_error *err)
{
    PRISM_CUDA_CHECK(cudaMemsetAsync(dst, 0, bytes, impl_of(c)->stream));
    return PRISM_OK;
}

prism_status nccl_fill_ones(prism_coll_comm *c, float *dst, size_t n, prism_error *err)
{
    if (n == 0)
        return PRISM_OK;
    PRISM_LAUNCH(fill_ones_kernel, blocks_for(n), kThreads, impl_of(c)->stream, dst, n);
    PRISM_CUDA_CHECK(cudaGetLastError());
    return PRISM_OK;
}

prism_status nccl_finish_sum(prism_coll_comm *c, float *acc, size_t n, int divisor, prism_error *err)
{
    if (n == 0)
        return PRISM_OK;
    PRISM_LAUNCH(finish_sum_kernel, blocks_for(n), kThreads, impl_of(c)->stream, acc, n, divisor);
    PRISM_CUDA_CHECK(cudaGetLastError());
    return PRISM_OK;
}

/* The one host wait of a call (collectives_nccl.h): this rank's header up, the counters added
 * into it on the device, the all-gather, the headers down, the stream synchronised. */
prism_status nccl_exchange_headers(prism_coll_comm *c, prism_coll_header *mine, size_t slots,
                                   prism_coll_header *all, prism_error *err)
{
    NcclImpl *m = impl_of(c);
    size_t p = (size_t)c->size;
    m->host_headers[p] = *mine;
    PRISM_CUDA_CHECK(cudaMemcpyAsync(m->dev_headers + p, m->host_headers + p, sizeof *mine, cudaMemcpyHostToDevice,
                                     m->stream));
    if (slots) {
        PRISM_LAUNCH(add_counters_kernel, 1, kThreads, m->stream, m->dev_headers + p,
                     reinterpret_cast<const unsigned long long *>(c->counters), slots);
        PRISM_CUDA_CHECK(cudaGetLastError());
    }
    NCCL_CHECK(m->comm, ncclAllGather(m->dev_headers + p, m->dev_headers, sizeof *mine, ncclUint8, m->comm, m->stream));
    PRISM_CUDA_CHECK(cudaMemcpyAsync(m->host_headers, m->dev_headers, p * sizeof *mine, cudaMemcpyDeviceToHost,
                                     m->stream));
    PRISM_CUDA_CHECK(cudaStreamSynchronize(m->stream));
    ncclResult_t async_rc = ncclSuccess;
    NCCL_CHECK(m->comm, ncclCommGetAsyncError(m->comm, &async_rc));
    if (async_rc != ncclSuccess)
        return nccl_failed(err, m->comm, async_rc, "ncclAllGather (headers)");
    memcpy(all, m->host_headers, p * sizeof *mine);
    *mine = all[c->rank];
    return PRISM_OK;
}

prism_status nccl_alltoall(prism_coll_comm *c, const uint8_t *send, uint8_t *recv, size_t row_bytes, size_t rows,
                           prism_error *err)
{
    NcclImpl *m = impl_of(c);
    size_t slice = row_bytes * rows;
    NCCL_CHECK(m->comm, ncclGroupStart());
    ncclResult_t rc = ncclSuccess;
    const char *call = "";
    for (int k = 0; k < c->size; k++) {
        if ((rc = ncclSend(send + (size_t)k * slice, slice, ncclUint8, k, m->comm, m->stream)) != ncclSuccess) {
            call = "ncclSend";
            break;
        }
        if ((rc = ncclRecv(recv + (size_t)k * slice, slice, ncclUint8, k, m->comm, m->stream)) != ncclSuccess) {
            call = "ncclRecv";
            break;
        }
    }
    /* The group is always closed, even after a failed call inside it. */
    ncclResult_t end_rc = ncclGroupEnd();
    if (rc != ncclSuccess)
        return nccl_failed(err, m->comm, rc, call);
    if (end_rc != ncclSuccess)
        return nccl_failed(err, m->comm, end_rc, "ncclGroupEnd (all-to-all)");
    return PRISM_OK;
}

prism_status nccl_allgather(prism_coll_comm *c, uint8_t *buf, size_t row_bytes, size_t rows, prism_error *err)
{
    NcclImpl *m = impl_of(c);
    size_t slice = row_bytes * rows;
    NCCL_CHECK(m->comm,
               ncclAllGather(buf + (size_t)c->rank * slice, buf, slice, ncclUint8, m->comm, m->stream));
    return PRISM_OK;
}

void free_impl(NcclImpl *m)
{
    if (!m)
        return;
    if (m->host_headers) /* set up: the stream may still use the scratch */
        cudaStreamSynchronize(m->stream);
    cudaFreeHost(m->host_headers);
    cudaFree(m->dev_headers);
    if (m->handoff)
        cudaEventDestroy(m->handoff);
    free(m);
}

void nccl_destroy(prism_coll_comm *c)
{
    NcclImpl *m = impl_of(c);
    if (!m)
        return;
    int prev = -1;
    bool switched = cudaGetDevice(&prev) == cudaSuccess && prev != m->device &&
                    cudaSetDevice(m->device) == cudaSuccess;
    free_impl(m);
    c->impl = NULL;
    if (switched)
        cudaSetDevice(prev);
}

const prism_coll_backend nccl_backend = {
    "nccl",
    nccl_begin,
    nccl_end,
    nccl_alloc,
    nccl_release,
    nccl_quantize,
    nccl_accumulate,
    nccl_dequantize,
    nccl_zero,
    nccl_fill_ones,
    nccl_finish_sum,
    nccl_exchange_headers,
    nccl_alltoall,
    nccl_allgather,
    nccl_destroy,
};

prism_status make_impl(NcclImpl *m, int size, prism_error *err)
{
    size_t bytes = ((size_t)size + 1) * sizeof(prism_coll_header);
    PRISM_CUDA_CHECK(cudaMallocHost((void **)&m->host_headers, bytes));
    PRISM_CUDA_CHECK(cudaMalloc((void **)&m->dev_headers, bytes));
    PRISM_CUDA_CHECK(cudaEventCreateWithFlags(&m->handoff, cudaEventDisableTiming));
    return PRISM_OK;
}

} /* namespace */

extern "C" prism_status prism_coll_comm_from_nccl(ncclComm_t comm, prism_cuda_stream stream, prism_coll_comm **out,
                                                  prism_error *err)
{
    if (!out)
        return prism_error_set(err, PRISM_ERR_INVALID, "out: NULL");
    *out = NULL;
    if (!comm)
        return prism_error_set(err, PRISM_ERR_INVALID, "comm: NULL (an ncclComm_t the caller made)");
    int rank = 0, size = 0, device = 0;
    NCCL_CHECK(comm, ncclCommUserRank(comm, &rank));
    NCCL_CHECK(comm, ncclCommCount(comm, &size));
    NCCL_CHECK(comm, ncclCommCuDevice(comm, &device));
    prism_cuda_device_scope scope;
    prism_status st = scope.enter(device, err);
    if (st != PRISM_OK)
        return st;
    NcclImpl *m = static_cast<NcclImpl *>(calloc(1, sizeof(NcclImpl)));
    if (!m)
        return prism_error_set(err, PRISM_ERR_NOMEM, "nccl: no memory for a communicator");
    m->comm = comm;
    m->stream = reinterpret_cast<cudaStream_t>(stream);
    m->device = device;
    st = make_impl(m, size, err);
    if (st != PRISM_OK) {
        free_impl(m);
        return st;
    }
    return prism_coll_comm_new(&nccl_backend, m, rank, size, out, err);
}

extern "C" prism_status prism_coll_nccl_set_stream(prism_coll_comm *c, prism_cuda_stream stream, prism_error *err)
{
    if (!c || c->be != &nccl_backend)
        return prism_error_set(err, PRISM_ERR_INVALID, "comm: not an NCCL communicator");
    NcclImpl *m = impl_of(c);
    cudaStream_t next = reinterpret_cast<cudaStream_t>(stream);
    if (next == m->stream)
        return PRISM_OK;
    prism_cuda_device_scope scope;
    prism_status st = scope.enter(m->device, err);
    if (st != PRISM_OK)
        return st;
    PRISM_CUDA_CHECK(cudaEventRecord(m->handoff, m->stream));
    PRISM_CUDA_CHECK(cudaStreamWaitEvent(next, m->handoff, 0));
    m->stream = next;
    return PRISM_OK;
}
