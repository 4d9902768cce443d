/* Loading a trace for `prismctl replay` (replay.h): every line or record parsed once into one
 * array of events and one array of block figures, replayed from there by one policy or many
 * (--sweep). JSONL step lines of the usual form take a fast path that reads them in place. */
#define _POSIX_C_SOURCE 200809L
#include "replay.h"

#include "idmap.h"
#include "trace_bin.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- the fast path for JSONL step lines ---- */

typedef struct cursor {
    const char *p, *end;
} cursor;

static void skip_ws(cursor *c)
{
    while (c->p < c->end && (*c->p == ' ' || *c->p == '\t' || *c->p == '\n' || *c->p == '\r'))
        c->p++;
}

static bool take(cursor *c, char ch)
{
    skip_ws(c);
    if (c->p < c->end && *c->p == ch) {
        c->p++;
        return true;
    }
    return false;
}

/* A key string without escapes or control characters: its bytes between the quotes. */
static bool key(cursor *c, const char **k, size_t *n)
{
    if (!take(c, '"'))
        return false;
    const char *start = c->p;
    while (c->p < c->end && *c->p != '"') {
        if (*c->p == '\\' || (unsigned char)*c->p < 0x20)
            return false;
        c->p++;
    }
    if (c->p == c->end)
        return false;
    *k = start;
    *n = (size_t)(c->p - start);
    c->p++;
    return take(c, ':');
}

static bool key_is(const char *k, size_t n, const char *name)
{
    return strlen(name) == n && memcmp(k, name, n) == 0;
}

/* Exact powers of ten as doubles (10^22 is the largest that is). */
static const double pow10_exact[] = {1e0,  1e1,  1e2,  1e3,  1e4,  1e5,  1e6,  1e7,  1e8,  1e9,  1e10, 1e11,
                                     1e12, 1e13, 1e14, 1e15, 1e16, 1e17, 1e18, 1e19, 1e20, 1e21, 1e22};

/* A JSON number token as jansson reads it: an integer token (no fraction, no exponent) is an
 * integer (*is_int, *ival; the double is its value), anything else a real read with strtod's
 * correct rounding. false: not a JSON number, or one jansson refuses (an integer beyond 64 bits,
 * a real that overflows) or that this reader leaves to it. */
static bool number(cursor *c, double *out, bool *is_int, long long *ival)
{
    skip_ws(c);
    const char *start = c->p, *q = c->p, *end = c->end;
    bool negative = q < end && *q == '-';
    if (negative)
        q++;
    if (q == end || *q < '0' || *q > '9')
        return false;
    /* The significant digits (at most 19 kept in mant), and the power of ten they are scaled by. */
    uint64_t mant = 0;
    int kept = 0, dropped = 0, scale = 0, int_digits = 0;
    if (*q == '0') {
        q++;
        int_digits = 1;
    } else {
        for (; q < end && *q >= '0' && *q <= '9'; q++, int_digits++) {
            if (kept < 19) {
                mant = mant * 10 + (uint64_t)(*q - '0');
                kept++;
            } else {
                dropped++;
                scale++;
            }
        }
    }
    bool real = false;
    if (q < end && *q == '.') {
        real = true;
        q++;
        if (q == end || *q < '0' || *q > '9')
            return false;
        for (; q < end && *q >= '0' && *q <= '9'; q++) {
            if (mant == 0 && *q == '0') {
                scale--; /* a leading zero of 0.00x */
            } else if (kept < 19) {
                mant = mant * 10 + (uint64_t)(*q - '0');
                kept++;
                scale--;
            } else {
                dropped++;
            }
        }
    }
    int exp10 = 0;
    if (q < end && (*q == 'e' || *q == 'E')) {
        real = true;
        q++;
        bool eneg = false;
        if (q < end && (*q == '+' || *q == '-'))
            eneg = *q++ == '-';
        if (q == end || *q < '0' || *q > '9')
            return false;
        for (; q < end && *q >= '0' && *q <= '9'; q++)
            if (exp10 < 100000)
                exp10 = exp10 * 10 + (*q - '0');
        if (eneg)
            exp10 = -exp10;
    }
    c->p = q;
    *is_int = !real;
    if (!real) {
        if (int_digits > 18)
            return false; /* maybe beyond long long: jansson's to judge */
        *ival = negative ? -(long long)mant : (long long)mant;
        *out = (double)*ival;
        return true;
    }
    int e = scale + exp10;
    if (dropped == 0 && mant < (UINT64_C(1) << 53) && e >= -22 && e <= 22) {
        /* Both operands exact, so one correctly rounded operation: the value strtod gives. */
        double v = (double)mant;
        v = e >= 0 ? v * pow10_exact[e] : v / pow10_exact[-e];
        *out = negative ? -v : v;
        return true;
    }
    char buf[96];
    size_t n = (size_t)(q - start);
    if (n >= sizeof buf)
        return false;
    memcpy(buf, start, n);
    buf[n] = '\0';
    errno = 0;
    double v = strtod(buf, NULL);
    if (errno == ERANGE && isinf(v))
        return false; /* jansson: "real number overflow" */
    *out = v;
    return true;
}

