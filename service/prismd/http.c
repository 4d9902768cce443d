/* prismd's HTTP server (DESIGN 6, 12) on libmicrohttpd: the handler that answers every request,
 * prismd's own routes (/healthz, /readyz, /v1/config/defaults; one table, read by the handler and
 * by --help), the files embedded at build time (/v1/openapi.json and the dashboard at /,
 * assets.h), and the dispatch of the rest to REST /v1 and /metrics (rest.c) and to the event
 * streams (events.c). Runs on libmicrohttpd's threads, answering from a server struct that
 * main.c fills and that is immutable once the daemon has started. */
#define _GNU_SOURCE

#include "http.h"

#include "assets.h"
#include "help.h"
#include "http_guard.h"
#include "log.h"

#include <arpa/inet.h>
#include <errno.h>
#include <jansson.h>
#include <netinet/in.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define PRISMD_HTTP_THREADS 2u /* libmicrohttpd threads: reads never wait for a change in flight */
/* Each connection's memory pool in libmicrohttpd: room for a request line and headers well over
 * our own limits (--http-max-url-bytes, --http-max-header-bytes), so that those are answered by
 * the handler, as JSON; only a request past the pool gets libmicrohttpd's own answer. */
#define PRISMD_HTTP_POOL_BYTES (128u * 1024u)
#define PRISMD_EVENTS_RETRY_AFTER_S 10u /* Retry-After of a refused event stream */

/* ---------------------------------------------------------------------------------------------
 * HTTP routes: one table read by the request handler and by --help. */

/* The Content-Security-Policy of an HTML page (the dashboard, the fallback page): its own
 * scripts, styles (and style attributes, which the page sets) and data: images only, no
 * framing, no connections but to prismd. */
#define PRISMD_PAGE_POLICY                                                                                  \
    "default-src 'none'; script-src 'self'; style-src 'self' 'unsafe-inline'; img-src 'self' data:; "      \
    "connect-src 'self'; base-uri 'self'; form-action 'none'; frame-ancestors 'none'"

typedef struct prismd_reply {
    unsigned int status;
    char *body; /* owned: from json_dumps or strdup; or, with hold, the snapshot's */
    const char *content_type; /* NULL: application/json */
    prismd_snapshot *hold;    /* released once libmicrohttpd is done with body */
    size_t body_len;          /* 0: strlen(body) */
    bool gzip;                /* body is gzip-compressed */
    const prismd_answer *stream; /* a streamed answer of REST (body NULL), or NULL */
    bool persistent;          /* body is an embedded file: neither owned nor freed */
    bool no_cache;            /* Cache-Control: no-cache */
} prismd_reply;

typedef void (*prismd_route_fn)(const prismd_server *srv, prismd_reply *reply);

typedef struct prismd_route {
    const char *path;
    prismd_route_fn get;
    const char *help;
} prismd_route;

#define PRISMD_ALLOWED_METHODS "GET, HEAD"

/* Takes the reference to obj. */
static void reply_json(prismd_reply *reply, unsigned int status, json_t *obj, size_t flags)
{
    reply->status = status;
    reply->body = obj ? json_dumps(obj, flags) : NULL;
    json_decref(obj);
}

/* The error body of DESIGN 6: {"error": {"code": "...", "message": "..."}}. */
static void reply_error(prismd_reply *reply, unsigned int status, const char *code,
                        const char *fmt, ...) __attribute__((format(printf, 4, 5)));

