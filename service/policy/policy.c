/* The decision rules of DESIGN 4.2 and 4.7 and the summary of 4.4. Per-block state sits in
 * arrays indexed by a dense slot (idmap.h): what a step's ingest touches (block_live) apart from
 * the rest (block), so that 100,000 blocks' ingest stays in the caches. The window of a block is
 * a ring of history_window relative magnitudes in one shared array, with the saturation figures
 * of each entry in parallel arrays of the same layout, made when the first figures come. The
 * losses of the spike rule (W) are one ring of loss_spike_window. */
#include "policy.h"

#include "idmap.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* What a step's ingest touches of a block, in an array of its own (p->live, by slot): 24 bytes
 * a block instead of the whole block, so that at 100,000 blocks a step's working set stays in
 * the caches. */
typedef struct block_live {
    uint64_t seen_call;     /* add_step call that last saw it, to catch repeated ids */
    uint32_t win_len, win_head;
    bool reported;          /* stats arrived at least once; unreported slots only hold bytes or calibration */
    bool nonfinite_pending; /* a non-finite step since the last decision */
} block_live;

typedef struct block {
    bool assigned;          /* placed by the score rule at least once */
    uint64_t rolled_call;   /* add_step call whose loss spike rolled it back */
    prism_block_view view;
    double calibration[PRISM_PRECISION_COUNT]; /* NaN: not known */
} block;

struct prism_policy {
    prism_config cfg;
    prism_config pending;
    bool has_pending;
    prism_idmap ids;
    block *blocks;
    block_live *live;      /* by slot, as blocks */
    size_t nblocks, cap_blocks;
    double *windows;       /* cap_blocks * stride */
    /* cap_blocks * stride, laid out as windows: the entry carried saturation figures, and its
     * saturated and underflowed fractions. NULL until some report carries figures (most jobs'
     * never do, and their steps then touch none of it). */
    uint8_t *sat_has;
    double *sat_val, *und_val;
    size_t stride;         /* the history_window the array was laid out for */
    double *losses;        /* W: ring of loss_cap values */
    double *loss_sorted;   /* W's loss_len values in ascending order (room for loss_cap), for the median */
    size_t loss_cap, loss_len, loss_head;
    prism_policy_counters counters;
    uint32_t *order;       /* slots of reported blocks in ascending id order */
    size_t norder;
    bool order_dirty;
    uint64_t collected;
    uint64_t calls;
    bool has_last_step;
    uint64_t last_step;
    uint64_t map_version;
    prism_change *changes;
    size_t nchanges, cap_changes;
    uint32_t *step_slots;  /* slot of each record of the current step (then of the last one) */
    uint32_t *step_ids;    /* block id of each record of the last step: a step in the same order
                            * finds its slots here, without the hash table */
    size_t cap_step_slots, nstep_ids;
    uint64_t *order_keys;  /* scratch of refresh_order, cap_order_keys entries */
    size_t cap_order_keys;
};

/* The arrays a pending config needs (a new history_window's windows, a new loss_spike_window's
 * W), allocated before a step changes anything so that applying it cannot fail. */
typedef struct config_room {
    bool windows, losses;
    double *nw, *nsv, *nuv;
    uint8_t *nh;
    double *nl, *ns;
} config_room;

const char *prism_reason_name(prism_reason r)
{
    switch (r) {
    case PRISM_REASON_NONE: return "none";
    case PRISM_REASON_SCORE: return "score";
    case PRISM_REASON_OVERRIDE: return "override";
    case PRISM_REASON_MODE: return "mode";
    case PRISM_REASON_NONFINITE: return "nonfinite";
    case PRISM_REASON_LOSS_SPIKE: return "loss_spike";
    case PRISM_REASON_FORMAT: return "format";
    case PRISM_REASON_SATURATION: return "saturation";
    }
    return "?";
}

prism_status prism_block_stats_check(const prism_block_stats *s, prism_error *err)
{
    /* NaN compares false, so these reject negatives and let a NaN l2 through as non-finite. */
    if (s->l2_norm < 0)
        return prism_error_set(err, PRISM_ERR_INVALID, "block %u: l2_norm %g is negative", s->block_id,
                               s->l2_norm);
    if (s->max_abs < 0)
        return prism_error_set(err, PRISM_ERR_INVALID, "block %u: max_abs %g is negative", s->block_id,
                               s->max_abs);
    if (s->variance < 0)
        return prism_error_set(err, PRISM_ERR_INVALID, "block %u: variance %g is negative", s->block_id,
                               s->variance);
    if (s->nonfinite > s->numel)
        return prism_error_set(err, PRISM_ERR_INVALID, "block %u: nonfinite %llu exceeds numel %llu",
                               s->block_id, (unsigned long long)s->nonfinite, (unsigned long long)s->numel);
    if (s->has_saturation) {
        if (!(s->saturated_fraction >= 0 && s->saturated_fraction <= 1))
            return prism_error_set(err, PRISM_ERR_INVALID, "block %u: saturated_fraction %g is not in [0, 1]",
                                   s->block_id, s->saturated_fraction);
        if (!(s->underflowed_fraction >= 0 && s->underflowed_fraction <= 1))
            return prism_error_set(err, PRISM_ERR_INVALID, "block %u: underflowed_fraction %g is not in [0, 1]",
                                   s->block_id, s->underflowed_fraction);
    }
    return PRISM_OK;
}

bool prism_block_stats_finite(const prism_block_stats *s)
{
    return s->nonfinite == 0 && isfinite(s->l2_norm);
}

static prism_status nomem(prism_error *err)
{
    return prism_error_set(err, PRISM_ERR_NOMEM, "out of memory");
}

static int compare_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* Room for a W of cap losses and its sorted mirror. */
static prism_status losses_alloc(size_t cap, double **nl, double **ns, prism_error *err)
{
    *nl = malloc(cap * sizeof **nl);
    *ns = malloc(cap * sizeof **ns);
    if (!*nl || !*ns) {
        free(*nl);
        free(*ns);
        *nl = *ns = NULL;
        return nomem(err);
    }
    return PRISM_OK;
}

/* W moved into nl / ns (from losses_alloc) with room for cap, keeping its newest values (oldest
 * first at index 0). */
