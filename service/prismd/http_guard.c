/* Per-address connection limits and the request deadline (http_guard.h).
 *
 * The accept policy reserves a slot for the client's address under the guard's lock before
 * libmicrohttpd sets the connection up, so two pool threads accepting at once cannot both take
 * the last slot; the close notification gives it back. (libmicrohttpd calls the accept policy
 * only after its own global limit check, and can still drop a connection it accepted if it runs
 * out of memory before announcing it: that slot stays taken, one per such failure.)
 *
 * The deadline: each connection is on the guard's list from its start notification to its
 * close notification, both under the lock, with its socket and the time its current request
 * began. A watchdog thread shuts down (shutdown(2), never close) the socket of a connection whose
 * request has not arrived whole in time; libmicrohttpd then reads end-of-file and closes it as
 * usual. Since the entry leaves the list under the same lock before libmicrohttpd closes the
 * descriptor, the watchdog never touches a descriptor number that was reused. */
#define _GNU_SOURCE
#include "http_guard.h"

#include <netinet/in.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>

#define ADDRESS_BUCKETS 1024u

static atomic_ullong refusals[PRISMD_LISTENERS][PRISMD_REFUSALS];
static atomic_ullong open_connections[PRISMD_LISTENERS];
static atomic_llong open_event_streams;

void prismd_http_event_streams_add(long long delta)
{
    atomic_fetch_add(&open_event_streams, delta);
}

unsigned long long prismd_http_event_streams(void)
{
    long long n = atomic_load(&open_event_streams);
    return n > 0 ? (unsigned long long)n : 0;
}

const char *prismd_refusal_name(prismd_refusal r)
{
    static const char *const names[PRISMD_REFUSALS] = {
        "max_connections", "per_address", "request_deadline", "event_streams", "event_streams_per_job",
        "url_too_long", "headers_too_large", "body_too_large",
    };
    return (unsigned)r < PRISMD_REFUSALS ? names[r] : "?";
}

const char *prismd_listener_name(prismd_listener l)
{
    return l == PRISMD_LISTENER_HEALTH ? "health" : "http";
}

void prismd_http_refuse(prismd_listener l, prismd_refusal r)
{
    if ((unsigned)l < PRISMD_LISTENERS && (unsigned)r < PRISMD_REFUSALS)
        atomic_fetch_add(&refusals[l][r], 1);
}

unsigned long long prismd_http_refusals(prismd_listener l, prismd_refusal r)
{
    return (unsigned)l < PRISMD_LISTENERS && (unsigned)r < PRISMD_REFUSALS ? atomic_load(&refusals[l][r]) : 0;
}

unsigned long long prismd_http_connections(prismd_listener l)
{
    return (unsigned)l < PRISMD_LISTENERS ? atomic_load(&open_connections[l]) : 0;
}

/* A client address: IPv4 (also when it arrives IPv4-mapped on a dual-stack socket) or IPv6. */
typedef struct address {
    unsigned char bytes[16];
    size_t len; /* 4 or 16; 0: not an IP address (counted under one key) */
} address;

typedef struct address_count {
    struct address_count *next;
    address addr;
    unsigned connections;
} address_count;

typedef struct guarded_conn {
    struct guarded_conn *prev, *next;
    prismd_http_guard *guard;
    int fd;
    address addr;
    long long since_ms; /* when the current request's time began */
    bool whole;         /* the handler has the request: no deadline */
    bool cut;           /* shut down by the watchdog */
} guarded_conn;

struct prismd_http_guard {
    prismd_listener listener;
    unsigned max_connections;
    unsigned open;      /* connections accepted and not yet closed */
    unsigned per_address;
    unsigned request_timeout_s;
    unsigned keepalive_grace_s;
    pthread_mutex_t lock;
    pthread_cond_t wake;
    bool stopping;
    pthread_t watchdog;
    address_count *buckets[ADDRESS_BUCKETS];
    guarded_conn *conns;
};

static long long now_ms(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (long long)t.tv_sec * 1000 + t.tv_nsec / 1000000;
}

static address address_of(const struct sockaddr *sa)
{
    address a = {0};
    if (sa && sa->sa_family == AF_INET) {
        const struct sockaddr_in *in = (const struct sockaddr_in *)(const void *)sa;
        memcpy(a.bytes, &in->sin_addr, 4);
        a.len = 4;
    } else if (sa && sa->sa_family == AF_INET6) {
        const struct sockaddr_in6 *in6 = (const struct sockaddr_in6 *)(const void *)sa;
        if (IN6_IS_ADDR_V4MAPPED(&in6->sin6_addr)) {
            memcpy(a.bytes, in6->sin6_addr.s6_addr + 12, 4);
            a.len = 4;
        } else {
            memcpy(a.bytes, &in6->sin6_addr, 16);
            a.len = 16;
        }
    }
    return a;
}

