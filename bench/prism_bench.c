/* prism-bench: Prism's kernel benchmarks (DESIGN 13). `prism-bench kernels` times every kernel
 * of include/prism/kernels.h on inputs from 1 MiB to 1 GiB, on the CPU and, in a build with CUDA
 * and a device, on the GPU, and prints one line per kernel and size:
 *
 *   the bytes the kernel must move (inputs read + outputs written), its GB/s, the GB/s of a plain
 *   copy of the same number of bytes measured in the same run (memcpy on the CPU, a device-to-
 *   device cudaMemcpyAsync on the GPU), the ratio of the two, and the same operation written in
 *   PyTorch (bench/torch_kernels.py, run once per device) with Prism's speed-up over it.
 *
 * Napkin math: every kernel here streams its input once and its output once, with a handful of
 * instructions per element, so the ideal is the copy bandwidth: a kernel at ratio 1.0 moves its
 * bytes as fast as memcpy moves the same number. The target is >= 0.80 on the CPU and >= 0.85 on
 * the GPU for >= 64 MiB, and >= 3x (CPU) or >= 2x (GPU) PyTorch eager. */
#define _POSIX_C_SOURCE 200809L
#include "bench.h"
#include "prism/kernels.h"
#ifdef PRISM_BENCH_CUDA
#include "prism/cuda.h"
#include <cuda_runtime_api.h>
#endif

#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define MIB ((size_t)1 << 20)

