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

prism_status prism_buf_append(prism_buf *b, const char *s, size_t n)
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
    memcpy(b->data + b->len, s, n);
    b->len += n;
    b->data[b->len] = '\0';
    return PRISM_OK;
}

static prism_status append_str(prism_buf *b, const char *s)
{
    return prism_buf_append(b, s, strlen(s));
}

prism_status prism_buf_append_double(prism_buf *b, double x)
{
    if (!isfinite(x))
        return append_str(b, "null");
    char text[40];
    /* The shortest text that reads back exactly. For a normal double, %.15g already is that
     * text whenever 15 digits or fewer suffice (%g drops trailing zeros); subnormals carry
     * fewer digits, so their search starts at one. */
    for (int digits = fpclassify(x) == FP_SUBNORMAL ? 1 : 15; digits <= 17; digits++) {
        snprintf(text, sizeof text, "%.*g", digits, x);
        if (strtod(text, NULL) == x)
            break;
    }
    /* Keep a number that is integral in value but real in type recognisably real. */
    if (!strpbrk(text, ".eEn"))
        strcat(text, ".0");
    return append_str(b, text);
}

static prism_status append_u64(prism_buf *b, uint64_t x)
{
    char text[24];
    int n = snprintf(text, sizeof text, "%llu", (unsigned long long)x);
    return prism_buf_append(b, text, (size_t)n);
}

static prism_status append_opt(prism_buf *b, bool present, double x)
{
    return present ? prism_buf_append_double(b, x) : append_str(b, "null");
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
    TRY(append_str(b, prism_precision_name(s->low_precision)));
    TRY(append_str(b, "\",\"map_version\":"));
    TRY(append_u64(b, s->map_version));
    if (loss) {
        TRY(append_str(b, ",\"loss\":"));
        TRY(prism_buf_append_double(b, *loss));
    }
    TRY(append_str(b, ",\"block_details\":{"));
    size_t n = prism_policy_block_count(p);
    for (size_t i = 0; i < n; i++) {
        const prism_block_view *v = prism_policy_block(p, i);
        TRY(append_str(b, i ? ",\"" : "\""));
        TRY(append_u64(b, v->id));
        TRY(append_str(b, "\":{\"precision\":\""));
        TRY(append_str(b, prism_precision_name(v->precision)));
        TRY(append_str(b, "\",\"sensitivity\":"));
        TRY(append_opt(b, v->has_score, v->sensitivity));
        TRY(append_str(b, ",\"grad_score\":"));
        TRY(append_opt(b, v->has_score, v->grad_score));
        TRY(append_str(b, ",\"error_score\":"));
        TRY(append_opt(b, v->has_score && v->has_error_score, v->error_score));
        TRY(append_str(b, ",\"relative_magnitude\":"));
        TRY(append_opt(b, v->has_score, v->relative_magnitude));
        TRY(append_str(b, "}"));
    }
    TRY(append_str(b, "}}\n"));
#undef TRY
    return PRISM_OK;
}
