/* prism_quantize_scaled_cuda and prism_quantize_counted_cuda: prism_quantize_scaled_cpu and
 * prism_quantize_counted_cpu on the caller's stream, with the CPU's codes, amax and counts bit for
 * bit (every element goes through quant_core.h: the division, the code, the saturation test).
 *
 * One kernel, element-parallel: the scale of each element is known, so a thread takes a chunk of
 * kChunk consecutive elements (even, so that an INT4 byte has one writer) and writes their codes
 * in one pass. amax: a thread keeps the largest |x| of the group it is in and folds it into the
 * group's slot of amax (zeroed first) with an atomicMax on the bits when the group changes or its
 * chunk ends (non-negative binary32 values order like their bits; max is exact in any order).
 * Counts: per thread, summed in the CTA (warp shuffles, then shared memory), one atomicAdd per
 * counter per CTA into the device counters (zeroed first): integers, exact in any order.
 *
 * The counted form with computed scales runs prism_quantize_cuda (its scales and codes) and then
 * the scaled kernel under those scales, which writes the same codes again and counts: two passes
 * over the input where the uncounted form takes one (a fused kernel is left for later).
 *
 * The given scales are device memory the host does not read (reading them would wait for the
 * stream's earlier work, and a wait is not allowed while a stream is captured into a graph): the
 * kernel checks each group's scale itself. A group whose scale is not finite and > 0 has every
 * element written as code 0, counted neither saturated nor underflowed (its non-finite elements
 * still count as such, and its amax is still its own), and the group counted in bad_scale by the
 * thread that takes its first element. */
#include "common.cuh"

namespace prism_cu {
namespace {

constexpr uint64_t kChunk = 16; /* elements a thread takes at a time: even (INT4 bytes) */

struct ScaledArgs {
    const void *x;
    uint64_t numel, len; /* len: elements per group */
    const float *scales;
    uint8_t *codes;
    uint32_t *amax;                 /* bits of each group's amax, or NULL */
    unsigned long long *counts;     /* saturated, underflowed, nonfinite, bad_scale, or NULL */
    uint64_t seed;
    int stochastic;
};

__device__ __forceinline__ void fold_amax(const ScaledArgs &a, uint64_t group, uint32_t bits)
{
    if (a.amax && bits)
        atomicMax(a.amax + group, bits);
}

/* Sums v over the CTA into thread 0's return value; every thread of the CTA calls it. */
__device__ __forceinline__ unsigned long long cta_sum(unsigned long long v, unsigned long long *red)
{
    v = warp_sum(v);
    if ((threadIdx.x & 31) == 0)
        red[threadIdx.x >> 5] = v;
    __syncthreads();
    unsigned long long total = 0;
    if (threadIdx.x == 0)
        for (int w = 0; w < kWarps; w++)
            total += red[w];
    __syncthreads();
    return total;
}

template <int DT, int FMT>
__global__ void __launch_bounds__(kThreads) quantize_scaled_kernel(ScaledArgs a)
{
    __shared__ unsigned long long red[kWarps];
    unsigned long long sat = 0, und = 0, bad = 0, bad_scale = 0;
    const uint64_t chunks = (a.numel + kChunk - 1) / kChunk;
    const uint64_t stride = (uint64_t)gridDim.x * kThreads;
    for (uint64_t c = (uint64_t)blockIdx.x * kThreads + threadIdx.x; c < chunks; c += stride) {
        const uint64_t begin = c * kChunk, end = min(begin + kChunk, a.numel);
        uint64_t group = begin / a.len;
        uint64_t group_end = min(group * a.len + a.len, a.numel);
        float s = a.scales[group];
        bool usable = s > 0.0f && !prism_qc_nonfinite(s);
        bad_scale += (unsigned long long)(!usable && begin == group * a.len);
        uint32_t most = 0;
        for (uint64_t i = begin; i < end; i += 2) {
            uint32_t pair = 0;
#pragma unroll
            for (int h = 0; h < 2; h++) {
                const uint64_t e = i + (uint64_t)h;
                if (e >= end)
                    break;
                if (e >= group_end) {
                    fold_amax(a, group, most);
                    most = 0;
                    group = e / a.len;
                    group_end = min(group * a.len + a.len, a.numel);
                    s = a.scales[group];
                    usable = s > 0.0f && !prism_qc_nonfinite(s);
                    bad_scale += (unsigned long long)!usable; /* e is the group's first element */
                }
                const float f = load_elem<DT>(a.x, e);
                uint32_t code = 0;
                if (prism_qc_nonfinite(f)) {
                    bad++;
                } else if (!usable) {
                    most = max(most, abs_bits(f)); /* code 0, in no count but bad_scale's group */
                } else {
                    const uint32_t mag = abs_bits(f);
                    most = max(most, mag);
                    const float v = __fdiv_rn(f, s);
                    if (a.stochastic) {
                        const uint32_t r = prism_qc_random(e, a.seed);
                        code = prism_qc_code_stochastic(v, FMT, r);
                        sat += (unsigned long long)prism_qc_saturates_stochastic(v, FMT, r);
                    } else {
                        code = prism_qc_code_nearest(v, FMT);
                        sat += (unsigned long long)prism_qc_saturates_nearest(v, FMT);
                    }
                    und += (unsigned long long)(code == 0 && mag != 0);
                }
                if (FMT == PRISM_QC_INT4)
                    pair |= (code & 0xfu) << (4 * h);
                else
                    a.codes[e] = (uint8_t)code;
            }
            if (FMT == PRISM_QC_INT4)
                a.codes[i / 2] = (uint8_t)pair; /* an odd numel's last high nibble: 0 */
        }
        fold_amax(a, group, most);
    }
    if (!a.counts)
        return; /* the same for every thread: no CTA is left waiting at a barrier */
    sat = cta_sum(sat, red);
    und = cta_sum(und, red);
    bad = cta_sum(bad, red);
    bad_scale = cta_sum(bad_scale, red);
    if (threadIdx.x == 0) {
        if (sat)
            atomicAdd(a.counts + 0, sat);
        if (und)
            atomicAdd(a.counts + 1, und);
        if (bad)
            atomicAdd(a.counts + 2, bad);
        if (bad_scale)
            atomicAdd(a.counts + 3, bad_scale);
    }
}

template <int DT, int FMT>
prism_status scaled_launch(const ScaledArgs &a, unsigned grid, cudaStream_t stream, prism_error *err)
{
    auto kernel = quantize_scaled_kernel<DT, FMT>;
    PRISM_LAUNCH(kernel, grid, kThreads, stream, a);
    PRISM_CUDA_CHECK(cudaGetLastError());
    return PRISM_OK;
}

template <int DT>
prism_status scaled_dtype(int format, const ScaledArgs &a, unsigned grid, cudaStream_t stream,
                          prism_error *err)
{
    switch (format) {
    case PRISM_QC_INT8: return scaled_launch<DT, PRISM_QC_INT8>(a, grid, stream, err);
    case PRISM_QC_E4M3: return scaled_launch<DT, PRISM_QC_E4M3>(a, grid, stream, err);
    case PRISM_QC_E5M2: return scaled_launch<DT, PRISM_QC_E5M2>(a, grid, stream, err);
    default: return scaled_launch<DT, PRISM_QC_INT4>(a, grid, stream, err);
    }
}

/* Zeroes the counters and amax slots, then queues the kernel: the arguments are checked. */
prism_status launch_scaled(const prism_quant_spec *spec, const prism_tensor *x, size_t groups,
                           size_t group_len, const float *scales, uint8_t *codes, float *amax,
                           prism_quant_counts *counts, cudaStream_t stream, prism_error *err)
{
    if (counts)
        PRISM_CUDA_CHECK(cudaMemsetAsync(counts, 0, sizeof *counts, stream));
    if (x->numel == 0)
        return PRISM_OK;
    if (amax)
        PRISM_CUDA_CHECK(cudaMemsetAsync(amax, 0, groups * sizeof *amax, stream));
    unsigned resident = 1;
    prism_status st = resident_ctas(&resident, err);
    if (st != PRISM_OK)
        return st;
    ScaledArgs a;
    a.x = x->data;
    a.numel = x->numel;
    a.len = group_len;
    a.scales = scales;
    a.codes = codes;
    a.amax = reinterpret_cast<uint32_t *>(amax);
    a.counts = reinterpret_cast<unsigned long long *>(counts);
    a.seed = spec->seed;
    a.stochastic = spec->rounding == PRISM_ROUNDING_STOCHASTIC;
    const uint64_t chunks = (x->numel + kChunk - 1) / kChunk;
    const unsigned grid = grid_for((chunks + kThreads - 1) / kThreads, resident);
    switch (x->dtype) {
    case PRISM_DTYPE_F32: return scaled_dtype<PRISM_DTYPE_F32>((int)spec->format, a, grid, stream, err);
    case PRISM_DTYPE_BF16: return scaled_dtype<PRISM_DTYPE_BF16>((int)spec->format, a, grid, stream, err);
    default: return scaled_dtype<PRISM_DTYPE_F16>((int)spec->format, a, grid, stream, err);
    }
}

static_assert(sizeof(prism_quant_counts) == 4 * sizeof(unsigned long long),
              "prism_quant_counts is four 64-bit device counters");

} /* namespace */
} /* namespace prism_cu */

