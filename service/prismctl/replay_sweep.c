/* The --sweep grid of `prismctl replay` (replay.h): keys, their values, and the combinations in
 * order (the first key varying slowest, the last fastest). */
#define _POSIX_C_SOURCE 200809L
#include "replay.h"

#include <stdlib.h>
#include <string.h>

void replay_sweep_free(replay_sweep *s)
{
    for (size_t k = 0; k < s->nkeys; k++) {
        replay_sweep_key *key = &s->keys[k];
        for (size_t i = 0; key->values && i < json_array_size(key->values); i++)
            free(key->texts[i]);
        free(key->texts);
        json_decref(key->values);
        free(key->name);
    }
    free(s->keys);
    memset(s, 0, sizeof *s);
}

/* Whether text is a JSON number (-?int frac? exp?) by its syntax alone. */
static bool json_number_syntax(const char *t, size_t len)
{
    size_t i = 0;
    if (i < len && t[i] == '-')
        i++;
    size_t digits = i;
    while (i < len && t[i] >= '0' && t[i] <= '9')
        i++;
    if (i == digits)
        return false;
    if (i < len && t[i] == '.') {
        size_t frac = ++i;
        while (i < len && t[i] >= '0' && t[i] <= '9')
            i++;
        if (i == frac)
            return false;
    }
    if (i < len && (t[i] == 'e' || t[i] == 'E')) {
        i++;
        if (i < len && (t[i] == '+' || t[i] == '-'))
            i++;
        size_t exp = i;
        while (i < len && t[i] >= '0' && t[i] <= '9')
            i++;
        if (i == exp)
            return false;
    }
    return i == len;
}

/* One value as written: JSON, or a bare word taken as a string. NULL: neither, and *why says
 * what it is instead ("is neither JSON nor a bare word", "is not a finite number"...). */
static json_t *parse_value(const char *text, size_t len, const char **why)
{
    json_error_t jerr;
    json_t *v = json_loadb(text, len, JSON_DECODE_ANY | JSON_REJECT_DUPLICATES, &jerr);
    if (v)
        return v;
    *why = "is neither JSON nor a bare word";
    if (len == 0)
        return NULL;
    /* A number jansson refuses is one it cannot hold (1e999, 2^64): not a word to take as a string. */
    if (json_number_syntax(text, len)) {
        bool integer = !memchr(text, '.', len) && !memchr(text, 'e', len) && !memchr(text, 'E', len);
        *why = integer ? "is an integer out of range" : "is not a finite number";
        return NULL;
    }
    for (size_t i = 0; i < len; i++) {
        char c = text[i];
        bool word = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' ||
                    c == '-' || c == '.' || c == '+';
        if (!word)
            return NULL;
    }
    return json_stringn(text, len);
}

/* A value as JSON text with its numbers as people write them (0.3, not 0.29999999999999999):
 * 15 significant digits when that reads back to the same value, else 17. */
static char *value_text(const json_t *v)
{
    const size_t flags = JSON_COMPACT | JSON_ENCODE_ANY;
    char *text = json_dumps(v, flags | JSON_REAL_PRECISION(15));
    json_t *back = text ? json_loads(text, JSON_DECODE_ANY, NULL) : NULL;
    bool exact = back && json_equal(back, (json_t *)v);
    json_decref(back);
    if (exact)
        return text;
    free(text);
    return json_dumps(v, flags | JSON_REAL_PRECISION(17));
}

