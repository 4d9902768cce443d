/* prism_grad_stats_blocks_cuda: the block gradient statistics of DESIGN 3 for many tensors and
 * blocks in one pass over the data.
 *
 * Pass 1 (stats_chunks_kernel, one launch per batch of up to 512 tensors): a warp takes a chunk
 * of PRISM_STATS_CHUNK (2,048) elements of one tensor, the CPU's chunking. Each lane loads its 64
 * elements with 16-byte loads into registers; the warp sums the finite ones in double, then, from
 * the same registers, the squared deviations from the chunk's mean (two-pass, never E[x^2] -
 * E[x]^2), and writes one record (n, mean, M2, sum of squares, max |x|, numel, NaN/Inf count) per
 * chunk. The tensors' pointers, lengths, dtypes and first records are the kernel's parameter
 * (__grid_constant__, read in place), so the host sends nothing else and never waits.
 *
 * Pass 2 (stats_finish_kernel, one launch per 1,024 blocks): a CTA per block merges the block's
 * chunk records by Chan's update in double (threads over a fixed stride, then a fixed shuffle
 * tree, then the warps in order) and writes the block's prism_grad_stats. The order is fixed, so
 * a result does not depend on scheduling.
 *
 * The figures agree with prism_grad_stats_blocks_cpu to about 1e-15 relative (the order of the
 * sums differs from the CPU's eight lanes); numel, nonfinite and max_abs are exact. */
#include "common.cuh"

#include <stdlib.h>

