/* A job's binary trace segments: the writer of the policy thread and the streaming reader of
 * GET .../trace (trace_files.h). */
#define _GNU_SOURCE
#include "trace_files.h"

#include "log.h"
#include "trace_bin.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define SEGMENT_SUFFIX ".ptrace"
#define READER_CHUNK (64u * 1024u)
#define READER_MAX_FILES 4096u /* segments one answer opens at most (the newest, past that) */

typedef struct segment {
    uint64_t number;
    uint64_t bytes; /* on disk */
} segment;

struct prismd_trace {
    char *data_dir;
    char *job_id;
    int fd;              /* the current segment, -1: none open */
    bool listed;         /* the segments already on disk were listed */
    bool has_current;    /* segs[nsegs - 1] is the segment records go to */
    bool restored;       /* the next header says the job was restored */
    bool off;            /* a write to the current segment failed: nothing more goes to it */
    bool error_logged;   /* one log line per job */
    uint64_t next_number;
    uint64_t size;       /* of the current segment, counting what would have gone to it while off */
    uint64_t preamble;   /* bytes of the current segment's start (header, layout, calibration, config) */
    uint64_t total;      /* bytes of every segment on disk */
    segment *segs;       /* oldest first */
    size_t nsegs, cap_segs;
    prism_buf start;     /* scratch: a segment's start */
};

static int64_t wall_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

bool prismd_trace_enabled(const prismd_memory_limits *m, const char *data_dir)
{
    return data_dir && m && m->trace_max_bytes > 0;
}

prismd_trace *prismd_trace_create(const char *data_dir, const char *job_id)
{
    prismd_trace *t = calloc(1, sizeof *t);
    if (!t)
        return NULL;
    t->fd = -1;
    t->next_number = 1;
    t->data_dir = strdup(data_dir ? data_dir : "");
    t->job_id = strdup(job_id);
    if (!t->data_dir || !t->job_id) {
        prismd_trace_destroy(t);
        return NULL;
    }
    return t;
}

void prismd_trace_destroy(prismd_trace *t)
{
    if (!t)
        return;
    if (t->fd >= 0)
        close(t->fd);
    free(t->data_dir);
    free(t->job_id);
    free(t->segs);
    prism_buf_free(&t->start);
    free(t);
}

void prismd_trace_mark_restored(prismd_trace *t)
{
    t->restored = true;
}

/* DATA_DIR/jobs/JOB/trace, or that directory's segment NUMBER. */
static void trace_path(const char *data_dir, const char *job_id, uint64_t number, char *out, size_t len)
{
    if (number)
        snprintf(out, len, "%s/jobs/%s/trace/%06llu" SEGMENT_SUFFIX, data_dir, job_id, (unsigned long long)number);
    else
        snprintf(out, len, "%s/jobs/%s/trace", data_dir, job_id);
}

/* The segment number of a file name NNNNNN.ptrace (digits only before the suffix); 0 otherwise. */
static uint64_t segment_number(const char *name)
{
    size_t n = strlen(name), s = strlen(SEGMENT_SUFFIX);
    if (n <= s || n - s > 18 || strcmp(name + n - s, SEGMENT_SUFFIX) != 0)
        return 0;
    uint64_t x = 0;
    for (size_t i = 0; i < n - s; i++) {
        if (name[i] < '0' || name[i] > '9')
            return 0;
        x = x * 10 + (uint64_t)(name[i] - '0');
    }
    return x;
}

static int compare_segments(const void *a, const void *b)
{
    uint64_t x = ((const segment *)a)->number, y = ((const segment *)b)->number;
    return x < y ? -1 : x > y;
}

static bool push_segment(prismd_trace *t, uint64_t number, uint64_t bytes)
{
    if (t->nsegs == t->cap_segs) {
        size_t ncap = t->cap_segs ? t->cap_segs * 2 : 16;
        segment *n = realloc(t->segs, ncap * sizeof *n);
        if (!n)
            return false;
        t->segs = n;
        t->cap_segs = ncap;
    }
    t->segs[t->nsegs++] = (segment){number, bytes};
    return true;
}

