/* cuBLAS and cuBLASLt as far as Prism's device profile (agent/profile_cuda.cu) calls them.
 *   cublasGemmEx   arguments checked as cuBLAS checks them (a handle, sizes, leading dimensions,
 *                  a supported combination of types, device memory that holds every element the
 *                  call reads or writes), then a plain column-major GEMM on the handle's stream:
 *                  the operands in binary32 (INT8 in int32), dot products in binary32 (int32, wrapping),
 *                  alpha and beta applied as cuBLAS does. Exact for the integer case; for floats
 *                  it is a GEMM, not cuBLAS's bits. Fast enough for the profile's n = 1024.
 *   cuBLASLt       descriptors are made and destroyed; the heuristic has no algorithm for any
 *                  operation (CUBLAS_STATUS_NOT_SUPPORTED, no result), which is what the real
 *                  library answers where a device lacks a kernel, and the FP8 path of the profile
 *                  then reports 0; cublasLtMatmul is likewise not supported. */
#include "internal.h"

#include <cublasLt.h>
#include <cublas_v2.h>

struct cublasContext {
    cudaStream_t stream = nullptr;
    int device = 0;
};

struct cublasLtContext {
    int device = 0;
};

namespace prism_cudaemu {
namespace {

size_t elem_size(cudaDataType t)
{
    switch (t) {
    case CUDA_R_32F:
    case CUDA_R_32I: return 4;
    case CUDA_R_16F:
    case CUDA_R_16BF: return 2;
    case CUDA_R_8I:
    case CUDA_R_8F_E4M3:
    case CUDA_R_8F_E5M2: return 1;
    default: return 0;
    }
}

float to_float(const void *p, size_t i, cudaDataType t)
{
    switch (t) {
    case CUDA_R_32F: return static_cast<const float *>(p)[i];
    case CUDA_R_16BF: {
        uint32_t u = (uint32_t) static_cast<const uint16_t *>(p)[i] << 16;
        float f;
        memcpy(&f, &u, 4);
        return f;
    }
    case CUDA_R_16F: {
        const uint16_t h = static_cast<const uint16_t *>(p)[i];
        const uint32_t sign = (uint32_t)(h >> 15) << 31, exp = (h >> 10) & 0x1fu, man = h & 0x3ffu;
        uint32_t u;
        if (exp == 0x1f)
            u = sign | 0x7f800000u | (man << 13);
        else if (exp)
            u = sign | ((exp + 112) << 23) | (man << 13);
        else {
            float mag = (float)man * 5.9604644775390625e-8f;
            memcpy(&u, &mag, 4);
            u |= sign;
        }
        float f;
        memcpy(&f, &u, 4);
        return f;
    }
    case CUDA_R_8I: return static_cast<const int8_t *>(p)[i];
    case CUDA_R_32I: return (float)static_cast<const int32_t *>(p)[i];
    default: return 0;
    }
}

uint16_t f32_to_half(float x, bool bf16)
{
    uint32_t u;
    memcpy(&u, &x, 4);
    if (bf16) {
        if ((u & 0x7fffffffu) > 0x7f800000u)
            return (uint16_t)((u >> 16) | 0x40u);
        u += 0x7fffu + ((u >> 16) & 1u);
        return (uint16_t)(u >> 16);
    }
    const uint16_t sign = (uint16_t)((u >> 16) & 0x8000u);
    const uint32_t a = u & 0x7fffffffu;
    if (a > 0x7f800000u)
        return (uint16_t)(sign | 0x7e00u);
    if (a >= 0x477ff000u)
        return (uint16_t)(sign | 0x7c00u);
    if (a >= 0x38800000u) {
        const uint32_t r = a + 0xfffu + ((a >> 13) & 1u);
        return (uint16_t)(sign | ((r - 0x38000000u) >> 13));
    }
    float t;
    memcpy(&t, &a, 4);
    t *= 16777216.0f;
    const float r = (t + 8388608.0f) - 8388608.0f;
    return (uint16_t)(sign | (uint16_t)r);
}

struct Gemm {
    bool ta, tb;
    int m, n, k;
    const void *a, *b;
    void *c;
    cudaDataType at, bt, ct;
    int lda, ldb, ldc;
    bool integer;
    float alpha, beta;
    int32_t ialpha, ibeta;
};

/* op(X)[r][c] of a column-major matrix with leading dimension ld. */
size_t index_of(bool trans, int r, int c, int ld)
{
    return trans ? (size_t)c + (size_t)r * (size_t)ld : (size_t)r + (size_t)c * (size_t)ld;
}

/* sum a[l] * b[l] in eight binary32 lanes, then the lanes; vectorised (AVX2 where the processor
 * has it, chosen at load time), since the profile multiplies matrices of 1,024 squared. */
typedef float v8 __attribute__((vector_size(32)));

__attribute__((target_clones("avx2", "default"))) float dot(const float *a, const float *b, int k)
{
    v8 acc = {0, 0, 0, 0, 0, 0, 0, 0};
    int l = 0;
    for (; l + 8 <= k; l += 8) {
        v8 x, y;
        memcpy(&x, a + l, sizeof x);
        memcpy(&y, b + l, sizeof y);
        acc += x * y;
    }
    float s = ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
    for (; l < k; l++)
        s += a[l] * b[l];
    return s;
}

/* The INT8 case: int32 lanes wrap as the GPU's int32 accumulation does. */
typedef int32_t v8i __attribute__((vector_size(32)));

__attribute__((target_clones("avx2", "default"))) int32_t idot(const int32_t *a, const int32_t *b, int k)
{
    v8i acc = {0, 0, 0, 0, 0, 0, 0, 0};
    int l = 0;
    for (; l + 8 <= k; l += 8) {
        v8i x, y;
        memcpy(&x, a + l, sizeof x);
        memcpy(&y, b + l, sizeof y);
        acc += x * y;
    }
    uint32_t s = 0;
    for (int u = 0; u < 8; u++)
        s += (uint32_t)acc[u];
    for (; l < k; l++)
        s += (uint32_t)(a[l] * b[l]);
    return (int32_t)s;
}

void run_gemm(const Gemm &g)
{
    if (g.integer) {
        std::vector<int32_t> ar((size_t)g.m * g.k), bc((size_t)g.n * g.k);
        for (int i = 0; i < g.m; i++)
            for (int l = 0; l < g.k; l++)
                ar[(size_t)i * g.k + l] = static_cast<const int8_t *>(g.a)[index_of(g.ta, i, l, g.lda)];
        for (int j = 0; j < g.n; j++)
            for (int l = 0; l < g.k; l++)
                bc[(size_t)j * g.k + l] = static_cast<const int8_t *>(g.b)[index_of(g.tb, l, j, g.ldb)];
        int32_t *c = static_cast<int32_t *>(g.c);
        for (int j = 0; j < g.n; j++)
            for (int i = 0; i < g.m; i++) {
                const size_t ci = (size_t)i + (size_t)j * (size_t)g.ldc;
                const uint32_t s = (uint32_t)idot(ar.data() + (size_t)i * g.k, bc.data() + (size_t)j * g.k, g.k);
                const uint32_t prior = g.ibeta ? (uint32_t)g.ibeta * (uint32_t)c[ci] : 0u;
                c[ci] = (int32_t)((uint32_t)g.ialpha * s + prior);
            }
        return;
    }
    /* Rows of op(A) and columns of op(B), each contiguous, then dot products. */
    std::vector<float> ar((size_t)g.m * g.k), bc((size_t)g.n * g.k);
    for (int i = 0; i < g.m; i++)
        for (int l = 0; l < g.k; l++)
            ar[(size_t)i * g.k + l] = to_float(g.a, index_of(g.ta, i, l, g.lda), g.at);
    for (int j = 0; j < g.n; j++)
        for (int l = 0; l < g.k; l++)
            bc[(size_t)j * g.k + l] = to_float(g.b, index_of(g.tb, l, j, g.ldb), g.bt);
    for (int j = 0; j < g.n; j++) {
        const float *bj = bc.data() + (size_t)j * g.k;
        for (int i = 0; i < g.m; i++) {
            const float *ai = ar.data() + (size_t)i * g.k;
            const size_t ci = (size_t)i + (size_t)j * (size_t)g.ldc;
            const float s = dot(ai, bj, g.k);
            float prior = g.beta != 0.0f ? g.beta * to_float(g.c, ci, g.ct) : 0.0f;
            const float v = g.alpha * s + prior;
            if (g.ct == CUDA_R_32F)
                static_cast<float *>(g.c)[ci] = v;
            else
                static_cast<uint16_t *>(g.c)[ci] = f32_to_half(v, g.ct == CUDA_R_16BF);
        }
    }
}

/* Device memory of `device` holding the whole column-major matrix rows x cols, ld. */
bool holds(const void *p, cudaDataType t, int rows, int cols, int ld, int device)
{
    if (rows == 0 || cols == 0)
        return true;
    const size_t bytes = ((size_t)(cols - 1) * (size_t)ld + (size_t)rows) * elem_size(t);
    const Where w = where(p, bytes);
    return w.kind == Mem::Device && w.device == device && !w.overrun;
}

} /* namespace */
} /* namespace prism_cudaemu */