/* An integer token from 0 to max (get_uint of trace.c). */
static bool uint_value(cursor *c, uint64_t max, uint64_t *out)
{
    double d;
    bool is_int;
    long long v = 0;
    if (!number(c, &d, &is_int, &v) || !is_int || v < 0 || (uint64_t)v > max)
        return false;
    *out = (uint64_t)v;
    return true;
}

/* A number, >= 0 when non_negative (get_number of trace.c). */
static bool double_value(cursor *c, bool non_negative, double *out)
{
    bool is_int;
    long long v;
    if (!number(c, out, &is_int, &v))
        return false;
    return !(non_negative && *out < 0);
}

static bool literal(cursor *c, const char *word)
{
    skip_ws(c);
    size_t n = strlen(word);
    if ((size_t)(c->end - c->p) < n || memcmp(c->p, word, n) != 0)
        return false;
    c->p += n;
    return true;
}

enum { K_ID = 1, K_L2 = 2, K_MAX = 4, K_MEAN = 8, K_VAR = 16, K_NUMEL = 32, K_NONFINITE = 64 };

static bool block_object(cursor *c, prism_block_stats *s)
{
    if (!take(c, '{'))
        return false;
    memset(s, 0, sizeof *s);
    unsigned seen = 0;
    if (take(c, '}'))
        return false; /* no id, l2...: the strict parser names what is missing */
    do {
        const char *k;
        size_t n;
        if (!key(c, &k, &n))
            return false;
        unsigned bit;
        bool ok;
        uint64_t u = 0;
        if (key_is(k, n, "id")) {
            bit = K_ID;
            ok = uint_value(c, UINT32_MAX, &u);
            s->block_id = (uint32_t)u;
        } else if (key_is(k, n, "l2")) {
            bit = K_L2;
            ok = double_value(c, true, &s->l2_norm);
        } else if (key_is(k, n, "max_abs")) {
            bit = K_MAX;
            ok = double_value(c, true, &s->max_abs);
        } else if (key_is(k, n, "mean")) {
            bit = K_MEAN;
            ok = double_value(c, false, &s->mean);
        } else if (key_is(k, n, "variance")) {
            bit = K_VAR;
            ok = double_value(c, true, &s->variance);
        } else if (key_is(k, n, "numel")) {
            bit = K_NUMEL;
            ok = uint_value(c, INT64_MAX, &s->numel);
        } else if (key_is(k, n, "nonfinite")) {
            bit = K_NONFINITE;
            ok = uint_value(c, INT64_MAX, &s->nonfinite);
        } else {
            return false;
        }
        if (!ok || (seen & bit))
            return false;
        seen |= bit;
    } while (take(c, ','));
    if (!take(c, '}'))
        return false;
    const unsigned required = K_ID | K_L2 | K_MAX | K_NUMEL;
    return (seen & required) == required && s->nonfinite <= s->numel;
}

static bool reserve_blocks(prism_trace_record *r, size_t need)
{
    if (r->cap_blocks >= need)
        return true;
    size_t ncap = r->cap_blocks ? r->cap_blocks * 2 : 64;
    while (ncap < need)
        ncap *= 2;
    prism_block_stats *n = realloc(r->blocks, ncap * sizeof *n);
    if (!n)
        return false;
    r->blocks = n;
    r->cap_blocks = ncap;
    return true;
}

