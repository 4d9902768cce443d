/* Rank merge (DESIGN 4.3). Each open step keeps one accumulator per block, indexed by a dense
 * slot shared by all steps of the merger; open steps are kept sorted by step id. */
#include "merge.h"

#include "idmap.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

typedef struct accumulator {
    uint32_t ranks;    /* ranks that reported the block; 0: not present in this step */
    double l2_mean;    /* running mean, so huge norms do not overflow a sum */
    double max_abs;
    double n;          /* finite elements pooled so far */
    double mean;
    double m2;         /* sum of squared deviations from mean */
    uint64_t numel;
    uint64_t nonfinite;
    uint32_t sat_ranks; /* ranks that sent saturation figures */
    double saturated_sum, underflowed_sum;
} accumulator;

typedef struct open_step {
    uint64_t step;
    int64_t first_ms;
    uint32_t ranks;
    bool forced;           /* ready because too many steps were open or everything was closed */
    uint64_t *rank_bits;
    uint32_t loss_count;
    double loss_sum;
    accumulator *accs;     /* indexed by slot */
    size_t cap_accs;
    uint32_t *present;     /* slots in the order they first arrived in this step */
    size_t npresent, cap_present;
} open_step;


struct prism_merger {
    uint32_t world_size;
    int64_t timeout_ms;
    size_t max_open;
    size_t max_blocks;
    prism_idmap ids;
    uint32_t *slot_ids;     /* slot -> block id */
    uint64_t *stamp;        /* slot -> last add() call that saw it */
    size_t nslots, cap_slots;
    uint64_t calls;
    open_step **open;      /* sorted by step ascending; room for 2 * max_open */
    size_t nopen;
    open_step **spare;     /* finished steps kept for reuse */
    size_t nspare;
    bool has_last_out;
    uint64_t last_out;
    prism_block_stats *out; /* cap_slots entries */
    uint32_t *scratch;
    size_t cap_scratch;
    prism_merge_counters counters;
};

static prism_status nomem(prism_error *err)
{
    return prism_error_set(err, PRISM_ERR_NOMEM, "out of memory");
}

static size_t rank_words(uint32_t world_size)
{
    return ((size_t)world_size + 63) / 64;
}

static void free_step(open_step *s)
{
    if (!s)
        return;
    free(s->rank_bits);
    free(s->accs);
    free(s->present);
    free(s);
}

prism_merger *prism_merger_create(uint32_t world_size, int64_t step_timeout_ms, prism_error *err)
{
    if (world_size == 0 || step_timeout_ms <= 0) {
        prism_error_set(err, PRISM_ERR_INVALID, "merge needs world_size >= 1 and step_timeout_ms >= 1");
        return NULL;
    }
    prism_merger *m = calloc(1, sizeof *m);
    if (!m) {
        nomem(err);
        return NULL;
    }
    m->world_size = world_size;
    m->timeout_ms = step_timeout_ms;
    prism_idmap_init(&m->ids);
    if (prism_merger_set_limits(m, PRISM_MERGE_MAX_OPEN_STEPS, PRISM_MERGE_MAX_BLOCKS, err)) {
        prism_merger_destroy(m);
        return NULL;
    }
    return m;
}

prism_status prism_merger_set_limits(prism_merger *m, size_t max_open_steps, size_t max_blocks, prism_error *err)
{
    if (max_open_steps == 0 || max_blocks == 0 || max_open_steps > SIZE_MAX / 4 / sizeof(open_step *))
        return prism_error_set(err, PRISM_ERR_INVALID, "merge limits must be at least 1");
    if (2 * max_open_steps < m->nopen)
        return prism_error_set(err, PRISM_ERR_STATE, "%zu steps are open, more than the new limit allows",
                               m->nopen);
    open_step **no = realloc(m->open, 2 * max_open_steps * sizeof *no);
    if (!no)
        return nomem(err);
    m->open = no;
    /* Spare steps beyond the new room are freed. */
    while (m->nspare > 2 * max_open_steps)
        free_step(m->spare[--m->nspare]);
    open_step **ns = realloc(m->spare, 2 * max_open_steps * sizeof *ns);
    if (!ns)
        return nomem(err);
    m->spare = ns;
    m->max_open = max_open_steps;
    m->max_blocks = max_blocks;
    return PRISM_OK;
}

