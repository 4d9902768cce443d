/* What the hint table (hints.h) and the plan file (plans.h) share: a file in the directory the
 * agent shares with its trainer, mapped by both, that starts with the same prefix (magic, layout
 * version, blocks per slot, file size) and holds `slots` arrays of max_blocks bytes after a header
 * of fixed size; and the seqlock both use.
 *
 * Seqlock ordering: the writer stores seq + 1 (odd), issues a release fence so that no data store
 * is seen before it, writes the data, and stores seq + 2 with release. A reader loads seq with
 * acquire, copies, issues an acquire fence so that its copies are done before it loads seq again,
 * and keeps the copy when both loads gave the same even number.
 *
 * Files: an agent keeps a file of the right kind, version and size (its content survives the
 * agent's restart: fail-static) and otherwise writes a new one beside the path and renames it
 * over the path, so nobody maps a half-written file and a trainer's mapping of the old inode stays
 * valid until it remaps. */
#ifndef PRISM_CLIENT_SHM_TABLE_H
#define PRISM_CLIENT_SHM_TABLE_H

#include "prism/common.h"

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* The first 24 bytes of every such file. */
typedef struct prism_shm_prefix {
    uint64_t magic;
    uint32_t layout_version;
    uint32_t max_blocks; /* bytes per slot */
    uint64_t file_bytes;
} prism_shm_prefix;

/* One kind of file. */
typedef struct prism_shm_kind {
    const char *what;          /* for messages: "a Prism hint table" */
    uint64_t magic;
    uint32_t layout_version;
    uint32_t max_blocks_limit;
    size_t header_bytes;       /* the slots start here */
    size_t slots;              /* file bytes = header_bytes + slots * max_blocks */
    /* Called on a fresh file's zeroed header (the prefix already filled) before it is renamed
     * into place; NULL: nothing more. */
    void (*init)(void *header);
} prism_shm_kind;

/* A mapping: base is the header, base + header_bytes the slots. */
typedef struct prism_shm_map {
    void *base;
    size_t bytes;
    int fd; /* open while mapped */
} prism_shm_map;

size_t prism_shm_file_bytes(const prism_shm_kind *k, uint32_t max_blocks);

/* Maps an existing file of kind k (read-write or read-only) and checks its prefix against its size.
 * want_max_blocks 0 accepts any count in [1, limit]. PRISM_ERR_NOT_FOUND when there is none,
 * PRISM_ERR_INVALID naming the field when it is not of kind k (or not of want_max_blocks),
 * PRISM_ERR_IO otherwise. *m is untouched on failure. */
prism_status prism_shm_open(const prism_shm_kind *k, const char *path, uint32_t want_max_blocks, bool writable,
                            prism_shm_map *m, prism_error *err);

/* Writes a fresh zeroed file of max_blocks beside path (mode 0660), fills its prefix, calls
 * k->init, and renames it over path; mapped read-write into *m. */
prism_status prism_shm_create(const prism_shm_kind *k, const char *path, uint32_t max_blocks, prism_shm_map *m,
                              prism_error *err);

/* True when path no longer names the file open as fd (replaced by an agent, or gone). One stat(2)
 * and one fstat(2): for reconnect paths, never for every step. */
bool prism_shm_replaced(int fd, const char *path);

/* Unmaps and closes; safe on a zeroed map (fd ignored while base is NULL). */
void prism_shm_unmap(prism_shm_map *m);

/* ---- the seqlock ---- */

static inline void prism_seq_write_begin(_Atomic uint64_t *seq)
{
    uint64_t s = atomic_load_explicit(seq, memory_order_relaxed);
    atomic_store_explicit(seq, s + 1, memory_order_relaxed);
    atomic_thread_fence(memory_order_release);
}

static inline void prism_seq_write_end(_Atomic uint64_t *seq)
{
    uint64_t s = atomic_load_explicit(seq, memory_order_relaxed);
    atomic_store_explicit(seq, s + 1, memory_order_release);
}

/* The even value of seq at the start of a read attempt, or UINT64_MAX while a write is under way. */
static inline uint64_t prism_seq_read_begin(const _Atomic uint64_t *seq)
{
    uint64_t s = atomic_load_explicit((_Atomic uint64_t *)seq, memory_order_acquire);
    return (s & 1) ? UINT64_MAX : s;
}

/* True when nothing was written since prism_seq_read_begin returned start. */
static inline bool prism_seq_read_end(const _Atomic uint64_t *seq, uint64_t start)
{
    atomic_thread_fence(memory_order_acquire);
    return atomic_load_explicit((_Atomic uint64_t *)seq, memory_order_relaxed) == start;
}

/* An agent opening a file some earlier writer may have died in mid-write: an odd seq made even
 * (that writer's slot is already empty by the write order). */
static inline void prism_seq_repair(_Atomic uint64_t *seq)
{
    uint64_t s = atomic_load_explicit(seq, memory_order_relaxed);
    if (s & 1)
        atomic_store_explicit(seq, s + 1, memory_order_relaxed);
}

#endif
