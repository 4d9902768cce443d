/* What the .cu files of kernels/cuda share: element loads in packs of eight, the codes of a pack,
 * warp reductions, launch shapes and the argument checks the CPU drivers also make (with the
 * same messages). Internal to kernels/cuda.
 *
 * Every element-wise result goes through quant_core.h (compiled here as __host__ __device__), so
 * codes, scales and decoded values are the CPU reference's bits. The one exception is FP8 nearest
 * rounding on sm_89 and newer, which uses the hardware conversion that quant_core.h's encoder is
 * specified (and tested, tests/unit/test_fp8_cuda_host.cu) to equal. kernels/CMakeLists.txt
 * compiles this directory with -fmad=false: no a*b+c is fused unless a kernel asks for it with
 * fma(), which only the statistics do (their sums need not match the CPU bit for bit). */
#ifndef PRISM_KERNELS_CUDA_COMMON_CUH
#define PRISM_KERNELS_CUDA_COMMON_CUH

#include "prism/cuda.h"
#include "prism/kernels.h"
#include "checks.h"
#include "quant_core.h"

#include <cuda_fp8.h>
#include <cuda_runtime.h>
#include <stdint.h>

/* FP8 nearest rounding in hardware: cvt.rn.satfinite.{e4m3,e5m2}x2.f32 exists from sm_89. */
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
#define PRISM_CUDA_HW_FP8 1
#endif

