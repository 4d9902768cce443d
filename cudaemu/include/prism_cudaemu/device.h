/* The device side of the emulation: what nvcc gives a .cu file and g++ does not. Kernels become
 * plain C++ functions that every emulated CUDA thread runs on a fiber of its own; threadIdx and
 * friends read the running fiber's registers; __syncthreads, the warp intrinsics and __syncwarp
 * are synchronisation points of the block's fiber scheduler (cudaemu/src/exec.cpp), which checks
 * that they are used as CUDA requires and reports a fault with file:line otherwise; __shared__
 * variables are thread-local storage of the worker thread that runs the block (one block at a
 * time per worker); atomics are the compiler's atomics; the launch queues the kernel and a copy
 * of its arguments on the stream. What the emulation cannot show (timing, the memory model
 * between blocks beyond what the sanitizers see, coalescing) is listed in cudaemu/README.md. */
#ifndef PRISM_CUDAEMU_DEVICE_H
#define PRISM_CUDAEMU_DEVICE_H

#ifndef __cplusplus
#error "prism_cudaemu/device.h is for .cu sources compiled as C++"
#endif

/* The toolkit's cuda_runtime.h (through cudaemu/include/cuda_runtime.h) before the macros below:
 * its templates name parameters gridDim and blockDim. */
#include <cuda_runtime.h>
#include <cuda_runtime_api.h>
#include <vector_functions.h>
#include <vector_types.h>

/* Every standard header a .cu file may want, before __noinline__ becomes a macro below (the
 * C++ library spells __attribute__((__noinline__)) in places, which that macro would break). */
#include <float.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <new>
#include <tuple>
#include <type_traits>
#include <utility>

#include "prism_cudaemu.h"

/* ---- qualifiers ------------------------------------------------------------------------------ */

#undef __shared__
#define __shared__ static __thread /* per worker thread, which runs one block at a time */
#undef __constant__
#define __constant__ static const
#define __noinline__ __attribute__((noinline))
#define __launch_bounds__(...)
#ifndef __grid_constant__
#define __grid_constant__
#endif

