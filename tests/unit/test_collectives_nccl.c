/* The NCCL backend of the quantized collectives (prism/collectives_nccl.h) against the MPI backend on
 * the same number of ranks N, byte for byte. Run it under `mpirun -np N`, N = 1 to 4.
 *
 * Every MPI rank runs the MPI backend (over MPI_COMM_WORLD) on its own inputs, which depend only on
 * the rank and the case, and rank 0 gathers what every rank got: statuses, messages, stats, the
 * reduce-scatter slice and the all-reduce outputs. Rank 0 then runs the NCCL backend with N ranks
 * as N threads of its own process, rank r on CUDA device r with a stream and an ncclComm of its own
 * (ncclCommInitAll), each thread making rank r's inputs again and the same calls; after the join it
 * compares every thread's results with MPI rank r's. Both backends run the same algorithm with
 * kernels that give the CPU's bits (collectives.h), so they must agree exactly: every wire format,
 * op, dtype and adversarial content on a list of odd sizes, other row widths, dtypes that differ
 * between ranks, an empty list, one element (one row: every other slice is padding), a big tensor
 * (TEST_BIG_NUMEL elements), after prism_coll_nccl_set_stream, and calls that one rank refuses
 * (PRISM_ERR_INVALID on every rank, with the same messages on both backends).
 *
 * Every rank makes the MPI calls of all of a test's cases first; rank 0 alone then runs the NCCL
 * side, so a failure there never leaves another rank waiting in MPI. CUnit is not thread-safe: the
 * threads only record, the main thread asserts after the join. Ranks other than 0 check nothing
 * of the collectives (rank 0 checks their results), print nothing on stdout, and every rank exits
 * with the worst status of all.
 *
 * Rank 0 needs N CUDA devices (on the emulated build, PRISM_CUDAEMU_DEVICES, 4 by default). With
 * fewer, it prints "SKIPPED: needs N CUDA devices (this machine has M)" and the GPU tests pass
 * without running; the argument checks, which need no device, run anyway. */
#define _POSIX_C_SOURCE 200809L

#include "prism/collectives.h"
#include "prism/collectives_mpi.h"
#include "prism/collectives_nccl.h"
#include "prism/cuda.h"
#include "prism/kernels.h"
#include "testutil.h"

#include <cuda_runtime_api.h>
#include <limits.h>
#include <math.h>
#include <mpi.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The big tensor's elements; the emulated build may ask for fewer (it runs the kernels on the CPU). */
#ifndef TEST_BIG_NUMEL
#define TEST_BIG_NUMEL ((1u << 20) + 5)
#endif

#define MAX_RANKS 4
#define MAX_TENSORS 8

static int g_rank, g_world;
static bool g_gpu;             /* rank 0 has g_world CUDA devices: the same answer on every rank */
static prism_coll_comm *g_mpi; /* over MPI_COMM_WORLD, made and freed by main */

/* Allocation failure is not an outcome of this test: it ends the job (from any thread). */
static void *xmalloc(size_t n)
{
    void *p = calloc(1, n ? n : 1);
    if (!p) {
        fprintf(stderr, "test_collectives_nccl: out of memory (%zu bytes)\n", n);
        abort();
    }
    return p;
}

static bool skip_without_devices(void)
{
    if (g_gpu)
        return false;
    printf("(SKIPPED: too few CUDA devices) ");
    return true;
}

/* ---- the cases ---------------------------------------------------------------------------- */

typedef enum content { C_RANDOM, C_MAGNITUDES, C_ZEROS, C_HUGE, C_SUBNORMAL, C_NONFINITE, C_COUNT } content;

/* What the last rank gets wrong. */
typedef enum fault { F_NONE, F_SIZES, F_DTYPE } fault;

typedef struct coll_case {
    prism_coll_spec spec;
    const size_t *sizes; /* of every rank's tensors (but see F_SIZES) */
    size_t count;        /* at most MAX_TENSORS */
    prism_dtype dtype;   /* of every rank's tensors (but see mixed, F_DTYPE) */
    bool mixed;          /* rank r's tensors are dtype (dtype + r) % 3 */
    content ct;
    fault fault;         /* F_SIZES: its tensor 0 is one element short; F_DTYPE: tensor 1's dtype is 7 */
    uint64_t seed;
} coll_case;