static void losses_commit(prism_policy *p, size_t cap, double *nl, double *ns)
{
    size_t keep = p->loss_len < cap ? p->loss_len : cap;
    for (size_t i = 0; i < keep; i++)
        ns[i] = nl[i] = p->losses[(p->loss_head + p->loss_len - keep + i) % p->loss_cap];
    qsort(ns, keep, sizeof *ns, compare_double);
    free(p->losses);
    free(p->loss_sorted);
    p->losses = nl;
    p->loss_sorted = ns;
    p->loss_cap = cap;
    p->loss_len = keep;
    p->loss_head = 0;
}

/* Gives W room for cap losses, keeping its newest values. */
static prism_status resize_losses(prism_policy *p, size_t cap, prism_error *err)
{
    double *nl, *ns;
    prism_status st = losses_alloc(cap, &nl, &ns, err);
    if (st == PRISM_OK)
        losses_commit(p, cap, nl, ns);
    return st;
}

/* The first index of the n sorted values at which v could go without breaking the order after
 * it (values < v before it); W holds finite values only. */
static size_t sorted_lower(const double *sorted, size_t n, double v)
{
    size_t lo = 0, hi = n;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (sorted[mid] < v)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

/* Appends loss to W (the oldest leaves when W is full), keeping loss_sorted in step: O(W) moves
 * instead of a sort per step. */
static void loss_push(prism_policy *p, double loss)
{
    if (p->loss_len < p->loss_cap) {
        p->losses[(p->loss_head + p->loss_len) % p->loss_cap] = loss;
        p->loss_len++;
    } else {
        double old = p->losses[p->loss_head];
        size_t at = sorted_lower(p->loss_sorted, p->loss_len, old); /* an equal value: any one will do */
        memmove(p->loss_sorted + at, p->loss_sorted + at + 1, (p->loss_len - at - 1) * sizeof(double));
        p->losses[p->loss_head] = loss;
        p->loss_head = (p->loss_head + 1) % p->loss_cap;
    }
    size_t n = p->loss_len - 1; /* the sorted values besides the new one */
    size_t at = sorted_lower(p->loss_sorted, n, loss);
    memmove(p->loss_sorted + at + 1, p->loss_sorted + at, (n - at) * sizeof(double));
    p->loss_sorted[at] = loss;
}

/* The median of W (not empty): the middle value in ascending order, or the mean of the two middle
 * values of an even count. */
static double loss_median(const prism_policy *p)
{
    size_t m = p->loss_len / 2;
    return p->loss_len % 2 ? p->loss_sorted[m] : (p->loss_sorted[m - 1] + p->loss_sorted[m]) / 2.0;
}

prism_policy *prism_policy_create(const prism_config *cfg, prism_error *err)
{
    if (prism_config_validate(cfg, err))
        return NULL;
    prism_policy *p = calloc(1, sizeof *p);
    if (!p) {
        nomem(err);
        return NULL;
    }
    if (prism_config_copy(&p->cfg, cfg, err)) {
        free(p);
        return NULL;
    }
    prism_idmap_init(&p->ids);
    p->stride = (size_t)cfg->history_window;
    if (resize_losses(p, (size_t)cfg->loss_spike_window, err)) {
        prism_policy_destroy(p);
        return NULL;
    }
    return p;
}

void prism_policy_destroy(prism_policy *p)
{
    if (!p)
        return;
    prism_config_free(&p->cfg);
    if (p->has_pending)
        prism_config_free(&p->pending);
    prism_idmap_free(&p->ids);
    free(p->blocks);
    free(p->live);
    free(p->windows);
    free(p->sat_has);
    free(p->sat_val);
    free(p->und_val);
    free(p->losses);
    free(p->loss_sorted);
    free(p->order);
    free(p->changes);
    free(p->order_keys);
    free(p->step_slots);
    free(p->step_ids);
    free(p);
}

const prism_config *prism_policy_config(const prism_policy *p)
{
    return &p->cfg;
}

const prism_config *prism_policy_next_config(const prism_policy *p)
{
    return p->has_pending ? &p->pending : &p->cfg;
}

prism_status prism_policy_set_config(prism_policy *p, const prism_config *cfg, prism_error *err)
{
    prism_status st = prism_config_validate(cfg, err);
    if (st)
        return st;
    prism_config copy;
    if ((st = prism_config_copy(&copy, cfg, err)))
        return st;
    if (p->has_pending)
        prism_config_free(&p->pending);
    p->pending = copy;
    p->has_pending = true;
    return PRISM_OK;
}

/* The slot of id, created (unreported) when absent. */
static prism_status slot_of(prism_policy *p, uint32_t id, uint32_t *slot, prism_error *err)
{
    uint32_t s = prism_idmap_get(&p->ids, id);
    if (s != PRISM_IDMAP_NONE) {
        *slot = s;
        return PRISM_OK;
    }
    if (p->nblocks >= UINT32_MAX - 1)
        return prism_error_set(err, PRISM_ERR_LIMIT, "too many blocks");
    if (p->nblocks == p->cap_blocks) {
        size_t ncap = p->cap_blocks ? p->cap_blocks * 2 : 64;
        block *nb = realloc(p->blocks, ncap * sizeof *nb);
        if (!nb)
            return nomem(err);
        p->blocks = nb;
        block_live *nl = realloc(p->live, ncap * sizeof *nl);
        if (!nl)
            return nomem(err);
        p->live = nl;
        double *nw = realloc(p->windows, ncap * p->stride * sizeof *nw);
        if (!nw)
            return nomem(err);
        p->windows = nw;
        if (p->sat_has) {
            uint8_t *nh = realloc(p->sat_has, ncap * p->stride * sizeof *nh);
            if (!nh)
                return nomem(err);
            p->sat_has = nh;
            double *nsv = realloc(p->sat_val, ncap * p->stride * sizeof *nsv);
            if (!nsv)
                return nomem(err);
            p->sat_val = nsv;
            double *nuv = realloc(p->und_val, ncap * p->stride * sizeof *nuv);
            if (!nuv)
                return nomem(err);
            p->und_val = nuv;
        }
        uint32_t *no = realloc(p->order, ncap * sizeof *no);
        if (!no)
            return nomem(err);
        p->order = no;
        p->cap_blocks = ncap;
    }
    if (prism_idmap_put(&p->ids, id, (uint32_t)p->nblocks))
        return nomem(err);
    block *b = &p->blocks[p->nblocks];
    memset(b, 0, sizeof *b);
    memset(&p->live[p->nblocks], 0, sizeof p->live[p->nblocks]);
    b->view.id = id;
    b->view.precision = PRISM_PRECISION_BF16;
    b->view.candidate = prism_config_low_format(&p->cfg);
    for (int f = 0; f < PRISM_PRECISION_COUNT; f++)
        b->calibration[f] = NAN;
    *slot = (uint32_t)p->nblocks++;
    return PRISM_OK;
}

prism_status prism_policy_set_block_bytes(prism_policy *p, uint32_t block_id, uint64_t bytes, prism_error *err)
{
    uint32_t s = 0;
    prism_status st = slot_of(p, block_id, &s, err);
    if (!st)
        p->blocks[s].view.param_bytes_bf16 = bytes;
    return st;
}

prism_status prism_policy_set_calibration(prism_policy *p, prism_precision format, uint32_t block_id,
                                          double relative_error, prism_error *err)
{
    if (format == PRISM_PRECISION_BF16 || (unsigned)format >= PRISM_PRECISION_COUNT)
        return prism_error_set(err, PRISM_ERR_INVALID, "calibration format must be a low precision, got %s",
                               prism_precision_name(format));
    if (!isfinite(relative_error) || relative_error < 0)
        return prism_error_set(err, PRISM_ERR_INVALID,
                               "block %u: calibration error %g must be a finite number >= 0", block_id,
                               relative_error);
    uint32_t s = 0;
    prism_status st = slot_of(p, block_id, &s, err);
    if (!st)
        p->blocks[s].calibration[format] = relative_error;
    return st;
}

prism_status prism_policy_set_calibrations(prism_policy *p, prism_precision format, const uint32_t *block_ids,
                                           const double *errors, size_t count, size_t *bad, prism_error *err)
{
    *bad = 0;
    if (format == PRISM_PRECISION_BF16 || (unsigned)format >= PRISM_PRECISION_COUNT)
        return prism_error_set(err, PRISM_ERR_INVALID, "calibration format must be a low precision, got %s",
                               prism_precision_name(format));
    for (size_t i = 0; i < count; i++) {
        if (!isfinite(errors[i]) || errors[i] < 0) {
            *bad = i;
            return prism_error_set(err, PRISM_ERR_INVALID,
                                   "block %u: calibration error %g must be a finite number >= 0", block_ids[i],
                                   errors[i]);
        }
    }
    /* Every slot exists before any error is written: a slot of a block never reported shows
     * nowhere, so one made for a report that then fails changes nothing a caller sees. */
    for (size_t i = 0; i < count; i++) {
        uint32_t s;
        prism_status st = slot_of(p, block_ids[i], &s, err);
        if (st) {
            *bad = i;
            return st;
        }
    }
    for (size_t i = 0; i < count; i++)
        p->blocks[prism_idmap_get(&p->ids, block_ids[i])].calibration[format] = errors[i];
    return PRISM_OK;
}

static double *window_of(prism_policy *p, uint32_t slot)
{
    return p->windows + (size_t)slot * p->stride;
}

/* Makes the saturation arrays (every entry without figures) before the first entry with
 * figures; a no-op once they exist. */
static prism_status saturation_alloc(prism_policy *p, prism_error *err)
{
    if (p->sat_has)
        return PRISM_OK;
    size_t room = (p->cap_blocks ? p->cap_blocks : 1) * p->stride;
    uint8_t *nh = calloc(room, sizeof *nh);
    double *nsv = calloc(room, sizeof *nsv), *nuv = calloc(room, sizeof *nuv);
    if (!nh || !nsv || !nuv) {
        free(nh);
        free(nsv);
        free(nuv);
        return nomem(err);
    }
    p->sat_has = nh;
    p->sat_val = nsv;
    p->und_val = nuv;
    return PRISM_OK;
}

/* Index i (0 oldest) of a window whose oldest entry is at head: no division (the stride is a
 * variable, and a division per entry was most of a decision's time at 100,000 blocks). */
static size_t ring_at(uint32_t head, uint32_t i, size_t stride)
{
    size_t at = (size_t)head + i;
    return at >= stride ? at - stride : at;
}

/* Appends a window entry: rel and, when s carries them, the step's saturation figures (the
 * arrays exist: saturation_alloc ran before any entry with figures). */
static void window_push(prism_policy *p, uint32_t slot, double rel, const prism_block_stats *s)
{
    block_live *b = &p->live[slot];
    size_t at;
    if (b->win_len < p->stride) {
        at = ring_at(b->win_head, b->win_len, p->stride);
        b->win_len++;
    } else {
        at = b->win_head;
        b->win_head = (uint32_t)ring_at(b->win_head, 1, p->stride);
    }
    at += (size_t)slot * p->stride;
    p->windows[at] = rel;
    if (p->sat_has) {
        bool has = s && s->has_saturation;
        p->sat_has[at] = has;
        p->sat_val[at] = has ? s->saturated_fraction : 0.0;
        p->und_val[at] = has ? s->underflowed_fraction : 0.0;
    }
}

/* Frees what config_room_alloc made and apply_pending_config did not take. */
static void config_room_free(config_room *r)
{
    free(r->nw);
    free(r->nh);
    free(r->nsv);
    free(r->nuv);
    free(r->nl);
    free(r->ns);
    *r = (config_room){0};
}

/* Allocates what applying the pending config will need (nothing when there is none). */
static prism_status config_room_alloc(prism_policy *p, config_room *r, prism_error *err)
{
    *r = (config_room){0};
    if (!p->has_pending)
        return PRISM_OK;
    size_t stride = (size_t)p->pending.history_window, cap = (size_t)p->pending.loss_spike_window;
    if (stride != p->stride) {
        size_t room = (p->cap_blocks ? p->cap_blocks : 1) * stride;
        r->windows = true;
        r->nw = malloc(room * sizeof *r->nw);
        bool sat = p->sat_has != NULL;
        r->nh = sat ? malloc(room * sizeof *r->nh) : NULL;
        r->nsv = sat ? malloc(room * sizeof *r->nsv) : NULL;
        r->nuv = sat ? malloc(room * sizeof *r->nuv) : NULL;
        if (!r->nw || (sat && (!r->nh || !r->nsv || !r->nuv))) {
            config_room_free(r);
            return nomem(err);
        }
    }
    if (cap != p->loss_cap) {
        r->losses = true;
        if (losses_alloc(cap, &r->nl, &r->ns, err)) {
            config_room_free(r);
            return PRISM_ERR_NOMEM;
        }
    }
    return PRISM_OK;
}

/* Lays the windows out again for a new history_window in the room's arrays, keeping each block's
 * newest values. */
static void relayout_windows(prism_policy *p, size_t stride, config_room *r)
{
    double *nw = r->nw, *nsv = r->nsv, *nuv = r->nuv;
    uint8_t *nh = r->nh;
    r->nw = r->nsv = r->nuv = NULL;
    r->nh = NULL;
    for (size_t s = 0; s < p->nblocks; s++) {
        block_live *b = &p->live[s];
        uint32_t keep = b->win_len < stride ? b->win_len : (uint32_t)stride;
        for (uint32_t i = 0; i < keep; i++) {
            size_t from = s * p->stride + (b->win_head + b->win_len - keep + i) % p->stride;
            nw[s * stride + i] = p->windows[from];
            if (nh) {
                nh[s * stride + i] = p->sat_has[from];
                nsv[s * stride + i] = p->sat_val[from];
                nuv[s * stride + i] = p->und_val[from];
            }
        }
        b->win_len = keep;
        b->win_head = 0;
    }
    free(p->windows);
    free(p->sat_has);
    free(p->sat_val);
    free(p->und_val);
    p->windows = nw;
    p->sat_has = nh;
    p->sat_val = nsv;
    p->und_val = nuv;
    p->stride = stride;
}

/* Puts the pending config in force with the room config_room_alloc made for it: cannot fail. */
static void apply_pending_config(prism_policy *p, config_room *r)
{
    if (!p->has_pending)
        return;
    if (r->windows)
        relayout_windows(p, (size_t)p->pending.history_window, r);
    if (r->losses) {
        losses_commit(p, (size_t)p->pending.loss_spike_window, r->nl, r->ns);
        r->nl = r->ns = NULL;
    }
    prism_config_free(&p->cfg);
    p->cfg = p->pending;
    p->has_pending = false;
}

static prism_status record_change(prism_policy *p, block *b, prism_precision to, uint64_t step,
                                  prism_reason reason, prism_error *err)
{
    if (p->nchanges == p->cap_changes) {
        size_t ncap = p->cap_changes ? p->cap_changes * 2 : 64;
        prism_change *nc = realloc(p->changes, ncap * sizeof *nc);
        if (!nc)
            return nomem(err);
        p->changes = nc;
        p->cap_changes = ncap;
    }
    p->changes[p->nchanges++] = (prism_change){b->view.id, b->view.precision, to, step, reason};
    b->view.precision = to;
    b->view.reason = reason;
    b->view.has_switch = true;
    b->view.last_switch_step = step;
    return PRISM_OK;
}

static bool is_low(prism_precision x)
{
    return x != PRISM_PRECISION_BF16;
}

/* fmin(x, y) and fmax(x, y) for a y that is not NaN, as glibc's (x86-64 minsd/maxsd): x when
 * x < y (x > y), else y, so y for a NaN x and for equal zeros of either sign; inline, where the
 * library calls were ~5% of a decision's time. */
static double min_of(double x, double y)
{
    return x < y ? x : y;
}

static double max_of(double x, double y)
{
    return x > y ? x : y;
}

/* The override that applies to a block under cfg: 0 none, 1 bf16, 2 low. */
static int override_of(const prism_config *cfg, uint32_t id)
{
    if (!cfg->enabled || (cfg->force_bf16_blocks.count == 0 && cfg->force_int8_blocks.count == 0))
        return 0;
    if (prism_block_list_contains(&cfg->force_bf16_blocks, id))
        return 1;
    if (prism_block_list_contains(&cfg->force_int8_blocks, id))
        return 2;
    return 0;
}

/* The low format a block would get now (DESIGN 4.7): under low_precision auto the first of
 * low_formats whose calibration error for the block is known and <= quant_error_threshold, else
 * the last of them; otherwise low_precision. */
static prism_precision candidate_of(const prism_config *c, const block *b)
{
    if (c->low_precision != PRISM_LOW_AUTO)
        return c->low_precision;
    const prism_format_list *l = &c->low_formats;
    for (size_t i = 0; i < l->count; i++) {
        double e = b->calibration[l->formats[i]];
        if (!isnan(e) && e <= c->quant_error_threshold)
            return l->formats[i];
    }
    return l->formats[l->count - 1];
}

/* The candidate, the score (DESIGN 4.2, with the candidate's calibration error) and the
 * saturation figures (mean over the window entries that carried them) of a block. */
static void score_block(prism_policy *p, uint32_t slot)
{
    const prism_config *c = &p->cfg;
    block *b = &p->blocks[slot];
    const block_live *live = &p->live[slot];
    prism_block_view *v = &b->view;
    v->candidate = candidate_of(c, b);
    v->has_saturation = false;
    v->saturated_fraction = v->underflowed_fraction = 0;
    size_t base = (size_t)slot * p->stride, with = 0;
    double sat = 0, und = 0;
    for (uint32_t i = 0; p->sat_has && i < live->win_len; i++) {
        size_t at = base + ring_at(live->win_head, i, p->stride);
        if (p->sat_has[at]) {
            sat += p->sat_val[at];
            und += p->und_val[at];
            with++;
        }
    }
    if (with) {
        v->has_saturation = true;
        v->saturated_fraction = sat / (double)with;
        v->underflowed_fraction = und / (double)with;
    }
    v->has_score = false;
    v->has_error_score = false;
    v->sensitivity = v->grad_score = v->relative_magnitude = v->error_score = 0;
    if (!c->enabled || c->mode == PRISM_MODE_OFF || live->win_len == 0)
        return;
    const double *w = window_of(p, slot);
    double sum = 0;
    for (uint32_t i = 0; i < live->win_len; i++)
        sum += w[ring_at(live->win_head, i, p->stride)];
    v->relative_magnitude = sum / live->win_len;
    v->grad_score = min_of(v->relative_magnitude / c->grad_sensitivity_threshold, 1.0);
    double s = v->grad_score;
    double e = b->calibration[v->candidate];
    if (!isnan(e)) {
        v->has_error_score = true;
        v->error_score = min_of(e / c->quant_error_threshold, 1.0);
        s = c->grad_weight * v->grad_score + c->error_weight * v->error_score;
    }
    v->sensitivity = min_of(max_of(s, 0.0), 1.0);
    v->has_score = true;
}

/* Where the rules of DESIGN 4.2 and 4.7 put one block at a scheduled decision of step, in this
 * order: enabled, overrides, mode; rolled back by a loss spike at this step (nothing more);
 * non-finite; saturation; score (hysteresis, cooldown, the spike's hold); format. */
static prism_status decide_block(prism_policy *p, uint32_t slot, uint64_t step, prism_error *err)
{
    const prism_config *c = &p->cfg;
    block *b = &p->blocks[slot];
    prism_block_view *v = &b->view;
    bool autolow = c->low_precision == PRISM_LOW_AUTO;
    bool nonfinite = p->live[slot].nonfinite_pending;
    p->live[slot].nonfinite_pending = false;
    score_block(p, slot);
    prism_precision cand = v->candidate;
    bool cooling = v->has_switch && step - v->last_switch_step < (uint64_t)c->min_steps_between_switches;

    int forced = override_of(c, v->id);
    v->forced = forced != 0;
    prism_precision target = v->precision;
    prism_reason reason = PRISM_REASON_SCORE;
    if (!c->enabled) {
        target = PRISM_PRECISION_BF16;
        reason = PRISM_REASON_MODE;
    } else if (forced) {
        target = forced == 1 ? PRISM_PRECISION_BF16 : cand;
        /* Under auto a forced block already low follows its candidate at once, as a format change. */
        reason = forced == 2 && autolow && is_low(v->precision) ? PRISM_REASON_FORMAT : PRISM_REASON_OVERRIDE;
    } else if (c->mode != PRISM_MODE_DYNAMIC) {
        target = PRISM_PRECISION_BF16;
        reason = PRISM_REASON_MODE;
    } else if (b->rolled_call == p->calls) {
        return PRISM_OK; /* sent to bf16 by this step's loss spike, before the per-block rules */
    } else if (nonfinite) {
        target = PRISM_PRECISION_BF16;
        reason = PRISM_REASON_NONFINITE;
    } else if (is_low(v->precision) && v->has_saturation && v->saturated_fraction > c->saturation_threshold) {
        target = PRISM_PRECISION_BF16;
        reason = PRISM_REASON_SATURATION;
    } else {
        if (v->has_score) {
            double s = v->sensitivity;
            bool want_low;
            if (!b->assigned) {
                want_low = s >= c->bf16_threshold  ? false
                           : s < c->int8_threshold ? true
                                                   : c->ambiguous_default == PRISM_AMBIGUOUS_LOW;
            } else if (is_low(v->precision)) {
                want_low = !(s >= c->bf16_threshold);
            } else {
                want_low = s < c->int8_threshold - c->hysteresis_margin;
            }
            /* A block in cooldown keeps its precision, except at its fresh assignment (DESIGN 4.2:
             * no cooldown applies there, even after an override or non-finite switch). A block a
             * loss spike rolled back is not moved low before its hold ends (DESIGN 4.7). */
            bool score_cooling = b->assigned && cooling;
            bool held = v->held && step < v->hold_until;
            b->assigned = true;
            if (!score_cooling && want_low != is_low(v->precision) && !(want_low && held))
                target = want_low ? cand : PRISM_PRECISION_BF16;
        }
        /* Under auto a block kept low moves to its candidate with reason format, unless cooling:
         * here the plain cooldown, even for a block not yet assigned by score (a block forced or
         * rolled back low and then released has a switch to cool from); score_cooling above
         * exempts only the score rule's first assignment (DESIGN 4.2). */
        if (autolow && is_low(target) && target == v->precision && target != cand && !cooling) {
            target = cand;
            reason = PRISM_REASON_FORMAT;
        }
    }
    /* A fixed low_precision: a block kept low follows a change of it at once. */
    if (!autolow && is_low(target) && target != c->low_precision) {
        target = c->low_precision;
        reason = PRISM_REASON_MODE;
    }
    if (target != v->precision)
        return record_change(p, b, target, step, reason, err);
    return PRISM_OK;
}

/* Rule 1 of DESIGN 4.7 at a loss spike at step: every reported block that is enabled, dynamic,
 * not forced, low now, last changed by score within loss_spike_window steps goes to bf16 with
 * reason loss_spike whatever its cooldown, and is held there for loss_spike_hold_steps. */
static prism_status roll_back(prism_policy *p, uint64_t step, size_t *rolled, prism_error *err)
{
    const prism_config *c = &p->cfg;
    *rolled = 0;
    if (!c->enabled || c->mode != PRISM_MODE_DYNAMIC)
        return PRISM_OK;
    for (size_t i = 0; i < p->norder; i++) {
        block *b = &p->blocks[p->order[i]];
        prism_block_view *v = &b->view;
        if (!is_low(v->precision) || v->reason != PRISM_REASON_SCORE || !v->has_switch ||
            override_of(c, v->id) != 0 || step - v->last_switch_step > (uint64_t)c->loss_spike_window)
            continue;
        prism_status st = record_change(p, b, PRISM_PRECISION_BF16, step, PRISM_REASON_LOSS_SPIKE, err);
        if (st)
            return st;
        v->held = true;
        /* A hold past the largest step is a hold at it; kept within 2^53 for JSON readers. */
        uint64_t hold = (uint64_t)c->loss_spike_hold_steps;
        v->hold_until = hold > PRISM_STEP_MAX - step ? PRISM_STEP_MAX : step + hold;
        b->rolled_call = p->calls;
        (*rolled)++;
    }
    return PRISM_OK;
}

static int compare_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return (x > y) - (x < y);
}

