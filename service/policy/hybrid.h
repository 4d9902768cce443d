/* Hybrid devices (QSync, DESIGN 11): per-class compute plans. The model is the contract of
 * issue 15 with the choices `prismctl plan --help` lists: formats, the gradient-variance indicator ω, the time of
 * an iteration with the all-reduce alignment of QSync's eq. 6, memory, and the greedy raise.
 * Pure C: inputs as structs (already validated by the caller), results in caller-freed structs,
 * no I/O, no clocks, no globals. Every sum runs in the order service/policy/README.md fixes, so an independent
 * implementation doing the same IEEE operations gets the same bits. */
#ifndef PRISM_POLICY_HYBRID_H
#define PRISM_POLICY_HYBRID_H

#include "prism/common.h"

#include <stdbool.h>
#include <stddef.h>

typedef enum prism_hybrid_format {
    PRISM_HYBRID_BF16 = 0,
    PRISM_HYBRID_FP16,
    PRISM_HYBRID_INT8,
    PRISM_HYBRID_FP8_E4M3
} prism_hybrid_format;

/* "bf16", "fp16", "int8", "fp8_e4m3". */
const char *prism_hybrid_format_name(prism_hybrid_format f);

/* Mantissa bits of a float format (bf16 7, fp16 10, fp8_e4m3 3); 0 for int8. */
int prism_hybrid_mantissa_bits(prism_hybrid_format f);

/* Bits a block's activations take in format f: 8 for int8 and fp8, 16 for bf16 and fp16. */
int prism_hybrid_bits(prism_hybrid_format f);

/* The config's low_format. */
typedef enum prism_hybrid_low_choice {
    PRISM_HYBRID_LOW_AUTO = 0, /* fp8_e4m3 where fp8_ops_per_second > 0, else int8 */
    PRISM_HYBRID_LOW_INT8,
    PRISM_HYBRID_LOW_FP8_E4M3
} prism_hybrid_low_choice;

/* A block's statistics: ‖X‖₂, max|X|, numel X, the same of the weights, ‖∇W‖₂, max|∇W|, numel Y. */
typedef struct prism_hybrid_stats {
    double x_l2, x_max_abs, x_numel;
    double w_l2, w_max_abs, w_numel;
    double g_l2, g_max_abs;
    double y_numel;
} prism_hybrid_stats;

/* One block; blocks are indexed by their id (0..L-1). */
typedef struct prism_hybrid_block {
    double flops;            /* F_i: forward FLOPs per step on one rank */
    double param_bytes;      /* W_i: BF16 parameter bytes */
    double activation_bytes; /* A_i: BF16 activation bytes */
    double state_bytes;      /* S_i: bytes no precision changes */
    prism_hybrid_stats stats;
} prism_hybrid_block;

/* One device class with the profile fields the model reads (missing ops read 0). */
typedef struct prism_hybrid_class {
    const char *name;
    double memory_bytes;
    double bf16_ops, fp16_ops, int8_ops, fp8_ops; /* ops per second */
    double quantize_fixed_seconds, quantize_seconds_per_byte;
    bool fixed; /* read only when the problem's fixed_given is true */
} prism_hybrid_class;

typedef struct prism_hybrid_problem {
    const prism_hybrid_block *blocks;
    size_t block_count; /* L */
    const prism_hybrid_class *classes;
    size_t class_count;
    double link_bytes_per_second, link_latency_seconds;
    bool fixed_given;      /* false: the classes whose high format has the largest ops are fixed */
    double memory_fraction; /* default 0.9 */
    double gamma;           /* default 4 */
    prism_hybrid_low_choice low_format;
    const bool *force_high; /* per block id, may be NULL: start high on non-fixed classes */
} prism_hybrid_problem;

/* What each class runs, resolved from its profile and the config. */
typedef struct prism_hybrid_class_formats {
    prism_hybrid_format high, low;
    bool fixed;
} prism_hybrid_class_formats;

/* Sets the config defaults (memory_fraction 0.9, gamma 4, low auto, fixed by rule). */
void prism_hybrid_problem_defaults(prism_hybrid_problem *p);

/* ops_k(f): the class's throughput in format f. */
double prism_hybrid_ops(const prism_hybrid_class *c, prism_hybrid_format f);

