/* Hybrid-device compute plans of one job (plans.h). */
#define _POSIX_C_SOURCE 200809L
#include "plans.h"

#include "hybrid.h"
#include "hybrid_json.h"
#include "idmap.h"
#include "log.h"

#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct plan_block {
    uint32_t id;
    double flops, param_bytes, activation_bytes, state_bytes; /* 0 until a layout gives them */
    bool has_x;
    uint64_t x_step;
    uint32_t x_rank;
    double x_l2, x_max_abs, x_numel, y_numel;
    bool has_w;
    uint64_t w_step;
    uint32_t w_rank;
    double w_l2, w_max_abs, w_numel;
    bool has_g;
    double g_l2, g_max_abs;
} plan_block;

/* The plan in force, immutable once made: the plan object's text (shared with snapshots) and
 * what the agents of each class are sent. Reference counted on the policy thread: the plan in
 * force and the last durable one may be the same. */
typedef struct plan_obj {
    unsigned refs;
    prismd_shared_text *json;
    prismd_plan_class *classes;
    size_t nclasses;
    size_t nblocks; /* L of the plan */
    double iteration_seconds;
} plan_obj;

/* One device class of the job's ranks: its name and its lowest rank. */
typedef struct class_entry {
    char *name;
    uint32_t rank;
} class_entry;

/* One (class, block) pair of the raise order. */
typedef struct rank_pair {
    uint32_t cls, block;
    double delta;
} rank_pair;

struct prismd_plans {
    prism_idmap ix; /* block id -> index in blocks */
    plan_block *blocks;
    size_t nblocks, cap;
    size_t max_pairs, max_classes; /* --hybrid-max-pairs, --hybrid-max-classes */
    /* the plan in force (NULL: none) and the last one the store holds (what Welcome carries) */
    plan_obj *cur, *durable;
    uint64_t map_version, decided_step, effective_step;
    bool row_dirty;        /* the row (plan, map, status) changed since the store last took it */
    bool withdraw_pending; /* a stored plan not put in force (restart with hybrid false): the next
                            * decision sends a map without plans */
    /* the device classes of the ranks (name order), rebuilt when a Hello changes a rank's class */
    class_entry *cls;
    size_t ncls;
    bool cls_stale;
    /* the last attempt: refused (with its message) or not, and what it planned from */
    bool refused;
    char message[512];
    bool has_attempt;
    char **attempt_names;
    size_t nattempt_names;
    rank_pair *attempt_ranking;
    size_t nattempt_ranking;
    double *attempt_inputs;
    size_t nattempt_inputs;
    uint64_t replans, kept, refusals;
};

static void free_names(char **names, size_t n)
{
    for (size_t i = 0; i < n; i++)
        free(names[i]);
    free(names);
}

static void free_classes(prismd_plan_class *c, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        free(c[i].name);
        free(c[i].low_blocks);
    }
    free(c);
}

static void plan_release(plan_obj *o)
{
    if (!o || --o->refs)
        return;
    prismd_shared_text_release(o->json);
    free_classes(o->classes, o->nclasses);
    free(o);
}

static plan_obj *plan_retain(plan_obj *o)
{
    if (o)
        o->refs++;
    return o;
}

static void free_cls(prismd_plans *p)
{
    for (size_t k = 0; k < p->ncls; k++)
        free(p->cls[k].name);
    free(p->cls);
    p->cls = NULL;
    p->ncls = 0;
}

prismd_plans *prismd_plans_create(size_t max_pairs, size_t max_classes)
{
    prismd_plans *p = calloc(1, sizeof *p);
    if (p) {
        prism_idmap_init(&p->ix);
        p->max_pairs = max_pairs;
        p->max_classes = max_classes;
        p->cls_stale = true;
    }
    return p;
}

static void drop_attempt(prismd_plans *p)
{
    free_names(p->attempt_names, p->nattempt_names);
    free(p->attempt_ranking);
    free(p->attempt_inputs);
    p->attempt_names = NULL;
    p->attempt_ranking = NULL;
    p->attempt_inputs = NULL;
    p->nattempt_names = p->nattempt_ranking = p->nattempt_inputs = 0;
    p->has_attempt = false;
}

/* No plan in force from now (the last durable one stays until the store takes the change). */
static void drop_plan(prismd_plans *p)
{
    plan_release(p->cur);
    p->cur = NULL;
    p->map_version = p->decided_step = p->effective_step = 0;
}

void prismd_plans_destroy(prismd_plans *p)
{
    if (!p)
        return;
    drop_attempt(p);
    drop_plan(p);
    plan_release(p->durable);
    free_cls(p);
    prism_idmap_free(&p->ix);
    free(p->blocks);
    free(p);
}