namespace prism_cudaemu {

/* The registers of the running emulated thread. */
struct Regs {
    uint3 thread_idx, block_idx;
    dim3 block_dim, grid_dim;
};

/* The running fiber's registers: set by the scheduler before it switches to a fiber. */
extern __thread Regs *tl_regs;

/* Kinds of warp-synchronous operation (exec.cpp computes them from PTX's definitions). */
enum WarpOp {
    kShflIdx,
    kShflUp,
    kShflDown,
    kShflXor,
    kVoteAny,
    kVoteAll,
    kVoteBallot,
    kSyncWarp,
};

/* A barrier of the block, reached by this thread at file:line. */
void syncthreads(const char *file, int line);

/* The warp-synchronous operation `op` of the lanes in mask, this thread's contribution `value`
 * (the bits of a shuffled variable, or a predicate), its source lane, delta or lane mask `arg`
 * and width; returns this lane's result bits. */
uint64_t warp_op(const char *file, int line, WarpOp op, unsigned mask, uint64_t value, unsigned arg,
                 int width);

/* The lanes of the running thread's warp that have not exited. */
unsigned active_mask();

/* ---- the launch ------------------------------------------------------------------------------ */

struct Launch {
    const char *name, *file;
    int line;
    dim3 grid, block;
    size_t shared_bytes;
    cudaStream_t stream;
    size_t param_bytes;
    void (*run)(void *closure);     /* runs the kernel with the arguments, in the current fiber */
    void (*destroy)(void *closure); /* after the last block */
    void *closure;
    const void *pointers[32]; /* the arguments of pointer type, checked against the registry */
    int n_pointers;
};

/* Validates the launch, queues it on its stream and returns at once (cudaGetLastError reports
 * a refused launch, as for a real one). Takes the closure in every case. */
cudaError_t launch(Launch *l);

template <class... P> struct Closure {
    void (*kernel)(P...);
    std::tuple<std::decay_t<P>...> params;

    static void run(void *c)
    {
        Closure *self = static_cast<Closure *>(c);
        std::apply(self->kernel, self->params);
    }
    static void destroy(void *c)
    {
        delete static_cast<Closure *>(c);
    }
};

template <class T> inline void note_pointer(Launch &l, const T &v)
{
    if constexpr (std::is_pointer_v<T>) {
        if (l.n_pointers < (int)(sizeof l.pointers / sizeof l.pointers[0]))
            l.pointers[l.n_pointers++] = static_cast<const void *>(v);
    }
}

template <class... P, class... A>
cudaError_t launch_kernel(const char *name, const char *file, int line, void (*kernel)(P...), dim3 grid,
                          dim3 block, size_t shared_bytes, cudaStream_t stream, A &&...args)
{
    static_assert(sizeof...(P) == sizeof...(A), "a kernel launch passes one argument per parameter");
    Launch l = {};
    l.name = name;
    l.file = file;
    l.line = line;
    l.grid = grid;
    l.block = block;
    l.shared_bytes = shared_bytes;
    l.stream = stream;
    Closure<P...> *c = new (std::nothrow)
        Closure<P...>{kernel, std::tuple<std::decay_t<P>...>(static_cast<std::decay_t<P>>(std::forward<A>(args))...)};
    if (!c)
        return cudaErrorMemoryAllocation;
    l.param_bytes = sizeof c->params;
    l.run = Closure<P...>::run;
    l.destroy = Closure<P...>::destroy;
    l.closure = c;
    std::apply([&l](const auto &...p) { (note_pointer(l, p), ...); }, c->params);
    return launch(&l);
}

/* ---- shuffles and votes ---------------------------------------------------------------------- */

template <class T> inline T shuffle(const char *file, int line, WarpOp op, unsigned mask, T var, unsigned arg,
                                    int width = 32)
{
    static_assert(sizeof(T) == 4 || sizeof(T) == 8, "shuffles move 32- and 64-bit values");
    static_assert(std::is_trivially_copyable_v<T>, "shuffles move plain values");
    uint64_t bits = 0;
    memcpy(&bits, &var, sizeof var);
    bits = warp_op(file, line, op, mask, bits, arg, width);
    T out;
    memcpy(&out, &bits, sizeof out);
    return out;
}

inline int vote(const char *file, int line, WarpOp op, unsigned mask, int predicate)
{
    return (int)warp_op(file, line, op, mask, predicate != 0, 0, 32);
}

/* ---- atomics (relaxed, as CUDA's are; device scope is the whole process here) ---------------- */

template <class T> inline T atomic_add(T *p, T v)
{
    if constexpr (std::is_floating_point_v<T>) {
        T old, want;
        __atomic_load(p, &old, __ATOMIC_RELAXED);
        do
            want = old + v;
        while (!__atomic_compare_exchange(p, &old, &want, true, __ATOMIC_RELAXED, __ATOMIC_RELAXED));
        return old;
    } else {
        return __atomic_fetch_add(p, v, __ATOMIC_RELAXED);
    }
}

template <class T, class F> inline T atomic_update(T *p, F f)
{
    T old, want;
    __atomic_load(p, &old, __ATOMIC_RELAXED);
    do
        want = f(old);
    while (!__atomic_compare_exchange(p, &old, &want, true, __ATOMIC_RELAXED, __ATOMIC_RELAXED));
    return old;
}

} /* namespace prism_cudaemu */

/* ---- built-in variables ---------------------------------------------------------------------- */

#define threadIdx (static_cast<const uint3 &>(::prism_cudaemu::tl_regs->thread_idx))
#define blockIdx (static_cast<const uint3 &>(::prism_cudaemu::tl_regs->block_idx))
#define blockDim (static_cast<const dim3 &>(::prism_cudaemu::tl_regs->block_dim))
#define gridDim (static_cast<const dim3 &>(::prism_cudaemu::tl_regs->grid_dim))
static const int warpSize = 32;

