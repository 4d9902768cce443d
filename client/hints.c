/* The shared-memory hint table (hints.h): file handling, the agent's seqlock writer and the
 * trainer's bounded reader.
 *
 * Seqlock ordering (both seqlocks): the writer stores seq + 1 (odd), issues a release fence so
 * that no data store is seen before it, writes the data, and stores seq + 2 with release. A reader
 * loads seq with acquire, copies, issues an acquire fence so that its copies are done before it
 * loads seq again, and keeps the copy when both loads gave the same even number. */
#define _GNU_SOURCE
#include "hints.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "the hint table is little-endian and mapped as native structs"
#endif

static size_t table_bytes(uint32_t max_blocks)
{
    return (size_t)PRISM_HINTS_HEADER_BYTES + (size_t)PRISM_HINTS_SLOTS * max_blocks;
}

static uint8_t *slot_bytes(const prism_hints *t, unsigned slot)
{
    return t->precisions + (size_t)slot * t->h->max_blocks;
}

/* CLOCK_MONOTONIC in nanoseconds: on Linux a vDSO call, no system call. Agent and trainer share
 * a kernel (one pod), so their monotonic clocks are the same clock. */
static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* ---- seqlocks ----------------------------------------------------------------------------- */

static void write_begin(_Atomic uint64_t *seq)
{
    uint64_t s = atomic_load_explicit(seq, memory_order_relaxed);
    atomic_store_explicit(seq, s + 1, memory_order_relaxed);
    atomic_thread_fence(memory_order_release);
}

static void write_end(_Atomic uint64_t *seq)
{
    uint64_t s = atomic_load_explicit(seq, memory_order_relaxed);
    atomic_store_explicit(seq, s + 1, memory_order_release);
}

/* Even value of seq at the start of a read attempt, or UINT64_MAX while a write is under way. */
static uint64_t read_begin(const _Atomic uint64_t *seq)
{
    uint64_t s = atomic_load_explicit((_Atomic uint64_t *)seq, memory_order_acquire);
    return (s & 1) ? UINT64_MAX : s;
}

static bool read_end(const _Atomic uint64_t *seq, uint64_t start)
{
    atomic_thread_fence(memory_order_acquire);
    return atomic_load_explicit((_Atomic uint64_t *)seq, memory_order_relaxed) == start;
}

/* ---- files -------------------------------------------------------------------------------- */

static prism_status map_fd(prism_hints *t, int fd, size_t bytes, const char *path, prism_error *err)
{
    void *p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED)
        return prism_error_set(err, PRISM_ERR_IO, "%s: mmap of %zu bytes: %s", path, bytes, strerror(errno));
    t->h = p;
    t->precisions = (uint8_t *)p + PRISM_HINTS_HEADER_BYTES;
    t->bytes = bytes;
    t->fd = fd;
    t->pid = (uint64_t)getpid();
    return PRISM_OK;
}

/* Checks a header against the file it came from; PRISM_ERR_INVALID naming the field. max_blocks
 * 0 accepts any valid count (the trainer's side). */
static prism_status check_header(const prism_hints_header *h, size_t file_size, uint32_t want_max_blocks,
                                 const char *path, prism_error *err)
{
    if (h->magic != PRISM_HINTS_MAGIC)
        return prism_error_set(err, PRISM_ERR_INVALID, "%s: magic 0x%016llx is not a Prism hint table (0x%016llx)",
                               path, (unsigned long long)h->magic, (unsigned long long)PRISM_HINTS_MAGIC);
    if (h->layout_version != PRISM_HINTS_LAYOUT_VERSION)
        return prism_error_set(err, PRISM_ERR_INVALID, "%s: layout_version %u, this build reads %u", path,
                               h->layout_version, PRISM_HINTS_LAYOUT_VERSION);
    if (h->max_blocks == 0 || h->max_blocks > PRISM_HINTS_MAX_BLOCKS_LIMIT)
        return prism_error_set(err, PRISM_ERR_INVALID, "%s: max_blocks %u is outside [1, %u]", path, h->max_blocks,
                               PRISM_HINTS_MAX_BLOCKS_LIMIT);
    if (want_max_blocks && h->max_blocks != want_max_blocks)
        return prism_error_set(err, PRISM_ERR_INVALID, "%s: max_blocks %u, wanted %u", path, h->max_blocks,
                               want_max_blocks);
    size_t want = table_bytes(h->max_blocks);
    if (h->file_bytes != want)
        return prism_error_set(err, PRISM_ERR_INVALID, "%s: file_bytes %llu, max_blocks %u needs %zu", path,
                               (unsigned long long)h->file_bytes, h->max_blocks, want);
    if (file_size != want)
        return prism_error_set(err, PRISM_ERR_INVALID, "%s: file size %zu bytes, max_blocks %u needs %zu", path,
                               file_size, h->max_blocks, want);
    return PRISM_OK;
}