void prism_merger_destroy(prism_merger *m)
{
    if (!m)
        return;
    for (size_t i = 0; i < m->nopen; i++)
        free_step(m->open[i]);
    for (size_t i = 0; i < m->nspare; i++)
        free_step(m->spare[i]);
    free(m->open);
    free(m->spare);
    prism_idmap_free(&m->ids);
    free(m->slot_ids);
    free(m->stamp);
    free(m->out);
    free(m->scratch);
    free(m);
}

static prism_status slot_of(prism_merger *m, uint32_t id, uint32_t *slot, prism_error *err)
{
    uint32_t s = prism_idmap_get(&m->ids, id);
    if (s != PRISM_IDMAP_NONE) {
        *slot = s;
        return PRISM_OK;
    }
    if (m->nslots >= m->max_blocks)
        return prism_error_set(err, PRISM_ERR_LIMIT, "block %u: the job already has %zu blocks, the limit", id,
                               m->max_blocks);
    if (m->nslots == m->cap_slots) {
        size_t ncap = m->cap_slots ? m->cap_slots * 2 : 64;
        uint32_t *ni = realloc(m->slot_ids, ncap * sizeof *ni);
        if (!ni)
            return nomem(err);
        m->slot_ids = ni;
        uint64_t *ns = realloc(m->stamp, ncap * sizeof *ns);
        if (!ns)
            return nomem(err);
        m->stamp = ns;
        /* A merged step never has more blocks than there are slots: next() needs no allocation. */
        prism_block_stats *no = realloc(m->out, ncap * sizeof *no);
        if (!no)
            return nomem(err);
        m->out = no;
        m->cap_slots = ncap;
    }
    if (prism_idmap_put(&m->ids, id, (uint32_t)m->nslots))
        return nomem(err);
    m->slot_ids[m->nslots] = id;
    m->stamp[m->nslots] = 0;
    *slot = (uint32_t)m->nslots++;
    return PRISM_OK;
}

/* Opens a step at position pos of the sorted open list. */
static prism_status open_step_at(prism_merger *m, size_t pos, uint64_t step, int64_t now_ms, open_step **out,
                                 prism_error *err)
{
    if (m->nopen == 2 * m->max_open)
        return prism_error_set(err, PRISM_ERR_LIMIT, "step %llu: %zu steps are open and none handed out",
                               (unsigned long long)step, m->nopen);
    open_step *s = m->nspare ? m->spare[--m->nspare] : calloc(1, sizeof *s);
    if (!s)
        return nomem(err);
    if (!s->rank_bits) {
        s->rank_bits = calloc(rank_words(m->world_size), sizeof *s->rank_bits);
        if (!s->rank_bits) {
            free(s);
            return nomem(err);
        }
    }
    s->step = step;
    s->first_ms = now_ms;
    s->ranks = 0;
    s->forced = false;
    s->loss_count = 0;
    s->loss_sum = 0;
    s->npresent = 0;
    memmove(&m->open[pos + 1], &m->open[pos], (m->nopen - pos) * sizeof m->open[0]);
    m->open[pos] = s;
    m->nopen++;
    if (m->nopen > m->max_open) {
        /* Too many steps in flight: the oldest is handed out with what it has. */
        for (size_t i = 0; i < m->nopen; i++) {
            if (!m->open[i]->forced) {
                m->open[i]->forced = true;
                break;
            }
        }
    }
    *out = s;
    return PRISM_OK;
}

/* Takes an empty step back out of the open list (its report could not be added). */
static void unopen_step(prism_merger *m, size_t pos)
{
    open_step *s = m->open[pos];
    memmove(&m->open[pos], &m->open[pos + 1], (m->nopen - pos - 1) * sizeof m->open[0]);
    m->nopen--;
    m->spare[m->nspare++] = s;
}