static unsigned bucket_of(const address *a)
{
    uint32_t h = 2166136261u; /* FNV-1a */
    for (size_t i = 0; i < a->len; i++)
        h = (h ^ a->bytes[i]) * 16777619u;
    return h % ADDRESS_BUCKETS;
}

/* The count of a's connections, created at 0 when absent (NULL when out of memory). Called with
 * the lock held. */
static address_count *address_find(prismd_http_guard *g, const address *a, bool create)
{
    address_count **head = &g->buckets[bucket_of(a)];
    for (address_count *c = *head; c; c = c->next)
        if (c->addr.len == a->len && memcmp(c->addr.bytes, a->bytes, a->len) == 0)
            return c;
    if (!create)
        return NULL;
    address_count *c = calloc(1, sizeof *c);
    if (!c)
        return NULL;
    c->addr = *a;
    c->next = *head;
    *head = c;
    return c;
}

/* Gives back one connection of a; the entry goes when it has none. Called with the lock held. */
static void address_release(prismd_http_guard *g, const address *a)
{
    address_count **link = &g->buckets[bucket_of(a)];
    for (address_count *c = *link; c; link = &c->next, c = c->next) {
        if (c->addr.len != a->len || memcmp(c->addr.bytes, a->bytes, a->len) != 0)
            continue;
        if (c->connections > 0)
            c->connections--;
        if (g->open > 0)
            g->open--;
        if (c->connections == 0) {
            *link = c->next;
            free(c);
        }
        return;
    }
}

enum MHD_Result prismd_http_guard_accept(void *cls, const struct sockaddr *addr, socklen_t addrlen)
{
    (void)addrlen;
    prismd_http_guard *g = cls;
    address a = address_of(addr);
    pthread_mutex_lock(&g->lock);
    prismd_refusal why = PRISMD_REFUSALS;
    address_count *c = NULL;
    if (g->open >= g->max_connections)
        why = PRISMD_REFUSED_MAX_CONNECTIONS;
    else if (!(c = address_find(g, &a, true)))
        why = PRISMD_REFUSED_MAX_CONNECTIONS; /* out of memory: no room for one more */
    else if (g->per_address && c->connections >= g->per_address)
        why = PRISMD_REFUSED_PER_ADDRESS;
    if (why == PRISMD_REFUSALS) {
        c->connections++;
        g->open++;
    }
    pthread_mutex_unlock(&g->lock);
    if (why != PRISMD_REFUSALS)
        prismd_http_refuse(g->listener, why);
    return why == PRISMD_REFUSALS ? MHD_YES : MHD_NO;
}

void prismd_http_guard_notify(void *cls, struct MHD_Connection *conn, void **socket_context,
                              enum MHD_ConnectionNotificationCode toe)
{
    prismd_http_guard *g = cls;
    if (toe == MHD_CONNECTION_NOTIFY_STARTED) {
        const union MHD_ConnectionInfo *fd = MHD_get_connection_info(conn, MHD_CONNECTION_INFO_CONNECTION_FD);
        const union MHD_ConnectionInfo *who = MHD_get_connection_info(conn, MHD_CONNECTION_INFO_CLIENT_ADDRESS);
        guarded_conn *c = calloc(1, sizeof *c);
        address a = address_of(who ? who->client_addr : NULL);
        pthread_mutex_lock(&g->lock);
        if (c) {
            c->guard = g;
            c->fd = fd ? fd->connect_fd : -1;
            c->addr = a;
            c->since_ms = now_ms();
            c->next = g->conns;
            if (g->conns)
                g->conns->prev = c;
            g->conns = c;
        } else {
            address_release(g, &a); /* untracked: its slot goes back now rather than never */
        }
        pthread_mutex_unlock(&g->lock);
        *socket_context = c;
        if (c)
            atomic_fetch_add(&open_connections[g->listener], 1);
        return;
    }
    guarded_conn *c = *socket_context;
    if (!c)
        return;
    pthread_mutex_lock(&g->lock);
    if (c->prev)
        c->prev->next = c->next;
    else
        g->conns = c->next;
    if (c->next)
        c->next->prev = c->prev;
    address_release(g, &c->addr);
    pthread_mutex_unlock(&g->lock);
    atomic_fetch_sub(&open_connections[g->listener], 1);
    free(c);
    *socket_context = NULL;
}

