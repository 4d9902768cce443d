/* prism-bench transfer: block transfer bandwidth per precision (include/prism/transfer.h,
 * DESIGN 9 and 13). For each block size and precision it registers a few blocks, prepares their
 * images (untimed: a real job quantizes once per map change, not per fetch), then times rounds
 * of fetching every block back to back into two alternating destinations, the host waiting only
 * at the end of a round, and prints one line per configuration:
 *
 *   time per block (median round / blocks), wire GB/s (the image bytes that cross the bus),
 *   BF16-equivalent GB/s (the block's BF16 bytes over the same time), the ratio of that to the
 *   BF16 fetch of the same size in the same run, and the ideal ratio (BF16 bytes / wire bytes).
 *
 * Napkin math: per element BF16 moves 2 bytes; INT8 and FP8 1 + 4/128 (an FP32 scale per block
 * of 128), INT4 0.5 + 4/128. If the bus is the bottleneck and the dequantize hides behind the
 * next copy (two staging buffers, two streams), the BF16-equivalent bandwidth is BF16's times
 * 2 / 1.03125 = 1.94 (8-bit) or 2 / 0.53125 = 3.76 (INT4). DESIGN 13 asks >= 1.8 for INT8/FP8 on
 * the GPU. On the CPU there is no bus: BF16 is a memcpy, and the others are a dequantize that
 * reads about half the bytes but does arithmetic per element, so the ratio there says how the
 * dequantize compares with a copy, not what a GPU would see. */
#define _POSIX_C_SOURCE 200809L
#include "bench.h"
#include "prism/transfer.h"
#ifdef PRISM_BENCH_CUDA
#include "prism/cuda.h"
#include <cuda_runtime_api.h>
#endif

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define MIB ((size_t)1 << 20)
#define MAX_BLOCKS 8

static const prism_precision precisions[] = {PRISM_PRECISION_BF16, PRISM_PRECISION_INT8, PRISM_PRECISION_FP8_E4M3,
                                             PRISM_PRECISION_FP8_E5M2, PRISM_PRECISION_INT4};
#define N_PRECISIONS (sizeof precisions / sizeof precisions[0])

static void transfer_usage(FILE *to)
{
    fprintf(to,
            "usage: prism-bench transfer [options]\n"
            "\n"
            "Times block transfer (include/prism/transfer.h) for each precision (bf16, int8,\n"
            "fp8_e4m3, fp8_e5m2, int4) and block size: blocks registered in host memory (pinned on\n"
            "CUDA) fetched back to back, codes + scales dequantized to BF16 on arrival. Prints the\n"
            "time per block, wire GB/s, BF16-equivalent GB/s and the ratio to the BF16 fetch.\n"
            "\n"
            "options:\n"
            "  --device D       cpu, cuda or all (default all: cuda only where there is a device)\n"
            "  --min-mib N      smallest block in MiB of BF16 (default 16)\n"
            "  --max-mib N      largest block (default 256); sizes go up by 4x\n"
            "  --seconds S      time to spend per configuration (default 0.3)\n"
            "  -h, --help       this text\n");
}

#ifdef PRISM_BENCH_CUDA
#include "bench_transfer_cuda.inc"
#else
static void *dst_alloc(bool cuda, size_t bytes)
{
    (void)cuda;
    return malloc(bytes);
}

static void dst_free(bool cuda, void *p)
{
    (void)cuda;
    free(p);
}
#endif

static void fill_weights(uint16_t *w, size_t n)
{
    uint32_t s = 12345;
    for (size_t i = 0; i < n; i++) {
        s = s * 1664525u + 1013904223u;
        float v = ((float)(s >> 8) / 16777216.0f - 0.5f) * 0.02f;
        w[i] = prism_f32_to_bf16(v);
    }
}

typedef struct round_ctx {
    prism_transfer *t;
    prism_precision p;
    int blocks;
    void *dst[2];
} round_ctx;

