/* The embedded files (assets.h): looked up by name, gzip-compressed once on first use. */
#include "assets.h"

#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <zlib.h>

#define ASSETS_MAX 64 /* files of a dashboard build at most (it has three); more are not served */

static prismd_asset assets[ASSETS_MAX];
static size_t nassets;
static prismd_asset openapi;
static pthread_once_t once = PTHREAD_ONCE_INIT;

/* The Content-Type of a file name, by its extension. */
static const char *content_type(const char *name)
{
    static const char *const types[][2] = {
        {".html", "text/html; charset=utf-8"}, {".js", "text/javascript; charset=utf-8"},
        {".css", "text/css; charset=utf-8"},   {".json", "application/json"},
        {".map", "application/json"},          {".svg", "image/svg+xml"},
        {".png", "image/png"},                 {".ico", "image/x-icon"},
        {".txt", "text/plain; charset=utf-8"}, {".woff2", "font/woff2"},
    };
    const char *dot = strrchr(name, '.');
    for (size_t i = 0; dot && i < sizeof types / sizeof types[0]; i++)
        if (strcmp(dot, types[i][0]) == 0)
            return types[i][1];
    return "application/octet-stream";
}

/* gzip of data (level 9: done once per file and process), malloc'd; NULL when it cannot. */
static unsigned char *gzip_of(const unsigned char *data, size_t len, size_t *out_len)
{
    z_stream z;
    memset(&z, 0, sizeof z);
    if (deflateInit2(&z, 9, Z_DEFLATED, 15 + 16, 9, Z_DEFAULT_STRATEGY) != Z_OK)
        return NULL;
    uLong bound = deflateBound(&z, (uLong)len);
    unsigned char *out = malloc(bound);
    if (out) {
        z.next_in = (Bytef *)(uintptr_t)data;
        z.avail_in = (uInt)len;
        z.next_out = out;
        z.avail_out = (uInt)bound;
        if (deflate(&z, Z_FINISH) == Z_STREAM_END) {
            *out_len = z.total_out;
        } else {
            free(out);
            out = NULL;
        }
    }
    deflateEnd(&z);
    return out;
}

static void load(prismd_asset *a, const prismd_embedded *e)
{
    a->content_type = content_type(e->name);
    a->data = e->data;
    a->len = e->len;
    a->gzip = gzip_of(e->data, e->len, &a->gzip_len);
    /* The file names are not content-hashed: every file is revalidated, not only index.html. */
    a->no_cache = true;
}

static void load_all(void)
{
    load(&openapi, &prismd_embedded_openapi);
    for (size_t i = 0; i < prismd_embedded_asset_count && nassets < ASSETS_MAX; i++)
        load(&assets[nassets++], &prismd_embedded_assets[i]);
}

const prismd_asset *prismd_asset_find(const char *path)
{
    if (path[0] != '/')
        return NULL;
    const char *name = path[1] ? path + 1 : "index.html";
    pthread_once(&once, load_all);
    for (size_t i = 0; i < nassets; i++)
        if (strcmp(prismd_embedded_assets[i].name, name) == 0)
            return &assets[i];
    return NULL;
}

const prismd_asset *prismd_asset_openapi(void)
{
    pthread_once(&once, load_all);
    return &openapi;
}