static void reply_error(prismd_reply *reply, unsigned int status, const char *code,
                        const char *fmt, ...)
{
    char message[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(message, sizeof message, fmt, ap);
    va_end(ap);
    reply_json(reply, status,
               json_pack("{s:{s:s, s:s}}", "error", "code", code, "message", message),
               JSON_COMPACT | JSON_PRESERVE_ORDER);
    if (!reply->body) /* a message cut inside a multi-byte character: the code still goes out */
        reply_json(reply, status, json_pack("{s:{s:s, s:s}}", "error", "code", code, "message", code),
                   JSON_COMPACT);
}

static void route_healthz(const prismd_server *srv, prismd_reply *reply)
{
    (void)srv;
    reply_json(reply, MHD_HTTP_OK, json_pack("{s:s}", "status", "ok"), JSON_COMPACT);
}

/* The policy thread loops at least every 100 ms; 2 s without a loop means it is not serving. */
static bool policy_thread_alive(const prismd_server *srv)
{
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    long long alive = atomic_load(&srv->rest.snapshots->policy_alive_ms);
    long long now_ms = (long long)now.tv_sec * 1000 + now.tv_nsec / 1000000;
    return alive > 0 && now_ms - alive < 2000;
}

static void say(char *out, size_t len, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

/* Writes the message into out, cut to len bytes (a message need not be whole). */
static void say(char *out, size_t len, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(out, len, fmt, ap);
    va_end(ap);
}

/* Ready while this process still holds the lock on the data directory it was given (the lock
 * file at its path is the one we hold), the directory is writable and the policy thread runs.
 * True when ready; else false with why (of why_len bytes) saying what is not. /readyz and
 * /metrics' prism_ready both ask this. */
static bool server_ready(const prismd_server *srv, char *why, size_t why_len)
{
    struct stat held, at_path;
    if (srv->lock_fd < 0 || fstat(srv->lock_fd, &held) != 0)
        say(why, why_len, "data dir %s: the lock is not held", srv->data_dir);
    else if (stat(srv->lock_path, &at_path) != 0 || at_path.st_dev != held.st_dev ||
             at_path.st_ino != held.st_ino)
        say(why, why_len, "data dir %s: the lock file %s was removed or replaced", srv->data_dir,
            srv->lock_path);
    else if (access(srv->data_dir, W_OK) != 0)
        say(why, why_len, "data dir %s is not writable: %s", srv->data_dir, strerror(errno));
    else if (!policy_thread_alive(srv))
        say(why, why_len, "the policy thread has not run for over 2 s (starting, or stuck)");
    else
        return true;
    return false;
}

bool prismd_http_ready(const void *srv)
{
    char why[512];
    return server_ready(srv, why, sizeof why);
}

static void route_readyz(const prismd_server *srv, prismd_reply *reply)
{
    char why[512];
    if (!server_ready(srv, why, sizeof why))
        reply_error(reply, MHD_HTTP_SERVICE_UNAVAILABLE, "not_ready", "%s", why);
    else
        reply_json(reply, MHD_HTTP_OK,
                   json_pack("{s:s, s:s}", "status", "ready", "data_dir", srv->data_dir),
                   JSON_COMPACT | JSON_PRESERVE_ORDER);
}

static void route_config_defaults(const prismd_server *srv, prismd_reply *reply)
{
    reply->status = MHD_HTTP_OK;
    reply->body = strdup(srv->defaults_json);
}

static const prismd_route prismd_routes[] = {
    {"/healthz", route_healthz, "liveness: 200 {\"status\":\"ok\"}"},
    {"/readyz", route_readyz,
     "readiness: 200 {\"status\":\"ready\",\"data_dir\":DIR} while the data dir lock is held, "
     "DIR is writable and the policy thread (gRPC, store) is running, else 503"},
    {"/v1/config/defaults", route_config_defaults,
     "the policy config that new jobs start from (--config over the built-in defaults)"},
};

#define PRISMD_ROUTE_COUNT (sizeof prismd_routes / sizeof prismd_routes[0])

static void format_client(struct MHD_Connection *conn, char *out, size_t size)
{
    snprintf(out, size, "?");
    const union MHD_ConnectionInfo *info =
        MHD_get_connection_info(conn, MHD_CONNECTION_INFO_CLIENT_ADDRESS);
    if (!info || !info->client_addr)
        return;
    char host[INET6_ADDRSTRLEN];
    const struct sockaddr *sa = info->client_addr;
    if (sa->sa_family == AF_INET) {
        const struct sockaddr_in *sin = (const struct sockaddr_in *)(const void *)sa;
        if (inet_ntop(AF_INET, &sin->sin_addr, host, sizeof host))
            snprintf(out, size, "%s:%u", host, (unsigned)ntohs(sin->sin_port));
    } else if (sa->sa_family == AF_INET6) {
        const struct sockaddr_in6 *sin6 = (const struct sockaddr_in6 *)(const void *)sa;
        if (inet_ntop(AF_INET6, &sin6->sin6_addr, host, sizeof host))
            snprintf(out, size, "[%s]:%u", host, (unsigned)ntohs(sin6->sin6_port));
    }
}

/* True when s is valid UTF-8 (JSON answers may quote it): no overlong form, no surrogate
 * (U+D800 to U+DFFF), nothing above U+10FFFF (RFC 3629). */
static bool utf8_valid(const char *s)
{
    for (const unsigned char *p = (const unsigned char *)s; *p;) {
        unsigned char c = *p++;
        if (c < 0x80)
            continue;
        int n;
        unsigned char lo = 0x80, hi = 0xbf; /* the allowed range of the second byte */
        if (c >= 0xc2 && c <= 0xdf) {
            n = 1;
        } else if (c >= 0xe0 && c <= 0xef) {
            n = 2;
            if (c == 0xe0)
                lo = 0xa0; /* overlong below U+0800 */
            else if (c == 0xed)
                hi = 0x9f; /* surrogates */
        } else if (c >= 0xf0 && c <= 0xf4) {
            n = 3;
            if (c == 0xf0)
                lo = 0x90; /* overlong below U+10000 */
            else if (c == 0xf4)
                hi = 0x8f; /* above U+10FFFF */
        } else {
            return false; /* a continuation byte first, an overlong 0xc0/0xc1 lead, or 0xf5 and up */
        }
        if (*p < lo || *p > hi)
            return false;
        p++;
        for (int i = 1; i < n; i++, p++)
            if ((*p & 0xc0) != 0x80)
                return false;
    }
    return true;
}

/* Why the decoded request path is refused (400), or NULL: invalid UTF-8, or a control character
 * (an encoded NUL never gets here: inspect_target refuses it). */
static const char *path_refused(const char *url)
{
    if (!utf8_valid(url))
        return "is not valid UTF-8";
    for (const unsigned char *p = (const unsigned char *)url; *p; p++)
        if (*p < 0x20 || *p == 0x7f)
            return "contains a control character";
    return NULL;
}

/* One request: what the URI callback found wrong with its target, and its body, gathered over
 * the handler's calls. */
typedef struct request_body {
    char *data;
    size_t len;
    bool too_large;
    bool started;           /* the handler has seen the request */
    unsigned refuse_status; /* 0, or the status the target gets (414, 400) */
    const char *refuse_code;
    const char *refuse_message;
} request_body;

/* Where the server's callbacks go: one per listener. */
struct prismd_http {
    prismd_server *srv;
    prismd_listener listener;
    prismd_http_guard *guard;
    struct MHD_Daemon *daemon;
};

#define PRISMD_BODY_MAX (1u << 20)

static bool gather_body(request_body *b, const char *data, size_t n)
{
    if (b->too_large || b->len + n > PRISMD_BODY_MAX) {
        b->too_large = true;
        return true;
    }
    char *grown = realloc(b->data, b->len + n + 1);
    if (!grown)
        return false;
    memcpy(grown + b->len, data, n);
    b->data = grown;
    b->len += n;
    b->data[b->len] = '\0';
    return true;
}

/* libmicrohttpd's URI callback, called with the request target as sent (before its escapes are
 * decoded): refuses a target over --http-max-url-bytes (414), and an encoded NUL (%00), which
 * the decoded path would silently end at, in the path or the query (400). */
static void *inspect_target(void *cls, const char *uri, struct MHD_Connection *conn)
{
    (void)conn;
    const struct prismd_http *h = cls;
    request_body *b = calloc(1, sizeof *b);
    if (!b)
        return NULL;
    size_t len = strlen(uri);
    if (len > h->srv->limits.max_url_bytes) {
        b->refuse_status = MHD_HTTP_URI_TOO_LONG;
        b->refuse_code = "uri_too_long";
        b->refuse_message = "the request target is longer than --http-max-url-bytes";
        prismd_http_refuse(h->listener, PRISMD_REFUSED_URL_TOO_LONG);
    } else {
        for (const char *p = strchr(uri, '%'); p; p = strchr(p + 1, '%')) {
            if (p[1] == '0' && p[2] == '0') {
                b->refuse_status = MHD_HTTP_BAD_REQUEST;
                b->refuse_code = "invalid_argument";
                b->refuse_message = "the request target contains an encoded NUL (%00)";
                break;
            }
        }
    }
    return b;
}

static enum MHD_Result add_header_bytes(void *cls, enum MHD_ValueKind kind, const char *key, const char *value)
{
    (void)kind;
    size_t *n = cls;
    *n += strlen(key) + (value ? strlen(value) : 0) + 4; /* ": " and CRLF */
    return MHD_YES;
}

/* The request's header lines' size in bytes, as sent (near enough: folded spaces aside). */
static size_t header_bytes(struct MHD_Connection *conn)
{
    size_t n = 0;
    MHD_get_connection_values(conn, MHD_HEADER_KIND, add_header_bytes, &n);
    return n;
}

static void http_completed(void *cls, struct MHD_Connection *conn, void **req_cls,
                           enum MHD_RequestTerminationCode code)
{
    (void)cls;
    (void)code;
    prismd_http_guard_request_done(conn);
    request_body *b = *req_cls;
    if (b) {
        free(b->data);
        free(b);
        *req_cls = NULL;
    }
}

/* True when Accept-Encoding lists gzip (without q=0). */
static bool accepts_gzip(struct MHD_Connection *conn)
{
    const char *v = MHD_lookup_connection_value(conn, MHD_HEADER_KIND, MHD_HTTP_HEADER_ACCEPT_ENCODING);
    const char *g = v ? strstr(v, "gzip") : NULL;
    return g && strncmp(g + 4, ";q=0", 4) != 0 && strncmp(g + 4, "; q=0", 5) != 0;
}

static void release_snapshot(void *snapshot)
{
    prismd_snapshot_release(snapshot);
}

/* A REST answer streamed in chunks of STREAM_CHUNK bytes (rest.h's read and done). */
#define STREAM_CHUNK (64u * 1024u)

typedef struct streamed {
    ssize_t (*read)(void *cls, char *buf, size_t max);
    void (*done)(void *cls);
    void *cls;
} streamed;

static ssize_t streamed_read(void *cls, uint64_t pos, char *buf, size_t max)
{
    (void)pos;
    const streamed *st = cls;
    ssize_t n = st->read(st->cls, buf, max);
    return n > 0 ? n : n == 0 ? MHD_CONTENT_READER_END_OF_STREAM : MHD_CONTENT_READER_END_WITH_ERROR;
}

static void streamed_free(void *cls)
{
    streamed *st = cls;
    st->done(st->cls);
    free(st);
}

/* The response of a streamed answer; its done is called once whatever happens. */
static struct MHD_Response *streamed_response(const prismd_answer *a)
{
    streamed *st = malloc(sizeof *st);
    if (!st) {
        a->done(a->stream_cls);
        return NULL;
    }
    *st = (streamed){a->read, a->done, a->stream_cls};
    struct MHD_Response *resp =
        MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, STREAM_CHUNK, streamed_read, st, streamed_free);
    if (!resp)
        streamed_free(st);
    return resp;
}

static const char *query_arg(void *ctx, const char *name)
{
    return MHD_lookup_connection_value(ctx, MHD_GET_ARGUMENT_KIND, name);
}

/* The token of "Authorization: Bearer TOKEN", or NULL. */
static const char *bearer(struct MHD_Connection *conn)
{
    const char *v = MHD_lookup_connection_value(conn, MHD_HEADER_KIND, MHD_HTTP_HEADER_AUTHORIZATION);
    if (!v || strncasecmp(v, "Bearer ", 7) != 0)
        return NULL;
    return v + 7;
}

/* Queues reply (taking its body) with its headers; counts it for /metrics. */
static enum MHD_Result send_reply(struct MHD_Connection *conn, const char *method, const char *url,
                                  prismd_reply *reply, const char *allowed, unsigned retry_after_s,
                                  const struct timespec *started)
{
    if (prism_log_threshold <= PRISM_LOG_DEBUG) {
        char status[16], client[INET6_ADDRSTRLEN + 16];
        snprintf(status, sizeof status, "%u", reply->status);
        format_client(conn, client, sizeof client);
        prism_log(PRISM_LOG_DEBUG, "request", "method", method, "path", url, "status", status,
                  "client", client, LOG_END);
    }
    if (!reply->body && !reply->stream) {
        prism_log(PRISM_LOG_ERROR, "cannot build response: out of memory", "path", url, LOG_END);
        return MHD_NO;
    }
    struct MHD_Response *resp;
    size_t body_len = reply->body ? (reply->body_len ? reply->body_len : strlen(reply->body)) : 0;
    if (reply->stream) {
        resp = streamed_response(reply->stream);
    } else if (reply->persistent) {
        resp = MHD_create_response_from_buffer(body_len, reply->body, MHD_RESPMEM_PERSISTENT);
    } else if (reply->hold) {
        resp = MHD_create_response_from_buffer_with_free_callback_cls(body_len, reply->body, release_snapshot,
                                                                      reply->hold);
        if (!resp)
            prismd_snapshot_release(reply->hold);
    } else {
        /* Handed over, not copied: a large answer (/metrics of many blocks) is held once. */
        resp = MHD_create_response_from_buffer_with_free_callback(body_len, reply->body, free);
        if (!resp)
            free(reply->body);
    }
    reply->body = NULL;
    if (!resp)
        return MHD_NO;
    enum MHD_Result ok = MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE,
                                                 reply->content_type ? reply->content_type : "application/json");
    if (ok == MHD_YES && reply->gzip)
        ok = MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_ENCODING, "gzip");
    if (ok == MHD_YES && (reply->hold || reply->persistent))
        ok = MHD_add_response_header(resp, MHD_HTTP_HEADER_VARY, "Accept-Encoding");
    if (ok == MHD_YES && reply->no_cache)
        ok = MHD_add_response_header(resp, MHD_HTTP_HEADER_CACHE_CONTROL, "no-cache");
    /* No answer is to be read as another type than it says, or shown inside another site's
     * frame (the dashboard's token field and Save buttons); the page itself loads only from
     * prismd (no CDN, no inline script). */
    if (ok == MHD_YES)
        ok = MHD_add_response_header(resp, "X-Content-Type-Options", "nosniff");
    if (ok == MHD_YES)
        ok = MHD_add_response_header(resp, "Content-Security-Policy",
                                     reply->content_type && strncmp(reply->content_type, "text/html", 9) == 0
                                         ? PRISMD_PAGE_POLICY
                                         : "frame-ancestors 'none'");
    if (ok == MHD_YES && reply->status == MHD_HTTP_METHOD_NOT_ALLOWED)
        ok = MHD_add_response_header(resp, MHD_HTTP_HEADER_ALLOW, allowed ? allowed : PRISMD_ALLOWED_METHODS);
    if (ok == MHD_YES && retry_after_s) {
        char retry[16];
        snprintf(retry, sizeof retry, "%u", retry_after_s);
        ok = MHD_add_response_header(resp, MHD_HTTP_HEADER_RETRY_AFTER, retry);
    }
    if (ok == MHD_YES)
        ok = MHD_queue_response(conn, reply->status, resp);
    MHD_destroy_response(resp);
    struct timespec done;
    clock_gettime(CLOCK_MONOTONIC, &done);
    prismd_http_observe(reply->status, (double)(done.tv_sec - started->tv_sec) +
                                           (double)(done.tv_nsec - started->tv_nsec) / 1e9);
    return ok;
}

