/* The hybrid-devices model of issue 15 (see hybrid.h). Every floating-point expression is
 * written in the exact order service/policy/README.md fixes; do not reassociate. */
#include "hybrid.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

const char *prism_hybrid_format_name(prism_hybrid_format f)
{
    switch (f) {
    case PRISM_HYBRID_BF16: return "bf16";
    case PRISM_HYBRID_FP16: return "fp16";
    case PRISM_HYBRID_INT8: return "int8";
    case PRISM_HYBRID_FP8_E4M3: return "fp8_e4m3";
    }
    return "?";
}

int prism_hybrid_mantissa_bits(prism_hybrid_format f)
{
    switch (f) {
    case PRISM_HYBRID_BF16: return 7;
    case PRISM_HYBRID_FP16: return 10;
    case PRISM_HYBRID_FP8_E4M3: return 3;
    case PRISM_HYBRID_INT8: return 0;
    }
    return 0;
}

int prism_hybrid_bits(prism_hybrid_format f)
{
    return f == PRISM_HYBRID_INT8 || f == PRISM_HYBRID_FP8_E4M3 ? 8 : 16;
}

const char *prism_hybrid_reason_name(prism_hybrid_reason r)
{
    switch (r) {
    case PRISM_HYBRID_OK: return "ok";
    case PRISM_HYBRID_MEMORY: return "memory";
    case PRISM_HYBRID_TIME: return "time";
    }
    return "?";
}

void prism_hybrid_problem_defaults(prism_hybrid_problem *p)
{
    memset(p, 0, sizeof *p);
    p->memory_fraction = 0.9;
    p->gamma = 4.0;
    p->low_format = PRISM_HYBRID_LOW_AUTO;
}

double prism_hybrid_ops(const prism_hybrid_class *c, prism_hybrid_format f)
{
    switch (f) {
    case PRISM_HYBRID_BF16: return c->bf16_ops;
    case PRISM_HYBRID_FP16: return c->fp16_ops;
    case PRISM_HYBRID_INT8: return c->int8_ops;
    case PRISM_HYBRID_FP8_E4M3: return c->fp8_ops;
    }
    return 0.0;
}

int prism_hybrid_epsilon(double v)
{
    if (v == 0.0)
        return 0;
    int e = 0;
    (void)frexp(v, &e);
    return e;
}

int prism_hybrid_clamped_exponent(double v)
{
    int e = abs(prism_hybrid_epsilon(v));
    return e < 5 ? e : 5;
}

static double clamped_exponent(double v)
{
    return (double)prism_hybrid_clamped_exponent(v);
}

double prism_hybrid_omega(const prism_hybrid_stats *s, size_t i, size_t L, double gamma, prism_hybrid_format b,
                          prism_hybrid_format high)
{
    double nX = s->x_l2, nW = s->w_l2, nG = s->g_l2;
    double DX = s->x_numel, DW = s->w_numel, DY = s->y_numel;
    double eX = clamped_exponent(sqrt(nX / DX));
    double eW = clamped_exponent(sqrt(nW / DW));
    double eG = clamped_exponent(s->g_max_abs);
    double fwd, bwd;
    if (b == PRISM_HYBRID_INT8) {
        const double q = 127.0;
        double SX = s->x_max_abs / q, SW = s->w_max_abs / q;
        int k = prism_hybrid_mantissa_bits(high);
        fwd = ((nW * (SX * SX)) * DX + (nX * (SW * SW)) * DW) / 6.0;
        bwd = ((nG * (SX * SX)) * DX + (nX * ldexp(1.0, 2 * (int)eX - 2 * k)) * DY) / 6.0;
    } else {
        double p = ldexp(1.0, -2 * prism_hybrid_mantissa_bits(b));
        fwd = p * ((nW * DX) * eX + (nX * DW) * eW) / 6.0;
        bwd = p * ((nG * DX) * eX + (nX * DY) * eG) / 6.0;
    }
    double d = (double)(i + 1);
    double rest = (double)(L - (i + 1));
    return ((gamma * rest) * fwd) + (d * bwd);
}

