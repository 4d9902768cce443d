/* Block transfer (DESIGN 9): blocks kept in (pinned) host memory move to the device in the
 * precision of the current map, BF16 as it is or INT8/FP8/INT4 as codes + scales that are
 * dequantized to BF16 on arrival; and the Conductor, the local limits that say which speculative
 * prefetches may start (in-flight slots, prefetch window, phase rules).
 *
 * One API, two backends chosen when the engine is created:
 *   CUDA  host blocks in cudaHostAlloc'ed memory; a fetch is queued on the engine's two streams
 *         and returns without waiting for the GPU (see prism_transfer_fetch).
 *   CPU   for machines without a GPU: "device memory" is host memory, and a fetch is a memcpy
 *         (BF16) or prism_dequantize_cpu (codes + scales to BF16), done before the call returns.
 * Both give the same bytes: the codes and scales are made on the host by the CPU kernels in
 * either case (the scale mode's, see prism_transfer_scale_mode), and prism_dequantize_cuda is
 * bit-identical to prism_dequantize_cpu.
 *
 * Threads: an engine and its Conductor belong to one thread (the training thread); nothing here
 * takes a lock. */
#ifndef PRISM_TRANSFER_H
#define PRISM_TRANSFER_H

#include "prism/client.h"
#include "prism/common.h"
#include "prism/kernels.h"