/* An embedded file (assets.h) as the answer: gzip-compressed when the client accepts it. */
static void reply_asset(prismd_reply *reply, const prismd_asset *a, bool gzip)
{
    gzip = gzip && a->gzip;
    reply->status = MHD_HTTP_OK;
    reply->body = (char *)(uintptr_t)(gzip ? a->gzip : a->data);
    reply->body_len = gzip ? a->gzip_len : a->len;
    reply->gzip = gzip;
    reply->content_type = a->content_type;
    reply->persistent = true;
    reply->no_cache = a->no_cache;
}

/* The first call of the handler for a request: sets its state up and answers at once a request
 * whose target or headers are refused (before any body is read). Returns true when it answered,
 * with *result what the handler returns. */
static bool request_start(const struct prismd_http *h, struct MHD_Connection *conn, const char *method,
                          const char *url, bool with_body, request_body **req, enum MHD_Result *result)
{
    if (!*req && !(*req = calloc(1, sizeof **req))) {
        *result = MHD_NO;
        return true;
    }
    request_body *b = *req;
    b->started = true;
    if (!b->refuse_status && header_bytes(conn) > h->srv->limits.max_header_bytes) {
        b->refuse_status = MHD_HTTP_REQUEST_HEADER_FIELDS_TOO_LARGE;
        b->refuse_code = "headers_too_large";
        b->refuse_message = "the request's headers are larger than --http-max-header-bytes";
        prismd_http_refuse(h->listener, PRISMD_REFUSED_HEADERS_TOO_LARGE);
    }
    if (!b->refuse_status && !with_body)
        prismd_http_guard_request_in(conn);
    if (!b->refuse_status)
        return false;
    prismd_http_guard_request_in(conn);
    struct timespec started;
    clock_gettime(CLOCK_MONOTONIC, &started);
    prismd_reply reply = {0};
    reply_error(&reply, b->refuse_status, b->refuse_code, "%s", b->refuse_message);
    *result = send_reply(conn, method, url, &reply, NULL, 0, &started);
    return true;
}