/* Bytes an element: the data of a tensor that says dtype 7 is F32. */
static size_t dtype_size(prism_dtype dt)
{
    return dt == PRISM_DTYPE_BF16 || dt == PRISM_DTYPE_F16 ? 2 : 4;
}

/* The dtype rank r's tensor t says it has (7 is refused); and the one its data is in. */
static prism_dtype declared_dtype(const coll_case *k, int rank, int world, size_t t)
{
    if (k->fault == F_DTYPE && rank == world - 1 && t == 1)
        return (prism_dtype)7;
    return k->mixed ? (prism_dtype)(((int)k->dtype + rank) % 3) : k->dtype;
}

static prism_dtype data_dtype(const coll_case *k, int rank, int world, size_t t)
{
    prism_dtype dt = declared_dtype(k, rank, world, t);
    return (int)dt < 3 ? dt : PRISM_DTYPE_F32;
}

static size_t numel_of(const coll_case *k, int rank, int world, size_t t)
{
    if (k->fault == F_SIZES && rank == world - 1 && t == 0 && k->sizes[0] > 0)
        return k->sizes[0] - 1;
    return k->sizes[t];
}

/* Every rank's calls fail with PRISM_ERR_INVALID when one rank refuses its arguments or the ranks'
 * lists differ (which takes two ranks). */
static prism_status expected_status(const coll_case *k, int world)
{
    bool refused = k->fault == F_DTYPE || (k->fault == F_SIZES && world > 1 && k->sizes[0] > 0);
    return refused ? PRISM_ERR_INVALID : PRISM_OK;
}

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

/* Rank r's inputs of a case, in host memory: MPI rank r and NCCL thread r make the same ones. */
static void make_inputs(const coll_case *k, int rank, int world, prism_coll_tensor *host)
{
    for (size_t t = 0; t < k->count; t++) {
        prism_dtype dt = data_dtype(k, rank, world, t);
        size_t n = numel_of(k, rank, world, t);
        host[t] = (prism_coll_tensor){xmalloc(n * dtype_size(dt)), n, declared_dtype(k, rank, world, t)};
        fill(host[t].data, dt, k->ct, n, k->seed * 64 + (uint64_t)rank * MAX_TENSORS + t);
    }
}

static void free_inputs(const coll_case *k, prism_coll_tensor *host)
{
    for (size_t t = 0; t < k->count; t++)
        free(host[t].data);
}

/* The reduce-scatter slice of the case's nominal list on `world` ranks, in floats. */
static size_t slice_of(const coll_case *k, int world)
{
    prism_coll_tensor desc[MAX_TENSORS];
    for (size_t t = 0; t < k->count; t++)
        desc[t] = (prism_coll_tensor){NULL, k->sizes[t], k->dtype};
    prism_coll_layout lay;
    prism_error err = {0};
    if (prism_coll_layout_of(&k->spec, desc, k->count, world, &lay, &err) != PRISM_OK) {
        fprintf(stderr, "test_collectives_nccl: a case's layout: %s\n", err.message);
        abort();
    }
    return lay.rows_per_rank * lay.row_width;
}

static void describe(const coll_case *k)
{
    printf("%s %s dtype %d%s content %d %s width %u, %zu tensors, fault %d, seed %llu",
           prism_precision_name(k->spec.wire), k->spec.op == PRISM_COLL_AVG ? "avg" : "sum", (int)k->dtype,
           k->mixed ? " (mixed)" : "", (int)k->ct, k->spec.scale_mode == PRISM_SCALE_POW2 ? "pow2" : "fp32",
           k->spec.row_width, k->count, (int)k->fault, (unsigned long long)k->seed);
}

/* ---- what one rank's calls gave ------------------------------------------------------------ */

/* One rank's results of a case, the same bytes on both backends: a result_head, the
 * reduce-scatter slice (floats), then the all-reduce outputs of its tensors one after the other
 * (in their dtypes, zeros up to 4 bytes an element). */
typedef struct result_head {
    int32_t rs_status, ar_status;
    prism_coll_stats rs_stats, ar_stats;
    char rs_message[sizeof(((prism_error *)0)->message)];
    char ar_message[sizeof(((prism_error *)0)->message)];
} result_head;

