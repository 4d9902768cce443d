/* The binary trace of DESIGN 4.6 (proto/prism/v1/prism.proto, "Traces"): records, each a
 * base-128 varint byte length followed by one prism.v1.TraceRecord. prismd writes them in the
 * order its policy received its inputs; `prismctl replay` reads them back into the same
 * prism_trace_record the JSONL trace gives (trace.h), so one replay loop serves both forms.
 *
 * The writer appends whole framed records to a prism_buf: a caller writes the buffer to its file
 * with one write, so a reader never sees half a record except at the end of a file still being
 * written (prism_trace_bin_complete finds where the whole records end). */
#ifndef PRISM_POLICY_TRACE_BIN_H
#define PRISM_POLICY_TRACE_BIN_H

#include "merge.h"
#include "telemetry.h"
#include "trace.h"

#define PRISM_TRACE_BIN_VERSION 1u
/* The largest record a reader accepts (a step of several million blocks fits). */
#define PRISM_TRACE_BIN_MAX_RECORD (1u << 30)

/* True when a trace buffer holds the binary form: its first byte that is not JSON whitespace is
 * not '{' (a JSONL trace's lines are objects). An empty or all-blank buffer is JSONL. */
bool prism_trace_is_binary(const char *data, size_t len);

/* Writers: each appends one framed record. */
prism_status prism_trace_bin_header(prism_buf *out, const char *job_id, uint64_t segment, uint64_t unix_time_ms,
                                    const prism_config *in_force, bool restored, prism_error *err);
/* The same with gap_before: records of the job were lost before this segment (prismd's write
 * failed); prism_trace_bin_header writes it false. */
prism_status prism_trace_bin_segment_header(prism_buf *out, const char *job_id, uint64_t segment,
                                            uint64_t unix_time_ms, const prism_config *in_force, bool restored,
                                            bool gap_before, prism_error *err);
/* The BF16 sizes the policy was given (ids[i] has bytes[i]). */
prism_status prism_trace_bin_layout(prism_buf *out, const uint32_t *ids, const uint64_t *bytes, size_t n,
                                    prism_error *err);
prism_status prism_trace_bin_calibration(prism_buf *out, prism_precision format, const uint32_t *ids,
                                         const double *errors, size_t n, prism_error *err);
/* A config set for the next decision (prism_policy_set_config). */
prism_status prism_trace_bin_config(prism_buf *out, const prism_config *cfg, prism_error *err);
prism_status prism_trace_bin_step(prism_buf *out, const prism_merged_step *m, bool version_bumped, prism_error *err);

/* The length of the longest prefix of data[0, len) made of whole records (a file being appended
 * may end in part of one). Stops early, at the start of a record whose length prefix is bad. */
size_t prism_trace_bin_complete(const uint8_t *data, size_t len);

/* A reader over a whole binary trace in memory (not copied: data must outlive the reader). */
typedef struct prism_trace_bin_reader {
    const uint8_t *data;
    size_t len, pos;
    uint64_t records; /* records read so far */
} prism_trace_bin_reader;

void prism_trace_bin_reader_init(prism_trace_bin_reader *r, const void *data, size_t len);

/* Reads the next record into rec (reusing its arrays, as prism_trace_parse_line does). At the end
 * of the data returns PRISM_OK with rec->kind = PRISM_TRACE_BLANK. Steps come back with
 * rec->merged = true. Every figure is checked as a JSONL line's is; errors name the record and
 * its byte offset and the field, e.g. "record 12 (byte 4096): step.merged.blocks[3].l2: -1 is
 * negative". A config record's JSON is checked with the config loader. */
prism_status prism_trace_bin_next(prism_trace_bin_reader *r, prism_trace_record *rec, prism_error *err);

#endif