bool replay_parse_step_fast(const char *line, size_t len, prism_trace_record *rec)
{
    cursor c = {line, line + len};
    if (!take(&c, '{'))
        return false;
    enum { T_STEP = 1, T_RANK = 2, T_LOSS = 4, T_BLOCKS = 8 };
    unsigned seen = 0;
    uint64_t step = 0, rank = 0;
    bool has_loss = false;
    double loss = 0;
    size_t n = 0;
    do {
        const char *k;
        size_t klen;
        if (!key(&c, &k, &klen))
            return false;
        unsigned bit;
        bool ok = true;
        if (key_is(k, klen, "step")) {
            bit = T_STEP;
            ok = uint_value(&c, PRISM_STEP_MAX, &step);
        } else if (key_is(k, klen, "rank")) {
            bit = T_RANK;
            ok = uint_value(&c, UINT32_MAX - 1, &rank);
        } else if (key_is(k, klen, "loss")) {
            bit = T_LOSS;
            has_loss = !literal(&c, "null");
            ok = !has_loss || double_value(&c, false, &loss);
        } else if (key_is(k, klen, "blocks")) {
            bit = T_BLOCKS;
            if (!take(&c, '['))
                return false;
            if (!take(&c, ']')) {
                do {
                    if (!reserve_blocks(rec, n + 1) || !block_object(&c, &rec->blocks[n]))
                        return false;
                    n++;
                } while (take(&c, ','));
                ok = take(&c, ']');
            }
        } else {
            return false;
        }
        if (!ok || (seen & bit))
            return false;
        seen |= bit;
    } while (take(&c, ','));
    if (!take(&c, '}'))
        return false;
    skip_ws(&c);
    if (c.p != c.end || (seen & (T_STEP | T_BLOCKS)) != (T_STEP | T_BLOCKS))
        return false;
    /* Ids in ascending order are distinct; any other order gets the strict check. */
    bool ascending = true;
    for (size_t i = 1; i < n && ascending; i++)
        ascending = rec->blocks[i].block_id > rec->blocks[i - 1].block_id;
    if (!ascending && prism_trace_check_unique_ids(rec->blocks, n, NULL))
        return false;
    rec->kind = PRISM_TRACE_STEP;
    rec->step = step;
    rec->rank = (uint32_t)rank;
    rec->has_loss = has_loss;
    rec->loss = has_loss ? loss : 0;
    rec->count = n;
    rec->merged = false;
    rec->ranks = 0;
    rec->version_bumped = false;
    return true;
}

/* ---- the trace in memory ---- */

void replay_trace_free(replay_trace *t)
{
    free(t->events);
    free(t->blocks);
    free(t->entries);
    for (size_t i = 0; i < t->nconfigs; i++)
        free(t->configs[i]);
    free(t->configs);
    free(t->ranks);
    memset(t, 0, sizeof *t);
}

static bool grow(void **arr, size_t *cap, size_t need, size_t size)
{
    if (*cap >= need)
        return true;
    size_t ncap = *cap ? *cap : 64;
    while (ncap < need)
        ncap *= 2;
    void *n = realloc(*arr, ncap * size);
    if (!n)
        return false;
    *arr = n;
    *cap = ncap;
    return true;
}

