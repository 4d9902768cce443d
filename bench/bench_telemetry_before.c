/* The telemetry record writer as it was before issue 18 (service/policy/telemetry.c at 2dc5ac5):
 * every piece appended on its own, integers through snprintf, doubles through printf and strtod
 * (prism_double_text_printf, the old search; its text rendering, shared with today's code, writes
 * the exponent by hand where the old one called sprintf, so this baseline is if anything faster).
 * bench_policy times it beside today's writer as the baseline, and checks that the two write the
 * same bytes. Not used by Prism itself. */
#include "bench_telemetry_before.h"

#include <stdio.h>
#include <string.h>

static prism_status append_str(prism_buf *b, const char *s)
{
    return prism_buf_append(b, s, strlen(s));
}

static prism_status append_double(prism_buf *b, double x)
{
    char text[PRISM_DOUBLE_TEXT_MAX];
    return prism_buf_append(b, text, prism_double_text_printf(x, text));
}

static prism_status append_u64(prism_buf *b, uint64_t x)
{
    char text[24];
    int n = snprintf(text, sizeof text, "%llu", (unsigned long long)x);
    return prism_buf_append(b, text, (size_t)n);
}

static prism_status append_opt(prism_buf *b, bool present, double x)
{
    return present ? append_double(b, x) : append_str(b, "null");
}

prism_status telemetry_append_before(prism_buf *b, const prism_policy *p, const prism_summary *s, double timestamp,
                                     const double *loss)
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
    TRY(append_double(b, timestamp));
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
    TRY(append_double(b, s->bandwidth_saving_pct));
    TRY(append_str(b, ",\"low_precision\":\""));
    TRY(append_str(b, prism_low_precision_name(s->low_precision)));
    TRY(append_str(b, "\",\"map_version\":"));
    TRY(append_u64(b, s->map_version));
    if (loss) {
        TRY(append_str(b, ",\"loss\":"));
        TRY(append_double(b, *loss));
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
        if (v->has_saturation) {
            TRY(append_str(b, ",\"saturated_fraction\":"));
            TRY(append_double(b, v->saturated_fraction));
            TRY(append_str(b, ",\"underflowed_fraction\":"));
            TRY(append_double(b, v->underflowed_fraction));
        }
        TRY(append_str(b, "}"));
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
