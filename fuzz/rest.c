/* Fuzz target "rest": REST request paths, queries and bodies (service/prismd/rest.c), in-process:
 * the routing (prismd_rest_allowed), every GET (prismd_rest_get) and the mutations
 * (prismd_rest_mutate, answered by prismd_jobs_run_commands on a policy thread of the target's
 * own, as prismd's policy thread answers them), on the harness's demo jobs, no sockets.
 *
 * Input: requests separated by a line "%%"; each is a request line "METHOD TARGET [TOKEN]" and
 * the rest is its body. TARGET is PATH[?QUERY], percent-decoded as libmicrohttpd hands it to the
 * handler (the path ends at a decoded %00). METHOD "GETGZ" is a GET that accepts gzip; TOKEN
 * "-" is none. Every answer must be a status from 200 to 599 with a body. */
#define _POSIX_C_SOURCE 200809L
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "fuzz.h"
#include "prismd_harness.h"
#include "rest.h"

/* ---- the policy thread: runs queued commands while a mutation waits for them ---- */

static pthread_mutex_t policy_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t policy_cond = PTHREAD_COND_INITIALIZER;
static bool policy_armed;    /* a mutation is under way: run what gets queued */
static bool policy_busy;     /* the policy thread is inside prismd_jobs_run_commands */
static bool policy_ran;      /* it ran commands since the demo state was built */
static harness *policy_h;

static bool queue_empty(prismd_commands *q)
{
    pthread_mutex_lock(&q->lock);
    bool empty = q->head == NULL;
    pthread_mutex_unlock(&q->lock);
    return empty;
}

static void *policy_main(void *arg)
{
    (void)arg;
    pthread_mutex_lock(&policy_lock);
    for (;;) {
        while (!policy_armed)
            pthread_cond_wait(&policy_cond, &policy_lock);
        harness *h = policy_h;
        if (queue_empty(&h->commands)) {
            pthread_mutex_unlock(&policy_lock);
            sched_yield();
            pthread_mutex_lock(&policy_lock);
            continue;
        }
        policy_busy = true;
        policy_ran = true;
        pthread_mutex_unlock(&policy_lock);
        prismd_jobs_run_commands(h->jobs, &h->commands);
        pthread_mutex_lock(&policy_lock);
        policy_busy = false;
        pthread_cond_broadcast(&policy_cond);
    }
    return NULL;
}

static void policy_start(harness *h)
{
    static bool started;
    pthread_mutex_lock(&policy_lock);
    policy_h = h;
    policy_armed = true;
    pthread_cond_broadcast(&policy_cond);
    pthread_mutex_unlock(&policy_lock);
    if (!started) {
        pthread_t t;
        FUZZ_CHECK(pthread_create(&t, NULL, policy_main, NULL) == 0);
        pthread_detach(t);
        started = true;
    }
}

/* After this, the policy thread no longer touches the jobs (the caller may again). */
static void policy_stop(void)
{
    pthread_mutex_lock(&policy_lock);
    policy_armed = false;
    while (policy_busy)
        pthread_cond_wait(&policy_cond, &policy_lock);
    pthread_mutex_unlock(&policy_lock);
}

/* ---- requests ---- */

static int hex(char c)
{
    if (c >= '0' && c <= '9')
        return c - '0';
    if (c >= 'a' && c <= 'f')
        return c - 'a' + 10;
    if (c >= 'A' && c <= 'F')
        return c - 'A' + 10;
    return -1;
}

/* Percent-decodes s[0..n) into a new NUL-terminated string ('+' stays, as MHD keeps it in paths). */
static char *unescape(const char *s, size_t n)
{
    char *out = malloc(n + 1);
    FUZZ_CHECK(out != NULL);
    size_t o = 0;
    for (size_t i = 0; i < n; i++) {
        if (s[i] == '%' && i + 2 < n && hex(s[i + 1]) >= 0 && hex(s[i + 2]) >= 0) {
            out[o++] = (char)(hex(s[i + 1]) * 16 + hex(s[i + 2]));
            i += 2;
        } else {
            out[o++] = s[i];
        }
    }
    out[o] = '\0';
    return out;
}

typedef struct query_args {
    size_t n;
    char *names[8], *values[8];
} query_args;

