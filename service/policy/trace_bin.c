/* The binary trace: framing and the conversion between prism.v1.TraceRecord and
 * prism_trace_record (trace_bin.h). */
#define _POSIX_C_SOURCE 200809L
#include "trace_bin.h"

#include "prism/v1/prism.pb-c.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

bool prism_trace_is_binary(const char *data, size_t len)
{
    for (size_t i = 0; i < len; i++) {
        char c = data[i];
        if (c == ' ' || c == '\t' || c == '\r' || c == '\n')
            continue;
        return c != '{';
    }
    return false;
}

static size_t varint_put(uint8_t *out, uint64_t v)
{
    size_t n = 0;
    while (v >= 0x80) {
        out[n++] = (uint8_t)(v | 0x80);
        v >>= 7;
    }
    out[n++] = (uint8_t)v;
    return n;
}

/* Reads a varint of at most 10 bytes at data[*pos]; false when it is cut short or too long. */
static bool varint_get(const uint8_t *data, size_t len, size_t *pos, uint64_t *v)
{
    uint64_t x = 0;
    for (unsigned shift = 0, i = 0; i < 10 && *pos + i < len; i++, shift += 7) {
        uint8_t b = data[*pos + i];
        x |= (uint64_t)(b & 0x7f) << shift;
        if (!(b & 0x80)) {
            *pos += i + 1;
            *v = x;
            return true;
        }
    }
    return false;
}

/* Appends the framed record. */
static prism_status append_record(prism_buf *out, const Prism__V1__TraceRecord *rec, prism_error *err)
{
    size_t size = protobuf_c_message_get_packed_size(&rec->base);
    if (size > PRISM_TRACE_BIN_MAX_RECORD)
        return prism_error_set(err, PRISM_ERR_LIMIT, "a trace record of %zu bytes is over the %u-byte limit", size,
                               PRISM_TRACE_BIN_MAX_RECORD);
    if (out->cap - out->len < size + 10) {
        size_t ncap = out->cap ? out->cap : 4096;
        while (ncap - out->len < size + 10)
            ncap *= 2;
        char *n = realloc(out->data, ncap);
        if (!n)
            return prism_error_set(err, PRISM_ERR_NOMEM, "out of memory");
        out->data = n;
        out->cap = ncap;
    }
    uint8_t *at = (uint8_t *)out->data + out->len;
    size_t head = varint_put(at, size);
    protobuf_c_message_pack(&rec->base, at + head);
    out->len += head + size;
    return PRISM_OK;
}

static char *config_text(const prism_config *cfg, prism_error *err)
{
    json_t *obj = prism_config_to_json(cfg);
    char *text = obj ? prism_json_dumps_exact(obj, JSON_COMPACT) : NULL;
    json_decref(obj);
    if (!text)
        prism_error_set(err, PRISM_ERR_NOMEM, "out of memory");
    return text;
}

prism_status prism_trace_bin_header(prism_buf *out, const char *job_id, uint64_t segment, uint64_t unix_time_ms,
                                    const prism_config *in_force, bool restored, prism_error *err)
{
    return prism_trace_bin_segment_header(out, job_id, segment, unix_time_ms, in_force, restored, false, err);
}

prism_status prism_trace_bin_segment_header(prism_buf *out, const char *job_id, uint64_t segment,
                                            uint64_t unix_time_ms, const prism_config *in_force, bool restored,
                                            bool gap_before, prism_error *err)
{
    char *text = config_text(in_force, err);
    if (!text)
        return PRISM_ERR_NOMEM;
    Prism__V1__TraceHeader h = PRISM__V1__TRACE_HEADER__INIT;
    h.trace_version = PRISM_TRACE_BIN_VERSION;
    h.job_id = (char *)job_id;
    h.segment = segment;
    h.unix_time_ms = unix_time_ms;
    h.config_json = text;
    h.restored = restored;
    h.gap_before = gap_before;
    Prism__V1__TraceRecord rec = PRISM__V1__TRACE_RECORD__INIT;
    rec.record_case = PRISM__V1__TRACE_RECORD__RECORD_HEADER;
    rec.header = &h;
    prism_status st = append_record(out, &rec, err);
    free(text);
    return st;
}