/* Tries to map an existing table the agent can keep. PRISM_ERR_NOT_FOUND when there is none,
 * PRISM_ERR_INVALID when there is one it must replace. */
static prism_status open_existing(prism_hints *t, const char *path, uint32_t max_blocks, prism_error *err)
{
    int fd = open(path, O_RDWR | O_CLOEXEC);
    if (fd < 0)
        return prism_error_set(err, errno == ENOENT ? PRISM_ERR_NOT_FOUND : PRISM_ERR_IO, "%s: %s", path,
                               strerror(errno));
    struct stat st;
    if (fstat(fd, &st) != 0) {
        prism_status s = prism_error_set(err, PRISM_ERR_IO, "%s: fstat: %s", path, strerror(errno));
        close(fd);
        return s;
    }
    if (!S_ISREG(st.st_mode) || (size_t)st.st_size < PRISM_HINTS_HEADER_BYTES) {
        close(fd);
        return prism_error_set(err, PRISM_ERR_INVALID, "%s: size %lld is smaller than the header", path,
                               (long long)st.st_size);
    }
    prism_status s = map_fd(t, fd, (size_t)st.st_size, path, err);
    if (s != PRISM_OK) {
        close(fd);
        return s;
    }
    s = check_header(t->h, (size_t)st.st_size, max_blocks, path, err);
    if (s != PRISM_OK) {
        prism_hints_close(t);
        return s;
    }
    return PRISM_OK;
}

/* Writes a fresh empty table beside path and renames it over path, so that nobody ever maps a
 * half-written one and a trainer's mapping of an old file stays valid. */
static prism_status create_fresh(prism_hints *t, const char *path, uint32_t max_blocks, prism_error *err)
{
    char tmp[4096];
    if (snprintf(tmp, sizeof tmp, "%s.tmp.%ld", path, (long)getpid()) >= (int)sizeof tmp)
        return prism_error_set(err, PRISM_ERR_INVALID, "%s: path too long", path);
    unlink(tmp); /* a leftover of an earlier agent with our pid */
    int fd = open(tmp, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0660);
    if (fd < 0)
        return prism_error_set(err, PRISM_ERR_IO, "%s: create: %s", tmp, strerror(errno));
    size_t bytes = table_bytes(max_blocks);
    prism_status s = PRISM_OK;
    if (fchmod(fd, 0660) != 0 || ftruncate(fd, (off_t)bytes) != 0)
        s = prism_error_set(err, PRISM_ERR_IO, "%s: size %zu: %s", tmp, bytes, strerror(errno));
    if (s == PRISM_OK)
        s = map_fd(t, fd, bytes, tmp, err);
    if (s != PRISM_OK) {
        close(fd);
        unlink(tmp);
        return s;
    }
    /* ftruncate gave zeros: every slot empty, every precision bf16, seq 0. */
    t->h->magic = PRISM_HINTS_MAGIC;
    t->h->layout_version = PRISM_HINTS_LAYOUT_VERSION;
    t->h->max_blocks = max_blocks;
    t->h->file_bytes = bytes;
    t->h->low_precision = PRISM_PRECISION_INT8;
    if (rename(tmp, path) != 0) {
        s = prism_error_set(err, PRISM_ERR_IO, "%s: rename from %s: %s", path, tmp, strerror(errno));
        prism_hints_close(t);
        unlink(tmp);
        return s;
    }
    return PRISM_OK;
}