/* Answers GET /v1/jobs/{job}/events for a job that exists with a stream, or with 503 and
 * Retry-After when the streams are capped; false when the job does not exist (404 follows). */
static bool open_events(const struct prismd_http *h, struct MHD_Connection *conn, const char *url,
                        const char *events_job, const struct timespec *started, prismd_answer *refused_read,
                        enum MHD_Result *result)
{
    prismd_server *srv = h->srv;
    prismd_snapshot *snap = prismd_snapshots_get(srv->rest.snapshots);
    bool known = snap && prismd_snapshot_find(snap, events_job);
    prismd_snapshot_release(snap);
    if (!known || !prismd_rest_may_read(&srv->rest, events_job, bearer(conn), refused_read))
        return false; /* the caller answers: 404, or refused_read's 401/403 */
    prismd_events_refusal refused;
    struct MHD_Response *stream = prismd_events_response(srv->events, conn, events_job, &refused);
    if (stream) {
        *result = MHD_queue_response(conn, MHD_HTTP_OK, stream);
        MHD_destroy_response(stream);
        return true;
    }
    if (refused == PRISMD_EVENTS_NOMEM) {
        *result = MHD_NO;
        return true;
    }
    prismd_reply reply = {0};
    if (refused == PRISMD_EVENTS_FULL) {
        prismd_http_refuse(h->listener, PRISMD_REFUSED_EVENT_STREAMS);
        reply_error(&reply, MHD_HTTP_SERVICE_UNAVAILABLE, "unavailable",
                    "%zu event streams are open, the most --http-max-event-streams allows; retry later",
                    srv->limits.max_event_streams);
    } else {
        prismd_http_refuse(h->listener, PRISMD_REFUSED_EVENT_STREAMS_JOB);
        reply_error(&reply, MHD_HTTP_SERVICE_UNAVAILABLE, "unavailable",
                    "job %.128s has %zu event streams open, the most --http-max-event-streams-per-job allows; "
                    "retry later",
                    events_job, srv->limits.max_event_streams_per_job);
    }
    *result = send_reply(conn, MHD_HTTP_METHOD_GET, url, &reply, NULL, PRISMD_EVENTS_RETRY_AFTER_S, started);
    return true;
}

