/* The layouts of the public structs, as python/prism/_lib.py declares them with ctypes (and as
 * tests/python/test_kernels.py checks from Python's side). A change to a struct in
 * include/prism/ that moves a field fails the build here, not a Python caller at run time:
 * change _lib.py and these figures together. x86-64 and aarch64 Linux (LP64) only. */
#include "prism/kernels.h"

#include <stddef.h>

#define PRISM_ABI(cond) _Static_assert(cond, #cond " (python/prism/_lib.py relies on it)")

PRISM_ABI(sizeof(prism_status) == 4 && sizeof(prism_dtype) == 4 && sizeof(prism_precision) == 4);
PRISM_ABI(sizeof(prism_granularity) == 4 && sizeof(prism_scale_mode) == 4 &&
          sizeof(prism_rounding) == 4);

PRISM_ABI(offsetof(prism_error, status) == 0 && offsetof(prism_error, message) == 4);
PRISM_ABI(sizeof(((prism_error *)0)->message) == 512 && sizeof(prism_error) == 516);

PRISM_ABI(offsetof(prism_tensor, data) == 0 && offsetof(prism_tensor, numel) == 8);
PRISM_ABI(offsetof(prism_tensor, dtype) == 16 && sizeof(prism_tensor) == 24);

PRISM_ABI(offsetof(prism_quant_spec, format) == 0 && offsetof(prism_quant_spec, granularity) == 4);
PRISM_ABI(offsetof(prism_quant_spec, group) == 8 && offsetof(prism_quant_spec, scale_mode) == 16);
PRISM_ABI(offsetof(prism_quant_spec, rounding) == 20 && offsetof(prism_quant_spec, seed) == 24);
PRISM_ABI(sizeof(prism_quant_spec) == 32);

PRISM_ABI(offsetof(prism_grad_stats, l2_norm) == 0 && offsetof(prism_grad_stats, max_abs) == 8);
PRISM_ABI(offsetof(prism_grad_stats, mean) == 16 && offsetof(prism_grad_stats, variance) == 24);
PRISM_ABI(offsetof(prism_grad_stats, numel) == 32 && offsetof(prism_grad_stats, nonfinite) == 40);
PRISM_ABI(sizeof(prism_grad_stats) == 48);
