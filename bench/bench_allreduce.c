/* prism-bench allreduce: the quantized all-reduce of include/prism/collectives.h (DESIGN 10, 13)
 * against MPI_Allreduce in FP32 and, on a GPU, NCCL in BF16. Run under mpirun, one process per
 * rank. For each tensor size (FP32 MiB per rank) rank 0 prints one line for the baseline and one
 * per wire format:
 *
 *   the median time of a call (the slowest rank's, over repetitions filling about --seconds),
 *   GB/s of useful data (the rank's FP32 tensor bytes over that time), the bytes one rank sends
 *   per call and their ratio to a BF16 ring all-reduce, the rate those bytes left at (Gbit/s),
 *   the speed-up over the baseline, and the relative error of the result against the FP32
 *   MPI_Allreduce of the same data.
 *
 * Napkin math (P ranks, N elements per rank): a ring all-reduce sends 2 (P-1)/P x N elements per
 * rank, 4 bytes each in FP32 and 2 in BF16; prism sends 2 (P-1)/P x N x (B + 4/row_width) (B = 1
 * for INT8 and FP8, 1/2 for INT4): 0.508 of BF16 for FP8 with rows of 256 (DESIGN 13: <= 0.52).
 * When the link is the bottleneck time is bytes / rate, so FP8 can be up to 4 / 1.016 = 3.9x
 * faster than FP32 (1.97x than BF16) and INT4 up to 7.5x; when it is not (shared memory, two
 * cores), prism's quantize, dequantize-accumulate, requantize and dequantize passes over the
 * tensor are what the time is made of, and MPI's plain FP32 sums win. */
#define _POSIX_C_SOURCE 200809L
#include "bench.h"
#include "prism/collectives.h"
#include "prism/collectives_mpi.h"
#include "prism/kernels.h"

#include <mpi.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MIB ((size_t)1 << 20)
#define AR_MAX_SIZES 8
#define AR_MAX_MIB 1024 /* N x 4 bytes stays below INT_MAX elements for MPI_Allreduce's count */
#define AR_MAX_REPS 50
#define AR_MIN_REPS 3

/* Called by prism_bench.c's main for `prism-bench allreduce`. */
typedef struct ar_options {
    size_t mib[AR_MAX_SIZES];
    size_t n_sizes;
    prism_precision wires[4];
    size_t n_wires;
    uint32_t row_width;
    double seconds;
    bool cuda;
    const char *link;  /* a label for the lines (the netns script passes the link rate) */
    const char *iface; /* when set, its tx_bytes counter is read around each timed loop */
} ar_options;

static const prism_precision all_wires[] = {PRISM_PRECISION_FP8_E4M3, PRISM_PRECISION_FP8_E5M2,
                                            PRISM_PRECISION_INT8, PRISM_PRECISION_INT4};

static void allreduce_usage(FILE *to)
{
    fprintf(to,
            "usage: prism-bench allreduce [options]      (under mpirun, one process per rank)\n"
            "\n"
            "Times prism_coll_allreduce (include/prism/collectives.h) of one FP32 tensor per rank\n"
            "against MPI_Allreduce(MPI_FLOAT, MPI_SUM) of the same data (with --device cuda: NCCL\n"
            "in BF16), and prints per size and wire format the median time, GB/s of FP32 data,\n"
            "the bytes one rank sends and their ratio to a BF16 ring all-reduce, and the relative\n"
            "error against the FP32 MPI_Allreduce result.\n"
            "\n"
            "options:\n"
            "  --mib LIST       FP32 MiB per rank, comma-separated, 1 to %d (default 4,16,64)\n"
            "  --wire LIST      int8, fp8_e4m3, fp8_e5m2, int4, comma-separated, or all (default)\n"
            "  --row-width N    elements per row and FP32 scale (default %u)\n"
            "  --seconds S      time to spend per configuration (default 1)\n"
            "  --device D       cpu (MPI backend) or cuda (NCCL backend; default cpu)\n"
            "  --link NAME      label printed on each line (default local)\n"
            "  --iface IF       also print the bytes IF's tx counter moved per call (Linux sysfs;\n"
            "                   what bench/allreduce_netns.sh uses to check the formula)\n"
            "  -h, --help       this text\n"
            "\n"
            "example: mpirun -np 4 prism-bench allreduce --mib 16 --wire fp8_e4m3\n",
            AR_MAX_MIB, PRISM_COLL_ROW_WIDTH_DEFAULT);
}

