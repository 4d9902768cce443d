/* The one kernel behind prism_dequantize_cuda (dequantize.cu) and
 * prism_dequantize_accumulate_cuda (dequantize_accumulate.cu): out[i] = decode(code i) * scale
 * of i's group, one binary32 multiplication (__fmul_rn), written as the output dtype through
 * quant_core.h's conversions; or acc[i] = acc[i] + that product, rounded twice (__fadd_rn after
 * __fmul_rn, never a fused multiply-add), as the reference does.
 *
 * Shape: a grid-stride loop over packs of 8 elements, four packs per thread in flight; a pack
 * reads 8 bytes of codes (4 for INT4) and writes 16 or 32 bytes, each as one vector access when
 * the pointers allow it. FP8 codes decode through a 256-entry table in shared memory, built by
 * prism_qc_fp8_decode. A pack finds its group with one shift or division and steps through group
 * boundaries inside it, so any group length works. */
#ifndef PRISM_KERNELS_CUDA_DECODE_CUH
#define PRISM_KERNELS_CUDA_DECODE_CUH

#include "common.cuh"

namespace prism_cu {

struct DecodeArgs {
    const uint8_t *codes;
    const float *scales;
    uint64_t numel, len, groups;
    void *out; /* the output, or acc */
    int locate, shift;
};

/* How a pack finds its group from its first element: one group, a power-of-two length, or a
 * division in 32 bits when every index fits (much cheaper on the GPU than 64 bits). */
enum { kLocateOne, kLocateShift, kLocateDiv32, kLocateDiv64 };

__device__ __forceinline__ uint64_t group_of(const DecodeArgs &a, uint64_t e)
{
    switch (a.locate) {
    case kLocateOne: return 0;
    case kLocateShift: return e >> a.shift;
    case kLocateDiv32: return (uint32_t)e / (uint32_t)a.len;
    default: return e / a.len;
    }
}

template <int FMT> __host__ __device__ constexpr bool is_fp8()
{
    return FMT == PRISM_QC_E4M3 || FMT == PRISM_QC_E5M2;
}

/* Code k of a pack's code words (bytes, or nibbles for INT4). */
template <int FMT> __device__ __forceinline__ uint32_t code_at(const uint32_t w[2], int k)
{
    if (FMT == PRISM_QC_INT4)
        return (w[0] >> (4 * k)) & 0xfu;
    return (w[k >> 2] >> (8 * (k & 3))) & 0xffu;
}

template <int FMT> __device__ __forceinline__ float decode_code(uint32_t c, const float *lut)
{
    if (is_fp8<FMT>())
        return lut[c];
    return prism_qc_decode((uint8_t)c, FMT);
}

template <int OUT> __device__ __forceinline__ void store_out(void *out, uint64_t i, float y)
{
    if (OUT == PRISM_DTYPE_F32)
        static_cast<float *>(out)[i] = y;
    else if (OUT == PRISM_DTYPE_BF16)
        static_cast<uint16_t *>(out)[i] = prism_qc_f32_to_bf16(y);
    else
        static_cast<uint16_t *>(out)[i] = prism_qc_f32_to_f16(y);
}

template <int OUT> __device__ __forceinline__ uint32_t to_half_bits(float y)
{
    return OUT == PRISM_DTYPE_BF16 ? prism_qc_f32_to_bf16(y) : prism_qc_f32_to_f16(y);
}

constexpr int kDecodeUnroll = 4; /* packs per thread in flight */

/* ACC: out is acc (binary32) and OUT is ignored. vec: codes aligned for one 8- (4-) byte load
 * per pack and out for 16-byte accesses. */
template <int FMT, int OUT, bool ACC>
__global__ void __launch_bounds__(kThreads) decode_kernel(DecodeArgs a, int vec)
{
    __shared__ float lut[256];
    if (is_fp8<FMT>()) {
        lut[threadIdx.x] = prism_qc_fp8_decode((uint8_t)threadIdx.x, FMT);
        __syncthreads();
    }
    constexpr int kCodeBytes = pack_code_bytes<FMT>();
    const uint64_t packs = (a.numel + kPack - 1) / kPack;
    const uint64_t step = (uint64_t)gridDim.x * kThreads * kDecodeUnroll;
    for (uint64_t base = (uint64_t)blockIdx.x * kThreads * kDecodeUnroll + threadIdx.x; base < packs;
         base += step) {
        uint32_t cw[kDecodeUnroll][2];
        float accv[ACC ? kDecodeUnroll : 1][kPack];
#pragma unroll
        for (int u = 0; u < kDecodeUnroll; u++) {
            const uint64_t p = base + (uint64_t)u * kThreads;
            if (p >= packs)
                continue;
            const uint64_t e0 = p * kPack;
            const int n = e0 + kPack <= a.numel ? kPack : (int)(a.numel - e0);
            if (vec && n == kPack) {
                if (kCodeBytes == 4) {
                    cw[u][0] = __ldg(reinterpret_cast<const unsigned int *>(a.codes) + p);
                    cw[u][1] = 0;
                } else {
                    uint2 v = __ldg(reinterpret_cast<const uint2 *>(a.codes) + p);
                    cw[u][0] = v.x;
                    cw[u][1] = v.y;
                }
            } else {
                cw[u][0] = cw[u][1] = 0;
                const int nbytes = kCodeBytes == 4 ? (n + 1) / 2 : n;
#pragma unroll
                for (int b = 0; b < kCodeBytes; b++)
                    if (b < nbytes)
                        cw[u][b >> 2] |= (uint32_t)__ldg(a.codes + p * kCodeBytes + b) << (8 * (b & 3));
            }
            if (ACC) {
                const float *acc = static_cast<const float *>(a.out);
                if (vec && n == kPack) {
                    const float4 *q = reinterpret_cast<const float4 *>(acc + e0);
                    float4 lo = q[0], hi = q[1];
                    accv[u][0] = lo.x, accv[u][1] = lo.y, accv[u][2] = lo.z, accv[u][3] = lo.w;
                    accv[u][4] = hi.x, accv[u][5] = hi.y, accv[u][6] = hi.z, accv[u][7] = hi.w;
                } else {
#pragma unroll
                    for (int k = 0; k < kPack; k++)
                        accv[u][k] = k < n ? acc[e0 + k] : 0.0f;
                }
            }
        }
#pragma unroll
        for (int u = 0; u < kDecodeUnroll; u++) {
            const uint64_t p = base + (uint64_t)u * kThreads;
            if (p >= packs)
                continue;
            const uint64_t e0 = p * kPack;
            const int n = e0 + kPack <= a.numel ? kPack : (int)(a.numel - e0);
            uint64_t g = group_of(a, e0);
            uint64_t r = e0 - g * a.len;
            float s = g < a.groups ? __ldg(a.scales + g) : 0.0f;
            float y[kPack];
#pragma unroll
            for (int k = 0; k < kPack; k++) {
                if (k > 0 && ++r == a.len) {
                    r = 0;
                    g++;
                    s = g < a.groups ? __ldg(a.scales + g) : 0.0f;
                }
                y[k] = __fmul_rn(decode_code<FMT>(code_at<FMT>(cw[u], k), lut), s);
                if (ACC)
                    y[k] = __fadd_rn(accv[u][k], y[k]);
            }
            if (ACC || OUT == PRISM_DTYPE_F32) {
                float *out = static_cast<float *>(a.out);
                if (vec && n == kPack) {
                    float4 *q = reinterpret_cast<float4 *>(out + e0);
                    q[0] = make_float4(y[0], y[1], y[2], y[3]);
                    q[1] = make_float4(y[4], y[5], y[6], y[7]);
                } else {
#pragma unroll
                    for (int k = 0; k < kPack; k++)
                        if (k < n)
                            out[e0 + k] = y[k];
                }
            } else if (vec && n == kPack) {
                uint4 v;
                v.x = to_half_bits<OUT>(y[0]) | to_half_bits<OUT>(y[1]) << 16;
                v.y = to_half_bits<OUT>(y[2]) | to_half_bits<OUT>(y[3]) << 16;
                v.z = to_half_bits<OUT>(y[4]) | to_half_bits<OUT>(y[5]) << 16;
                v.w = to_half_bits<OUT>(y[6]) | to_half_bits<OUT>(y[7]) << 16;
                reinterpret_cast<uint4 *>(static_cast<uint16_t *>(a.out) + e0)[0] = v;
            } else {
#pragma unroll
                for (int k = 0; k < kPack; k++)
                    if (k < n)
                        store_out<OUT>(a.out, e0 + k, y[k]);
            }
        }
    }
}

/* The checks of the CPU drivers' decode_setup (same messages) and the launch arguments. */
static inline prism_status decode_setup(const prism_quant_spec *spec, const uint8_t *codes,
                                        const float *scales, size_t numel, void *out, DecodeArgs *a,
                                        prism_error *err)
{
    size_t groups, group_len;
    prism_status st = prism_quant_layout(spec, numel, &groups, &group_len, NULL, err);
    if (st != PRISM_OK)
        return st;
    if (numel && (!codes || !scales || !out))
        return prism_error_set(err, PRISM_ERR_INVALID, "dequantize: codes, scales or output is NULL");
    a->codes = codes;
    a->scales = scales;
    a->numel = numel;
    a->len = group_len ? group_len : 1;
    a->groups = groups;
    a->out = out;
    a->shift = 0;
    if (groups <= 1) {
        a->locate = kLocateOne;
    } else if ((a->len & (a->len - 1)) == 0) {
        a->locate = kLocateShift;
        while (((uint64_t)1 << a->shift) < a->len)
            a->shift++;
    } else {
        a->locate = numel <= UINT32_MAX ? kLocateDiv32 : kLocateDiv64;
    }
    return PRISM_OK;
}

template <int FMT, int OUT, bool ACC>
prism_status decode_launch(const DecodeArgs &a, cudaStream_t stream, prism_error *err)
{
    unsigned resident = 1;
    prism_status st = resident_ctas(&resident, err);
    if (st != PRISM_OK)
        return st;
    const int vec = aligned_to(a.codes, (uintptr_t)pack_code_bytes<FMT>()) && aligned_to(a.out, 16);
    const uint64_t packs = (a.numel + kPack - 1) / kPack;
    const uint64_t per_cta = (uint64_t)kThreads * kDecodeUnroll;
    auto kernel = decode_kernel<FMT, OUT, ACC>;
    PRISM_LAUNCH(kernel, grid_for((packs + per_cta - 1) / per_cta, resident), kThreads, stream, a, vec);
    PRISM_CUDA_CHECK(cudaGetLastError());
    return PRISM_OK;
}

template <int OUT, bool ACC>
prism_status decode_format(prism_precision format, const DecodeArgs &a, cudaStream_t stream,
                           prism_error *err)
{
    switch (format) {
    case PRISM_PRECISION_INT8: return decode_launch<PRISM_QC_INT8, OUT, ACC>(a, stream, err);
    case PRISM_PRECISION_FP8_E4M3: return decode_launch<PRISM_QC_E4M3, OUT, ACC>(a, stream, err);
    case PRISM_PRECISION_FP8_E5M2: return decode_launch<PRISM_QC_E5M2, OUT, ACC>(a, stream, err);
    default: return decode_launch<PRISM_QC_INT4, OUT, ACC>(a, stream, err);
    }
}

} /* namespace prism_cu */

#endif