/* Makes the trace directory and lists the segments already in it (a restart continues their
 * numbering, and they count against --trace-max-bytes). */
static void list_segments(prismd_trace *t)
{
    t->listed = true;
    char path[4096];
    snprintf(path, sizeof path, "%s/jobs", t->data_dir);
    mkdir(path, 0750);
    snprintf(path, sizeof path, "%s/jobs/%s", t->data_dir, t->job_id);
    mkdir(path, 0750);
    trace_path(t->data_dir, t->job_id, 0, path, sizeof path);
    mkdir(path, 0750);
    DIR *d = opendir(path);
    if (!d)
        return;
    struct dirent *e;
    while ((e = readdir(d))) {
        uint64_t number = segment_number(e->d_name);
        struct stat st;
        if (!number || fstatat(dirfd(d), e->d_name, &st, AT_SYMLINK_NOFOLLOW) != 0 || !S_ISREG(st.st_mode))
            continue;
        if (!push_segment(t, number, (uint64_t)st.st_size))
            break;
        t->total += (uint64_t)st.st_size;
        if (number >= t->next_number)
            t->next_number = number + 1;
    }
    closedir(d);
    if (t->nsegs > 1)
        qsort(t->segs, t->nsegs, sizeof *t->segs, compare_segments);
}

/* Deletes the oldest segments (never the current one) while len more bytes would take the
 * trace past --trace-max-bytes. */
static void make_room(prismd_trace *t, const prismd_memory_limits *m, uint64_t len)
{
    size_t keep = t->has_current ? 1 : 0;
    size_t drop = 0;
    while (t->nsegs - drop > keep && t->total + len > m->trace_max_bytes) {
        char path[4096];
        trace_path(t->data_dir, t->job_id, t->segs[drop].number, path, sizeof path);
        if (unlink(path) != 0 && errno != ENOENT)
            prism_log(PRISM_LOG_WARN, "cannot delete an old trace segment", "job", t->job_id, "path", path, "error",
                      strerror(errno), LOG_END);
        t->total -= t->segs[drop].bytes;
        atomic_fetch_add(&prismd_limits.trace_segments_dropped, 1);
        drop++;
    }
    if (drop) {
        memmove(t->segs, t->segs + drop, (t->nsegs - drop) * sizeof *t->segs);
        t->nsegs -= drop;
    }
}

static void write_failed(prismd_trace *t, const char *what, int error)
{
    t->off = true;
    atomic_fetch_add(&prismd_limits.trace_write_errors, 1);
    if (t->error_logged)
        return;
    t->error_logged = true;
    char number[24];
    snprintf(number, sizeof number, "%llu", t->nsegs ? (unsigned long long)t->segs[t->nsegs - 1].number : 0ull);
    prism_log(PRISM_LOG_ERROR, "cannot write the job's trace; it is off until its next segment (logged once per job)",
              "job", t->job_id, "segment", number, "what", what, "error", strerror(error), LOG_END);
}

/* Writes len bytes to the current segment in one write(2) (continued only if the kernel took
 * part of it); true when they are all on disk. */
static bool put(prismd_trace *t, const prismd_memory_limits *m, const void *data, size_t len)
{
    t->size += len;
    if (t->off || t->fd < 0)
        return false;
    make_room(t, m, len);
    size_t done = 0;
    while (done < len) {
        ssize_t n = write(t->fd, (const char *)data + done, len - done);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0) {
            int error = n < 0 ? errno : ENOSPC;
            t->total += done;
            t->segs[t->nsegs - 1].bytes += done;
            write_failed(t, "a record", error);
            return false;
        }
        done += (size_t)n;
    }
    t->total += len;
    t->segs[t->nsegs - 1].bytes += len;
    atomic_fetch_add(&prismd_limits.trace_bytes_written, len);
    return true;
}