prism_status prism_trace_bin_layout(prism_buf *out, const uint32_t *ids, const uint64_t *bytes, size_t n,
                                    prism_error *err)
{
    Prism__V1__BlockInfo *infos = n ? calloc(n, sizeof *infos) : NULL;
    Prism__V1__BlockInfo **ptrs = n ? malloc(n * sizeof *ptrs) : NULL;
    if (n && (!infos || !ptrs)) {
        free(infos);
        free(ptrs);
        return prism_error_set(err, PRISM_ERR_NOMEM, "out of memory");
    }
    for (size_t i = 0; i < n; i++) {
        prism__v1__block_info__init(&infos[i]);
        infos[i].id = ids[i];
        infos[i].param_bytes_bf16 = bytes[i];
        ptrs[i] = &infos[i];
    }
    Prism__V1__ModelLayout layout = PRISM__V1__MODEL_LAYOUT__INIT;
    layout.n_blocks = n;
    layout.blocks = ptrs;
    Prism__V1__TraceRecord rec = PRISM__V1__TRACE_RECORD__INIT;
    rec.record_case = PRISM__V1__TRACE_RECORD__RECORD_LAYOUT;
    rec.layout = &layout;
    prism_status st = append_record(out, &rec, err);
    free(infos);
    free(ptrs);
    return st;
}

prism_status prism_trace_bin_calibration(prism_buf *out, prism_precision format, const uint32_t *ids,
                                         const double *errors, size_t n, prism_error *err)
{
    Prism__V1__BlockError *es = n ? calloc(n, sizeof *es) : NULL;
    Prism__V1__BlockError **ptrs = n ? malloc(n * sizeof *ptrs) : NULL;
    if (n && (!es || !ptrs)) {
        free(es);
        free(ptrs);
        return prism_error_set(err, PRISM_ERR_NOMEM, "out of memory");
    }
    for (size_t i = 0; i < n; i++) {
        prism__v1__block_error__init(&es[i]);
        es[i].block_id = ids[i];
        es[i].relative_error = errors[i];
        ptrs[i] = &es[i];
    }
    Prism__V1__CalibrationErrors cal = PRISM__V1__CALIBRATION_ERRORS__INIT;
    cal.format = (Prism__V1__Precision)format;
    cal.n_errors = n;
    cal.errors = ptrs;
    Prism__V1__TraceRecord rec = PRISM__V1__TRACE_RECORD__INIT;
    rec.record_case = PRISM__V1__TRACE_RECORD__RECORD_CALIBRATION;
    rec.calibration = &cal;
    prism_status st = append_record(out, &rec, err);
    free(es);
    free(ptrs);
    return st;
}

prism_status prism_trace_bin_config(prism_buf *out, const prism_config *cfg, prism_error *err)
{
    char *text = config_text(cfg, err);
    if (!text)
        return PRISM_ERR_NOMEM;
    Prism__V1__TraceRecord rec = PRISM__V1__TRACE_RECORD__INIT;
    rec.record_case = PRISM__V1__TRACE_RECORD__RECORD_CONFIG_JSON;
    rec.config_json = text;
    prism_status st = append_record(out, &rec, err);
    free(text);
    return st;
}

