/* prismctl's REST commands (DESIGN 6): jobs, blocks, config get|patch, overrides. One request
 * each through libcurl; answers are shown as tables or JSON; the server's error body becomes
 * the message. Exit status: 0 ok, 1 the server could not be reached or failed, 2 bad usage or
 * a request the server refused as bad. */
#define _POSIX_C_SOURCE 200809L
#include "prismctl.h"

#include "config.h"

#include <curl/curl.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct client {
    const char *server; /* http://127.0.0.1:8080 */
    const char *token;
} client;

typedef struct response {
    long status;
    char *body;
    size_t len;
} response;

static size_t gather(char *data, size_t size, size_t n, void *ctx)
{
    response *r = ctx;
    size_t add = size * n;
    char *grown = realloc(r->body, r->len + add + 1);
    if (!grown)
        return 0;
    memcpy(grown + r->len, data, add);
    r->body = grown;
    r->len += add;
    r->body[r->len] = '\0';
    return add;
}

int prismctl_url(char *out, size_t len, const char *server, const char *path)
{
    size_t n = strlen(server);
    while (n > 0 && server[n - 1] == '/')
        n--;
    return snprintf(out, len, "%.*s%s", (int)(n < 4096 ? n : 4096), server, path);
}

bool prismctl_job_id_valid(const char *id)
{
    size_t n = strlen(id);
    if (n == 0 || n > 128)
        return false;
    for (size_t i = 0; i < n; i++) {
        char c = id[i];
        bool alnum = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9');
        if (!alnum && (i == 0 || (c != '-' && c != '_' && c != '.')))
            return false;
    }
    return true;
}

/* One request; returns false (with a message printed) when no answer came back. */
static bool request(const client *c, const char *method, const char *path, const char *body, response *r)
{
    memset(r, 0, sizeof *r);
    CURL *curl = curl_easy_init();
    if (!curl) {
        fprintf(stderr, "prismctl: cannot start libcurl\n");
        return false;
    }
    char url[2048];
    prismctl_url(url, sizeof url, c->server, path);
    struct curl_slist *headers = NULL;
    char auth[1024];
    if (c->token) {
        snprintf(auth, sizeof auth, "Authorization: Bearer %s", c->token);
        headers = curl_slist_append(headers, auth);
    }
    if (body)
        headers = curl_slist_append(headers, "Content-Type: application/json");
    curl_easy_setopt(curl, CURLOPT_URL, url);
    curl_easy_setopt(curl, CURLOPT_CUSTOMREQUEST, method);
    curl_easy_setopt(curl, CURLOPT_HTTPHEADER, headers);
    curl_easy_setopt(curl, CURLOPT_WRITEFUNCTION, gather);
    curl_easy_setopt(curl, CURLOPT_WRITEDATA, r);
    curl_easy_setopt(curl, CURLOPT_TIMEOUT, 30L);
    curl_easy_setopt(curl, CURLOPT_NOSIGNAL, 1L);
    if (body)
        curl_easy_setopt(curl, CURLOPT_POSTFIELDS, body);
    CURLcode rc = curl_easy_perform(curl);
    if (rc == CURLE_OK)
        curl_easy_getinfo(curl, CURLINFO_RESPONSE_CODE, &r->status);
    else
        fprintf(stderr, "prismctl: %s %s: %s\n", method, url, curl_easy_strerror(rc));
    curl_slist_free_all(headers);
    curl_easy_cleanup(curl);
    return rc == CURLE_OK;
}

/* The answer as JSON, or NULL with the server's error printed; *code gets the exit status. */
static json_t *answer_json(const response *r, int *code)
{
    json_error_t jerr;
    json_t *doc = r->body ? json_loads(r->body, 0, &jerr) : NULL;
    if (r->status >= 200 && r->status < 300 && doc) {
        *code = 0;
        return doc;
    }
    const char *message = json_string_value(json_object_get(json_object_get(doc, "error"), "message"));
    fprintf(stderr, "prismctl: the server answered %ld: %s\n", r->status,
            message ? message : (r->body ? r->body : "(no body)"));
    *code = r->status >= 400 && r->status < 500 ? 2 : 1;
    json_decref(doc);
    return NULL;
}

static const char *num(const json_t *v, char *buf, size_t len)
{
    if (json_is_integer(v))
        snprintf(buf, len, "%lld", (long long)json_integer_value(v));
    else if (json_is_real(v))
        snprintf(buf, len, "%.4f", json_real_value(v));
    else
        snprintf(buf, len, "-");
    return buf;
}

