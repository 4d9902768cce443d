/* The configuration table of DESIGN 4.1 and its JSON loader. The defaults are written in the
 * table as JSON text and go through the same parser as a user's file, so the table, the
 * parser, the help text and the tests cannot disagree. */
#define _POSIX_C_SOURCE 200809L
#include "config.h"

#include "json_kind.h"

#include <assert.h>
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

static const prism_config_choice mode_choices[] = {
    {"off", PRISM_MODE_OFF}, {"static", PRISM_MODE_STATIC}, {"dynamic", PRISM_MODE_DYNAMIC}, {NULL, 0}};
static const prism_config_choice ambiguous_choices[] = {
    {"bf16", PRISM_AMBIGUOUS_BF16}, {"int8", PRISM_AMBIGUOUS_LOW}, {"low", PRISM_AMBIGUOUS_LOW}, {NULL, 0}};
static const prism_config_choice low_choices[] = {{"int8", PRISM_PRECISION_INT8},
                                                  {"fp8_e4m3", PRISM_PRECISION_FP8_E4M3},
                                                  {"fp8_e5m2", PRISM_PRECISION_FP8_E5M2},
                                                  {"int4", PRISM_PRECISION_INT4},
                                                  {"auto", (int)PRISM_LOW_AUTO},
                                                  {NULL, 0}};

static const prism_config_choice scale_choices[] = {{"current", PRISM_SCALE_CURRENT},
                                                    {"pow2", PRISM_SCALE_POW2},
                                                    {"delayed", PRISM_SCALE_DELAYED},
                                                    {"static", PRISM_SCALE_STATIC},
                                                    {NULL, 0}};

static const prism_config_choice hybrid_low_choices[] = {{"auto", PRISM_HYBRID_LOW_AUTO},
                                                         {"int8", PRISM_HYBRID_LOW_INT8},
                                                         {"fp8_e4m3", PRISM_HYBRID_LOW_FP8_E4M3},
                                                         {NULL, 0}};

#define OFF(field) offsetof(prism_config, field)
#define BIG 1e9