prism_status replay_sweep_add(replay_sweep *s, const char *arg, prism_error *err)
{
    const char *eq = strchr(arg, '=');
    if (!eq || eq == arg)
        return prism_error_set(err, PRISM_ERR_INVALID, "--sweep \"%s\": expected KEY=V1,V2,...", arg);
    size_t name_len = (size_t)(eq - arg);
    for (size_t k = 0; k < s->nkeys; k++)
        if (strlen(s->keys[k].name) == name_len && strncmp(s->keys[k].name, arg, name_len) == 0)
            return prism_error_set(err, PRISM_ERR_INVALID, "--sweep %.*s: the key is given twice (give all its "
                                   "values in one --sweep)", (int)name_len, arg);
    size_t nk;
    const prism_config_key *table = prism_config_keys(&nk);
    bool known = false;
    for (size_t i = 0; i < nk && !known; i++)
        known = strlen(table[i].name) == name_len && strncmp(table[i].name, arg, name_len) == 0;
    /* An unknown key: the loader's message (with its suggestion) names it. */
    if (!known) {
        char *name = strndup(arg, name_len);
        json_t *obj = json_object();
        prism_config base, out;
        prism_status st = name && obj && !json_object_set_new(obj, name, json_null()) ? PRISM_OK : PRISM_ERR_NOMEM;
        if (!st && !(st = prism_config_init(&base, err))) {
            st = prism_config_apply_json(&base, obj, "", &out, err);
            if (!st)
                prism_config_free(&out);
            prism_config_free(&base);
        }
        free(name);
        json_decref(obj);
        if (st == PRISM_ERR_NOMEM)
            return prism_error_set(err, st, "out of memory");
        prism_error_prefix(err, "--sweep");
        return PRISM_ERR_INVALID;
    }
    if (strncmp(arg, "world_size", name_len) == 0 || strncmp(arg, "step_timeout_ms", name_len) == 0)
        return prism_error_set(err, PRISM_ERR_INVALID, "--sweep %.*s: the key shapes the rank merge, which a sweep "
                               "does once for every config (use --world-size, or separate replays)",
                               (int)name_len, arg);
    json_t *values = json_array();
    if (!values)
        return prism_error_set(err, PRISM_ERR_NOMEM, "out of memory");
    /* Split at commas outside [], {} and strings. open[] holds the brackets open in the value
     * being read (innermost last); a value still inside a string or a bracket at the end is an
     * error, not a value cut short. */
    const char *v = eq + 1;
    size_t start = 0, n = strlen(v);
    char *open = malloc(n + 1);
    if (!open) {
        json_decref(values);
        return prism_error_set(err, PRISM_ERR_NOMEM, "out of memory");
    }
    size_t depth = 0;
    bool in_string = false;
    for (size_t i = 0; i <= n; i++) {
        char c = i < n ? v[i] : ',';
        if (in_string) {
            if (c == '\\' && i + 1 < n)
                i++;
            else if (c == '"')
                in_string = false;
            if (i < n)
                continue;
        }
        if (i == n && (in_string || depth > 0)) {
            const char *what = in_string ? "string" : open[depth - 1] == '[' ? "[" : "{";
            prism_error_set(err, PRISM_ERR_INVALID, "--sweep %.*s: value %zu \"%.*s\" has an unclosed %s",
                            (int)name_len, arg, json_array_size(values) + 1, (int)(n - start), v + start, what);
            free(open);
            json_decref(values);
            return PRISM_ERR_INVALID;
        }
        if (c == '"')
            in_string = true;
        else if (c == '[' || c == '{')
            open[depth++] = c;
        else if ((c == ']' || c == '}') && depth > 0)
            depth--;
        else if (c == ',' && depth == 0) {
            const char *why = NULL;
            json_t *value = parse_value(v + start, i - start, &why);
            if (!value) {
                prism_error_set(err, PRISM_ERR_INVALID, "--sweep %.*s: value %zu \"%.*s\" %s", (int)name_len, arg,
                                json_array_size(values) + 1, (int)(i - start), v + start, why);
                free(open);
                json_decref(values);
                return PRISM_ERR_INVALID;
            }
            json_array_append_new(values, value);
            start = i + 1;
        }
    }
    free(open);
    if (json_array_size(values) == 0) {
        json_decref(values);
        return prism_error_set(err, PRISM_ERR_INVALID, "--sweep %.*s: no values", (int)name_len, arg);
    }
    replay_sweep_key *keys = realloc(s->keys, (s->nkeys + 1) * sizeof *keys);
    char **texts = calloc(json_array_size(values), sizeof *texts);
    char *name = strndup(arg, name_len);
    if (keys)
        s->keys = keys;
    bool ok = keys && texts && name;
    for (size_t i = 0; ok && i < json_array_size(values); i++)
        ok = (texts[i] = value_text(json_array_get(values, i))) != NULL;
    if (!ok) {
        for (size_t i = 0; texts && i < json_array_size(values); i++)
            free(texts[i]);
        free(texts);
        free(name);
        json_decref(values);
        return prism_error_set(err, PRISM_ERR_NOMEM, "out of memory");
    }
    s->keys[s->nkeys++] = (replay_sweep_key){name, values, texts};
    size_t count = json_array_size(values);
    size_t before = s->combinations ? s->combinations : 1;
    if (before > REPLAY_SWEEP_MAX_COMBINATIONS / count)
        return prism_error_set(err, PRISM_ERR_LIMIT, "--sweep %s: %zu x %zu combinations, more than the %d a sweep "
                               "replays", name, before, count, REPLAY_SWEEP_MAX_COMBINATIONS);
    s->combinations = before * count;
    return PRISM_OK;
}

size_t replay_sweep_value_index(const replay_sweep *s, size_t i, size_t k)
{
    size_t stride = 1;
    for (size_t j = s->nkeys; j-- > k + 1;)
        stride *= json_array_size(s->keys[j].values);
    return (i / stride) % json_array_size(s->keys[k].values);
}

json_t *replay_sweep_overlay(const replay_sweep *s, size_t i)
{
    json_t *obj = json_object();
    for (size_t k = 0; obj && k < s->nkeys; k++) {
        json_t *v = json_array_get(s->keys[k].values, replay_sweep_value_index(s, i, k));
        if (json_object_set(obj, s->keys[k].name, v)) {
            json_decref(obj);
            return NULL;
        }
    }
    return obj;
}
