/* prism_proto_strings_ok: a walk over the protobuf wire format (tag, then a varint, a fixed 8 or
 * 4 bytes, or a length and that many bytes), looking each length-delimited field up in the
 * descriptor: strings are checked, submessages walked, everything else skipped. */
#define _POSIX_C_SOURCE 200809L /* strnlen */
#include "wire_check.h"

#include <stdio.h>
#include <string.h>

#define WIRE_MAX_DEPTH 32 /* far deeper than prism.proto nests; bounds the recursion on any input */

typedef enum { WIRE_OK, WIRE_BAD_STRING, WIRE_MALFORMED } wire_result;

/* Reads a varint at *p (< end); false when it runs past end or past 10 bytes. */
static bool read_varint(const uint8_t **p, const uint8_t *end, uint64_t *out)
{
    uint64_t v = 0;
    for (unsigned shift = 0; shift < 70 && *p < end; shift += 7) {
        uint8_t b = *(*p)++;
        v |= (uint64_t)(b & 0x7f) << shift;
        if (!(b & 0x80)) {
            *out = v;
            return true;
        }
    }
    return false;
}

/* UTF-8 as RFC 3629 defines it: no overlong forms, no surrogates, nothing past U+10FFFF; and,
 * for Prism, no NUL (a C string would end there). */
static bool utf8_without_nul(const uint8_t *s, size_t n)
{
    size_t i = 0;
    while (i < n) {
        uint8_t c = s[i];
        if (c == 0)
            return false;
        if (c < 0x80) {
            i++;
            continue;
        }
        size_t more;
        uint32_t cp, min;
        if ((c & 0xe0) == 0xc0) {
            more = 1, cp = c & 0x1fu, min = 0x80;
        } else if ((c & 0xf0) == 0xe0) {
            more = 2, cp = c & 0x0fu, min = 0x800;
        } else if ((c & 0xf8) == 0xf0) {
            more = 3, cp = c & 0x07u, min = 0x10000;
        } else {
            return false;
        }
        if (n - i <= more)
            return false;
        for (size_t k = 1; k <= more; k++) {
            if ((s[i + k] & 0xc0) != 0x80)
                return false;
            cp = (cp << 6) | (s[i + k] & 0x3fu);
        }
        if (cp < min || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff))
            return false;
        i += more + 1;
    }
    return true;
}

static const ProtobufCFieldDescriptor *field_by_number(const ProtobufCMessageDescriptor *desc, uint64_t number)
{
    if (number == 0 || number > UINT32_MAX)
        return NULL;
    return protobuf_c_message_descriptor_get_field(desc, (unsigned)number);
}

/* Appends ".name" (or "name" at the start) to path, keeping what fits. */
static void path_push(char *path, size_t path_len, const char *name)
{
    if (path_len == 0)
        return;
    size_t used = strnlen(path, path_len - 1);
    snprintf(path + used, path_len - used, "%s%s", used ? "." : "", name);
}

static wire_result walk(const ProtobufCMessageDescriptor *desc, const uint8_t *p, const uint8_t *end, int depth,
                        char *path, size_t path_len)
{
    if (depth > WIRE_MAX_DEPTH)
        return WIRE_MALFORMED;
    while (p < end) {
        uint64_t tag, n;
        if (!read_varint(&p, end, &tag))
            return WIRE_MALFORMED;
        switch (tag & 7u) {
        case 0:
            if (!read_varint(&p, end, &n))
                return WIRE_MALFORMED;
            break;
        case 1:
            if (end - p < 8)
                return WIRE_MALFORMED;
            p += 8;
            break;
        case 5:
            if (end - p < 4)
                return WIRE_MALFORMED;
            p += 4;
            break;
        case 2: {
            if (!read_varint(&p, end, &n) || n > (uint64_t)(end - p))
                return WIRE_MALFORMED;
            const ProtobufCFieldDescriptor *f = field_by_number(desc, tag >> 3);
            if (f && f->type == PROTOBUF_C_TYPE_STRING && !utf8_without_nul(p, (size_t)n)) {
                path_push(path, path_len, f->name);
                return WIRE_BAD_STRING;
            }
            if (f && f->type == PROTOBUF_C_TYPE_MESSAGE) {
                size_t mark = path_len ? strnlen(path, path_len - 1) : 0;
                path_push(path, path_len, f->name);
                wire_result r = walk((const ProtobufCMessageDescriptor *)f->descriptor, p, p + n, depth + 1, path,
                                     path_len);
                if (r != WIRE_OK)
                    return r;
                if (path_len)
                    path[mark] = '\0';
            }
            p += n;
            break;
        }
        default: /* groups (3, 4) and the unused wire types: protobuf-c refuses them */
            return WIRE_MALFORMED;
        }
    }
    return WIRE_OK;
}

bool prism_proto_strings_ok(const ProtobufCMessageDescriptor *desc, const uint8_t *data, size_t len, char *path,
                            size_t path_len)
{
    if (path_len)
        path[0] = '\0';
    if (!data || len == 0)
        return true;
    return walk(desc, data, data + len, 0, path, path_len) != WIRE_BAD_STRING;
}
