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

/* Exact powers of ten as doubles (10^22 is the largest that is). */
static const double pow10_exact[] = {1e0,  1e1,  1e2,  1e3,  1e4,  1e5,  1e6,  1e7,  1e8,  1e9,  1e10, 1e11,
                                     1e12, 1e13, 1e14, 1e15, 1e16, 1e17, 1e18, 1e19, 1e20, 1e21, 1e22};

/* Writes what printf's %.Pg writes for a value whose P significant digits (rounded) are d[0..P)
 * and whose decimal exponent is x10: trailing zeros of the fraction dropped, the exponent form
 * when x10 < -4 or x10 >= P. */
static void render_g(char *out, bool negative, const char *d, int p, int x10)
{
    int k = p;
    while (k > 1 && d[k - 1] == '0')
        k--;
    char *o = out;
    if (negative)
        *o++ = '-';
    if (x10 < -4 || x10 >= p) {
        *o++ = d[0];
        if (k > 1) {
            *o++ = '.';
            memcpy(o, d + 1, (size_t)(k - 1));
            o += k - 1;
        }
        sprintf(o, "e%c%02d", x10 < 0 ? '-' : '+', x10 < 0 ? -x10 : x10);
        return;
    }
    if (x10 >= 0) {
        memcpy(o, d, (size_t)(x10 + 1));
        o += x10 + 1;
        if (k > x10 + 1) {
            *o++ = '.';
            memcpy(o, d + x10 + 1, (size_t)(k - x10 - 1));
            o += k - x10 - 1;
        }
    } else {
        *o++ = '0';
        *o++ = '.';
        for (int z = 0; z < -x10 - 1; z++)
            *o++ = '0';
        memcpy(o, d, (size_t)k);
        o += k;
    }
    *o = '\0';
}

/* The value the digits d[0..p) x 10^(x10 - p + 1) read back as (what strtod gives for render_g's
 * text): one exact multiplication or division when the digits fit 53 bits and the power of ten is
 * exact (so correctly rounded, as strtod), else strtod itself. */
static double read_back(const char *text, bool negative, const char *d, int p, int x10)
{
    uint64_t mant = 0;
    for (int i = 0; i < p; i++)
        mant = mant * 10 + (uint64_t)(d[i] - '0');
    int e = x10 - p + 1;
    if (mant < (UINT64_C(1) << 53) && e >= -22 && e <= 22) {
        double v = e >= 0 ? (double)mant * pow10_exact[e] : (double)mant / pow10_exact[-e];
        return negative ? -v : v;
    }
    return strtod(text, NULL);
}

/* Rounds the 17 digits of d17 (x rounded to 17 significant digits) to p (15 or 16) digits into
 * out, as rounding x itself would. false when the 17 digits cannot tell (their tail is exactly
 * half a unit of the last digit kept: x may lie either side). */
static bool round_digits(const char *d17, int p, char *out, int *x10)
{
    int tail = p == 16 ? d17[16] - '0' : (d17[15] - '0') * 10 + (d17[16] - '0');
    int half = p == 16 ? 5 : 50;
    if (tail == half)
        return false;
    memcpy(out, d17, (size_t)p);
    if (tail > half) {
        int i = p - 1;
        while (i >= 0 && out[i] == '9')
            out[i--] = '0';
        if (i < 0) {
            out[0] = '1'; /* 99..9 rounds up to 10..0: one more power of ten */
            (*x10)++;
        } else {
            out[i]++;
        }
    }
    return true;
}

prism_status prism_buf_append_double(prism_buf *b, double x)
{
    if (!isfinite(x))
        return append_str(b, "null");
    char text[40];
    /* The shortest text that reads back exactly: %.15g when 15 digits or fewer suffice (%g drops
     * trailing zeros), else %.16g, else %.17g. One %.16e rendering gives x's 17 digits; the 15-
     * and 16-digit texts are derived from them (printf's own when the 17 digits cannot tell how
     * x rounds) and checked by reading them back. Subnormals carry fewer digits: their search
     * starts at one, with printf and strtod throughout. */
    if (fpclassify(x) == FP_SUBNORMAL) {
        for (int digits = 1; digits <= 17; digits++) {
            snprintf(text, sizeof text, "%.*g", digits, x);
            if (strtod(text, NULL) == x)
                break;
        }
    } else {
        char e17[40], d17[17];
        snprintf(e17, sizeof e17, "%.16e", x);
        bool negative = e17[0] == '-';
        const char *m = e17 + (negative ? 1 : 0); /* d.dddddddddddddddde[+-]XX */
        d17[0] = m[0];
        memcpy(d17 + 1, m + 2, 16);
        int x17 = atoi(m + 19);
        bool done = false;
        for (int p = 15; p <= 16 && !done; p++) {
            char d[17];
            int x10 = x17;
            if (round_digits(d17, p, d, &x10)) {
                render_g(text, negative, d, p, x10);
                done = read_back(text, negative, d, p, x10) == x;
            } else {
                snprintf(text, sizeof text, "%.*g", p, x);
                done = strtod(text, NULL) == x;
            }
        }
        if (!done)
            render_g(text, negative, d17, 17, x17);
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
    TRY(append_str(b, prism_low_precision_name(s->low_precision)));
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
        if (v->has_saturation) {
            TRY(append_str(b, ",\"saturated_fraction\":"));
            TRY(prism_buf_append_double(b, v->saturated_fraction));
            TRY(append_str(b, ",\"underflowed_fraction\":"));
            TRY(prism_buf_append_double(b, v->underflowed_fraction));
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
