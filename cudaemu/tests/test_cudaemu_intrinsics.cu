/* The emulation's device-side intrinsics against their definitions. Each reference below is
 * written from CUDA's documentation (the CUDA C++ Programming Guide's warp shuffle, vote and
 * atomic functions, the CUDA Math API's integer and single-precision intrinsics) and from PTX's
 * shfl.sync, which those intrinsics compile to: it reads only bits 4:0 of the lane, delta or lane
 * mask operand. None of them calls the emulation's own helpers; every kernel runs on the
 * emulated device and every result is compared exactly (floats by their bits). */
#include "emu_test.h"

#include <climits>
#include <cmath>
#include <cstdint>
#include <cstring>

namespace {

/* ---- shuffles -------------------------------------------------------------------------------- */

enum ShuffleOp { kIdx, kUp, kDown, kXor, kShuffleOps };
const char *const kShuffleNames[kShuffleOps] = {"__shfl_sync", "__shfl_up_sync", "__shfl_down_sync",
                                                "__shfl_xor_sync"};

/* Lane, delta and lane-mask arguments from -8 to 40: negative ones and ones of 32 and more show
 * that only the low five bits count. */
const int kArgMin = -8, kArgMax = 40, kArgs = kArgMax - kArgMin + 1;
const int kWidths[] = {1, 2, 4, 8, 16, 32};
const int kNumWidths = 6;
const unsigned kShuffleThreads = 64; /* two warps: each shuffles within its own */

/* The lane of the warp whose value `lane` receives, from the Programming Guide:
 *   __shfl_sync       srcLane modulo width, within the caller's group of width lanes
 *   __shfl_up_sync    caller - delta; the caller's own value if that leaves the group (below it)
 *   __shfl_down_sync  caller + delta; the caller's own value if that leaves the group (above it)
 *   __shfl_xor_sync   caller XOR laneMask; lanes of earlier groups can be read, a later group gives
 *                     the caller's own value
 * with the operand cut to bits 4:0 as shfl.sync does (so a delta of 33 is a delta of 1). */
unsigned reference_source_lane(int op, unsigned lane, int arg, int width)
{
    const unsigned w = (unsigned)width;
    const unsigned group = lane / w * w; /* the first lane of the caller's group */
    const unsigned low5 = (unsigned)arg & 31u;
    switch (op) {
    case kIdx: {
        const int m = ((arg % width) + width) % width; /* the mathematical modulo */
        return group + (unsigned)m;
    }
    case kUp: return lane - group >= low5 ? lane - low5 : lane;
    case kDown: return lane - group + low5 < w ? lane + low5 : lane;
    default: {
        const unsigned src = lane ^ low5;
        return src < group + w ? src : lane;
    }
    }
}

template <class T> __global__ void shuffle_table_kernel(const T *in, T *out)
{
    const unsigned t = threadIdx.x;
    const T v = in[t];
    size_t i = 0;
    for (int op = 0; op < kShuffleOps; op++)
        for (int wi = 0; wi < kNumWidths; wi++)
            for (int a = kArgMin; a <= kArgMax; a++, i++) {
                const int w = kWidths[wi];
                T r;
                switch (op) {
                case kIdx: r = __shfl_sync(0xffffffffu, v, a, w); break;
                case kUp: r = __shfl_up_sync(0xffffffffu, v, (unsigned)a, w); break;
                case kDown: r = __shfl_down_sync(0xffffffffu, v, (unsigned)a, w); break;
                default: r = __shfl_xor_sync(0xffffffffu, v, a, w); break;
                }
                out[i * blockDim.x + t] = r;
            }
}

/* Values of one type for the 64 lanes: all different, with bits set in both 32-bit halves of
 * the 64-bit types (a shuffle that moved only one half would show). */
template <class T> T lane_value(unsigned t);
template <> int lane_value<int>(unsigned t) { return (int)(0x9e3779b9u * (t + 1)); }
template <> unsigned lane_value<unsigned>(unsigned t) { return 0x85ebca6bu * (t + 7); }
template <> float lane_value<float>(unsigned t) { return ((float)t - 30.0f) * 1.25f + 0.0625f; }
template <> double lane_value<double>(unsigned t) { return ((double)t - 17.0) * 1.0000000001 + 1e-300 * t; }
template <> long long lane_value<long long>(unsigned t) { return (long long)(0x9e3779b97f4a7c15ull * (t + 1)); }
template <> unsigned long long lane_value<unsigned long long>(unsigned t) { return 0xc2b2ae3d27d4eb4full * (t + 3); }

/* Every op x width x argument for one type; the number of (op, width, argument) cases whose 64
 * lanes all matched the reference goes to *cases_ok. */
template <class T> void check_shuffle_table(const char *type, int *cases_ok)
{
    std::vector<T> host_in(kShuffleThreads);
    for (unsigned t = 0; t < kShuffleThreads; t++)
        host_in[t] = lane_value<T>(t);
    const size_t cases = (size_t)kShuffleOps * kNumWidths * kArgs;
    DeviceBuffer<T> in(kShuffleThreads), out(cases * kShuffleThreads);
    in.put(host_in);
    EMU_OK(PRISM_CUDAEMU_LAUNCH(shuffle_table_kernel<T>, 1, kShuffleThreads, nullptr, in.p, out.p));
    EMU_OK(cudaDeviceSynchronize());
    const std::vector<T> got = out.get();
    size_t i = 0;
    int wrong = 0;
    for (int op = 0; op < kShuffleOps; op++)
        for (int wi = 0; wi < kNumWidths; wi++)
            for (int a = kArgMin; a <= kArgMax; a++, i++) {
                bool ok = true;
                for (unsigned t = 0; t < kShuffleThreads; t++) {
                    const unsigned warp_base = t / 32 * 32;
                    const T want = host_in[warp_base + reference_source_lane(op, t % 32, a, kWidths[wi])];
                    if (memcmp(&want, &got[i * kShuffleThreads + t], sizeof(T)) != 0) {
                        if (ok && wrong++ < 5)
                            fprintf(stderr, "\n  %s<%s>(arg %d, width %d): thread %u got the wrong value",
                                    kShuffleNames[op], type, a, kWidths[wi], t);
                        ok = false;
                    }
                }
                *cases_ok += ok;
            }
    CU_ASSERT_EQUAL(wrong, 0);
}

void test_shuffles_match_ptx_for_every_width_and_argument()
{
    int ok = 0;
    check_shuffle_table<int>("int", &ok);
    check_shuffle_table<unsigned>("unsigned", &ok);
    check_shuffle_table<float>("float", &ok);
    check_shuffle_table<double>("double", &ok);
    check_shuffle_table<long long>("long long", &ok);
    check_shuffle_table<unsigned long long>("unsigned long long", &ok);
    CU_ASSERT_EQUAL(ok, 6 * kShuffleOps * kNumWidths * kArgs); /* 6 x 4 x 6 x 49 = 7,056 cases */
}

/* Partial masks: groups of lanes that shuffle at the same time with disjoint masks, every read
 * inside the caller's group. Two kernels: halves (0x0000ffff, 0xffff0000), and odd and even lanes
 * (0xaaaaaaaa, 0x55555555); rows of 32 lanes each:
 *   halves   0-15   __shfl_sync(src, width 16)                               src = row
 *            16-31  __shfl_down_sync(delta, width 16)                        delta = row - 16
 *            32-47  __shfl_up_sync(delta, width 16)                          delta = row - 32
 *            48-63  __shfl_xor_sync(laneMask, width 16)                      laneMask = row - 48
 *            64-79  __shfl_sync(src, width 32) reading the caller's half     src = row - 64 (+16)
 *   parities 0-15   __shfl_sync(src)         src = 2 * row + the caller's parity
 *            16-19  __shfl_xor_sync(laneMask)                                laneMask = 2 * (row - 16) */
const int kHalfRows = 80, kParityRows = 20;

__global__ void shuffle_half_masks_kernel(int *out)
{
    const unsigned lane = threadIdx.x;
    const int v = (int)(lane * 1000u + 7u);
    const unsigned half = lane < 16 ? 0x0000ffffu : 0xffff0000u;
    int row = 0;
    for (int s = 0; s < 16; s++)
        out[row++ * 32 + lane] = __shfl_sync(half, v, s, 16);
    for (unsigned d = 0; d < 16; d++)
        out[row++ * 32 + lane] = __shfl_down_sync(half, v, d, 16);
    for (unsigned d = 0; d < 16; d++)
        out[row++ * 32 + lane] = __shfl_up_sync(half, v, d, 16);
    for (int m = 0; m < 16; m++)
        out[row++ * 32 + lane] = __shfl_xor_sync(half, v, m, 16);
    for (int s = 0; s < 16; s++)
        out[row++ * 32 + lane] = __shfl_sync(half, v, s + (lane < 16 ? 0 : 16));
}

__global__ void shuffle_parity_masks_kernel(int *out)
{
    const unsigned lane = threadIdx.x;
    const int v = (int)(lane * 1000u + 7u);
    const unsigned parity = lane & 1u ? 0xaaaaaaaau : 0x55555555u;
    int row = 0;
    for (int s = 0; s < 16; s++)
        out[row++ * 32 + lane] = __shfl_sync(parity, v, 2 * s + (int)(lane & 1u));
    for (int m = 0; m < 4; m++)
        out[row++ * 32 + lane] = __shfl_xor_sync(parity, v, 2 * m);
}

/* The source lane of row `row` of the two kernels above. */
unsigned partial_source_lane(bool halves, int row, unsigned lane)
{
    if (!halves)
        return row < 16 ? reference_source_lane(kIdx, lane, 2 * row + (int)(lane & 1u), 32)
                        : reference_source_lane(kXor, lane, 2 * (row - 16), 32);
    if (row < 16)
        return reference_source_lane(kIdx, lane, row, 16);
    if (row < 32)
        return reference_source_lane(kDown, lane, row - 16, 16);
    if (row < 48)
        return reference_source_lane(kUp, lane, row - 32, 16);
    if (row < 64)
        return reference_source_lane(kXor, lane, row - 48, 16);
    return reference_source_lane(kIdx, lane, row - 64 + (lane < 16 ? 0 : 16), 32);
}

void test_shuffles_with_disjoint_partial_masks_at_once()
{
    for (int halves = 1; halves >= 0; halves--) {
        const int rows = halves ? kHalfRows : kParityRows;
        DeviceBuffer<int> out((size_t)rows * 32);
        if (halves)
            EMU_OK(PRISM_CUDAEMU_LAUNCH(shuffle_half_masks_kernel, 1, 32, nullptr, out.p));
        else
            EMU_OK(PRISM_CUDAEMU_LAUNCH(shuffle_parity_masks_kernel, 1, 32, nullptr, out.p));
        EMU_OK(cudaDeviceSynchronize());
        const std::vector<int> got = out.get();
        int wrong = 0;
        for (int row = 0; row < rows; row++)
            for (unsigned lane = 0; lane < 32; lane++) {
                const int want = (int)(partial_source_lane(halves, row, lane) * 1000u + 7u);
                if (got[(size_t)row * 32 + lane] != want && wrong++ < 5)
                    fprintf(stderr, "\n  %s row %d lane %u: %d, expected %d", halves ? "halves" : "parities", row,
                            lane, got[(size_t)row * 32 + lane], want);
            }
        CU_ASSERT_EQUAL(wrong, 0);
    }
}

/* Masks that overlap but are used one after the other, as CUDA allows: every lane named in each
 * mask executes that operation with that mask, in whatever order the lanes get there. The halves
 * shuffle, then the whole warp meets at __syncwarp(), then odd and even lanes shuffle, then the
 * whole warp shuffles; then the votes with halves, the whole warp and parities in turn. */
__global__ void overlapping_masks_in_sequence_kernel(int *out)
{
    const unsigned lane = threadIdx.x;
    const unsigned half = lane < 16 ? 0x0000ffffu : 0xffff0000u;
    const unsigned parity = lane & 1u ? 0xaaaaaaaau : 0x55555555u;
    const int a = __shfl_down_sync(half, (int)lane, 1, 16);
    __syncwarp();
    const int b = __shfl_xor_sync(parity, a, 2);
    out[lane] = __shfl_sync(0xffffffffu, b, 31 - (int)lane);
    out[32 + lane] = (int)__ballot_sync(half, lane % 3 == 0);
    out[64 + lane] = __any_sync(0xffffffffu, lane == 5);
    out[96 + lane] = __all_sync(parity, lane != 4);
}

void test_shuffles_with_masks_that_overlap_in_sequence()
{
    DeviceBuffer<int> out(128);
    EMU_OK(PRISM_CUDAEMU_LAUNCH(overlapping_masks_in_sequence_kernel, 1, 32, nullptr, out.p));
    EMU_OK(cudaDeviceSynchronize());
    const std::vector<int> got = out.get();
    int wrong = 0;
    for (unsigned lane = 0; lane < 32; lane++) {
        const unsigned b_src = reference_source_lane(kXor, 31 - lane, 2, 32);
        const unsigned a_src = reference_source_lane(kDown, b_src, 1, 16);
        wrong += got[lane] != (int)a_src;
        wrong += (unsigned)got[32 + lane] != (0x49249249u & (lane < 16 ? 0x0000ffffu : 0xffff0000u));
        wrong += got[64 + lane] == 0;
        wrong += (got[96 + lane] != 0) != (lane % 2 == 1); /* lane 4 is even: the even lanes' vote fails */
    }
    CU_ASSERT_EQUAL(wrong, 0);
}

/* ---- votes ----------------------------------------------------------------------------------- */

/* Predicates: bit `lane` of each pattern (times a lane-dependent non-zero factor, as a predicate
 * is any non-zero int). */
const unsigned kVotePatterns[] = {0x00000000u, 0xffffffffu, 0x00000001u, 0x80000000u, 0x55555555u,
                                  0xaaaaaaaau, 0x7fffffffu, 0xfffffffeu, 0x0000ffffu, 0xffff0000u,
                                  0x00010000u, 0x0000fffeu, 0x12345678u, 0x9e3779b9u, 0xffff7fffu};
const int kNumPatterns = sizeof kVotePatterns / sizeof kVotePatterns[0];
/* Masks, each with the lanes that use it: one mask for the whole warp, halves, or parities. */
const int kMaskSets = 3;
__host__ __device__ unsigned vote_mask(int set, unsigned lane)
{
    if (set == 0)
        return 0xffffffffu;
    if (set == 1)
        return lane < 16 ? 0x0000ffffu : 0xffff0000u;
    return lane & 1u ? 0xaaaaaaaau : 0x55555555u;
}

/* out[((p * kMaskSets + set) * 3 + k) * 32 + lane]: k = 0 ballot, 1 any, 2 all. One launch per
 * set of masks (test_shuffles_with_masks_that_overlap_in_sequence covers changing sets). */
__global__ void vote_kernel(const unsigned *patterns, int n, int set, unsigned *out)
{
    const unsigned lane = threadIdx.x;
    const unsigned mask = vote_mask(set, lane);
    for (int p = 0; p < n; p++) {
        const int pred = (int)((patterns[p] >> lane) & 1u) * -(int)(lane + 1);
        unsigned *o = out + ((size_t)(p * kMaskSets + set) * 3) * 32 + lane;
        o[0] = __ballot_sync(mask, pred);
        o[32] = (unsigned)__any_sync(mask, pred);
        o[64] = (unsigned)__all_sync(mask, pred);
    }
}

void test_votes_with_full_and_partial_masks()
{
    DeviceBuffer<unsigned> patterns(kNumPatterns), out((size_t)kNumPatterns * kMaskSets * 3 * 32);
    patterns.put(std::vector<unsigned>(kVotePatterns, kVotePatterns + kNumPatterns));
    for (int set = 0; set < kMaskSets; set++)
        EMU_OK(PRISM_CUDAEMU_LAUNCH(vote_kernel, 1, 32, nullptr, patterns.p, kNumPatterns, set, out.p));
    EMU_OK(cudaDeviceSynchronize());
    const std::vector<unsigned> got = out.get();
    int wrong = 0, cases = 0;
    for (int p = 0; p < kNumPatterns; p++)
        for (int set = 0; set < kMaskSets; set++)
            for (unsigned lane = 0; lane < 32; lane++, cases++) {
                /* Ballot: bit N set iff lane N is in the mask and its predicate is non-zero; any:
                 * some lane of the mask; all: every lane of the mask. */
                const unsigned mask = vote_mask(set, lane);
                const unsigned ballot = kVotePatterns[p] & mask;
                const unsigned *o = &got[((size_t)(p * kMaskSets + set) * 3) * 32 + lane];
                const bool ok = o[0] == ballot && (o[32] != 0) == (ballot != 0) && (o[64] != 0) == (ballot == mask);
                if (!ok && wrong++ < 5)
                    fprintf(stderr, "\n  pattern 0x%08x mask 0x%08x lane %u: ballot 0x%08x any %u all %u",
                            kVotePatterns[p], mask, lane, o[0], o[32], o[64]);
            }
    CU_ASSERT_EQUAL(wrong, 0);
    CU_ASSERT_EQUAL(cases, kNumPatterns * kMaskSets * 32);
}

/* ---- __syncwarp and __activemask ------------------------------------------------------------- */

/* Lanes exchange values through shared memory with __syncwarp between the writes and the reads:
 * the whole warp, then each half with its own mask. */
__global__ void syncwarp_exchange_kernel(int *out)
{
    __shared__ int s[32];
    const unsigned lane = threadIdx.x;
    s[lane] = (int)(lane * lane + 1);
    __syncwarp();
    const int a = s[31 - lane];
    __syncwarp();
    s[lane] = a + 100;
    __syncwarp(0xffffffffu);
    const int b = s[(lane + 5) % 32];
    __syncwarp();
    const unsigned half = lane < 16 ? 0x0000ffffu : 0xffff0000u;
    s[lane] = (int)lane * 3;
    __syncwarp(half);
    const int c = s[(lane & 16u) | ((lane + 1) & 15u)]; /* the next lane of the caller's half */
    out[lane * 3 + 0] = a;
    out[lane * 3 + 1] = b;
    out[lane * 3 + 2] = c;
}

void test_syncwarp_orders_shared_memory_within_the_mask()
{
    DeviceBuffer<int> out(96);
    EMU_OK(PRISM_CUDAEMU_LAUNCH(syncwarp_exchange_kernel, 1, 32, nullptr, out.p));
    EMU_OK(cudaDeviceSynchronize());
    const std::vector<int> got = out.get();
    for (unsigned lane = 0; lane < 32; lane++) {
        const unsigned r = 31 - lane;
        CU_ASSERT_EQUAL(got[lane * 3 + 0], (int)(r * r + 1));
        const unsigned q = 31 - (lane + 5) % 32;
        CU_ASSERT_EQUAL(got[lane * 3 + 1], (int)(q * q + 1) + 100);
        CU_ASSERT_EQUAL(got[lane * 3 + 2], (int)((lane & 16u) | ((lane + 1) & 15u)) * 3);
    }
}

/* __activemask: the warp's lanes that exist (a block of 40 threads has a second warp of 8), and,
 * after the lanes below 16 returned, the lanes that remain. The emulation's answer is the lanes
 * that have not exited, whether or not they are converged at the call, so each read here is placed
 * where that is also CUDA's answer: every thread reads the first mask before any can exit (the
 * __syncthreads after it), and the lanes below 16 have no synchronisation point on their way
 * out, so they have exited before the others read the second. */
__global__ void activemask_kernel(unsigned *out)
{
    const unsigned t = threadIdx.x;
    const unsigned all = __activemask();
    __syncthreads();
    out[t] = all;
    if (t % 32 < 16)
        return;
    const unsigned rest = __activemask();
    __syncwarp(0xffff0000u);
    out[40 + t] = rest;
}

void test_activemask_names_the_existing_and_remaining_lanes()
{
    DeviceBuffer<unsigned> out(80);
    EMU_OK(cudaMemset(out.p, 0, 80 * sizeof(unsigned)));
    EMU_OK(PRISM_CUDAEMU_LAUNCH(activemask_kernel, 1, 40, nullptr, out.p));
    EMU_OK(cudaDeviceSynchronize());
    const std::vector<unsigned> got = out.get();
    int wrong = 0;
    for (unsigned t = 0; t < 40; t++) {
        wrong += got[t] != (t < 32 ? 0xffffffffu : 0x000000ffu);
        /* Warp 0: lanes 16-31 remain; warp 1 has only lanes 0-7, which all returned. */
        wrong += got[40 + t] != (t >= 16 && t < 32 ? 0xffff0000u : 0u);
    }
    CU_ASSERT_EQUAL(wrong, 0);
}

/* ---- atomics --------------------------------------------------------------------------------- */

const unsigned kAtomicBlocks = 64, kAtomicThreads = 128, kAtomicN = kAtomicBlocks * kAtomicThreads;

struct AtomicTotals {
    int add_int, sub_int, max_int, min_int;
    unsigned add_u, max_u, min_u;
    unsigned long long add_ull, max_ull, min_ull;
    long long max_ll, min_ll;
    float add_f;
    double add_d;
    int cas_count, cas_winner, cas_wins;
    unsigned long long cas_ull;
    int exch;
    long long exch_returned; /* the sum of every value atomicExch returned */
    unsigned or_bits[4], and_bits[4], xor_bits[4];
    int or_int, and_int, xor_int;
};

/* The value thread i brings to the min/max atomics: a permutation of 0..N-1, shifted. */
__host__ __device__ long long atomic_key(unsigned i)
{
    return (long long)((i * 2654435761u) % kAtomicN) - (long long)(kAtomicN / 2);
}

/* Every thread of every block applies each atomic once; tickets[k] counts how often atomicAdd on
 * add_int returned k (each of 0..N-1 exactly once). */
__global__ void atomics_kernel(AtomicTotals *a, int *tickets)
{
    const unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
    const long long key = atomic_key(i);
    atomicAdd(&tickets[atomicAdd(&a->add_int, 1)], 1);
    atomicSub(&a->sub_int, (int)(i % 7));
    atomicMax(&a->max_int, (int)key);
    atomicMin(&a->min_int, (int)key);
    atomicAdd(&a->add_u, 0x10001u);
    atomicMax(&a->max_u, (unsigned)(key + kAtomicN));
    atomicMin(&a->min_u, (unsigned)(key + kAtomicN));
    atomicAdd(&a->add_ull, (1ull << 40) + i);
    atomicMax(&a->max_ull, (unsigned long long)(key + kAtomicN) << 33);
    atomicMin(&a->min_ull, (unsigned long long)(key + kAtomicN) << 33);
    atomicMax(&a->max_ll, key * 1000000007LL);
    atomicMin(&a->min_ll, key * 1000000007LL);
    atomicAdd(&a->add_f, 0.5f);
    atomicAdd(&a->add_d, 0.25 * (double)i);
    /* A counter incremented through a CAS loop, and a slot only the first CAS can claim. */
    int old = 0, seen; /* a guess; each failed CAS returns the value to try next */
    while ((seen = atomicCAS(&a->cas_count, old, old + 1)) != old)
        old = seen;
    if (atomicCAS(&a->cas_winner, 0, (int)i + 1) == 0)
        atomicAdd(&a->cas_wins, 1);
    unsigned long long o = 0, s;
    while ((s = atomicCAS(&a->cas_ull, o, o + 3)) != o)
        o = s;
    atomicAdd((unsigned long long *)&a->exch_returned, (unsigned long long)(long long)atomicExch(&a->exch, (int)i));
    atomicOr(&a->or_bits[i % 4], 1u << (i / 4 % 32));
    atomicAnd(&a->and_bits[i % 4], ~(1u << (i % 32)));
    atomicXor(&a->xor_bits[i % 4], (i % 3 == 0) ? 1u << (i % 32) : 0u);
    atomicOr(&a->or_int, (int)(1u << (i % 31)));
    atomicAnd(&a->and_int, ~(int)(1u << (i % 13)));
    atomicXor(&a->xor_int, (int)i);
}

void test_atomics_from_many_blocks_give_exact_totals()
{
    AtomicTotals init;
    memset(&init, 0, sizeof init);
    init.max_int = INT_MIN;
    init.min_int = INT_MAX;
    init.min_u = 0xffffffffu;
    init.min_ull = ~0ull;
    init.max_ll = LLONG_MIN;
    init.min_ll = LLONG_MAX;
    init.exch = -1;
    for (int k = 0; k < 4; k++)
        init.and_bits[k] = 0xffffffffu;
    init.and_int = -1;
    DeviceBuffer<AtomicTotals> a(1);
    DeviceBuffer<int> tickets(kAtomicN);
    a.put(std::vector<AtomicTotals>(1, init));
    EMU_OK(cudaMemset(tickets.p, 0, kAtomicN * sizeof(int)));
    EMU_OK(PRISM_CUDAEMU_LAUNCH(atomics_kernel, kAtomicBlocks, kAtomicThreads, nullptr, a.p, tickets.p));
    EMU_OK(cudaDeviceSynchronize());
    const AtomicTotals got = a.get()[0];
    const std::vector<int> t = tickets.get();

    /* The reference: the same operations applied one after the other on the host. */
    long long sub = 0, max_key = LLONG_MIN, min_key = LLONG_MAX, sum_i = 0;
    unsigned or_bits[4] = {0, 0, 0, 0}, and_bits[4], xor_bits[4] = {0, 0, 0, 0};
    unsigned or_int = 0, and_int = ~0u, xor_int = 0;
    for (int k = 0; k < 4; k++)
        and_bits[k] = 0xffffffffu;
    for (unsigned i = 0; i < kAtomicN; i++) {
        sub -= i % 7;
        max_key = atomic_key(i) > max_key ? atomic_key(i) : max_key;
        min_key = atomic_key(i) < min_key ? atomic_key(i) : min_key;
        sum_i += i;
        or_bits[i % 4] |= 1u << (i / 4 % 32);
        and_bits[i % 4] &= ~(1u << (i % 32));
        xor_bits[i % 4] ^= (i % 3 == 0) ? 1u << (i % 32) : 0u;
        or_int |= 1u << (i % 31);
        and_int &= ~(1u << (i % 13));
        xor_int ^= i;
    }
    CU_ASSERT_EQUAL(got.add_int, (int)kAtomicN);
    int bad_tickets = 0;
    for (unsigned k = 0; k < kAtomicN; k++)
        bad_tickets += t[k] != 1;
    CU_ASSERT_EQUAL(bad_tickets, 0);
    CU_ASSERT_EQUAL(got.sub_int, (int)sub);
    CU_ASSERT_EQUAL(got.max_int, (int)max_key);
    CU_ASSERT_EQUAL(got.min_int, (int)min_key);
    CU_ASSERT_EQUAL(got.add_u, 0x10001u * kAtomicN);
    CU_ASSERT_EQUAL(got.max_u, (unsigned)(max_key + kAtomicN));
    CU_ASSERT_EQUAL(got.min_u, (unsigned)(min_key + kAtomicN));
    CU_ASSERT_EQUAL(got.add_ull, (1ull << 40) * kAtomicN + (unsigned long long)sum_i);
    CU_ASSERT_EQUAL(got.max_ull, (unsigned long long)(max_key + kAtomicN) << 33);
    CU_ASSERT_EQUAL(got.min_ull, (unsigned long long)(min_key + kAtomicN) << 33);
    CU_ASSERT_EQUAL(got.max_ll, max_key * 1000000007LL);
    CU_ASSERT_EQUAL(got.min_ll, min_key * 1000000007LL);
    CU_ASSERT_EQUAL(got.add_f, 0.5f * (float)kAtomicN); /* every partial sum is exact */
    CU_ASSERT_EQUAL(got.add_d, 0.25 * (double)sum_i);
    CU_ASSERT_EQUAL(got.cas_count, (int)kAtomicN);
    CU_ASSERT_EQUAL(got.cas_wins, 1);
    CU_ASSERT(got.cas_winner >= 1 && got.cas_winner <= (int)kAtomicN);
    CU_ASSERT_EQUAL(got.cas_ull, 3ull * kAtomicN);
    /* atomicExch hands each value on exactly once: what the calls returned plus what is left is
     * the initial -1 plus every thread's i. */
    CU_ASSERT_EQUAL(got.exch_returned + got.exch, -1 + sum_i);
    for (int k = 0; k < 4; k++) {
        CU_ASSERT_EQUAL(got.or_bits[k], or_bits[k]);
        CU_ASSERT_EQUAL(got.and_bits[k], and_bits[k]);
        CU_ASSERT_EQUAL(got.xor_bits[k], xor_bits[k]);
    }
    CU_ASSERT_EQUAL((unsigned)got.or_int, or_int);
    CU_ASSERT_EQUAL((unsigned)got.and_int, and_int);
    CU_ASSERT_EQUAL((unsigned)got.xor_int, xor_int);
}

/* ---- integer intrinsics ---------------------------------------------------------------------- */

/* Definitions from the CUDA Math API, written as loops over the bits. */
int ref_popc(unsigned long long x, int bits)
{
    int n = 0;
    for (int i = 0; i < bits; i++)
        n += (int)((x >> i) & 1u);
    return n;
}
int ref_clz(unsigned long long x, int bits) /* leading zeros: `bits` for 0 */
{
    int n = 0;
    for (int i = bits - 1; i >= 0 && !((x >> i) & 1u); i--)
        n++;
    return n;
}
int ref_ffs(unsigned long long x, int bits) /* 1 + the position of the lowest set bit; 0 for 0 */
{
    for (int i = 0; i < bits; i++)
        if ((x >> i) & 1u)
            return i + 1;
    return 0;
}
unsigned ref_brev(unsigned x)
{
    unsigned r = 0;
    for (int i = 0; i < 32; i++)
        if (x & (1u << i))
            r |= 0x80000000u >> i;
    return r;
}
unsigned ref_vcmpeq4(unsigned a, unsigned b) /* per byte: 0xff when equal */
{
    unsigned r = 0;
    for (int i = 0; i < 4; i++)
        if (((a ^ b) >> (8 * i) & 0xffu) == 0)
            r |= 0xffu << (8 * i);
    return r;
}

struct BitResult {
    int popc, clz, ffs, popcll, clzll, ffsll;
    unsigned brev, vcmpeq4;
};

__global__ void bit_intrinsics_kernel(const unsigned *a, const unsigned *b, int n, BitResult *out)
{
    const int i = (int)(blockIdx.x * blockDim.x + threadIdx.x);
    if (i >= n)
        return;
    const unsigned long long wide = (unsigned long long)a[i] << 32 | b[i];
    out[i].popc = __popc(a[i]);
    out[i].clz = __clz((int)a[i]);
    out[i].ffs = __ffs((int)a[i]);
    out[i].popcll = __popcll(wide);
    out[i].clzll = __clzll((long long)wide);
    out[i].ffsll = __ffsll((long long)wide);
    out[i].brev = __brev(a[i]);
    out[i].vcmpeq4 = __vcmpeq4(a[i], b[i]);
}

uint64_t splitmix(uint64_t *s)
{
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

void test_integer_intrinsics_match_their_definitions()
{
    /* Edge values, then random ones; b shares a random subset of a's bytes (vcmpeq4). */
    std::vector<unsigned> a = {0u, 1u, 2u, 0x80000000u, 0xffffffffu, 0x7fffffffu, 0x12345678u, 0xf0f0f0f0u,
                               0x00010000u, 0x80000001u};
    std::vector<unsigned> b = {0u, 0u, 0u, 0u, 0u, 0xffffffffu, 0x12005600u, 0x0f0f0f0fu, 0u, 0x80000001u};
    uint64_t seed = 42;
    while (a.size() < 4096) {
        const uint64_t r = splitmix(&seed);
        unsigned x = (unsigned)r >> (r >> 59); /* varied leading zeros */
        unsigned y = (unsigned)(r >> 32) << ((r >> 54) & 31);
        unsigned mix = (unsigned)splitmix(&seed), same = 0;
        for (int k = 0; k < 4; k++)
            if ((mix >> k) & 1u)
                same |= 0xffu << (8 * k);
        a.push_back(x);
        b.push_back((x & same) | (y & ~same));
    }
    const int n = (int)a.size();
    DeviceBuffer<unsigned> da(a.size()), db(b.size());
    DeviceBuffer<BitResult> out(a.size());
    da.put(a);
    db.put(b);
    EMU_OK(PRISM_CUDAEMU_LAUNCH(bit_intrinsics_kernel, (n + 127) / 128, 128, nullptr, da.p, db.p, n, out.p));
    EMU_OK(cudaDeviceSynchronize());
    const std::vector<BitResult> got = out.get();
    int wrong = 0;
    for (int i = 0; i < n; i++) {
        const unsigned long long wide = (unsigned long long)a[i] << 32 | b[i];
        const BitResult &g = got[i];
        const bool ok = g.popc == ref_popc(a[i], 32) && g.clz == ref_clz(a[i], 32) && g.ffs == ref_ffs(a[i], 32) &&
                        g.popcll == ref_popc(wide, 64) && g.clzll == ref_clz(wide, 64) &&
                        g.ffsll == ref_ffs(wide, 64) && g.brev == ref_brev(a[i]) &&
                        g.vcmpeq4 == ref_vcmpeq4(a[i], b[i]);
        if (!ok && wrong++ < 5)
            fprintf(stderr, "\n  a 0x%08x b 0x%08x: popc %d clz %d ffs %d brev 0x%08x vcmpeq4 0x%08x", a[i], b[i],
                    g.popc, g.clz, g.ffs, g.brev, g.vcmpeq4);
    }
    CU_ASSERT_EQUAL(wrong, 0);
}

/* ---- min and max overloads ------------------------------------------------------------------- */

struct MinMax {
    int imin, imax;
    unsigned umin, umax;
    long long llmin, llmax;
    unsigned long long ullmin, ullmax;
    float fmin_, fmax_, fmin_nan, fmax_nan;
    double dmin, dmax, dmin_nan;
};

__global__ void min_max_kernel(MinMax *o)
{
    o->imin = min(-5, 3);
    o->imax = max(INT_MIN, INT_MAX);
    o->umin = min(0xffffffffu, 1u); /* unsigned: 0xffffffff is the larger, not -1 */
    o->umax = max(0xffffffffu, 1u);
    o->llmin = min(-(1LL << 40), 7LL);
    o->llmax = max(-(1LL << 40), 7LL);
    o->ullmin = min(1ull << 63, 5ull);
    o->ullmax = max(1ull << 63, 5ull);
    o->fmin_ = min(-0.5f, 2.0f);
    o->fmax_ = max(-0.5f, 2.0f);
    o->fmin_nan = min(NAN, 1.5f); /* fminf: a NaN operand gives the other one */
    o->fmax_nan = max(2.5f, NAN);
    o->dmin = min(-1e300, 1e-300);
    o->dmax = max(-1e300, 1e-300);
    o->dmin_nan = min((double)NAN, -3.0);
}

void test_min_max_overloads_keep_each_type()
{
    DeviceBuffer<MinMax> out(1);
    EMU_OK(PRISM_CUDAEMU_LAUNCH(min_max_kernel, 1, 1, nullptr, out.p));
    EMU_OK(cudaDeviceSynchronize());
    const MinMax g = out.get()[0];
    CU_ASSERT_EQUAL(g.imin, -5);
    CU_ASSERT_EQUAL(g.imax, INT_MAX);
    CU_ASSERT_EQUAL(g.umin, 1u);
    CU_ASSERT_EQUAL(g.umax, 0xffffffffu);
    CU_ASSERT_EQUAL(g.llmin, -(1LL << 40));
    CU_ASSERT_EQUAL(g.llmax, 7LL);
    CU_ASSERT_EQUAL(g.ullmin, 5ull);
    CU_ASSERT_EQUAL(g.ullmax, 1ull << 63);
    CU_ASSERT_EQUAL(g.fmin_, -0.5f);
    CU_ASSERT_EQUAL(g.fmax_, 2.0f);
    CU_ASSERT_EQUAL(g.fmin_nan, 1.5f);
    CU_ASSERT_EQUAL(g.fmax_nan, 2.5f);
    CU_ASSERT_EQUAL(g.dmin, -1e300);
    CU_ASSERT_EQUAL(g.dmax, 1e-300);
    CU_ASSERT_EQUAL(g.dmin_nan, -3.0);
}

/* ---- correctly rounded float arithmetic ------------------------------------------------------ */

struct Rounded {
    float add, sub, mul, div, sqrt_;
};

__global__ void rounded_kernel(const float *a, const float *b, int n, Rounded *out)
{
    const int i = (int)(blockIdx.x * blockDim.x + threadIdx.x);
    if (i >= n)
        return;
    out[i].add = __fadd_rn(a[i], b[i]);
    out[i].sub = __fsub_rn(a[i], b[i]);
    out[i].mul = __fmul_rn(a[i], b[i]);
    out[i].div = __fdiv_rn(a[i], b[i]);
    out[i].sqrt_ = __fsqrt_rn(a[i]);
}

/* Same value, or both NaN. */
bool same_float(float x, float y)
{
    return (std::isnan(x) && std::isnan(y)) || memcmp(&x, &y, sizeof x) == 0;
}

float float_of_bits(uint32_t u)
{
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

void test_rounded_arithmetic_is_correctly_rounded()
{
    /* The reference: the operation in binary64, rounded once to binary32. binary64 has more than
     * 2 x 24 + 2 bits, so this double rounding is innocuous for +, -, x, / and sqrt: the result is
     * the correctly rounded binary32 one (Figueroa, 1995). */
    std::vector<float> a = {1.0f, 1.0f, -0.0f, 0.0f, INFINITY, 3.0f, 1.0f, 16777216.0f, 1e-45f, 3.4e38f},
                       b = {3.0f, 0.0f, 0.0f, 0.0f, INFINITY, 7.0f, 1e-8f, 1.0f, 0.5f, 10.0f};
    uint64_t seed = 7;
    while (a.size() < 4096) {
        const uint64_t r = splitmix(&seed);
        /* Random signs, mantissas and exponents over the whole range, subnormals included. */
        uint32_t x = (uint32_t)r, y = (uint32_t)(r >> 32);
        if ((x & 0x7f800000u) == 0x7f800000u)
            x &= 0xbfffffffu;
        if ((y & 0x7f800000u) == 0x7f800000u)
            y &= 0xbfffffffu;
        if (a.size() % 2) /* half of them close in magnitude: cancellation, exact quotients */
            y = (y & 0x807fffffu) | (x & 0x7f800000u);
        a.push_back(float_of_bits(x));
        b.push_back(float_of_bits(y));
    }
    const int n = (int)a.size();
    DeviceBuffer<float> da(a.size()), db(b.size());
    DeviceBuffer<Rounded> out(a.size());
    da.put(a);
    db.put(b);
    EMU_OK(PRISM_CUDAEMU_LAUNCH(rounded_kernel, (n + 255) / 256, 256, nullptr, da.p, db.p, n, out.p));
    EMU_OK(cudaDeviceSynchronize());
    const std::vector<Rounded> got = out.get();
    int wrong = 0;
    for (int i = 0; i < n; i++) {
        const double x = a[i], y = b[i];
        const Rounded want = {(float)(x + y), (float)(x - y), (float)(x * y), (float)(x / y), (float)std::sqrt(x)};
        const Rounded &g = got[i];
        const bool ok = same_float(g.add, want.add) && same_float(g.sub, want.sub) && same_float(g.mul, want.mul) &&
                        same_float(g.div, want.div) && same_float(g.sqrt_, want.sqrt_);
        if (!ok && wrong++ < 5)
            fprintf(stderr, "\n  %a op %a: + %a - %a x %a / %a sqrt %a", a[i], b[i], g.add, g.sub, g.mul, g.div,
                    g.sqrt_);
    }
    CU_ASSERT_EQUAL(wrong, 0);
}

/* ---- reinterpretations ----------------------------------------------------------------------- */

struct Reinterpreted {
    unsigned u[6];
    int i[2];
    float f[3];
    long long ll[2];
    double d[2];
};

__global__ void reinterpret_kernel(Reinterpreted *o)
{
    o->u[0] = __float_as_uint(1.0f);
    o->u[1] = __float_as_uint(-2.0f);
    o->u[2] = __float_as_uint(-0.0f);
    o->u[3] = __float_as_uint(INFINITY);
    o->u[4] = __float_as_uint(1.5f);
    o->u[5] = __float_as_uint(1e-45f); /* the smallest subnormal */
    o->i[0] = __float_as_int(-1.0f);
    o->i[1] = __float_as_int(0.1f);
    o->f[0] = __uint_as_float(0x40490fdbu);
    o->f[1] = __int_as_float((int)0xc0000000u);
    o->f[2] = __uint_as_float(0x00800000u);
    o->ll[0] = __double_as_longlong(1.0);
    o->ll[1] = __double_as_longlong(-0.5);
    o->d[0] = __longlong_as_double(0x400921fb54442d18LL);
    o->d[1] = __longlong_as_double((long long)0x8000000000000001ull);
}

void test_reinterpretations_keep_every_bit()
{
    DeviceBuffer<Reinterpreted> out(1);
    EMU_OK(PRISM_CUDAEMU_LAUNCH(reinterpret_kernel, 1, 1, nullptr, out.p));
    EMU_OK(cudaDeviceSynchronize());
    const Reinterpreted g = out.get()[0];
    const unsigned u[6] = {0x3f800000u, 0xc0000000u, 0x80000000u, 0x7f800000u, 0x3fc00000u, 0x00000001u};
    for (int k = 0; k < 6; k++)
        CU_ASSERT_EQUAL(g.u[k], u[k]);
    CU_ASSERT_EQUAL(g.i[0], (int)0xbf800000u);
    CU_ASSERT_EQUAL(g.i[1], 0x3dcccccd);
    CU_ASSERT_EQUAL(g.f[0], 3.14159274f);
    CU_ASSERT_EQUAL(g.f[1], -2.0f);
    CU_ASSERT_EQUAL(g.f[2], FLT_MIN);
    CU_ASSERT_EQUAL(g.ll[0], 0x3ff0000000000000LL);
    CU_ASSERT_EQUAL(g.ll[1], (long long)0xbfe0000000000000ull);
    CU_ASSERT_EQUAL(g.d[0], 3.141592653589793);
    CU_ASSERT_EQUAL(g.d[1], -4.9406564584124654e-324);
}

/* ---- built-in variables ---------------------------------------------------------------------- */

struct Ids {
    unsigned tid[3], bid[3], bdim[3], gdim[3];
    unsigned warp_first; /* the linear index of lane 0 of the caller's warp, by a shuffle */
    unsigned active;     /* __activemask() */
};

/* Each thread writes its registers at its global linear index (block-major, x fastest). */
__global__ void ids_kernel(Ids *out)
{
    const unsigned nthreads = blockDim.x * blockDim.y * blockDim.z;
    const unsigned t = threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z);
    const unsigned b = blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z);
    Ids &o = out[(size_t)b * nthreads + t];
    o.tid[0] = threadIdx.x, o.tid[1] = threadIdx.y, o.tid[2] = threadIdx.z;
    o.bid[0] = blockIdx.x, o.bid[1] = blockIdx.y, o.bid[2] = blockIdx.z;
    o.bdim[0] = blockDim.x, o.bdim[1] = blockDim.y, o.bdim[2] = blockDim.z;
    o.gdim[0] = gridDim.x, o.gdim[1] = gridDim.y, o.gdim[2] = gridDim.z;
    o.active = __activemask();
    o.warp_first = __shfl_sync(o.active, t, 0);
}

struct Shape {
    dim3 grid, block;
};

void test_builtin_variables_for_3d_grids_and_blocks()
{
    /* Warps are formed from the linear thread index, x fastest (so a block of 5 x 3 x 2 = 30 has
     * one warp of 30 lanes, and 8 x 4 x 3 = 96 has three full ones). */
    const Shape shapes[] = {{dim3(3, 2, 2), dim3(8, 4, 3)},
                            {dim3(2, 3, 4), dim3(5, 3, 2)},
                            {dim3(1, 1, 5), dim3(1, 1, 64)},
                            {dim3(7, 1, 1), dim3(33, 1, 1)},
                            {dim3(1, 9, 1), dim3(2, 16, 1)}};
    for (const Shape &s : shapes) {
        const unsigned nt = s.block.x * s.block.y * s.block.z, nb = s.grid.x * s.grid.y * s.grid.z;
        DeviceBuffer<Ids> out((size_t)nt * nb);
        EMU_OK(PRISM_CUDAEMU_LAUNCH(ids_kernel, s.grid, s.block, nullptr, out.p));
        EMU_OK(cudaDeviceSynchronize());
        const std::vector<Ids> got = out.get();
        int wrong = 0;
        for (unsigned b = 0; b < nb; b++)
            for (unsigned t = 0; t < nt; t++) {
                const Ids &o = got[(size_t)b * nt + t];
                const unsigned tid[3] = {t % s.block.x, t / s.block.x % s.block.y, t / (s.block.x * s.block.y)};
                const unsigned bid[3] = {b % s.grid.x, b / s.grid.x % s.grid.y, b / (s.grid.x * s.grid.y)};
                const unsigned warp_first = t / 32 * 32, lanes = nt - warp_first < 32 ? nt - warp_first : 32;
                const unsigned active = lanes == 32 ? 0xffffffffu : (1u << lanes) - 1u;
                bool ok = o.warp_first == warp_first && o.active == active;
                for (int k = 0; k < 3; k++)
                    ok = ok && o.tid[k] == tid[k] && o.bid[k] == bid[k];
                ok = ok && o.bdim[0] == s.block.x && o.bdim[1] == s.block.y && o.bdim[2] == s.block.z;
                ok = ok && o.gdim[0] == s.grid.x && o.gdim[1] == s.grid.y && o.gdim[2] == s.grid.z;
                if (!ok && wrong++ < 5)
                    fprintf(stderr, "\n  block %u thread %u: tid (%u,%u,%u) bid (%u,%u,%u) warp %u active 0x%08x", b,
                            t, o.tid[0], o.tid[1], o.tid[2], o.bid[0], o.bid[1], o.bid[2], o.warp_first, o.active);
            }
        CU_ASSERT_EQUAL(wrong, 0);
    }
}

/* ---- __shared__ and __syncthreads ------------------------------------------------------------ */

/* A tree reduction of 0..1023 in shared memory, one barrier per level. */
__global__ void block_sum_kernel(long long *out)
{
    __shared__ long long s[1024];
    const unsigned t = threadIdx.x;
    s[t] = (long long)t + blockIdx.x;
    __syncthreads();
    for (unsigned stride = blockDim.x / 2; stride > 0; stride /= 2) {
        if (t < stride)
            s[t] += s[t + stride];
        __syncthreads();
    }
    if (t == 0)
        out[blockIdx.x] = s[0];
}

void test_syncthreads_makes_shared_memory_visible_to_the_block()
{
    const unsigned blocks = 6;
    DeviceBuffer<long long> out(blocks);
    EMU_OK(PRISM_CUDAEMU_LAUNCH(block_sum_kernel, blocks, 1024, nullptr, out.p));
    EMU_OK(cudaDeviceSynchronize());
    const std::vector<long long> got = out.get();
    for (unsigned b = 0; b < blocks; b++)
        CU_ASSERT_EQUAL(got[b], 1023LL * 1024 / 2 + 1024LL * b);
}

/* Each block fills its shared array with its own index, and checks it, over and over between
 * barriers: blocks that ran at the same time and shared the array would see another's index. */
__global__ void shared_per_block_kernel(int *mismatches)
{
    __shared__ int s[256];
    const unsigned t = threadIdx.x;
    const int me = (int)blockIdx.x;
    int bad = 0;
    for (int round = 0; round < 50; round++) {
        s[t] = me * 1000 + round;
        __syncthreads();
        for (unsigned k = 0; k < blockDim.x; k += 17)
            bad += s[(t + k) % blockDim.x] != me * 1000 + round;
        __syncthreads();
    }
    atomicAdd(&mismatches[blockIdx.x], bad);
}

void test_shared_memory_is_separate_between_blocks()
{
    const unsigned blocks = 64;
    DeviceBuffer<int> bad(blocks);
    EMU_OK(cudaMemset(bad.p, 0, blocks * sizeof(int)));
    EMU_OK(PRISM_CUDAEMU_LAUNCH(shared_per_block_kernel, blocks, 256, nullptr, bad.p));
    EMU_OK(cudaDeviceSynchronize());
    const std::vector<int> got = bad.get();
    for (unsigned b = 0; b < blocks; b++)
        CU_ASSERT_EQUAL(got[b], 0);
}

const prism_test_case cases[] = {
    EMU_CASE(test_shuffles_match_ptx_for_every_width_and_argument),
    EMU_CASE(test_shuffles_with_disjoint_partial_masks_at_once),
    EMU_CASE(test_shuffles_with_masks_that_overlap_in_sequence),
    EMU_CASE(test_votes_with_full_and_partial_masks),
    EMU_CASE(test_syncwarp_orders_shared_memory_within_the_mask),
    EMU_CASE(test_activemask_names_the_existing_and_remaining_lanes),
    EMU_CASE(test_atomics_from_many_blocks_give_exact_totals),
    EMU_CASE(test_integer_intrinsics_match_their_definitions),
    EMU_CASE(test_min_max_overloads_keep_each_type),
    EMU_CASE(test_rounded_arithmetic_is_correctly_rounded),
    EMU_CASE(test_reinterpretations_keep_every_bit),
    EMU_CASE(test_builtin_variables_for_3d_grids_and_blocks),
    EMU_CASE(test_syncthreads_makes_shared_memory_visible_to_the_block),
    EMU_CASE(test_shared_memory_is_separate_between_blocks),
    {NULL, NULL},
};

const prism_test_suite suites[] = {{"cudaemu_intrinsics", cases}, {NULL, NULL}};

} /* namespace */

int main(int argc, char **argv)
{
    return prism_test_main(argc, argv, suites);
}