static const prism_config_key keys[] = {
    {"enabled", PRISM_CFG_BOOL, OFF(enabled), "true", 0, 0, false, NULL,
     "false: every block is bf16 and overrides are ignored"},
    {"mode", PRISM_CFG_CHOICE, OFF(mode), "\"dynamic\"", 0, 0, false, mode_choices,
     "off: bf16 except overrides, no scores; static: overrides only, scores reported; "
     "dynamic: scores, hysteresis and overrides"},
    {"bf16_threshold", PRISM_CFG_DOUBLE, OFF(bf16_threshold), "0.6", 0, 1, false, NULL,
     "a score at or above this puts a block in bf16"},
    {"int8_threshold", PRISM_CFG_DOUBLE, OFF(int8_threshold), "0.3", 0, 1, false, NULL,
     "a score below this puts a block in the low precision; must be below bf16_threshold"},
    {"ambiguous_default", PRISM_CFG_CHOICE, OFF(ambiguous_default), "\"bf16\"", 0, 0, false,
     ambiguous_choices, "first assignment of a score between the thresholds (int8 or low: the low precision)"},
    {"hysteresis_margin", PRISM_CFG_DOUBLE, OFF(hysteresis_margin), "0.1", 0, 1, false, NULL,
     "a bf16 block goes low only below int8_threshold minus this"},
    {"grad_weight", PRISM_CFG_DOUBLE, OFF(grad_weight), "0.7", 0, 1, false, NULL,
     "weight of the gradient score when a calibration error is known"},
    {"error_weight", PRISM_CFG_DOUBLE, OFF(error_weight), "0.3", 0, 1, false, NULL,
     "weight of the calibration error score when one is known"},
    {"grad_sensitivity_threshold", PRISM_CFG_DOUBLE, OFF(grad_sensitivity_threshold), "2.0", 0, 1e6,
     true, NULL, "relative gradient magnitude at which the gradient score reaches 1"},
    {"run_calibration", PRISM_CFG_BOOL, OFF(run_calibration), "true", 0, 0, false, NULL,
     "ask trainers to measure quantization errors when the fingerprint is not cached"},
    {"calibration_samples", PRISM_CFG_INT, OFF(calibration_samples), "4", 1, 1e6, false, NULL,
     "forward passes averaged per calibration"},
    {"quant_error_threshold", PRISM_CFG_DOUBLE, OFF(quant_error_threshold), "0.05", 0, 1, true, NULL,
     "relative quantization error at which the error score reaches 1"},
    {"warmup_steps", PRISM_CFG_INT, OFF(warmup_steps), "10", 0, BIG, false, NULL,
     "steps collected before the first decision (at least 1 is always collected)"},
    {"history_window", PRISM_CFG_INT, OFF(history_window), "5", 1, 1000, false, NULL,
     "finite steps per block kept for its score"},
    {"update_interval_steps", PRISM_CFG_INT, OFF(update_interval_steps), "10", 1, BIG, false, NULL,
     "collected steps between decisions after the first"},
    {"min_steps_between_switches", PRISM_CFG_INT, OFF(min_steps_between_switches), "20", 0, BIG, false,
     NULL, "cooldown: a block keeps its precision this many steps after a change"},
    {"force_bf16_blocks", PRISM_CFG_BLOCKS, OFF(force_bf16_blocks), "[]", 0, 0, false, NULL,
     "block ids always kept in bf16 (overrides win over scores and cooldown)"},
    {"force_int8_blocks", PRISM_CFG_BLOCKS, OFF(force_int8_blocks), "[]", 0, 0, false, NULL,
     "block ids always kept in the low precision"},
    {"log_decisions", PRISM_CFG_BOOL, OFF(log_decisions), "true", 0, 0, false, NULL,
     "log every precision change"},
    {"telemetry_enabled", PRISM_CFG_BOOL, OFF(telemetry_enabled), "true", 0, 0, false, NULL,
     "write one telemetry record per decision"},
    {"telemetry_file", PRISM_CFG_STRING, OFF(telemetry_file), "\"selective_precision_telemetry.jsonl\"", 0,
     0, false, NULL, "telemetry JSONL file name (inside the job's data directory)"},
    {"low_precision", PRISM_CFG_CHOICE, OFF(low_precision), "\"int8\"", 0, 0, false, low_choices,
     "format a block gets when it leaves bf16; auto: per block, the first of low_formats whose calibration "
     "error is <= quant_error_threshold, else the last of low_formats"},
    {"apply_lag_steps", PRISM_CFG_INT, OFF(apply_lag_steps), "1", 0, PRISM_APPLY_LAG_STEPS_MAX, false, NULL,
     "a decision at step s takes effect at step s + apply_lag_steps on every rank"},
    {"step_timeout_ms", PRISM_CFG_INT, OFF(step_timeout_ms), "2000", 1, 3.6e6, false, NULL,
     "a step completes this long after its first report even if ranks are missing"},
    {"world_size", PRISM_CFG_INT, OFF(world_size), "0", 0, 1e6, false, NULL,
     "ranks per job; 0: taken from the agents' Hello"},
    {"hybrid", PRISM_CFG_BOOL, OFF(hybrid), "false", 0, 0, false, NULL,
     "plan per-device-class compute precisions (DESIGN 11) at decisions when the ranks report two or more "
     "device classes"},
    {"hybrid_low_format", PRISM_CFG_CHOICE, OFF(hybrid_low_format), "\"auto\"", 0, 0, false, hybrid_low_choices,
     "the low compute format of hybrid plans; auto: fp8_e4m3 where the class has FP8 throughput, else int8"},
    {"hybrid_gamma", PRISM_CFG_DOUBLE, OFF(hybrid_gamma), "4", 0, INFINITY, false, NULL,
     "weight of the forward term of the hybrid indicator (finite)"},
    {"hybrid_memory_fraction", PRISM_CFG_DOUBLE, OFF(hybrid_memory_fraction), "0.9", 0, 1, true, NULL,
     "share of a device's memory a hybrid plan may use"},
    {"hybrid_fixed_classes", PRISM_CFG_NAMES, OFF(hybrid_fixed_classes), "null", 0, 0, false, NULL,
     "device classes that run every block high; null: those whose high format is fastest; a name no rank "
     "reports refuses the plan"},
    {"hybrid_link_bytes_per_second", PRISM_CFG_DOUBLE, OFF(hybrid_link_bytes_per_second), "12.5e9", 0, INFINITY,
     true, NULL, "all-reduce link bandwidth of the hybrid time model (finite)"},
    {"hybrid_link_latency_seconds", PRISM_CFG_DOUBLE, OFF(hybrid_link_latency_seconds), "1e-5", 0, INFINITY, false,
     NULL, "all-reduce latency per block of the hybrid time model (finite)"},
    /* Numerics (DESIGN 4.7, issue 17). */
    {"loss_spike_factor", PRISM_CFG_DOUBLE, OFF(loss_spike_factor), "0", 0, 1e6, false, NULL,
     "0: off; a step whose loss (the mean of its ranks' finite losses) is above this times the median of the "
     "last loss_spike_window non-spike losses is a spike: blocks that went low by score within "
     "loss_spike_window steps go back to bf16 (reason loss_spike), also between scheduled decisions"},
    {"loss_spike_window", PRISM_CFG_INT, OFF(loss_spike_window), "20", 2, PRISM_LOSS_WINDOW_MAX, false, NULL,
     "losses kept for the spike median (steps with a loss that were not spikes; kept whatever the factor), "
     "and how recent a switch to low must be for a spike to undo it"},
    {"loss_spike_hold_steps", PRISM_CFG_INT, OFF(loss_spike_hold_steps), "100", 0, BIG, false, NULL,
     "a block rolled back by a spike at step s is not moved low by score before step s + this (overrides "
     "still apply)"},
    {"low_formats", PRISM_CFG_FORMATS, OFF(low_formats), "[\"int4\", \"fp8_e4m3\", \"int8\"]", 0, 0, false, NULL,
     "low formats allowed under low_precision auto, most saving first (1 to 4 of int8, fp8_e4m3, fp8_e5m2, "
     "int4, no repeats); calibration measures each"},
    {"scale_mode", PRISM_CFG_CHOICE, OFF(scale_mode), "\"current\"", 0, 0, false, scale_choices,
     "quantization scale: current amax; pow2: rounded up to a power of two; delayed: max of an amax "
     "history; static: fixed when the layout is registered"},
    {"amax_history_len", PRISM_CFG_INT, OFF(amax_history_len), "16", 1, 1024, false, NULL,
     "steps of amax history per block (scale_mode delayed)"},
    {"scale_margin", PRISM_CFG_INT, OFF(scale_margin), "0", -32, 32, false, NULL,
     "scale_mode delayed: the scale is max(history) * 2^scale_margin / qmax"},
    {"saturation_threshold", PRISM_CFG_DOUBLE, OFF(saturation_threshold), "1e-4", 0, 1, false, NULL,
     "a low block whose saturated fraction, averaged over its window, is above this goes to bf16 at the next "
     "decision (reason saturation), whatever its cooldown"},
};

