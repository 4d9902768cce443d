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
#include "trace_bin.h"

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
    fprintf(out, "usage: prismctl replay [OPTIONS] TRACE\n\n"
                 "Replays gradient statistics through the policy and prints one telemetry JSON line per\n"
                 "decision on stdout. TRACE may be - for standard input. It is a binary trace (what prismd\n"
                 "records, `prismctl trace JOB`) or a JSONL one, told apart by content (a JSONL trace's\n"
                 "first non-blank byte is '{').\n\n"
                 "A binary trace replays exactly as prismd decided live: its header's config is the policy\n"
                 "config (unless --config is given: then the trace's configs are ignored, counted on\n"
                 "stderr), a config record is set for the next decision as a PATCH was, layout and\n"
                 "calibration records are given to the policy, merged steps go to it as they are (no\n"
                 "merge, --world-size unused), and a step whose decision prismd followed with a new map\n"
                 "version for a hybrid plan does so here. A trace whose older segments were dropped, or\n"
                 "that continues after a restart of prismd, replays with a note: its decisions from there\n"
                 "may differ from the live ones. Errors name the record and its byte offset.\n\n"
                 "JSONL trace lines:\n"
                 "  {\"step\": S, \"rank\": R, \"loss\": L, \"blocks\": [{\"id\": I, \"l2\": X, \"max_abs\": X,\n"
                 "    \"mean\": X, \"variance\": X, \"numel\": N, \"nonfinite\": N}]}   rank, loss, mean,\n"
                 "    variance, nonfinite optional\n"
                 "  {\"calibration\": {\"format\": \"int8\", \"errors\": {\"<id>\": E}}}   from that line on\n"
                 "  {\"layout\": {\"blocks\": [{\"id\": I, \"name\": \"...\", \"param_bytes_bf16\": B}]}}\n"
                 "A step completes when every rank reported it; steps still open at the end complete in\n"
                 "order. A bad line or config prints FILE:LINE: KEY: problem on stderr and exits 2.\n"
                 "Each record carries \"loss\" when its decision step had one (the mean over the ranks that\n"
                 "sent one), as prismd's telemetry does.\n\n"
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

/* Feeds one merged step to the policy and holds back the record of its decision, if any. When
 * version_bumped, the decision is followed by a new map version of the same precisions, as
 * prismd's was for a hybrid plan, and the record shows that version. */
static prism_status feed_step(replay_state *r, const prism_merged_step *m, bool version_bumped, prism_error *err)
{
    prism_step_result res;
    prism_status st = prism_policy_add_step(r->policy, m->step, m->blocks, m->count, &res, err);
    if (st)
        return st;
    r->steps++;
    if (version_bumped)
        res.summary.map_version = prism_policy_bump_version(r->policy);
    if (!res.decided)
        return PRISM_OK;
    r->decisions++;
    r->out.len = 0;
    double ts = r->opt->fixed_time ? r->opt->timestamp : now_seconds();
    if ((st = prism_telemetry_append(&r->out, r->policy, &res.summary, ts, m->has_loss ? &m->loss : NULL)))
        return prism_error_set(err, st, "out of memory");
    if (fwrite(r->out.data, 1, r->out.len, r->records) != r->out.len)
        return prism_error_set(err, PRISM_ERR_IO, "temporary file: %s", strerror(errno));
    return PRISM_OK;
}

/* Feeds every ready merged step to the policy and holds back the decisions' records. */
static prism_status drain(replay_state *r, prism_error *err)
{
    prism_merged_step m;
    while (prism_merger_next(r->merger, 0, &m)) {
        prism_status st = feed_step(r, &m, false, err);
        if (st)
            return st;
    }
    return PRISM_OK;
}

/* Copies the held-back records to stdout. */
static int print_records(FILE *records)
{
    if (fflush(records) != 0 || fseek(records, 0, SEEK_SET) != 0) {
        fprintf(stderr, "prismctl replay: temporary file: %s\n", strerror(errno));
        return 1;
    }
    char chunk[65536];
    size_t got;
    while ((got = fread(chunk, 1, sizeof chunk, records)) > 0) {
        if (fwrite(chunk, 1, got, stdout) != got) {
            fprintf(stderr, "prismctl replay: stdout: %s\n", strerror(errno));
            return 1;
        }
    }
    if (fflush(stdout) != 0) {
        fprintf(stderr, "prismctl replay: stdout: %s\n", strerror(errno));
        return 1;
    }
    return 0;
}

/* The config as the writers put it in a trace: compact JSON of every key. NULL: out of memory. */
static char *config_json_text(const prism_config *cfg)
{
    json_t *obj = prism_config_to_json(cfg);
    char *text = obj ? prism_json_dumps_exact(obj, JSON_COMPACT) : NULL;
    json_decref(obj);
    return text;
}

/* What a binary replay counts besides steps and decisions. */
typedef struct binary_counts {
    uint64_t records, headers, configs_ignored, first_segment, last_segment;
    bool restored;
} binary_counts;

/* Applies one record of a binary trace (DESIGN 4.6) to the replay: a header's or a config
 * record's config (unless --config was given), a layout, a calibration, a merged step. The first
 * header creates the policy when no --config did. */
static prism_status apply_binary_record(replay_state *r, const prism_trace_record *rec, bool user_config,
                                        binary_counts *c, prism_error *err)
{
    prism_status st = PRISM_OK;
    if (rec->kind == PRISM_TRACE_HEADER) {
        if (c->headers++ == 0) {
            c->first_segment = rec->segment;
            c->restored = rec->restored;
        }
        c->last_segment = rec->segment;
        c->restored = c->restored || rec->restored;
    }
    if (rec->kind == PRISM_TRACE_HEADER || rec->kind == PRISM_TRACE_CONFIG) {
        if (user_config) {
            c->configs_ignored++;
            return PRISM_OK;
        }
        prism_config cfg;
        const char *where = rec->kind == PRISM_TRACE_HEADER ? "header.config_json" : "config_json";
        if ((st = prism_config_load_buffer(rec->config_json, strlen(rec->config_json), where, &cfg, err)))
            return st;
        if (!r->policy) {
            if (rec->kind == PRISM_TRACE_CONFIG) {
                prism_config_free(&cfg);
                return prism_error_set(err, PRISM_ERR_INVALID,
                                       "a config record before the first header (give --config to replay it)");
            }
            r->policy = prism_policy_create(&cfg, err);
            prism_config_free(&cfg);
            return r->policy ? PRISM_OK : PRISM_ERR_INVALID;
        }
        bool differs = true;
        if (rec->kind == PRISM_TRACE_HEADER) {
            /* A later segment's header repeats the config in force: set only a different one. */
            char *mine = config_json_text(prism_policy_next_config(r->policy));
            char *theirs = config_json_text(&cfg);
            if (!mine || !theirs)
                st = prism_error_set(err, PRISM_ERR_NOMEM, "out of memory");
            differs = mine && theirs && strcmp(mine, theirs) != 0;
            free(mine);
            free(theirs);
        }
        if (!st && differs)
            st = prism_policy_set_config(r->policy, &cfg, err);
        prism_config_free(&cfg);
        return st;
    }
    if (rec->kind == PRISM_TRACE_BLANK)
        return PRISM_OK;
    if (!r->policy)
        return prism_error_set(err, PRISM_ERR_INVALID,
                               "the trace does not start with a header (its config); give --config to replay it");
    if (rec->kind == PRISM_TRACE_LAYOUT) {
        for (size_t i = 0; !st && i < rec->count; i++)
            st = prism_policy_set_block_bytes(r->policy, rec->entries[i].block_id, rec->entries[i].bytes, err);
        return st;
    }
    if (rec->kind == PRISM_TRACE_CALIBRATION) {
        uint32_t *ids = malloc((rec->count ? rec->count : 1) * sizeof *ids);
        double *errors = malloc((rec->count ? rec->count : 1) * sizeof *errors);
        if (!ids || !errors)
            st = prism_error_set(err, PRISM_ERR_NOMEM, "out of memory");
        for (size_t i = 0; !st && i < rec->count; i++) {
            ids[i] = rec->entries[i].block_id;
            errors[i] = rec->entries[i].value;
        }
        size_t bad = 0;
        if (!st)
            st = prism_policy_set_calibrations(r->policy, rec->format, ids, errors, rec->count, &bad, err);
        free(ids);
        free(errors);
        return st;
    }
    prism_merged_step m = {.step = rec->step, .ranks = rec->ranks, .has_loss = rec->has_loss, .loss = rec->loss,
                           .blocks = rec->blocks, .count = rec->count};
    return feed_step(r, &m, rec->version_bumped, err);
}

/* Replays a binary trace (trace_bin.h); cfg is --config's, or NULL. Returns the exit status. */
static int replay_binary(const replay_options *opt, const prism_config *cfg, const char *name, const char *data,
                         size_t len)
{
    replay_state r = {.opt = opt};
    binary_counts c = {0};
    prism_error err = {0};
    int rc = 0;
    r.records = tmpfile();
    if (!r.records) {
        fprintf(stderr, "prismctl replay: cannot create a temporary file: %s\n", strerror(errno));
        return 1;
    }
    if (cfg && !(r.policy = prism_policy_create(cfg, &err))) {
        fprintf(stderr, "prismctl replay: %s\n", err.message);
        rc = 1;
    }
    prism_trace_bin_reader rd;
    prism_trace_bin_reader_init(&rd, data, len);
    prism_trace_record rec;
    prism_trace_record_init(&rec);
    while (rc == 0) {
        size_t start = rd.pos;
        prism_status st = prism_trace_bin_next(&rd, &rec, &err);
        if (!st && rec.kind == PRISM_TRACE_BLANK)
            break;
        if (!st && (st = apply_binary_record(&r, &rec, cfg != NULL, &c, &err)))
            prism_error_prefix(&err, "record %llu (byte %zu)", (unsigned long long)rd.records, start);
        if (st) {
            fprintf(stderr, "prismctl replay: %s: %s\n", name, err.message);
            rc = st == PRISM_ERR_INVALID || st == PRISM_ERR_STATE ? 2 : 1;
        }
    }
    c.records = rd.records;
    if (rc == 0 && !r.policy) {
        fprintf(stderr, "prismctl replay: %s: the trace has no records\n", name);
        rc = 2;
    }
    if (rc == 0)
        rc = print_records(r.records);
    if (rc == 0) {
        if (c.configs_ignored)
            fprintf(stderr, "prismctl replay: --config given: the trace's %llu configs (headers and PATCHes) "
                            "were ignored\n", (unsigned long long)c.configs_ignored);
        if (c.headers && (c.first_segment > 1 || c.restored))
            fprintf(stderr, "prismctl replay: note: the trace %s; decisions from there may differ from the live "
                            "ones\n", c.first_segment > 1 ? "starts after older segments were dropped"
                                                          : "continues after prismd restored the job");
        fprintf(stderr, "prismctl replay: %llu steps, %llu decisions, map_version %llu; binary trace: %llu "
                        "records, segments %llu to %llu\n", (unsigned long long)r.steps,
                (unsigned long long)r.decisions, (unsigned long long)prism_policy_map_version(r.policy),
                (unsigned long long)c.records, (unsigned long long)c.first_segment,
                (unsigned long long)c.last_segment);
    }
    fclose(r.records);
    prism_buf_free(&r.out);
    prism_policy_destroy(r.policy);
    prism_trace_record_free(&rec);
    return rc;
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
    if (prism_trace_is_binary(text, len)) {
        rc = replay_binary(&opt, opt.config_path ? &cfg : NULL, name, text, len);
        free(text);
        prism_config_free(&cfg);
        return rc;
    }
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
    if (rc == 0)
        rc = print_records(r.records);
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