/* One round: every block fetched back to back, then the host waits for all of them. */
static int fetch_round(const round_ctx *r)
{
    prism_error err;
    for (int b = 0; b < r->blocks; b++)
        if (prism_transfer_fetch(r->t, (uint32_t)b, r->p, r->dst[b % 2], NULL, NULL, &err) != PRISM_OK) {
            fprintf(stderr, "prism-bench: fetch: %s\n", err.message);
            return -1;
        }
    if (prism_transfer_synchronize(r->t, &err) != PRISM_OK) {
        fprintf(stderr, "prism-bench: synchronize: %s\n", err.message);
        return -1;
    }
    return 0;
}

static int fetch_round_fn(void *ctx)
{
    return fetch_round(ctx);
}

/* Every precision at one block size on one backend. */
static int bench_size(bool cuda, size_t mib, const uint16_t *weights, double budget)
{
    size_t n = mib * MIB / 2;
    int blocks = (int)(1024 / mib);
    blocks = blocks < 2 ? 2 : (blocks > MAX_BLOCKS ? MAX_BLOCKS : blocks);
    prism_transfer_options o = {.backend = cuda ? PRISM_TRANSFER_CUDA : PRISM_TRANSFER_CPU,
                                .max_block_bytes = n * 2};
    prism_transfer *t = NULL;
    prism_error err;
    if (prism_transfer_create(&o, &t, &err) != PRISM_OK) {
        fprintf(stderr, "prism-bench: transfer engine: %s\n", err.message);
        return 1;
    }
    int rc = 0;
    round_ctx r = {.t = t, .blocks = blocks};
    r.dst[0] = dst_alloc(cuda, n * 2);
    r.dst[1] = dst_alloc(cuda, n * 2);
    if (!r.dst[0] || !r.dst[1]) {
        fprintf(stderr, "prism-bench: no memory for two %zu MiB destinations\n", mib);
        rc = 1;
    }
    for (int b = 0; b < blocks && rc == 0; b++)
        if (prism_transfer_add_block(t, (uint32_t)b, weights, n, &err) != PRISM_OK) {
            fprintf(stderr, "prism-bench: block %d: %s\n", b, err.message);
            rc = 1;
        }
    double bf16_gbps = 0;
    for (size_t k = 0; k < N_PRECISIONS && rc == 0; k++) {
        r.p = precisions[k];
        size_t wire = 0;
        for (int b = 0; b < blocks && rc == 0; b++)
            if (prism_transfer_prepare(t, (uint32_t)b, r.p, &err) != PRISM_OK) {
                fprintf(stderr, "prism-bench: prepare: %s\n", err.message);
                rc = 1;
            }
        if (rc == 0 && prism_transfer_wire_bytes(t, 0, r.p, &wire, &err) != PRISM_OK)
            rc = 1;
        double s = rc == 0 ? bench_median_time(fetch_round_fn, &r, budget) : -1;
        if (s <= 0) {
            rc = 1;
            break;
        }
        double per_block = s / blocks;
        double eq_gbps = (double)(n * 2) / per_block / 1e9;
        if (r.p == PRISM_PRECISION_BF16)
            bf16_gbps = eq_gbps;
        printf("%-5s %-9s %5zu MiB %2d blocks %11.1f us/block  wire %8.2f GB/s  bf16-eq %8.2f GB/s  "
               "vs bf16 %5.2fx  ideal %4.2fx\n",
               cuda ? "cuda" : "cpu", prism_precision_name(r.p), mib, blocks, per_block * 1e6,
               (double)wire / per_block / 1e9, eq_gbps, bf16_gbps > 0 ? eq_gbps / bf16_gbps : 0.0,
               (double)(n * 2) / (double)wire);
        fflush(stdout);
    }
    prism_transfer_destroy(t);
    dst_free(cuda, r.dst[0]);
    dst_free(cuda, r.dst[1]);
    return rc;
}