prism_status prism_hybrid_resolve(const prism_hybrid_problem *p, prism_hybrid_class_formats *out,
                                  prism_error *err)
{
    /* The formats of every class, and the largest throughput of a high format. */
    double best = 0.0;
    for (size_t k = 0; k < p->class_count; k++) {
        const prism_hybrid_class *c = &p->classes[k];
        prism_hybrid_class_formats *f = &out[k];
        f->high = c->bf16_ops > 0 ? PRISM_HYBRID_BF16 : PRISM_HYBRID_FP16;
        switch (p->low_format) {
        case PRISM_HYBRID_LOW_INT8: f->low = PRISM_HYBRID_INT8; break;
        case PRISM_HYBRID_LOW_FP8_E4M3: f->low = PRISM_HYBRID_FP8_E4M3; break;
        default: f->low = c->fp8_ops > 0 ? PRISM_HYBRID_FP8_E4M3 : PRISM_HYBRID_INT8; break;
        }
        f->fixed = p->fixed_given ? c->fixed : false;
        double ops = prism_hybrid_ops(c, f->high);
        if (k == 0 || ops > best)
            best = ops;
    }
    if (!p->fixed_given)
        for (size_t k = 0; k < p->class_count; k++)
            out[k].fixed = prism_hybrid_ops(&p->classes[k], out[k].high) == best;
    /* Every format a class runs needs a throughput: its high format, and its low format unless
     * the class is fixed (a fixed class runs every block high, in the plan and in both
     * baselines). Classes in file order, the high format first: the first problem is named. */
    for (size_t k = 0; k < p->class_count; k++) {
        const prism_hybrid_class *c = &p->classes[k];
        const prism_hybrid_class_formats *f = &out[k];
        if (f->high == PRISM_HYBRID_FP16 && !(c->fp16_ops > 0))
            return prism_error_set(err, PRISM_ERR_INVALID,
                                   "classes[%zu].profile.fp16_ops_per_second: must be > 0 when "
                                   "bf16_ops_per_second is 0 (the class needs a 16-bit high format)",
                                   k);
        if (f->fixed)
            continue;
        if (f->low == PRISM_HYBRID_INT8 && !(c->int8_ops > 0))
            return prism_error_set(err, PRISM_ERR_INVALID,
                                   "classes[%zu].profile.int8_ops_per_second: must be > 0: the class's low "
                                   "format is int8",
                                   k);
        if (f->low == PRISM_HYBRID_FP8_E4M3 && !(c->fp8_ops > 0))
            return prism_error_set(err, PRISM_ERR_INVALID,
                                   "classes[%zu].profile.fp8_ops_per_second: must be > 0: the class's low "
                                   "format is fp8_e4m3",
                                   k);
    }
    return PRISM_OK;
}

static bool is_low(const prism_hybrid_class_formats *fm, prism_hybrid_format b)
{
    return b == fm->low && b != fm->high;
}

double prism_hybrid_forward_seconds(const prism_hybrid_block *blk, const prism_hybrid_class *c,
                                    const prism_hybrid_class_formats *fm, prism_hybrid_format b)
{
    double t = blk->flops / prism_hybrid_ops(c, b);
    if (is_low(fm, b))
        t = t + (c->quantize_fixed_seconds + c->quantize_seconds_per_byte * (blk->param_bytes + blk->activation_bytes));
    return t;
}

double prism_hybrid_backward_seconds(const prism_hybrid_block *blk, const prism_hybrid_class *c,
                                     const prism_hybrid_class_formats *fm, prism_hybrid_format b)
{
    prism_hybrid_format run = b == PRISM_HYBRID_INT8 ? fm->high : b;
    return (2.0 * blk->flops) / prism_hybrid_ops(c, run);
}

/* Per (class, block): fwd and bwd seconds in the low [0] and high [1] format, computed once so
 * that the raise loop only adds and compares. */
typedef struct time_table {
    double *fwd, *bwd; /* [(k * L + i) * 2 + high] */
    double *bsum;      /* [class_count] scratch */
    double *fsum;      /* [class_count] scratch */
} time_table;

static void time_table_free(time_table *t)
{
    free(t->fwd);
    free(t->bwd);
    free(t->bsum);
    free(t->fsum);
}