namespace prism_cu {
namespace {

/* The moments of one chunk; after merging, of a block. */
struct Moments {
    double n, mean, m2, sumsq, max_abs;
    unsigned long long numel, nonfinite, unused;
};

constexpr int kStatsBatch = 512;  /* tensors per pass-1 launch (~13 KB of parameters) */
constexpr int kFinishBatch = 1024; /* blocks per pass-2 launch (~8 KB) */
constexpr int kLanePacks = PRISM_STATS_CHUNK / kPack / 32;

struct StatsBatch {
    const void *data[kStatsBatch];
    unsigned long long numel[kStatsBatch];
    unsigned long long first[kStatsBatch + 1]; /* tensor t's chunks are records [first[t], first[t + 1]) */
    unsigned char dtype[kStatsBatch];
    int count; /* tensors, all with numel > 0 */
};

struct FinishBatch {
    unsigned long long first[kFinishBatch + 1]; /* block b's records: [first[b], first[b + 1]) */
    unsigned long long block0;                  /* out index of the batch's block 0 */
    int count;
};

/* Elements [begin, begin + n) of x (n <= 2048, begin a multiple of 2048): one warp. */
template <int DT>
__device__ __forceinline__ void chunk_moments(const void *x, uint64_t numel, uint64_t begin, uint64_t n,
                                              bool vec, Moments *rec)
{
    const int lane = threadIdx.x & 31;
    Raw<DT> r[kLanePacks];
#pragma unroll
    for (int j = 0; j < kLanePacks; j++)
        r[j] = load_pack_any<DT>(x, begin / kPack + lane + 32 * j, numel, vec);

    /* Elements past n are zero bits: finite, adding nothing to the sum or the max. */
    unsigned long long bad = 0;
    uint32_t amax = 0;
    double sum = 0.0;
#pragma unroll
    for (int j = 0; j < kLanePacks; j++)
#pragma unroll
        for (int k = 0; k < kPack; k++) {
            const float f = raw_elem<DT>(r[j], k);
            if (prism_qc_nonfinite(f)) {
                bad++;
            } else {
                sum += (double)f;
                amax = max(amax, abs_bits(f));
            }
        }
    bad = warp_sum(bad);
    sum = warp_sum(sum);
    amax = warp_max(amax);
    const double count = (double)(n - bad);
    const double mean = count > 0 ? sum / count : 0.0;

    double m2 = 0.0;
#pragma unroll
    for (int j = 0; j < kLanePacks; j++)
#pragma unroll
        for (int k = 0; k < kPack; k++) {
            const float f = raw_elem<DT>(r[j], k);
            const uint64_t e = (uint64_t)kPack * (uint64_t)(lane + 32 * j) + (uint64_t)k;
            if (e < n && !prism_qc_nonfinite(f)) {
                const double d = (double)f - mean;
                m2 = fma(d, d, m2);
            }
        }
    m2 = warp_sum(m2);
    if (lane == 0) {
        Moments m;
        m.n = count;
        m.mean = mean;
        m.m2 = m2;
        m.sumsq = m2 + (count * mean) * mean; /* = sum of x^2, without cancellation */
        m.max_abs = (double)__uint_as_float(amax);
        m.numel = n;
        m.nonfinite = bad;
        m.unused = 0;
        *rec = m;
    }
}

__global__ void __launch_bounds__(kThreads)
    stats_chunks_kernel(const __grid_constant__ StatsBatch b, Moments *records)
{
    const uint64_t warp = ((uint64_t)blockIdx.x * kThreads + threadIdx.x) >> 5;
    const uint64_t warps = (uint64_t)gridDim.x * kWarps;
    const uint64_t end = b.first[b.count];
    for (uint64_t c = b.first[0] + warp; c < end; c += warps) {
        int lo = 0, hi = b.count - 1; /* the last tensor whose first chunk is <= c */
        while (lo < hi) {
            const int mid = (lo + hi + 1) >> 1;
            if (b.first[mid] <= c)
                lo = mid;
            else
                hi = mid - 1;
        }
        const void *x = b.data[lo];
        const uint64_t numel = b.numel[lo];
        const uint64_t begin = (c - b.first[lo]) * PRISM_STATS_CHUNK;
        const uint64_t n = min(numel - begin, (uint64_t)PRISM_STATS_CHUNK);
        const bool vec = ((uintptr_t)x & 15u) == 0;
        switch (b.dtype[lo]) {
        case PRISM_DTYPE_F32: chunk_moments<PRISM_DTYPE_F32>(x, numel, begin, n, vec, records + c); break;
        case PRISM_DTYPE_BF16: chunk_moments<PRISM_DTYPE_BF16>(x, numel, begin, n, vec, records + c); break;
        default: chunk_moments<PRISM_DTYPE_F16>(x, numel, begin, n, vec, records + c); break;
        }
    }
}

/* a <- a merged with b: prism_moments_merge of kernels/cpu/driver.c, plus the element count. */
__device__ __forceinline__ void merge(Moments &a, const Moments &b)
{
    if (a.n == 0) {
        a.n = b.n;
        a.mean = b.mean;
        a.m2 = b.m2;
    } else if (b.n > 0) {
        const double n = a.n + b.n;
        const double delta = b.mean - a.mean;
        a.mean += delta * b.n / n;
        a.m2 += b.m2 + delta * delta * a.n * b.n / n;
        a.n = n;
    }
    a.sumsq += b.sumsq;
    a.max_abs = b.max_abs > a.max_abs ? b.max_abs : a.max_abs;
    a.numel += b.numel;
    a.nonfinite += b.nonfinite;
}

__device__ __forceinline__ Moments shfl_down(const Moments &m, int off)
{
    Moments o;
    o.n = __shfl_down_sync(0xffffffffu, m.n, off);
    o.mean = __shfl_down_sync(0xffffffffu, m.mean, off);
    o.m2 = __shfl_down_sync(0xffffffffu, m.m2, off);
    o.sumsq = __shfl_down_sync(0xffffffffu, m.sumsq, off);
    o.max_abs = __shfl_down_sync(0xffffffffu, m.max_abs, off);
    o.numel = __shfl_down_sync(0xffffffffu, m.numel, off);
    o.nonfinite = __shfl_down_sync(0xffffffffu, m.nonfinite, off);
    o.unused = 0;
    return o;
}

/* One CTA per block: each thread merges every kThreads-th record, the warps fold their lanes by a
 * shuffle tree, and thread 0 folds the warps, all in a fixed order. */
__global__ void __launch_bounds__(kThreads)
    stats_finish_kernel(const __grid_constant__ FinishBatch f, const Moments *records, prism_grad_stats *out)
{
    __shared__ Moments part[kWarps];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    for (uint64_t blk = blockIdx.x; blk < (uint64_t)f.count; blk += gridDim.x) {
        Moments m = {0, 0, 0, 0, 0, 0, 0, 0};
        for (uint64_t r = f.first[blk] + threadIdx.x; r < f.first[blk + 1]; r += kThreads)
            merge(m, records[r]);
        for (int off = 16; off > 0; off >>= 1) {
            const Moments o = shfl_down(m, off);
            if (lane < off)
                merge(m, o);
        }
        if (lane == 0)
            part[warp] = m;
        __syncthreads();
        if (threadIdx.x == 0) {
            for (int w = 1; w < kWarps; w++)
                merge(m, part[w]);
            prism_grad_stats s;
            s.l2_norm = sqrt(m.sumsq);
            s.max_abs = m.max_abs;
            s.mean = m.n > 0 ? m.mean : 0.0;
            s.variance = m.n > 0 ? m.m2 / m.n : 0.0;
            s.numel = m.numel;
            s.nonfinite = m.nonfinite;
            out[f.block0 + blk] = s;
        }
        __syncthreads();
    }
}

uint64_t chunks_of(size_t numel)
{
    return numel / PRISM_STATS_CHUNK + (numel % PRISM_STATS_CHUNK != 0);
}

/* The launches of both passes; records has one entry per chunk of every tensor. */
prism_status stats_launch(const prism_tensor *tensors, const size_t *block_start, size_t blocks,
                          prism_grad_stats *out, Moments *records, cudaStream_t stream,
                          prism_error *err)
{
    unsigned resident = 1;
    prism_status st = resident_ctas(&resident, err);
    if (st != PRISM_OK)
        return st;

    StatsBatch *b = static_cast<StatsBatch *>(malloc(sizeof *b));
    if (!b)
        return prism_error_set(err, PRISM_ERR_NOMEM, "grad_stats: no memory for a launch batch");
    size_t count = block_start[blocks];
    uint64_t next = 0; /* the first record of tensor t */
    b->count = 0;
    b->first[0] = 0;
    for (size_t t = 0; t <= count; t++) {
        if (t < count && tensors[t].numel > 0) {
            int i = b->count++;
            b->data[i] = tensors[t].data;
            b->numel[i] = tensors[t].numel;
            b->dtype[i] = (unsigned char)tensors[t].dtype;
            b->first[i] = next;
            next += chunks_of(tensors[t].numel);
            b->first[i + 1] = next;
        }
        if (b->count == kStatsBatch || (t == count && b->count > 0)) {
            const uint64_t chunks = b->first[b->count] - b->first[0];
            PRISM_LAUNCH(stats_chunks_kernel, grid_for((chunks + kWarps - 1) / kWarps, resident), kThreads,
                         stream, *b, records);
            b->count = 0;
            cudaError_t rc = cudaGetLastError();
            if (rc != cudaSuccess) {
                free(b);
                return prism_cuda_error(err, rc, "stats_chunks_kernel", __FILE__, __LINE__);
            }
        }
    }
    free(b);

    FinishBatch f;
    next = 0;
    size_t t = 0;
    for (size_t b0 = 0; b0 < blocks; b0 += kFinishBatch) {
        f.block0 = b0;
        f.count = (int)(blocks - b0 < (size_t)kFinishBatch ? blocks - b0 : (size_t)kFinishBatch);
        for (int i = 0; i < f.count; i++) {
            f.first[i] = next;
            for (; t < block_start[b0 + (size_t)i + 1]; t++)
                next += chunks_of(tensors[t].numel);
        }
        f.first[f.count] = next;
        PRISM_LAUNCH(stats_finish_kernel, grid_for((uint64_t)f.count, resident), kThreads, stream, f,
                     records, out);
        PRISM_CUDA_CHECK(cudaGetLastError());
    }
    return PRISM_OK;
}

} /* namespace */
} /* namespace prism_cu */

using namespace prism_cu;

/* Arguments are checked as prism_grad_stats_blocks_cpu checks them, with its messages. */
extern "C" prism_status prism_grad_stats_blocks_cuda(const prism_tensor *tensors, const size_t *block_start,
                                                     size_t blocks, prism_grad_stats *out,
                                                     prism_cuda_stream stream, prism_error *err)
{
    size_t count;
    prism_status checked = prism_check_blocks(tensors, block_start, blocks, out, &count, err);
    if (checked != PRISM_OK || blocks == 0)
        return checked;
    uint64_t chunks = 0;
    for (size_t t = 0; t < count; t++)
        chunks += chunks_of(tensors[t].numel);

    cudaStream_t s = as_stream(stream);
    Moments *records = NULL;
    if (chunks)
        PRISM_CUDA_CHECK(cudaMallocAsync(reinterpret_cast<void **>(&records), chunks * sizeof *records, s));
    prism_status st = stats_launch(tensors, block_start, blocks, out, records, s, err);
    if (records) {
        cudaError_t rc = cudaFreeAsync(records, s);
        if (rc != cudaSuccess && st == PRISM_OK)
            st = prism_cuda_error(err, rc, "cudaFreeAsync(records)", __FILE__, __LINE__);
    }
    return st;
}
