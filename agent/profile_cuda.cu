/* The GPU profile (profile.h, device >= 0): prism_profile_measure_cuda, called by profile.c once
 * it has checked that the device exists. Every time is taken with cudaEvents around the work on
 * one stream, best of the repetitions that fit the part's share of the budget (kPartWeight):
 *   copy       cudaMemcpyAsync of up to 256 MiB device to device (far past any L2 cache)
 *   h2d, d2h   64 MiB between pinned host memory and the device
 *   matrices   cublasGemmEx, square n x n, A transposed (the "TN" layout every tensor-core path
 *              takes), n from 1,024 doubling up to 8,192 while a multiply at the next n would
 *              take under a sixteenth of the time left (and the three matrices fit a quarter of
 *              the free memory):
 *              BF16 and FP16 in and out with FP32 accumulation, INT8 in and INT32 out
 *              (CUBLAS_COMPUTE_32I), inputs random. FP8 (E4M3 in, BF16 out, FP32 accumulation)
 *              through cublasLtMatmul on compute capability 8.9 and up; 0 before that, and 0
 *              when cuBLASLt has no FP8 algorithm for the device (CUBLAS_STATUS_NOT_SUPPORTED
 *              or no heuristic result). Any other failure is an error.
 *   quantize   prism_quantize_cuda (INT8, blocks of 128, nearest) of BF16 tensors of 4 KiB to
 *              64 MiB, fitted as a line (prism_profile_cost_sweep)
 *   cast       BF16 to FP32 by the small kernel below, the same sizes and fit
 *   memory     cudaMemGetInfo's total
 * Every resource lives in a Gpu, which gpu_release frees whatever happened. */
#include "profile_internal.h"

#include "prism/cuda.h"

#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

namespace {

constexpr size_t kMiB = (size_t)1 << 20;
constexpr size_t kCopyBytesMax = 256 * kMiB; /* each of the two device buffers */
constexpr size_t kHostBytes = 64 * kMiB;     /* the pinned buffer of h2d and d2h */
constexpr int kGemmMin = 1024, kGemmMax = 8192;
constexpr size_t kCostMinBytes = (size_t)4 << 10, kCostMaxBytes = 64 * kMiB;
constexpr size_t kWorkspaceBytes = 32 * kMiB; /* cuBLASLt's, as NVIDIA advises for Hopper */
constexpr int kThreads = 256;

/* The parts, in order, and their shares of the budget. */
enum Part { kCopy, kH2d, kD2h, kBf16, kFp16, kInt8, kFp8, kQuantize, kCast, kParts };
constexpr double kPartWeight[kParts] = {0.10, 0.07, 0.07, 0.12, 0.12, 0.12, 0.12, 0.16, 0.12};

enum GemmKind { kGemmBf16, kGemmFp16, kGemmInt8, kGemmFp8 };

struct Gpu {
    cudaStream_t stream = nullptr;
    cudaEvent_t start = nullptr, stop = nullptr;
    char *src = nullptr, *dst = nullptr; /* copy buffers; later quantize's and cast's */
    size_t copy_bytes = 0;
    void *host = nullptr;                  /* pinned, kHostBytes */
    void *a = nullptr, *b = nullptr, *c = nullptr; /* matrices of up to gemm_max */
    int gemm_max = 0;
    float *scales = nullptr;
    size_t cost_max = 0; /* largest BF16 tensor of the cost sweeps, in bytes */
    void *workspace = nullptr;
    int grid_max = 0; /* blocks of the fill and cast kernels */
    cublasHandle_t blas = nullptr;
    cublasLtHandle_t lt = nullptr;
    cublasLtMatmulDesc_t fp8_op = nullptr;
    cublasLtMatrixLayout_t fp8_a = nullptr, fp8_b = nullptr, fp8_c = nullptr;
    cublasLtMatmulPreference_t fp8_pref = nullptr;
    cublasLtMatmulAlgo_t fp8_algo;
};

/* A failed cuBLAS / cuBLASLt call as the caller's error, like PRISM_CUDA_CHECK's. */
prism_status blas_error(prism_error *err, cublasStatus_t rc, const char *call, int line)
{
    prism_status st = rc == CUBLAS_STATUS_ALLOC_FAILED     ? PRISM_ERR_NOMEM
                      : rc == CUBLAS_STATUS_NOT_INITIALIZED ? PRISM_ERR_UNAVAILABLE
                                                            : PRISM_ERR_STATE;
    return prism_error_set(err, st, "profile_cuda.cu:%d: %s: %s (%s)", line, call,
                           cublasGetStatusString(rc), cublasGetStatusName(rc));
}

#define PROFILE_BLAS_CHECK(call)                                                             \
    do {                                                                                     \
        cublasStatus_t profile_blas_rc_ = (call);                                            \
        if (profile_blas_rc_ != CUBLAS_STATUS_SUCCESS)                                       \
            return blas_error(err, profile_blas_rc_, #call, __LINE__);                       \
    } while (0)

/* ---- kernels ------------------------------------------------------------------------------ */

__device__ uint32_t hash32(uint64_t x)
{
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdull;
    x ^= x >> 33;
    x *= 0xc4ceb9fe1a85ec53ull;
    x ^= x >> 33;
    return (uint32_t)x;
}

/* count random elements of the kind: floats uniform in [-1, 1), INT8 in [-127, 127]. */
__global__ void fill_kernel(uint8_t *p, size_t count, int kind, uint32_t seed)
{
    const size_t stride = (size_t)gridDim.x * blockDim.x;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < count; i += stride) {
        const uint32_t h = hash32(i ^ ((uint64_t)seed << 40));
        const float u = (float)(h >> 8) * (2.0f / 16777216.0f) - 1.0f;
        switch (kind) {
        case kGemmBf16:
            reinterpret_cast<__nv_bfloat16 *>(p)[i] = __float2bfloat16(u);
            break;
        case kGemmFp16:
            reinterpret_cast<__half *>(p)[i] = __float2half(u);
            break;
        case kGemmInt8:
            reinterpret_cast<int8_t *>(p)[i] = (int8_t)((int)(h % 255u) - 127);
            break;
        default:
            p[i] = (uint8_t)__nv_cvt_float_to_fp8(u, __NV_SATFINITE, __NV_E4M3);
            break;
        }
    }
}

/* BF16 to FP32, exact: the BF16 bits are the top half of the FP32 word. */
__global__ void cast_bf16_to_f32_kernel(const uint16_t *in, float *out, size_t n)
{
    const size_t stride = (size_t)gridDim.x * blockDim.x;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride)
        out[i] = __uint_as_float((uint32_t)in[i] << 16);
}

