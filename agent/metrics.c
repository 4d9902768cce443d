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

static char *render(agent *a, size_t *len)
{
    char *text = NULL;
    FILE *f = open_memstream(&text, len);
    if (!f)
        return NULL;
    agent_stats *s = &a->stats;
    const prism_device_profile *p = &a->profile;
    metric(f, "prism_agent_info", "gauge", "the agent's version, device and upstream target (always 1)");
    fprintf(f, "prism_agent_info{version=\"%s\",device_class=\"", PRISM_VERSION);
    label_value(f, p->device_class);
    fputs("\",prismd=\"", f);
    label_value(f, a->opts.prismd);
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
    static const char *const received[] = {"", "welcome", "update", "hints", "error"};
    metric(f, "prism_agent_messages_received_total", "counter", "messages from prismd, by kind");
    for (int k = 1; k <= 4; k++)
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
    one(f, "prism_agent_map_entries_ignored_total", "counter", "map entries past --max-blocks or of unknown precision",
        get(&s->blocks_out_of_range));
    one(f, "prism_agent_trainer_map_version", "gauge", "map version the trainer says it uses",
        get(&s->applied_version));
    one(f, "prism_agent_trainer_map_step", "gauge", "step the trainer started using it at", get(&s->applied_step));
    if (get(&s->trainer_counters_known)) { /* shown once the trainer published them */
        one(f, "prism_agent_trainer_reports_dropped_total", "counter",
            "step reports the trainer's libprism could not send to this agent (from the hint table)",
            get(&s->trainer_reports_dropped));
        one(f, "prism_agent_trainer_late_switches_total", "counter",
            "maps the trainer first used after their effective step (from the hint table)",
            get(&s->trainer_late_switches));
    }
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
