/* The NCCL backend of the quantized collectives (prism/collectives_nccl.h) on one GPU, against the
 * MPI backend on one rank (MPI_COMM_SELF), byte for byte. With one rank the algorithm still runs
 * every step (quantize, all-to-all to itself, accumulate, saturate and AVG, requantize, all-gather,
 * dequantize), and the CUDA kernels give the CPU's bits, so the two backends must agree exactly:
 * all-reduce outputs, reduce-scatter slices and stats, for every wire format, op, dtype and
 * adversarial content, on a list of odd sizes and on a 1M-element tensor; then again after
 * prism_coll_nccl_set_stream. Without a device the GPU tests print "(SKIPPED: no CUDA device)"
 * and return; the argument checks, which need none, run anyway. */
#include "prism/collectives.h"
#include "prism/collectives_mpi.h"
#include "prism/collectives_nccl.h"
#include "prism/cuda.h"
#include "prism/kernels.h"
#include "testutil.h"

#include <cuda_runtime_api.h>
#include <math.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int device_count(void)
{
    static int count = -1;
    if (count < 0) {
        prism_error err = {0};
        if (prism_cuda_device_count(&count, &err) != PRISM_OK)
            count = 0;
    }
    return count;
}

static bool skip_without_device(void)
{
    if (device_count() > 0)
        return false;
    printf("(SKIPPED: no CUDA device) ");
    return true;
}

static prism_coll_comm *g_mpi_self; /* made by the first test that needs it, freed by main */

static prism_coll_comm *mpi_self(void)
{
    if (!g_mpi_self) {
        prism_error err = {0};
        CU_ASSERT_EQUAL_FATAL(prism_coll_comm_from_mpi(MPI_COMM_SELF, &g_mpi_self, &err), PRISM_OK);
    }
    return g_mpi_self;
}

static void *xmalloc(size_t n)
{
    void *p = malloc(n ? n : 1);
    CU_ASSERT_PTR_NOT_NULL_FATAL(p);
    return p;
}

static size_t dtype_size(prism_dtype dt)
{
    return dt == PRISM_DTYPE_F32 ? 4 : 2;
}

/* ---- inputs ------------------------------------------------------------------------------- */

typedef enum content { C_RANDOM, C_MAGNITUDES, C_ZEROS, C_HUGE, C_SUBNORMAL, C_NONFINITE, C_COUNT } content;

static uint64_t splitmix(uint64_t *s)
{
    uint64_t z = (*s += UINT64_C(0x9e3779b97f4a7c15));
    z = (z ^ (z >> 30)) * UINT64_C(0xbf58476d1ce4e5b9);
    z = (z ^ (z >> 27)) * UINT64_C(0x94d049bb133111eb);
    return z ^ (z >> 31);
}

static float value(content ct, prism_dtype dt, size_t i, size_t numel, uint64_t *rng)
{
    double u = (double)(splitmix(rng) >> 11) * 0x1.0p-53 * 2.0 - 1.0;
    bool f16 = dt == PRISM_DTYPE_F16;
    switch (ct) {
    case C_RANDOM: return (float)(u * 3.0);
    case C_MAGNITUDES: return (float)(u * pow(10.0, f16 ? -3 + (int)(i / 256 % 7) : -6 + (int)(i / 256 % 13)));
    case C_ZEROS: return i % 2 ? -0.0f : 0.0f;
    case C_HUGE: return i == numel / 2 ? (f16 ? 1e4f : 1e30f) : 1.0f;
    case C_SUBNORMAL: return (float)(u * (f16 ? 6e-5 : 1e-39));
    case C_NONFINITE: return i % 23 == 0 ? NAN : i % 23 == 11 ? INFINITY : i % 23 == 5 ? -INFINITY : (float)u;
    default: return 0.0f;
    }
}

static void fill(void *buf, prism_dtype dt, content ct, size_t numel, uint64_t seed)
{
    for (size_t i = 0; i < numel; i++) {
        float v = value(ct, dt, i, numel, &seed);
        if (dt == PRISM_DTYPE_F32)
            ((float *)buf)[i] = v;
        else
            ((uint16_t *)buf)[i] = dt == PRISM_DTYPE_BF16 ? prism_f32_to_bf16(v) : prism_f32_to_f16(v);
    }
}

/* ---- one case on both backends ------------------------------------------------------------ */

/* Runs reduce-scatter and all-reduce of the same inputs on the MPI and the NCCL communicator and
 * compares every byte and every stat. */