static prism_status step_reserve(open_step *s, size_t nslots, size_t adds, prism_error *err)
{
    if (s->cap_accs < nslots) {
        size_t ncap = s->cap_accs ? s->cap_accs : 64;
        while (ncap < nslots)
            ncap *= 2;
        accumulator *na = realloc(s->accs, ncap * sizeof *na);
        if (!na)
            return nomem(err);
        memset(na + s->cap_accs, 0, (ncap - s->cap_accs) * sizeof *na);
        s->accs = na;
        s->cap_accs = ncap;
    }
    if (s->cap_present < s->npresent + adds) {
        size_t ncap = s->cap_present ? s->cap_present : 64;
        while (ncap < s->npresent + adds)
            ncap *= 2;
        uint32_t *np = realloc(s->present, ncap * sizeof *np);
        if (!np)
            return nomem(err);
        s->present = np;
        s->cap_present = ncap;
    }
    return PRISM_OK;
}

static uint64_t add_saturating(uint64_t a, uint64_t b)
{
    return a > UINT64_MAX - b ? UINT64_MAX : a + b;
}

static void accumulate(accumulator *a, const prism_block_stats *r)
{
    a->ranks++;
    a->l2_mean += (r->l2_norm - a->l2_mean) / a->ranks;
    a->max_abs = fmax(a->max_abs, r->max_abs);
    a->numel = add_saturating(a->numel, r->numel);
    a->nonfinite = add_saturating(a->nonfinite, r->nonfinite);
    if (a->nonfinite > a->numel)
        a->nonfinite = a->numel;
    if (r->has_saturation) {
        a->sat_ranks++;
        a->saturated_sum += r->saturated_fraction;
        a->underflowed_sum += r->underflowed_fraction;
    }
    double nb = (double)(r->numel - r->nonfinite);
    if (nb <= 0)
        return;
    if (a->n == 0) {
        a->n = nb;
        a->mean = r->mean;
        a->m2 = r->variance * nb;
        return;
    }
    /* Chan et al.: pooled mean and sum of squared deviations of two groups. */
    double n = a->n + nb;
    double delta = r->mean - a->mean;
    a->mean += delta * nb / n;
    a->m2 += r->variance * nb + delta * delta * a->n * nb / n;
    a->n = n;
}

prism_status prism_merger_add(prism_merger *m, uint32_t rank, uint64_t step, bool has_loss, double loss,
                              const prism_block_stats *blocks, size_t count, int64_t now_ms,
                              prism_merge_outcome *outcome, prism_error *err)
{
    *outcome = PRISM_MERGE_ACCEPTED;
    if (rank >= m->world_size)
        return prism_error_set(err, PRISM_ERR_INVALID, "rank %u is not below world_size %u", rank,
                               m->world_size);
    if (step > PRISM_STEP_MAX)
        return prism_error_set(err, PRISM_ERR_INVALID, "step %llu is above the largest step id %llu",
                               (unsigned long long)step, (unsigned long long)PRISM_STEP_MAX);
    prism_status st;
    for (size_t i = 0; i < count; i++)
        if ((st = prism_block_stats_check(&blocks[i], err)))
            return st;
    if (m->has_last_out && step <= m->last_out) {
        m->counters.dropped_late++;
        *outcome = PRISM_MERGE_DROPPED_LATE;
        return PRISM_OK;
    }
    size_t pos = m->nopen;
    while (pos > 0 && m->open[pos - 1]->step > step)
        pos--;
    open_step *s = pos > 0 && m->open[pos - 1]->step == step ? m->open[pos - 1] : NULL;
    size_t w = rank / 64;
    uint64_t bit = 1ull << (rank % 64);
    if (s && (s->rank_bits[w] & bit)) {
        m->counters.dropped_duplicate++;
        *outcome = PRISM_MERGE_DROPPED_DUPLICATE;
        return PRISM_OK;
    }
    /* Slots for new ids; a repeated id or the block limit refuses the report before any step
     * sees it (the slots made meanwhile stay, unused until those ids come back). */
    if (count > m->cap_scratch) {
        uint32_t *ns = realloc(m->scratch, count * sizeof *ns);
        if (!ns)
            return nomem(err);
        m->scratch = ns;
        m->cap_scratch = count;
    }
    m->calls++;
    for (size_t i = 0; i < count; i++) {
        if ((st = slot_of(m, blocks[i].block_id, &m->scratch[i], err)))
            return st;
        if (m->stamp[m->scratch[i]] == m->calls)
            return prism_error_set(err, PRISM_ERR_INVALID, "block %u appears twice in the report of step %llu",
                                   blocks[i].block_id, (unsigned long long)step);
        m->stamp[m->scratch[i]] = m->calls;
    }
    bool opened = false;
    if (!s) {
        if ((st = open_step_at(m, pos, step, now_ms, &s, err)))
            return st;
        opened = true;
    }
    if ((st = step_reserve(s, m->nslots, count, err))) {
        if (opened)
            unopen_step(m, pos);
        return st;
    }
    s->rank_bits[w] |= bit;
    s->ranks++;
    if (has_loss && isfinite(loss)) {
        s->loss_sum += loss;
        s->loss_count++;
    }
    for (size_t i = 0; i < count; i++) {
        accumulator *a = &s->accs[m->scratch[i]];
        if (a->ranks == 0)
            s->present[s->npresent++] = m->scratch[i];
        accumulate(a, &blocks[i]);
    }
    m->counters.accepted++;
    return PRISM_OK;
}

