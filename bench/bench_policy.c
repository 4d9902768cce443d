/* Policy decision time (DESIGN 13: under 1 ms for 10,000 blocks).
 *
 * Napkin math: a decision touches each block once: a window mean over history_window (5)
 * doubles, a score, a comparison or two, and the summary. That is ~100 bytes and a few dozen
 * instructions per block, so 10,000 blocks should take tens of microseconds on one core; the
 * memory (10,000 x ~150 bytes) fits in L2. Anything near 1 ms would mean a quadratic step.
 *
 * For each block count, the benchmark feeds steps whose statistics change so blocks really
 * switch, and times prism_policy_add_step on decision steps (ingest of the step included: the
 * decision cannot happen without it), on plain steps (ingest only), and the telemetry line.
 * Issue 18's target at 100,000 blocks, a decision under 1 ms at p99 beside ingest of 100 records
 * a microsecond (itself 1 ms), reads as the decision less its step's ingest: the "less ingest"
 * column, the decision step's p99 less the plain step's median. */
#define _POSIX_C_SOURCE 200809L
#include "policy.h"
#include "bench_telemetry_before.h"
#include "telemetry.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e6 + (double)ts.tv_nsec / 1e3;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double percentile(double *v, size_t n, double p)
{
    qsort(v, n, sizeof *v, cmp_double);
    size_t i = (size_t)(p * (double)(n - 1) + 0.5);
    return v[i];
}

/* A deterministic pseudo-random stream (xorshift), so every run sees the same statistics. */
static uint64_t rng_state = 0x9E3779B97F4A7C15ull;
static double rnd(void)
{
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (double)(rng_state >> 11) / 9007199254740992.0;
}

static void fill_step(prism_block_stats *b, size_t n, uint64_t step)
{
    for (size_t i = 0; i < n; i++) {
        /* A third of the blocks drift between sensitive and insensitive over time. */
        double base = (i % 3 == 0) ? 1.0 + sin((double)step / 40.0 + (double)i) : 0.2 + 1.6 * (double)(i % 7) / 7.0;
        b[i] = (prism_block_stats){(uint32_t)(i * 7 + 3), base * (0.9 + 0.2 * rnd()), 1.0, 0.0, 1e-4, 1u << 20, 0, false, 0, 0};
    }
}

static int run(size_t nblocks, int decisions)
{
    prism_error err;
    prism_config cfg;
    if (prism_config_init(&cfg, &err))
        return 1;
    cfg.warmup_steps = 5;
    cfg.update_interval_steps = 2;
    cfg.min_steps_between_switches = 4;
    prism_policy *p = prism_policy_create(&cfg, &err);
    if (!p) {
        prism_config_free(&cfg);
        return 1;
    }
    /* Half the blocks have a calibration error for the low format: their records carry an
     * error_score and a sensitivity that is not their grad_score (four numbers, not three). */
    for (size_t i = 0; i < nblocks; i += 2)
        if (prism_policy_set_calibration(p, cfg.low_precision, (uint32_t)(i * 7 + 3), 0.01 + 0.04 * rnd(), &err)) {
            fprintf(stderr, "bench: %s\n", err.message);
            return 1;
        }
    prism_block_stats *b = malloc(nblocks * sizeof *b);
    double *dec = malloc((size_t)decisions * sizeof *dec);
    double *ing = malloc((size_t)decisions * sizeof *ing);
    double *tel = malloc((size_t)decisions * sizeof *tel);
    double *tel_before = malloc((size_t)decisions * sizeof *tel_before);
    if (!b || !dec || !ing || !tel || !tel_before)
        return 1;
    prism_buf out = {0};
    int nd = 0, ni = 0;
    size_t changes = 0;
    for (uint64_t step = 1; nd < decisions; step++) {
        fill_step(b, nblocks, step);
        prism_step_result res;
        double t0 = now_us();
        if (prism_policy_add_step(p, step, NULL, b, nblocks, &res, &err)) {
            fprintf(stderr, "bench: %s\n", err.message);
            return 1;
        }
        double t1 = now_us();
        if (res.decided) {
            dec[nd] = t1 - t0;
            changes += res.summary.precision_changes;
            out.len = 0;
            double t2 = now_us();
            prism_telemetry_append(&out, p, &res.summary, 1.0, NULL);
            tel[nd] = now_us() - t2;
            /* The baseline: the same record as it was written before issue 18. */
            size_t len = out.len;
            double t3 = now_us();
            telemetry_append_before(&out, p, &res.summary, 1.0, NULL);
            tel_before[nd++] = now_us() - t3;
            if (out.len != 2 * len || memcmp(out.data, out.data + len, len) != 0) {
                fprintf(stderr, "bench: the two telemetry records differ\n");
                return 1;
            }
        } else if (ni < decisions) {
            ing[ni++] = t1 - t0;
        }
    }
    double tel50 = percentile(tel, (size_t)nd, 0.5), before50 = percentile(tel_before, (size_t)nd, 0.5);
    double ing50 = percentile(ing, (size_t)ni, 0.5), dec99 = percentile(dec, (size_t)nd, 0.99);
    printf("%8zu  %10.1f  %10.1f  %11.1f  %10.1f  %14.1f  %13.1f  %12.1f  %8.1fx  %10zu\n", nblocks,
           percentile(dec, (size_t)nd, 0.5), dec99, dec99 - ing50, ing50, (double)nblocks / ing50, tel50, before50,
           before50 / tel50, changes / (size_t)nd);
    prism_buf_free(&out);
    free(b);
    free(dec);
    free(ing);
    free(tel);
    free(tel_before);
    prism_policy_destroy(p);
    prism_config_free(&cfg);
    return 0;
}