static prism_status time_table_build(const prism_hybrid_problem *p, const prism_hybrid_class_formats *fm,
                                     time_table *t)
{
    size_t L = p->block_count, C = p->class_count;
    memset(t, 0, sizeof *t);
    size_t n = C * L * 2;
    t->fwd = malloc((n ? n : 1) * sizeof *t->fwd);
    t->bwd = malloc((n ? n : 1) * sizeof *t->bwd);
    t->bsum = malloc((C ? C : 1) * sizeof *t->bsum);
    t->fsum = malloc((C ? C : 1) * sizeof *t->fsum);
    if (!t->fwd || !t->bwd || !t->bsum || !t->fsum) {
        time_table_free(t);
        return PRISM_ERR_NOMEM;
    }
    for (size_t k = 0; k < C; k++)
        for (size_t i = 0; i < L; i++) {
            size_t at = (k * L + i) * 2;
            t->fwd[at] = prism_hybrid_forward_seconds(&p->blocks[i], &p->classes[k], &fm[k], fm[k].low);
            t->bwd[at] = prism_hybrid_backward_seconds(&p->blocks[i], &p->classes[k], &fm[k], fm[k].low);
            t->fwd[at + 1] = prism_hybrid_forward_seconds(&p->blocks[i], &p->classes[k], &fm[k], fm[k].high);
            t->bwd[at + 1] = prism_hybrid_backward_seconds(&p->blocks[i], &p->classes[k], &fm[k], fm[k].high);
        }
    return PRISM_OK;
}

static size_t slot(const prism_hybrid_class_formats *fm, prism_hybrid_format b)
{
    return b == fm->high ? 1 : 0;
}

/* T of a plan from the table: f_k(i) = (Σ_{j=0..L−1} fwd) + (Σ_{j=L−1..i} bwd), each sum from
 * 0.0; all-reduce from block L−1 down to 0, each waiting for the slowest class and the previous
 * all-reduce; T = max(end(0), max_k f_k(0)). */
static double time_of(const prism_hybrid_problem *p, const prism_hybrid_class_formats *fm, const time_table *t,
                      const prism_hybrid_format *plan, double *compute)
{
    size_t L = p->block_count, C = p->class_count;
    for (size_t k = 0; k < C; k++) {
        double s = 0.0;
        for (size_t j = 0; j < L; j++)
            s = s + t->fwd[(k * L + j) * 2 + slot(&fm[k], plan[k * L + j])];
        t->fsum[k] = s;
        t->bsum[k] = 0.0;
    }
    double end = 0.0, slowest = 0.0;
    for (size_t i = L; i-- > 0;) {
        slowest = 0.0;
        for (size_t k = 0; k < C; k++) {
            t->bsum[k] = t->bsum[k] + t->bwd[(k * L + i) * 2 + slot(&fm[k], plan[k * L + i])];
            double f = t->fsum[k] + t->bsum[k];
            if (k == 0 || f > slowest)
                slowest = f;
        }
        double start = slowest > end ? slowest : end;
        end = (start + p->link_latency_seconds) + p->blocks[i].param_bytes / p->link_bytes_per_second;
    }
    if (L == 0) /* f_k(0) is the empty sum */
        for (size_t k = 0; k < C; k++)
            t->bsum[k] = 0.0;
    double f0 = 0.0;
    for (size_t k = 0; k < C; k++) {
        double f = t->fsum[k] + t->bsum[k];
        if (compute)
            compute[k] = f;
        if (k == 0 || f > f0)
            f0 = f;
    }
    return end > f0 ? end : f0;
}

prism_status prism_hybrid_iteration_seconds(const prism_hybrid_problem *p, const prism_hybrid_class_formats *fm,
                                            const prism_hybrid_format *plan, double *compute, double *out)
{
    time_table t;
    if (time_table_build(p, fm, &t))
        return PRISM_ERR_NOMEM;
    *out = time_of(p, fm, &t, plan, compute);
    time_table_free(&t);
    return PRISM_OK;
}

double prism_hybrid_memory(const prism_hybrid_problem *p, const prism_hybrid_format *row)
{
    double m = 0.0;
    for (size_t i = 0; i < p->block_count; i++)
        m = m + (p->blocks[i].state_bytes + (p->blocks[i].activation_bytes * (double)prism_hybrid_bits(row[i])) / 16.0);
    return m;
}

double prism_hybrid_budget(const prism_hybrid_problem *p, size_t k)
{
    return p->memory_fraction * p->classes[k].memory_bytes;
}

/* Σ ω over the non-fixed classes in file order and blocks in id order, one running double. */
static double indicator_of(const prism_hybrid_problem *p, const prism_hybrid_class_formats *fm,
                           const double *omega, const prism_hybrid_format *plan)
{
    size_t L = p->block_count;
    double s = 0.0;
    for (size_t k = 0; k < p->class_count; k++) {
        if (fm[k].fixed)
            continue;
        for (size_t i = 0; i < L; i++)
            s = s + omega[(k * L + i) * 2 + slot(&fm[k], plan[k * L + i])];
    }
    return s;
}

