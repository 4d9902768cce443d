/* `prismctl plan PLAN.json`: the hybrid-devices model of issue 15 offline (service/policy/hybrid.h).
 * Reads and validates PLAN.json completely (every key checked for type, range and presence,
 * unknown keys refused), runs the allocation and prints one JSON object on one line. Bad input:
 * exit 2 with "prismctl plan: FILE: KEY: PROBLEM" on stderr and nothing on stdout; a start that
 * does not fit a class's memory: exit 1. */
#define _POSIX_C_SOURCE 200809L
#include "prismctl.h"

#include "hybrid.h"
#include "hybrid_json.h"
#include "json_kind.h"
#include "telemetry.h"

#include <jansson.h>
#include <math.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static void plan_usage(FILE *out)
{
    fputs(
        "usage: prismctl plan [--timing] PLAN.json\n"
        "\n"
        "Plans the compute precision of every block on every device class of a hybrid job (QSync;\n"
        "issue 15's model, DESIGN 11) and prints one JSON object on one line:\n"
        "  {\"iteration_seconds\", \"start_seconds\", \"indicator\", \"classes\": [{\"name\", \"fixed\",\n"
        "   \"low_format\", \"high_format\", \"plan\": [precision per block id], \"memory_bytes\",\n"
        "   \"budget_bytes\", \"compute_seconds\"}], \"baselines\": {\"uniform_low\": {\"iteration_seconds\",\n"
        "   \"indicator\", \"fits\"}, \"uniform_high\": {...}}, \"raises\": [{\"class\", \"block\", \"delta\",\n"
        "   \"accepted\", \"reason\"}]}\n"
        "PLAN may be - for standard input.\n"
        "\n"
        "PLAN.json (every key listed; any other key is refused):\n"
        "  {\"blocks\": [{\"id\": integer >= 0, \"name\": string, \"flops\": F, \"param_bytes_bf16\": W,\n"
        "     \"activation_bytes_bf16\": A, \"state_bytes\": S,\n"
        "     \"stats\": {\"x_l2\", \"x_max_abs\", \"x_numel\", \"w_l2\", \"w_max_abs\", \"w_numel\", \"g_l2\",\n"
        "               \"g_max_abs\", \"y_numel\"}}],\n"
        "   \"classes\": [{\"name\": string, \"ranks\": integer >= 1,\n"
        "     \"profile\": {\"memory_bytes\", \"bf16_ops_per_second\", \"fp16_ops_per_second\",\n"
        "       \"int8_ops_per_second\", \"fp8_ops_per_second\", \"quantize_cost\": {\"fixed_seconds\",\n"
        "       \"seconds_per_byte\"}, \"cast_cost\": {same}, \"h2d_bytes_per_second\", \"device_class\": string,\n"
        "       \"device_name\": string}}],\n"
        "   \"link\": {\"bytes_per_second\": > 0, \"latency_seconds\": >= 0},\n"
        "   \"config\": {\"fixed_classes\": [names], \"memory_fraction\": 0 < x <= 1 (0.9),\n"
        "     \"gamma\": >= 0 (4), \"low_format\": \"int8\" | \"fp8_e4m3\" | \"auto\" (auto),\n"
        "     \"force_bf16_blocks\": [ids] ([])}}\n"
        "  Every key is required except: config and its keys; the profile's four ops fields (missing:\n"
        "  0), cast_cost, h2d_bytes_per_second, device_class and device_name. blocks and classes hold at\n"
        "  least one entry. Numbers (bytes, FLOPs, ops, seconds, statistics) may be written as\n"
        "  integers or reals and must be >= 0, except x_numel and w_numel (>= 1); ids and ranks are\n"
        "  integers. Block ids are 0..L-1, each exactly once, in any order; the model uses id order.\n"
        "  Class names are non-empty and distinct. cast_cost and quantize_cost need both their keys.\n"
        "  y_numel may be 0. A name may repeat in fixed_classes and an id in force_bf16_blocks.\n"
        "  Duplicate keys in an object are a JSON syntax error.\n"
        "\n"
        "The model (issue 15) with these choices:\n"
        "  - Precisions: bf16, fp16, int8, fp8_e4m3; mantissa bits bf16 7, fp16 10, fp8_e4m3 3.\n"
        "  - High format: bf16 if bf16_ops_per_second > 0, else fp16. Low format: low_format; auto =\n"
        "    fp8_e4m3 if fp8_ops_per_second > 0, else int8. ops(bf16, fp16, int8, fp8_e4m3) = the\n"
        "    bf16, fp16, int8, fp8 ops field. Every class must have ops > 0 for its high format, and\n"
        "    every class that is not fixed for its low format, else exit 2 naming\n"
        "    classes[K].profile.FIELD (classes in file order, the high format first). A fixed class's\n"
        "    low_format is printed (resolved the same way) though it runs none of its blocks low.\n"
        "  - omega(high): the float formula with m = the high format's bits; omega(int8): the integer\n"
        "    formula, q = 127, k = the high format's bits; omega(fp8_e4m3): the float formula, m = 3.\n"
        "    epsilon(v) = frexp exponent, epsilon(0) = 0; eX = min(5, |epsilon(sqrt(x_l2/x_numel))|),\n"
        "    eW likewise, eG = min(5, |epsilon(g_max_abs)|). delta = omega(low) - omega(high).\n"
        "  - fwd_k(i, low) = F/ops + (fixed_seconds + seconds_per_byte * (W + A)) (W + A added first);\n"
        "    bwd_k(i, b) = (2 F) / ops(b'), b' = high for int8.\n"
        "  - f_k(i) = (sum of fwd over j = 0..L-1, left to right) + (sum of bwd from j = L-1 down to i);\n"
        "    end(i) = (max(max_k f_k(i), end(i+1)) + latency) + W_i / bytes_per_second;\n"
        "    T = max(end(0), max_k f_k(0)); compute_seconds = f_k(0).\n"
        "  - M_k = sum over blocks in id order of (state_bytes + activation_bytes_bf16 * bits / 16),\n"
        "    bits 8 (int8, fp8) or 16; budget = memory_fraction * memory_bytes (doubles).\n"
        "  - indicator = sum of omega over the non-fixed classes (file order) and blocks (id order);\n"
        "    ranks does not enter the model.\n"
        "  - Fixed classes: config fixed_classes (names; [] = none); absent: the classes whose\n"
        "    ops(high) equals the largest ops(high) (ties: all). They run every block high; their\n"
        "    memory is printed, not checked. All classes fixed: all high, raises [].\n"
        "  - Start: non-fixed classes all low except force_bf16_blocks (their high format). A start\n"
        "    over budget: exit 1, 'class \"NAME\" does not fit: its start needs M bytes, its budget is\n"
        "    B bytes' (M, B written like the JSON numbers); the first such class in file order.\n"
        "  - Raises: every pair low at the start, by decreasing delta, ties by class name (byte\n"
        "    order), then block id; kept iff M_k <= B_k and T <= T0 * (1 + 1e-9) (T0 = T of the start,\n"
        "    fixed); reason ok, memory (M_k > B_k) or time.\n"
        "  - Baselines: uniform_high = every class all high; uniform_low = non-fixed classes all low\n"
        "    (force_bf16_blocks ignored), fixed high; fits = every non-fixed class within budget.\n"
        "  - Doubles are printed as the shortest text that reads back exactly; block ids as integers.\n"
        "\n"
        "--timing: after the object, one line on stderr with the milliseconds spent reading and\n"
        "parsing PLAN.json, planning, and writing the output (CLOCK_MONOTONIC).\n"
        "\n"
        "Exit status: 0 planned; 1 a start does not fit (or out of memory, stdout unwritable);\n"
        "2 bad input or unreadable file: \"prismctl plan: FILE: KEY: PROBLEM\" (KEY a path such as\n"
        "blocks[3].stats.x_numel, [N] the entry's position in the file, not its id; a JSON syntax\n"
        "error: \"FILE:LINE:COLUMN: JSON syntax error: ...\"); only the first problem is reported.\n",
        out);
}

