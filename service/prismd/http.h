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
} prismd_server;

/* Starts libmicrohttpd on exactly addr (dual stack only for an IPv6 address), over TLS when
 * tls_cert and tls_key (PEM) are given. NULL when it cannot, with err saying why: the first
 * message libmicrohttpd logged ("Failed to bind to port ...: Address already in use"). Stop it
 * with MHD_stop_daemon. */
struct MHD_Daemon *prismd_http_start(prismd_server *srv, const struct sockaddr_storage *addr, const char *tls_cert,
                                     const char *tls_key, prism_error *err);

/* The "HTTP endpoints" part of --help: prismd's own routes and REST's. */
void prismd_http_print_help(FILE *out);

#endif