prism_status prism_trace_bin_step(prism_buf *out, const prism_merged_step *m, bool version_bumped, prism_error *err)
{
    size_t n = m->count;
    Prism__V1__BlockGradStats *bs = n ? calloc(n, sizeof *bs) : NULL;
    Prism__V1__BlockGradStats **ptrs = n ? malloc(n * sizeof *ptrs) : NULL;
    if (n && (!bs || !ptrs)) {
        free(bs);
        free(ptrs);
        return prism_error_set(err, PRISM_ERR_NOMEM, "out of memory");
    }
    for (size_t i = 0; i < n; i++) {
        const prism_block_stats *s = &m->blocks[i];
        prism__v1__block_grad_stats__init(&bs[i]);
        bs[i].block_id = s->block_id;
        bs[i].l2_norm = s->l2_norm;
        bs[i].max_abs = s->max_abs;
        bs[i].mean = s->mean;
        bs[i].variance = s->variance;
        bs[i].numel = s->numel;
        bs[i].nonfinite = s->nonfinite;
        if (s->has_saturation) {
            bs[i].optional_saturated_fraction_case =
                PRISM__V1__BLOCK_GRAD_STATS__OPTIONAL_SATURATED_FRACTION_SATURATED_FRACTION;
            bs[i].saturated_fraction = s->saturated_fraction;
            bs[i].optional_underflowed_fraction_case =
                PRISM__V1__BLOCK_GRAD_STATS__OPTIONAL_UNDERFLOWED_FRACTION_UNDERFLOWED_FRACTION;
            bs[i].underflowed_fraction = s->underflowed_fraction;
        }
        ptrs[i] = &bs[i];
    }
    Prism__V1__StepReport report = PRISM__V1__STEP_REPORT__INIT;
    report.step = m->step;
    if (m->has_loss) {
        report.optional_loss_case = PRISM__V1__STEP_REPORT__OPTIONAL_LOSS_LOSS;
        report.loss = m->loss;
    }
    report.n_blocks = n;
    report.blocks = ptrs;
    Prism__V1__TraceStep step = PRISM__V1__TRACE_STEP__INIT;
    step.merged = &report;
    step.ranks = m->ranks;
    step.map_version_bumped = version_bumped;
    Prism__V1__TraceRecord rec = PRISM__V1__TRACE_RECORD__INIT;
    rec.record_case = PRISM__V1__TRACE_RECORD__RECORD_STEP;
    rec.step = &step;
    prism_status st = append_record(out, &rec, err);
    free(bs);
    free(ptrs);
    return st;
}

size_t prism_trace_bin_complete(const uint8_t *data, size_t len)
{
    size_t pos = 0;
    for (;;) {
        size_t at = pos;
        uint64_t size;
        if (!varint_get(data, len, &at, &size) || size > PRISM_TRACE_BIN_MAX_RECORD || size > len - at)
            return pos;
        pos = at + (size_t)size;
    }
}

void prism_trace_bin_reader_init(prism_trace_bin_reader *r, const void *data, size_t len)
{
    r->data = data;
    r->len = len;
    r->pos = 0;
    r->records = 0;
}

static prism_status set_text(char **dst, const char *src, prism_error *err)
{
    free(*dst);
    *dst = strdup(src ? src : "");
    return *dst ? PRISM_OK : prism_error_set(err, PRISM_ERR_NOMEM, "out of memory");
}

static prism_status check_config(const char *text, const char *where, prism_error *err)
{
    prism_config cfg;
    prism_error cerr = {0};
    if (prism_config_load_buffer(text, strlen(text), where, &cfg, &cerr))
        return prism_error_set(err, PRISM_ERR_INVALID, "%s", cerr.message);
    prism_config_free(&cfg);
    return PRISM_OK;
}

static int compare_entry_ids(const void *a, const void *b)
{
    uint32_t x = ((const prism_trace_entry *)a)->block_id, y = ((const prism_trace_entry *)b)->block_id;
    return (x > y) - (x < y);
}

/* A block id may appear once in a record's entries (as the JSONL form, an object keyed by id,
 * allows it once); a repeat names the second entry and the block. */
static prism_status check_unique_entries(const prism_trace_entry *entries, size_t n, const char *what,
                                         prism_error *err)
{
    if (n < 2)
        return PRISM_OK;
    prism_trace_entry *sorted = malloc(n * sizeof *sorted);
    if (!sorted)
        return prism_error_set(err, PRISM_ERR_NOMEM, "out of memory");
    memcpy(sorted, entries, n * sizeof *sorted);
    qsort(sorted, n, sizeof *sorted, compare_entry_ids);
    bool repeated = false;
    uint32_t id = 0;
    for (size_t i = 1; i < n && !repeated; i++)
        if (sorted[i].block_id == sorted[i - 1].block_id) {
            repeated = true;
            id = sorted[i].block_id;
        }
    free(sorted);
    if (!repeated)
        return PRISM_OK;
    size_t second = 0;
    for (size_t i = 0, seen = 0; i < n; i++)
        if (entries[i].block_id == id && ++seen == 2)
            second = i;
    return prism_error_set(err, PRISM_ERR_INVALID, "%s[%zu].block_id: block %u appears twice in this record", what,
                           second, id);
}

static bool format_is_low(int f)
{
    return f == PRISM_PRECISION_INT8 || f == PRISM_PRECISION_FP8_E4M3 || f == PRISM_PRECISION_FP8_E5M2 ||
           f == PRISM_PRECISION_INT4;
}