unsigned grid_for(const Gpu *g, size_t n)
{
    size_t blocks = (n + kThreads - 1) / kThreads;
    if (blocks > (size_t)g->grid_max)
        blocks = (size_t)g->grid_max;
    return blocks > 0 ? (unsigned)blocks : 1u;
}

prism_status fill(Gpu *g, void *p, size_t count, GemmKind kind, uint32_t seed, prism_error *err)
{
    PRISM_LAUNCH(fill_kernel, grid_for(g, count), kThreads, g->stream, (uint8_t *)p, count, (int)kind, seed);
    PRISM_CUDA_CHECK(cudaGetLastError());
    return PRISM_OK;
}

/* ---- timing ------------------------------------------------------------------------------- */

/* Queues one repetition of an operation on g->stream. */
typedef prism_status (*Op)(Gpu *g, const void *arg, prism_error *err);

/* Runs op while another run, as long as the shortest so far, ends before deadline (at least
 * once); *best gets the shortest, in seconds, > 0. */
prism_status best_time(Gpu *g, Op op, const void *arg, double deadline, double *best,
                       prism_error *err)
{
    double shortest = INFINITY;
    do {
        PRISM_CUDA_CHECK(cudaEventRecord(g->start, g->stream));
        prism_status st = op(g, arg, err);
        if (st != PRISM_OK)
            return st;
        PRISM_CUDA_CHECK(cudaEventRecord(g->stop, g->stream));
        PRISM_CUDA_CHECK(cudaEventSynchronize(g->stop));
        float ms = 0;
        PRISM_CUDA_CHECK(cudaEventElapsedTime(&ms, g->start, g->stop));
        if (ms * 1e-3 < shortest)
            shortest = ms * 1e-3;
    } while (prism_profile_clock() + shortest < deadline);
    *best = shortest > 1e-9 ? shortest : 1e-9;
    return PRISM_OK;
}