/* The config as compact JSON text (for comparing two), or NULL when out of memory. */
static char *config_text(const prism_config *c)
{
    json_t *obj = prism_config_to_json(c);
    char *text = obj ? prism_json_dumps_exact(obj, JSON_COMPACT) : NULL;
    json_decref(obj);
    return text;
}

/* The start of a segment into t->start: header, layout, calibration per format, the next
 * config when it differs; counts[kind] gets how many of each. */
static prism_status segment_start(prismd_trace *t, uint64_t number, const prism_policy *policy,
                                  unsigned counts[PRISMD_TRACE_KINDS], prism_error *err)
{
    prism_buf *b = &t->start;
    b->len = 0;
    prism_status st = prism_trace_bin_header(b, t->job_id, number, (uint64_t)wall_ms(), prism_policy_config(policy),
                                             t->restored, err);
    if (st)
        return st;
    counts[PRISMD_TRACE_HEADER]++;
    size_t n = prism_policy_input_count(policy);
    size_t room = n ? n : 1;
    uint32_t *all = malloc(room * sizeof *all), *ids = malloc(room * sizeof *ids);
    uint64_t *sizes = malloc(room * sizeof *sizes), *bytes = malloc(room * sizeof *bytes);
    double *errors = malloc(room * sizeof *errors);
    double(*cal)[PRISM_PRECISION_COUNT] = malloc(room * sizeof *cal);
    if (!all || !ids || !sizes || !bytes || !errors || !cal) {
        st = prism_error_set(err, PRISM_ERR_NOMEM, "out of memory");
        goto out;
    }
    size_t k = 0;
    for (size_t i = 0; i < n; i++) {
        prism_policy_input(policy, i, &all[i], &sizes[i], cal[i]);
        if (sizes[i]) {
            ids[k] = all[i];
            bytes[k++] = sizes[i];
        }
    }
    if (k) {
        if ((st = prism_trace_bin_layout(b, ids, bytes, k, err)))
            goto out;
        counts[PRISMD_TRACE_LAYOUT]++;
    }
    for (int f = 0; f < PRISM_PRECISION_COUNT; f++) {
        if (f == PRISM_PRECISION_BF16)
            continue;
        k = 0;
        for (size_t i = 0; i < n; i++) {
            if (isnan(cal[i][f]))
                continue;
            ids[k] = all[i];
            errors[k++] = cal[i][f];
        }
        if (!k)
            continue;
        if ((st = prism_trace_bin_calibration(b, (prism_precision)f, ids, errors, k, err)))
            goto out;
        counts[PRISMD_TRACE_CALIBRATION]++;
    }
    const prism_config *next = prism_policy_next_config(policy);
    if (next != prism_policy_config(policy)) {
        char *a = config_text(prism_policy_config(policy)), *c = config_text(next);
        bool differs = !a || !c || strcmp(a, c) != 0;
        free(a);
        free(c);
        if (differs) {
            if ((st = prism_trace_bin_config(b, next, err)))
                goto out;
            counts[PRISMD_TRACE_CONFIG]++;
        }
    }
out:
    free(all);
    free(ids);
    free(sizes);
    free(bytes);
    free(errors);
    free(cal);
    return st;
}

/* Closes the current segment and starts the next one with the policy's state. A start that
 * cannot be built or written leaves the new segment off: the records meant for it count towards
 * its size, so the next segment starts where it would have. */