static int cmd_jobs(const client *c)
{
    response r;
    if (!request(c, "GET", "/v1/jobs", NULL, &r))
        return 1;
    int code;
    json_t *doc = answer_json(&r, &code);
    free(r.body);
    if (!doc)
        return code;
    printf("%-24s %10s %11s %7s %6s %7s\n", "JOB", "STEP", "MAP_VERSION", "AGENTS", "WORLD", "BLOCKS");
    size_t i;
    json_t *job;
    json_array_foreach(json_object_get(doc, "jobs"), i, job)
    {
        char a[32], b[32], d[32], e[32], f[32];
        printf("%-24s %10s %11s %7s %6s %7s\n", json_string_value(json_object_get(job, "job_id")),
               num(json_object_get(job, "step"), a, sizeof a), num(json_object_get(job, "map_version"), b, sizeof b),
               num(json_object_get(job, "agents_connected"), d, sizeof d),
               num(json_object_get(job, "world_size"), e, sizeof e), num(json_object_get(job, "blocks"), f, sizeof f));
    }
    json_decref(doc);
    return 0;
}

/* A block's saturation figure as a percent with 4 decimals, "-" when it has none. */
static const char *percent(const json_t *v, char *buf, size_t len)
{
    if (!json_is_number(v))
        return "-";
    snprintf(buf, len, "%.4f%%", json_number_value(v) * 100.0);
    return buf;
}

/* The summary's blocks per format when the job has more than one low format (low_precision auto,
 * or blocks in several): "2 bf16, 3 int4, 1 fp8_e4m3 (auto)", bf16 first, then the low formats
 * that hold blocks, most saving first; false (nothing printed) otherwise, and for an answer
 * without blocks_by_precision (a prismd before issue 17). */
static bool print_formats(const json_t *t)
{
    static const char *const low[4] = {"int4", "fp8_e4m3", "fp8_e5m2", "int8"};
    const json_t *by = json_object_get(t, "blocks_by_precision");
    const char *lp = json_string_value(json_object_get(t, "low_precision"));
    if (!json_is_object(by) || !lp)
        return false;
    int formats = 0;
    for (int k = 0; k < 4; k++)
        formats += json_integer_value(json_object_get(by, low[k])) > 0;
    if (strcmp(lp, "auto") != 0 && formats < 2)
        return false;
    printf("%lld bf16", (long long)json_integer_value(json_object_get(by, "bf16")));
    for (int k = 0; k < 4; k++) {
        json_int_t n = json_integer_value(json_object_get(by, low[k]));
        if (n > 0)
            printf(", %lld %s", (long long)n, low[k]);
    }
    printf(" (%s)", lp);
    return true;
}

/* GET .../blocks as a table. The REASON column widens for the longer reasons of issue 17
 * (loss_spike, saturation), SAT and UNDER columns come when the blocks carry the fractions (a scale
 * mode other than current, "-" before any figures came, or a block with figures), and
 * the summary counts blocks per format when there are several: a job without any of those
 * prints as before, byte for byte. */
