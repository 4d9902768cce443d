/* `prismctl replay`'s parts (internal to prismctl): a trace parsed once into a compact array of
 * events (replay_load.c), the --sweep grid (replay_sweep.c), and the command (replay.c). */
#ifndef PRISMCTL_REPLAY_H
#define PRISMCTL_REPLAY_H

#include "config.h"
#include "policy.h"
#include "trace.h"

#include <jansson.h>

/* What one line (JSONL) or record (binary) of a trace asks of a replay. */
typedef enum replay_event_kind {
    REPLAY_LAYOUT,      /* entries[first, first + count): BF16 sizes */
    REPLAY_CALIBRATION, /* entries[first, first + count): errors in format */
    REPLAY_HEADER,      /* binary: a segment starts; configs[config] is the config in force */
    REPLAY_CONFIG,      /* binary: configs[config] is set for the next decision (a PATCH) */
    REPLAY_STEP         /* blocks[first, first + count); merged (binary) or one rank's report (JSONL) */
} replay_event_kind;

typedef struct replay_event {
    replay_event_kind kind;
    bool merged;          /* step: already merged over ranks (binary) */
    bool has_loss;
    bool version_bumped;  /* step: prismd followed its decision with a new map version */
    bool restored;        /* header */
    bool gap_before;      /* header: prismd lost records of the job before this segment */
    prism_precision format; /* calibration */
    uint32_t rank;        /* JSONL step: the rank as written; binary step: ranks merged into it */
    uint64_t step;        /* step; header: segment */
    double loss;
    size_t first, count;
    size_t config;        /* header, config: index into configs */
    uint64_t where;       /* JSONL: line number; binary: record number */
    size_t byte;          /* binary: the record's byte offset */
} replay_event;

typedef struct replay_trace {
    const char *name;     /* the file name messages give ("<stdin>" for -) */
    bool binary;
    replay_event *events;
    size_t nevents, cap_events;
    prism_block_stats *blocks;
    size_t nblocks, cap_blocks;
    prism_trace_entry *entries;
    size_t nentries, cap_entries;
    char **configs;       /* owned JSON texts */
    size_t nconfigs, cap_configs;
    uint32_t *ranks;      /* JSONL: the distinct ranks of its steps, ascending */
    size_t nranks;
    size_t step_events;
} replay_trace;

/* Parses a whole trace (binary or JSONL, told apart by content) into t. world: the ranks a JSONL
 * step may name (rank < world), 0 for any. On failure err holds "FILE:LINE: KEY: problem"
 * (JSONL) or "FILE: record N (byte B): problem" (binary), and t holds what was read before. */
prism_status replay_trace_load(replay_trace *t, const char *name, const char *data, size_t len, long long world,
                               prism_error *err);
void replay_trace_free(replay_trace *t);

/* The number of distinct block ids the trace's steps, layouts and calibrations name: the blocks
 * a policy replaying it holds state for. */
prism_status replay_trace_count_blocks(const replay_trace *t, size_t *count, prism_error *err);

/* Puts "FILE:LINE" or "FILE: record N (byte B)" of event e in front of err's message. */
void replay_event_prefix(const replay_trace *t, const replay_event *e, prism_error *err);

/* Parses a JSONL step line of the common, strict form (the keys of trace.h, plain key strings,
 * JSON numbers) into rec exactly as prism_trace_parse_line would, without building a JSON tree.
 * false: the line is anything else (another kind of line, an escape, an error...), and the
 * caller hands it to prism_trace_parse_line, which parses it or names what is wrong: the fast path
 * never accepts a line the strict parser refuses, nor reads a number differently. */
bool replay_parse_step_fast(const char *line, size_t len, prism_trace_record *rec);

/* ---- --sweep: a grid of configs over one trace ---- */

#define REPLAY_SWEEP_MAX_COMBINATIONS 4096
/* A sweep holds one policy per combination, each with state for every block of the trace (about
 * 250 bytes a block at the default history_window of 5, about 8 more per window step over that;
 * measured with 10,000 blocks): combinations x blocks is bounded to keep a sweep near 4 GB. */
#define REPLAY_SWEEP_MAX_BLOCK_STATES 16000000
#define REPLAY_SWEEP_BYTES_PER_BLOCK 250

typedef struct replay_sweep_key {
    char *name;
    json_t *values;       /* a JSON array: the values in the order given */
    char **texts;         /* each value as compact JSON text (for output) */
} replay_sweep_key;

typedef struct replay_sweep {
    replay_sweep_key *keys;
    size_t nkeys;
    size_t combinations;  /* product of the value counts; 1 without --sweep */
} replay_sweep;

/* Adds one --sweep KEY=V1,V2,... argument. Values are split at commas outside brackets, braces
 * and strings; each is JSON (a number, true/false, null, "string", [list], {...}) or, when it does not
 * parse as JSON, a bare word taken as a string (mode=static,dynamic). Whether the values suit the
 * key is the config loader's to say (replay_sweep_overlay + prism_config_apply_json). */
prism_status replay_sweep_add(replay_sweep *s, const char *arg, prism_error *err);
void replay_sweep_free(replay_sweep *s);

/* The bare config object of combination i (the last key varying fastest). Caller decrefs. */
json_t *replay_sweep_overlay(const replay_sweep *s, size_t i);

/* Index of key k's value in combination i. */
size_t replay_sweep_value_index(const replay_sweep *s, size_t i, size_t k);

#endif
