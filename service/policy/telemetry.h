/* Telemetry records of DESIGN 4.4: one JSON object per decision, written as one line. */
#ifndef PRISM_POLICY_TELEMETRY_H
#define PRISM_POLICY_TELEMETRY_H

#include "policy.h"

/* A growable text buffer. */
typedef struct prism_buf {
    char *data;
    size_t len, cap;
} prism_buf;

void prism_buf_free(prism_buf *b);
prism_status prism_buf_append(prism_buf *b, const char *s, size_t n);

/* Makes room for n more bytes (and the NUL after them) without writing them: a caller may then
 * write up to n bytes at data + len and move len past them. */
prism_status prism_buf_reserve(prism_buf *b, size_t n);

/* The room prism_double_text needs at out: its text is at most 25 bytes with the NUL
 * ("-2.2250738585072014e-308"), and it may write scratch bytes past the text's end up to here. */
#define PRISM_DOUBLE_TEXT_MAX 48

/* Writes the shortest decimal text that reads back as exactly x, as printf's %.15g, %.16g or
 * %.17g writes it (the first that reads back; for a subnormal the first of %.1g to %.17g), with
 * ".0" after an integral value and "null" for NaN and Inf (JSON has neither), then a NUL; returns
 * its length (number_text.c). */
size_t prism_double_text(double x, char *out);

/* prism_double_text in two halves, so that a caller writing several numbers can find all their
 * digits first and then write them: the digit searches, each a long chain of dependent
 * multiplications, then overlap in the processor instead of running one after the other. */
typedef struct prism_number {
    double x;
    uint64_t digits; /* x's shortest digits (0 for a zero or a non-finite x) */
    int e10;         /* x reads back from digits * 10^e10 */
    int n;           /* the number of digits */
    bool symmetric;  /* false: x's neighbours are not equally far (a power of two) */
} prism_number;

void prism_number_prepare(double x, prism_number *num);
size_t prism_number_text(const prism_number *num, char *out); /* prism_double_text(num->x, out) */

/* Writes x in decimal and a NUL (at most 20 digits); returns the number of digits. */
size_t prism_u64_text(uint64_t x, char *out);

/* Appends prism_double_text's text for x. */
prism_status prism_buf_append_double(prism_buf *b, double x);

/* The same text as prism_double_text, found the way it was before issue 18: printf renders 17
 * digits, the 15- and 16-digit texts derived from them are read back (printf and strtod for the
 * ties and for subnormals). Several times slower; kept as bench_policy's baseline and as a check. */
size_t prism_double_text_printf(double x, char *out);

/* Appends the record of the decision summarised in s, with the details of every block of p,
 * and a newline. Keys: step_id, timestamp, blocks_bf16, blocks_int8, mean_sensitivity,
 * max_sensitivity, min_sensitivity, precision_changes, estimated_bandwidth_saving_pct,
 * low_precision ("auto" under auto), map_version, then "loss" only when loss is not NULL (prismd's records: the
 * decision step's loss, the mean over the ranks that reported one; the dashboard charts it),
 * then block_details (each block's saturated_fraction and underflowed_fraction only when it has
 * saturation figures), then blocks_by_precision (every precision name in enum order, zeros
 * included) and loss_spike (DESIGN 4.7). */
prism_status prism_telemetry_append(prism_buf *b, const prism_policy *p, const prism_summary *s,
                                    double timestamp, const double *loss);

#endif