#define NKEYS (sizeof keys / sizeof keys[0])

const prism_config_key *prism_config_keys(size_t *count)
{
    *count = NKEYS;
    return keys;
}

/* A value's kind for the config's messages, which tell an integer ("an integer") from a real ("a
 * number"). */
static const char *json_type_name(const json_t *v)
{
    return json_is_integer(v) ? "an integer" : prism_json_kind(v);
}

static const prism_config_key *find_key(const char *name)
{
    for (size_t i = 0; i < NKEYS; i++)
        if (strcmp(keys[i].name, name) == 0)
            return &keys[i];
    return NULL;
}

/* Edit distance, for "did you mean" hints on unknown keys. */
static size_t edit_distance(const char *a, const char *b)
{
    size_t la = strlen(a), lb = strlen(b);
    if (la > 63 || lb > 63)
        return 64;
    size_t row[64];
    for (size_t j = 0; j <= lb; j++)
        row[j] = j;
    for (size_t i = 1; i <= la; i++) {
        size_t diag = row[0];
        row[0] = i;
        for (size_t j = 1; j <= lb; j++) {
            size_t up = row[j];
            size_t best = diag + (a[i - 1] != b[j - 1]);
            if (row[j] + 1 < best)
                best = row[j] + 1;
            if (row[j - 1] + 1 < best)
                best = row[j - 1] + 1;
            row[j] = best;
            diag = up;
        }
    }
    return row[lb];
}

static const char *nearest_key(const char *name)
{
    const char *best = NULL;
    size_t best_d = 4;
    for (size_t i = 0; i < NKEYS; i++) {
        size_t d = edit_distance(name, keys[i].name);
        if (d < best_d) {
            best_d = d;
            best = keys[i].name;
        }
    }
    return best;
}

static void format_range(const prism_config_key *k, char *buf, size_t len)
{
    if (k->type == PRISM_CFG_INT)
        snprintf(buf, len, "[%.0f, %.0f]", k->min, k->max);
    else
        snprintf(buf, len, "%c%g, %g]", k->min_exclusive ? '(' : '[', k->min, k->max);
}

static int compare_u32(const void *a, const void *b)
{
    uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
    return (x > y) - (x < y);
}

static prism_status parse_blocks(const prism_config_key *k, const char *prefix, const json_t *v,
                                 prism_block_list *out, prism_error *err)
{
    if (!json_is_array(v))
        return prism_error_set(err, PRISM_ERR_INVALID, "%s%s: expected an array of block ids, got %s",
                               prefix, k->name, json_type_name(v));
    size_t n = json_array_size(v);
    uint32_t *ids = n ? malloc(n * sizeof *ids) : NULL;
    if (n && !ids)
        return prism_error_set(err, PRISM_ERR_NOMEM, "out of memory");
    for (size_t i = 0; i < n; i++) {
        const json_t *e = json_array_get(v, i);
        json_int_t id = json_is_integer(e) ? json_integer_value(e) : -1;
        if (!json_is_integer(e) || id < 0 || id > (json_int_t)UINT32_MAX) {
            free(ids);
            char got[64];
            if (json_is_integer(e))
                snprintf(got, sizeof got, "%lld", (long long)json_integer_value(e));
            else
                snprintf(got, sizeof got, "%s", json_type_name(e));
            return prism_error_set(err, PRISM_ERR_INVALID,
                                   "%s%s[%zu]: expected a block id (an integer from 0 to 4294967295), got %s",
                                   prefix, k->name, i, got);
        }
        ids[i] = (uint32_t)id;
    }
    /* Sorted and without repeats, so lookups can bisect. */
    if (n)
        qsort(ids, n, sizeof *ids, compare_u32);
    size_t m = 0;
    for (size_t i = 0; i < n; i++)
        if (m == 0 || ids[m - 1] != ids[i])
            ids[m++] = ids[i];
    free(out->ids);
    out->ids = ids;
    out->count = m;
    return PRISM_OK;
}

