/* `prismctl replay`: runs the policy core over a recorded trace, exactly as prismd would over
 * the same reports, and prints one telemetry record (DESIGN 4.4) per decision. Records are
 * held in a temporary file until the whole trace has replayed, so a bad line leaves stdout
 * empty. */
#define _POSIX_C_SOURCE 200809L
#include "prismctl.h"

#include "config.h"
#include "idmap.h"
#include "merge.h"
#include "policy.h"
#include "telemetry.h"
#include "trace.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef struct replay_options {
    const char *config_path;
    const char *trace_path;
    long long world_size; /* 0: derived */
    bool fixed_time;
    double timestamp;
} replay_options;

typedef struct option_spec {
    const char *name;
    const char *arg;
    const char *help;
} option_spec;

static const option_spec options[] = {
    {"--config", "FILE", "policy config JSON (bare or nested form); defaults when absent"},
    {"--world-size", "N", "ranks per step; default: the number of distinct ranks in the trace"},
    {"--timestamp", "SECONDS", "write this Unix time in every record (reproducible output); default: now"},
    {"--help", NULL, "this text"},
};

static void replay_usage(FILE *out)
{
    fprintf(out, "usage: prismctl replay [OPTIONS] TRACE.jsonl\n\n"
                 "Replays gradient statistics through the policy and prints one telemetry JSON line per\n"
                 "decision on stdout. TRACE may be - for standard input. Trace lines:\n"
                 "  {\"step\": S, \"rank\": R, \"loss\": L, \"blocks\": [{\"id\": I, \"l2\": X, \"max_abs\": X,\n"
                 "    \"mean\": X, \"variance\": X, \"numel\": N, \"nonfinite\": N}]}   rank, loss, mean,\n"
                 "    variance, nonfinite optional\n"
                 "  {\"calibration\": {\"format\": \"int8\", \"errors\": {\"<id>\": E}}}   from that line on\n"
                 "  {\"layout\": {\"blocks\": [{\"id\": I, \"name\": \"...\", \"param_bytes_bf16\": B}]}}\n"
                 "A step completes when every rank reported it; steps still open at the end complete in\n"
                 "order. A bad line or config prints FILE:LINE: KEY: problem on stderr and exits 2.\n\n"
                 "Options:\n");
    for (size_t i = 0; i < sizeof options / sizeof options[0]; i++) {
        char left[40];
        snprintf(left, sizeof left, "%s%s%s", options[i].name, options[i].arg ? " " : "",
                 options[i].arg ? options[i].arg : "");
        fprintf(out, "  %-22s %s\n", left, options[i].help);
    }
    fprintf(out, "\nPolicy config keys:\n");
    prism_config_print_help(out);
}

/* Parses argv; returns -1 to go on, or an exit status. */
static int parse_args(int argc, char **argv, replay_options *o)
{
    memset(o, 0, sizeof *o);
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
            replay_usage(stdout);
            return 0;
        }
        if (a[0] == '-' && a[1] == '-') {
            const char *eq = strchr(a, '=');
            size_t name_len = eq ? (size_t)(eq - a) : strlen(a);
            const char *value = eq ? eq + 1 : (i + 1 < argc ? argv[i + 1] : NULL);
            const option_spec *spec = NULL;
            for (size_t k = 0; k < sizeof options / sizeof options[0]; k++)
                if (options[k].arg && strlen(options[k].name) == name_len &&
                    strncmp(options[k].name, a, name_len) == 0)
                    spec = &options[k];
            if (!spec) {
                fprintf(stderr, "prismctl replay: unknown option %.*s (see --help)\n", (int)name_len, a);
                return 2;
            }
            if (!value) {
                fprintf(stderr, "prismctl replay: %s needs a value (%s)\n", spec->name, spec->arg);
                return 2;
            }
            if (!eq)
                i++;
            char *end = NULL;
            errno = 0;
            if (strcmp(spec->name, "--config") == 0) {
                o->config_path = value;
            } else if (strcmp(spec->name, "--world-size") == 0) {
                o->world_size = strtoll(value, &end, 10);
                if (errno || !*value || *end || o->world_size < 1 || o->world_size > 1000000) {
                    fprintf(stderr, "prismctl replay: --world-size: \"%s\" is not an integer from 1 to 1000000\n",
                            value);
                    return 2;
                }
            } else {
                o->timestamp = strtod(value, &end);
                if (errno || !*value || *end || !isfinite(o->timestamp) || o->timestamp < 0) {
                    fprintf(stderr, "prismctl replay: --timestamp: \"%s\" is not a Unix time in seconds\n", value);
                    return 2;
                }
                o->fixed_time = true;
            }
            continue;
        }
        if (o->trace_path) {
            fprintf(stderr, "prismctl replay: one trace file only (got \"%s\" and \"%s\")\n", o->trace_path, a);
            return 2;
        }
        o->trace_path = a;
    }
    if (!o->trace_path) {
        fprintf(stderr, "prismctl replay: no trace file given (see --help)\n");
        return 2;
    }
    return -1;
}

