/* Telemetry records (DESIGN 4.4), written directly as text: a decision over 10,000 blocks
 * produces one line without building a JSON tree. */
#include "telemetry.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void prism_buf_free(prism_buf *b)
{
    free(b->data);
    memset(b, 0, sizeof *b);
}

prism_status prism_buf_reserve(prism_buf *b, size_t n)
{
    if (b->len + n + 1 > b->cap) {
        size_t ncap = b->cap ? b->cap : 256;
        while (ncap < b->len + n + 1)
            ncap *= 2;
        char *nd = realloc(b->data, ncap);
        if (!nd)
            return PRISM_ERR_NOMEM;
        b->data = nd;
        b->cap = ncap;
    }
    return PRISM_OK;
}

prism_status prism_buf_append(prism_buf *b, const char *s, size_t n)
{
    prism_status st = prism_buf_reserve(b, n);
    if (st)
        return st;
    memcpy(b->data + b->len, s, n);
    b->len += n;
    b->data[b->len] = '\0';
    return PRISM_OK;
}

static prism_status append_str(prism_buf *b, const char *s)
{
    return prism_buf_append(b, s, strlen(s));
}

static prism_status append_u64(prism_buf *b, uint64_t x)
{
    char text[24];
    return prism_buf_append(b, text, prism_u64_text(x, text));
}

static prism_status append_opt(prism_buf *b, bool present, double x)
{
    return present ? prism_buf_append_double(b, x) : append_str(b, "null");
}

/* Writers into room prism_buf_reserve made: each returns the end of what it wrote. */
#define PUT_LIT(o, lit) (memcpy((o), (lit), sizeof(lit) - 1), (o) + sizeof(lit) - 1)

static char *put_number(char *o, bool present, const prism_number *num)
{
    return present ? o + prism_number_text(num, o) : PUT_LIT(o, "null");
}

/* The room put_block needs (~450: the keys, a 10-digit id, a precision name, six numbers of
 * PRISM_DOUBLE_TEXT_MAX bytes of room each), its NUL included. */
#define BLOCK_TEXT_MAX 512

/* One block's entry of block_details, with a comma before it unless it is the first. */
static char *put_block(char *o, const prism_block_view *v, bool first, const char *const *names,
                       const size_t *name_lens)
{
    o = first ? PUT_LIT(o, "\"") : PUT_LIT(o, ",\"");
    o += prism_u64_text(v->id, o);
    o = PUT_LIT(o, "\":{\"precision\":\"");
    if ((unsigned)v->precision < PRISM_PRECISION_COUNT) {
        memcpy(o, names[v->precision], name_lens[v->precision]);
        o += name_lens[v->precision];
    } else {
        *o++ = '?'; /* as prism_precision_name writes a value it does not know */
    }
    /* The digits of every number first (see prism_number_prepare), then the text. */
    bool scored = v->has_score, erred = v->has_score && v->has_error_score, sat = v->has_saturation;
    prism_number num[6];
    if (scored) {
        prism_number_prepare(v->sensitivity, &num[0]);
        prism_number_prepare(v->grad_score, &num[1]);
        prism_number_prepare(v->relative_magnitude, &num[3]);
    }
    if (erred)
        prism_number_prepare(v->error_score, &num[2]);
    if (sat) {
        prism_number_prepare(v->saturated_fraction, &num[4]);
        prism_number_prepare(v->underflowed_fraction, &num[5]);
    }
    o = PUT_LIT(o, "\",\"sensitivity\":");
    o = put_number(o, scored, &num[0]);
    o = PUT_LIT(o, ",\"grad_score\":");
    o = put_number(o, scored, &num[1]);
    o = PUT_LIT(o, ",\"error_score\":");
    o = put_number(o, erred, &num[2]);
    o = PUT_LIT(o, ",\"relative_magnitude\":");
    o = put_number(o, scored, &num[3]);
    if (sat) {
        o = PUT_LIT(o, ",\"saturated_fraction\":");
        o = put_number(o, true, &num[4]);
        o = PUT_LIT(o, ",\"underflowed_fraction\":");
        o = put_number(o, true, &num[5]);
    }
    *o++ = '}';
    *o = '\0';
    return o;
}

prism_status prism_telemetry_append(prism_buf *b, const prism_policy *p, const prism_summary *s,
                                    double timestamp, const double *loss)
{
    bool scored = s->scored > 0;
    prism_status st = PRISM_OK;
#define TRY(call)                                                                                                  \
    do {                                                                                                           \
        if ((st = (call)))                                                                                         \
            return st;                                                                                             \
    } while (0)
    TRY(append_str(b, "{\"step_id\":"));
    TRY(append_u64(b, s->step_id));
    TRY(append_str(b, ",\"timestamp\":"));
    TRY(prism_buf_append_double(b, timestamp));
    TRY(append_str(b, ",\"blocks_bf16\":"));
    TRY(append_u64(b, s->blocks_bf16));
    TRY(append_str(b, ",\"blocks_int8\":"));
    TRY(append_u64(b, s->blocks_low));
    TRY(append_str(b, ",\"mean_sensitivity\":"));
    TRY(append_opt(b, scored, s->mean_sensitivity));
    TRY(append_str(b, ",\"max_sensitivity\":"));
    TRY(append_opt(b, scored, s->max_sensitivity));
    TRY(append_str(b, ",\"min_sensitivity\":"));
    TRY(append_opt(b, scored, s->min_sensitivity));
    TRY(append_str(b, ",\"precision_changes\":"));
    TRY(append_u64(b, s->precision_changes));
    TRY(append_str(b, ",\"estimated_bandwidth_saving_pct\":"));
    TRY(prism_buf_append_double(b, s->bandwidth_saving_pct));
    TRY(append_str(b, ",\"low_precision\":\""));
    TRY(append_str(b, prism_low_precision_name(s->low_precision)));
    TRY(append_str(b, "\",\"map_version\":"));
    TRY(append_u64(b, s->map_version));
    if (loss) {
        TRY(append_str(b, ",\"loss\":"));
        TRY(prism_buf_append_double(b, *loss));
    }
    TRY(append_str(b, ",\"block_details\":{"));
    size_t n = prism_policy_block_count(p);
    const char *names[PRISM_PRECISION_COUNT];
    size_t name_lens[PRISM_PRECISION_COUNT];
    for (int f = 0; f < PRISM_PRECISION_COUNT; f++) {
        names[f] = prism_precision_name((prism_precision)f);
        name_lens[f] = strlen(names[f]);
    }
    for (size_t i = 0; i < n; i++) {
        if (b->len + BLOCK_TEXT_MAX + 1 > b->cap)
            TRY(prism_buf_reserve(b, BLOCK_TEXT_MAX));
        b->len = (size_t)(put_block(b->data + b->len, prism_policy_block(p, i), i == 0, names, name_lens) - b->data);
    }
    /* Issue 17's fields come last, so that records read as before up to block_details. */
    TRY(append_str(b, "}"));
    TRY(append_str(b, ",\"blocks_by_precision\":{"));
    for (int f = 0; f < PRISM_PRECISION_COUNT; f++) {
        TRY(append_str(b, f ? ",\"" : "\""));
        TRY(append_str(b, prism_precision_name((prism_precision)f)));
        TRY(append_str(b, "\":"));
        TRY(append_u64(b, s->blocks_by_precision[f]));
    }
    TRY(append_str(b, s->loss_spike ? "},\"loss_spike\":true" : "},\"loss_spike\":false"));
    TRY(append_str(b, "}\n"));
#undef TRY
    return PRISM_OK;
}