static void compare_backends(prism_coll_comm *nc, cudaStream_t stream, const prism_coll_spec *spec,
                             const size_t *sizes, size_t count, prism_dtype dt, content ct, uint64_t seed)
{
    prism_coll_tensor host[8], dev[8];
    void *expect[8];
    prism_coll_layout lay;
    prism_error err = {0};
    for (size_t t = 0; t < count; t++) {
        size_t bytes = sizes[t] * dtype_size(dt);
        host[t] = (prism_coll_tensor){xmalloc(bytes), sizes[t], dt};
        fill(host[t].data, dt, ct, sizes[t], seed + t);
        dev[t] = (prism_coll_tensor){NULL, sizes[t], dt};
        CU_ASSERT_EQUAL_FATAL(cudaMalloc(&dev[t].data, bytes ? bytes : 1), cudaSuccess);
        if (bytes)
            CU_ASSERT_EQUAL_FATAL(cudaMemcpy(dev[t].data, host[t].data, bytes, cudaMemcpyHostToDevice), cudaSuccess);
        expect[t] = xmalloc(bytes);
    }
    CU_ASSERT_EQUAL_FATAL(prism_coll_layout_of(spec, host, count, 1, &lay, &err), PRISM_OK);
    size_t slice = lay.rows_per_rank * lay.row_width;

    /* Reduce-scatter. */
    float *rs_cpu = xmalloc(slice * sizeof(float)), *rs_gpu = xmalloc(slice * sizeof(float)), *rs_dev = NULL;
    CU_ASSERT_EQUAL_FATAL(cudaMalloc((void **)&rs_dev, slice * sizeof(float) + 4), cudaSuccess);
    prism_coll_stats s_cpu, s_gpu;
    CU_ASSERT_EQUAL(prism_coll_reduce_scatter(mpi_self(), spec, host, count, rs_cpu, slice, &s_cpu, &err), PRISM_OK);
    CU_ASSERT_EQUAL(prism_coll_reduce_scatter(nc, spec, dev, count, rs_dev, slice, &s_gpu, &err), PRISM_OK);
    CU_ASSERT_EQUAL_FATAL(cudaStreamSynchronize(stream), cudaSuccess);
    if (slice)
        CU_ASSERT_EQUAL_FATAL(cudaMemcpy(rs_gpu, rs_dev, slice * sizeof(float), cudaMemcpyDeviceToHost), cudaSuccess);
    CU_ASSERT_EQUAL(memcmp(rs_cpu, rs_gpu, slice * sizeof(float)), 0);
    CU_ASSERT_EQUAL(memcmp(&s_cpu, &s_gpu, sizeof s_cpu), 0);

    /* All-reduce, in place. */
    CU_ASSERT_EQUAL(prism_coll_allreduce(mpi_self(), spec, host, count, &s_cpu, &err), PRISM_OK);
    CU_ASSERT_EQUAL(prism_coll_allreduce(nc, spec, dev, count, &s_gpu, &err), PRISM_OK);
    CU_ASSERT_EQUAL_FATAL(cudaStreamSynchronize(stream), cudaSuccess);
    CU_ASSERT_EQUAL(memcmp(&s_cpu, &s_gpu, sizeof s_cpu), 0);
    for (size_t t = 0; t < count; t++) {
        size_t bytes = sizes[t] * dtype_size(dt);
        if (bytes)
            CU_ASSERT_EQUAL_FATAL(cudaMemcpy(expect[t], dev[t].data, bytes, cudaMemcpyDeviceToHost), cudaSuccess);
        if (memcmp(expect[t], host[t].data, bytes) != 0) {
            printf("\n%s %s dtype %d content %d tensor %zu: NCCL and MPI differ\n", prism_precision_name(spec->wire),
                   spec->op ? "avg" : "sum", (int)dt, (int)ct, t);
            CU_FAIL("NCCL result differs from MPI");
        }
        free(host[t].data);
        free(expect[t]);
        cudaFree(dev[t].data);
    }
    free(rs_cpu);
    free(rs_gpu);
    cudaFree(rs_dev);
}

static const prism_precision wires[] = {PRISM_PRECISION_INT8, PRISM_PRECISION_FP8_E4M3, PRISM_PRECISION_FP8_E5M2,
                                        PRISM_PRECISION_INT4};

typedef struct gpu_fixture {
    ncclComm_t nccl;
    cudaStream_t stream;
    prism_coll_comm *comm;
} gpu_fixture;

static void fixture_open(gpu_fixture *f)
{
    int dev0 = 0;
    CU_ASSERT_EQUAL_FATAL(ncclCommInitAll(&f->nccl, 1, &dev0), ncclSuccess);
    CU_ASSERT_EQUAL_FATAL(cudaStreamCreate(&f->stream), cudaSuccess);
    prism_error err = {0};
    CU_ASSERT_EQUAL_FATAL(prism_coll_comm_from_nccl(f->nccl, f->stream, &f->comm, &err), PRISM_OK);
    CU_ASSERT_EQUAL(prism_coll_rank(f->comm), 0);
    CU_ASSERT_EQUAL(prism_coll_size(f->comm), 1);
}

