/* The policy configuration of DESIGN 4.1: one table of keys (name, type, default, range, help)
 * that the JSON loader, the --help text, the docs and the tests all read. */
#ifndef PRISM_POLICY_CONFIG_H
#define PRISM_POLICY_CONFIG_H

#include "hybrid.h"
#include "prism/common.h"

#include <jansson.h>
#include <stdio.h>

/* The largest apply_lag_steps a config may set. */
#define PRISM_APPLY_LAG_STEPS_MAX 1000000

/* The largest step id anything of Prism takes (reports, traces, replays): 2^53 - 1 less the
 * largest lag, so that a step and every step derived from it (effective_step = step +
 * apply_lag_steps) neither wraps nor loses precision as a JSON number read by JavaScript. A
 * report or trace line with a larger step is refused. */
#define PRISM_STEP_MAX ((UINT64_C(1) << 53) - 1 - PRISM_APPLY_LAG_STEPS_MAX)

typedef enum prism_mode {
    PRISM_MODE_OFF = 0,     /* bf16 except overrides; no scores computed */
    PRISM_MODE_STATIC = 1,  /* overrides only, every other block bf16; scores computed and reported */
    PRISM_MODE_DYNAMIC = 2  /* scores, hysteresis, cooldown, non-finite rule and overrides */
} prism_mode;

typedef enum prism_ambiguous {
    PRISM_AMBIGUOUS_BF16 = 0, /* "bf16" */
    PRISM_AMBIGUOUS_LOW = 1   /* "int8" or "low": the configured low_precision */
} prism_ambiguous;

typedef struct prism_block_list {
    uint32_t *ids; /* sorted ascending, no duplicates; owned by the config */
    size_t count;
} prism_block_list;

/* low_precision "auto" (issue 17): each block's low format is chosen from low_formats. It is a
 * value outside the wire enum prism.v1.Precision: never index an array with it nor send it as a
 * Precision (prism_config_low_format gives one concrete format for consumers that know one). */
#define PRISM_LOW_AUTO ((prism_precision)PRISM_PRECISION_COUNT)

/* low_formats: the allowed low formats, most saving first; 1 to PRISM_LOW_FORMATS_MAX of the
 * four low formats, no repeats. */
#define PRISM_LOW_FORMATS_MAX 4
typedef struct prism_format_list {
    prism_precision formats[PRISM_LOW_FORMATS_MAX];
    size_t count;
} prism_format_list;

/* scale_mode (issue 17 item 3): how the kernels pick a group's scale. The policy core only stores it. */
typedef enum prism_scale_mode {
    PRISM_SCALE_CURRENT = 0, /* the group's current amax */
    PRISM_SCALE_POW2 = 1,    /* the current amax, scale rounded up to a power of two */
    PRISM_SCALE_DELAYED = 2, /* max of an amax history of amax_history_len steps, times 2^scale_margin */
    PRISM_SCALE_STATIC = 3   /* fixed from the block's amax when its layout is registered */
} prism_scale_mode;

/* A list of names that may be absent (JSON null): hybrid_fixed_classes. */
typedef struct prism_name_list {
    bool given;    /* false: null (the automatic rule) */
    char **names;  /* in the order given, repeats kept; owned by the config */
    size_t count;
} prism_name_list;

#define PRISM_NAME_LIST_MAX 1024 /* names in a prism_name_list */
#define PRISM_NAME_MAX 255       /* bytes of one name (a device class, as prismd keeps it) */

typedef struct prism_config {
    bool enabled;
    prism_mode mode;
    double bf16_threshold;
    double int8_threshold;
    prism_ambiguous ambiguous_default;
    double hysteresis_margin;
    double grad_weight;
    double error_weight;
    double grad_sensitivity_threshold;
    bool run_calibration;
    int64_t calibration_samples;
    double quant_error_threshold;
    int64_t warmup_steps;
    int64_t history_window;
    int64_t update_interval_steps;
    int64_t min_steps_between_switches;
    prism_block_list force_bf16_blocks;
    prism_block_list force_int8_blocks; /* forced to low_precision, whatever its format */
    bool log_decisions;
    bool telemetry_enabled;
    char *telemetry_file;
    prism_precision low_precision; /* a low format, or PRISM_LOW_AUTO */
    int64_t apply_lag_steps;
    int64_t step_timeout_ms;
    int64_t world_size; /* 0: from the agents' Hello */
    /* Hybrid devices (DESIGN 11, issue 15): prismd's per-class compute plans. */
    bool hybrid;
    prism_hybrid_low_choice hybrid_low_format;
    double hybrid_gamma;
    double hybrid_memory_fraction;
    prism_name_list hybrid_fixed_classes;
    double hybrid_link_bytes_per_second;
    double hybrid_link_latency_seconds;
    /* Numerics (DESIGN 4.7, issue 17). */
    double loss_spike_factor;      /* 0: off */
    int64_t loss_spike_window;
    int64_t loss_spike_hold_steps;
    prism_format_list low_formats; /* used when low_precision is PRISM_LOW_AUTO */
    prism_scale_mode scale_mode;
    int64_t amax_history_len;
    int64_t scale_margin;
    double saturation_threshold;
} prism_config;