static bool all_fit(const prism_hybrid_problem *p, const prism_hybrid_class_formats *fm,
                    const prism_hybrid_format *plan)
{
    for (size_t k = 0; k < p->class_count; k++)
        if (!fm[k].fixed && prism_hybrid_memory(p, plan + k * p->block_count) > prism_hybrid_budget(p, k))
            return false;
    return true;
}

/* The raise order: decreasing Δ, then class name (strcmp: byte order), then block id. */
static int compare_raises(const prism_hybrid_problem *p, const prism_hybrid_raise *x, const prism_hybrid_raise *y)
{
    if (x->delta > y->delta)
        return -1;
    if (x->delta < y->delta)
        return 1;
    int c = strcmp(p->classes[x->class_index].name, p->classes[y->class_index].name);
    if (c)
        return c;
    if (x->class_index != y->class_index)
        return x->class_index < y->class_index ? -1 : 1;
    return (x->block > y->block) - (x->block < y->block);
}

/* A merge sort by compare_raises (qsort has no context argument, and the library keeps no
 * globals). */
static void sort_raises(const prism_hybrid_problem *p, prism_hybrid_raise *r, size_t n, prism_hybrid_raise *tmp)
{
    if (n < 2)
        return;
    size_t h = n / 2;
    sort_raises(p, r, h, tmp);
    sort_raises(p, r + h, n - h, tmp);
    size_t i = 0, j = h, o = 0;
    while (i < h && j < n) {
        if (compare_raises(p, &r[j], &r[i]) < 0)
            tmp[o++] = r[j++];
        else
            tmp[o++] = r[i++];
    }
    while (i < h)
        tmp[o++] = r[i++];
    while (j < n)
        tmp[o++] = r[j++];
    memcpy(r, tmp, n * sizeof *r);
}

void prism_hybrid_result_free(prism_hybrid_result *r)
{
    if (!r)
        return;
    free(r->formats);
    free(r->plan);
    free(r->memory_bytes);
    free(r->budget_bytes);
    free(r->compute_seconds);
    free(r->raises);
    size_t rc = r->refused_class;
    double rb = r->refused_bytes, rg = r->refused_budget;
    memset(r, 0, sizeof *r);
    r->refused_class = rc;
    r->refused_bytes = rb;
    r->refused_budget = rg;
}

/* The raise loop's evaluator. It keeps f_k(i) of the plan as it stands for every class, so that
 * trying a raise on class k recomputes only that class's row (O(L)) and then runs the all-reduce
 * chain over the kept values (O(L·C) compares), where time_of would redo every class. Every
 * double comes from the same operations in the same order as time_of and prism_hybrid_memory
 * (the row's forward sum, then f = forward + backward suffix from block L−1 down; each memory
 * term state + (activation · bits) / 16 summed in id order), so the results are the same bits. */
typedef struct raise_eval {
    double *f;    /* [k * L + i]: f_k(i) of the current plan */
    double *cand; /* [L]: f_k(i) of the class row being tried */
    double *link; /* [L]: W_i / link bytes per second */
    double *mem;  /* [(k * L + i) * 2 + high]: the block's memory term */
} raise_eval;

static void raise_eval_free(raise_eval *e)
{
    free(e->f);
    free(e->cand);
    free(e->link);
    free(e->mem);
}

/* f_k(i) of class k's row of plan into out[0 .. L). */
static void class_row_times(const prism_hybrid_problem *p, const prism_hybrid_class_formats *fm, const time_table *t,
                            const prism_hybrid_format *plan, size_t k, double *out)
{
    size_t L = p->block_count;
    double fsum = 0.0;
    for (size_t j = 0; j < L; j++)
        fsum = fsum + t->fwd[(k * L + j) * 2 + slot(&fm[k], plan[k * L + j])];
    double bsum = 0.0;
    for (size_t i = L; i-- > 0;) {
        bsum = bsum + t->bwd[(k * L + i) * 2 + slot(&fm[k], plan[k * L + i])];
        out[i] = fsum + bsum;
    }
}

