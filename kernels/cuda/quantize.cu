/* prism_quantize_cuda: the codes and scales of prism_quantize_cpu, bit for bit, on the caller's
 * stream. Two shapes of work, chosen on the host:
 *
 * Teams (ROW and BLOCK groups of up to 8,192 or 16,384 elements): a team of 1 to 256 threads (a
 * power of two; several teams share a warp when groups are short) owns a group at a time. It reads
 * the group once into registers, reduces amax across the team (shuffles, and shared memory above a
 * warp), computes the scale, and writes the codes from the registers: one pass over memory.
 * Groups whose length is not a multiple of 8, or pointers not aligned for 16-byte loads, take the
 * same kernel element by element, reading the group a second time from L1/L2 for the codes; an
 * INT4 team then owns two groups of odd length at once, so that no byte of codes has two writers.
 *
 * Pieces (TENSOR, and groups longer than a team holds): the group is cut into pieces of 16,384
 * elements, one CTA per piece. An amax pass folds each piece into its group's scale slot with an
 * atomicMax on the bits (non-negative binary32 values order like their bits; the slots are zeroed
 * first), a small kernel turns each slot into the scale, and a codes pass quantizes each piece.
 * That reads the input twice, which a scale over the whole tensor needs. An INT4 byte holding two
 * elements is written by the piece that holds its even element, with the next group's scale for
 * the odd one when the byte straddles two groups.
 *
 * NaN/Inf are counted once (in the pass that computes amax) into *nonfinite with one atomicAdd
 * per warp that saw any, after a cudaMemsetAsync to 0. */
#include "common.cuh"

