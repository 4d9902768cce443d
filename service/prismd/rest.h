/* REST /v1 (DESIGN 6) and /metrics (DESIGN 12), answered from the latest snapshot and, for the
 * switch history, a read-only connection to the store. Runs on libmicrohttpd's thread. */
#ifndef PRISMD_REST_H
#define PRISMD_REST_H

#include "commands.h"
#include "mem_limits.h"
#include "snapshot.h"
#include "store.h"

#include <sys/types.h>

typedef struct prismd_rest {
    prismd_snapshots *snapshots;
    prismd_store *reader; /* read-only; NULL: no history */
    prismd_commands *commands; /* mutations go to the policy thread through it */
    const char *data_dir;      /* for the jobs' telemetry files */
    const char *admin_token;   /* NULL: none */
    bool require_read_token;   /* --require-read-token: reads of a job need its or the admin token */
    const prismd_memory_limits *mem; /* answer sizes and streamed answers at once; NULL: none */
    bool (*ready)(const void *ctx);  /* /readyz's verdict, for prism_ready; NULL: always ready */
    const void *ready_ctx;
} prismd_rest;

/* A query argument of the request, or NULL. */
typedef const char *(*prismd_query_fn)(void *ctx, const char *name);

typedef struct prismd_answer {
    bool accept_gzip;          /* in: the client sent Accept-Encoding: gzip */
    unsigned status;
    char *body;                /* malloc'd, or (hold set) the snapshot's own text */
    size_t body_len;           /* 0: strlen(body) */
    bool gzip;                 /* body is gzip-compressed (Content-Encoding: gzip) */
    const char *content_type;
    prismd_snapshot *hold;     /* when set: body lives in this snapshot; release it once sent */
    /* A streamed answer (body NULL): read fills buf with up to max bytes of it and returns how
     * many, 0 at its end, -1 on an error (the connection is closed); done is called once when
     * the answer is gone, sent or not. */
    ssize_t (*read)(void *cls, char *buf, size_t max);
    void (*done)(void *cls);
    void *stream_cls;
} prismd_answer;

/* Answers a GET of one of REST's paths; returns false when the path is not REST's. auth: the
 * request's bearer token or NULL, checked by the rule of auth.h (/metrics needs none). */
bool prismd_rest_get(prismd_rest *r, const char *path, const char *auth, prismd_query_fn query, void *query_ctx,
                     prismd_answer *a);

/* The auth rule for a read of job_id (the event stream): true when allowed; else *a holds the
 * refusal (401, 403, or 404 for an unknown job). */
bool prismd_rest_may_read(prismd_rest *r, const char *job_id, const char *auth, prismd_answer *a);

/* The methods a REST path takes ("GET, HEAD", ...), or NULL when the path is not REST's. */
const char *prismd_rest_allowed(const char *path);

/* Answers PATCH /v1/jobs/{job}/config, PUT /v1/jobs/{job}/overrides and DELETE /v1/jobs/{job};
 * returns false for any other method and path. auth: the request's bearer token or NULL. */
bool prismd_rest_mutate(prismd_rest *r, const char *method, const char *path, const char *auth, const char *body,
                        size_t body_len, prismd_answer *a);

/* Counts one HTTP request for /metrics. Thread-safe. */
void prismd_http_observe(unsigned status, double seconds);

#endif
