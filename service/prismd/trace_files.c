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
    bool has_current;    /* records go to the current segment (or, while off, count towards its size) */
    bool on_disk;        /* the current segment's file was made: it is segs[nsegs - 1] */
    bool restored;       /* the next header says the job was restored */
    bool gap;            /* records were lost since the last header written: the next one says so */
    bool off;            /* a write to the current segment failed: nothing more goes to it */
    bool error_logged;   /* one log line per job */
    bool delete_logged;  /* one log line per job for a segment that cannot be deleted */
    uint64_t next_number;
    uint64_t current;    /* the current segment's number (0: none yet) */
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
 * numbering, and they count against --trace-max-bytes). False when the directory cannot be
 * listed (other than missing, which segment creation then reports): nothing is written until it
 * can be, so that numbering never restarts over files that exist. */
static bool list_segments(prismd_trace *t)
{
    char path[4096];
    snprintf(path, sizeof path, "%s/jobs", t->data_dir);
    mkdir(path, 0750);
    snprintf(path, sizeof path, "%s/jobs/%s", t->data_dir, t->job_id);
    mkdir(path, 0750);
    trace_path(t->data_dir, t->job_id, 0, path, sizeof path);
    mkdir(path, 0750);
    t->nsegs = 0;
    t->total = 0;
    DIR *d = opendir(path);
    if (!d) {
        if (errno == ENOENT) {
            t->listed = true;
            return true;
        }
        return false;
    }
    struct dirent *e;
    bool ok = true;
    errno = 0;
    while ((e = readdir(d))) {
        uint64_t number = segment_number(e->d_name);
        struct stat st;
        if (!number || fstatat(dirfd(d), e->d_name, &st, AT_SYMLINK_NOFOLLOW) != 0 || !S_ISREG(st.st_mode)) {
            errno = 0;
            continue;
        }
        if (!push_segment(t, number, (uint64_t)st.st_size)) {
            errno = ENOMEM;
            ok = false;
            break;
        }
        t->total += (uint64_t)st.st_size;
        if (number >= t->next_number)
            t->next_number = number + 1;
        errno = 0;
    }
    if (ok && errno != 0)
        ok = false; /* readdir failed */
    int error = errno;
    closedir(d);
    if (!ok) {
        t->nsegs = 0;
        t->total = 0;
        errno = error;
        return false;
    }
    if (t->nsegs > 1)
        qsort(t->segs, t->nsegs, sizeof *t->segs, compare_segments);
    t->listed = true;
    return true;
}

/* Deletes the oldest segments (never the current one) while len more bytes would take the
 * trace past --trace-max-bytes. A segment that cannot be deleted stops it (logged once per job):
 * deleting newer ones past it would leave a hole in the trace, so the trace stays over its bound
 * until the file can go. Only a file removed here counts as dropped. */
static void make_room(prismd_trace *t, const prismd_memory_limits *m, uint64_t len)
{
    size_t keep = t->has_current && t->on_disk ? 1 : 0;
    size_t drop = 0;
    while (t->nsegs - drop > keep && t->total + len > m->trace_max_bytes) {
        char path[4096];
        trace_path(t->data_dir, t->job_id, t->segs[drop].number, path, sizeof path);
        if (unlink(path) == 0) {
            atomic_fetch_add(&prismd_limits.trace_segments_dropped, 1);
        } else if (errno != ENOENT) {
            if (!t->delete_logged)
                prism_log(PRISM_LOG_WARN, "cannot delete an old trace segment; the trace stays over --trace-max-bytes "
                          "until it can (logged once per job)", "job", t->job_id, "path", path, "error",
                          strerror(errno), LOG_END);
            t->delete_logged = true;
            break;
        }
        t->total -= t->segs[drop].bytes; /* removed, or gone already: no longer on disk either way */
        drop++;
    }
    if (drop) {
        memmove(t->segs, t->segs + drop, (t->nsegs - drop) * sizeof *t->segs);
        t->nsegs -= drop;
    }
}

/* Records of the job are lost (a write, a new segment or the listing failed): counted, logged
 * once per job; the trace is off until its next segment, whose header says records were lost. */
static void write_failed(prismd_trace *t, const char *what, int error)
{
    t->off = true;
    t->gap = true;
    atomic_fetch_add(&prismd_limits.trace_write_errors, 1);
    if (t->error_logged)
        return;
    t->error_logged = true;
    char number[24];
    snprintf(number, sizeof number, "%llu", (unsigned long long)t->current);
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
    prism_status st = prism_trace_bin_segment_header(b, t->job_id, number, (uint64_t)wall_ms(),
                                                     prism_policy_config(policy), t->restored, t->gap, err);
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

/* Creates the next segment's file: a number not on disk (O_EXCL: a file that is there already,
 * listed or not, is never overwritten; its number is passed over). -1 with errno on failure;
 * *number gets the number tried last. */
static int create_segment(prismd_trace *t, uint64_t *number)
{
    for (unsigned tries = 0; tries < 64; tries++) {
        *number = t->next_number++;
        char path[4096];
        trace_path(t->data_dir, t->job_id, *number, path, sizeof path);
        int fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_APPEND | O_CLOEXEC, 0640);
        if (fd >= 0 || errno != EEXIST)
            return fd;
    }
    errno = EEXIST;
    return -1;
}

