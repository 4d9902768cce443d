/* prism_profile_measure (profile.h): the checks, the CPU profile, and the parts the GPU profile
 * (profile_cuda.cu) shares: the clock, the cost sweep and its line fit, the class name.
 *
 * The CPU profile, in the order it is measured, each part repeating until its share of the
 * budget (cpu_part_weight, of the time left: prism_profile_part_end) is spent. Every buffer's
 * first touch is inside the budget and sized by it: a first touch is not cheap everywhere (a
 * virtual machine whose host maps memory in on demand takes 10 to 20 us a 4 KiB page, 0.4 to
 * 0.8 s for the copy's 2 x 64 MiB, where a second pass over them takes 6 ms).
 *   copy       memcpy cut across every CPU this process may run on (the way the threaded kernels
 *              use them), of twice the last-level cache those CPUs hold together and at least
 *              64 MiB, at most 512 MiB: memory, not cache. The buffers are first touched in
 *              256 KiB chunks dealt round the threads, for at most half the part's share and at
 *              least one chunk a thread, and the copy runs over the leading chunks that were
 *              touched: a budget too small for the whole copies less, which may be cache. h2d and
 *              d2h are this figure: on a CPU rank, "moving a block to the device" is this copy.
 *   matrices   C = A B, square, n from 64 doubling up to 1,024 while a multiply at the next n
 *              would take under a quarter of the time left; the inputs and working copies of
 *              each n are made (and first touched) just before it is timed, so a budget that
 *              stops at n = 64 does not pay for 1,024; rows of C cut across the CPUs. BF16
 *              and FP16 inputs are converted to FP32 with prism_bf16_to_f32 / prism_f16_to_f32
 *              and multiplied with FP32 accumulation; INT8 is widened to INT16 and accumulated in
 *              INT32. The conversions are part of the time (they are what such a multiply costs).
 *              Portable C compiled for the baseline instruction set: an optimised BLAS does
 *              better, so these are lower bounds, alike for every CPU of a class. No FP8: 0.
 *   quantize   prism_quantize_cpu (INT8, blocks of 128, FP32 scales, nearest) of BF16 tensors of
 *              4 KiB to 16 MiB, fitted as a line (prism_profile_cost_sweep). Input and output
 *              are the copy's buffers, which the first touch left holding test values: the sizes
 *              stop where the touched chunks do (at least one chunk a thread: up to 256 KiB).
 *   cast       BF16 to FP32, the same sizes (up to half the touched bytes: the output is twice
 *              the input) and fit: the exact conversion (the BF16 bits become the top half of the
 *              FP32 word, what prism_bf16_to_f32 does) written inline in a loop, on the caller's
 *              thread below 64 Ki elements and across the CPUs above, as a cast in a CPU training
 *              step is done.
 *   memory     MemTotal from /proc/meminfo, lowered to the process's cgroup memory limit when
 *              there is one (a container's limit is what it can use). MemTotal, not MemAvailable:
 *              it is what the rank can plan with once training runs (the trainer has not
 *              allocated yet when the agent starts, and MemAvailable moves with the page cache),
 *              it is the same on every rank of a class, and it matches the GPU figure (the
 *              device's total memory). Without /proc/meminfo: sysconf's physical pages. */
#define _GNU_SOURCE /* sched_getaffinity and CPU_COUNT */

#include "profile_internal.h"

#include "prism/kernels.h"
#ifdef PRISM_PROFILE_CUDA
#include "prism/cuda.h"
#endif

#include <ctype.h>
#include <inttypes.h>
#include <math.h>
#include <pthread.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>
#include <sys/utsname.h>
#include <time.h>
#include <unistd.h>

#define COPY_BYTES_MIN ((size_t)64 << 20)
#define COPY_BYTES_MAX ((size_t)512 << 20)
#define MATMUL_N_MIN 64
#define MATMUL_N_MAX 1024
#define MATMUL_PAD 16 /* elements past n in a row of the working copies: no power-of-two stride */
#define MATMUL_WORK ((size_t)MATMUL_N_MAX * (MATMUL_N_MAX + MATMUL_PAD))
#define COST_MIN_BYTES ((size_t)4 << 10)
#define COST_MAX_BYTES ((size_t)16 << 20)
#define CAST_THREAD_MIN ((size_t)1 << 16) /* elements below which a cast stays on one thread */
#define TOUCH_CHUNK ((size_t)256 << 10) /* the copy buffers' first touch: chunk c goes to
                                           thread c % threads, which reads the clock after each */
#define PATTERN_HALVES 4096 /* test values repeated over src by its first touch */
#define MAX_THREADS 64
#define MAX_SWEEP_SIZES 32

/* Floors of a fitted cost (prism_profile_cost_sweep). */
#define FIXED_SECONDS_FLOOR 1e-9
#define SECONDS_PER_BYTE_FLOOR 1e-15

/* The shares of the budget of the CPU profile's parts. */
static const double cpu_part_weight[PRISM_PROFILE_CPU_PARTS] = {
    [PRISM_PROFILE_CPU_COPY] = 0.15, /* and the buffers' first touch */
    [PRISM_PROFILE_CPU_BF16] = 0.15,
    [PRISM_PROFILE_CPU_FP16] = 0.15,
    [PRISM_PROFILE_CPU_INT8] = 0.15,
    [PRISM_PROFILE_CPU_QUANTIZE] = 0.25,
    [PRISM_PROFILE_CPU_CAST] = 0.15,
};