static void fixture_close(gpu_fixture *f)
{
    prism_coll_comm_destroy(f->comm);
    cudaStreamDestroy(f->stream);
    ncclCommDestroy(f->nccl);
}

static void test_nccl_matches_mpi_byte_for_byte(void)
{
    if (skip_without_device())
        return;
    gpu_fixture f;
    fixture_open(&f);
    static const size_t list[] = {1000, 3, 64, 0, 513, 1};
    uint64_t seed = 1;
    for (size_t w = 0; w < sizeof wires / sizeof wires[0]; w++)
        for (int op = 0; op < 2; op++)
            for (int dt = 0; dt < 3; dt++)
                for (int ct = 0; ct < C_COUNT; ct++)
                    for (int mode = 0; mode < 2; mode++) {
                        prism_coll_spec spec = {.wire = wires[w], .op = (prism_coll_op)op,
                                                .scale_mode = (prism_scale_mode)mode};
                        compare_backends(f.comm, f.stream, &spec, list, 6, (prism_dtype)dt, (content)ct, seed++);
                    }
    /* Other row widths, and one tensor of 1M + 5 elements (scratch grows). */
    static const uint32_t widths[] = {8, 1024, 65536};
    for (size_t w = 0; w < sizeof widths / sizeof widths[0]; w++) {
        prism_coll_spec spec = {.wire = PRISM_PRECISION_INT4, .row_width = widths[w]};
        compare_backends(f.comm, f.stream, &spec, list, 6, PRISM_DTYPE_BF16, C_RANDOM, seed++);
    }
    static const size_t big[] = {(1u << 20) + 5};
    prism_coll_spec spec = {.wire = PRISM_PRECISION_FP8_E4M3, .op = PRISM_COLL_AVG};
    compare_backends(f.comm, f.stream, &spec, big, 1, PRISM_DTYPE_F32, C_NONFINITE, seed++);
    fixture_close(&f);
}

static void test_nccl_set_stream_keeps_results(void)
{
    if (skip_without_device())
        return;
    gpu_fixture f;
    fixture_open(&f);
    static const size_t list[] = {4099, 7};
    prism_coll_spec spec = {.wire = PRISM_PRECISION_FP8_E5M2};
    compare_backends(f.comm, f.stream, &spec, list, 2, PRISM_DTYPE_F16, C_MAGNITUDES, 11);
    cudaStream_t other;
    CU_ASSERT_EQUAL_FATAL(cudaStreamCreate(&other), cudaSuccess);
    prism_error err = {0};
    CU_ASSERT_EQUAL(prism_coll_nccl_set_stream(f.comm, other, &err), PRISM_OK);
    compare_backends(f.comm, other, &spec, list, 2, PRISM_DTYPE_F16, C_MAGNITUDES, 12);
    CU_ASSERT_EQUAL(prism_coll_nccl_set_stream(f.comm, f.stream, &err), PRISM_OK);
    fixture_close(&f);
    cudaStreamDestroy(other);
}

/* Needs no device: refused before any CUDA or NCCL call. */
static void test_nccl_arguments_are_checked(void)
{
    prism_coll_comm *c = NULL;
    prism_error err = {0};
    CU_ASSERT_EQUAL(prism_coll_comm_from_nccl(NULL, NULL, &c, &err), PRISM_ERR_INVALID);
    CU_ASSERT_PTR_NULL(c);
    CU_ASSERT_STRING_EQUAL(err.message, "comm: NULL (an ncclComm_t the caller made)");
    CU_ASSERT_EQUAL(prism_coll_nccl_set_stream(mpi_self(), NULL, &err), PRISM_ERR_INVALID);
    CU_ASSERT_STRING_EQUAL(err.message, "comm: not an NCCL communicator");
    CU_ASSERT_EQUAL(prism_coll_nccl_set_stream(NULL, NULL, &err), PRISM_ERR_INVALID);
}

static const prism_test_case nccl_tests[] = {
    {"test_nccl_arguments_are_checked", test_nccl_arguments_are_checked},
    {"test_nccl_matches_mpi_byte_for_byte", test_nccl_matches_mpi_byte_for_byte},
    {"test_nccl_set_stream_keeps_results", test_nccl_set_stream_keeps_results},
    {NULL, NULL},
};

int main(int argc, char **argv)
{
    MPI_Init(&argc, &argv);
    if (device_count() == 0)
        printf("SKIPPED: no CUDA device (the GPU-only checks below pass without running)\n");
    const prism_test_suite suites[] = {{"nccl", nccl_tests}, {NULL, NULL}};
    int rc = prism_test_main(argc, argv, suites);
    prism_coll_comm_destroy(g_mpi_self);
    MPI_Finalize();
    return rc;
}