static size_t total_numel(const coll_case *k)
{
    size_t n = 0;
    for (size_t t = 0; t < k->count; t++)
        n += k->sizes[t];
    return n;
}

static size_t result_bytes(const coll_case *k, size_t slice)
{
    return sizeof(result_head) + slice * sizeof(float) + total_numel(k) * 4;
}

/* What the slice holds before the call: a refused call must leave it so, on both backends. */
#define SLICE_BYTE 0xa5

static float *result_slice(unsigned char *blob)
{
    return (float *)(void *)(blob + sizeof(result_head));
}

static unsigned char *result_output(unsigned char *blob, size_t slice, const prism_coll_tensor *tensors, size_t t)
{
    unsigned char *p = blob + sizeof(result_head) + slice * sizeof(float);
    for (size_t i = 0; i < t; i++)
        p += tensors[i].numel * dtype_size(tensors[i].dtype);
    return p;
}

/* ---- the MPI side, on every rank ----------------------------------------------------------- */

/* This rank's results of a case on the MPI backend (host memory). */
static void run_mpi(const coll_case *k, size_t slice, unsigned char *blob)
{
    prism_coll_tensor host[MAX_TENSORS];
    make_inputs(k, g_rank, g_world, host);
    result_head h;
    memset(&h, 0, sizeof h);
    memset(result_slice(blob), SLICE_BYTE, slice * sizeof(float));
    prism_error err = {0};
    h.rs_status = (int32_t)prism_coll_reduce_scatter(g_mpi, &k->spec, host, k->count, result_slice(blob), slice,
                                                     &h.rs_stats, &err);
    memcpy(h.rs_message, err.message, sizeof h.rs_message);
    memset(&err, 0, sizeof err);
    h.ar_status = (int32_t)prism_coll_allreduce(g_mpi, &k->spec, host, k->count, &h.ar_stats, &err);
    memcpy(h.ar_message, err.message, sizeof h.ar_message);
    memcpy(blob, &h, sizeof h);
    for (size_t t = 0; t < k->count; t++)
        memcpy(result_output(blob, slice, host, t), host[t].data,
               host[t].numel * dtype_size(data_dtype(k, g_rank, g_world, t)));
    free_inputs(k, host);
}

/* Every rank: the MPI backend on its inputs of every case; rank 0 gets all ranks' results
 * (g_world results of result_bytes each per case, rank after rank), the others NULL. */
static unsigned char **mpi_results(const coll_case *cases, size_t n)
{
    unsigned char **all = g_rank == 0 ? xmalloc(n * sizeof *all) : NULL;
    for (size_t i = 0; i < n; i++) {
        size_t slice = slice_of(&cases[i], g_world), bytes = result_bytes(&cases[i], slice);
        if (bytes > INT_MAX) {
            fprintf(stderr, "test_collectives_nccl: a case of %zu bytes is too big to gather\n", bytes);
            MPI_Abort(MPI_COMM_WORLD, 1);
        }
        unsigned char *mine = xmalloc(bytes);
        run_mpi(&cases[i], slice, mine);
        if (all)
            all[i] = xmalloc(bytes * (size_t)g_world);
        MPI_Gather(mine, (int)bytes, MPI_BYTE, all ? all[i] : NULL, (int)bytes, MPI_BYTE, 0, MPI_COMM_WORLD);
        free(mine);
    }
    return all;
}

static void free_results(unsigned char **all, size_t n)
{
    for (size_t i = 0; all && i < n; i++)
        free(all[i]);
    free(all);
}

/* ---- the NCCL side, on rank 0: one thread per rank ----------------------------------------- */

typedef struct gpu_fixture {
    int n;
    ncclComm_t nccl[MAX_RANKS];
    cudaStream_t own[MAX_RANKS];    /* made on device r */
    cudaStream_t stream[MAX_RANKS]; /* the one comm[r] runs on now */
    prism_coll_comm *comm[MAX_RANKS];
} gpu_fixture;