double prism_profile_clock(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

double prism_profile_part_end(double end, const double *weights, size_t parts, size_t part)
{
    double left = 0;
    for (size_t i = part; i < parts; i++)
        left += weights[i];
    const double now = prism_profile_clock();
    const double rest = end > now ? end - now : 0;
    return left > 0 ? now + rest * weights[part] / left : now;
}

/* ---- options ------------------------------------------------------------------------------ */

void prism_profile_options_init(prism_profile_options *o)
{
    if (!o)
        return;
    o->device = PRISM_PROFILE_DEVICE_CPU;
    o->budget_ms = PRISM_PROFILE_BUDGET_DEFAULT_MS;
    o->device_class = NULL;
}

int prism_profile_default_device(void)
{
#ifdef PRISM_PROFILE_CUDA
    int count = 0;
    prism_error e = {0};
    if (prism_cuda_device_count(&count, &e) == PRISM_OK && count > 0)
        return 0;
#endif
    return PRISM_PROFILE_DEVICE_CPU;
}

/* Letters, digits, '-', '_' and '.': what a class name needs, and nothing a label, a metric or a
 * log line would have to quote. */
static bool class_char_ok(char c)
{
    return isalnum((unsigned char)c) || c == '-' || c == '_' || c == '.';
}

static prism_status check_options(const prism_profile_options *o, prism_error *err)
{
    if (o->device < PRISM_PROFILE_DEVICE_CPU)
        return prism_error_set(err, PRISM_ERR_INVALID,
                               "device %d is not a device: -1 is the CPU, 0 and up a CUDA device",
                               o->device);
    if (o->budget_ms != 0 &&
        (o->budget_ms < PRISM_PROFILE_BUDGET_MIN_MS || o->budget_ms > PRISM_PROFILE_BUDGET_MAX_MS))
        return prism_error_set(err, PRISM_ERR_INVALID,
                               "budget_ms %d is out of range: %d to %d milliseconds, or 0 for %d",
                               o->budget_ms, PRISM_PROFILE_BUDGET_MIN_MS,
                               PRISM_PROFILE_BUDGET_MAX_MS, PRISM_PROFILE_BUDGET_DEFAULT_MS);
    if (o->device_class && o->device_class[0]) {
        size_t len = strlen(o->device_class);
        if (len >= PRISM_PROFILE_CLASS_MAX)
            return prism_error_set(err, PRISM_ERR_INVALID,
                                   "device_class is %zu characters long: at most %d", len,
                                   PRISM_PROFILE_CLASS_MAX - 1);
        for (size_t i = 0; i < len; i++)
            if (!class_char_ok(o->device_class[i]))
                return prism_error_set(err, PRISM_ERR_INVALID,
                                       "device_class \"%s\": character %zu is not a letter, digit, "
                                       "'-', '_' or '.'",
                                       o->device_class, i + 1);
    }
    return PRISM_OK;
}

/* ---- names -------------------------------------------------------------------------------- */

static bool word_is(const char *w, size_t n, const char *lower)
{
    if (strlen(lower) != n)
        return false;
    for (size_t i = 0; i < n; i++)
        if (tolower((unsigned char)w[i]) != lower[i])
            return false;
    return true;
}

void prism_profile_device_class(const char *prefix, const char *name, char *buf, size_t len)
{
    if (!buf || len == 0)
        return;
    const bool cpu = prefix && strcmp(prefix, "cpu") == 0;
    size_t out = 0;
    const char *p = prefix ? prefix : "";
    while (*p && out + 1 < len)
        buf[out++] = *p++;
    buf[out] = '\0';
    if (!name)
        return;
    const char *end = name + strlen(name);
    if (cpu) {
        const char *at = strstr(name, " @ ");
        if (at)
            end = at;
    }
    int depth = 0; /* inside parentheses: "(R)", "(TM)" */
    const char *s = name;
    while (s < end) {
        if (*s == '(' || *s == ')') {
            depth += *s == '(' ? 1 : (depth > 0 ? -1 : 0);
            s++;
            continue;
        }
        if (depth > 0 || !isalnum((unsigned char)*s)) {
            s++;
            continue;
        }
        const char *w = s; /* a word: a run of letters and digits */
        while (s < end && isalnum((unsigned char)*s))
            s++;
        size_t n = (size_t)(s - w);
        if (cpu && (word_is(w, n, "cpu") || word_is(w, n, "processor")))
            continue;
        size_t need = n + (out > 0 ? 1 : 0);
        if (out + need + 1 > len) /* cut on a '-': the words that fit */
            break;
        if (out > 0)
            buf[out++] = '-';
        for (size_t i = 0; i < n; i++)
            buf[out++] = (char)tolower((unsigned char)w[i]);
        buf[out] = '\0';
    }
}

/* The CPU's model name ("AMD EPYC 7763 64-Core Processor"), or the machine's architecture where
 * /proc/cpuinfo names none (many ARM kernels). */
static void cpu_model_name(char *buf, size_t len)
{
    buf[0] = '\0';
    FILE *f = fopen("/proc/cpuinfo", "r");
    if (f) {
        char line[512];
        while (fgets(line, sizeof line, f)) {
            if (strncmp(line, "model name", 10) != 0)
                continue;
            const char *colon = strchr(line, ':');
            if (!colon)
                continue;
            const char *v = colon + 1;
            while (*v == ' ' || *v == '\t')
                v++;
            size_t n = strcspn(v, "\n");
            while (n > 0 && isspace((unsigned char)v[n - 1]))
                n--;
            if (n >= len)
                n = len - 1;
            memcpy(buf, v, n);
            buf[n] = '\0';
            break;
        }
        fclose(f);
    }
    if (buf[0] == '\0') {
        struct utsname u;
        if (uname(&u) == 0)
            snprintf(buf, len, "%s", u.machine);
    }
}

/* ---- memory ------------------------------------------------------------------------------- */

/* The first unsigned number in a file ("max" and unreadable files: false). */
static bool read_u64_file(const char *path, uint64_t *v)
{
    FILE *f = fopen(path, "r");
    if (!f)
        return false;
    unsigned long long x = 0;
    int n = fscanf(f, "%llu", &x);
    fclose(f);
    if (n != 1)
        return false;
    *v = (uint64_t)x;
    return true;
}

static uint64_t cpu_memory_bytes(void)
{
    uint64_t bytes = 0;
    FILE *f = fopen("/proc/meminfo", "r");
    if (f) {
        char line[256];
        unsigned long long kib = 0;
        while (fgets(line, sizeof line, f))
            if (sscanf(line, "MemTotal: %llu kB", &kib) == 1) {
                bytes = (uint64_t)kib * 1024u;
                break;
            }
        fclose(f);
    }
    if (bytes == 0) {
        long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
        if (pages > 0 && page > 0)
            bytes = (uint64_t)pages * (uint64_t)page;
    }
    /* The container's limit, as the container sees its cgroup (v2, then v1; "max" or v1's huge
     * "unlimited" value leave MemTotal as it is). */
    static const char *const limits[] = {"/sys/fs/cgroup/memory.max",
                                         "/sys/fs/cgroup/memory/memory.limit_in_bytes"};
    for (size_t i = 0; i < sizeof limits / sizeof limits[0]; i++) {
        uint64_t limit = 0;
        if (read_u64_file(limits[i], &limit) && limit > 0 && (bytes == 0 || limit < bytes))
            bytes = limit;
    }
    return bytes;
}

/* ---- caches ------------------------------------------------------------------------------- */

/* A sysfs cache size ("32768K") in bytes; 0 when unreadable. */
static size_t cache_size_bytes(const char *path)
{
    FILE *f = fopen(path, "r");
    if (!f)
        return 0;
    unsigned long long v = 0;
    char unit = 0;
    int n = fscanf(f, "%llu%c", &v, &unit);
    fclose(f);
    if (n < 1)
        return 0;
    if (n == 2 && (unit == 'K' || unit == 'k'))
        v <<= 10;
    else if (n == 2 && (unit == 'M' || unit == 'm'))
        v <<= 20;
    return (size_t)v;
}

/* The CPUs in a sysfs CPU list ("0-7,64-71"); 0 when unreadable. */
static int cpu_list_count(const char *path)
{
    FILE *f = fopen(path, "r");
    if (!f)
        return 0;
    int count = 0, lo = 0, hi = 0;
    for (;;) {
        int n = fscanf(f, "%d", &lo);
        if (n != 1)
            break;
        hi = lo;
        int c = fgetc(f);
        if (c == '-') {
            if (fscanf(f, "%d", &hi) != 1)
                break;
            c = fgetc(f);
        }
        if (hi >= lo)
            count += hi - lo + 1;
        if (c != ',')
            break;
    }
    fclose(f);
    return count;
}

/* The last-level cache that `threads` CPUs hold together: cpu0's largest cache times the number
 * of such caches the threads span (threads / the CPUs sharing one, rounded up). 0 when sysfs
 * does not say. */
static size_t cpu_cache_bytes(int threads)
{
    size_t total = 0;
    for (int index = 0; index < 8; index++) {
        char path[96];
        snprintf(path, sizeof path, "/sys/devices/system/cpu/cpu0/cache/index%d/size", index);
        size_t size = cache_size_bytes(path);
        snprintf(path, sizeof path, "/sys/devices/system/cpu/cpu0/cache/index%d/shared_cpu_list",
                 index);
        int sharing = cpu_list_count(path);
        if (size == 0 || sharing <= 0)
            continue;
        size_t caches = ((size_t)threads + (size_t)sharing - 1) / (size_t)sharing;
        if (size * caches > total)
            total = size * caches;
    }
    return total;
}

/* ---- threads ------------------------------------------------------------------------------ */

/* The CPUs this process may run on (its affinity mask), 1 to MAX_THREADS. */
static int cpu_threads(void)
{
    long n = 0;
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof set, &set) == 0)
        n = CPU_COUNT(&set);
    if (n <= 0)
        n = sysconf(_SC_NPROCESSORS_ONLN);
    if (n <= 0)
        n = 1;
    return n > MAX_THREADS ? MAX_THREADS : (int)n;
}

