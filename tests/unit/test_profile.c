/* The DeviceProfile of agent/profile.h. The CPU profile is measured once with a 300 ms budget and
 * its figures checked against the contract (finite, > 0, no FP8, memory as /proc/meminfo says);
 * how the budget is kept is pinned exactly, on a budget already spent (what each part then runs
 * does not depend on how fast the machine is), and how long a measurement takes is printed, not
 * asserted: that is a benchmark's business. The line fit, the class names and the option checks
 * are pinned exactly. The GPU cases run where a CUDA device is there and print "(SKIPPED: no
 * CUDA device)" elsewhere; asking for a GPU on a machine without one is checked here instead. */
#define _GNU_SOURCE /* sched_getaffinity, CPU_COUNT; clock_gettime, open_memstream */

#include "profile.h"
#include "profile_internal.h"
#include "testutil.h"

#ifdef PRISM_TEST_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif

#include <math.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define CPU_BUDGET_MS 300
#define GPU_BUDGET_MS 1000

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* CUDA devices this process can use, asked of the runtime directly (0 in a build without CUDA). */
static int device_count(void)
{
    static int count = -1;
    if (count < 0) {
        count = 0;
#ifdef PRISM_TEST_HAVE_CUDA
        int n = 0;
        if (cudaGetDeviceCount(&n) == cudaSuccess && n > 0)
            count = n;
        (void)cudaGetLastError();
#endif
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

/* A measurement and how long the call took. */
typedef struct measured {
    prism_status st;
    prism_error err;
    prism_device_profile p;
    double seconds;
} measured;

static void measure(const prism_profile_options *o, measured *m)
{
    memset(m, 0, sizeof *m);
    double t0 = now_s();
    m->st = prism_profile_measure(o, &m->p, &m->err);
    m->seconds = now_s() - t0;
    if (m->st != PRISM_OK)
        printf("(%s: %s) ", prism_status_name(m->st), m->err.message);
}

/* The CPU profile with CPU_BUDGET_MS, measured once for all the cases that look at it. */
static const measured *cpu_profile(void)
{
    static measured m;
    static bool done;
    if (!done) {
        prism_profile_options o;
        prism_profile_options_init(&o);
        o.budget_ms = CPU_BUDGET_MS;
        measure(&o, &m);
        done = true;
        if (m.st == PRISM_OK) {
            printf("\n");
            prism_profile_print(stdout, &m.p);
            printf("(measured in %.0f ms) ", m.seconds * 1e3);
        }
    }
    return &m;
}

/* Every figure but FP8 finite and > 0; FP8 finite and >= 0. */
static void assert_figures_positive(const prism_device_profile *p)
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
    for (size_t i = 0; i < sizeof figures / sizeof figures[0]; i++) {
        if (!(isfinite(figures[i].v) && figures[i].v > 0))
            printf("(%s = %g) ", figures[i].name, figures[i].v);
        CU_ASSERT(isfinite(figures[i].v) && figures[i].v > 0);
    }
    CU_ASSERT(isfinite(p->fp8_ops_per_second) && p->fp8_ops_per_second >= 0);
    CU_ASSERT(p->memory_bytes > 0);
    CU_ASSERT(strlen(p->device_name) > 0);
    CU_ASSERT(strlen(p->device_class) > 0);
}

/* ---- the CPU profile ---------------------------------------------------------------------- */

/* The CPUs the profile cuts its work across: this process's affinity, at most 64. */
static int profile_threads(void)
{
    cpu_set_t set;
    int n = sched_getaffinity(0, sizeof set, &set) == 0 ? CPU_COUNT(&set) : 0;
    if (n <= 0)
        n = (int)sysconf(_SC_NPROCESSORS_ONLN);
    return n <= 0 ? 1 : n > 64 ? 64 : n;
}

/* Past the budget's end nothing new starts: each part runs once at its smallest size (the copy
 * over one 256 KiB chunk a thread, the multiplies at n = 64, the sweeps at 4, 16 and 64 KiB), and
 * the figures still keep the contract. */
static void test_cpu_profile_past_its_budget_runs_each_part_once_at_its_smallest_size(void)
{
    prism_device_profile p;
    memset(&p, 0, sizeof p);
    prism_profile_cpu_trace trace;
    memset(&trace, 0xff, sizeof trace);
    prism_error err = {0};
    CU_ASSERT_EQUAL_FATAL(prism_profile_measure_cpu(prism_profile_clock(), &p, &trace, &err),
                          PRISM_OK);
    const int threads = profile_threads();
    CU_ASSERT_EQUAL(trace.threads, threads);
    static const unsigned runs[PRISM_PROFILE_CPU_PARTS] = {1, 1, 1, 1, 3, 3};
    const size_t sizes[PRISM_PROFILE_CPU_PARTS] = {(size_t)threads << 18, 64, 64, 64, 65536,
                                                   65536};
    for (int part = 0; part < PRISM_PROFILE_CPU_PARTS; part++) {
        if (trace.runs[part] != runs[part] || trace.size[part] != sizes[part])
            printf("(part %d: %u runs, size %zu) ", part, trace.runs[part], trace.size[part]);
        CU_ASSERT_EQUAL(trace.runs[part], runs[part]);
        CU_ASSERT_EQUAL(trace.size[part], sizes[part]);
    }
    p.device = PRISM_PROFILE_DEVICE_CPU;
    snprintf(p.device_class, sizeof p.device_class, "cpu");
    assert_figures_positive(&p);
    CU_ASSERT_EQUAL(p.fp8_ops_per_second, 0.0);
}

/* The sweep's timer, recording what it is asked: the sizes, and whether each deadline had
 * passed already. */
typedef struct sweep_calls {
    size_t count;
    size_t bytes[8];
    bool deadline_passed[8];
} sweep_calls;

static prism_status record_sweep_call(void *ctx, size_t bytes, double deadline, double *seconds,
                                      prism_error *err)
{
    (void)err;
    sweep_calls *c = ctx;
    if (c->count < 8) {
        c->bytes[c->count] = bytes;
        c->deadline_passed[c->count] = deadline <= prism_profile_clock();
    }
    c->count++;
    *seconds = 1e-6 + 1e-9 * (double)bytes;
    return PRISM_OK;
}

/* A sweep started past its deadline times its three smallest sizes, each with a deadline that
 * has passed (so once), and no larger one; the line through them is the timer's. */
static void test_cost_sweep_past_its_deadline_times_only_its_three_smallest_sizes(void)
{
    sweep_calls calls = {0};
    prism_linear_cost cost = {0, 0};
    prism_error err = {0};
    CU_ASSERT_EQUAL_FATAL(prism_profile_cost_sweep(record_sweep_call, &calls, 4096, 16 << 20,
                                                   prism_profile_clock(), &cost, &err),
                          PRISM_OK);
    CU_ASSERT_EQUAL_FATAL(calls.count, 3);
    static const size_t expected[3] = {4096, 16384, 65536};
    for (size_t i = 0; i < 3; i++) {
        CU_ASSERT_EQUAL(calls.bytes[i], expected[i]);
        CU_ASSERT_TRUE(calls.deadline_passed[i]);
    }
    CU_ASSERT(fabs(cost.fixed_seconds - 1e-6) <= 1e-12 * 1e-6);
    CU_ASSERT(fabs(cost.seconds_per_byte - 1e-9) <= 1e-12 * 1e-9);
}

static void test_cpu_profile_figures_are_finite_and_positive_without_fp8(void)
{
    const measured *m = cpu_profile();
    CU_ASSERT_EQUAL_FATAL(m->st, PRISM_OK);
    assert_figures_positive(&m->p);
    CU_ASSERT_EQUAL(m->p.fp8_ops_per_second, 0.0);
    CU_ASSERT_EQUAL(m->p.device, PRISM_PROFILE_DEVICE_CPU);
}

static void test_cpu_profile_host_copies_are_the_copy_bandwidth(void)
{
    const measured *m = cpu_profile();
    CU_ASSERT_EQUAL_FATAL(m->st, PRISM_OK);
    CU_ASSERT_EQUAL(m->p.h2d_bytes_per_second, m->p.copy_bytes_per_second);
    CU_ASSERT_EQUAL(m->p.d2h_bytes_per_second, m->p.copy_bytes_per_second);
}

static void test_cpu_profile_class_is_cpu_and_the_model_name(void)
{
    const measured *m = cpu_profile();
    CU_ASSERT_EQUAL_FATAL(m->st, PRISM_OK);
    CU_ASSERT_EQUAL(strncmp(m->p.device_class, "cpu", 3), 0);
    char expected[PRISM_PROFILE_CLASS_MAX];
    prism_profile_device_class("cpu", m->p.device_name, expected, sizeof expected);
    CU_ASSERT_STRING_EQUAL(m->p.device_class, expected);
}

/* The first number in a file, if it starts with one ("max" does not). */
static bool file_number(const char *path, unsigned long long *v)
{
    char *text = prism_read_file(path, NULL);
    if (!text)
        return false;
    char *end = NULL;
    *v = strtoull(text, &end, 10);
    bool ok = end != text;
    free(text);
    return ok;
}

static void test_cpu_profile_memory_is_memtotal_or_the_cgroup_limit(void)
{
    const measured *m = cpu_profile();
    CU_ASSERT_EQUAL_FATAL(m->st, PRISM_OK);
    char *meminfo = prism_read_file("/proc/meminfo", NULL);
    CU_ASSERT_PTR_NOT_NULL_FATAL(meminfo);
    const char *line = strstr(meminfo, "MemTotal:");
    CU_ASSERT_PTR_NOT_NULL_FATAL(line);
    unsigned long long expected = strtoull(line + strlen("MemTotal:"), NULL, 10) * 1024ull;
    free(meminfo);
    const char *limits[] = {"/sys/fs/cgroup/memory.max",
                            "/sys/fs/cgroup/memory/memory.limit_in_bytes"};
    for (size_t i = 0; i < 2; i++) {
        unsigned long long limit = 0;
        if (file_number(limits[i], &limit) && limit > 0 && limit < expected)
            expected = limit;
    }
    CU_ASSERT_EQUAL(m->p.memory_bytes, (uint64_t)expected);
}

static void test_device_class_override_is_kept_with_the_smallest_budget(void)
{
    prism_profile_options o = {.device = -1, .budget_ms = PRISM_PROFILE_BUDGET_MIN_MS,
                               .device_class = "train-cpu.v1_a"};
    measured m;
    measure(&o, &m);
    CU_ASSERT_EQUAL_FATAL(m.st, PRISM_OK);
    CU_ASSERT_STRING_EQUAL(m.p.device_class, "train-cpu.v1_a");
    printf("(%.0f ms) ", m.seconds * 1e3);
}

/* ---- options ------------------------------------------------------------------------------ */

static void test_options_init_gives_the_cpu_and_the_default_budget(void)
{
    prism_profile_options o = {.device = 5, .budget_ms = 7, .device_class = "x"};
    prism_profile_options_init(&o);
    CU_ASSERT_EQUAL(o.device, -1);
    CU_ASSERT_EQUAL(o.budget_ms, 1000);
    CU_ASSERT_PTR_NULL(o.device_class);
}

static void test_bad_options_are_rejected_naming_the_option(void)
{
    static const char long_class[] =
        "a123456789b123456789c123456789d123456789e123456789f123456789g123"; /* 64 */
    const struct {
        prism_profile_options o;
        const char *message;
    } cases[] = {
        {{.device = -2},
         "device -2 is not a device: -1 is the CPU, 0 and up a CUDA device"},
        {{.device = -1, .budget_ms = -1},
         "budget_ms -1 is out of range: 100 to 600000 milliseconds, or 0 for 1000"},
        {{.device = -1, .budget_ms = 99},
         "budget_ms 99 is out of range: 100 to 600000 milliseconds, or 0 for 1000"},
        {{.device = -1, .budget_ms = 600001},
         "budget_ms 600001 is out of range: 100 to 600000 milliseconds, or 0 for 1000"},
        {{.device = -1, .device_class = long_class},
         "device_class is 64 characters long: at most 63"},
        {{.device = -1, .device_class = "train h100"},
         "device_class \"train h100\": character 6 is not a letter, digit, '-', '_' or '.'"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        prism_device_profile p;
        memset(&p, 0x5a, sizeof p);
        prism_error err = {0};
        CU_ASSERT_EQUAL(prism_profile_measure(&cases[i].o, &p, &err), PRISM_ERR_INVALID);
        CU_ASSERT_EQUAL(err.status, PRISM_ERR_INVALID);
        CU_ASSERT_STRING_EQUAL(err.message, cases[i].message);
        CU_ASSERT_EQUAL(p.device_class[0], 0x5a); /* not written */
    }
    prism_error err = {0};
    CU_ASSERT_EQUAL(prism_profile_measure(NULL, NULL, &err), PRISM_ERR_INVALID);
    CU_ASSERT_STRING_EQUAL(err.message, "prism_profile_measure: out is NULL");
}

/* ---- GPU ---------------------------------------------------------------------------------- */

static void test_default_device_is_0_with_a_gpu_and_the_cpu_without(void)
{
    CU_ASSERT_EQUAL(prism_profile_default_device(), device_count() > 0 ? 0 : -1);
}

static void test_gpu_without_a_usable_device_is_unavailable(void)
{
    if (device_count() > 0) {
        printf("(a CUDA device is there: see the GPU cases) ");
        return;
    }
    prism_profile_options o = {.device = 0};
    prism_device_profile p;
    prism_error err = {0};
    CU_ASSERT_EQUAL(prism_profile_measure(&o, &p, &err), PRISM_ERR_UNAVAILABLE);
    CU_ASSERT_EQUAL(err.status, PRISM_ERR_UNAVAILABLE);
#ifdef PRISM_TEST_HAVE_CUDA
    /* The CUDA runtime's own words, after what they are about. */
    const char *prefix = "device 0: no usable CUDA device: ";
    CU_ASSERT_EQUAL(strncmp(err.message, prefix, strlen(prefix)), 0);
    CU_ASSERT_PTR_NOT_NULL(strstr(err.message, "cudaGetDeviceCount"));
#else
    CU_ASSERT_STRING_EQUAL(err.message,
                           "device 0: this build of Prism has no CUDA support (it was built "
                           "without a CUDA toolkit); device -1 profiles the CPU");
#endif
    printf("(%s) ", err.message);
}

static void test_gpu_profile_figures_are_finite_and_positive(void)
{
    if (skip_without_device())
        return;
    prism_profile_options o = {.device = 0, .budget_ms = GPU_BUDGET_MS};
    measured first, m;
    measure(&o, &first); /* creates the context and loads cuBLAS's kernels */
    CU_ASSERT_EQUAL_FATAL(first.st, PRISM_OK);
    measure(&o, &m);
    CU_ASSERT_EQUAL_FATAL(m.st, PRISM_OK);
    printf("\n");
    prism_profile_print(stdout, &m.p);
    printf("(measured in %.0f ms, the first time %.0f ms) ", m.seconds * 1e3, first.seconds * 1e3);
    assert_figures_positive(&m.p);
    CU_ASSERT_EQUAL(m.p.device, 0);
    CU_ASSERT_EQUAL(strncmp(m.p.device_class, "gpu-", 4), 0);
    char expected[PRISM_PROFILE_CLASS_MAX];
    prism_profile_device_class("gpu", m.p.device_name, expected, sizeof expected);
    CU_ASSERT_STRING_EQUAL(m.p.device_class, expected);
#ifdef PRISM_TEST_HAVE_CUDA
    size_t free_bytes = 0, total_bytes = 0;
    int major = 0, minor = 0;
    CU_ASSERT_EQUAL_FATAL(cudaSetDevice(0), cudaSuccess);
    CU_ASSERT_EQUAL_FATAL(cudaMemGetInfo(&free_bytes, &total_bytes), cudaSuccess);
    CU_ASSERT_EQUAL(m.p.memory_bytes, (uint64_t)total_bytes);
    CU_ASSERT_EQUAL_FATAL(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, 0),
                          cudaSuccess);
    CU_ASSERT_EQUAL_FATAL(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, 0),
                          cudaSuccess);
#ifdef PRISM_CUDAEMU
    /* The emulated cuBLASLt has no FP8 algorithm (cudaemu/README.md): the profile's no-FP8 path. */
    CU_ASSERT_EQUAL(m.p.fp8_ops_per_second, 0.0);
#else
    if (major * 10 + minor >= 89) {
        CU_ASSERT(m.p.fp8_ops_per_second > 0);
    } else {
        CU_ASSERT_EQUAL(m.p.fp8_ops_per_second, 0.0);
    }
#endif
#endif
    /* The tensor cores: a GPU multiplies 16-bit matrices faster than its memory copies bytes. */
#ifndef PRISM_CUDAEMU /* a claim about GPUs: the emulation's figures are its host's */
    CU_ASSERT(m.p.bf16_ops_per_second > m.p.copy_bytes_per_second);
#endif
}

