/* `prismctl replay`: runs the policy core over a recorded trace, exactly as prismd would over
 * the same reports, and prints one telemetry record (DESIGN 4.4) per decision; or, with
 * --sweep, runs one policy per config of a grid over the same parsed and merged steps and prints
 * one line per config. The trace is parsed once (replay_load.c) before anything replays, and
 * output is held back until the whole trace has replayed, so a bad line leaves stdout empty. */
#define _POSIX_C_SOURCE 200809L
#include "prismctl.h"
#include "replay.h"

#include "idmap.h"
#include "merge.h"
#include "telemetry.h"
#include "trace_bin.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

typedef struct replay_options {
    const char *config_path;
    const char *trace_path;
    const char *record_path;
    long long world_size; /* 0: derived */
    bool fixed_time;
    double timestamp;
    bool json_lines;      /* --format json */
    bool format_given;
    replay_sweep sweep;
} replay_options;

typedef struct option_spec {
    const char *name;
    const char *arg;
    const char *help;
} option_spec;

static const option_spec options[] = {
    {"--config", "FILE", "policy config JSON (bare or nested form); default: a binary trace's own, else the defaults"},
    {"--world-size", "N", "JSONL: ranks per step; default: the number of distinct ranks in the trace"},
    {"--timestamp", "SECONDS", "write this Unix time in every record (reproducible output); default: now"},
    {"--sweep", "KEY=V1,V2,...", "replay under every combination of these values (repeatable; see below)"},
    {"--format", "text|json", "--sweep's output: an aligned table (text, the default) or one JSON object per line"},
    {"--record", "FILE", "also write the binary trace of what was replayed (converts JSONL to binary)"},
    {"--help", NULL, "this text"},
};

