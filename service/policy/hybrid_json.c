/* The plan object as JSON text (hybrid_json.h). */
#include "hybrid_json.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static prism_status append(prism_buf *b, const char *s)
{
    return prism_buf_append(b, s, strlen(s));
}

static prism_status append_string(prism_buf *b, const char *s)
{
    json_t *j = json_string(s);
    char *text = j ? json_dumps(j, JSON_ENCODE_ANY) : NULL;
    prism_status st = text ? append(b, text) : PRISM_ERR_NOMEM;
    free(text);
    json_decref(j);
    return st;
}

static prism_status append_baseline(prism_buf *b, const char *name, const prism_hybrid_baseline *x)
{
    prism_status st;
    if ((st = append(b, "\"")) || (st = append(b, name)) || (st = append(b, "\":{\"iteration_seconds\":")) ||
        (st = prism_buf_append_double(b, x->iteration_seconds)) || (st = append(b, ",\"indicator\":")) ||
        (st = prism_buf_append_double(b, x->indicator)) || (st = append(b, ",\"fits\":")) ||
        (st = append(b, x->fits ? "true}" : "false}")))
        return st;
    return PRISM_OK;
}

prism_status prism_hybrid_json_write(prism_buf *b, const prism_hybrid_problem *p, const prism_hybrid_result *res,
                                     const uint32_t *ids)
{
    prism_status st = PRISM_OK;
#define TRY(call)                                                                                                  \
    do {                                                                                                           \
        if ((st = (call)))                                                                                         \
            return st;                                                                                             \
    } while (0)
    size_t L = p->block_count;
    TRY(append(b, "{\"iteration_seconds\":"));
    TRY(prism_buf_append_double(b, res->iteration_seconds));
    TRY(append(b, ",\"start_seconds\":"));
    TRY(prism_buf_append_double(b, res->start_seconds));
    TRY(append(b, ",\"indicator\":"));
    TRY(prism_buf_append_double(b, res->indicator));
    TRY(append(b, ",\"classes\":["));
    for (size_t k = 0; k < p->class_count; k++) {
        const prism_hybrid_class_formats *f = &res->formats[k];
        TRY(append(b, k ? ",{\"name\":" : "{\"name\":"));
        TRY(append_string(b, p->classes[k].name));
        TRY(append(b, f->fixed ? ",\"fixed\":true" : ",\"fixed\":false"));
        TRY(append(b, ",\"low_format\":\""));
        TRY(append(b, prism_hybrid_format_name(f->low)));
        TRY(append(b, "\",\"high_format\":\""));
        TRY(append(b, prism_hybrid_format_name(f->high)));
        TRY(append(b, "\",\"plan\":["));
        for (size_t i = 0; i < L; i++) {
            TRY(append(b, i ? ",\"" : "\""));
            TRY(append(b, prism_hybrid_format_name(res->plan[k * L + i])));
            TRY(append(b, "\""));
        }
        TRY(append(b, "],\"memory_bytes\":"));
        TRY(prism_buf_append_double(b, res->memory_bytes[k]));
        TRY(append(b, ",\"budget_bytes\":"));
        TRY(prism_buf_append_double(b, res->budget_bytes[k]));
        TRY(append(b, ",\"compute_seconds\":"));
        TRY(prism_buf_append_double(b, res->compute_seconds[k]));
        TRY(append(b, "}"));
    }
    TRY(append(b, "],\"baselines\":{"));
    TRY(append_baseline(b, "uniform_low", &res->uniform_low));
    TRY(append(b, ","));
    TRY(append_baseline(b, "uniform_high", &res->uniform_high));
    TRY(append(b, "},\"raises\":["));
    for (size_t r = 0; r < res->raise_count; r++) {
        const prism_hybrid_raise *x = &res->raises[r];
        char block[32];
        if (ids)
            snprintf(block, sizeof block, ",\"block\":%u,\"delta\":", ids[x->block]);
        else
            snprintf(block, sizeof block, ",\"block\":%zu,\"delta\":", x->block);
        TRY(append(b, r ? ",{\"class\":" : "{\"class\":"));
        TRY(append_string(b, p->classes[x->class_index].name));
        TRY(append(b, block));
        TRY(prism_buf_append_double(b, x->delta));
        TRY(append(b, x->accepted ? ",\"accepted\":true,\"reason\":\"" : ",\"accepted\":false,\"reason\":\""));
        TRY(append(b, prism_hybrid_reason_name(x->reason)));
        TRY(append(b, "\"}"));
    }
    TRY(append(b, "]}"));
#undef TRY
    return PRISM_OK;
}