/* Closes the current segment and starts the next one with the policy's state. A segment whose
 * file cannot be made, or whose start cannot be built or written, is off: the records meant for
 * it count towards its size (so the next segment starts where it would have) and are lost, and
 * the next segment's header says so (gap_before). Only a file that was made joins the list. */
static void start_segment(prismd_trace *t, const prismd_memory_limits *m, const prism_policy *policy)
{
    if (t->fd >= 0)
        close(t->fd);
    t->fd = -1;
    t->has_current = true;
    t->on_disk = false;
    t->size = t->preamble = 0;
    t->off = false;
    uint64_t number;
    int fd = create_segment(t, &number);
    t->current = number;
    if (fd < 0) {
        write_failed(t, "a new segment", errno);
        return;
    }
    unsigned counts[PRISMD_TRACE_KINDS] = {0};
    prism_error err;
    prism_status built = segment_start(t, number, policy, counts, &err);
    if (built == PRISM_OK && !push_segment(t, number, 0))
        built = PRISM_ERR_NOMEM;
    if (built) {
        char path[4096];
        trace_path(t->data_dir, t->job_id, number, path, sizeof path);
        close(fd);
        unlink(path); /* empty, never listed */
        write_failed(t, "a new segment", built == PRISM_ERR_NOMEM ? ENOMEM : EINVAL);
        return;
    }
    t->fd = fd;
    t->on_disk = true;
    /* Room first: the segment's start counts against --trace-max-bytes as any record does
     * (put makes it; the new segment itself is never deleted). */
    if (put(t, m, t->start.data, t->start.len)) {
        for (int k = 0; k < PRISMD_TRACE_KINDS; k++)
            atomic_fetch_add(&prismd_limits.trace_records[k], counts[k]);
        t->restored = false;
        t->gap = false;
    }
    t->preamble = t->size;
}

void prismd_trace_append(prismd_trace *t, const prismd_memory_limits *m, const prism_policy *policy, int kind,
                         const void *record, size_t len)
{
    if (!t || !m || m->trace_max_bytes == 0 || !t->data_dir[0])
        return;
    if (!t->listed && !list_segments(t)) {
        write_failed(t, "the trace directory (listing its segments)", errno);
        return; /* nothing is written until the segments on disk are known */
    }
    uint64_t limit = m->trace_segment_bytes < m->trace_max_bytes ? m->trace_segment_bytes : m->trace_max_bytes;
    if (limit == 0)
        limit = m->trace_max_bytes;
    /* A new segment: for the first record since prismd started, and for one that would take the
     * segment past its limit (unless the segment holds nothing but its start: a large record then
     * goes alone). The record itself follows the start even when the start already holds what
     * it set: the start's layout leaves out blocks of size 0, and replaying an input twice gives
     * the same policy. */
    if (!t->has_current || (t->size > t->preamble && t->size + len > limit))
        start_segment(t, m, policy);
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
    bool failed;        /* a read failed after data was handed out: the next read says so */
    off_t off, end;     /* the next byte of files[cur] to send; the end of its whole records */
    uint8_t *chunk;     /* READER_CHUNK bytes of scratch */
};