typedef void (*part_fn)(void *ctx, int part, int parts);

typedef struct part_arg {
    part_fn fn;
    void *ctx;
    int part, parts;
} part_arg;

static void *part_main(void *arg)
{
    part_arg *a = arg;
    a->fn(a->ctx, a->part, a->parts);
    return NULL;
}

/* Runs fn(ctx, part, parts) for every part < parts, part 0 on the caller's thread and the others
 * on threads of their own (on the caller's too, one after the other, if one cannot start), and
 * returns when all are done. */
static void run_parts(int parts, part_fn fn, void *ctx)
{
    pthread_t ids[MAX_THREADS];
    part_arg args[MAX_THREADS];
    bool started[MAX_THREADS] = {false};
    if (parts > MAX_THREADS)
        parts = MAX_THREADS;
    for (int t = 1; t < parts; t++) {
        args[t] = (part_arg){fn, ctx, t, parts};
        started[t] = pthread_create(&ids[t], NULL, part_main, &args[t]) == 0;
        if (!started[t])
            fn(ctx, t, parts);
    }
    fn(ctx, 0, parts > 0 ? parts : 1);
    for (int t = 1; t < parts; t++)
        if (started[t])
            pthread_join(ids[t], NULL);
}

static size_t min_size(size_t a, size_t b)
{
    return a < b ? a : b;
}

/* [*lo, *hi): part's share of n items. */
static void part_span(size_t n, int part, int parts, size_t *lo, size_t *hi)
{
    *lo = n * (size_t)part / (size_t)parts;
    *hi = n * (size_t)(part + 1) / (size_t)parts;
}

/* ---- timing ------------------------------------------------------------------------------- */

typedef prism_status (*rep_fn)(void *ctx, prism_error *err);

/* Runs fn while another run, as long as the shortest so far, ends before deadline (at least
 * once), adding each run to *runs; *best gets the shortest, in seconds, > 0. */
static prism_status best_time(rep_fn fn, void *ctx, double deadline, unsigned *runs, double *best,
                              prism_error *err)
{
    double shortest = INFINITY;
    do {
        (*runs)++;
        double t0 = prism_profile_clock();
        prism_status st = fn(ctx, err);
        if (st != PRISM_OK)
            return st;
        double t = prism_profile_clock() - t0;
        if (t < shortest)
            shortest = t;
    } while (prism_profile_clock() + shortest < deadline);
    *best = shortest > 1e-9 ? shortest : 1e-9; /* the clock's resolution */
    return PRISM_OK;
}

/* ---- line fit and cost sweep --------------------------------------------------------------- */