/* Rebuilds the id-ordered list of reported slots after new blocks appeared. */
static prism_status refresh_order(prism_policy *p, prism_error *err)
{
    if (!p->order_dirty)
        return PRISM_OK;
    if (p->cap_order_keys < p->nblocks) {
        uint64_t *grown = realloc(p->order_keys, p->nblocks * sizeof *grown);
        if (!grown)
            return nomem(err);
        p->order_keys = grown;
        p->cap_order_keys = p->nblocks;
    }
    uint64_t *keyed = p->order_keys;
    size_t n = 0;
    for (size_t s = 0; s < p->nblocks; s++)
        if (p->live[s].reported)
            keyed[n++] = (uint64_t)p->blocks[s].view.id << 32 | s;
    if (n > 1) /* keyed is NULL while the policy has no block */
        qsort(keyed, n, sizeof *keyed, compare_u64);
    for (size_t i = 0; i < n; i++)
        p->order[i] = (uint32_t)keyed[i];
    p->norder = n;
    p->order_dirty = false;
    return PRISM_OK;
}

/* The summary of a decision (DESIGN 4.4), built block by block in id order as the decision
 * goes (one pass over the blocks, not two). The saving is summed both ways, weighted by BF16
 * bytes and equally, and the end picks bytes when every block had them: the same operations in
 * the same order as weighting by w = bytes or w = 1, so the same result to the last bit. */
