/* prism-agent: the sidecar beside each trainer (DESIGN 1, 2). It measures the device, opens the
 * hint table and the local socket in the directory it shares with the trainer, serves /metrics,
 * and keeps one Connect stream to prismd (upstream.c) for as long as it runs.
 *
 * Threads: main (options, start-up, then the local socket and signals: socket.c), upstream, and
 * libmicrohttpd's. SIGTERM or SIGINT: the socket closes, the stream to prismd is half-closed and
 * gets 2 s to end with its status, the hint table keeps the last map for the trainer, exit 0. */
#define _GNU_SOURCE
#include "agent.h"
#include "help.h"
#include "local.h"
#include "net.h"

#include <errno.h>
#include <getopt.h>
#include <grpc/grpc.h>
#include <limits.h>
#include <signal.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/signalfd.h>
#include <sys/stat.h>
#include <unistd.h>

/* ---------------------------------------------------------------------------------------------
 * Options: one table (name, argument, default, help), read by the parser, the defaults and --help. */

typedef prism_status (*option_set)(agent_options *o, const char *value, prism_error *err);

typedef struct agent_option {
    const char *name;
    const char *arg; /* NULL: a flag */
    const char *default_value;
    option_set set;  /* NULL: a whole number from min to max, stored at `field` */
    const char *help;
    size_t field;    /* offsetof(agent_options, a uint64_t) */
    uint64_t min, max;
} agent_option;

static prism_status parse_u64(const char *value, uint64_t min, uint64_t max, uint64_t *out, prism_error *err)
{
    char *end = NULL;
    errno = 0;
    unsigned long long v = value[0] >= '0' && value[0] <= '9' ? strtoull(value, &end, 10) : 0;
    if (!end || *end || errno || v < min || v > max)
        return prism_error_set(err, PRISM_ERR_INVALID, "\"%.100s\" is not a whole number from %llu to %llu", value,
                               (unsigned long long)min, (unsigned long long)max);
    *out = v;
    return PRISM_OK;
}

static prism_status set_prismd(agent_options *o, const char *v, prism_error *err)
{
    if (!v[0])
        return prism_error_set(err, PRISM_ERR_INVALID, "the target is empty");
    o->prismd = v;
    return PRISM_OK;
}

static prism_status set_dir(agent_options *o, const char *v, prism_error *err)
{
    if (!v[0])
        return prism_error_set(err, PRISM_ERR_INVALID, "the directory name is empty");
    o->dir = v;
    return PRISM_OK;
}

/* Reads a secret file, without its final newline; an empty one is refused. */
static prism_status read_secret(char **out, const char *path, const char *what, prism_error *err)
{
    size_t len = 0;
    char *text = prism_file_read(path, &len, err);
    if (!text)
        return err->status;
    while (len && (text[len - 1] == '\n' || text[len - 1] == '\r'))
        text[--len] = '\0';
    if (!len) {
        free(text);
        return prism_error_set(err, PRISM_ERR_INVALID, "%.200s: the %s file is empty", path, what);
    }
    free(*out);
    *out = text;
    return PRISM_OK;
}

static prism_status set_token_file(agent_options *o, const char *v, prism_error *err)
{
    prism_status st = read_secret(&o->token, v, "token", err);
    if (!st && strpbrk(o->token, "\r\n"))
        return prism_error_set(err, PRISM_ERR_INVALID, "%.200s: the token must be one line", v);
    return st;
}

static prism_status set_tls_ca(agent_options *o, const char *v, prism_error *err)
{
    return read_secret(&o->tls_ca, v, "CA certificate", err);
}

static prism_status set_node(agent_options *o, const char *v, prism_error *err)
{
    if (strlen(v) >= sizeof o->node)
        return prism_error_set(err, PRISM_ERR_INVALID, "longer than %zu characters", sizeof o->node - 1);
    snprintf(o->node, sizeof o->node, "%s", v);
    return PRISM_OK;
}

static prism_status set_metrics_listen(agent_options *o, const char *v, prism_error *err)
{
    o->metrics = strcmp(v, "off") != 0;
    if (!o->metrics)
        return PRISM_OK;
    return prism_parse_listen(v, &o->metrics_addr, &o->metrics_addr_len, o->metrics_text, sizeof o->metrics_text, err);
}

static prism_status set_device(agent_options *o, const char *v, prism_error *err)
{
    o->device_auto = strcmp(v, "auto") == 0;
    if (o->device_auto || strcmp(v, "cpu") == 0) {
        o->device = -1;
        return PRISM_OK;
    }
    uint64_t x = 0;
    if (parse_u64(v, 0, 1023, &x, err))
        return prism_error_set(err, PRISM_ERR_INVALID, "\"%.100s\" is not auto, cpu or a CUDA device index", v);
    o->device = (int)x;
    return PRISM_OK;
}