static prism_status raise_eval_build(const prism_hybrid_problem *p, const prism_hybrid_class_formats *fm,
                                     const time_table *t, const prism_hybrid_format *plan, raise_eval *e)
{
    size_t L = p->block_count, C = p->class_count, n = C * L;
    memset(e, 0, sizeof *e);
    e->f = malloc((n ? n : 1) * sizeof *e->f);
    e->cand = malloc((L ? L : 1) * sizeof *e->cand);
    e->link = malloc((L ? L : 1) * sizeof *e->link);
    e->mem = malloc((n ? n * 2 : 1) * sizeof *e->mem);
    if (!e->f || !e->cand || !e->link || !e->mem) {
        raise_eval_free(e);
        return PRISM_ERR_NOMEM;
    }
    for (size_t k = 0; k < C; k++) {
        class_row_times(p, fm, t, plan, k, e->f + k * L);
        for (size_t i = 0; i < L; i++)
            for (size_t h = 0; h < 2; h++) {
                prism_hybrid_format b = h ? fm[k].high : fm[k].low;
                e->mem[(k * L + i) * 2 + h] =
                    p->blocks[i].state_bytes + (p->blocks[i].activation_bytes * (double)prism_hybrid_bits(b)) / 16.0;
            }
    }
    for (size_t i = 0; i < L; i++)
        e->link[i] = p->blocks[i].param_bytes / p->link_bytes_per_second;
    return PRISM_OK;
}

/* M_k of class k's row of plan, from the kept terms. */
static double raise_eval_memory(const prism_hybrid_problem *p, const prism_hybrid_class_formats *fm,
                                const raise_eval *e, const prism_hybrid_format *plan, size_t k)
{
    size_t L = p->block_count;
    double m = 0.0;
    for (size_t i = 0; i < L; i++)
        m = m + e->mem[(k * L + i) * 2 + slot(&fm[k], plan[k * L + i])];
    return m;
}

/* T of the current plan with class k's row as in plan (its f values computed into e->cand). */
static double raise_eval_time(const prism_hybrid_problem *p, const prism_hybrid_class_formats *fm,
                              const time_table *t, raise_eval *e, const prism_hybrid_format *plan, size_t kc)
{
    size_t L = p->block_count, C = p->class_count;
    class_row_times(p, fm, t, plan, kc, e->cand);
    double end = 0.0;
    for (size_t i = L; i-- > 0;) {
        double slowest = 0.0;
        for (size_t k = 0; k < C; k++) {
            double f = k == kc ? e->cand[i] : e->f[k * L + i];
            if (k == 0 || f > slowest)
                slowest = f;
        }
        double start = slowest > end ? slowest : end;
        end = (start + p->link_latency_seconds) + e->link[i];
    }
    double f0 = 0.0;
    for (size_t k = 0; k < C; k++) {
        double f = L == 0 ? 0.0 : k == kc ? e->cand[0] : e->f[k * L];
        if (k == 0 || f > f0)
            f0 = f;
    }
    return end > f0 ? end : f0;
}

