/* prism-bench scales: the scale modes of DESIGN 4.7 side by side on the same inputs (issue 17).
 *
 * A float32 "weight" tensor of --size MiB drifts over --steps steps (each step adds small noise;
 * in the last quarter a few outliers, 1 element in 10,000, grow to 30 times the tensor's spread,
 * so that scales fixed earlier clip them). Every format is quantized in blocks of --block under
 * each scale mode, on the same tensor at every step:
 *   current  the FP32 scale of the block's amax (prism_quantize_counted_cpu)
 *   pow2     that scale rounded up to a power of two (the same call, POW2)
 *   delayed  prism_quant_scale_delayed(max of the block's amax over the 16 earlier steps, margin)
 *            then prism_quantize_scaled_cpu, whose amax output feeds the history
 *   static   the current scales of step 0, kept (prism_quantize_scaled_cpu)
 * Step 0 seeds the delayed history and the static scales and is not counted in the figures.
 * Per format and mode, one line: the time of one step's quantization (the median of repeated
 * runs on the last step's tensor; delayed includes building its scales from the history), its
 * GB/s (float32 read + codes written + scales read or written) and the ratio to a threaded
 * memcpy of as many bytes measured in the same run; the relative error ||x - dq(q(x))|| / ||x||
 * averaged over the counted steps and its ratio to current's; the saturated and underflowed
 * fractions of all counted elements. A last line per format times prism_quantize_cpu (current,
 * not counted) for reference. */
#define _POSIX_C_SOURCE 200809L
#include "bench.h"
#include "prism/kernels.h"

#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define HISTORY 16

static void usage(FILE *to)
{
    fprintf(to,
            "usage: prism-bench scales [options]\n"
            "  The scale modes (current, pow2, delayed, static) on the same drifting float32\n"
            "  tensor, per format: quantize throughput and its ratio to a copy, relative error\n"
            "  against the input and its ratio to current's, saturated and underflowed fractions.\n"
            "  --size MIB       the tensor's size in MiB of float32 (default 64)\n"
            "  --steps N        steps of drift, at least 2 (default 24; step 0 seeds the history)\n"
            "  --block K        elements per block (default 128)\n"
            "  --margin M       delayed: scale_margin, the power of two of headroom (default 0)\n"
            "  --format NAME    int8, fp8_e4m3, fp8_e5m2, int4 or all (default all)\n"
            "  --seconds S      time budget of each timing (default 0.3)\n");
}

/* ---- a threaded copy, the bandwidth reference ---------------------------------------------- */

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

typedef struct copy_ctx {
    char *dst;
    const char *src;
    size_t len;
    int threads;
} copy_ctx;

static int copy_fn(void *ctx)
{
    copy_ctx *c = ctx;
    pthread_t ids[64];
    copy_part parts[64];
    size_t share = (c->len / (size_t)c->threads) & ~(size_t)63;
    for (int t = 0; t < c->threads; t++) {
        parts[t].dst = c->dst + (size_t)t * share;
        parts[t].src = c->src + (size_t)t * share;
        parts[t].len = t == c->threads - 1 ? c->len - (size_t)t * share : share;
    }
    for (int t = 1; t < c->threads; t++)
        pthread_create(&ids[t], NULL, copy_thread, &parts[t]);
    copy_thread(&parts[0]);
    for (int t = 1; t < c->threads; t++)
        pthread_join(ids[t], NULL);
    return 0;
}

/* ---- the modes ------------------------------------------------------------------------------- */

enum { MODE_CURRENT, MODE_POW2, MODE_DELAYED, MODE_STATIC, MODE_PLAIN, MODES };
static const char *const mode_names[MODES] = {"current", "pow2", "delayed", "static", "current-plain"};

/* One format's state across the steps, and one mode's call. */
typedef struct scales_run {
    prism_quant_spec spec;
    prism_tensor x;
    size_t groups, code_bytes;
    int margin;
    uint8_t *codes;
    float *scales;        /* the scales of the call (computed, or given) */
    float *static_scales; /* step 0's current scales */
    float *history;       /* HISTORY rows of groups amaxes (0: none yet) */
    size_t history_next;
    float *amax; /* the scaled call's amax out */
    prism_quant_counts counts;
    int mode;
} scales_run;