static prism_status set_device_class(agent_options *o, const char *v, prism_error *err)
{
    size_t n = strlen(v);
    if (n == 0 || n >= PRISM_PROFILE_CLASS_MAX || strspn(v, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
                                                             "0123456789-_.") != n)
        return prism_error_set(err, PRISM_ERR_INVALID,
                               "\"%.100s\" is not 1 to %d letters, digits, '-', '_' or '.'", v,
                               PRISM_PROFILE_CLASS_MAX - 1);
    o->device_class = v;
    return PRISM_OK;
}

static prism_status set_profile_file(agent_options *o, const char *v, prism_error *err)
{
    if (!v[0])
        return prism_error_set(err, PRISM_ERR_INVALID, "the file name is empty");
    o->profile_file = v;
    return PRISM_OK;
}

static prism_status set_log_level(agent_options *o, const char *v, prism_error *err)
{
    for (int i = 0; i < PRISM_LOG_LEVELS; i++)
        if (strcmp(v, prism_log_level_names[i]) == 0) {
            o->log_level = (prism_log_level)i;
            return PRISM_OK;
        }
    return prism_error_set(err, PRISM_ERR_INVALID, "\"%.100s\" is not one of debug, info, warn, error", v);
}

static prism_status set_help(agent_options *o, const char *v, prism_error *err)
{
    (void)v;
    (void)err;
    o->help = true;
    return PRISM_OK;
}

static prism_status set_version(agent_options *o, const char *v, prism_error *err)
{
    (void)v;
    (void)err;
    o->version = true;
    return PRISM_OK;
}

static const agent_option option_table[] = {
    {"prismd", "TARGET", "127.0.0.1:50051", set_prismd,
     "gRPC target of prismd (host:port, dns:///name:port, ipv6:[::1]:port, unix:/path)", 0, 0, 0},
    {"dir", "DIR", "./prism-run", set_dir,
     "directory shared with the trainer (created, mode 0770): the socket " PRISM_LOCAL_SOCKET_NAME
     " and the hint table " PRISM_LOCAL_HINTS_NAME " live there; $PRISM_AGENT_DIR in the trainer names it", 0, 0, 0},
    {"token-file", "FILE", NULL, set_token_file,
     "file holding the job's bearer token, sent as `authorization: Bearer TOKEN` and in Hello", 0, 0, 0},
    {"tls-ca", "FILE", NULL, set_tls_ca, "PEM root certificates: connect to prismd over TLS, checking it with these",
     0, 0, 0},
    {"node", "NAME", NULL, set_node, "node name sent in Hello (default: the host name)", 0, 0, 0},
    {"max-blocks", "N", "65536", NULL,
     "blocks the hint table and the plan file hold (map and plan entries past it are ignored and counted)",
     offsetof(agent_options, max_blocks), 1, PRISM_HINTS_MAX_BLOCKS_LIMIT},
    {"backoff-initial-ms", "MS", "100", NULL,
     "first wait before reconnecting to prismd; doubles per failed attempt, with jitter (x0.5 to x1)",
     offsetof(agent_options, backoff_initial_ms), 1, 3600000},
    {"backoff-max-ms", "MS", "10000", NULL, "longest wait between attempts", offsetof(agent_options, backoff_max_ms),
     1, 3600000},
    {"heartbeat-ms", "MS", "5000", NULL, "a Heartbeat goes up when nothing else was sent for this long",
     offsetof(agent_options, heartbeat_ms), 10, 3600000},
    {"queue-bytes", "N", "16777216", NULL,
     "unsent bytes to prismd at most; step reports past it are dropped and counted", offsetof(agent_options, queue_bytes), 4096, 1ull << 34},
    {"max-message-bytes", "N", "16777216", NULL, "largest gRPC message sent or accepted",
     offsetof(agent_options, max_message_bytes), 4096, INT_MAX},
    {"metrics-listen", "ADDR:PORT", "127.0.0.1:9470", set_metrics_listen,
     "HTTP address of /metrics, /healthz and /readyz (IPv4 a.b.c.d:PORT or [IPv6]:PORT), or off", 0, 0, 0},
    {"device", "auto|cpu|N", "auto", set_device,
     "device to profile at start: a CUDA device index, cpu, or auto (device 0 when there is one)", 0, 0, 0},
    {"device-class", "NAME", NULL, set_device_class,
     "device class sent in the DeviceProfile (default: derived from the device's name)", 0, 0, 0},
    {"profile-budget-ms", "MS", "1000", NULL,
     "time the device measurement at start may take, its buffers' first touch included; past it only "
     "the smallest runs are left (a few ms on a CPU). A smaller budget measures less precisely",
     offsetof(agent_options, profile_budget_ms), PRISM_PROFILE_BUDGET_MIN_MS, 60000},
    {"profile-file", "FILE", NULL, set_profile_file,
     "JSON object of the DeviceProfile to send instead of measuring the device (one machine can play "
     "another): device_class, device_name, memory_bytes, bf16_ops_per_second, fp16_ops_per_second, "
     "int8_ops_per_second, fp8_ops_per_second, quantize_cost and cast_cost ({fixed_seconds, "
     "seconds_per_byte}), h2d_bytes_per_second, as in PLAN.json's classes[].profile. A missing key "
     "is 0 (\"\" for device_name); a missing device_class is --device-class's, else derived from "
     "device_name. memory_bytes is an integer (a real only when whole and below 2^53). Unknown keys, "
     "wrong types, negative or non-finite numbers: exit 2. --device and --profile-budget-ms are then unused", 0, 0, 0},
    {"log-level", "LEVEL", "info", set_log_level,
     "least severe log event written to stderr: debug, info, warn, error", 0, 0, 0},
    {"help", NULL, NULL, set_help, "print this help and exit", 0, 0, 0},
    {"version", NULL, NULL, set_version, "print the version and exit", 0, 0, 0},
};