void prismd_plans_classes_changed(prismd_plans *p)
{
    p->cls_stale = true;
}

static int compare_entries(const void *a, const void *b)
{
    const class_entry *x = a, *y = b;
    int c = strcmp(x->name, y->name);
    return c ? c : (x->rank > y->rank) - (x->rank < y->rank);
}

/* Rebuilds the class list from ranks when a Hello changed a class since the last build:
 * O(R log R). false: out of memory (the list is then empty and stays stale). */
static bool refresh_classes(prismd_plans *p, const prismd_rank_facts *ranks, size_t nranks)
{
    if (!p->cls_stale)
        return true;
    free_cls(p);
    class_entry *e = malloc((nranks ? nranks : 1) * sizeof *e);
    if (!e)
        return false;
    size_t n = 0;
    for (size_t r = 0; r < nranks; r++)
        if (ranks[r].has_device && ranks[r].device_class)
            e[n++] = (class_entry){(char *)ranks[r].device_class, ranks[r].rank};
    qsort(e, n, sizeof *e, compare_entries);
    size_t u = 0;
    bool ok = true;
    for (size_t i = 0; i < n; i++) {
        if (u && strcmp(e[u - 1].name, e[i].name) == 0)
            continue; /* the first of a name is its lowest rank */
        e[u].rank = e[i].rank;
        if (!(e[u].name = strdup(e[i].name))) {
            ok = false;
            break;
        }
        u++;
    }
    p->cls = e;
    p->ncls = u;
    if (!ok) {
        free_cls(p);
        return false;
    }
    p->cls_stale = false;
    return true;
}

/* The facts of rank (ranks ascend), or NULL. */
static const prismd_rank_facts *facts_of(const prismd_rank_facts *ranks, size_t nranks, uint32_t rank)
{
    size_t lo = 0, hi = nranks;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (ranks[mid].rank == rank)
            return &ranks[mid];
        if (ranks[mid].rank < rank)
            lo = mid + 1;
        else
            hi = mid;
    }
    return NULL;
}

/* The block's entry, added when new; NULL when memory runs out. */
static plan_block *block_of(prismd_plans *p, uint32_t id)
{
    uint32_t ix = prism_idmap_get(&p->ix, id);
    if (ix != PRISM_IDMAP_NONE)
        return &p->blocks[ix];
    if (p->nblocks == p->cap) {
        size_t ncap = p->cap ? p->cap * 2 : 64;
        plan_block *nb = realloc(p->blocks, ncap * sizeof *nb);
        if (!nb)
            return NULL;
        p->blocks = nb;
        p->cap = ncap;
    }
    if (prism_idmap_put(&p->ix, id, (uint32_t)p->nblocks))
        return NULL;
    plan_block *b = &p->blocks[p->nblocks++];
    memset(b, 0, sizeof *b);
    b->id = id;
    return b;
}

bool prismd_plans_layout(prismd_plans *p, uint32_t id, double param_bytes, double flops, double activation_bytes,
                         double state_bytes)
{
    /* A layout without the planner's cost figures (a trainer that does not take part in hybrid
     * plans, or an older one) costs the job nothing here; one that had them is updated. */
    if (flops == 0 && activation_bytes == 0 && state_bytes == 0 && prism_idmap_get(&p->ix, id) == PRISM_IDMAP_NONE)
        return true;
    plan_block *b = block_of(p, id);
    if (!b)
        return false;
    b->param_bytes = param_bytes;
    b->flops = flops;
    b->activation_bytes = activation_bytes;
    b->state_bytes = state_bytes;
    return true;
}

/* A half of step from rank replaces one of (has, step0, rank0): a later step, or the same step
 * from a lower rank. */
static bool newer(bool has, uint64_t step0, uint32_t rank0, uint64_t step, uint32_t rank)
{
    return !has || step > step0 || (step == step0 && rank < rank0);
}

bool prismd_plans_tensor_stats(prismd_plans *p, uint32_t rank, uint64_t step, uint32_t id, double x_l2,
                               double x_max_abs, double x_numel, double w_l2, double w_max_abs, double w_numel,
                               double y_numel)
{
    if (x_numel < 1 && w_numel < 1)
        return true;
    plan_block *b = block_of(p, id);
    if (!b)
        return false;
    if (x_numel >= 1 && newer(b->has_x, b->x_step, b->x_rank, step, rank)) {
        b->has_x = true;
        b->x_step = step;
        b->x_rank = rank;
        b->x_l2 = x_l2;
        b->x_max_abs = x_max_abs;
        b->x_numel = x_numel;
        b->y_numel = y_numel;
    }
    if (w_numel >= 1 && newer(b->has_w, b->w_step, b->w_rank, step, rank)) {
        b->has_w = true;
        b->w_step = step;
        b->w_rank = rank;
        b->w_l2 = w_l2;
        b->w_max_abs = w_max_abs;
        b->w_numel = w_numel;
    }
    return true;
}