static void free_names(prism_name_list *l)
{
    for (size_t i = 0; i < l->count; i++)
        free(l->names[i]);
    free(l->names);
    memset(l, 0, sizeof *l);
}

/* null, or an array of at most PRISM_NAME_LIST_MAX strings of 1 to PRISM_NAME_MAX bytes without
 * NUL; out is replaced only on success. */
static prism_status parse_names(const prism_config_key *k, const char *prefix, const json_t *v, prism_name_list *out,
                                prism_error *err)
{
    prism_name_list l = {0};
    if (json_is_null(v)) {
        free_names(out);
        return PRISM_OK;
    }
    if (!json_is_array(v))
        return prism_error_set(err, PRISM_ERR_INVALID, "%s%s: expected null or an array of names, got %s", prefix,
                               k->name, json_type_name(v));
    size_t n = json_array_size(v);
    if (n > PRISM_NAME_LIST_MAX)
        return prism_error_set(err, PRISM_ERR_INVALID, "%s%s: %zu names, at most %d", prefix, k->name, n,
                               PRISM_NAME_LIST_MAX);
    l.given = true;
    l.names = calloc(n ? n : 1, sizeof *l.names);
    if (!l.names)
        return prism_error_set(err, PRISM_ERR_NOMEM, "out of memory");
    for (size_t i = 0; i < n; i++) {
        const json_t *e = json_array_get(v, i);
        const char *s = json_is_string(e) ? json_string_value(e) : NULL;
        const char *problem = !s                                          ? NULL
                              : strlen(s) != json_string_length(e)        ? "contains a NUL"
                              : s[0] == '\0'                              ? "is empty"
                              : strlen(s) > PRISM_NAME_MAX                ? "is longer than 255 bytes"
                                                                          : NULL;
        if (!s || problem) {
            prism_status st = !s ? prism_error_set(err, PRISM_ERR_INVALID, "%s%s[%zu]: expected a string, got %s",
                                                   prefix, k->name, i, json_type_name(e))
                                 : prism_error_set(err, PRISM_ERR_INVALID, "%s%s[%zu]: the name %s", prefix, k->name,
                                                   i, problem);
            free_names(&l);
            return st;
        }
        if (!(l.names[i] = strdup(s))) {
            free_names(&l);
            return prism_error_set(err, PRISM_ERR_NOMEM, "out of memory");
        }
        l.count = i + 1;
    }
    free_names(out);
    *out = l;
    return PRISM_OK;
}

static prism_status copy_names(prism_name_list *dst, const prism_name_list *src)
{
    memset(dst, 0, sizeof *dst);
    if (!src->given)
        return PRISM_OK;
    dst->names = calloc(src->count ? src->count : 1, sizeof *dst->names);
    if (!dst->names)
        return PRISM_ERR_NOMEM;
    dst->given = true;
    for (size_t i = 0; i < src->count; i++) {
        if (!(dst->names[i] = strdup(src->names[i]))) {
            free_names(dst);
            return PRISM_ERR_NOMEM;
        }
        dst->count = i + 1;
    }
    return PRISM_OK;
}

/* An array of 1 to PRISM_LOW_FORMATS_MAX distinct low format names; out is replaced only on
 * success. Errors name the element. */
static prism_status parse_formats(const prism_config_key *k, const char *prefix, const json_t *v,
                                  prism_format_list *out, prism_error *err)
{
    if (!json_is_array(v))
        return prism_error_set(err, PRISM_ERR_INVALID, "%s%s: expected an array of low format names, got %s", prefix,
                               k->name, json_type_name(v));
    size_t n = json_array_size(v);
    if (n == 0 || n > PRISM_LOW_FORMATS_MAX)
        return prism_error_set(err, PRISM_ERR_INVALID, "%s%s: %zu formats, expected 1 to %d", prefix, k->name, n,
                               PRISM_LOW_FORMATS_MAX);
    prism_format_list l = {{PRISM_PRECISION_BF16}, 0};
    for (size_t i = 0; i < n; i++) {
        const json_t *e = json_array_get(v, i);
        const char *s = json_is_string(e) ? json_string_value(e) : NULL;
        prism_precision f;
        if (!s)
            return prism_error_set(err, PRISM_ERR_INVALID, "%s%s[%zu]: expected a format name, got %s", prefix,
                                   k->name, i, json_type_name(e));
        if (!prism_precision_parse(s, &f) || f == PRISM_PRECISION_BF16 || strlen(s) != json_string_length(e))
            return prism_error_set(err, PRISM_ERR_INVALID,
                                   "%s%s[%zu]: \"%.32s\" is not one of \"int8\", \"fp8_e4m3\", \"fp8_e5m2\", \"int4\"",
                                   prefix, k->name, i, s);
        for (size_t j = 0; j < i; j++)
            if (l.formats[j] == f)
                return prism_error_set(err, PRISM_ERR_INVALID, "%s%s[%zu]: \"%s\" repeats %s[%zu]", prefix, k->name,
                                       i, s, k->name, j);
        l.formats[l.count++] = f;
    }
    *out = l;
    return PRISM_OK;
}