prism_status prism_linear_fit(const double *x, const double *y, size_t n, prism_linear_cost *out,
                              prism_error *err)
{
    if (!x || !y || !out)
        return prism_error_set(err, PRISM_ERR_INVALID, "prism_linear_fit: x, y or out is NULL");
    if (n < 2)
        return prism_error_set(err, PRISM_ERR_INVALID,
                               "prism_linear_fit: %zu point%s: a line needs at least 2", n,
                               n == 1 ? "" : "s");
    bool distinct = false;
    for (size_t i = 0; i < n; i++) {
        if (!isfinite(x[i]) || x[i] < 0)
            return prism_error_set(err, PRISM_ERR_INVALID,
                                   "prism_linear_fit: x[%zu] = %g: must be finite and >= 0", i,
                                   x[i]);
        if (!isfinite(y[i]) || y[i] <= 0)
            return prism_error_set(err, PRISM_ERR_INVALID,
                                   "prism_linear_fit: y[%zu] = %g: must be finite and > 0", i,
                                   y[i]);
        if (x[i] != x[0])
            distinct = true;
    }
    if (!distinct)
        return prism_error_set(err, PRISM_ERR_INVALID,
                               "prism_linear_fit: every x is %g: a line needs two different x",
                               x[0]);
    /* Weighted least squares with weights 1 / y^2, on centred sums (no cancellation of large
     * sums of squares). */
    double w_sum = 0, wx = 0, wy = 0;
    for (size_t i = 0; i < n; i++) {
        double w = 1.0 / (y[i] * y[i]);
        w_sum += w;
        wx += w * x[i];
        wy += w * y[i];
    }
    const double x_mean = wx / w_sum, y_mean = wy / w_sum;
    double sxx = 0, sxy = 0;
    for (size_t i = 0; i < n; i++) {
        double w = 1.0 / (y[i] * y[i]), dx = x[i] - x_mean;
        sxx += w * dx * dx;
        sxy += w * dx * (y[i] - y_mean);
    }
    out->seconds_per_byte = sxy / sxx;
    out->fixed_seconds = y_mean - out->seconds_per_byte * x_mean;
    return PRISM_OK;
}

prism_status prism_profile_cost_sweep(prism_profile_timer timer, void *ctx, size_t min_bytes,
                                      size_t max_bytes, double deadline, prism_linear_cost *out,
                                      prism_error *err)
{
    double xs[MAX_SWEEP_SIZES], ys[MAX_SWEEP_SIZES], weights[MAX_SWEEP_SIZES];
    size_t sizes = 0;
    for (size_t b = min_bytes; b <= max_bytes && sizes < MAX_SWEEP_SIZES; b *= 4) {
        weights[sizes] = (double)(sizes + 1);
        sizes++;
    }
    size_t n = 0;
    for (size_t b = min_bytes; n < sizes; b *= 4) {
        double now = prism_profile_clock();
        if (n >= 3 && now + ys[n - 1] * (double)b / xs[n - 1] > deadline)
            break;
        prism_status st = timer(ctx, b, prism_profile_part_end(deadline, weights, sizes, n),
                                &ys[n], err);
        if (st != PRISM_OK)
            return st;
        xs[n++] = (double)b;
    }
    prism_linear_cost fit;
    prism_status st = prism_linear_fit(xs, ys, n, &fit, err);
    if (st != PRISM_OK)
        return st;
    out->fixed_seconds = fit.fixed_seconds > FIXED_SECONDS_FLOOR ? fit.fixed_seconds
                                                                 : FIXED_SECONDS_FLOOR;
    out->seconds_per_byte = fit.seconds_per_byte > SECONDS_PER_BYTE_FLOOR ? fit.seconds_per_byte
                                                                          : SECONDS_PER_BYTE_FLOOR;
    return PRISM_OK;
}

/* ---- CPU: copy ---------------------------------------------------------------------------- */

typedef struct cpu_bufs {
    int threads;
    size_t copy_bytes;       /* COPY_BYTES_MIN to COPY_BYTES_MAX */
    char *src, *dst;         /* copy_bytes each; later the input and output of quantize and cast */
    float *scales;           /* quantize's scales for COST_MAX_BYTES of BF16 */
    uint16_t *a16, *b16;     /* matrix inputs, n x n, up to MATMUL_N_MAX^2 each */
    int8_t *a8, *b8;
    float *af, *bf, *cf;     /* FP32 copies and result, rows of n + MATMUL_PAD (MATMUL_WORK) */
    int16_t *ai, *bi;        /* INT16 copies, the same */
    int32_t *ci;             /* INT32 result, the same */
    size_t inputs_filled;    /* leading elements of a16, b16, a8, b8 holding test values */
    uint64_t inputs_state;   /* random_half's state for the next of them */
    double touch_end;        /* when the copy buffers' first touch stops */
    size_t chunks[MAX_THREADS]; /* TOUCH_CHUNKs each thread touched */
    size_t touched;          /* the leading bytes of src and dst touched: what the copy copies */
    uint16_t pattern[PATTERN_HALVES]; /* what src is filled with: BF16 test values */
    prism_profile_cpu_trace trace;
} cpu_bufs;

static void cpu_bufs_free(cpu_bufs *b)
{
    free(b->src);
    free(b->dst);
    free(b->scales);
    free(b->a16);
    free(b->b16);
    free(b->a8);
    free(b->b8);
    free(b->af);
    free(b->bf);
    free(b->cf);
    free(b->ai);
    free(b->bi);
    free(b->ci);
}

static prism_status cpu_bufs_alloc(cpu_bufs *b, prism_error *err)
{
    const size_t nn = (size_t)MATMUL_N_MAX * MATMUL_N_MAX;
    b->src = malloc(b->copy_bytes);
    b->dst = malloc(b->copy_bytes);
    b->scales = malloc(COST_MAX_BYTES / 2 / PRISM_QUANT_BLOCK_DEFAULT * sizeof(float));
    b->a16 = malloc(nn * sizeof *b->a16);
    b->b16 = malloc(nn * sizeof *b->b16);
    b->a8 = malloc(nn);
    b->b8 = malloc(nn);
    b->af = malloc(MATMUL_WORK * sizeof *b->af);
    b->bf = malloc(MATMUL_WORK * sizeof *b->bf);
    b->cf = malloc(MATMUL_WORK * sizeof *b->cf);
    b->ai = malloc(MATMUL_WORK * sizeof *b->ai);
    b->bi = malloc(MATMUL_WORK * sizeof *b->bi);
    b->ci = malloc(MATMUL_WORK * sizeof *b->ci);
    if (!b->src || !b->dst || !b->scales || !b->a16 || !b->b16 || !b->a8 || !b->b8 || !b->af ||
        !b->bf || !b->cf || !b->ai || !b->bi || !b->ci)
        return prism_error_set(err, PRISM_ERR_NOMEM,
                               "CPU profile: cannot allocate its buffers (about %zu MiB)",
                               (2 * b->copy_bytes + 6 * nn + 20 * MATMUL_WORK) >> 20);
    return PRISM_OK;
}

