/* The shared-memory hint table (DESIGN 2, step 5): a file in a directory the agent shares with its
 * trainer (the Kubernetes emptyDir), mapped by both. The agent is its one writer; the trainer's
 * libprism reads it at the start of each step without a system call.
 *
 * Layout (all integers little-endian, the file is PRISM_HINTS_HEADER_BYTES + SLOTS * max_blocks):
 *   a header (prism_hints_header), then PRISM_HINTS_SLOTS arrays of max_blocks precision bytes,
 *   one per map slot.
 * Versioned: `magic` and `layout_version` say what the file is; a reader refuses any other.
 *
 * Seqlock: the agent makes `seq` odd, writes, and makes it even again (release). A reader copies
 * what it needs between two reads of `seq` and keeps the copy only when both are the same even
 * number; it tries a bounded number of times and otherwise keeps its previous copy, so it never
 * waits on the agent (a dead agent mid-write leaves `seq` odd: the trainer keeps its last map).
 *
 * Map slots: each PrecisionUpdate becomes a whole map in a slot, with its version and effective
 * step. At the start of step s a reader uses the slot with the highest map_version whose
 * effective_step <= s (none: version 0, every block bf16), so every rank switches at the start of
 * the same step. Slots with a later effective step wait there. The agent writes a new map into an
 * empty slot if there is one, else into the slot with the lowest version that is neither the one
 * the trainer last applied (applied_version) nor the newest. Within a slot the agent first sets
 * map_version to 0, then writes the bytes, then the version: a writer that dies mid-write leaves
 * an empty slot, never a torn map.
 *
 * The trainer writes back, in its own cache line and under its own small seqlock (`applied_seq`),
 * the map version it applied and the step it applied it at; the agent reads them to send Ack.
 * Under the same seqlock it publishes its counters (the trainer line, prism_hints_trainer), which
 * the agent exports on /metrics and sends (in part) to prismd in its Heartbeat. These fields came
 * after layout version 1's first files, in bytes that were zero, in two steps that
 * `counters_published` tells apart: 0 nothing published (an older trainer leaves the bytes zero),
 * 1 only the dropped total and late switches, 2 the extended line (prism_hints_trainer_ext:
 * reports sent, drops by reason, the map apply lag, block transfers and collectives by
 * precision). A trainer of this build writes the first fields too, so an older agent still reads
 * them; an older trainer's line reads as published 1 here, and a zeroed extension as zeros.
 *
 * Each slot also has the CLOCK_MONOTONIC time the agent wrote its map and the version it wrote
 * (slot_written, agent written under `seq`). The time counts only while that version is the
 * slot's: an older agent rewrites a slot without touching it, so the stamp of a map it did not
 * write names another version (or is zero), and the write time is unknown. Agent and trainer share a kernel
 * (one pod), so the trainer subtracts it from its own clock at the first begin_step that uses the
 * map: the map apply lag. Every new field is in bytes an older file has as zeros, and no existing
 * field moved (the offsets are pinned below), so older agents and trainers interoperate.
 *
 * One trainer per agent (the sidecar model). The file outlives the agent: a restarted agent finds
 * it, keeps the maps in it (fail-static), makes an odd `seq` even, and bumps `generation`. A file
 * of another kind, version or size is never reset in place (a trainer that has it mapped would
 * fault on a shrunk file): the agent writes a new one beside it and renames it over the path, so
 * the old inode lives on under the trainer's mapping until the trainer remaps
 * (prism_hints_replaced).
 *
 * The job's numerics config (issue 17: scale mode, amax history, scale margin, low_precision
 * "auto" with its low_formats, and the formats prismd still wants calibrated) came later still,
 * agent-written under `seq` in bytes an older file has as zeros (`numerics`, offset 896):
 * numerics.published is 0 until an agent of this build writes them, and a reader then takes the
 * defaults (prism_hints_numerics). So the layout version stays 1: an older trainer reads the
 * table of a newer agent as before, and a newer trainer the table of an older agent. */
#ifndef PRISM_CLIENT_HINTS_H
#define PRISM_CLIENT_HINTS_H