/* libmicrohttpd's access handler. A GET or HEAD is answered on its first call; a request with
 * a body (PATCH, PUT, POST) once the whole body (at most 1 MiB) has arrived. A request refused
 * for its target or its headers is answered on the first call, before its body. */
static enum MHD_Result http_handle(void *cls, struct MHD_Connection *conn, const char *url,
                                   const char *method, const char *version,
                                   const char *upload_data, size_t *upload_data_size,
                                   void **req_cls)
{
    (void)version;
    const struct prismd_http *h = cls;
    prismd_server *srv = h->srv;
    bool with_body = strcmp(method, MHD_HTTP_METHOD_PATCH) == 0 || strcmp(method, MHD_HTTP_METHOD_PUT) == 0 ||
                     strcmp(method, MHD_HTTP_METHOD_POST) == 0;
    request_body *body = *req_cls;
    if (!body || !body->started) {
        enum MHD_Result result;
        bool answered = request_start(h, conn, method, url, with_body, &body, &result);
        *req_cls = body;
        if (answered)
            return result;
        if (with_body)
            return MHD_YES;
    }
    if (body->refuse_status) { /* answered already: the rest of the body is dropped */
        *upload_data_size = 0;
        return MHD_YES;
    }
    if (with_body && *upload_data_size) {
        if (!gather_body(body, upload_data, *upload_data_size))
            return MHD_NO;
        *upload_data_size = 0;
        return MHD_YES;
    }
    *upload_data_size = 0;
    if (with_body)
        prismd_http_guard_request_in(conn);
    struct timespec started;
    clock_gettime(CLOCK_MONOTONIC, &started);

    size_t url_len = strlen(url);
    const char *path_problem = path_refused(url);
    bool bad_path = path_problem != NULL;
    char events_job[160] = "";
    prismd_answer events_refused = {0};
    /* GET /v1/jobs/JOB/events: a job id of at least one character and no '/' between the two. */
    const size_t jobs_len = strlen("/v1/jobs/"), events_len = strlen("/events");
    if (!bad_path && strcmp(method, MHD_HTTP_METHOD_GET) == 0 && url_len > jobs_len + events_len &&
        strncmp(url, "/v1/jobs/", jobs_len) == 0 && strcmp(url + url_len - events_len, "/events") == 0 &&
        !memchr(url + jobs_len, '/', url_len - jobs_len - events_len) && prismd_rest_allowed(url)) {
        const char *id = url + jobs_len;
        snprintf(events_job, sizeof events_job, "%.*s", (int)(url_len - events_len - jobs_len), id);
        enum MHD_Result result;
        if (open_events(h, conn, url, events_job, &started, &events_refused, &result))
            return result;
    }

    const prismd_route *route = NULL;
    for (size_t i = 0; i < PRISMD_ROUTE_COUNT && !bad_path; i++) {
        if (strcmp(url, prismd_routes[i].path) == 0)
            route = &prismd_routes[i];
    }
    /* The embedded files: the OpenAPI document and the dashboard's (no token: the contract and a
     * page that holds no data). */
    const prismd_asset *asset = NULL;
    if (!bad_path && !route)
        asset = strcmp(url, "/v1/openapi.json") == 0 ? prismd_asset_openapi() : prismd_asset_find(url);
    bool readable = strcmp(method, MHD_HTTP_METHOD_GET) == 0 ||
                    strcmp(method, MHD_HTTP_METHOD_HEAD) == 0;
    prismd_reply reply = {0};
    const char *allowed = route || asset ? PRISMD_ALLOWED_METHODS : prismd_rest_allowed(url);
    prismd_answer answer = {.accept_gzip = accepts_gzip(conn)};
    if (bad_path) {
        reply_error(&reply, MHD_HTTP_BAD_REQUEST, "invalid_argument", "the request path %s", path_problem);
    } else if (!allowed) {
        reply_error(&reply, MHD_HTTP_NOT_FOUND, "not_found", "no route for %.64s %.256s", method,
                    url);
    } else if (events_refused.body) {
        reply = (prismd_reply){events_refused.status, events_refused.body, events_refused.content_type, NULL, 0, false,
                               NULL, false, false};
    } else if (events_job[0]) {
        reply_error(&reply, MHD_HTTP_NOT_FOUND, "not_found", "job %.128s does not exist", events_job);
    } else if (body && body->too_large) {
        prismd_http_refuse(h->listener, PRISMD_REFUSED_BODY_TOO_LARGE);
        reply_error(&reply, MHD_HTTP_CONTENT_TOO_LARGE, "too_large", "the request body is over %u bytes",
                    PRISMD_BODY_MAX);
    } else if (route && readable) {
        route->get(srv, &reply);
    } else if (asset && readable) {
        reply_asset(&reply, asset, accepts_gzip(conn));
    } else if (!route && readable && prismd_rest_get(&srv->rest, url, bearer(conn), query_arg, conn, &answer)) {
        reply = (prismd_reply){answer.status, answer.body, answer.content_type, answer.hold, answer.body_len,
                               answer.gzip, answer.read ? &answer : NULL, false, false};
    } else if (!route && (with_body || strcmp(method, MHD_HTTP_METHOD_DELETE) == 0) &&
               prismd_rest_mutate(&srv->rest, method, url, bearer(conn), body && body->data ? body->data : "",
                                  body ? body->len : 0, &answer)) {
        reply = (prismd_reply){answer.status, answer.body, answer.content_type, answer.hold, answer.body_len,
                               answer.gzip, NULL, false, false};
    } else {
        reply_error(&reply, MHD_HTTP_METHOD_NOT_ALLOWED, "method_not_allowed",
                    "%.64s is not allowed on %.256s (allowed: %s)", method, url, allowed);
    }
    return send_reply(conn, method, url, &reply, allowed, 0, &started);
}

