/* SHA-256 (FIPS 180-4, section 6.2), for the calibration fingerprint (DESIGN 4.5). Written from
 * the standard; tested against its published examples. Not for secrets: nothing here is
 * constant-time or wiped after use. */
#ifndef PRISM_CLIENT_SHA256_H
#define PRISM_CLIENT_SHA256_H

#include <stddef.h>
#include <stdint.h>

#define PRISM_SHA256_BYTES 32

/* A hash in progress: the eight working words, the message length so far and the part of a
 * 64-byte block not yet compressed. */
typedef struct prism_sha256_ctx {
    uint32_t h[8];
    uint64_t length;   /* bytes hashed so far */
    uint8_t block[64];
    size_t fill;       /* bytes waiting in block */
} prism_sha256_ctx;

void prism_sha256_init(prism_sha256_ctx *s);
void prism_sha256_update(prism_sha256_ctx *s, const void *data, size_t len);
/* Pads, writes the digest (big-endian words, as the standard prints them) and leaves s spent:
 * call prism_sha256_init before using it again. */
void prism_sha256_final(prism_sha256_ctx *s, uint8_t out[PRISM_SHA256_BYTES]);

/* The digest of one buffer. */
void prism_sha256(const void *data, size_t len, uint8_t out[PRISM_SHA256_BYTES]);

#endif
