#include "prism/common.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

prism_status prism_error_set(prism_error *err, prism_status status, const char *fmt, ...)
{
    if (err) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err->message, sizeof err->message, fmt, ap);
        va_end(ap);
        err->status = status;
    }
    return status;
}

void prism_error_prefix(prism_error *err, const char *fmt, ...)
{
    if (!err)
        return;
    char prefix[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(prefix, sizeof prefix, fmt, ap);
    va_end(ap);
    /* Shift the message right and put "prefix: " in front, cutting its end if it must. */
    const size_t cap = sizeof err->message;
    size_t plen = strlen(prefix);
    if (plen > cap - 3)
        plen = cap - 3;
    size_t mlen = strlen(err->message);
    if (plen + 2 + mlen > cap - 1)
        mlen = cap - 1 - plen - 2;
    memmove(err->message + plen + 2, err->message, mlen);
    err->message[plen + 2 + mlen] = '\0';
    memcpy(err->message, prefix, plen);
    err->message[plen] = ':';
    err->message[plen + 1] = ' ';
}

const char *prism_status_name(prism_status status)
{
    switch (status) {
    case PRISM_OK: return "ok";
    case PRISM_ERR_INVALID: return "invalid";
    case PRISM_ERR_NOMEM: return "out of memory";
    case PRISM_ERR_IO: return "i/o error";
    case PRISM_ERR_LIMIT: return "limit exceeded";
    case PRISM_ERR_NOT_FOUND: return "not found";
    case PRISM_ERR_STATE: return "wrong state";
    case PRISM_ERR_UNAVAILABLE: return "unavailable";
    }
    return "unknown";
}

static const char *const precision_names[PRISM_PRECISION_COUNT] = {
    [PRISM_PRECISION_BF16] = "bf16",
    [PRISM_PRECISION_INT8] = "int8",
    [PRISM_PRECISION_FP8_E4M3] = "fp8_e4m3",
    [PRISM_PRECISION_FP8_E5M2] = "fp8_e5m2",
    [PRISM_PRECISION_INT4] = "int4",
};

const char *prism_precision_name(prism_precision p)
{
    if ((unsigned)p >= PRISM_PRECISION_COUNT)
        return "?";
    return precision_names[p];
}

bool prism_precision_parse(const char *name, prism_precision *out)
{
    for (int i = 0; i < PRISM_PRECISION_COUNT; i++) {
        if (strcmp(name, precision_names[i]) == 0) {
            *out = (prism_precision)i;
            return true;
        }
    }
    return false;
}

double prism_precision_saving(prism_precision p)
{
    switch (p) {
    case PRISM_PRECISION_BF16: return 0.0;
    case PRISM_PRECISION_INT8:
    case PRISM_PRECISION_FP8_E4M3:
    case PRISM_PRECISION_FP8_E5M2: return 0.5;
    case PRISM_PRECISION_INT4: return 0.75;
    }
    return 0.0;
}

char *prism_file_read(const char *path, size_t *len, prism_error *err)
{
    bool is_stdin = strcmp(path, "-") == 0;
    FILE *f = is_stdin ? stdin : fopen(path, "rb");
    if (!f) {
        prism_error_set(err, PRISM_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
        return NULL;
    }
    size_t cap = 1 << 16, n = 0;
    char *buf = malloc(cap);
    while (buf) {
        size_t got = fread(buf + n, 1, cap - n - 1, f);
        n += got;
        if (got == 0)
            break;
        if (n + 1 == cap) {
            char *bigger = realloc(buf, cap * 2);
            if (!bigger) {
                free(buf);
                buf = NULL;
            } else {
                buf = bigger;
                cap *= 2;
            }
        }
    }
    bool failed = ferror(f);
    if (!is_stdin)
        fclose(f);
    if (!buf) {
        prism_error_set(err, PRISM_ERR_NOMEM, "%s: out of memory", path);
        return NULL;
    }
    if (failed) {
        free(buf);
        prism_error_set(err, PRISM_ERR_IO, "%s: read error", path);
        return NULL;
    }
    buf[n] = '\0';
    *len = n;
    return buf;
}