static void start_segment(prismd_trace *t, const prismd_memory_limits *m, const prism_policy *policy)
{
    if (t->fd >= 0)
        close(t->fd);
    t->fd = -1;
    t->has_current = false;
    t->size = t->preamble = 0;
    t->off = false;
    uint64_t number = t->next_number++;
    unsigned counts[PRISMD_TRACE_KINDS] = {0};
    prism_error err;
    prism_status built = segment_start(t, number, policy, counts, &err);
    /* Room first: the segment's start counts against --trace-max-bytes as any record does. */
    make_room(t, m, built ? 0 : t->start.len);
    if (!push_segment(t, number, 0)) {
        write_failed(t, "a new segment", ENOMEM); /* no current segment: the next record tries again */
        return;
    }
    t->has_current = true;
    if (built) {
        write_failed(t, "a new segment", built == PRISM_ERR_NOMEM ? ENOMEM : EINVAL);
        return;
    }
    char path[4096];
    trace_path(t->data_dir, t->job_id, number, path, sizeof path);
    t->fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_APPEND | O_CLOEXEC, 0640);
    if (t->fd < 0) {
        write_failed(t, "a new segment", errno);
        return;
    }
    t->restored = false;
    if (put(t, m, t->start.data, t->start.len))
        for (int k = 0; k < PRISMD_TRACE_KINDS; k++)
            atomic_fetch_add(&prismd_limits.trace_records[k], counts[k]);
    t->preamble = t->size;
}

void prismd_trace_append(prismd_trace *t, const prismd_memory_limits *m, const prism_policy *policy, int kind,
                         const void *record, size_t len)
{
    if (!t || !m || m->trace_max_bytes == 0 || !t->data_dir[0])
        return;
    if (!t->listed)
        list_segments(t);
    uint64_t limit = m->trace_segment_bytes < m->trace_max_bytes ? m->trace_segment_bytes : m->trace_max_bytes;
    if (limit == 0)
        limit = m->trace_max_bytes;
    /* A new segment: for the first record since prismd started, and for one that would take the
     * segment past its limit (unless the segment holds nothing but its start: a large record then
     * goes alone). */
    if (!t->has_current || (t->size > t->preamble && t->size + len > limit)) {
        start_segment(t, m, policy);
        /* The start holds the layout, calibration and next config the policy has now: a record
         * of those it was just given is in it already. */
        if (kind == PRISMD_TRACE_LAYOUT || kind == PRISMD_TRACE_CALIBRATION || kind == PRISMD_TRACE_CONFIG)
            return;
    }
    if (put(t, m, record, len) && kind >= 0 && kind < PRISMD_TRACE_KINDS)
        atomic_fetch_add(&prismd_limits.trace_records[kind], 1);
}

void prismd_trace_lost(prismd_trace *t, const char *what)
{
    if (t)
        write_failed(t, what, ENOMEM);
}

/* ---- the reader ---- */

typedef struct reader_file {
    uint64_t number;
    int fd;
} reader_file;

struct prismd_trace_reader {
    reader_file *files; /* oldest first */
    size_t nfiles, cur;
    bool measured;      /* files[cur]'s end is known */
    off_t off, end;     /* the next byte of files[cur] to send; the end of its whole records */
    uint8_t *chunk;     /* READER_CHUNK bytes of scratch */
};

static int compare_files(const void *a, const void *b)
{
    uint64_t x = ((const reader_file *)a)->number, y = ((const reader_file *)b)->number;
    return x < y ? -1 : x > y;
}