static prism_status take_record(const Prism__V1__TraceRecord *m, prism_trace_record *rec, prism_error *err)
{
    prism_status st;
    switch (m->record_case) {
    case PRISM__V1__TRACE_RECORD__RECORD_HEADER: {
        const Prism__V1__TraceHeader *h = m->header;
        if (h->trace_version != PRISM_TRACE_BIN_VERSION)
            return prism_error_set(err, PRISM_ERR_INVALID, "header.trace_version: %u is not %u (a newer prismd?)",
                                   h->trace_version, PRISM_TRACE_BIN_VERSION);
        if ((st = check_config(h->config_json, "header.config_json", err)) ||
            (st = set_text(&rec->job_id, h->job_id, err)) || (st = set_text(&rec->config_json, h->config_json, err)))
            return st;
        rec->segment = h->segment;
        rec->unix_time_ms = h->unix_time_ms;
        rec->restored = h->restored;
        rec->gap_before = h->gap_before;
        rec->kind = PRISM_TRACE_HEADER;
        return PRISM_OK;
    }
    case PRISM__V1__TRACE_RECORD__RECORD_CONFIG_JSON:
        if ((st = check_config(m->config_json, "config_json", err)) ||
            (st = set_text(&rec->config_json, m->config_json, err)))
            return st;
        rec->kind = PRISM_TRACE_CONFIG;
        return PRISM_OK;
    case PRISM__V1__TRACE_RECORD__RECORD_LAYOUT: {
        const Prism__V1__ModelLayout *l = m->layout;
        if ((st = prism_trace_reserve((void **)&rec->entries, &rec->cap_entries, l->n_blocks, sizeof *rec->entries,
                                      err)))
            return st;
        for (size_t i = 0; i < l->n_blocks; i++) {
            if (l->blocks[i]->param_bytes_bf16 > INT64_MAX)
                return prism_error_set(err, PRISM_ERR_INVALID, "layout.blocks[%zu].param_bytes_bf16: out of range",
                                       i);
            rec->entries[i] = (prism_trace_entry){l->blocks[i]->id, 0, l->blocks[i]->param_bytes_bf16};
        }
        rec->count = l->n_blocks;
        rec->kind = PRISM_TRACE_LAYOUT;
        return PRISM_OK;
    }
    case PRISM__V1__TRACE_RECORD__RECORD_CALIBRATION: {
        const Prism__V1__CalibrationErrors *c = m->calibration;
        if (!format_is_low((int)c->format))
            return prism_error_set(err, PRISM_ERR_INVALID, "calibration.format: %d is not a low precision",
                                   (int)c->format);
        if ((st = prism_trace_reserve((void **)&rec->entries, &rec->cap_entries, c->n_errors, sizeof *rec->entries,
                                      err)))
            return st;
        for (size_t i = 0; i < c->n_errors; i++) {
            double e = c->errors[i]->relative_error;
            if (!(e >= 0) || e > 1e308)
                return prism_error_set(err, PRISM_ERR_INVALID,
                                       "calibration.errors[%zu].relative_error: expected a finite number >= 0", i);
            rec->entries[i] = (prism_trace_entry){c->errors[i]->block_id, e, 0};
        }
        if ((st = check_unique_entries(rec->entries, c->n_errors, "calibration.errors", err)))
            return st;
        rec->format = (prism_precision)c->format;
        rec->count = c->n_errors;
        rec->kind = PRISM_TRACE_CALIBRATION;
        return PRISM_OK;
    }
    case PRISM__V1__TRACE_RECORD__RECORD_STEP: {
        const Prism__V1__TraceStep *s = m->step;
        if (!s->merged)
            return prism_error_set(err, PRISM_ERR_INVALID, "step.merged: missing");
        const Prism__V1__StepReport *r = s->merged;
        if (r->step > PRISM_STEP_MAX)
            return prism_error_set(err, PRISM_ERR_INVALID, "step.merged.step: %llu is out of range",
                                   (unsigned long long)r->step);
        if ((st = prism_trace_reserve((void **)&rec->blocks, &rec->cap_blocks, r->n_blocks, sizeof *rec->blocks, err)))
            return st;
        for (size_t i = 0; i < r->n_blocks; i++) {
            const Prism__V1__BlockGradStats *b = r->blocks[i];
            prism_block_stats *o = &rec->blocks[i];
            bool sat = b->optional_saturated_fraction_case ==
                       PRISM__V1__BLOCK_GRAD_STATS__OPTIONAL_SATURATED_FRACTION_SATURATED_FRACTION;
            bool und = b->optional_underflowed_fraction_case ==
                       PRISM__V1__BLOCK_GRAD_STATS__OPTIONAL_UNDERFLOWED_FRACTION_UNDERFLOWED_FRACTION;
            if (sat != und)
                return prism_error_set(err, PRISM_ERR_INVALID,
                                       "step.merged.blocks[%zu]: saturated_fraction and underflowed_fraction come "
                                       "together", i);
            *o = (prism_block_stats){b->block_id, b->l2_norm, b->max_abs, b->mean, b->variance, b->numel,
                                     b->nonfinite, sat, sat ? b->saturated_fraction : 0.0,
                                     sat ? b->underflowed_fraction : 0.0};
            prism_error berr = {0};
            /* exactly what the live policy accepts (a merged NaN l2 is a non-finite block) */
            if (prism_block_stats_check(o, &berr))
                return prism_error_set(err, PRISM_ERR_INVALID, "step.merged.blocks[%zu]: %s", i, berr.message);
        }
        if ((st = prism_trace_check_unique_ids(rec->blocks, r->n_blocks, err)))
            return st;
        rec->step = r->step;
        rec->has_loss = r->optional_loss_case == PRISM__V1__STEP_REPORT__OPTIONAL_LOSS_LOSS;
        rec->loss = r->loss;
        rec->count = r->n_blocks;
        rec->merged = true;
        rec->ranks = s->ranks;
        rec->version_bumped = s->map_version_bumped;
        rec->kind = PRISM_TRACE_STEP;
        return PRISM_OK;
    }
    default:
        return prism_error_set(err, PRISM_ERR_INVALID, "a record of an unknown kind (%d; a newer prismd?)",
                               (int)m->record_case);
    }
}