struct Copy {
    void *dst;
    const void *src;
    size_t bytes;
    cudaMemcpyKind kind;
};

prism_status copy_op(Gpu *g, const void *arg, prism_error *err)
{
    const Copy *c = static_cast<const Copy *>(arg);
    PRISM_CUDA_CHECK(cudaMemcpyAsync(c->dst, c->src, c->bytes, c->kind, g->stream));
    return PRISM_OK;
}

prism_status time_copy(Gpu *g, void *dst, const void *src, size_t bytes, cudaMemcpyKind kind,
                       double deadline, double *bytes_per_second, prism_error *err)
{
    const Copy c = {dst, src, bytes, kind};
    double t = 0;
    prism_status st = best_time(g, copy_op, &c, deadline, &t, err);
    if (st == PRISM_OK)
        *bytes_per_second = (double)bytes / t;
    return st;
}

/* ---- matrices ----------------------------------------------------------------------------- */

struct Gemm {
    GemmKind kind;
    int n;
};

prism_status gemm_op(Gpu *g, const void *arg, prism_error *err)
{
    const Gemm *m = static_cast<const Gemm *>(arg);
    const int n = m->n;
    const float one = 1.0f, zero = 0.0f;
    const int32_t one_i = 1, zero_i = 0;
    switch (m->kind) {
    case kGemmBf16:
    case kGemmFp16: {
        const cudaDataType t = m->kind == kGemmBf16 ? CUDA_R_16BF : CUDA_R_16F;
        PROFILE_BLAS_CHECK(cublasGemmEx(g->blas, CUBLAS_OP_T, CUBLAS_OP_N, n, n, n, &one, g->a, t,
                                        n, g->b, t, n, &zero, g->c, t, n, CUBLAS_COMPUTE_32F,
                                        CUBLAS_GEMM_DEFAULT));
        break;
    }
    case kGemmInt8:
        PROFILE_BLAS_CHECK(cublasGemmEx(g->blas, CUBLAS_OP_T, CUBLAS_OP_N, n, n, n, &one_i, g->a,
                                        CUDA_R_8I, n, g->b, CUDA_R_8I, n, &zero_i, g->c, CUDA_R_32I,
                                        n, CUBLAS_COMPUTE_32I, CUBLAS_GEMM_DEFAULT));
        break;
    case kGemmFp8:
        PROFILE_BLAS_CHECK(cublasLtMatmul(g->lt, g->fp8_op, &one, g->a, g->fp8_a, g->b, g->fp8_b,
                                          &zero, g->c, g->fp8_c, g->c, g->fp8_c, &g->fp8_algo,
                                          g->workspace, kWorkspaceBytes, g->stream));
        break;
    }
    return PRISM_OK;
}

void fp8_release(Gpu *g)
{
    if (g->fp8_pref)
        cublasLtMatmulPreferenceDestroy(g->fp8_pref);
    if (g->fp8_c)
        cublasLtMatrixLayoutDestroy(g->fp8_c);
    if (g->fp8_b)
        cublasLtMatrixLayoutDestroy(g->fp8_b);
    if (g->fp8_a)
        cublasLtMatrixLayoutDestroy(g->fp8_a);
    if (g->fp8_op)
        cublasLtMatmulDescDestroy(g->fp8_op);
    g->fp8_pref = nullptr;
    g->fp8_a = g->fp8_b = g->fp8_c = nullptr;
    g->fp8_op = nullptr;
}

/* The cuBLASLt descriptors and algorithm of an n x n FP8 multiply (A transposed, as FP8 requires);
 * *supported = false when cuBLASLt has none for this device. */
