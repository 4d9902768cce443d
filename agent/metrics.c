/* prism-agent's HTTP endpoint (agent.h): /metrics in the Prometheus text format (prism_agent_*
 * metrics, DESIGN 12), /healthz and /readyz. It reads the counters the other threads update and
 * touches nothing else, so a scrape can never hold up a report. */
#define _GNU_SOURCE
#include "agent.h"

#include <inttypes.h>
#include <microhttpd.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#if MHD_VERSION < 0x00097002
typedef int mhd_result;
#else
typedef enum MHD_Result mhd_result;
#endif

struct agent_metrics {
    struct MHD_Daemon *daemon;
    agent *a;
};

static uint64_t get(_Atomic uint64_t *v)
{
    return atomic_load_explicit(v, memory_order_relaxed);
}

/* A label value in the exposition format: backslash, double quote and newline escaped. */
static void label_value(FILE *f, const char *v)
{
    for (; *v; v++) {
        if (*v == '\\' || *v == '"')
            fputc('\\', f);
        if (*v == '\n')
            fputs("\\n", f);
        else
            fputc(*v, f);
    }
}

static void metric(FILE *f, const char *name, const char *type, const char *help)
{
    fprintf(f, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
}

static void one(FILE *f, const char *name, const char *type, const char *help, uint64_t value)
{
    metric(f, name, type, help);
    fprintf(f, "%s %" PRIu64 "\n", name, value);
}

static void gauge_d(FILE *f, const char *name, const char *help, double value)
{
    metric(f, name, "gauge", help);
    fprintf(f, "%s %.9g\n", name, value);
}

/* Nanoseconds as seconds, exactly (nine decimals). */
static void seconds(FILE *f, uint64_t ns)
{
    fprintf(f, "%" PRIu64 ".%09" PRIu64 "\n", ns / 1000000000u, ns % 1000000000u);
}

/* One counter family with a sample per label value: values[i] for names[i]. */
static void labelled(FILE *f, const char *name, const char *help, const char *label, const char *const *names,
                     const uint64_t *values, size_t n, bool as_seconds)
{
    metric(f, name, "counter", help);
    for (size_t i = 0; i < n; i++) {
        fprintf(f, "%s{%s=\"%s\"} ", name, label, names[i]);
        if (as_seconds)
            seconds(f, values[i]);
        else
            fprintf(f, "%" PRIu64 "\n", values[i]);
    }
}

/* The trainer line's families (DESIGN 12, prism_agent_trainer_*), once the trainer published
 * it: every label value, 0 when nothing happened, so that every panel has its series. Drops are
 * exported under libprism's reasons (prism_hints_drop_names) and "unknown", the total's rest:
 * the whole total of an older libprism that publishes only it and late switches (its other
 * families show as 0); for a trainer of this build, whose every drop has a reason, always 0. */
static void render_trainer(FILE *f, const prism_hints_trainer *l)
{
    static const char *const precisions[PRISM_PRECISION_COUNT] = {"bf16", "int8", "fp8_e4m3", "fp8_e5m2", "int4"};
    const prism_hints_trainer_ext *x = &l->ext;
    one(f, "prism_agent_trainer_reports_sent_total", "counter",
        "step reports the trainer's libprism wrote whole to this agent's socket", x->reports_sent);
    const char *reasons[PRISM_HINTS_DROP_REASONS + 1];
    uint64_t dropped[PRISM_HINTS_DROP_REASONS + 1];
    uint64_t attributed = 0;
    for (unsigned r = 0; r < PRISM_HINTS_DROP_REASONS; r++) {
        reasons[r] = prism_hints_drop_names[r];
        dropped[r] = x->dropped[r];
        attributed += x->dropped[r];
    }
    reasons[PRISM_HINTS_DROP_REASONS] = "unknown";
    dropped[PRISM_HINTS_DROP_REASONS] = l->reports_dropped > attributed ? l->reports_dropped - attributed : 0;
    labelled(f, "prism_agent_trainer_reports_dropped_total",
             "step reports the trainer's libprism could not send to this agent, by reason", "reason", reasons,
             dropped, PRISM_HINTS_DROP_REASONS + 1, false);
    one(f, "prism_agent_trainer_late_switches_total", "counter",
        "maps the trainer first used after their effective step", l->late_switches);
    const char *lag = "prism_agent_trainer_map_apply_lag_seconds";
    metric(f, lag, "histogram", "time from the agent writing a map into the hint table to the trainer's first "
                                "step that used it");
    static const char *const le[PRISM_HINTS_LAG_EDGES] = {"0.001", "0.01", "0.1", "0.5", "1", "2",
                                                           "5", "10", "30", "60", "300"};
    uint64_t cumulative = 0;
    for (unsigned i = 0; i < PRISM_HINTS_LAG_BUCKETS; i++) {
        cumulative += x->lag_buckets[i];
        fprintf(f, "%s_bucket{le=\"%s\"} %" PRIu64 "\n", lag, i < PRISM_HINTS_LAG_EDGES ? le[i] : "+Inf",
                cumulative);
    }
    fprintf(f, "%s_sum ", lag);
    seconds(f, x->lag_sum_ns);
    fprintf(f, "%s_count %" PRIu64 "\n", lag, x->lag_count);
    labelled(f, "prism_agent_trainer_transfers_total", "block transfers the trainer started, by precision",
             "precision", precisions, x->transfers, PRISM_PRECISION_COUNT, false);
    labelled(f, "prism_agent_trainer_transfer_bytes_total",
             "bytes of block images the trainer copied host to device, by precision", "precision", precisions,
             x->transfer_bytes, PRISM_PRECISION_COUNT, false);
    labelled(f, "prism_agent_trainer_transfer_bf16_bytes_total",
             "BF16 bytes of the blocks the trainer transferred, by the precision they moved in", "precision",
             precisions, x->transfer_bf16_bytes, PRISM_PRECISION_COUNT, false);
    /* Wire formats of the quantized collectives: every precision but BF16. */
    const char *const *formats = precisions + 1;
    const size_t nf = PRISM_PRECISION_COUNT - 1;
    labelled(f, "prism_agent_trainer_allreduce_calls_total",
             "quantized all-reduce and reduce-scatter calls of the trainer, by wire format", "format", formats,
             x->allreduce_calls + 1, nf, false);
    labelled(f, "prism_agent_trainer_allreduce_wire_bytes_total",
             "payload bytes the trainer's rank sent in quantized collectives, by wire format", "format", formats,
             x->allreduce_wire_bytes + 1, nf, false);
    labelled(f, "prism_agent_trainer_allreduce_bf16_bytes_total",
             "bytes a BF16 ring all-reduce (reduce-scatter) of the same elements sends per rank, by wire format",
             "format", formats, x->allreduce_bf16_bytes + 1, nf, false);
    labelled(f, "prism_agent_trainer_allreduce_seconds_total",
             "host wall time in the trainer's quantized collectives, by wire format", "format", formats,
             x->allreduce_ns + 1, nf, true);
}

static char *render(agent *a, size_t *len)
{
    char *text = NULL;
    FILE *f = open_memstream(&text, len);
    if (!f)
        return NULL;
    agent_stats *s = &a->stats;
    const prism_device_profile *p = &a->profile;
    /* One copy of what the trainer published and said, taken under its lock. */
    agent_trainer *t = &a->trainer;
    prism_hints_trainer line;
    char job[512] = "", rank[16] = "";
    const char *node = "";
    pthread_mutex_lock(&t->mu);
    line = t->line;
    if (t->said_hello) {
        snprintf(job, sizeof job, "%s", t->job ? t->job : "");
        snprintf(rank, sizeof rank, "%" PRIu32, t->rank);
        node = a->opts.node;
    }
    pthread_mutex_unlock(&t->mu);
    metric(f, "prism_agent_info", "gauge",
           "the agent's version, device, upstream target and its trainer's job, rank and node (always 1)");
    fprintf(f, "prism_agent_info{version=\"%s\",device_class=\"", PRISM_VERSION);
    label_value(f, p->device_class);
    fputs("\",prismd=\"", f);
    label_value(f, a->opts.prismd);
    fputs("\",job=\"", f);
    label_value(f, job);
    fprintf(f, "\",rank=\"%s\",node=\"", rank);
    label_value(f, node);
    fputs("\"} 1\n", f);
    one(f, "prism_agent_upstream_connected", "gauge", "1 while a stream to prismd is welcomed",
        get(&s->upstream_connected));
    one(f, "prism_agent_upstream_attempts_total", "counter", "Connect calls started", get(&s->upstream_attempts));
    one(f, "prism_agent_upstream_welcomes_total", "counter", "Connect calls prismd welcomed",
        get(&s->upstream_welcomes));
    one(f, "prism_agent_upstream_failures_total", "counter", "Connect calls that ended", get(&s->upstream_failures));
    gauge_d(f, "prism_agent_upstream_backoff_seconds", "wait before the next Connect attempt",
            (double)get(&s->backoff_ms) / 1000.0);
    static const char *const sent[] = {"", "hello", "step_report", "calibration", "ack", "heartbeat"};
    metric(f, "prism_agent_messages_sent_total", "counter", "messages prismd received from this agent, by kind");
    for (int k = 1; k <= 5; k++)
        fprintf(f, "prism_agent_messages_sent_total{kind=\"%s\"} %" PRIu64 "\n", sent[k], get(&s->messages_sent[k]));
    one(f, "prism_agent_sent_bytes_total", "counter", "bytes of messages sent to prismd", get(&s->bytes_sent));
    static const char *const received[] = {"", "welcome", "update", "hints", "error", "config"};
    metric(f, "prism_agent_messages_received_total", "counter", "messages from prismd, by kind");
    for (int k = 1; k <= 5; k++)
        fprintf(f, "prism_agent_messages_received_total{kind=\"%s\"} %" PRIu64 "\n", received[k],
                get(&s->messages_received[k]));
    one(f, "prism_agent_reports_received_total", "counter", "step reports from the trainer", get(&s->reports_received));
    metric(f, "prism_agent_reports_dropped_total", "counter", "step reports that did not reach prismd, by reason");
    for (int r = 0; r < AGENT_DROPS; r++)
        fprintf(f, "prism_agent_reports_dropped_total{reason=\"%s\"} %" PRIu64 "\n", agent_drop_names[r],
                get(&s->reports_dropped[r]));
    one(f, "prism_agent_map_version", "gauge", "newest map version in the hint table", get(&s->map_version));
    one(f, "prism_agent_map_effective_step", "gauge", "effective step of the newest map", get(&s->map_effective_step));
    one(f, "prism_agent_maps_applied_total", "counter", "maps written to the hint table", get(&s->maps_applied));
    one(f, "prism_agent_map_entries_ignored_total", "counter",
        "map and compute plan entries past --max-blocks or of unknown precision", get(&s->blocks_out_of_range));
    one(f, "prism_agent_plan_map_version", "gauge", "map version of the compute plan last written to the plan file, or kept there for the map kept at start (0: none)",
        get(&s->plan_map_version));
    one(f, "prism_agent_plan_low_blocks", "gauge", "blocks planned low in the compute plan last written",
        get(&s->plan_low_blocks));
    one(f, "prism_agent_plans_written_total", "counter", "compute plans written to the plan file", get(&s->plans_written));
    metric(f, "prism_agent_plans_ignored_total", "counter",
           "compute plans not written, by reason (low_format: not int8 or fp8_e4m3; device_class: another class's "
           "plan; file: the plan file refused it)");
    for (int r = 0; r < AGENT_PLAN_IGNORED_REASONS; r++)
        fprintf(f, "prism_agent_plans_ignored_total{reason=\"%s\"} %" PRIu64 "\n", agent_plan_ignored_names[r],
                get(&s->plans_ignored[r]));
    one(f, "prism_agent_plans_withdrawn_total", "counter",
        "plans of the held map cleared from the plan file because prismd's Welcome repeated the map without one",
        get(&s->plans_withdrawn));
    one(f, "prism_agent_trainer_map_version", "gauge", "map version the trainer says it uses",
        line.applied_version);
    one(f, "prism_agent_trainer_map_step", "gauge", "step the trainer started using it at", line.applied_step);
    if (line.published) /* shown once the trainer published its counters */
        render_trainer(f, &line);
    one(f, "prism_agent_last_step", "gauge", "step of the last report from the trainer", get(&s->last_step));
    one(f, "prism_agent_trainer_connections", "gauge", "trainer connections open", get(&s->trainer_connected));
    one(f, "prism_agent_trainer_connections_total", "counter", "trainer connections accepted",
        get(&s->trainer_connections));
    one(f, "prism_agent_trainer_frames_total", "counter", "frames read from trainers", get(&s->trainer_frames));
    one(f, "prism_agent_trainer_frames_rejected_total", "counter", "bad frames (their connection was closed)",
        get(&s->trainer_frames_rejected));
    one(f, "prism_agent_device_memory_bytes", "gauge", "device memory measured at start", p->memory_bytes);
    gauge_d(f, "prism_agent_device_copy_bytes_per_second",
            "copy bandwidth measured at start (device to device on a GPU)",
            p->copy_bytes_per_second);
    gauge_d(f, "prism_agent_device_h2d_bytes_per_second", "host-to-device bandwidth measured at start",
            p->h2d_bytes_per_second);
    gauge_d(f, "prism_agent_device_bf16_ops_per_second", "BF16 matrix throughput measured at start",
            p->bf16_ops_per_second);
    if (fclose(f) != 0) {
        free(text);
        return NULL;
    }
    return text;
}

static mhd_result reply(struct MHD_Connection *c, unsigned code, const char *type, char *body, size_t len,
                        enum MHD_ResponseMemoryMode mode)
{
    struct MHD_Response *r = MHD_create_response_from_buffer(len, body, mode);
    if (!r)
        return MHD_NO;
    MHD_add_response_header(r, "Content-Type", type);
    mhd_result ok = MHD_queue_response(c, code, r);
    MHD_destroy_response(r);
    return ok;
}

static mhd_result handle(void *cls, struct MHD_Connection *c, const char *url, const char *method,
                         const char *version, const char *upload, size_t *upload_len, void **state)
{
    (void)version;
    (void)upload;
    (void)upload_len;
    struct agent_metrics *m = cls;
    if (!*state) { /* the first call of a request only announces it */
        *state = m;
        return MHD_YES;
    }
    static char not_get[] = "only GET\n", missing[] = "not found: /metrics, /healthz, /readyz\n";
    static char ok[] = "ok\n", not_ready[] = "not ready\n";
    if (strcmp(method, "GET") != 0 && strcmp(method, "HEAD") != 0)
        return reply(c, 405, "text/plain", not_get, sizeof not_get - 1, MHD_RESPMEM_PERSISTENT);
    if (strcmp(url, "/metrics") == 0) {
        size_t len = 0;
        char *text = render(m->a, &len);
        if (!text)
            return MHD_NO;
        return reply(c, 200, "text/plain; version=0.0.4", text, len, MHD_RESPMEM_MUST_FREE);
    }
    if (strcmp(url, "/healthz") == 0)
        return reply(c, 200, "text/plain", ok, sizeof ok - 1, MHD_RESPMEM_PERSISTENT);
    if (strcmp(url, "/readyz") == 0) {
        bool ready = get(&m->a->stats.ready) != 0;
        return ready ? reply(c, 200, "text/plain", ok, sizeof ok - 1, MHD_RESPMEM_PERSISTENT)
                     : reply(c, 503, "text/plain", not_ready, sizeof not_ready - 1, MHD_RESPMEM_PERSISTENT);
    }
    return reply(c, 404, "text/plain", missing, sizeof missing - 1, MHD_RESPMEM_PERSISTENT);
}

struct agent_metrics *agent_metrics_start(agent *a, prism_error *err)
{
    struct agent_metrics *m = calloc(1, sizeof *m);
    if (!m) {
        prism_error_set(err, PRISM_ERR_NOMEM, "out of memory");
        return NULL;
    }
    m->a = a;
    unsigned flags = MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_ERROR_LOG;
    if (a->opts.metrics_addr.ss_family == AF_INET6)
        flags |= MHD_USE_IPv6;
    m->daemon = MHD_start_daemon(flags, 0, NULL, NULL, &handle, m, MHD_OPTION_SOCK_ADDR,
                                 (const struct sockaddr *)&a->opts.metrics_addr, MHD_OPTION_CONNECTION_LIMIT, 64,
                                 MHD_OPTION_CONNECTION_TIMEOUT, 10, MHD_OPTION_END);
    if (!m->daemon) {
        free(m);
        prism_error_set(err, PRISM_ERR_IO, "--metrics-listen: cannot listen on %s", a->opts.metrics_text);
        return NULL;
    }
    return m;
}

void agent_metrics_stop(struct agent_metrics *m)
{
    if (!m)
        return;
    MHD_stop_daemon(m->daemon);
    free(m);
}
