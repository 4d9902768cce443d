/* The emulated cuBLAS against cuBLAS's documented semantics: cublasGemmEx computes
 * C = alpha * op(A) * op(B) + beta * C on column-major matrices with leading dimensions (never
 * touching the rows between m and ldc, never reading C when beta is 0), for the type combinations
 * the emulation offers (BF16, FP16 and FP32 inputs with an FP32 or same-type output, FP32
 * compute; INT8 inputs with INT32 output and compute), on the handle's stream; its argument
 * checks; and cuBLASLt, whose heuristic has no algorithm to offer. The float results are checked
 * against a double reference within 1e-5 (relative to 1 + |reference|; outputs in BF16 or FP16
 * within half a unit in their last place more), the integer ones exactly. */
#include "emu_test.h"

#include <cublasLt.h>
#include <cublas_v2.h>

#include <cmath>

namespace {

uint64_t splitmix(uint64_t *s)
{
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* ---- element formats: random values that each format holds exactly, and their values ------- */

size_t elem_size(cudaDataType t)
{
    return t == CUDA_R_32F || t == CUDA_R_32I ? 4 : t == CUDA_R_8I ? 1 : 2;
}

double decode(const std::vector<unsigned char> &buf, size_t i, cudaDataType t)
{
    switch (t) {
    case CUDA_R_32F: {
        float f;
        memcpy(&f, &buf[4 * i], 4);
        return f;
    }
    case CUDA_R_16BF: {
        uint16_t h;
        memcpy(&h, &buf[2 * i], 2);
        const uint32_t u = (uint32_t)h << 16;
        float f;
        memcpy(&f, &u, 4);
        return f;
    }
    case CUDA_R_16F: { /* binary16: 1 sign, 5 exponent (bias 15), 10 mantissa bits */
        uint16_t h;
        memcpy(&h, &buf[2 * i], 2);
        const int e = (h >> 10) & 31, m = h & 1023;
        if (e == 31)
            return m ? NAN : (h & 0x8000 ? -INFINITY : INFINITY);
        const double mag = e ? std::ldexp(1024.0 + m, e - 25) : std::ldexp((double)m, -24);
        return h & 0x8000 ? -mag : mag;
    }
    case CUDA_R_8I: return (double)(int8_t)buf[i];
    default: {
        int32_t v;
        memcpy(&v, &buf[4 * i], 4);
        return v;
    }
    }
}

/* A random element in [-1, 1) (floats) or [-128, 127] (INT8), exact in its format. */
void random_element(std::vector<unsigned char> &buf, size_t i, cudaDataType t, uint64_t *seed)
{
    const uint64_t r = splitmix(seed);
    switch (t) {
    case CUDA_R_32F: {
        const float f = (float)((double)(r >> 11) * 0x1.0p-53 * 2.0 - 1.0);
        memcpy(&buf[4 * i], &f, 4);
        break;
    }
    case CUDA_R_16BF: { /* a float's top half */
        const float f = (float)((double)(r >> 11) * 0x1.0p-53 * 2.0 - 1.0);
        uint32_t u;
        memcpy(&u, &f, 4);
        const uint16_t h = (uint16_t)(u >> 16);
        memcpy(&buf[2 * i], &h, 2);
        break;
    }
    case CUDA_R_16F: { /* sign, exponent 2^-9 .. 2^-1, random mantissa */
        const uint16_t h = (uint16_t)(((r >> 20) & 1u) << 15 | (uint16_t)(6 + (r >> 32) % 9) << 10 | (r & 1023u));
        memcpy(&buf[2 * i], &h, 2);
        break;
    }
    default: buf[i] = (unsigned char)(r >> 24); break; /* INT8 */
    }
}

/* Half a unit in the last place of v in a 16-bit output format (0 for FP32 and INT32). */
double half_ulp(double v, cudaDataType t)
{
    if (t != CUDA_R_16BF && t != CUDA_R_16F)
        return 0.0;
    const int mantissa = t == CUDA_R_16BF ? 7 : 10, min_exp = t == CUDA_R_16BF ? -126 : -14;
    int e = v == 0.0 ? min_exp : std::ilogb(v);
    if (e < min_exp)
        e = min_exp;
    return std::ldexp(1.0, e - mantissa - 1);
}

/* ---- GEMM cases -------------------------------------------------------------------------------- */

struct GemmCase {
    cudaDataType ab, c;
    cublasComputeType_t compute;
    bool ta, tb;
    int m, n, k;
    int pad; /* lda, ldb, ldc exceed the rows by this much */
    double alpha, beta;
};

/* The rows of the stored matrix op(X) comes from: k x m for a transposed A, m x k otherwise. */
int stored_rows(bool trans, int rows_of_op, int cols_of_op)
{
    return trans ? cols_of_op : rows_of_op;
}

/* Runs one case on the device and checks it; true when every element is right. */
bool run_gemm_case(cublasHandle_t handle, const GemmCase &g, uint64_t seed)
{
    const int a_rows = stored_rows(g.ta, g.m, g.k), a_cols = g.ta ? g.m : g.k;
    const int b_rows = stored_rows(g.tb, g.k, g.n), b_cols = g.tb ? g.k : g.n;
    const int lda = a_rows + g.pad, ldb = b_rows + g.pad, ldc = g.m + g.pad;
    const size_t ea = elem_size(g.ab), ec = elem_size(g.c);
    /* Padding is NaN bytes (0xff, as fresh device memory): an element read from it would show. */
    std::vector<unsigned char> a((size_t)lda * a_cols * ea, 0xff), b((size_t)ldb * b_cols * ea, 0xff),
        c((size_t)ldc * g.n * ec, 0xff);
    for (int j = 0; j < a_cols; j++)
        for (int i = 0; i < a_rows; i++)
            random_element(a, (size_t)j * lda + i, g.ab, &seed);
    for (int j = 0; j < b_cols; j++)
        for (int i = 0; i < b_rows; i++)
            random_element(b, (size_t)j * ldb + i, g.ab, &seed);
    if (g.beta != 0.0) /* with beta 0, C stays NaN (0xff bytes): cuBLAS does not read it */
        for (int j = 0; j < g.n; j++)
            for (int i = 0; i < g.m; i++) {
                const size_t at = (size_t)j * ldc + i;
                if (g.c == CUDA_R_32I) {
                    const int32_t v = (int32_t)(int8_t)(splitmix(&seed) >> 24);
                    memcpy(&c[4 * at], &v, 4);
                } else {
                    random_element(c, at, g.c, &seed);
                }
            }

    DeviceBuffer<unsigned char> da(a.size()), db(b.size()), dc(c.size());
    da.put(a);
    db.put(b);
    dc.put(c);
    const float falpha = (float)g.alpha, fbeta = (float)g.beta;
    const int32_t ialpha = (int32_t)g.alpha, ibeta = (int32_t)g.beta;
    const bool integer = g.c == CUDA_R_32I;
    const cublasStatus_t st =
        cublasGemmEx(handle, g.ta ? CUBLAS_OP_T : CUBLAS_OP_N, g.tb ? CUBLAS_OP_T : CUBLAS_OP_N, g.m, g.n, g.k,
                     integer ? (const void *)&ialpha : (const void *)&falpha, da.p, g.ab, lda, db.p, g.ab, ldb,
                     integer ? (const void *)&ibeta : (const void *)&fbeta, dc.p, g.c, ldc, g.compute,
                     CUBLAS_GEMM_DEFAULT);
    CU_ASSERT_EQUAL(st, CUBLAS_STATUS_SUCCESS);
    EMU_OK(cudaDeviceSynchronize());
    const std::vector<unsigned char> got = dc.get();

    int wrong = 0;
    for (int j = 0; j < g.n; j++)
        for (int i = 0; i < ldc; i++) {
            const size_t at = (size_t)j * ldc + i;
            if (i >= g.m) { /* padding rows: untouched */
                wrong += memcmp(&got[at * ec], &c[at * ec], ec) != 0;
                continue;
            }
            double dot = 0.0;
            for (int l = 0; l < g.k; l++) {
                const size_t ai = g.ta ? (size_t)i * lda + l : (size_t)l * lda + i;
                const size_t bi = g.tb ? (size_t)l * ldb + j : (size_t)j * ldb + l;
                dot += decode(a, ai, g.ab) * decode(b, bi, g.ab);
            }
            const double want = g.alpha * dot + (g.beta != 0.0 ? g.beta * decode(c, at, g.c) : 0.0);
            const double have = decode(got, at, g.c);
            const double tol = integer ? 0.0 : 1e-5 * (1.0 + std::fabs(want)) + half_ulp(want, g.c);
            if (!(std::fabs(have - want) <= tol) && wrong++ < 3)
                fprintf(stderr, "\n  C[%d][%d] = %.9g, expected %.9g", i, j, have, want);
        }
    return wrong == 0;
}

void test_gemm_ex_matches_a_double_reference()
{
    cublasHandle_t handle;
    CU_ASSERT_EQUAL(cublasCreate(&handle), CUBLAS_STATUS_SUCCESS);
    struct Types {
        cudaDataType ab, c;
        cublasComputeType_t compute;
    };
    const Types types[] = {
        {CUDA_R_32F, CUDA_R_32F, CUBLAS_COMPUTE_32F},   {CUDA_R_16BF, CUDA_R_32F, CUBLAS_COMPUTE_32F},
        {CUDA_R_16BF, CUDA_R_16BF, CUBLAS_COMPUTE_32F}, {CUDA_R_16F, CUDA_R_32F, CUBLAS_COMPUTE_32F},
        {CUDA_R_16F, CUDA_R_16F, CUBLAS_COMPUTE_32F},   {CUDA_R_32F, CUDA_R_32F, CUBLAS_COMPUTE_32F_PEDANTIC},
        {CUDA_R_8I, CUDA_R_32I, CUBLAS_COMPUTE_32I},
    };
    struct Shape {
        int m, n, k, pad;
    };
    /* k = 0: C = beta * C (and 0 with beta 0, C never read). */
    const Shape shapes[] = {{1, 1, 1, 0}, {5, 7, 3, 3}, {16, 9, 33, 1}, {8, 8, 64, 5}, {3, 1, 17, 0}, {4, 3, 0, 1}};
    const double scalars[][2] = {{1.0, 0.0}, {2.0, -3.0}};
    int cases = 0, ok = 0;
    uint64_t seed = 1;
    for (const Types &t : types)
        for (int trans = 0; trans < 4; trans++)
            for (const Shape &s : shapes)
                for (const auto &ab : scalars) {
                    const GemmCase g = {t.ab, t.c, t.compute, (trans & 1) != 0, (trans & 2) != 0, s.m, s.n, s.k,
                                        s.pad, ab[0], ab[1]};
                    const bool good = run_gemm_case(handle, g, seed++);
                    if (!good)
                        fprintf(stderr, "\n  (types %d/%d, op %c%c, m %d n %d k %d, pad %d, alpha %g beta %g)",
                                (int)g.ab, (int)g.c, g.ta ? 'T' : 'N', g.tb ? 'T' : 'N', g.m, g.n, g.k, g.pad,
                                g.alpha, g.beta);
                    ok += good;
                    cases++;
                }
    CU_ASSERT_EQUAL(ok, cases);
    CU_ASSERT_EQUAL(cases, 7 * 4 * 6 * 2); /* 336 */
    CU_ASSERT_EQUAL(cublasDestroy(handle), CUBLAS_STATUS_SUCCESS);
}

/* The GEMM runs on the handle's stream: not while that stream is held. */
void test_gemm_ex_runs_on_the_handles_stream()
{
    cublasHandle_t handle;
    CU_ASSERT_EQUAL(cublasCreate(&handle), CUBLAS_STATUS_SUCCESS);
    cudaStream_t s;
    cudaEvent_t done;
    EMU_OK(cudaStreamCreate(&s));
    EMU_OK(cudaEventCreateWithFlags(&done, cudaEventDisableTiming));
    CU_ASSERT_EQUAL(cublasSetStream(handle, s), CUBLAS_STATUS_SUCCESS);
    DeviceBuffer<float> a(4), b(4), c(4);
    a.put({1, 2, 3, 4});
    b.put({1, 0, 0, 1});
    const float one = 1.0f, zero = 0.0f;
    EMU_OK(prism_cudaemu_stream_hold(s));
    CU_ASSERT_EQUAL(cublasGemmEx(handle, CUBLAS_OP_N, CUBLAS_OP_N, 2, 2, 2, &one, a.p, CUDA_R_32F, 2, b.p,
                                 CUDA_R_32F, 2, &zero, c.p, CUDA_R_32F, 2, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
                    CUBLAS_STATUS_SUCCESS);
    EMU_OK(cudaEventRecord(done, s));
    EMU_EXPECT(cudaEventQuery(done), cudaErrorNotReady);
    EMU_OK(prism_cudaemu_stream_release(s));
    EMU_OK(emu_wait_event(done));
    const std::vector<float> got = c.get();
    CU_ASSERT_EQUAL(got[0], 1.0f);
    CU_ASSERT_EQUAL(got[1], 2.0f);
    CU_ASSERT_EQUAL(got[2], 3.0f);
    CU_ASSERT_EQUAL(got[3], 4.0f);
    EMU_OK(cudaEventDestroy(done));
    EMU_OK(cudaStreamDestroy(s));
    CU_ASSERT_EQUAL(cublasDestroy(handle), CUBLAS_STATUS_SUCCESS);
}

/* ---- arguments --------------------------------------------------------------------------------- */

struct BadGemm {
    const char *what;
    bool null_handle;
    cublasOperation_t ta;
    int m, n, k, lda, ldb, ldc;
    cudaDataType at, bt, ct;
    cublasComputeType_t compute;
    int where; /* 0 all device memory, 1 A in host memory, 2 C too small an allocation */
    cublasStatus_t want;
};

void test_gemm_ex_refuses_bad_arguments()
{
    cublasHandle_t handle;
    CU_ASSERT_EQUAL(cublasCreate(&handle), CUBLAS_STATUS_SUCCESS);
    const cublasOperation_t N = CUBLAS_OP_N, T = CUBLAS_OP_T;
    const cudaDataType F = CUDA_R_32F, BF = CUDA_R_16BF, H = CUDA_R_16F, I8 = CUDA_R_8I, I32 = CUDA_R_32I;
    const cublasComputeType_t C32F = CUBLAS_COMPUTE_32F, C32I = CUBLAS_COMPUTE_32I;
    /* m x k A, k x n B, m x n C, all 4 x 4 in 64-byte allocations unless said otherwise. */
    const BadGemm bad[] = {
        {"a good call", false, N, 4, 4, 4, 4, 4, 4, F, F, F, C32F, 0, CUBLAS_STATUS_SUCCESS},
        {"no handle", true, N, 4, 4, 4, 4, 4, 4, F, F, F, C32F, 0, CUBLAS_STATUS_NOT_INITIALIZED},
        {"lda below m", false, N, 4, 4, 4, 3, 4, 4, F, F, F, C32F, 0, CUBLAS_STATUS_INVALID_VALUE},
        {"lda below k for op(A) = A^T", false, T, 4, 4, 4, 3, 4, 4, F, F, F, C32F, 0, CUBLAS_STATUS_INVALID_VALUE},
        {"ldb below k", false, N, 4, 4, 4, 4, 3, 4, F, F, F, C32F, 0, CUBLAS_STATUS_INVALID_VALUE},
        {"ldc below m", false, N, 4, 4, 4, 4, 4, 3, F, F, F, C32F, 0, CUBLAS_STATUS_INVALID_VALUE},
        {"negative m", false, N, -1, 4, 4, 4, 4, 4, F, F, F, C32F, 0, CUBLAS_STATUS_INVALID_VALUE},
        {"negative k", false, N, 4, 4, -2, 4, 4, 4, F, F, F, C32F, 0, CUBLAS_STATUS_INVALID_VALUE},
        {"BF16 A with FP16 B", false, N, 4, 4, 4, 4, 4, 4, BF, H, F, C32F, 0, CUBLAS_STATUS_NOT_SUPPORTED},
        {"FP32 inputs, BF16 output", false, N, 4, 4, 4, 4, 4, 4, F, F, BF, C32F, 0, CUBLAS_STATUS_NOT_SUPPORTED},
        {"FP32 with integer compute", false, N, 4, 4, 4, 4, 4, 4, F, F, F, C32I, 0, CUBLAS_STATUS_NOT_SUPPORTED},
        {"INT8 to INT8", false, N, 4, 4, 4, 4, 4, 4, I8, I8, I8, C32I, 0, CUBLAS_STATUS_NOT_SUPPORTED},
        {"INT8 to INT32 with float compute", false, N, 4, 4, 4, 4, 4, 4, I8, I8, I32, C32F, 0,
         CUBLAS_STATUS_NOT_SUPPORTED},
        {"A in host memory", false, N, 4, 4, 4, 4, 4, 4, F, F, F, C32F, 1, CUBLAS_STATUS_INVALID_VALUE},
        {"C smaller than m x n", false, N, 4, 4, 4, 4, 4, 4, F, F, F, C32F, 2, CUBLAS_STATUS_INVALID_VALUE},
        {"an empty product", false, N, 0, 4, 4, 4, 4, 4, F, F, F, C32F, 0, CUBLAS_STATUS_SUCCESS},
    };
    DeviceBuffer<float> a(16), b(16), c(16), small(15);
    std::vector<float> host(16, 1.0f);
    a.put(host);
    b.put(host);
    const float one = 1.0f, zero = 0.0f;
    int ok = 0;
    for (const BadGemm &g : bad) {
        const cublasStatus_t st =
            cublasGemmEx(g.null_handle ? nullptr : handle, g.ta, N, g.m, g.n, g.k, &one,
                         g.where == 1 ? host.data() : a.p, g.at, g.lda, b.p, g.bt, g.ldb, &zero,
                         g.where == 2 ? small.p : c.p, g.ct, g.ldc, g.compute, CUBLAS_GEMM_DEFAULT);
        if (st != g.want)
            fprintf(stderr, "\n  %s: %s, expected %s", g.what, cublasGetStatusName(st), cublasGetStatusName(g.want));
        ok += st == g.want;
    }
    CU_ASSERT_EQUAL(ok, (int)(sizeof bad / sizeof bad[0]));
    EMU_OK(cudaDeviceSynchronize());
    CU_ASSERT_EQUAL(cublasDestroy(handle), CUBLAS_STATUS_SUCCESS);
}

/* ---- cuBLASLt ---------------------------------------------------------------------------------- */

void test_cublaslt_heuristic_has_no_algorithm()
{
    cublasLtHandle_t lt;
    CU_ASSERT_EQUAL(cublasLtCreate(&lt), CUBLAS_STATUS_SUCCESS);
    cublasLtMatmulDesc_t op;
    CU_ASSERT_EQUAL(cublasLtMatmulDescCreate(&op, CUBLAS_COMPUTE_32F, CUDA_R_32F), CUBLAS_STATUS_SUCCESS);
    const cublasOperation_t trans = CUBLAS_OP_T;
    CU_ASSERT_EQUAL(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSA, &trans, sizeof trans),
                    CUBLAS_STATUS_SUCCESS);
    cublasLtMatrixLayout_t a, b, c;
    CU_ASSERT_EQUAL(cublasLtMatrixLayoutCreate(&a, CUDA_R_8F_E4M3, 64, 64, 64), CUBLAS_STATUS_SUCCESS);
    CU_ASSERT_EQUAL(cublasLtMatrixLayoutCreate(&b, CUDA_R_8F_E4M3, 64, 64, 64), CUBLAS_STATUS_SUCCESS);
    CU_ASSERT_EQUAL(cublasLtMatrixLayoutCreate(&c, CUDA_R_16BF, 64, 64, 64), CUBLAS_STATUS_SUCCESS);
    cublasLtMatrixLayout_t bad_layout = nullptr;
    CU_ASSERT_EQUAL(cublasLtMatrixLayoutCreate(&bad_layout, CUDA_R_32F, 64, 64, 63), CUBLAS_STATUS_INVALID_VALUE);
    cublasLtMatmulPreference_t pref;
    CU_ASSERT_EQUAL(cublasLtMatmulPreferenceCreate(&pref), CUBLAS_STATUS_SUCCESS);
    const size_t workspace = 1 << 20;
    CU_ASSERT_EQUAL(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &workspace,
                                                         sizeof workspace),
                    CUBLAS_STATUS_SUCCESS);
    cublasLtMatmulHeuristicResult_t results[4];
    int returned = -1;
    CU_ASSERT_EQUAL(cublasLtMatmulAlgoGetHeuristic(lt, op, a, b, c, c, pref, 4, results, &returned),
                    CUBLAS_STATUS_NOT_SUPPORTED);
    CU_ASSERT_EQUAL(returned, 0);
    returned = -1;
    CU_ASSERT_EQUAL(cublasLtMatmulAlgoGetHeuristic(lt, op, a, b, c, c, pref, 0, results, &returned),
                    CUBLAS_STATUS_INVALID_VALUE);
    CU_ASSERT_EQUAL(cublasLtMatmul(lt, op, nullptr, nullptr, a, nullptr, b, nullptr, nullptr, c, nullptr, c, nullptr,
                                   nullptr, 0, nullptr),
                    CUBLAS_STATUS_NOT_SUPPORTED);
    CU_ASSERT_EQUAL(cublasLtMatmulPreferenceDestroy(pref), CUBLAS_STATUS_SUCCESS);
    CU_ASSERT_EQUAL(cublasLtMatrixLayoutDestroy(a), CUBLAS_STATUS_SUCCESS);
    CU_ASSERT_EQUAL(cublasLtMatrixLayoutDestroy(b), CUBLAS_STATUS_SUCCESS);
    CU_ASSERT_EQUAL(cublasLtMatrixLayoutDestroy(c), CUBLAS_STATUS_SUCCESS);
    CU_ASSERT_EQUAL(cublasLtMatmulDescDestroy(op), CUBLAS_STATUS_SUCCESS);
    CU_ASSERT_EQUAL(cublasLtDestroy(lt), CUBLAS_STATUS_SUCCESS);
}

const prism_test_case cases[] = {
    EMU_CASE(test_gemm_ex_matches_a_double_reference),
    EMU_CASE(test_gemm_ex_runs_on_the_handles_stream),
    EMU_CASE(test_gemm_ex_refuses_bad_arguments),
    EMU_CASE(test_cublaslt_heuristic_has_no_algorithm),
    {NULL, NULL},
};

const prism_test_suite suites[] = {{"cudaemu_cublas", cases}, {NULL, NULL}};

} /* namespace */

int main(int argc, char **argv)
{
    return prism_test_main(argc, argv, suites);
}