prism_status prism_hybrid_plan(const prism_hybrid_problem *p, prism_hybrid_result *out, prism_error *err)
{
    memset(out, 0, sizeof *out);
    size_t L = p->block_count, C = p->class_count, n = C * L;
    prism_status st = PRISM_OK;
    time_table t = {0};
    raise_eval ev = {0};
    double *omega = NULL;
    prism_hybrid_format *work = NULL;
    prism_hybrid_raise *tmp = NULL;
    out->formats = calloc(C ? C : 1, sizeof *out->formats);
    out->plan = calloc(n ? n : 1, sizeof *out->plan);
    out->memory_bytes = calloc(C ? C : 1, sizeof *out->memory_bytes);
    out->budget_bytes = calloc(C ? C : 1, sizeof *out->budget_bytes);
    out->compute_seconds = calloc(C ? C : 1, sizeof *out->compute_seconds);
    out->raises = calloc(n ? n : 1, sizeof *out->raises);
    tmp = calloc(n ? n : 1, sizeof *tmp);
    omega = calloc(n * 2 + 1, sizeof *omega);
    work = calloc(n ? n : 1, sizeof *work);
    if (!out->formats || !out->plan || !out->memory_bytes || !out->budget_bytes || !out->compute_seconds ||
        !out->raises || !tmp || !omega || !work) {
        st = prism_error_set(err, PRISM_ERR_NOMEM, "out of memory");
        goto done;
    }
    prism_hybrid_class_formats *fm = out->formats;
    if ((st = prism_hybrid_resolve(p, fm, err)))
        goto done;
    if (time_table_build(p, fm, &t)) {
        st = prism_error_set(err, PRISM_ERR_NOMEM, "out of memory");
        goto done;
    }
    for (size_t k = 0; k < C; k++)
        for (size_t i = 0; i < L; i++) {
            omega[(k * L + i) * 2] = prism_hybrid_omega(&p->blocks[i].stats, i, L, p->gamma, fm[k].low, fm[k].high);
            omega[(k * L + i) * 2 + 1] =
                prism_hybrid_omega(&p->blocks[i].stats, i, L, p->gamma, fm[k].high, fm[k].high);
        }

    /* Baselines. */
    for (size_t k = 0; k < C; k++)
        for (size_t i = 0; i < L; i++)
            work[k * L + i] = fm[k].high;
    out->uniform_high.iteration_seconds = time_of(p, fm, &t, work, NULL);
    out->uniform_high.indicator = indicator_of(p, fm, omega, work);
    out->uniform_high.fits = all_fit(p, fm, work);
    for (size_t k = 0; k < C; k++)
        for (size_t i = 0; i < L; i++)
            work[k * L + i] = fm[k].fixed ? fm[k].high : fm[k].low;
    out->uniform_low.iteration_seconds = time_of(p, fm, &t, work, NULL);
    out->uniform_low.indicator = indicator_of(p, fm, omega, work);
    out->uniform_low.fits = all_fit(p, fm, work);

    /* The start: fixed classes high; the others low except the forced blocks. */
    prism_hybrid_format *plan = out->plan;
    for (size_t k = 0; k < C; k++)
        for (size_t i = 0; i < L; i++)
            plan[k * L + i] = fm[k].fixed || (p->force_high && p->force_high[i]) ? fm[k].high : fm[k].low;
    for (size_t k = 0; k < C; k++) {
        if (fm[k].fixed)
            continue;
        double m = prism_hybrid_memory(p, plan + k * L), b = prism_hybrid_budget(p, k);
        if (m > b) {
            out->refused_class = k;
            out->refused_bytes = m;
            out->refused_budget = b;
            st = prism_error_set(err, PRISM_ERR_LIMIT, "class \"%s\" does not fit: its start needs %.17g bytes, its budget is %.17g bytes",
                                 p->classes[k].name, m, b);
            goto done;
        }
    }
    double t0 = time_of(p, fm, &t, plan, NULL);
    out->start_seconds = t0;
    double limit = t0 * (1.0 + 1e-9);

    /* The raises: every pair low at the start, by decreasing Δ, then class name, then block id. */
    size_t nr = 0;
    for (size_t k = 0; k < C; k++)
        for (size_t i = 0; i < L; i++)
            if (!fm[k].fixed && plan[k * L + i] != fm[k].high) {
                prism_hybrid_raise *r = &out->raises[nr++];
                r->class_index = k;
                r->block = i;
                r->delta = omega[(k * L + i) * 2] - omega[(k * L + i) * 2 + 1];
            }
    sort_raises(p, out->raises, nr, tmp);
    out->raise_count = nr;
    if (raise_eval_build(p, fm, &t, plan, &ev)) {
        st = prism_error_set(err, PRISM_ERR_NOMEM, "out of memory");
        goto done;
    }
    for (size_t r = 0; r < nr; r++) {
        prism_hybrid_raise *x = &out->raises[r];
        size_t k = x->class_index, at = k * L + x->block;
        plan[at] = fm[k].high;
        double m = raise_eval_memory(p, fm, &ev, plan, k);
        bool fits = m <= prism_hybrid_budget(p, k);
        if (fits && raise_eval_time(p, fm, &t, &ev, plan, k) <= limit) {
            x->accepted = true;
            x->reason = PRISM_HYBRID_OK;
            memcpy(ev.f + k * L, ev.cand, L * sizeof *ev.cand);
        } else {
            x->accepted = false;
            x->reason = fits ? PRISM_HYBRID_TIME : PRISM_HYBRID_MEMORY;
            plan[at] = fm[x->class_index].low;
        }
    }
    out->iteration_seconds = time_of(p, fm, &t, plan, out->compute_seconds);
    out->indicator = indicator_of(p, fm, omega, plan);
    for (size_t k = 0; k < C; k++) {
        out->memory_bytes[k] = prism_hybrid_memory(p, plan + k * L);
        out->budget_bytes[k] = prism_hybrid_budget(p, k);
    }
done:
    time_table_free(&t);
    raise_eval_free(&ev);
    free(omega);
    free(work);
    free(tmp);
    if (st)
        prism_hybrid_result_free(out);
    return st;
}