bool prismd_plans_gradients(prismd_plans *p, const prism_block_stats *blocks, size_t count)
{
    for (size_t i = 0; i < count; i++) {
        const prism_block_stats *s = &blocks[i];
        /* Only blocks the planner already knows (from a layout's cost figures or tensor
         * statistics): gradients alone never make a job hold the planner's table. */
        uint32_t ix = prism_idmap_get(&p->ix, s->block_id);
        if (ix == PRISM_IDMAP_NONE)
            continue;
        plan_block *b = &p->blocks[ix];
        if (isfinite(s->l2_norm) && isfinite(s->max_abs) && s->l2_norm >= 0 && s->max_abs >= 0 && !s->nonfinite) {
            b->has_g = true;
            b->g_l2 = s->l2_norm;
            b->g_max_abs = s->max_abs;
        }
    }
    return true;
}

static bool complete(const plan_block *b)
{
    return b->has_x && b->has_w && b->has_g;
}

/* L = the largest id known + 1, and how many of blocks 0..L-1 lack a half of their statistics
 * or their gradients (ids never seen count as lacking all). */
static uint64_t missing_blocks(const prismd_plans *p, size_t *L)
{
    uint64_t max = 0, done = 0;
    for (size_t i = 0; i < p->nblocks; i++) {
        if (p->blocks[i].id > max)
            max = p->blocks[i].id;
        done += complete(&p->blocks[i]);
    }
    *L = p->nblocks ? (size_t)max + 1 : 0;
    return p->nblocks ? max + 1 - done : 0;
}

static int compare_pairs(const void *a, const void *b)
{
    const rank_pair *x = a, *y = b;
    if (x->delta != y->delta)
        return x->delta > y->delta ? -1 : 1;
    if (x->cls != y->cls)
        return x->cls < y->cls ? -1 : 1; /* classes are in name order */
    return (x->block > y->block) - (x->block < y->block);
}

static const char *high_name(prism_hybrid_format f)
{
    return f == PRISM_HYBRID_FP16 ? "fp16" : "bf16";
}

static prism_precision wire_low(prism_hybrid_format f)
{
    return f == PRISM_HYBRID_FP8_E4M3 ? PRISM_PRECISION_FP8_E4M3 : PRISM_PRECISION_INT8;
}

static void set_refused(prismd_plans *p, const char *job_id, const char *message)
{
    p->refused = true;
    snprintf(p->message, sizeof p->message, "%s", message);
    p->refusals++;
    prism_log(PRISM_LOG_WARN, "hybrid plan refused; the plan in force stays", "job", job_id, "reason", message,
              LOG_END);
}

/* Whether the per-class low sets of classes differ from the plan in force's. */
static bool low_sets_differ(const prismd_plans *p, const prismd_plan_class *c, size_t n)
{
    if (!p->cur || p->cur->nclasses != n)
        return true;
    const prismd_plan_class *in = p->cur->classes;
    for (size_t k = 0; k < n; k++) {
        if (strcmp(in[k].name, c[k].name) != 0 || in[k].nlow != c[k].nlow || in[k].low_format != c[k].low_format ||
            (c[k].nlow && memcmp(in[k].low_blocks, c[k].low_blocks, c[k].nlow * sizeof *c[k].low_blocks)))
            return true;
    }
    return false;
}

/* The inputs of a plan other than the statistics (which enter through the ranking): profiles,
 * link, config and the blocks' cost figures, as doubles to compare exactly. */
static double *inputs_of(const prism_hybrid_problem *pr, size_t *n)
{
    size_t L = pr->block_count, C = pr->class_count;
    *n = C * 8 + 6 + L * 5;
    double *v = malloc(*n * sizeof *v);
    if (!v)
        return NULL;
    size_t at = 0;
    for (size_t k = 0; k < C; k++) {
        const prism_hybrid_class *c = &pr->classes[k];
        double f[] = {c->memory_bytes, c->bf16_ops, c->fp16_ops, c->int8_ops, c->fp8_ops, c->quantize_fixed_seconds,
                      c->quantize_seconds_per_byte, c->fixed ? 1.0 : 0.0};
        memcpy(v + at, f, sizeof f);
        at += 8;
    }
    double g[] = {pr->link_bytes_per_second, pr->link_latency_seconds, pr->fixed_given ? 1.0 : 0.0,
                  pr->memory_fraction, pr->gamma, (double)pr->low_format};
    memcpy(v + at, g, sizeof g);
    at += 6;
    for (size_t i = 0; i < L; i++) {
        const prism_hybrid_block *b = &pr->blocks[i];
        double f[] = {b->flops, b->param_bytes, b->activation_bytes, b->state_bytes, pr->force_high[i] ? 1.0 : 0.0};
        memcpy(v + at, f, sizeof f);
        at += 5;
    }
    return v;
}