static bool step_ready(const prism_merger *m, const open_step *s, int64_t now_ms)
{
    return s->ranks >= m->world_size || s->forced || now_ms - s->first_ms >= m->timeout_ms;
}

bool prism_merger_next(prism_merger *m, int64_t now_ms, prism_merged_step *out)
{
    bool any_ready = false;
    for (size_t i = 0; i < m->nopen && !any_ready; i++)
        any_ready = step_ready(m, m->open[i], now_ms);
    if (!any_ready)
        return false;
    open_step *s = m->open[0];
    if (s->ranks < m->world_size) {
        if (!s->forced && now_ms - s->first_ms >= m->timeout_ms)
            m->counters.timed_out++;
        else
            m->counters.closed_early++;
    }
    for (size_t i = 0; i < s->npresent; i++) {
        uint32_t slot = s->present[i];
        accumulator *a = &s->accs[slot];
        m->out[i] = (prism_block_stats){
            .block_id = m->slot_ids[slot],
            .l2_norm = a->l2_mean,
            .max_abs = a->max_abs,
            .mean = a->n > 0 ? a->mean : 0.0,
            .variance = a->n > 0 ? a->m2 / a->n : 0.0,
            .numel = a->numel,
            .nonfinite = a->nonfinite,
            .has_saturation = a->sat_ranks > 0,
            .saturated_fraction = a->sat_ranks ? a->saturated_sum / a->sat_ranks : 0.0,
            .underflowed_fraction = a->sat_ranks ? a->underflowed_sum / a->sat_ranks : 0.0,
        };
        memset(a, 0, sizeof *a);
    }
    out->step = s->step;
    out->ranks = s->ranks;
    out->has_loss = s->loss_count > 0;
    out->loss = s->loss_count ? s->loss_sum / s->loss_count : 0.0;
    out->blocks = m->out;
    out->count = s->npresent;
    m->has_last_out = true;
    m->last_out = s->step;
    memset(s->rank_bits, 0, rank_words(m->world_size) * sizeof *s->rank_bits);
    memmove(&m->open[0], &m->open[1], (m->nopen - 1) * sizeof m->open[0]);
    m->nopen--;
    m->spare[m->nspare++] = s;
    return true;
}

void prism_merger_skip_to(prism_merger *m, uint64_t step)
{
    if (!m->has_last_out || step > m->last_out) {
        m->has_last_out = true;
        m->last_out = step;
    }
}

void prism_merger_close_all(prism_merger *m)
{
    for (size_t i = 0; i < m->nopen; i++)
        m->open[i]->forced = true;
}

int64_t prism_merger_wait_ms(const prism_merger *m, int64_t now_ms)
{
    if (m->nopen == 0)
        return -1;
    int64_t best = INT64_MAX;
    for (size_t i = 0; i < m->nopen; i++) {
        const open_step *s = m->open[i];
        if (step_ready(m, s, now_ms))
            return 0;
        int64_t left = s->first_ms + m->timeout_ms - now_ms;
        if (left < best)
            best = left;
    }
    return best;
}

size_t prism_merger_open_steps(const prism_merger *m)
{
    return m->nopen;
}

const prism_merge_counters *prism_merger_counters(const prism_merger *m)
{
    return &m->counters;
}