prism_status fp8_prepare(Gpu *g, int n, bool *supported, prism_error *err)
{
    fp8_release(g);
    *supported = false;
    const cublasOperation_t trans = CUBLAS_OP_T, plain = CUBLAS_OP_N;
    const size_t workspace = kWorkspaceBytes;
    PROFILE_BLAS_CHECK(cublasLtMatmulDescCreate(&g->fp8_op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    PROFILE_BLAS_CHECK(cublasLtMatmulDescSetAttribute(g->fp8_op, CUBLASLT_MATMUL_DESC_TRANSA,
                                                      &trans, sizeof trans));
    PROFILE_BLAS_CHECK(cublasLtMatmulDescSetAttribute(g->fp8_op, CUBLASLT_MATMUL_DESC_TRANSB,
                                                      &plain, sizeof plain));
    PROFILE_BLAS_CHECK(cublasLtMatrixLayoutCreate(&g->fp8_a, CUDA_R_8F_E4M3, n, n, n));
    PROFILE_BLAS_CHECK(cublasLtMatrixLayoutCreate(&g->fp8_b, CUDA_R_8F_E4M3, n, n, n));
    PROFILE_BLAS_CHECK(cublasLtMatrixLayoutCreate(&g->fp8_c, CUDA_R_16BF, n, n, n));
    PROFILE_BLAS_CHECK(cublasLtMatmulPreferenceCreate(&g->fp8_pref));
    PROFILE_BLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(
        g->fp8_pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &workspace, sizeof workspace));
    cublasLtMatmulHeuristicResult_t result;
    memset(&result, 0, sizeof result);
    int found = 0;
    cublasStatus_t rc = cublasLtMatmulAlgoGetHeuristic(g->lt, g->fp8_op, g->fp8_a, g->fp8_b,
                                                       g->fp8_c, g->fp8_c, g->fp8_pref, 1, &result,
                                                       &found);
    if (rc == CUBLAS_STATUS_NOT_SUPPORTED || (rc == CUBLAS_STATUS_SUCCESS && found == 0))
        return PRISM_OK;
    if (rc != CUBLAS_STATUS_SUCCESS)
        return blas_error(err, rc, "cublasLtMatmulAlgoGetHeuristic", __LINE__);
    g->fp8_algo = result.algo;
    *supported = true;
    return PRISM_OK;
}

/* Operations per second of the kind's multiply (0: FP8 that cuBLASLt does not have here). n
 * doubles from kGemmMin while a multiply at the next n (timed after one to warm up, and about 8
 * times the last) would take under a sixteenth of the time to the deadline. */
prism_status time_gemm(Gpu *g, GemmKind kind, double deadline, double *ops, prism_error *err)
{
    Gemm m = {kind, kGemmMin};
    double t = 0;
    prism_status st;
    for (;;) {
        if (kind == kGemmFp8) {
            bool supported = false;
            if ((st = fp8_prepare(g, m.n, &supported, err)) != PRISM_OK)
                return st;
            if (!supported) {
                *ops = 0;
                return PRISM_OK;
            }
        }
        const size_t count = (size_t)m.n * (size_t)m.n;
        if ((st = fill(g, g->a, count, kind, 1, err)) != PRISM_OK ||
            (st = fill(g, g->b, count, kind, 2, err)) != PRISM_OK ||
            (st = gemm_op(g, &m, err)) != PRISM_OK) /* warm-up: heuristics, module loading */
            return st;
        if ((st = best_time(g, gemm_op, &m, 0, &t, err)) != PRISM_OK) /* one timed run */
            return st;
        /* The next n takes about 8 t: go on while that is a sixteenth of the time left. */
        if (m.n * 2 > g->gemm_max || 128 * t > deadline - prism_profile_clock())
            break;
        m.n *= 2;
    }
    double best = 0;
    if ((st = best_time(g, gemm_op, &m, deadline, &best, err)) != PRISM_OK)
        return st;
    if (t < best)
        best = t;
    const double n = (double)m.n;
    *ops = 2.0 * n * n * n / best;
    return PRISM_OK;
}

/* ---- quantize and cast -------------------------------------------------------------------- */

struct CostRun {
    size_t numel; /* BF16 elements of g->src */
};

prism_status quantize_op(Gpu *g, const void *arg, prism_error *err)
{
    const CostRun *r = static_cast<const CostRun *>(arg);
    prism_quant_spec spec;
    memset(&spec, 0, sizeof spec);
    spec.format = PRISM_PRECISION_INT8;
    spec.granularity = PRISM_GRANULARITY_BLOCK;
    spec.group = PRISM_QUANT_BLOCK_DEFAULT;
    prism_tensor x;
    x.data = g->src;
    x.numel = r->numel;
    x.dtype = PRISM_DTYPE_BF16;
    prism_status st = prism_quantize_cuda(&spec, &x, (uint8_t *)g->dst, g->scales, nullptr,
                                          g->stream, err);
    if (st != PRISM_OK)
        prism_error_prefix(err, "GPU profile: quantize of %zu elements", r->numel);
    return st;
}

prism_status cast_op(Gpu *g, const void *arg, prism_error *err)
{
    const CostRun *r = static_cast<const CostRun *>(arg);
    PRISM_LAUNCH(cast_bf16_to_f32_kernel, grid_for(g, r->numel), kThreads, g->stream, (const uint16_t *)g->src,
                 (float *)g->dst, r->numel);
    PRISM_CUDA_CHECK(cudaGetLastError());
    return PRISM_OK;
}

prism_status time_quantize(void *ctx, size_t bytes, double deadline, double *seconds,
                           prism_error *err)
{
    const CostRun r = {bytes / 2};
    return best_time(static_cast<Gpu *>(ctx), quantize_op, &r, deadline, seconds, err);
}

prism_status time_cast(void *ctx, size_t bytes, double deadline, double *seconds,
                       prism_error *err)
{
    const CostRun r = {bytes / 2};
    return best_time(static_cast<Gpu *>(ctx), cast_op, &r, deadline, seconds, err);
}

/* ---- the profile -------------------------------------------------------------------------- */

void gpu_release(Gpu *g)
{
    if (g->stream)
        (void)cudaStreamSynchronize(g->stream);
    fp8_release(g);
    if (g->lt)
        cublasLtDestroy(g->lt);
    if (g->blas)
        cublasDestroy(g->blas);
    (void)cudaFree(g->src);
    (void)cudaFree(g->dst);
    (void)cudaFree(g->a);
    (void)cudaFree(g->b);
    (void)cudaFree(g->c);
    (void)cudaFree(g->scales);
    (void)cudaFree(g->workspace);
    if (g->host)
        (void)cudaFreeHost(g->host);
    if (g->start)
        (void)cudaEventDestroy(g->start);
    if (g->stop)
        (void)cudaEventDestroy(g->stop);
    if (g->stream)
        (void)cudaStreamDestroy(g->stream);
    (void)cudaGetLastError(); /* a failure here has nothing left to report to */
}

/* Sizes from the free memory: the copy buffers take up to an eighth of it each, the three
 * matrices up to a quarter together. */
void plan_sizes(Gpu *g, size_t free_bytes)
{
    g->copy_bytes = free_bytes / 8 / kMiB * kMiB;
    if (g->copy_bytes > kCopyBytesMax)
        g->copy_bytes = kCopyBytesMax;
    g->cost_max = g->copy_bytes / 2; /* the cast writes twice the BF16 bytes */
    if (g->cost_max > kCostMaxBytes)
        g->cost_max = kCostMaxBytes;
    g->gemm_max = kGemmMin;
    while (g->gemm_max < kGemmMax &&
           8 * (size_t)(2 * g->gemm_max) * (size_t)(2 * g->gemm_max) <= free_bytes / 4)
        g->gemm_max *= 2;
}

prism_status gpu_measure(Gpu *g, int device, double budget_s, prism_device_profile *p,
                         prism_error *err)
{
    PRISM_CUDA_CHECK(cudaFree(nullptr)); /* the context, before the budget starts */
    const double end = prism_profile_clock() + budget_s;
    auto part_end = [end](Part part) {
        return prism_profile_part_end(end, kPartWeight, kParts, part);
    };

    prism_status st = prism_cuda_device_name(device, p->device_name, sizeof p->device_name, err);
    if (st != PRISM_OK)
        return st;
    size_t free_bytes = 0, total_bytes = 0;
    PRISM_CUDA_CHECK(cudaMemGetInfo(&free_bytes, &total_bytes));
    p->memory_bytes = total_bytes;
    int major = 0, minor = 0, sms = 0;
    PRISM_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
    PRISM_CUDA_CHECK(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device));
    PRISM_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
    g->grid_max = (sms > 0 ? sms : 1) * 16;
    plan_sizes(g, free_bytes);
    if (g->copy_bytes < kMiB)
        return prism_error_set(err, PRISM_ERR_NOMEM,
                               "GPU profile: device %d has %zu bytes free, too few to measure",
                               device, free_bytes);

    const size_t gemm_elems = (size_t)g->gemm_max * (size_t)g->gemm_max;
    PRISM_CUDA_CHECK(cudaStreamCreateWithFlags(&g->stream, cudaStreamNonBlocking));
    PRISM_CUDA_CHECK(cudaEventCreate(&g->start));
    PRISM_CUDA_CHECK(cudaEventCreate(&g->stop));
    PRISM_CUDA_CHECK(cudaMalloc(&g->src, g->copy_bytes));
    PRISM_CUDA_CHECK(cudaMalloc(&g->dst, g->copy_bytes));
    PRISM_CUDA_CHECK(cudaMallocHost(&g->host, kHostBytes));
    PRISM_CUDA_CHECK(cudaMalloc(&g->a, 2 * gemm_elems));
    PRISM_CUDA_CHECK(cudaMalloc(&g->b, 2 * gemm_elems));
    PRISM_CUDA_CHECK(cudaMalloc(&g->c, 4 * gemm_elems));
    PRISM_CUDA_CHECK(cudaMalloc(&g->scales, g->cost_max / 2 / PRISM_QUANT_BLOCK_DEFAULT * 4 + 4));
    PRISM_CUDA_CHECK(cudaMalloc(&g->workspace, kWorkspaceBytes));
    PROFILE_BLAS_CHECK(cublasCreate(&g->blas));
    PROFILE_BLAS_CHECK(cublasSetStream(g->blas, g->stream));
    PROFILE_BLAS_CHECK(cublasLtCreate(&g->lt));
    memset(g->host, 1, kHostBytes);
    PRISM_CUDA_CHECK(cudaMemsetAsync(g->src, 1, g->copy_bytes, g->stream));
    PRISM_CUDA_CHECK(cudaMemsetAsync(g->dst, 2, g->copy_bytes, g->stream));
    PRISM_CUDA_CHECK(cudaStreamSynchronize(g->stream));

    const size_t host_bytes = kHostBytes < g->copy_bytes ? kHostBytes : g->copy_bytes;
    if ((st = time_copy(g, g->dst, g->src, g->copy_bytes, cudaMemcpyDeviceToDevice, part_end(kCopy),
                        &p->copy_bytes_per_second, err)) != PRISM_OK ||
        (st = time_copy(g, g->dst, g->host, host_bytes, cudaMemcpyHostToDevice, part_end(kH2d),
                        &p->h2d_bytes_per_second, err)) != PRISM_OK ||
        (st = time_copy(g, g->host, g->src, host_bytes, cudaMemcpyDeviceToHost, part_end(kD2h),
                        &p->d2h_bytes_per_second, err)) != PRISM_OK)
        return st;

    if ((st = time_gemm(g, kGemmBf16, part_end(kBf16), &p->bf16_ops_per_second, err)) != PRISM_OK ||
        (st = time_gemm(g, kGemmFp16, part_end(kFp16), &p->fp16_ops_per_second, err)) != PRISM_OK ||
        (st = time_gemm(g, kGemmInt8, part_end(kInt8), &p->int8_ops_per_second, err)) != PRISM_OK)
        return st;
    p->fp8_ops_per_second = 0;
    if (major * 10 + minor >= 89 &&
        (st = time_gemm(g, kGemmFp8, part_end(kFp8), &p->fp8_ops_per_second, err)) != PRISM_OK)
        return st;

    if ((st = fill(g, g->src, g->cost_max / 2, kGemmBf16, 3, err)) != PRISM_OK ||
        (st = prism_profile_cost_sweep(time_quantize, g, kCostMinBytes, g->cost_max,
                                       part_end(kQuantize), &p->quantize_cost, err)) != PRISM_OK)
        return st;
    return prism_profile_cost_sweep(time_cast, g, kCostMinBytes, g->cost_max, part_end(kCast),
                                    &p->cast_cost, err);
}

} // namespace

extern "C" prism_status prism_profile_measure_cuda(int device, double budget_s,
                                                   prism_device_profile *out, prism_error *err)
{
    int previous = 0;
    PRISM_CUDA_CHECK(cudaGetDevice(&previous));
    PRISM_CUDA_CHECK(cudaSetDevice(device));
    Gpu g;
    prism_device_profile p = *out;
    prism_status st = gpu_measure(&g, device, budget_s, &p, err);
    gpu_release(&g);
    (void)cudaSetDevice(previous);
    (void)cudaGetLastError();
    if (st == PRISM_OK)
        *out = p;
    return st;
}