/* A random 16-bit pattern that is a finite normal number both as BF16 (|x| in [2^-7, 16)) and
 * as FP16 (|x| in [1, 4)): the matrix inputs serve both formats. */
static uint16_t random_half(uint64_t *state)
{
    *state = *state * 6364136223846793005ull + 1442695040888963407ull;
    uint32_t r = (uint32_t)(*state >> 33);
    uint32_t sign = r & 1u, exp = 120u + (r >> 1) % 11u, mant = (r >> 5) & 0x7fu;
    return (uint16_t)(sign << 15 | exp << 7 | mant);
}

/* Chunk c (TOUCH_CHUNK bytes, fewer at the end) of src and dst is thread c % parts's, in the
 * touch and in the copy alike: the pages a thread copies are those it touched first. */
static void copy_part(void *ctx, int part, int parts)
{
    cpu_bufs *b = ctx;
    for (size_t at = (size_t)part * TOUCH_CHUNK; at < b->touched; at += (size_t)parts * TOUCH_CHUNK)
        memcpy(b->dst + at, b->src + at, min_size(TOUCH_CHUNK, b->touched - at));
}

/* The first touch of the copy buffers, by the threads that copy them: the pages exist (and sit
 * near the CPUs that use them) before anything is timed, and src holds test values (b->pattern
 * over and over) for quantize and cast. The thread touches its chunks in order until it has
 * none left or b->touch_end has passed (at least one), and counts them in b->chunks[part]. */
static void touch_part(void *ctx, int part, int parts)
{
    cpu_bufs *b = ctx;
    size_t done = 0;
    for (size_t at = (size_t)part * TOUCH_CHUNK; at < b->copy_bytes;
         at += (size_t)parts * TOUCH_CHUNK) {
        const size_t end = at + min_size(TOUCH_CHUNK, b->copy_bytes - at);
        for (size_t p = at; p < end; p += sizeof b->pattern)
            memcpy(b->src + p, b->pattern, min_size(sizeof b->pattern, end - p));
        memset(b->dst + at, 0, end - at);
        done++;
        if (prism_profile_clock() >= b->touch_end)
            break;
    }
    b->chunks[part] = done;
}

/* Touches the copy buffers until `touch_end` (touch_part) and sets b->touched to the leading
 * chunks that every thread reached: at least one chunk a thread. */
static void touch_copy_buffers(cpu_bufs *b, double touch_end)
{
    uint64_t state = 0x9e3779b97f4a7c15ull;
    for (size_t i = 0; i < PATTERN_HALVES; i++)
        b->pattern[i] = random_half(&state);
    b->touch_end = touch_end;
    run_parts(b->threads, touch_part, b);
    /* Thread t's first chunk not touched is chunk chunks[t] * threads + t. */
    size_t chunks = SIZE_MAX;
    for (int t = 0; t < b->threads; t++)
        chunks = min_size(chunks, b->chunks[t] * (size_t)b->threads + (size_t)t);
    b->touched = chunks > b->copy_bytes / TOUCH_CHUNK ? b->copy_bytes : chunks * TOUCH_CHUNK;
}

static prism_status copy_rep(void *ctx, prism_error *err)
{
    (void)err;
    cpu_bufs *b = ctx;
    run_parts(b->threads, copy_part, b);
    return PRISM_OK;
}

/* ---- CPU: matrices ------------------------------------------------------------------------ */

typedef enum matmul_kind { MATMUL_BF16, MATMUL_F16, MATMUL_INT8 } matmul_kind;

typedef struct matmul {
    cpu_bufs *b;
    matmul_kind kind;
    size_t n;
} matmul;

/* Tiles of C = A B (n x n, row-major, rows ld apart): a MM_BK x MM_BJ tile of B (128 KiB of
 * FP32) stays in the L2 cache while every row of the part's band runs over it; the inner loop is
 * over contiguous columns, which the compiler vectorises. ld is n + MATMUL_PAD: rows a power of
 * two apart would fall into the same cache sets. */
#define MM_BK 128
#define MM_BJ 256

static void matmul_f32_rows(const float *restrict a, const float *restrict b, float *restrict c,
                            size_t n, size_t ld, size_t lo, size_t hi)
{
    memset(c + lo * ld, 0, (hi - lo) * ld * sizeof *c);
    for (size_t j0 = 0; j0 < n; j0 += MM_BJ) {
        const size_t j1 = min_size(j0 + MM_BJ, n);
        for (size_t k0 = 0; k0 < n; k0 += MM_BK) {
            const size_t k1 = min_size(k0 + MM_BK, n);
            for (size_t i = lo; i < hi; i++) {
                float *restrict ci = c + i * ld;
                for (size_t k = k0; k < k1; k++) {
                    const float aik = a[i * ld + k];
                    const float *restrict bk = b + k * ld;
                    for (size_t j = j0; j < j1; j++)
                        ci[j] += aik * bk[j];
                }
            }
        }
    }
}

static void matmul_i16_rows(const int16_t *restrict a, const int16_t *restrict b,
                            int32_t *restrict c, size_t n, size_t ld, size_t lo, size_t hi)
{
    memset(c + lo * ld, 0, (hi - lo) * ld * sizeof *c);
    for (size_t j0 = 0; j0 < n; j0 += MM_BJ) {
        const size_t j1 = min_size(j0 + MM_BJ, n);
        for (size_t k0 = 0; k0 < n; k0 += MM_BK) {
            const size_t k1 = min_size(k0 + MM_BK, n);
            for (size_t i = lo; i < hi; i++) {
                int32_t *restrict ci = c + i * ld;
                for (size_t k = k0; k < k1; k++) {
                    const int32_t aik = a[i * ld + k];
                    const int16_t *restrict bk = b + k * ld;
                    for (size_t j = j0; j < j1; j++)
                        ci[j] += aik * bk[j];
                }
            }
        }
    }
}

