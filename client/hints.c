/* The shared-memory hint table (hints.h): the agent's seqlock writer and the trainer's bounded
 * reader. The file handling and the seqlock's ordering (both seqlocks) are shm_table.h's. */
#define _GNU_SOURCE
#include "hints.h"
#include "shm_table.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "the hint table is little-endian and mapped as native structs"
#endif

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

/* ---- files -------------------------------------------------------------------------------- */

/* A fresh table reads as: every slot empty, every precision bf16, the job's low format int8. */
static void init_fresh(void *header)
{
    ((prism_hints_header *)header)->low_precision = PRISM_PRECISION_INT8;
}

static const prism_shm_kind hints_kind = {
    .what = "a Prism hint table",
    .magic = PRISM_HINTS_MAGIC,
    .layout_version = PRISM_HINTS_LAYOUT_VERSION,
    .max_blocks_limit = PRISM_HINTS_MAX_BLOCKS_LIMIT,
    .header_bytes = PRISM_HINTS_HEADER_BYTES,
    .slots = PRISM_HINTS_SLOTS,
    .init = init_fresh,
};

_Static_assert(offsetof(prism_hints_header, magic) == offsetof(prism_shm_prefix, magic) &&
                   offsetof(prism_hints_header, layout_version) == offsetof(prism_shm_prefix, layout_version) &&
                   offsetof(prism_hints_header, max_blocks) == offsetof(prism_shm_prefix, max_blocks) &&
                   offsetof(prism_hints_header, file_bytes) == offsetof(prism_shm_prefix, file_bytes),
               "the hint table starts with the shared prefix");

/* Takes a mapping made by prism_shm_open or prism_shm_create. */
static void adopt(prism_hints *t, const prism_shm_map *m)
{
    t->h = m->base;
    t->precisions = (uint8_t *)m->base + PRISM_HINTS_HEADER_BYTES;
    t->bytes = m->bytes;
    t->fd = m->fd;
    t->pid = (uint64_t)getpid(); /* taken here, so that the writes make no system call */
}

static prism_status open_existing(prism_hints *t, const char *path, uint32_t max_blocks, bool writable,
                                  prism_error *err)
{
    prism_shm_map m;
    prism_status s = prism_shm_open(&hints_kind, path, max_blocks, writable, &m, err);
    if (s == PRISM_OK)
        adopt(t, &m);
    return s;
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
    prism_status s = open_existing(t, path, max_blocks, true, &ignored);
    if (s == PRISM_ERR_IO)
        return prism_error_set(err, s, "%s", ignored.message);
    if (s != PRISM_OK) {
        prism_shm_map m;
        s = prism_shm_create(&hints_kind, path, max_blocks, &m, err);
        if (s != PRISM_OK)
            return s;
        adopt(t, &m);
    }
    prism_hints_header *h = t->h;
    /* A previous agent that died mid-write left seq odd; its slot has version 0 (the write
     * order), so the table is consistent and only seq needs to become even again. */
    prism_seq_repair(&h->seq);
    prism_seq_write_begin(&h->seq);
    h->generation++;
    h->agent_pid = (uint64_t)getpid();
    prism_seq_write_end(&h->seq);
    return PRISM_OK;
}

prism_status prism_hints_open(prism_hints *t, const char *path, prism_error *err)
{
    if (!t || !path)
        return prism_error_set(err, PRISM_ERR_INVALID, "prism_hints_open: %s is NULL", !t ? "t" : "path");
    memset(t, 0, sizeof *t);
    t->fd = -1;
    return open_existing(t, path, 0, true, err); /* the trainer writes its line */
}

bool prism_hints_replaced(const prism_hints *t, const char *path)
{
    return !t || !t->h || !path || prism_shm_replaced(t->fd, path);
}

void prism_hints_close(prism_hints *t)
{
    if (!t)
        return;
    prism_shm_map m = {t->h, t->bytes, t->fd};
    prism_shm_unmap(&m);
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
        uint64_t start = prism_seq_read_begin(&h->applied_seq);
        if (start == UINT64_MAX)
            continue;
        prism_hints_trainer line;
        line.applied_version = h->applied_version;
        line.applied_step = h->applied_step;
        line.published = h->counters_published;
        line.reports_dropped = h->reports_dropped;
        line.late_switches = h->late_switches;
        line.ext = h->ext;
        if (!prism_seq_read_end(&h->applied_seq, start))
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
    prism_seq_write_begin(&h->seq);
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
    prism_seq_write_end(&h->seq);
    return PRISM_OK;
}

void prism_hints_set_status(prism_hints *t, bool upstream_connected, bool calibration_needed,
                            bool run_calibration, uint32_t calibration_samples, prism_precision low_precision)
{
    if (!t || !t->h)
        return;
    prism_hints_header *h = t->h;
    prism_seq_write_begin(&h->seq);
    h->upstream_connected = upstream_connected;
    h->calibration_needed = calibration_needed;
    h->run_calibration = run_calibration;
    h->calibration_samples = calibration_samples;
    h->low_precision = (uint32_t)low_precision;
    prism_seq_write_end(&h->seq);
}

void prism_hints_set_numerics(prism_hints *t, const prism_hints_numerics *numerics)
{
    if (!t || !t->h || !numerics)
        return;
    prism_hints_numerics n = *numerics;
    n.published = 1;
    if (n.n_low_formats > PRISM_HINTS_FORMATS_MAX)
        n.n_low_formats = PRISM_HINTS_FORMATS_MAX;
    if (n.n_calibration_formats > PRISM_HINTS_FORMATS_MAX)
        n.n_calibration_formats = PRISM_HINTS_FORMATS_MAX;
    n.reserved = 0;
    prism_seq_write_begin(&t->h->seq);
    t->h->numerics = n;
    prism_seq_write_end(&t->h->seq);
}

void prism_hints_set_runtime(prism_hints *t, const prism_runtime_hints *hints)
{
    if (!t || !t->h || !hints)
        return;
    prism_seq_write_begin(&t->h->seq);
    t->h->hints = *hints;
    prism_seq_write_end(&t->h->seq);
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
        uint64_t start = prism_seq_read_begin(&h->seq);
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
        v.numerics = h->numerics;
        if (!prism_seq_read_end(&h->seq, start))
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
    prism_seq_write_begin(&h->applied_seq);
    h->applied_version = map_version;
    h->applied_step = step;
    h->trainer_pid = t->pid;
    prism_seq_write_end(&h->applied_seq);
}

void prism_hints_write_trainer(prism_hints *t, const prism_hints_trainer *line)
{
    if (!t || !t->h || !line)
        return;
    prism_hints_header *h = t->h;
    prism_seq_write_begin(&h->applied_seq);
    h->applied_version = line->applied_version;
    h->applied_step = line->applied_step;
    h->trainer_pid = t->pid;
    h->counters_published = 2;
    h->reports_dropped = line->reports_dropped;
    h->late_switches = line->late_switches;
    h->ext = line->ext;
    prism_seq_write_end(&h->applied_seq);
}