typedef struct reader {
    const char *file;
    bool failed;
} reader;

static void fail(reader *r, const char *key, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

/* Prints the first problem only: "prismctl plan: FILE: KEY: PROBLEM". */
static void fail(reader *r, const char *key, const char *fmt, ...)
{
    if (r->failed)
        return;
    r->failed = true;
    char problem[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(problem, sizeof problem, fmt, ap);
    va_end(ap);
    fprintf(stderr, "prismctl plan: %s: %s: %s\n", r->file, key, problem);
}

/* A value's kind for PLAN.json's messages, which tell an integer from a real. */
static const char *type_name(const json_t *v)
{
    if (json_is_integer(v))
        return "an integer";
    return json_is_real(v) ? "a real" : prism_json_kind(v);
}

static void join(char *out, size_t cap, const char *path, const char *key)
{
    snprintf(out, cap, "%s%s%s", path, path[0] ? "." : "", key);
}

/* Refuses any key of obj not in allowed (NULL-terminated). */
static bool only_keys(reader *r, const json_t *obj, const char *path, const char *const *allowed)
{
    const char *name;
    json_t *v;
    json_object_foreach((json_t *)obj, name, v) {
        bool ok = false;
        for (const char *const *a = allowed; *a && !ok; a++)
            ok = strcmp(*a, name) == 0;
        if (!ok) {
            char key[512];
            join(key, sizeof key, path, name);
            fail(r, key, "unknown key");
            return false;
        }
    }
    return true;
}

/* The value of a key of the given JSON kind; NULL (and a problem when required) when absent or of
 * another type. */
static json_t *get_kind(reader *r, const json_t *obj, const char *path, const char *name, bool required,
                        json_type kind, const char *kind_name)
{
    if (r->failed)
        return NULL;
    char key[512];
    join(key, sizeof key, path, name);
    json_t *v = json_object_get(obj, name);
    if (!v) {
        if (required)
            fail(r, key, "missing (required)");
        return NULL;
    }
    if (json_typeof(v) != kind) {
        fail(r, key, "expected %s, got %s", kind_name, type_name(v));
        return NULL;
    }
    return v;
}

typedef enum bound { AT_LEAST, ABOVE } bound;

/* A number (integer or real) >= lo (or > lo), optionally <= hi; *out keeps its value when the
 * key is absent and not required. */
static void get_number(reader *r, const json_t *obj, const char *path, const char *name, bool required,
                       double lo, bound how, const double *hi, double *out)
{
    if (r->failed)
        return;
    char key[512];
    join(key, sizeof key, path, name);
    json_t *v = json_object_get(obj, name);
    if (!v) {
        if (required)
            fail(r, key, "missing (required)");
        return;
    }
    if (!json_is_number(v)) {
        fail(r, key, "expected a number, got %s", type_name(v));
        return;
    }
    double x = json_number_value(v);
    if (!isfinite(x) || (how == AT_LEAST ? x < lo : x <= lo) || (hi && x > *hi)) {
        if (hi)
            fail(r, key, "must be %s %g and <= %g, got %.17g", how == AT_LEAST ? ">=" : ">", lo, *hi, x);
        else
            fail(r, key, "must be %s %g, got %.17g", how == AT_LEAST ? ">=" : ">", lo, x);
        return;
    }
    *out = x;
}

static bool get_integer(reader *r, const json_t *obj, const char *path, const char *name, json_int_t lo,
                        json_int_t *out)
{
    json_t *v = get_kind(r, obj, path, name, true, JSON_INTEGER, "an integer");
    if (!v)
        return false;
    json_int_t x = json_integer_value(v);
    if (x < lo) {
        char key[512];
        join(key, sizeof key, path, name);
        fail(r, key, "must be >= %lld, got %lld", (long long)lo, (long long)x);
        return false;
    }
    *out = x;
    return true;
}

typedef struct plan_input {
    prism_hybrid_problem problem;
    prism_hybrid_block *blocks;
    prism_hybrid_class *classes;
    bool *force_high;
} plan_input;

static void read_cost(reader *r, const json_t *profile, const char *path, const char *name, bool required,
                      double *fixed, double *per_byte)
{
    json_t *c = get_kind(r, profile, path, name, required, JSON_OBJECT, "an object");
    if (!c)
        return;
    char p[256];
    join(p, sizeof p, path, name);
    static const char *const keys[] = {"fixed_seconds", "seconds_per_byte", NULL};
    if (!only_keys(r, c, p, keys))
        return;
    get_number(r, c, p, "fixed_seconds", true, 0, AT_LEAST, NULL, fixed);
    get_number(r, c, p, "seconds_per_byte", true, 0, AT_LEAST, NULL, per_byte);
}

static void read_block(reader *r, const json_t *b, size_t n, prism_hybrid_block *blocks, size_t *ids)
{
    char path[64];
    snprintf(path, sizeof path, "blocks[%zu]", n);
    if (!json_is_object(b)) {
        fail(r, path, "expected an object, got %s", type_name(b));
        return;
    }
    static const char *const keys[] = {"id", "name", "flops", "param_bytes_bf16", "activation_bytes_bf16",
                                       "state_bytes", "stats", NULL};
    if (!only_keys(r, b, path, keys))
        return;
    json_int_t id = 0;
    if (!get_integer(r, b, path, "id", 0, &id))
        return;
    ids[n] = (size_t)id;
    prism_hybrid_block blk = {0};
    get_kind(r, b, path, "name", true, JSON_STRING, "a string");
    get_number(r, b, path, "flops", true, 0, AT_LEAST, NULL, &blk.flops);
    get_number(r, b, path, "param_bytes_bf16", true, 0, AT_LEAST, NULL, &blk.param_bytes);
    get_number(r, b, path, "activation_bytes_bf16", true, 0, AT_LEAST, NULL, &blk.activation_bytes);
    get_number(r, b, path, "state_bytes", true, 0, AT_LEAST, NULL, &blk.state_bytes);
    json_t *s = get_kind(r, b, path, "stats", true, JSON_OBJECT, "an object");
    if (!s)
        return;
    char sp[80];
    snprintf(sp, sizeof sp, "%s.stats", path);
    static const char *const skeys[] = {"x_l2", "x_max_abs", "x_numel", "w_l2", "w_max_abs", "w_numel",
                                        "g_l2", "g_max_abs", "y_numel", NULL};
    if (!only_keys(r, s, sp, skeys))
        return;
    prism_hybrid_stats *st = &blk.stats;
    get_number(r, s, sp, "x_l2", true, 0, AT_LEAST, NULL, &st->x_l2);
    get_number(r, s, sp, "x_max_abs", true, 0, AT_LEAST, NULL, &st->x_max_abs);
    get_number(r, s, sp, "x_numel", true, 1, AT_LEAST, NULL, &st->x_numel);
    get_number(r, s, sp, "w_l2", true, 0, AT_LEAST, NULL, &st->w_l2);
    get_number(r, s, sp, "w_max_abs", true, 0, AT_LEAST, NULL, &st->w_max_abs);
    get_number(r, s, sp, "w_numel", true, 1, AT_LEAST, NULL, &st->w_numel);
    get_number(r, s, sp, "g_l2", true, 0, AT_LEAST, NULL, &st->g_l2);
    get_number(r, s, sp, "g_max_abs", true, 0, AT_LEAST, NULL, &st->g_max_abs);
    get_number(r, s, sp, "y_numel", true, 0, AT_LEAST, NULL, &st->y_numel);
    if (!r->failed)
        blocks[n] = blk; /* placed by id once the ids are checked */
}

static void read_class(reader *r, const json_t *c, size_t n, prism_hybrid_class *cls)
{
    char path[64];
    snprintf(path, sizeof path, "classes[%zu]", n);
    if (!json_is_object(c)) {
        fail(r, path, "expected an object, got %s", type_name(c));
        return;
    }
    static const char *const keys[] = {"name", "ranks", "profile", NULL};
    if (!only_keys(r, c, path, keys))
        return;
    json_t *name = get_kind(r, c, path, "name", true, JSON_STRING, "a string");
    if (!name)
        return;
    if (json_string_length(name) == 0 || strlen(json_string_value(name)) != json_string_length(name)) {
        char key[80];
        snprintf(key, sizeof key, "%s.name", path);
        fail(r, key, "must be a non-empty string without NUL characters");
        return;
    }
    cls->name = json_string_value(name);
    json_int_t ranks;
    if (!get_integer(r, c, path, "ranks", 1, &ranks))
        return;
    json_t *p = get_kind(r, c, path, "profile", true, JSON_OBJECT, "an object");
    if (!p)
        return;
    char pp[80];
    snprintf(pp, sizeof pp, "%s.profile", path);
    static const char *const pkeys[] = {"device_class", "device_name", "memory_bytes", "bf16_ops_per_second",
                                        "fp16_ops_per_second", "int8_ops_per_second", "fp8_ops_per_second",
                                        "quantize_cost", "cast_cost", "h2d_bytes_per_second", NULL};
    if (!only_keys(r, p, pp, pkeys))
        return;
    get_kind(r, p, pp, "device_class", false, JSON_STRING, "a string");
    get_kind(r, p, pp, "device_name", false, JSON_STRING, "a string");
    get_number(r, p, pp, "memory_bytes", true, 0, AT_LEAST, NULL, &cls->memory_bytes);
    get_number(r, p, pp, "bf16_ops_per_second", false, 0, AT_LEAST, NULL, &cls->bf16_ops);
    get_number(r, p, pp, "fp16_ops_per_second", false, 0, AT_LEAST, NULL, &cls->fp16_ops);
    get_number(r, p, pp, "int8_ops_per_second", false, 0, AT_LEAST, NULL, &cls->int8_ops);
    get_number(r, p, pp, "fp8_ops_per_second", false, 0, AT_LEAST, NULL, &cls->fp8_ops);
    read_cost(r, p, pp, "quantize_cost", true, &cls->quantize_fixed_seconds, &cls->quantize_seconds_per_byte);
    double unused1 = 0, unused2 = 0, unused3 = 0;
    read_cost(r, p, pp, "cast_cost", false, &unused1, &unused2);
    get_number(r, p, pp, "h2d_bytes_per_second", false, 0, AT_LEAST, NULL, &unused3);
}

static void read_config(reader *r, const json_t *cfg, plan_input *in)
{
    static const char *const keys[] = {"fixed_classes", "memory_fraction", "gamma", "low_format",
                                       "force_bf16_blocks", NULL};
    prism_hybrid_problem *p = &in->problem;
    if (!only_keys(r, cfg, "config", keys))
        return;
    json_t *fixed = get_kind(r, cfg, "config", "fixed_classes", false, JSON_ARRAY, "an array");
    if (fixed) {
        p->fixed_given = true;
        size_t i;
        json_t *v;
        json_array_foreach(fixed, i, v) {
            char key[64];
            snprintf(key, sizeof key, "config.fixed_classes[%zu]", i);
            if (!json_is_string(v)) {
                fail(r, key, "expected a string, got %s", type_name(v));
                return;
            }
            size_t k = 0;
            while (k < p->class_count && strcmp(in->classes[k].name, json_string_value(v)) != 0)
                k++;
            if (k == p->class_count) {
                fail(r, key, "no class is named \"%s\"", json_string_value(v));
                return;
            }
            in->classes[k].fixed = true;
        }
    }
    double one = 1.0;
    get_number(r, cfg, "config", "memory_fraction", false, 0, ABOVE, &one, &p->memory_fraction);
    get_number(r, cfg, "config", "gamma", false, 0, AT_LEAST, NULL, &p->gamma);
    json_t *low = get_kind(r, cfg, "config", "low_format", false, JSON_STRING, "a string");
    if (low) {
        const char *s = json_string_value(low);
        if (strcmp(s, "auto") == 0)
            p->low_format = PRISM_HYBRID_LOW_AUTO;
        else if (strcmp(s, "int8") == 0)
            p->low_format = PRISM_HYBRID_LOW_INT8;
        else if (strcmp(s, "fp8_e4m3") == 0)
            p->low_format = PRISM_HYBRID_LOW_FP8_E4M3;
        else
            fail(r, "config.low_format", "must be \"int8\", \"fp8_e4m3\" or \"auto\", got \"%s\"", s);
    }
    json_t *force = get_kind(r, cfg, "config", "force_bf16_blocks", false, JSON_ARRAY, "an array");
    if (force) {
        size_t i;
        json_t *v;
        json_array_foreach(force, i, v) {
            char key[64];
            snprintf(key, sizeof key, "config.force_bf16_blocks[%zu]", i);
            if (!json_is_integer(v)) {
                fail(r, key, "expected an integer, got %s", type_name(v));
                return;
            }
            json_int_t id = json_integer_value(v);
            if (id < 0 || (size_t)id >= p->block_count) {
                fail(r, key, "no block has id %lld", (long long)id);
                return;
            }
            in->force_high[id] = true;
        }
    }
}

/* Reads the whole PLAN into in (pointing into root, which must outlive it). */
static void read_plan(reader *r, const json_t *root, plan_input *in)
{
    prism_hybrid_problem *p = &in->problem;
    prism_hybrid_problem_defaults(p);
    if (!json_is_object(root)) {
        fail(r, "(top level)", "expected an object, got %s", type_name(root));
        return;
    }
    static const char *const keys[] = {"blocks", "classes", "link", "config", NULL};
    if (!only_keys(r, root, "", keys))
        return;
    json_t *blocks = get_kind(r, root, "", "blocks", true, JSON_ARRAY, "an array");
    if (!blocks)
        return;
    size_t L = json_array_size(blocks);
    if (L == 0) {
        fail(r, "blocks", "must hold at least one block");
        return;
    }
    in->blocks = calloc(L, sizeof *in->blocks);
    in->force_high = calloc(L, sizeof *in->force_high);
    prism_hybrid_block *given = calloc(L, sizeof *given);
    size_t *ids = calloc(L, sizeof *ids);
    size_t *seen = calloc(L, sizeof *seen); /* index + 1 of the entry holding each id */
    if (!in->blocks || !in->force_high || !given || !ids || !seen) {
        fprintf(stderr, "prismctl plan: out of memory\n");
        r->failed = true;
    }
    for (size_t n = 0; n < L && !r->failed; n++)
        read_block(r, json_array_get(blocks, n), n, given, ids);
    for (size_t n = 0; n < L && !r->failed; n++) {
        char key[64];
        snprintf(key, sizeof key, "blocks[%zu].id", n);
        if (ids[n] >= L)
            fail(r, key, "%zu is not below the number of blocks (%zu): ids are 0..L-1, each once", ids[n], L);
        else if (seen[ids[n]])
            fail(r, key, "%zu is also blocks[%zu].id", ids[n], seen[ids[n]] - 1);
        else {
            seen[ids[n]] = n + 1;
            in->blocks[ids[n]] = given[n];
        }
    }
    free(given);
    free(ids);
    free(seen);
    p->blocks = in->blocks;
    p->block_count = L;
    p->force_high = in->force_high;

    json_t *classes = get_kind(r, root, "", "classes", true, JSON_ARRAY, "an array");
    if (!classes)
        return;
    size_t C = json_array_size(classes);
    if (C == 0) {
        fail(r, "classes", "must hold at least one class");
        return;
    }
    in->classes = calloc(C, sizeof *in->classes);
    if (!in->classes) {
        fprintf(stderr, "prismctl plan: out of memory\n");
        r->failed = true;
        return;
    }
    for (size_t n = 0; n < C && !r->failed; n++)
        read_class(r, json_array_get(classes, n), n, &in->classes[n]);
    for (size_t n = 1; n < C && !r->failed; n++)
        for (size_t m = 0; m < n && !r->failed; m++)
            if (strcmp(in->classes[n].name, in->classes[m].name) == 0) {
                char key[64];
                snprintf(key, sizeof key, "classes[%zu].name", n);
                fail(r, key, "\"%s\" is also classes[%zu].name", in->classes[n].name, m);
            }
    p->classes = in->classes;
    p->class_count = C;

    json_t *link = get_kind(r, root, "", "link", true, JSON_OBJECT, "an object");
    if (!link)
        return;
    static const char *const lkeys[] = {"bytes_per_second", "latency_seconds", NULL};
    if (!only_keys(r, link, "link", lkeys))
        return;
    get_number(r, link, "link", "bytes_per_second", true, 0, ABOVE, NULL, &p->link_bytes_per_second);
    get_number(r, link, "link", "latency_seconds", true, 0, AT_LEAST, NULL, &p->link_latency_seconds);

    json_t *cfg = get_kind(r, root, "", "config", false, JSON_OBJECT, "an object");
    if (cfg)
        read_config(r, cfg, in);
}

/* Milliseconds on CLOCK_MONOTONIC, for --timing. */
static double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

int prismctl_plan(int argc, char **argv)
{
    const char *path = NULL;
    bool timing = false;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
            plan_usage(stdout);
            return 0;
        }
        if (strcmp(argv[i], "--timing") == 0) {
            timing = true;
            continue;
        }
        if (argv[i][0] == '-' && argv[i][1] != '\0') {
            fprintf(stderr, "prismctl plan: unknown option %s (see --help)\n", argv[i]);
            return 2;
        }
        if (path) {
            fprintf(stderr, "prismctl plan: one PLAN file only (got \"%s\" and \"%s\")\n", path, argv[i]);
            return 2;
        }
        path = argv[i];
    }
    if (!path) {
        fprintf(stderr, "prismctl plan: no PLAN file given (see --help)\n");
        return 2;
    }
    const char *name = strcmp(path, "-") == 0 ? "<stdin>" : path;
    double t_start = now_ms(), t_parsed = 0.0, t_planned = 0.0;
    prism_error err = {0};
    size_t len = 0;
    char *text = prism_file_read(path, &len, &err);
    if (!text) {
        fprintf(stderr, "prismctl plan: %s\n", err.message);
        return 2;
    }
    json_error_t jerr;
    json_t *root = json_loadb(text, len, JSON_REJECT_DUPLICATES, &jerr);
    free(text);
    if (!root) {
        fprintf(stderr, "prismctl plan: %s:%d:%d: JSON syntax error: %s\n", name, jerr.line, jerr.column, jerr.text);
        return 2;
    }
    reader r = {.file = name};
    plan_input in = {0};
    read_plan(&r, root, &in);
    int rc = r.failed ? 2 : 0;
    prism_hybrid_result res = {0};
    if (rc == 0) {
        t_parsed = now_ms();
        prism_status st = prism_hybrid_plan(&in.problem, &res, &err);
        t_planned = now_ms();
        if (st == PRISM_ERR_INVALID) {
            /* "classes[K].profile.FIELD: PROBLEM" */
            fprintf(stderr, "prismctl plan: %s: %s\n", name, err.message);
            rc = 2;
        } else if (st == PRISM_ERR_LIMIT) {
            prism_buf m = {0}, bud = {0};
            if (prism_buf_append_double(&m, res.refused_bytes) || prism_buf_append(&m, "", 1) ||
                prism_buf_append_double(&bud, res.refused_budget) || prism_buf_append(&bud, "", 1))
                fprintf(stderr, "prismctl plan: out of memory\n");
            else
                fprintf(stderr, "prismctl plan: class \"%s\" does not fit: its start needs %s bytes, its budget is %s bytes\n",
                        in.classes[res.refused_class].name, m.data, bud.data);
            prism_buf_free(&m);
            prism_buf_free(&bud);
            rc = 1;
        } else if (st) {
            fprintf(stderr, "prismctl plan: %s\n", err.message);
            rc = 1;
        }
    }
    if (rc == 0) {
        prism_buf out = {0};
        if (prism_hybrid_json_write(&out, &in.problem, &res, NULL) || prism_buf_append(&out, "\n", 1)) {
            fprintf(stderr, "prismctl plan: out of memory\n");
            rc = 1;
        } else if (fwrite(out.data, 1, out.len, stdout) != out.len || fflush(stdout) != 0) {
            fprintf(stderr, "prismctl plan: stdout: cannot write\n");
            rc = 1;
        }
        prism_buf_free(&out);
        if (rc == 0 && timing)
            fprintf(stderr, "prismctl plan: timing: read and parse %.3f ms, plan %.3f ms, output %.3f ms\n",
                    t_parsed - t_start, t_planned - t_parsed, now_ms() - t_planned);
    }
    prism_hybrid_result_free(&res);
    free(in.blocks);
    free(in.classes);
    free(in.force_high);
    json_decref(root);
    return rc;
}
