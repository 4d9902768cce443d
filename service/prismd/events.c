/* Server-sent events (events.h). Each stream keeps the last map version and the last decision
 * step it told; its reader callback sends what is new in the latest snapshot (a map event when
 * the version moved, else a decision event when only the decision step did), else a keep-alive
 * comment when one is due, else suspends the connection. Telling the newest state only is what
 * coalesces: a reader that falls behind gets one event, not one per change. The waiting list
 * and its lock make sure a publish between the check and the suspension still wakes it. */
#define _GNU_SOURCE
#include "events.h"

#include "http_guard.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define KEEPALIVE_S 10

typedef struct stream {
    struct stream *prev, *next;
    prismd_events *events;
    struct MHD_Connection *conn;
    char job[160];
    bool started;           /* sent the first event (the map as it is) */
    bool gone;              /* the job was deleted: a "deleted" event, then the end */
    uint64_t version;       /* last map version sent */
    bool told_decision;     /* the stream told a decision step (in a map or a decision event) */
    uint64_t decision_step; /* the last decision step told */
    bool suspended;
    time_t last_write;
    char pending[1024];     /* an event not yet handed to libmicrohttpd */
    size_t pending_len, pending_off;
} stream;

struct prismd_events {
    prismd_snapshots *snapshots;
    pthread_mutex_t lock;
    stream *streams;
    size_t open;        /* streams on the list */
    size_t max_total;   /* 0: no limit */
    size_t max_per_job; /* 0: no limit */
    bool closing;
};

void prismd_events_set_limits(prismd_events *e, size_t max_total, size_t max_per_job)
{
    pthread_mutex_lock(&e->lock);
    e->max_total = max_total;
    e->max_per_job = max_per_job;
    pthread_mutex_unlock(&e->lock);
}

size_t prismd_events_open_count(prismd_events *e)
{
    pthread_mutex_lock(&e->lock);
    size_t n = e->open;
    pthread_mutex_unlock(&e->lock);
    return n;
}

prismd_events *prismd_events_create(prismd_snapshots *snapshots)
{
    prismd_events *e = calloc(1, sizeof *e);
    if (!e)
        return NULL;
    e->snapshots = snapshots;
    pthread_mutex_init(&e->lock, NULL);
    return e;
}

void prismd_events_destroy(prismd_events *e)
{
    if (!e)
        return;
    pthread_mutex_destroy(&e->lock);
    free(e);
}

void prismd_events_close(prismd_events *e)
{
    if (!e)
        return;
    pthread_mutex_lock(&e->lock);
    e->closing = true;
    pthread_mutex_unlock(&e->lock);
    prismd_events_wake(e);
}

void prismd_events_wake(prismd_events *e)
{
    if (!e)
        return;
    pthread_mutex_lock(&e->lock);
    for (stream *s = e->streams; s; s = s->next) {
        if (s->suspended) {
            s->suspended = false;
            MHD_resume_connection(s->conn);
        }
    }
    pthread_mutex_unlock(&e->lock);
}

/* Fills s->pending with the next event, if any is due. Called with e->lock held. */
static void next_event(stream *s, time_t now)
{
    prismd_snapshot *snap = prismd_snapshots_get(s->events->snapshots);
    const prismd_snap_job *j = snap ? prismd_snapshot_find(snap, s->job) : NULL;
    bool decided = j && j->has_summary; /* the job has a last decision; its step: */
    uint64_t decision_step = decided ? j->summary.step_id : 0;
    if (j && (!s->started || j->map_version > s->version)) {
        size_t low = 0;
        for (size_t i = 0; i < j->nblocks; i++)
            low += j->blocks[i].precision != PRISM_PRECISION_BF16;
        int n = snprintf(s->pending, sizeof s->pending,
                         "event: map\nid: %llu\ndata: {\"job_id\":\"%s\",\"map_version\":%llu,\"decided_step\":%llu,"
                         "\"effective_step\":%llu,\"blocks\":%zu,\"blocks_bf16\":%zu,\"blocks_low\":%zu}\n\n",
                         (unsigned long long)j->map_version, j->id, (unsigned long long)j->map_version,
                         (unsigned long long)j->decided_step, (unsigned long long)j->effective_step, j->nblocks,
                         j->nblocks - low, low);
        s->pending_len = n > 0 && (size_t)n < sizeof s->pending ? (size_t)n : 0;
        s->pending_off = 0;
        s->started = true;
        s->version = j->map_version;
        s->told_decision = decided;
        s->decision_step = decision_step;
    } else if (decided && (!s->told_decision || decision_step != s->decision_step)) {
        /* A decision that left the map as it was; no id: the map version (the last id) stands. */
        int n = snprintf(s->pending, sizeof s->pending,
                         "event: decision\ndata: {\"job_id\":\"%s\",\"step\":%llu,\"map_version\":%llu}\n\n", j->id,
                         (unsigned long long)decision_step, (unsigned long long)j->map_version);
        s->pending_len = n > 0 && (size_t)n < sizeof s->pending ? (size_t)n : 0;
        s->pending_off = 0;
        s->told_decision = true;
        s->decision_step = decision_step;
    } else if (!j && snap && s->started) {
        /* The job was deleted (DELETE, idle expiry): say so once, then end the stream. */
        int n = snprintf(s->pending, sizeof s->pending, "event: deleted\ndata: {\"job_id\":\"%s\"}\n\n", s->job);
        s->pending_len = n > 0 && (size_t)n < sizeof s->pending ? (size_t)n : 0;
        s->pending_off = 0;
        s->gone = true;
    } else if (now - s->last_write >= KEEPALIVE_S) {
        s->pending_len = (size_t)snprintf(s->pending, sizeof s->pending, ": keep-alive\n\n");
        s->pending_off = 0;
    }
    prismd_snapshot_release(snap);
}

