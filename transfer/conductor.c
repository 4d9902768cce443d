/* The Conductor (DESIGN 9): the local transfer limits and the in-flight slots. Pure bookkeeping
 * for one thread; the rules are in include/prism/transfer.h. */
#include "prism/transfer.h"

#include <stddef.h>
#include <stdlib.h>

struct prism_conductor {
    prism_conductor_limits now;  /* in force */
    prism_conductor_limits next; /* in force from the next begin_step: the last handed in */
    bool stepped;                /* a step has begun */
    uint64_t step;               /* the last step begun */
    uint32_t inflight[2];        /* by prism_conductor_dir */
};

/* The one table of the limits: name, kind, range and default. Checking, tightening and the
 * defaults all read it. For every kind, "tighter" is: a smaller count or fraction, a set flag. */
typedef enum limit_kind { LIMIT_COUNT, LIMIT_FRACTION, LIMIT_FLAG } limit_kind;

typedef struct limit_field {
    const char *name;
    size_t offset;
    limit_kind kind;
    double dflt;
} limit_field;

static const limit_field limit_fields[] = {
    {"max_inflight_h2d", offsetof(prism_conductor_limits, max_inflight_h2d), LIMIT_COUNT, 2},
    {"max_inflight_d2h", offsetof(prism_conductor_limits, max_inflight_d2h), LIMIT_COUNT, 2},
    {"prefetch_window", offsetof(prism_conductor_limits, prefetch_window), LIMIT_COUNT, 2},
    {"vram_pressure_threshold", offsetof(prism_conductor_limits, vram_pressure_threshold),
     LIMIT_FRACTION, 0.8},
    {"suppress_prefetch_in_backward", offsetof(prism_conductor_limits, suppress_prefetch_in_backward),
     LIMIT_FLAG, 1},
    {"suppress_prefetch_in_optimizer",
     offsetof(prism_conductor_limits, suppress_prefetch_in_optimizer), LIMIT_FLAG, 1},
};

#define LIMIT_FIELDS (sizeof limit_fields / sizeof limit_fields[0])

static void *field_of(prism_conductor_limits *l, const limit_field *f)
{
    return (char *)l + f->offset;
}

static const void *field_of_const(const prism_conductor_limits *l, const limit_field *f)
{
    return (const char *)l + f->offset;
}

prism_conductor_limits prism_conductor_default_limits(void)
{
    prism_conductor_limits l;
    for (size_t i = 0; i < LIMIT_FIELDS; i++) {
        const limit_field *f = &limit_fields[i];
        void *p = field_of(&l, f);
        switch (f->kind) {
        case LIMIT_COUNT: *(uint32_t *)p = (uint32_t)f->dflt; break;
        case LIMIT_FRACTION: *(double *)p = f->dflt; break;
        case LIMIT_FLAG: *(bool *)p = f->dflt != 0; break;
        }
    }
    return l;
}

prism_conductor_limits prism_conductor_limits_from_hints(const prism_client_runtime_hints *h)
{
    if (!h || (h->map_version == 0 && h->max_inflight_h2d == 0 && h->max_inflight_d2h == 0 &&
               h->prefetch_window == 0 && h->vram_pressure_threshold == 0 && !h->suppress_prefetch_in_backward &&
               !h->suppress_prefetch_in_optimizer))
        return prism_conductor_default_limits();
    return (prism_conductor_limits){
        .max_inflight_h2d = h->max_inflight_h2d,
        .max_inflight_d2h = h->max_inflight_d2h,
        .prefetch_window = h->prefetch_window,
        .vram_pressure_threshold = h->vram_pressure_threshold,
        .suppress_prefetch_in_backward = h->suppress_prefetch_in_backward,
        .suppress_prefetch_in_optimizer = h->suppress_prefetch_in_optimizer,
    };
}

prism_status prism_conductor_check_limits(const prism_conductor_limits *limits, prism_error *err)
{
    if (!limits)
        return prism_error_set(err, PRISM_ERR_INVALID, "limits: NULL");
    for (size_t i = 0; i < LIMIT_FIELDS; i++) {
        const limit_field *f = &limit_fields[i];
        const void *p = field_of_const(limits, f);
        if (f->kind == LIMIT_COUNT && *(const uint32_t *)p > PRISM_CONDUCTOR_MAX_COUNT)
            return prism_error_set(err, PRISM_ERR_INVALID, "%s: %u is above %d", f->name,
                                   (unsigned)*(const uint32_t *)p, PRISM_CONDUCTOR_MAX_COUNT);
        if (f->kind == LIMIT_FRACTION) {
            double x = *(const double *)p;
            if (!(x >= 0.0 && x <= 1.0))
                return prism_error_set(err, PRISM_ERR_INVALID,
                                       "%s: %g is not a fraction from 0 to 1", f->name, x);
        }
    }
    return PRISM_OK;
}

prism_status prism_conductor_create(const prism_conductor_limits *limits, prism_conductor **out,
                                    prism_error *err)
{
    if (!out)
        return prism_error_set(err, PRISM_ERR_INVALID, "out: NULL");
    *out = NULL;
    prism_conductor_limits l = limits ? *limits : prism_conductor_default_limits();
    prism_status st = prism_conductor_check_limits(&l, err);
    if (st != PRISM_OK)
        return st;
    prism_conductor *c = calloc(1, sizeof *c);
    if (!c)
        return prism_error_set(err, PRISM_ERR_NOMEM, "conductor: out of memory");
    c->now = l;
    c->next = l;
    *out = c;
    return PRISM_OK;
}