/* Converts the part's rows of A and B to the type the multiply runs in. */
static void matmul_convert_part(void *ctx, int part, int parts)
{
    const matmul *m = ctx;
    cpu_bufs *b = m->b;
    const size_t n = m->n, ld = n + MATMUL_PAD;
    size_t lo, hi;
    part_span(n, part, parts, &lo, &hi);
    for (size_t i = lo; i < hi; i++) {
        const size_t in = i * n, out = i * ld;
        switch (m->kind) {
        case MATMUL_BF16:
            for (size_t j = 0; j < n; j++) {
                b->af[out + j] = prism_bf16_to_f32(b->a16[in + j]);
                b->bf[out + j] = prism_bf16_to_f32(b->b16[in + j]);
            }
            break;
        case MATMUL_F16:
            for (size_t j = 0; j < n; j++) {
                b->af[out + j] = prism_f16_to_f32(b->a16[in + j]);
                b->bf[out + j] = prism_f16_to_f32(b->b16[in + j]);
            }
            break;
        case MATMUL_INT8:
            for (size_t j = 0; j < n; j++) {
                b->ai[out + j] = b->a8[in + j];
                b->bi[out + j] = b->b8[in + j];
            }
            break;
        }
    }
}

static void matmul_multiply_part(void *ctx, int part, int parts)
{
    const matmul *m = ctx;
    cpu_bufs *b = m->b;
    size_t lo, hi;
    part_span(m->n, part, parts, &lo, &hi);
    if (m->kind == MATMUL_INT8)
        matmul_i16_rows(b->ai, b->bi, b->ci, m->n, m->n + MATMUL_PAD, lo, hi);
    else
        matmul_f32_rows(b->af, b->bf, b->cf, m->n, m->n + MATMUL_PAD, lo, hi);
}

static prism_status matmul_rep(void *ctx, prism_error *err)
{
    (void)err;
    matmul *m = ctx;
    int parts = m->b->threads;
    if ((size_t)parts > m->n / 8)
        parts = (int)(m->n / 8);
    run_parts(parts, matmul_convert_part, m); /* every part needs all of B */
    run_parts(parts, matmul_multiply_part, m);
    return PRISM_OK;
}

/* Makes an n x n multiply ready to time: the first n * n elements of the inputs hold test values
 * (each element the same whatever n, from one random sequence), and the kind's working copies
 * have had their first touch. Only what n needs: this grows with n^2, the multiply with n^3. */
static void matmul_prepare(cpu_bufs *b, matmul_kind kind, size_t n)
{
    for (; b->inputs_filled < n * n; b->inputs_filled++) {
        const size_t i = b->inputs_filled;
        b->a16[i] = random_half(&b->inputs_state);
        b->b16[i] = random_half(&b->inputs_state);
        b->a8[i] = (int8_t)((int)(b->a16[i] % 255u) - 127);
        b->b8[i] = (int8_t)((int)(b->b16[i] % 255u) - 127);
    }
    const size_t work = n * (n + MATMUL_PAD);
    if (kind == MATMUL_INT8) {
        memset(b->ai, 0, work * sizeof *b->ai);
        memset(b->bi, 0, work * sizeof *b->bi);
        memset(b->ci, 0, work * sizeof *b->ci);
    } else {
        memset(b->af, 0, work * sizeof *b->af);
        memset(b->bf, 0, work * sizeof *b->bf);
        memset(b->cf, 0, work * sizeof *b->cf);
    }
}

static double matmul_ops(size_t n, double seconds)
{
    const double d = (double)n;
    return 2.0 * d * d * d / seconds;
}

/* Operations per second of the kind's multiply, the best over the sizes tried: n doubles from
 * MATMUL_N_MIN while a multiply at the next n (about 8 times the best at this n, timed over up to
 * a sixteenth of the time left) would take under a quarter of the time left; the last n repeats
 * until the deadline (if it has not passed yet). A size whose every repetition another process
 * slowed down only stops the doubling early; it does not make the figure. */
static prism_status time_matmul(cpu_bufs *b, matmul_kind kind, prism_profile_cpu_part part,
                                double deadline, double *ops, prism_error *err)
{
    matmul m = {b, kind, MATMUL_N_MIN};
    unsigned *runs = &b->trace.runs[part];
    double best = 0, t = 0;
    prism_status st;
    for (;;) {
        matmul_prepare(b, kind, m.n);
        b->trace.size[part] = m.n;
        const double now = prism_profile_clock();
        if ((st = best_time(matmul_rep, &m, now + (deadline - now) / 16, runs, &t, err)) !=
            PRISM_OK)
            return st;
        best = fmax(best, matmul_ops(m.n, t));
        if (m.n * 2 > MATMUL_N_MAX || 32 * t > deadline - prism_profile_clock())
            break;
        m.n *= 2;
    }
    if (prism_profile_clock() < deadline) {
        if ((st = best_time(matmul_rep, &m, deadline, runs, &t, err)) != PRISM_OK)
            return st;
        best = fmax(best, matmul_ops(m.n, t));
    }
    *ops = best;
    return PRISM_OK;
}

/* ---- CPU: quantize and cast --------------------------------------------------------------- */

typedef struct cost_run {
    cpu_bufs *b;
    size_t numel; /* BF16 elements */
    int parts;    /* cast: threads */
} cost_run;

static prism_status quantize_rep(void *ctx, prism_error *err)
{
    const cost_run *r = ctx;
    const prism_quant_spec spec = {.format = PRISM_PRECISION_INT8,
                                   .granularity = PRISM_GRANULARITY_BLOCK,
                                   .group = PRISM_QUANT_BLOCK_DEFAULT};
    const prism_tensor x = {.data = r->b->src, .numel = r->numel, .dtype = PRISM_DTYPE_BF16};
    prism_status st = prism_quantize_cpu(&spec, &x, (uint8_t *)r->b->dst, r->b->scales, NULL, err);
    if (st != PRISM_OK)
        prism_error_prefix(err, "CPU profile: quantize of %zu elements", r->numel);
    return st;
}