#include "prism/common.h"

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#define PRISM_HINTS_MAGIC 0x31544e4853495250ull /* "PRISHNT1" */
#define PRISM_HINTS_LAYOUT_VERSION 1u
#define PRISM_HINTS_SLOTS 4
#define PRISM_HINTS_HEADER_BYTES 1024
#define PRISM_HINTS_MAX_BLOCKS_LIMIT (1u << 20)

typedef struct prism_hints_slot {
    uint64_t map_version;    /* 0: empty */
    uint64_t decided_step;
    uint64_t effective_step;
    uint32_t n_blocks;       /* precisions[0 .. n_blocks) are meaningful; others are bf16 */
    uint32_t reserved;
} prism_hints_slot;

/* RuntimeHints (proto) as the trainer reads them. */
typedef struct prism_runtime_hints {
    uint64_t map_version;
    uint32_t max_inflight_h2d;
    uint32_t max_inflight_d2h;
    uint32_t prefetch_window;
    uint32_t suppress_prefetch_in_backward;  /* 0 or 1 */
    uint32_t suppress_prefetch_in_optimizer; /* 0 or 1 */
    uint32_t reserved;
    double vram_pressure_threshold;
} prism_runtime_hints;

/* Why the trainer's libprism dropped a report (prism_hints_trainer_ext.dropped). Every drop has
 * one: the reasons add up to reports_dropped. The agent exports them under these names
 * (prism_hints_drop_names). Values never change meaning; new reasons go before
 * PRISM_HINTS_DROP_REASONS while the extension is unreleased. */
typedef enum prism_hints_drop {
    PRISM_HINTS_DROP_NO_AGENT = 0,        /* no connection to the agent */
    PRISM_HINTS_DROP_AGENT_BUSY = 1,      /* the socket was full: the agent is not reading */
    PRISM_HINTS_DROP_CONNECTION_LOST = 2, /* in flight (half-written) when the connection ended */
    PRISM_HINTS_DROP_STATS_PENDING = 3,   /* the GPU had not finished the previous report's statistics */
    PRISM_HINTS_DROP_STATS_FAILED = 4,    /* the statistics pass failed (a kernel, its buffers, the copy back) */
    PRISM_HINTS_DROP_TOO_BIG = 5,         /* the report is larger than a frame (PRISM_LOCAL_MAX_FRAME) */
    PRISM_HINTS_DROP_NO_MEMORY = 6,       /* no memory for the report (its frame, the GPU reports' state) */
    PRISM_HINTS_DROP_REASONS = 7
} prism_hints_drop;

/* The reasons' names on /metrics (prism_agent_trainer_reports_dropped_total{reason}), by value. */
extern const char *const prism_hints_drop_names[PRISM_HINTS_DROP_REASONS];

/* The map apply lag histogram: bucket i counts lags in (edge[i-1], edge[i]] (edge[-1] = -inf),
 * the last one those above the last edge. Edges in nanoseconds (prism_hints_lag_edges_ns):
 * 0.001, 0.01, 0.1, 0.5, 1, 2, 5, 10, 30, 60 and 300 seconds. */
#define PRISM_HINTS_LAG_EDGES 11
#define PRISM_HINTS_LAG_BUCKETS (PRISM_HINTS_LAG_EDGES + 1)
extern const uint64_t prism_hints_lag_edges_ns[PRISM_HINTS_LAG_EDGES];

/* The bucket of a lag of `ns` nanoseconds. */
unsigned prism_hints_lag_bucket(uint64_t ns);

/* The extended trainer line (counters_published 2), totals since the trainer's client opened
 * (reports, lag) or since libprism was loaded in the process (transfers, collectives). Arrays
 * by prism_precision are indexed by its value. */
