/* libprism's client: the trainer's side of the conversation with its prism-agent (DESIGN 1, 2,
 * 4.5). It is the one part of Prism that lives inside the training process, so its contract is
 * about what it never does:
 *
 *   - It never blocks the training step. Reports go out on a non-blocking Unix stream socket;
 *     when the agent is not there, or not reading, the report is dropped and counted. It never
 *     sleeps, waits for the agent or retries in a loop: a lost agent is reconnected at a later
 *     call, at most once per reconnect interval.
 *   - It never ends the process: no exit, no abort, no SIGPIPE (MSG_NOSIGNAL). Every failure is
 *     returned as a prism_status with a message naming the argument or field at fault, and
 *     counted (prism_client_counters).
 *   - Reading a block's precision makes no system call: prism_client_begin_step copies the map in
 *     effect from the shared-memory hint table (a seqlock read with bounded tries) into memory the
 *     client owns once per step, and the getters read that copy.
 *
 * Lifecycle:
 *   prism_client_open          paths, identity; succeeds without an agent (it may start later)
 *   prism_client_register      the model layout; computes its fingerprint; Hello is sent first
 *                              on every connection, the first one made here
 *   per step:
 *     prism_client_begin_step  the map for this step (switches exactly at effective_step)
 *     prism_client_block_precision / _map_version / _state     (no system call)
 *     prism_client_report_step (or _cpu: statistics by the CPU kernels first)
 *   when the state says calibration_needed (and run_calibration):
 *     prism_client_report_calibration
 *   prism_client_close
 *
 * The wire (client/local.h): frames of a 4-byte little-endian length and a serialized
 * prism.v1.AgentMessage, trainer to agent only. At most one frame is in flight: a frame the socket
 * took only part of is finished before anything else is written; a report that finds one still
 * unfinished is dropped. After a reconnection the unfinished frame is discarded (counted as
 * dropped) and Hello goes first again.
 *
 * Fingerprint (DESIGN 4.5): SHA-256 over this byte string, all integers little-endian, strings
 * as their UTF-8 bytes without a terminator:
 *   "prism.fingerprint.v1"          20 bytes, no length
 *   u64 len(model_id), model_id
 *   u32 quant.format                prism_precision value (1..4), or 255 (PRISM_QUANT_FORMAT_AUTO)
 *                                   for a trainer that registers low_precision "auto": such a
 *                                   layout has a fingerprint of its own, under which prismd caches
 *                                   the errors of every format of the job's low_formats
 *   u32 quant.granularity           prism_granularity value (0..2)
 *   u64 block size                  BLOCK: quant.block_size, 0 meaning PRISM_QUANT_BLOCK_DEFAULT
 *                                   (128); TENSOR and ROW: 0 (the field is ignored)
 *   u32 n_blocks
 *   for each block in id order:
 *     u64 len(name), name
 *     u64 shape_len, shape_len x u64 (the shape words: per tensor its rank, then its dims)
 * param_bytes_bf16 is not part of it (it is a size hint, not identity). Every variable-length
 * field has its length in front, so two different layouts never give the same bytes.
 *
 * Threads: a client belongs to one thread, the training loop's. No function may run at the same
 * time as another on the same client (the getters included, since begin_step rewrites the copy
 * they read); different clients are independent. */
#ifndef PRISM_CLIENT_H
#define PRISM_CLIENT_H

#include "prism/common.h"
#include "prism/kernels.h"