/* ---- synchronisation ------------------------------------------------------------------------- */

#define __syncthreads() ::prism_cudaemu::syncthreads(__FILE__, __LINE__)
#define __syncwarp(...) ::prism_cudaemu::syncwarp_(__FILE__, __LINE__ __VA_OPT__(, ) __VA_ARGS__)
#define __shfl_sync(...) ::prism_cudaemu::shuffle(__FILE__, __LINE__, ::prism_cudaemu::kShflIdx, __VA_ARGS__)
#define __shfl_up_sync(...) ::prism_cudaemu::shuffle(__FILE__, __LINE__, ::prism_cudaemu::kShflUp, __VA_ARGS__)
#define __shfl_down_sync(...) \
    ::prism_cudaemu::shuffle(__FILE__, __LINE__, ::prism_cudaemu::kShflDown, __VA_ARGS__)
#define __shfl_xor_sync(...) ::prism_cudaemu::shuffle(__FILE__, __LINE__, ::prism_cudaemu::kShflXor, __VA_ARGS__)
#define __any_sync(mask, pred) ::prism_cudaemu::vote(__FILE__, __LINE__, ::prism_cudaemu::kVoteAny, mask, pred)
#define __all_sync(mask, pred) ::prism_cudaemu::vote(__FILE__, __LINE__, ::prism_cudaemu::kVoteAll, mask, pred)
#define __ballot_sync(mask, pred) \
    ((unsigned)::prism_cudaemu::vote(__FILE__, __LINE__, ::prism_cudaemu::kVoteBallot, mask, pred))

namespace prism_cudaemu {
inline void syncwarp_(const char *file, int line, unsigned mask = 0xffffffffu)
{
    (void)warp_op(file, line, kSyncWarp, mask, 0, 0, 32);
}
} /* namespace prism_cudaemu */

static inline unsigned __activemask()
{
    return ::prism_cudaemu::active_mask();
}

/* Memory fences order a thread's own accesses: the emulation runs each thread's code in program
 * order and the sanitizers see the rest, so they only keep the compiler from reordering. */
static inline void __threadfence()
{
    __atomic_thread_fence(__ATOMIC_SEQ_CST);
}
static inline void __threadfence_block()
{
    __atomic_thread_fence(__ATOMIC_SEQ_CST);
}
static inline void __threadfence_system()
{
    __atomic_thread_fence(__ATOMIC_SEQ_CST);
}

/* ---- loads ----------------------------------------------------------------------------------- */

template <class T> static inline T __ldg(const T *p)
{
    return *p;
}

/* ---- atomics --------------------------------------------------------------------------------- */