static ssize_t read_events(void *cls, uint64_t pos, char *buf, size_t max)
{
    (void)pos;
    stream *s = cls;
    prismd_events *e = s->events;
    pthread_mutex_lock(&e->lock);
    if (e->closing || (s->gone && s->pending_off == s->pending_len)) {
        pthread_mutex_unlock(&e->lock);
        return MHD_CONTENT_READER_END_OF_STREAM;
    }
    time_t now = time(NULL);
    if (s->pending_off == s->pending_len)
        next_event(s, now);
    ssize_t n = 0;
    if (s->pending_off < s->pending_len) {
        size_t left = s->pending_len - s->pending_off;
        n = (ssize_t)(left < max ? left : max);
        memcpy(buf, s->pending + s->pending_off, (size_t)n);
        s->pending_off += (size_t)n;
        s->last_write = now;
    } else {
        /* Nothing to say: sleep until the next publish or keep-alive wake. */
        s->suspended = true;
        MHD_suspend_connection(s->conn);
    }
    pthread_mutex_unlock(&e->lock);
    return n;
}

static void free_stream(void *cls)
{
    stream *s = cls;
    prismd_events *e = s->events;
    pthread_mutex_lock(&e->lock);
    if (s->prev)
        s->prev->next = s->next;
    else
        e->streams = s->next;
    if (s->next)
        s->next->prev = s->prev;
    e->open--;
    pthread_mutex_unlock(&e->lock);
    prismd_http_event_streams_add(-1);
    free(s);
}

/* The streams of job_id on the list. Called with e->lock held; at most max_total streams. */
static size_t streams_of(const prismd_events *e, const char *job_id)
{
    size_t n = 0;
    for (const stream *s = e->streams; s; s = s->next)
        n += strcmp(s->job, job_id) == 0;
    return n;
}

struct MHD_Response *prismd_events_response(prismd_events *e, struct MHD_Connection *conn, const char *job_id,
                                            prismd_events_refusal *refused)
{
    *refused = PRISMD_EVENTS_NOMEM;
    stream *s = calloc(1, sizeof *s);
    if (!s)
        return NULL;
    s->events = e;
    s->conn = conn;
    s->last_write = time(NULL);
    snprintf(s->job, sizeof s->job, "%s", job_id);
    /* Counted and listed before the response exists, so that two requests at once cannot both
     * take the last place; free_stream (the response's end) takes it off again. */
    bool listed = false;
    pthread_mutex_lock(&e->lock);
    if (e->max_total && e->open >= e->max_total) {
        *refused = PRISMD_EVENTS_FULL;
    } else if (e->max_per_job && streams_of(e, s->job) >= e->max_per_job) {
        *refused = PRISMD_EVENTS_JOB_FULL;
    } else {
        s->next = e->streams;
        if (e->streams)
            e->streams->prev = s;
        e->streams = s;
        e->open++;
        listed = true;
    }
    pthread_mutex_unlock(&e->lock);
    if (!listed) {
        free(s);
        return NULL;
    }
    prismd_http_event_streams_add(1);
    struct MHD_Response *resp = MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 4096, read_events, s, free_stream);
    if (!resp) {
        free_stream(s);
        return NULL;
    }
    MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE, "text/event-stream");
    MHD_add_response_header(resp, MHD_HTTP_HEADER_CACHE_CONTROL, "no-cache");
    return resp;
}