/* Shared by the threads of one case. */
typedef struct nccl_case {
    const coll_case *k;
    const gpu_fixture *f;
    size_t slice;
    pthread_barrier_t ready;
    atomic_int setup_failed;
} nccl_case;

typedef struct nccl_rank {
    nccl_case *run;
    int rank;
    unsigned char *blob;  /* its results, result_bytes */
    char failure[200];    /* the first CUDA call that failed, "" when none */
} nccl_rank;

static bool cuda_ok(nccl_rank *me, cudaError_t rc, const char *call)
{
    if (rc == cudaSuccess)
        return true;
    if (!me->failure[0])
        snprintf(me->failure, sizeof me->failure, "rank %d: %s: %s", me->rank, call, cudaGetErrorString(rc));
    return false;
}

/* Rank r's calls on its device. The threads wait for each other before the first collective call
 * and all skip the calls when one could not set up, so none is left waiting in NCCL for it. */
static void *nccl_rank_main(void *arg)
{
    nccl_rank *me = arg;
    nccl_case *run = me->run;
    const coll_case *k = run->k;
    const int r = me->rank, world = run->f->n;
    cudaStream_t stream = run->f->stream[r];
    prism_coll_tensor host[MAX_TENSORS], dev[MAX_TENSORS];
    float *rs_dev = NULL;
    make_inputs(k, r, world, host);
    bool ok = cuda_ok(me, cudaSetDevice(r), "cudaSetDevice");
    for (size_t t = 0; t < k->count; t++) {
        size_t bytes = host[t].numel * dtype_size(data_dtype(k, r, world, t));
        dev[t] = (prism_coll_tensor){NULL, host[t].numel, host[t].dtype};
        ok = ok && cuda_ok(me, cudaMalloc(&dev[t].data, bytes ? bytes : 1), "cudaMalloc");
        ok = ok && cuda_ok(me, cudaMemcpy(dev[t].data, host[t].data, bytes, cudaMemcpyHostToDevice), "cudaMemcpy");
    }
    ok = ok && cuda_ok(me, cudaMalloc((void **)&rs_dev, run->slice * sizeof(float) + 4), "cudaMalloc");
    ok = ok && cuda_ok(me, cudaMemset(rs_dev, SLICE_BYTE, run->slice * sizeof(float)), "cudaMemset");
    if (!ok)
        atomic_store(&run->setup_failed, 1);
    pthread_barrier_wait(&run->ready);

    if (!atomic_load(&run->setup_failed)) {
        result_head h;
        memset(&h, 0, sizeof h);
        prism_error err = {0};
        prism_coll_comm *c = run->f->comm[r];
        h.rs_status = (int32_t)prism_coll_reduce_scatter(c, &k->spec, dev, k->count, rs_dev, run->slice,
                                                         &h.rs_stats, &err);
        memcpy(h.rs_message, err.message, sizeof h.rs_message);
        if (cuda_ok(me, cudaStreamSynchronize(stream), "cudaStreamSynchronize (reduce-scatter)"))
            cuda_ok(me, cudaMemcpy(result_slice(me->blob), rs_dev, run->slice * sizeof(float), cudaMemcpyDeviceToHost),
                    "cudaMemcpy (slice)");
        memset(&err, 0, sizeof err);
        h.ar_status = (int32_t)prism_coll_allreduce(c, &k->spec, dev, k->count, &h.ar_stats, &err);
        memcpy(h.ar_message, err.message, sizeof h.ar_message);
        bool synced = cuda_ok(me, cudaStreamSynchronize(stream), "cudaStreamSynchronize (all-reduce)");
        for (size_t t = 0; synced && t < k->count; t++)
            cuda_ok(me, cudaMemcpy(result_output(me->blob, run->slice, host, t), dev[t].data,
                                   host[t].numel * dtype_size(data_dtype(k, r, world, t)), cudaMemcpyDeviceToHost),
                    "cudaMemcpy (outputs)");
        memcpy(me->blob, &h, sizeof h);
    }
    for (size_t t = 0; t < k->count; t++)
        cudaFree(dev[t].data);
    cudaFree(rs_dev);
    free_inputs(k, host);
    return NULL;
}

static void report(const coll_case *k, int rank, const char *what)
{
    printf("\n");
    describe(k);
    printf(", %d ranks, rank %d: %s", g_world, rank, what);
}