/* Parses the command line (no MPI needed): 0, 1 after --help, or 2 with a message. */
static int parse_options(int argc, char **argv, ar_options *o)
{
    *o = (ar_options){.mib = {4, 16, 64}, .n_sizes = 3, .n_wires = 4, .row_width = PRISM_COLL_ROW_WIDTH_DEFAULT,
                      .seconds = 1.0, .link = "local"};
    memcpy(o->wires, all_wires, sizeof all_wires);
    for (int i = 2; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            allreduce_usage(stdout);
            return 1;
        }
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!v) {
            fprintf(stderr, "prism-bench: %s needs a value (see prism-bench allreduce --help)\n", a);
            return 2;
        }
        i++;
        char list[256], *save = NULL, *end;
        if (!strcmp(a, "--mib")) {
            snprintf(list, sizeof list, "%s", v);
            o->n_sizes = 0;
            for (char *t = strtok_r(list, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
                unsigned long n = strtoul(t, &end, 10);
                if (*end || n == 0 || n > AR_MAX_MIB || o->n_sizes == AR_MAX_SIZES) {
                    fprintf(stderr, "prism-bench: --mib: '%s' is not a list of up to %d sizes in MiB from 1 to %d\n",
                            v, AR_MAX_SIZES, AR_MAX_MIB);
                    return 2;
                }
                o->mib[o->n_sizes++] = n;
            }
            if (o->n_sizes == 0) {
                fprintf(stderr, "prism-bench: --mib: '%s' names no size\n", v);
                return 2;
            }
        } else if (!strcmp(a, "--wire")) {
            snprintf(list, sizeof list, "%s", v);
            o->n_wires = 0;
            for (char *t = strtok_r(list, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
                prism_precision p;
                if (!strcmp(t, "all") && o->n_wires == 0) {
                    memcpy(o->wires, all_wires, sizeof all_wires);
                    o->n_wires = 4;
                    continue;
                }
                if (!prism_precision_parse(t, &p) || p == PRISM_PRECISION_BF16 || o->n_wires == 4) {
                    fprintf(stderr, "prism-bench: --wire: '%s' is not int8, fp8_e4m3, fp8_e5m2, int4 or all\n", v);
                    return 2;
                }
                o->wires[o->n_wires++] = p;
            }
            if (o->n_wires == 0) {
                fprintf(stderr, "prism-bench: --wire: '%s' names no format\n", v);
                return 2;
            }
        } else if (!strcmp(a, "--row-width")) {
            unsigned long n = strtoul(v, &end, 10);
            prism_coll_spec spec = {.wire = PRISM_PRECISION_INT8, .row_width = (uint32_t)n};
            prism_coll_layout layout;
            prism_error err;
            if (*end || n == 0 || n > PRISM_COLL_ROW_WIDTH_MAX ||
                prism_coll_layout_of(&spec, NULL, 0, 1, &layout, &err) != PRISM_OK) {
                fprintf(stderr, "prism-bench: --row-width: '%s' is not a row width of 8 to %u, a multiple of 8\n",
                        v, PRISM_COLL_ROW_WIDTH_MAX);
                return 2;
            }
            o->row_width = (uint32_t)n;
        } else if (!strcmp(a, "--seconds")) {
            o->seconds = strtod(v, &end);
            if (*end || !(o->seconds > 0 && o->seconds <= 60)) {
                fprintf(stderr, "prism-bench: --seconds: '%s' is not a number of seconds in (0, 60]\n", v);
                return 2;
            }
        } else if (!strcmp(a, "--device")) {
            if (strcmp(v, "cpu") && strcmp(v, "cuda")) {
                fprintf(stderr, "prism-bench: --device: '%s' is not cpu or cuda\n", v);
                return 2;
            }
            o->cuda = !strcmp(v, "cuda");
        } else if (!strcmp(a, "--link")) {
            o->link = v;
        } else if (!strcmp(a, "--iface")) {
            if (!*v || strchr(v, '/') || strlen(v) > 15) {
                fprintf(stderr, "prism-bench: --iface: '%s' is not an interface name\n", v);
                return 2;
            }
            o->iface = v;
        } else {
            fprintf(stderr, "prism-bench: unknown option '%s' (see prism-bench allreduce --help)\n", a);
            return 2;
        }
    }
    return 0;
}

/* ---- what every backend shares ------------------------------------------------------------ */

/* The interface's tx byte counter, or -1 when there is none to read. */
static double iface_tx_bytes(const char *iface)
{
    if (!iface)
        return -1;
    char path[96];
    snprintf(path, sizeof path, "/sys/class/net/%s/statistics/tx_bytes", iface);
    FILE *f = fopen(path, "r");
    if (!f)
        return -1;
    unsigned long long v = 0;
    int got = fscanf(f, "%llu", &v);
    fclose(f);
    return got == 1 ? (double)v : -1;
}

