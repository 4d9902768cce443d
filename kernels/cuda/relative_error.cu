/* prism_relative_error_cuda: ||a - b|| / ||a|| as prism_relative_error_cpu defines it, to about
 * 1e-15 relative (the sums are in double, in a different order).
 *
 * Pass 1: a warp per chunk of PRISM_STATS_CHUNK elements loads both tensors with 16-byte loads,
 * sums (a - b)^2 and a^2 in double and writes the two sums of the chunk (the first one NaN when
 * the chunk holds a NaN or Inf in either tensor). Pass 2: one CTA adds the chunks' sums in a fixed
 * order and writes the ratio, so the result does not depend on scheduling. */
#include "common.cuh"

namespace prism_cu {
namespace {

constexpr int kLanePacks = PRISM_STATS_CHUNK / kPack / 32;

template <int DA, int DB>
__global__ void __launch_bounds__(kThreads)
    error_chunks_kernel(const void *a, const void *b, uint64_t numel, int vec_a, int vec_b, double2 *sums)
{
    const int lane = threadIdx.x & 31;
    const uint64_t warps = (uint64_t)gridDim.x * kWarps;
    const uint64_t chunks = (numel + PRISM_STATS_CHUNK - 1) / PRISM_STATS_CHUNK;
    for (uint64_t c = ((uint64_t)blockIdx.x * kThreads + threadIdx.x) >> 5; c < chunks; c += warps) {
        const uint64_t p0 = c * (PRISM_STATS_CHUNK / kPack);
        Raw<DA> ra[kLanePacks];
        Raw<DB> rb[kLanePacks];
#pragma unroll
        for (int j = 0; j < kLanePacks; j++) {
            ra[j] = load_pack_any<DA>(a, p0 + lane + 32 * j, numel, vec_a);
            rb[j] = load_pack_any<DB>(b, p0 + lane + 32 * j, numel, vec_b);
        }
        /* Elements past numel are zero in both: they add nothing. */
        double diff = 0.0, norm = 0.0;
        int bad = 0;
#pragma unroll
        for (int j = 0; j < kLanePacks; j++)
#pragma unroll
            for (int k = 0; k < kPack; k++) {
                const float fa = raw_elem<DA>(ra[j], k), fb = raw_elem<DB>(rb[j], k);
                if (prism_qc_nonfinite(fa) || prism_qc_nonfinite(fb)) {
                    bad = 1;
                } else {
                    const double d = (double)fa - (double)fb;
                    diff = fma(d, d, diff);
                    norm = fma((double)fa, (double)fa, norm);
                }
            }
        diff = warp_sum(diff);
        norm = warp_sum(norm);
        bad = __any_sync(0xffffffffu, bad);
        if (lane == 0)
            sums[c] = make_double2(bad ? __longlong_as_double(0x7ff8000000000000ll) : diff, norm);
    }
}

__global__ void __launch_bounds__(kThreads)
    error_finish_kernel(const double2 *sums, uint64_t chunks, double *out)
{
    __shared__ double diff_s[kThreads], norm_s[kThreads];
    double diff = 0.0, norm = 0.0;
    for (uint64_t c = threadIdx.x; c < chunks; c += kThreads) {
        diff += sums[c].x;
        norm += sums[c].y;
    }
    diff_s[threadIdx.x] = diff;
    norm_s[threadIdx.x] = norm;
    __syncthreads();
    for (int half = kThreads / 2; half > 0; half >>= 1) {
        if ((int)threadIdx.x < half) {
            diff_s[threadIdx.x] += diff_s[threadIdx.x + half];
            norm_s[threadIdx.x] += norm_s[threadIdx.x + half];
        }
        __syncthreads();
    }
    if (threadIdx.x == 0) {
        diff = diff_s[0];
        norm = norm_s[0];
        if (diff != diff) /* a NaN or Inf somewhere */
            *out = __longlong_as_double(0x7ff8000000000000ll);
        else if (norm == 0)
            *out = diff == 0 ? 0.0 : __longlong_as_double(0x7ff0000000000000ll);
        else
            *out = sqrt(diff / norm);
    }
}

template <int DA, int DB>
prism_status error_launch(const prism_tensor *a, const prism_tensor *b, double *out, cudaStream_t stream,
                          prism_error *err)
{
    unsigned resident = 1;
    prism_status st = resident_ctas(&resident, err);
    if (st != PRISM_OK)
        return st;
    const uint64_t chunks = (a->numel + PRISM_STATS_CHUNK - 1) / PRISM_STATS_CHUNK;
    double2 *sums = NULL;
    const char *call = "error_chunks_kernel";
    cudaError_t rc = cudaSuccess;
    if (chunks) {
        PRISM_CUDA_CHECK(cudaMallocAsync(reinterpret_cast<void **>(&sums), chunks * sizeof *sums, stream));
        auto kernel = error_chunks_kernel<DA, DB>;
        PRISM_LAUNCH(kernel, grid_for((chunks + kWarps - 1) / kWarps, resident), kThreads, stream, a->data,
                     b->data, (uint64_t)a->numel, (int)aligned_to(a->data, 16), (int)aligned_to(b->data, 16),
                     sums);
        rc = cudaGetLastError();
    }
    if (rc == cudaSuccess) {
        call = "error_finish_kernel";
        PRISM_LAUNCH(error_finish_kernel, 1, kThreads, stream, sums, chunks, out);
        rc = cudaGetLastError();
    }
    if (sums) {
        const cudaError_t rc_free = cudaFreeAsync(sums, stream);
        if (rc == cudaSuccess && rc_free != cudaSuccess) {
            rc = rc_free;
            call = "cudaFreeAsync(sums)";
        }
    }
    if (rc != cudaSuccess)
        return prism_cuda_error(err, rc, call, __FILE__, __LINE__);
    return PRISM_OK;
}

template <int DA>
prism_status error_dtype_b(const prism_tensor *a, const prism_tensor *b, double *out, cudaStream_t stream,
                           prism_error *err)
{
    switch (b->dtype) {
    case PRISM_DTYPE_F32: return error_launch<DA, PRISM_DTYPE_F32>(a, b, out, stream, err);
    case PRISM_DTYPE_BF16: return error_launch<DA, PRISM_DTYPE_BF16>(a, b, out, stream, err);
    default: return error_launch<DA, PRISM_DTYPE_F16>(a, b, out, stream, err);
    }
}

} /* namespace */
} /* namespace prism_cu */

using namespace prism_cu;

extern "C" prism_status prism_relative_error_cuda(const prism_tensor *a, const prism_tensor *b, double *out,
                                                  prism_cuda_stream stream, prism_error *err)
{
    prism_status st = prism_check_pair(a, b, out, err);
    if (st != PRISM_OK)
        return st;
    cudaStream_t s = as_stream(stream);
    switch (a->dtype) {
    case PRISM_DTYPE_F32: return error_dtype_b<PRISM_DTYPE_F32>(a, b, out, s, err);
    case PRISM_DTYPE_BF16: return error_dtype_b<PRISM_DTYPE_BF16>(a, b, out, s, err);
    default: return error_dtype_b<PRISM_DTYPE_F16>(a, b, out, s, err);
    }
}