/* A refusal found before the ranking (too many classes): the same message as the last refusal
 * counts again without a log line; another drops the last attempt and is logged. */
static prismd_plan_outcome refuse_early(prismd_plans *p, const char *job_id, const char *why)
{
    if (p->refused && !p->has_attempt && strcmp(p->message, why) == 0) {
        p->refusals++;
        return PRISMD_PLAN_REFUSED;
    }
    drop_attempt(p);
    set_refused(p, job_id, why);
    p->row_dirty = true;
    return PRISMD_PLAN_REFUSED;
}

/* Withdraws the plan in force (the caller sends a map without plans). A refusal recorded
 * before is dropped with it: the status then says why nothing is planned now. */
static void withdraw(prismd_plans *p)
{
    drop_attempt(p);
    drop_plan(p);
    p->refused = false;
    p->message[0] = '\0';
    p->row_dirty = true;
}

prismd_plan_outcome prismd_plans_decide(prismd_plans *p, const char *job_id, const prism_config *cfg,
                                        const prismd_rank_facts *ranks, size_t nranks, uint32_t world_size,
                                        bool *low_sets_changed)
{
    *low_sets_changed = p->withdraw_pending; /* a stored plan agents may still hold goes with a map */
    bool withdrew = p->withdraw_pending;
    p->withdraw_pending = false;
    if (!cfg->hybrid) {
        drop_attempt(p);
        if (p->refused)
            p->row_dirty = true;
        p->refused = false;
        p->message[0] = '\0';
        if (!p->cur)
            return withdrew ? PRISMD_PLAN_WITHDRAWN : PRISMD_PLAN_NONE;
        withdraw(p);
        *low_sets_changed = true;
        return PRISMD_PLAN_WITHDRAWN;
    }
    if (!refresh_classes(p, ranks, nranks))
        return withdrew ? PRISMD_PLAN_WITHDRAWN : PRISMD_PLAN_NONE;
    size_t L = 0;
    uint64_t missing = missing_blocks(p, &L);
    /* Planning no longer applies to the plan in force: fewer than two classes, or another block
     * count. Fewer than two classes counts only once every rank has said Hello since prismd
     * started: rank facts are not stored, so after a restart the ranks reconnected so far may
     * form one class while the others, not yet back, form the rest. */
    bool single = p->ncls < 2 && nranks >= world_size;
    if (p->cur && (single || L != p->cur->nblocks)) {
        withdraw(p);
        *low_sets_changed = withdrew = true;
    }
    if (p->ncls < 2 || missing > 0 || L == 0)
        return withdrew ? PRISMD_PLAN_WITHDRAWN : PRISMD_PLAN_NONE;
    size_t C = p->ncls;
    if (C > p->max_classes) {
        char why[200];
        snprintf(why, sizeof why, "%zu device classes: more than %zu to plan (prismd --hybrid-max-classes)", C,
                 p->max_classes);
        return refuse_early(p, job_id, why);
    }
    /* What the attempt allocates is bounded before it allocates: C x L <= max_classes x
     * max_pairs (C is already at most max_classes; the pairs of non-fixed classes, at most
     * max_pairs, are checked before the ranking, sized by them, is made). */
    if (L > p->max_classes * p->max_pairs / C) {
        char why[300];
        snprintf(why, sizeof why,
                 "%zu device classes x %zu blocks: more than %zu (prismd --hybrid-max-classes x --hybrid-max-pairs)", C,
                 L, p->max_classes * p->max_pairs);
        return refuse_early(p, job_id, why);
    }
    prismd_plan_outcome outcome = PRISMD_PLAN_NONE;
    bool oom = false; /* an allocation failed: refused with "out of memory" (the plan in force stays) */
    prism_hybrid_block *blocks = calloc(L, sizeof *blocks);
    prism_hybrid_class *classes = calloc(C, sizeof *classes);
    bool *force = calloc(L, sizeof *force);
    prism_hybrid_class_formats *fm = calloc(C, sizeof *fm);
    rank_pair *ranking = NULL;
    char **names = calloc(C, sizeof *names);
    double *inputs = NULL;
    size_t ninputs = 0, nranking = 0;
    prism_hybrid_result res = {0};
    prismd_plan_class *out = NULL;
    char *json = NULL;
    prism_error err = {0};
    if (!blocks || !classes || !force || !fm || !names) {
        oom = true;
        goto done;
    }
    for (size_t i = 0; i < p->nblocks; i++) {
        const plan_block *b = &p->blocks[i];
        prism_hybrid_block *h = &blocks[b->id]; /* ids are 0..L-1: none is missing */
        h->flops = b->flops;
        h->param_bytes = b->param_bytes;
        h->activation_bytes = b->activation_bytes;
        h->state_bytes = b->state_bytes;
        h->stats = (prism_hybrid_stats){b->x_l2, b->x_max_abs, b->x_numel, b->w_l2, b->w_max_abs, b->w_numel,
                                        b->g_l2, b->g_max_abs, b->y_numel};
    }
    for (size_t k = 0; k < C; k++) {
        const prismd_rank_facts *f = facts_of(ranks, nranks, p->cls[k].rank);
        if (!f) /* the list is rebuilt at every Hello that changes a class: not reached */
            goto done;
        classes[k] = (prism_hybrid_class){.name = f->device_class, .memory_bytes = (double)f->memory_bytes,
                                          .bf16_ops = f->bf16_ops_per_second, .fp16_ops = f->fp16_ops_per_second,
                                          .int8_ops = f->int8_ops_per_second, .fp8_ops = f->fp8_ops_per_second,
                                          .quantize_fixed_seconds = f->quantize_fixed_seconds,
                                          .quantize_seconds_per_byte = f->quantize_seconds_per_byte};
        if (!(names[k] = strdup(f->device_class))) {
            oom = true;
            goto done;
        }
    }
    for (size_t i = 0; i < cfg->force_bf16_blocks.count; i++)
        if (cfg->force_bf16_blocks.ids[i] < L)
            force[cfg->force_bf16_blocks.ids[i]] = true;
    prism_hybrid_problem pr;
    prism_hybrid_problem_defaults(&pr);
    pr.blocks = blocks;
    pr.block_count = L;
    pr.classes = classes;
    pr.class_count = C;
    pr.link_bytes_per_second = cfg->hybrid_link_bytes_per_second;
    pr.link_latency_seconds = cfg->hybrid_link_latency_seconds;
    pr.memory_fraction = cfg->hybrid_memory_fraction;
    pr.gamma = cfg->hybrid_gamma;
    pr.low_format = cfg->hybrid_low_format;
    pr.force_high = force;
    char problem[512] = "";
    if (cfg->hybrid_fixed_classes.given) {
        pr.fixed_given = true;
        for (size_t n = 0; n < cfg->hybrid_fixed_classes.count && !problem[0]; n++) {
            const char *want = cfg->hybrid_fixed_classes.names[n];
            size_t k = 0;
            while (k < C && strcmp(classes[k].name, want) != 0)
                k++;
            if (k == C)
                snprintf(problem, sizeof problem, "hybrid_fixed_classes[%zu]: no rank reports device class \"%.200s\"",
                         n, want);
            else
                classes[k].fixed = true;
        }
    }
    if (!problem[0] && prism_hybrid_resolve(&pr, fm, &err))
        snprintf(problem, sizeof problem, "%.400s (classes in name order)", err.message);
    size_t pairs = 0;
    if (!problem[0]) {
        /* Planning runs on the policy thread and costs O(pairs x blocks): bounded by a flag. */
        for (size_t k = 0; k < C; k++)
            pairs += fm[k].fixed ? 0 : L;
        if (pairs > p->max_pairs)
            snprintf(problem, sizeof problem,
                     "%zu (class, block) pairs of non-fixed classes to plan: more than %zu (prismd --hybrid-max-pairs)",
                     pairs, p->max_pairs);
    }
    inputs = inputs_of(&pr, &ninputs);
    ranking = malloc((problem[0] || !pairs ? 1 : pairs) * sizeof *ranking); /* sized by the pairs checked */
    if (!inputs || !ranking) {
        oom = true;
        goto done;
    }
    if (!problem[0]) {
        /* The raise order of the model: pairs low at the start, by decreasing delta, class name, block id. */
        for (size_t k = 0; k < C; k++)
            for (size_t i = 0; i < L && !fm[k].fixed; i++)
                if (!force[i])
                    ranking[nranking++] = (rank_pair){
                        (uint32_t)k, (uint32_t)i,
                        prism_hybrid_omega(&blocks[i].stats, i, L, pr.gamma, fm[k].low, fm[k].high) -
                            prism_hybrid_omega(&blocks[i].stats, i, L, pr.gamma, fm[k].high, fm[k].high)};
        qsort(ranking, nranking, sizeof *ranking, compare_pairs);
    }
    /* The same classes, ranking and inputs as the last attempt: its outcome stands. */
    bool same = p->has_attempt && p->nattempt_names == C && p->nattempt_ranking == nranking &&
                p->nattempt_inputs == ninputs && !memcmp(p->attempt_inputs, inputs, ninputs * sizeof *inputs);
    for (size_t k = 0; same && k < C; k++)
        same = strcmp(p->attempt_names[k], names[k]) == 0;
    for (size_t r = 0; same && r < nranking; r++)
        same = p->attempt_ranking[r].cls == ranking[r].cls && p->attempt_ranking[r].block == ranking[r].block;
    if (same) {
        if (p->refused) { /* the same refusal again: counted, not logged again */
            p->refusals++;
            outcome = PRISMD_PLAN_REFUSED;
        } else {
            p->kept++;
            outcome = PRISMD_PLAN_KEPT;
        }
        goto done;
    }
    drop_attempt(p);
    p->has_attempt = true;
    p->attempt_names = names;
    p->nattempt_names = C;
    names = NULL;
    p->attempt_ranking = ranking;
    p->nattempt_ranking = nranking;
    ranking = NULL;
    p->attempt_inputs = inputs;
    p->nattempt_inputs = ninputs;
    inputs = NULL;
    if (problem[0]) {
        set_refused(p, job_id, problem);
        p->row_dirty = true;
        outcome = PRISMD_PLAN_REFUSED;
        goto done;
    }
    prism_status st = prism_hybrid_plan(&pr, &res, &err);
    if (st == PRISM_ERR_LIMIT) {
        prism_buf m = {0}, bud = {0};
        if (!prism_buf_append_double(&m, res.refused_bytes) && !prism_buf_append(&m, "", 1) &&
            !prism_buf_append_double(&bud, res.refused_budget) && !prism_buf_append(&bud, "", 1))
            snprintf(problem, sizeof problem, "class \"%.200s\" does not fit: its start needs %s bytes, its budget is %s bytes",
                     classes[res.refused_class].name, m.data, bud.data);
        else
            snprintf(problem, sizeof problem, "a class does not fit its memory");
        prism_buf_free(&m);
        prism_buf_free(&bud);
        set_refused(p, job_id, problem);
        p->row_dirty = true;
        outcome = PRISMD_PLAN_REFUSED;
        goto done;
    }
    if (st) {
        set_refused(p, job_id, err.message);
        p->row_dirty = true;
        outcome = PRISMD_PLAN_REFUSED;
        goto done;
    }
    prism_buf text = {0};
    if (prism_hybrid_json_write(&text, &pr, &res, NULL) || prism_buf_append(&text, "", 1)) {
        prism_buf_free(&text);
        oom = true; /* refused: tried again at the next decision */
        goto done;
    }
    json = text.data;
    out = calloc(C, sizeof *out);
    if (!out) {
        oom = true;
        goto done;
    }
    for (size_t k = 0; k < C; k++) {
        out[k].name = strdup(classes[k].name);
        out[k].low_format = wire_low(res.formats[k].low);
        out[k].high_format = high_name(res.formats[k].high);
        out[k].compute_seconds = res.compute_seconds[k];
        out[k].low_blocks = malloc(L * sizeof *out[k].low_blocks);
        if (!out[k].name || !out[k].low_blocks) {
            free_classes(out, C);
            out = NULL;
            oom = true;
            goto done;
        }
        for (size_t i = 0; i < L; i++)
            if (res.plan[k * L + i] != res.formats[k].high)
                out[k].low_blocks[out[k].nlow++] = (uint32_t)i;
    }
    plan_obj *o = calloc(1, sizeof *o);
    prismd_shared_text *shared = o ? prismd_shared_text_create(json, strlen(json)) : NULL;
    if (!shared) {
        free(o);
        free_classes(out, C);
        out = NULL;
        oom = true;
        goto done;
    }
    *o = (plan_obj){.refs = 1, .json = shared, .classes = out, .nclasses = C, .nblocks = L,
                    .iteration_seconds = res.iteration_seconds};
    out = NULL;
    *low_sets_changed |= low_sets_differ(p, o->classes, C);
    uint64_t mv = p->map_version, ds = p->decided_step, es = p->effective_step;
    drop_plan(p);
    p->cur = o;
    p->map_version = mv; /* until the caller names a new map */
    p->decided_step = ds;
    p->effective_step = es;
    p->refused = false;
    p->message[0] = '\0';
    p->row_dirty = true;
    p->replans++;
    outcome = PRISMD_PLAN_PLANNED;
done:
    prism_hybrid_result_free(&res);
    free(json);
    free(blocks);
    free(classes);
    free(force);
    free(fm);
    free(ranking);
    free(inputs);
    free_names(names, names ? C : 0);
    if (oom)
        outcome = refuse_early(p, job_id, "out of memory while planning");
    if (withdrew && outcome == PRISMD_PLAN_NONE)
        outcome = PRISMD_PLAN_WITHDRAWN;
    return outcome;
}

