/* The shared-memory plan file (DESIGN 11, issue 15 item 4): the compute plan that came with each
 * map, from the agent to its trainer. It lies beside the hint table (hints.h) in the directory
 * they share, named after the hint table: "<hint table's name>.plans" (PRISM_LOCAL_PLANS_SUFFIX;
 * PRISM_LOCAL_PLANS_NAME by default), so that the hint table's layout, and the trainers and
 * agents built before plans, are untouched: an older trainer never opens this file, and a trainer
 * of this build with an older agent finds no file and runs every block high.
 *
 * Layout (all integers little-endian, the file is PRISM_PLANS_HEADER_BYTES + SLOTS * max_blocks):
 *   a header (prism_plans_header), then PRISM_PLANS_SLOTS arrays of max_blocks bytes, one per
 *   plan slot: byte i is block i's compute format, 0 high (the class's high format, bf16 or fp16),
 *   else the low prism_precision it runs in (INT8 or FP8_E4M3).
 * Versioned: `magic` and `layout_version` say what the file is; a reader refuses any other.
 *
 * Slots are keyed by the map version the plan came with. The agent writes the plan that came with
 * map V here *before* it publishes map V in the hint table, so a trainer that sees map V in the
 * hint table finds its plan here (the two seqlocks' release/acquire order it). A map that came
 * without a plan has no slot: no slot for V means no plan (every block high).
 *
 * Seqlock: as the hint table's (hints.h): the agent makes `seq` odd, writes, makes it even again
 * (release); a reader copies between two reads of `seq` and keeps the copy only when both are the
 * same even number, trying a bounded number of times, never waiting. Within a slot the agent first
 * sets map_version to 0, then writes the rest, then the version: a writer that dies mid-write
 * leaves an empty slot, never a torn plan under a version.
 *
 * Slot rule: the slot that already holds the version, else an empty one, else the slot with the
 * lowest version among those the caller does not keep. The agent keeps every version its hint
 * table holds (prism_hints_held_versions): the map the trainer applied and every map still
 * waiting for its effective step, so the plan of a map about to take effect is never evicted,
 * not even while the plan of the next map is written before that map goes into the table. With
 * PRISM_PLANS_SLOTS = PRISM_HINTS_SLOTS + 1 there is always a slot to write.
 *
 * Changes: `seq` moves with every write, so a reader that remembers it at its last read
 * (prism_plans_seq) knows, with one atomic load, that a plan may have changed under a version it
 * already read (a plan rewritten or withdrawn for the map in use) and reads it again.
 *
 * The file outlives the agent: a restarted agent keeps one of the same magic, layout version and
 * max_blocks (fail-static, with the hint table's maps), makes an odd `seq` even and bumps
 * `generation`; anything else is replaced by a fresh file renamed over the path, so a trainer's
 * mapping of the old inode stays valid until it remaps (prism_plans_replaced). */
#ifndef PRISM_CLIENT_PLANS_H
#define PRISM_CLIENT_PLANS_H

#include "hints.h"
#include "prism/common.h"

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define PRISM_PLANS_MAGIC 0x314e4c5053495250ull /* "PRISPLN1" */
#define PRISM_PLANS_LAYOUT_VERSION 2u /* 1: four slots (a build that never shipped) */
#define PRISM_PLANS_SLOTS (PRISM_HINTS_SLOTS + 1) /* every map the hint table holds, and one more */
#define PRISM_PLANS_HEADER_BYTES 1024
#define PRISM_PLANS_MAX_BLOCKS_LIMIT (1u << 20)
#define PRISM_PLANS_CLASS_BYTES 128 /* device_class, NUL-terminated, truncated to fit */

/* One plan's figures (ComputePlan, proto), the blocks' bytes apart. */
typedef struct prism_plans_slot {
    uint64_t map_version;     /* 0: empty */
    uint32_t n_blocks;        /* bytes [0, n_blocks) are meaningful; others are high */
    uint32_t low_format;      /* prism_precision: INT8 or FP8_E4M3 */
    uint32_t high_fp16;       /* 1: the class's high format is fp16; 0: bf16 */
    uint32_t low_blocks;      /* blocks planned low among [0, n_blocks) */
    double predicted_iteration_seconds;
    double compute_seconds;
    char device_class[PRISM_PLANS_CLASS_BYTES];
} prism_plans_slot;

typedef struct prism_plans_header {
    uint64_t magic;
    uint32_t layout_version;
    uint32_t max_blocks;      /* bytes per slot */
    uint64_t file_bytes;
    uint64_t generation;      /* +1 each time an agent opens the file */
    _Alignas(64) _Atomic uint64_t seq; /* the agent's seqlock */
    uint64_t agent_pid;
    _Alignas(64) prism_plans_slot slots[PRISM_PLANS_SLOTS];
} prism_plans_header;