/* The delayed scales from the history (the largest amax of each block over the rows). */
static void delayed_scales(scales_run *r)
{
    for (size_t g = 0; g < r->groups; g++) {
        float most = 0.0f;
        for (size_t h = 0; h < HISTORY; h++) {
            float a = r->history[h * r->groups + g];
            most = a > most ? a : most;
        }
        r->scales[g] = prism_quant_scale_delayed(most, r->margin, r->spec.format);
    }
}

/* One quantization of r->x under r->mode into r->codes (and r->amax for the given-scale modes). */
static int quantize_mode(void *ctx)
{
    scales_run *r = ctx;
    prism_error err;
    prism_status st;
    switch (r->mode) {
    case MODE_CURRENT:
    case MODE_POW2:
        r->spec.scale_mode = r->mode == MODE_POW2 ? PRISM_SCALE_POW2 : PRISM_SCALE_FP32;
        st = prism_quantize_counted_cpu(&r->spec, &r->x, r->codes, r->scales, &r->counts, &err);
        break;
    case MODE_DELAYED:
        delayed_scales(r);
        st = prism_quantize_scaled_cpu(&r->spec, &r->x, r->scales, r->codes, r->amax, &r->counts, &err);
        break;
    case MODE_STATIC:
        memcpy(r->scales, r->static_scales, r->groups * sizeof *r->scales);
        st = prism_quantize_scaled_cpu(&r->spec, &r->x, r->scales, r->codes, r->amax, &r->counts, &err);
        break;
    default:
        r->spec.scale_mode = PRISM_SCALE_FP32;
        st = prism_quantize_cpu(&r->spec, &r->x, r->codes, r->scales, NULL, &err);
        break;
    }
    if (st != PRISM_OK) {
        fprintf(stderr, "prism-bench scales: %s: %s\n", mode_names[r->mode], err.message);
        return -1;
    }
    return 0;
}

/* ---- the drifting tensor ------------------------------------------------------------------- */