void prismd_plans_set_map(prismd_plans *p, uint64_t map_version, uint64_t decided_step, uint64_t effective_step)
{
    p->map_version = map_version;
    p->decided_step = decided_step;
    p->effective_step = effective_step;
    p->row_dirty = true;
}

/* The class named device_class of o (its classes are in name order), or NULL. */
static const prismd_plan_class *class_in(const plan_obj *o, const char *device_class)
{
    if (!o || !device_class)
        return NULL;
    size_t lo = 0, hi = o->nclasses;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        int c = strcmp(o->classes[mid].name, device_class);
        if (!c)
            return &o->classes[mid];
        if (c < 0)
            lo = mid + 1;
        else
            hi = mid;
    }
    return NULL;
}

const prismd_plan_class *prismd_plans_class(const prismd_plans *p, const char *device_class)
{
    return class_in(p->cur, device_class);
}

const prismd_plan_class *prismd_plans_durable_class(const prismd_plans *p, const char *device_class,
                                                    double *iteration_seconds)
{
    *iteration_seconds = p->durable ? p->durable->iteration_seconds : 0;
    return class_in(p->durable, device_class);
}

double prismd_plans_iteration_seconds(const prismd_plans *p)
{
    return p->cur ? p->cur->iteration_seconds : 0;
}