static inline int atomicAdd(int *p, int v) { return ::prism_cudaemu::atomic_add(p, v); }
static inline unsigned atomicAdd(unsigned *p, unsigned v) { return ::prism_cudaemu::atomic_add(p, v); }
static inline unsigned long long atomicAdd(unsigned long long *p, unsigned long long v)
{
    return ::prism_cudaemu::atomic_add(p, v);
}
static inline float atomicAdd(float *p, float v) { return ::prism_cudaemu::atomic_add(p, v); }
static inline double atomicAdd(double *p, double v) { return ::prism_cudaemu::atomic_add(p, v); }
static inline int atomicSub(int *p, int v) { return __atomic_fetch_sub(p, v, __ATOMIC_RELAXED); }
static inline unsigned atomicSub(unsigned *p, unsigned v) { return __atomic_fetch_sub(p, v, __ATOMIC_RELAXED); }
template <class T> static inline T prism_cudaemu_max_of(T a, T b) { return a < b ? b : a; }
template <class T> static inline T prism_cudaemu_min_of(T a, T b) { return b < a ? b : a; }
static inline int atomicMax(int *p, int v)
{
    return ::prism_cudaemu::atomic_update(p, [v](int o) { return prism_cudaemu_max_of(o, v); });
}
static inline unsigned atomicMax(unsigned *p, unsigned v)
{
    return ::prism_cudaemu::atomic_update(p, [v](unsigned o) { return prism_cudaemu_max_of(o, v); });
}
static inline unsigned long long atomicMax(unsigned long long *p, unsigned long long v)
{
    return ::prism_cudaemu::atomic_update(p, [v](unsigned long long o) { return prism_cudaemu_max_of(o, v); });
}
static inline long long atomicMax(long long *p, long long v)
{
    return ::prism_cudaemu::atomic_update(p, [v](long long o) { return prism_cudaemu_max_of(o, v); });
}
static inline int atomicMin(int *p, int v)
{
    return ::prism_cudaemu::atomic_update(p, [v](int o) { return prism_cudaemu_min_of(o, v); });
}
static inline unsigned atomicMin(unsigned *p, unsigned v)
{
    return ::prism_cudaemu::atomic_update(p, [v](unsigned o) { return prism_cudaemu_min_of(o, v); });
}
static inline unsigned long long atomicMin(unsigned long long *p, unsigned long long v)
{
    return ::prism_cudaemu::atomic_update(p, [v](unsigned long long o) { return prism_cudaemu_min_of(o, v); });
}
static inline long long atomicMin(long long *p, long long v)
{
    return ::prism_cudaemu::atomic_update(p, [v](long long o) { return prism_cudaemu_min_of(o, v); });
}
template <class T> static inline T prism_cudaemu_cas(T *p, T compare, T val)
{
    __atomic_compare_exchange_n(p, &compare, val, false, __ATOMIC_RELAXED, __ATOMIC_RELAXED);
    return compare; /* the old value, whether or not it was replaced */
}
static inline int atomicCAS(int *p, int c, int v) { return prism_cudaemu_cas(p, c, v); }
static inline unsigned atomicCAS(unsigned *p, unsigned c, unsigned v) { return prism_cudaemu_cas(p, c, v); }
static inline unsigned long long atomicCAS(unsigned long long *p, unsigned long long c, unsigned long long v)
{
    return prism_cudaemu_cas(p, c, v);
}
static inline int atomicExch(int *p, int v) { return __atomic_exchange_n(p, v, __ATOMIC_RELAXED); }
static inline unsigned atomicExch(unsigned *p, unsigned v) { return __atomic_exchange_n(p, v, __ATOMIC_RELAXED); }
static inline unsigned long long atomicExch(unsigned long long *p, unsigned long long v)
{
    return __atomic_exchange_n(p, v, __ATOMIC_RELAXED);
}
static inline int atomicOr(int *p, int v) { return __atomic_fetch_or(p, v, __ATOMIC_RELAXED); }
static inline unsigned atomicOr(unsigned *p, unsigned v) { return __atomic_fetch_or(p, v, __ATOMIC_RELAXED); }
static inline int atomicAnd(int *p, int v) { return __atomic_fetch_and(p, v, __ATOMIC_RELAXED); }
static inline unsigned atomicAnd(unsigned *p, unsigned v) { return __atomic_fetch_and(p, v, __ATOMIC_RELAXED); }
static inline int atomicXor(int *p, int v) { return __atomic_fetch_xor(p, v, __ATOMIC_RELAXED); }
static inline unsigned atomicXor(unsigned *p, unsigned v) { return __atomic_fetch_xor(p, v, __ATOMIC_RELAXED); }

/* ---- arithmetic intrinsics: IEEE binary32/binary64 operations, correctly rounded. Emulated
 * sources are compiled with -ffp-contract=off (as nvcc's -fmad=false), so a*b+c stays two
 * roundings unless the code calls fma. ---------------------------------------------------------- */