#define OPTION_COUNT (sizeof option_table / sizeof option_table[0])

static prism_status option_apply(agent_options *o, const agent_option *opt, const char *value, prism_error *err)
{
    if (opt->set)
        return opt->set(o, value, err);
    uint64_t x = 0;
    prism_status st = parse_u64(value, opt->min, opt->max, &x, err);
    if (!st)
        memcpy((char *)o + opt->field, &x, sizeof x);
    return st;
}

static void print_usage(FILE *out)
{
    fprintf(out, "Usage: prism-agent [OPTION]...\n"
                 "\n"
                 "prism-agent, the Prism sidecar beside one trainer. The trainer's libprism connects to\n"
                 "DIR/" PRISM_LOCAL_SOCKET_NAME " and sends its layout and per-step gradient statistics;\n"
                 "the agent forwards them on one gRPC stream to prismd and writes each precision map\n"
                 "prismd decides into the shared-memory hint table DIR/" PRISM_LOCAL_HINTS_NAME ", which the\n"
                 "trainer reads at the start of each step. When prismd is unreachable the trainer keeps\n"
                 "the last map and the agent reconnects with exponential backoff and jitter. The compute\n"
                 "plan that comes with a map (hybrid devices) goes into DIR/" PRISM_LOCAL_PLANS_NAME " first.\n"
                 "\n"
                 "Options (--name VALUE or --name=VALUE):\n");
    for (size_t i = 0; i < OPTION_COUNT; i++) {
        const agent_option *o = &option_table[i];
        char label[64], tail[96];
        snprintf(label, sizeof label, "%s--%s%s%s", strcmp(o->name, "help") ? "    " : "-h, ", o->name,
                 o->arg ? " " : "", o->arg ? o->arg : "");
        snprintf(tail, sizeof tail, "(default: %s)", o->default_value ? o->default_value : "");
        prism_help_entry(out, label, o->help, o->default_value ? tail : NULL);
    }
    fprintf(out, "\n"
                 "HTTP: GET /metrics (Prometheus text, prism_agent_* metrics), /healthz, /readyz (200 once\n"
                 "the hint table and the socket are open). prism_agent_trainer_* also carries what the\n"
                 "trainer's libprism publishes in the hint table (reports sent and dropped by reason, late\n"
                 "switches, map apply lag, block transfers and all-reduces by precision), once it has.\n"
                 "Logs: logfmt lines on stderr.\n"
                 "Signals: SIGTERM or SIGINT closes the socket, ends the stream to prismd and exits 0; the\n"
                 "hint table stays, so the trainer keeps its map and a restarted agent carries on.\n"
                 "Exit status: 0 stopped cleanly; 1 cannot start (directory, socket, metrics address);\n"
                 "2 bad option.\n");
}

