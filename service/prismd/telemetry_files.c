/* A job's telemetry files: rotation and a streaming reader (telemetry_files.h). */
#define _GNU_SOURCE
#include "telemetry_files.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define READER_CHUNK (64u * 1024u)
#define READER_MAX_FILES 101u /* PATH and PATH.1 .. PATH.100 (--telemetry-keep is at most 100) */

unsigned prismd_telemetry_rotate(const char *path, size_t keep)
{
    char from[4200], to[4200];
    unsigned dropped = 0;
    if (keep == 0)
        return unlink(path) == 0 ? 1u : 0u;
    snprintf(to, sizeof to, "%s.%zu", path, keep);
    if (access(to, F_OK) == 0)
        dropped = 1; /* the rename below replaces it */
    for (size_t i = keep; i >= 1; i--) {
        if (i == 1)
            snprintf(from, sizeof from, "%s", path);
        else
            snprintf(from, sizeof from, "%s.%zu", path, i - 1);
        snprintf(to, sizeof to, "%s.%zu", path, i);
        if (rename(from, to) != 0 && errno != ENOENT && i == 1)
            unlink(path); /* PATH must not grow on: drop it rather than keep it */
    }
    return dropped;
}

struct prismd_telemetry_reader {
    int fds[READER_MAX_FILES]; /* oldest first */
    size_t nfds, cur;
    off_t off;        /* the next byte of fds[cur] not yet looked at */
    off_t copy_end;   /* while > off: the record's bytes [off, copy_end) are being sent */
    uint64_t since, limit, count;
    size_t max_bytes, sent;
    char lit[160];    /* literal text due before anything else: prefix, ",", suffix */
    size_t lit_len, lit_pos;
    bool finished;    /* the suffix has been queued */
    bool truncated;
    char *chunk;      /* READER_CHUNK bytes of scratch */
};

prismd_telemetry_reader *prismd_telemetry_reader_open(const char *path, size_t keep, const char *job_id,
                                                      uint64_t since, uint64_t limit, size_t max_bytes)
{
    prismd_telemetry_reader *r = calloc(1, sizeof *r);
    if (!r || !(r->chunk = malloc(READER_CHUNK))) {
        free(r);
        return NULL;
    }
    r->since = since;
    r->limit = limit;
    r->max_bytes = max_bytes;
    /* Newest first, skipping a file already open under another name: a rotation in between
     * renames PATH to PATH.1 and so on upwards, so each file is met once at most. */
    int newest_first[READER_MAX_FILES];
    struct stat ids[READER_MAX_FILES];
    size_t n = 0;
    if (keep > READER_MAX_FILES - 1)
        keep = READER_MAX_FILES - 1;
    for (size_t i = 0; i <= keep; i++) {
        char name[4200];
        if (i == 0)
            snprintf(name, sizeof name, "%s", path);
        else
            snprintf(name, sizeof name, "%s.%zu", path, i);
        int fd = open(name, O_RDONLY | O_CLOEXEC);
        if (fd < 0)
            continue;
        bool seen = fstat(fd, &ids[n]) != 0;
        for (size_t k = 0; k < n && !seen; k++)
            seen = ids[k].st_ino == ids[n].st_ino && ids[k].st_dev == ids[n].st_dev;
        if (seen)
            close(fd);
        else
            newest_first[n++] = fd;
    }
    for (size_t i = 0; i < n; i++)
        r->fds[i] = newest_first[n - 1 - i];
    r->nfds = n;
    r->lit_len = (size_t)snprintf(r->lit, sizeof r->lit, "{\"job_id\":\"%.128s\",\"records\":[", job_id);
    return r;
}

static void finish(prismd_telemetry_reader *r, bool truncated, uint64_t next_step)
{
    r->finished = true;
    r->truncated = truncated;
    r->lit_pos = 0;
    if (truncated)
        r->lit_len = (size_t)snprintf(r->lit, sizeof r->lit, "],\"truncated\":true,\"next_since_step\":%" PRIu64 "}",
                                      next_step);
    else
        r->lit_len = (size_t)snprintf(r->lit, sizeof r->lit, "]}");
}

