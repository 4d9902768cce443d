/* prismd: the Prism policy service (DESIGN 1, 5, 6, 7).
 *
 * It validates the default policy configuration for new jobs (--config, through the policy
 * core), creates its data directory and holds an exclusive lock on it so that two prismd never
 * share one, serves prism.v1.PolicyService over gRPC (rpc.c: Connect, GetBlockMap, Watch, driven
 * by the policy thread that owns every job, jobs.c), and serves over HTTP (libmicrohttpd)
 * liveness (/healthz), readiness (/readyz) and the default configuration (/v1/config/defaults).
 * Logs are logfmt lines on stderr (common/log.c). SIGTERM or SIGINT ends every stream with UNAVAILABLE
 * and stops cleanly with exit status 0.
 *
 * Threads: the main thread parses, starts and then waits in sigwait(); the policy thread drives
 * the gRPC completion queue; libmicrohttpd's internal thread answers requests from a server
 * struct that is immutable once the daemon has started.
 *
 * Exit status: 0 after a clean stop (and for --help, --version), 1 when the data directory, its
 * lock or a listening address cannot be had, 2 for a bad option or a bad --config. */
#define _GNU_SOURCE

#include "config.h"
#include "help.h"
#include "log.h"
#include "net.h"
#include "prism/common.h"
#include "events.h"
#include "rest.h"
#include "rpc.h"
#include "store.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <limits.h>
#include <netinet/in.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <time.h>
#include <unistd.h>

#include <microhttpd.h>


#define PRISMD_LOCK_NAME "prismd.lock"
#define PRISMD_DATA_DIR_MODE 0750
#define PRISMD_HTTP_TIMEOUT_S 30u
#define PRISMD_HTTP_THREADS 2u /* libmicrohttpd threads: reads never wait for a change in flight */
#define PRISMD_HTTP_CONNECTIONS 1024u /* open HTTP connections at most (event streams included) */

/* ---------------------------------------------------------------------------------------------
 * Options: one table (name, argument, default, help) read by the parser, the defaults and --help.
 * A default is applied through the same setter as a command-line value, so it is written once. */

typedef struct prismd_options {
    struct sockaddr_storage http_addr;
    socklen_t http_addr_len;
    char http_text[INET6_ADDRSTRLEN + 16]; /* canonical "a.b.c.d:port" or "[v6]:port" */
    char grpc_text[INET6_ADDRSTRLEN + 16];
    size_t max_message_bytes;
    size_t stream_buffer_bytes;
    size_t max_jobs;
    size_t max_blocks;
    bool auto_create;
    prismd_hints hints;
    char *admin_token; /* read from --admin-token-file */
    char *tls_cert;    /* PEM, read from --tls-cert; with tls_key: both servers use TLS */
    char *tls_key;
    const char *data_dir;
    const char *config_path; /* NULL: the built-in policy defaults */
    prism_log_level log_level;
    bool help;
    bool version;
} prismd_options;

typedef prism_status (*prismd_option_set)(prismd_options *opts, const char *value,
                                          prism_error *err);

typedef struct prismd_option {
    const char *name;          /* long name, without "--" */
    char short_name;           /* 0: none */
    const char *arg;           /* argument name for --help; NULL: a flag that takes no value */
    const char *default_value; /* applied at start through set; NULL: none */
    prismd_option_set set;
    const char *help;
} prismd_option;

static prism_status set_http_listen(prismd_options *opts, const char *value, prism_error *err)
{
    return prism_parse_listen(value, &opts->http_addr, &opts->http_addr_len, opts->http_text, sizeof opts->http_text, err);
}

static prism_status set_grpc_listen(prismd_options *opts, const char *value, prism_error *err)
{
    struct sockaddr_storage addr;
    socklen_t len;
    return prism_parse_listen(value, &addr, &len, opts->grpc_text, sizeof opts->grpc_text, err);
}

static prism_status set_size(size_t *out, const char *value, unsigned long long min, unsigned long long max,
                             prism_error *err)
{
    char *end = NULL;
    errno = 0;
    unsigned long long x = strtoull(value, &end, 10);
    if (errno || !value[0] || *end || value[0] == '-' || x < min || x > max)
        return prism_error_set(err, PRISM_ERR_INVALID, "\"%.200s\" is not an integer from %llu to %llu", value, min,
                               max);
    *out = (size_t)x;
    return PRISM_OK;
}

static prism_status set_max_message_bytes(prismd_options *opts, const char *value, prism_error *err)
{
    return set_size(&opts->max_message_bytes, value, 1024, 1ull << 30, err);
}

static prism_status set_stream_buffer_bytes(prismd_options *opts, const char *value, prism_error *err)
{
    return set_size(&opts->stream_buffer_bytes, value, 4096, 1ull << 32, err);
}

static prism_status set_max_jobs(prismd_options *opts, const char *value, prism_error *err)
{
    return set_size(&opts->max_jobs, value, 1, 1000000, err);
}

static prism_status set_max_blocks(prismd_options *opts, const char *value, prism_error *err)
{
    return set_size(&opts->max_blocks, value, 1, 10000000, err);
}

/* The admin token is read from a file so that it never shows in a process list. */
static prism_status set_admin_token_file(prismd_options *opts, const char *value, prism_error *err)
{
    size_t len = 0;
    char *text = prism_file_read(value, &len, err);
    if (!text)
        return err->status;
    while (len > 0 && (text[len - 1] == '\n' || text[len - 1] == '\r' || text[len - 1] == ' '))
        text[--len] = '\0';
    if (len == 0 || strlen(text) != len) {
        free(text);
        return prism_error_set(err, PRISM_ERR_INVALID, "%.200s: the token is empty or not text", value);
    }
    free(opts->admin_token);
    opts->admin_token = text;
    return PRISM_OK;
}