prism_status prism_hints_create(prism_hints *t, const char *path, uint32_t max_blocks, prism_error *err)
{
    if (!t || !path)
        return prism_error_set(err, PRISM_ERR_INVALID, "prism_hints_create: %s is NULL", !t ? "t" : "path");
    memset(t, 0, sizeof *t);
    t->fd = -1;
    if (max_blocks == 0 || max_blocks > PRISM_HINTS_MAX_BLOCKS_LIMIT)
        return prism_error_set(err, PRISM_ERR_INVALID, "max_blocks %u is outside [1, %u]", max_blocks,
                               PRISM_HINTS_MAX_BLOCKS_LIMIT);
    prism_error ignored;
    prism_status s = open_existing(t, path, max_blocks, &ignored);
    if (s == PRISM_ERR_IO)
        return prism_error_set(err, s, "%s", ignored.message);
    if (s != PRISM_OK) {
        s = create_fresh(t, path, max_blocks, err);
        if (s != PRISM_OK)
            return s;
    }
    prism_hints_header *h = t->h;
    /* A previous agent that died mid-write left seq odd; its slot has version 0 (the write
     * order), so the table is consistent and only seq needs to become even again. */
    uint64_t seq = atomic_load_explicit(&h->seq, memory_order_relaxed);
    if (seq & 1)
        atomic_store_explicit(&h->seq, seq + 1, memory_order_relaxed);
    write_begin(&h->seq);
    h->generation++;
    h->agent_pid = (uint64_t)getpid();
    write_end(&h->seq);
    return PRISM_OK;
}

prism_status prism_hints_open(prism_hints *t, const char *path, prism_error *err)
{
    if (!t || !path)
        return prism_error_set(err, PRISM_ERR_INVALID, "prism_hints_open: %s is NULL", !t ? "t" : "path");
    memset(t, 0, sizeof *t);
    t->fd = -1;
    return open_existing(t, path, 0, err);
}

bool prism_hints_replaced(const prism_hints *t, const char *path)
{
    if (!t || !t->h || !path)
        return true;
    struct stat now, mine;
    if (stat(path, &now) != 0 || fstat(t->fd, &mine) != 0)
        return true;
    return now.st_ino != mine.st_ino || now.st_dev != mine.st_dev;
}

void prism_hints_close(prism_hints *t)
{
    if (!t)
        return;
    if (t->h) {
        munmap(t->h, t->bytes);
        close(t->fd);
    }
    memset(t, 0, sizeof *t);
    t->fd = -1;
}

/* ---- the agent's side --------------------------------------------------------------------- */

const char *const prism_hints_drop_names[PRISM_HINTS_DROP_REASONS] = {
    [PRISM_HINTS_DROP_NO_AGENT] = "no_agent",
    [PRISM_HINTS_DROP_AGENT_BUSY] = "agent_busy",
    [PRISM_HINTS_DROP_CONNECTION_LOST] = "connection_lost",
    [PRISM_HINTS_DROP_STATS_PENDING] = "stats_pending",
    [PRISM_HINTS_DROP_STATS_FAILED] = "stats_failed",
    [PRISM_HINTS_DROP_TOO_BIG] = "too_big",
    [PRISM_HINTS_DROP_NO_MEMORY] = "no_memory",
};

const uint64_t prism_hints_lag_edges_ns[PRISM_HINTS_LAG_EDGES] = {
    1000000ull, 10000000ull, 100000000ull, 500000000ull, 1000000000ull, 2000000000ull,
    5000000000ull, 10000000000ull, 30000000000ull, 60000000000ull, 300000000000ull,
};

unsigned prism_hints_lag_bucket(uint64_t ns)
{
    unsigned i = 0;
    while (i < PRISM_HINTS_LAG_EDGES && ns > prism_hints_lag_edges_ns[i])
        i++;
    return i;
}

bool prism_hints_read_trainer(const prism_hints *t, prism_hints_trainer *out)
{
    if (!t || !t->h || !out)
        return false;
    const prism_hints_header *h = t->h;
    for (unsigned i = 0; i < 64; i++) {
        uint64_t start = read_begin(&h->applied_seq);
        if (start == UINT64_MAX)
            continue;
        prism_hints_trainer line;
        line.applied_version = h->applied_version;
        line.applied_step = h->applied_step;
        line.published = h->counters_published;
        line.reports_dropped = h->reports_dropped;
        line.late_switches = h->late_switches;
        line.ext = h->ext;
        if (!read_end(&h->applied_seq, start))
            continue;
        if (line.published == 0) {
            line.reports_dropped = line.late_switches = 0;
            memset(&line.ext, 0, sizeof line.ext);
        } else if (line.published != 2) {
            line.published = 1; /* an older trainer: the extension is not its */
            memset(&line.ext, 0, sizeof line.ext);
        }
        *out = line;
        return true;
    }
    return false;
}

bool prism_hints_read_applied(const prism_hints *t, uint64_t *map_version, uint64_t *applied_step)
{
    prism_hints_trainer line;
    if (!prism_hints_read_trainer(t, &line))
        return false;
    if (map_version)
        *map_version = line.applied_version;
    if (applied_step)
        *applied_step = line.applied_step;
    return true;
}