/* Appends the event of rec (its figures copied into the trace's arrays). */
static prism_status add_event(replay_trace *t, const prism_trace_record *rec, uint64_t where, size_t byte,
                              prism_error *err)
{
    if (!grow((void **)&t->events, &t->cap_events, t->nevents + 1, sizeof *t->events))
        return prism_error_set(err, PRISM_ERR_NOMEM, "out of memory");
    replay_event *e = &t->events[t->nevents];
    memset(e, 0, sizeof *e);
    e->where = where;
    e->byte = byte;
    switch (rec->kind) {
    case PRISM_TRACE_STEP:
        if (!grow((void **)&t->blocks, &t->cap_blocks, t->nblocks + rec->count, sizeof *t->blocks))
            return prism_error_set(err, PRISM_ERR_NOMEM, "out of memory");
        if (rec->count)
            memcpy(t->blocks + t->nblocks, rec->blocks, rec->count * sizeof *rec->blocks);
        e->kind = REPLAY_STEP;
        e->first = t->nblocks;
        e->count = rec->count;
        t->nblocks += rec->count;
        e->merged = rec->merged;
        e->has_loss = rec->has_loss;
        e->loss = rec->loss;
        e->version_bumped = rec->version_bumped;
        e->rank = rec->merged ? rec->ranks : rec->rank;
        e->step = rec->step;
        t->step_events++;
        break;
    case PRISM_TRACE_LAYOUT:
    case PRISM_TRACE_CALIBRATION:
        if (!grow((void **)&t->entries, &t->cap_entries, t->nentries + rec->count, sizeof *t->entries))
            return prism_error_set(err, PRISM_ERR_NOMEM, "out of memory");
        if (rec->count)
            memcpy(t->entries + t->nentries, rec->entries, rec->count * sizeof *rec->entries);
        e->kind = rec->kind == PRISM_TRACE_LAYOUT ? REPLAY_LAYOUT : REPLAY_CALIBRATION;
        e->format = rec->format;
        e->first = t->nentries;
        e->count = rec->count;
        t->nentries += rec->count;
        break;
    case PRISM_TRACE_HEADER:
    case PRISM_TRACE_CONFIG: {
        if (!grow((void **)&t->configs, &t->cap_configs, t->nconfigs + 1, sizeof *t->configs))
            return prism_error_set(err, PRISM_ERR_NOMEM, "out of memory");
        char *text = strdup(rec->config_json ? rec->config_json : "{}");
        if (!text)
            return prism_error_set(err, PRISM_ERR_NOMEM, "out of memory");
        t->configs[t->nconfigs] = text;
        e->config = t->nconfigs++;
        e->kind = rec->kind == PRISM_TRACE_HEADER ? REPLAY_HEADER : REPLAY_CONFIG;
        e->step = rec->segment;
        e->restored = rec->restored;
        e->gap_before = rec->gap_before;
        break;
    }
    case PRISM_TRACE_BLANK:
        return PRISM_OK;
    }
    t->nevents++;
    return PRISM_OK;
}

static int compare_u32(const void *a, const void *b)
{
    uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
    return (x > y) - (x < y);
}

void replay_event_prefix(const replay_trace *t, const replay_event *e, prism_error *err)
{
    if (t->binary)
        prism_error_prefix(err, "%s: record %llu (byte %zu)", t->name, (unsigned long long)e->where, e->byte);
    else
        prism_error_prefix(err, "%s:%llu", t->name, (unsigned long long)e->where);
}

static prism_status load_jsonl(replay_trace *t, const char *text, size_t len, long long world, prism_error *err)
{
    prism_trace_record rec;
    prism_trace_record_init(&rec);
    prism_idmap seen;
    prism_idmap_init(&seen);
    size_t cap_ranks = 0;
    prism_status st = PRISM_OK;
    uint64_t line_no = 0;
    for (size_t pos = 0; pos < len && !st;) {
        const char *line = text + pos;
        const char *nl = memchr(line, '\n', len - pos);
        size_t line_len = nl ? (size_t)(nl - line) : len - pos;
        pos += line_len + (nl ? 1 : 0);
        line_no++;
        if (!replay_parse_step_fast(line, line_len, &rec))
            st = prism_trace_parse_line(line, line_len, &rec, err);
        if (!st && rec.kind == PRISM_TRACE_STEP) {
            if (world && rec.rank >= world) {
                st = prism_error_set(err, PRISM_ERR_INVALID, "rank: %u is not below the world size %lld", rec.rank,
                                     world);
            } else if (prism_idmap_get(&seen, rec.rank) == PRISM_IDMAP_NONE) {
                if (!grow((void **)&t->ranks, &cap_ranks, t->nranks + 1, sizeof *t->ranks) ||
                    prism_idmap_put(&seen, rec.rank, 0))
                    st = prism_error_set(err, PRISM_ERR_NOMEM, "out of memory");
                else
                    t->ranks[t->nranks++] = rec.rank;
            }
        }
        if (!st)
            st = add_event(t, &rec, line_no, 0, err);
        if (st)
            prism_error_prefix(err, "%s:%llu", t->name, (unsigned long long)line_no);
    }
    if (t->nranks)
        qsort(t->ranks, t->nranks, sizeof *t->ranks, compare_u32);
    prism_idmap_free(&seen);
    prism_trace_record_free(&rec);
    return st;
}

