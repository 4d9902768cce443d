/* Fuzz target "trace": the replay trace parser (service/policy/trace.c) on a whole trace file,
 * split into lines as `prismctl replay` splits it, one record reused for every line (so that
 * arrays grown by one line are reused by the next). Checks that a parsed record is consistent. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz.h"
#include "trace.h"

/* Every parsed entry is read into it, so that ASan sees the whole array. */
static volatile double sink;

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    prism_trace_record rec;
    prism_trace_record_init(&rec);
    const char *text = (const char *)data;
    size_t pos = 0;
    while (pos < size) {
        const char *nl = memchr(text + pos, '\n', size - pos);
        size_t len = nl ? (size_t)(nl - (text + pos)) : size - pos;
        /* Each line in a buffer of its own size, so that ASan catches a read past its end. */
        char *line = malloc(len ? len : 1);
        FUZZ_CHECK(line != NULL);
        memcpy(line, text + pos, len);
        prism_error err;
        prism_status st = prism_trace_parse_line(line, len, &rec, &err);
        if (st != PRISM_OK) {
            FUZZ_CHECK(err.message[0] != '\0');
        } else if (rec.kind == PRISM_TRACE_STEP) {
            FUZZ_CHECK(rec.count <= rec.cap_blocks && (rec.count == 0 || rec.blocks != NULL));
            for (size_t i = 0; i < rec.count; i++)
                sink = sink + (double)rec.blocks[i].block_id;
        } else if (rec.kind == PRISM_TRACE_CALIBRATION || rec.kind == PRISM_TRACE_LAYOUT) {
            FUZZ_CHECK(rec.count <= rec.cap_entries && (rec.count == 0 || rec.entries != NULL));
            for (size_t i = 0; i < rec.count; i++)
                sink = sink + (double)rec.entries[i].block_id;
        } else {
            FUZZ_CHECK(rec.kind == PRISM_TRACE_BLANK && rec.count == 0);
        }
        free(line);
        pos += len + 1;
    }
    prism_trace_record_free(&rec);
    return 0;
}