/* Every enum field of prism_config is written through an int (choices). */
_Static_assert(sizeof(prism_mode) == sizeof(int) && sizeof(prism_ambiguous) == sizeof(int) &&
                   sizeof(prism_precision) == sizeof(int) && sizeof(prism_hybrid_low_choice) == sizeof(int) &&
                   sizeof(prism_scale_mode) == sizeof(int),
               "config choice fields must be int-sized");

static bool in_range(const prism_config_key *k, double x)
{
    bool low = k->min_exclusive ? x <= k->min : x < k->min;
    return isfinite(x) && !low && x <= k->max;
}

const char *prism_config_file_name_problem(const char *s)
{
    if (!s || !s[0])
        return "is empty";
    if (strlen(s) > PRISM_CONFIG_FILE_NAME_MAX)
        return "is longer than 255 bytes (NAME_MAX)";
    if (strcmp(s, ".") == 0 || strcmp(s, "..") == 0)
        return "names a directory (\".\" or \"..\")";
    if (strcmp(s, PRISM_CONFIG_RESERVED_FILE_NAME) == 0)
        return "is reserved: prismd keeps the job's binary trace in the directory \"trace\" of the job's directory";
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        if (*p == '/')
            return "contains '/' (a plain file name inside the job's directory)";
        if (*p < 0x20 || *p == 0x7f)
            return "contains a control character";
    }
    return NULL;
}

static prism_status set_key(prism_config *cfg, const prism_config_key *k, const char *prefix,
                            const json_t *v, prism_error *err)
{
    char *field = (char *)cfg + k->offset;
    char range[64];
    switch (k->type) {
    case PRISM_CFG_BOOL:
        if (!json_is_boolean(v))
            return prism_error_set(err, PRISM_ERR_INVALID, "%s%s: expected true or false, got %s", prefix,
                                   k->name, json_type_name(v));
        *(bool *)field = json_is_true(v);
        return PRISM_OK;
    case PRISM_CFG_INT: {
        if (!json_is_integer(v))
            return prism_error_set(err, PRISM_ERR_INVALID, "%s%s: expected an integer, got %s", prefix,
                                   k->name, json_type_name(v));
        json_int_t x = json_integer_value(v);
        if (!in_range(k, (double)x)) {
            format_range(k, range, sizeof range);
            return prism_error_set(err, PRISM_ERR_INVALID, "%s%s: %lld is outside %s", prefix, k->name,
                                   (long long)x, range);
        }
        *(int64_t *)field = (int64_t)x;
        return PRISM_OK;
    }
    case PRISM_CFG_DOUBLE: {
        if (!json_is_number(v))
            return prism_error_set(err, PRISM_ERR_INVALID, "%s%s: expected a number, got %s", prefix,
                                   k->name, json_type_name(v));
        double x = json_number_value(v);
        if (!in_range(k, x)) {
            format_range(k, range, sizeof range);
            return prism_error_set(err, PRISM_ERR_INVALID, "%s%s: %g is outside %s", prefix, k->name, x,
                                   range);
        }
        *(double *)field = x;
        return PRISM_OK;
    }
    case PRISM_CFG_CHOICE: {
        const char *s = json_is_string(v) ? json_string_value(v) : NULL;
        for (const prism_config_choice *c = k->choices; s && c->name; c++) {
            if (strcmp(c->name, s) == 0) {
                /* Every choice field is an enum whose values fit in an int. */
                int value = c->value;
                memcpy(field, &value, sizeof value);
                return PRISM_OK;
            }
        }
        char list[160] = "";
        for (const prism_config_choice *c = k->choices; c->name; c++) {
            size_t used = strlen(list);
            snprintf(list + used, sizeof list - used, "%s\"%s\"", used ? ", " : "", c->name);
        }
        if (!s)
            return prism_error_set(err, PRISM_ERR_INVALID, "%s%s: expected one of %s, got %s", prefix,
                                   k->name, list, json_type_name(v));
        return prism_error_set(err, PRISM_ERR_INVALID, "%s%s: \"%s\" is not one of %s", prefix, k->name, s,
                               list);
    }
    case PRISM_CFG_STRING: {
        if (!json_is_string(v))
            return prism_error_set(err, PRISM_ERR_INVALID, "%s%s: expected a string, got %s", prefix,
                                   k->name, json_type_name(v));
        const char *s = json_string_value(v);
        const char *problem = strlen(s) != json_string_length(v) ? "contains a NUL" : prism_config_file_name_problem(s);
        if (problem)
            return prism_error_set(err, PRISM_ERR_INVALID, "%s%s: \"%.64s%s\" %s", prefix, k->name, s,
                                   strlen(s) > 64 ? "..." : "", problem);
        char *copy = strdup(s);
        if (!copy)
            return prism_error_set(err, PRISM_ERR_NOMEM, "out of memory");
        free(*(char **)field);
        *(char **)field = copy;
        return PRISM_OK;
    }
    case PRISM_CFG_BLOCKS:
        return parse_blocks(k, prefix, v, (prism_block_list *)field, err);
    case PRISM_CFG_NAMES:
        return parse_names(k, prefix, v, (prism_name_list *)field, err);
    case PRISM_CFG_FORMATS:
        return parse_formats(k, prefix, v, (prism_format_list *)field, err);
    }
    return prism_error_set(err, PRISM_ERR_INVALID, "%s%s: unsupported type", prefix, k->name);
}