/* One assertion, with the case, the rank and what differs printed when it fails. */
#define EXPECT(cond, what)                                                                                   \
    do {                                                                                                     \
        bool ok_ = (cond);                                                                                   \
        CU_ASSERT(ok_);                                                                                      \
        if (!ok_)                                                                                            \
            report(k, rank, what);                                                                           \
    } while (0)

/* Rank r's NCCL results against its MPI results, part by part. */
static void compare_rank(const coll_case *k, int rank, size_t slice, unsigned char *mpi, unsigned char *nccl)
{
    result_head e, g;
    memcpy(&e, mpi, sizeof e);
    memcpy(&g, nccl, sizeof g);
    const int32_t want = (int32_t)expected_status(k, g_world);
    EXPECT(e.rs_status == want && e.ar_status == want, "the MPI backend's statuses are not the expected ones");
    EXPECT(g.rs_status == e.rs_status && g.ar_status == e.ar_status, "statuses differ");
    EXPECT(memcmp(&g.rs_stats, &e.rs_stats, sizeof e.rs_stats) == 0 &&
               memcmp(&g.ar_stats, &e.ar_stats, sizeof e.ar_stats) == 0,
           "stats differ");
    bool same = strcmp(g.rs_message, e.rs_message) == 0 && strcmp(g.ar_message, e.ar_message) == 0;
    EXPECT(same, "messages differ");
    if (!same)
        printf("\n  MPI  \"%s\" / \"%s\"\n  NCCL \"%s\" / \"%s\"", e.rs_message, e.ar_message, g.rs_message,
               g.ar_message);
    EXPECT(memcmp(result_slice(nccl), result_slice(mpi), slice * sizeof(float)) == 0, "reduce-scatter slices differ");
    prism_coll_tensor shapes[MAX_TENSORS];
    for (size_t t = 0; t < k->count; t++)
        shapes[t] = (prism_coll_tensor){NULL, numel_of(k, rank, g_world, t), data_dtype(k, rank, g_world, t)};
    for (size_t t = 0; t < k->count; t++) {
        char what[64];
        snprintf(what, sizeof what, "all-reduce outputs of tensor %zu differ", t);
        EXPECT(memcmp(result_output(nccl, slice, shapes, t), result_output(mpi, slice, shapes, t),
                      shapes[t].numel * dtype_size(shapes[t].dtype)) == 0,
               what);
    }
}

/* Runs a case on the fixture's N ranks (one thread each) and compares every rank's results with
 * `expected` (the MPI backend's, g_world results). */
static void check_case(const gpu_fixture *f, const coll_case *k, unsigned char *expected)
{
    nccl_case run = {.k = k, .f = f, .slice = slice_of(k, f->n)};
    atomic_init(&run.setup_failed, 0);
    size_t bytes = result_bytes(k, run.slice);
    nccl_rank ranks[MAX_RANKS];
    pthread_t threads[MAX_RANKS];
    CU_ASSERT_EQUAL_FATAL(pthread_barrier_init(&run.ready, NULL, (unsigned)f->n), 0);
    int started = 0;
    for (int r = 0; r < f->n; r++) {
        ranks[r] = (nccl_rank){.run = &run, .rank = r, .blob = xmalloc(bytes)};
        if (pthread_create(&threads[r], NULL, nccl_rank_main, &ranks[r]) != 0)
            break;
        started++;
    }
    /* A rank without its thread would leave the others at the barrier forever. */
    if (started < f->n) {
        fprintf(stderr, "test_collectives_nccl: pthread_create failed\n");
        abort();
    }
    for (int r = 0; r < f->n; r++)
        pthread_join(threads[r], NULL);
    pthread_barrier_destroy(&run.ready);
    for (int r = 0; r < f->n; r++) {
        bool ran = !ranks[r].failure[0] && !atomic_load(&run.setup_failed);
        CU_ASSERT(ran);
        if (!ran)
            report(k, r, ranks[r].failure[0] ? ranks[r].failure : "another rank could not set up");
        else
            compare_rank(k, r, run.slice, expected + (size_t)r * bytes, ranks[r].blob);
        free(ranks[r].blob);
    }
}