/* ε(v): the exponent e of frexp(v) (v = f·2^e, ½ ≤ f < 1); ε(0) = 0. */
int prism_hybrid_epsilon(double v);

/* min(5, |ε(v)|): the eX, eW and eG of the indicator. */
int prism_hybrid_clamped_exponent(double v);

/* ω_i(b) of block i (0-based) of L, in format b on a class whose high format is high. */
double prism_hybrid_omega(const prism_hybrid_stats *s, size_t i, size_t L, double gamma, prism_hybrid_format b,
                          prism_hybrid_format high);

/* Resolves every class's high and low format and whether it is fixed, into out[class_count].
 * PRISM_ERR_INVALID when a class would run a format its profile gives no throughput for; the
 * message names the field: "classes[K].profile.int8_ops_per_second: ...". */
prism_status prism_hybrid_resolve(const prism_hybrid_problem *p, prism_hybrid_class_formats *out,
                                  prism_error *err);

/* fwd_k(i, b) and bwd_k(i, b) of issue 15's time model (b′ = high for int8's backward). */
double prism_hybrid_forward_seconds(const prism_hybrid_block *blk, const prism_hybrid_class *c,
                                    const prism_hybrid_class_formats *fm, prism_hybrid_format b);
double prism_hybrid_backward_seconds(const prism_hybrid_block *blk, const prism_hybrid_class *c,
                                     const prism_hybrid_class_formats *fm, prism_hybrid_format b);

/* T of a plan (class-major: plan[k * L + i]); compute[k] (may be NULL) gets f_k(0). PRISM_ERR_NOMEM
 * only when scratch memory is short. */
prism_status prism_hybrid_iteration_seconds(const prism_hybrid_problem *p, const prism_hybrid_class_formats *fm,
                                            const prism_hybrid_format *plan, double *compute, double *out);

/* M_k of one class's row of a plan (L formats), summed in block order. */
double prism_hybrid_memory(const prism_hybrid_problem *p, const prism_hybrid_format *row);

/* B_k = memory_fraction × memory_bytes. */
double prism_hybrid_budget(const prism_hybrid_problem *p, size_t k);

typedef enum prism_hybrid_reason {
    PRISM_HYBRID_OK = 0,
    PRISM_HYBRID_MEMORY,
    PRISM_HYBRID_TIME
} prism_hybrid_reason;

/* "ok", "memory", "time". */
const char *prism_hybrid_reason_name(prism_hybrid_reason r);

typedef struct prism_hybrid_raise {
    size_t class_index;
    size_t block;
    double delta; /* ω_i(low_k) − ω_i(high_k) */
    bool accepted;
    prism_hybrid_reason reason;
} prism_hybrid_raise;

typedef struct prism_hybrid_baseline {
    double iteration_seconds;
    double indicator;
    bool fits;
} prism_hybrid_baseline;

typedef struct prism_hybrid_result {
    double iteration_seconds; /* T of the plan */
    double start_seconds;     /* T0 */
    double indicator;         /* Σ ω over non-fixed classes (file order) and blocks (id order) */
    prism_hybrid_class_formats *formats; /* [class_count] */
    prism_hybrid_format *plan;           /* [class_count * L], class-major */
    double *memory_bytes, *budget_bytes, *compute_seconds; /* [class_count] */
    prism_hybrid_baseline uniform_low, uniform_high;
    prism_hybrid_raise *raises;
    size_t raise_count;
    /* When the start of a non-fixed class does not fit (PRISM_ERR_LIMIT): that class (the first
     * in file order), its start's bytes and its budget. */
    size_t refused_class;
    double refused_bytes, refused_budget;
} prism_hybrid_result;

/* Runs the allocation of issue 15. PRISM_OK: *out holds the plan (free it with
 * prism_hybrid_result_free). PRISM_ERR_LIMIT: a non-fixed class's start does not fit; the
 * refused_* fields say which (the other fields are freed and zero). PRISM_ERR_INVALID: a format
 * a class runs has no throughput (prism_hybrid_resolve's message). PRISM_ERR_NOMEM. */
prism_status prism_hybrid_plan(const prism_hybrid_problem *p, prism_hybrid_result *out, prism_error *err);

void prism_hybrid_result_free(prism_hybrid_result *r);

#endif