typedef struct prism_hints_trainer_ext {
    uint64_t reports_sent;                               /* StepReports written whole */
    uint64_t dropped[PRISM_HINTS_DROP_REASONS];          /* drops by reason (others: the total's rest) */
    uint64_t lag_buckets[PRISM_HINTS_LAG_BUCKETS];       /* not cumulative: see above */
    uint64_t lag_count;
    uint64_t lag_sum_ns;
    uint64_t transfers[PRISM_PRECISION_COUNT];           /* block transfers started */
    uint64_t transfer_bytes[PRISM_PRECISION_COUNT];      /* their image bytes (host to device) */
    uint64_t transfer_bf16_bytes[PRISM_PRECISION_COUNT]; /* the same blocks' BF16 bytes */
    uint64_t allreduce_calls[PRISM_PRECISION_COUNT];     /* all-reduce and reduce-scatter calls, by wire */
    uint64_t allreduce_wire_bytes[PRISM_PRECISION_COUNT];/* payload bytes this rank sent */
    uint64_t allreduce_bf16_bytes[PRISM_PRECISION_COUNT];/* what a BF16 ring would have sent */
    uint64_t allreduce_ns[PRISM_PRECISION_COUNT];        /* host wall time in the calls */
} prism_hints_trainer_ext;

/* The job's numerics config as the agent last heard it (Welcome or ConfigUpdate). published 0:
 * no agent of this build wrote it, the rest is zero; a reader then uses scale mode current, an
 * amax history of 16, margin 0, no "auto", low_formats [low_precision] and, when
 * calibration_needed, calibration_formats [low_precision]. Formats are prism_precision values. */
#define PRISM_HINTS_FORMATS_MAX 4
typedef struct prism_hints_numerics {
    uint32_t published;              /* 1: written by an agent that knows these fields */
    uint32_t scale_mode;             /* prism.v1.ScaleMode: 0 current, 1 pow2, 2 delayed, 3 static */
    uint32_t amax_history_len;       /* steps of amax history (delayed) */
    int32_t scale_margin;            /* the delayed scale times 2^scale_margin */
    uint32_t low_auto;               /* 1: low_precision "auto" (low_precision then holds the last of low_formats) */
    uint32_t n_low_formats;          /* 0 .. PRISM_HINTS_FORMATS_MAX */
    uint32_t n_calibration_formats;  /* 0 .. PRISM_HINTS_FORMATS_MAX */
    uint8_t low_formats[PRISM_HINTS_FORMATS_MAX];         /* most saving first */
    uint8_t calibration_formats[PRISM_HINTS_FORMATS_MAX]; /* the formats prismd wants calibrated */
    uint32_t reserved;
} prism_hints_numerics;

/* When the agent wrote a slot's map (CLOCK_MONOTONIC ns, 0 never) and which map it was. */
typedef struct prism_hints_slot_written {
    uint64_t map_version;
    uint64_t ns;
} prism_hints_slot_written;

typedef struct prism_hints_header {
    uint64_t magic;
    uint32_t layout_version;
    uint32_t max_blocks;          /* bytes per slot */
    uint64_t file_bytes;
    uint64_t generation;          /* +1 each time an agent opens the file */
    _Alignas(64) _Atomic uint64_t seq; /* the agent's seqlock */
    /* Everything from here to applied_seq is written by the agent under seq. */
    uint64_t agent_pid;
    uint32_t upstream_connected;  /* 1 while the agent has a Welcome on a live stream */
    uint32_t calibration_needed;  /* 1: prismd asked for calibration (Welcome) */
    uint32_t calibration_samples; /* from the job's config */
    uint32_t low_precision;       /* prism_precision, from the job's config */
    uint32_t run_calibration;     /* from the job's config */
    uint32_t reserved0;
    prism_runtime_hints hints;
    prism_hints_slot slots[PRISM_HINTS_SLOTS];
    /* Written by the trainer, read by the agent. */
    _Alignas(64) _Atomic uint64_t applied_seq;
    uint64_t applied_version;     /* map_version the trainer uses */
    uint64_t applied_step;        /* the step it started using it at */
    uint64_t trainer_pid;
    /* The trainer-side counters of DESIGN 12 (prism_client_counters), totals since its client
     * opened, also under applied_seq. counters_published is 0 until a trainer writes them (a
     * trainer of an older libprism never does: the agent then does not know them), 1 for these
     * two alone, 2 when ext is written too. */
    uint64_t counters_published;
    uint64_t reports_dropped;     /* every drop, whatever its reason */
    uint64_t late_switches;
    prism_hints_trainer_ext ext;  /* counters_published 2 */
    /* Agent-written under seq: when each slot's map was written, stamped with the version it was
     * written for. An older agent rewrites slots without touching these, so a stamp whose
     * map_version is not the slot's own is stale: the write time is unknown then. */
    _Alignas(64) prism_hints_slot_written slot_written[PRISM_HINTS_SLOTS];
    /* Agent-written under seq: the job's numerics config (prism_hints_numerics; zeros from an
     * older agent). */
    _Alignas(64) prism_hints_numerics numerics;
} prism_hints_header;

