/* What profile.c and profile_cuda.cu share: the clock, the sweep that turns timed sizes into a
 * linear cost, and the GPU half of prism_profile_measure. Internal to agent/profile_*. */
#ifndef PRISM_AGENT_PROFILE_INTERNAL_H
#define PRISM_AGENT_PROFILE_INTERNAL_H

#include "profile.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Seconds on CLOCK_MONOTONIC: the clock every budget and deadline is read on. */
double prism_profile_clock(void);

/* When part `part` of `parts` should end: the time left until `end` (the budget's end), shared
 * in proportion to the weights of this part and those after it. A part that runs over its share
 * (a first touch of memory, a slow first call) so takes from every later part alike, not from
 * the next one alone. */
double prism_profile_part_end(double end, const double *weights, size_t parts, size_t part);

/* Times one operation on `bytes` BF16 bytes, repeating it while another repetition fits before
 * `deadline` (at least once), and gives the shortest time in *seconds (> 0). */
typedef prism_status (*prism_profile_timer)(void *ctx, size_t bytes, double deadline,
                                            double *seconds, prism_error *err);

/* The cost of an operation as a line (prism_linear_fit) through its best times at min_bytes,
 * 4 * min_bytes, ... up to max_bytes: the time left until `deadline` is shared out over the
 * sizes not yet timed in proportion 1 : 2 : 3 ..., so that the large sizes, which take long, get
 * several repetitions too. The first three sizes are always timed; a larger one is left out when
 * the last time, scaled by size, says it would not finish before the deadline. A fitted
 * coefficient below its floor (1 ns for the fixed cost, 1e-15 s per byte: noise, not a cost) is
 * raised to it, so both are > 0. */
prism_status prism_profile_cost_sweep(prism_profile_timer timer, void *ctx, size_t min_bytes,
                                      size_t max_bytes, double deadline, prism_linear_cost *out,
                                      prism_error *err);

/* The parts of the CPU profile, in the order they are measured (profile.c). */
typedef enum prism_profile_cpu_part {
    PRISM_PROFILE_CPU_COPY,
    PRISM_PROFILE_CPU_BF16,
    PRISM_PROFILE_CPU_FP16,
    PRISM_PROFILE_CPU_INT8,
    PRISM_PROFILE_CPU_QUANTIZE,
    PRISM_PROFILE_CPU_CAST,
    PRISM_PROFILE_CPU_PARTS
} prism_profile_cpu_part;

/* What the CPU profile did with its time, part by part. */
typedef struct prism_profile_cpu_trace {
    int threads;                            /* the CPUs each part was cut across */
    unsigned runs[PRISM_PROFILE_CPU_PARTS]; /* timed runs of the part's operation */
    size_t size[PRISM_PROFILE_CPU_PARTS];   /* the largest size timed: the copy's bytes (each way),
                                               the multiplies' n, the sweeps' BF16 bytes */
} prism_profile_cpu_trace;

/* The CPU half of prism_profile_measure, measuring until `end` (prism_profile_clock's seconds):
 * fills every figure of *out but device and device_class, and *trace (if not NULL) with what each
 * part ran. An `end` already past gives what the smallest budget gives once the budget is spent:
 * every part runs once at its smallest size (the copy over one 256 KiB chunk per thread, the
 * multiplies at n = 64, the sweeps their three smallest sizes once each). */
prism_status prism_profile_measure_cpu(double end, prism_device_profile *out,
                                       prism_profile_cpu_trace *trace, prism_error *err);

#ifdef PRISM_PROFILE_CUDA
/* The GPU half of prism_profile_measure (profile_cuda.cu): device is a valid index; fills every
 * figure of *out but device_class (and leaves *out as it was on failure). The budget starts once
 * the device's context exists. The caller's current device is restored before returning. */
prism_status prism_profile_measure_cuda(int device, double budget_s, prism_device_profile *out,
                                        prism_error *err);
#endif

#ifdef __cplusplus
}
#endif

#endif