using namespace prism_cudaemu;

extern "C" {

cublasStatus_t cublasCreate_v2(cublasHandle_t *handle)
{
    if (!handle)
        return CUBLAS_STATUS_INVALID_VALUE;
    int device = 0;
    if (cudaGetDevice(&device) != cudaSuccess || sticky(device) != cudaSuccess)
        return CUBLAS_STATUS_NOT_INITIALIZED;
    *handle = new cublasContext;
    (*handle)->device = device;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasDestroy_v2(cublasHandle_t handle)
{
    if (!handle)
        return CUBLAS_STATUS_NOT_INITIALIZED;
    delete handle;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasSetStream_v2(cublasHandle_t handle, cudaStream_t stream)
{
    if (!handle)
        return CUBLAS_STATUS_NOT_INITIALIZED;
    handle->stream = stream;
    return CUBLAS_STATUS_SUCCESS;
}

const char *cublasGetStatusName(cublasStatus_t s)
{
    switch (s) {
    case CUBLAS_STATUS_SUCCESS: return "CUBLAS_STATUS_SUCCESS";
    case CUBLAS_STATUS_NOT_INITIALIZED: return "CUBLAS_STATUS_NOT_INITIALIZED";
    case CUBLAS_STATUS_ALLOC_FAILED: return "CUBLAS_STATUS_ALLOC_FAILED";
    case CUBLAS_STATUS_INVALID_VALUE: return "CUBLAS_STATUS_INVALID_VALUE";
    case CUBLAS_STATUS_ARCH_MISMATCH: return "CUBLAS_STATUS_ARCH_MISMATCH";
    case CUBLAS_STATUS_EXECUTION_FAILED: return "CUBLAS_STATUS_EXECUTION_FAILED";
    case CUBLAS_STATUS_NOT_SUPPORTED: return "CUBLAS_STATUS_NOT_SUPPORTED";
    default: return "CUBLAS_STATUS_UNKNOWN";
    }
}

const char *cublasGetStatusString(cublasStatus_t s)
{
    switch (s) {
    case CUBLAS_STATUS_SUCCESS: return "success";
    case CUBLAS_STATUS_NOT_INITIALIZED: return "the library was not initialized";
    case CUBLAS_STATUS_ALLOC_FAILED: return "the resource allocation failed";
    case CUBLAS_STATUS_INVALID_VALUE: return "an invalid numeric value was used as an argument";
    case CUBLAS_STATUS_ARCH_MISMATCH: return "an absent device architectural feature is required";
    case CUBLAS_STATUS_EXECUTION_FAILED: return "the GPU program failed to execute";
    case CUBLAS_STATUS_NOT_SUPPORTED: return "the functionality requested is not supported";
    default: return "unknown error";
    }
}

cublasStatus_t cublasGemmEx(cublasHandle_t handle, cublasOperation_t transa, cublasOperation_t transb, int m, int n,
                            int k, const void *alpha, const void *A, cudaDataType Atype, int lda, const void *B,
                            cudaDataType Btype, int ldb, const void *beta, void *C, cudaDataType Ctype, int ldc,
                            cublasComputeType_t computeType, cublasGemmAlgo_t algo)
{
    (void)algo;
    if (!handle)
        return CUBLAS_STATUS_NOT_INITIALIZED;
    if ((transa != CUBLAS_OP_N && transa != CUBLAS_OP_T) || (transb != CUBLAS_OP_N && transb != CUBLAS_OP_T) ||
        m < 0 || n < 0 || k < 0 || !alpha || !beta)
        return CUBLAS_STATUS_INVALID_VALUE;
    const bool ta = transa == CUBLAS_OP_T, tb = transb == CUBLAS_OP_T;
    const int a_rows = ta ? k : m, a_cols = ta ? m : k, b_rows = tb ? n : k, b_cols = tb ? k : n;
    if (lda < (a_rows > 1 ? a_rows : 1) || ldb < (b_rows > 1 ? b_rows : 1) || ldc < (m > 1 ? m : 1))
        return CUBLAS_STATUS_INVALID_VALUE;
    const bool float_in = Atype == Btype && (Atype == CUDA_R_16BF || Atype == CUDA_R_16F || Atype == CUDA_R_32F);
    const bool float_ok = float_in && (Ctype == Atype || Ctype == CUDA_R_32F) &&
                          (computeType == CUBLAS_COMPUTE_32F || computeType == CUBLAS_COMPUTE_32F_PEDANTIC);
    const bool int_ok = Atype == CUDA_R_8I && Btype == CUDA_R_8I && Ctype == CUDA_R_32I &&
                        (computeType == CUBLAS_COMPUTE_32I || computeType == CUBLAS_COMPUTE_32I_PEDANTIC);
    if (!float_ok && !int_ok)
        return CUBLAS_STATUS_NOT_SUPPORTED;
    if (m == 0 || n == 0)
        return CUBLAS_STATUS_SUCCESS;
    if (!holds(A, Atype, a_rows, a_cols, lda, handle->device) || !holds(B, Btype, b_rows, b_cols, ldb, handle->device) ||
        !holds(C, Ctype, m, n, ldc, handle->device))
        return CUBLAS_STATUS_INVALID_VALUE;
    Gemm g{ta, tb, m, n, k, A, B, C, Atype, Btype, Ctype, lda, ldb, ldc, int_ok, 0, 0, 0, 0};
    if (int_ok) {
        g.ialpha = *static_cast<const int32_t *>(alpha);
        g.ibeta = *static_cast<const int32_t *>(beta);
    } else {
        g.alpha = *static_cast<const float *>(alpha);
        g.beta = *static_cast<const float *>(beta);
    }
    Op op;
    op.what = "cublasGemmEx";
    op.run = [g]() {
        run_gemm(g);
        return cudaSuccess;
    };
    return enqueue(handle->stream, std::move(op)) == cudaSuccess ? CUBLAS_STATUS_SUCCESS
                                                                  : CUBLAS_STATUS_EXECUTION_FAILED;
}

/* ---- cuBLASLt ------------------------------------------------------------------------------ */

cublasStatus_t cublasLtCreate(cublasLtHandle_t *handle)
{
    if (!handle)
        return CUBLAS_STATUS_INVALID_VALUE;
    *handle = new cublasLtContext;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtDestroy(cublasLtHandle_t handle)
{
    if (!handle)
        return CUBLAS_STATUS_NOT_INITIALIZED;
    delete handle;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulDescCreate(cublasLtMatmulDesc_t *desc, cublasComputeType_t computeType,
                                        cudaDataType_t scaleType)
{
    (void)computeType;
    (void)scaleType;
    if (!desc)
        return CUBLAS_STATUS_INVALID_VALUE;
    *desc = new cublasLtMatmulDescOpaque_t();
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulDescDestroy(cublasLtMatmulDesc_t desc)
{
    delete desc;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulDescSetAttribute(cublasLtMatmulDesc_t desc, cublasLtMatmulDescAttributes_t attr,
                                              const void *buf, size_t size)
{
    (void)attr;
    if (!desc || !buf || size == 0)
        return CUBLAS_STATUS_INVALID_VALUE;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatrixLayoutCreate(cublasLtMatrixLayout_t *layout, cudaDataType type, uint64_t rows,
                                          uint64_t cols, int64_t ld)
{
    if (!layout || elem_size(type) == 0 || ld < (int64_t)(rows > 1 ? rows : 1) || cols == 0)
        return CUBLAS_STATUS_INVALID_VALUE;
    *layout = new cublasLtMatrixLayoutOpaque_t();
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatrixLayoutDestroy(cublasLtMatrixLayout_t layout)
{
    delete layout;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulPreferenceCreate(cublasLtMatmulPreference_t *pref)
{
    if (!pref)
        return CUBLAS_STATUS_INVALID_VALUE;
    *pref = new cublasLtMatmulPreferenceOpaque_t();
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulPreferenceDestroy(cublasLtMatmulPreference_t pref)
{
    delete pref;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulPreferenceSetAttribute(cublasLtMatmulPreference_t pref,
                                                    cublasLtMatmulPreferenceAttributes_t attr, const void *buf,
                                                    size_t size)
{
    (void)attr;
    if (!pref || !buf || size == 0)
        return CUBLAS_STATUS_INVALID_VALUE;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulAlgoGetHeuristic(cublasLtHandle_t handle, cublasLtMatmulDesc_t op,
                                              cublasLtMatrixLayout_t a, cublasLtMatrixLayout_t b,
                                              cublasLtMatrixLayout_t c, cublasLtMatrixLayout_t d,
                                              cublasLtMatmulPreference_t pref, int requested,
                                              cublasLtMatmulHeuristicResult_t results[], int *returned)
{
    (void)results;
    if (!handle)
        return CUBLAS_STATUS_NOT_INITIALIZED;
    if (!op || !a || !b || !c || !d || !pref || requested < 1 || !returned)
        return CUBLAS_STATUS_INVALID_VALUE;
    *returned = 0;
    return CUBLAS_STATUS_NOT_SUPPORTED;
}

cublasStatus_t cublasLtMatmul(cublasLtHandle_t handle, cublasLtMatmulDesc_t desc, const void *alpha, const void *A,
                              cublasLtMatrixLayout_t Adesc, const void *B, cublasLtMatrixLayout_t Bdesc,
                              const void *beta, const void *C, cublasLtMatrixLayout_t Cdesc, void *D,
                              cublasLtMatrixLayout_t Ddesc, const cublasLtMatmulAlgo_t *algo, void *workspace,
                              size_t workspaceSize, cudaStream_t stream)
{
    (void)alpha, (void)A, (void)B, (void)beta, (void)C, (void)D, (void)algo, (void)workspace, (void)workspaceSize;
    (void)stream;
    if (!handle)
        return CUBLAS_STATUS_NOT_INITIALIZED;
    if (!desc || !Adesc || !Bdesc || !Cdesc || !Ddesc)
        return CUBLAS_STATUS_INVALID_VALUE;
    return CUBLAS_STATUS_NOT_SUPPORTED;
}

} /* extern "C" */
