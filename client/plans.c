/* The shared-memory plan file (plans.h): the agent's seqlock writer and the trainer's bounded
 * reader. The file handling and the seqlock are the hint table's (shm_table.h). */
#define _GNU_SOURCE
#include "plans.h"
#include "shm_table.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "the plan file is little-endian and mapped as native structs"
#endif

static uint8_t *slot_blocks(const prism_plans *t, unsigned slot)
{
    return t->blocks + (size_t)slot * t->h->max_blocks;
}

/* ---- files -------------------------------------------------------------------------------- */

static const prism_shm_kind plans_kind = {
    .what = "a Prism plan file",
    .magic = PRISM_PLANS_MAGIC,
    .layout_version = PRISM_PLANS_LAYOUT_VERSION,
    .max_blocks_limit = PRISM_PLANS_MAX_BLOCKS_LIMIT,
    .header_bytes = PRISM_PLANS_HEADER_BYTES,
    .slots = PRISM_PLANS_SLOTS,
    .init = NULL, /* zeros: every slot empty, seq 0 */
};

_Static_assert(offsetof(prism_plans_header, magic) == offsetof(prism_shm_prefix, magic) &&
                   offsetof(prism_plans_header, layout_version) == offsetof(prism_shm_prefix, layout_version) &&
                   offsetof(prism_plans_header, max_blocks) == offsetof(prism_shm_prefix, max_blocks) &&
                   offsetof(prism_plans_header, file_bytes) == offsetof(prism_shm_prefix, file_bytes),
               "the plan file starts with the shared prefix");

/* Takes a mapping made by prism_shm_open or prism_shm_create. */
static void adopt(prism_plans *t, const prism_shm_map *m)
{
    t->h = m->base;
    t->blocks = (uint8_t *)m->base + PRISM_PLANS_HEADER_BYTES;
    t->bytes = m->bytes;
    t->fd = m->fd;
}

static prism_status open_existing(prism_plans *t, const char *path, uint32_t want_max_blocks, bool writable,
                                  prism_error *err)
{
    prism_shm_map m;
    prism_status s = prism_shm_open(&plans_kind, path, want_max_blocks, writable, &m, err);
    if (s == PRISM_OK)
        adopt(t, &m);
    return s;
}

prism_status prism_plans_create(prism_plans *t, const char *path, uint32_t max_blocks, prism_error *err)
{
    if (!t || !path)
        return prism_error_set(err, PRISM_ERR_INVALID, "prism_plans_create: %s is NULL", !t ? "t" : "path");
    memset(t, 0, sizeof *t);
    t->fd = -1;
    if (max_blocks == 0 || max_blocks > PRISM_PLANS_MAX_BLOCKS_LIMIT)
        return prism_error_set(err, PRISM_ERR_INVALID, "max_blocks %u is outside [1, %u]", max_blocks,
                               PRISM_PLANS_MAX_BLOCKS_LIMIT);
    prism_error ignored;
    prism_status s = open_existing(t, path, max_blocks, true, &ignored);
    if (s == PRISM_ERR_IO)
        return prism_error_set(err, s, "%s", ignored.message);
    if (s != PRISM_OK) {
        prism_shm_map m;
        s = prism_shm_create(&plans_kind, path, max_blocks, &m, err);
        if (s != PRISM_OK)
            return s;
        adopt(t, &m);
    }
    prism_plans_header *h = t->h;
    /* A writer that died mid-write left seq odd and its slot empty (the write order). */
    prism_seq_repair(&h->seq);
    prism_seq_write_begin(&h->seq);
    h->generation++;
    h->agent_pid = (uint64_t)getpid();
    prism_seq_write_end(&h->seq);
    return PRISM_OK;
}

prism_status prism_plans_open(prism_plans *t, const char *path, prism_error *err)
{
    if (!t || !path)
        return prism_error_set(err, PRISM_ERR_INVALID, "prism_plans_open: %s is NULL", !t ? "t" : "path");
    memset(t, 0, sizeof *t);
    t->fd = -1;
    return open_existing(t, path, 0, false, err);
}

uint64_t prism_plans_seq(const prism_plans *t)
{
    if (!t || !t->h)
        return 0;
    return atomic_load_explicit((_Atomic uint64_t *)&t->h->seq, memory_order_acquire);
}