/* Gradient-like data, different on every rank: roughly normal values (a sum of four uniforms)
 * whose magnitude changes every 64 Ki elements, log-uniformly over four decades, the same on every
 * rank (as one layer's gradients are of the same order on every rank). */
static void fill_gradients(float *x, size_t n, int rank)
{
    uint32_t s = 2463534242u ^ (uint32_t)(rank * 7919 + 1);
    uint32_t m = 88172645u;
    float magnitude = 1e-3f;
    for (size_t i = 0; i < n; i++) {
        if (i % 65536 == 0) {
            m ^= m << 13, m ^= m >> 17, m ^= m << 5;
            magnitude = powf(10.0f, -5.0f + 4.0f * (float)(m >> 8) / 16777216.0f);
        }
        float u = 0;
        for (int k = 0; k < 4; k++) {
            s ^= s << 13, s ^= s >> 17, s ^= s << 5;
            u += (float)(s >> 8) / 16777216.0f;
        }
        x[i] = (u - 2.0f) * 1.7320508f * magnitude;
    }
}

typedef int (*ar_fn)(void *ctx);

typedef struct ar_timing {
    double seconds;  /* median over the repetitions of the slowest rank's time */
    double tx_bytes; /* the interface's tx bytes per call on this rank, -1 without one */
    int reps;
} ar_timing;

/* Times run (after prepare, untimed) on every rank: one warm-up, then a repetition count that
 * all ranks agree on (from the slowest rank's warm-up), each call started after a barrier. The
 * count is 3 to 50 and fills about `budget` seconds. Every rank learns whether every other one
 * succeeded after each call, so a failure stops all of them at the same point. -1 on failure. */
static int ar_time(MPI_Comm comm, ar_fn prepare, ar_fn run, void *ctx, double budget, const char *iface,
                   ar_timing *out)
{
    double times[AR_MAX_REPS];
    double warm[2] = {0, 0}; /* the time, and whether it failed */
    if (prepare)
        prepare(ctx);
    MPI_Barrier(comm);
    double t0 = bench_now_seconds();
    warm[1] = run(ctx) != 0;
    warm[0] = bench_now_seconds() - t0;
    MPI_Allreduce(MPI_IN_PLACE, warm, 2, MPI_DOUBLE, MPI_MAX, comm);
    if (warm[1] != 0)
        return -1;
    int reps = warm[0] > 0 ? (int)(budget / warm[0]) : AR_MAX_REPS;
    reps = reps < AR_MIN_REPS ? AR_MIN_REPS : (reps > AR_MAX_REPS ? AR_MAX_REPS : reps);
    double tx0 = iface_tx_bytes(iface);
    for (int r = 0; r < reps; r++) {
        if (prepare)
            prepare(ctx);
        MPI_Barrier(comm);
        double s = bench_now_seconds();
        int failed = run(ctx) != 0;
        times[r] = bench_now_seconds() - s;
        MPI_Allreduce(MPI_IN_PLACE, &failed, 1, MPI_INT, MPI_MAX, comm);
        if (failed)
            return -1;
    }
    double tx1 = iface_tx_bytes(iface);
    MPI_Allreduce(MPI_IN_PLACE, times, reps, MPI_DOUBLE, MPI_MAX, comm);
    for (int i = 1; i < reps; i++)
        for (int j = i; j > 0 && times[j] < times[j - 1]; j--) {
            double t = times[j];
            times[j] = times[j - 1];
            times[j - 1] = t;
        }
    out->seconds = times[reps / 2];
    out->tx_bytes = tx0 >= 0 && tx1 >= 0 ? (tx1 - tx0) / reps : -1;
    out->reps = reps;
    return 0;
}

/* Bytes one rank sends in a ring all-reduce of n elements of elem_bytes each. */
static double ring_bytes(size_t n, int world, double elem_bytes)
{
    return 2.0 * (double)(world - 1) / (double)world * (double)n * elem_bytes;
}

