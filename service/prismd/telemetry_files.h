/* A job's telemetry files on disk (DESIGN 4.4, issue 12 item 5): PATH is written by the policy
 * thread and rotated to PATH.1 .. PATH.KEEP when it would pass a size, the oldest dropped; GET
 * .../telemetry reads them back, oldest first, in bounded chunks, never a whole file or line in
 * memory. */
#ifndef PRISMD_TELEMETRY_FILES_H
#define PRISMD_TELEMETRY_FILES_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

/* Renames PATH.(KEEP-1) to PATH.KEEP, ..., PATH to PATH.1 (with keep 0, PATH is removed).
 * Returns how many files were dropped: the PATH.KEEP overwritten, or PATH when keep is 0. */
unsigned prismd_telemetry_rotate(const char *path, size_t keep);

typedef struct prismd_telemetry_reader prismd_telemetry_reader;

/* A reader of the records of PATH.KEEP .. PATH.1, PATH (those that exist, each opened now, so a
 * rotation while reading neither loses nor repeats a file) that writes
 *   {"job_id":"JOB","records":[R,R,...]}
 * with the records whose step_id >= since, oldest first, at most limit of them. Once the records
 * sent reach max_bytes (the first record is always sent whole, so a client paging with
 * since_step always advances), the answer ends with ,"truncated":true,"next_since_step":S before
 * the closing brace. Lines that are not records, or not yet complete, are skipped. NULL when out
 * of memory. */
prismd_telemetry_reader *prismd_telemetry_reader_open(const char *path, size_t keep, const char *job_id,
                                                      uint64_t since, uint64_t limit, size_t max_bytes);

/* The step every streamed answer (telemetry, large block maps, /metrics) takes: copies what is
 * left of src (len bytes, *pos of them already given) into buf after its first n bytes, up to
 * max; advances *pos and returns the new n. */
size_t prismd_piece_copy(char *buf, size_t n, size_t max, const char *src, size_t len, size_t *pos);

/* Up to max bytes of the answer into buf; 0 once it is all written, -1 on a read error. Memory
 * stays at one 64 KiB buffer whatever the sizes of the files and of their lines. */
ssize_t prismd_telemetry_reader_read(prismd_telemetry_reader *r, char *buf, size_t max);

/* True when the answer was cut at max_bytes (known once read returned 0). */
bool prismd_telemetry_reader_truncated(const prismd_telemetry_reader *r);

void prismd_telemetry_reader_close(prismd_telemetry_reader *r);

#endif