static prism_status options_parse(agent_options *o, int argc, char **argv, prism_error *err)
{
    memset(o, 0, sizeof *o);
    for (size_t i = 0; i < OPTION_COUNT; i++) {
        const agent_option *opt = &option_table[i];
        if (opt->default_value && option_apply(o, opt, opt->default_value, err)) {
            prism_error_prefix(err, "--%s default", opt->name);
            return err->status;
        }
    }
    struct option longs[OPTION_COUNT + 1];
    for (size_t i = 0; i < OPTION_COUNT; i++)
        longs[i] = (struct option){option_table[i].name, option_table[i].arg ? required_argument : no_argument, NULL,
                                   (int)(1000 + i)};
    longs[OPTION_COUNT] = (struct option){0, 0, 0, 0};
    opterr = 0;
    optind = 1;
    for (;;) {
        int c = getopt_long(argc, argv, ":h", longs, NULL);
        if (c == -1)
            break;
        if (c == 'h') {
            o->help = true;
            continue;
        }
        if (c == '?')
            return prism_error_set(err, PRISM_ERR_INVALID, "%s: unknown option (see --help)", argv[optind - 1]);
        if (c == ':')
            return prism_error_set(err, PRISM_ERR_INVALID, "%s: needs a value (see --help)", argv[optind - 1]);
        const agent_option *opt = &option_table[c - 1000];
        if (option_apply(o, opt, optarg ? optarg : "", err)) {
            prism_error_prefix(err, "--%s", opt->name);
            return err->status;
        }
    }
    if (optind < argc)
        return prism_error_set(err, PRISM_ERR_INVALID, "%s: unexpected argument (options only; see --help)",
                               argv[optind]);
    if (o->backoff_max_ms < o->backoff_initial_ms)
        return prism_error_set(err, PRISM_ERR_INVALID, "--backoff-max-ms: %llu is below --backoff-initial-ms %llu",
                               (unsigned long long)o->backoff_max_ms, (unsigned long long)o->backoff_initial_ms);
    if (!o->node[0] && gethostname(o->node, sizeof o->node - 1) != 0)
        snprintf(o->node, sizeof o->node, "unknown");
    return PRISM_OK;
}

/* mkdir -p with mode 0770 (less the umask). */
static prism_status make_dir(const char *path, prism_error *err)
{
    char buf[PATH_MAX];
    if (snprintf(buf, sizeof buf, "%s", path) >= (int)sizeof buf)
        return prism_error_set(err, PRISM_ERR_INVALID, "--dir: longer than PATH_MAX");
    for (char *p = buf + 1;; p++) {
        if (*p == '/' || !*p) {
            char keep = *p;
            *p = '\0';
            if (mkdir(buf, 0770) != 0 && errno != EEXIST)
                return prism_error_set(err, PRISM_ERR_IO, "--dir: cannot create %s: %s", buf, strerror(errno));
            *p = keep;
            if (!keep)
                break;
        }
    }
    return PRISM_OK;
}

