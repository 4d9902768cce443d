/* Parsing of replay trace lines (trace.h). Strict: unknown keys, wrong types and out-of-range
 * values are errors that name the field, so a typo in a trace never replays silently. */
#include "trace.h"

#include "json_kind.h"

#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void prism_trace_record_init(prism_trace_record *r)
{
    memset(r, 0, sizeof *r);
}

void prism_trace_record_free(prism_trace_record *r)
{
    free(r->blocks);
    free(r->entries);
    free(r->job_id);
    free(r->config_json);
    memset(r, 0, sizeof *r);
}

/* Rejects keys of obj that are not in allowed (NULL-terminated). */
static prism_status only_keys(const json_t *obj, const char *const *allowed, const char *where, prism_error *err)
{
    const char *key;
    json_t *value;
    json_object_foreach((json_t *)obj, key, value) {
        bool ok = false;
        for (const char *const *a = allowed; *a && !ok; a++)
            ok = strcmp(*a, key) == 0;
        if (!ok)
            return prism_error_set(err, PRISM_ERR_INVALID, "%s%s: unknown key", where, key);
    }
    return PRISM_OK;
}

static prism_status get_uint(const json_t *obj, const char *key, const char *where, bool required, uint64_t max,
                             uint64_t *out, prism_error *err)
{
    const json_t *v = json_object_get(obj, key);
    if (!v) {
        if (required)
            return prism_error_set(err, PRISM_ERR_INVALID, "%s%s: missing", where, key);
        return PRISM_OK;
    }
    if (!json_is_integer(v) || json_integer_value(v) < 0 || (uint64_t)json_integer_value(v) > max)
        return prism_error_set(err, PRISM_ERR_INVALID, "%s%s: expected an integer from 0 to %llu, got %s", where,
                               key, (unsigned long long)max,
                               json_is_integer(v) ? "one out of range" : prism_json_kind(v));
    *out = (uint64_t)json_integer_value(v);
    return PRISM_OK;
}

static prism_status get_number(const json_t *obj, const char *key, const char *where, bool required,
                               bool non_negative, double *out, prism_error *err)
{
    const json_t *v = json_object_get(obj, key);
    if (!v) {
        if (required)
            return prism_error_set(err, PRISM_ERR_INVALID, "%s%s: missing", where, key);
        return PRISM_OK;
    }
    if (!json_is_number(v))
        return prism_error_set(err, PRISM_ERR_INVALID, "%s%s: expected a number, got %s", where, key,
                               prism_json_kind(v));
    double x = json_number_value(v);
    if (non_negative && x < 0)
        return prism_error_set(err, PRISM_ERR_INVALID, "%s%s: %g is negative", where, key, x);
    *out = x;
    return PRISM_OK;
}

prism_status prism_trace_reserve(void **arr, size_t *cap, size_t need, size_t size, prism_error *err)
{
    if (*cap >= need)
        return PRISM_OK;
    size_t ncap = *cap ? *cap : 64;
    while (ncap < need && ncap <= SIZE_MAX / 2)
        ncap *= 2;
    if (ncap < need || ncap > SIZE_MAX / size)
        return prism_error_set(err, PRISM_ERR_NOMEM, "out of memory");
    void *n = realloc(*arr, ncap * size);
    if (!n)
        return prism_error_set(err, PRISM_ERR_NOMEM, "out of memory");
    *arr = n;
    *cap = ncap;
    return PRISM_OK;
}

static int compare_u32(const void *a, const void *b)
{
    uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
    return (x > y) - (x < y);
}

/* A block id may appear once per line; sorting a copy finds a repeat in n log n. */
prism_status prism_trace_check_unique_ids(const prism_block_stats *blocks, size_t n, prism_error *err)
{
    if (n < 2)
        return PRISM_OK;
    uint32_t *ids = malloc(n * sizeof *ids);
    if (!ids)
        return prism_error_set(err, PRISM_ERR_NOMEM, "out of memory");
    for (size_t i = 0; i < n; i++)
        ids[i] = blocks[i].block_id;
    qsort(ids, n, sizeof *ids, compare_u32);
    bool repeated = false;
    uint32_t id = 0;
    for (size_t i = 1; i < n && !repeated; i++)
        if (ids[i] == ids[i - 1]) {
            repeated = true;
            id = ids[i];
        }
    free(ids);
    if (!repeated)
        return PRISM_OK;
    size_t second = 0;
    for (size_t i = 0, seen = 0; i < n; i++)
        if (blocks[i].block_id == id && ++seen == 2)
            second = i;
    return prism_error_set(err, PRISM_ERR_INVALID, "blocks[%zu].id: block %u appears twice in this line", second, id);
}

