/* What keeps one HTTP client from locking out the others (issue 12, item 1): a limit on the
 * connections of one client address, and a deadline by which a connection must have delivered a
 * whole request (headers and body) however slowly it trickles bytes. One guard per libmicrohttpd
 * daemon (the main listener, the health listener); its callbacks are given to MHD_start_daemon.
 * Every refusal is counted for /metrics (prismd_http_refusals). */
#ifndef PRISMD_HTTP_GUARD_H
#define PRISMD_HTTP_GUARD_H

#include <stdbool.h>
#include <stddef.h>
#include <sys/socket.h>

#include <microhttpd.h>

/* Why a connection or a request was refused or cut; the label of prism_http_refused_total. */
typedef enum prismd_refusal {
    PRISMD_REFUSED_MAX_CONNECTIONS,  /* a connection over --http-max-connections */
    PRISMD_REFUSED_PER_ADDRESS,      /* a connection over --http-max-connections-per-address */
    PRISMD_REFUSED_REQUEST_DEADLINE, /* no whole request within --http-request-timeout */
    PRISMD_REFUSED_EVENT_STREAMS,    /* an event stream over --http-max-event-streams */
    PRISMD_REFUSED_EVENT_STREAMS_JOB, /* over --http-max-event-streams-per-job */
    PRISMD_REFUSED_URL_TOO_LONG,     /* 414: a request target over --http-max-url-bytes */
    PRISMD_REFUSED_HEADERS_TOO_LARGE, /* 431: headers over --http-max-header-bytes */
    PRISMD_REFUSED_BODY_TOO_LARGE,   /* 413: a body over 1 MiB */
    PRISMD_REFUSALS
} prismd_refusal;

typedef enum prismd_listener { PRISMD_LISTENER_HTTP, PRISMD_LISTENER_HEALTH, PRISMD_LISTENERS } prismd_listener;

/* The label values of prism_http_refused_total. */
const char *prismd_refusal_name(prismd_refusal r);
const char *prismd_listener_name(prismd_listener l);

/* Counts one refusal; thread-safe. Read back with prismd_http_refusals. */
void prismd_http_refuse(prismd_listener l, prismd_refusal r);
unsigned long long prismd_http_refusals(prismd_listener l, prismd_refusal r);

/* Connections open now on the listener (for the prism_http_connections gauge). */
unsigned long long prismd_http_connections(prismd_listener l);

/* Event streams open now (prism_http_event_streams): events.c adds 1 per stream it lists and
 * takes 1 away when the stream ends. */
void prismd_http_event_streams_add(long long delta);
unsigned long long prismd_http_event_streams(void);

typedef struct prismd_http_guard prismd_http_guard;

/* max_connections: connections open at once at most; per_address: connections one client
 * address may hold at once (0: no limit). request_timeout_s:
 * seconds from accept by which the request must have arrived whole, else the connection is shut
 * down (0: none). On a kept-alive connection the next request's time starts keepalive_grace_s
 * after the previous answer (pass libmicrohttpd's idle timeout: an idle connection is then closed
 * by that, as usual and uncounted, and only one trickling a request is cut and counted). NULL
 * when out of memory or when the watchdog thread cannot start. */
prismd_http_guard *prismd_http_guard_create(prismd_listener listener, unsigned max_connections, unsigned per_address,
                                            unsigned request_timeout_s, unsigned keepalive_grace_s);

/* Stops the watchdog and frees the guard; call after MHD_stop_daemon. NULL: nothing. */
void prismd_http_guard_destroy(prismd_http_guard *g);

/* MHD_AcceptPolicyCallback (cls: the guard): closes at once, and counts, a connection over
 * max_connections or one whose address already holds per_address of them; an accepted one is
 * counted (in all and for its address) until prismd_http_guard_notify sees it closed. */
enum MHD_Result prismd_http_guard_accept(void *cls, const struct sockaddr *addr, socklen_t addrlen);

/* MHD_NotifyConnectionCallback (cls: the guard): tracks each connection from its start, for the
 * deadline, to its close, when its address's count goes down. */
void prismd_http_guard_notify(void *cls, struct MHD_Connection *conn, void **socket_context,
                              enum MHD_ConnectionNotificationCode toe);

/* The handler has the request whole: its connection is past the deadline's reach until the
 * request completes. */
void prismd_http_guard_request_in(struct MHD_Connection *conn);

/* The request's answer is done: on a kept-alive connection the next request's time starts
 * keepalive_grace_s from now. */
void prismd_http_guard_request_done(struct MHD_Connection *conn);

#endif