/* Moves to the next record to send (setting off and copy_end, and "," when one went before),
 * or finishes the answer. Returns false on a read error. */
static bool next_record(prismd_telemetry_reader *r)
{
    static const char key[] = "{\"step_id\":";
    r->copy_end = 0; /* nothing is being copied (off may move to another file below) */
    while (r->cur < r->nfds) {
        if (r->count >= r->limit) {
            finish(r, false, 0);
            return true;
        }
        int fd = r->fds[r->cur];
        ssize_t got = pread(fd, r->chunk, READER_CHUNK, r->off);
        if (got < 0)
            return false;
        if (got == 0) {
            r->cur++;
            r->off = 0;
            continue;
        }
        /* The line's head decides; its end is looked for chunk by chunk. */
        size_t head = (size_t)got;
        bool is_record = head > sizeof key - 1 && memcmp(r->chunk, key, sizeof key - 1) == 0 &&
                         r->chunk[sizeof key - 1] >= '0' && r->chunk[sizeof key - 1] <= '9';
        uint64_t step = 0;
        if (is_record) {
            for (size_t i = sizeof key - 1; i < head && r->chunk[i] >= '0' && r->chunk[i] <= '9'; i++)
                step = step > (UINT64_MAX - 9) / 10 ? UINT64_MAX : step * 10 + (uint64_t)(r->chunk[i] - '0');
        }
        off_t at = r->off;
        const char *nl = memchr(r->chunk, '\n', head);
        while (!nl) {
            at += got;
            got = pread(fd, r->chunk, READER_CHUNK, at);
            if (got < 0)
                return false;
            if (got == 0)
                break;
            nl = memchr(r->chunk, '\n', (size_t)got);
        }
        if (!nl) { /* a line still being written (or cut by a crash): nothing more in this file */
            r->cur++;
            r->off = 0;
            continue;
        }
        off_t end = at + (nl - r->chunk);
        if (!is_record || step < r->since) {
            r->off = end + 1;
            continue;
        }
        size_t len = (size_t)(end - r->off);
        if (r->count > 0 && r->sent + len > r->max_bytes) {
            finish(r, true, step);
            return true;
        }
        r->copy_end = end;
        r->lit_pos = 0;
        r->lit_len = 0;
        if (r->count > 0)
            r->lit[r->lit_len++] = ',';
        r->count++;
        r->sent += len;
        return true;
    }
    finish(r, false, 0);
    return true;
}

size_t prismd_piece_copy(char *buf, size_t n, size_t max, const char *src, size_t len, size_t *pos)
{
    size_t k = len - *pos < max - n ? len - *pos : max - n;
    memcpy(buf + n, src + *pos, k);
    *pos += k;
    return n + k;
}

ssize_t prismd_telemetry_reader_read(prismd_telemetry_reader *r, char *buf, size_t max)
{
    size_t n = 0;
    while (n < max) {
        if (r->lit_pos < r->lit_len) {
            n = prismd_piece_copy(buf, n, max, r->lit, r->lit_len, &r->lit_pos);
        } else if (r->copy_end > r->off) {
            size_t want = (size_t)(r->copy_end - r->off) < max - n ? (size_t)(r->copy_end - r->off) : max - n;
            ssize_t got = pread(r->fds[r->cur], buf + n, want, r->off);
            if (got <= 0)
                return -1; /* the file shrank under us: it is not ours to guess what was there */
            r->off += got;
            n += (size_t)got;
            if (r->off == r->copy_end)
                r->off++; /* past the newline */
        } else if (r->finished) {
            break;
        } else if (!next_record(r)) {
            return -1;
        }
    }
    return (ssize_t)n;
}

bool prismd_telemetry_reader_truncated(const prismd_telemetry_reader *r)
{
    return r->truncated;
}

void prismd_telemetry_reader_close(prismd_telemetry_reader *r)
{
    if (!r)
        return;
    for (size_t i = 0; i < r->nfds; i++)
        close(r->fds[i]);
    free(r->chunk);
    free(r);
}