prismd_trace_reader *prismd_trace_reader_open(const char *data_dir, const char *job_id)
{
    prismd_trace_reader *r = calloc(1, sizeof *r);
    if (!r || !(r->chunk = malloc(READER_CHUNK))) {
        free(r);
        return NULL;
    }
    if (!data_dir)
        return r;
    char path[4096];
    trace_path(data_dir, job_id, 0, path, sizeof path);
    int dfd = open(path, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    DIR *d = dfd >= 0 ? fdopendir(dfd) : NULL;
    if (!d) {
        if (dfd >= 0)
            close(dfd);
        return r; /* no trace yet */
    }
    size_t cap = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        uint64_t number = segment_number(e->d_name);
        if (!number)
            continue;
        if (r->nfiles == cap) {
            size_t ncap = cap ? cap * 2 : 16;
            reader_file *n = realloc(r->files, ncap * sizeof *n);
            if (!n)
                break;
            r->files = n;
            cap = ncap;
        }
        int fd = openat(dirfd(d), e->d_name, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
        if (fd >= 0)
            r->files[r->nfiles++] = (reader_file){number, fd};
    }
    closedir(d);
    if (r->nfiles > 1)
        qsort(r->files, r->nfiles, sizeof *r->files, compare_files);
    if (r->nfiles > READER_MAX_FILES) { /* more than flags allow for: the newest are sent */
        size_t extra = r->nfiles - READER_MAX_FILES;
        for (size_t i = 0; i < extra; i++)
            close(r->files[i].fd);
        memmove(r->files, r->files + extra, READER_MAX_FILES * sizeof *r->files);
        r->nfiles = READER_MAX_FILES;
    }
    return r;
}

/* A varint length prefix at data[*pos, len); false when cut short or longer than 10 bytes. */
static bool prefix_get(const uint8_t *data, size_t len, size_t *pos, uint64_t *v)
{
    uint64_t x = 0;
    for (unsigned i = 0; i < 10 && *pos + i < len; i++) {
        x |= (uint64_t)(data[*pos + i] & 0x7f) << (7 * i);
        if (!(data[*pos + i] & 0x80)) {
            *pos += i + 1;
            *v = x;
            return true;
        }
    }
    return false;
}

/* The end of the whole records of a segment of size bytes: chunk by chunk with
 * prism_trace_bin_complete, a record longer than a chunk stepped over by its length prefix.
 * -1 on a read error. */
static off_t whole_records_end(prismd_trace_reader *r, int fd, off_t size)
{
    off_t pos = 0;
    while (pos < size) {
        size_t want = (uint64_t)(size - pos) < READER_CHUNK ? (size_t)(size - pos) : READER_CHUNK;
        ssize_t got = pread(fd, r->chunk, want, pos);
        if (got < 0)
            return -1;
        if (got == 0)
            break;
        size_t whole = prism_trace_bin_complete(r->chunk, (size_t)got);
        if (whole > 0) {
            pos += (off_t)whole;
            continue;
        }
        size_t at = 0;
        uint64_t len;
        if (!prefix_get(r->chunk, (size_t)got, &at, &len) || len > PRISM_TRACE_BIN_MAX_RECORD ||
            len > (uint64_t)(size - pos) - at)
            break; /* a record not yet whole, or a damaged prefix: the segment ends here */
        pos += (off_t)(at + len);
    }
    return pos;
}

ssize_t prismd_trace_reader_read(prismd_trace_reader *r, char *buf, size_t max)
{
    size_t n = 0;
    while (n < max && r->cur < r->nfiles) {
        int fd = r->files[r->cur].fd;
        if (!r->measured) {
            struct stat st;
            if (fstat(fd, &st) != 0)
                return -1;
            r->end = whole_records_end(r, fd, st.st_size);
            if (r->end < 0)
                return -1;
            r->off = 0;
            r->measured = true;
        }
        if (r->off >= r->end) {
            r->cur++;
            r->measured = false;
            continue;
        }
        size_t want = (uint64_t)(r->end - r->off) < max - n ? (size_t)(r->end - r->off) : max - n;
        ssize_t got = pread(fd, buf + n, want, r->off);
        if (got <= 0)
            return -1; /* the segment shrank under us */
        r->off += got;
        n += (size_t)got;
    }
    return (ssize_t)n;
}

void prismd_trace_reader_close(prismd_trace_reader *r)
{
    if (!r)
        return;
    for (size_t i = 0; i < r->nfiles; i++)
        close(r->files[i].fd);
    free(r->files);
    free(r->chunk);
    free(r);
}