static prism_status parse_step(const json_t *root, prism_trace_record *r, prism_error *err)
{
    static const char *const keys[] = {"step", "rank", "loss", "blocks", NULL};
    static const char *const block_keys[] = {"id",        "l2",        "max_abs",     "mean", "variance",
                                             "numel",     "nonfinite", "saturated", "underflowed", NULL};
    prism_status st;
    uint64_t rank = 0;
    if ((st = only_keys(root, keys, "", err)) ||
        (st = get_uint(root, "step", "", true, PRISM_STEP_MAX, &r->step, err)) ||
        (st = get_uint(root, "rank", "", false, UINT32_MAX - 1, &rank, err)))
        return st;
    r->rank = (uint32_t)rank;
    const json_t *loss = json_object_get(root, "loss");
    r->has_loss = loss && !json_is_null(loss);
    if (r->has_loss && (st = get_number(root, "loss", "", true, false, &r->loss, err)))
        return st;
    const json_t *blocks = json_object_get(root, "blocks");
    if (!blocks)
        return prism_error_set(err, PRISM_ERR_INVALID, "blocks: missing");
    if (!json_is_array(blocks))
        return prism_error_set(err, PRISM_ERR_INVALID, "blocks: expected an array, got %s", prism_json_kind(blocks));
    size_t n = json_array_size(blocks);
    if ((st = prism_trace_reserve((void **)&r->blocks, &r->cap_blocks, n, sizeof *r->blocks, err)))
        return st;
    for (size_t i = 0; i < n; i++) {
        const json_t *b = json_array_get(blocks, i);
        char where[48];
        snprintf(where, sizeof where, "blocks[%zu].", i);
        if (!json_is_object(b))
            return prism_error_set(err, PRISM_ERR_INVALID, "blocks[%zu]: expected an object, got %s", i,
                                   prism_json_kind(b));
        prism_block_stats *s = &r->blocks[i];
        memset(s, 0, sizeof *s);
        uint64_t id = 0;
        if ((st = only_keys(b, block_keys, where, err)) ||
            (st = get_uint(b, "id", where, true, UINT32_MAX, &id, err)) ||
            (st = get_number(b, "l2", where, true, true, &s->l2_norm, err)) ||
            (st = get_number(b, "max_abs", where, true, true, &s->max_abs, err)) ||
            (st = get_number(b, "mean", where, false, false, &s->mean, err)) ||
            (st = get_number(b, "variance", where, false, true, &s->variance, err)) ||
            (st = get_uint(b, "numel", where, true, INT64_MAX, &s->numel, err)) ||
            (st = get_uint(b, "nonfinite", where, false, INT64_MAX, &s->nonfinite, err)))
            return st;
        s->block_id = (uint32_t)id;
        if (s->nonfinite > s->numel)
            return prism_error_set(err, PRISM_ERR_INVALID, "%snonfinite: %llu exceeds numel %llu", where,
                                   (unsigned long long)s->nonfinite, (unsigned long long)s->numel);
        /* Issue 17: the step's saturated and underflowed fractions, both or neither, in [0, 1]. */
        bool sat = json_object_get(b, "saturated") != NULL, und = json_object_get(b, "underflowed") != NULL;
        if (sat != und)
            return prism_error_set(err, PRISM_ERR_INVALID, "%s%s: missing (saturated and underflowed come together)",
                                   where, sat ? "underflowed" : "saturated");
        if (sat) {
            if ((st = get_number(b, "saturated", where, true, true, &s->saturated_fraction, err)) ||
                (st = get_number(b, "underflowed", where, true, true, &s->underflowed_fraction, err)))
                return st;
            if (s->saturated_fraction > 1)
                return prism_error_set(err, PRISM_ERR_INVALID, "%ssaturated: %g is above 1", where,
                                       s->saturated_fraction);
            if (s->underflowed_fraction > 1)
                return prism_error_set(err, PRISM_ERR_INVALID, "%sunderflowed: %g is above 1", where,
                                       s->underflowed_fraction);
            s->has_saturation = true;
        }
    }
    if ((st = prism_trace_check_unique_ids(r->blocks, n, err)))
        return st;
    r->count = n;
    r->kind = PRISM_TRACE_STEP;
    return PRISM_OK;
}