/* The tracked entry of conn, or NULL for a connection no guard tracks. */
static guarded_conn *tracked(struct MHD_Connection *conn)
{
    const union MHD_ConnectionInfo *ctx = MHD_get_connection_info(conn, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
    return ctx ? ctx->socket_context : NULL;
}

void prismd_http_guard_request_in(struct MHD_Connection *conn)
{
    guarded_conn *c = tracked(conn);
    if (!c)
        return;
    pthread_mutex_lock(&c->guard->lock);
    c->whole = true;
    pthread_mutex_unlock(&c->guard->lock);
}

void prismd_http_guard_request_done(struct MHD_Connection *conn)
{
    guarded_conn *c = tracked(conn);
    if (!c)
        return;
    pthread_mutex_lock(&c->guard->lock);
    c->whole = false;
    c->since_ms = now_ms() + (long long)c->guard->keepalive_grace_s * 1000;
    pthread_mutex_unlock(&c->guard->lock);
}

/* Every quarter of the deadline (at most every 250 ms), shuts down the connections whose request
 * is overdue. A cut connection stays listed until libmicrohttpd closes it. */
static void *watchdog(void *arg)
{
    prismd_http_guard *g = arg;
    long long limit_ms = (long long)g->request_timeout_s * 1000;
    long long every_ms = limit_ms / 4 < 250 ? limit_ms / 4 : 250;
    pthread_mutex_lock(&g->lock);
    while (!g->stopping) {
        struct timespec until;
        clock_gettime(CLOCK_MONOTONIC, &until);
        until.tv_nsec += (long)(every_ms % 1000) * 1000000L;
        until.tv_sec += (time_t)(every_ms / 1000) + until.tv_nsec / 1000000000L;
        until.tv_nsec %= 1000000000L;
        pthread_cond_timedwait(&g->wake, &g->lock, &until);
        long long now = now_ms();
        unsigned cut = 0;
        for (guarded_conn *c = g->conns; c && !g->stopping; c = c->next) {
            if (c->whole || c->cut || c->fd < 0 || now - c->since_ms < limit_ms)
                continue;
            shutdown(c->fd, SHUT_RDWR);
            c->cut = true;
            cut++;
        }
        for (unsigned i = 0; i < cut; i++)
            prismd_http_refuse(g->listener, PRISMD_REFUSED_REQUEST_DEADLINE);
    }
    pthread_mutex_unlock(&g->lock);
    return NULL;
}

prismd_http_guard *prismd_http_guard_create(prismd_listener listener, unsigned max_connections, unsigned per_address,
                                            unsigned request_timeout_s, unsigned keepalive_grace_s)
{
    prismd_http_guard *g = calloc(1, sizeof *g);
    if (!g)
        return NULL;
    g->listener = listener;
    g->max_connections = max_connections;
    g->per_address = per_address;
    g->request_timeout_s = request_timeout_s;
    g->keepalive_grace_s = keepalive_grace_s;
    pthread_mutex_init(&g->lock, NULL);
    pthread_condattr_t attr;
    pthread_condattr_init(&attr);
    pthread_condattr_setclock(&attr, CLOCK_MONOTONIC);
    pthread_cond_init(&g->wake, &attr);
    pthread_condattr_destroy(&attr);
    if (request_timeout_s > 0 && pthread_create(&g->watchdog, NULL, watchdog, g) != 0) {
        pthread_cond_destroy(&g->wake);
        pthread_mutex_destroy(&g->lock);
        free(g);
        return NULL;
    }
    return g;
}

void prismd_http_guard_destroy(prismd_http_guard *g)
{
    if (!g)
        return;
    if (g->request_timeout_s > 0) {
        pthread_mutex_lock(&g->lock);
        g->stopping = true;
        pthread_cond_signal(&g->wake);
        pthread_mutex_unlock(&g->lock);
        pthread_join(g->watchdog, NULL);
    }
    for (unsigned b = 0; b < ADDRESS_BUCKETS; b++) {
        while (g->buckets[b]) {
            address_count *next = g->buckets[b]->next;
            free(g->buckets[b]);
            g->buckets[b] = next;
        }
    }
    while (g->conns) { /* none after MHD_stop_daemon; kept for a daemon that never started */
        guarded_conn *next = g->conns->next;
        free(g->conns);
        g->conns = next;
    }
    pthread_cond_destroy(&g->wake);
    pthread_mutex_destroy(&g->lock);
    free(g);
}