/* The health listener's handler: /healthz and /readyz only, answered on the first call. */
static enum MHD_Result health_handle(void *cls, struct MHD_Connection *conn, const char *url,
                                     const char *method, const char *version,
                                     const char *upload_data, size_t *upload_data_size,
                                     void **req_cls)
{
    (void)version;
    (void)upload_data;
    const struct prismd_http *h = cls;
    request_body *body = *req_cls;
    if (!body || !body->started) {
        enum MHD_Result result;
        bool answered = request_start(h, conn, method, url, false, &body, &result);
        *req_cls = body;
        if (answered)
            return result;
    }
    *upload_data_size = 0;
    struct timespec started;
    clock_gettime(CLOCK_MONOTONIC, &started);
    prismd_reply reply = {0};
    bool readable = strcmp(method, MHD_HTTP_METHOD_GET) == 0 || strcmp(method, MHD_HTTP_METHOD_HEAD) == 0;
    const prismd_route *route = NULL;
    for (size_t i = 0; i < 2 && !path_refused(url); i++) /* the first two routes: /healthz, /readyz */
        if (strcmp(url, prismd_routes[i].path) == 0)
            route = &prismd_routes[i];
    if (!route)
        reply_error(&reply, MHD_HTTP_NOT_FOUND, "not_found",
                    "the health listener serves GET /healthz and /readyz only");
    else if (!readable)
        reply_error(&reply, MHD_HTTP_METHOD_NOT_ALLOWED, "method_not_allowed", "%.64s is not allowed on %s",
                    method, route->path);
    else
        route->get(h->srv, &reply);
    return send_reply(conn, method, url, &reply, PRISMD_ALLOWED_METHODS, 0, &started);
}