void prism_conductor_destroy(prism_conductor *c)
{
    free(c);
}

/* Field by field, the tighter of `now` and `in`, into now. */
static void tighten(prism_conductor_limits *now, const prism_conductor_limits *in)
{
    for (size_t i = 0; i < LIMIT_FIELDS; i++) {
        const limit_field *f = &limit_fields[i];
        void *p = field_of(now, f);
        const void *q = field_of_const(in, f);
        switch (f->kind) {
        case LIMIT_COUNT:
            if (*(const uint32_t *)q < *(uint32_t *)p)
                *(uint32_t *)p = *(const uint32_t *)q;
            break;
        case LIMIT_FRACTION:
            if (*(const double *)q < *(double *)p)
                *(double *)p = *(const double *)q;
            break;
        case LIMIT_FLAG:
            if (*(const bool *)q)
                *(bool *)p = true;
            break;
        }
    }
}

prism_status prism_conductor_set_limits(prism_conductor *c, const prism_conductor_limits *limits,
                                        prism_error *err)
{
    if (!c)
        return prism_error_set(err, PRISM_ERR_INVALID, "conductor: NULL");
    prism_status st = prism_conductor_check_limits(limits, err);
    if (st != PRISM_OK)
        return st;
    c->next = *limits;
    tighten(&c->now, limits);
    return PRISM_OK;
}

prism_status prism_conductor_begin_step(prism_conductor *c, uint64_t step, prism_error *err)
{
    if (!c)
        return prism_error_set(err, PRISM_ERR_INVALID, "conductor: NULL");
    if (c->stepped && step <= c->step)
        return prism_error_set(err, PRISM_ERR_STATE,
                               "step: %llu is not after the step already begun (%llu)",
                               (unsigned long long)step, (unsigned long long)c->step);
    c->stepped = true;
    c->step = step;
    c->now = c->next;
    return PRISM_OK;
}

void prism_conductor_get_limits(const prism_conductor *c, prism_conductor_limits *now,
                                prism_conductor_limits *next)
{
    if (now)
        *now = c->now;
    if (next)
        *next = c->next;
}

prism_conductor_verdict prism_conductor_may_prefetch(const prism_conductor *c,
                                                     const prism_conductor_request *req)
{
    const prism_conductor_limits *l = &c->now;
    if (req->phase == PRISM_CONDUCTOR_OPTIMIZER && l->suppress_prefetch_in_optimizer)
        return PRISM_CONDUCTOR_REFUSE_OPTIMIZER;
    if (req->phase == PRISM_CONDUCTOR_BACKWARD && l->suppress_prefetch_in_backward &&
        req->vram_total > 0 &&
        (double)req->vram_used / (double)req->vram_total > l->vram_pressure_threshold)
        return PRISM_CONDUCTOR_REFUSE_PRESSURE;
    if (req->distance == 0 || req->distance > l->prefetch_window)
        return PRISM_CONDUCTOR_REFUSE_WINDOW;
    if (c->inflight[PRISM_CONDUCTOR_H2D] >= l->max_inflight_h2d)
        return PRISM_CONDUCTOR_REFUSE_SLOTS;
    return PRISM_CONDUCTOR_ALLOW;
}

static uint32_t limit_of(const prism_conductor *c, prism_conductor_dir dir)
{
    return dir == PRISM_CONDUCTOR_D2H ? c->now.max_inflight_d2h : c->now.max_inflight_h2d;
}

bool prism_conductor_try_acquire(prism_conductor *c, prism_conductor_dir dir)
{
    unsigned d = dir == PRISM_CONDUCTOR_D2H;
    if (c->inflight[d] >= limit_of(c, dir))
        return false;
    c->inflight[d]++;
    return true;
}

void prism_conductor_acquire_anyway(prism_conductor *c, prism_conductor_dir dir)
{
    c->inflight[dir == PRISM_CONDUCTOR_D2H]++;
}

prism_status prism_conductor_release(prism_conductor *c, prism_conductor_dir dir, prism_error *err)
{
    unsigned d = dir == PRISM_CONDUCTOR_D2H;
    if (c->inflight[d] == 0)
        return prism_error_set(err, PRISM_ERR_STATE, "release: no %s slot is held",
                               d ? "d2h" : "h2d");
    c->inflight[d]--;
    return PRISM_OK;
}

uint32_t prism_conductor_inflight(const prism_conductor *c, prism_conductor_dir dir)
{
    return c->inflight[dir == PRISM_CONDUCTOR_D2H];
}

const char *prism_conductor_verdict_name(prism_conductor_verdict v)
{
    static const char *const names[PRISM_CONDUCTOR_VERDICT_COUNT] = {"allow", "optimizer",
                                                                      "pressure", "window", "slots"};
    unsigned i = (unsigned)v;
    return i < PRISM_CONDUCTOR_VERDICT_COUNT ? names[i] : "?";
}

const char *prism_conductor_phase_name(prism_conductor_phase p)
{
    static const char *const names[] = {"forward", "backward", "optimizer"};
    unsigned i = (unsigned)p;
    return i < sizeof names / sizeof names[0] ? names[i] : "?";
}
