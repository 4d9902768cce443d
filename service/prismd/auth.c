/* The auth rule and the provisioned job tokens (auth.h). */
#define _POSIX_C_SOURCE 200809L
#include "auth.h"

#include <dirent.h>
#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#define TOKEN_MAX 4096 /* bytes of one token at most */

bool prismd_token_equal(const char *a, const char *b)
{
    if (!a || !b)
        return false;
    size_t la = strlen(a), lb = strlen(b);
    size_t n = la > lb ? la : lb;
    volatile unsigned char diff = (unsigned char)(la != lb);
    for (size_t i = 0; i < n; i++) {
        unsigned char x = i < la ? (unsigned char)a[i] : 0;
        unsigned char y = i < lb ? (unsigned char)b[i] : 0;
        diff = (unsigned char)(diff | (x ^ y));
    }
    return diff == 0;
}

prismd_auth prismd_auth_check(const prismd_auth_rule *rule, const char *job_token, const char *bearer,
                              prismd_access access)
{
    const char *admin = rule->admin_token;
    if (bearer && prismd_token_equal(bearer, admin))
        return PRISMD_AUTH_OK;
    if (access == PRISMD_ACCESS_DELETE)
        return bearer ? PRISMD_AUTH_WRONG : PRISMD_AUTH_MISSING;
    if (bearer && prismd_token_equal(bearer, job_token))
        return PRISMD_AUTH_OK;
    /* Is there a token that could open this job? */
    bool guarded = job_token || (admin && access != PRISMD_ACCESS_AGENT);
    if (!guarded)
        return PRISMD_AUTH_OK;
    if (bearer)
        return PRISMD_AUTH_WRONG;
    if (access == PRISMD_ACCESS_READ && !rule->require_read_token)
        return PRISMD_AUTH_OK;
    return PRISMD_AUTH_MISSING;
}

char *prismd_auth_answer(prismd_auth a, prismd_access access, const char *job_id)
{
    char message[400];
    const char *code = a == PRISMD_AUTH_MISSING ? "unauthenticated" : "permission_denied";
    if (a == PRISMD_AUTH_MISSING && access == PRISMD_ACCESS_DELETE)
        snprintf(message, sizeof message, "job %.128s: deleting a job needs the admin bearer token", job_id);
    else if (a == PRISMD_AUTH_MISSING && access == PRISMD_ACCESS_READ)
        snprintf(message, sizeof message,
                 "job %.128s: reading it needs the job's or the admin bearer token (--require-read-token)", job_id);
    else if (a == PRISMD_AUTH_MISSING)
        snprintf(message, sizeof message, "job %.128s: this change needs the job's or the admin bearer token", job_id);
    else if (access == PRISMD_ACCESS_DELETE)
        snprintf(message, sizeof message, "job %.128s: wrong token (deleting a job needs the admin token)", job_id);
    else
        snprintf(message, sizeof message, "job %.128s: wrong token (neither the job's nor the admin token)", job_id);
    json_t *obj = json_pack("{s:{s:s, s:s}}", "error", "code", code, "message", message);
    char *text = obj ? json_dumps(obj, JSON_COMPACT | JSON_PRESERVE_ORDER) : NULL;
    json_decref(obj);
    return text;
}

bool prismd_job_id_valid(const char *id)
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

/* ---- the token table ---- */

typedef struct token_entry {
    char *job;
    char *token;
} token_entry;

struct prismd_tokens {
    token_entry *entries; /* ascending job id */
    size_t n, cap;
};

void prismd_tokens_free(prismd_tokens *t)
{
    if (!t)
        return;
    for (size_t i = 0; i < t->n; i++) {
        free(t->entries[i].job);
        free(t->entries[i].token);
    }
    free(t->entries);
    free(t);
}

static int compare_entries(const void *a, const void *b)
{
    return strcmp(((const token_entry *)a)->job, ((const token_entry *)b)->job);
}

const char *prismd_tokens_find(const prismd_tokens *t, const char *job_id)
{
    if (!t || !job_id)
        return NULL;
    token_entry key = {(char *)job_id, NULL};
    const token_entry *e = bsearch(&key, t->entries, t->n, sizeof *t->entries, compare_entries);
    return e ? e->token : NULL;
}

bool prismd_tokens_same(const prismd_tokens *a, const prismd_tokens *b)
{
    if (prismd_tokens_count(a) != prismd_tokens_count(b))
        return false;
    for (size_t i = 0; i < prismd_tokens_count(a); i++)
        if (strcmp(a->entries[i].job, b->entries[i].job) != 0 || strcmp(a->entries[i].token, b->entries[i].token) != 0)
            return false;
    return true;
}

size_t prismd_tokens_count(const prismd_tokens *t)
{
    return t ? t->n : 0;
}

/* A token as given: printable ASCII but space, 1 to TOKEN_MAX bytes (what an HTTP Bearer and gRPC
 * metadata can carry). */
static bool token_valid(const char *s, size_t len)
{
    if (len == 0 || len > TOKEN_MAX)
        return false;
    for (size_t i = 0; i < len; i++)
        if ((unsigned char)s[i] <= ' ' || (unsigned char)s[i] >= 0x7f)
            return false;
    return true;
}