size_t prismd_plans_class_count(const prismd_plans *p)
{
    return p->cur ? p->cur->nclasses : 0;
}

const prismd_plan_class *prismd_plans_class_at(const prismd_plans *p, size_t i)
{
    return &p->cur->classes[i];
}

bool prismd_plans_row_dirty(const prismd_plans *p)
{
    return p->row_dirty;
}

void prismd_plans_saved(prismd_plans *p)
{
    p->row_dirty = false;
    if (p->durable != p->cur) {
        plan_release(p->durable);
        p->durable = plan_retain(p->cur);
    }
}

void prismd_plans_row(const prismd_plans *p, prismd_plan_row *out)
{
    out->map_version = p->map_version;
    out->decided_step = p->decided_step;
    out->effective_step = p->effective_step;
    out->status = p->refused ? "refused" : p->cur ? "planned" : "none";
    out->message = p->message;
    out->plan_json = p->cur ? prismd_shared_text_str(p->cur->json) : NULL;
}

/* The classes of a stored plan object: name, formats, plan (a precision per block id) and
 * compute_seconds of each. */
static bool read_plan(const json_t *root, prismd_plan_class **out, size_t *n, size_t *nblocks, double *iteration,
                      prism_error *err)
{
    json_t *classes = json_object_get(root, "classes");
    json_t *t = json_object_get(root, "iteration_seconds");
    if (!json_is_array(classes) || !json_is_number(t)) {
        prism_error_set(err, PRISM_ERR_INVALID, "the stored plan has no classes or iteration_seconds");
        return false;
    }
    *iteration = json_number_value(t);
    *nblocks = 0;
    size_t C = json_array_size(classes);
    prismd_plan_class *c = calloc(C ? C : 1, sizeof *c);
    if (!c) {
        prism_error_set(err, PRISM_ERR_NOMEM, "out of memory");
        return false;
    }
    for (size_t k = 0; k < C; k++) {
        json_t *e = json_array_get(classes, k);
        json_t *name = json_object_get(e, "name"), *low = json_object_get(e, "low_format");
        json_t *high = json_object_get(e, "high_format"), *plan = json_object_get(e, "plan");
        json_t *cs = json_object_get(e, "compute_seconds");
        if (!json_is_string(name) || !json_is_string(low) || !json_is_string(high) || !json_is_array(plan) ||
            !json_is_number(cs)) {
            free_classes(c, C);
            prism_error_set(err, PRISM_ERR_INVALID, "the stored plan's classes[%zu] is damaged", k);
            return false;
        }
        size_t L = json_array_size(plan);
        *nblocks = L;
        c[k].name = strdup(json_string_value(name));
        c[k].low_format = strcmp(json_string_value(low), "fp8_e4m3") == 0 ? PRISM_PRECISION_FP8_E4M3
                                                                          : PRISM_PRECISION_INT8;
        c[k].high_format = strcmp(json_string_value(high), "fp16") == 0 ? "fp16" : "bf16";
        c[k].compute_seconds = json_number_value(cs);
        c[k].low_blocks = malloc((L ? L : 1) * sizeof *c[k].low_blocks);
        if (!c[k].name || !c[k].low_blocks) {
            free_classes(c, C);
            prism_error_set(err, PRISM_ERR_NOMEM, "out of memory");
            return false;
        }
        for (size_t i = 0; i < L; i++) {
            const char *f = json_string_value(json_array_get(plan, i));
            if (f && strcmp(f, c[k].high_format) != 0)
                c[k].low_blocks[c[k].nlow++] = (uint32_t)i;
        }
    }
    *out = c;
    *n = C;
    return true;
}

