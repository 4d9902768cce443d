/* prismd: the Prism policy service (DESIGN 1, 5, 6, 7).
 *
 * It validates the default policy configuration for new jobs (--config, through the policy
 * core), creates its data directory and holds an exclusive lock on it so that two prismd never
 * share one, serves prism.v1.PolicyService over gRPC (rpc.c: Connect, GetBlockMap, Watch, driven
 * by the policy thread that owns every job, jobs.c), and serves HTTP (http.c: libmicrohttpd,
 * /healthz, /readyz, /v1/config/defaults, REST and /metrics through rest.c, events through
 * events.c).
 * Logs are logfmt lines on stderr (common/log.c). SIGTERM or SIGINT ends every stream with UNAVAILABLE
 * and stops cleanly with exit status 0.
 *
 * Threads: the main thread parses, starts and then waits in sigwait(); the policy thread drives
 * the gRPC completion queue; libmicrohttpd's threads answer requests (http.c) from a server
 * struct that is immutable once the daemon has started.
 *
 * Exit status: 0 after a clean stop (and for --help, --version), 1 when the data directory, its
 * lock or a listening address cannot be had, 2 for a bad option or a bad --config. */
#define _GNU_SOURCE

#include "auth.h"
#include "config.h"
#include "help.h"
#include "log.h"
#include "net.h"
#include "prism/common.h"
#include "events.h"
#include "http.h"
#include "mem_limits.h"
#include "rest.h"
#include "rpc.h"
#include "store.h"

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <limits.h>
#include <netinet/in.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <time.h>
#include <unistd.h>

#include <microhttpd.h>


#define PRISMD_LOCK_NAME "prismd.lock"
#define PRISMD_DATA_DIR_MODE 0750

/* ---------------------------------------------------------------------------------------------
 * Options: one table (name, argument, default, help) read by the parser, the defaults and --help.
 * A default is applied through the same setter as a command-line value, so it is written once. */