static int run(agent *a)
{
    prism_error err = {0};
    agent_options *o = &a->opts;
    if (make_dir(o->dir, &err)) {
        prism_log(PRISM_LOG_ERROR, "cannot start", "error", err.message, LOG_END);
        return 1;
    }

    /* The device is measured before anything listens: a trainer that connects meanwhile waits in
     * the socket's backlog, and its Hello goes up with the profile. */
    if (!o->profile_file) {
        prism_profile_options po = {.device = o->device, .budget_ms = (int)o->profile_budget_ms,
                                   .device_class = o->device_class};
        if (o->device_auto)
            po.device = prism_profile_default_device();
        if (prism_profile_measure(&po, &a->profile, &err)) {
            prism_log(PRISM_LOG_ERROR, "cannot measure the device", "error", err.message, LOG_END);
            return 1;
        }
    }
    prism_log(PRISM_LOG_INFO, o->profile_file ? "device profile read" : "device measured", "class",
              a->profile.device_class, "name", a->profile.device_name, "file", o->profile_file ? o->profile_file : "",
              LOG_END);

    /* The plan file before the hint table: a trainer that finds the table finds the plans too.
     * Its name is the hint table's with PRISM_LOCAL_PLANS_SUFFIX (local.h), as the client
     * derives it. */
    char plans_path[PATH_MAX];
    snprintf(plans_path, sizeof plans_path, "%s/%s%s", o->dir, PRISM_LOCAL_HINTS_NAME, PRISM_LOCAL_PLANS_SUFFIX);
    if (prism_plans_create(&a->plans, plans_path, (uint32_t)o->max_blocks, &err)) {
        prism_log(PRISM_LOG_ERROR, "cannot open the plan file", "error", err.message, LOG_END);
        return 1;
    }
    char hints_path[PATH_MAX];
    snprintf(hints_path, sizeof hints_path, "%s/%s", o->dir, PRISM_LOCAL_HINTS_NAME);
    if (prism_hints_create(&a->hints, hints_path, (uint32_t)o->max_blocks, &err)) {
        prism_log(PRISM_LOG_ERROR, "cannot open the hint table", "error", err.message, LOG_END);
        prism_plans_close(&a->plans);
        return 1;
    }
    int listen_fd = -1;
    char socket_path[PATH_MAX];
    if (agent_socket_listen(a, &listen_fd, socket_path, sizeof socket_path, &err)) {
        prism_log(PRISM_LOG_ERROR, "cannot open the local socket", "error", err.message, LOG_END);
        prism_hints_close(&a->hints);
        prism_plans_close(&a->plans);
        return 1;
    }
    struct agent_metrics *metrics = NULL;
    if (o->metrics && !(metrics = agent_metrics_start(a, &err))) {
        prism_log(PRISM_LOG_ERROR, "cannot serve metrics", "error", err.message, LOG_END);
        close(listen_fd);
        unlink(socket_path);
        prism_hints_close(&a->hints);
        prism_plans_close(&a->plans);
        return 1;
    }

    sigset_t stop_signals;
    sigemptyset(&stop_signals);
    sigaddset(&stop_signals, SIGTERM);
    sigaddset(&stop_signals, SIGINT);
    int sigfd = signalfd(-1, &stop_signals, SFD_CLOEXEC);

    grpc_init();
    pthread_t upstream;
    int status = 0;
    if (sigfd < 0 || agent_upstream_start(a, &upstream, &err)) {
        prism_log(PRISM_LOG_ERROR, "cannot start", "error", sigfd < 0 ? strerror(errno) : err.message, LOG_END);
        status = 1;
    } else {
        atomic_store(&a->stats.ready, 1);
        prism_log(PRISM_LOG_INFO, "listening", "socket", socket_path, "hints", hints_path, "metrics",
                  o->metrics ? o->metrics_text : "off", "prismd", o->prismd, LOG_END);
        int sig = agent_socket_serve(a, listen_fd, sigfd);
        prism_log(PRISM_LOG_INFO, "stopping", "signal", sig == SIGTERM ? "SIGTERM" : sig == SIGINT ? "SIGINT" : "none",
                  LOG_END);
        atomic_store(&a->stats.ready, 0);
        atomic_store(&a->stop, true);
        pthread_join(upstream, NULL);
    }
    close(listen_fd);
    unlink(socket_path);
    agent_metrics_stop(metrics);
    if (sigfd >= 0)
        close(sigfd);
    grpc_shutdown();
    prism_hints_close(&a->hints);
    prism_plans_close(&a->plans);
    if (!status)
        prism_log(PRISM_LOG_INFO, "stopped", LOG_END);
    return status;
}

int main(int argc, char **argv)
{
    static agent a; /* large (the counters) and alive until exit */
    prism_error err = {0};
    if (options_parse(&a.opts, argc, argv, &err)) {
        fprintf(stderr, "prism-agent: %s\n", err.message);
        return 2;
    }
    if (a.opts.help) {
        print_usage(stdout);
        return 0;
    }
    if (a.opts.version) {
        printf("prism-agent %s\n", PRISM_VERSION);
        return 0;
    }
    if (a.opts.profile_file &&
        prism_profile_read_file(a.opts.profile_file, a.opts.device_class, &a.profile, &err) != PRISM_OK) {
        fprintf(stderr, "prism-agent: --profile-file %s: %s\n", a.opts.profile_file, err.message);
        free(a.opts.token);
        free(a.opts.tls_ca);
        return 2;
    }
    prism_log_threshold = a.opts.log_level;
    /* Stop signals are blocked before any thread exists, so every thread inherits the mask and
     * only the signalfd sees them. */
    sigset_t stop_signals;
    sigemptyset(&stop_signals);
    sigaddset(&stop_signals, SIGTERM);
    sigaddset(&stop_signals, SIGINT);
    pthread_sigmask(SIG_BLOCK, &stop_signals, NULL);
    signal(SIGPIPE, SIG_IGN);
    agent_inbox_init(&a.inbox, a.opts.queue_bytes);
    pthread_mutex_init(&a.trainer.mu, NULL);
    int status = run(&a);
    agent_inbox_destroy(&a.inbox);
    pthread_mutex_destroy(&a.trainer.mu);
    free(a.trainer.job);
    free(a.opts.token);
    free(a.opts.tls_ca);
    return status;
}