bool prismd_plans_restore(prismd_plans *p, const prismd_plan_row *row, bool hybrid, prism_error *err)
{
    drop_plan(p);
    plan_release(p->durable);
    p->durable = NULL;
    p->refused = hybrid && row->status && strcmp(row->status, "refused") == 0;
    snprintf(p->message, sizeof p->message, "%s", p->refused && row->message ? row->message : "");
    if (!row->plan_json)
        return true;
    if (!hybrid) { /* not in force; agents may hold it from before: the next decision withdraws it */
        p->withdraw_pending = true;
        p->row_dirty = true;
        return true;
    }
    json_error_t jerr;
    json_t *root = json_loads(row->plan_json, 0, &jerr);
    if (!root) {
        prism_error_set(err, PRISM_ERR_INVALID, "the stored plan does not parse: %s", jerr.text);
        return false;
    }
    plan_obj *o = calloc(1, sizeof *o);
    bool ok = o && read_plan(root, &o->classes, &o->nclasses, &o->nblocks, &o->iteration_seconds, err);
    json_decref(root);
    if (!ok) {
        if (!o)
            prism_error_set(err, PRISM_ERR_NOMEM, "out of memory");
        free(o);
        return false;
    }
    o->refs = 1;
    if (!(o->json = prismd_shared_text_create(row->plan_json, strlen(row->plan_json)))) {
        plan_release(o);
        prism_error_set(err, PRISM_ERR_NOMEM, "out of memory");
        return false;
    }
    p->cur = o;
    p->durable = plan_retain(o);
    p->map_version = row->map_version;
    p->decided_step = row->decided_step;
    p->effective_step = row->effective_step;
    return true;
}