/* N ranks on devices 0..N-1 (ncclCommInitAll), each with a stream of its own device. */
static void fixture_open(gpu_fixture *f)
{
    memset(f, 0, sizeof *f);
    f->n = g_world;
    int devs[MAX_RANKS];
    for (int r = 0; r < f->n; r++)
        devs[r] = r;
    CU_ASSERT_EQUAL_FATAL(ncclCommInitAll(f->nccl, f->n, devs), ncclSuccess);
    for (int r = 0; r < f->n; r++) {
        CU_ASSERT_EQUAL_FATAL(cudaSetDevice(r), cudaSuccess);
        CU_ASSERT_EQUAL_FATAL(cudaStreamCreate(&f->own[r]), cudaSuccess);
        f->stream[r] = f->own[r];
        prism_error err = {0};
        CU_ASSERT_EQUAL_FATAL(prism_coll_comm_from_nccl(f->nccl[r], f->own[r], &f->comm[r], &err), PRISM_OK);
        CU_ASSERT_EQUAL(prism_coll_rank(f->comm[r]), r);
        CU_ASSERT_EQUAL(prism_coll_size(f->comm[r]), f->n);
    }
    CU_ASSERT_EQUAL(cudaSetDevice(0), cudaSuccess);
}

static void fixture_close(gpu_fixture *f)
{
    for (int r = 0; r < f->n; r++) {
        prism_coll_comm_destroy(f->comm[r]);
        cudaSetDevice(r);
        cudaStreamDestroy(f->own[r]);
        ncclCommDestroy(f->nccl[r]);
    }
    cudaSetDevice(0);
}

/* Every rank: the MPI results of the cases; rank 0: the same cases on NCCL, compared. */
static void run_cases(const coll_case *cases, size_t n)
{
    unsigned char **expected = mpi_results(cases, n);
    if (g_rank == 0) {
        gpu_fixture f;
        fixture_open(&f);
        for (size_t i = 0; i < n; i++)
            check_case(&f, &cases[i], expected[i]);
        fixture_close(&f);
        printf("(%zu cases on %d rank%s) ", n, g_world, g_world == 1 ? "" : "s");
    }
    free_results(expected, n);
}

/* ---- the tests ----------------------------------------------------------------------------- */

static const prism_precision wires[] = {PRISM_PRECISION_INT8, PRISM_PRECISION_FP8_E4M3, PRISM_PRECISION_FP8_E5M2,
                                        PRISM_PRECISION_INT4};
#define WIRES (sizeof wires / sizeof wires[0])

static void test_nccl_matches_mpi_byte_for_byte(void)
{
    if (skip_without_devices())
        return;
    static const size_t list[] = {1000, 3, 64, 0, 513, 1};
    static const uint32_t widths[] = {8, 1024, 65536};
    static const size_t one[] = {1};
    static const size_t big[] = {TEST_BIG_NUMEL};
    enum { TABLE = WIRES * 2 * 3 * C_COUNT * 2, CASES = TABLE + 3 + WIRES + 2 + 1 };
    coll_case *cases = xmalloc(CASES * sizeof *cases);
    size_t n = 0;
    uint64_t seed = 1;
    /* Every wire, op, dtype, content and scale mode on the odd sizes. */
    for (size_t w = 0; w < WIRES; w++)
        for (int op = 0; op < 2; op++)
            for (int dt = 0; dt < 3; dt++)
                for (int ct = 0; ct < C_COUNT; ct++)
                    for (int mode = 0; mode < 2; mode++)
                        cases[n++] = (coll_case){
                            .spec = {.wire = wires[w], .op = (prism_coll_op)op, .scale_mode = (prism_scale_mode)mode},
                            .sizes = list, .count = 6, .dtype = (prism_dtype)dt, .ct = (content)ct, .seed = seed++};
    /* Other row widths (65536: fewer rows than some worlds have ranks). */
    for (size_t w = 0; w < sizeof widths / sizeof widths[0]; w++)
        cases[n++] = (coll_case){.spec = {.wire = PRISM_PRECISION_INT4, .row_width = widths[w]}, .sizes = list,
                                 .count = 6, .dtype = PRISM_DTYPE_BF16, .ct = C_RANDOM, .seed = seed++};
    /* Each rank's tensors in a dtype of their own. */
    for (size_t w = 0; w < WIRES; w++)
        cases[n++] = (coll_case){.spec = {.wire = wires[w], .op = PRISM_COLL_AVG}, .sizes = list, .count = 6,
                                 .dtype = PRISM_DTYPE_F32, .mixed = true, .ct = C_MAGNITUDES, .seed = seed++};
    /* An empty list, and one row for all ranks (the others' slices are padding). */
    cases[n++] = (coll_case){.spec = {.wire = PRISM_PRECISION_INT8}, .sizes = one, .count = 0,
                             .dtype = PRISM_DTYPE_F32, .ct = C_RANDOM, .seed = seed++};
    cases[n++] = (coll_case){.spec = {.wire = PRISM_PRECISION_FP8_E4M3, .op = PRISM_COLL_AVG}, .sizes = one,
                             .count = 1, .dtype = PRISM_DTYPE_F32, .ct = C_RANDOM, .seed = seed++};
    /* A big tensor (the scratch grows). */
    cases[n++] = (coll_case){.spec = {.wire = PRISM_PRECISION_FP8_E4M3, .op = PRISM_COLL_AVG}, .sizes = big,
                             .count = 1, .dtype = PRISM_DTYPE_F32, .ct = C_NONFINITE, .seed = seed++};
    CU_ASSERT_EQUAL(n, CASES);
    run_cases(cases, n);
    free(cases);
}