namespace prism_cu {

constexpr int kThreads = 256; /* threads of every CTA */
constexpr int kWarps = kThreads / 32;
constexpr int kPack = 8; /* elements of a pack: 16 or 32 bytes of input, 8 or 4 bytes of codes */

/* ---- elements ------------------------------------------------------------------------------ */

/* Eight elements of dtype DT as loaded: eight binary32 words, or eight 16-bit halves in four. */
template <int DT> struct Raw {
    uint32_t u[DT == PRISM_DTYPE_F32 ? 8 : 4];
};

__device__ __forceinline__ float f16_to_f32(uint16_t h)
{
#ifdef __CUDA_ARCH__
    float f; /* exact for every f16 value; NaNs stay NaNs, which is all the kernels need of them */
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
    return f;
#else
    return prism_qc_f16_to_f32(h);
#endif
}

template <int DT> __device__ __forceinline__ float half_to_f32(uint16_t h)
{
    return DT == PRISM_DTYPE_BF16 ? __uint_as_float((uint32_t)h << 16) : f16_to_f32(h);
}

/* Element k (0..7, a constant after unrolling) of a pack. */
template <int DT> __device__ __forceinline__ float raw_elem(const Raw<DT> &r, int k)
{
    if (DT == PRISM_DTYPE_F32)
        return __uint_as_float(r.u[k]);
    return half_to_f32<DT>((uint16_t)(r.u[k >> 1] >> ((k & 1) * 16)));
}

/* Element i of x. */
template <int DT> __device__ __forceinline__ float load_elem(const void *__restrict__ x, uint64_t i)
{
    if (DT == PRISM_DTYPE_F32)
        return __ldg(static_cast<const float *>(x) + i);
    return half_to_f32<DT>(__ldg(static_cast<const unsigned short *>(x) + i));
}

/* Pack p (elements 8p..8p+7) of a 16-byte aligned x: one or two 16-byte loads. */
template <int DT> __device__ __forceinline__ Raw<DT> load_pack(const void *__restrict__ x, uint64_t p)
{
    constexpr int kVec = sizeof(Raw<DT>) / 16;
    const uint4 *q = static_cast<const uint4 *>(x) + p * kVec;
    Raw<DT> r;
#pragma unroll
    for (int j = 0; j < kVec; j++) {
        uint4 v = __ldg(q + j);
        r.u[4 * j] = v.x;
        r.u[4 * j + 1] = v.y;
        r.u[4 * j + 2] = v.z;
        r.u[4 * j + 3] = v.w;
    }
    return r;
}

/* The n (0..8) elements of x from element e0, any alignment; the rest of the pack is zero bits
 * (+0.0, which is finite, adds nothing to amax and gets code 0). */
template <int DT>
__device__ __forceinline__ Raw<DT> load_partial(const void *__restrict__ x, uint64_t e0, int n)
{
    Raw<DT> r;
#pragma unroll
    for (int j = 0; j < (int)(sizeof r.u / sizeof r.u[0]); j++)
        r.u[j] = 0;
    if (DT == PRISM_DTYPE_F32) {
        const uint32_t *p = static_cast<const uint32_t *>(x) + e0;
#pragma unroll
        for (int k = 0; k < kPack; k++)
            if (k < n)
                r.u[k] = __ldg(p + k);
    } else {
        const unsigned short *p = static_cast<const unsigned short *>(x) + e0;
#pragma unroll
        for (int k = 0; k < kPack; k++)
            if (k < n)
                r.u[k >> 1] |= (uint32_t)__ldg(p + k) << ((k & 1) * 16);
    }
    return r;
}

/* Pack p of x, elements beyond numel zero; vec says x is 16-byte aligned. */
template <int DT>
__device__ __forceinline__ Raw<DT> load_pack_any(const void *__restrict__ x, uint64_t p, uint64_t numel,
                                                 bool vec)
{
    uint64_t e0 = p * kPack;
    if (vec && e0 + kPack <= numel)
        return load_pack<DT>(x, p);
    uint64_t left = numel > e0 ? numel - e0 : 0;
    return load_partial<DT>(x, e0, left < (uint64_t)kPack ? (int)left : kPack);
}

__device__ __forceinline__ uint32_t abs_bits(float f)
{
    return __float_as_uint(f) & 0x7fffffffu;
}

/* Largest |x| (as the bits of a non-negative binary32, which order like the values) and the
 * NaN/Inf count of a pack. */
template <int DT>
__device__ __forceinline__ void pack_amax(const Raw<DT> &r, uint32_t &amax, uint32_t &bad)
{
#pragma unroll
    for (int k = 0; k < kPack; k++) {
        float f = raw_elem<DT>(r, k);
        if (prism_qc_nonfinite(f))
            bad++;
        else
            amax = max(amax, abs_bits(f));
    }
}

/* ---- codes --------------------------------------------------------------------------------- */

/* The number of bytes of codes a pack takes: 8, or 4 for INT4. */
template <int FMT> __host__ __device__ constexpr int pack_code_bytes()
{
    return FMT == PRISM_QC_INT4 ? 4 : 8;
}

/* A group's scale s as the divisor of its elements, with 1/s when s is a power of two whose
 * reciprocal is a normal binary32 (every POW2 scale from 2^-126 to 2^126), else 0. Then x * (1/s)
 * and x / s are the same real number, both correctly rounded (the GPU keeps subnormals: -ftz=false),
 * so the multiplication gives the division's bits at a fraction of its cost. */
struct Divisor {
    float s, inv;
};

__device__ __forceinline__ Divisor divisor_of(float s)
{
    const uint32_t e = __float_as_uint(s) >> 23; /* s > 0: the biased exponent */
    Divisor d;
    d.s = s;
    d.inv = (__float_as_uint(s) & 0x7fffffu) == 0 && e >= 1 && e <= 253 ? __uint_as_float((254u - e) << 23)
                                                                        : 0.0f;
    return d;
}

/* x / s as the reference computes it (one correctly rounded binary32 division); non-finite x
 * becomes 0, whose code is 0 under every rounding, which is the code the reference writes for it. */
__device__ __forceinline__ float scaled(float x, Divisor d)
{
    if (prism_qc_nonfinite(x))
        return 0.0f;
    return d.inv != 0.0f ? __fmul_rn(x, d.inv) : __fdiv_rn(x, d.s);
}

/* Two FP8 codes (low byte: a) with nearest rounding, 0x80 made 0 as in prism_qc_code_nearest. */
template <int FMT> __device__ __forceinline__ uint32_t fp8x2_nearest(float a, float b)
{
#ifdef PRISM_CUDA_HW_FP8
    uint32_t w = __nv_cvt_float2_to_fp8x2(make_float2(a, b), __NV_SATFINITE,
                                          FMT == PRISM_QC_E4M3 ? __NV_E4M3 : __NV_E5M2);
    return w & ~__vcmpeq4(w, 0x8080u); /* only the two low bytes can be 0x80 */
#else
    return prism_qc_code_nearest(a, FMT) | (uint32_t)prism_qc_code_nearest(b, FMT) << 8;
#endif
}

/* The codes of four consecutive elements (v: x / s, non-finite already 0) whose random bits
 * are Philox block `block` (elements 4 * block ... 4 * block + 3, prism_qc_random's assignment):
 * four bytes, or for INT4 four nibbles in the low 16 bits, the first element lowest. */
template <int FMT>
__device__ __forceinline__ uint32_t quad_codes(float v0, float v1, float v2, float v3, bool stochastic,
                                               uint64_t block, uint64_t seed)
{
    uint32_t c0, c1, c2, c3;
    if (stochastic) {
        const uint32_t key[2] = {(uint32_t)seed, (uint32_t)(seed >> 32)};
        const uint32_t ctr[4] = {(uint32_t)block, (uint32_t)(block >> 32), 0, 0};
        uint32_t r[4];
        prism_qc_philox(ctr, key, r);
        c0 = prism_qc_code_stochastic(v0, FMT, r[0]);
        c1 = prism_qc_code_stochastic(v1, FMT, r[1]);
        c2 = prism_qc_code_stochastic(v2, FMT, r[2]);
        c3 = prism_qc_code_stochastic(v3, FMT, r[3]);
    } else if (FMT == PRISM_QC_E4M3 || FMT == PRISM_QC_E5M2) {
        const uint32_t lo = fp8x2_nearest<FMT>(v0, v1), hi = fp8x2_nearest<FMT>(v2, v3);
        c0 = lo & 0xffu, c1 = lo >> 8, c2 = hi & 0xffu, c3 = hi >> 8;
    } else {
        c0 = prism_qc_code_nearest(v0, FMT);
        c1 = prism_qc_code_nearest(v1, FMT);
        c2 = prism_qc_code_nearest(v2, FMT);
        c3 = prism_qc_code_nearest(v3, FMT);
    }
    if (FMT == PRISM_QC_INT4)
        return (c0 & 0xfu) | (c1 & 0xfu) << 4 | (c2 & 0xfu) << 8 | (c3 & 0xfu) << 12;
    return c0 | c1 << 8 | c2 << 16 | c3 << 24;
}

/* The codes of the eight values v of the pack starting at element e0 (a multiple of 8): for
 * 8-bit formats w[0] holds bytes 0-3 and w[1] bytes 4-7; for INT4, w[0] holds the four bytes
 * (element k in bits 4k..4k+3) and w[1] is 0. The two halves go through one copy of the code
 * (a loop kept rolled): the rounding is long, and eight inlined copies of it in every kernel
 * would double the build time for nothing a memory-bound kernel notices. */
template <int FMT>
__device__ __forceinline__ void pack_codes(const float v[8], bool stochastic, uint64_t e0, uint64_t seed,
                                           uint32_t w[2])
{
    uint32_t lo = 0, hi = 0;
#pragma unroll 1
    for (int h = 0; h < 2; h++) {
        const uint32_t q = quad_codes<FMT>(h ? v[4] : v[0], h ? v[5] : v[1], h ? v[6] : v[2], h ? v[7] : v[3],
                                           stochastic, (e0 >> 2) + (uint64_t)h, seed);
        if (h)
            hi = q;
        else
            lo = q;
    }
    if (FMT == PRISM_QC_INT4) {
        w[0] = lo | hi << 16;
        w[1] = 0;
    } else {
        w[0] = lo;
        w[1] = hi;
    }
}

/* The code of one element i (x its value, s its group's scale): an 8-bit code, or an INT4 code in
 * the low nibble. For the paths that go element by element (short or odd groups, unaligned
 * pointers). Inlined: as a call (__noinline__) it made ptxas spill values live across the call to
 * local memory (codes_pieces_kernel's FP8 instances on sm_90); inlined, the kernels use about
 * as many registers and build as fast. */
template <int FMT>
__device__ __forceinline__ uint8_t elem_code(float x, float s, bool stochastic, uint64_t i, uint64_t seed)
{
    float v = prism_qc_nonfinite(x) ? 0.0f : __fdiv_rn(x, s);
    if (stochastic)
        return prism_qc_code_stochastic(v, FMT, prism_qc_random(i, seed));
    return prism_qc_code_nearest(v, FMT);
}

/* Stores the codes of a full pack at element e0 (a multiple of 8; codes aligned for it). */
template <int FMT> __device__ __forceinline__ void store_pack_codes(uint8_t *codes, uint64_t e0, const uint32_t w[2])
{
    if (FMT == PRISM_QC_INT4)
        *reinterpret_cast<uint32_t *>(codes + e0 / 2) = w[0];
    else
        *reinterpret_cast<uint2 *>(codes + e0) = make_uint2(w[0], w[1]);
}

/* Stores the codes of the n (1..8) elements of a pack from e0 byte by byte. For INT4 the bytes
 * holding elements e0..e0+n-1 are written whole: a last element at an even index gets a high
 * nibble of 0, the code of the (zero) element after it in the pack. */
template <int FMT>
__device__ __forceinline__ void store_partial_codes(uint8_t *codes, uint64_t e0, int n, const uint32_t w[2])
{
    if (FMT == PRISM_QC_INT4) {
#pragma unroll
        for (int b = 0; b < 4; b++)
            if (2 * b < n)
                codes[e0 / 2 + b] = (uint8_t)(w[0] >> (8 * b));
    } else {
#pragma unroll
        for (int k = 0; k < kPack; k++)
            if (k < n)
                codes[e0 + k] = (uint8_t)(w[k >> 2] >> (8 * (k & 3)));
    }
}

/* ---- reductions ---------------------------------------------------------------------------- */

__device__ __forceinline__ uint32_t warp_max(uint32_t v)
{
#pragma unroll
    for (int off = 16; off > 0; off >>= 1)
        v = max(v, __shfl_xor_sync(0xffffffffu, v, off));
    return v;
}

__device__ __forceinline__ unsigned long long warp_sum(unsigned long long v)
{
#pragma unroll
    for (int off = 16; off > 0; off >>= 1)
        v += __shfl_xor_sync(0xffffffffu, v, off);
    return v;
}

/* Every lane gets the same bits: a butterfly adds each pair in both lanes, and a + b == b + a. */
__device__ __forceinline__ double warp_sum(double v)
{
#pragma unroll
    for (int off = 16; off > 0; off >>= 1)
        v += __shfl_xor_sync(0xffffffffu, v, off);
    return v;
}

/* Adds a CTA's NaN/Inf count to *nonfinite with one atomic per warp that saw any. Every thread
 * of the CTA calls it (it shuffles across whole warps). */
__device__ __forceinline__ void add_nonfinite(unsigned long long *nonfinite, unsigned long long bad)
{
    if (!nonfinite)
        return;
    bad = warp_sum(bad);
    if ((threadIdx.x & 31) == 0 && bad)
        atomicAdd(nonfinite, bad);
}

/* ---- host side ----------------------------------------------------------------------------- */

static_assert(sizeof(prism_dtype) == sizeof(int), "prism_dtype is read as an int");

/* Element size of a dtype; 0 when unknown. An int, because a C caller may pass any value and
 * C++ may not hold one outside the enum's range in a prism_dtype. */
static inline size_t dtype_bytes(int dtype)
{
    switch (dtype) {
    case PRISM_DTYPE_F32: return 4;
    case PRISM_DTYPE_BF16:
    case PRISM_DTYPE_F16: return 2;
    default: return 0;
    }
}

static inline bool aligned_to(const void *p, uintptr_t bytes)
{
    return ((uintptr_t)p % bytes) == 0;
}

/* How many CTAs of kThreads the current device holds at once: the grid of the grid-stride
 * kernels (more would only queue). */
static inline prism_status resident_ctas(unsigned *ctas, prism_error *err)
{
    int device = 0, sms = 0, threads = 0;
    PRISM_CUDA_CHECK(cudaGetDevice(&device));
    PRISM_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
    PRISM_CUDA_CHECK(cudaDeviceGetAttribute(&threads, cudaDevAttrMaxThreadsPerMultiProcessor, device));
    int per_sm = threads / kThreads;
    *ctas = (unsigned)((sms > 0 ? sms : 1) * (per_sm > 0 ? per_sm : 1));
    return PRISM_OK;
}

/* The grid for `work` independent CTA-sized pieces of work: all of them, up to what is resident. */
static inline unsigned grid_for(uint64_t work, unsigned resident)
{
    if (work == 0)
        return 1;
    return work < resident ? (unsigned)work : resident;
}

static inline cudaStream_t as_stream(prism_cuda_stream stream)
{
    return (cudaStream_t)stream;
}

} /* namespace prism_cu */

#endif
