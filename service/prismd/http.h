/* prismd's HTTP server (DESIGN 6, 12): libmicrohttpd, the request handler, /healthz, /readyz and
 * /v1/config/defaults; REST /v1 and /metrics are rest.c's, the event streams events.c's. */
#ifndef PRISMD_HTTP_H
#define PRISMD_HTTP_H

#include "events.h"
#include "prism/common.h"
#include "rest.h"

#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <sys/socket.h>

#include <microhttpd.h>

/* The HTTP limits (issue 12): main.c's options, fixed before the server starts. */
typedef struct prismd_http_limits {
    size_t max_connections;           /* --http-max-connections: open connections at most */
    size_t per_address;               /* --http-max-connections-per-address (0: no limit) */
    size_t request_timeout_s;         /* --http-request-timeout: whole request within (0: none) */
    size_t idle_timeout_s;            /* --http-idle-timeout: libmicrohttpd's inactivity timeout */
    size_t max_url_bytes;             /* --http-max-url-bytes: longer targets get 414 */
    size_t max_header_bytes;          /* --http-max-header-bytes: larger headers get 431 */
    size_t max_event_streams;         /* --http-max-event-streams (events.c holds the count) */
    size_t max_event_streams_per_job; /* --http-max-event-streams-per-job */
    size_t health_max_connections;    /* --health-max-connections: the health listener's */
    size_t health_per_address;        /* --health-max-connections-per-address */
} prismd_http_limits;

/* What the handler answers from. main.c fills it before prismd_http_start and it stays as it is
 * while the server runs, but for http_error (under http_error_lock). */
typedef struct prismd_server {
    const char *data_dir;
    char lock_path[PATH_MAX];
    int lock_fd;         /* the data directory's lock, held by main.c; /readyz checks it */
    char *defaults_json; /* the policy config for new jobs, rendered once at start */
    pthread_mutex_t http_error_lock;
    char http_error[256]; /* first message libmicrohttpd logged, for the start-up error */
    prismd_rest rest;     /* REST /v1 and /metrics, from the policy thread's snapshots */
    prismd_events *events; /* server-sent events */
    prismd_http_limits limits;
} prismd_server;

/* A running listener: libmicrohttpd's daemon and its guard (http_guard.h). */
typedef struct prismd_http prismd_http;

/* Starts libmicrohttpd on exactly addr (dual stack only for an IPv6 address), over TLS when
 * tls_cert and tls_key (PEM) are given, with srv->limits. NULL when it cannot, with err saying
 * why: the first message libmicrohttpd logged ("Failed to bind to port ...: Address already in
 * use"). Stop it with prismd_http_stop. */
prismd_http *prismd_http_start(prismd_server *srv, const struct sockaddr_storage *addr, const char *tls_cert,
                               const char *tls_key, prism_error *err);

/* The health listener (--health-listen): GET /healthz and /readyz only, its own connections
 * (--health-max-connections), its own thread, the same per-address limit and request deadline;
 * so that probes are answered however busy the main listener is. */
prismd_http *prismd_http_start_health(prismd_server *srv, const struct sockaddr_storage *addr, const char *tls_cert,
                                      const char *tls_key, prism_error *err);

/* Stops the listener (its connections end) and frees it. NULL: nothing. */
void prismd_http_stop(prismd_http *h);

/* Whether /readyz would answer 200 now (srv: the prismd_server): for /metrics' prism_ready,
 * through prismd_rest's ready. */
bool prismd_http_ready(const void *srv);

/* The "HTTP endpoints" part of --help: prismd's own routes and REST's. */
void prismd_http_print_help(FILE *out);

#endif