using namespace prism_cu;

extern "C" prism_status prism_quantize_scaled_cuda(const prism_quant_spec *spec, const prism_tensor *x,
                                                   const float *scales, uint8_t *codes, float *amax,
                                                   prism_quant_counts *counts, prism_cuda_stream stream,
                                                   prism_error *err)
{
    prism_status st = prism_check_tensor(x, "input", 0, err);
    if (st != PRISM_OK)
        return st;
    size_t groups, group_len;
    st = prism_quant_layout(spec, x->numel, &groups, &group_len, NULL, err);
    if (st != PRISM_OK)
        return st;
    if (x->numel && (!codes || !scales))
        return prism_error_set(err, PRISM_ERR_INVALID, "quantize: codes or scales is NULL");
    /* The scales stay on the device: the kernel checks them (bad_scale). */
    return launch_scaled(spec, x, groups, group_len, scales, codes, amax, counts, as_stream(stream), err);
}

extern "C" prism_status prism_quantize_counted_cuda(const prism_quant_spec *spec, const prism_tensor *x,
                                                    uint8_t *codes, float *scales, prism_quant_counts *counts,
                                                    prism_cuda_stream stream, prism_error *err)
{
    /* prism_quantize_cuda makes every check (the same as the CPU's) and the scales. */
    prism_status st = prism_quantize_cuda(spec, x, codes, scales, NULL, stream, err);
    if (st != PRISM_OK)
        return st;
    size_t groups, group_len;
    st = prism_quant_layout(spec, x->numel, &groups, &group_len, NULL, err);
    if (st != PRISM_OK)
        return st;
    return launch_scaled(spec, x, groups, group_len, scales, codes, NULL, counts, as_stream(stream), err);
}