bool prism_block_list_contains(const prism_block_list *list, uint32_t id)
{
    size_t lo = 0, hi = list->count;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (list->ids[mid] == id)
            return true;
        if (list->ids[mid] < id)
            lo = mid + 1;
        else
            hi = mid;
    }
    return false;
}

prism_status prism_config_validate(const prism_config *cfg, prism_error *err)
{
    /* Ranges again, for configs built in code rather than parsed. */
    for (size_t i = 0; i < NKEYS; i++) {
        const prism_config_key *k = &keys[i];
        const char *field = (const char *)cfg + k->offset;
        double x;
        if (k->type == PRISM_CFG_CHOICE) {
            int value;
            memcpy(&value, field, sizeof value);
            const prism_config_choice *c = k->choices;
            while (c->name && c->value != value)
                c++;
            if (!c->name)
                return prism_error_set(err, PRISM_ERR_INVALID, "%s: %d is not a valid choice", k->name, value);
            continue;
        }
        if (k->type == PRISM_CFG_INT)
            x = (double)*(const int64_t *)field;
        else if (k->type == PRISM_CFG_DOUBLE)
            x = *(const double *)field;
        else
            continue;
        if (!in_range(k, x)) {
            char range[64];
            format_range(k, range, sizeof range);
            return prism_error_set(err, PRISM_ERR_INVALID, "%s: %g is outside %s", k->name, x, range);
        }
    }
    const prism_format_list *lf = &cfg->low_formats;
    if (lf->count == 0 || lf->count > PRISM_LOW_FORMATS_MAX)
        return prism_error_set(err, PRISM_ERR_INVALID, "low_formats: %zu formats, expected 1 to %d", lf->count,
                               PRISM_LOW_FORMATS_MAX);
    for (size_t i = 0; i < lf->count; i++) {
        if (lf->formats[i] == PRISM_PRECISION_BF16 || (unsigned)lf->formats[i] >= PRISM_PRECISION_COUNT)
            return prism_error_set(err, PRISM_ERR_INVALID, "low_formats[%zu]: %d is not a low format", i,
                                   (int)lf->formats[i]);
        for (size_t j = 0; j < i; j++)
            if (lf->formats[j] == lf->formats[i])
                return prism_error_set(err, PRISM_ERR_INVALID, "low_formats[%zu]: \"%s\" repeats low_formats[%zu]",
                                       i, prism_precision_name(lf->formats[i]), j);
    }
    const char *problem = prism_config_file_name_problem(cfg->telemetry_file);
    if (problem)
        return prism_error_set(err, PRISM_ERR_INVALID, "telemetry_file: %s", problem);
    if (cfg->int8_threshold >= cfg->bf16_threshold)
        return prism_error_set(err, PRISM_ERR_INVALID,
                               "int8_threshold: must be less than bf16_threshold (%g >= %g)",
                               cfg->int8_threshold, cfg->bf16_threshold);
    for (size_t i = 0; i < cfg->force_int8_blocks.count; i++) {
        uint32_t id = cfg->force_int8_blocks.ids[i];
        if (prism_block_list_contains(&cfg->force_bf16_blocks, id))
            return prism_error_set(err, PRISM_ERR_INVALID,
                                   "force_int8_blocks: block %u is also in force_bf16_blocks", id);
    }
    return PRISM_OK;
}

void prism_config_free(prism_config *cfg)
{
    if (!cfg)
        return;
    free(cfg->force_bf16_blocks.ids);
    free(cfg->force_int8_blocks.ids);
    free(cfg->telemetry_file);
    free_names(&cfg->hybrid_fixed_classes);
    memset(cfg, 0, sizeof *cfg);
}

static prism_status copy_list(prism_block_list *dst, const prism_block_list *src)
{
    dst->ids = NULL;
    dst->count = src->count;
    if (!src->count)
        return PRISM_OK;
    dst->ids = malloc(src->count * sizeof *dst->ids);
    if (!dst->ids)
        return PRISM_ERR_NOMEM;
    memcpy(dst->ids, src->ids, src->count * sizeof *dst->ids);
    return PRISM_OK;
}