static const char *query_get(void *ctx, const char *name)
{
    const query_args *q = ctx;
    for (size_t i = 0; i < q->n; i++)
        if (strcmp(q->names[i], name) == 0)
            return q->values[i];
    return NULL;
}

static void query_parse(query_args *q, const char *s, size_t n)
{
    q->n = 0;
    size_t i = 0;
    while (i < n && q->n < 8) {
        const char *amp = memchr(s + i, '&', n - i);
        size_t end = amp ? (size_t)(amp - s) : n;
        const char *eq = memchr(s + i, '=', end - i);
        size_t name_end = eq ? (size_t)(eq - s) : end;
        q->names[q->n] = unescape(s + i, name_end - i);
        q->values[q->n] = eq ? unescape(eq + 1, end - name_end - 1) : unescape("", 0);
        q->n++;
        i = end + 1;
    }
}

static void query_free(query_args *q)
{
    for (size_t i = 0; i < q->n; i++) {
        free(q->names[i]);
        free(q->values[i]);
    }
    q->n = 0;
}

/* PRISM_FUZZ_VERBOSE=1 prints every answer (to check what a seed reaches). */
static void check_answer(const char *method, const char *path, const prismd_answer *a)
{
    static int verbose = -1;
    if (verbose < 0)
        verbose = getenv("PRISM_FUZZ_VERBOSE") != NULL;
    if (verbose)
        fprintf(stderr, "%s %s -> %u %.200s\n", method, path, a->status,
                a->gzip ? "(gzip)" : a->body ? a->body : "(streamed)");
    FUZZ_CHECK(a->status >= 200 && a->status <= 599);
    FUZZ_CHECK(a->content_type != NULL);
    if (a->read) { /* a streamed answer (large block maps, telemetry): read to its end */
        FUZZ_CHECK(a->body == NULL && a->done != NULL);
        char buf[4096];
        size_t total = 0;
        for (ssize_t n; (n = a->read(a->stream_cls, buf, sizeof buf)) > 0;) {
            FUZZ_CHECK((size_t)n <= sizeof buf);
            total += (size_t)n;
            FUZZ_CHECK(total < ((size_t)1 << 30));
        }
        return;
    }
    FUZZ_CHECK(a->body != NULL);
    size_t len = a->body_len ? a->body_len : strlen(a->body);
    FUZZ_CHECK(a->gzip || len == strlen(a->body)); /* a text body has no NUL inside */
    FUZZ_CHECK(a->content_type != NULL);
}

static void release_answer(prismd_answer *a)
{
    if (a->read)
        a->done(a->stream_cls);
    else if (a->hold)
        prismd_snapshot_release(a->hold);
    else
        free(a->body);
}

static void one_request(harness *h, prismd_rest *r, const char *req, size_t n)
{
    const char *nl = memchr(req, '\n', n);
    size_t line_len = nl ? (size_t)(nl - req) : n;
    const char *body = nl ? nl + 1 : req + n;
    size_t body_len = (size_t)(req + n - body);
    /* The request line's fields. */
    const char *f[3] = {NULL, NULL, NULL};
    size_t fl[3] = {0, 0, 0}, nf = 0, i = 0;
    while (i < line_len && nf < 3) {
        while (i < line_len && req[i] == ' ')
            i++;
        if (i == line_len)
            break;
        f[nf] = req + i;
        while (i < line_len && req[i] != ' ')
            i++;
        fl[nf] = (size_t)(req + i - f[nf]);
        nf++;
    }
    if (nf < 2)
        return;
    char method[16];
    if (fl[0] >= sizeof method)
        return;
    memcpy(method, f[0], fl[0]);
    method[fl[0]] = '\0';
    const char *qmark = memchr(f[1], '?', fl[1]);
    size_t path_len = qmark ? (size_t)(qmark - f[1]) : fl[1];
    char *path = unescape(f[1], path_len);
    query_args q;
    query_parse(&q, qmark ? qmark + 1 : "", qmark ? fl[1] - path_len - 1 : 0);
    char *auth = nf == 3 && !(fl[2] == 1 && f[2][0] == '-') ? unescape(f[2], fl[2]) : NULL;
    /* The body in a buffer of its own size, so that ASan sees a read past its end. */
    char *body_copy = malloc(body_len ? body_len : 1);
    FUZZ_CHECK(body_copy != NULL);
    memcpy(body_copy, body, body_len);

    const char *allowed = prismd_rest_allowed(path);
    prismd_answer a = {.accept_gzip = strcmp(method, "GETGZ") == 0};
    bool get = strcmp(method, "GET") == 0 || strcmp(method, "HEAD") == 0 || a.accept_gzip;
    if (get && prismd_rest_get(r, path, auth, query_get, &q, &a)) {
        FUZZ_CHECK(allowed != NULL);
        check_answer(method, path, &a);
        prismd_http_observe(a.status, 0.001);
        release_answer(&a);
    } else if (!get) {
        policy_start(h);
        bool answered = prismd_rest_mutate(r, method, path, auth, body_copy, body_len, &a);
        policy_stop();
        if (answered) {
            FUZZ_CHECK(allowed != NULL);
            check_answer(method, path, &a);
            FUZZ_CHECK(a.status != 503); /* the policy thread always answers in time here */
            release_answer(&a);
            h->now_ms += 10;
            prismd_jobs_tick(h->jobs, h->now_ms);
        }
    }
    free(body_copy);
    free(auth);
    query_free(&q);
    free(path);
}