bool prism_plans_replaced(const prism_plans *t, const char *path)
{
    return !t || !t->h || !path || prism_shm_replaced(t->fd, path);
}

void prism_plans_close(prism_plans *t)
{
    if (!t)
        return;
    prism_shm_map m = {t->h, t->bytes, t->fd};
    prism_shm_unmap(&m);
    memset(t, 0, sizeof *t);
    t->fd = -1;
}

/* ---- the agent's side --------------------------------------------------------------------- */

/* The slot rule of plans.h: the version's own slot, else an empty one, else the lowest version
 * among the slots not protected. A kept version protects the first slot holding it only, so
 * n_keep < PRISM_PLANS_SLOTS always leaves a slot to write. */
static unsigned choose_slot(const prism_plans *t, uint64_t version, const uint64_t *keep, unsigned n_keep)
{
    const prism_plans_slot *slots = t->h->slots;
    for (unsigned i = 0; i < PRISM_PLANS_SLOTS; i++)
        if (slots[i].map_version == version)
            return i;
    for (unsigned i = 0; i < PRISM_PLANS_SLOTS; i++)
        if (slots[i].map_version == 0)
            return i;
    bool kept[PRISM_PLANS_SLOTS] = {false};
    for (unsigned k = 0; k < n_keep; k++) {
        if (keep[k] == 0)
            continue;
        for (unsigned i = 0; i < PRISM_PLANS_SLOTS; i++)
            if (slots[i].map_version == keep[k]) {
                kept[i] = true;
                break;
            }
    }
    unsigned best = PRISM_PLANS_SLOTS;
    for (unsigned i = 0; i < PRISM_PLANS_SLOTS; i++) {
        if (kept[i])
            continue;
        if (best == PRISM_PLANS_SLOTS || slots[i].map_version < slots[best].map_version)
            best = i;
    }
    return best;
}

static bool low_precision_ok(uint32_t p)
{
    return p > PRISM_PRECISION_BF16 && p < PRISM_PRECISION_COUNT;
}

prism_status prism_plans_publish(prism_plans *t, const prism_plans_entry *entry, const uint8_t *blocks,
                                 uint32_t n_blocks, const uint64_t *keep, unsigned n_keep, prism_error *err)
{
    if (!t || !t->h)
        return prism_error_set(err, PRISM_ERR_STATE, "prism_plans_publish: the file is not open");
    if (!entry)
        return prism_error_set(err, PRISM_ERR_INVALID, "entry: NULL");
    prism_plans_header *h = t->h;
    if (entry->map_version == 0)
        return prism_error_set(err, PRISM_ERR_INVALID, "map_version: 0 is not a map");
    if (n_blocks > h->max_blocks)
        return prism_error_set(err, PRISM_ERR_LIMIT, "n_blocks: %u blocks, the file holds %u", n_blocks,
                               h->max_blocks);
    if (n_blocks > 0 && !blocks)
        return prism_error_set(err, PRISM_ERR_INVALID, "blocks: NULL with n_blocks %u", n_blocks);
    if (!low_precision_ok(entry->low_format))
        return prism_error_set(err, PRISM_ERR_INVALID, "low_format: %u is not a low precision", entry->low_format);
    if (n_keep >= PRISM_PLANS_SLOTS || (n_keep > 0 && !keep))
        return prism_error_set(err, PRISM_ERR_INVALID, "keep: %u versions kept, at most %u (and not NULL)", n_keep,
                               PRISM_PLANS_SLOTS - 1);
    uint32_t low = 0;
    for (uint32_t i = 0; i < n_blocks; i++) {
        if (blocks[i] != 0 && !low_precision_ok(blocks[i]))
            return prism_error_set(err, PRISM_ERR_INVALID, "blocks[%u]: %u is not 0 (high) or a low precision", i,
                                   blocks[i]);
        low += blocks[i] != 0;
    }
    unsigned slot = choose_slot(t, entry->map_version, keep, n_keep);
    prism_plans_slot *sl = &h->slots[slot];
    uint8_t *bytes = slot_blocks(t, slot);
    prism_seq_write_begin(&h->seq);
    sl->map_version = 0; /* a writer that dies from here on leaves an empty slot */
    atomic_signal_fence(memory_order_seq_cst);
    if (n_blocks > 0)
        memcpy(bytes, blocks, n_blocks);
    memset(bytes + n_blocks, 0, h->max_blocks - n_blocks);
    sl->n_blocks = n_blocks;
    sl->low_format = entry->low_format;
    sl->high_fp16 = entry->high_fp16 != 0;
    sl->low_blocks = low;
    sl->predicted_iteration_seconds = entry->predicted_iteration_seconds;
    sl->compute_seconds = entry->compute_seconds;
    memset(sl->device_class, 0, sizeof sl->device_class);
    size_t len = strnlen(entry->device_class, sizeof entry->device_class);
    if (len >= sizeof sl->device_class)
        len = sizeof sl->device_class - 1;
    memcpy(sl->device_class, entry->device_class, len);
    atomic_signal_fence(memory_order_seq_cst);
    sl->map_version = entry->map_version;
    prism_seq_write_end(&h->seq);
    return PRISM_OK;
}