typedef struct summary_acc {
    double saved_bytes, total_bytes, saved_equal, total_equal, sens_sum;
    bool all_bytes;
} summary_acc;

static void summary_start(const prism_policy *p, uint64_t step, prism_summary *s, summary_acc *a)
{
    memset(s, 0, sizeof *s);
    s->step_id = step;
    s->low_precision = p->cfg.low_precision;
    *a = (summary_acc){.all_bytes = true};
}

static void summary_add(prism_summary *s, summary_acc *a, const prism_block_view *v)
{
    if (is_low(v->precision))
        s->blocks_low++;
    else
        s->blocks_bf16++;
    if ((unsigned)v->precision < PRISM_PRECISION_COUNT)
        s->blocks_by_precision[v->precision]++;
    double saving = prism_precision_saving(v->precision);
    a->all_bytes = a->all_bytes && v->param_bytes_bf16 > 0;
    a->saved_bytes += (double)v->param_bytes_bf16 * saving;
    a->total_bytes += (double)v->param_bytes_bf16;
    a->saved_equal += 1.0 * saving;
    a->total_equal += 1.0;
    if (v->has_score) {
        if (s->scored == 0 || v->sensitivity > s->max_sensitivity)
            s->max_sensitivity = v->sensitivity;
        if (s->scored == 0 || v->sensitivity < s->min_sensitivity)
            s->min_sensitivity = v->sensitivity;
        a->sens_sum += v->sensitivity;
        s->scored++;
    }
}