static inline float __fadd_rn(float a, float b) { return a + b; }
static inline float __fsub_rn(float a, float b) { return a - b; }
static inline float __fmul_rn(float a, float b) { return a * b; }
static inline float __fdiv_rn(float a, float b) { return a / b; }
static inline float __fsqrt_rn(float a) { return sqrtf(a); }
static inline float __fmaf_rn(float a, float b, float c) { return fmaf(a, b, c); }
static inline double __dadd_rn(double a, double b) { return a + b; }
static inline double __dsub_rn(double a, double b) { return a - b; }
static inline double __dmul_rn(double a, double b) { return a * b; }
static inline double __ddiv_rn(double a, double b) { return a / b; }
static inline double __dsqrt_rn(double a) { return sqrt(a); }
static inline double __fma_rn(double a, double b, double c) { return fma(a, b, c); }

template <class To, class From> static inline To prism_cudaemu_bits(From f)
{
    static_assert(sizeof(To) == sizeof(From), "a reinterpretation keeps the size");
    To t;
    memcpy(&t, &f, sizeof t);
    return t;
}
static inline unsigned __float_as_uint(float f) { return prism_cudaemu_bits<unsigned>(f); }
static inline int __float_as_int(float f) { return prism_cudaemu_bits<int>(f); }
static inline float __uint_as_float(unsigned u) { return prism_cudaemu_bits<float>(u); }
static inline float __int_as_float(int i) { return prism_cudaemu_bits<float>(i); }
static inline long long __double_as_longlong(double d) { return prism_cudaemu_bits<long long>(d); }
static inline double __longlong_as_double(long long i) { return prism_cudaemu_bits<double>(i); }

static inline int __popc(unsigned x) { return __builtin_popcount(x); }
static inline int __popcll(unsigned long long x) { return __builtin_popcountll(x); }
static inline int __clz(int x) { return x == 0 ? 32 : __builtin_clz((unsigned)x); }
static inline int __clzll(long long x) { return x == 0 ? 64 : __builtin_clzll((unsigned long long)x); }
static inline int __ffs(int x) { return __builtin_ffs(x); }
static inline int __ffsll(long long x) { return __builtin_ffsll(x); }
static inline unsigned __brev(unsigned x)
{
    unsigned r = 0;
    for (int i = 0; i < 32; i++)
        r |= ((x >> i) & 1u) << (31 - i);
    return r;
}

/* Per byte: 0xff where a's byte equals b's, else 0. */
static inline unsigned __vcmpeq4(unsigned a, unsigned b)
{
    unsigned r = 0;
    for (int i = 0; i < 4; i++)
        if (((a >> (8 * i)) & 0xffu) == ((b >> (8 * i)) & 0xffu))
            r |= 0xffu << (8 * i);
    return r;
}

/* min and max for the types device code uses them with (CUDA's math_functions.hpp overloads). */
#define PRISM_CUDAEMU_MINMAX(T)                                                                    \
    static inline T min(T a, T b) { return b < a ? b : a; }                                        \
    static inline T max(T a, T b) { return a < b ? b : a; }
PRISM_CUDAEMU_MINMAX(int)
PRISM_CUDAEMU_MINMAX(unsigned int)
PRISM_CUDAEMU_MINMAX(long)
PRISM_CUDAEMU_MINMAX(unsigned long)
PRISM_CUDAEMU_MINMAX(long long)
PRISM_CUDAEMU_MINMAX(unsigned long long)
#undef PRISM_CUDAEMU_MINMAX
static inline float min(float a, float b) { return fminf(a, b); }
static inline float max(float a, float b) { return fmaxf(a, b); }
static inline double min(double a, double b) { return fmin(a, b); }
static inline double max(double a, double b) { return fmax(a, b); }

/* ---- the launch macro the project's sources use (PRISM_LAUNCH in prism/cuda.h) ----------------- */

#define PRISM_CUDAEMU_LAUNCH(kernel, grid, block, stream, ...)                                     \
    ::prism_cudaemu::launch_kernel(#kernel, __FILE__, __LINE__, kernel, dim3(grid), dim3(block), 0, (stream), \
                                   ##__VA_ARGS__)

#endif