unsigned prism_hints_held_versions(const prism_hints *t, uint64_t out[PRISM_HINTS_SLOTS])
{
    unsigned n = 0;
    if (!t || !t->h)
        return 0;
    for (unsigned i = 0; i < PRISM_HINTS_SLOTS; i++)
        if (t->h->slots[i].map_version != 0)
            out[n++] = t->h->slots[i].map_version;
    return n;
}

/* The slot rule of hints.h: an empty slot, else the lowest version that is neither applied nor
 * the newest. Without a consistent applied version (the trainer died mid-write) the slot in
 * effect at the trainer's last known step is unknown; the second newest is then kept too, which
 * with four slots still leaves one to write. At most two slots are kept, so two remain to choose
 * from: a corrupt table that holds the applied version in several slots keeps only the first of
 * them (found by fuzzing: keeping them all left no slot, and the map went past the last one). */
static unsigned choose_slot(const prism_hints *t)
{
    const prism_hints_slot *slots = t->h->slots;
    unsigned newest = 0, second = PRISM_HINTS_SLOTS;
    for (unsigned i = 0; i < PRISM_HINTS_SLOTS; i++) {
        if (slots[i].map_version == 0)
            return i;
        if (slots[i].map_version > slots[newest].map_version)
            newest = i;
    }
    for (unsigned i = 0; i < PRISM_HINTS_SLOTS; i++)
        if (i != newest && (second == PRISM_HINTS_SLOTS || slots[i].map_version > slots[second].map_version))
            second = i;
    uint64_t applied;
    unsigned kept = second;
    if (prism_hints_read_applied(t, &applied, NULL)) {
        kept = PRISM_HINTS_SLOTS;
        for (unsigned i = 0; i < PRISM_HINTS_SLOTS && kept == PRISM_HINTS_SLOTS; i++)
            if (i != newest && slots[i].map_version == applied)
                kept = i;
    }
    unsigned best = PRISM_HINTS_SLOTS;
    for (unsigned i = 0; i < PRISM_HINTS_SLOTS; i++) {
        if (i == newest || i == kept)
            continue;
        if (best == PRISM_HINTS_SLOTS || slots[i].map_version < slots[best].map_version)
            best = i;
    }
    return best;
}

prism_status prism_hints_publish_map(prism_hints *t, uint64_t map_version, uint64_t decided_step,
                                     uint64_t effective_step, const uint8_t *precisions, uint32_t n_blocks,
                                     prism_error *err)
{
    if (!t || !t->h)
        return prism_error_set(err, PRISM_ERR_STATE, "prism_hints_publish_map: the table is not open");
    prism_hints_header *h = t->h;
    if (map_version == 0)
        return prism_error_set(err, PRISM_ERR_INVALID, "map_version: 0 is reserved for the empty map");
    if (n_blocks > h->max_blocks)
        return prism_error_set(err, PRISM_ERR_LIMIT, "n_blocks: %u blocks, the table holds %u", n_blocks,
                               h->max_blocks);
    if (n_blocks > 0 && !precisions)
        return prism_error_set(err, PRISM_ERR_INVALID, "precisions: NULL with n_blocks %u", n_blocks);
    for (uint32_t i = 0; i < n_blocks; i++)
        if (precisions[i] >= PRISM_PRECISION_COUNT)
            return prism_error_set(err, PRISM_ERR_INVALID, "precisions[%u]: %u is not a precision", i,
                                   precisions[i]);
    for (unsigned i = 0; i < PRISM_HINTS_SLOTS; i++)
        if (h->slots[i].map_version >= map_version)
            return prism_error_set(err, PRISM_ERR_STATE,
                                   "map_version %llu: the table already holds version %llu",
                                   (unsigned long long)map_version, (unsigned long long)h->slots[i].map_version);

    unsigned slot = choose_slot(t);
    prism_hints_slot *sl = &h->slots[slot];
    uint8_t *bytes = slot_bytes(t, slot);
    write_begin(&h->seq);
    sl->map_version = 0; /* a writer that dies from here on leaves an empty slot */
    atomic_signal_fence(memory_order_seq_cst);
    if (n_blocks > 0)
        memcpy(bytes, precisions, n_blocks);
    memset(bytes + n_blocks, PRISM_PRECISION_BF16, h->max_blocks - n_blocks);
    sl->decided_step = decided_step;
    sl->effective_step = effective_step;
    sl->n_blocks = n_blocks;
    h->slot_written[slot].map_version = map_version;
    h->slot_written[slot].ns = now_ns();
    atomic_signal_fence(memory_order_seq_cst);
    sl->map_version = map_version;
    write_end(&h->seq);
    return PRISM_OK;
}