static int usage(FILE *to, int code)
{
    fprintf(to, "usage: bench_policy [DECISIONS] [--max-blocks N]\n\n"
                "Times policy decisions, step ingest and the telemetry record for 48, 1,000, 10,000 and 100,000\n"
                "blocks (those up to N with --max-blocks); DECISIONS per block count (default 300, at least 10).\n"
                "A decision step's time includes the ingest of its records; \"less ingest\" is its p99 less the\n"
                "median ingest of a plain step of the same size.\n"
                "The record is timed twice: as prismd writes it, and as it was written before issue 18 (the\n"
                "baseline); the two texts must be equal, else the benchmark fails. Results: bench/README.md.\n");
    return code;
}

int main(int argc, char **argv)
{
    int decisions = 300;
    size_t max_blocks = SIZE_MAX;
    for (int i = 1; i < argc; i++) {
        char *end;
        if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0)
            return usage(stdout, 0);
        if (strcmp(argv[i], "--max-blocks") == 0 && i + 1 < argc) {
            unsigned long long v = strtoull(argv[++i], &end, 10);
            if (*end || v == 0) {
                fprintf(stderr, "bench_policy: --max-blocks: '%s' is not a block count\n", argv[i]);
                return 2;
            }
            max_blocks = (size_t)v;
        } else {
            long v = strtol(argv[i], &end, 10);
            if (*end || v < 1 || v > 1000000) {
                fprintf(stderr, "bench_policy: '%s' is not a number of decisions from 1 to 1000000\n", argv[i]);
                return usage(stderr, 2);
            }
            decisions = v < 10 ? 10 : (int)v;
        }
    }
    printf("policy decision time, %d decisions per row (microseconds; targets at 100000 blocks: decision p99 less "
           "ingest < 1000, ingest >= 100 records/us, telemetry 10x faster than before)\n",
           decisions);
    printf("%8s  %10s  %10s  %11s  %10s  %14s  %13s  %12s  %9s  %10s\n", "blocks", "decide p50", "decide p99",
           "less ingest", "ingest p50", "records/us", "telemetry p50", "before p50", "speedup", "changes/dec");
    static const size_t sizes[] = {48, 1000, 10000, 100000};
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0] && sizes[i] <= max_blocks; i++)
        if (run(sizes[i], decisions))
            return 1;
    return 0;
}