static int compare_numbers(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

/* The segment numbers in the open directory d, ascending, into *out (malloc'd). */
static prism_status list_numbers(DIR *d, uint64_t **out, size_t *n, prism_error *err)
{
    uint64_t *numbers = NULL;
    size_t count = 0, cap = 0;
    struct dirent *e;
    errno = 0;
    while ((e = readdir(d))) {
        uint64_t number = segment_number(e->d_name);
        if (!number)
            continue;
        if (count == cap) {
            size_t ncap = cap ? cap * 2 : 16;
            uint64_t *grown = realloc(numbers, ncap * sizeof *grown);
            if (!grown) {
                free(numbers);
                return prism_error_set(err, PRISM_ERR_NOMEM, "out of memory");
            }
            numbers = grown;
            cap = ncap;
        }
        numbers[count++] = number;
        errno = 0;
    }
    if (errno != 0) {
        free(numbers);
        return prism_error_set(err, PRISM_ERR_IO, "listing the trace's segments: %s", strerror(errno));
    }
    if (count > 1)
        qsort(numbers, count, sizeof *numbers, compare_numbers);
    *out = numbers;
    *n = count;
    return PRISM_OK;
}

/* Opens the newest READER_MAX_FILES regular segment files of the listed numbers, newest first
 * into r->files (reversed to oldest first at the end). Entries that are not regular files (a
 * directory, a FIFO, a symbolic link with a segment's name) are passed over as the writer passes
 * them over. A segment gone (ENOENT) was deleted by the writer, which deletes the oldest first:
 * it and every older one count as dropped, and the answer starts after it, without a hole. Any
 * other failure fails the answer. */
static prism_status open_segments(prismd_trace_reader *r, int dir, const uint64_t *numbers, size_t count,
                                  prism_error *err)
{
    size_t want = count < READER_MAX_FILES ? count : READER_MAX_FILES;
    if (want && !(r->files = malloc(want * sizeof *r->files)))
        return prism_error_set(err, PRISM_ERR_NOMEM, "out of memory");
    for (size_t i = count; i-- > 0 && r->nfiles < want;) {
        char name[40];
        snprintf(name, sizeof name, "%06llu" SEGMENT_SUFFIX, (unsigned long long)numbers[i]);
        struct stat st;
        if (fstatat(dir, name, &st, AT_SYMLINK_NOFOLLOW) != 0) {
            if (errno == ENOENT)
                break;
            return prism_error_set(err, PRISM_ERR_IO, "segment %s: %s", name, strerror(errno));
        }
        if (!S_ISREG(st.st_mode))
            continue;
        /* O_NONBLOCK: should a FIFO take the name between the check and the open, the open
         * does not wait for a writer (and the fstat below passes it over). */
        int fd = openat(dir, name, O_RDONLY | O_NONBLOCK | O_NOFOLLOW | O_CLOEXEC);
        if (fd < 0) {
            if (errno == ENOENT)
                break;
            if (errno == ELOOP || errno == ENXIO)
                continue; /* turned into a link or a socket since the check */
            return prism_error_set(err, errno == EMFILE || errno == ENFILE ? PRISM_ERR_UNAVAILABLE : PRISM_ERR_IO,
                                   "segment %s: %s", name, strerror(errno));
        }
        if (fstat(fd, &st) != 0) {
            int error = errno;
            close(fd);
            return prism_error_set(err, PRISM_ERR_IO, "segment %s: %s", name, strerror(error));
        }
        if (!S_ISREG(st.st_mode)) {
            close(fd);
            continue;
        }
        r->files[r->nfiles++] = (reader_file){numbers[i], fd};
    }
    for (size_t i = 0; i < r->nfiles / 2; i++) {
        reader_file x = r->files[i];
        r->files[i] = r->files[r->nfiles - 1 - i];
        r->files[r->nfiles - 1 - i] = x;
    }
    return PRISM_OK;
}

prism_status prismd_trace_reader_open(const char *data_dir, const char *job_id, prismd_trace_reader **out,
                                      prism_error *err)
{
    *out = NULL;
    prismd_trace_reader *r = calloc(1, sizeof *r);
    if (!r || !(r->chunk = malloc(READER_CHUNK))) {
        free(r);
        return prism_error_set(err, PRISM_ERR_NOMEM, "out of memory");
    }
    if (!data_dir) {
        *out = r;
        return PRISM_OK;
    }
    char path[4096];
    trace_path(data_dir, job_id, 0, path, sizeof path);
    int dfd = open(path, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    DIR *d = dfd >= 0 ? fdopendir(dfd) : NULL;
    if (!d) {
        int error = errno;
        if (dfd >= 0)
            close(dfd);
        if (error == ENOENT) {
            *out = r; /* no trace yet */
            return PRISM_OK;
        }
        prismd_trace_reader_close(r);
        return prism_error_set(err, error == EMFILE || error == ENFILE || error == ENOMEM ? PRISM_ERR_UNAVAILABLE
                                                                                          : PRISM_ERR_IO,
                               "the trace directory: %s", strerror(error));
    }
    uint64_t *numbers = NULL;
    size_t count = 0;
    prism_status st = list_numbers(d, &numbers, &count, err);
    if (!st)
        st = open_segments(r, dirfd(d), numbers, count, err);
    free(numbers);
    closedir(d);
    if (st) {
        prismd_trace_reader_close(r);
        return st;
    }
    *out = r;
    return PRISM_OK;
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
    if (r->failed)
        return -1;
    size_t n = 0;
    while (n < max && r->cur < r->nfiles) {
        int fd = r->files[r->cur].fd;
        if (!r->measured) {
            struct stat st;
            if (fstat(fd, &st) != 0 || (r->end = whole_records_end(r, fd, st.st_size)) < 0) {
                r->failed = true;
                break;
            }
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
        if (got <= 0) {
            r->failed = true; /* a read error, or the segment shrank under us */
            break;
        }
        r->off += got;
        n += (size_t)got;
    }
    if (r->failed && n == 0)
        return -1;
    return (ssize_t)n; /* what was gathered; a failure is reported by the next call */
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
