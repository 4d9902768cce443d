/* A map from block id (any uint32) to a dense slot number, so per-block state lives in plain
 * arrays indexed by slot. Open addressing with linear probing; grows at 50% load. */
#ifndef PRISM_POLICY_IDMAP_H
#define PRISM_POLICY_IDMAP_H

#include "prism/common.h"

typedef struct prism_idmap {
    uint32_t *keys;
    uint32_t *slots; /* UINT32_MAX: empty */
    size_t cap;      /* a power of two, or 0 */
    size_t count;
} prism_idmap;

#define PRISM_IDMAP_NONE UINT32_MAX

void prism_idmap_init(prism_idmap *m);
void prism_idmap_free(prism_idmap *m);

/* The slot of id, or PRISM_IDMAP_NONE. */
uint32_t prism_idmap_get(const prism_idmap *m, uint32_t id);

/* Stores id -> slot (id must not be present). Returns PRISM_ERR_NOMEM on failure. */
prism_status prism_idmap_put(prism_idmap *m, uint32_t id, uint32_t slot);

#endif