prism_status prism_trace_bin_next(prism_trace_bin_reader *r, prism_trace_record *rec, prism_error *err)
{
    rec->kind = PRISM_TRACE_BLANK;
    rec->count = 0;
    rec->has_loss = false;
    rec->rank = 0;
    rec->merged = false;
    rec->ranks = 0;
    rec->version_bumped = false;
    if (r->pos >= r->len)
        return PRISM_OK;
    size_t start = r->pos, at = r->pos;
    uint64_t index = r->records + 1, size;
    if (!varint_get(r->data, r->len, &at, &size))
        return prism_error_set(err, PRISM_ERR_INVALID, "record %llu (byte %zu): the length prefix is cut short or "
                               "longer than 10 bytes (not a binary trace, or a truncated one)",
                               (unsigned long long)index, start);
    if (size > PRISM_TRACE_BIN_MAX_RECORD)
        return prism_error_set(err, PRISM_ERR_INVALID,
                               "record %llu (byte %zu): a length of %llu bytes is over the %u-byte limit of a "
                               "record (not a binary trace, or a damaged one)",
                               (unsigned long long)index, start, (unsigned long long)size, PRISM_TRACE_BIN_MAX_RECORD);
    if (size > r->len - at)
        return prism_error_set(err, PRISM_ERR_INVALID,
                               "record %llu (byte %zu): a length of %llu bytes runs past the end of the trace "
                               "(%zu bytes left; a truncated trace?)",
                               (unsigned long long)index, start, (unsigned long long)size, r->len - at);
    Prism__V1__TraceRecord *m = prism__v1__trace_record__unpack(NULL, (size_t)size, r->data + at);
    if (!m)
        return prism_error_set(err, PRISM_ERR_INVALID, "record %llu (byte %zu): not a prism.v1.TraceRecord",
                               (unsigned long long)index, start);
    prism_error inner = {0};
    prism_status st = take_record(m, rec, &inner);
    prism__v1__trace_record__free_unpacked(m, NULL);
    if (st) {
        rec->kind = PRISM_TRACE_BLANK;
        return prism_error_set(err, st, "record %llu (byte %zu): %s", (unsigned long long)index, start,
                               inner.message);
    }
    r->pos = at + (size_t)size;
    r->records++;
    return PRISM_OK;
}