static int cmd_blocks(const client *c, const char *job)
{
    char path[512];
    snprintf(path, sizeof path, "/v1/jobs/%s/blocks", job);
    response r;
    if (!request(c, "GET", path, NULL, &r))
        return 1;
    int code;
    json_t *doc = answer_json(&r, &code);
    free(r.body);
    if (!doc)
        return code;
    size_t i;
    json_t *b;
    int reason_width = 9;
    bool figures = false;
    json_array_foreach(json_object_get(doc, "blocks"), i, b)
    {
        const char *reason = json_string_value(json_object_get(b, "reason"));
        if (reason && (int)strlen(reason) > reason_width)
            reason_width = (int)strlen(reason);
        figures = figures || json_object_get(b, "saturated_fraction") || json_object_get(b, "underflowed_fraction");
    }
    printf("%-8s %-9s %11s %10s %11s %9s %11s %-*s ", "BLOCK", "PRECISION", "SENSITIVITY", "GRAD", "ERROR", "REL",
           "LAST_SWITCH", reason_width, "REASON");
    if (figures)
        printf("%9s %9s ", "SAT", "UNDER");
    printf("%s\n", "FORCED");
    json_array_foreach(json_object_get(doc, "blocks"), i, b)
    {
        char id[32], s[32], g[32], e[32], rel[32], last[32], sat[32], under[32];
        printf("%-8s %-9s %11s %10s %11s %9s %11s %-*s ", num(json_object_get(b, "id"), id, sizeof id),
               json_string_value(json_object_get(b, "precision")), num(json_object_get(b, "sensitivity"), s, sizeof s),
               num(json_object_get(b, "grad_score"), g, sizeof g), num(json_object_get(b, "error_score"), e, sizeof e),
               num(json_object_get(b, "relative_magnitude"), rel, sizeof rel),
               num(json_object_get(b, "last_switch_step"), last, sizeof last), reason_width,
               json_string_value(json_object_get(b, "reason")));
        if (figures)
            printf("%9s %9s ", percent(json_object_get(b, "saturated_fraction"), sat, sizeof sat),
                   percent(json_object_get(b, "underflowed_fraction"), under, sizeof under));
        printf("%s\n", json_is_true(json_object_get(b, "forced")) ? "yes" : "no");
    }
    const json_t *t = json_object_get(doc, "telemetry");
    char v[32], st[32];
    printf("map_version %s, step %s", num(json_object_get(doc, "map_version"), v, sizeof v),
           num(json_object_get(doc, "step"), st, sizeof st));
    if (json_is_object(t)) {
        printf(", last decision at step %s: ", num(json_object_get(t, "step_id"), st, sizeof st));
        if (!print_formats(t))
            printf("%lld bf16, %lld low (%s)", (long long)json_integer_value(json_object_get(t, "blocks_bf16")),
                   (long long)json_integer_value(json_object_get(t, "blocks_int8")),
                   json_string_value(json_object_get(t, "low_precision")));
        printf(", saving %.1f%%", json_number_value(json_object_get(t, "estimated_bandwidth_saving_pct")));
    }
    json_int_t spikes = json_integer_value(json_object_get(doc, "loss_spikes"));
    if (spikes > 0) {
        json_int_t back = json_integer_value(json_object_get(doc, "blocks_rolled_back"));
        printf(", %lld loss spike%s (%lld block%s rolled back)", (long long)spikes, spikes == 1 ? "" : "s",
               (long long)back, back == 1 ? "" : "s");
    }
    printf("\n");
    json_decref(doc);
    return 0;
}

/* Prints a JSON answer as it came, pretty. */
static int print_answer(const response *r)
{
    int code;
    json_t *doc = answer_json(r, &code);
    if (!doc)
        return code;
    char *text = prism_json_dumps_exact(doc, JSON_INDENT(2) | JSON_PRESERVE_ORDER);
    printf("%s\n", text ? text : "");
    free(text);
    json_decref(doc);
    return 0;
}

/* Sends obj (taken) to /v1/jobs/JOB/WHAT and prints the answer; returns the exit status. */
static int send_object(const client *c, const char *method, const char *job, const char *what, json_t *obj)
{
    char *body = obj ? json_dumps(obj, JSON_COMPACT) : NULL;
    json_decref(obj);
    char path[512];
    snprintf(path, sizeof path, "/v1/jobs/%s/%s", job, what);
    response r;
    bool ok = body && request(c, method, path, body, &r);
    free(body);
    if (!ok)
        return 1;
    int code = print_answer(&r);
    free(r.body);
    return code;
}

/* KEY=VALUE: VALUE as JSON (0.7, true, [1,2], "x"), else as a plain string (mode=static). */
static int cmd_config_patch(const client *c, const char *job, int n, char **pairs)
{
    json_t *obj = json_object();
    for (int i = 0; i < n; i++) {
        const char *eq = strchr(pairs[i], '=');
        if (!eq || eq == pairs[i]) {
            fprintf(stderr, "prismctl config patch: \"%s\" is not KEY=VALUE\n", pairs[i]);
            json_decref(obj);
            return 2;
        }
        char key[128];
        snprintf(key, sizeof key, "%.*s", (int)(eq - pairs[i]), pairs[i]);
        json_error_t jerr;
        json_t *value = json_loads(eq + 1, JSON_DECODE_ANY, &jerr);
        json_object_set_new(obj, key, value ? value : json_string(eq + 1));
    }
    return send_object(c, "PATCH", job, "config", obj);
}

/* "1,2,3" into a JSON array of block ids; NULL when it is not one. */
static json_t *id_list(const char *text)
{
    json_t *arr = json_array();
    const char *p = text;
    while (*p) {
        char *end = NULL;
        unsigned long long id = strtoull(p, &end, 10);
        if (end == p || *p == '-' || id > UINT32_MAX || (*end && *end != ',')) {
            json_decref(arr);
            return NULL;
        }
        json_array_append_new(arr, json_integer((json_int_t)id));
        p = *end ? end + 1 : end;
    }
    return arr;
}