static void test_gpu_past_the_last_device_is_invalid(void)
{
    if (skip_without_device())
        return;
    prism_profile_options o = {.device = device_count()};
    prism_device_profile p;
    prism_error err = {0};
    CU_ASSERT_EQUAL(prism_profile_measure(&o, &p, &err), PRISM_ERR_INVALID);
    char expected[128];
    snprintf(expected, sizeof expected,
             "device %d does not exist: this machine has %d CUDA device%s", device_count(),
             device_count(), device_count() == 1 ? "" : "s");
    CU_ASSERT_STRING_EQUAL(err.message, expected);
}

/* ---- line fit ----------------------------------------------------------------------------- */

static void test_linear_fit_recovers_an_exact_line(void)
{
    double x[7], y[7];
    for (int i = 0; i < 7; i++) {
        x[i] = 4096.0 * pow(4.0, i); /* 4 KiB to 16 MiB, as the sweeps */
        y[i] = 2e-6 + 3e-10 * x[i];
    }
    prism_linear_cost c = {0, 0};
    prism_error err = {0};
    CU_ASSERT_EQUAL_FATAL(prism_linear_fit(x, y, 7, &c, &err), PRISM_OK);
    CU_ASSERT(fabs(c.fixed_seconds - 2e-6) <= 1e-12 * 2e-6);
    CU_ASSERT(fabs(c.seconds_per_byte - 3e-10) <= 1e-12 * 3e-10);
    /* Two points are a line too. */
    double x2[2] = {0, 1000}, y2[2] = {5e-6, 5e-6 + 1000 * 1e-9};
    CU_ASSERT_EQUAL_FATAL(prism_linear_fit(x2, y2, 2, &c, &err), PRISM_OK);
    CU_ASSERT(fabs(c.fixed_seconds - 5e-6) <= 1e-12 * 5e-6);
    CU_ASSERT(fabs(c.seconds_per_byte - 1e-9) <= 1e-12 * 1e-9);
}