double bench_now_seconds(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void usage(FILE *to)
{
    fprintf(to,
            "usage: prism-bench kernels [options]\n"
            "       prism-bench transfer [options]   (block transfer per precision: see\n"
            "                                        prism-bench transfer --help)\n"
            "       mpirun ... prism-bench allreduce [options]   (quantized all-reduce against\n"
            "                                        MPI_Allreduce: see prism-bench allreduce --help)\n"
            "       prism-bench scales [options]     (the scale modes on one drifting tensor: see\n"
            "                                        prism-bench scales --help)\n"
            "\n"
            "Times every kernel (grad_stats, quantize, dequantize, dequantize_accumulate,\n"
            "relative_error) from --min-mib to --max-mib of input, doubling by 4, and prints\n"
            "GB/s, the ratio to a copy of the same bytes, and PyTorch's time for the same\n"
            "operation.\n"
            "\n"
            "options:\n"
            "  --min-mib N      smallest input in MiB (default 1)\n"
            "  --max-mib N      largest input in MiB (default 1024)\n"
            "  --device D       cpu, cuda or all (default all: cuda only where there is a device)\n"
            "  --kernel NAME    only kernels whose name contains NAME\n"
            "  --torch PATH     the PyTorch side (default: bench/torch_kernels.py next to the\n"
            "                   source tree); --no-torch skips it\n"
            "  --python PATH    interpreter with torch (default /usr/bin/python3)\n"
            "  --seconds S      time to spend per configuration (default 0.3)\n"
            "  -h, --help       this text\n");
}

/* ---- the kernels and the bytes they move ------------------------------------------------- */

typedef struct bench_bufs {
    size_t n;               /* input elements (bf16) */
    uint16_t *x, *y;        /* bf16 inputs */
    uint8_t *codes;         /* n bytes */
    float *scales;          /* n / 32 */
    uint16_t *out;          /* bf16 output */
    float *acc;             /* f32 accumulator */
    prism_grad_stats *stats; /* one */
    double *err_out;
} bench_bufs;

typedef struct kernel_case {
    const char *name;
    prism_precision format; /* for quantize kinds */
    prism_granularity granularity;
    size_t group;
    prism_rounding rounding;
    enum { K_STATS, K_QUANT, K_DEQUANT, K_ACCUM, K_ERROR } kind;
} kernel_case;

static const kernel_case kernels[] = {
    {"grad_stats", 0, 0, 0, 0, K_STATS},
    {"quantize_int8_block128", PRISM_PRECISION_INT8, PRISM_GRANULARITY_BLOCK, 128, 0, K_QUANT},
    {"quantize_fp8_e4m3_row4096", PRISM_PRECISION_FP8_E4M3, PRISM_GRANULARITY_ROW, 4096, 0, K_QUANT},
    {"quantize_fp8_e5m2_tensor", PRISM_PRECISION_FP8_E5M2, PRISM_GRANULARITY_TENSOR, 0, 0, K_QUANT},
    {"quantize_int4_block128", PRISM_PRECISION_INT4, PRISM_GRANULARITY_BLOCK, 128, 0, K_QUANT},
    {"quantize_int8_block128_stochastic", PRISM_PRECISION_INT8, PRISM_GRANULARITY_BLOCK, 128,
     PRISM_ROUNDING_STOCHASTIC, K_QUANT},
    {"dequantize_int8_block128", PRISM_PRECISION_INT8, PRISM_GRANULARITY_BLOCK, 128, 0, K_DEQUANT},
    {"dequantize_fp8_e4m3_row4096", PRISM_PRECISION_FP8_E4M3, PRISM_GRANULARITY_ROW, 4096, 0, K_DEQUANT},
    {"dequantize_accumulate_int8_block128", PRISM_PRECISION_INT8, PRISM_GRANULARITY_BLOCK, 128, 0,
     K_ACCUM},
    {"relative_error", 0, 0, 0, 0, K_ERROR},
};

static prism_quant_spec spec_of(const kernel_case *k)
{
    prism_quant_spec spec = {.format = k->format, .granularity = k->granularity, .group = k->group,
                             .rounding = k->rounding, .seed = 1};
    return spec;
}

/* Bytes read and written by one call over n bf16 elements. */
static double bytes_moved(const kernel_case *k, size_t n)
{
    size_t groups = 1, code_bytes = n;
    prism_quant_spec spec = spec_of(k);
    if (k->kind == K_QUANT || k->kind == K_DEQUANT || k->kind == K_ACCUM)
        prism_quant_layout(&spec, n, &groups, NULL, &code_bytes, NULL);
    double codes = (double)code_bytes + 4.0 * (double)groups;
    switch (k->kind) {
    case K_STATS: return 2.0 * (double)n;
    case K_QUANT: return 2.0 * (double)n + codes;
    case K_DEQUANT: return codes + 2.0 * (double)n;
    case K_ACCUM: return codes + 8.0 * (double)n;
    case K_ERROR: return 4.0 * (double)n;
    }
    return 0;
}

/* ---- CPU -------------------------------------------------------------------------------- */

static int run_cpu(const kernel_case *k, bench_bufs *b)
{
    prism_error err;
    prism_quant_spec spec = spec_of(k);
    prism_tensor x = {b->x, b->n, PRISM_DTYPE_BF16}, y = {b->y, b->n, PRISM_DTYPE_BF16};
    prism_status st = PRISM_OK;
    switch (k->kind) {
    case K_STATS: st = prism_grad_stats_cpu(&x, 1, b->stats, &err); break;
    case K_QUANT: st = prism_quantize_cpu(&spec, &x, b->codes, b->scales, NULL, &err); break;
    case K_DEQUANT:
        st = prism_dequantize_cpu(&spec, b->codes, b->scales, b->n, b->out, PRISM_DTYPE_BF16, &err);
        break;
    case K_ACCUM: st = prism_dequantize_accumulate_cpu(&spec, b->codes, b->scales, b->n, b->acc, &err); break;
    case K_ERROR: st = prism_relative_error_cpu(&x, &y, b->err_out, &err); break;
    }
    if (st != PRISM_OK) {
        fprintf(stderr, "prism-bench: %s: %s\n", k->name, err.message);
        return -1;
    }
    return 0;
}

typedef struct copy_part {
    char *dst;
    const char *src;
    size_t len;
} copy_part;

static void *copy_thread(void *arg)
{
    copy_part *p = arg;
    memcpy(p->dst, p->src, p->len);
    return NULL;
}

/* A copy of len bytes on every CPU, each memcpy'ing its share: the machine's copy bandwidth,
 * which a single memcpy does not reach on most servers. */
static void copy_cpu(char *dst, const char *src, size_t len, int threads)
{
    pthread_t ids[64];
    copy_part parts[64] = {{0}};
    if (threads < 1 || threads > 64)
        threads = 1;
    size_t share = (len / (size_t)threads) & ~(size_t)63;
    for (int t = 0; t < threads; t++) {
        parts[t].dst = dst + (size_t)t * share;
        parts[t].src = src + (size_t)t * share;
        parts[t].len = t == threads - 1 ? len - (size_t)t * share : share;
    }
    for (int t = 1; t < threads; t++)
        pthread_create(&ids[t], NULL, copy_thread, &parts[t]);
    copy_thread(&parts[0]);
    for (int t = 1; t < threads; t++)
        pthread_join(ids[t], NULL);
}

double bench_median_time(bench_timed_fn fn, void *ctx, double budget)
{
    double t0 = bench_now_seconds();
    if (fn(ctx) != 0)
        return -1;
    double once = bench_now_seconds() - t0;
    int reps = once > 0 ? (int)(budget / once) : 50;
    reps = reps < 3 ? 3 : (reps > 50 ? 50 : reps);
    double times[50];
    for (int r = 0; r < reps; r++) {
        double s = bench_now_seconds();
        if (fn(ctx) != 0)
            return -1;
        times[r] = bench_now_seconds() - s;
    }
    for (int i = 1; i < reps; i++)
        for (int j = i; j > 0 && times[j] < times[j - 1]; j--) {
            double t = times[j];
            times[j] = times[j - 1];
            times[j - 1] = t;
        }
    return times[reps / 2];
}

typedef struct cpu_ctx {
    const kernel_case *k;
    bench_bufs *b;
    char *src, *dst;
    size_t len;
    int threads;
} cpu_ctx;

static int cpu_kernel_fn(void *ctx)
{
    cpu_ctx *c = ctx;
    return run_cpu(c->k, c->b);
}

static int cpu_copy_fn(void *ctx)
{
    cpu_ctx *c = ctx;
    copy_cpu(c->dst, c->src, c->len, c->threads);
    return 0;
}

/* ---- PyTorch ------------------------------------------------------------------------------ */

typedef struct torch_row {
    char kernel[64], device[8];
    size_t mib;
    double seconds;
} torch_row;

typedef struct torch_table {
    torch_row *rows;
    size_t count;
} torch_table;

/* Runs the PyTorch side once for a device; its lines are "kernel device mib seconds". */
static void torch_collect(torch_table *t, const char *python, const char *script, const char *device,
                          size_t min_mib, size_t max_mib, const char *only, double seconds)
{
    char cmd[2048];
    snprintf(cmd, sizeof cmd, "'%s' '%s' --device %s --min-mib %zu --max-mib %zu --seconds %g%s%s", python,
             script, device, min_mib, max_mib, seconds, only ? " --kernel " : "", only ? only : "");
    FILE *p = popen(cmd, "r");
    if (!p) {
        fprintf(stderr, "prism-bench: cannot run %s\n", cmd);
        return;
    }
    char line[512];
    while (fgets(line, sizeof line, p)) {
        torch_row r;
        if (sscanf(line, "%63s %7s %zu %lf", r.kernel, r.device, &r.mib, &r.seconds) != 4)
            continue;
        torch_row *grown = realloc(t->rows, (t->count + 1) * sizeof *grown);
        if (!grown)
            break;
        t->rows = grown;
        t->rows[t->count++] = r;
    }
    int rc = pclose(p);
    if (rc != 0)
        fprintf(stderr, "prism-bench: the PyTorch side (%s) exited with status %d\n", script, rc);
}

static double torch_seconds(const torch_table *t, const char *kernel, const char *device, size_t mib)
{
    for (size_t i = 0; i < t->count; i++)
        if (!strcmp(t->rows[i].kernel, kernel) && !strcmp(t->rows[i].device, device) && t->rows[i].mib == mib)
            return t->rows[i].seconds;
    return -1;
}

static void print_row(const char *device, const kernel_case *k, size_t mib, double seconds, double copy_gbps,
                      double torch_s)
{
    double gbps = bytes_moved(k, mib * MIB / 2) / seconds / 1e9;
    printf("%-6s %-38s %6zu MiB %10.1f us %8.2f GB/s  copy %8.2f GB/s  ratio %5.2f", device, k->name, mib,
           seconds * 1e6, gbps, copy_gbps, gbps / copy_gbps);
    if (torch_s > 0)
        printf("  torch %10.1f us  speedup %6.2fx", torch_s * 1e6, torch_s / seconds);
    else
        printf("  torch %10s", "n/a");
    printf("\n");
    fflush(stdout);
}

static void fill_inputs(bench_bufs *b)
{
    uint32_t s = 12345;
    for (size_t i = 0; i < b->n; i++) {
        s = s * 1664525u + 1013904223u;
        float v = ((float)(s >> 8) / 16777216.0f - 0.5f) * 0.02f;
        b->x[i] = prism_f32_to_bf16(v);
        b->y[i] = prism_f32_to_bf16(v * 1.01f);
        b->acc[i] = 0.0f;
    }
}

static int bench_cpu(size_t min_mib, size_t max_mib, const char *only, const torch_table *torch, double budget)
{
    long cpus = sysconf(_SC_NPROCESSORS_ONLN);
    int threads = cpus > 0 ? (int)(cpus > 64 ? 64 : cpus) : 1;
    bench_bufs b = {0};
    size_t nmax = max_mib * MIB / 2;
    b.x = malloc(nmax * 2);
    b.y = malloc(nmax * 2);
    b.codes = malloc(nmax);
    b.scales = malloc(nmax / 32 * 4 + 64);
    b.out = malloc(nmax * 2);
    b.acc = malloc(nmax * 4);
    b.stats = malloc(sizeof *b.stats);
    b.err_out = malloc(sizeof *b.err_out);
    char *copy_dst = malloc(max_mib * MIB);
    if (!b.x || !b.y || !b.codes || !b.scales || !b.out || !b.acc || !b.stats || !b.err_out || !copy_dst) {
        fprintf(stderr, "prism-bench: not enough memory for %zu MiB inputs\n", max_mib);
        return 1;
    }
    b.n = nmax;
    fill_inputs(&b);
    memset(copy_dst, 1, max_mib * MIB);
    for (size_t mib = min_mib; mib <= max_mib; mib *= 4) {
        b.n = mib * MIB / 2;
        cpu_ctx copy = {.src = (char *)b.x, .dst = copy_dst, .len = mib * MIB, .threads = threads};
        double copy_s = bench_median_time(cpu_copy_fn, &copy, budget);
        double copy_gbps = 2.0 * (double)(mib * MIB) / copy_s / 1e9;
        for (size_t i = 0; i < sizeof kernels / sizeof kernels[0]; i++) {
            const kernel_case *k = &kernels[i];
            if (only && !strstr(k->name, only))
                continue;
            if (k->kind == K_DEQUANT || k->kind == K_ACCUM) { /* codes of the matching quantize */
                prism_quant_spec spec = spec_of(k);
                prism_tensor x = {b.x, b.n, PRISM_DTYPE_BF16};
                prism_quantize_cpu(&spec, &x, b.codes, b.scales, NULL, NULL);
            }
            cpu_ctx c = {.k = k, .b = &b};
            double s = bench_median_time(cpu_kernel_fn, &c, budget);
            if (s < 0)
                return 1;
            print_row("cpu", k, mib, s, copy_gbps, torch_seconds(torch, k->name, "cpu", mib));
        }
    }
    free(b.x);
    free(b.y);
    free(b.codes);
    free(b.scales);
    free(b.out);
    free(b.acc);
    free(b.stats);
    free(b.err_out);
    free(copy_dst);
    return 0;
}

#ifdef PRISM_BENCH_CUDA
#include "prism_bench_cuda.inc"
#endif

int main(int argc, char **argv)
{
    if (argc < 2 || !strcmp(argv[1], "-h") || !strcmp(argv[1], "--help")) {
        usage(argc < 2 ? stderr : stdout);
        return argc < 2 ? 2 : 0;
    }
    if (!strcmp(argv[1], "transfer"))
        return bench_transfer_main(argc, argv);
    if (!strcmp(argv[1], "scales"))
        return bench_scales_main(argc, argv);
    if (!strcmp(argv[1], "allreduce")) {
#ifdef PRISM_BENCH_MPI
        return bench_allreduce_main(argc, argv);
#else
        fprintf(stderr, "prism-bench: allreduce: this build has no MPI backend of the collectives\n");
        return 2;
#endif
    }
    if (strcmp(argv[1], "kernels") != 0) {
        fprintf(stderr, "prism-bench: unknown benchmark '%s' (known: kernels, transfer, allreduce, scales)\n", argv[1]);
        return 2;
    }
    size_t min_mib = 1, max_mib = 1024;
    const char *device = "all", *only = NULL, *python = "/usr/bin/python3";
    const char *script = PRISM_BENCH_TORCH_SCRIPT;
    double budget = 0.3;
    for (int i = 2; i < argc; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage(stdout);
            return 0;
        } else if (!strcmp(a, "--no-torch")) {
            script = NULL;
            continue;
        }
        if (!v) {
            fprintf(stderr, "prism-bench: %s needs a value (see --help)\n", a);
            return 2;
        }
        i++;
        char *end;
        if (!strcmp(a, "--min-mib") || !strcmp(a, "--max-mib")) {
            unsigned long n = strtoul(v, &end, 10);
            if (*end || n == 0 || n > 65536) {
                fprintf(stderr, "prism-bench: %s: '%s' is not a size in MiB from 1 to 65536\n", a, v);
                return 2;
            }
            if (!strcmp(a, "--min-mib"))
                min_mib = n;
            else
                max_mib = n;
        } else if (!strcmp(a, "--device")) {
            if (strcmp(v, "cpu") && strcmp(v, "cuda") && strcmp(v, "all")) {
                fprintf(stderr, "prism-bench: --device: '%s' is not cpu, cuda or all\n", v);
                return 2;
            }
            device = v;
        } else if (!strcmp(a, "--kernel")) {
            only = v;
        } else if (!strcmp(a, "--torch")) {
            script = v;
        } else if (!strcmp(a, "--python")) {
            python = v;
        } else if (!strcmp(a, "--seconds")) {
            budget = strtod(v, &end);
            if (*end || !(budget > 0 && budget <= 60)) {
                fprintf(stderr, "prism-bench: --seconds: '%s' is not a number of seconds in (0, 60]\n", v);
                return 2;
            }
        } else {
            fprintf(stderr, "prism-bench: unknown option '%s' (see --help)\n", a);
            return 2;
        }
    }
    if (min_mib > max_mib) {
        fprintf(stderr, "prism-bench: --min-mib %zu is above --max-mib %zu\n", min_mib, max_mib);
        return 2;
    }
    bool want_cpu = strcmp(device, "cuda") != 0, want_cuda = strcmp(device, "cpu") != 0;
    torch_table torch = {0};
    if (script && want_cpu)
        torch_collect(&torch, python, script, "cpu", min_mib, max_mib, only, budget);
    int rc = 0;
    if (want_cpu)
        rc |= bench_cpu(min_mib, max_mib, only, &torch, budget);
#ifdef PRISM_BENCH_CUDA
    if (want_cuda)
        rc |= bench_cuda(min_mib, max_mib, only, python, script, &torch, budget, !strcmp(device, "cuda"));
#else
    if (want_cuda && !strcmp(device, "cuda")) {
        fprintf(stderr, "prism-bench: this build has no CUDA kernels\n");
        rc = 2;
    }
#endif
    free(torch.rows);
    return rc;
}
