/* Process-wide totals of libprism's block transfers and collectives (DESIGN 12): the engines add
 * into relaxed atomics here, and the client copies them into the hint table's trainer line at
 * begin_step, so the agent can export them. The engines know nothing of the client or the table,
 * and the client nothing of the engines: this is all they share.
 *
 * One set per process image: an engine and the client count into the same totals when they are
 * linked into the same image (libprism.so, or a program linked with the static libraries).
 * Adding is a few relaxed atomic adds: no lock, no system call. Hidden symbols, not part of
 * libprism's ABI. */
#ifndef PRISM_CLIENT_PROCESS_TOTALS_H
#define PRISM_CLIENT_PROCESS_TOTALS_H

#include "prism/common.h"

#include <stdint.h>

#define PRISM_TOTALS_HIDDEN __attribute__((visibility("hidden")))

typedef struct prism_process_totals {
    uint64_t transfers[PRISM_PRECISION_COUNT];            /* block transfers started, by precision */
    uint64_t transfer_bytes[PRISM_PRECISION_COUNT];       /* their image bytes */
    uint64_t transfer_bf16_bytes[PRISM_PRECISION_COUNT];  /* the same blocks' BF16 bytes */
    uint64_t collective_calls[PRISM_PRECISION_COUNT];     /* all-reduce and reduce-scatter, by wire */
    uint64_t collective_wire_bytes[PRISM_PRECISION_COUNT];
    uint64_t collective_bf16_bytes[PRISM_PRECISION_COUNT];
    uint64_t collective_ns[PRISM_PRECISION_COUNT];        /* host wall time in the calls */
} prism_process_totals;

/* One block transfer that started. A precision out of range is ignored. */
PRISM_TOTALS_HIDDEN void prism_totals_add_transfer(prism_precision precision, uint64_t image_bytes,
                                                   uint64_t bf16_bytes);

/* One collective call that completed on this rank: the payload bytes it sent, what a BF16 ring
 * would have sent for the same elements, and the host time it took. */
PRISM_TOTALS_HIDDEN void prism_totals_add_collective(prism_precision wire, uint64_t wire_bytes, uint64_t bf16_bytes,
                                                     uint64_t ns);

/* A copy of every total (each read on its own: totals that move meanwhile may be a call apart). */
PRISM_TOTALS_HIDDEN void prism_totals_read(prism_process_totals *out);

/* CLOCK_MONOTONIC in nanoseconds (a vDSO call on Linux, no system call). */
PRISM_TOTALS_HIDDEN uint64_t prism_totals_now_ns(void);

#endif
