/* Server-sent events (events.h). Each stream keeps the last map version it sent; its reader
 * callback sends what is new in the latest snapshot, else a keep-alive comment when one is due,
 * else suspends the connection. The waiting list and its lock make sure a publish between the
 * check and the suspension still wakes it. */
#define _GNU_SOURCE
#include "events.h"

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
    bool suspended;
    time_t last_write;
    char pending[1024];     /* an event not yet handed to libmicrohttpd */
    size_t pending_len, pending_off;
} stream;

struct prismd_events {
    prismd_snapshots *snapshots;
    pthread_mutex_t lock;
    stream *streams;
    bool closing;
};

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
    pthread_mutex_unlock(&e->lock);
    free(s);
}

struct MHD_Response *prismd_events_response(prismd_events *e, struct MHD_Connection *conn, const char *job_id)
{
    stream *s = calloc(1, sizeof *s);
    if (!s)
        return NULL;
    s->events = e;
    s->conn = conn;
    s->last_write = time(NULL);
    snprintf(s->job, sizeof s->job, "%s", job_id);
    struct MHD_Response *resp = MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 4096, read_events, s, free_stream);
    if (!resp) {
        free(s);
        return NULL;
    }
    pthread_mutex_lock(&e->lock);
    s->next = e->streams;
    if (e->streams)
        e->streams->prev = s;
    e->streams = s;
    pthread_mutex_unlock(&e->lock);
    MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE, "text/event-stream");
    MHD_add_response_header(resp, MHD_HTTP_HEADER_CACHE_CONTROL, "no-cache");
    return resp;
}