static void summary_end(prism_summary *s, const summary_acc *a)
{
    double saved = a->all_bytes ? a->saved_bytes : a->saved_equal;
    double total = a->all_bytes ? a->total_bytes : a->total_equal;
    if (s->scored)
        s->mean_sensitivity = a->sens_sum / (double)s->scored;
    s->bandwidth_saving_pct = total > 0 ? round(saved / total * 100.0 * 10.0) / 10.0 : 0.0;
}

/* The mean of the finite norms of a step whose plain sum overflowed: divided by the largest
 * first, so the result is finite whenever every norm is. */
static double scaled_mean_l2(const prism_block_stats *blocks, size_t count)
{
    double largest = 0, sum = 0;
    size_t n = 0;
    for (size_t i = 0; i < count; i++)
        if (prism_block_stats_finite(&blocks[i]) && blocks[i].l2_norm > largest)
            largest = blocks[i].l2_norm;
    for (size_t i = 0; i < count; i++) {
        if (prism_block_stats_finite(&blocks[i])) {
            sum += blocks[i].l2_norm / largest;
            n++;
        }
    }
    return largest * (sum / (double)n);
}

static bool is_decision_step(const prism_config *c, uint64_t n)
{
    uint64_t w = c->warmup_steps > 1 ? (uint64_t)c->warmup_steps : 1;
    return n == w || (n > w && (n - w) % (uint64_t)c->update_interval_steps == 0);
}