static int cmd_overrides(const client *c, const char *job, const char *bf16, const char *low)
{
    json_t *a = id_list(bf16 ? bf16 : ""), *b = id_list(low ? low : "");
    if (!a || !b) {
        fprintf(stderr, "prismctl overrides: --bf16 and --low take block ids like 1,2,3\n");
        json_decref(a);
        json_decref(b);
        return 2;
    }
    return send_object(c, "PUT", job, "overrides",
                       json_pack("{s:o, s:o}", "force_bf16_blocks", a, "force_int8_blocks", b));
}

static void rest_usage(FILE *out, const char *cmd)
{
    fprintf(out,
            "usage: prismctl [--server URL] [--token TOKEN] %s\n\n"
            "  jobs                          jobs with step, map version, agents, world size\n"
            "  blocks JOB                    a job's block map as a table\n"
            "  config get JOB                the job's policy config in force (JSON)\n"
            "  config patch JOB KEY=VALUE... change config keys; they apply at the next decision\n"
            "  overrides JOB [--bf16 IDS] [--low IDS]\n"
            "                                set the force lists (both replaced; IDS like 1,2,3)\n"
            "  delete JOB                    delete the job, its state and files (admin token)\n\n"
            "--server defaults to $PRISM_SERVER or http://127.0.0.1:8080; --token to $PRISM_TOKEN\n"
            "(needed for changes when the job has a token or prismd has an admin token, and for\n"
            "reads when prismd runs with --require-read-token).\n",
            cmd);
}

int prismctl_rest(int argc, char **argv)
{
    client c = {getenv("PRISM_SERVER") ? getenv("PRISM_SERVER") : "http://127.0.0.1:8080", getenv("PRISM_TOKEN")};
    const char *cmd = argv[0];
    int i = 1;
    const char *bf16 = NULL, *low = NULL;
    char *rest[64];
    int nrest = 0;
    for (; i < argc; i++) {
        const char *a = argv[i];
        const char **target = strcmp(a, "--server") == 0  ? &c.server
                              : strcmp(a, "--token") == 0 ? &c.token
                              : strcmp(a, "--bf16") == 0  ? &bf16
                              : strcmp(a, "--low") == 0   ? &low
                                                          : NULL;
        if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
            rest_usage(stdout, cmd);
            return 0;
        }
        if (target) {
            if (i + 1 >= argc) {
                fprintf(stderr, "prismctl %s: %s needs a value\n", cmd, a);
                return 2;
            }
            *target = argv[++i];
        } else if (a[0] == '-' && a[1] == '-') {
            fprintf(stderr, "prismctl %s: unknown option %s (see --help)\n", cmd, a);
            return 2;
        } else if (nrest < 64) {
            rest[nrest++] = argv[i];
        }
    }
    curl_global_init(CURL_GLOBAL_DEFAULT);
    int code = 2;
    if (strcmp(cmd, "jobs") == 0 && nrest == 0)
        code = cmd_jobs(&c);
    else if (strcmp(cmd, "blocks") == 0 && nrest == 1)
        code = cmd_blocks(&c, rest[0]);
    else if (strcmp(cmd, "config") == 0 && nrest == 2 && strcmp(rest[0], "get") == 0) {
        char path[512];
        snprintf(path, sizeof path, "/v1/jobs/%s/config", rest[1]);
        response r;
        code = request(&c, "GET", path, NULL, &r) ? print_answer(&r) : 1;
        free(r.body);
    } else if (strcmp(cmd, "config") == 0 && nrest >= 3 && strcmp(rest[0], "patch") == 0)
        code = cmd_config_patch(&c, rest[1], nrest - 2, rest + 2);
    else if (strcmp(cmd, "overrides") == 0 && nrest == 1)
        code = cmd_overrides(&c, rest[0], bf16, low);
    else if (strcmp(cmd, "delete") == 0 && nrest == 1) {
        char path[512];
        snprintf(path, sizeof path, "/v1/jobs/%s", rest[0]);
        response r;
        code = request(&c, "DELETE", path, NULL, &r) ? print_answer(&r) : 1;
        free(r.body);
    }
    else
        rest_usage(stderr, cmd);
    curl_global_cleanup();
    return code;
}