static int bench_backend(bool cuda, size_t min_mib, size_t max_mib, double budget)
{
    if (cuda) {
#ifdef PRISM_BENCH_CUDA
        char name[128];
        if (cuda_device(name, sizeof name) != 0)
            return 2;
        printf("# cuda device 0: %s. H2D from pinned host memory (cudaMemcpyAsync on a copy stream);\n"
               "# int8/fp8/int4: codes + scales into one of 2 staging buffers, dequantized to BF16 on a\n"
               "# second stream while the next block copies. Wall clock per round, host waits at its end.\n",
               name);
#endif
    } else {
        long cpus = sysconf(_SC_NPROCESSORS_ONLN);
        printf("# cpu (%ld CPUs), no GPU: the \"H2D\" is host memory to host memory. bf16: one memcpy\n"
               "# (one thread); int8/fp8/int4: prism_dequantize_cpu of codes + scales to BF16 (the\n"
               "# kernels' threads). Not a bus: the ratio compares a dequantize with a copy.\n",
               cpus);
    }
    printf("# per line: device, precision, block size (BF16), blocks per round, time per block, wire\n"
           "# GB/s, BF16-equivalent GB/s, that over bf16's at this size, and the ideal ratio\n"
           "# (BF16 bytes / wire bytes)\n");
    fflush(stdout);
    uint16_t *weights = malloc(max_mib * MIB);
    if (!weights) {
        fprintf(stderr, "prism-bench: not enough memory for a %zu MiB block\n", max_mib);
        return 1;
    }
    fill_weights(weights, max_mib * MIB / 2);
    int rc = 0;
    for (size_t mib = min_mib; mib <= max_mib && rc == 0; mib *= 4)
        rc = bench_size(cuda, mib, weights, budget);
    free(weights);
    return rc;
}

int bench_transfer_main(int argc, char **argv)
{
    size_t min_mib = 16, max_mib = 256;
    bool min_given = false;
    const char *device = "all";
    double budget = 0.3;
    for (int i = 2; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            transfer_usage(stdout);
            return 0;
        }
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!v) {
            fprintf(stderr, "prism-bench: %s needs a value (see prism-bench transfer --help)\n", a);
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
            if (!strcmp(a, "--min-mib")) {
                min_mib = n;
                min_given = true;
            } else {
                max_mib = n;
            }
        } else if (!strcmp(a, "--device")) {
            if (strcmp(v, "cpu") && strcmp(v, "cuda") && strcmp(v, "all")) {
                fprintf(stderr, "prism-bench: --device: '%s' is not cpu, cuda or all\n", v);
                return 2;
            }
            device = v;
        } else if (!strcmp(a, "--seconds")) {
            budget = strtod(v, &end);
            if (*end || !(budget > 0 && budget <= 60)) {
                fprintf(stderr, "prism-bench: --seconds: '%s' is not a number of seconds in (0, 60]\n", v);
                return 2;
            }
        } else {
            fprintf(stderr, "prism-bench: unknown option '%s' (see prism-bench transfer --help)\n", a);
            return 2;
        }
    }
    if (!min_given && min_mib > max_mib)
        min_mib = max_mib;
    if (min_mib > max_mib) {
        fprintf(stderr, "prism-bench: --min-mib %zu is above --max-mib %zu\n", min_mib, max_mib);
        return 2;
    }
    bool want_cpu = strcmp(device, "cuda") != 0, want_cuda = strcmp(device, "cpu") != 0;
    int rc = 0;
    if (want_cpu)
        rc |= bench_backend(false, min_mib, max_mib, budget);
#ifdef PRISM_BENCH_CUDA
    if (want_cuda && rc == 0) {
        int count = 0;
        prism_error err;
        if (prism_cuda_device_count(&count, &err) != PRISM_OK || count == 0) {
            if (!strcmp(device, "cuda")) {
                fprintf(stderr, "prism-bench: no CUDA device: %s\n", err.message);
                rc = 2;
            }
        } else {
            rc |= bench_backend(true, min_mib, max_mib, budget);
        }
    }
#else
    if (want_cuda && !strcmp(device, "cuda")) {
        fprintf(stderr, "prism-bench: this build has no CUDA\n");
        rc = 2;
    }
#endif
    return rc;
}