static void http_log(void *cls, const char *fmt, va_list ap) __attribute__((format(printf, 2, 0)));

/* libmicrohttpd's error logger: each message becomes a warn event; the first one is kept for
 * the start-up error ("Failed to bind to port ...: Address already in use"). */
static void http_log(void *cls, const char *fmt, va_list ap)
{
    prismd_server *srv = cls;
    char text[256];
    vsnprintf(text, sizeof text, fmt, ap);
    size_t n = strlen(text);
    while (n > 0 && (text[n - 1] == '\n' || text[n - 1] == '\r'))
        text[--n] = '\0';
    pthread_mutex_lock(&srv->http_error_lock);
    if (!srv->http_error[0])
        snprintf(srv->http_error, sizeof srv->http_error, "%s", text);
    pthread_mutex_unlock(&srv->http_error_lock);
    prism_log(PRISM_LOG_WARN, "microhttpd", "error", text, LOG_END);
}

/* Starts one listener: the main one (every route) or the health one (/healthz, /readyz). */
static prismd_http *http_start(prismd_server *srv, prismd_listener listener, const struct sockaddr_storage *addr,
                               const char *tls_cert, const char *tls_key, prism_error *err)
{
    const prismd_http_limits *lim = &srv->limits;
    bool health = listener == PRISMD_LISTENER_HEALTH;
    prismd_http *h = calloc(1, sizeof *h);
    if (!h) {
        prism_error_set(err, PRISM_ERR_NOMEM, "out of memory");
        return NULL;
    }
    h->srv = srv;
    h->listener = listener;
    unsigned max_connections = (unsigned)(health ? lim->health_max_connections : lim->max_connections);
    h->guard = prismd_http_guard_create(listener, max_connections,
                                        (unsigned)(health ? lim->health_per_address : lim->per_address),
                                        (unsigned)lim->request_timeout_s, (unsigned)lim->idle_timeout_s);
    if (!h->guard) {
        free(h);
        prism_error_set(err, PRISM_ERR_NOMEM, "cannot start the HTTP request watchdog");
        return NULL;
    }
    unsigned int flags = MHD_USE_AUTO_INTERNAL_THREAD | MHD_USE_ERROR_LOG | MHD_ALLOW_SUSPEND_RESUME;
    uint16_t port;
    if (addr->ss_family == AF_INET6) {
        flags |= MHD_USE_DUAL_STACK;
        port = ntohs(((const struct sockaddr_in6 *)addr)->sin6_port);
    } else {
        port = ntohs(((const struct sockaddr_in *)addr)->sin_port);
    }
    if (tls_cert)
        flags |= MHD_USE_TLS;
    /* The guard holds the connection limit (and counts what it refuses): libmicrohttpd's own is
     * set above it, since it splits its own evenly over its threads. The logger goes first so
     * that libmicrohttpd uses it for everything that follows; TLS
     * options last, only with TLS (MHD_OPTION_END then ends the list early). */
    /* The health listener runs on libmicrohttpd's one internal thread: a pool size of 1 is
     * refused with a warning (which would then stand as the start-up error), so the option is
     * given to the main listener only. */
    struct MHD_OptionItem pool[] = {
        {health ? MHD_OPTION_END : MHD_OPTION_THREAD_POOL_SIZE, PRISMD_HTTP_THREADS, NULL},
        {MHD_OPTION_END, 0, NULL},
    };
    struct MHD_OptionItem tls[] = {
        {tls_cert ? MHD_OPTION_HTTPS_MEM_CERT : MHD_OPTION_END, 0, (void *)tls_cert},
        {MHD_OPTION_HTTPS_MEM_KEY, 0, (void *)tls_key},
        {MHD_OPTION_END, 0, NULL},
    };
    h->daemon = MHD_start_daemon(
        flags, port, prismd_http_guard_accept, h->guard, health ? &health_handle : &http_handle, h,
        MHD_OPTION_EXTERNAL_LOGGER, &http_log, srv, MHD_OPTION_SOCK_ADDR, (const struct sockaddr *)addr,
        MHD_OPTION_ARRAY, pool, MHD_OPTION_CONNECTION_LIMIT,
        max_connections * PRISMD_HTTP_THREADS, MHD_OPTION_CONNECTION_TIMEOUT,
        (unsigned)lim->idle_timeout_s, MHD_OPTION_CONNECTION_MEMORY_LIMIT, (size_t)PRISMD_HTTP_POOL_BYTES,
        MHD_OPTION_NOTIFY_COMPLETED, &http_completed, NULL, MHD_OPTION_NOTIFY_CONNECTION,
        &prismd_http_guard_notify, h->guard, MHD_OPTION_URI_LOG_CALLBACK, &inspect_target, h,
        MHD_OPTION_ARRAY, tls, MHD_OPTION_END);
    if (!h->daemon) {
        pthread_mutex_lock(&srv->http_error_lock);
        prism_error_set(err, PRISM_ERR_IO, "%s",
                        srv->http_error[0] ? srv->http_error : "libmicrohttpd could not start");
        pthread_mutex_unlock(&srv->http_error_lock);
        prismd_http_guard_destroy(h->guard);
        free(h);
        return NULL;
    }
    return h;
}