prism_status prism_config_copy(prism_config *dst, const prism_config *src, prism_error *err)
{
    prism_config tmp = *src;
    tmp.force_bf16_blocks.ids = tmp.force_int8_blocks.ids = NULL;
    tmp.telemetry_file = NULL;
    memset(&tmp.hybrid_fixed_classes, 0, sizeof tmp.hybrid_fixed_classes);
    if (copy_list(&tmp.force_bf16_blocks, &src->force_bf16_blocks) ||
        copy_list(&tmp.force_int8_blocks, &src->force_int8_blocks) ||
        copy_names(&tmp.hybrid_fixed_classes, &src->hybrid_fixed_classes) ||
        (src->telemetry_file && !(tmp.telemetry_file = strdup(src->telemetry_file)))) {
        prism_config_free(&tmp);
        return prism_error_set(err, PRISM_ERR_NOMEM, "out of memory");
    }
    *dst = tmp;
    return PRISM_OK;
}

prism_status prism_config_apply_json(const prism_config *base, const json_t *obj, const char *key_prefix,
                                     prism_config *out, prism_error *err)
{
    const char *prefix = key_prefix ? key_prefix : "";
    if (!json_is_object(obj))
        return prism_error_set(err, PRISM_ERR_INVALID, "%sexpected a JSON object of policy settings, got %s",
                               prefix, json_type_name(obj));
    prism_config tmp;
    prism_status st = prism_config_copy(&tmp, base, err);
    if (st)
        return st;
    const char *name;
    json_t *value;
    json_object_foreach((json_t *)obj, name, value) {
        const prism_config_key *k = find_key(name);
        if (!k) {
            const char *hint = nearest_key(name);
            if (hint)
                st = prism_error_set(err, PRISM_ERR_INVALID, "%s%s: unknown key (did you mean %s?)", prefix,
                                     name, hint);
            else
                st = prism_error_set(err, PRISM_ERR_INVALID, "%s%s: unknown key", prefix, name);
            break;
        }
        if ((st = set_key(&tmp, k, prefix, value, err)))
            break;
    }
    if (!st && (st = prism_config_validate(&tmp, err)) && prefix[0] && err) {
        /* The message starts with the key; the prefix ends with a dot and goes right before it. */
        char message[sizeof err->message];
        memcpy(message, err->message, sizeof message);
        prism_error_set(err, st, "%s%s", prefix, message);
    }
    if (st) {
        prism_config_free(&tmp);
        return st;
    }
    if (out == base) {
        prism_config_free(out);
    }
    *out = tmp;
    return PRISM_OK;
}

prism_status prism_config_init(prism_config *cfg, prism_error *err)
{
    /* The defaults are parsed from the table's own JSON text. */
    prism_config empty;
    memset(&empty, 0, sizeof empty);
    json_t *obj = json_object();
    if (!obj)
        return prism_error_set(err, PRISM_ERR_NOMEM, "out of memory");
    for (size_t i = 0; i < NKEYS; i++) {
        json_error_t jerr;
        json_t *v = json_loads(keys[i].default_text, JSON_DECODE_ANY, &jerr);
        if (!v || json_object_set_new(obj, keys[i].name, v)) {
            json_decref(obj);
            return prism_error_set(err, PRISM_ERR_INVALID, "default of %s does not parse", keys[i].name);
        }
    }
    prism_status st = prism_config_apply_json(&empty, obj, "", cfg, err);
    json_decref(obj);
    return st;
}

static const char *const nested_path[] = {"memory", "stagehand", "selective_precision"};

prism_status prism_config_load_buffer(const char *text, size_t len, const char *source, prism_config *out,
                                      prism_error *err)
{
    json_error_t jerr;
    json_t *root = json_loadb(text, len, JSON_REJECT_DUPLICATES, &jerr);
    if (!root)
        return prism_error_set(err, PRISM_ERR_INVALID, "%s:%d:%d: JSON syntax error: %s", source, jerr.line,
                               jerr.column, jerr.text);
    prism_status st = PRISM_OK;
    if (!json_is_object(root)) {
        st = prism_error_set(err, PRISM_ERR_INVALID, "%s: expected a JSON object at the top level, got %s",
                             source, json_type_name(root));
        json_decref(root);
        return st;
    }
    json_t *section = root;
    char prefix[128] = "";
    if (json_object_get(root, "memory")) {
        /* The nested training config: only the selective_precision section is ours. */
        for (size_t i = 0; i < 3; i++) {
            size_t used = strlen(prefix);
            json_t *next = json_object_get(section, nested_path[i]);
            snprintf(prefix + used, sizeof prefix - used, "%s", nested_path[i]);
            if (!next || !json_is_object(next)) {
                st = prism_error_set(err, PRISM_ERR_INVALID, "%s: %s: %s", source, prefix,
                                     next ? "expected an object" : "missing (nested config form)");
                json_decref(root);
                return st;
            }
            section = next;
            used = strlen(prefix);
            snprintf(prefix + used, sizeof prefix - used, ".");
        }
    }
    prism_config base;
    if ((st = prism_config_init(&base, err))) {
        json_decref(root);
        return st;
    }
    st = prism_config_apply_json(&base, section, prefix, out, err);
    if (st)
        prism_error_prefix(err, "%s", source);
    prism_config_free(&base);
    json_decref(root);
    return st;
}