static void test_nccl_set_stream_keeps_results(void)
{
    if (skip_without_devices())
        return;
    static const size_t list[] = {4099, 7};
    const coll_case cases[] = {
        {.spec = {.wire = PRISM_PRECISION_FP8_E5M2}, .sizes = list, .count = 2, .dtype = PRISM_DTYPE_F16,
         .ct = C_MAGNITUDES, .seed = 11},
        {.spec = {.wire = PRISM_PRECISION_FP8_E5M2}, .sizes = list, .count = 2, .dtype = PRISM_DTYPE_F16,
         .ct = C_MAGNITUDES, .seed = 12},
    };
    unsigned char **expected = mpi_results(cases, 2);
    if (g_rank == 0) {
        gpu_fixture f;
        fixture_open(&f);
        check_case(&f, &cases[0], expected[0]);
        cudaStream_t other[MAX_RANKS] = {0};
        prism_error err = {0};
        for (int r = 0; r < f.n; r++) {
            CU_ASSERT_EQUAL_FATAL(cudaSetDevice(r), cudaSuccess);
            CU_ASSERT_EQUAL_FATAL(cudaStreamCreate(&other[r]), cudaSuccess);
            CU_ASSERT_EQUAL(prism_coll_nccl_set_stream(f.comm[r], other[r], &err), PRISM_OK);
            f.stream[r] = other[r];
        }
        CU_ASSERT_EQUAL(cudaSetDevice(0), cudaSuccess);
        check_case(&f, &cases[1], expected[1]);
        for (int r = 0; r < f.n; r++) {
            CU_ASSERT_EQUAL(prism_coll_nccl_set_stream(f.comm[r], f.own[r], &err), PRISM_OK);
            f.stream[r] = f.own[r];
        }
        fixture_close(&f);
        for (int r = 0; r < f.n; r++) {
            cudaSetDevice(r);
            cudaStreamDestroy(other[r]);
        }
        cudaSetDevice(0);
    }
    free_results(expected, 2);
}

/* The last rank refuses its own arguments, or passes other sizes (on two ranks or more): every
 * rank's calls are PRISM_ERR_INVALID with the same message on both backends, nothing is sent, and
 * the communicators still work for the next call. */
