/* The DeviceProfile that prism-agent measures at start and sends in its Hello (DESIGN 11, proto
 * prism.v1.DeviceProfile): how much memory the device has, how fast it multiplies matrices in
 * each precision, what quantizing and casting a tensor cost, and how fast it copies. prismd
 * groups ranks by device_class and plans each class's precisions from these figures (QSync).
 *
 * Two devices:
 *   CPU (device -1)    everything on this host's CPUs (profile.c): the figures a rank that trains
 *                      on the CPU works with. Matrix throughput is a portable cache-blocked C
 *                      multiply on every CPU this process may run on; no FP8 (0).
 *   CUDA (device >= 0) that GPU (profile_cuda.cu): cuBLAS / cuBLASLt for the matrix figures,
 *                      prism_quantize_cuda for the quantize cost, cudaEvents for the times.
 *
 * Conventions of every figure:
 *   ops          a matrix multiply of M x K by K x N counts 2*M*N*K operations.
 *   bytes/s      bytes moved per second, each byte counted once (a copy of n bytes in t seconds
 *                is n / t; NVIDIA's bandwidthTest and bench/prism_bench.c count a device copy's
 *                read and write, which is twice this).
 *   linear cost  seconds = fixed_seconds + seconds_per_byte * x, where x is the number of BF16
 *                bytes of the tensor (2 per element), for quantize and cast alike.
 *   best of      each time is the shortest of the repetitions that fit the budget: the figures
 *                are what the device does when nothing else gets in the way.
 * Every figure is finite and > 0, except fp8_ops_per_second, which is 0 where there is no FP8
 * matrix multiply (the CPU, GPUs before compute capability 8.9). */
#ifndef PRISM_AGENT_PROFILE_H
#define PRISM_AGENT_PROFILE_H

#include "prism/common.h"

#include <stdint.h>
#include <stdio.h>