static void replay_usage(FILE *out)
{
    fprintf(out,
            "usage: prismctl replay [OPTIONS] TRACE\n\n"
            "Replays gradient statistics through the policy and prints one telemetry JSON line per\n"
            "decision on stdout. TRACE may be - for standard input. It is a binary trace (what prismd\n"
            "records, `prismctl trace JOB`) or a JSONL one, told apart by content (a JSONL trace's\n"
            "first non-blank byte is '{'). The trace is read and checked whole before anything\n"
            "replays.\n\n"
            "A binary trace replays exactly as prismd decided live: its header's config is the policy\n"
            "config (unless --config is given: then the trace's configs are ignored, counted on\n"
            "stderr), a config record is set for the next decision as a PATCH was, layout and\n"
            "calibration records are given to the policy, merged steps go to it as they are (no\n"
            "merge, --world-size unused), and a step whose decision prismd followed with a new map\n"
            "version for a hybrid plan does so here when the replayed policy decides at that step too\n"
            "(prismd bumps only at a decision; under another update_interval_steps, say, a bump at a\n"
            "step that is no longer a decision is not applied). A trace whose older segments were\n"
            "dropped, or that continues after a restart of prismd, replays with a note: its decisions\n"
            "from there may differ from the live ones; one whose segment numbers skip, or with a\n"
            "header saying prismd lost records before it (a failed write), with a warning. Errors\n"
            "name the record and its byte offset.\n"
            "A file that is text but not JSONL (its first non-blank byte not '{') gets the JSONL\n"
            "reader's message for its first line.\n\n"
            "JSONL trace lines:\n"
            "  {\"step\": S, \"rank\": R, \"loss\": L, \"blocks\": [{\"id\": I, \"l2\": X, \"max_abs\": X,\n"
            "    \"mean\": X, \"variance\": X, \"numel\": N, \"nonfinite\": N, \"saturated\": F,\n"
            "    \"underflowed\": F}]}   rank, loss, mean, variance, nonfinite optional; saturated and\n"
            "    underflowed (the step's fractions in [0, 1], issue 17) both or neither\n"
            "  {\"calibration\": {\"format\": \"int8\", \"errors\": {\"<id>\": E}}}   from that line on\n"
            "  {\"layout\": {\"blocks\": [{\"id\": I, \"name\": \"...\", \"param_bytes_bf16\": B}]}}\n"
            "A step completes when every rank reported it; steps still open at the end complete in\n"
            "order. A bad line or config prints FILE:LINE: KEY: problem on stderr and exits 2.\n"
            "Each record carries \"loss\" when its decision step had one (the mean over the ranks that\n"
            "sent a finite one), as prismd's telemetry does. The loss and the saturation figures go\n"
            "to the policy as prismd gives them (loss spikes, the saturation rule: DESIGN 4.7).\n\n"
            "--sweep KEY=V1,V2,... (repeatable, each key once) replays the trace under every\n"
            "combination of the values given (the first key varying slowest, the last fastest; at most\n"
            "%d combinations), each a policy of its own over the same parsed and merged steps, in\n"
            "one pass. Memory: each combination keeps state for every block of the trace (about %d\n"
            "bytes a block at history_window 5, about 8 more per window step over that), so the\n"
            "combinations times the trace's distinct block ids may be at most %d (about %d GB at\n"
            "history_window 5); this is checked once the trace is loaded, and exits 2 naming the\n"
            "numbers. A combination's config is the base config (--config's, else the trace's)\n"
            "with its values applied as a PATCH would apply them; a config the trace sets later gets\n"
            "the same values applied. Values are split at commas outside [...], {...} and \"...\"; each\n"
            "is JSON (0.5, true, null, \"fp8_e4m3\", [1,2]) or a bare word taken as a string\n"
            "(mode=static,dynamic). The config loader checks them: a bad key or value exits 2 naming\n"
            "it. world_size and step_timeout_ms cannot be swept (they shape the merge). Example:\n"
            "  prismctl replay --sweep bf16_threshold=0.5,0.6 --sweep 'force_bf16_blocks=[],[0,1]' run.trace\n"
            "(quote a value with [ ] { } or \" for the shell). A value left open (an unclosed [, { or\n"
            "string) exits 2 naming the key and the value.\n"
            "Instead of telemetry, a sweep prints a header line and one line per combination:\n"
            "  the values;\n"
            "  saving_end_pct: estimated_bandwidth_saving_pct of the last decision (- without one);\n"
            "  saving_avg_pct: the mean, over every step the policy completed, of the saving of the\n"
            "    last decision at or before that step (0 before the first decision);\n"
            "  switches: precision changes over the run (the sum of the records' precision_changes);\n"
            "  blocks_switched_more_than_once: blocks whose precision changed at two decisions or more;\n"
            "  first_decision_step: the step of the first decision (- without one);\n"
            "  decisions: how many decisions the run made.\n"
            "--format json prints each line as {\"config\": {KEY: VALUE...}, \"saving_end_pct\",\n"
            "\"saving_avg_pct\", \"switches\", \"blocks_switched_more_than_once\", \"first_decision_step\",\n"
            "\"decisions\", \"steps\"}, numbers exact, null where text shows -.\n\n"
            "--record FILE writes the binary trace of the replay: a header with the config the replay\n"
            "started with, layout and calibration records, the configs it applied, and every merged\n"
            "step in order. Replaying FILE without --config gives the same records. Not with --sweep.\n\n"
            "Options:\n",
            REPLAY_SWEEP_MAX_COMBINATIONS, REPLAY_SWEEP_BYTES_PER_BLOCK, REPLAY_SWEEP_MAX_BLOCK_STATES,
            (int)((double)REPLAY_SWEEP_MAX_BLOCK_STATES * REPLAY_SWEEP_BYTES_PER_BLOCK / 1e9 + 0.5));
    for (size_t i = 0; i < sizeof options / sizeof options[0]; i++) {
        char left[40];
        snprintf(left, sizeof left, "%s%s%s", options[i].name, options[i].arg ? " " : "",
                 options[i].arg ? options[i].arg : "");
        fprintf(out, "  %-26s %s\n", left, options[i].help);
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
            } else if (strcmp(spec->name, "--record") == 0) {
                o->record_path = value;
            } else if (strcmp(spec->name, "--format") == 0) {
                if (strcmp(value, "text") != 0 && strcmp(value, "json") != 0) {
                    fprintf(stderr, "prismctl replay: --format: \"%s\" is not text or json\n", value);
                    return 2;
                }
                o->json_lines = strcmp(value, "json") == 0;
                o->format_given = true;
            } else if (strcmp(spec->name, "--sweep") == 0) {
                prism_error err = {0};
                prism_status st = replay_sweep_add(&o->sweep, value, &err);
                if (st) {
                    fprintf(stderr, "prismctl replay: %s\n", err.message);
                    return st == PRISM_ERR_NOMEM ? 1 : 2;
                }
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
    if (o->format_given && !o->sweep.nkeys) {
        fprintf(stderr, "prismctl replay: --format applies to --sweep's output only\n");
        return 2;
    }
    if (o->record_path && o->sweep.nkeys) {
        fprintf(stderr, "prismctl replay: --record and --sweep do not go together (record with one config)\n");
        return 2;
    }
    return -1;
}

static double now_seconds(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* The config as the writers put it in a trace: compact JSON of every key. NULL: out of memory. */
static char *config_json_text(const prism_config *cfg)
{
    json_t *obj = prism_config_to_json(cfg);
    char *text = obj ? prism_json_dumps_exact(obj, JSON_COMPACT) : NULL;
    json_decref(obj);
    return text;
}

/* One policy of the replay (one per --sweep combination) and what a sweep reports of it. */
typedef struct runner {
    prism_policy *policy;
    json_t *overlay;          /* the combination's values; NULL without --sweep */
    uint64_t steps, decisions, switches;
    bool decided;
    uint64_t first_decision_step;
    double saving;            /* of the last decision */
    double saving_sum;        /* over steps, of the saving in force after each */
    prism_idmap switched;     /* block id -> index into counts */
    uint32_t *counts;         /* decisions that changed the block */
    size_t ncounts, cap_counts;
    size_t twice;             /* blocks with counts >= 2 */
} runner;

typedef struct replay {
    const replay_options *opt;
    const replay_trace *trace;
    runner *runners;
    size_t nrunners;
    FILE *records;            /* telemetry held back until the end; NULL with --sweep */
    prism_buf out;
    /* --record */
    FILE *rec_file;
    prism_buf rec;
    bool rec_header;
    /* binary traces */
    uint64_t headers, configs_ignored, first_segment, last_segment;
    bool restored;
    /* Holes in a binary trace: segment numbers that skip (segments missing between two), and
     * headers saying prismd lost records before them; the first of each for the warning. */
    uint64_t skips, skip_after, skip_to;
    uint64_t losses, loss_segment;
} replay;

static prism_status nomem(prism_error *err)
{
    return prism_error_set(err, PRISM_ERR_NOMEM, "out of memory");
}

/* Writes what --record holds to its file once it is large. */
static prism_status record_flush(replay *r, bool all, prism_error *err)
{
    if (!r->rec_file || (!all && r->rec.len < (1u << 20)))
        return PRISM_OK;
    if (r->rec.len && fwrite(r->rec.data, 1, r->rec.len, r->rec_file) != r->rec.len)
        return prism_error_set(err, PRISM_ERR_IO, "%s: %s", r->opt->record_path, strerror(errno));
    r->rec.len = 0;
    return PRISM_OK;
}

/* The first policy made: --record's header carries its config. */
static prism_status record_header(replay *r, const prism_config *cfg, prism_error *err)
{
    if (!r->rec_file || r->rec_header)
        return PRISM_OK;
    r->rec_header = true;
    double t = r->opt->fixed_time ? r->opt->timestamp : now_seconds();
    return prism_trace_bin_header(&r->rec, "replay", 1, (uint64_t)(t * 1000.0), cfg, false, err);
}

/* The config a runner gets for a config of the trace (or the base one): the sweep's values on
 * top. */
static prism_status runner_config(const runner *u, const prism_config *base, prism_config *out, prism_error *err)
{
    prism_status st = u->overlay ? prism_config_apply_json(base, u->overlay, "", out, err)
                                 : prism_config_copy(out, base, err);
    if (st && u->overlay)
        prism_error_prefix(err, "--sweep");
    return st;
}

/* Gives every runner a config: the first makes its policy; a header's is set only when it
 * differs from the runner's next config (a later segment repeats the config in force); a config
 * record's is set for the next decision. */
static prism_status apply_config(replay *r, const prism_config *cfg, bool header, prism_error *err)
{
    prism_status st = PRISM_OK;
    for (size_t i = 0; i < r->nrunners && !st; i++) {
        runner *u = &r->runners[i];
        prism_config mine;
        if ((st = runner_config(u, cfg, &mine, err)))
            return st;
        if (!u->policy) {
            u->policy = prism_policy_create(&mine, err);
            st = u->policy ? record_header(r, &mine, err) : PRISM_ERR_INVALID;
        } else {
            bool differs = true;
            if (header) {
                char *a = config_json_text(prism_policy_next_config(u->policy));
                char *b = config_json_text(&mine);
                st = a && b ? PRISM_OK : nomem(err);
                differs = a && b && strcmp(a, b) != 0;
                free(a);
                free(b);
            }
            if (!st && differs && !(st = prism_policy_set_config(u->policy, &mine, err)) && r->rec_file && i == 0)
                st = prism_trace_bin_config(&r->rec, &mine, err);
        }
        prism_config_free(&mine);
    }
    return st;
}

/* Counts the changes of one decision for the sweep's figures. */
static prism_status count_switches(runner *u, const prism_step_result *res, prism_error *err)
{
    u->switches += res->summary.precision_changes;
    for (size_t c = res->change_count - res->summary.precision_changes; c < res->change_count; c++) {
        uint32_t id = res->changes[c].block_id;
        uint32_t k = prism_idmap_get(&u->switched, id);
        if (k == PRISM_IDMAP_NONE) {
            if (u->ncounts == u->cap_counts) {
                size_t ncap = u->cap_counts ? u->cap_counts * 2 : 64;
                uint32_t *n = realloc(u->counts, ncap * sizeof *n);
                if (!n)
                    return nomem(err);
                u->counts = n;
                u->cap_counts = ncap;
            }
            k = (uint32_t)u->ncounts;
            u->counts[u->ncounts++] = 0;
            if (prism_idmap_put(&u->switched, id, k))
                return nomem(err);
        }
        if (++u->counts[k] == 2)
            u->twice++;
    }
    return PRISM_OK;
}

/* Feeds one merged step to every runner (and --record). When version_bumped and the runner's
 * policy decided at this step, the decision is followed by a new map version of the same
 * precisions, as prismd's was for a hybrid plan (prismd bumps only at a decision), and the
 * record shows that version; a runner that made no decision at the step (another
 * update_interval_steps, say) bumps nothing. --record writes the bump as this replay made it. */
static prism_status feed_step(replay *r, const prism_merged_step *m, bool version_bumped, prism_error *err)
{
    prism_status st;
    bool bumped_first = false;
    for (size_t i = 0; i < r->nrunners; i++) {
        runner *u = &r->runners[i];
        prism_step_result res;
        if ((st = prism_policy_add_step(u->policy, m->step, m->has_loss ? &m->loss : NULL, m->blocks, m->count,
                                        &res, err)))
            return st;
        u->steps++;
        if (version_bumped && res.decided) {
            res.summary.map_version = prism_policy_bump_version(u->policy);
            bumped_first = bumped_first || i == 0;
        }
        if (res.decided) {
            u->decisions++;
            if (!u->decided)
                u->first_decision_step = m->step;
            u->decided = true;
            u->saving = res.summary.bandwidth_saving_pct;
            if ((st = count_switches(u, &res, err)))
                return st;
            if (r->records) {
                r->out.len = 0;
                double ts = r->opt->fixed_time ? r->opt->timestamp : now_seconds();
                if (prism_telemetry_append(&r->out, u->policy, &res.summary, ts, m->has_loss ? &m->loss : NULL))
                    return nomem(err);
                if (fwrite(r->out.data, 1, r->out.len, r->records) != r->out.len)
                    return prism_error_set(err, PRISM_ERR_IO, "temporary file: %s", strerror(errno));
            }
        }
        u->saving_sum += u->decided ? u->saving : 0.0;
    }
    if (r->rec_file) {
        if ((st = prism_trace_bin_step(&r->rec, m, bumped_first, err)) || (st = record_flush(r, false, err)))
            return st;
    }
    return PRISM_OK;
}

static prism_status drain(replay *r, prism_merger *merger, prism_error *err)
{
    prism_merged_step m;
    while (prism_merger_next(merger, 0, &m)) {
        prism_status st = feed_step(r, &m, false, err);
        if (st)
            return st;
    }
    return PRISM_OK;
}

static prism_status apply_layout(replay *r, const replay_event *e, prism_error *err)
{
    const prism_trace_entry *en = e->count ? r->trace->entries + e->first : NULL;
    prism_status st = PRISM_OK;
    for (size_t i = 0; i < r->nrunners && !st; i++)
        for (size_t k = 0; k < e->count && !st; k++)
            st = prism_policy_set_block_bytes(r->runners[i].policy, en[k].block_id, en[k].bytes, err);
    if (!st && r->rec_file) {
        uint32_t *ids = malloc((e->count ? e->count : 1) * sizeof *ids);
        uint64_t *bytes = malloc((e->count ? e->count : 1) * sizeof *bytes);
        if (!ids || !bytes)
            st = nomem(err);
        for (size_t k = 0; !st && k < e->count; k++) {
            ids[k] = en[k].block_id;
            bytes[k] = en[k].bytes;
        }
        if (!st)
            st = prism_trace_bin_layout(&r->rec, ids, bytes, e->count, err);
        free(ids);
        free(bytes);
    }
    return st;
}

static prism_status apply_calibration(replay *r, const replay_event *e, prism_error *err)
{
    const prism_trace_entry *en = e->count ? r->trace->entries + e->first : NULL;
    uint32_t *ids = malloc((e->count ? e->count : 1) * sizeof *ids);
    double *errors = malloc((e->count ? e->count : 1) * sizeof *errors);
    prism_status st = ids && errors ? PRISM_OK : nomem(err);
    for (size_t k = 0; !st && k < e->count; k++) {
        ids[k] = en[k].block_id;
        errors[k] = en[k].value;
    }
    size_t bad = 0;
    for (size_t i = 0; i < r->nrunners && !st; i++)
        st = prism_policy_set_calibrations(r->runners[i].policy, e->format, ids, errors, e->count, &bad, err);
    if (!st && r->rec_file)
        st = prism_trace_bin_calibration(&r->rec, e->format, ids, errors, e->count, err);
    free(ids);
    free(errors);
    return st;
}

/* True when the combination i applies on base (the loader's per-key and cross-key rules). */
static prism_status combination_valid(const replay_sweep *s, size_t i, const prism_config *base, bool *valid,
                                      prism_error *err)
{
    json_t *overlay = replay_sweep_overlay(s, i);
    if (!overlay)
        return nomem(err);
    prism_config out;
    prism_status st = prism_config_apply_json(base, overlay, "", &out, err);
    json_decref(overlay);
    if (st == PRISM_ERR_NOMEM)
        return st;
    *valid = st == PRISM_OK;
    if (*valid)
        prism_config_free(&out);
    return PRISM_OK;
}

/* Every combination's config is checked on the base config before anything replays. A value that
 * fails in every combination it is part of is named alone ("--sweep KEY=VALUE: ..."); a value that
 * fails on the base config alone but passes together with the other keys' values (a grid that moves
 * both thresholds) is fine. Then a combination that fails is named with its values. */
static prism_status check_sweep(const replay_sweep *s, const prism_config *base, prism_error *err)
{
    for (size_t k = 0; k < s->nkeys; k++) {
        for (size_t v = 0; v < json_array_size(s->keys[k].values); v++) {
            json_t *one = json_object();
            prism_config out;
            if (!one || json_object_set(one, s->keys[k].name, json_array_get(s->keys[k].values, v))) {
                json_decref(one);
                return nomem(err);
            }
            prism_error alone = {0};
            prism_status st = prism_config_apply_json(base, one, "", &out, &alone);
            json_decref(one);
            if (st == PRISM_OK) {
                prism_config_free(&out);
                continue;
            }
            if (st == PRISM_ERR_NOMEM)
                return nomem(err);
            bool some_valid = false;
            for (size_t i = 0; i < s->combinations && !some_valid; i++) {
                if (replay_sweep_value_index(s, i, k) != v)
                    continue;
                prism_error ignored = {0};
                if (combination_valid(s, i, base, &some_valid, &ignored))
                    return nomem(err);
            }
            if (!some_valid) {
                *err = alone;
                prism_error_prefix(err, "--sweep %s=%s", s->keys[k].name, s->keys[k].texts[v]);
                return st;
            }
        }
    }
    for (size_t i = 0; i < s->combinations; i++) {
        bool valid = false;
        prism_status st = combination_valid(s, i, base, &valid, err);
        if (st)
            return st;
        if (valid)
            continue;
        char values[512] = "";
        size_t used = 0;
        for (size_t k = 0; k < s->nkeys && used < sizeof values; k++)
            used += (size_t)snprintf(values + used, sizeof values - used, "%s%s=%s", k ? ", " : "",
                                     s->keys[k].name, s->keys[k].texts[replay_sweep_value_index(s, i, k)]);
        prism_error_prefix(err, "--sweep combination %zu (%s)", i + 1, values);
        return PRISM_ERR_INVALID;
    }
    return PRISM_OK;
}

/* A binary trace's header or config record. */
static prism_status apply_trace_config(replay *r, const replay_event *e, bool user_config, prism_error *err)
{
    if (e->kind == REPLAY_HEADER) {
        if (r->headers && e->step != r->last_segment + 1 && r->skips++ == 0) {
            r->skip_after = r->last_segment;
            r->skip_to = e->step;
        }
        if (e->gap_before && r->losses++ == 0)
            r->loss_segment = e->step;
        if (r->headers++ == 0)
            r->first_segment = e->step;
        r->last_segment = e->step;
        r->restored = r->restored || e->restored;
    }
    if (user_config) {
        r->configs_ignored++;
        return PRISM_OK;
    }
    if (e->kind == REPLAY_CONFIG && !r->runners[0].policy)
        return prism_error_set(err, PRISM_ERR_INVALID,
                               "a config record before the first header (give --config to replay it)");
    const char *text = r->trace->configs[e->config];
    prism_config cfg;
    prism_status st = prism_config_load_buffer(text, strlen(text),
                                               e->kind == REPLAY_HEADER ? "header.config_json" : "config_json", &cfg,
                                               err);
    if (st)
        return st;
    if (!r->runners[0].policy && r->opt->sweep.nkeys)
        st = check_sweep(&r->opt->sweep, &cfg, err);
    if (!st)
        st = apply_config(r, &cfg, e->kind == REPLAY_HEADER, err);
    prism_config_free(&cfg);
    return st;
}

static int compare_u32(const void *a, const void *b)
{
    uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
    return (x > y) - (x < y);
}

/* Replays every event of the trace. base: the config to start with (--config's, or a JSONL
 * trace's defaults); NULL: the binary trace's first header gives it. On failure *at is the event
 * at fault (NULL: the end of the trace). */
static prism_status run(replay *r, const prism_config *base, bool user_config, long long world,
                        const prism_merge_counters *counters_out[], prism_merger **merger_out, prism_error *err,
                        const replay_event **at)
{
    const replay_trace *t = r->trace;
    prism_status st = PRISM_OK;
    *at = NULL;
    if (base && (st = apply_config(r, base, false, err)))
        return st;
    prism_merger *merger = NULL;
    if (!t->binary) {
        merger = prism_merger_create((uint32_t)world, base->step_timeout_ms, err);
        /* Offline, a trace may hold one rank's steps after another's: keep every step open until
         * all its ranks are in, and no block limit. */
        size_t open = t->step_events > PRISM_MERGE_MAX_OPEN_STEPS ? t->step_events : PRISM_MERGE_MAX_OPEN_STEPS;
        if (!merger || prism_merger_set_limits(merger, open, UINT32_MAX, err)) {
            prism_merger_destroy(merger);
            return PRISM_ERR_NOMEM;
        }
        *merger_out = merger;
        counters_out[0] = prism_merger_counters(merger);
    }
    bool dense = !t->binary && !r->opt->world_size && !base->world_size;
    for (size_t i = 0; i < t->nevents && !st; i++) {
        const replay_event *e = &t->events[i];
        *at = e;
        if (e->kind == REPLAY_HEADER || e->kind == REPLAY_CONFIG) {
            st = apply_trace_config(r, e, user_config, err);
        } else if (!r->runners[0].policy) {
            st = prism_error_set(err, PRISM_ERR_INVALID,
                                 "the trace does not start with a header (its config); give --config to replay it");
        } else if (e->kind == REPLAY_LAYOUT) {
            st = apply_layout(r, e, err);
        } else if (e->kind == REPLAY_CALIBRATION) {
            st = apply_calibration(r, e, err);
        } else if (e->merged) {
            const prism_block_stats *blocks = e->count ? t->blocks + e->first : NULL;
            prism_merged_step m = {e->step, e->rank, e->has_loss, e->loss, blocks, e->count};
            st = feed_step(r, &m, e->version_bumped, err);
        } else {
            uint32_t rank = e->rank;
            if (dense)
                rank = (uint32_t)((const uint32_t *)bsearch(&rank, t->ranks, t->nranks, sizeof *t->ranks,
                                                            compare_u32) - t->ranks);
            const prism_block_stats *blocks = e->count ? t->blocks + e->first : NULL;
            prism_merge_outcome outcome;
            st = prism_merger_add(merger, rank, e->step, e->has_loss, e->loss, blocks, e->count, 0, &outcome, err);
            if (!st)
                st = drain(r, merger, err);
        }
    }
    if (!st && merger) {
        *at = NULL;
        prism_merger_close_all(merger);
        st = drain(r, merger, err);
    }
    if (!st && !r->runners[0].policy) {
        *at = NULL;
        st = prism_error_set(err, PRISM_ERR_INVALID, "the trace has no records");
    }
    return st;
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
    return 0;
}

static prism_status append_spaces(prism_buf *out, size_t n)
{
    static const char spaces[] = "                                ";
    prism_status st = PRISM_OK;
    for (size_t chunk; n > 0 && !st; n -= chunk) {
        chunk = n < sizeof spaces - 1 ? n : sizeof spaces - 1;
        st = prism_buf_append(out, spaces, chunk);
    }
    return st;
}

/* --sweep's lines: the table (text) or one JSON object per combination. */
static prism_status print_sweep(const replay *r, prism_error *err)
{
    const replay_sweep *s = &r->opt->sweep;
    static const char *const metrics[] = {"saving_end_pct", "saving_avg_pct", "switches",
                                          "blocks_switched_more_than_once",
                                          "first_decision_step", "decisions"};
    enum { NMETRICS = sizeof metrics / sizeof metrics[0] };
    prism_buf out = {0};
    prism_status st = PRISM_OK;
#define PUT(text) (st = st ? st : prism_buf_append(&out, (text), strlen(text)))
    if (r->opt->json_lines) {
        for (size_t i = 0; i < r->nrunners; i++) {
            const runner *u = &r->runners[i];
            char num[160];
            PUT("{\"config\":{");
            for (size_t k = 0; k < s->nkeys; k++) {
                PUT(k ? ",\"" : "\"");
                PUT(s->keys[k].name);
                PUT("\":");
                PUT(s->keys[k].texts[replay_sweep_value_index(s, i, k)]);
            }
            PUT("},\"saving_end_pct\":");
            if (u->decided)
                st = st ? st : prism_buf_append_double(&out, u->saving);
            else
                PUT("null");
            PUT(",\"saving_avg_pct\":");
            st = st ? st : prism_buf_append_double(&out, u->steps ? u->saving_sum / (double)u->steps : 0.0);
            snprintf(num, sizeof num, ",\"switches\":%llu,\"blocks_switched_more_than_once\":%zu,"
                     "\"first_decision_step\":", (unsigned long long)u->switches, u->twice);
            PUT(num);
            if (u->decided)
                snprintf(num, sizeof num, "%llu", (unsigned long long)u->first_decision_step);
            else
                snprintf(num, sizeof num, "null");
            PUT(num);
            snprintf(num, sizeof num, ",\"decisions\":%llu,\"steps\":%llu}\n", (unsigned long long)u->decisions,
                     (unsigned long long)u->steps);
            PUT(num);
        }
    } else {
        /* Every cell as text first, then the columns padded to their widest cell. A value's cell
         * is its text (as long as it is); a figure's is written into figs (short numbers). */
        enum { FIG = 32 };
        size_t ncols = s->nkeys + NMETRICS, nrows = r->nrunners + 1;
        const char **cells = calloc(ncols * nrows, sizeof *cells);
        char (*figs)[FIG] = calloc(r->nrunners * NMETRICS + 1, sizeof *figs);
        size_t *width = calloc(ncols, sizeof *width);
        if (!cells || !figs || !width) {
            free(cells);
            free(figs);
            free(width);
            return nomem(err);
        }
        for (size_t c = 0; c < ncols; c++)
            cells[c] = c < s->nkeys ? s->keys[c].name : metrics[c - s->nkeys];
        for (size_t i = 0; i < r->nrunners; i++) {
            const runner *u = &r->runners[i];
            const char **row = cells + (i + 1) * ncols;
            for (size_t k = 0; k < s->nkeys; k++)
                row[k] = s->keys[k].texts[replay_sweep_value_index(s, i, k)];
            char (*m)[FIG] = figs + i * NMETRICS;
            if (u->decided)
                snprintf(m[0], FIG, "%.1f", u->saving);
            else
                snprintf(m[0], FIG, "-");
            snprintf(m[1], FIG, "%.2f", u->steps ? u->saving_sum / (double)u->steps : 0.0);
            snprintf(m[2], FIG, "%llu", (unsigned long long)u->switches);
            snprintf(m[3], FIG, "%zu", u->twice);
            if (u->decided)
                snprintf(m[4], FIG, "%llu", (unsigned long long)u->first_decision_step);
            else
                snprintf(m[4], FIG, "-");
            snprintf(m[5], FIG, "%llu", (unsigned long long)u->decisions);
            for (size_t c = 0; c < NMETRICS; c++)
                row[s->nkeys + c] = m[c];
        }
        for (size_t i = 0; i < nrows * ncols; i++)
            if (strlen(cells[i]) > width[i % ncols])
                width[i % ncols] = strlen(cells[i]);
        for (size_t row = 0; row < nrows && !st; row++) {
            for (size_t c = 0; c < ncols; c++) {
                /* values left-aligned, figures right-aligned; the last column not padded on the right */
                const char *cell = cells[row * ncols + c];
                size_t pad = width[c] - strlen(cell);
                bool left = c < s->nkeys;
                if (!left)
                    st = st ? st : append_spaces(&out, pad);
                PUT(cell);
                if (left)
                    st = st ? st : append_spaces(&out, pad);
                PUT(c + 1 == ncols ? "\n" : "  ");
            }
        }
        free(cells);
        free(figs);
        free(width);
    }
#undef PUT
    if (st) {
        prism_buf_free(&out);
        return nomem(err);
    }
    if (out.len && fwrite(out.data, 1, out.len, stdout) != out.len)
        st = prism_error_set(err, PRISM_ERR_IO, "stdout: %s", strerror(errno));
    prism_buf_free(&out);
    return st;
}

static int exit_code(prism_status st)
{
    return st == PRISM_ERR_INVALID || st == PRISM_ERR_STATE || st == PRISM_ERR_LIMIT ? 2 : 1;
}

int prismctl_replay(int argc, char **argv)
{
    replay_options opt;
    int rc = parse_args(argc, argv, &opt);
    if (rc >= 0) {
        replay_sweep_free(&opt.sweep);
        return rc;
    }
    rc = 0;
    prism_error err = {0};
    prism_config cfg;
    prism_status st = opt.config_path ? prism_config_load_file(opt.config_path, &cfg, &err)
                                      : prism_config_init(&cfg, &err);
    if (st) {
        fprintf(stderr, "prismctl replay: %s\n", err.message);
        replay_sweep_free(&opt.sweep);
        return st == PRISM_ERR_INVALID ? 2 : 1;
    }
    size_t len = 0;
    char *text = prism_file_read(opt.trace_path, &len, &err);
    if (!text) {
        fprintf(stderr, "prismctl replay: %s\n", err.message);
        prism_config_free(&cfg);
        replay_sweep_free(&opt.sweep);
        return 1;
    }
    const char *name = strcmp(opt.trace_path, "-") == 0 ? "<stdin>" : opt.trace_path;
    long long world = opt.world_size ? opt.world_size : cfg.world_size;

    replay_trace trace;
    replay r = {.opt = &opt, .trace = &trace};
    char *rec_tmp = NULL;
    const prism_merge_counters *counters[1] = {NULL};
    prism_merger *merger = NULL;
    const replay_event *at = NULL;
    st = replay_trace_load(&trace, name, text, len, world, &err);
    if (st) {
        fprintf(stderr, "prismctl replay: %s\n", err.message);
        rc = exit_code(st);
    }
    /* A JSONL trace starts from --config or the defaults, a binary one from --config or its header. */
    bool user_config = opt.config_path != NULL;
    const prism_config *base = user_config || !trace.binary ? &cfg : NULL;
    if (!trace.binary && !world)
        world = trace.nranks ? (long long)trace.nranks : 1;
    if (rc == 0 && opt.sweep.nkeys) {
        size_t blocks = 0;
        if ((st = replay_trace_count_blocks(&trace, &blocks, &err))) {
            fprintf(stderr, "prismctl replay: %s\n", err.message);
            rc = 1;
        } else if (blocks && opt.sweep.combinations > REPLAY_SWEEP_MAX_BLOCK_STATES / blocks) {
            fprintf(stderr, "prismctl replay: --sweep: %zu combinations x %zu blocks = %llu block states, more than "
                            "the %d a sweep holds in memory (each configuration keeps state for every block): "
                            "sweep fewer values, or split the sweep\n", opt.sweep.combinations, blocks,
                    (unsigned long long)opt.sweep.combinations * (unsigned long long)blocks,
                    REPLAY_SWEEP_MAX_BLOCK_STATES);
            rc = 2;
        }
    }
    if (rc == 0 && opt.sweep.nkeys && base && (st = check_sweep(&opt.sweep, base, &err))) {
        fprintf(stderr, "prismctl replay: %s\n", err.message);
        rc = exit_code(st);
    }
    if (rc == 0) {
        r.nrunners = opt.sweep.nkeys ? opt.sweep.combinations : 1;
        r.runners = calloc(r.nrunners, sizeof *r.runners);
        for (size_t i = 0; r.runners && i < r.nrunners; i++) {
            prism_idmap_init(&r.runners[i].switched);
            if (opt.sweep.nkeys && !(r.runners[i].overlay = replay_sweep_overlay(&opt.sweep, i)))
                rc = 1;
        }
        if (!r.runners || rc) {
            fprintf(stderr, "prismctl replay: out of memory\n");
            rc = 1;
        }
    }
    if (rc == 0 && !opt.sweep.nkeys && !(r.records = tmpfile())) {
        fprintf(stderr, "prismctl replay: cannot create a temporary file: %s\n", strerror(errno));
        rc = 1;
    }
    if (rc == 0 && opt.record_path) {
        size_t n = strlen(opt.record_path) + 32;
        rec_tmp = malloc(n);
        if (rec_tmp)
            snprintf(rec_tmp, n, "%s.partial-%ld", opt.record_path, (long)getpid());
        if (!rec_tmp || !(r.rec_file = fopen(rec_tmp, "wb"))) {
            fprintf(stderr, "prismctl replay: --record %s: %s\n", opt.record_path,
                    rec_tmp ? strerror(errno) : "out of memory");
            rc = 1;
        }
    }
    if (rc == 0 && (st = run(&r, base, user_config, world, counters, &merger, &err, &at))) {
        if (at)
            replay_event_prefix(&trace, at, &err);
        else
            prism_error_prefix(&err, "%s: end of trace", name);
        fprintf(stderr, "prismctl replay: %s\n", err.message);
        rc = exit_code(st);
    }
    if (rc == 0 && r.rec_file) {
        if ((st = record_flush(&r, true, &err)) || fclose(r.rec_file) != 0) {
            fprintf(stderr, "prismctl replay: --record %s: %s\n", opt.record_path, st ? err.message : strerror(errno));
            rc = 1;
        } else if (rename(rec_tmp, opt.record_path) != 0) {
            fprintf(stderr, "prismctl replay: --record %s: %s\n", opt.record_path, strerror(errno));
            rc = 1;
        }
        r.rec_file = NULL;
    }
    if (rc == 0 && r.records)
        rc = print_records(r.records);
    if (rc == 0 && opt.sweep.nkeys && (st = print_sweep(&r, &err))) {
        fprintf(stderr, "prismctl replay: %s\n", err.message);
        rc = 1;
    }
    if (rc == 0 && fflush(stdout) != 0) {
        fprintf(stderr, "prismctl replay: stdout: %s\n", strerror(errno));
        rc = 1;
    }
    if (rc == 0) {
        if (r.configs_ignored)
            fprintf(stderr, "prismctl replay: --config given: the trace's %llu configs (headers and PATCHes) "
                            "were ignored\n", (unsigned long long)r.configs_ignored);
        if (r.skips)
            fprintf(stderr, "prismctl replay: warning: the trace's segment numbers skip %llu time%s (the first: "
                            "segment %llu follows segment %llu): records in between are missing; decisions from "
                            "there may differ from the live ones\n",
                    (unsigned long long)r.skips, r.skips == 1 ? "" : "s", (unsigned long long)r.skip_to,
                    (unsigned long long)r.skip_after);
        if (r.losses)
            fprintf(stderr, "prismctl replay: warning: prismd lost records of the job before %llu segment%s (a "
                            "failed write; the first: segment %llu); decisions from there may differ from the "
                            "live ones\n", (unsigned long long)r.losses, r.losses == 1 ? "" : "s",
                    (unsigned long long)r.loss_segment);
        if (r.headers && (r.first_segment > 1 || r.restored))
            fprintf(stderr, "prismctl replay: note: the trace %s; decisions from there may differ from the live "
                            "ones\n", r.first_segment > 1 ? "starts after older segments were dropped"
                                                          : "continues after prismd restored the job");
        const runner *u = &r.runners[0];
        char what[160];
        if (opt.sweep.nkeys)
            snprintf(what, sizeof what, "%zu configurations, %llu steps each", r.nrunners,
                     (unsigned long long)u->steps);
        else
            snprintf(what, sizeof what, "%llu steps, %llu decisions, map_version %llu", (unsigned long long)u->steps,
                     (unsigned long long)u->decisions, (unsigned long long)prism_policy_map_version(u->policy));
        if (trace.binary) {
            fprintf(stderr, "prismctl replay: %s; binary trace: %zu records, segments %llu to %llu\n", what,
                    trace.nevents, (unsigned long long)r.first_segment, (unsigned long long)r.last_segment);
        } else {
            const prism_merge_counters *c = counters[0];
            fprintf(stderr, "prismctl replay: %s, world_size %lld, reports dropped: %llu late, %llu repeated; steps "
                            "completed with ranks missing: %llu\n", what, world, (unsigned long long)c->dropped_late,
                    (unsigned long long)c->dropped_duplicate,
                    (unsigned long long)(c->closed_early + c->timed_out));
        }
    }
    if (r.rec_file) {
        fclose(r.rec_file);
        remove(rec_tmp);
    }
    free(rec_tmp);
    prism_buf_free(&r.rec);
    if (r.records)
        fclose(r.records);
    prism_buf_free(&r.out);
    for (size_t i = 0; r.runners && i < r.nrunners; i++) {
        prism_policy_destroy(r.runners[i].policy);
        json_decref(r.runners[i].overlay);
        prism_idmap_free(&r.runners[i].switched);
        free(r.runners[i].counts);
    }
    free(r.runners);
    prism_merger_destroy(merger);
    replay_trace_free(&trace);
    free(text);
    prism_config_free(&cfg);
    replay_sweep_free(&opt.sweep);
    return rc;
}