static uint64_t next_random(uint64_t *state) /* splitmix64 */
{
    uint64_t z = (*state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

/* A roughly normal value of standard deviation 1 (the sum of four uniforms, rescaled). */
static float gauss(uint64_t *state)
{
    double s = 0;
    for (int k = 0; k < 4; k++)
        s += (double)(next_random(state) >> 11) * 0x1p-53;
    return (float)((s - 2.0) * 1.7320508);
}

/* Step `step` of `steps`: x += noise of 1% of the spread; in the last quarter every 10,000th
 * element (from a fixed offset) grows towards 30 times the spread. */
static void drift(float *x, size_t n, size_t step, size_t steps, uint64_t *state)
{
    const float spread = 0.02f;
    for (size_t i = 0; i < n; i++)
        x[i] += 0.01f * spread * gauss(state);
    if (step >= steps - steps / 4)
        for (size_t i = 4321 % (n ? n : 1); i < n; i += 10000)
            x[i] = (x[i] < 0 ? -30.0f : 30.0f) * spread * (float)(step + 1 - (steps - steps / 4)) /
                   (float)(steps / 4 ? steps / 4 : 1);
}

/* ---- main ------------------------------------------------------------------------------------- */

int bench_scales_main(int argc, char **argv)
{
    size_t mib = 64, steps = 24, block = 128;
    int margin = 0;
    const char *only = "all";
    double budget = 0.3;
    for (int i = 2; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage(stdout);
            return 0;
        }
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!v) {
            fprintf(stderr, "prism-bench scales: %s needs a value (see --help)\n", a);
            return 2;
        }
        i++;
        char *end;
        if (!strcmp(a, "--size") || !strcmp(a, "--steps") || !strcmp(a, "--block")) {
            unsigned long n = strtoul(v, &end, 10);
            unsigned long most = !strcmp(a, "--size") ? 65536 : 1000000;
            unsigned long least = !strcmp(a, "--steps") ? 2 : 1;
            if (*end || n < least || n > most) {
                fprintf(stderr, "prism-bench scales: %s: '%s' is not an integer from %lu to %lu\n", a, v,
                        least, most);
                return 2;
            }
            if (!strcmp(a, "--size"))
                mib = n;
            else if (!strcmp(a, "--steps"))
                steps = n;
            else
                block = n;
        } else if (!strcmp(a, "--margin")) {
            long m = strtol(v, &end, 10);
            if (*end || m < -64 || m > 64) {
                fprintf(stderr, "prism-bench scales: --margin: '%s' is not an integer from -64 to 64\n", v);
                return 2;
            }
            margin = (int)m;
        } else if (!strcmp(a, "--format")) {
            if (strcmp(v, "int8") && strcmp(v, "fp8_e4m3") && strcmp(v, "fp8_e5m2") && strcmp(v, "int4") &&
                strcmp(v, "all")) {
                fprintf(stderr, "prism-bench scales: --format: '%s' is not int8, fp8_e4m3, fp8_e5m2, int4 or all\n",
                        v);
                return 2;
            }
            only = v;
        } else if (!strcmp(a, "--seconds")) {
            budget = strtod(v, &end);
            if (*end || !(budget > 0 && budget <= 60)) {
                fprintf(stderr, "prism-bench scales: --seconds: '%s' is not a number of seconds in (0, 60]\n", v);
                return 2;
            }
        } else {
            fprintf(stderr, "prism-bench scales: unknown option '%s' (see --help)\n", a);
            return 2;
        }
    }

    static const prism_precision formats[] = {PRISM_PRECISION_INT8, PRISM_PRECISION_FP8_E4M3,
                                              PRISM_PRECISION_FP8_E5M2, PRISM_PRECISION_INT4};
    size_t n = mib * ((size_t)1 << 20) / sizeof(float);
    long cpus = sysconf(_SC_NPROCESSORS_ONLN);
    int threads = cpus < 1 ? 1 : (cpus > 64 ? 64 : (int)cpus);
    float *x0 = malloc(n * sizeof *x0), *x = malloc(n * sizeof *x), *dq = malloc(n * sizeof *dq);
    char *copy_dst = malloc(n * sizeof(float));
    if (!x0 || !x || !dq || !copy_dst) {
        fprintf(stderr, "prism-bench scales: no memory for %zu MiB\n", mib);
        return 1;
    }
    uint64_t state = 2026;
    for (size_t i = 0; i < n; i++)
        x0[i] = 0.02f * gauss(&state);
    printf("prism-bench scales: %zu MiB float32, %zu steps (step 0 seeds), blocks of %zu, margin %d, "
           "%d threads\n",
           mib, steps, block, margin, threads);
    int rc = 0;
    for (size_t f = 0; f < sizeof formats / sizeof formats[0] && rc == 0; f++) {
        if (strcmp(only, "all") && strcmp(only, prism_precision_name(formats[f])))
            continue;
        scales_run runs[MODES];
        double error_sum[MODES] = {0}, saturated[MODES] = {0}, underflowed[MODES] = {0};
        for (int m = 0; m < MODES; m++) {
            scales_run *r = &runs[m];
            memset(r, 0, sizeof *r);
            r->spec = (prism_quant_spec){.format = formats[f],
                                         .granularity = PRISM_GRANULARITY_BLOCK,
                                         .group = block};
            r->x = (prism_tensor){x, n, PRISM_DTYPE_F32};
            r->margin = margin;
            r->mode = m;
            prism_error err;
            if (prism_quant_layout(&r->spec, n, &r->groups, NULL, &r->code_bytes, &err) != PRISM_OK) {
                fprintf(stderr, "prism-bench scales: %s\n", err.message);
                return 2;
            }
            r->codes = malloc(r->code_bytes);
            r->scales = malloc(r->groups * sizeof(float));
            r->static_scales = malloc(r->groups * sizeof(float));
            r->amax = malloc(r->groups * sizeof(float));
            r->history = calloc(HISTORY * r->groups, sizeof(float));
            if (!r->codes || !r->scales || !r->static_scales || !r->amax || !r->history) {
                fprintf(stderr, "prism-bench scales: no memory for the codes and scales\n");
                return 1;
            }
        }
        memcpy(x, x0, n * sizeof *x);
        uint64_t drift_state = 77;
        for (size_t step = 0; step < steps && rc == 0; step++) {
            if (step > 0)
                drift(x, n, step, steps, &drift_state);
            for (int m = 0; m < MODES && rc == 0; m++) {
                scales_run *r = &runs[m];
                if (m == MODE_PLAIN)
                    continue; /* timed only */
                if (step == 0 && (m == MODE_DELAYED || m == MODE_STATIC)) {
                    /* Step 0 seeds: the current scales and amaxes of the first tensor. */
                    prism_error err;
                    r->spec.scale_mode = PRISM_SCALE_FP32;
                    if (prism_quantize_cpu(&r->spec, &r->x, r->codes, r->static_scales, NULL, &err) != PRISM_OK) {
                        fprintf(stderr, "prism-bench scales: %s\n", err.message);
                        rc = 1;
                        break;
                    }
                    float *row = r->history;
                    for (size_t g = 0; g < r->groups; g++) {
                        size_t b = g * block, e = b + block < n ? b + block : n;
                        float most = 0.0f;
                        for (size_t i = b; i < e; i++)
                            most = fabsf(x[i]) > most ? fabsf(x[i]) : most;
                        row[g] = most;
                    }
                    r->history_next = 1;
                    continue;
                }
                if (quantize_mode(r) != 0) {
                    rc = 1;
                    break;
                }
                if (m == MODE_DELAYED) { /* this step's amaxes join the history */
                    memcpy(r->history + r->history_next * r->groups, r->amax, r->groups * sizeof(float));
                    r->history_next = (r->history_next + 1) % HISTORY;
                }
                if (step == 0)
                    continue;
                prism_error err;
                double e;
                prism_tensor out = {dq, n, PRISM_DTYPE_F32};
                if (prism_dequantize_cpu(&r->spec, r->codes, r->scales, n, dq, PRISM_DTYPE_F32, &err) != PRISM_OK ||
                    prism_relative_error_cpu(&r->x, &out, &e, &err) != PRISM_OK) {
                    fprintf(stderr, "prism-bench scales: %s\n", err.message);
                    rc = 1;
                    break;
                }
                error_sum[m] += e;
                saturated[m] += (double)r->counts.saturated;
                underflowed[m] += (double)r->counts.underflowed;
            }
        }
        if (rc != 0)
            break;
        /* Timings on the last step's tensor (delayed: from the history as it now stands). */
        double counted = (double)(steps - 1) * (double)n;
        double error_current = error_sum[MODE_CURRENT] / (double)(steps - 1);
        for (int m = 0; m < MODES; m++) {
            scales_run *r = &runs[m];
            double bytes = (double)n * 4 + (double)r->code_bytes + (double)r->groups * 4;
            copy_ctx cc = {copy_dst, (const char *)x, (size_t)bytes / 2, threads};
            double copy_s = bench_median_time(copy_fn, &cc, budget);
            double copy_gbps = (double)(cc.len * 2) / copy_s / 1e9;
            double s = bench_median_time(quantize_mode, r, budget);
            if (s < 0 || copy_s <= 0) {
                rc = 1;
                break;
            }
            double gbps = bytes / s / 1e9;
            printf("cpu  %-8s %-13s %6zu MiB %10.1f us %8.2f GB/s  copy %8.2f GB/s  ratio %5.2f",
                   prism_precision_name(formats[f]), mode_names[m], mib, s * 1e6, gbps, copy_gbps,
                   gbps / copy_gbps);
            if (m != MODE_PLAIN) {
                double err_m = error_sum[m] / (double)(steps - 1);
                printf("  relerr %.4e  vs current %6.3f  saturated %.3e  underflowed %.3e", err_m,
                       error_current > 0 ? err_m / error_current : 0.0, saturated[m] / counted,
                       underflowed[m] / counted);
            }
            printf("\n");
            fflush(stdout);
        }
        for (int m = 0; m < MODES; m++) {
            free(runs[m].codes);
            free(runs[m].scales);
            free(runs[m].static_scales);
            free(runs[m].amax);
            free(runs[m].history);
        }
    }
    free(x0);
    free(x);
    free(dq);
    free(copy_dst);
    return rc;
}