_Static_assert(sizeof(prism_hints_header) <= PRISM_HINTS_HEADER_BYTES, "hint table header too big");
/* Files written by earlier builds have these fields here: they never move. */
_Static_assert(offsetof(prism_hints_header, seq) == 64 && offsetof(prism_hints_header, slots) == 144 &&
                   offsetof(prism_hints_header, applied_seq) == 320 &&
                   offsetof(prism_hints_header, applied_version) == 328 &&
                   offsetof(prism_hints_header, trainer_pid) == 344 &&
                   offsetof(prism_hints_header, counters_published) == 352 &&
                   offsetof(prism_hints_header, reports_dropped) == 360 &&
                   offsetof(prism_hints_header, late_switches) == 368 && offsetof(prism_hints_header, ext) == 376,
               "the hint table's existing fields keep their offsets");
/* The extension (counters_published 2) and the slots' write times, as this build lays them out
 * (tests and the agent's tests read them at these offsets). */
_Static_assert(sizeof(prism_hints_trainer_ext) == 456 && offsetof(prism_hints_header, slot_written) == 832 &&
                   offsetof(prism_hints_header, numerics) == 896,
               "the extension's layout");
_Static_assert(sizeof(prism_hints_numerics) == 40 && offsetof(prism_hints_header, numerics) == 896 &&
                   sizeof(prism_hints_header) == 960,
               "the numerics block's layout");
/* Two processes share the seqlocks: they must be plain lock-free words, not a library lock. */
_Static_assert(ATOMIC_LLONG_LOCK_FREE == 2, "hint table seqlocks need lock-free 64-bit atomics");

/* A mapped table, from either side. */
typedef struct prism_hints {
    prism_hints_header *h;
    uint8_t *precisions; /* PRISM_HINTS_SLOTS * max_blocks bytes after the header */
    size_t bytes;
    int fd;              /* open while mapped (h != NULL) */
    uint64_t pid;        /* this process's, taken at open: the writes make no system call */
} prism_hints;

/* ---- the agent's side ---- */

/* Opens path (creating it, mode 0660) for writing. An existing file with the same magic, layout
 * version and max_blocks keeps its slots (fail-static across agent restarts); anything else is
 * reset to an empty table (every block bf16, version 0). Bumps generation, sets agent_pid. */
prism_status prism_hints_create(prism_hints *t, const char *path, uint32_t max_blocks, prism_error *err);

/* Writes a whole map (precisions[i] for block i, n_blocks of them, at most max_blocks) into a
 * free slot (see the slot rule above), under the seqlock. Blocks past n_blocks read as bf16.
 * map_version 0 or a precision byte that is not a prism_precision is PRISM_ERR_INVALID, n_blocks
 * above max_blocks PRISM_ERR_LIMIT, a version not above every version already in the table
 * PRISM_ERR_STATE; nothing is written then. */
prism_status prism_hints_publish_map(prism_hints *t, uint64_t map_version, uint64_t decided_step,
                                     uint64_t effective_step, const uint8_t *precisions, uint32_t n_blocks,
                                     prism_error *err);

/* The versions of the maps the table holds (its one writer reads its own slots: no seqlock), at
 * most PRISM_HINTS_SLOTS, into out; returns how many (empty slots are left out). The agent keeps
 * these maps' compute plans (plans.h's slot rule). */