/* Adds job -> token (copied); where (file and key) names it in errors. */
static prism_status add_entry(prismd_tokens *t, const char *job, const char *token, const char *where,
                              prism_error *err)
{
    if (!prismd_job_id_valid(job))
        return prism_error_set(err, PRISM_ERR_INVALID,
                               "%s: \"%.128s\" is not a job id (1 to 128 letters, digits, '-', '_' or '.', "
                               "starting with a letter or digit)", where, job);
    if (!token_valid(token, strlen(token)))
        return prism_error_set(err, PRISM_ERR_INVALID,
                               "%s: job %s: the token must be 1 to %d printable characters without spaces", where,
                               job, TOKEN_MAX);
    for (size_t i = 0; i < t->n; i++) {
        if (strcmp(t->entries[i].job, job) != 0)
            continue;
        if (strcmp(t->entries[i].token, token) != 0)
            return prism_error_set(err, PRISM_ERR_INVALID, "%s: job %s has another token already", where, job);
        return PRISM_OK;
    }
    if (t->n == t->cap) {
        size_t ncap = t->cap ? t->cap * 2 : 16;
        token_entry *ne = realloc(t->entries, ncap * sizeof *ne);
        if (!ne)
            return prism_error_set(err, PRISM_ERR_NOMEM, "out of memory");
        t->entries = ne;
        t->cap = ncap;
    }
    char *j = strdup(job), *k = strdup(token);
    if (!j || !k) {
        free(j);
        free(k);
        return prism_error_set(err, PRISM_ERR_NOMEM, "out of memory");
    }
    t->entries[t->n++] = (token_entry){j, k};
    return PRISM_OK;
}

static prism_status load_dir(prismd_tokens *t, const char *dir, prism_error *err)
{
    DIR *d = opendir(dir);
    if (!d)
        return prism_error_set(err, PRISM_ERR_IO, "%.200s: %s", dir, strerror(errno));
    prism_status st = PRISM_OK;
    struct dirent *e;
    while (!st && (e = readdir(d))) {
        if (e->d_name[0] == '.')
            continue; /* ".", "..", and a Secret volume's "..data" and "..2024_..." entries */
        char path[4096];
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        struct stat sb;
        if (stat(path, &sb) != 0) {
            st = prism_error_set(err, PRISM_ERR_IO, "%.300s: %s", path, strerror(errno));
            break;
        }
        if (!S_ISREG(sb.st_mode))
            continue; /* a directory has no token */
        if (sb.st_size > TOKEN_MAX + 64) {
            st = prism_error_set(err, PRISM_ERR_INVALID, "%.300s: over %d bytes, not a token", path, TOKEN_MAX);
            break;
        }
        size_t len = 0;
        char *text = prism_file_read(path, &len, err);
        if (!text) {
            st = err->status;
            break;
        }
        while (len > 0 && (text[len - 1] == '\n' || text[len - 1] == '\r' || text[len - 1] == ' ' ||
                           text[len - 1] == '\t'))
            text[--len] = '\0';
        if (strlen(text) != len)
            st = prism_error_set(err, PRISM_ERR_INVALID, "%.300s: the token holds a NUL byte", path);
        else
            st = add_entry(t, e->d_name, text, path, err);
        free(text);
    }
    closedir(d);
    return st;
}

static prism_status load_file(prismd_tokens *t, const char *file, prism_error *err)
{
    json_error_t jerr;
    json_t *root = json_load_file(file, JSON_REJECT_DUPLICATES, &jerr);
    if (!root)
        return prism_error_set(err, PRISM_ERR_INVALID, "%.200s: line %d, column %d: %s", file, jerr.line, jerr.column,
                               jerr.text);
    prism_status st = PRISM_OK;
    if (!json_is_object(root))
        st = prism_error_set(err, PRISM_ERR_INVALID, "%.200s: expected a JSON object {\"JOB\": \"TOKEN\", ...}",
                             file);
    const char *key;
    json_t *value;
    json_object_foreach(root, key, value) {
        if (st)
            break;
        char where[400];
        snprintf(where, sizeof where, "%.200s: key \"%.128s\"", file, key);
        if (!json_is_string(value))
            st = prism_error_set(err, PRISM_ERR_INVALID, "%s: expected a string token", where);
        else
            st = add_entry(t, key, json_string_value(value), where, err);
    }
    json_decref(root);
    return st;
}

prismd_tokens *prismd_tokens_load(const char *dir, const char *file, prism_error *err)
{
    prismd_tokens *t = calloc(1, sizeof *t);
    if (!t) {
        prism_error_set(err, PRISM_ERR_NOMEM, "out of memory");
        return NULL;
    }
    if ((dir && load_dir(t, dir, err)) || (file && load_file(t, file, err))) {
        prismd_tokens_free(t);
        return NULL;
    }
    if (t->n)
        qsort(t->entries, t->n, sizeof *t->entries, compare_entries);
    return t;
}

/* ---- the hand-over box ---- */

void prismd_token_box_init(prismd_token_box *b)
{
    memset(b, 0, sizeof *b);
    pthread_mutex_init(&b->lock, NULL);
    atomic_init(&b->loads_ok, 0);
    atomic_init(&b->loads_failed, 0);
}

void prismd_token_box_destroy(prismd_token_box *b)
{
    prismd_tokens_free(b->pending);
    pthread_mutex_destroy(&b->lock);
}

void prismd_token_box_put(prismd_token_box *b, prismd_tokens *t)
{
    pthread_mutex_lock(&b->lock);
    prismd_tokens *old = b->has_pending ? b->pending : NULL;
    b->pending = t;
    b->has_pending = true;
    pthread_mutex_unlock(&b->lock);
    prismd_tokens_free(old);
}

bool prismd_token_box_take(prismd_token_box *b, prismd_tokens **out)
{
    pthread_mutex_lock(&b->lock);
    bool had = b->has_pending;
    if (had) {
        *out = b->pending;
        b->pending = NULL;
        b->has_pending = false;
    }
    pthread_mutex_unlock(&b->lock);
    return had;
}