prismd_http *prismd_http_start(prismd_server *srv, const struct sockaddr_storage *addr, const char *tls_cert,
                               const char *tls_key, prism_error *err)
{
    return http_start(srv, PRISMD_LISTENER_HTTP, addr, tls_cert, tls_key, err);
}

prismd_http *prismd_http_start_health(prismd_server *srv, const struct sockaddr_storage *addr, const char *tls_cert,
                                      const char *tls_key, prism_error *err)
{
    return http_start(srv, PRISMD_LISTENER_HEALTH, addr, tls_cert, tls_key, err);
}

void prismd_http_stop(prismd_http *h)
{
    if (!h)
        return;
    MHD_stop_daemon(h->daemon);
    prismd_http_guard_destroy(h->guard);
    free(h);
}

void prismd_http_print_help(FILE *out)
{
    fprintf(out, "\nHTTP endpoints (JSON; errors as {\"error\":{\"code\",\"message\"}}):\n");
    for (size_t i = 0; i < PRISMD_ROUTE_COUNT; i++) {
        char label[64];
        snprintf(label, sizeof label, "GET %s", prismd_routes[i].path);
        prism_help_entry(out, label, prismd_routes[i].help, NULL);
    }
    static const char *const rest_routes[][2] = {
        {"GET /v1/openapi.json", "the OpenAPI 3.1 description of every route (no token needed)"},
        {"GET /", "the dashboard (and its files by name; no token needed)"},
        {"GET /v1/jobs", "jobs with step, map_version, agents connected, world_size, ranks lagging and not acked"},
        {"GET /v1/jobs/JOB/blocks", "the block map (precision, scores, last switch, forced) and the last decision's telemetry"},
        {"GET /v1/jobs/JOB/blocks/ID", "one block with its recent switch history"},
        {"GET /v1/jobs/JOB/config", "the job's policy config in force"},
        {"PATCH /v1/jobs/JOB/config", "change config keys (validated in full; applies at the next decision)"},
        {"PUT /v1/jobs/JOB/overrides", "{\"force_bf16_blocks\": [...], \"force_int8_blocks\": [...]} (next decision)"},
        {"GET /v1/jobs/JOB/telemetry", "telemetry records, ?since_step=S&limit=N (default 100, at most 1000)"},
        {"GET /v1/jobs/JOB/events", "server-sent events: one \"map\" event per new map version"},
        {"GET /v1/jobs/JOB/trace", "the job's binary trace (application/x-prism-trace; `prismctl trace JOB`): "
                                   "its merged steps, layout, calibration and config changes, for `prismctl replay`"},
        {"GET /v1/jobs/JOB/hints", "the runtime hints last sent to the job's agents (null before any)"},
        {"GET /v1/jobs/JOB/ranks", "per rank: connected, node and device (last Hello), last step, last Ack, trainer "
                                   "counters (last Heartbeat), lagging, acked_current_map"},
        {"GET /v1/jobs/JOB/plan", "the hybrid-device plan (DESIGN 11): status, device classes seen, the plan in force "
                                  "(prismctl plan's object) and the map it went out with"},
        {"DELETE /v1/jobs/JOB", "admin token only: ends the job's streams (NOT_FOUND), removes it from memory, the "
                                "store and DIR/jobs/JOB/; 200 {\"job_id\",\"deleted\":true}, 404 unknown job"},
        {"GET /metrics", "Prometheus text exposition (prism_* metrics)"},
    };
    for (size_t i = 0; i < sizeof rest_routes / sizeof rest_routes[0]; i++)
        prism_help_entry(out, rest_routes[i][0], rest_routes[i][1], NULL);
}