unsigned prism_hints_held_versions(const prism_hints *t, uint64_t out[PRISM_HINTS_SLOTS]);

/* Agent-written scalar fields, each under the seqlock. */
void prism_hints_set_status(prism_hints *t, bool upstream_connected, bool calibration_needed,
                            bool run_calibration, uint32_t calibration_samples, prism_precision low_precision);
void prism_hints_set_runtime(prism_hints *t, const prism_runtime_hints *hints);
/* Writes the numerics config (published is written as 1; counts above PRISM_HINTS_FORMATS_MAX
 * are cut to it). */
void prism_hints_set_numerics(prism_hints *t, const prism_hints_numerics *numerics);

/* The whole trainer line as one consistent copy. published says what is in it: 0 nothing but
 * the applied version and step (ext and the counters zero), 1 also reports_dropped and
 * late_switches (ext zero), 2 everything. */
typedef struct prism_hints_trainer {
    uint64_t applied_version;
    uint64_t applied_step;
    uint64_t published;       /* counters_published */
    uint64_t reports_dropped; /* every drop */
    uint64_t late_switches;
    prism_hints_trainer_ext ext;
} prism_hints_trainer;

/* Reads the trainer line under applied_seq (at most 64 tries, never waits); false, *out
 * untouched, when no consistent copy could be had. A line published as 2 by a trainer keeps
 * published 2 here; any other nonzero value reads as 1 with a zeroed ext. */
bool prism_hints_read_trainer(const prism_hints *t, prism_hints_trainer *out);

/* The trainer's last write-back (prism_hints_read_trainer's first two fields); false when none
 * consistent could be read. */
bool prism_hints_read_applied(const prism_hints *t, uint64_t *map_version, uint64_t *applied_step);

/* ---- the trainer's side ---- */

/* Maps an existing table read-write (only the trainer line is written). A missing file is
 * PRISM_ERR_NOT_FOUND; a file of another kind or version PRISM_ERR_INVALID naming the field. */
prism_status prism_hints_open(prism_hints *t, const char *path, prism_error *err);

/* What a reader takes from the table at the start of a step. */
typedef struct prism_hints_view {
    uint64_t map_version;
    uint64_t decided_step;
    uint64_t effective_step;
    uint32_t n_blocks;
    bool upstream_connected;
    bool calibration_needed;
    bool run_calibration;
    uint32_t calibration_samples;
    prism_precision low_precision;
    prism_runtime_hints hints;
    uint64_t written_ns;  /* when the agent wrote the map (CLOCK_MONOTONIC); 0: unknown or no map */
    prism_hints_numerics numerics; /* as the table has it: published 0 from an older agent */
} prism_hints_view;

/* The map in effect at step `step`: fills *view and writes out[0 .. cap): the map's precisions
 * for its first min(n_blocks, cap) blocks, bf16 for the rest (view->n_blocks is the map's own
 * count). Tries the seqlock at most `tries` times (tries 0 counts as 1) and never waits; false
 * when no consistent copy was had: *view is untouched but out may hold a torn copy, so a caller
 * that must keep its previous map reads into a scratch array and swaps on success. */
bool prism_hints_read(const prism_hints *t, uint64_t step, prism_hints_view *view, uint8_t *out, uint32_t cap,
                      unsigned tries);

/* Records that the trainer uses map_version from step on. */
void prism_hints_write_applied(prism_hints *t, uint64_t map_version, uint64_t step);

/* Publishes the whole trainer line (line->published is ignored: written as 2), under
 * applied_seq. No system call: a plain copy between two stores of the seqlock. */
void prism_hints_write_trainer(prism_hints *t, const prism_hints_trainer *line);

/* True when path no longer names the file t has mapped (the agent replaced it, or it is gone):
 * the caller should close and reopen. One stat(2); for the trainer's reconnect path, not for
 * every step. */
bool prism_hints_replaced(const prism_hints *t, const char *path);

/* Unmaps and closes (either side). Safe on a zeroed struct. */
void prism_hints_close(prism_hints *t);

#endif