#ifdef __cplusplus
extern "C" {
#endif

/* cudaStream_t without the CUDA headers (the same typedef as include/prism/cuda.h's). */
typedef struct CUstream_st *prism_cuda_stream;

/* =============================================================================================
 * The Conductor
 *
 * The limits prismd sends as RuntimeHints (proto/prism/v1/prism.proto), applied locally because
 * phases change far faster than a network round trip. The Conductor is pure bookkeeping: no
 * clock, no I/O, no CUDA. The transfer engine asks it before every speculative prefetch and
 * takes and gives back its in-flight slots.
 *
 * Rules of prism_conductor_may_prefetch, checked in this order (the first that refuses is the
 * answer):
 *   1. OPTIMIZER  phase is OPTIMIZER and suppress_prefetch_in_optimizer is set.
 *   2. PRESSURE   phase is BACKWARD, suppress_prefetch_in_backward is set, vram_total > 0 and
 *                 vram_used / vram_total > vram_pressure_threshold (strictly above: exactly the
 *                 threshold is allowed). Never in FORWARD or OPTIMIZER; vram_total 0 means "not
 *                 known" and the rule does not apply.
 *   3. WINDOW     distance is 0 (the block in use: fetch it, do not prefetch it) or above
 *                 prefetch_window.
 *   4. SLOTS      max_inflight_h2d host-to-device transfers are already in flight.
 *
 * Zero limits: max_inflight_h2d (or _d2h) 0 means no speculative transfer in that direction
 * starts, and demand transfers go one at a time; prefetch_window 0 means no prefetch;
 * vram_pressure_threshold 0 means any memory in use is pressure (in backward). So for every
 * number a smaller value is tighter, and for the two flags true is tighter.
 *
 * Never looser within a step: limits handed in with prism_conductor_set_limits take effect at
 * once field by field where they are tighter than those in force, and in full at the next
 * prism_conductor_begin_step (the last limits handed in win). A loosening mid-step waits; a
 * tightening does not.
 * =========================================================================================== */

typedef struct prism_conductor prism_conductor;

/* RuntimeHints without map_version. Ranges (prismd's own): the three counts 0 to 64, the
 * threshold a fraction from 0 to 1. */
typedef struct prism_conductor_limits {
    uint32_t max_inflight_h2d;          /* host-to-device transfers in flight at once */
    uint32_t max_inflight_d2h;          /* device-to-host transfers in flight at once */
    uint32_t prefetch_window;           /* blocks fetched ahead of the one in use */
    double vram_pressure_threshold;     /* used/total device memory above which (in backward) ... */
    bool suppress_prefetch_in_backward; /* ... speculative prefetch stops */
    bool suppress_prefetch_in_optimizer; /* no speculative prefetch during the optimizer phase */
} prism_conductor_limits;

#define PRISM_CONDUCTOR_MAX_COUNT 64

typedef enum prism_conductor_phase {
    PRISM_CONDUCTOR_FORWARD = 0,
    PRISM_CONDUCTOR_BACKWARD = 1,
    PRISM_CONDUCTOR_OPTIMIZER = 2
} prism_conductor_phase;

typedef enum prism_conductor_dir {
    PRISM_CONDUCTOR_H2D = 0,
    PRISM_CONDUCTOR_D2H = 1
} prism_conductor_dir;

/* The answer to "may this prefetch start?": ALLOW, or the rule that refused it. */
typedef enum prism_conductor_verdict {
    PRISM_CONDUCTOR_ALLOW = 0,
    PRISM_CONDUCTOR_REFUSE_OPTIMIZER = 1,
    PRISM_CONDUCTOR_REFUSE_PRESSURE = 2,
    PRISM_CONDUCTOR_REFUSE_WINDOW = 3,
    PRISM_CONDUCTOR_REFUSE_SLOTS = 4
} prism_conductor_verdict;

#define PRISM_CONDUCTOR_VERDICT_COUNT 5

/* What a speculative prefetch is: when, how far ahead, and how full the device is. */
typedef struct prism_conductor_request {
    prism_conductor_phase phase;
    uint32_t distance;   /* blocks ahead of the one in use: the next block is 1 */
    uint64_t vram_used;  /* device memory in use, bytes */
    uint64_t vram_total; /* device memory in all, bytes; 0: not known */
} prism_conductor_request;

/* prismd's defaults: 2 slots each way, a window of 2, threshold 0.8, both suppressions on. */
prism_conductor_limits prism_conductor_default_limits(void);

/* The limits prismd sent (RuntimeHints, as prism_client_get_state gives them from the hint
 * table), field for field, so a trainer hands them to prism_conductor_set_limits at each step:
 *   prism_client_state s; prism_client_get_state(client, &s, &err);
 *   prism_conductor_limits l = prism_conductor_limits_from_hints(&s.hints);
 *   prism_conductor_set_limits(conductor, &l, &err); prism_conductor_begin_step(conductor, step, &err);
 * Hints that were never received (every field 0, map_version 0) give the defaults above, not
 * "no transfers at all". */
prism_conductor_limits prism_conductor_limits_from_hints(const prism_client_runtime_hints *hints);

/* Checks every field's range; PRISM_ERR_INVALID names the first field out of range. */
prism_status prism_conductor_check_limits(const prism_conductor_limits *limits, prism_error *err);

/* A Conductor with these limits in force (NULL: the defaults), no step begun, no slot taken. */
prism_status prism_conductor_create(const prism_conductor_limits *limits, prism_conductor **out,
                                    prism_error *err);
void prism_conductor_destroy(prism_conductor *c);

/* Hands in new limits (checked first; bad limits change nothing). Tighter fields apply at once,
 * all of them at the next begin_step. */
prism_status prism_conductor_set_limits(prism_conductor *c, const prism_conductor_limits *limits,
                                        prism_error *err);

/* Starts step `step`: the limits last handed in take effect in full. Steps must increase:
 * a step not above the last one begun is PRISM_ERR_STATE. */
prism_status prism_conductor_begin_step(prism_conductor *c, uint64_t step, prism_error *err);

/* The limits in force now, and those that will be at the next begin_step (either may be NULL). */
void prism_conductor_get_limits(const prism_conductor *c, prism_conductor_limits *now,
                                prism_conductor_limits *next);

/* The rules above, for a prefetch in direction H2D. Changes nothing. */
prism_conductor_verdict prism_conductor_may_prefetch(const prism_conductor *c,
                                                     const prism_conductor_request *req);

/* Takes an in-flight slot when fewer than the direction's limit are in flight: true; otherwise
 * takes nothing: false. */
bool prism_conductor_try_acquire(prism_conductor *c, prism_conductor_dir dir);

/* Takes a slot whatever the count: for a demand transfer, which always goes (the transfer
 * engine first waits for its own oldest copy; see prism_transfer_fetch). */
void prism_conductor_acquire_anyway(prism_conductor *c, prism_conductor_dir dir);

/* Gives a slot back; PRISM_ERR_STATE when none is held. */
prism_status prism_conductor_release(prism_conductor *c, prism_conductor_dir dir, prism_error *err);

uint32_t prism_conductor_inflight(const prism_conductor *c, prism_conductor_dir dir);

/* "allow", "optimizer", "pressure", "window", "slots"; "forward", "backward", "optimizer";
 * "?" out of range. */
const char *prism_conductor_verdict_name(prism_conductor_verdict v);
const char *prism_conductor_phase_name(prism_conductor_phase p);

/* =============================================================================================
 * The transfer engine
 *
 * Host blocks: prism_transfer_add_block copies a block's BF16 weights into host memory the
 * engine owns (pinned on CUDA). The codes + scales of a low precision are made from it by the
 * CPU kernels, under the engine's scale mode, the first time that precision is asked for (or by
 * prism_transfer_prepare) and kept until prism_transfer_update_block says the weights changed. A block's quantized
 * image, the bytes that cross the bus, is its codes, zero-padded to a multiple of 16 bytes, then
 * its FP32 scales; its BF16 image is the numel * 2 bytes of the block.
 *
 * Fetch on CUDA, without any host synchronisation:
 *   BF16     one cudaMemcpyAsync of the block into dst on the copy stream.
 *   others   the image is copied into a device staging buffer on the copy stream, then
 *            prism_dequantize_cuda turns it into BF16 in dst on the compute stream, which waits
 *            for that copy with an event. Staging buffers are used in turn; the copy into buffer
 *            k waits (an event on the copy stream, never the host) for the dequantize that last
 *            read it, so with 2 buffers the copy of fetch i+1 overlaps the dequantize of fetch i.
 * Fetches into the same dst land in the order they were made, whatever their precisions.
 * dst_stream (may be NULL) is the stream that uses dst: the engine's writes into dst wait for
 * the work queued on it before the call, so a dst still being read is not overwritten. NULL: dst
 * is free now. The ticket says when dst holds the block: prism_transfer_ticket_wait_stream makes
 * a consumer stream wait for it (cudaStreamWaitEvent), _query and _wait are for the host.
 *
 * Slots: each transfer holds one H2D slot of the Conductor (when the engine has one) from the
 * call until its copy has finished (seen by the engine at its next call; the dequantize that
 * follows holds none). A refused prefetch starts nothing. A demand fetch always goes: when
 * every slot is taken it waits on the host for the engine's own oldest copy to finish (the
 * GPU's own pacing, a few milliseconds at most), and if the slots are held by someone else it
 * takes one anyway (counted in demand_over_limit) rather than wait for a release that the
 * training thread itself would have to make.
 *
 * The CPU backend does the whole transfer before the call returns, so its tickets are complete
 * at once, it never waits for a slot (its own copies are never in flight) and dst_stream is
 * ignored (pass NULL).
 * =========================================================================================== */

typedef struct prism_transfer prism_transfer;

typedef enum prism_transfer_backend {
    PRISM_TRANSFER_CPU = 0,
    PRISM_TRANSFER_CUDA = 1
} prism_transfer_backend;

#define PRISM_TRANSFER_MAX_STAGING 8
#define PRISM_TRANSFER_MAX_BLOCKS (1u << 20) /* block ids 0 .. 2^20 - 1 (the hint table's limit) */

/* How the scales of a block's low-precision image are chosen (DESIGN 4.7, the config key
 * scale_mode; the same values as prism.v1.ScaleMode and prism_client_state.scale_mode):
 *   CURRENT  from the block's current amax per group, as quant->scale_mode says (FP32 by
 *            default): prism_quantize_counted_cpu.
 *   POW2     the same with the scale rounded up to a power of two (Scalify).
 *   DELAYED  per block (one for all its formats), a history of the per-group amax of its last
 *            amax_history_len weight versions that were prepared (a version: the weights of
 *            add_block or of one update_block; one never fetched does not enter). The scale of
 *            group g for the current version is prism_quant_scale_delayed(max of g's amax over
 *            the history before it, scale_margin, format), the same max in every format; one
 *            pass of prism_quantize_scaled_cpu makes the codes and, at the version's first
 *            prepare, its amax, which then enters the history (the oldest leaves when it is
 *            full). The first version (empty history) takes its own amax, from a pass that only
 *            reads: with margin 0 the CURRENT (FP32) scales.
 *   STATIC   the CURRENT (FP32) scales of the weights as registered: prism_transfer_add_block
 *            keeps each group's amax, and every prepare, in every format, is
 *            prism_quantize_scaled_cpu with prism_quant_scale_delayed(that amax, 0, format), so
 *            weights that grow saturate. update_block and set_scale_mode do not change them.
 * Every prepare keeps its prism_quant_counts (prism_transfer_block_counts), and the counters
 * sum them per precision. */
typedef enum prism_transfer_scale_mode {
    PRISM_TRANSFER_SCALE_CURRENT = 0,
    PRISM_TRANSFER_SCALE_POW2 = 1,
    PRISM_TRANSFER_SCALE_DELAYED = 2,
    PRISM_TRANSFER_SCALE_STATIC = 3
} prism_transfer_scale_mode;

#define PRISM_TRANSFER_SCALE_MODE_COUNT 4
#define PRISM_TRANSFER_AMAX_HISTORY_DEFAULT 16
#define PRISM_TRANSFER_AMAX_HISTORY_MAX 1024 /* the config key's range: 1 to 1024 */
#define PRISM_TRANSFER_SCALE_MARGIN_MAX 32   /* the config key's range: -32 to 32 */

typedef struct prism_transfer_options {
    prism_transfer_backend backend;
    int device;                    /* CUDA: the device index; CPU: ignored */
    unsigned staging_buffers;      /* CUDA staging buffers, 1 to 8; 0: 2 (double buffering) */
    size_t max_block_bytes;        /* BF16 bytes of the largest block (required) */
    const prism_quant_spec *quant; /* how low precisions are made (format ignored); NULL: per
                                      block of 128, FP32 scales, nearest rounding */
    prism_conductor *conductor;    /* borrowed, outlives the engine; NULL: no limits, every
                                      prefetch in a window of any size starts */
    prism_transfer_scale_mode scale_mode; /* 0: CURRENT (zero-initialised options are today's) */
    uint32_t amax_history_len;     /* DELAYED: prepares of history, 1 to 1024; 0: 16 */
    int32_t scale_margin;          /* DELAYED: the scale times 2^scale_margin, -32 to 32 */
} prism_transfer_options;

/* Handed back by a fetch; small, copied by value. */
typedef struct prism_transfer_ticket {
    uint64_t seq;                    /* 0: nothing was started (a refused prefetch), complete */
    prism_conductor_verdict verdict; /* ALLOW, or the rule that refused the prefetch */
} prism_transfer_ticket;

typedef struct prism_transfer_counters {
    uint64_t fetches[PRISM_PRECISION_COUNT];    /* transfers started (demand and prefetch) */
    uint64_t wire_bytes[PRISM_PRECISION_COUNT]; /* image bytes copied (host to device) */
    uint64_t bf16_bytes[PRISM_PRECISION_COUNT]; /* the same blocks' BF16 bytes */
    uint64_t prefetches;                        /* prefetches started (also in fetches) */
    uint64_t refused[PRISM_CONDUCTOR_VERDICT_COUNT]; /* prefetches refused, by rule ([0] is 0) */
    uint64_t demand_waits;      /* host waits of demand fetches for the engine's oldest copy */
    uint64_t demand_over_limit; /* demand fetches that took a slot above the limit */
    uint64_t prepares;          /* quantized images made (first ask, or after an update) */
    uint64_t nonfinite;         /* NaN/Inf elements met while preparing (sent as code 0) */
    /* What the prepares quantized, per precision ([BF16] is 0): elements, and of those the
     * saturated and underflowed ones (prism_quant_counts, summed over the prepares). */
    uint64_t quantized[PRISM_PRECISION_COUNT];
    uint64_t saturated[PRISM_PRECISION_COUNT];
    uint64_t underflowed[PRISM_PRECISION_COUNT];
} prism_transfer_counters;

/* An engine. PRISM_ERR_INVALID names the option at fault; a CUDA backend in a build without
 * CUDA, or without a usable device, is PRISM_ERR_UNAVAILABLE. */
prism_status prism_transfer_create(const prism_transfer_options *options, prism_transfer **out,
                                   prism_error *err);

/* Waits for everything in flight, gives the Conductor its slots back and frees the engine. */
void prism_transfer_destroy(prism_transfer *t);

/* "cpu" or "cuda". */
const char *prism_transfer_backend_name(const prism_transfer *t);

/* Registers block block_id (below PRISM_TRANSFER_MAX_BLOCKS) with a copy of its numel BF16
 * weights. A block above max_block_bytes is PRISM_ERR_LIMIT; an id already registered
 * PRISM_ERR_STATE; a quantization spec that does not fit numel (ROW) PRISM_ERR_INVALID. */
prism_status prism_transfer_add_block(prism_transfer *t, uint32_t block_id, const uint16_t *bf16,
                                      size_t numel, prism_error *err);

/* New weights for a registered block (the same numel): the quantized images are made again when
 * next needed. On CUDA, first waits (host) for copies still reading the old weights. */
prism_status prism_transfer_update_block(prism_transfer *t, uint32_t block_id,
                                         const uint16_t *bf16, size_t numel, prism_error *err);

/* Makes the block's image for precision now (nothing for BF16, or when it is already made), so
 * that a later fetch does no host work but queueing the copy. */
prism_status prism_transfer_prepare(prism_transfer *t, uint32_t block_id, prism_precision precision,
                                    prism_error *err);

/* The bytes that cross the bus when the block moves in precision (its image). */
prism_status prism_transfer_wire_bytes(const prism_transfer *t, uint32_t block_id,
                                       prism_precision precision, size_t *bytes, prism_error *err);

/* Demand fetch: block block_id in precision into dst (numel BF16 elements, device memory on
 * CUDA, host memory on the CPU). Always starts (see Slots above). Unknown block:
 * PRISM_ERR_NOT_FOUND; bad precision or NULL dst: PRISM_ERR_INVALID. */
prism_status prism_transfer_fetch(prism_transfer *t, uint32_t block_id, prism_precision precision,
                                  void *dst, prism_cuda_stream dst_stream,
                                  prism_transfer_ticket *ticket, prism_error *err);

/* Speculative prefetch: as prism_transfer_fetch when the Conductor allows `why`; otherwise
 * nothing starts, the refusal is counted, and the ticket has seq 0 and the verdict. A refusal is
 * not an error (PRISM_OK). why->distance 0 is refused (WINDOW) like any distance out of the
 * window. */
prism_status prism_transfer_prefetch(prism_transfer *t, uint32_t block_id, prism_precision precision,
                                     void *dst, prism_cuda_stream dst_stream,
                                     const prism_conductor_request *why,
                                     prism_transfer_ticket *ticket, prism_error *err);

/* Whether the ticket's block is in dst (never waits). A ticket this engine did not issue is
 * PRISM_ERR_INVALID. */
prism_status prism_transfer_ticket_query(prism_transfer *t, const prism_transfer_ticket *ticket,
                                         bool *done, prism_error *err);

/* Waits on the host until the ticket's block is in dst. */
prism_status prism_transfer_ticket_wait(prism_transfer *t, const prism_transfer_ticket *ticket,
                                        prism_error *err);

/* Makes `stream` wait (on the device) for the ticket's block to be in dst; the host does not
 * wait. CPU backend: nothing to do. */
prism_status prism_transfer_ticket_wait_stream(prism_transfer *t, const prism_transfer_ticket *ticket,
                                               prism_cuda_stream stream, prism_error *err);

/* Waits on the host for every transfer in flight, and gives their slots back. */
prism_status prism_transfer_synchronize(prism_transfer *t, prism_error *err);

void prism_transfer_get_counters(const prism_transfer *t, prism_transfer_counters *out);

/* A new scale mode mid-run (the job's config changed): checked as the options are (bad values
 * change nothing, PRISM_ERR_INVALID names the field; amax_history_len 0 is 16). Every image is
 * made again at its next use, every amax history is forgotten (it starts afresh under the new
 * mode; STATIC scales stay those of the weights as registered), and the blocks' last counts are
 * cleared. On CUDA, first waits
 * (host) for copies still reading the images. Setting the mode in force changes nothing. */
prism_status prism_transfer_set_scale_mode(prism_transfer *t, prism_transfer_scale_mode mode,
                                           uint32_t amax_history_len, int32_t scale_margin,
                                           prism_error *err);

/* The counts of the last prepare of the block's image in precision (not BF16), and in *numel the
 * elements it quantized (the block's numel); both 0 when the image has not been made since the
 * block was registered or the scale mode set. A prepare is made at the first ask after
 * add_block / update_block / set_scale_mode, so a trainer that updates each block once a step
 * reads that step's figures here. Either output may be NULL. */
prism_status prism_transfer_block_counts(const prism_transfer *t, uint32_t block_id,
                                         prism_precision precision, prism_quant_counts *counts,
                                         size_t *numel, prism_error *err);

/* "current", "pow2", "delayed", "static"; "?" out of range. */
const char *prism_transfer_scale_mode_name(prism_transfer_scale_mode mode);

#ifdef __cplusplus
}
#endif

#endif