void prism_hints_set_status(prism_hints *t, bool upstream_connected, bool calibration_needed,
                            bool run_calibration, uint32_t calibration_samples, prism_precision low_precision)
{
    if (!t || !t->h)
        return;
    prism_hints_header *h = t->h;
    write_begin(&h->seq);
    h->upstream_connected = upstream_connected;
    h->calibration_needed = calibration_needed;
    h->run_calibration = run_calibration;
    h->calibration_samples = calibration_samples;
    h->low_precision = (uint32_t)low_precision;
    write_end(&h->seq);
}

void prism_hints_set_runtime(prism_hints *t, const prism_runtime_hints *hints)
{
    if (!t || !t->h || !hints)
        return;
    write_begin(&t->h->seq);
    t->h->hints = *hints;
    write_end(&t->h->seq);
}

/* ---- the trainer's side ------------------------------------------------------------------- */

bool prism_hints_read(const prism_hints *t, uint64_t step, prism_hints_view *view, uint8_t *out, uint32_t cap,
                      unsigned tries)
{
    if (!t || !t->h || !view || (cap > 0 && !out))
        return false;
    const prism_hints_header *h = t->h;
    if (tries == 0)
        tries = 1;
    for (unsigned attempt = 0; attempt < tries; attempt++) {
        uint64_t start = read_begin(&h->seq);
        if (start == UINT64_MAX)
            continue;
        prism_hints_view v;
        memset(&v, 0, sizeof v);
        unsigned use = PRISM_HINTS_SLOTS;
        for (unsigned i = 0; i < PRISM_HINTS_SLOTS; i++) {
            uint64_t ver = h->slots[i].map_version;
            if (ver != 0 && h->slots[i].effective_step <= step &&
                (use == PRISM_HINTS_SLOTS || ver > h->slots[use].map_version))
                use = i;
        }
        uint32_t copied = 0;
        if (use < PRISM_HINTS_SLOTS) {
            const prism_hints_slot *sl = &h->slots[use];
            v.map_version = sl->map_version;
            v.decided_step = sl->decided_step;
            v.effective_step = sl->effective_step;
            v.n_blocks = sl->n_blocks;
            /* A stamp for another version is an older agent's rewrite of the slot: not timed. */
            if (h->slot_written[use].map_version == sl->map_version)
                v.written_ns = h->slot_written[use].ns;
            /* A torn read may give any count: never copy past the slot or the caller's array. */
            copied = v.n_blocks < cap ? v.n_blocks : cap;
            if (copied > h->max_blocks)
                copied = h->max_blocks;
            if (copied > 0)
                memcpy(out, slot_bytes(t, use), copied);
        }
        v.upstream_connected = h->upstream_connected != 0;
        v.calibration_needed = h->calibration_needed != 0;
        v.run_calibration = h->run_calibration != 0;
        v.calibration_samples = h->calibration_samples;
        v.low_precision = (prism_precision)h->low_precision;
        v.hints = h->hints;
        if (!read_end(&h->seq, start))
            continue;
        if (copied < cap)
            memset(out + copied, PRISM_PRECISION_BF16, cap - copied);
        *view = v;
        return true;
    }
    return false;
}

void prism_hints_write_applied(prism_hints *t, uint64_t map_version, uint64_t step)
{
    if (!t || !t->h)
        return;
    prism_hints_header *h = t->h;
    write_begin(&h->applied_seq);
    h->applied_version = map_version;
    h->applied_step = step;
    h->trainer_pid = t->pid;
    write_end(&h->applied_seq);
}

void prism_hints_write_trainer(prism_hints *t, const prism_hints_trainer *line)
{
    if (!t || !t->h || !line)
        return;
    prism_hints_header *h = t->h;
    write_begin(&h->applied_seq);
    h->applied_version = line->applied_version;
    h->applied_step = line->applied_step;
    h->trainer_pid = t->pid;
    h->counters_published = 2;
    h->reports_dropped = line->reports_dropped;
    h->late_switches = line->late_switches;
    h->ext = line->ext;
    write_end(&h->applied_seq);
}