typedef enum prism_config_type {
    PRISM_CFG_BOOL,
    PRISM_CFG_INT,
    PRISM_CFG_DOUBLE,
    PRISM_CFG_CHOICE, /* a string from a fixed list, stored in an enum field */
    PRISM_CFG_STRING,
    PRISM_CFG_BLOCKS, /* an array of block ids */
    PRISM_CFG_NAMES,  /* null or an array of strings (prism_name_list) */
    PRISM_CFG_FORMATS /* an array of low format names (prism_format_list) */
} prism_config_type;

typedef struct prism_config_choice {
    const char *name;
    int value;
} prism_config_choice;

typedef struct prism_config_key {
    const char *name;
    prism_config_type type;
    size_t offset;             /* of the field in prism_config */
    const char *default_text;  /* the default as JSON text, e.g. "0.6", "\"dynamic\"", "[]" */
    double min, max;           /* numeric range, inclusive unless the flags say otherwise */
    bool min_exclusive;
    const prism_config_choice *choices; /* PRISM_CFG_CHOICE: terminated by {NULL, 0} */
    const char *help;
} prism_config_key;

/* The table, in the order of DESIGN 4.1; *count receives its length. */
const prism_config_key *prism_config_keys(size_t *count);

/* Fills cfg with the defaults. Cannot fail except for memory; cfg must later be freed. */
prism_status prism_config_init(prism_config *cfg, prism_error *err);
void prism_config_free(prism_config *cfg);
prism_status prism_config_copy(prism_config *dst, const prism_config *src, prism_error *err);

/* Applies the keys of obj (the bare object: keys of the table only) on top of base and
 * validates the result as a whole. On success *out holds the new config (out may alias base);
 * on failure nothing is changed and err names the key. key_prefix ("" or e.g.
 * "memory.stagehand.selective_precision.") is put in front of key names in messages. */
prism_status prism_config_apply_json(const prism_config *base, const json_t *obj,
                                     const char *key_prefix, prism_config *out, prism_error *err);

/* Parses a config document: the bare object or the nested training config
 * {"memory": {"stagehand": {"selective_precision": {...}}}}, on top of the defaults.
 * source names the document in messages (a file name); syntax errors give line and column. */
prism_status prism_config_load_buffer(const char *text, size_t len, const char *source,
                                      prism_config *out, prism_error *err);
prism_status prism_config_load_file(const char *path, prism_config *out, prism_error *err);

/* Checks the cross-key rules (int8_threshold < bf16_threshold, no block in both force lists). */
prism_status prism_config_validate(const prism_config *cfg, prism_error *err);

/* telemetry_file names a file inside the job's directory: not empty, at most NAME_MAX bytes, no
 * '/', not "." or "..", not "trace" (the job's trace directory, DESIGN 4.6), no control
 * character. NULL when name is such a name, else what is wrong ("is longer than 255 bytes
 * (NAME_MAX)"). Whether the file can be opened is the caller's to check
 * (prismd does at PATCH time): the policy core does no I/O. */
#define PRISM_CONFIG_FILE_NAME_MAX 255
#define PRISM_CONFIG_RESERVED_FILE_NAME "trace"
const char *prism_config_file_name_problem(const char *name);

/* The config as a bare JSON object with every key of the table. Caller decrefs. */
json_t *prism_config_to_json(const prism_config *cfg);

/* json_dumps with numbers as people write them (0.6, not 0.59999999999999998): 15 significant
 * digits when the whole document reads back to exactly the same values, else the 17 digits
 * that always do. Caller frees. */
char *prism_json_dumps_exact(const json_t *obj, size_t flags);

/* Prints the table (key, default, range, help) for --help texts. */
void prism_config_print_help(FILE *out);

bool prism_block_list_contains(const prism_block_list *list, uint32_t id);

/* The name low_precision is written with: a format's name, or "auto" for PRISM_LOW_AUTO. */
const char *prism_low_precision_name(prism_precision low);

/* One concrete low format for a consumer that knows only one (an old agent's Welcome, the
 * calibration request): low_precision itself, or under "auto" the last (least saving) of
 * low_formats, the format a block without calibration gets. */
prism_precision prism_config_low_format(const prism_config *cfg);

/* The largest loss_spike_window a config may set (the policy's saved loss window holds as many). */
#define PRISM_LOSS_WINDOW_MAX 100000

#endif
