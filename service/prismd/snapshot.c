#define _POSIX_C_SOURCE 200809L
#include "snapshot.h"

#include <stdlib.h>
#include <string.h>

const double prismd_decision_buckets[PRISMD_DECISION_BUCKETS] = {1e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 5e-3, 2.5e-2, 0.1};

void prismd_snapshots_init(prismd_snapshots *s)
{
    pthread_mutex_init(&s->lock, NULL);
    s->current = NULL;
    s->on_publish = NULL;
    s->on_publish_ctx = NULL;
    atomic_init(&s->policy_alive_ms, 0);
}

void prismd_snapshot_release(prismd_snapshot *snap)
{
    if (!snap || atomic_fetch_sub(&snap->refs, 1) != 1)
        return;
    for (size_t i = 0; i < snap->njobs; i++) {
        prism_config_free(&snap->jobs[i].config);
        for (size_t b = 0; snap->jobs[i].names && b < snap->jobs[i].nblocks; b++)
            free(snap->jobs[i].names[b]);
        free(snap->jobs[i].names);
        free(snap->jobs[i].token);
        prismd_plan_view_free(&snap->jobs[i].plan);
        free(snap->jobs[i].blocks);
        free(atomic_load(&snap->jobs[i].blocks_json));
        free(atomic_load(&snap->jobs[i].blocks_gzip));
        for (size_t r = 0; r < snap->jobs[i].nranks; r++)
            prismd_rank_facts_clear(&snap->jobs[i].ranks[r]);
        free(snap->jobs[i].ranks);
    }
    free(atomic_load(&snap->jobs_json));
    free(atomic_load(&snap->jobs_gzip));
    free(snap->jobs);
    free(snap);
}

void prismd_snapshots_destroy(prismd_snapshots *s)
{
    prismd_snapshot_release(s->current);
    s->current = NULL;
    pthread_mutex_destroy(&s->lock);
}

void prismd_snapshots_publish(prismd_snapshots *s, prismd_snapshot *snap)
{
    pthread_mutex_lock(&s->lock);
    prismd_snapshot *old = s->current;
    s->current = snap;
    pthread_mutex_unlock(&s->lock);
    prismd_snapshot_release(old);
    if (s->on_publish)
        s->on_publish(s->on_publish_ctx);
}

prismd_snapshot *prismd_snapshots_get(prismd_snapshots *s)
{
    pthread_mutex_lock(&s->lock);
    prismd_snapshot *snap = s->current;
    if (snap)
        atomic_fetch_add(&snap->refs, 1);
    pthread_mutex_unlock(&s->lock);
    return snap;
}

const prismd_snap_job *prismd_snapshot_find(const prismd_snapshot *snap, const char *job_id)
{
    size_t lo = 0, hi = snap->njobs;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        int c = strcmp(snap->jobs[mid].id, job_id);
        if (c == 0)
            return &snap->jobs[mid];
        if (c < 0)
            lo = mid + 1;
        else
            hi = mid;
    }
    return NULL;
}

const char *prismd_snapshot_cached(_Atomic(char *) *slot, char *(*render)(const void *ctx), const void *ctx)
{
    char *have = atomic_load(slot);
    if (have)
        return have;
    char *made = render(ctx);
    if (!made)
        return NULL;
    char *expected = NULL;
    if (atomic_compare_exchange_strong(slot, &expected, made))
        return made;
    free(made);
    return expected;
}

char *prismd_text_copy(const char *text)
{
    size_t n = strlen(text);
    if (n > PRISMD_RANK_TEXT_MAX) {
        n = PRISMD_RANK_TEXT_MAX;
        /* Back to the first byte of the character that straddles the cut, then drop it. */
        while (n > 0 && ((unsigned char)text[n] & 0xc0) == 0x80)
            n--;
    }
    char *copy = malloc(n + 1);
    if (copy) {
        memcpy(copy, text, n);
        copy[n] = '\0';
    }
    return copy;
}

void prismd_rank_facts_clear(prismd_rank_facts *f)
{
    free(f->node);
    free(f->device_class);
    free(f->device_name);
    f->node = f->device_class = f->device_name = NULL;
}

bool prismd_rank_facts_copy(prismd_rank_facts *dst, const prismd_rank_facts *src)
{
    *dst = *src;
    dst->node = src->node ? strdup(src->node) : NULL;
    dst->device_class = src->device_class ? strdup(src->device_class) : NULL;
    dst->device_name = src->device_name ? strdup(src->device_name) : NULL;
    if ((src->node && !dst->node) || (src->device_class && !dst->device_class) ||
        (src->device_name && !dst->device_name)) {
        prismd_rank_facts_clear(dst);
        return false;
    }
    return true;
}

bool prismd_rank_lagging(const prismd_rank_facts *f, bool has_newest, uint64_t newest)
{
    if (!f || !f->connected || !has_newest)
        return false;
    return !f->has_step || (newest > f->last_step && newest - f->last_step > PRISMD_RANK_LAG_STEPS);
}

bool prismd_rank_acked_current(const prismd_rank_facts *f, uint64_t map_version)
{
    return map_version == 0 || (f && f->has_ack && f->acked_map_version == map_version);
}

struct prismd_shared_text {
    atomic_uint refs;
    size_t len;
    char text[];
};

prismd_shared_text *prismd_shared_text_create(const char *s, size_t len)
{
    prismd_shared_text *t = malloc(sizeof *t + len + 1);
    if (!t)
        return NULL;
    atomic_init(&t->refs, 1);
    t->len = len;
    memcpy(t->text, s, len);
    t->text[len] = '\0';
    return t;
}

prismd_shared_text *prismd_shared_text_retain(prismd_shared_text *t)
{
    if (t)
        atomic_fetch_add(&t->refs, 1);
    return t;
}

void prismd_shared_text_release(prismd_shared_text *t)
{
    if (t && atomic_fetch_sub(&t->refs, 1) == 1)
        free(t);
}

const char *prismd_shared_text_str(const prismd_shared_text *t)
{
    return t->text;
}

static void free_plan_classes(prismd_plan_class *c, size_t n)
{
    for (size_t i = 0; c && i < n; i++) {
        free(c[i].name);
        free(c[i].low_blocks);
    }
    free(c);
}

void prismd_plan_view_free(prismd_plan_view *v)
{
    if (!v)
        return;
    free(v->message);
    for (size_t i = 0; i < v->nclasses_seen; i++)
        free(v->classes_seen[i]);
    free(v->classes_seen);
    prismd_shared_text_release(v->plan_json);
    free_plan_classes(v->classes, v->nclasses);
    memset(v, 0, sizeof *v);
}