/* Reads a binary trace; *records is the number of records read before a failure. */
static prism_status load_binary(replay_trace *t, const char *data, size_t len, uint64_t *records, prism_error *err)
{
    prism_trace_bin_reader rd;
    prism_trace_bin_reader_init(&rd, data, len);
    prism_trace_record rec;
    prism_trace_record_init(&rec);
    prism_status st = PRISM_OK;
    for (;;) {
        size_t start = rd.pos;
        if ((st = prism_trace_bin_next(&rd, &rec, err))) {
            prism_error_prefix(err, "%s", t->name);
            break;
        }
        if (rec.kind == PRISM_TRACE_BLANK)
            break;
        if ((st = add_event(t, &rec, rd.records, start, err))) {
            prism_error_prefix(err, "%s: record %llu (byte %zu)", t->name, (unsigned long long)rd.records, start);
            break;
        }
    }
    *records = rd.records;
    prism_trace_record_free(&rec);
    return st;
}

/* Whether the start of data reads as text: its first 512 bytes are UTF-8 (a BOM included, a
 * character cut at the end allowed) with no control character but tab, CR and LF. A
 * binary trace starts with a length prefix and a protobuf tag, which do not. */
static bool looks_like_text(const char *data, size_t len)
{
    const unsigned char *p = (const unsigned char *)data;
    size_t n = len < 512 ? len : 512;
    if (n == 0)
        return false;
    for (size_t i = 0; i < n;) {
        unsigned char c = p[i];
        if (c < 0x80) {
            if ((c < 0x20 && c != '\t' && c != '\n' && c != '\r') || c == 0x7f)
                return false;
            i++;
            continue;
        }
        size_t more = c >= 0xc2 && c <= 0xdf ? 1 : c >= 0xe0 && c <= 0xef ? 2 : c >= 0xf0 && c <= 0xf4 ? 3 : 0;
        if (!more)
            return false;
        for (size_t k = 1; k <= more; k++) {
            if (i + k >= n)
                return true; /* cut at the end of what is looked at */
            if ((p[i + k] & 0xc0) != 0x80)
                return false;
        }
        i += more + 1;
    }
    return true;
}

prism_status replay_trace_count_blocks(const replay_trace *t, size_t *count, prism_error *err)
{
    prism_idmap ids;
    prism_idmap_init(&ids);
    prism_status st = PRISM_OK;
    for (size_t i = 0; i < t->nblocks + t->nentries && !st; i++) {
        uint32_t id = i < t->nblocks ? t->blocks[i].block_id : t->entries[i - t->nblocks].block_id;
        if (prism_idmap_get(&ids, id) == PRISM_IDMAP_NONE && prism_idmap_put(&ids, id, 0))
            st = prism_error_set(err, PRISM_ERR_NOMEM, "out of memory");
    }
    *count = ids.count;
    prism_idmap_free(&ids);
    return st;
}

prism_status replay_trace_load(replay_trace *t, const char *name, const char *data, size_t len, long long world,
                               prism_error *err)
{
    memset(t, 0, sizeof *t);
    t->name = name;
    t->binary = prism_trace_is_binary(data, len);
    if (!t->binary)
        return load_jsonl(t, data, len, world, err);
    uint64_t records = 0;
    prism_status st = load_binary(t, data, len, &records, err);
    if (st != PRISM_ERR_INVALID || records > 0 || !looks_like_text(data, len))
        return st;
    /* Text whose first non-blank byte is not '{' ([1,2], a BOM, prose): not a binary trace, but a
     * JSONL one with a bad line; the JSONL reader names that line. */
    replay_trace_free(t);
    t->name = name;
    prism_error jerr = {0};
    prism_status jst = load_jsonl(t, data, len, world, &jerr);
    if (jst) {
        if (err)
            *err = jerr;
        return jst;
    }
    /* Not reachable: a line not starting with '{' is not a JSON object. Keep the binary message. */
    replay_trace_free(t);
    t->name = name;
    t->binary = true;
    return st;
}