typedef struct prismd_options {
    struct sockaddr_storage http_addr;
    socklen_t http_addr_len;
    char http_text[INET6_ADDRSTRLEN + 16]; /* canonical "a.b.c.d:port" or "[v6]:port" */
    char grpc_text[INET6_ADDRSTRLEN + 16];
    prismd_http_limits http; /* --http-max-*, --http-*-timeout, --health-max-connections */
    struct sockaddr_storage health_addr; /* --health-listen; health_text "" when none */
    socklen_t health_addr_len;
    char health_text[INET6_ADDRSTRLEN + 16];
    size_t max_message_bytes;
    size_t stream_buffer_bytes;
    size_t max_jobs;
    size_t max_blocks;
    size_t hybrid_max_pairs, hybrid_max_classes;
    bool auto_create;
    prismd_memory_limits mem; /* issue 12 item 5: what one client may make prismd hold */
    prismd_hints hints;
    char *admin_token; /* read from --admin-token-file */
    const char *job_tokens_dir;  /* --job-tokens-dir: one file per job */
    const char *job_tokens_file; /* --job-tokens-file: {"JOB": "TOKEN"} */
    int64_t job_tokens_reload_ms; /* re-read the tokens this often (0: on SIGHUP only) */
    bool require_provisioned_tokens;
    bool require_read_token;
    int64_t job_idle_expiry_ms;  /* 0: never */
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

/* ---- HTTP limits (issue 12): each a bound on what one client can hold. ---- */

static prism_status set_http_max_connections(prismd_options *opts, const char *value, prism_error *err)
{
    return set_size(&opts->http.max_connections, value, 2, 65536, err);
}

static prism_status set_http_per_address(prismd_options *opts, const char *value, prism_error *err)
{
    return set_size(&opts->http.per_address, value, 0, 65536, err);
}

static prism_status set_http_request_timeout(prismd_options *opts, const char *value, prism_error *err)
{
    return set_size(&opts->http.request_timeout_s, value, 0, 3600, err);
}

static prism_status set_http_idle_timeout(prismd_options *opts, const char *value, prism_error *err)
{
    return set_size(&opts->http.idle_timeout_s, value, 1, 3600, err);
}

static prism_status set_http_max_url_bytes(prismd_options *opts, const char *value, prism_error *err)
{
    return set_size(&opts->http.max_url_bytes, value, 256, 32768, err);
}

static prism_status set_http_max_header_bytes(prismd_options *opts, const char *value, prism_error *err)
{
    return set_size(&opts->http.max_header_bytes, value, 1024, 65536, err);
}

static prism_status set_http_max_event_streams(prismd_options *opts, const char *value, prism_error *err)
{
    return set_size(&opts->http.max_event_streams, value, 1, 65536, err);
}

static prism_status set_http_max_event_streams_per_job(prismd_options *opts, const char *value, prism_error *err)
{
    return set_size(&opts->http.max_event_streams_per_job, value, 1, 65536, err);
}

static prism_status set_health_max_connections(prismd_options *opts, const char *value, prism_error *err)
{
    return set_size(&opts->http.health_max_connections, value, 1, 1024, err);
}

static prism_status set_health_per_address(prismd_options *opts, const char *value, prism_error *err)
{
    return set_size(&opts->http.health_per_address, value, 0, 1024, err);
}

static prism_status set_health_listen(prismd_options *opts, const char *value, prism_error *err)
{
    if (!value[0]) {
        opts->health_text[0] = '\0';
        return PRISM_OK;
    }
    return prism_parse_listen(value, &opts->health_addr, &opts->health_addr_len, opts->health_text,
                              sizeof opts->health_text, err);
}

/* The limits against each other: one address, and the event streams, below the whole. */
static prism_status check_http_limits(const prismd_http_limits *l, prism_error *err)
{
    if (l->per_address >= l->max_connections)
        return prism_error_set(err, PRISM_ERR_INVALID,
                               "--http-max-connections-per-address (%zu) must be below --http-max-connections (%zu)",
                               l->per_address, l->max_connections);
    if (l->max_event_streams >= l->max_connections)
        return prism_error_set(err, PRISM_ERR_INVALID,
                               "--http-max-event-streams (%zu) must be below --http-max-connections (%zu)",
                               l->max_event_streams, l->max_connections);
    if (l->health_per_address >= l->health_max_connections)
        return prism_error_set(err, PRISM_ERR_INVALID,
                               "--health-max-connections-per-address (%zu) must be below --health-max-connections (%zu)",
                               l->health_per_address, l->health_max_connections);
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

static prism_status set_hybrid_max_pairs(prismd_options *opts, const char *value, prism_error *err)
{
    return set_size(&opts->hybrid_max_pairs, value, 1, 1u << 24, err);
}

static prism_status set_hybrid_max_classes(prismd_options *opts, const char *value, prism_error *err)
{
    return set_size(&opts->hybrid_max_classes, value, 2, 4096, err);
}

/* The memory and disk limits of mem_limits.h. */
static prism_status set_total_stream_buffer_bytes(prismd_options *opts, const char *value, prism_error *err)
{
    return set_size(&opts->mem.total_stream_buffer_bytes, value, 0, 1ull << 40, err);
}

static prism_status set_max_auto_jobs_per_peer(prismd_options *opts, const char *value, prism_error *err)
{
    return set_size(&opts->mem.max_auto_jobs_per_peer, value, 0, 1000000, err);
}

static prism_status set_telemetry_max_bytes(prismd_options *opts, const char *value, prism_error *err)
{
    return set_size(&opts->mem.telemetry_max_bytes, value, 0, 1ull << 40, err);
}

static prism_status set_telemetry_keep(prismd_options *opts, const char *value, prism_error *err)
{
    return set_size(&opts->mem.telemetry_keep, value, 0, 100, err);
}

static prism_status set_trace_max_bytes(prismd_options *opts, const char *value, prism_error *err)
{
    return set_size(&opts->mem.trace_max_bytes, value, 0, 1ull << 40, err);
}

static prism_status set_trace_segment_bytes(prismd_options *opts, const char *value, prism_error *err)
{
    return set_size(&opts->mem.trace_segment_bytes, value, 4096, 1ull << 40, err);
}

static prism_status set_telemetry_answer_bytes(prismd_options *opts, const char *value, prism_error *err)
{
    return set_size(&opts->mem.telemetry_answer_bytes, value, 1024, 1ull << 40, err);
}

static prism_status set_max_streamed_answers(prismd_options *opts, const char *value, prism_error *err)
{
    return set_size(&opts->mem.max_streamed_answers, value, 1, 100000, err);
}

static prism_status set_max_metrics_streams(prismd_options *opts, const char *value, prism_error *err)
{
    return set_size(&opts->mem.max_metrics_streams, value, 1, 1000, err);
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

/* A duration: an integer with a unit, ms, s, m, h or d ("500ms", "7d"); "0" alone is zero. */
static prism_status set_duration(int64_t *out, const char *value, prism_error *err)
{
    static const struct {
        const char *unit;
        int64_t ms;
    } units[] = {{"ms", 1}, {"s", 1000}, {"m", 60000}, {"h", 3600000}, {"d", 86400000}};
    char *end = NULL;
    errno = 0;
    unsigned long long x = strtoull(value, &end, 10);
    bool digits = value[0] >= '0' && value[0] <= '9';
    if (digits && !errno && *end == '\0' && x == 0) {
        *out = 0;
        return PRISM_OK;
    }
    for (size_t i = 0; digits && !errno && i < sizeof units / sizeof units[0]; i++) {
        if (strcmp(end, units[i].unit) == 0 && x <= (unsigned long long)(INT64_MAX / units[i].ms) &&
            x * (unsigned long long)units[i].ms <= 100ull * 365 * 86400000) {
            *out = (int64_t)x * units[i].ms;
            return PRISM_OK;
        }
    }
    return prism_error_set(err, PRISM_ERR_INVALID,
                           "\"%.200s\" is not a duration (an integer and ms, s, m, h or d, at most 100 years; or 0)",
                           value);
}

static prism_status set_job_idle_expiry(prismd_options *opts, const char *value, prism_error *err)
{
    return set_duration(&opts->job_idle_expiry_ms, value, err);
}

static prism_status set_job_tokens_reload(prismd_options *opts, const char *value, prism_error *err)
{
    return set_duration(&opts->job_tokens_reload_ms, value, err);
}

static prism_status set_job_tokens_dir(prismd_options *opts, const char *value, prism_error *err)
{
    if (!*value)
        return prism_error_set(err, PRISM_ERR_INVALID, "the directory name is empty");
    opts->job_tokens_dir = value;
    return PRISM_OK;
}

static prism_status set_job_tokens_file(prismd_options *opts, const char *value, prism_error *err)
{
    if (!*value)
        return prism_error_set(err, PRISM_ERR_INVALID, "the file name is empty");
    opts->job_tokens_file = value;
    return PRISM_OK;
}

static prism_status set_require_provisioned_tokens(prismd_options *opts, const char *value, prism_error *err)
{
    (void)value;
    (void)err;
    opts->require_provisioned_tokens = true;
    return PRISM_OK;
}

static prism_status set_require_read_token(prismd_options *opts, const char *value, prism_error *err)
{
    (void)value;
    (void)err;
    opts->require_read_token = true;
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
     "distinct block ids per job at most; a report or layout with more is refused (a block costs ~800 bytes "
     "of memory with its statistics and ~140 bytes per telemetry record: 100,000 blocks ~80 MB, 14 MB a decision)"},
    {"hybrid-max-pairs", 0, "N", "4096", set_hybrid_max_pairs,
     "(device class, block) pairs of non-fixed classes a job's hybrid plan may have; more is refused (status "
     "refused, the plan in force stays): planning runs on the single policy thread and costs O(pairs x blocks) "
     "(10,000 blocks x 2 classes: ~0.64 s; 40,000 blocks: ~11.5 s, stalling every job's decisions)"},
    {"hybrid-max-classes", 0, "N", "16", set_hybrid_max_classes,
     "distinct device classes a job's hybrid plan may have; more is refused (status refused), and so are "
     "classes x blocks above --hybrid-max-classes x --hybrid-max-pairs (checked before planning allocates)"},
    /* What one client may make prismd hold (memory, disk): issue 12 item 5, mem_limits.h. */
    {"total-stream-buffer-bytes", 0, "N", "268435456", set_total_stream_buffer_bytes,
     "unsent bytes all gRPC calls together may hold (stream queues, GetBlockMap answers not taken; 0: no cap); "
     "past it the call holding the most is cut off with RESOURCE_EXHAUSTED (4 streams at --stream-buffer-bytes; "
     "a stream that reads holds about one update, shared by all streams of a job)"},
    {"max-auto-jobs-per-peer", 0, "N", "16", set_max_auto_jobs_per_peer,
     "jobs one client address (port aside) may auto-create among those held (0: no limit); one more is "
     "refused with RESOURCE_EXHAUSTED"},
    {"telemetry-max-bytes", 0, "N", "67108864", set_telemetry_max_bytes,
     "a job's telemetry file is rotated to FILE.1 when the next record would take it past N bytes (0: never); "
     "disk per job is at most (--telemetry-keep + 1) x N, a record larger than N alone in its file"},
    {"telemetry-keep", 0, "N", "3", set_telemetry_keep,
     "rotated telemetry files kept per job (0 to 100), the oldest deleted; GET .../telemetry reads them all"},
    {"trace-max-bytes", 0, "N", "268435456", set_trace_max_bytes,
     "disk a job's binary trace (DATA_DIR/jobs/JOB/trace/NNNNNN.ptrace: its merged steps, layout, calibration "
     "and config changes, for `prismctl replay`) may take, all its segments together (0: no traces); past it "
     "the oldest segments are deleted (prism_trace_segments_dropped_total)"},
    {"trace-segment-bytes", 0, "N", "16777216", set_trace_segment_bytes,
     "a job's trace starts a new segment when the next record would take the current one past N bytes "
     "(at least 4096; a record larger than N gets a segment of its own); each segment begins with the "
     "layout, calibration and config in force, so it replays on its own"},
    {"telemetry-answer-bytes", 0, "N", "16777216", set_telemetry_answer_bytes,
     "record bytes one GET .../telemetry returns at most (it always holds one whole record); a cut answer "
     "ends with \"truncated\":true and \"next_since_step\""},
    {"max-streamed-answers", 0, "N", "16", set_max_streamed_answers,
     "answers streamed at once (telemetry; block maps of over 4096 blocks, each holding its snapshot); each "
     "holds 128 KiB besides; one more gets 503"},
    {"max-metrics-streams", 0, "N", "8", set_max_metrics_streams,
     "/metrics answers streamed at once when the jobs hold over 4096 blocks (each holding its snapshot), apart "
     "from --max-streamed-answers so that REST clients cannot keep monitoring out; one more gets 503 and "
     "Prometheus scrapes again at its next interval"},
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
     "file holding the admin bearer token: it reads and changes every job (REST and gRPC) and alone "
     "deletes jobs; without it a job's changes need the job's token when it has one"},
    {"job-tokens-dir", 0, "DIR", NULL, set_job_tokens_dir,
     "provisioned job tokens, one file per job (name: the job id, content: its token), as a Kubernetes "
     "Secret volume mounts them (names starting with '.', such as ..data, are skipped); a provisioned "
     "token wins over the one a job's first Hello brought"},
    {"job-tokens-file", 0, "FILE", NULL, set_job_tokens_file,
     "provisioned job tokens as a JSON object {\"JOB\": \"TOKEN\", ...}; with --job-tokens-dir, a job in "
     "both must have the same token"},
    {"job-tokens-reload", 0, "DURATION", "60s", set_job_tokens_reload,
     "re-read --job-tokens-dir and --job-tokens-file this often (they are also re-read on SIGHUP); 0: on "
     "SIGHUP only. A load that fails keeps the tokens in force and is logged and counted"},
    {"require-provisioned-tokens", 0, NULL, NULL, set_require_provisioned_tokens,
     "a Hello for a job without a provisioned token is refused as a wrong token is (PERMISSION_DENIED; "
     "UNAUTHENTICATED without a token): no trust on first use; needs --job-tokens-dir or --job-tokens-file"},
    {"require-read-token", 0, NULL, NULL, set_require_read_token,
     "reads of a job (REST GETs and events, GetBlockMap, Watch) need the job's or the admin token; "
     "/healthz, /readyz, /metrics and /v1/config/defaults stay open"},
    {"job-idle-expiry", 0, "DURATION", "7d", set_job_idle_expiry,
     "a job with no agent connected and no agent message for longer is deleted as DELETE does "
     "(also counted across restarts); units ms, s, m, h, d; 0: never"},
    {"tls-cert", 0, "FILE", NULL, set_tls_cert,
     "PEM certificate (chain); with --tls-key, gRPC and HTTP both serve TLS only"},
    {"tls-key", 0, "FILE", NULL, set_tls_key, "PEM private key of --tls-cert"},
    {"http-max-connections", 0, "N", "1024", set_http_max_connections,
     "open HTTP connections at most (event streams included); more are closed at once "
     "(prism_http_refused_total{reason=\"max_connections\"})"},
    {"http-max-connections-per-address", 0, "N", "64", set_http_per_address,
     "open HTTP connections of one client address at most (0: no limit); more are closed at once "
     "and counted in prism_http_refused_total{reason=\"per_address\"}"},
    {"http-request-timeout", 0, "SECONDS", "10", set_http_request_timeout,
     "a connection must deliver a whole request (headers and body) within this time from its "
     "accept (when kept alive: from --http-idle-timeout after its previous answer), however "
     "slowly it sends, else it is closed (reason=\"request_deadline\"); 0: no deadline"},
    {"http-idle-timeout", 0, "SECONDS", "30", set_http_idle_timeout,
     "an HTTP connection silent this long is closed (event streams send a keep-alive every 10 s)"},
    {"http-max-url-bytes", 0, "N", "8192", set_http_max_url_bytes,
     "longest request target (path and query); longer ones get 414 uri_too_long"},
    {"http-max-header-bytes", 0, "N", "16384", set_http_max_header_bytes,
     "largest request headers in all; larger ones get 431 headers_too_large"},
    {"http-max-event-streams", 0, "N", "256", set_http_max_event_streams,
     "open GET /v1/jobs/JOB/events streams at most (below --http-max-connections); one more gets "
     "503 with Retry-After (reason=\"event_streams\")"},
    {"http-max-event-streams-per-job", 0, "N", "32", set_http_max_event_streams_per_job,
     "open event streams of one job at most; one more gets 503 with Retry-After "
     "(reason=\"event_streams_per_job\")"},
    {"health-listen", 0, "ADDR:PORT", NULL, set_health_listen,
     "a second HTTP listener serving only GET /healthz and /readyz, with its own connections and "
     "thread, for liveness and readiness probes that the main listener's load cannot starve "
     "(without it: none)"},
    {"health-max-connections", 0, "N", "16", set_health_max_connections,
     "open connections of the health listener at most"},
    {"health-max-connections-per-address", 0, "N", "4", set_health_per_address,
     "open connections of one client address on the health listener at most (0: no limit); more "
     "are closed at once (prism_http_refused_total{listener=\"health\",reason=\"per_address\"})"},
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
     "JSON object of these options by name, e.g. {\"grpc-listen\": \"0.0.0.0:50051\", \"max-jobs\": 50, "
     "\"require-read-token\": true} (a flag takes true or false); "
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
        if (!opt || opt->set == set_service_config || opt->set == set_help || opt->set == set_version) {
            st = prism_error_set(err, PRISM_ERR_INVALID, "%.200s: %.100s: not an option this file can set", path, key);
            break;
        }
        if (!opt->arg) { /* a flag: true sets it, false leaves it off */
            if (!json_is_boolean(value)) {
                st = prism_error_set(err, PRISM_ERR_INVALID, "%.200s: %.100s: expected true or false", path, key);
                break;
            }
            if (json_is_true(value) && (st = opt->set(opts, "", err)))
                prism_error_prefix(err, "%.200s: %s", path, key);
            continue;
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
    if (opts->require_provisioned_tokens && !opts->job_tokens_dir && !opts->job_tokens_file)
        return prism_error_set(err, PRISM_ERR_INVALID,
                               "--require-provisioned-tokens needs --job-tokens-dir or --job-tokens-file");
    if (!opts->tls_cert != !opts->tls_key)
        return prism_error_set(err, PRISM_ERR_INVALID, "--tls-cert and --tls-key go together (got only --%s)",
                               opts->tls_cert ? "tls-cert" : "tls-key");
    return check_http_limits(&opts->http, err);
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
    prismd_http_print_help(out);
    fprintf(out,
            "\n"
            "Auth, one rule for REST and gRPC: a job's token reads and changes that job; the admin\n"
            "token reads and changes every job and alone deletes jobs; reads need no token unless\n"
            "--require-read-token. Changes need Authorization: Bearer TOKEN (gRPC: authorization\n"
            "metadata) when the job has a token or --admin-token-file is given. A token that is sent\n"
            "and opens nothing is refused (401 without a token, 403 with a wrong one; gRPC\n"
            "UNAUTHENTICATED, PERMISSION_DENIED). A second agent for a taken rank replaces the first,\n"
            "which ends with ABORTED.\n"
            "Files: DIR/prism.db (SQLite, WAL) and DIR/jobs/JOB/TELEMETRY_FILE (JSONL, one record per\n"
            "decision).\n"
            "Logs: logfmt lines on stderr (ts, level, msg, fields).\n"
            "Signals: SIGTERM or SIGINT ends agent streams with UNAVAILABLE, stops the server,\n"
            "releases the lock and exits 0. SIGHUP re-reads the provisioned job tokens.\n"
            "Exit status: 0 stopped cleanly; 1 data dir, lock or address unavailable;\n"
            "2 bad option or bad --config.\n"
            "\n"
            "Policy config keys (--config):\n");
    prism_config_print_help(out);
}

static void wake_events(void *events)
{
    prismd_events_wake(events);
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

/* Re-reads the provisioned job tokens into box (SIGHUP, --job-tokens-reload); a load that fails
 * keeps the tokens in force, and is logged and counted. */
static void reload_tokens(const prismd_options *opts, prismd_token_box *box, bool on_signal)
{
    prism_error err = {0};
    prismd_tokens *t = prismd_tokens_load(opts->job_tokens_dir, opts->job_tokens_file, &err);
    if (!t) {
        atomic_fetch_add(&box->loads_failed, 1);
        prism_log(PRISM_LOG_ERROR, "cannot reload the job tokens; the ones in force stay", "error", err.message,
                  LOG_END);
        return;
    }
    atomic_fetch_add(&box->loads_ok, 1);
    char count[24];
    snprintf(count, sizeof count, "%zu", prismd_tokens_count(t));
    prism_log(on_signal ? PRISM_LOG_INFO : PRISM_LOG_DEBUG, "job tokens loaded", "tokens", count, "on",
              on_signal ? "SIGHUP" : "timer", LOG_END);
    prismd_token_box_put(box, t);
}

static int64_t monotonic_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* Each job holds two files open (its telemetry JSONL and its trace segment) besides the streams'
 * sockets, so a thousand jobs pass the usual soft limit of 1024 descriptors. The soft limit is
 * raised to the hard one (what an unprivileged process may do); a failure is only logged. */
static void raise_open_file_limit(void)
{
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) != 0 || rl.rlim_cur >= rl.rlim_max)
        return;
    rlim_t was = rl.rlim_cur;
    rl.rlim_cur = rl.rlim_max;
    char from[24], to[24];
    snprintf(from, sizeof from, "%llu", (unsigned long long)was);
    snprintf(to, sizeof to, "%llu", (unsigned long long)rl.rlim_max);
    if (setrlimit(RLIMIT_NOFILE, &rl) != 0)
        prism_log(PRISM_LOG_WARN, "cannot raise the open-file limit", "soft", from, "hard", to, "error",
                  strerror(errno), LOG_END);
    else
        prism_log(PRISM_LOG_DEBUG, "open-file limit raised", "from", from, "to", to, LOG_END);
}

/* Runs the server until SIGTERM or SIGINT; returns the exit status. tokens: the provisioned job
 * tokens (already holding the first load), or NULL when none are configured. */
static int prismd_serve(const prismd_options *opts, const prism_config *defaults, char *defaults_json,
                        prismd_token_box *tokens)
{
    prismd_server srv = {.data_dir = opts->data_dir, .lock_fd = -1, .defaults_json = defaults_json};
    raise_open_file_limit();
    pthread_mutex_init(&srv.http_error_lock, NULL);
    snprintf(srv.lock_path, sizeof srv.lock_path, "%s/%s", opts->data_dir, PRISMD_LOCK_NAME);
    prism_error err = {0};
    int status = 1;
    prismd_http *daemon = NULL, *health = NULL;
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
    srv.limits = opts->http;
    prismd_events_set_limits(srv.events, opts->http.max_event_streams, opts->http.max_event_streams_per_job);
    snapshots.on_publish = wake_events;
    snapshots.on_publish_ctx = srv.events;
    srv.rest.reader = reader;
    srv.rest.commands = &commands;
    srv.rest.data_dir = opts->data_dir;
    srv.rest.admin_token = opts->admin_token;
    srv.rest.require_read_token = opts->require_read_token;
    srv.rest.mem = &opts->mem;
    srv.rest.ready = prismd_http_ready;
    srv.rest.ready_ctx = &srv;
    daemon = prismd_http_start(&srv, &opts->http_addr, opts->tls_cert, opts->tls_key, &err);
    if (!daemon) {
        prism_log(PRISM_LOG_ERROR, "cannot listen", "http", opts->http_text, "error", err.message,
                  LOG_END);
        goto out;
    }
    if (opts->health_text[0]) {
        pthread_mutex_lock(&srv.http_error_lock);
        srv.http_error[0] = '\0';
        pthread_mutex_unlock(&srv.http_error_lock);
        health = prismd_http_start_health(&srv, &opts->health_addr, opts->tls_cert, opts->tls_key, &err);
        if (!health) {
            prism_log(PRISM_LOG_ERROR, "cannot listen", "health", opts->health_text, "error", err.message, LOG_END);
            goto out;
        }
    }
    prismd_rpc_options rpc_opts = {
        .store = store,
        .snapshots = &snapshots,
        .tls_cert = opts->tls_cert,
        .tls_key = opts->tls_key,
        .listen = opts->grpc_text,
        .max_message_bytes = opts->max_message_bytes,
        .stream_buffer_bytes = opts->stream_buffer_bytes,
        .total_stream_buffer_bytes = opts->mem.total_stream_buffer_bytes,
        .limits = {.max_jobs = opts->max_jobs,
                   .max_blocks = opts->max_blocks,
                   .hybrid_max_pairs = opts->hybrid_max_pairs,
                   .hybrid_max_classes = opts->hybrid_max_classes,
                   .auto_create = opts->auto_create,
                   .admin_token = opts->admin_token,
                   .data_dir = opts->data_dir,
                   .hints = opts->hints,
                   .require_read_token = opts->require_read_token,
                   .tokens = tokens,
                   .require_provisioned_tokens = opts->require_provisioned_tokens,
                   .idle_expiry_ms = opts->job_idle_expiry_ms,
                   .mem = &opts->mem},
        .commands = &commands,
    };
    rpc = prismd_rpc_start(&rpc_opts, defaults, &err);
    if (!rpc) {
        prism_log(PRISM_LOG_ERROR, "cannot listen", "grpc", opts->grpc_text, "error", err.message, LOG_END);
        goto out;
    }
    prism_log(PRISM_LOG_INFO, "listening", "grpc", opts->grpc_text, "http", opts->http_text, "data_dir",
               opts->data_dir, "tls", opts->tls_cert ? "on" : "off", LOG_END);
    if (health)
        prism_log(PRISM_LOG_INFO, "listening for probes", "health", opts->health_text, LOG_END);

    sigset_t stop;
    sigemptyset(&stop);
    sigaddset(&stop, SIGTERM);
    sigaddset(&stop, SIGINT);
    sigaddset(&stop, SIGHUP);
    /* Every few seconds the event streams are woken for their keep-alives (and the job tokens
     * re-read when it is time). */
    int sig = -1;
    int64_t next_reload = monotonic_ms() + opts->job_tokens_reload_ms;
    while (sig != SIGTERM && sig != SIGINT) {
        struct timespec every = {5, 0};
        sig = sigtimedwait(&stop, NULL, &every);
        bool due = opts->job_tokens_reload_ms > 0 && monotonic_ms() >= next_reload;
        if (tokens && (sig == SIGHUP || due)) {
            reload_tokens(opts, tokens, sig == SIGHUP);
            next_reload = monotonic_ms() + opts->job_tokens_reload_ms;
        }
        prismd_events_wake(srv.events);
    }
    prism_log(PRISM_LOG_INFO, "stopping", "signal", sig == SIGTERM ? "SIGTERM" : "SIGINT", LOG_END);
    status = 0;

out:
    prismd_rpc_stop(rpc);
    snapshots.on_publish = NULL;
    prismd_events_close(srv.events);
    prismd_http_stop(health);
    prismd_http_stop(daemon);
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
    sigaddset(&stop, SIGHUP);
    pthread_sigmask(SIG_BLOCK, &stop, NULL);
    signal(SIGPIPE, SIG_IGN);

    /* The provisioned tokens are read once here, so that a bad file is an option error. */
    prismd_token_box tokens;
    prismd_token_box_init(&tokens);
    bool provisioned = opts.job_tokens_dir || opts.job_tokens_file;
    if (provisioned) {
        prismd_tokens *t = prismd_tokens_load(opts.job_tokens_dir, opts.job_tokens_file, &err);
        if (!t) {
            fprintf(stderr, "prismd: job tokens: %s\n", err.message);
            prismd_token_box_destroy(&tokens);
            free(opts.admin_token);
            free(opts.tls_cert);
            free(opts.tls_key);
            return 2;
        }
        atomic_fetch_add(&tokens.loads_ok, 1);
        prismd_token_box_put(&tokens, t);
    }
    char *defaults_json = NULL;
    prism_config defaults;
    prism_status st = load_policy_defaults(&opts, &defaults, &defaults_json, &err);
    if (st != PRISM_OK) {
        bool config_fault = opts.config_path && st != PRISM_ERR_NOMEM;
        fprintf(stderr, "prismd: %s%s\n", config_fault ? "--config: " : "", err.message);
        prismd_token_box_destroy(&tokens);
        return config_fault ? 2 : 1;
    }
    char pid[32];
    snprintf(pid, sizeof pid, "%ld", (long)getpid());
    prism_log(PRISM_LOG_INFO, "starting", "version", PRISM_VERSION, "pid", pid, "config",
              opts.config_path ? opts.config_path : "built-in defaults", LOG_END);
    int status = prismd_serve(&opts, &defaults, defaults_json, provisioned ? &tokens : NULL);
    prismd_token_box_destroy(&tokens);
    free(defaults_json);
    prism_config_free(&defaults);
    free(opts.admin_token);
    free(opts.tls_cert);
    free(opts.tls_key);
    return status;
}
