/* REST /v1 (DESIGN 6) and /metrics (DESIGN 12), answered from the latest snapshot and, for the
 * switch history, a read-only connection to the store. Runs on libmicrohttpd's thread. */
#ifndef PRISMD_REST_H
#define PRISMD_REST_H

#include "snapshot.h"
#include "store.h"

typedef struct prismd_rest {
    prismd_snapshots *snapshots;
    prismd_store *reader; /* read-only; NULL: no history */
} prismd_rest;

typedef struct prismd_answer {
    unsigned status;
    char *body;                /* malloc'd */
    const char *content_type;
} prismd_answer;

/* Answers a GET of one of REST's paths; returns false when the path is not REST's. */
bool prismd_rest_get(prismd_rest *r, const char *path, prismd_answer *a);

/* True when the path is one of REST's (for 405 on other methods). */
bool prismd_rest_owns(const char *path);

/* Counts one HTTP request for /metrics. Thread-safe. */
void prismd_http_observe(unsigned status, double seconds);

#endif