/* A PEM file, read whole at start so that a bad path is an option error. */
static prism_status read_pem(char **out, const char *value, const char *what, prism_error *err)
{
    size_t len = 0;
    char *text = prism_file_read(value, &len, err);
    if (!text)
        return err->status;
    if (!strstr(text, "-----BEGIN ")) {
        free(text);
        return prism_error_set(err, PRISM_ERR_INVALID, "%.200s: not a PEM %s", value, what);
    }
    free(*out);
    *out = text;
    return PRISM_OK;
}

static prism_status set_tls_cert(prismd_options *opts, const char *value, prism_error *err)
{
    return read_pem(&opts->tls_cert, value, "certificate", err);
}

static prism_status set_tls_key(prismd_options *opts, const char *value, prism_error *err)
{
    return read_pem(&opts->tls_key, value, "private key", err);
}

/* --service-config is applied before every other option (see options_parse); here it only
 * has to be there. */
static prism_status set_service_config(prismd_options *opts, const char *value, prism_error *err)
{
    (void)opts;
    (void)value;
    (void)err;
    return PRISM_OK;
}

static prism_status set_u32(uint32_t *out, const char *value, unsigned long long max, prism_error *err)
{
    size_t x = 0;
    prism_status st = set_size(&x, value, 0, max, err);
    if (!st)
        *out = (uint32_t)x;
    return st;
}

static prism_status set_hint_h2d(prismd_options *opts, const char *value, prism_error *err)
{
    return set_u32(&opts->hints.max_inflight_h2d, value, 64, err);
}

static prism_status set_hint_d2h(prismd_options *opts, const char *value, prism_error *err)
{
    return set_u32(&opts->hints.max_inflight_d2h, value, 64, err);
}

static prism_status set_hint_prefetch(prismd_options *opts, const char *value, prism_error *err)
{
    return set_u32(&opts->hints.prefetch_window, value, 64, err);
}

static prism_status set_hint_vram(prismd_options *opts, const char *value, prism_error *err)
{
    char *end = NULL;
    errno = 0;
    double x = strtod(value, &end);
    if (errno || !value[0] || *end || !(x >= 0 && x <= 1))
        return prism_error_set(err, PRISM_ERR_INVALID, "\"%.200s\" is not a fraction from 0 to 1", value);
    opts->hints.vram_pressure_threshold = x;
    opts->hints.suppress_prefetch_in_backward = true;  /* DESIGN 9: under pressure, in backward */
    opts->hints.suppress_prefetch_in_optimizer = true; /* and during the optimizer phase */
    return PRISM_OK;
}

static prism_status set_auto_create(prismd_options *opts, const char *value, prism_error *err)
{
    if (strcmp(value, "true") == 0 || strcmp(value, "false") == 0) {
        opts->auto_create = value[0] == 't';
        return PRISM_OK;
    }
    return prism_error_set(err, PRISM_ERR_INVALID, "\"%.200s\" is not true or false", value);
}

static prism_status set_data_dir(prismd_options *opts, const char *value, prism_error *err)
{
    if (!*value)
        return prism_error_set(err, PRISM_ERR_INVALID, "the directory name is empty");
    if (strlen(value) + 1 + sizeof PRISMD_LOCK_NAME > PATH_MAX)
        return prism_error_set(err, PRISM_ERR_INVALID, "\"%.200s...\" is longer than PATH_MAX",
                               value);
    opts->data_dir = value;
    return PRISM_OK;
}

static prism_status set_config(prismd_options *opts, const char *value, prism_error *err)
{
    if (!*value)
        return prism_error_set(err, PRISM_ERR_INVALID, "the file name is empty");
    opts->config_path = value;
    return PRISM_OK;
}

static prism_status set_log_level(prismd_options *opts, const char *value, prism_error *err)
{
    for (size_t i = 0; i < PRISM_LOG_LEVELS; i++) {
        if (strcmp(value, prism_log_level_names[i]) == 0) {
            opts->log_level = (prism_log_level)i;
            return PRISM_OK;
        }
    }
    return prism_error_set(err, PRISM_ERR_INVALID,
                           "\"%.200s\" is not one of debug, info, warn, error", value);
}

static prism_status set_help(prismd_options *opts, const char *value, prism_error *err)
{
    (void)value;
    (void)err;
    opts->help = true;
    return PRISM_OK;
}

static prism_status set_version(prismd_options *opts, const char *value, prism_error *err)
{
    (void)value;
    (void)err;
    opts->version = true;
    return PRISM_OK;
}