bool prism_plans_clear(prism_plans *t, uint64_t map_version)
{
    if (!t || !t->h || map_version == 0)
        return false;
    prism_plans_header *h = t->h;
    bool held = false;
    for (unsigned i = 0; i < PRISM_PLANS_SLOTS && !held; i++)
        held = h->slots[i].map_version == map_version;
    if (!held)
        return false;
    prism_seq_write_begin(&h->seq);
    for (unsigned i = 0; i < PRISM_PLANS_SLOTS; i++) {
        if (h->slots[i].map_version != map_version)
            continue;
        h->slots[i].map_version = 0; /* first, as in publish: the slot is empty from here on */
        atomic_signal_fence(memory_order_seq_cst);
        memset(slot_blocks(t, i), 0, h->max_blocks);
        h->slots[i].n_blocks = 0;
        h->slots[i].low_blocks = 0;
    }
    prism_seq_write_end(&h->seq);
    return true;
}

/* ---- the trainer's side ------------------------------------------------------------------- */

prism_plans_found prism_plans_read(const prism_plans *t, uint64_t map_version, prism_plans_entry *entry,
                                   uint8_t *out, uint32_t cap, unsigned tries)
{
    if (!t || !t->h || !entry || (cap > 0 && !out) || map_version == 0)
        return PRISM_PLANS_NONE;
    const prism_plans_header *h = t->h;
    if (tries == 0)
        tries = 1;
    for (unsigned attempt = 0; attempt < tries; attempt++) {
        uint64_t start = prism_seq_read_begin(&h->seq);
        if (start == UINT64_MAX)
            continue;
        unsigned use = PRISM_PLANS_SLOTS;
        for (unsigned i = 0; i < PRISM_PLANS_SLOTS && use == PRISM_PLANS_SLOTS; i++)
            if (h->slots[i].map_version == map_version)
                use = i;
        prism_plans_entry e;
        uint32_t copied = 0;
        if (use < PRISM_PLANS_SLOTS) {
            memcpy(&e, &h->slots[use], sizeof e);
            /* A torn read may give any count: never copy past the slot or the caller's array. */
            copied = e.n_blocks < cap ? e.n_blocks : cap;
            if (copied > h->max_blocks)
                copied = h->max_blocks;
            if (copied > 0)
                memcpy(out, slot_blocks(t, use), copied);
        }
        if (!prism_seq_read_end(&h->seq, start))
            continue;
        if (use == PRISM_PLANS_SLOTS)
            return PRISM_PLANS_NONE;
        if (copied < cap)
            memset(out + copied, 0, cap - copied);
        uint32_t low = 0;
        for (uint32_t i = 0; i < cap; i++) {
            if (out[i] != 0 && !low_precision_ok(out[i]))
                out[i] = 0; /* never written so by an agent: read as high */
            low += out[i] != 0;
        }
        e.low_blocks = low;
        e.device_class[sizeof e.device_class - 1] = '\0';
        if (!low_precision_ok(e.low_format))
            e.low_format = PRISM_PRECISION_INT8;
        if (!isfinite(e.predicted_iteration_seconds))
            e.predicted_iteration_seconds = 0;
        if (!isfinite(e.compute_seconds))
            e.compute_seconds = 0;
        *entry = e;
        return PRISM_PLANS_FOUND;
    }
    return PRISM_PLANS_INCONSISTENT;
}
