/* Prism's shared vocabulary: status codes, the error a call fills for its caller, and the
 * numeric precisions a block can be assigned. Every public header includes this one. */
#ifndef PRISM_COMMON_H
#define PRISM_COMMON_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum prism_status {
    PRISM_OK = 0,
    PRISM_ERR_INVALID,   /* bad input: a value, a key, a syntax error */
    PRISM_ERR_NOMEM,     /* an allocation failed */
    PRISM_ERR_IO,        /* a file or socket could not be read or written */
    PRISM_ERR_LIMIT,     /* a configured limit would be exceeded */
    PRISM_ERR_NOT_FOUND, /* the named thing does not exist */
    PRISM_ERR_STATE,     /* the call does not fit the object's current state */
    PRISM_ERR_UNAVAILABLE /* a device or service is not there */
} prism_status;

/* The message is written for a person: it names the file, line, key or field at fault. */
typedef struct prism_error {
    prism_status status;
    char message[512];
} prism_error;

/* Fills err (when not NULL) and returns status, so a caller can write
 * `return prism_error_set(err, PRISM_ERR_INVALID, "...", ...);`. */
prism_status prism_error_set(prism_error *err, prism_status status, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* Puts "prefix: " in front of the message already in err, keeping its status. */
void prism_error_prefix(prism_error *err, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

const char *prism_status_name(prism_status status);

/* Reads a whole file ("-": standard input) into a NUL-terminated buffer the caller frees;
 * *len gets its length. NULL with err naming the file when it cannot. */
char *prism_file_read(const char *path, size_t *len, prism_error *err);

/* Values match the wire enum prism.v1.Precision. */
typedef enum prism_precision {
    PRISM_PRECISION_BF16 = 0,
    PRISM_PRECISION_INT8 = 1,
    PRISM_PRECISION_FP8_E4M3 = 2,
    PRISM_PRECISION_FP8_E5M2 = 3,
    PRISM_PRECISION_INT4 = 4
} prism_precision;

#define PRISM_PRECISION_COUNT 5

/* "bf16", "int8", "fp8_e4m3", "fp8_e5m2", "int4"; "?" for a value out of range. */
const char *prism_precision_name(prism_precision p);

/* Parses the names above; returns false for anything else. */
bool prism_precision_parse(const char *name, prism_precision *out);

/* Fraction of a block's BF16 bytes that moving it in precision p saves: 0 for bf16,
 * 0.5 for the 8-bit formats, 0.75 for int4. */
double prism_precision_saving(prism_precision p);

#ifdef __cplusplus
}
#endif

#endif
