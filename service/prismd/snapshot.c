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
        free(snap->jobs[i].blocks);
        free(atomic_load(&snap->jobs[i].blocks_json));
        free(atomic_load(&snap->jobs[i].blocks_gzip));
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