static prism_status time_quantize(void *ctx, size_t bytes, double deadline, double *seconds,
                                  prism_error *err)
{
    cost_run r = {ctx, bytes / 2, 1};
    prism_profile_cpu_trace *trace = &r.b->trace;
    trace->size[PRISM_PROFILE_CPU_QUANTIZE] = bytes;
    return best_time(quantize_rep, &r, deadline, &trace->runs[PRISM_PROFILE_CPU_QUANTIZE], seconds,
                     err);
}

static void cast_part(void *ctx, int part, int parts)
{
    const cost_run *r = ctx;
    const uint16_t *restrict in = (const uint16_t *)(const void *)r->b->src;
    uint32_t *restrict out = (uint32_t *)(void *)r->b->dst; /* the FP32 values' bits */
    size_t lo, hi;
    part_span(r->numel, part, parts, &lo, &hi);
    for (size_t i = lo; i < hi; i++)
        out[i] = (uint32_t)in[i] << 16;
}

static prism_status cast_rep(void *ctx, prism_error *err)
{
    (void)err;
    cost_run *r = ctx;
    run_parts(r->parts, cast_part, r);
    return PRISM_OK;
}

static prism_status time_cast(void *ctx, size_t bytes, double deadline, double *seconds,
                              prism_error *err)
{
    cpu_bufs *b = ctx;
    const size_t numel = bytes / 2;
    cost_run r = {b, numel, numel >= CAST_THREAD_MIN ? b->threads : 1};
    b->trace.size[PRISM_PROFILE_CPU_CAST] = bytes;
    return best_time(cast_rep, &r, deadline, &b->trace.runs[PRISM_PROFILE_CPU_CAST], seconds, err);
}

/* ---- CPU: the whole profile --------------------------------------------------------------- */

static prism_status cpu_measure(cpu_bufs *b, double end, prism_device_profile *p,
                                prism_error *err)
{
    prism_status st = cpu_bufs_alloc(b, err);
    if (st != PRISM_OK)
        return st;
#define PART_END(part) prism_profile_part_end(end, cpu_part_weight, PRISM_PROFILE_CPU_PARTS, (part))

    const double copy_end = PART_END(PRISM_PROFILE_CPU_COPY);
    const double now = prism_profile_clock();
    touch_copy_buffers(b, now + (copy_end - now) / 2);
    b->trace.size[PRISM_PROFILE_CPU_COPY] = b->touched;
    double t = 0;
    if ((st = best_time(copy_rep, b, copy_end, &b->trace.runs[PRISM_PROFILE_CPU_COPY], &t, err)) !=
        PRISM_OK)
        return st;
    p->copy_bytes_per_second = (double)b->touched / t;
    p->h2d_bytes_per_second = p->copy_bytes_per_second;
    p->d2h_bytes_per_second = p->copy_bytes_per_second;

    b->inputs_state = 0x2545f4914f6cdd1dull;
    if ((st = time_matmul(b, MATMUL_BF16, PRISM_PROFILE_CPU_BF16, PART_END(PRISM_PROFILE_CPU_BF16),
                          &p->bf16_ops_per_second, err)) ||
        (st = time_matmul(b, MATMUL_F16, PRISM_PROFILE_CPU_FP16, PART_END(PRISM_PROFILE_CPU_FP16),
                          &p->fp16_ops_per_second, err)) ||
        (st = time_matmul(b, MATMUL_INT8, PRISM_PROFILE_CPU_INT8, PART_END(PRISM_PROFILE_CPU_INT8),
                          &p->int8_ops_per_second, err)))
        return st;
    p->fp8_ops_per_second = 0;

    /* Inputs and outputs in the touched chunks: quantize writes half its input's bytes, cast
     * twice. */
    if ((st = prism_profile_cost_sweep(time_quantize, b, COST_MIN_BYTES,
                                       min_size(COST_MAX_BYTES, b->touched),
                                       PART_END(PRISM_PROFILE_CPU_QUANTIZE), &p->quantize_cost,
                                       err)) != PRISM_OK)
        return st;
    return prism_profile_cost_sweep(time_cast, b, COST_MIN_BYTES,
                                    min_size(COST_MAX_BYTES, b->touched / 2),
                                    PART_END(PRISM_PROFILE_CPU_CAST), &p->cast_cost, err);
#undef PART_END
}

prism_status prism_profile_measure_cpu(double end, prism_device_profile *p,
                                       prism_profile_cpu_trace *trace, prism_error *err)
{
    cpu_model_name(p->device_name, sizeof p->device_name);
    p->memory_bytes = cpu_memory_bytes();
    if (p->memory_bytes == 0)
        return prism_error_set(err, PRISM_ERR_IO,
                               "CPU profile: neither /proc/meminfo nor sysconf says how much "
                               "memory there is");
    cpu_bufs b = {.threads = cpu_threads()};
    b.trace.threads = b.threads;
    b.copy_bytes = 2 * cpu_cache_bytes(b.threads);
    if (b.copy_bytes < COPY_BYTES_MIN)
        b.copy_bytes = COPY_BYTES_MIN;
    if (b.copy_bytes > COPY_BYTES_MAX)
        b.copy_bytes = COPY_BYTES_MAX;
    b.copy_bytes &= ~(size_t)4095;
    prism_status st = cpu_measure(&b, end, p, err);
    if (trace)
        *trace = b.trace;
    cpu_bufs_free(&b);
    return st;
}

/* ---- GPU ---------------------------------------------------------------------------------- */

static prism_status measure_gpu(int device, double budget_s, prism_device_profile *p,
                                prism_error *err)
{
#ifdef PRISM_PROFILE_CUDA
    int count = 0;
    prism_error e = {0};
    if (prism_cuda_device_count(&count, &e) != PRISM_OK)
        return prism_error_set(err, PRISM_ERR_UNAVAILABLE, "device %d: no usable CUDA device: %s",
                               device, e.message);
    if (device >= count)
        return prism_error_set(err, PRISM_ERR_INVALID,
                               "device %d does not exist: this machine has %d CUDA device%s",
                               device, count, count == 1 ? "" : "s");
    return prism_profile_measure_cuda(device, budget_s, p, err);
#else
    (void)budget_s;
    (void)p;
    return prism_error_set(err, PRISM_ERR_UNAVAILABLE,
                           "device %d: this build of Prism has no CUDA support (it was built "
                           "without a CUDA toolkit); device -1 profiles the CPU",
                           device);
#endif
}