prism_status prism_policy_add_step(prism_policy *p, uint64_t step, const double *loss,
                                   const prism_block_stats *blocks, size_t count, prism_step_result *out,
                                   prism_error *err)
{
    memset(out, 0, sizeof *out);
    bool has_loss = loss && isfinite(*loss); /* a non-finite loss counts as none */
    if (step > PRISM_STEP_MAX)
        return prism_error_set(err, PRISM_ERR_INVALID, "step %llu is above the largest step id %llu",
                               (unsigned long long)step, (unsigned long long)PRISM_STEP_MAX);
    if (p->has_last_step && step <= p->last_step)
        return prism_error_set(err, PRISM_ERR_STATE, "step %llu is not after the last step %llu",
                               (unsigned long long)step, (unsigned long long)p->last_step);
    if (count > p->cap_step_slots) {
        uint32_t *ns = realloc(p->step_slots, count * sizeof *ns);
        if (!ns)
            return nomem(err);
        p->step_slots = ns;
        uint32_t *ni = realloc(p->step_ids, count * sizeof *ni);
        if (!ni)
            return nomem(err);
        p->step_ids = ni;
        p->cap_step_slots = count;
    }
    /* Check everything before changing anything that shows. */
    p->calls++;
    prism_status st;
    double l2_sum = 0;
    size_t finite = 0;
    for (size_t i = 0; i < count; i++) {
        const prism_block_stats *r = &blocks[i];
        if ((st = prism_block_stats_check(r, err)))
            return st;
        /* The same block at the same place as in the last step keeps its slot; else the table.
         * (step_ids[i] and step_slots[i] change together, so they always agree.) */
        if (i >= p->nstep_ids || p->step_ids[i] != r->block_id) {
            if ((st = slot_of(p, r->block_id, &p->step_slots[i], err)))
                return st;
            p->step_ids[i] = r->block_id;
            if (i >= p->nstep_ids)
                p->nstep_ids = i + 1;
        }
        if (r->has_saturation && (st = saturation_alloc(p, err)))
            return st;
        block_live *b = &p->live[p->step_slots[i]];
        if (b->seen_call == p->calls)
            return prism_error_set(err, PRISM_ERR_INVALID, "block %u appears twice in step %llu", r->block_id,
                                   (unsigned long long)step);
        b->seen_call = p->calls;
        if (prism_block_stats_finite(r)) {
            l2_sum += r->l2_norm;
            finite++;
        }
    }
    double mean_l2 = finite ? l2_sum / (double)finite : 0.0;
    if (isinf(mean_l2))
        mean_l2 = scaled_mean_l2(blocks, count);
    /* Everything the step may allocate, before anything that shows changes: room for its changes
     * (an override, a rollback and a decision per block at most), refresh_order's scratch, and the
     * pending config's arrays when the step is a decision. */
    if (p->cap_changes < 3 * p->nblocks) {
        prism_change *nc = realloc(p->changes, 3 * p->nblocks * sizeof *nc);
        if (!nc)
            return nomem(err);
        p->changes = nc;
        p->cap_changes = 3 * p->nblocks;
    }
    if (p->cap_order_keys < p->nblocks) {
        uint64_t *grown = realloc(p->order_keys, p->nblocks * sizeof *grown);
        if (!grown)
            return nomem(err);
        p->order_keys = grown;
        p->cap_order_keys = p->nblocks;
    }
    bool scheduled = is_decision_step(&p->cfg, p->collected + 1);
    config_room room = {0};
    if (scheduled && (st = config_room_alloc(p, &room, err)))
        return st;

    p->nchanges = 0;
    for (size_t i = 0; i < count; i++) {
        const prism_block_stats *r = &blocks[i];
        uint32_t slot = p->step_slots[i];
        block_live *live = &p->live[slot];
        if (!live->reported) {
            block *b = &p->blocks[slot];
            live->reported = true;
            p->order_dirty = true;
            int forced = override_of(&p->cfg, r->block_id);
            b->view.forced = forced != 0;
            b->view.candidate = candidate_of(&p->cfg, b);
            if (forced == 2 && (st = record_change(p, b, b->view.candidate, step, PRISM_REASON_OVERRIDE, err))) {
                config_room_free(&room); /* not reached: the room for changes was made above */
                return st;
            }
        }
        if (prism_block_stats_finite(r))
            window_push(p, slot, mean_l2 > 0 ? r->l2_norm / mean_l2 : 0.0, r);
        else
            live->nonfinite_pending = true;
    }
    p->collected++;
    p->has_last_step = true;
    p->last_step = step;
    if ((st = refresh_order(p, err))) {
        config_room_free(&room); /* not reached: refresh_order's scratch was made above */
        return st;
    }

    /* DESIGN 4.7 rule 1: at a scheduled decision the pending config first (the spike test uses
     * it), then the spike test against W, then W, then the rollback and the decision. Off the
     * schedule a spike that rolls back a block is a decision of its own: the config in force, no
     * scores recomputed (the views keep the last scheduled decision's), non-finite flags left
     * pending, the schedule unmoved. */
    if (scheduled) {
        apply_pending_config(p, &room);
        config_room_free(&room); /* what the config did not need */
    }
    const prism_config *c = &p->cfg;
    bool spike = has_loss && c->loss_spike_factor > 0 && p->loss_len == (size_t)c->loss_spike_window &&
                 *loss > c->loss_spike_factor * loss_median(p);
    if (has_loss && !spike)
        loss_push(p, *loss);
    size_t first_report_changes = p->nchanges, rolled = 0;
    if (spike) {
        p->counters.loss_spikes++;
        if ((st = roll_back(p, step, &rolled, err)))
            return st;
        p->counters.blocks_rolled_back += rolled;
        if (rolled && !scheduled)
            p->counters.loss_spike_decisions++;
    }
    summary_acc acc;
    if (scheduled || rolled)
        summary_start(p, step, &out->summary, &acc);
    for (size_t i = 0; (scheduled || rolled) && i < p->norder; i++) {
        uint32_t slot = p->order[i];
        if (i + 8 < p->norder) { /* the id order need not be the slot order: fetch ahead */
            uint32_t ahead = p->order[i + 8];
            __builtin_prefetch(&p->blocks[ahead]);
            __builtin_prefetch((const char *)&p->blocks[ahead] + 64);
            __builtin_prefetch((const char *)&p->blocks[ahead] + 128);
            __builtin_prefetch(&p->windows[(size_t)ahead * p->stride]);
            __builtin_prefetch(&p->live[ahead]);
        }
        if (scheduled && (st = decide_block(p, slot, step, err)))
            return st;
        summary_add(&out->summary, &acc, &p->blocks[slot].view);
    }
    out->scheduled = scheduled;
    out->loss_spike = spike;
    out->rolled_back = rolled;
    if (scheduled || rolled) {
        out->decided = true;
        summary_end(&out->summary, &acc);
        out->summary.precision_changes = p->nchanges - first_report_changes;
        out->summary.loss_spike = spike;
    }
    if (p->nchanges) {
        p->map_version++;
        out->map_changed = true;
    }
    out->map_version = p->map_version;
    out->summary.map_version = p->map_version;
    out->decided_step = step;
    out->effective_step = step + (uint64_t)p->cfg.apply_lag_steps;
    out->changes = p->changes;
    out->change_count = p->nchanges;
    return PRISM_OK;
}