static const prismd_option prismd_option_table[] = {
    {"http-listen", 0, "ADDR:PORT", "127.0.0.1:8080", set_http_listen,
     "HTTP address: IPv4 a.b.c.d:PORT, or IPv6 [ADDR]:PORT (then also IPv4 where the system "
     "allows dual stack)"},
    {"grpc-listen", 0, "ADDR:PORT", "127.0.0.1:50051", set_grpc_listen,
     "gRPC address of prism.v1.PolicyService (agents' Connect, GetBlockMap, Watch), same forms"},
    {"max-message-bytes", 0, "N", "16777216", set_max_message_bytes,
     "largest gRPC message accepted; larger ones are refused with RESOURCE_EXHAUSTED"},
    {"stream-buffer-bytes", 0, "N", "67108864", set_stream_buffer_bytes,
     "unsent bytes a stream may hold; an agent or watcher that stops reading past it is cut off "
     "with RESOURCE_EXHAUSTED"},
    {"max-jobs", 0, "N", "1000", set_max_jobs, "jobs this prismd holds at most; a Hello for one more is refused"},
    {"max-blocks", 0, "N", "100000", set_max_blocks,
     "distinct block ids per job at most; a report or layout with more is refused"},
    {"auto-create", 0, "true|false", "true", set_auto_create,
     "a Hello for an unknown job creates it, keeping the Hello's bearer token as the job's "
     "token; false: NOT_FOUND"},
    {"hint-inflight-h2d", 0, "N", "2", set_hint_h2d,
     "runtime hint sent to agents: host-to-device block copies in flight at once (0 to 64)"},
    {"hint-inflight-d2h", 0, "N", "2", set_hint_d2h, "runtime hint: device-to-host copies in flight at once"},
    {"hint-prefetch-window", 0, "N", "2", set_hint_prefetch, "runtime hint: blocks fetched ahead of the one in use"},
    {"hint-vram-pressure", 0, "FRACTION", "0.8", set_hint_vram,
     "runtime hint: used/total device memory above which speculative prefetch stops in backward and in "
     "the optimizer phase (DESIGN 9)"},
    {"admin-token-file", 0, "FILE", NULL, set_admin_token_file,
     "file holding the admin bearer token, accepted for every job's REST changes; without it "
     "a job's changes need the job's token when it has one"},
    {"tls-cert", 0, "FILE", NULL, set_tls_cert,
     "PEM certificate (chain); with --tls-key, gRPC and HTTP both serve TLS only"},
    {"tls-key", 0, "FILE", NULL, set_tls_key, "PEM private key of --tls-cert"},
    {"data-dir", 0, "DIR", "./prism-data", set_data_dir,
     "state directory, created (mode 0750) if missing and locked through DIR/" PRISMD_LOCK_NAME
     " so that one prismd at a time uses it"},
    {"config", 0, "FILE", NULL, set_config,
     "policy config JSON for new jobs (keys below; the bare object or "
     "{\"memory\":{\"stagehand\":{\"selective_precision\":{...}}}}), validated at start; "
     "without it the built-in defaults"},
    {"log-level", 0, "LEVEL", "info", set_log_level,
     "least severe log event written to stderr: debug (adds one line per HTTP request), info, "
     "warn or error"},
    {"service-config", 0, "FILE", NULL, set_service_config,
     "JSON object of these options by name, e.g. {\"grpc-listen\": \"0.0.0.0:50051\", \"max-jobs\": 50}; "
     "options on the command line win over the file"},
    {"help", 'h', NULL, NULL, set_help, "print this help and exit"},
    {"version", 0, NULL, NULL, set_version, "print the version and exit"},
};

#define PRISMD_OPTION_COUNT (sizeof prismd_option_table / sizeof prismd_option_table[0])

static const prismd_option *option_find_long(const char *name, size_t len)
{
    for (size_t i = 0; i < PRISMD_OPTION_COUNT; i++) {
        const prismd_option *o = &prismd_option_table[i];
        if (strlen(o->name) == len && strncmp(o->name, name, len) == 0)
            return o;
    }
    return NULL;
}

static const prismd_option *option_find_short(char c)
{
    for (size_t i = 0; i < PRISMD_OPTION_COUNT; i++) {
        if (prismd_option_table[i].short_name != 0 && prismd_option_table[i].short_name == c)
            return &prismd_option_table[i];
    }
    return NULL;
}

static prism_status options_init(prismd_options *opts, prism_error *err)
{
    memset(opts, 0, sizeof *opts);
    for (size_t i = 0; i < PRISMD_OPTION_COUNT; i++) {
        const prismd_option *o = &prismd_option_table[i];
        if (!o->default_value)
            continue;
        prism_status st = o->set(opts, o->default_value, err);
        if (st != PRISM_OK) {
            prism_error_prefix(err, "--%s default", o->name);
            return st;
        }
    }
    return PRISM_OK;
}

/* Parses --name VALUE, --name=VALUE and -h. On failure err holds one line that names the flag
 * and the value at fault. A separate value may not start with '-' (so a forgotten value is not
 * silently taken from the next flag); --name=-x passes such a value on purpose. */
/* Applies a --service-config file: each key an option's name, each value a string, a number or
 * a boolean; errors name the file and the key. */
static prism_status load_service_config(prismd_options *opts, const char *path, prism_error *err)
{
    size_t len = 0;
    char *text = prism_file_read(path, &len, err);
    if (!text)
        return err->status;
    json_error_t jerr;
    json_t *root = json_loadb(text, len, JSON_REJECT_DUPLICATES, &jerr);
    free(text);
    if (!root)
        return prism_error_set(err, PRISM_ERR_INVALID, "%.200s:%d:%d: JSON syntax error: %s", path, jerr.line,
                               jerr.column, jerr.text);
    prism_status st = PRISM_OK;
    if (!json_is_object(root))
        st = prism_error_set(err, PRISM_ERR_INVALID, "%.200s: expected a JSON object of options", path);
    const char *key;
    json_t *value;
    json_object_foreach(root, key, value) {
        if (st)
            break;
        const prismd_option *opt = option_find_long(key, strlen(key));
        if (!opt || !opt->arg || opt->set == set_service_config) {
            st = prism_error_set(err, PRISM_ERR_INVALID, "%.200s: %.100s: not an option this file can set", path, key);
            break;
        }
        char buf[64];
        const char *v = NULL;
        if (json_is_string(value))
            v = json_string_value(value);
        else if (json_is_integer(value)) {
            snprintf(buf, sizeof buf, "%lld", (long long)json_integer_value(value));
            v = buf;
        } else if (json_is_boolean(value))
            v = json_is_true(value) ? "true" : "false";
        if (!v) {
            st = prism_error_set(err, PRISM_ERR_INVALID, "%.200s: %.100s: expected a string, an integer or a boolean",
                                 path, key);
            break;
        }
        if ((st = opt->set(opts, v, err)))
            prism_error_prefix(err, "%.200s: %s", path, key);
    }
    json_decref(root);
    return st;
}