/* ---- the profile -------------------------------------------------------------------------- */

/* Every figure finite and > 0 (fp8 >= 0, and 0 on the CPU): a measurement that breaks this is a
 * bug or a broken device, and must not reach the planner. */
static prism_status check_figures(const prism_device_profile *p, prism_error *err)
{
    const struct {
        const char *name;
        double v;
    } figures[] = {
        {"bf16_ops_per_second", p->bf16_ops_per_second},
        {"fp16_ops_per_second", p->fp16_ops_per_second},
        {"int8_ops_per_second", p->int8_ops_per_second},
        {"quantize_cost.fixed_seconds", p->quantize_cost.fixed_seconds},
        {"quantize_cost.seconds_per_byte", p->quantize_cost.seconds_per_byte},
        {"cast_cost.fixed_seconds", p->cast_cost.fixed_seconds},
        {"cast_cost.seconds_per_byte", p->cast_cost.seconds_per_byte},
        {"h2d_bytes_per_second", p->h2d_bytes_per_second},
        {"d2h_bytes_per_second", p->d2h_bytes_per_second},
        {"copy_bytes_per_second", p->copy_bytes_per_second},
    };
    for (size_t i = 0; i < sizeof figures / sizeof figures[0]; i++)
        if (!isfinite(figures[i].v) || figures[i].v <= 0)
            return prism_error_set(err, PRISM_ERR_STATE,
                                   "device %d: the measurement gave %s = %g, not a positive number",
                                   p->device, figures[i].name, figures[i].v);
    if (!isfinite(p->fp8_ops_per_second) || p->fp8_ops_per_second < 0 ||
        (p->device < 0 && p->fp8_ops_per_second != 0))
        return prism_error_set(err, PRISM_ERR_STATE,
                               "device %d: the measurement gave fp8_ops_per_second = %g", p->device,
                               p->fp8_ops_per_second);
    if (p->memory_bytes == 0)
        return prism_error_set(err, PRISM_ERR_STATE, "device %d: the measurement gave no memory",
                               p->device);
    return PRISM_OK;
}

prism_status prism_profile_measure(const prism_profile_options *o, prism_device_profile *out,
                                   prism_error *err)
{
    const double start = prism_profile_clock();
    if (!out)
        return prism_error_set(err, PRISM_ERR_INVALID, "prism_profile_measure: out is NULL");
    prism_profile_options opts;
    if (o)
        opts = *o;
    else
        prism_profile_options_init(&opts);
    prism_status st = check_options(&opts, err);
    if (st != PRISM_OK)
        return st;
    const int budget_ms = opts.budget_ms ? opts.budget_ms : PRISM_PROFILE_BUDGET_DEFAULT_MS;
    const double budget_s = budget_ms * 1e-3;

    prism_device_profile p;
    memset(&p, 0, sizeof p);
    p.device = opts.device;
    if (opts.device == PRISM_PROFILE_DEVICE_CPU)
        st = prism_profile_measure_cpu(start + budget_s, &p, NULL, err);
    else
        st = measure_gpu(opts.device, budget_s, &p, err);
    if (st != PRISM_OK)
        return st;
    if ((st = check_figures(&p, err)) != PRISM_OK)
        return st;
    if (opts.device_class && opts.device_class[0])
        snprintf(p.device_class, sizeof p.device_class, "%s", opts.device_class);
    else
        prism_profile_device_class(p.device < 0 ? "cpu" : "gpu", p.device_name, p.device_class,
                                   sizeof p.device_class);
    *out = p;
    return PRISM_OK;
}

/* ---- printing ----------------------------------------------------------------------------- */

static void print_rate(FILE *f, const char *name, double v, const char *unit, double scale,
                       const char *scaled_unit)
{
    fprintf(f, "%-24s %.4g %s (%.2f %s)\n", name, v, unit, v / scale, scaled_unit);
}

static void print_cost(FILE *f, const char *name, const prism_linear_cost *c)
{
    fprintf(f, "%-24s %.4g s + %.4g s/byte (%.2f us per call, %.2f GB/s)\n", name,
            c->fixed_seconds, c->seconds_per_byte, c->fixed_seconds * 1e6,
            1e-9 / c->seconds_per_byte);
}

void prism_profile_print(FILE *f, const prism_device_profile *p)
{
    if (!f || !p)
        return;
    fprintf(f, "%-24s %s\n", "device_class", p->device_class);
    fprintf(f, "%-24s %s\n", "device_name", p->device_name);
    if (p->device < 0)
        fprintf(f, "%-24s cpu\n", "device");
    else
        fprintf(f, "%-24s cuda:%d\n", "device", p->device);
    fprintf(f, "%-24s %" PRIu64 " bytes (%.2f GiB)\n", "memory_bytes", p->memory_bytes,
            (double)p->memory_bytes / 1073741824.0);
    print_rate(f, "bf16_ops_per_second", p->bf16_ops_per_second, "ops/s", 1e12, "Tops/s");
    print_rate(f, "fp16_ops_per_second", p->fp16_ops_per_second, "ops/s", 1e12, "Tops/s");
    print_rate(f, "int8_ops_per_second", p->int8_ops_per_second, "ops/s", 1e12, "Tops/s");
    if (p->fp8_ops_per_second > 0)
        print_rate(f, "fp8_ops_per_second", p->fp8_ops_per_second, "ops/s", 1e12, "Tops/s");
    else
        fprintf(f, "%-24s 0 ops/s (none)\n", "fp8_ops_per_second");
    print_cost(f, "quantize_cost", &p->quantize_cost);
    print_cost(f, "cast_cost", &p->cast_cost);
    print_rate(f, "h2d_bytes_per_second", p->h2d_bytes_per_second, "bytes/s", 1e9, "GB/s");
    print_rate(f, "d2h_bytes_per_second", p->d2h_bytes_per_second, "bytes/s", 1e9, "GB/s");
    print_rate(f, "copy_bytes_per_second", p->copy_bytes_per_second, "bytes/s", 1e9, "GB/s");
}