void prism_policy_counters_get(const prism_policy *p, prism_policy_counters *out)
{
    *out = p->counters;
}

uint64_t prism_policy_steps_collected(const prism_policy *p)
{
    return p->collected;
}

uint64_t prism_policy_bump_version(prism_policy *p)
{
    return ++p->map_version;
}

uint64_t prism_policy_map_version(const prism_policy *p)
{
    return p->map_version;
}

size_t prism_policy_block_count(const prism_policy *p)
{
    return p->norder;
}

const prism_block_view *prism_policy_block(const prism_policy *p, size_t index)
{
    return index < p->norder ? &p->blocks[p->order[index]].view : NULL;
}

const prism_block_view *prism_policy_find_block(const prism_policy *p, uint32_t block_id)
{
    uint32_t s = prism_idmap_get(&p->ids, block_id);
    if (s == PRISM_IDMAP_NONE || !p->live[s].reported)
        return NULL;
    return &p->blocks[s].view;
}

size_t prism_policy_input_count(const prism_policy *p)
{
    return p->nblocks;
}

void prism_policy_input(const prism_policy *p, size_t index, uint32_t *block_id, uint64_t *bytes,
                        double calibration[PRISM_PRECISION_COUNT])
{
    const block *b = &p->blocks[index];
    *block_id = b->view.id;
    *bytes = b->view.param_bytes_bf16;
    memcpy(calibration, b->calibration, sizeof b->calibration);
}