static void test_nccl_refused_call_is_invalid_on_every_rank(void)
{
    if (skip_without_devices())
        return;
    static const size_t list[] = {1000, 3, 64, 0, 513, 1};
    const coll_case cases[] = {
        {.spec = {.wire = PRISM_PRECISION_INT8}, .sizes = list, .count = 6, .dtype = PRISM_DTYPE_BF16,
         .ct = C_RANDOM, .fault = F_DTYPE, .seed = 21},
        {.spec = {.wire = PRISM_PRECISION_FP8_E4M3}, .sizes = list, .count = 6, .dtype = PRISM_DTYPE_F32,
         .ct = C_RANDOM, .fault = F_SIZES, .seed = 22},
        {.spec = {.wire = PRISM_PRECISION_INT4}, .sizes = list, .count = 6, .dtype = PRISM_DTYPE_F16,
         .ct = C_RANDOM, .seed = 23},
    };
    run_cases(cases, sizeof cases / sizeof cases[0]);
}

/* Needs no device: refused before any CUDA or NCCL call. */
static void test_nccl_arguments_are_checked(void)
{
    prism_coll_comm *c = NULL;
    prism_error err = {0};
    CU_ASSERT_EQUAL(prism_coll_comm_from_nccl(NULL, NULL, &c, &err), PRISM_ERR_INVALID);
    CU_ASSERT_PTR_NULL(c);
    CU_ASSERT_STRING_EQUAL(err.message, "comm: NULL (an ncclComm_t the caller made)");
    CU_ASSERT_EQUAL(prism_coll_nccl_set_stream(g_mpi, NULL, &err), PRISM_ERR_INVALID);
    CU_ASSERT_STRING_EQUAL(err.message, "comm: not an NCCL communicator");
    CU_ASSERT_EQUAL(prism_coll_nccl_set_stream(NULL, NULL, &err), PRISM_ERR_INVALID);
}

static const prism_test_case nccl_tests[] = {
    {"test_nccl_arguments_are_checked", test_nccl_arguments_are_checked},
    {"test_nccl_matches_mpi_byte_for_byte", test_nccl_matches_mpi_byte_for_byte},
    {"test_nccl_set_stream_keeps_results", test_nccl_set_stream_keeps_results},
    {"test_nccl_refused_call_is_invalid_on_every_rank", test_nccl_refused_call_is_invalid_on_every_rank},
    {NULL, NULL},
};

int main(int argc, char **argv)
{
    /* Only the main thread calls MPI; rank 0's other threads (ours, CUDA's, NCCL's) do not. */
    int provided = MPI_THREAD_SINGLE;
    MPI_Init_thread(&argc, &argv, MPI_THREAD_FUNNELED, &provided);
    MPI_Comm_rank(MPI_COMM_WORLD, &g_rank);
    MPI_Comm_size(MPI_COMM_WORLD, &g_world);
    if (g_world > MAX_RANKS || provided < MPI_THREAD_FUNNELED) {
        if (g_rank == 0)
            fprintf(stderr, "test_collectives_nccl: needs 1 to %d ranks and MPI_THREAD_FUNNELED (%d ranks, level %d)\n",
                    MAX_RANKS, g_world, provided);
        MPI_Finalize();
        return 2;
    }
    prism_error err = {0};
    if (prism_coll_comm_from_mpi(MPI_COMM_WORLD, &g_mpi, &err) != PRISM_OK) {
        fprintf(stderr, "rank %d: prism_coll_comm_from_mpi: %s\n", g_rank, err.message);
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
    /* Rank 0 alone needs devices, and only rank 0 asks (no other rank touches CUDA). */
    int devices = 0;
    if (g_rank == 0) {
        if (prism_cuda_device_count(&devices, &err) != PRISM_OK)
            devices = 0;
        g_gpu = devices >= g_world;
        if (!g_gpu)
            printf("SKIPPED: needs %d CUDA device%s (this machine has %d); the GPU tests pass without running\n",
                   g_world, g_world == 1 ? "" : "s", devices);
    } else if (!freopen("/dev/null", "w", stdout)) {
        fprintf(stderr, "rank %d: cannot silence stdout\n", g_rank);
    }
    int gpu = g_gpu;
    MPI_Bcast(&gpu, 1, MPI_INT, 0, MPI_COMM_WORLD);
    g_gpu = gpu != 0;

    const prism_test_suite suites[] = {{"nccl", nccl_tests}, {NULL, NULL}};
    int rc = prism_test_main(argc, argv, suites), worst = rc;
    MPI_Allreduce(&rc, &worst, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
    prism_coll_comm_destroy(g_mpi);
    MPI_Finalize();
    return worst;
}