/* The layout of version 2, pinned: tests and other readers rely on these offsets. */
_Static_assert(sizeof(prism_plans_slot) == 168 && offsetof(prism_plans_slot, low_format) == 12 &&
                   offsetof(prism_plans_slot, predicted_iteration_seconds) == 24 &&
                   offsetof(prism_plans_slot, device_class) == 40,
               "the plan slot's layout");
_Static_assert(offsetof(prism_plans_header, max_blocks) == 12 && offsetof(prism_plans_header, file_bytes) == 16 &&
                   offsetof(prism_plans_header, generation) == 24 && offsetof(prism_plans_header, seq) == 64 &&
                   offsetof(prism_plans_header, agent_pid) == 72 && offsetof(prism_plans_header, slots) == 128 &&
                   PRISM_PLANS_SLOTS == 5 && sizeof(prism_plans_header) == 1024,
               "the plan file header's layout");
_Static_assert(sizeof(prism_plans_header) <= PRISM_PLANS_HEADER_BYTES, "plan file header too big");
_Static_assert(ATOMIC_LLONG_LOCK_FREE == 2, "plan file seqlocks need lock-free 64-bit atomics");

/* A mapped plan file, from either side. */
typedef struct prism_plans {
    prism_plans_header *h;
    uint8_t *blocks;          /* PRISM_PLANS_SLOTS * max_blocks bytes after the header */
    size_t bytes;
    int fd;                   /* open while mapped (h != NULL) */
} prism_plans;

/* A plan as the agent writes it and the trainer reads it: the slot's figures (map_version
 * included) and, separately, the blocks' bytes. */
typedef prism_plans_slot prism_plans_entry;

/* ---- the agent's side ---- */

/* Opens path (creating it, mode 0660) for writing. An existing file of the same magic, layout
 * version and max_blocks keeps its slots; anything else is replaced by an empty one. Bumps
 * generation, sets agent_pid. */
prism_status prism_plans_create(prism_plans *t, const char *path, uint32_t max_blocks, prism_error *err);

/* Writes the plan of entry->map_version (> 0): entry's figures (its n_blocks and low_blocks are
 * taken from `blocks`: n_blocks bytes, 0 high, else a low prism_precision) into a slot chosen by
 * the slot rule, keep[0 .. n_keep) being the versions whose plans must stay (the agent passes
 * the versions its hint table holds; 0s are ignored; a version several slots hold protects only
 * the first), under the seqlock. n_blocks above max_blocks is PRISM_ERR_LIMIT; a byte or
 * low_format that is not a precision, map_version 0, or n_keep >= PRISM_PLANS_SLOTS (nothing
 * could be evicted) PRISM_ERR_INVALID; nothing is written then. */
prism_status prism_plans_publish(prism_plans *t, const prism_plans_entry *entry, const uint8_t *blocks,
                                 uint32_t n_blocks, const uint64_t *keep, unsigned n_keep, prism_error *err);

/* Withdraws the plan of map_version (> 0), under the seqlock: its slot is emptied, so a reader
 * finds no plan (every block high) for that version. True when a slot held it; false (nothing
 * written) when none did or the file is not open. */
bool prism_plans_clear(prism_plans *t, uint64_t map_version);

/* ---- the trainer's side ---- */

/* Maps an existing plan file read-only. A missing file is PRISM_ERR_NOT_FOUND; a file of another
 * kind, version or size PRISM_ERR_INVALID naming the field. */
prism_status prism_plans_open(prism_plans *t, const char *path, prism_error *err);

typedef enum prism_plans_found {
    PRISM_PLANS_INCONSISTENT = -1, /* no consistent copy in the tries: *entry untouched, out may be torn */
    PRISM_PLANS_NONE = 0,          /* no slot for that version: no plan */
    PRISM_PLANS_FOUND = 1          /* *entry and out[0 .. cap) hold the plan */
} prism_plans_found;

/* The plan of map_version: fills *entry and out[0 .. cap) (the plan's bytes for its first
 * min(n_blocks, cap) blocks, 0 (high) for the rest; entry->n_blocks is the plan's own count and
 * entry->low_blocks is counted over out[0 .. cap)). Tries the seqlock at most `tries` times (0
 * counts as 1), never waits, makes no system call. */
prism_plans_found prism_plans_read(const prism_plans *t, uint64_t map_version, prism_plans_entry *entry,
                                   uint8_t *out, uint32_t cap, unsigned tries);

/* The writer's seqlock word (one atomic load with acquire, no system call; 0 when t is not
 * mapped). It changes with every write: a reader that read a plan when it was S and finds it
 * unchanged knows no plan changed since. */
uint64_t prism_plans_seq(const prism_plans *t);

/* True when path no longer names the file t has mapped (the agent replaced it, or it is gone).
 * One stat(2); for the reconnect path, not for every step. */
bool prism_plans_replaced(const prism_plans *t, const char *path);

/* Unmaps and closes (either side). Safe on a zeroed struct. */
void prism_plans_close(prism_plans *t);

#endif