bool prismd_plans_view(prismd_plans *p, const prism_config *cfg, const prismd_rank_facts *ranks, size_t nranks,
                       prismd_plan_view *out)
{
    memset(out, 0, sizeof *out);
    if (!refresh_classes(p, ranks, nranks))
        return false;
    size_t L = 0;
    out->hybrid = cfg->hybrid;
    out->blocks_missing = missing_blocks(p, &L);
    out->classes_seen = calloc(p->ncls ? p->ncls : 1, sizeof *out->classes_seen);
    bool ok = out->classes_seen != NULL;
    for (size_t k = 0; ok && k < p->ncls; k++)
        ok = (out->classes_seen[out->nclasses_seen++] = strdup(p->cls[k].name)) != NULL;
    const char *message = "";
    if (!cfg->hybrid) {
        out->status = "disabled";
        message = "the job's config has hybrid false";
    } else if (p->refused) {
        out->status = "refused"; /* the last attempt's: the plan in force (if any) stays */
        message = p->message;
    } else if (p->cur) {
        out->status = "planned";
    } else if (p->ncls < 2) {
        out->status = "single_class";
        message = "the job's ranks report fewer than two device classes";
    } else if (out->blocks_missing > 0 || L == 0) {
        out->status = "waiting_for_statistics";
        message = "blocks lack weight or activation statistics (tensor_stats) or gradient statistics at a decision";
    } else {
        out->status = "waiting_for_statistics";
        message = "every block has its statistics: the next decision plans";
    }
    ok = ok && (out->message = strdup(message)) != NULL;
    out->has_plan = p->cur != NULL;
    out->map_version = p->map_version;
    out->decided_step = p->decided_step;
    out->effective_step = p->effective_step;
    out->replans = p->replans;
    out->kept = p->kept;
    out->refused = p->refusals;
    out->iteration_seconds = prismd_plans_iteration_seconds(p);
    if (ok && p->cur) {
        const plan_obj *o = p->cur;
        out->plan_json = prismd_shared_text_retain(o->json); /* shared, not copied */
        ok = (out->classes = calloc(o->nclasses ? o->nclasses : 1, sizeof *out->classes)) != NULL;
        for (size_t k = 0; ok && k < o->nclasses; k++) {
            out->nclasses = k + 1;
            out->classes[k] = (prismd_plan_class){.name = strdup(o->classes[k].name),
                                                  .low_format = o->classes[k].low_format,
                                                  .high_format = o->classes[k].high_format,
                                                  .nlow = o->classes[k].nlow,
                                                  .compute_seconds = o->classes[k].compute_seconds};
            ok = out->classes[k].name != NULL; /* the view needs the count of low blocks, not their ids */
        }
    }
    if (!ok)
        prismd_plan_view_free(out);
    return ok;
}