#ifdef __cplusplus
extern "C" {
#endif

#define PRISM_PROFILE_CLASS_MAX 64  /* bytes of device_class, NUL included */
#define PRISM_PROFILE_NAME_MAX 256  /* bytes of device_name, NUL included */
#define PRISM_PROFILE_DEVICE_CPU (-1)

#define PRISM_PROFILE_BUDGET_DEFAULT_MS 1000
#define PRISM_PROFILE_BUDGET_MIN_MS 100
#define PRISM_PROFILE_BUDGET_MAX_MS 600000

/* proto LinearCost: seconds = fixed_seconds + seconds_per_byte * bytes. */
typedef struct prism_linear_cost {
    double fixed_seconds;    /* cost of a call on zero bytes */
    double seconds_per_byte; /* each further byte */
} prism_linear_cost;

/* proto DeviceProfile, plus the copy figures the planner and the benchmarks also use. */
typedef struct prism_device_profile {
    char device_class[PRISM_PROFILE_CLASS_MAX]; /* "cpu-amd-epyc", "gpu-nvidia-h100-80gb-hbm3" */
    char device_name[PRISM_PROFILE_NAME_MAX];   /* the CPU model or GPU name, as the system says */
    int device;                                 /* -1: the CPU; else the CUDA device index */
    uint64_t memory_bytes; /* CPU: MemTotal (or the cgroup limit, if lower); GPU: total memory */
    double bf16_ops_per_second; /* BF16 inputs, FP32 accumulation */
    double fp16_ops_per_second; /* FP16 inputs, FP32 accumulation */
    double int8_ops_per_second; /* INT8 inputs, INT32 accumulation */
    double fp8_ops_per_second;  /* E4M3 inputs, FP32 accumulation; 0: none */
    prism_linear_cost quantize_cost; /* INT8, blocks of 128, nearest, from BF16 */
    prism_linear_cost cast_cost;     /* BF16 to FP32 */
    double h2d_bytes_per_second; /* GPU: pinned host to device; CPU: copy_bytes_per_second */
    double d2h_bytes_per_second; /* GPU: device to pinned host; CPU: copy_bytes_per_second */
    double copy_bytes_per_second; /* GPU: device to device; CPU: memcpy on every CPU */
} prism_device_profile;

typedef struct prism_profile_options {
    int device;               /* -1 (PRISM_PROFILE_DEVICE_CPU): the CPU; >= 0: a CUDA device */
    int budget_ms;            /* time for the whole measurement; 0: 1000 ms */
    const char *device_class; /* NULL or "": derived from the device's name */
} prism_profile_options;

/* The defaults: the CPU, 1000 ms, the derived class. */
void prism_profile_options_init(prism_profile_options *o);

/* 0 when this build has CUDA and device 0 is there to use, else -1 (the CPU): the device an
 * agent profiles when it is not told which. */
int prism_profile_default_device(void);

/* Measures the device o names (o NULL: the defaults) into *out.
 *
 * Time: the measurement keeps to o->budget_ms (100 to 600,000; 0 means 1000), counted from the
 * call: each part gets a share of what is left of it and repeats while its share lasts, at least
 * once, and a size that would not fit in its share (a larger matrix, a larger tensor of a sweep)
 * is left out. Once the budget is spent, each part left runs its smallest size once (the sweeps
 * their three smallest; a GPU multiply twice), so the whole takes the budget plus the repetition
 * under way when it ended, those smallest runs (on the CPU a few milliseconds together) and the
 * freeing of the buffers. A small budget costs precision, not time: fewer repetitions, smaller
 * sizes. On the CPU the buffers' first touch is inside the budget and sized by it (profile.c):
 * where memory is slow to touch the first time (a virtual machine whose host maps it in on
 * demand: 10 to 20 us a 4 KiB page), a small budget copies less than the 64 MiB or more that
 * measure memory, and the copy figure may be the cache's. On a GPU, creating the CUDA context
 * (the first call in a process: 0.1 to 1 s) comes before the budget starts, and the buffers'
 * sizes follow the free memory, not the budget.
 *
 * Errors: an option out of range is PRISM_ERR_INVALID naming it; device >= 0 in a build without
 * CUDA, or with no usable GPU, PRISM_ERR_UNAVAILABLE (with the CUDA runtime's message); a failed
 * allocation PRISM_ERR_NOMEM; a failed CUDA or cuBLAS call its status and message. *out is
 * written only on success; everything the call allocates is freed on every path. */
prism_status prism_profile_measure(const prism_profile_options *o, prism_device_profile *out,
                                   prism_error *err);

/* prism-agent --profile-file: the DeviceProfile a JSON file gives instead of the measurement.
 * The file is one object, the DeviceProfile by its proto field names (PLAN.json's
 * classes[].profile): device_class, device_name (strings), memory_bytes (a whole number),
 * bf16_ops_per_second, fp16_ops_per_second, int8_ops_per_second, fp8_ops_per_second,
 * h2d_bytes_per_second (numbers), quantize_cost and cast_cost (objects of fixed_seconds and
 * seconds_per_byte). A missing key reads 0 ("" for device_name), except device_class: then
 * `device_class` (--device-class) when not NULL or "", else the class derived from device_name
 * with the prefix "gpu" (prism_profile_device_class). d2h and copy figures, which the proto does
 * not carry, are 0; device is -1. PRISM_ERR_INVALID with "KEY: PROBLEM" (nested keys as
 * "quantize_cost.fixed_seconds") for an unknown key, a wrong type, a negative or non-finite
 * number, a memory_bytes that is not whole, a device_class --device-class would refuse, a
 * duplicate key; "line L column C: PROBLEM" for JSON that does not parse; the I/O error for a
 * file that cannot be read. *out is written only on success. */
prism_status prism_profile_read_file(const char *path, const char *device_class, prism_device_profile *out,
                                     prism_error *err);

/* The profile for people, one figure a line with its unit. */
void prism_profile_print(FILE *f, const prism_device_profile *p);

/* The line through n points (x[i], y[i]) that minimises the sum of squared relative residuals
 * ((fixed + per_byte * x[i] - y[i]) / y[i])^2: a cost measured from a few bytes to many megabytes
 * is fitted as well at the small end, where the fixed cost shows, as at the large end. Points
 * exactly on a line give that line (to rounding). Needs n >= 2, at least two different x, every
 * x finite and >= 0 and every y finite and > 0; otherwise PRISM_ERR_INVALID. The result is the
 * plain fit: either coefficient may come out <= 0 from noisy points (prism_profile_measure then
 * raises it to a floor). */
prism_status prism_linear_fit(const double *x, const double *y, size_t n, prism_linear_cost *out,
                              prism_error *err);

/* The class a device gets by default: prefix + "-" + the name in lower case, each run of
 * characters other than letters and digits made one '-', cut to fit len bytes on a '-'. For a CPU
 * (prefix "cpu") the name's trademarks ("(R)", "(TM)"), the words "CPU" and "Processor" and
 * everything from " @ " (the clock) are left out first:
 *   "gpu", "NVIDIA H100 80GB HBM3"                          -> "gpu-nvidia-h100-80gb-hbm3"
 *   "cpu", "Intel(R) Xeon(R) Platinum 8480+ CPU @ 2.00GHz"  -> "cpu-intel-xeon-platinum-8480"
 * An empty name gives prefix alone. */
void prism_profile_device_class(const char *prefix, const char *name, char *buf, size_t len);

#ifdef __cplusplus
}
#endif

#endif
