#include "idmap.h"

#include <stdlib.h>
#include <string.h>

void prism_idmap_init(prism_idmap *m)
{
    memset(m, 0, sizeof *m);
}

void prism_idmap_free(prism_idmap *m)
{
    free(m->keys);
    free(m->slots);
    memset(m, 0, sizeof *m);
}

static size_t hash_id(uint32_t id, size_t cap)
{
    /* Fibonacci hashing spreads consecutive ids across the table. */
    return (size_t)(((uint64_t)id * 0x9E3779B97F4A7C15ull) >> 32) & (cap - 1);
}

uint32_t prism_idmap_get(const prism_idmap *m, uint32_t id)
{
    if (!m->cap)
        return PRISM_IDMAP_NONE;
    for (size_t i = hash_id(id, m->cap);; i = (i + 1) & (m->cap - 1)) {
        if (m->slots[i] == PRISM_IDMAP_NONE)
            return PRISM_IDMAP_NONE;
        if (m->keys[i] == id)
            return m->slots[i];
    }
}

static void insert(uint32_t *keys, uint32_t *slots, size_t cap, uint32_t id, uint32_t slot)
{
    size_t i = hash_id(id, cap);
    while (slots[i] != PRISM_IDMAP_NONE)
        i = (i + 1) & (cap - 1);
    keys[i] = id;
    slots[i] = slot;
}

prism_status prism_idmap_put(prism_idmap *m, uint32_t id, uint32_t slot)
{
    if ((m->count + 1) * 2 > m->cap) {
        size_t ncap = m->cap ? m->cap * 2 : 64;
        uint32_t *nkeys = malloc(ncap * sizeof *nkeys);
        uint32_t *nslots = malloc(ncap * sizeof *nslots);
        if (!nkeys || !nslots) {
            free(nkeys);
            free(nslots);
            return PRISM_ERR_NOMEM;
        }
        memset(nslots, 0xff, ncap * sizeof *nslots);
        for (size_t i = 0; i < m->cap; i++)
            if (m->slots[i] != PRISM_IDMAP_NONE)
                insert(nkeys, nslots, ncap, m->keys[i], m->slots[i]);
        free(m->keys);
        free(m->slots);
        m->keys = nkeys;
        m->slots = nslots;
        m->cap = ncap;
    }
    insert(m->keys, m->slots, m->cap, id, slot);
    m->count++;
    return PRISM_OK;
}