static prism_status options_parse(prismd_options *opts, int argc, char **argv, prism_error *err)
{
    /* The service config file first, so that every command-line option wins over it. */
    for (int i = 1; i < argc; i++) {
        const char *path = NULL;
        if (strncmp(argv[i], "--service-config=", 17) == 0)
            path = argv[i] + 17;
        else if (strcmp(argv[i], "--service-config") == 0 && i + 1 < argc)
            path = argv[i + 1];
        prism_status st = path ? load_service_config(opts, path, err) : PRISM_OK;
        if (st) {
            prism_error_prefix(err, "--service-config");
            return st;
        }
    }
    for (int i = 1; i < argc; i++) {
        const char *arg = argv[i];
        const prismd_option *opt = NULL;
        const char *value = NULL;
        size_t name_len = 0;
        if (arg[0] == '-' && arg[1] == '-' && arg[2] != '\0') {
            const char *name = arg + 2;
            const char *eq = strchr(name, '=');
            name_len = eq ? (size_t)(eq - name) : strlen(name);
            opt = option_find_long(name, name_len);
            if (eq)
                value = eq + 1;
            name_len += 2;
        } else if (arg[0] == '-' && arg[1] != '\0' && arg[2] == '\0') {
            opt = option_find_short(arg[1]);
            name_len = 2;
        } else {
            return prism_error_set(err, PRISM_ERR_INVALID,
                                   "unexpected argument \"%.200s\" (see prismd --help)", arg);
        }
        if (!opt)
            return prism_error_set(err, PRISM_ERR_INVALID,
                                   "unknown option \"%.*s\" (see prismd --help)",
                                   (int)(name_len > 200 ? 200 : name_len), arg);
        if (opt->arg && !value) {
            if (i + 1 >= argc || (argv[i + 1][0] == '-' && argv[i + 1][1] != '\0'))
                return prism_error_set(err, PRISM_ERR_INVALID, "--%s: missing value %s",
                                       opt->name, opt->arg);
            value = argv[++i];
        } else if (!opt->arg && value) {
            return prism_error_set(err, PRISM_ERR_INVALID, "--%s takes no value (got \"%.200s\")",
                                   opt->name, value);
        }
        prism_status st = opt->set(opts, value, err);
        if (st != PRISM_OK) {
            prism_error_prefix(err, "--%s", opt->name);
            return st;
        }
    }
    if (!opts->tls_cert != !opts->tls_key)
        return prism_error_set(err, PRISM_ERR_INVALID, "--tls-cert and --tls-key go together (got only --%s)",
                               opts->tls_cert ? "tls-cert" : "tls-key");
    return PRISM_OK;
}

/* ---------------------------------------------------------------------------------------------
 * HTTP routes: one table read by the request handler and by --help. */

typedef struct prismd_server {
    const char *data_dir;
    char lock_path[PATH_MAX];
    int lock_fd;
    char *defaults_json; /* the policy config for new jobs, rendered once at start */
    pthread_mutex_t http_error_lock;
    char http_error[256]; /* first message libmicrohttpd logged, for the start-up error */
    prismd_rest rest;     /* REST /v1 and /metrics, from the policy thread's snapshots */
    prismd_events *events; /* server-sent events */
} prismd_server;