prism_status prism_config_load_file(const char *path, prism_config *out, prism_error *err)
{
    size_t len = 0;
    char *buf = prism_file_read(path, &len, err);
    if (!buf)
        return err ? err->status : PRISM_ERR_IO;
    prism_status st = prism_config_load_buffer(buf, len, path, out, err);
    free(buf);
    return st;
}

static const char *choice_name(const prism_config_key *k, int value)
{
    for (const prism_config_choice *c = k->choices; c->name; c++)
        if (c->value == value)
            return c->name;
    return "?";
}

json_t *prism_config_to_json(const prism_config *cfg)
{
    json_t *obj = json_object();
    for (size_t i = 0; obj && i < NKEYS; i++) {
        const prism_config_key *k = &keys[i];
        const char *field = (const char *)cfg + k->offset;
        json_t *v = NULL;
        switch (k->type) {
        case PRISM_CFG_BOOL: v = json_boolean(*(const bool *)field); break;
        case PRISM_CFG_INT: v = json_integer((json_int_t) * (const int64_t *)field); break;
        case PRISM_CFG_DOUBLE: v = json_real(*(const double *)field); break;
        case PRISM_CFG_CHOICE: {
            int value;
            memcpy(&value, field, sizeof value);
            v = json_string(choice_name(k, value));
            break;
        }
        case PRISM_CFG_STRING: v = json_string(*(char *const *)field ? *(char *const *)field : ""); break;
        case PRISM_CFG_BLOCKS: {
            const prism_block_list *l = (const prism_block_list *)field;
            v = json_array();
            for (size_t j = 0; v && j < l->count; j++)
                json_array_append_new(v, json_integer(l->ids[j]));
            break;
        }
        case PRISM_CFG_NAMES: {
            const prism_name_list *l = (const prism_name_list *)field;
            v = l->given ? json_array() : json_null();
            for (size_t j = 0; l->given && v && j < l->count; j++)
                json_array_append_new(v, json_string(l->names[j]));
            break;
        }
        case PRISM_CFG_FORMATS: {
            const prism_format_list *l = (const prism_format_list *)field;
            v = json_array();
            for (size_t j = 0; v && j < l->count; j++)
                json_array_append_new(v, json_string(prism_precision_name(l->formats[j])));
            break;
        }
        }
        if (!v || json_object_set_new(obj, k->name, v)) {
            json_decref(obj);
            return NULL;
        }
    }
    return obj;
}

char *prism_json_dumps_exact(const json_t *obj, size_t flags)
{
    char *text = json_dumps(obj, flags | JSON_REAL_PRECISION(15));
    json_t *back = text ? json_loads(text, 0, NULL) : NULL;
    bool exact = back && json_equal(back, (json_t *)obj);
    json_decref(back);
    if (exact)
        return text;
    free(text);
    return json_dumps(obj, flags | JSON_REAL_PRECISION(17));
}

void prism_config_print_help(FILE *out)
{
    static const char *const type_names[] = {"bool", "integer", "number", "choice", "string", "block ids",
                                              "names or null", "low formats"};
    for (size_t i = 0; i < NKEYS; i++) {
        const prism_config_key *k = &keys[i];
        char range[64] = "";
        if (k->type == PRISM_CFG_INT || k->type == PRISM_CFG_DOUBLE)
            format_range(k, range, sizeof range);
        if (k->type == PRISM_CFG_CHOICE) {
            for (const prism_config_choice *c = k->choices; c->name; c++) {
                size_t used = strlen(range);
                snprintf(range + used, sizeof range - used, "%s%s", used ? "|" : "", c->name);
            }
        }
        fprintf(out, "  %-28s %s%s%s, default %s\n      %s\n", k->name, type_names[k->type], range[0] ? " " : "",
                range, k->default_text, k->help);
    }
}

const char *prism_low_precision_name(prism_precision low)
{
    return low == PRISM_LOW_AUTO ? "auto" : prism_precision_name(low);
}

prism_precision prism_config_low_format(const prism_config *cfg)
{
    if (cfg->low_precision != PRISM_LOW_AUTO)
        return cfg->low_precision;
    assert(cfg->low_formats.count > 0); /* validation: "auto" needs at least one format */
    return cfg->low_formats.count ? cfg->low_formats.formats[cfg->low_formats.count - 1] : PRISM_PRECISION_INT8;
}