static prism_status parse_calibration(const json_t *root, prism_trace_record *r, prism_error *err)
{
    static const char *const keys[] = {"format", "errors", NULL};
    const json_t *cal = json_object_get(root, "calibration");
    prism_status st;
    if (json_object_size(root) != 1)
        return prism_error_set(err, PRISM_ERR_INVALID, "a calibration line has only the key \"calibration\"");
    if (!json_is_object(cal))
        return prism_error_set(err, PRISM_ERR_INVALID, "calibration: expected an object, got %s", prism_json_kind(cal));
    if ((st = only_keys(cal, keys, "calibration.", err)))
        return st;
    const json_t *fmt = json_object_get(cal, "format");
    if (!fmt)
        return prism_error_set(err, PRISM_ERR_INVALID, "calibration.format: missing");
    if (!json_is_string(fmt) || !prism_precision_parse(json_string_value(fmt), &r->format) ||
        r->format == PRISM_PRECISION_BF16)
        return prism_error_set(err, PRISM_ERR_INVALID,
                               "calibration.format: expected one of \"int8\", \"fp8_e4m3\", \"fp8_e5m2\", \"int4\"");
    const json_t *errors = json_object_get(cal, "errors");
    if (!errors)
        return prism_error_set(err, PRISM_ERR_INVALID, "calibration.errors: missing");
    if (!json_is_object(errors))
        return prism_error_set(err, PRISM_ERR_INVALID, "calibration.errors: expected an object, got %s",
                               prism_json_kind(errors));
    if ((st = prism_trace_reserve((void **)&r->entries, &r->cap_entries, json_object_size(errors),
                                  sizeof *r->entries, err)))
        return st;
    size_t n = 0;
    const char *key;
    json_t *value;
    json_object_foreach((json_t *)errors, key, value) {
        char *end = NULL;
        unsigned long long id = strtoull(key, &end, 10);
        if (key[0] < '0' || key[0] > '9' || *end || id > UINT32_MAX)
            return prism_error_set(err, PRISM_ERR_INVALID, "calibration.errors.%s: key is not a block id", key);
        if (!json_is_number(value) || json_number_value(value) < 0 || !isfinite(json_number_value(value)))
            return prism_error_set(err, PRISM_ERR_INVALID, "calibration.errors.%s: expected a number >= 0", key);
        r->entries[n].block_id = (uint32_t)id;
        r->entries[n].value = json_number_value(value);
        r->entries[n].bytes = 0;
        n++;
    }
    r->count = n;
    r->kind = PRISM_TRACE_CALIBRATION;
    return PRISM_OK;
}

static prism_status parse_layout(const json_t *root, prism_trace_record *r, prism_error *err)
{
    static const char *const keys[] = {"blocks", NULL};
    static const char *const block_keys[] = {"id", "name", "param_bytes_bf16", NULL};
    const json_t *layout = json_object_get(root, "layout");
    prism_status st;
    if (json_object_size(root) != 1)
        return prism_error_set(err, PRISM_ERR_INVALID, "a layout line has only the key \"layout\"");
    if (!json_is_object(layout))
        return prism_error_set(err, PRISM_ERR_INVALID, "layout: expected an object, got %s", prism_json_kind(layout));
    if ((st = only_keys(layout, keys, "layout.", err)))
        return st;
    const json_t *blocks = json_object_get(layout, "blocks");
    if (!json_is_array(blocks))
        return prism_error_set(err, PRISM_ERR_INVALID, "layout.blocks: expected an array");
    size_t n = json_array_size(blocks);
    if ((st = prism_trace_reserve((void **)&r->entries, &r->cap_entries, n, sizeof *r->entries, err)))
        return st;
    for (size_t i = 0; i < n; i++) {
        const json_t *b = json_array_get(blocks, i);
        char where[48];
        snprintf(where, sizeof where, "layout.blocks[%zu].", i);
        if (!json_is_object(b))
            return prism_error_set(err, PRISM_ERR_INVALID, "layout.blocks[%zu]: expected an object", i);
        uint64_t id = 0, bytes = 0;
        if ((st = only_keys(b, block_keys, where, err)) || (st = get_uint(b, "id", where, true, UINT32_MAX, &id, err)) ||
            (st = get_uint(b, "param_bytes_bf16", where, true, INT64_MAX, &bytes, err)))
            return st;
        const json_t *name = json_object_get(b, "name");
        if (name && !json_is_string(name))
            return prism_error_set(err, PRISM_ERR_INVALID, "%sname: expected a string", where);
        r->entries[i] = (prism_trace_entry){(uint32_t)id, 0, bytes};
    }
    r->count = n;
    r->kind = PRISM_TRACE_LAYOUT;
    return PRISM_OK;
}

prism_status prism_trace_parse_line(const char *line, size_t len, prism_trace_record *r, prism_error *err)
{
    r->kind = PRISM_TRACE_BLANK;
    r->count = 0;
    r->has_loss = false;
    r->rank = 0;
    r->merged = false;
    r->ranks = 0;
    r->version_bumped = false;
    size_t i = 0;
    while (i < len && (line[i] == ' ' || line[i] == '\t' || line[i] == '\r' || line[i] == '\n'))
        i++;
    if (i == len)
        return PRISM_OK;
    json_error_t jerr;
    json_t *root = json_loadb(line, len, JSON_REJECT_DUPLICATES, &jerr);
    if (!root)
        return prism_error_set(err, PRISM_ERR_INVALID, "column %d: JSON syntax error: %s", jerr.column, jerr.text);
    prism_status st;
    if (!json_is_object(root))
        st = prism_error_set(err, PRISM_ERR_INVALID, "expected a JSON object, got %s", prism_json_kind(root));
    else if (json_object_get(root, "calibration"))
        st = parse_calibration(root, r, err);
    else if (json_object_get(root, "layout"))
        st = parse_layout(root, r, err);
    else
        st = parse_step(root, r, err);
    json_decref(root);
    return st;
}