typedef struct prismd_reply {
    unsigned int status;
    char *body; /* owned: from json_dumps or strdup; or, with hold, the snapshot's */
    const char *content_type; /* NULL: application/json */
    prismd_snapshot *hold;    /* released once libmicrohttpd is done with body */
    size_t body_len;          /* 0: strlen(body) */
    bool gzip;                /* body is gzip-compressed */
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

/* Ready while this process still holds the lock on the data directory it was given (the lock
 * file at its path is the one we hold) and the directory is writable. */
/* The policy thread loops at least every 100 ms; 2 s without a loop means it is not serving. */
static bool policy_thread_alive(const prismd_server *srv)
{
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    long long alive = atomic_load(&srv->rest.snapshots->policy_alive_ms);
    long long now_ms = (long long)now.tv_sec * 1000 + now.tv_nsec / 1000000;
    return alive > 0 && now_ms - alive < 2000;
}

static void route_readyz(const prismd_server *srv, prismd_reply *reply)
{
    struct stat held, at_path;
    if (srv->lock_fd < 0 || fstat(srv->lock_fd, &held) != 0)
        reply_error(reply, MHD_HTTP_SERVICE_UNAVAILABLE, "not_ready",
                    "data dir %s: the lock is not held", srv->data_dir);
    else if (stat(srv->lock_path, &at_path) != 0 || at_path.st_dev != held.st_dev ||
             at_path.st_ino != held.st_ino)
        reply_error(reply, MHD_HTTP_SERVICE_UNAVAILABLE, "not_ready",
                    "data dir %s: the lock file %s was removed or replaced", srv->data_dir,
                    srv->lock_path);
    else if (access(srv->data_dir, W_OK) != 0)
        reply_error(reply, MHD_HTTP_SERVICE_UNAVAILABLE, "not_ready",
                    "data dir %s is not writable: %s", srv->data_dir, strerror(errno));
    else if (!policy_thread_alive(srv))
        reply_error(reply, MHD_HTTP_SERVICE_UNAVAILABLE, "not_ready",
                    "the policy thread has not run for over 2 s (starting, or stuck)");
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

/* True when s is valid UTF-8 (JSON answers may quote it). */
static bool utf8_valid(const char *s)
{
    for (const unsigned char *p = (const unsigned char *)s; *p;) {
        int n = *p < 0x80 ? 0 : (*p & 0xe0) == 0xc0 ? 1 : (*p & 0xf0) == 0xe0 ? 2 : (*p & 0xf8) == 0xf0 ? 3 : -1;
        if (n < 0 || (n == 1 && *p < 0xc2))
            return false;
        p++;
        for (int i = 0; i < n; i++, p++)
            if ((*p & 0xc0) != 0x80)
                return false;
    }
    return true;
}

/* A request's body, gathered over the handler's calls. */
typedef struct request_body {
    char *data;
    size_t len;
    bool too_large;
} request_body;

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

static void http_completed(void *cls, struct MHD_Connection *conn, void **req_cls,
                           enum MHD_RequestTerminationCode code)
{
    (void)cls;
    (void)conn;
    (void)code;
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

static void wake_events(void *events)
{
    prismd_events_wake(events);
}

static void release_snapshot(void *snapshot)
{
    prismd_snapshot_release(snapshot);
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

/* libmicrohttpd's access handler. A GET or HEAD is answered on its first call; a request with
 * a body (PATCH, PUT, POST) once the whole body (at most 1 MiB) has arrived. */
static enum MHD_Result http_handle(void *cls, struct MHD_Connection *conn, const char *url,
                                   const char *method, const char *version,
                                   const char *upload_data, size_t *upload_data_size,
                                   void **req_cls)
{
    (void)version;
    prismd_server *srv = cls;
    bool with_body = strcmp(method, MHD_HTTP_METHOD_PATCH) == 0 || strcmp(method, MHD_HTTP_METHOD_PUT) == 0 ||
                     strcmp(method, MHD_HTTP_METHOD_POST) == 0;
    request_body *body = *req_cls;
    if (with_body && !body) {
        body = calloc(1, sizeof *body);
        if (!body)
            return MHD_NO;
        *req_cls = body;
        return MHD_YES;
    }
    if (with_body && *upload_data_size) {
        if (!gather_body(body, upload_data, *upload_data_size))
            return MHD_NO;
        *upload_data_size = 0;
        return MHD_YES;
    }
    *upload_data_size = 0;
    struct timespec started;
    clock_gettime(CLOCK_MONOTONIC, &started);

    size_t url_len = strlen(url);
    char events_job[160] = "";
    if (utf8_valid(url) && strcmp(method, MHD_HTTP_METHOD_GET) == 0 && url_len > 7 &&
        strcmp(url + url_len - 7, "/events") == 0 &&
        prismd_rest_allowed(url)) {
        const char *id = url + strlen("/v1/jobs/");
        snprintf(events_job, sizeof events_job, "%.*s", (int)(url_len - 7 - strlen("/v1/jobs/")), id);
        prismd_snapshot *snap = prismd_snapshots_get(srv->rest.snapshots);
        bool known = snap && prismd_snapshot_find(snap, events_job);
        prismd_snapshot_release(snap);
        if (known) {
            struct MHD_Response *stream = prismd_events_response(srv->events, conn, events_job);
            if (!stream)
                return MHD_NO;
            enum MHD_Result queued = MHD_queue_response(conn, MHD_HTTP_OK, stream);
            MHD_destroy_response(stream);
            return queued;
        }
    }

    bool bad_path = !utf8_valid(url);

    const prismd_route *route = NULL;
    for (size_t i = 0; i < PRISMD_ROUTE_COUNT && !bad_path; i++) {
        if (strcmp(url, prismd_routes[i].path) == 0)
            route = &prismd_routes[i];
    }
    bool readable = strcmp(method, MHD_HTTP_METHOD_GET) == 0 ||
                    strcmp(method, MHD_HTTP_METHOD_HEAD) == 0;
    prismd_reply reply = {0};
    const char *allowed = route ? PRISMD_ALLOWED_METHODS : prismd_rest_allowed(url);
    prismd_answer answer = {.accept_gzip = accepts_gzip(conn)};
    if (bad_path) {
        reply_error(&reply, MHD_HTTP_BAD_REQUEST, "invalid_argument", "the request path is not valid UTF-8");
    } else if (!allowed) {
        reply_error(&reply, MHD_HTTP_NOT_FOUND, "not_found", "no route for %.64s %.256s", method,
                    url);
    } else if (events_job[0]) {
        reply_error(&reply, MHD_HTTP_NOT_FOUND, "not_found", "job %.128s does not exist", events_job);
    } else if (body && body->too_large) {
        reply_error(&reply, MHD_HTTP_CONTENT_TOO_LARGE, "too_large", "the request body is over %u bytes",
                    PRISMD_BODY_MAX);
    } else if (route && readable) {
        route->get(srv, &reply);
    } else if (!route && readable && prismd_rest_get(&srv->rest, url, query_arg, conn, &answer)) {
        reply = (prismd_reply){answer.status, answer.body, answer.content_type, answer.hold, answer.body_len,
                               answer.gzip};
    } else if (!route && body &&
               prismd_rest_mutate(&srv->rest, method, url, bearer(conn), body->data ? body->data : "", body->len,
                                  &answer)) {
        reply = (prismd_reply){answer.status, answer.body, answer.content_type, answer.hold, answer.body_len,
                               answer.gzip};
    } else {
        reply_error(&reply, MHD_HTTP_METHOD_NOT_ALLOWED, "method_not_allowed",
                    "%.64s is not allowed on %.256s (allowed: %s)", method, url, allowed);
    }

    if (prism_log_threshold <= PRISM_LOG_DEBUG) {
        char status[16], client[INET6_ADDRSTRLEN + 16];
        snprintf(status, sizeof status, "%u", reply.status);
        format_client(conn, client, sizeof client);
        prism_log(PRISM_LOG_DEBUG, "request", "method", method, "path", url, "status", status,
                  "client", client, LOG_END);
    }
    if (!reply.body) {
        prism_log(PRISM_LOG_ERROR, "cannot build response: out of memory", "path", url, LOG_END);
        return MHD_NO;
    }
    struct MHD_Response *resp;
    size_t body_len = reply.body_len ? reply.body_len : strlen(reply.body);
    if (reply.hold) {
        resp = MHD_create_response_from_buffer_with_free_callback_cls(body_len, reply.body, release_snapshot,
                                                                      reply.hold);
        if (!resp)
            prismd_snapshot_release(reply.hold);
    } else {
        resp = MHD_create_response_from_buffer(body_len, reply.body, MHD_RESPMEM_MUST_COPY);
        free(reply.body);
    }
    if (!resp)
        return MHD_NO;
    enum MHD_Result ok = MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE,
                                                 reply.content_type ? reply.content_type : "application/json");
    if (ok == MHD_YES && reply.gzip)
        ok = MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_ENCODING, "gzip");
    if (ok == MHD_YES && reply.hold)
        ok = MHD_add_response_header(resp, MHD_HTTP_HEADER_VARY, "Accept-Encoding");
    if (ok == MHD_YES && reply.status == MHD_HTTP_METHOD_NOT_ALLOWED)
        ok = MHD_add_response_header(resp, MHD_HTTP_HEADER_ALLOW, allowed ? allowed : PRISMD_ALLOWED_METHODS);
    if (ok == MHD_YES)
        ok = MHD_queue_response(conn, reply.status, resp);
    MHD_destroy_response(resp);
    struct timespec done;
    clock_gettime(CLOCK_MONOTONIC, &done);
    prismd_http_observe(reply.status, (double)(done.tv_sec - started.tv_sec) +
                                          (double)(done.tv_nsec - started.tv_nsec) / 1e9);
    return ok;
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

/* Binds exactly the address given; dual stack only for an IPv6 address. */
static struct MHD_Daemon *http_start(prismd_server *srv, const prismd_options *opts)
{
    unsigned int flags = MHD_USE_AUTO_INTERNAL_THREAD | MHD_USE_ERROR_LOG | MHD_ALLOW_SUSPEND_RESUME;
    uint16_t port;
    if (opts->http_addr.ss_family == AF_INET6) {
        flags |= MHD_USE_DUAL_STACK;
        port = ntohs(((const struct sockaddr_in6 *)&opts->http_addr)->sin6_port);
    } else {
        port = ntohs(((const struct sockaddr_in *)&opts->http_addr)->sin_port);
    }
    /* The logger goes first so that libmicrohttpd uses it for everything that follows. */
    if (opts->tls_cert)
        return MHD_start_daemon(flags | MHD_USE_TLS, port, NULL, NULL, &http_handle, srv, MHD_OPTION_EXTERNAL_LOGGER,
                                &http_log, srv, MHD_OPTION_HTTPS_MEM_CERT, opts->tls_cert, MHD_OPTION_HTTPS_MEM_KEY,
                                opts->tls_key, MHD_OPTION_SOCK_ADDR, (const struct sockaddr *)&opts->http_addr,
                                MHD_OPTION_THREAD_POOL_SIZE, PRISMD_HTTP_THREADS, MHD_OPTION_CONNECTION_LIMIT,
                                PRISMD_HTTP_CONNECTIONS, MHD_OPTION_CONNECTION_TIMEOUT, PRISMD_HTTP_TIMEOUT_S,
                                MHD_OPTION_NOTIFY_COMPLETED, &http_completed, NULL, MHD_OPTION_END);
    return MHD_start_daemon(flags, port, NULL, NULL, &http_handle, srv, MHD_OPTION_EXTERNAL_LOGGER,
                            &http_log, srv, MHD_OPTION_SOCK_ADDR,
                            (const struct sockaddr *)&opts->http_addr,
                            MHD_OPTION_THREAD_POOL_SIZE, PRISMD_HTTP_THREADS, MHD_OPTION_CONNECTION_LIMIT,
                            PRISMD_HTTP_CONNECTIONS, MHD_OPTION_CONNECTION_TIMEOUT, PRISMD_HTTP_TIMEOUT_S,
                            MHD_OPTION_NOTIFY_COMPLETED,
                            &http_completed, NULL, MHD_OPTION_END);
}

/* ---------------------------------------------------------------------------------------------
 * The data directory and its lock. */

/* mkdir -p: creates every missing component with PRISMD_DATA_DIR_MODE (less the umask) and
 * leaves existing directories as they are. */
static prism_status data_dir_create(const char *dir, prism_error *err)
{
    char path[PATH_MAX];
    if (snprintf(path, sizeof path, "%s", dir) >= (int)sizeof path)
        return prism_error_set(err, PRISM_ERR_INVALID, "the path is too long");
    for (char *p = path + 1;; p++) {
        bool end = *p == '\0';
        if (*p != '/' && !end)
            continue;
        *p = '\0';
        if (mkdir(path, PRISMD_DATA_DIR_MODE) != 0 && errno != EEXIST)
            return prism_error_set(err, PRISM_ERR_IO, "cannot create %s: %s", path,
                                   strerror(errno));
        if (end)
            break;
        *p = '/';
    }
    struct stat st;
    if (stat(dir, &st) != 0)
        return prism_error_set(err, PRISM_ERR_IO, "%s", strerror(errno));
    if (!S_ISDIR(st.st_mode))
        return prism_error_set(err, PRISM_ERR_IO, "it exists and is not a directory");
    return PRISM_OK;
}

/* Takes DATA_DIR/prismd.lock with flock(LOCK_EX | LOCK_NB) and writes our pid into it. The lock
 * lives as long as the descriptor; the file is never removed (removing a lock file races with
 * the next locker). */
static prism_status data_dir_lock(prismd_server *srv, prism_error *err)
{
    int fd = open(srv->lock_path, O_RDWR | O_CREAT | O_CLOEXEC, 0640);
    if (fd < 0)
        return prism_error_set(err, PRISM_ERR_IO, "cannot open %s: %s", srv->lock_path,
                               strerror(errno));
    if (flock(fd, LOCK_EX | LOCK_NB) != 0) {
        int e = errno;
        char holder[32] = "";
        ssize_t n = pread(fd, holder, sizeof holder - 1, 0);
        holder[n > 0 ? n : 0] = '\0';
        holder[strcspn(holder, "\n")] = '\0';
        close(fd);
        if (e == EWOULDBLOCK)
            return prism_error_set(err, PRISM_ERR_STATE,
                                   "data dir %s is in use by another prismd (pid %s holds %s)",
                                   srv->data_dir, holder[0] ? holder : "unknown", srv->lock_path);
        return prism_error_set(err, PRISM_ERR_IO, "cannot lock %s: %s", srv->lock_path,
                               strerror(e));
    }
    char pid[32];
    int len = snprintf(pid, sizeof pid, "%ld\n", (long)getpid());
    if (ftruncate(fd, 0) != 0 || pwrite(fd, pid, (size_t)len, 0) != len) {
        int e = errno;
        close(fd);
        return prism_error_set(err, PRISM_ERR_IO, "cannot write %s: %s", srv->lock_path,
                               strerror(e));
    }
    srv->lock_fd = fd;
    return PRISM_OK;
}

/* ---------------------------------------------------------------------------------------------
 * --help and main. */

static void print_usage(FILE *out)
{
    fprintf(out,
            "Usage: prismd [OPTION]...\n"
            "\n"
            "prismd, the Prism policy service. Agents stream gradient statistics to it over gRPC\n"
            "(prism.v1.PolicyService: Connect, GetBlockMap, Watch); it decides block precisions,\n"
            "keeps every job in a SQLite store under its data directory (locked), pushes maps to\n"
            "every rank and serves the HTTP endpoints below. With no options it listens on\n"
            "loopback and keeps its state in ./prism-data.\n"
            "\n"
            "Options (--name VALUE or --name=VALUE):\n");
    for (size_t i = 0; i < PRISMD_OPTION_COUNT; i++) {
        const prismd_option *o = &prismd_option_table[i];
        char label[64];
        if (o->short_name)
            snprintf(label, sizeof label, "-%c, --%s%s%s", o->short_name, o->name,
                     o->arg ? " " : "", o->arg ? o->arg : "");
        else
            snprintf(label, sizeof label, "    --%s%s%s", o->name, o->arg ? " " : "",
                     o->arg ? o->arg : "");
        char tail[128];
        snprintf(tail, sizeof tail, "(default: %s)", o->default_value ? o->default_value : "");
        prism_help_entry(out, label, o->help, o->default_value ? tail : NULL);
    }
    fprintf(out, "\nHTTP endpoints (JSON; errors as {\"error\":{\"code\",\"message\"}}):\n");
    for (size_t i = 0; i < PRISMD_ROUTE_COUNT; i++) {
        char label[64];
        snprintf(label, sizeof label, "GET %s", prismd_routes[i].path);
        prism_help_entry(out, label, prismd_routes[i].help, NULL);
    }
    static const char *const rest_routes[][2] = {
        {"GET /v1/jobs", "jobs with step, map_version, agents connected, world_size"},
        {"GET /v1/jobs/JOB/blocks", "the block map (precision, scores, last switch, forced) and the last decision's telemetry"},
        {"GET /v1/jobs/JOB/blocks/ID", "one block with its recent switch history"},
        {"GET /v1/jobs/JOB/config", "the job's policy config in force"},
        {"PATCH /v1/jobs/JOB/config", "change config keys (validated in full; applies at the next decision)"},
        {"PUT /v1/jobs/JOB/overrides", "{\"force_bf16_blocks\": [...], \"force_int8_blocks\": [...]} (next decision)"},
        {"GET /v1/jobs/JOB/telemetry", "telemetry records, ?since_step=S&limit=N (default 100, at most 1000)"},
        {"GET /v1/jobs/JOB/events", "server-sent events: one \"map\" event per new map version"},
        {"GET /v1/jobs/JOB/hints", "the runtime hints last sent to the job's agents (null before any)"},
        {"GET /metrics", "Prometheus text exposition (prism_* metrics)"},
    };
    for (size_t i = 0; i < sizeof rest_routes / sizeof rest_routes[0]; i++)
        prism_help_entry(out, rest_routes[i][0], rest_routes[i][1], NULL);
    fprintf(out,
            "\n"
            "Changes need Authorization: Bearer TOKEN (the job's token, or the admin token) when the\n"
            "job has a token or --admin-token-file is given.\n"
            "Files: DIR/prism.db (SQLite, WAL) and DIR/jobs/JOB/TELEMETRY_FILE (JSONL, one record per\n"
            "decision).\n"
            "Logs: logfmt lines on stderr (ts, level, msg, fields).\n"
            "Signals: SIGTERM or SIGINT ends agent streams with UNAVAILABLE, stops the server,\n"
            "releases the lock and exits 0.\n"
            "Exit status: 0 stopped cleanly; 1 data dir, lock or address unavailable;\n"
            "2 bad option or bad --config.\n"
            "\n"
            "Policy config keys (--config):\n");
    prism_config_print_help(out);
}

/* Loads the policy config for new jobs into *cfg and renders it as JSON for /v1/config/defaults. */
static prism_status load_policy_defaults(const prismd_options *opts, prism_config *cfg, char **json_text,
                                         prism_error *err)
{
    prism_status st = opts->config_path ? prism_config_load_file(opts->config_path, cfg, err)
                                        : prism_config_init(cfg, err);
    if (st != PRISM_OK)
        return st;
    json_t *obj = prism_config_to_json(cfg);
    *json_text = obj ? prism_json_dumps_exact(obj, JSON_INDENT(2) | JSON_PRESERVE_ORDER) : NULL;
    json_decref(obj);
    if (!*json_text) {
        prism_config_free(cfg);
        return prism_error_set(err, PRISM_ERR_NOMEM, "cannot render the config as JSON");
    }
    return PRISM_OK;
}

/* Runs the server until SIGTERM or SIGINT; returns the exit status. */
static int prismd_serve(const prismd_options *opts, const prism_config *defaults, char *defaults_json)
{
    prismd_server srv = {.data_dir = opts->data_dir, .lock_fd = -1, .defaults_json = defaults_json};
    pthread_mutex_init(&srv.http_error_lock, NULL);
    snprintf(srv.lock_path, sizeof srv.lock_path, "%s/%s", opts->data_dir, PRISMD_LOCK_NAME);
    prism_error err = {0};
    int status = 1;
    struct MHD_Daemon *daemon = NULL;
    prismd_rpc *rpc = NULL;
    prismd_store *store = NULL, *reader = NULL;
    prismd_snapshots snapshots;
    prismd_snapshots_init(&snapshots);
    prismd_commands commands;
    prismd_commands_init(&commands);

    if (data_dir_create(opts->data_dir, &err) != PRISM_OK) {
        prism_log(PRISM_LOG_ERROR, "cannot create data dir", "data_dir", opts->data_dir, "error",
                  err.message, LOG_END);
        goto out;
    }
    if (data_dir_lock(&srv, &err) != PRISM_OK) {
        prism_log(PRISM_LOG_ERROR, "cannot lock data dir", "data_dir", opts->data_dir, "error",
                  err.message, LOG_END);
        goto out;
    }
    store = prismd_store_open(opts->data_dir, &err);
    if (!store) {
        prism_log(PRISM_LOG_ERROR, "cannot open the store", "data_dir", opts->data_dir, "error", err.message,
                   LOG_END);
        goto out;
    }
    reader = prismd_store_open_reader(opts->data_dir, &err);
    if (!reader) {
        prism_log(PRISM_LOG_ERROR, "cannot open the store", "data_dir", opts->data_dir, "error", err.message,
                   LOG_END);
        goto out;
    }
    srv.rest.snapshots = &snapshots;
    srv.events = prismd_events_create(&snapshots);
    if (!srv.events)
        goto out;
    snapshots.on_publish = wake_events;
    snapshots.on_publish_ctx = srv.events;
    srv.rest.reader = reader;
    srv.rest.commands = &commands;
    srv.rest.data_dir = opts->data_dir;
    srv.rest.admin_token = opts->admin_token;
    daemon = http_start(&srv, opts);
    if (!daemon) {
        pthread_mutex_lock(&srv.http_error_lock);
        char reason[sizeof srv.http_error];
        snprintf(reason, sizeof reason, "%s",
                 srv.http_error[0] ? srv.http_error : "libmicrohttpd could not start");
        pthread_mutex_unlock(&srv.http_error_lock);
        prism_log(PRISM_LOG_ERROR, "cannot listen", "http", opts->http_text, "error", reason,
                  LOG_END);
        goto out;
    }
    prismd_rpc_options rpc_opts = {
        .store = store,
        .snapshots = &snapshots,
        .tls_cert = opts->tls_cert,
        .tls_key = opts->tls_key,
        .listen = opts->grpc_text,
        .max_message_bytes = opts->max_message_bytes,
        .stream_buffer_bytes = opts->stream_buffer_bytes,
        .limits = {.max_jobs = opts->max_jobs,
                   .max_blocks = opts->max_blocks,
                   .auto_create = opts->auto_create,
                   .admin_token = opts->admin_token,
                   .data_dir = opts->data_dir,
                   .hints = opts->hints},
        .commands = &commands,
    };
    rpc = prismd_rpc_start(&rpc_opts, defaults, &err);
    if (!rpc) {
        prism_log(PRISM_LOG_ERROR, "cannot listen", "grpc", opts->grpc_text, "error", err.message, LOG_END);
        goto out;
    }
    prism_log(PRISM_LOG_INFO, "listening", "grpc", opts->grpc_text, "http", opts->http_text, "data_dir",
               opts->data_dir, "tls", opts->tls_cert ? "on" : "off", LOG_END);

    sigset_t stop;
    sigemptyset(&stop);
    sigaddset(&stop, SIGTERM);
    sigaddset(&stop, SIGINT);
    /* Every few seconds the event streams are woken for their keep-alives. */
    int sig = -1;
    while (sig != SIGTERM && sig != SIGINT) {
        struct timespec every = {5, 0};
        sig = sigtimedwait(&stop, NULL, &every);
        prismd_events_wake(srv.events);
    }
    prism_log(PRISM_LOG_INFO, "stopping", "signal", sig == SIGTERM ? "SIGTERM" : "SIGINT", LOG_END);
    status = 0;

out:
    prismd_rpc_stop(rpc);
    snapshots.on_publish = NULL;
    prismd_events_close(srv.events);
    if (daemon)
        MHD_stop_daemon(daemon);
    prismd_events_destroy(srv.events);
    prismd_store_close(reader);
    prismd_store_close(store);
    prismd_snapshots_destroy(&snapshots);
    prismd_commands_close(&commands);
    prismd_commands_destroy(&commands);
    if (srv.lock_fd >= 0)
        close(srv.lock_fd);
    pthread_mutex_destroy(&srv.http_error_lock);
    if (status == 0)
        prism_log(PRISM_LOG_INFO, "stopped", "data_dir", opts->data_dir, LOG_END);
    return status;
}

int main(int argc, char **argv)
{
    prismd_options opts;
    prism_error err = {0};
    if (options_init(&opts, &err) != PRISM_OK || options_parse(&opts, argc, argv, &err) != PRISM_OK) {
        fprintf(stderr, "prismd: %s\n", err.message);
        return 2;
    }
    if (opts.help) {
        print_usage(stdout);
        return 0;
    }
    if (opts.version) {
        printf("prismd %s\n", PRISM_VERSION);
        return 0;
    }
    prism_log_threshold = opts.log_level;

    /* Stop signals are blocked before any thread exists, so every thread inherits the mask and
     * only the main thread's sigwait() receives them; a signal during start-up waits there. */
    sigset_t stop;
    sigemptyset(&stop);
    sigaddset(&stop, SIGTERM);
    sigaddset(&stop, SIGINT);
    pthread_sigmask(SIG_BLOCK, &stop, NULL);
    signal(SIGPIPE, SIG_IGN);

    char *defaults_json = NULL;
    prism_config defaults;
    prism_status st = load_policy_defaults(&opts, &defaults, &defaults_json, &err);
    if (st != PRISM_OK) {
        bool config_fault = opts.config_path && st != PRISM_ERR_NOMEM;
        fprintf(stderr, "prismd: %s%s\n", config_fault ? "--config: " : "", err.message);
        return config_fault ? 2 : 1;
    }
    char pid[32];
    snprintf(pid, sizeof pid, "%ld", (long)getpid());
    prism_log(PRISM_LOG_INFO, "starting", "version", PRISM_VERSION, "pid", pid, "config",
              opts.config_path ? opts.config_path : "built-in defaults", LOG_END);
    int status = prismd_serve(&opts, &defaults, defaults_json);
    free(defaults_json);
    prism_config_free(&defaults);
    free(opts.admin_token);
    free(opts.tls_cert);
    free(opts.tls_key);
    return status;
}