namespace prism_cu {
namespace {

struct QuantArgs {
    const void *x;
    uint64_t numel, len, groups; /* len: elements per group */
    uint8_t *codes;
    float *scales;
    unsigned long long *nonfinite;
    uint64_t seed;
    int pow2, stochastic;
};

constexpr uint64_t kPiece = 16384;                       /* elements of a piece */
constexpr int kPiecePacks = (int)(kPiece / kPack / kThreads); /* packs per thread and piece: 8 */
constexpr int kPieceBatch = 4;                           /* packs loaded before any is coded */
constexpr uint64_t kTeamScalarMax = 16384;               /* longest group a scalar team takes */

/* Packs each thread of a vector team keeps in registers (32 registers of input either way). */
template <int DT> __host__ __device__ constexpr int team_regs()
{
    return DT == PRISM_DTYPE_F32 ? 4 : 8;
}

/* The largest v over a team of `team` threads (a power of two up to kThreads), in every thread
 * of the team. Every thread of the CTA calls it together. */
__device__ __forceinline__ uint32_t team_max(uint32_t v, int team, uint32_t *red)
{
    if (team <= 32) {
        for (int off = team >> 1; off > 0; off >>= 1)
            v = max(v, __shfl_xor_sync(0xffffffffu, v, off));
        return v;
    }
    v = warp_max(v);
    const int warp = threadIdx.x >> 5, per = team >> 5, first = warp / per * per;
    if ((threadIdx.x & 31) == 0)
        red[warp] = v;
    __syncthreads();
    v = 0;
    for (int w = 0; w < per; w++)
        v = max(v, red[first + w]);
    __syncthreads();
    return v;
}

__device__ __forceinline__ uint32_t cta_max(uint32_t v, uint32_t *red)
{
    return team_max(v, kThreads, red);
}

/* ---- teams --------------------------------------------------------------------------------- */

/* One team per group (per pair of groups for odd-length INT4 groups in the scalar path). The loop
 * runs the same number of rounds in every thread of the CTA, so the team reductions, which may
 * synchronise the CTA, are reached by all.
 *
 * Two CTAs an SM (16 warps, at most 128 registers a thread): the kernel needs 88 to 96 registers
 * on sm_90. Three would cap it at 80 (registers are allocated per warp in units of 256, so 85 is
 * not available), and there ptxas spilled 12 to 20 bytes a thread to local memory, which
 * test_cuda_resources forbids. */
template <int DT, int FMT>
__global__ void __launch_bounds__(kThreads, 2)
    quantize_teams_kernel(QuantArgs a, int team, int vec, int pair, uint64_t units)
{
    constexpr int kRegs = team_regs<DT>();
    __shared__ uint32_t red[kWarps];
    const int t = threadIdx.x & (team - 1);
    const uint64_t per_cta = (uint64_t)(kThreads / team);
    const uint64_t teams = (uint64_t)gridDim.x * per_cta;
    const uint64_t first = (uint64_t)blockIdx.x * per_cta + threadIdx.x / team;
    const uint64_t rounds = (units + teams - 1) / teams;
    unsigned long long bad = 0;

    for (uint64_t round = 0; round < rounds; round++) {
        const uint64_t unit = round * teams + first;
        const bool active = unit < units;
        if (vec) {
            /* The group in registers: pack k of this thread is the group's pack t + k * team. */
            const uint64_t start = active ? unit * a.len : 0;
            const uint64_t count = active ? min(a.len, a.numel - start) : 0;
            const uint64_t packs = (count + kPack - 1) / kPack;
            Raw<DT> cache[kRegs];
            uint32_t amax = 0, b = 0;
#pragma unroll
            for (int k = 0; k < kRegs; k++) {
                const uint64_t pk = t + (uint64_t)k * team;
                if (pk < packs) {
                    cache[k] = load_pack_any<DT>(a.x, start / kPack + pk, a.numel, true);
                    pack_amax<DT>(cache[k], amax, b);
                }
            }
            bad += b;
            amax = team_max(amax, team, red);
            const float s = prism_qc_scale(__uint_as_float(amax), FMT, a.pow2);
            if (active && t == 0)
                a.scales[unit] = s;
            const Divisor d = divisor_of(s);
#pragma unroll
            for (int k = 0; k < kRegs; k++) {
                const uint64_t pk = t + (uint64_t)k * team;
                if (pk < packs) {
                    const uint64_t e0 = start + pk * kPack;
                    float v[kPack];
#pragma unroll
                    for (int j = 0; j < kPack; j++)
                        v[j] = scaled(raw_elem<DT>(cache[k], j), d);
                    uint32_t w[2];
                    pack_codes<FMT>(v, a.stochastic, e0, a.seed, w);
                    if (e0 + kPack <= a.numel)
                        store_pack_codes<FMT>(a.codes, e0, w);
                    else
                        store_partial_codes<FMT>(a.codes, e0, (int)(a.numel - e0), w);
                }
            }
        } else {
            /* Element by element: amax of each group of the unit, then the codes, read again. */
            const int groups_per_unit = pair ? 2 : 1;
            const uint64_t g0 = unit * (uint64_t)groups_per_unit;
            float s0 = 1.0f, s1 = 1.0f;
            for (int gi = 0; gi < groups_per_unit; gi++) {
                const uint64_t g = g0 + (uint64_t)gi;
                uint32_t amax = 0;
                if (active && g < a.groups) {
                    const uint64_t end = min(g * a.len + a.len, a.numel);
                    for (uint64_t i = g * a.len + (uint64_t)t; i < end; i += (uint64_t)team) {
                        const float f = load_elem<DT>(a.x, i);
                        if (prism_qc_nonfinite(f))
                            bad++;
                        else
                            amax = max(amax, abs_bits(f));
                    }
                }
                amax = team_max(amax, team, red);
                const float s = prism_qc_scale(__uint_as_float(amax), FMT, a.pow2);
                if (active && g < a.groups && t == 0)
                    a.scales[g] = s;
                if (gi == 0)
                    s0 = s;
                else
                    s1 = s;
            }
            if (active) {
                /* The unit's elements [begin, end); begin is even for INT4 (a pair of odd groups,
                 * or one even group), so its bytes are its own. */
                const uint64_t begin = g0 * a.len;
                const uint64_t end = min(begin + (uint64_t)groups_per_unit * a.len, a.numel);
                if (FMT != PRISM_QC_INT4) {
                    for (uint64_t i = begin + (uint64_t)t; i < end; i += (uint64_t)team)
                        a.codes[i] = elem_code<FMT>(load_elem<DT>(a.x, i), i - begin < a.len ? s0 : s1,
                                                    a.stochastic, i, a.seed);
                } else {
                    for (uint64_t j = begin / 2 + (uint64_t)t; 2 * j < end; j += (uint64_t)team) {
                        const uint64_t i = 2 * j;
                        uint32_t lo = elem_code<FMT>(load_elem<DT>(a.x, i), i - begin < a.len ? s0 : s1,
                                                     a.stochastic, i, a.seed);
                        uint32_t hi = 0;
                        if (i + 1 < end)
                            hi = elem_code<FMT>(load_elem<DT>(a.x, i + 1),
                                                i + 1 - begin < a.len ? s0 : s1, a.stochastic, i + 1,
                                                a.seed);
                        a.codes[j] = (uint8_t)((lo & 0xfu) | (hi & 0xfu) << 4);
                    }
                }
            }
        }
    }
    add_nonfinite(a.nonfinite, bad);
}

/* ---- pieces -------------------------------------------------------------------------------- */

/* The elements [lo, hi) of piece `item` and the end of its group. */
struct Piece {
    uint64_t group, lo, hi, group_end;
};

__device__ __forceinline__ Piece piece_of(const QuantArgs &a, uint64_t item, uint64_t per_group)
{
    Piece p;
    p.group = item / per_group;
    const uint64_t start = p.group * a.len;
    p.group_end = min(start + a.len, a.numel);
    p.lo = start + (item - p.group * per_group) * kPiece;
    p.hi = min(p.lo + kPiece, p.group_end);
    return p;
}

/* Pass 1: the bits of each piece's amax folded into its group's slot of scales (zeroed before). */
template <int DT>
__global__ void __launch_bounds__(kThreads) amax_pieces_kernel(QuantArgs a, uint64_t per_group, int vec)
{
    __shared__ uint32_t red[kWarps];
    const uint64_t items = a.groups * per_group;
    unsigned long long bad = 0;
    for (uint64_t item = blockIdx.x; item < items; item += gridDim.x) {
        const Piece p = piece_of(a, item, per_group);
        uint32_t amax = 0, b = 0;
        if (vec) { /* lo is a multiple of 8: whole packs, the last one maybe short */
            const uint64_t packs = (p.hi - p.lo + kPack - 1) / kPack;
#pragma unroll
            for (int j = 0; j < kPiecePacks; j++) {
                const uint64_t pk = threadIdx.x + (uint64_t)j * kThreads;
                if (pk < packs) {
                    const Raw<DT> r = load_pack_any<DT>(a.x, p.lo / kPack + pk, a.numel, true);
                    pack_amax<DT>(r, amax, b);
                }
            }
        } else {
            for (uint64_t i = p.lo + threadIdx.x; i < p.hi; i += kThreads) {
                const float f = load_elem<DT>(a.x, i);
                if (prism_qc_nonfinite(f))
                    b++;
                else
                    amax = max(amax, abs_bits(f));
            }
        }
        bad += b;
        amax = cta_max(amax, red);
        if (threadIdx.x == 0 && amax)
            atomicMax(reinterpret_cast<unsigned int *>(a.scales) + p.group, amax);
    }
    add_nonfinite(a.nonfinite, bad);
}

/* Pass 2: each slot's amax becomes the group's scale. */
__global__ void __launch_bounds__(kThreads)
    scales_from_amax_kernel(float *scales, uint64_t groups, int format, int pow2)
{
    for (uint64_t g = (uint64_t)blockIdx.x * kThreads + threadIdx.x; g < groups;
         g += (uint64_t)gridDim.x * kThreads)
        scales[g] = prism_qc_scale(scales[g], format, pow2);
}

/* Pass 3: the codes of each piece. */
template <int DT, int FMT>
__global__ void __launch_bounds__(kThreads) codes_pieces_kernel(QuantArgs a, uint64_t per_group, int vec)
{
    const uint64_t items = a.groups * per_group;
    for (uint64_t item = blockIdx.x; item < items; item += gridDim.x) {
        const Piece p = piece_of(a, item, per_group);
        const float s = a.scales[p.group];
        if (vec) {
            const Divisor d = divisor_of(s);
            const uint64_t packs = (p.hi - p.lo + kPack - 1) / kPack;
#pragma unroll
            for (int j0 = 0; j0 < kPiecePacks; j0 += kPieceBatch) {
                Raw<DT> r[kPieceBatch];
#pragma unroll
                for (int j = 0; j < kPieceBatch; j++) {
                    const uint64_t pk = threadIdx.x + (uint64_t)(j0 + j) * kThreads;
                    if (pk < packs)
                        r[j] = load_pack_any<DT>(a.x, p.lo / kPack + pk, a.numel, true);
                }
#pragma unroll
                for (int j = 0; j < kPieceBatch; j++) {
                    const uint64_t pk = threadIdx.x + (uint64_t)(j0 + j) * kThreads;
                    if (pk < packs) {
                        const uint64_t e0 = p.lo + pk * kPack;
                        float v[kPack];
#pragma unroll
                        for (int k = 0; k < kPack; k++)
                            v[k] = scaled(raw_elem<DT>(r[j], k), d);
                        uint32_t w[2];
                        pack_codes<FMT>(v, a.stochastic, e0, a.seed, w);
                        if (e0 + kPack <= a.numel)
                            store_pack_codes<FMT>(a.codes, e0, w);
                        else
                            store_partial_codes<FMT>(a.codes, e0, (int)(a.numel - e0), w);
                    }
                }
            }
        } else if (FMT != PRISM_QC_INT4) {
            for (uint64_t i = p.lo + threadIdx.x; i < p.hi; i += kThreads)
                a.codes[i] = elem_code<FMT>(load_elem<DT>(a.x, i), s, a.stochastic, i, a.seed);
        } else {
            /* The bytes whose even element is in [lo, hi). Element hi, when a byte needs it, is in
             * this group (a piece boundary inside it) or starts the next one. */
            const float s_next = p.hi < p.group_end ? s : (p.hi < a.numel ? a.scales[p.group + 1] : 1.0f);
            for (uint64_t j = (p.lo + 1) / 2 + threadIdx.x; 2 * j < p.hi; j += kThreads) {
                const uint64_t i = 2 * j;
                uint32_t lo = elem_code<FMT>(load_elem<DT>(a.x, i), s, a.stochastic, i, a.seed);
                uint32_t hi = 0;
                if (i + 1 < a.numel)
                    hi = elem_code<FMT>(load_elem<DT>(a.x, i + 1), i + 1 < p.hi ? s : s_next,
                                        a.stochastic, i + 1, a.seed);
                a.codes[j] = (uint8_t)((lo & 0xfu) | (hi & 0xfu) << 4);
            }
        }
    }
}

/* ---- host ---------------------------------------------------------------------------------- */

uint64_t next_pow2(uint64_t v)
{
    uint64_t p = 1;
    while (p < v)
        p <<= 1;
    return p;
}

template <int DT, int FMT>
prism_status quantize_launch(const prism_quant_spec *spec, QuantArgs a, cudaStream_t stream,
                             prism_error *err)
{
    unsigned resident = 1;
    prism_status st = resident_ctas(&resident, err);
    if (st != PRISM_OK)
        return st;
    const bool vec_ptrs = aligned_to(a.x, 16) && aligned_to(a.codes, (uintptr_t)pack_code_bytes<FMT>());

    if (spec->granularity != PRISM_GRANULARITY_TENSOR) {
        const bool vec = vec_ptrs && a.len % kPack == 0;
        const uint64_t packs = a.len / kPack;
        const uint64_t regs = (uint64_t)team_regs<DT>();
        if ((vec && packs <= kThreads * regs) || (!vec && a.len <= kTeamScalarMax)) {
            /* Vector teams: half the packs a thread can hold (2 of f32, 4 of 16-bit: 64 bytes
             * in flight per thread); scalar teams: about eight elements a thread. */
            const uint64_t per = regs / 2;
            const uint64_t want = vec ? (packs + per - 1) / per : (a.len + kPack - 1) / kPack;
            const uint64_t pow2 = next_pow2(want);
            const int team = pow2 < (uint64_t)kThreads ? (int)pow2 : kThreads;
            const int pair = !vec && FMT == PRISM_QC_INT4 && a.len % 2 == 1;
            const uint64_t units = pair ? (a.groups + 1) / 2 : a.groups;
            const uint64_t per_cta = (uint64_t)(kThreads / team);
            auto kernel = quantize_teams_kernel<DT, FMT>;
            PRISM_LAUNCH(kernel, grid_for((units + per_cta - 1) / per_cta, resident), kThreads, stream,
                         a, team, (int)vec, pair, units);
            PRISM_CUDA_CHECK(cudaGetLastError());
            return PRISM_OK;
        }
    }

    const uint64_t per_group = (a.len + kPiece - 1) / kPiece;
    const uint64_t items = a.groups * per_group;
    const int vec = vec_ptrs && (a.groups == 1 || a.len % kPack == 0);
    PRISM_CUDA_CHECK(cudaMemsetAsync(a.scales, 0, a.groups * sizeof(float), stream));
    auto amax_kernel = amax_pieces_kernel<DT>;
    PRISM_LAUNCH(amax_kernel, grid_for(items, resident), kThreads, stream, a, per_group, vec);
    PRISM_CUDA_CHECK(cudaGetLastError());
    PRISM_LAUNCH(scales_from_amax_kernel, grid_for((a.groups + kThreads - 1) / kThreads, resident),
                 kThreads, stream, a.scales, a.groups, FMT, a.pow2);
    PRISM_CUDA_CHECK(cudaGetLastError());
    auto codes_kernel = codes_pieces_kernel<DT, FMT>;
    PRISM_LAUNCH(codes_kernel, grid_for(items, resident), kThreads, stream, a, per_group, vec);
    PRISM_CUDA_CHECK(cudaGetLastError());
    return PRISM_OK;
}

template <int DT>
prism_status quantize_dtype(const prism_quant_spec *spec, const QuantArgs &a, cudaStream_t stream,
                            prism_error *err)
{
    switch (spec->format) {
    case PRISM_PRECISION_INT8: return quantize_launch<DT, PRISM_QC_INT8>(spec, a, stream, err);
    case PRISM_PRECISION_FP8_E4M3: return quantize_launch<DT, PRISM_QC_E4M3>(spec, a, stream, err);
    case PRISM_PRECISION_FP8_E5M2: return quantize_launch<DT, PRISM_QC_E5M2>(spec, a, stream, err);
    default: return quantize_launch<DT, PRISM_QC_INT4>(spec, a, stream, err);
    }
}

} /* namespace */
} /* namespace prism_cu */