static char data_dir[64], telemetry_path[256];

static void remove_data_dir(void)
{
    char path[256];
    unlink(telemetry_path);
    snprintf(path, sizeof path, "%s/jobs/demo", data_dir);
    rmdir(path);
    snprintf(path, sizeof path, "%s/jobs", data_dir);
    rmdir(path);
    rmdir(data_dir);
}

/* A data dir with a telemetry file for job "demo", made once and removed at exit. */
static void make_data_dir(void)
{
    if (data_dir[0])
        return;
    snprintf(data_dir, sizeof data_dir, "/tmp/prism-fuzz-rest-XXXXXX");
    FUZZ_CHECK(mkdtemp(data_dir) != NULL);
    atexit(remove_data_dir);
    char path[256];
    snprintf(path, sizeof path, "%s/jobs", data_dir);
    FUZZ_CHECK(mkdir(path, 0700) == 0);
    snprintf(path, sizeof path, "%s/jobs/demo", data_dir);
    FUZZ_CHECK(mkdir(path, 0700) == 0);
    prism_config cfg;
    prism_error err;
    FUZZ_CHECK(prism_config_init(&cfg, &err) == PRISM_OK);
    snprintf(telemetry_path, sizeof telemetry_path, "%s/jobs/demo/%s", data_dir, cfg.telemetry_file);
    prism_config_free(&cfg);
    FILE *f = fopen(telemetry_path, "w");
    FUZZ_CHECK(f != NULL);
    for (int step = 1; step <= 5; step++)
        fprintf(f, "{\"step_id\":%d,\"map_version\":%d,\"blocks\":[]}\n", step, step);
    fputs("not a record\n{\"step_id\":9", f); /* and one still being written */
    fclose(f);
}

/* The demo state, built again only after a mutation reached the jobs: GETs read snapshots and
 * change nothing but the snapshot's lazily rendered texts, so inputs without one share it. */
static harness state;
static prismd_stream streams[2];
static prismd_peer peers[2];
static bool state_built;

static void state_free(void)
{
    for (size_t i = 0; i < 2; i++)
        prismd_jobs_stream_gone(state.jobs, &streams[i], &peers[i]);
    harness_free(&state);
    state_built = false;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    make_data_dir();
    if (state_built && policy_ran)
        state_free();
    if (!state_built) {
        harness_init(&state);
        memset(streams, 0, sizeof streams);
        memset(peers, 0, sizeof peers);
        harness_populate(&state, streams, peers);
        policy_ran = false;
        state_built = true;
    }
    prismd_rest r = {.snapshots = &state.snapshots, .reader = NULL, .commands = &state.commands,
                     .data_dir = data_dir, .admin_token = HARNESS_ADMIN_TOKEN};
    const char *text = (const char *)data;
    size_t pos = 0;
    static const char sep[] = "\n%%\n";
    while (pos < size) {
        const char *next = NULL;
        for (size_t i = pos; i + sizeof sep - 1 <= size; i++)
            if (memcmp(text + i, sep, sizeof sep - 1) == 0) {
                next = text + i;
                break;
            }
        size_t len = next ? (size_t)(next - (text + pos)) : size - pos;
        one_request(&state, &r, text + pos, len);
        pos += len + (next ? sizeof sep - 1 : 0);
    }
    return 0;
}
