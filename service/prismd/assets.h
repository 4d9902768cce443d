/* What prismd serves from memory (DESIGN 6): its OpenAPI document (GET /v1/openapi.json) and the
 * dashboard's files (GET / and GET /NAME), embedded into the binary at build time by
 * prismd_embed (embed.c) from service/prismd/openapi.json and the dashboard's build (or, in a
 * build without Node.js, a page that says the dashboard was not built). */
#ifndef PRISMD_ASSETS_H
#define PRISMD_ASSETS_H

#include <stdbool.h>
#include <stddef.h>

/* One embedded file: its name (relative to the dashboard's dist/), its bytes (NUL after them). */
typedef struct prismd_embedded {
    const char *name;
    const unsigned char *data;
    size_t len;
} prismd_embedded;

/* The generated source's definitions. */
extern const prismd_embedded prismd_embedded_openapi;
extern const prismd_embedded prismd_embedded_assets[];
extern const size_t prismd_embedded_asset_count;
extern const bool prismd_dashboard_built;

/* A file to send: its bytes as embedded, and gzip-compressed (made once, at the first lookup). */
typedef struct prismd_asset {
    const char *content_type;
    const unsigned char *data;
    size_t len;
    const unsigned char *gzip; /* NULL when compressing failed (out of memory): send data */
    size_t gzip_len;
    bool no_cache; /* Cache-Control: no-cache */
} prismd_asset;

/* The dashboard's file for a request path: "/" is index.html, "/NAME" the file NAME; NULL for
 * any other path. Thread-safe; the result lives as long as the process. */
const prismd_asset *prismd_asset_find(const char *path);

/* The OpenAPI document as an asset (application/json). */
const prismd_asset *prismd_asset_openapi(void);

#endif