/* One result line: the baseline has err < 0 (it is the reference) and speedup 1. */
static void print_line(const ar_options *o, const char *device, int world, size_t mib, const char *what,
                       const ar_timing *t, double wire_bytes, double bf16_bytes, double speedup, double err)
{
    double n_bytes = (double)(mib * MIB);
    printf("%-9s %-4s P=%d %5zu MiB  %-9s %10.3f ms %8.3f GB/s  wire %9.3f MiB %6.3f bf16 %7.3f Gbit/s  "
           "vs base %5.2fx  ",
           o->link, device, world, mib, what, t->seconds * 1e3, n_bytes / t->seconds / 1e9, wire_bytes / (double)MIB,
           bf16_bytes > 0 ? wire_bytes / bf16_bytes : 0.0, wire_bytes * 8 / t->seconds / 1e9, speedup);
    if (err < 0)
        printf("err   (ref)  ");
    else
        printf("err %.2e  ", err);
    if (t->tx_bytes >= 0)
        printf("%s %9.3f MiB", o->iface, t->tx_bytes / (double)MIB);
    printf("\n");
    fflush(stdout);
}

static void print_header(const ar_options *o, const char *device, const char *baseline, int world)
{
    double fp8 = (1.0 + 4.0 / o->row_width) / 2.0, int4 = (0.5 + 4.0 / o->row_width) / 2.0;
    char version[MPI_MAX_LIBRARY_VERSION_STRING];
    int len = 0;
    MPI_Get_library_version(version, &len);
    version[strcspn(version, ",\n")] = '\0';
    printf("# prism-bench allreduce: P=%d ranks, %s, link '%s', %s.\n"
           "# baseline: %s; the other lines are prism_coll_allreduce\n"
           "# (SUM, rows of %u with an FP32 scale each, nearest rounding) of the same FP32 tensor.\n"
           "# time: median of the slowest rank's call; GB/s: the rank's FP32 tensor bytes / time.\n"
           "# wire: bytes one rank sends per call: 2(P-1)/P x N x 4 for an FP32 ring all-reduce\n"
           "# (the formula: the MPI library's own algorithm may send more), and prism's measured\n"
           "# prism_coll_stats.bytes_sent, 2(P-1)/P x N x (B + 4/%u); 'bf16' is that over a BF16\n"
           "# ring all-reduce, 2(P-1)/P x N x 2: ideal %.3f for int8/fp8 (DESIGN 13: <= 0.52 for FP8),\n"
           "# %.3f for int4. A link-bound run should approach speed-ups of %.2fx (8-bit) and %.2fx\n"
           "# (int4) over FP32; err: ||prism - ref|| / ||ref||, ref the FP32 MPI_Allreduce result.\n",
           world, device, o->link, version, baseline, o->row_width, o->row_width, fp8, int4, 2.0 / fp8,
           2.0 / int4);
    if (o->iface)
        printf("# %s: the bytes that interface's tx counter moved per call on rank 0 (the payload,\n"
               "# the headers of its TCP segments of up to 64 KiB, and the barrier before each call).\n",
               o->iface);
    fflush(stdout);
}

/* ---- CPU: MPI_Allreduce in FP32 against prism_coll over MPI -------------------------------- */

typedef struct cpu_case {
    MPI_Comm comm;
    prism_coll_comm *pc;
    prism_coll_spec spec;
    float *orig, *work, *ref;
    size_t n;
    prism_coll_stats stats;
} cpu_case;

static int mpi_fp32_fn(void *ctx)
{
    cpu_case *c = ctx;
    return MPI_Allreduce(c->orig, c->ref, (int)c->n, MPI_FLOAT, MPI_SUM, c->comm) == MPI_SUCCESS ? 0 : -1;
}

/* prism's all-reduce is in place: every call starts again from the same input. */
static int restore_input_fn(void *ctx)
{
    cpu_case *c = ctx;
    memcpy(c->work, c->orig, c->n * sizeof *c->work);
    return 0;
}

static int prism_cpu_fn(void *ctx)
{
    cpu_case *c = ctx;
    prism_coll_tensor t = {c->work, c->n, PRISM_DTYPE_F32};
    prism_error err;
    if (prism_coll_allreduce(c->pc, &c->spec, &t, 1, &c->stats, &err) != PRISM_OK) {
        fprintf(stderr, "prism-bench: rank %d: prism_coll_allreduce: %s\n", prism_coll_rank(c->pc), err.message);
        return -1;
    }
    return 0;
}

/* ||ref - got|| / ||ref|| with the kernels' definition. */
static double relative_error(const float *ref, const float *got, size_t n)
{
    prism_tensor a = {ref, n, PRISM_DTYPE_F32}, b = {got, n, PRISM_DTYPE_F32};
    double e = -1;
    prism_error err;
    if (prism_relative_error_cpu(&a, &b, &e, &err) != PRISM_OK)
        fprintf(stderr, "prism-bench: relative error: %s\n", err.message);
    return e;
}