using namespace prism_cu;

extern "C" prism_status prism_quantize_cuda(const prism_quant_spec *spec, const prism_tensor *x,
                                            uint8_t *codes, float *scales,
                                            unsigned long long *nonfinite, prism_cuda_stream stream,
                                            prism_error *err)
{
    prism_status st = prism_check_tensor(x, "input", 0, err);
    if (st != PRISM_OK)
        return st;
    size_t groups, group_len;
    st = prism_quant_layout(spec, x->numel, &groups, &group_len, NULL, err);
    if (st != PRISM_OK)
        return st;
    cudaStream_t s = as_stream(stream);
    if (x->numel && (!codes || !scales))
        return prism_error_set(err, PRISM_ERR_INVALID, "quantize: codes or scales is NULL");
    if (nonfinite)
        PRISM_CUDA_CHECK(cudaMemsetAsync(nonfinite, 0, sizeof *nonfinite, s));
    if (x->numel == 0)
        return PRISM_OK;

    QuantArgs a;
    a.x = x->data;
    a.numel = x->numel;
    a.len = group_len;
    a.groups = groups;
    a.codes = codes;
    a.scales = scales;
    a.nonfinite = nonfinite;
    a.seed = spec->seed;
    a.pow2 = spec->scale_mode == PRISM_SCALE_POW2;
    a.stochastic = spec->rounding == PRISM_ROUNDING_STOCHASTIC;
    switch (x->dtype) {
    case PRISM_DTYPE_F32: return quantize_dtype<PRISM_DTYPE_F32>(spec, a, s, err);
    case PRISM_DTYPE_BF16: return quantize_dtype<PRISM_DTYPE_BF16>(spec, a, s, err);
    default: return quantize_dtype<PRISM_DTYPE_F16>(spec, a, s, err);
    }
}