void prism_policy_progress_get(const prism_policy *p, prism_policy_progress *out)
{
    out->steps_collected = p->collected;
    out->has_last_step = p->has_last_step;
    out->last_step = p->last_step;
    out->map_version = p->map_version;
    out->counters = p->counters;
    out->loss_len = (uint32_t)p->loss_len;
    out->losses = NULL;
}

size_t prism_policy_loss_window(const prism_policy *p, double *out)
{
    for (size_t i = 0; i < p->loss_len; i++)
        out[i] = p->losses[(p->loss_head + i) % p->loss_cap];
    return p->loss_len;
}

void prism_policy_block_record(const prism_policy *p, size_t index, prism_block_record *out)
{
    const block *b = &p->blocks[p->order[index]];
    out->view = b->view;
    out->assigned = b->assigned;
    memcpy(out->calibration, b->calibration, sizeof out->calibration);
    size_t base = (size_t)p->order[index] * p->stride;
    const block_live *live = &p->live[p->order[index]];
    out->window_len = live->win_len;
    bool sat = out->window_has_saturation && out->window_saturated && out->window_underflowed;
    for (uint32_t i = 0; i < live->win_len; i++) {
        size_t at = base + ring_at(live->win_head, i, p->stride);
        out->window[i] = p->windows[at];
        if (sat) {
            bool has = p->sat_has && p->sat_has[at];
            out->window_has_saturation[i] = has;
            out->window_saturated[i] = has ? p->sat_val[at] : 0.0;
            out->window_underflowed[i] = has ? p->und_val[at] : 0.0;
        }
    }
}

prism_status prism_policy_restore(prism_policy *p, const prism_policy_progress *progress,
                                  const prism_block_record *blocks, size_t count, prism_error *err)
{
    if (p->collected || p->nblocks)
        return prism_error_set(err, PRISM_ERR_STATE, "a policy can only be restored before its first step");
    if (progress->loss_len > PRISM_LOSS_WINDOW_MAX || (progress->loss_len && !progress->losses))
        return prism_error_set(err, PRISM_ERR_INVALID, "the saved loss window is damaged");
    for (uint32_t i = 0; i < progress->loss_len; i++)
        if (!isfinite(progress->losses[i]))
            return prism_error_set(err, PRISM_ERR_INVALID, "the saved loss window is damaged");
    prism_status st;
    for (size_t i = 0; i < count; i++) {
        const prism_block_record *r = &blocks[i];
        bool sat = r->window_has_saturation && r->window_saturated && r->window_underflowed;
        bool damaged = (unsigned)r->view.precision >= PRISM_PRECISION_COUNT || r->window_len > PRISM_WINDOW_MAX ||
                       (unsigned)r->view.reason > PRISM_REASON_MAX;
        for (uint32_t k = 0; sat && !damaged && k < r->window_len; k++)
            damaged = r->window_has_saturation[k] > 1 ||
                      (r->window_has_saturation[k] &&
                       !(r->window_saturated[k] >= 0 && r->window_saturated[k] <= 1 &&
                         r->window_underflowed[k] >= 0 && r->window_underflowed[k] <= 1));
        if (damaged)
            return prism_error_set(err, PRISM_ERR_INVALID, "block %u: saved state is damaged", r->view.id);
        uint32_t slot;
        if ((st = slot_of(p, r->view.id, &slot, err)))
            return st;
        for (uint32_t k = 0; sat && k < r->window_len; k++)
            if (r->window_has_saturation[k] && (st = saturation_alloc(p, err)))
                return st;
        block *b = &p->blocks[slot];
        block_live *live = &p->live[slot];
        if (live->reported)
            return prism_error_set(err, PRISM_ERR_INVALID, "block %u is saved twice", r->view.id);
        b->view = r->view; /* the scores of the last decision too, as they were served */
        /* A record saved without a candidate (an older store) shows the config's one format
         * until the next decision computes it. */
        if (b->view.candidate == PRISM_PRECISION_BF16 || (unsigned)b->view.candidate >= PRISM_PRECISION_COUNT)
            b->view.candidate = prism_config_low_format(&p->cfg);
        live->reported = true;
        b->assigned = r->assigned;
        memcpy(b->calibration, r->calibration, sizeof b->calibration);
        uint32_t keep = r->window_len < p->stride ? r->window_len : (uint32_t)p->stride;
        live->win_len = 0;
        live->win_head = 0;
        for (uint32_t k = r->window_len - keep; k < r->window_len; k++) {
            prism_block_stats figures = {0};
            figures.has_saturation = sat && r->window_has_saturation[k];
            figures.saturated_fraction = figures.has_saturation ? r->window_saturated[k] : 0.0;
            figures.underflowed_fraction = figures.has_saturation ? r->window_underflowed[k] : 0.0;
            window_push(p, slot, r->window[k], &figures);
        }
    }
    p->order_dirty = true;
    if ((st = refresh_order(p, err)))
        return st;
    p->collected = progress->steps_collected;
    p->has_last_step = progress->has_last_step;
    p->last_step = progress->last_step;
    p->map_version = progress->map_version;
    p->counters = progress->counters;
    p->loss_len = p->loss_head = 0;
    uint32_t keep = progress->loss_len < p->loss_cap ? progress->loss_len : (uint32_t)p->loss_cap;
    for (uint32_t k = progress->loss_len - keep; k < progress->loss_len; k++)
        loss_push(p, progress->losses[k]);
    return PRISM_OK;
}