static void test_linear_fit_weighs_relative_residuals(void)
{
    /* On 1e-6 + 1e-9 x from 1e3 to 1e7, the largest point 5% high. An unweighted fit would give
     * a fixed cost of -1.2e-5; relative residuals keep it within 2% of 1e-6 (9.828e-7), and the
     * slope within 2% of 1e-9 (1.0129e-9). */
    double x[5] = {1e3, 1e4, 1e5, 1e6, 1e7}, y[5];
    for (int i = 0; i < 5; i++)
        y[i] = 1e-6 + 1e-9 * x[i];
    y[4] *= 1.05;
    prism_linear_cost c;
    prism_error err = {0};
    CU_ASSERT_EQUAL_FATAL(prism_linear_fit(x, y, 5, &c, &err), PRISM_OK);
    CU_ASSERT(fabs(c.fixed_seconds - 9.828159977798783e-07) < 1e-9 * 1e-6);
    CU_ASSERT(fabs(c.seconds_per_byte - 1.012936781201907e-09) < 1e-9 * 1e-9);
}

static void test_linear_fit_rejects_bad_points(void)
{
    const double nan = NAN;
    const struct {
        double x[2], y[2];
        size_t n;
        const char *message;
    } cases[] = {
        {{1, 2}, {1, 1}, 1, "prism_linear_fit: 1 point: a line needs at least 2"},
        {{1, 2}, {1, 1}, 0, "prism_linear_fit: 0 points: a line needs at least 2"},
        {{3, 3}, {1, 2}, 2, "prism_linear_fit: every x is 3: a line needs two different x"},
        {{1, -2}, {1, 2}, 2, "prism_linear_fit: x[1] = -2: must be finite and >= 0"},
        {{1, 2}, {0, 2}, 2, "prism_linear_fit: y[0] = 0: must be finite and > 0"},
        {{1, 2}, {1, nan}, 2, "prism_linear_fit: y[1] = nan: must be finite and > 0"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        prism_linear_cost c;
        prism_error err = {0};
        CU_ASSERT_EQUAL(prism_linear_fit(cases[i].x, cases[i].y, cases[i].n, &c, &err),
                        PRISM_ERR_INVALID);
        CU_ASSERT_STRING_EQUAL(err.message, cases[i].message);
    }
    prism_error err = {0};
    CU_ASSERT_EQUAL(prism_linear_fit(NULL, NULL, 2, NULL, &err), PRISM_ERR_INVALID);
    CU_ASSERT_STRING_EQUAL(err.message, "prism_linear_fit: x, y or out is NULL");
}

/* ---- names and printing ------------------------------------------------------------------- */

static void test_device_class_names_are_normalised(void)
{
    const struct {
        const char *prefix, *name;
        size_t len;
        const char *expected;
    } cases[] = {
        {"gpu", "NVIDIA H100 80GB HBM3", 64, "gpu-nvidia-h100-80gb-hbm3"},
        {"gpu", "NVIDIA GeForce RTX 4090", 64, "gpu-nvidia-geforce-rtx-4090"},
        {"gpu", "Tesla T4", 64, "gpu-tesla-t4"},
        {"cpu", "Intel(R) Xeon(R) Platinum 8480+ CPU @ 2.00GHz", 64,
         "cpu-intel-xeon-platinum-8480"},
        {"cpu", "AMD EPYC 7763 64-Core Processor", 64, "cpu-amd-epyc-7763-64-core"},
        {"cpu", "Intel(R) Core(TM) i9-13900K", 64, "cpu-intel-core-i9-13900k"},
        {"cpu", "AMD EPYC", 64, "cpu-amd-epyc"},
        {"cpu", "aarch64", 64, "cpu-aarch64"},
        {"cpu", "", 64, "cpu"},
        {"gpu", "  --  ", 64, "gpu"},
        {"gpu", "NVIDIA H100 80GB HBM3", 16, "gpu-nvidia-h100"}, /* cut on a '-' */
        {"gpu", "NVIDIA H100 80GB HBM3", 4, "gpu"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char buf[64];
        memset(buf, 'x', sizeof buf);
        prism_profile_device_class(cases[i].prefix, cases[i].name, buf, cases[i].len);
        CU_ASSERT_STRING_EQUAL(buf, cases[i].expected);
    }
}

static void test_print_writes_one_line_per_figure_with_units(void)
{
    prism_device_profile p;
    memset(&p, 0, sizeof p);
    snprintf(p.device_class, sizeof p.device_class, "cpu-test");
    snprintf(p.device_name, sizeof p.device_name, "Test CPU");
    p.device = -1;
    p.memory_bytes = 2147483648ull;
    p.bf16_ops_per_second = 2e10;
    p.fp16_ops_per_second = 1e10;
    p.int8_ops_per_second = 4e10;
    p.quantize_cost = (prism_linear_cost){2e-6, 5e-10};
    p.cast_cost = (prism_linear_cost){1e-6, 1e-10};
    p.h2d_bytes_per_second = p.d2h_bytes_per_second = p.copy_bytes_per_second = 1e10;
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    CU_ASSERT_PTR_NOT_NULL_FATAL(f);
    prism_profile_print(f, &p);
    fclose(f);
    const char *expected =
        "device_class             cpu-test\n"
        "device_name              Test CPU\n"
        "device                   cpu\n"
        "memory_bytes             2147483648 bytes (2.00 GiB)\n"
        "bf16_ops_per_second      2e+10 ops/s (0.02 Tops/s)\n"
        "fp16_ops_per_second      1e+10 ops/s (0.01 Tops/s)\n"
        "int8_ops_per_second      4e+10 ops/s (0.04 Tops/s)\n"
        "fp8_ops_per_second       0 ops/s (none)\n"
        "quantize_cost            2e-06 s + 5e-10 s/byte (2.00 us per call, 2.00 GB/s)\n"
        "cast_cost                1e-06 s + 1e-10 s/byte (1.00 us per call, 10.00 GB/s)\n"
        "h2d_bytes_per_second     1e+10 bytes/s (10.00 GB/s)\n"
        "d2h_bytes_per_second     1e+10 bytes/s (10.00 GB/s)\n"
        "copy_bytes_per_second    1e+10 bytes/s (10.00 GB/s)\n";
    CU_ASSERT_STRING_EQUAL(text, expected);
    free(text);
}

static const prism_test_case cpu_cases[] = {
    {"test_cpu_profile_past_its_budget_runs_each_part_once_at_its_smallest_size",
     test_cpu_profile_past_its_budget_runs_each_part_once_at_its_smallest_size},
    {"test_cost_sweep_past_its_deadline_times_only_its_three_smallest_sizes",
     test_cost_sweep_past_its_deadline_times_only_its_three_smallest_sizes},
    {"test_cpu_profile_figures_are_finite_and_positive_without_fp8",
     test_cpu_profile_figures_are_finite_and_positive_without_fp8},
    {"test_cpu_profile_host_copies_are_the_copy_bandwidth",
     test_cpu_profile_host_copies_are_the_copy_bandwidth},
    {"test_cpu_profile_class_is_cpu_and_the_model_name",
     test_cpu_profile_class_is_cpu_and_the_model_name},
    {"test_cpu_profile_memory_is_memtotal_or_the_cgroup_limit",
     test_cpu_profile_memory_is_memtotal_or_the_cgroup_limit},
    {"test_device_class_override_is_kept_with_the_smallest_budget",
     test_device_class_override_is_kept_with_the_smallest_budget},
    {NULL, NULL},
};

static const prism_test_case option_cases[] = {
    {"test_options_init_gives_the_cpu_and_the_default_budget",
     test_options_init_gives_the_cpu_and_the_default_budget},
    {"test_bad_options_are_rejected_naming_the_option",
     test_bad_options_are_rejected_naming_the_option},
    {NULL, NULL},
};

static const prism_test_case gpu_cases[] = {
    {"test_default_device_is_0_with_a_gpu_and_the_cpu_without",
     test_default_device_is_0_with_a_gpu_and_the_cpu_without},
    {"test_gpu_without_a_usable_device_is_unavailable",
     test_gpu_without_a_usable_device_is_unavailable},
    {"test_gpu_profile_figures_are_finite_and_positive",
     test_gpu_profile_figures_are_finite_and_positive},
    {"test_gpu_past_the_last_device_is_invalid", test_gpu_past_the_last_device_is_invalid},
    {NULL, NULL},
};

static const prism_test_case fit_cases[] = {
    {"test_linear_fit_recovers_an_exact_line", test_linear_fit_recovers_an_exact_line},
    {"test_linear_fit_weighs_relative_residuals", test_linear_fit_weighs_relative_residuals},
    {"test_linear_fit_rejects_bad_points", test_linear_fit_rejects_bad_points},
    {NULL, NULL},
};

static const prism_test_case name_cases[] = {
    {"test_device_class_names_are_normalised", test_device_class_names_are_normalised},
    {"test_print_writes_one_line_per_figure_with_units",
     test_print_writes_one_line_per_figure_with_units},
    {NULL, NULL},
};

static const prism_test_suite suites[] = {
    {"profile_cpu", cpu_cases},   {"profile_options", option_cases},
    {"profile_gpu", gpu_cases},   {"profile_fit", fit_cases},
    {"profile_names", name_cases}, {NULL, NULL},
};

int main(int argc, char **argv)
{
    if (device_count() == 0)
        printf("SKIPPED: no CUDA device (the GPU profile cases pass without running; the CPU "
               "cases run)\n");
    return prism_test_main(argc, argv, suites);
}