/* Walks the lines of a buffer: *line gets the next line (without its newline). */
static bool next_line(const char *text, size_t len, size_t *pos, const char **line, size_t *line_len)
{
    if (*pos >= len)
        return false;
    const char *start = text + *pos;
    const char *nl = memchr(start, '\n', len - *pos);
    *line = start;
    *line_len = nl ? (size_t)(nl - start) : len - *pos;
    *pos += *line_len + (nl ? 1 : 0);
    return true;
}

static int compare_u32(const void *a, const void *b)
{
    uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
    return (x > y) - (x < y);
}

/* The distinct ranks of a trace: a set for pass 1, then sorted to number them densely. */
typedef struct rank_set {
    prism_idmap seen;
    uint32_t *ranks;
    size_t count, cap;
} rank_set;

static bool rank_set_add(rank_set *s, uint32_t rank)
{
    if (prism_idmap_get(&s->seen, rank) != PRISM_IDMAP_NONE)
        return true;
    if (s->count == s->cap) {
        size_t ncap = s->cap ? s->cap * 2 : 16;
        uint32_t *n = realloc(s->ranks, ncap * sizeof *n);
        if (!n)
            return false;
        s->ranks = n;
        s->cap = ncap;
    }
    s->ranks[s->count++] = rank;
    return prism_idmap_put(&s->seen, rank, 0) == PRISM_OK;
}

static uint32_t rank_index(const rank_set *s, uint32_t rank)
{
    const uint32_t *hit = bsearch(&rank, s->ranks, s->count, sizeof *s->ranks, compare_u32);
    return (uint32_t)(hit - s->ranks);
}