static int bench_cpu_size(const ar_options *o, cpu_case *c, int rank, int world, size_t mib)
{
    c->n = mib * MIB / sizeof(float);
    fill_gradients(c->orig, c->n, rank);
    ar_timing base;
    if (ar_time(c->comm, NULL, mpi_fp32_fn, c, o->seconds, o->iface, &base) != 0)
        return -1;
    double fp32_bytes = ring_bytes(c->n, world, 4), bf16_bytes = ring_bytes(c->n, world, 2);
    if (rank == 0)
        print_line(o, "cpu", world, mib, "mpi_fp32", &base, fp32_bytes, bf16_bytes, 1.0, -1);
    for (size_t w = 0; w < o->n_wires; w++) {
        c->spec = (prism_coll_spec){.wire = o->wires[w], .row_width = o->row_width, .op = PRISM_COLL_SUM,
                                    .scale_mode = PRISM_SCALE_FP32};
        ar_timing t;
        if (ar_time(c->comm, restore_input_fn, prism_cpu_fn, c, o->seconds, o->iface, &t) != 0)
            return -1;
        if (rank == 0)
            print_line(o, "cpu", world, mib, prism_precision_name(o->wires[w]), &t, (double)c->stats.bytes_sent,
                       bf16_bytes, base.seconds / t.seconds, relative_error(c->ref, c->work, c->n));
    }
    return 0;
}

static int bench_cpu(const ar_options *o, int rank, int world)
{
    size_t max_mib = 0;
    for (size_t i = 0; i < o->n_sizes; i++)
        max_mib = o->mib[i] > max_mib ? o->mib[i] : max_mib;
    cpu_case c = {.comm = MPI_COMM_WORLD};
    prism_error err;
    int ok = prism_coll_comm_from_mpi(MPI_COMM_WORLD, &c.pc, &err) == PRISM_OK;
    if (!ok)
        fprintf(stderr, "prism-bench: rank %d: prism_coll_comm_from_mpi: %s\n", rank, err.message);
    c.orig = malloc(max_mib * MIB);
    c.work = malloc(max_mib * MIB);
    c.ref = malloc(max_mib * MIB);
    if (ok && (!c.orig || !c.work || !c.ref)) {
        fprintf(stderr, "prism-bench: rank %d: not enough memory for 3 x %zu MiB\n", rank, max_mib);
        ok = 0;
    }
    MPI_Allreduce(MPI_IN_PLACE, &ok, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
    int rc = ok ? 0 : 1;
    if (ok && rank == 0)
        print_header(o, "cpu", "mpi_fp32, MPI_Allreduce(MPI_FLOAT, MPI_SUM)", world);
    for (size_t i = 0; i < o->n_sizes && rc == 0; i++)
        rc = bench_cpu_size(o, &c, rank, world, o->mib[i]) == 0 ? 0 : 1;
    prism_coll_comm_destroy(c.pc);
    free(c.orig);
    free(c.work);
    free(c.ref);
    return rc;
}

#ifdef PRISM_BENCH_NCCL
#include "bench_allreduce_nccl.inc"
#endif

int bench_allreduce_main(int argc, char **argv)
{
    ar_options o;
    int parsed = parse_options(argc, argv, &o);
    if (parsed != 0)
        return parsed == 1 ? 0 : 2;
#ifndef PRISM_BENCH_NCCL
    if (o.cuda) {
        fprintf(stderr, "prism-bench: --device cuda: this build has no NCCL backend (prism_coll_nccl)\n");
        return 2;
    }
#endif
    int provided = 0, rank = 0, world = 1;
    if (MPI_Init_thread(&argc, &argv, MPI_THREAD_FUNNELED, &provided) != MPI_SUCCESS) {
        fprintf(stderr, "prism-bench: MPI_Init_thread failed\n");
        return 1;
    }
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &world);
    int ok = o.iface == NULL || iface_tx_bytes(o.iface) >= 0;
    MPI_Allreduce(MPI_IN_PLACE, &ok, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
    int rc = 0;
    if (!ok) {
        if (rank == 0)
            fprintf(stderr, "prism-bench: --iface: cannot read /sys/class/net/%s/statistics/tx_bytes on every rank\n",
                    o.iface);
        rc = 2;
    } else if (o.cuda) {
#ifdef PRISM_BENCH_NCCL
        rc = bench_nccl(&o, rank, world);
#endif
    } else {
        rc = bench_cpu(&o, rank, world);
    }
    MPI_Finalize();
    return rc;
}