#ifdef __cplusplus
extern "C" {
#endif

#define PRISM_FINGERPRINT_BYTES 32
#define PRISM_CLIENT_RECONNECT_MS_DEFAULT 1000u
/* Blocks in one layout (the hint table's limit, PRISM_HINTS_MAX_BLOCKS_LIMIT). */
#define PRISM_CLIENT_MAX_BLOCKS (1u << 20)

typedef struct prism_client prism_client;

/* Zero-initialised, every field has its default. */
typedef struct prism_client_options {
    const char *dir;              /* directory shared with the agent; NULL: $PRISM_AGENT_DIR, else "." */
    const char *socket_name;      /* NULL: "prism-agent.sock" (PRISM_LOCAL_SOCKET_NAME) */
    const char *hints_name;       /* NULL: "prism-hints" (PRISM_LOCAL_HINTS_NAME) */
    const char *job_id;           /* NULL: $PRISM_JOB_ID; required one way or the other */
    uint32_t rank;                /* in [0, world_size) */
    uint32_t world_size;          /* 0: 1 */
    uint32_t reconnect_interval_ms; /* least time between two connection (or hint table) attempts; 0: 1000 */
} prism_client_options;

/* Creates a client. Fails only on bad options (PRISM_ERR_INVALID naming the option: an empty
 * job_id, rank >= world_size, a socket path longer than a Unix socket address holds) or memory;
 * an agent that is not there yet, or a hint table not created yet, is not a failure. The
 * connection is made at prism_client_register (Hello needs the layout). */
prism_status prism_client_open(const prism_client_options *options, prism_client **out, prism_error *err);

/* Closes the socket, unmaps the hint table and frees everything. NULL is fine. */
void prism_client_close(prism_client *c);

/* quant.format of a trainer that runs under low_precision "auto" (issue 17): a format per block
 * chosen by prismd from the job's low_formats. Not a prism_precision: only the fingerprint and
 * the layout check know it. */
#define PRISM_QUANT_FORMAT_AUTO ((prism_precision)255)

/* Quantization settings that calibration results depend on (part of the fingerprint). */
typedef struct prism_quant_config {
    prism_precision format;        /* the low precision: INT8, FP8_E4M3, FP8_E5M2 or INT4, or
                                    * PRISM_QUANT_FORMAT_AUTO */
    prism_granularity granularity; /* TENSOR, ROW or BLOCK */
    uint32_t block_size;           /* BLOCK: K (0: PRISM_QUANT_BLOCK_DEFAULT); otherwise ignored */
} prism_quant_config;

/* One block; its id is its index in prism_model_layout.blocks. */
typedef struct prism_block_layout {
    const char *name;          /* the module name, non-empty UTF-8, e.g. "model.layers.3" */
    uint64_t param_bytes_bf16; /* its parameters' size in BF16 bytes (0: unknown) */
    const uint64_t *shape;     /* per parameter tensor: its rank, then its dims (BlockInfo.shape):
                                * [4096, 4096] and [4096] are 2, 4096, 4096, 1, 4096 */
    size_t shape_len;          /* words in shape (0: no tensors; shape may then be NULL) */
    /* The hybrid planner's cost figures (BlockInfo, DESIGN 11); 0: unknown. Not part of the
     * fingerprint. */
    uint64_t flops;                 /* forward FLOPs of the block per step on this rank */
    uint64_t activation_bytes_bf16; /* its activations kept for backward, in BF16 bytes */
    uint64_t state_bytes;           /* bytes no precision changes: parameters, gradients, optimizer state */
} prism_block_layout;

typedef struct prism_model_layout {
    const char *model_id;              /* the model's identity, non-empty UTF-8 (name and revision) */
    prism_quant_config quant;
    const prism_block_layout *blocks;  /* n_blocks of them, ids 0 .. n_blocks-1 */
    uint32_t n_blocks;                 /* 1 .. PRISM_CLIENT_MAX_BLOCKS */
} prism_model_layout;

/* The fingerprint of a layout (the encoding above), without a client: for the Python side and
 * for tests. PRISM_ERR_INVALID names the field at fault (e.g. "blocks[3].shape"). */
prism_status prism_model_fingerprint(const prism_model_layout *layout, uint8_t out[PRISM_FINGERPRINT_BYTES],
                                     prism_error *err);

/* Registers the model (once per client: a second call is PRISM_ERR_STATE). The layout is
 * checked and copied (the caller's arrays may be freed afterwards), its fingerprint computed and
 * its Hello encoded; then the client connects and sends Hello. PRISM_OK means the layout is
 * registered, whether or not the agent is there yet (prism_client_state says); a Hello larger
 * than a frame may be is PRISM_ERR_LIMIT. */
prism_status prism_client_register(prism_client *c, const prism_model_layout *layout, prism_error *err);

/* The registered layout's fingerprint; PRISM_ERR_STATE before prism_client_register. */
prism_status prism_client_fingerprint(const prism_client *c, uint8_t out[PRISM_FINGERPRINT_BYTES],
                                      prism_error *err);

/* Sends one StepReport: stats[i] belongs to block block_ids[i] (ids of the registered layout,
 * each at most once; n may be 0), loss is optional (NULL: absent). The common path of every
 * report_step variant: they compute the statistics where the gradients are, then call this.
 * PRISM_OK: written to the socket, wholly or (rarely) in part, the rest going out before the next
 * frame. PRISM_ERR_UNAVAILABLE: dropped and counted, because no agent is connected or the agent
 * has not read the previous frame. PRISM_ERR_INVALID / PRISM_ERR_STATE: refused (bad
 * arguments, no layout registered), also counted. */
prism_status prism_client_report_step(prism_client *c, uint64_t step, const double *loss, const uint32_t *block_ids,
                                      const prism_grad_stats *stats, size_t n, prism_error *err);

/* prism_client_report_step with the statistics computed by prism_grad_stats_blocks_cpu (host
 * memory): block b is tensors[block_start[b]] up to tensors[block_start[b + 1]] and has id
 * block_ids[b] (block_ids NULL: id b). When the report would be dropped anyway the statistics are
 * not computed. */
prism_status prism_client_report_step_cpu(prism_client *c, uint64_t step, const double *loss,
                                          const prism_tensor *tensors, const size_t *block_start,
                                          const uint32_t *block_ids, size_t blocks, prism_error *err);

/* A block's quantization figures of a step (issue 17): the fractions of its elements that
 * saturated (the clamp to the format's largest value changed the code: prism_quant_counts in
 * kernels.h) and that underflowed (x != 0 quantized to 0). Both finite and in [0, 1], or both
 * NaN: not measured for this block (the report then carries neither). */
typedef struct prism_block_fractions {
    double saturated;
    double underflowed;
} prism_block_fractions;

/* prism_client_report_step with each block's fractions of the step: fractions NULL (none, as
 * prism_client_report_step) or n entries, fractions[i] for block_ids[i]. A fraction outside
 * [0, 1], or one NaN without the other, is PRISM_ERR_INVALID naming the entry and its block. */
prism_status prism_client_report_step_ex(prism_client *c, uint64_t step, const double *loss,
                                         const uint32_t *block_ids, const prism_grad_stats *stats,
                                         const prism_block_fractions *fractions, size_t n, prism_error *err);

/* prism_client_report_step_cpu with each block's fractions (NULL or `blocks` entries, fractions[b]
 * for block b of the call), checked as prism_client_report_step_ex checks them. */
prism_status prism_client_report_step_cpu_ex(prism_client *c, uint64_t step, const double *loss,
                                             const prism_tensor *tensors, const size_t *block_start,
                                             const uint32_t *block_ids, const prism_block_fractions *fractions,
                                             size_t blocks, prism_error *err);

/* Sends a CalibrationReport for the registered fingerprint: errors[i] is the relative error of
 * block block_ids[i] (each at most once, finite or +Inf, >= 0) measured in format (not bf16)
 * over samples (> 0) forward passes. Same statuses as prism_client_report_step. */
prism_status prism_client_report_calibration(prism_client *c, prism_precision format, uint32_t samples,
                                             const uint32_t *block_ids, const double *errors, size_t n,
                                             prism_error *err);

/* One block's weight and input-activation statistics (BlockTensorStats, DESIGN 11), for the
 * hybrid planner. Either half may be missing: x_numel 0 means no activation figures, w_numel 0 no
 * weight figures. */
typedef struct prism_block_tensor_stats {
    uint32_t block_id;  /* a registered block id */
    uint32_t reserved;  /* 0 */
    double x_l2;        /* ||X||_2 of the block's input activations */
    double x_max_abs;   /* max |X| */
    uint64_t x_numel;   /* elements of X; 0: no activation figures */
    double w_l2;        /* ||W||_2 of the block's weights */
    double w_max_abs;   /* max |W| */
    uint64_t w_numel;   /* elements of W; 0: no weight figures */
    uint64_t y_numel;   /* elements of the block's output; 0: unknown */
} prism_block_tensor_stats;

/* Stages tensor statistics to go out with the next StepReport this client writes whole (any
 * report_step variant), replacing what was staged before; a report that is dropped leaves them
 * staged. Copied: the caller's array may be freed. n 0 clears. PRISM_ERR_INVALID names the entry
 * at fault (an id not registered or given twice, a negative or non-finite figure, reserved not
 * 0); PRISM_ERR_STATE before prism_client_register. No system call. */
prism_status prism_client_stage_tensor_stats(prism_client *c, const prism_block_tensor_stats *stats, size_t n,
                                             prism_error *err);

/* Reads the hint table once and makes the map in effect at `step` the client's: the highest map
 * version whose effective_step <= step. Writes the version back to the table for the agent's Ack
 * when it changed, with the counters the agent exports (client/README.md: reports by outcome,
 * late switches, the map apply lag, this process's block transfers and collectives), all
 * without a system call. Returns the map version in use (0: no map yet, every block bf16). Without a
 * hint table (not created yet; retried at most once per reconnect interval) or without a
 * consistent read (the agent mid-write, counted) the previous copy stays. NULL: 0. */
uint64_t prism_client_begin_step(prism_client *c, uint64_t step);

/* From the copy made by the last begin_step, no system call: the precision of a block (bf16 for
 * ids outside the registered layout, before any map, and for a NULL client), and the map version
 * (0 for NULL). */
prism_precision prism_client_block_precision(const prism_client *c, uint32_t block);
uint64_t prism_client_map_version(const prism_client *c);

/* The compute plan (ComputePlan, DESIGN 11) that came with the map in use, from the copy made by
 * the last begin_step, no system call: the format block `block`'s matrix multiplies run in.
 * PRISM_PRECISION_BF16 means high (the class's high format, bf16 or fp16, plan.high_fp16 says);
 * otherwise the plan's low format (INT8 or FP8_E4M3). BF16 without a plan, for ids outside the
 * registered layout and for a NULL client. */
prism_precision prism_client_compute_precision(const prism_client *c, uint32_t block);

#define PRISM_CLIENT_DEVICE_CLASS_MAX 128

/* The compute plan in use, as of the last begin_step. */
typedef struct prism_client_plan {
    bool has_plan;                 /* false: the map in use came without a plan (every block high) */
    bool high_fp16;                /* the class's high format is fp16 (else bf16) */
    prism_precision low_format;    /* INT8 or FP8_E4M3; BF16 without a plan */
    uint64_t map_version;          /* the map it came with (the map in use) */
    uint32_t low_blocks;           /* blocks planned low */
    double predicted_iteration_seconds; /* the job's predicted iteration time T */
    double compute_seconds;        /* this class's f_k(0) */
    char device_class[PRISM_CLIENT_DEVICE_CLASS_MAX]; /* NUL-terminated, truncated to fit */
} prism_client_plan;

/* Fills *out; PRISM_ERR_INVALID for a NULL argument. */
prism_status prism_client_get_plan(const prism_client *c, prism_client_plan *out, prism_error *err);

/* RuntimeHints (proto) as of the last begin_step: transfer limits for the block pipeline. */
typedef struct prism_client_runtime_hints {
    uint64_t map_version;           /* the map they go with */
    uint32_t max_inflight_h2d;
    uint32_t max_inflight_d2h;
    uint32_t prefetch_window;
    bool suppress_prefetch_in_backward;
    bool suppress_prefetch_in_optimizer;
    double vram_pressure_threshold; /* in [0, 1] */
} prism_client_runtime_hints;

#define PRISM_CLIENT_FORMATS_MAX 4

/* What the client knows, as of the last begin_step (connected: as of the last call). */
typedef struct prism_client_state {
    uint64_t map_version;          /* in use; 0: none, every block bf16 */
    uint64_t decided_step;         /* of that map */
    uint64_t effective_step;       /* of that map */
    uint32_t map_blocks;           /* blocks the map names (others are bf16) */
    bool registered;               /* prism_client_register succeeded */
    bool connected;                /* the socket to the agent is open */
    bool hints_mapped;             /* the hint table is mapped */
    bool upstream_connected;       /* the agent has a live stream to prismd */
    bool calibration_needed;       /* prismd has no calibration for this fingerprint */
    bool run_calibration;          /* the job's config allows running it */
    uint32_t calibration_samples;  /* forward passes to average */
    prism_precision low_precision; /* the job's low format (under "auto": the last of low_formats) */
    prism_client_runtime_hints hints;
    /* The job's numerics config (issue 17), from the agent's Welcome and later config updates.
     * From an agent that predates them: scale_mode 0, amax_history_len 16, scale_margin 0,
     * low_auto false, low_formats [low_precision], calibration_formats [low_precision] when
     * calibration_needed. */
    uint32_t scale_mode;           /* prism.v1.ScaleMode: 0 current, 1 pow2, 2 delayed, 3 static */
    uint32_t amax_history_len;     /* steps of amax history (delayed) */
    int32_t scale_margin;          /* the delayed scale times 2^scale_margin */
    bool low_auto;                 /* low_precision "auto": a format per block from low_formats */
    uint32_t n_low_formats;
    prism_precision low_formats[PRISM_CLIENT_FORMATS_MAX];         /* most saving first */
    uint32_t n_calibration_formats;                                /* 0 unless calibration_needed */
    prism_precision calibration_formats[PRISM_CLIENT_FORMATS_MAX]; /* the formats prismd wants calibrated */
} prism_client_state;

/* Fills *out; PRISM_ERR_INVALID for a NULL argument. */
prism_status prism_client_get_state(const prism_client *c, prism_client_state *out, prism_error *err);

/* Every count since open. */
typedef struct prism_client_counters {
    uint64_t reports_sent;          /* StepReports written whole */
    uint64_t reports_dropped;       /* StepReports not sent: no agent, agent not reading, lost
                                       half-written with a connection, the GPU statistics still
                                       pending or failed, too big for a frame, no memory */
    uint64_t calibrations_sent;
    uint64_t calibrations_dropped;
    uint64_t hellos_sent;           /* Hellos written whole (one per connection) */
    uint64_t bytes_sent;            /* bytes the socket accepted */
    uint64_t send_errors;           /* send(2) failures other than a full socket (each ends the connection) */
    uint64_t connects;              /* connections made, the first included */
    uint64_t reconnects;            /* connections made after the first */
    uint64_t connect_failures;      /* connection attempts that failed (no agent yet, agent gone) */
    uint64_t disconnects;           /* connections lost */
    uint64_t hint_reads;            /* consistent hint table reads */
    uint64_t hint_read_failures;    /* begin_step calls that got no consistent read in their tries: of the hint
                                     * table, or of the plan file caught mid-write when the map or plan in use
                                     * was to change (map and plan then wait together for the next step) */
    uint64_t hint_open_failures;    /* attempts to map the hint table that failed, and attempts to map a plan
                                     * file that is there but cannot be used (another layout version, size or
                                     * kind; a missing plan file is not counted: older agents make none) */
    uint64_t hint_remaps;           /* the table was replaced by the agent and mapped again */
    uint64_t invalid_calls;         /* calls refused for their arguments or the client's state */
    uint64_t late_switches;         /* maps first used at a step after an earlier begin_step had
                                       already reached their effective step (the map came late) */
    uint64_t tensor_stats_sent;     /* BlockTensorStats entries that went out in reports written whole */
    uint64_t plans_applied;         /* compute plans taken with a map at begin_step (a map without one: not counted) */
} prism_client_counters;

/* Fills *out; PRISM_ERR_INVALID for a NULL argument. */
prism_status prism_client_get_counters(const prism_client *c, prism_client_counters *out, prism_error *err);

/* The message of the last failure that happened out of sight of the caller (a connection
 * attempt, a hint table open, a send): "" when none. Valid until the next call. */
const char *prism_client_last_error(const prism_client *c);

#ifdef __cplusplus
}
#endif

#endif