static double now_seconds(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

typedef struct replay_state {
    prism_policy *policy;
    prism_merger *merger;
    prism_buf out;
    FILE *records; /* held back until the whole trace replayed without error */
    const replay_options *opt;
    uint64_t steps, decisions;
} replay_state;

/* Feeds every ready merged step to the policy and prints the decisions. */
static prism_status drain(replay_state *r, prism_error *err)
{
    prism_merged_step m;
    while (prism_merger_next(r->merger, 0, &m)) {
        prism_step_result res;
        prism_status st = prism_policy_add_step(r->policy, m.step, m.blocks, m.count, &res, err);
        if (st)
            return st;
        r->steps++;
        if (!res.decided)
            continue;
        r->decisions++;
        r->out.len = 0;
        double ts = r->opt->fixed_time ? r->opt->timestamp : now_seconds();
        if ((st = prism_telemetry_append(&r->out, r->policy, &res.summary, ts, NULL)))
            return prism_error_set(err, st, "out of memory");
        if (fwrite(r->out.data, 1, r->out.len, r->records) != r->out.len)
            return prism_error_set(err, PRISM_ERR_IO, "temporary file: %s", strerror(errno));
    }
    return PRISM_OK;
}

int prismctl_replay(int argc, char **argv)
{
    replay_options opt;
    int rc = parse_args(argc, argv, &opt);
    if (rc >= 0)
        return rc;

    prism_error err = {0};
    prism_config cfg;
    prism_status st = opt.config_path ? prism_config_load_file(opt.config_path, &cfg, &err)
                                      : prism_config_init(&cfg, &err);
    if (st) {
        fprintf(stderr, "prismctl replay: %s\n", err.message);
        return st == PRISM_ERR_INVALID ? 2 : 1;
    }
    size_t len = 0;
    char *text = prism_file_read(opt.trace_path, &len, &err);
    if (!text) {
        fprintf(stderr, "prismctl replay: %s\n", err.message);
        prism_config_free(&cfg);
        return 1;
    }
    const char *name = strcmp(opt.trace_path, "-") == 0 ? "<stdin>" : opt.trace_path;
    long long world = opt.world_size ? opt.world_size : cfg.world_size;

    /* Pass 1: every line must parse, and ranks must fit the world size. */
    prism_trace_record rec;
    prism_trace_record_init(&rec);
    rank_set ranks = {0};
    prism_idmap_init(&ranks.seen);
    size_t pos = 0, line_no = 0, line_len, step_lines = 0;
    const char *line;
    rc = 0;
    while (rc == 0 && next_line(text, len, &pos, &line, &line_len)) {
        line_no++;
        if ((st = prism_trace_parse_line(line, line_len, &rec, &err))) {
            fprintf(stderr, "prismctl replay: %s:%zu: %s\n", name, line_no, err.message);
            rc = st == PRISM_ERR_INVALID ? 2 : 1;
        } else if (rec.kind == PRISM_TRACE_STEP) {
            step_lines++;
            if (world && rec.rank >= world) {
                fprintf(stderr, "prismctl replay: %s:%zu: rank: %u is not below the world size %lld\n", name,
                        line_no, rec.rank, world);
                rc = 2;
            } else if (!rank_set_add(&ranks, rec.rank)) {
                fprintf(stderr, "prismctl replay: out of memory\n");
                rc = 1;
            }
        }
    }
    if (ranks.count)
        qsort(ranks.ranks, ranks.count, sizeof *ranks.ranks, compare_u32);
    if (!world)
        world = ranks.count ? (long long)ranks.count : 1;

    /* Pass 2: replay. */
    replay_state r = {.opt = &opt};
    if (rc == 0) {
        r.policy = prism_policy_create(&cfg, &err);
        r.merger = r.policy ? prism_merger_create((uint32_t)world, cfg.step_timeout_ms, &err) : NULL;
        /* Offline, a trace may hold one rank's steps after another's: keep every step open
         * until all its ranks are in, and no block limit. */
        if (r.merger && prism_merger_set_limits(r.merger, step_lines > PRISM_MERGE_MAX_OPEN_STEPS ? step_lines
                                                                      : PRISM_MERGE_MAX_OPEN_STEPS,
                                                UINT32_MAX, &err)) {
            prism_merger_destroy(r.merger);
            r.merger = NULL;
        }
        r.records = r.merger ? tmpfile() : NULL;
        if (r.merger && !r.records)
            prism_error_set(&err, PRISM_ERR_IO, "cannot create a temporary file: %s", strerror(errno));
        if (!r.records) {
            fprintf(stderr, "prismctl replay: %s\n", err.message);
            rc = 1;
        }
    }
    pos = 0;
    line_no = 0;
    while (rc == 0 && next_line(text, len, &pos, &line, &line_len)) {
        line_no++;
        st = prism_trace_parse_line(line, line_len, &rec, &err);
        for (size_t i = 0; !st && rec.kind == PRISM_TRACE_LAYOUT && i < rec.count; i++)
            st = prism_policy_set_block_bytes(r.policy, rec.entries[i].block_id, rec.entries[i].bytes, &err);
        for (size_t i = 0; !st && rec.kind == PRISM_TRACE_CALIBRATION && i < rec.count; i++)
            st = prism_policy_set_calibration(r.policy, rec.format, rec.entries[i].block_id, rec.entries[i].value,
                                              &err);
        if (!st && rec.kind == PRISM_TRACE_STEP) {
            uint32_t rank = opt.world_size || cfg.world_size ? rec.rank : rank_index(&ranks, rec.rank);
            prism_merge_outcome outcome;
            st = prism_merger_add(r.merger, rank, rec.step, rec.has_loss, rec.loss, rec.blocks, rec.count, 0,
                                  &outcome, &err);
            if (!st)
                st = drain(&r, &err);
        }
        if (st) {
            fprintf(stderr, "prismctl replay: %s:%zu: %s\n", name, line_no, err.message);
            rc = st == PRISM_ERR_INVALID ? 2 : 1;
        }
    }
    if (rc == 0) {
        prism_merger_close_all(r.merger);
        if ((st = drain(&r, &err))) {
            fprintf(stderr, "prismctl replay: %s: end of trace: %s\n", name, err.message);
            rc = st == PRISM_ERR_INVALID ? 2 : 1;
        }
    }
    if (rc == 0 && (fflush(r.records) != 0 || fseek(r.records, 0, SEEK_SET) != 0)) {
        fprintf(stderr, "prismctl replay: temporary file: %s\n", strerror(errno));
        rc = 1;
    }
    char chunk[65536];
    size_t got;
    while (rc == 0 && (got = fread(chunk, 1, sizeof chunk, r.records)) > 0) {
        if (fwrite(chunk, 1, got, stdout) != got) {
            fprintf(stderr, "prismctl replay: stdout: %s\n", strerror(errno));
            rc = 1;
        }
    }
    if (rc == 0 && fflush(stdout) != 0) {
        fprintf(stderr, "prismctl replay: stdout: %s\n", strerror(errno));
        rc = 1;
    }
    if (rc == 0) {
        const prism_merge_counters *c = prism_merger_counters(r.merger);
        fprintf(stderr,
                "prismctl replay: %llu steps, %llu decisions, map_version %llu, world_size %lld, "
                "reports dropped: %llu late, %llu repeated; steps completed with ranks missing: %llu\n",
                (unsigned long long)r.steps, (unsigned long long)r.decisions,
                (unsigned long long)prism_policy_map_version(r.policy), world, (unsigned long long)c->dropped_late,
                (unsigned long long)c->dropped_duplicate, (unsigned long long)(c->closed_early + c->timed_out));
    }
    if (r.records)
        fclose(r.records);
    prism_buf_free(&r.out);
    prism_merger_destroy(r.merger);
    prism_policy_destroy(r.policy);
    prism_trace_record_free(&rec);
    free(ranks.ranks);
    prism_idmap_free(&ranks.seen);
    free(text);
    prism_config_free(&cfg);
    return rc;
}
